"""A module subclass whose class ``__getattr__`` forwards, ``return getattr(self.<attr>, name)``
(torch._VF's shape): the engine reads such an attribute without calling the method once it has
learnt the facts (docs/cpp.md, "Module subclasses"). Every fact it depends on is attacked here,
each against ``getattr`` itself and the oracle (tests/oracle/reference.py), and whether the
method ran is counted through a tracer where that matters."""

from __future__ import annotations

import builtins
import sys
import types
from collections.abc import Callable
from typing import Any

import pytest

import reference
import tripwire as tw

# Compiled into a namespace of its own, so that its globals and builtins can be attacked without
# touching this module's.
SOURCE = """
import types

class Forwarding(types.ModuleType):
    def __getattr__(self, name):
        return getattr(self.vf, name)

class Shifted(types.ModuleType):  # a different body: getattr with another name
    def __getattr__(self, name):
        return getattr(self.vf, name + "_")

class Defaulted(types.ModuleType):  # a different body: a third argument
    def __getattr__(self, name):
        return getattr(self.vf, name, len)

def other_body(self, name):
    return getattr(self.other, name)
"""


class VF:
    lstm = staticmethod(len)
    gru = staticmethod(abs)
    lstm_ = staticmethod(max)
    plain = len  # a builtin function: no __get__, itself


class SlottedVF:
    __slots__ = ()
    lstm = staticmethod(len)


def namespace() -> dict:
    ns: dict = {"__name__": "forwarding_ns", "__builtins__": dict(builtins.__dict__)}
    exec(SOURCE, ns)
    return ns


def module(ns: dict, cls: str = "Forwarding", vf: Any = None) -> Any:
    m = ns[cls]("forwarding_vf")  # ModuleType.__init__ sets __spec__ = None, as torch._VF's
    m.vf = VF() if vf is None else vf
    m.other = types.SimpleNamespace(lstm=abs)
    return m


def guard_set(m: Any, name: str = "lstm", value: Any = len) -> tw.GuardSet:
    b = tw.GuardBuilder({}, f_globals={"m": m})
    b.id_match(f"G['m'].{name}", value)
    return b.build()


def agrees(gs: tw.GuardSet, m: Any, name: str = "lstm", value: Any = len) -> bool:
    """The engine's answer is getattr's and the oracle's. When getattr raises (a missing
    forwarded object recurses; a deleted builtin), the check fails or raises the same."""
    try:
        want = getattr(m, name, None) is value
    except Exception as e:
        for _ in range(3):
            try:
                assert gs.check({}) is False
            except type(e):
                pass
        return False
    assert reference.check(gs.guards, {}, {"m": m}) is want
    for _ in range(3):  # the first check may learn, the later ones read
        assert gs.check({}) is want
    return want


