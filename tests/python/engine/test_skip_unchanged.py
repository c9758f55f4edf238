"""The skip of unchanged subtrees (docs/cpp.md, "Skipping unchanged subtrees"): sound before fast.

Each test builds a guard set, checks it twice (so that claims are made and used), mutates one
thing, and requires the skipping engine to answer as the reference evaluator, the engine without
the skip and the tree walk do. The differential run (skip_world.py) does the same over long random
sequences of every mutation kind; a bounded run is here, the 1M-step run is by hand.
"""

from __future__ import annotations

import collections
import gc
import sys
import threading
import types
from typing import Any

import pytest

import reference
import skip_world
import tripwire as tw
from engine_switches import agree_with_and_without_skip
from gc_stress import scaled
from tripwire import _core


def test_skip_is_on() -> None:
    """The skip's premise was verified on this interpreter (3.11, 3.12 and 3.13 alike)."""
    assert _core._dict_hints_enabled()
    assert _core._skip_enabled()


class Module:
    def __init__(self) -> None:
        self.training = False
        self._modules: dict[str, Any] = {}
        self._parameters: dict[str, Any] = {}


class Sub(Module):
    pass


class OtherSub(Module):
    pass


class DictSub(dict):
    pass


class ComputedDict(Module):
    # A `__dict__` computed by user code: an instance switched to this class reads it through
    # the property, never its own slot (the stamped fetch of `__dict__` must see the new type).
    @property  # type: ignore[misc]
    def __dict__(self) -> dict:  # type: ignore[override]
        return {"training": True, "_parameters": {}, "k": -1}


def _tree() -> tuple[Module, dict]:
    root = Module()
    for i in range(3):
        m = Sub()
        m.k = 10 + i
        m.name = f"s{i}"
        m.dims = [1, 2]
        m.shape = (3, 4)
        m._parameters["w"] = object()
        m.__dict__
        root._modules[f"m{i}"] = m
    root.__dict__
    return root, {"self": root}


def _guards(f_locals: dict) -> tw.GuardSet:
    b = tw.GuardBuilder(f_locals)
    s = "L['self']"
    b.type_match(s)
    b.dict_contains(f"{s}.__dict__", "forward", present=False)
    b.type_match(f"{s}.__dict__['_modules']")
    b.dict_keys(f"{s}.__dict__['_modules']")
    for i in range(3):
        m = f"{s}.__dict__['_modules']['m{i}']"
        b.type_match(m)
        b.false(f"{m}.__dict__['training']")
        b.equals(f"{m}.__dict__['k']")
        b.equals(f"{m}.__dict__['name']")
        b.equals(f"{m}.k")  # through getattr
        b.type_match(f"{m}.__dict__['dims']")
        b.length(f"{m}.__dict__['dims']")
        b.equals(f"{m}.__dict__['dims'][0]")
        b.equals(f"{m}.__dict__['shape']")
        b.dict_keys(f"{m}.__dict__['_parameters']")
        b.id_match(f"{m}.__dict__['_parameters']['w']")
    return b.build()


def _warm(gs: tw.GuardSet, f_locals: dict) -> None:
    for _ in range(3):
        assert gs.check(f_locals)


def test_an_unchanged_tree_is_proved_by_its_tags() -> None:
    root, f_locals = _tree()
    gs = _guards(f_locals)
    _warm(gs, f_locals)
    # Most guards are proved by unchanged dicts: identity-implied guards on settled values and
    # state-implied guards on unchanged dicts. (On 3.13 the instance dicts are embedded in their
    # objects and have no usable tag: fewer, but the plain dicts still are.)
    assert gs._last_skipped_guards >= (6 if sys.version_info >= (3, 13) else 20), gs.explain()
    assert "proved by unchanged dicts" in gs.explain()


