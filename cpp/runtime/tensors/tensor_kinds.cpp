// tripwire/cpp/runtime/tensors/tensor_kinds.cpp -- TENSOR_MATCH, ARRAY_MATCH and DIMENSION_MARKING.
#include "runtime/tensors/tensor_kinds.hpp"

#include <algorithm>
#include <string>

#include "core/kind_data.hpp"
#include "runtime/eval/dict_hint.hpp"
#include "runtime/eval/fetch.hpp"
#include "runtime/tensors/mode_flag.hpp"
#include "runtime/tensors/readers.hpp"

namespace tripwire::runtime {
namespace {

using core::kAny;
using Field = FieldMismatch::Field;

// The fields TENSOR_MATCH compares, from the adapter or the Python reader.
struct TensorFields {
    std::uint64_t keys = 0;
    std::int64_t dtype = -1, device_index = -1;
    bool requires_grad = false;
    std::int64_t ndim = 0;
    const std::int64_t* sizes = nullptr;
    const std::int64_t* strides = nullptr;  // null: the layout has none
    std::int64_t storage_offset = 0;
    // The keys carry a Python key and torch's mode flag could not be found (mode_flag.hpp): the
    // masked and the unmasked set differ, so the guard passes for one flag value and fails for the
    // other. Undecidable without the flag: the comparison fails closed.
    bool mask_unknown = false;
};

// torch's guards remove the Python keys unless a dispatch mode without ignore_compile_internals
// is active (guards.h LocalState::apply): the flag is read only when one of them is present.
inline void apply_python_key_mask(std::uint64_t bits, std::uint64_t& keys, bool& unknown) {
    if ((keys & bits) == 0) return;
    switch (python_key_mask()) {
        case PythonKeyMask::Masked: keys &= ~bits; break;
        case PythonKeyMask::Kept: break;
        case PythonKeyMask::Unknown: unknown = true; break;
    }
}

// The fields ARRAY_MATCH compares.
struct ArrayFields {
    PyObject* dtype = nullptr;
    std::int64_t ndim = 0;
    const std::int64_t* sizes = nullptr;
    const std::int64_t* strides = nullptr;
    int required_bits = 0;  // core::array_data bits the value has
    bool writeable = false;
};

// Record a difference; with no sink, the caller stops at the first one.
inline bool differs(std::vector<FieldMismatch>* out, Field f, std::int64_t expected, std::int64_t actual,
                    std::int64_t dim = -1) {
    if (out != nullptr) out->push_back({f, dim, expected, actual});
    return out != nullptr;  // keep going only when listing every difference
}

// Sizes then strides, per dimension, against (size, stride) pairs from `pairs`; kAny is not checked.
bool compare_dims(const std::int64_t* pairs, std::int64_t ndim, const std::int64_t* sizes,
                  const std::int64_t* strides, std::vector<FieldMismatch>* out) {
    bool ok = true;
    for (std::int64_t i = 0; i < ndim; ++i) {
        const std::int64_t want = pairs[2 * i];
        if (want != kAny && want != sizes[i]) {
            ok = false;
            if (!differs(out, Field::Size, want, sizes[i], i)) return false;
        }
    }
    for (std::int64_t i = 0; i < ndim; ++i) {
        const std::int64_t want = pairs[2 * i + 1];
        if (want == kAny) continue;
        const std::int64_t got = strides != nullptr ? strides[i] : kAny;
        if (want != got) {
            ok = false;
            if (!differs(out, Field::Stride, want, got, i)) return false;
        }
    }
    return ok;
}

// torch's TensorCheck order: dispatch keys, dtype, device index, requires_grad, then the rank,
// then sizes and strides; the storage offset (off by default) last.
bool compare_tensor(const std::int64_t* d, const TensorFields& f, std::vector<FieldMismatch>* out) {
    using core::tensor_data::kDeviceIndex, core::tensor_data::kDispatchKeys, core::tensor_data::kDtype,
        core::tensor_data::kHeader, core::tensor_data::kNdim, core::tensor_data::kRequiresGrad,
        core::tensor_data::kStorageOffset;
    bool ok = true;
    if (f.mask_unknown) {
        ok = false;
        if (!differs(out, Field::PythonKeyMask, d[kDispatchKeys], static_cast<std::int64_t>(f.keys)))
            return false;
    } else if (static_cast<std::uint64_t>(d[kDispatchKeys]) != f.keys) {
        ok = false;
        if (!differs(out, Field::DispatchKeys, d[kDispatchKeys], static_cast<std::int64_t>(f.keys)))
            return false;
    }
    if (d[kDtype] != f.dtype) {
        ok = false;
        if (!differs(out, Field::Dtype, d[kDtype], f.dtype)) return false;
    }
    if (d[kDeviceIndex] != f.device_index) {
        ok = false;
        if (!differs(out, Field::DeviceIndex, d[kDeviceIndex], f.device_index)) return false;
    }
    if (d[kRequiresGrad] != static_cast<std::int64_t>(f.requires_grad)) {
        ok = false;
        if (!differs(out, Field::RequiresGrad, d[kRequiresGrad], f.requires_grad)) return false;
    }
    if (d[kNdim] != f.ndim) {
        differs(out, Field::Ndim, d[kNdim], f.ndim);
        return false;  // the dimensions cannot be compared
    }
    if (!compare_dims(d + kHeader, f.ndim, f.sizes, f.strides, out)) {
        ok = false;
        if (out == nullptr) return false;
    }
    if (d[kStorageOffset] != kAny && d[kStorageOffset] != f.storage_offset) {
        ok = false;
        differs(out, Field::StorageOffset, d[kStorageOffset], f.storage_offset);
    }
    return ok;
}

// The check's comparison: the same fields and order as compare_tensor, without the bookkeeping
// of listing differences (the diagnostics use compare_tensor; the tests hold them together).
inline bool tensor_equal(const std::int64_t* d, const TensorFields& f) {
    namespace td = core::tensor_data;
    if (f.mask_unknown || static_cast<std::uint64_t>(d[td::kDispatchKeys]) != f.keys ||
        d[td::kDtype] != f.dtype || d[td::kDeviceIndex] != f.device_index ||
        d[td::kRequiresGrad] != static_cast<std::int64_t>(f.requires_grad) || d[td::kNdim] != f.ndim) {
        return false;
    }
    const std::int64_t* pairs = d + td::kHeader;
    for (std::int64_t i = 0; i < f.ndim; ++i) {
        const std::int64_t size = pairs[2 * i], stride = pairs[2 * i + 1];
        if (size != kAny && size != f.sizes[i]) return false;
        if (stride != kAny && (f.strides == nullptr || stride != f.strides[i])) return false;
    }
    return d[td::kStorageOffset] == kAny || d[td::kStorageOffset] == f.storage_offset;
}

// -- reading tensors --------------------------------------------------------------------------------------

// What the adapter's reader answered.
enum class NativeRead : std::uint8_t {
    Ok,          ///< `f` filled
    Unreadable,  ///< torch refused (an undefined tensor, an exception): the guard fails
    ByCode,      ///< its metadata is answered by code (a wrapper subclass's __torch_dispatch__):
                 ///< read it outside any region, through the Python reader
};

// `v` must be an instance of a type deriving from the adapter's TensorBase (callers checked its
// exact type against a verified tensor type, or TypeCheck'd it).
NativeRead native_fields(PyObject* v, TwTensorFields& m, TensorFields& f) {
    const TwTorchAdapter* a = torch_adapter();
    if (a == nullptr) return NativeRead::Unreadable;
    const int r = a->tensor_fields(v, &m);
    if (r == 2) return NativeRead::ByCode;
    if (r != 1) return NativeRead::Unreadable;
    f.keys = m.dispatch_keys;
    apply_python_key_mask(a->python_keys_mask, f.keys, f.mask_unknown);
    f.dtype = m.dtype;
    f.device_index = m.device_index;
    f.requires_grad = m.requires_grad != 0;
    f.ndim = m.ndim;
    f.sizes = m.sizes;
    f.strides = m.has_strides ? m.strides : nullptr;
    f.storage_offset = m.storage_offset;
    return NativeRead::Ok;
}

// An int tuple into `out`; false (error set or not) when it is not one.
bool int_tuple(PyObject* t, std::vector<std::int64_t>& out) {
    if (!PyTuple_Check(t)) return false;
    out.resize(static_cast<std::size_t>(PyTuple_GET_SIZE(t)));
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(t); ++i) {
        const long long x = PyLong_AsLongLong(PyTuple_GET_ITEM(t, i));
        if (x == -1 && PyErr_Occurred()) return false;
        out[static_cast<std::size_t>(i)] = x;
    }
    return true;
}

// The Python reader's answer, parsed. 1: `f` filled (pointing into `sizes`/`strides`); 0: not a
// readable tensor; -1: error set.
struct PythonTensor {
    std::vector<std::int64_t> sizes, strides;
};
int python_fields(PyObject* v, PythonTensor& keep, TensorFields& f) {
    PyObject* reader = python_readers().tensor.get();
    if (reader == nullptr) {
        PyErr_SetString(PyExc_RuntimeError, "no tensor reader: torch support is not initialized");
        return -1;
    }
    const Ref r = Ref::steal(PyObject_CallOneArg(reader, v));
    if (!r) return -1;
    if (r.get() == Py_None) return 0;
    PyObject* t = r.get();
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 7) {
        PyErr_SetString(PyExc_TypeError, "the tensor reader returned a malformed tuple");
        return -1;
    }
    // The reader applies the thread-local include/exclude sets; the Python-key mask is applied
    // here, by the flag the native path reads (mode_flag.hpp), never by a module global.
    f.keys = PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(t, 0));
    apply_python_key_mask(python_key_bits(), f.keys, f.mask_unknown);
    f.dtype = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 1));
    f.device_index = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 2));
    const int rg = PyObject_IsTrue(PyTuple_GET_ITEM(t, 3));
    f.storage_offset = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 6));
    if (PyErr_Occurred() || rg < 0 || !int_tuple(PyTuple_GET_ITEM(t, 4), keep.sizes)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "the tensor reader returned malformed sizes");
        return -1;
    }
    f.requires_grad = rg == 1;
    PyObject* strides = PyTuple_GET_ITEM(t, 5);
    if (strides != Py_None) {
        if (!int_tuple(strides, keep.strides) || keep.strides.size() != keep.sizes.size()) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "the tensor reader returned malformed strides");
            return -1;
        }
        f.strides = keep.strides.data();
    }
    f.ndim = static_cast<std::int64_t>(keep.sizes.size());
    f.sizes = keep.sizes.data();
    return 1;
}

