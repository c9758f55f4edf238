// tripwire/cpp/runtime/equals.cpp -- EQUALS_MATCH: structural, type-exact constant comparison.
//
// Python's own `v == c` on containers would call __eq__ of whatever the user put inside them.
// We compare element by element and require exact types first, so only the interpreter's own
// comparisons of int/float/str/... ever run: a check cannot call user code through EQUALS_MATCH.
#include <cmath>

#include "predicates.hpp"

namespace tripwire::runtime {
namespace {

PyObject* enum_base() {
    // Borrowed for the life of the interpreter: the enum module is never unloaded.
    static PyObject* base = [] {
        PyObject* mod = PyImport_ImportModule("enum");
        if (mod == nullptr) return static_cast<PyObject*>(nullptr);
        PyObject* e = PyObject_GetAttrString(mod, "Enum");
        Py_DECREF(mod);
        return e;
    }();
    return base;
}

bool is_scalar_type(PyTypeObject* t) {
    return t == &PyLong_Type || t == &PyFloat_Type || t == &PyComplex_Type || t == &PyUnicode_Type ||
           t == &PyBytes_Type || t == &PyBool_Type || t == Py_TYPE(Py_None) || t == Py_TYPE(Py_Ellipsis) ||
           t == &PyRange_Type;
}

bool nan_equal(double x, double y) { return x == y || (std::isnan(x) && std::isnan(y)); }

// Each element of `cs` has an equals_match partner among `vs` (sizes already equal).
int partner_match(PyObject* vs_list, PyObject* cs_list) {
    const Py_ssize_t n = PyList_GET_SIZE(cs_list);
    for (Py_ssize_t i = 0; i < n; ++i) {
        bool found = false;
        for (Py_ssize_t j = 0; j < PyList_GET_SIZE(vs_list) && !found; ++j) {
            const int r = equals_match(PyList_GET_ITEM(vs_list, j), PyList_GET_ITEM(cs_list, i));
            if (r < 0) return -1;
            found = r == 1;
        }
        if (!found) return 0;
    }
    return 1;
}

int all_constant(PyObject* iterable_list) {
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(iterable_list); ++i) {
        const int r = is_constant(PyList_GET_ITEM(iterable_list, i));
        if (r != 1) return r;
    }
    return 1;
}

int set_match(PyObject* v, PyObject* c) {
    if (PySet_GET_SIZE(v) != PySet_GET_SIZE(c)) return 0;
    PyObject* vs = PySequence_List(v);
    if (vs == nullptr) return -1;
    PyObject* cs = PySequence_List(c);
    if (cs == nullptr) {
        Py_DECREF(vs);
        return -1;
    }
    int r = all_constant(vs);
    if (r == 1) r = partner_match(vs, cs);
    Py_DECREF(vs);
    Py_DECREF(cs);
    return r;
}

int dict_match(PyObject* v, PyObject* c) {
    if (PyDict_GET_SIZE(v) != PyDict_GET_SIZE(c)) return 0;
    // Fast path: same keys in the same order (the common case for configs).
    Py_ssize_t pv = 0, pc = 0;
    PyObject *kv, *vv, *kc, *vc;
    bool in_order = true;
    while (PyDict_Next(v, &pv, &kv, &vv) && PyDict_Next(c, &pc, &kc, &vc)) {
        int r = equals_match(kv, kc);
        if (r < 0) return -1;
        if (r == 0) {
            in_order = false;
            break;
        }
        r = equals_match(vv, vc);
        if (r != 1) return r;
    }
    if (in_order) return 1;
    // Keys in another order: every key of v must be a constant, and each key of c is paired with
    // its exact (equals_match) partner among v's keys by walking v, never by hashing: a constant
    // key may be an enum member whose class defines __hash__/__eq__ in Python, and a lookup would
    // call them. O(n^2), only for dicts whose keys are out of order.
    PyObject* vkeys = PyDict_Keys(v);
    if (vkeys == nullptr) return -1;
    int r = all_constant(vkeys);
    Py_DECREF(vkeys);
    Py_ssize_t qc = 0;
    while (r == 1 && PyDict_Next(c, &qc, &kc, &vc)) {
        Py_ssize_t qv = 0;
        bool found = false;
        while (!found && PyDict_Next(v, &qv, &kv, &vv)) {
            const int q = equals_match(kv, kc);
            if (q < 0) return -1;
            found = q == 1;
        }
        r = found ? equals_match(vv, vc) : 0;
    }
    return r;
}

}  // namespace

namespace {
int is_constant_container(PyObject* v, PyTypeObject* t);
}  // namespace

int is_constant(PyObject* v) {
    PyTypeObject* t = Py_TYPE(v);
    if (is_scalar_type(t)) return 1;
    // Values checked here come from user input (a set's elements, a dict's keys) and may nest
    // arbitrarily deep: a RecursionError (guard fails) instead of overflowing the C stack.
    if (Py_EnterRecursiveCall(" in tripwire's constant check")) return -1;
    const int r = is_constant_container(v, t);
    Py_LeaveRecursiveCall();
    return r;
}

