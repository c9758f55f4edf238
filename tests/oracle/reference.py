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
import copy
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

from tripwire.catalogue import GuardKind, GuardSpec, resolve
from tripwire.source import RootKind, Source, Step, StepKind

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


# -- torch and numpy, read through their public Python APIs (the engine reads its own in C++:
# cpp/runtime/tensors, or through tripwire.tensors' readers, which this module does not use).

# c10::ScalarType codes by dtype name (torch 2.13, c10/core/ScalarType.h).
_SCALAR_TYPES = {
    "uint8": 0, "int8": 1, "int16": 2, "int32": 3, "int64": 4, "float16": 5, "float32": 6,
    "float64": 7, "complex32": 8, "complex64": 9, "complex128": 10, "bool": 11, "qint8": 12,
    "quint8": 13, "qint32": 14, "bfloat16": 15, "quint4x2": 16, "quint2x4": 17, "bits1x8": 18,
    "bits2x4": 19, "bits4x2": 20, "bits8": 21, "bits16": 22, "float8_e5m2": 23, "float8_e4m3fn": 24,
    "float8_e5m2fnuz": 25, "float8_e4m3fnuz": 26, "uint16": 27, "uint32": 28, "uint64": 29,
    "float8_e8m0fnu": 44, "float4_e2m1fn_x2": 45,
}  # fmt: skip
# torch 2.13's autocast devices (at::autocast::_AUTOCAST_SUPPORTED_DEVICES) with their c10::DeviceType.
_AUTOCAST_DEVICES = (
    ("cpu", 0), ("cuda", 1), ("mtia", 19), ("maia", 8), ("xpu", 12), ("ipu", 18), ("hpu", 15),
    ("xla", 9), (None, 20), ("mps", 13),
)  # fmt: skip


def _torch() -> Any:
    return sys.modules["torch"]


def _scalar_type(dtype: Any) -> int:
    return _SCALAR_TYPES[str(dtype).removeprefix("torch.")]


def _cublas_option(pair: tuple[bool, bool]) -> int:
    """at::CuBLASReductionOption from (allow reduced precision, allow split-K)."""
    allow_reduced, allow_splitk = pair
    return 0 if allow_reduced else (1 if allow_splitk else 2)


def torch_global_state() -> tuple[int, ...]:
    """torch's global state in GLOBAL_STATE's layout, read field by field from torch's Python API."""
    torch = _torch()
    C = torch._C
    devices = [(name or C._get_privateuse1_backend_name(), code) for name, code in _AUTOCAST_DEVICES]
    return (
        int(torch.is_grad_enabled()),
        int(C._is_torch_function_enabled()),
        int(C._is_torch_function_all_disabled()),
        int(torch.are_deterministic_algorithms_enabled()),
        int(torch.is_deterministic_algorithms_warn_only_enabled()),
        int(torch.backends.cuda.matmul.fp32_precision == "tf32"),
        _cublas_option(C._get_cublas_allow_fp16_reduced_precision_reduction()),
        _cublas_option(C._get_cublas_allow_bf16_reduced_precision_reduction()),
        torch.get_num_threads(),
        _scalar_type(torch.get_default_dtype()),
        int(torch.is_autocast_cache_enabled()),
        len(devices),
        *(code for _, code in devices),
        *(int(torch.is_autocast_enabled(name)) for name, _ in devices),
        *(_scalar_type(torch.get_autocast_dtype(name)) for name, _ in devices),
    )


def _torch_state_equal(want: tuple[int, ...], now: tuple[int, ...]) -> bool:
    """torch's rule: every field equal, an autocast dtype only where autocast is enabled."""
    header = 12
    if len(want) != len(now) or want[:header] != now[:header]:
        return False
    n = now[header - 1]
    types, enabled, dtypes = (
        slice(header, header + n),
        slice(header + n, header + 2 * n),
        slice(header + 2 * n, None),
    )
    if want[types] != now[types] or want[enabled] != now[enabled]:
        return False
    return all(not on or a == b for on, a, b in zip(want[enabled], want[dtypes], now[dtypes], strict=True))


def torch_function_modes() -> tuple[type, ...]:
    """The types of the torch-function modes, bottom of the stack first."""
    from torch.overrides import _get_current_function_mode_stack

    return tuple(type(m) for m in _get_current_function_mode_stack())


