"""The pure-Python reference evaluator: the test oracle for the C++ engine.

It evaluates the same :class:`~tripwire.catalogue.GuardSpec` lists with plain Python, written for
clarity, not speed. Property-based tests assert that the engine and this module agree on
``check`` and on the first failing guard for ``why_not``. Where the two disagree, one of them
breaks the contract in docs/guards.md.

Rules shared with the engine:

* A source whose fetch raises any ``Exception`` (missing attribute, key, index, or a user
  ``__getattr__`` that raises) makes every guard on it and below it fail.
* ``why_not`` reports the failing guard with the smallest installation index.
* Guards that name an object held by weak reference (TYPE_MATCH, ID_MATCH, CODE_MATCH and
  EQUALS_MATCH on an enum member) fail once that object has died.
"""

from __future__ import annotations

import ast
import collections
import enum
import functools
import gc
import math
import operator
import sys
import types
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

from .catalogue import GuardKind, GuardSpec, resolve
from .source import RootKind, Source, Step, StepKind

__all__ = [
    "BUILTIN_PROBES",
    "MISSING",
    "FetchError",
    "check",
    "dict_version",
    "equals_match",
    "evaluate",
    "fetch",
    "fetch_step",
    "first_failure",
    "is_constant",
    "shape_holds",
]

_tuple_iterator = type(iter(()))
_range_iterator = type(iter(range(0)))
_EQ_SCALARS = (int, float, complex, str, bytes, bool, type(None), type(Ellipsis))


class FetchError(Exception):
    """A source could not be fetched; ``cause`` is the text of the underlying exception."""


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


MISSING = _Missing()


# -- global-state probes (the engine reads its own in C++: builtin_probe in cpp/runtime/eval/guard_kinds.cpp)
BUILTIN_PROBES: dict[str, Callable[[], Any]] = {
    "recursion_limit": sys.getrecursionlimit,
    "gc_enabled": gc.isenabled,
}


def dict_version(d: dict) -> int:
    """The engine's version stamp of dict ``d`` (``ma_version_tag`` on 3.11)."""
    from . import _core  # the stamp is read by C; nothing else exposes it

    return _core.dict_version(d)


# -- fetching -----------------------------------------------------------------------------------
def _exc_text(e: BaseException) -> str:
    """``"TypeName: message"``; the message is dropped when str() of a hostile exception raises."""
    try:
        msg = str(e)
    except Exception:  # noqa: BLE001
        msg = ""
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


_NOT_FOUND = object()
_namespace = type.__dict__["__dict__"].__get__  # a class's own namespace, past any metaclass
_mro = type.__dict__["__mro__"].__get__


def _class_attribute(cls: type, name: str) -> Any:
    """The first ``name`` in the own namespaces of ``cls``'s MRO, or a sentinel."""
    for base in _mro(cls):
        ns = _namespace(base)
        if name in ns:
            return ns[name]
    return _NOT_FOUND


_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE


def _tp_name(t: type) -> str:
    """The C-level tp_name of a class: 'module.name' for static types, the name for heap types."""
    name = type.__dict__["__name__"].__get__(t)
    if type.__dict__["__flags__"].__get__(t) & _HEAPTYPE:
        return name
    module = type.__dict__["__module__"].__get__(t)
    return name if module == "builtins" else f"{module}.{name}"


def _is_ndarray(v: Any) -> bool:
    """Whether numpy.ndarray is among the classes of ``v`` (read from the type objects, as the
    engine does, without importing numpy)."""
    return any(_tp_name(t) == "numpy.ndarray" for t in _mro(type(v)))


