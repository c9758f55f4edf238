// tripwire/cpp/runtime/eval/fast_pass.cpp -- the fast program of GuardSet::check.
//
// The tree walk (guard_set.cpp) is the authority: it handles user code, errors, borrowed-value
// safety, failure statistics and adaptive reordering. Most checks of a warm guard set pass,
// though, and on built-in objects they need none of that. The fast program is the tree flattened
// into one array of instructions (loads, fetches and guards on "registers", one per node), in the
// tree's current evaluation order, run in one loop.
//
// Every instruction has a form that runs no user code and allocates no Python object
// (inline-cache hits, hinted dict reads, exact built-in containers, identity and structural
// comparisons of built-in constants); values are borrowed, since with no user code running
// nothing can drop the parents' references. What has no such form is a *residue*, evaluated in
// place by the walk's own code (eval_guard_at, eval_child, eval_root, eval_ambient: user code,
// errors, strict mode, failure counts), so that it costs itself and not the whole set:
// - a guard kind that always runs user code (LAMBDA, a Python GLOBAL_STATE probe, HASATTR, the
//   iterator kinds) is a residue by kind (SlowGuard / SlowAmbient);
// - a fetch or guard whose fast form does not apply to the objects at hand (a stale inline
//   cache, a property, a dict holding a user-typed key, a non-function `__code__`) is a residue
//   for this check: the walk evaluates that subtree or guard in place.
// Evaluation order is the walk's: the program is the tree in its current order, residues
// included, so a predicate that mutates what a later guard reads behaves as in the walk.
//
// The region rule (docs/cpp.md) around a residue: before it runs, the registers on the current
// path (the only ones a later instruction reads: in depth-first order a fetch reads its parent,
// a guard its node) are INCREF'd into `held`, so user code cannot free them; the region is opened
// for the residue only (UserCodeWindow); after it `invalid` is re-read (user code may have killed
// an identity-held object and put another at its address), and a set that became invalid fails at
// once, before any later identity comparison. The references are dropped after the loop, outside
// the region, and `invalid` is read once more. `active_` is held for the whole program, so neither
// a nested check of this set nor another thread's can reorder the tree (and rebuild `fast_ops_`)
// while the loop iterates it; the registers of a set too big for the stack come from a per-thread
// pool indexed by nesting depth, so a nested check on this thread cannot overwrite them.
//
// Results: a guard that fails (or a value that is missing) before any residue ran leaves the
// check undecided, and check() runs the walk from the start, which sees the same objects since
// nothing ran. After a residue ran, the program decides the failure itself (running user code
// twice would be observable) and counts it along the path as the walk's returns do.
//
// SHAPE symbols (docs/shapes.md). Each run has its own ShapeFrame, made the thread's current one
// (ShapeScope) for the run, so that a residue subtree evaluated by the walk's code stores its
// symbols into it too, and a check nested in a residue's user code gets a frame of its own. A
// symbol is stored by value (int64, double, or an exact BigInt copy): nothing in the frame is a
// borrowed object, so user code run by a later residue cannot invalidate what was read before it.
// A node that is a symbol is never settled by the skip and its Symbol op sits right after its
// fetch, before its stamp: no jump of the skip passes over it (and no jump passes over a subtree:
// jumps cover guards only). A SIZE/STRIDE/STORAGE_OFFSET symbol is read by the C-level property
// reader (TensorProp), never claimed; what the reader does not answer is a residue subtree. The
// relations run once, at the End op, after every symbol was read: a failure before any user code
// ran (or an int64 overflow) leaves the check to the walk; after a residue the exact evaluator
// decides here. A symbol left unread (a bug) never passes.
#include <vector>

#include "core/fail_order.hpp"
#include "runtime/eval/dict_hint.hpp"
#include "runtime/eval/guard_kinds.hpp"
#include "runtime/eval/guard_set.hpp"
#include "runtime/eval/no_user_code.hpp"
#include "runtime/eval/relational.hpp"
#include "runtime/eval/shape_symbols.hpp"
#include "runtime/eval/tensor_props.hpp"
#include "runtime/tensors/tensor_kinds.hpp"
#include "runtime/tensors/torch_state.hpp"

namespace tripwire::runtime {

bool g_fast_pass_enabled = true;

namespace {

// Registers of one pass: a value per node, and a tag slot per node plus one for the globals
// dict (the skip). Small sets (the common case) keep them on the stack; bigger ones use a file
// per thread and per nesting depth (a residue may run a nested check on this thread: it gets the
// next file, never ours).
constexpr std::size_t kStackRegs = 128;
struct RegisterSpace {
    std::vector<PyObject*> values;
    std::vector<std::uint64_t> tags;
};
thread_local std::vector<RegisterSpace> t_reg_files;
thread_local std::size_t t_reg_depth = 0;

class RegisterFile {
  public:
    explicit RegisterFile(std::size_t n) {
        if (n <= kStackRegs) {
            values_ = stack_values_;
            tags_ = stack_tags_;
            return;
        }
        pooled_ = true;
        if (t_reg_files.size() <= t_reg_depth) t_reg_files.resize(t_reg_depth + 1);
        RegisterSpace& file = t_reg_files[t_reg_depth++];
        if (file.values.size() < n) file.values.resize(n);
        if (file.tags.size() < n + 1) file.tags.resize(n + 1);
        values_ = file.values.data();
        tags_ = file.tags.data();
    }
    ~RegisterFile() {
        if (pooled_) --t_reg_depth;
    }
    RegisterFile(const RegisterFile&) = delete;
    RegisterFile& operator=(const RegisterFile&) = delete;
    PyObject** values() const { return values_; }
    std::uint64_t* tags() const { return tags_; }

