// tripwire/cpp/adapters/torch/adapter.hpp -- the torch adapter's units, as module.cpp sees them.
//
// The adapter's functions by role (tensors.cpp, global_state.cpp, dispatch_keys.cpp, devices.cpp):
// those module.cpp puts in the TwTorchAdapter table and the load-time checks it runs, and the
// Python types module.cpp adds to the module (compiled_module.cpp). Everything else stays inside
// its unit. The per-check functions (tensor_matches, global_state_matches) are
// called through the table, so nothing they inline crosses a unit: each keeps its helpers beside it.
#pragma once

#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <cstddef>
#include <cstdint>

#include "runtime/tensors/adapter_abi.h"

namespace tripwire::torch_adapter {

// The Python keys torch's guards mask unless a dispatch mode without ignore_compile_internals is
// active (torch/csrc/dynamo/guards.h, LocalState::apply).
inline const c10::DispatchKeySet kPythonKeys({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot,
                                              c10::DispatchKey::PythonDispatcher});

inline c10::DispatchKeySet apply_local(c10::DispatchKeySet ks, int mask_python_keys) {
    const c10::impl::LocalDispatchKeySet local = c10::impl::tls_local_dispatch_key_set();
    // DispatchKeySet's own operators: `-` keeps the backend bits (a set difference on
    // functionality keys only), which plain bit operations would not.
    c10::DispatchKeySet out = (ks | local.included_) - local.excluded_;
    if (mask_python_keys) out = out - kPythonKeys;
    return out;
}

// -- tensors.cpp ---------------------------------------------------------------------------------
int read_tensor(PyObject* obj, int mask_python_keys, TwTensorMeta* out) noexcept;
int tensor_fields(PyObject* obj, TwTensorFields* out) noexcept;
int cpp_tensor_property(PyObject* obj, int prop, int64_t index, int64_t* out) noexcept;
int tensor_matches(PyObject* obj, const int64_t* want, TwKeyMemo* memo) noexcept;
PyObject* cpp_tensor_grad(PyObject* obj) noexcept;
int tensors_may_overlap(PyObject* x, PyObject* y) noexcept;
// Finds the impl's policy bits on a tensor of our own (else every tensor takes the full test).
void load_tensor_policies() noexcept;
// Whether read_by_code's "every policy Default" is one masked load.
bool policy_window_found() noexcept;
// Whether requires_grad is read through the impl's autograd meta pointer (probe_autograd_route).
bool autograd_route_found() noexcept;

// -- global_state.cpp ----------------------------------------------------------------------------
int read_global_state(int64_t* out, int capacity, int all_dtypes) noexcept;
int global_state_matches(const TwGlobalState* want) noexcept;
int64_t function_mode_stack_len() noexcept;
PyObject* function_mode_at(int64_t i) noexcept;
int saved_tensors_hooks_top(PyObject** pack, PyObject** unpack) noexcept;
// The autocast keys, and each private read checked against its accessor (else the accessor reads).
void load_global_state() noexcept;
// Where the autocast cache flag was found in libtorch_cpu's TLS block (-1: read by the accessor).
std::ptrdiff_t autocast_cache_flag_offset() noexcept;

// -- dispatch_keys.cpp ---------------------------------------------------------------------------
uint64_t apply_local_keys(uint64_t raw, int mask_python_keys) noexcept;
void local_keys_save(TwLocalKeys* out);
void local_keys_restore(const TwLocalKeys* saved);
int dispatch_key_set_bits(PyObject* obj, uint64_t* out) noexcept;
// torch._C.DispatchKeySet once dispatch_key_set_bits reads it as torch does, else null.
PyTypeObject* verify_key_set_reader();
using ModeFlagGetter = bool (*)();
ModeFlagGetter find_mode_flag_getter();

// -- devices.cpp ---------------------------------------------------------------------------------
int read_device(PyObject* obj, int32_t* type, int32_t* index) noexcept;
int parse_device(const char* text, int32_t* type, int32_t* index) noexcept;
int dtype_code(PyObject* obj) noexcept;
int device_equal(PyObject* a, PyObject* b) noexcept;

// -- compiled_module.cpp -------------------------------------------------------------------------
// Adds ModuleCall (a compiled module's class __call__: the per-call gate of
// tripwire.torch.compile's OptimizedModule) and ModuleCallState to the module; -1 with an error set.
int add_compiled_module_types(PyObject* m);

}  // namespace tripwire::torch_adapter
