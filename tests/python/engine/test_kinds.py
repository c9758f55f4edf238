"""Every guard kind and every step kind: pass and fail cases, checked three ways.

Each input is checked with ``GuardSet.check``, with the oracle's ``reference.check`` (tests/oracle/reference.py) and
with ``why_not`` (source and kind of the first failing guard), several times in a row so that the
engine's adaptive reordering is exercised as well.
"""

from __future__ import annotations

import enum
import functools
import gc
import math
import pathlib
import re
import sys
import types
import weakref
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reference
import tripwire as tw
from tripwire import GuardKind

L = tw.Source.local
nan = float("nan")


# -- helpers ------------------------------------------------------------------------------------


def agree(gs: tw.GuardSet, f_locals: Any, f_globals=None, f_closure=None, times: int = 3) -> bool:
    """gs.check == reference.check (repeatedly), and why_not names the reference's first failure."""
    want = reference.check(gs.guards, f_locals, f_globals, f_closure)
    for _ in range(times):
        assert gs.check(f_locals) is want
    first = reference.first_failure(gs.guards, f_locals, f_globals, f_closure)
    why = gs.why_not(f_locals)
    if want:
        assert first is None and why is None
    else:
        assert first is not None and why is not None, (first, why)
        assert why.guard.index == first[0].index, (why.reason, first[0].describe())
        assert why.kind == first[0].kind.name
        assert isinstance(why.reason, str) and why.reason
    return want


def passes(gs: tw.GuardSet, f_locals: Any, **kw: Any) -> None:
    assert agree(gs, f_locals, **kw) is True


def fails(gs: tw.GuardSet, f_locals: Any, source: str | None, kind: str, **kw: Any) -> tw.Failure:
    assert agree(gs, f_locals, **kw) is False
    why = gs.why_not(f_locals)
    assert (why.source, why.kind) == (source, kind), why.reason
    return why


def build(f_locals: dict, *calls: tuple, f_globals=None, f_closure=None, strict: bool = False) -> tw.GuardSet:
    """GuardBuilder(f_locals) with calls ("method", args...), built."""
    b = tw.GuardBuilder(f_locals, f_globals, f_closure)
    for name, *args in calls:
        getattr(b, name)(*args)
    return b.build(strict=strict)


class Color(enum.Enum):
    RED = 1
    GREEN = 2


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class MyInt(int):
    pass


class Obj:
    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


# -- TYPE_MATCH, ID_MATCH, NONE, NOT_NONE, TRUE, FALSE ------------------------------------------------


def test_type_match() -> None:
    gs = build({"x": 3}, ("type_match", "L['x']"))
    passes(gs, {"x": 4})
    passes(gs, {"x": 2**100})
    for bad in (True, 3.0, MyInt(3), "3", None):
        w = fails(gs, {"x": bad}, "L['x']", "TYPE_MATCH")
        assert w.expected is int and w.actual is type(bad)
    fails(gs, {}, "L['x']", "TYPE_MATCH")  # missing local


def test_type_match_explicit_type() -> None:
    gs = build({"x": True}, ("type_match", "L['x']", bool))
    passes(gs, {"x": False})
    fails(gs, {"x": 1}, "L['x']", "TYPE_MATCH")


def test_id_match() -> None:
    o = Obj(a=1)
    gs = build({"o": o}, ("id_match", "L['o']"))
    passes(gs, {"o": o})
    fails(gs, {"o": Obj(a=1)}, "L['o']", "ID_MATCH")
    t = (1, 2)  # not weakly referenceable: held strongly
    gs = build({"t": t}, ("id_match", "L['t']"))
    passes(gs, {"t": t})
    fails(gs, {"t": tuple([1, 2])}, "L['t']", "ID_MATCH")


@pytest.mark.parametrize(
    "method,good,bad",
    [
        ("none", [None], [0, False, "", "None"]),
        ("not_none", [0, False, "", Obj()], [None]),
        ("true", [True], [1, 1.0, "True", [1]]),
        ("false", [False], [0, 0.0, None, []]),
    ],
)
def test_identity_constants(method: str, good: list, bad: list) -> None:
    gs = build({"v": good[0]}, (method, "L['v']"))
    for g in good:
        passes(gs, {"v": g})
    for x in bad:
        fails(gs, {"v": x}, "L['v']", method.upper())


# -- EQUALS_MATCH --------------------------------------------------------------------------------

EQUALS_CASES = [
    # (constant, equal values, unequal values)
    (1, [1, 2**0], [True, 1.0, MyInt(1), 2, "1", None]),
    (True, [True], [1, 1.0, False]),
    (0, [0, -0], [False, 0.0, -0.0]),
    (1.0, [1.0], [1, True, complex(1, 0)]),
    # 0.0 == -0.0, but code specialised for one can tell the sign (1 / (x * s), repr)
    (-0.0, [-0.0, -(0.0)], [0.0, 0, False]),
    (0.0, [0.0, -(-0.0)], [-0.0, 0, False]),
    (complex(0.0, -0.0), [complex(0.0, -0.0)], [complex(0.0, 0.0), complex(-0.0, -0.0)]),
    ((1, 0.0), [(1, 0.0)], [(1, -0.0)]),
    ({"z": -0.0}, [{"z": -0.0}], [{"z": 0.0}]),
    (frozenset({-0.0, 1.0}), [frozenset({-0.0, 1.0})], [frozenset({0.0, 1.0})]),
    (nan, [float("nan"), -float("nan"), nan], [1.0, complex(nan, 0), None]),
    (math.inf, [float("inf")], [-math.inf, nan]),
    (complex(nan, 1.0), [complex(nan, 1.0)], [complex(nan, 2.0), complex(1.0, nan), nan]),
    (complex(nan, nan), [complex(nan, nan)], [complex(nan, 0.0)]),
    (2**100, [2**100], [float(2**100), 2**100 + 1]),
    ("ab", ["ab", "a" + "b"], [b"ab", "ab ", "AB"]),
    (b"ab", [b"ab"], ["ab", bytearray(b"ab")]),
    (None, [None], [0, False]),
    (Ellipsis, [Ellipsis], [None, "..."]),
    (
        (1, nan, (nan, "x")),
        [(1, float("nan"), (float("nan"), "x"))],
        [(1, nan, [nan, "x"]), (True, nan, (nan, "x")), (1, nan)],
    ),
    ([1, "a"], [[1, "a"]], [(1, "a"), [1.0, "a"], [True, "a"], [1, "a", None], [1]]),
    ([[1], [2.0]], [[[1], [2.0]]], [[[1], [2]], [[1], (2.0,)]]),
    (
        {"a": 1, "b": [1, 2]},
        [{"a": 1, "b": [1, 2]}, {"b": [1, 2], "a": 1}],
        [
            {"a": True, "b": [1, 2]},
            {"a": 1, "b": (1, 2)},
            {"a": 1},
            {"a": 1, "b": [1, 2], "c": 3},
            {"a": 1, "c": [1, 2]},
        ],
    ),
    ({1: "x"}, [{1: "x"}], [{True: "x"}, {1.0: "x"}]),
    ({"n": nan}, [{"n": float("nan")}], [{"n": 1.0}]),
    ({1, 2}, [{2, 1}, {1, 2}], [frozenset({1, 2}), {1, 2.0}, {True, 2}, {1}, {1, 2, 3}]),
    (frozenset({"a", (1, nan)}), [frozenset({"a", (1, float("nan"))})], [{"a", (1, nan)}, frozenset({"a"})]),
    (frozenset(), [frozenset()], [set(), ()]),
    # range compares start/stop/step (as Dynamo does), not the items: range(0, 9, 2) differs
    (range(0, 10, 2), [range(0, 10, 2)], [range(0, 9, 2), range(10), range(0, 10, 3), [0, 2, 4, 6, 8]]),
    (range(0), [range(0)], [range(5, 5), range(0, 0, 2)]),
    (slice(1, None, 2), [slice(1, None, 2)], [slice(1, None, 2.0), slice(True, None, 2), slice(1, 0, 2)]),
    (Color.RED, [Color.RED], [Color.GREEN, 1]),
    (Level.LOW, [Level.LOW], [1, Level.HIGH, True]),
    ((Color.RED, Level.HIGH), [(Color.RED, Level.HIGH)], [(Color.RED, 2)]),
]


@pytest.mark.parametrize("const,good,bad", EQUALS_CASES, ids=[repr(c)[:40] for c, _, _ in EQUALS_CASES])
def test_equals_match(const: Any, good: list, bad: list) -> None:
    gs = build({"v": const}, ("equals", "L['v']"))
    passes(gs, {"v": const})
    for g in good:
        passes(gs, {"v": g})
    for x in bad:
        w = fails(gs, {"v": x}, "L['v']", "EQUALS_MATCH")
        assert w.actual is x


def test_equals_explicit_value() -> None:
    gs = build({"n": 3}, ("equals", "L['n']", 3))
    passes(gs, {"n": 3})
    fails(gs, {"n": 4}, "L['n']", "EQUALS_MATCH")


