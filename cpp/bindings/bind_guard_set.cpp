// tripwire/cpp/bindings/bind_guard_set.cpp -- GuardSetCore: converts arguments, calls runtime.
//
// The Python class tripwire.GuardSet subclasses GuardSetCore and adds why_not/explain in Python;
// check() stays a direct C++ call.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <exception>
#include <initializer_list>
#include <memory>
#include <new>
#include <unordered_map>
#include <utility>

#include "core/codec/document.hpp"
#include "core/ir.hpp"
#include "core/program.hpp"
#include "core/shape/program.hpp"
#include "register.hpp"
#include "runtime/eval/guard_set.hpp"
#include "runtime/py.hpp"
#include "runtime/tensors/property_reader.hpp"
#include "runtime/tensors/tensor_kinds.hpp"

namespace nb = nanobind;

namespace tripwire::bindings {
namespace {

struct GuardSetCore {
    /// Shared with the Cache entries that hold this set, so that a Cache never needs to resolve
    /// the Python object on a lookup.
    std::shared_ptr<runtime::GuardSet> impl;

    runtime::GuardSet& get() {
        if (!impl) throw std::runtime_error("this GuardSet was cleared by the garbage collector");
        return *impl;
    }
};

int core_traverse(PyObject* self, visitproc visit, void* arg) {
    Py_VISIT(Py_TYPE(self));
    if (!nb::inst_ready(self)) return 0;
    auto* w = nb::inst_ptr<GuardSetCore>(self);
    return w->impl ? w->impl->traverse(visit, arg) : 0;
}

int core_clear(PyObject* self) {
    if (!nb::inst_ready(self)) return 0;
    // Dropping the runtime set releases the constants, globals and closure it holds, which
    // breaks any cycle through a predicate that refers back to this set.
    nb::inst_ptr<GuardSetCore>(self)->impl.reset();
    return 0;
}

}  // namespace

bool require_locals_mapping(PyObject* f_locals, const char* method) {
    if (PyDict_Check(f_locals)) return true;
    // collections.abc.Mapping, imported on the first non-dict argument and kept for the process
    // (a module-level class: never freed while the interpreter runs).
    static PyObject* mapping = nullptr;
    if (mapping == nullptr) {
        PyObject* abc = PyImport_ImportModule("collections.abc");
        if (abc == nullptr) return false;
        PyObject* cls = PyObject_GetAttrString(abc, "Mapping");
        Py_DECREF(abc);
        if (cls == nullptr) return false;
        if (mapping == nullptr) {
            mapping = cls;
        } else {
            Py_DECREF(cls);  // a re-entrant first call (the import ran Python) stored it already
        }
    }
    const int r = PyObject_IsInstance(f_locals, mapping);
    if (r < 0) return false;
    if (r == 0) {
        PyErr_Format(PyExc_TypeError,
                     "%s: f_locals must be a dict (or a Mapping) of the frame's locals by name, not %.200s",
                     method, Py_TYPE(f_locals)->tp_name);
        return false;
    }
    return true;
}

namespace {

// check(f_locals) as a plain METH_O method: the call every compiled frame's guard pays from
// Python, so it skips nanobind's dispatcher (argument records, the instance lookup, the cleanup
// list: about 250 instructions per call, more than a small set's whole check). Converts and
// calls only, as a binding lambda would.
PyObject* core_check(PyObject* self, PyObject* f_locals) {
    if (!nb::inst_ready(self)) {
        PyErr_SetString(PyExc_RuntimeError, "GuardSetCore.check on an uninitialized object");
        return nullptr;
    }
    auto* w = nb::inst_ptr<GuardSetCore>(self);
    if (!w->impl) {
        PyErr_SetString(PyExc_RuntimeError, "this GuardSet was cleared by the garbage collector");
        return nullptr;
    }
    if (!require_locals_mapping(f_locals, "GuardSet.check")) return nullptr;
    try {
        const int r = w->impl->check(f_locals);
        if (r < 0) return nullptr;
        return Py_NewRef(r == 1 ? Py_True : Py_False);
    } catch (const std::bad_alloc&) {
        return PyErr_NoMemory();
    } catch (const std::exception& e) {
        PyErr_SetString(PyExc_RuntimeError, e.what());
        return nullptr;
    }
}

PyMethodDef g_core_methods[] = {
    {"check", core_check, METH_O,
     "check($self, f_locals, /)\n--\n\n"
     "True when every guard holds for these locals. Never raises for a failing guard (only in strict "
     "mode, or for KeyboardInterrupt and other non-Exception errors)."},
    {nullptr, nullptr, 0, nullptr}};

PyType_Slot g_core_slots[] = {{Py_tp_traverse, reinterpret_cast<void*>(core_traverse)},
                              {Py_tp_clear, reinterpret_cast<void*>(core_clear)},
                              {Py_tp_methods, static_cast<void*>(g_core_methods)},
                              {0, nullptr}};

// Set once at registration; the module owns the type.
PyTypeObject* g_core_type = nullptr;

/// A SHAPE symbol's type code from its name in a spec ("int" 0, "float" 1: shape::ValueType).
std::uint8_t symbol_type_code(PyObject* name) {
    // The builder's names are the interned "int" and "float" (bind_shape.cpp, symbol_type_names):
    // found by address, compared by value only otherwise.
    static PyObject* s_int = nullptr;
    static PyObject* s_float = nullptr;
    if (s_int == nullptr) {
        s_int = PyUnicode_InternFromString("int");
        if (s_int == nullptr) throw nb::python_error();
    }
    if (s_float == nullptr) {
        s_float = PyUnicode_InternFromString("float");
        if (s_float == nullptr) throw nb::python_error();
    }
    if (name == s_int) return 0;
    if (name == s_float) return 1;
    if (PyUnicode_CheckExact(name)) {
        if (PyUnicode_CompareWithASCIIString(name, "int") == 0) return 0;
        if (PyUnicode_CompareWithASCIIString(name, "float") == 0) return 1;
    }
    throw nb::value_error("a SHAPE symbol's type is 'int' or 'float'");
}

/// The items of an exact tuple or list (a spec made by hand may hold a list), borrowed.
std::pair<PyObject* const*, Py_ssize_t> exact_sequence(PyObject* o, const char* what) {
    if (PyTuple_CheckExact(o)) return {&PyTuple_GET_ITEM(o, 0), PyTuple_GET_SIZE(o)};
    if (PyList_CheckExact(o)) return {reinterpret_cast<PyListObject*>(o)->ob_item, PyList_GET_SIZE(o)};
    throw nb::type_error(what);
}

/// Each SHAPE symbol's declaration (the caller's `paths[k]`, its ids the set's pool's), made once
/// per set and shared by every relation that names it (core::SharedPath).
std::vector<core::SharedPath> shared_paths_of(const std::vector<core::SourcePath>& paths) {
    std::vector<core::SharedPath> shared;
    shared.reserve(paths.size());
    for (const core::SourcePath& p : paths) shared.push_back(std::make_shared<core::SourcePath>(p));
    return shared;
}

/// The SHAPE declarations of a set, made here from the specs' own argument tuples
/// (text, symbols, types) instead of one nanobind GuardDecl per relation. `symbols[k]` is the
/// Source object whose declaration is `shared[k]` (shared_paths_of); each relation's symbols are
/// found by identity.
/// `at[r]` is the position among the other declarations where relation r was declared, so the
/// declarations keep the specs' order. Only exact tuples, lists, str and int are read: no user
/// code runs here, so the borrowed items stay alive (the caller's lists hold them).
void add_shape_decls(std::vector<core::GuardDecl>& decls, nb::list at, nb::list ids, nb::list args,
                     nb::list symbols, const std::vector<core::SharedPath>& shared) {
    const std::size_t n = args.size();
    if (at.size() != n || ids.size() != n || symbols.size() != shared.size())
        throw nb::value_error("SHAPE declarations: mismatched lengths");
    for (const core::SharedPath& path : shared) {
        if (path == nullptr) throw nb::value_error("SHAPE declarations: a symbol without its source");
    }
    // Each relation's symbols by identity: a scan of the set's few symbols (borrowed from the
    // caller's list, in its order), a hash map when there are many.
    constexpr std::size_t kScanned = 16;
    PyObject* const* const symbol_items = reinterpret_cast<PyListObject*>(symbols.ptr())->ob_item;
    const std::size_t n_symbols = symbols.size();
    std::unordered_map<PyObject*, std::uint32_t> symbol_index;
    if (n_symbols > kScanned) {
        symbol_index.reserve(n_symbols);
        for (std::size_t k = 0; k < n_symbols; ++k)
            symbol_index.emplace(symbol_items[k], static_cast<std::uint32_t>(k));
    }
    const auto shared_of = [&](PyObject* sym) -> const core::SharedPath& {
        if (n_symbols > kScanned) {
            const auto it = symbol_index.find(sym);
            if (it != symbol_index.end()) return shared[it->second];
        } else {
            for (std::size_t k = 0; k < n_symbols; ++k)
                if (symbol_items[k] == sym) return shared[k];
        }
        throw nb::value_error("SHAPE declarations: a symbol without its source");
    };
    std::vector<core::GuardDecl> merged;
    merged.reserve(decls.size() + n);
    std::size_t next = 0;  // the next of `decls` to move into `merged`
    for (std::size_t r = 0; r < n; ++r) {
        PyObject* pos = at[r].ptr();
        PyObject* id = ids[r].ptr();
        PyObject* a = args[r].ptr();
        if (!PyLong_CheckExact(pos) || !PyLong_CheckExact(id))
            throw nb::type_error("a SHAPE guard's index is an int");
        const std::size_t where = PyLong_AsSize_t(pos);
        const unsigned long gid = PyLong_AsUnsignedLong(id);
        if (PyErr_Occurred() || gid > 0xFFFFFFFFul || where < next || where > decls.size()) {
            PyErr_Clear();
            throw nb::value_error("SHAPE declarations: a bad index or position");
        }
        if (!PyTuple_CheckExact(a) || PyTuple_GET_SIZE(a) != 3 ||
            !PyUnicode_CheckExact(PyTuple_GET_ITEM(a, 0)))
            throw nb::type_error("SHAPE takes (relation text, symbols, symbol types)");
        Py_ssize_t text_len = 0;
        const char* text = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(a, 0), &text_len);
        if (text == nullptr) throw nb::python_error();
        const auto [syms, n_syms] =
            exact_sequence(PyTuple_GET_ITEM(a, 1), "SHAPE symbols are a tuple of sources");
        const auto [types, n_types] =
            exact_sequence(PyTuple_GET_ITEM(a, 2), "SHAPE symbol types are a tuple of 'int'/'float'");
        while (next < where) merged.push_back(std::move(decls[next++]));
        core::GuardDecl& d = merged.emplace_back();
        d.kind = core::GuardKind::Shape;
        d.has_source = false;
        d.id = static_cast<std::uint32_t>(gid);
        d.relation.assign(text, static_cast<std::size_t>(text_len));
        d.symbols.reserve(static_cast<std::size_t>(n_syms));
        for (Py_ssize_t k = 0; k < n_syms; ++k) d.symbols.push_back(shared_of(syms[k]));
        d.symbol_types.reserve(static_cast<std::size_t>(n_types));
        for (Py_ssize_t k = 0; k < n_types; ++k) d.symbol_types.push_back(symbol_type_code(types[k]));
    }
    while (next < decls.size()) merged.push_back(std::move(decls[next++]));
    decls = std::move(merged);
}

/// An interned str made once (the GIL is held; never freed, as the module's own names).
PyObject* interned_name(PyObject*& slot, const char* text) {
    if (slot == nullptr) {
        slot = PyUnicode_InternFromString(text);
        if (slot == nullptr) throw nb::python_error();
    }
    return slot;
}

/// `module.attrs...` when `module` is imported (sys.modules: nothing is imported here) and has
/// them, else None (tensors.is_tensor's and is_array's lookups). The names are interned strs,
/// each made once: a lookup is then one dict probe per name, with no str made per call.
nb::object imported_attr(PyObject* module, std::initializer_list<PyObject*> attrs) {
    nb::object o = nb::steal(PyImport_GetModule(module));
    if (!o.is_valid()) {
        if (PyErr_Occurred()) throw nb::python_error();
        return nb::none();
    }
    for (PyObject* a : attrs) {
        PyObject* next = PyObject_GetAttr(o.ptr(), a);
        if (next == nullptr) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError)) throw nb::python_error();
            PyErr_Clear();
            return nb::none();
        }
        o = nb::steal(next);
    }
    return o;
}

