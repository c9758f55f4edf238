// tripwire/cpp/bindings/bind_cache.cpp -- CacheCore and CacheEntry: the runtime cache in Python.
//
// python/tripwire/cache.py subclasses CacheCore as tripwire.Cache (probe names, the limit
// exception, why_not, stats as a dict); lookup() stays a direct C++ call.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <string>

#include "register.hpp"
#include "runtime/cache/cache.hpp"

namespace nb = nanobind;

namespace tripwire::bindings {
namespace {

struct CacheCore {
    std::unique_ptr<runtime::Cache> impl;

    runtime::Cache& get() {
        if (!impl) throw std::runtime_error("this Cache was cleared by the garbage collector");
        return *impl;
    }
};

int cache_traverse(PyObject* self, visitproc visit, void* arg) {
    Py_VISIT(Py_TYPE(self));
    if (!nb::inst_ready(self)) return 0;
    auto* w = nb::inst_ptr<CacheCore>(self);
    return w->impl ? w->impl->traverse(visit, arg) : 0;
}

int cache_clear(PyObject* self) {
    if (!nb::inst_ready(self)) return 0;
    // Dropping the entries breaks cycles through payloads that refer back to this cache.
    auto* w = nb::inst_ptr<CacheCore>(self);
    if (w->impl) w->impl->clear();
    return 0;
}

PyType_Slot g_cache_slots[] = {{Py_tp_traverse, reinterpret_cast<void*>(cache_traverse)},
                               {Py_tp_clear, reinterpret_cast<void*>(cache_clear)},
                               {0, nullptr}};

runtime::OnLimit parse_on_limit(const std::string& s) {
    if (s == "raise") return runtime::OnLimit::Raise;
    if (s == "fallback") return runtime::OnLimit::Fallback;
    if (s == "evict") return runtime::OnLimit::Evict;
    throw nb::value_error("on_limit must be 'raise', 'fallback' or 'evict'");
}

const char* on_limit_name(runtime::OnLimit p) {
    switch (p) {
        case runtime::OnLimit::Raise: return "raise";
        case runtime::OnLimit::Fallback: return "fallback";
        case runtime::OnLimit::Evict: return "evict";
    }
    return "raise";
}

PyTypeObject* g_cache_type = nullptr;

// A Python view of one entry. It shares the entry with the cache; once the cache has dropped it,
// the view may be its only owner, and a payload that refers to its own view then forms a cycle
// (payload -> view -> entry -> payload) that the collector must see to free it.
struct EntryView {
    runtime::EntryPtr entry;

