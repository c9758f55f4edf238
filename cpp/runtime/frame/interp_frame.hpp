// tripwire/cpp/runtime/frame/interp_frame.hpp -- CPython's interpreter frame, per version, in one place.
//
// A PEP 523 eval-frame function receives a `struct _PyInterpreterFrame*` that CPython has pushed
// on the thread's data stack and filled (arguments bound, other locals null) but not yet linked
// or run. Its layout is private (Include/internal/pycore_frame.h, which does not compile outside
// the interpreter) and changes with every minor version, so everything the frame runtime reads or
// writes in it lives here, mirrored per version:
//   3.11  f_func, f_globals, f_builtins, f_locals, f_code, frame_obj, previous, prev_instr,
//         stacktop, is_entry, owner; the caller (_PyEval_Vector) clears and pops the frame.
//   3.12  f_code, previous, f_funcobj, f_globals, f_builtins, f_locals, frame_obj, prev_instr,
//         stacktop, return_offset, owner; the evaluator clears and pops the frame it was given.
//   3.13  as 3.12 with f_executable for f_code and instr_ptr (the next instruction) for
//         prev_instr (the previous one).
// verify_frame_layout() checks the mirror against real frames (a probe function run under a
// probe eval function) and the two ways of running a replacement below; the frame runtime
// refuses to install when any check fails, or on a build this file does not know (free-threaded,
// another version).
//
// Running a replacement code object in a frame (what a JIT's transformed bytecode needs) takes
// no function object and no copy on the common path: the frame is *retargeted in place*. At entry
// its arguments are bound in slots [0, nargs), every other local is null and free variables are
// not copied yet (COPY_FREE_VARS is the code's own first instruction), so a code with the same
// arguments and free variables can run in it as is: swap the code, null the new code's other
// locals, point the instruction pointer at its start, and extend the frame to the new code's
// size (it is the top of the data stack, so that is moving the stack top) when the chunk has room.
// When it has not, a *shadow frame* is pushed in a new chunk, the arguments are moved into it,
// and the original frame is disposed of as CPython would (the only place we copy CPython's
// push/clear/pop, each a few lines, verified by the start-up probe).
#pragma once

#include <cstdint>
#include <string>

#include "runtime/py.hpp"

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000 && !defined(Py_GIL_DISABLED)
#define TRIPWIRE_FRAME_LAYOUT 1
#endif