def test_equals_rejects_non_constants() -> None:
    b = tw.GuardBuilder({"o": Obj(), "l": [1, Obj()], "d": {"k": object()}, "s": bytearray(b"x")})
    for src in ("L['o']", "L['l']", "L['d']", "L['s']"):
        with pytest.raises(tw.GuardBuildError):
            b.equals(src)
    assert len(b) == 0


def test_equals_nan_dict_key() -> None:
    """A NaN key matches another NaN key (NaN matches NaN), in and out of insertion order."""
    gs = build({"d": {nan: 1, "a": 2}}, ("equals", "L['d']"))
    passes(gs, {"d": {nan: 1, "a": 2}})
    passes(gs, {"d": {float("nan"): 1, "a": 2}})
    passes(gs, {"d": {"a": 2, float("nan"): 1}})
    fails(gs, {"d": {float("nan"): 2, "a": 2}}, "L['d']", "EQUALS_MATCH")
    fails(gs, {"d": {"a": 2, float("nan"): 3}}, "L['d']", "EQUALS_MATCH")
    fails(gs, {"d": {"a": 2, 1.0: 1}}, "L['d']", "EQUALS_MATCH")


def test_equals_never_calls_user_eq() -> None:
    calls = []

    class Sneaky(str):
        def __eq__(self, other: Any) -> bool:
            calls.append(other)
            return True

        __hash__ = str.__hash__

    gs = build({"v": ["a"], "d": {"k": 1}}, ("equals", "L['v']"), ("equals", "L['d']"))
    fails(gs, {"v": [Sneaky("zz")], "d": {"k": 1}}, "L['v']", "EQUALS_MATCH")
    fails(gs, {"v": ["a"], "d": {Sneaky("k"): 1}}, "L['d']", "EQUALS_MATCH")
    assert calls == []


def test_constants_are_private_copies() -> None:
    xs = [1, [2, 3], {"k": [4]}]
    cfg = {"mode": "fast", "sizes": [1, 2]}
    keys = {"a": 1, "b": 2}
    b = tw.GuardBuilder({"xs": xs, "cfg": cfg, "keys": keys})
    b.equals("L['xs']")
    b.equals("L['cfg']")
    b.dict_keys("L['keys']")
    gs = b.build()
    snapshot = {
        "xs": [1, [2, 3], {"k": [4]}],
        "cfg": {"mode": "fast", "sizes": [1, 2]},
        "keys": {"a": 1, "b": 2},
    }
    xs.append(5)
    xs[1].append(9)
    xs[2]["k"].clear()
    cfg["mode"] = "slow"
    cfg["sizes"].append(3)
    keys["c"] = 3
    passes(gs, snapshot)
    fails(gs, {**snapshot, "xs": xs}, "L['xs']", "EQUALS_MATCH")
    fails(gs, {**snapshot, "cfg": cfg}, "L['cfg']", "EQUALS_MATCH")
    fails(gs, {**snapshot, "keys": keys}, "L['keys']", "DICT_KEYS")


def test_explicit_constant_is_private_copy() -> None:
    want = [1, 2]
    b = tw.GuardBuilder({"v": [1, 2]})
    b.equals("L['v']", value=want)
    gs = b.build()
    want.append(3)
    passes(gs, {"v": [1, 2]})
    fails(gs, {"v": [1, 2, 3]}, "L['v']", "EQUALS_MATCH")


# -- LENGTH, DICT_KEYS, DICT_CONTAINS, SET_CONTAINS, HASATTR -----------------------------------------


class Sized:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        if self.n < 0:
            raise ValueError("no length")
        return self.n


@pytest.mark.parametrize(
    "example,good,bad",
    [
        ([1, 2], [[3, 4], (5, 6), "ab", {1: 1, 2: 2}, Sized(2)], [[1], [], (1, 2, 3), 3, None, Sized(-1)]),
        ({}, [{}, [], ""], [{"a": 1}, object()]),
        (Sized(3), [Sized(3), "abc"], [Sized(4), Sized(-1)]),
    ],
)
def test_length(example: Any, good: list, bad: list) -> None:
    gs = build({"v": example}, ("length", "L['v']"))
    for g in good:
        passes(gs, {"v": g})
    for x in bad:
        fails(gs, {"v": x}, "L['v']", "LENGTH")


class KeysLiar(dict):
    keys_calls = 0

    def keys(self):  # type: ignore[override]
        KeysLiar.keys_calls += 1
        return ["liar"]

    def __iter__(self):
        KeysLiar.keys_calls += 1
        return iter(["liar"])


def test_dict_keys_ordered_and_unordered() -> None:
    d = {"a": 1, "b": 2}
    gs = build({"d": d}, ("dict_keys", "L['d']"))
    gsu = tw.GuardBuilder({"d": d})
    gsu.dict_keys("L['d']", ordered=False)
    gsu = gsu.build()
    for gs_, reordered_ok in ((gs, False), (gsu, True)):
        passes(gs_, {"d": {"a": 10, "b": 20}})
        if reordered_ok:
            passes(gs_, {"d": {"b": 2, "a": 1}})
        else:
            fails(gs_, {"d": {"b": 2, "a": 1}}, "L['d']", "DICT_KEYS")
        fails(gs_, {"d": {"a": 1}}, "L['d']", "DICT_KEYS")
        fails(gs_, {"d": {"a": 1, "b": 2, "c": 3}}, "L['d']", "DICT_KEYS")
        fails(gs_, {"d": {"a": 1, "c": 2}}, "L['d']", "DICT_KEYS")
        fails(gs_, {"d": [("a", 1), ("b", 2)]}, "L['d']", "DICT_KEYS")
        fails(gs_, {"d": {"a": 1, b"b": 2}}, "L['d']", "DICT_KEYS")


def test_dict_keys_key_types_are_exact() -> None:
    gs = build({"d": {1: "x", "k": 2}}, ("dict_keys", "L['d']"))
    passes(gs, {"d": {1: "y", "k": 3}})
    fails(gs, {"d": {True: "y", "k": 3}}, "L['d']", "DICT_KEYS")
    fails(gs, {"d": {1.0: "y", "k": 3}}, "L['d']", "DICT_KEYS")


def test_dict_keys_never_calls_overridden_keys() -> None:
    KeysLiar.keys_calls = 0
    d = KeysLiar(a=1, b=2)
    gs = build({"d": d}, ("dict_keys", "L['d']"))
    assert gs.guards[0].args[0] == ("a", "b")
    passes(gs, {"d": KeysLiar(a=3, b=4)})
    passes(gs, {"d": {"a": 1, "b": 2}})
    fails(gs, {"d": KeysLiar(b=1, a=2)}, "L['d']", "DICT_KEYS")
    b = tw.GuardBuilder({"d": d})
    b.dict_keys("L['d']", ordered=False)
    gsu = b.build()
    passes(gsu, {"d": KeysLiar(b=1, a=2)})
    fails(gsu, {"d": KeysLiar(a=1)}, "L['d']", "DICT_KEYS")
    assert KeysLiar.keys_calls == 0


class ContainsLiar(dict):
    calls = 0

    def __contains__(self, key: object) -> bool:
        ContainsLiar.calls += 1
        return not dict.__contains__(self, key)


@pytest.mark.parametrize("present", [True, False])
def test_dict_contains_both_senses(present: bool) -> None:
    d = {"k": 1} if present else {"j": 1}
    gs = build({"d": d}, ("dict_contains", "L['d']", "k"))
    assert gs.guards[0].args == ("k", present)
    passes(gs, {"d": dict(d)})
    other = {"j": 1} if present else {"k": 1}
    fails(gs, {"d": other}, "L['d']", "DICT_CONTAINS")
    fails(gs, {"d": ["k"]}, "L['d']", "DICT_CONTAINS")  # not a dict
    ContainsLiar.calls = 0
    passes(gs, {"d": ContainsLiar(d)})  # the dict's own table, not __contains__
    fails(gs, {"d": ContainsLiar(other)}, "L['d']", "DICT_CONTAINS")
    assert ContainsLiar.calls == 0


def test_dict_contains_explicit_sense() -> None:
    b = tw.GuardBuilder({"d": {}})
    b.dict_contains("L['d']", "k", present=False)
    b.dict_contains("L['d']", 1, present=False)
    gs = b.build()
    passes(gs, {"d": {"j": 1}})
    fails(gs, {"d": {"k": 1}}, "L['d']", "DICT_CONTAINS")
    w = fails(gs, {"d": {1.0: 1}}, "L['d']", "DICT_CONTAINS")  # 1.0 == 1: membership is ==
    assert w.guard.index == 1


class SetContainsLiar(set):
    calls = 0

    def __contains__(self, item: object) -> bool:
        SetContainsLiar.calls += 1
        return not set.__contains__(self, item)


class FrozenLiar(frozenset):
    def __contains__(self, item: object) -> bool:
        SetContainsLiar.calls += 1
        return True


