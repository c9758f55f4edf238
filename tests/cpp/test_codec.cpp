// tripwire/tests/cpp/test_codec.cpp -- the serialization codec: round trips, and bad input.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>

#include "core/codec/document.hpp"
#include "core/codec/guard_records.hpp"
#include "core/codec/sha256.hpp"
#include "core/kind_data.hpp"
#include "core/program.hpp"
#include "core/shape/parser.hpp"
#include "testing.hpp"

namespace tripwire::core::codec {
namespace {

using test_util::attr;
using test_util::source;

std::string hex(const Digest& d) {
    static const char* k = "0123456789abcdef";
    std::string s;
    for (std::uint8_t b : d) {
        s += k[b >> 4];
        s += k[b & 15];
    }
    return s;
}

Digest sha(const std::string& s) { return sha256(reinterpret_cast<const std::uint8_t*>(s.data()), s.size()); }

TEST(Sha256, KnownVectors) {
    EXPECT_EQ(hex(sha("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    EXPECT_EQ(hex(sha("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    EXPECT_EQ(hex(sha("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
              "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    EXPECT_EQ(hex(sha(std::string(1000000, 'a'))),
              "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

Value str(const std::string& s) {
    Value v;
    v.tag = ValueTag::Str;
    v.bytes = s;
    return v;
}
Value integer(std::int64_t i) {
    Value v;
    v.tag = ValueTag::Int;
    v.i = i;
    return v;
}

/// A document with one guard of each stored kind on L['x'].a (constants 0 'x', 1 'a', 2 a type ref,
/// 3 an int, 4 a key tuple, 5 a range, 6 a probe ref).
Document sample() {
    Document d;
    d.tripwire_version = "0.1.0";
    d.python_major = 3;
    d.python_minor = 11;
    d.references.push_back({RefKind::Type, "builtins", "int", "fp", 0});
    d.references.push_back({RefKind::Function, "mod", "probe", "fp2", 0});
    d.constants = {str("x"), str("a"), Value{}, integer(-7), Value{}, Value{}, Value{}};
    d.constants[2].tag = ValueTag::Ref;
    d.constants[2].index = 0;
    d.constants[4].tag = ValueTag::Tuple;
    d.constants[4].items = {str("k"), integer(1)};
    d.constants[5].tag = ValueTag::Range;
    d.constants[5].items = {integer(0), integer(10), integer(2)};
    d.constants[6].tag = ValueTag::Ref;
    d.constants[6].index = 1;
    d.const_flags = {0, 0, 1, 0, 0, 0, 0};
    std::uint32_t id = 0;
    auto add = [&](GuardKind k, bool with_source = true) -> GuardDecl& {
        GuardRecord g;
        g.decl.kind = k;
        g.decl.id = id++;
        g.decl.has_source = with_source;
        if (with_source) g.decl.source = source(RootKind::Local, 0, {attr(1)});
        g.stack = {"file.py:3 in f"};
        d.guards.push_back(g);
        return d.guards.back().decl;
    };
    add(GuardKind::TypeMatch).operand = 2;
    add(GuardKind::IdMatch).operand = 2;
    add(GuardKind::None);
    add(GuardKind::NotNone);
    add(GuardKind::True);
    add(GuardKind::False);
    add(GuardKind::EqualsMatch).operand = 3;
    {
        GuardDecl& g = add(GuardKind::EqualsMatch);  // python_eq: record version 2
        g.operand = 3;
        g.flag = true;
    }
    add(GuardKind::Length).n = 4;
    GuardDecl& dk = add(GuardKind::DictKeys);
    dk.operand2 = 4;
    dk.flag = true;
    GuardDecl& dc = add(GuardKind::DictContains);
    dc.operand = 1;
    dc.flag = false;
    add(GuardKind::HasAttr).operand = 1;
    add(GuardKind::TupleIteratorLen).n = 2;
    add(GuardKind::RangeIterator).operand = 5;
    add(GuardKind::CodeMatch).operand = 2;
    add(GuardKind::WeakrefAlive);
    GuardDecl& gs = add(GuardKind::GlobalState, false);
    gs.operand = 6;
    gs.operand2 = 3;
    d.guards.back().label = "probe";
    GuardDecl& builtin = add(GuardKind::GlobalState, false);
    builtin.n = 1;
    builtin.n2 = 1;
    // The tensor kinds: plain data (core/kind_data.hpp) and, for the relational ones, more sources.
    GuardDecl& tm = add(GuardKind::TensorMatch);
    tm.operand = 2;
    tm.data = {-9223372036854775807LL - 1 + 5, 6, -1, 1, 2, kAny, 4, 8, kAny, 1};
    GuardDecl& am = add(GuardKind::ArrayMatch);
    am.operand = 2;
    am.operand2 = 1;
    am.data = {1, 5, 1, 3, 8};
    GuardDecl& dm = add(GuardKind::DimensionMarking);
    dm.operand = 3;
    dm.operand2 = 3;
    dm.flag = true;
    dm.data = {2, 0, 1, -1, 0, -1, 1, 7};
    add(GuardKind::Alias).more_sources = {source(RootKind::Local, 0)};
    add(GuardKind::NoAlias).more_sources = {source(RootKind::Local, 0), source(RootKind::Local, 1)};
    GuardDecl& so = add(GuardKind::StorageOverlapping);
    so.more_sources = {source(RootKind::Local, 0), source(RootKind::Local, 1)};
    so.n = 2;  // the first two of its three sources may overlap
    GuardDecl& ts = add(GuardKind::GlobalState, false);
    ts.n = static_cast<std::int64_t>(BuiltinProbe::TorchGlobalState);
    ts.data = {1, 1, 0, 0, 0, 0, 0, 0, 4, 6, 1, 1, 0, 0, 15};
    GuardDecl& dev = add(GuardKind::GlobalState, false);
    dev.n = static_cast<std::int64_t>(BuiltinProbe::TorchDefaultDevice);
    dev.operand2 = 1;
    GuardDecl& sc = add(GuardKind::SetContains);
    sc.operand = 3;
    sc.flag = true;
    // SHAPE (last: BadShapeRecordsAreRefused edits d.guards.back()): the relation's text and its symbols
    // (SIZE/STRIDE carry an index, STORAGE_OFFSET none), each symbol's printed source as the text names it.
    GuardDecl& shape = add(GuardKind::Shape, false);
    shape.relation = "L['c0'].size()[1] + L['c0'].stride()[0] >= L['c0'].storage_offset()";
    const std::pair<Step, const char*> symbols[] = {
        {Step{StepKind::Size, kNoConst, 1}, "L['c0'].size()[1]"},
        {Step{StepKind::Stride, kNoConst, 0}, "L['c0'].stride()[0]"},
        {Step{StepKind::StorageOffset, kNoConst, 0}, "L['c0'].storage_offset()"}};
    for (const auto& [step, text] : symbols) {
        SourcePath p = source(RootKind::Local, 0, {step});
        p.texts[1] = text;
        shape.symbols.push_back(std::make_shared<const SourcePath>(std::move(p)));
    }
    shape.symbol_types = {0, 0, 0};
    d.has_globals_module = true;
    d.globals_module = "mod";
    d.baselines.push_back({"dispatch", 3});
    d.dropped.push_back({"ID_MATCH", "L['f']", "L['f'] is <function>"});
    return d;
}

Document roundtrip(const Document& d) {
    const std::string bytes = encode(d);
    return decode(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
}

TEST(Codec, RoundTripsEveryStoredKind) {
    const Document d = sample();
    const Document e = roundtrip(d);
    ASSERT_EQ(e.guards.size(), d.guards.size());
    for (std::size_t i = 0; i < d.guards.size(); ++i) {
        const GuardDecl& a = d.guards[i].decl;
        const GuardDecl& b = e.guards[i].decl;
        EXPECT_EQ(a.kind, b.kind);
        EXPECT_EQ(a.id, b.id);
        EXPECT_EQ(a.operand, b.operand) << guard_kind_name(a.kind);
        EXPECT_EQ(a.operand2, b.operand2) << guard_kind_name(a.kind);
        EXPECT_EQ(a.n, b.n);
        EXPECT_EQ(a.n2, b.n2);
        EXPECT_EQ(a.flag, b.flag);
        EXPECT_EQ(a.has_source, b.has_source);
        EXPECT_EQ(a.source.texts, b.source.texts);
        EXPECT_EQ(a.relation, b.relation);
        EXPECT_EQ(a.symbol_types, b.symbol_types);
        ASSERT_EQ(a.symbols.size(), b.symbols.size());
        for (std::size_t k = 0; k < a.symbols.size(); ++k) {
            EXPECT_EQ(a.symbols[k]->steps, b.symbols[k]->steps);
            EXPECT_EQ(a.symbols[k]->texts, b.symbols[k]->texts);
        }
        EXPECT_EQ(a.data, b.data) << guard_kind_name(a.kind);
        ASSERT_EQ(a.more_sources.size(), b.more_sources.size()) << guard_kind_name(a.kind);
        for (std::size_t j = 0; j < a.more_sources.size(); ++j) {
            EXPECT_EQ(a.more_sources[j].root, b.more_sources[j].root);
            EXPECT_EQ(a.more_sources[j].steps, b.more_sources[j].steps);
            EXPECT_EQ(a.more_sources[j].texts, b.more_sources[j].texts);
        }
        EXPECT_EQ(d.guards[i].stack, stack_of(e, e.guards[i]));
        EXPECT_TRUE(e.guards[i].stack.empty());  // decoded into the shared table (stack_of)
        EXPECT_EQ(d.guards[i].label, e.guards[i].label);
    }
    EXPECT_EQ(e.tripwire_version, "0.1.0");
    EXPECT_EQ(e.globals_module, "mod");
    EXPECT_EQ(e.references.size(), 2u);
    EXPECT_EQ(e.references[1].qualname, "probe");
    EXPECT_EQ(e.constants[5].items[1].i, 10);
    EXPECT_EQ(e.dropped.at(0).source, "L['f']");
    EXPECT_EQ(e.baselines.at(0).name, "dispatch");
    EXPECT_EQ(encode(e), encode(d));  // canonical
    // Everything decoded compiles.
    std::vector<GuardDecl> decls;
    for (const auto& g : e.guards) decls.push_back(g.decl);
    EXPECT_NO_THROW(compile(decls, e.constants.size()));
}

/// A string table that lists every string it is given, in order (one index per call).
struct ListingTable : StringTable {
    std::vector<std::string> all;
    std::uint32_t index(const std::string& s) override {
        all.push_back(s);
        return static_cast<std::uint32_t>(all.size() - 1);
    }
};

/// A kind relating several sources (as ALIAS will) writes its others with write_source.
TEST(Codec, PayloadsCanCarryExtraSources) {
    ListingTable table;
    Writer w;
    const SourcePath src = source(RootKind::Global, 1, {attr(0), test_util::defaults(2)});
    write_source(src, w, table);
    Reader r(reinterpret_cast<const std::uint8_t*>(w.out.data()), w.out.size(), 0);
    SourcePath back;
    read_source(r, back, PayloadContext{table.all, 2});
    EXPECT_TRUE(r.at_end());
    EXPECT_EQ(back.root, RootKind::Global);
    EXPECT_EQ(back.steps, src.steps);
    EXPECT_EQ(back.texts, src.texts);
    Reader bad(reinterpret_cast<const std::uint8_t*>(w.out.data()), w.out.size(), 0);
    EXPECT_THROW(read_source(bad, back, PayloadContext{table.all, 1}), FormatError);  // constant 1 of 1
}

/// A source's texts are names: one that points at a string holding a lone surrogate (which the
/// strings section allows, for str constants and install sites) is refused at its index's offset.
TEST(Codec, SourceTextsMustBeValidText) {
    ListingTable table;
    Writer w;
    const SourcePath src = source(RootKind::Global, 1, {attr(0), test_util::defaults(2)});
    write_source(src, w, table);
    SourcePath back;
    for (std::size_t bad = 0; bad < table.all.size(); ++bad) {
        std::vector<bool> lone(table.all.size(), false);
        lone[bad] = true;
        Reader r(reinterpret_cast<const std::uint8_t*>(w.out.data()), w.out.size(), 0);
        try {
            read_source(r, back, PayloadContext{table.all, 2, &lone});
            ADD_FAILURE() << "source text " << bad << " was taken";
        } catch (const FormatError& e) {
            EXPECT_NE(std::string(e.what()).find("source text " + std::to_string(bad) +
                                                 " names a string "
                                                 "that is not valid text"),
                      std::string::npos)
                << e.what();
            EXPECT_EQ(e.offset(), w.out.size() - table.all.size() + bad);  // one-byte indices, in order
        }
    }
    std::vector<bool> none(table.all.size(), false);
    Reader r(reinterpret_cast<const std::uint8_t*>(w.out.data()), w.out.size(), 0);
    read_source(r, back, PayloadContext{table.all, 2, &none});
    EXPECT_EQ(back.texts, src.texts);
}

/// EQUALS_MATCH's python_eq flag is record version 2; version 1 stays the type-exact form.
TEST(Codec, EqualsPythonEqIsRecordVersion2) {
    GuardDecl plain;
    plain.kind = GuardKind::EqualsMatch;
    EXPECT_EQ(record_version(plain), 1);
    plain.flag = true;
    EXPECT_EQ(record_version(plain), 2);
    // sample() holds both forms: each comes back as it went in (RoundTripsEveryStoredKind
    // compares every field).
    int plain_n = 0, python_n = 0;
    for (const auto& g : roundtrip(sample()).guards) {
        if (g.decl.kind != GuardKind::EqualsMatch) continue;
        ++(g.decl.flag ? python_n : plain_n);
    }
    EXPECT_EQ(plain_n, 1);
    EXPECT_EQ(python_n, 1);
}

TEST(Codec, NeverStoredKindsAreRefused) {
    for (GuardKind k : {GuardKind::DictVersion, GuardKind::Lambda}) {
        EXPECT_EQ(record_version(k), 0);
        Document d = sample();
        d.guards.back().decl.kind = k;
        d.guards.back().decl.has_source = true;
        d.guards.back().decl.source = source(RootKind::Local, 0);
        EXPECT_THROW(encode(d), FormatError);
    }
}

std::string error_of(const std::string& bytes) {
    try {
        decode(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
    } catch (const FormatError& e) {
        return e.what();
    }
    return "";
}

/// A SHAPE record that does not hold together is refused by the decoder or by validate_decl,
/// and one whose text the compiler refuses does not compile: never a crash, never a program.
TEST(Codec, BadShapeRecordsAreRefused) {
    auto with_shape = [](auto edit) {
        Document d = sample();
        edit(d.guards.back().decl);
        return d;
    };
    // A symbol type that is neither int nor float: written as given, refused when read.
    EXPECT_NE(error_of(encode(with_shape([](GuardDecl& g) { g.symbol_types[1] = 2; }))).find("symbol type 2"),
              std::string::npos);
    // One type per symbol, or the encoder refuses (it would read past the types).
    EXPECT_THROW(encode(with_shape([](GuardDecl& g) { g.symbol_types.pop_back(); })), FormatError);
    // An empty relation.
    EXPECT_NE(error_of(encode(with_shape([](GuardDecl& g) { g.relation.clear(); }))), "");
    // A SHAPE guard with a source of its own is not a SHAPE guard.
    EXPECT_NE(error_of(encode(with_shape([](GuardDecl& g) {
                  g.has_source = true;
                  g.source = source(RootKind::Local, 0);
              }))),
              "");
    // A symbol without a source: refused by the encoder, never dereferenced.
    EXPECT_THROW(encode(with_shape([](GuardDecl& g) { g.symbols[1] = nullptr; })), FormatError);
    // Text that does not parse, names fewer symbols than are bound, names them in another order
    // or names other ones, or does not type-check: refused by the decoder, never left to compile.
    for (const char* text : {"L['c0'].size()[1] +", "L['c0'].size()[1] >= 0",
                             "L['c0'].stride()[0] + L['c0'].size()[1] >= L['c0'].storage_offset()",
                             "L['c0'].size()[1] + L['c0'].stride()[1] >= L['c0'].storage_offset()",
                             "(L['c0'].size()[1] < 2) + L['c0'].stride()[0] >= L['c0'].storage_offset()"}) {
        const std::string err = error_of(encode(with_shape([&](GuardDecl& g) { g.relation = text; })));
        EXPECT_NE(err.find("SHAPE"), std::string::npos) << text << ": " << err;
    }
    // One source, two SHAPE records, two types: refused (compile would refuse the set).
    {
        Document d = sample();
        GuardRecord g = d.guards.back();
        g.decl.id += 1;
        g.decl.symbol_types = {0, 0, 1};
        d.guards.push_back(g);
        EXPECT_NE(error_of(encode(d)).find("both an int and a float"), std::string::npos);
    }
}

/// The tensor kinds' records refuse what their readers could misread.
TEST(Codec, TensorKindRecordsAreChecked) {
    // What encoding then decoding `d` reports ("" when both succeed).
    auto outcome = [](const Document& d) -> std::string {
        try {
            return error_of(encode(d));
        } catch (const std::exception& e) {
            return e.what();
        }
    };
    {  // ALIAS with two other sources
        Document d = sample();
        for (auto& g : d.guards) {
            if (g.decl.kind == GuardKind::Alias) g.decl.more_sources.push_back(source(RootKind::Local, 1));
        }
        EXPECT_NE(outcome(d).find("ALIAS with 2 other sources"), std::string::npos);
    }
    {  // NO_ALIAS with none
        Document d = sample();
        for (auto& g : d.guards) {
            if (g.decl.kind == GuardKind::NoAlias) g.decl.more_sources.clear();
        }
        EXPECT_NE(outcome(d).find("NO_ALIAS with 0 other sources"), std::string::npos);
    }
    {  // STORAGE_OVERLAPPING with one overlapping source (never holds) or more than it has
        for (std::int64_t bad : {1, 4}) {
            Document d = sample();
            for (auto& g : d.guards) {
                if (g.decl.kind == GuardKind::StorageOverlapping) g.decl.n = bad;
            }
            EXPECT_NE(outcome(d).find("overlapping"), std::string::npos) << bad;
        }
    }
    {  // a torch probe in the form of a plain built-in probe
        Document d = sample();
        // The default-device probe (the SHAPE record comes after it in sample()).
        const auto dev = std::find_if(d.guards.begin(), d.guards.end(), [](const GuardRecord& g) {
            return g.decl.kind == GuardKind::GlobalState &&
                   g.decl.n == static_cast<std::int64_t>(BuiltinProbe::TorchDefaultDevice);
        });
        ASSERT_NE(dev, d.guards.end());
        dev->decl.n = static_cast<std::int64_t>(BuiltinProbe::GcEnabled);
        dev->decl.operand2 = kNoConst;
        EXPECT_EQ(outcome(d), "");  // gc_enabled: form 0
        dev->decl.n = static_cast<std::int64_t>(BuiltinProbe::TorchDefaultDevice);
        dev->decl.operand2 = 40;  // out of range
        EXPECT_NE(outcome(d).find("snapshot constant out of range"), std::string::npos);
    }
}

std::string body_error(const std::string& body) { return error_of(wrap_body(body, "t")); }

std::string varint_bytes(std::uint64_t v) {
    Writer w;
    w.varint(v);
    return w.out;
}

TEST(Codec, BadHeaders) {
    const std::string good = encode(sample());
    EXPECT_NE(error_of("PK\x03\x04 not us").find("wrong magic"), std::string::npos);
    EXPECT_NE(error_of(good.substr(0, 5)).find("truncated"), std::string::npos);
    std::string future = good;
    future[8] = 2;
    EXPECT_NE(error_of(future).find("format version 2 (written by tripwire 0.1.0)"), std::string::npos);
    EXPECT_NE(error_of(future).find("at byte 8"), std::string::npos);
    EXPECT_NE(error_of(good.substr(0, good.size() - 1)).find("truncated"), std::string::npos);
    EXPECT_NE(error_of(good + "x").find("body of"), std::string::npos);
    for (std::size_t i = kHeaderSize; i < good.size(); i += 7) {
        std::string flipped = good;
        flipped[i] = static_cast<char>(flipped[i] ^ 0x10);
        EXPECT_NE(error_of(flipped).find("content hash mismatch"), std::string::npos) << i;
    }
    std::string flags = good;
    flags[10] = 1;
    EXPECT_NE(error_of(flags).find("flags"), std::string::npos);
    // A version field that is not printable ASCII is refused before any message quotes it (a
    // message is text: Python decodes it as UTF-8), even in a document of another format version.
    std::string writer = future;
    writer[14] = static_cast<char>(0xCA);
    EXPECT_NE(error_of(writer).find("not printable ASCII (at byte 12)"), std::string::npos)
        << error_of(writer);
}

// The body of a document: strings, no references, `constants` (its count first), no guards.
std::string body_of(const std::vector<std::string>& strings, const std::string& constants) {
    std::string strs = varint_bytes(strings.size());
    for (const std::string& s : strings) strs += varint_bytes(s.size()) + s;
    auto section = [](char tag, const std::string& c) {
        return std::string(1, tag) + varint_bytes(c.size()) + c;
    };
    return std::string("\x03\x0b", 2) + section(1, strs) + section(2, std::string(1, '\0')) +
           section(3, constants) + section(4, std::string(1, '\0')) + section(5, std::string(4, '\0'));
}

TEST(Codec, AStringNamedOverAndOverIsRefusedBeforeItIsCopied) {
    // One string of 64 KiB named by a tuple of 32 Ki str items: 2 GiB of copies for 128 KiB of
    // input. Refused by the text budget at the index that exceeds it, not after the copies.
    const std::size_t n = 32 << 10;
    std::string items;
    for (std::size_t k = 0; k < n; ++k) items += std::string("\x07\x00", 2);
    const std::string body =
        body_of({std::string(64 << 10, 'x')}, "\x01" + std::string("\x00\x0a", 2) + varint_bytes(n) + items);
    const std::string e = body_error(body);
    EXPECT_NE(e.find("names its strings for more than 64 bytes per byte of its body"), std::string::npos)
        << e;
    // Within the budget (a few uses) it decodes.
    std::string few;
    for (int k = 0; k < 8; ++k) few += std::string("\x07\x00", 2);
    EXPECT_EQ(body_error(body_of({std::string(64 << 10, 'x')}, std::string("\x01\x00\x0a\x08", 4) + few)),
              "");
}

TEST(Codec, BadBodies) {
    // A huge declared string count with nothing behind it: refused before any allocation.
    const std::string huge = std::string("\x03\x0b\x01\x05\xff\xff\xff\xff\x0f", 9);
    const std::string e = body_error(huge);
    EXPECT_NE(e.find("declares 4294967295 items but only 0 bytes follow"), std::string::npos) << e;
    // Deep nesting: the encoder refuses to write it (and the decoder to read it: fuzz_codec).
    Document d;
    d.tripwire_version = "t";
    Value v = integer(1);
    for (int i = 0; i < 200; ++i) {
        Value t;
        t.tag = ValueTag::Tuple;
        t.items.push_back(std::move(v));
        v = std::move(t);
    }
    d.constants.push_back(v);
    d.const_flags.push_back(0);
    EXPECT_THROW(encode(d), FormatError);
    // Invalid UTF-8 in the strings table.
    Document s;
    s.tripwire_version = "t";
    s.constants.push_back(str("ok"));
    s.const_flags.push_back(0);
    std::string bytes = encode(s);
    const std::size_t at = bytes.find("ok");
    ASSERT_NE(at, std::string::npos);
    bytes[at] = static_cast<char>(0xC0);
    std::string body = bytes.substr(kHeaderSize);
    EXPECT_NE(body_error(body).find("not valid UTF-8"), std::string::npos);
    // Out-of-range indices and unknown kinds.
    Document g = sample();
    std::string ok = encode(g).substr(kHeaderSize);
    EXPECT_EQ(body_error(ok), "");
    g.guards[0].decl.operand = 99;
    EXPECT_NE(error_of(encode(g)).find("operand constant 99 is out of range"), std::string::npos);
    g = sample();
    g.references[0].kind = static_cast<RefKind>(9);
    EXPECT_NE(error_of(encode(g)).find("unknown reference kind 9"), std::string::npos);
}

// -- kinds 24 (STORAGE_OVERLAPPING) and 25 (DISPATCH_KEY_SET_MATCH): their payloads alone --------

struct PayloadTable : StringTable {
    std::vector<std::string> all;
    std::uint32_t index(const std::string& s) override {
        all.push_back(s);
        return static_cast<std::uint32_t>(all.size() - 1);
    }
};

GuardDecl storage_overlapping(std::size_t others, std::int64_t n_overlapping) {
    GuardDecl d;
    d.kind = GuardKind::StorageOverlapping;
    d.source = source(RootKind::Local, 0);
    for (std::size_t k = 0; k < others; ++k)
        d.more_sources.push_back(source(RootKind::Local, static_cast<ConstId>(k % 2), {attr(1)}));
    d.n = n_overlapping;
    return d;
}

GuardDecl dispatch_key_set_match(std::uint64_t bits) {
    GuardDecl d;
    d.kind = GuardKind::DispatchKeySetMatch;
    d.source = source(RootKind::Local, 0);
    d.n = static_cast<std::int64_t>(bits);
    return d;
}

// Read `payload` as a record of `like.kind` (version as this build writes it), against `table`
// and 2 constants.
GuardDecl read_as(const GuardDecl& like, const std::string& payload, const std::vector<std::string>& table) {
    GuardDecl d;
    d.kind = like.kind;
    Reader r(reinterpret_cast<const std::uint8_t*>(payload.data()), payload.size(), 0);
    read_payload(d, record_version(like), r, PayloadContext{table, 2});
    return d;
}

// What reading `payload` raises: FormatError's message, "" when it reads, "other" for any other
// exception (a bug: the decoder's only domain error is FormatError).
std::string payload_error(const GuardDecl& like, const std::string& payload,
                          const std::vector<std::string>& table) {
    try {
        (void)read_as(like, payload, table);
    } catch (const FormatError& e) {
        return std::string("FormatError: ") + e.what();
    } catch (...) {
        return "other";
    }
    return "";
}

TEST(CodecKinds24And25, PayloadsRoundTrip) {
    EXPECT_EQ(static_cast<int>(GuardKind::StorageOverlapping), 24);
    EXPECT_EQ(static_cast<int>(GuardKind::DispatchKeySetMatch), 25);
    std::vector<GuardDecl> decls;
    for (const auto& [others, over] :
         {std::pair<std::size_t, std::int64_t>{1, 0}, {1, 2}, {2, 0}, {2, 2}, {2, 3}, {5, 6}, {300, 4}})
        decls.push_back(storage_overlapping(others, over));
    // Any 64 bits are a key set, the top bit among them (stored as an int64, written unsigned).
    for (const std::uint64_t bits : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{0x8000'0000'0000'0000},
                                     ~std::uint64_t{0}, std::uint64_t{0x0000'4000'0020'8001}})
        decls.push_back(dispatch_key_set_match(bits));
    for (const GuardDecl& d : decls) {
        EXPECT_EQ(record_version(d), 1) << guard_kind_name(d.kind);
        PayloadTable table;
        Writer w;
        write_payload(d, w, table);
        const GuardDecl back = read_as(d, w.out, table.all);
        EXPECT_EQ(back.n, d.n) << guard_kind_name(d.kind);
        ASSERT_EQ(back.more_sources.size(), d.more_sources.size());
        for (std::size_t k = 0; k < d.more_sources.size(); ++k) {
            EXPECT_EQ(back.more_sources[k].root, d.more_sources[k].root);
            EXPECT_EQ(back.more_sources[k].name, d.more_sources[k].name);
            EXPECT_EQ(back.more_sources[k].steps, d.more_sources[k].steps);
            EXPECT_EQ(back.more_sources[k].texts, d.more_sources[k].texts);
        }
        // Canonical: the decoded record writes the same bytes.
        PayloadTable again;
        Writer w2;
        write_payload(back, w2, again);
        EXPECT_EQ(w2.out, w.out) << guard_kind_name(d.kind);
    }
}

TEST(CodecKinds24And25, TruncatedPayloadsAreFormatErrors) {
    for (const GuardDecl& d :
         {storage_overlapping(2, 2), storage_overlapping(3, 0), dispatch_key_set_match(~0ULL),
          dispatch_key_set_match(0x8000'0000'0000'0000ULL)}) {
        PayloadTable table;
        Writer w;
        write_payload(d, w, table);
        for (std::size_t len = 0; len < w.out.size(); ++len) {
            const std::string err = payload_error(d, w.out.substr(0, len), table.all);
            EXPECT_EQ(err.rfind("FormatError: ", 0), 0u)
                << guard_kind_name(d.kind) << " cut at " << len << ": " << err;
        }
        const std::string err = payload_error(d, w.out + '\x00', table.all);
        EXPECT_NE(err.find("unread bytes"), std::string::npos) << guard_kind_name(d.kind) << ": " << err;
    }
}

TEST(CodecKinds24And25, MalformedPayloadsAreFormatErrors) {
    const GuardDecl so = storage_overlapping(1, 0);
    const GuardDecl dks = dispatch_key_set_match(0);
    PayloadTable table;
    Writer one;  // one valid other source
    write_source(so.more_sources[0], one, table);
    auto varint = [](std::uint64_t v) {
        Writer w;
        w.varint(v);
        return w.out;
    };
    auto expect_error = [&](const GuardDecl& like, const std::string& payload, const char* needle) {
        const std::string err = payload_error(like, payload, table.all);
        EXPECT_NE(err.find(needle), std::string::npos) << "wanted '" << needle << "', got: " << err;
    };
    // STORAGE_OVERLAPPING: no other source, more than the limit, an overlapping count of one (it
    // could never hold) or above the number of sources, a source naming a constant out of range.
    expect_error(so, varint(0) + varint(0), "with 0 other sources");
    expect_error(so, varint(kMaxRelationalSources + 1), "other sources");
    expect_error(so, varint(~0ULL), "FormatError");  // a count no payload can hold: never allocated
    expect_error(so, varint(1) + one.out + varint(1), "bad overlapping count");
    expect_error(so, varint(1) + one.out + varint(3), "bad overlapping count");
    expect_error(so, varint(1) + one.out + varint(~0ULL), "bad overlapping count");
    EXPECT_EQ(payload_error(so, varint(1) + one.out + varint(2), table.all), "");
    {
        GuardDecl far = so;
        far.more_sources[0].name = 7;  // constant 7 of 2
        PayloadTable t;
        Writer w;
        write_payload(far, w, t);
        const std::string err = payload_error(so, w.out, t.all);
        EXPECT_EQ(err.rfind("FormatError: ", 0), 0u) << err;
    }
    // A declared count of other sources far above what the payload holds: refused before the
    // vector is sized (reserve_declared), not an allocation failure.
    expect_error(so, varint(60000) + one.out, "FormatError");
    // DISPATCH_KEY_SET_MATCH: a varint longer than 64 bits, one that never ends, an empty payload.
    expect_error(dks, std::string(10, '\xff') + '\x7f', "FormatError");
    expect_error(dks, std::string(11, '\x80'), "FormatError");
    expect_error(dks, "", "FormatError");
    expect_error(dks, varint(5) + varint(5), "unread bytes");
}

TEST(CodecKinds24And25, DocumentsRoundTripAndRefuseDamage) {
    Document d = sample();
    d.guards.clear();
    auto add = [&](GuardDecl decl) {
        decl.id = static_cast<std::uint32_t>(d.guards.size());
        decl.source.texts = {"L['c0']"};
        for (SourcePath& p : decl.more_sources) p.texts = {"L['c" + std::to_string(p.name) + "']", "x"};
        GuardRecord g;
        g.decl = std::move(decl);
        d.guards.push_back(std::move(g));
    };
    add(storage_overlapping(2, 3));
    add(storage_overlapping(1, 0));
    add(dispatch_key_set_match(0x8000'0000'0000'0001ULL));
    const std::string bytes = encode(d);
    const Document e = roundtrip(d);
    ASSERT_EQ(e.guards.size(), 3u);
    EXPECT_EQ(e.guards[0].decl.n, 3);
    EXPECT_EQ(e.guards[0].decl.more_sources.size(), 2u);
    EXPECT_EQ(static_cast<std::uint64_t>(e.guards[2].decl.n), 0x8000'0000'0000'0001ULL);
    EXPECT_EQ(encode(e), bytes);
    std::vector<GuardDecl> decls;
    for (const auto& g : e.guards) decls.push_back(g.decl);
    EXPECT_NO_THROW(compile(decls, e.constants.size()));
    // Every truncation of the file and of its body (under a valid header and hash) is refused
    // with FormatError.
    const std::string body = bytes.substr(kHeaderSize);
    for (std::size_t len = 0; len < bytes.size(); ++len) {
        try {
            (void)decode(reinterpret_cast<const std::uint8_t*>(bytes.data()), len);
            ADD_FAILURE() << "decoded a file cut at " << len;
        } catch (const FormatError&) {}
    }
    for (std::size_t len = 0; len < body.size(); ++len)
        EXPECT_NE(body_error(body.substr(0, len)), "") << "body cut at " << len;
}

TEST(Codec, RecordsNameTheirOffset) {
    Document g = sample();
    g.guards[0].decl.kind = GuardKind::Length;  // a negative length is written as a huge varint
    g.guards[0].decl.operand = kNoConst;
    g.guards[0].decl.n = -1;
    const std::string e = error_of(encode(g));
    EXPECT_NE(e.find("length out of range"), std::string::npos) << e;
    EXPECT_NE(e.find("(at byte "), std::string::npos);
}

TEST(Codec, ValidatesSurrogatesAsPythonWritesThem) {
    Document s;
    s.tripwire_version = "t";
    s.constants.push_back(str("\xed\xa0\x80"));  // U+D800, as "surrogatepass" writes it
    s.const_flags.push_back(0);
    EXPECT_EQ(roundtrip(s).constants[0].bytes, "\xed\xa0\x80");
    s.constants[0] = str("\xf4\x90\x80\x80");  // above U+10FFFF
    EXPECT_NE(error_of(encode(s)).find("UTF-8"), std::string::npos);
    s.constants[0] = str("\xe0\x80\x80");  // overlong
    EXPECT_NE(error_of(encode(s)).find("UTF-8"), std::string::npos);
}

}  // namespace
}  // namespace tripwire::core::codec