namespace {
int is_constant_container(PyObject* v, PyTypeObject* t) {
    if (t == &PyTuple_Type || t == &PyList_Type) {
        for (Py_ssize_t i = 0; i < Py_SIZE(v); ++i) {
            PyObject* item = t == &PyTuple_Type ? PyTuple_GET_ITEM(v, i) : PyList_GET_ITEM(v, i);
            Py_INCREF(item);  // a list can shrink under us only through user code; stay safe anyway
            const int r = is_constant(item);
            Py_DECREF(item);
            if (r != 1) return r;
            if (t == &PyList_Type && i + 1 > PyList_GET_SIZE(v)) break;
        }
        return 1;
    }
    if (t == &PySlice_Type) {
        auto* s = reinterpret_cast<PySliceObject*>(v);
        for (PyObject* part : {s->start, s->stop, s->step}) {
            const int r = is_constant(part);
            if (r != 1) return r;
        }
        return 1;
    }
    if (t == &PySet_Type || t == &PyFrozenSet_Type) {
        Py_ssize_t pos = 0;
        PyObject* key;
        Py_hash_t hash;
        while (_PySet_NextEntry(v, &pos, &key, &hash)) {
            const int r = is_constant(key);
            if (r != 1) return r;
        }
        return 1;
    }
    if (t == &PyDict_Type) {
        Py_ssize_t pos = 0;
        PyObject *k, *x;
        while (PyDict_Next(v, &pos, &k, &x)) {
            int r = is_constant(k);
            if (r == 1) r = is_constant(x);
            if (r != 1) return r;
        }
        return 1;
    }
    PyObject* base = enum_base();
    if (base == nullptr) return -1;
    // An exact-type check against Enum's metaclass machinery would run user code; instead ask
    // the type's MRO, which is a plain tuple walk.
    return PyType_IsSubtype(t, reinterpret_cast<PyTypeObject*>(base)) ? 1 : 0;
}
}  // namespace

int equals_match(PyObject* v, PyObject* c) {
    PyTypeObject* t = Py_TYPE(c);
    if (Py_TYPE(v) != t) return 0;
    if (v == c) return 1;  // same object of the same type (constants are private copies)
    if (t == &PyFloat_Type) return nan_equal(PyFloat_AS_DOUBLE(v), PyFloat_AS_DOUBLE(c)) ? 1 : 0;
    if (t == &PyComplex_Type) {
        const Py_complex x = PyComplex_AsCComplex(v), y = PyComplex_AsCComplex(c);
        return nan_equal(x.real, y.real) && nan_equal(x.imag, y.imag) ? 1 : 0;
    }
    if (t == &PyRange_Type) {
        // start, stop and step, not the items: range(0) == range(5, 5) in Python, but code
        // specialised for one may read .stop and must not be reused for the other.
        for (const char* field : {"start", "stop", "step"}) {
            PyObject* a = PyObject_GetAttrString(v, field);
            PyObject* b = a ? PyObject_GetAttrString(c, field) : nullptr;
            const int r = b ? PyObject_RichCompareBool(a, b, Py_EQ) : -1;
            Py_XDECREF(a);
            Py_XDECREF(b);
            if (r != 1) return r;
        }
        return 1;
    }
    if (is_scalar_type(t)) return PyObject_RichCompareBool(v, c, Py_EQ);
    if (t == &PyTuple_Type || t == &PyList_Type) {
        const Py_ssize_t n = Py_SIZE(c);
        if (Py_SIZE(v) != n) return 0;
        for (Py_ssize_t i = 0; i < n; ++i) {
            if (t == &PyList_Type && (i >= PyList_GET_SIZE(v) || i >= PyList_GET_SIZE(c))) return 0;
            PyObject* x = t == &PyTuple_Type ? PyTuple_GET_ITEM(v, i) : PyList_GET_ITEM(v, i);
            PyObject* y = t == &PyTuple_Type ? PyTuple_GET_ITEM(c, i) : PyList_GET_ITEM(c, i);
            Py_INCREF(x);
            const int r = equals_match(x, y);
            Py_DECREF(x);
            if (r != 1) return r;
        }
        return 1;
    }
    if (t == &PySlice_Type) {
        auto* a = reinterpret_cast<PySliceObject*>(v);
        auto* b = reinterpret_cast<PySliceObject*>(c);
        int r = equals_match(a->start, b->start);
        if (r == 1) r = equals_match(a->stop, b->stop);
        if (r == 1) r = equals_match(a->step, b->step);
        return r;
    }
    if (t == &PySet_Type || t == &PyFrozenSet_Type) return set_match(v, c);
    if (t == &PyDict_Type) return dict_match(v, c);
    return 0;  // enum members and other identity constants: v is c was checked above
}

}  // namespace tripwire::runtime
