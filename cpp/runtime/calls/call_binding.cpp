// tripwire/cpp/runtime/calls/call_binding.cpp -- CallSignature and BoundCall.
#include "runtime/calls/call_binding.hpp"

#include <algorithm>

namespace tripwire::runtime {

bool CallSignature::init(PyObject* fn) {
    code_ = Ref();
    if (fn == nullptr || !PyFunction_Check(fn)) return false;
    PyObject* code = PyFunction_GET_CODE(fn);
    if (code == nullptr || !PyCode_Check(code)) return false;
    auto* co = reinterpret_cast<PyCodeObject*>(code);
    argcount_ = co->co_argcount;
    posonly_ = co->co_posonlyargcount;
    kwonly_ = co->co_kwonlyargcount;
    Py_ssize_t total = argcount_ + kwonly_;
    varargs_ = (co->co_flags & CO_VARARGS) ? total++ : -1;
    varkw_ = (co->co_flags & CO_VARKEYWORDS) ? total++ : -1;
#if PY_VERSION_HEX >= 0x030B0000
    Ref varnames = Ref::steal(PyCode_GetVarnames(co));
#else
    Ref varnames = Ref::borrow(co->co_varnames);
#endif
    if (!varnames || !PyTuple_Check(varnames.get()) || PyTuple_GET_SIZE(varnames.get()) < total) {
        PyErr_Clear();
        return false;
    }
    Ref names = Ref::steal(PyTuple_New(total));
    if (!names) {
        PyErr_Clear();
        return false;
    }
    for (Py_ssize_t i = 0; i < total; ++i) {
        PyObject* s = PyTuple_GET_ITEM(varnames.get(), i);
        if (!PyUnicode_CheckExact(s)) return false;
        Py_INCREF(s);
        PyUnicode_InternInPlace(&s);
        PyTuple_SET_ITEM(names.get(), i, s);
    }
    names_ = std::move(names);
    n_names_ = total;
    code_ = Ref::borrow(code);
    return true;
}

int BoundCall::bind(const CallSignature& sig, PyObject* fn, PyObject* const* args, Py_ssize_t nargs,
                    PyObject* kwnames) {
    if (!sig.valid() || !PyFunction_Check(fn) || PyFunction_GET_CODE(fn) != sig.code()) return 0;
    sig_ = &sig;
    const Py_ssize_t n = sig.n_names_;
    const Py_ssize_t argcount = sig.argcount_;
    if (kwnames == nullptr && nargs == argcount && n == argcount) {
        // The common call: one positional argument per parameter and nothing else. The caller's
        // argument vector is the locals (it outlives the call).
        values_ = args;
        return 1;
    }
    if (n > kInline) {
        heap_.assign(static_cast<std::size_t>(n), nullptr);
        slots_ = heap_.data();
    } else {
        std::fill(inline_, inline_ + n, nullptr);
        slots_ = inline_;
    }
    values_ = slots_;
    const Py_ssize_t npos = std::min(nargs, argcount);
    for (Py_ssize_t i = 0; i < npos; ++i) slots_[i] = args[i];
    if (nargs > argcount) {
        if (sig.varargs_ < 0) return 0;  // too many positional arguments
        PyObject* t = PyTuple_New(nargs - argcount);
        if (t == nullptr) return -1;
        for (Py_ssize_t i = argcount; i < nargs; ++i) {
            Py_INCREF(args[i]);
            PyTuple_SET_ITEM(t, i - argcount, args[i]);
        }
        varargs_ = Ref::steal(t);
    } else if (sig.varargs_ >= 0) {
        varargs_ = Ref::steal(PyTuple_New(0));
        if (!varargs_) return -1;
    }
    if (sig.varkw_ >= 0) {
        varkw_ = Ref::steal(PyDict_New());
        if (!varkw_) return -1;
    }
    const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    const Py_ssize_t kw_end = argcount + sig.kwonly_;
    for (Py_ssize_t j = 0; j < nkw; ++j) {
        PyObject* key = PyTuple_GET_ITEM(kwnames, j);
        PyObject* value = args[nargs + j];
        // A str subclass may define __eq__, which the interpreter calls to match parameter
        // names: leave such calls to the interpreter.
        if (!PyUnicode_CheckExact(key)) return 0;
        // Among the parameters that may be passed by keyword: a keyword named like a
        // positional-only parameter goes to **kwargs (or is an error), as in CPython.
        const Py_ssize_t i = index_of_name(sig.names(), sig.posonly_, kw_end, key);
        if (i >= 0) {
            if (slots_[i] != nullptr) return 0;  // given twice
            slots_[i] = value;
            continue;
        }
        if (!varkw_) return 0;  // unexpected keyword
        const int has = PyDict_Contains(varkw_.get(), key);
        if (has != 0) return has < 0 ? -1 : 0;
        if (PyDict_SetItem(varkw_.get(), key, value) < 0) return -1;
    }
    // Positional defaults: the tuple is immutable and we hold it, so its items outlive the call
    // even if a guard reassigns fn.__defaults__.
    PyObject* defaults = PyFunction_GET_DEFAULTS(fn);
    const Py_ssize_t nd = defaults ? PyTuple_GET_SIZE(defaults) : 0;
    for (Py_ssize_t i = npos; i < argcount; ++i) {
        if (slots_[i] != nullptr) continue;
        const Py_ssize_t d = i - (argcount - nd);
        if (d < 0) return 0;  // a required argument is missing
        if (!defaults_) defaults_ = Ref::borrow(defaults);
        slots_[i] = PyTuple_GET_ITEM(defaults, d);
    }
    // Keyword-only defaults live in a mutable dict: hold a reference to each value used so that
    // a guard mutating fn.__kwdefaults__ cannot free a value we hand out.
    for (Py_ssize_t i = argcount; i < kw_end; ++i) {
        if (slots_[i] != nullptr) continue;
        PyObject* kwd = PyFunction_GET_KW_DEFAULTS(fn);
        if (kwd == nullptr || !PyDict_Check(kwd)) return 0;
        PyObject* v = PyDict_GetItemWithError(kwd, PyTuple_GET_ITEM(sig.names(), i));
        if (v == nullptr) return PyErr_Occurred() ? -1 : 0;
        hold(v);
        slots_[i] = v;
    }
    if (sig.varargs_ >= 0) slots_[sig.varargs_] = varargs_.get();
    if (sig.varkw_ >= 0) slots_[sig.varkw_] = varkw_.get();
    return 1;
}

BoundCall::~BoundCall() {
    for (Py_ssize_t i = 0; i < n_held_; ++i) Py_DECREF(held_[i]);
}

void BoundCall::hold(PyObject* v) {
    if (n_held_ < kInline) {
        Py_INCREF(v);
        held_[n_held_++] = v;
    } else {
        held_more_.push_back(Ref::borrow(v));
    }
}

Locals BoundCall::locals() const {
    Locals f;
    f.values = values_;
    f.names = sig_->names();
    f.count = sig_->size();
    return f;
}

}  // namespace tripwire::runtime
