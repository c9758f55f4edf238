// tripwire/cpp/runtime/eval/fast_pass_compile.cpp -- compiling the fast program of GuardSet::check.
//
// build_fast_pass() flattens the tree, in its current adaptive order, into the op stream that
// fast_pass.cpp runs (what the program is and why: that file's header): a form free of user code
// per guard (guard_op, the kind table's FAST column), the claims of the skip (implied_by,
// implied_at: docs/cpp.md, "Skipping unchanged subtrees"), the stamps, leaf runs and out-of-line
// blocks. It runs once per layout (a new set, or after the walk reorders), never per check, so it
// lives apart from the loop and its hot helpers, which stay in one translation unit.
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/guard_kind_table.hpp"
#include "runtime/eval/guard_kinds.hpp"
#include "runtime/eval/guard_set.hpp"

namespace tripwire::runtime {

GuardSet::FastOp GuardSet::guard_op(std::uint32_t ni, std::uint32_t gi, std::uint32_t pos) const {
    using Code = FastOp::Code;
    FastOp g;
    g.node = ni;
    g.guard = gi;
    g.pos = pos;
    g.a = guards_[gi].a;
    // The op is the kind table's FAST column (core/guard_kind_table.hpp): SlowGuard for a kind
    // with no form free of user code (getattr, iterator methods, predicates, Python probes), and
    // for the relational kinds and SHAPE, which are never a node's guard (program_.relational,
    // the set's relations).
    switch (guards_[gi].kind) {
#define TRIPWIRE_X(Name, value, name, source, operand, operand2, user_code, relational, implied, record, \
                   payload, fast, ...)                                                                   \
    case core::GuardKind::Name: g.code = Code::fast; break;
        TRIPWIRE_GUARD_KINDS(TRIPWIRE_X)
#undef TRIPWIRE_X
    }
    // The forms decided by the guard's own operands.
    switch (g.code) {
        case Code::Equals:
            if (guards_[gi].flag) g.code = Code::EqualsPython;
            break;
        // Read through the adapter / the array struct; a Python reader is a residue.
        case Code::TensorMatch:
            if (guards_[gi].via_python) {
                g.code = Code::SlowGuard;
            } else {
                g.hot = guards_[gi].data - 1;  // its record (tensor_records_)
            }
            break;
        case Code::ArrayMatch:
            if (guards_[gi].via_python) g.code = Code::SlowGuard;
            break;
        case Code::DimensionMarking:
            g.hot = guards_[gi].marking;  // set when binding
            break;
        default: break;
    }
    return g;
}

GuardSet::Implied GuardSet::implied_by(const RuntimeGuard& g) const {
    // The kind table's IMPLIED column (core/guard_kind_table.hpp), its conditions decided on the
    // guard's operand.
    switch (core::guard_implied(g.kind)) {
        // Identity: true of the same object forever.
        case core::Implied::Identity: return Implied::Identity;
        case core::Implied::IfImmutableType: {
            // `__class__` assignment is refused when the object's class is immutable, except
            // between module types. A mutable class (any class statement) may be swapped.
            auto* t = reinterpret_cast<PyTypeObject*>(g.a);
            const bool fixed =
                PyType_HasFeature(t, Py_TPFLAGS_IMMUTABLETYPE) && !PyType_IsSubtype(t, &PyModule_Type);
            return fixed ? Implied::Identity : Implied::Never;
        }
        // The value matched type-exactly, so it is built of the same immutable objects.
        case core::Implied::IfImmutableConstant:
            return immutable_constant(g.a) ? Implied::Identity : Implied::Never;
        // Functions of the dict's state (a str-keyed or built-in-keyed lookup, its size, keys,
        // stamp), when the node is a dict whose tag is unchanged. On any other value (a list,
        // a user __len__) the stamp never hits and they are evaluated. LENGTH's fixed-size form
        // needs the node's other guards (implied_at).
        case core::Implied::DictState:
        case core::Implied::DictStateOrFixedSize: return Implied::State;
        // The value may change behind the same object and the same dict state: a code object
        // swapped in, a referent dying, iterators advancing, attributes computed by getattr,
        // probes and predicates of anything, tensor and array metadata changed in place
        // (resize_, transpose_, arr.shape = ...), the thread's dispatch state. Relational guards
        // are decided after the walk from the values read this check, never claimed.
        case core::Implied::Never: return Implied::Never;
    }
    return Implied::Never;
}

