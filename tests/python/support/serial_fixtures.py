"""Module-level objects for the serialization tests: importable by name in a fresh process.

A fresh interpreter imports this module (tests/python on its path) and loads guard sets saved by
the test process; the references in them (classes, functions, enum members, module-level objects)
resolve here by ``serial_fixtures:qualname``.
"""

from __future__ import annotations

import enum
import functools
from typing import Any


class Color(enum.Enum):
    RED = 1
    GREEN = 2


class Mode(enum.IntEnum):
    TRAIN = 0
    EVAL = 1


class Point:
    def __init__(self, x: Any, y: Any) -> None:
        self.x = x
        self.y = y

    def norm(self) -> Any:
        return abs(self.x) + abs(self.y)


class Config:
    """A module-level instance of this (CONFIG) is guarded by identity through G['CONFIG']."""

    def __init__(self) -> None:
        self.mode = "fast"


CONFIG = Config()


def helper(x: Any) -> Any:
    return x * 2


def other_helper(x: Any) -> Any:
    return x * 3


def make_closure(k: Any) -> Any:
    def inner(x: Any) -> Any:
        return x + k

    return inner


@functools.wraps(helper)
def wrapped_helper(x: Any) -> Any:
    return helper(x)


AMBIENT = {"mode": "train"}


def probe_mode() -> str:
    return AMBIENT["mode"]


def frames() -> list[dict[str, Any]]:
    """Example frames for guards_for, deterministic so that a fresh process rebuilds them."""
    return [
        {"x": 3, "y": 2.5, "s": "hello", "b": b"\x00\xff", "n": None, "t": True},
        {"cfg": {"mode": "fast", "depth": 3, "tags": ("a", "b")}, "c": Color.RED, "m": Mode.EVAL},
        {"xs": [1, 2, (3, 4)], "d": {1: "one", (2, 3): "pair", Color.GREEN: "g"}, "r": range(2, 9, 3)},
        {"p": Point(1, 2), "f": helper, "g": make_closure(1), "kind": Point, "big": 2**100, "neg": -(2**71)},
        {"z": 1 + 2j, "e": ..., "fs": frozenset({"a", "b", "c"}), "st": {1, 2}, "sl": slice(1, None, 2)},
        {"nan": float("nan"), "negzero": -0.0, "u": "caf\u00e9 \ud800", "nested": [[[[1]]]]},
    ]


def variants(frame: dict[str, Any]) -> list[dict[str, Any]]:
    """Inputs close to ``frame``: itself, each value replaced by nearby ones, each key removed."""
    out = [dict(frame)]
    swaps = [
        0,
        1,
        -1,
        2.5,
        "hello",
        "x",
        None,
        True,
        False,
        (),
        [],
        {},
        Color.GREEN,
        Mode.TRAIN,
        helper,
        other_helper,
    ]
    for k, v in frame.items():
        for s in swaps:
            if s is not v:
                out.append({**frame, k: s})
        out.append({kk: vv for kk, vv in frame.items() if kk != k})
        if isinstance(v, dict):
            out.append({**frame, k: dict(reversed(list(v.items())))})
            out.append({**frame, k: {**v, "extra": 1}})
        if isinstance(v, list | tuple) and v:
            out.append({**frame, k: type(v)(list(v)[:-1])})
    return out


def _decorate(fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        return fn(*args)

    return wrapper


@_decorate
def decorated(x: Any) -> Any:
    """The module attribute is the wrapper; the original is reachable only as __wrapped__."""
    return x
