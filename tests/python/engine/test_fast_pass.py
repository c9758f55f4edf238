"""The straight-line fast pass of ``GuardSet.check`` (cpp/runtime/fast_pass.cpp).

The fast pass may only ever conclude "pass", without running user code; anything else is decided
by the tree walk. These tests check that it is used where it should be, that it gives up where it
must, and that the engine still agrees with the reference evaluator with the fast pass switched
off (the equivalence suite runs with it on).
"""

from __future__ import annotations

import collections
import collections.abc
import types
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tripwire as tw
from gc_stress import examples
from test_equivalence import _SETTINGS, run_case
from tripwire import _core


@pytest.fixture
def fast_pass_off() -> Iterator[None]:
    was = _core.testing.set_fast_pass(False)
    try:
        yield
    finally:
        _core.testing.set_fast_pass(was)


@settings(max_examples=examples(300), **_SETTINGS)
@given(st.data())
def test_tree_walk_alone_matches_reference(data: st.DataObject) -> None:
    was = _core.testing.set_fast_pass(False)
    try:
        run_case(data, mutations=6)
    finally:
        _core.testing.set_fast_pass(was)


class Obj:
    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


def builtin_set() -> tuple[tw.GuardSet, dict[str, Any], dict[str, Any]]:
    mod = types.ModuleType("m")
    mod.flag = 3
    g = {"mod": mod, "limit": 10}
    f_locals = {"x": 3, "cfg": {"mode": "fast", "n": [1, 2]}, "obj": Obj(a=1.5, b=None), "t": (1, "a")}
    b = tw.GuardBuilder(f_locals, f_globals=g)
    b.equals("L['x']", 3)
    b.type_match("L['cfg']", dict)
    b.dict_keys("L['cfg']", ["mode", "n"])
    b.equals("L['cfg']['mode']", "fast")
    b.length("L['cfg']['n']", 2)
    b.equals("L['cfg']['n'][1]", 2)
    b.type_match("L['obj']", Obj)
    b.equals("L['obj'].a", 1.5)
    b.none("L['obj'].b")
    b.equals("L['t'][1]", "a")
    b.equals("G['mod'].flag", 3)
    b.equals("G['limit']", 10)
    return b.build(), f_locals, g


def test_fast_pass_used_for_builtin_guards() -> None:
    gs, f_locals, g = builtin_set()
    assert gs._uses_fast_pass
    for _ in range(3):
        assert gs.check(f_locals)
    f_locals["obj"].a = 2.5
    assert not gs.check(f_locals)  # a failure: decided by the tree walk
    assert gs.why_not(f_locals).source == "L['obj'].a"
    f_locals["obj"].a = 1.5
    g["mod"].flag = 4
    assert not gs.check(f_locals)
    g["mod"].flag = 3
    f_locals["cfg"]["n"].append(3)
    assert not gs.check(f_locals)
    f_locals["cfg"]["n"].pop()
    assert gs.check(f_locals)


@pytest.mark.parametrize(
    "add",
    [
        lambda b: b.predicate(lambda v: True, source="L['x']"),
        lambda b: b.tuple_iterator_len("L['it']"),
        lambda b: b.global_state(lambda: 1, name="one"),
    ],
    ids=["lambda", "tuple_iterator", "python_probe"],
)
def test_a_guard_that_runs_user_code_costs_itself(add: Any) -> None:
    """A guard without a form free of user code is a residue: the fast pass decides every other
    guard and evaluates it in place; the set is not sent to the tree walk."""
    f_locals = {"x": 1, "obj": Obj(a=1), "it": iter((1, 2))}
    b = tw.GuardBuilder(f_locals)
    b.equals("L['x']", 1)
    add(b)
    gs = b.build()
    assert not gs._uses_fast_pass  # the fast pass alone cannot decide a check
    assert gs._fast_guard_count == 1  # ... but decides the EQUALS_MATCH
    before = gs._residue_pass_count
    assert gs.check(f_locals)
    assert gs._residue_pass_count == before + 1
    assert gs._last_fast_guards == 1
    assert not gs.check({**f_locals, "x": 2})


