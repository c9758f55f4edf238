// tripwire/cpp/bindings/bind_specialize.cpp -- FastDispatch: the C++ hit path of @tw.specialize.
//
// A base type (plain CPython, no nanobind on the call path) that python/tripwire/specialize.py
// subclasses for functions whose parameters are all positional. A call passing exactly one
// positional argument per parameter and no keywords builds f_locals in C++, looks the cache up
// and vectorcalls the payload with the same arguments. Any other call shape calls
// `slow(self, *args, **kwargs)`; a lookup miss calls `miss(self, args, f_locals)`.
#include <nanobind/nanobind.h>
#include <structmember.h>

#include "../runtime/cache.hpp"
#include "register.hpp"

namespace nb = nanobind;

namespace tripwire::bindings {
namespace {

struct FastDispatch {
    PyObject_HEAD vectorcallfunc vectorcall;
    PyObject* cache;  // the tripwire.Cache (a CacheCore), or null before _fast_setup
    PyObject* names;  // tuple of interned parameter names
    PyObject* slow;   // slow(self, *args, **kwargs)
    PyObject* miss;   // miss(self, args: tuple, f_locals: dict)
};

PyTypeObject* g_fast_type = nullptr;

FastDispatch* as_fd(PyObject* o) { return reinterpret_cast<FastDispatch*>(o); }

// slow(self, *args, **kwargs), keyword values following the positional ones in `args`.
PyObject* call_slow(FastDispatch* fd, PyObject* self, PyObject* const* args, Py_ssize_t n,
                    PyObject* kwnames) {
    if (fd->slow == nullptr) {
        PyErr_SetString(PyExc_TypeError, "this specialized function is not set up");
        return nullptr;
    }
    const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    const Py_ssize_t total = n + nkw + 1;
    PyObject* small[9];
    PyObject** buf = small;
    if (total > 9) {
        buf = static_cast<PyObject**>(PyMem_Malloc(sizeof(PyObject*) * static_cast<size_t>(total)));
        if (buf == nullptr) return PyErr_NoMemory();
    }
    buf[0] = self;
    for (Py_ssize_t i = 0; i < n + nkw; ++i) buf[i + 1] = args[i];
    PyObject* slow = fd->slow;
    Py_INCREF(slow);
    PyObject* r = PyObject_Vectorcall(slow, buf, static_cast<size_t>(n + 1), kwnames);
    Py_DECREF(slow);
    if (buf != small) PyMem_Free(buf);
    return r;
}

PyObject* fd_vectorcall(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
    FastDispatch* fd = as_fd(self);
    const Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (fd->cache == nullptr || (kwnames != nullptr && PyTuple_GET_SIZE(kwnames) != 0) ||
        n != PyTuple_GET_SIZE(fd->names))
        return call_slow(fd, self, args, n, kwnames);
    runtime::Cache* cache = cache_of(fd->cache);
    if (cache == nullptr) return call_slow(fd, self, args, n, kwnames);  // cleared: the slow path raises
    PyObject* cache_obj = fd->cache;
    Py_INCREF(cache_obj);  // the payload or a guard may replace fd's fields meanwhile
    PyObject* f_locals = _PyDict_NewPresized(n);
    if (f_locals == nullptr) {
        Py_DECREF(cache_obj);
        return nullptr;
    }
    PyObject* names = fd->names;
    for (Py_ssize_t i = 0; i < n; ++i) {
        if (PyDict_SetItem(f_locals, PyTuple_GET_ITEM(names, i), args[i]) < 0) {
            Py_DECREF(f_locals);
            Py_DECREF(cache_obj);
            return nullptr;
        }
    }
    PyObject* payload = nullptr;
    {
        runtime::EntryPtr e;
        if (!cache->lookup(f_locals, e)) {
            Py_DECREF(f_locals);
            Py_DECREF(cache_obj);
            return nullptr;
        }
        if (e && e->payload.get() != Py_None) {
            payload = e->payload.get();
            Py_INCREF(payload);
        }
    }
    Py_DECREF(cache_obj);
    if (payload != nullptr) {
        Py_DECREF(f_locals);
        PyObject* r = PyObject_Vectorcall(payload, args, static_cast<size_t>(n), nullptr);
        Py_DECREF(payload);
        return r;
    }
    PyObject* tup = PyTuple_New(n);
    if (tup == nullptr) {
        Py_DECREF(f_locals);
        return nullptr;
    }
    for (Py_ssize_t i = 0; i < n; ++i) {
        Py_INCREF(args[i]);
        PyTuple_SET_ITEM(tup, i, args[i]);
    }
    PyObject* miss = fd->miss;
    Py_INCREF(miss);
    PyObject* margs[3] = {self, tup, f_locals};
    PyObject* r = PyObject_Vectorcall(miss, margs, 3, nullptr);
    Py_DECREF(miss);
    Py_DECREF(tup);
    Py_DECREF(f_locals);
    return r;
}

PyObject* fd_new(PyTypeObject* type, PyObject*, PyObject*) {
    PyObject* self = type->tp_alloc(type, 0);
    if (self == nullptr) return nullptr;
    FastDispatch* fd = as_fd(self);
    fd->vectorcall = fd_vectorcall;
    fd->cache = fd->names = fd->slow = fd->miss = nullptr;
    return self;
}

int fd_traverse(PyObject* self, visitproc visit, void* arg) {
    FastDispatch* fd = as_fd(self);
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(fd->cache);
    Py_VISIT(fd->names);
    Py_VISIT(fd->slow);
    Py_VISIT(fd->miss);
    return 0;
}

int fd_clear(PyObject* self) {
    FastDispatch* fd = as_fd(self);
    Py_CLEAR(fd->cache);
    Py_CLEAR(fd->names);
    Py_CLEAR(fd->slow);
    Py_CLEAR(fd->miss);
    return 0;
}

void fd_dealloc(PyObject* self) {
    PyTypeObject* tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    fd_clear(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

PyObject* fd_setup(PyObject* self, PyObject* const* args, Py_ssize_t n) {
    if (n != 4) {
        PyErr_SetString(PyExc_TypeError, "_fast_setup(cache, names, slow, miss)");
        return nullptr;
    }
    if (cache_of(args[0]) == nullptr) {
        PyErr_SetString(PyExc_TypeError, "_fast_setup: cache must be a tripwire.Cache");
        return nullptr;
    }
    if (!PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "_fast_setup: names must be a tuple of str");
        return nullptr;
    }
    const Py_ssize_t k = PyTuple_GET_SIZE(args[1]);
    PyObject* names = PyTuple_New(k);
    if (names == nullptr) return nullptr;
    for (Py_ssize_t i = 0; i < k; ++i) {
        PyObject* s = PyTuple_GET_ITEM(args[1], i);
        if (!PyUnicode_CheckExact(s)) {
            Py_DECREF(names);
            PyErr_SetString(PyExc_TypeError, "_fast_setup: names must be a tuple of str");
            return nullptr;
        }
        Py_INCREF(s);
        PyUnicode_InternInPlace(&s);
        PyTuple_SET_ITEM(names, i, s);
    }
    if (!PyCallable_Check(args[2]) || !PyCallable_Check(args[3])) {
        Py_DECREF(names);
        PyErr_SetString(PyExc_TypeError, "_fast_setup: slow and miss must be callable");
        return nullptr;
    }
    FastDispatch* fd = as_fd(self);
    Py_INCREF(args[0]);
    Py_INCREF(args[2]);
    Py_INCREF(args[3]);
    Py_XSETREF(fd->cache, args[0]);
    Py_XSETREF(fd->names, names);
    Py_XSETREF(fd->slow, args[2]);
    Py_XSETREF(fd->miss, args[3]);
    Py_RETURN_NONE;
}

PyMethodDef g_fd_methods[] = {
    {"_fast_setup", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(fd_setup)), METH_FASTCALL,
     "_fast_setup(cache, names, slow, miss): enable the C++ hit path."},
    {nullptr, nullptr, 0, nullptr}};

PyMemberDef g_fd_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(FastDispatch, vectorcall), READONLY, nullptr},
    {nullptr, 0, 0, 0, nullptr}};