def _mutations() -> list[tuple[str, Any]]:
    def sub(root: Module, i: int = 1) -> Any:
        return root._modules[f"m{i}"]

    def reuse_address(root: Module) -> None:
        m = sub(root)
        del root._modules["m1"]
        del m
        gc.collect()
        fresh = Sub()
        fresh.k, fresh.name, fresh.dims, fresh.shape = 11, "s1", [1, 2], (3, 4)
        fresh._parameters["w"] = object()  # a new object where the ID_MATCH'd one may have been
        root._modules["m1"] = fresh

    def replace_params(root: Module) -> None:
        m = sub(root)
        m.__dict__["_parameters"] = dict(m._parameters)  # a new dict, the same entries

    def shadow_with_property(root: Module) -> None:
        Sub.k = property(lambda self: 99)  # getattr now finds the property, __dict__ reads don't

    return [
        ("instance dict write", lambda r: setattr(sub(r), "k", 12)),
        ("equal but distinct value", lambda r: setattr(sub(r), "k", int("11"))),
        ("identical value", lambda r: setattr(sub(r), "k", sub(r).k)),
        ("str value", lambda r: setattr(sub(r), "name", "other")),
        ("dict item write", lambda r: sub(r).__dict__.__setitem__("training", True)),
        ("__class__ assignment", lambda r: setattr(sub(r), "__class__", OtherSub)),
        ("class attribute shadows", shadow_with_property),
        ("list inside an unchanged dict", lambda r: sub(r).dims.append(3)),
        ("list item inside an unchanged dict", lambda r: sub(r).dims.__setitem__(0, 7)),
        ("new object at a dead address", reuse_address),
        ("dict replaced by an equal one", replace_params),
        ("instance dict replaced", lambda r: setattr(sub(r), "__dict__", dict(sub(r).__dict__))),
        ("key removed and put back", lambda r: r._modules.__setitem__("m0", r._modules.pop("m0"))),
        ("key added", lambda r: r._modules.__setitem__("m9", Sub())),
        ("forward shadowed", lambda r: r.__dict__.__setitem__("forward", None)),
        ("object.__setattr__", lambda r: object.__setattr__(sub(r, 2), "k", 0)),
        (
            "instance dict replaced by a dict subclass",
            lambda r: setattr(sub(r), "__dict__", DictSub(sub(r).__dict__)),
        ),
        ("instance dict emptied", lambda r: sub(r).__dict__.clear()),
        ("__class__ with a computed __dict__", lambda r: setattr(sub(r), "__class__", ComputedDict)),
    ]


@pytest.mark.parametrize("name,mutate", _mutations(), ids=[n for n, _ in _mutations()])
def test_each_mutation_kind_is_seen(name: str, mutate: Any) -> None:
    had_k = "k" in Sub.__dict__
    root, f_locals = _tree()
    gs = _guards(f_locals)
    specs = list(gs.guards)
    _warm(gs, f_locals)
    try:
        mutate(root)
        for _ in range(3):  # the first check after the change, and the claims it made
            agree_with_and_without_skip(gs, specs, f_locals)
    finally:
        if not had_k and "k" in Sub.__dict__:
            del Sub.k


def _fixed_size_tree() -> tuple[dict, dict]:
    m = Sub()
    m.stride = (1, 1)
    m.mode = "zeros"
    m.blob = b"ab"
    m.keys = frozenset({1, 2})
    m.dims = [1, 2]
    m.__dict__
    return m.__dict__, {"self": m}


def _fixed_size_guards(f_locals: dict) -> tw.GuardSet:
    b = tw.GuardBuilder(f_locals)
    b.type_match("L['self']")
    for name in ("stride", "mode", "blob", "keys", "dims"):
        b.type_match(f"L['self'].__dict__[{name!r}]")
        b.length(f"L['self'].__dict__[{name!r}]")
    return b.build()


@pytest.mark.parametrize(
    "name,value",
    [
        ("stride", (1, 1, 1)),  # a longer tuple
        ("stride", [1, 1]),  # a list of the same length
        ("stride", (1,)),
        ("stride", tuple([1, 1])),  # an equal tuple, another object: passes
        ("mode", "zero"),
        ("mode", "zeroes"),
        ("blob", b"abc"),
        ("blob", bytearray(b"ab")),  # same length, a mutable type
        ("keys", frozenset({1})),
        ("keys", {1, 2}),  # a set of the same size
    ],
)
def test_length_of_a_fixed_size_value_is_implied_by_identity(name: str, value: Any) -> None:
    """LENGTH on a node that also matches tuple/str/bytes/frozenset exactly is proved with the
    settled value (docs/cpp.md): every replacement is a new value under a new tag, and a list
    beside them (whose length changes in place) is evaluated on every check."""
    d, f_locals = _fixed_size_tree()
    gs = _fixed_size_guards(f_locals)
    specs = list(gs.guards)
    _warm(gs, f_locals)
    if sys.version_info < (3, 13):
        # Every fixed-size LENGTH is proved (its TYPE_MATCH and itself: in the leaf run); the
        # list's LENGTH is not, nor (state-implied on a non-dict) ever could be.
        assert gs._last_skipped_guards >= 8, gs.explain()
    d[name] = value
    same = type(value) is tuple and len(value) == 2  # only the equal new tuple still passes
    for _ in range(3):
        assert agree_with_and_without_skip(gs, specs, f_locals) == same
    d["dims"].append(3)  # in place, under the unchanged dict: the list's LENGTH sees it
    assert not agree_with_and_without_skip(gs, specs, f_locals)


