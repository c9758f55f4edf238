// tripwire/cpp/runtime/calls/call_binding.hpp -- binding a vectorcall to a Python function's parameters.
//
// CallSignature reads a function's parameter layout from its code object once; BoundCall binds
// one call's (args, nargs, kwnames) to it without running Python code, the way the interpreter
// does before a frame starts: positional arguments, keywords by name, defaults and keyword-only
// defaults read from the function at call time, extra positionals into a *args tuple and extra
// keywords into a **kwargs dict. The result is a Locals in argument mode, so a guard set reads
// L['x'] from the argument vector directly.
//
// A call the interpreter would reject (missing or duplicate arguments, unknown keywords) is not
// bound: BoundCall::bind returns 0 and the caller lets Python raise its own TypeError.
#pragma once

#include <vector>

#include "runtime/eval/locals.hpp"
#include "runtime/py.hpp"

namespace tripwire::runtime {

/// The parameter layout of a plain Python function.
class CallSignature {
  public:
    /// Reads `fn`'s code object. Returns false (no Python error) when `fn` is not a Python
    /// function; then no call can be bound.
    bool init(PyObject* fn);
    bool valid() const { return static_cast<bool>(code_); }

    /// Every parameter name (interned) in code order: positional, keyword-only, *args, **kwargs.
    PyObject* names() const { return names_.get(); }
    Py_ssize_t size() const { return n_names_; }
    /// The code object the layout was read from (a function whose __code__ was replaced since
    /// is not bound with it).
    PyObject* code() const { return code_.get(); }
    /// Whether a call with these arguments binds one positional argument per parameter and
    /// nothing else: the caller's argument vector is then the locals, as they are (no allocation).
    bool binds_as_is(Py_ssize_t nargs, PyObject* kwnames) const {
        return kwnames == nullptr && nargs == argcount_ && n_names_ == argcount_;
    }

  private:
    friend class BoundCall;
    Ref code_, names_;
    Py_ssize_t n_names_ = 0;
    Py_ssize_t argcount_ = 0;  // positional parameters (positional-only included)
    Py_ssize_t posonly_ = 0;   // positional-only among them
    Py_ssize_t kwonly_ = 0;    // keyword-only parameters
    Py_ssize_t varargs_ = -1;  // index of the *args name in names_, or -1
    Py_ssize_t varkw_ = -1;    // index of the **kwargs name, or -1
};

/// One call bound to a CallSignature. Owns the *args tuple, the **kwargs dict and a reference to
/// the defaults it used; the positional and keyword values are borrowed from the caller's
/// argument vector, which outlives the call.
class BoundCall {
  public:
    BoundCall() = default;
    ~BoundCall();
    BoundCall(const BoundCall&) = delete;
    BoundCall& operator=(const BoundCall&) = delete;

    /// 1 bound; 0 not bindable (the call is invalid, or fn's code changed): no error set; -1
    /// with a Python error set (out of memory).
    int bind(const CallSignature& sig, PyObject* fn, PyObject* const* args, Py_ssize_t nargs,
             PyObject* kwnames);

    /// The bound locals in argument mode. Valid while this BoundCall and the call's arguments live.
    Locals locals() const;

  private:
    static constexpr Py_ssize_t kInline = 8;
    PyObject* inline_[kInline];  // the first size() entries are set by bind()
    std::vector<PyObject*> heap_;
    PyObject** slots_ = inline_;         // where bind() writes the values it gathers
    PyObject* const* values_ = inline_;  // the bound values: slots_, or the caller's arguments
    const CallSignature* sig_ = nullptr;
    /// Keep `v` alive until this BoundCall is destroyed.
    void hold(PyObject* v);
    PyObject* held_[kInline];  // the first n_held_ are owned references
    Py_ssize_t n_held_ = 0;
    std::vector<Ref> held_more_;
    Ref defaults_, varargs_, varkw_;
};

}  // namespace tripwire::runtime
