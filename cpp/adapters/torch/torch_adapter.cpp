// tripwire/cpp/adapters/torch/torch_adapter.cpp -- the optional torch adapter (tripwire._torch_adapter).
//
// Compiled against the installed torch's public C++ API and loaded at run time by the package
// (tripwire/tensors.py) after `import torch`; the core module never includes or links torch. It
// exports one PyCapsule holding the TwTorchAdapter table (cpp/runtime/tensors/adapter_abi.h): plain
// C functions that read a tensor's fields, torch's global state, the torch-function mode stack
// and torch.device objects without any Python call.
//
// Every function is noexcept at the boundary: torch's accessors may throw (strides() of a sparse
// tensor, sizes() of a nested one); the exception is caught here and reported as "could not read".
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/SavedTensorHooks.h>
#include <ATen/autocast_mode.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/PyInterpreter.h>
#include <torch/csrc/Size.h>
#include <torch/csrc/autograd/python_variable.h>

#include <array>
#include <cstring>
#include <string>

#include "runtime/tensors/adapter_abi.h"

#ifndef TRIPWIRE_TORCH_VERSION
#error "TRIPWIRE_TORCH_VERSION must name the torch version this adapter is compiled against"
#endif

namespace {

namespace ts_layout {
// core::torch_state's layout (cpp/core/kind_data.hpp); kept in step by test_tensors.py, which
// compares this adapter's reading with the Python reader's field by field.
constexpr int kGradMode = 0, kTorchFunction = 1, kTorchFunctionAllDisabled = 2, kDeterministic = 3,
              kWarnOnly = 4, kAllowTf32 = 5, kFp16 = 6, kBf16 = 7, kNumThreads = 8, kDefaultDtype = 9,
              kCacheEnabled = 10, kDevices = 11, kHeader = 12;
}  // namespace ts_layout

// The Python keys torch's guards mask unless a dispatch mode without ignore_compile_internals is
// active (torch/csrc/dynamo/guards.h, LocalState::apply).
const c10::DispatchKeySet kPythonKeys({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot,
                                       c10::DispatchKey::PythonDispatcher});

c10::DispatchKeySet apply_local(c10::DispatchKeySet ks, int mask_python_keys) {
    const c10::impl::LocalDispatchKeySet local = c10::impl::tls_local_dispatch_key_set();
    // DispatchKeySet's own operators: `-` keeps the backend bits (a set difference on
    // functionality keys only), which plain bit operations would not.
    c10::DispatchKeySet out = (ks | local.included_) - local.excluded_;
    if (mask_python_keys) out = out - kPythonKeys;
    return out;
}

int read_tensor(PyObject* obj, int mask_python_keys, TwTensorMeta* out) noexcept {
    try {
        if (THPVariableClass == nullptr ||
            !PyType_IsSubtype(Py_TYPE(obj), reinterpret_cast<PyTypeObject*>(THPVariableClass)))
            return 0;
        const at::Tensor& t = THPVariable_Unpack(obj);
        if (!t.defined()) return 0;
        c10::TensorImpl* impl = t.unsafeGetTensorImpl();
        const c10::DispatchKeySet ks = impl->key_set();
        out->raw_dispatch_keys = ks.raw_repr();
        out->dispatch_keys = apply_local(ks, mask_python_keys).raw_repr();
        out->dtype = static_cast<int32_t>(impl->dtype().toScalarType());
        const c10::Device device = impl->device();
        out->device_type = static_cast<int32_t>(device.type());
        out->device_index = device.index();
        const c10::Layout layout = impl->layout();
        out->layout = static_cast<int32_t>(layout);
        out->requires_grad = impl->requires_grad() ? 1 : 0;
        out->ndim = impl->dim();
        out->sizes = impl->sizes().data();
        out->has_strides = layout == c10::kStrided ? 1 : 0;
        out->strides = out->has_strides ? impl->strides().data() : nullptr;
        out->storage_offset = layout == c10::kStrided ? impl->storage_offset() : 0;
        out->itemsize = static_cast<int64_t>(impl->dtype().itemsize());
        out->storage_data = nullptr;
        out->storage_nbytes = -1;
        if (layout == c10::kStrided && impl->has_storage()) {
            const c10::Storage& st = impl->unsafe_storage();
            out->storage_data = st.data();
            out->storage_nbytes = static_cast<int64_t>(st.nbytes());
        }
        return 1;
    } catch (...) {
        return -1;
    }
}

int tensor_fields(PyObject* obj, TwTensorFields* out) noexcept {
    try {
        const at::Tensor& t = THPVariable_Unpack(obj);
        if (!t.defined()) return 0;
        c10::TensorImpl* impl = t.unsafeGetTensorImpl();
        out->dispatch_keys = apply_local(impl->key_set(), 0).raw_repr();
        out->dtype = static_cast<int32_t>(impl->dtype().toScalarType());
        out->device_index = impl->device().index();
        out->requires_grad = impl->requires_grad() ? 1 : 0;
        out->ndim = impl->dim();
        out->sizes = impl->sizes().data();
        if (impl->layout() == c10::kStrided) {
            out->has_strides = 1;
            out->strides = impl->strides().data();
            out->storage_offset = impl->storage_offset();
        } else {
            out->has_strides = 0;
            out->strides = nullptr;
            out->storage_offset = 0;
        }
        return 1;
    } catch (...) {
        return 0;
    }
}

// TENSOR_MATCH in one call (the fast program's common case). The same fields and order as the
// core's tensor_equal on tensor_fields' reading; anything it does not decide (Python keys, a layout
// without strides, a difference) answers 0 and the core's full reader decides, naming the field.
int tensor_matches(PyObject* obj, const int64_t* want, TwKeyMemo* memo) noexcept {
    try {
        const at::Tensor& t = THPVariable_Unpack(obj);
        if (!t.defined()) return 0;
        c10::TensorImpl* impl = t.unsafeGetTensorImpl();
        const uint64_t raw = impl->key_set().raw_repr();
        uint64_t keys = memo->last_applied;
        if (memo->valid == 0 || raw != memo->last_raw) {
            if (memo->valid == 0) {
                // One read of the thread-locals per check (the caller clears the memo whenever
                // Python code may have run since).
                const c10::impl::LocalDispatchKeySet local = c10::impl::tls_local_dispatch_key_set();
                memo->included = local.included_.raw_repr();
                memo->excluded = local.excluded_.raw_repr();
                memo->valid = 1;
            }
            // DispatchKeySet's own operators, as apply_local: `-` keeps the backend bits.
            keys = ((c10::DispatchKeySet(c10::DispatchKeySet::RAW, raw) |
                     c10::DispatchKeySet(c10::DispatchKeySet::RAW, memo->included)) -
                    c10::DispatchKeySet(c10::DispatchKeySet::RAW, memo->excluded))
                       .raw_repr();
            memo->last_raw = raw;
            memo->last_applied = keys;
        }
        if (keys != static_cast<uint64_t>(want[TW_TENSOR_KEYS]) || (keys & kPythonKeys.raw_repr()) != 0)
            return 0;
        if (static_cast<int64_t>(impl->dtype().toScalarType()) != want[TW_TENSOR_DTYPE] ||
            impl->device().index() != want[TW_TENSOR_DEVICE_INDEX] ||
            (impl->requires_grad() ? 1 : 0) != want[TW_TENSOR_REQUIRES_GRAD])
            return 0;
        const int64_t ndim = impl->dim();
        if (ndim != want[TW_TENSOR_NDIM] || impl->layout() != c10::kStrided) return 0;
        const int64_t* sizes = impl->sizes().data();
        const int64_t* strides = impl->strides().data();
        const int64_t* pairs = want + TW_TENSOR_HEADER;
        for (int64_t i = 0; i < ndim; ++i) {
            const int64_t size = pairs[2 * i], stride = pairs[2 * i + 1];
            if ((size != TW_TENSOR_ANY && size != sizes[i]) ||
                (stride != TW_TENSOR_ANY && stride != strides[i]))
                return 0;
        }
        const int64_t offset = want[TW_TENSOR_STORAGE_OFFSET];
        return offset == TW_TENSOR_ANY || offset == impl->storage_offset() ? 1 : 0;
    } catch (...) {
        return 0;
    }
}

uint64_t apply_local_keys(uint64_t raw, int mask_python_keys) noexcept {
    return apply_local(c10::DispatchKeySet(c10::DispatchKeySet::RAW, raw), mask_python_keys).raw_repr();
}

// The autocast dispatch key of each autocast device: autocast is enabled on a device exactly when
// its key is not in the thread-local exclude set (at::autocast::is_autocast_enabled), so one read
// of the thread-local key sets answers for every device.
std::array<c10::DispatchKey, at::autocast::_AUTOCAST_SUPPORTED_DEVICES.size()> g_autocast_keys{};

int read_global_state(int64_t* out, int capacity, int all_dtypes) noexcept {
    namespace L = ts_layout;
    const auto& devices = at::autocast::_AUTOCAST_SUPPORTED_DEVICES;
    const int n = static_cast<int>(devices.size());
    if (capacity < L::kHeader + 3 * n) return -1;
    try {
        auto& ctx = at::globalContext();
        const auto tf = at::impl::PythonTorchFunctionTLS::get_disabled_state();
        out[L::kGradMode] = c10::GradMode::is_enabled() ? 1 : 0;
        out[L::kTorchFunction] = tf == at::impl::TorchFunctionDisabledState::ENABLED ? 1 : 0;
        out[L::kTorchFunctionAllDisabled] = tf == at::impl::TorchFunctionDisabledState::ALL_DISABLED ? 1 : 0;
        out[L::kDeterministic] = ctx.deterministicAlgorithms() ? 1 : 0;
        out[L::kWarnOnly] = ctx.deterministicAlgorithmsWarnOnly() ? 1 : 0;
        out[L::kAllowTf32] = ctx.float32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL) ==
                                     at::Float32Precision::TF32
                                 ? 1
                                 : 0;
        out[L::kFp16] = static_cast<int64_t>(ctx.allowFP16ReductionCuBLAS());
        out[L::kBf16] = static_cast<int64_t>(ctx.allowBF16ReductionCuBLAS());
        out[L::kNumThreads] = at::get_num_threads();
        out[L::kDefaultDtype] = static_cast<int64_t>(c10::get_default_dtype_as_scalartype());
        out[L::kCacheEnabled] = at::autocast::is_autocast_cache_enabled() ? 1 : 0;
        out[L::kDevices] = n;
        const c10::DispatchKeySet excluded = c10::impl::tls_local_dispatch_key_set().excluded_;
        for (int i = 0; i < n; ++i) {
            const bool enabled = !excluded.has(g_autocast_keys[i]);
            out[L::kHeader + i] = static_cast<int64_t>(devices[i]);
            out[L::kHeader + n + i] = enabled ? 1 : 0;
            out[L::kHeader + 2 * n + i] =
                enabled || all_dtypes ? static_cast<int64_t>(at::autocast::get_autocast_dtype(devices[i]))
                                      : -1;
        }
        return L::kHeader + 3 * n;
    } catch (...) {
        return -1;
    }
}

