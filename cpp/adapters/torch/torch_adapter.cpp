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
#include <ATen/Config.h>
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/SavedTensorHooks.h>
#include <ATen/autocast_mode.h>
#include <c10/core/AutogradState.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/PyInterpreter.h>
#include <torch/csrc/Size.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/dynamo/guards.h>

#include <pybind11/pybind11.h>

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <pthread.h>
#if AT_PARALLEL_OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "adapters/torch/hidden_symbol.hpp"
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

// -- tensors whose metadata is answered by code ----------------------------------------------
//
// A TensorImpl answers sizes(), strides(), dim(), numel(), storage_offset(), is_contiguous(),
// device() and layout() from its own fields unless a policy sends them to a virtual *_custom
// method. For a __torch_dispatch__ wrapper subclass built with `dispatch_sizes_strides_policy`,
// `dispatch_device` or `dispatch_layout` (_make_wrapper_subclass), those methods call the
// subclass's Python __torch_dispatch__: user code, which may collect garbage, free what a region
// borrows, mutate the guarded dict or raise. A C++ impl's custom methods may do the same by
// delegating to a wrapped tensor (functionalization's wrapper). The readers below never call a
// custom method: such a tensor is "read by code" and the caller decides it outside its region
// (TENSOR_MATCH through the Python reader, which reads what torch's own guard reads).

// The sizes/strides policy: TensorImpl::matches_policy is protected; a pointer to it is formed
// in a derived class's scope (the one place the language allows naming it) and applied to any
// TensorImpl. The class is never instantiated.
struct PolicyOf : c10::TensorImpl {
    static bool custom(const c10::TensorImpl* impl, SizesStridesPolicy policy) {
        constexpr bool (c10::TensorImpl::*matches)(SizesStridesPolicy) const = &PolicyOf::matches_policy;
        return (impl->*matches)(policy);
    }
};

// device_policy_ and layout_policy_ are private bit-fields with no accessor: where each lives in
// the object is found once at load, on a fresh tensor of our own, as the one bit that both of
// its public setters (custom_ and python_custom_) flip (refresh_*_policy: the policy is their
// OR). Unknown (ok false) when the probe is ambiguous: then every tensor with the Python key
// counts as read by code (stricter, never laxer).
struct PolicyBit {
    std::size_t byte = 0;
    unsigned char mask = 0;
};
struct PolicyBits {
    PolicyBit device, layout;
    bool ok = false;
};
PolicyBits g_policy_bits;

using ImplBytes = std::array<unsigned char, sizeof(c10::TensorImpl)>;
ImplBytes bytes_of(const c10::TensorImpl* impl) {
    ImplBytes out{};
    // The object representation, read through unsigned char (allowed for any object).
    const auto* p = reinterpret_cast<const unsigned char*>(impl);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = p[i];
    return out;
}

std::optional<PolicyBit> probe_policy_bit(c10::TensorImpl* impl, void (c10::TensorImpl::*set_custom)(bool),
                                          void (c10::TensorImpl::*set_python)(bool)) {
    const ImplBytes base = bytes_of(impl);
    (impl->*set_custom)(true);
    const ImplBytes a = bytes_of(impl);
    (impl->*set_custom)(false);
    (impl->*set_python)(true);
    const ImplBytes b = bytes_of(impl);
    (impl->*set_python)(false);
    if (bytes_of(impl) != base) return std::nullopt;
    std::optional<PolicyBit> found;
    for (std::size_t i = 0; i < base.size(); ++i) {
        const auto common = static_cast<unsigned char>((a[i] ^ base[i]) & (b[i] ^ base[i]));
        if (common == 0) continue;
        if (found || (common & (common - 1)) != 0) return std::nullopt;  // more than one bit
        found = PolicyBit{i, common};
    }
    return found;
}

void probe_policy_bits() {
    at::Tensor t = at::empty({0});
    c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    const auto device = probe_policy_bit(impl, &c10::TensorImpl::set_custom_device,
                                         &c10::TensorImpl::set_python_custom_device);
    const auto layout = probe_policy_bit(impl, &c10::TensorImpl::set_custom_layout,
                                         &c10::TensorImpl::set_python_custom_layout);
    if (!device || !layout) return;
    // The probe must read what the policies do: set through the public setter, seen at the bit.
    const auto bit = [impl](const PolicyBit& b) {
        return (reinterpret_cast<const unsigned char*>(impl)[b.byte] & b.mask) != 0;
    };
    impl->set_custom_device(true);
    const bool device_seen = bit(*device) && !bit(*layout);
    impl->set_custom_device(false);
    impl->set_custom_layout(true);
    const bool layout_seen = bit(*layout) && !bit(*device);
    impl->set_custom_layout(false);
    if (!device_seen || !layout_seen || bit(*device) || bit(*layout)) return;
    g_policy_bits = PolicyBits{*device, *layout, true};
}

inline bool read_by_code(const c10::TensorImpl* impl);

// -- All policies Default, in one test -----------------------------------------------------------
//
// read_by_code's common answer (every policy Default: no custom device, layout, sizes or strides)
// from one 8-byte load: the policy bits all live in the impl's bit-fields, within a few bytes. The
// window (an offset into the impl and a mask over the 8 bytes there, in the load's byte order) is
// found at load on a fresh tensor of our own: every bit that the policies' public setters flip
// (set_custom_/set_python_custom_sizes_strides to CustomStrides and CustomSizes, which refresh
// sizes_strides_policy_: its two bits, plus the setters' own fields; the device and layout policy
// bits of probe_policy_bits). A masked bit set does not mean "read by code": the full test below
// decides then. A clear window means every policy is zero (Default): the mask holds every bit of
// each policy field (each bit is flipped by some setter value), and may hold more (the setters'
// own fields, which only send more tensors to the full test). Without a verified window the mask
// is all ones over offset 0 (the vtable pointer, never zero): the full test for every tensor.
struct PolicyWindow {
    std::size_t offset = 0;
    uint64_t mask = ~uint64_t{0};
};
PolicyWindow g_policy_window;