def test_slots_and_properties_are_evaluated_every_time() -> None:
    state = {"v": 1}

    class Slotted:
        __slots__ = ("a",)

    class Computed:
        @property
        def p(self) -> int:
            return state["v"]

        def __getattr__(self, name: str) -> int:
            return state["v"] + 1

    s = Slotted()
    s.a = 5
    holder = types.SimpleNamespace(s=s, c=Computed())
    cfg = {"holder": holder}
    f_locals = {"cfg": cfg}
    b = tw.GuardBuilder(f_locals)
    b.type_match("L['cfg']")
    b.equals("L['cfg']['holder'].s.a")
    b.equals("L['cfg']['holder'].c.p")
    b.equals("L['cfg']['holder'].c.anything")
    gs = b.build()
    specs = list(gs.guards)
    _warm(gs, f_locals)
    s.a = 6
    assert not agree_with_and_without_skip(gs, specs, f_locals)
    s.a = 5
    assert agree_with_and_without_skip(gs, specs, f_locals)
    state["v"] = 2  # the dicts on the path are unchanged; the computed values are not
    assert not agree_with_and_without_skip(gs, specs, f_locals)
    state["v"] = 1
    assert agree_with_and_without_skip(gs, specs, f_locals)


def test_module_globals_and_function_fields() -> None:
    mod = types.ModuleType("skip_mod")
    mod.CONST = 3

    def f(x: int, scale: float = 2.0) -> int:
        return x

    def g(x: int, scale: float = 2.0) -> int:
        return -x

    f_globals = {"mod": mod, "f": f, "TABLE": {1: "a", 2: "b"}}
    b = tw.GuardBuilder({}, f_globals)
    b.id_match("G['mod']")
    b.equals("G['mod'].CONST")
    b.id_match("G['f'].__code__")
    b.equals("G['f'].__defaults__[0]")
    b.equals("G['TABLE'][2]")
    b.dict_contains("G['TABLE']", 1, present=True)
    gs = b.build()
    specs = list(gs.guards)
    for _ in range(3):
        assert gs.check({})
    assert gs._fast_guard_count == len(gs)
    for mutate, undo in [
        (lambda: setattr(mod, "CONST", 4), lambda: setattr(mod, "CONST", 3)),
        (lambda: setattr(f, "__code__", g.__code__), lambda: setattr(f, "__code__", f.__code__)),
        (lambda: setattr(f, "__defaults__", (3.0,)), lambda: setattr(f, "__defaults__", (2.0,))),
        (lambda: f_globals["TABLE"].__setitem__(2, "c"), lambda: f_globals["TABLE"].__setitem__(2, "b")),
        (lambda: f_globals["TABLE"].pop(1), lambda: f_globals["TABLE"].__setitem__(1, "a")),
        (
            lambda: setattr(
                mod, "__class__", type("M", (types.ModuleType,), {"CONST": property(lambda s: 9)})
            ),
            lambda: setattr(mod, "__class__", types.ModuleType),
        ),
    ]:
        code = f.__code__
        mutate()
        assert not agree_with_and_without_skip(gs, specs, {}, f_globals)
        undo()
        if f.__code__ is not code:
            f.__code__ = code
        agree_with_and_without_skip(gs, specs, {}, f_globals)


def test_embedded_instance_dict_on_313_is_never_trusted() -> None:
    """CPython 3.13 stores attributes of an object whose __dict__ was materialised over its inline
    values straight into the values: neither the dict's tag nor dict watchers see the store."""

    class Obj:
        def __init__(self) -> None:
            self.a = 1
            self.b = 2

    o = Obj()
    o.__dict__
    f_locals = {"o": o}
    b = tw.GuardBuilder(f_locals)
    b.equals("L['o'].__dict__['a']")
    b.equals("L['o'].__dict__['b']")
    gs = b.build()
    specs = list(gs.guards)
    _warm(gs, f_locals)
    for v in (5, 1, 6, 1):
        o.a = v  # STORE_ATTR: on 3.13 through the inline values
        assert agree_with_and_without_skip(gs, specs, f_locals) == (v == 1)


def test_dict_version_refuses_an_embedded_dict_on_313() -> None:
    class Obj:
        def __init__(self) -> None:
            self.a = 1

    o = Obj()
    d = o.__dict__
    b = tw.GuardBuilder({"o": o})
    if sys.version_info >= (3, 13):
        with pytest.raises(tw.GuardBuildError, match="inline values"):
            b.dict_version("L['o'].__dict__")
        return
    b.dict_version("L['o'].__dict__")
    gs = b.build()
    assert gs.check({"o": o})
    o.a = 2
    assert not gs.check({"o": o})
    assert d is o.__dict__