def test_a_hasattr_that_finds_its_name_costs_itself() -> None:
    """HASATTR is decided by the fast pass only where the name is certainly absent
    (test_hasattr_fast.py); an attribute that exists is a residue on every check."""
    f_locals = {"x": 1, "obj": Obj(a=1)}
    b = tw.GuardBuilder(f_locals)
    b.equals("L['x']", 1)
    b.hasattr("L['obj']", "a")
    gs = b.build()
    assert gs.check(f_locals)
    before = gs._residue_pass_count
    assert gs.check(f_locals)
    assert gs._residue_pass_count == before + 1
    assert gs._last_fast_guards == 1
    assert not gs.check({**f_locals, "x": 2})


def test_builtin_probe_is_on_the_fast_path() -> None:
    b = tw.GuardBuilder({"x": 1})
    b.equals("L['x']", 1)
    b.global_state("gc_enabled")
    gs = b.build()
    assert gs._uses_fast_pass and gs._fast_guard_count == 2
    before = gs._fast_pass_count
    assert gs.check({"x": 1})
    assert gs._fast_pass_count == before + 1


def test_builtin_probes_are_decided_by_the_fast_pass() -> None:
    """A built-in C++ probe (here gc_enabled) has a form without user code: the set keeps the
    fast pass, and a changed probe still fails (decided by the walk)."""
    import gc

    f_locals = {"x": 1}
    b = tw.GuardBuilder(f_locals)
    b.equals("L['x']", 1)
    b.global_state("gc_enabled")
    gs = b.build()
    assert gs._uses_fast_pass
    before = gs._fast_pass_count
    assert gs.check(f_locals)
    assert gs._fast_pass_count == before + 1
    was = gc.isenabled()
    try:
        gc.disable() if was else gc.enable()
        assert not gs.check(f_locals)
        assert gs.why_not(f_locals).kind == "GLOBAL_STATE"
    finally:
        gc.enable() if was else gc.disable()
    assert gs.check(f_locals)


def test_fast_pass_gives_up_on_non_dict_locals_and_unusual_objects() -> None:
    """Mapping locals, a dict subclass value and a class attribute: the fast pass gives up and the
    walk decides (and still passes)."""

    class Locals(dict):
        pass

    class WithClassAttr:
        k = 7

    class Mapping(collections.abc.Mapping):  # a non-dict Mapping (a duck type raises TypeError)
        def __init__(self, d: dict[str, Any]) -> None:
            self.d = d

        def __getitem__(self, key: str) -> Any:
            return self.d[key]

        def __iter__(self):
            return iter(self.d)

        def __len__(self) -> int:
            return len(self.d)

    f_locals = {"x": 1, "w": WithClassAttr()}
    b = tw.GuardBuilder(f_locals)
    b.equals("L['x']", 1)
    b.equals("L['w'].k", 7)
    gs = b.build()
    assert gs._uses_fast_pass
    assert gs.check(f_locals)
    assert gs.check(Locals(f_locals))
    assert gs.check(Mapping(f_locals))
    assert not gs.check(Mapping({"x": 2, "w": WithClassAttr()}))


def test_fast_pass_runs_no_user_code() -> None:
    """A key whose __eq__/__hash__ count calls: a passing fast check calls none of them; when the
    dict holds an equal but different key object, the walk decides exactly as without the fast
    pass."""
    calls = []

    class Key:
        def __hash__(self) -> int:
            calls.append("hash")
            return 1

        def __eq__(self, other: object) -> bool:
            calls.append("eq")
            return isinstance(other, Key)

    k = Key()
    d = {k: 1}
    calls.clear()
    b = tw.GuardBuilder({"d": d})
    b.type_match("L['d']", dict)
    b.length("L['d']", 1)
    gs = b.build()
    assert gs._uses_fast_pass
    calls.clear()
    for _ in range(5):
        assert gs.check({"d": d})
    assert calls == []


def test_fast_pass_follows_adaptive_reorder() -> None:
    """After failures reorder the walk, the fast pass is rebuilt in the new order and still
    answers correctly."""
    f_locals = {f"v{i}": i for i in range(8)}
    b = tw.GuardBuilder(f_locals)
    for i in range(8):
        b.equals(f"L['v{i}']", i)
    gs = b.build()
    bad = dict(f_locals, v7=-1)
    for _ in range(20):
        assert not gs.check(bad)
    assert gs.check(f_locals)
    assert not gs.check(dict(f_locals, v0=-1))
    assert gs.check(f_locals)


