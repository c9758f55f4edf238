// tripwire/cpp/runtime/eval/dict_hint.hpp -- dict lookups by cached entry index (CPython 3.11-3.13).
//
// CPython's specialising interpreter reads an attribute by remembering *where* in a dict's entry
// table the name was last found (LOAD_ATTR_WITH_HINT, LOAD_ATTR_INSTANCE_VALUE). We do the same:
// check that entry `hint` of the dict's current key table holds exactly our interned key and
// read its value, with no hashing or probing. Any doubt returns null and the caller takes the
// ordinary, always-correct path. Nothing here sets a Python error, allocates or runs user code.
//
// Soundness: hints apply only to tables of exact str keys (CPython's unicode and split kinds),
// where a lookup compares strings and nothing else. CPython 3.11-3.13 clear the key of a deleted
// entry in such a table (a split table clears the value instead, and a null value reads as "not
// found"), and such a table never holds two equal keys, so an entry (below dk_nentries) whose key
// is our key, or an exact str equal to it, is the dict's one entry for it. A general table is
// never hinted: a user key there may decide equality with its own __eq__, which may even change
// its answer over time (two "equal" keys can then coexist, and only CPython's probe order says
// which one a lookup finds).
//
// The layouts are private to CPython (Include/internal/pycore_dict.h and pycore_object.h, which do
// not compile outside the interpreter). We mirror the few fields we read, per version:
//   key table     3.11-3.13 alike (dk_kind, dk_log2_index_bytes, dk_nentries, then the indices and
//                 the entries);
//   split values  3.11/3.12: the values array itself; 3.13: a 4-byte header (capacity, size,
//                 embedded, valid), the array at offset 8;
//   managed dict  3.11: inline values pointer at obj[-4], dict at obj[-3]; 3.12: obj[-3] holds
//                 the dict, or the values pointer - 1 (tagged by its low bit); 3.13: obj[-3]
//                 holds the dict, the values sit inline after the object header (types with
//                 Py_TPFLAGS_INLINE_VALUES) and count only while their `valid` byte is set.
// verify_dict_hints() checks the mirror against real dicts and objects at start-up; on any
// mismatch (or a free-threaded or other build) hints stay off and every lookup takes the ordinary
// path. tripwire._core._dict_hints_enabled() reports which.
#pragma once

#include <cstdint>

#include "runtime/py.hpp"

