"""The guard catalogue: guard kinds and the declarative form of one guard (:class:`GuardSpec`).

A ``GuardSpec`` is what ``GuardBuilder`` records and what the C++ engine, the pure-Python reference
evaluator (``the oracle (tests/oracle/reference.py)``) and the failure messages all read. The meaning of each kind is
the semantic contract in docs/guards.md; keep the three in agreement.

Arguments per kind (``GuardSpec.args``):

======================  =========================================  ==========================
kind                    args                                       source
======================  =========================================  ==========================
TYPE_MATCH              (type,)                                    required
ID_MATCH                (obj,)                                     required
NONE/NOT_NONE           ()                                         required
TRUE/FALSE              ()                                         required
EQUALS_MATCH            (constant,) or (constant, python_eq=True)  required
LENGTH                  (n,)                                       required
DICT_KEYS               (keys: tuple, ordered: bool)               required
DICT_CONTAINS           (key, present: bool)                       required
HASATTR                 (name: str, present: bool)                 required
SET_CONTAINS            (item, present: bool)                      required
DICT_VERSION            (version: int)                             required
TUPLE_ITERATOR_LEN      (n,)                                       required
RANGE_ITERATOR          (start, stop, step)                        required
CODE_MATCH              (code,)                                    required
WEAKREF_ALIVE           ()                                         required
GLOBAL_STATE            (probe, snapshot, name: str)               None (ambient state)
LAMBDA                  (fn, text: str)                            optional (None: fn(f_locals))
TENSOR_MATCH            (type, TensorExpectation)                  required
ARRAY_MATCH             (type, ArrayExpectation)                   required
DIMENSION_MARKING       (DimensionMarkings,)                       required
ALIAS                   (other: Source,)                           required (the first source)
NO_ALIAS                (others: tuple[Source, ...],)              required (the first source)
DISPATCH_KEY_SET_MATCH  (expected: int,): the raw bits of the      required
                        applied set (torch's LocalState::apply)
STORAGE_OVERLAPPING     (others: tuple[Source, ...],               required (the first source;
                        n_overlapping: int)                        the first n_overlapping of all
                                                                   the sources may overlap)
SHAPE                   (relation: str, symbols: tuple[Source],    None (its symbols are its
                        types: tuple["int" | "float"])             sources)
======================  =========================================  ==========================

The expectations are the plain-data classes of ``tripwire.tensors``.
"""

from __future__ import annotations

import enum
import reprlib
import weakref
from dataclasses import dataclass, field
from typing import Any

import tripwire._core as _core

from .source import Source

__all__ = [
    "CONSTANT_TYPES",
    "KINDS",
    "GuardKind",
    "GuardSpec",
    "KindFacts",
    "Weak",
    "register_constant_type",
    "resolve",
    "short_repr",
]


# The engine's own enum (cpp/core/ir.hpp, bound by cpp/bindings/bind_ir.cpp): one definition.
GuardKind = _core.GuardKind


@dataclass(frozen=True)
class KindFacts:
    """One row of the engine's kind table (cpp/core/guard_kind_table.hpp), as the binding exports
    it: every per-kind fact the package reads comes from here, never from a list of its own."""

    kind: GuardKind
    source: str  #: "required", "optional" (LAMBDA: f_locals without one) or "absent"
    operand: str  #: "none", "value" or "identity" (compared by identity: held weakly if it can be)
    operand2: bool
    runs_user_code: bool
    relational: bool  #: relates several sources (ALIAS, NO_ALIAS, STORAGE_OVERLAPPING)
    implied: str  #: for how long a guard that held keeps holding (docs/cpp.md)
    record_version: int  #: 0: never stored
    never_stored: str | None  #: why it is never stored


KINDS: dict[GuardKind, KindFacts] = {row["kind"]: KindFacts(**row) for row in _core.guard_kind_table()}
# Read once: an enum member lookup is a Python-level attribute access. Kinds whose first
# argument is held weakly when it can be (the object or type they compare by identity):
_WEAKENED_KINDS = frozenset(k for k, f in KINDS.items() if f.operand == "identity")
_RELATIONAL_KINDS = frozenset(k for k, f in KINDS.items() if f.relational)
_EQUALS_MATCH = GuardKind.EQUALS_MATCH
# The built-in GLOBAL_STATE probes that read torch (named "torch_..." by the engine,
# core::builtin_probe_name): one list for the builder, the failure messages and serialization.
_TORCH_PROBES = frozenset(p for p in _core.builtin_probes() if p.startswith("torch_"))