class _Calls:
    """Counts the frames of the class's __getattr__ (a tracer sees every Python call)."""

    def __init__(self, code: Any) -> None:
        self.code = code
        self.n = 0

    def __call__(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "call" and frame.f_code is self.code:
            self.n += 1
        return None


def test_read_without_the_call_once_learnt() -> None:
    ns = namespace()
    m = module(ns)
    gs = guard_set(m)
    assert agrees(gs, m) is True
    assert gs._last_fast_guards == len(gs)  # the fast pass decided it: no residue
    # A tracer sees the call's frame, so with one on the engine calls the method, as getattr does.
    calls = _Calls(ns["Forwarding"].__getattr__.__code__)
    sys.settrace(calls)
    try:
        assert gs.check({}) is True
    finally:
        sys.settrace(None)
    assert calls.n == 1
    profiled = _Calls(ns["Forwarding"].__getattr__.__code__)
    sys.setprofile(lambda frame, event, arg: profiled(frame, event, arg))
    try:
        assert gs.check({}) is True
    finally:
        sys.setprofile(None)
    assert profiled.n == 1


def _set(obj: Any, name: str, value: Any) -> Callable[[], None]:
    had = name in vars(obj)
    old = vars(obj).get(name)
    setattr(obj, name, value)

    def undo() -> None:
        if had:
            setattr(obj, name, old)
        else:
            delattr(obj, name)

    return undo


def _set_item(d: dict, key: Any, value: Any) -> Callable[[], None]:
    had = key in d
    old = d.get(key)
    d[key] = value
    return lambda: d.__setitem__(key, old) if had else d.__delitem__(key)


class _DataVF:
    """A data descriptor: `self.vf` reads it, not the module dict's entry."""

    def __get__(self, obj: Any, cls: Any = None) -> Any:
        return types.SimpleNamespace(lstm=abs)

    def __set__(self, obj: Any, value: Any) -> None:
        raise AttributeError("read-only")


class _NonDataVF:
    """A non-data descriptor: the module dict's entry wins over it."""

    def __get__(self, obj: Any, cls: Any = None) -> Any:
        return types.SimpleNamespace(lstm=abs)


def _real_builtin_getattr(value: Any) -> Callable[[], None]:
    old = builtins.getattr
    builtins.getattr = value
    return lambda: setattr(builtins, "getattr", old)


# Each: (what, attack(ns, m) -> undo). The guard is `G['m'].lstm is len`.
ATTACKS: list[tuple[str, Callable[[dict, Any], Callable[[], None]]]] = [
    ("unchanged", lambda ns, m: lambda: None),
    ("forwarded object replaced", lambda ns, m: _set(m, "vf", types.SimpleNamespace(lstm=abs))),
    ("forwarded object replaced, same value", lambda ns, m: _set(m, "vf", types.SimpleNamespace(lstm=len))),
    ("forwarded object deleted", lambda ns, m: _pop_undo(m.__dict__, "vf")),
    ("forwarded object's class changed", lambda ns, m: _set(VF, "lstm", staticmethod(abs))),
    ("forwarded object's class: plain value", lambda ns, m: _set(VF, "lstm", len)),
    ("forwarded object's class: a function (binds)", lambda ns, m: _set(VF, "lstm", lambda self: None)),
    ("forwarded object's class loses the name", lambda ns, m: _delattr_undo(VF, "lstm")),
    ("an instance attribute on the forwarded object", lambda ns, m: _set(m.vf, "lstm", abs)),
    ("an instance attribute, same value", lambda ns, m: _set(m.vf, "lstm", len)),
    ("forwarded object swapped class", lambda ns, m: _swap_class(m.vf, SlottedVFLike)),
    (
        "class __getattr__ replaced",
        lambda ns, m: _set(ns["Forwarding"], "__getattr__", lambda self, name: abs),
    ),
    ("class __getattr__ other body", lambda ns, m: _set(ns["Forwarding"], "__getattr__", ns["other_body"])),
    (
        "__code__ replaced",
        lambda ns, m: _set_code(ns["Forwarding"].__getattr__, ns["Shifted"].__getattr__.__code__),
    ),
    (
        "__code__ replaced, other attr",
        lambda ns, m: _set_code(ns["Forwarding"].__getattr__, ns["other_body"].__code__),
    ),
    ("a global getattr in its module", lambda ns, m: _set_item(ns, "getattr", lambda o, n: abs)),
    ("a global getattr, same answer", lambda ns, m: _set_item(ns, "getattr", builtins.getattr)),
    ("getattr in its builtins", lambda ns, m: _set_item(ns["__builtins__"], "getattr", lambda o, n: abs)),
    ("getattr deleted from its builtins", lambda ns, m: _pop_undo(ns["__builtins__"], "getattr")),
    ("lstm in the module dict", lambda ns, m: _set_item(m.__dict__, "lstm", abs)),
    ("lstm in the module dict, same value", lambda ns, m: _set_item(m.__dict__, "lstm", len)),
    (
        "PEP 562 __getattr__ in the module dict",
        lambda ns, m: _set_item(m.__dict__, "__getattr__", lambda n: abs),
    ),
    ("a spec that is not None", lambda ns, m: _set_item(m.__dict__, "__spec__", types.SimpleNamespace())),
    ("a non-str key in the module dict", lambda ns, m: _set_item(m.__dict__, 1, 2)),
    ("a class attribute lstm", lambda ns, m: _set(ns["Forwarding"], "lstm", abs)),
    ("a data descriptor vf on the class", lambda ns, m: _set(ns["Forwarding"], "vf", _DataVF())),
    ("a non-data descriptor vf on the class", lambda ns, m: _set(ns["Forwarding"], "vf", _NonDataVF())),
    (
        "__getattribute__ on the class",
        lambda ns, m: _set(ns["Forwarding"], "__getattribute__", lambda self, n: abs),
    ),
]


class SlottedVFLike:
    lstm = staticmethod(abs)


def _swap_class(obj: Any, cls: type) -> Callable[[], None]:
    old = obj.__class__
    obj.__class__ = cls
    return lambda: setattr(obj, "__class__", old)


def _delattr_undo(cls: type, name: str) -> Callable[[], None]:
    old = cls.__dict__[name]
    delattr(cls, name)
    return lambda: setattr(cls, name, old)


def _pop_undo(d: dict, key: str) -> Callable[[], None]:
    old = d.pop(key)
    return lambda: d.__setitem__(key, old)


def _set_code(fn: Any, code: Any) -> Callable[[], None]:
    old = fn.__code__
    fn.__code__ = code
    return lambda: setattr(fn, "__code__", old)


@pytest.mark.parametrize("what,attack", ATTACKS, ids=[w for w, _ in ATTACKS])
def test_each_attack_decides_as_getattr(what: str, attack: Callable) -> None:
    ns = namespace()
    m = module(ns)
    gs = guard_set(m)
    assert agrees(gs, m) is True  # learnt
    undo = attack(ns, m)
    try:
        agrees(gs, m)
    finally:
        undo()
    assert agrees(gs, m) is True, f"after undoing {what}"
    if what != "a non-str key in the module dict":  # its table stays general: the call decides
        assert gs._last_fast_guards == len(gs), what


def test_attacks_that_must_fail() -> None:
    """The attacks that change the answer do fail (the parametrized test compares with getattr;
    this one pins that they reach the guard)."""
    failing = 0
    for what, attack in ATTACKS:
        ns = namespace()
        m = module(ns)
        gs = guard_set(m)
        assert gs.check({}) is True
        undo = attack(ns, m)
        try:
            if not gs.check({}):
                failing += 1
                try:
                    assert getattr(m, "lstm", None) is not len, what
                except (RecursionError, NameError):
                    pass  # getattr raises: a failure
        finally:
            undo()
    assert failing >= 18


def test_the_real_builtins_getattr_replaced_and_restored() -> None:
    """The function's builtins are the real builtins module's dict (a class defined in a normal
    module): a `getattr` put there is what the body calls."""

    class Real(types.ModuleType):
        def __getattr__(self, name: str) -> Any:
            return getattr(self.vf, name)

    m = Real("real_vf")
    m.vf = VF()
    gs = guard_set(m)
    assert agrees(gs, m) is True
    # This module's globals: a global `getattr` here shadows the builtin for the method.
    g = globals()
    g["getattr"] = lambda o, n, *d: abs
    try:
        assert agrees(gs, m) is False
    finally:
        del g["getattr"]
    assert agrees(gs, m) is True
    undo = _real_builtin_getattr(lambda o, n, *d: abs)
    try:
        want = Real.__getattr__(m, "lstm") is len
        assert want is False
        for _ in range(3):
            assert gs.check({}) is want
    finally:
        undo()
    assert agrees(gs, m) is True


def test_other_bodies_are_called() -> None:
    """A different body is never read as the forwarding one: its own answer, each check."""
    ns = namespace()
    shifted = module(ns, "Shifted")
    gs = guard_set(shifted, value=max)  # Shifted reads `lstm_`: max
    assert agrees(gs, shifted, value=max) is True
    VF.lstm_ = staticmethod(len)
    try:
        assert agrees(gs, shifted, value=max) is False
    finally:
        VF.lstm_ = staticmethod(max)
    assert agrees(gs, shifted, value=max) is True
    defaulted = module(ns, "Defaulted")
    gs3 = guard_set(defaulted, name="missing_name", value=len)
    assert agrees(gs3, defaulted, name="missing_name", value=len) is True


def test_forwarded_objects_of_other_kinds() -> None:
    """Slots (no instance dict), a plain class value, a missing name, and a forwarded object whose
    class runs user code for the read."""
    ns = namespace()
    m = module(ns, vf=SlottedVF())
    gs = guard_set(m)
    assert agrees(gs, m) is True
    assert gs._last_fast_guards == len(gs)
    m2 = module(ns)
    gs2 = guard_set(m2, name="plain", value=len)
    assert agrees(gs2, m2, name="plain", value=len) is True
    assert gs2._last_fast_guards == len(gs2)
    reads: list[str] = []

    class Loud:
        def __getattribute__(self, name: str) -> Any:
            reads.append(name)
            return len

    m3 = module(ns, vf=Loud())
    gs3 = guard_set(m3)
    reads.clear()
    assert agrees(gs3, m3) is True
    assert reads == ["lstm"] * 5  # getattr, the oracle, three checks: each check reads it


def test_many_names_and_modules_share_the_table() -> None:
    """More (module, name) pairs than the learnt table holds: each check still decides right."""
    ns = namespace()
    mods = [module(ns) for _ in range(3)]
    sets = [
        (m, n, guard_set(m, n, v)) for m in mods for n, v in (("lstm", len), ("gru", abs), ("plain", len))
    ]
    for _ in range(3):
        for m, n, gs in sets:
            assert gs.check({}) is True
    VF.gru = staticmethod(len)
    try:
        for m, n, gs in sets:
            assert gs.check({}) is (n != "gru")
    finally:
        VF.gru = staticmethod(abs)
    for m, n, gs in sets:
        assert gs.check({}) is True


def test_collections_inside_learning_mutate_what_it_learns() -> None:
    """A collection can run inside any allocation of the learning (the bytecode read, a class's
    version tag): objects dying there swap the forwarded object, the class's __getattr__ and the
    module dict. Each check answers as getattr did before or after, and later ones as getattr."""
    import gc

    ns = namespace()
    hook = ns["Forwarding"].__dict__["__getattr__"]
    mutations: list[Callable[[Any], None]] = [
        lambda m: setattr(m, "vf", types.SimpleNamespace(lstm=abs)),
        lambda m: setattr(ns["Forwarding"], "__getattr__", lambda self, n: abs),
        lambda m: m.__dict__.__setitem__("lstm", abs),
        lambda m: setattr(hook, "__code__", ns["other_body"].__code__),
    ]

    class Dying:
        def __init__(self, m: Any, mutate: Callable[[Any], None]) -> None:
            self.m, self.mutate, self.cycle = m, mutate, self

        def __del__(self) -> None:
            self.mutate(self.m)

    old = gc.get_threshold()
    try:
        for mutate in mutations:
            ns["Forwarding"].__getattr__ = hook
            hook.__code__ = namespace()["Forwarding"].__dict__["__getattr__"].__code__  # a new code object
            m = module(ns)
            gs = guard_set(m)
            Dying(m, mutate)
            gc.set_threshold(1)
            try:
                got = gs.check({})
            finally:
                gc.set_threshold(*old)
            gc.collect()
            assert got in (True, getattr(m, "lstm", None) is len)
            assert agrees(gs, m) is False
    finally:
        gc.set_threshold(*old)
        ns["Forwarding"].__getattr__ = hook


class _LyingGlobals(dict):
    """Globals of a dict subclass: the interpreter's LOAD_GLOBAL asks its __getitem__."""

    def __getitem__(self, key: Any) -> Any:
        if key == "getattr":
            return lambda o, n: abs
        return dict.__getitem__(self, key)


def test_globals_of_a_dict_subclass_are_asked() -> None:
    ns = namespace()
    code = ns["Forwarding"].__dict__["__getattr__"].__code__
    lying = types.FunctionType(code, _LyingGlobals(ns), "__getattr__")
    cls = type("LyingForwarding", (types.ModuleType,), {"__getattr__": lying})
    m = cls("lying_vf")
    m.vf = VF()
    b = tw.GuardBuilder({}, f_globals={"m": m})
    b.id_match("G['m'].lstm", abs)  # what the method answers: its globals' getattr
    gs = b.build()
    assert agrees(gs, m, value=abs) is True
    assert agrees(gs, m, value=abs) is True


def test_another_thread_flips_the_forwarded_value() -> None:
    """Checks while another thread replaces the forwarded class's value: each check answers
    True or False without error, and once the thread is done, as getattr."""
    import threading

    ns = namespace()
    m = module(ns)
    gs = guard_set(m)
    assert agrees(gs, m) is True
    stop = threading.Event()

    def flip() -> None:
        while not stop.is_set():
            VF.lstm = staticmethod(abs)
            VF.lstm = staticmethod(len)

    t = threading.Thread(target=flip)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    t.start()
    try:
        seen = {gs.check({}) for _ in range(5000)}
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(old)
        VF.lstm = staticmethod(len)
    assert seen <= {True, False}
    assert agrees(gs, m) is True
