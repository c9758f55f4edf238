// tripwire/cpp/runtime/eval/guard_set.hpp -- a built guard set evaluated on live Python objects.
//
// GuardSet binds a core::Program to objects: the constant pool (types, constants, names, keys),
// the globals dict and closure cells given at build time. check() walks the program's flat
// arrays; nothing on the hot path allocates or calls Python-level code for built-in kinds.
//
// Lifetimes: objects the guards name by identity (types, ID_MATCH objects, code objects, enum
// members) are held by weak reference when they can be. The raw pointer is used for the
// comparison, and the weak reference's callback marks the set invalid when any of them dies,
// before its memory can be reused, so a new object at the same address can never pass.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "core/program.hpp"
#include "runtime/eval/fetch.hpp"
#include "runtime/eval/guard_kinds.hpp"
#include "runtime/py.hpp"
#include "runtime/tensors/adapter_abi.h"

namespace tripwire::runtime {

/// Shared between a GuardSet and the weakref callbacks of the objects it names. The callbacks
/// may outlive the set (and the set the callbacks), hence shared ownership.
struct InvalidationState {
    bool invalid = false;
    std::string why;  ///< which object died, for why_not
};

/// One failing guard found by a full walk (why_not).
struct FailureRecord {
    std::uint32_t guard_id = 0;
    Ref value;           ///< the value the guard saw; null when the fetch failed
    std::string reason;  ///< why the fetch failed or why the guard raised; empty for a plain miss
};

/// Everything a GuardSet is built from, already converted to objects.
struct GuardSetInputs {
    std::vector<core::GuardDecl> decls;  ///< compiled by the constructor (core::compile)
    std::vector<PyObject*> consts;       ///< borrowed; the GuardSet takes its own references
    std::vector<bool> hold_weakly;       ///< per constant: hold by weak reference if possible
    PyObject* globals = nullptr;         ///< dict or null
    PyObject* closure = nullptr;         ///< dict name -> cell, or null
    bool strict = false;                 ///< re-raise guard exceptions as `eval_error_type`
    PyObject* eval_error_type = nullptr;
};

/// One node of the guard tree as explain() prints it (GuardSet::tree).
struct TreeRow {
    std::uint32_t depth = 0;
    std::string text;                      ///< the printed source
    std::int64_t symbol = -1;              ///< the SHAPE symbol this source is, or -1
    std::vector<std::uint32_t> guard_ids;  ///< its guards' ids, in the current (adaptive) order
    std::vector<std::uint32_t> guard_fails;
    std::uint32_t node_fails = 0;  ///< failed fetches or subtrees
};

/// Statistics readable from Python.
struct GuardSetStats {
    std::uint64_t checks = 0;
    std::uint64_t passes = 0;
    std::uint64_t fast_passes = 0;     ///< passes decided by the fast pass alone (no residue)
    std::uint64_t residue_passes = 0;  ///< passes decided by the fast pass with residues in place
    /// Guards evaluated as residues in the last passing check the fast pass completed (by kind,
    /// or because a fast form did not apply to the objects at hand).
    std::uint32_t last_slow_guards = 0;
    /// Guards the skip proved without evaluating them in the last check the fast pass completed.
    std::uint32_t last_skipped_guards = 0;
};

/// Incremented each time any GuardSet becomes invalid (an identity-held object died). Holders of
/// many sets (runtime::Cache) compare it with the value they last saw, so that they scan their
/// sets for dead ones only after a death instead of on every lookup. GIL held.
std::uint64_t invalidation_epoch();

/// Switch the straight-line fast pass of check() on or off, process-wide (on by default). Off,
/// every check takes the tree walk: the tests run both ways to compare them.
void set_fast_pass_enabled(bool on);
extern bool g_fast_pass_enabled;
inline bool fast_pass_enabled() { return g_fast_pass_enabled; }

class GuardSet {
  public:
    /// Compiles the declarations and builds the runtime form. Raises (C++ exceptions)
    /// core::InvalidProgram on invalid declarations; a Python error from creating weak
    /// references becomes std::runtime_error with its text.
    explicit GuardSet(GuardSetInputs in);
    ~GuardSet();
    GuardSet(const GuardSet&) = delete;
    GuardSet& operator=(const GuardSet&) = delete;

