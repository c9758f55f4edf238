"""An invalid set never passes: every entry point re-reads `invalid` after the last thing it does
that can run user code (issue 25, item 12).

The attack: user code run during a check (a guard's own code, a lying ``__eq__``, or a finalizer
run by a garbage collection or by dropping the last reference to something) kills an object an
ID_MATCH names, so that the set's weakref callback marks it invalid, and puts a new object at the
dead one's address where the check reads it. A raw identity comparison then holds; only the flag
tells. Each test runs the attack against one entry point (GuardSet.check in both evaluation
modes, why_not, Cache.lookup and its dispatch index, @specialize's FastDispatch, the frame hook's
per-code cache) or one other place a check can observe the flag flip (relational guards, SHAPE
symbols, DICT_VERSION, inline caches, TYPE_MATCH and CODE_MATCH objects), and asserts a failure or
a miss. Each counts how often the new object really landed at the old address, so that a run in
which the attack never bit cannot pass silently.
"""

from __future__ import annotations

import gc
import sys
import types

import pytest

import tripwire as tw
from engine_switches import fast_pass
from gc_stress import Finalizer, drain_free_lists, scaled
from tripwire import frame as twf

ROUNDS = scaled(40, 4)
GC_ROUNDS = scaled(10, 2)  # rounds that run a full collection each (slow with torch imported)


@pytest.fixture(params=["fast", "walk"])
def mode(request):
    """Both evaluation modes: the fast program (with residues) and the tree walk alone."""
    with fast_pass(request.param == "fast"):
        yield request.param


class O:
    pass


class Boom:
    """Runs ``act`` when freed (the last reference dropped, or collected)."""

    def __init__(self, act):
        self.act = act

    def __del__(self):
        self.act()


def replace_at_same_address(container, key, make=O, tries=200) -> bool:
    """Drop ``container[key]`` (its last reference: the object dies) and store a new object made
    by ``make``, at the dead one's address when the allocator gives it within ``tries``. Returns
    whether it did."""
    addr = id(container[key])
    del container[key]
    keep = []
    new = make()
    while id(new) != addr and len(keep) < tries:
        keep.append(new)
        new = make()
    container[key] = new
    return id(new) == addr


# -- GuardSet.check ------------------------------------------------------------------------------


class LyingKey(str):
    """A dict key equal to "key" whose ``__eq__`` collects garbage, or allocates with collections
    on at threshold 1 so that one starts inside the allocation (user code inside a fetch)."""

    trigger = "collect"

    def __hash__(self):
        return hash("key")

    def __eq__(self, other):
        if LyingKey.trigger == "collect":
            gc.collect()
        else:
            old = gc.get_threshold()
            drain_free_lists()
            gc.set_threshold(1)
            gc.enable()
            try:
                _ = [[] for _ in range(4)]
            finally:
                gc.disable()
                gc.set_threshold(*old)
        return str.__eq__(self, other)


@pytest.mark.parametrize("trigger", ["collect", "allocate"])
def test_check_finalizer_kills_the_id_matched_object_mid_check(mode, trigger):
    # The finalizer is garbage in a cycle; the lying key's __eq__ collects it while the check
    # reads L['d']['key'], before the ID_MATCH on L['o'] (roots in installation order).
    # Collections are off otherwise, so the finalizer runs there and nowhere else. TYPE_MATCH on
    # the value, not EQUALS_MATCH: the walk's EQUALS reads the flag itself (its constant may be
    # an enum member that died), which would hide a check that forgot to.
    fin = Finalizer()
    LyingKey.trigger = trigger
    reused = 0
    for _ in range(GC_ROUNDS):
        d = {LyingKey("key"): 1}
        loc = {"d": d, "o": O()}
        b = tw.GuardBuilder(loc)
        b.type_match("L['d']['key']")
        b.id_match("L['o']")
        gs = b.build()
        del b
        hits = []
        gc.disable()
        try:
            fin.arm(0, lambda loc=loc, hits=hits: hits.append(replace_at_same_address(loc, "o")))
            r = gs.check(loc)
            fin.disarm()
        finally:
            gc.enable()
        assert hits, "the finalizer did not run during the check"
        assert gs.invalid
        reused += hits[0]
        assert r is False
        assert gs.check(loc) is False
    assert reused > 0


