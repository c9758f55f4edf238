// tripwire/cpp/core/shape/exact.cpp -- exact evaluation of one operation (see exact.hpp).
#include "core/shape/exact.hpp"

#include <cmath>
#include <utility>

#include "core/shape/arith.hpp"

namespace tripwire::core::shape {
namespace {

const char* const kTooLarge = "OverflowError: integer over 65536 bits (tripwire's limit for shape guards)";

ExactValue checked_int(BigInt v) {
    if (v.bit_length() > kMaxIntBits) return ExactValue::fail(kTooLarge);
    return ExactValue::of_int(std::move(v));
}

// float(int), as Python converts an int operand of a float operation.
bool to_float(const ExactValue& v, double& out, ExactValue& err) {
    if (v.type == ValueType::Float) {
        out = v.f;
        return true;
    }
    if (!v.i.to_double(out)) {
        err = ExactValue::fail("OverflowError: int too large to convert to float");
        return false;
    }
    return true;
}

// math.trunc/floor/ceil/round of a float: an int, or the error Python raises.
ExactValue float_to_int(Code code, double x) {
    if (std::isnan(x)) return ExactValue::fail("ValueError: cannot convert float NaN to integer");
    if (std::isinf(x)) return ExactValue::fail("OverflowError: cannot convert float infinity to integer");
    double r = x;
    switch (code) {
        case Code::FTrunc: r = std::trunc(x); break;
        case Code::FFloor: r = std::floor(x); break;
        case Code::FCeil: r = std::ceil(x); break;
        default: r = arith::round_half_even(x); break;
    }
    BigInt out;
    BigInt::from_integral_double(r, out);
    return ExactValue::of_int(std::move(out));
}

int compare_values(const ExactValue& a, const ExactValue& b) {
    // 2: unordered (a NaN is involved)
    if (a.type == ValueType::Int && b.type == ValueType::Int) return compare(a.i, b.i);
    if (a.type == ValueType::Int) return std::isnan(b.f) ? 2 : a.i.compare_double(b.f);
    if (b.type == ValueType::Int) {
        if (std::isnan(a.f)) return 2;
        return -b.i.compare_double(a.f);
    }
    if (std::isnan(a.f) || std::isnan(b.f)) return 2;
    return a.f < b.f ? -1 : (a.f > b.f ? 1 : 0);
}

bool compare_holds(Code code, int c) {
    if (c == 2) return code == Code::INe || code == Code::FNe || code == Code::MNe;
    switch (code) {
        case Code::IEq:
        case Code::FEq:
        case Code::MEq: return c == 0;
        case Code::INe:
        case Code::FNe:
        case Code::MNe: return c != 0;
        case Code::ILt:
        case Code::FLt:
        case Code::MLt: return c < 0;
        case Code::ILe:
        case Code::FLe:
        case Code::MLe: return c <= 0;
        case Code::IGt:
        case Code::FGt:
        case Code::MGt: return c > 0;
        default: return c >= 0;  // *Ge
    }
}

ExactValue int_pow(const BigInt& base, const BigInt& exp) {
    if (exp.negative()) {
        return ExactValue::fail("ValueError: ** takes a natural exponent in shape guards (got " +
                                exp.to_string() + ")");
    }
    if (exp.is_zero()) return ExactValue::of_int(BigInt(1));
    const std::uint64_t bl = base.bit_length();
    // 0, 1 and -1 to any power stay small.
    if (bl <= 1) {
        if (base.is_zero() || !base.negative() || !exp.is_odd())
            return ExactValue::of_int(base.is_zero() ? BigInt(0) : BigInt(1));
        return ExactValue::of_int(BigInt(-1));
    }
    std::int64_t e = 0;
    // |base|**e has at least (bl - 1) * e + 1 bits.
    if (!exp.to_int64(e) || static_cast<std::uint64_t>(e) > kMaxIntBits) return ExactValue::fail(kTooLarge);
    if ((bl - 1) * static_cast<std::uint64_t>(e) + 1 > kMaxIntBits) return ExactValue::fail(kTooLarge);
    BigInt result(1), b = base;
    for (;;) {
        if (e & 1) result = result * b;
        e >>= 1;
        if (e == 0) break;
        b = b * b;
    }
    return checked_int(std::move(result));
}

}  // namespace

ExactValue ExactValue::of_int(BigInt v) {
    ExactValue out;
    out.type = ValueType::Int;
    out.i = std::move(v);
    return out;
}
ExactValue ExactValue::of_float(double v) {
    ExactValue out;
    out.type = ValueType::Float;
    out.f = v;
    return out;
}
ExactValue ExactValue::of_bool(bool v) {
    ExactValue out;
    out.type = ValueType::Bool;
    out.b = v;
    return out;
}
ExactValue ExactValue::fail(std::string why) {
    ExactValue out;
    out.is_error = true;
    out.error = std::move(why);
    return out;
}

ExactValue apply(Code code, const ExactValue* a, const ExactValue* b, const ExactValue* c) {
    // Short-circuit operations first: their later operands matter only when chosen.
    switch (code) {
        case Code::And:
            if (a->is_error || !a->b) return *a;
            return *b;
        case Code::Or:
            if (a->is_error || a->b) return *a;
            return *b;
        case Code::Not:
            if (a->is_error) return *a;
            return ExactValue::of_bool(!a->b);
        case Code::Select:
            if (c->is_error) return *c;
            return c->b ? *a : *b;
        default: break;
    }
    // Everything else evaluates its operands left to right: the first error wins.
    if (a != nullptr && a->is_error) return *a;
    if (b != nullptr && b->is_error) return *b;
    switch (code) {
        case Code::IAdd: return checked_int(a->i + b->i);
        case Code::ISub: return checked_int(a->i - b->i);
        case Code::IMul:
            if (a->i.bit_length() + b->i.bit_length() > kMaxIntBits + 1) return ExactValue::fail(kTooLarge);
            return checked_int(a->i * b->i);
        case Code::IFloorDiv:
        case Code::IMod: {
            if (b->i.is_zero())
                return ExactValue::fail("ZeroDivisionError: integer division or modulo by zero");
            BigInt q, r;
            BigInt::floor_divmod(a->i, b->i, &q, &r);
            return ExactValue::of_int(code == Code::IFloorDiv ? std::move(q) : std::move(r));
        }
        case Code::INeg: return ExactValue::of_int(-a->i);
        case Code::IAbs: return ExactValue::of_int(a->i.abs());
        case Code::IPow: return int_pow(a->i, b->i);
        // Python's min/max keep the first of equal values; for ints that cannot be told apart.
        case Code::IMin: return compare(b->i, a->i) < 0 ? *b : *a;
        case Code::IMax: return compare(b->i, a->i) > 0 ? *b : *a;
        case Code::FAdd: return ExactValue::of_float(a->f + b->f);
        case Code::FSub: return ExactValue::of_float(a->f - b->f);
        case Code::FMul: return ExactValue::of_float(a->f * b->f);
        case Code::FDiv:
            if (b->f == 0.0) return ExactValue::fail("ZeroDivisionError: float division by zero");
            return ExactValue::of_float(a->f / b->f);
        case Code::FFloorDiv: {
            if (b->f == 0.0) return ExactValue::fail("ZeroDivisionError: float floor division by zero");
            double q = 0, m = 0;
            arith::float_div_mod(a->f, b->f, q, m);
            return ExactValue::of_float(q);
        }
        case Code::FMod:
            if (b->f == 0.0) return ExactValue::fail("ZeroDivisionError: float modulo by zero");
            return ExactValue::of_float(arith::float_mod(a->f, b->f));
        case Code::FNeg: return ExactValue::of_float(-a->f);
        case Code::FAbs: return ExactValue::of_float(std::fabs(a->f));
        // max(a, b) is b only if b > a (a NaN first stays); min(a, b) is b only if b < a.
        case Code::FMin: return ExactValue::of_float(b->f < a->f ? b->f : a->f);
        case Code::FMax: return ExactValue::of_float(b->f > a->f ? b->f : a->f);
        case Code::IDiv: {
            if (b->i.is_zero()) return ExactValue::fail("ZeroDivisionError: division by zero");
            double q = 0;
            if (!BigInt::true_divide(a->i, b->i, q))
                return ExactValue::fail("OverflowError: integer division result too large for a float");
            return ExactValue::of_float(q);
        }
        case Code::IToF: {
            ExactValue err;
            double f = 0;
            if (!to_float(*a, f, err)) return err;
            return ExactValue::of_float(f);
        }
        case Code::FTrunc:
        case Code::FFloor:
        case Code::FCeil:
        case Code::FRound: return float_to_int(code, a->f);
        case Code::FIsNan: return ExactValue::of_bool(std::isnan(a->f));
        case Code::IEq:
        case Code::INe:
        case Code::ILt:
        case Code::ILe:
        case Code::IGt:
        case Code::IGe:
        case Code::FEq:
        case Code::FNe:
        case Code::FLt:
        case Code::FLe:
        case Code::FGt:
        case Code::FGe:
        case Code::MEq:
        case Code::MNe:
        case Code::MLt:
        case Code::MLe:
        case Code::MGt:
        case Code::MGe: return ExactValue::of_bool(compare_holds(code, compare_values(*a, *b)));
        case Code::BEq: return ExactValue::of_bool(a->b == b->b);
        case Code::BNe: return ExactValue::of_bool(a->b != b->b);
        default: break;
    }
    return ExactValue::fail("internal error: unknown shape operation");
}

}  // namespace tripwire::core::shape