// -- reading arrays ----------------------------------------------------------------------------------------

bool struct_fields(PyObject* v, ArrayFields& f) {
    ArrayView a;
    if (!read_array_struct(v, a)) return false;
    f.dtype = a.descr;
    f.ndim = a.ndim;
    f.sizes = a.sizes;
    f.strides = a.strides;
    f.required_bits = array_required_bits(a.flags);
    f.writeable = array_writeable(a.flags);
    return true;
}

struct PythonArray {
    std::vector<std::int64_t> sizes, strides;
    Ref dtype;
};
int python_array_fields(PyObject* v, PythonArray& keep, ArrayFields& f) {
    PyObject* reader = python_readers().array.get();
    if (reader == nullptr) {
        PyErr_SetString(PyExc_RuntimeError, "no array reader: numpy support is not initialized");
        return -1;
    }
    const Ref r = Ref::steal(PyObject_CallOneArg(reader, v));
    if (!r) return -1;
    if (r.get() == Py_None) return 0;
    PyObject* t = r.get();
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 8 || !int_tuple(PyTuple_GET_ITEM(t, 1), keep.sizes) ||
        !int_tuple(PyTuple_GET_ITEM(t, 2), keep.strides) || keep.sizes.size() != keep.strides.size()) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "the array reader returned a malformed tuple");
        return -1;
    }
    int bits = 0;
    for (int i = 0; i < 3; ++i) {
        const int b = PyObject_IsTrue(PyTuple_GET_ITEM(t, 3 + i));
        if (b < 0) return -1;
        if (b) bits |= 1 << i;
    }
    const int w = PyObject_IsTrue(PyTuple_GET_ITEM(t, 6));
    if (w < 0) return -1;
    keep.dtype = Ref::borrow(PyTuple_GET_ITEM(t, 7));
    f.dtype = keep.dtype.get();
    f.ndim = static_cast<std::int64_t>(keep.sizes.size());
    f.sizes = keep.sizes.data();
    f.strides = keep.strides.data();
    f.required_bits = bits;
    f.writeable = w == 1;
    return 1;
}

