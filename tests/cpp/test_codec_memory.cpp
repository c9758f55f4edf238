// tripwire/tests/cpp/test_codec_memory.cpp -- the decoder's memory is bounded by its input.
//
// A declared count is only an upper bound the input may not meet: reserving by it lets a small
// hostile input ask for far more memory than it could describe (count x sizeof(element), and,
// for nested containers, once per level while the outer levels stay reserved). This binary
// replaces the global operator new to measure the peak of live heap bytes during decode_body and
// refuses (std::bad_alloc) any single request above a budget, so a regression shows as a thrown
// bad_alloc or a peak above the bound, never as an actual multi-gigabyte allocation. It is its own
// executable: the replacement applies to the whole program.
#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <string>

#include "core/codec/document.hpp"

namespace {

// Live-byte accounting while `g_armed`; every block carries its size in a header.
std::atomic<bool> g_armed{false};
std::atomic<std::size_t> g_live{0}, g_peak{0}, g_largest_refused{0};
std::size_t g_single_limit = 0;
constexpr std::size_t kHeader = alignof(std::max_align_t);

void* counted_alloc(std::size_t n) {
    if (g_armed.load(std::memory_order_relaxed) && n > g_single_limit) {
        g_largest_refused = n;
        throw std::bad_alloc();
    }
    void* p = std::malloc(n + kHeader);
    if (p == nullptr) throw std::bad_alloc();
    *static_cast<std::size_t*>(p) = n;
    const std::size_t live = g_live += n;
    std::size_t peak = g_peak.load();
    while (live > peak && !g_peak.compare_exchange_weak(peak, live)) {}
    return static_cast<char*>(p) + kHeader;
}

void counted_free(void* p) noexcept {
    if (p == nullptr) return;
    char* block = static_cast<char*>(p) - kHeader;
    g_live -= *reinterpret_cast<std::size_t*>(block);
    std::free(block);
}

/// Peak live bytes of `body`'s decode above the bytes live before it; the decode must throw
/// FormatError (these inputs are all malformed) and never bad_alloc.
std::size_t peak_of_decode(const std::string& body, std::size_t single_limit) {
    g_single_limit = single_limit;
    g_peak = g_live.load();
    const std::size_t before = g_live.load();
    g_armed = true;
    bool format_error = false, bad_alloc = false;
    try {
        (void)tripwire::core::codec::decode_body(reinterpret_cast<const std::uint8_t*>(body.data()),
                                                 body.size());
    } catch (const tripwire::core::codec::FormatError&) {
        format_error = true;
    } catch (const std::bad_alloc&) {
        bad_alloc = true;
    }
    g_armed = false;
    EXPECT_FALSE(bad_alloc) << "a single request of " << g_largest_refused << " bytes for a " << body.size()
                            << "-byte input";
    EXPECT_TRUE(format_error || bad_alloc);
    return g_peak.load() - before;
}

std::string varint(std::uint64_t v) {
    std::string out;
    while (v >= 0x80) {
        out.push_back(static_cast<char>((v & 0x7F) | 0x80));
        v >>= 7;
    }
    out.push_back(static_cast<char>(v));
    return out;
}

std::string section(int tag, const std::string& content) {
    return std::string(1, static_cast<char>(tag)) + varint(content.size()) + content;
}

const std::string kEmpty = std::string(1, '\0');  // a section holding a zero count

// The body up to (not including) the constants section: Python 3.11, no strings, no references.
std::string prefix() { return std::string("\x03\x0b", 2) + section(1, kEmpty) + section(2, kEmpty); }

constexpr std::size_t kPadding = std::size_t{64} << 10;

}  // namespace

void* operator new(std::size_t n) { return counted_alloc(n); }
void* operator new[](std::size_t n) { return counted_alloc(n); }
void operator delete(void* p) noexcept { counted_free(p); }
void operator delete[](void* p) noexcept { counted_free(p); }
void operator delete(void* p, std::size_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::size_t) noexcept { counted_free(p); }