  private:
    PyObject* stack_values_[kStackRegs];
    std::uint64_t stack_tags_[kStackRegs + 1];
    PyObject** values_ = nullptr;
    std::uint64_t* tags_ = nullptr;
    bool pooled_ = false;
};

// dict_get_pure's second half (no hint hit: a real lookup of a str key in a table of str keys),
// out of line; the first half inlined into every op that reads a dict. With the whole of it
// inline in each op that uses it, GCC 12 stopped inlining it into the program's loop once the
// settling fetches had ops of their own (W3 +14% instructions, callgrind).
[[gnu::noinline]] PyObject* dict_lookup_str(PyObject* d, PyObject* key) {
    if (!PyUnicode_CheckExact(key) || !dict_has_only_str_keys(d)) return nullptr;
    PyObject* v = PyDict_GetItemWithError(d, key);
    if (v == nullptr) PyErr_Clear();  // cannot raise for str keys; be safe
    return v;
}

/// dict_get_pure, its hinted read (dict_get_hinted) inline.
[[gnu::always_inline]] inline PyObject* pure_dict_get(PyObject* d, PyObject* key, Py_ssize_t* hint) {
    if (g_dict_hints_enabled) {
        auto* mp = reinterpret_cast<layout::Dict*>(d);
        if (PyObject* v = layout::lookup(mp->ma_keys, layout::split_values(mp->ma_values), key, hint))
            return v;
    }
    return dict_lookup_str(d, key);
}

// Whether a lookup of a built-in key in `d` compares only built-in keys: a table of exact str
// keys (any other built-in key answers "not equal" to a str without calling anything), or a small
// general table scanned for keys of built-in types. False when a user key's __eq__ may run.
bool builtin_lookup(PyObject* d, PyObject* key) {
    if (!builtin_key(key)) return false;
    if (dict_has_only_str_keys(d)) return true;
    constexpr Py_ssize_t kScanLimit = 64;
    if (PyDict_GET_SIZE(d) > kScanLimit) return false;
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(d, &pos, &k, &v))
        if (!builtin_key(k)) return false;
    return true;
}

// d[key] without user code: 1 found (*out borrowed), 0 absent, -1 undecidable that way (a key
// of a user type in the table, or as the key: CPython's lookup, which may call its __eq__, must
// decide).
int pure_dict_find(PyObject* d, PyObject* key, Py_ssize_t* hint, PyObject** out) {
    if ((*out = pure_dict_get(d, key, hint)) != nullptr) return 1;
    if (PyUnicode_CheckExact(key) && dict_has_only_str_keys(d)) return 0;
    if (!builtin_lookup(d, key)) return -1;
    *out = PyDict_GetItemWithError(d, key);
    if (*out != nullptr) return 1;
    if (PyErr_Occurred()) {
        PyErr_Clear();  // cannot raise for these keys; be safe
        return -1;
    }
    return 0;
}

// `key in d` without user code: 1/0, or -1 when that cannot be decided that way.
int pure_dict_contains(PyObject* d, PyObject* key) {
    if (!builtin_lookup(d, key)) return -1;
    const int r = PyDict_Contains(d, key);
    if (r < 0) {
        PyErr_Clear();  // cannot raise for these keys; be safe
        return -1;
    }
    return r;
}

// An ambient built-in probe decided natively (interpreter probes, torch's through the adapter).
bool probe_holds(const RuntimeGuard& g) {
    const auto p = static_cast<core::BuiltinProbe>(g.n);
    if (core::builtin_probe_reads_framework(p)) return torch_probe_pure(g);
    return builtin_probe(p) == g.n2;
}

// The saved-tensor-hooks probe when its stack is not empty (rare). Out of line and cold: the
// call would otherwise cost the pass's hot code registers.
[[gnu::noinline, gnu::cold]] bool probe_holds_cold(const RuntimeGuard& g) { return probe_holds(g); }

// ALIAS / NO_ALIAS from the registers of the nodes behind its slots. Out of line and cold.
[[gnu::noinline]] bool relation_in_registers(const RuntimeGuard& g, PyObject* const* regs,
                                             const std::uint32_t* nodes, std::size_t n) {
    // The common cases without the per-thread buffers (two thread-local lookups per guard): an
    // ALIAS pair (`a is b`, as torch's OBJECT_ALIASING), a NO_ALIAS of up to kStackDistinct
    // sources (torch's NO_TENSOR_ALIASING over a model's tensors), its values gathered on the
    // stack.
    if (g.kind == core::GuardKind::Alias) return n == 2 && regs[nodes[0]] == regs[nodes[1]];
    if (g.kind == core::GuardKind::NoAlias && n <= kStackDistinct) {
        PyObject* local[kStackDistinct];
        for (std::size_t i = 0; i < n; ++i) local[i] = regs[nodes[i]];
        std::vector<PyObject*> unused;  // all_distinct reaches for it beyond kStackDistinct only
        return all_distinct(local, n, unused);
    }
    thread_local std::vector<PyObject*> values, sorted;
    values.resize(n);
    for (std::size_t i = 0; i < n; ++i) values[i] = regs[nodes[i]];
    return relation_holds(g.kind, values.data(), n, sorted, g.n);
}

// DICT_KEYS on a split table or equal-but-distinct keys: compared in place (PyDict_Next and
// constant comparisons: no user code, no allocation). Out of line and cold: the call would
// otherwise cost the whole loop registers on every check.
[[gnu::noinline, gnu::cold]] bool dict_keys_in_place(const RuntimeGuard& g, PyObject* v) {
    const int m = eval_guard(g, v);
    if (m < 0) PyErr_Clear();
    return m == 1;
}

}  // namespace

void set_fast_pass_enabled(bool on) { g_fast_pass_enabled = on; }

void GuardSet::record_path_failure(std::uint32_t ni) {
    if (active_ != 1) return;  // a nested check never reorders (the outer one iterates the order)
    for (;;) {
        const core::Node& n = program_.nodes[ni];
        std::uint32_t* order;
        std::uint32_t begin, end;
        if (n.is_root) {
            order = root_order_.data();
            begin = 0;
            end = static_cast<std::uint32_t>(root_order_.size());
        } else {
            const core::Node& p = program_.nodes[n.parent];
            order = child_order_.data();
            begin = p.child_begin;
            end = p.child_end;
        }
        std::uint32_t k = begin;
        while (k < end && order[k] != ni) ++k;
        if (k < end && core::record_failure(order, node_fails_.data(), begin, k) != k) ++order_changes_;
        if (n.is_root) return;
        ni = n.parent;
    }
}

void GuardSet::hold_path(Pass& p, std::uint32_t ni) {
    p.tags[nodes_.size()] = kNoTag;  // the globals dict's slot
    // One allocation for the whole path (pushing one by one regrew the vector several times).
    if (ni != ~0U) p.held.reserve(p.held.size() + program_.nodes[ni].depth + 1);
    while (ni != ~0U) {
        Py_INCREF(p.r[ni]);
        p.held.push_back(p.r[ni]);
        p.tags[ni] = kNoTag;
        const core::Node& n = program_.nodes[ni];
        ni = n.is_root ? ~0U : n.parent;
    }
}

void GuardSet::hold_relational(Pass& p, std::size_t op_index) {
    // Before user code runs: a strong reference to every relational source read so far by the
    // pass (its fetch op comes before this residue), so that the relation is decided on the
    // objects the check read, which user code can neither free nor replace at the same
    // address. Sources inside residue subtrees are recorded by the walk itself (record_members).
    if (rel_scratch_ == nullptr) return;
    for (std::size_t s = 0; s < rel_fetch_op_.size(); ++s) {
        if (rel_scratch_[s] == nullptr && rel_fetch_op_[s] < op_index)
            rel_scratch_[s] = Py_NewRef(p.r[rel_nodes_[s]]);
    }
}

bool GuardSet::relational_sources_held() const {
    for (std::size_t s = 0; s < rel_slots_.size(); ++s)
        if (rel_scratch_[s] != nullptr) return true;
    return false;
}

void GuardSet::relational_after_residues(Pass& p) {
    // Sources read after the last residue are still borrowed and valid (no user code since):
    // take them too, then decide every relational guard from the slots, as the walk does.
    for (std::size_t s = 0; s < rel_fetch_op_.size(); ++s) {
        if (rel_scratch_[s] == nullptr) rel_scratch_[s] = Py_NewRef(p.r[rel_nodes_[s]]);
    }
    if (eval_relational(rel_scratch_) != 1) p.result = 0;
}

