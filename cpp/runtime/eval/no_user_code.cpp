// tripwire/cpp/runtime/eval/no_user_code.cpp -- debug-build checks of regions without user code.
#include "runtime/eval/no_user_code.hpp"

#ifdef TRIPWIRE_CHECK_REGIONS
#include <cstdio>
#include <cstdlib>

namespace tripwire::runtime {

thread_local const char* t_no_user_code_region = nullptr;

void assert_outside_region(const char* what) {
    if (t_no_user_code_region == nullptr) return;
    std::fprintf(stderr,
                 "tripwire: %s ran inside the region '%s', which promises to run no user code "
                 "(docs/cpp.md, \"Regions without user code\")\n",
                 what, t_no_user_code_region);
    std::fflush(stderr);
    std::abort();
}

namespace {

// gc.callbacks entry: callback(phase, info). A collection runs finalizers and weakref callbacks.
PyObject* on_gc(PyObject*, PyObject* const*, Py_ssize_t) {
    assert_outside_region("a garbage collection");
    Py_RETURN_NONE;
}

PyMethodDef g_on_gc_def = {"_tripwire_region_check",
                           reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(on_gc)), METH_FASTCALL,
                           nullptr};

}  // namespace

bool install_region_checks() {
    static bool done = false;
    if (done) return true;
    PyObject* gc = PyImport_ImportModule("gc");
    if (gc == nullptr) return false;
    PyObject* callbacks = PyObject_GetAttrString(gc, "callbacks");
    Py_DECREF(gc);
    if (callbacks == nullptr) return false;
    PyObject* fn = PyCFunction_New(&g_on_gc_def, nullptr);
    const int r = fn != nullptr ? PyList_Append(callbacks, fn) : -1;
    Py_XDECREF(fn);
    Py_DECREF(callbacks);
    done = r == 0;
    return done;
}

}  // namespace tripwire::runtime
#endif
