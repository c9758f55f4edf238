// tripwire/cpp/runtime/frame/hook.hpp -- the PEP 523 eval-frame function and its per-thread state.
//
// tripwire's eval-frame function is installed interpreter-wide when the first thread sets a hook
// and the previous one (CPython's own) restored when the last thread clears its hook, as Dynamo
// counts its active threads. Each thread has its own hook: a handler and a backend key, in a
// thread-local record, so a thread without one pays one thread-local load and a branch per
// Python call. A thread's hook dies with its thread state (a capsule in the thread-state dict).
//
// For each frame of a thread with a hook, the eval-frame function:
//   1. lets through generator unwinding (throw_flag), generator and coroutine code, non-function
//      code (module and class bodies), frames that are not fresh, and every frame run while the
//      thread is inside the frame runtime (the handler, a full cache lookup);
//   2. reads the code's CodeState (co_extra) for the hook's backend: SKIP lets the frame through;
//   3. looks the backend's cache up with the frame's fast locals by index (Locals::of_frame, no
//      dict): first the most recently used entry with the allocation-free fast pass, then the
//      full lookup; a hit runs the entry's Replacement in the frame (interp_frame.hpp);
//   4. on a miss under RUN_ONLY lets the frame through; otherwise calls
//      `handler(code, f_locals, f_globals, f_builtins, function)` (f_locals a new dict) and acts
//      on what it returns: a Replacement runs, 1 (SKIP) or 2 (RUN_ONLY) sets the strategy and
//      lets the frame through, None lets it through; an exception propagates from the frame.
// python/tripwire/frame.py is the handler (the user's callback, the callback contract, logging).
//
// A foreign eval-frame function (another JIT's) is never replaced: setting a hook fails while one
// is installed, and one installed over ours is left in place when ours is uninstalled (with a
// warning).
#pragma once

#include <string>

#include "runtime/frame/interp_frame.hpp"
#include "runtime/py.hpp"

namespace tripwire::runtime::frame {

/// The exception type for conflicts and unsupported interpreters (set once by the bindings:
/// tripwire.FrameError); RuntimeError until then.
void set_frame_error_type(PyObject* type);

/// Set this thread's hook (`handler` and `backend` both non-null), or clear it (both null).
/// `prev_handler` and `prev_backend` receive the thread's previous hook (null when none).
/// False with a Python error set: another eval-frame function is installed, the interpreter's
/// frame layout did not verify, or memory ran out; nothing changed then.
bool set_thread_hook(PyObject* handler, PyObject* backend, Ref& prev_handler, Ref& prev_backend);

/// The per-call scope type (tripwire._core.FrameScope, a new reference; null with an error set):
/// `FrameScope(fn, handler, backend, fallback=None, enter=None, on_error=None, dispatch_keys=False,
/// divert=None)` is a callable
/// whose call sets this thread's hook to (handler, backend), calls `fn`, and restores the
/// thread's previous hook (and its suspension), all in C: torch.compile's per-call wrapper
/// without a Python frame. `handler` None makes a suspended call (the hook off on this thread for
/// the call's dynamic extent). When the hook cannot be set because another PEP 523 function is
/// installed (FrameError), `fallback` is called instead, if given. `divert`, a tuple of
/// `(obj, names, value)` tests, is read first, in C: when `getattr` along `names` from `obj`
/// equals `value` for any test, the call goes to `fallback` (or to `fn` unhooked). `enter()`
/// runs next, before the hook is set (a C function, such as torch's functorch depth, costs no
/// Python frame): NotImplemented sends the call to `fallback` (or to `fn` unhooked), anything
/// else is passed to `on_error(state)` when `fn` raises (before the hook is restored). `dispatch_keys`
/// (needs the torch adapter) puts torch's thread-local dispatch key sets back after every call
/// of `fn` (after on_error), as torch.compile's wrapper does. Found on a class,
/// it binds like a function; it has a __dict__ (functools.update_wrapper).
PyTypeObject* scope_type();

/// A FrameScope's fn (0), handler (1), backend (2) or fallback (3), None when absent (new
/// reference; null with a TypeError when `self` is not a FrameScope).
PyObject* scope_field(PyObject* self, int which);

/// This thread's hook (new references; null when none).
void thread_hook(Ref& handler, Ref& backend);

/// Interpreter-wide facts for tests and diagnostics.
struct HookStatus {
    bool installed = false;  ///< our eval-frame function is the interpreter's now
    int active_threads = 0;  ///< threads with a hook
    bool layout_verified = false;
    std::string layout_error;  ///< why the frame layout did not verify (empty when it did or was not tried)
    std::string current_eval;  ///< "default", "tripwire" or "foreign"
};
HookStatus hook_status();

/// Benchmark floor: install (or remove) a PEP 523 eval-frame function that only calls CPython's
/// own, so that the cost of PEP 523 itself (CPython stops inlining Python-to-Python calls while
/// any eval-frame function is set) can be told apart from tripwire's; the tests use it as a
/// foreign hook. On: over CPython's own function or over tripwire's (which it then hides); off:
/// restores the function it replaced. False when the current function is not the expected one.
bool set_floor_eval(bool on);

/// Check the frame layout now (it is otherwise checked when the first hook is set). Needs the
/// interpreter's own eval-frame function; false with `why` otherwise.
bool verify_layout_now(std::string& why);

}  // namespace tripwire::runtime::frame
