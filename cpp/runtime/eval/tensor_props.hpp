// tripwire/cpp/runtime/eval/tensor_props.hpp -- the SIZE, STRIDE and STORAGE_OFFSET steps.
//
// Today every read goes through the object's own Python methods (the generic path below), which
// is correct for torch tensors, numpy arrays and anything that quacks like them, and costs a
// Python call per read: the steps are classed as running user code (core::step_runs_user_code).
//
// ---- WHERE THE FAST READER PLUGS IN -----------------------------------------------------------
// A C-level reader of tensor and array fields (cpp/runtime/tensors/: the torch adapter's
// at::Tensor accessors, the numpy array struct) installs itself with
// set_tensor_property_reader(). fetch_tensor_property() asks it first; it answers for the exact
// types it knows without running any Python code, and says Unknown for anything else, which then
// takes the generic path. Once it is wired, a SHAPE symbol on a size can be stored straight into
// the shape frame from `read` (no PyLong), and the fast pass may treat these steps as pure for
// the reader's types (see GuardSet::build_fast_pass).
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

}  // namespace tripwire::runtime