inline uint64_t window_of(const c10::TensorImpl* impl, std::size_t offset) {
    uint64_t w = 0;
    // The object representation, read as bytes (memcpy: allowed for any trivially copyable bytes).
    std::memcpy(&w, reinterpret_cast<const unsigned char*>(impl) + offset, sizeof w);
    return w;
}

void probe_policy_window() {
    if (!g_policy_bits.ok) return;  // the device and layout bits are unknown
    using Policy = c10::TensorImpl::SizesStridesPolicy;
    at::Tensor t = at::empty({0});
    c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    const ImplBytes base = bytes_of(impl);
    ImplBytes flipped{};
    const auto collect = [&] {
        const ImplBytes now = bytes_of(impl);
        for (std::size_t i = 0; i < now.size(); ++i)
            flipped[i] |= static_cast<unsigned char>(now[i] ^ base[i]);
    };
    for (const Policy p : {Policy::CustomStrides, Policy::CustomSizes}) {
        impl->set_python_custom_sizes_strides(p);
        collect();
        impl->set_python_custom_sizes_strides(Policy::Default);
        impl->set_custom_sizes_strides(p);
        collect();
        impl->set_custom_sizes_strides(Policy::Default);
    }
    if (bytes_of(impl) != base) return;
    flipped[g_policy_bits.device.byte] |= g_policy_bits.device.mask;
    flipped[g_policy_bits.layout.byte] |= g_policy_bits.layout.mask;
    std::size_t first = flipped.size(), last = 0;
    for (std::size_t i = 0; i < flipped.size(); ++i) {
        if (flipped[i] == 0) continue;
        first = std::min(first, i);
        last = i;
    }
    if (first == flipped.size() || last - first >= sizeof(uint64_t)) return;
    const std::size_t offset = std::min(first, flipped.size() - sizeof(uint64_t));
    uint64_t mask = 0;
    std::memcpy(&mask, flipped.data() + offset, sizeof mask);
    // The window must say "Default" on this tensor and "not Default" under each policy, and the
    // full test must agree both ways.
    const auto clear = [&] { return (window_of(impl, offset) & mask) == 0; };
    bool ok = clear() && !read_by_code(impl);
    for (const Policy p : {Policy::CustomStrides, Policy::CustomSizes}) {
        impl->set_python_custom_sizes_strides(p);
        ok = ok && !clear();
        impl->set_python_custom_sizes_strides(Policy::Default);
        impl->set_custom_sizes_strides(p);
        ok = ok && !clear();
        impl->set_custom_sizes_strides(Policy::Default);
    }
    impl->set_custom_device(true);
    ok = ok && !clear() && read_by_code(impl);
    impl->set_custom_device(false);
    impl->set_python_custom_layout(true);
    ok = ok && !clear() && read_by_code(impl);
    impl->set_python_custom_layout(false);
    ok = ok && clear() && bytes_of(impl) == base;
    if (ok) g_policy_window = PolicyWindow{offset, mask};
}

// True when reading the fields TENSOR_MATCH compares (dim, sizes, strides of a strided tensor,
// storage offset, device, layout) would call a custom method: the readers refuse such a tensor.
//
// Testing the impl's own Python key first, and reading the policy bits only when it is set, would
// be cheaper, on the claim that only _make_wrapper_subclass-style paths
// (which give the impl the Python key) set a Python custom device/layout/sizes policy. It does not
// hold: TensorImpl::set_python_custom_device/_layout/_sizes_strides are public members of
// c10/core/TensorImpl.h (2.13: under `public:`, next to set_custom_device), callable by any C++
// extension on any impl, keys untouched; the header's refresh_device_policy() sets
// `device_policy_ = custom_device_ || python_custom_device_` (no key consulted), so device() then
// calls the virtual device_custom() (likewise layout, sizes), which for a base TensorImpl with
// the python bit asks the Python interpreter (TensorImpl.cpp; not in the headers, so not relied
// on here either way). So the bits are read on every tensor, as below: first all at once
// (g_policy_window), then, when any is set, one by one.
inline bool read_by_code(const c10::TensorImpl* impl) {
    if ((window_of(impl, g_policy_window.offset) & g_policy_window.mask) == 0) return false;
    if (!g_policy_bits.ok) {
        if (impl->key_set().has(c10::DispatchKey::Python)) return true;
    } else {
        const auto* p = reinterpret_cast<const unsigned char*>(impl);
        if ((p[g_policy_bits.device.byte] & g_policy_bits.device.mask) != 0 ||
            (p[g_policy_bits.layout.byte] & g_policy_bits.layout.mask) != 0)
            return true;
    }
    // Default (below CustomStrides): neither sizes nor strides are custom.
    if (!PolicyOf::custom(impl, c10::TensorImpl::SizesStridesPolicy::CustomStrides)) return false;
    if (PolicyOf::custom(impl, c10::TensorImpl::SizesStridesPolicy::CustomSizes)) return true;
    // Custom strides matter only where strides are read (a sparse tensor's throw, never read).
    return impl->layout() == c10::kStrided;
}

// A private member named through explicit template instantiation, the one place the language does
// not check access: the compiler takes the member's place from the header torch was built with, so
// the read is sound only against those exact headers (the adapter is compiled against the installed
// torch's, and _core refuses it under any other torch version: readers.cpp install_torch_adapter).
// Each use is checked against its public accessor when the adapter loads.
template <typename Tag, typename Tag::type Member>
struct PrivateMember {
    friend typename Tag::type member_of(Tag) { return Member; }
};

