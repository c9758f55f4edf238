"""Soundness under re-entrancy: garbage collections, NaN constants and cache mutation (issue 7).

Each test reproduces one finding of the adversarial review on the engine as it was (commit
9a09400) and asserts the right answer. Those marked "(ASan)" read freed memory there without a
wrong answer in a release build; they fail under scripts/asan-tests, which CI runs on this file.
The rule they enforce is in docs/cpp.md ("Regions without user code").
"""

from __future__ import annotations

import enum
import gc
import math
import pathlib
import subprocess
import sys
import textwrap
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reference
import tripwire as tw
from gc_stress import Finalizer, collecting_often, drain_free_lists, examples, hit_every_allocation
from tripwire import _core

# -- 1. a collection inside a region that claims "no user code" ----------------------------------


def _equals_set(example):
    b = tw.GuardBuilder({"h": {"s": example}})
    b.equals("L['h']['s']")
    return b.build()


def test_collection_inside_set_equals_never_compares_freed_memory():
    # The finalizer frees the set under comparison and allocates a matching one, which may land
    # at the freed address. The value checked never matches, so any True is a false pass.
    gs = _equals_set({1, 2, 3, 4, 5, 6, 7})
    state = {}
    junk = []

    def finalizer():
        state.get("holder", {}).clear()  # frees the set being compared
        junk.append({1, 2, 3, 4, 5, 6, 7})

    def run():
        holder = {"s": {1, 2, 3, 4, 5, 6, 99}}
        state["holder"] = holder
        return gs.check({"h": holder})

    results = [r for r, _ in hit_every_allocation(run, finalizer, ks=range(4), phases=range(3))]
    assert results and not any(results)


def test_collection_kills_an_id_matched_object_mid_check_never_passes():
    # The finalizer kills the ID_MATCH'd object and puts a new object (often at the same address)
    # where the check reads it next. The value checked is never the guarded object (it is absent
    # until the finalizer runs, then a new one), so every True is a false pass.
    class O:
        pass

    def build(o):
        b = tw.GuardBuilder({"s": {1, 2, 3}, "o": o})
        b.equals("L['s']")
        b.id_match("L['o']")
        return b.build()

    results = []
    for _ in range(30):
        box = [O()]
        gs = build(box[0])
        loc = {"s": {3, 1, 2}}

        def finalizer(box=box, loc=loc):
            box.clear()
            loc["o"] = O()

        for r, _fired in hit_every_allocation(lambda gs=gs, loc=loc: gs.check(loc), finalizer, ks=(0, 1)):
            results.append(r)
            if gs.invalid:
                assert gs.why_not(loc) is not None
    assert results and not any(results)


def test_fast_pass_rereads_invalid_after_running():
    # Deterministic form of the rule: a set whose identity-held object died never passes, even
    # when the fast pass alone would (a new object at the old address).
    class O:
        pass

    def build():
        o = O()
        b = tw.GuardBuilder({"o": o})
        b.id_match("L['o']")
        return b.build(), id(o)

    gs, addr = build()
    gc.collect()
    assert gs.invalid
    for _ in range(200):
        o = O()
        assert gs.check({"o": o}) is False
        if id(o) == addr:
            break


def _run_child(body: str) -> str:
    """Run ``body`` in a child Python (same environment, tests/ on sys.path) so that a crash on
    a broken engine fails the calling test instead of ending the whole session. Returns stdout."""
    tests_dir = str(pathlib.Path(__file__).parents[1] / "support")
    code = f"import sys; sys.path.insert(0, {tests_dir!r})\n" + textwrap.dedent(body)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"child exited with {r.returncode}:\n{r.stderr[-4000:]}"
    return r.stdout


def test_collection_clears_the_cache_during_a_specialize_hit():
    # Was a segfault: Cache::lookup_most_recent held a raw entry pointer across an EQUALS_MATCH
    # on a set, which allocated; a finalizer cleared the cache and freed the entry.
    out = _run_child(
        """
        import tripwire as tw
        from gc_stress import hit_every_allocation

        @tw.specialize()
        def f(s, n):
            return n

        f({1, 2, 3}, 1)
        calls = 0
        for _ in range(50):
            for r, fired in hit_every_allocation(lambda: f({3, 2, 1}, 1), f.cache.clear):
                assert r == 1
                calls += 1
                if len(f.cache) == 0:
                    f({1, 2, 3}, 1)
        print("calls", calls)
        """
    )
    assert out.strip() == "calls 400"


