// tripwire/cpp/runtime/eval/tensor_props.hpp -- the SIZE, STRIDE and STORAGE_OFFSET steps.
//
// Every read first asks the process's C-level reader; what it does not answer goes through the
// object's own Python methods (the generic path below), which is correct for torch tensors, numpy
// arrays and anything that quacks like them, and costs a Python call per read. The steps stay
// classed as running user code (core::step_runs_user_code): the walk holds references.
//
// ---- WHERE THE FAST READER PLUGS IN -----------------------------------------------------------
// The reader (cpp/runtime/tensors/property_reader.hpp: the torch adapter's at::Tensor accessors,
// the numpy array struct) installs itself with set_tensor_property_reader() when the adapter or
// the struct is enabled. It answers only for the exact types whose Python methods it provably
// reproduces (torch.Tensor and torch.nn.Parameter with torch's own methods, no instance override
// and no torch-function mode; exactly numpy.ndarray), without running any Python code, and says
// Unknown for anything else, which then takes the generic path. The walk gets its answer here
// (as a new int); the fast pass (GuardSet::build_fast_pass, FastOp::TensorProp) stores it
// straight into the shape frame, and hands the check to the walk when the reader says Unknown.
// ------------------------------------------------------------------------------------------------
#pragma once

#include <cstdint>

#include "core/ir.hpp"
#include "runtime/eval/fetch.hpp"
#include "runtime/py.hpp"

namespace tripwire::runtime {

/// What a C-level reader made of one property read.
enum class PropertyRead : std::uint8_t {
    Unknown,  ///< not a type it knows: take the generic path
    Value,    ///< *out holds the property
    Missing,  ///< a type it knows, without this property (index past the rank; no storage offset)
};

/// A C-level reader: `kind` is Size, Stride or StorageOffset, `index` the dimension. Must not
/// run Python code, allocate Python objects or set an error.
using TensorPropertyReader = PropertyRead (*)(PyObject* v, core::StepKind kind, std::int64_t index,
                                              std::int64_t* out);

/// Install (or, with null, remove) the process-wide reader. GIL held.
void set_tensor_property_reader(TensorPropertyReader reader);
TensorPropertyReader tensor_property_reader();

/// Whether `v` is a numpy array (its type, or a base of it, is numpy.ndarray), decided from the
/// type objects' names without importing numpy or running any Python code.
bool is_numpy_array(PyObject* v);

/// Fetch a SIZE/STRIDE/STORAGE_OFFSET step: the reader's answer, else the generic path:
///   SIZE(i):           v.size()[i]          numpy arrays: v.shape[i]
///   STRIDE(i):         v.stride()[i]        numpy arrays: v.strides[i] (bytes)
///   STORAGE_OFFSET:    v.storage_offset()   numpy arrays: missing (they have none)
/// An IndexError/KeyError from the subscript is a missing value; any other exception an error.
Fetched fetch_tensor_property(const RuntimeStep& step, PyObject* v);

/// Fetch a C++ tensor step (TENSOR_SIZE, TENSOR_STRIDE, TENSOR_STORAGE_OFFSET, GRAD: torch's
/// TensorPropertyGuardAccessor and GradGuardAccessor) through the torch adapter: the value, or
/// missing wherever torch's accessor fails (not a torch.Tensor, index >= dim, a symbolic value,
/// torch threw). Never a Python method, never a Python error. Without the adapter: missing (a
/// GuardSet refuses to bind these steps then, so this is reached only if it is unloaded).
Fetched fetch_cpp_tensor_step(const RuntimeStep& step, PyObject* v);

}  // namespace tripwire::runtime
