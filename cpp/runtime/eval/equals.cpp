// tripwire/cpp/runtime/eval/equals.cpp -- EQUALS_MATCH: structural, type-exact constant comparison.
//
// Python's own `v == c` on containers would call __eq__ of whatever the user put inside them.
// We compare element by element and require exact types first, so only the interpreter's own
// comparisons of int/float/str/... ever run: a check cannot call user code through EQUALS_MATCH.
//
// Nothing here allocates a Python object either (docs/cpp.md, "Regions without user code"): on
// CPython 3.11 allocating a GC-tracked object (a list, a set iterator) can start a collection,
// which runs finalizers and weakref callbacks, i.e. user code, while the fast pass and the tree
// walk hold borrowed references. Sets are read straight from their table and dicts with
// PyDict_Next; the only scratch memory is a C++ bitmap.
//
// Floats (and complex components) match when they are the same number: NaN matches NaN, and 0.0
// and -0.0 do not match, though they are ==. Code specialised for a zero can tell its sign:
// 1 / (x * s) in a tensor op is +inf or -inf, and so are copysign, atan2 and repr.
//
// Unordered containers are matched one to one. equals_match is an equivalence relation on
// constants (NaN matches NaN, so it is not Python's ==, under which distinct NaNs are unequal and
// may all sit in one set), and for an equivalence relation a greedy matching that pairs each
// expected element with any unused equivalent actual element finds a perfect matching whenever
// one exists: only the number of elements per class matters.
#include <cmath>
#include <cstdint>
#include <vector>

#include "runtime/eval/constant_types.hpp"
#include "runtime/eval/guard_kinds.hpp"

namespace tripwire::runtime {
namespace {

bool is_scalar_type(PyTypeObject* t) {
    return t == &PyLong_Type || t == &PyFloat_Type || t == &PyComplex_Type || t == &PyUnicode_Type ||
           t == &PyBytes_Type || t == &PyBool_Type || t == Py_TYPE(Py_None) || t == Py_TYPE(Py_Ellipsis) ||
           t == &PyRange_Type;
}

bool same_float(double x, double y) {
    return (x == y && std::signbit(x) == std::signbit(y)) || (std::isnan(x) && std::isnan(y));
}

}  // namespace

/// equals_match at container depth `depth` (the recursion).
int match_at(PyObject* v, PyObject* c, int depth);

namespace {

/// "Used" flags for the actual side of a one-to-one matching: a word on the stack for the common
/// small container, C++ heap memory (never a Python object) beyond 64 elements.
class UsedSet {
  public:
    explicit UsedSet(Py_ssize_t n) {
        if (n > 64) big_.assign(static_cast<std::size_t>(n), 0);
    }
    bool test(Py_ssize_t i) const {
        return big_.empty() ? ((small_ >> i) & 1U) != 0 : big_[static_cast<std::size_t>(i)] != 0;
    }
    void set(Py_ssize_t i) {
        if (big_.empty()) {
            small_ |= std::uint64_t{1} << i;
        } else {
            big_[static_cast<std::size_t>(i)] = 1;
        }
    }

