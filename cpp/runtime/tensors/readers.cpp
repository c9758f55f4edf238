// tripwire/cpp/runtime/tensors/readers.cpp -- the torch adapter table, Python readers, shapes.
// (numpy's struct: numpy_struct.cpp.)
#include "runtime/tensors/readers.hpp"

#include <cstring>
#include <string>

#include "runtime/eval/constant_types.hpp"
#include "runtime/tensors/property_reader.hpp"

namespace tripwire::runtime {
const TwTorchAdapter* g_adapter = nullptr;  // readers.hpp: read inline by torch_adapter()

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
