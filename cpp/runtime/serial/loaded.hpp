// tripwire/cpp/runtime/serial/loaded.hpp -- the load-time checks of a decoded guard set that need
// its constants: one C++ pass, so that GuardSet.from_bytes validates everything at load without
// building a Python GuardSpec per guard (those are built on the first diagnostic).
//
// The core decoder (core/codec) has checked the bytes, every index and every record; what it
// cannot check without Python objects is checked here: each source's printed texts are the
// rendering of its steps (exactly as tripwire.source.Source.__str__ prints them), each step's key
// has a type a step may take, root names are str, and the operands of the common kinds have the
// types their kind takes. The Python loader checks the remaining kinds (GLOBAL_STATE, SHAPE, the
// tensor kinds) itself; `python_checked` lists them.
#pragma once

#include <cstdint>
#include <vector>

#include "core/codec/document.hpp"
#include "runtime/py.hpp"

namespace tripwire::runtime::serial {

/// What the loader learns from check_loaded.
struct LoadedFacts {
    bool reads_globals = false;                 ///< a source or shape symbol has a G[...] root
    std::vector<std::uint32_t> python_checked;  ///< positions in doc.guards the Python loader checks
    /// A guard the engine reads through the torch adapter only: STORAGE_OVERLAPPING,
    /// DISPATCH_KEY_SET_MATCH, or a source or symbol with a C++ tensor step (TENSOR_SIZE,
    /// TENSOR_STRIDE, TENSOR_STORAGE_OFFSET, GRAD). The loader switches torch support on first.
    bool reads_torch_adapter = false;
};

/// Check `doc` against its built constants (`consts`, a list, one object per constant) and intern
/// the str root names and step keys in place (the engine compares them by identity). Throws
/// core::codec::FormatError naming the guard's byte offset; never leaves a Python error set.
LoadedFacts check_loaded(const core::codec::Document& doc, PyObject* consts);

/// A new list: `consts` with each constant flagged weak (bit 0 of `flags`) that can be weakly
/// referenced replaced by a tuple (weakref, id, type name), so that a loaded set's lazily built
/// diagnostics hold no strong reference to the objects it names by identity and still describe
/// one that died before they were built. `weak_positions` receives the replaced positions. Null
/// with a Python error set on failure.
PyObject* hold_weakly(PyObject* consts, const std::vector<std::uint8_t>& flags,
                      std::vector<std::uint32_t>& weak_positions);

}  // namespace tripwire::runtime::serial