    /// 1 if every guard holds, 0 if not, -1 with a Python error set (strict mode, or a
    /// BaseException that is not an Exception, such as KeyboardInterrupt, which is never hidden).
    /// On a frame's locals (Locals::is_frame) a set that reads G[...] from another globals dict
    /// than the frame's, or reads C[...] cells (the frame's free variables are L[...] there), does
    /// not pass.
    int check(const Locals& locals);
    int check(PyObject* f_locals) { return check(Locals::of_mapping(f_locals)); }
    /// 1 when the straight-line fast pass alone shows every guard holds (counted as a passing
    /// check); 0 when it cannot tell, and then check() must decide. Runs no user code, so a
    /// caller may hold borrowed pointers across it.
    int check_without_user_code(const Locals& locals);

    /// Every failing guard (full walk, installation order). Returns false with a Python error
    /// set only for errors that check() would also propagate.
    bool failures(PyObject* f_locals, std::vector<FailureRecord>& out, bool first_only);

    /// Whether an object the set names by identity has died (the set can never pass again).
    bool invalid() const { return state_->invalid; }
    const std::string& invalid_reason() const { return state_->why; }

    const core::Program& program() const { return program_; }
    /// The globals dict G[...] sources read (borrowed), or null.
    PyObject* globals() const { return globals_.get(); }
    /// Whether some source is rooted at G[...] / C[...].
    bool reads_globals() const { return reads_globals_; }
    bool reads_closure() const { return reads_closure_; }
    /// Whether the set can never pass on these locals whatever their values (frame mode: see
    /// check()).
    bool foreign_to(const Locals& locals) const {
        return locals.is_frame() &&
               (reads_closure_ || (reads_globals_ && locals.frame_globals != globals_.get()));
    }
    /// Whether every guard of the set has a form decided without user code (so the fast pass
    /// alone can decide a passing check).
    bool uses_fast_pass() const { return fast_enabled_ && residue_guards_ == 0; }
    /// Guards of the fast program that are decided without user code (the others are residues:
    /// LAMBDA, Python probes, ...). Steps whose fast form does not apply at run time defer
    /// their subtree for that check only (see GuardSetStats::last_fast_guards).
    std::uint32_t fast_guard_count() const { return fast_guards_; }
    /// Guards decided without user code in the last passing check the fast pass completed.
    std::uint32_t last_fast_guards() const {
        return fast_guards_ + residue_guards_ - stats_.last_slow_guards;
    }
    std::size_t size() const { return program_.guards.size(); }
    const GuardSetStats& stats() const { return stats_; }
    /// Failure count of guard `id` (index into program().guards) and node `ni` so far.
    std::uint32_t guard_fail_count(std::uint32_t gi) const { return guard_fails_[gi]; }
    std::uint32_t node_fail_count(std::uint32_t ni) const { return node_fails_[ni]; }
    /// The current evaluation order of a node's guards and children (adaptive).
    const std::vector<std::uint32_t>& guard_order() const { return guard_order_; }
    const std::vector<std::uint32_t>& child_order() const { return child_order_; }
    /// The tree in preorder, children and guards in their current evaluation order.
    std::vector<TreeRow> tree() const;
    /// Ids of the guards checked once per check, before any source (GLOBAL_STATE, sourceless LAMBDA).
    std::vector<std::uint32_t> ambient_ids() const;
    /// How often each SHAPE relation (index into program().shape.relations) failed a check.
    const std::vector<std::uint32_t>& relation_fail_counts() const { return relation_fails_; }
    /// Ids of the relational guards (ALIAS, NO_ALIAS), decided after every source was read.
    std::vector<std::uint32_t> relational_ids() const;
    /// Guard `gi` (index into program().guards) as bound: its path (via_python), its derived
    /// objects. For diagnostics and explain().
    const RuntimeGuard& runtime_guard(std::uint32_t gi) const { return guards_[gi]; }
    /// The object behind constant `c`, or null if it was held weakly and died. Borrowed.
    PyObject* constant(core::ConstId c) const;
    /// The value at node `ni` read from these locals and `globals` as read_source (fetch.hpp)
    /// reads it, C[...] roots without their cell: a new reference, or null with a Python error
    /// set. For explain()'s reader facts (GuardSet.symbol_readers), never on a check.
    Ref read_node(std::uint32_t ni, PyObject* f_locals, PyObject* globals) const;
    /// Visit every strong reference (for tp_traverse of the owning Python object).
    int traverse(visitproc visit, void* arg) const;

