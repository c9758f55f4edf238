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
#include "object_memo.hpp"
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

/// An interned str made once (the GIL is held; never freed, as the module's own names).
PyObject* interned_name(PyObject*& slot, const char* text) {
    if (slot == nullptr) {
        slot = PyUnicode_InternFromString(text);
        if (slot == nullptr) throw nb::python_error();
    }
    return slot;
}

/// A field of an exact tripwire.source.Step, owned (a plain dataclass: no user code runs).
nb::object field(PyObject* obj, PyObject*& name_slot, const char* name) {
    if (name_slot == nullptr) {
        name_slot = PyUnicode_InternFromString(name);
        if (name_slot == nullptr) throw nb::python_error();
    }
    PyObject* v = PyObject_GetAttr(obj, name_slot);
    if (v == nullptr) throw nb::python_error();
    return nb::steal(v);
}

/// `repr(name)` appended to `out`: written directly for an exact str of printable ASCII without a
/// quote or backslash (every root name Python's grammar admits: `'x'`), else Python's repr.
void append_str_repr(std::string& out, nb::handle name) {
    PyObject* s = name.ptr();
    if (PyUnicode_CheckExact(s) && PyUnicode_IS_ASCII(s)) {
        const auto* c = static_cast<const char*>(PyUnicode_DATA(s));
        const Py_ssize_t len = PyUnicode_GET_LENGTH(s);
        bool plain = true;
        for (Py_ssize_t i = 0; i < len && plain; ++i)
            plain = c[i] >= 0x20 && c[i] < 0x7f && c[i] != '\'' && c[i] != '\\';
        if (plain) {
            out += '\'';
            out.append(c, static_cast<std::size_t>(len));
            out += '\'';
            return;
        }
    }
    out += nb::cast<std::string>(nb::repr(name));
}

/// `str(sym)` of an exact tripwire.source.Source: the print Source.__str__ keeps in the instance
/// (`_text`, set when the source was parsed or first printed) when it is there and an exact str,
/// without calling __str__ (a Python frame); else str(sym), which computes and keeps it.
std::string printed_source(nb::handle sym) {
    static PyObject* s_text = nullptr;
    PyObject* kept = nullptr;
#if PY_VERSION_HEX >= 0x030D0000
    const int found = PyObject_GetOptionalAttr(sym.ptr(), interned_name(s_text, "_text"), &kept);
#else
    const int found = _PyObject_LookupAttr(sym.ptr(), interned_name(s_text, "_text"), &kept);
#endif
    if (found < 0) throw nb::python_error();
    const nb::object text = found == 1 ? nb::steal(kept) : nb::object();
    if (text.is_valid() && PyUnicode_CheckExact(text.ptr())) return nb::cast<std::string>(text);
    return nb::cast<std::string>(nb::str(sym));
}

/// `obj` as the engine's enum `T` (RootKind, StepKind). A member of T's own Python class is
/// converted once and then found by address (a member lives as long as its class; the cache
/// holds it too): nanobind's conversion reads the member's value each time (an attribute lookup).
template <typename T>
T enum_value(nb::handle obj) {
    static std::vector<std::pair<PyObject*, T>> seen;  // strong references, never dropped
    for (const auto& [member, value] : seen)
        if (member == obj.ptr()) return value;
    const T value = nb::cast<T>(obj);
    if (Py_TYPE(obj.ptr()) == reinterpret_cast<PyTypeObject*>(nb::type<T>().ptr()) && seen.size() < 256)
        seen.emplace_back(Py_NewRef(obj.ptr()), value);
    return value;
}

/// A SHAPE symbol's declaration template (guard_set.py, _symbol_decl): constant 0 is the root's
/// name, then each step's operand in order.
struct SymbolTemplate {
    runtime::Ref source;  ///< the C++ memo's key, kept alive so that its address names no other object
    core::SourcePath path;
    std::vector<runtime::Ref> consts;
    bool cpp_tensor = false;  ///< a step reads the C++ tensor
};

