// tripwire/cpp/runtime/eval/fetch.cpp -- step fetches and the attribute inline cache.
#include "runtime/eval/fetch.hpp"

#include <cstring>
#include <string>
#include <utility>

#include <structmember.h>  // T_OBJECT, T_OBJECT_EX, PY_AUDIT_READ

#include "runtime/eval/dict_getattr.hpp"
#include "runtime/eval/dict_hint.hpp"
#include "runtime/eval/tensor_props.hpp"

namespace tripwire::runtime {

// CPython's slot_tp_getattr_hook, the tp_getattro of a class that defines __getattr__; null until
// init_getattr_hook ran (every GuardSet runs it when built, before any fetch).
getattrofunc g_getattr_hook = nullptr;
// CPython's subtype_dict, the getter of the `__dict__` descriptor a class statement gives its
// instances (read from a probe class by init_getattr_hook); null until then.
getter g_subtype_dict_get = nullptr;

namespace {

Fetched ok_borrowed(PyObject* v) { return {v, false, FetchStatus::Ok}; }
Fetched ok_owned(PyObject* v) {
    return v ? Fetched{v, true, FetchStatus::Ok} : Fetched{nullptr, false, FetchStatus::Error};
}
Fetched missing() { return {nullptr, false, FetchStatus::Missing}; }
Fetched error() { return {nullptr, false, FetchStatus::Error}; }

// The result of a generic subscript (user __getitem__, a sequence of defaults): a LookupError
// (KeyError, IndexError) means "no such key or index", a missing source exactly as for a dict or
// a list, not an error (which strict mode would re-raise).
Fetched subscript_result(PyObject* r) {
    if (r != nullptr) return ok_owned(r);
    if (!PyErr_ExceptionMatches(PyExc_LookupError)) return error();
    PyErr_Clear();
    return missing();
}

// Lookup in a real dict; missing keys are not errors. A user key's __eq__ may run and raise.
Fetched dict_lookup(PyObject* dict, PyObject* key) {
    PyObject* v = PyDict_GetItemWithError(dict, key);
    if (v) return ok_borrowed(v);
    return PyErr_Occurred() ? error() : missing();
}

// getattr that maps AttributeError to Missing (so failing checks do not keep exception objects).
Fetched generic_getattr(PyObject* obj, PyObject* name) {
    PyObject* v = nullptr;
#if PY_VERSION_HEX >= 0x030D0000
    const int r = PyObject_GetOptionalAttr(obj, name, &v);
#else
    const int r = _PyObject_LookupAttr(obj, name, &v);
#endif
    if (r > 0) return ok_owned(v);
    return r == 0 ? missing() : error();
}

// A class's own namespace (borrowed: the class keeps it alive).
PyObject* class_dict(PyTypeObject* t) {
#if PY_VERSION_HEX >= 0x030C0000
    PyObject* d = PyType_GetDict(t);  // static builtin types keep theirs in the interpreter
    Py_XDECREF(d);
    return d;
#else
    return t->tp_dict;
#endif
}

// The class attribute `name` as tp's MRO defines it (borrowed; null when absent; `holder` the
// class whose dict holds it), read from the class dicts themselves, not from CPython's type cache, which user
// code run during an earlier lookup can leave stale under a new version tag. False when that cannot be done
// without user code: a class dict that may hold a non-str key, whose __eq__ a lookup could call (or hints
// off, when that cannot be known).
bool mro_holder(PyTypeObject* tp, PyObject* name, PyObject** out, PyTypeObject** holder) {
    *out = nullptr;
    *holder = nullptr;
    PyObject* mro = tp->tp_mro;
    if (mro == nullptr || !PyTuple_Check(mro)) return false;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(mro); ++i) {
        PyObject* base = PyTuple_GET_ITEM(mro, i);
        if (!PyType_Check(base)) return false;
        PyObject* dict = class_dict(reinterpret_cast<PyTypeObject*>(base));
        if (dict == nullptr || !PyDict_Check(dict) || !dict_has_only_str_keys(dict)) return false;
        PyObject* v = PyDict_GetItemWithError(dict, name);  // str against str keys: no user code
        if (v != nullptr) {
            *out = v;
            *holder = reinterpret_cast<PyTypeObject*>(base);
            return true;
        }
        if (PyErr_Occurred()) {
            PyErr_Clear();
            return false;
        }
    }
    return true;
}

// mro_lookup without the class that holds the value.
bool mro_lookup(PyTypeObject* tp, PyObject* name, PyObject** out) {
    PyTypeObject* holder = nullptr;
    return mro_holder(tp, name, out, &holder);
}

getattrofunc getattr_hook_slot() { return g_getattr_hook; }

// The class attribute `name` of tp, where the class dicts (mro_lookup: no user code) and
// CPython's type cache (_PyType_Lookup, what the interpreter's own lookup uses) agree.
bool class_attr(PyTypeObject* tp, PyObject* name, PyObject** out) {
    return mro_lookup(tp, name, out) && _PyType_Lookup(tp, name) == *out;
}

bool module_subclass_reads_dict(PyTypeObject* tp, PyObject* name);

// ---- Forwarding hooks: a class __getattr__ whose body is `return getattr(self.<attr>, name)`.
//
// torch._VF's (torch/_VF.py, VFModule) is one, read by torch's guards on every check of a model
// that calls an RNN (`_VF.lstm`, `_VF.gru`, ...). Calling it costs a Python frame, the method's
// `self.vf` through the class's getattr hook (a method-wrapper per call) and builtins.getattr:
// about 2,000 instructions on 3.11, and the fast pass must hand the node to the walk because the
// call is user code. What the body does is fixed by its bytecode, so when the function's code is
// recognised, its `getattr` is the builtin one and each read it makes is found without user
// code, the value is read directly, without the call, and the fast pass can take it.
//
// The recognition is generic (any module subclass with that body), not keyed by torch: the
// runtime imports no torch, and the same facts decide a user's module of the same shape. It
// compares with a template the running interpreter compiled (init_forward_template), so it holds
// on every Python version: what runs is exactly what the bytecode says.
//
// What is read per check, or under a tag that changes with it (a class's version tag, a dict's
// tag): the class's `__getattr__` (replaceable: the version tag), the function's `__code__`
// (assignable without a tag: its pointer each check), its `__globals__` and `__builtins__` not
// shadowing `getattr` (a module global `getattr` changes what the body calls: their dict tags),
// the module dict's lack of the name, of a PEP 562 `__getattr__` and of a `__spec__` other than
// None (its tag), no class attribute `<attr>` (so `self.<attr>` is the module dict's, as CPython
// looks it up: data descriptors first), and for `getattr(forwarded, name)` the forwarded object's
// class (version tag) and own storage. Tracing or profiling sees the call's frame, so neither may
// be on. Anything else: null, and the caller calls the method.
PyObject* g_forward_template =
    nullptr;                            // code of `def __getattr__(self, name): return getattr(self.x, name)`
PyObject* g_builtin_getattr = nullptr;  // builtins.getattr
PyObject* g_recognised_code = nullptr;  // the last code object judged (strong), and its <attr>, or null
PyObject* g_recognised_attr = nullptr;
vectorcallfunc g_function_vectorcall = nullptr;  // a Python function's own (the template's)
bool g_staticmethod_mirror = false;              // StaticMethod below verified on this interpreter

// staticmethod's object (Objects/funcobject.c), private; verified against PyStaticMethod_New.
struct StaticMethod {
    PyObject_HEAD PyObject* sm_callable;
};

// The facts of one forwarded read, per name (interned, as every step operand is). Everything
// borrowed is held by a dict whose tag or a class whose version tag is part of the entry.
struct Forward {
    PyObject* name = nullptr;      // strong
    PyTypeObject* type = nullptr;  // the module subclass, under `version`
    unsigned int version = 0;
    PyObject* hook = nullptr;             // its __getattr__, an exact function (the class dict holds it)
    PyObject* code = nullptr;             // the recognised code (strong), `attr` its forwarded attribute
    PyObject* attr = nullptr;             // strong
    Py_ssize_t attr_hint = kHintUnknown;  // where the module dict holds it (dict_hint.hpp)
    std::uint64_t module_tag = 0;         // module dict state: only str keys, no `name`, `__getattr__`,
                                          // `__spec__` None or absent
    std::uint64_t globals_tag = 0;        // the hook's globals: only str keys, no `getattr`
    std::uint64_t builtins_tag = 0;       // its builtins: only str keys, `getattr` is builtins.getattr
    PyTypeObject* inner = nullptr;        // type of the forwarded object, under inner_version
    unsigned int inner_version = 0;
    PyObject* descr = nullptr;  // what its MRO holds for `name` (null: nothing)
};
constexpr int kForwards = 4;
Forward g_forwards[kForwards];
int g_forward_next = 0;

// getattr(forwarded, name) when the entry's inner facts decide it without user code; null
// otherwise. A value held by the class (its dict holds the descriptor) or the instance dict.
PyObject* inner_value(const Forward& f, PyObject* forwarded) {
    PyTypeObject* t = Py_TYPE(forwarded);
    if (t != f.inner || f.inner_version == 0 || type_version(t) != f.inner_version ||
        t->tp_getattro != PyObject_GenericGetAttr)
        return nullptr;
    PyObject* d = f.descr;
    // A data descriptor wins over the instance dict (and may run user code): not decided here.
    if (d != nullptr && Py_TYPE(d)->tp_descr_set != nullptr) return nullptr;
    PyObject* own = nullptr;
    const int absent = instance_attr_absent(forwarded, f.name, nullptr, &own);
    if (absent == 0) return own;
    if (absent < 0 || d == nullptr) return nullptr;  // undecidable, or AttributeError: the call's
    // A static method gives its callable (as its __get__ does); a class attribute whose type has
    // no __get__ is itself (the slot is read live: a class that gains __get__ loses this). Anything
    // else binds (a new object) or runs user code.
    if (Py_TYPE(d) == &PyStaticMethod_Type)
        return g_staticmethod_mirror ? reinterpret_cast<StaticMethod*>(d)->sm_callable : nullptr;
    return Py_TYPE(d)->tp_descr_get == nullptr ? d : nullptr;
}

}  // namespace

