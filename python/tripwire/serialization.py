"""Saving and loading guard sets: ``GuardSet.to_bytes`` and ``GuardSet.from_bytes``.

The bytes are the format of docs/format.md, written and read by the C++ core (which validates
everything before anything is built). This module decides what may be written (a guard whose
meaning does not survive the process is refused, see :class:`NotSerializable`), turns objects into
references (:mod:`tripwire.references`) and back, and proves, before ``to_bytes`` returns, that the
bytes rebuild the same guards. Loading never executes code from the data: there is no pickle, no
eval, and a module that is not imported yet is imported only when the caller allows it.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import tripwire._core as _core

from . import catalogue, tensors
from ._package import __version__
from .catalogue import _TORCH_PROBES, KINDS, GuardKind, GuardSpec, Weak
from .errors import FormatError, NotSerializable
from .references import (
    CALLED_KINDS,
    RefKind,
    Unnamed,
    fingerprint,
    import_module,
    modules_by_file,
    name_of,
    resolve_name,
)
from .source import _INDEX_STEPS, _PROPERTY_METHODS, RootKind, Source, Step, StepKind

__all__ = ["describe_bytes", "dumps", "loads"]

Resolver = Callable[[str, str], Any]


class SavedSet(Protocol):
    """What saving and loading use of a guard set (tripwire.GuardSet is one): this module sits
    below guard_set.py and names none of its classes."""

    strict: bool
    _f_globals: dict | None
    _dropped: tuple[tuple[str, str, str], ...]

    @property
    def guards(self) -> tuple[GuardSpec, ...]: ...

    @property
    def baselines(self) -> Mapping[str, Any]: ...

    @property
    def invalid(self) -> bool: ...

    @property
    def invalid_reason(self) -> str: ...

    def _drop_aliases(self) -> dict[int, frozenset[str]]: ...

    @classmethod
    def _from_document(
        cls: type[_S], doc: Any, consts: list[Any], f_globals: dict | None, baselines: dict[str, Any]
    ) -> _S:
        """The set of a decoded, checked document (FormatError when the engine refuses it)."""
        ...


_S = TypeVar("_S", bound=SavedSet)

_PLAIN = (int, float, complex, str, bytes)
# Guards whose stored integers are codes of the torch build that wrote them (raw DispatchKeySet
# bits, c10::ScalarType codes, the order of the autocast devices): a load needs the same build.
_TORCH_BUILD = "torch.build"


def _torch_coded(kind: GuardKind, args: tuple) -> bool:
    return kind in (GuardKind.TENSOR_MATCH, GuardKind.DISPATCH_KEY_SET_MATCH) or (
        kind is GuardKind.GLOBAL_STATE and args[0] == "torch_global_state"
    )


def torch_build() -> str | None:
    """The imported torch's build (``__version__`` and the git commit it was built from), or None
    when torch is not imported: the codes TENSOR_MATCH stores are those of this build."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    version = getattr(torch, "version", None)
    return f"{getattr(torch, '__version__', '?')}+{getattr(version, 'git_version', '?')}"


_SINGLETONS = (None, True, False, Ellipsis)


# -- saving -----------------------------------------------------------------------------------------


def _objects_in(v: Any, out: list[Any]) -> None:
    """The objects in constant ``v`` that are not plain values (they become references), exactly
    as runtime::serial::to_value splits them."""
    t = type(v)
    if v is None or v is True or v is False or v is Ellipsis or t in _PLAIN or t is range:
        return
    if t in (tuple, list, set, frozenset):
        for x in v:
            _objects_in(x, out)
    elif t is dict:
        for k, x in v.items():
            _objects_in(k, out)
            _objects_in(x, out)
    elif t is slice:
        for x in (v.start, v.stop, v.step):
            _objects_in(x, out)
    else:
        out.append(v)


def _live(arg: Any) -> Any:
    """The object behind an argument (catalogue.resolve), or Unnamed once it died."""
    try:
        return catalogue.resolve(arg)
    except LookupError:
        raise Unnamed(f"the object {arg!r} has died") from None


def _is_text(s: str) -> bool:
    """Whether ``s`` is valid text: no lone surrogate, so strict UTF-8 can encode it."""
    if s.isascii():
        return True
    try:
        s.encode()
    except UnicodeEncodeError:
        return False
    return True