def test_fast_pass_off_and_on_give_the_same_answers(fast_pass_off: None) -> None:
    gs, f_locals, g = builtin_set()
    off = [gs.check(f_locals), gs.check(dict(f_locals, x=4))]
    _core.testing.set_fast_pass(True)
    on = [gs.check(f_locals), gs.check(dict(f_locals, x=4))]
    assert off == on == [True, False]


def test_fast_pass_with_bound_arguments_frame() -> None:
    """@specialize hits read L[...] from the argument vector: the fast pass handles that frame
    (the hit runs no Python code but the payload, tested in test_specialize)."""

    @tw.specialize
    def f(x, cfg):
        return x

    cfg = {"a": 1}
    assert f(1, cfg) == 1
    (entry,) = list(f.cache)
    assert entry.guards._uses_fast_pass
    passes = entry.guards.pass_count
    assert f(1, cfg) == 1 and f(x=1, cfg=cfg) == 1
    assert entry.guards.pass_count == passes + 2
    cfg["a"] = 2
    assert f(1, cfg) == 1 and len(f.cache) == 2


def test_fast_pass_reads_str_keyed_dicts_by_value_and_leaves_mixed_keys_to_the_walk() -> None:
    """A key stored as an equal but different str object (built at run time): the fast pass finds
    it with string comparisons only. A dict that also holds a non-str key may compare with user
    __eq__: the fast pass leaves it to the walk, which still passes."""
    calls = []

    class Key:
        def __hash__(self) -> int:
            return hash("layer0")  # collides with the str key on purpose

        def __eq__(self, other: object) -> bool:
            calls.append(other)
            return False

    name = "".join(["layer", "0"])  # not the interned 'layer0' of the source text
    mods = {name: 1}
    b = tw.GuardBuilder({"m": mods})
    b.equals("L['m']['layer0']", 1)
    gs = b.build()
    assert gs._uses_fast_pass
    before = gs._fast_pass_count
    assert gs.check({"m": mods}) and gs.check({"m": mods})
    assert gs._fast_pass_count == before + 2
    mixed = {name: 1, Key(): 2}
    before = gs._fast_pass_count
    assert gs.check({"m": mixed})
    assert gs._fast_pass_count == before  # decided by the walk
    assert not gs.check({"m": {name: 2}})


def test_lying_key_in_a_general_table_no_false_pass() -> None:
    """A user key whose __eq__ changes its answer lets a dict hold it and an "equal" str key at
    once; CPython's d['k'] then returns whichever comes first in the probe sequence. Entry hints
    are never used on such (general) tables, so the guard sees what d['k'] sees."""

    class Liar:
        equal = False

        def __hash__(self) -> int:
            return hash("k")

        def __eq__(self, other: object) -> bool:
            return Liar.equal

    d: dict[Any, str] = {}
    d[Liar()] = "A"
    d["k"] = "B"  # Liar says "not equal" now: a second key
    assert d["k"] == "B"
    b = tw.GuardBuilder({"d": d})
    b.equals("L['d']['k']", "B")
    gs = b.build()
    for _ in range(3):
        assert gs.check({"d": d})
    Liar.equal = True
    try:
        assert d["k"] == "A"  # the probe sequence meets the Liar first
        assert not gs.check({"d": d})
        assert gs.why_not({"d": d}) is not None
    finally:
        Liar.equal = False


class _Plain:
    def __init__(self) -> None:
        self.a = 1
        self.s = "x"


class _ModuleLike:
    def __init__(self) -> None:
        self.training = True
        self._modules = {"l0": _Plain()}

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(name)


_MODULE = types.ModuleType("fast_pass_probe")
_MODULE._private = 3  # a single-underscore module attribute (torch's `_global_forward_hooks`)
_MODULE.public = 4


def _materialised() -> _Plain:
    p = _Plain()
    p.__dict__  # the instance dict now exists
    return p


