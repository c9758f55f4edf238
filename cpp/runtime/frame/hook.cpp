// tripwire/cpp/runtime/frame/hook.cpp -- the eval-frame function, per-thread hooks (see the header).
#include "runtime/frame/hook.hpp"

#include <structmember.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <new>

#include "runtime/cache/cache.hpp"
#include "runtime/eval/locals.hpp"
#include "runtime/frame/code_state.hpp"
#include "runtime/frame/replacement.hpp"
#include "runtime/tensors/readers.hpp"

namespace tripwire::runtime::frame {
namespace {

constexpr int kGeneratorFlags = CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR | CO_ITERABLE_COROUTINE;
constexpr const char* kCapsuleName = "tripwire.frame.thread";
constexpr const char* kThreadKey = "tripwire.frame.thread";

/// One thread's hook. Reached through t_hook on the owning thread, and through the capsule in
/// its thread-state dict when that dict is cleared (possibly by another thread at shutdown).
struct ThreadHook {
    PyThreadState* tstate = nullptr;  ///< the thread state it belongs to; null once released
    PyObject* handler = nullptr;      ///< strong; null: no hook
    PyObject* backend = nullptr;      ///< strong
    int busy = 0;                     ///< inside the frame runtime (the handler, a full lookup): frames
                                      ///< are let through
    bool intercepting = false;        ///< handler set and not busy: what the eval function tests

