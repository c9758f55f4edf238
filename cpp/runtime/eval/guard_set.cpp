// tripwire/cpp/runtime/eval/guard_set.cpp -- the evaluator: check(), the why_not walk, invalidation.
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
namespace {

constexpr const char* kCapsuleName = "tripwire.invalidation";

// Bumped under the GIL by every invalidation (see invalidation_epoch()).
std::uint64_t g_invalidation_epoch = 0;

/// What a weakref callback needs: the shared flag and a description of the object it watches.
struct DeathWatch {
    std::shared_ptr<InvalidationState> state;
    std::string what;
};

// Called by CPython when a weakly held object dies (inside its deallocation, before its memory
// can be reused). Runs with the GIL held; must not raise.
PyObject* on_guarded_object_death(PyObject* capsule, PyObject* /*weakref*/) {
    assert_outside_region("a weakref callback (an object a guard set names died)");
    auto* w = static_cast<DeathWatch*>(PyCapsule_GetPointer(capsule, kCapsuleName));
    if (w == nullptr) {
        PyErr_Clear();
    } else if (!w->state->invalid) {
        w->state->invalid = true;
        ++g_invalidation_epoch;
        w->state->why = "the guarded object " + w->what + " has died";
    }
    Py_RETURN_NONE;
}

PyMethodDef g_death_def = {"_on_guarded_object_death", on_guarded_object_death, METH_O, nullptr};

void free_watch(PyObject* capsule) {
    delete static_cast<DeathWatch*>(PyCapsule_GetPointer(capsule, kCapsuleName));
}

std::string describe_object(PyObject* o) {
    char buf[64];
    std::snprintf(buf, sizeof buf, " at %p", static_cast<void*>(o));
    if (PyType_Check(o))
        return std::string("<class ") + reinterpret_cast<PyTypeObject*>(o)->tp_name + ">" + buf;
    return std::string("<") + Py_TYPE(o)->tp_name + buf + ">";
}

// A Python error as a C++ exception, for the constructor (nanobind maps it back).
[[noreturn]] void throw_python_error() { throw std::runtime_error(take_error_text()); }

// The C++ tensor steps (torch's TensorPropertyGuardAccessor / GradGuardAccessor) read only
// through the adapter: without it no reader has their exact meaning (a Python method would
// dispatch __torch_function__ or find an override), so a set naming one is refused at build.
bool has_cpp_tensor_step(const core::SourcePath& p) {
    return std::any_of(p.steps.begin(), p.steps.end(),
                       [](const core::Step& s) { return core::is_cpp_tensor_step(s.kind); });
}
void refuse_cpp_tensor_steps_without_adapter(const core::GuardDecl& d) {
    if (torch_adapter() != nullptr) return;
    bool any = has_cpp_tensor_step(d.source);
    for (const core::SourcePath& p : d.more_sources) any = any || has_cpp_tensor_step(p);
    for (const core::SharedPath& p : d.symbols) any = any || has_cpp_tensor_step(*p);
    if (any) {
        throw core::InvalidProgram(
            "TENSOR_SIZE/TENSOR_STRIDE/TENSOR_STORAGE_OFFSET/GRAD steps read the C++ tensor and need the "
            "torch adapter (see tripwire.tensors.adapter_status())");
    }
}

// `module.name`, looked up in sys.modules without importing; null when the module is not imported
// yet. A tensor or array type cannot exist before its module is imported, so the type checks of the
// Python-reader path (where no adapter or array struct supplies the base type) read "no" then.
Ref imported_attr(const char* module, const char* name) {
    Ref key = Ref::steal(PyUnicode_FromString(module));
    if (!key) throw_python_error();
    Ref mod = Ref::steal(PyImport_GetModule(key.get()));
    if (!mod) {
        if (PyErr_Occurred()) throw_python_error();
        return Ref();
    }
    Ref attr = Ref::steal(PyObject_GetAttrString(mod.get(), name));
    if (!attr) throw_python_error();
    return attr;
}

// Whether `t` derives from `module.name` (torch._C.TensorBase, numpy.ndarray).
bool derives_from(PyObject* t, const char* module, const char* name) {
    const Ref base = imported_attr(module, name);
    return base && PyType_Check(base.get()) &&
           PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(t), reinterpret_cast<PyTypeObject*>(base.get()));
}

