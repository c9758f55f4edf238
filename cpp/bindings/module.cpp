// tripwire/cpp/bindings/module.cpp -- the private extension module tripwire._core.
//
// Only registration lives here; each area binds itself in its own bind_<area>.cpp.
#include <nanobind/nanobind.h>

#include "register.hpp"

namespace tripwire::bindings {

nanobind::module_ testing_module(nanobind::module_& m) {
    return nanobind::borrow<nanobind::module_>(m.attr("testing"));
}

}  // namespace tripwire::bindings

NB_MODULE(_core, m) {
    m.doc() = "tripwire's compiled engine (private: use the tripwire package).";
    m.def_submodule("testing",
                    "Switches and hooks for tripwire's tests and benchmarks: process-wide engine switches "
                    "(fast pass, skip, frame walks), probes of internal readers, timing loops. Not for "
                    "other code.");
    tripwire::bindings::register_ir(m);
    tripwire::bindings::register_guard_set(m);
    tripwire::bindings::register_cache(m);
    tripwire::bindings::register_specialize(m);
    tripwire::bindings::register_frame(m);
    tripwire::bindings::register_values(m);
    tripwire::bindings::register_shape(m);
    tripwire::bindings::register_tensors(m);
    tripwire::bindings::register_serial(m);
    tripwire::bindings::register_diagnostics(m);
}
