// tripwire/cpp/core/codec/guard_records.cpp -- the per-kind payloads and their record versions.
#include "core/codec/guard_records.hpp"

#include <memory>
#include <string>

#include "core/kind_data.hpp"
#include "core/program.hpp"
#include "core/shape/parser.hpp"
#include "core/shape/program.hpp"

namespace tripwire::core::codec {
namespace {

/// A SHAPE record's relation compiles on its own with its symbols bound in the text's order, and
/// the text names exactly the stored symbols (each symbol's printed source is the text's symbol),
/// so a record decode accepts is one core::compile accepts and one that reads what it says.
void check_relation(const GuardDecl& d, Reader& r) {
    try {
        const shape::ParsedRelation parsed = shape::parse_relation(d.relation);
        if (parsed.symbols.size() != d.symbols.size()) {
            r.fail("SHAPE relation names " + std::to_string(parsed.symbols.size()) +
                   " symbols but the record binds " + std::to_string(d.symbols.size()));
        }
        shape::RelationInput in;
        for (std::size_t k = 0; k < d.symbols.size(); ++k) {
            if (d.symbols[k]->texts.back() != parsed.symbols[k]) {
                r.fail("SHAPE symbol " + std::to_string(k) + " is " + d.symbols[k]->texts.back() +
                       " but the relation names " + std::string(parsed.symbols[k]));
            }
            in.symbols.push_back(static_cast<std::uint32_t>(k));
        }
        in.text = d.relation;
        std::vector<shape::ValueType> types;
        for (std::uint8_t t : d.symbol_types) types.push_back(static_cast<shape::ValueType>(t));
        std::vector<shape::RelationInput> one;
        one.push_back(std::move(in));
        (void)shape::compile_relations(std::move(one), std::move(types));
    } catch (const std::invalid_argument& e) {  // ShapeSyntaxError, or a binding the compiler refuses
        r.fail(std::string("SHAPE relation is not valid: ") + e.what());
    }
}

// A kind's plain data (core/kind_data.hpp): a count, then each integer as a zigzag varint. The
// layout itself is checked by validate_data when the program is compiled.
void write_data(const std::vector<std::int64_t>& data, Writer& w) {
    w.varint(data.size());
    for (const std::int64_t x : data) w.zigzag(x);
}
void read_data(Reader& r, std::vector<std::int64_t>& data) {
    const std::size_t n = r.count("data length");
    data.clear();
    reserve_declared(data, n);
    for (std::size_t i = 0; i < n; ++i) data.push_back(r.zigzag("data"));
}

// An optional constant: 0 for none, else index + 1.
void write_optional(ConstId c, Writer& w) { w.varint(c == kNoConst ? 0 : static_cast<std::uint64_t>(c) + 1); }
ConstId read_optional(Reader& r, const char* what, std::size_t n_consts) {
    const std::uint64_t v = r.varint(what);
    if (v == 0) return kNoConst;
    if (v - 1 >= n_consts) r.fail(std::string(what) + " out of range");
    return static_cast<ConstId>(v - 1);
}

}  // namespace

void write_source(const SourcePath& s, Writer& w, StringTable& strings) {
    w.u8(static_cast<std::uint8_t>(s.root));
    w.varint(s.name);
    w.varint(s.steps.size());
    for (const Step& st : s.steps) {
        w.u8(static_cast<std::uint8_t>(st.kind));
        if (step_takes_operand(st.kind)) w.varint(st.operand);
        if (step_takes_index(st.kind)) w.varint(static_cast<std::uint64_t>(st.index));
    }
    for (const std::string& t : s.texts) w.varint(strings.index(t));
}

std::string not_text_reason(const char* what, std::size_t index) {
    return std::string(what) + " " + std::to_string(index) +
           " names a string that is not valid text (it holds a lone surrogate; only str constants and "
           "install sites may)";
}

const std::string& PayloadContext::text(Reader& r, const char* what) const {
    const std::size_t at = r.offset();
    const std::uint32_t i = r.index(what, strings.size());
    if (lone_surrogates != nullptr && (*lone_surrogates)[i]) r.fail_at(at, not_text_reason(what, i));
    if (budget != nullptr) budget->charge(r, at, strings[i].size());
    return strings[i];
}

void read_source(Reader& r, SourcePath& s, const PayloadContext& ctx) {
    const std::size_t at = r.offset();
    const std::uint8_t root = r.u8("root kind");
    if (root >= kRootKindCount) r.fail_at(at, "unknown root kind " + std::to_string(root));
    s.root = static_cast<RootKind>(root);
    s.name = r.index("root name constant", ctx.n_consts);
    const std::size_t depth_at = r.offset();
    const std::size_t n = r.count("source depth");
    if (n > kMaxSourceDepth) {
        r.fail_at(depth_at, "source deeper than " + std::to_string(kMaxSourceDepth) + " steps");
    }
    s.steps.clear();
    s.steps.reserve(n);  // n <= kMaxSourceDepth
    for (std::size_t k = 0; k < n; ++k) {
        const std::size_t step_at = r.offset();
        const std::uint8_t kind = r.u8("step kind");
        if (kind >= kStepKindCount) r.fail_at(step_at, "unknown step kind " + std::to_string(kind));
        Step st;
        st.kind = static_cast<StepKind>(kind);
        if (step_takes_operand(st.kind)) st.operand = r.index("step operand constant", ctx.n_consts);
        if (step_takes_index(st.kind)) {
            const std::uint64_t i = r.varint("step index");
            if (i > 0x7FFFFFFFu) r.fail_at(step_at, "step index out of range");
            st.index = static_cast<std::int64_t>(i);
        }
        s.steps.push_back(st);
    }
    s.texts.clear();
    s.texts.reserve(n + 1);
    for (std::size_t k = 0; k <= n; ++k) s.texts.push_back(ctx.text(r, "source text"));
}

std::uint8_t record_version(GuardKind k) {
    switch (k) {
#define TRIPWIRE_X(Name, value, name, source, operand, operand2, user_code, relational, implied, record, \
                   ...)                                                                                  \
    case GuardKind::Name: return record;
        TRIPWIRE_GUARD_KINDS(TRIPWIRE_X)
#undef TRIPWIRE_X
    }
    return 0;
}