  private:
    /// The hot per-node data, kept apart from core::Node (which carries texts and build facts)
    /// so that a check touches few cache lines.
    struct NodeRt {
        std::uint32_t guard_begin = 0, guard_end = 0;  ///< copied from core::Node
        std::uint32_t child_begin = 0, child_end = 0;
        RuntimeStep step;        ///< for steps
        RuntimeRoot root;        ///< for roots (names and cells borrowed from the pool)
        bool borrow_ok = false;  ///< the subtree runs no user code: borrowed values are safe
        core::shape::ValueType symbol_type = core::shape::ValueType::Int;
        std::uint32_t symbol = core::kNoSymbol;          ///< the SHAPE symbol this value is, if any
        std::uint32_t subtree_guards = 0;                ///< guards on this node and below
        std::uint32_t member_begin = 0, member_end = 0;  ///< relational operands (core::Node)
    };

    /// The skip's claims (docs/cpp.md, "Skipping unchanged subtrees"), kept in arrays of their
    /// own rather than in NodeRt, whose ~170 bytes would cost a check a line per node for the 16
    /// bytes it reads. Each claim is a fact about one state of one dict, true forever once made,
    /// since tags never repeat. A fetch's claim and a stamp's are read by different ops (a
    /// settled leaf has no stamp): two 16-byte records, four to a line, each array in the order
    /// the fast program reads it.
    struct FetchMemo {
        /// the value fetched from the parent's dict in state `parent_tag`...
        PyObject* value = nullptr;
        /// ...on which its identity-implied guards held (0: no claim)
        std::uint64_t parent_tag = 0;
    };
    struct StateMemo {
        /// in this state of this node's dict, its state-implied guards held (0: no claim)
        std::uint64_t tag = 0;
        /// in this state of this node's dict, every child of its leaf run (LeafRun) was fetched
        /// and all its guards held (0: no claim; cleared when the program is rebuilt)
        std::uint64_t run_tag = 0;
    };
    static_assert(sizeof(FetchMemo) == 16 && sizeof(StateMemo) == 16, "four memos to a cache line");

