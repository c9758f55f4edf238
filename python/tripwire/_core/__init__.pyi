"""tripwire's compiled engine (private: use the tripwire package)."""

from collections.abc import Callable, Mapping, Sequence
import enum
import types
from typing import Any, overload

from tripwire._core import testing as testing


class RootKind(enum.IntEnum):
    """Where a source's first value is read: L['x'], G['x'], C['x']."""

    LOCAL = 0

    GLOBAL = 1

    CLOSURE = 2

class StepKind(enum.IntEnum):
    """One step from a value to a child value (docs/guards.md, Sources)."""

    ATTR = 0

    ITEM = 1

    DICT_ITEM = 2

    TYPE = 3

    DICT = 4

    DEFAULTS = 5

    KWDEFAULTS = 6

    CODE = 7

    CLOSURE_CELL = 8

    WEAKREF_CALL = 9

    DICT_KEY = 10

    DICT_VALUE = 11

    SIZE = 12

    STRIDE = 13

    STORAGE_OFFSET = 14

    TENSOR_SIZE = 15

    TENSOR_STRIDE = 16

    TENSOR_STORAGE_OFFSET = 17

    GRAD = 18

    TYPE_DICT = 19

    TYPE_MRO = 20

class GuardKind(enum.IntEnum):
    """The guard kinds of the catalogue (docs/guards.md)."""

    TYPE_MATCH = 0

    ID_MATCH = 1

    NONE = 2

    NOT_NONE = 3

    TRUE = 4

    FALSE = 5

    EQUALS_MATCH = 6

    LENGTH = 7

    DICT_KEYS = 8

    DICT_CONTAINS = 9

    HASATTR = 10

    DICT_VERSION = 11

    TUPLE_ITERATOR_LEN = 12

    RANGE_ITERATOR = 13

    CODE_MATCH = 14

    WEAKREF_ALIVE = 15

    GLOBAL_STATE = 16

    LAMBDA = 17

    TENSOR_MATCH = 18

    ARRAY_MATCH = 19

    DIMENSION_MARKING = 20

    ALIAS = 21

    NO_ALIAS = 22

    SHAPE = 23

    STORAGE_OVERLAPPING = 24

    DISPATCH_KEY_SET_MATCH = 25

    SET_CONTAINS = 26

class Step:
    """One step of a source as the engine reads it."""

    def __init__(self, kind: StepKind, operand: int | None = None, index: int = 0) -> None: ...

    @property
    def kind(self) -> StepKind: ...

    @kind.setter
    def kind(self, arg: StepKind, /) -> None: ...

    @property
    def operand(self) -> int | None:
        """Constant-pool index of the attribute name or key, or None."""

    @property
    def index(self) -> int:
        """Position, for positional steps."""

    @index.setter
    def index(self, arg: int, /) -> None: ...

class SourcePath:
    """A root and its steps, with the printed prefixes."""

    def __init__(self, root: RootKind, name: int, steps: Sequence[Step], texts: Sequence[str]) -> None: ...

    @property
    def root(self) -> RootKind: ...

    @root.setter
    def root(self, arg: RootKind, /) -> None: ...

    @property
    def name(self) -> int:
        """Constant-pool index of the root's name."""

    @name.setter
    def name(self, arg: int, /) -> None: ...

    @property
    def steps(self) -> list[Step]: ...

    @steps.setter
    def steps(self, arg: Sequence[Step], /) -> None: ...

    @property
    def texts(self) -> list[str]:
        """The printed prefixes: len(steps) + 1 of them."""

    @texts.setter
    def texts(self, arg: Sequence[str], /) -> None: ...

