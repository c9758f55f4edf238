// tripwire/cpp/runtime/eval/python_equals.cpp -- EQUALS_MATCH with python_eq: Python's own ==.
//
// torch's EQUALS_MATCH is `v is c or (type(v) is type(c) and v == c)` with Python's ==, which on
// a tuple calls each element's __eq__ (identity first: PyObject_RichCompareBool). The plain
// EQUALS_MATCH is type-exact all the way down and calls no __eq__; this flavour (GuardDecl::flag)
// keeps Python's answer exactly, so the engine must be able to run user code for it (the binding
// marks it via_python), but most values never need to.
//
// The fast form decides `v == c` without running or allocating anything when the answer follows
// from the interpreter's own comparisons alone, and says "unknown" otherwise; the caller then runs
// PyObject_RichCompareBool (the walk, a residue in the fast program). It walks the pair the way
// tuplerichcompare and list_richcompare do: element by element in order, identity first, and
// stops at the first pair it cannot prove equal. A pair is decided only when both objects are of
// these exact types, whose comparisons are the interpreter's and never call back:
//   - int and bool (one family: True == 1), compared by value (big ints: unknown);
//   - float against float, compared as doubles (NaN != NaN, -0.0 == 0.0; identity was tried
//     first, as Python does, so the same NaN object is equal to itself); float against int is
//     left to Python (unknown);
//   - str against str;
//   - None (a singleton: identity decides);
//   - tuple against tuple, list against list (recursively, as above; a list of another length is
//     unequal at once, list_richcompare's early out; a tuple compares its common prefix first);
//   - set or frozenset against set or frozenset: of another size, unequal at once
//     (set_richcompare's early out); both small tables of exact str only (small_str_set), each
//     element of one looked up in the other, str compares only (torch guards a module's
//     `_non_persistent_buffers_set` so);
//   - two objects of different families among these: unequal (each side's richcompare returns
//     NotImplemented for the other and == falls back to identity, which was false).
// Anything else (a subclass, a float against an int, a set holding other types, a user object)
// is unknown: Python decides. The first undecided pair stops the scan, so an element whose __eq__
// would raise is never skipped over to reach a later unequal one: the answer, errors included, is
// Python's.
#include <climits>

#include "runtime/eval/guard_kinds.hpp"

namespace tripwire::runtime {
namespace {

enum class Family : std::uint8_t { Other, Int, Float, Str, None, Tuple, List, Set };

inline Family family_of(PyObject* o) {
    PyTypeObject* t = Py_TYPE(o);
    if (t == &PyLong_Type || t == &PyBool_Type) return Family::Int;
    if (t == &PyUnicode_Type) return Family::Str;
    if (t == &PyTuple_Type) return Family::Tuple;
    if (o == Py_None) return Family::None;
    if (t == &PyFloat_Type) return Family::Float;
    if (t == &PyList_Type) return Family::List;
    if (t == &PySet_Type || t == &PyFrozenSet_Type) return Family::Set;
    return Family::Other;
}

int pair_equal(PyObject* x, PyObject* y, int depth);

// tuplerichcompare / list_richcompare for ==, element pairs through pair_equal.
int sequence_equal(PyObject* v, PyObject* c, bool list, int depth) {
    if (depth >= core::kMaxConstantDepth) return kEqualsUnknown;
    const Py_ssize_t nv = Py_SIZE(v), nc = Py_SIZE(c);
    if (list && nv != nc) return 0;  // list_richcompare: unequal lengths, unequal, nothing called
    const Py_ssize_t n = nv < nc ? nv : nc;
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* x = list ? PyList_GET_ITEM(v, i) : PyTuple_GET_ITEM(v, i);
        PyObject* y = list ? PyList_GET_ITEM(c, i) : PyTuple_GET_ITEM(c, i);
        const int r = pair_equal(x, y, depth + 1);
        if (r != 1) return r;  // unequal, or Python must decide from here on
    }
    return nv == nc ? 1 : 0;  // a tuple: the common prefix is equal, then the sizes decide
}

// set_richcompare for ==: sizes first, then every element of v in c.
int set_equal(PyObject* v, PyObject* c) {
    if (PySet_GET_SIZE(v) != PySet_GET_SIZE(c)) return 0;
    if (!small_str_set(v) || !small_str_set(c)) return kEqualsUnknown;
    Py_ssize_t pos = 0;
    PyObject* k = nullptr;
    while (set_next(v, &pos, &k))
        if (!small_str_set_has(c, k)) return 0;
    return 1;
}

// PyObject_RichCompareBool(x, y, Py_EQ), where the interpreter alone decides it.
int pair_equal(PyObject* x, PyObject* y, int depth) {
    if (x == y) return 1;  // RichCompareBool's identity shortcut (a NaN object equals itself)
    const Family fx = family_of(x), fy = family_of(y);
    if (fx == Family::Other || fy == Family::Other) return kEqualsUnknown;
    if (fx != fy) {
        // int vs float: Python compares the numbers (1 == 1.0); left to it. Other mixed pairs of
        // these types: NotImplemented both ways, then identity (false).
        if ((fx == Family::Int && fy == Family::Float) || (fx == Family::Float && fy == Family::Int))
            return kEqualsUnknown;
        return 0;
    }
    switch (fx) {
        case Family::Int: {
            int ox = 0, oy = 0;
            const long long a = PyLong_AsLongLongAndOverflow(x, &ox);
            const long long b = PyLong_AsLongLongAndOverflow(y, &oy);
            if (ox != 0 || oy != 0 || ((a == -1 || b == -1) && PyErr_Occurred())) {
                PyErr_Clear();          // cannot fail for an exact int; stay safe
                return kEqualsUnknown;  // a big int: Python compares the digits
            }
            return a == b ? 1 : 0;
        }
        case Family::Float: return PyFloat_AS_DOUBLE(x) == PyFloat_AS_DOUBLE(y) ? 1 : 0;
        case Family::Str: {
            const int r = PyUnicode_Compare(x, y);
            if (r == -1 && PyErr_Occurred()) {
                PyErr_Clear();
                return kEqualsUnknown;
            }
            return r == 0 ? 1 : 0;
        }
        case Family::Tuple: return sequence_equal(x, y, false, depth);
        case Family::List: return sequence_equal(x, y, true, depth);
        case Family::Set: return set_equal(x, y);
        case Family::None:  // one object: identity decided above
        case Family::Other: break;
    }
    return kEqualsUnknown;
}

}  // namespace

int python_equals_pure(PyObject* v, PyObject* c) {
    if (v == c) return 1;
    if (Py_TYPE(v) != Py_TYPE(c)) return 0;  // torch's exact type check, before ==
    return pair_equal(v, c, 0);
}

int python_equals(PyObject* v, PyObject* c) {
    const int r = python_equals_pure(v, c);
    if (r != kEqualsUnknown) return r;
    return PyObject_RichCompareBool(v, c, Py_EQ);  // user code may run: the caller holds v
}

}  // namespace tripwire::runtime