def fetch_step(v: Any, step: Step) -> Any:
    """Apply one step to value ``v``. Raises FetchError (with the cause's text) on failure."""
    k, a = step.kind, step.arg
    try:
        if k is StepKind.ATTR:
            return getattr(v, a)
        if k is StepKind.ITEM:
            return v[a]
        if k is StepKind.DICT_ITEM:
            if not isinstance(v, dict):
                raise TypeError(f"dict.__getitem__ needs a dict, not {type(v).__name__}")
            if not dict.__contains__(v, a):
                raise KeyError(a)
            return dict.__getitem__(v, a)
        if k is StepKind.TYPE:
            return type(v)
        if k is StepKind.DICT:
            cls = type(v)
            if issubclass(cls, type):
                raise TypeError("__dict__ step does not apply to types")
            # The instance's own dict, through the first `__dict__` its classes define: only the
            # interpreter's own descriptor kinds read it; a class-defined __dict__ fails the step.
            descr = _class_attribute(cls, "__dict__")
            if type(descr) not in (types.GetSetDescriptorType, types.MemberDescriptorType):
                raise TypeError(f"{cls.__name__} has no instance __dict__ of its own")
            d = descr.__get__(v, cls)
            if type(d) is not dict:
                raise TypeError("object has no instance dict")
            return d
        if k is StepKind.DEFAULTS:
            return v.__defaults__[a]
        if k is StepKind.KWDEFAULTS:
            kw = v.__kwdefaults__
            if kw is None:
                raise KeyError(a)
            return kw[a]
        if k is StepKind.CODE:
            return v.__code__
        if k is StepKind.CLOSURE_CELL:
            return v.__closure__[a].cell_contents
        if k is StepKind.WEAKREF_CALL:
            if not isinstance(v, weakref.ref):
                raise TypeError(f"{type(v).__name__} is not a weak reference")
            # The referent, as the engine reads it: a subclass's __call__ (WeakMethod) is not run.
            return weakref.ref.__call__(v)
        if k in (StepKind.SIZE, StepKind.STRIDE):
            if _is_ndarray(v):
                seq = v.shape if k is StepKind.SIZE else v.strides
            else:
                seq = v.size() if k is StepKind.SIZE else v.stride()
            return seq[a]
        if k is StepKind.STORAGE_OFFSET:
            if _is_ndarray(v):
                raise AttributeError("a numpy array has no storage offset")
            return v.storage_offset()
        if k in (StepKind.DICT_KEY, StepKind.DICT_VALUE):
            if not isinstance(v, dict):
                raise TypeError(f"dict position needs a dict, not {type(v).__name__}")
            if a >= dict.__len__(v):
                raise IndexError(f"dict position {a} out of range")
            for i, key in enumerate(dict.keys(v)):
                if i == a:
                    return key if k is StepKind.DICT_KEY else dict.__getitem__(v, key)
        raise AssertionError(f"unknown step {k!r}")
    except FetchError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure of user code means the guard fails
        raise FetchError(_exc_text(e)) from None


def fetch(
    source: Source,
    f_locals: Mapping[str, Any],
    f_globals: Mapping[str, Any] | None = None,
    f_closure: Mapping[str, Any] | None = None,
) -> Any:
    """The value at ``source``; raises FetchError when any step fails."""
    try:
        if source.root is RootKind.LOCAL:
            if isinstance(f_locals, dict):
                # A dict (subclass) of locals is read from its own table, as the engine does: an
                # overridden __getitem__ or __missing__ (defaultdict) is never called.
                if not dict.__contains__(f_locals, source.name):
                    raise KeyError(source.name)
                v = dict.__getitem__(f_locals, source.name)
            else:
                v = f_locals[source.name]
        elif source.root is RootKind.GLOBAL:
            if f_globals is None:
                raise KeyError(f"no globals were given for {source.name!r}")
            v = f_globals[source.name]
        else:
            if f_closure is None:
                raise KeyError(f"no closure cells were given for {source.name!r}")
            v = f_closure[source.name].cell_contents
    except Exception as e:  # noqa: BLE001
        raise FetchError(_exc_text(e)) from None
    for step in source.steps:
        v = fetch_step(v, step)
    return v


# -- EQUALS_MATCH semantics -----------------------------------------------------------------------
# Written independently of the engine's algorithm (cpp/runtime/equals.cpp pairs elements greedily,
# in place): here every value is turned into a hashable *canonical form*, and two values match when
# their forms are equal. Unordered containers become multisets (Counters) of their elements' forms,
# so matching is one to one by construction: {nan1, nan2, 1} is two NaNs and a one, and does not
# match {nan3, 1, 2}.