class GuardDecl:
    """
    One declared guard as the engine compiles it; operands are constant-pool indices (validated against guard_shape by the compiler).
    """

    def __init__(self, kind: GuardKind, source: SourcePath | None, operand: int | None = None, operand2: int | None = None, n: int = 0, n2: int = 0, n3: int = 0, flag: bool = False, id: int = 0, relation: str = '', symbols: Sequence[SourcePath] = [], symbol_types: Sequence[int] = [], data: Sequence[int] = [], more_sources: Sequence[SourcePath] = []) -> None: ...

    @property
    def kind(self) -> GuardKind: ...

    @kind.setter
    def kind(self, arg: GuardKind, /) -> None: ...

    @property
    def source(self) -> SourcePath | None: ...

    @property
    def operand(self) -> int | None: ...

    @property
    def operand2(self) -> int | None: ...

    @property
    def n(self) -> int: ...

    @n.setter
    def n(self, arg: int, /) -> None: ...

    @property
    def n2(self) -> int: ...

    @n2.setter
    def n2(self, arg: int, /) -> None: ...

    @property
    def n3(self) -> int: ...

    @n3.setter
    def n3(self, arg: int, /) -> None: ...

    @property
    def flag(self) -> bool: ...

    @flag.setter
    def flag(self, arg: bool, /) -> None: ...

    @property
    def id(self) -> int: ...

    @id.setter
    def id(self, arg: int, /) -> None: ...

    @property
    def relation(self) -> str:
        """SHAPE: the relation's text."""

    @relation.setter
    def relation(self, arg: str, /) -> None: ...

    @property
    def symbols(self) -> list[SourcePath]:
        """SHAPE: each distinct symbol's source, in order of first use."""

    @symbols.setter
    def symbols(self, arg: Sequence[SourcePath], /) -> None: ...

    @property
    def symbol_types(self) -> list[int]:
        """SHAPE: per symbol, 0 for int, 1 for float."""

    @symbol_types.setter
    def symbol_types(self, arg: Sequence[int], /) -> None: ...

    @property
    def data(self) -> list[int]:
        """Per-kind plain data (cpp/core/kind_data.hpp)."""

    @data.setter
    def data(self, arg: Sequence[int], /) -> None: ...

    @property
    def more_sources(self) -> list[SourcePath]:
        """A relational guard's sources after the first."""

    @more_sources.setter
    def more_sources(self, arg: Sequence[SourcePath], /) -> None: ...

    @property
    def via_python(self) -> bool:
        """
        Set by the engine when it binds the declaration: evaluated through a Python reader.
        """

ANY_DIM: int = -9223372036854775808

MAX_DIMS: int = 1024

MARKING_ATTRS: tuple = ...

TORCH_STATE_FIELDS: tuple = ...

def guard_kind_table() -> list:
    """
    The kind table, one dict per kind in value order: kind, source ('required', 'optional', 'absent'), operand ('none', 'value', 'identity'), operand2, runs_user_code, relational, implied, record_version (0: never stored), never_stored (why, or None).
    """

def builtin_probes() -> list[str]:
    """
    The built-in global-state probes by id (GuardDecl.n of a GLOBAL_STATE without operand).
    """

MAX_CONSTANT_DEPTH: int = 100

MAX_SOURCE_DEPTH: int = 256

