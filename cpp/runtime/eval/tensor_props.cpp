// tripwire/cpp/runtime/eval/tensor_props.cpp -- tensor/array property steps (see the header).
#include "runtime/eval/tensor_props.hpp"

#include <cstring>

#include "runtime/tensors/readers.hpp"

namespace tripwire::runtime {
namespace {

TensorPropertyReader g_reader = nullptr;

Fetched owned_or_error(PyObject* v) {
    return v != nullptr ? Fetched{v, true, FetchStatus::Ok} : Fetched{nullptr, false, FetchStatus::Error};
}

// container[index] for a property sequence (a torch.Size, a tuple of strides): a LookupError is
// a missing value (an index past the rank), as for any other item step.
Fetched item_of(PyObject* seq, std::int64_t index) {
    PyObject* key = PyLong_FromLongLong(index);
    if (key == nullptr) return {nullptr, false, FetchStatus::Error};
    PyObject* item = PyObject_GetItem(seq, key);
    Py_DECREF(key);
    if (item != nullptr) return {item, true, FetchStatus::Ok};
    if (!PyErr_ExceptionMatches(PyExc_LookupError)) return {nullptr, false, FetchStatus::Error};
    PyErr_Clear();
    return {nullptr, false, FetchStatus::Missing};
}

// Call v.<name>() (the object's own method, looked up as Python would).
Fetched call_method(PyObject* v, PyObject* name) {
    if (name == nullptr) return {nullptr, false, FetchStatus::Error};
    PyObject* out = PyObject_CallMethodNoArgs(v, name);
    if (out == nullptr && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();  // no such method: a missing value, as for any attribute
        return {nullptr, false, FetchStatus::Missing};
    }
    return owned_or_error(out);
}

Fetched get_attr(PyObject* v, PyObject* name) {
    if (name == nullptr) return {nullptr, false, FetchStatus::Error};
    PyObject* out = PyObject_GetAttr(v, name);
    if (out == nullptr && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        return {nullptr, false, FetchStatus::Missing};
    }
    return owned_or_error(out);
}

}  // namespace

void set_tensor_property_reader(TensorPropertyReader reader) { g_reader = reader; }
TensorPropertyReader tensor_property_reader() { return g_reader; }

bool is_numpy_array(PyObject* v) {
    PyObject* mro = Py_TYPE(v)->tp_mro;
    if (mro == nullptr || !PyTuple_Check(mro)) return false;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(mro); ++i) {
        PyObject* t = PyTuple_GET_ITEM(mro, i);
        if (PyType_Check(t) && std::strcmp(reinterpret_cast<PyTypeObject*>(t)->tp_name, "numpy.ndarray") == 0)
            return true;
    }
    return false;
}

Fetched fetch_tensor_property(const RuntimeStep& step, PyObject* v) {
    if (g_reader != nullptr) {
        std::int64_t value = 0;
        switch (g_reader(v, step.kind, step.index, &value)) {
            case PropertyRead::Value: return owned_or_error(PyLong_FromLongLong(value));
            case PropertyRead::Missing: return {nullptr, false, FetchStatus::Missing};
            case PropertyRead::Unknown: break;
        }
    }
    // The generic path: the object's own Python methods. Names interned once (immortal enough:
    // the module never unloads them).
    static PyObject* const size_name = PyUnicode_InternFromString("size");
    static PyObject* const stride_name = PyUnicode_InternFromString("stride");
    static PyObject* const offset_name = PyUnicode_InternFromString("storage_offset");
    static PyObject* const shape_name = PyUnicode_InternFromString("shape");
    static PyObject* const strides_name = PyUnicode_InternFromString("strides");
    const bool array = is_numpy_array(v);
    switch (step.kind) {
        case core::StepKind::Size:
        case core::StepKind::Stride: {
            const bool size = step.kind == core::StepKind::Size;
            Fetched seq = array ? get_attr(v, size ? shape_name : strides_name)
                                : call_method(v, size ? size_name : stride_name);
            if (seq.status != FetchStatus::Ok) return seq;
            Fetched item = item_of(seq.value, step.index);
            Py_DECREF(seq.value);
            return item;
        }
        case core::StepKind::StorageOffset:
            if (array) return {nullptr, false, FetchStatus::Missing};
            return call_method(v, offset_name);
        default: return {nullptr, false, FetchStatus::Missing};
    }
}

Fetched fetch_cpp_tensor_step(const RuntimeStep& step, PyObject* v) {
    const TwTorchAdapter* ad = torch_adapter();
    if (ad == nullptr) return {nullptr, false, FetchStatus::Missing};
    if (step.kind == core::StepKind::Grad) {
        PyObject* g = ad->cpp_tensor_grad(v);
        if (g == nullptr) return {nullptr, false, FetchStatus::Missing};
        return {g, true, FetchStatus::Ok};
    }
    int prop = 2;
    if (step.kind == core::StepKind::TensorSize) prop = 0;
    if (step.kind == core::StepKind::TensorStride) prop = 1;
    std::int64_t value = 0;
    if (ad->cpp_tensor_property(v, prop, step.index, &value) != 1) {
        return {nullptr, false, FetchStatus::Missing};
    }
    return owned_or_error(PyLong_FromLongLong(value));
}

}  // namespace tripwire::runtime
