// tripwire/cpp/core/kind_data.cpp -- validation of the per-kind plain data (kind_data.hpp).
#include "core/kind_data.hpp"

#include <string>

#include "core/program.hpp"

namespace tripwire::core {
namespace {

[[noreturn]] void fail(const std::string& why) { throw InvalidProgram(why); }

void need_bool(std::int64_t v, const char* what) {
    if (v != 0 && v != 1) fail(std::string(what) + " must be 0 or 1");
}

// ndim at data[at], then (size, stride) pairs from `header`.
void validate_dims(const std::vector<std::int64_t>& data, std::size_t at, std::size_t header,
                   const char* kind) {
    const std::int64_t ndim = data[at];
    if (ndim < 0 || ndim > kMaxDims) fail(std::string(kind) + " has a bad ndim");
    if (data.size() != header + 2 * static_cast<std::size_t>(ndim)) {
        fail(std::string(kind) + " data does not match its ndim");
    }
    for (std::size_t i = header; i < data.size(); i += 2) {
        if (data[i] != kAny && data[i] < 0) fail(std::string(kind) + " has a negative size");
    }
}

void validate_tensor(const std::vector<std::int64_t>& d) {
    using tensor_data::kDeviceIndex, tensor_data::kDtype, tensor_data::kHeader, tensor_data::kNdim,
        tensor_data::kRequiresGrad, tensor_data::kStorageOffset;
    if (d.size() < kHeader) fail("TENSOR_MATCH data is too short");
    if (d[kDtype] < 0 || d[kDtype] > 255) fail("TENSOR_MATCH has a bad dtype");
    if (d[kDeviceIndex] < -1 || d[kDeviceIndex] > 0xFFFF) fail("TENSOR_MATCH has a bad device index");
    need_bool(d[kRequiresGrad], "TENSOR_MATCH requires_grad");
    if (d[kStorageOffset] != kAny && d[kStorageOffset] < 0)
        fail("TENSOR_MATCH has a negative storage offset");
    validate_dims(d, kNdim, kHeader, "TENSOR_MATCH");
}

void validate_array(const std::vector<std::int64_t>& d) {
    using array_data::kAllFlags, array_data::kHeader, array_data::kNdim, array_data::kRequiredFlags,
        array_data::kWriteable;
    if (d.size() < kHeader) fail("ARRAY_MATCH data is too short");
    if (d[kRequiredFlags] < 0 || (d[kRequiredFlags] & ~kAllFlags) != 0) fail("ARRAY_MATCH has bad flags");
    need_bool(d[kWriteable], "ARRAY_MATCH writeable");
    validate_dims(d, kNdim, kHeader, "ARRAY_MATCH");
}

void validate_marking(const std::vector<std::int64_t>& d) {
    std::size_t at = 0;
    for (int a = 0; a < marking_data::kAttrCount; ++a) {
        if (at >= d.size()) fail("DIMENSION_MARKING data is too short");
        const std::int64_t n = d[at++];
        if (n < -1 || n > kMaxDims) fail("DIMENSION_MARKING has a bad count");
        if (n > 0) {
            if (static_cast<std::size_t>(n) > d.size() - at) fail("DIMENSION_MARKING data is too short");
            at += static_cast<std::size_t>(n);
        }
    }
    if (at != d.size()) fail("DIMENSION_MARKING data is too long");
}

void validate_torch_state(const std::vector<std::int64_t>& d) {
    using torch_state::kAllowTf32, torch_state::kAutocastCacheEnabled, torch_state::kAutocastDevices,
        torch_state::kDeterministicAlgorithms, torch_state::kDeterministicWarnOnly, torch_state::kGradMode,
        torch_state::kHeader, torch_state::kMaxAutocastDevices, torch_state::kNumThreads,
        torch_state::kTorchFunction, torch_state::kTorchFunctionAllDisabled;
    if (d.size() < kHeader) fail("torch global state snapshot is too short");
    for (std::size_t f : {kGradMode, kTorchFunction, kTorchFunctionAllDisabled, kDeterministicAlgorithms,
                          kDeterministicWarnOnly, kAllowTf32, kAutocastCacheEnabled}) {
        need_bool(d[f], "a torch global state flag");
    }
    if (d[kNumThreads] < 0) fail("torch global state has a negative thread count");
    const std::int64_t n = d[kAutocastDevices];
    if (n < 0 || n > kMaxAutocastDevices) fail("torch global state has a bad autocast device count");
    const auto devices = static_cast<std::size_t>(n);
    if (d.size() != kHeader + 3 * devices) fail("torch global state snapshot has a bad size");
    for (std::size_t i = 0; i < devices; ++i) need_bool(d[kHeader + devices + i], "autocast enabled");
}

}  // namespace

std::string_view marking_data::attr_name(int i) {
    switch (i) {
        case 0: return "_dynamo_dynamic_indices";
        case 1: return "_dynamo_weak_dynamic_indices";
        case 2: return "_dynamo_unbacked_indices";
        case 3: return "_dynamo_strict_unbacked_indices";
        case 4: return "_dynamo_static_indices";
        default: return "";
    }
}

std::string_view torch_state::field_name(std::size_t i) {
    switch (i) {
        case kGradMode: return "grad_mode";
        case kTorchFunction: return "torch_function";
        case kTorchFunctionAllDisabled: return "torch_function_all_disabled";
        case kDeterministicAlgorithms: return "deterministic_algorithms";
        case kDeterministicWarnOnly: return "deterministic_algorithms_warn_only";
        case kAllowTf32: return "allow_tf32";
        case kAllowFp16Reduce: return "allow_fp16_reduce";
        case kAllowBf16Reduce: return "allow_bf16_reduce";
        case kNumThreads: return "num_threads";
        case kDefaultDtype: return "default_dtype";
        case kAutocastCacheEnabled: return "autocast_cache_enabled";
        case kAutocastDevices: return "autocast_devices";
        default: return "";
    }
}

void validate_data(const GuardDecl& d) {
    switch (d.kind) {
        case GuardKind::TensorMatch: validate_tensor(d.data); return;
        case GuardKind::ArrayMatch: validate_array(d.data); return;
        case GuardKind::DimensionMarking: validate_marking(d.data); return;
        case GuardKind::GlobalState:
            if (d.operand == kNoConst && d.n == static_cast<std::int64_t>(BuiltinProbe::TorchGlobalState)) {
                validate_torch_state(d.data);
                return;
            }
            break;
        default: break;
    }
    if (!d.data.empty()) fail(std::string(guard_kind_name(d.kind)) + " takes no data");
}

}  // namespace tripwire::core
