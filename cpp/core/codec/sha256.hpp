// tripwire/cpp/core/codec/sha256.hpp -- SHA-256, the content hash of the format.
//
// OpenSSL's (libcrypto, the library CPython's hashlib uses): a vetted implementation, with the
// CPU's SHA instructions where it has them. It runs once per guard set encoded or decoded (dumps,
// loads), never on a check. It detects corruption (a flipped bit, a torn write); it is not a
// signature (anyone who can write the file can recompute it).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace tripwire::core::codec {

using Digest = std::array<std::uint8_t, 32>;

/// The SHA-256 digest of `size` bytes at `data`. Throws std::runtime_error when libcrypto cannot
/// compute it (no memory).
Digest sha256(const std::uint8_t* data, std::size_t size);

}  // namespace tripwire::core::codec