// dtype equality as EQUALS_MATCH decides it: identity, the fields of two simple dtypes, or (a
// guard bound via_python: the expected dtype is not simple) numpy's own ==.
int dtype_equal(const RuntimeGuard& g, PyObject* actual) {
    PyObject* want = g.derived;
    if (actual == want) return 1;
    if (Py_TYPE(actual) != Py_TYPE(want)) return 0;
    if (!g.via_python) {
        return numpy_dtype_is_simple(actual) && numpy_simple_dtypes_equal(actual, want) ? 1 : 0;
    }
    return PyObject_RichCompareBool(actual, want, Py_EQ);
}

// dtype first (its comparison may fail), then the rank, sizes, strides and flags.
int compare_array(const RuntimeGuard& g, const ArrayFields& f, std::vector<FieldMismatch>* out) {
    using core::array_data::kAligned, core::array_data::kCContiguous, core::array_data::kFContiguous,
        core::array_data::kHeader, core::array_data::kNdim, core::array_data::kRequiredFlags,
        core::array_data::kWriteable;
    const std::int64_t* d = g.data;
    bool ok = true;
    const int eq = dtype_equal(g, f.dtype);
    if (eq < 0) return -1;
    if (eq == 0) {
        ok = false;
        if (!differs(out, Field::Dtype, 0, 0)) return 0;
    }
    if (d[kNdim] != f.ndim) {
        differs(out, Field::Ndim, d[kNdim], f.ndim);
        return 0;
    }
    if (!compare_dims(d + kHeader, f.ndim, f.sizes, f.strides, out)) {
        ok = false;
        if (out == nullptr) return 0;
    }
    const std::int64_t missing = d[kRequiredFlags] & ~static_cast<std::int64_t>(f.required_bits);
    for (auto [bit, field] :
         {std::pair{kCContiguous, Field::CContiguous}, std::pair{kFContiguous, Field::FContiguous},
          std::pair{kAligned, Field::Aligned}}) {
        if (missing & bit) {
            ok = false;
            if (!differs(out, field, 1, 0)) return 0;
        }
    }
    if (d[kWriteable] != static_cast<std::int64_t>(f.writeable)) {
        ok = false;
        differs(out, Field::Writeable, d[kWriteable], f.writeable);
    }
    return ok ? 1 : 0;
}

