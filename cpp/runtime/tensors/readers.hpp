// tripwire/cpp/runtime/tensors/readers.hpp -- reading tensors, arrays and torch's state in C++.
//
// The evaluator never includes torch or numpy's API. It reads:
// - torch tensors and torch's global state through the optional torch adapter
//   (cpp/adapters/torch), a separate extension module whose C table (adapter_abi.h) the package
//   installs when torch is imported and the adapter was built; without it, through Python
//   readers the package registers (tripwire/tensors.py), which count as user code;
// - numpy arrays from the array struct (numpy_struct.cpp), whose fields are declared there as
//   numpy's C API documents them (no numpy headers at build time) and verified against numpy's
//   own view at run time before they are read (the package calls enable_numpy_struct); without
//   it, through a Python reader.
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

/// PyArray_Descr's layout after its common leading fields: numpy 1.x (an int elsize right after
/// type_num) or 2.x (a 64-bit flags word, then an npy_intp elsize). The package names it from
/// numpy's major version; the probes below verify it.
enum class NumpyDescrLayout : std::uint8_t { V1 = 1, V2 = 2 };
/// Turn on reading arrays from the struct for instances of `ndarray_type` and its subtypes (and
/// numpy dtypes: instances of `dtype_type`), after the package verified the layout (read_array_struct_of
/// and read_descr_of against numpy's own attributes). Once: a later call changes nothing (true only
/// when it names the same types and layout). False when a type is not numpy's own (the imported
/// module's `ndarray` and `dtype`) or too small for the declared fields, or the layout is unknown.
bool enable_numpy_struct(PyObject* ndarray_type, PyObject* dtype_type, int descr_layout);
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
/// The same against explicit types and layout, before enabling: the package compares what this
/// reads with numpy's own attributes on probe arrays (the layout check), then enables. False
/// also when the array's descr is not a `dtype`.
bool read_array_struct_of(PyObject* obj, PyTypeObject* ndarray, PyTypeObject* dtype, int descr_layout,
                          ArrayView& out);
/// A dtype's fields as read from its struct (the probes compare them with dtype.num, .kind, .char,
/// .byteorder and .itemsize).
struct DescrView {
    int type_num = 0;
    char kind = 0, type = 0, byteorder = 0;
    std::int64_t elsize = 0;
};
bool read_descr_of(PyObject* d, PyTypeObject* dtype, int descr_layout, DescrView& out);
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
