// tripwire/cpp/runtime/frame/code_state.cpp -- CodeState in co_extra (see the header).
#include "runtime/frame/code_state.hpp"

#include <new>
#include <unordered_set>

namespace tripwire::runtime::frame {

Py_ssize_t g_code_extra_index = -1;

namespace {

// Every live CodeState, for release_all_code_states (lives until process exit).
std::unordered_set<CodeState*>* g_states = nullptr;

// The co_extra destructor: runs when the code object is deallocated (GIL held). Releasing the
// caches may run arbitrary code (payloads' and guard sets' finalizers); nothing can reach this
// state any more by then.
void destroy_code_state(void* p) {
    auto* st = static_cast<CodeState*>(p);
    if (g_states != nullptr) g_states->erase(st);
    delete st;
}

#if PY_VERSION_HEX >= 0x030C0000
int get_extra(PyObject* co, void** out) { return PyUnstable_Code_GetExtra(co, g_code_extra_index, out); }
int set_extra(PyObject* co, void* v) { return PyUnstable_Code_SetExtra(co, g_code_extra_index, v); }
Py_ssize_t request_index() { return PyUnstable_Eval_RequestCodeExtraIndex(destroy_code_state); }
#else
int get_extra(PyObject* co, void** out) { return _PyCode_GetExtra(co, g_code_extra_index, out); }
int set_extra(PyObject* co, void* v) { return _PyCode_SetExtra(co, g_code_extra_index, v); }
Py_ssize_t request_index() { return _PyEval_RequestCodeExtraIndex(destroy_code_state); }
#endif

CodeState* state_or_create(PyCodeObject* co) {
    if (CodeState* st = code_state(co)) return st;
    if (!init_code_states()) return nullptr;
    auto* st = new (std::nothrow) CodeState();
    if (st == nullptr) {
        PyErr_NoMemory();
        return nullptr;
    }
    if (set_extra(reinterpret_cast<PyObject*>(co), st) < 0) {
        delete st;
        return nullptr;
    }
    if (g_states == nullptr) g_states = new std::unordered_set<CodeState*>();
    g_states->insert(st);
    return st;
}

}  // namespace

bool init_code_states() {
    if (g_code_extra_index >= 0) return true;
    if (!kHasFrameLayout) {
        PyErr_SetString(PyExc_RuntimeError, "tripwire.frame is not supported on this Python build");
        return false;
    }
    const Py_ssize_t index = request_index();
    if (index < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "no co_extra index left for tripwire.frame");
        return false;
    }
    g_code_extra_index = index;
    // Check the mirror code_extra() reads against the API, on a throwaway code object.
    PyObject* code = Py_CompileString("pass", "<tripwire co_extra probe>", Py_file_input);
    if (code == nullptr) {
        g_code_extra_index = -1;
        return false;
    }
    auto* st = new (std::nothrow) CodeState();
    void* through_api = nullptr;
    const bool ok = st != nullptr && set_extra(code, st) == 0 && get_extra(code, &through_api) == 0 &&
                    through_api == st && code_extra(reinterpret_cast<PyCodeObject*>(code), index) == st;
    if (st != nullptr && through_api != st) delete st;  // not stored: ours to free
    Py_DECREF(code);  // frees `st` through destroy_code_state when it was stored
    if (!ok) {
        g_code_extra_index = -1;
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_RuntimeError,
                            "tripwire.frame: the co_extra layout of this interpreter is unknown");
        }
        return false;
    }
    return true;
}

BackendSlot* backend_slot(PyCodeObject* co, PyObject* backend, bool create) {
    CodeState* st = create ? state_or_create(co) : code_state(co);
    if (st == nullptr) return nullptr;
    if (BackendSlot* s = st->find(backend)) return s;
    if (!create) return nullptr;
    auto slot = std::make_unique<BackendSlot>();
    slot->backend = Ref::borrow(backend);
    st->slots.push_back(std::move(slot));
    return st->slots.back().get();
}

bool attach_cache(PyCodeObject* co, PyObject* backend, PyObject* cache_object, Cache* cache) {
    BackendSlot* s = backend_slot(co, backend, true);
    if (s == nullptr) return false;
    Ref old = std::move(s->cache_object);  // released at return, once the slot is consistent
    s->cache_object = Ref::borrow(cache_object);
    s->cache = cache;
    return true;
}

bool set_strategy(PyCodeObject* co, PyObject* backend, Strategy strategy) {
    BackendSlot* s = backend_slot(co, backend, true);
    if (s == nullptr) return false;
    s->strategy = strategy;
    return true;
}

void reset_code(PyCodeObject* co, PyObject* backend) {
    CodeState* st = code_state(co);
    if (st == nullptr) return;
    // Clearing a cache may run finalizers that reset or attach again: take our own references to
    // the caches first, and walk by index (attach may append slots; none is ever removed).
    std::vector<Ref> caches;
    for (std::size_t i = 0; i < st->slots.size(); ++i) {
        BackendSlot* s = st->slots[i].get();
        if (backend != nullptr && s->backend.get() != backend) continue;
        s->strategy = Strategy::Default;
        if (s->cache_object) caches.push_back(s->cache_object);
    }
    for (const Ref& c : caches) {
        for (std::size_t i = 0; i < st->slots.size(); ++i) {
            BackendSlot* s = st->slots[i].get();
            if (s->cache_object.get() == c.get() && s->cache != nullptr) s->cache->clear();
        }
    }
}

std::size_t release_all_code_states() {
    if (g_states == nullptr) return 0;
    // Move every reference out first (no user code runs while moving), release them after:
    // a finalizer may then free code objects (and their states) or attach new caches.
    std::vector<Ref> dropped;
    for (CodeState* st : *g_states) {
        for (const auto& s : st->slots) {
            s->strategy = Strategy::Default;
            s->cache = nullptr;
            if (s->cache_object) dropped.push_back(std::move(s->cache_object));
            // The backend too (a callback, and through it whole modules): a slot without one
            // never matches again (hooks always have a backend).
            if (s->backend) dropped.push_back(std::move(s->backend));
        }
    }
    const std::size_t n = dropped.size();
    dropped.clear();
    return n;
}

}  // namespace tripwire::runtime::frame
