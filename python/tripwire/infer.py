"""Guard inference: the guards Dynamo would install for a frame's input values.

``guards_for(f_locals)`` walks each local's example value and declares, on a
:class:`~tripwire.GuardBuilder`, the guards a tracing JIT needs to reuse code compiled for those
values: types, constants, lengths, dict keys, nested containers, functions by code, modules and
classes by identity. ``infer_into(builder, ...)`` does the same on a builder the caller owns, so a
compiler can add its own guards before building (``@specialize`` uses it).

Inference reads each value once while walking and hands the builder explicit expected values, so
it never re-fetches a source from the root (that would be quadratic for long dicts) and never
calls user code: dispatch is on the exact type, looked up with ``type(v)`` rather than
``isinstance`` (which may call a user ``__class__``), and containers are only walked when their
type's ``__len__``/``__getitem__``/``__iter__`` are the built-in ones.
"""

from __future__ import annotations

import enum
import functools
import math
import sys
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import tripwire._core as _core

from . import shapes, tensors
from .builder import GuardBuilder
from .catalogue import GuardSpec
from .source import RootKind, Source, StepKind

if TYPE_CHECKING:
    from .guard_set import GuardSet

__all__ = ["Policy", "guards_for", "infer_into"]

ScalarMode = Literal["value", "type"]
ArgMode = Literal["value", "type", "shallow", "skip"]
_ARG_MODES = ("value", "type", "shallow", "skip")

# Numbers whose guard follows Policy.scalars (constants, or by type only).
_NUMBERS = (int, float, bool, complex)
# Key types that can name a dict value with an ITEM / DICT_ITEM step (repr round-trips).
_STEP_KEY_TYPES = (str, int, bytes, float, bool, type(None))
# C-level callables that live in a type's dict (or a module): one object for the process, so
# identity is the right guard and holding them is harmless.
_UNBOUND_BUILTINS = (
    types.WrapperDescriptorType,
    types.MethodDescriptorType,
    types.ClassMethodDescriptorType,
)
_tuple_iterator = type(iter(()))
_range_iterator = type(iter(range(0)))
# torch's markings that make a dimension dynamic (mark_dynamic, maybe_mark_dynamic, mark_unbacked).
_DYNAMIC_MARKINGS = (
    "_dynamo_dynamic_indices",
    "_dynamo_weak_dynamic_indices",
    "_dynamo_unbacked_indices",
    "_dynamo_strict_unbacked_indices",
)


def _same_dtype(c: Any) -> Any:
    """numpy's dtype equality with the exact dtype class, for dtypes that are not constants."""

    def same(x: Any) -> bool:
        return type(x) is type(c) and bool(x == c)

    return same


def _marking(v: Any, name: str) -> Any:
    """A marking attribute as torch sets it (an instance attribute), or ()."""
    try:
        return object.__getattribute__(v, name)
    except AttributeError:
        return ()


