// tripwire/cpp/core/codec/sha256.cpp -- SHA-256 through OpenSSL's EVP interface (see the header).
#include "core/codec/sha256.hpp"

#include <openssl/evp.h>

#include <stdexcept>

namespace tripwire::core::codec {

Digest sha256(const std::uint8_t* data, std::size_t size) {
    Digest out{};
    unsigned int n = 0;
    if (EVP_Digest(data, size, out.data(), &n, EVP_sha256(), nullptr) != 1 || n != out.size())
        throw std::runtime_error("SHA-256 could not be computed (libcrypto)");
    return out;
}

}  // namespace tripwire::core::codec