class _Saver:
    def __init__(self, gs: SavedSet) -> None:
        self.gs = gs
        self.globals_module = _module_of_globals(gs._f_globals)
        self.references: list[tuple[int, str, str, bytes]] = []
        self.objects: list[Any] = []  # the object behind each reference, in order
        self._index: dict[int, int] = {}
        self._files: dict[str, list[str]] | None = None

    def files(self) -> dict[str, list[str]]:
        if self._files is None:
            self._files = modules_by_file()
        return self._files

    def reference(self, obj: Any, global_name: tuple[str, str] | None = None, called: bool = False) -> int:
        """The index of ``obj``'s reference, named by the rules its load will apply: ``called``
        when the engine calls it (a GLOBAL_STATE probe), which the loader resolves strictly."""
        i = self._index.get(id(obj))
        if i is not None:
            if called:
                # Named for another guard, maybe by a rule a called reference does not have (a
                # type alias): naming is deterministic, so this gives the same name or Unnamed.
                name_of(obj, files=self.files, called=True)
            return i
        kind, module, qualname = name_of(obj, global_name=global_name, files=self.files, called=called)
        self.references.append((int(kind), module, qualname, fingerprint(kind, obj)))
        self.objects.append(obj)
        i = self._index[id(obj)] = len(self.objects) - 1
        return i

    def ref_of(self, obj: Any) -> int:
        """For the C++ encoder: every object was named by check() first."""
        return self._index[id(obj)]

    def check(self, spec: GuardSpec) -> GuardSpec:
        """The spec with its objects alive, every one of them named; raises Unnamed."""
        k = spec.kind
        never = KINDS[k].never_stored  # what its payload cannot carry across a process
        if never is not None:
            raise Unnamed(never)
        src = spec.source
        if src is not None and src.root is RootKind.CLOSURE:
            raise Unnamed("C[...] reads a closure cell of this process")
        for other in spec.sources[1:]:  # a relational guard's other sources
            if other.root is RootKind.CLOSURE:
                raise Unnamed(f"C[...] reads a closure cell of this process ({other})")
        if any(s.root is RootKind.GLOBAL for s in spec.sources) and self.gs._f_globals is None:
            raise Unnamed("G[...] with no globals given")
        # Names and labels are stored as text (the decoder refuses any other string there); only
        # str constants and install sites may hold lone surrogates.
        for named in (*spec.sources, *(spec.args[1] if k is GuardKind.SHAPE else ())):
            if not _is_text(str(named)):
                raise Unnamed(f"the source {str(named)!a} is not valid text (a lone surrogate)")
        if k is GuardKind.GLOBAL_STATE and not _is_text(str(spec.args[2])):
            raise Unnamed(f"the label {str(spec.args[2])!a} is not valid text (a lone surrogate)")
        if k is GuardKind.SHAPE:
            for sym in spec.args[1]:
                if sym.root is RootKind.CLOSURE:
                    raise Unnamed(f"symbol {sym} reads a closure cell of this process")
                if sym.root is RootKind.GLOBAL and self.gs._f_globals is None:
                    raise Unnamed(f"symbol {sym} is a G[...] source with no globals given")
            return spec
        args = tuple(_live(a) for a in spec.args)
        if k is GuardKind.ID_MATCH:
            obj = args[0]
            if not any(obj is s for s in _SINGLETONS):
                if type(obj) in (*_PLAIN, tuple, list, dict, set, frozenset, range, slice):
                    raise Unnamed(f"the identity of a {type(obj).__name__} cannot survive the process")
                global_name = None
                if src is not None and src.root is RootKind.GLOBAL and not src.steps and self.globals_module:
                    global_name = (self.globals_module, src.name)
                self.reference(obj, global_name)
        elif k in (GuardKind.TYPE_MATCH, GuardKind.CODE_MATCH):
            self.reference(args[0])
        elif k is GuardKind.GLOBAL_STATE and type(args[0]) is not str:
            self.reference(args[0], called=True)
            self._constant(args[1])
        elif k is GuardKind.GLOBAL_STATE and args[0] == "torch_saved_tensors_hooks" and args[1] is not None:
            raise Unnamed(
                "a saved-tensor-hooks snapshot names the ids of this process's hook objects (only a "
                "None snapshot, no inlineable hooks, can be saved)"
            )
        elif k is GuardKind.GLOBAL_STATE and args[0] == "torch_function_mode_stack" and args[1]:
            raise Unnamed(
                "a non-empty torch-function mode stack snapshot is a tuple of classes, and the format "
                "stores a class only as a top-level reference"
            )
        elif k is GuardKind.TENSOR_MATCH:
            self.reference(args[0])
        elif k is GuardKind.ARRAY_MATCH:
            self.reference(args[0])
            if not _core.is_constant(args[1].dtype):
                raise Unnamed(f"the dtype {args[1].dtype!r} has no plain description (describe_dtype)")
        elif k is GuardKind.DIMENSION_MARKING:
            self._constant(args[0].shape_ids)
            self._constant(args[0].unbacked_bounds)
        elif k in (
            GuardKind.EQUALS_MATCH,
            GuardKind.DICT_KEYS,
            GuardKind.DICT_CONTAINS,
            GuardKind.SET_CONTAINS,
        ):
            self._constant(args[0])
        return GuardSpec(spec.kind, spec.source, args, spec.index, spec.stack)

    def _constant(self, c: Any) -> None:
        objs: list[Any] = []
        _objects_in(c, objs)
        for o in objs:
            self.reference(o)


def _roots(spec: GuardSpec) -> set[RootKind]:
    """The roots a guard reads: its sources' (a relational guard's all), and a SHAPE relation's
    symbols'."""
    roots = {sym.root for sym in spec.args[1]} if spec.kind is GuardKind.SHAPE else set()
    roots.update(src.root for src in spec.sources)
    return roots


def _module_of_globals(g: dict | None) -> str | None:
    """The name of the module whose ``__dict__`` is ``g``, or None."""
    if g is None:
        return None
    name = g.get("__name__")
    mod = sys.modules.get(name) if type(name) is str else None
    return name if isinstance(mod, types.ModuleType) and mod.__dict__ is g else None


