// tripwire/cpp/runtime/eval/guard_kinds.cpp -- the guard kinds of the catalogue, on live objects.
#include "runtime/eval/guard_kinds.hpp"

#include <unordered_map>
#include <vector>

#include "runtime/eval/dict_hint.hpp"
#include "runtime/tensors/readers.hpp"
#include "runtime/tensors/tensor_kinds.hpp"
#include "runtime/tensors/torch_state.hpp"

namespace tripwire::runtime {

bool builtin_length(PyObject* v, Py_ssize_t& n) {
    PyTypeObject* t = Py_TYPE(v);
    if (t == &PyList_Type || t == &PyTuple_Type || t == &PyBytes_Type || t == &PyByteArray_Type) {
        n = Py_SIZE(v);
        return true;
    }
    // collections.OrderedDict (torch's hook dicts) is the interpreter's own immutable C type and
    // inherits dict's length: the size of its dict storage.
    if (t == &PyDict_Type || t == &PyODict_Type) {
        n = PyDict_GET_SIZE(v);
        return true;
    }
    if (t == &PyUnicode_Type) {
#if PY_VERSION_HEX < 0x030C0000
        if (PyUnicode_READY(v) < 0) {  // legacy (deprecated) strings only; never user code
            PyErr_Clear();
            return false;
        }
#endif
        n = PyUnicode_GET_LENGTH(v);
        return true;
    }
    if (t == &PySet_Type || t == &PyFrozenSet_Type) {
        n = PySet_GET_SIZE(v);
        return true;
    }
    return false;
}

bool small_str_set(PyObject* s) {
#ifdef Py_GIL_DISABLED
    (void)s;
    return false;  // the table is read under the set's lock there
#else
    if (!PySet_CheckExact(s) && !PyFrozenSet_CheckExact(s)) return false;
    auto* so = reinterpret_cast<PySetObject*>(s);
    if (so->used == 0) return true;
    if (so->mask + 1 > kSetScanLimit) return false;
    for (Py_ssize_t i = 0; i <= so->mask; ++i) {
        // Anything but an exact str (a user object, whose __eq__ a real lookup may call) is the
        // set's to answer. A dummy left by a removal is refused too (the walk decides such a
        // set): the scan needs the raw table, as set_next (py.hpp) skips dummies.
        PyObject* k = so->table[i].key;
        if (k != nullptr && !PyUnicode_CheckExact(k)) return false;
    }
    return true;
#endif
}

bool small_str_set_has(PyObject* s, PyObject* item) {
#ifdef Py_GIL_DISABLED
    (void)s;
    (void)item;
    return false;
#else
    // An exact str's hash is computed in C and cached (nothing runs, nothing is allocated): an
    // item whose hash was never asked must still find its equal key.
    Py_hash_t h = PyObject_Hash(item);
    if (h == -1) PyErr_Clear();
    Py_ssize_t pos = 0;
    PyObject* k = nullptr;
    while (set_next(s, &pos, &k)) {
        const Py_hash_t hk = reinterpret_cast<PyASCIIObject*>(k)->hash;
        if (k == item || ((h == -1 || hk == -1 || hk == h) && PyUnicode_Compare(k, item) == 0)) return true;
    }
    return false;
#endif
}

int set_contains_pure(const RuntimeGuard& g, PyObject* v) {
    if (!PyUnicode_CheckExact(g.a) || !small_str_set(v)) return -1;
    return small_str_set_has(v, g.a) == g.flag ? 1 : 0;
}

namespace {

using core::GuardKind;

int length_of(PyObject* v, Py_ssize_t* out) {
    if (builtin_length(v, *out)) return 1;
    const Py_ssize_t n = PyObject_Size(v);  // user __len__ may run, lie or raise
    if (n < 0) return -1;
    *out = n;
    return 1;
}

int dict_keys_match(PyObject* v, PyObject* keys, bool ordered) {
    if (!PyDict_Check(v)) return 0;
    const Py_ssize_t n = PyTuple_GET_SIZE(keys);
    if (PyDict_GET_SIZE(v) != n) return 0;
    if (dict_keys_identical(v, keys) == 1) return 1;
    // Walk the dict's own storage: an overridden keys() is never called, and nothing is
    // allocated (docs/cpp.md, "Regions without user code").
    Py_ssize_t pos = 0, i = 0;
    PyObject *k, *x;
    while (i < n && PyDict_Next(v, &pos, &k, &x)) {
        const int r = equals_match(k, PyTuple_GET_ITEM(keys, i));
        if (r < 0) return -1;
        if (r == 0) break;
        ++i;
    }
    if (i == n) return 1;
    if (ordered) return 0;
    // Set-equal: a one-to-one matching of expected keys to actual keys (several NaN keys are
    // several keys; equals_match is an equivalence, so greedy pairing finds a matching if any).
    std::vector<unsigned char> used(static_cast<std::size_t>(n), 0);
    for (Py_ssize_t e = 0; e < n; ++e) {
        bool found = false;
        pos = 0;
        for (Py_ssize_t j = 0; !found && PyDict_Next(v, &pos, &k, &x); ++j) {
            if (used[static_cast<std::size_t>(j)]) continue;
            const int q = equals_match(k, PyTuple_GET_ITEM(keys, e));
            if (q < 0) return -1;
            if (q == 1) {
                used[static_cast<std::size_t>(j)] = 1;
                found = true;
            }
        }
        if (!found) return 0;
    }
    return 1;
}

int range_iterator_match(PyObject* v, PyObject* expected) {
    if (Py_TYPE(v) != &PyRangeIter_Type) return 0;
    // range_iterator's fields are private; its __reduce__ is the interpreter's own C code and
    // gives (iter, (range,), position): the whole range and the position on 3.11, the remaining
    // range and None on 3.12+.
    PyObject* red = PyObject_CallMethod(v, "__reduce__", nullptr);
    if (red == nullptr) return -1;
    int r = 0;
    if (PyTuple_Check(red) && PyTuple_GET_SIZE(red) == 3 && PyTuple_Check(PyTuple_GET_ITEM(red, 1)) &&
        PyTuple_GET_SIZE(PyTuple_GET_ITEM(red, 1)) == 1) {
        PyObject* rng = PyTuple_GET_ITEM(PyTuple_GET_ITEM(red, 1), 0);
        PyObject* position = PyTuple_GET_ITEM(red, 2);
        const Py_ssize_t pos = position == Py_None ? 0 : PyLong_AsSsize_t(position);
        if (pos == -1 && PyErr_Occurred()) {
            r = -1;
        } else {
            PyObject* rest = PySequence_GetSlice(rng, pos, PY_SSIZE_T_MAX);
            r = rest ? PyObject_RichCompareBool(rest, expected, Py_EQ) : -1;
            Py_XDECREF(rest);
        }
    }
    Py_DECREF(red);
    return r;
}

int code_match(PyObject* v, PyObject* code) {
    if (PyFunction_Check(v)) return PyFunction_GET_CODE(v) == code ? 1 : 0;
    static PyObject* name = PyUnicode_InternFromString("__code__");
    PyObject* c = PyObject_GetAttr(v, name);
    if (c == nullptr) return -1;
    const int r = c == code ? 1 : 0;
    Py_DECREF(c);
    return r;
}

int call_predicate(PyObject* fn, PyObject* v) {
    PyObject* res = PyObject_CallOneArg(fn, v);
    if (res == nullptr) return -1;
    const int r = PyObject_IsTrue(res);
    Py_DECREF(res);
    return r;
}

int global_state(const RuntimeGuard& g) {
    if (g.a == nullptr) {
        const auto probe = static_cast<core::BuiltinProbe>(g.n);
        if (core::builtin_probe_reads_framework(probe)) return torch_probe_matches(g);
        return builtin_probe(probe) == g.n2 ? 1 : 0;
    }
    PyObject* now = PyObject_CallNoArgs(g.a);
    if (now == nullptr) return -1;
    const int r = equals_match(now, g.b);
    Py_DECREF(now);
    return r;
}

}  // namespace

std::int64_t builtin_probe(core::BuiltinProbe p) {
    switch (p) {
        case core::BuiltinProbe::RecursionLimit: return Py_GetRecursionLimit();
        case core::BuiltinProbe::GcEnabled: return PyGC_IsEnabled();
        default: return -1;  // framework probes have structured snapshots (torch_state.hpp)
    }
}

Ref builtin_probe_value(core::BuiltinProbe p) {
    if (core::builtin_probe_reads_framework(p)) return torch_probe_value(p, torch_adapter() != nullptr);
    const std::int64_t v = builtin_probe(p);
    if (p == core::BuiltinProbe::GcEnabled) return Ref::borrow(v ? Py_True : Py_False);
    return Ref::steal(PyLong_FromLongLong(v));
}

namespace {

// -- one evaluator per kind: the kind table's EVAL column names it ------------------------------

inline int eval_type_match(const RuntimeGuard& g, PyObject* v) {
    return reinterpret_cast<PyObject*>(Py_TYPE(v)) == g.a ? 1 : 0;
}
inline int eval_id_match(const RuntimeGuard& g, PyObject* v) { return v == g.a ? 1 : 0; }
inline int eval_none(const RuntimeGuard&, PyObject* v) { return v == Py_None ? 1 : 0; }
inline int eval_not_none(const RuntimeGuard&, PyObject* v) { return v != Py_None ? 1 : 0; }
inline int eval_true(const RuntimeGuard&, PyObject* v) { return v == Py_True ? 1 : 0; }
inline int eval_false(const RuntimeGuard&, PyObject* v) { return v == Py_False ? 1 : 0; }
inline int eval_equals_match(const RuntimeGuard& g, PyObject* v) {
    return g.flag ? python_equals(v, g.a) : equals_match(v, g.a);
}
inline int eval_length(const RuntimeGuard& g, PyObject* v) {
    Py_ssize_t n = 0;
    const int r = length_of(v, &n);
    return r < 0 ? -1 : (n == g.n ? 1 : 0);
}
inline int eval_dict_keys(const RuntimeGuard& g, PyObject* v) { return dict_keys_match(v, g.b, g.flag); }
inline int eval_dict_contains(const RuntimeGuard& g, PyObject* v) {
    if (!PyDict_Check(v)) return 0;
    const int r = PyDict_Contains(v, g.a);
    return r < 0 ? -1 : ((r == 1) == g.flag ? 1 : 0);
}
// torch's SET_CONTAINS leaf: any set or frozenset, subclasses included, looked up in its own table
// (PySet_Contains: a subclass's __contains__ is not asked). A colliding element's __eq__ may run and
// raise, or mutate the set (CPython then restarts the lookup or raises): an error fails the guard.
// torch's leaf folds PySet_Contains's -1 into "contains" and returns with the error still set (its
// check then raises SystemError). Not a set: fails in either sense (torch's "not in" passes it).
inline int eval_set_contains(const RuntimeGuard& g, PyObject* v) {
    if (!PyAnySet_Check(v)) return 0;
    const int r = PySet_Contains(v, g.a);
    return r < 0 ? -1 : ((r == 1) == g.flag ? 1 : 0);
}
inline int eval_has_attr(const RuntimeGuard& g, PyObject* v) {
    // The walk answers with hasattr itself; it also fills the fast op's cache for this type
    // (a fill may run user code: only here), whose answer the fast pass then uses.
    if (g.absence != nullptr && !attr_cache_valid(g.absence->attr, Py_TYPE(v))) {
        Py_INCREF(v);  // user code in the fill may drop the caller's reference
        (void)attribute_certainly_absent(g.absence->attr, g.absence->absent, v, g.a);
        const bool failed = PyErr_Occurred() != nullptr;
        Py_DECREF(v);
        if (failed) return -1;
    }
    PyObject* found = nullptr;
#if PY_VERSION_HEX >= 0x030D0000
    const int r = PyObject_GetOptionalAttr(v, g.a, &found);
#else
    const int r = _PyObject_LookupAttr(v, g.a, &found);
#endif
    Py_XDECREF(found);
    return r < 0 ? -1 : ((r == 1) == g.flag ? 1 : 0);
}
inline int eval_dict_version(const RuntimeGuard& g, PyObject* v) {
    // Stamp 0 (a dict that cannot be versioned) never matches: dict_version_match.
    return dict_version_match(v, static_cast<std::uint64_t>(g.n), g.watch) ? 1 : 0;
}
inline int eval_tuple_iterator_len(const RuntimeGuard& g, PyObject* v) {
    if (Py_TYPE(v) != &PyTupleIter_Type) return 0;
    const Py_ssize_t n = PyObject_LengthHint(v, -1);
    return n < 0 ? (PyErr_Occurred() ? -1 : 0) : (n == g.n ? 1 : 0);
}
inline int eval_range_iterator(const RuntimeGuard& g, PyObject* v) { return range_iterator_match(v, g.a); }
inline int eval_code_match(const RuntimeGuard& g, PyObject* v) { return code_match(v, g.a); }
inline int eval_weakref_alive(const RuntimeGuard&, PyObject* v) {
    return PyWeakref_CheckRef(v) && PyWeakref_GetObject(v) != Py_None ? 1 : 0;
}
inline int eval_global_state(const RuntimeGuard& g, PyObject*) { return global_state(g); }
inline int eval_lambda(const RuntimeGuard& g, PyObject* v) { return call_predicate(g.a, v); }
inline int eval_tensor_match(const RuntimeGuard& g, PyObject* v) { return tensor_match(g, v); }
inline int eval_array_match(const RuntimeGuard& g, PyObject* v) { return array_match(g, v); }
inline int eval_dimension_marking(const RuntimeGuard& g, PyObject* v) { return dimension_marking(g, v); }
inline int eval_dispatch_key_set_match(const RuntimeGuard& g, PyObject* v) {
    return dispatch_key_set_match(g, v);
}
// Relational kinds and SHAPE: decided by the GuardSet from the values of all their sources, never
// on one value.
inline int eval_decided_by_set(const RuntimeGuard&, PyObject*) { return 0; }

}  // namespace

int eval_guard(const RuntimeGuard& g, PyObject* v) {
    switch (g.kind) {
#define TRIPWIRE_X(Name, value, name, source, operand, operand2, user_code, relational, implied, record, \
                   payload, fast, eval, ...)                                                             \
    case GuardKind::Name: return eval(g, v);
        TRIPWIRE_GUARD_KINDS(TRIPWIRE_X)
#undef TRIPWIRE_X
    }
    return 0;
}