MAX_CONSTANT_DEPTH = 100  # core::kMaxConstantDepth; a test pins the two together
_CONTAINERS = (tuple, list, slice, set, frozenset, dict)
_NAN = ("nan",)


class _TooDeep(Exception):
    """A value nests containers deeper than MAX_CONSTANT_DEPTH: it matches no constant."""


def _float_form(x: float) -> Any:
    return _NAN if x != x else x  # every NaN alike; 0.0 and -0.0 alike (0.0 == -0.0)


def _is_enum_member(x: Any) -> bool:
    # issubclass on the exact type walks the MRO; isinstance could call a user __class__.
    return issubclass(type(x), enum.Enum)


def _form(x: Any, depth: int) -> Any:
    """The canonical form of ``x``. Only built-in operations on exact built-in types run."""
    t = type(x)
    if t is float:
        return (float, _float_form(x))
    if t is complex:
        return (complex, _float_form(x.real), _float_form(x.imag))
    if t in (int, str, bytes, bool, type(None), type(Ellipsis)):
        return (t, x)
    if t is range:  # the fields, not the items: range(0) == range(5, 5) in Python
        return (range, x.start, x.stop, x.step)
    if t in _CONTAINERS:
        if depth >= MAX_CONSTANT_DEPTH:
            raise _TooDeep
        d = depth + 1
        if t is tuple or t is list:
            return (t, tuple(_form(e, d) for e in x))
        if t is slice:
            return (slice, _form(x.start, d), _form(x.stop, d), _form(x.step, d))
        if t is dict:
            return (dict, _multiset((_form(k, d), _form(v, d)) for k, v in dict.items(x)))
        return (t, _multiset(_form(e, d) for e in x))  # set, frozenset
    # Enum members, and any other object, by identity.
    return ("identity", id(x))


def _multiset(forms: Iterable[Any]) -> frozenset:
    return frozenset(collections.Counter(forms).items())


def is_constant(c: Any, _depth: int = 0) -> bool:
    """Whether ``c`` may be the constant of an EQUALS_MATCH: built-in scalars, enum members and
    containers of these, nested at most MAX_CONSTANT_DEPTH deep."""
    t = type(c)
    if t in _EQ_SCALARS or t is range or _is_enum_member(c):
        return True
    if t not in _CONTAINERS or _depth >= MAX_CONSTANT_DEPTH:
        return False
    if t is slice:
        return all(is_constant(x, _depth + 1) for x in (c.start, c.stop, c.step))
    if t is dict:
        return all(is_constant(k, _depth + 1) and is_constant(x, _depth + 1) for k, x in dict.items(c))
    return all(is_constant(x, _depth + 1) for x in c)


def equals_match(v: Any, c: Any) -> bool:
    """``type(v) is type(c) and v == c``, recursively type-exact, with NaN equal to NaN, enum
    members by identity and unordered containers compared as multisets. No ``__eq__`` of a user
    type is ever called."""
    if type(v) is not type(c):
        return False
    try:
        return _form(v, 0) == _form(c, 0)
    except _TooDeep:
        return False


def _keys_match(actual: list, expected: Iterable[Any], ordered: bool) -> bool:
    """DICT_KEYS: the keys in order, or as multisets of canonical forms when not ordered."""
    expected = list(expected)
    if len(actual) != len(expected):
        return False
    try:
        if ordered:
            return all(
                type(a) is type(e) and _form(a, 0) == _form(e, 0)
                for a, e in zip(actual, expected, strict=True)
            )
        return _multiset((type(a), _form(a, 0)) for a in actual) == _multiset(
            (type(e), _form(e, 0)) for e in expected
        )
    except _TooDeep:
        return False


# -- guard predicates ----------------------------------------------------------------------------
def _dead(obj_ref: Any) -> bool:
    return isinstance(obj_ref, weakref.ref) and obj_ref() is None


