"""Hypothesis strategies shared by the correctness suite.

* :func:`sources`: arbitrary :class:`tripwire.Source` objects (every root and step kind).
* :func:`frames`: example frames (locals, globals, closure cells) holding nested values: ints,
  floats (NaN, -0.0, inf), bools, None, str, bytes, tuples, lists, dicts with str/int keys, user
  objects with attributes (instance dict and slots) and enum members.
* :func:`guard_plans`: a random guard set over sources that exist in an example frame, with the
  guard kinds that apply to the value found there.
* :func:`mutated_frames`: inputs derived from the example by changing leaves and types, deleting
  and adding keys and attributes, reordering dicts, replacing containers, and by flipping the
  ambient state that GLOBAL_STATE probes read.

The equivalence test builds the plan with the engine and compares ``GuardSet.check``/``why_not``
with the oracle (tests/oracle/reference.py) on every mutated input.
"""

from __future__ import annotations

import copy
import copyreg
import enum
import gc
import math
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

import reference
import tripwire as tw
from tripwire import _core
from tripwire.source import RootKind, Source, Step, StepKind

# ---------------------------------------------------------------------------------------------
# Sources (printing/parsing round trip)
# ---------------------------------------------------------------------------------------------

_key_values = st.one_of(
    st.text(max_size=8),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.binary(max_size=6),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.none(),
)
_names = st.one_of(
    st.sampled_from(["x", "self", "layers", "weight", "_private", "__dunder__", "class", "def", "None"]),
    st.text(min_size=1, max_size=10),
)
_positions = st.integers(min_value=0, max_value=10**6)


def steps() -> st.SearchStrategy[Step]:
    """One step of any kind with a valid argument."""
    return st.one_of(
        _names.map(lambda a: Step(StepKind.ATTR, a)),
        _key_values.map(lambda k: Step(StepKind.ITEM, k)),
        _key_values.map(lambda k: Step(StepKind.DICT_ITEM, k)),
        st.just(Step(StepKind.TYPE)),
        st.just(Step(StepKind.DICT)),
        _positions.map(lambda i: Step(StepKind.DEFAULTS, i)),
        st.text(max_size=8).map(lambda k: Step(StepKind.KWDEFAULTS, k)),
        st.just(Step(StepKind.CODE)),
        _positions.map(lambda i: Step(StepKind.CLOSURE_CELL, i)),
        st.just(Step(StepKind.WEAKREF_CALL)),
        _positions.map(lambda i: Step(StepKind.DICT_KEY, i)),
        _positions.map(lambda i: Step(StepKind.DICT_VALUE, i)),
        _positions.map(lambda i: Step(StepKind.SIZE, i)),
        _positions.map(lambda i: Step(StepKind.STRIDE, i)),
        st.just(Step(StepKind.STORAGE_OFFSET)),
        st.just(Step(StepKind.TYPE_DICT)),
        st.just(Step(StepKind.TYPE_MRO)),
    )


def sources(max_steps: int = 6) -> st.SearchStrategy[Source]:
    """Any source: L/G/C root with any str name, then up to ``max_steps`` steps."""
    return st.builds(
        Source,
        st.sampled_from(list(RootKind)),
        st.one_of(_names, st.text(max_size=6)),
        st.lists(steps(), max_size=max_steps).map(tuple),
    )


# ---------------------------------------------------------------------------------------------
# Example values
# ---------------------------------------------------------------------------------------------


class Color(enum.Enum):
    RED = 1
    GREEN = 2
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Obj:
    """A plain user object: attributes in its instance dict."""

    def __init__(self, **attrs: Any) -> None:
        self.__dict__.update(attrs)

    def __repr__(self) -> str:
        return f"Obj({self.__dict__!r})"


class Obj2(Obj):
    """Another class with the same layout (a type change that keeps every attribute)."""

    def __repr__(self) -> str:
        return f"Obj2({self.__dict__!r})"


class Slotted:
    """A user object whose attributes are slots (data descriptors on the type)."""

    __slots__ = ("p", "q")

    def __init__(self, **attrs: Any) -> None:
        for k, v in attrs.items():
            setattr(self, k, v)

    def __repr__(self) -> str:
        return f"Slotted({ {k: getattr(self, k) for k in self.__slots__ if hasattr(self, k)}!r})"


