// tripwire/cpp/runtime/tensors/tensor_kinds.hpp -- TENSOR_MATCH, ARRAY_MATCH, DIMENSION_MARKING.
//
// The expectations are the plain data of core/kind_data.hpp (GuardDecl::data, reached through
// RuntimeGuard::data). A check reads the value's fields through readers.hpp: the torch adapter
// or the numpy struct when the guard was bound to them (no user code, no allocation), else a
// Python reader (RuntimeGuard::via_python). One comparison serves the check (which stops at the
// first difference) and the diagnostics (which list every one).
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/eval/dict_hint.hpp"
#include "runtime/eval/fetch.hpp"
#include "runtime/eval/guard_kinds.hpp"
#include "runtime/tensors/adapter_abi.h"
#include "runtime/tensors/readers.hpp"

namespace tripwire::runtime {

/// One field where a value differs from a tensor's or an array's expectation.
struct FieldMismatch {
    enum class Field : std::uint8_t {
        Type,          ///< not the exact type
        Unreadable,    ///< the fields could not be read (torch refused, the reader returned None)
        DispatchKeys,  ///< expected/actual: raw key-set bits
        Dtype,         ///< tensors: c10::ScalarType; arrays: no values (compare the dtypes)
        DeviceIndex,
        RequiresGrad,
        Ndim,
        Size,    ///< at `dim`
        Stride,  ///< at `dim`; actual core::kAny when the layout has no strides
        StorageOffset,
        CContiguous,  ///< required, missing
        FContiguous,
        Aligned,
        Writeable,      ///< expected/actual: 0 or 1
        PythonKeyMask,  ///< tensors: the keys carry a Python key and torch's mode flag could not be
                        ///< found (mode_flag.hpp): undecidable, fails closed; expected/actual: keys
    };
    Field field = Field::Type;
    std::int64_t dim = -1;
    std::int64_t expected = 0, actual = 0;
};
/// "size", "stride", "dispatch_keys", ... as the package names the fields.
const char* field_name(FieldMismatch::Field f);

/// 1 when the guard holds for `v`, 0 when not, -1 with a Python error set (a Python reader
/// raised, or the dimension-marking attributes did).
int tensor_match(const RuntimeGuard& g, PyObject* v);
int array_match(const RuntimeGuard& g, PyObject* v);
int dimension_marking(const RuntimeGuard& g, PyObject* v);

/// The fast pass's forms: true only when the guard holds, decided without user code and without
/// allocating (a guard bound to a Python reader, or a tensor carrying dimension markings, is
/// never decided here).
bool tensor_match_pure(const RuntimeGuard& g, PyObject* v);
/// The same with the check's memo of the thread-local dispatch key sets (adapter_abi.h TwKeyMemo):
/// zeroed at the start of the check and whenever Python code may have run since.
bool tensor_match_pure(const RuntimeGuard& g, PyObject* v, TwKeyMemo& memo);
bool array_match_pure(const RuntimeGuard& g, PyObject* v);
/// DIMENSION_MARKING's pure form: dimension_marking_marked, or, on a type where a class defines
/// a marking attribute, the flag certainly absent. `fill`: whether a stale inline cache may be
/// filled (filling may run user code: the fast pass passes false, and the walk fills).
bool dimension_marking_pure(const RuntimeGuard& g, PyObject* v, bool fill = true);
/// DIMENSION_MARKING read from the instance's own storage: no class defines the flag or a marking
/// attribute and getattr is object's own (MarkingCache::names, under the type's version tag), and
/// either the flag is absent (proved in a dict state the absence memo keeps) or, on a tensor
/// marked as torch's mark_dynamic leaves it, each marking attribute present in the instance's own storage is
/// an exact set of exact ints within the built dimensions (torch's issubset), a built-absent one absent. True
/// only when the guard holds; anything else (a set subclass, a frozenset, a non-int element, a gated
/// dependent attribute present) is left to dimension_marking. No user code once the inline cache is
/// filled (`fill`, as dimension_marking_pure's); allocates one set iterator per present marking
/// with the collector off.
bool dimension_marking_marked(const RuntimeGuard& g, PyObject* v, bool fill = true);

/// The fast program's inline first tries (false: not decided this way, the *_pure form decides).
/// TENSOR_MATCH: the exact type, then the adapter's one-call comparison (TwTorchAdapter::
/// tensor_matches) under the check's key memo.
inline bool tensor_match_quick(const RuntimeGuard& g, PyObject* v, TwKeyMemo& memo) {
    if (g.via_python || reinterpret_cast<PyObject*>(Py_TYPE(v)) != g.a) return false;
    const TwTorchAdapter* a = torch_adapter();
    return a != nullptr && a->tensor_matches(v, g.data, &memo) == 1;
}
/// tensor_match_quick on a TENSOR_MATCH record (GuardSet's tensor_records_): the expected type's
/// address, then the guard's data, for a guard not read through Python (the fast op reads the
/// record alone, one cache line of ours instead of the RuntimeGuard's and its data's).
inline bool tensor_match_record(const std::int64_t* rec, PyObject* v, TwKeyMemo& memo) {
    if (static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(Py_TYPE(v))) != rec[0]) return false;
    const TwTorchAdapter* a = torch_adapter();
    return a != nullptr && a->tensor_matches(v, rec + 1, &memo) == 1;
}
/// DIMENSION_MARKING: no class of the type defines the marking flag or a marking attribute
/// (MarkingCache::names, under the type's version tag) and the tensor's instance dict is in a state already
/// proved to lack it (instance_absence_memo_holds): the flag is absent, so no marking.
inline bool dimension_marking_quick(const AttrCache* c, std::uint64_t absent_memo, PyObject* v) {
    return c != nullptr && attr_cache_valid(*c, Py_TYPE(v)) && c->mode == AttrCache::Mode::InstanceDict &&
           instance_absence_memo_holds(v, absent_memo);
}
inline bool dimension_marking_quick(const RuntimeGuard& g, PyObject* v) {
    return g.marking != nullptr && dimension_marking_quick(&g.marking->names, g.marking->absent, v);
}
/// DIMENSION_MARKING right after TENSOR_MATCH held on the same value (the fast program's
/// TensorMatchMarking op): true when the tensor certainly carries no marking flag, decided by the
/// type's facts and one read of the instance's own storage. The names' cache proves, under the
/// type's version tag, that getattr is object's own and that no class defines the flag or a
/// marking attribute (its mode is InstanceDict only with a non-zero version, fill_cache; tp is the
/// type TENSOR_MATCH compared). The flag is then absent when the object has no instance storage at
/// all (no inline values and no dict: nothing was ever stored on it, as on a fresh tensor) or when
/// its instance dict is in a state already proved to lack it (the absence memo: a tag, unique to
/// one dict in one state, so another dict, or this one after mark_dynamic or any other store, never
/// matches it; the memo is only ever taken from an exact dict, so a match is that dict). False:
/// not known this way, and the DIMENSION_MARKING op decides on its own. Reads only: no call, no
/// user code.
inline bool dimension_marking_unmarked(const MarkingCache& c, PyObject* v) {
#ifdef TRIPWIRE_DICT_LAYOUT
    // unmarked_type: names is InstanceDict for tp (so its version is not 0: fill_cache) and tp's
    // instances keep their attributes where the layout mirror reads them (a managed dict).
    PyTypeObject* tp = Py_TYPE(v);
    if (c.unmarked_type != tp || type_version(tp) != c.names.version) return false;
    // Inline values have no tag (the DIMENSION_MARKING op scans them).
    if (layout::inline_values(v) != nullptr) return false;
    PyObject* d = layout::managed_dict(v);
    if (d == nullptr) return true;  // no instance attribute at all
    // pass_tag, not dict_tag: the memo is a real tag or 0 (none yet), and pass_tag gives a real tag
    // (never 0: verify_dict_tags) or kNoTag (a 3.13 embedded dict, the skip off), which no memo
    // holds, so one compare says "a usable tag, equal to the memo".
    return pass_tag(d) == c.absent;
#else
    (void)c;
    (void)v;
    return false;
#endif
}