// -- torch's "dispatch mode without ignore_compile_internals" flag -------------------------------
//
// torch's guards keep the Python dispatch keys only while a dispatch mode without
// ignore_compile_internals is active, a C++ thread_local of libtorch_python read through
// get_is_in_mode_without_ignore_compile_internals(), which torch does not export (hidden
// visibility). The adapter finds it in libtorch_python's ELF symbol table (hidden_symbol.hpp; the
// library is the one holding THPVariableClass) and hands it to the core, which verifies it against
// torch's Python setter before the first use (runtime/tensors/mode_flag.hpp).
using ModeFlagGetter = bool (*)();
static_assert(std::is_same_v<decltype(&torch::dynamo::get_is_in_mode_without_ignore_compile_internals),
                             ModeFlagGetter>);
constexpr char kModeFlagGetter[] = "_ZN5torch6dynamo47get_is_in_mode_without_ignore_compile_internalsEv";

ModeFlagGetter find_mode_flag_getter() {
    // A symbol's address as a function pointer (ELF's rules; dlsym's own convention).
    // NOLINTNEXTLINE(cppcoreguidelines-pro-type-reinterpret-cast)
    return reinterpret_cast<ModeFlagGetter>(
        hidden_symbol::hidden_function(&THPVariableClass, kModeFlagGetter));
}