/// issubclass(t, base), False when base is None.
bool derives(nb::handle t, nb::handle base) {
    if (base.is_none()) return false;
    const int r = PyObject_IsSubclass(t.ptr(), base.ptr());
    if (r < 0) throw nb::python_error();
    return r == 1;
}

/// What decides each SHAPE symbol's reader on this frame (guard_set.py, _reader_facts), per
/// symbol in the program's order: (printed symbol, fact), the fact ("frame",) for a symbol read
/// from the frame (its last step is no SIZE, STRIDE or STORAGE_OFFSET), ("unreadable", the
/// exception's type name) when its tensor cannot be read here, else ("property", the tensor's
/// type, whether the C-level reader answers, is an array, is a tensor). Each tensor is read once
/// (the same steps a check runs, user code included).
nb::list reader_facts(const runtime::GuardSet& gs, nb::handle f_locals, nb::handle f_globals) {
    const core::Program& p = gs.program();
    PyObject* globals = PyDict_Check(f_globals.ptr()) ? f_globals.ptr() : nullptr;
    static PyObject* s_numpy = nullptr;
    static PyObject* s_ndarray = nullptr;
    static PyObject* s_torch = nullptr;
    static PyObject* s_c = nullptr;
    static PyObject* s_tensor_base = nullptr;
    static PyObject* s_frame = nullptr;
    static PyObject* s_property = nullptr;
    static PyObject* s_unreadable = nullptr;
    const nb::object ndarray =
        imported_attr(interned_name(s_numpy, "numpy"), {interned_name(s_ndarray, "ndarray")});
    const nb::object tensor_base =
        imported_attr(interned_name(s_torch, "torch"),
                      {interned_name(s_c, "_C"), interned_name(s_tensor_base, "TensorBase")});
    // The facts' tags, made once: a str per fact per build was a tenth of this call.
    const nb::handle frame_tag = interned_name(s_frame, "frame");
    const nb::handle property_tag = interned_name(s_property, "property");
    const nb::handle unreadable_tag = interned_name(s_unreadable, "unreadable");
    struct Parent {
        nb::object value, type;
        bool is_array = false, is_tensor = false;
    };
    std::unordered_map<std::uint32_t, Parent> parents;  // by node: each tensor read once
    nb::object last_type;
    bool last_is_array = false;
    bool last_is_tensor = false;
    nb::list out;
    for (const std::uint32_t ni : p.symbol_nodes) {
        const core::Node& n = p.nodes[ni];
        nb::str text(n.text.data(), n.text.size());
        const core::StepKind kind = n.step.kind;
        if (n.is_root || (kind != core::StepKind::Size && kind != core::StepKind::Stride &&
                          kind != core::StepKind::StorageOffset)) {
            out.append(nb::make_tuple(text, nb::make_tuple(frame_tag)));
            continue;
        }
        auto it = parents.find(n.parent);
        if (it == parents.end()) {
            runtime::Ref v = gs.read_node(n.parent, f_locals.ptr(), globals);
            if (!v) {
                // The frame has no such value (or a step raised): said, as `type(e).__name__`.
                if (!PyErr_ExceptionMatches(PyExc_Exception)) throw nb::python_error();
                nb::python_error e;
                out.append(nb::make_tuple(text, nb::make_tuple(unreadable_tag, e.type().attr("__name__"))));
                continue;
            }
            Parent parent;
            parent.value = nb::steal(v.release());
            parent.type = nb::borrow(reinterpret_cast<PyObject*>(Py_TYPE(parent.value.ptr())));
            // The symbols' tensors are nearly always of one type: the answers for the type
            // asked last are reused (`last_type` holds it, so its address names that type).
            if (parent.type.ptr() != last_type.ptr()) {
                last_type = parent.type;
                last_is_array = derives(parent.type, ndarray);
                last_is_tensor = derives(parent.type, tensor_base);
            }
            parent.is_array = last_is_array;
            parent.is_tensor = last_is_tensor;
            it = parents.emplace(n.parent, std::move(parent)).first;
        }
        const Parent& parent = it->second;
        std::int64_t value = 0;
        const std::int64_t index = kind == core::StepKind::StorageOffset ? 0 : n.step.index;
        const bool answered = runtime::read_tensor_property(parent.value.ptr(), kind, index, &value) !=
                              runtime::PropertyRead::Unknown;
        if (PyErr_Occurred()) throw nb::python_error();
        out.append(nb::make_tuple(
            text, nb::make_tuple(property_tag, parent.type, answered, parent.is_array, parent.is_tensor)));
    }
    return out;
}

}  // namespace