  private:
    std::uint64_t small_ = 0;
    std::vector<unsigned char> big_;
};

/// Whether every element of set `c` has its own equivalent element in set `v` (same sizes): a
/// perfect one-to-one matching. Tried in table order first (sets built from the same elements
/// usually share their layout), then greedily.
[[gnu::noinline]] int set_match(PyObject* v, PyObject* c, int depth) {
    const Py_ssize_t n = PySet_GET_SIZE(c);
    if (PySet_GET_SIZE(v) != n) return 0;
    Py_ssize_t pv = 0, pc = 0;
    PyObject *x, *y;
    bool in_order = true;
    while (set_next(c, &pc, &y)) {
        if (!set_next(v, &pv, &x)) return 0;  // cannot happen with equal sizes; stay safe
        const int r = match_at(x, y, depth);
        if (r < 0) return -1;
        if (r == 0) {
            in_order = false;
            break;
        }
    }
    if (in_order) return 1;
    UsedSet used(n);
    pc = 0;
    while (set_next(c, &pc, &y)) {
        Py_ssize_t i = 0;
        bool found = false;
        for (pv = 0; !found && set_next(v, &pv, &x); ++i) {
            if (used.test(i)) continue;
            const int r = match_at(x, y, depth);
            if (r < 0) return -1;
            if (r == 1) {
                used.set(i);
                found = true;
            }
        }
        if (!found) return 0;
    }
    return 1;
}

/// Whether every (key, value) item of dict `c` has its own item in dict `v` whose key and value
/// both match (same sizes): one-to-one on items, as Python's dict equality is for keys that are
/// equal to themselves. Tried in storage order first (the common case for configs), then
/// greedily. Keys are paired by walking `v`, never by hashing: a constant key may be an enum
/// member whose class defines __hash__/__eq__ in Python.
[[gnu::noinline]] int dict_match(PyObject* v, PyObject* c, int depth) {
    const Py_ssize_t n = PyDict_GET_SIZE(c);
    if (PyDict_GET_SIZE(v) != n) return 0;
    Py_ssize_t pv = 0, pc = 0;
    PyObject *kv, *vv, *kc, *vc;
    bool in_order = true;
    while (PyDict_Next(c, &pc, &kc, &vc)) {
        if (!PyDict_Next(v, &pv, &kv, &vv)) return 0;  // cannot happen with equal sizes
        int r = match_at(kv, kc, depth);
        if (r < 0) return -1;
        if (r == 0) {
            in_order = false;
            break;
        }
        r = match_at(vv, vc, depth);
        if (r < 0) return -1;
        if (r == 0) {
            // Another key of the same class (several NaNs, say) may carry the right value.
            in_order = false;
            break;
        }
    }
    if (in_order) return 1;
    UsedSet used(n);
    pc = 0;
    while (PyDict_Next(c, &pc, &kc, &vc)) {
        Py_ssize_t i = 0;
        bool found = false;
        for (pv = 0; !found && PyDict_Next(v, &pv, &kv, &vv); ++i) {
            if (used.test(i)) continue;
            int r = match_at(kv, kc, depth);
            if (r == 1) r = match_at(vv, vc, depth);
            if (r < 0) return -1;
            if (r == 1) {
                used.set(i);
                found = true;
            }
        }
        if (!found) return 0;
    }
    return 1;
}

// The fields of a range (not its items: range(0) == range(5, 5) in Python, but code specialised
// for one may read .stop and must not be reused for the other). The member getters return the
// stored ints; no object is allocated.
[[gnu::noinline]] int range_match(PyObject* v, PyObject* c) {
    static PyObject* const names[3] = {PyUnicode_InternFromString("start"),
                                       PyUnicode_InternFromString("stop"),
                                       PyUnicode_InternFromString("step")};
    for (PyObject* field : names) {
        if (field == nullptr) return -1;
        PyObject* a = PyObject_GetAttr(v, field);
        PyObject* b = a ? PyObject_GetAttr(c, field) : nullptr;
        const int r = b ? PyObject_RichCompareBool(a, b, Py_EQ) : -1;
        Py_XDECREF(a);
        Py_XDECREF(b);
        if (r != 1) return r;
    }
    return 1;
}

// A registered tuple-like constant type (torch.Size): compared element-wise.
bool registered_tuple(PyTypeObject* t) {
    if (t->tp_flags & Py_TPFLAGS_TUPLE_SUBCLASS && t != &PyTuple_Type) {
        const ConstantType* ct = constant_type_of(t);
        return ct != nullptr && ct->compare == ConstantCompare::Tuple;
    }
    return false;
}

// Whether `c` nests at most kMaxConstantDepth - depth levels of containers.
bool depth_within(PyObject* c, int depth) {
    PyTypeObject* t = Py_TYPE(c);
    const bool tuple_like = t == &PyTuple_Type || registered_tuple(t);
    const bool container = tuple_like || t == &PyList_Type || t == &PySlice_Type || t == &PySet_Type ||
                           t == &PyFrozenSet_Type || t == &PyDict_Type;
    if (!container) return true;
    if (depth >= core::kMaxConstantDepth) return false;
    if (tuple_like || t == &PyList_Type) {
        for (Py_ssize_t i = 0; i < Py_SIZE(c); ++i) {
            PyObject* x = tuple_like ? PyTuple_GET_ITEM(c, i) : PyList_GET_ITEM(c, i);
            if (!depth_within(x, depth + 1)) return false;
        }
        return true;
    }
    if (t == &PySlice_Type) {
        auto* s = reinterpret_cast<PySliceObject*>(c);
        return depth_within(s->start, depth + 1) && depth_within(s->stop, depth + 1) &&
               depth_within(s->step, depth + 1);
    }
    Py_ssize_t pos = 0;
    PyObject *k, *x;
    if (t == &PyDict_Type) {
        while (PyDict_Next(c, &pos, &k, &x))
            if (!depth_within(k, depth + 1) || !depth_within(x, depth + 1)) return false;
        return true;
    }
    while (set_next(c, &pos, &k))
        if (!depth_within(k, depth + 1)) return false;
    return true;
}

PyTypeObject* enum_type() {
    // Held for the life of the interpreter: the enum module is never unloaded.
    static PyObject* cls = [] {
        PyObject* mod = PyImport_ImportModule("enum");
        if (mod == nullptr) return static_cast<PyObject*>(nullptr);
        PyObject* e = PyObject_GetAttrString(mod, "Enum");
        Py_DECREF(mod);
        return e;
    }();
    return reinterpret_cast<PyTypeObject*>(cls);
}

}  // namespace

int match_at(PyObject* v, PyObject* c, int depth) {
    PyTypeObject* t = Py_TYPE(c);
    if (Py_TYPE(v) != t) return 0;
    if (v == c) return 1;  // same object of the same type (constants are private copies)
    if (t == &PyFloat_Type) return same_float(PyFloat_AS_DOUBLE(v), PyFloat_AS_DOUBLE(c)) ? 1 : 0;
    if (t == &PyComplex_Type) {
        const Py_complex x = PyComplex_AsCComplex(v), y = PyComplex_AsCComplex(c);
        return same_float(x.real, y.real) && same_float(x.imag, y.imag) ? 1 : 0;
    }
    if (t == &PyRange_Type) return range_match(v, c);
    if (is_scalar_type(t)) return PyObject_RichCompareBool(v, c, Py_EQ);
    // Containers. The recursion follows the constant, whose depth the builder bounds; a value
    // nested deeper than that (or a constant that is not, such as a probe's snapshot) does not
    // match rather than overflowing the C stack.
    if (depth >= core::kMaxConstantDepth) return 0;
    if (t == &PyTuple_Type || t == &PyList_Type) {
        const Py_ssize_t n = Py_SIZE(c);
        if (Py_SIZE(v) != n) return 0;
        for (Py_ssize_t i = 0; i < n; ++i) {
            PyObject* x = t == &PyTuple_Type ? PyTuple_GET_ITEM(v, i) : PyList_GET_ITEM(v, i);
            PyObject* y = t == &PyTuple_Type ? PyTuple_GET_ITEM(c, i) : PyList_GET_ITEM(c, i);
            const int r = match_at(x, y, depth + 1);
            if (r != 1) return r;
        }
        return 1;
    }
    if (t == &PySlice_Type) {
        auto* a = reinterpret_cast<PySliceObject*>(v);
        auto* b = reinterpret_cast<PySliceObject*>(c);
        int r = match_at(a->start, b->start, depth + 1);
        if (r == 1) r = match_at(a->stop, b->stop, depth + 1);
        if (r == 1) r = match_at(a->step, b->step, depth + 1);
        return r;
    }
    if (t == &PySet_Type || t == &PyFrozenSet_Type) return set_match(v, c, depth + 1);
    if (t == &PyDict_Type) return dict_match(v, c, depth + 1);
    // Registered value-like types (constant_types.hpp); enum members and other identity
    // constants: v is c was checked above.
    if (const ConstantType* ct = constant_type_of(t)) {
        switch (ct->compare) {
            case ConstantCompare::Identity: return 0;
            case ConstantCompare::Native: return ct->equal(v, c) == 1 ? 1 : 0;
            case ConstantCompare::RichCompare: return PyObject_RichCompareBool(v, c, Py_EQ);
            case ConstantCompare::Tuple: {
                const Py_ssize_t n = Py_SIZE(c);
                if (Py_SIZE(v) != n) return 0;
                for (Py_ssize_t i = 0; i < n; ++i) {
                    const int r = match_at(PyTuple_GET_ITEM(v, i), PyTuple_GET_ITEM(c, i), depth + 1);
                    if (r != 1) return r;
                }
                return 1;
            }
        }
    }
    return 0;
}

int equals_match(PyObject* v, PyObject* c) {
    // The common scalar cases first, without the recursion's depth bookkeeping: most guards
    // compare one int, str or float.
    PyTypeObject* t = Py_TYPE(c);
    if (Py_TYPE(v) != t) return 0;
    if (v == c) return 1;
    if (t == &PyLong_Type || t == &PyUnicode_Type) return PyObject_RichCompareBool(v, c, Py_EQ);
    if (t == &PyFloat_Type) return same_float(PyFloat_AS_DOUBLE(v), PyFloat_AS_DOUBLE(c)) ? 1 : 0;
    return match_at(v, c, 0);
}

int is_constant(PyObject* v, int depth) {
    // First, so that enum's first import (Python code) never runs in the middle of a walk.
    PyTypeObject* e = enum_type();
    if (e == nullptr) return -1;
    PyTypeObject* t = Py_TYPE(v);
    if (is_scalar_type(t)) return 1;
    if (t == &PyTuple_Type || t == &PyList_Type) {
        if (depth >= core::kMaxConstantDepth) return 0;
        for (Py_ssize_t i = 0; i < Py_SIZE(v); ++i) {
            const int r =
                is_constant(t == &PyTuple_Type ? PyTuple_GET_ITEM(v, i) : PyList_GET_ITEM(v, i), depth + 1);
            if (r != 1) return r;
        }
        return 1;
    }
    if (t == &PySlice_Type) {
        if (depth >= core::kMaxConstantDepth) return 0;
        auto* s = reinterpret_cast<PySliceObject*>(v);
        for (PyObject* x : {s->start, s->stop, s->step}) {
            const int r = is_constant(x, depth + 1);
            if (r != 1) return r;
        }
        return 1;
    }
    Py_ssize_t pos = 0;
    PyObject *k, *x;
    if (t == &PyDict_Type) {
        if (depth >= core::kMaxConstantDepth) return 0;
        while (PyDict_Next(v, &pos, &k, &x)) {
            int r = is_constant(k, depth + 1);
            if (r == 1) r = is_constant(x, depth + 1);
            if (r != 1) return r;
        }
        return 1;
    }
    if (t == &PySet_Type || t == &PyFrozenSet_Type) {
        if (depth >= core::kMaxConstantDepth) return 0;
        while (set_next(v, &pos, &k)) {
            const int r = is_constant(k, depth + 1);
            if (r != 1) return r;
        }
        return 1;
    }
    // An enum member: the MRO, not isinstance (which could call a user __class__).
    if (PyType_IsSubtype(t, e)) return 1;
    // A registered value-like type (torch.dtype, torch.device, torch.Size, numpy dtypes).
    const ConstantType* ct = constant_type_of(t);
    if (ct == nullptr) return 0;
    if (ct->accept != nullptr && !ct->accept(v)) return 0;
    if (ct->compare == ConstantCompare::Tuple) {
        if (depth >= core::kMaxConstantDepth) return 0;
        for (Py_ssize_t i = 0; i < Py_SIZE(v); ++i) {
            const int r = is_constant(PyTuple_GET_ITEM(v, i), depth + 1);
            if (r != 1) return r;
        }
    }
    return 1;
}

bool constant_depth_ok(PyObject* c) { return depth_within(c, 0); }

bool immutable_constant(PyObject* c, int depth) {
    PyTypeObject* t = Py_TYPE(c);
    if (t == &PyList_Type || t == &PySet_Type || t == &PyDict_Type) return false;
    if (depth >= core::kMaxConstantDepth) return false;
    if (t == &PyTuple_Type) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(c); ++i)
            if (!immutable_constant(PyTuple_GET_ITEM(c, i), depth + 1)) return false;
        return true;
    }
    if (t == &PySlice_Type) {
        auto* s = reinterpret_cast<PySliceObject*>(c);
        return immutable_constant(s->start, depth + 1) && immutable_constant(s->stop, depth + 1) &&
               immutable_constant(s->step, depth + 1);
    }
    if (t == &PyFrozenSet_Type) {
        Py_ssize_t pos = 0;
        PyObject* k;
        while (set_next(c, &pos, &k))
            if (!immutable_constant(k, depth + 1)) return false;
        return true;
    }
    // Scalars (immutable objects of immutable types), and the constants matched by identity
    // (enum members): a value that matched once matches for as long as it is the same object.
    return true;
}

}  // namespace tripwire::runtime