// -- dimension markings ------------------------------------------------------------------------------------

struct MarkingNames {
    PyObject* flag;
    PyObject* attrs[core::marking_data::kAttrCount];
    PyObject* shape_ids;
    PyObject* bounds;
    PyObject* issubset;
    /// The flag, then the attributes: the names whose lookups the marked fast form reads from the
    /// instance's own storage.
    PyObject* read[1 + core::marking_data::kAttrCount];
};
const MarkingNames& marking_names() {
    static const MarkingNames names = [] {
        MarkingNames n{};
        auto intern = [](std::string_view s) {
            return PyUnicode_InternFromString(std::string(s).c_str());  // held for the process
        };
        n.flag = intern(core::marking_data::kFlagAttr);
        for (int i = 0; i < core::marking_data::kAttrCount; ++i)
            n.attrs[i] = intern(core::marking_data::attr_name(i));
        n.shape_ids = intern(core::marking_data::kShapeIdsAttr);
        n.bounds = intern(core::marking_data::kUnbackedBoundsAttr);
        n.issubset = intern("issubset");
        n.read[0] = n.flag;
        for (int i = 0; i < core::marking_data::kAttrCount; ++i) n.read[1 + i] = n.attrs[i];
        return n;
    }();
    return names;
}

// getattr(v, name) or "absent": 1 (new reference in *out), 0 absent, -1 error.
int optional_attr(PyObject* v, PyObject* name, PyObject** out) {
#if PY_VERSION_HEX >= 0x030D0000
    return PyObject_GetOptionalAttr(v, name, out);
#else
    return _PyObject_LookupAttr(v, name, out);
#endif
}

// The check's comparison for arrays read from the struct with a simple expected dtype: the same
// fields as compare_array, without listing differences (the tests hold the two together).
inline bool array_equal(const RuntimeGuard& g, const ArrayView& a) {
    namespace ad = core::array_data;
    const std::int64_t* d = g.data;
    if (a.descr != g.derived && (Py_TYPE(a.descr) != Py_TYPE(g.derived) || !numpy_dtype_is_simple(a.descr) ||
                                 !numpy_simple_dtypes_equal(a.descr, g.derived)))
        return false;
    if (d[ad::kNdim] != a.ndim) return false;
    const std::int64_t* pairs = d + ad::kHeader;
    for (std::int64_t i = 0; i < a.ndim; ++i) {
        const std::int64_t size = pairs[2 * i], stride = pairs[2 * i + 1];
        if (size != kAny && size != a.sizes[i]) return false;
        if (stride != kAny && stride != a.strides[i]) return false;
    }
    const std::int64_t required = d[ad::kRequiredFlags];
    return (array_required_bits(a.flags) & required) == required &&
           d[ad::kWriteable] == static_cast<std::int64_t>(array_writeable(a.flags));
}

}  // namespace