def evaluate(spec: GuardSpec, v: Any, f_locals: Mapping[str, Any]) -> bool:
    """Whether guard ``spec`` holds for value ``v`` (already fetched). Exceptions mean False."""
    k = spec.kind
    try:
        a = tuple(resolve(x) for x in spec.args)  # a dead weakly-held argument fails the guard
        if k is GuardKind.TYPE_MATCH:
            return type(v) is a[0]
        if k is GuardKind.ID_MATCH:
            return v is a[0]
        if k is GuardKind.NONE:
            return v is None
        if k is GuardKind.NOT_NONE:
            return v is not None
        if k is GuardKind.TRUE:
            return v is True
        if k is GuardKind.FALSE:
            return v is False
        if k is GuardKind.EQUALS_MATCH:
            return equals_match(v, a[0])
        if k is GuardKind.LENGTH:
            return len(v) == a[0]
        if k is GuardKind.DICT_KEYS:
            if not isinstance(v, dict):
                return False
            return _keys_match(list(dict.keys(v)), a[0], a[1])
        if k is GuardKind.DICT_CONTAINS:
            if not isinstance(v, dict):
                return False
            return dict.__contains__(v, a[0]) is a[1]
        if k is GuardKind.HASATTR:
            return hasattr(v, a[0]) is a[1]
        if k is GuardKind.DICT_VERSION:
            return type(v) is dict and dict_version(v) == a[0]
        if k is GuardKind.TUPLE_ITERATOR_LEN:
            return type(v) is _tuple_iterator and operator.length_hint(v, -1) == a[0]
        if k is GuardKind.RANGE_ITERATOR:
            if type(v) is not _range_iterator:
                return False
            _, (r,), pos = cast(Any, v).__reduce__()  # (iter, (range,), position or None on 3.12+)
            return r[pos:] == range(*a)
        if k is GuardKind.CODE_MATCH:
            return v.__code__ is a[0]
        if k is GuardKind.WEAKREF_ALIVE:
            return isinstance(v, weakref.ref) and weakref.ref.__call__(v) is not None
        if k is GuardKind.GLOBAL_STATE:
            probe = a[0]
            current = BUILTIN_PROBES[probe]() if isinstance(probe, str) else probe()
            return equals_match(current, a[1])
        if k is GuardKind.LAMBDA:
            return bool(a[0](v))
        if k is GuardKind.SHAPE:
            return shape_holds(a[0], a[1], a[2], v)
    except Exception:  # noqa: BLE001 - a raising guard fails
        return False
    raise AssertionError(f"unknown guard kind {k!r}")


def _fetch_memo(source, f_locals, f_globals, f_closure, cache):
    """The value at ``source`` (a FetchError if it cannot be read), memoised per source."""
    if source not in cache:
        try:
            cache[source] = fetch(source, f_locals, f_globals, f_closure)
        except FetchError as e:
            cache[source] = e
    return cache[source]


def _value_for(spec, f_locals, f_globals, f_closure, cache):
    """Fetch the value a guard reads, memoised per source (one fetch per source, as the engine)."""
    if spec.kind is GuardKind.SHAPE:
        values = {}
        for src in spec.args[1]:
            v = _fetch_memo(src, f_locals, f_globals, f_closure, cache)
            if type(v) is FetchError:
                return v
            values[str(src)] = v
        return values
    if spec.source is None:
        return f_locals
    return _fetch_memo(spec.source, f_locals, f_globals, f_closure, cache)


def first_failure(
    specs: Iterable[GuardSpec],
    f_locals: Mapping[str, Any],
    f_globals: Mapping[str, Any] | None = None,
    f_closure: Mapping[str, Any] | None = None,
) -> tuple[GuardSpec, Any] | None:
    """The failing guard with the smallest index and the value it saw (a FetchError if the fetch
    failed), or None when every guard holds."""
    cache: dict[Source, Any] = {}
    for spec in sorted(specs, key=lambda s: s.index):
        v = _value_for(spec, f_locals, f_globals, f_closure, cache)
        # type(), not isinstance(): isinstance may call a user __class__ property.
        if type(v) is FetchError or not evaluate(spec, v, f_locals):
            return spec, v
    return None