// forwarded_module_attr (fetch.hpp).
PyObject* forwarded_value(PyObject* obj, PyObject* name) {
    PyTypeObject* tp = Py_TYPE(obj);
    if (tp->tp_getattro != getattr_hook_slot()) return nullptr;
    for (Forward& f : g_forwards) {
        if (f.name != name || f.type != tp || f.version == 0 || type_version(tp) != f.version) continue;
        // The hook's own facts that the entry does not hold (py.hpp).
        if (!function_runs_unchanged(f.hook, f.code, g_function_vectorcall)) return nullptr;
        PyObject* md = PyModule_GetDict(obj);
        PyObject* globals = PyFunction_GET_GLOBALS(f.hook);
        PyObject* builtins = reinterpret_cast<PyFunctionObject*>(f.hook)->func_builtins;
        if (md == nullptr || !tag_holds(md, f.module_tag) || !tag_holds(globals, f.globals_tag) ||
            builtins == nullptr || !tag_holds(builtins, f.builtins_tag))
            return nullptr;
        // `self.<attr>`: the module dict's entry (no class attribute of that name: the version).
        PyObject* forwarded = dict_get_hinted(md, f.attr, &f.attr_hint);
        if (forwarded == nullptr) forwarded = PyDict_GetItemWithError(md, f.attr);  // str keys only
        if (forwarded == nullptr) {
            PyErr_Clear();  // none can be set; a miss recurses into __getattr__: the call's
            return nullptr;
        }
        return inner_value(f, forwarded);
    }
    return nullptr;
}

namespace {

// Whether `code` is the template's: the same bytecode and exception table over two arguments
// and no other local, names ('getattr', <attr>). Sets *attr (borrowed from the code). May
// allocate (the deoptimised bytecode): called where user code may run.
bool recognise_forward(PyObject* code, PyObject** attr) {
    *attr = nullptr;
    if (g_forward_template == nullptr || !PyCode_Check(code)) return false;
    auto* c = reinterpret_cast<PyCodeObject*>(code);
    auto* t = reinterpret_cast<PyCodeObject*>(g_forward_template);
    // Neither a class defined in a function (CO_NESTED) nor `from __future__` imports in the
    // defining module (PyCF_MASK: annotations, ...) change what this body's bytecode does.
    constexpr int kNested = CO_NESTED | PyCF_MASK;
    if (c->co_argcount != t->co_argcount || c->co_posonlyargcount != t->co_posonlyargcount ||
        c->co_kwonlyargcount != t->co_kwonlyargcount || c->co_nlocalsplus != t->co_nlocalsplus ||
        c->co_nlocals != t->co_nlocals || c->co_ncellvars != 0 || c->co_nfreevars != 0 ||
        (c->co_flags & ~kNested) != (t->co_flags & ~kNested))
        return false;
    PyObject* names = c->co_names;
    PyObject* tnames = t->co_names;
    if (!PyTuple_CheckExact(names) || PyTuple_GET_SIZE(names) != 2 || PyTuple_GET_SIZE(tnames) != 2)
        return false;
    PyObject* g = PyTuple_GET_ITEM(names, 0);
    PyObject* a = PyTuple_GET_ITEM(names, 1);
    if (!PyUnicode_CheckExact(g) || !PyUnicode_CheckExact(a) ||
        PyUnicode_Compare(g, PyTuple_GET_ITEM(tnames, 0)) != 0)
        return false;
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return false;
    }
    PyObject* cb = PyCode_GetCode(c);
    PyObject* tb = PyCode_GetCode(t);
    bool same = cb != nullptr && tb != nullptr && PyBytes_CheckExact(cb) && PyBytes_CheckExact(tb) &&
                PyBytes_GET_SIZE(cb) == PyBytes_GET_SIZE(tb) &&
                std::memcmp(PyBytes_AS_STRING(cb), PyBytes_AS_STRING(tb), PyBytes_GET_SIZE(cb)) == 0;
    Py_XDECREF(cb);
    Py_XDECREF(tb);
    if (PyErr_Occurred()) PyErr_Clear();
    PyObject* ce = c->co_exceptiontable;
    PyObject* te = t->co_exceptiontable;
    same = same && PyBytes_CheckExact(ce) && PyBytes_CheckExact(te) &&
           PyBytes_GET_SIZE(ce) == PyBytes_GET_SIZE(te) &&
           std::memcmp(PyBytes_AS_STRING(ce), PyBytes_AS_STRING(te), PyBytes_GET_SIZE(ce)) == 0;
    if (same) *attr = a;
    return same;
}

// The forwarded attribute of `code` if it is the template's shape (decided once per code
// object: the last one judged is kept), else null. Borrowed (g_recognised_code holds it).
PyObject* recognised_attr(PyObject* code) {
    if (code != g_recognised_code) {
        PyObject* attr = nullptr;
        recognise_forward(code, &attr);
        Py_XINCREF(attr);
        Py_INCREF(code);
        Py_XSETREF(g_recognised_attr, attr);
        Py_XSETREF(g_recognised_code, code);  // after: the old one may hold the old attr
    }
    return g_recognised_attr;
}

// Whether, in module dict `md` as it is now, CPython's getattr hook reaches the class's
// __getattr__ without user code for `name`: only str keys (no key's __eq__ runs), no `name`, no
// PEP 562 `__getattr__`, `__spec__` None or absent (ModuleType's "partially initialized" probe
// then reads None's attribute). Reads only (str keys against str keys: no error is possible).
bool module_dict_defers(PyObject* md, PyObject* name) {
    static PyObject* const s_getattr = interned("__getattr__");
    static PyObject* const s_spec = interned("__spec__");
    if (s_getattr == nullptr || s_spec == nullptr || md == nullptr || !PyDict_CheckExact(md) ||
        !dict_has_only_str_keys(md))
        return false;
    PyObject* spec = nullptr;
    const bool defers = PyDict_GetItemWithError(md, name) == nullptr &&
                        PyDict_GetItemWithError(md, s_getattr) == nullptr &&
                        ((spec = PyDict_GetItemWithError(md, s_spec)) == nullptr || spec == Py_None);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return false;
    }
    return defers;
}

