// tripwire/cpp/runtime/eval/dict_hint.cpp -- start-up verification of the dict layout mirror.
#include "runtime/eval/dict_hint.hpp"

#include <cstring>

namespace tripwire::runtime {

bool g_dict_hints_enabled = false;

#ifdef TRIPWIRE_DICT_LAYOUT
bool g_dict_tags_enabled = false;
bool g_skip_enabled = false;

namespace {

// The skip's premise, checked on this interpreter: a dict's tag is non-zero, changes on every
// kind of mutation (item set, delete, clear, update, attribute store through the instance dict,
// on new and on replaced instance dicts), never equals another live dict's, and an embedded
// 3.13 instance dict reads as "no tag". Any surprise leaves the skip off.
void verify_dict_tags() {
    PyObject* ns = PyDict_New();
    if (ns == nullptr) {
        PyErr_Clear();
        return;
    }
    PyDict_SetItemString(ns, "__builtins__", PyEval_GetBuiltins());
    g_skip_enabled = true;  // provisionally: dict_tag reads only while it is on
    auto tag_of = [&](const char* var) -> std::uint64_t {
        PyObject* d = PyDict_GetItemString(ns, var);
        return d != nullptr && PyDict_CheckExact(d) ? dict_tag(d) : 0;
    };
    bool ok = true;
    // Each step mutates dict `d`, or the object `o` whose dict is `od`, in one way: the dict's
    // tag must change.
    struct Step {
        const char* dict;
        const char* code;
    };
    const Step steps[] = {
        {"d", "d['a'] = 1"},
        {"d", "d['a'] = 2"},
        {"d", "del d['a']"},
        {"d", "d.update(b=1)"},
        {"d", "d.setdefault('c', 3)"},
        {"d", "d.pop('c')"},
        {"d", "d.clear()"},
        {"d", "d[1] = 'x'"},
        {"od", "od['beta'] = 5"},
        {"od", "o.alpha = 7"},
        {"od", "o.new = 8"},
        {"od", "del o.new"},
        {"od", "object.__setattr__(o, 'alpha', 9)"},
    };
    const char* setup =
        "class _TwTagProbe:\n"
        "    def __init__(self):\n"
        "        self.alpha = 1; self.beta = 2\n"
        "d = {}\n"
        "o = _TwTagProbe(); o.__dict__ = {'alpha': 1, 'beta': 2}\n"
        "od = o.__dict__\n"
        "e = _TwTagProbe(); ed = e.__dict__\n";
    PyObject* r = PyRun_String(setup, Py_file_input, ns, ns);
    ok = r != nullptr;
    Py_XDECREF(r);
    for (const Step& step : steps) {
        if (!ok) break;
        const std::uint64_t before = tag_of(step.dict);
        r = PyRun_String(step.code, Py_file_input, ns, ns);
        ok = r != nullptr && before != 0 && tag_of(step.dict) != 0 && tag_of(step.dict) != before;
        Py_XDECREF(r);
    }
    // A new dict never shares a tag with a live one.
    if (ok) {
        PyObject* fresh = PyDict_New();
        ok = fresh != nullptr && dict_tag(fresh) != 0 && dict_tag(fresh) != tag_of("d") &&
             dict_tag(fresh) != tag_of("od");
        Py_XDECREF(fresh);
    }
#if PY_VERSION_HEX >= 0x030D0000
    // An embedded instance dict has no tag (its object's attribute stores bypass it).
    if (ok) ok = tag_of("ed") == 0;
#endif
    g_dict_tags_enabled = ok;
    g_skip_enabled = ok;
    PyErr_Clear();
    Py_DECREF(ns);
}

}  // namespace
#endif

void verify_dict_hints() {
#ifdef TRIPWIRE_DICT_LAYOUT
    static bool done = false;
    if (done) return;
    done = true;
    // Build real dicts and objects with the three storage kinds and require the mirror to find
    // exactly the values CPython's own lookup finds. Any surprise leaves hints disabled.
    PyObject* main_mod = PyImport_AddModule("__main__");  // borrowed
    PyObject* globals = main_mod ? PyModule_GetDict(main_mod) : nullptr;
    if (globals == nullptr) {
        PyErr_Clear();
        return;
    }
    PyObject* ns = PyDict_New();
    if (ns == nullptr) {
        PyErr_Clear();
        return;
    }
    PyDict_SetItemString(ns, "__builtins__", PyEval_GetBuiltins());
    const char* code =
        "class _TwProbe:\n"
        "    def __init__(self):\n"
        "        self.alpha = 1; self.beta = 'b'; self.gamma = None\n"
        "inline = _TwProbe()\n"
        "materialised = _TwProbe(); materialised.__dict__\n"
        "combined = dict(k0=0, k1=1, k2=2, k3=3, k4=4, k5=5, k6=6, k7=7, k8=8, k9=9)\n"
        "general = {1: 'one', 'key': 'v', (2,): 3}\n"
        "split = _TwProbe().__dict__\n"
        "deleted = _TwProbe(); del deleted.alpha\n"
        "replaced = _TwProbe(); replaced.__dict__ = {'alpha': 5, 'beta': 'r', 'gamma': None}\n"
        "grown = _TwProbe(); grown.delta = 4; grown.epsilon = 5\n";
    PyObject* r = PyRun_String(code, Py_file_input, ns, ns);
    bool ok = r != nullptr;
    Py_XDECREF(r);
    g_dict_hints_enabled = true;  // provisionally, for the probes below
    // `interned`: the key object is the interned one (found by identity) or a fresh equal str
    // (found by value). `hinted`: whether the hint path must find it (general tables never are).
    auto probe = [&](const char* var, const char* key, bool attr, bool interned = true, bool hinted = true) {
        if (!ok) return;
        PyObject* obj = PyDict_GetItemString(ns, var);
        PyObject* k = interned ? PyUnicode_InternFromString(key) : PyUnicode_FromString(key);
        if (obj == nullptr || k == nullptr) {
            ok = false;
            Py_XDECREF(k);
            return;
        }
        PyObject* expected = attr ? PyObject_GetAttr(obj, k) : PyDict_GetItemWithError(obj, k);
        if (attr) Py_XDECREF(expected);  // still owned by the object
        Py_ssize_t hint = kHintUnknown;
        PyObject* got = attr ? instance_attr_hinted(obj, k, &hint) : dict_get_hinted(obj, k, &hint);
        PyObject* again = attr ? instance_attr_hinted(obj, k, &hint) : dict_get_hinted(obj, k, &hint);
        if (hinted) {
            ok = expected != nullptr && got == expected && again == expected && hint >= 0;
        } else {
            ok = expected != nullptr && got == nullptr && again == nullptr;
        }
        Py_DECREF(k);
    };
    probe("inline", "beta", true);
    probe("materialised", "gamma", true);
    probe("combined", "k7", false);
    probe("general", "key", false, true, false);
    probe("combined", "k3", false, false);
    probe("inline", "gamma", true, false);
    probe("split", "alpha", false);
    probe("deleted", "beta", true);
    probe("replaced", "beta", true);
    probe("grown", "epsilon", true);
    // A deleted attribute is not found, and the managed dict is seen exactly when it exists.
    if (ok) {
        PyObject* deleted = PyDict_GetItemString(ns, "deleted");
        PyObject* alpha = PyUnicode_InternFromString("alpha");
        Py_ssize_t hint = kHintUnknown;
        ok = deleted != nullptr && alpha != nullptr && instance_attr_hinted(deleted, alpha, &hint) == nullptr;
        Py_XDECREF(alpha);
    }
    for (const char* var : {"inline", "materialised", "replaced"}) {
        if (!ok) break;
        PyObject* obj = PyDict_GetItemString(ns, var);
        if (obj == nullptr) {
            ok = false;
            break;
        }
        const bool has_dict = std::strcmp(var, "inline") != 0;
        PyObject* seen = materialised_managed_dict(obj);
        if (!has_dict) {
            ok = seen == nullptr;
        } else {
            PyObject* d = PyObject_GenericGetDict(obj, nullptr);  // exists already: no new dict
            ok = d != nullptr && seen == d;
            Py_XDECREF(d);
        }
    }
    // The module mirror (module_dict): its read is the module's dict, for a plain module, a
    // built-in one and an instance of a ModuleType subclass.
    if (ok) {
        r = PyRun_String("import sys, types\nclass _TwMod(types.ModuleType): pass\nsub = _TwMod('sub')\n",
                         Py_file_input, ns, ns);
        ok = r != nullptr;
        Py_XDECREF(r);
    }
    for (PyObject* m : {main_mod, PyDict_GetItemString(ns, "sys"), PyDict_GetItemString(ns, "sub")}) {
        if (!ok) break;
        ok = m != nullptr && PyModule_Check(m) &&
             reinterpret_cast<layout::Module*>(m)->md_dict == PyModule_GetDict(m) &&
             PyDict_CheckExact(PyModule_GetDict(m));
    }
    g_dict_hints_enabled = ok;
    PyErr_Clear();
    Py_DECREF(ns);
    if (ok) verify_dict_tags();
#endif
}

bool set_skip_enabled(bool on) {
#ifdef TRIPWIRE_DICT_LAYOUT
    const bool was = g_skip_enabled;
    g_skip_enabled = on && g_dict_tags_enabled;
    return was;
#else
    (void)on;
    return false;
#endif
}

#ifdef TRIPWIRE_DICT_LAYOUT
namespace layout {

bool equal_str(PyObject* k, PyObject* key) {
    if (k == nullptr || k == key || !PyUnicode_CheckExact(key)) return false;
    if (!PyUnicode_IS_READY(k) || !PyUnicode_IS_READY(key)) return false;  // legacy strings: no hint
    const Py_hash_t hk = reinterpret_cast<PyASCIIObject*>(k)->hash;
    const Py_hash_t hq = reinterpret_cast<PyASCIIObject*>(key)->hash;
    if (hk != -1 && hq != -1 && hk != hq) return false;
    const Py_ssize_t len = PyUnicode_GET_LENGTH(k);
    if (len != PyUnicode_GET_LENGTH(key) || PyUnicode_KIND(k) != PyUnicode_KIND(key)) return false;
    return std::memcmp(PyUnicode_DATA(k), PyUnicode_DATA(key),
                       static_cast<std::size_t>(len) * PyUnicode_KIND(k)) == 0;
}

PyObject* lookup_slow(Keys* dk, PyObject** values, PyObject* key, Py_ssize_t* hint) {
    if (dk->dk_kind == 0) return nullptr;  // a general table: never hinted
    auto* ents = reinterpret_cast<UnicodeEntry*>(entries(dk));
    const Py_ssize_t n = dk->dk_nentries;
    Py_ssize_t ix = *hint;
    if (ix >= 0 && ix < n && equal_str(ents[ix].me_key, key))
        return values != nullptr ? values[ix] : ents[ix].me_value;
    if (ix == kHintAbsent) return nullptr;
    ix = kHintAbsent;
    if (n <= kScanLimit) {
        for (Py_ssize_t i = 0; i < n && ix == kHintAbsent; ++i)
            if (ents[i].me_key == key) ix = i;
        for (Py_ssize_t i = 0; i < n && ix == kHintAbsent; ++i)
            if (equal_str(ents[i].me_key, key)) ix = i;
    }
    *hint = ix;
    if (ix < 0) return nullptr;
    return values != nullptr ? values[ix] : ents[ix].me_value;
}

}  // namespace layout
#endif

// -- certain absence of an instance attribute ------------------------------------------------------

#ifdef TRIPWIRE_DICT_LAYOUT
namespace {
// 1 when the str-keyed table (with `values`, or its own entries when null) lacks `name`, 0 when
// it holds it, -1 for a general table (a lookup there may compare with a user key's __eq__).
int table_lacks(layout::Keys* dk, PyObject** values, PyObject* name, PyObject** found = nullptr) {
    if (dk == nullptr || dk->dk_kind == 0) return -1;
    auto* ents = reinterpret_cast<layout::UnicodeEntry*>(layout::entries(dk));
    // Most keys differ from `name` in their cached hash: compared inline first (a key whose hash
    // is not cached yet, or equal, goes to equal_str, which decides).
    const Py_hash_t h = reinterpret_cast<PyASCIIObject*>(name)->hash;
    const Py_ssize_t n = dk->dk_nentries;
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* k = ents[i].me_key;
        if (k != name) {
            if (k == nullptr) continue;
            const Py_hash_t hk = reinterpret_cast<PyASCIIObject*>(k)->hash;
            if (h != -1 && hk != -1 && hk != h) continue;
        }
        if (k == name || layout::equal_str(k, name)) {
            // A table of exact str keys never holds two equal keys: this is the one entry.
            PyObject* v = values != nullptr ? values[i] : ents[i].me_value;
            if (found != nullptr) *found = v;
            return v == nullptr ? 1 : 0;
        }
    }
    return 1;
}
}  // namespace