@pytest.mark.parametrize("present", [True, False])
def test_set_contains_both_senses(present: bool) -> None:
    s = {"k", 1} if present else {"j", 1}
    gs = build({"s": s}, ("set_contains", "L['s']", "k"))
    assert gs.guards[0].kind is GuardKind.SET_CONTAINS
    assert gs.guards[0].args == ("k", present)
    other = {"j"} if present else {"k"}
    passes(gs, {"s": set(s)})
    passes(gs, {"s": frozenset(s)})  # torch's leaf: PySet_Check or PyFrozenSet_Check
    fails(gs, {"s": set(other)}, "L['s']", "SET_CONTAINS")
    fails(gs, {"s": frozenset(other)}, "L['s']", "SET_CONTAINS")
    for not_a_set in (dict.fromkeys(s), list(s), tuple(s), None, "k", s.__iter__()):
        fails(gs, {"s": not_a_set}, "L['s']", "SET_CONTAINS")  # either sense: not a set fails
    SetContainsLiar.calls = 0
    passes(gs, {"s": SetContainsLiar(s)})  # the set's own table, never __contains__
    fails(gs, {"s": SetContainsLiar(other)}, "L['s']", "SET_CONTAINS")
    passes(gs, {"s": FrozenLiar(s)})
    fails(gs, {"s": FrozenLiar(other)}, "L['s']", "SET_CONTAINS")
    assert SetContainsLiar.calls == 0


def test_set_contains_membership_is_hash_and_eq() -> None:
    b = tw.GuardBuilder({"s": set()})
    b.set_contains("L['s']", 1, present=False)
    b.set_contains("L['s']", (1, "a"), present=False)
    b.set_contains("L['s']", frozenset({2}), present=False)
    gs = b.build()
    assert [g.args[1] for g in gs] == [False, False, False]
    passes(gs, {"s": {2, (1, "b"), frozenset({3})}})
    assert fails(gs, {"s": {1.0}}, "L['s']", "SET_CONTAINS").guard.index == 0  # 1.0 == 1
    assert fails(gs, {"s": {True}}, "L['s']", "SET_CONTAINS").guard.index == 0
    assert fails(gs, {"s": {(1.0, "a")}}, "L['s']", "SET_CONTAINS").guard.index == 1
    assert fails(gs, {"s": frozenset({frozenset({2})})}, "L['s']", "SET_CONTAINS").guard.index == 2


def test_set_contains_refuses_an_unhashable_item() -> None:
    # set.__contains__ retries an unhashable set as a frozenset; the check (PySet_Contains, as
    # torch's leaf) does not, so such a guard could never pass: refused at build.
    b = tw.GuardBuilder({"s": {frozenset({1})}})
    for item in ({1}, [1], {"a": 1}):
        with pytest.raises(tw.GuardBuildError, match="SET_CONTAINS on L\\['s'\\]: the item is unhashable"):
            b.set_contains("L['s']", item)
    assert len(b.build()) == 0


def test_set_contains_default_sense_reads_the_example() -> None:
    f_locals = {"s": frozenset({"a"}), "t": SetContainsLiar({"b"}), "d": {"a": 1}}
    b = tw.GuardBuilder(f_locals)
    for src in ("L['s']", "L['t']"):
        b.set_contains(src, "a")
    gs = b.build()
    assert [g.args for g in gs] == [("a", True), ("a", False)]  # t's table, not its __contains__
    b.set_contains("L['d']", "a")  # a dict is no set: fails in either sense, on the example too
    with pytest.raises(tw.GuardBuildError, match="SET_CONTAINS"):
        b.build()


@given(
    example=st.sets(st.one_of(st.integers(-3, 3), st.sampled_from(["a", "b"]), st.none()), max_size=4),
    item=st.one_of(st.integers(-3, 3), st.floats(-3, 3), st.sampled_from(["a", "b", (1,), frozenset()])),
    other=st.one_of(
        st.sets(st.one_of(st.integers(-3, 3), st.sampled_from([1.0, True, "a", (1,)])), max_size=4),
        st.frozensets(st.one_of(st.integers(-3, 3), st.sampled_from(["a", "b"])), max_size=4),
        st.builds(SetContainsLiar, st.sets(st.integers(-3, 3), max_size=3)),
        st.dictionaries(st.integers(-3, 3), st.none(), max_size=3),
        st.lists(st.integers(-3, 3), max_size=3),
        st.none(),
    ),
)
@settings(max_examples=150, deadline=None)
def test_set_contains_agrees_with_the_oracle(example: set, item: Any, other: Any) -> None:
    gs = build({"s": example}, ("set_contains", "L['s']", item))
    passes(gs, {"s": example})
    agree(gs, {"s": other})


class WithGetattr:
    def __getattr__(self, name: str) -> Any:
        if name == "dynamic":
            return 42
        if name == "boom":
            raise ValueError("boom")
        raise AttributeError(name)


@pytest.mark.parametrize("present", [True, False])
def test_hasattr_both_senses(present: bool) -> None:
    o = Obj(cache=1) if present else Obj()
    gs = build({"o": o}, ("hasattr", "L['o']", "cache"))
    assert gs.guards[0].args == ("cache", present)
    passes(gs, {"o": Obj(cache=2) if present else Obj(other=1)})
    fails(gs, {"o": Obj() if present else Obj(cache=None)}, "L['o']", "HASATTR")


def test_hasattr_through_getattr_hook() -> None:
    b = tw.GuardBuilder({"o": WithGetattr()})
    b.hasattr("L['o']", "dynamic")
    b.hasattr("L['o']", "missing")
    gs = b.build()
    assert [g.args[1] for g in gs] == [True, False]
    passes(gs, {"o": WithGetattr()})
    fails(gs, {"o": Obj()}, "L['o']", "HASATTR")
    fails(gs, {"o": Obj(dynamic=1, missing=2)}, "L['o']", "HASATTR")
    b = tw.GuardBuilder({"o": Obj()})
    b.hasattr("L['o']", "boom", present=False)
    gs = b.build()
    fails(gs, {"o": WithGetattr()}, "L['o']", "HASATTR")  # a non-AttributeError fails the guard


# -- DICT_VERSION, iterators, CODE_MATCH, WEAKREF_ALIVE -------------------------------------------


def test_dict_version() -> None:
    d = {"a": 1}
    gs = build({"d": d}, ("dict_version", "L['d']"))
    for _ in range(3):
        passes(gs, {"d": d})
    fails(gs, {"d": {"a": 1}}, "L['d']", "DICT_VERSION")  # equal but another dict
    d["a"] = 2
    fails(gs, {"d": d}, "L['d']", "DICT_VERSION")
    d["a"] = 1  # same contents again: still modified since the guard was built
    fails(gs, {"d": d}, "L['d']", "DICT_VERSION")


def test_dict_version_needs_exact_dict() -> None:
    b = tw.GuardBuilder({"d": KeysLiar(a=1), "l": []})
    for src in ("L['d']", "L['l']"):
        with pytest.raises(tw.GuardBuildError):
            b.dict_version(src)


def test_tuple_iterator_len() -> None:
    it = iter((1, 2, 3))
    gs = build({"it": it}, ("tuple_iterator_len", "L['it']"))
    assert gs.guards[0].args == (3,)
    passes(gs, {"it": it})
    passes(gs, {"it": iter(("a", "b", "c"))})
    it2 = iter((1, 2, 3))
    next(it2)
    fails(gs, {"it": it2}, "L['it']", "TUPLE_ITERATOR_LEN")
    fails(gs, {"it": iter([1, 2, 3])}, "L['it']", "TUPLE_ITERATOR_LEN")
    fails(gs, {"it": (1, 2, 3)}, "L['it']", "TUPLE_ITERATOR_LEN")


def test_range_iterator() -> None:
    it = iter(range(0, 10, 2))
    next(it)
    gs = build({"it": it}, ("range_iterator", "L['it']"))
    assert gs.guards[0].args == (2, 10, 2)
    passes(gs, {"it": it})
    passes(gs, {"it": iter(range(2, 10, 2))})
    passes(gs, {"it": iter(range(2, 9, 2))})  # same remaining items
    fails(gs, {"it": iter(range(0, 10, 2))}, "L['it']", "RANGE_ITERATOR")
    fails(gs, {"it": iter([2, 4, 6, 8])}, "L['it']", "RANGE_ITERATOR")
    fails(gs, {"it": range(2, 10, 2)}, "L['it']", "RANGE_ITERATOR")


def _make_adder(n: int):
    def add(x: int) -> int:
        return x + n

    return add


def test_code_match() -> None:
    f = _make_adder(1)
    gs = build({"f": f}, ("code_match", "L['f']"))
    passes(gs, {"f": f})
    passes(gs, {"f": _make_adder(2)})  # another closure of the same code
    fails(gs, {"f": lambda x: x}, "L['f']", "CODE_MATCH")
    fails(gs, {"f": 3}, "L['f']", "CODE_MATCH")
    holder = types.SimpleNamespace(__code__=f.__code__)
    passes(gs, {"f": holder})  # not a function but has the code object


def test_weakref_alive(collect) -> None:
    o = Obj()
    r = weakref.ref(o)
    gs = build({"r": r}, ("weakref_alive", "L['r']"))
    passes(gs, {"r": r})
    fails(gs, {"r": o}, "L['r']", "WEAKREF_ALIVE")
    p = Obj()
    r2 = weakref.ref(p)
    del p
    collect()
    fails(gs, {"r": r2}, "L['r']", "WEAKREF_ALIVE")


# -- GLOBAL_STATE and LAMBDA ------------------------------------------------------------------------