def test_differential_bounded() -> None:
    """A bounded differential run: every mutation kind, the four evaluators agree on every step."""
    st = skip_world.run(seed=11, steps=scaled(1500, 5), world_steps=500)
    assert st.passes > st.steps // 10  # the trees pass often enough for claims to be used
    assert st.skipped_guards > 0
    assert set(st.kinds) == set(skip_world.MUTATIONS)


def test_differential_bounded_with_finalizers_mid_check() -> None:
    st = skip_world.run(seed=12, steps=scaled(800, 5), gc_stress=True, world_steps=400)
    assert st.disturbed > 0  # finalizers did run inside checks
    assert st.skipped_guards > 0


def test_a_thread_mutating_the_tree_while_another_checks() -> None:
    root, f_locals = _tree()
    gs = _guards(f_locals)
    specs = list(gs.guards)
    _warm(gs, f_locals)
    stop = threading.Event()
    m = root._modules["m1"]

    def flip() -> None:
        while not stop.is_set():
            m.k = 99
            m.k = 11

    t = threading.Thread(target=flip)
    t.start()
    try:
        results = {gs.check(f_locals) for _ in range(scaled(3000, 10))}
    finally:
        stop.set()
        t.join()
    assert results <= {True, False}
    m.k = 11
    assert agree_with_and_without_skip(gs, specs, f_locals)


def test_a_lying_user_key_in_the_dict_is_never_claimed() -> None:
    """A dict holding a key of a user type whose __eq__ and __hash__ collide with a str key: the
    lookup may call that __eq__, whose answer can change with the dict unchanged. Such a lookup is
    never the fast form, so nothing is claimed from it."""
    state = {"lie": False}

    class Liar:
        def __hash__(self) -> int:
            return hash("a")

        def __eq__(self, other: object) -> bool:
            return state["lie"]

    d: dict[Any, Any] = {Liar(): "liar", "a": 1}
    f_locals = {"d": d}
    b = tw.GuardBuilder(f_locals)
    b.type_match("L['d']")
    b.equals("L['d']['a']", 1)
    gs = b.build()
    specs = list(gs.guards)
    _warm(gs, f_locals)
    for lie in (True, False, True, False):
        state["lie"] = lie
        agree_with_and_without_skip(gs, specs, f_locals)


def test_a_predicate_that_checks_the_set_again_and_mutates() -> None:
    """Re-entrancy: a residue (predicate) on an early node runs a nested check of the same set and
    mutates the tree. The fast program evaluates in the walk's order, so the answers of a sequence
    of checks are the walk's, and a big set's registers (a per-thread file per nesting depth) are
    not overwritten by the nested check."""

    def run(fast: bool) -> list[bool]:
        root, f_locals = _tree()
        for i in range(3, 30):  # over 64 sources: registers from the per-thread pool
            m = Sub()
            m.k = i
            root._modules[f"m{i}"] = m
        calls = {"n": 0}
        holder: dict[str, Any] = {}

        def predicate(v: Any) -> bool:
            calls["n"] += 1
            if calls["n"] % 3 == 0:
                holder["gs"].check(f_locals)  # nested check of the same set
            sub = root._modules["m1"]
            sub.k = 11 if calls["n"] % 4 else 12  # every fourth call breaks a later guard
            return True

        b = tw.GuardBuilder(f_locals)
        b.type_match("L['self']")
        b.predicate(predicate, "mutates", source="L['self'].__dict__['_modules']")
        for i in range(3):
            b.equals(f"L['self'].__dict__['_modules']['m{i}'].__dict__['k']")
        for i in range(3, 30):
            b.equals(f"L['self'].__dict__['_modules']['m{i}'].__dict__['k']")
        gs = b.build()
        holder["gs"] = gs
        was = _core.testing.set_fast_pass(fast)
        try:
            out = [gs.check(f_locals) for _ in range(24)]
        finally:
            _core.testing.set_fast_pass(was)
        return out

    fast = run(True)
    assert fast == run(False)
    assert True in fast and False in fast


# -- the skip with the frame runtime's DICT_VERSION change flags and frame-mode locals -------------