namespace tripwire::core::codec {
namespace {

// The bound every case below must meet: a constant factor of the input (a decoded item costs at
// most a few hundred bytes and consumed at least one input byte) plus the fixed reservations.
constexpr std::size_t kSingleLimit = std::size_t{8} << 20;

std::size_t bound(const std::string& body) { return 600 * body.size() + (std::size_t{16} << 20); }

TEST(CodecMemory, NestedContainersDeclaringHugeCounts) {
    // One constant: 127 tuples nested, each declaring as many items as bytes follow, then 64 KiB
    // of padding (None values) the innermost one reads before the outer ones run out.
    std::string values;
    for (int level = 0; level < 127; ++level) values += std::string(1, '\x0a') + varint(kPadding);
    values += std::string(kPadding, '\0');
    const std::string body = prefix() + section(3, varint(1) + std::string(1, '\0') + values);
    // Reserving by the declared counts asked 127 x 64 Ki x sizeof(Value) (~800 MB) here.
    EXPECT_LE(peak_of_decode(body, kSingleLimit), bound(body));
}

TEST(CodecMemory, DictsDeclaringHugeCounts) {
    std::string values;
    for (int level = 0; level < 127; ++level) values += std::string(1, '\x0e') + varint(kPadding / 2);
    values += std::string(kPadding, '\0');
    const std::string body = prefix() + section(3, varint(1) + std::string(1, '\0') + values);
    EXPECT_LE(peak_of_decode(body, kSingleLimit), bound(body));
}

TEST(CodecMemory, SectionCountsOfPaddingOnly) {
    // Each top-level table declares as many entries as its bytes could hold at the minimum size,
    // and the bytes are padding the first entry already fails on (0xff: an overlong varint, an
    // unknown kind or flag).
    const std::string pad(std::size_t{4} << 20, '\xff');
    for (int which = 1; which <= 4; ++which) {
        std::string body = std::string("\x03\x0b", 2);
        for (int tag = 1; tag < which; ++tag) body += section(tag, kEmpty);
        body += section(which, varint(pad.size()) + pad);
        const std::size_t peak = peak_of_decode(body, kSingleLimit);
        EXPECT_LE(peak, bound(body)) << "section " << which;
        // What is read before the first bad entry is small: nothing near count x sizeof.
        EXPECT_LE(peak, std::size_t{1} << 20) << "section " << which;
    }
}

TEST(CodecMemory, ShapeSymbolsAndTensorDataDeclaringHugeCounts) {
    // A guards section whose one record's payload declares as many SHAPE symbols (or TENSOR_MATCH
    // data items) as its bytes allow, then garbage.
    const std::string strings = section(1, varint(2) + varint(1) + "x" + varint(4) + "x>=1");
    const std::string consts =
        section(3, varint(1) + std::string(1, '\0') + std::string(1, '\x07') + varint(0));
    for (const std::uint8_t kind :
         {static_cast<std::uint8_t>(GuardKind::Shape), static_cast<std::uint8_t>(GuardKind::TensorMatch)}) {
        std::string payload;
        const std::size_t n = std::size_t{16} << 20;
        if (kind == static_cast<std::uint8_t>(GuardKind::Shape)) {
            payload = varint(1) + varint(n / 5) + std::string(n, '\xff');  // symbols: 5 bytes at least
        } else {
            payload = varint(0) + varint(n) + std::string(n, '\xff');  // data: 1 byte at least
        }
        std::string record = std::string(1, static_cast<char>(kind)) + std::string(1, '\x01') + varint(0) +
                             std::string(1, '\0') + varint(payload.size()) + payload + varint(0) + varint(0);
        std::string body("\x03\x0b", 2);
        body += strings;
        body += section(2, kEmpty);
        body += consts;
        body += section(4, varint(1) + record);
        body += section(5, std::string("\0\0\0\0", 4));
        EXPECT_LE(peak_of_decode(body, kSingleLimit), bound(body)) << "kind " << int{kind};
    }
}

}  // namespace
}  // namespace tripwire::core::codec