MODE = {"value": "train"}


def current_mode() -> str:
    return MODE["value"]


def test_global_state_recursion_limit() -> None:
    gs = build({}, ("global_state", "recursion_limit"))
    passes(gs, {})
    old = sys.getrecursionlimit()
    try:
        sys.setrecursionlimit(old + 7)
        fails(gs, {}, None, "GLOBAL_STATE")
    finally:
        sys.setrecursionlimit(old)
    passes(gs, {})


def test_global_state_gc_enabled() -> None:
    assert gc.isenabled()
    gs = build({}, ("global_state", "gc_enabled"))
    passes(gs, {})
    gc.disable()
    try:
        w = fails(gs, {}, None, "GLOBAL_STATE")
        assert "gc_enabled" in w.reason
    finally:
        gc.enable()
    passes(gs, {})


def test_global_state_python_probe() -> None:
    gs = build({"x": 1}, ("global_state", current_mode), ("type_match", "L['x']"))
    passes(gs, {"x": 1})
    MODE["value"] = "eval"
    try:
        fails(gs, {"x": 1}, None, "GLOBAL_STATE")
        fails(gs, {"x": "s"}, None, "GLOBAL_STATE")  # ambient guard #0 comes first
    finally:
        MODE["value"] = "train"
    fails(gs, {"x": "s"}, "L['x']", "TYPE_MATCH")


def test_global_state_probe_that_raises_fails() -> None:
    state = {"ok": True}

    def probe() -> int:
        if not state["ok"]:
            raise RuntimeError("probe broke")
        return 1

    gs = build({}, ("global_state", probe))
    passes(gs, {})
    state["ok"] = False
    fails(gs, {}, None, "GLOBAL_STATE")


def test_global_state_rejects_unknown_probe_and_non_constant() -> None:
    b = tw.GuardBuilder({})
    with pytest.raises(tw.GuardBuildError):
        b.global_state("no_such_probe")
    with pytest.raises(tw.GuardBuildError):
        b.global_state(lambda: object())


def test_lambda_with_source() -> None:
    b = tw.GuardBuilder({"x": 5})
    b.predicate(lambda v: v > 0, "x > 0", source="L['x']")
    gs = b.build()
    passes(gs, {"x": 1})
    fails(gs, {"x": -1}, "L['x']", "LAMBDA")
    fails(gs, {"x": "s"}, "L['x']", "LAMBDA")  # raises TypeError: the guard fails
    fails(gs, {}, "L['x']", "LAMBDA")  # source missing


def test_lambda_without_source() -> None:
    seen = []

    def pred(f_locals: Any) -> bool:
        seen.append(f_locals)
        return "x" in f_locals

    b = tw.GuardBuilder({"x": 5})
    b.predicate(pred, "x is passed")
    gs = b.build()
    args = {"x": 1}
    passes(gs, args)
    assert seen[-1] is args
    fails(gs, {"y": 1}, None, "LAMBDA")


# -- steps -------------------------------------------------------------------------------------------


class WithProperty:
    klass_attr = "class-level"

    def __init__(self) -> None:
        self.inst = "instance"
        self.reads = 0

    @property
    def prop(self) -> int:
        self.reads += 1
        return 7


class Slots:
    __slots__ = ("a", "b")

    def __init__(self, a: Any) -> None:
        self.a = a


def test_attr_kinds() -> None:
    o = WithProperty()
    mod = types.ModuleType("tw_test_mod")
    mod.value = 3
    gs = build(
        {"o": o, "g": WithGetattr(), "s": Slots(1), "m": mod, "math": math},
        ("equals", "L['o'].inst"),
        ("equals", "L['o'].klass_attr"),
        ("equals", "L['o'].prop"),
        ("equals", "L['g'].dynamic"),
        ("equals", "L['s'].a"),
        ("equals", "L['m'].value"),
        ("equals", "L['math'].pi"),
        ("type_match", "L['o'].__class__"),
    )
    good = {"o": WithProperty(), "g": WithGetattr(), "s": Slots(1), "m": mod, "math": math}
    passes(gs, good)
    o2 = WithProperty()
    o2.inst = "changed"
    fails(gs, {**good, "o": o2}, "L['o'].inst", "EQUALS_MATCH")
    o3 = WithProperty()
    o3.klass_attr = "shadowed"
    fails(gs, {**good, "o": o3}, "L['o'].klass_attr", "EQUALS_MATCH")
    o4 = WithProperty()
    o4.__dict__["prop"] = 8  # a property (data descriptor) wins over the instance dict
    passes(gs, {**good, "o": o4})
    fails(gs, {**good, "g": Obj()}, "L['g'].dynamic", "EQUALS_MATCH")  # missing attribute
    fails(gs, {**good, "s": Slots(2)}, "L['s'].a", "EQUALS_MATCH")
    empty_slots = Slots(1)
    del empty_slots.a
    fails(gs, {**good, "s": empty_slots}, "L['s'].a", "EQUALS_MATCH")
    mod.value = 4
    try:
        fails(gs, good, "L['m'].value", "EQUALS_MATCH")
        del mod.value
        fails(gs, good, "L['m'].value", "EQUALS_MATCH")
        mod.__getattr__ = lambda name: 3 if name == "value" else None  # module __getattr__ (PEP 562)
        passes(gs, good)
    finally:
        mod.value = 3
    fails(gs, {**good, "math": types.SimpleNamespace(pi=3.0)}, "L['math'].pi", "EQUALS_MATCH")


def test_missing_attr_fails_every_guard_below() -> None:
    b = tw.GuardBuilder({"o": Obj(a=Obj(b=1))})
    b.type_match("L['o']")
    b.equals("L['o'].a.b")
    b.type_match("L['o'].a")
    gs = b.build()
    w = fails(gs, {"o": Obj()}, "L['o'].a.b", "EQUALS_MATCH")
    assert w.guard.index == 1
    assert w.actual is None and "cannot be read" in w.reason
    # the unreadable source is reported once, by the smallest guard on or below it
    assert [f.guard.index for f in gs.failures({"o": Obj()})] == [1]
    w = fails(gs, {"o": Obj(a=Obj())}, "L['o'].a.b", "EQUALS_MATCH")
    assert [f.guard.index for f in gs.failures({"o": Obj(a=Obj())})] == [1]
    w = fails(gs, {"o": Obj(a=[])}, "L['o'].a.b", "EQUALS_MATCH")
    assert [f.guard.index for f in gs.failures({"o": Obj(a=[])})] == [1, 2]


class CustomGetitem:
    def __getitem__(self, key: Any) -> Any:
        if key == "missing":
            raise KeyError(key)
        if key == "bad":
            raise ValueError("bad key")
        return ("got", key)


def test_item_kinds() -> None:
    f_locals = {
        "d": {"k": 1, 2: "two", b"b": 3, None: 4, 1.5: 5},
        "l": [10, 20, 30],
        "t": (1, (2, 3)),
        "c": CustomGetitem(),
    }
    gs = build(
        f_locals,
        ("equals", "L['d']['k']"),
        ("equals", "L['d'][2]"),
        ("equals", "L['d'][b'b']"),
        ("equals", "L['d'][None]"),
        ("equals", "L['d'][1.5]"),
        ("equals", "L['l'][0]"),
        ("equals", "L['l'][-1]"),
        ("equals", "L['t'][1][0]"),
        ("equals", "L['t'][-2]"),
        ("equals", "L['c']['x']"),
    )
    passes(gs, f_locals)
    passes(gs, {**f_locals, "l": [10, 0, 0, 30], "t": (1, [2])})
    fails(gs, {**f_locals, "d": {**f_locals["d"], "k": 2}}, "L['d']['k']", "EQUALS_MATCH")
    d = dict(f_locals["d"])
    del d[None]
    fails(gs, {**f_locals, "d": d}, "L['d'][None]", "EQUALS_MATCH")
    fails(gs, {**f_locals, "l": [10]}, "L['l'][-1]", "EQUALS_MATCH")
    fails(gs, {**f_locals, "l": []}, "L['l'][0]", "EQUALS_MATCH")
    passes(gs, {**f_locals, "l": (10, 20, 30)})  # a tuple indexes the same way
    fails(gs, {**f_locals, "t": (1, 2)}, "L['t'][1][0]", "EQUALS_MATCH")
    passes(gs, {**f_locals, "c": {"x": ("got", "x")}})
    fails(gs, {**f_locals, "c": 5}, "L['c']['x']", "EQUALS_MATCH")


def test_item_on_custom_getitem_that_raises() -> None:
    b = tw.GuardBuilder({"c": {"missing": 1, "bad": 2}})
    b.equals("L['c']['missing']")
    b.equals("L['c']['bad']")
    gs = b.build()
    fails(gs, {"c": CustomGetitem()}, "L['c']['missing']", "EQUALS_MATCH")


class LyingDict(dict):
    calls: list = []

    def __getitem__(self, key: Any) -> Any:
        LyingDict.calls.append(("getitem", key))
        return "lie"

    def __missing__(self, key: Any) -> Any:
        LyingDict.calls.append(("missing", key))
        return "invented"