@dataclass(frozen=True)
class Policy:
    """How :func:`guards_for` specialises on input values.

    Attributes:
        scalars: ``"value"`` (default, Dynamo's static default): int, float, bool and complex are
            constants (EQUALS_MATCH, TRUE/FALSE for bools), so another value recompiles.
            ``"type"``: they are guarded by type only (TYPE_MATCH), for compilers that treat
            numbers as run-time inputs. str/bytes are always constants (as in Dynamo).
        per_arg: overrides per top-level local name: ``"value"`` / ``"type"`` (the scalars mode
            for everything under that argument), ``"shallow"`` (TYPE_MATCH on the argument
            itself, nothing below it), ``"skip"`` (no guards on it at all). Names that are not
            in ``f_locals`` are ignored (a parameter left to its default).
        max_depth: the top-level value is at depth 0. A container at a depth below
            ``max_depth`` has its elements guarded (at depth + 1); a container at depth
            ``max_depth`` gets its type and length only. Leaves are guarded fully at any depth.
        max_items: a list, tuple, dict or set with more than this many items gets its type and
            length only, no per-element guards at all (``None``: no limit). Guarding a prefix
            would look like element guards while leaving the rest unchecked, so the choice is
            all elements or none; big inputs are usually data, not configuration.
        max_guards: a soft budget on the number of guards inferred per call. Once reached,
            containers still to be visited get type and length only (leaves keep their one
            guard), which bounds nested inputs such as a list of 64 lists of 64 lists.
        dict_keys_ordered: DICT_KEYS compares key order too (Dynamo's behaviour). With False the
            keys are compared as sets, and dict values are reached by key only (a value whose key
            cannot be written as a source step then gets no guard).
        dynamic: dimensions of tensors and arrays that are dynamic, by top-level local name
            (``"x"``) or printed source (``"L['batch']['ids']"``): an int, a sequence of ints, or
            ``"all"``/True. Their sizes are not checked by TENSOR_MATCH / ARRAY_MATCH, and each
            gets SHAPE relations as Dynamo declares them (:func:`tripwire.shapes.dynamic_relations`):
            ``2 <= L['x'].size()[d]``, sizes 0 and 1 specialised, equal sizes duck-sized into
            equalities. Shapes are static otherwise, as in Dynamo.
        duck_shape: with False, equal sizes of dynamic dimensions stay independent (Dynamo's
            ``use_duck_shape``).
        specialize_zero_one: with False, a dynamic size of 0 or 1 is not specialised and the
            lower bound is 0 (Dynamo's ``specialize_zero_one``).
        mark_dynamic: honour torch's markings: dimensions in a tensor's
            ``_dynamo_dynamic_indices``, ``_dynamo_weak_dynamic_indices``,
            ``_dynamo_unbacked_indices`` or ``_dynamo_strict_unbacked_indices`` (and not in
            ``_dynamo_static_indices``) are dynamic too (``torch._dynamo.mark_dynamic``), with the
            same SHAPE relations.
        aliasing: guard how tensors and arrays alias each other, as Dynamo does: ALIAS for the same
            object at two sources, NO_ALIAS over the distinct ones.
    """

    scalars: ScalarMode = "value"
    per_arg: Mapping[str, ArgMode] = field(default_factory=dict)
    max_depth: int = 4
    max_items: int | None = 64
    max_guards: int = 4096
    dict_keys_ordered: bool = True
    dynamic: Mapping[str, Any] = field(default_factory=dict)
    duck_shape: bool = True
    specialize_zero_one: bool = True
    mark_dynamic: bool = True
    aliasing: bool = True

    def __post_init__(self) -> None:
        if self.scalars not in ("value", "type"):
            raise ValueError(f"Policy.scalars must be 'value' or 'type', not {self.scalars!r}")
        for name, mode in dict(self.per_arg).items():
            if mode not in _ARG_MODES:
                raise ValueError(f"Policy.per_arg[{name!r}] must be one of {_ARG_MODES}, not {mode!r}")
        if type(self.max_depth) is not int or self.max_depth < 0:
            raise ValueError("Policy.max_depth must be an int >= 0")
        if self.max_items is not None and (type(self.max_items) is not int or self.max_items < 0):
            raise ValueError("Policy.max_items must be an int >= 0 or None")
        if type(self.max_guards) is not int or self.max_guards < 0:
            raise ValueError("Policy.max_guards must be an int >= 0")
        for name, dims in dict(self.dynamic).items():
            if dims is True or (type(dims) is str and dims == "all") or type(dims) is int:
                continue
            if type(dims) is str or not isinstance(dims, Iterable) or not all(type(d) is int for d in dims):
                raise ValueError(
                    f"Policy.dynamic[{name!r}] must be 'all', True or dimension indices, not {dims!r}"
                )


