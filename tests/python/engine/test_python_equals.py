"""EQUALS_MATCH with ``python_eq``: Python's own ``==`` (torch's EQUALS_MATCH), and its fast form.

The guard means ``v is c or (type(v) is type(c) and v == c)``. The engine decides it without user
code where the interpreter's comparisons alone decide it (python_equals.cpp) and asks Python's
``==`` otherwise. Property tests compare every evaluation path (the fast program, the tree walk,
the reference, a save/load round trip) with Python itself on values built to probe the edges of
``==``: ``True == 1``, int subclasses (honest, lying, raising, counting), floats against ints,
NaN (a NaN object is equal to itself inside a tuple, by identity, and unequal to another NaN),
``-0.0 == 0.0``, big ints, lists against tuples, unequal lengths, nesting, sets and frozensets of
str (decided by the fast form) against sets holding an int, a lying int or a removal's dummy.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gc_stress
import reference
import tripwire as tw
from tripwire import _core


class HonestInt(int):
    """An int subclass: its type is not int, so the fast form must leave it to Python."""

    __hash__ = int.__hash__


class Liar(int):
    """Equal to everything."""

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = int.__hash__


class Never(int):
    """Equal to nothing, itself included."""

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = int.__hash__


class Raises(int):
    def __eq__(self, other: object) -> bool:
        raise RuntimeError("no comparison today")

    __hash__ = int.__hash__


NAN = float("nan")

_atoms = st.one_of(
    st.integers(min_value=-3, max_value=3),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.booleans(),
    st.none(),
    st.sampled_from(["", "a", "b", "ab", "é", "a" * 40]),
    st.sampled_from([0.0, -0.0, 1.0, 1.5, math.inf, -math.inf]),
)


_strs = st.sampled_from(["a", "b", "ab", "é", "a" * 40])
_str_sets = st.one_of(st.sets(_strs, max_size=4), st.frozensets(_strs, max_size=4))


def _constants(max_leaves: int = 8) -> st.SearchStrategy:
    return st.recursive(
        st.one_of(_atoms, _str_sets),
        lambda inner: st.one_of(
            st.lists(inner, max_size=4).map(tuple),
            st.lists(inner, max_size=4),
        ),
        max_leaves=max_leaves,
    )


def _with_dummy(s: set) -> set:
    """The same elements, its table holding a removal's dummy."""
    out = set(s)
    out.add("removed")
    out.discard("removed")
    return out


def _twin(x: object, draw) -> object:
    """A value near ``x``: equal or not under Python's ==, of the same or another type."""
    choice = draw(st.integers(min_value=0, max_value=11))
    if type(x) in (tuple, list):
        items = [_twin(e, draw) if draw(st.booleans()) else e for e in x]
        if choice == 0 and items:
            items.pop()  # shorter
        elif choice == 1:
            items.append(draw(_atoms))  # longer
        kind = type(x)
        if choice == 2:
            kind = list if kind is tuple else tuple  # list vs tuple: unequal
        return kind(items)
    if type(x) in (set, frozenset):
        kind = type(x)
        return [
            x,
            kind(x | {"z"}),
            kind(sorted(x)[1:]),
            frozenset(x) if kind is set else set(x),
            kind(x | {1}),
            kind(x | {Liar(7)}),
            _with_dummy(set(x)) if kind is set else kind(x),
            kind(),
            tuple(x),
        ][choice % 9]
    if type(x) is bool:
        return [int(x), x, not x, HonestInt(x), float(x), Liar(7), Never(x)][choice % 7]
    if type(x) is int:
        return [
            x,
            x + 1,
            bool(x) if x in (0, 1) else x,
            HonestInt(x),
            float(x),
            Liar(x + 5),
            Never(x),
            str(x),
            None,
            (x,),
            int(str(x)),
        ][choice % 11]
    if type(x) is float:
        return [x, -x, NAN, float("nan"), int(x) if math.isfinite(x) else x, x + 1.0, Liar(0), str(x)][
            choice % 8
        ]
    if type(x) is str:
        return [x, x + "z", "".join(list(x)), None, 0, (x,)][choice % 6]
    return [None, 0, False, "", (), Liar(0)][choice % 6]


@st.composite
def cases(draw):
    c = draw(_constants())
    if type(c) not in (tuple, list):
        c = (c,)
    v = _twin(c, draw) if draw(st.integers(0, 5)) else draw(_constants())
    return c, v


def python_answer(v: object, c: object) -> bool | None:
    """torch's EQUALS_MATCH by Python itself; None when == raised."""
    if v is c:
        return True
    if type(v) is not type(c):
        return False
    try:
        return bool(v == c)
    except Exception:
        return None


def build(c: object) -> tw.GuardSet:
    b = tw.GuardBuilder({"x": c})
    b.equals("L['x']", python_eq=True)
    return b.build()