    /// One instruction of the fast program (fast_pass.cpp). Adding a guard kind to the fast
    /// path is local: a Code below, named by the kind's FAST column (core/guard_kind_table.hpp),
    /// and its case in GuardSet::fast_pass (docs/cpp.md, "Adding a guard kind to the fast path").
    struct alignas(32) FastOp {
        enum class Code : std::uint8_t {
            // Loads and fetches: regs[node] = the value. `skip` is the first op after the node's
            // subtree: when the fast form does not apply to the objects at hand, the walk
            // evaluates the subtree in place (a residue) and the pass continues there.
            LoadLocal,
            LoadGlobal,
            LoadClosure,
            FetchAttr,
            FetchItem,
            FetchDictItem,
            FetchDict,
            FetchFunction,  // __defaults__[i], __kwdefaults__[k], __closure__[i] of a function
            FetchCode,      // __code__ of a function (torch guards one per function it inlined)
            FetchPure,      // type, weakref target, dict key/value by position
            // The same fetches by a settling step (the skip): a value settled by its claim goes
            // on to the next op; one fetched is claimed and goes to `jump`, the node's
            // identity-implied guards out of line (or the next op when it has none). Separate
            // codes, so that a fetch that never settles tests nothing for it. LoadGlobal settles
            // when the globals dict is stamped (`settle`).
            SettleAttr,
            SettleItem,
            SettleDictItem,
            SettlePure,
            // Guards on regs[node]. A guard that fails ends the pass; one whose fast form does not
            // apply to the value is evaluated by the walk's code in place (a residue).
            TypeIs,
            IdIs,
            IsNone,
            IsNotNone,
            IsTrue,
            IsFalse,
            Equals,
            EqualsPython,  // EQUALS_MATCH with python_eq: the fast form, else a residue
            DictKeys,
            DictContains,
            LengthExact,
            DictVersion,
            WeakrefAlive,
            CodeIs,
            BuiltinProbe,       // ambient GLOBAL_STATE on a built-in probe
            TorchGlobalState,   // ... on torch's global state, bound through the adapter: `a` is g.derived
            TorchNoSavedHooks,  // ... on torch's saved-tensor hooks, snapshot None, through the adapter
            TorchNoModes,       // ... on torch's function-mode stack, snapshot (), through the adapter
            TorchNoDevice,      // ... on torch's default device, snapshot None
            // The skip: read the version tag of regs[node] (an exact dict, or an exact module's
            // dict) into the node's tag slot; equal to its claim: go on to the next op, its
            // state-implied guards proved; else claim and go to `jump`, those guards out of line
            // (or the next op when it has none). StampGlobals reads the globals dict's tag, which
            // G[...] roots settle under.
            Stamp,
            StampGlobals,
            // FetchDict and its node's Stamp in one op (an instance `__dict__` that is stamped,
            // the common case: every nn.Module's): the stamp's fields (memo, jump, jumped) and the
            // fetch's (parent, skip) do not overlap. One dispatch and one register read fewer per
            // module per check, and the exact-dict test the fetch made is the stamp's.
            FetchDictStamp,
            // A run of a stamped node's children that are settled leaves (every guard implied by
            // identity, no child, no symbol, no relational role): LeafRun jumps over the whole run
            // (and its RunClaim) when the node's tag this check equals its run claim; RunClaim, at
            // the run's end, makes that claim when no user code ran since the node's stamp.
            LeafRun,
            RunClaim,
            // The end of an out-of-line block (the guards a claim proves): back to `jump`.
            Resume,
            // Residues: kinds with no form free of user code, evaluated in place as the walk does,
            // the current path's values held (SlowGuard on regs[node], SlowAmbient on the locals).
            SlowGuard,
            SlowAmbient,
            Symbol,      // store regs[node] as SHAPE symbol `guard`
            TensorProp,  // store SIZE/STRIDE/STORAGE_OFFSET of regs[parent] as int symbol `guard`
            // Tensor kinds read without user code (the adapter, the array struct); a value the
            // form does not decide is evaluated in place by the walk's code (a residue).
            TensorMatch,
            ArrayMatch,
            DimensionMarking,
            // HASATTR where attribute_certainly_absent proves the name absent (NO_HASATTR holds);
            // anything else is a residue.
            HasAttr,
            // SET_CONTAINS on a small set of exact str (set_contains_pure); else a residue.
            SetContains,
            DispatchKeySetMatch,  // decided here always (adapter only: no residue)
            // ALIAS / NO_ALIAS after every node: on the registers of its sources' nodes, or on
            // strong references once a residue ran (hold_relational).
            Relational,
            // SettleDictItem and its node's Stamp in one op (a stamped dict fetched by a settling
            // item step: every nn.Module's `_modules`, `_parameters`, `_buffers`). The node's
            // identity-implied guards join its state-implied ones out of line (an unchanged tag
            // proves both: docs/cpp.md), so the fetch has no block of its own; `memo` is the
            // fetch's claim, `pos` the stamp's (the child position is found again on the rare
            // residue, child_pos).
            SettleDictItemStamp,
            // SettleDictItem of a node with no identity-implied guard whose first op in line is a
            // TypeIs (a module of a mutable class in its parent's `_modules`): when the value's
            // type is the one that TypeIs expects, the TypeIs op is stepped over (one dispatch
            // fewer per module per check); otherwise it runs next, and fails as the walk names it.
            SettleDictItemTypeIs,
            // A TensorMatch whose next op is its node's DimensionMarking (the pair torch emits for
            // every tensor input): when the record matches and dimension_marking_unmarked proves
            // the tensor unmarked, both hold and the next op is skipped; otherwise this op is the
            // TensorMatch alone and the DimensionMarking op decides on its own.
            TensorMatchMarking,
            // SettleItem (a str-keyed subscript of a dict) and SettleAttr (an attribute of a
            // module) fused with their node's Stamp, as SettleDictItemStamp: the fetch's claim is
            // made (or used) as the plain settling fetch's, and the node's identity-implied guards
            // join its state-implied ones in the stamp's block.
            SettleItemStamp,
            SettleAttrStamp,
            // `X.name.__func__` where `X.name` binds a plain function of X's class: the function,
            // read without the bound method (method_function, fetch.hpp). The op is the `X.name`
            // node's fetch (`node`, `parent`, `skip`: the walk evaluates both steps when the read
            // does not apply); `guard` is the `__func__` child, which has no fetch op of its own.
            // Both registers hold the function: the method node has no guard, no other child and
            // no relational role, so only a path held around a residue below reads its register.
            FetchMethodFunc,
            End,  // the last op of every program
        };
        // 32 bytes, aligned to 32: two ops to a cache line, none straddling two (the program is
        // read once per check, in order; at 48 bytes it was a third of the check's L1 misses).
        Code code = Code::LoadLocal;
        bool settle = false;  ///< fetches: the value may be settled by the parent's tag (a claim)
        std::uint32_t node = 0;
        union {
            std::uint32_t guard = 0;  ///< guard index (into guards_); Symbol/TensorProp: the symbol
            /// settling fetches: fetch_memos_[memo]; Stamp, LeafRun, RunClaim: state_memos_[memo]
            std::uint32_t memo;
        };
        /// guard: position in the node's guard range; fetch: in the parent's child range
        /// (child_pos); Settle{DictItem,Item,Attr}Stamp: its stamp's state_memos_ slot
        std::uint32_t pos = 0;
        union {
            struct {
                /// Settling fetch / stamp: where a miss of its claim goes (the out-of-line block of
                /// the guards the claim proves, or the next op); LeafRun: the first op after the
                /// run; Resume: the op after the fetch or stamp whose block it ends; a guard op out
                /// of line: that same op, its place in the program's order (op_order).
                std::uint32_t jump;
                std::uint32_t jumped;  ///< how many guard ops a hit of the claim proves
            };
            /// SettleDictItemTypeIs (no block: its claim proves no guard): the type its next op,
            /// a TypeIs of the same node, expects
            PyObject* next_type = nullptr;
        };
        // Guards read an operand, fetches their parent's register and their subtree's end, never
        // both: they share the last 8 bytes.
        union {
            PyObject* a = nullptr;  ///< guards: the operand
            /// TENSOR_MATCH: its record in tensor_records_; DIMENSION_MARKING: its MarkingCache
            const void* hot;
            struct {
                std::uint32_t parent;  ///< fetches: the parent's node (its register)
                std::uint32_t skip;    ///< fetches: first op after the subtree
            };
        };
    };
    static_assert(sizeof(FastOp) == 32, "two ops to a cache line");
    /// Compile the fast program from the tree in its current adaptive order.
    void build_fast_pass();
    /// The fast op for guard `gi` at position `pos` of node `ni`'s range (a residue op when the
    /// kind has no form free of user code).
    FastOp guard_op(std::uint32_t ni, std::uint32_t gi, std::uint32_t pos) const;
    /// fast_pass() could not decide: the tree walk decides, from the start (nothing ran).
    static constexpr int kUndecided = 2;
    /// The fast program on these locals (fast_pass.cpp). Values are borrowed while no user code
    /// runs; a residue (a guard or subtree without a form free of user code, by kind or for the
    /// objects at hand) is evaluated in place, as the walk would, with the current path's values
    /// held. 1: every guard holds; 0: a guard failed after a residue ran (decided, failures
    /// counted); -1: a residue raised (strict mode, KeyboardInterrupt); kUndecided: a guard
    /// failed or a value was missing before any user code ran, or a residue was met while
    /// `allow_user_code` is false.
    int fast_pass(const Locals& locals, bool allow_user_code);
    /// fast_pass() for a set with SHAPE relations: the run's frame, current on this thread.
    [[gnu::noinline]] int fast_pass_with_shapes(const Locals& locals, bool allow_user_code);
    /// The program itself; `sf` is the run's shape frame, null exactly when the set has no SHAPE
    /// relation (then no op stores a symbol: a TensorProp op without a symbol is a residue).
    template <bool kUserCode>
    int run_program(const Locals& locals, core::shape::ShapeFrame* sf);
    /// Which guards a claim covers (docs/cpp.md, "Skipping unchanged subtrees").
    enum class Implied : std::uint8_t {
        Never,     ///< evaluated on every check
        Identity,  ///< holds forever on the same live object once it held
        State,     ///< holds as long as the node's dict is unchanged (tag) once it held
    };
    Implied implied_by(const RuntimeGuard& g) const;
    /// implied_by for guard `g` of node `ni`, given the node's other guards (a LENGTH is implied by
    /// identity on a node that also matches a fixed-size type exactly).
    Implied implied_at(std::uint32_t ni, const RuntimeGuard& g) const;
    /// The state of one run of the fast program (fast_pass.cpp).
    struct Pass {
        const Locals& locals;
        PyObject** r;                 ///< registers: a value per node
        std::uint64_t* tags;          ///< the skip's tags read this check, per node (+1: the globals)
        std::vector<PyObject*> held;  ///< references taken before residues, dropped after the loop
        bool allow_user_code;
        bool ran_user_code = false;
        std::uint32_t slow_guards = 0;  ///< guards evaluated as residues
        std::uint32_t skipped = 0;      ///< guards the skip proved (claim_prefix_: from the whole, down)
        int result = 1;
        /// TENSOR_MATCH's memo of the thread-local dispatch key sets: read once per check,
        /// forgotten after every residue (user code may change them). Reset by run_program
        /// (tw_key_memo_reset), never used zeroed.
        TwKeyMemo key_memo{};
    };
    // The fast program's rare paths, out of line (fast_pass.cpp).
    void hold_path(Pass& p, std::uint32_t ni);
    /// Before a residue at op `op_index`: strong references to the relational sources read so far.
    void hold_relational(Pass& p, std::size_t op_index);
    /// After residues ran: decide every relational guard from strong references (sets p.result).
    void relational_after_residues(Pass& p);
    /// Whether a residue left a strong reference to a relational source (read before it, or by
    /// the walk inside it).
    bool relational_sources_held() const;
    bool after_residue(Pass& p, int rr);
    [[gnu::noinline, gnu::cold]] void fail(Pass& p, std::uint32_t ni, std::uint32_t guard_pos);
    /// At the End op of a passing run: the SHAPE relations on the run's frame (sets p.result).
    [[gnu::noinline]] void decide_shape_in_pass(Pass& p, core::shape::ShapeFrame& frame);
    [[gnu::noinline]] std::size_t slow_subtree(Pass& p, const FastOp& op);
    /// A fetch op's position in its parent's child range (or root_order_): `pos`, or for a
    /// Settle{DictItem,Item,Attr}Stamp (whose `pos` holds its state memo) found in the current order.
    std::uint32_t child_pos(const FastOp& op) const;
    [[gnu::noinline]] bool slow_guard(Pass& p, const FastOp& op);
    [[gnu::noinline]] bool slow_ambient(Pass& p, const FastOp& op);
    /// Count a failure of node `ni` (a guard on it failed) along its path, as the walk's returns do.
    void record_path_failure(std::uint32_t ni);
    /// One guard (position `pos` of node `ni`'s range) on `v`, as the walk evaluates it. 1/0/-1.
    int eval_guard_at(std::uint32_t ni, std::uint32_t pos, PyObject* v);
    /// Child at position `pos` of node `ni`'s child range, fetched from `v` and walked. 1/0/-1.
    int eval_child(std::uint32_t ni, std::uint32_t pos, PyObject* v);
    /// Root at position `pos` of root_order_, fetched from `locals` and walked. 1/0/-1.
    int eval_root(std::uint32_t pos, const Locals& locals);
    /// The ambient guards (index range [begin, end) of program_.ambient), as the walk does. 1/0/-1.
    int eval_ambient(std::size_t begin, std::size_t end, const Locals& locals);