/// `out` made from the fields of `sym`, an exact tripwire.source.Source (the caller checks). Its
/// texts are its printed prefixes: for a symbol of at most one step (nearly every one:
/// ``L['x'].size()[0]``, ``L['n']``) the root's print and ``str(sym)`` (kept on the Source), else
/// ``sym.printed_prefixes()``. False when a step is not exactly `step_type` (a subclass may
/// answer has_operand and index its own way: the caller reads those in Python).
bool make_symbol_template(nb::handle sym, nb::handle step_type, SymbolTemplate& out) {
    static PyObject* s_kind = nullptr;
    static PyObject* s_arg = nullptr;
    static PyObject* s_root = nullptr;
    static PyObject* s_name = nullptr;
    static PyObject* s_steps = nullptr;
    const nb::object root_obj = field(sym.ptr(), s_root, "root");
    const nb::object name = field(sym.ptr(), s_name, "name");
    const nb::object steps_obj = field(sym.ptr(), s_steps, "steps");
    if (!PyTuple_CheckExact(steps_obj.ptr())) return false;
    const auto steps = nb::borrow<nb::tuple>(steps_obj);
    const std::size_t n = steps.size();
    for (nb::handle st : steps) {
        if (Py_TYPE(st.ptr()) != reinterpret_cast<PyTypeObject*>(step_type.ptr())) return false;
    }
    core::SourcePath& path = out.path;
    path.root = enum_value<core::RootKind>(root_obj);
    path.name = 0;
    path.steps.reserve(n);
    path.texts.reserve(n + 1);
    if (n <= 1) {
        static const char* const letter[] = {"L", "G", "C"};
        const auto root = static_cast<std::size_t>(path.root);
        if (root > 2) throw nb::value_error("unknown root kind");
        std::string& base = path.texts.emplace_back(letter[root]);
        base += '[';
        append_str_repr(base, name);
        base += ']';
        if (n == 1) path.texts.push_back(printed_source(sym));
    } else {
        for (nb::handle t : nb::list(sym.attr("printed_prefixes")()))
            path.texts.push_back(nb::cast<std::string>(t));
        if (path.texts.size() != n + 1) throw nb::value_error("a symbol's texts do not match its steps");
    }
    out.consts.reserve(n + 1);
    out.consts.push_back(runtime::Ref::borrow(name.ptr()));
    for (std::size_t i = 0; i < n; ++i) {
        PyObject* st = steps[i].ptr();
        const nb::object kind_obj = field(st, s_kind, "kind");
        const nb::object arg = field(st, s_arg, "arg");
        const auto kind = enum_value<core::StepKind>(kind_obj);
        core::Step& step = path.steps.emplace_back();
        step.kind = kind;
        if (core::step_takes_operand(kind)) {
            step.operand = static_cast<core::ConstId>(out.consts.size());
            out.consts.push_back(runtime::Ref::borrow(arg.ptr()));
        } else if (core::step_takes_index(kind)) {
            step.index = nb::cast<std::int64_t>(arg);
        }
        out.cpp_tensor = out.cpp_tensor || core::is_cpp_tensor_step(kind);
    }
    return true;
}

/// The template as Python's _SYMBOL_DECLS keeps it: (SourcePath, constants, whether a step reads
/// the C++ tensor), or None when a step is not exactly `step_type` (guard_set.py, _symbol_decl).
/// `sym` is an exact tripwire.source.Source (the caller checks).
nb::object symbol_template(nb::handle sym, nb::handle step_type) {
    SymbolTemplate t;
    if (!make_symbol_template(sym, step_type, t)) return nb::none();
    nb::tuple consts = nb::steal<nb::tuple>(PyTuple_New(static_cast<Py_ssize_t>(t.consts.size())));
    if (!consts.is_valid()) throw nb::python_error();
    for (std::size_t i = 0; i < t.consts.size(); ++i)
        PyTuple_SET_ITEM(consts.ptr(), static_cast<Py_ssize_t>(i), t.consts[i].release());
    return nb::make_tuple(nb::cast(std::move(t.path)), consts, t.cpp_tensor);
}

// Templates of exact Sources, by object (_shape_symbol_templates; Python's _SYMBOL_DECLS keeps those
// made by _symbol_decl). A Source and its Steps are frozen dataclasses (tripwire treats them as
// immutable everywhere), so a template stays the object's while the memo holds the object.
// Bounded (emptied at 4096 entries); emptied by _clear_symbol_templates
// (builder.clear_build_memos).
using SymbolTemplates = ObjectMemo<SymbolTemplate, 4096>;
SymbolTemplates& symbol_templates() {
    static auto* m = new SymbolTemplates();  // never destroyed: it holds Python objects
    return *m;
}