namespace tripwire::runtime {

/// Hint value: not learned yet.
inline constexpr Py_ssize_t kHintUnknown = -1;
/// Hint value: a pointer scan did not find the key; use the ordinary path from now on.
inline constexpr Py_ssize_t kHintAbsent = -2;

/// True once verify_dict_hints() confirmed the layout mirror on this interpreter.
extern bool g_dict_hints_enabled;

/// Check the layout mirror against real dicts and objects; enables hints when it matches.
/// Call once with the GIL held.
void verify_dict_hints();

/// Whether `obj`'s own storage (inline values or instance dict, never materialised) lacks
/// attribute `name` (an exact str): 1 absent, 0 present, -1 when that cannot be decided without
/// user code (hints off, a table with non-str keys, inline values this mirror does not locate).
/// Reads only; allocates nothing.
///
/// `memo` (optional, 0 at first): when the storage is an instance dict, the tag (dict_tag) of the
/// state in which this was last proved. Equal non-zero tags read from a live dict mean the same
/// dict in the same state (docs/cpp.md, "Skipping unchanged subtrees"), so that dict still lacks
/// `name`: 1 at once, without a scan. Set after a proof in a dict with a usable tag; never used
/// or set for inline values (no tag), an embedded 3.13 dict (tag 0) or with the skip off.
/// `found` (optional): on 0, the value held there (borrowed), else null.
int instance_attr_absent(PyObject* obj, PyObject* name, std::uint64_t* memo = nullptr,
                         PyObject** found = nullptr);

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000 && !defined(Py_GIL_DISABLED)
#define TRIPWIRE_DICT_LAYOUT 1
namespace layout {
struct Keys {  // struct _dictkeysobject
    Py_ssize_t dk_refcnt;
    std::uint8_t dk_log2_size;
    std::uint8_t dk_log2_index_bytes;
    std::uint8_t dk_kind;  // 0 general, 1 unicode, 2 split
    std::uint32_t dk_version;
    Py_ssize_t dk_usable;
    Py_ssize_t dk_nentries;
    char dk_indices[1];
};
struct Entry {  // PyDictKeyEntry
    Py_hash_t me_hash;
    PyObject* me_key;
    PyObject* me_value;
};
struct UnicodeEntry {  // PyDictUnicodeEntry
    PyObject* me_key;
    PyObject* me_value;
};
struct Dict {  // PyDictObject
    PyObject_HEAD Py_ssize_t ma_used;
    std::uint64_t ma_version_tag;
    Keys* ma_keys;
    void* ma_values;  // PyDictValues*: see values_of
};
struct Module {  // PyModuleObject's head: the dict comes first on 3.11-3.13
    PyObject_HEAD PyObject* md_dict;
};

/// The values array of a PyDictValues.
inline PyObject** values_of(void* dict_values) {
#if PY_VERSION_HEX >= 0x030D0000
    return reinterpret_cast<PyObject**>(static_cast<char*>(dict_values) + sizeof(PyObject*));
#else
    return static_cast<PyObject**>(dict_values);
#endif
}

/// The values array of a dict's `ma_values` (null for a combined table). Before 3.13 the
/// pointer is the array itself: no test on the hot path.
inline PyObject** split_values(void* ma_values) {
#if PY_VERSION_HEX >= 0x030D0000
    return ma_values != nullptr ? values_of(ma_values) : nullptr;
#else
    return static_cast<PyObject**>(ma_values);
#endif
}

/// The inline values array of an object of a managed-dict type, or null when its attributes
/// live in a dict (or the type keeps none inline).
inline PyObject** inline_values(PyObject* obj) {
#if PY_VERSION_HEX >= 0x030D0000
    PyTypeObject* tp = Py_TYPE(obj);
    if (!(tp->tp_flags & Py_TPFLAGS_INLINE_VALUES) || tp->tp_basicsize != sizeof(PyObject)) return nullptr;
    char* values = reinterpret_cast<char*>(obj) + sizeof(PyObject);
    return values[3] != 0 ? values_of(values) : nullptr;  // the `valid` byte
#elif PY_VERSION_HEX >= 0x030C0000
    const auto tagged = reinterpret_cast<std::uintptr_t*>(obj)[-3];
    return (tagged & 1U) != 0 ? reinterpret_cast<PyObject**>(tagged + 1) : nullptr;
#else
    return reinterpret_cast<PyObject***>(obj)[-4];
#endif
}

/// The managed instance dict of an object of a managed-dict type, or null when not created.
inline PyObject* managed_dict(PyObject* obj) {
#if PY_VERSION_HEX >= 0x030C0000 && PY_VERSION_HEX < 0x030D0000
    const auto tagged = reinterpret_cast<std::uintptr_t*>(obj)[-3];
    return (tagged & 1U) != 0 ? nullptr : reinterpret_cast<PyObject*>(tagged);
#else
    return reinterpret_cast<PyObject**>(obj)[-3];
#endif
}

inline char* entries(Keys* dk) {
    return dk->dk_indices + (static_cast<std::size_t>(1) << dk->dk_log2_index_bytes);
}
inline PyObject* entry_key(Keys* dk, Py_ssize_t ix) {
    return dk->dk_kind != 0 ? reinterpret_cast<UnicodeEntry*>(entries(dk))[ix].me_key
                            : reinterpret_cast<Entry*>(entries(dk))[ix].me_key;
}
/// Largest table scanned to learn a hint.
inline constexpr Py_ssize_t kScanLimit = 256;

/// Whether stored key `k` (an exact str, or null for a deleted entry) equals the exact str `key`
/// character for character (hash, length, kind, bytes), `k` not being `key` itself. Runs no user
/// code. Out of line: the hot path is the identity match.
bool equal_str(PyObject* k, PyObject* key);

/// Everything but lookup's identity hit: refuse a general table, match the hinted entry by
/// characters, or learn the hint by scanning the table (identity first, then equal characters),
/// or give up for good (kHintAbsent).
PyObject* lookup_slow(Keys* dk, PyObject** values, PyObject* key, Py_ssize_t* hint);

/// The value of `key` in a table of exact str keys, through `*hint` (see "Soundness" above);
/// `values` is the split values array, or null for a combined table.
/// Inlined: the identity hit is a handful of instructions on the hottest path of every check.
[[gnu::always_inline]] inline PyObject* lookup(Keys* dk, PyObject** values, PyObject* key, Py_ssize_t* hint) {
    const Py_ssize_t ix = *hint;
    if (dk->dk_kind != 0 && ix >= 0 && ix < dk->dk_nentries) {
        auto* ents = reinterpret_cast<UnicodeEntry*>(entries(dk));
        if (ents[ix].me_key == key) return values != nullptr ? values[ix] : ents[ix].me_value;
    }
    return lookup_slow(dk, values, key, hint);
}
}  // namespace layout

/// Borrowed value of interned str `key` in dict `d` (any dict, incl. subclasses) through
/// `*hint`, or null when the hint path does not apply.
inline PyObject* dict_get_hinted(PyObject* d, PyObject* key, Py_ssize_t* hint) {
    if (!g_dict_hints_enabled) return nullptr;
    auto* mp = reinterpret_cast<layout::Dict*>(d);
    return layout::lookup(mp->ma_keys, layout::split_values(mp->ma_values), key, hint);
}

/// Borrowed value of attribute `name` from `obj`'s own storage (inline values or instance dict,
/// without materialising the dict), or null when not found that way. Valid only when the type
/// has no data descriptor for `name`, which the caller's inline cache guarantees.
inline PyObject* instance_attr_hinted(PyObject* obj, PyObject* name, Py_ssize_t* hint) {
    if (!g_dict_hints_enabled) return nullptr;
    PyTypeObject* tp = Py_TYPE(obj);
    if (tp->tp_flags & Py_TPFLAGS_MANAGED_DICT) {
        if (PyObject** values = layout::inline_values(obj)) {
            auto* keys =
                reinterpret_cast<layout::Keys*>(reinterpret_cast<PyHeapTypeObject*>(tp)->ht_cached_keys);
            return keys != nullptr ? layout::lookup(keys, values, name, hint) : nullptr;
        }
        PyObject* dict = layout::managed_dict(obj);
        return dict != nullptr ? dict_get_hinted(dict, name, hint) : nullptr;
    }
    if (tp->tp_dictoffset <= 0) return nullptr;  // variable-sized objects: ordinary path
    PyObject* dict = *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(obj) + tp->tp_dictoffset);
    if (dict == nullptr || !PyDict_Check(dict)) return nullptr;
    return dict_get_hinted(dict, name, hint);
}
/// The managed instance dict of `obj` (a type with Py_TPFLAGS_MANAGED_DICT) if it has been
/// created, else null (attributes still inline, or hints off). Reads a slot; allocates nothing.
inline PyObject* materialised_managed_dict(PyObject* obj) {
    if (!g_dict_hints_enabled) return nullptr;
    return layout::managed_dict(obj);
}
/// The dict of module `m` (PyModule_Check: a subclass's instance too), borrowed: the verified
/// mirror's read of `md_dict` (PyModule_GetDict is a call of ~20 instructions, made per module per
/// check by the fast pass), else PyModule_GetDict. `__dict__` of a module is read-only, so the
/// field is only ever null after the module's tp_clear (an unreachable module, being collected).
inline PyObject* module_dict(PyObject* m) {
    return g_dict_hints_enabled ? reinterpret_cast<layout::Module*>(m)->md_dict : PyModule_GetDict(m);
}
/// DICT_KEYS fast path: 1 when dict `d`'s keys, in storage order, are exactly the objects of
/// tuple `keys` (pointer identity, which implies type-exact equality), -1 when that cannot be
/// decided this way (a key is another object, a split table, hints off); never 0. The caller
/// has already checked the sizes match.
inline int dict_keys_identical(PyObject* d, PyObject* keys) {
    if (!g_dict_hints_enabled) return -1;
    auto* mp = reinterpret_cast<layout::Dict*>(d);
    if (mp->ma_values != nullptr) return -1;
    layout::Keys* dk = mp->ma_keys;
    const Py_ssize_t n = PyTuple_GET_SIZE(keys);
    Py_ssize_t j = 0;
    for (Py_ssize_t i = 0; i < dk->dk_nentries; ++i) {
        PyObject* k = layout::entry_key(dk, i);
        if (k == nullptr) continue;  // deleted entry
        if (j >= n || k != PyTuple_GET_ITEM(keys, j)) return -1;
        ++j;
    }
    return j == n ? 1 : -1;
}
/// Whether dict `d` (any dict, incl. subclasses) holds only exact str keys (CPython's unicode and
/// split key tables), so that looking up an exact str key compares strings only and runs no user
/// code. False when that cannot be known (hints off).
inline bool dict_has_only_str_keys(PyObject* d) {
    if (!g_dict_hints_enabled) return false;
    return reinterpret_cast<layout::Dict*>(d)->ma_keys->dk_kind != 0;
}
/// Whether dict_tag's reading was verified at start-up (verify_dict_hints), and the skip is on.
extern bool g_dict_tags_enabled;
extern bool g_skip_enabled;