class GuardSetCore:
    """The compiled guard set. Use tripwire.GuardSet, which subclasses it."""

    @overload
    def __init__(self, decls: Sequence[GuardDecl], consts: list, hold_weakly: list, globals: object | None, closure: object | None, strict: bool, eval_error_type: object | None, shape_at: list = [], shape_ids: list = [], shape_args: list = [], shape_symbols: list = [], shape_paths: Sequence[SourcePath] = []) -> None: ...

    @overload
    def __init__(self, decoded: object, consts: list, globals: object | None, strict: bool, eval_error_type: object | None) -> None: ...

    check: types.MethodDescriptorType = ...

    def _failures(self, f_locals: object | None, first_only: bool) -> list:
        """
        [(guard_id, value, reason, fetch_failed)] for failing guards, by installation order.
        """

    def _tree(self) -> list:
        """
        The guard tree, preorder: (depth, text, [guard ids in current order], node fails, [guard fails], SHAPE symbol index or -1), for explain().
        """

    def _symbol_reader_facts(self, f_locals: Mapping[str, Any], f_globals: dict[str, Any] | None) -> list[tuple[str, tuple[Any, ...]]]:
        """
        What decides each SHAPE symbol's reader on this frame: [(printed symbol, ('frame',) | ('unreadable', error type name) | ('property', tensor type, C-level answered, is array, is tensor))], in the program's symbol order (GuardSet.symbol_readers, explain()).
        """

    @property
    def _shape_info(self) -> dict:
        """
        SHAPE relations: {'relations': [(id, 'kept'|'merged'|'implied', by id, failures)], 'symbols', 'operations' (distinct computed sub-expressions), 'fast_path'}.
        """

    def _decls(self) -> list[GuardDecl]:
        """
        The declarations as compiled, in installation order (a loaded set's diagnostics are built from them).
        """

    @property
    def _ambient_ids(self) -> list[int]: ...

    @property
    def _relational_ids(self) -> list[int]: ...

    def _guard_path(self, id: int) -> str:
        """
        'native' or 'python': how guard `id` reads its value (the adapter, the numpy struct, a C++ probe; or a Python reader).
        """

    def _field_mismatches(self, id: int, value: object | None) -> list:
        """
        [(field, dim, expected, actual)]: every field where value differs from a TENSOR_MATCH or ARRAY_MATCH guard's expectation, as the engine reads it.
        """

    @property
    def invalid(self) -> bool:
        """
        True once an object the guards name by identity has died: the set never passes again.
        """

    @property
    def invalid_reason(self) -> str: ...

    @property
    def node_count(self) -> int:
        """Distinct sources (one fetch each)."""

    @property
    def _uses_fast_pass(self) -> bool:
        """
        Whether every guard has a form decided without user code (the fast pass alone can decide a passing check).
        """

    @property
    def _fast_pass_count(self) -> int:
        """How many passing checks the fast pass decided alone (no residue)."""

    @property
    def _residue_pass_count(self) -> int:
        """
        How many passing checks the fast pass decided with its residues (guards that run user code, evaluated after it).
        """

    @property
    def _fast_guard_count(self) -> int:
        """
        Guards the fast pass decides without user code (by kind; the others are residues).
        """

    @property
    def _last_fast_guards(self) -> int:
        """
        Guards the fast pass decided in the last check it completed (fewer than _fast_guard_count when a fast form did not apply to the objects at hand).
        """

    @property
    def _last_skipped_guards(self) -> int:
        """
        Guards the skip of unchanged subtrees proved without evaluating them in the last check the fast pass completed.
        """

    @property
    def _globals(self, /) -> dict[str, Any] | None:
        """The globals dict G[...] sources read, or None."""

    @property
    def _root_kinds(self, /) -> tuple[bool, bool]:
        """(some source is rooted at G[...], some at C[...])."""

    @property
    def check_count(self) -> int: ...

    @property
    def pass_count(self) -> int: ...

    def __len__(self) -> int: ...

def with_shape_decls(decls: Sequence[GuardDecl], shape_at: list, shape_ids: list, shape_args: list, shape_symbols: list, shape_paths: Sequence[SourcePath]) -> list[GuardDecl]:
    """
    The declarations with the SHAPE relations placed among them, declared as GuardSetCore's constructor declares them (the same arguments): what a saved set encodes.
    """

class CacheEntry:
    """One entry of a tripwire.Cache (a view; read-only)."""

    @property
    def guards(self, /) -> GuardSetCore:
        """The entry's tripwire.GuardSet."""

    @property
    def payload(self, /) -> Any: ...

    @property
    def name(self, /) -> str | None: ...

    @property
    def hits(self) -> int: ...

    @property
    def _snapshot(self, /) -> tuple[Any, ...] | None: ...

    @property
    def valid(self) -> bool:
        """
        True while the entry is in its cache and no object its guards name by identity has died.
        """

    def __repr__(self) -> str: ...

