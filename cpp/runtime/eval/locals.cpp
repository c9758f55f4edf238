// tripwire/cpp/runtime/eval/locals.cpp -- Locals's out-of-line parts.
#include "runtime/eval/locals.hpp"

namespace tripwire::runtime {

Py_ssize_t index_of_name(PyObject* names, Py_ssize_t begin, Py_ssize_t end, PyObject* name, bool last) {
    const Py_ssize_t n = end - begin;
    auto at = [&](Py_ssize_t k) { return last ? end - 1 - k : begin + k; };
    for (Py_ssize_t k = 0; k < n; ++k)
        if (PyTuple_GET_ITEM(names, at(k)) == name) return at(k);
    // A name that is not interned (built at run time): compare by value, str against str.
    if (!PyUnicode_CheckExact(name)) return -1;
    for (Py_ssize_t k = 0; k < n; ++k)
        if (PyUnicode_Compare(PyTuple_GET_ITEM(names, at(k)), name) == 0) return at(k);
    return -1;
}

Locals Locals::of_frame(PyObject* const* localsplus, PyCodeObject* code, PyObject* closure,
                        PyObject* globals) {
    Locals l;
    l.values = localsplus;
    l.names = code->co_localsplusnames;
    l.count = code->co_nlocalsplus;
    l.kinds = reinterpret_cast<const unsigned char*>(PyBytes_AS_STRING(code->co_localspluskinds));
    l.free_begin = code->co_nlocalsplus - code->co_nfreevars;
    // A closure that does not match the code (it always does for a frame's own function) leaves
    // the free variables unset rather than read out of bounds.
    if (closure != nullptr && PyTuple_Check(closure) && PyTuple_GET_SIZE(closure) == code->co_nfreevars) {
        l.closure = closure;
        // Names in co_localsplusnames are interned by the code constructor: identity decides.
        for (Py_ssize_t f = l.free_begin; f < l.count && !l.free_shadows; ++f) {
            PyObject* free_name = PyTuple_GET_ITEM(l.names, f);
            for (Py_ssize_t i = 0; i < l.free_begin; ++i) {
                if (PyTuple_GET_ITEM(l.names, i) == free_name && (l.kinds[i] & kFastHiddenKind) == 0) {
                    l.free_shadows = true;
                    break;
                }
            }
        }
    } else {
        l.count = l.free_begin;
    }
    l.frame_globals = globals;
    return l;
}

PyObject* Locals::argument_slow(PyObject* name, Py_ssize_t* hint) const {
    // The last visible slot of the name (see the header). A hidden slot's name is invisible.
    Py_ssize_t i = count;
    for (;;) {
        i = index_of_name(names, 0, i, name, /*last=*/true);
        if (i < 0) return nullptr;
        if (kinds == nullptr || (kinds[i] & kFastHiddenKind) == 0) break;
    }
    *hint = i;
    return i < free_begin ? values[i] : free_value(i);
}

Ref Locals::as_mapping() const {
    if (!is_arguments()) return Ref::borrow(mapping);
    Ref d = Ref::steal(PyDict_New());
    if (!d) return d;
    for (Py_ssize_t i = 0; i < count; ++i) {
        if (kinds != nullptr && (kinds[i] & kFastHiddenKind) != 0) continue;
        PyObject* v = i < free_begin ? values[i] : free_value(i);
        if (v == nullptr) continue;
        if (PyDict_SetItem(d.get(), PyTuple_GET_ITEM(names, i), v) < 0) return Ref();
    }
    return d;
}

}  // namespace tripwire::runtime
