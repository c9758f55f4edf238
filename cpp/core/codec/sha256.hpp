// tripwire/cpp/core/codec/sha256.hpp -- SHA-256 (FIPS 180-4), the content hash of the format.
//
// Portable C++ (the core has no dependencies). It detects
// corruption (a flipped bit, a torn write); it is not a signature (anyone who can write the file can
// recompute it).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace tripwire::core::codec {

using Digest = std::array<std::uint8_t, 32>;

/// The SHA-256 digest of `size` bytes at `data`.
Digest sha256(const std::uint8_t* data, std::size_t size);

}  // namespace tripwire::core::codec