/// Whether `d` is a CPython 3.13 instance dict materialised over its object's inline values: the
/// object's attribute stores then write the values directly, bumping neither the dict's tag nor
/// firing dict watchers (observed on 3.13.0). Always false before 3.13.
inline bool dict_embedded(PyObject* d) {
#if PY_VERSION_HEX >= 0x030D0000
    // The PyDictValues header is private: unverified, any split dict counts as embedded.
    auto* mp = reinterpret_cast<layout::Dict*>(d);
    return mp->ma_values != nullptr &&
           (!g_dict_hints_enabled || static_cast<const std::uint8_t*>(mp->ma_values)[2] != 0);
#else
    (void)d;
    return false;
#endif
}

/// The version tag of exact dict `d` as the skip of unchanged subtrees uses it (docs/cpp.md,
/// "Skipping unchanged subtrees"), or 0 when it must not be used. CPython 3.11-3.13 give every
/// dict a tag from one per-interpreter counter at creation and on every mutation (3.12+ keep
/// watcher bits in the low bits, which may change on their own: a spurious mismatch only), so
/// equal non-zero tags read from a live dict mean the same dict in the same state. Except on
/// 3.13 for a dict *embedded* in an object (materialised over the object's inline values):
/// attribute stores then write the values directly, bumping neither the tag nor dict watchers;
/// such a dict has no usable tag.
///
/// pass_tag is the same reading with kNoTag (never a dict's tag: the counter never reaches it)
/// where dict_tag says 0: the fast pass's tag slots hold it, so that a slot compared with a claim
/// (0: none made) never matches without a test for "no tag" (verify_dict_tags checks that every
/// tag is non-zero). A claim is never made with kNoTag.
inline constexpr std::uint64_t kNoTag = ~std::uint64_t{0};
inline std::uint64_t pass_tag(PyObject* d) {
    if (!g_skip_enabled || dict_embedded(d)) return kNoTag;
    return reinterpret_cast<layout::Dict*>(d)->ma_version_tag;
}
inline std::uint64_t dict_tag(PyObject* d) {
    const std::uint64_t t = pass_tag(d);
    return t != kNoTag ? t : 0;
}
/// dict_tag(d) == tag, a proof made in that very state (tags are never reused; 0 is no tag).
inline bool tag_holds(PyObject* d, std::uint64_t tag) {
    return tag != 0 && PyDict_CheckExact(d) && dict_tag(d) == tag;
}