def test_dict_step_never_writes_into_a_freed_object():
    # `L['o'].__dict__` creates the instance dict on first access. It allocated while `o` was
    # borrowed: a finalizer freed `o`, a new object took its address, and the new dict was
    # written into the new object (which then showed the dead object's attributes, or crashed).
    out = _run_child(
        """
        import tripwire as tw
        from gc_stress import hit_every_allocation

        class O:
            def __init__(self, a):
                self.a = a
                self.b = 2

        b = tw.GuardBuilder({"o": O(0)})
        b.type_match("L['o'].__dict__")
        gs = b.build()
        survivors, loc = [], {}

        def finalizer():
            loc.clear()  # the only reference to the object being fetched
            survivors.extend(O("fresh") for _ in range(4))

        for _ in range(20):
            for r, _fired in hit_every_allocation(lambda: gs.check(loc), finalizer, setup=lambda: loc.update(o=O("old"))):
                assert r is True or not loc  # False only when the finalizer removed `o` first
        assert survivors
        assert all(s.a == "fresh" and s.__dict__ == {"a": "fresh", "b": 2} for s in survivors)
        print("survivors", len(survivors))
        """
    )
    assert out.startswith("survivors ")


def test_regions_are_checked_in_debug_builds():
    # Debug builds (scripts/asan-tests) abort when a collection runs inside a region that
    # promises no user code; this is what makes GC-stress runs catch a silent allocation.
    if not _core.testing.CHECKS_REGIONS:
        pytest.skip("release build: regions are not checked (scripts/asan-tests builds Debug)")
    gs = _equals_set({1, 2, 3})
    for r, _ in hit_every_allocation(lambda: gs.check({"h": {"s": {3, 2, 1}}}), lambda: None, ks=range(3)):
        assert r is True


# -- 2. one-to-one NaN matching ----------------------------------------------------------------


def _nans(k):
    return [float("nan") for _ in range(k)]


def _engine_equals(c, v):
    b = tw.GuardBuilder({"x": c})
    b.equals("L['x']")
    gs = b.build()
    return gs.check({"x": v}), reference.check(gs.guards, {"x": v})


n1, n2, n3, n4 = _nans(4)

NAN_CASES = [
    # (constant, value, expected)
    ({n1, n2, 1}, {n3, 1, 2}, False),
    ({n1, n2, 1}, {n3, n4, 1}, True),
    (frozenset({n1, n2, 1}), frozenset({n3, 1, 2}), False),
    (frozenset({n1, n2, 1}), frozenset({n4, n3, 1}), True),
    ({1: "x", n1: 5, n2: 5}, {n3: 5, 1: "x", "zzz": 5}, False),
    ({1: "x", n1: 5, n2: 5}, {n3: 5, 1: "x", n4: 5}, True),
    ({n1: 1, n2: 2}, {n3: 2, n4: 1}, True),  # the same keys in another pairing
    ({n1: 1, n2: 2}, {n3: 2, n4: 2}, False),
    ({(n1,), (n2,), 1}, {(n3,), 1, 2}, False),
    ({(n1,), (n2,), 1}, {(n3,), (n4,), 1}, True),
    ([{n1, n2, 1}], [{n3, 1, 2}], False),
    ((frozenset({n1, n2}),), (frozenset({n3, 7}),), False),
    ({n1, 0.0}, {n2, -0.0}, False),  # the sign of a zero is compared
    ({n1, 0.0}, {n2, 0.0}, True),
    ({n1}, {1.5}, False),
    ({complex(n1, 1), complex(n2, 1)}, {complex(n3, 1), complex(2, 1)}, False),
]


@pytest.mark.parametrize("c,v,expected", NAN_CASES)
def test_equals_matches_nans_one_to_one(c, v, expected):
    assert _engine_equals(c, v) == (expected, expected)


@pytest.mark.parametrize("fast", [True, False])
def test_dict_keys_unordered_matches_nans_one_to_one(fast):
    was = _core.testing.set_fast_pass(fast)
    try:
        b = tw.GuardBuilder({"x": {n1: 1, n2: 2, 1: 3}})
        b.dict_keys("L['x']", ordered=False)
        gs = b.build()
        for v, expected in [
            ({n3: 1, 1: 3, "z": 2}, False),
            ({n3: 1, 1: 3, n4: 2}, True),
            ({1: 0, n3: 0, 2: 0}, False),
        ]:
            assert gs.check({"x": v}) is expected
            assert reference.check(gs.guards, {"x": v}) is expected
    finally:
        _core.testing.set_fast_pass(was)


