// tripwire/cpp/runtime/eval/locals.cpp -- Locals's out-of-line parts.
#include "runtime/eval/locals.hpp"

namespace tripwire::runtime {

Py_ssize_t index_of_name(PyObject* names, Py_ssize_t begin, Py_ssize_t end, PyObject* name) {
    for (Py_ssize_t i = begin; i < end; ++i)
        if (PyTuple_GET_ITEM(names, i) == name) return i;
    // A name that is not interned (built at run time): compare by value, str against str.
    if (!PyUnicode_CheckExact(name)) return -1;
    for (Py_ssize_t i = begin; i < end; ++i)
        if (PyUnicode_Compare(PyTuple_GET_ITEM(names, i), name) == 0) return i;
    return -1;
}

PyObject* Locals::argument_slow(PyObject* name, Py_ssize_t* hint) const {
    const Py_ssize_t i = index_of_name(names, 0, count, name);
    if (i < 0) return nullptr;
    *hint = i;
    return values[i];
}

Ref Locals::as_mapping() const {
    if (!is_arguments()) return Ref::borrow(mapping);
    Ref d = Ref::steal(PyDict_New());
    if (!d) return d;
    for (Py_ssize_t i = 0; i < count; ++i) {
        if (values[i] == nullptr) continue;
        if (PyDict_SetItem(d.get(), PyTuple_GET_ITEM(names, i), values[i]) < 0) return Ref();
    }
    return d;
}

}  // namespace tripwire::runtime