bool GuardSet::after_residue(Pass& p, int rr) {
    p.ran_user_code = true;
    tw_key_memo_reset(&p.key_memo);  // user code may have entered or left a dispatch-key guard
    if (rr != 1) {
        p.result = rr;
        return false;
    }
    if (state_->invalid) {  // before any later identity comparison
        p.result = 0;
        return false;
    }
    return true;
}

void GuardSet::decide_shape_in_pass(Pass& p, core::shape::ShapeFrame& frame) {
    if (!p.ran_user_code) {
        // Nothing ran: only a sure pass is taken here. A failing relation, an int64 overflow or
        // (a bug) an unread symbol leaves the check to the walk, which re-reads every symbol and
        // decides exactly, counting the failure, on the same objects.
        if (!all_symbols_read(frame) ||
            core::shape::run_fast(program_.shape, frame) != core::shape::kShapePass)
            p.result = kUndecided;
        return;
    }
    // A residue ran user code: the walk cannot start over (user code would run twice). The
    // symbols were copied into the frame as read, so decide here, exactly, as the walk would.
    p.result = decide_shape(frame);
}

void GuardSet::fail(Pass& p, std::uint32_t ni, std::uint32_t guard_pos) {
    // A claim made optimistically at this node's fetch or stamp did not hold up.
    withdraw_claims(ni);
    if (!p.ran_user_code) {
        p.result = kUndecided;  // nothing ran: the walk decides, on the same objects
        return;
    }
    p.result = 0;
    if (guard_pos != ~0U) {
        const NodeRt& n = nodes_[ni];
        if (active_ == 1 && core::record_failure(guard_order_.data(), guard_fails_.data(), n.guard_begin,
                                                 guard_pos) != guard_pos)
            ++order_changes_;
    }
    record_path_failure(ni);
}

std::uint32_t GuardSet::child_pos(const FastOp& op) const {
    using Code = FastOp::Code;
    if (op.code != Code::SettleDictItemStamp && op.code != Code::SettleItemStamp &&
        op.code != Code::SettleAttrStamp)
        return op.pos;
    // Never a root (a dict item has a parent); the program is the current order's.
    const core::Node& parent = program_.nodes[op.parent];
    std::uint32_t k = parent.child_begin;
    while (k < parent.child_end && child_order_[k] != op.node) ++k;
    return k;
}

std::size_t GuardSet::slow_subtree(Pass& p, const FastOp& op) {
    p.slow_guards += nodes_[op.node].subtree_guards;
    // None of the subtree's in-line ops runs (its fetch, read before any claim, included): the
    // guards their claims would prove are not the skip's.
    const auto i = static_cast<std::size_t>(&op - fast_ops_.data());
    p.skipped -= claim_prefix_[op.skip] - claim_prefix_[i];
    if (!p.allow_user_code) {
        p.result = kUndecided;
        return fast_end_;  // the End op
    }
    int rr;
    const bool is_root = program_.nodes[op.node].is_root;
    hold_relational(p, op_order(op));
    hold_path(p, is_root ? ~0U : op.parent);
    {
        const UserCodeWindow window;
        rr = is_root ? eval_root(op.pos, p.locals) : eval_child(op.parent, child_pos(op), p.r[op.parent]);
    }
    if (!after_residue(p, rr)) {
        if (rr == 0 && !is_root) record_path_failure(op.parent);
        return fast_end_;  // the End op
    }
    return op.skip;
}

bool GuardSet::slow_guard(Pass& p, const FastOp& op) {
    ++p.slow_guards;
    // Evaluated with user code, or not at all (no user code allowed): no claim on this node's
    // state or value may stand on it. A claim is made before the guards it covers run, so one
    // left standing here would let a later check jump over a guard that was never decided.
    withdraw_claims(op.node);
    if (!p.allow_user_code) {
        p.result = kUndecided;
        return false;
    }
    hold_relational(p, op_order(op));
    hold_path(p, op.node);
    int rr;
    {
        const UserCodeWindow window;
        rr = eval_guard_at(op.node, op.pos, p.r[op.node]);
    }
    if (!after_residue(p, rr)) {
        if (rr == 0) record_path_failure(op.node);
        return false;
    }
    return true;
}

bool GuardSet::slow_ambient(Pass& p, const FastOp& op) {
    ++p.slow_guards;
    if (!p.allow_user_code) {
        p.result = kUndecided;
        return false;
    }
    hold_relational(p, op_order(op));
    hold_path(p, ~0U);
    int rr;
    {
        const UserCodeWindow window;
        rr = eval_ambient(op.pos, op.pos + 1, p.locals);
    }
    return after_residue(p, rr);
}

int GuardSet::fast_pass(const Locals& locals, bool allow_user_code) {
    // A set without SHAPE relations pays nothing for them: no frame on the stack (its inline
    // registers are ~800 bytes, and the compiler zeroes an optional one on every run), no scope.
    if (!program_.shape.empty()) return fast_pass_with_shapes(locals, allow_user_code);
    return allow_user_code ? run_program<true>(locals, nullptr) : run_program<false>(locals, nullptr);
}

int GuardSet::fast_pass_with_shapes(const Locals& locals, bool allow_user_code) {
    // This run's SHAPE symbols, current for the whole run: residue subtrees (the walk's code)
    // store theirs here too, and a check nested in a residue's user code gets a frame of its own.
    core::shape::ShapeFrame frame(program_.shape);
    const ShapeScope scope(&frame);
    return allow_user_code ? run_program<true>(locals, &frame) : run_program<false>(locals, &frame);
}

