/* tripwire/bench/floor.c -- the benchmark's floor: guard checks as a person would hand-write them
 * in C against the CPython C API.
 *
 * This is NOT part of the engine. It is the yardstick for "how fast can these checks possibly be
 * from a C extension": no inline caches, no adaptive ordering, no error reporting, no weak
 * references, no protection against user code -- just a straight walk that fetches each value
 * once into a local (a register here) and compares it.
 *
 * A Plan is built in Python (guard_eval.floor_plan) from the very same GuardSpec list the
 * GuardSet was built from: a flat list of instructions
 *
 *     (op, dst, src, arg, n)
 *
 * Fetch instructions write register `dst` from register `src` (or from f_locals); check
 * instructions test register `src`. Plan.check(f_locals) runs them in order and returns False at
 * the first failing fetch or check. The interpreter's switch is the only thing a hand-written
 * straight-line function would not have.
 *
 * Also exported: check_type_id(o, i) and check_obj_id(o, i), C versions of Dynamo's
 * ___check_type_id / ___check_obj_id helpers used by the generated Python guard function
 * ("py-fn+" column).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>

enum {
    /* fetches: reg[dst] = ... */
    OP_LOCAL = 0,    /* f_locals[arg]                  (f_locals is a dict)                     */
    OP_ATTR = 1,     /* getattr(reg[src], arg): instance __dict__ first, PyObject_GetAttr else */
    OP_DICTGET = 2,  /* reg[src][arg] for an exact dict                                         */
    OP_SEQGET = 3,   /* reg[src][n] for an exact list or tuple                                  */
    OP_INSTDICT = 4, /* reg[src].__dict__                                                       */
    OP_GETITEM = 5,  /* reg[src][arg] for anything else (PyObject_GetItem)                      */
    /* checks on reg[src] */
    OP_TYPE = 10,     /* Py_TYPE(v) == arg                                                      */
    OP_ID = 11,       /* v == arg                                                               */
    OP_EQ = 12,       /* Py_TYPE(v) == Py_TYPE(arg) && v == arg                                 */
    OP_LEN = 13,      /* len(v) == n                                                            */
    OP_KEYS = 14,     /* dict v has exactly the keys of tuple arg, in that order                */
    OP_CONTAINS = 15, /* (arg in dict v) == n                                                   */
    OP_HASATTR = 16,  /* hasattr(v, arg) == n                                                   */
    OP_ARRAY = 17,    /* numpy array v: type arg[0], dtype arg[1] (by pointer), the rank, sizes,
                         strides and flags packed in arg[2] (int64: ndim, required flag bits,
                         writeable, sizes..., strides...; LLONG_MIN = unchecked)                */
};

/* The fields of numpy's PyArrayObject_fields that ARRAY_MATCH reads (numpy/ndarraytypes.h; the
 * layout is numpy's public ABI, the same in numpy 1.x and 2.x). */
typedef struct {
    PyObject_HEAD
    char *data;
    int nd;
    Py_ssize_t *dimensions;
    Py_ssize_t *strides;
    PyObject *base;
    PyObject *descr;
    int flags;
} FloorArray;

enum { NPY_C_CONTIGUOUS = 0x1, NPY_F_CONTIGUOUS = 0x2, NPY_ALIGNED = 0x100, NPY_WRITEABLE = 0x400 };

static int array_match(PyObject *v, PyObject *arg) {
    if ((PyObject *)Py_TYPE(v) != PyTuple_GET_ITEM(arg, 0)) return 0;
    const FloorArray *a = (const FloorArray *)v;
    if (a->descr != PyTuple_GET_ITEM(arg, 1)) return 0;
    const long long *w = (const long long *)PyBytes_AS_STRING(PyTuple_GET_ITEM(arg, 2));
    const int nd = (int)w[0];
    if (a->nd != nd) return 0;
    for (int i = 0; i < nd; ++i) {
        if (w[3 + i] != LLONG_MIN && w[3 + i] != a->dimensions[i]) return 0;
        if (w[3 + nd + i] != LLONG_MIN && w[3 + nd + i] != a->strides[i]) return 0;
    }
    int bits = 0;
    if (a->flags & NPY_C_CONTIGUOUS) bits |= 1;
    if (a->flags & NPY_F_CONTIGUOUS) bits |= 2;
    if (a->flags & NPY_ALIGNED) bits |= 4;
    return (bits & w[1]) == w[1] && ((a->flags & NPY_WRITEABLE) != 0) == (w[2] != 0);
}

typedef struct {
    int op;
    int dst;
    int src;
    PyObject *arg; /* strong reference, owned by the plan */
    Py_ssize_t n;
} Insn;