// Learn (or relearn) the entry for getattr(obj, name), obj an instance of a module subclass
// whose class __getattr__ is `hook` (held by the caller). First what may allocate or run user
// code (recognising the code, giving the forwarded object's class a version tag), then every
// fact read again with nothing in between that could change one, and only then the tags of the
// states they were proved in.
void learn_forward(PyObject* obj, PyObject* name, PyObject* hook) {
    static PyObject* const s_getattr = interned("getattr");
    static PyObject* const s_dunder_getattr = interned("__getattr__");
    if (s_getattr == nullptr || s_dunder_getattr == nullptr || g_builtin_getattr == nullptr ||
        !PyFunction_Check(hook) || !PyUnicode_CheckExact(name))
        return;
    PyObject* code = PyFunction_GET_CODE(hook);
    if (recognised_attr(code) == nullptr) return;
    PyObject* md = PyModule_GetDict(obj);  // a module's dict lives as long as the module
    if (md == nullptr || !PyDict_CheckExact(md) || !dict_has_only_str_keys(md)) return;
    if (PyObject* forwarded = PyDict_GetItemWithError(md, g_recognised_attr)) {
        Py_INCREF(forwarded);
        (void)_PyType_Lookup(Py_TYPE(forwarded), name);  // a version tag, if the class can have one
        Py_DECREF(forwarded);
    }
    PyErr_Clear();
    // From here on nothing allocates or runs user code.
    PyTypeObject* tp = Py_TYPE(obj);
    code = PyFunction_GET_CODE(hook);
    PyObject* attr = code == g_recognised_code ? g_recognised_attr : nullptr;
    PyObject* globals = PyFunction_GET_GLOBALS(hook);
    PyObject* builtins = reinterpret_cast<PyFunctionObject*>(hook)->func_builtins;
    const unsigned int version = type_version(tp);
    if (attr == nullptr || version == 0 || builtins == nullptr || !PyDict_CheckExact(globals) ||
        !PyDict_CheckExact(builtins) || !dict_has_only_str_keys(globals) || !dict_has_only_str_keys(builtins))
        return;
    // `self.<attr>`: ModuleType's __getattribute__ and no class attribute of that name, so the
    // module dict's entry (module_subclass_reads_dict, under the version tag); the hook is what
    // the class dicts hold.
    PyObject* own_hook = nullptr;
    if (!module_subclass_reads_dict(tp, attr) || !mro_lookup(tp, s_dunder_getattr, &own_hook) ||
        own_hook != hook || !module_dict_defers(md, name))
        return;
    // str keys against str keys: no user code, no error.
    PyObject* forwarded = PyDict_GetItemWithError(md, attr);
    if (forwarded == nullptr || PyDict_GetItemWithError(globals, s_getattr) != nullptr ||
        PyDict_GetItemWithError(builtins, s_getattr) != g_builtin_getattr || PyErr_Occurred()) {
        PyErr_Clear();
        return;
    }
    PyTypeObject* inner = Py_TYPE(forwarded);
    // What the forwarded object's class holds for `name`, where its dicts and CPython's type cache
    // (what getattr reads) agree (class_attr).
    PyObject* descr = nullptr;
    const unsigned int inner_version = type_version(inner);
    if (inner_version == 0 || inner->tp_getattro != PyObject_GenericGetAttr ||
        !class_attr(inner, name, &descr) || type_version(tp) != version)
        return;
    Forward* slot = nullptr;
    for (Forward& f : g_forwards)
        if (f.name == name) slot = &f;
    if (slot == nullptr) {
        slot = &g_forwards[g_forward_next];
        g_forward_next = (g_forward_next + 1) % kForwards;
    }
    Forward f;
    f.name = Py_NewRef(name);
    f.type = tp;
    f.version = version;
    f.hook = hook;
    f.code = Py_NewRef(code);
    f.attr = Py_NewRef(attr);
    f.module_tag = dict_tag(md);
    f.globals_tag = dict_tag(globals);
    f.builtins_tag = dict_tag(builtins);
    f.inner = inner;
    f.inner_version = inner_version;
    f.descr = descr;
    std::swap(*slot, f);
    // The old entry's references, released once the table is consistent: a deallocation may run
    // user code (a code object's or a name's do not, but a table read mid-swap would be wrong).
    Py_XDECREF(f.name);
    Py_XDECREF(f.code);
    Py_XDECREF(f.attr);
}

// getattr(module, name) for an instance of a module subclass that defines __getattr__ (torch._VF
// is one, and torch's guards read `_VF.lstm` & co. on every check), when the name is not in the
// module dict. The caller's attribute cache holds, under the class's version tag, what
// module_subclass_reads_dict decided: ModuleType's __getattribute__ runs first and no class
// defines the name. When in addition the module has no PEP 562 __getattr__, its dict only str
// keys, and its __spec__ is None or absent, CPython's hook calls ModuleType.__getattribute__,
// which on 3.11 formats three AttributeErrors (its generic lookup's, the spec's `_initializing`,
// and "has no attribute") before the class's __getattr__ runs: about 12,000 instructions, against
// one call. Nothing in those steps can run user code (str-keyed dicts, no descriptor, None's own
// getattr), so their only effect is the AttributeError the hook clears: the value is the class's
// __getattr__(obj, name), bound as CPython's call_attribute binds it. False: not that case,
// CPython's own lookup decides.
bool module_hook_getattr(PyObject* obj, PyObject* name, Fetched* out) {
    PyTypeObject* tp = Py_TYPE(obj);
    if (tp == &PyModule_Type || !PyModule_Check(obj) || !PyUnicode_CheckExact(name) ||
        tp->tp_getattro != getattr_hook_slot())
        return false;
    static PyObject* const s_getattr = interned("__getattr__");
    if (s_getattr == nullptr) return false;
    PyObject* hook = _PyType_Lookup(tp, s_getattr);  // the hook's own lookup
    if (hook == nullptr) return false;
    PyObject* md = PyModule_GetDict(obj);
    PyObject** dict_ptr = _PyObject_GetDictPtr(obj);
    if (md == nullptr || dict_ptr == nullptr || *dict_ptr != md || !module_dict_defers(md, name))
        return false;
    // A forwarding hook (above): its value without the call, once its facts are learnt.
    if (PyObject* v = forwarded_value(obj, name)) {
        *out = ok_owned(Py_NewRef(v));
        return true;
    }
    Py_INCREF(hook);  // learning may collect garbage, and user code delete the class's hook
    learn_forward(obj, name, hook);
    PyObject* v = forwarded_value(obj, name);
    if (v != nullptr || PyErr_Occurred()) {
        Py_DECREF(hook);
        *out = v != nullptr ? ok_owned(Py_NewRef(v)) : error();
        return true;
    }
    // The class may have changed while learning: the hook called is the one CPython finds now.
    if (_PyType_Lookup(tp, s_getattr) != hook || !module_dict_defers(md, name)) {
        Py_DECREF(hook);
        return false;
    }
    // call_attribute: the class's __getattr__ bound to obj, called with the name. Held across
    // the call: the user code may delete it from the class. A plain function (torch._VF's) binds
    // to a method that calls it with (obj, name): called so directly, without the method object
    // (an allocation and a second call per check; the callee sees the same arguments).
    if (PyFunction_Check(hook)) {
        PyObject* args[2] = {obj, name};
        v = PyObject_Vectorcall(hook, args, 2, nullptr);
    } else {
        PyObject* bound = nullptr;
        if (descrgetfunc get = Py_TYPE(hook)->tp_descr_get) {
            bound = get(hook, obj, reinterpret_cast<PyObject*>(tp));
            if (bound == nullptr) {
                Py_DECREF(hook);
                *out = error();
                return true;
            }
        }
        v = PyObject_CallOneArg(bound != nullptr ? bound : hook, name);
        Py_XDECREF(bound);
    }
    Py_DECREF(hook);
    if (v != nullptr) {
        *out = ok_owned(v);
    } else if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        *out = missing();
    } else {
        *out = error();
    }
    return true;
}

// Whether getattr(instance of the module subclass tp, name) finds a module-dict entry first, as
// on a plain module: ModuleType's own __getattribute__ runs first (directly, or through the hook
// of a class that defines __getattr__, which is consulted only when that one misses), and no
// class in the MRO defines the name. Decided under tp's version tag; a name the dict does not
// hold is the generic path's (module_hook_getattr).
bool module_subclass_reads_dict(PyTypeObject* tp, PyObject* name) {
    if (!PyType_IsSubtype(tp, &PyModule_Type) ||
        (tp->tp_getattro != PyModule_Type.tp_getattro && tp->tp_getattro != getattr_hook_slot()))
        return false;
    static PyObject* const s_getattribute = interned("__getattribute__");
    PyObject* getattribute = nullptr;
    PyObject* module_getattribute = nullptr;
    PyObject* own = nullptr;
    if (s_getattribute == nullptr) return false;
    return class_attr(tp, s_getattribute, &getattribute) &&
           class_attr(&PyModule_Type, s_getattribute, &module_getattribute) && getattribute != nullptr &&
           getattribute == module_getattribute && class_attr(tp, name, &own) && own == nullptr;
}

// The fields of a function object that getattr reads through the interpreter's own data
// descriptors on the (immutable) function type, so that an instance attribute of the same name
// can never shadow them.
enum class FunctionFieldKind : std::uint8_t { None, Code, Defaults, KwDefaults, Closure, Globals };

