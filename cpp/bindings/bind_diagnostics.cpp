// tripwire/cpp/bindings/bind_diagnostics.cpp -- switches and facts for tests and benchmarks.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "core/program.hpp"
#include "register.hpp"
#include "runtime/eval/dict_hint.hpp"
#include "runtime/eval/guard_kinds.hpp"
#include "runtime/eval/guard_set.hpp"
#include "runtime/eval/no_user_code.hpp"
#include "runtime/frame/install_site.hpp"
#include "runtime/tensors/readers.hpp"

namespace nb = nanobind;

namespace tripwire::bindings {

void register_diagnostics(nb::module_& m) {
    nb::module_ testing = testing_module(m);
    m.def(
        "user_stack",
        [](nb::handle is_machinery, int depth) {
            PyObject* t = runtime::user_stack(is_machinery.ptr(), depth);
            if (t == nullptr) throw nb::python_error();
            return nb::steal<nb::tuple>(t);
        },
        nb::arg("is_machinery"), nb::arg("depth"),
        "The caller's stack outside tripwire's machinery, innermost last, at most `depth` entries, as "
        "'file:line in func' (is_machinery(filename) is asked once per (code, instruction)).");
    m.def(
        "_clear_install_site_memo", [] { runtime::clear_install_site_memo(); },
        "Drop the memoised install-site strings (tests).");
    m.def(
        "_dict_hints_enabled",
        [] {
            runtime::verify_dict_hints();
            return runtime::g_dict_hints_enabled;
        },
        "Whether dict entry hints (the interpreter's dict layout, verified at start-up) are in use.");
    testing.def(
        "set_fast_pass",
        [](bool on) {
            const bool was = runtime::fast_pass_enabled();
            runtime::set_fast_pass_enabled(on);
            return was;
        },
        nb::arg("on"),
        "Test hook: switch GuardSet.check's straight-line fast pass on or off process-wide; returns "
        "the previous setting. Off, every check takes the tree walk.");
    testing.def(
        "set_skip",
        [](bool on) {
            runtime::verify_dict_hints();
            return runtime::set_skip_enabled(on);
        },
        nb::arg("on"),
        "Test hook: switch the skip of unchanged subtrees (dict version tags) on or off process-wide; "
        "returns the previous setting. Off, every check evaluates every guard. On only where the "
        "tag reading was verified at start-up.");
    m.def(
        "_skip_enabled",
        [] {
            runtime::verify_dict_hints();
            return runtime::g_skip_enabled;
        },
        "Whether the skip of unchanged subtrees is in use (verified at start-up, not switched off).");
    m.def(
        "_force_python_readers",
        [](bool on) {
            const bool was = runtime::force_python_readers();
            runtime::set_force_python_readers(on);
            return was;
        },
        nb::arg("on"),
        "Test hook: guard sets built while on read tensors, arrays and torch's state through the Python "
        "readers even when the torch adapter or the numpy struct is available; returns the previous "
        "setting.");
    testing.def(
        "dict_watch_counts",
        [] {
            std::size_t dicts = 0, armed = 0;
            runtime::dict_watch_counts(dicts, armed);
            return nb::make_tuple(dicts, armed);
        },
        "(dicts the 3.12+ dict watcher stamps, DICT_VERSION change flags armed on them); (0, 0) before "
        "3.12.");
    // Debug builds abort when user code runs inside a region that promises none (no_user_code.hpp).
    testing.attr("CHECKS_REGIONS") = runtime::kChecksRegions;
}

}  // namespace tripwire::bindings
