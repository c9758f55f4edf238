// tripwire/cpp/runtime/frame/install_site.hpp -- where a guard was installed: the user's stack.
//
// Every guard records the stack that declared it ("file:line in func", tripwire's own frames left
// out), so a failure can say why the guard exists. The builder declares guards by the hundred, so
// this walks the frames in C and formats each (code, instruction) once: the strings are memoised.
#pragma once

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

/// Drop the memos (tests; the memos are bounded anyway).
void clear_install_site_memo();

}  // namespace tripwire::runtime
