// tripwire/cpp/core/shape/arith.hpp -- Python's arithmetic on int64 and double, exactly.
//
// Each function returns false when Python would raise or when the int64 result would overflow
// (the caller then falls back to exact evaluation); otherwise it stores what Python computes.
// Shared by the fast path and by the exact path's small cases.
#pragma once

#include <cmath>
#include <cstdint>

namespace tripwire::core::shape::arith {

/// floor(a / b) as Python's a // b.
inline bool floor_div(std::int64_t a, std::int64_t b, std::int64_t& out) {
    if (b == 0 || (a == INT64_MIN && b == -1)) return false;
    std::int64_t q = a / b;
    const std::int64_t r = a % b;
    if (r != 0 && ((r < 0) != (b < 0))) --q;
    out = q;
    return true;
}

/// a % b as Python's (the result has the divisor's sign).
inline bool mod(std::int64_t a, std::int64_t b, std::int64_t& out) {
    if (b == 0) return false;
    if (b == -1) {  // INT64_MIN % -1 is undefined in C++; every x % -1 is 0
        out = 0;
        return true;
    }
    std::int64_t r = a % b;
    if (r != 0 && ((r < 0) != (b < 0))) r += b;
    out = r;
    return true;
}

/// a ** b for b >= 0, without overflow.
inline bool pow(std::int64_t a, std::int64_t b, std::int64_t& out) {
    if (b < 0) return false;
    std::int64_t result = 1, base = a;
    for (;;) {
        if (b & 1) {
            if (__builtin_mul_overflow(result, base, &result)) return false;
        }
        b >>= 1;
        if (b == 0) break;
        if (__builtin_mul_overflow(base, base, &base)) return false;
    }
    out = result;
    return true;
}

/// CPython's float divmod (Objects/floatobject.c, _float_div_mod) for wx != 0.
inline void float_div_mod(double vx, double wx, double& floordiv, double& modulo) {
    double m = std::fmod(vx, wx);
    // fmod is exact, so vx - m is mathematically a multiple of wx (the division may be inexact).
    double div = (vx - m) / wx;
    if (m != 0.0) {
        // The remainder takes the divisor's sign.
        if ((wx < 0) != (m < 0)) {
            m += wx;
            div -= 1.0;
        }
    } else {
        m = std::copysign(0.0, wx);
    }
    if (div != 0.0) {
        floordiv = std::floor(div);
        if (div - floordiv > 0.5) floordiv += 1.0;
    } else {
        floordiv = std::copysign(0.0, vx / wx);
    }
    modulo = m;
}

/// CPython's float % (float_rem) for wx != 0.
inline double float_mod(double vx, double wx) {
    double m = std::fmod(vx, wx);
    if (m != 0.0) {
        if ((wx < 0) != (m < 0)) m += wx;
    } else {
        m = std::copysign(0.0, wx);
    }
    return m;
}

/// round(x) as Python's round() of a float, half to even; x finite.
inline double round_half_even(double x) {
    double r = std::round(x);  // half away from zero
    if (std::fabs(x - r) == 0.5) r = 2.0 * std::round(x / 2.0);
    return r;
}

/// An integral double in [-2**63, 2**63) as an int64.
inline bool double_to_int64(double d, std::int64_t& out) {
    if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0)) return false;
    out = static_cast<std::int64_t>(d);
    return true;
}

/// Python's comparison of an int and a float, exact: -1, 0, 1, or 2 when `f` is NaN.
inline int compare_int_double(std::int64_t i, double f) {
    if (std::isnan(f)) return 2;
    if (f >= 9223372036854775808.0) return -1;
    if (f < -9223372036854775808.0) return 1;
    const double t = std::trunc(f);  // in [-2**63, 2**63): exact as an int64
    const auto ti = static_cast<std::int64_t>(t);
    if (i != ti) return i < ti ? -1 : 1;
    if (f > t) return -1;
    if (f < t) return 1;
    return 0;
}

}  // namespace tripwire::core::shape::arith