    void refresh() { intercepting = handler != nullptr && busy == 0; }
};

// The hot path reads this once per Python call: initial-exec TLS is one segment-relative load
// (the default model in a shared object calls __tls_get_addr).
__attribute__((tls_model("initial-exec"))) thread_local ThreadHook* t_hook = nullptr;

int g_active = 0;               // threads with a hook
bool g_installed = false;       // we set our eval function and have not restored the previous one
bool g_layout_checked = false;  // verify_frame_layout ran
bool g_layout_ok = false;
std::string g_layout_error;
PyObject* g_error_type = nullptr;  // strong, for the life of the process

PyObject* error_type() { return g_error_type != nullptr ? g_error_type : PyExc_RuntimeError; }

PyObject* eval_frame(PyThreadState* ts, RawFrame* f, int throw_flag);

PyObject* let_through(PyThreadState* ts, RawFrame* f) { return _PyEval_EvalFrameDefault(ts, f, 0); }

// Run the frame with the thread's hook suspended for its whole dynamic extent (SkipRecursive).
// A plain counter, no RAII (see below): a thread ended inside the frame leaves it raised on a
// record that dies with its thread state.
PyObject* run_suspended(PyThreadState* ts, RawFrame* f, ThreadHook* h) {
    ++h->busy;
    h->refresh();
    PyObject* r = _PyEval_EvalFrameDefault(ts, f, 0);
    --h->busy;
    h->refresh();
    return r;
}

// Why no RAII object holding a Python reference is alive while a frame runs (below): a daemon
// thread still running Python when the interpreter finalizes is ended with pthread_exit the next
// time it asks for the GIL, which unwinds the C stack as a forced exception, running the C++
// destructors of every frame on it, without the GIL, after finalization freed objects. CPython's
// own C frames have none; ours must not either across _PyEval_EvalFrameDefault. So the decisions
// are taken in helpers whose RAII objects die before they return, and the references that must
// live across the run are raw, released after it (leaked if the thread is ended meanwhile).

// Run the Replacement `payload` (a reference we own, released after the run) in frame `f` of `co`.
PyObject* run_owned_payload(PyThreadState* ts, RawFrame* f, PyCodeObject* co, PyObject* payload) {
    PyCodeObject* code = replacement_code_for(payload, co);
    PyObject* r;
    if (code == nullptr) {
        PyErr_Format(PyExc_TypeError,
                     "a tripwire.frame cache entry of %U must hold a tripwire.frame.Replacement made for "
                     "that code object, not %R",
                     co->co_qualname, payload);
        r = fail_frame(ts, f);
    } else {
        r = run_code_in_frame(ts, f, code);
    }
    Py_DECREF(payload);
    return r;
}

// Look the frame up in `slot`'s cache: 1 with `*payload` (a new reference) on a hit, 0 on a miss,
// -1 with a Python error set.
int look_up(ThreadHook* h, BackendSlot* slot, const Locals& locals, PyObject** payload) {
    Cache* cache = slot->cache;
    Ref hit;
    // The repeated hit: the most recently used entry's fast pass, which runs no user code and
    // allocates nothing (so the borrowed slot and cache stay valid across it). Tried even when
    // the cache has an index: a frame's calls mostly repeat, and this path allocates nothing.
    if (cache->lookup_most_recent(locals, hit, /*with_index=*/true) == 1) {
        *payload = hit.release();
        return 1;
    }
    // The full lookup may run user code: the cache object is held (it owns `cache`; raw, see
    // above: user code may release the GIL), and the frames that code runs are let through.
    PyObject* cache_object = Py_NewRef(slot->cache_object.get());
    EntryPtr entry;
    bool ok = false;
    ++h->busy;
    h->refresh();
    try {
        ok = cache->lookup(locals, entry);
    } catch (const std::bad_alloc&) {
        PyErr_NoMemory();
    } catch (const std::exception& e) {
        PyErr_SetString(PyExc_RuntimeError, e.what());
    }
    --h->busy;
    h->refresh();
    // The cache object first: user code run by the lookup may have replaced this code's caches,
    // and dropping the last reference clears the cache, releasing entries, whose finalizers may
    // kill an object the hit's set names (the cache marks its entries out of it). The hit is
    // decided after that, when nothing else can run: a valid entry is owned by its cache, so
    // dropping ours runs nothing.
    Py_DECREF(cache_object);
    if (ok && entry && entry->valid())
        *payload = Py_NewRef(entry->payload.get());  // ours: running it may evict the entry
    entry.reset();                                   // may run a finalizer only when it was not a hit
    if (!ok) return -1;
    return *payload != nullptr ? 1 : 0;
}

// A miss: call the handler. Returns its result (a new reference) or null with an error set;
// `backend` receives the hook's backend (a new reference) for a strategy to be set under.
PyObject* ask_handler(RawFrame* f, ThreadHook* h, PyCodeObject* co, PyObject* fn, PyObject** backend) {
    // Our own references (raw, see above): the handler may replace or clear this thread's hook.
    PyObject* handler = Py_NewRef(h->handler);
    *backend = Py_NewRef(h->backend);
    ++h->busy;
    h->refresh();
    const Locals locals =
        Locals::of_frame(frame_localsplus(f), co, PyFunction_GET_CLOSURE(fn), frame_globals(f));
    PyObject* f_locals = locals.as_mapping().release();
    PyObject* result = nullptr;
    if (f_locals != nullptr) {
        PyObject* args[5] = {reinterpret_cast<PyObject*>(co), f_locals, frame_globals(f), frame_builtins(f),
                             fn};
        result = PyObject_Vectorcall(handler, args, 5, nullptr);
        Py_DECREF(f_locals);
    }
    --h->busy;
    h->refresh();
    Py_DECREF(handler);
    return result;
}

// Act on the handler's `result` (owned; null: it raised): run, let through, or fail the frame.
PyObject* act_on(PyThreadState* ts, RawFrame* f, ThreadHook* h, PyCodeObject* co, PyObject* result,
                 PyObject* backend) {
    bool fail = result == nullptr;
    bool run = false;
    bool suspend = false;
    if (!fail && result != Py_None) {
        long s = -1;
        if (PyLong_CheckExact(result)) {
            s = PyLong_AsLong(result);
            if (s == -1) PyErr_Clear();
        }
        if (s == static_cast<long>(Strategy::Skip) || s == static_cast<long>(Strategy::RunOnly) ||
            s == static_cast<long>(Strategy::SkipRecursive)) {
            fail = !set_strategy(co, backend, static_cast<Strategy>(s));
            suspend = s == static_cast<long>(Strategy::SkipRecursive);
        } else if (replacement_code_for(result, co) != nullptr) {
            run = true;
        } else {
            PyErr_Format(
                PyExc_TypeError,
                "the tripwire.frame handler returned %R for %U; expected None, 1 (SKIP), 2 (RUN_ONLY), "
                "3 (SKIP_RECURSIVE) or a Replacement made for that code object",
                result, co->co_qualname);
            fail = true;
        }
    }
    Py_DECREF(backend);
    if (run) return run_owned_payload(ts, f, co, result);
    Py_XDECREF(result);
    if (fail) return fail_frame(ts, f);
    // The handler may have cleared this thread's hook (its record stays until the thread dies).
    return suspend && t_hook == h ? run_suspended(ts, f, h) : let_through(ts, f);
}

// Everything after the eval function's tests: out of line, so that letting a frame through
// (no hook on this thread, a skipped code) pays no prologue for the registers this needs.
// No RAII object with a Python reference lives in this frame (see above).
[[gnu::noinline]] PyObject* intercept(PyThreadState* ts, RawFrame* f, ThreadHook* h, PyCodeObject* co,
                                      BackendSlot* slot) {
    PyObject* fn = frame_function(f);
    if (!PyFunction_Check(fn) || !frame_fresh(f)) return let_through(ts, f);
    if (slot != nullptr && slot->cache != nullptr) {
        const Locals locals =
            Locals::of_frame(frame_localsplus(f), co, PyFunction_GET_CLOSURE(fn), frame_globals(f));
        PyObject* payload = nullptr;
        const int r = look_up(h, slot, locals, &payload);
        if (r < 0) return fail_frame(ts, f);
        if (r > 0) return run_owned_payload(ts, f, co, payload);
    }
    if (slot != nullptr && slot->strategy != Strategy::Default) return let_through(ts, f);
        // (SkipRecursive never gets here: the eval function runs those frames suspended.)
        // An interpreter shutting down runs no new compiles (the handler's module may be torn down).
#if PY_VERSION_HEX >= 0x030D0000
    if (Py_IsFinalizing()) return let_through(ts, f);
#else
    if (_Py_IsFinalizing()) return let_through(ts, f);
#endif
    PyObject* backend = nullptr;
    PyObject* result = ask_handler(f, h, co, fn, &backend);
    return act_on(ts, f, h, co, result, backend);
}

PyObject* eval_frame(PyThreadState* ts, RawFrame* f, int throw_flag) {
    ThreadHook* h = t_hook;
    if (h == nullptr || !h->intercepting || throw_flag != 0 || h->tstate != ts) [[likely]]
        return _PyEval_EvalFrameDefault(ts, f, throw_flag);
    // Function bodies only (not module or class bodies), never generators or coroutines.
    PyCodeObject* co = frame_code(f);
    if ((co->co_flags & (CO_OPTIMIZED | kGeneratorFlags)) != CO_OPTIMIZED)
        return _PyEval_EvalFrameDefault(ts, f, 0);
    BackendSlot* slot = nullptr;
    if (CodeState* st = code_state(co)) {
        slot = st->find(h->backend);
        if (slot != nullptr && slot->strategy >= Strategy::Skip) {
            if (slot->strategy == Strategy::Skip) return _PyEval_EvalFrameDefault(ts, f, 0);
            if (slot->strategy == Strategy::SkipRecursive) return run_suspended(ts, f, h);
        }
    }
    return intercept(ts, f, h, co, slot);
}

const char* describe_eval(_PyFrameEvalFunction fn) {
    if (fn == eval_frame) return "tripwire";
    if (fn == _PyEval_EvalFrameDefault) return "default";
    return "foreign";
}

bool ensure_layout() {
    if (!g_layout_checked) {
        g_layout_checked = true;
        g_layout_ok = verify_frame_layout(g_layout_error);
    }
    if (!g_layout_ok) {
        PyErr_Format(error_type(),
                     "tripwire.frame cannot run on this interpreter: its frame layout check failed (%s)",
                     g_layout_error.c_str());
        return false;
    }
    return true;
}

// Our eval function, installed when not yet. False with an error set, nothing changed.
bool ensure_installed(PyThreadState* ts) {
    PyInterpreterState* interp = PyThreadState_GetInterpreter(ts);
    const _PyFrameEvalFunction cur = _PyInterpreterState_GetEvalFrameFunc(interp);
    if (cur == eval_frame) {
        g_installed = true;
        return true;
    }
    if (cur != _PyEval_EvalFrameDefault) {
        PyErr_Format(
            error_type(),
            "another PEP 523 eval-frame function is installed (%p)%s; tripwire.frame does not stack on "
            "another frame hook (uninstall it first)",
            reinterpret_cast<void*>(cur), g_active > 0 ? ", over tripwire's own" : "");
        return false;
    }
    if (!ensure_layout() || !init_code_states()) return false;
    _PyInterpreterState_SetEvalFrameFunc(interp, eval_frame);
    g_installed = true;
    return true;
}

// Restore CPython's eval function when ours is the interpreter's. A foreign one installed over
// ours stays (it may call ours as its previous function: ours lets everything through now).
// Returns false when that happened (the caller may warn).
bool uninstall(PyThreadState* ts) {
    g_installed = false;
    PyInterpreterState* interp = PyThreadState_GetInterpreter(ts);
    if (_PyInterpreterState_GetEvalFrameFunc(interp) == eval_frame) {
        _PyInterpreterState_SetEvalFrameFunc(interp, _PyEval_EvalFrameDefault);
        return true;
    }
    return false;
}

// The capsule destructor: the thread state is being cleared (thread exit, or shutdown, possibly
// on another thread). Clears the hook, counts the thread out, frees the record when on its own
// thread (another thread's thread-local pointer may still point at it otherwise: it is leaked,
// released, and ignored from then on since its tstate no longer matches).
void release_thread(PyObject* capsule) {
    auto* h = static_cast<ThreadHook*>(PyCapsule_GetPointer(capsule, kCapsuleName));
    if (h == nullptr) {
        PyErr_Clear();
        return;
    }
    PyObject* handler = h->handler;
    PyObject* backend = h->backend;
    PyThreadState* ts = h->tstate;
    h->handler = h->backend = nullptr;
    h->tstate = nullptr;
    h->refresh();
    if (handler != nullptr && --g_active == 0 && ts != nullptr) uninstall(ts);
    const bool own = t_hook == h;
    if (own) t_hook = nullptr;
    Py_XDECREF(handler);
    Py_XDECREF(backend);
    if (own) delete h;
}

// This thread's record, created (with its capsule) when missing. Null with an error set.
ThreadHook* own_record(PyThreadState* ts) {
    ThreadHook* h = t_hook;
    if (h != nullptr && h->tstate == ts) return h;
    // None yet, or a record of an earlier thread state of this OS thread that was never released
    // (another interpreter's): start afresh.
    auto* fresh = new (std::nothrow) ThreadHook();
    if (fresh == nullptr) {
        PyErr_NoMemory();
        return nullptr;
    }
    fresh->tstate = ts;
    PyObject* dict = PyThreadState_GetDict();  // borrowed
    PyObject* capsule = dict != nullptr ? PyCapsule_New(fresh, kCapsuleName, release_thread) : nullptr;
    if (capsule == nullptr || PyDict_SetItemString(dict, kThreadKey, capsule) < 0) {
        if (capsule != nullptr) {
            PyCapsule_SetDestructor(capsule, nullptr);
            Py_DECREF(capsule);
        }
        delete fresh;
        if (!PyErr_Occurred()) PyErr_SetString(error_type(), "tripwire.frame: no thread-state dict");
        return nullptr;
    }
    Py_DECREF(capsule);  // the dict owns it
    t_hook = fresh;
    return fresh;
}

}  // namespace

void set_frame_error_type(PyObject* type) {
    Py_XINCREF(type);
    Py_XSETREF(g_error_type, type);
}

bool set_thread_hook(PyObject* handler, PyObject* backend, Ref& prev_handler, Ref& prev_backend) {
    if ((handler == nullptr) != (backend == nullptr)) {
        PyErr_SetString(PyExc_ValueError, "a frame hook needs both a handler and a backend");
        return false;
    }
    PyThreadState* ts = PyThreadState_Get();
    ThreadHook* h = t_hook;
    if (h != nullptr && h->tstate != ts) h = nullptr;
    const bool had = h != nullptr && h->handler != nullptr;
    if (handler != nullptr) {
        // Setting or replacing: our eval function must be (or become) the interpreter's.
        if (!ensure_installed(ts)) return false;
        if (h == nullptr) {
            h = own_record(ts);
            if (h == nullptr) {
                if (g_active == 0) uninstall(ts);
                return false;
            }
        }
    }
    if (h == nullptr) {  // clearing a hook that was never set
        prev_handler = Ref();
        prev_backend = Ref();
        return true;
    }
    prev_handler = Ref::steal(h->handler);
    prev_backend = Ref::steal(h->backend);
    h->handler = handler;
    h->backend = backend;
    Py_XINCREF(handler);
    Py_XINCREF(backend);
    h->refresh();
    if (handler != nullptr && !had) ++g_active;
    if (handler == nullptr && had && --g_active == 0 && !uninstall(ts)) {
        return PyErr_WarnEx(
                   PyExc_RuntimeWarning,
                   "tripwire.frame: another eval-frame function was installed over tripwire's; it is "
                   "left in place (tripwire's now lets every frame through)",
                   1) == 0;
    }
    return true;
}

namespace {

// An exception saved across cleanup code (PyErr_GetRaisedException is 3.12+).
struct SavedError {
    PyObject *type = nullptr, *value = nullptr, *tb = nullptr;
    void fetch() { PyErr_Fetch(&type, &value, &tb); }
    void restore() {
        if (type != nullptr) PyErr_Restore(type, value, tb);
        type = value = tb = nullptr;
    }
};

struct Scope {
    PyObject_HEAD vectorcallfunc vectorcall;
    PyObject* fn;
    PyObject* handler;   // null: a suspended call
    PyObject* backend;   // null with handler
    PyObject* fallback;  // or null
    PyObject* divert;    // a tuple of (obj, names, value, dict) tests, or null (see scope_diverted)
    PyObject* enter;     // or null
    PyObject* on_error;  // or null
    bool dispatch_keys;  // put torch's local dispatch keys back after fn (the adapter was installed)
    PyObject* dict;      // __dict__ (functools.update_wrapper), or null
    PyObject* weakrefs;
};

Scope* as_scope(PyObject* o) { return reinterpret_cast<Scope*>(o); }

// `fn`, with on_error(state) when it raises. No RAII object holds a reference across the call
// (see above). With dispatch_keys, torch's thread-local dispatch key sets are put back after
// every call, as compile_wrapper's _ForceDispatchKeyGuard does (generated code is not guarded
// with try/finally, and user code may leave a key guard entered); read and written in C through
// the adapter: the Python route builds two DispatchKeySet objects per call.
PyObject* scope_run(Scope* s, PyObject* state, PyObject* const* args, std::size_t nargsf, PyObject* kwnames) {
    TwLocalKeys saved{};
    const TwTorchAdapter* a = s->dispatch_keys ? torch_adapter() : nullptr;
    if (a != nullptr) a->local_keys_save(&saved);
    PyObject* r = PyObject_Vectorcall(s->fn, args, nargsf, kwnames);
    if (r == nullptr && s->on_error != nullptr) {
        // The cleanup must not replace the call's own exception (it is what the user sees).
        SavedError exc;
        exc.fetch();
        // With the hook suspended: the cleanup is not user code to compile.
        ThreadHook* h = t_hook;
        if (h != nullptr && h->tstate != PyThreadState_Get()) h = nullptr;
        if (h != nullptr) {
            ++h->busy;
            h->refresh();
        }
        PyObject* c = PyObject_CallOneArg(s->on_error, state != nullptr ? state : Py_None);
        if (h != nullptr) {
            --h->busy;
            h->refresh();
        }
        if (c == nullptr) PyErr_WriteUnraisable(s->on_error);
        Py_XDECREF(c);
        exc.restore();
    }
    // After on_error, as torch's guard exits after its cleanup (popping a functorch layer
    // changes the local include set). Cannot fail: no Python code, no allocation.
    if (a != nullptr) a->local_keys_restore(&saved);
    return r;
}

PyObject* scope_divert(Scope* s, PyObject* const* args, std::size_t nargsf, PyObject* kwnames) {
    return PyObject_Vectorcall(s->fallback != nullptr ? s->fallback : s->fn, args, nargsf, kwnames);
}

// The divert tests, read per call before the hook is set: 1 when one holds (`obj.names... ==
// value`), 0 when none does, -1 with an error set. What torch.compile's wrapper reads per call
// (its stance, the profiler flag) is a module global that is rebound, not mutated, so each test
// reads it afresh from C: no Python frame. Each test is (obj, names, value, dict): `dict` is the
// module's __dict__ when obj is a plain module whose type has no attribute names[0] (checked once,
// in scope_new; ModuleType is immutable), so that the first read is the dict lookup the generic
// read would make after finding nothing on the type (PyObject_GetAttr costs ~250 instructions on
// a module, the lookup ~50); a name missing from it takes the generic read (a module __getattr__).
// The reads and the comparison may run user code (a module __getattr__, a lying __eq__): the
// caller holds `tests`, and each value read is held while it is used.
// `a == b` (1, 0, -1 with an error set), without the generic comparison where its answer is
// known: identity, two exact str (what a stance is), an exact bool against a singleton (a flag).
int same_value(PyObject* a, PyObject* b) {
    if (a == b) return 1;
    if (PyUnicode_CheckExact(a) && PyUnicode_CheckExact(b)) {
        if (PyUnicode_GET_LENGTH(a) != PyUnicode_GET_LENGTH(b) || PyUnicode_KIND(a) != PyUnicode_KIND(b))
            return 0;  // a str's kind is its widest character's: equal strings have equal kinds
        return std::memcmp(PyUnicode_DATA(a), PyUnicode_DATA(b),
                           static_cast<std::size_t>(PyUnicode_GET_LENGTH(a)) * PyUnicode_KIND(a)) == 0;
    }
    if (PyBool_Check(a) && (PyBool_Check(b) || b == Py_None)) return 0;  // singletons, not identical
    return PyObject_RichCompareBool(a, b, Py_EQ);
}

int scope_diverted(PyObject* tests) {
    const Py_ssize_t n = PyTuple_GET_SIZE(tests);
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* test = PyTuple_GET_ITEM(tests, i);
        PyObject* names = PyTuple_GET_ITEM(test, 1);
        PyObject* dict = PyTuple_GET_ITEM(test, 3);
        PyObject* cur = nullptr;
        Py_ssize_t k = 0;
        if (dict != Py_None) {
            cur = PyDict_GetItemWithError(dict, PyTuple_GET_ITEM(names, 0));
            if (cur == nullptr && PyErr_Occurred()) return -1;
            if (cur != nullptr) {
                Py_INCREF(cur);
                k = 1;
            }
        }
        if (cur == nullptr) cur = Py_NewRef(PyTuple_GET_ITEM(test, 0));
        for (; k < PyTuple_GET_SIZE(names) && cur != nullptr; ++k)
            Py_SETREF(cur, PyObject_GetAttr(cur, PyTuple_GET_ITEM(names, k)));
        if (cur == nullptr) return -1;
        const int eq = same_value(cur, PyTuple_GET_ITEM(test, 2));
        Py_DECREF(cur);
        if (eq != 0) return eq;
    }
    return 0;
}

// scope_new's form of a divert argument (checked): the tuple of (obj, names, value, dict) tests
// scope_diverted reads, or null with an error set.
PyObject* divert_tests(PyObject* divert) {
    bool ok = PyTuple_CheckExact(divert) && PyTuple_GET_SIZE(divert) > 0;
    for (Py_ssize_t i = 0; ok && i < PyTuple_GET_SIZE(divert); ++i) {
        PyObject* test = PyTuple_GET_ITEM(divert, i);
        ok = PyTuple_CheckExact(test) && PyTuple_GET_SIZE(test) == 3;
        PyObject* names = ok ? PyTuple_GET_ITEM(test, 1) : nullptr;
        ok = ok && PyTuple_CheckExact(names) && PyTuple_GET_SIZE(names) > 0;
        for (Py_ssize_t k = 0; ok && k < PyTuple_GET_SIZE(names); ++k)
            ok = PyUnicode_CheckExact(PyTuple_GET_ITEM(names, k));
    }
    if (!ok) {
        // Exact types: the per-call read takes the items unchecked.
        PyErr_SetString(PyExc_TypeError,
                        "FrameScope: divert must be a non-empty tuple of (obj, names, value) tuples, names "
                        "a non-empty tuple of str");
        return nullptr;
    }
    const Py_ssize_t n = PyTuple_GET_SIZE(divert);
    PyObject* tests = PyTuple_New(n);
    for (Py_ssize_t i = 0; tests != nullptr && i < n; ++i) {
        PyObject* test = PyTuple_GET_ITEM(divert, i);
        PyObject* obj = PyTuple_GET_ITEM(test, 0);
        PyObject* first = PyTuple_GET_ITEM(PyTuple_GET_ITEM(test, 1), 0);
        PyObject* dict = Py_None;
        if (PyModule_CheckExact(obj)) {
            // Found on the type object (its MRO, or its metatype's): a superset of what the
            // generic read of a module attribute finds before the module's dict.
            PyObject* on_type = PyObject_GetAttr(reinterpret_cast<PyObject*>(&PyModule_Type), first);
            if (on_type != nullptr) {
                Py_DECREF(on_type);
            } else if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
                PyErr_Clear();
                dict = PyModule_GetDict(obj);  // borrowed (the tuple holds it); never replaced
            } else {
                Py_CLEAR(tests);
                break;
            }
        }
        PyObject* item = PyTuple_Pack(4, obj, PyTuple_GET_ITEM(test, 1), PyTuple_GET_ITEM(test, 2), dict);
        if (item == nullptr) {
            Py_CLEAR(tests);
            break;
        }
        PyTuple_SET_ITEM(tests, i, item);
    }
    return tests;
}

