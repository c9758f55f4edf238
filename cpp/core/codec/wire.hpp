// tripwire/cpp/core/codec/wire.hpp -- the format's primitives: little-endian integers, LEB128
// varints, length-prefixed byte strings; a bounds-checked reader that reports byte offsets.
//
// Every length or count the reader hands out has been checked against the bytes that remain. That
// bounds the number of items, not their memory: an item of one input byte may decode to a hundred
// bytes (a Value, a GuardRecord), and nested containers each declare their count against the same
// remaining bytes while the outer ones stay reserved (a 64 KiB body asked 800 MB that way).
// So a declared count never sizes memory directly: reserve_declared reserves at most
// kReserveBytes, and the vector grows with the items actually decoded, each of which consumed
// input (tests/cpp/test_codec_memory.cpp pins the peak).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "core/codec/document.hpp"

namespace tripwire::core::codec {

/// The most a declared count may reserve up front, in bytes.
inline constexpr std::size_t kReserveBytes = std::size_t{64} << 10;

/// Reserve for `count` declared items, capped at kReserveBytes' worth of elements.
template <class Vector>
void reserve_declared(Vector& v, std::size_t count) {
    constexpr std::size_t cap = std::max<std::size_t>(1, kReserveBytes / sizeof(typename Vector::value_type));
    v.reserve(std::min(count, cap));
}

class Writer {
  public:
    std::string out;

    void u8(std::uint8_t v) { out.push_back(static_cast<char>(v)); }
    void u16(std::uint16_t v) {
        u8(static_cast<std::uint8_t>(v));
        u8(static_cast<std::uint8_t>(v >> 8));
    }
    void u32(std::uint32_t v) {
        for (int i = 0; i < 4; ++i) u8(static_cast<std::uint8_t>(v >> (8 * i)));
    }
    void u64(std::uint64_t v) {
        for (int i = 0; i < 8; ++i) u8(static_cast<std::uint8_t>(v >> (8 * i)));
    }
    void varint(std::uint64_t v) {
        while (v >= 0x80) {
            u8(static_cast<std::uint8_t>(v | 0x80));
            v >>= 7;
        }
        u8(static_cast<std::uint8_t>(v));
    }
    void zigzag(std::int64_t v) {
        varint((static_cast<std::uint64_t>(v) << 1) ^ static_cast<std::uint64_t>(v >> 63));
    }
    void bytes(std::string_view s) {
        varint(s.size());
        out.append(s.data(), s.size());
    }
    void raw(std::string_view s) { out.append(s.data(), s.size()); }
};

class Reader {
  public:
    /// `base` is the offset of data[0] in the whole input (for messages).
    Reader(const std::uint8_t* data, std::size_t size, std::size_t base) : p_(data), n_(size), base_(base) {}

    std::size_t offset() const { return base_ + pos_; }
    std::size_t remaining() const { return n_ - pos_; }
    bool at_end() const { return pos_ == n_; }
    [[noreturn]] void fail(const std::string& why) const { throw FormatError(offset(), why); }
    [[noreturn]] void fail_at(std::size_t off, const std::string& why) const { throw FormatError(off, why); }

    std::uint8_t u8(const char* what) {
        need(1, what);
        return p_[pos_++];
    }
    bool flag(const char* what) {
        const std::size_t at = offset();
        const std::uint8_t b = u8(what);
        if (b > 1) fail_at(at, std::string(what) + " must be 0 or 1, not " + std::to_string(b));
        return b == 1;
    }
    std::uint16_t u16(const char* what) {
        need(2, what);
        const std::uint16_t v = static_cast<std::uint16_t>(p_[pos_] | (p_[pos_ + 1] << 8));
        pos_ += 2;
        return v;
    }
    std::uint32_t u32(const char* what) {
        need(4, what);
        std::uint32_t v = 0;
        for (int i = 0; i < 4; ++i) v |= std::uint32_t{p_[pos_ + i]} << (8 * i);
        pos_ += 4;
        return v;
    }
    std::uint64_t u64(const char* what) {
        need(8, what);
        std::uint64_t v = 0;
        for (int i = 0; i < 8; ++i) v |= std::uint64_t{p_[pos_ + i]} << (8 * i);
        pos_ += 8;
        return v;
    }
    /// Unsigned LEB128, at most 10 bytes, minimal (no trailing zero groups): one value, one encoding.
    std::uint64_t varint(const char* what) {
        const std::size_t at = offset();
        std::uint64_t v = 0;
        for (int shift = 0;; shift += 7) {
            if (at_end()) fail(std::string("truncated: ") + what + " (a varint) runs past the end");
            const std::uint8_t b = p_[pos_++];
            if (shift == 63 && b > 1) fail_at(at, std::string(what) + ": varint overflows 64 bits");
            v |= std::uint64_t{b & 0x7Fu} << shift;
            if ((b & 0x80) == 0) {
                if (b == 0 && shift != 0) fail_at(at, std::string(what) + ": varint is not minimal");
                return v;
            }
        }
    }
    std::int64_t zigzag(const char* what) {
        const std::uint64_t u = varint(what);
        return static_cast<std::int64_t>((u >> 1) ^ (~(u & 1) + 1));
    }
    /// A count of items of at least `min_size` bytes each: never more than the bytes left allow.
    std::size_t count(const char* what, std::size_t min_size = 1) {
        const std::size_t at = offset();
        const std::uint64_t c = varint(what);
        if (min_size != 0 && c > remaining() / min_size) {
            fail_at(at, std::string(what) + " declares " + std::to_string(c) + " items but only " +
                            std::to_string(remaining()) + " bytes follow");
        }
        return static_cast<std::size_t>(c);
    }
    /// An index below `limit`.
    std::uint32_t index(const char* what, std::size_t limit) {
        const std::size_t at = offset();
        const std::uint64_t i = varint(what);
        if (i >= limit) {
            fail_at(at, std::string(what) + " " + std::to_string(i) + " is out of range (" +
                            std::to_string(limit) + " present)");
        }
        return static_cast<std::uint32_t>(i);
    }
    /// A length-prefixed byte string of at most `max` bytes.
    std::string_view bytes(const char* what, std::size_t max = ~std::size_t{0}) {
        const std::size_t at = offset();
        const std::uint64_t len = varint(what);
        if (len > remaining()) {
            fail_at(at, std::string("truncated: ") + what + " declares " + std::to_string(len) +
                            " bytes but only " + std::to_string(remaining()) + " follow");
        }
        if (len > max) fail_at(at, std::string(what) + " is longer than " + std::to_string(max) + " bytes");
        return raw(static_cast<std::size_t>(len), what);
    }
    std::string_view raw(std::size_t len, const char* what) {
        need(len, what);
        std::string_view s(reinterpret_cast<const char*>(p_ + pos_), len);
        pos_ += len;
        return s;
    }
    /// A sub-reader over the next `len` bytes (a section body); this reader skips them.
    Reader sub(std::size_t len, const char* what) {
        need(len, what);
        Reader r(p_ + pos_, len, offset());
        pos_ += len;
        return r;
    }

  private:
    void need(std::size_t k, const char* what) const {
        if (k > remaining()) {
            fail(std::string("truncated: ") + what + " needs " + std::to_string(k) + " bytes, " +
                 std::to_string(remaining()) + " left");
        }
    }

    const std::uint8_t* p_;
    std::size_t n_;
    std::size_t pos_ = 0;
    std::size_t base_;
};

}  // namespace tripwire::core::codec