namespace {

// Exact built-in types whose instances never change size: a LENGTH on a value that also matched
// one of them type-exactly is a fact about that object (docs/cpp.md, "Skipping unchanged
// subtrees"). list, dict, set and bytearray grow and shrink in place.
bool fixed_size_type(PyObject* t) {
    return t == reinterpret_cast<PyObject*>(&PyTuple_Type) ||
           t == reinterpret_cast<PyObject*>(&PyUnicode_Type) ||
           t == reinterpret_cast<PyObject*>(&PyBytes_Type) ||
           t == reinterpret_cast<PyObject*>(&PyFrozenSet_Type);
}

}  // namespace

GuardSet::Implied GuardSet::implied_at(std::uint32_t ni, const RuntimeGuard& g) const {
    if (core::guard_implied(g.kind) != core::Implied::DictStateOrFixedSize) return implied_by(g);
    // LENGTH alone is a function of the dict's state (an exact dict's size). On a node that also
    // carries TYPE_MATCH of a fixed-size type (identity-implied: the type is immutable), the value
    // the claim settles is the same live object on which both held: still that exact type, so
    // still that size.
    const core::Node& n = program_.nodes[ni];
    for (std::uint32_t k = n.guard_begin; k < n.guard_end; ++k) {
        const RuntimeGuard& t = guards_[program_.node_guards[k]];
        if (t.kind == core::GuardKind::TypeMatch && fixed_size_type(t.a)) return Implied::Identity;
    }
    return implied_by(g);
}

bool GuardSet::claim_op(const FastOp& op) {
    using Code = FastOp::Code;
    // The settling fetches and the stamps (fused or not): `jumped` is their block's guard count.
    // Not LeafRun (its `jumped` is its leaves' sum, counted at the leaves), not
    // SettleDictItemTypeIs (its `next_type` shares those bytes), not the guards (0).
    switch (op.code) {
        case Code::LoadGlobal: return op.settle;
        case Code::SettleAttr:
        case Code::SettleItem:
        case Code::SettleDictItem:
        case Code::SettlePure:
        case Code::Stamp:
        case Code::FetchDictStamp:
        case Code::SettleDictItemStamp:
        case Code::SettleItemStamp:
        case Code::SettleAttrStamp: return true;
        default: return false;
    }
}

namespace {

// Whether node `n` looks like a module (identity- or type-matched to one): its attribute
// children may then be settled from the module dict's tag.
bool module_like(const core::Program& p, const std::vector<RuntimeGuard>& guards, const core::Node& n) {
    for (std::uint32_t k = n.guard_begin; k < n.guard_end; ++k) {
        const RuntimeGuard& g = guards[p.node_guards[k]];
        if (g.kind == core::GuardKind::IdMatch && g.a != nullptr && PyModule_Check(g.a)) return true;
        if (g.kind == core::GuardKind::TypeMatch && g.a == reinterpret_cast<PyObject*>(&PyModule_Type))
            return true;
    }
    return false;
}

}  // namespace