void clear_symbol_templates() { symbol_templates().clear(); }

/// The template of `sym`, an exact Source: the memoised one, else made now and memoised. Null
/// when a step is not exactly `step_type`.
std::shared_ptr<const SymbolTemplate> symbol_template_of(PyObject* sym, nb::handle step_type) {
    if (std::shared_ptr<const SymbolTemplate> kept = symbol_templates().find(sym)) return kept;
    auto made = std::make_shared<SymbolTemplate>();
    made->source = runtime::Ref::borrow(sym);
    if (!make_symbol_template(sym, step_type, *made)) return nullptr;
    // Making it may have run Python code (str(sym), printed_prefixes(), a collection), which may
    // have changed the memo: put() looks it up again.
    symbol_templates().put(sym, made);
    return made;
}

/// A set's SHAPE symbols' declaration templates, each shared with the memo that keeps it
/// (_shape_symbol_templates' answer, taken by GuardSetCore.__init__ with each template's constant
/// ids in the set's pool).
struct SymbolPaths {
    std::vector<std::shared_ptr<const core::SourcePath>> paths;
};

/// GuardSet's SHAPE symbols' templates in one call (guard_set.py, _ShapeDecls.symbol_templates):
/// the distinct symbols of the argument tuples `args` (by identity, in order of first use), their
/// declaration templates (constant ids local: 0 the root's name, then each step operand), each
/// template's constants, and whether a step reads the C++ tensor. The constants are interned into
/// the set's pool by Python (_Pool.intern, the pool's one interning). None when a symbol is not an
/// exact `source_type` of exact `step_type` steps: Python declares those (a subclass prints and
/// numbers its own way).
nb::object shape_symbol_templates(nb::list args, nb::handle source_type, nb::handle step_type) {
    // The distinct symbols, held by `syms` (Python code may run below: a symbol's print).
    const nb::object distinct = owned(runtime::distinct_shape_symbols(args.ptr(), source_type.ptr()));
    if (distinct.is_none()) return nb::none();
    const auto syms = nb::borrow<nb::list>(distinct);
    const std::size_t n = syms.size();
    SymbolPaths out;
    out.paths.reserve(n);
    nb::list consts;
    bool cpp_tensor = false;
    for (std::size_t k = 0; k < n; ++k) {
        std::shared_ptr<const SymbolTemplate> t = symbol_template_of(syms[k].ptr(), step_type);
        if (t == nullptr) return nb::none();
        nb::list local;
        for (const runtime::Ref& c : t->consts) local.append(nb::handle(c.get()));
        consts.append(local);
        cpp_tensor = cpp_tensor || t->cpp_tensor;
        out.paths.emplace_back(t, &t->path);  // aliases the template: no copy
    }
    return nb::make_tuple(syms, nb::cast(std::move(out)), consts, cpp_tensor);
}

}  // namespace

runtime::GuardSet* guard_set_of(PyObject* o) { return shared_guard_set_of(o).get(); }

std::shared_ptr<runtime::GuardSet> shared_guard_set_of(PyObject* o) {
    if (g_core_type == nullptr || !PyObject_TypeCheck(o, g_core_type) || !nb::inst_ready(o)) return nullptr;
    return nb::inst_ptr<GuardSetCore>(o)->impl;
}

