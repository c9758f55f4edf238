// tripwire/cpp/adapters/torch/dispatch_keys.cpp -- the torch adapter's dispatch key sets.
//
// The thread-local include/exclude sets applied to a raw key set, and saved and restored around a
// compiled call (torch.compile's wrapper); DISPATCH_KEY_SET_MATCH's read of a
// torch._C.DispatchKeySet in place (verified at load); and torch's hidden "dispatch mode without
// ignore_compile_internals" flag getter, found in libtorch_python's ELF symbol table.
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/dynamo/guards.h>

#include <pybind11/pybind11.h>

#include <cstdint>
#include <type_traits>

#include "adapters/torch/adapter.hpp"
#include "adapters/torch/hidden_symbol.hpp"

namespace tripwire::torch_adapter {

namespace {

// -- torch's "dispatch mode without ignore_compile_internals" flag -------------------------------
//
// torch's guards keep the Python dispatch keys only while a dispatch mode without
// ignore_compile_internals is active, a C++ thread_local of libtorch_python read through
// get_is_in_mode_without_ignore_compile_internals(), which torch does not export (hidden
// visibility). The adapter finds it in libtorch_python's ELF symbol table (hidden_symbol.hpp; the
// library is the one holding THPVariableClass) and hands it to the core, which verifies it against
// torch's Python setter before the first use (runtime/tensors/mode_flag.hpp).
static_assert(std::is_same_v<decltype(&torch::dynamo::get_is_in_mode_without_ignore_compile_internals),
                             ModeFlagGetter>);
constexpr char kModeFlagGetter[] = "_ZN5torch6dynamo47get_is_in_mode_without_ignore_compile_internalsEv";

}  // namespace

ModeFlagGetter find_mode_flag_getter() {
    // A symbol's address as a function pointer (ELF's rules; dlsym's own convention).
    // NOLINTNEXTLINE(cppcoreguidelines-pro-type-reinterpret-cast)
    return reinterpret_cast<ModeFlagGetter>(
        hidden_symbol::hidden_function(&THPVariableClass, kModeFlagGetter));
}

uint64_t apply_local_keys(uint64_t raw, int mask_python_keys) noexcept {
    return apply_local(c10::DispatchKeySet(c10::DispatchKeySet::RAW, raw), mask_python_keys).raw_repr();
}

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

namespace {

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

}  // namespace

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
PyTypeObject* verify_key_set_reader() {
    PyObject* c = PyImport_ImportModule("torch._C");
    if (c == nullptr) {
        PyErr_Clear();
        return nullptr;
    }
    PyObject* type = PyObject_GetAttrString(c, "DispatchKeySet");
    Py_DECREF(c);
    if (type == nullptr || !PyType_Check(type)) {
        Py_XDECREF(type);
        PyErr_Clear();
        return nullptr;
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
    return g_key_set_type;
}

}  // namespace tripwire::torch_adapter