std::uint8_t record_version(const GuardDecl& d) {
    return d.kind == GuardKind::EqualsMatch && d.flag ? 2 : record_version(d.kind);
}

const char* never_stored_reason(GuardKind k) {
    switch (k) {
#define TRIPWIRE_X(Name, value, name, source, operand, operand2, user_code, relational, implied, record, \
                   payload, fast, eval, load, adapter, never_stored)                                     \
    case GuardKind::Name: return never_stored;
        TRIPWIRE_GUARD_KINDS(TRIPWIRE_X)
#undef TRIPWIRE_X
    }
    return nullptr;
}

namespace {

// -- the payload codecs: the kind table's PAYLOAD column names one per kind --------------------
// Each reads exactly the fields its writer wrote, each checked (constant indices against the
// pool, flags, counts, strings); read_payload then requires the payload consumed whole.

void write_Nothing(const GuardDecl&, Writer&, StringTable&) {}
void read_Nothing(GuardDecl&, std::uint8_t, Reader&, const PayloadContext&) {}

ConstId read_constant(Reader& r, const char* what, const PayloadContext& ctx) {
    return static_cast<ConstId>(r.index(what, ctx.n_consts));
}

void write_Operand(const GuardDecl& d, Writer& w, StringTable&) { w.varint(d.operand); }
void read_Operand(GuardDecl& d, std::uint8_t, Reader& r, const PayloadContext& ctx) {
    d.operand = read_constant(r, "operand constant", ctx);
}

// EQUALS_MATCH: its constant; record version 2 adds the python_eq flag (record_version).
void write_Equals(const GuardDecl& d, Writer& w, StringTable&) {
    w.varint(d.operand);
    if (d.flag) w.u8(1);
}
void read_Equals(GuardDecl& d, std::uint8_t version, Reader& r, const PayloadContext& ctx) {
    d.operand = read_constant(r, "operand constant", ctx);
    if (version == 2) {
        if (!r.flag("python_eq flag")) r.fail("an EQUALS_MATCH record of version 2 is python_eq");
        d.flag = true;
    }
}

void write_Count(const GuardDecl& d, Writer& w, StringTable&) { w.varint(static_cast<std::uint64_t>(d.n)); }
void read_Count(GuardDecl& d, std::uint8_t, Reader& r, const PayloadContext&) {
    const std::uint64_t n = r.varint("length");
    if (n > static_cast<std::uint64_t>(INT64_MAX)) r.fail("length out of range");
    d.n = static_cast<std::int64_t>(n);
}

// The raw bits of torch's DispatchKeySet (codes of the torch build that wrote them: the file
// records that torch's version, serialization.py).
void write_KeyBits(const GuardDecl& d, Writer& w, StringTable&) { w.varint(static_cast<std::uint64_t>(d.n)); }
void read_KeyBits(GuardDecl& d, std::uint8_t, Reader& r, const PayloadContext&) {
    // Any 64 bits are a key set (the bits torch defines, and ones it does not yet use).
    d.n = static_cast<std::int64_t>(r.varint("dispatch key bits"));
}

void write_KeyTuple(const GuardDecl& d, Writer& w, StringTable&) {
    w.varint(d.operand2);
    w.u8(d.flag ? 1 : 0);
}
void read_KeyTuple(GuardDecl& d, std::uint8_t, Reader& r, const PayloadContext& ctx) {
    d.operand2 = read_constant(r, "key tuple constant", ctx);
    d.flag = r.flag("ordered flag");
}

void write_OperandFlag(const GuardDecl& d, Writer& w, StringTable&) {
    w.varint(d.operand);
    w.u8(d.flag ? 1 : 0);
}
void read_OperandFlag(GuardDecl& d, std::uint8_t, Reader& r, const PayloadContext& ctx) {
    d.operand = read_constant(r, "operand constant", ctx);
    d.flag = r.flag("present flag");
}

void write_Probe(const GuardDecl& d, Writer& w, StringTable&) {
    if (d.operand == kNoConst && builtin_probe_reads_framework(static_cast<BuiltinProbe>(d.n))) {
        // a torch probe: its id, its snapshot constant (mode stack, default device) or its
        // plain-data snapshot (torch's global state)
        w.u8(2);
        w.varint(static_cast<std::uint64_t>(d.n));
        write_optional(d.operand2, w);
        write_data(d.data, w);
    } else if (d.operand == kNoConst) {  // built-in probe: its id and the int snapshot
        w.u8(0);
        w.varint(static_cast<std::uint64_t>(d.n));
        w.zigzag(d.n2);
    } else {  // a Python probe (a reference) and its snapshot (a constant)
        w.u8(1);
        w.varint(d.operand);
        w.varint(d.operand2);
    }
}
void read_Probe(GuardDecl& d, std::uint8_t, Reader& r, const PayloadContext& ctx) {
    const std::size_t form_at = r.offset();
    const std::uint8_t form = r.u8("probe form");
    if (form == 1) {
        d.operand = read_constant(r, "probe constant", ctx);
        d.operand2 = read_constant(r, "snapshot constant", ctx);
    } else if (form == 0 || form == 2) {
        const std::uint64_t probe = r.varint("built-in probe id");
        if (probe >= static_cast<std::uint64_t>(kBuiltinProbeCount)) {
            r.fail("unknown built-in probe " + std::to_string(probe));
        }
        d.n = static_cast<std::int64_t>(probe);
        const bool torch = builtin_probe_reads_framework(static_cast<BuiltinProbe>(probe));
        if (torch != (form == 2)) {
            r.fail_at(form_at, std::string("built-in probe ") + std::to_string(probe) +
                                   (torch ? " is a torch probe: it needs form 2" : " is not a torch probe"));
        }
        if (form == 0) {
            d.n2 = r.zigzag("built-in probe snapshot");
        } else {
            d.operand2 = read_optional(r, "snapshot constant", ctx.n_consts);
            read_data(r, d.data);
        }
    } else {
        r.fail_at(form_at, "unknown probe form " + std::to_string(form));
    }
}

void write_Tensor(const GuardDecl& d, Writer& w, StringTable&) {
    w.varint(d.operand);
    write_data(d.data, w);
}
void read_Tensor(GuardDecl& d, std::uint8_t, Reader& r, const PayloadContext& ctx) {
    d.operand = read_constant(r, "type constant", ctx);
    read_data(r, d.data);
}

void write_Array(const GuardDecl& d, Writer& w, StringTable&) {
    w.varint(d.operand);
    w.varint(d.operand2);
    write_data(d.data, w);
}
void read_Array(GuardDecl& d, std::uint8_t, Reader& r, const PayloadContext& ctx) {
    d.operand = read_constant(r, "type constant", ctx);
    d.operand2 = read_constant(r, "dtype constant", ctx);
    read_data(r, d.data);
}

void write_Markings(const GuardDecl& d, Writer& w, StringTable&) {
    w.varint(d.operand);
    w.varint(d.operand2);
    w.u8(d.flag ? 1 : 0);
    write_data(d.data, w);
}
void read_Markings(GuardDecl& d, std::uint8_t, Reader& r, const PayloadContext& ctx) {
    d.operand = read_constant(r, "shape ids constant", ctx);
    d.operand2 = read_constant(r, "unbacked bounds constant", ctx);
    d.flag = r.flag("dependent flag");
    read_data(r, d.data);
}

// The other sources of a relational kind: a count, then each source. `most` bounds the count
// (ALIAS relates exactly two sources).
void write_sources(const GuardDecl& d, Writer& w, StringTable& strings) {
    w.varint(d.more_sources.size());
    for (const SourcePath& s : d.more_sources) write_source(s, w, strings);
}
void read_sources(GuardDecl& d, Reader& r, const PayloadContext& ctx, std::size_t least, std::size_t most) {
    const std::size_t count_at = r.offset();
    const std::size_t n = r.count("other sources");
    if (n < least || n > most) {
        r.fail_at(count_at,
                  std::string(guard_kind_name(d.kind)) + " with " + std::to_string(n) + " other sources");
    }
    d.more_sources.clear();
    reserve_declared(d.more_sources, n);
    for (std::size_t k = 0; k < n; ++k) read_source(r, d.more_sources.emplace_back(), ctx);
}

void write_OtherSource(const GuardDecl& d, Writer& w, StringTable& strings) { write_sources(d, w, strings); }
void read_OtherSource(GuardDecl& d, std::uint8_t, Reader& r, const PayloadContext& ctx) {
    read_sources(d, r, ctx, 1, 1);
}

void write_OtherSources(const GuardDecl& d, Writer& w, StringTable& strings) { write_sources(d, w, strings); }
void read_OtherSources(GuardDecl& d, std::uint8_t, Reader& r, const PayloadContext& ctx) {
    read_sources(d, r, ctx, 1, kMaxRelationalSources);
}

void write_Overlap(const GuardDecl& d, Writer& w, StringTable& strings) {
    write_sources(d, w, strings);
    w.varint(static_cast<std::uint64_t>(d.n));
}
void read_Overlap(GuardDecl& d, std::uint8_t, Reader& r, const PayloadContext& ctx) {
    read_sources(d, r, ctx, 1, kMaxRelationalSources);
    const std::size_t over_at = r.offset();
    const std::uint64_t over = r.varint("overlapping count");
    if (over == 1 || over > d.more_sources.size() + 1) {
        r.fail_at(over_at, std::string(guard_kind_name(d.kind)) + " with a bad overlapping count");
    }
    d.n = static_cast<std::int64_t>(over);
}

// SHAPE: the relation's text, not the compiled program: the loader parses and compiles it again
// (core::compile), so a payload can never smuggle in a program that was not checked, and a newer
// compiler's optimisations apply to old files.
void write_Relation(const GuardDecl& d, Writer& w, StringTable& strings) {
    if (d.symbols.size() != d.symbol_types.size()) {
        throw FormatError(w.out.size(), "SHAPE needs one type per symbol");
    }
    w.varint(strings.index(d.relation));
    w.varint(d.symbols.size());
    for (std::size_t k = 0; k < d.symbols.size(); ++k) {
        if (d.symbols[k] == nullptr) throw FormatError(w.out.size(), "a SHAPE symbol without a source");
        write_source(*d.symbols[k], w, strings);
        w.u8(d.symbol_types[k]);
    }
}
void read_Relation(GuardDecl& d, std::uint8_t, Reader& r, const PayloadContext& ctx) {
    const std::size_t relation_at = r.offset();
    d.relation = ctx.text(r, "relation text");
    if (ctx.budget != nullptr) ctx.budget->charge_relation(r, relation_at, d.relation.size());
    if (d.relation.empty()) r.fail("SHAPE relation text is empty");
    // Each symbol is a source (root kind, name, step count, one text) and a type byte.
    const std::size_t n = r.count("symbol count", 5);
    d.symbols.clear();
    d.symbol_types.clear();
    reserve_declared(d.symbols, n);
    reserve_declared(d.symbol_types, n);
    for (std::size_t k = 0; k < n; ++k) {
        auto sym = std::make_shared<SourcePath>();
        read_source(r, *sym, ctx);
        d.symbols.push_back(std::move(sym));
        const std::size_t at = r.offset();
        const std::uint8_t t = r.u8("symbol type");
        if (t > 1) r.fail_at(at, "symbol type " + std::to_string(t) + " is neither int (0) nor float (1)");
        d.symbol_types.push_back(t);
    }
    check_relation(d, r);
}

// The kinds whose RECORD is 0: write_payload and read_payload refuse them before their codec.
void write_Never(const GuardDecl&, Writer&, StringTable&) {}
void read_Never(GuardDecl&, std::uint8_t, Reader&, const PayloadContext&) {}

/// The newest record version a kind's codec reads: its RECORD, and EQUALS_MATCH's python_eq form
/// (read_Equals) is version 2.
std::uint8_t newest_version(GuardKind k) { return k == GuardKind::EqualsMatch ? 2 : record_version(k); }

}  // namespace

