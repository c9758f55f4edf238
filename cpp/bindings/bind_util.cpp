// tripwire/cpp/bindings/bind_util.cpp -- helpers: dict stamps, IR metadata.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "../core/program.hpp"
#include "../runtime/predicates.hpp"
#include "register.hpp"

namespace nb = nanobind;

namespace tripwire::bindings {

void register_util(nb::module_& m) {
    m.def(
        "_dict_version",
        [](nb::dict d) -> std::uint64_t {
            if (!runtime::init_dict_stamps()) throw nb::python_error();
            return runtime::dict_stamp(d.ptr());
        },
        nb::arg("d"), nb::sig("def _dict_version(d: dict, /) -> int"),
        "The engine's version stamp of dict d (changes on every mutation; unique across dicts).");
    m.def(
        "_guard_kind_name", [](int k) { return std::string(core::guard_kind_name(static_cast<core::GuardKind>(k))); },
        nb::arg("kind"), "The catalogue name of a guard kind number.");
    m.attr("MAX_SOURCE_DEPTH") = core::kMaxSourceDepth;
}

}  // namespace tripwire::bindings
