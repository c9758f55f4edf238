/* tripwire/cpp/runtime/tensors/adapter_abi.h -- the C interface between tripwire._core and the
 * optional torch adapter module (cpp/adapters/torch).
 *
 * The core module never includes or links torch. The adapter is a separate extension module,
 * tripwire._torch_adapter, compiled against the installed torch's public C++ API; it exports one
 * PyCapsule named TRIPWIRE_TORCH_ADAPTER_CAPSULE holding a `TwTorchAdapter` table of plain C
 * function pointers, which _core installs (runtime/tensors/torch_adapter.hpp). Everything that
 * crosses is plain data or borrowed PyObject pointers, so the two modules share no C++ type and
 * no allocator. The table is versioned: _core refuses a table whose abi_version or struct_size
 * it does not know.
 *
 * Every function is called with the GIL held, never raises a C++ exception across this
 * boundary, never calls Python code and never allocates a Python object, unless its comment
 * says otherwise.
 */
#ifndef TRIPWIRE_RUNTIME_TENSORS_ADAPTER_ABI_H
#define TRIPWIRE_RUNTIME_TENSORS_ADAPTER_ABI_H

#include <Python.h>
#include <stdbool.h>
#include <stdint.h>

#define TRIPWIRE_TORCH_ADAPTER_ABI                                                                \
    7 /* 2: tensor_fields, python_keys_mask, global_state_matches; read_global_state(all_dtypes); \
         3: saved_tensors_hooks_top; 4: cpp_tensor_property, cpp_tensor_grad,                     \
         tensors_may_overlap, tensor_matches; 5: dispatch_key_set_type,                           \
         dispatch_key_set_bits; 6: mode_flag_getter; 7: local_keys_save, local_keys_restore */
#define TRIPWIRE_TORCH_ADAPTER_CAPSULE "tripwire._torch_adapter.TwTorchAdapter"