// The raw bits of the autocast keys of all autocast devices (every one excluded: all disabled).
uint64_t g_all_autocast_bits = 0;

int global_state_matches(const TwGlobalState* want) noexcept {
    namespace L = ts_layout;
    const auto& devices = at::autocast::_AUTOCAST_SUPPORTED_DEVICES;
    const int n = static_cast<int>(devices.size());
    if (want->n_devices != n || want->header[L::kDevices] != n) return 0;
    try {
        const int64_t* h = want->header;
        // Thread-local state first (cheap), then the process-wide context.
        if (h[L::kGradMode] != (c10::GradMode::is_enabled() ? 1 : 0)) return 0;
        const auto tf = at::impl::PythonTorchFunctionTLS::get_disabled_state();
        if (h[L::kTorchFunction] != (tf == at::impl::TorchFunctionDisabledState::ENABLED ? 1 : 0)) return 0;
        if (h[L::kTorchFunctionAllDisabled] !=
            (tf == at::impl::TorchFunctionDisabledState::ALL_DISABLED ? 1 : 0))
            return 0;
        if (h[L::kCacheEnabled] != (at::autocast::is_autocast_cache_enabled() ? 1 : 0)) return 0;
        const c10::DispatchKeySet excluded = c10::impl::tls_local_dispatch_key_set().excluded_;
        uint64_t enabled = 0;
        if ((excluded.raw_repr() & g_all_autocast_bits) != g_all_autocast_bits) {  // some device enabled
            for (int i = 0; i < n; ++i) {
                if (!excluded.has(g_autocast_keys[i])) enabled |= uint64_t{1} << i;
            }
        }
        if (enabled != want->autocast_enabled_mask) return 0;
        for (int i = 0; enabled != 0 && i < n; ++i) {
            if (((enabled >> i) & 1) != 0 &&
                want->dtypes[i] != static_cast<int32_t>(at::autocast::get_autocast_dtype(devices[i])))
                return 0;
        }
        auto& ctx = at::globalContext();
        if (h[L::kDeterministic] != (ctx.deterministicAlgorithms() ? 1 : 0)) return 0;
        if (h[L::kWarnOnly] != (ctx.deterministicAlgorithmsWarnOnly() ? 1 : 0)) return 0;
        if (h[L::kFp16] != static_cast<int64_t>(ctx.allowFP16ReductionCuBLAS())) return 0;
        if (h[L::kBf16] != static_cast<int64_t>(ctx.allowBF16ReductionCuBLAS())) return 0;
        if (h[L::kDefaultDtype] != static_cast<int64_t>(c10::get_default_dtype_as_scalartype())) return 0;
        if (h[L::kNumThreads] != at::get_num_threads()) return 0;
        const bool tf32 = ctx.float32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL) ==
                          at::Float32Precision::TF32;
        return h[L::kAllowTf32] == (tf32 ? 1 : 0) ? 1 : 0;
    } catch (...) {
        return 0;
    }
}