def _dv_mutations() -> list[tuple[str, Any]]:
    def replace_by_equal(t: dict, holder: dict) -> None:
        holder["t"] = dict(t)  # the guarded dict dies; a new equal one, maybe at its address
        t.clear()

    # (name, mutation, whether the dict was modified). Storing the identical object again is not a
    # modification: CPython bumps neither the version tag nor fires dict watchers for it.
    return [
        ("item overwritten by an equal value", lambda t, h: t.__setitem__("a", int("123456789")), True),
        ("item overwritten by itself", lambda t, h: t.__setitem__("a", t["a"]), False),
        ("item deleted and put back", lambda t, h: t.__setitem__("a", t.pop("a")), True),
        ("update with the same object", lambda t, h: t.update(a=t["a"]), False),
        ("update with an equal object", lambda t, h: t.update(a=int("123456789")), True),
        ("setdefault of a present key", lambda t, h: t.setdefault("a", 5), False),
        ("dict replaced by an equal one", replace_by_equal, True),
    ]


@pytest.mark.parametrize("name,mutate,modified", _dv_mutations(), ids=[n for n, _, _ in _dv_mutations()])
def test_dict_version_flags_under_the_skip(name: str, mutate: Any, modified: bool) -> None:
    """DICT_VERSION on a dict the skip stamps (its DICT_KEYS make it a stamped node, so a state
    claim covers the DICT_VERSION) and on 3.12+ an armed change flag: after a modification that
    leaves equal contents, every way of checking fails, and keeps failing once claims were made."""
    holder = {"t": {"a": 123456789, "b": (2, 3)}}
    f_locals = {"h": holder}

    def build() -> tw.GuardSet:
        b = tw.GuardBuilder(f_locals)
        b.type_match("L['h']")
        b.dict_keys("L['h']")
        b.type_match("L['h']['t']")
        b.dict_keys("L['h']['t']")
        b.dict_version("L['h']['t']")
        b.equals("L['h']['t']['b']")
        return b.build()

    gs = build()
    specs = list(gs.guards)
    other = build()  # a second set with its own flag armed on the same dict
    _warm(gs, f_locals)
    _warm(other, f_locals)
    assert gs._last_skipped_guards >= 1, gs.explain()
    mutate(holder["t"], holder)
    del other  # its flag unregisters while the dict's next events are still to come
    gc.collect()
    for _ in range(3):
        assert agree_with_and_without_skip(gs, specs, f_locals) is not modified
    holder["t"]["z"] = 0  # later events on the dict: the (freed) flag of `other` is not touched
    assert not agree_with_and_without_skip(gs, specs, f_locals)


def test_the_skip_through_the_frame_hook() -> None:
    """Frame mode (locals read by index, G[...] from the frame's globals): a hooked function whose
    replacement returns the value its guards pinned, called while the tree and the globals change
    in every way the skip must see; the result is always the current value (a false pass would
    return a stale one)."""
    from tripwire import frame as twf

    ns: dict[str, Any] = {"CFG": types.SimpleNamespace(scale=2), "TABLE": {1: "a"}}
    exec(
        "def target(m):\n    return ('orig', m.__dict__['k'], m.__dict__['cfg'].scale, TABLE[1])\n",
        ns,
    )
    target = ns["target"]
    m = Sub()
    m.k = 1
    m.cfg = ns["CFG"]
    m.__dict__

    def compile_frame(frame: Any) -> Any:
        if frame.code is not target.__code__:
            return twf.SKIP
        loc = frame.f_locals
        b = tw.GuardBuilder(loc, f_globals=frame.f_globals)
        b.type_match("L['m']")
        b.equals("L['m'].__dict__['k']")
        b.type_match("L['m'].__dict__['cfg']")
        b.equals("L['m'].__dict__['cfg'].scale")
        b.type_match("G['TABLE']")
        b.dict_keys("G['TABLE']")
        b.equals("G['TABLE'][1]")
        want = ("new", loc["m"].k, loc["m"].cfg.scale, frame.f_globals["TABLE"][1])
        body = compile(f"def r(m):\n    return {want!r}\n", "<r>", "exec")
        code = next(c for c in body.co_consts if isinstance(c, types.CodeType))
        return code, b.build()

    steps = [
        lambda: None,
        lambda: setattr(m, "k", 2),
        lambda: setattr(m, "k", int("2")),
        lambda: setattr(m.cfg, "scale", 3),
        lambda: ns["TABLE"].__setitem__(1, "b"),
        lambda: ns.__setitem__("TABLE", {1: "b"}),
        lambda: setattr(m, "__dict__", dict(m.__dict__)),
        lambda: setattr(m, "__class__", OtherSub),
        lambda: setattr(m, "k", 1),
    ]
    with twf.hooked(compile_frame):
        for i in range(scaled(3, 1)):
            for step in steps:
                step()
                for _ in range(3):  # the first call compiles or hits; the next ones use the claims
                    got = target(m)
                    assert got[1:] == (m.k, m.cfg.scale, ns["TABLE"][1]), (i, got)


