// tripwire/cpp/runtime/eval/locals.hpp -- where the L[...] roots of a check come from.
//
// A check reads its local roots from a mapping (the f_locals dict a caller built), straight from
// the arguments of a call bound to the function's parameters (runtime::BoundCall: @specialize's
// C++ hit path), or straight from a PEP 523 frame's fast locals by index (the frame runtime,
// cpp/runtime/frame). In the last two no dict is built on a hit.
//
// Frame mode reads a frame at entry, before its first instruction: arguments are in their slots
// (a cell argument still holds its plain value: MAKE_CELL has not run), other locals are null,
// and free variables are not copied yet (COPY_FREE_VARS has not run), so `L['name']` of a free
// variable is read from the function's closure cell, unboxed, as Dynamo's FrameLocalsMapping
// does. Hidden fast locals (3.12+ inlined comprehensions, CO_FAST_HIDDEN) are never found.
//
// A name with two visible slots (CPython's compiler never makes one; Dynamo's resume functions
// do: an argument that is also a free variable) is its last slot, as CPython's f_locals (a dict
// filled in slot order) and torch's guards (get_framelocals_idx: the last index) read it.
#pragma once

#include "runtime/py.hpp"

namespace tripwire::runtime {

/// Index of the first (with `last`, the last) `name` in `names[begin, end)` (a tuple of exact
/// str), or -1: by identity first (both sides interned, the common case), then by value when
/// `name` is an exact str too, so no user __eq__ ever runs.
Py_ssize_t index_of_name(PyObject* names, Py_ssize_t begin, Py_ssize_t end, PyObject* name,
                         bool last = false);

/// The locals a guard set is checked against. Cheap to copy; it owns nothing. ("Frame" is kept
/// for the PEP 523 runtime's interpreter frames, DESIGN.md.)
/// CO_FAST_HIDDEN (Include/internal/pycore_code.h, 3.12+): a fast local of an inlined
/// comprehension, invisible to locals(). No slot has it on 3.11.
inline constexpr unsigned char kFastHiddenKind = 0x10;

struct Locals {
    /// Mapping mode: f_locals (a dict on the fast path, any mapping otherwise). Null in argument
    /// mode.
    PyObject* mapping = nullptr;
    /// Argument mode: `values[i]` is the value of local `names[i]` (borrowed; whoever built the
    /// Locals keeps them alive until the check returns, whatever user code a guard runs).
    PyObject* const* values = nullptr;
    PyObject* names = nullptr;  ///< tuple of interned str, or null in mapping mode
    Py_ssize_t count = 0;

    /// Frame mode: slots [free_begin, count) are free variables, read from the cells of
    /// `closure` (the function's closure tuple); PY_SSIZE_T_MAX otherwise.
    Py_ssize_t free_begin = PY_SSIZE_T_MAX;
    PyObject* closure = nullptr;
    /// Frame mode: the code's co_localspluskinds bytes (hidden slots are skipped); null otherwise.
    const unsigned char* kinds = nullptr;
    /// Frame mode: a free variable has the name of a visible slot before it, so a slot hint that
    /// names the earlier one is not the name's value (argument_hot does not trust hints then).
    bool free_shadows = false;
    /// Frame mode: the frame's globals dict. A guard set whose G[...] sources read another dict
    /// (the same code run under other globals) does not pass; null otherwise.
    PyObject* frame_globals = nullptr;

    static Locals of_mapping(PyObject* f_locals) {
        Locals l;
        l.mapping = f_locals;
        return l;
    }
    /// The fast locals of a frame of `code` at entry (see above); `closure` is the frame's
    /// function's closure (a tuple of cells, or null).
    static Locals of_frame(PyObject* const* localsplus, PyCodeObject* code, PyObject* closure,
                           PyObject* globals);
    bool is_arguments() const { return names != nullptr; }
    bool is_frame() const { return kinds != nullptr; }

    /// Argument and frame mode: the value of local `name` (borrowed), null if no parameter (no
    /// visible fast local) has that name or it is not set. `hint` caches the slot index per
    /// caller; names are compared by identity first (both sides interned), then by value.
    PyObject* argument(PyObject* name, Py_ssize_t* hint) const { return argument_hot(name, hint); }
    /// argument(), forced inline: the fast pass without user code (a @specialize hit loads every
    /// root through it) uses it. Forced inline everywhere it made other checks' code slower
    /// (layout), so only that caller takes it. The hinted slot of a plain local only; free
    /// variables (frame mode) take argument_slow.
    [[gnu::always_inline]] PyObject* argument_hot(PyObject* name, Py_ssize_t* hint) const {
        const Py_ssize_t h = *hint;
        // A hint set under another code's layout (one guard set used for frames of two codes) may
        // name a hidden slot here: those are never read (argument_slow refuses them).
        if (h >= 0 && h < count && h < free_begin && !free_shadows && PyTuple_GET_ITEM(names, h) == name &&
            (kinds == nullptr || (kinds[h] & kFastHiddenKind) == 0))
            return values[h];
        return argument_slow(name, hint);
    }

    /// The locals as a mapping (new reference): `mapping` itself, or a new dict of the arguments.
    /// Null with a Python error set on failure.
    Ref as_mapping() const;

  private:
    PyObject* argument_slow(PyObject* name, Py_ssize_t* hint) const;
    /// The contents of free variable slot `i`'s closure cell (borrowed), or null.
    PyObject* free_value(Py_ssize_t i) const {
        PyObject* cell = PyTuple_GET_ITEM(closure, i - free_begin);
        return PyCell_Check(cell) ? PyCell_GET(cell) : nullptr;
    }
};

}  // namespace tripwire::runtime