void write_payload(const GuardDecl& d, Writer& w, StringTable& strings) {
    if (const char* why = never_stored_reason(d.kind)) {
        throw FormatError(w.out.size(),
                          std::string(guard_kind_name(d.kind)) + " guards are never stored: " + why);
    }
    switch (d.kind) {
#define TRIPWIRE_X(Name, value, name, source, operand, operand2, user_code, relational, implied, record, \
                   payload, ...)                                                                         \
    case GuardKind::Name: write_##payload(d, w, strings); return;
        TRIPWIRE_GUARD_KINDS(TRIPWIRE_X)
#undef TRIPWIRE_X
    }
    throw FormatError(w.out.size(), "unknown guard kind " + std::to_string(static_cast<int>(d.kind)));
}

void read_payload(GuardDecl& d, std::uint8_t version, Reader& r, const PayloadContext& ctx) {
    const std::string name(guard_kind_name(d.kind));
    if (!guard_kind_known(d.kind)) r.fail("unknown guard kind " + std::to_string(static_cast<int>(d.kind)));
    if (const char* why = never_stored_reason(d.kind)) r.fail(name + " guards are never stored: " + why);
    if (version < 1 || version > newest_version(d.kind)) {
        r.fail(name + " record version " + std::to_string(version) + " is not one this build reads (1)");
    }
    switch (d.kind) {
#define TRIPWIRE_X(Name, value, name, source, operand, operand2, user_code, relational, implied, record, \
                   payload, ...)                                                                         \
    case GuardKind::Name: read_##payload(d, version, r, ctx); break;
        TRIPWIRE_GUARD_KINDS(TRIPWIRE_X)
#undef TRIPWIRE_X
    }
    if (!r.at_end()) r.fail(name + " payload has " + std::to_string(r.remaining()) + " unread bytes");
}

}  // namespace tripwire::core::codec
