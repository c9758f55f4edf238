"""Three attribute reads torch emits for a module class with its own ``__getattr__`` (a
``super().__getattr__`` call in it), read by the inline cache and the fast pass without user code
(cpp/runtime/eval/fetch.cpp): ``getattr(X, '__dict__')`` as the instance dict
(AttrCache::Mode::OwnDict), an attribute of a class whose metatype is ``type``
(Mode::ClassAttr), and ``X.name.__func__`` of a method the class binds, without the bound method
(FetchMethodFunc), plus ``cell_contents`` of a closure cell (Mode::CellContents). Each case
checks passing calls first, then changes that getattr sees (or that leave its answer the same),
decided four ways (engine_switches.agree_with_and_without_skip: the skip, no skip, the walk and
the reference)."""

from __future__ import annotations

import sys
import types
import warnings
from collections.abc import Callable
from typing import Any

import pytest

import tripwire as tw
from engine_switches import agree_with_and_without_skip as _decide
from engine_switches import fast_once as _fast_once
from engine_switches import fast_pass


def _guarded(f_locals: dict, src: str, value: Any = None, *, identity: bool = False) -> tuple[Any, list[Any]]:
    b = tw.GuardBuilder(f_locals)
    if identity:
        b.id_match(src)
    else:
        b.equals(src, value)
    gs = b.build()
    specs = list(gs.guards)
    for _ in range(3):
        assert _decide(gs, specs, f_locals) is True
    return gs, specs


class _Base:
    """nn.Module's shape: object.__getattribute__, and a class __getattr__ consulted on a miss."""

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(name)


def _alias_class() -> type:
    """A fresh class per test (class attributes are mutated), as torch models write one."""

    class Alias(_Base):
        aliases = {"proj": "lin"}
        gain = 1.5

        def __getattr__(self, name: str) -> Any:
            target = type(self).aliases.get(name)
            if target is not None:
                return super().__getattr__(target)
            return super().__getattr__(name)

        def meth(self) -> int:
            return 1

    return Alias


def _obj() -> tuple[type, Any, dict]:
    cls = _alias_class()
    o = cls()
    o.lin = 3
    return cls, o, {"o": o}


# --- every read is on the fast pass once the walk filled the caches -------------------------


@pytest.mark.parametrize(
    "src",
    [
        "getattr(L['o'], '__dict__')",
        "type(L['o']).aliases",
        "type(L['o']).__mro__[1].__getattr__",
        "type(L['o']).__mro__[1].__getattr__.__code__",
        "L['o'].__getattr__.__func__",
        "getattr(L['o'].__getattr__.__func__, '__closure__')[0].cell_contents",
        "L['o'].meth.__func__",
    ],
)
def test_torch_sources_are_read_on_the_fast_pass(src: str) -> None:
    _, _, f_locals = _obj()
    gs, _ = _guarded(f_locals, src, identity=True)
    assert _fast_once(gs, f_locals)


def test_the_fast_reads_are_what_getattr_returns() -> None:
    cls, o, f_locals = _obj()
    for src, want in [
        ("getattr(L['o'], '__dict__')", o.__dict__),
        ("type(L['o']).aliases", cls.aliases),
        ("type(L['o']).__mro__[1].__getattr__", _Base.__getattr__),
        ("L['o'].__getattr__.__func__", cls.__getattr__),
        ("getattr(L['o'].__getattr__.__func__, '__closure__')[0].cell_contents", cls),
    ]:
        gs, _ = _guarded(f_locals, src, identity=True)
        assert _fast_once(gs, f_locals)
        b = tw.GuardBuilder(f_locals)
        b.id_match(src)
        assert b.build().guards[0].expected is want, src  # the builder reads the example as the check does


# --- getattr(X, '__dict__') ----------------------------------------------------------------------