# copy and pickle add `__slotnames__` to a class's dict the first time they copy one of its
# instances (copyreg._slotnames, from object.__reduce_ex__), and mutated_frames copies: guard plans
# reach class dicts (TYPE_DICT), so a LENGTH or DICT_KEYS guard built on the example would fail on
# the example itself once a copy was made. The entries are made here, once, before any draw.
for _cls in (Obj, Obj2, Slotted):
    copyreg._slotnames(_cls)

ATTR_NAMES = ("a", "b", "c", "mode")
SLOT_NAMES = Slotted.__slots__
DICT_KEYS = ("a", "b", "k", "mode", 0, 1, 2, -1)

_floats = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, 1.5, math.nan, -math.nan, math.inf, -math.inf]),
    st.floats(allow_nan=True, allow_infinity=True),
)
leaves = st.one_of(
    st.integers(min_value=-3, max_value=3),
    st.integers(),
    _floats,
    st.booleans(),
    st.none(),
    st.sampled_from(["", "a", "fast", "slow"]),
    st.text(max_size=4),
    st.binary(max_size=3),
    st.sampled_from(list(Color) + list(Level)),
    st.complex_numbers(allow_nan=True) | st.just(complex(math.nan, 1.0)),
)


def make_function(n: Any, d: Any) -> Callable[..., Any]:
    """A closure with a positional default and a keyword-only default (same code every time)."""

    def fn(x: Any, y: Any = d, *, k: Any = n) -> Any:
        return (x, y, k, n)

    return fn


def other_function(x: Any, y: Any = 0, *, k: Any = 0) -> Any:
    return x


# Objects that outlive every example, for weak references in example values.
PERSISTENT = [Obj(a=1), Obj(a=2), Obj2(a=1)]

_small = st.one_of(st.integers(-2, 2), st.sampled_from(["a", "b"]), st.none())
# Constants with tricky EQUALS semantics, functions, weak references and iterators.
special_leaves = st.one_of(
    st.builds(range, st.integers(-2, 3), st.integers(-2, 6), st.sampled_from([1, 2, -1])),
    st.builds(slice, _small, _small, st.sampled_from([None, 1, 2])),
    st.just(Ellipsis),
    st.frozensets(_small, max_size=3),
    st.sets(_small, max_size=3),
    st.tuples(_floats, _small),
    st.builds(make_function, _small, _small),
    st.just(other_function),
    st.sampled_from(PERSISTENT).map(weakref.ref),
    st.lists(_small, max_size=3).map(lambda xs: iter(tuple(xs))),
    st.builds(range, st.integers(0, 3), st.integers(0, 9)).map(iter),
)
leaves = st.one_of(leaves, special_leaves)


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=4).map(tuple),
        st.dictionaries(st.sampled_from(DICT_KEYS), children, max_size=4),
        st.dictionaries(st.sampled_from(ATTR_NAMES), children, max_size=3).map(lambda d: Obj(**d)),
        st.dictionaries(st.sampled_from(SLOT_NAMES), children, max_size=2).map(lambda d: Slotted(**d)),
    )


values = st.recursive(leaves, _containers, max_leaves=12)

LOCAL_NAMES = ("x", "y", "cfg")


@dataclass
class Frame:
    """One example frame: the three places sources are rooted in."""

    f_locals: dict[str, Any]
    f_globals: dict[str, Any]
    f_closure: dict[str, types.CellType]


@st.composite
def frames(draw: st.DrawFn) -> Frame:
    f_locals = draw(st.dictionaries(st.sampled_from(LOCAL_NAMES), values, min_size=1, max_size=3))
    f_globals = draw(st.dictionaries(st.sampled_from(("g", "h")), values, max_size=2))
    cells = draw(st.dictionaries(st.sampled_from(("c",)), values, max_size=1))
    return Frame(f_locals, f_globals, {k: types.CellType(v) for k, v in cells.items()})


# ---------------------------------------------------------------------------------------------
# Paths into an example
# ---------------------------------------------------------------------------------------------