PyObject* scope_hooked(PyObject* self, PyObject* state, PyObject* const* args, std::size_t nargsf,
                       PyObject* kwnames) {
    Scope* s = as_scope(self);
    PyThreadState* ts = PyThreadState_Get();
    ThreadHook* h = t_hook;
    if (h != nullptr && h->tstate != ts) h = nullptr;
    if (s->handler == nullptr) {  // a suspended call
        if (h == nullptr || h->handler == nullptr) return scope_run(s, state, args, nargsf, kwnames);
        // The record lives until this thread's state is cleared, which cannot happen during the call.
        ++h->busy;
        h->refresh();
        PyObject* r = scope_run(s, state, args, nargsf, kwnames);
        --h->busy;
        h->refresh();
        return r;
    }
    // Already this hook, not suspended (a compiled function calling itself or a sibling): as is.
    if (h != nullptr && h->handler == s->handler && h->backend == s->backend && h->busy == 0)
        return scope_run(s, state, args, nargsf, kwnames);
    PyObject* prev_handler = nullptr;
    PyObject* prev_backend = nullptr;
    {
        Ref ph, pb;
        if (!set_thread_hook(s->handler, s->backend, ph, pb)) {
            if (s->fallback != nullptr && PyErr_ExceptionMatches(error_type())) {
                PyErr_Clear();
                return scope_divert(s, args, nargsf, kwnames);
            }
            return nullptr;
        }
        prev_handler = ph.release();
        prev_backend = pb.release();
    }
    h = t_hook;  // set_thread_hook made it when there was none
    const int saved_busy = h->busy;
    h->busy = 0;  // a compiled call inside a suspended extent compiles, as under torch's disable
    h->refresh();
    PyObject* r = scope_run(s, state, args, nargsf, kwnames);
    SavedError exc;
    if (r == nullptr) exc.fetch();
    bool ok = true;
    if (t_hook == h) {
        h->busy = saved_busy;
        Ref a, b;
        ok = set_thread_hook(prev_handler, prev_backend, a, b);
    }
    Py_XDECREF(prev_handler);
    Py_XDECREF(prev_backend);
    if (!ok) {
        if (r == nullptr) {
            PyErr_WriteUnraisable(self);  // the call's own exception wins
        } else {
            Py_DECREF(r);
            return nullptr;
        }
    }
    exc.restore();
    return r;
}

