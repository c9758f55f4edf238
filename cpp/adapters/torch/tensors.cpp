// tripwire/cpp/adapters/torch/tensors.cpp -- the torch adapter's tensor readers.
//
// A tensor's fields (read_tensor, tensor_fields), TENSOR_MATCH's one call (tensor_matches), the
// C++ property and grad reads of torch's accessors, the storage overlap test, and the load-time
// probes of the impl's policy bits that decide "read by code" and of the autograd meta's place.
// tensor_matches is on every check: it stays in this unit with the policy window, the field
// readers and the autograd route it inlines.
//
// Every function is noexcept at the boundary: torch's accessors may throw (strides() of a sparse
// tensor, sizes() of a nested one); the exception is caught here and reported as "could not read".
#include <c10/core/InferenceMode.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <typeinfo>

#include "adapters/torch/adapter.hpp"

namespace tripwire::torch_adapter {

namespace {

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

// The protected fields behind device(), sizes(), strides() and storage_offset()'s default
// branches, read as those branches do (pointers to them formed in a derived class's scope, as
// above; never instantiated). Only for an impl whose policies are all Default (tensor_matches).
struct Fields : c10::TensorImpl {
    static const std::optional<c10::Device>& device(const c10::TensorImpl* impl) {
        constexpr std::optional<c10::Device> c10::TensorImpl::*field = &Fields::device_opt_;
        return impl->*field;
    }
    static const c10::impl::SizesAndStrides& sizes_and_strides(const c10::TensorImpl* impl) {
        constexpr c10::impl::SizesAndStrides c10::TensorImpl::*field = &Fields::sizes_and_strides_;
        return impl->*field;
    }
    static int64_t storage_offset(const c10::TensorImpl* impl) {
        constexpr int64_t c10::TensorImpl::*field = &Fields::storage_offset_;
        return impl->*field;
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

// -- requires_grad without two out-of-line calls ---------------------------------------------------
//
// torch's TensorCheck reads requires_grad through TensorImpl::requires_grad() (TensorImpl.cpp, out
// of line): `autograd_meta_ ? autograd_meta_->requires_grad() : false`, a call and then a virtual
// call per tensor. A plain AutogradMeta's override is inline in variable.h (`requires_grad_ ||
// grad_fn_`), its fields public. autograd_meta_ is private, its accessor out of line: where the
// pointer lives in the impl is found once at load, on a fresh tensor of our own, as the one
// pointer-aligned word that is null before set_requires_grad(true) and autograd_meta() after; the
// meta's vtable pointer is taken there too, once typeid has said it is an AutogradMeta and nothing
// derived. On a check, a meta with that vtable pointer is a plain AutogradMeta and is answered by
// its inline override; any other meta (a view's DifferentiableViewMeta, which also asks the view's
// base; a C++ extension's) by its own virtual requires_grad(), as torch would. Not found (ok
// false): torch's accessor for every tensor.
struct AutogradRoute {
    std::size_t offset = 0;
    const void* vptr = nullptr;
    bool ok = false;
};
AutogradRoute g_autograd;

inline const void* word_at(const void* p, std::size_t offset) {
    const void* w = nullptr;
    // The object representation, read as bytes (memcpy: allowed for any object's bytes).
    std::memcpy(&w, static_cast<const unsigned char*>(p) + offset, sizeof w);
    return w;
}

// requires_grad where no call is needed: 1 or 0, else -1 (a meta other than a plain AutogradMeta,
// or no route found: only torch's accessor answers).
inline int requires_grad_inline(const c10::TensorImpl* impl) {
    if (!g_autograd.ok) return -1;
    const auto* meta = static_cast<const c10::AutogradMetaInterface*>(word_at(impl, g_autograd.offset));
    if (meta == nullptr) return 0;
    if (word_at(meta, 0) != g_autograd.vptr) return -1;
    return static_cast<const torch::autograd::AutogradMeta*>(meta)->AutogradMeta::requires_grad() ? 1 : 0;
}

inline bool requires_grad_of(const c10::TensorImpl* impl) {
    const int r = requires_grad_inline(impl);
    return r >= 0 ? r == 1 : impl->requires_grad();
}

void probe_autograd_route() {
    // Outside inference mode and with grad mode on, whatever the thread that imports us is in:
    // an inference tensor takes no autograd meta.
    const c10::InferenceMode not_inference(false);
    const at::AutoGradMode grad(true);
    at::Tensor t = at::empty({0});
    c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    if (impl->autograd_meta() != nullptr) return;
    const ImplBytes before = bytes_of(impl);
    t.set_requires_grad(true);
    const c10::AutogradMetaInterface* meta = impl->autograd_meta();
    if (meta == nullptr || typeid(*meta) != typeid(torch::autograd::AutogradMeta)) return;
    const ImplBytes after = bytes_of(impl);
    std::optional<std::size_t> found;
    for (std::size_t i = 0; i + sizeof(void*) <= after.size(); i += alignof(void*)) {
        if (word_at(before.data(), i) != nullptr || word_at(after.data(), i) != meta) continue;
        if (found) return;  // two candidates: ambiguous
        found = i;
    }
    if (!found) return;
    g_autograd = AutogradRoute{*found, word_at(meta, 0), true};
    // The route must answer as torch's accessor both ways on this meta, and on a tensor without one.
    const at::Tensor bare = at::empty({0});
    bool ok =
        requires_grad_of(impl) && impl->requires_grad() && !requires_grad_of(bare.unsafeGetTensorImpl());
    t.set_requires_grad(false);
    ok = ok && !requires_grad_of(impl) && !impl->requires_grad() && impl->autograd_meta() == meta;
    if (!ok) g_autograd = AutogradRoute{};
}

}  // namespace

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
        // DeviceIndex is a signed int8: -1 (no index) must stay -1, so no cast through unsigned char.
        // NOLINTNEXTLINE(bugprone-signed-char-misuse)
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
        // DeviceIndex is a signed int8: -1 (no index) must stay -1, so no cast through unsigned char.
        // NOLINTNEXTLINE(bugprone-signed-char-misuse)
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

namespace {

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

}  // namespace

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

namespace {

// TENSOR_MATCH in one call (the fast program's common case). The same fields and order as the
// core's tensor_equal on tensor_fields' reading; anything it does not decide (a policy not Default,
// Python keys, a layout without strides, no device, a difference) answers 0 and the core's full
// reader decides, naming the field.
//
// Only a tensor whose policy window is clear is read here: every policy Default (no custom device,
// layout, sizes or strides; and not symbolic, which forces CustomSizes), so each accessor torch's
// TensorCheck calls is its default branch, and those are read here as directly: device() is
// device_opt_ (unset: 0), layout() is kStrided unless the key set has a sparse, sparse-compressed
// or mkldnn key, sizes(), strides() and storage_offset() are the impl's own fields (the *_default
// accessors), requires_grad() is requires_grad_of. Without a verified window (policy_window_found
// false) no tensor is read here.
//
// Two instances of one body: Leaf, the entry point, makes no call but a tail call of the other
// instance wherever a call is needed (the thread-locals' read when the memo is stale, a meta that
// is not a plain AutogradMeta, a dtype without a ScalarType), so its common path keeps no frame
// for calls (it saves one register where a body with calls saves four); the other makes those
// calls itself.
template <bool Leaf>
[[gnu::always_inline]] inline int match_fields(PyObject* obj, const int64_t* want, TwKeyMemo* memo);

[[gnu::noinline, gnu::flatten]] int match_with_calls(PyObject* obj, const int64_t* want,
                                                     TwKeyMemo* memo) noexcept {
    try {
        return match_fields<false>(obj, want, memo);
    } catch (...) {
        return 0;
    }
}

template <bool Leaf>
[[gnu::always_inline]] inline int match_fields(PyObject* obj, const int64_t* want, TwKeyMemo* memo) {
    const at::Tensor& t = THPVariable_Unpack(obj);
    if (!t.defined()) return 0;
    const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    // Before any field: with the Python key excluded by the thread-local sets (inside
    // _DisableTorchDispatch, or a __torch_dispatch__ body) the key test below would pass a
    // wrapper subclass on to its sizes, which its Python answers.
    if ((window_of(impl, g_policy_window.offset) & g_policy_window.mask) != 0) return 0;
    const c10::DispatchKeySet key_set = impl->key_set();
    const uint64_t raw = key_set.raw_repr();
    uint64_t keys = memo->last_applied;
    // A reset memo's pair decides nothing (tw_key_memo_reset): one compare per tensor.
    if (raw != memo->last_raw) {
        if constexpr (Leaf) {
            return match_with_calls(obj, want, memo);
        } else {
            if (memo->valid == 0) {
                // One read of the thread-locals per check (the caller clears the memo whenever
                // Python code may have run since).
                const c10::impl::LocalDispatchKeySet local = c10::impl::tls_local_dispatch_key_set();
                memo->included = local.included_.raw_repr();
                memo->excluded = local.excluded_.raw_repr();
                memo->valid = 1;
            }
            // DispatchKeySet's own operators, as apply_local: `-` keeps the backend bits.
            keys = ((key_set | c10::DispatchKeySet(c10::DispatchKeySet::RAW, memo->included)) -
                    c10::DispatchKeySet(c10::DispatchKeySet::RAW, memo->excluded))
                       .raw_repr();
            memo->last_raw = raw;
            memo->last_applied = keys;
        }
    }
    if (keys != static_cast<uint64_t>(want[TW_TENSOR_KEYS]) || (keys & kPythonKeys.raw_repr()) != 0) return 0;
    const caffe2::TypeMeta dtype = impl->dtype();
    if constexpr (Leaf) {
        if (!dtype.isScalarType()) return match_with_calls(obj, want, memo);  // toScalarType throws
    }
    if (static_cast<int64_t>(dtype.toScalarType()) != want[TW_TENSOR_DTYPE]) return 0;
    const std::optional<c10::Device>& device = Fields::device(impl);
    if (!device.has_value() || device->index() != want[TW_TENSOR_DEVICE_INDEX]) return 0;
    int requires_grad = requires_grad_inline(impl);
    if (requires_grad < 0) {
        if constexpr (Leaf) return match_with_calls(obj, want, memo);
        requires_grad = impl->requires_grad() ? 1 : 0;
    }
    if (requires_grad != want[TW_TENSOR_REQUIRES_GRAD]) return 0;
    // TensorImpl::layout()'s test, its policy Default: no such key is kStrided.
    if (key_set.has_any(c10::sparse_ks | c10::sparse_csr_ks | c10::mkldnn_ks)) return 0;
    // Symbolic sizes force CustomSizes (refresh_sizes_strides_policy), so the window already
    // refused them; tested anyway, as the *_default accessors do, at the cost of one load.
    if (impl->has_symbolic_sizes_strides()) return 0;
    const c10::impl::SizesAndStrides& ss = Fields::sizes_and_strides(impl);
    const int64_t ndim = static_cast<int64_t>(ss.size());
    if (ndim != want[TW_TENSOR_NDIM]) return 0;
    const int64_t* size = ss.sizes_data();
    const int64_t* stride = ss.strides_data();
    const int64_t* pairs = want + TW_TENSOR_HEADER;
    // Equality first: the common case (a static dimension that holds) costs one comparison each.
    // Inlined by force: GCC 12 called it otherwise (about 40 instructions a tensor more).
    auto holds = [&](int64_t i) __attribute__((always_inline)) {
        const int64_t want_size = pairs[2 * i], want_stride = pairs[2 * i + 1];
        return (want_size == size[i] || want_size == TW_TENSOR_ANY) &&
               (want_stride == stride[i] || want_stride == TW_TENSOR_ANY);
    };
    // Unrolled for the ranks SizesAndStrides keeps inline (a model's tensors), in order, up to the
    // rank: no loop counter and no loop setup (about 3 instructions a dimension).
    if (ndim <= 5) {
        if (ndim >= 1 && !holds(0)) return 0;
        if (ndim >= 2 && !holds(1)) return 0;
        if (ndim >= 3 && !holds(2)) return 0;
        if (ndim >= 4 && !holds(3)) return 0;
        if (ndim >= 5 && !holds(4)) return 0;
    } else {
        for (int64_t i = 0; i < ndim; ++i)
            if (!holds(i)) return 0;
    }
    const int64_t offset = want[TW_TENSOR_STORAGE_OFFSET];
    return offset == TW_TENSOR_ANY || offset == Fields::storage_offset(impl) ? 1 : 0;
}

}  // namespace

int tensor_matches(PyObject* obj, const int64_t* want, TwKeyMemo* memo) noexcept {
    return match_fields<true>(obj, want, memo);
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

namespace {

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

}  // namespace

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

void load_tensor_policies() noexcept {
    try {
        probe_policy_bits();
        probe_policy_window();
        probe_autograd_route();
    } catch (...) {
        g_autograd = AutogradRoute{};      // torch's accessor for every tensor
        g_policy_window = PolicyWindow{};  // the full test for every tensor
        g_policy_bits.ok = false;          // every tensor with the Python key counts as read by code
    }
}

bool policy_window_found() noexcept { return g_policy_window.mask != ~uint64_t{0}; }

bool autograd_route_found() noexcept { return g_autograd.ok; }

}  // namespace tripwire::torch_adapter