// -- dict stamps ----------------------------------------------------------------------------------
#if PY_VERSION_HEX >= 0x030C0000
namespace {
// 3.12+: ma_version_tag is deprecated (and gone in 3.14). One dict watcher gives every watched dict
// a stamp from one global counter and re-stamps it on any event, so stamps never repeat; the same
// watcher sets the change flags of the DICT_VERSION guards armed on the dict (DictWatch). CPython
// allows 8 dict watchers per interpreter: this is tripwire's only one.
struct Watched {
    std::uint64_t stamp = 0;
    std::vector<DictWatch*> armed;  ///< flags to set on the next event, then forgotten
};
std::unordered_map<PyObject*, Watched>* g_stamps = nullptr;
std::uint64_t g_next_stamp = 1;
int g_watcher_id = -1;

int on_dict_event(PyDict_WatchEvent event, PyObject* dict, PyObject*, PyObject*) {
    auto it = g_stamps->find(dict);
    if (it == g_stamps->end()) return 0;
    for (DictWatch* w : it->second.armed) w->dirty = true;
    it->second.armed.clear();
    if (event == PyDict_EVENT_DEALLOCATED) {
        g_stamps->erase(it);  // a new dict at this address gets a fresh stamp
    } else {
        it->second.stamp = g_next_stamp++;
    }
    return 0;
}

void unregister(DictWatch* w) {
    auto it = g_stamps->find(w->dict);
    if (it == g_stamps->end()) return;
    auto& armed = it->second.armed;
    for (std::size_t i = 0; i < armed.size(); ++i) {
        if (armed[i] == w) {
            armed[i] = armed.back();
            armed.pop_back();
            break;
        }
    }
}
}  // namespace