def _matches(spec: GuardSpec, names: set[str], aliases: Iterable[str] = ()) -> set[str]:
    hit = ({spec.kind.name} | set(aliases)) & names
    if spec.source is not None and str(spec.source) in names:
        hit.add(str(spec.source))
    return hit


def dumps(
    gs: SavedSet,
    drop: Iterable[str],
    encode: Callable[[list[GuardSpec]], tuple[Any, list[_core.GuardDecl]]],
    cls: type[SavedSet],
) -> bytes:
    """``gs.to_bytes(drop=...)``: see GuardSet.to_bytes. guard_set.py sits above this module and
    hands it what it needs of the set: ``encode``, its encoding of the kept specs (constant pool,
    declarations), and ``cls``, the GuardSet class the saved bytes are rebuilt as to prove them."""

    if isinstance(drop, str):
        drop = (drop,)
    names = set(drop)
    for n in names:
        if type(n) is not str:
            raise TypeError(f"drop= takes source strings and kind names, not {type(n).__name__}")
    saver = _Saver(gs)
    kept: list[GuardSpec] = []
    dropped: list[tuple[str, str, str]] = []
    used: set[str] = set()
    problems: list[tuple[str, str | None, str]] = []
    # Other names a guard answers to: an imported set's torch kinds (NO_TENSOR_ALIASING for the
    # NO_ALIAS that implements it, DUAL_LEVEL_MATCH for its GLOBAL_STATE, ...).
    aliases = gs._drop_aliases()
    for spec in gs.guards:
        hit = _matches(spec, names, aliases.get(spec.index, ()))
        if hit:
            used |= hit
            dropped.append((spec.kind.name, "" if spec.source is None else str(spec.source), spec.describe()))
            continue
        try:
            kept.append(saver.check(spec))
        except Unnamed as e:
            problems.append((spec.kind.name, None if spec.source is None else str(spec.source), str(e)))
    unused = names - used
    if unused:
        raise ValueError(
            f"drop= names what no guard of this set has: {sorted(unused)}{_did_you_mean(gs, unused, aliases)}"
        )
    if problems:
        raise NotSerializable(problems)
    if gs.invalid:
        raise NotSerializable([("", None, f"the set can never pass again: {gs.invalid_reason}")])
    pool, decls = encode(kept)
    # Objects a guard names by identity are held weakly, as in the live set (GuardSet.__init__).
    # The label: GLOBAL_STATE's name; TENSOR_MATCH's device string (for messages: explain() and
    # why_not show it, and the data holds only the device index).
    labels = [_label_of(s) for s in kept]
    saved_baselines = dict(gs.baselines)
    if any(_torch_coded(s.kind, s.args) for s in kept):
        saved_baselines[_TORCH_BUILD] = torch_build()
    baselines = [(name, pool.add(value)) for name, value in saved_baselines.items()]
    for _, value in saved_baselines.items():
        saver._constant(value)
    has_globals = any(RootKind.GLOBAL in _roots(s) for s in kept)
    try:
        data = _core.encode_guard_set(
            decls,
            pool.consts,
            [1 if w else 0 for w in pool.weak],
            labels,
            [list(s.stack) for s in kept],
            saver.references,
            saver.ref_of,
            saver.globals_module if has_globals else None,
            baselines,
            dropped,
            gs.strict,
            __version__,
            sys.version_info[:2],
        )
    except _core._CodecError as e:
        raise FormatError(str(e)) from None
    _prove(cls, gs, kept, dropped, data, saver.objects)
    return data


def _label_of(spec: GuardSpec) -> str:
    if spec.kind is GuardKind.GLOBAL_STATE:
        return str(spec.args[2])
    if spec.kind is GuardKind.TENSOR_MATCH:
        exp = spec.args[1]
        try:  # a hand-made expectation whose device string is not torch's form keeps it unsaved
            return _device_label(str(exp.device), exp.device_index, FormatError)
        except FormatError:
            return ""
    return ""


# A TENSOR_MATCH label: a device type, and its index when the tensor has one (torch's str(device)).
_DEVICE_LABEL = re.compile(r"([a-z][a-z0-9_]*)(?::(\d+))?")


def _device_label(label: str, device_index: int, bad: Callable[[str], FormatError]) -> str:
    """A stored device string, checked: torch's form, and its index the one the data checks (the
    device type itself is in the dispatch keys, which the engine compares)."""
    if not label:
        return ""
    m = _DEVICE_LABEL.fullmatch(label)
    if m is None or len(label) > 64:
        raise bad(f"the device label {label!r} is not a torch device string")
    index = -1 if m.group(2) is None else int(m.group(2))
    if index != device_index:
        raise bad(f"the device label {label!r} does not match the stored device index {device_index}")
    return label


def _did_you_mean(gs: SavedSet, unused: set[str], aliases: dict[int, frozenset[str]]) -> str:
    """``"; did you mean 'TYPE_MATCH'?"`` for the names closest to the misspelt ones, from the
    kinds, sources and other names of this set's guards."""
    import difflib

    known: set[str] = set()
    for spec in gs.guards:
        known.add(spec.kind.name)
        if spec.source is not None:
            known.add(str(spec.source))
        known |= aliases.get(spec.index, frozenset())
    close = [c for n in sorted(unused) for c in difflib.get_close_matches(n, sorted(known), n=2)]
    return f"; did you mean {' or '.join(repr(c) for c in dict.fromkeys(close))}?" if close else ""