class CacheCore:
    """The compiled-entry cache. Use tripwire.Cache, which subclasses it."""

    def __init__(self, recompile_limit: int, accumulated_limit: int, on_limit: str) -> None: ...

    def _add_probe(self, fn: object, name: str) -> bool: ...

    def _insert(self, guards: object, payload: object | None, name: object | None) -> int:
        """
        0 inserted, 1 recompile_limit hit, 2 accumulated_limit hit (nothing inserted).
        """

    def lookup(self, f_locals: Mapping[str, Any], /, default: Any = None) -> Any:
        """
        The payload of the first matching entry, most recently used first, or `default` on a miss. A payload may be None: use lookup_entry (or a sentinel default) to tell a hit from a miss.
        """

    def lookup_entry(self, f_locals: Mapping[str, Any] | None) -> CacheEntry | None:
        """The matching entry (counted as a hit), or None on a miss."""

    def _lookup_uncounted(self, f_locals: Mapping[str, Any] | None) -> CacheEntry | None:
        """
        lookup_entry without counting a hit or a miss (a second look after a counted miss).
        """

    def _probe_values(self) -> tuple[Any, ...] | None:
        """The probes' current values, or None without probes."""

    def _snapshot_matches(self, arg0: CacheEntry, arg1: object, /) -> bool: ...

    @property
    def probe_names(self) -> list[str]: ...

    def _entries(self) -> list[CacheEntry]:
        """Entries, most recently used first."""

    def __len__(self) -> int: ...

    def clear(self) -> None:
        """Drop every entry."""

    @property
    def index_source(self) -> object:
        """
        The source the dispatch index hashes (e.g. "L['x']"), or None (ordered scan).
        """

    def set_limits(self, recompile_limit: int, accumulated_limit: int) -> None:
        """
        New limits for the inserts to come (entries already over a lowered limit stay).
        """

    @property
    def recompile_limit(self) -> int: ...

    @property
    def accumulated_limit(self) -> int: ...

    @property
    def on_limit(self) -> str: ...

    @property
    def _counters(self) -> tuple: ...

class FastDispatch:
    """The C++ hit path of tripwire.specialize (private)."""

    def __call__(self, /, *args, **kwargs):
        """Call self as a function."""

    _bindable: types.MethodDescriptorType = ...

    _fast_disable: types.MethodDescriptorType = ...

    __vectorcalloffset__: types.MemberDescriptorType = ...

def _fast_setup(self: object, cache: object, fn: object, slow: object, miss: object) -> None:
    """
    Enable the C++ hit path of a FastDispatch: look `cache` up, fall back to slow(self, args, kwargs) and miss(self, args, kwargs, f_locals).
    """

def _enable_vectorcall(cls: object) -> bool:
    """
    Give a subclass of FastDispatch the vectorcall protocol (3.11 does not inherit it); False when it defines a __call__ of its own.
    """

class Replacement:
    """
    `code` checked to run in frames of `original` (the payload of a tripwire.frame cache entry). Raises TypeError when the layouts differ.
    """

    def __repr__(self, /):
        """Return repr(self)."""

    @property
    def original(self) -> types.CodeType | None:
        """
        The code object this replacement was checked against (None once it died).
        """

    @property
    def code(self) -> types.CodeType:
        """The replacement code object."""

class FrameScope:
    """
    A callable whose call runs `fn` with this thread's frame hook set to (handler, backend), restoring the previous hook after; handler None: with the hook suspended.
    """

    def __call__(self, /, *args, **kwargs):
        """Call self as a function."""

    def __get__(self, instance, owner=None, /):
        """Return an attribute of instance, which is of type owner."""

    __copy__: types.MethodDescriptorType = ...

    __deepcopy__: types.MethodDescriptorType = ...

    __vectorcalloffset__: types.MemberDescriptorType = ...

    @property
    def fn(self) -> Any:
        """The callable called in the scope."""

    @property
    def handler(self) -> Any:
        """The hook's handler (None: a suspended call)."""

    @property
    def backend(self) -> Any:
        """The hook's backend key (None: a suspended call)."""

    @property
    def fallback(self) -> Any:
        """Called instead when the hook cannot be set, or None."""

