// tripwire/cpp/runtime/eval/constant_types.hpp -- value-like types that EQUALS_MATCH accepts as
// constants besides the built-in ones (torch.dtype, torch.device, torch.Size, numpy dtypes, ...).
//
// The set is extensible (an adapter or the package registers a type with one of a fixed set of
// comparisons), but every comparison keeps EQUALS_MATCH's contract: it runs no user code and
// allocates no Python object, so the evaluator may compare on borrowed references
// (docs/cpp.md, "Regions without user code"). That is why a registration names how to compare
// (identity, element-wise as a tuple, a C function of the registrant's, or a static C type's own
// tp_richcompare) rather than handing over a Python __eq__.
#pragma once

#include <string>
#include <vector>

#include "runtime/py.hpp"

namespace tripwire::runtime {

/// How values of a registered constant type are compared (after the exact type check).
enum class ConstantCompare : std::uint8_t {
    Identity,     ///< `v is c` (singletons: torch.dtype, torch.layout)
    Tuple,        ///< a tuple subtype compared element-wise as constants (torch.Size)
    Native,       ///< a C function of the registrant's (torch.device through the adapter, numpy dtypes)
    RichCompare,  ///< the type's own C tp_richcompare (a static, non-heap C type whose == the registrant
                  ///< vouches for)
};

/// 1 when equal, 0 when not; runs no user code, allocates nothing, never fails.
using NativeEqual = int (*)(PyObject* value, PyObject* constant);
/// Whether a value of the type may be a constant (numpy: simple dtypes only). Null: all may.
using NativeAccept = bool (*)(PyObject* value);

struct ConstantType {
    PyTypeObject* type = nullptr;  ///< held for the process
    ConstantCompare compare = ConstantCompare::Identity;
    NativeEqual equal = nullptr;
    NativeAccept accept = nullptr;
    bool subclasses = false;  ///< instances of subtypes count too (numpy's per-dtype classes)
};

/// Register `t`. Re-registering a type replaces its entry. False with a Python error set when
/// the registration is refused (a built-in constant type, a Tuple type that is not a tuple
/// subtype, a RichCompare type defined in Python, a Native one without a function).
bool register_constant_type(PyTypeObject* t, ConstantCompare how, NativeEqual equal, bool subclasses,
                            NativeAccept accept = nullptr);
/// The entry for a value's exact type, or null. Runs no user code (an MRO walk at most).
const ConstantType* constant_type_of(PyTypeObject* t);
/// Every registration, in order (for the package's listing and the test oracle).
const std::vector<ConstantType>& constant_types();
/// The name of a comparison ("identity", "tuple", "native", "richcompare").
const char* constant_compare_name(ConstantCompare c);

}  // namespace tripwire::runtime
