// tripwire/cpp/core/shape/bigint.cpp -- exact integers (see bigint.hpp).
#include "core/shape/bigint.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>

namespace tripwire::core::shape {

namespace {

using Limbs = std::vector<std::uint32_t>;

void trim_limbs(Limbs& v) {
    while (!v.empty() && v.back() == 0) v.pop_back();
}

// Bits of a non-empty magnitude.
std::uint64_t limb_bits(const Limbs& v) {
    if (v.empty()) return 0;
    const std::uint32_t top = v.back();
    return (v.size() - 1) * 32 + (32 - static_cast<std::uint64_t>(__builtin_clz(top)));
}

// The magnitude's bits [lo, lo + 64) as an integer (missing bits are zero).
std::uint64_t bits_at(const Limbs& v, std::uint64_t lo) {
    std::uint64_t out = 0;
    for (int k = 0; k < 64; ++k) {
        const std::uint64_t bit = lo + static_cast<std::uint64_t>(k);
        const std::uint64_t limb = bit / 32;
        if (limb >= v.size()) break;
        if ((v[limb] >> (bit % 32)) & 1U) out |= std::uint64_t{1} << k;
    }
    return out;
}

// Whether any of the magnitude's bits below `n` is set.
bool any_bits_below(const Limbs& v, std::uint64_t n) {
    const std::uint64_t full = std::min<std::uint64_t>(n / 32, v.size());
    for (std::uint64_t i = 0; i < full; ++i)
        if (v[i] != 0) return true;
    if (full < v.size() && n % 32 != 0) {
        const std::uint32_t mask = (std::uint32_t{1} << (n % 32)) - 1;
        if ((v[full] & mask) != 0) return true;
    }
    return false;
}

}  // namespace

BigInt::BigInt(std::int64_t v) {
    neg_ = v < 0;
    // Magnitude without overflow for INT64_MIN.
    std::uint64_t m = neg_ ? (~static_cast<std::uint64_t>(v) + 1) : static_cast<std::uint64_t>(v);
    while (m != 0) {
        mag_.push_back(static_cast<std::uint32_t>(m));
        m >>= 32;
    }
}

void BigInt::trim() {
    trim_limbs(mag_);
    if (mag_.empty()) neg_ = false;
}

bool BigInt::from_decimal(std::string_view digits, BigInt& out) {
    if (digits.empty()) return false;
    Limbs mag;
    // Nine digits per pass over the limbs (10**9 < 2**32): quadratic still, nine times fewer passes
    // (the parser bounds a literal's digits, parser.hpp kMaxIntLiteralDigits).
    for (std::size_t i = 0; i < digits.size();) {
        const std::size_t n = std::min<std::size_t>(9, digits.size() - i);
        std::uint64_t chunk = 0, scale = 1;
        for (std::size_t k = 0; k < n; ++k, ++i) {
            const char c = digits[i];
            if (c < '0' || c > '9') return false;
            chunk = chunk * 10 + static_cast<std::uint64_t>(c - '0');
            scale *= 10;
        }
        std::uint64_t carry = chunk;
        for (std::uint32_t& limb : mag) {
            const std::uint64_t t = static_cast<std::uint64_t>(limb) * scale + carry;
            limb = static_cast<std::uint32_t>(t);
            carry = t >> 32;
        }
        if (carry != 0) mag.push_back(static_cast<std::uint32_t>(carry));
    }
    out.neg_ = false;
    out.mag_ = std::move(mag);
    out.trim();
    return true;
}

bool BigInt::from_integral_double(double d, BigInt& out) {
    if (!std::isfinite(d) || std::trunc(d) != d) return false;
    out = BigInt();
    if (d == 0.0) return true;
    int exp = 0;
    const double frac = std::frexp(std::fabs(d), &exp);  // |d| = frac * 2**exp, 0.5 <= frac < 1
    // 53 significant bits as an integer, then shifted into place.
    const auto mant = static_cast<std::uint64_t>(std::ldexp(frac, 53));
    BigInt m(static_cast<std::int64_t>(mant));
    if (exp >= 53) {
        out = m.shifted_left(static_cast<std::uint64_t>(exp - 53));
    } else {
        out = m.shifted_right_magnitude(static_cast<std::uint64_t>(53 - exp));  // exact: d is integral
    }
    out.neg_ = d < 0 && !out.mag_.empty();
    return true;
}

BigInt BigInt::from_signed_le_bytes(const unsigned char* bytes, std::size_t n) {
    BigInt out;
    if (n == 0) return out;
    const bool negative = (bytes[n - 1] & 0x80U) != 0;
    // The magnitude of a negative value is the two's complement: invert and add one.
    out.mag_.assign((n + 3) / 4, 0);
    unsigned carry = negative ? 1U : 0U;
    for (std::size_t i = 0; i < n; ++i) {
        unsigned byte = negative ? (~bytes[i] & 0xFFU) : bytes[i];
        byte += carry;
        carry = byte >> 8;
        out.mag_[i / 4] |= static_cast<std::uint32_t>(byte & 0xFFU) << (8 * (i % 4));
    }
    out.neg_ = negative;
    out.trim();
    return out;
}

std::uint64_t BigInt::bit_length() const { return limb_bits(mag_); }

bool BigInt::to_int64(std::int64_t& out) const {
    if (mag_.size() > 2) return false;
    std::uint64_t m = 0;
    if (!mag_.empty()) m = mag_[0];
    if (mag_.size() == 2) m |= static_cast<std::uint64_t>(mag_[1]) << 32;
    if (!neg_) {
        if (m > static_cast<std::uint64_t>(INT64_MAX)) return false;
        out = static_cast<std::int64_t>(m);
        return true;
    }
    if (m > static_cast<std::uint64_t>(INT64_MAX) + 1) return false;
    out = static_cast<std::int64_t>(~m + 1);  // two's complement; m == 2**63 gives INT64_MIN
    return true;
}

std::string BigInt::to_string() const {
    if (mag_.empty()) return "0";
    Limbs v = mag_;
    std::string digits;
    // Peel off nine decimal digits at a time.
    while (!v.empty()) {
        std::uint64_t rem = 0;
        for (std::size_t i = v.size(); i-- > 0;) {
            const std::uint64_t cur = (rem << 32) | v[i];
            v[i] = static_cast<std::uint32_t>(cur / 1000000000U);
            rem = cur % 1000000000U;
        }
        trim_limbs(v);
        for (int k = 0; k < 9; ++k) {
            digits.push_back(static_cast<char>('0' + rem % 10));
            rem /= 10;
            if (v.empty() && rem == 0) break;
        }
    }
    while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
    if (neg_) digits.push_back('-');
    std::reverse(digits.begin(), digits.end());
    return digits;
}

bool BigInt::to_double(double& out) const {
    const std::uint64_t n = bit_length();
    if (n == 0) {
        out = 0.0;
        return true;
    }
    double mag;
    if (n <= 64) {
        // uint64 -> double rounds to nearest, ties to even.
        mag = static_cast<double>(bits_at(mag_, 0));
    } else {
        // The top 64 bits, with every lower bit folded into the lowest one (a sticky bit): the
        // conversion rounds at bit 11 of these 64, so the folded bit only breaks ties correctly.
        std::uint64_t top = bits_at(mag_, n - 64);
        if (any_bits_below(mag_, n - 64)) top |= 1U;
        if (n - 64 > 2000) {
            out = 0.0;
            return false;
        }
        mag = std::ldexp(static_cast<double>(top), static_cast<int>(n - 64));
    }
    if (std::isinf(mag)) return false;
    out = neg_ ? -mag : mag;
    return true;
}

bool BigInt::true_divide(const BigInt& n, const BigInt& d, double& out) {
    const bool negative = n.neg_ != d.neg_;
    if (n.is_zero()) {
        // Python: 0 / -5 is -0.0 (the sign of the true quotient).
        out = d.neg_ ? -0.0 : 0.0;
        return true;
    }
    const std::uint64_t na = n.bit_length();
    const std::uint64_t nb = d.bit_length();
    if (na <= 53 && nb <= 53) {
        // Both exact as doubles: one IEEE division, correctly rounded.
        double a = 0, b = 0;
        n.to_double(a);
        d.to_double(b);
        out = a / b;
        return true;
    }
    const BigInt a = n.abs();
    const BigInt b = d.abs();
    // e = floor(log2(a / b)) is na - nb or one less.
    auto e = static_cast<std::int64_t>(na) - static_cast<std::int64_t>(nb);
    {
        const bool less = e >= 0 ? compare(a, b.shifted_left(static_cast<std::uint64_t>(e))) < 0
                                 : compare(a.shifted_left(static_cast<std::uint64_t>(-e)), b) < 0;
        if (less) --e;
    }
    if (e > 1100) return false;  // certainly beyond DBL_MAX
    // The unit in the last place of the result: 2**k with 53 significant bits, or the smallest
    // subnormal's scale (2**-1074) for tiny quotients, so rounding happens once, at the right bit.
    const std::int64_t k = std::max<std::int64_t>(e, -1022) - 52;
    BigInt num = a;
    BigInt den = b;
    if (k < 0) {
        num = num.shifted_left(static_cast<std::uint64_t>(-k));
    } else {
        den = den.shifted_left(static_cast<std::uint64_t>(k));
    }
    BigInt q, r;
    floor_divmod(num, den, &q, &r);
    // Round half to even on the remainder.
    const int half = compare(r.shifted_left(1), den);
    if (half > 0 || (half == 0 && q.is_odd())) q = q + BigInt(1);
    double qd = 0;
    q.to_double(qd);  // at most 2**53: exact
    const double mag = std::ldexp(qd, static_cast<int>(k));
    if (std::isinf(mag)) return false;
    out = negative ? -mag : mag;
    return true;
}

int BigInt::compare_double(double d) const {
    if (std::isinf(d)) return d > 0 ? -1 : 1;
    const double fl = std::floor(d);
    BigInt f;
    from_integral_double(fl, f);
    const int c = compare(*this, f);
    if (c != 0) return c;    // self != floor(d): the integer order decides
    return d > fl ? -1 : 0;  // self == floor(d) < d, or equal
}

int BigInt::compare_magnitude(const Limbs& a, const Limbs& b) {
    if (a.size() != b.size()) return a.size() < b.size() ? -1 : 1;
    for (std::size_t i = a.size(); i-- > 0;) {
        if (a[i] != b[i]) return a[i] < b[i] ? -1 : 1;
    }
    return 0;
}

int compare(const BigInt& a, const BigInt& b) {
    if (a.neg_ != b.neg_) return a.neg_ ? -1 : 1;
    const int m = BigInt::compare_magnitude(a.mag_, b.mag_);
    return a.neg_ ? -m : m;
}

Limbs BigInt::add_magnitude(const Limbs& a, const Limbs& b) {
    const Limbs& big = a.size() >= b.size() ? a : b;
    const Limbs& small = a.size() >= b.size() ? b : a;
    Limbs out(big.size() + 1, 0);
    std::uint64_t carry = 0;
    for (std::size_t i = 0; i < big.size(); ++i) {
        const std::uint64_t t =
            static_cast<std::uint64_t>(big[i]) + (i < small.size() ? small[i] : 0) + carry;
        out[i] = static_cast<std::uint32_t>(t);
        carry = t >> 32;
    }
    out[big.size()] = static_cast<std::uint32_t>(carry);
    trim_limbs(out);
    return out;
}

Limbs BigInt::sub_magnitude(const Limbs& a, const Limbs& b) {
    Limbs out(a.size(), 0);
    std::int64_t borrow = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        std::int64_t t = static_cast<std::int64_t>(a[i]) - (i < b.size() ? b[i] : 0) - borrow;
        borrow = t < 0 ? 1 : 0;
        if (t < 0) t += std::int64_t{1} << 32;
        out[i] = static_cast<std::uint32_t>(t);
    }
    trim_limbs(out);
    return out;
}