_ALIAS = GuardKind.ALIAS


class Weak:
    """An argument held by weak reference: a built GuardSet keeps no strong reference to the
    objects it names by identity (types, ID_MATCH objects, code objects, enum members)."""

    __slots__ = ("address", "ref", "type_name")

    def __init__(self, obj: Any) -> None:
        self.ref = weakref.ref(obj)
        self.type_name = _type_name(type(obj))
        self.address = id(obj)

    def get(self) -> Any:
        """The referent, or None once it died."""
        return self.ref()

    def __repr__(self) -> str:
        obj = self.ref()
        return f"<dead {self.type_name} at {self.address:#x}>" if obj is None else repr(obj)


def weaken(obj: Any) -> Any:
    """``Weak(obj)`` when obj can be weakly referenced, else obj itself (ints, None, tuples...)."""
    try:
        return Weak(obj)
    except TypeError:
        return obj


def resolve(arg: Any) -> Any:
    """The object behind an argument that may be :class:`Weak`; raises LookupError if dead."""
    if type(arg) is Weak:
        obj = arg.ref()
        if obj is None:
            raise LookupError(f"the guarded object {arg!r} has died")
        return obj
    return arg


# Exact types an EQUALS_MATCH constant (and its elements, recursively) may have. Enum members are
# also constants (compared by identity after the exact type check).
CONSTANT_TYPES = (
    int,
    float,
    complex,
    str,
    bytes,
    bool,
    type(None),
    range,
    slice,
    type(Ellipsis),
    tuple,
    list,
    frozenset,
    set,
    dict,
)


def register_constant_type(tp: type, compare: str) -> None:
    """Make instances of ``tp`` EQUALS_MATCH constants (and so inferable by ``guards_for``).

    ``compare`` says how two of them compare, after the exact type check: ``"identity"``
    (singletons), ``"tuple"`` (a tuple subtype whose elements are compared as constants) or
    ``"richcompare"`` (the type's own C comparison; static C types only, whose ``==`` runs no
    Python code). A comparison never calls a Python ``__eq__``: EQUALS_MATCH runs no user code.
    Adapters register C comparisons of their own (the torch adapter: ``torch.device``).
    """
    _core.register_constant_type(tp, compare)