def _prove(
    cls: type[SavedSet], gs: SavedSet, kept: list[GuardSpec], dropped: list, data: bytes, objects: list[Any]
) -> None:
    """The bytes rebuild the same guards (decoded and compiled by the engine, with the saved
    objects for the references): what was kept and nothing else, with the same sources,
    operands, install stacks and dropped list."""
    loaded = _load(cls, data, lambda i, ref, called=False: objects[i], gs._f_globals)
    problems = []
    if len(loaded.guards) != len(kept):
        problems.append(f"{len(loaded.guards)} guards rebuilt, {len(kept)} kept")
    for a, b in zip(kept, loaded.guards, strict=False):
        same = (
            a.kind is b.kind
            and a.index == b.index
            and a.source == b.source
            and a.stack == b.stack
            and len(a.args) == len(b.args)
            and all(_same_arg(x, _live(y)) for x, y in zip(a.args, b.args, strict=True))
        )
        if not same:
            problems.append(f"{a.describe()} rebuilt as {b.describe()}")
    if [tuple(d) for d in dropped] != [tuple(d) for d in loaded._dropped]:
        problems.append("the dropped list differs")
    if problems:
        raise FormatError("the bytes do not rebuild this guard set: " + "; ".join(problems[:5]))


def _same_arg(x: Any, y: Any) -> bool:
    if x is y:
        return True
    if type(x) is not type(y):
        return False
    if dataclasses.is_dataclass(x) or type(x) is Source:  # expectations, a relational guard's other
        return bool(x == y)
    if type(x) is tuple and x and all(type(e) is Source for e in x):  # NO_ALIAS's others, SHAPE's symbols
        return bool(x == y)
    if type(x) is range:
        return (x.start, x.stop, x.step) == (y.start, y.stop, y.step)
    return _core.is_constant(x) and _core.equals_match(y, x)


# -- loading ----------------------------------------------------------------------------------------

_OFFSET = re.compile(r"\(at byte (\d+)\)$")


def _format_error(e: Exception) -> FormatError:
    text = str(e)
    m = _OFFSET.search(text)
    return FormatError(text, int(m.group(1)) if m else None)


def _decode(data: bytes | bytearray | memoryview) -> Any:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"from_bytes needs bytes, not {type(data).__name__}")
    try:
        return _core.decode_guard_set(bytes(data))
    except _core._CodecError as e:
        from .store import ENTRY_MAGIC

        if bytes(data[: len(ENTRY_MAGIC)]) == ENTRY_MAGIC:  # a whole store entry, not its guards
            raise FormatError(
                "these bytes are a tripwire store entry (tripwire.store), not a bare guard set: its "
                "guards are tripwire.store.decode_entry(data).guards (python -m tripwire inspect "
                "FILE shows them)",
                0,
            ) from None
        raise _format_error(e) from None


# What each kind of reference must resolve to (checked before its fingerprint is computed, so that
# no attribute of an arbitrary object is read). OBJECT and ENUM_MEMBER are checked by their lookup.
_REF_TYPES: dict[RefKind, type | tuple[type, ...]] = {
    RefKind.TYPE: type,
    RefKind.FUNCTION: (types.FunctionType, types.BuiltinFunctionType),
    RefKind.CODE: types.CodeType,
    RefKind.MODULE: types.ModuleType,
}


def _admitted(module: str, allow: Sequence[str] | None) -> bool:
    return bool(allow) and any(module == p or module.startswith(p + ".") for p in allow or ())


def _importable(module: str) -> bool:
    """Whether a load may import ``module``, a name the bytes chose under an admitted prefix: a
    dotted name of identifiers, none of them a dunder. ``pkg.__main__`` is a package's command
    line, which importing runs, and ``pkg.__init__`` runs the package's body a second time as
    another module: neither is a module a reference is saved from."""
    return all(p.isidentifier() and not (p.startswith("__") and p.endswith("__")) for p in module.split("."))


