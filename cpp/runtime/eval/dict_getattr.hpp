// tripwire/cpp/runtime/eval/dict_getattr.hpp -- class `__getattr__` hooks whose miss is known.
//
// nn.Module defines `__getattr__`: a name that the generic lookup misses is looked up in the
// instance dict's `_parameters`, `_buffers` and `_modules` dicts, and otherwise AttributeError is
// raised. torch guards `not hasattr(module, name)` (NO_HASATTR), and answering it runs that
// method: a Python frame that builds and raises an AttributeError, about 1 us a guard, on every
// check. What the method does on a miss is fixed by its body, so when the body is the one the
// caller registered and the dicts lack the name, the answer (AttributeError) is known without
// the call.
//
// The runtime imports no torch: tripwire.torch registers nn.Module.__getattr__ and its dict
// names, for the torch versions it was verified on (a claim about that function's body). What
// can change after registration is checked on every use: the function's `__code__` and its
// vectorcall (both assignable), tracing or profiling (they would see the call), and that its
// globals and builtins still resolve `AttributeError` and `type` to the builtins (dict tags).
#pragma once

#include "runtime/py.hpp"

namespace tripwire::runtime {

/// Register `fn`, a Python function, as a class `__getattr__` that for an exact str `name`
/// returns `self.__dict__[d][name]` for the first `d` of `dicts` (a tuple of str) that the
/// instance dict holds and whose value holds `name`, and otherwise raises
/// `AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")`. Registering the
/// same function again replaces its dict names. False with a Python error set: not a function,
/// not a tuple of str, or the table is full.
bool register_dict_getattr(PyObject* fn, PyObject* dicts);

/// The registration whose function is `hook` (borrowed from a class dict), or -1.
int dict_getattr_index(PyObject* hook);

/// Whether registration `index`'s function, called as `obj`'s class `__getattr__` for `name`
/// (an exact str), certainly raises AttributeError and does nothing else observable: the body is
/// still the registered one, and `obj`'s own storage holds no dict named in the registration
/// that is anything but an exact str-keyed dict lacking `name`. The caller has proved that the
/// generic lookup misses and that the class's `__dict__` is the instance dict. Allocates nothing,
/// runs no user code, sets no error.
bool dict_getattr_misses(int index, PyObject* obj, PyObject* name);

}  // namespace tripwire::runtime