@dataclass(frozen=True, eq=False, init=False)
class GuardSpec:
    """One declared guard.

    ``index`` is the installation order within its builder: the first failing guard reported by
    ``why_not`` is the failing guard with the smallest index. ``stack`` is the user stack that
    installed it, innermost frame last, as ``"file:line in func"`` strings.
    """

    kind: GuardKind
    source: Source | None
    args: tuple = ()
    index: int = 0
    stack: tuple[str, ...] = field(default=())

    def __init__(
        self,
        kind: GuardKind,
        source: Source | None,
        args: tuple = (),
        index: int = 0,
        stack: tuple[str, ...] = (),
    ) -> None:
        # The fields go straight into the instance dict: the frozen dataclass's generated
        # __init__ calls object.__setattr__ per field, 4-5x slower, and builders make specs by the
        # hundred (bench/shape_eval.py, building 20 relations). Assignment afterwards still raises
        # FrozenInstanceError.
        d = self.__dict__
        d["kind"] = kind
        d["source"] = source
        d["args"] = args
        d["index"] = index
        d["stack"] = stack

    @property
    def expected(self) -> Any:
        """What the guard expects, for messages (a type, a constant, a length, a key list...)."""
        k = self.kind
        a = tuple(x.get() if type(x) is Weak and x.get() is not None else x for x in self.args)
        if k in (GuardKind.NONE,):
            return None
        if k is GuardKind.NOT_NONE:
            return "not None"
        if k is GuardKind.TRUE:
            return True
        if k is GuardKind.FALSE:
            return False
        if k is GuardKind.WEAKREF_ALIVE:
            return "alive"
        if k is GuardKind.DICT_KEYS:
            return list(a[0])
        if k in (GuardKind.DICT_CONTAINS, GuardKind.HASATTR, GuardKind.SET_CONTAINS):
            return ("has " if a[1] else "lacks ") + short_repr(a[0])
        if k is GuardKind.DICT_VERSION:
            return f"dict version {a[0]}"
        if k is GuardKind.RANGE_ITERATOR:
            return range(*a)
        if k is GuardKind.GLOBAL_STATE:
            return a[1]
        if k is GuardKind.LAMBDA:
            return a[1]
        if k in (GuardKind.TENSOR_MATCH, GuardKind.ARRAY_MATCH):
            return a[1]
        if k is GuardKind.ALIAS:
            return f"{self.source} is {a[0]}"
        if k is GuardKind.NO_ALIAS:
            return "distinct objects"
        if k is GuardKind.STORAGE_OVERLAPPING:
            return _overlap_text(self.sources, a[1])
        if k is GuardKind.DISPATCH_KEY_SET_MATCH:
            from .tensors import dispatch_key_names

            return dispatch_key_names(a[0])
        return a[0]  # SHAPE: the relation's text; the rest: the operand

    @property
    def sources(self) -> tuple[Source, ...]:
        """Every source the guard reads: one, or a relational guard's all (ALIAS, NO_ALIAS)."""
        if self.source is None:
            return ()
        if self.kind in _RELATIONAL_KINDS:  # the others: one (ALIAS) or a tuple of them
            return (self.source, self.args[0]) if self.kind is _ALIAS else (self.source, *self.args[0])
        return (self.source,)

    def weakened(self) -> GuardSpec:
        """This spec with identity-held arguments replaced by :class:`Weak` where possible."""
        if self.kind in _WEAKENED_KINDS or (
            self.kind is _EQUALS_MATCH and isinstance(self.args[0], enum.Enum)
        ):
            return GuardSpec(
                self.kind, self.source, (weaken(self.args[0]), *self.args[1:]), self.index, self.stack
            )
        return self

    def describe(self) -> str:
        """The guard as a one-line Python-like expression, e.g. ``type(L['x']) is int``."""
        s = str(self.source) if self.source is not None else "f_locals"
        k = self.kind
        a = tuple(x.get() if type(x) is Weak and x.get() is not None else x for x in self.args)
        if k is GuardKind.TYPE_MATCH:
            return f"type({s}) is {_name(a[0])}"
        if k is GuardKind.ID_MATCH:
            return f"{s} is <{_type_name(type(a[0]))} at {id(a[0]):#x}>"
        if k is GuardKind.NONE:
            return f"{s} is None"
        if k is GuardKind.NOT_NONE:
            return f"{s} is not None"
        if k is GuardKind.TRUE:
            return f"{s} is True"
        if k is GuardKind.FALSE:
            return f"{s} is False"
        if k is GuardKind.EQUALS_MATCH:
            if len(a) > 1 and a[1]:
                return f"type({s}) is {_type_name(type(a[0]))} and {s} == {short_repr(a[0])} (Python ==)"
            return f"{s} == {short_repr(a[0])}"
        if k is GuardKind.LENGTH:
            return f"len({s}) == {a[0]}"
        if k is GuardKind.DICT_KEYS:
            rel = "==" if a[1] else "set-equal"
            return f"list(dict.keys({s})) {rel} {short_repr(list(a[0]))}"
        if k is GuardKind.DICT_CONTAINS:
            return f"({short_repr(a[0])} in {s}) is {a[1]}"
        if k is GuardKind.SET_CONTAINS:
            return f"({short_repr(a[0])} in set {s}) is {a[1]}"
        if k is GuardKind.HASATTR:
            return f"hasattr({s}, {a[0]!r}) is {a[1]}"
        if k is GuardKind.DICT_VERSION:
            return f"dict_version({s}) == {a[0]}"
        if k is GuardKind.TUPLE_ITERATOR_LEN:
            return f"tuple_iterator_len({s}) == {a[0]}"
        if k is GuardKind.RANGE_ITERATOR:
            return f"range_iterator({s}) == range{tuple(a)}"
        if k is GuardKind.CODE_MATCH:
            return f"{s}.__code__ is <code {getattr(a[0], 'co_name', '?')}>"
        if k is GuardKind.WEAKREF_ALIVE:
            return f"{s}() is not None"
        if k is GuardKind.GLOBAL_STATE:
            return f"global_state {a[2]!r} == {short_repr(a[1])}"
        if k is GuardKind.TENSOR_MATCH:
            return f"check_tensor({s}, {_name(a[0])}, {a[1].describe()})"
        if k is GuardKind.ARRAY_MATCH:
            return f"check_array({s}, {_name(a[0])}, {a[1].describe()})"
        if k is GuardKind.DIMENSION_MARKING:
            return f"dimension_markings({s}) within {a[0].describe()}"
        if k is GuardKind.ALIAS:
            return f"{s} is {a[0]}"
        if k is GuardKind.NO_ALIAS:
            return "no_alias(" + ", ".join(str(x) for x in self.sources) + ")"
        if k is GuardKind.STORAGE_OVERLAPPING:
            return _overlap_text(self.sources, a[1])
        if k is GuardKind.SHAPE:
            return a[0]
        if k is GuardKind.DISPATCH_KEY_SET_MATCH:
            from .tensors import dispatch_key_names

            return f"apply_local_dispatch_keys({s}) == {dispatch_key_names(a[0])}"
        return f"lambda: {a[1]}"  # LAMBDA