DICT_CHANGES: list[tuple[str, Callable[[type, Any], None], bool]] = [
    ("an attribute set (same dict)", lambda cls, o: setattr(o, "x", 1), True),
    ("__dict__ replaced", lambda cls, o: setattr(o, "__dict__", {"lin": 3}), False),
    ("a class __getattribute__", lambda cls, o: setattr(cls, "__getattribute__", lambda s, n: {}), False),
    (
        "__class__ to a subclass with a __dict__ property",
        lambda cls, o: setattr(o, "__class__", type("D", (cls,), {"__dict__": property(lambda s: {})})),
        False,
    ),
    (
        "__getattr__ replaced (never reached)",
        lambda cls, o: setattr(cls, "__getattr__", lambda s, n: {}),
        True,
    ),
]


@pytest.mark.parametrize(
    ("mutate", "holds"), [(m, h) for _, m, h in DICT_CHANGES], ids=[n for n, _, _ in DICT_CHANGES]
)
def test_getattr_dict_after_a_change(mutate: Callable[[type, Any], None], holds: bool) -> None:
    cls, o, f_locals = _obj()
    gs, specs = _guarded(f_locals, "getattr(L['o'], '__dict__')", identity=True)
    mutate(cls, o)
    assert _decide(gs, specs, f_locals) is holds


def test_getattr_dict_of_a_class_with_a_dict_property() -> None:
    shown = {"lin": 3}
    cls = type("P", (_alias_class(),), {"__dict__": property(lambda s: shown)})
    o = cls()
    f_locals = {"o": o}
    gs, specs = _guarded(f_locals, "getattr(L['o'], '__dict__')", identity=True)
    assert specs[0].expected is shown
    o.x = 1  # the instance dict changes, not what the property shows
    assert _decide(gs, specs, f_locals) is True
    shown["lin"] = 4  # the same dict object: an identity guard still holds
    assert _decide(gs, specs, f_locals) is True


def test_getattr_dict_of_objects_whose_dict_is_made_on_demand() -> None:
    def f() -> None:
        pass

    class Err(Exception):
        pass

    e = Err()
    for obj in (f, e):  # a function's getter, and subtype_dict over BaseException's
        f_locals = {"o": obj}
        b = tw.GuardBuilder(f_locals)
        b.type_match("getattr(L['o'], '__dict__')")
        b.length("getattr(L['o'], '__dict__')", 0)
        gs = b.build()
        specs = list(gs.guards)
        for _ in range(3):
            assert _decide(gs, specs, f_locals) is True
        assert _fast_once(gs, f_locals)
        obj.x = 1
        assert _decide(gs, specs, f_locals) is False


def test_getattr_dict_of_a_class_is_its_mappingproxy() -> None:
    cls = _alias_class()
    f_locals = {"o": cls}
    b = tw.GuardBuilder(f_locals)
    b.type_match("getattr(L['o'], '__dict__')")
    gs = b.build()
    specs = list(gs.guards)
    assert specs[0].expected is types.MappingProxyType
    for _ in range(3):
        assert _decide(gs, specs, f_locals) is True


# --- an attribute of a class ---------------------------------------------------------------------


class _V:
    """A class attribute value of a mutable type (it may gain __get__)."""


CLASS_CHANGES: list[tuple[str, Callable[[type], None], bool]] = [
    ("reassigned", lambda cls: setattr(cls, "aliases", {"proj": "lin"}), False),
    ("deleted", lambda cls: delattr(cls, "aliases"), False),
    (
        "deleted, a base's of the same object",
        lambda cls: (setattr(_Base, "aliases", cls.aliases), delattr(cls, "aliases")),
        True,
    ),
    ("another attribute set", lambda cls: setattr(cls, "other", 1), True),
    ("a classmethod", lambda cls: setattr(cls, "aliases", classmethod(lambda c: 1)), False),
    (
        "a staticmethod of the same object",
        lambda cls: setattr(cls, "aliases", staticmethod(cls.aliases)),
        True,
    ),
    ("a property", lambda cls: setattr(cls, "aliases", property(lambda s: 1)), False),
]


