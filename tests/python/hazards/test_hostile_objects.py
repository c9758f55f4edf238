"""Hostile objects: user code that raises, lies, mutates or frees things while a guard set checks.

Every test asserts the same three things, besides its own property:

* no crash (run under scripts/asan-tests to catch the silent kind: use-after-free, overflows);
* ``check`` returns a real bool and leaves no Python error behind (``sys.exc_info()`` is empty and
  the next plain statement runs; CPython itself turns "returned a result with an error set" into
  SystemError, so a leaked error would fail the call);
* no false pass: whenever the guarded property does not hold for what the engine saw, the answer
  is False, and the engine agrees with the oracle (tests/oracle/reference.py) where the comparison is meaningful
  (inputs are rebuilt fresh for each evaluator when user code has side effects).
"""

from __future__ import annotations

import collections.abc
import enum
import gc
import sys
import weakref

import pytest

import engine_switches
import reference
import tripwire as tw

# -- helpers ------------------------------------------------------------------------------------


def clean_check(gs: tw.GuardSet, f_locals) -> bool:
    """gs.check, asserting it returned a bool and left no exception behind."""
    r = gs.check(f_locals)
    assert type(r) is bool
    assert sys.exc_info() == (None, None, None)
    probe = [i * 2 for i in range(3)]  # the interpreter is in a sane state
    assert probe == [0, 2, 4]
    return r


def clean_why_not(gs: tw.GuardSet, f_locals):
    f = gs.why_not(f_locals)
    assert f is None or isinstance(f, tw.Failure)
    if f is not None:
        assert isinstance(f.reason, str) and f.reason
        assert isinstance(str(f), str)
    assert sys.exc_info() == (None, None, None)
    return f


def ref_check(gs: tw.GuardSet, f_locals, builder: tw.GuardBuilder | None = None) -> bool:
    g = builder.f_globals if builder is not None else None
    c = builder.f_closure if builder is not None else None
    return reference.check(gs.guards, f_locals, g, c)


def agree(gs: tw.GuardSet, make_locals, builder=None) -> bool:
    """Engine and reference on fresh inputs (user code may have side effects); both must agree,
    and why_not must be consistent with check."""
    got = clean_check(gs, make_locals())
    want = ref_check(gs, make_locals(), builder)
    assert got == want
    f = clean_why_not(gs, make_locals())
    assert (f is None) == got
    return got