int read_tensor(PyObject* obj, int mask_python_keys, TwTensorMeta* out) noexcept {
    try {
        if (THPVariableClass == nullptr ||
            !PyType_IsSubtype(Py_TYPE(obj), reinterpret_cast<PyTypeObject*>(THPVariableClass)))
            return 0;
        const at::Tensor& t = THPVariable_Unpack(obj);
        if (!t.defined()) return 0;
        c10::TensorImpl* impl = t.unsafeGetTensorImpl();
        if (read_by_code(impl)) return -1;
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
        if (read_by_code(impl)) return 2;  // the caller reads it outside its region, by Python
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

// torch's THPVariable_Check without the `__class__` fallback of isinstance (an object faking its
// class would be unpacked as a tensor there): the value's type derives from torch.Tensor.
bool is_torch_tensor(PyObject* obj) {
    return THPVariableClass != nullptr &&
           PyType_IsSubtype(Py_TYPE(obj), reinterpret_cast<PyTypeObject*>(THPVariableClass));
}

// A tensor of a __torch_dispatch__ subclass (the Python key): its sizes, strides or numel may be
// answered by Python code (a wrapper subclass's custom sizes policy), which these readers must
// never run. They say "could not read" instead (a fail: stricter than torch, which calls it).
bool may_dispatch_to_python(const at::Tensor& t) {
    const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    return impl->key_set().has(c10::DispatchKey::Python) || read_by_code(impl);
}

// TensorPropertyGuardAccessor::check_nopybind, read for read (guards.cpp).
int cpp_tensor_property(PyObject* obj, int prop, int64_t index, int64_t* out) noexcept {
    try {
        if (!is_torch_tensor(obj)) return 0;
        const at::Tensor& t = THPVariable_Unpack(obj);
        if (!t.defined() || may_dispatch_to_python(t)) return 0;
        std::optional<int64_t> v;
        switch (prop) {
            case 0:
                if (index >= t.dim()) return 0;
                v = t.sym_size(index).maybe_as_int();
                break;
            case 1:
                if (index >= t.dim()) return 0;
                v = t.sym_stride(index).maybe_as_int();
                break;
            case 2: v = t.sym_storage_offset().maybe_as_int(); break;
            default: return 0;
        }
        if (!v.has_value()) return 0;
        *out = *v;
        return 1;
    } catch (...) {
        PyErr_Clear();  // a python_error from a dispatch leaves the indicator set
        return 0;
    }
}

// TENSOR_MATCH in one call (the fast program's common case). The same fields and order as the
// core's tensor_equal on tensor_fields' reading; anything it does not decide (Python keys, a layout
// without strides, a difference) answers 0 and the core's full reader decides, naming the field.
//
// Once read_by_code has answered false for a strided tensor, its sizes/strides policy is Default
// (read_by_code refuses CustomSizes, and CustomStrides on a strided layout), so sizes(), strides(),
// dim() and storage_offset() are the impl's own sizes_and_strides_ and storage_offset_: the
// *_default accessors read exactly those, testing the symbolic flag instead of the policy (a
// symbolic tensor throws there, caught: 0, the full reader decides). One read of the sizes gives
// the rank too. (Each policy accessor re-reads the policy bits: callgrind shows them reloaded
// four times per tensor through those.)
// flatten: torch's inline accessors inlined whatever GCC's budget says (strides_default() was
// left as an out-of-line call, 6 instructions plus the call each).
[[gnu::flatten]] int tensor_matches(PyObject* obj, const int64_t* want, TwKeyMemo* memo) noexcept {
    try {
        const at::Tensor& t = THPVariable_Unpack(obj);
        if (!t.defined()) return 0;
        c10::TensorImpl* impl = t.unsafeGetTensorImpl();
        // Before any field: with the Python key excluded by the thread-local sets (inside
        // _DisableTorchDispatch, or a __torch_dispatch__ body) the key test below would pass a
        // wrapper subclass on to sizes(), which would call its Python.
        if (read_by_code(impl)) return 0;
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
        if (impl->layout() != c10::kStrided) return 0;
        const c10::IntArrayRef sizes = impl->sizes_default();
        const int64_t ndim = static_cast<int64_t>(sizes.size());
        if (ndim != want[TW_TENSOR_NDIM]) return 0;
        const int64_t* size = sizes.data();
        const int64_t* stride = impl->strides_default().data();
        const int64_t* pairs = want + TW_TENSOR_HEADER;
        for (int64_t i = 0; i < ndim; ++i) {
            const int64_t want_size = pairs[2 * i], want_stride = pairs[2 * i + 1];
            if ((want_size != TW_TENSOR_ANY && want_size != size[i]) ||
                (want_stride != TW_TENSOR_ANY && want_stride != stride[i]))
                return 0;
        }
        const int64_t offset = want[TW_TENSOR_STORAGE_OFFSET];
        return offset == TW_TENSOR_ANY || offset == impl->storage_offset_default() ? 1 : 0;
    } catch (...) {
        return 0;
    }
}

// GradGuardAccessor::check_nopybind's value: THPVariable_Wrap of the C++ grad field.
PyObject* cpp_tensor_grad(PyObject* obj) noexcept {
    try {
        if (!is_torch_tensor(obj)) return nullptr;
        const at::Tensor& t = THPVariable_Unpack(obj);
        if (!t.defined()) return nullptr;
        // TensorImpl::grad() is the field Tensor::grad() returns, without its non-leaf warning
        // (which would go through Python's warnings machinery here).
        PyObject* g = THPVariable_Wrap(t.unsafeGetTensorImpl()->grad());
        if (g == nullptr) PyErr_Clear();
        return g;
    } catch (...) {
        PyErr_Clear();
        return nullptr;
    }
}

// torch's tensors_definitely_do_not_overlap<StaticMeta> (guards.cpp), read for read: true when x
// and y, assumed to share a storage, cannot overlap.
bool definitely_disjoint(const at::Tensor& x, const at::Tensor& y) {
    if (x.is_same(y)) return false;
    if (x.numel() == 0 || y.numel() == 0) return true;
    if (x.storage_offset() > y.storage_offset()) return definitely_disjoint(y, x);
    if (x.is_contiguous() && y.is_contiguous()) return x.storage_offset() + x.numel() <= y.storage_offset();
    int64_t x_last = x.storage_offset();
    for (int64_t i = 0; i < x.dim(); i++) x_last += (x.size(i) - 1) * x.stride(i);
    if (x_last < y.storage_offset()) return true;
    if (x.dim() == 2 && y.dim() == 2 && x.stride(1) == 1 && y.stride(1) == 1 && x.stride(0) == y.stride(0)) {
        // Rows contiguous, one outer stride (torch's "shampoo optimizer" case).
        const int64_t delta = y.storage_offset() - x.storage_offset();
        if (delta < x.size(1)) return false;
        if (x.stride(0) * (x.size(0) - 1) + x.size(1) <= delta) return true;
        if (delta % x.stride(0) + y.size(1) <= x.stride(0)) return true;
    }
    return false;
}

int tensors_may_overlap(PyObject* x, PyObject* y) noexcept {
    try {
        if (!is_torch_tensor(x) || !is_torch_tensor(y)) return -1;
        const at::Tensor& tx = THPVariable_Unpack(x);
        const at::Tensor& ty = THPVariable_Unpack(y);
        if (!tx.defined() || !ty.defined() || may_dispatch_to_python(tx) || may_dispatch_to_python(ty))
            return -1;
        return definitely_disjoint(tx, ty) ? 0 : 1;
    } catch (...) {
        PyErr_Clear();
        return -1;
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

// -- The per-check reading of torch's global state ---------------------------------------------
//
// GLOBAL_STATE is checked on every call, so global_state_matches reads each field the cheapest
// way that still reads what torch's own accessor returns:
//  - at::Context's fields directly (their accessors are out-of-line calls, and
//    float32Precision() hashes up to three keys of a string-free but hashed map per call). The
//    members are private: they are named through explicit template instantiation, the one
//    place the language does not check access. This is sound only against the exact headers
//    torch was built from: the adapter is compiled against the installed torch's headers and
//    _core refuses it under any other torch version (readers.cpp install_torch_adapter);
//    g_ctx_ok additionally requires each direct read to equal its accessor at load.
//  - the thread-locals torch keeps per thread (grad mode, torch-function state, the dispatch
//    key sets) through their addresses, looked up once per thread (ThreadLocals below) instead
//    of through one out-of-line call and one __tls_get_addr per field per check.
// read_global_state (snapshots and failure reasons) keeps torch's accessors.

using Fp32Key = std::pair<at::Float32Backend, at::Float32Op>;
using Fp32Map = std::unordered_map<Fp32Key, at::Float32Precision, c10::hash<Fp32Key>>;
struct CtxDeterministic {
    using type = bool at::Context::*;
    friend type member_of(CtxDeterministic);
};
struct CtxWarnOnly {
    using type = bool at::Context::*;
    friend type member_of(CtxWarnOnly);
};
struct CtxFp16 {
    using type = at::CuBLASReductionOption at::Context::*;
    friend type member_of(CtxFp16);
};
struct CtxBf16 {
    using type = at::CuBLASReductionOption at::Context::*;
    friend type member_of(CtxBf16);
};
struct CtxFp32 {
    using type = Fp32Map at::Context::*;
    friend type member_of(CtxFp32);
};
struct TfDisabled {
    using type = at::impl::TorchFunctionDisabledState at::impl::PythonTorchFunctionTLS::*;
    friend type member_of(TfDisabled);
};
template struct PrivateMember<CtxDeterministic, &at::Context::_deterministic_algorithms>;
template struct PrivateMember<CtxWarnOnly, &at::Context::_deterministic_algorithms_warn_only>;
template struct PrivateMember<CtxFp16, &at::Context::allow_fp16_reduction_cublas>;
template struct PrivateMember<CtxBf16, &at::Context::allow_bf16_reduction_cublas>;
template struct PrivateMember<CtxFp32, &at::Context::fp32_precision>;
template struct PrivateMember<TfDisabled, &at::impl::PythonTorchFunctionTLS::disabled_state_>;

// The process-wide context and the three precision entries float32Precision(CUDA, MATMUL) reads.
// Pointers to an unordered_map's elements stay valid until the element is erased (rehashing
// moves no node), and torch only ever assigns these entries. Null (g_ctx_ok false) when any
// direct read disagreed with its accessor at load: then the accessors are used.
at::Context* g_ctx = nullptr;
const at::Float32Precision* g_fp32_cuda_matmul = nullptr;
const at::Float32Precision* g_fp32_cuda_all = nullptr;
const at::Float32Precision* g_fp32_generic_all = nullptr;
bool g_ctx_ok = false;

// float32Precision(CUDA, MATMUL) == TF32, as torch 2.13's Context::float32Precision computes it
// (read from its compiled code: an entry NONE falls back to the backend's ALL entry, then to
// GENERIC's; DEFAULT falls back to the first of those that is neither NONE nor DEFAULT, else
// means TF32; CUDA has no BF16). Pinned against torch by
// test_torch_state.py::test_tf32_reading_follows_torch over every settable combination.
inline bool cuda_matmul_tf32_direct() {
    using P = at::Float32Precision;
    P p = *g_fp32_cuda_matmul;
    if (p == P::DEFAULT) {
        const P a = *g_fp32_cuda_all;
        if (a != P::NONE && a != P::DEFAULT) {
            p = a;
        } else {
            const P g = *g_fp32_generic_all;
            p = g != P::NONE && g != P::DEFAULT ? g : P::TF32;
        }
    } else if (p == P::NONE) {
        p = *g_fp32_cuda_all;
        if (p == P::NONE) p = *g_fp32_generic_all;
    }
    return p == P::TF32;  // CUDA's BF16 reads as NONE: not TF32 either way
}

bool cuda_matmul_tf32_accessor() {
    return at::globalContext().float32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL) ==
           at::Float32Precision::TF32;
}

void bind_context() {
    at::Context& ctx = at::globalContext();
    Fp32Map& map = ctx.*member_of(CtxFp32{});
    const auto entry = [&map](at::Float32Backend b, at::Float32Op op) -> const at::Float32Precision* {
        const auto it = map.find({b, op});
        return it == map.end() ? nullptr : &it->second;
    };
    g_fp32_cuda_matmul = entry(at::Float32Backend::CUDA, at::Float32Op::MATMUL);
    g_fp32_cuda_all = entry(at::Float32Backend::CUDA, at::Float32Op::ALL);
    g_fp32_generic_all = entry(at::Float32Backend::GENERIC, at::Float32Op::ALL);
    g_ctx = &ctx;
    g_ctx_ok = g_fp32_cuda_matmul != nullptr && g_fp32_cuda_all != nullptr && g_fp32_generic_all != nullptr &&
               ctx.*member_of(CtxDeterministic{}) == ctx.deterministicAlgorithms() &&
               ctx.*member_of(CtxWarnOnly{}) == ctx.deterministicAlgorithmsWarnOnly() &&
               ctx.*member_of(CtxFp16{}) == ctx.allowFP16ReductionCuBLAS() &&
               ctx.*member_of(CtxBf16{}) == ctx.allowBF16ReductionCuBLAS() &&
               cuda_matmul_tf32_direct() == cuda_matmul_tf32_accessor();
}

// One thread's torch thread-locals, by address. torch's thread_local objects never move while
// their thread lives (assignment keeps the address), so the addresses are looked up once per
// thread and reused while the same thread checks again. The cache holds one thread: it is
// keyed by the thread pointer, unique among live threads; a thread that looked them up clears
// the cache when it exits (ThreadExit, a thread_local destructor, which runs before the thread's
// TLS and its thread control block can be reused), and a forked child clears it (only the
// forking thread survives; another thread's control block may be reused there). Read and
// written only under the GIL, except the clearing at thread exit, which is one compare-exchange
// on `owner` (a thread clears only its own entry, which no other thread then uses).
struct ThreadLocals {
    std::atomic<std::uintptr_t> owner{0};
    const c10::AutogradState* autograd = nullptr;
    const at::impl::PythonTorchFunctionTLS* torch_function = nullptr;
    const c10::impl::PODLocalDispatchKeySet* dispatch = nullptr;
    // at::get_num_threads() is `lazy_init_num_threads(); return omp_get_max_threads();` in torch
    // 2.13's OpenMP build (ParallelOpenMP.cpp; its compiled code reads exactly that). The lazy
    // initialisation sets a per-thread flag that is never cleared, so once this thread has
    // called it (when its entry is filled), omp_get_max_threads() alone returns the same value,
    // without the __tls_get_addr of the flag. True when the two agreed at that moment.
    bool omp_threads = false;
    // at::autocast's cache flag in this thread's TLS block of libtorch_cpu (AutocastCacheFlag
    // below), or null: then is_autocast_cache_enabled() reads it.
    const bool* autocast_cache = nullptr;
    // The saved-tensor default hooks (get_tls_state() returns this thread's thread_local by
    // reference; set_tls_state assigns it in place).
    const at::impl::SavedTensorDefaultHooksTLS* saved_hooks = nullptr;
};
ThreadLocals g_tls;

// -- The autocast cache flag ----------------------------------------------------------------------
//
// is_autocast_cache_enabled() reads `thread_local bool cache_enabled` of an anonymous namespace in
// libtorch_cpu (autocast_mode.cpp): an out-of-line call and a __tls_get_addr on every check (18
// instructions of the ~115 the global state cost). No header names the variable, so its place in
// libtorch_cpu's TLS block is found once, by experiment, when the adapter loads: the bytes of this
// thread's block (dlinfo RTLD_DI_TLS_DATA) are compared before and after torch's own setter flips
// the flag and after it restores it; the flag is the one byte that changes, holding the accessor's
// value in both states, with nothing else changed. Each thread's block then holds its flag at that
// offset (one TLS image for every thread). When anything disagrees (no TLS segment, more than one
// byte changed, a value that is not the flag's), offset stays -1 and the accessor is used.
struct AutocastCacheFlag {
    void* library = nullptr;  // libtorch_cpu's handle (RTLD_NOLOAD: already loaded by torch)
    std::ptrdiff_t offset = -1;
};
AutocastCacheFlag g_cache_flag;

std::size_t tls_segment_size(std::size_t modid) {
    std::pair<std::size_t, std::size_t> q{modid, 0};
    dl_iterate_phdr(
        [](dl_phdr_info* info, std::size_t, void* data) -> int {
            auto* q = static_cast<std::pair<std::size_t, std::size_t>*>(data);
            if (info->dlpi_tls_modid != q->first) return 0;
            for (int i = 0; i < info->dlpi_phnum; ++i) {
                if (info->dlpi_phdr[i].p_type == PT_TLS) q->second = info->dlpi_phdr[i].p_memsz;
            }
            return 1;
        },
        &q);
    return q.second;
}

// This thread's TLS block of libtorch_cpu (allocated by the accessor call first), or null.
unsigned char* torch_cpu_tls_block() {
    (void)at::autocast::is_autocast_cache_enabled();
    void* block = nullptr;
    if (g_cache_flag.library == nullptr || dlinfo(g_cache_flag.library, RTLD_DI_TLS_DATA, &block) != 0)
        return nullptr;
    return static_cast<unsigned char*>(block);
}

void find_autocast_cache_flag() {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&at::autocast::is_autocast_cache_enabled), &info) == 0 ||
        info.dli_fname == nullptr)
        return;
    g_cache_flag.library = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
    std::size_t modid = 0;
    if (g_cache_flag.library == nullptr || dlinfo(g_cache_flag.library, RTLD_DI_TLS_MODID, &modid) != 0 ||
        modid == 0)
        return;
    const std::size_t size = tls_segment_size(modid);
    unsigned char* block = torch_cpu_tls_block();
    if (size == 0 || block == nullptr) return;
    const bool was = at::autocast::is_autocast_cache_enabled();
    const std::vector<unsigned char> before(block, block + size);
    at::autocast::set_autocast_cache_enabled(!was);
    const std::vector<unsigned char> flipped(block, block + size);
    const bool now = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_cache_enabled(was);
    const std::vector<unsigned char> after(block, block + size);
    if (now == was || before != after) return;
    std::ptrdiff_t at = -1;
    for (std::size_t i = 0; i < size; ++i) {
        if (before[i] == flipped[i]) continue;
        if (at != -1) return;  // more than one byte changed
        at = static_cast<std::ptrdiff_t>(i);
    }
    if (at < 0 || before[at] != (was ? 1 : 0) || flipped[at] != (now ? 1 : 0)) return;
    g_cache_flag.offset = at;
}