void register_guard_set(nb::module_& m) {
    m.def(
        "_shape_distinct_symbols",
        [](nb::handle args) { return owned(runtime::distinct_shape_symbols(args.ptr(), nullptr)); },
        nb::arg("args"), nb::sig("def _shape_distinct_symbols(args: list[typing.Any]) -> list[typing.Any]"),
        "The distinct symbols (by identity, in order of first use) of SHAPE argument tuples (text, "
        "symbols, types): GuardSet's encoding.");
    m.def(
        "_shape_specs",
        [](nb::handle specs, nb::handle spec_type, nb::handle shape_kind) {
            return owned(runtime::shape_specs(specs.ptr(), spec_type.ptr(), shape_kind.ptr()));
        },
        nb::arg("specs"), nb::arg("spec_type"), nb::arg("shape_kind"),
        nb::sig("def _shape_specs(specs: list[typing.Any], spec_type: type, shape_kind: typing.Any) -> "
                "tuple[list[int], list[tuple[typing.Any, ...]]] | None"),
        "(indices, argument tuples) of specs that are all exact spec_type SHAPE relations with exact "
        "3-tuples, else None (guard_set.py, _encode).");
    m.def("_symbol_template", &symbol_template, nb::arg("sym"), nb::arg("step_type"),
          nb::sig("def _symbol_template(sym: typing.Any, step_type: type) -> "
                  "tuple[SourcePath, tuple[typing.Any, ...], bool] | None"),
          "A SHAPE symbol's declaration template from an exact Source: (SourcePath, constants, reads the "
          "C++ tensor), or None when a step is not exactly step_type (guard_set.py, _symbol_decl).");
    const auto symbol_paths =
        nb::class_<SymbolPaths>(m, "_SymbolPaths",
                                "A set's SHAPE symbols' declaration templates, made by "
                                "_shape_symbol_templates for GuardSetCore.__init__ (opaque).");
    (void)symbol_paths;  // registered: the class object lives in the module
    m.def(
        "_shape_symbol_templates", &shape_symbol_templates, nb::arg("args"), nb::arg("source_type"),
        nb::arg("step_type"),
        nb::sig(
            "def _shape_symbol_templates(args: list[tuple[typing.Any, ...]], source_type: type, "
            "step_type: type) -> tuple[list[typing.Any], _SymbolPaths, list[list[typing.Any]], bool] | None"),
        "(distinct symbols, their declaration templates, each template's constants, a step reads the "
        "C++ tensor) of SHAPE argument tuples; None when a symbol needs Python's declaration "
        "(guard_set.py, _ShapeDecls.symbol_templates).");
    m.def("_clear_symbol_templates", &clear_symbol_templates,
          "Empty _shape_symbol_templates' memo of symbol templates (builder.clear_build_memos).");
    auto cls =
        nb::class_<GuardSetCore>(m, "GuardSetCore", nb::type_slots(g_core_slots),
                                 "The compiled guard set. Use tripwire.GuardSet, which subclasses it.")
            .def(
                "__init__",
                [](GuardSetCore* self, std::vector<core::GuardDecl> decls, nb::list consts,
                   nb::list hold_weakly, nb::object globals, nb::object closure, bool strict,
                   nb::object eval_error_type, nb::list shape_at, nb::list shape_ids, nb::list shape_args,
                   nb::list shape_symbols, nb::handle shape_paths, nb::handle shape_remaps) {
                    runtime::GuardSetInputs in;
                    if (!shape_args.empty()) {
                        // The symbols' declarations: templates (the _SymbolPaths of
                        // _shape_symbol_templates, or a list of SourcePaths) and their pool ids
                        // (guard_set.py, _ShapeDecls.symbol_templates).
                        std::vector<const core::SourcePath*> templates;
                        if (nb::isinstance<SymbolPaths>(shape_paths)) {
                            for (const auto& p : nb::cast<const SymbolPaths&>(shape_paths).paths)
                                templates.push_back(p.get());
                        } else {
                            if (!PyList_CheckExact(shape_paths.ptr()))
                                throw nb::type_error(
                                    "SHAPE symbol declarations are a list (or _SymbolPaths)");
                            for (nb::handle p : nb::borrow<nb::list>(shape_paths)) {
                                if (!nb::isinstance<core::SourcePath>(p))
                                    throw nb::type_error("a SHAPE symbol's declaration is a SourcePath");
                                templates.push_back(&nb::cast<const core::SourcePath&>(p));
                            }
                        }
                        std::vector<core::SharedPath> shared;
                        if (!runtime::symbol_paths(templates, shape_remaps.ptr(), shared) ||
                            !runtime::add_shape_decls(decls, shape_at.ptr(), shape_ids.ptr(),
                                                      shape_args.ptr(), shape_symbols.ptr(), shared))
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
                nb::arg("shape_paths") = nb::list(), nb::arg("shape_remaps").none() = nb::list())
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
}

}  // namespace tripwire::bindings
