// tripwire/cpp/runtime/tensors/property_reader.hpp -- the C-level reader of the SIZE, STRIDE and
// STORAGE_OFFSET steps (runtime/eval/tensor_props.hpp, "where the fast reader plugs in").
//
// A SHAPE symbol such as `L['x'].size()[0]` means what Python's `x.size()[0]` returns. This reader
// answers without a Python call only where that is provably the same value:
// - a numpy array whose type is exactly numpy.ndarray (a static type: its `shape` and `strides`
//   are data descriptors no subclass or instance can replace), read from the array struct;
// - a torch tensor whose type is exactly one of the plain tensor types the package registered
//   (torch.Tensor and torch.nn.Parameter: torch's own `size`/`stride`/`storage_offset` skip
//   `__torch_function__` for these two types), while (1) the type's version tag is the one
//   recorded when the package checked that those three methods are TensorBase's (any later
//   assignment to the class or a base changes the tag), (2) the instance has no attribute of
//   that name (an instance attribute would shadow the method), (3) no torch-function mode is on
//   the stack (torch would call the mode), and (4) the adapter reads the tensor (strided layouts
//   only for STRIDE and STORAGE_OFFSET, where torch raises otherwise).
// Anything else is Unknown and takes the generic path, which calls Python as before: a subclass,
// an overridden size(), a tensor under a mode, a sparse tensor's strides.
#pragma once

#include <cstdint>

#include "core/ir.hpp"
#include "runtime/eval/tensor_props.hpp"
#include "runtime/py.hpp"

namespace tripwire::runtime {

/// Register the exact tensor types whose size()/stride()/storage_offset() are torch's C methods
/// (the package passes torch.Tensor and torch.nn.Parameter). A type is kept only if it derives
/// from the adapter's TensorBase and the three names resolve to TensorBase's own descriptors;
/// returns how many were kept. Needs the adapter (0 without it). GIL held.
int register_plain_tensor_types(PyObject* const* types, int n);

/// Make read_tensor_property the process's property reader (once the adapter or the numpy struct
/// is enabled). GIL held.
void install_property_reader();

/// The reader (see the header comment). Runs no Python code, allocates nothing, sets no error.
PropertyRead read_tensor_property(PyObject* v, core::StepKind kind, std::int64_t index, std::int64_t* out);

}  // namespace tripwire::runtime