def test_dict_item_never_calls_getitem_or_missing() -> None:
    LyingDict.calls = []
    d = LyingDict(k=1)
    gs = build({"d": d}, ("equals", "dict.__getitem__(L['d'], 'k')"))
    passes(gs, {"d": d})
    passes(gs, {"d": {"k": 1}})
    fails(gs, {"d": LyingDict(k=2)}, "dict.__getitem__(L['d'], 'k')", "EQUALS_MATCH")
    fails(gs, {"d": LyingDict(j=1)}, "dict.__getitem__(L['d'], 'k')", "EQUALS_MATCH")
    fails(gs, {"d": CustomGetitem()}, "dict.__getitem__(L['d'], 'k')", "EQUALS_MATCH")
    assert LyingDict.calls == []
    # whereas an ITEM step does call them
    gs2 = build({"d": {"k": "lie"}}, ("equals", "L['d']['k']"))
    passes(gs2, {"d": LyingDict(j=1)})
    assert LyingDict.calls


def test_type_step() -> None:
    gs = build({"x": Obj()}, ("id_match", "type(L['x'])"), ("equals", "type(L['x']).__name__"))
    passes(gs, {"x": Obj()})
    fails(gs, {"x": WithGetattr()}, "type(L['x'])", "ID_MATCH")


def test_dict_step() -> None:
    gs = build({"o": Obj(a=1, b=2)}, ("dict_keys", "L['o'].__dict__"), ("equals", "L['o'].__dict__['a']"))
    passes(gs, {"o": Obj(a=1, b=3)})
    fails(gs, {"o": Obj(b=1, a=1)}, "L['o'].__dict__", "DICT_KEYS")
    fails(gs, {"o": Slots(1)}, "L['o'].__dict__", "DICT_KEYS")  # no instance dict
    fails(gs, {"o": Obj}, "L['o'].__dict__", "DICT_KEYS")  # a type's __dict__ is not an instance dict
    fails(gs, {"o": 3}, "L['o'].__dict__", "DICT_KEYS")
    mod = types.ModuleType("m")
    mod.a, mod.b = 1, 2
    gsm = build({"m": mod}, ("equals", "L['m'].__dict__['a']"))
    passes(gsm, {"m": mod})


class ListSub(list):
    pass


class IntSub(int):
    pass


class ExcSub(Exception):
    pass


def _plain() -> None:
    pass


@pytest.mark.parametrize(
    "make",
    [ListSub, lambda: IntSub(3), ExcSub, lambda: lambda: None],
    ids=["list-sub", "int-sub", "exception", "function"],
)
def test_dict_step_on_lazily_created_instance_dict(make) -> None:
    """Objects whose instance dict is created on first access: ``x.__dict__`` is ``{}``."""
    gs = build({"x": make()}, ("dict_keys", "L['x'].__dict__"), ("length", "L['x'].__dict__"))
    passes(gs, {"x": make()})
    y = make()
    y.extra = 1
    fails(gs, {"x": y}, "L['x'].__dict__", "DICT_KEYS")
    z = make()
    gs2 = build({"x": y}, ("equals", "L['x'].__dict__['extra']"))
    fails(gs2, {"x": z}, "L['x'].__dict__['extra']", "EQUALS_MATCH")
    passes(gs2, {"x": y})


def _fn_with_defaults(a, b=10, *, k="kw"):
    return a


def test_defaults_and_kwdefaults() -> None:
    f = _fn_with_defaults
    gs = build({"f": f}, ("equals", "L['f'].__defaults__[0]"), ("equals", "L['f'].__kwdefaults__['k']"))
    passes(gs, {"f": f})

    def g(a, b=10, *, k="kw"):
        return a

    passes(gs, {"f": g})

    def h(a, b=11, *, k="kw"):
        return a

    fails(gs, {"f": h}, "L['f'].__defaults__[0]", "EQUALS_MATCH")

    def i(a, b=10):
        return a

    fails(gs, {"f": i}, "L['f'].__kwdefaults__['k']", "EQUALS_MATCH")

    def j(a, b, *, k="kw"):
        return a

    fails(gs, {"f": j}, "L['f'].__defaults__[0]", "EQUALS_MATCH")
    # a non-function object with the attributes
    fake = types.SimpleNamespace(__defaults__=(10,), __kwdefaults__={"k": "kw"})
    passes(gs, {"f": fake})
    fails(
        gs,
        {"f": types.SimpleNamespace(__defaults__=None, __kwdefaults__=None)},
        "L['f'].__defaults__[0]",
        "EQUALS_MATCH",
    )
    # defaults changed in place
    g.__defaults__ = (12,)
    fails(gs, {"f": g}, "L['f'].__defaults__[0]", "EQUALS_MATCH")
    g.__defaults__ = (10,)
    g.__kwdefaults__ = {"k": "other"}
    fails(gs, {"f": g}, "L['f'].__kwdefaults__['k']", "EQUALS_MATCH")


def test_code_step() -> None:
    f = _make_adder(1)
    gs = build({"f": f}, ("id_match", "L['f'].__code__"), ("equals", "L['f'].__code__.co_name"))
    passes(gs, {"f": _make_adder(5)})
    fails(gs, {"f": _fn_with_defaults}, "L['f'].__code__", "ID_MATCH")
    fails(gs, {"f": 1}, "L['f'].__code__", "ID_MATCH")

    class AnswersCode:  # not a function: its own getattr answers `__code__` (user code)
        def __init__(self, code: Any) -> None:
            self.code = code

        @property
        def __code__(self) -> Any:
            return self.code

    passes(gs, {"f": AnswersCode(f.__code__)})
    fails(gs, {"f": AnswersCode(_fn_with_defaults.__code__)}, "L['f'].__code__", "ID_MATCH")


def test_closure_cell_step() -> None:
    f = _make_adder(1)
    gs = build({"f": f}, ("equals", "L['f'].__closure__[0].cell_contents"))
    passes(gs, {"f": f})
    passes(gs, {"f": _make_adder(1)})
    fails(gs, {"f": _make_adder(2)}, "L['f'].__closure__[0].cell_contents", "EQUALS_MATCH")
    fails(gs, {"f": _fn_with_defaults}, "L['f'].__closure__[0].cell_contents", "EQUALS_MATCH")  # no closure
    f.__closure__[0].cell_contents = 3
    fails(gs, {"f": f}, "L['f'].__closure__[0].cell_contents", "EQUALS_MATCH")

    def make_empty():
        def inner():
            return later

        return inner
        later = 1

    fails(gs, {"f": make_empty()}, "L['f'].__closure__[0].cell_contents", "EQUALS_MATCH")  # empty cell


def test_closure_root() -> None:
    n = 3

    def f() -> int:
        return n

    b = tw.GuardBuilder({}, None, f)
    b.equals("C['n']")
    gs = b.build()
    closure = b.f_closure
    passes(gs, {}, f_closure=closure)
    f.__closure__[0].cell_contents = 4
    fails(gs, {}, "C['n']", "EQUALS_MATCH", f_closure=closure)


def test_global_root() -> None:
    g = {"cfg": {"mode": "fast"}}
    gs = build({}, ("equals", "G['cfg']['mode']"), f_globals=g)
    passes(gs, {}, f_globals=g)
    g["cfg"] = {"mode": "slow"}
    fails(gs, {}, "G['cfg']['mode']", "EQUALS_MATCH", f_globals=g)
    del g["cfg"]
    fails(gs, {}, "G['cfg']['mode']", "EQUALS_MATCH", f_globals=g)


def test_weakref_call_step(collect) -> None:
    o = Obj(a=1)
    r = weakref.ref(o)
    gs = build({"r": r}, ("type_match", "L['r']()"), ("equals", "L['r']().a"))
    passes(gs, {"r": r})
    fails(gs, {"r": o}, "L['r']()", "TYPE_MATCH")  # not a weak reference
    p = Obj(a=1)
    r2 = weakref.ref(p)
    del p
    collect()
    w = fails(gs, {"r": r2}, "L['r']()", "TYPE_MATCH")  # dead: r() is None
    assert w.actual is type(None)


class Method:
    def m(self) -> int:
        return 1


def test_weakref_call_on_a_ref_subclass_reads_the_referent() -> None:
    """``X()`` is the referent of weak reference X (as Dynamo's accessor reads it): a subclass's
    __call__ (WeakMethod builds a bound method) is user code the step does not run."""
    calls = []

    class CountingRef(weakref.ref):
        def __call__(self):  # type: ignore[override]
            calls.append(1)
            return "not the referent"

    obj = Method()
    wm = weakref.WeakMethod(obj.m)
    assert type(wm()) is types.MethodType
    gs = build({"w": wm}, ("type_match", "L['w']()"), ("weakref_alive", "L['w']"))
    assert gs.guards[0].args[0].get() is Method  # held weakly
    passes(gs, {"w": wm})
    passes(gs, {"w": weakref.ref(obj)})
    passes(gs, {"w": CountingRef(obj)})
    assert calls == []
    other = Obj()
    fails(gs, {"w": CountingRef(other)}, "L['w']()", "TYPE_MATCH")