int64_t function_mode_stack_len() noexcept { return at::impl::PythonTorchFunctionTLS::stack_len(); }

PyObject* function_mode_at(int64_t i) noexcept {
    try {
        if (i < 0 || i >= at::impl::PythonTorchFunctionTLS::stack_len()) return nullptr;
        return at::impl::PythonTorchFunctionTLS::get_stack_at(i)->ptr(getPyInterpreter());
    } catch (...) {
        return nullptr;
    }
}

int read_device(PyObject* obj, int32_t* type, int32_t* index) noexcept {
    if (!THPDevice_Check(obj)) return 0;
    const at::Device& d = reinterpret_cast<THPDevice*>(obj)->device;
    *type = static_cast<int32_t>(d.type());
    *index = d.index();
    return 1;
}

int parse_device(const char* text, int32_t* type, int32_t* index) noexcept {
    try {
        const c10::Device d{std::string(text)};
        *type = static_cast<int32_t>(d.type());
        *index = d.index();
        return 1;
    } catch (...) {
        return 0;
    }
}

int dtype_code(PyObject* obj) noexcept {
    if (!THPDtype_Check(obj)) return -1;
    return static_cast<int>(reinterpret_cast<THPDtype*>(obj)->scalar_type);
}

int device_equal(PyObject* a, PyObject* b) noexcept {
    if (!THPDevice_Check(a) || !THPDevice_Check(b)) return 0;
    return reinterpret_cast<THPDevice*>(a)->device == reinterpret_cast<THPDevice*>(b)->device ? 1 : 0;
}