def test_claims_follow_their_node_when_the_program_is_rebuilt() -> None:
    """The claims live in arrays laid out in the program's order (fast_pass.cpp); an adaptive
    reorder rebuilds the program and moves every claim to its node's new slot. A claim moved to
    the wrong node would hand one node's value to another while their parent dict is unchanged:
    the LENGTH guards below (mutable lists of one length: evaluated on every check, never implied)
    would then read a sibling's list and miss the one grown in place: a false pass."""
    for grown in "abcdef":
        lists = {k: [0] for k in "abcdef"}
        d = dict(lists)
        f_locals = {"d": d, "z": {"k": 1}}
        b = tw.GuardBuilder(f_locals)
        b.type_match("L['d']")
        for k in "abcdef":
            b.id_match(f"L['d'][{k!r}]")
            b.length(f"L['d'][{k!r}]")
        b.type_match("L['z']")
        b.equals("L['z']['k']", 1)
        gs = b.build()
        for _ in range(3):
            assert gs.check(f_locals)
        assert gs._last_skipped_guards >= 6  # the claims on d's children are in use
        # Failures on z (d unchanged: its claims stay valid) move it before d: the next check
        # rebuilds the program, z's settled fetch takes the first slot, every claim on d's
        # children moves, and that check is the first to use the moved claims.
        bad = {"d": d, "z": {"k": 2}}
        for _ in range(20):
            assert not gs.check(bad)
        lists[grown].append(1)
        assert not gs.check(f_locals)
        assert not reference.check(b.guards, f_locals)
        lists[grown].pop()
        assert gs.check(f_locals)
        assert gs._last_skipped_guards >= 6


def test_a_residue_out_of_line_holds_only_the_sources_read_before_it() -> None:
    """The guards a claim proves run out of line (after the program's End op) when the claim
    misses. A residue there (an element's own __eq__) takes strong references to the relational
    sources read so far, by the residue's place in the evaluation order (GuardSet::op_order), not
    by where its op sits in the array: by the array, every source would count as read, and the
    registers of sources not yet fetched in this check (still holding the previous check's values)
    would decide the ALIAS below: a wrong answer, or a reference to a dead object."""

    class Loud(int):
        calls = 0

        def __eq__(self, other: object) -> bool:
            Loud.calls += 1
            return int(self) == other

        __hash__ = int.__hash__

    shared, other = object(), object()
    d: dict[str, Any] = {"pad": (1, 2), "x": shared}
    b = tw.GuardBuilder({"d": d, "y": shared})
    b.type_match("L['d']")
    b.equals("L['d']['pad']", python_eq=True)  # identity-implied: behind the settling fetch
    b.alias("L['d']['x']", "L['y']")  # both sources are read after L['d']['pad']
    gs = b.build()
    for k in range(scaled(6)):
        good, bad = {"d": d, "y": shared}, {"d": d, "y": other}
        assert gs.check(good) and gs.check(good)
        assert not gs.check(bad)  # the registers now hold `other` for L['y']
        d["pad"] = (Loud(1), 2) if k % 2 == 0 else (1, 2)  # a new tag: the claim on pad misses
        calls = Loud.calls
        assert gs.check(good) is True
        assert reference.check(b.guards, good)
        if k % 2 == 0:
            assert Loud.calls > calls  # the residue ran, out of line
        assert not gs.check(bad)
        assert not reference.check(b.guards, bad)


# -- A stamped dict fetched by a settling item step (SettleDictItemStamp) ---------------------------
# One op fetches (or settles) the value and reads its tag; the node's identity-implied guards sit
# in the stamp's block with its state-implied ones, proved by an unchanged tag of the value itself
# (an exact dict, or an exact module's dict). A value with no tag (a dict subclass, a module
# subclass) runs the block on every check, and nothing is claimed under it.


class ModSub(types.ModuleType):
    pass


class ModShadow(types.ModuleType):
    attr = property(lambda self: 2)  # a data descriptor: shadows the module dict's `attr`


def _stamped_items() -> tuple[dict, dict]:
    mod = types.ModuleType("tw_stamped")
    mod.attr = 1
    mod.other = "x"
    root = {"sub": {"a": 1, "b": (1, 2), "c": None}, "mod": mod, "xs": [1, 2], "ds": DictSub(a=1, b=2)}
    return root, {"root": root}


