// tripwire/cpp/bindings/bind_diagnostics.cpp -- switches and facts for tests and benchmarks.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <string>

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
    m.def(
        "user_stack",
        [](nb::handle is_machinery, int depth) {
            PyObject* t = runtime::user_stack(is_machinery.ptr(), depth);
            if (t == nullptr) throw nb::python_error();
            return nb::steal<nb::tuple>(t);
        },
        nb::arg("is_machinery"), nb::arg("depth"),
        "The caller's stack outside tripwire's machinery, innermost last, at most `depth` entries, as "
        "'file:line in func' (is_machinery(filename) is asked once per file).");
    m.def(
        "_set_machinery_rule",
        [](nb::handle is_machinery, const std::optional<std::string>& dir) {
            runtime::set_machinery_rule(dir ? is_machinery.ptr() : nullptr, dir ? *dir : std::string());
        },
        nb::arg("is_machinery"), nb::arg("dir").none(),
        "Set once by tripwire.builder: user_stack answers is_machinery itself for '<frozen ...' filenames "
        "and absolute normal POSIX paths under the package directory `dir`, as builder._is_machinery does "
        "(None: no rule; runtime/frame/install_site.hpp, set_machinery_rule).");
    m.def(
        "_instruction_lines",
        [](nb::handle code, int offset) {
            if (!PyCode_Check(code.ptr())) throw nb::type_error("needs a code object");
            auto* co = reinterpret_cast<PyCodeObject*>(code.ptr());
            return nb::make_tuple(runtime::instruction_line(co, offset), PyCode_Addr2Line(co, offset));
        },
        nb::arg("code"), nb::arg("offset"),
        "Test hook: (the install-site walk's line of the instruction at byte `offset` of `code`, "
        "PyCode_Addr2Line's): the two must agree.");
    m.def("_set_frame_object_walk", &runtime::set_frame_object_walk, nb::arg("on"),
          "Test hook: user_stack walks frame objects (on) or reads the frames without making them (off: once "
          "the next walk has checked that the two agree, where this build can read them); returns whether "
          "frame objects were walked.");
    m.def("_frame_walks_agree", &runtime::frame_walks_agree,
          "Test hook: whether reading the calling thread's frames gives the frame-object walk's (code, "
          "instruction) list here and now (False without the frame layout mirror).");
    m.def(
        "_clear_install_site_memo", [] { runtime::clear_install_site_memo(); },
        "Drop the memoised install-site strings and machinery answers (tests).");
    m.def(
        "_dict_hints_enabled",
        [] {
            runtime::verify_dict_hints();
            return runtime::g_dict_hints_enabled;
        },
        "Whether dict entry hints (the interpreter's dict layout, verified at start-up) are in use.");
    m.def(
        "_set_fast_pass",
        [](bool on) {
            const bool was = runtime::fast_pass_enabled();
            runtime::set_fast_pass_enabled(on);
            return was;
        },
        nb::arg("on"),
        "Test hook: switch GuardSet.check's straight-line fast pass on or off process-wide; returns "
        "the previous setting. Off, every check takes the tree walk.");
    m.def(
        "_set_skip",
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
    m.def(
        "_dict_watch_counts",
        [] {
            std::size_t dicts = 0, armed = 0;
            runtime::dict_watch_counts(dicts, armed);
            return nb::make_tuple(dicts, armed);
        },
        "(dicts the 3.12+ dict watcher stamps, DICT_VERSION change flags armed on them); (0, 0) before "
        "3.12.");
    // Debug builds abort when user code runs inside a region that promises none (no_user_code.hpp).
    m.attr("_CHECKS_REGIONS") = runtime::kChecksRegions;
}

}  // namespace tripwire::bindings