std::uintptr_t thread_pointer() {
#if defined(__x86_64__) && defined(__linux__)
    std::uintptr_t tp = 0;
    asm("mov %%fs:0, %0" : "=r"(tp));
    return tp;
#elif defined(__aarch64__)
    return reinterpret_cast<std::uintptr_t>(__builtin_thread_pointer());
#else
    return 0;  // no cache: every check looks the thread-locals up
#endif
}

// Set when this thread's ThreadExit ran: Python code run by a later thread_local destructor
// (torch's mode stack drops its modes) may still check guards on this thread; it must not refill
// the cache, which nothing would clear afterwards. Trivially destructible, so readable until the
// thread's TLS is freed.
thread_local bool t_exiting = false;

struct ThreadExit {
    bool armed = false;
    ~ThreadExit() {
        t_exiting = true;
        std::uintptr_t me = thread_pointer();
        if (me != 0) g_tls.owner.compare_exchange_strong(me, 0);
    }
};
thread_local ThreadExit t_exit;

void forget_thread_locals() { g_tls.owner.store(0); }

// The lookup when the cache holds another thread (or none). Out of line: kept out of the callers'
// hot code, which is then only the thread-pointer comparison of thread_locals().
[[gnu::noinline]] const ThreadLocals& refill_thread_locals(std::uintptr_t me) {
    g_tls.owner.store(0);
    g_tls.autograd = &c10::AutogradState::get_tls_state();
    g_tls.torch_function = &at::impl::PythonTorchFunctionTLS::get_state();
    g_tls.dispatch = &c10::impl::raw_local_dispatch_key_set;
    g_tls.saved_hooks = &at::SavedTensorDefaultHooks::get_tls_state();
#if AT_PARALLEL_OPENMP
    g_tls.omp_threads = at::get_num_threads() == omp_get_max_threads();
#endif
    g_tls.autocast_cache = nullptr;
    if (g_cache_flag.offset >= 0) {
        unsigned char* block = torch_cpu_tls_block();
        const bool* flag =
            block != nullptr ? reinterpret_cast<const bool*>(block + g_cache_flag.offset) : nullptr;
        // The same reading as the accessor's on this thread, or the accessor stays.
        if (flag != nullptr && *flag == at::autocast::is_autocast_cache_enabled())
            g_tls.autocast_cache = flag;
    }
    if (me != 0 && !t_exiting) {
        t_exit.armed = true;  // constructs this thread's ThreadExit: its destructor clears the entry
        g_tls.owner.store(me);
    }
    return g_tls;  // uncached (owner 0): valid for this call, on this thread, under the GIL
}

