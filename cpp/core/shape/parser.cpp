// tripwire/cpp/core/shape/parser.cpp -- recursive-descent parser of shape relations.
//
// Precedence and associativity are Python's (lowest first): `x if c else y`, `or`, `and`, `not`,
// comparisons (chained: `a <= b <= c` is `a <= b and b <= c` with `b` evaluated once), `+ -`,
// `* / // %`, unary `- +`, `**` (right-associative, binding tighter than a unary minus on its
// left: `-a ** 2` is `-(a ** 2)`).
#include "core/shape/parser.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

namespace tripwire::core::shape {
namespace {

bool is_ident_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_ident_char(char c) { return is_ident_start(c) || (c >= '0' && c <= '9'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_space(char c) { return is_blank(c); }

// Distinct symbols symbol_node finds by a scan; beyond, by a table.
constexpr std::size_t kScannedSymbols = 16;

struct Function {
    std::string_view name;
    Op op;
    int min_args, max_args;  // max_args < 0: no limit (up to kMaxArgs)
    bool int_only;           // IntTrueDiv: both operands must be ints
};

// Calls the syntax knows. Python spellings (what torch's printer emits) and sympy names.
constexpr Function kFunctions[] = {
    {"abs", Op::Abs, 1, 1, false},
    {"Abs", Op::Abs, 1, 1, false},
    {"float", Op::ToFloat, 1, 1, false},
    {"torch.sym_float", Op::ToFloat, 1, 1, false},
    {"ToFloat", Op::ToFloat, 1, 1, false},
    {"int", Op::Trunc, 1, 1, false},
    {"math.trunc", Op::Trunc, 1, 1, false},
    {"TruncToInt", Op::Trunc, 1, 1, false},
    {"math.floor", Op::Floor, 1, 1, false},
    {"FloorToInt", Op::Floor, 1, 1, false},
    {"floor", Op::Floor, 1, 1, false},
    {"math.ceil", Op::Ceil, 1, 1, false},
    {"CeilToInt", Op::Ceil, 1, 1, false},
    {"ceiling", Op::Ceil, 1, 1, false},
    {"round", Op::Round, 1, 1, false},
    {"RoundToInt", Op::Round, 1, 1, false},
    {"math.isnan", Op::IsNan, 1, 1, false},
    {"Not", Op::Not, 1, 1, false},
    {"Eq", Op::Eq, 2, 2, false},
    {"Ne", Op::Ne, 2, 2, false},
    {"Lt", Op::Lt, 2, 2, false},
    {"Le", Op::Le, 2, 2, false},
    {"Gt", Op::Gt, 2, 2, false},
    {"Ge", Op::Ge, 2, 2, false},
    {"Mod", Op::Mod, 2, 2, false},
    {"PythonMod", Op::Mod, 2, 2, false},
    {"FloorDiv", Op::FloorDiv, 2, 2, false},
    {"CleanDiv", Op::FloorDiv, 2, 2, false},
    {"PowByNatural", Op::Pow, 2, 2, false},
    {"Pow", Op::Pow, 2, 2, false},
    {"IntTrueDiv", Op::TrueDiv, 2, 2, true},
    {"FloatTrueDiv", Op::TrueDiv, 2, 2, false},
    {"min", Op::Min, 2, -1, false},
    {"max", Op::Max, 2, -1, false},
    {"Min", Op::Min, 2, -1, false},
    {"Max", Op::Max, 2, -1, false},
    {"And", Op::And, 1, -1, false},
    {"Or", Op::Or, 1, -1, false},
    {"Add", Op::Add, 1, -1, false},
    {"Mul", Op::Mul, 1, -1, false},
};

// Most operands a variadic call takes: keeps every chain built from it short.
constexpr int kMaxArgs = 64;

class Parser {
  public:
    // Parses into `out`, a new ParsedRelation.
    Parser(std::string_view text, ParsedRelation& out) : s_(text), out_(out) {}

    void run() {
        skip_space();
        if (at_end()) fail(pos_, "empty relation");
        out_.root = expr();
        skip_space();
        if (!at_end()) fail(pos_, "unexpected " + describe_here());
        // The code ends before the comment and the blanks in front of it.
        std::size_t end = pos_;
        while (end > 0 && is_space(s_[end - 1])) --end;
        out_.code_end = end;
    }

  private:
    [[noreturn]] static void fail(std::size_t at, const std::string& why) { throw ShapeSyntaxError(at, why); }

    // "end of the text" also at a '#': what follows is a comment.
    bool at_end() const { return pos_ >= s_.size() || s_[pos_] == '#'; }
    char peek(std::size_t k = 0) const { return pos_ + k < s_.size() ? s_[pos_ + k] : '\0'; }
    void skip_space() {
        while (pos_ < s_.size() && is_space(s_[pos_])) ++pos_;
    }

    std::string describe_here() const {
        if (pos_ >= s_.size()) return "end of text";
        const char c = s_[pos_];
        if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7F) {
            return "byte 0x" +
                   std::string(1, "0123456789abcdef"[(static_cast<unsigned char>(c) >> 4) & 0xF]) +
                   std::string(1, "0123456789abcdef"[static_cast<unsigned char>(c) & 0xF]);
        }
        if (is_ident_start(c)) {
            std::size_t e = pos_;
            while (e < s_.size() && is_ident_char(s_[e])) ++e;
            return "'" + std::string(s_.substr(pos_, e - pos_)) + "'";
        }
        return "'" + std::string(1, c) + "'";
    }

    // Nesting guard: every recursion of the grammar goes through one of these.
    struct Nest {
        Parser& p;
        Nest(Parser& parser, std::size_t at) : p(parser) {
            if (++p.depth_ > kMaxNesting)
                fail(at, "expression nested more than " + std::to_string(kMaxNesting) + " levels deep");
        }
        ~Nest() { --p.depth_; }
        Nest(const Nest&) = delete;
        Nest& operator=(const Nest&) = delete;
    };

    std::uint32_t add(const AstNode& n) {
        out_.nodes.push_back(n);
        return static_cast<std::uint32_t>(out_.nodes.size() - 1);
    }
    // A node made in place at the end of the tree.
    AstNode& fresh(Op op, std::size_t at) {
        out_.nodes.push_back(AstNode{});  // inlined when there is room (emplace_back() is a call)
        AstNode& n = out_.nodes.back();
        n.op = op;
        n.offset = static_cast<std::uint32_t>(at);
        return n;
    }
    std::uint32_t last() const { return static_cast<std::uint32_t>(out_.nodes.size() - 1); }
    std::uint32_t node(Op op, std::size_t at, std::initializer_list<std::uint32_t> args) {
        AstNode& n = fresh(op, at);
        for (std::uint32_t a : args) n.args.v[n.args.n++] = a;
        return last();
    }

    // Whether `tok` is at the current position: a byte loop the compiler unrolls for the short
    // literals asked for (no memcmp call per operand).
    bool at(std::string_view tok) const {
        if (pos_ > s_.size() || s_.size() - pos_ < tok.size()) return false;
        for (std::size_t k = 0; k < tok.size(); ++k)
            if (s_[pos_ + k] != tok[k]) return false;
        return true;
    }
    // A keyword (not followed by an identifier character) at the current position.
    bool at_keyword(std::string_view kw) const {
        if (!at(kw)) return false;
        const std::size_t e = pos_ + kw.size();
        return e >= s_.size() || !is_ident_char(s_[e]);
    }
    bool eat_keyword(std::string_view kw) {
        skip_space();
        if (!at_keyword(kw)) return false;
        pos_ += kw.size();
        return true;
    }
    void expect(char c, std::size_t opened_at) {
        skip_space();
        if (peek() != c) {
            fail(pos_, std::string("expected '") + c + "' (opened at offset " + std::to_string(opened_at) +
                           "), found " + describe_here());
        }
        ++pos_;
    }

    // expr := or_expr ['if' or_expr 'else' expr]
    std::uint32_t expr() {
        const Nest nest(*this, pos_);
        skip_space();
        const std::size_t at = pos_;
        const std::uint32_t then = binary(kOrLevel);
        if (!eat_keyword("if")) return then;
        const std::uint32_t cond = binary(kOrLevel);
        if (!eat_keyword("else")) fail(pos_, "expected 'else' after 'if', found " + describe_here());
        const std::uint32_t otherwise = expr();
        return node(Op::Select, at, {cond, then, otherwise});
    }

    // The binary levels, loosest first: `or`, `and`, `not` (a prefix), comparisons, `+ -`,
    // `* / // %`. One precedence-climbing loop parses them (what a function per level, each
    // calling the next, parses: the same tree, nodes made in the same order, the same errors),
    // so an operand costs one call rather than one per level.
    enum Level : int { kOrLevel, kAndLevel, kNotLevel, kCompareLevel, kArithLevel, kTermLevel };

    // The binary operator at the current position (after blanks): its operation, level and width.
    bool binary_op(Op& op, int& level, std::size_t& width) {
        skip_space();
        const char c = peek(), d = peek(1);
        width = 1;
        switch (c) {
            case 'o':
                if (!at_keyword("or")) return false;
                op = Op::Or, level = kOrLevel, width = 2;
                return true;
            case 'a':
                if (!at_keyword("and")) return false;
                op = Op::And, level = kAndLevel, width = 3;
                return true;
            case '=':
            case '!':
                if (d != '=') return false;
                op = c == '=' ? Op::Eq : Op::Ne, level = kCompareLevel, width = 2;
                return true;
            case '<':
            case '>':
                if (d == c) return false;  // `<<` and `>>` are not comparisons
                width = d == '=' ? 2 : 1;
                op = c == '<' ? (width == 2 ? Op::Le : Op::Lt) : (width == 2 ? Op::Ge : Op::Gt);
                level = kCompareLevel;
                return true;
            case '+':
            case '-': op = c == '+' ? Op::Add : Op::Sub, level = kArithLevel; return true;
            case '*':
                if (d == '*') return false;  // `**`: power() takes it
                op = Op::Mul, level = kTermLevel;
                return true;
            case '/':
                op = d == '/' ? Op::FloorDiv : Op::TrueDiv, level = kTermLevel, width = d == '/' ? 2 : 1;
                return true;
            case '%': op = Op::Mod, level = kTermLevel; return true;
            default: return false;
        }
    }

    // An expression of the binary levels from `min_level` on (`or` chains from kOrLevel). Binary
    // operations carry the offset of their operator (where a type error points).
    std::uint32_t binary(int min_level) {
        std::uint32_t left = 0;
        skip_space();
        const std::size_t not_at = pos_;
        if (min_level <= kNotLevel && eat_keyword("not")) {
            const Nest nest(*this, not_at);
            left = node(Op::Not, not_at, {binary(kNotLevel)});
        } else {
            left = unary();
        }
        Op op = Op::Add;
        int level = 0;
        std::size_t width = 1;
        // Every operator of a level above the one just parsed was taken by the call that parsed
        // its right operand: the next one is of a level at most that one's.
        while (binary_op(op, level, width) && level >= min_level) {
            const std::size_t at = pos_;
            pos_ += width;
            if (level != kCompareLevel) {
                // Left-associative: the right operand is of the levels above.
                left = node(op, at, {left, binary(level + 1)});
                continue;
            }
            // Chained: `a < b < c` is `a < b and b < c`, `b` shared (evaluated once, as in Python).
            std::uint32_t result = 0;
            int count = 0;
            for (;;) {
                const std::size_t cmp_at = pos_ - width;
                if (++count > kMaxArgs)
                    fail(cmp_at, "comparison chain longer than " + std::to_string(kMaxArgs));
                const std::uint32_t right = binary(kArithLevel);
                const std::uint32_t cmp = node(op, cmp_at, {left, right});
                result = count > 1 ? node(Op::And, cmp_at, {result, cmp}) : cmp;
                left = right;
                if (!binary_op(op, level, width) || level != kCompareLevel) break;
                pos_ += width;
            }
            left = result;
        }
        return left;
    }

    std::uint32_t unary() {
        skip_space();
        const std::size_t at = pos_;
        const Nest nest(*this, at);
        if (peek() == '-') {
            ++pos_;
            return node(Op::Neg, at, {unary()});
        }
        if (peek() == '+') {
            ++pos_;
            return unary();  // +x is x for ints and floats
        }
        return power();
    }

    std::uint32_t power() {
        const std::uint32_t base = atom();
        skip_space();
        const std::size_t at = pos_;
        if (peek() == '*' && peek(1) == '*') {
            pos_ += 2;
            return node(Op::Pow, at, {base, unary()});  // right operand: a unary (Python's grammar)
        }
        return base;
    }

    // A dotted name (`math.floor`) at the current position; empty when there is none.
    std::string_view dotted_name() {
        std::size_t e = pos_;
        while (e < s_.size() && is_ident_char(s_[e])) ++e;
        while (e + 1 < s_.size() && s_[e] == '.' && is_ident_start(s_[e + 1])) {
            ++e;
            while (e < s_.size() && is_ident_char(s_[e])) ++e;
        }
        return s_.substr(pos_, e - pos_);
    }

    // Skip a quoted string starting at `i` (a quote); returns the index after its closing quote.
    std::size_t skip_string(std::size_t i) const {
        const char q = s_[i];
        for (std::size_t j = i + 1; j < s_.size(); ++j) {
            if (s_[j] == '\\') {
                ++j;
                continue;
            }
            if (s_[j] == q) return j + 1;
            if (s_[j] == '\n') break;
        }
        fail(i, "unterminated string");
    }

    // The index after the group opening at `i` when it is one of the groups of printed sources,
    // `()`, `[digits]` or `['chars']` (no quote, backslash or newline inside): where skip_group's
    // general scan ends for them. 0 for any other group (the general scan then reads it).
    std::size_t skip_simple_group(std::size_t i) const {
        const std::size_t n = s_.size();
        if (s_[i] == '(') return i + 1 < n && s_[i + 1] == ')' ? i + 2 : 0;
        if (s_[i] != '[' || i + 1 >= n) return 0;
        std::size_t j = i + 1;
        if (s_[j] == '\'') {
            for (++j; j < n && s_[j] != '\'' && s_[j] != '\\' && s_[j] != '\n'; ++j) {}
            if (j >= n || s_[j] != '\'') return 0;
            ++j;
        } else {
            while (j < n && is_digit(s_[j])) ++j;
        }
        return j < n && s_[j] == ']' ? j + 1 : 0;
    }

    // A balanced bracket group opening at `i`; returns the index after its closer.
    std::size_t skip_group(std::size_t i) const {
        const std::size_t simple = skip_simple_group(i);
        return simple != 0 ? simple : skip_any_group(i);
    }

    // skip_group's general scan, out of line: its stack of closers is no cost to the simple groups.
    [[gnu::noinline]] std::size_t skip_any_group(std::size_t i) const {
        // The closers expected, innermost last: a fixed stack (the nesting is bounded), no allocation.
        char closers[kMaxNesting];
        std::size_t depth = 0;
        for (std::size_t j = i; j < s_.size();) {
            const char c = s_[j];
            if (c == '\'' || c == '"') {
                j = skip_string(j);
                continue;
            }
            if (c == '(' || c == '[' || c == '{') {
                if (depth >= static_cast<std::size_t>(kMaxNesting))
                    fail(j, "source nested more than " + std::to_string(kMaxNesting) + " levels deep");
                closers[depth++] = c == '(' ? ')' : c == '[' ? ']' : '}';
            } else if (c == ')' || c == ']' || c == '}') {
                if (depth == 0 || closers[depth - 1] != c) fail(j, std::string("unmatched '") + c + "'");
                if (--depth == 0) return j + 1;
            } else if (c == '#') {
                fail(j, "'#' inside a source");
            }
            ++j;
        }
        fail(i, std::string("unclosed '") + s_[i] + "'");
    }

    // A source: a root (`L[...]`, `G[...]`, `C[...]`, or a call such as `getattr(...)` that the
    // source syntax starts with) followed by any chain of `.name`, `[...]` and `(...)`.
    std::uint32_t source(std::size_t begin, std::size_t root_end) {
        std::size_t end = root_end;
        for (;;) {
            std::size_t j = end;
            while (j < s_.size() && is_space(s_[j])) ++j;
            if (j < s_.size() && s_[j] == '.' && j + 1 < s_.size() && is_ident_start(s_[j + 1])) {
                j += 2;
                while (j < s_.size() && is_ident_char(s_[j])) ++j;
                end = j;
            } else if (j < s_.size() && (s_[j] == '[' || s_[j] == '(')) {
                end = skip_group(j);
            } else {
                break;
            }
        }
        pos_ = end;
        return symbol_node(begin, end);
    }

    // The Symbol node of the source text from `begin` to `end`: its symbol (distinct texts, in
    // order of first appearance) and its span recorded.
    std::uint32_t symbol_node(std::size_t begin, std::size_t end) {
        const std::string_view text = s_.substr(begin, end - begin);
        std::uint32_t sym = 0;
        if (out_.symbols.size() <= kScannedSymbols) {
            // A relation names a few symbols: a scan, no table.
            while (sym < out_.symbols.size() && out_.symbols[sym] != text) ++sym;
        } else {
            // Many symbols (a hostile text: `L['a0'] + L['a1'] + ...`): a scan per occurrence would
            // make the parse quadratic in the text, so they are found through a table from here on.
            if (symbol_index_.empty()) {
                for (std::uint32_t k = 0; k < out_.symbols.size(); ++k)
                    symbol_index_.emplace(out_.symbols[k], k);
            }
            const auto [it, added] =
                symbol_index_.emplace(text, static_cast<std::uint32_t>(out_.symbols.size()));
            sym = it->second;
            (void)added;
        }
        if (sym == out_.symbols.size()) out_.symbols.push_back(text);
        out_.spans.push_back({static_cast<std::uint32_t>(begin), static_cast<std::uint32_t>(end), sym});

        fresh(Op::Symbol, begin).symbol = sym;
        return last();
    }

    std::uint32_t number() {
        const std::size_t at = pos_;
        std::size_t e = pos_;
        bool is_float = false;
        while (e < s_.size() && is_digit(s_[e])) ++e;
        if (e < s_.size() && s_[e] == '.') {
            is_float = true;
            ++e;
            while (e < s_.size() && is_digit(s_[e])) ++e;
        }
        if (e < s_.size() && (s_[e] == 'e' || s_[e] == 'E')) {
            std::size_t k = e + 1;
            if (k < s_.size() && (s_[k] == '+' || s_[k] == '-')) ++k;
            if (k >= s_.size() || !is_digit(s_[k])) fail(e, "malformed exponent");
            while (k < s_.size() && is_digit(s_[k])) ++k;
            e = k;
            is_float = true;
        }
        if (e < s_.size() && (is_ident_char(s_[e]) || s_[e] == '.'))
            fail(e, "malformed number (tripwire reads decimal ints and floats only)");
        const std::string_view lit = s_.substr(at, e - at);
        if (lit == ".") fail(at, "unexpected '.'");
        pos_ = e;
        AstNode n;
        n.offset = static_cast<std::uint32_t>(at);
        if (!is_float) {
            // Python refuses leading zeros in a non-zero decimal literal.
            if (lit.size() > 1 && lit[0] == '0' && lit.find_first_not_of('0') != std::string_view::npos)
                fail(at, "leading zeros in an int literal");
            n.op = Op::IntConst;
            // Over kMaxIntLiteralDigits digits (no leading zero: refused above) is over the limit,
            // whose message program.cpp gives a literal just over it.
            if (lit.size() > kMaxIntLiteralDigits && lit[0] != '0')
                fail(at, "int literal over " + std::to_string(kMaxIntBits) + " bits");
            const auto r = std::from_chars(lit.data(), lit.data() + lit.size(), n.int_small);
            if (r.ec != std::errc() || r.ptr != lit.data() + lit.size()) {
                // Beyond int64: an exact big literal, kept beside the tree.
                n.int_small = 0;
                BigInt big;
                if (!BigInt::from_decimal(lit, big)) fail(at, "malformed int literal");
                out_.big_ints.push_back(std::move(big));
                n.big_int = static_cast<std::uint32_t>(out_.big_ints.size());
            }
            return add(n);
        }
        n.op = Op::FloatConst;
        double v = 0;
        const auto r = std::from_chars(lit.data(), lit.data() + lit.size(), v, std::chars_format::general);
        if (r.ec == std::errc::result_out_of_range) {
            // Python rounds an overflowing literal to inf and an underflowing one to 0.0.
            const std::size_t epos = lit.find_first_of("eE");
            const bool neg_exp =
                epos != std::string_view::npos && epos + 1 < lit.size() && lit[epos + 1] == '-';
            v = neg_exp ? 0.0 : std::numeric_limits<double>::infinity();
        } else if (r.ec != std::errc() || r.ptr != lit.data() + lit.size()) {
            fail(at, "malformed float literal");
        }
        n.float_value = v;
        return add(n);
    }

    std::uint32_t call(const Function& f, std::size_t at) {
        const std::size_t open = pos_;
        ++pos_;  // '('
        std::vector<std::uint32_t> args;
        skip_space();
        if (peek() != ')') {
            for (;;) {
                if (static_cast<int>(args.size()) >= kMaxArgs) {
                    fail(pos_,
                         std::string(f.name) + "() takes at most " + std::to_string(kMaxArgs) + " arguments");
                }
                args.push_back(expr());
                skip_space();
                if (peek() == ',') {
                    ++pos_;
                    skip_space();
                    if (peek() == ')') break;  // trailing comma
                    continue;
                }
                break;
            }
        }
        expect(')', open);
        const int n = static_cast<int>(args.size());
        if (n < f.min_args || (f.max_args >= 0 && n > f.max_args)) {
            std::string want = std::to_string(f.min_args);
            if (f.max_args < 0) {
                want = "at least " + want;
            } else if (f.max_args != f.min_args) {
                want += " to " + std::to_string(f.max_args);
            }
            fail(at, std::string(f.name) + "() takes " + want + " argument" +
                         (f.min_args == 1 && f.max_args == 1 ? "" : "s") + ", got " + std::to_string(n));
        }
        if (n == 1 && (f.op == Op::And || f.op == Op::Or || f.op == Op::Add || f.op == Op::Mul))
            return args[0];
        // Variadic operations become left-to-right chains of binary ones, as Python evaluates
        // min/max (the first of equal values wins) and sympy's Add/Mul/And/Or.
        if (n > 2 || ((f.op == Op::Min || f.op == Op::Max || f.op == Op::And || f.op == Op::Or ||
                       f.op == Op::Add || f.op == Op::Mul) &&
                      n == 2)) {
            std::uint32_t left = args[0];
            for (int k = 1; k < n; ++k) left = node(f.op, at, {left, args[static_cast<std::size_t>(k)]});
            return left;
        }
        AstNode nd;
        nd.op = f.op;
        nd.offset = static_cast<std::uint32_t>(at);
        for (std::uint32_t a : args) nd.args.v[nd.args.n++] = a;  // at most 2 here
        nd.bool_value = f.int_only;  // IntTrueDiv: the type checker insists on ints
        return add(nd);
    }

    std::uint32_t atom() {
        skip_space();
        const std::size_t at = pos_;
        if (at_end()) {
            fail(pos_, "expected an operand, found " +
                           std::string(pos_ >= s_.size() ? "end of text" : "a comment"));
        }
        const char c = peek();
        if (c == '(') {
            ++pos_;
            const std::uint32_t inner = expr();
            expect(')', at);
            return inner;
        }
        if (is_digit(c) || (c == '.' && is_digit(peek(1)))) return number();
        if (!is_ident_start(c)) fail(pos_, "unexpected " + describe_here());
        // Source roots: L[...], G[...], C[...].
        if ((c == 'L' || c == 'G' || c == 'C') && !is_ident_char(peek(1))) {
            std::size_t j = pos_ + 1;
            while (j < s_.size() && is_space(s_[j])) ++j;
            if (j < s_.size() && s_[j] == '[') return source(at, skip_group(j));
        }
        const std::string_view name = dotted_name();
        std::size_t after = pos_ + name.size();
        while (after < s_.size() && is_space(s_[after])) ++after;
        const bool called = after < s_.size() && s_[after] == '(';
        if (called) {
            // Sources that start with a call (docs/guards.md, Sources).
            if (name == "getattr" || name == "type" || name == "list" || name == "dict.__getitem__")
                return source(at, skip_group(after));
            for (const Function& f : kFunctions) {
                if (f.name == name) {
                    pos_ = after;
                    return call(f, at);
                }
            }
            fail(at, "unknown function '" + std::string(name) + "'");
        }
        if (name == "True" || name == "False") {
            pos_ += name.size();
            AstNode n;
            n.op = Op::BoolConst;
            n.offset = static_cast<std::uint32_t>(at);
            n.bool_value = name == "True";
            return add(n);
        }
        if (name == "math.inf" || name == "math.nan") {
            pos_ += name.size();
            AstNode n;
            n.op = Op::FloatConst;
            n.offset = static_cast<std::uint32_t>(at);
            n.float_value = name == "math.inf" ? std::numeric_limits<double>::infinity()
                                               : std::numeric_limits<double>::quiet_NaN();
            return add(n);
        }
        if (name == "and" || name == "or" || name == "not" || name == "if" || name == "else")
            fail(at, "expected an operand, found '" + std::string(name) + "'");
        fail(at, "unknown name '" + std::string(name) +
                     "' (a symbol is a source such as L['x'].size()[0] or L['n'])");
    }

    std::string_view s_;
    std::size_t pos_ = 0;
    int depth_ = 0;
    ParsedRelation& out_;
    std::unordered_map<std::string_view, std::uint32_t> symbol_index_;  // symbol_node beyond kScannedSymbols
};

}  // namespace

ParsedRelation parse_relation(std::string_view text) {
    ParsedRelation out;
    Parser(text, out).run();
    return out;
}

namespace {

// One memoised parse: its own copy of the text, which the tree's symbol views point into (the
// entry is made by make_shared and never moves).
struct ParseMemoEntry {
    explicit ParseMemoEntry(std::string_view code) : text(code), parsed(parse_relation(text)) {}
    ParseMemoEntry(const ParseMemoEntry&) = delete;
    ParseMemoEntry& operator=(const ParseMemoEntry&) = delete;