class NS:
    """A plain attribute bag."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


class Boom(Exception):
    pass


class StrRaises(Exception):
    """An exception whose str() and repr() raise."""

    def __str__(self):
        raise RuntimeError("str of the exception raised")

    def __repr__(self):
        raise RuntimeError("repr of the exception raised")


class AttributeErrorSub(AttributeError):
    pass


def _recurse(n=0):
    return _recurse(n + 1)


# Exception makers: each raises inside user code run by the fetch.
RAISERS = {
    "ValueError": lambda: (_ for _ in ()).throw(ValueError("bad value")),
    "RuntimeError": lambda: (_ for _ in ()).throw(RuntimeError("bad runtime")),
    "TypeError": lambda: (_ for _ in ()).throw(TypeError("bad type")),
    "RecursionError": _recurse,
    "StopIteration": lambda: (_ for _ in ()).throw(StopIteration()),
    "ZeroDivisionError": lambda: 1 // 0,
    "str-raises": lambda: (_ for _ in ()).throw(StrRaises()),
    "AttributeError-subclass": lambda: (_ for _ in ()).throw(AttributeErrorSub("x")),
    "MemoryError": lambda: (_ for _ in ()).throw(MemoryError()),
}


def raise_(kind: str):
    RAISERS[kind]()
    raise AssertionError("unreachable")


# -- fetches that raise -------------------------------------------------------------------------


class Armed:
    """An object whose __getattr__ (for missing names) and property `p` raise once armed."""

    armed_with: str | None = None

    def __init__(self):
        self.plain = 1

    def __getattr__(self, name):
        if type(self).armed_with is not None:
            raise_(type(self).armed_with)
        return 1

    @property
    def p(self):
        if type(self).armed_with is not None:
            raise_(type(self).armed_with)
        return 1


@pytest.fixture
def armed():
    class A(Armed):
        pass

    yield A


@pytest.mark.parametrize("kind", sorted(RAISERS))
@pytest.mark.parametrize("attr", ["missing", "p"])
def test_getattr_and_property_raising_fail_the_guard(armed, kind, attr):
    o = armed()
    b = tw.GuardBuilder({"o": o, "n": 5})
    b.type_match("L['o']")
    b.equals(f"L['o'].{attr}")
    b.equals("L['o'].plain")
    b.equals("L['n']")
    gs = b.build()
    assert clean_check(gs, {"o": o, "n": 5})
    armed.armed_with = kind
    assert clean_check(gs, {"o": o, "n": 5}) is False
    assert ref_check(gs, {"o": o, "n": 5}) is False
    f = clean_why_not(gs, {"o": o, "n": 5})
    assert f.source == f"L['o'].{attr}"
    assert f.kind == "EQUALS_MATCH"
    fails = gs.failures({"o": o, "n": 5})
    assert [x.source for x in fails] == [f"L['o'].{attr}"]
    # The set still works, and passes once the object behaves.
    armed.armed_with = None
    assert clean_check(gs, {"o": o, "n": 5}) is True


@pytest.mark.parametrize("kind", sorted(RAISERS))
def test_getattribute_raising_on_everything(kind):
    class G:
        on = False

        def __getattribute__(self, name):
            if type(self).on:
                raise_(kind)
            return object.__getattribute__(self, name)

    g = G()
    g.x = 1
    b = tw.GuardBuilder({"g": g})
    b.type_match("L['g']")
    b.type_match("type(L['g'])")  # no attribute access: type() reads ob_type
    gs_type = b.build()
    b.equals("L['g'].x")
    gs_attr = b.build()
    G.on = True
    assert clean_check(gs_type, {"g": g}) is True
    assert clean_check(gs_attr, {"g": g}) is False
    assert clean_why_not(gs_attr, {"g": g}).source == "L['g'].x"


def test_hasattr_guard_with_hostile_getattr():
    class H:
        mode = "attr"

        def __getattr__(self, name):
            m = type(self).mode
            if m == "attr":
                raise AttributeError(name)
            if m == "attrsub":
                raise AttributeErrorSub(name)
            if m == "value":
                raise ValueError(name)
            return 42

    h = H()
    b = tw.GuardBuilder({"h": h})
    b.hasattr("L['h']", "cache", present=False)
    gs = b.build()
    for mode, want in [("attr", True), ("attrsub", True), ("value", False), ("lie", False)]:
        H.mode = mode
        assert clean_check(gs, {"h": h}) is want, mode
        assert ref_check(gs, {"h": h}) is want, mode


def test_item_fetch_on_hostile_mapping():
    class M:
        def __init__(self, exc):
            self.exc = exc

        def __getitem__(self, key):
            if self.exc is None:
                return 1
            raise self.exc

    b = tw.GuardBuilder({"m": M(None)})
    b.equals("L['m']['k']")
    gs = b.build()
    for exc in [KeyError("k"), IndexError(0), ValueError("v"), TypeError("t"), StrRaises()]:
        assert agree(gs, lambda: {"m": M(exc)}) is False
    assert agree(gs, lambda: {"m": M(None)}) is True


def test_f_locals_that_is_not_a_dict():
    b = tw.GuardBuilder({"x": 1})
    b.equals("L['x']")
    gs = b.build()

    class BadMapping(collections.abc.Mapping):
        def __getitem__(self, k):
            raise RuntimeError("no")

        def __iter__(self):
            return iter(())

        def __len__(self):
            return 0

    class LyingMapping(BadMapping):
        def __getitem__(self, k):
            return 1

    class DuckGetitem:  # __getitem__ alone: a list has one too, so it is not taken for locals
        def __getitem__(self, k):
            return 1

    class ClaimsDict:  # __class__ says dict: isinstance believes it, the read then fails cleanly
        @property
        def __class__(self):
            return dict

    # Not a mapping: a clean TypeError (no false answer, nothing left set).
    for bad in [None, 42, "x", [1], (1,), object(), DuckGetitem()]:
        for call in (gs.check, gs.why_not):
            with pytest.raises(TypeError, match="f_locals must be a dict"):
                call(bad)
            assert sys.exc_info() == (None, None, None)
    for bad in [BadMapping(), ClaimsDict()]:  # a mapping whose reads fail: the guard fails
        assert clean_check(gs, bad) is False
        assert clean_why_not(gs, bad) is not None
    assert clean_check(gs, LyingMapping()) is True  # a mapping answering 1 for 'x' is fine


# -- strict mode and BaseExceptions -----------------------------------------------------------


def test_strict_mode_error_carries_source_and_cause():
    seen = []

    class P:
        on = False

        @property
        def v(self):
            if P.on:
                e = ValueError("property exploded")
                seen.append(e)
                raise e
            return 1

    o = NS(inner=P())
    b = tw.GuardBuilder({"o": o})
    b.equals("L['o'].inner.v")
    gs = b.build(strict=True)
    assert clean_check(gs, {"o": o})
    P.on = True
    with pytest.raises(tw.GuardEvalError) as ei:
        gs.check({"o": o})
    assert "L['o'].inner.v" in str(ei.value)
    assert "property exploded" in str(ei.value)
    assert ei.value.__cause__ is seen[-1]
    # Not strict: the same input just fails.
    b2 = tw.GuardBuilder({"o": NS(inner=NS(v=1))})
    b2.equals("L['o'].inner.v")
    assert clean_check(b2.build(), {"o": o}) is False


def test_strict_mode_with_exception_whose_str_raises():
    class P:
        on = False

        def __getattr__(self, name):
            if P.on:
                raise StrRaises()
            return 1

    p = P()
    b = tw.GuardBuilder({"p": p})
    b.equals("L['p'].q")
    gs = b.build(strict=True)
    P.on = True
    with pytest.raises(tw.GuardEvalError) as ei:
        gs.check({"p": p})
    assert "L['p'].q" in str(ei.value)
    assert type(ei.value.__cause__) is StrRaises
    # and the non-strict failure message survives the hostile __str__
    gs2 = tw.GuardSet(b.guards)
    f = clean_why_not(gs2, {"p": p})
    assert f.source == "L['p'].q" and "StrRaises" in f.reason


def test_strict_mode_lambda_and_len_errors():
    seen = []

    def pred(v):
        if v == 2:
            e = LookupError("predicate failed loudly")
            seen.append(e)
            raise e
        return True

    b = tw.GuardBuilder({"x": 1})
    b.predicate(pred, "loud", source="L['x']")
    gs = b.build(strict=True)
    assert clean_check(gs, {"x": 1}) is True
    with pytest.raises(tw.GuardEvalError) as ei:
        gs.check({"x": 2})
    assert "L['x']" in str(ei.value) and ei.value.__cause__ is seen[-1]
    assert clean_check(b.build(), {"x": 2}) is False  # not strict: a failed guard

    b = tw.GuardBuilder({"v": Len(3)})
    b.length("L['v']")
    gs = b.build(strict=True)
    with pytest.raises(tw.GuardEvalError) as ei:
        gs.check({"v": Len(ValueError("len exploded"))})
    assert "L['v']" in str(ei.value) and type(ei.value.__cause__) is ValueError
    # Not an error in strict mode either: a guard that simply does not hold.
    assert clean_check(gs, {"v": Len(4)}) is False

    def raises_on_example(v):
        raise LookupError("raises on its own example")

    b = tw.GuardBuilder({"x": 1})
    b.predicate(raises_on_example, "loud", source="L['x']")
    with pytest.raises(tw.GuardBuildError) as ei:
        b.build(strict=True)
    assert type(ei.value.__cause__) is tw.GuardEvalError


class KIOnAttr:
    on = False

    def __getattr__(self, name):
        if KIOnAttr.on:
            raise KeyboardInterrupt
        return 1


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit, GeneratorExit])
def test_base_exceptions_propagate(strict, exc):
    class A:
        on = False

        def __getattr__(self, name):
            if A.on:
                raise exc()
            return 1

    a = A()
    b = tw.GuardBuilder({"a": a, "x": 1})
    b.equals("L['x']")
    b.equals("L['a'].y")
    b.equals("L['a'].z")
    gs = b.build(strict=strict)
    A.on = True
    with pytest.raises(exc):
        gs.check({"a": a, "x": 1})
    with pytest.raises(exc):
        gs.why_not({"a": a, "x": 1})
    with pytest.raises(exc):
        gs.failures({"a": a, "x": 1})
    # Not swallowed, not left behind, and the set is still usable.
    assert sys.exc_info() == (None, None, None)
    A.on = False
    assert clean_check(gs, {"a": a, "x": 1}) is True
    assert clean_check(gs, {"a": a, "x": 2}) is False
    assert "EQUALS_MATCH" in gs.explain()


@pytest.mark.parametrize(
    "where",
    ["len", "lambda", "probe", "key_eq", "bool"],
)
def test_keyboard_interrupt_from_every_kind_of_user_code(where):
    state = {"on": False}

    def maybe():
        if state["on"]:
            raise KeyboardInterrupt

    class L:
        def __len__(self):
            maybe()
            return 2

    class Truth:
        def __bool__(self):
            maybe()
            return True

    class Key:
        def __hash__(self):
            return hash("k")

        def __eq__(self, other):
            maybe()
            return False

    if where == "len":
        b = tw.GuardBuilder({"v": L()})
        b.length("L['v']")
    elif where == "lambda":
        b = tw.GuardBuilder({"v": 1})
        b.predicate(lambda v: maybe() or True, "maybe", source="L['v']")
    elif where == "probe":
        b = tw.GuardBuilder({"v": 1})
        b.global_state(lambda: maybe() or 7, name="probe")
    elif where == "key_eq":
        b = tw.GuardBuilder({"v": {Key(): 0}})
        b.dict_contains("L['v']", "k", present=False)
    else:
        b = tw.GuardBuilder({"v": 1})
        b.predicate(lambda v: Truth(), "truthy", source="L['v']")
    gs = b.build()
    f_locals = b.f_locals
    assert clean_check(gs, f_locals) is True
    state["on"] = True
    with pytest.raises(KeyboardInterrupt):
        gs.check(f_locals)
    with pytest.raises(KeyboardInterrupt):
        gs.why_not(f_locals)
    state["on"] = False
    assert clean_check(gs, f_locals) is True


def test_adaptive_order_still_works_after_an_interrupt():
    """An escaping BaseException must not leave the set thinking a walk is still in progress
    (which would freeze the adaptive order of a node's children)."""
    o = KIOnAttr()
    o.x, o.y = 1, 2
    b = tw.GuardBuilder({"o": o})
    b.equals("L['o'].q")  # served by __getattr__, which raises KeyboardInterrupt when on
    b.equals("L['o'].x")
    b.equals("L['o'].y")
    gs = b.build()

    def children():
        return [t[1] for t in gs._tree() if t[0] == 1]

    KIOnAttr.on = True
    try:
        for _ in range(3):
            with pytest.raises(KeyboardInterrupt):
                gs.check({"o": o})
    finally:
        KIOnAttr.on = False
    assert children() == ["L['o'].q", "L['o'].x", "L['o'].y"]
    o.y = 3
    for _ in range(10):
        assert clean_check(gs, {"o": o}) is False
    assert children()[0] == "L['o'].y", children()  # the often-failing child moved to the front
    assert clean_why_not(gs, {"o": o}).source == "L['o'].y"


# -- __eq__ / __hash__ / __len__ / __bool__ / __repr__ that lie or raise ------------------------

EQ_CALLS: list[str] = []


class LyingInt(int):
    def __eq__(self, other):
        EQ_CALLS.append("int")
        return True

    __hash__ = int.__hash__


class LyingStr(str):
    def __eq__(self, other):
        EQ_CALLS.append("str")
        return True

    __hash__ = str.__hash__


class LyingFloat(float):
    def __eq__(self, other):
        EQ_CALLS.append("float")
        return True

    __hash__ = float.__hash__


class LyingBytes(bytes):
    def __eq__(self, other):
        EQ_CALLS.append("bytes")
        return True

    __hash__ = bytes.__hash__


class LyingList(list):
    def __eq__(self, other):
        EQ_CALLS.append("list")
        return True

    def __len__(self):
        EQ_CALLS.append("list.__len__")
        return 99


class LyingTuple(tuple):
    def __eq__(self, other):
        EQ_CALLS.append("tuple")
        return True

    __hash__ = tuple.__hash__


class LyingDict(dict):
    def __eq__(self, other):
        EQ_CALLS.append("dict")
        return True

    def __len__(self):
        EQ_CALLS.append("dict.__len__")
        return 0


class EqAlways:
    def __eq__(self, other):
        EQ_CALLS.append("object")
        return True

    def __hash__(self):
        EQ_CALLS.append("object.__hash__")
        return 0


class Color(enum.Enum):
    RED = 1
    GREEN = 2


EQUALS_CASES = [
    (3, lambda: LyingInt(3)),
    (3, lambda: LyingInt(4)),
    ("a", lambda: LyingStr("a")),
    (1.5, lambda: LyingFloat(1.5)),
    (float("nan"), lambda: LyingFloat("nan")),
    (b"x", lambda: LyingBytes(b"x")),
    ([1, 2], lambda: LyingList([1, 2])),
    ((1, 2), lambda: LyingTuple((1, 2))),
    ((1, 2), lambda: (1, LyingInt(2))),
    ([1, [2]], lambda: [1, LyingList([2])]),
    ({"a": 1}, lambda: LyingDict(a=1)),
    ({"a": 1}, lambda: {"a": LyingInt(1)}),
    ({"a": 1, "b": 2}, lambda: {LyingStr("a"): 1, "b": 2}),
    ({"a": 1, "b": 2}, lambda: {"b": 2, LyingStr("a"): 1}),
    (frozenset({1, 2}), lambda: frozenset({1, LyingInt(2)})),
    ({1, 2}, lambda: {LyingInt(1), 2}),
    (slice(1, 2), lambda: slice(LyingInt(1), 2)),
    (None, lambda: EqAlways()),
    (True, lambda: LyingInt(1)),
    (1, lambda: True),
    (Color.RED, lambda: EqAlways()),
    ((Color.RED, 1), lambda: (EqAlways(), 1)),
    ({"k": Color.RED}, lambda: {"k": EqAlways()}),
]


@pytest.mark.parametrize("const,make", EQUALS_CASES, ids=[f"{c!r}" for c, _ in EQUALS_CASES])
def test_equals_never_calls_user_eq(const, make):
    b = tw.GuardBuilder({"v": const})
    b.equals("L['v']")
    gs = b.build()
    value = make()
    EQ_CALLS.clear()
    assert clean_check(gs, {"v": value}) is False
    assert clean_why_not(gs, {"v": value}).kind == "EQUALS_MATCH"
    assert gs.failures({"v": value})
    assert EQ_CALLS == [], "EQUALS_MATCH ran a user __eq__/__hash__/__len__"
    assert ref_check(gs, {"v": value}) is False


def test_equals_dict_of_enum_keys_never_hashes_user_enum():
    calls = []

    class E(enum.Enum):
        A = 1
        B = 2

        def __hash__(self):
            calls.append("hash")
            return hash(self._name_)

        def __eq__(self, other):
            calls.append("eq")
            return self is other

    b = tw.GuardBuilder({"d": {E.A: 1, E.B: 2}})
    b.equals("L['d']")
    gs = b.build()
    same, reordered, wrong = {E.A: 1, E.B: 2}, {E.B: 2, E.A: 1}, {E.B: 1, E.A: 2}
    other = {E.A: 1, 7: 2}
    calls.clear()
    assert clean_check(gs, {"d": same}) is True
    assert clean_check(gs, {"d": reordered}) is True  # dict equality ignores order
    assert clean_check(gs, {"d": wrong}) is False
    assert clean_check(gs, {"d": other}) is False
    assert calls == []
    assert ref_check(gs, {"d": reordered}) is True
    assert ref_check(gs, {"d": wrong}) is False


def test_id_and_type_match_never_call_user_code():
    calls = []

    class Meta(type):
        def __eq__(cls, other):
            calls.append("meta.eq")
            return True

        def __hash__(cls):
            calls.append("meta.hash")
            return 0

        def __instancecheck__(cls, obj):
            calls.append("instancecheck")
            return True

        def __subclasscheck__(cls, sub):
            calls.append("subclasscheck")
            return True

        def __getattr__(cls, name):
            calls.append(f"meta.getattr {name}")
            raise AttributeError(name)

    class K(metaclass=Meta):
        def __eq__(self, other):
            calls.append("eq")
            return True

        def __hash__(self):
            calls.append("hash")
            return 0

    k = K()
    b = tw.GuardBuilder({"k": k})
    b.type_match("L['k']")
    b.id_match("L['k']")
    gs = b.build()
    calls.clear()
    assert isinstance(3, K)  # the metaclass lies to isinstance...
    calls.clear()
    assert clean_check(gs, {"k": 3}) is False  # ...but not to type(v) is K
    assert clean_check(gs, {"k": K()}) is False  # another instance: ID_MATCH fails
    assert clean_check(gs, {"k": k}) is True
    assert calls == []
    assert ref_check(gs, {"k": 3}) is False


def test_class_property_lying_about_its_class():
    class Liar:
        @property
        def __class__(self):
            return int

    liar = Liar()
    assert isinstance(liar, int)
    b = tw.GuardBuilder({"v": 3})
    b.type_match("L['v']")
    gs = b.build()
    assert clean_check(gs, {"v": liar}) is False
    assert ref_check(gs, {"v": liar}) is False


class Len:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        n = self.n
        if isinstance(n, BaseException):
            # A fresh instance: raising the shared parametrize value would pin this frame (and
            # the guard set in it) to its __traceback__ for the rest of the session.
            raise type(n)(*n.args)
        return n


@pytest.mark.parametrize(
    "n,want",
    [
        (3, True),
        (4, False),  # a lie is still what len() says: the guard is len(v) == 3
        (-1, False),  # ValueError from len()
        (2**100, False),  # OverflowError
        ("3", False),  # TypeError
        (3.0, False),  # TypeError
        (ValueError("len"), False),
        (StrRaises(), False),
        (RecursionError(), False),
    ],
)
def test_length_with_lying_or_raising_len(n, want):
    b = tw.GuardBuilder({"v": Len(3)})
    b.length("L['v']")
    gs = b.build()
    assert agree(gs, lambda: {"v": Len(n)}) is want


def test_length_of_list_subclass_uses_its_len():
    b = tw.GuardBuilder({"v": [1, 2, 3]})
    b.length("L['v']")
    gs = b.build()
    EQ_CALLS.clear()
    assert agree(gs, lambda: {"v": LyingList([1, 2, 3])}) is False  # its __len__ says 99
    b.type_match("L['v']")
    gs2 = b.build()
    assert clean_check(gs2, {"v": LyingList([1, 2, 3])}) is False


@pytest.mark.parametrize(
    "result,want",
    [
        (True, True),
        (1, True),
        ([0], True),
        ([], False),
        (None, False),
        ("bool-raises", False),
        ("bool-returns-int", False),
        ("len-raises", False),
    ],
)
def test_lambda_result_truthiness(result, want):
    calls = []

    class BoolRaises:
        def __bool__(self):
            calls.append("bool")
            raise ValueError("no truth")

    class BoolInt:
        def __bool__(self):
            calls.append("bool")
            return 1  # TypeError: __bool__ should return bool

    class LenRaises:
        def __len__(self):
            calls.append("len")
            raise ValueError("no len")

    special = {"bool-raises": BoolRaises, "bool-returns-int": BoolInt, "len-raises": LenRaises}
    state = {"result": True}
    b2 = tw.GuardBuilder({"x": 1})

    def pred(v):
        r = state["result"]
        return special[r]() if isinstance(r, str) else r

    b2.predicate(pred, "pred", source="L['x']")
    gs = b2.build()
    state["result"] = result
    assert clean_check(gs, {"x": 1}) is want
    if isinstance(result, str):
        assert len(calls) == 1  # the result's truth is asked once
    assert ref_check(gs, {"x": 1}) is want


def test_hostile_repr_in_failures_and_explain():
    class BadRepr:
        def __repr__(self):
            raise RuntimeError("repr exploded")

    class NotStrRepr:
        def __repr__(self):
            return 42

    class Meta(type):
        def __getattribute__(cls, name):
            raise RuntimeError("metaclass getattribute")

        def __repr__(cls):
            raise RuntimeError("metaclass repr")

    class K(metaclass=Meta):
        pass

    objs = [BadRepr(), NotStrRepr(), K()]
    b = tw.GuardBuilder({"a": objs[0], "b": objs[1], "k": objs[2], "x": 1})
    b.id_match("L['a']")
    b.id_match("L['b']")
    b.type_match("L['k']")
    b.id_match("L['k']")
    b.equals("L['x']")
    gs = b.build()
    bad = {"a": BadRepr(), "b": NotStrRepr(), "k": BadRepr(), "x": BadRepr()}
    assert clean_check(gs, bad) is False
    fails = gs.failures(bad)
    assert [f.source for f in fails] == ["L['a']", "L['b']", "L['k']", "L['k']", "L['x']"]
    for f in fails:
        assert isinstance(f.reason, str)
    assert isinstance(gs.explain(), str)
    assert isinstance(repr(gs), str)


def test_dict_contains_key_with_hostile_repr():
    class Key:
        def __repr__(self):
            raise RuntimeError("repr exploded")

    key = Key()
    b = tw.GuardBuilder({"d": {}})
    b.dict_contains("L['d']", key, present=False)
    gs = b.build()
    assert clean_check(gs, {"d": {key: 1}}) is False
    f = clean_why_not(gs, {"d": {key: 1}})
    assert f.kind == "DICT_CONTAINS"
    assert isinstance(gs.explain(), str)


# -- hashing: raising hashes and colliding keys that mutate the dict --------------------------


class Collider:
    """A dict key whose hash equals hash(target) and whose __eq__ runs `action` (once armed; the
    action is one-shot, so a dict operation inside it does not re-enter it)."""

    def __init__(self, target, action=None, answer=False):
        self.target = target
        self.action = action
        self.answer = answer
        self.calls = 0

    def __hash__(self):
        return hash(self.target)

    def __eq__(self, other):
        if other is self:
            return True
        self.calls += 1
        action, self.action = self.action, None
        if action is not None:
            action()
        return self.answer


def test_colliding_key_clears_the_dict_during_lookup():
    b = tw.GuardBuilder({"d": {"k": 1}})
    b.type_match("L['d']")
    b.equals("L['d']['k']")
    gs = b.build()

    def make():
        d = {}
        d[Collider("k", action=d.clear)] = 0  # probed first: takes the primary slot
        return {"d": d}

    assert agree(gs, make) is False
    f_locals = make()
    (collider,) = f_locals["d"]
    assert clean_check(gs, f_locals) is False
    assert collider.calls == 1 and f_locals["d"] == {}


class Value:
    def __init__(self, n):
        self.n = n


@pytest.mark.parametrize("interned", [True, False])
@pytest.mark.parametrize("action", ["clear", "retype", "delete-and-free"])
def test_colliding_key_mutates_dict_that_contains_the_key(action, interned):
    """d = {collider: 0, 'key1': Value(1)}: looking up 'key1' meets the collider first, whose
    __eq__ mutates d. The engine may find the key without a lookup (an entry hint matching the
    interned key by identity) or by a real lookup; either way its answer must describe the dict it
    saw: if the collider ran, the key is gone or retyped and the guard fails; if it did not run,
    d['key1'] is Value(1) and the guard holds."""
    freed = []
    b = tw.GuardBuilder({"d": {"key1": Value(1)}})
    b.type_match("L['d']['key1']")  # nothing below runs user code: the value may be borrowed
    gs_type = b.build()
    b.equals("L['d']['key1'].n")  # an attribute read below: the value must be held
    gs_attr = b.build()
    for gs in (gs_type, gs_attr):
        for _ in range(3):  # later checks may take a learned fast path
            d = {}
            key = "key1" if interned else "".join(["ke", "y1"])  # equal, not identical

            def act(d=d, key=key):
                if action == "clear":
                    d.clear()
                elif action == "retype":
                    d[key] = "one"
                else:
                    v = d.pop(key)
                    weakref.finalize(v, freed.append, True)
                    del v
                    gc.collect()

            collider = Collider("key1")
            d[collider] = 0
            d[key] = Value(1)  # (this insertion calls collider.__eq__ too: not armed yet)
            collider.calls = 0
            collider.action = act
            freed.clear()
            r = clean_check(gs, {"d": d})
            assert r == (collider.calls == 0), (action, collider.calls, r)
            if not interned:
                assert collider.calls >= 1  # a real lookup ran the collider
            if action == "delete-and-free" and collider.calls:
                assert freed == [True]  # the value died mid-lookup and was never used
            collider.action = None


def test_colliding_key_that_claims_equality():
    b = tw.GuardBuilder({"d": {"k": 1}})
    b.equals("L['d']['k']")
    gs = b.build()
    # The collider says it *is* 'k': d['k'] is then its value, for the engine as for Python.
    assert agree(gs, lambda: {"d": {Collider("k", answer=True): 1}}) is True
    assert agree(gs, lambda: {"d": {Collider("k", answer=True): 2}}) is False


def test_colliding_key_in_f_locals_and_in_instance_dict():
    b = tw.GuardBuilder({"x": 1, "o": NS(a=1)})
    b.equals("L['x']")
    b.equals("L['o'].a")
    gs = b.build()

    def make_locals():
        f = {}
        f[Collider("x", action=f.clear)] = 0
        f["o"] = NS(a=1)
        return f

    assert agree(gs, make_locals) is False

    class S(str):
        def __eq__(self, other):
            self.owner.__dict__.clear()
            return False

        __hash__ = str.__hash__

    def make_obj():
        o = NS()
        s = S("a")
        s.owner = o
        o.__dict__[s] = 1  # an instance dict with a non-str-exact key, hash-equal to 'a'
        return {"x": 1, "o": o}

    assert agree(gs, make_obj) is False


def test_dict_contains_with_raising_and_mutating_colliders():
    b = tw.GuardBuilder({"d": {"k": 1}})
    b.dict_contains("L['d']", "k")
    gs = b.build()

    def raising():
        raise ValueError("eq exploded")

    assert agree(gs, lambda: {"d": {Collider("k", action=raising): 1}}) is False
    assert agree(gs, lambda: {"d": {Collider("k", action=lambda: None): 1}}) is False

    def make_clearing():
        d = {}
        d[Collider("k", action=d.clear)] = 1
        return {"d": d}

    assert agree(gs, make_clearing) is False


def test_hash_raising_key_constant():
    class Key:
        armed = False

        def __hash__(self):
            if Key.armed:
                raise TypeError("unhashable today")
            return 1

        def __eq__(self, other):
            return self is other

    key = Key()
    b = tw.GuardBuilder({"d": {key: 1}})
    b.dict_contains("L['d']", key)
    gs = b.build()
    assert clean_check(gs, {"d": {key: 1}}) is True
    Key.armed = True
    try:
        assert clean_check(gs, {"d": {}}) is False
        assert ref_check(gs, {"d": {}}) is False
        assert clean_why_not(gs, {"d": {}}).kind == "DICT_CONTAINS"
    finally:
        Key.armed = False


def test_dict_keys_on_subclass_never_calls_overrides():
    calls = []

    class D(dict):
        def keys(self):
            calls.append("keys")
            return ["a", "b"]

        def __iter__(self):
            calls.append("iter")
            return iter(["a", "b"])

        def items(self):
            calls.append("items")
            return []

        def __len__(self):
            calls.append("len")
            return 2

        def __getitem__(self, k):
            calls.append("getitem")
            return 0

        def __contains__(self, k):
            calls.append("contains")
            return True

        def __eq__(self, other):
            calls.append("eq")
            return True

        __hash__ = None

    b = tw.GuardBuilder({"d": {"a": 1, "b": 2}})
    b.dict_keys("L['d']")
    b.dict_contains("L['d']", "a")
    b.dict_contains("L['d']", "zz", present=False)
    gs = b.build()
    b2 = tw.GuardBuilder({"d": {"a": 1, "b": 2}})
    b2.dict_keys("L['d']", ordered=False)
    gs_unordered = b2.build()
    calls.clear()
    assert clean_check(gs, {"d": D(a=1, b=2)}) is True
    assert clean_check(gs, {"d": D(b=1, a=2)}) is False  # order differs
    assert clean_check(gs_unordered, {"d": D(b=1, a=2)}) is True
    assert clean_check(gs, {"d": D(a=1)}) is False  # its __len__ says 2; the dict has 1 key
    assert clean_check(gs, {"d": D(a=1, b=2, zz=3)}) is False
    assert clean_why_not(gs, {"d": D(a=1)}).kind == "DICT_KEYS"
    assert calls == []
    assert ref_check(gs, {"d": D(b=1, a=2)}) is False
    assert ref_check(gs_unordered, {"d": D(b=1, a=2)}) is True


def test_dict_item_step_never_calls_getitem_or_missing():
    calls = []

    class D(dict):
        def __getitem__(self, k):
            calls.append("getitem")
            return 1

        def __missing__(self, k):
            calls.append("missing")
            return 1

    b = tw.GuardBuilder({"d": {"k": 1}})
    b.equals("dict.__getitem__(L['d'], 'k')")
    gs = b.build()
    assert clean_check(gs, {"d": D(k=1)}) is True
    assert clean_check(gs, {"d": D()}) is False
    assert clean_check(gs, {"d": D(k=2)}) is False
    assert calls == []
    assert ref_check(gs, {"d": D()}) is False


def test_metaclass_getattr_on_class_sources():
    class Meta(type):
        mode = "value"

        def __getattr__(cls, name):
            m = Meta.mode
            if m == "value":
                return 5
            if m == "attr":
                raise AttributeError(name)
            raise RuntimeError("metaclass exploded")

    class K(metaclass=Meta):
        real = 1

    b = tw.GuardBuilder({"cls": K})
    b.equals("L['cls'].virtual")
    b.equals("L['cls'].real")
    gs = b.build()
    b2 = tw.GuardBuilder({"cls": K})
    b2.hasattr("L['cls']", "virtual")
    gs_has = b2.build()
    assert clean_check(gs, {"cls": K}) is True
    for mode in ["attr", "raise"]:
        Meta.mode = mode
        assert clean_check(gs, {"cls": K}) is False
        assert clean_check(gs_has, {"cls": K}) is False
        assert ref_check(gs, {"cls": K}) is False
        assert clean_why_not(gs, {"cls": K}).source == "L['cls'].virtual"
    Meta.mode = "value"
    assert clean_check(gs, {"cls": K}) is True


# -- user code that mutates or frees what is being guarded ------------------------------------


def test_predicate_mutates_the_list_being_guarded():
    # A node's own guards run before its children are fetched: a predicate on L['xs'] that
    # empties the list always makes L['xs'][0] fail.
    b = tw.GuardBuilder({"xs": [1, 2, 3]})
    b.predicate(lambda xs: xs.clear() or True, "clears", source="L['xs']")
    b.equals("L['xs'][0]")
    with pytest.raises(tw.GuardBuildError):
        b.build()  # it fails on its own example, which it empties
    gs = tw.GuardSet(b.guards)
    for _ in range(3):
        xs = [1, 2, 3]
        assert clean_check(gs, {"xs": xs}) is False
        assert xs == []
        assert ref_check(gs, {"xs": [1, 2, 3]}) is False


def test_predicate_on_another_root_mutates_the_list():
    """A predicate on L['a'] empties the list at L['xs']. Roots are evaluated in an adaptive
    order, so the predicate may run before or after the list is read; the answer must describe
    what the engine read: True exactly when every read of the list came before the clear."""
    log = []

    class LoggedList(list):
        def __len__(self):
            log.append("read")
            return list.__len__(self)

        def __getitem__(self, i):
            log.append("read")
            return list.__getitem__(self, i)

    box = {}

    def clear(a):
        box["xs"].clear()
        log.append("clear")
        return True

    b = tw.GuardBuilder({"a": 0, "xs": LoggedList([1, 2, 3])})
    b.predicate(clear, "clear xs", source="L['a']")
    b.length("L['xs']")
    b.equals("L['xs'][0]")
    gs = tw.GuardSet(b.guards)
    outcomes = set()
    for _ in range(8):
        xs = LoggedList([1, 2, 3])
        box["xs"] = xs
        log.clear()
        r = clean_check(gs, {"a": 0, "xs": xs})
        assert "clear" in log and xs == []
        assert r == (log[-1] == "clear"), log
        outcomes.add(r)
    assert False in outcomes  # the first check reads the roots in installation order


def test_predicate_frees_the_value_under_its_own_source():
    """A predicate on L['xs'] drops every other reference to the list, then the children of
    L['xs'] are fetched from it: the engine must hold it."""
    wr = []

    class Box(list):
        pass

    def pred(xs):
        f_locals.pop("xs", None)
        gc.collect()
        return True

    b2 = tw.GuardBuilder({"xs": Box([1, 2])})
    b2.predicate(pred, "frees", source="L['xs']")
    b2.equals("L['xs'][0]")
    b2.length("L['xs']")
    b2.equals("L['xs'][1]")
    f_locals = {"xs": Box([1, 2])}  # the predicate pops from whatever f_locals is now
    gs = b2.build()
    for _ in range(3):
        box = Box([1, 2])
        wr.append(weakref.ref(box))
        f_locals = {"xs": box}
        del box
        assert clean_check(gs, f_locals) is True
        assert "xs" not in f_locals
        gc.collect()
        assert wr[-1]() is None  # and it was not leaked


def test_getattr_deletes_the_parent_attribute_and_frees_it():
    freed = []

    class Child:
        def __init__(self, owner):
            self.owner = owner

        def __getattr__(self, name):
            owner = self.__dict__.pop("owner", None)
            if owner is not None:
                owner.__dict__.pop("child", None)  # drop the parent's reference to self
                gc.collect()
            return 1

    def make():
        o = NS()
        c = Child(o)
        o.child = c
        weakref.finalize(c, freed.append, 1)
        return {"o": o}

    b = tw.GuardBuilder({"o": NS(child=NS(b=1, c=1, d=1))})
    b.equals("L['o'].child.b")
    b.equals("L['o'].child.c")
    b.equals("L['o'].child.d")
    gs = b.build()
    for _ in range(3):
        freed.clear()
        f_locals = make()
        assert clean_check(gs, f_locals) is True  # every attribute read 1, from a live child
        assert not hasattr(f_locals["o"], "child")
        gc.collect()
        assert freed == [1]  # the child died after the check: no reference leaked
    # A fresh object now fails: o.child is gone.
    assert clean_check(gs, f_locals) is False


def test_getattr_frees_the_root_from_f_locals():
    class Root:
        def __getattr__(self, name):
            f_locals.clear()
            gc.collect()
            return 1

    b = tw.GuardBuilder({"r": NS(a=1, b=1), "z": 1})
    b.equals("L['r'].a")
    b.equals("L['r'].b")
    b.equals("L['z']")
    gs = b.build()
    f_locals = {"r": Root(), "z": 1}
    wr = weakref.ref(f_locals["r"])
    assert clean_check(gs, f_locals) is False  # L['z'] is gone by the time it is read
    gc.collect()
    assert wr() is None


def test_property_returns_a_fresh_object_whose_attribute_frees_it():
    class Inner:
        def __getattr__(self, name):
            return 1

    class Outer:
        @property
        def inner(self):
            return Inner()  # referenced only by the engine while it guards it

    b = tw.GuardBuilder({"o": NS(inner=NS(a=1, b=1))})
    b.equals("L['o'].inner.a")
    b.equals("L['o'].inner.b")
    b.type_match("L['o'].inner")
    gs = b.build()
    b2 = tw.GuardBuilder({"o": Outer()})
    b2.equals("L['o'].inner.a")
    b2.type_match("L['o'].inner")
    gs2 = b2.build()
    assert clean_check(gs, {"o": Outer()}) is False  # type(inner) is Inner, not NS
    for _ in range(3):
        assert clean_check(gs2, {"o": Outer()}) is True


def test_sourceless_predicate_mutates_f_locals():
    b = tw.GuardBuilder({"x": 1, "y": "s"})
    b.predicate(lambda f: True, "stub")
    b.type_match("L['x']")
    b.type_match("L['y']")
    gs_ok = b.build()
    assert clean_check(gs_ok, {"x": 1, "y": "s"}) is True

    def retype(f):
        f["x"] = "not an int"
        return True

    def clear(f):
        f.clear()
        gc.collect()
        return True

    for pred in (retype, clear):
        bb = tw.GuardBuilder({"x": 1, "y": "s"})
        bb.predicate(pred, pred.__name__)
        bb.type_match("L['x']")
        bb.type_match("L['y']")
        with pytest.raises(tw.GuardBuildError):
            bb.build()  # fails on its own example, which it mutates
        gs = tw.GuardSet(bb.guards)
        f_locals = {"x": 1, "y": "s"}
        assert clean_check(gs, f_locals) is False
        assert clean_check(gs, {"x": 1, "y": "s"}) is False
        assert ref_check(gs, {"x": 1, "y": "s"}) is False


def test_predicate_swaps_the_class_of_a_child_source():
    class A:
        pass

    class B:
        pass

    def swap(o):
        o.obj.__class__ = B
        return True

    b = tw.GuardBuilder({"o": NS(obj=A())})
    b.predicate(swap, "swap", source="L['o']")
    b.type_match("L['o'].obj")
    gs = tw.GuardSet(b.guards)  # not build(): the set fails on its own example by design
    for _ in range(3):
        o = NS(obj=A())
        assert clean_check(gs, {"o": o}) is False
        assert type(o.obj) is B
    assert ref_check(gs, {"o": NS(obj=A())}) is False


def test_inline_attribute_cache_sees_class_changes():
    class C:
        pass

    o = C()
    o.x = 1
    b = tw.GuardBuilder({"o": o})
    b.equals("L['o'].x")
    gs = b.build()
    for _ in range(3):
        assert clean_check(gs, {"o": o}) is True
    C.x = property(lambda self: 2)  # a data descriptor now shadows the instance dict
    assert clean_check(gs, {"o": o}) is False
    del C.x
    assert clean_check(gs, {"o": o}) is True
    C.__getattribute__ = lambda self, name: 5
    assert clean_check(gs, {"o": o}) is False
    del C.__getattribute__
    assert clean_check(gs, {"o": o}) is True
    C.__getattr__ = lambda self, name: 1
    del o.x
    assert clean_check(gs, {"o": o}) is True  # now served by __getattr__
    del C.__getattr__
    assert clean_check(gs, {"o": o}) is False
    o.__dict__ = {"x": 1}
    assert clean_check(gs, {"o": o}) is True
    o.__dict__ = {"x": 7}
    assert clean_check(gs, {"o": o}) is False

    class D:
        x = 1

    o.__class__ = D
    o.__dict__.clear()
    assert clean_check(gs, {"o": o}) is True  # class attribute
    D.x = 3
    assert clean_check(gs, {"o": o}) is False


def test_getattr_changes_the_class_during_the_check():
    """A fetch's user code adds a property to the class whose attribute a later node reads
    through the inline cache filled by earlier checks."""

    class C:
        def __getattr__(self, name):
            if name == "trigger" and C.arm:
                C.x = property(lambda self: 2)
            return 0

    C.arm = False
    o = C()
    o.x = 1
    b = tw.GuardBuilder({"o": o})
    b.equals("L['o'].trigger")
    b.equals("L['o'].x")
    gs = b.build()
    for _ in range(3):
        assert clean_check(gs, {"o": o}) is True
    C.arm = True
    assert clean_check(gs, {"o": o}) is False
    assert o.x == 2


def test_reentrant_check_from_user_code():
    depth = {"n": 0, "inner": []}

    class R:
        def __getattr__(self, name):
            if depth["n"] < 3:
                depth["n"] += 1
                depth["inner"].append(gs.check(f_locals))
                depth["inner"].append(gs.why_not(f_locals) is None)
            return 1

    b = tw.GuardBuilder({"r": NS(a=1), "x": 1})
    b.equals("L['r'].a")
    b.equals("L['x']")
    gs = b.build()
    f_locals = {"r": R(), "x": 2}
    assert clean_check(gs, f_locals) is False
    assert depth["inner"] and all(v is False for v in depth["inner"])
    f_locals = {"r": R(), "x": 1}
    depth["n"] = 0
    depth["inner"].clear()
    assert clean_check(gs, f_locals) is True
    assert all(v is True for v in depth["inner"])


def test_global_state_probe_hostility():
    state = {"mode": "ok"}

    def probe():
        m = state["mode"]
        if m == "ok":
            return 7
        if m == "raise":
            raise RuntimeError("probe exploded")
        if m == "subclass":
            return LyingInt(7)
        return 8

    b = tw.GuardBuilder({"x": 1})
    b.global_state(probe, name="p")
    gs = b.build()
    EQ_CALLS.clear()
    for mode, want in [("ok", True), ("raise", False), ("subclass", False), ("other", False)]:
        state["mode"] = mode
        assert clean_check(gs, {"x": 1}) is want, mode
        assert ref_check(gs, {"x": 1}) is want
    assert EQ_CALLS == []


def test_weakref_subclass_call_override_is_not_used():
    calls = []

    class R(weakref.ref):
        def __call__(self):
            calls.append("call")
            return None

    class T:
        pass

    t = T()
    b = tw.GuardBuilder({"w": weakref.ref(t)})
    b.weakref_alive("L['w']")
    b.type_match("L['w']()")
    gs = b.build()
    assert clean_check(gs, {"w": R(t)}) is True  # the referent is alive, whatever __call__ says
    assert calls == []
    u = T()
    w = R(u)
    del u
    gc.collect()
    assert clean_check(gs, {"w": w}) is False


def test_check_inside_deep_recursion():
    """Near the recursion limit, user code run by a fetch raises RecursionError: a failed guard,
    never a crash."""

    class A:
        def __getattr__(self, name):
            return len([i for i in range(2)])

    b = tw.GuardBuilder({"a": A()})
    b.equals("L['a'].v", value=2)
    gs = b.build()
    results = []

    def dive(n):
        if n == 0:
            results.append(clean_check(gs, {"a": A()}))
            return
        dive(n - 1)

    limit = sys.getrecursionlimit()
    for depth in (limit - 60, limit - 30, limit - 10, limit - 5):
        try:
            dive(depth)
        except RecursionError:
            pass
    assert results and all(type(r) is bool for r in results)
    assert results[0] is True
    assert clean_check(gs, {"a": A()}) is True


def test_deeply_nested_value_against_equals_constants():
    """Values nest arbitrarily deep even though constants cannot: comparing them must stay
    bounded (no C stack overflow)."""
    deep = ()
    for _ in range(100_000):
        deep = (deep,)
    for const, value in [
        ({"a": 1, "b": 2}, {deep: 1, "b": 2}),
        (frozenset({"a", "b"}), frozenset({deep, "b"})),
        (((),), deep),
        ([[]], [[deep]]),
    ]:
        b = tw.GuardBuilder({"v": const})
        b.equals("L['v']")
        gs = b.build()
        assert clean_check(gs, {"v": value}) is False
    b = tw.GuardBuilder({"d": {"a": 1, "b": 2}})
    b.dict_keys("L['d']", ordered=False)
    gs = b.build()
    assert clean_check(gs, {"d": {deep: 1, "b": 2}}) is False
    while deep:  # tear it down iteratively
        (deep,) = deep


def test_attribute_and_key_storage_transitions_under_the_fast_paths():
    """Instance attributes and dict entries move around under the inline caches and entry hints:
    deleted and re-added (new entry index), shared keys outgrown (split -> combined dict),
    __dict__ materialised or replaced, a non-str-exact key, a resize. After every mutation the
    engine must agree with the reference."""

    class C:
        def __init__(self):
            self.a = 1
            self.b = 2

    class Slotted:
        __slots__ = ("__dict__", "a")

    b = tw.GuardBuilder({"o": C(), "g": 1})
    b.equals("L['o'].a")
    b.equals("L['o'].b")
    gs = b.build()
    o = C()
    f_locals = {"o": o, "g": 1}

    class K(str):
        pass

    steps = [
        lambda: None,
        lambda: delattr(o, "a"),
        lambda: setattr(o, "a", 1),  # back, at a new position
        lambda: setattr(o, "b", "two"),
        lambda: setattr(o, "b", 2),
        lambda: [setattr(o, f"extra{i}", i) for i in range(40)],  # outgrow the shared keys
        lambda: delattr(o, "b"),
        lambda: setattr(o, "b", 2),
        lambda: o.__dict__,  # materialise the instance dict
        lambda: o.__dict__.pop("a"),
        lambda: o.__dict__.update(a=1),
        lambda: setattr(o, "__dict__", {"a": 1, "b": 2}),
        lambda: setattr(o, "__dict__", {K("a"): 1, "b": 2}),  # a str subclass key equal to 'a'
        lambda: setattr(o, "__dict__", {"b": 2}),
        lambda: setattr(o, "__dict__", {"".join(["a"]): 1, "b": 2}),
        lambda: f_locals.pop("o"),
        lambda: f_locals.update(o=o),  # the root key back, at a new position
        lambda: f_locals.update({f"pad{i}": i for i in range(100)}),  # resize f_locals
        lambda: f_locals.pop("o"),
        lambda: f_locals.__setitem__("".join(["o"]), o),  # an equal, non-identical key
    ]
    results = []
    for i, step in enumerate(steps):
        step()
        for _ in range(2):  # once to learn, once through the learned fast path
            got = clean_check(gs, f_locals)
            assert got == ref_check(gs, f_locals), (i, vars(o))
        results.append(got)
    assert True in results and False in results

    s = Slotted()
    s.a = 1
    s.b = 2
    b = tw.GuardBuilder({"s": s})
    b.equals("L['s'].a")  # a slot: a data descriptor, never the instance dict
    b.equals("L['s'].b")
    gs = b.build()
    s.__dict__["a"] = 99  # shadowed by the slot
    assert clean_check(gs, {"s": s}) is True
    del s.a
    assert clean_check(gs, {"s": s}) is False
    assert ref_check(gs, {"s": s}) is False


def test_module_attributes_under_the_module_fast_path():
    import types

    m = types.ModuleType("hostile_mod")
    m.flag = 1
    b = tw.GuardBuilder({"m": m})
    b.equals("L['m'].flag")
    gs = b.build()
    assert clean_check(gs, {"m": m}) is True
    del m.flag
    assert clean_check(gs, {"m": m}) is False
    calls = []

    def module_getattr(name):
        calls.append(name)
        if name == "flag":
            return 1
        raise AttributeError(name)

    m.__getattr__ = module_getattr  # PEP 562: consulted only when the dict misses
    assert clean_check(gs, {"m": m}) is True and calls == ["flag"]
    m.flag = 2
    assert clean_check(gs, {"m": m}) is False and calls == ["flag"]
    m.__getattr__ = lambda name: (_ for _ in ()).throw(RuntimeError("module getattr exploded"))
    del m.flag
    assert clean_check(gs, {"m": m}) is False
    assert ref_check(gs, {"m": m}) is False

    class LyingModule(types.ModuleType):
        @property
        def flag(self):
            return 2

    m.__class__ = LyingModule  # a ModuleType subclass: not the exact-module fast path
    m.__dict__["flag"] = 1
    assert clean_check(gs, {"m": m}) is False
    assert ref_check(gs, {"m": m}) is False


def test_class_attribute_whose_type_becomes_a_data_descriptor():
    """The instance dict shadows a non-data class attribute only while the attribute's type has
    no __set__. Giving that type a __set__ changes what getattr returns without touching the
    owning class (so its version tag stays): the attribute cache must not keep reading the
    instance dict."""

    class Desc:
        def __get__(self, obj, objtype=None):
            return 2

    class Plain:
        pass

    class C:
        x = Desc()
        y = Plain()
        z = 0  # an int default: int can never become a descriptor

    o = C()
    o.__dict__.update(x=1, y=1, z=1)
    b = tw.GuardBuilder({"o": o})
    b.equals("L['o'].x")
    b.equals("L['o'].y")
    b.equals("L['o'].z")
    gs = b.build()
    for _ in range(3):  # fill and use the caches
        assert clean_check(gs, {"o": o}) is True
    Desc.__set__ = lambda self, obj, value: None
    assert o.x == 2
    assert clean_check(gs, {"o": o}) is False
    assert gs.why_not({"o": o}).source == "L['o'].x"
    assert ref_check(gs, {"o": o}) is False
    del Desc.__set__
    assert clean_check(gs, {"o": o}) is True
    Plain.__get__ = lambda self, obj, objtype=None: 5
    Plain.__set__ = lambda self, obj, value: None
    assert o.y == 5
    assert clean_check(gs, {"o": o}) is False
    assert gs.why_not({"o": o}).source == "L['o'].y"
    assert ref_check(gs, {"o": o}) is False
    del Plain.__get__, Plain.__set__
    assert clean_check(gs, {"o": o}) is True
    o.z = 2
    assert clean_check(gs, {"o": o}) is False


def test_instance_attributes_of_variable_size_objects():
    """int/tuple subclasses keep their instance dict at a negative offset (after the items)."""

    class I(int):
        pass

    class T(tuple):
        pass

    i, t = I(7), T((1, 2, 3))
    i.tag, t.tag = "i", "t"
    b = tw.GuardBuilder({"i": i, "t": t})
    b.equals("L['i'].tag")
    b.equals("L['t'].tag")
    b.type_match("L['i']")
    gs = b.build()
    for _ in range(2):
        assert clean_check(gs, {"i": i, "t": t}) is True
    i2, t2 = I(10**30), T(range(100))  # bigger objects: the dict sits further away
    i2.tag, t2.tag = "i", "t"
    assert clean_check(gs, {"i": i2, "t": t2}) is True
    t2.tag = "x"
    assert clean_check(gs, {"i": i2, "t": t2}) is False
    del i2.tag
    assert clean_check(gs, {"i": i2, "t": t}) is False
    assert ref_check(gs, {"i": i2, "t": t}) is False


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("present", [True, False])
def test_set_contains_with_raising_lying_and_mutating_colliders(present: bool, fast: bool) -> None:
    """SET_CONTAINS compares an element of the item's hash with ==, which runs its __eq__: a
    raising one fails the guard (no error left set: clean_check), a lying one decides membership
    as it does for Python's `in`, and one that empties or regrows the set during the lookup makes
    CPython raise or restart; every answer agrees with the oracle."""
    b = tw.GuardBuilder({"s": {"k"} if present else set()})
    b.set_contains("L['s']", "k")
    with engine_switches.fast_pass(fast):  # the fast program runs it as a residue, or the walk
        gs = b.build()
    assert gs.guards[0].args == ("k", present)

    def raising():
        raise ValueError("eq exploded")

    assert agree(gs, lambda: {"s": {Collider("k", action=raising)}}) is False
    assert agree(gs, lambda: {"s": frozenset({Collider("k", action=raising)})}) is False
    # A liar claiming equality makes "k" a member, as `"k" in s` says.
    assert agree(gs, lambda: {"s": {Collider("k", answer=True)}}) is present
    assert agree(gs, lambda: {"s": {Collider("k")}}) is not present

    def make_clearing():
        s: set = set()
        s.add(Collider("k", action=s.clear))
        return {"s": s}

    def make_growing():
        s: set = set()
        s.add(Collider("k", action=lambda: s.update(range(100))))  # the table is reallocated
        return {"s": s}

    def make_adding_the_item():
        s: set = set()
        s.add(Collider("k", action=lambda: s.add("k")))
        return {"s": s}

    agree(gs, make_clearing)
    agree(gs, make_growing)
    agree(gs, make_adding_the_item)


def test_set_contains_item_whose_hash_raises_later() -> None:
    class Item:
        armed = False

        def __hash__(self):
            if Item.armed:
                raise TypeError("unhashable today")
            return 7

        def __eq__(self, other):
            return self is other

    item = Item()
    b = tw.GuardBuilder({"s": {item}})
    b.set_contains("L['s']", item)
    gs = b.build()
    assert clean_check(gs, {"s": {item}}) is True
    Item.armed = True
    try:
        assert clean_check(gs, {"s": {7}}) is False
        assert ref_check(gs, {"s": {7}}) is False
        assert clean_why_not(gs, {"s": {7}}).kind == "SET_CONTAINS"
    finally:
        Item.armed = False


def test_set_contains_element_eq_drops_the_last_reference_to_the_set() -> None:
    """The only reference to the set is the holder's attribute; the element's __eq__ deletes it
    mid-lookup. The check holds the set strongly (the kind runs user code), so nothing is freed
    under the lookup."""
    b = tw.GuardBuilder({"o": NS(s={"k"})})
    b.set_contains("L['o'].s", "k")
    gs = b.build()

    def make():
        o = NS()
        o.s = {Collider("k", action=lambda: o.__dict__.pop("s", None), answer=True)}
        return {"o": o}

    for _ in range(3):
        assert clean_check(gs, make()) is True
    assert agree(gs, make) is True


@pytest.mark.parametrize("fast", [True, False])
def test_set_contains_eq_kills_an_identity_matched_object(fast: bool) -> None:
    """A colliding element's __eq__ drops the last reference to the object an ID_MATCH names: the
    set is invalid from then on, and this check (whichever guard ran first) and every later one
    fail, even with an object at the dead one's place."""

    class Obj:
        pass

    class H:
        pass

    h = H()
    h.o = Obj()
    b = tw.GuardBuilder({"h": h, "s": {"k"}})
    b.id_match("L['h'].o")
    b.set_contains("L['s']", "k")
    with engine_switches.fast_pass(fast):
        gs = b.build()
    del b  # its specs hold the object strongly; the set holds it weakly
    assert clean_check(gs, {"h": h, "s": {"k"}}) is True
    assert clean_check(gs, {"h": h, "s": {Collider("k", answer=True)}}) is True  # the liar alone passes
    dead = weakref.ref(h.o)

    def kill() -> None:
        h.o = Obj()  # the guarded object dies; another may take its address

    assert clean_check(gs, {"h": h, "s": {Collider("k", action=kill, answer=True)}}) is False
    assert dead() is None
    h.o = Obj()
    assert clean_check(gs, {"h": h, "s": {"k"}}) is False
    assert clean_why_not(gs, {"h": h, "s": {"k"}}) is not None


def test_set_contains_while_another_thread_mutates_the_set() -> None:
    """Colliding elements' __eq__ release the GIL (a Python call and a sleep(0)); another thread
    adds and discards elements meanwhile, so lookups restart or raise. Every check answers a
    bool, leaves no error behind and matches membership when the set is left alone."""
    import threading
    import time

    class Slow:
        def __init__(self, n: int) -> None:
            self.n = n

        def __hash__(self) -> int:
            return hash("k")

        def __eq__(self, other: object) -> bool:
            time.sleep(0)
            return other is self

    b = tw.GuardBuilder({"s": {"k"}})
    b.set_contains("L['s']", "k")
    gs = b.build()
    shared = {Slow(i) for i in range(8)} | {"k"}
    stop = threading.Event()

    def mutate() -> None:
        i = 0
        while not stop.is_set():
            shared.add(Slow(100 + i % 16))
            shared.discard(next(iter(shared)))
            shared.add("k")
            i += 1

    t = threading.Thread(target=mutate)
    t.start()
    try:
        answers = {clean_check(gs, {"s": shared}) for _ in range(300)}
    finally:
        stop.set()
        t.join()
    assert answers <= {True, False}
    assert clean_check(gs, {"s": shared}) is ("k" in shared)
