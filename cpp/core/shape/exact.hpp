// tripwire/cpp/core/shape/exact.hpp -- one typed operation evaluated exactly, errors as values.
//
// The slow path and constant folding evaluate every DAG node with `apply`: integers are BigInts
// (held to kMaxIntBits), floats doubles with Python's semantics, and anything Python would raise
// is an error value carrying the message Python would give. `and`, `or`, `not` and `x if c else y`
// look at their first operand before the others, so an error in a branch Python would not
// evaluate never escapes.
#pragma once

#include <string>

#include "core/shape/bigint.hpp"
#include "core/shape/program.hpp"

namespace tripwire::core::shape {

struct ExactValue {
    ValueType type = ValueType::Int;
    bool is_error = false;
    std::string error;  ///< "ZeroDivisionError: ..." when is_error
    BigInt i;
    double f = 0.0;
    bool b = false;

    static ExactValue of_int(BigInt v);
    static ExactValue of_float(double v);
    static ExactValue of_bool(bool v);
    static ExactValue fail(std::string why);
};

/// The value of one operation on operand values (unused operands may be null).
ExactValue apply(Code code, const ExactValue* a, const ExactValue* b, const ExactValue* c);

}  // namespace tripwire::core::shape