typedef struct {
    PyObject_HEAD
    Insn *code;
    Py_ssize_t ncode;
    Py_ssize_t nregs;
    Py_ssize_t nchecks;
    PyObject **regs;  /* scratch registers (borrowed values during a check) */
    PyObject **owned; /* new references from the rare generic getattr/getitem path */
} Plan;

static int eq_const(PyObject *v, PyObject *c) {
    if (Py_TYPE(v) != Py_TYPE(c)) return 0;
    if (v == c) return 1;
    if (PyFloat_CheckExact(v)) {
        const double x = PyFloat_AS_DOUBLE(v), y = PyFloat_AS_DOUBLE(c);
        return x == y || (x != x && y != y);
    }
    return PyObject_RichCompareBool(v, c, Py_EQ);
}

static int keys_match(PyObject *v, PyObject *keys) {
    if (!PyDict_Check(v)) return 0;
    const Py_ssize_t n = PyTuple_GET_SIZE(keys);
    if (PyDict_GET_SIZE(v) != n) return 0;
    Py_ssize_t pos = 0, i = 0;
    PyObject *k, *x;
    while (PyDict_Next(v, &pos, &k, &x)) {
        PyObject *want = PyTuple_GET_ITEM(keys, i++);
        if (k == want) continue;
        const int r = eq_const(k, want);
        if (r != 1) return r;
    }
    return 1;
}

static PyObject *plan_check(Plan *self, PyObject *f_locals) {
    if (!PyDict_Check(f_locals)) {
        PyErr_SetString(PyExc_TypeError, "f_locals must be a dict");
        return NULL;
    }
    PyObject **R = self->regs;
    Py_ssize_t nowned = 0;
    int ok = 1;
    const Insn *ip = self->code, *end = self->code + self->ncode;
    for (; ok == 1 && ip < end; ++ip) {
        PyObject *v;
        switch (ip->op) {
            case OP_LOCAL:
                v = PyDict_GetItemWithError(f_locals, ip->arg);
                if (v == NULL) ok = PyErr_Occurred() ? -1 : 0;
                R[ip->dst] = v;
                break;
            case OP_ATTR: {
                PyObject *o = R[ip->src];
                PyObject **dp = _PyObject_GetDictPtr(o);
                v = (dp != NULL && *dp != NULL) ? PyDict_GetItemWithError(*dp, ip->arg) : NULL;
                if (v == NULL) {
                    if (PyErr_Occurred()) {
                        ok = -1;
                        break;
                    }
                    v = PyObject_GetAttr(o, ip->arg);
                    if (v == NULL) {
                        ok = PyErr_ExceptionMatches(PyExc_AttributeError) ? (PyErr_Clear(), 0) : -1;
                        break;
                    }
                    self->owned[nowned++] = v;
                }
                R[ip->dst] = v;
                break;
            }
            case OP_DICTGET: {
                PyObject *d = R[ip->src];
                if (!PyDict_CheckExact(d)) {
                    v = PyObject_GetItem(d, ip->arg);
                    if (v == NULL) {
                        ok = PyErr_ExceptionMatches(PyExc_KeyError) ? (PyErr_Clear(), 0) : -1;
                        break;
                    }
                    self->owned[nowned++] = v;
                } else {
                    v = PyDict_GetItemWithError(d, ip->arg);
                    if (v == NULL) {
                        ok = PyErr_Occurred() ? -1 : 0;
                        break;
                    }
                }
                R[ip->dst] = v;
                break;
            }
            case OP_SEQGET: {
                PyObject *s = R[ip->src];
                if (PyList_CheckExact(s)) {
                    if (ip->n >= PyList_GET_SIZE(s)) {
                        ok = 0;
                        break;
                    }
                    R[ip->dst] = PyList_GET_ITEM(s, ip->n);
                } else if (PyTuple_CheckExact(s)) {
                    if (ip->n >= PyTuple_GET_SIZE(s)) {
                        ok = 0;
                        break;
                    }
                    R[ip->dst] = PyTuple_GET_ITEM(s, ip->n);
                } else {
                    v = PySequence_GetItem(s, ip->n);
                    if (v == NULL) {
                        PyErr_Clear();
                        ok = 0;
                        break;
                    }
                    self->owned[nowned++] = v;
                    R[ip->dst] = v;
                }
                break;
            }
            case OP_INSTDICT: {
                PyObject **dp = _PyObject_GetDictPtr(R[ip->src]);
                if (dp == NULL || *dp == NULL) {
                    ok = PyErr_Occurred() ? -1 : 0;
                    break;
                }
                R[ip->dst] = *dp;
                break;
            }
            case OP_GETITEM:
                v = PyObject_GetItem(R[ip->src], ip->arg);
                if (v == NULL) {
                    PyErr_Clear();
                    ok = 0;
                    break;
                }
                self->owned[nowned++] = v;
                R[ip->dst] = v;
                break;
            case OP_TYPE:
                ok = (PyObject *)Py_TYPE(R[ip->src]) == ip->arg;
                break;
            case OP_ID:
                ok = R[ip->src] == ip->arg;
                break;
            case OP_EQ:
                ok = eq_const(R[ip->src], ip->arg);
                break;
            case OP_LEN: {
                PyObject *o = R[ip->src];
                Py_ssize_t n;
                if (PyList_CheckExact(o) || PyTuple_CheckExact(o)) n = Py_SIZE(o);
                else if (PyDict_CheckExact(o)) n = PyDict_GET_SIZE(o);
                else n = PyObject_Size(o);
                ok = n < 0 ? -1 : n == ip->n;
                break;
            }
            case OP_KEYS:
                ok = keys_match(R[ip->src], ip->arg);
                break;
            case OP_CONTAINS: {
                PyObject *d = R[ip->src];
                if (!PyDict_Check(d)) {
                    ok = 0;
                    break;
                }
                const int r = PyDict_Contains(d, ip->arg);
                ok = r < 0 ? -1 : (r == ip->n);
                break;
            }
            case OP_HASATTR: {
                const int r = PyObject_HasAttr(R[ip->src], ip->arg);
                ok = r == ip->n;
                break;
            }
            case OP_ARRAY:
                ok = array_match(R[ip->src], ip->arg);
                break;
            default:
                ok = 0;
        }
    }
    while (nowned > 0) Py_DECREF(self->owned[--nowned]);
    if (ok < 0) {
        /* Like a guard: an exception while checking is a failure. */
        if (!PyErr_ExceptionMatches(PyExc_Exception)) return NULL;
        PyErr_Clear();
        ok = 0;
    }
    return PyBool_FromLong(ok);
}