FunctionFieldKind function_field_of(PyObject* name) {
    static PyObject* const names[] = {interned("__code__"), interned("__defaults__"),
                                      interned("__kwdefaults__"), interned("__closure__"),
                                      interned("__globals__")};
    static const FunctionFieldKind kinds[] = {FunctionFieldKind::Code, FunctionFieldKind::Defaults,
                                              FunctionFieldKind::KwDefaults, FunctionFieldKind::Closure,
                                              FunctionFieldKind::Globals};
    for (std::size_t i = 0; i < 5; ++i) {
        if (name == names[i]) return kinds[i];
    }
    if (!PyUnicode_CheckExact(name)) return FunctionFieldKind::None;
    for (std::size_t i = 0; i < 5; ++i) {
        if (names[i] != nullptr && PyUnicode_Compare(name, names[i]) == 0) return kinds[i];
    }
    return FunctionFieldKind::None;
}

// Whether getattr on instances of tp finds instance-dict entries exactly as
// object.__getattribute__ does. True for PyObject_GenericGetAttr, and for heap types whose only
// override is __getattr__ (nn.Module-style): CPython then installs a hook that calls
// object.__getattribute__ first and __getattr__ only when that raises AttributeError, which never
// happens for an attribute found in the instance dict. Decided under the type's version tag.
bool uses_generic_getattribute(PyTypeObject* tp) {
    if (tp->tp_getattro == PyObject_GenericGetAttr) return true;
    if (!PyType_HasFeature(tp, Py_TPFLAGS_HEAPTYPE)) return false;
    static PyObject* name = PyUnicode_InternFromString("__getattribute__");
    PyObject* base = nullptr;
    PyObject* own = nullptr;
    return mro_lookup(&PyBaseObject_Type, name, &base) && base != nullptr && mro_lookup(tp, name, &own) &&
           own == base;
}

// The offset of the object slot that member descriptor `descr` serves to instances of tp, or -1.
// Generic getattr finds a member descriptor (a data descriptor: it wins over the instance dict)
// and member_get returns the slot: for T_OBJECT null reads as None, for T_OBJECT_EX it raises
// AttributeError (and a __getattr__ may then run), both left to the generic path. Only object
// slots (no boxing), no audit hook on the read (PY_AUDIT_READ runs hooks: user code), no relative
// offset (3.12+: member_get refuses it), and a descriptor of a base of tp (member_get raises
// TypeError otherwise). A functools.partial's `func`, `args`, `keywords`, a class's `__slots__`.
Py_ssize_t object_member_offset(PyTypeObject* tp, PyObject* descr) {
    if (descr == nullptr || !Py_IS_TYPE(descr, &PyMemberDescr_Type)) return -1;
    const PyMemberDef* m = reinterpret_cast<PyMemberDescrObject*>(descr)->d_member;
    if (m == nullptr || (m->type != T_OBJECT && m->type != T_OBJECT_EX) || (m->flags & PY_AUDIT_READ) != 0)
        return -1;
#ifdef Py_RELATIVE_OFFSET
    if ((m->flags & Py_RELATIVE_OFFSET) != 0) return -1;
#endif
    if (!PyType_IsSubtype(tp, PyDescr_TYPE(descr)) || m->offset <= 0) return -1;
    return m->offset;
}

// Whether `name` (an interned step operand) is the str `interned_name`.
bool same_name(PyObject* name, PyObject* interned_name) {
    return name == interned_name || (interned_name != nullptr && PyUnicode_CheckExact(name) &&
                                     PyUnicode_Compare(name, interned_name) == 0);
}

// Whether `descr`, what tp's MRO holds for `__dict__`, answers getattr with the object's own
// instance dict, the one existing_instance_dict reads (created by the getter when it does not
// exist yet): the interpreter's PyObject_GenericGetDict getter (functions, exceptions,
// functools.partial), a member at the type's dict offset (a module's), or subtype_dict (a class
// statement's), which hands the read to the `__dict__` descriptor of the first static base with
// an instance dict, if any (get_builtin_base_with_dict in Objects/typeobject.c, 3.11-3.13).
// Anything else (a class's `__dict__` property, an extension's getter) is the generic path's.
bool reads_instance_dict(PyTypeObject* tp, PyObject* descr, bool of_base = false) {
    static PyObject* const s_dict = interned("__dict__");
    if (descr == nullptr || tp->tp_dictoffset == 0 ||
        (!Py_IS_TYPE(descr, &PyMemberDescr_Type) && !Py_IS_TYPE(descr, &PyGetSetDescr_Type)) ||
        !PyType_IsSubtype(tp, PyDescr_TYPE(descr)))  // the getters refuse another type's object
        return false;
    if (Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        const PyMemberDef* m = reinterpret_cast<PyMemberDescrObject*>(descr)->d_member;
        return m != nullptr && (m->type == T_OBJECT || m->type == T_OBJECT_EX) &&
               (m->flags & PY_AUDIT_READ) == 0 &&
#ifdef Py_RELATIVE_OFFSET
               (m->flags & Py_RELATIVE_OFFSET) == 0 &&
#endif
               m->offset > 0 && m->offset == tp->tp_dictoffset;
    }
    const getter get = reinterpret_cast<PyGetSetDescrObject*>(descr)->d_getset->get;
    if (get == PyObject_GenericGetDict) return true;
    if (get != g_subtype_dict_get || g_subtype_dict_get == nullptr || of_base) return false;
    for (PyTypeObject* t = tp; t->tp_base != nullptr; t = t->tp_base) {
        if (t->tp_dictoffset != 0 && !PyType_HasFeature(t, Py_TPFLAGS_HEAPTYPE)) {
            // That base's own descriptor decides (a static type: never subtype_dict itself).
            PyObject* base_descr = nullptr;
            return s_dict != nullptr && mro_lookup(t, s_dict, &base_descr) &&
                   reads_instance_dict(tp, base_descr, true);
        }
    }
    return true;  // PyObject_GenericGetDict
}

// How getattr(instance of tp, name) may be read, decided without running user code. Writes
// `c.hint` for Mode::Member (the slot's offset) and `c.owner` for a name that binds an exact
// function of the class (Mode::InstanceDict, method_function).
AttrCache::Mode attr_mode(PyTypeObject* tp, PyObject* name, AttrCache& c) {
    static PyObject* const s_class = interned("__class__");
    static PyObject* const s_dict = interned("__dict__");
    static PyObject* const s_cell_contents = interned("cell_contents");
    if (tp == &PyFunction_Type && function_field_of(name) != FunctionFieldKind::None)
        return AttrCache::Mode::FunctionField;
    // cellobject.c's getset: the contents, or ValueError for an empty cell (the generic path's).
    if (tp == &PyCell_Type && same_name(name, s_cell_contents)) return AttrCache::Mode::CellContents;
    if (tp == &PyModule_Type) {
        // Module attributes live in the module dict, unless ModuleType (or object) defines the
        // name (its data descriptors, `__dict__`, `__class__`, ...: all dunder names), which we
        // leave to the generic path. ModuleType is immutable: decided once. Names such as torch's
        // `_global_forward_hooks` are plain module-dict entries.
        PyObject* descr = nullptr;
        return mro_lookup(&PyModule_Type, name, &descr) && descr == nullptr ? AttrCache::Mode::Module
                                                                            : AttrCache::Mode::Generic;
    }
    if (module_subclass_reads_dict(tp, name)) return AttrCache::Mode::Module;
    PyObject* descr = nullptr;
    PyTypeObject* holder = nullptr;
    // A class (an instance of a metaclass) never reads here: type's getattro is not generic.
    if (!uses_generic_getattribute(tp) || !mro_holder(tp, name, &descr, &holder))
        return AttrCache::Mode::Generic;
    if (const Py_ssize_t slot = object_member_offset(tp, descr); slot > 0) {
        c.hint = slot;
        return AttrCache::Mode::Member;
    }
    // `X.__class__` through object's own getset (object_get_class): X's type. torch reads it for
    // a classmethod called on self. A class defining `__class__` (a property) is found first.
    PyObject* object_class = nullptr;
    if (same_name(name, s_class) && descr != nullptr &&
        mro_lookup(&PyBaseObject_Type, s_class, &object_class) && descr == object_class)
        return AttrCache::Mode::ObjectClass;
    if (tp->tp_dictoffset == 0) return AttrCache::Mode::Generic;
    // `getattr(X, '__dict__')`: a data descriptor (it wins over the instance dict); the instance
    // dict itself when it is one of the interpreter's own getters, as the DICT step reads it.
    if (same_name(name, s_dict) && !PyType_IsSubtype(tp, &PyType_Type) && reads_instance_dict(tp, descr))
        return AttrCache::Mode::OwnDict;
    // A data descriptor (property, slot, __dict__) on the type wins over the instance dict.
    if (descr != nullptr && Py_TYPE(descr)->tp_descr_set != nullptr) return AttrCache::Mode::Generic;
    // Any other class attribute of that name loses to the instance dict only while its own type
    // has no __set__/__delete__, and a mutable class can gain them without changing `tp`'s
    // version tag (the cache would then keep reading the instance dict: a false pass). Only an
    // immutable type (int, str, None, function, ...) is known to stay a non-data descriptor.
    // CPython's LOAD_ATTR specialisation likewise refuses names the type defines.
    if (descr != nullptr && !(Py_TYPE(descr)->tp_flags & Py_TPFLAGS_IMMUTABLETYPE))
        return AttrCache::Mode::Generic;
    // A plain function binds to a method when the instance lacks the name: where, for
    // method_function. What the holder's dict holds is read again on each use.
    if (descr != nullptr && PyFunction_Check(descr) && _PyType_Lookup(tp, name) == descr) c.owner = holder;
    return AttrCache::Mode::InstanceDict;
}

