// tripwire/cpp/core/codec/sha256.cpp -- SHA-256, straight from FIPS 180-4.
#include "core/codec/sha256.hpp"

#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define TRIPWIRE_SHA_NI 1
#endif

namespace tripwire::core::codec {
namespace {

constexpr std::uint32_t kRound[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

inline std::uint32_t rotr(std::uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

void compress(std::uint32_t h[8], const std::uint8_t block[64]) {
    std::uint32_t w[64];
    for (std::size_t i = 0; i < 16; ++i) {
        w[i] = (std::uint32_t{block[4 * i]} << 24) | (std::uint32_t{block[4 * i + 1]} << 16) |
               (std::uint32_t{block[4 * i + 2]} << 8) | std::uint32_t{block[4 * i + 3]};
    }
    for (int i = 16; i < 64; ++i) {
        const std::uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
        const std::uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    std::uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int i = 0; i < 64; ++i) {
        const std::uint32_t t1 =
            k + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + kRound[i] + w[i];
        const std::uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += k;
}

#ifdef TRIPWIRE_SHA_NI
// The x86 SHA extensions (Intel's SHA-NI, on most x86-64 CPUs since 2017-2019): the same
// compression, four rounds per two instructions, about 8x the portable loop. Chosen at run time
// (have_sha_ni); the portable loop stays the reference, and the tests compare the two.
__attribute__((target("sha,sse4.1,ssse3"))) void compress_sha_ni(std::uint32_t h[8], const std::uint8_t* data,
                                                                 std::size_t blocks) {
    const __m128i mask = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    __m128i tmp = _mm_loadu_si128(reinterpret_cast<const __m128i*>(&h[0]));
    __m128i state1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(&h[4]));
    tmp = _mm_shuffle_epi32(tmp, 0xB1);                // CDAB
    state1 = _mm_shuffle_epi32(state1, 0x1B);          // EFGH
    __m128i state0 = _mm_alignr_epi8(tmp, state1, 8);  // ABEF
    state1 = _mm_blend_epi16(state1, tmp, 0xF0);       // CDGH
    for (; blocks != 0; --blocks, data += 64) {
        const __m128i abef = state0;
        const __m128i cdgh = state1;
        __m128i w[4];
        for (std::size_t j = 0; j < 4; ++j)
            w[j] = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(data + 16 * j)), mask);
        for (std::size_t j = 0; j < 16; ++j) {
            // w[j & 3] holds the message words 4j..4j+3; the next three slots hold the following.
            __m128i msg =
                _mm_add_epi32(w[j & 3], _mm_loadu_si128(reinterpret_cast<const __m128i*>(&kRound[4 * j])));
            state1 = _mm_sha256rnds2_epu32(state1, state0, msg);
            msg = _mm_shuffle_epi32(msg, 0x0E);
            state0 = _mm_sha256rnds2_epu32(state0, state1, msg);
            if (j < 12) {  // words 4(j+4)..: W[t-16] + s0(W[t-15]) + W[t-7], then + s1(W[t-2])
                const __m128i w7 = _mm_alignr_epi8(w[(j + 3) & 3], w[(j + 2) & 3], 4);
                const __m128i partial = _mm_add_epi32(_mm_sha256msg1_epu32(w[j & 3], w[(j + 1) & 3]), w7);
                w[j & 3] = _mm_sha256msg2_epu32(partial, w[(j + 3) & 3]);
            }
        }
        state0 = _mm_add_epi32(state0, abef);
        state1 = _mm_add_epi32(state1, cdgh);
    }
    tmp = _mm_shuffle_epi32(state0, 0x1B);        // FEBA
    state1 = _mm_shuffle_epi32(state1, 0xB1);     // DCHG
    state0 = _mm_blend_epi16(tmp, state1, 0xF0);  // DCBA
    state1 = _mm_alignr_epi8(state1, tmp, 8);     // ABEF
    _mm_storeu_si128(reinterpret_cast<__m128i*>(&h[0]), state0);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(&h[4]), state1);
}

bool have_sha_ni() {
    // CPUID: leaf 7 EBX bit 29 is SHA; leaf 1 ECX bits 9 and 19 are SSSE3 and SSE4.1.
    static const bool has = [] {
        unsigned a = 0, b = 0, c = 0, d = 0;
        if (__get_cpuid(1, &a, &b, &c, &d) == 0) return false;
        const bool sse = ((c >> 9) & 1U) != 0 && ((c >> 19) & 1U) != 0;
        if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
        return sse && ((b >> 29) & 1U) != 0;
    }();
    return has;
}
#endif

void compress_blocks(std::uint32_t h[8], const std::uint8_t* data, std::size_t blocks, bool portable) {
#ifdef TRIPWIRE_SHA_NI
    if (!portable && have_sha_ni()) {
        compress_sha_ni(h, data, blocks);
        return;
    }
#endif
    for (std::size_t b = 0; b < blocks; ++b) compress(h, data + 64 * b);
}

}  // namespace

bool sha256_accelerated() {
#ifdef TRIPWIRE_SHA_NI
    return have_sha_ni();
#else
    return false;
#endif
}

Digest sha256(const std::uint8_t* data, std::size_t size) { return sha256(data, size, false); }

Digest sha256(const std::uint8_t* data, std::size_t size, bool portable) {
    std::uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                          0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    const std::size_t i = size / 64 * 64;
    compress_blocks(h, data, size / 64, portable);
    std::uint8_t tail[128] = {};
    const std::size_t rest = size - i;
    if (rest != 0) std::memcpy(tail, data + i, rest);
    tail[rest] = 0x80;
    const std::size_t tail_len = rest + 1 + 8 <= 64 ? 64 : 128;
    const std::uint64_t bits = static_cast<std::uint64_t>(size) * 8;
    for (int b = 0; b < 8; ++b) tail[tail_len - 1 - b] = static_cast<std::uint8_t>(bits >> (8 * b));
    compress_blocks(h, tail, tail_len / 64, portable);
    Digest out;
    for (std::size_t j = 0; j < 8; ++j) {
        out[4 * j] = static_cast<std::uint8_t>(h[j] >> 24);
        out[4 * j + 1] = static_cast<std::uint8_t>(h[j] >> 16);
        out[4 * j + 2] = static_cast<std::uint8_t>(h[j] >> 8);
        out[4 * j + 3] = static_cast<std::uint8_t>(h[j]);
    }
    return out;
}

}  // namespace tripwire::core::codec