@pytest.mark.parametrize(
    ("mutate", "holds"), [(m, h) for _, m, h in CLASS_CHANGES], ids=[n for n, _, _ in CLASS_CHANGES]
)
def test_class_attribute_after_a_change(mutate: Callable[[type], None], holds: bool) -> None:
    cls, _, f_locals = _obj()
    gs, specs = _guarded(f_locals, "type(L['o']).aliases", identity=True)
    try:
        mutate(cls)
        assert _decide(gs, specs, f_locals) is holds
    finally:
        if "aliases" in _Base.__dict__:
            del _Base.aliases


def test_class_attribute_descriptors_are_read_through_their_get() -> None:
    def sm() -> None:
        pass

    prop = property(lambda s: 1)
    cls = type("K", (), {"sm": staticmethod(sm), "prop": prop, "cm": classmethod(sm), "v": _V()})
    f_locals = {"o": cls()}
    gs, specs = _guarded(f_locals, "type(L['o']).sm", identity=True)
    assert specs[0].expected is sm
    gs2, specs2 = _guarded(f_locals, "type(L['o']).prop", identity=True)
    assert specs2[0].expected is prop
    gs3, specs3 = _guarded(f_locals, "type(L['o']).cm.__func__", identity=True)
    assert specs3[0].expected is sm
    gs4, specs4 = _guarded(f_locals, "type(L['o']).v", identity=True)
    assert _fast_once(gs4, f_locals)  # an object whose class has no __get__: the value itself
    _V.__get__ = lambda self, obj, owner: 5  # type: ignore[attr-defined]  # the value's class gains __get__
    try:
        assert _decide(gs4, specs4, f_locals) is False
    finally:
        del _V.__get__  # type: ignore[attr-defined]
    assert _decide(gs4, specs4, f_locals) is True
    assert _fast_once(gs4, f_locals)


def test_a_class_attribute_whose_class_base_gains_get() -> None:
    class VBase:
        pass

    class V(VBase):
        pass

    cls = type("K", (), {"v": V()})
    f_locals = {"o": cls()}
    gs, specs = _guarded(f_locals, "type(L['o']).v", identity=True)
    assert _fast_once(gs, f_locals)
    VBase.__get__ = lambda self, obj, owner: 5  # type: ignore[attr-defined]  # through V's MRO
    assert _decide(gs, specs, f_locals) is False
    del VBase.__get__  # type: ignore[attr-defined]
    assert _decide(gs, specs, f_locals) is True


def test_a_name_type_defines_is_types() -> None:
    cls, _, f_locals = _obj()
    gs, specs = _guarded(f_locals, "type(L['o']).__name__", "Alias")
    cls.__name__ = "Other"
    assert _decide(gs, specs, f_locals) is False
    gs2, specs2 = _guarded(f_locals, "type(L['o']).__doc__", cls.__doc__)
    cls.__doc__ = "changed"
    assert _decide(gs2, specs2, f_locals) is False


def test_a_metaclass_decides_first() -> None:
    class Meta(type):
        def __getattr__(cls, name: str) -> Any:
            return "from meta"

    cls = Meta("M", (), {"aliases": {"a": 1}})
    f_locals = {"o": cls()}
    gs, specs = _guarded(f_locals, "type(L['o']).aliases", {"a": 1})
    gs2, specs2 = _guarded(f_locals, "type(L['o']).missing", "from meta")
    Meta.aliases = property(lambda c: {"a": 2})  # type: ignore[attr-defined]  # a data descriptor wins
    assert _decide(gs, specs, f_locals) is False
    del Meta.aliases  # type: ignore[attr-defined]
    assert _decide(gs, specs, f_locals) is True
    Meta.__getattr__ = lambda c, n: "other"  # type: ignore[method-assign]
    assert _decide(gs2, specs2, f_locals) is False
    Meta.missing = "from meta"  # type: ignore[attr-defined]  # a non-data metatype attribute
    assert _decide(gs2, specs2, f_locals) is True