def _frame_limit_reached(cache: CacheCore, f_locals: dict[str, Any]) -> int:
    """
    0, or the limit (1 recompile_limit, 2 accumulated_limit) an insert for these locals would reach.
    """

def _frame_setup(error_type: object) -> None:
    """Set the exception type of frame-hook conflicts (tripwire.FrameError)."""

def _frame_set_hook(handler: Callable[..., Any] | None, backend: Any, /) -> tuple[Any, Any] | None:
    """
    Set (or clear, with None, None) this thread's frame hook; returns the previous (handler, backend) or None.
    """

def _frame_get_hook() -> tuple[Any, Any] | None:
    """This thread's (handler, backend), or None."""

def _frame_status() -> dict[str, Any]:
    """
    installed, active_threads, layout_verified, layout_error, eval_frame ('default', 'tripwire', 'foreign').
    """

def _frame_verify_layout() -> tuple[bool, str]:
    """Check the interpreter-frame layout mirror now: (ok, why it failed)."""

def _frame_incompatibility(original: types.CodeType, code: types.CodeType) -> str | None:
    """Why `code` cannot run in frames of `original`, or None."""

def _frame_cache(code: types.CodeType, backend: Any) -> CacheCore | None:
    """The cache of `code` for `backend`, or None."""

def _frame_attach_cache(code: types.CodeType, backend: Any, cache: CacheCore) -> None:
    """Make `cache` the cache of `code` for `backend`."""

def _frame_strategy(code: types.CodeType, backend: Any) -> int:
    """0 default, 1 skip, 2 run-only, 3 skip-recursive."""

def _frame_reset(code: types.CodeType, backend: Any = None) -> None:
    """Clear the caches and strategies of `code` (for one backend, or all)."""

def _frame_release_all() -> int:
    """
    Drop every frame cache of every code object (at exit); returns how many.
    """

def _frame_run_stats() -> tuple[int, int]:
    """(replacements run in place, in shadow frames) so far."""

def read_source(root: RootKind, name: str, steps: Sequence[tuple], f_locals: object, f_globals: object | None, f_closure: object | None) -> object:
    """
    The value at a source, read as a check reads it: steps are (kind, operand, index). Raises LookupError for a missing value, or what a step raised.
    """

def is_constant(value: object | None, depth: int = 0) -> bool:
    """
    Whether value may be an EQUALS_MATCH constant, nested within MAX_CONSTANT_DEPTH - depth.
    """

def equals_match(value: object | None, constant: object | None) -> bool:
    """EQUALS_MATCH of value against constant, as a check decides it."""

def read_builtin_probe(name: str) -> object:
    """The current value of a built-in global-state probe."""

def dict_version(d: dict) -> int:
    """
    The engine's version stamp of dict d (changes on every mutation; unique across dicts).
    """

def register_dict_getattr(fn: object, dicts: object) -> None:
    """
    Declare fn, a class __getattr__, to look a name up in the instance dict's dicts named by dicts (a tuple of str), in order, and otherwise raise AttributeError formatted from type(self).__name__, as nn.Module.__getattr__ does: a check then decides `not hasattr` on a miss without calling it, while fn's code is unchanged. The claim is the caller's.
    """

def parse_relation(text: str) -> tuple:
    """
    (code_end, [(begin, end, symbol)], [symbol texts]): where the relation ends (before a comment), every symbol occurrence, and the distinct symbol texts in order of first use. Raises the shape syntax error with the offset of the problem.
    """

def evaluate_relation(text: str, types: Sequence[int], values: list, both_paths: bool = True) -> tuple:
    """
    (holds, error or None, 'fast' or 'exact'): one relation on values for its symbols in order of first use (types: 0 int, 1 float), as a check evaluates it. The compiled relation is memoised by (text, types). both_paths: also run the exact path when the fast one decides, and raise if they disagree (the reference tests); without it a fast pass returns at once.
    """

def _install_torch_adapter(table: object, torch_version: str) -> None:
    """
    Install the torch adapter's table (tripwire._torch_adapter.table). Once installed it stays.
    """