def test_dict_key_and_value_at_position() -> None:
    d = {"a": 1, 2: "b", "c": [3]}
    gs = build(
        {"d": d},
        ("equals", "list(dict.keys(L['d']))[1]"),
        ("equals", "L['d'][list(dict.keys(L['d']))[2]]"),
    )
    passes(gs, {"d": {"a": 0, 2: 0, "c": [3]}})
    passes(gs, {"d": {"x": 0, 2: 0, "c": [3]}})
    fails(gs, {"d": {2: 0, "a": 0, "c": [3]}}, "list(dict.keys(L['d']))[1]", "EQUALS_MATCH")
    fails(gs, {"d": {"a": 0, 2: 0}}, "L['d'][list(dict.keys(L['d']))[2]]", "EQUALS_MATCH")
    fails(gs, {"d": [1, 2, 3]}, "list(dict.keys(L['d']))[1]", "EQUALS_MATCH")
    # a dict subclass: positions come from the dict's own table
    LyingDict.calls = []
    passes(gs, {"d": LyingDict({"a": 0, 2: 0, "c": [3]})})
    assert LyingDict.calls == []


@pytest.mark.parametrize(
    "text",
    [
        "L['self'].layers[0].weight",
        "G['torch'].nn",
        "L['f'].__closure__[0].cell_contents",
        "list(dict.keys(L['d']))[1]",
        "L['d'][list(dict.keys(L['d']))[1]]",
        "dict.__getitem__(L['d'], 'k')",
        "type(L['x'])",
        "L['fn'].__defaults__[0]",
        "L['fn'].__kwdefaults__['k']",
        "L['r']()",
    ],
)
def test_dynamo_spellings_build_and_check(text: str) -> None:
    layer = Obj(weight=1.5)
    f_locals = {
        "self": Obj(layers=[layer]),
        "f": _make_adder(7),
        "d": {"a": 1, "k": 2},
        "x": 3,
        "fn": _fn_with_defaults,
        "r": weakref.ref(layer),
    }
    torch_like = types.ModuleType("torch_like")
    torch_like.nn = types.ModuleType("torch_like.nn")
    f_globals = {"torch": torch_like}
    b = tw.GuardBuilder(f_locals, f_globals)
    b.type_match(text)
    b.id_match(text)
    gs = b.build()
    assert str(gs.guards[0].source) == text
    passes(gs, f_locals, f_globals=f_globals)
    if text.startswith("G"):
        del f_globals["torch"]
        fails(gs, f_locals, text, "TYPE_MATCH", f_globals=f_globals)
    else:
        fails(gs, {}, text, "TYPE_MATCH", f_globals=f_globals)


def test_f_locals_dict_subclass_missing_is_not_called() -> None:
    class DefaultLocals(dict):
        def __missing__(self, key: str) -> Any:
            return 5

    gs = build({"x": 5}, ("equals", "L['x']"))
    fails(gs, DefaultLocals(), "L['x']", "EQUALS_MATCH")
    passes(gs, DefaultLocals(x=5))


def test_f_locals_may_be_any_mapping() -> None:
    import collections

    gs = build({"x": 5}, ("equals", "L['x']"))
    passes(gs, collections.ChainMap({"x": 5}))
    fails(gs, collections.ChainMap({"y": 5}), "L['x']", "EQUALS_MATCH")
    passes(gs, types.MappingProxyType({"x": 5}))


# -- attribute inline cache under class mutation -----------------------------------------------------


def make_class():
    class C:
        def __init__(self, a: Any = 1) -> None:
            self.a = a

    return C


def check_many(gs: tw.GuardSet, f_locals: dict, expect: bool, times: int = 25) -> None:
    for _ in range(times):
        assert gs.check(f_locals) is expect
    assert reference.check(gs.guards, f_locals) is expect
    assert (gs.why_not(f_locals) is None) is expect


def test_inline_cache_add_property() -> None:
    C = make_class()
    o = C(1)
    gs = build({"o": o}, ("equals", "L['o'].a"))
    check_many(gs, {"o": o}, True)
    C.a = property(lambda self: 2)  # now a data descriptor: the instance dict is ignored
    check_many(gs, {"o": o}, False)
    assert gs.why_not({"o": o}).actual == 2
    del C.a
    check_many(gs, {"o": o}, True)


def test_inline_cache_class_attribute_and_deletion() -> None:
    C = make_class()
    o = C(1)
    gs = build({"o": o}, ("equals", "L['o'].a"))
    check_many(gs, {"o": o}, True)
    C.a = 1  # a class attribute does not shadow the instance attribute
    check_many(gs, {"o": o}, True)
    o.a = 3
    check_many(gs, {"o": o}, False)
    del o.a  # now the class attribute is found
    check_many(gs, {"o": o}, True)
    C.a = 4
    check_many(gs, {"o": o}, False)
    del C.a
    check_many(gs, {"o": o}, False)  # missing everywhere
    o.a = 1
    check_many(gs, {"o": o}, True)


def test_inline_cache_add_getattr() -> None:
    C = make_class()
    o = C(1)
    gs = build({"o": o}, ("equals", "L['o'].a"))
    check_many(gs, {"o": o}, True)
    del o.a
    check_many(gs, {"o": o}, False)
    C.__getattr__ = lambda self, name: 1 if name == "a" else None
    check_many(gs, {"o": o}, True)
    o.a = 2  # __getattr__ only runs for missing attributes
    check_many(gs, {"o": o}, False)
    C.__getattribute__ = lambda self, name: 1  # now every lookup goes through it
    check_many(gs, {"o": o}, True)
    del C.__getattribute__
    check_many(gs, {"o": o}, False)


def test_inline_cache_change_class() -> None:
    C, D = make_class(), make_class()
    D.a = property(lambda self: "from D")
    o = C(1)
    gs = build({"o": o}, ("equals", "L['o'].a"))
    check_many(gs, {"o": o}, True)
    o.__class__ = D
    check_many(gs, {"o": o}, False)
    o.__class__ = C
    check_many(gs, {"o": o}, True)


def test_inline_cache_monkeypatch_property() -> None:
    C = make_class()
    C.p = property(lambda self: 1)
    o = C(0)
    gs = build({"o": o}, ("equals", "L['o'].p"))
    check_many(gs, {"o": o}, True)
    C.p = property(lambda self: 2)
    check_many(gs, {"o": o}, False)
    C.p = property(lambda self: 1)
    check_many(gs, {"o": o}, True)
    o.__dict__["p"] = 1
    del C.p  # the instance dict entry becomes visible
    check_many(gs, {"o": o}, True)
    o.__dict__["p"] = 5
    check_many(gs, {"o": o}, False)


def test_inline_cache_base_class_mutation() -> None:
    class Base:
        pass

    class Child(Base):
        def __init__(self) -> None:
            self.a = 1

    o = Child()
    gs = build({"o": o}, ("equals", "L['o'].a"))
    check_many(gs, {"o": o}, True)
    Base.a = property(lambda self: 9)  # inherited data descriptor
    check_many(gs, {"o": o}, False)
    del Base.a
    check_many(gs, {"o": o}, True)


def test_inline_cache_instance_dict_replaced() -> None:
    C = make_class()
    o = C(1)
    gs = build({"o": o}, ("equals", "L['o'].a"))
    check_many(gs, {"o": o}, True)
    o.__dict__ = {"a": 2}
    check_many(gs, {"o": o}, False)
    o.__dict__ = {"z": 0, "y": 0, "a": 1}  # found at another position
    check_many(gs, {"o": o}, True)
    o.__dict__ = {}
    check_many(gs, {"o": o}, False)


def test_inline_cache_many_instances_and_layouts() -> None:
    C = make_class()
    gs = build({"o": C(1)}, ("equals", "L['o'].a"), ("type_match", "L['o']"))
    objs = []
    for i in range(40):
        o = C.__new__(C)
        # different insertion orders and sizes put 'a' at different entry positions
        for j in range(i % 7):
            setattr(o, f"pad{j}", j)
        o.a = 1 if i % 3 else 2
        if i % 5 == 0:
            o.__dict__  # materialise the dict
        if i % 4 == 0:
            setattr(o, "late", i)
        objs.append(o)
    for _ in range(3):
        for o in objs:
            want = o.a == 1
            assert gs.check({"o": o}) is want
            assert reference.check(gs.guards, {"o": o}) is want
    # deleting and re-adding moves the entry
    o = objs[1]
    del o.a
    check_many(gs, {"o": o}, False)
    o.a = 1
    check_many(gs, {"o": o}, True)


def test_inline_cache_non_interned_key_and_big_dicts() -> None:
    C = make_class()
    gs = build({"o": C(1)}, ("equals", "L['o'].a"))
    o = C.__new__(C)
    o.__dict__["".join(["a"])] = 1  # a str key that may not be the interned 'a'
    check_many(gs, {"o": o}, True)
    name = "".join(["mo", "de"])
    gs2 = build({"o": C(1)}, ("equals", "L['o'].a"), ("hasattr", "L['o']", "mode"))
    p = C(1)
    p.__dict__[name] = 1
    check_many(gs2, {"o": p}, False)
    big = C.__new__(C)
    for j in range(400):  # beyond any scan limit
        big.__dict__[f"k{j}"] = j
    big.a = 1
    check_many(gs, {"o": big}, True)
    big.a = 2
    check_many(gs, {"o": big}, False)
    d = {f"k{j}": j for j in range(400)}
    d["mode"] = "fast"
    gsd = build({"d": d}, ("equals", "L['d']['mode']"))
    check_many(gsd, {"d": d}, True)
    d2 = dict(d)
    d2["".join(["mo", "de"])] = "slow"
    check_many(gsd, {"d": d2}, False)