def answers(gs: tw.GuardSet, v: object) -> tuple:
    L = {"x": v}
    before = gs._fast_pass_count + gs._residue_pass_count
    fast = gs.check(L)
    fast_runs = gs._fast_pass_count + gs._residue_pass_count
    assert fast_runs == before + fast, "a passing check was not decided by the fast pass"
    # The same check with the fast pass switched off: the tree walk alone decides it. The counts
    # prove which path ran, so a switch that did nothing fails here rather than comparing the
    # fast pass with itself.
    was = _core.testing.set_fast_pass(False)
    try:
        walk = gs.check(L)
    finally:
        _core.testing.set_fast_pass(was)
    assert gs._fast_pass_count + gs._residue_pass_count == fast_runs, "the walk ran the fast pass"
    ref = reference.check(gs._specs, L, {})
    loaded = tw.GuardSet.from_bytes(gs.to_bytes()).check(L)
    return fast, walk, ref, loaded


@settings(max_examples=gc_stress.scaled(600, 10), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_python_eq_is_pythons_equality(case):
    c, v = case
    gs = build(c)
    want = python_answer(v, gs._specs[0].args[0])  # the engine's private copy of c
    got = answers(gs, v)
    # A raising == fails the guard (non-strict set), as in torch.
    assert got == (bool(want),) * 4, (c, v, want, got)


def _fast_decided(gs: tw.GuardSet, v: object) -> bool:
    """Whether the last check of `v` was decided by the fast form (no residue ran)."""
    gs.check({"x": v})
    return gs._last_fast_guards == 1


@pytest.mark.parametrize(
    "c, v, equal",
    [
        ((1, 2), (1, 2), True),
        ((1, 2), (True, 2), True),  # True == 1
        ((1, "a"), (1, "a"), True),
        ((1, (2, (3, None))), (1, (2, (3, None))), True),
        (([1], "x"), ([True], "x"), True),
        ((0.0,), (-0.0,), True),
        ((1.5, 2), (1.5, 2), True),
        ((1, 2), (1, 3), False),
        ((1, 2), (1, 2, 3), False),
        ((1, 2), (1,), False),
        ((1, 2), ("1", 2), False),
        ((1, None), (1, 0), False),
        (((1,),), ([1],), False),  # tuple vs list: unequal
        ((1.0,), (NAN,), False),
        ((2**80,), (2**80,), True),  # a big int: Python decides (not fast)
        (({"a", "b"},), ({"b", "a"},), True),  # sets of str: the fast form
        (({"a", "b"},), (frozenset({"a", "b"}),), True),  # set == frozenset, by elements
        (({"a", "b"},), ({"a"},), False),  # another size: unequal at once
        (({"a", "b"},), ({"a", "c"},), False),
        ((set(),), (set(),), True),
    ],
)
def test_fast_form_cases(c, v, equal):
    gs = build(c)
    assert gs.check({"x": v}) is equal
    assert python_answer(v, gs._specs[0].args[0]) is equal
    if 2**80 not in (c[0], v[0]) if isinstance(c, tuple) and c else True:
        assert _fast_decided(gs, v), (c, v)


def test_a_set_holding_a_non_str_goes_to_python() -> None:
    gs = build(({"a", "b"},))
    liar = Liar(7)
    assert gs.check({"x": ({"a", "b"},)}) and _fast_decided(gs, ({"a", "b"},))
    for v in (({"a", 1},), ({"a", liar},), (_with_dummy({"a", "b"}),)):
        want = python_answer(v, gs._specs[0].args[0])
        assert gs.check({"x": v}) is want
        if want:
            assert gs._last_fast_guards == 0


@pytest.mark.parametrize(
    "v",
    [
        (HonestInt(1), 2),  # an int subclass: its own type's ==
        (Liar(0), 2),  # lies: equal
        (Never(1), 2),  # lies: unequal
        (1.0, 2),  # float against int: Python compares the numbers
    ],
)
def test_user_and_mixed_elements_go_to_python(v):
    gs = build((1, 2))
    want = python_answer(v, gs._specs[0].args[0])
    assert gs.check({"x": v}) is want
    if want:  # the statistics of the last *passing* check
        assert gs._last_fast_guards == 0  # a residue: Python's == answered


def test_an_element_eq_runs_exactly_when_python_would_call_it():
    calls = []

    class Counting(int):
        def __eq__(self, other: object) -> bool:
            calls.append(other)
            return int(self) == other

        __hash__ = int.__hash__

    gs = build((1, 2, 3))
    assert gs.check({"x": (1, Counting(2), 3)}) is True and calls == [2]
    calls.clear()
    assert gs.check({"x": (9, Counting(2), 3)}) is False and calls == []  # 9 != 1 decided first
    calls.clear()
    assert gs.check({"x": (1, Counting(5), 3)}) is False and calls == [2]


def test_first_undecided_element_stops_the_scan():
    """(Raises(1), 5) against (1, 2): the second pair is unequal, but Python compares the first
    first and raises; the fast form must not skip to the unequal pair (a strict set raises)."""
    b = tw.GuardBuilder({"x": (1, 2)})
    b.equals("L['x']", python_eq=True)
    strict = b.build(strict=True)
    with pytest.raises(tw.GuardEvalError):
        strict.check({"x": (Raises(1), 5)})
    assert build((1, 2)).check({"x": (Raises(1), 5)}) is False
    # An unequal pair before the raising one decides, as in Python.
    assert strict.check({"x": (7, Raises(2))}) is False


def test_nan_identity_and_distinct_nans():
    """Inside a tuple, the same NaN object is equal to itself (identity first); another is not."""
    c = (NAN, 1)
    gs = build(c)
    mine = gs._specs[0].args[0][0]  # the engine's own NaN object
    assert gs.check({"x": (mine, 1)}) is True and python_answer((mine, 1), gs._specs[0].args[0])
    assert gs.check({"x": (float("nan"), 1)}) is False


def test_type_must_be_exact_at_the_top():
    class T(tuple):
        pass

    gs = build((1, 2))
    assert gs.check({"x": T((1, 2))}) is False  # torch: type(v) is type(c) first
    assert gs.check({"x": [1, 2]}) is False


def test_eq_replaced_after_build_is_asked():
    """A class whose __eq__ is replaced after the guard was built: its instances were never on
    the fast path (not an exact int), so the new __eq__ answers."""

    class Flip(int):
        __hash__ = int.__hash__

    gs = build((1, 2))
    v = (Flip(1), 2)
    assert gs.check({"x": v}) is True
    Flip.__eq__ = lambda self, other: False
    assert gs.check({"x": v}) is False
    del Flip.__eq__
    assert gs.check({"x": v}) is True


def test_class_assignment_on_an_element():
    """__class__ assignment (allowed between heap types of the same layout) changes which __eq__
    runs; an exact int's class cannot be reassigned, so the fast form's exact types stay exact."""

    class A:
        def __eq__(self, other: object) -> bool:
            return other == 1

        __hash__ = object.__hash__

    class B:
        def __eq__(self, other: object) -> bool:
            return False

        __hash__ = object.__hash__

    gs = build((1, 2))
    e = A()
    v = (e, 2)
    assert gs.check({"x": v}) is True
    e.__class__ = B
    assert gs.check({"x": v}) is False
    with pytest.raises(TypeError):
        (1).__class__ = A  # type: ignore[assignment]


def test_skip_does_not_stand_in_for_a_user_eq():
    """Under a stamped dict, the skip may settle an EQUALS_MATCH python_eq value only after the
    fast form proved it: a value whose element's __eq__ answered is re-asked on every check."""

    class Toggle(int):
        answer = True

        def __eq__(self, other: object) -> bool:
            return Toggle.answer

        __hash__ = int.__hash__

    class Mod:
        pass

    m = Mod()
    m.pad = (1, 1)
    b = tw.GuardBuilder({"m": m})
    b.type_match("L['m']")
    b.equals("L['m'].__dict__['pad']", python_eq=True)
    gs = b.build()
    L = {"m": m}
    for _ in range(3):
        assert gs.check(L)
    m.__dict__["pad"] = (Toggle(1), 1)
    assert gs.check(L) and gs.check(L)
    Toggle.answer = False  # no dict write: only re-asking __eq__ sees it
    assert gs.check(L) is False
    assert reference.check(gs._specs, L, {}) is False


def test_serialized_flag_round_trips():
    gs = build((1, (2, "a")))
    data = gs.to_bytes()
    loaded = tw.GuardSet.from_bytes(data)
    assert loaded._specs[0].args == ((1, (2, "a")), True)
    assert loaded.check({"x": (True, (2, "a"))}) is True
    plain = tw.GuardBuilder({"x": (1, 2)})
    plain.equals("L['x']")
    assert tw.GuardSet.from_bytes(plain.build().to_bytes())._specs[0].args == ((1, 2),)


def test_eq_that_mutates_and_reenters():
    """An element's __eq__ (a residue) that deletes the value from the dict it was read from,
    collects, and runs a nested check of the same set: no crash, no error left set, and the
    outer check decides on the objects it read (as Python's == would, on the held value)."""

    class Mod:
        pass

    m = Mod()
    state = {"nested": None}

    class Evil(int):
        def __eq__(self, other: object) -> bool:
            m.__dict__.pop("pad", None)  # the tuple being compared loses its last other owner
            import gc

            gc.collect()
            if state["nested"] is None:
                state["nested"] = gs.check({"m": m})  # pad is gone: the nested check fails
            return int(self) == other

        __hash__ = int.__hash__

    m.pad = (1, 2)
    b = tw.GuardBuilder({"m": m})
    b.equals("L['m'].__dict__['pad']", python_eq=True)
    gs = b.build()
    assert gs.check({"m": m})
    m.pad = (Evil(1), 2)
    assert gs.check({"m": m}) is True  # decided on the held tuple: (Evil(1), 2) == (1, 2)
    assert state["nested"] is False
    assert gs.check({"m": m}) is False  # pad is gone now
