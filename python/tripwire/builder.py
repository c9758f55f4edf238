"""GuardBuilder: declare guards against example values, then build an immutable GuardSet.

The builder reads expected values from the example frame (``f_locals``, ``f_globals``, closure
cells) the way Dynamo's GuardBuilder reads them from the frame being traced. Every guard records
the user stack that installed it, so a failure can say why the guard exists.
"""

from __future__ import annotations

import copy
import functools
import sys
import types
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import tripwire._core as _core

from . import guard_set, shapes, source, tensors
from ._package import is_own_file
from .catalogue import GuardKind, GuardSpec
from .errors import GuardBuildError, ShapeSyntaxError
from .guard_set import build_guard_set
from .source import Source, SourceLike
from .tensors import ArrayExpectation, DimensionMarkings, TensorExpectation

if TYPE_CHECKING:
    from .guard_set import GuardSet

__all__ = ["Checkpoint", "GuardBuilder"]

_UNSET: Any = object()
_STACK_DEPTH = 8


def _is_machinery(filename: str) -> bool:
    """Whether a frame of this file is never the place a guard "was installed": tripwire's own
    (_package.is_own_file) or frozen importlib's. The stack walk (runtime/frame/install_site.hpp)
    asks it once per code position and memoises the answer."""
    return filename.startswith("<frozen ") or is_own_file(filename)


def _user_stack() -> tuple[str, ...]:
    """The caller's stack outside tripwire's machinery, innermost last, as 'file:line in func'
    (walked in C through CPython's frame objects, each frame's site memoised:
    runtime/frame/install_site.hpp)."""
    return _core.user_stack(_is_machinery, _STACK_DEPTH)


@functools.lru_cache(maxsize=4096)
def _read_args(src: Source) -> tuple[Any, str, list[tuple[Any, Any, int]]]:
    """(root, name, steps) of a source as ``_core.read_source`` takes them: computed once per
    distinct source (sources are immutable)."""
    return src.root, src.name, [(st.kind, st.arg if st.has_operand else None, st.index) for st in src.steps]


def clear_build_memos() -> None:
    """Empty every memo a build fills (what a process building these texts for the first time
    starts with): install-site strings, the parse caches of relations and sources, the sources'
    recipes and read arguments, the machinery answers. For the tests that empty them mid-build."""
    _core._clear_install_site_memo()
    shapes.clear_memos()
    source.clear_memos()
    guard_set.clear_memos()
    _read_args.cache_clear()
    is_own_file.cache_clear()


_Relation = shapes.Relation
_SHAPE = GuardKind.SHAPE  # an enum member from its class is an attribute lookup through the metaclass


class Checkpoint:
    """An opaque mark in a builder's guard list, made by ``GuardBuilder.checkpoint()``."""

    __slots__ = ("_builder", "_count")

    def __init__(self, builder: GuardBuilder, count: int) -> None:
        self._builder = builder
        self._count = count


