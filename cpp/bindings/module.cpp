// tripwire/cpp/bindings/module.cpp -- the private extension module tripwire._core.
//
// Only registration lives here; each area binds itself in its own bind_<area>.cpp.
#include <nanobind/nanobind.h>

#include "register.hpp"

NB_MODULE(_core, m) {
    m.doc() = "tripwire's compiled engine (private: use the tripwire package).";
    tripwire::bindings::register_ir(m);
    tripwire::bindings::register_guard_set(m);
    tripwire::bindings::register_cache(m);
    tripwire::bindings::register_specialize(m);
    tripwire::bindings::register_frame(m);
    tripwire::bindings::register_values(m);
    tripwire::bindings::register_tensors(m);
    tripwire::bindings::register_serial(m);
    tripwire::bindings::register_diagnostics(m);
}