// One instantiation per mode: without user code (check_without_user_code) no residue can run,
// so the bookkeeping for residues (active_, held references) compiles away.
template <bool kUserCode>
int GuardSet::run_program(const Locals& locals, core::shape::ShapeFrame* const sf) {
    using Code = FastOp::Code;
    const RegisterFile file(nodes_.size());
    // Version tags read by Stamp ops in this check, per node (slot n_nodes: the globals dict);
    // kNoTag: no usable tag (never equal to a claim: claims are 0 or real tags). Cleared along the path
    // whenever a residue runs (user code may mutate the dicts), so a claim is only made or used with no user
    // code between the tag read and it.
    Pass ps{locals, file.values(), file.tags(), {}, kUserCode};
    tw_key_memo_reset(&ps.key_memo);
    ps.skipped = claim_prefix_[fast_end_];  // every claim held, less each miss (claim_prefix_)
    PyObject** const r = ps.r;
    std::uint64_t* const tags = ps.tags;
    const std::size_t globals_slot = nodes_.size();
    int rel_held = -1;  // relational_sources_held() once a residue ran; -1: not asked
    // Relational slots (strong references) are only needed once a residue may run user code:
    // the set's own, or fresh ones for a check nested in user code run by another check.
    PyObject** const outer_scratch = rel_scratch_;
    std::vector<PyObject*> nested_slots;
    if constexpr (kUserCode) {
        ++active_;
        if (!rel_slots_.empty()) {
            if (active_ == 1) {
                rel_scratch_ = rel_slots_.data();
            } else {
                nested_slots.assign(rel_slots_.size(), nullptr);
                rel_scratch_ = nested_slots.data();
            }
        }
    }
    {
        const NoUserCodeRegion region("the fast pass");
        const FastOp* const ops = fast_ops_.data();
        // Local copies: stores through the registers could alias the members for the compiler.
        NodeRt* const nodes = nodes_.data();
        const RuntimeGuard* const guards = guards_.data();
        // The claims too (settled fetches and stamps read one each): the memo vectors are rebuilt
        // only with the program, which active_ excludes while it runs.
        FetchMemo* const fetch_memos = fetch_memos_.data();
        StateMemo* const state_memos = state_memos_.data();
        // The skip (docs/cpp.md, "Skipping unchanged subtrees"). A fetch whose parent's dict is in
        // the state of this node's claim reads the claimed value: the same live object (the dict
        // holds it), on which the identity-implied guards that follow held.
        // A hit counts nothing: ps.skipped starts from every claim holding (claim_prefix_), and
        // a miss takes its block's guards off where the block is entered (`into_block`).
        auto settled = [fetch_memos, r, tags](const FastOp& op) {
            // No test for "no tag": kNoTag equals no claim, and no claim (0) equals no tag.
            if (tags[op.parent] != fetch_memos[op.memo].parent_tag) return false;
            const FetchMemo& m = fetch_memos[op.memo];
            r[op.node] = m.value;
            return true;
        };
        auto into_block = [ops, &ps](const FastOp& op) {
            ps.skipped -= op.jumped;
            return ops + op.jump;
        };
        // After a fetch from the dict the tag was read from, with no user code since: claim the
        // value. Made before the identity-implied guards run (out of line, at op.jump); fail()
        // withdraws it if one fails.
        auto claim = [fetch_memos, tags](const FastOp& op, PyObject* v) {
            const std::uint64_t t = tags[op.parent];
            if (t == kNoTag) return;
            FetchMemo& m = fetch_memos[op.memo];
            m.parent_tag = t;
            m.value = v;
        };
        // A stamp (Stamp, FetchDictStamp) that read tag `t` of its node's dict: the op to run
        // after it, `next` when its claim holds.
        // `memo`: the op's state memo slot (op.memo; a Settle*Stamp's op.pos).
        auto stamp = [ tags, state_memos, &into_block ](const FastOp& op, std::uint32_t memo, std::uint64_t t,
                                                        const FastOp* next) __attribute__((always_inline)) {
            tags[op.node] = t;
            StateMemo& m = state_memos[memo];
            // Never with kNoTag (no claim is made with it). This state was proved: its
            // state-implied guards hold.
            if (t == m.tag) return next;
            // Claimed before the state-implied guards run (out of line); a failing one (fail())
            // or one evaluated with user code (slow_guard) withdraws it. No tag: the state-implied
            // guards are evaluated, and nothing is claimed.
            if (t != kNoTag) m.tag = t;
            return into_block(op);
        };
        // An instance `__dict__` (FetchDict, FetchDictStamp): an exact dict that already exists,
        // read from the object's slot, or null (the walk's fetch decides). Only for a type the
        // walk has seen with the standard `__dict__` (and not a class, whose `__dict__` is not an
        // instance dict). A managed dict is read inline (existing_instance_dict's first case,
        // without its call: one per module per check).
        auto instance_dict = [ r, nodes ](const FastOp& op) __attribute__((always_inline))->PyObject* {
            PyObject* p = r[op.parent];
            PyTypeObject* tp = Py_TYPE(p);
            const AttrCache& ic = nodes[op.node].step.cache;
            if (!attr_cache_valid(ic, tp) || ic.mode != AttrCache::Mode::InstanceDict || PyType_Check(p))
                return nullptr;
            PyObject* d = (tp->tp_flags & Py_TPFLAGS_MANAGED_DICT) != 0 ? materialised_managed_dict(p)
                                                                        : existing_instance_dict(p);
            return d != nullptr && PyDict_CheckExact(d) ? d : nullptr;
        };
        // The fast forms of the fetches, shared by a fetch and its settling twin (inlined into
        // both). An attribute through the inline cache, or null: a stale cache, a class
        // attribute, a property, __getattr__, a slot, or missing (the walk's fetch decides, and
        // refills the cache).
        // `*unclaimed`: the value is not the parent dict's (a forwarding class __getattr__ gave
        // it, fetch.hpp), so no claim on that dict's tag may stand for it.
        auto attr_value =
            [ r, nodes ](const FastOp& op, bool* unclaimed) __attribute__((always_inline))->PyObject* {
            NodeRt& n = nodes[op.node];
            PyObject* p = r[op.parent];
            PyTypeObject* tp = Py_TYPE(p);
            AttrCache& ic = n.step.cache;
            // attr_cache_valid, spelled out: with the helper GCC 12 compiled this loop
            // into one that costs 2-12% more instructions per check (callgrind).
            if (ic.type == tp && ic.version != 0 && ic.version == type_version(tp)) {
                if (ic.mode == AttrCache::Mode::InstanceDict)
                    return instance_attr_hinted(p, n.step.operand, &ic.hint);
                if (ic.mode == AttrCache::Mode::Module && PyModule_Check(p)) {  // a module subclass too
                    // A forwarding class __getattr__ first: its proof covers the dict's miss.
                    if (PyObject* v = forwarded_module_attr(p, n.step.operand)) {
                        *unclaimed = true;
                        return v;
                    }
                    PyObject* md = module_dict(p);
                    return md != nullptr ? pure_dict_get(md, n.step.operand, &ic.hint) : nullptr;
                }
                if (ic.mode == AttrCache::Mode::FunctionField) return function_field(p, n.step.operand);
                if (ic.mode == AttrCache::Mode::Member) {
                    // A slot of the object, not an entry of its dict: no dict tag proves it.
                    *unclaimed = true;
                    return member_slot(p, ic.hint);  // empty: the walk decides (None or an error)
                }
            }
            // An instance `__dict__`, a cell's contents, a class attribute: out of line (inlined
            // here, they cost every check of the real models up to 0.5% more instructions).
            return rare_attr_value(ic, p, n.step.operand, unclaimed);
        };
        // An item of a dict, list or tuple: false when a key, table or container of a user type
        // needs CPython's lookup (a residue subtree); else *v is the item, or null (missing).
        auto item_value = [ r, nodes ](const FastOp& op, PyObject** v) __attribute__((always_inline)) {
            NodeRt& n = nodes[op.node];
            PyObject* p = r[op.parent];
            if (PyDict_CheckExact(p))  // the hint matches keys by identity: no __eq__ runs
                return pure_dict_find(p, n.step.operand, &n.step.cache.hint, v) >= 0;
            if ((PyList_CheckExact(p) || PyTuple_CheckExact(p)) && n.step.int_key) {
                Py_ssize_t k = n.step.index;  // the key, converted once at build
                const Py_ssize_t size = Py_SIZE(p);
                if (k < 0) k += size;
                if (k >= 0 && k < size)
                    *v = PyList_CheckExact(p) ? PyList_GET_ITEM(p, k) : PyTuple_GET_ITEM(p, k);
                return true;
            }
            return false;  // __getitem__ of another type
        };
        // A dict item (`X.__dict__[k]` & co.): as item_value, a non-dict parent is missing.
        auto dict_item_value = [ r, nodes ](const FastOp& op, PyObject** v) __attribute__((always_inline)) {
            NodeRt& n = nodes[op.node];
            PyObject* p = r[op.parent];
            return !PyDict_Check(p) || pure_dict_find(p, n.step.operand, &n.step.cache.hint, v) >= 0;
        };
        // A step that never runs user code nor allocates, or null (missing, or an owned result,
        // which would need a reference we do not keep).
        auto pure_value = [ r, nodes ](const FastOp& op) __attribute__((always_inline))->PyObject* {
            if (nodes[op.node].step.kind == core::StepKind::WeakrefCall)  // an RNN's flat weights
                if (PyObject* target = weakref_referent(r[op.parent])) return target;
            Fetched f = fetch_step(nodes[op.node].step, r[op.parent]);
            if (f.status != FetchStatus::Ok || f.owned) {
                if (f.owned) Py_DECREF(f.value);
                if (f.status == FetchStatus::Error) PyErr_Clear();
                return nullptr;
            }
            return f.value;
        };
        // The program ends with an End op: no bounds check per op. `next` is the op to run next.
        const FastOp* const end = ops + fast_end_;
        // Direct threading: each op's code ends by jumping straight to the next op's (one
        // indirect jump per op, no loop counter); `break` inside an op's do/while leaves it.
        // What a fetch's read found: a value; nothing (the guard fails, as the walk would); or a case
        // only the walk decides (user code could run, or an unusual type).
        enum class Read : std::uint8_t { Value, Missing, Walk };
// One fetch handler in its plain form (SETTLE false) or its settling form (true). The settling
// form skips a fetch its claim proves unchanged, and after a fresh read claims the value and jumps
// over the guards the claim proves (they sit out of line, after End). One body keeps the two the
// same; the plain form carries no claim test, which is why they are separate op codes. READ sets
// `v` and yields a Read.
#define TW_FETCH_OP(LABEL, SETTLE, READ)       \
    LABEL:                                     \
    do {                                       \
        const FastOp& op = *opp;               \
        next = opp + 1;                        \
        if constexpr (SETTLE) {                \
            if (settled(op)) break;            \
        }                                      \
        PyObject* v = nullptr;                 \
        bool unclaimed = false;                \
        const Read got = READ;                 \
        if (got == Read::Walk) {               \
            next = ops + slow_subtree(ps, op); \
            break;                             \
        }                                      \
        if (got == Read::Missing) {            \
            fail(ps, op.node, ~0U);            \
            next = end;                        \
            break;                             \
        }                                      \
        r[op.node] = v;                        \
        if constexpr (SETTLE) {                \
            if (!unclaimed) claim(op, v);      \
            next = into_block(op);             \
        }                                      \
    } while (false);                           \
    opp = next;                                \
    TW_DISPATCH();
// SettleDictItem's fetch in its fused forms (SettleDictItemStamp, SettleDictItemTypeIs), which
// have no block of their own (`jumped` is not counted): settled, or read and claimed. A read only
// the walk decides, or a missing item (the check fails, as the walk would), sets `next` and
// leaves the op's do/while, as TW_FETCH_OP does. A macro, not a lambda: the lambda's returned
// pointer cost gpt ~350 instructions a check.
#define TW_SETTLE_DICT_ITEM(OP)                \
    if (!settled(OP)) {                        \
        PyObject* v = nullptr;                 \
        if (!dict_item_value(OP, &v)) {        \
            next = ops + slow_subtree(ps, OP); \
            break;                             \
        }                                      \
        if (v == nullptr) {                    \
            fail(ps, (OP).node, ~0U);          \
            next = end;                        \
            break;                             \
        }                                      \
        r[(OP).node] = v;                      \
        claim(OP, v);                          \
    }
// A settling fetch fused with its node's Stamp (SettleItemStamp, SettleAttrStamp): the fetch as
// TW_FETCH_OP's settling form, whose identity-implied guards sit in the stamp's block (`jumped` is
// the stamp's), then the stamp as Stamp's on the value, settled or read. One dispatch and one
// register read fewer per such node per check.
#define TW_SETTLE_STAMP_OP(LABEL, READ)                                                             \
    LABEL:                                                                                          \
    do {                                                                                            \
        const FastOp& op = *opp;                                                                    \
        next = opp + 1;                                                                             \
        PyObject* v = nullptr;                                                                      \
        if (settled(op)) {                                                                          \
            v = r[op.node];                                                                         \
        } else {                                                                                    \
            bool unclaimed = false;                                                                 \
            const Read got = READ;                                                                  \
            if (got == Read::Walk) {                                                                \
                next = ops + slow_subtree(ps, op);                                                  \
                break;                                                                              \
            }                                                                                       \
            if (got == Read::Missing) {                                                             \
                fail(ps, op.node, ~0U);                                                             \
                next = end;                                                                         \
                break;                                                                              \
            }                                                                                       \
            r[op.node] = v;                                                                         \
            if (!unclaimed) claim(op, v);                                                           \
        }                                                                                           \
        PyObject* d = PyDict_CheckExact(v) ? v : PyModule_CheckExact(v) ? module_dict(v) : nullptr; \
        next = stamp(op, op.pos, d != nullptr ? pass_tag(d) : kNoTag, next);                        \
    } while (false);                                                                                \
    opp = next;                                                                                     \
    TW_DISPATCH();
#define TW_DISPATCH() \
    goto* kDispatch[static_cast<std::size_t>(opp->code)]  // NOLINT(bugprone-macro-parentheses)
        static void* const kDispatch[] = {&&op_LoadLocal,
                                          &&op_LoadGlobal,
                                          &&op_LoadClosure,
                                          &&op_FetchAttr,
                                          &&op_FetchItem,
                                          &&op_FetchDictItem,
                                          &&op_FetchDict,
                                          &&op_FetchFunction,
                                          &&op_FetchCode,
                                          &&op_FetchPure,
                                          &&op_SettleAttr,
                                          &&op_SettleItem,
                                          &&op_SettleDictItem,
                                          &&op_SettlePure,
                                          &&op_TypeIs,
                                          &&op_IdIs,
                                          &&op_IsNone,
                                          &&op_IsNotNone,
                                          &&op_IsTrue,
                                          &&op_IsFalse,
                                          &&op_Equals,
                                          &&op_EqualsPython,
                                          &&op_DictKeys,
                                          &&op_DictContains,
                                          &&op_LengthExact,
                                          &&op_DictVersion,
                                          &&op_WeakrefAlive,
                                          &&op_CodeIs,
                                          &&op_BuiltinProbe,
                                          &&op_TorchGlobalState,
                                          &&op_TorchNoSavedHooks,
                                          &&op_TorchNoModes,
                                          &&op_TorchNoDevice,
                                          &&op_Stamp,
                                          &&op_StampGlobals,
                                          &&op_FetchDictStamp,
                                          &&op_LeafRun,
                                          &&op_RunClaim,
                                          &&op_Resume,
                                          &&op_SlowGuard,
                                          &&op_SlowAmbient,
                                          &&op_Symbol,
                                          &&op_TensorProp,
                                          &&op_TensorMatch,
                                          &&op_ArrayMatch,
                                          &&op_DimensionMarking,
                                          &&op_HasAttr,
                                          &&op_SetContains,
                                          &&op_DispatchKeySetMatch,
                                          &&op_Relational,
                                          &&op_SettleDictItemStamp,
                                          &&op_SettleDictItemTypeIs,
                                          &&op_TensorMatchMarking,
                                          &&op_SettleItemStamp,
                                          &&op_SettleAttrStamp,
                                          &&op_FetchMethodFunc,
                                          &&op_End};
        static_assert(sizeof(kDispatch) / sizeof(kDispatch[0]) == static_cast<std::size_t>(Code::End) + 1,
                      "one entry per FastOp::Code, in order");
        const FastOp* opp = ops;
        const FastOp* next = ops;
        TW_DISPATCH();
    op_LoadLocal:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            NodeRt& n = nodes[op.node];
            PyObject* v;
            if (locals.is_arguments()) {
                if constexpr (kUserCode) {
                    v = locals.argument(n.root.name, &n.root.slot);
                } else {
                    v = locals.argument_hot(n.root.name, &n.root.slot);
                }
            } else {
                if (!PyDict_Check(locals.mapping)) {
                    next = ops + slow_subtree(ps, op);  // a mapping's __getitem__ is user code
                    break;
                }
                v = pure_dict_get(locals.mapping, n.root.name, &n.root.hint);
            }
            if (v == nullptr) {
                fail(ps, op.node, ~0U);
                next = end;
                break;
            }
            r[op.node] = v;
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_LoadGlobal:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            if (op.settle && settled(op)) break;
            NodeRt& n = nodes[op.node];
            PyObject* v = globals_ ? pure_dict_get(globals_.get(), n.root.name, &n.root.hint) : nullptr;
            if (v == nullptr) {
                if (globals_ && !dict_has_only_str_keys(globals_.get())) {
                    next = ops + slow_subtree(ps, op);  // a user-typed key in the globals: CPython's lookup
                } else {
                    fail(ps, op.node, ~0U);
                    next = end;
                }
                break;
            }
            r[op.node] = v;
            if (op.settle) {
                claim(op, v);
                next = into_block(op);
            }
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_LoadClosure:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            const NodeRt& n = nodes[op.node];
            if (n.root.cell == nullptr || PyCell_GET(n.root.cell) == nullptr) {
                fail(ps, op.node, ~0U);
                next = end;
                break;
            }
            r[op.node] = PyCell_GET(n.root.cell);
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
        TW_FETCH_OP(op_FetchAttr, false,
                    (v = attr_value(op, &unclaimed)) != nullptr ? Read::Value : Read::Walk)
        TW_FETCH_OP(op_SettleAttr, true,
                    (v = attr_value(op, &unclaimed)) != nullptr ? Read::Value : Read::Walk)
        TW_FETCH_OP(op_FetchItem, false,
                    !item_value(op, &v) ? Read::Walk
                    : v != nullptr      ? Read::Value
                                        : Read::Missing)
        TW_FETCH_OP(op_SettleItem, true,
                    !item_value(op, &v) ? Read::Walk
                    : v != nullptr      ? Read::Value
                                        : Read::Missing)
        TW_FETCH_OP(op_FetchDictItem, false,
                    !dict_item_value(op, &v) ? Read::Walk
                    : v != nullptr           ? Read::Value
                                             : Read::Missing)
        TW_FETCH_OP(op_SettleDictItem, true,
                    !dict_item_value(op, &v) ? Read::Walk
                    : v != nullptr           ? Read::Value
                                             : Read::Missing)
    op_FetchDict:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            PyObject* d = instance_dict(op);
            if (d == nullptr) {
                next = ops + slow_subtree(ps, op);  // not created yet, or an unusual type: the walk decides
                break;
            }
            r[op.node] = d;
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_FetchDictStamp:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            PyObject* d = instance_dict(op);
            if (d == nullptr) {
                next = ops + slow_subtree(ps, op);  // as FetchDict: the subtree's end is past the stamp
                break;
            }
            r[op.node] = d;
            next = stamp(op, op.memo, pass_tag(d), next);  // an exact dict (instance_dict)
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_FetchFunction:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            // A function's own fields (the interpreter's structure, borrowed); anything
            // else that answers to `__code__` & co. runs its own getattr.
            PyObject* p = r[op.parent];
            NodeRt& n = nodes[op.node];
            PyObject* kw = PyFunction_Check(p) ? PyFunction_GET_KW_DEFAULTS(p) : nullptr;
            if (!PyFunction_Check(p) ||
                (n.step.kind == core::StepKind::KwDefaults &&
                 (kw == nullptr || !PyDict_Check(kw) || !dict_has_only_str_keys(kw)))) {
                next = ops + slow_subtree(ps, op);
                break;
            }
            Fetched f = fetch_step(n.step, p);
            if (f.status != FetchStatus::Ok || f.owned) {
                if (f.owned) Py_DECREF(f.value);  // never for functions: borrowed fields
                if (f.status == FetchStatus::Error) PyErr_Clear();
                fail(ps, op.node, ~0U);
                next = end;
                break;
            }
            r[op.node] = f.value;
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_FetchCode:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            // A function's code object (never null: its setter refuses deletion), borrowed; anything
            // else answering `__code__` runs its own getattr (the walk's fetch).
            PyObject* p = r[op.parent];
            if (!PyFunction_Check(p)) {
                next = ops + slow_subtree(ps, op);
                break;
            }
            r[op.node] = PyFunction_GET_CODE(p);
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
        // Steps that never run user code nor allocate (type, weakref target, dict key or value by
        // position): nothing found fails the guard, as the walk would.
        TW_FETCH_OP(op_FetchPure, false, (v = pure_value(op)) != nullptr ? Read::Value : Read::Missing)
        TW_FETCH_OP(op_SettlePure, true, (v = pure_value(op)) != nullptr ? Read::Value : Read::Missing)
    op_TypeIs:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            if (reinterpret_cast<PyObject*>(Py_TYPE(r[op.node])) != op.a) goto failed;
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_IdIs:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            if (r[op.node] != op.a) goto failed;
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_IsNone:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            if (r[op.node] != Py_None) goto failed;
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_IsNotNone:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            if (r[op.node] == Py_None) goto failed;
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_IsTrue:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            if (r[op.node] != Py_True) goto failed;
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_IsFalse:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            if (r[op.node] != Py_False) goto failed;
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_Equals:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            PyObject* v = r[op.node];
            if (v == op.a) break;  // the constant itself (NaN included, by the catalogue's rule)
            if (Py_TYPE(v) != Py_TYPE(op.a)) goto failed;
            // Structural and type-exact on built-in constants: no user __eq__ runs.
            const int m = equals_match(v, op.a);
            if (m != 1) {
                if (m < 0) PyErr_Clear();
                goto failed;
            }
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_EqualsPython:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            const int m = python_equals_pure(r[op.node], op.a);
            if (m == 1) break;
            if (m == 0) goto failed;
            if (!slow_guard(ps, op)) next = end;  // an element's own __eq__ must answer
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_DictKeys:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            PyObject* v = r[op.node];
            PyObject* keys = guards[op.guard].b;
            if (!PyDict_Check(v) || PyDict_GET_SIZE(v) != PyTuple_GET_SIZE(keys)) goto failed;
            if (dict_keys_identical(v, keys) == 1) break;  // the same key objects, in order
            if (!dict_keys_in_place(guards[op.guard], v)) goto failed;
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_DictContains:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            PyObject* v = r[op.node];
            if (!PyDict_Check(v)) goto failed;
            const int m = pure_dict_contains(v, op.a);
            if (m < 0) {
                if (!slow_guard(ps, op)) next = end;  // a key of a user type: its __eq__/__hash__
                break;
            }
            if ((m == 1) != guards[op.guard].flag) goto failed;
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_LengthExact:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            Py_ssize_t n = 0;
            if (!builtin_length(r[op.node], n)) {
                if (!slow_guard(ps, op)) next = end;  // a user __len__
                break;
            }
            if (n != guards[op.guard].n) goto failed;
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_CodeIs:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            PyObject* v = r[op.node];
            if (!PyFunction_Check(v)) {
                if (!slow_guard(ps, op)) next = end;  // `__code__` of another type: its getattr
                break;
            }
            if (PyFunction_GET_CODE(v) != op.a) goto failed;
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_DictVersion:
    op_WeakrefAlive:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            const int m = eval_guard(guards[op.guard], r[op.node]);
            if (m != 1) {
                if (m < 0) PyErr_Clear();
                goto failed;
            }
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_BuiltinProbe:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            // Not holding, or not decidable natively: the walk's code decides in place.
            if (!probe_holds(guards[op.guard]) && !slow_ambient(ps, op)) next = end;
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_TorchGlobalState:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            if (!torch_global_state_holds(op.a) && !slow_ambient(ps, op)) next = end;
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_TorchNoSavedHooks:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            // An empty stack holds (torch's probe reads None); anything else goes the probe's way.
            PyObject* pack = nullptr;
            PyObject* unpack = nullptr;
            if (torch_adapter()->saved_tensors_hooks_top(&pack, &unpack) != 0 &&
                !probe_holds_cold(guards[op.guard]) && !slow_ambient(ps, op))
                next = end;
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_TorchNoModes:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            // An empty stack holds (the snapshot is ()); anything else goes the probe's way.
            if (torch_adapter()->function_mode_stack_len() != 0 && !probe_holds_cold(guards[op.guard]) &&
                !slow_ambient(ps, op))
                next = end;
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_TorchNoDevice:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            // No default device holds (the snapshot is None); a device, or a namespace that cannot
            // be read without user code, goes the probe's way.
            if (!torch_default_device_none() && !probe_holds_cold(guards[op.guard]) && !slow_ambient(ps, op))
                next = end;
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_Stamp:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            PyObject* v = r[op.node];
            PyObject* d = PyDict_CheckExact(v) ? v : PyModule_CheckExact(v) ? module_dict(v) : nullptr;
            next = stamp(op, op.memo, d != nullptr ? pass_tag(d) : kNoTag, next);
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_StampGlobals:
        do {
            next = opp + 1;
            tags[globals_slot] = pass_tag(globals_.get());
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_LeafRun:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            // The node's dict is in the state of its run claim (read by its Stamp this check, no
            // user code since): every child of the run yields the value it yielded then, on which
            // all its guards (identity-implied) held. Nothing later reads their registers.
            // No test for "no tag": a run claim is never kNoTag (RunClaim).
            // Its leaves' claims count as holding (claim_prefix_): nothing to add.
            if (tags[op.node] == state_memos[op.memo].run_tag) next = ops + op.jump;
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_RunClaim:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            // A tag here (not kNoTag) means no residue ran since the node's Stamp read it (every
            // residue below the node forgets the tags of its path, this node's included), so each
            // child of the run was settled or fetched under this tag and passed all its guards.
            const std::uint64_t t = tags[op.node];
            if (t != kNoTag) state_memos[op.memo].run_tag = t;
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_Resume:
        next = ops + opp->jump;
        opp = next;
        TW_DISPATCH();
    op_SlowGuard:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            if (!slow_guard(ps, op)) next = end;
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_SlowAmbient:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            if (!slow_ambient(ps, op)) next = end;
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_Symbol:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            // Copied by value into the frame (nothing borrowed is kept); a value of another type
            // fails the relations that read it, so the check (as in the walk).
            if (!store_symbol(*sf, op.guard, nodes[op.node].symbol_type, r[op.node])) goto failed;
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_TensorProp:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            // The C-level reader answers for the exact types whose methods it reproduces, without
            // running or allocating anything; anything else (no reader, a subclass, a missing
            // dimension, a node with guards or children) is a residue subtree: the walk's fetch.
            const TensorPropertyReader read = tensor_property_reader();
            const RuntimeStep& step = nodes[op.node].step;
            std::int64_t value = 0;
            if (op.guard == core::kNoSymbol || read == nullptr ||
                read(r[op.parent], step.kind, step.index, &value) != PropertyRead::Value) {
                next = ops + slow_subtree(ps, op);
                break;
            }
            sf->set_int(op.guard, value);
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_TensorMatch:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            // Not decided without user code (not the adapter's tensor, a mismatch): the walk's
            // code decides in place, which also names the failure.
            // The record first (one line of ours); the RuntimeGuard only when it does not decide.
            if (!tensor_match_record(static_cast<const std::int64_t*>(op.hot), r[op.node], ps.key_memo) &&
                !tensor_match_pure(guards[op.guard], r[op.node], ps.key_memo) && !slow_guard(ps, op))
                next = end;
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_ArrayMatch:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            if (!array_match_pure(guards[op.guard], r[op.node]) && !slow_guard(ps, op)) next = end;
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_DimensionMarking:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            const auto* mc = static_cast<const MarkingCache*>(op.hot);
            if (!dimension_marking_quick(&mc->names, mc->absent, r[op.node]) &&
                !dimension_marking_pure(guards[op.guard], r[op.node], false) && !slow_guard(ps, op))
                next = end;
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_HasAttr:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            // An attribute certainly absent (no class defines it, the object's storage lacks it,
            // and no __getattr__ or a registered one that misses: dict_getattr.hpp) makes
            // NO_HASATTR hold without calling hasattr. Anything else (present, undecidable, a
            // stale cache, which only the walk fills, or a HASATTR that would fail here) is
            // evaluated in place by the walk's code.
            const RuntimeGuard& g = guards[op.guard];
            if ((g.flag ||
                 !attribute_certainly_absent(g.absence->attr, g.absence->absent, r[op.node], g.a, false)) &&
                !slow_guard(ps, op))
                next = end;
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_SetContains:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            // Decided here only when it holds; a failure or an undecided set runs in place.
            if (set_contains_pure(guards[op.guard], r[op.node]) != 1 && !slow_guard(ps, op)) next = end;
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_DispatchKeySetMatch:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            // The adapter reads the set's C++ value and the thread-local sets: no user code, no
            // allocation, so the pass decides every value (a non-key-set fails).
            if (dispatch_key_set_match(guards[op.guard], r[op.node]) != 1) goto failed;
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_Relational:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            if constexpr (kUserCode) {
                // Asked once per check (the relational ops are consecutive, at the end).
                if (ps.ran_user_code && rel_held < 0) rel_held = relational_sources_held() ? 1 : 0;
                if (ps.ran_user_code && rel_held == 1) {
                    // A residue ran user code after a relational source was read (or read one
                    // itself): registers read before it may be dead (and their addresses
                    // reused). Decide every relational guard from the strong references taken
                    // before each residue and by the walk (relational_after_residues). With no
                    // reference taken, every source was read by the pass after the last residue,
                    // with no user code since: the registers are the objects the check read.
                    relational_after_residues(ps);
                    next = end;  // every relational guard is decided there
                    break;
                }
            }
            const std::uint32_t base = rel_base_[op.guard];
            const std::size_t n = program_.guards[op.guard].more_sources.size() + 1;
            const std::uint32_t* const rel = rel_nodes_.data() + base;
            // An ALIAS pair (`a is b`, torch's OBJECT_ALIASING and the importer's: most of a
            // model's relational guards) in line: the out-of-line call costs more than the compare.
            if (guards[op.guard].kind == core::GuardKind::Alias && n == 2) {
                if (r[rel[0]] != r[rel[1]]) goto relation_failed;
                break;
            }
            if (!relation_in_registers(guards[op.guard], r, rel, n)) goto relation_failed;
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_SettleDictItemStamp:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            // The fetch (its claim made before the guards, which all sit in the stamp's block),
            // then the stamp as Stamp's on the value, settled or read: one dispatch and one
            // register read fewer per such dict per check.
            TW_SETTLE_DICT_ITEM(op);
            PyObject* v = r[op.node];
            PyObject* d = PyDict_CheckExact(v) ? v : PyModule_CheckExact(v) ? module_dict(v) : nullptr;
            next = stamp(op, op.pos, d != nullptr ? pass_tag(d) : kNoTag, next);
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_SettleDictItemTypeIs:
        do {
            const FastOp& op = *opp;
            next = opp + 1;  // the TypeIs op, which fails (or passes) as in the walk
            TW_SETTLE_DICT_ITEM(op);
            // A mutable class: compared on every check, settled or not (`__class__` assignment).
            if (reinterpret_cast<PyObject*>(Py_TYPE(r[op.node])) == op.next_type) next = opp + 2;
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_TensorMatchMarking:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            PyObject* v = r[op.node];
            if (!tensor_match_record(static_cast<const std::int64_t*>(op.hot), v, ps.key_memo)) {
                // As op_TensorMatch; the DimensionMarking op, next, then runs on its own.
                if (!tensor_match_pure(guards[op.guard], v, ps.key_memo) && !slow_guard(ps, op)) next = end;
                break;
            }
            // The record matched, so Py_TYPE(v) is the type it names: the marking's type facts
            // are one compare. Unmarked: the DimensionMarking op holds too, and is skipped.
            if (dimension_marking_unmarked(*static_cast<const MarkingCache*>(opp[1].hot), v)) next = opp + 2;
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
        TW_SETTLE_STAMP_OP(op_SettleItemStamp, !item_value(op, &v) ? Read::Walk
                                               : v != nullptr      ? Read::Value
                                                                   : Read::Missing)
        TW_SETTLE_STAMP_OP(op_SettleAttrStamp,
                           (v = attr_value(op, &unclaimed)) != nullptr ? Read::Value : Read::Walk)
    op_FetchMethodFunc:
        do {
            const FastOp& op = *opp;
            next = opp + 1;
            NodeRt& n = nodes[op.node];
            PyObject* f = method_function(n.step.cache, r[op.parent], n.step.operand);
            if (f == nullptr) {
                next = ops + slow_subtree(ps, op);  // the walk binds the method and reads `__func__`
                break;
            }
            r[op.node] = f;
            r[op.guard] = f;
            break;
        } while (false);
        opp = next;
        TW_DISPATCH();
    op_End:
        // Every symbol was read (no jump passes over a Symbol or TensorProp op): the relations.
        if (sf != nullptr && ps.result == 1) decide_shape_in_pass(ps, *sf);
        goto done;
    failed:
        fail(ps, opp->node, opp->pos);
        goto done;
    relation_failed:
        // A relational guard is no node's guard: it has no claim to withdraw and no place in a
        // node's guard order or a path's (fail() would index them with an op that names none).
        // Nothing ran: the walk decides and names the failure; after user code, the check fails.
        ps.result = ps.ran_user_code ? 0 : kUndecided;
#undef TW_DISPATCH
#undef TW_FETCH_OP
#undef TW_SETTLE_DICT_ITEM
#undef TW_SETTLE_STAMP_OP
    done:;
    }
    int result = ps.result;
    if constexpr (kUserCode) {
        // Outside the region: dropping the references may run finalizers, which may kill an
        // object the set names by identity. Slots are released while this check still counts
        // as active, so that a finalizer that checks this set again gets slots of its own.
        if (!rel_slots_.empty()) {
            for (std::size_t i = 0; i < rel_slots_.size(); ++i) {
                PyObject* o = rel_scratch_[i];
                rel_scratch_[i] = nullptr;
                Py_XDECREF(o);
            }
            rel_scratch_ = outer_scratch;
        }
        --active_;
        for (PyObject* o : ps.held) Py_DECREF(o);
    }
    if (result == 1 && state_->invalid) result = 0;
    if (result == kUndecided) return result;
    ++stats_.checks;
    if (result == 1) {
        ++stats_.passes;
        ++(ps.ran_user_code ? stats_.residue_passes : stats_.fast_passes);
        stats_.last_slow_guards = ps.slow_guards;
        stats_.last_skipped_guards = ps.skipped;
    }
    return result;
}

}  // namespace tripwire::runtime