def _set_plain_tensor_types(types: tuple) -> int:
    """
    Tensor types whose SIZE/STRIDE/STORAGE_OFFSET steps may be read by the adapter (exact type; their size/stride/storage_offset must be TensorBase's): returns how many were kept.
    """

def applied_dispatch_keys(value: object) -> int | None:
    """
    DISPATCH_KEY_SET_MATCH's reading of `value`: the raw bits of its DispatchKeySet with the current thread's include/exclude sets applied and the Python keys masked as torch's guards mask them, read through the torch adapter; None when `value` is not a DispatchKeySet the adapter reads (or no adapter is installed).
    """

def dispatch_key_set_reader_installed() -> bool:
    """
    Whether DISPATCH_KEY_SET_MATCH can be built: the torch adapter is installed and verified that it reads torch._C.DispatchKeySet objects as torch does.
    """

def torch_adapter_installed() -> bool:
    """
    Whether tensors and torch's state are read through the compiled torch adapter.
    """

def _masks_python_keys() -> bool | None:
    """
    Whether TENSOR_MATCH masks the Python dispatch keys now, on this thread, as torch's guards do: torch's own thread-local flag, read through its getter (_find_torch_mode_flag); None when the getter was not found (or is hidden): the engine then fails a key set carrying a Python key closed.
    """

def _find_torch_mode_flag(setter: object | None, python_key_bits: int) -> bool:
    """
    Take torch's hidden getter of its per-thread 'dispatch mode without ignore_compile_internals' flag from the installed torch adapter (which finds it in libtorch_python.so) and verify it against `setter` (torch._C._dynamo.guards.set_is_in_mode_without_ignore_compile_internals). `python_key_bits`: the raw bits of the Python keys, registered either way. Whether it is verified.
    """

def _set_python_readers(tensor: object | None, array: object | None, torch_state: object | None, mode_stack: object | None, default_device: object | None, saved_hooks: object | None, dual_level: object | None) -> None:
    """
    Register the Python readers used without the adapter or the numpy struct (None: keep).
    """

def _enable_numpy_struct(ndarray: object, dtype: object, descr_layout: int) -> bool:
    """
    Read arrays of this type (numpy.ndarray) and dtypes (numpy.dtype) from their structs, with PyArray_Descr's layout `descr_layout` (1: numpy 1.x, 2: numpy 2.x); verified by the caller.
    """

def _register_numpy_dtype(dtype_type: object) -> None:
    """
    Make simple numpy dtypes EQUALS_MATCH constants (after _enable_numpy_struct).
    """

def _numpy_struct_probe(array: object, ndarray: object, dtype: object, descr_layout: int) -> object:
    """
    What the struct reader sees in `array` before it is enabled (the layout check): the fields of read_array_fields, then its dtype's itemsize, type number, kind, type char and byte order as read from the dtype's struct.
    """

def numpy_struct_enabled() -> bool:
    """Whether arrays are read from their struct."""

def read_tensor_fields(value: object | None, native: bool) -> object:
    """
    (dispatch_keys, dtype, device_index, requires_grad, sizes, strides|None, storage_offset) as TENSOR_MATCH reads them: through the adapter (native) or the Python reader. None for a value it cannot read.
    """

def read_array_fields(value: object | None, native: bool) -> object:
    """
    (ndim, sizes, strides, c_contiguous, f_contiguous, aligned, writeable, dtype) as ARRAY_MATCH reads them: from the struct (native) or the Python reader. None for a value it cannot read.
    """

def read_shape(value: object | None) -> object:
    """
    The C++ shape reader (runtime/tensors/readers.hpp read_shape): (ndim, sizes, strides|None, storage_offset|None, stride_unit), or 'not applicable' / 'unavailable'.
    """

def dtype_code(dtype: object) -> int:
    """
    The c10::ScalarType of a torch.dtype through the adapter (-1 without it).
    """

