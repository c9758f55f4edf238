// tripwire/cpp/runtime/eval/fast_pass.cpp -- the straight-line fast pass of GuardSet::check.
//
// The tree walk (guard_set.cpp) is the authority: it handles user code, errors, borrowed-value
// safety, failure statistics and adaptive reordering. Most checks of a warm guard set pass,
// though, and on built-in objects they need none of that. The fast pass is the tree flattened
// into one array of instructions (loads, fetches and guards on "registers", one per node), in the
// tree's current evaluation order, and run in one loop.
//
// Its contract is narrow so that it cannot change any result:
// - every instruction has a form that runs no user code (inline-cache hits, hinted dict reads,
//   exact built-in containers, identity and structural comparisons of built-in constants);
//   when that form does not apply to the objects at hand, the pass gives up;
// - it only ever concludes "pass". A failing guard, a missing value or a form that does not
//   apply ends it with "undecided", and check() runs the tree walk from the start. Since the
//   fast pass ran no user code and changed nothing but hints, the walk sees the same objects;
// - every value is borrowed: with no user code running, nothing can drop the references the
//   parents hold. No reference is taken, so none can leak.
// A set with a guard or step kind that has no such form at all (predicates, HASATTR, user
// __len__, generic getattr, ...) never uses the fast pass.
#include <optional>
#include <vector>

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

