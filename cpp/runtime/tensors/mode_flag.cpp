// tripwire/cpp/runtime/tensors/mode_flag.cpp -- torch's per-thread mode flag, read through its getter.
#include "runtime/tensors/mode_flag.hpp"

#include <atomic>

#include "runtime/tensors/readers.hpp"

namespace tripwire::runtime {
namespace {

using ModeFlagGetter = bool (*)();
// Set once by find_torch_mode_flag (GIL held), read by every check.
std::atomic<ModeFlagGetter> g_getter{nullptr};
std::atomic<std::uint64_t> g_python_key_bits{0};
std::atomic<bool> g_hidden{false};

}  // namespace

bool find_torch_mode_flag(PyObject* setter, std::uint64_t python_key_bits) {
    g_python_key_bits.store(python_key_bits, std::memory_order_relaxed);
    if (g_getter.load(std::memory_order_acquire) != nullptr) return true;
    const TwTorchAdapter* adapter = torch_adapter();
    if (adapter == nullptr || setter == nullptr || setter == Py_None) return false;
    const ModeFlagGetter get = adapter->mode_flag_getter;
    if (get == nullptr) return false;
    // The getter must read the flag torch's setter sets: both ways, then the value put back.
    const bool was = get();
    bool ok = true;
    for (const bool v : {!was, was}) {
        PyObject* r = PyObject_CallOneArg(setter, v ? Py_True : Py_False);
        if (r == nullptr) PyErr_Clear();
        ok = ok && r != nullptr && get() == v;
        Py_XDECREF(r);
    }
    if (ok) g_getter.store(get, std::memory_order_release);
    return ok;
}

PythonKeyMask python_key_mask() {
    const ModeFlagGetter get = g_getter.load(std::memory_order_acquire);
    if (get == nullptr || g_hidden.load(std::memory_order_relaxed)) return PythonKeyMask::Unknown;
    return get() ? PythonKeyMask::Kept : PythonKeyMask::Masked;
}

std::uint64_t python_key_bits() { return g_python_key_bits.load(std::memory_order_relaxed); }

bool hide_torch_mode_flag(bool on) { return g_hidden.exchange(on, std::memory_order_relaxed); }

}  // namespace tripwire::runtime
