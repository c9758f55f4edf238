"""Tensors, arrays and framework state: expectations, readers, and the engine's fast paths for them.

torch and numpy are optional. Nothing here imports either: a torch tensor or a numpy array can only
exist once its framework was imported, so support is switched on lazily, by the builder and by
inference, when they meet such a value (``ensure_torch``, ``ensure_numpy``).

How the engine reads these values:

* torch tensors and torch's global state: through the **torch adapter** (``tripwire._torch_adapter``,
  cpp/adapters/torch), a separate extension module compiled against the installed torch's C++ API
  on first use and cached per torch build (``_adapter_build``, docs/install.md). Without it (no
  compiler, ``TRIPWIRE_TORCH_ADAPTER=0``), through the Python readers below, which count as user
  code (slower, and the fast pass skips such guards). ``GuardSet.explain()`` names the path each
  guard takes; ``adapter_status()`` says why the adapter is or is not in use.
* numpy arrays: from the array struct (its fields declared by tripwire for numpy 1.x and 2.x, no
  numpy headers at build time), after ``ensure_numpy`` checked the layout against numpy's own
  attributes; else through ``_read_array``, after one warning that says why.

The expectations (``TensorExpectation``, ``ArrayExpectation``, ``DimensionMarkings``) are plain data:
integers, tuples and strings; only the exact type is an object, referenced by identity.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import tripwire._core as _core

from . import _adapter_build
from .errors import GuardBuildError

__all__ = [
    "ANY_DIM",
    "ArrayExpectation",
    "DimensionMarkings",
    "TensorExpectation",
    "adapter_status",
    "array_path",
    "describe_dtype",
    "dtype_name",
    "ensure_numpy",
    "ensure_torch",
    "expect_array",
    "expect_markings",
    "expect_tensor",
    "is_array",
    "is_tensor",
    "torch_state_from_json",
    "torch_state_to_dict",
]

ANY_DIM = _core.ANY_DIM

# c10::ScalarType, in the order of torch 2.13's AT_FORALL_SCALAR_TYPES_WITH_COMPLEX_AND_QINTS (the codes
# torch itself stores in GlobalStateGuard's JSON). Used without the adapter, which reads the codes
# from torch.dtype objects (test_tensors.py pins the two together).
_SCALAR_TYPE_NAMES = (
    "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64", "complex32",
    "complex64", "complex128", "bool", "qint8", "quint8", "qint32", "bfloat16", "quint4x2",
    "quint2x4", "bits1x8", "bits2x4", "bits4x2", "bits8", "bits16", "float8_e5m2",
    "float8_e4m3fn", "float8_e5m2fnuz", "float8_e4m3fnuz", "uint16", "uint32", "uint64",
    "uint1", "uint2", "uint3", "uint4", "uint5", "uint6", "uint7",
    "int1", "int2", "int3", "int4", "int5", "int6", "int7",
    "float8_e8m0fnu", "float4_e2m1fn_x2",
)  # fmt: skip
# c10::DeviceType codes of at::autocast::_AUTOCAST_SUPPORTED_DEVICES in torch 2.13 (cpu, cuda, mtia,
# maia, xpu, ipu, hpu, xla, privateuse1, mps): GlobalStateGuard's JSON lists the devices in this
# order without naming them.
_AUTOCAST_DEVICE_TYPES = (0, 1, 19, 8, 12, 18, 15, 9, 20, 13)
DEVICE_TYPE_NAMES = {
    0: "cpu", 1: "cuda", 2: "mkldnn", 3: "opengl", 4: "opencl", 5: "ideep", 6: "hip", 7: "fpga",
    8: "maia", 9: "xla", 10: "vulkan", 11: "metal", 12: "xpu", 13: "mps", 14: "meta", 15: "hpu",
    16: "ve", 17: "lazy", 18: "ipu", 19: "mtia", 20: "privateuseone",
}  # fmt: skip
_TORCH_STATE_FIELDS = _core.TORCH_STATE_FIELDS  # core::torch_state's header, by torch's JSON names
_N_HEADER = len(_TORCH_STATE_FIELDS)
_TORCH_STATE_BOOLS = (
    "grad_mode", "torch_function", "torch_function_all_disabled", "deterministic_algorithms",
    "deterministic_algorithms_warn_only", "allow_tf32", "autocast_cache_enabled",
)  # fmt: skip

_lock = threading.RLock()
_torch_status: str | None = None  # None: not initialized
_torch_loading = False  # ensure_torch is building or loading the adapter (on the thread holding _lock)
_numpy_status: str | None = None


# -- switching support on --------------------------------------------------------------------------
# The torch versions whose nn.Module.__getattr__ body was read and found to be: look the name up in
# the instance dict's `_parameters`, `_buffers` and `_modules`, in order, else raise AttributeError
# formatted from `type(self).__name__` (the claim register_dict_getattr makes).
_MODULE_GETATTR_VERIFIED = ("2.13.",)


def ensure_torch() -> bool:
    """Switch on tripwire's torch support if torch is imported; returns whether it is.

    Registers the Python readers (the path without the adapter), then loads the compiled adapter
    for this torch: built on first use and cached (``_adapter_build``; one RuntimeWarning saying
    why and how to fix it when it cannot be had), and makes torch's value-like objects
    (``torch.dtype``, ``torch.device``, ``torch.Size``, ``torch.layout``, ``torch.memory_format``)
    EQUALS_MATCH constants. Never imports torch itself.
    """
    global _torch_status, _torch_loading
    if _torch_status is not None:  # set once, after torch was imported (every GuardSet asks)
        return True
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "_C"):
        return False
    with _lock:
        if _torch_status is not None:
            return True
        if _torch_loading:
            # Re-entered on this thread while the adapter builds or loads (a __del__ or a weakref
            # callback run by a collection, a signal handler): the Python readers are registered
            # already, and starting a second build here would wait on our own file lock.
            return True
        _find_mode_flag(torch)  # no adapter yet: registers the Python keys' bits (fail closed meanwhile)
        _core._set_python_readers(
            _read_tensor,
            None,
            _read_torch_state,
            _read_mode_stack,
            _read_default_device,
            _read_saved_tensors_hooks,
            _read_dual_level,
        )
        warning = None
        _torch_loading = True
        try:
            _torch_adapter: Any = _adapter_build.load(torch)
        except _adapter_build.AdapterDisabled as e:
            status = f"python readers ({e})"  # the user's choice: no warning
        except _adapter_build.AdapterUnavailable as e:
            status = f"python readers ({e})"
            warning = _adapter_build.unavailable_warning(str(e))
        else:
            try:
                _core._install_torch_adapter(_torch_adapter.table, torch.__version__)
                status = f"torch adapter (compiled against torch {_torch_adapter.torch_version})"
            except ImportError as e:
                status = f"python readers ({e})"
                warning = _adapter_build.unavailable_warning(str(e))
        finally:
            _torch_loading = False
        mode_flag = _find_mode_flag(torch)  # the adapter's getter, verified
        if not _core.torch_adapter_installed():
            # The adapter registers these with C comparisons; without it: torch.dtype objects are
            # singletons, torch.Size is a tuple of ints, and torch.device's own (static C type)
            # comparison compares its fields without running Python code.
            _core.register_constant_type(torch.dtype, "identity")
            _core.register_constant_type(torch.Size, "tuple")
            _core.register_constant_type(torch.device, "richcompare")
        if _core.torch_adapter_installed():
            # SHAPE symbols on sizes, strides and storage offsets of these exact types are read by
            # the adapter (their methods checked to be torch's own; runtime/tensors/property_reader.hpp).
            _core._set_plain_tensor_types((torch.Tensor, torch.nn.Parameter))
        _core.register_constant_type(torch.layout, "identity")
        _core.register_constant_type(torch.memory_format, "identity")
        module = getattr(getattr(torch, "nn", None), "Module", None)
        if torch.__version__.startswith(_MODULE_GETATTR_VERIFIED) and module is not None:
            # `not hasattr(module, name)` (torch's NO_HASATTR) decided without calling
            # nn.Module.__getattr__ when its dicts lack the name (runtime/eval/dict_getattr.hpp).
            _core.register_dict_getattr(module.__getattr__, ("_parameters", "_buffers", "_modules"))
        if not mode_flag:
            status += (
                "; torch's per-thread dispatch-mode flag was not found: TENSOR_MATCH and"
                " DISPATCH_KEY_SET_MATCH fail closed on key sets with a Python key"
            )
        _torch_status = status
    if warning is not None:  # once: the status is set, so no later call gets here
        warnings.warn(warning, RuntimeWarning, stacklevel=2)
    return True


def ensure_numpy() -> bool:
    """Switch on tripwire's numpy support if numpy is imported; returns whether it is.

    Arrays are read from their struct (its fields declared in cpp/runtime/tensors/numpy_struct.cpp
    for numpy 1.x and 2.x) once what the struct reader sees on probe arrays and dtypes matches
    numpy's own attributes; then simple numpy dtypes (numbers, bool, object, bytes, str) are also
    EQUALS_MATCH constants. Otherwise arrays are read through Python, after one RuntimeWarning that
    says why: never silently slow.
    """
    global _numpy_status
    if _numpy_status is not None:  # set once, after numpy was imported (every GuardSet asks)
        return True
    np = sys.modules.get("numpy")
    if np is None or not hasattr(np, "ndarray"):
        return False
    with _lock:
        if _numpy_status is not None:
            return True
        _core._set_python_readers(None, _read_array, None, None, None, None, None)
        version = str(getattr(np, "__version__", "?"))
        layout = _numpy_descr_layout(version)
        why = ""
        if layout is None:
            why = f"tripwire knows the dtype struct of numpy 1.x and 2.x, not of numpy {version}"
        elif not _numpy_layout_matches(np, layout):
            why = f"the array struct as tripwire reads it does not match numpy {version}'s own attributes"
        elif not _core._enable_numpy_struct(np.ndarray, np.dtype, layout):
            why = f"numpy {version}'s ndarray or dtype type is smaller than the fields tripwire reads"
        if why:
            _numpy_status = f"python reader ({why})"
            warnings.warn(
                f"tripwire: numpy arrays are read through Python (a Python call per ARRAY_MATCH check"
                f" instead of a struct read): {why}. Use numpy 1.x or 2.x, or report this numpy"
                " version to tripwire.",
                RuntimeWarning,
                stacklevel=2,
            )
        else:
            _core._register_numpy_dtype(np.dtype)
            _numpy_status = f"array struct (numpy {version})"
        return True


def adapter_status() -> str:
    """How tensors and torch's state are read: the torch adapter, or Python readers and why."""
    return _torch_status or "torch support not initialized (torch not imported yet)"


