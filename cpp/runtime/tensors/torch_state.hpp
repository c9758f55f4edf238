// tripwire/cpp/runtime/tensors/torch_state.hpp -- GLOBAL_STATE's torch probes: torch's global
// state, the torch-function mode stack, the default device.
//
// Through the torch adapter each is a handful of C++ calls (no Python call, no allocation); without
// it, a Python reader the package registers returns the same fields (readers.hpp). The comparison
// is one function for both, with torch's own rules (an autocast dtype counts only while autocast
// is enabled on that device).
#pragma once

#include <string>
#include <vector>

#include "core/ir.hpp"
#include "runtime/eval/guard_kinds.hpp"
#include "runtime/tensors/readers.hpp"

namespace tripwire::runtime {

/// 1 when the probe reads what the guard's snapshot holds, 0 when not, -1 with an error set (a
/// Python reader raised).
int torch_probe_matches(const RuntimeGuard& g);
/// The fast pass's form: true only when it holds, decided through the adapter.
bool torch_probe_pure(const RuntimeGuard& g);
/// The fast pass's form of torch's global state bound through the adapter: `compiled` is the
/// guard's g.derived (a bytes object holding the TwGlobalState bind_torch_probe compiled; set only
/// when the adapter was installed, which then stays). True only when it holds.
inline bool torch_global_state_holds(PyObject* compiled) {
    return torch_adapter()->global_state_matches(
               reinterpret_cast<const TwGlobalState*>(PyBytes_AS_STRING(compiled))) == 1;
}
/// The fast pass's form of the default-device probe with the snapshot None: true only when
/// torch.utils._device.CURRENT_DEVICE reads None without user code.
bool torch_default_device_none();
/// The probe's current value as the engine reads it, for snapshots and diagnostics: a tuple of
/// ints in core::torch_state's layout, a tuple of the modes' types, None or the device as a str.
/// `native`: through the adapter (None when it is not installed), else the Python reader.
Ref torch_probe_value(core::BuiltinProbe p, bool native);
/// The names of the fields that differ between two torch global-state tuples in the layout of
/// core::torch_state (torch's names; autocast fields as "autocast(<device type>)_enabled").
std::vector<std::string> torch_state_differences(const std::vector<std::int64_t>& want,
                                                 const std::vector<std::int64_t>& now);
/// Bind a torch probe guard: compile a global-state snapshot for the adapter's comparison (a
/// TwGlobalState in a bytes object, returned in `keep` and set as g.derived), parse a
/// default-device snapshot into (n2, n3) = (type, index). False with an error set when the
/// snapshot is malformed.
bool bind_torch_probe(RuntimeGuard& g, bool native, Ref& keep);

}  // namespace tripwire::runtime