// Whether `X.__dict__` of instances of tp is their own instance dict: the name resolves through
// the MRO to one of the interpreter's own descriptors (the getset of a class's instance dict, or
// a member such as a module's). A class that defines `__dict__` otherwise (a property) shows
// something else under that name, and the step fails rather than pick one of the two.
// Unset when that cannot be decided without user code (mro_lookup refused).
bool own_dict_descriptor(PyObject* descr) {
    return descr != nullptr &&
           (Py_TYPE(descr) == &PyGetSetDescr_Type || Py_TYPE(descr) == &PyMemberDescr_Type);
}

AttrCache::Mode dict_mode(PyTypeObject* tp, PyObject* name) {
    PyObject* descr = nullptr;
    if (!mro_lookup(tp, name, &descr)) return AttrCache::Mode::Unset;
    return own_dict_descriptor(descr) ? AttrCache::Mode::InstanceDict : AttrCache::Mode::Generic;
}

// What every fill starts from: `tp`, the generic path, no tag, no hint, no owner.
void reset_cache(AttrCache& c, PyTypeObject* tp) {
    c = AttrCache{};
    c.type = tp;
    c.mode = AttrCache::Mode::Generic;
}

// Fill cache `c` for (tp, name) with `decide`, under tp's version tag.
template <typename Decide>
void fill_cache(AttrCache& c, PyTypeObject* tp, PyObject* name, Decide decide) {
    reset_cache(c, tp);
    // _PyType_Lookup assigns a version tag when the type can have one. It may run user code (a
    // colliding key in a class dict); what it finds is not used (see mro_lookup).
    (void)_PyType_Lookup(tp, name);
    const unsigned int version = type_version(tp);
    if (version == 0) return;  // unversioned: no cache, always generic
    const AttrCache::Mode mode = decide();
    if (mode == AttrCache::Mode::Unset) return;  // undecided without user code: not cached
    // `decide` runs no user code; a changed tag would mean the class changed meanwhile anyway.
    if (type_version(tp) != version) return;
    c.version = version;
    c.mode = mode;
}

// Whether type_getattro (Objects/typeobject.c, 3.11-3.13) answers with class attribute `v`
// itself: an exact function (func_descr_get without an instance returns it) or an object whose
// type has no __get__ now (the slot CPython reads, kept current by type_setattro on the type and
// its bases, which is why this is asked on every read: the value's class may gain __get__ without
// changing the version tag of the class that holds it). Anything else (a classmethod,
// staticmethod, property, a user descriptor) calls __get__: the generic path's.
bool class_attr_is_itself(PyObject* v) {
    PyTypeObject* t = Py_TYPE(v);
    return t == &PyFunction_Type || t->tp_descr_get == nullptr;
}

// What type_getattro answers for class attribute `v` without user code: `v` itself
// (class_attr_is_itself), an exact staticmethod's callable (sm_descr_get returns it; read through
// the mirror verified at start-up, and an uninitialised one is the generic path's error), or null.
PyObject* class_attr_answer(PyObject* v) {
    if (class_attr_is_itself(v)) return v;
    if (Py_IS_TYPE(v, &PyStaticMethod_Type) && g_staticmethod_mirror)
        return reinterpret_cast<StaticMethod*>(v)->sm_callable;
    return nullptr;
}

// Whether getattr on classes of metatype `mt` finds a class attribute as type_getattro does:
// type's own getattr, or CPython's hook for a metaclass that defines only __getattr__ (3.11's
// EnumType), which calls type.__getattribute__ first and __getattr__ only on its miss. Decided
// under mt's version tag (the caller's); no user code (str-keyed dicts only).
bool metatype_reads_like_type(PyTypeObject* mt) {
    if (mt->tp_getattro == PyType_Type.tp_getattro) return true;
    static PyObject* const s_getattribute = interned("__getattribute__");
    PyObject* own = nullptr;
    PyObject* types = nullptr;
    return mt->tp_getattro == g_getattr_hook && g_getattr_hook != nullptr && s_getattribute != nullptr &&
           mro_lookup(mt, s_getattribute, &own) && mro_lookup(&PyType_Type, s_getattribute, &types) &&
           own != nullptr && own == types;
}

// Fill `c` (Mode::ClassAttr) for getattr(cls, name). type_getattro looks in the metatype's MRO
// first (its data descriptors, then after the class's MRO its other attributes, then a metatype
// __getattr__): when the metatype's MRO does not define the name (`type` and `object` are
// immutable; a metaclass's MRO is unchanged while its version tag is, kept in `hint`) and the
// metaclass uses type's own getattr, the name is decided by cls's MRO alone, whose dicts are
// unchanged while cls's version tag is (an enum's members, an autograd Function's static forward).
// The owner is left null (the generic path decides, cached as such) for a name `type` defines, a
// name found nowhere (AttributeError), a value that is not itself (class_attr_is_itself), or a
// class dict with a non-str key (mro_holder). Uncached (version 0) for a class without a tag.
void fill_class_attr(AttrCache& c, PyTypeObject* cls, PyObject* name) {
    reset_cache(c, cls);
    (void)_PyType_Lookup(cls, name);  // a version tag, if cls can have one (may run user code)
    PyTypeObject* mt = Py_TYPE(cls);
    if (mt != &PyType_Type) (void)_PyType_Lookup(mt, name);  // the metaclass's tag (user code too)
    const unsigned int version = type_version(cls);
    const unsigned int meta_version = mt == &PyType_Type ? 0 : type_version(mt);
    static_assert(sizeof(Py_ssize_t) > sizeof(unsigned int), "`hint` holds any metaclass tag");
    if (version == 0 || (mt != &PyType_Type && meta_version == 0)) return;
    PyObject* meta = nullptr;
    PyObject* value = nullptr;
    PyTypeObject* holder = nullptr;
    // From here on nothing runs user code: str-keyed dicts, and _PyType_Lookup's hit (or its
    // lookup in those same dicts) to check that CPython's type cache agrees with them.
    const bool itself = metatype_reads_like_type(mt) && mro_lookup(mt, name, &meta) && meta == nullptr &&
                        mro_holder(cls, name, &value, &holder) && value != nullptr &&
                        class_attr_answer(value) != nullptr && _PyType_Lookup(cls, name) == value &&
                        holder->tp_dict != nullptr;  // a static type's may live elsewhere (3.12+)
    if (type_version(cls) != version || (mt != &PyType_Type && type_version(mt) != meta_version)) return;
    c.version = version;
    c.mode = AttrCache::Mode::ClassAttr;
    c.hint = static_cast<Py_ssize_t>(meta_version);
    if (itself) c.owner = holder;
}

// The template forwarding hooks are compared with (compiled here, by the running interpreter),
// builtins.getattr, and the static method mirror. Once; may run user code (a collection).
bool init_forward_template() {
    if (g_forward_template != nullptr) return true;
    PyObject* builtins = PyEval_GetBuiltins();  // borrowed
    PyObject* getattr_fn = builtins != nullptr ? PyDict_GetItemString(builtins, "getattr") : nullptr;
    if (getattr_fn == nullptr) return true;  // no builtins.getattr: nothing is recognised
    PyObject* ns = PyDict_New();
    if (ns == nullptr) return false;
    PyObject* r = PyRun_String("def __getattr__(self, name):\n    return getattr(self.forwarded, name)\n",
                               Py_file_input, ns, ns);
    Py_XDECREF(r);
    PyObject* fn = r != nullptr ? PyDict_GetItemString(ns, "__getattr__") : nullptr;
    PyObject* code = fn != nullptr && PyFunction_Check(fn) ? Py_NewRef(PyFunction_GET_CODE(fn)) : nullptr;
    vectorcallfunc call = code != nullptr ? reinterpret_cast<PyFunctionObject*>(fn)->vectorcall : nullptr;
    Py_DECREF(ns);
    if (code == nullptr) return !PyErr_Occurred();  // no template: nothing is recognised
    PyObject* sm = PyStaticMethod_New(getattr_fn);
    if (sm == nullptr) {
        Py_DECREF(code);
        return false;
    }
    g_staticmethod_mirror = reinterpret_cast<StaticMethod*>(sm)->sm_callable == getattr_fn;
    Py_DECREF(sm);
    g_function_vectorcall = call;
    g_builtin_getattr = Py_NewRef(getattr_fn);
    g_forward_template = code;
    return true;
}

}  // namespace