BigInt operator+(const BigInt& a, const BigInt& b) {
    BigInt out;
    if (a.neg_ == b.neg_) {
        out.mag_ = BigInt::add_magnitude(a.mag_, b.mag_);
        out.neg_ = a.neg_;
    } else if (BigInt::compare_magnitude(a.mag_, b.mag_) >= 0) {
        out.mag_ = BigInt::sub_magnitude(a.mag_, b.mag_);
        out.neg_ = a.neg_;
    } else {
        out.mag_ = BigInt::sub_magnitude(b.mag_, a.mag_);
        out.neg_ = b.neg_;
    }
    out.trim();
    return out;
}

BigInt BigInt::operator-() const {
    BigInt out = *this;
    if (!out.mag_.empty()) out.neg_ = !out.neg_;
    return out;
}

BigInt BigInt::abs() const {
    BigInt out = *this;
    out.neg_ = false;
    return out;
}

BigInt operator-(const BigInt& a, const BigInt& b) { return a + (-b); }

BigInt operator*(const BigInt& a, const BigInt& b) {
    BigInt out;
    if (a.mag_.empty() || b.mag_.empty()) return out;
    out.mag_.assign(a.mag_.size() + b.mag_.size(), 0);
    for (std::size_t i = 0; i < a.mag_.size(); ++i) {
        std::uint64_t carry = 0;
        for (std::size_t j = 0; j < b.mag_.size(); ++j) {
            const std::uint64_t t =
                static_cast<std::uint64_t>(a.mag_[i]) * b.mag_[j] + out.mag_[i + j] + carry;
            out.mag_[i + j] = static_cast<std::uint32_t>(t);
            carry = t >> 32;
        }
        std::size_t k = i + b.mag_.size();
        while (carry != 0) {
            const std::uint64_t t = static_cast<std::uint64_t>(out.mag_[k]) + carry;
            out.mag_[k] = static_cast<std::uint32_t>(t);
            carry = t >> 32;
            ++k;
        }
    }
    out.neg_ = a.neg_ != b.neg_;
    out.trim();
    return out;
}