def test_check_predicate_kills_the_id_matched_object(mode):
    # The plain form: a guard's own code kills the object and puts another at its address.
    reused = 0
    for _ in range(ROUNDS):
        loc = {"k": 0, "o": O()}
        armed = []

        def pred(_v, loc=loc, armed=armed):
            if armed:
                armed.append(replace_at_same_address(loc, "o"))
            return True

        b = tw.GuardBuilder(loc)
        b.predicate(pred, source="L['k']")
        b.id_match("L['o']")
        gs = b.build()
        del b
        armed.append(None)
        assert gs.check(loc) is False
        assert gs.invalid
        reused += armed[-1]
    assert reused > 0


# -- why_not / failures ---------------------------------------------------------------------------


def test_why_not_reports_an_object_killed_after_the_walk_by_a_released_value():
    # ALIAS keeps a strong reference to each source's value until the relation is decided. A later
    # predicate removes L['a'] from the locals, so why_not's slot holds the last reference; its
    # finalizer (run when the slot is released, after the walk) kills the ID_MATCH'd object and
    # puts a new one at its address. why_not must still report the dead object, never "passes".
    reused = 0
    for _ in range(ROUNDS):
        loc: dict = {"o": O(), "k": 0}
        a = Boom(lambda: None)
        loc["a"] = loc["b"] = a
        armed = []

        def pred(_v, loc=loc, armed=armed):
            if armed:
                del loc["a"], loc["b"]
            return True

        b = tw.GuardBuilder(loc)
        b.id_match("L['o']")
        b.alias("L['a']", "L['b']")
        b.predicate(pred, source="L['k']")
        gs = b.build()
        del b
        hits = []
        a.act = lambda loc=loc, hits=hits: hits.append(replace_at_same_address(loc, "o"))
        del a
        armed.append(1)
        f = gs.why_not(loc)
        assert hits, "the value's finalizer did not run during why_not"
        assert gs.invalid
        reused += hits[0]
        assert f is not None and "died" in f.reason, f
        assert gs.check(loc) is False
    assert reused > 0


# 3.12+ collect at the eval breaker, never inside a C allocation of the call under test.
collects_inside_allocations = pytest.mark.skipif(
    sys.version_info >= (3, 12), reason="3.12+ collect at the eval breaker, never inside a C allocation"
)


def kill_the_id_matched_object_inside(setup, call, check) -> None:
    """Rounds of ``call(state, loc)`` on ``loc = {"o": O()}`` (``state = setup(loc)``, whose guards
    ID_MATCH L['o']), with a collection after every allocation and a finalizer armed to kill
    ``loc["o"]`` (a new object at its address) on the k-th collection, ``check(state, result,
    inside)`` after each (``inside``: the finalizer ran inside the call). Where the collections
    fall depends on what earlier tests left in the young generations, so a fixed number of rounds
    can see every one fall outside the call and test nothing: go on (up to a bound) until one
    fell inside. Nothing allocates between arming and the call but the collections themselves."""
    fin = Finalizer()
    ran = 0
    for k in range(200):
        if k >= ROUNDS and ran > 0:
            break
        loc = {"o": O()}
        state = setup(loc)
        hits: list = []
        inside = [False]  # whether the finalizer ran inside the call: it may run after
        drain_free_lists()
        act = lambda loc=loc, hits=hits: hits.append((inside[0], replace_at_same_address(loc, "o")))
        old = gc.get_threshold()
        fin.arm(k % 4, act)
        gc.set_threshold(1)
        try:
            inside[0] = True
            result = call(state, loc)
            inside[0] = False
        finally:
            gc.set_threshold(*old)
        fin.disarm()
        died_inside = bool(hits and hits[0][0])
        check(state, result, died_inside if hits else None)
        ran += died_inside
    assert ran > 0