// Whether `t` is the class `name` of module `module` itself (not a subclass).
bool is_class(PyObject* t, const char* module, const char* name) {
    const Ref cls = imported_attr(module, name);
    return cls && cls.get() == t;
}

}  // namespace

std::uint64_t invalidation_epoch() { return g_invalidation_epoch; }

void GuardSet::bind_declarations(std::vector<core::GuardDecl>& decls, const std::vector<PyObject*>& consts,
                                 std::vector<std::pair<std::uint32_t, Ref>>& derived_by_id) {
    using core::GuardKind;
    for (core::GuardDecl& d : decls) {
        d.via_python = false;  // decided here, never taken from the caller
        d.reads_by_code = false;
        core::validate_decl(d, consts.size());  // operand indices in range before reading them
        refuse_cpp_tensor_steps_without_adapter(d);
        switch (d.kind) {
            case GuardKind::TensorMatch: {
                PyObject* t = consts[d.operand];
                if (!PyType_Check(t)) throw core::InvalidProgram("TENSOR_MATCH needs a type");
                const TwTorchAdapter* a = force_python_readers() ? nullptr : torch_adapter();
                if (a != nullptr) {
                    // The adapter reads the tensor struct of any type deriving from TensorBase.
                    if (!PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(t), a->tensor_base_type))
                        throw core::InvalidProgram("TENSOR_MATCH needs a torch tensor type");
                    // A subclass's instance may be a wrapper whose metadata is its Python
                    // (tensor_fields answers 2): the check then reads it through the Python
                    // reader, so the walk must hold what it borrows. torch.Tensor and Parameter
                    // instances never call Python for their metadata (a C++ custom policy, a
                    // nested tensor, is unreadable there: the guard fails).
                    d.reads_by_code =
                        !is_class(t, "torch", "Tensor") && !is_class(t, "torch.nn", "Parameter");
                } else if (!python_readers().tensor) {
                    throw core::InvalidProgram("TENSOR_MATCH needs torch support (tripwire.tensors)");
                } else {
                    // The same refusal without the adapter (a crafted record naming `int`).
                    if (!derives_from(t, "torch._C", "TensorBase"))
                        throw core::InvalidProgram("TENSOR_MATCH needs a torch tensor type");
                    d.via_python = true;
                }
                break;
            }
            case GuardKind::ArrayMatch: {
                PyObject* t = consts[d.operand];
                if (!PyType_Check(t)) throw core::InvalidProgram("ARRAY_MATCH needs a type");
                Ref dtype = derive_array_dtype(consts[d.operand2]);
                if (!dtype) throw_python_error();
                PyTypeObject* ndarray = force_python_readers() ? nullptr : numpy_ndarray_type();
                if (numpy_ndarray_type() != nullptr &&
                    !PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(t), numpy_ndarray_type()))
                    throw core::InvalidProgram("ARRAY_MATCH needs a numpy array type");
                if (ndarray != nullptr) {
                    if (!PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(t), ndarray))
                        throw core::InvalidProgram("ARRAY_MATCH needs a numpy array type");
                    // A dtype numpy must compare itself (structured, datetime, ...) may run code.
                    d.via_python = !numpy_dtype_is_simple(dtype.get());
                } else if (!python_readers().array) {
                    throw core::InvalidProgram("ARRAY_MATCH needs numpy support (tripwire.tensors)");
                } else {
                    if (numpy_ndarray_type() == nullptr && !derives_from(t, "numpy", "ndarray"))
                        throw core::InvalidProgram("ARRAY_MATCH needs a numpy array type");
                    d.via_python = true;
                }
                derived_by_id.emplace_back(d.id, std::move(dtype));
                break;
            }
            case GuardKind::DimensionMarking: {
                Ref sets = derive_marking_sets(d.data);
                if (!sets) throw_python_error();
                derived_by_id.emplace_back(d.id, std::move(sets));
                break;
            }
            case GuardKind::GlobalState:
                if (d.operand == core::kNoConst &&
                    core::builtin_probe_reads_framework(static_cast<core::BuiltinProbe>(d.n)) &&
                    (torch_adapter() == nullptr || force_python_readers())) {
                    PythonReaders& r = python_readers();
                    if (!r.torch_state || !r.mode_stack || !r.default_device || !r.saved_hooks ||
                        !r.dual_level)
                        throw core::InvalidProgram("a torch probe needs torch support (tripwire.tensors)");
                    d.via_python = true;
                }
                break;
            case GuardKind::StorageOverlapping:
                // torch's overlap rule on tensor metadata: the adapter's only (no Python reader).
                if (torch_adapter() == nullptr) {
                    throw core::InvalidProgram(
                        "STORAGE_OVERLAPPING needs the torch adapter (see "
                        "tripwire.tensors.adapter_status())");
                }
                break;
            case GuardKind::DispatchKeySetMatch: {
                // torch's rule on a DispatchKeySet's C++ value: the adapter's only (no Python
                // reader: a Python one would call the methods a subclass may override).
                const TwTorchAdapter* a = torch_adapter();
                if (a == nullptr || a->dispatch_key_set_type == nullptr) {
                    throw core::InvalidProgram(
                        "DISPATCH_KEY_SET_MATCH needs the torch adapter (see "
                        "tripwire.tensors.adapter_status())");
                }
                break;
            }
            case GuardKind::EqualsMatch:
                // python_eq: Python's == may call an element's __eq__ (python_equals.cpp).
                d.via_python = d.flag;
                break;
            default: break;
        }
    }
}

