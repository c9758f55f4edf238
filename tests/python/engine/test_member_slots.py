"""Attributes a member descriptor serves (a class's ``__slots__``, a ``functools.partial``'s
``func``/``args``/``keywords``) are read from the object's slot by the inline cache and the fast
pass (AttrCache::Mode::Member, cpp/runtime/eval/fetch.cpp). Each case checks passing calls first,
then a change that getattr sees, decided four ways (engine_switches.agree_with_and_without_skip)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest

import tripwire as tw
from engine_switches import agree_with_and_without_skip as _decide
from engine_switches import fast_once as _fast_once


def _guarded(obj: Any, src: str, value: Any = None, *, identity: bool = False) -> tuple[Any, list[Any], dict]:
    f_locals = {"o": obj}
    b = tw.GuardBuilder(f_locals)
    if identity:
        b.id_match(src)
    else:
        b.equals(src, value)
    gs = b.build()
    specs = list(gs.guards)
    for _ in range(3):
        assert _decide(gs, specs, f_locals) is True
    return gs, specs, f_locals


def _slotted() -> type:
    class Slotted:
        __slots__ = ("a", "b")

    return Slotted


def test_slots_are_read_on_the_fast_pass() -> None:
    o = _slotted()()
    o.a = 1
    gs, _, f_locals = _guarded(o, "L['o'].a", 1)
    assert _fast_once(gs, f_locals)


def test_a_partials_fields_are_read_on_the_fast_pass() -> None:
    p = functools.partial(max, 1, key=abs)
    gs, _, f_locals = _guarded(p, "L['o'].keywords['key']", identity=True)
    gs2, _, _ = _guarded(p, "L['o'].args", (1,))
    assert _fast_once(gs, f_locals) and _fast_once(gs2, f_locals)


MUTATIONS: list[tuple[str, Callable[[type, Any], None]]] = [
    ("slot set", lambda cls, o: setattr(o, "a", 2)),
    ("slot deleted", lambda cls, o: delattr(o, "a")),
    ("class property shadows the slot", lambda cls, o: setattr(cls, "a", property(lambda self: 2))),
    ("class __getattribute__", lambda cls, o: setattr(cls, "__getattribute__", lambda self, n: 2)),
    ("__class__ to a subclass with a property", lambda cls, o: setattr(o, "__class__", _shadowing(cls))),
]


def _shadowing(cls: type) -> type:
    return type("Shadow", (cls,), {"__slots__": (), "a": property(lambda self: 3)})


@pytest.mark.parametrize("mutate", [m for _, m in MUTATIONS], ids=[n for n, _ in MUTATIONS])
def test_a_change_after_passing_checks_fails(mutate: Callable[[type, Any], None]) -> None:
    cls = _slotted()
    o = cls()
    o.a = 1
    gs, specs, f_locals = _guarded(o, "L['o'].a", 1)
    mutate(cls, o)
    assert _decide(gs, specs, f_locals) is False


def test_a_subclass_property_over_a_base_slot() -> None:
    base = _slotted()
    sub = type("Sub", (base,), {"__slots__": ()})
    o = sub()
    o.a = 1
    gs, specs, f_locals = _guarded(o, "L['o'].a", 1)
    sub.a = property(lambda self: 7)  # type: ignore[attr-defined]
    assert _decide(gs, specs, f_locals) is False
    sub.a = property(lambda self: 1)  # type: ignore[attr-defined]
    assert _decide(gs, specs, f_locals) is True


def test_an_empty_slot_goes_to_getattr_and_its_fallback() -> None:
    base = _slotted()
    cls = type("WithFallback", (base,), {"__slots__": (), "__getattr__": lambda self, n: "fallback"})
    o = cls()
    gs, specs, f_locals = _guarded(o, "L['o'].a", "fallback")
    o.a = "fallback"  # the slot now answers the same
    assert _decide(gs, specs, f_locals) is True
    o.a = 1
    assert _decide(gs, specs, f_locals) is False
    del o.a
    assert _decide(gs, specs, f_locals) is True


def test_a_slot_wins_over_an_instance_dict_entry() -> None:
    class Both:
        __slots__ = ("__dict__", "a")

    o = Both()
    o.a = 3
    o.__dict__["a"] = 4  # shadowed by the slot: getattr answers 3
    gs, specs, f_locals = _guarded(o, "L['o'].a", 3)
    o.a = 5
    assert _decide(gs, specs, f_locals) is False
    o.a = 3
    del o.__dict__["a"]
    assert _decide(gs, specs, f_locals) is True


def test_a_partial_subclass_property_is_not_read_as_the_slot() -> None:
    class Named(functools.partial):
        @property
        def func(self) -> Any:  # type: ignore[override]
            return min

    p = Named(max, 1)
    gs, specs, f_locals = _guarded(p, "L['o'].func", identity=True)
    Named.func = property(lambda self: max)  # type: ignore[assignment, method-assign]
    assert _decide(gs, specs, f_locals) is False