def array_path() -> str:
    """How numpy arrays are read: the array struct, or a Python reader and why."""
    return _numpy_status or "numpy support not initialized (numpy not imported yet)"


def ensure_for(value: Any) -> None:
    """Switch on the support a value needs (its type's module is torch or numpy)."""
    mod = getattr(type(value), "__module__", "") or ""
    if not isinstance(mod, str):
        return
    if mod.startswith("torch"):
        ensure_torch()
    elif mod.startswith("numpy"):
        ensure_numpy()


def is_tensor(value: Any) -> bool:
    """Whether ``type(value)`` derives from ``torch._C.TensorBase`` (the real type: a ``__class__``
    property is not consulted). False when torch is not imported."""
    torch = sys.modules.get("torch")
    base = getattr(getattr(torch, "_C", None), "TensorBase", None)
    return base is not None and issubclass(type(value), base)


def is_array(value: Any) -> bool:
    """Whether ``type(value)`` derives from ``numpy.ndarray``. False when numpy is not imported."""
    np = sys.modules.get("numpy")
    return np is not None and issubclass(type(value), np.ndarray)


def ndim_of(value: Any) -> int:
    """The rank of a tensor or array as the engine reads it (0 when it cannot be read)."""
    if is_tensor(value):
        ensure_torch()
        fields: Any = _core.read_tensor_fields(value, _core.torch_adapter_installed())
        return 0 if fields is None else len(fields[4])
    if is_array(value):
        ensure_numpy()
        fields = _core.read_array_fields(value, _core.numpy_struct_enabled())
        return 0 if fields is None else int(fields[0])
    return 0