const char* field_name(Field f) {
    switch (f) {
        case Field::Type: return "type";
        case Field::Unreadable: return "unreadable";
        case Field::DispatchKeys: return "dispatch_keys";
        case Field::Dtype: return "dtype";
        case Field::DeviceIndex: return "device_index";
        case Field::RequiresGrad: return "requires_grad";
        case Field::Ndim: return "ndim";
        case Field::Size: return "size";
        case Field::Stride: return "stride";
        case Field::StorageOffset: return "storage_offset";
        case Field::CContiguous: return "c_contiguous";
        case Field::FContiguous: return "f_contiguous";
        case Field::Aligned: return "aligned";
        case Field::Writeable: return "writeable";
        case Field::PythonKeyMask: return "python_key_mask";
    }
    return "unknown";
}

// -- TENSOR_MATCH -------------------------------------------------------------------------------------------

// The adapter's one-call comparison reads the expected record in the core's layout.
static_assert(core::tensor_data::kDispatchKeys == TW_TENSOR_KEYS &&
                  core::tensor_data::kDtype == TW_TENSOR_DTYPE &&
                  core::tensor_data::kDeviceIndex == TW_TENSOR_DEVICE_INDEX &&
                  core::tensor_data::kRequiresGrad == TW_TENSOR_REQUIRES_GRAD &&
                  core::tensor_data::kNdim == TW_TENSOR_NDIM &&
                  core::tensor_data::kStorageOffset == TW_TENSOR_STORAGE_OFFSET &&
                  core::tensor_data::kHeader == TW_TENSOR_HEADER && kAny == TW_TENSOR_ANY,
              "adapter_abi.h's TENSOR_MATCH record layout must be core::tensor_data's");

bool tensor_match_pure(const RuntimeGuard& g, PyObject* v, TwKeyMemo& memo) {
    if (g.via_python || reinterpret_cast<PyObject*>(Py_TYPE(v)) != g.a) return false;
    // The common case in one adapter call; what it does not decide (a difference, Python keys, a
    // layout without strides) is read field by field below, as before.
    if (tensor_match_quick(g, v, memo)) return true;
    TwTensorFields m;
    TensorFields f;
    return native_fields(v, m, f) == NativeRead::Ok && tensor_equal(g.data, f);
}

bool tensor_match_pure(const RuntimeGuard& g, PyObject* v) {
    TwKeyMemo memo;
    tw_key_memo_reset(&memo);
    return tensor_match_pure(g, v, memo);
}

int tensor_match(const RuntimeGuard& g, PyObject* v) {
    // The exact Python type first (a Parameter is not a Tensor), as torch does.
    if (reinterpret_cast<PyObject*>(Py_TYPE(v)) != g.a) return 0;
    if (!g.via_python) {
        if (tensor_match_pure(g, v)) return 1;
        // Not decided natively: a difference, or metadata answered by code, which only the
        // Python reader reads (here user code may run: this is no region).
        TwTensorFields m;
        TensorFields f;
        if (!g.reads_by_code || native_fields(v, m, f) != NativeRead::ByCode || !python_readers().tensor)
            return 0;
    }
    PythonTensor keep;
    TensorFields f;
    const int r = python_fields(v, keep, f);
    if (r <= 0) return r;
    return compare_tensor(g.data, f, nullptr) ? 1 : 0;
}

bool tensor_mismatches(const RuntimeGuard& g, PyObject* v, std::vector<FieldMismatch>& out) {
    if (reinterpret_cast<PyObject*>(Py_TYPE(v)) != g.a) {
        out.push_back({Field::Type, -1, 0, 0});
        return true;
    }
    TwTensorFields m;
    PythonTensor keep;
    TensorFields f;
    const NativeRead native = g.via_python ? NativeRead::ByCode : native_fields(v, m, f);
    if (native == NativeRead::Unreadable ||
        (native == NativeRead::ByCode && (!python_readers().tensor || !(g.via_python || g.reads_by_code)))) {
        out.push_back({Field::Unreadable, -1, 0, 0});
        return true;
    }
    if (native == NativeRead::ByCode) {
        const int r = python_fields(v, keep, f);
        if (r < 0) return false;
        if (r == 0) {
            out.push_back({Field::Unreadable, -1, 0, 0});
            return true;
        }
    }
    compare_tensor(g.data, f, &out);
    return true;
}

// -- ARRAY_MATCH --------------------------------------------------------------------------------------------

bool array_match_pure(const RuntimeGuard& g, PyObject* v) {
    if (g.via_python || reinterpret_cast<PyObject*>(Py_TYPE(v)) != g.a) return false;
    ArrayView a;
    return read_array_struct(v, a) && array_equal(g, a);
}