@pytest.mark.parametrize(
    "source,example,kind",
    [
        ("L['p'].a", {"p": _Plain()}, "equals"),
        ("L['m'].training", {"m": _ModuleLike()}, "equals"),
        ("L['m']._modules['l0'].s", {"m": _ModuleLike()}, "equals"),
        ("L['p'].__dict__", {"p": _materialised()}, "dict_keys"),
        ("L['d']['k']", {"d": {"k": 3}}, "equals"),
        ("L['xs'][1]", {"xs": [1, 2.5]}, "equals"),
        ("L['t'][-1]", {"t": (1, "z")}, "equals"),
        ("L['d']", {"d": {"k": 3, "j": 4}}, "dict_keys"),
        ("L['xs']", {"xs": [1, 2]}, "length"),
        ("L['s']", {"s": {1, 2, 3}}, "equals"),
        ("type(L['p'])", {"p": _Plain()}, "id_match"),
        ("L['mod']._private", {"mod": _MODULE}, "equals"),
        ("L['mod'].public", {"mod": _MODULE}, "equals"),
    ],
)
def test_fast_pass_decides_passing_checks(source: str, example: dict, kind: str) -> None:
    # Not only correct with the fast pass on: passing checks are decided by it, on every supported
    # CPython (a layout or version-tag detail that made every check fall back to the walk would
    # be a silent performance cliff: CPython 3.13 stopped setting Py_TPFLAGS_VALID_VERSION_TAG).
    b = tw.GuardBuilder(example)
    getattr(b, kind)(source)
    gs = b.build()
    assert gs._uses_fast_pass
    for _ in range(2):
        assert gs.check(example)
    before = gs._fast_pass_count
    assert gs.check(example)
    assert gs._fast_pass_count == before + 1, f"{source}: the check fell back to the tree walk"


def test_no_user_code_check_leaves_no_claim_over_an_undecided_guard():
    """The dispatch fast path (lookup_most_recent) runs the fast program without user code. A
    DICT_CONTAINS on a user-typed key cannot be decided there (its __eq__ may run): the check is
    undecided and the full lookup follows. The stamp's claim on the dict, made before that guard,
    must not survive it: otherwise the full check jumps over the guard on the same dict state and
    passes without ever deciding it. Before the fix, the entry compiled for `key in o.d` was
    reused after `del o.d[key]` (a false pass; the function itself still answered False)."""

    class Key:
        def __hash__(self) -> int:
            return 7

        def __eq__(self, other: object) -> bool:
            return other is self

    class Box:
        pass

    key = Key()
    compiled = []

    def compiler(fn, example, builder):
        builder.dict_contains("L['o'].d", key)
        compiled.append(1)
        return fn

    @tw.specialize(compiler=compiler)
    def f(o):
        return key in o.d

    o = Box()
    o.d = {key: 1, "a": 2}
    assert f(o) is True and f(o) is True and f(o) is True and len(compiled) == 1
    del o.d[key]  # a new state of the same dict: the next check stamps it
    assert f(o) is False
    assert len(compiled) == 2  # the guard failed: a miss, compiled again


_HOOK_CALLS: list[str] = []


class _HookModule(types.ModuleType):
    """torch._VF's shape: a module subclass whose class __getattr__ forwards to another object
    (the engine reads such a name without CPython's three formatted AttributeErrors)."""

    def __getattr__(self, name: str) -> Any:
        _HOOK_CALLS.append(name)
        if name in self.__dict__.get("raise_for", ()):
            raise ValueError("a __getattr__ that fails")
        return getattr(self.vf, name)


class _Spec:
    def __getattr__(self, name: str) -> Any:
        _HOOK_CALLS.append(f"spec.{name}")
        raise AttributeError(name)


def _hook_module() -> _HookModule:
    m = _HookModule("hooked_vf")  # ModuleType.__init__ sets __spec__ = None, as torch._VF's
    m.vf = types.SimpleNamespace(lstm=len, gru=abs)
    return m


_HOOK_MUTATIONS: list[tuple[str, Any]] = [
    ("unchanged", lambda m: None),
    ("forwarded value replaced", lambda m: setattr(m.vf, "lstm", abs)),
    ("forwarded value deleted", lambda m: delattr(m.vf, "lstm")),
    ("module dict wins (same value)", lambda m: m.__dict__.__setitem__("lstm", len)),
    ("module dict wins (other value)", lambda m: m.__dict__.__setitem__("lstm", abs)),
    ("PEP 562 module __getattr__", lambda m: m.__dict__.__setitem__("__getattr__", lambda n: len)),
    ("PEP 562 module __getattr__ raising", lambda m: m.__dict__.__setitem__("__getattr__", _raise_attr)),
    ("a spec with its own __getattr__", lambda m: m.__dict__.__setitem__("__spec__", _Spec())),
    ("a non-str key in the module dict", lambda m: m.__dict__.__setitem__(1, 2)),
    ("vf without the name", lambda m: setattr(m, "vf", types.SimpleNamespace())),
    (
        "a class __getattr__ replaced",
        lambda m: setattr(type(m), "__getattr__", _HookModule.__dict__["__getattr__"]),
    ),
]


