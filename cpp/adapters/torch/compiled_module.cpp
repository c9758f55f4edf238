// tripwire/cpp/adapters/torch/compiled_module.cpp -- the compiled module's per-call gate.
//
// `tripwire.torch.compile(module)` returns an OptimizedModule whose class `__call__` is a
// ModuleCall: a method descriptor with vectorcall, so CPython's slot_tp_call (3.11-3.13,
// lookup_maybe_method: a type with Py_TPFLAGS_METHOD_DESCRIPTOR is called unbound, the instance
// first) reaches it with no bound method and no Python frame. It makes the tests under which
// torch's nn.Module call machinery would only find nothing to do (no module hook anywhere, the
// forward not replaced, no `_compiled_call_impl`, no JIT trace in progress, nn.Module's own
// `__call__` and `_call_impl` on the way, unpatched and not overridden) and then enters the
// compiled scope directly, with eval_frame._in_optimized_module set for the call as torch's
// OptimizedModule.__call__ sets it. When any test does not hold, the call is
// `super(owner, module).__call__(*args, **kwargs)`: torch's OptimizedModule.__call__, which
// applies what was found. The tests are nn.Module's semantics, hence the torch adapter (and the
// JIT tracer's state is a C++ thread-local that only a torch build can read without a call).
//
// Per-instance state is a ModuleCallState in the instance's __dict__ (`_tripwire_fast`), built
// by OptimizedModule._initialize: the dict it was built for, the wrapper's scope, the original
// module with its dict, the scope over the original class's forward (entered with the module as
// its first argument, or null) and that forward. The state is found through the instance's
// current __dict__ and must name that very dict, so a __dict__ replaced wholesale
// (object.__setattr__, __setstate__) is torch's route until _initialize builds a new state.
#include <torch/csrc/jit/frontend/tracer.h>

#include <Python.h>
#include <structmember.h>

#include <cstddef>
#include <cstring>

#include "adapters/torch/adapter.hpp"

namespace tripwire::torch_adapter {

namespace {

// Interned once, in add_compiled_module_types (the module is initialised once per process).
struct Names {
    PyObject* fast;
    PyObject* forward;
    PyObject* compiled_call_impl;
    PyObject* call_impl;
    PyObject* in_optimized_module;
    PyObject* call;
    PyObject* hooks[4];         // a module's own hook dicts (instance attributes)
    PyObject* global_hooks[4];  // torch.nn.modules.module's globals
};
Names g_names{};

// -- the per-instance state ----------------------------------------------------------------------

struct State {
    PyObject_HEAD PyObject* d;  // the wrapper's __dict__ this state was built for
    PyObject* scope;            // the wrapper's forward (its scope), called with the arguments
    PyObject* orig;             // the original module
    PyObject* od;               // its __dict__
    PyObject* direct;           // the scope over type(orig).forward, called with orig first; or null
    PyObject* forward;          // type(orig).forward when the state was built
};

PyTypeObject* g_state_type = nullptr;

State* as_state(PyObject* o) { return reinterpret_cast<State*>(o); }

PyObject* state_new(PyTypeObject* tp, PyObject* args, PyObject* kwargs) {
    PyObject *d = nullptr, *scope = nullptr, *orig = nullptr, *od = nullptr, *direct = nullptr,
             *forward = nullptr;
    static const char* kw[] = {"d", "scope", "orig", "od", "direct", "forward", nullptr};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOO:ModuleCallState", const_cast<char**>(kw), &d,
                                     &scope, &orig, &od, &direct, &forward))
        return nullptr;
    // Exact dicts: the gate reads their items with the dict API, which a subclass could override.
    if (!PyDict_CheckExact(d) || !PyDict_CheckExact(od)) {
        PyErr_SetString(PyExc_TypeError, "ModuleCallState: d and od must be dicts");
        return nullptr;
    }
    if (!PyCallable_Check(scope) || (direct != Py_None && !PyCallable_Check(direct))) {
        PyErr_SetString(PyExc_TypeError, "ModuleCallState: scope and direct must be callable");
        return nullptr;
    }
    auto* s = reinterpret_cast<State*>(tp->tp_alloc(tp, 0));
    if (s == nullptr) return nullptr;
    s->d = Py_NewRef(d);
    s->scope = Py_NewRef(scope);
    s->orig = Py_NewRef(orig);
    s->od = Py_NewRef(od);
    s->direct = direct == Py_None ? nullptr : Py_NewRef(direct);
    s->forward = Py_NewRef(forward);
    return reinterpret_cast<PyObject*>(s);
}

