// tripwire/cpp/adapters/torch/module.cpp -- the torch adapter's module (tripwire._torch_adapter).
//
// Compiled against the installed torch's public C++ API and loaded at run time by the package
// (tripwire/tensors.py) after `import torch`; the core module never includes or links torch. It
// exports one PyCapsule holding the TwTorchAdapter table (cpp/runtime/tensors/adapter_abi.h): plain
// C functions that read a tensor's fields, torch's global state, the torch-function mode stack
// and torch.device objects without any Python call. The functions live by role in this directory
// (adapter.hpp lists them); the module's initialiser runs their load-time checks and fills the table,
// and adds the compiled module's gate types (compiled_module.cpp).
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Size.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>

#include "adapters/torch/adapter.hpp"
#include "runtime/tensors/adapter_abi.h"

#ifndef TRIPWIRE_TORCH_VERSION
#error "TRIPWIRE_TORCH_VERSION must name the torch version this adapter is compiled against"
#endif

namespace {

namespace ta = tripwire::torch_adapter;

TwTorchAdapter g_table{};

PyModuleDef g_module = {PyModuleDef_HEAD_INIT,
                        "tripwire._torch_adapter",
                        "tripwire's torch adapter: reads tensors and torch's state in C++ (private).",
                        -1,
                        nullptr,
                        nullptr,
                        nullptr,
                        nullptr,
                        nullptr};

}  // namespace

// CPython's name for the initialiser of tripwire._torch_adapter (the double underscore is its).
// NOLINTNEXTLINE(bugprone-reserved-identifier)
PyMODINIT_FUNC PyInit__torch_adapter() {
    if (THPVariableClass == nullptr) {
        PyErr_SetString(PyExc_ImportError, "import torch before tripwire._torch_adapter");
        return nullptr;
    }
    g_table.abi_version = TRIPWIRE_TORCH_ADAPTER_ABI;
    g_table.struct_size = sizeof(TwTorchAdapter);
    g_table.torch_version = TRIPWIRE_TORCH_VERSION;
    // torch._C.TensorBase: THPVariableClass is torch.Tensor, whose base it is.
    g_table.tensor_base_type = reinterpret_cast<PyTypeObject*>(THPVariableClass)->tp_base;
    g_table.dtype_type = &THPDtypeType;
    g_table.device_type = &THPDeviceType;
    g_table.size_type = &THPSizeType;
    g_table.read_tensor = ta::read_tensor;
    g_table.tensor_fields = ta::tensor_fields;
    g_table.python_keys_mask = ta::kPythonKeys.raw_repr();
    g_table.apply_local_keys = ta::apply_local_keys;
    ta::load_tensor_policies();
    ta::load_global_state();
    g_table.global_state_matches = ta::global_state_matches;
    g_table.read_global_state = ta::read_global_state;
    g_table.function_mode_stack_len = ta::function_mode_stack_len;
    g_table.function_mode_at = ta::function_mode_at;
    g_table.read_device = ta::read_device;
    g_table.parse_device = ta::parse_device;
    g_table.dtype_code = ta::dtype_code;
    g_table.device_equal = ta::device_equal;
    g_table.saved_tensors_hooks_top = ta::saved_tensors_hooks_top;
    g_table.cpp_tensor_property = ta::cpp_tensor_property;
    g_table.cpp_tensor_grad = ta::cpp_tensor_grad;
    g_table.tensors_may_overlap = ta::tensors_may_overlap;
    g_table.tensor_matches = ta::tensor_matches;
    g_table.dispatch_key_set_type = ta::verify_key_set_reader();
    g_table.dispatch_key_set_bits = ta::dispatch_key_set_bits;
    g_table.mode_flag_getter = ta::find_mode_flag_getter();
    g_table.local_keys_save = ta::local_keys_save;
    g_table.local_keys_restore = ta::local_keys_restore;

    PyObject* m = PyModule_Create(&g_module);
    if (m == nullptr) return nullptr;
    PyObject* capsule = PyCapsule_New(&g_table, TRIPWIRE_TORCH_ADAPTER_CAPSULE, nullptr);
    if (capsule == nullptr || PyModule_AddObject(m, "table", capsule) < 0) {
        Py_XDECREF(capsule);
        Py_DECREF(m);
        return nullptr;
    }
    // The compiled module's per-call gate (tripwire.torch.compile's OptimizedModule.__call__).
    if (ta::add_compiled_module_types(m) < 0) {
        Py_DECREF(m);
        return nullptr;
    }
    // Where the autocast cache flag was found in libtorch_cpu's TLS block (-1: read by the
    // accessor), for the tests and for diagnostics.
    if (PyModule_AddIntConstant(m, "autocast_cache_flag_offset",
                                static_cast<long>(ta::autocast_cache_flag_offset())) < 0 ||
        PyModule_AddStringConstant(m, "torch_version", TRIPWIRE_TORCH_VERSION) < 0 ||
        // Whether read_by_code's "every policy Default" is one masked load (probe_policy_window).
        PyModule_AddIntConstant(m, "policy_window", ta::policy_window_found() ? 1 : 0) < 0 ||
        // Whether requires_grad is read through the autograd meta's pointer (probe_autograd_route).
        PyModule_AddIntConstant(m, "autograd_route", ta::autograd_route_found() ? 1 : 0) < 0) {
        Py_DECREF(m);
        return nullptr;
    }
    return m;
}