# -- dtype codes and names -------------------------------------------------------------------------
_dtype_codes: dict[Any, int] = {}


def dtype_code(dtype: Any) -> int:
    """The c10::ScalarType of a torch.dtype: through the adapter, or the name table."""
    if _core.torch_adapter_installed():
        return _core.dtype_code(dtype)
    if not _dtype_codes:
        torch = sys.modules["torch"]
        for code, name in enumerate(_SCALAR_TYPE_NAMES):
            d = getattr(torch, name, None)
            if type(d) is torch.dtype:
                _dtype_codes[d] = code
    found = _dtype_codes.get(dtype)
    if found is None:
        raise GuardBuildError(f"tripwire does not know the scalar type of {dtype!r}")
    return found


def dtype_name(code: int) -> str:
    """``float32`` for c10::ScalarType 6."""
    return _SCALAR_TYPE_NAMES[code] if 0 <= code < len(_SCALAR_TYPE_NAMES) else f"scalar_type({code})"


def dispatch_key_names(bits: int) -> str:
    """``DispatchKeySet(CPU, ADInplaceOrView, AutogradCPU)`` for raw bits (torch's own printing)."""
    torch = sys.modules.get("torch")
    try:
        return str(torch._C.DispatchKeySet.from_raw_repr(bits))  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - messages must not raise
        return f"DispatchKeySet(raw={bits:#x})"


# -- the Python readers (the engine's path without the adapter / the array struct) -----------------
def _mask_python_keys() -> bool | None:
    """Whether torch's guards mask the Python dispatch keys now, on this thread: unless a dispatch
    mode without ignore_compile_internals is active (torch/csrc/dynamo/guards.h
    LocalState::apply). torch reads a C++ thread-local flag; the core reads that same flag through
    torch's hidden getter, which the adapter finds (cpp/runtime/tensors/mode_flag.hpp) and which
    then serves the Python readers too. None when the getter was not found (no adapter, a stripped
    library): callers then fail a key set with a Python key closed. The module global the modes
    set the flag from is never read: it is shared by all threads."""
    return _core._masks_python_keys()


def _find_mode_flag(torch: Any) -> bool:
    """Verify the torch adapter's getter of torch's per-thread mode flag (whether it is verified;
    once it is, later calls only register the bits). The Python keys' bits are registered even
    when it is not, so that a key set carrying one fails closed."""
    C = torch._C
    bits = 0
    for name in ("Python", "PythonTLSSnapshot", "PythonDispatcher"):
        key = getattr(C.DispatchKey, name, None)
        if key is not None:
            bits |= C.DispatchKeySet(key).raw_repr()
    try:
        setter = C._dynamo.guards.set_is_in_mode_without_ignore_compile_internals
    except Exception:  # noqa: BLE001 - another torch: no flag, every Python-key set fails closed
        setter = None
    return _core._find_torch_mode_flag(setter, bits)