def guards_for(
    f_locals: Mapping[str, Any],
    f_globals: dict | None = None,
    policy: Policy | None = None,
    *,
    f_closure: Any = None,
    builder: GuardBuilder | None = None,
    relations: Iterable[Any] = (),
) -> GuardSet:
    """Infer the guards Dynamo would install for the input values ``f_locals`` and build them.

    ``relations`` are SHAPE relations declared by the caller (text or :mod:`tripwire.shapes`
    expressions), added after the inferred guards; ``Policy.dynamic`` marks dimensions dynamic.

    Only ``f_locals`` are guarded; ``f_globals`` and ``f_closure`` are handed to the builder so
    guards a caller adds on ``G[...]`` / ``C[...]`` sources can read them. With ``builder``, the
    guards are added to that builder (which must have been made for the same locals; pass
    globals and closure to it, not here) and it is built. Returns a :class:`tripwire.GuardSet`.

    Rules, per value ``v`` at source ``s`` (dispatch on the exact type; guards are installed
    in this order, parents before children, so ``why_not`` reports the outermost change):

    * ``None`` -> NONE. ``True`` / ``False`` -> TRUE / FALSE. ``...`` -> EQUALS_MATCH.
      ``NotImplemented`` -> ID_MATCH.
    * int, float, complex (and bool) -> EQUALS_MATCH (NaN matches NaN), or TYPE_MATCH when the
      scalars mode is ``"type"`` (``Policy.scalars``, overridable per argument).
    * str, bytes -> EQUALS_MATCH, whatever the scalars mode.
    * enum members -> EQUALS_MATCH (by identity after an exact type check; held weakly).
    * range, and slice of constants -> EQUALS_MATCH.
    * set / frozenset of constants -> EQUALS_MATCH of the whole set; other sets -> TYPE_MATCH
      and LENGTH (their elements have no source to guard them by).
    * list / tuple (and subclasses such as namedtuples that keep the built-in ``__len__``,
      ``__getitem__`` and ``__iter__``) -> TYPE_MATCH, LENGTH, then each element at
      ``s[i]``.
    * exact dict -> TYPE_MATCH, DICT_KEYS (ordered per ``Policy.dict_keys_ordered``; never
      calls an overridden ``keys()``), then each value at ``s['k']`` for keys that are
      str/int/bytes/bool/None/non-NaN float, or at ``s[list(dict.keys(s))[i]]`` for other
      constant keys (tuples, enum members...) when order is guarded.
    * dict subclass (OrderedDict, defaultdict, user subclasses) -> the same, with values read
      by ``dict.__getitem__(s, 'k')`` so no overridden ``__getitem__``/``__missing__`` runs.
    * a dict with a key that is not a constant (a class, a function, an object) -> TYPE_MATCH,
      LENGTH, then, when order is guarded, each key at ``list(dict.keys(s))[i]`` (inferred by
      these rules, always by value) and each value at ``s[list(dict.keys(s))[i]]``; when it is
      not, nothing below the length.
    * Python function -> TYPE_MATCH and CODE_MATCH (functions and closures are matched by code
      only: closure cells, defaults and globals are not guarded).
    * bound method -> TYPE_MATCH, CODE_MATCH (or ``s.__func__`` inferred, if that is not a
      Python function), then ``s.__self__`` inferred.
    * functools.partial (exact) -> TYPE_MATCH, then ``s.func``, ``s.args``, ``s.keywords``.
    * builtin function whose ``__self__`` is a module or None (``len``, ``math.sqrt``), method
      and wrapper descriptors, modules, classes, code objects -> ID_MATCH (held weakly when
      they can be; a dead class or module invalidates the set).
    * builtin method bound to an object (``xs.append``, ``(1).__add__``) -> TYPE_MATCH,
      EQUALS_MATCH on ``s.__name__``, then ``s.__self__`` inferred (an ID_MATCH would name a
      bound-method object that dies right after the call).
    * tuple iterator -> TYPE_MATCH, TUPLE_ITERATOR_LEN; range iterator -> TYPE_MATCH,
      RANGE_ITERATOR.
    * torch tensors (any type deriving from ``torch._C.TensorBase``) -> TENSOR_MATCH, static
      unless ``Policy.dynamic`` or a ``mark_dynamic`` marking says otherwise, and
      DIMENSION_MARKING (torch's subset rule for markings), as Dynamo installs them.
    * numpy arrays -> ARRAY_MATCH, static unless ``Policy.dynamic`` says otherwise.
    * value-like framework objects (``torch.dtype``, ``torch.device``, ``torch.Size``,
      ``torch.layout``, simple numpy dtypes, and any registered constant type) -> EQUALS_MATCH;
      other numpy dtypes (structured, datetime) -> a LAMBDA comparing them with numpy's ``==``.
    * anything else (user objects, numpy scalars, str/int subclasses, containers with
      overridden ``__len__``/``__getitem__``/``__iter__``) -> TYPE_MATCH only.
    * tensors and arrays, across all arguments: ALIAS(first source, other source) for an object
      seen at two sources, then NO_ALIAS over the distinct objects (``Policy.aliasing``).
    * beyond ``Policy.max_depth``, past ``Policy.max_items`` or after ``Policy.max_guards``:
      containers get TYPE_MATCH and LENGTH only (see :class:`Policy`).

    Not inferred: aliasing between other objects (two arguments that are one list), storage
    overlap between distinct tensors (views of one base), object attributes, and globals; add
    those on the builder (see :func:`infer_into`).
    """
    policy = Policy() if policy is None else policy
    if builder is None:
        builder = GuardBuilder(f_locals, f_globals, f_closure)
    elif f_globals is not None or f_closure is not None:
        raise TypeError("pass f_globals and f_closure to the GuardBuilder, not with builder=")
    infer_into(builder, f_locals, policy, relations=relations)
    return builder.build()