def test_a_base_method_read_through_the_mro() -> None:
    cls, _, f_locals = _obj()
    original = _Base.__getattr__
    gs, specs = _guarded(f_locals, "type(L['o']).__mro__[1].__getattr__", identity=True)
    gs2, specs2 = _guarded(f_locals, "type(L['o']).__mro__[1].__getattr__.__code__", identity=True)
    try:
        _Base.__getattr__ = lambda self, name: None  # type: ignore[method-assign]
        assert _decide(gs, specs, f_locals) is False
        assert _decide(gs2, specs2, f_locals) is False
    finally:
        _Base.__getattr__ = original  # type: ignore[method-assign]
    assert _decide(gs, specs, f_locals) is True
    cls.__bases__ = (type("B2", (), {}),)  # the MRO changes: __mro__[1] has no __getattr__
    assert _decide(gs, specs, f_locals) is False


def test_a_class_modified_past_its_version_tags() -> None:
    cls, _, f_locals = _obj()
    gs, specs = _guarded(f_locals, "type(L['o']).aliases", identity=True)
    assert _fast_once(gs, f_locals)
    for i in range(1100):
        cls.counter = i
        _ = cls.aliases  # a lookup gives the class a new tag: 3.13+ stop after 1000 (MAX_VERSIONS_PER_CLASS)
        if i % 100 == 0:
            assert _decide(gs, specs, f_locals) is True
    for _ in range(3):
        assert _decide(gs, specs, f_locals) is True
    if sys.version_info >= (3, 13):
        assert not _fast_once(gs, f_locals)  # no tag: the generic path decides, on every check
    cls.aliases = {"proj": "lin"}
    assert _decide(gs, specs, f_locals) is False


# --- X.name.__func__ -----------------------------------------------------------------------------


def _other(self: Any) -> int:
    return 2


METHOD_CHANGES: list[tuple[str, Callable[[type, Any], None], bool]] = [
    ("the method replaced", lambda cls, o: setattr(cls, "meth", _other), False),
    ("the method deleted", lambda cls, o: delattr(cls, "meth"), False),
    ("an instance entry", lambda cls, o: setattr(o, "meth", _other), False),
    (
        "an instance entry binding the same function",
        lambda cls, o: setattr(o, "meth", types.MethodType(cls.meth, 1)),
        True,
    ),
    ("a classmethod of the same function", lambda cls, o: setattr(cls, "meth", classmethod(cls.meth)), True),
    (
        "a staticmethod of the same function",
        lambda cls, o: setattr(cls, "meth", staticmethod(cls.meth)),
        False,
    ),
    ("a class __getattribute__", lambda cls, o: setattr(cls, "__getattribute__", lambda s, n: _other), False),
    (
        "__class__ to a subclass with a data descriptor",
        lambda cls, o: setattr(
            o, "__class__", type("S", (cls,), {"meth": property(lambda s: types.MethodType(_other, s))})
        ),
        False,
    ),
    (
        "__class__ to a subclass with the same method",
        lambda cls, o: setattr(o, "__class__", type("S", (cls,), {})),
        True,
    ),
]


@pytest.mark.parametrize(
    ("mutate", "holds"), [(m, h) for _, m, h in METHOD_CHANGES], ids=[n for n, _, _ in METHOD_CHANGES]
)
def test_method_function_after_a_change(mutate: Callable[[type, Any], None], holds: bool) -> None:
    cls, o, f_locals = _obj()
    gs, specs = _guarded(f_locals, "L['o'].meth.__func__", identity=True)
    assert _fast_once(gs, f_locals)
    mutate(cls, o)
    assert _decide(gs, specs, f_locals) is holds


def test_a_deleted_method_answered_by_getattr() -> None:
    cls, o, f_locals = _obj()
    meth = cls.meth
    gs, specs = _guarded(f_locals, "L['o'].meth.__func__", identity=True)
    del cls.meth
    cls.__getattr__ = lambda self, name: types.MethodType(meth, self)  # type: ignore[method-assign]
    assert _decide(gs, specs, f_locals) is True
    cls.__getattr__ = lambda self, name: types.MethodType(_other, self)  # type: ignore[method-assign]
    assert _decide(gs, specs, f_locals) is False