    /// check()'s tree walk, from the start; `frame` is the check's shape frame, null exactly when
    /// the set has no SHAPE relation.
    int walk(const Locals& locals, core::shape::ShapeFrame* frame);
    /// walk() for a set with SHAPE relations: the check's frame, current on this thread.
    [[gnu::noinline]] int walk_with_shapes(const Locals& locals);
    /// Whether every SHAPE symbol of this set was stored in `frame`.
    bool all_symbols_read(const core::shape::ShapeFrame& frame) const;
    /// The SHAPE relations on a frame every source was read into: 1 all hold, 0 one fails (or,
    /// defensively, a symbol is unread); counts the failing relation.
    int decide_shape(core::shape::ShapeFrame& frame);
    int eval_node(std::uint32_t ni, PyObject* v);
    int eval_guards(std::uint32_t ni, PyObject* v);
    /// Hand node `ni`'s value to the relational guards that observe it (a strong reference in
    /// the current check's slots, or in why_not's).
    void record_members(std::uint32_t ni, PyObject* v);
    /// Decide every relational guard from `slots` (1 holds, 0 not); counts failures.
    int eval_relational(PyObject* const* slots);
    /// Bind the operands of the declarations to the runtime (paths, derived objects) before they
    /// are compiled: sets via_python and fills derived_by_id.
    void bind_declarations(std::vector<core::GuardDecl>& decls, const std::vector<PyObject*>& consts,
                           std::vector<std::pair<std::uint32_t, Ref>>& derived_by_id);
    Fetched fetch_root(std::uint32_t ni, const Locals& locals);
    Fetched fetch_node(std::uint32_t ni, PyObject* parent);
    int on_error(std::uint32_t ni);
    /// why_not's walk below node `ni` (value `v`), in installation order; false when an error
    /// must propagate (a BaseException that is not an Exception).
    bool walk_failures(std::uint32_t ni, PyObject* v, std::vector<FailureRecord>& out);
    /// why_not's record of the SHAPE relations that fail on the symbols the walk read.
    void shape_failures(const core::shape::ShapeFrame& frame, const std::vector<Ref>& values,
                        std::vector<FailureRecord>& out);
    /// The guard index of guard id `id` (program_.guards is sorted by id).
    std::uint32_t guard_index(std::uint32_t id) const;
    /// Walk node `ni` if its fetch `f` (from `parent`) succeeded, else record why it failed.
    bool visit_failures(std::uint32_t ni, Fetched f, PyObject* parent, std::vector<FailureRecord>& out);
    /// Record guard `gi` failing (r == 0) or raising (r < 0) on `v` (null for an ambient guard).
    bool record_guard_failure(std::uint32_t gi, int r, PyObject* v, std::vector<FailureRecord>& out);
    /// Replace `out` with the one failure of an invalid set: the first guard naming a dead object.
    void report_invalid(std::vector<FailureRecord>& out) const;