def _raise_attr(name: str) -> Any:
    raise AttributeError(name)


@pytest.mark.parametrize("what,mutate", _HOOK_MUTATIONS, ids=[w for w, _ in _HOOK_MUTATIONS])
def test_a_module_subclass_getattr_hook_answers_as_getattr(what: str, mutate: Any) -> None:
    """`G['vf'].lstm` on a module subclass defining __getattr__: the engine's answer is
    `getattr(m, 'lstm') is len`, and the user code it runs (the class's __getattr__, a spec's)
    runs exactly as often as in getattr itself."""
    m = _hook_module()
    g = {"vf": m}
    b = tw.GuardBuilder({}, f_globals=g)
    b.id_match("G['vf'].lstm", len)
    gs = b.build()
    mutate(m)
    _HOOK_CALLS.clear()
    want = getattr(m, "lstm", None) is len
    python_calls = list(_HOOK_CALLS)
    for _ in range(3):
        _HOOK_CALLS.clear()
        assert gs.check({}) is want, what
        assert _HOOK_CALLS == python_calls, what


class _CallableHook:
    """A class `__getattr__` that is no function: no __get__, so CPython calls it unbound, with
    the name only."""

    def __call__(self, name: str) -> Any:
        _HOOK_CALLS.append(f"callable.{name}")
        if name == "lstm":
            return len
        raise AttributeError(name)


def test_a_module_subclass_getattr_hook_that_is_not_a_function() -> None:
    """The engine calls a plain-function hook with (module, name) directly and any other hook as
    CPython's call_attribute does (bound through its __get__, if any): both answer as getattr."""
    sub = type("CallableHooked", (types.ModuleType,), {"__getattr__": _CallableHook()})("callable_vf")
    b = tw.GuardBuilder({}, f_globals={"vf": sub})
    b.id_match("G['vf'].lstm", len)
    gs = b.build()
    b2 = tw.GuardBuilder({}, f_globals={"vf": sub})
    b2.id_match("G['vf'].gru", None)
    with pytest.raises(tw.GuardBuildError):
        b2.build()  # getattr raises AttributeError: the source is missing on the example
    for _ in range(3):
        _HOOK_CALLS.clear()
        assert gs.check({}) is True
        assert _HOOK_CALLS == ["callable.lstm"]
    type(sub).__getattr__ = _CallableHook.__call__.__get__(_CallableHook())  # a bound method
    _HOOK_CALLS.clear()
    assert gs.check({}) is (getattr(sub, "lstm") is len) is True
    type(sub).__getattr__ = staticmethod(lambda name: abs)
    assert gs.check({}) is (getattr(sub, "lstm") is len) is False


def test_a_module_subclass_getattr_hook_error_and_class_attribute() -> None:
    m = _hook_module()
    b = tw.GuardBuilder({}, f_globals={"vf": m})
    b.id_match("G['vf'].gru", abs)
    gs = b.build()
    assert gs.check({}) is True
    # A class attribute of that name is found before the hook: no hook call.
    sub = type("Sub", (_HookModule,), {"gru": abs})("sub")
    b2 = tw.GuardBuilder({}, f_globals={"vf": sub})
    b2.id_match("G['vf'].gru", abs)
    gs2 = b2.build()
    _HOOK_CALLS.clear()
    assert gs2.check({}) is True and _HOOK_CALLS == []
    # A hook that raises something other than AttributeError: the guard fails, no error is left
    # set by a non-strict check, and why_not names it.
    m.__dict__["raise_for"] = ("gru",)
    assert gs.check({}) is False
    f = gs.why_not({})
    assert f is not None and "ValueError" in (f.reason or ""), f
    del m.__dict__["raise_for"]
    assert gs.check({}) is True