def test_a_guard_on_the_bound_method_keeps_both_steps() -> None:
    cls, o, f_locals = _obj()
    b = tw.GuardBuilder(f_locals)
    b.type_match("L['o'].meth")
    b.id_match("L['o'].meth.__func__")
    gs = b.build()
    specs = list(gs.guards)
    for _ in range(3):
        assert _decide(gs, specs, f_locals) is True
    cls.meth = _other
    assert _decide(gs, specs, f_locals) is False


def test_method_function_of_the_getattr_hook_itself() -> None:
    cls, o, f_locals = _obj()
    gs, specs = _guarded(f_locals, "L['o'].__getattr__.__func__", identity=True)
    o.__dict__["__getattr__"] = types.MethodType(_other, o)  # an instance entry wins
    assert _decide(gs, specs, f_locals) is False
    del o.__dict__["__getattr__"]
    assert _decide(gs, specs, f_locals) is True


# --- cell_contents -------------------------------------------------------------------------------


def test_cell_contents_after_a_change() -> None:
    cls, o, f_locals = _obj()
    src = "getattr(L['o'].__getattr__.__func__, '__closure__')[0].cell_contents"
    gs, specs = _guarded(f_locals, src, identity=True)
    cell = cls.__getattr__.__closure__[0]
    cell.cell_contents = int
    assert _decide(gs, specs, f_locals) is False
    del cell.cell_contents  # empty: getattr raises ValueError, the guard fails
    assert _decide(gs, specs, f_locals) is False
    cell.cell_contents = cls
    assert _decide(gs, specs, f_locals) is True
    assert _fast_once(gs, f_locals)


def test_a_residue_below_the_method_function_frees_the_method() -> None:
    """User code in a residue below the fused read deletes the method from the class and collects:
    the function the pass read is held along the path, and the check goes on with it."""
    import gc

    cls, o, f_locals = _obj()
    armed = [False]

    def drop(fn: Any) -> bool:
        if armed[0]:
            armed[0] = False
            del cls.meth
            gc.collect()
        return True

    code = cls.meth.__code__
    b = tw.GuardBuilder(f_locals)
    b.predicate(drop, source="L['o'].meth.__func__")
    b.id_match("L['o'].meth.__func__.__code__", code)
    gs = b.build()
    for _ in range(3):
        assert gs.check(f_locals) is True
    armed[0] = True
    assert gs.check(f_locals) is True  # read before the residue ran: the same function
    assert gs.check(f_locals) is False  # the method is gone
    with fast_pass(False):
        assert gs.check(f_locals) is False


def test_getattr_dict_that_is_a_dict_subclass() -> None:
    class D(dict):
        pass

    cls, o, f_locals = _obj()
    o.__dict__ = D(lin=3)
    b = tw.GuardBuilder(f_locals)
    b.type_match("getattr(L['o'], '__dict__')")
    gs = b.build()
    specs = list(gs.guards)
    assert specs[0].expected is D
    for _ in range(3):
        assert _decide(gs, specs, f_locals) is True
    assert _fast_once(gs, f_locals)
    o.__dict__ = {"lin": 3}
    assert _decide(gs, specs, f_locals) is False


def test_a_method_function_chain_of_two() -> None:
    """`X.name.__func__.__func__` (a method of a method): only the first `__func__` is fused; the
    second keeps a fetch of its own. Once `X.name` is the class's plain function again, its
    `__func__` has no `__func__`: the source is missing and the check fails."""
    cls, o, f_locals = _obj()
    o.meth = types.MethodType(types.MethodType(cls.meth, o), o)
    b = tw.GuardBuilder(f_locals)
    b.type_match("L['o'].meth.__func__.__func__")  # reads the value's type: a register never set would crash
    gs = b.build()
    specs = list(gs.guards)
    del o.meth  # the class's method: the fused read applies, and the next step is missing
    for _ in range(3):
        assert _decide(gs, specs, f_locals) is False


