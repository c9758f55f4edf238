// tripwire/cpp/runtime/eval/guard_kinds.hpp -- evaluating one guard on a fetched value.
#pragma once

#include <cstdint>

#include "core/ir.hpp"
#include "runtime/eval/fetch.hpp"
#include "runtime/py.hpp"

namespace tripwire::runtime {

/// DIMENSION_MARKING's caches, side by side (the fast op reads them directly: one line, not
/// three). Owned by the GuardSet.
/// HASATTR's inline cache: attribute_certainly_absent's, and its instance-dict memo.
struct AbsenceCache {
    AttrCache attr;
    std::uint64_t absent = 0;
};

struct MarkingCache {
    /// InstanceDict when getattr is object's own and no class defines the flag or any marking
    /// attribute (attributes_in_instance_storage): each is then present exactly when the
    /// instance's own storage holds it, which the fast forms read.
    AttrCache names;
    /// The instance dict state last proved to lack the flag (instance_attr_absent's memo).
    std::uint64_t absent = 0;
    /// The type `names` holds InstanceDict for, when its instances' storage is read through the
    /// verified layout mirror (a managed-dict type the mirror locates); else null. Set with every
    /// reading of `names` that may fill it (dimension_marking_marked), so that the fused tensor op
    /// (dimension_marking_unmarked) tests one pointer, then the version tag, for all of it.
    PyTypeObject* unmarked_type = nullptr;
    /// The flag's own inline cache (attribute_certainly_absent), for a type where a class
    /// defines a marking attribute but not the flag.
    AttrCache flag;
};
/// A DICT_VERSION guard's change flag (3.12+): once the guard passed on a dict by its stamp,
/// the record is *armed* on that dict, and the one dict watcher (the one that keeps the stamps)
/// sets `dirty` on the dict's first change or its deallocation. An armed check is then two
/// comparisons (`v == dict && !dirty`) instead of a stamp lookup. Dirty is final for that dict:
/// its stamp has moved on and never comes back, and a new dict at the same address finds the
/// record dirty. Registered with the watcher exactly while `dict` is set and `dirty` is false.
struct DictWatch {
    PyObject* dict = nullptr;  ///< the dict it is armed on (a raw address, never dereferenced)
    bool dirty = true;
};

/// One guard with its operands resolved to objects (borrowed from the constant pool, which the
/// GuardSet keeps alive for as long as the guard exists).
struct RuntimeGuard {
    core::GuardKind kind = core::GuardKind::TypeMatch;
    bool flag = false;
    bool via_python = false;  ///< may run Python code (GuardDecl::via_python)
    bool reads_by_code =
        false;  ///< TENSOR_MATCH: may read a tensor through Python (GuardDecl::reads_by_code)
    bool python_reader = false;  ///< reads its value through a Python reader (tensors/readers.hpp)
    PyObject* a = nullptr;       ///< operand
    PyObject* b = nullptr;       ///< operand2
    /// An object the GuardSet derived from the operands when it bound the guard and keeps alive
    /// (ARRAY_MATCH: the expected numpy dtype; DIMENSION_MARKING: the built sets as frozensets).
    PyObject* derived = nullptr;
    std::int64_t n = 0, n2 = 0, n3 = 0;
    const std::int64_t* data = nullptr;  ///< GuardDecl::data (owned by the Program), data_size entries
    std::uint32_t data_size = 0;
    MarkingCache* marking = nullptr;  ///< DIMENSION_MARKING's caches (owned by the GuardSet)
    AbsenceCache* absence = nullptr;  ///< HASATTR's cache (owned by the GuardSet)
    std::uint32_t id = 0;
    DictWatch* watch = nullptr;  ///< DICT_VERSION on 3.12+: its change flag (owned by the GuardSet)
};

/// 1 when the guard holds for `v`, 0 when it does not, -1 with a Python error set when evaluating
/// it raised. `f_locals` is passed to sourceless predicates.
int eval_guard(const RuntimeGuard& g, PyObject* v);

/// EQUALS_MATCH: `type(v) is type(c) and v == c`, recursively type-exact, NaN equal to NaN, enum
/// members (and other non-builtin constants) by identity, unordered containers matched one to
/// one. Calls no user __eq__ and allocates no Python object, so it may run where references are
/// borrowed (docs/cpp.md). A value nested deeper than core::kMaxConstantDepth does not match.
/// 1/0/-1.
int equals_match(PyObject* v, PyObject* c);

/// python_equals_pure's answer when only Python's own == can decide.
inline constexpr int kEqualsUnknown = 2;
/// EQUALS_MATCH with python_eq (GuardDecl::flag): `v is c or (type(v) is type(c) and v == c)`
/// with Python's ==, decided without running or allocating anything where the interpreter's own
/// comparisons decide it (exact int/bool, float, str, None, tuples and lists of these); 1/0, or
/// kEqualsUnknown when an element's own __eq__ (or a big int, a float against an int, a set ...)
/// must be asked. Never leaves an error set. python_equals.cpp says exactly what is decided.
int python_equals_pure(PyObject* v, PyObject* c);
/// The same, falling back to PyObject_RichCompareBool (user code: the caller holds `v`). 1/0/-1.
int python_equals(PyObject* v, PyObject* c);

/// SET_CONTAINS decided without user code: an exact str item against an exact set or frozenset
/// of at most kSetScanLimit entries whose every stored key is an exact str (str comparisons
/// only), or an empty one. 1 when the guard holds, 0 when it does not, -1 when undecided this
/// way (a key of another type, whose __eq__ a lookup could call; a dummy left by a removal; a
/// larger table; a subclass). Reads the set's public table (Include/cpython/setobject.h);
/// allocates nothing.
inline constexpr Py_ssize_t kSetScanLimit = 32;
int set_contains_pure(const RuntimeGuard& g, PyObject* v);
/// Whether `s` is an exact set or frozenset whose table (at most kSetScanLimit slots) holds only
/// exact str keys: a lookup or a comparison with it then compares str only, and
/// small_str_set_has answers membership of an exact str without user code.
bool small_str_set(PyObject* s);
bool small_str_set_has(PyObject* s, PyObject* item);

/// Whether constant `c` nests at most core::kMaxConstantDepth levels of containers (a cyclic
/// list does not). Runs no user code.
bool constant_depth_ok(PyObject* c);

/// Whether a value that matched EQUALS_MATCH constant `c` matches it for as long as it is the
/// same live object: `c` holds no list, set or dict at any depth (a value matching it is then
/// built of immutable objects of exact built-in types, or is an identity-matched enum member).
/// Runs no user code.
bool immutable_constant(PyObject* c, int depth = 0);

/// Whether `k` is of an exact built-in type whose hash and equality are the interpreter's own and
/// never call back into Python code (a tuple's would call its elements'): a dict lookup of it
/// among such keys runs no user code. For the fast pass's dict reads and its compiler's choice of
/// the fetches a claim may settle.
inline bool builtin_key(PyObject* k) {
    PyTypeObject* t = Py_TYPE(k);
    return t == &PyUnicode_Type || t == &PyLong_Type || t == &PyBool_Type || t == &PyFloat_Type ||
           t == &PyBytes_Type || k == Py_None;
}

/// Whether `v` may be an EQUALS_MATCH constant: an exact int, float, complex, str, bytes, bool,
/// None, Ellipsis or range, an enum member, or a tuple, list, set, frozenset, dict or slice of
/// these, nested at most core::kMaxConstantDepth - `depth` deep. 1/0, -1 with an error set (the
/// enum module could not be imported). For the builder: it imports enum on first use.
int is_constant(PyObject* v, int depth = 0);

/// The current value of a built-in global-state probe, as GLOBAL_STATE compares it.
std::int64_t builtin_probe(core::BuiltinProbe p);
/// The same as the Python value users see (an int; a bool for gc_enabled). Never null.
Ref builtin_probe_value(core::BuiltinProbe p);

/// len(v) for the exact built-in containers whose length is a field (list, tuple, bytes,
/// bytearray, dict, str, set, frozenset): no __len__ runs. False for anything else.
bool builtin_length(PyObject* v, Py_ssize_t& n);

/// The engine's version stamp of dict `d`: `ma_version_tag` before 3.12, a watcher-maintained
/// stamp on 3.12+. Stamps are unique across dicts and change on every mutation.
std::uint64_t dict_stamp(PyObject* d);

/// Must be called once with the GIL held before dict_stamp (installs the 3.12+ dict watcher).
/// Returns false with a Python error set on failure.
bool init_dict_stamps();

/// dict_stamp after init_dict_stamps (a DICT_VERSION guard's expected value). False with a Python
/// error set when the watcher cannot be installed.
bool dict_version(PyObject* d, std::uint64_t& out);

/// DICT_VERSION: `v` is an exact dict whose stamp is `stamp`; through `watch` when given (3.12+:
/// armed by a pass, then decided by its flag). Runs no user code and allocates no Python object.
bool dict_version_match(PyObject* v, std::uint64_t stamp, DictWatch* watch);

/// Unregister `watch` from the watcher (before it is freed). GIL held.
void release_dict_watch(DictWatch* watch);

/// How many dicts the watcher keeps stamps for, and how many armed flags they have (tests).
void dict_watch_counts(std::size_t& dicts, std::size_t& armed);

}  // namespace tripwire::runtime