PyType_Slot g_fd_slots[] = {
    {Py_tp_new, reinterpret_cast<void*>(fd_new)},
    {Py_tp_dealloc, reinterpret_cast<void*>(fd_dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(fd_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(fd_clear)},
    {Py_tp_call, reinterpret_cast<void*>(PyVectorcall_Call)},
    {Py_tp_methods, g_fd_methods},
    {Py_tp_members, g_fd_members},
    {Py_tp_doc, const_cast<char*>("The C++ hit path of tripwire.specialize (private).")},
    {0, nullptr}};

PyType_Spec g_fd_spec = {
    "tripwire._core.FastDispatch", sizeof(FastDispatch), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL, g_fd_slots};

}  // namespace

void register_specialize(nb::module_& m) {
    PyObject* t = PyType_FromSpec(&g_fd_spec);
    if (t == nullptr) throw nb::python_error();
    g_fast_type = reinterpret_cast<PyTypeObject*>(t);
    m.attr("FastDispatch") = nb::steal(t);
    // CPython 3.11 does not pass Py_TPFLAGS_HAVE_VECTORCALL on to Python subclasses; this sets it
    // on one that keeps FastDispatch's call (no __call__ of its own).
    m.def(
        "_enable_vectorcall",
        [](nb::handle cls) {
            if (!PyType_Check(cls.ptr()) ||
                !PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(cls.ptr()), g_fast_type))
                throw nb::type_error("_enable_vectorcall needs a subclass of FastDispatch");
            auto* tp = reinterpret_cast<PyTypeObject*>(cls.ptr());
            if (tp->tp_call != PyVectorcall_Call ||
                tp->tp_vectorcall_offset != g_fast_type->tp_vectorcall_offset)
                return false;
            tp->tp_flags |= Py_TPFLAGS_HAVE_VECTORCALL;
            return true;
        },
        nb::arg("cls"));
}

}  // namespace tripwire::bindings