# torch's C-level accessors for _read_tensor, bound once (torch is imported before any tensor
# reaches a reader): no module attribute is looked up per tensor. Each is TensorBase's own
# descriptor or method, called on the tensor directly: never a subclass's Python override.
_t_bound = False
_t_tensor: Any = None  # torch.Tensor
_t_parameter: Any = None  # torch.nn.Parameter
_t_mode_enabled: Any = None
_t_disable: Any = None
_t_keys: Any = None
_t_include: Any = None
_t_exclude: Any = None
_t_dtype: Any = None
_t_device: Any = None
_t_requires_grad: Any = None
_t_layout: Any = None
_t_strided: Any = None
_t_size: Any = None
_t_stride: Any = None
_t_offset: Any = None
# torch.dtype -> c10::ScalarType code, filled by dtype_code's answers: dtypes are immortal
# singletons and a dtype's code never changes.
_t_codes: dict[Any, int] = {}
# (keys, TLS include, TLS exclude) as raw bits -> (keys | include) - exclude as raw bits, computed
# by torch's own DispatchKeySet operators the first time those three values are seen: a pure
# function of them, and reading three raw_repr()s costs far less than two pybind11 operators that
# each allocate a DispatchKeySet. Bounded: cleared when full (a process sees few distinct triples).
_t_key_memo: dict[tuple[int, int, int], int] = {}
_T_KEY_MEMO_MAX = 256


def _bind_tensor_readers() -> None:
    global _t_bound, _t_tensor, _t_parameter, _t_mode_enabled, _t_disable, _t_keys, _t_include, _t_exclude
    global _t_dtype, _t_device, _t_requires_grad, _t_layout, _t_strided, _t_size, _t_stride, _t_offset
    torch = sys.modules["torch"]
    C = torch._C
    base = C.TensorBase
    _t_tensor, _t_parameter = torch.Tensor, torch.nn.Parameter
    _t_mode_enabled = C._is_torch_function_mode_enabled
    _t_disable = C.DisableTorchFunction
    _t_keys = C._dispatch_keys
    _t_include = C._dispatch_tls_local_include_set
    _t_exclude = C._dispatch_tls_local_exclude_set
    _t_dtype = base.dtype.__get__
    _t_device = base.get_device  # device.index, -1 for None: both read TensorImpl::device()
    _t_requires_grad = base.requires_grad.__get__
    _t_layout = base.layout.__get__
    _t_strided = torch.strided
    _t_size = base.size
    _t_stride = base.stride
    _t_offset = base.storage_offset
    _t_bound = True


def _read_tensor(t: Any) -> tuple | None:
    """TENSOR_MATCH's fields, read through torch's C-level descriptors (never a subclass's Python
    overrides) with torch functions disabled: (dispatch_keys, dtype, device_index, requires_grad,
    sizes, strides or None, storage_offset); None when torch cannot read them. The keys have the
    thread-local include/exclude sets applied, not the Python-key mask: the engine applies that by
    torch's own flag (tensor_kinds.cpp, the same as on the adapter's path).

    torch dispatches these reads to ``__torch_function__`` only for a type other than Tensor and
    Parameter, or under a torch-function mode (``check_has_torch_function``): a plain tensor with
    no mode active is read without entering DisableTorchFunction, with the same answers. Sizes
    and strides are torch's own tuples (torch.Size, tuple), handed over uncopied."""
    if not _t_bound:
        _bind_tensor_readers()
    try:
        tp = type(t)  # by identity: a metaclass's __eq__ is not asked
        if (tp is _t_tensor or tp is _t_parameter) and not _t_mode_enabled():
            return _tensor_fields(t)
        with _t_disable():
            return _tensor_fields(t)
    except GuardBuildError:  # a dtype tripwire has no code for (dtype_code): says which
        raise
    except Exception:  # noqa: BLE001 - an undefined or unreadable tensor: the guard fails
        return None


def _tensor_fields(t: Any) -> tuple:
    k, inc, exc = _t_keys(t), _t_include(), _t_exclude()
    raw = (k.raw_repr(), inc.raw_repr(), exc.raw_repr())
    keys = _t_key_memo.get(raw)
    if keys is None:
        keys = ((k | inc) - exc).raw_repr()
        if len(_t_key_memo) >= _T_KEY_MEMO_MAX:
            _t_key_memo.clear()
        _t_key_memo[raw] = keys
    dtype = _t_dtype(t)
    code = _t_codes.get(dtype)
    if code is None:
        code = _t_codes[dtype] = dtype_code(dtype)
    if _t_layout(t) is _t_strided:  # layouts are singletons, compared by identity in torch too
        return (keys, code, _t_device(t), _t_requires_grad(t), _t_size(t), _t_stride(t), _t_offset(t))
    return (keys, code, _t_device(t), _t_requires_grad(t), _t_size(t), None, 0)


def torch_state_from_json(state: dict | str) -> tuple[int, ...]:
    """torch's GlobalStateGuard snapshot (its ``__getstate__()`` JSON, or the parsed dict) as
    GLOBAL_STATE's plain data (core::torch_state's layout)."""
    d = json.loads(state) if isinstance(state, str) else dict(state)
    autocast = d["autocast_state"]
    enabled, dtypes = list(autocast["enabled"]), list(autocast["dtype"])
    if len(enabled) != len(_AUTOCAST_DEVICE_TYPES) or len(dtypes) != len(enabled):
        raise GuardBuildError(
            f"torch's global state lists {len(enabled)} autocast devices; tripwire knows torch 2.13's "
            f"{len(_AUTOCAST_DEVICE_TYPES)}"
        )
    header = {
        **{k: int(d[k]) for k in _TORCH_STATE_FIELDS if k in d},
        "autocast_cache_enabled": int(autocast["cached_enabled"]),
        "autocast_devices": len(enabled),
    }
    missing = [k for k in _TORCH_STATE_FIELDS if k not in header]
    if missing:
        raise GuardBuildError(f"torch's global state lacks {missing}")
    return (
        *(header[k] for k in _TORCH_STATE_FIELDS),
        *_AUTOCAST_DEVICE_TYPES,
        *(int(bool(e)) for e in enabled),
        *(int(x) for x in dtypes),
    )


