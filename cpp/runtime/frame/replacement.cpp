// tripwire/cpp/runtime/frame/replacement.cpp -- the layout check and the Replacement type.
#include "runtime/frame/replacement.hpp"

#include <structmember.h>

#include "runtime/frame/interp_frame.hpp"

namespace tripwire::runtime::frame {
namespace {

constexpr int kGeneratorFlags = CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR | CO_ITERABLE_COROUTINE;

struct Replacement {
    PyObject_HEAD PyObject* original_ref;  // weak reference to the original code object
    PyObject* code;                        // the replacement code (strong)
};

Replacement* as_repl(PyObject* o) { return reinterpret_cast<Replacement*>(o); }

PyTypeObject* g_type = nullptr;

std::string name_of(PyCodeObject* co) {
    const char* s = PyUnicode_AsUTF8(co->co_qualname);
    if (s == nullptr) {
        PyErr_Clear();
        return "?";
    }
    return s;
}

// The name of fast-local slot `i` of `co` (for messages).
std::string slot_name(PyCodeObject* co, int i) {
    const char* s = PyUnicode_AsUTF8(PyTuple_GET_ITEM(co->co_localsplusnames, i));
    if (s == nullptr) {
        PyErr_Clear();
        return "?";
    }
    return s;
}

void repl_dealloc(PyObject* self) {
    PyTypeObject* tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    Py_CLEAR(as_repl(self)->original_ref);
    Py_CLEAR(as_repl(self)->code);
    tp->tp_free(self);
    Py_DECREF(tp);
}

int repl_traverse(PyObject* self, visitproc visit, void* arg) {
    Py_VISIT(Py_TYPE(self));
    // The weak reference is not reported: its callback-less referent is not owned, and code
    // objects are not tracked anyway.
    Py_VISIT(as_repl(self)->code);
    return 0;
}

PyObject* repl_new(PyTypeObject*, PyObject* args, PyObject* kwargs) {
    PyObject *original = nullptr, *code = nullptr;
    static const char* kw[] = {"original", "code", nullptr};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:Replacement", const_cast<char**>(kw), &original,
                                     &code))
        return nullptr;
    return make_replacement(original, code);
}

PyObject* repl_repr(PyObject* self) {
    auto* code = reinterpret_cast<PyCodeObject*>(as_repl(self)->code);
    return PyUnicode_FromFormat("<tripwire.frame.Replacement %U (%U:%d)>", code->co_qualname,
                                code->co_filename, code->co_firstlineno);
}

PyType_Slot g_slots[] = {
    {Py_tp_new, reinterpret_cast<void*>(repl_new)},
    {Py_tp_dealloc, reinterpret_cast<void*>(repl_dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(repl_traverse)},
    {Py_tp_repr, reinterpret_cast<void*>(repl_repr)},
    {Py_tp_doc, const_cast<char*>(
                    "Replacement(original, code)\n--\n\n`code` checked to run in frames of `original` (the "
                    "payload of a tripwire.frame cache entry). Raises TypeError when the layouts differ.")},
    {0, nullptr}};

// Not Py_TPFLAGS_IMMUTABLETYPE: the bindings add the `original` and `code` properties (typed, for
// the stub). The hit path trusts only the C fields, which nothing but make_replacement sets.
PyType_Spec g_spec = {"tripwire._core.Replacement", sizeof(Replacement), 0,
                      Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, g_slots};

}  // namespace