bool init_dict_stamps() {
    if (g_watcher_id >= 0) return true;
    g_stamps = new std::unordered_map<PyObject*, Watched>();  // lives until process exit
    g_watcher_id = PyDict_AddWatcher(on_dict_event);
    return g_watcher_id >= 0;
}

std::uint64_t dict_stamp(PyObject* d) {
    // 3.13: a dict embedded in its object (materialised over the inline values) sees attribute
    // stores only through the values: no watcher event fires. It cannot be versioned.
    if (dict_embedded(d)) return 0;
    auto it = g_stamps->find(d);
    if (it != g_stamps->end()) return it->second.stamp;
    if (PyDict_Watch(g_watcher_id, d) < 0) {
        PyErr_Clear();
        return 0;  // 0 is never a valid stamp, so the guard fails
    }
    const std::uint64_t s = g_next_stamp++;
    (*g_stamps)[d].stamp = s;
    return s;
}

bool dict_version_match(PyObject* v, std::uint64_t stamp, DictWatch* watch) {
    // Armed: `v` is the dict it passed on, unchanged and alive (any event, its deallocation
    // included, sets `dirty`), so the stamp it passed with still holds.
    if (watch != nullptr && v == watch->dict) return !watch->dirty;
    if (!PyDict_CheckExact(v)) return false;
    const std::uint64_t s = dict_stamp(v);  // 0: cannot be versioned (3.13 embedded), never holds
    if (s == 0 || s != stamp) return false;
    if (watch != nullptr) {
        // Passed by its stamp: arm the flag on this dict (moving it from the dict it was armed on).
        if (watch->dict != nullptr && !watch->dirty) unregister(watch);
        auto it = g_stamps->find(v);  // present: dict_stamp watched it
        it->second.armed.push_back(watch);
        watch->dict = v;
        watch->dirty = false;
    }
    return true;
}

