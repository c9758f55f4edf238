// tripwire/cpp/core/codec/decode.cpp -- reading a Document from untrusted bytes.
//
// Order: header (magic, version, flags, length), content hash, then the sections in their fixed
// order, each parsed inside its declared length. Nothing is trusted before it is checked: every
// count is bounded by the bytes left, every index by the table it points into, every constant's
// depth by a limit, every declaration by core::validate_decl. The caller builds objects only from
// a Document that decode() returned.
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/codec/document.hpp"
#include "core/codec/guard_records.hpp"
#include "core/codec/sha256.hpp"
#include "core/codec/wire.hpp"
#include "core/program.hpp"

namespace tripwire::core::codec {
namespace {

constexpr int kMaxValueDepth = 128;

/// What a string of the strings section is: UTF-8 as Python's "surrogatepass" writes it
/// (well-formed sequences, shortest form, at most U+10FFFF) is Text, or Surrogates when it
/// encodes a surrogate code point (a Python str may hold one: a str constant, or a file name
/// decoded with "surrogateescape" in an install site). Anything else is Invalid.
enum class Utf8 { Invalid, Text, Surrogates };

Utf8 classify_utf8(std::string_view s) {
    bool surrogates = false;
    std::size_t i = 0;
    const auto* p = reinterpret_cast<const unsigned char*>(s.data());
    while (i < s.size()) {
        const unsigned char c = p[i];
        std::size_t n;
        std::uint32_t cp;
        if (c < 0x80) {
            ++i;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            n = 1;
            cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            n = 2;
            cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            n = 3;
            cp = c & 0x07;
        } else {
            return Utf8::Invalid;
        }
        if (i + n >= s.size()) return Utf8::Invalid;
        for (std::size_t k = 1; k <= n; ++k) {
            if (i + k >= s.size() || (p[i + k] & 0xC0) != 0x80) return Utf8::Invalid;
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        static constexpr std::uint32_t kMin[4] = {0, 0x80, 0x800, 0x10000};
        if (cp < kMin[n] || cp > 0x10FFFF) return Utf8::Invalid;
        surrogates = surrogates || (cp >= 0xD800 && cp <= 0xDFFF);
        i += n + 1;
    }
    return surrogates ? Utf8::Surrogates : Utf8::Text;
}

class Decoder {
  public:
    explicit Decoder(std::size_t body_size) : budget_(body_size) {}

    Document doc;

    void strings(Reader& r) {
        const std::size_t n = r.count("string count");
        reserve_declared(strings_, n);
        reserve_declared(lone_surrogates_, n);
        for (std::size_t i = 0; i < n; ++i) {
            const std::size_t at = r.offset();
            std::string_view s = r.bytes("string");
            const Utf8 kind = classify_utf8(s);
            if (kind == Utf8::Invalid) r.fail_at(at, "string " + std::to_string(i) + " is not valid UTF-8");
            strings_.emplace_back(s);
            lone_surrogates_.push_back(kind == Utf8::Surrogates);
        }
    }

    /// A string where a str constant's value or an install site stands: any string of the section.
    const std::string& any_str(Reader& r, const char* what) {
        const std::size_t at = r.offset();
        const std::string& s = strings_[r.index(what, strings_.size())];
        budget_.charge(r, at, s.size());
        return s;
    }
    /// A string where a name, a label or a text stands: valid text only (what an honest writer
    /// writes there), refused with the index's offset otherwise, so that no diagnostic or name
    /// lookup meets a lone surrogate after the load.
    const std::string& text(Reader& r, const char* what) { return context().text(r, what); }
    PayloadContext context() { return {strings_, doc.constants.size(), &lone_surrogates_, &budget_}; }

    std::vector<std::string> take_strings() { return std::move(strings_); }

    void references(Reader& r) {
        const std::size_t n = r.count("reference count", 4);
        reserve_declared(doc.references, n);
        for (std::size_t i = 0; i < n; ++i) {
            Reference ref;
            ref.offset = r.offset();
            const std::uint8_t kind = r.u8("reference kind");
            if (kind >= kRefKindCount)
                r.fail_at(ref.offset, "unknown reference kind " + std::to_string(kind));
            ref.kind = static_cast<RefKind>(kind);
            ref.module = text(r, "reference module string");
            ref.qualname = text(r, "reference qualname string");
            ref.fingerprint = std::string(r.bytes("fingerprint", kMaxFingerprint));
            if (ref.module.empty()) r.fail_at(ref.offset, "reference without a module name");
            if ((ref.kind == RefKind::Module) != ref.qualname.empty()) {
                r.fail_at(ref.offset, "a module reference has no qualname, every other reference has one");
            }
            doc.references.push_back(std::move(ref));
        }
    }

    Value value(Reader& r, int depth) {
        const std::size_t at = r.offset();
        if (depth > kMaxValueDepth) {
            r.fail("a constant nests deeper than " + std::to_string(kMaxValueDepth) + " levels");
        }
        const std::uint8_t tag = r.u8("value tag");
        if (tag >= kValueTagCount) r.fail_at(at, "unknown value tag " + std::to_string(tag));
        Value v;
        v.tag = static_cast<ValueTag>(tag);
        switch (v.tag) {
            case ValueTag::None:
            case ValueTag::False:
            case ValueTag::True:
            case ValueTag::Ellipsis: break;
            case ValueTag::Int: v.i = r.zigzag("int"); break;
            case ValueTag::BigInt: {
                v.bytes = std::string(r.bytes("big int", kMaxBigInt));
                const std::size_t n = v.bytes.size();
                // Canonical: longer than an int64 and no redundant sign byte.
                if (n < 9) r.fail_at(at, "big int is not in canonical form");
                const auto top = static_cast<unsigned char>(v.bytes[n - 1]);
                const auto next = static_cast<unsigned char>(v.bytes[n - 2]);
                if ((top == 0x00 && (next & 0x80) == 0) || (top == 0xFF && (next & 0x80) != 0)) {
                    r.fail_at(at, "big int is not in canonical form");
                }
                break;
            }
            case ValueTag::Float: v.re = from_bits(r.u64("float")); break;
            case ValueTag::Complex:
                v.re = from_bits(r.u64("complex"));
                v.im = from_bits(r.u64("complex"));
                break;
            case ValueTag::Str: v.bytes = any_str(r, "string"); break;
            case ValueTag::Bytes: v.bytes = std::string(r.bytes("bytes")); break;
            case ValueTag::Ref:
                v.index = r.index("reference", doc.references.size());
                // Inside a container only enum members may stand: building a set or dict hashes
                // its elements, and no other referenced object is a constant.
                if (depth > 0 && doc.references[v.index].kind != RefKind::EnumMember) {
                    r.fail_at(at, "a " + std::string(ref_kind_name(doc.references[v.index].kind)) +
                                      " reference inside a container (only enum members may be)");
                }
                break;
            case ValueTag::Tuple:
            case ValueTag::List:
            case ValueTag::Set:
            case ValueTag::FrozenSet: {
                const std::size_t n = r.count("container length");
                reserve_declared(v.items, n);
                for (std::size_t k = 0; k < n; ++k) v.items.push_back(value(r, depth + 1));
                break;
            }
            case ValueTag::Dict: {
                const std::size_t n = r.count("dict length", 2);
                reserve_declared(v.items, 2 * n);
                for (std::size_t k = 0; k < 2 * n; ++k) v.items.push_back(value(r, depth + 1));
                break;
            }
            case ValueTag::Range:
            case ValueTag::Slice:
                v.items.reserve(3);
                for (int k = 0; k < 3; ++k) {
                    const std::size_t part = r.offset();
                    v.items.push_back(value(r, depth + 1));
                    const ValueTag t = v.items.back().tag;
                    if (v.tag == ValueTag::Range && t != ValueTag::Int && t != ValueTag::BigInt) {
                        r.fail_at(part, "a range's start, stop and step are integers");
                    }
                }
                break;
        }
        return v;
    }

    void constants(Reader& r) {
        const std::size_t n = r.count("constant count", 2);
        reserve_declared(doc.constants, n);
        reserve_declared(doc.const_flags, n);
        reserve_declared(doc.const_offsets, n);
        for (std::size_t i = 0; i < n; ++i) {
            const std::size_t at = r.offset();
            const std::uint8_t flags = r.u8("constant flags");
            if (flags > 1) r.fail_at(at, "unknown constant flags " + std::to_string(flags));
            doc.const_flags.push_back(flags);
            doc.const_offsets.push_back(at);
            doc.constants.push_back(value(r, 0));
        }
    }

    void guards(Reader& r) {
        const std::size_t n_consts = doc.constants.size();
        const std::size_t n = r.count("guard count", 6);
        reserve_declared(doc.guards, n);
        for (std::size_t gi = 0; gi < n; ++gi) {
            // Read in place (a GuardRecord is large: moving one in would cost a copy's worth).
            GuardRecord& g = doc.guards.emplace_back();
            g.offset = r.offset();
            GuardDecl& d = g.decl;
            const std::uint8_t kind = r.u8("guard kind");
            if (!guard_kind_known(static_cast<GuardKind>(kind))) {
                r.fail_at(g.offset, "unknown guard kind " + std::to_string(kind) +
                                        " (written by a newer tripwire? this build knows " +
                                        std::to_string(kGuardKindCount) + " kinds)");
            }
            d.kind = static_cast<GuardKind>(kind);
            const std::uint8_t version = r.u8("record version");
            const std::uint64_t id = r.varint("guard id");
            if (id > 0xFFFFFFFFu) r.fail_at(g.offset, "guard id out of range");
            d.id = static_cast<std::uint32_t>(id);
            if (gi > 0 && d.id <= doc.guards[gi - 1].decl.id) {
                r.fail_at(g.offset, "guards are not in increasing id order (duplicate or unsorted id " +
                                        std::to_string(d.id) + ")");
            }
            const PayloadContext ctx = context();
            d.has_source = r.flag("source flag");
            if (d.has_source) read_source(r, d.source, ctx);
            std::string_view payload = r.bytes("payload");
            Reader pr(reinterpret_cast<const std::uint8_t*>(payload.data()), payload.size(),
                      r.offset() - payload.size());
            read_payload(d, version, pr, ctx);
            const std::size_t label_at = r.offset();
            const std::uint64_t label = r.varint("label");
            if (label > strings_.size()) r.fail("label string out of range");
            if (label != 0 && lone_surrogates_[label - 1])
                r.fail_at(label_at, not_text_reason("label string", label - 1));
            if (label != 0) {
                budget_.charge(r, label_at, strings_[label - 1].size());
                g.label = strings_[label - 1];
            }
            const std::size_t depth = r.count("stack depth");
            g.stack_begin = static_cast<std::uint32_t>(doc.stack_strings.size());
            g.stack_count = static_cast<std::uint32_t>(depth);
            for (std::size_t k = 0; k < depth; ++k) {
                // Not copied here, but each site becomes a str of its own on the first diagnostic.
                const std::size_t site_at = r.offset();
                const std::uint32_t site = r.index("stack string", strings_.size());
                budget_.charge(r, site_at, strings_[site].size());
                doc.stack_strings.push_back(site);
            }
            try {
                validate_decl(d, n_consts);
            } catch (const InvalidProgram& e) {
                r.fail_at(g.offset, std::string("invalid ") + std::string(guard_kind_name(d.kind)) +
                                        " guard: " + e.what());
            }
            if (d.kind == GuardKind::Shape) shape_symbol_types(d, r, g.offset);
        }
    }

    void meta(Reader& r) {
        doc.strict = r.flag("strict flag");
        doc.has_globals_module = r.flag("globals module flag");
        if (doc.has_globals_module) {
            doc.globals_module = text(r, "globals module");
            if (doc.globals_module.empty()) r.fail("empty globals module name");
        }
        const std::size_t nb = r.count("baseline count", 2);
        for (std::size_t k = 0; k < nb; ++k) {
            Baseline b;
            b.name = text(r, "baseline name");
            b.value = r.index("baseline constant", doc.constants.size());
            doc.baselines.push_back(std::move(b));
        }
        const std::size_t nd = r.count("dropped count", 3);
        for (std::size_t k = 0; k < nd; ++k) {
            Dropped d;
            d.kind = text(r, "dropped kind");
            d.source = text(r, "dropped source");
            d.description = text(r, "dropped description");
            doc.dropped.push_back(std::move(d));
        }
    }

  private:
    // A source is one symbol for the whole set (core::compile): every SHAPE record that binds it
    // must give it the same type, as compile requires.
    std::map<std::string, std::uint8_t> symbol_types_;
    void shape_symbol_types(const GuardDecl& d, Reader& r, std::size_t offset) {
        for (std::size_t k = 0; k < d.symbols.size(); ++k) {
            const SourcePath& p = *d.symbols[k];
            std::string key = std::to_string(static_cast<int>(p.root)) + ":" + std::to_string(p.name);
            for (const Step& st : p.steps) {
                key += "/" + std::to_string(static_cast<int>(st.kind)) + "," + std::to_string(st.operand) +
                       "," + std::to_string(st.index);
            }
            const auto [it, fresh] = symbol_types_.emplace(key, d.symbol_types[k]);
            if (!fresh && it->second != d.symbol_types[k]) {
                r.fail_at(offset, "SHAPE symbol " + p.texts.back() + " is declared both an int and a float");
            }
        }
    }

    static double from_bits(std::uint64_t u) {
        double d;
        std::memcpy(&d, &u, sizeof d);
        return d;
    }

    std::vector<std::string> strings_;
    std::vector<bool> lone_surrogates_;  // per string of strings_
    TextBudget budget_;
};

}  // namespace

std::string_view ref_kind_name(RefKind k) {
    switch (k) {
        case RefKind::Type: return "type";
        case RefKind::Function: return "function";
        case RefKind::Code: return "code";
        case RefKind::EnumMember: return "enum member";
        case RefKind::Object: return "object";
        case RefKind::Module: return "module";
    }
    return "unknown";
}

Document decode_body(const std::uint8_t* body, std::size_t size) {
    Reader r(body, size, kHeaderSize);
    Decoder dec(size);
    dec.doc.python_major = r.u8("python major version");
    dec.doc.python_minor = r.u8("python minor version");
    static constexpr const char* kNames[] = {"", "strings", "references", "constants", "guards", "meta"};
    for (std::uint8_t tag = 1; tag <= 5; ++tag) {
        const std::size_t at = r.offset();
        const std::uint8_t got = r.u8("section tag");
        if (got != tag) {
            r.fail_at(at, std::string("expected the ") + kNames[tag] + " section (tag " +
                              std::to_string(tag) + "), found tag " + std::to_string(got));
        }
        const std::size_t len_at = r.offset();
        const std::uint64_t len = r.varint("section length");
        if (len > r.remaining()) {
            r.fail_at(len_at, std::string("truncated: the ") + kNames[tag] + " section declares " +
                                  std::to_string(len) + " bytes but only " + std::to_string(r.remaining()) +
                                  " follow");
        }
        Reader s = r.sub(static_cast<std::size_t>(len), kNames[tag]);
        switch (tag) {
            case 1: dec.strings(s); break;
            case 2: dec.references(s); break;
            case 3: dec.constants(s); break;
            case 4: dec.guards(s); break;
            default: dec.meta(s); break;
        }
        if (!s.at_end()) {
            s.fail(std::string("the ") + kNames[tag] + " section has " + std::to_string(s.remaining()) +
                   " unread bytes");
        }
    }
    if (!r.at_end()) r.fail(std::to_string(r.remaining()) + " bytes after the last section");
    dec.doc.strings = dec.take_strings();  // the install stacks index it
    return std::move(dec.doc);
}

std::vector<std::string> stack_of(const Document& doc, const GuardRecord& g) {
    if (g.stack_count == 0) return g.stack;
    std::vector<std::string> out;
    out.reserve(g.stack_count);
    for (std::uint32_t k = g.stack_begin; k < g.stack_begin + g.stack_count; ++k)
        out.push_back(doc.strings.at(doc.stack_strings.at(k)));
    return out;
}

Document decode(const std::uint8_t* data, std::size_t size) {
    Reader h(data, size, 0);
    if (size < sizeof kMagic || std::memcmp(data, kMagic, sizeof kMagic) != 0) {
        throw FormatError(0, size < sizeof kMagic && std::memcmp(data, kMagic, size) == 0
                                 ? "truncated: the data ends inside the magic number"
                                 : "not a tripwire guard set (wrong magic number)");
    }
    h.raw(sizeof kMagic, "magic");
    const std::uint16_t version = h.u16("format version");
    const std::uint16_t flags = h.u16("flags");
    std::string writer(h.raw(kVersionField, "tripwire version"));
    writer.resize(std::strlen(writer.c_str()));
    // Before any message quotes it: a message is text (Python decodes it as UTF-8).
    for (char c : writer) {
        if (c < 0x21 || c > 0x7E) throw FormatError(12, "the tripwire version field is not printable ASCII");
    }
    if (version != kFormatVersion) {
        throw FormatError(8, "format version " + std::to_string(version) + " (written by tripwire " + writer +
                                 ") is not one this build reads (" + std::to_string(kFormatVersion) + ")" +
                                 (version > kFormatVersion ? ": it is newer" : ""));
    }
    if (flags != 0) throw FormatError(10, "unknown header flags " + std::to_string(flags));
    const std::uint32_t body_len = h.u32("body length");
    const std::string_view digest = h.raw(32, "content hash");
    if (body_len > kMaxBody)
        throw FormatError(28, "body length " + std::to_string(body_len) + " is over the limit");
    if (h.remaining() != body_len) {
        throw FormatError(28, (h.remaining() < body_len ? std::string("truncated: ") : std::string()) +
                                  "the header declares a body of " + std::to_string(body_len) + " bytes, " +
                                  std::to_string(h.remaining()) + " are present");
    }
    const Digest actual = sha256(data + kHeaderSize, body_len);
    if (std::memcmp(actual.data(), digest.data(), actual.size()) != 0) {
        throw FormatError(32, "content hash mismatch: the data is corrupt (a changed or torn byte)");
    }
    Document doc = decode_body(data + kHeaderSize, body_len);
    doc.tripwire_version = std::move(writer);
    return doc;
}

}  // namespace tripwire::core::codec