def torch_state_to_dict(state: tuple[int, ...]) -> dict[str, Any]:
    """GLOBAL_STATE's torch snapshot as a readable dict: torch's field names, dtypes by name, the
    autocast state per device name."""
    out: dict[str, Any] = dict(zip(_TORCH_STATE_FIELDS, state[:_N_HEADER], strict=True))
    for flag in _TORCH_STATE_BOOLS:
        out[flag] = bool(out[flag])
    out["default_dtype"] = dtype_name(out["default_dtype"])
    n = out.pop("autocast_devices")
    rest = state[_N_HEADER:]
    for i in range(n):
        name = DEVICE_TYPE_NAMES.get(rest[i], f"device_type({rest[i]})")
        out[f"autocast({name})"] = (bool(rest[n + i]), dtype_name(rest[2 * n + i]))
    return out


def _read_torch_state() -> tuple[int, ...]:
    """torch's global state as GLOBAL_STATE compares it, from torch's own GlobalStateGuard."""
    torch = sys.modules["torch"]
    return torch_state_from_json(torch._C._dynamo.guards.GlobalStateGuard().__getstate__())


def _read_mode_stack() -> tuple[type, ...]:
    """The types of the modes on torch's torch-function mode stack, bottom first."""
    C = sys.modules["torch"]._C
    return tuple(type(C._get_function_stack_at(i)) for i in range(C._len_torch_function_stack()))


def _read_default_device() -> Any:
    """``torch.utils._device.CURRENT_DEVICE``: None, its str for a torch.device, else a marker
    that matches no snapshot."""
    torch = sys.modules["torch"]
    device_module = sys.modules.get("torch.utils._device")
    cur = None if device_module is None else device_module.__dict__.get("CURRENT_DEVICE")
    if cur is None:
        return None
    return str(cur) if type(cur) is torch.device else ("not a device", type(cur))


def _read_saved_tensors_hooks() -> tuple[int, int] | None:
    """The top of torch's saved-tensor default hooks stack as Dynamo's
    AUTOGRAD_SAVED_TENSORS_HOOKS guard reads it: None unless both hooks are torch.fx.GraphModule
    instances (torch inlines only those), else their ids."""
    torch = sys.modules["torch"]
    hooks = torch._C._autograd._top_saved_tensors_default_hooks(True)
    if not hooks:
        return None
    pack, unpack = hooks
    gm = torch.fx.GraphModule
    if isinstance(pack, gm) and isinstance(unpack, gm):
        return (id(pack), id(unpack))
    return None


def _read_dual_level() -> Any:
    """torch.autograd.forward_ad._current_level as Dynamo's DUAL_LEVEL_MATCH reads it (getattr
    on the module): the int, ("not an int", type) for another object, ("unreadable",) when
    getattr raised. Only an int can equal a snapshot."""
    import importlib

    module = importlib.import_module("torch.autograd.forward_ad")
    try:
        level = module._current_level
    except Exception:  # noqa: BLE001 - torch's guard fails on any exception; so does the probe
        return ("unreadable",)
    return level if type(level) is int else ("not an int", type(level))


# ndarray's own descriptors for _read_array, bound once (numpy is imported before any array
# reaches the reader): never a subclass's overrides, no attribute lookup per array.
_a_getters: tuple[Any, ...] | None = None


def _read_array(a: Any) -> tuple | None:
    """ARRAY_MATCH's fields through ndarray's own descriptors: (ndim, shape, strides, C-contiguous,
    F-contiguous, aligned, writeable, dtype); None when numpy cannot read them."""
    global _a_getters
    if _a_getters is None:
        nd = sys.modules["numpy"].ndarray
        _a_getters = (
            nd.ndim.__get__,
            nd.shape.__get__,
            nd.strides.__get__,
            nd.flags.__get__,
            nd.dtype.__get__,
        )
    ndim, shape, strides, flags, dtype = _a_getters
    try:
        f = flags(a)
        return (
            ndim(a),
            shape(a),
            strides(a),
            f.c_contiguous,
            f.f_contiguous,
            f.aligned,
            f.writeable,
            dtype(a),
        )
    except Exception:  # noqa: BLE001
        return None


def _numpy_descr_layout(version: str) -> int | None:
    """PyArray_Descr's layout for a numpy version (readers.hpp NumpyDescrLayout): 1 for numpy 1.x,
    2 for 2.x, None for any other (unknown: not read)."""
    major = version.split(".", 1)[0]
    return {"1": 1, "2": 2}.get(major)


