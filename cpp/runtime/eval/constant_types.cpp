// tripwire/cpp/runtime/eval/constant_types.cpp -- the registry of extra EQUALS_MATCH constant types.
#include "runtime/eval/constant_types.hpp"

namespace tripwire::runtime {
namespace {

std::vector<ConstantType>& registry() {
    static auto* r = new std::vector<ConstantType>();  // lives until process exit
    return *r;
}

bool builtin_constant_type(PyTypeObject* t) {
    return t == &PyLong_Type || t == &PyFloat_Type || t == &PyComplex_Type || t == &PyUnicode_Type ||
           t == &PyBytes_Type || t == &PyBool_Type || t == Py_TYPE(Py_None) || t == Py_TYPE(Py_Ellipsis) ||
           t == &PyRange_Type || t == &PyTuple_Type || t == &PyList_Type || t == &PySlice_Type ||
           t == &PySet_Type || t == &PyFrozenSet_Type || t == &PyDict_Type;
}

}  // namespace

const char* constant_compare_name(ConstantCompare c) {
    switch (c) {
        case ConstantCompare::Identity: return "identity";
        case ConstantCompare::Tuple: return "tuple";
        case ConstantCompare::Native: return "native";
        case ConstantCompare::RichCompare: return "richcompare";
    }
    return "unknown";
}

bool register_constant_type(PyTypeObject* t, ConstantCompare how, NativeEqual equal, bool subclasses,
                            NativeAccept accept) {
    if (t == nullptr) {
        PyErr_SetString(PyExc_TypeError, "register_constant_type needs a type");
        return false;
    }
    if (builtin_constant_type(t)) {
        PyErr_Format(PyExc_ValueError, "%s is a built-in constant type", t->tp_name);
        return false;
    }
    switch (how) {
        case ConstantCompare::Tuple:
            if (!PyType_IsSubtype(t, &PyTuple_Type)) {
                PyErr_Format(PyExc_TypeError, "%s is not a tuple subtype", t->tp_name);
                return false;
            }
            break;
        case ConstantCompare::RichCompare:
            // A Python-level class's tp_richcompare calls its __eq__: user code.
            if (PyType_HasFeature(t, Py_TPFLAGS_HEAPTYPE) || t->tp_richcompare == nullptr) {
                PyErr_Format(PyExc_TypeError,
                             "%s: 'richcompare' is only for static C types with their own comparison",
                             t->tp_name);
                return false;
            }
            break;
        case ConstantCompare::Native:
            if (equal == nullptr) {
                PyErr_SetString(PyExc_ValueError, "a native constant type needs its comparison");
                return false;
            }
            break;
        case ConstantCompare::Identity: break;
    }
    for (ConstantType& e : registry()) {
        if (e.type == t) {
            e = ConstantType{t, how, equal, accept, subclasses};
            return true;
        }
    }
    Py_INCREF(t);
    registry().push_back(ConstantType{t, how, equal, accept, subclasses});
    return true;
}

const ConstantType* constant_type_of(PyTypeObject* t) {
    for (const ConstantType& e : registry()) {
        if (e.type == t) return &e;
    }
    for (const ConstantType& e : registry()) {
        // PyType_IsSubtype walks the MRO tuple: no user code, no allocation.
        if (e.subclasses && PyType_IsSubtype(t, e.type)) return &e;
    }
    return nullptr;
}

const std::vector<ConstantType>& constant_types() { return registry(); }

}  // namespace tripwire::runtime