def infer_into(
    builder: GuardBuilder,
    f_locals: Mapping[str, Any] | None = None,
    policy: Policy | None = None,
    *,
    names: Any = None,
    relations: Iterable[Any] = (),
) -> list[GuardSpec]:
    """Add the inferred guards for ``f_locals`` (default: the builder's) to ``builder``.

    ``names`` restricts inference to those local names (default: all, in mapping order).
    Returns the guards added. If inference raises, the builder is rolled back to where it was,
    so a caller never sees half of an argument's guards. The rules are :func:`guards_for`'s;
    then the SHAPE relations of ``policy.dynamic`` (for the names inferred), then ``relations``.
    """
    policy = Policy() if policy is None else policy
    if not isinstance(policy, Policy):
        raise TypeError(f"policy must be a tripwire.Policy, not {type(policy).__name__}")
    f_locals = builder.f_locals if f_locals is None else f_locals
    if not isinstance(f_locals, Mapping):
        raise TypeError(f"f_locals must be a mapping, not {type(f_locals).__name__}")
    cp = builder.checkpoint()
    start = len(builder)
    try:
        walker = _Walker(builder, policy)
        for name in f_locals.keys() if names is None else names:
            if type(name) is not str:
                raise TypeError(f"local names must be str, got {name!r}")
            mode = policy.per_arg.get(name, policy.scalars)
            if mode == "skip":
                continue
            value = f_locals[name]
            src = Source.local(name)
            if mode == "shallow":
                walker.type_match(src, value)
            else:
                walker.visit(src, value, 0, mode)
        dynamic = {k: v for k, v in dict(policy.dynamic).items() if names is None or _local_name(k) in names}
        for src, dims in walker.marked:  # mark_dynamic markings: the same relations
            dynamic.setdefault(str(src), sorted(dims))
        for text in shapes.dynamic_relations(
            f_locals,
            dynamic,
            duck=policy.duck_shape,
            specialize_zero_one=policy.specialize_zero_one,
            read=builder.value,
        ):
            builder.shape(text)
        for rel in relations:
            builder.shape(rel)
        walker.aliasing()
    except BaseException:
        builder.restore(cp)
        raise
    return builder.guards[start:]


def _local_name(key: str) -> str | None:
    """The top-level local a ``Policy.dynamic`` key is under (a name, or a printed source)."""
    if key.isidentifier():
        return key
    try:
        src = Source.parse(key)
    except ValueError:
        return None
    return src.name if src.root is RootKind.LOCAL else None


def _overrides(cls: type, base: type, names: tuple[str, ...]) -> bool:
    """Whether a class between ``cls`` and ``base`` in the MRO defines one of ``names``.

    Reads the MRO and class dicts through ``type``'s own slots so a metaclass cannot run code.
    """
    for klass in type.__getattribute__(cls, "__mro__"):
        if klass is base:
            return False
        d = type.__getattribute__(klass, "__dict__")
        if any(n in d for n in names):
            return True
    return False


def _step_key(k: Any) -> bool:
    """Whether dict key ``k`` can be written as an ITEM/DICT_ITEM step that finds it again."""
    if type(k) not in _STEP_KEY_TYPES:
        return False
    return not (type(k) is float and math.isnan(k))  # a new NaN never finds the old one