def check(
    specs: Iterable[GuardSpec],
    f_locals: Mapping[str, Any],
    f_globals: Mapping[str, Any] | None = None,
    f_closure: Mapping[str, Any] | None = None,
) -> bool:
    """True when every guard holds."""
    return first_failure(specs, f_locals, f_globals, f_closure) is None


# -- SHAPE -----------------------------------------------------------------------------------------
# Written independently of the engine (cpp/core/shape/): the relation's text is parsed by Python's
# own parser, and evaluated by a small interpreter over Python ints and floats with Python's
# operators, plus the three limits docs/guards.md states: every int is at most MAX_INT_BITS bits,
# `**` takes a natural exponent, and a symbol must have the exact type of its example.

MAX_INT_BITS = 65536  # core::shape::kMaxIntBits; a test pins the two together


class _ShapeError(Exception):
    """The relation raised (what Python would raise, or one of tripwire's limits)."""


def shape_holds(
    text: str, symbols: Iterable[Source], types_: Iterable[str], values: Mapping[str, Any]
) -> bool:
    """Whether relation ``text`` holds with ``values`` ({printed symbol: value}). A symbol whose
    value is not an exact int / float (as declared in ``types_``) makes it fail; so does any
    exception the evaluation raises."""
    for src, t in zip(symbols, types_, strict=True):
        if type(values[str(src)]) is not {"int": int, "float": float}[t]:
            return False
    try:
        result = _ShapeInterpreter(text, values).run()
    except (_ShapeError, ArithmeticError, ValueError, TypeError):
        return False
    return result is True


def _int(v: Any) -> Any:
    if type(v) is int and v.bit_length() > MAX_INT_BITS:
        raise _ShapeError("integer over the bit limit")
    return v


def _pow(a: Any, b: Any) -> Any:
    if type(a) is not int or type(b) is not int:
        raise _ShapeError("** takes ints")
    if b < 0:
        raise _ShapeError("** takes a natural exponent")
    if abs(a) > 1 and (b > MAX_INT_BITS or (a.bit_length() - 1) * b + 1 > MAX_INT_BITS):
        raise _ShapeError("integer over the bit limit")
    return _int(a**b)


def _minmax(pick: Any, *args: Any) -> Any:
    if len({type(x) for x in args}) != 1:
        raise _ShapeError("min/max of mixed types")
    return pick(args)


def _int_true_div(a: Any, b: Any) -> Any:
    if type(a) is not int or type(b) is not int:
        raise _ShapeError("IntTrueDiv takes ints")
    return a / b


def _to_int(fn: Any) -> Any:
    def convert(x: Any) -> Any:
        return _int(x) if type(x) is int else _int(fn(x))

    return convert


_FUNCTIONS: dict[str, Any] = {
    "abs": abs,
    "Abs": abs,
    "float": float,
    "torch.sym_float": float,
    "ToFloat": float,
    "int": _to_int(math.trunc),
    "math.trunc": _to_int(math.trunc),
    "TruncToInt": _to_int(math.trunc),
    "math.floor": _to_int(math.floor),
    "FloorToInt": _to_int(math.floor),
    "floor": _to_int(math.floor),
    "math.ceil": _to_int(math.ceil),
    "CeilToInt": _to_int(math.ceil),
    "ceiling": _to_int(math.ceil),
    "round": _to_int(round),
    "RoundToInt": _to_int(round),
    "math.isnan": math.isnan,
    "Eq": operator.eq,
    "Ne": operator.ne,
    "Lt": operator.lt,
    "Le": operator.le,
    "Gt": operator.gt,
    "Ge": operator.ge,
    "Mod": lambda a, b: _int(a % b),
    "PythonMod": lambda a, b: _int(a % b),
    "FloorDiv": lambda a, b: _int(a // b),
    "CleanDiv": lambda a, b: _int(a // b),
    "PowByNatural": _pow,
    "Pow": _pow,
    "IntTrueDiv": _int_true_div,
    "FloatTrueDiv": operator.truediv,
    "min": lambda *a: _minmax(min, *a),
    "Min": lambda *a: _minmax(min, *a),
    "max": lambda *a: _minmax(max, *a),
    "Max": lambda *a: _minmax(max, *a),
    "Add": lambda *a: _int(functools.reduce(operator.add, a)),
    "Mul": lambda *a: _int(functools.reduce(operator.mul, a)),
}
_BINOPS: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Div: operator.truediv,
}
_COMPARE: dict[type, Any] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}