PyObject* scope_call_held(PyObject* self, PyObject* const* args, std::size_t nargsf, PyObject* kwnames) {
    Scope* s = as_scope(self);
    if (s->divert != nullptr) {
        // Held: the tests' user code may clear the scope (tp_clear) and drop the tuple.
        PyObject* tests = Py_NewRef(s->divert);
        const int d = scope_diverted(tests);
        Py_DECREF(tests);
        if (d < 0) return nullptr;
        if (d > 0) return scope_divert(s, args, nargsf, kwnames);
    }
    if (s->enter == nullptr) return scope_hooked(self, nullptr, args, nargsf, kwnames);
    // enter() runs before the hook is set (its own frame is not offered to the handler).
    PyObject* state = PyObject_CallNoArgs(s->enter);
    if (state == nullptr) return nullptr;
    PyObject* r = state == Py_NotImplemented ? scope_divert(s, args, nargsf, kwnames)
                                             : scope_hooked(self, state, args, nargsf, kwnames);
    Py_DECREF(state);
    return r;
}

PyObject* scope_call(PyObject* self, PyObject* const* args, std::size_t nargsf, PyObject* kwnames) {
    // Held for the call: a C caller may pass a borrowed scope, and the call may drop every other
    // reference (on_error and the fields are read after fn returns).
    Py_INCREF(self);
    PyObject* r = scope_call_held(self, args, nargsf, kwnames);
    Py_DECREF(self);
    return r;
}

