"""Lifetimes: objects named by identity dying, address reuse, guard sets dying first, cycles,
globals and closure cells changing after build, and no growth over many build/check/drop cycles.

Run under scripts/asan-tests as well: several of these only misbehave silently (a comparison
against freed memory usually still returns the right answer by luck).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import enum
import gc
import sys
import tracemalloc
import weakref

import tripwire as tw
from gc_stress import scaled
from tripwire import _core
from tripwire import guard_set as _gs_mod


def collect() -> None:
    for _ in range(3):
        gc.collect()


def clean_check(gs: tw.GuardSet, f_locals) -> bool:
    r = gs.check(f_locals)
    assert type(r) is bool
    assert sys.exc_info() == (None, None, None)
    return r


def assert_dead_set(gs: tw.GuardSet, f_locals, source: str | None = None) -> None:
    """Everything a user can ask of a set whose guarded object died."""
    assert gs.invalid is True
    assert "died" in gs.invalid_reason
    for _ in range(3):
        assert clean_check(gs, f_locals) is False
    f = gs.why_not(f_locals)
    assert f is not None and "died" in f.reason
    if source is not None:
        assert f.source == source
    fails = gs.failures(f_locals)
    assert len(fails) == 1 and "died" in fails[0].reason
    assert "INVALID" in gs.explain()
    assert "INVALID" in repr(gs)


class Obj:
    pass


# -- an object named by identity dies ---------------------------------------------------------


def _id_match_set(make_obj):
    """A set with ID_MATCH on a fresh object nobody else keeps; returns (gs, weakref, address)."""
    obj = make_obj()
    b = tw.GuardBuilder({"x": obj, "n": 1})
    b.type_match("L['n']")
    b.id_match("L['x']")
    gs = b.build()
    assert clean_check(gs, {"x": obj, "n": 1}) is True
    return gs, weakref.ref(obj), id(obj)


def test_id_match_object_dies():
    gs, wr, _ = _id_match_set(Obj)
    collect()
    assert wr() is None
    assert_dead_set(gs, {"x": Obj(), "n": 1}, "L['x']")
    assert_dead_set(gs, {}, "L['x']")


def test_type_match_on_a_local_class_that_is_deleted():
    def build():
        class Local:
            pass

        b = tw.GuardBuilder({"v": Local()})
        b.type_match("L['v']")
        return b.build(), weakref.ref(Local)

    gs, wr = build()
    assert not gs.invalid
    collect()
    assert wr() is None
    assert_dead_set(gs, {"v": Obj()}, "L['v']")


def test_code_match_on_a_function_whose_code_dies():
    def build():
        ns: dict = {}
        exec("def f(a):\n    return a + 1\n", ns)  # the code object lives only in f
        f = ns["f"]
        b = tw.GuardBuilder({"f": f})
        b.code_match("L['f']")
        return b.build(), weakref.ref(f.__code__)

    gs, wr = build()
    collect()
    assert wr() is None
    assert_dead_set(gs, {"f": lambda a: a}, "L['f']")


def test_enum_member_in_equals_dies():
    """EQUALS_MATCH on an enum member holds it weakly; once its class is gone the set is invalid,
    and nothing may compare against the freed member (why_not walks every guard)."""

    def build():
        class Color(enum.Enum):
            RED = 1
            BLUE = 2

        b = tw.GuardBuilder({"c": Color.RED, "x": 1})
        b.equals("L['c']")
        b.type_match("L['x']")
        b.equals("L['x']")
        return b.build(), weakref.ref(Color.RED)

    gs, wr = build()
    collect()
    assert wr() is None
    assert_dead_set(gs, {"c": 1, "x": 1}, "L['c']")
    assert_dead_set(gs, {"c": 1, "x": "other"}, "L['c']")


def test_enum_dies_during_the_check():
    """User code run by an earlier guard kills the enum a later EQUALS_MATCH compares against."""
    box = {}

    def kill(_):
        box.clear()
        collect()
        return True

    def build():
        class Mode(enum.Enum):
            A = 1

        box["cls"] = Mode
        b = tw.GuardBuilder({"a": 0, "m": Mode.A, "z": 2})
        b.predicate(kill, "kill the enum", source="L['a']")
        b.equals("L['m']")
        b.equals("L['z']")
        gs = tw.GuardSet(b.guards)  # not build(): checking the example would kill it already
        return gs, weakref.ref(Mode.A)

    gs, wr = build()
    assert wr() is not None and not gs.invalid
    # The first check evaluates the roots in installation order: the predicate kills the enum,
    # then EQUALS_MATCH on L['m'] would compare 1 against the freed member.
    assert clean_check(gs, {"a": 0, "m": 1, "z": 2}) is False
    assert wr() is None
    assert_dead_set(gs, {"a": 0, "m": 1, "z": 2}, "L['m']")


def test_enum_dies_during_why_not():
    box = {}

    def kill(_):
        box.clear()
        collect()
        return False  # fail, so the walk goes on to the other guards

    def build():
        class Mode(enum.Enum):
            A = 1

        box["cls"] = Mode
        b = tw.GuardBuilder({"a": 0, "m": Mode.A})
        b.predicate(kill, "kill", source="L['a']")
        b.equals("L['m']")
        return tw.GuardSet(b.guards), weakref.ref(Mode.A)

    gs, wr = build()
    fails = gs.failures({"a": 0, "m": 1})
    assert wr() is None
    assert gs.invalid
    assert [f.source for f in fails][0] == "L['a']"
    assert all(isinstance(f.reason, str) for f in fails)
    assert_dead_set(gs, {"a": 0, "m": 1}, "L['m']")


def test_object_that_cannot_be_weakly_referenced_is_held_strongly():
    big = 10**40  # ints do not support weak references
    key = ("a", 1)
    base_big, base_key = sys.getrefcount(big), sys.getrefcount(key)
    b = tw.GuardBuilder({"x": big, "t": key})
    b.id_match("L['x']")
    b.id_match("L['t']")
    gs = b.build()
    del b
    collect()
    assert not gs.invalid
    assert clean_check(gs, {"x": big, "t": key}) is True
    assert clean_check(gs, {"x": 10**40 + 0 * len(key), "t": ("a", 1 + 0 * len(key))}) is False
    assert sys.getrefcount(big) > base_big
    del gs
    collect()
    assert sys.getrefcount(big) == base_big  # released with the set, not leaked
    assert sys.getrefcount(key) == base_key


# -- a new object at a dead object's address ----------------------------------------------------


def _reuse_address(make, old_id: int, tries: int = 100_000):
    """Allocate objects until one sits at old_id (kept alive); None if it never happens."""
    keep = []
    for _ in range(tries):
        o = make()
        if id(o) == old_id:
            return o, keep
        keep.append(o)
        if len(keep) >= 1000:  # free them again so the allocator cycles through its free lists
            keep.clear()
    return None, keep


def test_new_object_at_the_dead_objects_address_never_passes():
    gs, wr, old_id = _id_match_set(Obj)
    collect()
    assert wr() is None
    new, _keep = _reuse_address(Obj, old_id)
    candidates = [Obj()] + ([new] if new is not None else [])
    for c in candidates:
        assert clean_check(gs, {"x": c, "n": 1}) is False
    assert_dead_set(gs, {"x": candidates[-1], "n": 1}, "L['x']")


def test_new_class_at_the_dead_classs_address_never_passes():
    def make_class():
        class K:
            pass

        return K

    def build():
        K = make_class()
        b = tw.GuardBuilder({"v": K()})
        b.type_match("L['v']")
        return b.build(), id(K)

    gs, old_id = build()
    collect()
    assert gs.invalid
    keep = []
    hit = None
    for _ in range(20_000):
        K = make_class()
        if id(K) == old_id:
            hit = K
            break
        keep.append(K)
    instances = [Obj()] + ([hit()] if hit is not None else [])
    for inst in instances:
        assert clean_check(gs, {"v": inst}) is False


def test_attribute_cache_with_a_new_class_at_the_old_address():
    """The attribute inline cache remembers a type pointer and version tag; a new class at the
    same address (with a property of the same name) must not be read through the stale cache."""

    def make_plain():
        class A:
            pass

        return A

    def build():
        A = make_plain()
        o = A()
        o.x = 1
        b = tw.GuardBuilder({"o": o})
        b.equals("L['o'].x")
        gs = b.build()
        for _ in range(3):
            assert clean_check(gs, {"o": o}) is True
        return gs, id(A)

    gs, old_id = build()
    collect()
    keep = []
    for _ in range(20_000):

        class B:
            @property
            def x(self):
                return 2

        if id(B) == old_id:
            break
        keep.append(B)
    p = B()
    p.__dict__["x"] = 1  # the instance dict says 1, the data descriptor says 2
    assert p.x == 2
    assert clean_check(gs, {"o": p}) is False
    assert gs.why_not({"o": p}).actual == 2


def test_object_dies_and_is_replaced_during_the_check():
    """User code kills the ID_MATCH'd global and puts a new object at its address before the
    identity comparison runs: the check must still fail."""
    g = {"helper": Obj()}
    old_id = id(g["helper"])
    state = {"reused": False}

    def swap(_):
        g.pop("helper", None)
        collect()
        new, keep = _reuse_address(Obj, old_id, tries=20_000)
        state["reused"] = new is not None
        g["helper"] = new if new is not None else Obj()
        return True

    b = tw.GuardBuilder({"a": 0}, f_globals=g)
    b.predicate(swap, "swap the helper", source="L['a']")
    b.id_match("G['helper']")
    gs = tw.GuardSet(b.guards, g)
    del b
    assert clean_check(gs, {"a": 0}) is False
    assert gs.invalid
    assert clean_check(gs, {"a": 0}) is False


# -- the guard set dies first, or in a cycle --------------------------------------------------


def test_guard_set_dies_before_the_guarded_objects():
    objs = [Obj() for _ in range(5)]

    def build(i):
        b = tw.GuardBuilder({"x": objs[i], "t": objs[i]})
        b.id_match("L['x']")
        b.type_match("L['t']")
        return b.build()

    sets = [build(i) for i in range(5)] + [build(0) for _ in range(5)]
    refs = [weakref.ref(s) for s in sets]
    del sets
    collect()
    assert all(r() is None for r in refs)
    # The objects die after their guard sets: the weak-reference callbacks are gone with the
    # sets and must not run on freed memory.
    wobjs = [weakref.ref(o) for o in objs]
    objs.clear()
    collect()
    assert all(w() is None for w in wobjs)


def test_guard_sets_and_objects_dying_interleaved():
    alive = []
    for round_ in range(50):
        o = Obj()
        b = tw.GuardBuilder({"x": o})
        b.id_match("L['x']")
        gs = b.build()
        del b
        if round_ % 2:
            del o
            collect()
            assert gs.invalid
            alive.append(gs)
        else:
            alive.append((gs, o))
    for item in alive:
        if isinstance(item, tuple):
            gs, o = item
            assert clean_check(gs, {"x": o}) is True
        else:
            assert clean_check(item, {"x": Obj()}) is False
    del alive, item
    collect()


def test_guard_set_in_a_cycle_through_its_globals_and_closure():
    def build():
        g = {"n": 1}
        b = tw.GuardBuilder({}, f_globals=g)
        b.type_match("G['n']")
        gs = b.build()
        g["gs"] = gs  # gs -> its globals dict -> gs
        return weakref.ref(gs), weakref.ref(b)

    wgs, wb = build()
    collect()
    assert wb() is None and wgs() is None

    def build_closure():
        cell_target = None

        def f():
            return cell_target

        b = tw.GuardBuilder({}, f_closure=f)
        b.none("C['cell_target']")
        gs = b.build()
        f.__closure__[0].cell_contents = {"gs": gs}  # gs -> its closure cells -> gs
        return weakref.ref(gs)

    wgs = build_closure()
    collect()
    assert wgs() is None


def test_guard_set_cycle_through_a_predicate_closure_only():
    fin = []

    def build():
        holder = []

        def pred(v):
            return bool(holder)

        b = tw.GuardBuilder({"x": 1})
        b.predicate(pred, "cycle", source="L['x']")
        holder.append(None)
        gs = b.build()
        holder[0] = gs  # gs -> pred -> cell(holder) -> holder -> gs
        weakref.finalize(pred, fin.append, "pred")
        return weakref.ref(gs)

    wgs = build()
    collect()
    assert wgs() is None
    assert fin == ["pred"]


# -- globals and closure cells changing after build --------------------------------------------


def helper_a():
    return "a"


def helper_b():
    return "b"


def test_globals_mutated_after_build():
    g = {"helper": helper_a, "cfg": {"mode": "fast"}, "n": 3}
    b = tw.GuardBuilder({}, f_globals=g)
    b.id_match("G['helper']")
    b.equals("G['cfg']['mode']")
    b.type_match("G['n']")
    gs = b.build()
    assert clean_check(gs, {}) is True
    g["helper"] = helper_b
    assert clean_check(gs, {}) is False
    assert gs.why_not({}).source == "G['helper']"
    g["helper"] = helper_a
    assert clean_check(gs, {}) is True
    g["cfg"]["mode"] = "slow"
    assert clean_check(gs, {}) is False
    g["cfg"] = {"mode": "fast"}
    assert clean_check(gs, {}) is True
    del g["n"]
    assert clean_check(gs, {}) is False
    assert gs.why_not({}).source == "G['n']"
    g["n"] = 4
    assert clean_check(gs, {}) is True
    g.clear()
    assert clean_check(gs, {}) is False
    g.update(helper=helper_a, cfg={"mode": "fast"}, n=0)
    assert clean_check(gs, {}) is True
    # Deleting our name for the dict: the set keeps the dict it was given.
    wg = g
    del g
    assert clean_check(gs, {}) is True
    wg["n"] = "x"
    assert clean_check(gs, {}) is False


def test_closure_cells_mutated_after_build():
    def outer():
        x = 1
        cfg = {"mode": "fast"}

        def f():
            return x, cfg

        def set_x(v):
            nonlocal x
            x = v

        def clear_x():
            nonlocal x
            del x

        return f, set_x, clear_x

    f, set_x, clear_x = outer()
    b = tw.GuardBuilder({}, f_closure=f)
    b.type_match("C['x']")
    b.equals("C['x']")
    b.equals("C['cfg']['mode']")
    gs = b.build()
    assert clean_check(gs, {}) is True
    set_x(2)
    assert clean_check(gs, {}) is False
    assert gs.why_not({}).source == "C['x']"
    set_x(1)
    assert clean_check(gs, {}) is True
    cells = dict(zip(f.__code__.co_freevars, f.__closure__))
    cells["cfg"].cell_contents["mode"] = "slow"
    assert clean_check(gs, {}) is False
    cells["cfg"].cell_contents["mode"] = "fast"
    clear_x()  # an empty cell
    assert clean_check(gs, {}) is False
    assert gs.why_not({}).source == "C['x']"
    set_x(1)
    assert clean_check(gs, {}) is True
    # The set keeps the cells alive after the function is gone.
    wf = weakref.ref(f)
    del f, set_x, clear_x, cells
    collect()
    assert wf() is None
    assert clean_check(gs, {}) is True


# -- no growth -------------------------------------------------------------------------------


def _malloc_in_use() -> int | None:
    """Bytes in use by malloc (C++ allocations included), or None when unavailable (e.g. under
    AddressSanitizer, whose allocator does not report through mallinfo2)."""
    name = ctypes.util.find_library("c")
    if not name:
        return None
    libc = ctypes.CDLL(name)
    if not hasattr(libc, "mallinfo2"):
        return None

    class MallInfo2(ctypes.Structure):
        _fields_ = [
            (f, ctypes.c_size_t)
            for f in (
                "arena",
                "ordblks",
                "smblks",
                "hblks",
                "hblkhd",
                "usmblks",
                "fsmblks",
                "uordblks",
                "fordblks",
                "keepcost",
            )
        ]

    libc.mallinfo2.restype = MallInfo2
    info = libc.mallinfo2()
    return int(info.uordblks + info.hblkhd) or None


def test_many_sets_built_checked_and_dropped_do_not_grow():
    keep_alive = Obj()  # named weakly by every set: its weakref list must not grow

    class Color(enum.Enum):
        RED = 1

    f_locals = {"x": keep_alive, "n": 3, "cfg": {"mode": "fast", "c": Color.RED}, "xs": [1, 2]}
    b = tw.GuardBuilder(f_locals)
    b.id_match("L['x']")
    b.type_match("L['x']")
    b.type_match("L['n']")
    b.equals("L['cfg']['mode']")
    b.equals("L['cfg']['c']")
    b.length("L['xs']")
    b.dict_keys("L['cfg']")
    b.predicate(lambda v: v == 3, "n is 3", source="L['n']")
    specs = b.guards
    bad = {"x": Obj(), "n": 4, "cfg": {}, "xs": []}

    # The compiled core straight from its encoded declarations: what a leak in C++ (weak
    # references and their capsules, programs, failure records) would accumulate in. The Python
    # wrapper is exercised by the full GuardSet and builder cycles below.
    pool = _gs_mod._Pool()
    decls = _gs_mod.encode_decls(specs, pool)

    def core_cycle():
        core = _core.GuardSetCore(decls, pool.consts, pool.weak, None, None, False, tw.GuardEvalError)
        assert core.check(f_locals) is True
        assert core.check(bad) is False
        assert len(core._failures(bad, False)) >= 5
        assert len(core._failures(bad, True)) == 1

    def cycle(diagnose):
        gs = tw.GuardSet(specs)
        assert gs.check(f_locals) is True
        assert gs.check(bad) is False
        if diagnose:
            assert gs.why_not(bad) is not None
            assert len(gs.failures(bad)) >= 5

    def builder_cycle():
        bb = tw.GuardBuilder(f_locals)
        bb.id_match("L['x']")
        bb.equals("L['cfg']['mode']")
        gs = bb.build()
        assert gs.check(f_locals)

    for _ in range(200):  # warm up caches, interned strings, free lists
        core_cycle()
        cycle(True)
        builder_cycle()
    collect()
    malloc_before = _malloc_in_use()
    tracemalloc.start()
    try:
        collect()
        base = tracemalloc.get_traced_memory()[0]
        for i in range(scaled(20_000, 10)):
            core_cycle()
            if i % 20 == 0:
                cycle(i % 40 == 0)
                builder_cycle()
        collect()
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert grown < 1_000_000, f"Python heap grew by {grown} bytes over 20k cycles"  # ~50 bytes each
    malloc_after = _malloc_in_use()
    if malloc_before is not None and malloc_after is not None:
        # C++ allocations (weak-reference capsules, programs) are invisible to tracemalloc.
        assert malloc_after - malloc_before < 8_000_000, (malloc_before, malloc_after)
    assert len(weakref.getweakrefs(keep_alive)) == 0