int array_match(const RuntimeGuard& g, PyObject* v) {
    if (reinterpret_cast<PyObject*>(Py_TYPE(v)) != g.a) return 0;
    if (!g.via_python) return array_match_pure(g, v) ? 1 : 0;
    ArrayFields f;
    if (!g.python_reader && struct_fields(v, f)) return compare_array(g, f, nullptr);
    PythonArray keep;
    const int r = python_array_fields(v, keep, f);
    if (r <= 0) return r;
    return compare_array(g, f, nullptr);
}

bool array_mismatches(const RuntimeGuard& g, PyObject* v, std::vector<FieldMismatch>& out) {
    if (reinterpret_cast<PyObject*>(Py_TYPE(v)) != g.a) {
        out.push_back({Field::Type, -1, 0, 0});
        return true;
    }
    ArrayFields f;
    PythonArray keep;
    if (g.python_reader || !struct_fields(v, f)) {
        const int r = python_array_fields(v, keep, f);
        if (r < 0) return false;
        if (r == 0) {
            out.push_back({Field::Unreadable, -1, 0, 0});
            return true;
        }
    }
    return compare_array(g, f, &out) >= 0;
}

// -- DIMENSION_MARKING --------------------------------------------------------------------------------------

namespace {

// Whether exact set `s` is a subset of the `n` built dimensions at `want`, as `s.issubset(built)`
// answers when every element is an exact int; false when not, or when an element is anything
// else (a bool, a float, an int subclass, a user object whose __eq__ could answer anything: the
// slow path decides those by the set's own issubset).
//
// There is no public allocation-free way to walk a set (_PySet_NextEntry is private), and
// PySet_Contains per built index would compare with any element of a colliding hash through that
// element's __eq__ (user code). So it walks a set iterator, the one allocation here, with the
// collector off meanwhile: a collection inside the allocation could run finalizers that mutate
// this set or the tensor's dict between our reads. Nothing else runs until the iterator is gone:
// the elements are exact ints (their decref frees nothing the set still holds).
bool set_within(PyObject* s, const std::int64_t* want, std::int64_t n) {
    if (!PySet_CheckExact(s)) return false;
    const Py_ssize_t size = PySet_GET_SIZE(s);
    if (size == 0) return true;
    if (size > n) return false;  // more elements than built dimensions: not a subset
    const int collecting = PyGC_Disable();
    PyObject* it = PyObject_GetIter(s);
    bool ok = it != nullptr;
    bool raised = !ok;  // no memory for the iterator
    while (ok) {
        PyObject* x = PyIter_Next(it);
        if (x == nullptr) {
            raised = PyErr_Occurred() != nullptr;  // the set changed size: cannot happen here
            break;
        }
        ok = PyLong_CheckExact(x);
        if (ok) {
            int overflow = 0;
            const long long d = PyLong_AsLongLongAndOverflow(x, &overflow);
            ok = overflow == 0 && std::find(want, want + n, static_cast<std::int64_t>(d)) != want + n;
        }
        Py_DECREF(x);
    }
    Py_XDECREF(it);
    if (raised) {  // not decided here: the slow path reads the set again
        PyErr_Clear();
        ok = false;
    }
    if (collecting) PyGC_Enable();
    return ok;
}

}  // namespace

bool dimension_marking_marked(const RuntimeGuard& g, PyObject* v, bool fill) {
    static const MarkingNames& names = marking_names();
    if (g.marking == nullptr) return false;
    PyTypeObject* tp = Py_TYPE(v);
    if (!fill && !attr_cache_valid(g.marking->names, tp)) return false;  // unmarked_type stays as is
    const bool in_storage =
        attributes_in_instance_storage(g.marking->names, tp, names.read, 1 + core::marking_data::kAttrCount);
    // names may have been filled for tp just now: what the fused op may then assume, for tp alone.
    g.marking->unmarked_type = in_storage && managed_storage_in_mirror(tp) ? tp : nullptr;
    if (!in_storage) return false;
    // Every name is now present exactly when v's own storage holds it, read without user code.
    PyObject* got = nullptr;
    int r = instance_attr_absent(v, names.flag, &g.marking->absent, &got);
    if (r != 0) return r == 1;  // no flag: no constraint; undecided: the slow path reads it
    // The same decision as dimension_marking's, attribute by attribute.
    bool any_built = false;
    bool ok = true;
    const std::int64_t* d = g.data;
    for (int a = 0; a < core::marking_data::kAttrCount && ok; ++a) {
        const std::int64_t n = *d++;
        any_built = any_built || n >= 0;
        r = instance_attr_absent(v, names.attrs[a], nullptr, &got);
        // Absent now: no constraint. Present: built with it, and within the built dimensions.
        ok = r == 1 || (r == 0 && n >= 0 && set_within(got, d, n));
        if (n > 0) d += n;
    }
    // Gated dependent attributes present now are compared by == on arbitrary values: the slow
    // path does that.
    if (ok && g.flag) ok = instance_attr_absent(v, names.attrs[core::marking_data::kGateAttr]) == 1;
    return ok && any_built;
}