bool init_getattr_hook() {
    if (g_getattr_hook != nullptr) return true;
    // A probe class read once: creating it may run a collection (user code), which the fetches
    // that use the pointer must not (they run inside regions without user code).
    PyObject* probe =
        PyObject_CallFunction(reinterpret_cast<PyObject*>(&PyType_Type), "s(O){sO}",
                              "_tripwire_getattr_probe", &PyModule_Type, "__getattr__", Py_None);
    if (probe == nullptr) return false;
    g_getattr_hook = reinterpret_cast<PyTypeObject*>(probe)->tp_getattro;
    Py_DECREF(probe);
    // A class statement's instance `__dict__` getter (subtype_dict), from a plain probe class.
    PyObject* plain = PyObject_CallFunction(reinterpret_cast<PyObject*>(&PyType_Type), "s(O){}",
                                            "_tripwire_dict_probe", &PyBaseObject_Type);
    if (plain == nullptr) return false;
    PyObject* descr = PyDict_GetItemString(reinterpret_cast<PyTypeObject*>(plain)->tp_dict, "__dict__");
    if (descr != nullptr && Py_IS_TYPE(descr, &PyGetSetDescr_Type))
        g_subtype_dict_get = reinterpret_cast<PyGetSetDescrObject*>(descr)->d_getset->get;
    Py_DECREF(plain);
    return init_forward_template();
}

Fetched fetch_attr(AttrCache& c, PyObject* obj, PyObject* name) {
    PyTypeObject* tp = Py_TYPE(obj);
    if (PyType_Check(obj) && obj != reinterpret_cast<PyObject*>(&PyType_Type)) {
        // A class (type's own attributes: type's MRO is the metatype's).
        if (!class_attr_cached(c, obj)) fill_class_attr(c, reinterpret_cast<PyTypeObject*>(obj), name);
        if (c.mode == AttrCache::Mode::ClassAttr)
            if (PyObject* v = class_attr_value(c, name)) return ok_borrowed(v);
        return generic_getattr(obj, name);
    }
    // A ClassAttr cache filled for a class `tp` says nothing about tp's instances.
    if (!attr_cache_valid(c, tp) || c.mode == AttrCache::Mode::ClassAttr)
        fill_cache(c, tp, name, [&] { return attr_mode(tp, name, c); });
    switch (c.mode) {
        case AttrCache::Mode::InstanceDict: {
            // The type has no data descriptor for `name` (checked under this version tag), so
            // an instance dict entry is exactly what getattr would return.
            if (PyObject* hv = instance_attr_hinted(obj, name, &c.hint)) return ok_borrowed(hv);
            // The hint path reads the object's own storage; not found there means a class
            // attribute, a non-data descriptor or __getattr__. The generic path handles those
            // without materialising the instance dict.
            if (instance_hints_complete()) break;
            PyObject** dictptr = _PyObject_GetDictPtr(obj);
            if (dictptr != nullptr && *dictptr != nullptr) {
                PyObject* v = PyDict_GetItemWithError(*dictptr, name);
                if (v) return ok_borrowed(v);
                if (PyErr_Occurred()) return error();
            } else if (PyErr_Occurred()) {
                return error();
            }
            break;  // class attribute, non-data descriptor, __getattr__: generic path
        }
        case AttrCache::Mode::FunctionField:
            if (PyObject* v = function_field(obj, name)) return ok_borrowed(v);
            break;
        case AttrCache::Mode::Member:
            if (PyObject* v = member_slot(obj, c.hint)) return ok_borrowed(v);
            break;  // an empty slot: None or AttributeError (and __getattr__), as getattr decides
        case AttrCache::Mode::OwnDict:
            if (PyObject* d = existing_instance_dict(obj)) return ok_borrowed(d);
            break;  // not created yet: the getter creates it
        case AttrCache::Mode::CellContents:
            if (PyObject* v = PyCell_GET(obj)) return ok_borrowed(v);
            break;  // empty: ValueError, as getattr raises it
        case AttrCache::Mode::ObjectClass: return ok_borrowed(reinterpret_cast<PyObject*>(Py_TYPE(obj)));
        case AttrCache::Mode::Module: {
            PyObject* d = PyModule_GetDict(obj);
            if (PyObject* hv = dict_get_hinted(d, name, &c.hint)) return ok_borrowed(hv);
            PyObject* v = PyDict_GetItemWithError(d, name);
            if (v) return ok_borrowed(v);
            if (PyErr_Occurred()) return error();
            Fetched hooked;  // a module subclass's class __getattr__ (torch._VF)
            if (module_hook_getattr(obj, name, &hooked)) return hooked;
            break;  // module __getattr__ and friends: generic path
        }
        default: break;
    }
    return generic_getattr(obj, name);
}

PyObject* class_attr_value(AttrCache& c, PyObject* name) {
    if (c.owner == nullptr) return nullptr;
    // Read from the owner's dict each time (the entry is not kept): a dict changed behind
    // CPython's back (gc.get_referents) gives what it holds now, never a freed object. Its
    // class's __get__ is read now, as type_getattro reads it.
    PyObject* d = c.owner->tp_dict;
    PyObject* v = d != nullptr ? dict_get_hinted(d, name, &c.owner_hint) : nullptr;
    return v != nullptr ? class_attr_answer(v) : nullptr;
}

PyObject* rare_attr_value(AttrCache& c, PyObject* obj, PyObject* name, bool* unclaimed) {
    if (class_attr_cached(c, obj)) {  // a class attribute: keyed by the class itself
        *unclaimed = true;
        return class_attr_value(c, name);
    }
    if (!attr_cache_valid(c, Py_TYPE(obj))) return nullptr;
    // Neither is an entry of obj's dict. A dict not created yet, an empty cell: the walk decides
    // (the getter creates the dict, or raises).
    if (c.mode == AttrCache::Mode::OwnDict) {
        *unclaimed = true;
        return existing_instance_dict(obj);
    }
    if (c.mode == AttrCache::Mode::CellContents) {
        *unclaimed = true;
        return PyCell_GET(obj);
    }
    if (c.mode == AttrCache::Mode::ObjectClass) {  // held by obj (an instance holds its type)
        *unclaimed = true;
        return reinterpret_cast<PyObject*>(Py_TYPE(obj));
    }
    return nullptr;
}

PyObject* method_function(AttrCache& c, PyObject* obj, PyObject* name) {
    PyTypeObject* tp = Py_TYPE(obj);
    // InstanceDict: object.__getattribute__ (perhaps behind a class __getattr__, which runs only
    // when it raises), no data descriptor for `name`; the owner's entry an exact function, which
    // a lookup that misses the instance binds to a method of `obj` (func_descr_get), whose
    // `__func__` (a member of the method type) is that function.
    if (c.owner == nullptr || c.mode != AttrCache::Mode::InstanceDict || !attr_cache_valid(c, tp) ||
        instance_attr_absent(obj, name) != 1)
        return nullptr;
    PyObject* d = c.owner->tp_dict;
    PyObject* f = d != nullptr ? dict_get_hinted(d, name, &c.owner_hint) : nullptr;
    return f != nullptr && PyFunction_Check(f) ? f : nullptr;
}

PyObject* function_field(PyObject* fn, PyObject* name) {
    if (!PyFunction_Check(fn)) return nullptr;
    PyObject* v = nullptr;
    switch (function_field_of(name)) {
        case FunctionFieldKind::Code: v = PyFunction_GET_CODE(fn); break;
        case FunctionFieldKind::Defaults: v = PyFunction_GET_DEFAULTS(fn); break;
        case FunctionFieldKind::KwDefaults: v = PyFunction_GET_KW_DEFAULTS(fn); break;
        case FunctionFieldKind::Closure: v = PyFunction_GET_CLOSURE(fn); break;
        case FunctionFieldKind::Globals: v = PyFunction_GET_GLOBALS(fn); break;
        case FunctionFieldKind::None: return nullptr;
    }
    return v != nullptr ? v : Py_None;  // the getters answer None for an unset optional field
}

