// tripwire/cpp/runtime/frame/interp_frame.cpp -- running code in CPython frames, and the
// start-up check of the layout mirror (see the header).
#include "runtime/frame/interp_frame.hpp"

#include <cstring>

namespace tripwire::runtime::frame {
namespace {

bool g_force_shadow = false;
FrameRunStats g_stats;

}  // namespace

void set_force_shadow_frames(bool on) { g_force_shadow = on; }
bool force_shadow_frames() { return g_force_shadow; }
const FrameRunStats& frame_run_stats() { return g_stats; }

int argument_slots(PyCodeObject* co) {
    return co->co_argcount + co->co_kwonlyargcount + ((co->co_flags & CO_VARARGS) != 0 ? 1 : 0) +
           ((co->co_flags & CO_VARKEYWORDS) != 0 ? 1 : 0);
}

#ifdef TRIPWIRE_FRAME_LAYOUT
namespace {

using layout::Frame;

// The instruction pointer of a frame about to run `co` from its start.
void set_start(Frame* f, PyCodeObject* co) {
#if PY_VERSION_HEX >= 0x030D0000
    f->instr_ptr = layout::code_start(co);
#else
    f->prev_instr = layout::code_start(co) - 1;
#endif
}

// The frame size in words of a frame running `co` (header, locals, stack): co_framesize on
// 3.12+, computed as CPython 3.11's _PyEvalFramePushAndInit does before.
int frame_size(PyCodeObject* co) {
#if PY_VERSION_HEX >= 0x030C0000
    return co->co_framesize;
#else
    constexpr int kSpecials =
        static_cast<int>((sizeof(Frame) - 1) / sizeof(PyObject*));  // FRAME_SPECIALS_SIZE
    return co->co_nlocalsplus + co->co_stacksize + kSpecials;
#endif
}

bool at_start(Frame* f, PyCodeObject* co) {
#if PY_VERSION_HEX >= 0x030D0000
    return f->instr_ptr == layout::code_start(co);
#else
    return f->prev_instr == layout::code_start(co) - 1;
#endif
}

// Objects/obmalloc.c's _PyObject_VirtualAlloc/_PyObject_VirtualFree: the arena allocator, which
// CPython's own _PyThreadState_PopFrame uses to free a chunk (so a chunk we push, CPython may pop,
// and the reverse).
void* virtual_alloc(std::size_t size) {
    PyObjectArenaAllocator arena;
    PyObject_GetArenaAllocator(&arena);
    return arena.alloc(arena.ctx, size);
}
void virtual_free(void* p, std::size_t size) {
    PyObjectArenaAllocator arena;
    PyObject_GetArenaAllocator(&arena);
    arena.free(arena.ctx, p, size);
}

// Python/pystate.c's push_chunk (3.11-3.13 alike): a new data-stack chunk holding a frame of
// `size` words (and room for the calls it makes); the frame is at the chunk's start. Null on
// failure (no error set).
PyObject** push_chunk(PyThreadState* ts, int size) {
    constexpr int kChunkSize = 16 * 1024;   // DATA_STACK_CHUNK_SIZE
    constexpr int kMinimumOverhead = 1000;  // MINIMUM_OVERHEAD
    int allocate_size = kChunkSize;
    while (allocate_size < static_cast<int>(sizeof(PyObject*)) * (size + kMinimumOverhead))
        allocate_size *= 2;
    auto* chunk = static_cast<_PyStackChunk*>(virtual_alloc(static_cast<std::size_t>(allocate_size)));
    if (chunk == nullptr) return nullptr;
    chunk->previous = ts->datastack_chunk;
    chunk->size = static_cast<std::size_t>(allocate_size);
    chunk->top = 0;
    if (ts->datastack_chunk != nullptr) {
        ts->datastack_chunk->top =
            static_cast<std::size_t>(ts->datastack_top - &ts->datastack_chunk->data[0]);
    }
    ts->datastack_chunk = chunk;
    ts->datastack_limit = reinterpret_cast<PyObject**>(reinterpret_cast<char*>(chunk) + allocate_size);
    // A root chunk's first word is skipped so that popping never frees it; ours always has a
    // previous chunk, as the frame we replace lives in one.
    PyObject** res = &chunk->data[chunk->previous == nullptr ? 1 : 0];
    ts->datastack_top = res + size;
    return res;
}

// Python/pystate.c's _PyThreadState_PopFrame (3.11-3.13 alike): `f` must be the top frame.
void pop_frame(PyThreadState* ts, Frame* f) {
    auto** base = reinterpret_cast<PyObject**>(f);
    _PyStackChunk* chunk = ts->datastack_chunk;
    if (base == &chunk->data[0]) {
        _PyStackChunk* previous = chunk->previous;
        ts->datastack_top = &previous->data[previous->top];
        ts->datastack_chunk = previous;
        virtual_free(chunk, chunk->size);
        ts->datastack_limit =
            reinterpret_cast<PyObject**>(reinterpret_cast<char*>(previous) + previous->size);
    } else {
        ts->datastack_top = base;
    }
}

// Python/frame.c's _PyFrame_Clear (3.11) / _PyFrame_ClearExceptCode + the code's reference
// (3.12, 3.13), for a frame that never ran and has no frame object (frame_fresh), so none of
// the frame-object ownership transfer applies. Decrefs may run finalizers: the frame is not
// linked, so they cannot see it, and any frame they push goes above it.
void clear_frame(Frame* f) {
    for (int i = 0; i < f->stacktop; ++i) Py_CLEAR(f->localsplus[i]);
    Py_CLEAR(f->f_locals);
    Py_CLEAR(layout::function_slot(f));
    Py_CLEAR(layout::code_slot(f));
}

#if PY_VERSION_HEX < 0x030C0000
// 3.11's struct _frame (the PyFrameObject), for take_ownership below.
struct FrameObject {
    PyObject_HEAD FrameObject* f_back;
    Frame* f_frame;
    PyObject* f_trace;
    int f_lineno;
    char f_trace_lines;
    char f_trace_opcodes;
    char f_fast_as_locals;
    PyObject* _f_frame_data[1];
};

constexpr char kOwnedByFrameObject = 2;  // FRAME_OWNED_BY_FRAME_OBJECT

bool incomplete(Frame* f) {  // _PyFrame_IsIncomplete (3.11)
    auto* co = reinterpret_cast<PyCodeObject*>(f->f_code);
    return f->owner != 1 /* FRAME_OWNED_BY_GENERATOR */ &&
           f->prev_instr < layout::code_start(co) + co->_co_firsttraceable;
}

// Python/frame.c's take_ownership (3.11): the frame object outlives the frame (a traceback, a
// sys._getframe() result), so it takes a copy of the frame's data and its references.
void take_ownership(FrameObject* fo, Frame* frame) {
    const std::size_t size = static_cast<std::size_t>(
        reinterpret_cast<char*>(&frame->localsplus[frame->stacktop]) - reinterpret_cast<char*>(frame));
    std::memcpy(fo->_f_frame_data, frame, size);
    frame = reinterpret_cast<Frame*>(fo->_f_frame_data);
    fo->f_frame = frame;
    frame->owner = kOwnedByFrameObject;
    if (incomplete(frame)) {
        auto* co = reinterpret_cast<PyCodeObject*>(frame->f_code);
        frame->prev_instr = layout::code_start(co) + co->_co_firsttraceable;
    }
    Frame* prev = frame->previous;
    while (prev != nullptr && incomplete(prev)) prev = prev->previous;
    if (prev != nullptr) {
        // _PyFrame_GetFrameObject(prev) is internal; the previous frame is the thread's current
        // one again (the caller of the call we intercepted), whose frame object PyEval_GetFrame
        // gives (creating it). Linked only when it is that very frame.
        // The frame's own exception (it may be unwinding) is kept across it.
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyFrameObject* back = PyEval_GetFrame();
        if (back != nullptr && reinterpret_cast<FrameObject*>(back)->f_frame == prev)
            fo->f_back = reinterpret_cast<FrameObject*>(Py_NewRef(reinterpret_cast<PyObject*>(back)));
        PyErr_Clear();  // a memory error making `back`: nothing to do about it (CPython's choice too)
        PyErr_Restore(type, value, tb);
        frame->previous = nullptr;
    }
    if (!PyObject_GC_IsTracked(reinterpret_cast<PyObject*>(fo))) PyObject_GC_Track(fo);
}

// Python/frame.c's _PyFrame_Clear (3.11) for a frame that ran: its frame object, if anything
// else holds it, takes the frame's data over.
void clear_ran_frame(Frame* f) {
    if (f->frame_obj != nullptr) {
        auto* fo = reinterpret_cast<FrameObject*>(f->frame_obj);
        f->frame_obj = nullptr;
        if (Py_REFCNT(fo) > 1) {
            take_ownership(fo, f);
            Py_DECREF(fo);
            return;
        }
        Py_DECREF(fo);
    }
    clear_frame(f);
}
#endif

// The shadow frame: `code` run in a frame of its own in a new chunk, the arguments moved there
// from `f` (which keeps the null slots), then `f` disposed of as the version requires.
PyObject* run_in_shadow_frame(PyThreadState* ts, Frame* f, PyCodeObject* code, int nargs) {
    PyObject** mem = push_chunk(ts, frame_size(code));
    if (mem == nullptr) {
        PyErr_NoMemory();
        return fail_frame(ts, reinterpret_cast<RawFrame*>(f));
    }
    auto* s = reinterpret_cast<Frame*>(mem);
    layout::function_slot(s) = Py_NewRef(layout::function_slot(f));
    layout::code_slot(s) = Py_NewRef(reinterpret_cast<PyObject*>(code));
    s->f_globals = f->f_globals;
    s->f_builtins = f->f_builtins;
    s->f_locals = nullptr;
    s->frame_obj = nullptr;
    s->previous = nullptr;
    set_start(s, code);
    s->stacktop = code->co_nlocalsplus;
    s->owner = 0;  // FRAME_OWNED_BY_THREAD
#if PY_VERSION_HEX >= 0x030C0000
    s->return_offset = 0;
#else
    s->is_entry = false;
#endif
    for (int i = 0; i < nargs; ++i) {
        s->localsplus[i] = f->localsplus[i];
        f->localsplus[i] = nullptr;
    }
    for (int i = nargs; i < code->co_nlocalsplus; ++i) s->localsplus[i] = nullptr;
    ++g_stats.shadow;
    PyObject* r = _PyEval_EvalFrameDefault(ts, reinterpret_cast<RawFrame*>(s), 0);
#if PY_VERSION_HEX >= 0x030C0000
    // The evaluator cleared and popped the shadow frame; the original (its arguments moved out)
    // is ours to dispose of.
    clear_frame(f);
    pop_frame(ts, f);
#else
    // On 3.11 the evaluator leaves an entry frame to its caller: the shadow frame is ours, the
    // original (its arguments moved out) goes back to _PyEval_Vector, which clears and pops it.
    clear_ran_frame(s);
    pop_frame(ts, s);
#endif
    return r;
}

}  // namespace

bool frame_fresh(RawFrame* raw) {
    Frame* f = layout::of(raw);
    PyCodeObject* co = frame_code(raw);
    return f->owner == 0 && f->frame_obj == nullptr && f->f_locals == nullptr && at_start(f, co) &&
           f->stacktop == co->co_nlocalsplus;
}

PyObject* run_code_in_frame(PyThreadState* ts, RawFrame* raw, PyCodeObject* code) {
    Frame* f = layout::of(raw);
    PyCodeObject* old = frame_code(raw);
    const int nargs = argument_slots(old);
    auto** base = reinterpret_cast<PyObject**>(f);
    // The frame is the top of the data stack (just pushed by _PyEval_Vector, and everything run
    // since has popped what it pushed): it may grow up to the chunk's limit. CPython's own test
    // (_PyThreadState_HasStackSpace) is strict too.
    if (g_force_shadow || frame_size(code) >= ts->datastack_limit - base)
        return run_in_shadow_frame(ts, f, code, nargs);
    // Retarget in place. Slots [nargs, old nlocalsplus) are already null (non-argument locals of
    // a fresh frame, and free variables not copied yet); beyond that was the old code's stack.
    for (int i = nargs; i < code->co_nlocalsplus; ++i) f->localsplus[i] = nullptr;
    ts->datastack_top = base + frame_size(code);
    layout::code_slot(f) = Py_NewRef(reinterpret_cast<PyObject*>(code));
    set_start(f, code);
    f->stacktop = code->co_nlocalsplus;
    ++g_stats.in_place;
    PyObject* r = _PyEval_EvalFrameDefault(ts, raw, 0);
    // The frame's reference to its original code, released once the frame is gone: released
    // earlier it could be the last one, and the code's extra state (the cache that gave us
    // `code`) would be freed, with finalizers running, before the frame even started.
    Py_DECREF(old);
    return r;
}

PyObject* fail_frame(PyThreadState* ts, RawFrame* raw) {
#if PY_VERSION_HEX >= 0x030C0000
    Frame* f = layout::of(raw);
    clear_frame(f);
    pop_frame(ts, f);
#else
    (void)ts;
    (void)raw;
#endif
    return nullptr;
}

// -- start-up check --------------------------------------------------------------------------------
namespace {

// What the probe eval function is looking for, and what it found.
struct Probe {
    PyObject* function = nullptr;  // the probe function (borrowed)
    PyObject* const* args = nullptr;
    int nargs = 0;
    PyCodeObject* replacement = nullptr;  // run in the frame when set
    bool shadow = false;
    bool seen = false;
    std::string why;
};
Probe* g_probe = nullptr;

void inspect(Probe& p, PyThreadState* ts, RawFrame* raw) {
    Frame* f = layout::of(raw);
    auto* fn = reinterpret_cast<PyFunctionObject*>(p.function);
    auto* co = reinterpret_cast<PyCodeObject*>(fn->func_code);
    auto fail = [&](const char* what) {
        if (p.why.empty()) p.why = what;
    };
    if (frame_function(raw) != p.function) fail("the frame's function");
    if (frame_globals(raw) != fn->func_globals) fail("the frame's globals");
    if (frame_builtins(raw) != fn->func_builtins) fail("the frame's builtins");
    if (f->f_locals != nullptr) fail("the frame's locals dict");
    if (f->frame_obj != nullptr) fail("the frame's frame object");
    if (f->owner != 0) fail("the frame's owner");
    if (f->stacktop != co->co_nlocalsplus) fail("the frame's stack top");
    if (!at_start(f, co)) fail("the frame's instruction pointer");
#if PY_VERSION_HEX < 0x030C0000
    if (f->is_entry) fail("the frame's entry flag");
#endif
    if (argument_slots(co) != p.nargs) fail("the probe's argument count");
    for (int i = 0; i < co->co_nlocalsplus && p.why.empty(); ++i) {
        PyObject* expected = i < p.nargs ? p.args[i] : nullptr;
        // *args and **kwargs are built by the call: compare their types and contents.
        PyObject* got = f->localsplus[i];
        if (expected == got) continue;
        if (expected != nullptr && got != nullptr && Py_TYPE(expected) == Py_TYPE(got) &&
            PyObject_RichCompareBool(expected, got, Py_EQ) == 1)
            continue;
        PyErr_Clear();
        fail("the frame's fast locals");
    }
    if (ts->datastack_top != reinterpret_cast<PyObject**>(f) + frame_size(co)) fail("the data stack top");
    if (!frame_fresh(raw)) fail("frame_fresh");
}

PyObject* probe_eval(PyThreadState* ts, RawFrame* raw, int throw_flag) {
    Probe* p = g_probe;
    if (p == nullptr || throw_flag || p->seen ||
        frame_code(raw) != reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(p->function)))
        return _PyEval_EvalFrameDefault(ts, raw, throw_flag);
    p->seen = true;
    inspect(*p, ts, raw);
    if (!p->why.empty() || p->replacement == nullptr) return _PyEval_EvalFrameDefault(ts, raw, throw_flag);
    const bool saved = g_force_shadow;
    g_force_shadow = p->shadow;
    PyObject* r = run_code_in_frame(ts, raw, p->replacement);
    g_force_shadow = saved;
    return r;
}

const char* kProbeSource =
    "import sys\n"
    "frames = []\n"
    "def _outer():\n"
    "    captured = 'cap'\n"
    "    def probe(a, b, *rest, k, **kw):\n"
    "        inner = lambda: (b, captured)\n"
    "        return ('original', a, b, rest, k, kw, inner())\n"
    "    return probe\n"
    "def _outer2():\n"
    "    captured = 'cap'\n"
    "    def replacement(a, b, *rest, k, **kw):\n"
    "        x = 10; y = 20; z = [x, y, [x] * 3]\n"
    "        inner = lambda: (b, captured)\n"
    "        frames.append(sys._getframe())\n"  // outlives the frame: its data is taken over
    "        return ('replaced', a, b, rest, k, kw, inner(), x + y, len(z))\n"
    "    return replacement\n"
    "probe = _outer()\n"
    "replacement = _outer2()\n"
    "b = [2]\n"
    "call_args = (1, b, 3, 4)\n"
    "call_kwargs = {'k': 'k', 'e': 5}\n"
    "slots = (1, b, 'k', (3, 4), {'e': 5})\n"  // the frame's order: positional, keyword-only, *, **
    "expected_original = ('original', 1, [2], (3, 4), 'k', {'e': 5}, ([2], 'cap'))\n"
    "expected_replaced = ('replaced', 1, [2], (3, 4), 'k', {'e': 5}, ([2], 'cap'), 30, 3)\n";

}  // namespace

