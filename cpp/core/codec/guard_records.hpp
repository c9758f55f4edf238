// tripwire/cpp/core/codec/guard_records.hpp -- each guard kind's payload: a typed, versioned record.
//
// A guard record is kind, record version, id, source, then the kind's payload (length-prefixed).
// The payload is the only part that differs by kind, and it lives here: the kind table's RECORD,
// NEVER_STORED and PAYLOAD columns (core/guard_kind_table.hpp) give each kind its record version
// and the codec (write_<PAYLOAD>, read_<PAYLOAD> in guard_records.cpp) that stores it
// (docs/format.md, "Adding a kind").
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

/// How many bytes of strings a document's string indices may name in all: kTextPerByte per byte
/// of its body, plus kTextSlack. An index costs one or two bytes of input and names a string of any
/// length, and each use copies the string (and the load then parses, renders or compares it): a
/// 10 MB document naming a 5 MB string two million times would ask for 10 TB. Honest documents
/// name each string a few times (a source's text and its prefixes, one per guard on it: a chain
/// of 63 attributes guarded at every prefix names 18 bytes per byte). SHAPE relation texts have
/// a budget of their own, kRelationPerByte: each is parsed and compiled at decode and again at
/// load, and an honest set holds each relation once.
class TextBudget {
  public:
    static constexpr std::size_t kTextPerByte = 64;
    static constexpr std::size_t kTextSlack = std::size_t{1} << 20;
    static constexpr std::size_t kRelationPerByte = 2;
    static constexpr std::size_t kRelationSlack = std::size_t{64} << 10;

    explicit TextBudget(std::size_t body_size)
        : text_left_(body_size * kTextPerByte + kTextSlack),
          relation_left_(body_size * kRelationPerByte + kRelationSlack) {}

    /// Charge a use of a string of `bytes` bytes, named by the index at offset `at`.
    void charge(const Reader& r, std::size_t at, std::size_t bytes) {
        if (bytes > text_left_) {
            r.fail_at(at, "the document names its strings for more than " + std::to_string(kTextPerByte) +
                              " bytes per byte of its body (a long string named over and over): refused "
                              "before it is copied");
        }
        text_left_ -= bytes;
    }
    /// Charge a SHAPE relation text of `bytes` bytes, named at `at`.
    void charge_relation(const Reader& r, std::size_t at, std::size_t bytes) {
        if (bytes > relation_left_) {
            r.fail_at(at, "the SHAPE relation texts add up to more than " + std::to_string(kRelationPerByte) +
                              " bytes per byte of the body (a relation named over and over): refused before "
                              "they are parsed");
        }
        relation_left_ -= bytes;
    }

  private:
    std::size_t text_left_;
    std::size_t relation_left_;
};

/// What a payload may refer to when it is read: the strings section and the constant count.
struct PayloadContext {
    const std::vector<std::string>& strings;
    std::size_t n_consts;
    /// Per string: whether it holds a lone surrogate (nullptr: none does). The section takes
    /// what Python's "surrogatepass" writes, since a str constant may hold one; a name or text
    /// read by position may not.
    const std::vector<bool>* lone_surrogates = nullptr;
    /// The bytes of strings the rest of the document may still name (nullptr: no limit). Every
    /// index that names a string charges the string's length to it (TextBudget).
    TextBudget* budget = nullptr;

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

/// The record version this build writes for `k` (the kind table's RECORD column); 0 when the kind
/// is never stored (DICT_VERSION, LAMBDA: their meaning does not survive the process).
std::uint8_t record_version(GuardKind k);
/// The record version this build writes for `d`: record_version(d.kind), except EQUALS_MATCH with
/// python_eq (GuardDecl::flag), which is version 2 (its payload adds the flag; a version-1 record
/// is the plain, type-exact EQUALS_MATCH, as every earlier build wrote it).
std::uint8_t record_version(const GuardDecl& d);

/// Why a kind is never stored (the kind table's NEVER_STORED column), or null when it is.
const char* never_stored_reason(GuardKind k);

/// Write the payload of `d` (its kind's fields only).
void write_payload(const GuardDecl& d, Writer& w, StringTable& strings);

/// Read a payload of kind `d.kind`, written with record version `version`, into `d`; consumes
/// the whole reader or throws FormatError. Indices are checked against `ctx`.
void read_payload(GuardDecl& d, std::uint8_t version, Reader& r, const PayloadContext& ctx);

}  // namespace tripwire::core::codec