    const runtime::CacheEntry& get() const {
        if (!entry) throw std::runtime_error("this CacheEntry view was cleared by the garbage collector");
        return *entry;
    }
};

int view_traverse(PyObject* self, visitproc visit, void* arg) {
    Py_VISIT(Py_TYPE(self));
    if (!nb::inst_ready(self)) return 0;
    const runtime::EntryPtr& e = nb::inst_ptr<EntryView>(self)->entry;
    // Report the entry's references only while this view owns it alone: otherwise the cache (or
    // another view) owns them too, and reporting them here as well would count them twice.
    if (e && e.use_count() == 1) return runtime::Cache::traverse_entry(*e, visit, arg);
    return 0;
}

int view_clear(PyObject* self) {
    if (!nb::inst_ready(self)) return 0;
    runtime::EntryPtr dropped = std::move(nb::inst_ptr<EntryView>(self)->entry);
    return 0;  // `dropped` releases the entry (and its payload) here, the view already cleared
}

PyType_Slot g_view_slots[] = {{Py_tp_traverse, reinterpret_cast<void*>(view_traverse)},
                              {Py_tp_clear, reinterpret_cast<void*>(view_clear)},
                              {0, nullptr}};

nb::object view_of(runtime::EntryPtr e) {
    if (!e) return nb::none();
    return nb::cast(EntryView{std::move(e)});
}

// The view of a lookup's hit, or None. Making the view allocates, which may run a finalizer
// that kills an object the entry's set names or removes the entry: re-read after it, so that a
// lookup never hands out an entry that cannot hit (Cache::lookup's own rule, at this boundary).
nb::object hit_view_of(runtime::EntryPtr e) {
    if (!e) return nb::none();
    const runtime::CacheEntry* entry = e.get();
    nb::object view = view_of(std::move(e));
    if (!entry->valid()) return nb::none();  // the view still holds it: the pointer is alive
    return view;
}

}  // namespace

runtime::Cache* cache_of(PyObject* o) {
    if (g_cache_type == nullptr || !PyObject_TypeCheck(o, g_cache_type) || !nb::inst_ready(o)) return nullptr;
    return nb::inst_ptr<CacheCore>(o)->impl.get();
}

void register_cache(nb::module_& m) {
    nb::class_<EntryView>(m, "CacheEntry", nb::type_slots(g_view_slots),
                          "One entry of a tripwire.Cache (a view; read-only).")
        .def_prop_ro(
            "guards", [](const EntryView& v) { return nb::borrow(v.get().guards.get()); },
            nb::for_getter(nb::sig("def guards(self, /) -> GuardSetCore")), "The entry's tripwire.GuardSet.")
        .def_prop_ro(
            "payload", [](const EntryView& v) { return nb::borrow(v.get().payload.get()); },
            nb::for_getter(nb::sig("def payload(self, /) -> typing.Any")))
        .def_prop_ro(
            "name", [](const EntryView& v) { return nb::borrow(v.get().name.get()); },
            nb::for_getter(nb::sig("def name(self, /) -> str | None")))
        .def_prop_ro("hits", [](const EntryView& v) { return v.get().hits; })
        .def_prop_ro(
            "_snapshot",
            [](const EntryView& v) {
                const runtime::CacheEntry& e = v.get();
                return e.snapshot ? nb::borrow(e.snapshot.get()) : nb::none();
            },
            nb::for_getter(nb::sig("def _snapshot(self, /) -> tuple[typing.Any, ...] | None")))
        .def_prop_ro(
            "valid", [](const EntryView& v) { return v.entry && v.entry->valid(); },
            "True while the entry is in its cache and no object its guards name by identity has died.")
        .def("__repr__", [](const EntryView& v) {
            const runtime::CacheEntry& e = v.get();
            std::string s = "<tripwire.CacheEntry ";
            s += nb::cast<std::string>(nb::repr(nb::borrow(e.name.get())));
            s += " hits=" + std::to_string(e.hits);
            if (!e.valid()) s += " INVALID";
            return s + ">";
        });

    nb::class_<CacheCore>(m, "CacheCore", nb::type_slots(g_cache_slots),
                          "The compiled-entry cache. Use tripwire.Cache, which subclasses it.")
        .def(
            "__init__",
            [](CacheCore* self, long long recompile_limit, long long accumulated_limit,
               const std::string& on_limit) {
                if (recompile_limit < 1 || accumulated_limit < 1)
                    throw nb::value_error("recompile_limit and accumulated_limit must be at least 1");
                new (self) CacheCore{std::make_unique<runtime::Cache>(
                    static_cast<std::size_t>(recompile_limit), static_cast<std::size_t>(accumulated_limit),
                    parse_on_limit(on_limit))};
            },
            nb::arg("recompile_limit"), nb::arg("accumulated_limit"), nb::arg("on_limit"))
        .def(
            "_add_probe",
            [](CacheCore& c, nb::handle fn, const std::string& name) {
                if (!PyCallable_Check(fn.ptr())) throw nb::type_error("a probe must be callable");
                return c.get().add_probe(fn.ptr(), name);
            },
            nb::arg("fn"), nb::arg("name"))
        .def(
            "_insert",
            [](CacheCore& c, nb::handle guards, nb::handle payload, nb::handle name) {
                std::shared_ptr<runtime::GuardSet> gs = shared_guard_set_of(guards.ptr());
                if (!gs) throw nb::type_error("Cache.insert: guards must be a tripwire.GuardSet");
                runtime::InsertResult r = runtime::InsertResult::Inserted;
                if (!c.get().insert(guards.ptr(), std::move(gs), payload.ptr(), name.ptr(), r))
                    throw nb::python_error();
                return static_cast<int>(r);
            },
            nb::arg("guards"), nb::arg("payload").none(), nb::arg("name").none(),
            "0 inserted, 1 recompile_limit hit, 2 accumulated_limit hit (nothing inserted).")
        .def(
            "lookup",
            [](CacheCore& c, nb::handle f_locals, nb::handle default_) {
                if (!require_locals_mapping(f_locals.ptr(), "Cache.lookup")) throw nb::python_error();
                runtime::EntryPtr e;
                if (!c.get().lookup(f_locals.ptr(), e)) throw nb::python_error();
                return e ? nb::borrow(e->payload.get()) : nb::borrow(default_);
            },
            nb::arg("f_locals").none(), nb::arg("default").none() = nb::none(),
            nb::sig(
                "def lookup(self, f_locals: typing.Mapping[str, typing.Any], /, default: typing.Any = None) "
                "-> typing.Any"),
            "The payload of the first matching entry, most recently used first, or `default` on a miss. "
            "A payload may be None: use lookup_entry (or a sentinel default) to tell a hit from a miss.")
        .def(
            "lookup_entry",
            [](CacheCore& c, nb::handle f_locals) -> nb::object {
                if (!require_locals_mapping(f_locals.ptr(), "Cache.lookup_entry")) throw nb::python_error();
                runtime::EntryPtr e;
                if (!c.get().lookup(f_locals.ptr(), e, /*count=*/false)) throw nb::python_error();
                // Counted after the view: making it may end the hit (hit_view_of).
                runtime::CacheEntry* hit = e.get();
                nb::object view = hit_view_of(std::move(e));
                c.get().count_lookup(view.is_none() ? nullptr : hit);  // the view holds a hit alive
                return view;
            },
            nb::arg("f_locals").none(),
            nb::sig("def lookup_entry(self, f_locals: typing.Mapping[str, typing.Any] | None) -> CacheEntry "
                    "| None"),
            "The matching entry (counted as a hit), or None on a miss.")
        .def(
            "_lookup_uncounted",
            [](CacheCore& c, nb::handle f_locals) -> nb::object {
                if (!require_locals_mapping(f_locals.ptr(), "Cache.lookup_entry")) throw nb::python_error();
                runtime::EntryPtr e;
                if (!c.get().lookup(f_locals.ptr(), e, /*count=*/false)) throw nb::python_error();
                return hit_view_of(std::move(e));
            },
            nb::arg("f_locals").none(),
            nb::sig("def _lookup_uncounted(self, f_locals: typing.Mapping[str, typing.Any] | None) -> "
                    "CacheEntry | None"),
            "lookup_entry without counting a hit or a miss (a second look after a counted miss).")
        .def(
            "_probe_values",
            [](CacheCore& c) -> nb::object {
                if (c.get().probe_names().empty()) return nb::none();
                runtime::Ref v = c.get().probe_values();
                if (!v) throw nb::python_error();
                return nb::steal(v.release());
            },
            nb::sig("def _probe_values(self) -> tuple[typing.Any, ...] | None"),
            "The probes' current values, or None without probes.")
        .def("_snapshot_matches",
             [](CacheCore&, const EntryView& v, nb::handle current) {
                 const int r = runtime::Cache::snapshot_matches(v.get(), current.ptr());
                 if (r < 0) throw nb::python_error();
                 return r == 1;
             })
        .def_prop_ro("probe_names", [](CacheCore& c) { return c.get().probe_names(); })
        .def(
            "_entries",
            [](CacheCore& c) {
                nb::list out;
                for (runtime::EntryPtr& e : c.get().entries()) out.append(view_of(std::move(e)));
                return out;
            },
            nb::sig("def _entries(self) -> list[CacheEntry]"), "Entries, most recently used first.")
        .def("__len__", [](CacheCore& c) { return c.get().size(); })
        .def(
            "clear", [](CacheCore& c) { c.get().clear(); }, "Drop every entry.")
        .def_prop_ro(
            "index_source",
            [](CacheCore& c) -> nb::object {
                const std::string& s = c.get().index_source();
                return s.empty() ? nb::none() : nb::cast(s);
            },
            "The source the dispatch index hashes (e.g. \"L['x']\"), or None (ordered scan).")
        .def(
            "set_limits",
            [](CacheCore& c, long long recompile_limit, long long accumulated_limit) {
                if (recompile_limit < 1 || accumulated_limit < 1)
                    throw nb::value_error("recompile_limit and accumulated_limit must be at least 1");
                c.get().set_limits(static_cast<std::size_t>(recompile_limit),
                                   static_cast<std::size_t>(accumulated_limit));
            },
            nb::arg("recompile_limit"), nb::arg("accumulated_limit"),
            "New limits for the inserts to come (entries already over a lowered limit stay).")
        .def_prop_ro("recompile_limit", [](CacheCore& c) { return c.get().recompile_limit(); })
        .def_prop_ro("accumulated_limit", [](CacheCore& c) { return c.get().accumulated_limit(); })
        .def_prop_ro("on_limit", [](CacheCore& c) { return on_limit_name(c.get().on_limit()); })
        .def_prop_ro("_counters", [](CacheCore& c) {
            const runtime::CacheStats& s = c.get().stats();
            return nb::make_tuple(s.hits, s.misses, s.recompiles, s.invalidations, s.evictions);
        });
    g_cache_type = reinterpret_cast<PyTypeObject*>(m.attr("CacheCore").ptr());
}

}  // namespace tripwire::bindings