def _id_matched(loc):
    b = tw.GuardBuilder(loc)
    b.id_match("L['o']")
    return b.build()


@collects_inside_allocations
def test_failures_lists_the_dead_object_when_a_collection_runs_while_building_the_answer():
    # After the walk, the answer is a list of tuples: its allocation may start a collection whose
    # finalizer kills the ID_MATCH'd object. The list must then name the dead object.
    def check(gs, fails, inside):
        if inside:
            assert gs.invalid
            assert fails and "died" in fails[0].reason
        elif inside is None:  # the finalizer did not run
            assert fails == []

    kill_the_id_matched_object_inside(_id_matched, lambda gs, loc: gs.failures(loc), check)


# -- the cache and what runs it ------------------------------------------------------------------


def _poisoned_entry(cache, f_locals, f_globals, act, *, code=None):
    """A guard set for ``cache`` whose check fails and leaves the lookup holding the entry's last
    reference: its predicate kills the entry's own ID_MATCH'd object (the entry is invalid) and
    purges the cache (len), so only the lookup still holds it. Releasing it frees the predicate,
    whose closure holds a Boom running ``act``."""
    box = [O()]
    f_globals["_b"] = box[0]
    state = {"armed": False}
    boom = Boom(act)

    def pred(_v, boom=boom):
        if state["armed"]:
            state["armed"] = False
            box.clear()
            del f_globals["_b"]
            len(cache)
        return not state.get("fail", False)

    b = tw.GuardBuilder(f_locals, f_globals=f_globals)
    b.predicate(pred, source="L['k']")
    b.id_match("G['_b']")
    gs = b.build()
    state["fail"] = True
    return gs, state


def _arm(state):
    state["armed"] = True


def test_cache_lookup_misses_when_the_hit_dies_as_the_lookup_releases_a_candidate(mode):
    reused = 0
    for _ in range(ROUNDS):
        cache = tw.Cache()
        g: dict = {"helper": O()}
        loc = {"k": 0}
        a = tw.GuardBuilder(loc, f_globals=g)
        a.id_match("G['helper']")
        cache.insert(a.build(), "A")
        del a
        hits = []
        gs, state = _poisoned_entry(
            cache, loc, g, lambda g=g, hits=hits: hits.append(replace_at_same_address(g, "helper"))
        )
        cache.insert(gs, "B")  # most recently used: tried first
        del gs
        _arm(state)
        got = cache.lookup(loc, default="miss")
        assert hits, "the released entry's finalizer did not run during the lookup"
        reused += hits[0]
        assert got == "miss"
        assert cache.lookup(loc, default="miss") == "miss"
        assert len(cache) == 0  # the invalid entry A was dropped
    assert reused > 0


def test_cache_lookup_entry_and_index_miss_on_an_entry_invalidated_mid_lookup(mode):
    # With a dispatch index on L['x'].mode (TYPE_MATCH int vs str) the hit A is found in a bucket,
    # the poisoned entry B among the unindexed candidates, which the lookup holds to its end.
    # lookup_entry must not return an invalid entry.
    reused = 0
    for _ in range(ROUNDS):
        cache = tw.Cache()
        g: dict = {"helper": O()}
        loc = {"k": 0, "x": types.SimpleNamespace(mode=1)}
        other = tw.GuardBuilder({"k": 0, "x": types.SimpleNamespace(mode="s")}, f_globals=g)
        other.type_match("L['x'].mode")
        cache.insert(other.build(), "other")
        a = tw.GuardBuilder(loc, f_globals=g)
        a.type_match("L['x'].mode")
        a.id_match("G['helper']")
        cache.insert(a.build(), "A")
        del a, other
        hits = []
        gs, state = _poisoned_entry(
            cache, loc, g, lambda g=g, hits=hits: hits.append(replace_at_same_address(g, "helper"))
        )
        cache.insert(gs, "B")
        del gs
        assert cache.index_source == "L['x'].mode"
        _arm(state)
        e = cache.lookup_entry(loc)
        assert hits
        reused += hits[0]
        assert e is None or e.valid, e
        assert e is None
    assert reused > 0