int saved_tensors_hooks_top(PyObject** pack, PyObject** unpack) noexcept {
    try {
        // get_tls_state() returns the thread-local by reference: no copy of the stack and no
        // incref through the interpreter (get_hooks() would copy the pair). A non-empty stack
        // implies torch initialized the hooks (push_hooks asserts it), so this reads what
        // get_hooks(/*ignore_is_tracing=*/true) returns.
        const auto& stack = at::SavedTensorDefaultHooks::get_tls_state().stack;
        if (stack.empty()) return 0;
        const auto& top = stack.top();
        *pack = top.first.ptr(getPyInterpreter());
        *unpack = top.second.ptr(getPyInterpreter());
        return 1;
    } catch (...) {
        return -1;  // never "empty": the caller falls back to the Python reader
    }
}

TwTorchAdapter g_table{};

PyModuleDef g_module = {PyModuleDef_HEAD_INIT,
                        "tripwire._torch_adapter",
                        "tripwire's torch adapter: reads tensors and torch's state in C++ (private).",
                        -1,
                        nullptr,
                        nullptr,
                        nullptr,
                        nullptr,
                        nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__torch_adapter() {
    if (THPVariableClass == nullptr) {
        PyErr_SetString(PyExc_ImportError, "import torch before tripwire._torch_adapter");
        return nullptr;
    }
    g_table.abi_version = TRIPWIRE_TORCH_ADAPTER_ABI;
    g_table.struct_size = sizeof(TwTorchAdapter);
    g_table.torch_version = TRIPWIRE_TORCH_VERSION;
    // torch._C.TensorBase: THPVariableClass is torch.Tensor, whose base it is.
    g_table.tensor_base_type = reinterpret_cast<PyTypeObject*>(THPVariableClass)->tp_base;
    g_table.dtype_type = &THPDtypeType;
    g_table.device_type = &THPDeviceType;
    g_table.size_type = &THPSizeType;
    g_table.read_tensor = read_tensor;
    g_table.tensor_fields = tensor_fields;
    g_table.python_keys_mask = kPythonKeys.raw_repr();
    g_table.apply_local_keys = apply_local_keys;
    for (std::size_t i = 0; i < g_autocast_keys.size(); ++i) {
        g_autocast_keys[i] = at::autocast::get_autocast_dispatch_key_from_device_type(
            at::autocast::_AUTOCAST_SUPPORTED_DEVICES[i]);
        g_all_autocast_bits |= c10::DispatchKeySet(g_autocast_keys[i]).raw_repr();
    }
    g_table.global_state_matches = global_state_matches;
    g_table.read_global_state = read_global_state;
    g_table.function_mode_stack_len = function_mode_stack_len;
    g_table.function_mode_at = function_mode_at;
    g_table.read_device = read_device;
    g_table.parse_device = parse_device;
    g_table.dtype_code = dtype_code;
    g_table.device_equal = device_equal;
    g_table.saved_tensors_hooks_top = saved_tensors_hooks_top;
    g_table.tensor_matches = tensor_matches;

    PyObject* m = PyModule_Create(&g_module);
    if (m == nullptr) return nullptr;
    PyObject* capsule = PyCapsule_New(&g_table, TRIPWIRE_TORCH_ADAPTER_CAPSULE, nullptr);
    if (capsule == nullptr || PyModule_AddObject(m, "table", capsule) < 0) {
        Py_XDECREF(capsule);
        Py_DECREF(m);
        return nullptr;
    }
    if (PyModule_AddStringConstant(m, "torch_version", TRIPWIRE_TORCH_VERSION) < 0) {
        Py_DECREF(m);
        return nullptr;
    }
    return m;
}