def test_specialize_set_argument_with_nans():
    # Reached through @specialize: the inferred EQUALS on a set argument.
    @tw.specialize()
    def f(s):
        return len(s)

    f({n1, n2, 1})
    assert len(f.cache) == 1
    f({n3, 1, 2})
    assert len(f.cache) == 2  # a miss, not a false hit


# A third oracle for the property test: count the elements of each equals_match class directly.
_atoms = st.one_of(
    st.integers(-3, 3),
    st.sampled_from(["a", "b", ""]),
    st.sampled_from([0.0, -0.0, 1.5, math.inf]),
    st.just("NaN"),  # replaced by a fresh NaN object
    st.tuples(st.just("NaN")),
    st.tuples(st.integers(0, 2), st.just("NaN")),
)


def _realise(atom):
    if atom == "NaN":
        return float("nan")
    if type(atom) is tuple:
        return tuple(_realise(a) for a in atom)
    return atom


def _class_of(x):
    """The equals_match class of an atom, computed by hand."""
    if type(x) is float and x != x:
        return ("nan",)
    if type(x) is float:
        return (float, x, math.copysign(1.0, x))  # 0.0 and -0.0 are two classes
    if type(x) is tuple:
        return (tuple, tuple(_class_of(e) for e in x))
    return (type(x), x)


def _multiset(xs):
    out = {}
    for x in xs:
        k = _class_of(x)
        out[k] = out.get(k, 0) + 1
    return out


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(_atoms, max_size=8),
    st.lists(_atoms, max_size=8),
    st.sampled_from([set, frozenset, dict, "keys"]),
)
def test_containers_with_several_nans_match_as_multisets(cs, vs, kind):
    c_elems = [_realise(a) for a in cs]
    v_elems = [_realise(a) for a in vs]
    c, v = set(c_elems), set(v_elems)
    expected = _multiset(c) == _multiset(v)
    if kind in (set, frozenset):
        c, v = kind(c), kind(v)
        assert _engine_equals(c, v) == (expected, expected)
    elif kind is dict:
        cd = {x: 0 for x in c}
        vd = {x: 0 for x in v}
        assert _engine_equals(cd, vd) == (expected, expected)
    else:
        b = tw.GuardBuilder({"d": {x: 0 for x in c}})
        b.dict_keys("L['d']", ordered=False)
        gs = b.build()
        assert gs.check({"d": {x: 0 for x in v}}) is expected
        assert reference.check(gs.guards, {"d": {x: 0 for x in v}}) is expected


def test_constant_depth_is_bounded_and_agreed():
    assert reference.MAX_CONSTANT_DEPTH == _core.MAX_CONSTANT_DEPTH
    deep = 0
    for _ in range(_core.MAX_CONSTANT_DEPTH):
        deep = [deep]
    b = tw.GuardBuilder({"x": deep})
    b.equals("L['x']")  # exactly at the bound: accepted
    gs = b.build()
    assert gs.check({"x": deep}) and gs.check({"x": [deep[0]]})
    with pytest.raises(tw.GuardBuildError, match="nested at most"):
        tw.GuardBuilder({"x": [deep]}).equals("L['x']")
    cyclic = []
    cyclic.append(cyclic)
    with pytest.raises(tw.GuardBuildError):
        tw.GuardBuilder({"x": cyclic}).equals("L['x']")
    # A value nested far deeper than any constant is just a value that does not match.
    very = 0
    for _ in range(100_000):
        very = (very,)
    assert gs.check({"x": very}) is False
    assert reference.check(gs.guards, {"x": very}) is False


# -- 3. the dispatch index fetch runs user code that rebuilds the index (ASan) --------------------


class _CollidingKey:
    """A dict key whose hash collides with a str key; its __eq__ runs an action once armed."""

    def __init__(self, text):
        self.h = hash(text)
        self.action = None  # armed after the dict holding it is built (building compares keys)

    def __hash__(self):
        return self.h

    def __eq__(self, other):
        action, self.action = self.action, None
        if action is not None:
            action()
        return False