@collects_inside_allocations
def test_cache_lookup_entry_counts_a_miss_when_the_hit_dies_as_its_view_is_made(mode):
    # After the lookup decided, lookup_entry allocates the entry's view: a collection there may
    # kill the ID_MATCH'd object, and the answer is then None. The counters say what the caller
    # got: a miss, never a hit with no entry.
    def setup(loc):
        cache = tw.Cache()
        cache.insert(_id_matched(loc), "p")
        return cache

    def check(cache, e, inside):
        stats = cache.stats
        assert (stats["hits"], stats["misses"]) == ((0, 1) if e is None else (1, 0)), (e, stats)
        if inside:
            assert e is None

    kill_the_id_matched_object_inside(setup, lambda cache, loc: cache.lookup_entry(loc), check)


def test_specialize_misses_when_the_hit_dies_during_the_lookup(mode):
    reused = 0
    for _ in range(ROUNDS):
        g: dict = {"helper": O(), "__builtins__": __builtins__}
        exec("def fn(k):\n    return ('orig', k)\n", g)
        compiled = []

        def compiler(fn, example_args, builder, compiled=compiled):
            compiled.append(1)
            return lambda k: ("compiled", k)

        f = tw.specialize(compiler=compiler, backend="sound")(g["fn"])
        a = tw.GuardBuilder({"k": 0}, f_globals=g)
        a.id_match("G['helper']")
        f.cache.insert(a.build(), lambda k: ("A", k))
        del a
        hits = []
        gs, state = _poisoned_entry(
            f.cache, {"k": 0}, g, lambda g=g, hits=hits: hits.append(replace_at_same_address(g, "helper"))
        )
        f.cache.insert(gs, lambda k: ("B", k))
        del gs
        _arm(state)
        got = f(0)
        assert hits
        reused += hits[0]
        assert got == ("compiled", 0)
        assert compiled == [1]
    assert reused > 0


def _hooked_target():
    g: dict = {"helper": O(), "__builtins__": __builtins__}
    exec("def target(k):\n    return ('orig', k)\n", g)
    return g, g["target"]


def test_frame_hook_misses_when_the_hit_dies_during_the_lookup(mode):
    reused = 0
    for _ in range(ROUNDS):
        g, target = _hooked_target()
        new_code = target.__code__.replace(
            co_consts=tuple("A" if c == "orig" else c for c in target.__code__.co_consts)
        )
        asked = []

        def handler(frame, asked=asked, code=target.__code__):
            if frame.code is not code:
                return twf.SKIP
            asked.append(frame.code)
            return twf.RUN_ONLY if len(asked) > 1 else None

        with twf.hooked(handler):
            assert target(0) == ("orig", 0)  # creates the cache; the handler lets it through
            cache = twf.cache_of(target, handler)
            a = tw.GuardBuilder({"k": 0}, f_globals=g)
            a.id_match("G['helper']")
            cache.insert(a.build(), twf.Replacement(target.__code__, new_code))
            del a
            assert target(0) == ("A", 0)
            hits = []
            gs, state = _poisoned_entry(
                cache, {"k": 0}, g, lambda g=g, hits=hits: hits.append(replace_at_same_address(g, "helper"))
            )
            cache.insert(gs, twf.Replacement(target.__code__, target.__code__))
            del gs
            _arm(state)
            got = target(0)
            assert hits
            reused += hits[0]
            assert got == ("orig", 0)  # a miss: the handler was asked again and let it through
            assert len(asked) == 2
        twf.reset(target)
    assert reused > 0


# -- other places a check can observe the flag flip ------------------------------------------------


