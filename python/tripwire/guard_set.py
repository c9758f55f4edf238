"""GuardSet: the built, immutable guard set (a Python face on the C++ ``GuardSetCore``).

``check`` is the C++ method itself. ``why_not``, ``failures`` and ``explain`` are diagnostics: they
run only when asked, never on the hot path.
"""

from __future__ import annotations

import copy
import enum
import functools
import operator
import os
import sys
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self

import tripwire._core as _core

from . import catalogue, serialization, tensors
from .catalogue import _TORCH_PROBES, GuardKind, GuardSpec
from .errors import FormatError, GuardBuildError, GuardEvalError
from .failure import Failure, make_failure
from .source import CPP_TENSOR_STEPS, Source, key_identity

__all__ = ["GuardSet", "build_guard_set"]

_PROBE_IDS = {name: i for i, name in enumerate(_core.builtin_probes())}  # core::BuiltinProbe
_WEAK_KINDS = (GuardKind.TYPE_MATCH, GuardKind.ID_MATCH, GuardKind.CODE_MATCH)
_SHAPE = GuardKind.SHAPE
# The kinds GuardSpec.weakened() may change (the others it returns as they are).
_MAY_WEAKEN = catalogue._WEAKENED_KINDS | {GuardKind.EQUALS_MATCH}
_index_of = operator.attrgetter("index")
_kind_of = operator.attrgetter("kind")


class _Pool:
    """The constant pool handed to C++: interned keys/names, plus per-guard operands."""

    def __init__(self) -> None:
        self.consts: list[Any] = []
        self.weak: list[bool] = []
        self._interned: dict[Any, int] = {}
        self.sources: dict[int, _core.SourcePath] = {}
        # Whether a declared source has a step that reads the C++ tensor (TENSOR_SIZE, ...).
        self.reads_cpp_tensor = False

    def intern(self, value: Any) -> int:
        key: Any
        if type(value) is str:  # its own key: an exact str never equals another key (a tuple)
            key = value = sys.intern(value)
        else:
            key = key_identity(value)
        i = self._interned.get(key)
        if i is None:
            i = self._interned[key] = self.add(value)
        return i

    def add(self, value: Any, weak: bool = False) -> int:
        self.consts.append(value)
        self.weak.append(weak)
        return len(self.consts) - 1


def _private_constant(c: Any) -> Any:
    """A copy the user cannot mutate behind the guard's back (lists, dicts, sets)."""
    if type(c) in (list, dict, set, tuple, frozenset):
        return copy.deepcopy(c)
    return c


@functools.lru_cache(maxsize=4096)
def _source_recipe(
    src: Source,
) -> tuple[str, tuple[tuple[Any, Any, int, bool], ...], list[str], bool]:
    """(name, steps as (kind, arg, index, has operand), printed prefixes root first, whether a step
    reads the C++ tensor) of a source: computed once per distinct source (sources are immutable)."""
    steps = tuple((st.kind, st.arg, st.index, st.has_operand) for st in src.steps)
    return src.name, steps, src.printed_prefixes(), src.reads_cpp_tensor


def _source_decl(src: Source, pool: _Pool) -> _core.SourcePath:
    # One declaration per source object and pool (the specs keep the objects alive): guards and
    # shape symbols share sources. Equal sources that are distinct objects get equal
    # declarations, which the engine merges into one node.
    decl = pool.sources.get(id(src))
    if decl is None:
        name, recipe, texts, cpp_tensor = _source_recipe(src)
        steps = [
            _Step(kind, pool.intern(arg)) if has_operand else _Step(kind, None, index)
            for kind, arg, index, has_operand in recipe
        ]
        decl = pool.sources[id(src)] = _core.SourcePath(src.root, pool.intern(name), steps, texts)
        if cpp_tensor:
            pool.reads_cpp_tensor = True
    return decl


_Step = _core.Step


class _ShapeDecls:
    """A set's SHAPE relations as GuardSetCore takes them in one call (bind_guard_set.cpp,
    add_shape_decls): per relation its position among the other declarations, its id and its
    spec's own argument tuple (text, symbols, types); each distinct symbol (by identity) once,
    with its declaration. No Python object per relation is made here."""

    def __init__(self) -> None:
        self.at: list[int] = []
        self.ids: list[int] = []
        self.args: list[tuple] = []

    def symbols(self, pool: _Pool) -> tuple[list[Source], list[_core.SourcePath]]:
        """Each distinct symbol (by identity, in order of first use) and its declaration."""
        syms = list({id(sym): sym for a in self.args for sym in a[1]}.values())
        sources = pool.sources
        return syms, [sources.get(id(sym)) or _source_decl(sym, pool) for sym in syms]