def test_index_fetch_survives_an_index_rebuild_from_user_code():
    cache = tw.Cache()

    def entry(mode, payload):
        b = tw.GuardBuilder({"o": {"cfg": {"mode": mode}}})
        b.equals("L['o']['cfg']['mode']")
        cache.insert(b.build(), payload)

    for m in "abc":
        entry(m, m)
    assert cache.lookup({"o": {"cfg": {"mode": "a"}}}) == "a"
    assert cache.index_source == "L['o']['cfg']['mode']"

    def rebuild():
        for i in range(3):
            entry(f"z{i}", f"p{i}")
        assert cache.lookup({"o": {"cfg": {"mode": "zz"}}}) is None  # rebuilds the index

    key = _CollidingKey("cfg")
    o = {key: 1, "cfg": {"mode": "b"}}
    key.action = rebuild
    assert cache.lookup({"o": o}) == "b"
    assert key.action is None  # the rebuild ran inside the index fetch
    assert len(cache) == 6
    assert cache.lookup({"o": {"cfg": {"mode": "z1"}}}) == "p1"


# -- 4. the probe snapshot memo outlives the entry it was read from (ASan) ------------------------


def test_snapshot_memo_survives_its_entry_being_removed_mid_lookup():
    cache = tw.Cache(probes=[lambda: 1])

    class O:
        pass

    class Killer:
        armed = False

        @property
        def p(self):
            if Killer.armed:
                Killer.armed = False
                box.clear()
                gc.collect()
                assert len(cache) == 1  # purges the entry being checked
            return 1

    box = [O()]
    k = Killer()
    b = tw.GuardBuilder({"z": 5})
    b.equals("L['z']")
    cache.insert(b.build(), "B")

    def build_a():
        b = tw.GuardBuilder({"o": box[0], "k": k})
        b.equals("L['k'].p")
        b.id_match("L['o']")
        return b.build()

    cache.insert(build_a(), "A")
    assert cache.lookup({"o": box[0], "k": k}) == "A"
    Killer.armed = True
    assert cache.lookup({"o": None, "k": k, "z": 5}) == "B"


# -- 5. a dict subclass as f_locals ----------------------------------------------------------------


def test_locals_dict_subclass_is_read_from_its_storage():
    class Lying(dict):
        def __getitem__(self, key):
            return "lie"

        def __missing__(self, key):
            return "made up"

    b = tw.GuardBuilder({"x": 3})
    b.equals("L['x']")
    gs = b.build()
    for fast in (True, False):
        was = _core.testing.set_fast_pass(fast)
        try:
            assert gs.check(Lying(x=3)) is True  # the stored 3, not "lie"
            assert gs.check(Lying(y=3)) is False  # no __missing__
            assert reference.check(gs.guards, Lying(x=3)) is True
            assert reference.check(gs.guards, Lying(y=3)) is False
        finally:
            _core.testing.set_fast_pass(was)


# -- 6. Failure.reason is one readable line ---------------------------------------------------------


def test_failure_reason_is_one_short_line():
    class Tensorish:
        def __repr__(self):
            return "tensor([[1., 2.],\n        [3., 4.]])" + " " * 10 + "x" * 5000

    b = tw.GuardBuilder({"d": {"a": 1}})
    b.dict_contains("L['d']", "a")
    gs = b.build()
    value = {f"k{i}": Tensorish() for i in range(50)}
    f = gs.why_not({"d": value})
    assert "\n" not in f.reason
    assert len(f.reason) <= 300
    assert f.actual is value  # the full value stays on the record
    b = tw.GuardBuilder({"s": "x"})
    b.equals("L['s']")
    f = b.build().why_not({"s": "line one\nline two" * 100})
    assert "\n" not in f.reason and len(f.reason) <= 300


# -- the harness itself ---------------------------------------------------------------------------


def test_the_harness_really_collects_inside_allocating_calls():
    # Without this, every test above could pass by never firing its finalizer.
    fin = Finalizer()
    fired = []
    drain_free_lists()
    fin.arm(0, lambda: fired.append(True))
    with collecting_often():
        [[] for _ in range(10)]  # GC allocations
    fin.disarm()
    assert fired == [True]


# -- found by the adversarial review of this change (docs/sanitizers.md) --------------------------


def _new_class_at(addr, tries=200_000):
    keep = []
    for i in range(tries):

        class N:
            pass

        if id(N) == addr:
            return N, keep
        if i % 2:
            keep.append(N)
    return None, keep