namespace tripwire::runtime::frame {

/// The frame an eval-frame function is given (opaque outside this file's inline helpers).
using RawFrame = struct _PyInterpreterFrame;

/// Whether this build has a layout mirror for the running interpreter's version.
constexpr bool kHasFrameLayout =
#ifdef TRIPWIRE_FRAME_LAYOUT
    true;
#else
    false;
#endif

#ifdef TRIPWIRE_FRAME_LAYOUT
namespace layout {
/// `_Py_CODEUNIT` (a 16-bit instruction word; private in 3.13).
using CodeUnit = std::uint16_t;
/// `_PyCode_CODE(co)`: the first instruction word (the adaptive bytecode the frame runs).
inline CodeUnit* code_start(PyCodeObject* co) { return reinterpret_cast<CodeUnit*>(co->co_code_adaptive); }

#if PY_VERSION_HEX >= 0x030D0000
struct Frame {  // 3.13 struct _PyInterpreterFrame
    PyObject* f_executable;
    Frame* previous;
    PyObject* f_funcobj;
    PyObject* f_globals;
    PyObject* f_builtins;
    PyObject* f_locals;
    PyObject* frame_obj;
    CodeUnit* instr_ptr;
    int stacktop;
    std::uint16_t return_offset;
    char owner;
    PyObject* localsplus[1];
};
#elif PY_VERSION_HEX >= 0x030C0000
struct Frame {  // 3.12
    PyObject* f_code;
    Frame* previous;
    PyObject* f_funcobj;
    PyObject* f_globals;
    PyObject* f_builtins;
    PyObject* f_locals;
    PyObject* frame_obj;
    CodeUnit* prev_instr;
    int stacktop;
    std::uint16_t return_offset;
    char owner;
    PyObject* localsplus[1];
};
#else
struct Frame {  // 3.11
    PyObject* f_func;
    PyObject* f_globals;
    PyObject* f_builtins;
    PyObject* f_locals;
    PyObject* f_code;
    PyObject* frame_obj;
    Frame* previous;
    CodeUnit* prev_instr;
    int stacktop;
    bool is_entry;
    char owner;
    PyObject* localsplus[1];
};
#endif
/// CPython's `_PyCodeObjectExtra` (Objects/codeobject.c / pycore_code.h, 3.11-3.13 alike).
struct CodeExtra {
    Py_ssize_t ce_size;
    void* ce_extras[1];
};

inline Frame* of(RawFrame* f) { return reinterpret_cast<Frame*>(f); }

#if PY_VERSION_HEX >= 0x030D0000
inline PyObject*& code_slot(Frame* f) { return f->f_executable; }
inline PyObject*& function_slot(Frame* f) { return f->f_funcobj; }
#elif PY_VERSION_HEX >= 0x030C0000
inline PyObject*& code_slot(Frame* f) { return f->f_code; }
inline PyObject*& function_slot(Frame* f) { return f->f_funcobj; }
#else
inline PyObject*& code_slot(Frame* f) { return f->f_code; }
inline PyObject*& function_slot(Frame* f) { return f->f_func; }
#endif
}  // namespace layout

/// The code object the frame runs (borrowed).
inline PyCodeObject* frame_code(RawFrame* f) {
    return reinterpret_cast<PyCodeObject*>(layout::code_slot(layout::of(f)));
}
/// The function the frame was called through (borrowed; a function object for every frame an
/// eval-frame function is given on 3.11-3.13, checked by the caller anyway).
inline PyObject* frame_function(RawFrame* f) { return layout::function_slot(layout::of(f)); }
inline PyObject* frame_globals(RawFrame* f) { return layout::of(f)->f_globals; }
inline PyObject* frame_builtins(RawFrame* f) { return layout::of(f)->f_builtins; }
/// The fast locals (arguments first), as the frame holds them (borrowed references).
inline PyObject** frame_localsplus(RawFrame* f) { return layout::of(f)->localsplus; }

/// The code extra slot `index` of `co` (null when unset), read through the mirror: the hot path
/// of every intercepted frame. The mirror is verified against _PyCode_GetExtra at start-up.
inline void* code_extra(PyCodeObject* co, Py_ssize_t index) {
    auto* x = static_cast<layout::CodeExtra*>(co->co_extra);
    return (x != nullptr && index < x->ce_size) ? x->ce_extras[index] : nullptr;
}
#else
inline PyCodeObject* frame_code(RawFrame*) { return nullptr; }
inline PyObject* frame_function(RawFrame*) { return nullptr; }
inline PyObject* frame_globals(RawFrame*) { return nullptr; }
inline PyObject* frame_builtins(RawFrame*) { return nullptr; }
inline PyObject** frame_localsplus(RawFrame*) { return nullptr; }
inline void* code_extra(PyCodeObject*, Py_ssize_t) { return nullptr; }
#endif

/// Whether the frame is as CPython hands it to an eval-frame function for a call: owned by the
/// thread, at its first instruction, without a frame object, with no locals dict. Only such a
/// frame is ever intercepted (a generator's frame resumes mid-code and is never one).
bool frame_fresh(RawFrame* f);

/// The number of argument slots of `co`: positional, keyword-only, *args, **kwargs.
int argument_slots(PyCodeObject* co);

/// Run `code` in frame `f` instead of the frame's own code, and return the result (null with an
/// error set). The caller guarantees `code` is compatible with the frame's code (same argument
/// slots and free variables, not a generator; see replacement.hpp) and that `f` is fresh. The
/// frame is retargeted in place when its data-stack chunk has room for `code`'s frame, else run
/// as a shadow frame in a new chunk. Disposes of `f` as the eval-frame function must.
PyObject* run_code_in_frame(PyThreadState* ts, RawFrame* f, PyCodeObject* code);

/// Leave the eval-frame function with the error currently set: dispose of `f` as CPython expects
/// (3.12+: the eval-frame function clears and pops the frame it was given; 3.11: the caller
/// does) and return null. `f` must be fresh.
PyObject* fail_frame(PyThreadState* ts, RawFrame* f);

/// Check the mirror against real frames and both ways of running a replacement (in place and in
/// a shadow frame). Installs a probe eval function for the duration, so it must run while the
/// interpreter's eval function is CPython's own (the caller checks). True when every check
/// passed; false with `why` saying which failed (no Python error left set).
bool verify_frame_layout(std::string& why);

/// Test hook: run every replacement in a shadow frame (the path taken when a chunk is full), to
/// test it without filling the data stack.
void set_force_shadow_frames(bool on);
bool force_shadow_frames();

/// How many replacements ran in place and in shadow frames so far (for tests and benchmarks).
struct FrameRunStats {
    std::uint64_t in_place = 0;
    std::uint64_t shadow = 0;
};
const FrameRunStats& frame_run_stats();

}  // namespace tripwire::runtime::frame