def _stamped_guards(f_locals: dict) -> tw.GuardSet:
    # `dict.__getitem__(X, k)`, as torch writes its sources: the DictItem step the fused op reads.
    b = tw.GuardBuilder(f_locals)
    r = "L['root']"

    def item(src: str, key: str) -> str:
        return f"dict.__getitem__({src}, {key!r})"

    sub, mod, xs, ds = item(r, "sub"), item(r, "mod"), item(r, "xs"), item(r, "ds")
    b.type_match(r)
    b.dict_keys(r)
    b.type_match(sub)  # identity-implied, in the fused op's stamp block
    b.dict_keys(sub)  # state-implied
    b.equals(item(sub, "a"))
    b.equals(item(sub, "b"))
    b.none(item(sub, "c"))
    b.id_match(mod)  # a module: stamped through its dict
    b.equals(f"{mod}.attr")
    b.equals(f"{mod}.other")
    b.type_match(xs)  # a list beside them, evaluated on every check
    b.length(xs)
    b.equals(f"{xs}[0]")
    b.dict_keys(ds)  # a dict subclass: stamped (a dict guard, its items settle), never tagged
    b.equals(item(ds, "a"))
    return b.build()


def _stamped_mutations() -> list[tuple[str, Any, bool]]:
    def other_module(root: dict) -> None:
        m = types.ModuleType("tw_stamped")
        m.attr, m.other = 1, "x"
        root["mod"] = m

    def restore_item(root: dict) -> None:
        sub = root["sub"]
        a = sub["a"]
        sub["a"] = 5
        sub["a"] = a

    return [
        ("sub an OrderedDict", lambda r: r.__setitem__("sub", collections.OrderedDict(r["sub"])), False),
        ("sub a dict subclass", lambda r: r.__setitem__("sub", DictSub(r["sub"])), False),
        ("sub an equal dict", lambda r: r.__setitem__("sub", dict(r["sub"])), True),
        ("sub item changed", lambda r: r["sub"].__setitem__("a", 2), False),
        ("sub item changed and restored", restore_item, True),
        ("sub key added", lambda r: r["sub"].__setitem__("d", 0), False),
        ("sub emptied", lambda r: r["sub"].clear(), False),
        ("another module, equal", other_module, False),
        ("module attribute", lambda r: setattr(r["mod"], "attr", 2), False),
        ("module attribute equal", lambda r: setattr(r["mod"], "attr", int("1")), True),
        ("module class a subclass", lambda r: setattr(r["mod"], "__class__", ModSub), True),
        ("module class shadows", lambda r: setattr(r["mod"], "__class__", ModShadow), False),
        ("list grown in place", lambda r: r["xs"].append(3), False),
        ("list item in place", lambda r: r["xs"].__setitem__(0, 7), False),
        ("list replaced, equal", lambda r: r.__setitem__("xs", [1, 2]), True),
        ("untagged dict item in place", lambda r: r["ds"].__setitem__("a", 3), False),
        ("untagged dict replaced, equal", lambda r: r.__setitem__("ds", DictSub(a=1, b=2)), True),
        ("untagged dict an exact dict", lambda r: r.__setitem__("ds", dict(a=1, b=2)), True),
    ]


@pytest.mark.parametrize(
    "name,mutate,holds", _stamped_mutations(), ids=[n for n, _, _ in _stamped_mutations()]
)
def test_a_stamped_dict_item_proves_its_guards_by_its_own_tag(name: str, mutate: Any, holds: bool) -> None:
    """After a run of passing checks (claims made and used), one mutation: every engine mode and
    the reference agree, on the first check after it and on the checks whose claims it made. A
    claim made without a tag (the list), or identity-implied guards left out of the fused op's
    block, would pass the failing cases here."""
    root, f_locals = _stamped_items()
    gs = _stamped_guards(f_locals)
    specs = list(gs.guards)
    for _ in range(4):
        assert gs.check(f_locals)
    # The dicts' claims are in use (on 3.13 too: these are plain dicts and a module's dict).
    assert gs._last_skipped_guards >= 8, gs.explain()
    mutate(root)
    for _ in range(3):
        assert agree_with_and_without_skip(gs, specs, f_locals) == holds


def test_a_value_without_a_tag_is_evaluated_on_every_check() -> None:
    """A stamped node whose value has no tag (a dict subclass, whose items settle when its tag is
    usable) runs its block on every check: its tag slot holds kNoTag, which no claim is ever made
    with, so its items are fetched afresh on every check and one changed in place after any
    number of passing checks fails. A claim made with kNoTag would settle the old item."""
    root, f_locals = _stamped_items()
    gs = _stamped_guards(f_locals)
    ds = root["ds"]
    for k in range(scaled(20)):
        assert gs.check(f_locals) and gs.check(f_locals)
        ds["a"] = k + 2
        assert not gs.check(f_locals)
        assert not reference.check(list(gs.guards), f_locals)
        ds["a"] = 1
        del ds["b"]
        assert not gs.check(f_locals)
        ds["b"] = 2


