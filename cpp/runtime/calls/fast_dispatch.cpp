// tripwire/cpp/runtime/calls/fast_dispatch.cpp -- the FastDispatch type (see the header).
#include "runtime/calls/fast_dispatch.hpp"

#include <structmember.h>

#include <exception>
#include <new>

#include "runtime/calls/dispatch.hpp"

namespace tripwire::runtime {
namespace {

struct FastDispatch {
    PyObject_HEAD vectorcallfunc vectorcall;
    PyObject* cache;     // the Python object owning `impl` (a tripwire.Cache), or null
    Cache* impl;         // the runtime cache; valid while `cache` is held
    PyObject* fn;        // the original function
    PyObject* slow;      // slow(self, args: tuple, kwargs: dict | None)
    PyObject* miss;      // miss(self, args: tuple, kwargs: dict | None, f_locals: dict)
    CallSignature* sig;  // owned; invalid when fn is not a Python function
    int off;             // set by _fast_disable: every call takes the slow path
};

PyTypeObject* g_fast_type = nullptr;

FastDispatch* as_fd(PyObject* o) { return reinterpret_cast<FastDispatch*>(o); }

// The call's arguments as a tuple and a dict (None without keywords). Null with an error set.
bool pack_arguments(PyObject* const* args, Py_ssize_t n, PyObject* kwnames, Ref& tup, Ref& kwargs) {
    tup = Ref::steal(PyTuple_New(n));
    if (!tup) return false;
    for (Py_ssize_t i = 0; i < n; ++i) {
        Py_INCREF(args[i]);
        PyTuple_SET_ITEM(tup.get(), i, args[i]);
    }
    kwargs = Ref::borrow(Py_None);
    if (kwnames != nullptr && PyTuple_GET_SIZE(kwnames) > 0) {
        kwargs = Ref::steal(PyDict_New());
        if (!kwargs) return false;
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(kwnames); ++j)
            if (PyDict_SetItem(kwargs.get(), PyTuple_GET_ITEM(kwnames, j), args[n + j]) < 0) return false;
    }
    return true;
}

// slow(self, args, kwargs). Packed rather than passed through: a keyword that is a str subclass
// with its own __eq__ must not be matched against slow's own parameter names.
PyObject* call_slow(FastDispatch* fd, PyObject* self, PyObject* const* args, Py_ssize_t n,
                    PyObject* kwnames) {
    if (fd->slow == nullptr) {
        PyErr_SetString(PyExc_TypeError, "this specialized function is not set up");
        return nullptr;
    }
    Ref tup, kwargs;
    if (!pack_arguments(args, n, kwnames, tup, kwargs)) return nullptr;
    Ref slow = Ref::borrow(fd->slow);  // the call may replace fd's fields
    PyObject* sargs[3] = {self, tup.get(), kwargs.get()};
    return PyObject_Vectorcall(slow.get(), sargs, 3, nullptr);
}

// miss(self, args, kwargs, f_locals) with the call's arguments as a tuple and a dict (or None).
PyObject* call_miss(FastDispatch* fd, PyObject* self, PyObject* const* args, Py_ssize_t n, PyObject* kwnames,
                    const BoundCall& bound) {
    Ref f_locals = bound.locals().as_mapping();
    if (!f_locals) return nullptr;
    Ref tup, kwargs;
    if (!pack_arguments(args, n, kwnames, tup, kwargs)) return nullptr;
    Ref miss = Ref::borrow(fd->miss);  // the call may replace fd's fields
    PyObject* margs[4] = {self, tup.get(), kwargs.get(), f_locals.get()};
    return PyObject_Vectorcall(miss.get(), margs, 4, nullptr);
}

PyObject* fd_vectorcall(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
    FastDispatch* fd = as_fd(self);
    const Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (fd->cache == nullptr || fd->impl == nullptr || fd->sig == nullptr || fd->off || !fd->sig->valid())
        return call_slow(fd, self, args, n, kwnames);
    // The common hit: positional arguments that are the locals as they are, and the most
    // recently used entry decided without user code. Nothing runs between here and the payload
    // call (no allocation either), so fd's fields, the cache and the arguments stay as they are
    // without our own references; after the payload call nothing of fd is used.
    const CallSignature& sig = *fd->sig;
    if (sig.binds_as_is(n, kwnames) && PyFunction_Check(fd->fn) &&
        PyFunction_GET_CODE(fd->fn) == sig.code()) {
        Locals locals;
        locals.values = args;
        locals.names = sig.names();
        locals.count = sig.size();
        Ref payload;
        if (fd->impl->lookup_most_recent(locals, payload) == 1 && payload.get() != Py_None)
            return PyObject_Vectorcall(payload.get(), args, static_cast<size_t>(n), nullptr);
    }
    // Our own references: a guard or the payload may replace fd's fields meanwhile, and the
    // cache object keeps `impl` alive.
    Cache* cache = fd->impl;
    Ref cache_obj = Ref::borrow(fd->cache);
    Ref fn = Ref::borrow(fd->fn);
    BoundCall bound;
    Ref payload;
    DispatchOutcome outcome;
    // This is a C slot: no C++ exception may leave it (the runtime allocates with std::vector).
    try {
        outcome = dispatch(*cache, *fd->sig, fn.get(), args, n, kwnames, bound, payload);
    } catch (const std::bad_alloc&) {
        return PyErr_NoMemory();
    } catch (const std::exception& e) {
        PyErr_SetString(PyExc_RuntimeError, e.what());
        return nullptr;
    }
    switch (outcome) {
        case DispatchOutcome::Hit:
            return PyObject_Vectorcall(payload.get(), args, static_cast<size_t>(n), kwnames);
        case DispatchOutcome::Miss: return call_miss(fd, self, args, n, kwnames, bound);
        case DispatchOutcome::NotBound: return call_slow(fd, self, args, n, kwnames);
        case DispatchOutcome::Error: break;
    }
    return nullptr;
}

// Detach the signature (deleted by the caller). The struct is plain C memory: no destructor runs.
CallSignature* fd_sig_release(PyObject* self) {
    FastDispatch* fd = as_fd(self);
    CallSignature* s = fd->sig;
    fd->sig = nullptr;
    return s;
}

PyObject* fd_new(PyTypeObject* type, PyObject*, PyObject*) {
    PyObject* self = type->tp_alloc(type, 0);
    if (self == nullptr) return nullptr;
    FastDispatch* fd = as_fd(self);
    fd->vectorcall = fd_vectorcall;
    fd->cache = fd->fn = fd->slow = fd->miss = nullptr;
    fd->impl = nullptr;
    fd->sig = nullptr;
    fd->off = 0;
    return self;
}

int fd_traverse(PyObject* self, visitproc visit, void* arg) {
    FastDispatch* fd = as_fd(self);
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(fd->cache);
    Py_VISIT(fd->fn);
    Py_VISIT(fd->slow);
    Py_VISIT(fd->miss);
    return 0;
}

int fd_clear(PyObject* self) {
    FastDispatch* fd = as_fd(self);
    fd->impl = nullptr;  // before the cache that owns it can go
    Py_CLEAR(fd->cache);
    Py_CLEAR(fd->fn);
    Py_CLEAR(fd->slow);
    Py_CLEAR(fd->miss);
    return 0;
}

void fd_dealloc(PyObject* self) {
    PyTypeObject* tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    fd_clear(self);
    delete fd_sig_release(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

PyObject* fd_bindable(PyObject* self, PyObject*) {
    FastDispatch* fd = as_fd(self);
    return PyBool_FromLong(fd->sig != nullptr && !fd->off && fd->sig->valid());
}

PyObject* fd_disable(PyObject* self, PyObject*) {
    as_fd(self)->off = 1;
    Py_RETURN_NONE;
}

PyMethodDef g_fd_methods[] = {
    {"_bindable", fd_bindable, METH_NOARGS, "Whether calls are bound in C++ (fn is a Python function)."},
    {"_fast_disable", fd_disable, METH_NOARGS,
     "Send every call to the slow path from now on (fn's code was replaced)."},
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

PyTypeObject* fast_dispatch_type() {
    if (g_fast_type == nullptr) g_fast_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&g_fd_spec));
    Py_XINCREF(g_fast_type);
    return g_fast_type;
}

bool fast_dispatch_setup(PyObject* self, PyObject* cache_owner, Cache* cache, PyObject* fn, PyObject* slow,
                         PyObject* miss) {
    if (g_fast_type == nullptr || !PyObject_TypeCheck(self, g_fast_type)) {
        PyErr_SetString(PyExc_TypeError, "_fast_setup needs a FastDispatch instance");
        return false;
    }
    if (!PyCallable_Check(fn) || !PyCallable_Check(slow) || !PyCallable_Check(miss)) {
        PyErr_SetString(PyExc_TypeError, "_fast_setup: fn, slow and miss must be callable");
        return false;
    }
    FastDispatch* fd = as_fd(self);
    if (fd->sig != nullptr) {
        // A call in progress may be using the signature (a guard can run user code): never
        // replace it.
        PyErr_SetString(PyExc_RuntimeError, "_fast_setup: already set up");
        return false;
    }
    auto* sig = new (std::nothrow) CallSignature();
    if (sig == nullptr) {
        PyErr_NoMemory();
        return false;
    }
    sig->init(fn);  // not a Python function: stays invalid, every call takes the slow path
    fd->sig = sig;
    Py_INCREF(cache_owner);
    Py_INCREF(fn);
    Py_INCREF(slow);
    Py_INCREF(miss);
    Py_XSETREF(fd->cache, cache_owner);
    fd->impl = cache;
    Py_XSETREF(fd->fn, fn);
    Py_XSETREF(fd->slow, slow);
    Py_XSETREF(fd->miss, miss);
    return true;
}

bool enable_vectorcall(PyTypeObject* tp) {
    if (g_fast_type == nullptr || !PyType_IsSubtype(tp, g_fast_type)) return false;
    if (tp->tp_call != PyVectorcall_Call || tp->tp_vectorcall_offset != g_fast_type->tp_vectorcall_offset)
        return false;
    tp->tp_flags |= Py_TPFLAGS_HAVE_VECTORCALL;
    return true;
}

}  // namespace tripwire::runtime