def torch_state_differences(want: Sequence[int], now: Sequence[int]) -> list[str]:
    """
    The fields that differ between two torch global-state tuples, as GLOBAL_STATE names them.
    """

def register_constant_type(type: object, compare: str) -> None:
    """
    Make instances of `type` EQUALS_MATCH constants, compared by 'identity', as a 'tuple' of constants, or by the type's own C 'richcompare' (static C types only).
    """

def constant_types() -> list:
    """
    [(type, comparison, subclasses)]: the registered constant types besides the built-in ones.
    """

class _CodecError(ValueError):
    pass

def encode_guard_set(decls: Sequence[GuardDecl], consts: list, const_flags: Sequence[int], labels: Sequence[str], stacks: list, references: list, ref_of: Callable, globals_module: str | None, baselines: Sequence[tuple[str, int]], dropped: Sequence[tuple[str, str, str]], strict: bool, version: str, python: tuple[int, int]) -> bytes:
    """
    The bytes of a guard set (docs/format.md). Constants that are not plain values go through ref_of(obj) -> reference index, which appends (kind, module, qualname, fingerprint) to `references` or raises.
    """

class Decoded:
    """A decoded, validated guard-set document (tripwire.serialization)."""

    @property
    def tripwire_version(self) -> str: ...

    @property
    def python_version(self) -> tuple[int, int]: ...

    @property
    def strict(self) -> bool: ...

    @property
    def globals_module(self) -> str | None: ...

    @property
    def references(self) -> list:
        """[(kind, module, qualname, fingerprint, byte offset)]"""

    @property
    def baselines(self) -> list[tuple[str, int]]: ...

    @property
    def dropped(self) -> list[tuple[str, str, str]]: ...

    @property
    def const_flags(self) -> list[int]: ...

    @property
    def probe_references(self) -> list[int]:
        """Indices of the references that GLOBAL_STATE guards call as probes."""

    @property
    def guard_count(self) -> int: ...

    def decls(self) -> list[GuardDecl]:
        """
        The guard declarations (operands index constants()), until a guard set is built from this document (GuardSetCore(decoded, ...) moves them there: see its _decls()).
        """

    def decl(self, i: int) -> GuardDecl:
        """The declaration of the guard at position i."""

    def info(self, i: int) -> tuple:
        """(label, install stack, byte offset) of the guard at position i."""

    def check_loaded(self, consts: list) -> tuple[bool, list[int], bool]:
        """
        Check every source's texts against its steps and the common kinds' operands against the built constants, interning names in place (runtime/serial/loaded.hpp). Returns (reads_globals, positions of the guards the Python loader checks, whether a guard reads through the torch adapter only); raises _CodecError.
        """

    def hold_weakly(self, consts: list) -> tuple[list, list[int]]:
        """
        (consts with each weakly held constant as (weakref, id, type name), the positions replaced): what a loaded set keeps for its lazily built diagnostics.
        """

    def guard_info(self) -> list:
        """[(label, install stack, byte offset)] per guard."""

    def constants(self, resolved: list) -> list:
        """
        The constants as objects, references replaced by `resolved` (one object per reference).
        """

def decode_guard_set(data: bytes) -> Decoded:
    """Decode and validate bytes (raises _CodecError naming the byte offset)."""

def user_stack(is_machinery: object, depth: int) -> tuple:
    """
    The caller's stack outside tripwire's machinery, innermost last, at most `depth` entries, as 'file:line in func' (is_machinery(filename) is asked once per (code, instruction)).
    """

def _clear_install_site_memo() -> None:
    """Drop the memoised install-site strings (tests)."""

def _dict_hints_enabled() -> bool:
    """
    Whether dict entry hints (the interpreter's dict layout, verified at start-up) are in use.
    """

def _skip_enabled() -> bool:
    """
    Whether the skip of unchanged subtrees is in use (verified at start-up, not switched off).
    """

def _force_python_readers(on: bool) -> bool:
    """
    Test hook: guard sets built while on read tensors, arrays and torch's state through the Python readers even when the torch adapter or the numpy struct is available; returns the previous setting.
    """