static void plan_dealloc(Plan *self) {
    for (Py_ssize_t i = 0; i < self->ncode; ++i) Py_XDECREF(self->code[i].arg);
    PyMem_Free(self->code);
    PyMem_Free(self->regs);
    PyMem_Free(self->owned);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int is_fetch(int op) { return op < 10; }

static PyObject *plan_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *insns;
    static char *kwlist[] = {"insns", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!", kwlist, &PyList_Type, &insns)) return NULL;
    Plan *self = (Plan *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    const Py_ssize_t n = PyList_GET_SIZE(insns);
    self->code = PyMem_Calloc(n ? n : 1, sizeof(Insn));
    if (self->code == NULL) goto nomem;
    Py_ssize_t nregs = 1;
    for (Py_ssize_t i = 0; i < n; ++i) {
        Insn *in = &self->code[i];
        PyObject *arg = NULL;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(insns, i), "iiiOn", &in->op, &in->dst, &in->src, &arg, &in->n)) {
            Py_DECREF(self);
            return NULL;
        }
        Py_INCREF(arg);
        in->arg = arg;
        self->ncode = i + 1;
        if (in->dst < 0 || in->src < 0) {
            PyErr_SetString(PyExc_ValueError, "negative register");
            Py_DECREF(self);
            return NULL;
        }
        if (in->op == OP_KEYS && !PyTuple_Check(arg)) {
            PyErr_SetString(PyExc_TypeError, "OP_KEYS needs a tuple");
            Py_DECREF(self);
            return NULL;
        }
        if (in->op == OP_ARRAY && !(PyTuple_Check(arg) && PyTuple_GET_SIZE(arg) == 3 &&
                                    PyBytes_Check(PyTuple_GET_ITEM(arg, 2)))) {
            PyErr_SetString(PyExc_TypeError, "OP_ARRAY needs (type, dtype, packed int64 bytes)");
            Py_DECREF(self);
            return NULL;
        }
        if (in->dst + 1 > nregs) nregs = in->dst + 1;
        if (in->src + 1 > nregs) nregs = in->src + 1;
        if (!is_fetch(in->op)) self->nchecks++;
    }
    self->nregs = nregs;
    self->regs = PyMem_Calloc(nregs, sizeof(PyObject *));
    self->owned = PyMem_Calloc(n ? n : 1, sizeof(PyObject *));
    if (self->regs == NULL || self->owned == NULL) goto nomem;
    return (PyObject *)self;
nomem:
    Py_DECREF(self);
    return PyErr_NoMemory();
}