namespace {

bool g_fast_pass_enabled = true;

// Registers for one pass. Thread-local: the pass runs no user code, so it cannot re-enter
// itself on this thread, and other threads have their own.
thread_local std::vector<PyObject*> t_regs;

// dict[key] without user code: the hinted entry (keys compared by identity), or else a real
// lookup when both the key and every key of the table are exact str (string comparisons only).
// Null when absent or when it cannot be decided that way.
inline PyObject* pure_dict_get(PyObject* d, PyObject* key, Py_ssize_t* hint) {
    if (PyObject* v = dict_get_hinted(d, key, hint)) return v;
    if (!PyUnicode_CheckExact(key) || !dict_has_only_str_keys(d)) return nullptr;
    PyObject* v = PyDict_GetItemWithError(d, key);
    if (v == nullptr) PyErr_Clear();  // cannot raise for str keys; be safe
    return v;
}

// An ambient built-in probe decided natively (interpreter probes, torch's through the adapter).
bool probe_holds(const RuntimeGuard& g) {
    const auto p = static_cast<core::BuiltinProbe>(g.n);
    if (core::builtin_probe_reads_framework(p)) return torch_probe_pure(g);
    return builtin_probe(p) == g.n2;
}

// ALIAS / NO_ALIAS from the registers of the nodes behind its slots. Out of line and cold.
[[gnu::noinline]] bool relation_in_registers(const RuntimeGuard& g, PyObject* const* regs,
                                             const std::uint32_t* nodes, std::size_t n) {
    thread_local std::vector<PyObject*> values, sorted;
    values.resize(n);
    for (std::size_t i = 0; i < n; ++i) values[i] = regs[nodes[i]];
    return relation_holds(g.kind, values.data(), n, sorted);
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
bool fast_pass_enabled() { return g_fast_pass_enabled; }

void GuardSet::build_fast_pass() {
    fast_ops_.clear();
    fast_built_at_ = order_changes_;
    // A kind without a form free of user code: this set always takes the walk (for good: the
    // kinds never change).
    auto give_up = [this] {
        fast_enabled_ = false;
        fast_ops_.clear();
    };
    // Ambient guards: only built-in probes decided natively have a form without user code.
    for (std::uint32_t gi : program_.ambient) {
        const RuntimeGuard& g = guards_[gi];
        if (g.kind != core::GuardKind::GlobalState || g.a != nullptr || g.via_python) return give_up();
        FastOp op;
        op.code = FastOp::Code::Probe;
        op.guard = gi;
        fast_ops_.push_back(op);
    }
    // Depth first in the current order: a node's guards, then its children, as the walk does.
    struct Item {
        std::uint32_t node, parent;
    };
    std::vector<Item> stack;
    for (auto it = root_order_.rbegin(); it != root_order_.rend(); ++it) stack.push_back({*it, *it});
    while (!stack.empty()) {
        const Item item = stack.back();
        stack.pop_back();
        const core::Node& n = program_.nodes[item.node];
        FastOp op;
        op.node = item.node;
        op.parent = item.parent;
        if (n.is_root) {
            switch (n.root) {
                case core::RootKind::Local: op.code = FastOp::Code::LoadLocal; break;
                case core::RootKind::Global: op.code = FastOp::Code::LoadGlobal; break;
                case core::RootKind::Closure: op.code = FastOp::Code::LoadClosure; break;
            }
        } else {
            switch (n.step.kind) {
                case core::StepKind::Attr: op.code = FastOp::Code::FetchAttr; break;
                case core::StepKind::Item: op.code = FastOp::Code::FetchItem; break;
                case core::StepKind::DictItem: op.code = FastOp::Code::FetchDictItem; break;
                // Only an instance dict that already exists (creating one allocates).
                case core::StepKind::Dict: op.code = FastOp::Code::FetchDict; break;
                case core::StepKind::Size:
                case core::StepKind::Stride:
                case core::StepKind::StorageOffset:
                    // A SHAPE symbol and nothing else (no guard, child or relational operand, so
                    // no register is needed): the property reader stores it straight into the
                    // frame, or leaves the check to the walk (tensor_props.hpp).
                    if (n.symbol == core::kNoSymbol ||
                        nodes_[item.node].symbol_type != core::shape::ValueType::Int ||
                        n.guard_begin != n.guard_end || n.child_begin != n.child_end ||
                        n.member_begin != n.member_end)
                        return give_up();
                    op.code = FastOp::Code::TensorProp;
                    op.guard = n.symbol;
                    fast_ops_.push_back(op);
                    continue;
                default:
                    if (core::step_runs_user_code(n.step.kind)) return give_up();
                    op.code = FastOp::Code::FetchPure;
                    break;
            }
        }
        fast_ops_.push_back(op);
        if (n.symbol != core::kNoSymbol) {
            FastOp sym;
            sym.code = FastOp::Code::Symbol;
            sym.node = item.node;
            sym.guard = n.symbol;
            fast_ops_.push_back(sym);
        }
        for (std::uint32_t k = n.guard_begin; k < n.guard_end; ++k) {
            const std::uint32_t gi = guard_order_[k];
            FastOp g;
            switch (guards_[gi].kind) {
                case core::GuardKind::TypeMatch: g.code = FastOp::Code::TypeIs; break;
                case core::GuardKind::IdMatch: g.code = FastOp::Code::IdIs; break;
                case core::GuardKind::None: g.code = FastOp::Code::IsNone; break;
                case core::GuardKind::NotNone: g.code = FastOp::Code::IsNotNone; break;
                case core::GuardKind::True: g.code = FastOp::Code::IsTrue; break;
                case core::GuardKind::False: g.code = FastOp::Code::IsFalse; break;
                case core::GuardKind::EqualsMatch: g.code = FastOp::Code::Equals; break;
                case core::GuardKind::DictKeys: g.code = FastOp::Code::DictKeys; break;
                case core::GuardKind::DictContains:
                    // Only str keys have a form without user code (see the op).
                    if (!PyUnicode_CheckExact(guards_[gi].a)) return give_up();
                    g.code = FastOp::Code::DictContains;
                    break;
                case core::GuardKind::Length: g.code = FastOp::Code::LengthExact; break;
                case core::GuardKind::DictVersion: g.code = FastOp::Code::DictVersion; break;
                case core::GuardKind::WeakrefAlive: g.code = FastOp::Code::WeakrefAlive; break;
                case core::GuardKind::TensorMatch:
                case core::GuardKind::ArrayMatch:
                    if (guards_[gi].via_python) return give_up();  // a Python reader
                    g.code = guards_[gi].kind == core::GuardKind::TensorMatch ? FastOp::Code::TensorMatch
                                                                              : FastOp::Code::ArrayMatch;
                    break;
                case core::GuardKind::DimensionMarking: g.code = FastOp::Code::DimensionMarking; break;
                default: return give_up();  // runs user code, or is rare
            }
            g.node = item.node;
            g.guard = gi;
            g.a = guards_[gi].a;
            fast_ops_.push_back(g);
        }
        // Pushed in reverse so that they pop in evaluation order.
        for (std::uint32_t k = n.child_end; k > n.child_begin; --k)
            stack.push_back({child_order_[k - 1], item.node});
    }
    // Relational guards last: every node's register is filled by then.
    for (std::uint32_t gi : program_.relational) {
        FastOp op;
        op.code = FastOp::Code::Relational;
        op.guard = gi;
        fast_ops_.push_back(op);
    }
    fast_enabled_ = true;
}

int GuardSet::fast_pass(const Locals& locals) {
    if (!g_fast_pass_enabled) return 0;
    const NoUserCodeRegion region("the fast pass");
    // Small sets (the common case) keep their registers on the stack.
    constexpr std::size_t kStackRegs = 64;
    PyObject* stack_regs[kStackRegs];
    PyObject** r = stack_regs;
    if (nodes_.size() > kStackRegs) {
        std::vector<PyObject*>& regs = t_regs;
        if (regs.size() < nodes_.size()) regs.resize(nodes_.size());
        r = regs.data();
    }
    // SHAPE symbols go into a frame of this pass (on the stack for small programs); the
    // relations run on it at the end, on the fast path only: anything it cannot decide (an
    // overflow, an int beyond int64, a failing relation) hands the check to the walk.
    std::optional<core::shape::ShapeFrame> frame;
    if (!program_.shape.empty()) frame.emplace(program_.shape);
    for (const FastOp& op : fast_ops_) {
        switch (op.code) {
            case FastOp::Code::LoadLocal: {
                NodeRt& n = nodes_[op.node];
                PyObject* v;
                if (locals.is_arguments()) {
                    v = locals.argument(n.root.name, &n.root.slot);
                } else {
                    if (!PyDict_Check(locals.mapping)) return 0;
                    v = pure_dict_get(locals.mapping, n.root.name, &n.root.hint);
                }
                if (v == nullptr) return 0;
                r[op.node] = v;
                break;
            }
            case FastOp::Code::LoadGlobal: {
                NodeRt& n = nodes_[op.node];
                if (!globals_) return 0;
                PyObject* v = pure_dict_get(globals_.get(), n.root.name, &n.root.hint);
                if (v == nullptr) return 0;
                r[op.node] = v;
                break;
            }
            case FastOp::Code::LoadClosure: {
                const NodeRt& n = nodes_[op.node];
                if (n.root.cell == nullptr || PyCell_GET(n.root.cell) == nullptr) return 0;
                r[op.node] = PyCell_GET(n.root.cell);
                break;
            }
            case FastOp::Code::FetchAttr: {
                NodeRt& n = nodes_[op.node];
                PyObject* p = r[op.parent];
                PyTypeObject* tp = Py_TYPE(p);
                AttrCache& ic = n.step.cache;
                // attr_cache_valid, spelled out: with the helper GCC 12 compiled this loop into
                // one that costs 2-12% more instructions per check on bench/ W1-W3 (callgrind).
                if (ic.type != tp || ic.version == 0 || ic.version != type_version(tp)) return 0;
                PyObject* v = nullptr;
                if (ic.mode == AttrCache::Mode::InstanceDict) {
                    v = instance_attr_hinted(p, n.step.operand, &ic.hint);
                } else if (ic.mode == AttrCache::Mode::Module && PyModule_CheckExact(p)) {
                    v = pure_dict_get(PyModule_GetDict(p), n.step.operand, &ic.hint);
                }
                if (v == nullptr) return 0;
                r[op.node] = v;
                break;
            }
            case FastOp::Code::FetchItem: {
                NodeRt& n = nodes_[op.node];
                PyObject* p = r[op.parent];
                PyObject* key = n.step.operand;
                PyObject* v = nullptr;
                if (PyDict_CheckExact(p)) {
                    // The hint matches keys by identity: no __eq__ of any key runs.
                    v = pure_dict_get(p, key, &n.step.cache.hint);
                } else if ((PyList_CheckExact(p) || PyTuple_CheckExact(p)) && n.step.int_key) {
                    Py_ssize_t i = n.step.index;  // the key, converted once at build
                    const Py_ssize_t size = Py_SIZE(p);
                    if (i < 0) i += size;
                    if (i < 0 || i >= size) return 0;
                    v = PyList_CheckExact(p) ? PyList_GET_ITEM(p, i) : PyTuple_GET_ITEM(p, i);
                }
                if (v == nullptr) return 0;
                r[op.node] = v;
                break;
            }
            case FastOp::Code::FetchDictItem: {
                NodeRt& n = nodes_[op.node];
                PyObject* p = r[op.parent];
                if (!PyDict_Check(p)) return 0;
                PyObject* v = pure_dict_get(p, n.step.operand, &n.step.cache.hint);
                if (v == nullptr) return 0;
                r[op.node] = v;
                break;
            }
            case FastOp::Code::FetchDict: {
                PyObject* p = r[op.parent];
                // Only a type the walk has seen with the standard `__dict__` (and not a class,
                // whose `__dict__` is not an instance dict).
                const AttrCache& ic = nodes_[op.node].step.cache;
                if (!attr_cache_valid(ic, Py_TYPE(p)) || ic.mode != AttrCache::Mode::InstanceDict ||
                    PyType_Check(p))
                    return 0;
                PyObject* d = existing_instance_dict(p);
                if (d == nullptr || !PyDict_CheckExact(d)) return 0;
                r[op.node] = d;
                break;
            }
            case FastOp::Code::FetchPure: {
                // Steps that never run user code nor allocate (type, weakref target, dict key
                // or value by position). An owned result would need a reference we do not keep.
                Fetched f = fetch_step(nodes_[op.node].step, r[op.parent]);
                if (f.status != FetchStatus::Ok || f.owned) {
                    if (f.owned) Py_DECREF(f.value);
                    if (f.status == FetchStatus::Error) PyErr_Clear();
                    return 0;
                }
                r[op.node] = f.value;
                break;
            }
            case FastOp::Code::TypeIs:
                if (reinterpret_cast<PyObject*>(Py_TYPE(r[op.node])) != op.a) return 0;
                break;
            case FastOp::Code::IdIs:
                if (r[op.node] != op.a) return 0;
                break;
            case FastOp::Code::IsNone:
                if (r[op.node] != Py_None) return 0;
                break;
            case FastOp::Code::IsNotNone:
                if (r[op.node] == Py_None) return 0;
                break;
            case FastOp::Code::IsTrue:
                if (r[op.node] != Py_True) return 0;
                break;
            case FastOp::Code::IsFalse:
                if (r[op.node] != Py_False) return 0;
                break;
            case FastOp::Code::Equals: {
                PyObject* v = r[op.node];
                if (v == op.a) break;  // the constant itself (NaN included, by the catalogue's rule)
                if (Py_TYPE(v) != Py_TYPE(op.a)) return 0;
                // Structural and type-exact on built-in constants: no user __eq__ runs.
                const int m = equals_match(v, op.a);
                if (m != 1) {
                    if (m < 0) PyErr_Clear();
                    return 0;
                }
                break;
            }
            case FastOp::Code::DictKeys: {
                PyObject* v = r[op.node];
                PyObject* keys = guards_[op.guard].b;
                if (!PyDict_Check(v) || PyDict_GET_SIZE(v) != PyTuple_GET_SIZE(keys)) return 0;
                if (dict_keys_identical(v, keys) == 1) break;  // the same key objects, in order
                if (!dict_keys_in_place(guards_[op.guard], v)) return 0;
                break;
            }
            case FastOp::Code::DictContains: {
                // An exact str key in a table of exact str keys: string comparisons only.
                PyObject* v = r[op.node];
                if (!PyDict_Check(v) || !dict_has_only_str_keys(v)) return 0;
                const int m = PyDict_Contains(v, op.a);
                if (m < 0) {
                    PyErr_Clear();
                    return 0;
                }
                if ((m == 1) != guards_[op.guard].flag) return 0;
                break;
            }
            case FastOp::Code::LengthExact: {
                Py_ssize_t n = 0;
                if (!builtin_length(r[op.node], n) || n != guards_[op.guard].n) return 0;
                break;
            }
            case FastOp::Code::DictVersion:
            case FastOp::Code::WeakrefAlive: {
                const int m = eval_guard(guards_[op.guard], r[op.node]);
                if (m != 1) {
                    if (m < 0) PyErr_Clear();
                    return 0;
                }
                break;
            }
            case FastOp::Code::Symbol:
                if (!store_symbol(*frame, op.guard, nodes_[op.node].symbol_type, r[op.node])) return 0;
                break;
            case FastOp::Code::TensorProp: {
                // Read without a Python call for the types the reader knows exactly; anything else
                // (no reader, a subclass, an overridden size()) is decided by the walk.
                const TensorPropertyReader read = tensor_property_reader();
                const RuntimeStep& step = nodes_[op.node].step;
                std::int64_t value = 0;
                if (read == nullptr ||
                    read(r[op.parent], step.kind, step.index, &value) != PropertyRead::Value)
                    return 0;
                frame->set_int(op.guard, value);
                break;
            }
            case FastOp::Code::TensorMatch:
                if (!tensor_match_pure(guards_[op.guard], r[op.node])) return 0;
                break;
            case FastOp::Code::ArrayMatch:
                if (!array_match_pure(guards_[op.guard], r[op.node])) return 0;
                break;
            case FastOp::Code::DimensionMarking:
                if (!dimension_marking_pure(guards_[op.guard], r[op.node])) return 0;
                break;
            case FastOp::Code::Probe:
                if (!probe_holds(guards_[op.guard])) return 0;
                break;
            case FastOp::Code::Relational: {
                const std::uint32_t base = rel_base_[op.guard];
                const std::size_t n = program_.guards[op.guard].more_sources.size() + 1;
                if (!relation_in_registers(guards_[op.guard], r, rel_nodes_.data() + base, n)) return 0;
                break;
            }
            default: __builtin_unreachable();  // every code is handled above: no range check
        }
    }
    if (frame && core::shape::run_fast(program_.shape, *frame) != core::shape::kShapePass) return 0;
    return 1;
}

}  // namespace tripwire::runtime
