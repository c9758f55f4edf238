"""SET_CONTAINS decided by the fast pass on a small exact set or frozenset of exact str
(set_contains_pure, cpp/runtime/eval/guard_kinds.cpp): torch guards `'n' in
module._non_persistent_buffers_set` whenever forward assigns a buffer. Anything else (a key of
another type, whose ``__eq__`` a lookup could call; a dummy left by a removal; a larger set; a
subclass) is a residue, and the walk asks the set. Every case is decided four ways
(engine_switches.agree_with_and_without_skip)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import tripwire as tw
from engine_switches import agree_with_and_without_skip as _decide
from engine_switches import fast_once as _fast_once


def _guarded(s: Any, item: Any = "n", present: bool = False) -> tuple[Any, list[Any], dict]:
    f_locals = {"s": s}
    b = tw.GuardBuilder(f_locals)
    b.set_contains("L['s']", item, present=present)
    gs = b.build()
    specs = list(gs.guards)
    for _ in range(3):
        assert _decide(gs, specs, f_locals) is True
    return gs, specs, f_locals


@pytest.mark.parametrize(
    ("s", "present"),
    [
        (set(), False),
        ({"a", "b"}, False),
        ({"a", "n"}, True),
        (frozenset({"x", "n"}), True),
        (frozenset(), False),
    ],
    ids=["empty", "absent", "present", "frozenset", "empty-frozenset"],
)
def test_small_str_sets_are_decided_on_the_fast_pass(s: Any, present: bool) -> None:
    gs, _, f_locals = _guarded(s, present=present)
    assert _fast_once(gs, f_locals)


class _Colliding:
    """Hashes as 'n' and claims equality: a real lookup calls its __eq__."""

    def __init__(self) -> None:
        self.calls = 0

    def __hash__(self) -> int:
        return hash("n")

    def __eq__(self, other: object) -> bool:
        self.calls += 1
        return other == "n"


class _SetSub(set):
    pass


def test_sets_not_decided_natively_are_residues_and_exact() -> None:
    col = _Colliding()
    gs, specs, f_locals = _guarded({"a", 1}, present=False)  # an int key: not all str
    assert not _fast_once(gs, f_locals)
    removed = {"a", "b", "c"}
    removed.discard("b")  # leaves a dummy
    gs, specs, f_locals = _guarded(removed, present=False)
    assert not _fast_once(gs, f_locals)
    gs, specs, f_locals = _guarded({f"k{i}" for i in range(40)}, present=False)  # a larger table
    assert not _fast_once(gs, f_locals)
    gs, specs, f_locals = _guarded(_SetSub({"a"}), present=False)
    assert not _fast_once(gs, f_locals)
    # The colliding object's __eq__ makes 'n' present: decided by the set itself, as Python does.
    s = {"a", col}
    f_locals = {"s": s}
    b = tw.GuardBuilder(f_locals)
    b.set_contains("L['s']", "n", present=True)
    gs = b.build()
    specs = list(gs.guards)
    assert _decide(gs, specs, f_locals) is True
    assert col.calls > 0


MUTATIONS: list[tuple[str, Callable[[dict], None]]] = [
    ("item added", lambda fl: fl["s"].add("n")),
    ("replaced by a list holding it", lambda fl: fl.__setitem__("s", ["n"])),
    ("replaced by a set with a colliding object", lambda fl: fl.__setitem__("s", {"a", _Colliding()})),
    ("replaced by a frozenset holding it", lambda fl: fl.__setitem__("s", frozenset({"n"}))),
    ("replaced by a set subclass holding it", lambda fl: fl.__setitem__("s", _SetSub({"n"}))),
    ("replaced by a dict", lambda fl: fl.__setitem__("s", {"n": 1})),
]


@pytest.mark.parametrize("mutate", [m for _, m in MUTATIONS], ids=[n for n, _ in MUTATIONS])
def test_a_change_after_passing_checks_fails(mutate: Callable[[dict], None]) -> None:
    gs, specs, f_locals = _guarded({"a", "b"}, present=False)
    assert _fast_once(gs, f_locals)
    mutate(f_locals)
    assert _decide(gs, specs, f_locals) is False


def test_a_removal_that_makes_it_absent_is_seen() -> None:
    s = {"a", "n"}
    gs, specs, f_locals = _guarded(s, present=True)
    assert _fast_once(gs, f_locals)
    s.discard("n")
    assert _decide(gs, specs, f_locals) is False
    s.add("n")
    assert _decide(gs, specs, f_locals) is True