/// DISPATCH_KEY_SET_MATCH (adapter only): `v`'s key set with the current thread's include/exclude
/// sets applied and the Python keys masked as torch's guards mask them (applied_key_set) equals the
/// guard's `n`. 1 or 0 (0 also when the set carries a Python key and torch's mode flag was not
/// found: undecidable, fails closed); runs no user code, allocates nothing, sets no error.
int dispatch_key_set_match(const RuntimeGuard& g, PyObject* v);
/// torch's LocalState::apply on `v`'s key set, now: true and the raw bits when `v` is a
/// DispatchKeySet the adapter reads, false otherwise (not one, no adapter, or a Python key in the
/// set while torch's mode flag is unknown: mode_flag.hpp).
bool applied_key_set(PyObject* v, std::uint64_t& out);

/// Every field where `v` differs (empty: the guard holds). False with a Python error set when a
/// Python reader raised.
bool tensor_mismatches(const RuntimeGuard& g, PyObject* v, std::vector<FieldMismatch>& out);
bool array_mismatches(const RuntimeGuard& g, PyObject* v, std::vector<FieldMismatch>& out);

/// The objects a guard derives when it is bound (RuntimeGuard::derived): ARRAY_MATCH's numpy dtype
/// from its description (a str or a tuple, as numpy.dtype takes it, or a dtype), DIMENSION_MARKING's
/// built sets as a tuple of frozensets and Nones. Null with a Python error set on failure.
Ref derive_array_dtype(PyObject* description);
Ref derive_marking_sets(const std::vector<std::int64_t>& data);

/// The fields of a tensor as the engine reads them, for the builder and the diagnostics:
/// (dispatch_keys, dtype, device_index, requires_grad, sizes, strides or None, storage_offset),
/// through the adapter when installed (`native`), else the Python reader. None when `v` is not a
/// tensor the reader can read; null with an error set when the reader raised.
Ref read_tensor_fields(PyObject* v, bool native);
/// The same for arrays: (ndim, sizes, strides, c_contiguous, f_contiguous, aligned, writeable, dtype).
Ref read_array_fields(PyObject* v, bool native);

}  // namespace tripwire::runtime