/// Whether instances of `tp` keep their attributes in managed storage that this mirror locates
/// (layout::inline_values, layout::managed_dict) without a scan of a type table.
inline bool managed_storage_in_mirror(PyTypeObject* tp) {
    const bool managed = g_dict_hints_enabled && (tp->tp_flags & Py_TPFLAGS_MANAGED_DICT) != 0;
#if PY_VERSION_HEX >= 0x030D0000
    // Inline values after the header are located for object's own layout only (inline_values).
    return managed && !((tp->tp_flags & Py_TPFLAGS_INLINE_VALUES) && tp->tp_basicsize != sizeof(PyObject));
#else
    return managed;
#endif
}
/// instance_attr_absent's memo alone, inline: true when `obj` keeps its attributes in an
/// existing managed instance dict (the storage instance_attr_absent would scan, never inline
/// values) whose tag is `memo` (non-zero): that dict is in a state already proved to lack the
/// name. False means "not known this way" (the caller asks instance_attr_absent).
inline bool instance_absence_memo_holds(PyObject* obj, std::uint64_t memo) {
    if (memo == 0 || !managed_storage_in_mirror(Py_TYPE(obj))) return false;
    if (layout::inline_values(obj) != nullptr) return false;
    PyObject* dict = layout::managed_dict(obj);
    return dict != nullptr && PyDict_CheckExact(dict) && dict_tag(dict) == memo;
}

