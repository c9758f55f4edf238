// tripwire/cpp/runtime/tensors/mode_flag.hpp -- torch's per-thread "dispatch mode" flag, torch-free.
//
// torch's guards remove the Python dispatch keys from a tensor's applied key set unless a
// dispatch mode without ignore_compile_internals is active (torch/csrc/dynamo/guards.h
// LocalState::apply). torch reads that from a C++ thread_local
// (torch::dynamo::tls_is_in_mode_without_ignore_compile_internals) which TorchDispatchMode's
// __enter__/__exit__ set from a module global shared by all threads. The two differ across
// threads, and anyone may call torch's setter directly: only the thread-local is torch's decision.
//
// torch exports no getter: get_is_in_mode_without_ignore_compile_internals() is a hidden
// function of libtorch_python.so, present in its ELF symbol table (.symtab), not its dynamic one.
// The torch adapter finds it there when it loads (cpp/adapters/torch/hidden_symbol.hpp) and hands
// it over in its table; this unit verifies it against torch's own setter and then serves both the
// adapter path and the Python readers (a `bool (*)()` call: no torch header). Where it is not
// found (no adapter, a stripped library, another platform, another torch), the mask is Unknown
// and every caller decides without it, soundly: a key set that carries a Python key fails closed.
#pragma once

#include <cstdint>

#include "runtime/py.hpp"

namespace tripwire::runtime {

/// What torch's guards do with the Python keys now, on this thread.
enum class PythonKeyMask : std::uint8_t {
    Masked,   ///< no dispatch mode without ignore_compile_internals: the keys are removed
    Kept,     ///< such a mode is active (torch's flag is set): the keys stay
    Unknown,  ///< torch's flag could not be found: decide only what both answers decide
};

/// Take torch's getter from the installed torch adapter's table (mode_flag_getter) and verify it:
/// `setter` (torch._C._dynamo.guards.set_is_in_mode_without_ignore_compile_internals) is called
/// with the flag's opposite and then its value, and the getter must follow both. `python_key_bits`
/// are the raw DispatchKeySet bits of Python, PythonTLSSnapshot and PythonDispatcher, registered
/// even when the getter is not found (no adapter, or a None setter, only registers them). Returns
/// whether the getter is verified (once it is, later calls only register the bits); never raises
/// (a Python error on the way is cleared). GIL held; Python may run.
bool find_torch_mode_flag(PyObject* setter, std::uint64_t python_key_bits);

/// The mask now, on this thread (Unknown before find_torch_mode_flag succeeded, or while
/// hidden). Runs no user code, allocates nothing.
PythonKeyMask python_key_mask();

/// The Python keys' raw bits (0 before find_torch_mode_flag was called).
std::uint64_t python_key_bits();

/// Test switch: while on, python_key_mask() answers Unknown as if the getter had not been found
/// (the "stripped library" case in one process). Returns the previous setting.
bool hide_torch_mode_flag(bool on);

}  // namespace tripwire::runtime