PyObject* scope_descr_get(PyObject* self, PyObject* obj, PyObject*) {
    // A method when found on a class, as a function is (a decorated method).
    if (obj == nullptr || obj == Py_None) return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

void scope_dealloc(PyObject* self) {
    PyTypeObject* tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    Scope* s = as_scope(self);
    if (s->weakrefs != nullptr) PyObject_ClearWeakRefs(self);
    Py_CLEAR(s->fn);
    Py_CLEAR(s->handler);
    Py_CLEAR(s->backend);
    Py_CLEAR(s->fallback);
    Py_CLEAR(s->divert);
    Py_CLEAR(s->enter);
    Py_CLEAR(s->on_error);
    Py_CLEAR(s->dict);
    tp->tp_free(self);
    Py_DECREF(tp);
}

int scope_traverse(PyObject* self, visitproc visit, void* arg) {
    Scope* s = as_scope(self);
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(s->fn);
    Py_VISIT(s->handler);
    Py_VISIT(s->backend);
    Py_VISIT(s->fallback);
    Py_VISIT(s->divert);
    Py_VISIT(s->enter);
    Py_VISIT(s->on_error);
    Py_VISIT(s->dict);
    return 0;
}

int scope_clear(PyObject* self) {
    Scope* s = as_scope(self);
    // fn stays: a call in flight from another reference must find it (it is not a cycle root
    // anyone else can clear; the hook objects are).
    Py_CLEAR(s->fallback);
    Py_CLEAR(s->divert);
    Py_CLEAR(s->enter);
    Py_CLEAR(s->on_error);
    Py_CLEAR(s->dict);
    return 0;
}

PyObject* scope_new(PyTypeObject* tp, PyObject* args, PyObject* kwargs) {
    PyObject *fn = nullptr, *handler = nullptr, *backend = nullptr, *fallback = Py_None, *enter = Py_None,
             *on_error = Py_None, *divert = Py_None;
    int dispatch_keys = 0;
    static const char* kw[] = {"fn",       "handler",       "backend", "fallback", "enter",
                               "on_error", "dispatch_keys", "divert",  nullptr};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|OOOpO:FrameScope", const_cast<char**>(kw), &fn,
                                     &handler, &backend, &fallback, &enter, &on_error, &dispatch_keys,
                                     &divert))
        return nullptr;
    Ref tests;
    if (divert != Py_None) {
        tests = Ref::steal(divert_tests(divert));
        if (!tests) return nullptr;
    }
    if (dispatch_keys && torch_adapter() == nullptr) {
        // Never a scope that silently skips the protections it was asked for.
        PyErr_SetString(
            PyExc_ValueError,
            "FrameScope: dispatch_keys needs the torch adapter (tripwire.tensors.adapter_status())");
        return nullptr;
    }
    if ((handler == Py_None) != (backend == Py_None)) {
        PyErr_SetString(PyExc_ValueError, "FrameScope: handler and backend are both None or neither");
        return nullptr;
    }
    for (PyObject* c : {fn, handler, fallback, enter, on_error}) {
        if (c != Py_None && !PyCallable_Check(c)) {
            PyErr_Format(PyExc_TypeError, "FrameScope: %R is not callable", c);
            return nullptr;
        }
    }
    if (fn == Py_None) {
        PyErr_SetString(PyExc_TypeError, "FrameScope: fn must be callable");
        return nullptr;
    }
    auto* s = reinterpret_cast<Scope*>(tp->tp_alloc(tp, 0));
    if (s == nullptr) return nullptr;
    s->vectorcall = scope_call;
    auto opt = [](PyObject* o) { return o == Py_None ? nullptr : Py_NewRef(o); };
    s->fn = Py_NewRef(fn);
    s->handler = opt(handler);
    s->backend = opt(backend);
    s->fallback = opt(fallback);
    s->divert = tests.release();
    s->enter = opt(enter);
    s->on_error = opt(on_error);
    s->dispatch_keys = dispatch_keys != 0;
    return reinterpret_cast<PyObject*>(s);
}