def _encode(specs: list[GuardSpec], pool: _Pool, shape: _ShapeDecls) -> list[_core.GuardDecl]:
    """The specs as the engine's typed declarations, their objects in ``pool``; the SHAPE
    relations go to ``shape`` (declared by the engine in one call). Which slot holds what per kind
    is the catalogue's table (catalogue.py); the engine checks the slots a kind uses against its
    own (core::guard_shape) when it compiles."""
    decls: list[_core.GuardDecl] = []
    for s in specs:
        k, a = s.kind, s.args
        if k is _SHAPE:
            if type(a) is not tuple:  # a spec made by hand may hold a list
                a = tuple(a)
            if type(a) is not tuple or len(a) != 3:
                raise GuardBuildError(f"SHAPE takes (relation text, symbols, symbol types), not {a!r}")
            shape.at.append(len(decls))
            shape.ids.append(s.index)
            shape.args.append(a)
            continue
        op = op2 = None
        n = n2 = 0
        flag = False
        data: list[int] = []
        more: list[_core.SourcePath] = []
        if k is GuardKind.TENSOR_MATCH:
            op, data = pool.add(a[0], weak=True), a[1].to_data()
        elif k is GuardKind.ARRAY_MATCH:
            op, op2, data = pool.add(a[0], weak=True), pool.add(a[1].dtype), a[1].to_data()
        elif k is GuardKind.DIMENSION_MARKING:
            m = a[0]
            op, op2 = pool.add(_private_constant(m.shape_ids)), pool.add(_private_constant(m.unbacked_bounds))
            flag, data = m.dependent, m.to_data()
        elif k is GuardKind.ALIAS:
            more = [_source_decl(a[0], pool)]
        elif k is GuardKind.NO_ALIAS:
            more = [_source_decl(x, pool) for x in a[0]]
        elif k is GuardKind.STORAGE_OVERLAPPING:
            more, n = [_source_decl(x, pool) for x in a[0]], a[1]
            tensors.ensure_torch()  # torch's overlap rule reads tensor metadata through the adapter
        elif k in _WEAK_KINDS:
            if k is GuardKind.TYPE_MATCH and not isinstance(a[0], type):
                raise GuardBuildError(f"TYPE_MATCH on {s.source} needs a type, got {a[0]!r}")
            op = pool.add(a[0], weak=True)
        elif k is GuardKind.EQUALS_MATCH:
            op = pool.add(_private_constant(a[0]), weak=isinstance(a[0], enum.Enum))
            flag = _python_eq(a)
        elif k in (GuardKind.LENGTH, GuardKind.TUPLE_ITERATOR_LEN, GuardKind.DICT_VERSION):
            n = a[0]
        elif k is GuardKind.DISPATCH_KEY_SET_MATCH:
            n = a[0] - (1 << 64) if a[0] >= 1 << 63 else a[0]  # the raw bits as the engine's int64
            tensors.ensure_torch()  # read through the adapter only
        elif k is GuardKind.DICT_KEYS:
            op2 = pool.add(tuple(_private_constant(x) for x in a[0]))
            flag = a[1]
        elif k in (GuardKind.DICT_CONTAINS, GuardKind.SET_CONTAINS):
            op, flag = pool.add(a[0]), a[1]
        elif k is GuardKind.HASATTR:
            op, flag = pool.intern(a[0]), a[1]
        elif k is GuardKind.RANGE_ITERATOR:
            op = pool.add(range(*a))
        elif k is GuardKind.GLOBAL_STATE:
            probe, snapshot = a[0], a[1]
            if probe == "torch_global_state":
                n, data = _PROBE_IDS[probe], list(snapshot)
            elif probe in _TORCH_PROBES:
                n, op2 = _PROBE_IDS[probe], pool.add(snapshot)
            elif isinstance(probe, str):
                n, n2 = _PROBE_IDS[probe], int(snapshot)
            else:
                op, op2 = pool.add(probe), pool.add(_private_constant(snapshot))
        elif k is GuardKind.LAMBDA:
            op = pool.add(a[0])
        source = None if s.source is None else _source_decl(s.source, pool)
        decls.append(
            _core.GuardDecl(
                k, source, op, op2, n=n, n2=n2, flag=bool(flag), id=s.index, data=data, more_sources=more
            )
        )
    if shape.args:
        _ensure_shape_readers()
    elif pool.reads_cpp_tensor:
        tensors.ensure_torch()  # the C++ tensor steps read only through the adapter
    return decls


