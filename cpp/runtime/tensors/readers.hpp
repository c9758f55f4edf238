// tripwire/cpp/runtime/tensors/readers.hpp -- reading tensors, arrays and torch's state in C++.
//
// The evaluator never includes torch or numpy's API. It reads:
// - torch tensors and torch's global state through the optional torch adapter
//   (cpp/adapters/torch), a separate extension module whose C table (adapter_abi.h) the package
//   installs when torch is imported and the adapter was built; without it, through Python
//   readers the package registers (tripwire/tensors.py), which count as user code;
// - numpy arrays from the array struct, whose layout comes from numpy's headers at build time
//   (TRIPWIRE_HAVE_NUMPY) and is verified against numpy's own view at run time before it is
//   used (the package calls enable_numpy_struct); without it, through a Python reader.
//
// This header is also the interface other runtime areas use to read a tensor's or an array's
// sizes, strides and storage offset without a Python call (read_shape).
#pragma once

#include <cstdint>

#include "runtime/py.hpp"
#include "runtime/tensors/adapter_abi.h"

namespace tripwire::runtime {

// -- the torch adapter ------------------------------------------------------------------------------

/// Install the adapter table found in `capsule` (a PyCapsule named
/// TRIPWIRE_TORCH_ADAPTER_CAPSULE). False with a Python error set when the table is unusable
/// (another ABI version, a torch the adapter was not built for). Once installed it stays: guard
/// sets keep raw pointers into torch's types.
bool install_torch_adapter(PyObject* capsule, const char* torch_version);
/// The installed adapter (set once by install_torch_adapter, never changed after), or null.
/// Inline: GLOBAL_STATE's fast form calls through it on every check.
extern const TwTorchAdapter* g_adapter;
inline const TwTorchAdapter* torch_adapter() { return g_adapter; }

// -- Python readers (the path without the adapter or the numpy struct) ------------------------------

/// The Python callables the package registers; each may be null.
struct PythonReaders {
    Ref tensor;  ///< tensor -> (keys, dtype, device_index, requires_grad, sizes, strides|None, offset) | None
    Ref array;   ///< array -> (ndim, sizes, strides, flags, dtype) | None
    Ref torch_state;     ///< () -> tuple of ints in the torch_state layout
    Ref mode_stack;      ///< () -> tuple of the modes' types
    Ref default_device;  ///< () -> None or str(CURRENT_DEVICE)
    Ref saved_hooks;     ///< () -> None or (id(pack), id(unpack)) of inlineable saved-tensor hooks
    Ref dual_level;      ///< () -> forward_ad._current_level (an int), or a non-int marker
};
PythonReaders& python_readers();
/// Test switch: guard sets built while it is on read tensors, arrays and torch's state through
/// the Python readers even when the adapter or the struct is available (both paths are tested
/// in one process). Off by default.
void set_force_python_readers(bool on);
bool force_python_readers();

// -- numpy -------------------------------------------------------------------------------------------

/// Whether this build read numpy's headers (TRIPWIRE_HAVE_NUMPY).
bool numpy_struct_compiled();
/// Turn on reading arrays from the struct for instances of `ndarray_type` and its subtypes, after
/// the package verified the layout (numpy_struct_view against numpy's own attributes). Returns
/// false when this build has no numpy struct or the type is not usable.
bool enable_numpy_struct(PyObject* ndarray_type);
/// numpy.ndarray once enabled (borrowed), else null.
PyTypeObject* numpy_ndarray_type();

/// An array's fields as read from its struct: valid while the array is alive and unchanged.
struct ArrayView {
    std::int64_t ndim = 0;
    const std::int64_t* sizes = nullptr;
    const std::int64_t* strides = nullptr;  ///< in bytes
    int flags = 0;                          ///< numpy's NPY_ARRAY_* bits
    PyObject* descr = nullptr;              ///< the dtype (borrowed)
    const void* data = nullptr;
    std::int64_t itemsize = 0;
};
/// Read an array whose type is (a subtype of) the enabled ndarray type. False for anything else.
bool read_array_struct(PyObject* obj, ArrayView& out);
/// The same against an explicit ndarray type, before enabling: the package compares what this
/// reads with numpy's own attributes on probe arrays (the layout check), then enables.
bool read_array_struct_of(PyObject* obj, PyTypeObject* ndarray, ArrayView& out);
/// The numpy flag bits ARRAY_MATCH uses, as core::array_data bits (C, F, aligned), and writeable.
int array_required_bits(int numpy_flags);
bool array_writeable(int numpy_flags);

/// Whether numpy dtype `d` compares by its fields alone (a built-in number, bool, object, bytes or
/// str type: no fields, no subarray, no datetime unit, no user DType). Runs no user code.
bool numpy_dtype_is_simple(PyObject* d);
/// numpy's dtype equality for two simple dtypes (numpy_dtype_is_simple): same type number, byte
/// order and item size. Allocation-free.
bool numpy_simple_dtypes_equal(PyObject* a, PyObject* b);
/// Whether `o` is a numpy dtype instance (its type derives from numpy.dtype), once enabled.
bool is_numpy_dtype(PyObject* o);

// -- shapes, for other areas --------------------------------------------------------------------------

/// Shape facts of a tensor or an array, read without a Python call.
struct ShapeView {
    std::int64_t ndim = 0;
    const std::int64_t* sizes = nullptr;
    const std::int64_t* strides = nullptr;  ///< null when the layout has none (sparse tensors)
    std::int64_t storage_offset = 0;        ///< tensors only (elements)
    bool has_storage_offset = false;
    std::int64_t stride_unit = 1;  ///< 1: strides in elements (tensors); itemsize: bytes (arrays)
};
enum class ShapeRead : std::uint8_t {
    Ok,  ///< `out` is filled; the pointers stay valid while the object is alive and no Python code ran
    NotApplicable,  ///< not a tensor or array this runtime knows
    Unavailable,    ///< a tensor, but no adapter is installed (or torch refused to read it)
};
/// Read `obj`'s shape: torch tensors through the adapter, numpy arrays from the struct. Runs no
/// user code and allocates nothing.
ShapeRead read_shape(PyObject* obj, ShapeView& out);

}  // namespace tripwire::runtime
