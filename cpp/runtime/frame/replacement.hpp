// tripwire/cpp/runtime/frame/replacement.hpp -- a code object checked to run in another's frames.
//
// The frame runtime runs a JIT's replacement code in the frame CPython made for the original
// code (interp_frame.hpp), so the replacement must agree with the frame's layout where the frame
// has already been filled: the argument slots (count, *args, **kwargs) and the free variables
// (the function's closure is copied into the last slots by the code's own COPY_FREE_VARS, in the
// order of co_freevars). Everything else is the replacement's own: its other locals start null,
// cells are made by its own MAKE_CELL (a cell argument still holds its plain value at entry), its
// stack and frame size may differ (the frame is extended). It must not be a generator or
// coroutine (the frame would have to become one).
//
// A Replacement is the payload of a frame cache entry: the replacement code, and a weak
// reference to the original it was checked against. It is made only through that check, so a
// hit trusts it after one identity comparison; an entry put in a cache by hand with any other
// payload is refused at the hit.
#pragma once

#include <string>

#include "runtime/py.hpp"

namespace tripwire::runtime::frame {

/// Why `code` cannot run in frames of `original`, or empty when it can.
std::string incompatibility(PyCodeObject* original, PyCodeObject* code);

/// The Replacement type, created on first use (a new reference), or null with an error set.
PyTypeObject* replacement_type();

/// A new Replacement of `original` by `code`: TypeError naming the mismatch when incompatible.
PyObject* make_replacement(PyObject* original, PyObject* code);

/// The replacement code of `payload` when it is a Replacement made for `original` (borrowed),
/// else null. The hit path: two comparisons and a weak-reference read, no error set.
PyCodeObject* replacement_code_for(PyObject* payload, PyCodeObject* original);

/// The original and replacement code objects of a Replacement (borrowed; the original may be
/// null once dead), for its Python attributes.
PyObject* replacement_original(PyObject* r);
PyObject* replacement_code(PyObject* r);

}  // namespace tripwire::runtime::frame