// This thread's entry, looked up now if the cache holds another thread's. Inlined into both callers
// (global_state_matches, saved_tensors_hooks_top): as a call, the global state measured 138
// instructions per check instead of 128 (bench/global_state_instructions.py).
[[gnu::always_inline]] inline const ThreadLocals& thread_locals() {
    const std::uintptr_t me = thread_pointer();
    if (me != 0 && g_tls.owner.load(std::memory_order_relaxed) == me) return g_tls;
    return refill_thread_locals(me);
}

int global_state_matches(const TwGlobalState* want) noexcept {
    namespace L = ts_layout;
    const auto& devices = at::autocast::_AUTOCAST_SUPPORTED_DEVICES;
    const int n = static_cast<int>(devices.size());
    // header[kDevices] equals n_devices: the core compiles both from one snapshot (torch_state.cpp).
    if (want->n_devices != n) return 0;
    try {
        const int64_t* h = want->header;
        // Thread-local state first, then the process-wide context.
        const ThreadLocals& tls = thread_locals();
        if (h[L::kGradMode] != (tls.autograd->get_grad_mode() ? 1 : 0)) return 0;
        const auto tf = tls.torch_function->*member_of(TfDisabled{});
        if (h[L::kTorchFunction] != (tf == at::impl::TorchFunctionDisabledState::ENABLED ? 1 : 0)) return 0;
        if (h[L::kTorchFunctionAllDisabled] !=
            (tf == at::impl::TorchFunctionDisabledState::ALL_DISABLED ? 1 : 0))
            return 0;
        const bool cache_enabled =
            tls.autocast_cache != nullptr ? *tls.autocast_cache : at::autocast::is_autocast_cache_enabled();
        if (h[L::kCacheEnabled] != (cache_enabled ? 1 : 0)) return 0;
        const c10::DispatchKeySet excluded = tls.dispatch->excluded();
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
        if (h[L::kDefaultDtype] != static_cast<int64_t>(c10::get_default_dtype_as_scalartype())) return 0;
#if AT_PARALLEL_OPENMP
        if (h[L::kNumThreads] != (tls.omp_threads ? omp_get_max_threads() : at::get_num_threads())) return 0;
#else
        if (h[L::kNumThreads] != at::get_num_threads()) return 0;
#endif
        if (!g_ctx_ok) {
            auto& ctx = at::globalContext();
            if (h[L::kDeterministic] != (ctx.deterministicAlgorithms() ? 1 : 0)) return 0;
            if (h[L::kWarnOnly] != (ctx.deterministicAlgorithmsWarnOnly() ? 1 : 0)) return 0;
            if (h[L::kFp16] != static_cast<int64_t>(ctx.allowFP16ReductionCuBLAS())) return 0;
            if (h[L::kBf16] != static_cast<int64_t>(ctx.allowBF16ReductionCuBLAS())) return 0;
            return h[L::kAllowTf32] == (cuda_matmul_tf32_accessor() ? 1 : 0) ? 1 : 0;
        }
        const at::Context& ctx = *g_ctx;
        if (h[L::kDeterministic] != (ctx.*member_of(CtxDeterministic{}) ? 1 : 0)) return 0;
        if (h[L::kWarnOnly] != (ctx.*member_of(CtxWarnOnly{}) ? 1 : 0)) return 0;
        if (h[L::kFp16] != static_cast<int64_t>(ctx.*member_of(CtxFp16{}))) return 0;
        if (h[L::kBf16] != static_cast<int64_t>(ctx.*member_of(CtxBf16{}))) return 0;
        return h[L::kAllowTf32] == (cuda_matmul_tf32_direct() ? 1 : 0) ? 1 : 0;
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
        // get_tls_state() returns the thread-local by reference (its address is cached per thread
        // with the others, ThreadLocals): no copy of the stack and no incref through the
        // interpreter (get_hooks() would copy the pair). A non-empty stack
        // implies torch initialized the hooks (push_hooks asserts it), so this reads what
        // get_hooks(/*ignore_is_tracing=*/true) returns.
        const auto& stack = thread_locals().saved_hooks->stack;
        if (stack.empty()) return 0;
        const auto& top = stack.top();
        *pack = top.first.ptr(getPyInterpreter());
        *unpack = top.second.ptr(getPyInterpreter());
        return 1;
    } catch (...) {
        return -1;  // never "empty": the caller falls back to the Python reader
    }
}

