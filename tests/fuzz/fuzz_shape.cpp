// tripwire/tests/fuzz/fuzz_shape.cpp -- libFuzzer target for the shape-relation parser and engine.
//
// The first byte picks a mode; the rest is either raw text (odd modes: the parser sees arbitrary
// bytes) or a recipe for 1 to 4 well-formed relations over int and float symbols (even modes:
// the typed compiler and both evaluators get deep inputs). The rules:
//   - parse_relation returns or throws ShapeSyntaxError with an offset inside the text; a parsed
//     tree has operands before their users, symbol spans in order, inside the text, naming the
//     symbol texts they cover; the memoised parse (parse_relation_shared) is the same tree;
//   - compile_relations returns or throws ShapeSyntaxError (a type error); a program passes
//     validate_shape;
//   - on values drawn from the input (zero, +-1, int64 extremes, ints beyond int64, NaN,
//     infinities, -0.0, subnormals), the fast path, when it decides, agrees with the exact path;
//   - a relation set compiled together agrees with each relation compiled alone, and a relation
//     it merged or dropped as implied never fails unless an earlier kept one fails too.
// Built with libFuzzer (TRIPWIRE_FUZZ, FUZZ_TARGET=fuzz_shape scripts/fuzz) or as a plain replay
// test (replay_main.cpp, ctest fuzz_shape_replay).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/program.hpp"
#include "core/shape/bigint.hpp"
#include "core/shape/parser.hpp"
#include "core/shape/program.hpp"

