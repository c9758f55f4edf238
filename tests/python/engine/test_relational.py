"""ALIAS and NO_ALIAS: relational guards decided in C++ from the values of several sources.

The engine must answer as the reference on frames whose names share objects from a small pool (so
that inputs change aliasing often), through the fast pass and through the tree walk, for nested
sources that share prefixes, and for many sources (the hash-set path above 16). Hostile cases: a
value freed and replaced at the same address by user code during the walk, the same object many
times, re-entrant checks, collections everywhere.
"""

from __future__ import annotations

import gc
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reference
import tripwire as tw
from engine_switches import fast_pass
from gc_stress import Finalizer, examples, scaled


class Box:
    """An object with attributes, so sources can be nested (shared prefixes)."""

    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


POOL_SIZE = 5
NAMES = ("a", "b", "c", "d")


def make_frame(assign: list[int], nested: list[int], pool: list[Any]) -> dict[str, Any]:
    f = {name: pool[i] for name, i in zip(NAMES, assign, strict=True)}
    f["box"] = Box(p=pool[nested[0]], q=pool[nested[1]])
    f["seq"] = [pool[nested[2]], pool[nested[0]]]
    return f


SOURCES = [f"L['{n}']" for n in NAMES] + ["L['box'].p", "L['box'].q", "L['seq'][0]", "L['seq'][1]"]


def agree(gs: tw.GuardSet, f_locals: dict) -> bool:
    expected = reference.check(gs.guards, f_locals)
    for on in (True, False):
        with fast_pass(on):
            assert gs.check(f_locals) == expected, (on, f_locals)
    first = reference.first_failure(gs.guards, f_locals)
    why = gs.why_not(f_locals)
    assert (why is None) == expected
    if why is not None:
        assert first is not None and why.guard.index == first[0].index, (why.reason, first[0].describe())
        assert why.kind == first[0].kind.name
    return expected


_SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@settings(max_examples=examples(300), **_SETTINGS)
@given(
    st.lists(st.integers(0, POOL_SIZE - 1), min_size=4, max_size=4),
    st.lists(st.integers(0, POOL_SIZE - 1), min_size=3, max_size=3),
    st.data(),
)
def test_relational_guards_match_the_reference(
    assign: list[int], nested: list[int], data: st.DataObject
) -> None:
    pool = [Box(i=i) for i in range(POOL_SIZE)]
    example = make_frame(assign, nested, pool)
    values = {s: reference.fetch(tw.Source.parse(s), example) for s in SOURCES}
    b = tw.GuardBuilder(example)
    for _ in range(data.draw(st.integers(1, 4), label="guards")):
        kind = data.draw(st.sampled_from(["alias", "no_alias", "type_match"]))
        if kind == "alias":
            pairs = [(x, y) for x in SOURCES for y in SOURCES if x < y and values[x] is values[y]]
            if pairs:
                b.alias(*data.draw(st.sampled_from(pairs)))
        elif kind == "no_alias":
            by_obj: dict[int, str] = {}
            for s in data.draw(st.permutations(SOURCES)):
                by_obj.setdefault(id(values[s]), s)
            if len(by_obj) >= 2:
                chosen = data.draw(
                    st.lists(st.sampled_from(sorted(by_obj.values())), min_size=2, max_size=6, unique=True)
                )
                b.no_alias(*chosen)
        else:
            b.type_match(data.draw(st.sampled_from(SOURCES)))
    if not len(b):
        return
    gs = b.build()
    assert agree(gs, example)
    for _ in range(6):
        f = make_frame(
            data.draw(st.lists(st.integers(0, POOL_SIZE - 1), min_size=4, max_size=4)),
            data.draw(st.lists(st.integers(0, POOL_SIZE - 1), min_size=3, max_size=3)),
            pool,
        )
        if data.draw(st.integers(0, 5)) == 0:
            del f[data.draw(st.sampled_from(NAMES))]  # a source that cannot be read
        agree(gs, f)


def test_alias_and_no_alias_basics() -> None:
    x, y = object(), object()
    b = tw.GuardBuilder({"a": x, "b": x, "c": y})
    b.alias("L['a']", "L['b']")
    b.no_alias("L['a']", "L['c']")
    gs = b.build()
    assert gs._uses_fast_pass
    assert gs.check({"a": x, "b": x, "c": y})
    f = gs.why_not({"a": x, "b": y, "c": object()})
    assert f.kind == "ALIAS" and f.source == "L['a']"
    assert "ALIAS expected L['a'] is L['b'], got two objects" in f.reason
    f = gs.why_not({"a": x, "b": x, "c": x})
    assert f.kind == "NO_ALIAS"
    assert "L['a'] is L['c']" in f.reason
    assert f.actual == (x, x)
    assert "relational (decided once every source above was read)" in gs.explain()
    assert "ALIAS: L['a'] is L['b']" in gs.explain()


