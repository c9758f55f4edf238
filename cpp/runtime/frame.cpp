// tripwire/cpp/runtime/frame.cpp -- Frame's out-of-line parts.
#include "frame.hpp"

namespace tripwire::runtime {

PyObject* Frame::argument_slow(PyObject* name, Py_ssize_t* hint) const {
    for (Py_ssize_t i = 0; i < count; ++i) {
        if (PyTuple_GET_ITEM(names, i) == name) {
            *hint = i;
            return values[i];
        }
    }
    // A name that is not interned (built at run time): compare by value. Both are exact str
    // (the pool and the binder only hold those), so no user __eq__ runs.
    for (Py_ssize_t i = 0; i < count; ++i) {
        PyObject* n = PyTuple_GET_ITEM(names, i);
        if (PyUnicode_CheckExact(name) && PyUnicode_Compare(n, name) == 0) {
            *hint = i;
            return values[i];
        }
    }
    return nullptr;
}

Ref Frame::as_mapping() const {
    if (!is_arguments()) return Ref::borrow(locals);
    Ref d = Ref::steal(PyDict_New());
    if (!d) return d;
    for (Py_ssize_t i = 0; i < count; ++i) {
        if (values[i] == nullptr) continue;
        if (PyDict_SetItem(d.get(), PyTuple_GET_ITEM(names, i), values[i]) < 0) return Ref();
    }
    return d;
}

}  // namespace tripwire::runtime
