// tripwire/cpp/core/shape/small_eval.cpp -- a relation's truth on small ints (see the header).
#include "core/shape/small_eval.hpp"

#include <algorithm>
#include <array>

#include "core/shape/arith.hpp"

namespace tripwire::core::shape {
namespace {

// Parse nodes one evaluation keeps on the stack (a larger tree is left to the compiled program).
constexpr std::size_t kMaxNodes = 128;

// A node's value: an int, or a bool (0 or 1). The compiler types every node of an accepted tree
// the same way (an int operation of ints is an int, a comparison or logical operation a bool).
// No member initialisers: holds_on_small_ints' array of them is left uninitialised (zeroing 128
// of them was a quarter of an evaluation); eval_node writes both fields of every node it decides.
struct Small {
    std::int64_t v;
    bool is_bool;
};

// The value of node `n` from its operands' values; false when it is left undecided (an operand of
// a type the compiler would reject or lower otherwise, an operation Python would raise on, an
// int64 overflow, an operation this does not evaluate).
bool eval_node(const AstNode& n, const Small* vals, const std::int64_t* values, std::size_t n_values,
               Small& out) {
    const auto arg = [&](std::size_t k) { return vals[n.args[k]]; };
    const auto ints = [&](std::size_t count) {
        for (std::size_t k = 0; k < count; ++k)
            if (arg(k).is_bool) return false;
        return true;
    };
    const auto bools = [&](std::size_t count) {
        for (std::size_t k = 0; k < count; ++k)
            if (!arg(k).is_bool) return false;
        return true;
    };
    const auto as_bool = [&out](bool b) {
        out.v = b ? 1 : 0;
        out.is_bool = true;
        return true;
    };
    // An int unless the case below makes it a bool (as_bool, or Select copying an operand).
    out.is_bool = false;
    switch (n.op) {
        case Op::IntConst: out.v = n.int_small; return n.big_int == 0;
        case Op::BoolConst: return as_bool(n.bool_value);
        case Op::Symbol:
            if (n.symbol >= n_values) return false;
            out.v = values[n.symbol];
            return true;
        case Op::Neg:
            if (!ints(1) || arg(0).v == INT64_MIN) return false;
            out.v = -arg(0).v;
            return true;
        case Op::Abs:
            if (!ints(1) || arg(0).v == INT64_MIN) return false;
            out.v = arg(0).v < 0 ? -arg(0).v : arg(0).v;
            return true;
        case Op::Add: return ints(2) && !__builtin_add_overflow(arg(0).v, arg(1).v, &out.v);
        case Op::Sub: return ints(2) && !__builtin_sub_overflow(arg(0).v, arg(1).v, &out.v);
        case Op::Mul: return ints(2) && !__builtin_mul_overflow(arg(0).v, arg(1).v, &out.v);
        case Op::FloorDiv: return ints(2) && arith::floor_div(arg(0).v, arg(1).v, out.v);
        case Op::Mod: return ints(2) && arith::mod(arg(0).v, arg(1).v, out.v);
        case Op::Pow: return ints(2) && arith::pow(arg(0).v, arg(1).v, out.v);
        case Op::Min:
        case Op::Max:
            if (!ints(2)) return false;
            out.v = n.op == Op::Min ? std::min(arg(0).v, arg(1).v) : std::max(arg(0).v, arg(1).v);
            return true;
        case Op::Trunc:
        case Op::Floor:
        case Op::Ceil:
        case Op::Round:  // of an int: the int itself, as the compiler lowers it
            if (!ints(1)) return false;
            out.v = arg(0).v;
            return true;
        case Op::Eq:
        case Op::Ne:
        case Op::Lt:
        case Op::Le:
        case Op::Gt:
        case Op::Ge: {
            if (!ints(2)) return false;  // a bool compared: left to the compiler (== and != only)
            const std::int64_t a = arg(0).v, b = arg(1).v;
            switch (n.op) {
                case Op::Eq: return as_bool(a == b);
                case Op::Ne: return as_bool(a != b);
                case Op::Lt: return as_bool(a < b);
                case Op::Le: return as_bool(a <= b);
                case Op::Gt: return as_bool(a > b);
                default: return as_bool(a >= b);
            }
        }
        // Both operands are evaluated (no short circuit): every one evaluated without an error
        // here, so the operand a short circuit skips changes nothing.
        case Op::And: return bools(2) && as_bool(arg(0).v != 0 && arg(1).v != 0);
        case Op::Or: return bools(2) && as_bool(arg(0).v != 0 || arg(1).v != 0);
        case Op::Not: return bools(1) && as_bool(arg(0).v == 0);
        case Op::Select:
            if (!arg(0).is_bool || arg(1).is_bool != arg(2).is_bool) return false;
            out = arg(0).v != 0 ? arg(1) : arg(2);
            return true;
        case Op::FloatConst:
        case Op::TrueDiv:
        case Op::ToFloat:
        case Op::IsNan: return false;  // floats: the compiled program's
    }
    return false;
}

}  // namespace

SmallTruth holds_on_small_ints(const ParsedRelation& r, const std::int64_t* values, std::size_t n) {
    const std::size_t nn = r.nodes.size();
    if (r.symbols.size() != n || nn > kMaxNodes || r.root >= nn) return SmallTruth::Undecided;
    std::array<Small, kMaxNodes>
        vals;  // NOLINT(cppcoreguidelines-pro-type-member-init): each written before read
    // Operands precede their users in the parse: one pass in node order.
    for (std::size_t k = 0; k < nn; ++k)
        if (!eval_node(r.nodes[k], vals.data(), values, n, vals[k])) return SmallTruth::Undecided;
    const Small& root = vals[r.root];
    if (!root.is_bool) return SmallTruth::Undecided;  // the compiler's type error
    return root.v != 0 ? SmallTruth::Holds : SmallTruth::Fails;
}

}  // namespace tripwire::core::shape