bool attribute_certainly_absent(AttrCache& c, std::uint64_t& dict_memo, PyObject* obj, PyObject* name,
                                bool fill) {
    PyTypeObject* tp = Py_TYPE(obj);
    if (!attr_cache_valid(c, tp)) {
        if (!fill) return false;
        // InstanceDict here means "no class defines the name, and getattr is object's own";
        // DictGetattr, "... and then the class's __getattr__, a registered one (c.hint)".
        fill_cache(c, tp, name, [&] {
            PyObject* descr = nullptr;
            if (!mro_lookup(tp, name, &descr) || descr != nullptr) return AttrCache::Mode::Generic;
            if (tp->tp_getattro == PyObject_GenericGetAttr) return AttrCache::Mode::InstanceDict;
            // CPython's hook for a class __getattr__ runs object.__getattribute__ first (when the
            // class does not override it) and calls __getattr__ on its miss. The registered body
            // reads `self.__dict__` (the instance dict only if no class redefines `__dict__`) and
            // `type(self).__name__` (no user code only under the metatype `type`, which a class
            // can never change).
            static PyObject* const s_getattr = PyUnicode_InternFromString("__getattr__");
            static PyObject* const s_dict = PyUnicode_InternFromString("__dict__");
            PyObject* hook = nullptr;
            PyObject* dict_descr = nullptr;
            if (s_getattr == nullptr || s_dict == nullptr || tp->tp_getattro != g_getattr_hook ||
                g_getattr_hook == nullptr || !uses_generic_getattribute(tp) || Py_TYPE(tp) != &PyType_Type ||
                !mro_lookup(tp, s_getattr, &hook) || !mro_lookup(tp, s_dict, &dict_descr) ||
                !own_dict_descriptor(dict_descr))
                return AttrCache::Mode::Generic;
            const int index = dict_getattr_index(hook);
            if (index < 0) return AttrCache::Mode::Generic;
            c.hint = index;
            return AttrCache::Mode::DictGetattr;
        });
    }
    if (c.mode == AttrCache::Mode::InstanceDict) return instance_attr_absent(obj, name, &dict_memo) == 1;
    return c.mode == AttrCache::Mode::DictGetattr && instance_attr_absent(obj, name, &dict_memo) == 1 &&
           dict_getattr_misses(static_cast<int>(c.hint), obj, name);
}

bool attributes_in_instance_storage(AttrCache& c, PyTypeObject* tp, PyObject* const* names, int count,
                                    bool fill) {
    if (!attr_cache_valid(c, tp)) {
        if (!fill) return false;
        fill_cache(c, tp, names[0], [&] {
            if (tp->tp_getattro != PyObject_GenericGetAttr) return AttrCache::Mode::Generic;
            for (int i = 0; i < count; ++i) {
                PyObject* descr = nullptr;
                if (!mro_lookup(tp, names[i], &descr) || descr != nullptr) return AttrCache::Mode::Generic;
            }
            return AttrCache::Mode::InstanceDict;
        });
    }
    return c.mode == AttrCache::Mode::InstanceDict;
}

Fetched fetch_root(RuntimeRoot& root, const Locals& locals, PyObject* globals) {
    switch (root.kind) {
        case core::RootKind::Local: {
            if (locals.is_arguments()) {
                // The caller keeps the arguments alive for the whole check: borrowing is safe.
                PyObject* v = locals.argument(root.name, &root.slot);
                return v ? ok_borrowed(v) : missing();
            }
            PyObject* f_locals = locals.mapping;
            if (PyDict_Check(f_locals)) {
                if (PyObject* hv = dict_get_hinted(f_locals, root.name, &root.hint)) return ok_borrowed(hv);
                return dict_lookup(f_locals, root.name);
            }
            PyObject* v = PyObject_GetItem(f_locals, root.name);
            if (v) return ok_owned(v);
            if (!PyErr_ExceptionMatches(PyExc_KeyError)) return error();
            PyErr_Clear();
            return missing();
        }
        case core::RootKind::Global: {
            if (globals == nullptr) return missing();
            if (PyObject* hv = dict_get_hinted(globals, root.name, &root.hint)) return ok_borrowed(hv);
            return dict_lookup(globals, root.name);
        }
        case core::RootKind::Closure:
            if (root.cell == nullptr || PyCell_GET(root.cell) == nullptr) return missing();
            return ok_borrowed(PyCell_GET(root.cell));
    }
    return missing();
}

Ref read_source(RuntimeRoot& root, std::vector<RuntimeStep>& steps, const Locals& locals, PyObject* globals) {
    Fetched f = fetch_root(root, locals, globals);
    if (f.status == FetchStatus::Error) return Ref();
    if (f.status == FetchStatus::Missing) {
        PyErr_Format(PyExc_LookupError, "%U is not set", root.name);
        return Ref();
    }
    // Our own reference to every value: a step may run user code.
    Ref v = f.owned ? Ref::steal(f.value) : Ref::borrow(f.value);
    for (RuntimeStep& step : steps) {
        f = fetch_step(step, v.get());
        if (f.status == FetchStatus::Error) return Ref();
        if (f.status == FetchStatus::Missing) {
            PyErr_SetString(PyExc_LookupError, describe_missing(step, v.get()).c_str());
            return Ref();
        }
        v = f.owned ? Ref::steal(f.value) : Ref::borrow(f.value);
    }
    return v;
}

bool standard_instance_dict(AttrCache& c, PyTypeObject* tp) {
    static PyObject* name = PyUnicode_InternFromString("__dict__");
    if (!attr_cache_valid(c, tp)) fill_cache(c, tp, name, [&] { return dict_mode(tp, name); });
    if (c.version != 0) return c.mode == AttrCache::Mode::InstanceDict;
    // Not cached (an unversioned type, or a class dict with a non-str key): CPython's own lookup
    // decides, comparing keys as Python would (this step is classed as running user code).
    return own_dict_descriptor(_PyType_Lookup(tp, name));
}

void prepare_int_key(RuntimeStep& step) {
    step.int_key = false;
    if (step.kind != core::StepKind::Item || step.operand == nullptr || !PyLong_CheckExact(step.operand))
        return;
    const Py_ssize_t i = PyLong_AsSsize_t(step.operand);
    if (i == -1 && PyErr_Occurred()) {
        PyErr_Clear();  // too big for any list: converted (and found missing) at each fetch
        return;
    }
    step.index = i;
    step.int_key = true;
}

PyObject* existing_instance_dict(PyObject* obj) {
    PyTypeObject* tp = Py_TYPE(obj);
    // _PyObject_GetDictPtr would create a managed dict from the inline values: read the slot.
    if (tp->tp_flags & Py_TPFLAGS_MANAGED_DICT) return materialised_managed_dict(obj);
    if (tp->tp_dictoffset == 0) return nullptr;
    // Without a managed dict it only computes the slot's address (and never raises).
    PyObject** dictptr = _PyObject_GetDictPtr(obj);
    return dictptr != nullptr ? *dictptr : nullptr;
}

