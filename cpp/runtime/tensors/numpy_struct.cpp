// tripwire/cpp/runtime/tensors/numpy_struct.cpp -- numpy arrays and dtypes read from their structs.
//
// The one place that reads numpy's memory. numpy's headers are not used: the build needs no numpy,
// and the module imports and works without it. The fields read here are declared below as
// numpy's C API documents them (numpy/ndarraytypes.h). Their layout is one of two:
// - PyArrayObject_fields (data, nd, dimensions, strides, base, descr, flags) has had the same
//   leading fields since numpy 1.7, in 1.x and 2.x;
// - PyArray_Descr's leading fields (typeobj, kind, type, byteorder, a char, type_num) are the same
//   in 1.x and 2.x; its `elsize` is not: an int right after type_num in 1.x, an npy_intp after a
//   64-bit flags word in 2.x (NumpyDescrLayout).
// Nothing here is trusted until the package (tripwire.tensors.ensure_numpy) compared what these
// reads see with numpy's own attributes on probe arrays and dtypes (read_array_struct_of,
// read_descr_of) and then called enable_numpy_struct.
#include <cstddef>
#include <cstdint>

#include "runtime/tensors/property_reader.hpp"
#include "runtime/tensors/readers.hpp"

namespace tripwire::runtime {

namespace {

// PyArrayObject_fields up to `flags` (the fields after it are not read).
struct NpyArray {
    PyObject_HEAD char* data;
    int nd;
    Py_ssize_t* dimensions;  // npy_intp: Py_intptr_t, the size of Py_ssize_t
    Py_ssize_t* strides;
    PyObject* base;
    PyObject* descr;
    int flags;
};
// PyArray_Descr's leading fields, common to numpy 1.x and 2.x.
struct NpyDescrHead {
    PyObject_HEAD PyTypeObject* typeobj;
    char kind;
    char type;
    char byteorder;
    char former_flags;  // 1.x: flags; 2.x: unused
    int type_num;
};
struct NpyDescr1 {  // numpy 1.x
    NpyDescrHead head;
    int elsize;
};
struct NpyDescr2 {  // numpy 2.x
    NpyDescrHead head;
    std::uint64_t flags;
    Py_ssize_t elsize;
};
static_assert(sizeof(Py_ssize_t) == sizeof(std::int64_t), "ArrayView points at numpy's npy_intp arrays");
static_assert(offsetof(NpyDescr1, elsize) == offsetof(NpyDescrHead, type_num) + sizeof(int),
              "numpy 1.x: elsize follows type_num");

// numpy's flag bits and type numbers (the C API's NPY_ARRAY_* and NPY_TYPES, unchanged since 1.x).
constexpr int kCContiguous = 0x0001, kFContiguous = 0x0002, kAligned = 0x0100, kWriteable = 0x0400;
constexpr int kBool = 0, kCLongDouble = 16, kObject = 17, kString = 18, kUnicode = 19, kHalf = 23;

PyTypeObject* g_ndarray = nullptr;
PyTypeObject* g_dtype_base = nullptr;
NumpyDescrLayout g_layout = NumpyDescrLayout::V2;

std::size_t descr_size(NumpyDescrLayout layout) {
    return layout == NumpyDescrLayout::V1 ? sizeof(NpyDescr1) : sizeof(NpyDescr2);
}

bool known_layout(int layout) {
    return layout == static_cast<int>(NumpyDescrLayout::V1) ||
           layout == static_cast<int>(NumpyDescrLayout::V2);
}

const NpyDescrHead* head_of(PyObject* d) { return reinterpret_cast<const NpyDescrHead*>(d); }

std::int64_t elsize_of(PyObject* d, NumpyDescrLayout layout) {
    if (layout == NumpyDescrLayout::V1) return reinterpret_cast<const NpyDescr1*>(d)->elsize;
    return reinterpret_cast<const NpyDescr2*>(d)->elsize;
}

bool read_array(PyObject* obj, PyTypeObject* ndarray, NumpyDescrLayout layout, ArrayView& out) {
    if (ndarray == nullptr || ndarray->tp_basicsize < static_cast<Py_ssize_t>(sizeof(NpyArray)) ||
        !PyObject_TypeCheck(obj, ndarray))
        return false;
    const auto* a = reinterpret_cast<const NpyArray*>(obj);
    out.ndim = a->nd;
    out.sizes = reinterpret_cast<const std::int64_t*>(a->dimensions);
    out.strides = reinterpret_cast<const std::int64_t*>(a->strides);
    out.flags = a->flags;
    out.descr = a->descr;
    out.data = a->data;
    out.itemsize = elsize_of(a->descr, layout);
    return true;
}

bool simple_type_num(int n) {
    return (n >= kBool && n <= kCLongDouble) || n == kObject || n == kString || n == kUnicode || n == kHalf;
}
char normalized_byteorder(char c) {
#if PY_LITTLE_ENDIAN
    return c == '=' ? '<' : c;
#else
    return c == '=' ? '>' : c;
#endif
}

// numpy's own attribute `name` (borrowed), from the imported module's namespace: no code runs (no
// module __getattr__), null when numpy is not imported.
PyObject* numpy_attr(const char* name) {
    PyObject* np = PyDict_GetItemString(PyImport_GetModuleDict(), "numpy");
    return np != nullptr && PyModule_Check(np) ? PyDict_GetItemString(PyModule_GetDict(np), name) : nullptr;
}
// The struct reads trust the layout of these types' instances: only numpy's own ndarray and dtype
// are accepted (a caller's other type, however large its instances, is refused).
bool numpys_types(PyTypeObject* ndarray, PyTypeObject* dtype) {
    return (ndarray == nullptr || numpy_attr("ndarray") == reinterpret_cast<PyObject*>(ndarray)) &&
           numpy_attr("dtype") == reinterpret_cast<PyObject*>(dtype);
}

}  // namespace

bool enable_numpy_struct(PyObject* ndarray_type, PyObject* dtype_type, int descr_layout) {
    if (g_ndarray != nullptr) {  // once: guard sets keep pointers to the types; the same call is a no-op
        return ndarray_type == reinterpret_cast<PyObject*>(g_ndarray) &&
               dtype_type == reinterpret_cast<PyObject*>(g_dtype_base) &&
               descr_layout == static_cast<int>(g_layout);
    }
    if (!PyType_Check(ndarray_type) || !PyType_Check(dtype_type) || !known_layout(descr_layout)) return false;
    auto* nd = reinterpret_cast<PyTypeObject*>(ndarray_type);
    auto* dt = reinterpret_cast<PyTypeObject*>(dtype_type);
    const auto layout = static_cast<NumpyDescrLayout>(descr_layout);
    if (!numpys_types(nd, dt) || nd->tp_basicsize < static_cast<Py_ssize_t>(sizeof(NpyArray)) ||
        dt->tp_basicsize < static_cast<Py_ssize_t>(descr_size(layout)))
        return false;
    g_layout = layout;  // written before g_ndarray: readers test g_ndarray first (all under the GIL)
    g_dtype_base = reinterpret_cast<PyTypeObject*>(Py_NewRef(dtype_type));  // both held for the process
    g_ndarray = reinterpret_cast<PyTypeObject*>(Py_NewRef(ndarray_type));
    install_property_reader();  // SIZE/STRIDE of exact numpy.ndarray values (property_reader.hpp)
    return true;
}

PyTypeObject* numpy_ndarray_type() { return g_ndarray; }

bool read_array_struct(PyObject* obj, ArrayView& out) { return read_array(obj, g_ndarray, g_layout, out); }

bool read_array_struct_of(PyObject* obj, PyTypeObject* ndarray, PyTypeObject* dtype, int descr_layout,
                          ArrayView& out) {
    if (!known_layout(descr_layout) || !numpys_types(ndarray, dtype) ||
        dtype->tp_basicsize <
            static_cast<Py_ssize_t>(descr_size(static_cast<NumpyDescrLayout>(descr_layout))))
        return false;
    if (!read_array(obj, ndarray, static_cast<NumpyDescrLayout>(descr_layout), out)) return false;
    return PyObject_TypeCheck(out.descr, dtype) != 0;
}

bool read_descr_of(PyObject* d, PyTypeObject* dtype, int descr_layout, DescrView& out) {
    if (!known_layout(descr_layout) || !numpys_types(nullptr, dtype) || !PyObject_TypeCheck(d, dtype))
        return false;
    const auto layout = static_cast<NumpyDescrLayout>(descr_layout);
    if (dtype->tp_basicsize < static_cast<Py_ssize_t>(descr_size(layout))) return false;
    const NpyDescrHead* h = head_of(d);
    out.type_num = h->type_num;
    out.kind = h->kind;
    out.type = h->type;
    out.byteorder = h->byteorder;
    out.elsize = elsize_of(d, layout);
    return true;
}

int array_required_bits(int f) {
    int bits = 0;
    if (f & kCContiguous) bits |= 1;
    if (f & kFContiguous) bits |= 2;
    if (f & kAligned) bits |= 4;
    return bits;
}
bool array_writeable(int f) { return (f & kWriteable) != 0; }

bool is_numpy_dtype(PyObject* o) { return g_dtype_base != nullptr && PyObject_TypeCheck(o, g_dtype_base); }

bool numpy_dtype_is_simple(PyObject* d) { return is_numpy_dtype(d) && simple_type_num(head_of(d)->type_num); }

bool numpy_simple_dtypes_equal(PyObject* a, PyObject* b) {
    const NpyDescrHead* x = head_of(a);
    const NpyDescrHead* y = head_of(b);
    if (x->type_num != y->type_num) return false;
    if (normalized_byteorder(x->byteorder) != normalized_byteorder(y->byteorder)) return false;
    if (x->type_num == kString || x->type_num == kUnicode)
        return elsize_of(a, g_layout) == elsize_of(b, g_layout);
    return true;
}

}  // namespace tripwire::runtime