GuardSet::GuardSet(GuardSetInputs in) : strict_(in.strict), state_(std::make_shared<InvalidationState>()) {
    const std::size_t n_consts = in.consts.size();
    if (in.hold_weakly.size() != n_consts) throw core::InvalidProgram("hold_weakly must match consts");
    if (!init_dict_stamps() || !install_region_checks() || !init_getattr_hook()) throw_python_error();
    verify_dict_hints();
    std::vector<std::pair<std::uint32_t, Ref>> derived_by_id;
    bind_declarations(in.decls, in.consts, derived_by_id);
    program_ =
        core::compile(std::move(in.decls), n_consts, /*decls_validated=*/true);  // by bind_declarations

    holders_.reserve(n_consts);
    objs_.reserve(n_consts);
    // One weak reference (and death watch) per distinct object: a set names the same class or
    // function from many guards (one TYPE_MATCH per source), each with its own constant.
    std::unordered_map<PyObject*, std::size_t> first_weak;
    for (std::size_t i = 0; i < n_consts; ++i) {
        PyObject* o = in.consts[i];
        objs_.push_back(o);
        if (in.hold_weakly[i] && PyType_SUPPORTS_WEAKREFS(Py_TYPE(o))) {
            const auto [seen, fresh] = first_weak.emplace(o, i);
            if (!fresh) {
                holders_.push_back(holders_[seen->second]);
                continue;
            }
            auto* watch = new DeathWatch{state_, describe_object(o)};
            PyObject* capsule = PyCapsule_New(watch, kCapsuleName, free_watch);
            if (capsule == nullptr) {
                delete watch;
                throw_python_error();
            }
            PyObject* cb = PyCFunction_New(&g_death_def, capsule);
            Py_DECREF(capsule);
            if (cb == nullptr) throw_python_error();
            PyObject* wr = PyWeakref_NewRef(o, cb);
            Py_DECREF(cb);
            if (wr == nullptr) throw_python_error();
            holders_.push_back(Ref::steal(wr));
        } else {
            holders_.push_back(Ref::borrow(o));
        }
    }
    // Root names are compared by identity with interned parameter names (Locals::argument):
    // intern them here, before anything else copies the raw pointers.
    for (const core::Node& n : program_.nodes) {
        if (!n.is_root || n.root_name >= n_consts) continue;
        PyObject* s = objs_[n.root_name];
        if (!PyUnicode_CheckExact(s) || PyUnicode_CHECK_INTERNED(s)) continue;
        Py_INCREF(s);
        PyUnicode_InternInPlace(&s);
        holders_[n.root_name] = Ref::steal(s);
        objs_[n.root_name] = s;
    }
    globals_ = Ref::borrow(in.globals);
    closure_ = Ref::borrow(in.closure);
    eval_error_type_ = Ref::borrow(in.eval_error_type);

    guards_.resize(program_.guards.size());
    for (std::size_t gi = 0; gi < program_.guards.size(); ++gi) {
        const core::GuardDecl& d = program_.guards[gi];
        RuntimeGuard& g = guards_[gi];
        g.kind = d.kind;
        g.flag = d.flag;
        g.a = d.operand == core::kNoConst ? nullptr : objs_[d.operand];
        g.b = d.operand2 == core::kNoConst ? nullptr : objs_[d.operand2];
        g.n = d.n;
        g.n2 = d.n2;
        g.n3 = d.n3;
        g.id = d.id;
        g.via_python = d.via_python;
        g.reads_by_code = d.reads_by_code;
        // Arrays may read from the struct yet compare a dtype through numpy (via_python).
        g.python_reader = d.via_python && (d.kind != core::GuardKind::ArrayMatch || force_python_readers() ||
                                           numpy_ndarray_type() == nullptr);
        g.data = d.data.data();
        g.data_size = static_cast<std::uint32_t>(d.data.size());
        if (d.kind == core::GuardKind::GlobalState && g.a == nullptr &&
            core::builtin_probe_reads_framework(static_cast<core::BuiltinProbe>(d.n))) {
            if (d.n == static_cast<std::int64_t>(core::BuiltinProbe::TorchFunctionModeStack) &&
                !PyTuple_Check(g.b))
                throw core::InvalidProgram("a torch-function mode stack snapshot is a tuple of types");
            Ref keep;
            if (!bind_torch_probe(g, !d.via_python, keep)) throw_python_error();
            if (keep) derived_.push_back(std::move(keep));
        }
        if ((d.kind == core::GuardKind::TensorMatch || d.kind == core::GuardKind::ArrayMatch) &&
            !PyType_Check(g.a))
            throw core::InvalidProgram("TENSOR_MATCH and ARRAY_MATCH need a type");
#if PY_VERSION_HEX >= 0x030C0000
        if (d.kind == core::GuardKind::DictVersion) {
            watches_.push_back(std::make_unique<DictWatch>());
            g.watch = watches_.back().get();
        }
#endif
        // Operands the evaluator relies on having a given type; a mismatch is a malformed set.
        if (d.kind == core::GuardKind::DictKeys && !PyTuple_Check(g.b)) {
            throw core::InvalidProgram("DICT_KEYS keys must be a tuple");
        }
        if (d.kind == core::GuardKind::HasAttr && !PyUnicode_Check(g.a)) {
            throw core::InvalidProgram("HASATTR name must be a str");
        }
        if (d.kind == core::GuardKind::RangeIterator && !PyRange_Check(g.a)) {
            throw core::InvalidProgram("RANGE_ITERATOR needs a range");
        }
        if ((d.kind == core::GuardKind::Lambda || (d.kind == core::GuardKind::GlobalState && g.a)) &&
            !PyCallable_Check(g.a)) {
            throw core::InvalidProgram("predicate or probe is not callable");
        }
        if (d.kind == core::GuardKind::TypeMatch && !PyType_Check(g.a)) {
            throw core::InvalidProgram("TYPE_MATCH needs a type");
        }
        // Constants are compared recursively: their depth bounds that recursion (and refuses a
        // cyclic container, which deepcopy would preserve).
        const bool compared = d.kind == core::GuardKind::EqualsMatch || d.kind == core::GuardKind::DictKeys ||
                              (d.kind == core::GuardKind::GlobalState && g.b != nullptr);
        PyObject* constant = d.kind == core::GuardKind::EqualsMatch ? g.a : g.b;
        if (compared && !constant_depth_ok(constant)) {
            throw core::InvalidProgram("a constant nests containers deeper than " +
                                       std::to_string(core::kMaxConstantDepth) + " levels");
        }
    }

    // Objects derived when binding (held here), and DIMENSION_MARKING's inline caches.
    std::size_t markings = 0;
    for (const RuntimeGuard& g : guards_) markings += g.kind == core::GuardKind::DimensionMarking ? 1 : 0;
    marking_caches_.resize(markings);
    markings = 0;
    std::size_t record_words = 0;
    for (const RuntimeGuard& g : guards_)
        record_words += g.kind == core::GuardKind::TensorMatch ? 1 + g.data_size : 0;
    tensor_records_.reserve(record_words);  // pointers into it are taken below: no reallocation
    for (RuntimeGuard& g : guards_) {
        if (g.kind == core::GuardKind::DimensionMarking) {
            MarkingCache& m = marking_caches_[markings++];
            g.absent_memo = &m.absent;
            g.attr_cache = &m.cache;
        } else if (g.kind == core::GuardKind::TensorMatch) {
            // The record: the type's address (compared, never dereferenced), then a copy of the
            // data, which g.data then points at (the program's own copy is never written).
            tensor_records_.push_back(static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(g.a)));
            const std::size_t at = tensor_records_.size();
            tensor_records_.insert(tensor_records_.end(), g.data, g.data + g.data_size);
            g.data = tensor_records_.data() + at;
        }
    }
    for (auto& [id, obj] : derived_by_id) {
        auto it = std::lower_bound(program_.guards.begin(), program_.guards.end(), id,
                                   [](const core::GuardDecl& d, std::uint32_t x) { return d.id < x; });
        guards_[static_cast<std::size_t>(it - program_.guards.begin())].derived = obj.get();
        derived_.push_back(std::move(obj));
    }

    nodes_.resize(program_.nodes.size());
    fetch_memos_.assign(program_.nodes.size(), FetchMemo{});
    state_memos_.assign(program_.nodes.size(), StateMemo{});
    fetch_slot_.clear();  // build_fast_pass() lays the memos out in the program's order
    state_slot_.clear();
    for (std::size_t ni = 0; ni < program_.nodes.size(); ++ni) {
        const core::Node& n = program_.nodes[ni];
        NodeRt& r = nodes_[ni];
        r.guard_begin = n.guard_begin;
        r.guard_end = n.guard_end;
        r.child_begin = n.child_begin;
        r.child_end = n.child_end;
        r.member_begin = n.member_begin;
        r.member_end = n.member_end;
        r.borrow_ok = !n.subtree_runs_user_code;
        r.symbol = n.symbol;
        if (n.symbol != core::kNoSymbol) r.symbol_type = program_.shape.symbol_types[n.symbol];
        if (n.is_root) {
            r.root.kind = n.root;
            if (n.root == core::RootKind::Global) reads_globals_ = true;
            if (n.root == core::RootKind::Closure) reads_closure_ = true;
            r.root.name = objs_[n.root_name];
            if (!PyUnicode_Check(r.root.name)) throw core::InvalidProgram("root names must be str");
            if (n.root == core::RootKind::Closure && closure_) {
                PyObject* cell = PyDict_GetItemWithError(closure_.get(), r.root.name);
                if (cell == nullptr && PyErr_Occurred()) throw_python_error();
                r.root.cell = (cell != nullptr && PyCell_Check(cell)) ? cell : nullptr;
            }
        } else {
            r.step.kind = n.step.kind;
            r.step.index = static_cast<Py_ssize_t>(n.step.index);
            r.step.operand = n.step.operand == core::kNoConst ? nullptr : objs_[n.step.operand];
            prepare_int_key(r.step);
            const bool needs_str =
                n.step.kind == core::StepKind::Attr || n.step.kind == core::StepKind::KwDefaults;
            if (needs_str &&
                (!PyUnicode_Check(r.step.operand) || PyUnicode_GET_LENGTH(r.step.operand) == 0)) {
                throw core::InvalidProgram("attribute names must be non-empty str");
            }
        }
    }
    // Children come after their parents: summing in reverse gives each node its subtree's count.
    for (std::size_t ni = program_.nodes.size(); ni-- > 0;) {
        const core::Node& n = program_.nodes[ni];
        nodes_[ni].subtree_guards += n.guard_end - n.guard_begin;
        if (!n.is_root) nodes_[n.parent].subtree_guards += nodes_[ni].subtree_guards;
    }
    for (std::uint32_t gi : program_.ambient)
        if (guards_[gi].kind == core::GuardKind::Lambda) ambient_reads_locals_ = true;
    // Relational guards: one slot per source, in guard order; the node behind each slot.
    rel_base_.assign(program_.guards.size(), 0);
    std::uint32_t slots = 0;
    for (std::uint32_t gi : program_.relational) {
        rel_base_[gi] = slots;
        slots += static_cast<std::uint32_t>(program_.guards[gi].more_sources.size() + 1);
    }
    rel_slots_.assign(slots, nullptr);
    rel_nodes_.assign(slots, 0);
    for (std::uint32_t ni = 0; ni < program_.nodes.size(); ++ni) {
        for (std::uint32_t m = program_.nodes[ni].member_begin; m < program_.nodes[ni].member_end; ++m)
            rel_nodes_[rel_base_[program_.node_members[m].guard] + program_.node_members[m].slot] = ni;
    }
    guard_order_ = program_.node_guards;
    child_order_ = program_.children;
    root_order_ = program_.roots;
    guard_fails_.assign(program_.guards.size(), 0);
    node_fails_.assign(program_.nodes.size(), 0);
    relation_fails_.assign(program_.shape.relations.size(), 0);
    symbol_texts_.reserve(program_.symbol_nodes.size());
    for (std::uint32_t node : program_.symbol_nodes) symbol_texts_.push_back(program_.nodes[node].text);
    fast_enabled_ = true;
    build_fast_pass();
}

GuardSet::~GuardSet() {
    // The watcher must not set a flag that is freed (GIL held: the owners drop sets under it).
    for (const auto& w : watches_) release_dict_watch(w.get());
}

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

int GuardSet::traverse(visitproc visit, void* arg) const {
    // Strongly held constants only. The weak references must not be reported: a weak reference
    // the collector finds inside the garbage is cleared *without* its callback, so if this set
    // were collected together with an object it names and then resurrected by a finalizer, the
    // object would die unnoticed and a new object at its address would pass. Unreported, the
    // weak references count as reachable and their callbacks run. They cannot be part of a
    // cycle: each refers only to its callback, which refers only to a capsule of C++ state.
    for (std::size_t c = 0; c < holders_.size(); ++c)
        if (holders_[c].get() == objs_[c]) Py_VISIT(holders_[c].get());
    for (const Ref& d : derived_) Py_VISIT(d.get());
    Py_VISIT(globals_.get());
    Py_VISIT(closure_.get());
    return 0;
}

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