def _importer(
    resolve: Resolver | None, allow_modules: Sequence[str] | None, call_modules: Sequence[str] = ()
) -> Callable[[int, tuple, bool], Any]:
    """Resolves references by the loading rules (docs/format.md, "References"): each names only
    what its own module defines (references.resolve_name). A reference the engine will *call* (a
    GLOBAL_STATE probe, run by every check) must also be a function or a class, and resolves only
    in a module that ``allow_modules`` admits or that is in ``call_modules`` (the module of the
    ``f_globals`` the caller passed), or else through ``resolve``, the caller's own choice: the
    data must not choose which imported function runs (``os.abort`` is always imported)."""
    if isinstance(allow_modules, str):
        allow_modules = (allow_modules,)

    def lookup(i: int, ref: tuple, called: bool = False) -> Any:
        kind_n, module, qualname, fp, offset = ref
        kind = RefKind(kind_n)
        where = f"reference {module}:{qualname} ({kind.name.lower()}, at byte {offset})"
        if called and kind not in CALLED_KINDS:
            raise FormatError(
                f"{where} refused: it is called by every check (a GLOBAL_STATE probe), and only a "
                "function or a class is called",
                offset,
            )
        admitted = _admitted(module, allow_modules)
        mod: Any = sys.modules.get(module)
        try:
            if called and not admitted and module not in call_modules:
                if resolve is None:
                    raise FormatError(
                        f"{where} refused: it is called by every check (a GLOBAL_STATE probe), and its "
                        f"module {module!r} is neither admitted by allow_modules= nor the module of the "
                        "f_globals given",
                        offset,
                    )
                obj = resolve(module, qualname)  # never sys.modules: the caller chooses what runs
            elif issubclass(type(mod), types.ModuleType):
                obj = resolve_name(kind, module, mod, qualname, called=called)
            elif admitted:
                if not _importable(module):
                    raise FormatError(
                        f"{where} refused: {module!r} is not imported, and a load imports only a "
                        "dotted name of identifiers without a dunder part (never a package's "
                        "__main__ or __init__)",
                        offset,
                    )
                try:
                    mod = import_module(module)
                except ImportError as e:
                    raise FormatError(
                        f"{where}: module {module!r} cannot be imported ({e})", offset
                    ) from None
                obj = resolve_name(kind, module, mod, qualname, called=called)
            elif resolve is not None:
                obj = resolve(module, qualname)
            else:
                raise FormatError(
                    f"{where} refused: module {module!r} is not imported, and importing it would run "
                    "its code; import it first, or pass allow_modules=[...] or resolve=",
                    offset,
                )
        except LookupError as e:
            raise FormatError(f"{where} does not resolve: {e}", offset) from None
        expected = _REF_TYPES.get(kind)
        if expected is not None and not issubclass(type(obj), expected):
            raise FormatError(
                f"{where} resolves to a {type(obj).__name__}, not a {kind.name.lower()}", offset
            )
        if fingerprint(kind, obj) != fp:
            raise FormatError(
                f"{where} resolves to an object that differs from the one saved (its fingerprint "
                "changed: edited code, another class, another Python version)",
                offset,
            )
        return obj

    return lookup


def loads(
    cls: type[_S],
    data: bytes,
    resolve: Resolver | None = None,
    allow_modules: Sequence[str] | None = None,
    f_globals: dict | None = None,
) -> _S:
    """``cls.from_bytes``: see GuardSet.from_bytes. ``cls`` is the GuardSet class to make."""
    if f_globals is not None and type(f_globals) is not dict:
        raise TypeError("f_globals must be a dict")
    own = _module_of_globals(f_globals)
    return _load(
        cls,
        data,
        _importer(resolve, allow_modules, (own,) if own else ()),
        f_globals,
        use_module_globals=True,
    )


def _load(
    cls: type[_S],
    data: bytes,
    lookup: Callable[..., Any],
    f_globals: dict | None,
    use_module_globals: bool = False,
) -> _S:
    doc = _decode(data)
    refs = doc.references
    try:
        called = set(doc.probe_references)
    except _core._CodecError as e:
        raise _format_error(e) from None
    objects = [lookup(i, r, i in called) for i, r in enumerate(refs)]
    try:
        consts = doc.constants(objects)
        # Every source's texts against its steps, step keys, root names, and the operands of the
        # common kinds, in one C++ pass (runtime/serial/loaded.hpp); names interned in place.
        reads_globals, python_checked, reads_torch_adapter = doc.check_loaded(consts)
    except _core._CodecError as e:
        raise _format_error(e) from None
    # The kinds whose operands this module checks (GLOBAL_STATE, SHAPE, the tensor kinds): their
    # specs are built now for the checks and dropped; all specs are built on the first diagnostic.
    memo: dict = {}
    checked = []
    for i in python_checked:
        label, stack, offset = doc.info(i)
        checked.append(_spec(doc.decl(i), consts, label, stack, offset, memo))
    baselines = {name: consts[c] for name, c in doc.baselines}
    _check_torch_build(checked, baselines)
    if f_globals is None and reads_globals and use_module_globals:
        module = doc.globals_module
        if module is None:
            raise FormatError(
                "this set reads G[...] from a globals dict that is not a module's: pass f_globals="
            )
        mod = lookup(-1, (int(RefKind.MODULE), module, "", fingerprint(RefKind.MODULE, None), 0), False)
        f_globals = mod.__dict__
    # Switch on the framework support the kinds need, as the builder does (neither imports its
    # framework: torch and numpy are imported already when their type references resolved).
    kinds = {s.kind for s in checked}
    if kinds & {GuardKind.TENSOR_MATCH, GuardKind.DIMENSION_MARKING} or any(
        s.kind is GuardKind.GLOBAL_STATE and s.args[0] in _TORCH_PROBES for s in checked
    ):
        tensors.ensure_torch()
    if reads_torch_adapter:
        # STORAGE_OVERLAPPING, DISPATCH_KEY_SET_MATCH or a C++ tensor step on any guard (the C++
        # pass sees every guard; `checked` holds only the kinds whose operands are checked here).
        tensors.ensure_torch()
    if GuardKind.ARRAY_MATCH in kinds:
        tensors.ensure_numpy()
    if GuardKind.SHAPE in kinds:  # sizes read in C++ where exact (runtime/tensors/property_reader.hpp)
        tensors.ensure_torch()
        tensors.ensure_numpy()
    del checked, memo
    return cls._from_document(doc, consts, f_globals, baselines)