def test_inline_cache_on_class_objects() -> None:
    C = make_class()
    C.setting = "x"
    gs = build({"cls": C}, ("equals", "L['cls'].setting"))
    check_many(gs, {"cls": C}, True)
    C.setting = "y"
    check_many(gs, {"cls": C}, False)
    C.setting = "x"
    check_many(gs, {"cls": C}, True)


def test_inline_cache_module_attribute() -> None:
    mod = types.ModuleType("tw_mod")
    mod.flag = True
    gs = build({"m": mod}, ("true", "L['m'].flag"))
    check_many(gs, {"m": mod}, True)
    mod.flag = False
    check_many(gs, {"m": mod}, False)
    for j in range(50):
        setattr(mod, f"filler{j}", j)  # the module dict is resized
    mod.flag = True
    check_many(gs, {"m": mod}, True)
    del mod.flag
    check_many(gs, {"m": mod}, False)


def test_inline_cache_slots_and_dict_side_by_side() -> None:
    class S:
        __slots__ = ("__dict__", "a")

    s = S()
    s.a = 1
    gs = build({"o": s}, ("equals", "L['o'].a"))
    check_many(gs, {"o": s}, True)
    s.__dict__["a"] = 2  # the slot (data descriptor) wins
    check_many(gs, {"o": s}, True)
    s.a = 3
    check_many(gs, {"o": s}, False)
    C = make_class()
    check_many(gs, {"o": C(1)}, True)  # another type at the same step
    check_many(gs, {"o": s}, False)


# -- builder features ----------------------------------------------------------------------------------


def test_checkpoint_and_restore() -> None:
    b = tw.GuardBuilder({"x": 1, "y": "s"})
    b.type_match("L['x']")
    cp = b.checkpoint()
    b.equals("L['x']")
    b.type_match("L['y']")
    assert len(b) == 3
    b.restore(cp)
    assert len(b) == 1
    cp2 = b.checkpoint()
    b.equals("L['y']")
    gs = b.build()
    assert [g.kind for g in gs] == [GuardKind.TYPE_MATCH, GuardKind.EQUALS_MATCH]
    passes(gs, {"x": 5, "y": "s"})  # the rolled back EQUALS on x is gone
    fails(gs, {"x": 5, "y": "t"}, "L['y']", "EQUALS_MATCH")
    b.restore(cp2)
    b.restore(cp2)  # idempotent
    with pytest.raises(ValueError):
        b.restore(tw.GuardBuilder({}).checkpoint())
    b.restore(cp)
    b2 = tw.GuardBuilder({})
    with pytest.raises(ValueError):
        b.restore(b2.checkpoint())


def test_checkpoint_newer_than_state_is_rejected() -> None:
    b = tw.GuardBuilder({"x": 1})
    b.type_match("L['x']")
    b.equals("L['x']")
    late = b.checkpoint()
    early_len = 0
    b.restore(tw.Checkpoint(b, early_len))
    with pytest.raises(ValueError):
        b.restore(late)


def test_guard_filter_drops_guards() -> None:
    def keep_types(specs: list[tw.GuardSpec]) -> list[bool]:
        return [s.kind is GuardKind.TYPE_MATCH for s in specs]

    b = tw.GuardBuilder({"x": 1, "y": 2}, guard_filter=keep_types)
    b.type_match("L['x']")
    b.equals("L['x']")
    b.equals("L['y']")
    gs = b.build()
    assert len(gs) == 1 and gs.guards[0].kind is GuardKind.TYPE_MATCH
    passes(gs, {"x": 7, "y": 0})
    fails(gs, {"x": "7"}, "L['x']", "TYPE_MATCH")
    b2 = tw.GuardBuilder({"x": 1}, guard_filter=lambda specs: [True])
    b2.type_match("L['x']")
    b2.equals("L['x']")
    with pytest.raises(tw.GuardBuildError):
        b2.build()


def test_build_fails_when_a_guard_fails_on_its_own_example() -> None:
    for decl in (
        lambda b: b.equals("L['x']", value=4),
        lambda b: b.none("L['x']"),
        lambda b: b.true("L['x']"),
        lambda b: b.type_match("L['x']", str),
        lambda b: b.length("L['xs']", 5),
        lambda b: b.dict_keys("L['d']", ["nope"]),
        lambda b: b.hasattr("L['xs']", "append", present=False),
        lambda b: b.predicate(lambda v: False, "never", source="L['x']"),
        lambda b: b.add(GuardKind.TYPE_MATCH, "L['nope']", (int,)),
    ):
        b = tw.GuardBuilder({"x": 3, "xs": [1], "d": {"k": 1}})
        decl(b)
        with pytest.raises(tw.GuardBuildError):
            b.build()
    b = tw.GuardBuilder({"x": 3})
    with pytest.raises(tw.GuardBuildError):
        b.type_match("L['nope']")  # the value cannot be read to infer the type


class Explodes:
    @property
    def value(self) -> int:
        raise ValueError("exploded")


def test_strict_mode_raises_guard_eval_error_with_cause() -> None:
    b = tw.GuardBuilder({"o": Obj(value=1)})
    b.equals("L['o'].value")
    lax = b.build()
    strict = b.build(strict=True)
    assert lax.check({"o": Explodes()}) is False
    assert reference.check(lax.guards, {"o": Explodes()}) is False
    with pytest.raises(tw.GuardEvalError) as info:
        strict.check({"o": Explodes()})
    assert isinstance(info.value.__cause__, ValueError)
    assert "exploded" in str(info.value.__cause__)
    assert "L['o'].value" in str(info.value)
    assert isinstance(info.value, tw.TripwireError)
    # a plain failure is still a False, not an error
    assert strict.check({"o": Obj(value=2)}) is False
    assert strict.check({"o": Obj(value=1)}) is True
    assert strict.check({"o": Obj()}) is False  # a missing attribute is not an error


def test_strict_mode_guard_that_raises() -> None:
    b = tw.GuardBuilder({"x": [1]})
    b.length("L['x']")
    gs = b.build(strict=True)
    with pytest.raises(tw.GuardEvalError) as info:
        gs.check({"x": Sized(-1)})
    assert isinstance(info.value.__cause__, ValueError)


def test_strict_build_raises_on_its_own_example() -> None:
    b = tw.GuardBuilder({"o": Explodes()})
    b.hasattr("L['o']", "other", present=False)
    b.predicate(lambda o: o.value, "explodes", source="L['o']")
    with pytest.raises(tw.GuardBuildError):
        b.build(strict=True)


class Interrupting:
    @property
    def value(self) -> int:
        raise KeyboardInterrupt


@pytest.mark.parametrize("strict", [False, True])
def test_base_exceptions_escape_check(strict: bool) -> None:
    b = tw.GuardBuilder({"o": Obj(value=1)})
    b.equals("L['o'].value")
    gs = b.build(strict=strict)
    with pytest.raises(KeyboardInterrupt):
        gs.check({"o": Interrupting()})


def test_explain_len_and_iteration() -> None:
    b = tw.GuardBuilder({"x": 3, "cfg": {"mode": "fast"}})
    b.type_match("L['x']")  # line A
    line_a = sys._getframe().f_lineno - 1
    b.equals("L['cfg']['mode']")
    b.dict_keys("L['cfg']")
    b.global_state("gc_enabled")
    gs = b.build()
    assert len(gs) == 4
    assert [g.index for g in gs] == [0, 1, 2, 3]
    assert [g.kind for g in gs] == [
        GuardKind.TYPE_MATCH,
        GuardKind.EQUALS_MATCH,
        GuardKind.DICT_KEYS,
        GuardKind.GLOBAL_STATE,
    ]
    assert list(gs) == list(gs.guards)
    text = gs.explain()
    for piece in (
        "L['x']",
        "L['cfg']['mode']",
        "L['cfg']",
        "TYPE_MATCH",
        "EQUALS_MATCH",
        "DICT_KEYS",
        "GLOBAL_STATE",
    ):
        assert piece in text
    site = f"test_kinds.py:{line_a} in test_explain_len_and_iteration"
    assert site in text
    assert site in gs.guards[0].stack[-1]
    # a failure can say where its guard was installed
    w = gs.why_not({"x": "s", "cfg": {"mode": "fast"}})
    assert w.stack and site in w.stack[-1]


def test_invalidated_when_identity_object_dies(collect) -> None:
    C = make_class()
    o = C(1)
    gs = build({"o": o}, ("id_match", "L['o']"))
    passes(gs, {"o": o})
    del o
    collect()
    assert gs.invalid
    other = C(1)
    assert gs.check({"o": other}) is False
    assert reference.check(gs.guards, {"o": other}) is False
    w = gs.why_not({"o": other})
    assert w.kind == "ID_MATCH" and "died" in w.reason


