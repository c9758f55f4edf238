// tripwire/cpp/core/codec/guard_records.hpp -- each guard kind's payload: a typed, versioned record.
//
// A guard record is kind, record version, id, source, then the kind's payload (length-prefixed).
// The payload is the only part that differs by kind, and it lives here: adding a kind is one
// entry in record_version(), write_payload() and read_payload() (docs/format.md, "Adding a kind").
#pragma once

#include <cstdint>

#include "core/codec/wire.hpp"
#include "core/ir.hpp"

namespace tripwire::core::codec {

/// The record version this build writes for `k`; 0 when the kind is never stored (DICT_VERSION,
/// LAMBDA: their meaning does not survive the process).
std::uint8_t record_version(GuardKind k);

/// Why a kind is never stored, or null when it is.
const char* never_stored_reason(GuardKind k);

/// Write the payload of `d` (its kind's fields only).
void write_payload(const GuardDecl& d, Writer& w);

/// Read a payload of kind `d.kind`, written with record version `version`, into `d`; consumes
/// the whole reader or throws FormatError. Constant ids are checked against `n_consts`.
void read_payload(GuardDecl& d, std::uint8_t version, Reader& r, std::size_t n_consts);

}  // namespace tripwire::core::codec