def loaded_specs(lazy: tuple, decls: list[_core.GuardDecl]) -> list[GuardSpec]:
    """The GuardSpecs of a loaded set, built on its first diagnostic from what the load kept:
    the decoded document (labels, stacks), the declarations as the set compiled them (``decls``,
    moved there from the document at load) and the constants, each identity-held one as
    (weakref, id, type name).
    Everything was checked at load; an object that died since is shown as dead (a Weak), never
    looked up again by name (the name may now be bound to another object)."""
    doc, held, weak_positions = lazy
    objs = list(held)
    for i in weak_positions:
        ref, address, type_name = held[i]
        obj = ref()
        if obj is None:
            dead = Weak.__new__(Weak)
            dead.ref, dead.address, dead.type_name = ref, address, type_name
            obj = dead
        objs[i] = obj
    memo: dict = {}
    specs = [
        _spec(d, objs, label, stack, offset, memo, checked=True)
        for d, (label, stack, offset) in zip(decls, doc.guard_info(), strict=True)
    ]
    return [
        s if s.args and type(s.args[0]) is Weak else s.weakened()
        for s in sorted(specs, key=lambda s: s.index)
    ]


def _check_torch_build(specs: list[GuardSpec], baselines: dict[str, Any]) -> None:
    """Refuse guards whose stored codes belong to another torch build (docs/format.md, "Torch
    guards"): their dispatch-key bits, scalar-type codes and autocast device order would be
    compared against this build's meaning, which could pass what the writer's torch would fail."""
    coded = [s for s in specs if _torch_coded(s.kind, s.args)]
    if not coded:
        return
    saved, here = baselines.get(_TORCH_BUILD), torch_build()
    if saved is not None and saved == here:
        return
    what = ", ".join(sorted({s.kind.name for s in coded}))
    if saved is None:
        raise FormatError(
            f"{what} guards without the torch build that wrote them ({_TORCH_BUILD!r} baseline)"
        )
    raise FormatError(
        f"{len(coded)} {what} guard(s) were saved by torch {saved} and this process has "
        f"{'no torch imported' if here is None else 'torch ' + here}: their dispatch-key bits and "
        "dtype codes are that build's; rebuild these guards here (or drop them at save)"
    )


_SYMBOL_TYPE_NAMES = ("int", "float")  # core::shape::ValueType


def _shape_args(
    d: _core.GuardDecl, consts: list, bad: Callable[[str], FormatError], memo: dict | None
) -> tuple:
    """A SHAPE declaration's (text, symbols, types), checked: the text parses, and its symbols
    are, in order, the stored symbol sources (each rebuilt from its steps and checked against its
    printed texts), so the relation the engine evaluates reads what its text says it reads."""
    from . import shapes

    try:
        rel = shapes.parse(d.relation)
    except (ValueError, TypeError) as e:  # ShapeSyntaxError is a ValueError
        raise bad(f"the relation does not parse: {e}") from None
    if rel.text != d.relation:
        raise bad(f"the relation {d.relation!r} is not in canonical form ({rel.text!r})")
    symbols = tuple(_source(p, consts, bad, memo) for p in d.symbols)
    if symbols != rel.symbols:
        shown = ", ".join(map(str, symbols))
        raise bad(f"the stored symbols ({shown}) are not the relation's ({', '.join(map(str, rel.symbols))})")
    types = d.symbol_types
    if len(types) != len(symbols) or any(t not in (0, 1) for t in types):
        raise bad("each symbol needs a type, int (0) or float (1)")
    return (rel.text, symbols, tuple(_SYMBOL_TYPE_NAMES[t] for t in types))


_PROBES = _core.builtin_probes()


def _builtin_snapshot(probe: str, n: int) -> Any:
    """A built-in probe's snapshot as the probe returns it (a bool for gc_enabled): stored as an int."""
    return bool(n) if type(_core.read_builtin_probe(probe)) is bool else n