def _numpy_layout_matches(np: Any, layout: int) -> bool:
    """Whether the struct reader sees, on probe arrays and their dtypes, exactly what numpy's own
    attributes say: every flag bit both ways (views, negative and zero strides, Fortran order,
    0-d, zero-size, read-only, unaligned) and the dtype fields it reads (type number, kind, type
    char, byte order, item size) over dtypes of every size and both byte orders."""
    base = np.arange(24, dtype=np.float64).reshape(2, 3, 4)
    ro = np.zeros(3, dtype="U5")
    ro.flags.writeable = False
    probes = [
        base,
        base.transpose(2, 0, 1),
        base[:, ::-1, 1:3],
        np.asfortranarray(base),
        np.array(1.5, dtype=np.float32),  # 0-d
        ro,
        np.zeros((0, 5), dtype=">i2"),
        np.broadcast_to(np.arange(3), (4, 3)),
        np.frombuffer(b"\x00" * 9, dtype=np.int32, count=2, offset=1),  # unaligned, read-only
    ]
    for d in ("?", "i1", "u1", "<i2", ">u4", "<i8", ">f8", "f2", "c16", "g", "S3", ">U7", "O",
              "M8[ns]", "m8[s]", [("x", "<i4"), ("y", "S5")], ("f4", (2, 3))):  # fmt: skip
        probes.append(np.zeros(2, dtype=d))
    native = "<" if sys.byteorder == "little" else ">"
    for a in probes:
        got: Any = _core._numpy_struct_probe(a, np.ndarray, np.dtype, layout)
        fields = _read_array(a)
        if got is None or fields is None:
            return False
        dt = fields[7]
        order = native if dt.byteorder == "=" else dt.byteorder
        want = (*fields, dt.itemsize, dt.num, dt.kind, dt.char, order)
        if got[:7] != want[:7] or got[7] is not want[7] or got[8:12] != want[8:12]:
            return False
        if (native if got[12] == "=" else got[12]) != want[12]:
            return False
    return True


# -- expectations -----------------------------------------------------------------------------------
def _dims(dynamic: Iterable[int] | bool, ndim: int, what: str) -> frozenset[int]:
    if dynamic is True:
        return frozenset(range(ndim))
    if dynamic is False:
        return frozenset()
    out = set()
    for d in dynamic:
        if type(d) is not int or not -ndim <= d < ndim:
            raise GuardBuildError(f"{what}: dimension {d!r} is out of range for ndim {ndim}")
        out.add(d % ndim)
    return frozenset(out)


def _dependent_strides(sizes: tuple[int, ...], strides: tuple[int, ...], dyn: frozenset[int]) -> set[int]:
    """Dimensions whose stride is left unchecked: those a dynamic dimension lies inside of in
    memory (its stride is smaller, or equal with a later index, C order breaking ties), since in a
    dense layout such a stride is a product that includes the dynamic size. A broadcast dimension
    (stride 0) is inside nothing."""
    out = set()
    for j in range(len(sizes)):
        for i in dyn:
            if i == j or strides[i] == 0:
                continue
            si, sj = abs(strides[i]), abs(strides[j])
            if si < sj or (si == sj and i > j):
                out.add(j)
                break
    return out


def _check_dims(kind: str, sizes: tuple, strides: tuple) -> None:
    """An expectation's sizes and strides fit the engine's layout (one stride per size, at most
    MAX_DIMS): GuardBuildError naming ``kind`` otherwise."""
    if len(sizes) != len(strides):
        raise GuardBuildError(f"{kind}: sizes and strides must have the same length")
    if len(sizes) > _core.MAX_DIMS:
        raise GuardBuildError(f"{kind}: more than {_core.MAX_DIMS} dimensions")


@dataclass(frozen=True)
class TensorExpectation:
    """What TENSOR_MATCH expects of a torch tensor besides its exact type: plain data.

    ``dispatch_keys`` is the raw DispatchKeySet with the thread-local include set added, the
    exclude set removed and the Python keys masked, as of build time (torch's TensorCheck
    ``dispatch_key_``); it carries the device type, conjugate/negative views, inference mode and
    the autograd keys. ``dtype`` is a c10::ScalarType code. A None size or stride is not checked;
    ``storage_offset`` None is not checked (torch's default). ``device`` is for messages only.
    """

    dispatch_keys: int
    dtype: int
    device_index: int
    requires_grad: bool
    sizes: tuple[int | None, ...]
    strides: tuple[int | None, ...]
    storage_offset: int | None = None
    device: str = field(default="", compare=False)  # for messages only: not saved by to_bytes

    def __post_init__(self) -> None:
        _check_dims("TENSOR_MATCH", self.sizes, self.strides)

    @property
    def ndim(self) -> int:
        return len(self.sizes)

    def to_data(self) -> list[int]:
        """core::tensor_data's layout."""
        any_ = ANY_DIM
        data = [
            self.dispatch_keys - (1 << 64) if self.dispatch_keys >= (1 << 63) else self.dispatch_keys,
            self.dtype,
            self.device_index,
            int(self.requires_grad),
            self.ndim,
            any_ if self.storage_offset is None else self.storage_offset,
        ]
        for size, stride in zip(self.sizes, self.strides, strict=True):
            data += [any_ if size is None else size, any_ if stride is None else stride]
        return data

    @classmethod
    def from_data(cls, data: Sequence[int]) -> TensorExpectation:
        """The inverse of ``to_data`` (a loaded guard); ValueError on a malformed layout."""
        if len(data) < 6 or data[4] < 0 or len(data) != 6 + 2 * data[4]:
            raise ValueError("TENSOR_MATCH data does not have core::tensor_data's layout")
        pairs = data[6:]
        return cls(
            data[0] & ((1 << 64) - 1),
            data[1],
            data[2],
            bool(data[3]),
            tuple(None if x == ANY_DIM else x for x in pairs[0::2]),
            tuple(None if x == ANY_DIM else x for x in pairs[1::2]),
            None if data[5] == ANY_DIM else data[5],
        )

    def describe(self) -> str:
        """``float32[4, 8] stride=[8, 1] cpu requires_grad=False`` (None for a dynamic dim)."""

        def dims(xs: tuple[int | None, ...]) -> str:
            return "[" + ", ".join("*" if x is None else str(x) for x in xs) + "]"

        out = f"{dtype_name(self.dtype)}{dims(self.sizes)} stride={dims(self.strides)}"
        if self.device:
            out += f" {self.device}"
        out += f" requires_grad={self.requires_grad}"
        if self.storage_offset is not None:
            out += f" storage_offset={self.storage_offset}"
        return out