def test_set_collected_with_its_guarded_class_and_resurrected_is_invalid():
    # The set and the class it names die in one collection; a finalizer resurrects the set. The
    # weak reference was reported to the collector as the set's, so the collector cleared it
    # without its callback: the set stayed valid and a new class at the old address passed.
    saved = []

    def make():
        class T:
            pass

        b = tw.GuardBuilder({"x": T()})
        b.type_match("L['x']")
        gs = b.build()

        class Keeper:
            def __del__(self):
                saved.append(self.gs)  # resurrect the guard set

        k = Keeper()
        k.gs = gs
        T.k = k  # T -> k -> gs, and gs -> T only weakly
        return id(T)

    addr = make()
    gc.collect()
    gs = saved[0]
    assert gs.invalid
    N, _keep = _new_class_at(addr)
    if N is not None:
        assert gs.check({"x": N()}) is False
        assert gs.why_not({"x": N()}) is not None


def test_specialize_resurrected_with_its_guarded_class_never_hits_a_new_class():
    saved = []
    compiled_for = []

    def make():
        class Old:
            pass

        def compiler(fn, example_args, builder):
            compiled_for.append(type(example_args["obj"]).__name__)
            return lambda obj: "compiled"

        @tw.specialize(compiler=compiler)
        def f(obj):
            return "uncompiled"

        f(Old())

        class Keeper:
            def __del__(self):
                saved.append(self.f)

        k = Keeper()
        k.f = f
        Old.k = k
        return id(Old)

    addr = make()
    gc.collect()
    f = saved[0]
    assert [e.valid for e in f.cache] in ([], [False])
    New, _keep = _new_class_at(addr)
    if New is not None:
        f(New())
        assert compiled_for == ["Old", "N"]  # a miss and a compile for the new class, not a hit


def test_enum_constant_collected_with_a_resurrected_set_is_never_read():
    saved = []

    def make():
        class Color(enum.Enum):
            RED = 1

        b = tw.GuardBuilder({"x": Color.RED})
        b.equals("L['x']")
        gs = b.build()

        class Keeper:
            def __del__(self):
                saved.append(self.gs)

        k = Keeper()
        k.gs = gs
        Color.k = k

    make()
    gc.collect()
    gs = saved[0]
    assert gs.invalid  # so check() never touches the freed member (ASan read it before)
    junk = [object() for _ in range(1000)]
    assert gs.check({"x": 1}) is False
    assert "died" in gs.why_not({"x": 1}).reason
    del junk


class _KeyCollidingWith:
    """A class-namespace key that collides with a name and, once armed, changes a class."""

    def __init__(self, text, action):
        self.h = hash(text)
        self.action = action
        self.armed = False

    def __hash__(self):
        return self.h

    def __eq__(self, other):
        if self.armed:
            self.armed = False
            self.action()
        return False


def test_inline_cache_is_not_filled_from_a_lookup_that_ran_user_code():
    # A colliding key in the class namespace ran user code during the attribute cache's type
    # lookups and added a property for the name: the cache read the instance dict under the new
    # version, which the property now shadows.
    def add_property():
        C.x = property(lambda self: 2)

    key = _KeyCollidingWith("__getattribute__", add_property)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # 3.13: "non-string key in the __dict__"

        class C:
            locals()[key] = None

            def __getattr__(self, name):
                raise AttributeError(name)

    o = C()
    o.x = 1
    b = tw.GuardBuilder({"o": o})
    b.equals("L['o'].x")
    gs = b.build()
    assert gs.check({"o": o})
    C.unrelated = 0  # a new version: the next check refills the cache
    key.armed = True
    r = gs.check({"o": o})
    assert o.x == 2
    assert r is False and reference.check(gs.guards, {"o": o}) is False


def test_inline_cache_does_not_keep_a_stale_type_cache_answer():
    # User code run inside a base class's namespace during the lookup of `x` itself: CPython's
    # type cache keeps "no x" under the class's new version until that entry is evicted; the
    # inline cache must not make that answer permanent.
    def add_property():
        C.x = property(lambda self: 2)

    key = _KeyCollidingWith("x", add_property)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # 3.13: "non-string key in the __dict__"

        class B:
            locals()[key] = None

    class C(B):
        pass

    o = C()
    o.x = 1
    b = tw.GuardBuilder({"o": o})
    b.equals("L['o'].x")
    gs = b.build()
    assert gs.check({"o": o})
    C.unrelated = 0
    key.armed = True
    gs.check({"o": o})  # refills; CPython's own answer may still be stale here
    sys._clear_type_cache()
    assert o.x == 2
    for _ in range(3):
        assert gs.check({"o": o}) is False
        assert reference.check(gs.guards, {"o": o}) is False