def test_type_match_on_a_class_that_dies(collect) -> None:
    C = make_class()
    gs = build({"o": C(1)}, ("type_match", "L['o']"))
    del C
    collect()
    assert gs.invalid
    assert agree(gs, {"o": 1}) is False


def test_shared_prefix_is_fetched_once() -> None:
    reads = []

    class Counting:
        @property
        def inner(self) -> dict:
            reads.append(1)
            return {"a": 1, "b": 2}

    b = tw.GuardBuilder({"o": Counting()})
    b.equals("L['o'].inner['a']")
    b.equals("L['o'].inner['b']")
    b.dict_keys("L['o'].inner")
    gs = b.build()
    assert gs.node_count == 4
    reads.clear()
    assert gs.check({"o": Counting()})
    assert reads == [1]


def test_partial_and_bound_method_attributes() -> None:
    p = functools.partial(int, base=2)
    gs = build({"p": p}, ("id_match", "L['p'].func"), ("equals", "L['p'].keywords"))
    passes(gs, {"p": functools.partial(int, base=2)})
    fails(gs, {"p": functools.partial(str)}, "L['p'].func", "ID_MATCH")


class RaisesLookup:
    def __getitem__(self, key: Any) -> Any:
        raise KeyError(key)


class RaisesOther:
    def __getitem__(self, key: Any) -> Any:
        raise TypeError("not subscriptable today")


@pytest.mark.parametrize(
    "example,absent,src",
    [
        ({"c": {"k": 1}}, RaisesLookup(), "L['c']['k']"),
        ({"c": ListSub([1])}, ListSub(), "L['c'][0]"),
        (
            {"c": types.SimpleNamespace(__defaults__=(1,))},
            types.SimpleNamespace(__defaults__=()),
            "L['c'].__defaults__[0]",
        ),
        (
            {"c": types.SimpleNamespace(__kwdefaults__={"k": 1})},
            types.SimpleNamespace(__kwdefaults__={}),
            "L['c'].__kwdefaults__['k']",
        ),
        (
            {"c": types.SimpleNamespace(__closure__=(types.CellType(1),))},
            types.SimpleNamespace(__closure__=()),
            "L['c'].__closure__[0].cell_contents",
        ),
        (
            {"c": types.SimpleNamespace(__closure__=(types.CellType(1),))},
            types.SimpleNamespace(__closure__=(types.CellType(),)),
            "L['c'].__closure__[0].cell_contents",
        ),
        ({"c": Obj(a=1)}, Obj(), "L['c'].a"),
    ],
    ids=[
        "getitem-keyerror",
        "list-subclass-index",
        "defaults",
        "kwdefaults",
        "closure-index",
        "empty-cell",
        "attr",
    ],
)
def test_strict_mode_missing_key_index_or_attr_is_a_plain_failure(
    example: dict, absent: Any, src: str
) -> None:
    """A missing key, index, attribute or cell content fails the guard without raising, also in
    strict mode and also when user code (a __getitem__) reports it, as for dicts and lists."""
    b = tw.GuardBuilder(example)
    b.equals(src)
    strict = b.build(strict=True)
    lax = b.build()
    assert strict.check({"c": absent}) is False
    fails(lax, {"c": absent}, src, "EQUALS_MATCH")
    assert strict.check(example) is True


def test_strict_mode_other_subscript_errors_raise() -> None:
    b = tw.GuardBuilder({"c": {"k": 1}})
    b.equals("L['c']['k']")
    gs = b.build(strict=True)
    with pytest.raises(tw.GuardEvalError) as info:
        gs.check({"c": RaisesOther()})
    assert isinstance(info.value.__cause__, TypeError)
    fails(b.build(), {"c": RaisesOther()}, "L['c']['k']", "EQUALS_MATCH")


# -- the kind table -------------------------------------------------------------------------------
# tripwire.catalogue.KINDS is the engine's kind table (cpp/core/guard_kind_table.hpp) as the
# binding exports it. It is checked here against what was written by hand elsewhere: the
# catalogue's table of kinds, docs/format.md's guard records, and the builder's behaviour.

ROOT = pathlib.Path(__file__).resolve().parents[3]
_IMPLIED = {
    "never",
    "identity",
    "if_immutable_type",
    "if_immutable_constant",
    "dict_state",
    "dict_state_or_fixed_size",
}


def test_kind_table_has_every_kind_once_in_value_order() -> None:
    kinds = tw.catalogue.KINDS
    assert list(kinds) == sorted(GuardKind.__members__.values(), key=int)
    assert len(kinds) == len(GuardKind.__members__) == 27
    for k, f in kinds.items():
        assert f.kind is k
        assert f.source in ("required", "optional", "absent"), f
        assert f.operand in ("none", "value", "identity"), f
        assert f.implied in _IMPLIED, f
        # Stored exactly when no reason says otherwise; record version 1 for every stored kind.
        assert (f.record_version == 0) == (f.never_stored is not None), f
        assert f.record_version in (0, 1), f
        # A relational guard's first source is its own; it is decided after the walk, never implied.
        if f.relational:
            assert f.source == "required" and f.implied == "never", f
        # An implied guard is a function of the object it held on: it reads no user code.
        if f.implied in ("identity", "if_immutable_type", "if_immutable_constant"):
            assert not f.runs_user_code, f


def _catalogue_sources() -> dict[str, str]:
    """kind name -> the source column of the table in tripwire.catalogue's docstring."""
    lines = (tw.catalogue.__doc__ or "").splitlines()
    rules = [i for i, line in enumerate(lines) if line.startswith("=====")]
    header = lines[rules[0] + 1]
    args_at, source_at = header.index("args"), header.index("source")
    out: dict[str, str] = {}
    for line in lines[rules[1] + 1 : rules[2]]:
        names = line[:args_at].strip()
        if not names:
            continue  # a continuation line
        first = line[source_at:].split()[0]
        for name in names.split("/"):
            assert name not in out, f"{name} listed twice"
            out[name] = {"required": "required", "optional": "optional", "None": "absent"}[first]
    return out


def test_catalogue_docstring_lists_each_kind_with_the_table_source() -> None:
    sources = _catalogue_sources()
    assert sources == {k.name: f.source for k, f in tw.catalogue.KINDS.items()}


def test_format_doc_lists_each_stored_kind_and_the_never_stored_ones() -> None:
    text = (ROOT / "docs" / "format.md").read_text()
    section = text[text.index("### Guard records") : text.index("## References")]
    stored: set[str] = set()
    never: set[str] = set()
    for line in section.splitlines():
        if not line.startswith("| ") or line.startswith("| kind |"):
            continue
        first, payload = line.split("|")[1:3]
        names = set(re.findall(r"\b[A-Z][A-Z_]{2,}\b", first))
        (never if payload.strip().startswith("never stored") else stored).update(names)
    kinds = tw.catalogue.KINDS
    assert never == {k.name for k, f in kinds.items() if f.never_stored is not None}
    assert stored == {k.name for k, f in kinds.items() if f.never_stored is None}


@pytest.mark.parametrize("kind", ["DICT_VERSION", "LAMBDA"])
def test_never_stored_kinds_are_refused_with_the_table_reason(kind: str) -> None:
    b = tw.GuardBuilder({"d": {}})
    if kind == "DICT_VERSION":
        b.dict_version("L['d']")
    else:
        b.predicate(lambda v: True, source="L['d']")
    gs = b.build()
    with pytest.raises(tw.NotSerializable) as e:
        gs.to_bytes()
    reason = tw.catalogue.KINDS[GuardKind[kind]].never_stored
    assert reason and reason in str(e.value)


def test_relational_kinds_read_every_source_and_others_one() -> None:
    c: list = []
    b = tw.GuardBuilder({"a": [], "b": [], "c": c, "d": c})
    b.type_match("L['a']")
    b.no_alias("L['a']", "L['b']", "L['c']")
    b.alias("L['c']", "L['d']")
    gs = b.build()
    seen = {spec.kind.name: len(spec.sources) for spec in gs.guards}
    assert seen == {"TYPE_MATCH": 1, "NO_ALIAS": 3, "ALIAS": 2}
    for spec in gs.guards:
        assert tw.catalogue.KINDS[spec.kind].relational is (len(spec.sources) > 1)


def test_identity_operands_are_held_weakly() -> None:
    """The table's `identity` operands (TYPE_MATCH, ID_MATCH, CODE_MATCH, TENSOR_MATCH,
    ARRAY_MATCH) are held weakly: a built set does not keep the object alive."""
    assert {k.name for k, f in tw.catalogue.KINDS.items() if f.operand == "identity"} == {
        "TYPE_MATCH",
        "ID_MATCH",
        "CODE_MATCH",
        "TENSOR_MATCH",
        "ARRAY_MATCH",
    }

    class C:
        pass

    obj = C()
    b = tw.GuardBuilder({"o": obj})
    b.type_match("L['o']")
    b.id_match("L['o']")
    gs = b.build()
    o_ref, c_ref = weakref.ref(obj), weakref.ref(C)
    assert gs.check({"o": obj}) is True
    del obj, C, b
    gc.collect()
    assert o_ref() is None and c_ref() is None
    assert gs.check({"o": 1}) is False