void release_dict_watch(DictWatch* watch) {
    if (g_stamps != nullptr && watch->dict != nullptr && !watch->dirty) unregister(watch);
    watch->dict = nullptr;
    watch->dirty = true;
}

void dict_watch_counts(std::size_t& dicts, std::size_t& armed) {
    dicts = g_stamps != nullptr ? g_stamps->size() : 0;
    armed = 0;
    if (g_stamps != nullptr)
        for (const auto& [d, w] : *g_stamps) armed += w.armed.size();
}
#else
bool init_dict_stamps() { return true; }

std::uint64_t dict_stamp(PyObject* d) {
    // PEP 509: a global counter stamps every dict mutation, so equal tags mean the same dict in
    // the same state.
    return reinterpret_cast<PyDictObject*>(d)->ma_version_tag;
}

bool dict_version_match(PyObject* v, std::uint64_t stamp, DictWatch*) {
    if (!PyDict_CheckExact(v)) return false;
    const std::uint64_t s = dict_stamp(v);
    return s != 0 && s == stamp;
}

void release_dict_watch(DictWatch*) {}

void dict_watch_counts(std::size_t& dicts, std::size_t& armed) {
    dicts = 0;
    armed = 0;
}
#endif

bool dict_version(PyObject* d, std::uint64_t& out) {
    verify_dict_hints();
    if (!init_dict_stamps()) return false;
    out = dict_stamp(d);
    if (out == 0) {
        PyErr_SetString(PyExc_ValueError,
                        dict_embedded(d)
                            ? "this instance dict is embedded in its object over the object's inline values "
                              "(CPython 3.13): attribute stores bypass it, so it cannot be versioned"
                            : "this dict cannot be versioned (no dict watcher could be installed)");
        return false;
    }
    return true;
}

}  // namespace tripwire::runtime