def test_a_class_namespace_with_a_colliding_non_str_key() -> None:
    """A key whose hash is the name's and whose __eq__ runs (and counts): the class dicts are not
    read by the cache (a lookup could run that __eq__); getattr decides, as the oracle does."""
    calls = [0]

    class Collider:
        def __hash__(self) -> int:
            return hash("aliases")

        def __eq__(self, other: object) -> bool:
            calls[0] += 1
            return False

    base = _alias_class()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # 3.13 warns of the non-str key
        cls = type("NonStr", (base,), {Collider(): 1, "aliases": {"proj": "lin"}})
    o = cls()
    f_locals = {"o": o}
    gs, specs = _guarded(f_locals, "type(L['o']).aliases", identity=True)
    cls.aliases = {"proj": "lin"}
    assert _decide(gs, specs, f_locals) is False


def test_a_class_body_entry_that_types_data_descriptor_hides() -> None:
    """`__name__ = 'fake'` in a class body sits in the class dict, but type's `__name__` getset (a
    data descriptor of the metatype) answers first: the name type defines is never read from the
    class's MRO."""
    cls = type("Real", (), {"__name__": "fake", "__qualname__": "Real"})
    assert cls.__dict__["__name__"] == "fake" and cls.__name__ == "Real"
    f_locals = {"o": cls()}
    gs, specs = _guarded(f_locals, "type(L['o']).__name__", "Real")
    gs2, specs2 = _guarded(f_locals, "getattr(type(L['o']), '__mro__')", identity=True)
    assert specs2[0].expected is cls.__mro__
    cls.__name__ = "Renamed"
    assert _decide(gs, specs, f_locals) is False
    assert _decide(gs2, specs2, f_locals) is True


def test_class_attribute_and_method_under_a_mutating_thread() -> None:
    """Another thread swaps the class attribute and the method while this one checks: each check
    answers (the GIL makes a check see one state), and once the thread stops the answer is the
    state's, four ways."""
    import threading

    cls, o, f_locals = _obj()
    first = cls.aliases
    meth = cls.meth
    gs, specs = _guarded(f_locals, "type(L['o']).aliases", identity=True)
    gs2, specs2 = _guarded(f_locals, "L['o'].meth.__func__", identity=True)
    stop = threading.Event()

    def mutate() -> None:
        i = 0
        while not stop.is_set():
            cls.aliases = first if i % 2 else {"proj": "lin"}
            cls.meth = meth if i % 3 else _other
            i += 1

    t = threading.Thread(target=mutate)
    t.start()
    try:
        answers = {gs.check(f_locals) for _ in range(20000)} | {gs2.check(f_locals) for _ in range(20000)}
    finally:
        stop.set()
        t.join()
    assert answers <= {True, False}
    cls.aliases = first
    cls.meth = meth
    assert _decide(gs, specs, f_locals) is True and _decide(gs2, specs2, f_locals) is True
    cls.aliases = {"proj": "lin"}
    cls.meth = _other
    assert _decide(gs, specs, f_locals) is False and _decide(gs2, specs2, f_locals) is False