class GuardBuilder:
    """Collects guards for one frame and builds a :class:`tripwire.GuardSet`.

    Args:
        f_locals: the example locals (name -> value) the guards are built against; ``L['x']``.
        f_globals: the globals dict; ``G['x']`` sources read it at check time (it is kept).
        f_closure: closure cells, as a function (its ``__closure__`` by ``co_freevars``) or a
            mapping name -> cell; ``C['x']`` sources read the cell's contents at check time.
        guard_filter: optional callable ``(list[GuardSpec]) -> list[bool]`` applied at build time;
            guards whose entry is False are dropped (Dynamo's ``guard_filter_fn``).

    A builder belongs to the thread that declares on it: it is not thread-safe (two threads, or a
    finalizer run by a collection in another thread, declaring on one builder may give two guards
    one index). Build sets on as many threads as you like, one builder each; a built GuardSet is
    safe to check from any thread.
    """

    def __init__(
        self,
        f_locals: Mapping[str, Any],
        f_globals: dict | None = None,
        f_closure: Any = None,
        *,
        guard_filter: Callable[[list[GuardSpec]], list[bool]] | None = None,
    ) -> None:
        if type(f_locals) is not dict and not isinstance(f_locals, Mapping):  # a dict: no ABC check
            raise TypeError(f"f_locals must be a mapping, not {type(f_locals).__name__}")
        if f_globals is not None and type(f_globals) is not dict:
            raise TypeError("f_globals must be a dict")
        self.f_locals = f_locals
        self.f_globals = f_globals
        self.f_closure = _closure_cells(f_closure)
        self.guard_filter = guard_filter
        self._specs: list[GuardSpec] = []
        self._next_index = 0
        self._baselines: dict[str, Any] = {}

    # -- bookkeeping -----------------------------------------------------------------------------
    @property
    def guards(self) -> list[GuardSpec]:
        """The guards declared so far (a copy)."""
        return list(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def checkpoint(self) -> Checkpoint:
        """Mark the current guard list; ``restore`` rolls back guards added after it."""
        return Checkpoint(self, len(self._specs))

    def restore(self, cp: Checkpoint) -> None:
        """Drop every guard declared after checkpoint ``cp`` (speculation rolled back)."""
        if not isinstance(cp, Checkpoint) or cp._builder is not self:
            raise ValueError("checkpoint belongs to another builder")
        if cp._count > len(self._specs):
            raise ValueError("checkpoint is newer than the builder's state (already restored past it)")
        del self._specs[cp._count :]

    def value(self, source: SourceLike) -> Any:
        """The example value at ``source``, read by the engine exactly as a check will read it;
        raises GuardBuildError when it cannot be fetched."""
        src = Source.parse(source)
        root, name, steps = _read_args(src)
        try:
            return _core.read_source(root, name, steps, self.f_locals, self.f_globals, self.f_closure)
        except Exception as e:  # noqa: BLE001 - whatever user code raised while reading
            raise GuardBuildError(f"cannot read {src} from the example: {_exc_text(e)}") from None

    def add(self, kind: GuardKind, source: SourceLike | None, args: tuple = ()) -> GuardSpec:
        """Declare a guard directly (the typed methods below are the usual way)."""
        src = None if source is None else Source.parse(source)
        kind, args, stack = GuardKind(kind), tuple(args), _user_stack()
        spec = GuardSpec(kind, src, args, self._take_index(), stack)
        self._specs.append(spec)
        return spec

    def _take_index(self) -> int:
        """The next guard's index, taken at once. Anything that allocates can run a collection,
        and with it finalizers that declare guards on this builder: the index is read and advanced
        with nothing in between that could (an int is not tracked by the collector), after every
        call that can run user code, so no two guards share one. build() orders specs by index."""
        index = self._next_index
        self._next_index = index + 1
        return index

    # -- the catalogue ------------------------------------------------------------------------------
    def type_match(self, source: SourceLike, type: type = _UNSET) -> GuardSpec:
        """``type(v) is t``; t defaults to the example value's type."""
        t = builtins_type(self.value(source)) if type is _UNSET else type
        return self.add(GuardKind.TYPE_MATCH, source, (t,))

    def id_match(self, source: SourceLike, obj: Any = _UNSET) -> GuardSpec:
        """``v is obj``; obj defaults to the example value (held weakly when possible)."""
        o = self.value(source) if obj is _UNSET else obj
        return self.add(GuardKind.ID_MATCH, source, (o,))

    def none(self, source: SourceLike) -> GuardSpec:
        """``v is None``."""
        return self.add(GuardKind.NONE, source)

    def not_none(self, source: SourceLike) -> GuardSpec:
        """``v is not None``."""
        return self.add(GuardKind.NOT_NONE, source)

    def true(self, source: SourceLike) -> GuardSpec:
        """``v is True``."""
        return self.add(GuardKind.TRUE, source)

    def false(self, source: SourceLike) -> GuardSpec:
        """``v is False``."""
        return self.add(GuardKind.FALSE, source)

    def equals(self, source: SourceLike, value: Any = _UNSET, *, python_eq: bool = False) -> GuardSpec:
        """``type(v) is type(c) and v == c`` (recursively type-exact, NaN matches NaN).

        With ``python_eq=True``: ``v is c or (type(v) is type(c) and v == c)`` with Python's own
        ``==`` (torch's EQUALS_MATCH: ``(True, 1) == (1, 1)``, an element's ``__eq__`` is asked).
        Decided without user code where the interpreter's comparisons decide it (exact int,
        bool, float, str, None, and tuples/lists of these); otherwise Python's ``==`` runs."""
        c = self.value(source) if value is _UNSET else value
        _ensure_frameworks(c)
        if not _core.is_constant(c):
            raise GuardBuildError(
                f"EQUALS_MATCH on {Source.parse(source)}: {builtins_type(c).__name__} is not a "
                "constant type (int, float, complex, str, bytes, bool, None, range, slice, "
                "Ellipsis, enum members, registered value types such as torch.dtype, torch.device, "
                "torch.Size and simple numpy dtypes, and tuples/lists/sets/frozensets/dicts of these, "
                f"nested at most {_core.MAX_CONSTANT_DEPTH} deep)"
            )
        if python_eq:
            return self.add(GuardKind.EQUALS_MATCH, source, (_private_copy(c), True))
        return self.add(GuardKind.EQUALS_MATCH, source, (_private_copy(c),))

    def length(self, source: SourceLike, n: int = _UNSET) -> GuardSpec:
        """``len(v) == n``; n defaults to the example's length."""
        if n is _UNSET:
            try:
                n = len(self.value(source))
            except GuardBuildError:
                raise
            except Exception as e:  # noqa: BLE001
                raise GuardBuildError(f"len({Source.parse(source)}) failed: {e!r}") from None
        return self.add(GuardKind.LENGTH, source, (int(n),))

    def dict_keys(self, source: SourceLike, keys: Any = _UNSET, *, ordered: bool = True) -> GuardSpec:
        """``list(dict.keys(v)) == keys`` (set-equal when not ordered); keys must be constants."""
        if keys is _UNSET:
            v = self.value(source)
            if not isinstance(v, dict):
                raise GuardBuildError(f"DICT_KEYS on {Source.parse(source)}: not a dict")
            keys = list(dict.keys(v))
        keys = tuple(keys)
        for k in keys:
            # Depth 1: the engine holds the keys in a tuple, one level of nesting.
            if not _core.is_constant(k, 1):
                raise GuardBuildError(f"DICT_KEYS on {Source.parse(source)}: key {k!r} is not a constant")
        return self.add(GuardKind.DICT_KEYS, source, (keys, bool(ordered)))

    def dict_contains(self, source: SourceLike, key: Any, present: bool = _UNSET) -> GuardSpec:
        """``(key in dict) is present``; present defaults to what the example shows."""
        if present is _UNSET:
            v = self.value(source)
            present = isinstance(v, dict) and dict.__contains__(v, key)
        return self.add(GuardKind.DICT_CONTAINS, source, (key, bool(present)))

    def set_contains(self, source: SourceLike, item: Any, present: bool = _UNSET) -> GuardSpec:
        """``(item in s) is present`` for a set or frozenset s (subclasses included, looked up in
        the set's own table, never through an overridden ``__contains__``); anything else fails.
        present defaults to what the example shows. The item must be hashable: the check hashes
        it, and never retries an unhashable set as a frozenset as ``set.__contains__`` does."""
        try:
            hash(item)
        except TypeError as e:
            raise GuardBuildError(
                f"SET_CONTAINS on {Source.parse(source)}: the item is unhashable ({e})"
            ) from None
        if present is _UNSET:
            v = self.value(source)
            if isinstance(v, set):
                present = set.__contains__(v, item)
            else:
                present = isinstance(v, frozenset) and frozenset.__contains__(v, item)
        return self.add(GuardKind.SET_CONTAINS, source, (item, bool(present)))

    def hasattr(self, source: SourceLike, name: str, present: bool = _UNSET) -> GuardSpec:
        """``hasattr(v, name) is present``; present defaults to what the example shows."""
        if present is _UNSET:
            present = builtins_hasattr(self.value(source), name)
        return self.add(GuardKind.HASATTR, source, (str(name), bool(present)))

    def dict_version(self, source: SourceLike) -> GuardSpec:
        """The dict is the same dict, unmodified since now."""
        v = self.value(source)
        if builtins_type(v) is not dict:
            raise GuardBuildError(f"DICT_VERSION on {Source.parse(source)}: needs an exact dict")
        try:
            stamp = _core.dict_version(v)
        except ValueError as e:
            raise GuardBuildError(f"DICT_VERSION on {Source.parse(source)}: {e}") from None
        return self.add(GuardKind.DICT_VERSION, source, (stamp,))

    def tuple_iterator_len(self, source: SourceLike, n: int = _UNSET) -> GuardSpec:
        """A tuple iterator with n items left."""
        if n is _UNSET:
            n = self.value(source).__length_hint__()
        return self.add(GuardKind.TUPLE_ITERATOR_LEN, source, (int(n),))

    def range_iterator(
        self, source: SourceLike, start: int = _UNSET, stop: int = _UNSET, step: int = _UNSET
    ) -> GuardSpec:
        """A range iterator whose remaining items are ``range(start, stop, step)``."""
        if start is _UNSET:
            it = self.value(source)
            _, (r,), pos = it.__reduce__()
            rest = r[pos:]
            start, stop, step = rest.start, rest.stop, rest.step
        return self.add(GuardKind.RANGE_ITERATOR, source, (int(start), int(stop), int(step)))

    def code_match(self, source: SourceLike, code: types.CodeType = _UNSET) -> GuardSpec:
        """``v.__code__ is code``; code defaults to the example's."""
        c = self.value(source).__code__ if code is _UNSET else code
        return self.add(GuardKind.CODE_MATCH, source, (c,))

    def weakref_alive(self, source: SourceLike) -> GuardSpec:
        """``v() is not None`` for a weak reference v."""
        return self.add(GuardKind.WEAKREF_ALIVE, source)

    def global_state(
        self, probe: str | Callable[[], Any], *, name: str | None = None, snapshot: Any = _UNSET
    ) -> GuardSpec:
        """An ambient-state probe returns what it returns now (or ``snapshot``, for a built-in probe).

        ``probe`` is the name of a built-in C++ probe or a Python callable of no arguments returning
        a constant (see ``equals``). Built-in probes: ``"recursion_limit"``, ``"gc_enabled"``, and
        torch's state (through the torch adapter when it is built, else through Python):
        ``"torch_global_state"`` (grad mode, autocast per device and its cache flag, torch function
        enabled and all-disabled, deterministic algorithms and warn-only, TF32, FP16/BF16
        reduced-precision reductions, thread count, default dtype; ``snapshot`` may be torch's
        GlobalStateGuard JSON, a str or dict, or the plain tuple), ``"torch_function_mode_stack"``
        (the types of the modes on the stack; ``snapshot``: a tuple of types) and
        ``"torch_default_device"`` (``torch.utils._device.CURRENT_DEVICE``; ``snapshot``: None or
        a device string such as ``"cuda:0"``) and ``"torch_saved_tensors_hooks"`` (the top of the
        saved-tensor default hooks stack as Dynamo's AUTOGRAD_SAVED_TENSORS_HOOKS guard reads it:
        None unless both hooks are ``torch.fx.GraphModule`` instances, else their ids;
        ``snapshot``: None or a tuple of two ids) and ``"torch_dual_level"``
        (``torch.autograd.forward_ad._current_level`` as Dynamo's DUAL_LEVEL_MATCH reads it: the
        guard holds while it is an int equal to the snapshot; ``snapshot``: an int, -1 outside
        any ``dual_level()``).
        """
        if isinstance(probe, str):
            if probe not in _core.builtin_probes():
                raise GuardBuildError(
                    f"unknown built-in probe {probe!r}; known: {sorted(_core.builtin_probes())}"
                )
            if probe.startswith("torch_") and not tensors.ensure_torch():
                raise GuardBuildError(f"built-in probe {probe!r} needs torch, which is not imported")
            if snapshot is _UNSET:
                snapshot = _core.read_builtin_probe(probe)
            snapshot = torch_snapshot(probe, snapshot)
            label = name or probe
        else:
            if not callable(probe):
                raise TypeError("probe must be a built-in probe name or a callable")
            if snapshot is not _UNSET:
                raise TypeError("snapshot= is only for built-in probes; a Python probe is read now")
            snapshot = probe()
            label = name or str(getattr(probe, "__qualname__", None) or repr(probe))
            if not _core.is_constant(snapshot):
                raise GuardBuildError(f"probe {label!r} returned a non-constant {snapshot!r}")
            snapshot = _private_copy(snapshot)
        return self.add(GuardKind.GLOBAL_STATE, None, (probe, snapshot, label))

    def predicate(
        self, fn: Callable[[Any], Any], text: str | None = None, *, source: SourceLike | None = None
    ) -> GuardSpec:
        """LAMBDA: the slow escape hatch. Holds when ``fn(v)`` is truthy (``fn(f_locals)`` when no
        source is given). Exceptions make it fail."""
        if not callable(fn):
            raise TypeError("predicate needs a callable")
        label = text or getattr(fn, "__qualname__", repr(fn))
        return self.add(GuardKind.LAMBDA, source, (fn, label))

    lambda_ = predicate

    def shape(self, relation: Any) -> GuardSpec:
        """SHAPE: a relation among symbols that must hold, e.g.
        ``"((6*L['x'].size()[0]) % 4) == 0"`` or ``"2 <= L['n'] <= 1024"``.

        ``relation`` is text in the syntax of docs/guards.md (SHAPE; what torch's shape
        environment prints, with or without its ``# ...`` comment), or a structured expression
        from :mod:`tripwire.shapes` (``sym("L['x'].size()[0]") // 2 <= sym("L['y'].size()[0]")``).
        Every source in it is a symbol: its value is read once per check, and must be an exact
        int or float as on the example. Raises :class:`tripwire.ShapeSyntaxError` (with the offset)
        for text tripwire cannot use, and GuardBuildError when the relation does not hold on the
        example (naming the values).
        """
        rel = relation if type(relation) is _Relation else shapes.parse(relation)
        # The index first, as _take_index takes it (read and advanced with nothing in between that
        # could collect): a guard declared while the relation is read and checked (user code, a
        # finalizer) takes the next one, and the spec is made with this one (no field replaced).
        # A refused relation gives its index back when no guard took one since (no gap).
        index = self._next_index
        self._next_index = index + 1
        try:
            args = (rel.text, rel.symbols, self._checked_symbol_types(rel))
            spec = GuardSpec(_SHAPE, None, args, index, _user_stack())
        except BaseException:
            if self._next_index == index + 1:
                self._next_index = index
            raise
        self._specs.append(spec)
        return spec

    def _checked_symbol_types(self, rel: shapes.Relation) -> tuple[str, ...]:
        """The types of a relation's symbols on the example, each read once; raises the error that
        says why when a symbol cannot be read or is not an int or a float, or when the relation
        does not hold on the values."""
        values = []
        types = []
        codes = []
        for src in rel.symbols:
            v = self.value(src)
            t = builtins_type(v)
            if t is int:
                types.append("int")
                codes.append(0)
            elif t is float:
                types.append("float")
                codes.append(1)
            else:
                raise GuardBuildError(
                    f"shape symbol {src} is a {t.__name__} on the example; a symbol is an int or a float"
                )
            values.append(v)
        # The relation as a check evaluates it (its compiled program memoised by (text, types): a
        # JIT that recompiles checks the same relations again); a pass on the int64 path returns
        # at once, the exact path decides anything else.
        try:
            holds, error, _path = _core.evaluate_relation(rel.text, codes, values, False)
        except ShapeSyntaxError as e:  # a type error: its offset in the text as given
            raise ShapeSyntaxError(e.message, rel.original_offset(e.offset), rel.original) from None
        if not holds:
            raise GuardBuildError(f"shape relation does not hold on the example: {rel.reason(values, error)}")
        return tuple(types)

    # -- tensors, arrays, aliasing ------------------------------------------------------------------------
    def tensor_match(
        self,
        source: SourceLike,
        *,
        dynamic: Iterable[int] | bool = (),
        storage_offset: bool = False,
        expected: TensorExpectation | None = None,
        type: type = _UNSET,
    ) -> GuardSpec:
        """TENSOR_MATCH: exactly what torch's TensorCheck compares, read from the example tensor.

        The exact Python type (a Parameter is not a Tensor), the dispatch key set after the
        thread-local include/exclude sets (device type, conjugate/negative views, inference mode,
        autograd), dtype, device index, requires_grad, rank, each size and stride. ``dynamic``:
        dimensions whose size is not checked (True: every one; a stride whose dense value would
        include a dynamic size is then unchecked too). ``storage_offset``: also check it (torch does
        not). ``expected`` (with ``type``) gives the expectation instead of reading the example,
        e.g. what torch compiled (tripwire.torch imports torch's guards this way).
        """
        if expected is None:
            v = self.value(source)
            if not tensors.is_tensor(v):
                raise GuardBuildError(
                    f"TENSOR_MATCH on {Source.parse(source)}: {_type_name(v)} is not a torch tensor"
                )
            expected = tensors.expect_tensor(v, dynamic=dynamic, storage_offset=storage_offset)
            t = builtins_type(v) if type is _UNSET else type
        else:
            if type is _UNSET:
                raise TypeError("tensor_match(expected=...) needs type= (the exact tensor type)")
            if not tensors.ensure_torch():
                raise GuardBuildError("TENSOR_MATCH needs torch, which is not imported")
            t = type
        if not isinstance(expected, TensorExpectation):
            raise TypeError("expected must be a tripwire.tensors.TensorExpectation")
        return self.add(GuardKind.TENSOR_MATCH, source, (t, expected))

    def array_match(
        self,
        source: SourceLike,
        *,
        dynamic: Iterable[int] | bool = (),
        expected: ArrayExpectation | None = None,
        type: type = _UNSET,
    ) -> GuardSpec:
        """ARRAY_MATCH: a numpy array's exact type, dtype, rank, each size and stride (bytes), the
        C/F contiguity and alignment the example has, and whether it is writeable. ``dynamic`` as
        for ``tensor_match``; ``expected`` (with ``type``) instead of reading the example."""
        if expected is None:
            v = self.value(source)
            if not tensors.is_array(v):
                raise GuardBuildError(
                    f"ARRAY_MATCH on {Source.parse(source)}: {_type_name(v)} is not a numpy array"
                )
            expected = tensors.expect_array(v, dynamic=dynamic)
            t = builtins_type(v) if type is _UNSET else type
        else:
            if type is _UNSET:
                raise TypeError("array_match(expected=...) needs type= (the exact array type)")
            if not tensors.ensure_numpy():
                raise GuardBuildError("ARRAY_MATCH needs numpy, which is not imported")
            t = type
        if not isinstance(expected, ArrayExpectation):
            raise TypeError("expected must be a tripwire.tensors.ArrayExpectation")
        return self.add(GuardKind.ARRAY_MATCH, source, (t, expected))

    def dimension_marking(
        self, source: SourceLike, *, expected: DimensionMarkings | None = None
    ) -> GuardSpec:
        """DIMENSION_MARKING: torch's rule for ``mark_dynamic``-style markings (its
        DIMENSION_DYNAMIC_MARKING_GUARD). A tensor without ``_has_dynamo_dim_marking`` passes; one
        with it fails when none of the marking attributes was present at build time; each marking
        attribute present now must have been present at build time and be a subset of what it held
        then (by its own ``issubset``); ``_dynamo_shape_ids`` and ``_dynamo_unbacked_bounds`` must be
        equal while ``_dynamo_unbacked_indices`` is present (only when it was at build time)."""
        if expected is None:
            expected = tensors.expect_markings(self.value(source))
        if not isinstance(expected, DimensionMarkings):
            raise TypeError("expected must be a tripwire.tensors.DimensionMarkings")
        return self.add(GuardKind.DIMENSION_MARKING, source, (expected,))

    def alias(self, source_a: SourceLike, source_b: SourceLike) -> GuardSpec:
        """ALIAS: the values at the two sources are one object (``a is b``), decided in C++."""
        a, b = Source.parse(source_a), Source.parse(source_b)
        if a == b:
            raise GuardBuildError(f"ALIAS of {a} with itself always holds")
        return self.add(GuardKind.ALIAS, a, (b,))

    def no_alias(self, *sources: SourceLike) -> GuardSpec:
        """NO_ALIAS: the values at two or more sources are pairwise distinct objects (no source is
        exempt, parameters included), decided in C++ without allocating."""
        srcs = [Source.parse(s) for s in sources]
        if len(srcs) < 2:
            raise GuardBuildError("NO_ALIAS needs at least two sources")
        if len(set(srcs)) != len(srcs):
            raise GuardBuildError("NO_ALIAS lists a source twice: it could never hold")
        return self.add(GuardKind.NO_ALIAS, srcs[0], (tuple(srcs[1:]),))

    def storage_overlapping(
        self, *, overlapping: Iterable[SourceLike] = (), non_overlapping: Iterable[SourceLike] = ()
    ) -> GuardSpec:
        """STORAGE_OVERLAPPING (torch's guard of that name): over the tensors at all these sources,
        exactly the ``overlapping`` ones may overlap another by torch's rule (pairwise
        ``tensors_definitely_do_not_overlap`` on storage offset, sizes, strides and contiguity; the
        storages themselves are not compared), and the ``non_overlapping`` ones overlap none.
        Decided in C++ through the torch adapter (refused without it); a non-tensor fails."""
        over = [Source.parse(s) for s in overlapping]
        rest = [Source.parse(s) for s in non_overlapping]
        srcs = over + rest
        if len(srcs) < 2:
            raise GuardBuildError("STORAGE_OVERLAPPING needs at least two sources")
        if len(set(srcs)) != len(srcs):
            raise GuardBuildError("STORAGE_OVERLAPPING lists a source twice")
        if len(over) == 1:
            raise GuardBuildError("STORAGE_OVERLAPPING with one overlapping tensor could never hold")
        return self.add(GuardKind.STORAGE_OVERLAPPING, srcs[0], (tuple(srcs[1:]), len(over)))

    def dispatch_key_set_match(self, source: SourceLike, *, expected: int | None = None) -> GuardSpec:
        """DISPATCH_KEY_SET_MATCH (torch's guard of that name): the value is a
        ``torch._C.DispatchKeySet`` (its type derives from it) whose keys, with the checking
        thread's include/exclude sets applied and the Python keys masked unless a dispatch mode
        without ``ignore_compile_internals`` is active (torch's ``LocalState::apply``), equal
        ``expected``: the raw bits of such an applied set, by default the example's applied now.
        Decided in C++ through the torch adapter (refused without it); anything else fails."""
        if not tensors.ensure_torch() or not _core.dispatch_key_set_reader_installed():
            raise GuardBuildError(
                "DISPATCH_KEY_SET_MATCH needs the torch adapter (see tripwire.tensors.adapter_status())"
            )
        if expected is None:
            v = self.value(source)
            expected = _core.applied_dispatch_keys(v)
            if expected is None and _core._masks_python_keys() is None and _is_dispatch_key_set(v):
                raise GuardBuildError(
                    f"DISPATCH_KEY_SET_MATCH on {Source.parse(source)}: the set has a Python dispatch key and "
                    "torch's per-thread dispatch-mode flag, which decides whether torch masks it, was not "
                    "found (tripwire.tensors.adapter_status())"
                )
            if expected is None:
                raise GuardBuildError(
                    f"DISPATCH_KEY_SET_MATCH on {Source.parse(source)}: {_type_name(v)} is not a "
                    "torch._C.DispatchKeySet"
                )
        if type(expected) is not int or not 0 <= expected < 1 << 64:
            raise TypeError("expected is the raw bits of an applied DispatchKeySet (an int in [0, 2**64))")
        return self.add(GuardKind.DISPATCH_KEY_SET_MATCH, source, (expected,))

    def baseline(self, name: str, value: Any) -> None:
        """Record framework state the guards are built under (a constant, e.g. a dispatch-key
        set or a mode): saved with the set, so that a kind whose meaning depends on it answers
        in another process as it did here (GuardSet.baselines; docs/format.md, "Baselines")."""
        if type(name) is not str:
            raise TypeError("a baseline's name is a str")
        if not name.isascii() and any("\ud800" <= c <= "\udfff" for c in name):
            # Saved as text (docs/format.md: a lone surrogate only in str constants and sites).
            raise GuardBuildError(f"baseline {name!a}: a name is text, not a lone surrogate")
        if not _core.is_constant(value):
            raise GuardBuildError(f"baseline {name!r}: {builtins_type(value).__name__} is not a constant")
        self._baselines[name] = _private_copy(value)

    # -- build --------------------------------------------------------------------------------------
    def build(self, *, strict: bool = False) -> GuardSet:
        """Compile the guards into a GuardSet.

        Raises GuardBuildError if the set does not pass on the example it was built from (a guard
        that fails on its own frame is a bug in whoever declared it). ``strict=True`` makes
        check() re-raise an exception from a source or guard as ``GuardEvalError`` instead of
        failing the guard.
        """
        specs = list(self._specs)
        if self.guard_filter is not None:
            keep = list(self.guard_filter(list(specs)))
            if len(keep) != len(specs):
                raise GuardBuildError("guard_filter must return one bool per guard")
            specs = [s for s, k in zip(specs, keep, strict=True) if k]
        return build_guard_set(
            specs, self.f_locals, self.f_globals, self.f_closure, strict=strict, baselines=self._baselines
        )


builtins_type = type
builtins_hasattr = hasattr


def _type_name(v: Any) -> str:
    return getattr(builtins_type(v), "__qualname__", "object")


def _ensure_frameworks(c: Any) -> None:
    """Register torch's and numpy's value types before deciding whether ``c`` is a constant
    (inside containers too: a tuple of torch.dtype)."""
    seen = 0
    stack = [c]
    while stack and seen < 10_000:
        x = stack.pop()
        seen += 1
        tensors.ensure_for(x)
        if builtins_type(x) in (tuple, list, set, frozenset):
            stack.extend(x)
        elif builtins_type(x) is dict:
            stack.extend(dict.keys(x))
            stack.extend(dict.values(x))


def torch_snapshot(probe: str, snapshot: Any) -> Any:
    """A built-in probe's snapshot in the form the engine compares."""
    if probe == "torch_global_state":
        if isinstance(snapshot, (str, dict)):
            return tensors.torch_state_from_json(snapshot)
        if builtins_type(snapshot) is not tuple or any(builtins_type(x) is not int for x in snapshot):
            raise GuardBuildError("torch_global_state: the snapshot is torch's JSON or a tuple of ints")
        return snapshot
    if probe == "torch_function_mode_stack":
        if builtins_type(snapshot) is not tuple or not all(isinstance(t, builtins_type) for t in snapshot):
            raise GuardBuildError("torch_function_mode_stack: the snapshot is a tuple of types")
        return snapshot
    if probe == "torch_default_device":
        if snapshot is not None and builtins_type(snapshot) is not str:
            snapshot = str(snapshot)  # a torch.device
        return snapshot
    if probe == "torch_saved_tensors_hooks":
        if snapshot is not None and (
            builtins_type(snapshot) is not tuple
            or len(snapshot) != 2
            or any(builtins_type(x) is not int for x in snapshot)
        ):
            raise GuardBuildError("torch_saved_tensors_hooks: the snapshot is None or a tuple of two ids")
        return snapshot
    if probe == "torch_dual_level":
        if builtins_type(snapshot) is not int or not -(2**63) <= snapshot < 2**63:
            raise GuardBuildError(
                f"torch_dual_level: the snapshot is an int (the dual level), not {snapshot!r}"
            )
        return snapshot
    return snapshot


def _exc_text(e: BaseException) -> str:
    """``"TypeName: message"``; the message is dropped when str() of a hostile exception raises."""
    try:
        msg = str(e)
    except Exception:  # noqa: BLE001
        msg = ""
    return f"{builtins_type(e).__name__}: {msg}" if msg else builtins_type(e).__name__


def _private_copy(c: Any) -> Any:
    """A constant the caller cannot mutate behind the guard's back: containers are deep-copied
    (enum members, which deepcopy returns as themselves, keep their identity)."""
    if builtins_type(c) in (list, dict, set, tuple, frozenset, slice):
        return copy.deepcopy(c)
    return c


def _closure_cells(f_closure: Any) -> dict[str, Any] | None:
    if f_closure is None:
        return None
    if isinstance(f_closure, types.FunctionType):
        names = f_closure.__code__.co_freevars
        cells = f_closure.__closure__ or ()
        return dict(zip(names, cells, strict=True))
    if isinstance(f_closure, Mapping):
        out = {}
        for k, c in f_closure.items():
            if not isinstance(c, types.CellType):
                raise TypeError(f"closure entry {k!r} is not a cell")
            out[str(k)] = c
        return out
    raise TypeError("f_closure must be a function or a mapping name -> cell")


def _is_dispatch_key_set(v: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and issubclass(type(v), torch._C.DispatchKeySet)