Fetched fetch_step(RuntimeStep& s, PyObject* v) {
    using core::StepKind;
    switch (s.kind) {
        case StepKind::Attr: return fetch_attr(s.cache, v, s.operand);
        case StepKind::Item: {
            if (PyDict_CheckExact(v)) {
                if (PyUnicode_CheckExact(s.operand)) {
                    if (PyObject* hv = dict_get_hinted(v, s.operand, &s.cache.hint)) return ok_borrowed(hv);
                }
                return dict_lookup(v, s.operand);
            }
            if ((PyList_CheckExact(v) || PyTuple_CheckExact(v)) && PyLong_CheckExact(s.operand)) {
                Py_ssize_t i = s.index;
                if (!s.int_key) {
                    i = PyLong_AsSsize_t(s.operand);
                    if (i == -1 && PyErr_Occurred()) {
                        PyErr_Clear();
                        return missing();
                    }
                }
                const Py_ssize_t n = Py_SIZE(v);
                if (i < 0) i += n;
                if (i < 0 || i >= n) return missing();
                return ok_borrowed(PyList_CheckExact(v) ? PyList_GET_ITEM(v, i) : PyTuple_GET_ITEM(v, i));
            }
            return subscript_result(PyObject_GetItem(v, s.operand));
        }
        case StepKind::DictItem:
            if (!PyDict_Check(v)) return missing();
            return dict_lookup(v, s.operand);
        case StepKind::Type: return ok_borrowed(reinterpret_cast<PyObject*>(Py_TYPE(v)));
        case StepKind::Dict: {
            if (PyType_Check(v)) return missing();
            if (!standard_instance_dict(s.cache, Py_TYPE(v))) return missing();
            PyObject** dictptr = _PyObject_GetDictPtr(v);
            if (dictptr == nullptr) return PyErr_Occurred() ? error() : missing();
            if (*dictptr == nullptr) {
                // An instance dict created on first access (functions, exceptions, subclasses of
                // variable-sized builtins): `X.__dict__` is a new empty dict, as in Python. The
                // interpreter's own getter creates it; no user code runs.
                PyObject* d = PyObject_GenericGetDict(v, nullptr);
                if (d == nullptr) return error();
                if (!PyDict_CheckExact(d)) {
                    Py_DECREF(d);
                    return missing();
                }
                return ok_owned(d);
            }
            if (!PyDict_CheckExact(*dictptr)) return missing();
            return ok_borrowed(*dictptr);
        }
        case StepKind::Defaults: {
            if (PyFunction_Check(v)) {
                PyObject* defaults = PyFunction_GET_DEFAULTS(v);
                if (defaults == nullptr || !PyTuple_Check(defaults) ||
                    s.index >= PyTuple_GET_SIZE(defaults)) {
                    return missing();
                }
                return ok_borrowed(PyTuple_GET_ITEM(defaults, s.index));
            }
            static PyObject* name = PyUnicode_InternFromString("__defaults__");
            Fetched d = generic_getattr(v, name);
            if (d.status != FetchStatus::Ok) return d;
            PyObject* item = PySequence_GetItem(d.value, s.index);
            Py_DECREF(d.value);
            return subscript_result(item);
        }
        case StepKind::KwDefaults: {
            if (PyFunction_Check(v)) {
                PyObject* kw = PyFunction_GET_KW_DEFAULTS(v);
                if (kw == nullptr || !PyDict_Check(kw)) return missing();
                return dict_lookup(kw, s.operand);
            }
            static PyObject* name = PyUnicode_InternFromString("__kwdefaults__");
            Fetched d = generic_getattr(v, name);
            if (d.status != FetchStatus::Ok) return d;
            if (d.value == Py_None) {
                Py_DECREF(d.value);
                return missing();
            }
            PyObject* item = PyObject_GetItem(d.value, s.operand);
            Py_DECREF(d.value);
            return subscript_result(item);
        }
        case StepKind::Code: {
            if (PyFunction_Check(v)) return ok_borrowed(PyFunction_GET_CODE(v));
            static PyObject* name = PyUnicode_InternFromString("__code__");
            return generic_getattr(v, name);
        }
        case StepKind::ClosureCell: {
            if (PyFunction_Check(v)) {
                PyObject* cl = PyFunction_GET_CLOSURE(v);
                if (cl == nullptr || !PyTuple_Check(cl) || s.index >= PyTuple_GET_SIZE(cl)) return missing();
                PyObject* cell = PyTuple_GET_ITEM(cl, s.index);
                if (!PyCell_Check(cell) || PyCell_GET(cell) == nullptr) return missing();
                return ok_borrowed(PyCell_GET(cell));
            }
            static PyObject* name = PyUnicode_InternFromString("__closure__");
            static PyObject* contents = PyUnicode_InternFromString("cell_contents");
            Fetched cl = generic_getattr(v, name);
            if (cl.status != FetchStatus::Ok) return cl;
            Fetched c = subscript_result(PySequence_GetItem(cl.value, s.index));
            Py_DECREF(cl.value);
            if (c.status != FetchStatus::Ok) return c;
            PyObject* cell = c.value;
            if (PyCell_Check(cell)) {  // an empty cell is a missing value, as for functions
                PyObject* inner = PyCell_GET(cell);
                Py_XINCREF(inner);
                Py_DECREF(cell);
                return inner != nullptr ? ok_owned(inner) : missing();
            }
            Fetched out = generic_getattr(cell, contents);
            Py_DECREF(cell);
            return out;
        }
        case StepKind::WeakrefCall: {
            if (PyObject* target = weakref_referent(v)) return ok_borrowed(target);
            if (!PyWeakref_CheckRef(v)) return missing();
            PyObject* target = PyWeakref_GetObject(v);  // borrowed; Py_None when dead
            if (target == nullptr) return error();
            return ok_borrowed(target);
        }
        case StepKind::DictKey:
        case StepKind::DictValue: {
            if (!PyDict_Check(v) || s.index >= PyDict_GET_SIZE(v)) return missing();
            Py_ssize_t pos = 0;
            PyObject* key = nullptr;
            PyObject* value = nullptr;
            for (Py_ssize_t i = 0; i <= s.index; ++i) {
                if (!PyDict_Next(v, &pos, &key, &value)) return missing();
            }
            return ok_borrowed(s.kind == StepKind::DictKey ? key : value);
        }
        case StepKind::Size:
        case StepKind::Stride:
        case StepKind::StorageOffset: return fetch_tensor_property(s, v);
        case StepKind::TensorSize:
        case StepKind::TensorStride:
        case StepKind::TensorStorageOffset:
        case StepKind::Grad: return fetch_cpp_tensor_step(s, v);
        // torch's TypeDictGuardAccessor / TypeMROGuardAccessor read these fields of the type
        // object itself. Neither goes through `type(X).__dict__` (a mappingproxy, and a metaclass
        // may define `__dict__` or `__getattribute__`) or `type(X).__mro__` (same): no user code,
        // nothing allocated, nothing cached, so a class attribute set or deleted (the dict's
        // contents) or a `__bases__` assignment (a new tp_mro tuple) is seen by the next check.
        // The walk keeps its own reference where a subtree can run user code (borrow_ok): a
        // `__bases__` assignment frees the old tuple.
        case StepKind::TypeDict: {
            if (!PyType_Check(v)) return missing();
            PyObject* d = class_dict(reinterpret_cast<PyTypeObject*>(v));
            return d != nullptr ? ok_borrowed(d) : missing();
        }
        case StepKind::TypeMro: {
            if (!PyType_Check(v)) return missing();
            PyObject* mro = reinterpret_cast<PyTypeObject*>(v)->tp_mro;  // null while a class is made
            return mro != nullptr ? ok_borrowed(mro) : missing();
        }
    }
    return missing();
}

std::string describe_missing(const RuntimeStep& s, PyObject* parent) {
    using core::StepKind;
    auto repr = [](PyObject* o) -> std::string {
        if (o == nullptr) return "?";
        PyObject* r = PyObject_Repr(o);
        if (r == nullptr) {
            PyErr_Clear();
            return "<unrepresentable>";
        }
        const char* c = PyUnicode_AsUTF8(r);
        std::string out = c ? c : "?";
        if (!c) PyErr_Clear();
        Py_DECREF(r);
        return out;
    };
    const std::string tname = parent ? Py_TYPE(parent)->tp_name : "?";
    switch (s.kind) {
        case StepKind::Attr:
            return "AttributeError: '" + tname + "' object has no attribute " + repr(s.operand);
        case StepKind::Item: return "KeyError/IndexError: " + tname + " has no item " + repr(s.operand);
        case StepKind::DictItem:
            return PyDict_Check(parent) ? "KeyError: " + repr(s.operand)
                                        : "TypeError: " + tname + " is not a dict";
        case StepKind::Dict: return "TypeError: " + tname + " object has no instance __dict__";
        case StepKind::Defaults: return "IndexError: no positional default " + std::to_string(s.index);
        case StepKind::KwDefaults: return "KeyError: no keyword default " + repr(s.operand);
        case StepKind::ClosureCell:
            return "ValueError: closure cell " + std::to_string(s.index) + " is missing or empty";
        case StepKind::WeakrefCall: return "TypeError: " + tname + " is not a weak reference";
        case StepKind::DictKey:
        case StepKind::DictValue:
            return PyDict_Check(parent)
                       ? "IndexError: dict position " + std::to_string(s.index) + " out of range"
                       : "TypeError: " + tname + " is not a dict";
        case StepKind::Size:
            return "IndexError: " + tname + " has no size " + std::to_string(s.index) +
                   " (or no size() / shape)";
        case StepKind::Stride:
            return "IndexError: " + tname + " has no stride " + std::to_string(s.index) +
                   " (or no stride() / strides)";
        case StepKind::StorageOffset: return "AttributeError: " + tname + " has no storage_offset()";
        // torch's own words (TensorPropertyGuardAccessor / GradGuardAccessor verbose checks).
        case StepKind::TensorSize:
        case StepKind::TensorStride:
        case StepKind::TensorStorageOffset:
            return "not a tensor, tensor has too few dimensions, or symbolic values found (" + tname +
                   ", read in C++)";
        case StepKind::Grad: return "not a tensor - grad field is accessed (" + tname + ")";
        case StepKind::TypeDict: return "TypeError: " + tname + " is not a type (no class __dict__)";
        case StepKind::TypeMro: return "TypeError: " + tname + " is not a type (no __mro__)";
        default: return "missing";
    }
}

}  // namespace tripwire::runtime
