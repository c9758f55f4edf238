// tripwire/cpp/runtime/calls/fast_dispatch.hpp -- FastDispatch: the callable type of @specialize.
//
// A plain CPython type (no nanobind on the call path) that python/tripwire/specialized.py's
// Specialized subclasses. Every call goes through its vectorcall slot: dispatch() binds the
// arguments to the function's parameters and looks the cache up without building a dict; a hit
// vectorcalls the payload with the original arguments. A miss calls
// `miss(self, args, kwargs, f_locals)`; a call that cannot be bound in C++ (an invalid call, a
// callable that is not a Python function, a function whose code was replaced) calls
// `slow(self, args, kwargs)`.
#pragma once

#include "runtime/cache/cache.hpp"
#include "runtime/py.hpp"

namespace tripwire::runtime {

/// The FastDispatch type, created on first use (a strong reference the caller may hand to a
/// module), or null with a Python error set.
PyTypeObject* fast_dispatch_type();

/// Enable the C++ hit path of FastDispatch instance `self`: calls look `cache` up (owned by the
/// Python object `cache_owner`, which `self` keeps alive) and fall back to `slow`/`miss`. Once only
/// (a call in progress may use the signature). False with a Python error set.
bool fast_dispatch_setup(PyObject* self, PyObject* cache_owner, Cache* cache, PyObject* fn, PyObject* slow,
                         PyObject* miss);

/// Give a Python subclass of FastDispatch the vectorcall protocol (CPython 3.11 does not inherit
/// Py_TPFLAGS_HAVE_VECTORCALL): only when it keeps FastDispatch's call. False when it cannot.
bool enable_vectorcall(PyTypeObject* subclass);

}  // namespace tripwire::runtime