class _Walker:
    """One inference pass: walks values depth-first and declares guards on the builder."""

    def __init__(self, builder: GuardBuilder, policy: Policy) -> None:
        self.b = builder
        self.policy = policy
        self.count = 0  # guards declared by this pass (for max_guards)
        # Tensors and arrays met, in order: (source, value), for ALIAS / NO_ALIAS at the end.
        self.buffers: list[tuple[Source, Any]] = []
        # Tensors with dimensions torch's markings make dynamic: (source, dims), for their SHAPE
        # relations at the end.
        self.marked: list[tuple[Source, set[int]]] = []

    # -- declaring (each counts against the budget) ---------------------------------------------
    def _add(self, spec: GuardSpec) -> None:
        self.count += 1

    def type_match(self, src: Source, v: Any) -> None:
        self._add(self.b.type_match(src, type=type(v)))

    def length(self, src: Source, n: int) -> None:
        self._add(self.b.length(src, n))

    def _expand(self, depth: int, n: int) -> bool:
        """Whether a container of ``n`` items at ``depth`` gets per-item guards."""
        p = self.policy
        if depth >= p.max_depth or self.count >= p.max_guards:
            return False
        return p.max_items is None or n <= p.max_items

    # -- the rules ------------------------------------------------------------------------------
    def visit(self, src: Source, v: Any, depth: int, mode: str) -> None:
        t = type(v)
        b = self.b
        if v is None:
            self._add(b.none(src))
        elif t is bool:
            if mode == "type":
                self.type_match(src, v)
            else:
                self._add(b.true(src) if v else b.false(src))
        elif t in _NUMBERS:
            if mode == "type":
                self.type_match(src, v)
            else:
                self._add(b.equals(src, value=v))
        elif t in (str, bytes, range) or v is Ellipsis or issubclass(t, enum.Enum):
            self._add(b.equals(src, value=v))
        elif tensors.is_tensor(v):
            self._tensor(src, v)
        elif tensors.is_array(v):
            self._array(src, v)
        elif self._value_like(v):
            self._add(b.equals(src, value=v))
        elif self._numpy_dtype(v):
            self.type_match(src, v)
            self._add(b.predicate(_same_dtype(v), f"== {v!r}", source=src))
        elif t is slice:
            if _core.is_constant(v):
                self._add(b.equals(src, value=v))
            else:
                self.type_match(src, v)
        elif t in (set, frozenset):
            self._set(src, v)
        elif issubclass(t, (list, tuple)):
            self._sequence(src, v, depth, mode)
        elif issubclass(t, dict):
            self._dict(src, v, depth, mode)
        elif t is types.FunctionType:
            self.type_match(src, v)
            self._add(b.code_match(src, code=v.__code__))
        elif t is types.MethodType:
            self._method(src, v, depth, mode)
        elif t is functools.partial:
            self._partial(src, v, depth, mode)
        elif t in (types.BuiltinFunctionType, types.MethodWrapperType):
            self._builtin(src, v, depth, mode)
        elif (
            t in _UNBOUND_BUILTINS
            or t is types.CodeType
            or v is NotImplemented
            or issubclass(t, (type, types.ModuleType))
        ):
            self._add(b.id_match(src, obj=v))
        elif t is _tuple_iterator:
            self.type_match(src, v)
            self._add(b.tuple_iterator_len(src, v.__length_hint__()))
        elif t is _range_iterator:
            self.type_match(src, v)
            _, (r,), pos = v.__reduce__()
            rest = r[pos:]
            self._add(b.range_iterator(src, rest.start, rest.stop, rest.step))
        else:
            # User objects, arrays, tensors, numpy scalars, subclasses of str/int...: by type.
            self.type_match(src, v)

    def _value_like(self, v: Any) -> bool:
        """A registered value type (torch.dtype, torch.device, torch.Size, simple numpy dtypes)."""
        tensors.ensure_for(v)
        return any(
            type(v) is tp or (sub and issubclass(type(v), tp)) for tp, _, sub in _core.constant_types()
        ) and bool(_core.is_constant(v))

    @staticmethod
    def _numpy_dtype(v: Any) -> bool:
        np = sys.modules.get("numpy")
        return np is not None and issubclass(type(v), np.dtype)

    def _dynamic_dims(self, src: Source, v: Any, ndim: int) -> set[int] | bool:
        p = self.policy
        given = p.dynamic.get(str(src))
        if given is None and src.root is RootKind.LOCAL and not src.steps:
            given = p.dynamic.get(src.name)
        if given is True or (type(given) is str and given == "all"):
            return True
        if type(given) is int:
            given = (given,)
        dims = set() if given in (None, False) else {d % ndim if ndim else d for d in given}
        if p.mark_dynamic and tensors.is_tensor(v):
            marked: set[int] = set()
            for name in _DYNAMIC_MARKINGS:
                marked |= set(_marking(v, name))
            marked -= set(_marking(v, "_dynamo_static_indices"))
            marked = {d % ndim for d in marked if type(d) is int and -ndim <= d < ndim}
            if marked:
                self.marked.append((src, marked))
            dims |= marked
        return dims

    def _tensor(self, src: Source, v: Any) -> None:
        ndim = tensors.ndim_of(v)
        self._add(self.b.tensor_match(src, dynamic=self._dynamic_dims(src, v, ndim)))
        self._add(self.b.dimension_marking(src))
        self.buffers.append((src, v))

    def _array(self, src: Source, v: Any) -> None:
        ndim = tensors.ndim_of(v)
        self._add(self.b.array_match(src, dynamic=self._dynamic_dims(src, v, ndim)))
        self.buffers.append((src, v))

    def aliasing(self) -> None:
        """ALIAS for an object met at several sources, NO_ALIAS over the distinct ones."""
        if not self.policy.aliasing or len(self.buffers) < 2:
            return
        first: dict[int, Source] = {}
        distinct: list[Source] = []
        for src, v in self.buffers:
            seen = first.get(id(v))
            if seen is None:
                first[id(v)] = src
                distinct.append(src)
            else:
                self._add(self.b.alias(seen, src))
        if len(distinct) >= 2:
            self._add(self.b.no_alias(*distinct))

    def _set(self, src: Source, v: Any) -> None:
        p = self.policy
        small = p.max_items is None or len(v) <= p.max_items
        if small and _core.is_constant(v):
            self._add(self.b.equals(src, value=v))
        else:
            self.type_match(src, v)
            self.length(src, len(v))

    def _sequence(self, src: Source, v: Any, depth: int, mode: str) -> None:
        t = type(v)
        base = list if issubclass(t, list) else tuple
        self.type_match(src, v)
        if t is not base and _overrides(t, base, ("__len__", "__getitem__", "__iter__")):
            return  # a user container: its length or items would run user code
        n = base.__len__(v)
        self.length(src, n)
        if not self._expand(depth, n):
            return
        for i, x in enumerate(base.__iter__(v)):
            self.visit(src.item(i), x, depth + 1, mode)

    def _dict(self, src: Source, v: dict, depth: int, mode: str) -> None:
        t = type(v)
        exact = t is dict
        self.type_match(src, v)
        keys = list(dict.keys(v))
        n = len(keys)
        expand = self._expand(depth, n)
        ordered = self.policy.dict_keys_ordered
        if expand and all(_core.is_constant(k) for k in keys):
            self._add(self.b.dict_keys(src, keys, ordered=ordered))
            for i, k in enumerate(keys):
                if _step_key(k):
                    child = src.item(k) if exact else src.dict_item(k)
                elif ordered:
                    child = src.step(StepKind.DICT_VALUE, i)
                else:
                    continue  # no source names this value once the order is free
                self.visit(child, dict.__getitem__(v, k), depth + 1, mode)
            return
        # Too big, too deep, or keys that are not constants: the length, then keys by position.
        if not exact and _overrides(t, dict, ("__len__",)):
            return  # LENGTH would call the user's __len__
        self.length(src, n)
        if not expand or not ordered:
            return
        for i, k in enumerate(keys):
            # Keys are always pinned by value: a key guarded by type only would let the
            # compiled code read a different entry.
            self.visit(src.step(StepKind.DICT_KEY, i), k, depth + 1, "value")
            self.visit(src.step(StepKind.DICT_VALUE, i), dict.__getitem__(v, k), depth + 1, mode)

    def _method(self, src: Source, v: types.MethodType, depth: int, mode: str) -> None:
        self.type_match(src, v)
        func = v.__func__
        if type(func) is types.FunctionType:
            self._add(self.b.code_match(src, code=func.__code__))
        else:
            self.visit(src.attr("__func__"), func, depth + 1, mode)
        self.visit(src.attr("__self__"), v.__self__, depth + 1, mode)

    def _partial(self, src: Source, v: functools.partial, depth: int, mode: str) -> None:
        self.type_match(src, v)
        if depth >= self.policy.max_depth or self.count >= self.policy.max_guards:
            return
        self.visit(src.attr("func"), v.func, depth + 1, mode)
        self.visit(src.attr("args"), v.args, depth + 1, mode)
        self.visit(src.attr("keywords"), v.keywords, depth + 1, mode)

    def _builtin(self, src: Source, v: Any, depth: int, mode: str) -> None:
        owner = v.__self__
        if owner is None or type(owner) is types.ModuleType:
            # len, math.sqrt...: one long-lived object, so identity is exact and cheap.
            self._add(self.b.id_match(src, obj=v))
            return
        # Bound to an object: the method object is created per attribute access, so guard what
        # it is made of (its name and its receiver) rather than its identity.
        self.type_match(src, v)
        self._add(self.b.equals(src.attr("__name__"), value=v.__name__))
        self.visit(src.attr("__self__"), owner, depth + 1, mode)