/// Whether instance_attr_hinted reads the object's whole own storage (so "not found" there
/// means "not an instance attribute").
inline bool instance_hints_complete() { return g_dict_hints_enabled; }
#else
inline PyObject* dict_get_hinted(PyObject*, PyObject*, Py_ssize_t*) { return nullptr; }
inline PyObject* instance_attr_hinted(PyObject*, PyObject*, Py_ssize_t*) { return nullptr; }
inline PyObject* materialised_managed_dict(PyObject*) { return nullptr; }
inline bool instance_hints_complete() { return false; }
inline int dict_keys_identical(PyObject*, PyObject*) { return -1; }
inline bool instance_absence_memo_holds(PyObject*, std::uint64_t) { return false; }
inline bool managed_storage_in_mirror(PyTypeObject*) { return false; }
inline bool dict_has_only_str_keys(PyObject*) { return false; }
inline constexpr bool g_skip_enabled = false;
inline std::uint64_t dict_tag(PyObject*) { return 0; }
inline bool tag_holds(PyObject*, std::uint64_t) { return false; }
inline constexpr std::uint64_t kNoTag = ~std::uint64_t{0};
inline std::uint64_t pass_tag(PyObject*) { return kNoTag; }
inline PyObject* module_dict(PyObject* m) { return PyModule_GetDict(m); }
inline bool dict_embedded(PyObject*) { return false; }
#endif

/// dict[key] without user code: the hinted entry (keys compared by identity), or else a real
/// lookup when both the key and every key of the table are exact str (string comparisons only).
/// Null when absent or when it cannot be decided that way. Borrowed.
inline PyObject* dict_get_pure(PyObject* d, PyObject* key, Py_ssize_t* hint) {
    if (PyObject* v = dict_get_hinted(d, key, hint)) return v;
    if (!PyUnicode_CheckExact(key) || !dict_has_only_str_keys(d)) return nullptr;
    PyObject* v = PyDict_GetItemWithError(d, key);
    if (v == nullptr) PyErr_Clear();  // cannot raise for str keys; be safe
    return v;
}

/// Switch the skip of unchanged subtrees on or off, process-wide (on by default where the tag
/// reading was verified). Off, every check evaluates every guard: the tests compare both ways.
/// Returns the previous setting.
bool set_skip_enabled(bool on);

}  // namespace tripwire::runtime
