// tripwire/cpp/core/shape/program.hpp -- shape relations compiled into one program.
//
// All the SHAPE relations of a guard set compile into one ShapeProgram: a DAG of typed nodes in
// which equal sub-expressions (after constant folding and operand ordering of commutative
// operations) are one node, shared across relations, and a straight-line code array that
// evaluates the DAG on a register file (one 8-byte register per node) and checks each relation
// as soon as its value is known.
//
// Evaluation has two paths with one meaning (docs/guards.md, SHAPE):
//   - run_fast: int64 arithmetic with checked overflow and IEEE doubles. It decides only when every
//     operation is exact and raises nothing; any overflow, division by zero, out-of-range
//     conversion or an input that does not fit int64 makes it return Undecided.
//   - run_exact: every value exact (BigInt), every error a value (Python would raise), `and`,
//     `or` and `x if c else y` short-circuit: what Python computes, relation by relation.
// The runtime reads symbol values into a ShapeFrame (no allocation for int64 and float values),
// tries run_fast, and falls back to run_exact.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/shape/bigint.hpp"
#include "core/shape/parser.hpp"

namespace tripwire::core::shape {

/// Static type of a value. A symbol's type is its example value's (an exact int or float).
enum class ValueType : std::uint8_t { Int = 0, Float = 1, Bool = 2 };

/// Typed operations of the compiled DAG and code.
enum class Code : std::uint8_t {
    Symbol,  ///< a symbol's register (filled by the runtime)
    Const,   ///< a constant's register (filled from the program)
    // int64 (checked) -> int
    IAdd,
    ISub,
    IMul,
    IFloorDiv,
    IMod,
    INeg,
    IAbs,
    IPow,
    IMin,
    IMax,
    // double -> double
    FAdd,
    FSub,
    FMul,
    FDiv,
    FFloorDiv,
    FMod,
    FNeg,
    FAbs,
    FMin,
    FMax,
    // conversions
    IDiv,    ///< int / int -> float (correctly rounded)
    IToF,    ///< float(int) (OverflowError when too large)
    FTrunc,  ///< float -> int: math.trunc
    FFloor,  ///< float -> int: math.floor
    FCeil,   ///< float -> int: math.ceil
    FRound,  ///< float -> int: round (half to even)
    FIsNan,  ///< math.isnan(float)
    // comparisons -> bool
    IEq,
    INe,
    ILt,
    ILe,
    IGt,
    IGe,  ///< int, int
    FEq,
    FNe,
    FLt,
    FLe,
    FGt,
    FGe,  ///< float, float (IEEE: NaN compares false, != true)
    MEq,
    MNe,
    MLt,
    MLe,
    MGt,
    MGe,  ///< int (a), float (b): exact, as Python compares them
    BEq,
    BNe,  ///< bool, bool
    // logic
    And,
    Or,
    Not,
    Select,  ///< c ? a : b (a, b of one type)
    // code only
    Check,  ///< relation `c` fails unless register `a` is true
};

/// One node of the DAG; its value lives in the register of the same index.
struct ShapeNode {
    Code code = Code::Const;
    ValueType type = ValueType::Int;
    std::uint32_t a = 0, b = 0, c = 0;  ///< operands (node indices); Select: c ? a : b; Symbol: index
};

/// One instruction: compute node `dst` (or, for Check, test register `a` of relation `c`).
struct ShapeInstr {
    Code code = Code::Check;
    std::uint32_t dst = 0, a = 0, b = 0, c = 0;
};

/// One register: an int64, a double, or a bool (as 0/1).
union ShapeReg {
    std::int64_t i;
    double f;
};

/// What became of a declared relation.
enum class RelationStatus : std::uint8_t {
    Kept,     ///< evaluated on every check
    Merged,   ///< the same relation as an earlier one (`by`)
    Implied,  ///< follows from earlier kept relations (bounds on one symbol); `by` is one of them
};

/// One relation as declared (the SHAPE guard with id `id`).
struct ShapeRelation {
    std::uint32_t id = 0;
    std::string text;
    std::uint32_t root = 0;              ///< DAG node of its value (a bool)
    std::vector<std::uint32_t> symbols;  ///< program symbol indices it reads, in first-use order
    RelationStatus status = RelationStatus::Kept;
    std::uint32_t by = 0;  ///< Merged/Implied: the id of the relation that covers it
};

/// A relation to compile: its text and, per distinct symbol text (ParsedRelation::symbols
/// order), the program-wide symbol index.
struct RelationInput {
    std::uint32_t id = 0;
    std::string text;
    std::vector<std::uint32_t> symbols;
};

struct ShapeProgram {
    std::vector<ValueType> symbol_types;  ///< per symbol (int or float)
    std::vector<ShapeNode> nodes;         ///< the DAG; nodes [0, n_symbols) are the symbols
    std::vector<ShapeReg> const_regs;     ///< initial register values (constants; 0 elsewhere)
    std::vector<std::pair<std::uint32_t, BigInt>> big_consts;  ///< constants that do not fit int64
    std::vector<ShapeInstr> code;          ///< fast path: computes, then checks, relation by relation
    std::vector<ShapeRelation> relations;  ///< every declared relation, in id order
    std::vector<std::uint32_t> kept;       ///< indices into `relations` of the kept ones, in id order
    bool fast_ok = true;                   ///< false when a constant does not fit int64