// copy.copy and copy.deepcopy return the scope itself, as they return a function: a compiled
// function is a function to its users (its state is the code, the hook and the caches it
// shares, none of which a copy may duplicate).
PyObject* scope_copy(PyObject* self, PyObject* /*unused*/) { return Py_NewRef(self); }

PyMethodDef g_scope_methods[] = {
    {"__copy__", scope_copy, METH_NOARGS, "The scope itself, as copy.copy returns a function."},
    {"__deepcopy__", scope_copy, METH_O, "The scope itself, as copy.deepcopy returns a function."},
    {nullptr, nullptr, 0, nullptr}};

PyGetSetDef g_scope_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, nullptr, nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyMemberDef g_scope_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(Scope, vectorcall), READONLY, nullptr},
    {"__dictoffset__", T_PYSSIZET, offsetof(Scope, dict), READONLY, nullptr},
    {"__weaklistoffset__", T_PYSSIZET, offsetof(Scope, weakrefs), READONLY, nullptr},
    {nullptr, 0, 0, 0, nullptr}};

PyType_Slot g_scope_slots[] = {
    {Py_tp_new, reinterpret_cast<void*>(scope_new)},
    {Py_tp_dealloc, reinterpret_cast<void*>(scope_dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(scope_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(scope_clear)},
    {Py_tp_call, reinterpret_cast<void*>(PyVectorcall_Call)},
    {Py_tp_getset, g_scope_getset},
    {Py_tp_methods, g_scope_methods},
    {Py_tp_descr_get, reinterpret_cast<void*>(scope_descr_get)},
    {Py_tp_members, g_scope_members},
    {Py_tp_doc, const_cast<char*>(
                    "FrameScope(fn, handler, backend, fallback=None, enter=None, on_error=None, "
                    "dispatch_keys=False, divert=None)\n--\n\n"
                    "A callable whose call runs `fn` with this thread's frame hook set to (handler, "
                    "backend), restoring the previous hook after; handler None: with the hook suspended.")},
    {0, nullptr}};

PyType_Spec g_scope_spec = {
    "tripwire._core.FrameScope", sizeof(Scope), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    g_scope_slots};

PyTypeObject* g_scope_type = nullptr;

}  // namespace

PyObject* scope_field(PyObject* self, int which) {
    if (g_scope_type == nullptr || Py_TYPE(self) != g_scope_type) {
        PyErr_SetString(PyExc_TypeError, "expected a FrameScope");
        return nullptr;
    }
    Scope* s = as_scope(self);
    PyObject* o = which == 0 ? s->fn : which == 1 ? s->handler : which == 2 ? s->backend : s->fallback;
    return Py_NewRef(o != nullptr ? o : Py_None);
}

PyTypeObject* scope_type() {
    if (g_scope_type == nullptr)
        g_scope_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&g_scope_spec));
    Py_XINCREF(g_scope_type);
    return g_scope_type;
}

