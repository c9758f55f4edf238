// tripwire/cpp/runtime/eval/guard_set_explain.cpp -- what a built GuardSet tells explain and why_not.
//
// The full walk of why_not (every failing guard, in installation order, with the value it saw),
// the tree in its current adaptive order, and the reader facts explain prints. Diagnostics only,
// never on a check: they reuse the walk's fetches and guard evaluation (guard_set.cpp) and keep
// their own strong references, so that they may run user code freely.
#include "runtime/eval/guard_set.hpp"

#include <algorithm>
#include <optional>

#include "core/fail_order.hpp"
#include "runtime/eval/dict_hint.hpp"
#include "runtime/eval/no_user_code.hpp"
#include "runtime/eval/relational.hpp"
#include "runtime/eval/shape_symbols.hpp"
#include "runtime/tensors/readers.hpp"
#include "runtime/tensors/tensor_kinds.hpp"
#include "runtime/tensors/torch_state.hpp"

namespace tripwire::runtime {

std::vector<TreeRow> GuardSet::tree() const {
    std::vector<TreeRow> out;
    out.reserve(program_.nodes.size());
    std::vector<std::uint32_t> stack(root_order_.rbegin(), root_order_.rend());
    while (!stack.empty()) {
        const std::uint32_t ni = stack.back();
        stack.pop_back();
        const core::Node& n = program_.nodes[ni];
        TreeRow row;
        row.depth = n.depth;
        row.text = n.text;
        row.symbol = n.symbol == core::kNoSymbol ? -1 : static_cast<std::int64_t>(n.symbol);
        row.node_fails = node_fails_[ni];
        for (std::uint32_t k = n.guard_begin; k < n.guard_end; ++k) {
            const std::uint32_t gi = guard_order_[k];
            row.guard_ids.push_back(program_.guards[gi].id);
            row.guard_fails.push_back(guard_fails_[gi]);
        }
        out.push_back(std::move(row));
        for (std::uint32_t k = n.child_end; k-- > n.child_begin;) stack.push_back(child_order_[k]);
    }
    return out;
}

std::vector<std::uint32_t> GuardSet::ambient_ids() const {
    std::vector<std::uint32_t> ids;
    for (std::uint32_t gi : program_.ambient) ids.push_back(program_.guards[gi].id);
    return ids;
}

std::vector<std::uint32_t> GuardSet::relational_ids() const {
    std::vector<std::uint32_t> ids;
    for (std::uint32_t gi : program_.relational) ids.push_back(program_.guards[gi].id);
    return ids;
}

Ref GuardSet::read_node(std::uint32_t ni, PyObject* f_locals, PyObject* globals) const {
    // The path root first; each operand is the set's own constant (a name is interned).
    std::vector<RuntimeStep> steps(program_.nodes[ni].depth);
    std::uint32_t at = ni;
    for (std::size_t k = steps.size(); k-- > 0; at = program_.nodes[at].parent) {
        const core::Step& st = program_.nodes[at].step;
        steps[k].kind = st.kind;
        steps[k].operand = st.operand == core::kNoConst ? nullptr : objs_[st.operand];
        steps[k].index = static_cast<Py_ssize_t>(st.index);
    }
    RuntimeRoot root;
    root.kind = program_.nodes[at].root;
    root.name = objs_[program_.nodes[at].root_name];
    return read_source(root, steps, Locals::of_mapping(f_locals), globals);
}

PyObject* GuardSet::constant(core::ConstId c) const {
    if (c >= holders_.size()) return nullptr;
    PyObject* h = holders_[c].get();
    if (h != objs_[c]) {  // held by weak reference
        PyObject* target = PyWeakref_GetObject(h);
        return target == Py_None ? nullptr : target;
    }
    return h;
}

bool GuardSet::record_guard_failure(std::uint32_t gi, int r, PyObject* v, std::vector<FailureRecord>& out) {
    FailureRecord rec;
    rec.guard_id = guards_[gi].id;
    rec.value = Ref::borrow(v);
    if (r < 0) {
        if (!PyErr_ExceptionMatches(PyExc_Exception)) return false;  // KeyboardInterrupt & co.
        rec.reason = take_error_text();
    }
    out.push_back(std::move(rec));
    return true;
}

bool GuardSet::visit_failures(std::uint32_t ni, Fetched f, PyObject* parent,
                              std::vector<FailureRecord>& out) {
    if (f.status == FetchStatus::Ok) {
        const Ref hold = f.owned ? Ref::steal(f.value) : Ref::borrow(f.value);
        return walk_failures(ni, hold.get(), out);
    }
    // The source could not be read: reported once, under the first-installed guard on or below it.
    FailureRecord rec;
    rec.guard_id = program_.nodes[ni].min_guard_id;
    if (f.status == FetchStatus::Error) {
        if (!PyErr_ExceptionMatches(PyExc_Exception)) return false;
        rec.reason = take_error_text();
    } else if (program_.nodes[ni].is_root) {
        rec.reason = "KeyError: " + program_.nodes[ni].text + " is not set";
    } else {
        rec.reason = describe_missing(nodes_[ni].step, parent);
    }
    // A SHAPE relation has no single source: name the one that could not be read.
    if (program_.guards[guard_index(rec.guard_id)].kind == core::GuardKind::Shape)
        rec.reason = program_.nodes[ni].text + " cannot be read (" + rec.reason + ")";
    out.push_back(std::move(rec));
    return true;
}

bool GuardSet::walk_failures(std::uint32_t ni, PyObject* v, std::vector<FailureRecord>& out) {
    const core::Node& n = program_.nodes[ni];
    if (n.symbol != core::kNoSymbol) {
        ShapeScope* scope = ShapeScope::current();
        (*scope->values)[n.symbol] = Ref::borrow(v);
        if (!store_symbol(*scope->frame, n.symbol, nodes_[ni].symbol_type, v)) {
            // Reported under the first relation that reads it; the relations reading it are
            // not evaluated (their symbol stays unread).
            out.push_back({program_.symbol_min_id[n.symbol], Ref(),
                           symbol_type_error(n.text, nodes_[ni].symbol_type, v)});
        }
    }
    for (std::uint32_t k = n.guard_begin; k < n.guard_end; ++k) {
        const std::uint32_t gi = program_.node_guards[k];  // installation order, not adaptive order
        if (guards_[gi].kind == core::GuardKind::EqualsMatch && state_->invalid) {
            out.push_back({guards_[gi].id, Ref(), state_->why});  // never dereference a dead constant
            continue;
        }
        const int r = eval_guard(guards_[gi], v);
        if (r != 1 && !record_guard_failure(gi, r, v, out)) return false;
    }
    if (diag_slots_ != nullptr) {
        for (std::uint32_t m = n.member_begin; m < n.member_end; ++m) {
            const core::Member& mb = program_.node_members[m];
            (*diag_slots_)[rel_base_[mb.guard] + mb.slot] = Ref::borrow(v);
        }
    }
    for (std::uint32_t k = n.child_begin; k < n.child_end; ++k) {
        const std::uint32_t ci = program_.children[k];
        if (!visit_failures(ci, fetch_node(ci, v), v, out)) return false;
    }
    return true;
}

void GuardSet::report_invalid(std::vector<FailureRecord>& out) const {
    out.clear();
    // The first guard that names a dead object.
    for (std::size_t gi = 0; gi < program_.guards.size() && out.empty(); ++gi) {
        const core::GuardDecl& d = program_.guards[gi];
        for (core::ConstId c : {d.operand, d.operand2}) {
            if (c != core::kNoConst && holders_[c].get() != objs_[c] && constant(c) == nullptr) {
                out.push_back({d.id, Ref(), state_->why});
                break;
            }
        }
    }
    if (out.empty()) out.push_back({program_.guards.empty() ? 0 : program_.guards[0].id, Ref(), state_->why});
}

std::uint32_t GuardSet::guard_index(std::uint32_t id) const {
    const auto it = std::lower_bound(program_.guards.begin(), program_.guards.end(), id,
                                     [](const core::GuardDecl& d, std::uint32_t x) { return d.id < x; });
    return static_cast<std::uint32_t>(it - program_.guards.begin());
}

void GuardSet::shape_failures(const core::shape::ShapeFrame& frame, const std::vector<Ref>& values,
                              std::vector<FailureRecord>& out) {
    const core::shape::ShapeProgram& sp = program_.shape;
    const std::vector<core::shape::ExactResult> results = core::shape::run_exact(sp, frame);
    for (std::uint32_t r : sp.kept) {
        // A relation with a symbol that could not be read (or had the wrong type) was reported
        // by the walk, under the first relation reading that symbol.
        if (!core::shape::relation_readable(sp, frame, r) || results[r].holds) continue;
        FailureRecord rec;
        rec.guard_id = sp.relations[r].id;
        rec.reason = relation_reason(sp, r, results[r].error, values, symbol_texts_);
        // The value is {symbol: value} for every symbol of the relation.
        PyObject* d = PyDict_New();
        if (d == nullptr) {
            PyErr_Clear();
        } else {
            for (std::uint32_t s : sp.relations[r].symbols) {
                PyObject* key = PyUnicode_FromStringAndSize(symbol_texts_[s].data(),
                                                            static_cast<Py_ssize_t>(symbol_texts_[s].size()));
                if (key == nullptr || PyDict_SetItem(d, key, values[s].get()) < 0) PyErr_Clear();
                Py_XDECREF(key);
            }
            rec.value = Ref::steal(d);
        }
        out.push_back(std::move(rec));
    }
}

bool GuardSet::failures(PyObject* f_locals, std::vector<FailureRecord>& out, bool first_only) {
    if (state_->invalid) {
        // The set can never pass again, and walking it would compare against freed constants.
        report_invalid(out);
        return true;
    }
    ++active_;
    bool fatal = false;
    {
        // The values the walk holds (relational slots, SHAPE symbols) live in this block and are
        // released at its end, before `invalid` is read below: releasing the last reference to
        // one (user code removed it from the locals) may run a finalizer that kills an object
        // the set names.
        const bool has_shape = !program_.shape.empty();
        std::optional<core::shape::ShapeFrame> frame;
        std::vector<Ref> symbol_values(program_.shape.n_symbols());
        std::optional<ShapeScope> scope;
        if (has_shape) {
            frame.emplace(program_.shape);
            scope.emplace(&*frame, &symbol_values);
        }
        std::vector<Ref> slots(rel_slots_.size());
        std::vector<Ref>* const outer_slots = diag_slots_;
        diag_slots_ = &slots;
        for (std::uint32_t gi : program_.ambient) {
            if (fatal) break;
            const int r = eval_guard(guards_[gi], f_locals);
            if (r != 1 && !record_guard_failure(gi, r, nullptr, out)) fatal = true;  // no value: not a source
        }
        for (std::uint32_t ni : program_.roots) {
            if (fatal) break;
            if (first_only && !out.empty()) {
                // Prune subtrees that cannot hold a smaller failing id than the best so far.
                std::uint32_t best = out.front().guard_id;
                for (const auto& rec : out) best = std::min(best, rec.guard_id);
                if (program_.nodes[ni].min_guard_id > best) continue;
            }
            if (!visit_failures(ni, fetch_root(ni, Locals::of_mapping(f_locals)), f_locals, out))
                fatal = true;
        }
        diag_slots_ = outer_slots;
        // Relational guards whose every source was read: their value is the tuple of those values.
        for (std::uint32_t gi : program_.relational) {
            if (fatal) break;
            const std::size_t n = program_.guards[gi].more_sources.size() + 1;
            std::vector<PyObject*> values(n, nullptr);
            bool complete = true;
            for (std::size_t i = 0; i < n; ++i) {
                values[i] = slots[rel_base_[gi] + i].get();
                complete = complete && values[i] != nullptr;
            }
            if (!complete || relation_holds(guards_[gi].kind, values.data(), n, rel_sort_, guards_[gi].n))
                continue;
            Ref tuple = Ref::steal(PyTuple_New(static_cast<Py_ssize_t>(n)));
            if (!tuple) {
                fatal = true;
                break;
            }
            for (std::size_t i = 0; i < n; ++i)
                PyTuple_SET_ITEM(tuple.get(), static_cast<Py_ssize_t>(i), Py_NewRef(values[i]));
            out.push_back({guards_[gi].id, std::move(tuple), std::string()});
        }
        if (!fatal && has_shape) shape_failures(*frame, symbol_values, out);
    }
    --active_;
    if (fatal) return false;
    // By installation order; only the first when asked (dropping the others releases their
    // values, which may run a finalizer: done before `invalid` is read).
    auto order = [&out, first_only] {
        std::stable_sort(out.begin(), out.end(), [](const FailureRecord& a, const FailureRecord& b) {
            return a.guard_id < b.guard_id;
        });
        if (first_only && out.size() > 1) out.resize(1);
    };
    order();
    // User code run by the walk may have killed a guarded object (and put a new one at its
    // address before a later identity comparison passed): check() fails such a set, so the
    // dead object is always among the failures, besides the guards that really failed. (What
    // the caller does next may run a finalizer too: it re-reads `invalid` after, see
    // bind_guard_set.cpp.)
    if (state_->invalid) {
        std::vector<FailureRecord> dead;
        report_invalid(dead);
        const bool listed = std::any_of(out.begin(), out.end(), [&](const FailureRecord& r) {
            return r.guard_id == dead.front().guard_id;
        });
        if (!listed) {
            out.push_back(std::move(dead.front()));
            order();
        }
    }
    return true;
}

}  // namespace tripwire::runtime