    std::size_t n_symbols() const { return symbol_types.size(); }
    bool empty() const { return relations.empty(); }
};

/// Compile relations (ids unique; `symbol_types` gives every symbol's type). Parses each text,
/// type-checks it (ShapeSyntaxError with the offset of the offending operation), folds
/// constants, shares sub-expressions, merges duplicates and drops relations implied by earlier
/// kept ones (single-symbol bounds).
ShapeProgram compile_relations(std::vector<RelationInput> relations, std::vector<ValueType> symbol_types);

/// compile_relations of one relation (id 0; symbols 0..n-1 in first-use order, of these types),
/// memoised by (text, types): the builder checks each relation on its example with it. Bounded
/// (emptied at kProgramMemo entries); thread-safe. Throws as compile_relations (not memoised).
std::shared_ptr<const ShapeProgram> compile_relation_shared(const std::string& text,
                                                            const std::vector<ValueType>& types);
inline constexpr std::size_t kProgramMemo = 4096;

/// Empty the memos of compile_relation_shared and parse_relation_shared (the fuzzer takes the cold path now
/// and then).
void clear_shape_memos();

/// How the runtime read one symbol.
enum class SymbolState : std::uint8_t {
    Unread,  ///< not read (its source could not be fetched)
    Small,   ///< an int that fits int64, in its register
    Big,     ///< an int that does not fit int64 (ShapeFrame::big)
    TooBig,  ///< an int over kMaxIntBits bits: every relation that reads it fails
    Float,   ///< a float, in its register
};

/// The per-check state: the register file and the symbols' values. Small programs keep it
/// inline (on the caller's stack); none allocates for int64 or float symbols.
class ShapeFrame {
  public:
    explicit ShapeFrame(const ShapeProgram& p);
    ~ShapeFrame() = default;
    ShapeFrame(const ShapeFrame&) = delete;
    ShapeFrame& operator=(const ShapeFrame&) = delete;

    void set_int(std::uint32_t sym, std::int64_t v) {
        regs_[sym].i = v;
        states_[sym] = SymbolState::Small;
    }
    void set_float(std::uint32_t sym, double v) {
        regs_[sym].f = v;
        states_[sym] = SymbolState::Float;
    }
    void set_big(std::uint32_t sym, BigInt v);
    void set_too_big(std::uint32_t sym) {
        states_[sym] = SymbolState::TooBig;
        has_big_ = true;
    }
    void clear(std::uint32_t sym) { states_[sym] = SymbolState::Unread; }
    SymbolState state(std::uint32_t sym) const { return states_[sym]; }
    const BigInt* big(std::uint32_t sym) const;
    const ShapeReg* regs() const { return regs_; }
    ShapeReg* regs() { return regs_; }
    bool has_big() const { return has_big_; }
    const ShapeProgram& program() const { return p_; }

  private:
    static constexpr std::size_t kInlineRegs = 96;
    static constexpr std::size_t kInlineSymbols = 32;
    const ShapeProgram& p_;
    ShapeReg inline_regs_[kInlineRegs];
    SymbolState inline_states_[kInlineSymbols];
    // Registers are written before they are read (symbols by the stores, constants by the
    // constructor, the rest by their instruction), so a large frame's are left uninitialised
    // as the inline ones are: zero-filling them was ~9 instructions per relation.
    std::unique_ptr<ShapeReg[]> heap_regs_;
    std::vector<SymbolState> heap_states_;
    ShapeReg* regs_;
    SymbolState* states_;
    bool has_big_ = false;
    std::vector<std::pair<std::uint32_t, BigInt>> bigs_;
};

/// Result of run_fast.
inline constexpr std::int32_t kShapePass = -1;
inline constexpr std::int32_t kShapeUndecided = -2;

/// The fast path: kShapePass, the index (into ShapeProgram::relations) of the first kept
/// relation that is false, or kShapeUndecided (run_exact decides). Every symbol must be read.
std::int32_t run_fast(const ShapeProgram& p, ShapeFrame& f);

/// One relation's exact outcome.
struct ExactResult {
    bool holds = false;
    std::string error;  ///< what Python would raise ("ZeroDivisionError: ..."); empty if none
};

/// The exact path: evaluates every node reachable from the kept relations whose symbols are all
/// read, and returns one result per relation (index into ShapeProgram::relations; results of
/// relations that are not kept or not readable are `holds = false` with an empty error and must
/// not be used). Allocates; for the slow path and for why_not.
std::vector<ExactResult> run_exact(const ShapeProgram& p, const ShapeFrame& f);

/// Whether every kept relation holds, decided by run_fast and, when it cannot decide, run_exact:
/// -1 when all hold, else the index of the first failing kept relation.
std::int32_t first_failing(const ShapeProgram& p, ShapeFrame& f);

/// Whether every symbol of relation `r` was read.
bool relation_readable(const ShapeProgram& p, const ShapeFrame& f, std::uint32_t r);

std::string_view value_type_name(ValueType t);

}  // namespace tripwire::core::shape