def test_builder_refuses_relations_that_cannot_hold() -> None:
    b = tw.GuardBuilder({"a": 1, "b": 2})
    with pytest.raises(tw.GuardBuildError, match="at least two"):
        b.no_alias("L['a']")
    with pytest.raises(tw.GuardBuildError, match="twice"):
        b.no_alias("L['a']", "L['b']", "L['a']")
    with pytest.raises(tw.GuardBuildError, match="itself"):
        b.alias("L['a']", "L['a']")
    b.no_alias("L['a']", "L['b']")
    b.alias("L['a']", "L['b']")
    with pytest.raises(tw.GuardBuildError, match="fails on the example"):
        b.build()


@pytest.mark.parametrize("n", [2, 3, 4, 5, 12, 16, 17, 64, 65, 200])
def test_no_alias_over_many_sources(n: int) -> None:
    """Pairwise up to 4 sources, a hash set of pointers beyond (on the stack up to 64 sources, in
    a per-thread buffer past that); the same object in any two places fails, in the fast pass
    and in the walk, as the reference decides."""
    objs = [object() for _ in range(n)]
    f_locals = {f"x{i}": o for i, o in enumerate(objs)}
    b = tw.GuardBuilder(f_locals)
    b.no_alias(*[f"L['x{i}']" for i in range(n)])
    gs = b.build()
    if n <= 17:
        pairs = [(i, j) for i in range(n) for j in range(n) if i != j]
    else:
        pairs = [(0, n - 1), (n - 1, 0), (n // 2, n // 2 - 1), (1, n - 2), (n - 1, n - 2)]
    for on in (True, False):
        with fast_pass(on):
            assert gs.check(f_locals)
            for i, j in pairs:
                g = dict(f_locals)
                g[f"x{i}"] = g[f"x{j}"]
                assert not gs.check(g), (i, j)
                assert not reference.check(gs.guards, g)
            same = {k: objs[0] for k in f_locals}  # the same object many times
            assert not gs.check(same)
    assert reference.check(gs.guards, f_locals)
    assert gs.why_not(same).kind == "NO_ALIAS"


def test_relational_sources_share_prefixes_with_other_guards() -> None:
    inner = Box(v=1)
    cfg = Box(a=inner, b=inner, c=Box(v=2))
    b = tw.GuardBuilder({"cfg": cfg})
    b.type_match("L['cfg'].a")
    b.alias("L['cfg'].a", "L['cfg'].b")
    b.no_alias("L['cfg'].a", "L['cfg'].c")
    gs = b.build()
    assert gs.node_count == 4  # L['cfg'], .a, .b, .c
    assert gs.check({"cfg": cfg})
    cfg.b = Box(v=1)  # an equal but distinct config: torch's `a is b` catches this
    assert not gs.check({"cfg": cfg})
    assert gs.why_not({"cfg": cfg}).kind == "ALIAS"


class Swapper:
    """A property that, when read, replaces ``holder.x`` (whose old object then dies, unless someone
    else holds it) and hands back a fresh object, which CPython may place at the freed address."""

    def __init__(self, holder: Box) -> None:
        self.holder = holder

    @property
    def value(self) -> Any:
        self.holder.x = Box()
        gc.collect()
        return Box()


def test_a_value_freed_during_the_walk_cannot_look_aliased() -> None:
    """ALIAS(L['h'].x, L['s'].value): the walk reads L['h'].x, then the property frees that object
    and returns a new one. Had the walk kept only the address, the new object could sit at it and
    the ALIAS would pass; the walk holds a reference, so the two are different objects."""
    h = Box(x=Box())
    b = tw.GuardBuilder({"h": h, "s": Box(value=h.x)})
    b.alias("L['h'].x", "L['s'].value")
    gs = b.build()
    for _ in range(scaled(50)):
        h.x = Box()
        f_locals = {"h": h, "s": Swapper(h)}
        assert gs.check(f_locals) is False
        h.x = Box()
        assert reference.check(gs.guards, {"h": h, "s": Swapper(h)}) is False


def test_reentrant_checks_keep_their_own_slots() -> None:
    """A property read by the walk checks the same set again on other locals (aliased: it must
    fail) after the outer check recorded its own values; the outer check must still pass."""
    x, y = Box(), Box()
    inner: list[bool] = []

    class Reenter:
        @property
        def v(self) -> Any:
            inner.append(gs.check({"a": x, "b": x, "r": Box(v=y)}))
            return y

    b = tw.GuardBuilder({"a": x, "b": y, "r": Box(v=y)})
    b.no_alias("L['a']", "L['b']")  # L['a'] and L['b'] are read (and recorded) before L['r']
    b.type_match("L['r'].v")
    gs = b.build()
    for on in (True, False):
        inner.clear()
        with fast_pass(on):
            assert gs.check({"a": x, "b": y, "r": Reenter()}) is True
        assert inner == [False]


def test_relational_guards_under_collections() -> None:
    """A finalizer mutates the frame's objects from a collection inside the check; the answer
    stays the reference's (a collection cannot run inside the fast pass: it allocates nothing)."""
    x, y = Box(), Box()
    f_locals = {"a": x, "b": y, "c": x}
    b = tw.GuardBuilder(f_locals)
    b.alias("L['a']", "L['c']")
    b.no_alias("L['a']", "L['b']")
    gs = b.build()
    fin = Finalizer()
    for k in range(scaled(40)):
        fin.arm(k % 3, lambda: f_locals.__setitem__("b", Box()))
        with fast_pass(k % 2 == 0):
            got = gs.check(f_locals)
        fin.disarm()
        assert got == reference.check(gs.guards, f_locals)


def test_an_alias_pair_fails_after_passing_checks_when_one_side_is_rebound() -> None:
    """The fast pass decides an ALIAS pair in line (torch's OBJECT_ALIASING and the importer's ALIAS
    of a model's shared modules). Its sources settle from unchanged dicts on the passing checks;
    rebinding either side (or both, to two equal objects) must then fail, as the reference and the
    walk say, and binding both to one new object must pass."""
    shared = object()
    a, b_ = {"F": shared, "n": 1}, {"F": shared}
    f = {"a": a, "b": b_}
    b = tw.GuardBuilder(f)
    b.type_match("L['a']")
    b.type_match("L['b']")
    b.dict_keys("L['a']")
    b.alias("L['a']['F']", "L['b']['F']")
    gs = b.build()
    assert gs._uses_fast_pass
    for _ in range(3):
        assert agree(gs, f)
    for rebind in (
        lambda: a.__setitem__("F", object()),
        lambda: b_.__setitem__("F", object()),
        lambda: (a.__setitem__("F", (1,)), b_.__setitem__("F", tuple([1]))),
    ):
        rebind()
        for _ in range(2):  # the first check after the change, and the claims it made
            assert not agree(gs, f)
        a["F"] = b_["F"] = shared
        assert agree(gs, f)
    new = object()
    a["F"] = b_["F"] = new
    assert agree(gs, f)


@pytest.mark.parametrize("kind", ["no_alias", "alias"])
def test_a_relation_failing_after_user_code_fails_the_check_and_touches_no_order(kind: str) -> None:
    """A Python probe (an ambient GLOBAL_STATE) runs user code before the sources are read, so the
    fast pass decides a failing relation itself instead of leaving it to the walk. A relational
    guard belongs to no node: with no node guard in the set, recording its failure in a node's
    guard order read a null array (a segfault); with node guards it counted the failure against
    the first node's. The check fails, and no node's order or counts move."""
    shared, other = object(), object()

    def probe() -> str:
        return "train"

    good = {"a": shared, "b": other} if kind == "no_alias" else {"a": shared, "b": shared}
    bad = {"a": shared, "b": shared} if kind == "no_alias" else {"a": shared, "b": other}
    for with_node_guards in (False, True):
        b = tw.GuardBuilder(good)
        if with_node_guards:
            b.type_match("L['a']")
            b.type_match("L['b']")
        getattr(b, kind)("L['a']", "L['b']")
        b.global_state(probe)
        gs = b.build()
        for on in (True, False):
            with fast_pass(on):
                assert gs.check(good)
                tree = gs._tree()
                for _ in range(3):
                    assert not gs.check(bad)
                assert gs._tree() == tree  # no node's fail counts or order moved
                assert gs.why_not(bad).kind == kind.upper()
                assert [f.kind for f in gs.failures(bad)] == [kind.upper()]
