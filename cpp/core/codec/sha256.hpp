// tripwire/cpp/core/codec/sha256.hpp -- SHA-256 (FIPS 180-4), the content hash of the format.
//
// Portable C++ (the core has no dependencies), with x86 SHA-NI rounds chosen at run time. It detects
// corruption (a flipped bit, a torn write); it is not a signature (anyone who can write the file can
// recompute it).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace tripwire::core::codec {

using Digest = std::array<std::uint8_t, 32>;

/// The SHA-256 digest of `size` bytes at `data` (with the CPU's SHA instructions when it has them).
Digest sha256(const std::uint8_t* data, std::size_t size);
/// The same; `portable` forces the plain C++ rounds (the tests compare both paths).
Digest sha256(const std::uint8_t* data, std::size_t size, bool portable);
/// Whether sha256() uses the CPU's SHA instructions here (x86 SHA-NI).
bool sha256_accelerated();

}  // namespace tripwire::core::codec
