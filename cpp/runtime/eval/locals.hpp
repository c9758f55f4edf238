// tripwire/cpp/runtime/eval/locals.hpp -- where the L[...] roots of a check come from.
//
// A check reads its local roots either from a mapping (the f_locals dict a caller built) or
// straight from the arguments of a call bound to the function's parameters (runtime::BoundCall).
// The second form is what @specialize's C++ hit path uses: no dict is built on a hit.
#pragma once

#include "runtime/py.hpp"

namespace tripwire::runtime {

/// Index of `name` in `names[begin, end)` (a tuple of exact str), or -1: by identity first (both
/// sides interned, the common case), then by value when `name` is an exact str too, so no user
/// __eq__ ever runs.
Py_ssize_t index_of_name(PyObject* names, Py_ssize_t begin, Py_ssize_t end, PyObject* name);

/// The locals a guard set is checked against. Cheap to copy; it owns nothing. ("Frame" is kept
/// for the PEP 523 runtime's interpreter frames, DESIGN.md.)
struct Locals {
    /// Mapping mode: f_locals (a dict on the fast path, any mapping otherwise). Null in argument
    /// mode.
    PyObject* mapping = nullptr;
    /// Argument mode: `values[i]` is the value of local `names[i]` (borrowed; whoever built the
    /// Locals keeps them alive until the check returns, whatever user code a guard runs).
    PyObject* const* values = nullptr;
    PyObject* names = nullptr;  ///< tuple of interned str, or null in mapping mode
    Py_ssize_t count = 0;

    static Locals of_mapping(PyObject* f_locals) {
        Locals l;
        l.mapping = f_locals;
        return l;
    }
    bool is_arguments() const { return names != nullptr; }

    /// Argument mode: the value of local `name` (borrowed), null if no parameter has that name.
    /// `hint` caches the slot index per caller; names are compared by identity first (both
    /// sides interned), then by value.
    PyObject* argument(PyObject* name, Py_ssize_t* hint) const {
        const Py_ssize_t h = *hint;
        if (h >= 0 && h < count && PyTuple_GET_ITEM(names, h) == name) return values[h];
        return argument_slow(name, hint);
    }

    /// The locals as a mapping (new reference): `mapping` itself, or a new dict of the arguments.
    /// Null with a Python error set on failure.
    Ref as_mapping() const;

  private:
    PyObject* argument_slow(PyObject* name, Py_ssize_t* hint) const;
};

}  // namespace tripwire::runtime