def _ensure_shape_readers() -> None:
    # Sizes and strides read in C++ where exact (runtime/tensors/property_reader.hpp); neither
    # call imports its framework.
    tensors.ensure_torch()
    tensors.ensure_numpy()


def encode_decls(specs: list[GuardSpec], pool: _Pool) -> list[_core.GuardDecl]:
    """Every spec as a GuardDecl, SHAPE relations included, in the specs' order (to_bytes): the
    relations declared by the engine, as a GuardSet's constructor declares them."""
    shape = _ShapeDecls()
    decls = _encode(specs, pool, shape)
    if not shape.args:
        return decls
    symbols, paths = shape.symbols(pool)
    try:
        return _core.with_shape_decls(decls, shape.at, shape.ids, shape.args, symbols, paths)
    except (ValueError, TypeError) as e:
        raise GuardBuildError(str(e)) from None


def _encode_saved(specs: list[GuardSpec]) -> tuple[_Pool, list[_core.GuardDecl]]:
    """The pool and declarations of the specs a set saves (serialization.dumps adds its baselines
    to the pool)."""
    pool = _Pool()
    return pool, encode_decls(specs, pool)


class GuardSet(_core.GuardSetCore):
    """A built guard set. Build one with :class:`tripwire.GuardBuilder` or :func:`guards_for`.

    ``check(f_locals) -> bool`` is the hot path (C++). ``G[...]`` sources read the globals dict
    given at build time; ``C[...]`` sources the closure cells given at build time.
    """

    def __new__(
        cls,
        specs: list[GuardSpec],
        f_globals: dict | None = None,
        f_closure: Mapping[str, Any] | None = None,
        *,
        strict: bool = False,
        baselines: Mapping[str, Any] | None = None,
    ) -> GuardSet:
        # The whole construction happens here, not in __init__: when the engine refuses the
        # program, the half-made object is dropped before the error is raised, so no frame of
        # the traceback holds an instance whose C++ part was never constructed (nanobind warns
        # "uninitialized instance" on any later use of one, e.g. a traceback printer's repr).
        pool = _Pool()
        shape = _ShapeDecls()
        decls = _encode(specs, pool, shape)
        closure = dict(f_closure) if f_closure is not None else None
        symbols, paths = shape.symbols(pool) if shape.args else ([], [])
        self = _core.GuardSetCore.__new__(cls)
        error: Exception
        try:
            _core.GuardSetCore.__init__(
                self,
                decls,
                pool.consts,
                pool.weak,
                f_globals,
                closure,
                strict,
                GuardEvalError,
                shape.at,
                shape.ids,
                shape.args,
                symbols,
                paths,
            )
        except GuardBuildError as e:
            error = GuardBuildError(*e.args)
        except ValueError as e:
            error = GuardBuildError(str(e))
        else:
            self._set_state(specs, f_globals, strict, (), dict(baselines or {}), shape.ids)
            self._built_symbols = symbols  # for build_guard_set's reader facts
            return self
        del self  # the only reference: the instance is freed here, never seen again
        raise error

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Built by __new__ (the arguments are __new__'s); nothing is left to do."""

    if TYPE_CHECKING:
        # The hot path is a plain C method (METH_O, _core's stub types it as a method descriptor):
        # its signature for type checkers.
        def check(self, f_locals: Mapping[str, Any], /) -> bool:
            """True when every guard holds for these locals. Never raises for a failing guard
            (only in strict mode, or for KeyboardInterrupt and other non-Exception errors)."""
            ...

    # The engine's reader facts on the example the set was built from, per symbol in its own order
    # (build_guard_set; _example_reader_facts maps them to the symbols); None for a set built
    # from specs or loaded.
    _example_facts: list[tuple[str, tuple]] | None = None
    # The counters (checks, passes, fast passes, residue passes) after the set's own checks on its
    # example (build_guard_set): explain() counts the caller's checks only.
    _own_counts: tuple[int, int, int, int] = (0, 0, 0, 0)
    # The distinct SHAPE symbols declared by __init__ (empty for a loaded set).
    _built_symbols: list[Source] = []  # noqa: RUF012 - never mutated: replaced per instance

    def _set_state(
        self,
        specs: list[GuardSpec],
        f_globals: dict | None,
        strict: bool,
        dropped: tuple[tuple[str, str, str], ...],
        baselines: dict[str, Any],
        shape_ids: list[int] | None = None,
    ) -> None:
        # Diagnostics keep the specs, with identity-held objects weakened: a GuardSet holds no
        # strong reference to the objects it names by identity. ``shape_ids``: the SHAPE specs'
        # indices as _encode read them, in the specs' order.
        if shape_ids is not None and len(shape_ids) == len(specs):
            # Every spec is a SHAPE relation (nothing to weaken), and their indices are known: no
            # Python call per spec when they come in index order, as a builder's do.
            ordered = specs if shape_ids == sorted(shape_ids) else sorted(specs, key=_index_of)
            weakened = tuple(ordered)
        else:
            ordered = sorted(specs, key=_index_of)
            if _MAY_WEAKEN.isdisjoint(map(_kind_of, ordered)):
                weakened = tuple(ordered)  # nothing to weaken: no Python loop over them
            else:
                weakened = tuple(s.weakened() if s.kind in _MAY_WEAKEN else s for s in ordered)
        # By index: made on the first diagnostic that asks (_diagnostic_state).
        self._built: tuple[tuple[GuardSpec, ...], dict[int, GuardSpec] | None] | None = (weakened, None)
        self._lazy: Any = None
        self.strict = strict
        self._f_globals = f_globals  # the runtime set holds it too; kept for to_bytes
        self._dropped = tuple(dropped)
        self._baselines = baselines

    @classmethod
    def _from_document(
        cls, doc: Any, consts: list[Any], f_globals: dict | None, baselines: dict[str, Any]
    ) -> Self:
        """A loaded set (serialization.loads): the decoded document ``doc`` and its constants,
        everything validated at load; the GuardSpecs are built on the first diagnostic
        (``guards``, ``why_not``, ``explain``...) from what the load kept."""
        self = _core.GuardSetCore.__new__(cls)
        try:
            _core.GuardSetCore.__init__(self, doc, consts, f_globals, doc.strict, GuardEvalError)
        except (ValueError, TypeError, RuntimeError) as e:
            del self  # never constructed: no frame of the traceback may hold it (__new__)
            raise FormatError(f"the guard program is invalid: {e}") from None
        held, weak_positions = doc.hold_weakly(consts)
        self._built = None
        self._lazy = (doc, held, weak_positions)
        self.strict = doc.strict
        self._f_globals = f_globals
        self._dropped = tuple(doc.dropped)
        self._baselines = baselines
        return self

    def _diagnostic_state(self) -> tuple[tuple[GuardSpec, ...], dict[int, GuardSpec]]:
        # Lock-free: a second thread (or a finalizer run by a collection during the build) that
        # gets here first builds the same specs from the same load-time objects, and each
        # publishes one consistent tuple with one assignment.
        built = self._built
        if built is None:
            lazy = self._lazy
            if lazy is None:  # another thread published between the two reads
                built = self._built
                assert built is not None
            else:
                specs = tuple(serialization.loaded_specs(lazy, self._decls()))
                built = (specs, {s.index: s for s in specs})
                self._built = built
                self._lazy = None
        by_id = built[1]
        if by_id is None:  # a built set's specs, by index on the first diagnostic
            by_id = {s.index: s for s in built[0]}
            self._built = (built[0], by_id)
        return built[0], by_id

    @property
    def _specs(self) -> tuple[GuardSpec, ...]:
        return self._diagnostic_state()[0]

    @property
    def _by_id(self) -> dict[int, GuardSpec]:
        return self._diagnostic_state()[1]

    # -- serialization -------------------------------------------------------------------------------
    def to_bytes(self, *, drop: Iterable[str] = ()) -> bytes:
        """The set in tripwire's binary format (docs/format.md), for another process.

        Types, functions, code objects, enum members and module-level objects are written as
        references (``module:qualname`` plus a fingerprint), never pickled. A guard that cannot
        survive the process (an ID_MATCH on an object no module attribute holds, DICT_VERSION,
        LAMBDA, a closure-cell source...) raises :class:`tripwire.NotSerializable` listing every
        such guard; ``drop=`` leaves out guards by source (``"L['f']"``) or kind (``"ID_MATCH"``;
        for a set imported by ``tripwire.torch.guards_of`` also torch's kind names, as its
        ``torch_import`` lists them: ``"NO_TENSOR_ALIASING"`` drops the NO_ALIAS guards that
        implement it), and the bytes record what was dropped (:attr:`dropped` of the loaded set). Before
        returning, the bytes are decoded and rebuilt and compared with this set. This set is
        never changed.
        """
        return serialization.dumps(self, drop, _encode_saved, GuardSet)

    def _drop_aliases(self) -> dict[int, frozenset[str]]:
        """Names other than its kind and source that ``to_bytes(drop=...)`` drops a guard by,
        by guard index (none here; an imported set adds torch's kind names)."""
        return {}

    @classmethod
    def from_bytes(
        cls,
        data: bytes,
        *,
        resolve: Callable[[str, str], Any] | None = None,
        allow_modules: Sequence[str] | None = None,
        f_globals: dict | None = None,
    ) -> GuardSet:
        """Load a set written by :meth:`to_bytes`. No code from the data runs.

        References resolve against modules already imported (``sys.modules``). A module that is
        not imported yet is imported only when a prefix in ``allow_modules`` admits it (``"pkg"``
        admits ``pkg`` and ``pkg.sub``), or else ``resolve(module, qualname)`` is asked for the
        object; otherwise the load fails. Every resolved object must match the fingerprint saved
        with its name. ``G[...]`` sources read ``f_globals`` when given, else the ``__dict__`` of
        the module recorded at save. Raises :class:`tripwire.FormatError` (a ValueError) naming
        what is wrong and the byte offset.
        """
        return serialization.loads(cls, data, resolve, allow_modules, f_globals)

    @property
    def dropped(self) -> tuple[tuple[str, str, str], ...]:
        """Guards left out when this set was saved (``to_bytes(drop=...)``), as (kind, source,
        description): the loaded set does NOT check them. Empty for a set built in this process."""
        return self._dropped

    @property
    def baselines(self) -> Mapping[str, Any]:
        """Framework state the guards were built under (name -> constant), saved with the set
        (docs/format.md, "Baselines")."""
        return types.MappingProxyType(self._baselines)

    # -- introspection ------------------------------------------------------------------------------
    @property
    def guards(self) -> tuple[GuardSpec, ...]:
        """The guards, in installation order."""
        return self._specs

    def __iter__(self) -> Iterator[GuardSpec]:
        return iter(self._specs)

    def __repr__(self) -> str:
        state = " INVALID" if self.invalid else ""
        return f"<tripwire.GuardSet {len(self)} guards on {self.node_count} sources{state}>"

    # -- diagnostics -----------------------------------------------------------------------------------
    def failures(self, f_locals: Mapping[str, Any]) -> list[Failure]:
        """The failing guards for these locals, in installation order. A source that cannot be
        read is reported once, under the first-installed guard on it or below it (the guards
        below it are not evaluated)."""
        # An answer made while the set was valid is made again when it no longer is: building it
        # allocates, and a collection there may run a finalizer that kills an object the set
        # names. Asked again, a dead set reports the dead object without running any user code,
        # so this loops at most twice, and a dead set never reads as passing.
        while True:
            out = [self._failure(rec) for rec in self._failures(f_locals, False)]
            if out or not self.invalid:
                return out

    def why_not(self, f_locals: Mapping[str, Any]) -> Failure | None:
        """The first failing guard (by installation order) as a Failure, or None if all hold."""
        while True:  # as in failures(): a set that died while answering is asked again
            recs = self._failures(f_locals, True)
            if recs or not self.invalid:
                return self._failure(recs[0]) if recs else None

    def _failure(self, rec: tuple) -> Failure:
        gid, value, reason, fetch_failed = rec
        spec = self._by_id[gid]
        fields = None
        if (
            spec.kind in (GuardKind.TENSOR_MATCH, GuardKind.ARRAY_MATCH)
            and not fetch_failed
            and reason is None
        ):
            # Every field that differs, as the engine read them (the reason names them all).
            try:
                fields = self._field_mismatches(gid, value)
            except Exception as e:  # noqa: BLE001 - a Python reader raised: report it
                reason = f"{type(e).__name__}: {e}"
        return make_failure(spec, value, reason, fetch_failed, fields)

    def explain(self) -> str:
        """The guard tree: one line per source, its guards below it with where they were installed
        and how often they failed, in the current (adaptive) evaluation order."""
        checks = self.check_count - self._own_counts[0]
        lines = [
            f"GuardSet: {len(self)} guards on {self.node_count} sources; "
            f"{checks} check{'' if checks == 1 else 's'}, {self.pass_count - self._own_counts[1]} passed"
            + (f"; INVALID: {self.invalid_reason}" if self.invalid else ""),
            self.fast_path_summary(),
        ]
        if self._dropped:
            lines.append(f"dropped at save ({len(self._dropped)}): NOT checked by this set")
            lines += [f"  {kind} on {src or 'global state'}: {desc}" for kind, src, desc in self._dropped]
        ambient = self._ambient_ids
        if ambient:
            lines.append("ambient (checked once, before any source)")
            for gid in ambient:
                lines.append("  " + self._guard_line(self._by_id[gid], None))
        for depth, text, ids, node_fails, guard_fails, symbol in self._tree():
            pad = "  " * depth
            mark = f"   [shape symbol s{symbol}]" if symbol >= 0 else ""
            mark += _cpp_tensor_mark([self._by_id[gid] for gid in ids])
            lines.append(
                f"{pad}{text}{mark}" + (f"   [fetch/subtree failed {node_fails}x]" if node_fails else "")
            )
            for gid, fails in zip(ids, guard_fails, strict=True):
                lines.append(pad + "  " + self._guard_line(self._by_id[gid], fails))
        relational = self._relational_ids
        if relational:
            lines.append("relational (decided once every source above was read)")
            for gid in relational:
                lines.append("  " + self._guard_line(self._by_id[gid], None))
        lines.extend(self._explain_shape())
        return "\n".join(lines)

    @property
    def fast_path_fraction(self) -> float:
        """The fraction of guards the fast pass decides without running user code (the others are
        residues: predicates, Python probes, hasattr, ..., evaluated in place). 1.0 when empty."""
        return self._fast_guard_count / len(self) if len(self) else 1.0

    def fast_path_summary(self) -> str:
        """One line: guards on the fast path (by kind, and in the last check), residues, skipped."""
        n = len(self)
        fast = self._fast_guard_count
        line = f"fast path: {fast} of {n} guards ({100 * self.fast_path_fraction:.1f}%)"
        _, own_passes, own_fast, own_residue = self._own_counts
        if self.pass_count > own_passes:
            line += (
                f"; last passing check: {self._last_fast_guards} on the fast path, "
                f"{n - self._last_fast_guards} residues, {self._last_skipped_guards} proved by unchanged "
                f"dicts without evaluation; passes: {self._fast_pass_count - own_fast} fast, "
                f"{self._residue_pass_count - own_residue} with residues"
            )
        return line

    def symbol_readers(self, f_locals: Mapping[str, Any]) -> dict[str, str]:
        """How each SHAPE symbol's value is read on this frame, by printed symbol: the C-level
        property reader (an exact ``torch.Tensor``/``torch.nn.Parameter`` with torch's own methods
        and no torch-function mode, through the torch adapter; an exact ``numpy.ndarray``, from
        its struct), a Python call (``x.size()``, ``x.stride()``, ``x.storage_offset()``; for
        another numpy array ``x.shape``/``x.strides``), or, for an int or float symbol, a read
        from the frame (no reader). The reader is chosen per check from the value's type, so this
        is the answer for ``f_locals`` (explain() reports it for the example the set was built
        from). Reading the tensor runs the same steps a check runs (user code included)."""
        return _format_readers(self._reader_facts(f_locals))

    def _reader_facts(
        self, f_locals: Mapping[str, Any], symbols: Iterable[Source] | None = None
    ) -> dict[str, tuple[Source, tuple]]:
        """What decides each symbol's reader on this frame (formatted only when asked for), by
        printed symbol: the engine reads each symbol's tensor once (_symbol_reader_facts).
        ``symbols``: the set's distinct symbols when the caller has them."""
        if symbols is None:
            # Distinct by identity first (relations share their Source objects), in order of use.
            symbols = {
                id(sym): sym for spec in self._specs if spec.kind is _SHAPE for sym in spec.args[1]
            }.values()
        return _facts_by_symbol(self._symbol_reader_facts(f_locals, self._f_globals), symbols)

    @property
    def _example_reader_facts(self) -> dict[str, tuple[Source, tuple]] | None:
        """What decided the SHAPE symbols' readers on the example the set was built from
        (build_guard_set records the engine's answer; explain() formats it); None for a set
        built from specs or loaded."""
        found = self._example_facts
        return None if found is None else _facts_by_symbol(found, self._built_symbols)

    def _explain_shape(self) -> list[str]:
        """The SHAPE section of explain(): counts before and after merging, the reader of each
        symbol, then each relation."""
        info = self._shape_info
        relations = info["relations"]
        if not relations:
            return []
        kept = sum(1 for _, status, _, _ in relations if status == "kept")
        merged = sum(1 for _, status, _, _ in relations if status == "merged")
        implied = sum(1 for _, status, _, _ in relations if status == "implied")
        path = (
            "int64 fast path with exact fallback"
            if info["fast_path"]
            else "exact integers (a constant exceeds int64)"
        )
        lines = [
            f"shape relations (checked after every source): {len(relations)} declared, {kept} evaluated "
            f"({merged} merged as duplicates, {implied} implied by earlier ones); {info['symbols']} symbols, "
            f"{info['operations']} operations, {path}"
        ]
        facts = self._example_reader_facts
        readers = _format_readers(facts) if facts else None
        if readers:
            lines.append(
                "  symbol readers, on the example the set was built from (chosen per check by type):"
            )
            lines += [f"    {sym}: {how}" for sym, how in readers.items()]
        else:
            lines.append(
                "  symbol readers: chosen per check by the value's type (no example recorded; "
                "GuardSet.symbol_readers(f_locals) says for a frame)"
            )
        for gid, status, by, fails in relations:
            line = "  " + self._guard_line(self._by_id[gid], fails)
            if status == "merged":
                line += f"   [merged: the same relation as #{by}]"
            elif status == "implied":
                line += f"   [dropped: implied by #{by}]"
            lines.append(line)
        return lines

    def _guard_line(self, spec: GuardSpec, fails: int | None) -> str:
        where = _short_site(spec.stack[-1]) if spec.stack else "unknown"
        extra = f", failed {fails}x" if fails else ""
        return f"{spec.kind.name}: {spec.describe()}{self._path_note(spec)}   # #{spec.index}, installed at {where}{extra}"

    def _path_note(self, spec: GuardSpec) -> str:
        """How a tensor, array or torch-state guard reads its value (explain() says it)."""
        k = spec.kind
        if k is GuardKind.DISPATCH_KEY_SET_MATCH:
            return "   [torch adapter only]"
        torch_probe = k is GuardKind.GLOBAL_STATE and spec.args[0] in _TORCH_PROBES
        if k not in (GuardKind.TENSOR_MATCH, GuardKind.ARRAY_MATCH) and not torch_probe:
            return ""
        native = self._guard_path(spec.index) == "native"
        if k is GuardKind.ARRAY_MATCH:
            return "   [numpy struct]" if native else "   [python reader]"
        return "   [torch adapter]" if native else "   [python reader: no torch adapter]"


def _short_site(site: str) -> str:
    """'dir/file.py:12 in f' for an install site, shortening the path for one-line display."""
    path, sep, rest = site.partition(":")
    parts = path.replace(os.sep, "/").split("/")
    return "/".join(parts[-2:]) + sep + rest


def clear_memos() -> None:
    """Empty this module's memo of the sources' recipes (builder.clear_build_memos)."""
    _source_recipe.cache_clear()


def build_guard_set(
    specs: list[GuardSpec],
    f_locals: Mapping[str, Any],
    f_globals: dict | None,
    f_closure: Mapping[str, Any] | None,
    *,
    strict: bool = False,
    baselines: Mapping[str, Any] | None = None,
) -> GuardSet:
    """Compile specs and verify the set passes on the example it was built from."""
    # GuardSet.__new__ called as type.__call__ would, without type.__call__'s second step (the
    # empty GuardSet.__init__, a Python frame taking every argument again).
    gs = _new_guard_set(GuardSet, specs, f_globals, f_closure, strict=strict, baselines=baselines)
    try:
        ok = gs.check(f_locals)
    except GuardEvalError as e:
        raise GuardBuildError(f"guard set raised on the example it was built from: {e}") from e
    if not ok:
        f = gs.why_not(f_locals)
        why = f.reason if f is not None else "unknown guard"
        raise GuardBuildError(f"guard set fails on the example it was built from: {why}")
    if gs._built_symbols:
        gs._example_facts = gs._symbol_reader_facts(f_locals, f_globals)
    gs._own_counts = (gs.check_count, gs.pass_count, gs._fast_pass_count, gs._residue_pass_count)
    return gs


_new_guard_set = GuardSet.__new__


def reads_cpp_tensor(spec: GuardSpec) -> bool:
    """Whether a guard's source, another source of a relational guard, or a SHAPE symbol has a step
    that reads the C++ tensor (TENSOR_SIZE, TENSOR_STRIDE, TENSOR_STORAGE_OFFSET, GRAD)."""
    srcs = [spec.source, *(a for a in spec.args if type(a) is Source)]  # never a __class__ lookup
    if spec.kind is _SHAPE:
        srcs += list(spec.args[1])
    return any(x is not None and x.reads_cpp_tensor for x in srcs)


def _cpp_tensor_mark(specs: list) -> str:
    """explain()'s note on a node whose step reads the C++ tensor (torch's TensorPropertyGuardAccessor
    / GradGuardAccessor: printed as torch prints them, which is also how the Python-level SIZE /
    STRIDE / STORAGE_OFFSET and ``.grad`` print)."""
    src = specs[0].source if specs else None
    if src is None or not src.steps or src.steps[-1].kind not in CPP_TENSOR_STEPS:
        return ""
    return f"   [{src.steps[-1].kind.name}: the C++ tensor, torch adapter only]"


def _python_eq(args: tuple) -> bool:
    """EQUALS_MATCH's optional second argument: Python's ``==`` instead of the type-exact match."""
    if len(args) == 1:
        return False
    if len(args) == 2 and type(args[1]) is bool:
        return args[1]
    raise GuardBuildError(
        f"EQUALS_MATCH takes (constant,) or (constant, python_eq: bool), not {len(args)} arguments"
    )


_PROPERTY_CALLS = {_core.StepKind.SIZE: "size()", _core.StepKind.STRIDE: "stride()",
                   _core.StepKind.STORAGE_OFFSET: "storage_offset()"}  # fmt: skip
_ARRAY_ATTRS = {_core.StepKind.SIZE: "shape", _core.StepKind.STRIDE: "strides"}


def _facts_by_symbol(
    found: list[tuple[str, tuple]], symbols: Iterable[Source]
) -> dict[str, tuple[Source, tuple]]:
    """The engine's reader facts (by printed symbol) as {printed symbol: (symbol, fact)}, in the
    order the symbols are given. Equal symbols print alike (and a symbol's print is kept on it)."""
    by_text = dict(found)
    facts: dict[str, tuple[Source, tuple]] = {}
    for sym in symbols:
        text = str(sym)
        if text not in facts and text in by_text:
            facts[text] = (sym, by_text[text])
    return facts


def _format_readers(facts: dict[str, tuple[Source, tuple]]) -> dict[str, str]:
    forced = _core._force_python_readers(False)  # read the switch (and put it back)
    _core._force_python_readers(forced)
    adapter = _core.torch_adapter_installed()
    return {text: _format_reader(sym, fact, forced, adapter) for text, (sym, fact) in facts.items()}


def _format_reader(sym: Source, fact: tuple, forced: bool, adapter: bool) -> str:
    """One symbol's reader, in words (GuardSet.symbol_readers, explain())."""
    if fact[0] == "frame":
        return "read from the frame (an int or float value; no property reader)"
    parent = Source(sym.root, sym.name, sym.steps[:-1])
    if fact[0] == "unreadable":
        return f"{parent} not readable here ({fact[1]})"
    _, t, answered, is_array, is_tensor = fact
    last = sym.steps[-1]
    if answered:
        if is_array:
            return "C-level property reader (exact numpy.ndarray: the array struct)"
        return f"C-level property reader (exact {t.__module__}.{t.__qualname__}: the torch adapter)"
    if is_array and last.kind in _ARRAY_ATTRS:
        why = "C-level readers switched off" if forced else f"{t.__name__} is not exactly numpy.ndarray"
        return f"Python: {parent}.{_ARRAY_ATTRS[last.kind]} ({why})"
    why = (
        "no torch adapter"
        if is_tensor and not adapter
        else "not an exact plain tensor or array, or a mode/override is active"
    )
    return f"Python call: {parent}.{_PROPERTY_CALLS[last.kind]} ({t.__name__}: {why})"
