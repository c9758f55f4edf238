// tripwire/cpp/runtime/eval/guard_set_setup.cpp -- building a GuardSet: binding, lifetimes.
//
// The constructor compiles the declarations, binds their operands to the runtime (paths, derived
// objects, adapter records) and holds the objects the guards name, weakly where it can, with the
// death callbacks that invalidate the set (guard_set.hpp). Run once per compile, apart from the
// evaluator (guard_set.cpp) and the fast pass, so that the per-check code reads on its own.
#include "runtime/eval/guard_set.hpp"

#include <algorithm>
#include <cstdio>
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
    std::size_t absences = 0;
    for (const RuntimeGuard& g : guards_) absences += g.kind == core::GuardKind::HasAttr ? 1 : 0;
    absence_caches_.resize(absences);
    absences = 0;
    std::size_t record_words = 0;
    for (const RuntimeGuard& g : guards_)
        record_words += g.kind == core::GuardKind::TensorMatch ? 1 + g.data_size : 0;
    tensor_records_.reserve(record_words);  // pointers into it are taken below: no reallocation
    for (RuntimeGuard& g : guards_) {
        if (g.kind == core::GuardKind::DimensionMarking) {
            g.marking = &marking_caches_[markings++];
        } else if (g.kind == core::GuardKind::HasAttr) {
            g.absence = &absence_caches_[absences++];
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

}  // namespace tripwire::runtime