def _class_mutations() -> list[tuple[str, Any]]:
    def getattribute(self: Any, name: str) -> Any:
        return 99 if name == "public" else types.ModuleType.__getattribute__(self, name)

    return [
        ("unchanged", lambda m: None),
        ("dict value changed", lambda m: setattr(m, "public", 5)),
        ("dict entry deleted (the hook answers)", lambda m: delattr(m, "public")),
        (
            "a class property (a data descriptor wins)",
            lambda m: setattr(type(m), "public", property(lambda s: 4)),
        ),
        ("a class property of another value", lambda m: setattr(type(m), "public", property(lambda s: 7))),
        ("a plain class attribute (the dict wins)", lambda m: setattr(type(m), "public", 8)),
        ("a class __getattribute__", lambda m: setattr(type(m), "__getattribute__", getattribute)),
        ("__class__ swapped to ModuleType", lambda m: setattr(m, "__class__", types.ModuleType)),
    ]


@pytest.mark.parametrize("what,mutate", _class_mutations(), ids=[w for w, _ in _class_mutations()])
def test_a_module_subclass_attribute_is_read_from_its_dict(what: str, mutate: Any) -> None:
    """A module subclass (with or without a class __getattr__) whose ModuleType.__getattribute__
    finds the name in the module dict: the fast pass reads the dict, under the class's version
    tag, and answers as getattr after any change to the module or its class."""
    for hooked in (False, True):
        base = _HookModule if hooked else types.ModuleType
        cls = type("Sub", (base,), {})
        m = cls("sub")
        m.vf = types.SimpleNamespace(public=6)
        m.public = 4
        b = tw.GuardBuilder({}, f_globals={"m": m})
        b.equals("G['m'].public", 4)
        gs = b.build()
        assert gs._uses_fast_pass
        before = gs._fast_pass_count
        assert gs.check({}) is True
        assert gs._fast_pass_count == before + 1  # decided without a residue
        mutate(m)
        want = getattr(m, "public", None) == 4
        for _ in range(3):
            assert gs.check({}) is want, (what, hooked)


def test_length_of_an_ordered_dict_is_read_in_the_pass() -> None:
    """LENGTH on an exact OrderedDict (torch's hook dicts) is its dict storage's size: no residue.
    A subclass may override __len__: evaluated in place, as len() answers."""

    class Lying(collections.OrderedDict):
        def __len__(self) -> int:
            return 7

    od: collections.OrderedDict[int, int] = collections.OrderedDict({1: 1})
    b = tw.GuardBuilder({"h": od})
    b.length("L['h']", 1)
    gs = b.build()
    assert gs._uses_fast_pass
    before = gs._fast_pass_count
    assert gs.check({"h": od}) is True
    assert gs._fast_pass_count == before + 1
    od[2] = 2
    assert gs.check({"h": od}) is False
    del od[1]
    assert gs.check({"h": od}) is True
    lying = Lying({1: 1})
    assert gs.check({"h": lying}) is (len(lying) == 1) is False
    lying.clear()
    assert gs.check({"h": Lying()}) is False


@pytest.mark.parametrize("predicate_first", [True, False])
@pytest.mark.parametrize("swap", ["none", "back_to_b", "away"])
def test_relational_guards_after_a_residue_answer_as_the_walk(predicate_first: bool, swap: str) -> None:
    """ALIAS after a residue (a predicate that runs user code, here mutating what the relation
    reads): decided from the registers when every source was read after the residue, from strong
    references otherwise; either way as the tree walk alone decides, on the same scenario."""

    class Box:
        x: Any = None

    def run(fast: bool) -> list[bool]:
        b, a, other = Box(), Box(), Box()
        a.x = b
        armed = [False]

        def pred(v: Any) -> bool:
            if armed[0]:
                a.x = b if swap == "back_to_b" else other if swap == "away" else a.x
            return True

        f_locals = {"p": 1, "a": a, "b": b}
        builder = tw.GuardBuilder(f_locals)
        if predicate_first:
            builder.predicate(pred, source="L['p']")
        builder.type_match("L['a']", Box)
        builder.alias("L['a'].x", "L['b']")
        if not predicate_first:
            builder.predicate(pred, source="L['p']")
        gs = builder.build()
        was = _core.testing.set_fast_pass(fast)
        try:
            armed[0] = True
            got = [gs.check(f_locals)]
            a.x = other  # fails before the predicate runs; the predicate may restore it
            got.append(gs.check(f_locals))
            a.x = b
            got.append(gs.check(f_locals))
            return got
        finally:
            _core.testing.set_fast_pass(was)

    assert run(True) == run(False)