def children(v: Any) -> list[tuple[Step, Any]]:
    """The steps that can be taken from value ``v`` and the values they reach."""
    out: list[tuple[Step, Any]] = []
    t = type(v)
    if t is dict:
        for i, (k, x) in enumerate(v.items()):
            out.append((Step(StepKind.ITEM, k), x))
            out.append((Step(StepKind.DICT_ITEM, k), x))
            out.append((Step(StepKind.DICT_KEY, i), k))
            out.append((Step(StepKind.DICT_VALUE, i), x))
    elif t in (list, tuple):
        for i, x in enumerate(v):
            out.append((Step(StepKind.ITEM, i), x))
            out.append((Step(StepKind.ITEM, i - len(v)), x))
    elif t in (Obj, Obj2):
        for k, x in vars(v).items():
            out.append((Step(StepKind.ATTR, k), x))
        out.append((Step(StepKind.DICT), vars(v)))
    elif t is Slotted:
        for k in SLOT_NAMES:
            if hasattr(v, k):
                out.append((Step(StepKind.ATTR, k), getattr(v, k)))
    elif isinstance(v, enum.Enum):
        out.append((Step(StepKind.ATTR, "value"), v.value))
        out.append((Step(StepKind.ATTR, "name"), v.name))
    elif t is types.FunctionType:
        out.append((Step(StepKind.CODE), v.__code__))
        # A class's methods (reached through TYPE_DICT) may have neither.
        if v.__defaults__:
            out.append((Step(StepKind.DEFAULTS, 0), v.__defaults__[0]))
        if v.__kwdefaults__ and "k" in v.__kwdefaults__:
            out.append((Step(StepKind.KWDEFAULTS, "k"), v.__kwdefaults__["k"]))
        if v.__closure__:
            out.append((Step(StepKind.CLOSURE_CELL, 0), v.__closure__[0].cell_contents))
    elif t is weakref.ref:
        out.append((Step(StepKind.WEAKREF_CALL), v()))
    if t is not type:
        out.append((Step(StepKind.TYPE), t))
    elif v in (Obj, Obj2, Slotted):
        # A class's own namespace (the dict itself, which `v.__dict__` shows through a proxy) and MRO.
        out.append((Step(StepKind.TYPE_DICT), gc.get_referents(v.__dict__)[0]))
        out.append((Step(StepKind.TYPE_MRO), v.__mro__))
    return out


def paths(frame: Frame, max_depth: int = 4) -> list[tuple[Source, Any]]:
    """Every (source, example value) reachable in ``frame``, breadth first."""
    todo: list[tuple[Source, Any]] = []
    for name, v in frame.f_locals.items():
        todo.append((Source.local(name), v))
    for name, v in frame.f_globals.items():
        todo.append((Source.global_(name), v))
    for name, cell in frame.f_closure.items():
        todo.append((Source.closure(name), cell.cell_contents))
    out: list[tuple[Source, Any]] = []
    while todo:
        src, v = todo.pop(0)
        out.append((src, v))
        if len(src.steps) < max_depth:
            for step, x in children(v):
                todo.append((Source(src.root, src.name, src.steps + (step,)), x))
    return out


# ---------------------------------------------------------------------------------------------
# Guard plans
# ---------------------------------------------------------------------------------------------

# Ambient state read by Python GLOBAL_STATE probes (flipped by ambient mutations).
AMBIENT = {"mode": "train", "level": 1}


def probe_mode() -> str:
    return AMBIENT["mode"]


def probe_level() -> int:
    return AMBIENT["level"]


@dataclass
class Plan:
    """Guards to declare, as (builder method name, args, kwargs) in installation order."""

    calls: list[tuple[str, tuple, dict]] = field(default_factory=list)

    def apply(self, b: tw.GuardBuilder) -> None:
        for name, args, kwargs in self.calls:
            getattr(b, name)(*args, **kwargs)

    def __repr__(self) -> str:
        def fmt(a: Any) -> str:
            return getattr(a, "__name__", None) or repr(a)

        lines = [
            f"  b.{n}({', '.join([fmt(x) for x in a] + [f'{k}={fmt(x)}' for k, x in kw.items()])})"
            for n, a, kw in self.calls
        ]
        return "Plan(\n" + "\n".join(lines) + "\n)"


_tuple_iterator = type(iter(()))
_range_iterator = type(iter(range(0)))


def _versionable(d: dict) -> bool:
    """Whether DICT_VERSION can be built on `d` (CPython 3.13 refuses an instance dict embedded
    in its object's inline values: attribute stores bypass it)."""
    try:
        _core.dict_version(d)
    except ValueError:
        return False
    return True


def _is_sized(v: Any) -> bool:
    return type(v) in (str, bytes, tuple, list, dict, set, frozenset, range)


def _type_is(t: type) -> Callable[[Any], bool]:
    def pred(v: Any) -> bool:
        return type(v) is t

    pred.__name__ = f"type_is_{t.__name__}"
    return pred


