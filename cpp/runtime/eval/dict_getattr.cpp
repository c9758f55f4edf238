// tripwire/cpp/runtime/eval/dict_getattr.cpp -- class `__getattr__` hooks whose miss is known
// (dict_getattr.hpp says what and why).
#include "runtime/eval/dict_getattr.hpp"

#include <cstdint>

#include "runtime/eval/dict_hint.hpp"

namespace tripwire::runtime {
namespace {

// One registered hook. Everything is strong; the table lives for the process (a registration is
// made once, at tripwire.torch's import).
struct Registration {
    PyObject* fn = nullptr;         // the function
    PyObject* code = nullptr;       // its code when registered: `__code__` is assignable
    vectorcallfunc call = nullptr;  // its vectorcall when registered: an extension may replace it
    PyObject* dicts = nullptr;      // tuple of interned str
    // The states of its globals and builtins last proved to resolve `AttributeError` and `type`
    // to the builtins (dict tags are never reused; 0 is none).
    std::uint64_t globals_tag = 0;
    std::uint64_t builtins_tag = 0;
};
constexpr int kRegistrations = 4;
Registration g_registrations[kRegistrations];
int g_registered = 0;

// Whether the body's miss path raises the builtin AttributeError built from `type(self)`: neither
// name is shadowed by a global, and the builtins hold the interpreter's own. str-keyed exact
// dicts only, so the lookups run no user code and set no error. Proved once per state of the
// two dicts (their tags); re-proved, without allocating, when either changed.
bool names_resolve(Registration& r) {
    static PyObject* const s_error = interned("AttributeError");
    static PyObject* const s_type = interned("type");
    auto* fn = reinterpret_cast<PyFunctionObject*>(r.fn);
    PyObject* globals = fn->func_globals;
    PyObject* builtins = fn->func_builtins;
    if (s_error == nullptr || s_type == nullptr || globals == nullptr || builtins == nullptr ||
        !PyDict_CheckExact(globals) || !PyDict_CheckExact(builtins))
        return false;
    if (tag_holds(globals, r.globals_tag) && tag_holds(builtins, r.builtins_tag)) return true;
    const std::uint64_t gt = dict_tag(globals);
    const std::uint64_t bt = dict_tag(builtins);
    if (!dict_has_only_str_keys(globals) || !dict_has_only_str_keys(builtins)) return false;
    const bool ok = PyDict_GetItemWithError(globals, s_error) == nullptr &&
                    PyDict_GetItemWithError(globals, s_type) == nullptr &&
                    PyDict_GetItemWithError(builtins, s_error) == PyExc_AttributeError &&
                    PyDict_GetItemWithError(builtins, s_type) == reinterpret_cast<PyObject*>(&PyType_Type);
    if (PyErr_Occurred()) {  // cannot happen with str keys; never leave one set
        PyErr_Clear();
        return false;
    }
    // The tags were read before the lookups, and nothing between can change either dict.
    r.globals_tag = ok ? gt : 0;
    r.builtins_tag = ok ? bt : 0;
    return ok;
}

}  // namespace

bool register_dict_getattr(PyObject* fn, PyObject* dicts) {
    if (!PyFunction_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "register_dict_getattr: fn must be a Python function");
        return false;
    }
    if (!PyTuple_CheckExact(dicts)) {
        PyErr_SetString(PyExc_TypeError, "register_dict_getattr: dicts must be a tuple of str");
        return false;
    }
    PyObject* names = PyTuple_New(PyTuple_GET_SIZE(dicts));
    if (names == nullptr) return false;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(dicts); ++i) {
        PyObject* d = PyTuple_GET_ITEM(dicts, i);
        if (!PyUnicode_CheckExact(d)) {
            Py_DECREF(names);
            PyErr_SetString(PyExc_TypeError, "register_dict_getattr: dicts must be a tuple of str");
            return false;
        }
        Py_INCREF(d);
        PyUnicode_InternInPlace(&d);
        PyTuple_SET_ITEM(names, i, d);
    }
    Registration* slot = nullptr;
    for (int i = 0; i < g_registered; ++i)
        if (g_registrations[i].fn == fn) slot = &g_registrations[i];
    if (slot == nullptr) {
        if (g_registered == kRegistrations) {
            Py_DECREF(names);
            PyErr_SetString(PyExc_RuntimeError, "register_dict_getattr: too many registrations");
            return false;
        }
        slot = &g_registrations[g_registered];
    }
    Registration r;
    r.fn = Py_NewRef(fn);
    r.code = Py_NewRef(PyFunction_GET_CODE(fn));
    r.call = reinterpret_cast<PyFunctionObject*>(fn)->vectorcall;
    r.dicts = names;
    Registration old = *slot;
    *slot = r;
    if (old.fn == nullptr) ++g_registered;
    // Released once the table is consistent: a deallocation may run user code.
    Py_XDECREF(old.fn);
    Py_XDECREF(old.code);
    Py_XDECREF(old.dicts);
    return true;
}

int dict_getattr_index(PyObject* hook) {
    for (int i = 0; i < g_registered; ++i)
        if (g_registrations[i].fn == hook) return i;
    return -1;
}

bool dict_getattr_misses(int index, PyObject* obj, PyObject* name) {
    if (index < 0 || index >= g_registered || !PyUnicode_CheckExact(name)) return false;
    Registration& r = g_registrations[index];
    if (!function_runs_unchanged(r.fn, r.code, r.call) || !names_resolve(r)) return false;
    // `if d in self.__dict__: if name in self.__dict__[d]: return ...`, for each d in order: the
    // instance dict is the object's own storage (the caller proved `__dict__` is), and a dict it
    // holds is searched only when it is an exact dict of str keys (`in` then runs no user code).
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(r.dicts); ++i) {
        PyObject* held = nullptr;
        const int absent = instance_attr_absent(obj, PyTuple_GET_ITEM(r.dicts, i), nullptr, &held);
        if (absent == 1) continue;
        if (absent < 0 || held == nullptr || !PyDict_CheckExact(held) || !dict_has_only_str_keys(held))
            return false;
        PyObject* v = PyDict_GetItemWithError(held, name);
        if (v != nullptr || PyErr_Occurred()) {
            PyErr_Clear();
            return false;  // present: the body returns it (the caller's generic path reads it)
        }
    }
    return true;
}

}  // namespace tripwire::runtime
