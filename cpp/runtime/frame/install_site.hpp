// tripwire/cpp/runtime/frame/install_site.hpp -- where a guard was installed: the user's stack.
//
// Every guard records the stack that declared it ("file:line in func", tripwire's own frames left
// out), so a failure can say why the guard exists. The walk is CPython's public one
// (PyEval_GetFrame, PyFrame_GetBack, PyFrame_GetLineNumber): it runs once per declared guard, a
// cold path, so it reads no interpreter internals. The builder declares guards by the hundred, so
// each (code, instruction) frame's contribution is memoised.
#pragma once

#include "runtime/py.hpp"

namespace tripwire::runtime {

/// The calling thread's stack outside tripwire's machinery, innermost last, at most `depth`
/// entries, as a tuple of "file:line in func". `is_machinery(filename) -> bool` says whether a
/// file is tripwire's own (tripwire.builder._is_machinery: frozen importlib or the one definition,
/// tripwire._package.is_own_file, which the frame hook also asks); it is asked once
/// per (code, instruction) the memo does not hold. New reference, or null with an error set
/// (what is_machinery raised). GIL held.
///
/// Re-entrancy: is_machinery is Python code, and making frame objects or formatting allocates (a
/// collection can run `__del__`, which may declare a guard and so call this again): no iterator
/// into the memo is held across either, and entries are dropped only after the memo is swapped
/// out.
PyObject* user_stack(PyObject* is_machinery, int depth);

/// Drop the memo (tests; the memo is bounded anyway).
void clear_install_site_memo();

}  // namespace tripwire::runtime
