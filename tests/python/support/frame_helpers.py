"""Helpers for the frame runtime's tests: callbacks that compile only the functions a test names."""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable
from typing import Any

import tripwire as tw
from tripwire import frame as twf


class Compiler:
    """A frame callback that compiles frames of the ``targets`` code objects and SKIPs every
    other. ``plan(frame) -> (code, guard_set) | marker | None`` decides for a target frame; the
    default runs the function's own code under a TYPE_MATCH on each argument. Records what it
    saw."""

    def __init__(self, *targets: Any, plan: Callable[[twf.Frame], Any] | None = None) -> None:
        self.codes = {t if isinstance(t, types.CodeType) else t.__code__ for t in targets}
        self.plan = plan or self.type_guards
        self.calls: list[twf.Frame] = []
        self.skipped: list[types.CodeType] = []

    def __call__(self, frame: twf.Frame) -> Any:
        if frame.code not in self.codes:
            self.skipped.append(frame.code)
            return twf.SKIP
        self.calls.append(frame)
        return self.plan(frame)

    @staticmethod
    def type_guards(frame: twf.Frame, code: types.CodeType | None = None) -> tuple:
        b = tw.GuardBuilder(frame.f_locals, f_globals=frame.f_globals)
        for name in frame.f_locals:
            b.type_match(f"L[{name!r}]")
        return (code or frame.code), b.build()

    @property
    def names(self) -> list[str]:
        return [f.code.co_name for f in self.calls]


def guards(frame: twf.Frame, *, equals: Iterable[str] = (), types_: Iterable[str] = ()) -> tw.GuardSet:
    """A guard set on ``frame``: EQUALS on each source of ``equals``, TYPE_MATCH on ``types_``."""
    b = tw.GuardBuilder(frame.f_locals, f_globals=frame.f_globals)
    for s in equals:
        b.equals(s)
    for s in types_:
        b.type_match(s)
    return b.build()


def tagged(fn: Callable, tag: str) -> types.CodeType:
    """``fn``'s code with every string constant ``"orig"`` replaced by ``tag``: a replacement with
    the same layout whose results say which code ran."""
    code = fn.__code__
    consts = tuple(tag if c == "orig" else c for c in code.co_consts)
    return code.replace(co_consts=consts)