bool dimension_marking_pure(const RuntimeGuard& g, PyObject* v, bool fill) {
    // The common case: a tensor nobody marked carries no _has_dynamo_dim_marking at all. The
    // name is interned once (marking_names) and kept here, off the function-local static's guard.
    static PyObject* const flag = marking_names().flag;
    if (dimension_marking_quick(g, v)) return true;
    if (g.marking == nullptr) return false;
    if (dimension_marking_marked(g, v, fill)) return true;
    // A class defines a marking attribute (the slow path reads it), but perhaps not the flag.
    return g.marking->names.mode != AttrCache::Mode::InstanceDict &&
           attribute_certainly_absent(g.marking->flag, g.marking->absent, v, flag, fill);
}

int dimension_marking(const RuntimeGuard& g, PyObject* v) {
    const MarkingNames& names = marking_names();
    if (dimension_marking_pure(g, v)) return 1;
    // torch's DIMENSION_DYNAMIC_MARKING_GUARD: no marking flag at run time, no constraint.
    PyObject* got = nullptr;
    int r = optional_attr(v, names.flag, &got);
    Py_XDECREF(got);
    if (r <= 0) return r < 0 ? -1 : 1;
    // Marked now but built without any marking: a new marking, so recompile.
    bool any_built = false;
    for (std::size_t at = 0, a = 0; a < core::marking_data::kAttrCount; ++a) {
        const std::int64_t n = g.data[at++];
        any_built = any_built || n >= 0;
        if (n > 0) at += static_cast<std::size_t>(n);
    }
    if (!any_built) return 0;
    PyObject* built = g.derived;  // tuple: per attribute a frozenset, or None when absent at build
    for (int a = 0; a < core::marking_data::kAttrCount; ++a) {
        got = nullptr;
        r = optional_attr(v, names.attrs[a], &got);
        if (r < 0) return -1;
        if (r == 0) continue;  // built with it and absent now, or absent both times: no constraint
        const Ref now = Ref::steal(got);
        PyObject* want = PyTuple_GET_ITEM(built, a);
        if (want == Py_None) return 0;  // absent at build, present now
        // The marking must be a subset of the built one, by the run-time value's own issubset.
        const Ref sub = Ref::steal(PyObject_CallMethodOneArg(now.get(), names.issubset, want));
        if (!sub) return -1;
        const int t = PyObject_IsTrue(sub.get());
        if (t <= 0) return t;
    }
    if (g.flag) {
        // Dependent attributes, compared by == when the gate (_dynamo_unbacked_indices) is
        // present at run time.
        got = nullptr;
        r = optional_attr(v, names.attrs[core::marking_data::kGateAttr], &got);
        Py_XDECREF(got);
        if (r < 0) return -1;
        if (r == 1) {
            for (auto [name, want] : {std::pair{names.shape_ids, g.a}, std::pair{names.bounds, g.b}}) {
                got = nullptr;
                r = optional_attr(v, name, &got);
                if (r < 0) return -1;
                const Ref now = Ref::steal(r == 1 ? got : Py_NewRef(Py_None));
                const int eq = PyObject_RichCompareBool(now.get(), want, Py_EQ);
                if (eq <= 0) return eq;
            }
        }
    }
    return 1;
}

// -- derived objects
// -----------------------------------------------------------------------------------------

Ref derive_array_dtype(PyObject* description) {
    if (is_numpy_dtype(description)) return Ref::borrow(description);
    const Ref numpy = Ref::steal(PyImport_ImportModule("numpy"));
    if (!numpy) return Ref();
    const Ref dtype = Ref::steal(PyObject_GetAttrString(numpy.get(), "dtype"));
    if (!dtype) return Ref();
    Ref arg = Ref::borrow(description);
    if (PyTuple_Check(description)) arg = Ref::steal(PySequence_List(description));  // a structured descr
    if (!arg) return Ref();
    return Ref::steal(PyObject_CallOneArg(dtype.get(), arg.get()));
}