def _len_is(n: int) -> Callable[[Any], bool]:
    def pred(v: Any) -> bool:
        return len(v) == n  # raises for unsized values: the guard fails

    pred.__name__ = f"len_is_{n}"
    return pred


def _has_local(name: str) -> Callable[[Any], bool]:
    def pred(f_locals: Any) -> bool:
        return name in f_locals

    pred.__name__ = f"has_local_{name}"
    return pred


def guard_calls_for(draw: st.DrawFn, src: Source, v: Any) -> list[tuple[str, tuple, dict]]:
    """Builder calls (name, args, kwargs) applicable to the value ``v`` found at ``src``."""
    s = str(src) if draw(st.booleans()) else src  # both spellings are accepted
    options: list[tuple[str, tuple, dict]] = [("type_match", (s,), {})]
    t = type(v)
    if v is None:
        options.append(("none", (s,), {}))
    else:
        options.append(("not_none", (s,), {}))
    if v is True:
        options.append(("true", (s,), {}))
    if v is False:
        options.append(("false", (s,), {}))
    if reference.is_constant(v):
        options.append(("equals", (s,), {}))
    if t in (Obj, Obj2, Slotted, type, types.FunctionType, types.CodeType, weakref.ref) or isinstance(
        v, enum.Enum
    ):
        options.append(("id_match", (s,), {}))
    elif draw(st.integers(0, 9)) == 0:
        options.append(("id_match", (s,), {}))
    if t is types.FunctionType:
        options.append(("code_match", (s,), {}))
    if t is weakref.ref:
        options.append(("weakref_alive", (s,), {}))
    if t is _tuple_iterator:
        options.append(("tuple_iterator_len", (s,), {}))
    if t is _range_iterator:
        options.append(("range_iterator", (s,), {}))
    if _is_sized(v):
        options.append(("length", (s,), {}))
        options.append(("predicate", (_len_is(len(v)),), {"source": s}))
    if t is dict:
        options.append(("dict_keys", (s,), {"ordered": True}))
        options.append(("dict_keys", (s,), {"ordered": False}))
        key = draw(st.sampled_from(DICT_KEYS))
        options.append(("dict_contains", (s, key), {}))
        if _versionable(v):  # not a 3.13 instance dict embedded in its object (builder refuses)
            options.append(("dict_version", (s,), {}))
    if t in (set, frozenset):
        item = draw(st.one_of(st.sampled_from(tuple(v)), _small) if v else _small)
        options.append(("set_contains", (s, item), {}))
    if t in (Obj, Obj2, Slotted) or draw(st.booleans()):
        name = draw(st.sampled_from(ATTR_NAMES + SLOT_NAMES + ("real", "value")))
        options.append(("hasattr", (s, name), {}))
    options.append(("predicate", (_type_is(t),), {"source": s}))
    generic = {"type_match", "not_none", "predicate", "id_match", "hasattr"}
    specific = [o for o in options if o[0] not in generic]
    out = []
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        pool = specific if specific and draw(st.integers(0, 2)) else options
        out.append(draw(st.sampled_from(pool)))
    return out


def _category(v: Any) -> str:
    t = type(v)
    if t is dict:
        return "dict"
    if t in (list, tuple):
        return "sequence"
    if t in (Obj, Obj2, Slotted):
        return "object"
    if t is type:
        return "type"
    if t in (types.FunctionType, types.CodeType, weakref.ref, _tuple_iterator, _range_iterator):
        return "callable/iterator"
    if t in (range, slice, set, frozenset) or t is type(Ellipsis):
        return "special constant"
    if t is bool or v is None:
        return "bool/None"
    return "scalar"


def relational_calls(draw: st.DrawFn, frame: Frame) -> list[tuple[str, tuple, dict]]:
    """ALIAS between two sources that hold one object, NO_ALIAS over sources that hold distinct
    objects (both hold on the example), sometimes."""
    if draw(st.integers(0, 2)) == 0:
        return []
    by_object: dict[int, list[Source]] = {}
    for src, v in paths(frame):
        by_object.setdefault(id(v), []).append(src)
    groups = sorted((srcs for srcs in by_object.values()), key=lambda g: [str(x) for x in g])
    calls: list[tuple[str, tuple, dict]] = []
    shared = [g for g in groups if len(g) >= 2]
    if shared and draw(st.booleans()):
        g = draw(st.sampled_from(shared))
        a, b = draw(st.permutations(g))[:2]
        calls.append(("alias", (a, b), {}))
    if len(groups) >= 2 and draw(st.booleans()):
        picked = draw(st.lists(st.sampled_from(groups), min_size=2, max_size=5, unique_by=lambda g: id(g)))
        calls.append(("no_alias", tuple(draw(st.sampled_from(g)) for g in picked), {}))
    return calls


