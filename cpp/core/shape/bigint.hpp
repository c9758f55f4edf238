// tripwire/cpp/core/shape/bigint.hpp -- exact integers for the shape evaluator's slow path.
//
// Shape relations are evaluated on 64-bit integers with checked overflow; when a value does not
// fit (an int input of 2**70, a product that overflows) the relation is evaluated again, exactly,
// on these. Python's int semantics: floor division and modulo with the divisor's sign,
// correctly rounded conversion to float and true division, exact comparison with floats.
// Sign and magnitude, 32-bit limbs; built for correctness and fuzzing, not for speed.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tripwire::core::shape {

class BigInt {
  public:
    BigInt() = default;
    explicit BigInt(std::int64_t v);

    /// Decimal digits (no sign, no underscores); false when `digits` is empty or has a non-digit.
    static bool from_decimal(std::string_view digits, BigInt& out);
    /// The integer value of a finite double with no fractional part (false otherwise).
    static bool from_integral_double(double d, BigInt& out);
    /// A two's-complement integer of `n` bytes, least significant first (what CPython's
    /// _PyLong_AsByteArray / PyLong_AsNativeBytes write with little_endian and signed).
    static BigInt from_signed_le_bytes(const unsigned char* bytes, std::size_t n);

    bool is_zero() const { return mag_.empty(); }
    bool negative() const { return neg_; }
    int sign() const { return mag_.empty() ? 0 : (neg_ ? -1 : 1); }
    /// Bits of the magnitude (0 for zero), as Python's int.bit_length().
    std::uint64_t bit_length() const;
    bool is_odd() const { return !mag_.empty() && (mag_[0] & 1U) != 0; }
    /// The value when it fits an int64.
    bool to_int64(std::int64_t& out) const;
    /// Decimal, with a leading '-' for negatives (Python's str(int)).
    std::string to_string() const;

    /// float(self), correctly rounded (half to even); false when the result would overflow
    /// (Python raises OverflowError: int too large to convert to float).
    bool to_double(double& out) const;
    /// self / d as Python's int / int: correctly rounded; `d` must not be zero. False when the
    /// quotient overflows a double.
    static bool true_divide(const BigInt& n, const BigInt& d, double& out);
    /// Exact comparison with a double that is not NaN: -1, 0 or 1 (Python's int/float compare).
    int compare_double(double d) const;

    friend int compare(const BigInt& a, const BigInt& b);
    friend bool operator==(const BigInt& a, const BigInt& b) { return compare(a, b) == 0; }
    friend bool operator!=(const BigInt& a, const BigInt& b) { return compare(a, b) != 0; }
    friend BigInt operator+(const BigInt& a, const BigInt& b);
    friend BigInt operator-(const BigInt& a, const BigInt& b);
    friend BigInt operator*(const BigInt& a, const BigInt& b);
    BigInt operator-() const;
    BigInt abs() const;

    /// Floor division and modulo (Python's divmod): q = floor(a / b), r = a - q*b, r has b's sign.
    /// `b` must not be zero. Either output may be null.
    static void floor_divmod(const BigInt& a, const BigInt& b, BigInt* q, BigInt* r);
    /// a * 2**shift (shift >= 0) and floor(a / 2**shift) for a >= 0.
    BigInt shifted_left(std::uint64_t shift) const;
    BigInt shifted_right_magnitude(std::uint64_t shift) const;

  private:
    void trim();
    static int compare_magnitude(const std::vector<std::uint32_t>& a, const std::vector<std::uint32_t>& b);
    static std::vector<std::uint32_t> add_magnitude(const std::vector<std::uint32_t>& a,
                                                    const std::vector<std::uint32_t>& b);
    /// a - b with |a| >= |b|.
    static std::vector<std::uint32_t> sub_magnitude(const std::vector<std::uint32_t>& a,
                                                    const std::vector<std::uint32_t>& b);
    /// Truncating division of magnitudes (Knuth, Algorithm D); `b` non-empty.
    static void divmod_magnitude(const std::vector<std::uint32_t>& a, const std::vector<std::uint32_t>& b,
                                 std::vector<std::uint32_t>& q, std::vector<std::uint32_t>& r);

    bool neg_ = false;
    std::vector<std::uint32_t> mag_;  // little-endian limbs, no leading zero limb; empty for zero
};

}  // namespace tripwire::core::shape