void GuardSet::build_fast_pass() {
    using Code = FastOp::Code;
    fast_ops_.clear();
    // About one op per ambient guard, node fetch, node guard, symbol and stamp: reserved for a
    // set's first layout, which otherwise grows the vector several times (aligned reallocations).
    fast_ops_.reserve(program_.ambient.size() + 2 * program_.nodes.size() + program_.node_guards.size() +
                      program_.symbol_nodes.size() + 2);
    fast_built_at_ = order_changes_;
    fast_guards_ = 0;
    residue_guards_ = 0;
    const auto n_nodes = static_cast<std::uint32_t>(program_.nodes.size());
    // Ambient guards first, as the walk checks them: built-in probes are read in the pass, the
    // rest (Python probes, predicates on f_locals) are residues.
    for (std::uint32_t k = 0; k < program_.ambient.size(); ++k) {
        const std::uint32_t gi = program_.ambient[k];
        FastOp op;
        op.guard = gi;
        op.pos = k;
        const RuntimeGuard& g = guards_[gi];
        if (g.kind == core::GuardKind::GlobalState && g.a == nullptr && !g.via_python) {
            op.code = Code::BuiltinProbe;  // interpreter probes, torch's through the adapter
            if (g.n == static_cast<std::int64_t>(core::BuiltinProbe::TorchGlobalState) &&
                g.derived != nullptr) {
                // Checked on every call: straight to the adapter's comparison (no probe switch).
                op.code = Code::TorchGlobalState;
                op.a = g.derived;
            } else if (g.n == static_cast<std::int64_t>(core::BuiltinProbe::TorchSavedTensorsHooks) &&
                       g.b == Py_None) {
                op.code = Code::TorchNoSavedHooks;  // the common case: an empty hooks stack
            } else if (g.n == static_cast<std::int64_t>(core::BuiltinProbe::TorchFunctionModeStack) &&
                       g.b != nullptr && PyTuple_CheckExact(g.b) && PyTuple_GET_SIZE(g.b) == 0) {
                op.code = Code::TorchNoModes;  // the common case: no torch-function mode
            } else if (g.n == static_cast<std::int64_t>(core::BuiltinProbe::TorchDefaultDevice) &&
                       g.b == Py_None) {
                op.code = Code::TorchNoDevice;  // the common case: no default device set
            }
            ++fast_guards_;
        } else {
            op.code = Code::SlowAmbient;
            ++residue_guards_;
        }
        fast_ops_.push_back(op);
    }
    // Which nodes get a stamp: dicts (by their guards or children) and modules with attribute
    // children. Which fetches may be settled: a str-keyed item, a key or value by position, or
    // an attribute of a module, under a stamped parent; G[...] roots under the globals dict.
    auto settle_step = [&](const core::Node& c, bool parent_module) {
        switch (c.step.kind) {
            case core::StepKind::Item:
            case core::StepKind::DictItem:
                return c.step.operand != core::kNoConst && builtin_key(objs_[c.step.operand]);
            case core::StepKind::DictKey:
            case core::StepKind::DictValue: return true;
            case core::StepKind::Attr: return parent_module;
            default: return false;
        }
    };
    std::vector<bool> stamped(n_nodes, false);
    bool stamp_globals = false;
    for (std::uint32_t ni = 0; ni < n_nodes; ++ni) {
        const core::Node& n = program_.nodes[ni];
        if (n.is_root && n.root == core::RootKind::Global) stamp_globals = static_cast<bool>(globals_);
        bool dict_like = !n.is_root && n.step.kind == core::StepKind::Dict;
        for (std::uint32_t k = n.guard_begin; k < n.guard_end; ++k) {
            const RuntimeGuard& g = guards_[program_.node_guards[k]];
            if (g.kind == core::GuardKind::DictKeys || g.kind == core::GuardKind::DictContains ||
                g.kind == core::GuardKind::DictVersion ||
                (g.kind == core::GuardKind::TypeMatch && g.a == reinterpret_cast<PyObject*>(&PyDict_Type)))
                dict_like = true;
        }
        const bool module = module_like(program_, guards_, n);
        bool settles_children = false;
        for (std::uint32_t k = n.child_begin; k < n.child_end; ++k)
            settles_children = settles_children || settle_step(program_.nodes[program_.children[k]], module);
        // A value that passes its node's guards is never an exact dict or module when one of them
        // is a TYPE_MATCH or ID_MATCH to something else (a tuple whose items settle, say): its
        // stamp would read no tag on every passing check and send it through the out-of-line
        // block of its guards. No stamp, so its guards run in line and nothing settles under it
        // (fewer claims, never more).
        bool never_tagged = false;
        for (std::uint32_t k = n.guard_begin; k < n.guard_end; ++k) {
            const RuntimeGuard& g = guards_[program_.node_guards[k]];
            const bool other_type = g.kind == core::GuardKind::TypeMatch &&
                                    g.a != reinterpret_cast<PyObject*>(&PyDict_Type) &&
                                    g.a != reinterpret_cast<PyObject*>(&PyModule_Type);
            const bool other_object = g.kind == core::GuardKind::IdMatch && g.a != nullptr &&
                                      !PyDict_CheckExact(g.a) && !PyModule_CheckExact(g.a);
            never_tagged = never_tagged || other_type || other_object;
        }
        stamped[ni] = (dict_like || settles_children) && !never_tagged;
    }
    if (stamp_globals) {
        FastOp op;
        op.code = Code::StampGlobals;
        fast_ops_.push_back(op);
    }
    // Depth first in the current order: a node's fetch, its guards, then its children, as the
    // walk does. A node's guards are evaluated in three blocks, each in the current order: those
    // a settled value proves, then the stamp and those an unchanged dict proves, then the others.
    // Reordering a node's guards among themselves is the walk's own latitude (adaptive order),
    // never across nodes. The first two blocks are laid out of line, after the End op, each
    // ended by a Resume op back to the op after its fetch or stamp: a claim that holds goes on
    // to the next op, one that misses runs its block (`jump`) and returns, so the evaluation
    // order is the same, and a check of an unchanged tree reads only the ops it runs, in one
    // stream. Every index below is an index into the in-line program, except the blocks'.
    // A marker item opens (LeafRun) or closes (RunClaim) a leaf run of node `node`'s children.
    enum class Mark : std::uint8_t { None, RunBegin, RunEnd };
    struct Item {
        std::uint32_t node, parent, pos;
        Mark mark = Mark::None;
    };
    std::vector<Item> stack;
    // A child that may be part of a leaf run: fetched by a settling step from a stamped parent,
    // not stamped itself, no child, no SHAPE symbol, no relational role, and every guard fast and
    // implied by identity (so the settled fetch's jump covers all of them).
    auto run_leaf = [&](std::uint32_t ci, std::uint32_t pi) {
        const core::Node& c = program_.nodes[ci];
        if (!stamped[pi] || stamped[ci] || c.symbol != core::kNoSymbol || c.child_begin != c.child_end ||
            c.member_begin != c.member_end || c.guard_begin == c.guard_end ||
            !settle_step(c, module_like(program_, guards_, program_.nodes[pi])))
            return false;
        for (std::uint32_t k = c.guard_begin; k < c.guard_end; ++k) {
            const FastOp g = guard_op(ci, guard_order_[k], k);
            if (g.code == Code::SlowGuard || implied_at(ci, guards_[g.guard]) != Implied::Identity)
                return false;
        }
        return true;
    };
    // The node fetching `X.name.__func__` when node `n` is `X.name` with that one child and no
    // guard, symbol or relational role of its own, the child none either: its index, else ~0U.
    // The bound method is then never made (FetchMethodFunc). A child that is a symbol or a
    // relational operand keeps its own fetch op (its register is read by index), and a settling
    // fetch its claim.
    auto method_func_child = [&](const core::Node& n) -> std::uint32_t {
        if (n.is_root || n.step.kind != core::StepKind::Attr || n.guard_begin != n.guard_end ||
            n.symbol != core::kNoSymbol || n.member_begin != n.member_end || n.child_end != n.child_begin + 1)
            return ~0U;
        const std::uint32_t ci = child_order_[n.child_begin];
        const core::Node& c = program_.nodes[ci];
        if (c.step.kind != core::StepKind::Attr || c.step.operand == core::kNoConst ||
            c.symbol != core::kNoSymbol || c.member_begin != c.member_end)
            return ~0U;
        PyObject* name = objs_[c.step.operand];
        return PyUnicode_CheckExact(name) && PyUnicode_CompareWithASCIIString(name, "__func__") == 0 ? ci
                                                                                                     : ~0U;
    };
    std::vector<bool> by_parent(n_nodes, false);
    std::size_t run_at = 0;  // the open run's LeafRun op
    std::vector<Item> children;
    // The memos in the program's order: a node's fetch slot is given at its settling fetch op,
    // its state slot at its Stamp, so that the claims the program reads follow one another in
    // memory as its ops do (the others, never read by the program, come last).
    struct Slots {
        std::vector<std::uint32_t> of;
        std::uint32_t n = 0;
        std::uint32_t operator()(std::uint32_t ni) {
            if (of[ni] == ~0U) of[ni] = n++;
            return of[ni];
        }
    };
    Slots fetch_slot{std::vector<std::uint32_t>(n_nodes, ~0U)};
    Slots state_slot{std::vector<std::uint32_t>(n_nodes, ~0U)};
    std::vector<std::uint32_t> node_fetch_op(n_nodes, 0);
    for (std::uint32_t k = static_cast<std::uint32_t>(root_order_.size()); k-- > 0;)
        stack.push_back({root_order_[k], root_order_[k], k});
    // Fetch ops whose `skip` is set when their subtree is complete: (op index, node).
    std::vector<std::pair<std::size_t, std::uint32_t>> open;
    auto close_until = [&](std::uint32_t depth) {
        while (!open.empty() && program_.nodes[open.back().second].depth >= depth) {
            fast_ops_[open.back().first].skip = static_cast<std::uint32_t>(fast_ops_.size());
            open.pop_back();
        }
    };
    std::vector<FastOp> identity_ops, state_ops, other_ops;
    // The out-of-line blocks, and the ops that enter them: (op index, the block's offset).
    std::vector<FastOp> blocks;
    std::vector<std::pair<std::size_t, std::size_t>> entries;
    // The ops proved by the claim of the fetch or stamp at `from`: out of line when there are
    // any (`jump` is fixed up once the in-line program's length is known), else `jump` is the
    // next op. Each op out of line keeps its place in the order in `jump` (op_order).
    auto out_of_line = [&](std::size_t from, const std::vector<FastOp>& proved) {
        const auto back = static_cast<std::uint32_t>(from + 1);
        fast_ops_[from].jump = back;
        fast_ops_[from].jumped = static_cast<std::uint32_t>(proved.size());
        if (proved.empty()) return;
        entries.emplace_back(from, blocks.size());
        for (FastOp g : proved) {
            g.jump = back;
            blocks.push_back(g);
        }
        FastOp resume;
        resume.code = Code::Resume;
        resume.node = fast_ops_[from].node;
        resume.jump = back;
        blocks.push_back(resume);
    };
    while (!stack.empty()) {
        const Item item = stack.back();
        stack.pop_back();
        const core::Node& n = program_.nodes[item.node];
        if (item.mark != Mark::None) {
            close_until(n.depth + 1);  // the previous sibling's subtree (or the run's last leaf)
            FastOp mark;
            mark.node = item.node;
            mark.memo = state_slot(item.node);  // given at the node's Stamp, before its children
            if (item.mark == Mark::RunBegin) {
                run_at = fast_ops_.size();
                mark.code = Code::LeafRun;
                fast_ops_.push_back(mark);
                continue;
            }
            mark.code = Code::RunClaim;
            fast_ops_.push_back(mark);
            // Check what was emitted: only settling fetches of this node's children, each with its
            // whole subtree (its guards) out of line, proved by its claim. Anything else disables
            // the run's skip.
            bool ok = true;
            std::uint32_t jumped = 0;
            for (std::size_t i = run_at + 1; i + 1 < fast_ops_.size();) {
                const FastOp& f = fast_ops_[i];
                if (!f.settle || f.parent != item.node || f.skip != i + 1) {
                    ok = false;
                    break;
                }
                jumped += f.jumped;
                i = f.skip;
            }
            FastOp& run = fast_ops_[run_at];
            run.jump =
                ok ? static_cast<std::uint32_t>(fast_ops_.size()) : static_cast<std::uint32_t>(run_at + 1);
            run.jumped = ok ? jumped : 0;
            continue;
        }
        close_until(n.depth);
        // The `__func__` child of a FetchMethodFunc: its parent's op fetched it (no op of its own).
        const bool fetched_by_parent = by_parent[item.node];
        FastOp op;
        op.node = item.node;
        op.parent = item.parent;
        op.pos = item.pos;
        if (n.is_root) {
            switch (n.root) {
                case core::RootKind::Local: op.code = Code::LoadLocal; break;
                case core::RootKind::Global:
                    op.code = Code::LoadGlobal;
                    op.settle = stamp_globals;
                    op.parent = n_nodes;  // the globals dict's tag slot
                    break;
                case core::RootKind::Closure: op.code = Code::LoadClosure; break;
            }
        } else {
            switch (n.step.kind) {
                case core::StepKind::Attr: op.code = Code::FetchAttr; break;
                case core::StepKind::Item: op.code = Code::FetchItem; break;
                case core::StepKind::DictItem: op.code = Code::FetchDictItem; break;
                // Only an instance dict that already exists (creating one allocates).
                case core::StepKind::Dict: op.code = Code::FetchDict; break;
                case core::StepKind::Code: op.code = Code::FetchCode; break;
                case core::StepKind::Defaults:
                case core::StepKind::KwDefaults:
                case core::StepKind::ClosureCell: op.code = Code::FetchFunction; break;
                case core::StepKind::Type:
                case core::StepKind::WeakrefCall:
                case core::StepKind::DictKey:
                case core::StepKind::DictValue:
                case core::StepKind::TypeDict:
                case core::StepKind::TypeMro: op.code = Code::FetchPure; break;
                // A SHAPE symbol read by the C-level property reader straight into the frame.
                case core::StepKind::Size:
                case core::StepKind::Stride:
                case core::StepKind::StorageOffset: op.code = Code::TensorProp; break;
                // torch's C++ tensor accessors: never a fast form (guard kNoSymbol below), so the
                // subtree is the walk's, through the adapter.
                case core::StepKind::TensorSize:
                case core::StepKind::TensorStride:
                case core::StepKind::TensorStorageOffset:
                case core::StepKind::Grad: op.code = Code::TensorProp; break;
            }
            const core::Node& parent = program_.nodes[item.parent];
            op.settle = stamped[item.parent] && settle_step(n, module_like(program_, guards_, parent));
        }
        // A SHAPE symbol is read afresh on every check: never settled, so that no claim stands
        // in for its value (the Symbol op below is then outside every jump).
        if (n.symbol != core::kNoSymbol) op.settle = false;
        // Not for a child fetched so itself (`X.name.__func__.__func__`): it has no op to fuse.
        if (op.code == Code::FetchAttr && !op.settle && !fetched_by_parent) {
            if (const std::uint32_t ci = method_func_child(n); ci != ~0U) {
                op.code = Code::FetchMethodFunc;
                op.guard = ci;
                by_parent[ci] = true;
            }
        }
        if (op.settle) {
            switch (op.code) {
                case Code::FetchAttr: op.code = Code::SettleAttr; break;
                case Code::FetchItem: op.code = Code::SettleItem; break;
                case Code::FetchDictItem: op.code = Code::SettleDictItem; break;
                case Code::FetchPure: op.code = Code::SettlePure; break;
                default: break;  // LoadGlobal reads `settle`
            }
        }
        const std::size_t fetch_at = fetched_by_parent ? node_fetch_op[n.parent] : fast_ops_.size();
        node_fetch_op[item.node] = static_cast<std::uint32_t>(fetch_at);
        if (!fetched_by_parent) open.emplace_back(fetch_at, item.node);
        if (op.code == Code::TensorProp) {
            // The property is an int the reader does not box, so the node has no register: only
            // a node that is an int symbol and nothing else (no guard, child or relational
            // operand) has the fast form. Any other is a residue subtree on every check
            // (guard == kNoSymbol), evaluated by the walk's code, which stores its symbol.
            const bool fast_form = !core::is_cpp_tensor_step(n.step.kind) && n.symbol != core::kNoSymbol &&
                                   nodes_[item.node].symbol_type == core::shape::ValueType::Int &&
                                   n.guard_begin == n.guard_end && n.child_begin == n.child_end &&
                                   n.member_begin == n.member_end;
            op.guard = fast_form ? n.symbol : core::kNoSymbol;
            if (!fast_form) residue_guards_ += nodes_[item.node].subtree_guards;
            fast_ops_.push_back(op);
            continue;  // no guard or child ops: the walk evaluates the subtree if it has any
        }
        if (op.settle) op.memo = fetch_slot(item.node);
        if (!fetched_by_parent) fast_ops_.push_back(op);
        if (n.symbol != core::kNoSymbol) {
            // Right after the fetch, as the walk stores it before the node's guards: no settled
            // fetch (never, see above) and no stamp (it comes later) can jump over it.
            FastOp sym;
            sym.code = Code::Symbol;
            sym.node = item.node;
            sym.guard = n.symbol;
            sym.pos = ~0U;  // a failure is the node's, not one of its guards'
            fast_ops_.push_back(sym);
        }
        identity_ops.clear();
        state_ops.clear();
        other_ops.clear();
        for (std::uint32_t k = n.guard_begin; k < n.guard_end; ++k) {
            const FastOp g = guard_op(item.node, guard_order_[k], k);
            if (g.code == Code::SlowGuard) {
                ++residue_guards_;
                other_ops.push_back(g);
                continue;
            }
            ++fast_guards_;
            const Implied how = implied_at(item.node, guards_[g.guard]);
            if (how == Implied::Identity && op.settle) {
                identity_ops.push_back(g);
            } else if (how != Implied::Never && stamped[item.node]) {
                state_ops.push_back(g);
            } else {
                other_ops.push_back(g);
            }
        }
        // Only a settling fetch has identity-implied ops apart (op.settle above), right after it
        // (a symbol node never settles, so its Symbol op is never between).
        const bool fused =
            stamped[item.node] && fast_ops_.size() == fetch_at + 1 &&
            (op.code == Code::SettleDictItem || op.code == Code::SettleItem || op.code == Code::SettleAttr);
        if (!fused && !fetched_by_parent) out_of_line(fetch_at, identity_ops);
        if (fused) {
            // A stamped dict or module fetched by a settling step (a dict item, a subscript, a
            // module's attribute): one op, whose stamp's block holds the identity-implied guards
            // too, before the state-implied ones (the in-line order). An unchanged tag proves them
            // as well: it is read from the value itself (an exact dict) or from the dict of an
            // exact module (`__dict__` is read-only, and no two modules share one), so an equal
            // tag means the same live object as when the claim was made, on which every guard of
            // the block held (however the value was fetched: a forwarded module attribute, never
            // claimed on its parent, is stamped on its own dict all the same).
            fast_ops_[fetch_at].code = op.code == Code::SettleDictItem ? Code::SettleDictItemStamp
                                       : op.code == Code::SettleItem   ? Code::SettleItemStamp
                                                                       : Code::SettleAttrStamp;
            fast_ops_[fetch_at].pos = state_slot(item.node);
            identity_ops.insert(identity_ops.end(), state_ops.begin(), state_ops.end());
            out_of_line(fetch_at, identity_ops);
        } else if (stamped[item.node] && op.code == Code::FetchDict && fast_ops_.size() == fetch_at + 1) {
            // An instance `__dict__` right before its stamp (no Symbol op between; a fetch that
            // never settles has no identity block): one op, the stamp's block entered from it.
            fast_ops_[fetch_at].code = Code::FetchDictStamp;
            fast_ops_[fetch_at].memo = state_slot(item.node);
            out_of_line(fetch_at, state_ops);
        } else if (stamped[item.node]) {
            FastOp st;
            st.code = Code::Stamp;
            st.node = item.node;
            st.memo = state_slot(item.node);
            const std::size_t stamp_at = fast_ops_.size();
            fast_ops_.push_back(st);
            out_of_line(stamp_at, state_ops);
        }
        if (op.code == Code::SettleDictItem && !fused && !stamped[item.node] && identity_ops.empty() &&
            fast_ops_.size() == fetch_at + 1 && !other_ops.empty() &&
            other_ops.front().code == Code::TypeIs) {
            // Right before its node's first TypeIs, with no block of its own (`jump` is the next
            // op, `jumped` 0): the op steps over the TypeIs when the type is the expected one.
            fast_ops_[fetch_at].code = Code::SettleDictItemTypeIs;
            fast_ops_[fetch_at].next_type = other_ops.front().a;
        }
        // A TENSOR_MATCH right before the node's DIMENSION_MARKING (torch's pair for every tensor
        // input) becomes one op that decides both in the common case (an unmarked tensor); the
        // DimensionMarking op stays next, for the cases that op decides alone.
        for (std::size_t k = 0; k + 1 < other_ops.size(); ++k) {
            if (other_ops[k].code == Code::TensorMatch && other_ops[k + 1].code == Code::DimensionMarking)
                other_ops[k].code = Code::TensorMatchMarking;
        }
        fast_ops_.insert(fast_ops_.end(), other_ops.begin(), other_ops.end());
        // In evaluation order; the first maximal run of two or more leaf children between a
        // RunBegin and a RunEnd marker (one run per node: the node holds one run claim, which a
        // second run's LeafRun would read right after the first's RunClaim made it); pushed in
        // reverse so that they pop in evaluation order.
        children.clear();
        bool have_run = false;
        for (std::uint32_t k = n.child_begin; k < n.child_end;) {
            std::uint32_t e = k;
            while (e < n.child_end && run_leaf(child_order_[e], item.node)) ++e;
            const bool run = !have_run && e - k >= 2;
            have_run = have_run || run;
            if (run) children.push_back({item.node, item.node, 0, Mark::RunBegin});
            for (std::uint32_t j = k; j < e; ++j) children.push_back({child_order_[j], item.node, j});
            if (run) children.push_back({item.node, item.node, 0, Mark::RunEnd});
            if (e == k) {
                children.push_back({child_order_[k], item.node, k});
                ++e;
            }
            k = e;
        }
        for (std::size_t k = children.size(); k-- > 0;) stack.push_back(children[k]);
    }
    close_until(0);
    // The nodes the program does not fetch (below a TensorProp) last; the claims move to their
    // node's new slot, all but the run claims (a claim about the previous program's runs).
    std::vector<FetchMemo> fetch_laid(n_nodes);
    std::vector<StateMemo> state_laid(n_nodes);
    for (std::uint32_t ni = 0; ni < n_nodes; ++ni) {
        fetch_laid[fetch_slot(ni)] = fetch_memos_[fetch_slot_.empty() ? ni : fetch_slot_[ni]];
        state_laid[state_slot(ni)].tag = state_memos_[state_slot_.empty() ? ni : state_slot_[ni]].tag;
    }
    fetch_memos_.swap(fetch_laid);
    state_memos_.swap(state_laid);
    fetch_slot_.swap(fetch_slot.of);
    state_slot_.swap(state_slot.of);
    // Relational guards last, never inside a jump: every source's register is filled (or its
    // value recorded by the walk of a residue subtree) by then, and no claim ever covers them.
    for (std::uint32_t gi : program_.relational) {
        FastOp op;
        op.code = Code::Relational;
        op.guard = gi;
        op.node = 0;  // unused: a failing relation leaves the pass without fail() (relation_failed)
        fast_ops_.push_back(op);
        fast_guards_ += 1;
    }
    // SHAPE relations: decided at the End op from the frame, without user code (a symbol read
    // by a residue subtree counts among that subtree's residues, not here).
    for (const core::GuardDecl& d : program_.guards)
        if (d.kind == core::GuardKind::Shape) ++fast_guards_;
    // The fetch op of each relational slot's node, for hold_relational.
    rel_fetch_op_.assign(rel_nodes_.size(), 0);
    for (std::size_t s = 0; s < rel_nodes_.size(); ++s) rel_fetch_op_[s] = node_fetch_op[rel_nodes_[s]];
    FastOp end;
    end.code = Code::End;
    fast_end_ = static_cast<std::uint32_t>(fast_ops_.size());
    fast_ops_.push_back(end);
    claim_prefix_.assign(fast_end_ + 1, 0);
    for (std::uint32_t i = 0; i < fast_end_; ++i)
        claim_prefix_[i + 1] = claim_prefix_[i] + (claim_op(fast_ops_[i]) ? fast_ops_[i].jumped : 0);
    // The out-of-line blocks after the End op; their entries now know where they are.
    for (const auto& [from, offset] : entries)
        fast_ops_[from].jump = static_cast<std::uint32_t>(fast_ops_.size() + offset);
    fast_ops_.insert(fast_ops_.end(), blocks.begin(), blocks.end());
    fast_enabled_ = true;
}

}  // namespace tripwire::runtime
