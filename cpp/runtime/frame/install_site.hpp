// tripwire/cpp/runtime/frame/install_site.hpp -- where a guard was installed: the user's stack.
//
// Every guard records the stack that declared it ("file:line in func", tripwire's own frames left
// out), so a failure can say why the guard exists. The builder declares guards by the hundred, so
// this walks the frames in C and formats each (code, instruction) once: the strings are memoised.
#pragma once

#include <string>

#include "runtime/py.hpp"

namespace tripwire::runtime {

/// The calling thread's stack outside tripwire's machinery, innermost last, at most `depth`
/// entries, as a tuple of "file:line in func". `is_machinery(filename) -> bool` says whether a
/// file is tripwire's own (asked once per filename object, then memoised). New reference, or
/// null with an error set (what is_machinery raised). GIL held.
///
/// Re-entrancy: is_machinery is Python code and formatting allocates (a collection can run
/// `__del__`, which may declare a guard and so call this again): no iterator into the memos is
/// held across either, and entries are dropped only after the memo is swapped out.
PyObject* user_stack(PyObject* is_machinery, int depth);

/// Let user_stack answer `is_machinery` itself for the filenames whose answer is plain, as
/// tripwire.builder._is_machinery answers them (its callback is most of a cold stack walk): a
/// "<frozen ..." filename is machinery; an absolute, normal POSIX path (no empty, "." or ".."
/// component, no trailing slash) is machinery when its directory is `dir` and its base name is not
/// demo.py. Only for the callable `is_machinery` (kept for the life of the process); any other
/// filename, or another callable, is asked as before. Null `is_machinery`: no rule. GIL held.
void set_machinery_rule(PyObject* is_machinery, std::string dir);

/// Drop the memos (tests; the memos are bounded anyway).
void clear_install_site_memo();

/// The line of the instruction at `offset` (bytes) in `code`, as PyCode_Addr2Line answers it
/// (the line a walk without frame objects gives a site). Exposed for the test that compares the
/// two on every instruction of many code objects.
int instruction_line(PyCodeObject* code, int offset);

/// Test hook: walk through frame objects (PyEval_GetFrame, PyFrame_GetBack) instead of reading
/// the frames (on), or read them again once the next walk has checked that the two agree (off);
/// returns whether the frame-object walk was in use.
bool set_frame_object_walk(bool on);

/// Test hook: whether reading the calling thread's frames gives the same (code, instruction) list
/// as the frame-object walk, here and now (false on a build without the frame layout mirror).
bool frame_walks_agree();

}  // namespace tripwire::runtime
