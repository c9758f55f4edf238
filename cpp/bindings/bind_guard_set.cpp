// tripwire/cpp/bindings/bind_guard_set.cpp -- GuardSetCore: converts arguments, calls runtime.
//
// The Python class tripwire.GuardSet subclasses GuardSetCore and adds why_not/explain in Python;
// check() stays a direct C++ call.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <exception>
#include <memory>
#include <new>
#include <utility>

#include "core/codec/document.hpp"
#include "core/ir.hpp"
#include "core/program.hpp"
#include "core/shape/program.hpp"
#include "register.hpp"
#include "runtime/eval/diagnostics.hpp"
#include "runtime/eval/guard_set.hpp"
#include "runtime/eval/shape_decls.hpp"
#include "runtime/py.hpp"
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

/// A new reference from the runtime (null: its Python error is raised).
nb::object owned(PyObject* o) {
    if (o == nullptr) throw nb::python_error();
    return nb::steal(o);
}

/// Each SHAPE symbol's declaration (the caller's `paths[k]`, its ids the set's pool's), made once
/// per set and shared by every relation that names it (core::SharedPath).
std::vector<core::SharedPath> shared_paths_of(const std::vector<core::SourcePath>& paths) {
    std::vector<core::SharedPath> shared;
    shared.reserve(paths.size());
    for (const core::SourcePath& p : paths) shared.push_back(std::make_shared<core::SourcePath>(p));
    return shared;
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
                        if (!runtime::add_shape_decls(decls, shape_at.ptr(), shape_ids.ptr(),
                                                      shape_args.ptr(), shape_symbols.ptr(),
                                                      shared_paths_of(shape_paths)))
                            throw nb::python_error();
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
                    return owned(runtime::symbol_reader_facts(s.get(), f_locals.ptr(), f_globals.ptr()));
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
                    const std::int64_t gi = runtime::guard_position(s.get(), id);
                    if (gi < 0) throw nb::key_error("no guard with that id");
                    return s.get().runtime_guard(static_cast<std::uint32_t>(gi)).python_reader ? "python"
                                                                                               : "native";
                },
                nb::arg("id"),
                "'native' or 'python': how guard `id` reads its value (the adapter, the numpy "
                "struct, a C++ probe; or a Python reader).")
            .def(
                "_field_mismatches",
                [](GuardSetCore& s, std::uint32_t id, nb::handle value) {
                    const std::int64_t gi = runtime::guard_position(s.get(), id);
                    if (gi < 0) throw nb::key_error("no guard with that id");
                    std::vector<runtime::FieldMismatch> found;
                    if (!runtime::field_mismatches(s.get().runtime_guard(static_cast<std::uint32_t>(gi)),
                                                   value.ptr(), found))
                        throw nb::python_error();
                    nb::list out;
                    for (const runtime::FieldMismatch& f : found)
                        out.append(nb::make_tuple(runtime::field_name(f.field), f.dim, f.expected, f.actual));
                    return out;
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
    m.def(
        "with_shape_decls",
        [](std::vector<core::GuardDecl> decls, nb::list shape_at, nb::list shape_ids, nb::list shape_args,
           nb::list shape_symbols, const std::vector<core::SourcePath>& shape_paths) {
            if (!runtime::add_shape_decls(decls, shape_at.ptr(), shape_ids.ptr(), shape_args.ptr(),
                                          shape_symbols.ptr(), shared_paths_of(shape_paths)))
                throw nb::python_error();
            return decls;
        },
        nb::arg("decls"), nb::arg("shape_at"), nb::arg("shape_ids"), nb::arg("shape_args"),
        nb::arg("shape_symbols"), nb::arg("shape_paths"),
        "The declarations with the SHAPE relations placed among them, declared as GuardSetCore's "
        "constructor declares them (the same arguments): what a saved set encodes.");
}

}  // namespace tripwire::bindings