std::string incompatibility(PyCodeObject* o, PyCodeObject* r) {
    if (r->co_flags & kGeneratorFlags)
        return "the replacement is a generator or coroutine (its frame would have to become one)";
    if (o->co_flags & kGeneratorFlags) return "the original is a generator or coroutine (never intercepted)";
    if ((r->co_flags & (CO_OPTIMIZED | CO_NEWLOCALS)) != (o->co_flags & (CO_OPTIMIZED | CO_NEWLOCALS)))
        return "the replacement is not a function body like the original (CO_OPTIMIZED/CO_NEWLOCALS differ)";
    auto count_mismatch = [&](const char* what, int a, int b) {
        return std::string(what) + ": the original has " + std::to_string(a) + ", the replacement " +
               std::to_string(b);
    };
    if (r->co_argcount != o->co_argcount)
        return count_mismatch("positional parameters", o->co_argcount, r->co_argcount);
    if (r->co_kwonlyargcount != o->co_kwonlyargcount)
        return count_mismatch("keyword-only parameters", o->co_kwonlyargcount, r->co_kwonlyargcount);
    auto presence = [&](const char* what, int flag) {
        return std::string(what) + ": the original " + ((o->co_flags & flag) ? "has it" : "has none") +
               ", the replacement " + ((r->co_flags & flag) ? "has it" : "has none");
    };
    if ((r->co_flags & CO_VARARGS) != (o->co_flags & CO_VARARGS)) return presence("*args", CO_VARARGS);
    if ((r->co_flags & CO_VARKEYWORDS) != (o->co_flags & CO_VARKEYWORDS))
        return presence("**kwargs", CO_VARKEYWORDS);
    if (r->co_nfreevars != o->co_nfreevars)
        return count_mismatch("free variables (the function's closure)", o->co_nfreevars, r->co_nfreevars);
    const int of = o->co_nlocalsplus - o->co_nfreevars;
    const int rf = r->co_nlocalsplus - r->co_nfreevars;
    for (int i = 0; i < o->co_nfreevars; ++i) {
        PyObject* a = PyTuple_GET_ITEM(o->co_localsplusnames, of + i);
        PyObject* b = PyTuple_GET_ITEM(r->co_localsplusnames, rf + i);
        if (a != b && PyUnicode_Compare(a, b) != 0) {
            PyErr_Clear();
            return "free variable " + std::to_string(i) + ": the original's is '" + slot_name(o, of + i) +
                   "', the replacement's '" + slot_name(r, rf + i) +
                   "' (closure cells are matched by position)";
        }
    }
    return "";
}

PyTypeObject* replacement_type() {
    if (g_type == nullptr) g_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&g_spec));
    Py_XINCREF(g_type);
    return g_type;
}

PyObject* make_replacement(PyObject* original, PyObject* code) {
    if (!PyCode_Check(original) || !PyCode_Check(code)) {
        PyErr_SetString(PyExc_TypeError, "Replacement(original, code) needs two code objects");
        return nullptr;
    }
    auto* o = reinterpret_cast<PyCodeObject*>(original);
    auto* r = reinterpret_cast<PyCodeObject*>(code);
    const std::string why = incompatibility(o, r);
    if (!why.empty()) {
        PyErr_Format(PyExc_TypeError, "code %s cannot run in frames of %s: %s", name_of(r).c_str(),
                     name_of(o).c_str(), why.c_str());
        return nullptr;
    }
    PyTypeObject* tp = replacement_type();
    if (tp == nullptr) return nullptr;
    PyObject* self = tp->tp_alloc(tp, 0);
    Py_DECREF(tp);
    if (self == nullptr) return nullptr;
    as_repl(self)->original_ref = PyWeakref_NewRef(original, nullptr);
    as_repl(self)->code = Py_NewRef(code);
    if (as_repl(self)->original_ref == nullptr) {
        Py_DECREF(self);
        return nullptr;
    }
    return self;
}

PyCodeObject* replacement_code_for(PyObject* payload, PyCodeObject* original) {
    if (Py_TYPE(payload) != g_type) return nullptr;
    Replacement* r = as_repl(payload);
    // The weak reference's target field, compared with a code object the caller holds alive: a
    // dead reference holds None (or, inside a trashcan-delayed deallocation, the dying object),
    // never a live object, so equality means "made for this very code object".
    if (reinterpret_cast<PyWeakReference*>(r->original_ref)->wr_object !=
        reinterpret_cast<PyObject*>(original))
        return nullptr;
    return reinterpret_cast<PyCodeObject*>(r->code);
}

PyObject* replacement_original(PyObject* r) {
    PyObject* o = PyWeakref_GetObject(as_repl(r)->original_ref);
    return o == Py_None ? nullptr : o;
}

PyObject* replacement_code(PyObject* r) { return as_repl(r)->code; }

}  // namespace tripwire::runtime::frame