# --- classes of other metaclasses, static methods, `__class__` -------------------------------
def test_a_class_attribute_under_a_metaclass() -> None:
    # A metaclass that keeps type's getattr (an autograd Function's FunctionMeta, ABCMeta): the
    # class's MRO decides while the metaclass's MRO does not define the name (its version tag).
    class Meta(type):
        pass

    class Meta2(type):
        pass

    cls = Meta("M", (), {"aliases": {"a": 1}})
    f_locals = {"o": cls()}
    gs, specs = _guarded(f_locals, "type(L['o']).aliases", {"a": 1})
    assert _fast_once(gs, f_locals)
    Meta.aliases = property(lambda c: {"a": 2})  # type: ignore[attr-defined]  # a data descriptor wins
    assert _decide(gs, specs, f_locals) is False
    del Meta.aliases  # type: ignore[attr-defined]
    assert _decide(gs, specs, f_locals) is True
    assert _fast_once(gs, f_locals)
    Meta.aliases = {"a": 3}  # type: ignore[attr-defined]  # a non-data one loses to the class's
    assert _decide(gs, specs, f_locals) is True
    del Meta.aliases  # type: ignore[attr-defined]
    Meta.__getattribute__ = lambda c, n: {"a": 4}  # type: ignore[method-assign,assignment]
    assert _decide(gs, specs, f_locals) is False
    del Meta.__getattribute__  # type: ignore[misc]
    assert _decide(gs, specs, f_locals) is True
    cls.__class__ = Meta2  # the class's metaclass reassigned: its own tag does not change
    assert _decide(gs, specs, f_locals) is True
    Meta2.aliases = property(lambda c: {"a": 5})  # type: ignore[attr-defined]
    assert _decide(gs, specs, f_locals) is False


def test_a_class_attribute_under_a_metaclass_with_only_getattr() -> None:
    # 3.11's EnumType defines __getattr__ only: CPython's hook runs type.__getattribute__ first.
    class Meta(type):
        def __getattr__(cls, name: str) -> Any:
            return "from meta"

    cls = Meta("E", (), {"A": 1})
    f_locals = {"o": cls()}
    gs, specs = _guarded(f_locals, "type(L['o']).A", 1)
    assert _fast_once(gs, f_locals)
    del cls.A
    assert _decide(gs, specs, f_locals) is False  # answered by the metaclass's __getattr__
    cls.A = 1
    assert _decide(gs, specs, f_locals) is True
    Meta.__getattribute__ = lambda c, n: 1 if n == "A" else type.__getattribute__(c, n)  # type: ignore[method-assign]
    assert _decide(gs, specs, f_locals) is True
    Meta.__getattribute__ = lambda c, n: 2 if n == "A" else type.__getattribute__(c, n)  # type: ignore[method-assign]
    assert _decide(gs, specs, f_locals) is False


def test_an_enum_member_and_a_static_method_are_read_on_the_fast_pass() -> None:
    import enum

    class Mode(enum.Enum):
        A = 1
        B = 2

    def act(t: Any) -> Any:
        return t

    cls = type("F", (), {"forward": staticmethod(act)})
    f_locals = {"o": cls(), "m": Mode.A}
    g = {"Mode": Mode}
    b = tw.GuardBuilder(f_locals, g)
    b.id_match("G['Mode'].A")
    b.id_match("type(L['o']).forward")
    gs = b.build()
    specs = list(gs.guards)
    assert specs[1].expected is act
    for _ in range(3):
        assert _decide(gs, specs, f_locals, g) is True
    assert _fast_once(gs, f_locals)
    cls.forward = staticmethod(lambda t: t)
    assert _decide(gs, specs, f_locals, g) is False
    cls.forward = staticmethod(act)
    assert _decide(gs, specs, f_locals, g) is True
    cls.forward = act  # the function itself: the same answer
    assert _decide(gs, specs, f_locals, g) is True
    cls.forward = classmethod(act)  # binds: another object
    assert _decide(gs, specs, f_locals, g) is False


def test_dunder_class_is_the_objects_type() -> None:
    cls, o, f_locals = _obj()
    gs, specs = _guarded(f_locals, "L['o'].__class__", identity=True)
    assert _fast_once(gs, f_locals)
    o.__class__ = type("Sub", (cls,), {})
    assert _decide(gs, specs, f_locals) is False
    o.__class__ = cls
    assert _decide(gs, specs, f_locals) is True
    # A class-defined __class__ (a property, found first): the generic path, which asks it.
    o.__class__ = type("Same", (cls,), {"__class__": property(lambda self: cls)})
    assert _decide(gs, specs, f_locals) is True
    o2 = cls()
    o2.__class__ = type("Lying", (cls,), {"__class__": property(lambda self: int)})
    assert _decide(gs, specs, {"o": o2}) is False