def expect_tensor(
    value: Any, *, dynamic: Iterable[int] | bool = (), storage_offset: bool = False
) -> TensorExpectation:
    """The expectation of TENSOR_MATCH for example tensor ``value``, read as the engine reads it.

    ``dynamic``: dimensions whose size is not checked (True: all); a stride is then unchecked when
    a dynamic dimension lies inside it (``_dependent_strides``). ``storage_offset``: check it.
    """
    ensure_torch()
    fields: Any = _core.read_tensor_fields(value, _core.torch_adapter_installed())
    if fields is None:
        raise GuardBuildError(f"TENSOR_MATCH: cannot read the tensor fields of a {type(value).__name__}")
    keys, dtype, index, requires_grad, sizes, strides, offset = fields
    dyn = _dims(dynamic, len(sizes), "TENSOR_MATCH")
    if strides is None:  # sparse and other layouts without strides: torch skips them
        exp_strides: tuple[int | None, ...] = (None,) * len(sizes)
    else:
        dep = _dependent_strides(sizes, strides, dyn)
        exp_strides = tuple(None if j in dep else s for j, s in enumerate(strides))
    device = ""
    with contextlib.suppress(Exception):  # for messages only
        device = str(sys.modules["torch"]._C.TensorBase.device.__get__(value))
    return TensorExpectation(
        keys,
        dtype,
        index,
        requires_grad,
        tuple(None if i in dyn else s for i, s in enumerate(sizes)),
        exp_strides,
        offset if storage_offset else None,
        device,
    )


def describe_dtype(dtype: Any) -> Any:
    """A numpy dtype as plain data numpy.dtype() rebuilds: its ``str`` ('<f4', '<U5'), or its
    ``descr`` as a tuple for a structured dtype. Other dtypes (aligned structs, subarrays,
    StringDType) are kept as the dtype object itself (not plain data: a future codec refuses them)."""
    np = sys.modules["numpy"]
    candidates: list[Any] = []
    if dtype.fields is None and dtype.subdtype is None:
        candidates.append(dtype.str)
    if dtype.fields is not None:
        candidates.append(tuple(tuple(x) for x in dtype.descr))
    for desc in candidates:
        try:
            back = np.dtype(list(desc) if isinstance(desc, tuple) else desc)
        except Exception:  # noqa: BLE001
            continue
        if type(back) is type(dtype) and back == dtype:
            return desc
    return dtype


@dataclass(frozen=True)
class ArrayExpectation:
    """What ARRAY_MATCH expects of a numpy array besides its exact type: plain data.

    ``dtype`` is the dtype's description (``describe_dtype``), compared as EQUALS_MATCH compares
    dtypes (same dtype class and numpy's ==). A None size or stride (bytes) is not checked. The
    array must have each of C/F contiguity and alignment that is True here, and ``writeable`` as
    given.
    """

    dtype: Any
    sizes: tuple[int | None, ...]
    strides: tuple[int | None, ...]
    c_contiguous: bool
    f_contiguous: bool
    aligned: bool
    writeable: bool

    def __post_init__(self) -> None:
        _check_dims("ARRAY_MATCH", self.sizes, self.strides)

    @property
    def ndim(self) -> int:
        return len(self.sizes)

    def to_data(self) -> list[int]:
        """core::array_data's layout."""
        flags = (1 if self.c_contiguous else 0) | (2 if self.f_contiguous else 0) | (4 if self.aligned else 0)
        data = [self.ndim, flags, int(self.writeable)]
        for size, stride in zip(self.sizes, self.strides, strict=True):
            data += [ANY_DIM if size is None else size, ANY_DIM if stride is None else stride]
        return data

    @classmethod
    def from_data(cls, dtype: Any, data: Sequence[int]) -> ArrayExpectation:
        """The inverse of ``to_data`` (a loaded guard); ValueError on a malformed layout."""
        if len(data) < 3 or data[0] < 0 or len(data) != 3 + 2 * data[0] or not 0 <= data[1] <= 7:
            raise ValueError("ARRAY_MATCH data does not have core::array_data's layout")
        pairs = data[3:]
        return cls(
            dtype,
            tuple(None if x == ANY_DIM else x for x in pairs[0::2]),
            tuple(None if x == ANY_DIM else x for x in pairs[1::2]),
            bool(data[1] & 1),
            bool(data[1] & 2),
            bool(data[1] & 4),
            bool(data[2]),
        )

    def describe(self) -> str:
        def dims(xs: tuple[int | None, ...]) -> str:
            return (
                "("
                + ", ".join("*" if x is None else str(x) for x in xs)
                + ("," if len(xs) == 1 else "")
                + ")"
            )

        flags = [
            n for n, f in (("C", self.c_contiguous), ("F", self.f_contiguous), ("aligned", self.aligned)) if f
        ]
        flags.append("writeable" if self.writeable else "read-only")
        return f"{self.dtype}{dims(self.sizes)} strides={dims(self.strides)} {'+'.join(flags)}"