def torch_default_device() -> Any:
    """``torch.utils._device.CURRENT_DEVICE``."""
    import torch.utils._device as device_module

    return device_module.CURRENT_DEVICE


def torch_saved_tensors_hooks() -> tuple[int, int] | None:
    """What Dynamo's AUTOGRAD_SAVED_TENSORS_HOOKS guard compares (guards.py hooks_ids_fn), with
    torch's own functions: None unless the top hooks are inlineable, else their ids."""
    from torch._functorch._aot_autograd import utils as aot_utils

    hooks = aot_utils.top_saved_tensors_hooks()
    if not aot_utils.saved_tensors_hooks_are_inlineable(hooks):
        return None
    return tuple(map(id, hooks))  # type: ignore[return-value]


def torch_dual_level() -> Any:
    """What Dynamo's DUAL_LEVEL_MATCH compares: forward_ad._current_level, read with getattr
    (None when getattr raises; the guard then fails)."""
    import torch.autograd.forward_ad as forward_ad

    try:
        return getattr(forward_ad, "_current_level")
    except Exception:
        return None


def _default_device_matches(snapshot: str | None) -> bool:
    cur = torch_default_device()
    if snapshot is None:
        return cur is None
    torch = _torch()
    return type(cur) is torch.device and cur == torch.device(snapshot)


# -- global-state probes (the engine reads its own in C++: builtin_probe in cpp/runtime/eval/guard_kinds.cpp)
BUILTIN_PROBES: dict[str, Callable[[], Any]] = {
    "recursion_limit": sys.getrecursionlimit,
    "gc_enabled": gc.isenabled,
    "torch_global_state": torch_global_state,
    "torch_function_mode_stack": torch_function_modes,
    "torch_default_device": torch_default_device,
    "torch_saved_tensors_hooks": torch_saved_tensors_hooks,
    "torch_dual_level": torch_dual_level,
}


def dict_version(d: dict) -> int:
    """The engine's version stamp of dict ``d`` (``ma_version_tag`` on 3.11)."""
    from tripwire import _core  # the stamp is read by C; nothing else exposes it

    return _core.dict_version(d)


# -- fetching -----------------------------------------------------------------------------------
def _exc_text(e: BaseException) -> str:
    """``"TypeName: message"``; the message is dropped when str() of a hostile exception raises."""
    try:
        msg = str(e)
    except Exception:
        msg = ""
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


_NOT_FOUND = object()
_namespace = type.__dict__["__dict__"].__get__  # a class's own namespace, past any metaclass
_mro = type.__dict__["__mro__"].__get__


def _class_dict(cls: Any) -> dict:
    """The namespace dict of class ``cls`` itself (not the read-only proxy Python shows).

    type's own ``__dict__`` getset gives a mappingproxy over it (and raises TypeError for
    anything that is not a type, whatever its ``__class__`` claims); the proxy's only referent is
    that dict."""
    proxy = _namespace(cls)
    inner = gc.get_referents(proxy)
    if len(inner) != 1 or type(inner[0]) is not dict:
        raise TypeError("class namespace is not a dict")
    return inner[0]


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


def _has_python_key(torch: Any, v: Any) -> bool:
    """Whether the tensor's own dispatch key set has the Python key (a __torch_dispatch__ tensor)."""
    return torch._C._dispatch_keys(v).has(torch._C.DispatchKey.Python)


def _may_overlap(x: Any, y: Any) -> bool:
    """torch's ``not tensors_definitely_do_not_overlap<StaticMeta>(x, y)`` (guards.cpp), on the C++
    metadata read with ``__torch_function__`` disabled; the storages are not compared."""
    torch = sys.modules["torch"]
    base = torch._C.TensorBase
    if x is y:  # x.is_same(y): one TensorImpl (one Python object per TensorImpl)
        return True
    with torch._C.DisableTorchFunction():
        if base.numel(x) == 0 or base.numel(y) == 0:
            return False
        if base.storage_offset(x) > base.storage_offset(y):
            x, y = y, x
        ox, oy = base.storage_offset(x), base.storage_offset(y)
        if base.is_contiguous(x) and base.is_contiguous(y):
            return ox + base.numel(x) > oy
        sx, tx = base.size(x), base.stride(x)
        last = ox + sum((sx[i] - 1) * tx[i] for i in range(len(sx)))
        if last < oy:
            return False
        sy, ty = base.size(y), base.stride(y)
        if len(sx) == 2 and len(sy) == 2 and tx[1] == 1 and ty[1] == 1 and tx[0] == ty[0]:
            delta = oy - ox
            if delta < sx[1]:
                return True
            if tx[0] * (sx[0] - 1) + sx[1] <= delta:
                return False
            if delta % tx[0] + sy[1] <= tx[0]:
                return False
        return True


