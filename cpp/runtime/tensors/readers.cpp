// tripwire/cpp/runtime/tensors/readers.cpp -- the torch adapter table, Python readers, the numpy struct.
#include "runtime/tensors/readers.hpp"

#include <cstring>
#include <string>

#include "runtime/eval/constant_types.hpp"
#include "runtime/tensors/property_reader.hpp"

#ifdef TRIPWIRE_HAVE_NUMPY
// Only the struct layouts and flag values: numpy's C-API table (import_array) is never used, so
// numpy stays optional at run time and is imported by the package, not by this module.
#define NPY_NO_DEPRECATED_API NPY_2_0_API_VERSION
#define NPY_TARGET_VERSION NPY_2_0_API_VERSION  // the full 2.x descriptor (elsize)
#include <numpy/ndarraytypes.h>
#endif

namespace tripwire::runtime {
const TwTorchAdapter* g_adapter = nullptr;  // readers.hpp: read inline by torch_adapter()

namespace {
PyTypeObject* g_ndarray = nullptr;
PyTypeObject* g_dtype_base = nullptr;

}  // namespace

bool install_torch_adapter(PyObject* capsule, const char* torch_version) {
    if (g_adapter != nullptr) return true;
    auto* table =
        static_cast<const TwTorchAdapter*>(PyCapsule_GetPointer(capsule, TRIPWIRE_TORCH_ADAPTER_CAPSULE));
    if (table == nullptr) return false;
    if (table->abi_version != TRIPWIRE_TORCH_ADAPTER_ABI || table->struct_size < sizeof(TwTorchAdapter)) {
        PyErr_Format(PyExc_ImportError, "the torch adapter has ABI %u (size %u); this tripwire needs ABI %d",
                     table->abi_version, table->struct_size, TRIPWIRE_TORCH_ADAPTER_ABI);
        return false;
    }
    if (torch_version == nullptr || table->torch_version == nullptr ||
        std::strcmp(torch_version, table->torch_version) != 0) {
        // Compiled against another torch's C++ API: field offsets and symbols may differ.
        PyErr_Format(PyExc_ImportError, "the torch adapter was built for torch %s, this is torch %s",
                     table->torch_version ? table->torch_version : "?", torch_version ? torch_version : "?");
        return false;
    }
    // torch's value-like objects become EQUALS_MATCH constants (constant_types.hpp).
    if (!register_constant_type(table->dtype_type, ConstantCompare::Identity, nullptr, false) ||
        !register_constant_type(table->size_type, ConstantCompare::Tuple, nullptr, false) ||
        !register_constant_type(table->device_type, ConstantCompare::Native, table->device_equal, false))
        return false;
    g_adapter = table;
    install_property_reader();  // SIZE/STRIDE/STORAGE_OFFSET of plain tensors (property_reader.hpp)
    return true;
}

namespace {
bool g_force_python = false;
}  // namespace
void set_force_python_readers(bool on) { g_force_python = on; }
bool force_python_readers() { return g_force_python; }

PythonReaders& python_readers() {
    static PythonReaders* readers = new PythonReaders();  // lives until process exit
    return *readers;
}

// -- numpy ----------------------------------------------------------------------------------------------

#ifdef TRIPWIRE_HAVE_NUMPY
static_assert(sizeof(npy_intp) == sizeof(std::int64_t), "npy_intp must be 64 bits");

bool numpy_struct_compiled() { return true; }

bool enable_numpy_struct(PyObject* ndarray_type) {
    if (!PyType_Check(ndarray_type)) return false;
    auto* t = reinterpret_cast<PyTypeObject*>(ndarray_type);
    if (t->tp_basicsize < static_cast<Py_ssize_t>(sizeof(PyArrayObject_fields))) return false;
    // numpy.dtype is the type of an array's descr; found from a fresh array's dtype would need an
    // allocation, so from the module.
    PyObject* mod = PyImport_ImportModule("numpy");
    if (mod == nullptr) {
        PyErr_Clear();
        return false;
    }
    PyObject* dtype = PyObject_GetAttrString(mod, "dtype");
    Py_DECREF(mod);
    if (dtype == nullptr || !PyType_Check(dtype)) {
        Py_XDECREF(dtype);
        PyErr_Clear();
        return false;
    }
    Py_INCREF(ndarray_type);
    g_ndarray = t;  // both held for the process
    g_dtype_base = reinterpret_cast<PyTypeObject*>(dtype);
    install_property_reader();  // SIZE/STRIDE of exact numpy.ndarray values (property_reader.hpp)
    return true;
}

bool read_array_struct(PyObject* obj, ArrayView& out) { return read_array_struct_of(obj, g_ndarray, out); }

bool read_array_struct_of(PyObject* obj, PyTypeObject* ndarray, ArrayView& out) {
    if (ndarray == nullptr || ndarray->tp_basicsize < static_cast<Py_ssize_t>(sizeof(PyArrayObject_fields)) ||
        !PyObject_TypeCheck(obj, ndarray))
        return false;
    auto* a = reinterpret_cast<PyArrayObject_fields*>(obj);
    out.ndim = a->nd;
    out.sizes = reinterpret_cast<const std::int64_t*>(a->dimensions);
    out.strides = reinterpret_cast<const std::int64_t*>(a->strides);
    out.flags = a->flags;
    out.descr = reinterpret_cast<PyObject*>(a->descr);
    out.data = a->data;
    out.itemsize = static_cast<std::int64_t>(a->descr->elsize);
    return true;
}

int array_required_bits(int f) {
    int bits = 0;
    if (f & NPY_ARRAY_C_CONTIGUOUS) bits |= 1;
    if (f & NPY_ARRAY_F_CONTIGUOUS) bits |= 2;
    if (f & NPY_ARRAY_ALIGNED) bits |= 4;
    return bits;
}
bool array_writeable(int f) { return (f & NPY_ARRAY_WRITEABLE) != 0; }

bool is_numpy_dtype(PyObject* o) { return g_dtype_base != nullptr && PyObject_TypeCheck(o, g_dtype_base); }

namespace {
bool simple_type_num(int n) {
    return (n >= NPY_BOOL && n <= NPY_CLONGDOUBLE) || n == NPY_OBJECT || n == NPY_STRING ||
           n == NPY_UNICODE || n == NPY_HALF;
}
char normalized_byteorder(char c) {
#if PY_LITTLE_ENDIAN
    return c == '=' ? '<' : c;
#else
    return c == '=' ? '>' : c;
#endif
}
}  // namespace

bool numpy_dtype_is_simple(PyObject* d) {
    if (!is_numpy_dtype(d)) return false;
    return simple_type_num(reinterpret_cast<PyArray_Descr*>(d)->type_num);
}

bool numpy_simple_dtypes_equal(PyObject* a, PyObject* b) {
    const auto* x = reinterpret_cast<PyArray_Descr*>(a);
    const auto* y = reinterpret_cast<PyArray_Descr*>(b);
    if (x->type_num != y->type_num) return false;
    if (normalized_byteorder(x->byteorder) != normalized_byteorder(y->byteorder)) return false;
    if (x->type_num == NPY_STRING || x->type_num == NPY_UNICODE) return x->elsize == y->elsize;
    return true;
}
#else
bool numpy_struct_compiled() { return false; }
bool enable_numpy_struct(PyObject*) { return false; }
bool read_array_struct(PyObject*, ArrayView&) { return false; }
bool read_array_struct_of(PyObject*, PyTypeObject*, ArrayView&) { return false; }
int array_required_bits(int) { return 0; }
bool array_writeable(int) { return false; }
bool is_numpy_dtype(PyObject*) { return false; }
bool numpy_dtype_is_simple(PyObject*) { return false; }
bool numpy_simple_dtypes_equal(PyObject*, PyObject*) { return false; }
#endif

PyTypeObject* numpy_ndarray_type() { return g_ndarray; }

// -- shapes -----------------------------------------------------------------------------------------------

ShapeRead read_shape(PyObject* obj, ShapeView& out) {
    ArrayView a;
    if (read_array_struct(obj, a)) {
        out.ndim = a.ndim;
        out.sizes = a.sizes;
        out.strides = a.strides;
        out.storage_offset = 0;
        out.has_storage_offset = false;
        out.stride_unit = a.itemsize;
        return ShapeRead::Ok;
    }
    if (g_adapter == nullptr) {
        // A tensor without the adapter: torch is imported when its tensors exist, but this
        // runtime cannot read them without a Python call.
        return ShapeRead::NotApplicable;
    }
    if (!PyObject_TypeCheck(obj, g_adapter->tensor_base_type)) return ShapeRead::NotApplicable;
    TwTensorMeta m;
    if (g_adapter->read_tensor(obj, 1, &m) != 1) return ShapeRead::Unavailable;
    out.ndim = m.ndim;
    out.sizes = m.sizes;
    out.strides = m.has_strides ? m.strides : nullptr;
    out.storage_offset = m.storage_offset;
    out.has_storage_offset = true;
    out.stride_unit = 1;
    return ShapeRead::Ok;
}

}  // namespace tripwire::runtime