def _spec(
    d: _core.GuardDecl,
    consts: list,
    label: str,
    stack: list[str],
    offset: int,
    memo: dict | None = None,
    checked: bool = False,
) -> GuardSpec:
    """The GuardSpec of a decoded declaration (the inverse of guard_set._encode); FormatError when
    an operand has a type its kind cannot take. ``checked``: the operands are not checked here,
    because the load checked them already and an identity-held one may be a dead Weak
    (loaded_specs), or because each reference is shown by name, a _Named standing for the object
    a load would resolve (inspect_bytes)."""
    k = GuardKind(d.kind)

    def bad(why: str) -> FormatError:
        return FormatError(f"{k.name} guard (at byte {offset}): {why}", offset)

    op = None if d.operand is None else consts[d.operand]
    op2 = None if d.operand2 is None else consts[d.operand2]
    args: tuple
    if k in (GuardKind.TYPE_MATCH, GuardKind.ID_MATCH):
        args = (op,)
    elif k is GuardKind.CODE_MATCH:
        if type(op) is not types.CodeType and not checked:
            raise bad("needs a code object")
        args = (op,)
    elif k is GuardKind.EQUALS_MATCH:
        if not checked and not _core.is_constant(op):
            raise bad(f"{type(op).__name__} is not a constant")
        args = (op, True) if d.flag else (op,)
    elif k in (GuardKind.LENGTH, GuardKind.TUPLE_ITERATOR_LEN):
        args = (d.n,)
    elif k is GuardKind.DICT_KEYS:
        if not checked and (type(op2) is not tuple or not all(_core.is_constant(x, 1) for x in op2)):
            raise bad("the keys must be a tuple of constants")
        args = (op2, d.flag)
    elif k in (GuardKind.DICT_CONTAINS, GuardKind.HASATTR, GuardKind.SET_CONTAINS):
        args = (op, d.flag)
    elif k is GuardKind.RANGE_ITERATOR:
        if type(op) is not range:
            raise bad("needs a range")
        args = (op.start, op.stop, op.step)
    elif k is GuardKind.GLOBAL_STATE:
        if op is None:
            probe = _PROBES[d.n]
            if probe == "torch_global_state":
                args = (probe, tuple(d.data), label or probe)
            elif probe in _TORCH_PROBES:
                if probe == "torch_function_mode_stack" and op2 != ():
                    raise bad("a mode stack snapshot must be empty")
                if probe == "torch_default_device" and op2 is not None and type(op2) is not str:
                    raise bad("a default-device snapshot is None or a str")
                if probe == "torch_saved_tensors_hooks" and op2 is not None:
                    raise bad("a saved-tensor-hooks snapshot must be None")
                if probe == "torch_dual_level" and (type(op2) is not int or not -(2**63) <= op2 < 2**63):
                    raise bad("a dual-level snapshot is an int")
                args = (probe, op2, label or probe)
            else:
                args = (probe, _builtin_snapshot(probe, d.n2), label or probe)
        else:
            if not checked and not _core.is_constant(op2):
                raise bad("the snapshot is not a constant")
            args = (op, op2, label)
    elif k is GuardKind.SHAPE:
        args = _shape_args(d, consts, bad, memo)
    elif k in (GuardKind.TENSOR_MATCH, GuardKind.ARRAY_MATCH, GuardKind.DIMENSION_MARKING):
        args = _tensor_args(k, op, op2, d, bad, checked, label)
    elif k is GuardKind.ALIAS:
        args = (_source(d.more_sources[0], consts, bad, memo),)
    elif k is GuardKind.NO_ALIAS:
        args = (tuple(_source(p, consts, bad, memo) for p in d.more_sources),)
    elif k is GuardKind.STORAGE_OVERLAPPING:
        args = (tuple(_source(p, consts, bad, memo) for p in d.more_sources), d.n)
    elif k is GuardKind.DISPATCH_KEY_SET_MATCH:
        args = (d.n & ((1 << 64) - 1),)  # the raw bits (stored as the engine's int64)
    else:
        args = ()
    source = None
    if d.source is not None:
        source = _source(d.source, consts, bad, memo)
    return GuardSpec(k, source, args, d.id, tuple(stack))


def _tensor_args(
    k: GuardKind,
    op: Any,
    op2: Any,
    d: _core.GuardDecl,
    bad: Callable[[str], FormatError],
    checked: bool = False,
    label: str = "",
) -> tuple:
    """TENSOR_MATCH, ARRAY_MATCH and DIMENSION_MARKING arguments from their stored data."""
    from .tensors import ArrayExpectation, DimensionMarkings, TensorExpectation

    try:
        if k is GuardKind.DIMENSION_MARKING:
            if not (_core.is_constant(op) and _core.is_constant(op2)):
                raise bad("the shape ids and unbacked bounds must be constants")
            return (DimensionMarkings.from_data(list(d.data), d.flag, op, op2),)
        if not isinstance(op, type) and not checked:
            raise bad("needs a type")
        if k is GuardKind.TENSOR_MATCH:
            exp = TensorExpectation.from_data(list(d.data))
            return (op, dataclasses.replace(exp, device=_device_label(label, exp.device_index, bad)))
        if type(op2) is not str and not (type(op2) is tuple and _core.is_constant(op2)):
            raise bad("the dtype description must be a str or a tuple")
        return (op, ArrayExpectation.from_data(op2, list(d.data)))
    except ValueError as e:
        raise bad(str(e)) from None


def _source(
    path: _core.SourcePath, consts: list, bad: Callable[[str], FormatError], memo: dict | None = None
) -> Source:
    """The Source of a decoded path, checked against its printed prefixes (the engine's tree
    prints those). ``memo`` maps a path (root, name and steps by constant id) to its checked
    Source and texts, so that each distinct source is built and printed once for the whole set,
    extending its parent's."""
    memo = {} if memo is None else memo
    root, name_id = int(path.root), path.name
    steps = [(int(st.kind), st.operand, st.index) for st in path.steps]
    texts = path.texts
    key = (root, name_id, tuple(steps))
    hit = memo.get(key)
    if hit is not None:
        if hit[1] != texts[-1]:
            raise bad(f"the source texts do not match its steps ({texts[-1]!r} is {hit[1]!r})")
        return hit[0]
    name = consts[name_id]
    if type(name) is not str:
        raise bad("a root name must be a str")
    k0 = (root, name_id, ())
    cur = memo.get(k0)
    if cur is None:
        src = Source(RootKind(root), name)
        cur = memo[k0] = (src, str(src))
    if cur[1] != texts[0]:
        raise bad(f"the source texts do not match its steps ({texts[0]!r} is {cur[1]!r})")
    before = None  # the prefix one step shorter than `cur`
    for i, (kind, operand, index) in enumerate(steps):
        ki = (root, name_id, tuple(steps[: i + 1]))
        nxt = memo.get(ki)
        if nxt is None:
            kind_e = StepKind(kind)
            arg = index if kind_e in _INDEX_STEPS else (None if operand is None else consts[operand])
            try:
                step = Step(kind_e, arg)
            except ValueError as e:
                raise bad(f"bad source: {e}") from None
            src = cur[0]
            last = src.steps[-1] if src.steps else None
            if (
                kind_e is StepKind.WEAKREF_CALL
                and last is not None
                and last.kind is StepKind.ATTR
                and last.arg in _PROPERTY_METHODS
                and before is not None
            ):
                # Source.__str__: `X.size` followed by a call prints `getattr(X, 'size')()`.
                text = f"getattr({before[1]}, {last.arg!r})()"
            else:
                text = step.render(cur[1])
            nxt = memo[ki] = (Source(src.root, src.name, (*src.steps, step)), text)
        if nxt[1] != texts[i + 1]:
            raise bad(f"the source texts do not match its steps ({texts[i + 1]!r} is {nxt[1]!r})")
        before, cur = cur, nxt
    return cur[0]


