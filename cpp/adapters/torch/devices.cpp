// tripwire/cpp/adapters/torch/devices.cpp -- the torch adapter's reads of torch.device and torch.dtype.
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>

#include <cstdint>
#include <string>

#include "adapters/torch/adapter.hpp"

namespace tripwire::torch_adapter {

int read_device(PyObject* obj, int32_t* type, int32_t* index) noexcept {
    if (!THPDevice_Check(obj)) return 0;
    const at::Device& d = reinterpret_cast<THPDevice*>(obj)->device;
    *type = static_cast<int32_t>(d.type());
    // DeviceIndex is a signed int8: -1 (no index) must stay -1, so no cast through unsigned char.
    // NOLINTNEXTLINE(bugprone-signed-char-misuse)
    *index = d.index();
    return 1;
}

int parse_device(const char* text, int32_t* type, int32_t* index) noexcept {
    try {
        const c10::Device d{std::string(text)};
        *type = static_cast<int32_t>(d.type());
        // DeviceIndex is a signed int8: -1 (no index) must stay -1, so no cast through unsigned char.
        // NOLINTNEXTLINE(bugprone-signed-char-misuse)
        *index = d.index();
        return 1;
    } catch (...) {
        return 0;
    }
}

int dtype_code(PyObject* obj) noexcept {
    if (!THPDtype_Check(obj)) return -1;
    return static_cast<int>(reinterpret_cast<THPDtype*>(obj)->scalar_type);
}

int device_equal(PyObject* a, PyObject* b) noexcept {
    if (!THPDevice_Check(a) || !THPDevice_Check(b)) return 0;
    return reinterpret_cast<THPDevice*>(a)->device == reinterpret_cast<THPDevice*>(b)->device ? 1 : 0;
}

}  // namespace tripwire::torch_adapter
