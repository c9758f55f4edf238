// tripwire/cpp/core/codec/guard_records.hpp -- each guard kind's payload: a typed, versioned record.
//
// A guard record is kind, record version, id, source, then the kind's payload (length-prefixed).
// The payload is the only part that differs by kind, and it lives here: adding a kind is one
// entry in record_version(), write_payload() and read_payload() (docs/format.md, "Adding a kind").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/codec/wire.hpp"
#include "core/ir.hpp"

namespace tripwire::core::codec {

/// The encoder's string table, for payloads that hold strings or extra sources.
class StringTable {
  public:
    virtual ~StringTable() = default;
    /// The index of `s` in the strings section (added on first use).
    virtual std::uint32_t index(const std::string& s) = 0;
};

/// What a payload may refer to when it is read: the strings section and the constant count.
struct PayloadContext {
    const std::vector<std::string>& strings;
    std::size_t n_consts;
    /// Per string: whether it holds a lone surrogate (nullptr: none does). The section takes
    /// what Python's "surrogatepass" writes, since a str constant may hold one; a name or text
    /// read by position may not.
    const std::vector<bool>* lone_surrogates = nullptr;

    /// The string a `what` index names, refused (at the index's offset) unless it is valid text.
    const std::string& text(Reader& r, const char* what) const;
};

/// Whether a string index may name `s` where text is required: the refusal's message, or empty.
std::string not_text_reason(const char* what, std::size_t index);

/// A source path: root kind, root-name constant, steps, printed prefixes (docs/format.md, the
/// guard record's "source"). The guard's own source is written with these; a kind that relates
/// several sources (ALIAS, NO_ALIAS, SHAPE's symbols) writes its others in its payload with them.
void write_source(const SourcePath& s, Writer& w, StringTable& strings);
/// Read one into `s`, every index checked (constants, strings), depth at most kMaxSourceDepth.
void read_source(Reader& r, SourcePath& s, const PayloadContext& ctx);

/// The record version this build writes for `k`; 0 when the kind is never stored (DICT_VERSION,
/// LAMBDA: their meaning does not survive the process).
std::uint8_t record_version(GuardKind k);
/// The record version this build writes for `d`: record_version(d.kind), except EQUALS_MATCH with
/// python_eq (GuardDecl::flag), which is version 2 (its payload adds the flag; a version-1 record
/// is the plain, type-exact EQUALS_MATCH, as every earlier build wrote it).
std::uint8_t record_version(const GuardDecl& d);

/// Why a kind is never stored, or null when it is.
const char* never_stored_reason(GuardKind k);

/// Write the payload of `d` (its kind's fields only).
void write_payload(const GuardDecl& d, Writer& w, StringTable& strings);

/// Read a payload of kind `d.kind`, written with record version `version`, into `d`; consumes
/// the whole reader or throws FormatError. Indices are checked against `ctx`.
void read_payload(GuardDecl& d, std::uint8_t version, Reader& r, const PayloadContext& ctx);

}  // namespace tripwire::core::codec