@st.composite
def guard_plans(draw: st.DrawFn, frame: Frame) -> Plan:
    """A random guard set over sources that exist in ``frame``."""
    # Pick a value category first, then a path of that category, so that rarer values (dicts,
    # functions, iterators...) get guards as often as the many scalars and type() steps.
    by_category: dict[str, list[tuple[Source, Any]]] = {}
    for src, v in paths(frame):
        by_category.setdefault(_category(v), []).append((src, v))
    cats = sorted(by_category)
    chosen = []
    for _ in range(draw(st.integers(min_value=1, max_value=8))):
        cat = draw(st.sampled_from(cats))
        chosen.append(draw(st.sampled_from(by_category[cat])))
    plan = Plan()
    for src, v in chosen:
        plan.calls.extend(guard_calls_for(draw, src, v))
    plan.calls.extend(relational_calls(draw, frame))
    # Ambient guards, interleaved at a random position.
    ambient = draw(
        st.lists(
            st.sampled_from(
                [
                    ("global_state", ("gc_enabled",), {}),
                    ("global_state", ("recursion_limit",), {}),
                    ("global_state", (probe_mode,), {}),
                    ("global_state", (probe_level,), {}),
                    ("predicate", (_has_local(next(iter(frame.f_locals))),), {}),
                ]
            ),
            max_size=2,
        )
    )
    for call in ambient:
        plan.calls.insert(draw(st.integers(0, len(plan.calls))), call)
    return plan


# ---------------------------------------------------------------------------------------------
# Mutations
# ---------------------------------------------------------------------------------------------


def related_values(v: Any) -> st.SearchStrategy[Any]:
    """Values close to ``v``: equal but of another type, equal but another object, off by one."""
    t = type(v)
    near: list[Any] = []
    if t is bool:
        near += [not v, int(v), float(v)]
    elif t is int:
        near += [v + 1, -v, float(v), int(str(v)), True if v == 1 else False if v == 0 else v + 2**64]
    elif t is float:
        near += [math.nan, -v, v + 1.0 if math.isfinite(v) else 0.0, complex(v)]
        if math.isfinite(v) and v == int(v):
            near.append(int(v))
    elif t is complex:
        near += [complex(v.real, v.imag), complex(v.imag, v.real), v.real]
    elif t is str:
        near += [v + "x", "".join(list(v)), v.encode()]
    elif t is bytes:
        near += [v + b"x", v.decode("latin-1")]
    elif t is type(None):
        near += [False, 0, ""]
    elif isinstance(v, enum.Enum):
        near += [v.value] + [m for m in type(v) if m is not v]
    elif t in (list, tuple):
        near += [tuple(v) if t is list else list(v), t(list(v)[:-1]), t(list(v) + [None])]
    elif t is dict:
        near += [dict(v), dict(reversed(list(v.items())))]
    elif t is range:
        near += [range(v.start, v.stop, v.step), range(v.start, v.stop + v.step, v.step), list(v)]
        if len(v) == 0:
            near.append(range(7, 7))  # equal items, other fields
        else:
            near.append(range(v.start, v[-1] + (1 if v.step > 0 else -1), v.step))  # same items
    elif t is slice:
        near += [slice(v.start, v.stop, v.step), slice(v.start, v.stop, 3), (v.start, v.stop, v.step)]
    elif t in (set, frozenset):
        other = frozenset if t is set else set
        near += [t(v), other(v), t(v) | {99}, t(1.0 if x == 1 and type(x) is int else x for x in v)]
    elif t is types.FunctionType:
        near += [make_function(0, 0), make_function(1, None), other_function, make_function("a", "b")]
    elif t is weakref.ref:
        near += [weakref.ref(o) for o in PERSISTENT] + [v()]
    elif t is _tuple_iterator:
        rest = tuple(copy.copy(v))
        near += [iter(rest), iter(rest + (1,)), iter(list(rest))]
    elif t is _range_iterator:
        near += [copy.copy(v), iter(range(3)), iter(range(1, 9))]
    if not near:
        return leaves
    return st.one_of(st.sampled_from(near), leaves)


