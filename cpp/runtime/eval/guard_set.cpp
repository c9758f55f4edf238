// tripwire/cpp/runtime/eval/guard_set.cpp -- the evaluator: check() and the tree walk.
//
// The walk is the authority on every check: user code, errors, strict mode, failure counts and
// the adaptive order. The fast program (fast_pass.cpp) runs first and calls back into the walk's
// per-guard and per-node evaluation for its residues. Building a set is guard_set_setup.cpp;
// the diagnostics (why_not's full walk, explain's tree) are guard_set_explain.cpp.
#include "runtime/eval/guard_set.hpp"

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <unordered_map>

#include "core/fail_order.hpp"
#include "runtime/eval/dict_hint.hpp"
#include "runtime/eval/no_user_code.hpp"
#include "runtime/eval/relational.hpp"
#include "runtime/eval/shape_symbols.hpp"
#include "runtime/tensors/readers.hpp"
#include "runtime/tensors/tensor_kinds.hpp"
#include "runtime/tensors/torch_state.hpp"

namespace tripwire::runtime {

int GuardSet::on_error(std::uint32_t ni) {
    // KeyboardInterrupt, SystemExit and friends are never turned into a failed guard.
    if (!PyErr_ExceptionMatches(PyExc_Exception)) return -1;
    if (!strict_ || !eval_error_type_) {
        PyErr_Clear();
        return 0;
    }
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    const std::string where = ni < program_.nodes.size() ? program_.nodes[ni].text : std::string("f_locals");
    // Keep our own reference to the original exception: take_error_text consumes the error.
    Py_XINCREF(value);
    PyErr_Restore(type, value, tb);
    const std::string cause = take_error_text();
    PyErr_Format(eval_error_type_.get(), "guard evaluation raised at %s: %s", where.c_str(), cause.c_str());
    if (value != nullptr) {
        // Chain the original exception as __cause__ so the user sees its traceback.
        PyObject *t2, *v2, *tb2;
        PyErr_Fetch(&t2, &v2, &tb2);
        PyErr_NormalizeException(&t2, &v2, &tb2);
        if (v2 != nullptr) {
            PyException_SetCause(v2, value);  // steals our reference
        } else {
            Py_DECREF(value);
        }
        PyErr_Restore(t2, v2, tb2);
    }
    return -1;
}

Fetched GuardSet::fetch_root(std::uint32_t ni, const Locals& locals) {
    return runtime::fetch_root(nodes_[ni].root, locals, globals_.get());
}

Fetched GuardSet::fetch_node(std::uint32_t ni, PyObject* parent) {
    return fetch_step(nodes_[ni].step, parent);
}

// One guard of a node's range, as the walk evaluates it. The common identity and type kinds are
// decided inline; the rest go through eval_guard. A failure is counted (adaptive order).
int GuardSet::eval_guard_at(std::uint32_t ni, std::uint32_t k, PyObject* v) {
    const RuntimeGuard& g = guards_[guard_order_[k]];
    int r;
    switch (g.kind) {
        case core::GuardKind::TypeMatch: r = reinterpret_cast<PyObject*>(Py_TYPE(v)) == g.a; break;
        case core::GuardKind::IdMatch: r = v == g.a; break;
        case core::GuardKind::None: r = v == Py_None; break;
        case core::GuardKind::True: r = v == Py_True; break;
        case core::GuardKind::False: r = v == Py_False; break;
        case core::GuardKind::EqualsMatch:
            // A constant held weakly (an enum member) may have been freed by user code run
            // earlier in this walk; the set is invalid then, so fail without touching it.
            if (state_->invalid) {
                r = 0;
            } else if (v == g.a) {
                r = 1;  // the constant itself: equal (NaN included, by the catalogue's rule)
            } else if (Py_TYPE(v) != Py_TYPE(g.a)) {
                r = 0;
            } else {
                r = g.flag ? python_equals(v, g.a) : equals_match(v, g.a);
            }
            break;
        default: r = eval_guard(g, v); break;
    }
    if (r == 1) return 1;
    if (r < 0 && on_error(ni) < 0) return -1;
    const NodeRt& n = nodes_[ni];
    if (active_ == 1 && core::record_failure(guard_order_.data(), guard_fails_.data(), n.guard_begin, k) != k)
        ++order_changes_;
    return 0;
}

// The guards of one node.
inline int GuardSet::eval_guards(std::uint32_t ni, PyObject* v) {
    const NodeRt& n = nodes_[ni];
    // A SHAPE symbol: its value goes into this check's frame (check() set the scope); a value of
    // another type fails the relations that read it, so the check.
    if (n.symbol != core::kNoSymbol &&
        !store_symbol(*ShapeScope::current()->frame, n.symbol, n.symbol_type, v))
        return 0;
    for (std::uint32_t k = n.guard_begin; k < n.guard_end; ++k) {
        const int r = eval_guard_at(ni, k, v);
        if (r != 1) return r;
    }
    if (n.member_begin != n.member_end) record_members(ni, v);
    return 1;
}

void GuardSet::record_members(std::uint32_t ni, PyObject* v) {
    const NodeRt& n = nodes_[ni];
    for (std::uint32_t m = n.member_begin; m < n.member_end; ++m) {
        const core::Member& mb = program_.node_members[m];
        PyObject*& slot = rel_scratch_[rel_base_[mb.guard] + mb.slot];
        // A strong reference: user code later in the walk may drop the source's own reference,
        // and a new object at the same address must not look like the same object.
        if (slot == nullptr) slot = Py_NewRef(v);
    }
}

int GuardSet::eval_relational(PyObject* const* slots) {
    for (std::uint32_t gi : program_.relational) {
        const std::size_t n = program_.guards[gi].more_sources.size() + 1;
        PyObject* const* values = slots + rel_base_[gi];
        bool complete = true;
        for (std::size_t i = 0; i < n; ++i) complete = complete && values[i] != nullptr;
        if (complete && relation_holds(guards_[gi].kind, values, n, rel_sort_, guards_[gi].n)) continue;
        if (guard_fails_[gi] != 0xFFFFFFFFu) ++guard_fails_[gi];
        return 0;
    }
    return 1;
}

int GuardSet::eval_child(std::uint32_t ni, std::uint32_t k, PyObject* v) {
    const std::uint32_t ci = child_order_[k];
    NodeRt& c = nodes_[ci];
    Fetched f;
    // Fast path: a plain instance attribute read through the inline cache and entry hint.
    AttrCache& ic = c.step.cache;
    PyObject* hv = nullptr;
    if (c.step.kind == core::StepKind::Attr && ic.mode == AttrCache::Mode::InstanceDict &&
        attr_cache_valid(ic, Py_TYPE(v))) {
        hv = instance_attr_hinted(v, c.step.operand, &ic.hint);
    }
    if (hv != nullptr) {
        f = {hv, false, FetchStatus::Ok};
    } else {
        f = fetch_step(c.step, v);
    }
    int r = 0;
    if (f.status == FetchStatus::Ok) {
        // A borrowed value stays valid only if nothing below can run user code that could
        // drop the parent's reference to it.
        if (!f.owned && !c.borrow_ok) {
            Py_INCREF(f.value);
            f.owned = true;
        }
        if (f.owned) {
            r = c.child_begin == c.child_end ? eval_guards(ci, f.value) : eval_node(ci, f.value);
            Py_DECREF(f.value);
        } else {
            const NoUserCodeRegion region("a borrowed subtree of the tree walk");
            r = c.child_begin == c.child_end ? eval_guards(ci, f.value) : eval_node(ci, f.value);
        }
    } else if (f.status == FetchStatus::Error) {
        r = on_error(ci);
    }
    if (r == 0 && active_ == 1 &&
        core::record_failure(child_order_.data(), node_fails_.data(), nodes_[ni].child_begin, k) != k)
        ++order_changes_;
    return r;
}

int GuardSet::eval_node(std::uint32_t ni, PyObject* v) {
    int r = eval_guards(ni, v);
    if (r != 1) return r;
    const NodeRt& n = nodes_[ni];
    for (std::uint32_t k = n.child_begin; k < n.child_end; ++k) {
        r = eval_child(ni, k, v);
        if (r != 1) return r;
    }
    return 1;
}

int GuardSet::eval_root(std::uint32_t k, const Locals& locals) {
    const std::uint32_t ni = root_order_[k];
    Fetched f = fetch_root(ni, locals);
    int r = 0;
    if (f.status == FetchStatus::Ok) {
        if (!f.owned && !nodes_[ni].borrow_ok) {
            Py_INCREF(f.value);
            f.owned = true;
        }
        if (f.owned) {
            r = eval_node(ni, f.value);
            Py_DECREF(f.value);
        } else {
            const NoUserCodeRegion region("a borrowed subtree of the tree walk");
            r = eval_node(ni, f.value);
        }
    } else if (f.status == FetchStatus::Error) {
        r = on_error(ni);
    }
    if (r == 0 && active_ == 1 && core::record_failure(root_order_.data(), node_fails_.data(), 0, k) != k) {
        ++order_changes_;
    }
    return r;
}

int GuardSet::eval_ambient(std::size_t begin, std::size_t end, const Locals& locals) {
    // A LAMBDA on f_locals needs a mapping: build one from bound arguments only then.
    Ref mapping;
    if (ambient_reads_locals_) {
        mapping = locals.as_mapping();
        if (!mapping) return on_error(core::kNoNode);
    }
    for (std::size_t k = begin; k < end; ++k) {
        const int r = eval_guard(guards_[program_.ambient[k]], mapping ? mapping.get() : Py_None);
        if (r == 1) continue;
        return r < 0 ? on_error(core::kNoNode) : 0;
    }
    return 1;
}

int GuardSet::check_without_user_code(const Locals& locals) {
    if (state_->invalid || !fast_enabled_ || !fast_pass_enabled() || foreign_to(locals)) return 0;
    // Rebuilt after the tree walk reordered, so that its fail-fast order carries over.
    if (fast_built_at_ != order_changes_) build_fast_pass();
    // Without user code the program either passes or stays undecided (it never decides a
    // failure: that needs a residue to have run). The flag is re-read inside, after the pass.
    return fast_pass(locals, false) == 1 ? 1 : 0;
}

bool GuardSet::all_symbols_read(const core::shape::ShapeFrame& frame) const {
    for (std::size_t s = 0; s < program_.shape.n_symbols(); ++s)
        if (frame.state(static_cast<std::uint32_t>(s)) == core::shape::SymbolState::Unread) return false;
    return true;
}

int GuardSet::decide_shape(core::shape::ShapeFrame& frame) {
    // Every symbol's source is read before the relations run (the walk visits every node of a
    // passing check; the fast program stores each symbol outside every jump of the skip). A
    // symbol left unread would be a bug: never a pass on it (run_fast would read a stale register).
    if (!all_symbols_read(frame)) return 0;
    const std::int32_t failing = core::shape::first_failing(program_.shape, frame);
    if (failing < 0) return 1;
    std::uint32_t& fails = relation_fails_[static_cast<std::uint32_t>(failing)];
    if (fails != 0xFFFFFFFFu) ++fails;
    return 0;
}

int GuardSet::check(const Locals& locals) {
    if (state_->invalid) return 0;
    // Before the fast pass, whose residues run user code: a foreign set never passes.
    if (foreign_to(locals)) {
        ++stats_.checks;
        return 0;
    }
    if (fast_enabled_ && fast_pass_enabled()) {
        if (fast_built_at_ != order_changes_) build_fast_pass();
        const int r = fast_pass(locals, true);
        if (r != kUndecided) return r;
        // A guard failed or a value is missing, and no user code ran: the walk decides, from
        // the start, on the same objects.
    }
    // A set without SHAPE relations pays nothing for them (no frame on the stack, no scope).
    if (program_.shape.empty()) return walk(locals, nullptr);
    return walk_with_shapes(locals);
}

int GuardSet::walk_with_shapes(const Locals& locals) {
    // SHAPE symbols are stored by the walk into this check's own frame (see ShapeScope).
    core::shape::ShapeFrame frame(program_.shape);
    const ShapeScope scope(&frame);
    return walk(locals, &frame);
}

int GuardSet::walk(const Locals& locals, core::shape::ShapeFrame* const frame) {
    ++stats_.checks;
    ++active_;
    int result = 1;
    // The relational guards' slots: the set's own, or fresh ones for a check nested in user code
    // run by another check of this set (which is still using its slots).
    PyObject** const outer_scratch = rel_scratch_;
    std::vector<PyObject*> nested_slots;
    if (!rel_slots_.empty()) {
        if (active_ == 1) {
            rel_scratch_ = rel_slots_.data();
        } else {
            nested_slots.assign(rel_slots_.size(), nullptr);
            rel_scratch_ = nested_slots.data();
        }
    }
    if (!program_.ambient.empty()) result = eval_ambient(0, program_.ambient.size(), locals);
    for (std::uint32_t k = 0; result == 1 && k < root_order_.size(); ++k) result = eval_root(k, locals);
    // Every source was read and every symbol stored: the relations, once, after the walk.
    if (result == 1 && frame != nullptr) result = decide_shape(*frame);
    if (!rel_slots_.empty()) {
        if (result == 1) result = eval_relational(rel_scratch_);
        // Released while this check still counts as active, so that a finalizer that checks this
        // set again gets slots of its own.
        for (std::size_t i = 0; i < rel_slots_.size(); ++i) {
            PyObject* o = rel_scratch_[i];
            rel_scratch_[i] = nullptr;
            Py_XDECREF(o);
        }
        rel_scratch_ = outer_scratch;
    }
    --active_;
    // User code run by this check may have killed a guarded object and put a new one at its
    // address before a later identity comparison: never report a pass in that case.
    if (result == 1 && state_->invalid) result = 0;
    if (result == 1) ++stats_.passes;
    return result;
}

}  // namespace tripwire::runtime