void thread_hook(Ref& handler, Ref& backend) {
    ThreadHook* h = t_hook;
    if (h == nullptr || h->tstate != PyThreadState_Get()) {
        handler = Ref();
        backend = Ref();
        return;
    }
    handler = Ref::borrow(h->handler);
    backend = Ref::borrow(h->backend);
}

HookStatus hook_status() {
    HookStatus s;
    const _PyFrameEvalFunction cur = _PyInterpreterState_GetEvalFrameFunc(PyInterpreterState_Get());
    s.installed = cur == eval_frame;
    s.active_threads = g_active;
    s.layout_verified = g_layout_checked && g_layout_ok;
    s.layout_error = g_layout_error;
    s.current_eval = describe_eval(cur);
    return s;
}

namespace {
PyObject* floor_eval(PyThreadState* ts, RawFrame* f, int throw_flag) {
    return _PyEval_EvalFrameDefault(ts, f, throw_flag);
}
_PyFrameEvalFunction g_before_floor = nullptr;
}  // namespace

bool set_floor_eval(bool on) {
    PyInterpreterState* interp = PyInterpreterState_Get();
    const _PyFrameEvalFunction cur = _PyInterpreterState_GetEvalFrameFunc(interp);
    if (on) {
        // Over CPython's own or over ours (a foreign hook installed on top, for the tests).
        if (cur != _PyEval_EvalFrameDefault && cur != eval_frame) return false;
        g_before_floor = cur;
        _PyInterpreterState_SetEvalFrameFunc(interp, floor_eval);
        return true;
    }
    if (cur != floor_eval) return false;
    _PyInterpreterState_SetEvalFrameFunc(
        interp, g_before_floor != nullptr ? g_before_floor : _PyEval_EvalFrameDefault);
    return true;
}

bool verify_layout_now(std::string& why) {
    if (_PyInterpreterState_GetEvalFrameFunc(PyInterpreterState_Get()) != _PyEval_EvalFrameDefault &&
        !g_layout_checked) {
        why = "another eval-frame function is installed";
        return false;
    }
    if (!g_layout_checked) {
        g_layout_checked = true;
        g_layout_ok = verify_frame_layout(g_layout_error);
    }
    why = g_layout_error;
    return g_layout_ok;
}

}  // namespace tripwire::runtime::frame
