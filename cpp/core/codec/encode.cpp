// tripwire/cpp/core/codec/encode.cpp -- writing a Document (layout: docs/format.md).
#include <algorithm>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/codec/document.hpp"
#include "core/codec/guard_records.hpp"
#include "core/codec/sha256.hpp"
#include "core/codec/wire.hpp"

namespace tripwire::core::codec {
namespace {

enum Section : std::uint8_t { kStrings = 1, kReferences = 2, kConstants = 3, kGuards = 4, kMeta = 5 };

class Encoder : public StringTable {
  public:
    std::uint32_t index(const std::string& s) override { return str(s); }

    std::uint32_t str(const std::string& s) {
        auto it = index_.find(s);
        if (it != index_.end()) return it->second;
        const auto i = static_cast<std::uint32_t>(strings_.size());
        strings_.push_back(s);
        index_.emplace(s, i);
        return i;
    }

    void value(const Value& v, Writer& w, int depth) {
        if (depth > kMaxValueDepth) throw FormatError(0, "a constant nests deeper than the format allows");
        w.u8(static_cast<std::uint8_t>(v.tag));
        switch (v.tag) {
            case ValueTag::None:
            case ValueTag::False:
            case ValueTag::True:
            case ValueTag::Ellipsis: break;
            case ValueTag::Int: w.zigzag(v.i); break;
            case ValueTag::BigInt:
                if (v.bytes.size() > kMaxBigInt)
                    throw FormatError(0, "an integer constant is too large to store");
                w.bytes(v.bytes);
                break;
            case ValueTag::Float: w.u64(bits(v.re)); break;
            case ValueTag::Complex:
                w.u64(bits(v.re));
                w.u64(bits(v.im));
                break;
            case ValueTag::Str: w.varint(str(v.bytes)); break;
            case ValueTag::Bytes: w.bytes(v.bytes); break;
            case ValueTag::Ref: w.varint(v.index); break;
            case ValueTag::Set:
            case ValueTag::FrozenSet: {
                // Sorted by encoding: a set's bytes do not depend on the process's hash seed.
                std::vector<std::string> items;
                items.reserve(v.items.size());
                for (const Value& x : v.items) {
                    Writer one;
                    value(x, one, depth + 1);
                    items.push_back(std::move(one.out));
                }
                std::sort(items.begin(), items.end());
                w.varint(items.size());
                for (const std::string& s : items) w.raw(s);
                break;
            }
            case ValueTag::Dict:
                w.varint(v.items.size() / 2);
                for (const Value& x : v.items) value(x, w, depth + 1);
                break;
            case ValueTag::Tuple:
            case ValueTag::List:
                w.varint(v.items.size());
                for (const Value& x : v.items) value(x, w, depth + 1);
                break;
            case ValueTag::Range:
            case ValueTag::Slice:
                if (v.items.size() != 3) throw FormatError(0, "range and slice constants have three parts");
                for (const Value& x : v.items) value(x, w, depth + 1);
                break;
        }
    }

    void guard(const Document& doc, const GuardRecord& g, Writer& w) {
        const GuardDecl& d = g.decl;
        w.u8(static_cast<std::uint8_t>(d.kind));
        w.u8(record_version(d));
        w.varint(d.id);
        w.u8(d.has_source ? 1 : 0);
        if (d.has_source) write_source(d.source, w, *this);
        Writer payload;
        write_payload(d, payload, *this);
        w.bytes(payload.out);
        w.varint(g.label.empty() ? 0 : std::uint64_t{str(g.label)} + 1);
        const std::vector<std::string> stack = stack_of(doc, g);  // a decoded document's too
        w.varint(stack.size());
        for (const std::string& s : stack) w.varint(str(s));
    }

    std::string strings_section() const {
        Writer w;
        w.varint(strings_.size());
        for (const std::string& s : strings_) w.bytes(s);
        return std::move(w.out);
    }

    static constexpr int kMaxValueDepth = 128;

  private:
    static std::uint64_t bits(double d) {
        std::uint64_t u;
        std::memcpy(&u, &d, sizeof u);
        return u;
    }

    std::vector<std::string> strings_;
    std::unordered_map<std::string, std::uint32_t> index_;
};

void section(Writer& body, Section tag, const std::string& content) {
    body.u8(tag);
    body.bytes(content);
}

}  // namespace

std::string wrap_body(const std::string& body, const std::string& tripwire_version) {
    if (body.size() > kMaxBody) throw FormatError(0, "the guard set is too large to store");
    if (tripwire_version.size() > kVersionField) throw FormatError(0, "tripwire version string too long");
    for (char c : tripwire_version) {
        if (c < 0x21 || c > 0x7E) throw FormatError(0, "tripwire version must be printable ASCII");
    }
    Writer w;
    for (std::uint8_t b : kMagic) w.u8(b);
    w.u16(kFormatVersion);
    w.u16(0);  // flags: none defined
    std::string version = tripwire_version;
    version.resize(kVersionField, '\0');
    w.raw(version);
    w.u32(static_cast<std::uint32_t>(body.size()));
    const Digest h = sha256(reinterpret_cast<const std::uint8_t*>(body.data()), body.size());
    w.raw(std::string_view(reinterpret_cast<const char*>(h.data()), h.size()));
    w.raw(body);
    return std::move(w.out);
}

std::string encode(const Document& doc) {
    Encoder e;
    if (doc.const_flags.size() != doc.constants.size()) throw FormatError(0, "one flag byte per constant");

    Writer refs;
    refs.varint(doc.references.size());
    for (const Reference& r : doc.references) {
        if (r.fingerprint.size() > kMaxFingerprint) throw FormatError(0, "fingerprint too long");
        refs.u8(static_cast<std::uint8_t>(r.kind));
        refs.varint(e.str(r.module));
        refs.varint(e.str(r.qualname));
        refs.bytes(r.fingerprint);
    }
    Writer consts;
    consts.varint(doc.constants.size());
    for (std::size_t i = 0; i < doc.constants.size(); ++i) {
        consts.u8(doc.const_flags[i]);
        e.value(doc.constants[i], consts, 0);
    }
    Writer guards;
    guards.varint(doc.guards.size());
    for (const GuardRecord& g : doc.guards) e.guard(doc, g, guards);
    Writer meta;
    meta.u8(doc.strict ? 1 : 0);
    meta.u8(doc.has_globals_module ? 1 : 0);
    if (doc.has_globals_module) meta.varint(e.str(doc.globals_module));
    meta.varint(doc.baselines.size());
    for (const Baseline& b : doc.baselines) {
        meta.varint(e.str(b.name));
        meta.varint(b.value);
    }
    meta.varint(doc.dropped.size());
    for (const Dropped& d : doc.dropped) {
        meta.varint(e.str(d.kind));
        meta.varint(e.str(d.source));
        meta.varint(e.str(d.description));
    }

    Writer body;
    body.u8(doc.python_major);
    body.u8(doc.python_minor);
    section(body, kStrings, e.strings_section());
    section(body, kReferences, refs.out);
    section(body, kConstants, consts.out);
    section(body, kGuards, guards.out);
    section(body, kMeta, meta.out);
    return wrap_body(body.out, doc.tripwire_version);
}

}  // namespace tripwire::core::codec