def _overlap_text(sources: tuple, n_overlapping: int) -> str:
    """STORAGE_OVERLAPPING printed as torch prints it."""
    over = ", ".join(str(s) for s in sources[:n_overlapping])
    rest = ", ".join(str(s) for s in sources[n_overlapping:])
    return f"check_overlapping(overlapping=[{over}], non_overlapping=[{rest}])"


def _type_name(t: type) -> str:
    """``t.__name__`` without going through a (possibly hostile) metaclass ``__getattribute__``."""
    try:
        return type.__getattribute__(t, "__name__")
    except Exception:  # noqa: BLE001
        return "<type>"


def _name(t: Any) -> str:
    try:
        mod = getattr(t, "__module__", "")
        qn = getattr(t, "__qualname__", None) or repr(t)
        return qn if mod in ("builtins", None, "") else f"{mod}.{qn}"
    except Exception:  # noqa: BLE001 - a hostile metaclass; messages must not raise
        return "<type>"


class _MessageRepr(reprlib.Repr):
    """reprlib with sets printed in one order whatever their hash-table history: reprlib sorts a
    set only when its elements compare (``{None, 0}`` prints in table order, which differs between
    two equal sets built differently, e.g. a loaded constant and the original); unsortable
    elements are ordered by type name and repr instead."""

    def repr_set(self, x: Any, level: int) -> str:
        return "set()" if not x else "{" + self._elements(x, level, self.maxset) + "}"

    def repr_frozenset(self, x: Any, level: int) -> str:
        return "frozenset()" if not x else "frozenset({" + self._elements(x, level, self.maxfrozenset) + "})"

    def _elements(self, x: Any, level: int, most: int) -> str:
        if level <= 0:
            return "..."
        items = _ordered(x)
        parts = [self.repr1(e, level - 1) for e in items[:most]]
        if len(items) > most:
            parts.append("...")
        return ", ".join(parts)


def _ordered(x: Any) -> list:
    try:
        return sorted(x)
    except Exception:  # noqa: BLE001 - unorderable elements (or a lying __lt__)
        return sorted(x, key=lambda e: (type(e).__qualname__, repr(e)))


_REPR = _MessageRepr()
_REPR.maxlevel = 3
_REPR.maxstring = 60
_REPR.maxother = 60
for _attr in ("maxtuple", "maxlist", "maxarray", "maxdict", "maxset", "maxfrozenset", "maxdeque"):
    setattr(_REPR, _attr, 8)


def short_repr(v: Any, limit: int = 80) -> str:
    """A one-line repr for messages: reprlib-style limits on sizes and nesting (a big container is
    never printed whole), every run of whitespace (a multi-line tensor repr) made one space, and
    at most ``limit`` characters. Never raises."""
    try:
        r = _REPR.repr(v)
    except Exception as e:  # noqa: BLE001 - repr of user objects may raise anything
        r = f"<repr failed: {type(e).__name__}>"
    r = " ".join(r.split())
    return r if len(r) <= limit else r[: limit - 3] + "..."