    const std::string text;
    const ParsedRelation parsed;
};

std::mutex g_parse_memo_mutex;
std::unordered_map<std::string_view, std::shared_ptr<const ParseMemoEntry>>& parse_memo() {
    static auto* memo = new std::unordered_map<std::string_view, std::shared_ptr<const ParseMemoEntry>>();
    return *memo;  // never destroyed: no order-of-destruction question at exit
}

}  // namespace

std::shared_ptr<const ParsedRelation> parse_relation_shared(std::string_view text) {
    {
        const std::lock_guard<std::mutex> lock(g_parse_memo_mutex);
        auto it = parse_memo().find(text);
        if (it != parse_memo().end()) return {it->second, &it->second->parsed};
    }
    // Parsed outside the lock (another thread may parse the same text: both parses are equal).
    std::shared_ptr<const ParseMemoEntry> entry = std::make_shared<const ParseMemoEntry>(text);
    {
        const std::lock_guard<std::mutex> lock(g_parse_memo_mutex);
        auto& memo = parse_memo();
        if (memo.size() >= kParseMemo) memo.clear();
        const auto [it, added] =
            memo.emplace(std::string_view(entry->text), entry);  // the key views its text
        if (!added) entry = it->second;
    }
    return {entry, &entry->parsed};
}

void clear_parse_memo() {
    std::unordered_map<std::string_view, std::shared_ptr<const ParseMemoEntry>> old;
    {
        const std::lock_guard<std::mutex> lock(g_parse_memo_mutex);
        old.swap(parse_memo());
    }
}

std::string_view op_name(Op op) {
    switch (op) {
        case Op::IntConst: return "int";
        case Op::FloatConst: return "float";
        case Op::BoolConst: return "bool";
        case Op::Symbol: return "symbol";
        case Op::Neg: return "unary -";
        case Op::Add: return "+";
        case Op::Sub: return "-";
        case Op::Mul: return "*";
        case Op::TrueDiv: return "/";
        case Op::FloorDiv: return "//";
        case Op::Mod: return "%";
        case Op::Pow: return "**";
        case Op::Abs: return "abs";
        case Op::Min: return "min";
        case Op::Max: return "max";
        case Op::ToFloat: return "float";
        case Op::Trunc: return "math.trunc";
        case Op::Floor: return "math.floor";
        case Op::Ceil: return "math.ceil";
        case Op::Round: return "round";
        case Op::IsNan: return "math.isnan";
        case Op::Eq: return "==";
        case Op::Ne: return "!=";
        case Op::Lt: return "<";
        case Op::Le: return "<=";
        case Op::Gt: return ">";
        case Op::Ge: return ">=";
        case Op::And: return "and";
        case Op::Or: return "or";
        case Op::Not: return "not";
        case Op::Select: return "if-else";
    }
    return "?";
}

}  // namespace tripwire::core::shape