// -- DISPATCH_KEY_SET_MATCH ------------------------------------------------------------------------
//
// torch's leaf casts its value with pybind11 (py::cast<c10::DispatchKeySet>): any instance of a type
// deriving from torch._C.DispatchKeySet, whose C++ value it then reads, never the Python methods a
// subclass may override. pybind11's caster would look up (and on first sight of a Python subclass,
// cache with a new weak reference: an allocation) the type's pybind11 bases; this reads the
// instance in place instead. A pybind11 instance of a type with a single pybind11 base (simple
// layout) holds its value pointer in simple_value_holder[0], set with the holder flag once __init__
// constructed it. The layout is that of the pybind11 headers torch ships and was built with; it is
// verified when the adapter loads (verify_key_set_reader): on any disagreement the type stays null
// and the core refuses the kind.
PyTypeObject* g_key_set_type = nullptr;

int dispatch_key_set_bits(PyObject* obj, uint64_t* out) noexcept {
    if (g_key_set_type == nullptr || !PyType_IsSubtype(Py_TYPE(obj), g_key_set_type)) return 0;
    auto* inst = reinterpret_cast<pybind11::detail::instance*>(obj);
    // Not simple: the type has another pybind11 base too (a stricter fail than torch's cast).
    if (!inst->simple_layout || !inst->simple_holder_constructed) return 0;
    const void* value = inst->simple_value_holder[0];
    if (value == nullptr) return 0;
    *out = static_cast<const c10::DispatchKeySet*>(value)->raw_repr();
    return 1;
}