    core::Program program_;
    std::vector<Ref> holders_;     // strong refs: the constant itself or its weak reference
    std::vector<PyObject*> objs_;  // raw constant pointers used for comparisons
    std::vector<NodeRt> nodes_;
    // The skip's claims (hot: read by every settled fetch and stamp), each array in the order
    // the fast program reads it, so that consecutive settled fetches (stamps) read consecutive
    // records, four to a line, rather than records scattered in node-id order; fetch_slot_[node]
    // and state_slot_[node] are a node's indices into them.
    std::vector<FetchMemo> fetch_memos_;
    std::vector<StateMemo> state_memos_;
    std::vector<std::uint32_t> fetch_slot_, state_slot_;
    /// Withdraw every claim on node `ni` (a guard it covers failed or was decided with user code).
    void withdraw_claims(std::uint32_t ni) {
        fetch_memos_[fetch_slot_[ni]] = FetchMemo{};
        state_memos_[state_slot_[ni]] = StateMemo{};
    }
    std::vector<RuntimeGuard> guards_;
    std::vector<std::unique_ptr<DictWatch>> watches_;  // DICT_VERSION change flags (3.12+)
    std::vector<std::uint32_t> guard_order_;           // permutation of program_.node_guards ranges
    std::vector<std::uint32_t> child_order_;           // permutation of program_.children ranges
    std::vector<std::uint32_t> root_order_;
    std::vector<std::uint32_t> guard_fails_, node_fails_;
    std::vector<std::uint32_t> relation_fails_;  // per SHAPE relation
    std::vector<std::string> symbol_texts_;      // per SHAPE symbol, its printed source
    bool ambient_reads_locals_ = false;          // an ambient guard (a LAMBDA) takes f_locals itself
    bool reads_globals_ = false;                 // some root is G[...]
    bool reads_closure_ = false;                 // some root is C[...]
    // The fast program: the ops run in order from 0 to the End op at fast_end_, then the
    // out-of-line blocks (the guards a claim proves, each ended by a Resume op), entered only when
    // a claim misses. A check of an unchanged tree reads one contiguous stream of ops.
    std::vector<FastOp> fast_ops_;
    std::uint32_t fast_end_ = 0;
    /// The guards the skip proves on a check where every claim of the in-line program holds:
    /// claim_prefix_[i] is the sum of `jumped` over the in-line claim ops before op i (claim_op),
    /// claim_prefix_[fast_end_] the whole program's. A check starts from the whole and takes off
    /// what a missed claim (its block runs) or a residue subtree (its ops do not run) leaves
    /// unproved: no count per hit, which costs every claim an add.
    std::vector<std::uint32_t> claim_prefix_;
    /// Whether op `op` is in line and counts its `jumped` as the guards its claim proves.
    static bool claim_op(const FastOp& op);
    /// Op `op`'s place in the program's evaluation order: its index, or for an op out of line
    /// the index of the op after the fetch or stamp whose claim it belongs to.
    std::size_t op_order(const FastOp& op) const {
        const auto i = static_cast<std::size_t>(&op - fast_ops_.data());
        return i > fast_end_ ? op.jump : i;
    }
    bool fast_enabled_ = false;
    std::uint32_t fast_guards_ = 0;     // guards the fast program decides without user code
    std::uint32_t residue_guards_ = 0;  // guards it leaves to the residue phase by kind
    // Objects derived when binding guards (ARRAY_MATCH dtypes, DIMENSION_MARKING sets) and the
    // inline caches of DIMENSION_MARKING (sized once: RuntimeGuard points into it).
    std::vector<Ref> derived_;
    // DIMENSION_MARKING's caches (sized once: RuntimeGuard::marking points into it).
    std::vector<MarkingCache> marking_caches_;
    // HASATTR's inline caches (RuntimeGuard::absence points into it).
    std::vector<AbsenceCache> absence_caches_;
    // TENSOR_MATCH's records, contiguous in guard order, each the expected type's address then
    // the guard's data (RuntimeGuard::data points here): the fast op reads its record only, not
    // the RuntimeGuard and a separate heap block (tensor_match_record). Never resized after
    // binding.
    std::vector<std::int64_t> tensor_records_;
    // Relational guards: slot base per guard (index into program_.guards), the check's slots
    // (strong references while a walk holds them), the nodes of each slot for the fast pass, and
    // sort scratch for large NO_ALIAS.
    std::vector<std::uint32_t> rel_base_;
    std::vector<PyObject*> rel_slots_;
    std::vector<std::uint32_t> rel_nodes_;
    std::vector<PyObject*> rel_sort_;
    PyObject** rel_scratch_ = nullptr;                 // the slots the current walk records into
    std::vector<Ref>* diag_slots_ = nullptr;           // why_not's slots while it walks
    std::vector<std::uint32_t> rel_fetch_op_;          // per relational slot: its node's fetch op
    std::uint64_t order_changes_ = 0;                  // bumped whenever the tree walk reorders anything
    std::uint64_t fast_built_at_ = ~std::uint64_t{0};  // order_changes_ when fast_ops_ was built
    Ref globals_, closure_, eval_error_type_;
    bool strict_ = false;
    int active_ = 0;  // re-entrancy depth: reorder only when no other walk is in progress
    std::shared_ptr<InvalidationState> state_;
    GuardSetStats stats_;
};

}  // namespace tripwire::runtime