static PyObject *plan_get_nchecks(Plan *self, void *closure) {
    (void)closure;
    return PyLong_FromSsize_t(self->nchecks);
}

static PyObject *plan_get_ncode(Plan *self, void *closure) {
    (void)closure;
    return PyLong_FromSsize_t(self->ncode);
}

static PyMethodDef plan_methods[] = {
    {"check", (PyCFunction)plan_check, METH_O, "check(f_locals) -> bool: run the plan."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef plan_getset[] = {
    {"check_count", (getter)plan_get_nchecks, NULL, "number of check instructions (= guards)", NULL},
    {"insn_count", (getter)plan_get_ncode, NULL, "number of instructions (fetches + checks)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_floor.Plan",
    .tp_basicsize = sizeof(Plan),
    .tp_dealloc = (destructor)plan_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Plan(insns): hand-written-style guard checks; see bench/floor.c.",
    .tp_methods = plan_methods,
    .tp_getset = plan_getset,
    .tp_new = plan_new,
};

/* Dynamo's ___check_type_id / ___check_obj_id, as C functions. */
static PyObject *check_type_id(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    (void)mod;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "check_type_id(obj, id)");
        return NULL;
    }
    void *want = PyLong_AsVoidPtr(args[1]);
    if (want == NULL && PyErr_Occurred()) return NULL;
    return PyBool_FromLong((void *)Py_TYPE(args[0]) == want);
}

static PyObject *check_obj_id(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    (void)mod;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "check_obj_id(obj, id)");
        return NULL;
    }
    void *want = PyLong_AsVoidPtr(args[1]);
    if (want == NULL && PyErr_Occurred()) return NULL;
    return PyBool_FromLong((void *)args[0] == want);
}

static PyObject *noop(PyObject *mod, PyObject *arg) {
    (void)mod;
    (void)arg;
    Py_RETURN_TRUE;
}

/* repeat_call(fn, arg, n): call fn(arg) n times from C; returns the last result. Lets callgrind
 * (--toggle-collect=tw_bench_repeat_call) count exactly the instructions of n checks, and gives a
 * timing loop with less overhead than timeit's Python for-loop. */
/* Exported (not static) so its name survives the stripped install and callgrind can find it. */
PyAPI_FUNC(PyObject *) tw_bench_repeat_call(PyObject *mod, PyObject *const *args, Py_ssize_t nargs);
PyObject *tw_bench_repeat_call(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    (void)mod;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "repeat_call(fn, arg, n)");
        return NULL;
    }
    const Py_ssize_t n = PyLong_AsSsize_t(args[2]);
    if (n < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "n must be >= 0");
        return NULL;
    }
    PyObject *fn = args[0], *arg = args[1];
    PyObject *last = Py_NewRef(Py_None);
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject *r = PyObject_CallOneArg(fn, arg);
        if (r == NULL) {
            Py_DECREF(last);
            return NULL;
        }
        Py_SETREF(last, r);
    }
    return last;
}

/* repeat_vectorcall(fn, args, n): call fn(*args) n times from C (a vectorcall of the tuple's items):
 * the instructions of n calls of a several-argument function (callgrind:
 * --toggle-collect=tw_bench_repeat_vectorcall). */
PyAPI_FUNC(PyObject *) tw_bench_repeat_vectorcall(PyObject *mod, PyObject *const *args, Py_ssize_t nargs);
PyObject *tw_bench_repeat_vectorcall(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    (void)mod;
    if (nargs != 3 || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "repeat_vectorcall(fn, args: tuple, n)");
        return NULL;
    }
    const Py_ssize_t n = PyLong_AsSsize_t(args[2]);
    if (n < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "n must be >= 0");
        return NULL;
    }
    PyObject *fn = args[0], *tup = args[1];
    PyObject *const *items = &PyTuple_GET_ITEM(tup, 0);
    const size_t k = (size_t)PyTuple_GET_SIZE(tup);
    PyObject *last = Py_NewRef(Py_None);
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject *r = PyObject_Vectorcall(fn, items, k, NULL);
        if (r == NULL) {
            Py_DECREF(last);
            return NULL;
        }
        Py_SETREF(last, r);
    }
    return last;
}

/* repeat_call_each(fn, args: list, rounds): call fn(a) for each a of the list, `rounds` times
 * (callgrind: --toggle-collect=tw_bench_repeat_call_each): inputs that cycle. */