def test_relational_slot_released_at_the_end_of_the_check_kills_the_id_matched_object(mode):
    # NO_ALIAS holds its sources' values until decided; a later predicate drops the locals' own
    # references, so releasing the slots (the check's last act) runs the finalizer.
    reused = 0
    for _ in range(ROUNDS):
        loc: dict = {"o": O(), "k": 0, "a": Boom(lambda: None), "b": O()}
        armed = []

        def pred(_v, loc=loc, armed=armed):
            if armed:
                del loc["a"]
            return True

        b = tw.GuardBuilder(loc)
        b.id_match("L['o']")
        b.no_alias("L['a']", "L['b']")
        b.predicate(pred, source="L['k']")
        gs = b.build()
        del b
        hits = []
        loc["a"].act = lambda loc=loc, hits=hits: hits.append(replace_at_same_address(loc, "o"))
        armed.append(1)
        r = gs.check(loc)
        assert hits
        reused += hits[0]
        assert gs.invalid
        assert r is False
    assert reused > 0


def test_shape_symbol_read_by_user_code_kills_the_id_matched_object(mode):
    # A SHAPE symbol read through a property (a residue): the property's code kills the object.
    class Box:
        def __init__(self, loc):
            self._loc = loc
            self.armed = False
            self.hit = None

        @property
        def n(self):
            if self.armed:
                self.armed = False
                self.hit = replace_at_same_address(self._loc, "o")
            return 4

    reused = 0
    for _ in range(ROUNDS):
        loc: dict = {"o": O()}
        box = Box(loc)
        loc["box"] = box
        b = tw.GuardBuilder(loc)
        b.shape("L['box'].n >= 2")
        b.id_match("L['o']")
        gs = b.build()
        del b
        box.armed = True
        assert gs.check(loc) is False
        assert gs.invalid
        reused += box.hit
    assert reused > 0


def test_dict_version_on_a_dict_replaced_at_the_same_address_mid_check(mode):
    # DICT_VERSION names no object: a dict freed mid-check and a new, equal one at its address has
    # another version, so the guard fails (no flag involved, but the same attack).
    reused = 0
    for _ in range(ROUNDS):
        loc: dict = {"k": 0, "d": {"a": 1}}
        armed = []

        def pred(_v, loc=loc, armed=armed):
            if armed:
                armed.append(replace_at_same_address(loc, "d", make=lambda: {"a": 1}))
            return True

        b = tw.GuardBuilder(loc)
        b.predicate(pred, source="L['k']")
        b.dict_version("L['d']")
        gs = b.build()
        del b
        armed.append(None)
        assert gs.check(loc) is False
        reused += armed[-1]
    assert reused > 0


def test_type_match_and_code_match_objects_replaced_mid_check(mode):
    # Classes and code objects are held weakly too: a class (or function with its code) killed by
    # an earlier guard and a new one at the same address never passes.
    def make_class():
        return type("C", (), {})

    def make_function():
        ns: dict = {}
        exec("def f():\n    return 1\n", ns)
        return ns["f"]

    reused = 0
    for make, guard in ((make_class, "type"), (make_function, "code")):
        for _ in range(ROUNDS):
            loc: dict = {"k": 0}
            if guard == "type":
                loc["c"] = make()
                loc["x"] = loc["c"]()
            else:
                loc["x"] = make()
            armed = []

            def pred(_v, loc=loc, armed=armed, guard=guard, make=make):
                if armed:
                    if guard == "type":
                        del loc["x"]
                        armed.append(replace_at_same_address(loc, "c", make=make, tries=50))
                        loc["x"] = loc["c"]()
                        gc.collect()
                    else:
                        old = id(loc["x"].__code__)
                        del loc["x"]
                        gc.collect()
                        keep = []
                        for _ in range(50):
                            fn = make()
                            keep.append(fn)
                            if id(fn.__code__) == old:
                                break
                        loc["x"] = keep[-1]
                        armed.append(id(loc["x"].__code__) == old)
                return True

            b = tw.GuardBuilder(loc)
            b.predicate(pred, source="L['k']")
            if guard == "type":
                b.type_match("L['x']")
            else:
                b.code_match("L['x']")
            gs = b.build()
            del b
            gc.collect()
            armed.append(None)
            r = gs.check(loc)
            if gs.invalid:
                assert r is False
            reused += bool(armed[-1])
    assert reused > 0


