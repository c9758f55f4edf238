// tripwire/cpp/runtime/frame/code_state.hpp -- the frame runtime's state per code object (co_extra).
//
// Dynamo keeps an ExtraState in each code object's co_extra: its cache entries and its frame
// strategy. We keep a CodeState there: one BackendSlot per backend (a JIT, keyed by identity)
// holding that backend's tripwire.Cache and strategy (DEFAULT / SKIP / RUN_ONLY). The index comes
// from _PyEval_RequestCodeExtraIndex with a destructor, so the state dies with the code object.
//
// Lifetimes: a CodeState is freed only by that destructor, i.e. when nothing can use its code
// any more (a running frame holds its code; every binding call holds it as an argument), and a
// BackendSlot is never freed before its CodeState, so raw slot pointers stay valid for as long
// as the caller holds the code. Resetting a slot clears its cache and strategy in place. A
// slot's cache object is replaced only through attach (the old one released after the swap).
//
// Code objects are not tracked by the garbage collector, so the references a CodeState holds
// (the caches, and through their guard sets the globals dicts they read) are roots: a cache
// lives as long as its code object, or until reset. docs/frame.md says so.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/cache/cache.hpp"
#include "runtime/frame/interp_frame.hpp"
#include "runtime/py.hpp"

namespace tripwire::runtime::frame {

/// What the frame runtime does with frames of a code object, per backend (Dynamo's
/// FrameExecStrategy actions).
enum class Strategy : std::uint8_t {
    Default = 0,  ///< look the cache up; call the backend on a miss
    Skip = 1,     ///< never intercept: run the original code
    RunOnly = 2,  ///< look the cache up; on a miss run the original code, never call the backend
    /// never intercept, and run the frame with this thread's hook suspended for its whole dynamic
    /// extent (Dynamo's recursive SKIP, torch.compiler.disable: a compiled graph's own frames)
    SkipRecursive = 3,
};

/// One backend's state for one code object.
struct BackendSlot {
    Ref backend;             ///< the backend key (compared by identity)
    Ref cache_object;        ///< the tripwire.Cache, or null before the first attach
    Cache* cache = nullptr;  ///< its runtime cache (owned by cache_object)
    Strategy strategy = Strategy::Default;
};

/// The frame runtime's state of one code object.
struct CodeState {
    std::vector<std::unique_ptr<BackendSlot>> slots;

    BackendSlot* find(PyObject* backend) const {
        for (const auto& s : slots)
            if (s->backend.get() == backend) return s.get();
        return nullptr;
    }
};

/// The co_extra index (-1 before init_code_states).
extern Py_ssize_t g_code_extra_index;

/// Request the co_extra index (once per process) and check the co_extra mirror against
/// _PyCode_GetExtra. False with a Python error set.
bool init_code_states();

/// The state of `co`, or null (none yet, or init_code_states not called). Hot path.
inline CodeState* code_state(PyCodeObject* co) {
    return g_code_extra_index < 0 ? nullptr : static_cast<CodeState*>(code_extra(co, g_code_extra_index));
}

/// The slot of `backend` for `co`, created (with the CodeState) when `create` is set. Null when
/// absent (or with a Python error set when creating failed).
BackendSlot* backend_slot(PyCodeObject* co, PyObject* backend, bool create);

/// Give `co`'s slot for `backend` the cache `cache_object` (whose runtime cache is `cache`),
/// creating the slot. The previous cache object, if any, is released after the swap. False with
/// a Python error set.
bool attach_cache(PyCodeObject* co, PyObject* backend, PyObject* cache_object, Cache* cache);

/// Set the strategy of `co` for `backend` (creating the slot). False with a Python error set.
bool set_strategy(PyCodeObject* co, PyObject* backend, Strategy s);

/// Forget what the frame runtime learnt about `co` for `backend` (every backend when null):
/// caches cleared, strategies back to Default.
void reset_code(PyCodeObject* co, PyObject* backend);

/// Drop every cache and backend reference of every code object and set every strategy back to
/// Default (at interpreter exit: code objects are not all freed by then, and what their states
/// hold would outlive the interpreter's own objects). Returns how many references were dropped.
std::size_t release_all_code_states();

}  // namespace tripwire::runtime::frame