def test_a_fused_fetch_left_to_the_walk_evaluates_its_own_subtree() -> None:
    """A user-typed key in the parent dict makes the fused op's lookup CPython's (its __eq__ may
    run): the walk evaluates the subtree in place, at the child position found again from the
    current order (the op's `pos` holds its stamp's memo slot). Found wrongly, the walk would
    evaluate the sibling, which passes, and miss the changed item."""

    class Key:
        eqs = 0

        def __hash__(self) -> int:
            return hash("sub")

        def __eq__(self, other: object) -> bool:
            Key.eqs += 1
            return False

    p = {"x": {"a": 1}, "sub": {"a": 1}}
    f_locals = {"p": p}
    b = tw.GuardBuilder(f_locals)
    b.type_match("L['p']")
    for k in ("x", "sub"):
        b.type_match(f"dict.__getitem__(L['p'], {k!r})")
        b.dict_keys(f"dict.__getitem__(L['p'], {k!r})")
        b.equals(f"dict.__getitem__(dict.__getitem__(L['p'], {k!r}), 'a')")
    gs = b.build()
    specs = list(gs.guards)
    for _ in range(3):
        assert gs.check(f_locals)
    p[Key()] = 0  # the parent's table now holds a user key: CPython's lookup decides
    for _ in range(2):
        assert agree_with_and_without_skip(gs, specs, f_locals)
    p["sub"]["a"] = 2
    for _ in range(2):
        assert not agree_with_and_without_skip(gs, specs, f_locals)
    p["sub"]["a"] = 1
    assert agree_with_and_without_skip(gs, specs, f_locals)
    assert Key.eqs > 0  # CPython's lookup met the user key


@pytest.mark.parametrize("form", ["subscript", "module_attr"])
def test_a_settled_dict_fused_with_its_stamp(form: str) -> None:
    """A stamped dict fetched by a settling subscript (`L['cfg']['sub']`) or as a module's attribute
    (`L['mod'].sub`) is one op (SettleItemStamp, SettleAttrStamp): its value settled by the fetch's
    claim, its identity-implied guards (TYPE_MATCH dict) proved with its state-implied ones by the
    stamp's. After passing checks, each mutation must fail as the engine without the skip, the walk
    and the reference do: the dict replaced by an equal-looking one with another value, mutated in
    place and restored, replaced by a dict subclass, by a module, or removed; then restored."""

    class DictSub(dict):
        pass

    sub = {"a": 1, "b": 2}
    if form == "subscript":
        holder: Any = {"sub": sub, "other": 0}
        path = "L['h']['sub']"

        def put(v: Any) -> None:
            holder["sub"] = v

        def remove() -> None:
            del holder["sub"]

    else:
        holder = types.ModuleType("holder_mod")
        holder.sub = sub  # type: ignore[attr-defined]
        path = "L['h'].sub"

        def put(v: Any) -> None:
            holder.sub = v

        def remove() -> None:
            del holder.sub

    f_locals = {"h": holder}
    b = tw.GuardBuilder(f_locals)
    b.type_match("L['h']")
    b.type_match(path)
    b.dict_keys(path)
    b.equals(f"{path}['a']", 1)
    b.equals(f"{path}['b']", 2)
    gs = b.build()
    specs = list(b.guards)
    for _ in range(3):
        assert agree_with_and_without_skip(gs, specs, f_locals)
    assert gs.check(f_locals) and gs._last_skipped_guards >= 3  # the fused op's claims are in use
    steps: list[tuple[str, Any, bool]] = [
        ("another dict", {"a": 5, "b": 2}, False),
        ("back", sub, True),
        ("a subclass", DictSub(sub), False),
        ("back", sub, True),
        ("a module", types.ModuleType("m"), False),
        ("back", sub, True),
        ("mutated", None, False),
        ("restored", None, True),
        ("removed", None, False),
        ("back", sub, True),
    ]
    for what, value, want in steps:
        if what == "mutated":
            sub["a"] = 3
        elif what == "restored":
            sub["a"] = 1
        elif what == "removed":
            remove()
        else:
            put(value)
        for _ in range(2):  # the second check uses what the first claimed
            assert agree_with_and_without_skip(gs, specs, f_locals) is want, what