def expect_array(value: Any, *, dynamic: Iterable[int] | bool = ()) -> ArrayExpectation:
    """The expectation of ARRAY_MATCH for example array ``value``, read as the engine reads it."""
    ensure_numpy()
    fields: Any = _core.read_array_fields(value, _core.numpy_struct_enabled())
    if fields is None:
        raise GuardBuildError(f"ARRAY_MATCH: cannot read the array fields of a {type(value).__name__}")
    ndim, sizes, strides, c, f, aligned, writeable, dtype = fields
    dyn = _dims(dynamic, ndim, "ARRAY_MATCH")
    dep = _dependent_strides(sizes, strides, dyn)
    return ArrayExpectation(
        describe_dtype(dtype),
        tuple(None if i in dyn else s for i, s in enumerate(sizes)),
        tuple(None if j in dep else s for j, s in enumerate(strides)),
        c,
        f,
        aligned,
        writeable,
    )


_MARKING_ATTRS: tuple[str, ...] = _core.MARKING_ATTRS
_MARKING_GATE = "_dynamo_unbacked_indices"
_MARKING_DEPENDENT = ("_dynamo_shape_ids", "_dynamo_unbacked_bounds")


@dataclass(frozen=True)
class DimensionMarkings:
    """What DIMENSION_MARKING expects (torch's DIMENSION_DYNAMIC_MARKING_GUARD): per marking
    attribute (``_dynamo_dynamic_indices``, ``_dynamo_weak_dynamic_indices``,
    ``_dynamo_unbacked_indices``, ``_dynamo_strict_unbacked_indices``, ``_dynamo_static_indices``)
    the set it held at build time, or None when absent; and, when ``_dynamo_unbacked_indices`` was
    present (``dependent``), the expected ``_dynamo_shape_ids`` and ``_dynamo_unbacked_bounds``."""

    attrs: tuple[frozenset[int] | None, ...]
    dependent: bool = False
    shape_ids: Any = None
    unbacked_bounds: Any = None

    def __post_init__(self) -> None:
        if len(self.attrs) != len(_MARKING_ATTRS):
            raise GuardBuildError(f"DIMENSION_MARKING needs one entry per attribute {_MARKING_ATTRS}")

    def to_data(self) -> list[int]:
        data: list[int] = []
        for s in self.attrs:
            if s is None:
                data.append(-1)
            else:
                dims = sorted(s)
                data += [len(dims), *dims]
        return data

    @classmethod
    def from_data(
        cls, data: Sequence[int], dependent: bool, shape_ids: Any, unbacked_bounds: Any
    ) -> DimensionMarkings:
        """The inverse of ``to_data`` (a loaded guard); ValueError on a malformed layout."""
        attrs: list[frozenset[int] | None] = []
        i = 0
        for _ in _MARKING_ATTRS:
            if i >= len(data) or data[i] < -1 or i + 1 + max(data[i], 0) > len(data):
                raise ValueError("DIMENSION_MARKING data does not have core::marking_data's layout")
            n = data[i]
            attrs.append(None if n < 0 else frozenset(data[i + 1 : i + 1 + n]))
            i += 1 + max(n, 0)
        if i != len(data):
            raise ValueError("DIMENSION_MARKING data has trailing entries")
        if not dependent:
            return cls(tuple(attrs))
        return cls(tuple(attrs), True, shape_ids, unbacked_bounds)

    def describe(self) -> str:
        parts = [
            f"{n}={set(s) if s else '{}'}"
            for n, s in zip(_MARKING_ATTRS, self.attrs, strict=True)
            if s is not None
        ]
        if self.dependent:
            parts.append(
                f"_dynamo_shape_ids={self.shape_ids!r}, _dynamo_unbacked_bounds={self.unbacked_bounds!r}"
            )
        return "markings " + (", ".join(parts) if parts else "none")


def expect_markings(value: Any) -> DimensionMarkings:
    """The dimension markings ``value`` carries now (getattr, as torch reads them)."""
    attrs: list[frozenset[int] | None] = []
    for name in _MARKING_ATTRS:
        if not hasattr(value, name):
            attrs.append(None)
            continue
        dims = getattr(value, name)
        try:
            items = frozenset(dims)
        except TypeError:
            raise GuardBuildError(f"DIMENSION_MARKING: {name} is not a set of dimensions: {dims!r}") from None
        if any(type(d) is not int for d in items):
            raise GuardBuildError(f"DIMENSION_MARKING: {name} holds a non-int dimension: {dims!r}")
        attrs.append(items)
    if not hasattr(value, _MARKING_GATE):
        return DimensionMarkings(tuple(attrs))
    dep = [getattr(value, name, None) for name in _MARKING_DEPENDENT]
    for name, v in zip(_MARKING_DEPENDENT, dep, strict=True):
        if not _core.is_constant(v):
            raise GuardBuildError(f"DIMENSION_MARKING: {name} is not a constant: {v!r}")
    return DimensionMarkings(tuple(attrs), True, dep[0], dep[1])