def _overlap_holds(values: tuple, n_overlapping: int) -> bool:
    """torch's check_overlapping: the values that may overlap another are exactly the first
    ``n_overlapping`` (every value must be a torch.Tensor; torch raises otherwise, this fails)."""
    torch = sys.modules.get("torch")
    if torch is None or not all(issubclass(type(v), torch.Tensor) for v in values):
        return False
    if any(_has_python_key(torch, v) for v in values):  # its metadata may be Python code: not read
        return False
    flagged = set()
    for i in range(len(values)):
        for j in range(i):
            if _may_overlap(values[i], values[j]):
                flagged |= {i, j}
    return flagged == set(range(n_overlapping))


def _cpp_tensor_step(v: Any, k: StepKind, a: Any) -> Any:
    """torch's TensorPropertyGuardAccessor / GradGuardAccessor, as guards.cpp reads them: the value
    must be a torch.Tensor (its real type, not ``__class__``); then the C++ ``sym_size(a)``,
    ``sym_stride(a)`` (``a >= dim`` fails), ``sym_storage_offset()`` (a symbolic value fails) or
    ``grad()`` (None when undefined). Read through TensorBase's own C methods with every
    ``__torch_function__`` (subclass and mode) disabled, so no override is consulted."""
    torch = sys.modules.get("torch")
    if torch is None or not issubclass(type(v), torch.Tensor):
        raise FetchError(f"not a tensor ({type(v).__name__})")
    base = torch._C.TensorBase
    if k is not StepKind.GRAD and _has_python_key(torch, v):
        raise FetchError("a __torch_dispatch__ tensor (its sizes may be Python code): not read")
    import warnings

    with torch._C.DisableTorchFunction(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the non-leaf .grad warning: torch's accessor reads the field
        if k is StepKind.GRAD:
            return base.grad.__get__(v)
        if k is not StepKind.TENSOR_STORAGE_OFFSET and a >= base.dim(v):
            raise FetchError("tensor has too few dimensions")
        if k is StepKind.TENSOR_SIZE:
            out = base.size(v, a)
        elif k is StepKind.TENSOR_STRIDE:
            out = base.stride(v, a)
        else:
            out = base.storage_offset(v)
    if type(out) is not int:
        raise FetchError("symbolic values found")
    return out


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
        if k in (StepKind.TENSOR_SIZE, StepKind.TENSOR_STRIDE, StepKind.TENSOR_STORAGE_OFFSET, StepKind.GRAD):
            return _cpp_tensor_step(v, k, a)
        if k is StepKind.TYPE_DICT:
            return _class_dict(v)
        if k is StepKind.TYPE_MRO:
            # type's own getset reads tp_mro: no metaclass __getattribute__ or __mro__ override.
            # Applied to anything that is not a type, it raises TypeError (whatever __class__ says).
            mro = _mro(v)
            if mro is None:
                raise TypeError("class has no MRO yet")
            return mro
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
    except Exception as e:
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
    except Exception as e:
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
    # Every NaN alike; otherwise the number and its sign (0.0 == -0.0, but they are two forms).
    return _NAN if x != x else (x, math.copysign(1.0, x))


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
    registered = _registered(t)
    if registered == "tuple":
        if depth >= MAX_CONSTANT_DEPTH:
            raise _TooDeep
        return (t, tuple(_form(e, depth + 1) for e in x))
    if registered in ("native", "richcompare"):
        return (t, *_value_form(x))
    # Enum members, registered identity types (torch.dtype), and any other object, by identity.
    return ("identity", id(x))


def _registered(t: type) -> str | None:
    """The comparison of a registered constant type (the engine's registry is data: the types and
    the names of their comparisons; each comparison is implemented here on its own)."""
    from tripwire import _core

    for tp, compare, subclasses in _core.constant_types():
        if t is tp or (subclasses and issubclass(t, tp)):
            return compare
    return None


def _value_form(x: Any) -> tuple:
    """The fields that decide equality of a registered value type this oracle knows."""
    t = type(x)
    mod = t.__module__ or ""
    if mod.startswith("torch") and t.__name__ == "device":
        return (x.type, x.index)
    if mod.startswith("numpy"):
        return (x.str,)  # numpy dtypes: kind, byte order and size ('<f4', '<U5', '|b1')
    raise NotImplementedError(f"the reference does not know how {t} compares")


def _value_constant(x: Any) -> bool:
    """Whether a value of a registered type may be a constant (numpy: simple dtypes only)."""
    mod = type(x).__module__ or ""
    if mod.startswith("numpy"):
        return x.fields is None and x.subdtype is None and x.kind in "biufcOSU"
    return True


def _multiset(forms: Iterable[Any]) -> frozenset:
    return frozenset(collections.Counter(forms).items())


def is_constant(c: Any, _depth: int = 0) -> bool:
    """Whether ``c`` may be the constant of an EQUALS_MATCH: built-in scalars, enum members and
    containers of these, nested at most MAX_CONSTANT_DEPTH deep."""
    t = type(c)
    if t in _EQ_SCALARS or t is range or _is_enum_member(c):
        return True
    registered = None if t in _CONTAINERS else _registered(t)
    if registered is not None:
        if registered == "tuple":
            return _depth < MAX_CONSTANT_DEPTH and all(is_constant(x, _depth + 1) for x in c)
        return _value_constant(c)
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
            if len(a) > 1 and a[1]:
                # python_eq: torch's EQUALS_MATCH, Python's own == (PyObject_RichCompareBool).
                return v is a[0] or (type(v) is type(a[0]) and bool(v == a[0]))
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
        if k is GuardKind.SET_CONTAINS:
            # A set or frozenset of any subclass, looked up in its own table (the base type's
            # method, never a subclass's override).
            if not isinstance(v, (set, frozenset)):
                return False
            hash(a[0])  # an unhashable item raises (the methods would retry a set as a frozenset)
            base = set if isinstance(v, set) else frozenset
            return base.__contains__(v, a[0]) is a[1]
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
            if probe == "torch_global_state":
                return _torch_state_equal(tuple(a[1]), torch_global_state())
            if probe == "torch_function_mode_stack":
                modes = torch_function_modes()
                return len(modes) == len(a[1]) and all(x is y for x, y in zip(modes, a[1], strict=True))
            if probe == "torch_default_device":
                return _default_device_matches(a[1])
            if probe == "torch_saved_tensors_hooks":
                return torch_saved_tensors_hooks() == a[1]
            if probe == "torch_dual_level":
                level = torch_dual_level()
                return type(level) is int and level == a[1]
            current = BUILTIN_PROBES[probe]() if isinstance(probe, str) else probe()
            return equals_match(current, a[1])
        if k is GuardKind.LAMBDA:
            return bool(a[0](v))
        if k is GuardKind.SHAPE:
            return shape_holds(a[0], a[1], a[2], v)
        if k is GuardKind.TENSOR_MATCH:
            return _tensor_matches(v, a[0], a[1])
        if k is GuardKind.ARRAY_MATCH:
            return _array_matches(v, a[0], a[1])
        if k is GuardKind.DIMENSION_MARKING:
            return _markings_hold(v, a[0])
        if k is GuardKind.ALIAS:
            return v[0] is v[1]
        if k is GuardKind.NO_ALIAS:
            return len({id(x) for x in v}) == len(v)
        if k is GuardKind.STORAGE_OVERLAPPING:
            return _overlap_holds(v, a[1])
        if k is GuardKind.DISPATCH_KEY_SET_MATCH:
            return _applied_key_set(v) == a[0]
    except Exception:
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


# -- tensors, arrays, markings -------------------------------------------------------------------------
def _dims_match(want: tuple, got: tuple) -> bool:
    return len(want) == len(got) and all(w is None or w == g for w, g in zip(want, got, strict=True))


def _applied_key_set(v: Any) -> int | None:
    """DISPATCH_KEY_SET_MATCH's reading, as torch's leaf: a value whose type derives from
    DispatchKeySet (pybind11's cast), its C++ keys read through the class's own methods (never a
    subclass's overrides), then guards.h LocalState::apply with this thread's state now.

    The Python-key mask: torch reads a C++ per-thread flag that Python cannot read; this oracle
    reads the module global the modes set it from (is_in_any_mode_without_ignore_compile_internals),
    which equals the flag on one thread with modes entered by ``with``. Across threads, or with
    torch's setter called directly, the tests compare the engine with torch's own guard instead."""
    C = _torch()._C
    KS = C.DispatchKeySet
    if not issubclass(type(v), KS):
        return None
    from torch.utils._python_dispatch import is_in_any_mode_without_ignore_compile_internals

    keys = KS.from_raw_repr(KS.raw_repr(v))
    keys = KS.__sub__(
        KS.__or__(keys, C._dispatch_tls_local_include_set()), C._dispatch_tls_local_exclude_set()
    )
    if not is_in_any_mode_without_ignore_compile_internals():
        for key in (C.DispatchKey.Python, C.DispatchKey.PythonTLSSnapshot, C.DispatchKey.PythonDispatcher):
            keys = KS.remove(keys, key)
    return int(KS.raw_repr(keys))


def _tensor_matches(v: Any, t: type, e: Any) -> bool:
    """TENSOR_MATCH as torch's TensorCheck: the exact type, then the fields torch compares."""
    if type(v) is not t:
        return False
    torch = _torch()
    C = torch._C
    base = C.TensorBase
    from torch.utils._python_dispatch import is_in_any_mode_without_ignore_compile_internals

    with C.DisableTorchFunction():
        keys = C._dispatch_keys(v) | C._dispatch_tls_local_include_set()
        keys = keys - C._dispatch_tls_local_exclude_set()
        if not is_in_any_mode_without_ignore_compile_internals():
            keys = keys - C.DispatchKeySet(C.DispatchKey.Python)
            keys = keys - C.DispatchKeySet(C.DispatchKey.PythonTLSSnapshot)
            keys = keys - C.DispatchKeySet(C.DispatchKey.PythonDispatcher)
        device = base.device.__get__(v)
        strided = base.layout.__get__(v) is torch.strided
        fields_ok = (
            keys.raw_repr() == e.dispatch_keys
            and _scalar_type(base.dtype.__get__(v)) == e.dtype
            and (-1 if device.index is None else device.index) == e.device_index
            and bool(base.requires_grad.__get__(v)) == e.requires_grad
        )
        if not fields_ok or base.dim(v) != len(e.sizes):
            return False
        if not _dims_match(e.sizes, tuple(base.shape.__get__(v))):
            return False
        if strided:
            if not _dims_match(e.strides, tuple(base.stride(v))):
                return False
        elif any(s is not None for s in e.strides):
            return False
        offset = base.storage_offset(v) if strided else 0
        return e.storage_offset is None or e.storage_offset == offset


def _array_matches(v: Any, t: type, e: Any) -> bool:
    """ARRAY_MATCH: exact type, the dtype as EQUALS_MATCH compares dtypes, shape, strides, flags."""
    if type(v) is not t:
        return False
    np = sys.modules["numpy"]
    nd = np.ndarray
    want = (
        e.dtype
        if isinstance(e.dtype, np.dtype)
        else np.dtype(list(e.dtype) if isinstance(e.dtype, tuple) else e.dtype)
    )
    dtype = nd.dtype.__get__(v)
    if type(dtype) is not type(want) or not dtype == want:
        return False
    flags = nd.flags.__get__(v)
    return (
        _dims_match(e.sizes, tuple(nd.shape.__get__(v)))
        and _dims_match(e.strides, tuple(nd.strides.__get__(v)))
        and (not e.c_contiguous or flags.c_contiguous)
        and (not e.f_contiguous or flags.f_contiguous)
        and (not e.aligned or flags.aligned)
        and flags.writeable == e.writeable
    )


_MARKINGS = (
    "_dynamo_dynamic_indices", "_dynamo_weak_dynamic_indices", "_dynamo_unbacked_indices",
    "_dynamo_strict_unbacked_indices", "_dynamo_static_indices",
)  # fmt: skip


def _markings_hold(v: Any, m: Any) -> bool:
    """torch's DIMENSION_DYNAMIC_MARKING_GUARD (guards.py, "Note: Dimension Marking Guards")."""
    if not hasattr(v, "_has_dynamo_dim_marking"):
        return True
    if all(built is None for built in m.attrs):
        return False  # marked now, never when built
    for name, built in zip(_MARKINGS, m.attrs, strict=True):
        if not hasattr(v, name):
            continue
        if built is None or not getattr(v, name).issubset(frozenset(built)):
            return False
    if m.dependent and hasattr(v, "_dynamo_unbacked_indices"):
        for name, want in (
            ("_dynamo_shape_ids", m.shape_ids),
            ("_dynamo_unbacked_bounds", m.unbacked_bounds),
        ):
            if not getattr(v, name, None) == want:
                return False
    return True


def _value_for(spec, f_locals, f_globals, f_closure, cache):
    """Fetch the value a guard reads, memoised per source (one fetch per source, as the engine).
    A SHAPE relation reads {symbol text: value}, a relational guard the tuple of its sources'
    values (a FetchError if any fails)."""
    if spec.kind is GuardKind.SHAPE:
        values = {}
        for src in spec.args[1]:
            v = _fetch_memo(src, f_locals, f_globals, f_closure, cache)
            if type(v) is FetchError:
                return v
            values[str(src)] = v
        return values
    if spec.kind in (GuardKind.ALIAS, GuardKind.NO_ALIAS, GuardKind.STORAGE_OVERLAPPING):
        operands = []
        for src in spec.sources:
            if src not in cache:
                try:
                    cache[src] = fetch(src, f_locals, f_globals, f_closure)
                except FetchError as e:
                    cache[src] = e
            if type(cache[src]) is FetchError:
                return cache[src]
            operands.append(cache[src])
        return tuple(operands)
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
    by_form: dict[str, Any] = {}
    for src, t in zip(symbols, types_, strict=True):
        value = values[str(src)]
        if type(value) is not {"int": int, "float": float}[t]:
            return False
        by_form[_symbol_form(ast.parse(str(src), mode="eval").body)] = value
    try:
        result = _ShapeInterpreter(text, by_form).run()
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


class _SizeForms(ast.NodeTransformer):
    """The spellings torch prints for one size or stride, made one: ``X.shape[i]`` and
    ``X.size(i)`` are ``X.size()[i]``, ``X.stride(i)`` is ``X.stride()[i]``, ``getattr(X, 'a')``
    is ``X.a``. The oracle's own reading of a symbol (it shares no parser with the engine)."""

    def visit_Subscript(self, n: ast.Subscript) -> ast.AST:
        self.generic_visit(n)
        if isinstance(n.value, ast.Attribute) and n.value.attr == "shape":
            size = ast.Call(ast.Attribute(n.value.value, "size", ast.Load()), [], [])
            return ast.Subscript(size, n.slice, ast.Load())
        return n

    def visit_Call(self, n: ast.Call) -> ast.AST:
        self.generic_visit(n)
        f = n.func
        if isinstance(f, ast.Attribute) and f.attr in ("size", "stride") and len(n.args) == 1:
            whole = ast.Call(ast.Attribute(f.value, f.attr, ast.Load()), [], [])
            return ast.Subscript(whole, n.args[0], ast.Load())
        if (
            isinstance(f, ast.Name)
            and f.id == "getattr"
            and len(n.args) == 2
            and isinstance(n.args[1], ast.Constant)
            and type(n.args[1].value) is str
        ):
            return ast.Attribute(n.args[0], n.args[1].value, ast.Load())
        return n


def _symbol_form(n: ast.AST) -> str:
    """A symbol's spelling-independent form: the dump of its normalized tree (no positions)."""
    return ast.dump(_SizeForms().visit(copy.deepcopy(n)))


class _ShapeInterpreter:
    def __init__(self, text: str, values: Mapping[str, Any]) -> None:
        self.text = text
        self.values = values

    def run(self) -> Any:
        return self.eval(ast.parse(self.text.strip(), mode="eval").body)

    def symbol(self, n: ast.AST) -> Any:
        form = _symbol_form(n)
        if form not in self.values:
            raise _ShapeError(f"no value for symbol {ast.unparse(n)}")
        return _int(self.values[form])

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