def _dotted(n: ast.AST) -> str | None:
    if isinstance(n, ast.Name):
        return n.id
    if isinstance(n, ast.Attribute):
        base = _dotted(n.value)
        return None if base is None else f"{base}.{n.attr}"
    return None


def _is_symbol(n: ast.AST) -> bool:
    """Whether ``n`` is a source: a chain of attributes, subscripts and calls ending at L[...],
    G[...], C[...], or at a call of getattr/type/list/dict.__getitem__."""
    while True:
        if isinstance(n, ast.Subscript):
            if isinstance(n.value, ast.Name) and n.value.id in ("L", "G", "C"):
                return True
            n = n.value
        elif isinstance(n, ast.Attribute):
            n = n.value
        elif isinstance(n, ast.Call):
            if _dotted(n.func) in ("getattr", "type", "list", "dict.__getitem__"):
                return True
            n = n.func
        else:
            return False


class _ShapeInterpreter:
    def __init__(self, text: str, values: Mapping[str, Any]) -> None:
        self.text = text
        self.values = values

    def run(self) -> Any:
        return self.eval(ast.parse(self.text.strip(), mode="eval").body)

    def symbol(self, n: ast.AST) -> Any:
        segment = ast.get_source_segment(self.text.strip(), n)
        if segment is None:
            raise _ShapeError("no source text")
        key = str(Source.parse(segment, shape_is_size=True))
        return _int(self.values[key])

    def eval(self, n: ast.AST) -> Any:
        if _is_symbol(n):
            return self.symbol(n)
        if isinstance(n, ast.Constant) and type(n.value) in (int, float, bool):
            return _int(n.value)
        if isinstance(n, ast.BoolOp):
            is_and = isinstance(n.op, ast.And)
            result: Any = None
            for value in n.values:
                result = self.eval(value)
                if type(result) is not bool:
                    raise _ShapeError("and/or of a non-comparison")
                if result is not is_and:
                    return result
            return result
        if isinstance(n, ast.UnaryOp):
            v = self.eval(n.operand)
            if isinstance(n.op, ast.Not):
                return not v
            if type(v) is bool:
                raise _ShapeError("arithmetic on a comparison")
            return _int(-v) if isinstance(n.op, ast.USub) else v
        if isinstance(n, ast.BinOp):
            a, b = self.eval(n.left), self.eval(n.right)
            if isinstance(n.op, ast.Pow):
                return _pow(a, b)
            return _int(_BINOPS[type(n.op)](a, b))
        if isinstance(n, ast.Compare):
            left = self.eval(n.left)
            for op, comparator in zip(n.ops, n.comparators, strict=True):
                right = self.eval(comparator)
                if not _COMPARE[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(n, ast.IfExp):
            return self.eval(n.body) if self.eval(n.test) else self.eval(n.orelse)
        name = _dotted(n)
        if name in ("math.inf", "math.nan", "True", "False"):
            return {"math.inf": math.inf, "math.nan": math.nan, "True": True, "False": False}[name]
        if isinstance(n, ast.Call) and not n.keywords:
            fn = _dotted(n.func)
            if fn in ("And", "Or"):
                is_and = fn == "And"
                for value in n.args:
                    result = self.eval(value)
                    if result is not is_and:
                        return result
                return is_and
            if fn == "Not":
                return not self.eval(n.args[0])
            if fn in _FUNCTIONS:
                return _FUNCTIONS[fn](*(self.eval(a) for a in n.args))
        raise _ShapeError(f"unsupported {ast.dump(n)[:40]}")
