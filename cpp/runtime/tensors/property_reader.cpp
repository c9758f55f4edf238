// tripwire/cpp/runtime/tensors/property_reader.cpp -- SIZE/STRIDE/STORAGE_OFFSET read in C++ for
// plain tensors and numpy arrays (see the header for when it answers and why that is exact).
#include "runtime/tensors/property_reader.hpp"

#include "runtime/eval/dict_hint.hpp"
#include "runtime/tensors/readers.hpp"

namespace tripwire::runtime {
namespace {

// torch.Tensor and torch.nn.Parameter, with the version tag their class dicts (and their bases')
// had when their three methods were last found to be TensorBase's.
struct PlainType {
    PyTypeObject* type = nullptr;
    unsigned int version_tag = 0;
};
constexpr int kMaxPlainTypes = 4;
PlainType g_plain[kMaxPlainTypes];
int g_n_plain = 0;
// TensorBase's size, stride and storage_offset descriptors (held for the process; TensorBase is a
// static type, so they never change).
PyObject* g_methods[3] = {nullptr, nullptr, nullptr};

// The method names, interned once (the module never releases them).
PyObject* method_name(core::StepKind kind) {
    static PyObject* const size = PyUnicode_InternFromString("size");
    static PyObject* const stride = PyUnicode_InternFromString("stride");
    static PyObject* const offset = PyUnicode_InternFromString("storage_offset");
    switch (kind) {
        case core::StepKind::Size: return size;
        case core::StepKind::Stride: return stride;
        default: return offset;
    }
}

constexpr core::StepKind kKinds[3] = {core::StepKind::Size, core::StepKind::Stride,
                                      core::StepKind::StorageOffset};

// Whether `tp` resolves the three names to TensorBase's descriptors. _PyType_Lookup reads the
// type cache or the class dicts of the MRO, whose keys are exact strs (type_setattro copies a str
// subclass), so no user code runs; it assigns the type a version tag when it has none.
bool resolves_to_torch_methods(PyTypeObject* tp) {
    for (int k = 0; k < 3; ++k) {
        if (_PyType_Lookup(tp, method_name(kKinds[k])) != g_methods[k]) return false;
    }
    return tp->tp_version_tag != 0;
}

bool plain_tensor_type(PyTypeObject* tp) {
    for (int i = 0; i < g_n_plain; ++i) {
        if (g_plain[i].type != tp) continue;
        // A class-attribute assignment on the type or a base resets its tag, and a new tag is
        // never one handed out before: an unchanged tag means unchanged methods.
        if (tp->tp_version_tag == g_plain[i].version_tag) return true;
        // Changed (a library added a method to torch.Tensor, a test patched and restored size):
        // look again, and trust the new tag only if the methods are still torch's.
        if (!resolves_to_torch_methods(tp)) return false;
        g_plain[i].version_tag = tp->tp_version_tag;
        return true;
    }
    return false;
}

// seq[index] with Python's indexing of a tuple / torch.Size: negative from the end; out of range
// is a missing value (IndexError on the generic path).
PropertyRead element(const std::int64_t* seq, std::int64_t n, std::int64_t index, std::int64_t* out) {
    if (index < 0) index += n;
    if (index < 0 || index >= n) return PropertyRead::Missing;
    *out = seq[index];
    return PropertyRead::Value;
}

PropertyRead read_array(PyObject* v, core::StepKind kind, std::int64_t index, std::int64_t* out) {
    ArrayView a;
    if (!read_array_struct(v, a)) return PropertyRead::Unknown;
    switch (kind) {
        case core::StepKind::Size: return element(a.sizes, a.ndim, index, out);
        case core::StepKind::Stride: return element(a.strides, a.ndim, index, out);  // bytes, as v.strides
        case core::StepKind::StorageOffset: return PropertyRead::Missing;            // arrays have none
        default: return PropertyRead::Unknown;
    }
}

PropertyRead read_tensor(const TwTorchAdapter* ad, PyObject* v, core::StepKind kind, std::int64_t index,
                         std::int64_t* out) {
    // Under a torch-function mode, x.size() calls the mode's __torch_function__.
    if (ad->function_mode_stack_len() != 0) return PropertyRead::Unknown;
    // An instance attribute named like the method would be what Python calls.
    if (instance_attr_absent(v, method_name(kind)) != 1) return PropertyRead::Unknown;
    TwTensorFields f;
    if (ad->tensor_fields(v, &f) != 1) return PropertyRead::Unknown;
    switch (kind) {
        case core::StepKind::Size: return element(f.sizes, f.ndim, index, out);
        case core::StepKind::Stride:
            // torch raises for layouts without strides: the generic path says so.
            if (f.has_strides == 0) return PropertyRead::Unknown;
            return element(f.strides, f.ndim, index, out);
        case core::StepKind::StorageOffset:
            if (f.has_strides == 0) return PropertyRead::Unknown;
            *out = f.storage_offset;
            return PropertyRead::Value;
        default: return PropertyRead::Unknown;
    }
}

}  // namespace

int register_plain_tensor_types(PyObject* const* types, int n) {
    const TwTorchAdapter* ad = torch_adapter();
    if (ad == nullptr) return 0;
    // instance_attr_absent reads instance storage through the verified layout mirror: verify it
    // now (once per process; a GuardSet does it too), or the reader never answers.
    verify_dict_hints();
    PyTypeObject* base = ad->tensor_base_type;
    for (int k = 0; k < 3; ++k) {
        PyObject* m = _PyType_Lookup(base, method_name(kKinds[k]));
        if (m == nullptr) return 0;
        if (g_methods[k] == nullptr) g_methods[k] = Py_NewRef(m);
        if (g_methods[k] != m) return 0;
    }
    for (int i = 0; i < n && g_n_plain < kMaxPlainTypes; ++i) {
        if (!PyType_Check(types[i])) continue;
        auto* tp = reinterpret_cast<PyTypeObject*>(types[i]);
        if (!PyType_IsSubtype(tp, base) || !resolves_to_torch_methods(tp)) continue;
        bool known = false;
        for (int j = 0; j < g_n_plain; ++j) known = known || g_plain[j].type == tp;
        if (known) continue;
        g_plain[g_n_plain++] = {reinterpret_cast<PyTypeObject*>(Py_NewRef(tp)), tp->tp_version_tag};
    }
    return g_n_plain;
}

void install_property_reader() { set_tensor_property_reader(&read_tensor_property); }

PropertyRead read_tensor_property(PyObject* v, core::StepKind kind, std::int64_t index, std::int64_t* out) {
    // The test switch that makes sets read through Python makes these steps do so too.
    if (force_python_readers()) return PropertyRead::Unknown;
    PyTypeObject* tp = Py_TYPE(v);
    PyTypeObject* ndarray = numpy_ndarray_type();
    if (ndarray != nullptr && tp == ndarray) return read_array(v, kind, index, out);
    const TwTorchAdapter* ad = torch_adapter();
    if (ad == nullptr || !plain_tensor_type(tp)) return PropertyRead::Unknown;
    return read_tensor(ad, v, kind, index, out);
}

}  // namespace tripwire::runtime