BigInt BigInt::shifted_left(std::uint64_t shift) const {
    BigInt out;
    if (mag_.empty()) return out;
    const std::uint64_t limbs = shift / 32;
    const unsigned bits = static_cast<unsigned>(shift % 32);
    out.mag_.assign(limbs, 0);
    std::uint32_t carry = 0;
    for (std::uint32_t limb : mag_) {
        if (bits == 0) {
            out.mag_.push_back(limb);
        } else {
            out.mag_.push_back((limb << bits) | carry);
            carry = limb >> (32 - bits);
        }
    }
    if (carry != 0) out.mag_.push_back(carry);
    out.neg_ = neg_;
    out.trim();
    return out;
}

BigInt BigInt::shifted_right_magnitude(std::uint64_t shift) const {
    BigInt out;
    const std::uint64_t limbs = shift / 32;
    if (limbs >= mag_.size()) return out;
    const unsigned bits = static_cast<unsigned>(shift % 32);
    for (std::size_t i = limbs; i < mag_.size(); ++i) {
        std::uint32_t v = mag_[i] >> bits;
        if (bits != 0 && i + 1 < mag_.size()) v |= mag_[i + 1] << (32 - bits);
        out.mag_.push_back(v);
    }
    out.trim();
    return out;
}

void BigInt::divmod_magnitude(const Limbs& a, const Limbs& b, Limbs& q, Limbs& r) {
    q.clear();
    r.clear();
    if (compare_magnitude(a, b) < 0) {
        r = a;
        return;
    }
    if (b.size() == 1) {
        q.assign(a.size(), 0);
        std::uint64_t rem = 0;
        for (std::size_t i = a.size(); i-- > 0;) {
            const std::uint64_t cur = (rem << 32) | a[i];
            q[i] = static_cast<std::uint32_t>(cur / b[0]);
            rem = cur % b[0];
        }
        trim_limbs(q);
        if (rem != 0) r.push_back(static_cast<std::uint32_t>(rem));
        return;
    }
    // Knuth, TAOCP vol. 2, 4.3.1, Algorithm D: normalise so the divisor's top limb has its high
    // bit set, then estimate each quotient limb from the top two limbs and correct.
    const unsigned s = static_cast<unsigned>(__builtin_clz(b.back()));
    const std::size_t n = b.size();
    const std::size_t m = a.size() - n;
    Limbs v(n), u(a.size() + 1);
    for (std::size_t i = n; i-- > 0;) v[i] = (b[i] << s) | (s != 0 && i > 0 ? b[i - 1] >> (32 - s) : 0);
    u[a.size()] = s != 0 ? a.back() >> (32 - s) : 0;
    for (std::size_t i = a.size(); i-- > 0;)
        u[i] = (a[i] << s) | (s != 0 && i > 0 ? a[i - 1] >> (32 - s) : 0);
    q.assign(m + 1, 0);
    const std::uint64_t base = std::uint64_t{1} << 32;
    for (std::size_t j = m + 1; j-- > 0;) {
        const std::uint64_t top = (static_cast<std::uint64_t>(u[j + n]) << 32) | u[j + n - 1];
        std::uint64_t qhat = top / v[n - 1];
        std::uint64_t rhat = top % v[n - 1];
        while (qhat >= base || qhat * v[n - 2] > ((rhat << 32) | u[j + n - 2])) {
            --qhat;
            rhat += v[n - 1];
            if (rhat >= base) break;
        }
        // Multiply and subtract.
        std::int64_t borrow = 0;
        std::uint64_t carry = 0;
        for (std::size_t i = 0; i < n; ++i) {
            const std::uint64_t p = qhat * v[i] + carry;
            carry = p >> 32;
            const std::int64_t t =
                static_cast<std::int64_t>(u[i + j]) - borrow - static_cast<std::int64_t>(p & 0xFFFFFFFFU);
            u[i + j] = static_cast<std::uint32_t>(t);
            borrow = t < 0 ? 1 : 0;
        }
        const std::int64_t t =
            static_cast<std::int64_t>(u[j + n]) - borrow - static_cast<std::int64_t>(carry);
        u[j + n] = static_cast<std::uint32_t>(t);
        if (t < 0) {
            // qhat was one too large: add the divisor back.
            --qhat;
            std::uint64_t c = 0;
            for (std::size_t i = 0; i < n; ++i) {
                const std::uint64_t sum = static_cast<std::uint64_t>(u[i + j]) + v[i] + c;
                u[i + j] = static_cast<std::uint32_t>(sum);
                c = sum >> 32;
            }
            u[j + n] = static_cast<std::uint32_t>(static_cast<std::uint64_t>(u[j + n]) + c);
        }
        q[j] = static_cast<std::uint32_t>(qhat);
    }
    trim_limbs(q);
    // Unnormalise the remainder.
    r.assign(n, 0);
    for (std::size_t i = 0; i < n; ++i) {
        r[i] = (u[i] >> s) |
               (s != 0 ? static_cast<std::uint32_t>(static_cast<std::uint64_t>(u[i + 1]) << (32 - s)) : 0);
    }
    trim_limbs(r);
}

void BigInt::floor_divmod(const BigInt& a, const BigInt& b, BigInt* q, BigInt* r) {
    BigInt qq, rr;
    divmod_magnitude(a.mag_, b.mag_, qq.mag_, rr.mag_);
    // Truncated: sign of q is the sign product, r has a's sign.
    qq.neg_ = a.neg_ != b.neg_;
    rr.neg_ = a.neg_;
    qq.trim();
    rr.trim();
    // Floor: when the remainder is non-zero and its sign differs from b's, step down.
    if (!rr.is_zero() && rr.neg_ != b.neg_) {
        qq = qq - BigInt(1);
        rr = rr + b;
    }
    if (q != nullptr) *q = std::move(qq);
    if (r != nullptr) *r = std::move(rr);
}

}  // namespace tripwire::core::shape
