// tripwire/cpp/bindings/bind_values.cpp -- the engine's reading of values, for the builder.
//
// The builder reads example values, decides what is a constant and snapshots probes through the
// engine itself, so that a guard is built on exactly what a check will see and compare. The
// test oracle (tripwire.reference) has its own, independent Python versions of all of these.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "core/ir.hpp"
#include "register.hpp"
#include "runtime/eval/dict_getattr.hpp"
#include "runtime/eval/fetch.hpp"
#include "runtime/eval/guard_kinds.hpp"

namespace nb = nanobind;

namespace tripwire::bindings {
namespace {

core::BuiltinProbe probe_named(const std::string& name) {
    for (int i = 0; i < core::kBuiltinProbeCount; ++i) {
        const auto p = static_cast<core::BuiltinProbe>(i);
        if (core::builtin_probe_name(p) == name) return p;
    }
    throw nb::value_error(("unknown built-in probe " + name).c_str());
}

}  // namespace

void register_values(nb::module_& m) {
    m.def(
        "read_source",
        [](core::RootKind root, nb::str name, std::vector<nb::tuple> steps, nb::handle f_locals,
           nb::handle f_globals, nb::handle f_closure) {
            runtime::RuntimeRoot r;
            r.kind = root;
            r.name = name.ptr();
            if (root == core::RootKind::Closure && PyDict_Check(f_closure.ptr())) {
                PyObject* cell = PyDict_GetItemWithError(f_closure.ptr(), name.ptr());
                if (cell == nullptr && PyErr_Occurred()) throw nb::python_error();
                r.cell = cell != nullptr && PyCell_Check(cell) ? cell : nullptr;
            }
            std::vector<runtime::RuntimeStep> rs(steps.size());
            for (std::size_t i = 0; i < steps.size(); ++i) {
                if (steps[i].size() != 3) throw nb::value_error("a step is (kind, operand, index)");
                rs[i].kind = nb::cast<core::StepKind>(steps[i][0]);
                rs[i].operand = steps[i][1].ptr();  // borrowed from `steps`, alive for the call
                rs[i].index = nb::cast<Py_ssize_t>(steps[i][2]);
            }
            PyObject* globals = PyDict_Check(f_globals.ptr()) ? f_globals.ptr() : nullptr;
            runtime::Ref v =
                runtime::read_source(r, rs, runtime::Locals::of_mapping(f_locals.ptr()), globals);
            if (!v) throw nb::python_error();
            return nb::steal(v.release());
        },
        nb::arg("root"), nb::arg("name"), nb::arg("steps"), nb::arg("f_locals"), nb::arg("f_globals").none(),
        nb::arg("f_closure").none(),
        "The value at a source, read as a check reads it: steps are (kind, operand, index). Raises "
        "LookupError for a missing value, or what a step raised.");
    m.def(
        "is_constant",
        [](nb::handle v, int depth) {
            const int r = runtime::is_constant(v.ptr(), depth);
            if (r < 0) throw nb::python_error();
            return r == 1;
        },
        nb::arg("value").none(), nb::arg("depth") = 0,
        "Whether value may be an EQUALS_MATCH constant, nested within MAX_CONSTANT_DEPTH - depth.");
    m.def(
        "equals_match",
        [](nb::handle v, nb::handle c) {
            const int r = runtime::equals_match(v.ptr(), c.ptr());
            if (r < 0) throw nb::python_error();
            return r == 1;
        },
        nb::arg("value").none(), nb::arg("constant").none(),
        "EQUALS_MATCH of value against constant, as a check decides it.");
    m.def(
        "read_builtin_probe",
        [](const std::string& name) {
            return nb::steal(runtime::builtin_probe_value(probe_named(name)).release());
        },
        nb::arg("name"), "The current value of a built-in global-state probe.");
    m.def(
        "dict_version",
        [](nb::dict d) {
            std::uint64_t v = 0;
            if (!runtime::dict_version(d.ptr(), v)) throw nb::python_error();
            return v;
        },
        nb::arg("d"),
        "The engine's version stamp of dict d (changes on every mutation; unique across dicts).");
    m.def(
        "register_dict_getattr",
        [](nb::handle fn, nb::handle dicts) {
            if (!runtime::register_dict_getattr(fn.ptr(), dicts.ptr())) throw nb::python_error();
        },
        nb::arg("fn"), nb::arg("dicts"),
        "Declare fn, a class __getattr__, to look a name up in the instance dict's dicts named by "
        "dicts (a tuple of str), in order, and otherwise raise AttributeError formatted from "
        "type(self).__name__, as nn.Module.__getattr__ does: a check then decides `not hasattr` on "
        "a miss without calling it, while fn's code is unchanged. The claim is the caller's.");
}

}  // namespace tripwire::bindings
