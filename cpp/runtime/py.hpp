// tripwire/cpp/runtime/py.hpp -- CPython include and a minimal owning reference.
//
// The runtime layer talks to CPython directly (no nanobind) so that the evaluator's hot path is
// plain C API calls. Every function here expects the GIL to be held.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string>
#include <utility>

namespace tripwire::runtime {

/// An owned (strong) reference; decref on destruction. Null means "no object".
class Ref {
  public:
    Ref() = default;
    /// Take ownership of a new reference (may be null).
    static Ref steal(PyObject* o) { return Ref(o); }
    /// Add a reference to a borrowed object (may be null).
    static Ref borrow(PyObject* o) {
        Py_XINCREF(o);
        return Ref(o);
    }
    Ref(const Ref& o) : obj_(o.obj_) { Py_XINCREF(obj_); }
    Ref(Ref&& o) noexcept : obj_(std::exchange(o.obj_, nullptr)) {}
    Ref& operator=(Ref o) noexcept {
        std::swap(obj_, o.obj_);
        return *this;
    }
    ~Ref() { Py_XDECREF(obj_); }

    PyObject* get() const { return obj_; }
    PyObject* release() { return std::exchange(obj_, nullptr); }
    explicit operator bool() const { return obj_ != nullptr; }

  private:
    explicit Ref(PyObject* o) : obj_(o) {}
    PyObject* obj_ = nullptr;
};

/// "TypeName: message" for the exception currently set, which is cleared. Never raises.
std::string take_error_text();

/// The next element of set or frozenset `s` (borrowed) from position `*pos` (start at 0), read
/// straight from the table: no iterator object is allocated and nothing runs, so a caller may
/// hold borrowed references across the loop (a collection cannot start; see docs/cpp.md).
/// `_PySet_NextEntry` did the same but left the public headers in 3.13; the table layout and its
/// documented invariant (a dummy entry has hash -1, a real key never has) are in
/// Include/cpython/setobject.h on every supported version.
inline bool set_next(PyObject* s, Py_ssize_t* pos, PyObject** key) {
    auto* so = reinterpret_cast<PySetObject*>(s);
    for (Py_ssize_t i = *pos; i <= so->mask; ++i) {
        const setentry& e = so->table[i];
        if (e.key != nullptr && e.hash != -1) {
            *pos = i + 1;
            *key = e.key;
            return true;
        }
    }
    *pos = so->mask + 1;
    return false;
}

/// `s` interned (a new reference kept by the caller, usually in a function-local static), or
/// null with no error set when that failed.
inline PyObject* interned(const char* s) {
    PyObject* o = PyUnicode_InternFromString(s);
    if (o == nullptr) PyErr_Clear();
    return o;
}

/// Whether calling Python function `fn` still runs `code` through `call`, as when the caller
/// recorded both, and nothing would see the call's frame: `__code__` is assignable,
/// PyFunction_SetVectorcall can replace the vectorcall (then the call runs other code), and a
/// tracer or profiler would observe the frame. A caller that answers for `fn` without calling it
/// asks this each time.
inline bool function_runs_unchanged(PyObject* fn, PyObject* code, vectorcallfunc call) {
    auto* f = reinterpret_cast<PyFunctionObject*>(fn);
    if (f->func_code != code || f->vectorcall != call) return false;
    PyThreadState* ts = PyThreadState_Get();
    return ts->c_tracefunc == nullptr && ts->c_profilefunc == nullptr;
}

}  // namespace tripwire::runtime