runtime::GuardSet* guard_set_of(PyObject* o) { return shared_guard_set_of(o).get(); }

std::shared_ptr<runtime::GuardSet> shared_guard_set_of(PyObject* o) {
    if (g_core_type == nullptr || !PyObject_TypeCheck(o, g_core_type) || !nb::inst_ready(o)) return nullptr;
    return nb::inst_ptr<GuardSetCore>(o)->impl;
}

void register_guard_set(nb::module_& m) {
    auto cls =
        nb::class_<GuardSetCore>(m, "GuardSetCore", nb::type_slots(g_core_slots),
                                 "The compiled guard set. Use tripwire.GuardSet, which subclasses it.")
            .def(
                "__init__",
                [](GuardSetCore* self, std::vector<core::GuardDecl> decls, nb::list consts,
                   nb::list hold_weakly, nb::object globals, nb::object closure, bool strict,
                   nb::object eval_error_type, nb::list shape_at, nb::list shape_ids, nb::list shape_args,
                   nb::list shape_symbols, const std::vector<core::SourcePath>& shape_paths) {
                    runtime::GuardSetInputs in;
                    if (!shape_args.empty()) {
                        add_shape_decls(decls, shape_at, shape_ids, shape_args, shape_symbols,
                                        shared_paths_of(shape_paths));
                    }
                    in.decls = std::move(decls);
                    in.consts.reserve(consts.size());
                    for (nb::handle c : consts) in.consts.push_back(c.ptr());
                    in.hold_weakly.reserve(hold_weakly.size());
                    for (nb::handle w : hold_weakly) in.hold_weakly.push_back(nb::cast<bool>(w));
                    if (!globals.is_none() && !PyDict_Check(globals.ptr()))
                        throw nb::type_error("globals must be a dict");
                    if (!closure.is_none() && !PyDict_Check(closure.ptr()))
                        throw nb::type_error("closure must be a dict");
                    in.globals = globals.is_none() ? nullptr : globals.ptr();
                    in.closure = closure.is_none() ? nullptr : closure.ptr();
                    in.strict = strict;
                    in.eval_error_type = eval_error_type.is_none() ? nullptr : eval_error_type.ptr();
                    new (self) GuardSetCore{std::make_shared<runtime::GuardSet>(std::move(in))};
                },
                nb::arg("decls"), nb::arg("consts"), nb::arg("hold_weakly"), nb::arg("globals").none(),
                nb::arg("closure").none(), nb::arg("strict"), nb::arg("eval_error_type").none(),
                nb::arg("shape_at") = nb::list(), nb::arg("shape_ids") = nb::list(),
                nb::arg("shape_args") = nb::list(), nb::arg("shape_symbols") = nb::list(),
                nb::arg("shape_paths") = std::vector<core::SourcePath>())
            .def(
                "__init__",
                [](GuardSetCore* self, nb::handle decoded, nb::list consts, nb::object globals, bool strict,
                   nb::object eval_error_type) {
                    // A loaded set: the declarations straight from the decoded document (no Python
                    // GuardDecl per guard), the weak flags from its constant flags.
                    const core::codec::Document* doc = decoded_document(decoded.ptr());
                    if (doc == nullptr)
                        throw nb::type_error("expected a decoded document (tripwire._core.Decoded)");
                    runtime::GuardSetInputs in;
                    for (nb::handle c : consts) in.consts.push_back(c.ptr());
                    for (const std::uint8_t f : doc->const_flags) in.hold_weakly.push_back((f & 1) != 0);
                    if (!globals.is_none() && !PyDict_Check(globals.ptr()))
                        throw nb::type_error("globals must be a dict");
                    in.globals = globals.is_none() ? nullptr : globals.ptr();
                    in.strict = strict;
                    in.eval_error_type = eval_error_type.is_none() ? nullptr : eval_error_type.ptr();
                    // Moved, not copied (the copy and its destruction were a tenth of a load):
                    // the document keeps labels and stacks; the declarations come back through
                    // _decls() for the lazily built diagnostics. Taken last, once nothing else
                    // can refuse the arguments.
                    in.decls = take_decoded_decls(decoded.ptr());
                    new (self) GuardSetCore{std::make_shared<runtime::GuardSet>(std::move(in))};
                },
                nb::arg("decoded"), nb::arg("consts"), nb::arg("globals").none(), nb::arg("strict"),
                nb::arg("eval_error_type").none())
            // check: g_core_methods above (METH_O)
            .def(
                "_failures",
                [](GuardSetCore& s, nb::handle f_locals, bool first_only) {
                    if (!require_locals_mapping(f_locals.ptr(),
                                                first_only ? "GuardSet.why_not" : "GuardSet.failures"))
                        throw nb::python_error();
                    std::vector<runtime::FailureRecord> recs;
                    if (!s.get().failures(f_locals.ptr(), recs, first_only)) throw nb::python_error();
                    nb::list out;
                    for (auto& r : recs) {
                        nb::object value = r.value ? nb::borrow(r.value.get()) : nb::none();
                        nb::object reason = r.reason.empty() ? nb::none() : nb::cast(r.reason);
                        out.append(nb::make_tuple(r.guard_id, value, reason, !r.value && !r.reason.empty()));
                    }
                    return out;
                },
                nb::arg("f_locals").none(), nb::arg("first_only"),
                "[(guard_id, value, reason, fetch_failed)] for failing guards, by installation order.")
            .def(
                "_tree",
                [](GuardSetCore& s) {
                    nb::list out;
                    for (const runtime::TreeRow& r : s.get().tree()) {
                        out.append(nb::make_tuple(r.depth, r.text, nb::cast(r.guard_ids), r.node_fails,
                                                  nb::cast(r.guard_fails), r.symbol));
                    }
                    return out;
                },
                "The guard tree, preorder: (depth, text, [guard ids in current order], node fails, "
                "[guard fails], SHAPE symbol index or -1), for explain().")
            .def(
                "_symbol_reader_facts",
                [](GuardSetCore& s, nb::handle f_locals, nb::handle f_globals) {
                    return reader_facts(s.get(), f_locals, f_globals);
                },
                nb::arg("f_locals"), nb::arg("f_globals").none(),
                nb::sig(
                    "def _symbol_reader_facts(self, f_locals: collections.abc.Mapping[str, typing.Any], "
                    "f_globals: dict[str, typing.Any] | None) -> list[tuple[str, tuple[typing.Any, ...]]]"),
                "What decides each SHAPE symbol's reader on this frame: [(printed symbol, ('frame',) | "
                "('unreadable', error type name) | ('property', tensor type, C-level answered, is array, is "
                "tensor))], in the program's symbol order (GuardSet.symbol_readers, explain()).")
            .def_prop_ro(
                "_shape_info",
                [](GuardSetCore& s) {
                    const core::shape::ShapeProgram& sp = s.get().program().shape;
                    nb::list relations;
                    static const char* const status[] = {"kept", "merged", "implied"};
                    for (std::size_t r = 0; r < sp.relations.size(); ++r) {
                        const core::shape::ShapeRelation& rel = sp.relations[r];
                        relations.append(nb::make_tuple(rel.id, status[static_cast<int>(rel.status)], rel.by,
                                                        s.get().relation_fail_counts()[r]));
                    }
                    std::size_t computed = 0;
                    for (const core::shape::ShapeInstr& in : sp.code)
                        computed += in.code != core::shape::Code::Check;
                    nb::dict out;
                    out["relations"] = relations;
                    out["symbols"] = sp.n_symbols();
                    out["operations"] = computed;
                    out["fast_path"] = sp.fast_ok;
                    return out;
                },
                "SHAPE relations: {'relations': [(id, 'kept'|'merged'|'implied', by id, failures)], "
                "'symbols', "
                "'operations' (distinct computed sub-expressions), 'fast_path'}.")
            .def(
                "_decls", [](GuardSetCore& s) { return s.get().program().guards; },
                "The declarations as compiled, in installation order (a loaded set's diagnostics are "
                "built from them).")
            .def_prop_ro("_ambient_ids", [](GuardSetCore& s) { return s.get().ambient_ids(); })
            .def_prop_ro("_relational_ids", [](GuardSetCore& s) { return s.get().relational_ids(); })
            .def(
                "_guard_path",
                [](GuardSetCore& s, std::uint32_t id) -> const char* {
                    const runtime::GuardSet& gs = s.get();
                    for (std::uint32_t gi = 0; gi < gs.program().guards.size(); ++gi) {
                        if (gs.program().guards[gi].id == id)
                            return gs.runtime_guard(gi).python_reader ? "python" : "native";
                    }
                    throw nb::key_error("no guard with that id");
                },
                nb::arg("id"),
                "'native' or 'python': how guard `id` reads its value (the adapter, the numpy "
                "struct, a C++ probe; or a Python reader).")
            .def(
                "_field_mismatches",
                [](GuardSetCore& s, std::uint32_t id, nb::handle value) {
                    const runtime::GuardSet& gs = s.get();
                    nb::list out;
                    for (std::uint32_t gi = 0; gi < gs.program().guards.size(); ++gi) {
                        if (gs.program().guards[gi].id != id) continue;
                        const runtime::RuntimeGuard& g = gs.runtime_guard(gi);
                        std::vector<runtime::FieldMismatch> found;
                        bool ok = true;
                        if (g.kind == core::GuardKind::TensorMatch) {
                            ok = runtime::tensor_mismatches(g, value.ptr(), found);
                        } else if (g.kind == core::GuardKind::ArrayMatch) {
                            ok = runtime::array_mismatches(g, value.ptr(), found);
                        } else {
                            throw nb::value_error("not a TENSOR_MATCH or ARRAY_MATCH guard");
                        }
                        if (!ok) throw nb::python_error();
                        for (const runtime::FieldMismatch& f : found) {
                            out.append(
                                nb::make_tuple(runtime::field_name(f.field), f.dim, f.expected, f.actual));
                        }
                        return out;
                    }
                    throw nb::key_error("no guard with that id");
                },
                nb::arg("id"), nb::arg("value").none(),
                "[(field, dim, expected, actual)]: every field where value differs from a TENSOR_MATCH or "
                "ARRAY_MATCH guard's expectation, as the engine reads it.")
            .def_prop_ro(
                "invalid", [](GuardSetCore& s) { return s.get().invalid(); },
                "True once an object the guards name by identity has died: the set never passes again.")
            .def_prop_ro("invalid_reason", [](GuardSetCore& s) { return s.get().invalid_reason(); })
            .def_prop_ro(
                "node_count", [](GuardSetCore& s) { return s.get().program().nodes.size(); },
                "Distinct sources (one fetch each).")
            .def_prop_ro(
                "_uses_fast_pass", [](GuardSetCore& s) { return s.get().uses_fast_pass(); },
                "Whether every guard has a form decided without user code (the fast pass alone can "
                "decide a passing check).")
            .def_prop_ro(
                "_fast_pass_count", [](GuardSetCore& s) { return s.get().stats().fast_passes; },
                "How many passing checks the fast pass decided alone (no residue).")
            .def_prop_ro(
                "_residue_pass_count", [](GuardSetCore& s) { return s.get().stats().residue_passes; },
                "How many passing checks the fast pass decided with its residues (guards that run user "
                "code, evaluated after it).")
            .def_prop_ro(
                "_fast_guard_count", [](GuardSetCore& s) { return s.get().fast_guard_count(); },
                "Guards the fast pass decides without user code (by kind; the others are residues).")
            .def_prop_ro(
                "_last_fast_guards", [](GuardSetCore& s) { return s.get().last_fast_guards(); },
                "Guards the fast pass decided in the last check it completed (fewer than "
                "_fast_guard_count when a fast form did not apply to the objects at hand).")
            .def_prop_ro(
                "_last_skipped_guards", [](GuardSetCore& s) { return s.get().stats().last_skipped_guards; },
                "Guards the skip of unchanged subtrees proved without evaluating them in the last check "
                "the fast pass completed.")
            .def_prop_ro(
                "_globals",
                [](GuardSetCore& s) -> nb::object {
                    PyObject* g = s.get().globals();
                    return g != nullptr ? nb::borrow(g) : nb::none();
                },
                nb::for_getter(nb::sig("def _globals(self, /) -> dict[str, typing.Any] | None")),
                "The globals dict G[...] sources read, or None.")
            .def_prop_ro(
                "_root_kinds",
                [](GuardSetCore& s) {
                    const runtime::GuardSet& g = s.get();
                    return nb::make_tuple(g.reads_globals(), g.reads_closure());
                },
                nb::for_getter(nb::sig("def _root_kinds(self, /) -> tuple[bool, bool]")),
                "(some source is rooted at G[...], some at C[...]).")
            .def_prop_ro("check_count", [](GuardSetCore& s) { return s.get().stats().checks; })
            .def_prop_ro("pass_count", [](GuardSetCore& s) { return s.get().stats().passes; })
            .def("__len__", [](GuardSetCore& s) { return s.get().size(); });
    g_core_type = reinterpret_cast<PyTypeObject*>(cls.ptr());
}

}  // namespace tripwire::bindings
