// tripwire/cpp/core/program.hpp -- the compiled guard tree.
//
// compile() merges the sources of all declared guards into a tree of shared prefixes (one fetch
// per distinct source) and lays it out as flat arrays: nodes, their guards and their children are
// contiguous index ranges, so evaluation walks plain structs with no allocation. The ranges are
// in installation order; the runtime may permute entries *within* a range (adaptive fail-fast
// ordering) but never moves an entry to another range.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/ir.hpp"
#include "core/shape/program.hpp"

namespace tripwire::core {

/// A declaration or program that breaks the IR's rules (bad operand, out-of-range constant,
/// source depth over the limit). Maps to ValueError in Python.
class InvalidProgram : public std::invalid_argument {
  public:
    using std::invalid_argument::invalid_argument;
};

/// Deepest source the engine accepts. It bounds the walk's recursion (two small native frames
/// per step) and the printed prefixes every source carries (their total length grows with the
/// square of the depth). torch's module sources cost three steps per submodule level
/// (`._modules['name']`, then the parameter dict), so 256 takes a parameter about 80 submodules
/// deep.
inline constexpr std::size_t kMaxSourceDepth = 256;
/// Most sources one relational guard (NO_ALIAS) may relate.
inline constexpr std::size_t kMaxRelationalSources = 65536;
/// Index value meaning "none" for node parents.
inline constexpr std::uint32_t kNoNode = 0xFFFFFFFFu;
/// Node::symbol of a node that is no shape symbol.
inline constexpr std::uint32_t kNoSymbol = 0xFFFFFFFFu;

/// One distinct source: how its value is fetched and what is checked on it.
struct Node {
    bool is_root = false;
    RootKind root = RootKind::Local;  ///< for roots
    ConstId root_name = kNoConst;     ///< for roots
    Step step;                        ///< for non-roots: how to fetch from the parent's value
    std::uint32_t parent = kNoNode;
    std::uint32_t depth = 0;                         ///< 0 for roots
    std::uint32_t guard_begin = 0, guard_end = 0;    ///< range in Program::node_guards
    std::uint32_t child_begin = 0, child_end = 0;    ///< range in Program::children
    std::uint32_t member_begin = 0, member_end = 0;  ///< range in Program::node_members
    /// Smallest guard id in this subtree: relational members included, and for a shape symbol's
    /// node the relations reading it.
    std::uint32_t min_guard_id = 0;
    std::uint32_t symbol = kNoSymbol;     ///< the shape symbol whose value this source is, if any
    bool subtree_runs_user_code = false;  ///< any fetch or guard below (or here) may run user code
    std::string text;                     ///< the printed source
};

/// A node's value is one of a relational guard's operands: `slot` is the position of the node's
/// source among the guard's sources (0 for GuardDecl::source, i + 1 for more_sources[i]).
struct Member {
    std::uint32_t guard = 0;  ///< index into Program::guards
    std::uint32_t slot = 0;

    friend bool operator==(const Member& a, const Member& b) {
        return a.guard == b.guard && a.slot == b.slot;
    }
};

/// The compiled form of a guard set.
struct Program {
    std::vector<GuardDecl> guards;           ///< all guards, in installation (id) order
    std::vector<Node> nodes;                 ///< every distinct source
    std::vector<std::uint32_t> node_guards;  ///< guard indices, grouped by node
    std::vector<std::uint32_t> children;     ///< node indices, grouped by parent
    std::vector<std::uint32_t> roots;        ///< root node indices
    std::vector<std::uint32_t> ambient;      ///< guards without a source (GlobalState, Lambda on f_locals)
    std::vector<Member> node_members;        ///< relational operands, grouped by node (installation order)
    std::vector<std::uint32_t> relational;   ///< relational guards (ALIAS, NO_ALIAS), in id order
    std::uint32_t max_depth = 0;
    /// SHAPE guards: their relations compiled into one program, evaluated after every source was
    /// read. `symbol_nodes[s]` is the node whose value symbol `s` is; `shape_guards` the SHAPE
    /// guards' indices into `guards` (each relation's id is its guard's id).
    shape::ShapeProgram shape;
    std::vector<std::uint32_t> symbol_nodes;
    std::vector<std::uint32_t> shape_guards;
    std::vector<std::uint32_t> symbol_min_id;  ///< per symbol: the smallest id of a relation reading it
};

/// Whether a step of this kind compares with an operand (a name or key: Attr, Item, DictItem,
/// KwDefaults).
bool step_takes_operand(StepKind k);
/// Whether a step of this kind takes a position (`Step::index`), as Size or Defaults do.
bool step_takes_index(StepKind k);

/// Build the tree. Guards are sorted by id; ids must be unique. Throws InvalidProgram.
/// `decls_validated`: the caller ran validate_decl on every declaration against `n_consts`
/// (runtime::GuardSet does, before binding them), so compile does not run it again.
Program compile(std::vector<GuardDecl> decls, std::size_t n_consts, bool decls_validated = false);

/// Check a program's internal consistency (ranges, parents, constant ids < n_consts, operand
/// shapes). compile() calls it; loaders of untrusted data must too. Throws InvalidProgram.
void validate(const Program& p, std::size_t n_consts);

/// Check one declaration against the catalogue's operand shapes. Throws InvalidProgram.
void validate_decl(const GuardDecl& d, std::size_t n_consts);

/// Check a shape program's internal consistency (operands before their users, registers and
/// relation indices in range), which run_fast and run_exact rely on. Throws InvalidProgram.
void validate_shape(const shape::ShapeProgram& p);

}  // namespace tripwire::core
