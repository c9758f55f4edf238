// tripwire/cpp/bindings/bind_frame.cpp -- the frame runtime (cpp/runtime/frame) for python/tripwire/frame.py.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <string>

#include "register.hpp"
#include "runtime/frame/code_state.hpp"
#include "runtime/frame/hook.hpp"
#include "runtime/frame/interp_frame.hpp"
#include "runtime/frame/replacement.hpp"

namespace nb = nanobind;

namespace tripwire::bindings {
namespace {

PyCodeObject* as_code(nb::handle o) {
    if (!PyCode_Check(o.ptr())) throw nb::type_error("expected a code object");
    return reinterpret_cast<PyCodeObject*>(o.ptr());
}

nb::object hook_tuple(runtime::Ref& handler, runtime::Ref& backend) {
    if (!handler) return nb::none();
    return nb::make_tuple(nb::steal(handler.release()), nb::steal(backend.release()));
}

}  // namespace

void register_frame(nb::module_& m) {
    nb::module_ testing = testing_module(m);
    PyTypeObject* t = runtime::frame::replacement_type();
    if (t == nullptr) throw nb::python_error();
    nb::object repl = nb::steal(reinterpret_cast<PyObject*>(t));
    auto check = [t](nb::handle self) {
        if (Py_TYPE(self.ptr()) != t) throw nb::type_error("expected a Replacement");
    };
    nb::object property = nb::module_::import_("builtins").attr("property");
    repl.attr("original") = property(nb::cpp_function(
        [check](nb::handle self) -> nb::object {
            check(self);
            PyObject* o = runtime::frame::replacement_original(self.ptr());
            return o != nullptr ? nb::borrow(o) : nb::none();
        },
        nb::is_method(), nb::sig("def original(self) -> types.CodeType | None"),
        "The code object this replacement was checked against (None once it died)."));
    repl.attr("code") = property(nb::cpp_function(
        [check](nb::handle self) {
            check(self);
            return nb::borrow(runtime::frame::replacement_code(self.ptr()));
        },
        nb::is_method(), nb::sig("def code(self) -> types.CodeType"), "The replacement code object."));
    m.attr("Replacement") = repl;
    PyTypeObject* scope = runtime::frame::scope_type();
    if (scope == nullptr) throw nb::python_error();
    nb::object scope_obj = nb::steal(reinterpret_cast<PyObject*>(scope));
    const char* fields[4][2] = {{"fn", "The callable called in the scope."},
                                {"handler", "The hook's handler (None: a suspended call)."},
                                {"backend", "The hook's backend key (None: a suspended call)."},
                                {"fallback", "Called instead when the hook cannot be set, or None."}};
    for (int i = 0; i < 4; ++i) {
        const std::string sig = std::string("def ") + fields[i][0] + "(self) -> typing.Any";
        scope_obj.attr(fields[i][0]) = property(nb::cpp_function(
            [i](nb::handle self) {
                PyObject* o = runtime::frame::scope_field(self.ptr(), i);
                if (o == nullptr) throw nb::python_error();
                return nb::steal(o);
            },
            nb::is_method(), nb::sig(sig.c_str()), fields[i][1]));
    }
    m.attr("FrameScope") = scope_obj;
    m.def(
        "_frame_limit_reached",
        [](nb::handle cache, nb::handle f_locals) {
            runtime::Cache* impl = cache_of(cache.ptr());
            if (impl == nullptr) throw nb::type_error("_frame_limit_reached: cache must be a tripwire.Cache");
            if (!PyDict_Check(f_locals.ptr()))
                throw nb::type_error("_frame_limit_reached: f_locals must be a dict");
            const int r = impl->limit_reached(f_locals.ptr());
            if (r < 0) throw nb::python_error();
            return r;
        },
        nb::arg("cache"), nb::arg("f_locals"),
        nb::sig("def _frame_limit_reached(cache: CacheCore, f_locals: dict[str, typing.Any]) -> int"),
        "0, or the limit (1 recompile_limit, 2 accumulated_limit) an insert for these locals would reach.");
    m.def(
        "_frame_setup", [](nb::handle error_type) { runtime::frame::set_frame_error_type(error_type.ptr()); },
        nb::arg("error_type"), "Set the exception type of frame-hook conflicts (tripwire.FrameError).");
    m.def(
        "_frame_set_hook",
        [](nb::handle handler, nb::handle backend) {
            const bool clear = handler.is_none();
            if (clear != backend.is_none())
                throw nb::value_error("handler and backend are both None or neither");
            runtime::Ref prev_handler, prev_backend;
            if (!runtime::frame::set_thread_hook(clear ? nullptr : handler.ptr(),
                                                 clear ? nullptr : backend.ptr(), prev_handler, prev_backend))
                throw nb::python_error();
            return hook_tuple(prev_handler, prev_backend);
        },
        nb::arg("handler").none(), nb::arg("backend").none(),
        nb::sig("def _frame_set_hook(handler: typing.Callable[..., typing.Any] | None, backend: typing.Any, "
                "/) -> "
                "tuple[typing.Any, typing.Any] | None"),
        "Set (or clear, with None, None) this thread's frame hook; returns the previous (handler, backend) "
        "or None.");
    m.def(
        "_frame_get_hook",
        [] {
            runtime::Ref handler, backend;
            runtime::frame::thread_hook(handler, backend);
            return hook_tuple(handler, backend);
        },
        nb::sig("def _frame_get_hook() -> tuple[typing.Any, typing.Any] | None"),
        "This thread's (handler, backend), or None.");
    m.def(
        "_frame_status",
        [] {
            const runtime::frame::HookStatus s = runtime::frame::hook_status();
            nb::dict d;
            d["installed"] = s.installed;
            d["active_threads"] = s.active_threads;
            d["layout_verified"] = s.layout_verified;
            d["layout_error"] = s.layout_error;
            d["eval_frame"] = s.current_eval;
            return d;
        },
        nb::sig("def _frame_status() -> dict[str, typing.Any]"),
        "installed, active_threads, layout_verified, layout_error, eval_frame ('default', 'tripwire', "
        "'foreign').");
    m.def(
        "_frame_verify_layout",
        [] {
            std::string why;
            const bool ok = runtime::frame::verify_layout_now(why);
            return nb::make_tuple(ok, why);
        },
        nb::sig("def _frame_verify_layout() -> tuple[bool, str]"),
        "Check the interpreter-frame layout mirror now: (ok, why it failed).");
    m.def(
        "_frame_incompatibility",
        [](nb::handle original, nb::handle code) -> nb::object {
            const std::string why = runtime::frame::incompatibility(as_code(original), as_code(code));
            return why.empty() ? nb::none() : nb::cast(why);
        },
        nb::arg("original"), nb::arg("code"),
        nb::sig("def _frame_incompatibility(original: types.CodeType, code: types.CodeType) -> str | None"),
        "Why `code` cannot run in frames of `original`, or None.");
    m.def(
        "_frame_cache",
        [](nb::handle code, nb::handle backend) -> nb::object {
            runtime::frame::BackendSlot* s =
                runtime::frame::backend_slot(as_code(code), backend.ptr(), false);
            if (s == nullptr || !s->cache_object) return nb::none();
            return nb::borrow(s->cache_object.get());
        },
        nb::arg("code"), nb::arg("backend").none(),
        nb::sig("def _frame_cache(code: types.CodeType, backend: typing.Any) -> CacheCore | None"),
        "The cache of `code` for `backend`, or None.");
    m.def(
        "_frame_attach_cache",
        [](nb::handle code, nb::handle backend, nb::handle cache) {
            runtime::Cache* impl = cache_of(cache.ptr());
            if (impl == nullptr) throw nb::type_error("_frame_attach_cache: cache must be a tripwire.Cache");
            if (!runtime::frame::attach_cache(as_code(code), backend.ptr(), cache.ptr(), impl))
                throw nb::python_error();
        },
        nb::arg("code"), nb::arg("backend").none(), nb::arg("cache"),
        nb::sig(
            "def _frame_attach_cache(code: types.CodeType, backend: typing.Any, cache: CacheCore) -> None"),
        "Make `cache` the cache of `code` for `backend`.");
    m.def(
        "_frame_strategy",
        [](nb::handle code, nb::handle backend) {
            runtime::frame::BackendSlot* s =
                runtime::frame::backend_slot(as_code(code), backend.ptr(), false);
            return static_cast<int>(s == nullptr ? runtime::frame::Strategy::Default : s->strategy);
        },
        nb::arg("code"), nb::arg("backend").none(),
        nb::sig("def _frame_strategy(code: types.CodeType, backend: typing.Any) -> int"),
        "0 default, 1 skip, 2 run-only, 3 skip-recursive.");
    testing.def(
        "frame_set_strategy",
        [](nb::handle code, nb::handle backend, int strategy) {
            if (strategy < 0 || strategy > 3) throw nb::value_error("strategy must be 0, 1, 2 or 3");
            if (!runtime::frame::set_strategy(as_code(code), backend.ptr(),
                                              static_cast<runtime::frame::Strategy>(strategy)))
                throw nb::python_error();
        },
        nb::arg("code"), nb::arg("backend").none(), nb::arg("strategy"),
        nb::sig("def frame_set_strategy(code: types.CodeType, backend: typing.Any, strategy: int) -> None"));
    testing.def(
        "frame_backends",
        [](nb::handle code) {
            nb::list out;
            runtime::frame::CodeState* st = runtime::frame::code_state(as_code(code));
            if (st == nullptr) return out;
            for (std::size_t i = 0; i < st->slots.size(); ++i) {
                const runtime::frame::BackendSlot& s = *st->slots[i];
                out.append(nb::make_tuple(nb::borrow(s.backend.get()),
                                          s.cache_object ? nb::borrow(s.cache_object.get()) : nb::none(),
                                          static_cast<int>(s.strategy)));
            }
            return out;
        },
        nb::arg("code"),
        nb::sig("def frame_backends(code: types.CodeType) -> list[tuple[typing.Any, tripwire._core.CacheCore "
                "| None, int]]"),
        "(backend, cache, strategy) for each backend that has seen `code`.");
    m.def(
        "_frame_reset",
        [](nb::handle code, nb::handle backend) {
            runtime::frame::reset_code(as_code(code), backend.is_none() ? nullptr : backend.ptr());
        },
        nb::arg("code"), nb::arg("backend").none() = nb::none(),
        nb::sig("def _frame_reset(code: types.CodeType, backend: typing.Any = None) -> None"),
        "Clear the caches and strategies of `code` (for one backend, or all).");
    m.def(
        "_frame_release_all", [] { return runtime::frame::release_all_code_states(); },
        "Drop every frame cache of every code object (at exit); returns how many.");
    testing.def(
        "frame_force_shadow",
        [](bool on) {
            const bool was = runtime::frame::force_shadow_frames();
            runtime::frame::set_force_shadow_frames(on);
            return was;
        },
        nb::arg("on"), "Test hook: run every replacement in a shadow frame; returns the previous setting.");
    testing.def(
        "frame_floor_eval", &runtime::frame::set_floor_eval, nb::arg("on"),
        "Benchmark floor: install (True) or remove (False) a pass-through PEP 523 eval-frame function; "
        "False when the interpreter's eval function is not the expected one.");
    m.def(
        "_frame_run_stats",
        [] {
            const runtime::frame::FrameRunStats& s = runtime::frame::frame_run_stats();
            return nb::make_tuple(s.in_place, s.shadow);
        },
        nb::sig("def _frame_run_stats() -> tuple[int, int]"),
        "(replacements run in place, in shadow frames) so far.");
}

}  // namespace tripwire::bindings