#ifdef __cplusplus
extern "C" {
#endif

/* A tensor's fields as TENSOR_MATCH compares them. `sizes` and `strides` point into the tensor's
 * own metadata: valid while the tensor is alive and unchanged (no Python code ran). */
typedef struct TwTensorMeta {
    uint64_t dispatch_keys;     /* the key set with the thread-local include/exclude sets applied,
                                   Python keys masked as torch's guards do */
    uint64_t raw_dispatch_keys; /* the tensor's own key set */
    int32_t dtype;              /* c10::ScalarType */
    int32_t device_type;        /* c10::DeviceType */
    int32_t device_index;       /* -1: none */
    int32_t layout;             /* c10::Layout (0: strided) */
    int32_t requires_grad;
    int32_t has_strides; /* 0 for layouts without strides (sparse, compressed) */
    int64_t ndim;
    const int64_t* sizes;
    const int64_t* strides;   /* null when !has_strides */
    int64_t storage_offset;   /* in elements */
    const void* storage_data; /* the storage's base address, null when unknown */
    int64_t storage_nbytes;   /* the storage's size in bytes, -1 when unknown */
    int64_t itemsize;         /* bytes per element */
} TwTensorMeta;

/* What TENSOR_MATCH compares, read by the lean per-check reader (tensor_fields). */
typedef struct TwTensorFields {
    uint64_t dispatch_keys; /* after the thread-local include/exclude sets; Python keys NOT masked */
    int32_t dtype;
    int32_t device_index;
    int32_t requires_grad;
    int32_t has_strides;
    int64_t ndim;
    const int64_t* sizes;
    const int64_t* strides; /* null when !has_strides */
    int64_t storage_offset;
} TwTensorFields;

/* TENSOR_MATCH's expected record (core/kind_data.hpp tensor_data), which tensor_matches reads:
 * dispatch keys, dtype, device index, requires_grad, ndim, storage offset, then (size, stride)
 * per dimension; TW_TENSOR_ANY leaves a size, a stride or the storage offset unchecked. The core
 * static_asserts that these agree with its layout. */
#define TW_TENSOR_KEYS 0
#define TW_TENSOR_DTYPE 1
#define TW_TENSOR_DEVICE_INDEX 2
#define TW_TENSOR_REQUIRES_GRAD 3
#define TW_TENSOR_NDIM 4
#define TW_TENSOR_STORAGE_OFFSET 5
#define TW_TENSOR_HEADER 6
#define TW_TENSOR_ANY INT64_MIN

/* tensor_matches' per-check memo of the thread-local dispatch key sets: read once per check
 * (`valid` 0: not read yet), and the last raw key set with the sets applied (most tensors of a
 * model share one). The caller resets it (tw_key_memo_reset) at the start of every check and
 * whenever Python code may have run since (a residue: user code may enter or leave a
 * dispatch-key guard). */
typedef struct TwKeyMemo {
    int32_t valid;
    uint64_t included, excluded; /* raw bits of the thread-local include / exclude sets */
    uint64_t last_raw, last_applied;
} TwKeyMemo;

/* A reset memo: nothing read, and a last pair that decides nothing, so that tensor_matches' common
 * path tests only `raw == last_raw` (no test of `valid` per tensor). A tensor whose raw set is
 * all ones would take last_applied, all ones: it carries the Python keys, which tensor_matches
 * never passes (0, not decided: the caller's full reader decides), so a reset memo never yields a
 * pass. Every reset goes through here: a memo left with an old pair after user code changed the
 * thread-local sets would apply the old sets (a false pass). */
static inline void tw_key_memo_reset(TwKeyMemo* m) {
    m->valid = 0;
    m->last_raw = UINT64_MAX;
    m->last_applied = UINT64_MAX;
}

/* A torch global-state snapshot (core/kind_data.hpp torch_state) compiled once for the per-check
 * comparison: the header fields, and per autocast device its type, whether it is enabled (also as
 * a bit mask) and its dtype. */
#define TW_MAX_AUTOCAST_DEVICES 64
typedef struct TwGlobalState {
    int64_t header[12];
    uint64_t autocast_enabled_mask; /* bit i: device i enabled */
    int32_t n_devices;
    int32_t device_types[TW_MAX_AUTOCAST_DEVICES];
    int32_t dtypes[TW_MAX_AUTOCAST_DEVICES];
} TwGlobalState;

/* The thread-local dispatch key sets (raw bits), as torch.compile's per-call wrapper saves them
 * before a compiled call and puts them back after it (_ForceDispatchKeyGuard). */
typedef struct TwLocalKeys {
    uint64_t included, excluded;
} TwLocalKeys;

/* The adapter's table. Fields are only ever appended; struct_size says how many a build has. */
typedef struct TwTorchAdapter {
    uint32_t abi_version;      /* TRIPWIRE_TORCH_ADAPTER_ABI */
    uint32_t struct_size;      /* sizeof(TwTorchAdapter) in the adapter's build */
    const char* torch_version; /* the torch version the adapter was compiled against */

    /* The Python types of torch's value-like objects (borrowed; torch keeps them alive). */
    PyTypeObject* tensor_base_type; /* torch._C.TensorBase: every tensor's type derives from it */
    PyTypeObject* dtype_type;       /* torch.dtype */
    PyTypeObject* device_type;      /* torch.device */
    PyTypeObject* size_type;        /* torch.Size */

    /* 1 and `out` filled when `obj` is a tensor whose fields could be read; 0 when obj is not a
     * tensor (its type does not derive from TensorBase) or holds no tensor; -1 when torch
     * refused to read a field (an exception inside torch, swallowed here) or reading it would
     * call code (tensor_fields' 2). `mask_python_keys`:
     * remove the Python, PythonTLSSnapshot and PythonDispatcher keys after applying the
     * thread-local sets (torch masks them unless a dispatch mode without
     * ignore_compile_internals is active). */
    int (*read_tensor)(PyObject* obj, int mask_python_keys, TwTensorMeta* out);

    /* The per-check reader of TENSOR_MATCH: `obj` must be an instance of a type deriving from
     * tensor_base_type (the caller checked its exact type against one). 1 and `out` filled, 0
     * when torch refused (an undefined tensor, an exception), or 2 when reading the fields would
     * call code: a custom sizes/strides, device or layout policy (a __torch_dispatch__ wrapper
     * subclass's Python, a C++ impl's virtual override); nothing is read then, and the caller
     * reads the tensor outside its region (the Python reader). The Python keys are left in:
     * the caller masks them (python_keys_mask) only when present, so the flag that decides it
     * is read only then. */
    int (*tensor_fields)(PyObject* obj, TwTensorFields* out);
    /* The raw bits of DispatchKeySet{Python, PythonTLSSnapshot, PythonDispatcher}: functionality
     * keys only, so removing them is a plain `keys & ~mask`. */
    uint64_t python_keys_mask;

    /* Apply the current thread-local include/exclude sets (and the mask) to a raw key set, as
     * torch's guards do at build time. */
    uint64_t (*apply_local_keys)(uint64_t raw_keys, int mask_python_keys);

    /* torch's global state in the layout of core/kind_data.hpp torch_state (header, then per
     * autocast device its type, its enabled flag, its dtype). With `all_dtypes` 0, the dtype of a
     * device whose autocast is disabled is not read (written as -1): torch compares it only while
     * enabled. Returns the number of entries written, or -1 when `capacity` is too small. */
    int (*read_global_state)(int64_t* out, int capacity, int all_dtypes);
    /* 1 when torch's global state now equals `want` by GlobalStateGuard::check's rule (an
     * autocast dtype counts only while enabled), else 0. Reads each field once, stops at the
     * first difference, writes nothing. Devices are compared by position: the caller checked
     * that `want` lists this torch's autocast devices in read_global_state's order. */
    int (*global_state_matches)(const TwGlobalState* want);

    /* The torch-function mode stack: its length, and the mode at position i (borrowed, or null
     * when out of range). */
    int64_t (*function_mode_stack_len)(void);
    PyObject* (*function_mode_at)(int64_t i);

    /* 1 and (type, index) when obj is a torch.device, else 0. */
    int (*read_device)(PyObject* obj, int32_t* type, int32_t* index);
    /* Parse a device string as torch.device does ("cpu", "cuda:1"): 1 on success, 0 if torch
     * rejects it. */
    int (*parse_device)(const char* text, int32_t* type, int32_t* index);
    /* The c10::ScalarType of a torch.dtype, or -1 when obj is not one. */
    int (*dtype_code)(PyObject* obj);
    /* EQUALS_MATCH of two torch.device objects (exact types already checked): 1 or 0. */
    int (*device_equal)(PyObject* a, PyObject* b);

    /* The top of the current thread's saved-tensor default hooks stack, as
     * torch._C._autograd._top_saved_tensors_default_hooks(True) reads it (is_tracing ignored):
     * 1 and the (pack, unpack) pair (borrowed; the stack holds them), 0 when the stack is
     * empty, -1 when torch refused (an exception inside torch, swallowed here). Reads a
     * thread-local, copies nothing. */
    int (*saved_tensors_hooks_top)(PyObject** pack, PyObject** unpack);

    /* torch's TensorPropertyGuardAccessor (the TENSOR_SIZE / TENSOR_STRIDE /
     * TENSOR_STORAGE_OFFSET steps). `prop` is 0 size, 1 stride, 2 storage offset; `index` >= 0.
     * 1 and *out when `obj` is an instance of torch.Tensor (a subtype of it; torch's
     * THPVariable_Check, without its `__class__` lookup) whose value torch reads as a plain int
     * (sym_size(index) / sym_stride(index) / sym_storage_offset(), maybe_as_int); 0 when torch's
     * accessor fails: not a tensor, index >= dim, a symbolic value, or torch threw (swallowed).
     * A tensor with the Python dispatch key (a __torch_dispatch__ subclass, whose sizes may be
     * answered by Python) is not read: 0 (stricter than torch, which would run that code). */
    int (*cpp_tensor_property)(PyObject* obj, int prop, int64_t index, int64_t* out);
    /* torch's GradGuardAccessor (the GRAD step): a new reference to the tensor's C++ grad field
     * wrapped as THPVariable_Wrap does (Py_None when undefined), or null, with no error set,
     * when obj is not a torch.Tensor instance or torch threw. May allocate (a grad with no Python
     * object yet gets one). Reads the field without the non-leaf warning of Tensor::grad(). */
    PyObject* (*cpp_tensor_grad)(PyObject* obj);
    /* torch's STORAGE_OVERLAPPING pairwise test: 0 when torch's
     * tensors_definitely_do_not_overlap<StaticMeta>(x, y) says they cannot overlap, 1 when they
     * may, -1 when either is not a torch.Tensor instance or torch threw (swallowed). Reads
     * metadata only (is_same, numel, storage_offset, is_contiguous, sizes, strides), as torch
     * does: the storages themselves are not compared. -1 for a tensor with the Python dispatch
     * key or whose fields would be read by code (its metadata may be answered by Python). */
    int (*tensors_may_overlap)(PyObject* x, PyObject* y);
    /* TENSOR_MATCH's common case in one call: 1 when `obj` (an instance of a type deriving from
     * tensor_base_type; the caller checked its exact type) is a strided tensor whose fields all
     * equal the expected record `want` (layout above), with the thread-local key sets applied
     * through `memo` and no Python key in the result; else 0 (a difference, a layout without
     * strides, Python keys, an unreadable tensor, one whose fields would be read by code: the
     * caller's full reader decides). */
    int (*tensor_matches)(PyObject* obj, const int64_t* want, TwKeyMemo* memo);

    /* ABI 5: DISPATCH_KEY_SET_MATCH. torch._C.DispatchKeySet (borrowed; torch keeps it alive), or
     * null when the adapter could not verify that it reads such objects as torch does (then the
     * core refuses the kind). */
    PyTypeObject* dispatch_key_set_type;
    /* 1 and the raw bits of the c10::DispatchKeySet `obj` holds when obj's type derives from
     * dispatch_key_set_type (torch's pybind11 cast accepts exactly those) and its C++ value was
     * constructed; 0 otherwise (another type, a value never constructed, a subclass that also
     * derives from another pybind11 class). Reads the C++ value in place: none of the object's
     * methods (which a subclass may override) is called. */
    int (*dispatch_key_set_bits)(PyObject* obj, uint64_t* out);

    /* ABI 6: torch's getter of its per-thread "dispatch mode without ignore_compile_internals"
     * flag (torch::dynamo::get_is_in_mode_without_ignore_compile_internals, a hidden function of
     * libtorch_python.so, found in its ELF symbol table: cpp/adapters/torch/hidden_symbol.hpp), or
     * null when it was not found. Unverified: the core calls it only once it follows torch's own
     * setter (runtime/tensors/mode_flag.hpp). Runs no Python code, allocates nothing. */
    bool (*mode_flag_getter)(void);

    /* ABI 7: compile_wrapper's dispatch-key protection, in C (through Python it is two pybind11
     * calls that each build a DispatchKeySet object, most of a compiled call's overhead).
     * local_keys_save fills `out` from the current thread; local_keys_restore sets the
     * thread's local include/exclude sets to `saved`, as _ForceDispatchKeyGuard does. Neither
     * can fail, allocate or call Python code. */
    void (*local_keys_save)(TwLocalKeys* out);
    void (*local_keys_restore)(const TwLocalKeys* saved);
} TwTorchAdapter;

#ifdef __cplusplus
}
#endif

#endif /* TRIPWIRE_RUNTIME_TENSORS_ADAPTER_ABI_H */