def test_inline_cache_of_a_class_replaced_mid_check(mode):
    # The attribute inline cache remembers a type and its version tag: a class killed mid-check and
    # a new class at the same address whose instances keep the attribute in a property must be
    # read through the property (the cache is stale), not through the old layout.
    def make_plain():
        return type("P", (), {})

    def make_prop():
        return type("P", (), {"v": property(lambda self: 2)})

    reused = 0
    for _ in range(max(1, ROUNDS // 4)):
        plain = make_plain()
        obj = plain()
        obj.v = 1
        loc: dict = {"k": 0, "obj": obj}
        del plain, obj
        armed = []

        def pred(_v, loc=loc, armed=armed):
            if armed:
                cls_addr = id(type(loc["obj"]))
                del loc["obj"]
                gc.collect()
                keep = []
                c = make_prop()
                for _ in range(5000):
                    if id(c) == cls_addr:
                        break
                    keep.append(c)
                    if len(keep) >= 500:  # freed again: the allocator cycles through its lists
                        keep.clear()
                    c = make_prop()
                inst = c()
                inst.__dict__["v"] = 1  # shadowed by the data descriptor: getattr answers 2
                loc["obj"] = inst
                armed.append(id(c) == cls_addr)
            return True

        b = tw.GuardBuilder(loc)
        b.predicate(pred, source="L['k']")
        b.equals("L['obj'].v")
        gs = b.build()
        del b
        for _ in range(3):
            gs.check(loc)  # warm the inline cache
        armed.append(None)
        assert gs.check(loc) is False  # getattr(obj, "v") == 2 now
        reused += bool(armed[-1])
    assert reused > 0


def test_frame_hook_decides_after_releasing_a_cache_dropped_during_the_lookup(mode):
    # The hit's own predicate drops every frame cache (the slot's reference): the lookup's reference
    # to the cache object is then the last, and releasing it clears the cache, whose other entry's
    # finalizer kills the hit's ID_MATCH'd global and puts a new object at its address. The hook
    # decides the hit after that release: a miss (the handler is asked again).
    from tripwire import _core

    reused = 0
    for _ in range(ROUNDS):
        g, target = _hooked_target()
        consts = tuple("A" if c == "orig" else c for c in target.__code__.co_consts)
        new_code = target.__code__.replace(co_consts=consts)
        asked = []

        def handler(frame, asked=asked, code=target.__code__):
            if frame.code is not code:
                return twf.SKIP
            asked.append(frame.code)
            return twf.RUN_ONLY if len(asked) > 1 else None

        hits = []
        with twf.hooked(handler):
            assert target(0) == ("orig", 0)  # creates the cache; the handler lets it through
            cache = twf.cache_of(target, handler)
            boom = Boom(lambda g=g, hits=hits: hits.append(replace_at_same_address(g, "helper")))
            other = tw.GuardBuilder({"k": 0}, f_globals=g)
            other.predicate(lambda _v, boom=boom: False, source="L['k']")
            cache.insert(tw.GuardSet(other.guards, g), twf.Replacement(target.__code__, target.__code__))
            del other, boom
            state = {"armed": False}

            def drop_caches(_v, state=state):
                if state["armed"]:
                    state["armed"] = False
                    _core._frame_release_all()
                return True

            a = tw.GuardBuilder({"k": 0}, f_globals=g)
            a.predicate(drop_caches, source="L['k']")
            a.id_match("G['helper']")
            cache.insert(a.build(), twf.Replacement(target.__code__, new_code))  # most recent
            del a, cache
            state["armed"] = True
            got = target(0)
            assert hits, "the dropped cache's entry was not released during the lookup"
            reused += hits[0]
            assert got == ("orig", 0)  # a miss: the handler was asked again and let it through
            assert len(asked) == 2
        twf.reset(target)
    assert reused > 0