def _shallow_copy(v: Any) -> Any:
    t = type(v)
    if t in (dict, list):
        return t(v)
    if t in (Obj, Obj2):
        new = t.__new__(t)
        new.__dict__.update(vars(v))
        return new
    if t is Slotted:
        return copy.copy(v)
    return v  # tuples are rebuilt by _set_child


def _set_child(parent: Any, step: Step, new: Any) -> Any:
    """``parent`` (already a private copy where mutable) with the child at ``step`` replaced.
    Returns the parent to store in place of the old one (tuples are immutable)."""
    k, a = step.kind, step.arg
    if type(parent) is tuple:
        items = list(parent)
        items[a] = new
        return tuple(items)
    if k in (StepKind.ITEM, StepKind.DICT_ITEM):
        parent[a] = new
    elif k is StepKind.DICT_VALUE:
        parent[list(parent)[a]] = new
    elif k is StepKind.ATTR:
        setattr(parent, a, new)
    else:
        raise LookupError(step)
    return parent


def _replace_at(frame: Frame, src: Source, fn: Callable[[Any], Any]) -> Frame:
    """A new frame sharing every object except those on the path to ``src``, where the value at
    ``src`` becomes ``fn(old value)`` (fn may mutate its argument: it receives a copy)."""
    chain = [src]
    while chain[-1].parent is not None:
        chain.append(chain[-1].parent)
    chain.reverse()  # root first
    f_locals, f_globals = dict(frame.f_locals), dict(frame.f_globals)
    f_closure = dict(frame.f_closure)
    roots = {RootKind.LOCAL: f_locals, RootKind.GLOBAL: f_globals}
    root = src.root
    # Walk down making private copies of the containers along the path.
    if root is RootKind.CLOSURE:
        cur = frame.f_closure[src.name].cell_contents
    else:
        cur = roots[root][src.name]
    copies = [_shallow_copy(cur) if src.steps else cur]
    for i, step in enumerate(src.steps):
        child = reference.fetch_step(copies[-1], step)
        last = i == len(src.steps) - 1
        copies.append(child if last else _shallow_copy(child))
    copies[-1] = fn(_shallow_copy(copies[-1]))
    # Write back bottom-up.
    for i in range(len(src.steps) - 1, -1, -1):
        copies[i] = _set_child(copies[i], src.steps[i], copies[i + 1])
    if root is RootKind.CLOSURE:
        f_closure[src.name] = types.CellType(copies[0])
    else:
        roots[root][src.name] = copies[0]
    return Frame(f_locals, f_globals, f_closure)


def _writable(src: Source, v: Any) -> bool:
    """Whether the value at ``src`` can be replaced by path copying (no TYPE/DICT_KEY/DICT steps,
    and the values along the way are containers we know how to copy)."""
    return all(
        s.kind in (StepKind.ITEM, StepKind.DICT_ITEM, StepKind.DICT_VALUE, StepKind.ATTR) for s in src.steps
    ) and not any(s.kind is StepKind.ATTR and s.arg in ("value", "name", "real") for s in src.steps)


@dataclass
class Mutation:
    """One derived input: a frame plus the ambient changes to apply while checking it."""

    frame: Frame
    what: str
    ambient: dict[str, Any] = field(default_factory=dict)  # AMBIENT overrides
    gc_disabled: bool = False

    def __repr__(self) -> str:
        return f"Mutation({self.what})"

    def __enter__(self) -> Mutation:
        self._saved = dict(AMBIENT)
        AMBIENT.update(self.ambient)
        if self.gc_disabled:
            gc.disable()
        return self

    def __exit__(self, *exc: Any) -> None:
        AMBIENT.clear()
        AMBIENT.update(self._saved)
        if self.gc_disabled:
            gc.enable()


