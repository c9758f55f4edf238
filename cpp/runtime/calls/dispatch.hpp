// tripwire/cpp/runtime/calls/dispatch.hpp -- one call of a @specialize'd function, hit path in C++.
//
// dispatch() binds the call's vectorcall arguments to the function's parameters (BoundCall, no
// dict built) and looks the function's Cache up with the bound arguments as the locals. The
// caller (the FastDispatch type in the bindings) then vectorcalls the payload with the original
// arguments on a hit, or hands the call to Python on a miss or when the call cannot be bound.
#pragma once

#include "runtime/cache/cache.hpp"
#include "runtime/calls/call_binding.hpp"

namespace tripwire::runtime {

enum class DispatchOutcome : std::uint8_t {
    Hit,       ///< `payload` holds the entry's payload (a new reference)
    Miss,      ///< no entry matched (counted); `bound` holds the bound arguments
    NotBound,  ///< the call cannot be bound in C++ (an invalid call, or fn's code changed)
    Error,     ///< a Python error is set (a probe or a strict guard raised, out of memory)
};

/// Bind and look up. An entry whose payload is None never counts as a hit here (there is
/// nothing to call): it is reported as a Miss.
DispatchOutcome dispatch(Cache& cache, const CallSignature& sig, PyObject* fn, PyObject* const* args,
                         Py_ssize_t nargs, PyObject* kwnames, BoundCall& bound, Ref& payload);

}  // namespace tripwire::runtime