PyAPI_FUNC(PyObject *) tw_bench_repeat_call_each(PyObject *mod, PyObject *const *args, Py_ssize_t nargs);
PyObject *tw_bench_repeat_call_each(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    (void)mod;
    if (nargs != 3 || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "repeat_call_each(fn, args: list, rounds)");
        return NULL;
    }
    const Py_ssize_t rounds = PyLong_AsSsize_t(args[2]);
    if (rounds < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "rounds must be >= 0");
        return NULL;
    }
    PyObject *fn = args[0], *lst = args[1];
    PyObject *last = Py_NewRef(Py_None);
    for (Py_ssize_t r = 0; r < rounds; ++r) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(lst); ++i) {
            PyObject *res = PyObject_CallOneArg(fn, PyList_GET_ITEM(lst, i));
            if (res == NULL) {
                Py_DECREF(last);
                return NULL;
            }
            Py_SETREF(last, res);
        }
    }
    return last;
}

/* start_instrumentation(): valgrind --tool=callgrind --instr-atstart=no runs the set-up (importing
 * and compiling torch) uninstrumented, several times faster; this turns instrumentation on before
 * the measured loops (collection is still toggled by --toggle-collect). A no-op outside valgrind or
 * without valgrind's headers. */
#if defined(__has_include)
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define TW_HAVE_CALLGRIND 1
#endif
#endif
static PyObject *start_instrumentation(PyObject *mod, PyObject *unused) {
    (void)mod;
    (void)unused;
#ifdef TW_HAVE_CALLGRIND
    CALLGRIND_START_INSTRUMENTATION;
#endif
    Py_RETURN_NONE;
}

/* toggle_collect(): switch callgrind's event collection off or back on inside a measured call, for
 * a set-up step that must not count (bench/shape_build_instructions.py: emptying the memos before a
 * cold build). Called in pairs. A no-op outside valgrind or without valgrind's headers. */
static PyObject *toggle_collect(PyObject *mod, PyObject *unused) {
    (void)mod;
    (void)unused;
#ifdef TW_HAVE_CALLGRIND
    CALLGRIND_TOGGLE_COLLECT;
#endif
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"start_instrumentation", start_instrumentation, METH_NOARGS,
     "start_instrumentation(): turn callgrind's instrumentation on (--instr-atstart=no)."},
    {"toggle_collect", toggle_collect, METH_NOARGS,
     "toggle_collect(): switch callgrind's event collection off, or back on (in pairs)."},
    {"repeat_call", (PyCFunction)(void (*)(void))tw_bench_repeat_call, METH_FASTCALL,
     "repeat_call(fn, arg, n): call fn(arg) n times from C, return the last result."},
    {"repeat_vectorcall", (PyCFunction)(void (*)(void))tw_bench_repeat_vectorcall, METH_FASTCALL,
     "repeat_vectorcall(fn, args, n): call fn(*args) n times from C, return the last result."},
    {"repeat_call_each", (PyCFunction)(void (*)(void))tw_bench_repeat_call_each, METH_FASTCALL,
     "repeat_call_each(fn, args, rounds): call fn(a) for each a of list args, rounds times."},
    {"check_type_id", (PyCFunction)(void (*)(void))check_type_id, METH_FASTCALL, "id(type(obj)) == id"},
    {"check_obj_id", (PyCFunction)(void (*)(void))check_obj_id, METH_FASTCALL, "id(obj) == id"},
    {"noop", noop, METH_O, "noop(x) -> True: the cost of calling a C function with one argument."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef floor_module = {
    PyModuleDef_HEAD_INIT, "_floor",
    "Benchmark floor: hand-written C guard checks (see bench/floor.c). Not part of the engine.", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__floor(void) {
    if (PyType_Ready(&PlanType) < 0) return NULL;
    PyObject *m = PyModule_Create(&floor_module);
    if (m == NULL) return NULL;
    Py_INCREF(&PlanType);
    if (PyModule_AddObject(m, "Plan", (PyObject *)&PlanType) < 0) {
        Py_DECREF(&PlanType);
        Py_DECREF(m);
        return NULL;
    }
#define ADD(name) PyModule_AddIntConstant(m, #name, name)
    if (ADD(OP_LOCAL) || ADD(OP_ATTR) || ADD(OP_DICTGET) || ADD(OP_SEQGET) || ADD(OP_INSTDICT) || ADD(OP_GETITEM) ||
        ADD(OP_TYPE) || ADD(OP_ID) || ADD(OP_EQ) || ADD(OP_LEN) || ADD(OP_KEYS) || ADD(OP_CONTAINS) ||
        ADD(OP_HASATTR) || ADD(OP_ARRAY)) {
        Py_DECREF(m);
        return NULL;
    }
#undef ADD
    return m;
}
