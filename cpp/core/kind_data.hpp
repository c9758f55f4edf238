// tripwire/cpp/core/kind_data.hpp -- the plain-data layouts of GuardDecl::data, per kind.
//
// Expectations that are more than one object or number (a tensor's metadata, an array's, a
// tensor's dimension markings, a framework-state snapshot) are plain integers, so that a
// Python-free codec can store them and a loader can check them here, before any runtime reads
// them. The only objects they need are in the operands: the exact type (by identity), and for
// arrays the dtype's description (a str or a tuple of str).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string_view>

#include "core/ir.hpp"

namespace tripwire::core {

/// A size, stride or storage offset that is not checked (a dynamic dimension).
inline constexpr std::int64_t kAny = std::numeric_limits<std::int64_t>::min();
/// Most dimensions a tensor or array expectation may have (numpy allows 64).
inline constexpr std::int64_t kMaxDims = 1024;

/// TENSOR_MATCH: header fields, then (size, stride) per dimension; kAny leaves one unchecked.
namespace tensor_data {
enum : std::size_t {
    kDispatchKeys = 0,  ///< raw DispatchKeySet bits after the thread-local include/exclude sets
    kDtype = 1,         ///< c10::ScalarType
    kDeviceIndex = 2,   ///< the device index (-1: none); the device type is in the dispatch keys
    kRequiresGrad = 3,  ///< 0 or 1
    kNdim = 4,
    kStorageOffset = 5,  ///< kAny: not checked (torch's default)
    kHeader = 6,
};
}  // namespace tensor_data

/// ARRAY_MATCH: header fields, then (size, stride) per dimension, strides in bytes.
namespace array_data {
enum : std::size_t {
    kNdim = 0,
    kRequiredFlags = 1,  ///< flags the value must have (bits below)
    kWriteable = 2,      ///< 0 or 1: must be equal
    kHeader = 3,
};
inline constexpr std::int64_t kCContiguous = 1;
inline constexpr std::int64_t kFContiguous = 2;
inline constexpr std::int64_t kAligned = 4;
inline constexpr std::int64_t kAllFlags = 7;
}  // namespace array_data

/// DIMENSION_MARKING: for each marking attribute in attr_name order, a count (-1: absent when
/// the guard was built; else the number of dimensions in the built set) and that many ints.
namespace marking_data {
inline constexpr int kAttrCount = 5;
/// "_dynamo_dynamic_indices", "_dynamo_weak_dynamic_indices", "_dynamo_unbacked_indices",
/// "_dynamo_strict_unbacked_indices", "_dynamo_static_indices" (torch 2.13's order).
std::string_view attr_name(int i);
inline constexpr std::string_view kFlagAttr = "_has_dynamo_dim_marking";
/// The attribute whose presence gates the dependent ones (GuardDecl::flag, operands).
inline constexpr int kGateAttr = 2;  // _dynamo_unbacked_indices
inline constexpr std::string_view kShapeIdsAttr = "_dynamo_shape_ids";
inline constexpr std::string_view kUnbackedBoundsAttr = "_dynamo_unbacked_bounds";
}  // namespace marking_data

/// GLOBAL_STATE with the TorchGlobalState probe: header fields, then for each of the
/// kAutocastDevices autocast devices its c10::DeviceType, then for each its enabled flag, then for
/// each its autocast dtype (compared only while enabled, as torch does).
namespace torch_state {
enum : std::size_t {
    kGradMode = 0,
    kTorchFunction = 1,
    kTorchFunctionAllDisabled = 2,
    kDeterministicAlgorithms = 3,
    kDeterministicWarnOnly = 4,
    kAllowTf32 = 5,  ///< float32Precision("cuda", "matmul") == "tf32"
    kAllowFp16Reduce = 6,
    kAllowBf16Reduce = 7,
    kNumThreads = 8,
    kDefaultDtype = 9,  ///< c10::ScalarType
    kAutocastCacheEnabled = 10,
    kAutocastDevices = 11,  ///< n: the devices of at::autocast::_AUTOCAST_SUPPORTED_DEVICES
    kHeader = 12,
};
inline constexpr std::int64_t kMaxAutocastDevices = 64;
/// torch's name of header field i (its GlobalStateGuard JSON keys), for messages and codecs.
std::string_view field_name(std::size_t i);
}  // namespace torch_state

/// Check `d.data` (and the kind-specific operand rules that go with it) against its kind's
/// layout. Throws InvalidProgram.
void validate_data(const GuardDecl& d);

}  // namespace tripwire::core