bool verify_frame_layout(std::string& why) {
    why.clear();
    PyObject* ns = PyDict_New();
    if (ns == nullptr) {
        PyErr_Clear();
        why = "out of memory";
        return false;
    }
    PyDict_SetItemString(ns, "__builtins__", PyEval_GetBuiltins());
    PyObject* r = PyRun_String(kProbeSource, Py_file_input, ns, ns);
    Py_XDECREF(r);
    PyObject* probe_fn = PyDict_GetItemString(ns, "probe");
    PyObject* repl_fn = PyDict_GetItemString(ns, "replacement");
    PyObject* slots = PyDict_GetItemString(ns, "slots");
    PyObject* call_args = PyDict_GetItemString(ns, "call_args");
    PyObject* call_kwargs = PyDict_GetItemString(ns, "call_kwargs");
    if (r == nullptr || probe_fn == nullptr || repl_fn == nullptr || slots == nullptr ||
        call_args == nullptr || call_kwargs == nullptr) {
        PyErr_Clear();
        Py_DECREF(ns);
        why = "the probe source did not run";
        return false;
    }
    PyInterpreterState* interp = PyInterpreterState_Get();
    const _PyFrameEvalFunction previous = _PyInterpreterState_GetEvalFrameFunc(interp);
    // Three runs: inspect only, a replacement in place, a replacement in a shadow frame.
    const char* expected_names[] = {"expected_original", "expected_replaced", "expected_replaced"};
    for (int run = 0; run < 3 && why.empty(); ++run) {
        Probe p;
        p.function = probe_fn;
        p.args = &PyTuple_GET_ITEM(slots, 0);
        p.nargs = static_cast<int>(PyTuple_GET_SIZE(slots));
        if (run > 0) p.replacement = reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(repl_fn));
        p.shadow = run == 2;
        const FrameRunStats before = g_stats;
        g_probe = &p;
        _PyInterpreterState_SetEvalFrameFunc(interp, probe_eval);
        PyObject* result = PyObject_Call(probe_fn, call_args, call_kwargs);  // probe(1, b, 3, 4, k='k', e=5)
        _PyInterpreterState_SetEvalFrameFunc(interp, previous);
        g_probe = nullptr;
        if (result == nullptr) {
            PyErr_Clear();
            why = p.why.empty() ? "the probe call raised" : p.why;
            break;
        }
        PyObject* expected = PyDict_GetItemString(ns, expected_names[run]);
        const int same = expected ? PyObject_RichCompareBool(result, expected, Py_EQ) : -1;
        Py_DECREF(result);
        PyErr_Clear();
        if (!p.seen) {
            why = "the probe frame was not recognised (the frame's code)";
        } else if (!p.why.empty()) {
            why = p.why;
        } else if (same != 1) {
            why = run == 0 ? "the probe's result"
                           : (run == 1 ? "a replacement run in place" : "a shadow frame");
        } else if (run == 1 && g_stats.in_place != before.in_place + 1) {
            why = "a replacement run in place (not counted)";
        } else if (run == 2 && g_stats.shadow != before.shadow + 1) {
            why = "a shadow frame (not counted)";
        } else if (run > 0) {
            // The replacement's frame object, kept past the frame: it must still read the frame's
            // code and locals (taken over when the frame was cleared).
            PyObject* check = PyRun_String(
                "fo = frames.pop()\n"
                "ok = fo.f_code is replacement.__code__ and fo.f_locals['a'] == 1 and fo.f_locals['x'] == 10 "
                "and fo.f_lineno > 0\n",
                Py_file_input, ns, ns);
            Py_XDECREF(check);
            PyObject* ok = check ? PyDict_GetItemString(ns, "ok") : nullptr;
            if (ok != Py_True)
                why = run == 1 ? "a replaced frame's frame object" : "a shadow frame's frame object";
            PyErr_Clear();
        }
    }
    Py_DECREF(ns);
    return why.empty();
}

#else  // no layout mirror for this build

bool frame_fresh(RawFrame*) { return false; }
PyObject* run_code_in_frame(PyThreadState*, RawFrame*, PyCodeObject*) {
    PyErr_SetString(PyExc_RuntimeError, "tripwire.frame is not supported on this Python build");
    return nullptr;
}
PyObject* fail_frame(PyThreadState*, RawFrame*) { return nullptr; }
bool verify_frame_layout(std::string& why) {
    why =
        "no frame layout mirror for this Python version or build (supported: CPython 3.11-3.13, with the "
        "GIL)";
    return false;
}

#endif

}  // namespace tripwire::runtime::frame
