// tripwire/cpp/core/shape/parser.hpp -- the text syntax of shape relations.
//
// The syntax is the subset of Python expressions that torch's shape-environment printer emits for
// its guards (torch/utils/_sympy/printers.py PythonPrinter), plus sympy-style calls
// (`Eq(a, b)`, `Mod(a, b)`, ...). docs/guards.md has the grammar. Symbols are sources
// (`L['x'].size()[0]`, `L['n']`, `G['cfg'].k`): the parser finds their extent and leaves their
// meaning to the caller, which binds each distinct symbol text to a source. A trailing
// `# comment` (torch appends one to each verbose code part) is ignored.
//
// parse_relation never crashes on any input: it returns a tree or throws ShapeSyntaxError with the
// offset of the problem (tests/fuzz/fuzz_shape.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/shape/bigint.hpp"

namespace tripwire::core::shape {

/// Text the shape engine cannot use: a syntax error, an unknown function, a type error (a float
/// `**`, arithmetic on a comparison), nesting over the limit. `offset` is a byte offset into the
/// text. Maps to tripwire.ShapeSyntaxError (a ValueError) in Python.
class ShapeSyntaxError : public std::invalid_argument {
  public:
    ShapeSyntaxError(std::size_t offset, const std::string& what)
        : std::invalid_argument(what), offset_(offset) {}
    std::size_t offset() const { return offset_; }

  private:
    std::size_t offset_;
};

/// Deepest nesting of sub-expressions the parser accepts (bounds every recursion on the tree).
inline constexpr int kMaxNesting = 200;

/// Integers over this many bits make a relation fail (Python would compute them; tripwire
/// refuses to spend unbounded time and memory in a guard). Symbols, constants and every
/// intermediate result are held to it, and a literal over it is a syntax error.
inline constexpr std::uint64_t kMaxIntBits = 65536;
/// 2**65536 - 1 has 19,729 decimal digits: a literal of more is refused before it is converted
/// (so the conversion, quadratic in the digits, is bounded whatever the text's length).
inline constexpr std::size_t kMaxIntLiteralDigits = 19729;

/// Operations of the expression tree. The same enum names the typed operations of a compiled
/// program (program.hpp), where the operand types select the arithmetic.
enum class Op : std::uint8_t {
    IntConst,    ///< integer literal (any size)
    FloatConst,  ///< float literal, math.inf, math.nan
    BoolConst,   ///< True / False
    Symbol,      ///< a source
    Neg,         ///< -a
    Add,         ///< a + b
    Sub,         ///< a - b
    Mul,         ///< a * b
    TrueDiv,     ///< a / b
    FloorDiv,    ///< a // b (floor); FloorDiv, CleanDiv
    Mod,         ///< a % b (sign of the divisor); Mod, PythonMod
    Pow,         ///< a ** b (ints, natural exponent); PowByNatural
    Abs,         ///< abs(a)
    Min,         ///< min(a, b, ...)
    Max,         ///< max(a, b, ...)
    ToFloat,     ///< float(a), torch.sym_float(a), ToFloat(a)
    Trunc,       ///< int(a), math.trunc(a), TruncToInt(a)
    Floor,       ///< math.floor(a), FloorToInt(a)
    Ceil,        ///< math.ceil(a), CeilToInt(a)
    Round,       ///< round(a), RoundToInt(a)
    IsNan,       ///< math.isnan(a)
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    And,     ///< a and b (short-circuit)
    Or,      ///< a or b (short-circuit)
    Not,     ///< not a
    Select,  ///< a if cond else b: args (cond, a, b), only the chosen branch is evaluated
};

/// The operands of a node: at most three (variadic calls become chains of binary nodes).
struct ArgList {
    std::uint32_t v[3] = {0, 0, 0};
    std::uint8_t n = 0;

    std::size_t size() const { return n; }
    std::uint32_t operator[](std::size_t k) const { return v[k]; }
    const std::uint32_t* begin() const { return v; }
    const std::uint32_t* end() const { return v + n; }
};

/// One node of a parsed expression. Trivially copyable and 48 bytes: the rare int literal beyond
/// int64 lives in ParsedRelation::big_ints, so a tree is copied (into the parse memo) by one memcpy.
struct AstNode {
    Op op = Op::IntConst;
    bool bool_value = false;     ///< BoolConst; for TrueDiv, "IntTrueDiv" (both operands must be ints)
    std::uint32_t offset = 0;    ///< where it starts (an operation: where its operator is)
    ArgList args;                ///< operand node indices, all smaller than this node's
    std::uint32_t symbol = 0;    ///< Symbol: index into ParsedRelation::symbols
    std::uint32_t big_int = 0;   ///< IntConst beyond int64: 1 + its index in ParsedRelation::big_ints
    std::int64_t int_small = 0;  ///< IntConst that fits int64 (big_int == 0)
    double float_value = 0.0;    ///< FloatConst
};
static_assert(std::is_trivially_copyable_v<AstNode>);

/// One occurrence of a symbol in the text.
struct SymbolSpan {
    std::uint32_t begin = 0, end = 0;  ///< byte range of the source text
    std::uint32_t symbol = 0;          ///< index into ParsedRelation::symbols
};

/// A parsed relation. Its symbol texts are views into the text given to parse_relation, which
/// must outlive it.
struct ParsedRelation {
    std::vector<AstNode> nodes;
    std::uint32_t root = 0;
    std::vector<std::string_view> symbols;  ///< distinct symbol texts, in order of first appearance
    std::vector<SymbolSpan> spans;          ///< every occurrence, in text order
    std::size_t code_end = 0;               ///< where the expression ends (before a comment and blanks)
    std::vector<BigInt> big_ints;           ///< the int literals beyond int64 (AstNode::big_int)

    /// The value of an IntConst node of this tree.
    BigInt int_literal(const AstNode& n) const {
        return n.big_int != 0 ? big_ints[n.big_int - 1] : BigInt(n.int_small);
    }
};

/// The blanks the parser skips between tokens, before the relation and before its comment.
inline bool is_blank(char c) {
    // One compare for the usual byte (above ' '): the parser asks before every token.
    constexpr std::uint64_t kBlanks =
        (1ULL << ' ') | (1ULL << '\t') | (1ULL << '\n') | (1ULL << '\r') | (1ULL << '\f') | (1ULL << '\v');
    const auto u = static_cast<unsigned char>(c);
    return u <= ' ' && ((kBlanks >> u) & 1U) != 0;
}

/// Parse one relation. Throws ShapeSyntaxError.
ParsedRelation parse_relation(std::string_view text);

/// parse_relation, memoised by text: the builder's check of a relation on its example and the
/// set's compile parse each relation once, and a JIT that recompiles sees the same texts again.
/// The result owns a copy of the text its symbol views point into. Errors are not memoised.
/// Bounded (the memo is emptied when it holds kParseMemo texts); thread-safe.
std::shared_ptr<const ParsedRelation> parse_relation_shared(std::string_view text);
inline constexpr std::size_t kParseMemo = 4096;

/// Empty the memo of parse_relation_shared (clear_shape_memos).
void clear_parse_memo();

/// The printed name of an operation, for messages ("//", "max", "math.isnan").
std::string_view op_name(Op op);

}  // namespace tripwire::core::shape