def _mutate_container(draw: st.DrawFn, v: Any) -> tuple[str, Callable[[Any], Any]]:
    t = type(v)
    if t is dict:
        op = draw(st.sampled_from(["del", "add", "reorder", "subclass"] if v else ["add", "subclass"]))
        if op == "del":
            key = draw(st.sampled_from(list(v)))
            return f"del [{key!r}]", lambda d: (d.pop(key), d)[1]
        if op == "add":
            key = draw(st.sampled_from(DICT_KEYS))
            val = draw(leaves)
            return f"set [{key!r}] = {val!r}", lambda d: (d.__setitem__(key, val), d)[1]
        if op == "reorder":
            return "reorder keys", lambda d: dict(reversed(list(d.items())))
        return "as dict subclass", lambda d: _DictSub(d)
    if t is list:
        op = draw(st.sampled_from(["pop", "append", "to_tuple"] if v else ["append", "to_tuple"]))
        if op == "pop":
            return "pop()", lambda x: (x.pop(), x)[1]
        if op == "append":
            val = draw(leaves)
            return f"append({val!r})", lambda x: (x.append(val), x)[1]
        return "as tuple", tuple
    if t is tuple:
        op = draw(st.sampled_from(["shorter", "to_list"]))
        if op == "shorter":
            return "drop last", lambda x: x[:-1]
        return "as list", list
    if t in (Obj, Obj2):
        op = draw(st.sampled_from(["delattr", "setattr", "retype", "to_dict", "new_dict"]))
        if op == "delattr" and vars(v):
            name = draw(st.sampled_from(list(vars(v))))
            return f"del .{name}", lambda o: (delattr(o, name), o)[1]
        if op == "retype":
            other = Obj2 if t is Obj else Obj
            return f"__class__ = {other.__name__}", lambda o: (setattr(o, "__class__", other), o)[1]
        if op == "to_dict":
            return "as dict", lambda o: dict(vars(o))
        if op == "new_dict":
            return "__dict__ replaced", lambda o: (setattr(o, "__dict__", dict(vars(o))), o)[1]
        name = draw(st.sampled_from(ATTR_NAMES))
        val = draw(leaves)
        return f"set .{name} = {val!r}", lambda o: (setattr(o, name, val), o)[1]
    if t is Slotted:
        present = [k for k in SLOT_NAMES if hasattr(v, k)]
        if present and draw(st.booleans()):
            name = draw(st.sampled_from(present))
            return f"del .{name}", lambda o: (delattr(o, name), o)[1]
        name = draw(st.sampled_from(SLOT_NAMES))
        val = draw(leaves)
        return f"set .{name} = {val!r}", lambda o: (setattr(o, name, val), o)[1]
    new = draw(related_values(v))
    return f"= {new!r}", lambda _: new


class _DictSub(dict):
    """A dict subclass whose __getitem__ lies: ITEM steps see it, DICT_ITEM steps must not."""

    def __getitem__(self, key: Any) -> Any:
        return "from __getitem__"

    def __missing__(self, key: Any) -> Any:  # pragma: no cover - never reached through dict lookup
        return "from __missing__"


@st.composite
def mutated_frames(draw: st.DrawFn, frame: Frame, n: int = 6) -> list[Mutation]:
    """Inputs derived from ``frame``; the first is the example itself."""
    out = [Mutation(frame, "unchanged")]
    writable = [(s, v) for s, v in paths(frame) if _writable(s, v)]
    for _ in range(n):
        kind = draw(st.sampled_from(["value", "value", "value", "equal_copy", "root", "ambient"]))
        if kind == "ambient":
            if draw(st.booleans()):
                out.append(Mutation(frame, "gc disabled", gc_disabled=True))
            else:
                key = draw(st.sampled_from(list(AMBIENT)))
                val = "eval" if key == "mode" else 2
                out.append(Mutation(frame, f"AMBIENT[{key!r}] = {val!r}", ambient={key: val}))
            continue
        if kind == "root" or not writable:
            name = draw(st.sampled_from(LOCAL_NAMES))
            f_locals = dict(frame.f_locals)
            if name in f_locals and draw(st.booleans()):
                del f_locals[name]
                what = f"del L[{name!r}]"
            else:
                val = draw(values)
                f_locals[name] = val
                what = f"L[{name!r}] = {val!r}"
            out.append(Mutation(Frame(f_locals, frame.f_globals, frame.f_closure), what))
            continue
        src, v = draw(st.sampled_from(writable))
        if kind == "equal_copy":
            new = copy.deepcopy(v) if not isinstance(v, enum.Enum) else v
            out.append(Mutation(_replace_at(frame, src, lambda _: new), f"{src} = deepcopy"))
            continue
        what, fn = _mutate_container(draw, v)
        out.append(Mutation(_replace_at(frame, src, fn), f"{src} {what}"))
    return out