int state_traverse(PyObject* self, visitproc visit, void* arg) {
    State* s = as_state(self);
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(s->d);
    Py_VISIT(s->scope);
    Py_VISIT(s->orig);
    Py_VISIT(s->od);
    Py_VISIT(s->direct);
    Py_VISIT(s->forward);
    return 0;
}

// The state sits in a cycle (the wrapper's __dict__ holds it, it holds that dict): a collection
// clears it. A gate that finds a cleared state (d null) takes torch's route.
int state_clear(PyObject* self) {
    State* s = as_state(self);
    Py_CLEAR(s->d);
    Py_CLEAR(s->scope);
    Py_CLEAR(s->orig);
    Py_CLEAR(s->od);
    Py_CLEAR(s->direct);
    Py_CLEAR(s->forward);
    return 0;
}

void state_dealloc(PyObject* self) {
    PyTypeObject* tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    state_clear(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

PyType_Slot g_state_slots[] = {
    {Py_tp_new, reinterpret_cast<void*>(state_new)},
    {Py_tp_dealloc, reinterpret_cast<void*>(state_dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(state_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(state_clear)},
    {Py_tp_doc, const_cast<char*>("ModuleCallState(d, scope, orig, od, direct, forward)\n--\n\n"
                                  "What a compiled module's ModuleCall gate reads from the instance.")},
    {0, nullptr}};

PyType_Spec g_state_spec = {"tripwire._torch_adapter.ModuleCallState", sizeof(State), 0,
                            Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, g_state_slots};

// -- the gate ------------------------------------------------------------------------------------

struct Gate {
    PyObject_HEAD vectorcallfunc vectorcall;
    PyObject* owner;       // the class whose __call__ this is (super(owner, module) on torch's route)
    PyObject* hooks_dict;  // torch.nn.modules.module.__dict__ (a module's dict is never replaced)
    PyObject* ef_dict;     // torch._dynamo.eval_frame.__dict__
    // nn.Module and its own __call__ (_wrapped_call_impl) and _call_impl, as torch defines them:
    // the machinery the gate skips. A call whose route would find another (patched on nn.Module
    // by a profiler or tracer, or overridden by a module class) is torch's route.
    PyObject* module_type;
    PyObject* call;
    PyObject* call_impl;
};

Gate* as_gate(PyObject* o) { return reinterpret_cast<Gate*>(o); }

// A hook dict's emptiness: 1 empty, 0 not, -1 neither a dict nor an OrderedDict (torch's route).
// torch's hook dicts are OrderedDicts; for exactly dict and OrderedDict truthiness is the length
// (OrderedDict inherits dict's), while a subclass may override __len__ or __bool__: not guessed.
int hooks_empty(PyObject* v) {
    if (v == nullptr || (!PyDict_CheckExact(v) && !PyODict_CheckExact(v))) return -1;
    return PyDict_GET_SIZE(v) == 0 ? 1 : 0;
}

// Whether every dict names[i] in `dict` is empty: 1 yes, 0 no (one is not empty, missing, or not
// a dict), -1 with an error set. The values are borrowed and used before anything else runs.
int all_hooks_empty(PyObject* dict, PyObject* const* names, bool* missing) {
    for (int i = 0; i < 4; ++i) {
        PyObject* v = PyDict_GetItemWithError(dict, names[i]);
        if (v == nullptr && PyErr_Occurred()) return -1;
        const int e = hooks_empty(v);
        if (e < 0 && missing != nullptr) *missing = true;
        if (e != 1) return 0;
    }
    return 1;
}

// The route of one call of `mod`: 1 the compiled scope (`*callee`, with `*first` before the
// arguments when not null; new references), 0 torch's route, -1 with an error set. The reads are
// today's nn.Module semantics, read afresh on every call: a hook registered inside the previous
// call, a global hook, a replaced forward or __dict__ are seen by the next one.
int gate_route(Gate* g, PyObject* mod, PyObject** callee, PyObject** first) {
    // Not an instance of the owner (the gate put on another class, an unbound call): super()
    // raises torch's route's TypeError.
    if (!PyObject_TypeCheck(mod, reinterpret_cast<PyTypeObject*>(g->owner))) return 0;
    PyObject* dict = PyObject_GenericGetDict(mod, nullptr);
    if (dict == nullptr) return -1;
    PyObject* found = PyDict_GetItemWithError(dict, g_names.fast);
    if (found == nullptr || !Py_IS_TYPE(found, g_state_type)) {
        Py_DECREF(dict);
        return PyErr_Occurred() ? -1 : 0;  // None (the class default: not built) or not ours
    }
    // Held: the dict lookups below may run a key's __eq__ (any key of a colliding hash), which may
    // replace _tripwire_fast or the __dict__; what is read stays this state's.
    PyObject* st = Py_NewRef(found);
    State* s = as_state(st);
    const bool same_dict = s->d == dict;  // else replaced wholesale: this state's reads are stale
    Py_DECREF(dict);
    int r = 0;
    PyObject* v = nullptr;
    if (!same_dict || s->scope == nullptr) goto done;
    // nn.Module's call machinery as torch defines it, for the wrapper: torch's route calls
    // nn.Module.__call__ through super() and it calls self._call_impl, both looked up then.
    // _PyType_Lookup: borrowed, an MRO walk through the type cache, no user code.
    if (_PyType_Lookup(reinterpret_cast<PyTypeObject*>(g->module_type), g_names.call) != g->call ||
        _PyType_Lookup(Py_TYPE(mod), g_names.call_impl) != g->call_impl)
        goto done;
    // torch.nn.modules.module's four global hook dicts, read by name: torch rebinds none of them
    // today, but a read through the module's dict costs one lookup and needs no proof.
    if ((r = all_hooks_empty(g->hooks_dict, g_names.global_hooks, nullptr)) != 1) goto done;
    if ((r = all_hooks_empty(s->d, g_names.hooks, nullptr)) != 1) goto done;
    // The wrapper's own _compiled_call_impl, which torch's route calls when set: only ever in its
    // dict by object.__setattr__ (OptimizedModule.__setattr__ sends an assignment to the original
    // module, checked below); absent, it is nn.Module's class attribute, None.
    v = PyDict_GetItemWithError(s->d, g_names.compiled_call_impl);
    if (v != nullptr ? v != Py_None : PyErr_Occurred() != nullptr) {
        r = v == nullptr ? -1 : 0;
        goto done;
    }
    v = PyDict_GetItemWithError(s->d, g_names.forward);
    if (v != s->scope) {  // forward replaced on the wrapper (or deleted)
        r = v == nullptr && PyErr_Occurred() ? -1 : 0;
        goto done;
    }
    // torch._C._get_tracing_state() is not None: the same thread-local, without the pybind call.
    if (torch::jit::tracer::getTracingState()) {
        r = 0;
        goto done;
    }
    r = 1;
    if (s->direct != nullptr) {
        // The original module's call would find nothing either: then its forward's scope is
        // entered directly, else the wrapper's scope (over orig.__call__) runs its machinery.
        bool missing = false;
        int direct = all_hooks_empty(s->od, g_names.hooks, &missing);
        if (direct < 0 || missing) {  // a hook dict missing or not a dict: torch's route decides
            r = direct < 0 ? -1 : 0;
            goto done;
        }
        if (direct == 1) {
            direct = PyDict_Contains(s->od, g_names.forward);  // forward set on the instance
            if (direct < 0) {
                r = -1;
                goto done;
            }
            direct = direct == 0 ? 1 : 0;
        }
        // The reads below may run user code (a metaclass's or a property's): the state is held,
        // and an error propagates, as from the Python reads they stand for.
        if (direct == 1) {
            PyObject* f = PyObject_GetAttr(reinterpret_cast<PyObject*>(Py_TYPE(s->orig)), g_names.forward);
            if (f == nullptr) {
                r = -1;
                goto done;
            }
            direct = f == s->forward ? 1 : 0;  // the class's forward replaced
            Py_DECREF(f);
        }
        // orig.__call__ (bound when the state was built: nn.Module's own) calls orig._call_impl,
        // looked up then: a class's own _call_impl runs whatever it does.
        if (direct == 1) direct = _PyType_Lookup(Py_TYPE(s->orig), g_names.call_impl) == g->call_impl ? 1 : 0;
        if (direct == 1) {
            PyObject* c = PyObject_GetAttr(s->orig, g_names.compiled_call_impl);
            if (c == nullptr) {
                r = -1;
                goto done;
            }
            direct = c == Py_None ? 1 : 0;  // Module.compile()
            Py_DECREF(c);
        }
        if (direct == 1) {
            // The instance's own dict (what its attribute reads use): replaced wholesale, the hook
            // dicts read above were another's.
            PyObject* cur = PyObject_GenericGetDict(s->orig, nullptr);
            if (cur == nullptr) {
                r = -1;
                goto done;
            }
            direct = cur == s->od ? 1 : 0;
            Py_DECREF(cur);
        }
        if (direct == 1 && s->direct != nullptr && s->orig != nullptr) {
            *callee = Py_NewRef(s->direct);
            *first = Py_NewRef(s->orig);
            goto done;
        }
    }
    if (s->scope == nullptr) {  // cleared by a collection the reads above ran
        r = 0;
        goto done;
    }
    *callee = Py_NewRef(s->scope);
done:
    Py_DECREF(st);
    return r;
}

// `callee(*args)`, or `callee(first, *args)`, with eval_frame._in_optimized_module True for the
// call and its previous value put back on every exit, as torch's _set_in_optimized_module does
// (a module global, set through the module's dict as the Python assignment sets it).
PyObject* run_flagged(Gate* g, PyObject* callee, PyObject* first, PyObject* const* args, Py_ssize_t nargs,
                      PyObject* kwnames) {
    PyObject* old = PyDict_GetItemWithError(g->ef_dict, g_names.in_optimized_module);
    if (old == nullptr) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_AttributeError,
                            "torch._dynamo.eval_frame has no attribute '_in_optimized_module'");
        return nullptr;
    }
    Py_INCREF(old);
    if (PyDict_SetItem(g->ef_dict, g_names.in_optimized_module, Py_True) < 0) {
        Py_DECREF(old);
        return nullptr;
    }
    PyObject* r = nullptr;
    if (first == nullptr) {
        r = PyObject_Vectorcall(callee, args, static_cast<std::size_t>(nargs), kwnames);
    } else {
        // [slot for the callee, first, args..., keyword values...]: PY_VECTORCALL_ARGUMENTS_OFFSET
        // lets a bound callee use the slot instead of copying again.
        const Py_ssize_t total = nargs + (kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0);
        PyObject* small[10];
        PyObject** buf = small;
        if (total + 2 > static_cast<Py_ssize_t>(sizeof small / sizeof small[0])) {
            buf = static_cast<PyObject**>(
                PyMem_Malloc(static_cast<std::size_t>(total + 2) * sizeof(PyObject*)));
            if (buf == nullptr) PyErr_NoMemory();
        }
        if (buf != nullptr) {
            buf[0] = nullptr;
            buf[1] = first;
            if (total > 0) std::memcpy(buf + 2, args, static_cast<std::size_t>(total) * sizeof(PyObject*));
            r = PyObject_Vectorcall(callee, buf + 1,
                                    static_cast<std::size_t>(nargs + 1) | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                    kwnames);
            if (buf != small) PyMem_Free(buf);
        }
    }
    // The call's exception is set aside while the flag is put back (PyErr_GetRaisedException is
    // 3.12+). The set cannot fail in practice (the key is there: no resize); if it does, the
    // call's own exception is the one the caller sees.
    PyObject *type = nullptr, *value = nullptr, *tb = nullptr;
    if (r == nullptr) PyErr_Fetch(&type, &value, &tb);
    const int ok = PyDict_SetItem(g->ef_dict, g_names.in_optimized_module, old);
    Py_DECREF(old);
    if (ok < 0) {
        if (r != nullptr) {
            Py_DECREF(r);
            return nullptr;
        }
        PyErr_WriteUnraisable(g->ef_dict);
    }
    if (r == nullptr) PyErr_Restore(type, value, tb);
    return r;
}

// torch's route: `super(owner, mod).__call__(*args, **kwargs)`, what the Python method's
// super().__call__ was (torch's OptimizedModule.__call__ as the MRO finds it at the call).
PyObject* torch_route(Gate* g, PyObject* mod, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    PyObject* sup =
        PyObject_CallFunctionObjArgs(reinterpret_cast<PyObject*>(&PySuper_Type), g->owner, mod, nullptr);
    if (sup == nullptr) return nullptr;
    PyObject* call = PyObject_GetAttr(sup, g_names.call);
    Py_DECREF(sup);
    if (call == nullptr) return nullptr;
    PyObject* r = PyObject_Vectorcall(call, args, static_cast<std::size_t>(nargs), kwnames);
    Py_DECREF(call);
    return r;
}

PyObject* gate_call(PyObject* self, PyObject* const* args, std::size_t nargsf, PyObject* kwnames) {
    const Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (n < 1) {
        PyErr_SetString(PyExc_TypeError, "OptimizedModule.__call__() needs the module as its first argument");
        return nullptr;
    }
    // Held for the call: a C caller may pass borrowed references, and the call may drop every
    // other one (forward deleting the last reference to the module, __call__ reassigned).
    Py_INCREF(self);
    PyObject* mod = Py_NewRef(args[0]);
    Gate* g = as_gate(self);
    PyObject* r = nullptr;
    if (g->owner == nullptr) {
        PyErr_SetString(PyExc_RuntimeError, "OptimizedModule.__call__: the gate was cleared");
    } else {
        PyObject* callee = nullptr;
        PyObject* first = nullptr;
        const int route = gate_route(g, mod, &callee, &first);
        if (route > 0) {
            r = run_flagged(g, callee, first, args + 1, n - 1, kwnames);
        } else if (route == 0) {
            r = torch_route(g, mod, args + 1, n - 1, kwnames);
        }
        Py_XDECREF(callee);
        Py_XDECREF(first);
    }
    Py_DECREF(mod);
    Py_DECREF(self);
    return r;
}

PyObject* gate_descr_get(PyObject* self, PyObject* obj, PyObject*) {
    // A method when read from an instance, itself from the class (as a function).
    if (obj == nullptr || obj == Py_None) return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

int gate_traverse(PyObject* self, visitproc visit, void* arg) {
    Gate* g = as_gate(self);
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(g->owner);
    Py_VISIT(g->hooks_dict);
    Py_VISIT(g->ef_dict);
    Py_VISIT(g->module_type);
    Py_VISIT(g->call);
    Py_VISIT(g->call_impl);
    return 0;
}

int gate_clear(PyObject* self) {
    Gate* g = as_gate(self);
    Py_CLEAR(g->owner);
    Py_CLEAR(g->hooks_dict);
    Py_CLEAR(g->ef_dict);
    Py_CLEAR(g->module_type);
    Py_CLEAR(g->call);
    Py_CLEAR(g->call_impl);
    return 0;
}

void gate_dealloc(PyObject* self) {
    PyTypeObject* tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    gate_clear(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

PyObject* gate_new(PyTypeObject* tp, PyObject* args, PyObject* kwargs) {
    PyObject *owner = nullptr, *hooks_module = nullptr, *eval_frame = nullptr;
    static const char* kw[] = {"owner", "hooks_module", "eval_frame", nullptr};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!OO:ModuleCall", const_cast<char**>(kw), &PyType_Type,
                                     &owner, &hooks_module, &eval_frame))
        return nullptr;
    // Plain modules: their globals are their dict's items, read and set there (ModuleType has
    // none of these names and is immutable).
    if (!PyModule_CheckExact(hooks_module) || !PyModule_CheckExact(eval_frame)) {
        PyErr_SetString(PyExc_TypeError, "ModuleCall: hooks_module and eval_frame must be modules");
        return nullptr;
    }
    // nn.Module's machinery as it is now: the caller (OptimizedModule._initialize) installs the
    // gate only after checking that these are torch's own functions, unpatched.
    PyObject* module_type = PyDict_GetItemString(PyModule_GetDict(hooks_module), "Module");  // borrowed
    if (module_type == nullptr || !PyType_Check(module_type)) {
        PyErr_SetString(PyExc_TypeError, "ModuleCall: hooks_module has no class Module");
        return nullptr;
    }
    PyObject* mdict = reinterpret_cast<PyTypeObject*>(module_type)->tp_dict;
    PyObject* call = PyDict_GetItemWithError(mdict, g_names.call);
    PyObject* call_impl = call != nullptr ? PyDict_GetItemWithError(mdict, g_names.call_impl) : nullptr;
    if (call == nullptr || call_impl == nullptr) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "ModuleCall: Module has no __call__ or _call_impl of its own");
        return nullptr;
    }
    auto* g = reinterpret_cast<Gate*>(tp->tp_alloc(tp, 0));
    if (g == nullptr) return nullptr;
    g->vectorcall = gate_call;
    g->owner = Py_NewRef(owner);
    g->hooks_dict = Py_NewRef(PyModule_GetDict(hooks_module));
    g->ef_dict = Py_NewRef(PyModule_GetDict(eval_frame));
    g->module_type = Py_NewRef(module_type);
    g->call = Py_NewRef(call);
    g->call_impl = Py_NewRef(call_impl);
    return reinterpret_cast<PyObject*>(g);
}

// The route a call of `mod` would take now ("direct", "scope" or "torch"), for the tests and
// for diagnostics: the same decision as a call's, without the call.
PyObject* gate_route_of(PyObject* self, PyObject* mod) {
    Gate* g = as_gate(self);
    PyObject* callee = nullptr;
    PyObject* first = nullptr;
    const int route = g->owner == nullptr ? 0 : gate_route(g, mod, &callee, &first);
    const char* name = route == 0 ? "torch" : first != nullptr ? "direct" : "scope";
    Py_XDECREF(callee);
    Py_XDECREF(first);
    if (route < 0) return nullptr;
    return PyUnicode_FromString(name);
}

PyMethodDef g_gate_methods[] = {
    {"route", gate_route_of, METH_O, "route(module): the route a call of module takes now."},
    {nullptr, nullptr, 0, nullptr}};

PyObject* gate_text_signature(PyObject*, void*) {
    return PyUnicode_FromString("($self, /, *args, **kwargs)");
}
PyObject* gate_name(PyObject*, void*) { return Py_NewRef(g_names.call); }

PyGetSetDef g_gate_getset[] = {
    // inspect.signature(module) reads it (the gate is a method descriptor, like a builtin's).
    {"__text_signature__", gate_text_signature, nullptr, nullptr, nullptr},
    {"__name__", gate_name, nullptr, nullptr, nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyMemberDef g_gate_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(Gate, vectorcall), READONLY, nullptr},
    {nullptr, 0, 0, 0, nullptr}};

PyType_Slot g_gate_slots[] = {
    {Py_tp_new, reinterpret_cast<void*>(gate_new)},
    {Py_tp_dealloc, reinterpret_cast<void*>(gate_dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(gate_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(gate_clear)},
    {Py_tp_call, reinterpret_cast<void*>(PyVectorcall_Call)},
    {Py_tp_descr_get, reinterpret_cast<void*>(gate_descr_get)},
    {Py_tp_getset, g_gate_getset},
    {Py_tp_members, g_gate_members},
    {Py_tp_methods, g_gate_methods},
    {Py_tp_doc, const_cast<char*>("ModuleCall(owner, hooks_module, eval_frame)\n--\n\n"
                                  "A compiled module's class __call__: the compiled scope when no module "
                                  "hook, replaced forward or JIT trace applies, else super().__call__.")},
    {0, nullptr}};

PyType_Spec g_gate_spec = {
    "tripwire._torch_adapter.ModuleCall", sizeof(Gate), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    g_gate_slots};

// -- the JIT tracer's state, as an attribute ------------------------------------------------------
// torch.compile's wrapper refuses a call made while torch.jit.trace runs. tripwire.torch.compile's
// scopes send such a call to that wrapper with a divert test, which reads an attribute path per
// call: `jit_tracer.active` is torch's thread-local tracer state (what torch._C._is_tracing()
// returns), read in C with no call into torch.
PyObject* tracer_active(PyObject*, void*) { return PyBool_FromLong(torch::jit::tracer::isTracing() ? 1 : 0); }

PyGetSetDef g_tracer_getset[] = {{"active", tracer_active, nullptr,
                                  const_cast<char*>("Whether torch.jit.trace runs in this thread."), nullptr},
                                 {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyType_Slot g_tracer_slots[] = {
    {Py_tp_getset, g_tracer_getset},
    {Py_tp_doc, const_cast<char*>("The JIT tracer's state of the calling thread (`active`).")},
    {0, nullptr}};

PyType_Spec g_tracer_spec = {"tripwire._torch_adapter.JitTracer", sizeof(PyObject), 0, Py_TPFLAGS_DEFAULT,
                             g_tracer_slots};

bool intern(PyObject** slot, const char* s) {
    *slot = PyUnicode_InternFromString(s);
    return *slot != nullptr;
}

}  // namespace

int add_compiled_module_types(PyObject* m) {
    const char* hooks[4] = {"_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks"};
    const char* global_hooks[4] = {"_global_forward_pre_hooks", "_global_forward_hooks",
                                   "_global_backward_pre_hooks", "_global_backward_hooks"};
    bool ok = intern(&g_names.fast, "_tripwire_fast") && intern(&g_names.forward, "forward") &&
              intern(&g_names.compiled_call_impl, "_compiled_call_impl") &&
              intern(&g_names.call_impl, "_call_impl") &&
              intern(&g_names.in_optimized_module, "_in_optimized_module") &&
              intern(&g_names.call, "__call__");
    for (int i = 0; ok && i < 4; ++i)
        ok = intern(&g_names.hooks[i], hooks[i]) && intern(&g_names.global_hooks[i], global_hooks[i]);
    if (!ok) return -1;
    g_state_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&g_state_spec));
    if (g_state_type == nullptr) return -1;
    if (PyModule_AddObjectRef(m, "ModuleCallState", reinterpret_cast<PyObject*>(g_state_type)) < 0) return -1;
    PyObject* tracer_type = PyType_FromSpec(&g_tracer_spec);
    if (tracer_type == nullptr) return -1;
    PyObject* tracer = PyObject_CallNoArgs(tracer_type);
    Py_DECREF(tracer_type);
    if (tracer == nullptr) return -1;
    int r = PyModule_AddObjectRef(m, "jit_tracer", tracer);
    Py_DECREF(tracer);
    if (r < 0) return -1;
    PyObject* gate = PyType_FromSpec(&g_gate_spec);
    if (gate == nullptr) return -1;
    r = PyModule_AddObjectRef(m, "ModuleCall", gate);
    Py_DECREF(gate);
    return r;
}

}  // namespace tripwire::torch_adapter