namespace tripwire::core::shape {
namespace {

[[noreturn]] void bug(const char* what, const std::string& detail = "") {
    std::fprintf(stderr, "fuzz_shape: %s %s\n", what, detail.c_str());
    std::abort();
}
#define CHECK(cond)                                                                      \
    do {                                                                                 \
        if (!(cond)) bug("check failed:", #cond " at line " + std::to_string(__LINE__)); \
    } while (0)

class Bytes {
  public:
    Bytes(const std::uint8_t* d, std::size_t n) : d_(d), n_(n) {}
    std::uint8_t next() { return i_ < n_ ? d_[i_++] : 0; }
    std::uint32_t below(std::uint32_t k) { return k == 0 ? 0 : next() % k; }
    bool empty() const { return i_ >= n_; }

  private:
    const std::uint8_t* d_;
    std::size_t n_;
    std::size_t i_ = 0;
};

const char* const kIntSymbols[] = {"L['a']", "L['b']", "L['x'].size()[0]", "G['g']"};
const char* const kFloatSymbols[] = {"L['s']", "L['t']"};

bool is_float_symbol(std::string_view s) { return s == "L['s']" || s == "L['t']"; }

// Well-typed relations from bytes (the engine's typing: ints, floats, comparisons).
class Gen {
  public:
    explicit Gen(Bytes& b) : b_(b) {}

    std::string int_(int d) {
        if (d <= 0 || b_.below(4) == 0) {
            if (b_.below(3) != 0) return kIntSymbols[b_.below(4)];
            static const char* const consts[] = {"0",
                                                 "1",
                                                 "2",
                                                 "3",
                                                 "4",
                                                 "7",
                                                 "16",
                                                 "9223372036854775807",
                                                 "9223372036854775808",
                                                 "18446744073709551616",
                                                 "-1",
                                                 "(-5)"};
            return consts[b_.below(12)];
        }
        switch (b_.below(11)) {
            case 0: return "(" + int_(d - 1) + " + " + int_(d - 1) + ")";
            case 1: return "(" + int_(d - 1) + " - " + int_(d - 1) + ")";
            case 2: return "(" + int_(d - 1) + " * " + int_(d - 1) + ")";
            case 3: return "(" + int_(d - 1) + " // " + int_(d - 1) + ")";
            case 4: return "(" + int_(d - 1) + " % " + int_(d - 1) + ")";
            case 5: return "(" + int_(d - 1) + " ** " + (b_.below(2) ? std::string("3") : int_(d - 1)) + ")";
            case 6:
                return std::string(b_.below(2) ? "max(" : "min(") + int_(d - 1) + ", " + int_(d - 1) + ")";
            case 7: return "abs(-" + int_(d - 1) + ")";
            case 8: {
                static const char* const fns[] = {"math.floor(", "math.ceil(", "int(", "round("};
                return fns[b_.below(4)] + float_(d - 1) + ")";
            }
            case 9: return "(" + int_(d - 1) + " if " + bool_(d - 1) + " else " + int_(d - 1) + ")";
            default: return "FloorDiv(" + int_(d - 1) + ", " + int_(d - 1) + ")";
        }
    }

    std::string float_(int d) {
        if (d <= 0 || b_.below(4) == 0) {
            if (b_.below(3) != 0) return kFloatSymbols[b_.below(2)];
            static const char* const consts[] = {"0.5",      "0.0", "1e308", "math.inf",
                                                 "math.nan", "2.5", "5e-324"};
            return consts[b_.below(7)];
        }
        switch (b_.below(8)) {
            case 0: return "(" + float_(d - 1) + " + " + int_(d - 1) + ")";
            case 1: return "(" + float_(d - 1) + " / " + float_(d - 1) + ")";
            case 2: return "(" + int_(d - 1) + " / " + int_(d - 1) + ")";
            case 3: return "(" + float_(d - 1) + " // " + float_(d - 1) + ")";
            case 4: return "(" + float_(d - 1) + " % " + int_(d - 1) + ")";
            case 5: return "float(" + int_(d - 1) + ")";
            case 6:
                return std::string(b_.below(2) ? "max(" : "min(") + float_(d - 1) + ", " + float_(d - 1) +
                       ")";
            default: return "(" + float_(d - 1) + " * " + float_(d - 1) + ")";
        }
    }

    std::string number(int d) { return b_.below(3) != 0 ? int_(d) : float_(d); }

    std::string bool_(int d) {
        static const char* const ops[] = {" == ", " != ", " < ", " <= ", " > ", " >= "};
        switch (d <= 0 ? b_.below(2) : b_.below(7)) {
            case 0: return "(" + int_(d - 1) + ops[b_.below(6)] + int_(d - 1) + ")";
            case 1:
                return "(" + number(d - 1) + ops[b_.below(6)] + number(d - 1) + ops[b_.below(6)] +
                       number(d - 1) + ")";
            case 2: return "(not math.isnan(" + number(d - 1) + "))";
            case 3: return "(" + bool_(d - 1) + (b_.below(2) ? " and " : " or ") + bool_(d - 1) + ")";
            case 4: return "Eq(Mod(" + int_(d - 1) + ", " + int_(d - 1) + "), 0)";
            case 5: return "(not " + bool_(d - 1) + ")";
            default: return "(" + number(d - 1) + ops[b_.below(6)] + number(d - 1) + ")";
        }
    }

  private:
    Bytes& b_;
};

void check_parse_tree(const std::string& text, const ParsedRelation& r) {
    CHECK(!r.nodes.empty() && r.root < r.nodes.size());
    CHECK(r.code_end <= text.size());
    for (std::size_t k = 0; k < r.nodes.size(); ++k) {
        for (std::uint32_t a : r.nodes[k].args) CHECK(a < k);  // operands before users: no cycles
        CHECK(r.nodes[k].offset <= text.size());
        if (r.nodes[k].op == Op::Symbol) CHECK(r.nodes[k].symbol < r.symbols.size());
    }
    std::uint32_t prev_end = 0;
    std::vector<bool> seen(r.symbols.size(), false);
    for (const SymbolSpan& s : r.spans) {
        CHECK(s.begin >= prev_end && s.begin < s.end && s.end <= r.code_end);
        CHECK(s.symbol < r.symbols.size());
        CHECK(text.compare(s.begin, s.end - s.begin, r.symbols[s.symbol]) == 0);
        // Symbols are numbered in order of first appearance.
        if (!seen[s.symbol]) {
            for (std::uint32_t j = 0; j < s.symbol; ++j) CHECK(seen[j]);
            seen[s.symbol] = true;
        }
        prev_end = s.end;
    }
}

// The non-recursive parser of torch's common form, when it takes a text, gives the general
// parser's parse of it (which must not refuse it).

void set_value(ShapeFrame& f, std::uint32_t sym, ValueType t, Bytes& b) {
    if (t == ValueType::Float) {
        static const double values[] = {0.0,
                                        -0.0,
                                        0.5,
                                        -1.5,
                                        3.0,
                                        1e308,
                                        -1e308,
                                        5e-324,
                                        std::numeric_limits<double>::infinity(),
                                        -std::numeric_limits<double>::infinity(),
                                        std::numeric_limits<double>::quiet_NaN(),
                                        9007199254740992.0};
        f.set_float(sym, values[b.below(12)]);
        return;
    }
    switch (b.below(6)) {
        case 0: f.set_int(sym, static_cast<std::int64_t>(b.below(9)) - 4); break;
        case 1: f.set_int(sym, b.below(2) ? INT64_MIN : INT64_MAX); break;
        case 2: f.set_int(sym, (std::int64_t{1} << 53) + static_cast<std::int64_t>(b.below(3)) - 1); break;
        case 3: {
            BigInt v = BigInt(INT64_MAX) * BigInt(static_cast<std::int64_t>(b.below(200)) - 100);
            f.set_big(sym, v + BigInt(static_cast<std::int64_t>(b.next())));
            break;
        }
        case 4: f.set_int(sym, static_cast<std::int64_t>(b.next()) * (b.below(2) ? 1 : -1)); break;
        default: {
            std::uint64_t x = 0;
            for (int k = 0; k < 8; ++k) x = (x << 8) | b.next();
            f.set_int(sym, static_cast<std::int64_t>(x));
            break;
        }
    }
}

// Parse, compile, validate and evaluate a relation set. `generated` texts are well-typed: a type
// error there is a bug; raw text may have one (with an offset inside the text).
void exercise(const std::vector<std::string>& texts, Bytes& b, bool generated) {
    // Symbols across the set: one index per distinct text, typed by its name.
    std::vector<std::string_view> names;
    std::vector<ValueType> types;
    std::vector<RelationInput> inputs;
    for (std::uint32_t k = 0; k < texts.size(); ++k) {
        ParsedRelation parsed;
        try {
            parsed = parse_relation(texts[k]);
        } catch (const ShapeSyntaxError& e) {
            CHECK(e.offset() <= texts[k].size());
            CHECK(e.what()[0] != '\0');
            return;
        }
        check_parse_tree(texts[k], parsed);
        RelationInput in;
        in.id = k * 2 + 1;
        in.text = texts[k];
        for (std::string_view s : parsed.symbols) {
            std::uint32_t i = 0;
            while (i < names.size() && names[i] != s) ++i;
            if (i == names.size()) {
                names.push_back(s);
                types.push_back(is_float_symbol(s) ? ValueType::Float : ValueType::Int);
            }
            in.symbols.push_back(i);
        }
        inputs.push_back(std::move(in));
    }
    ShapeProgram set;
    try {
        set = compile_relations(inputs, types);
    } catch (const ShapeSyntaxError& e) {
        if (generated) bug("a generated relation was refused:", e.what());
        CHECK(texts.size() == 1 && e.offset() <= texts[0].size());
        return;
    }
    validate_shape(set);
    std::vector<ShapeProgram> singles;
    for (const RelationInput& in : inputs) {
        singles.push_back(compile_relations({in}, types));
        validate_shape(singles.back());
    }
    for (int round = 0; round < 4 && !b.empty(); ++round) {
        ShapeFrame f(set);
        for (std::uint32_t s = 0; s < types.size(); ++s) set_value(f, s, types[s], b);
        const std::vector<ExactResult> exact = run_exact(set, f);
        const std::int32_t fast = run_fast(set, f);
        const std::int32_t first = first_failing(set, f);
        // The fast path decides only what the exact path decides.
        std::int32_t exact_first = -1;
        for (std::uint32_t r : set.kept) {
            if (!exact[r].holds) {
                exact_first = static_cast<std::int32_t>(r);
                break;
            }
        }
        if (fast != kShapeUndecided) CHECK(fast == (exact_first < 0 ? kShapePass : exact_first));
        CHECK(first == exact_first);
        // Each relation alone gives what the set gives, and a relation the set dropped fails only
        // when an earlier kept one fails.
        for (std::size_t k = 0; k < inputs.size(); ++k) {
            ShapeFrame g(singles[k]);
            for (std::uint32_t s = 0; s < types.size(); ++s) {
                switch (f.state(s)) {
                    case SymbolState::Small: g.set_int(s, f.regs()[s].i); break;
                    case SymbolState::Float: g.set_float(s, f.regs()[s].f); break;
                    case SymbolState::Big: g.set_big(s, *f.big(s)); break;
                    default: break;
                }
            }
            const bool alone = run_exact(singles[k], g)[0].holds;
            const ShapeRelation& rel = set.relations[k];
            if (rel.status == RelationStatus::Kept) {
                CHECK(exact[k].holds == alone);
            } else if (!alone) {
                CHECK(exact_first >= 0 && set.relations[static_cast<std::size_t>(exact_first)].id < rel.id);
            }
        }
    }
}

}  // namespace
}  // namespace tripwire::core::shape

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using tripwire::core::shape::Bytes;
    using tripwire::core::shape::check_parse_tree;
    using tripwire::core::shape::exercise;
    using tripwire::core::shape::Gen;
    using tripwire::core::shape::parse_relation;
    using tripwire::core::shape::ParsedRelation;
    using tripwire::core::shape::ShapeSyntaxError;
    if (size == 0) return 0;
    const std::uint8_t mode = data[0];
    if (mode & 1) {
        // Raw text: the parser on arbitrary bytes, then (if it parses) the rest.
        const std::size_t n = size > 2048 ? 2048 : size;
        std::string text(reinterpret_cast<const char*>(data + 1), n - 1);
        std::size_t cut = text.find('\x01');  // a separator: the bytes after it draw values
        Bytes values(data + 1 + (cut == std::string::npos ? n - 1 : cut),
                     cut == std::string::npos ? 0 : n - 1 - cut);
        if (cut != std::string::npos) text.resize(cut);
        try {
            const ParsedRelation r = parse_relation(text);
            check_parse_tree(text, r);
            // The memoised parse (shared by the builder's check and the set's compile) is the
            // same tree, with symbol views into its own copy of the text.
            const std::shared_ptr<const ParsedRelation> m =
                tripwire::core::shape::parse_relation_shared(text);
            if (m->nodes.size() != r.nodes.size() || m->root != r.root || m->code_end != r.code_end ||
                m->symbols != r.symbols || m->spans.size() != r.spans.size()) {
                std::fprintf(stderr, "fuzz_shape: the memoised parse differs\n");
                std::abort();
            }
            if ((mode & 2) != 0) tripwire::core::shape::clear_shape_memos();  // a cold path now and then
        } catch (const ShapeSyntaxError& e) {
            if (e.offset() > text.size()) std::abort();
            return 0;
        }
        // Bind every symbol as an int (floats where the name says so) and run.
        exercise({text}, values, false);
        return 0;
    }
    Bytes b(data + 1, size - 1);
    Gen gen(b);
    std::vector<std::string> texts;
    const int n = 1 + static_cast<int>(b.below(4));
    for (int k = 0; k < n; ++k) {
        if (!texts.empty() && b.below(5) == 0) {
            texts.push_back(texts[b.below(static_cast<std::uint32_t>(texts.size()))]);  // a duplicate
        } else if (b.below(4) == 0) {
            static const char* const bounds[] = {"2 <= L['a']",     "4 <= L['a']", "L['a'] <= 10",
                                                 "3 < L['a'] <= 8", "L['a'] == 5", "L['a'] >= 1",
                                                 "L['b'] < 100"};
            texts.emplace_back(bounds[b.below(7)]);  // bounds, to be merged or dropped
        } else {
            texts.push_back(gen.bool_(1 + static_cast<int>(b.below(4))));
        }
    }
    exercise(texts, b, true);
    return 0;
}