int instance_attr_absent(PyObject* obj, PyObject* name, std::uint64_t* memo, PyObject** found) {
    if (found != nullptr) *found = nullptr;
    if (!g_dict_hints_enabled) return -1;
    PyTypeObject* tp = Py_TYPE(obj);
    PyObject* dict = nullptr;
    if (tp->tp_flags & Py_TPFLAGS_MANAGED_DICT) {
        // Inline values this mirror does not locate (3.13, a subclass of a C type): undecided.
        if (!managed_storage_in_mirror(tp)) return -1;
        if (PyObject** values = layout::inline_values(obj)) {
            auto* keys =
                reinterpret_cast<layout::Keys*>(reinterpret_cast<PyHeapTypeObject*>(tp)->ht_cached_keys);
            return table_lacks(keys, values, name, found);
        }
        dict = layout::managed_dict(obj);
    } else {
        if (tp->tp_dictoffset == 0) return 1;         // no instance dict at all
        PyObject** slot = _PyObject_GetDictPtr(obj);  // not a managed dict: computes an address
        dict = slot != nullptr ? *slot : nullptr;
    }
    if (dict == nullptr) return 1;  // not created: no instance attribute yet
    if (!PyDict_Check(dict)) return -1;
    // The dict in a state already proved to lack `name` still lacks it (the tag premise).
    std::uint64_t tag = 0;
    if (memo != nullptr && PyDict_CheckExact(dict)) {
        tag = dict_tag(dict);
        if (tag != 0 && tag == *memo) return 1;
    }
    auto* mp = reinterpret_cast<layout::Dict*>(dict);
    const int r = table_lacks(mp->ma_keys, layout::split_values(mp->ma_values), name, found);
    if (r == 1 && tag != 0) *memo = tag;  // read before the scan, nothing ran between
    return r;
}
#else
int instance_attr_absent(PyObject*, PyObject*, std::uint64_t*, PyObject**) { return -1; }
#endif

}  // namespace tripwire::runtime