def test_cache_probe_values_are_snapshotted_not_shared():
    config = {"mode": "fast", "flags": [1]}
    cache = tw.Cache(probes=[lambda: config])
    b = tw.GuardBuilder({"x": 1})
    b.equals("L['x']")
    cache.insert(b.build(), "compiled-for-fast", name="e0")
    assert cache.lookup({"x": 1}) == "compiled-for-fast"
    config["mode"] = "slow"
    config["flags"].append(2)
    assert cache.lookup({"x": 1}) is None
    (f,) = cache.why_not({"x": 1})
    assert f is not None and f.kind == "GLOBAL_STATE"


def test_cache_probe_must_return_a_constant():
    class Config:
        mode = "fast"

    cache = tw.Cache(probes=[lambda: Config()])
    b = tw.GuardBuilder({"x": 1})
    b.equals("L['x']")
    with pytest.raises(TypeError, match="not a constant"):
        cache.insert(b.build(), "p")
    assert len(cache) == 0


def test_signed_zero_keys_are_different_sources():
    class SignedMap:
        def __init__(self, pos, neg):
            self.pos, self.neg = pos, neg

        def __getitem__(self, k):
            return self.neg if math.copysign(1.0, k) < 0 else self.pos

    b = tw.GuardBuilder({"m": SignedMap("a", "a")})
    b.equals("L['m'][0.0]")
    b.equals("L['m'][-0.0]")
    gs = b.build()
    assert gs.node_count == 3  # L['m'], and one node per key
    f_locals = {"m": SignedMap("a", "b")}
    assert gs.check(f_locals) is False
    assert reference.check(gs.guards, f_locals) is False
    assert gs.why_not(f_locals).source == "L['m'][-0.0]"
    assert tw.Source.parse("L['m'][0.0]") != tw.Source.parse("L['m'][-0.0]")


def test_dict_step_on_a_class_that_defines_dict_fails_in_both_evaluators():
    class A:
        __dict__ = property(lambda self: {"fake": 1})

    a = A()
    a.x = 1
    b = tw.GuardBuilder({"a": a, "o": NSLike()})
    b.dict_keys("L['o'].__dict__")
    b.dict_keys("L['a'].__dict__", keys=["x"])
    gs = tw.GuardSet(b.guards)
    for fast in (True, False):
        was = _core.testing.set_fast_pass(fast)
        try:
            assert gs.check({"a": a, "o": NSLike()}) is False
            assert reference.check(gs.guards, {"a": a, "o": NSLike()}) is False
            assert gs.why_not({"a": a, "o": NSLike()}).source == "L['a'].__dict__"
        finally:
            _core.testing.set_fast_pass(was)


class NSLike:
    def __init__(self):
        self.k = 1


def test_a_payload_holding_its_own_entry_view_is_collected():
    import weakref

    class Payload:
        pass

    def make():
        c = tw.Cache()
        b = tw.GuardBuilder({"x": 1})
        b.equals("L['x']")
        p = Payload()
        c.insert(b.build(), p, name="e")
        p.entry = c.lookup_entry({"x": 1})  # payload -> view -> entry -> payload
        return weakref.ref(p), weakref.ref(c)

    wp, wc = make()
    for _ in range(3):
        gc.collect()
    assert wc() is None and wp() is None


# -- relations_from_torch and its parse memos ------------------------------------------------


def test_relations_from_torch_survives_its_memos_emptied_and_reentered_mid_call():
    # A finalizer empties the parse memos and parses again inside every allocation of a cold
    # call: the result is still the text's relations, a new list.
    text = "(L['x'].size()[0] // 2) <= L['y'].size()[0]  # why"
    expected = [tw.shapes.parse(text)]

    def cold():
        tw.shapes.clear_memos()
        tw.source.clear_memos()

    def action():
        cold()
        assert tw.shapes.relations_from_torch("L['q'].stride()[1] + 1 > 2") == [
            tw.shapes.parse("L['q'].stride()[1] + 1 > 2")
        ]

    fired_any = False
    for warm in (False, True):
        for result, fired in hit_every_allocation(
            lambda: tw.shapes.relations_from_torch(text), action, setup=None if warm else cold, ks=range(6)
        ):
            fired_any = fired_any or fired
            assert type(result) is list and result == expected
            assert all(type(rel) is tw.shapes.Relation for rel in result)
    assert fired_any