// torch._C.DispatchKeySet, once dispatch_key_set_bits reads what torch's own raw_repr() returns on
// sets built by torch (several bit patterns, one per functionality and backend class).
void verify_key_set_reader() {
    PyObject* c = PyImport_ImportModule("torch._C");
    if (c == nullptr) {
        PyErr_Clear();
        return;
    }
    PyObject* type = PyObject_GetAttrString(c, "DispatchKeySet");
    Py_DECREF(c);
    if (type == nullptr || !PyType_Check(type)) {
        Py_XDECREF(type);
        PyErr_Clear();
        return;
    }
    g_key_set_type = reinterpret_cast<PyTypeObject*>(type);  // held for the process
    bool ok = true;
    for (const uint64_t raw :
         {uint64_t{0}, uint64_t{1}, uint64_t{0x8001}, ~uint64_t{0} >> 1, uint64_t{0x5a5a5a5a5a5a}}) {
        PyObject* ks = PyObject_CallMethod(type, "from_raw_repr", "K", static_cast<unsigned long long>(raw));
        uint64_t got = 0;
        PyObject* back = ks != nullptr ? PyObject_CallMethod(ks, "raw_repr", nullptr) : nullptr;
        const unsigned long long want = back != nullptr ? PyLong_AsUnsignedLongLong(back) : 0;
        ok = ok && ks != nullptr && back != nullptr && !PyErr_Occurred() &&
             dispatch_key_set_bits(ks, &got) == 1 && got == want && Py_TYPE(ks) == g_key_set_type;
        Py_XDECREF(back);
        Py_XDECREF(ks);
        PyErr_Clear();
    }
    if (!ok) g_key_set_type = nullptr;
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

// compile_wrapper's per-call dispatch-key snapshot (ABI 7): what torch's
// _dispatch_tls_local_{include,exclude}_set read, and what _ForceDispatchKeyGuard writes back.
void local_keys_save(TwLocalKeys* out) {
    const c10::impl::LocalDispatchKeySet local = c10::impl::tls_local_dispatch_key_set();
    out->included = local.included_.raw_repr();
    out->excluded = local.excluded_.raw_repr();
}

void local_keys_restore(const TwLocalKeys* saved) {
    c10::impl::PODLocalDispatchKeySet pod;
    pod.set_included(c10::DispatchKeySet(c10::DispatchKeySet::RAW, saved->included));
    pod.set_excluded(c10::DispatchKeySet(c10::DispatchKeySet::RAW, saved->excluded));
    c10::impl::_force_tls_local_dispatch_key_set(pod);
}

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
    try {
        probe_policy_bits();
        probe_policy_window();
    } catch (...) {
        g_policy_window = PolicyWindow{};  // the full test for every tensor
        g_policy_bits.ok = false;          // every tensor with the Python key counts as read by code
    }
    try {
        bind_context();
    } catch (...) {
        g_ctx_ok = false;  // the accessors then read the context
    }
    try {
        find_autocast_cache_flag();
    } catch (...) {
        g_cache_flag.offset = -1;  // the accessor reads it
    }
    pthread_atfork(nullptr, nullptr, forget_thread_locals);
    g_table.global_state_matches = global_state_matches;
    g_table.read_global_state = read_global_state;
    g_table.function_mode_stack_len = function_mode_stack_len;
    g_table.function_mode_at = function_mode_at;
    g_table.read_device = read_device;
    g_table.parse_device = parse_device;
    g_table.dtype_code = dtype_code;
    g_table.device_equal = device_equal;
    g_table.saved_tensors_hooks_top = saved_tensors_hooks_top;
    g_table.cpp_tensor_property = cpp_tensor_property;
    g_table.cpp_tensor_grad = cpp_tensor_grad;
    g_table.tensors_may_overlap = tensors_may_overlap;
    g_table.tensor_matches = tensor_matches;
    verify_key_set_reader();
    g_table.dispatch_key_set_type = g_key_set_type;
    g_table.dispatch_key_set_bits = dispatch_key_set_bits;
    g_table.mode_flag_getter = find_mode_flag_getter();
    g_table.local_keys_save = local_keys_save;
    g_table.local_keys_restore = local_keys_restore;

    PyObject* m = PyModule_Create(&g_module);
    if (m == nullptr) return nullptr;
    PyObject* capsule = PyCapsule_New(&g_table, TRIPWIRE_TORCH_ADAPTER_CAPSULE, nullptr);
    if (capsule == nullptr || PyModule_AddObject(m, "table", capsule) < 0) {
        Py_XDECREF(capsule);
        Py_DECREF(m);
        return nullptr;
    }
    // Where the autocast cache flag was found in libtorch_cpu's TLS block (-1: read by the
    // accessor), for the tests and for diagnostics.
    if (PyModule_AddIntConstant(m, "autocast_cache_flag_offset", static_cast<long>(g_cache_flag.offset)) <
            0 ||
        PyModule_AddStringConstant(m, "torch_version", TRIPWIRE_TORCH_VERSION) < 0 ||
        // Whether read_by_code's "every policy Default" is one masked load (probe_policy_window).
        PyModule_AddIntConstant(m, "policy_window", g_policy_window.mask != ~uint64_t{0} ? 1 : 0) < 0) {
        Py_DECREF(m);
        return nullptr;
    }
    return m;
}