# -- inspection (no reference is resolved, nothing is imported) ------------------------------------


class _Named:
    """A reference shown by name in ``describe_bytes``. Compared and hashed by identity (one per
    stored reference): the engine builds no constant holding an object whose class hashes in
    Python (bytes would choose what runs), so a reference inside a constant, an enum member in
    a tuple or a dict key, could not be shown if this class defined ``__hash__``."""

    def __init__(self, kind: RefKind, module: str, qualname: str) -> None:
        self.text = f"<{kind.name.lower()} {module}:{qualname}>" if qualname else f"<module {module}>"

    def __repr__(self) -> str:
        return self.text


def inspect_bytes(data: bytes) -> tuple[dict[str, Any], list[GuardSpec], list[tuple[str, str, str]]]:
    """(metadata, the guards with references shown by name, dropped) of serialized guards, read
    without resolving any reference."""
    doc = _decode(data)
    objects = [_Named(RefKind(k), m, q) for k, m, q, _, _ in doc.references]
    try:
        consts = doc.constants(objects)
    except _core._CodecError as e:
        raise _format_error(e) from None
    # The engine decoded and validated the bytes; the specs are made from its declarations by
    # the one decoder of declarations a load uses too (_spec), each reference shown by name.
    memo: dict = {}
    specs = [
        _spec(d, consts, label, stack, offset, memo, checked=True)
        for d, (label, stack, offset) in zip(doc.decls(), doc.guard_info(), strict=True)
    ]
    meta = {
        "format version": 1,
        "tripwire version": doc.tripwire_version,
        "python": "{}.{}".format(*doc.python_version),
        "guards": doc.guard_count,
        "references": [
            f"{RefKind(k).name.lower()} {m}:{q}" if q else f"module {m}" for k, m, q, _, _ in doc.references
        ],
        "globals module": doc.globals_module,
        "strict": doc.strict,
        "baselines": {name: consts[c] for name, c in doc.baselines},
    }
    return meta, specs, list(doc.dropped)


def _inspect_line(s: GuardSpec) -> str:
    """describe(), with a reference shown by its name rather than as a live object."""
    src = str(s.source) if s.source is not None else "f_locals"
    if s.kind in (GuardKind.TYPE_MATCH, GuardKind.ID_MATCH) and isinstance(s.args[0], _Named):
        return f"{'type(' + src + ')' if s.kind is GuardKind.TYPE_MATCH else src} is {s.args[0]!r}"
    if s.kind is GuardKind.CODE_MATCH:
        return f"{src}.__code__ is {s.args[0]!r}"
    if s.kind is GuardKind.ID_MATCH:
        return f"{src} is {s.args[0]!r}"
    if s.kind in (GuardKind.TENSOR_MATCH, GuardKind.ARRAY_MATCH) and isinstance(s.args[0], _Named):
        fn = "check_tensor" if s.kind is GuardKind.TENSOR_MATCH else "check_array"
        return f"{fn}({src}, {s.args[0]!r}, {s.args[1].describe()})"
    return s.describe()


def describe_bytes(data: bytes) -> str:
    """A readable listing of serialized guards (``python -m tripwire inspect``)."""
    meta, specs, dropped = inspect_bytes(data)
    lines = [f"{k}: {v}" for k, v in meta.items() if k != "references"]
    refs = meta["references"]
    lines.append(f"references ({len(refs)}):")
    lines += [f"  {r}" for r in refs]
    lines.append(f"guards ({len(specs)}):")
    for s in specs:
        where = s.stack[-1] if s.stack else "unknown"
        lines.append(f"  #{s.index} {s.kind.name}: {_inspect_line(s)}   # installed at {where}")
    if dropped:
        lines.append(f"dropped at save ({len(dropped)}): these guards are NOT checked by the loaded set")
        lines += [f"  {k} on {src or 'global state'}: {desc}" for k, src, desc in dropped]
    return "\n".join(lines)


def guard_lines(data: bytes) -> list[str]:
    """One line per guard (kind, source, what it expects) and per dropped guard, for diffs."""
    _, specs, dropped = inspect_bytes(data)
    return [f"{s.kind.name}: {_inspect_line(s)}" for s in specs] + [
        f"dropped {k}: {desc}" for k, _, desc in dropped
    ]