Ref derive_marking_sets(const std::vector<std::int64_t>& data) {
    Ref out = Ref::steal(PyTuple_New(core::marking_data::kAttrCount));
    if (!out) return out;
    std::size_t at = 0;
    for (int a = 0; a < core::marking_data::kAttrCount; ++a) {
        const std::int64_t n = data[at++];
        if (n < 0) {
            PyTuple_SET_ITEM(out.get(), a, Py_NewRef(Py_None));
            continue;
        }
        Ref items = Ref::steal(PyList_New(0));
        if (!items) return Ref();
        for (std::int64_t k = 0; k < n; ++k) {
            const Ref x = Ref::steal(PyLong_FromLongLong(data[at++]));
            if (!x || PyList_Append(items.get(), x.get()) < 0) return Ref();
        }
        PyObject* set = PyFrozenSet_New(items.get());
        if (set == nullptr) return Ref();
        PyTuple_SET_ITEM(out.get(), a, set);
    }
    return out;
}

// -- diagnostics and builders: the fields as the engine reads them
// ---------------------------------------------

namespace {
Ref int_tuple_of(const std::int64_t* xs, std::int64_t n) {
    Ref t = Ref::steal(PyTuple_New(n));
    if (!t) return t;
    for (std::int64_t i = 0; i < n; ++i) {
        PyObject* x = PyLong_FromLongLong(xs[i]);
        if (x == nullptr) return Ref();
        PyTuple_SET_ITEM(t.get(), i, x);
    }
    return t;
}
}  // namespace

Ref read_tensor_fields(PyObject* v, bool native) {
    TwTensorFields m;
    TensorFields f;
    PythonTensor keep;
    if (native) {
        if (torch_adapter() == nullptr || !PyObject_TypeCheck(v, torch_adapter()->tensor_base_type))
            return Ref::borrow(Py_None);
        const NativeRead r = native_fields(v, m, f);
        if (r == NativeRead::Unreadable || (r == NativeRead::ByCode && !python_readers().tensor))
            return Ref::borrow(Py_None);
        native = r == NativeRead::Ok;
    }
    if (!native) {
        const int r = python_fields(v, keep, f);
        if (r < 0) return Ref();
        if (r == 0) return Ref::borrow(Py_None);
    }
    const Ref sizes = int_tuple_of(f.sizes, f.ndim);
    const Ref strides = f.strides != nullptr ? int_tuple_of(f.strides, f.ndim) : Ref::borrow(Py_None);
    if (!sizes || !strides) return Ref();
    return Ref::steal(Py_BuildValue("(KLLOOOL)", static_cast<unsigned long long>(f.keys),
                                    static_cast<long long>(f.dtype), static_cast<long long>(f.device_index),
                                    f.requires_grad ? Py_True : Py_False, sizes.get(), strides.get(),
                                    static_cast<long long>(f.storage_offset)));
}

Ref read_array_fields(PyObject* v, bool native) {
    ArrayFields f;
    PythonArray keep;
    if (native) {
        if (!struct_fields(v, f)) return Ref::borrow(Py_None);
    } else {
        const int r = python_array_fields(v, keep, f);
        if (r < 0) return Ref();
        if (r == 0) return Ref::borrow(Py_None);
    }
    const Ref sizes = int_tuple_of(f.sizes, f.ndim);
    const Ref strides = int_tuple_of(f.strides, f.ndim);
    if (!sizes || !strides) return Ref();
    auto flag = [&](int bit) { return (f.required_bits & bit) ? Py_True : Py_False; };
    return Ref::steal(Py_BuildValue("(LOOOOOOO)", static_cast<long long>(f.ndim), sizes.get(), strides.get(),
                                    flag(1), flag(2), flag(4), f.writeable ? Py_True : Py_False, f.dtype));
}

// -- DISPATCH_KEY_SET_MATCH ---------------------------------------------------------------------------

bool applied_key_set(PyObject* v, std::uint64_t& out) {
    const TwTorchAdapter* a = torch_adapter();
    std::uint64_t raw = 0;
    if (a == nullptr || a->dispatch_key_set_bits(v, &raw) != 1) return false;
    // (keys | tls include) - tls exclude, by DispatchKeySet's own operators (guards.h
    // LocalState::apply); then the Python keys, unless a dispatch mode without
    // ignore_compile_internals is active (read only when one of them is present).
    std::uint64_t keys = a->apply_local_keys(raw, 0);
    bool unknown = false;
    apply_python_key_mask(a->python_keys_mask, keys, unknown);
    out = keys;
    return !unknown;  // torch's flag not found and a Python key present: undecidable, fails closed
}

int dispatch_key_set_match(const RuntimeGuard& g, PyObject* v) {
    std::uint64_t keys = 0;
    return applied_key_set(v, keys) && keys == static_cast<std::uint64_t>(g.n) ? 1 : 0;
}

}  // namespace tripwire::runtime
