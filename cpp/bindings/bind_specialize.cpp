// tripwire/cpp/bindings/bind_specialize.cpp -- registers FastDispatch, the callable type of
// @tw.specialize (cpp/runtime/calls/fast_dispatch.hpp), and converts its set-up arguments.
#include <nanobind/nanobind.h>

#include "register.hpp"
#include "runtime/calls/fast_dispatch.hpp"

namespace nb = nanobind;

namespace tripwire::bindings {

void register_specialize(nb::module_& m) {
    PyTypeObject* t = runtime::fast_dispatch_type();
    if (t == nullptr) throw nb::python_error();
    m.attr("FastDispatch") = nb::steal(reinterpret_cast<PyObject*>(t));
    m.def(
        "_fast_setup",
        [](nb::handle self, nb::handle cache, nb::handle fn, nb::handle slow, nb::handle miss) {
            runtime::Cache* impl = cache_of(cache.ptr());
            if (impl == nullptr) throw nb::type_error("_fast_setup: cache must be a tripwire.Cache");
            if (!runtime::fast_dispatch_setup(self.ptr(), cache.ptr(), impl, fn.ptr(), slow.ptr(),
                                              miss.ptr()))
                throw nb::python_error();
        },
        nb::arg("self"), nb::arg("cache"), nb::arg("fn"), nb::arg("slow"), nb::arg("miss"),
        "Enable the C++ hit path of a FastDispatch: look `cache` up, fall back to slow(self, args, kwargs) "
        "and miss(self, args, kwargs, f_locals).");
    m.def(
        "_enable_vectorcall",
        [](nb::handle cls) {
            if (!PyType_Check(cls.ptr())) throw nb::type_error("_enable_vectorcall needs a class");
            return runtime::enable_vectorcall(reinterpret_cast<PyTypeObject*>(cls.ptr()));
        },
        nb::arg("cls"),
        "Give a subclass of FastDispatch the vectorcall protocol (3.11 does not inherit it); False when "
        "it defines a __call__ of its own.");
}

}  // namespace tripwire::bindings
