// tripwire/cpp/bindings/register.hpp -- one registration function per bound area.
#pragma once

#include <nanobind/nanobind.h>

namespace tripwire::bindings {

/// GuardSetCore: the compiled guard set (bind_guard_set.cpp).
void register_guard_set(nanobind::module_& m);
/// CacheCore and CacheEntry: the per-function entry cache (bind_cache.cpp). After register_guard_set.
void register_cache(nanobind::module_& m);
/// Small helpers used by the Python package and tests (bind_util.cpp).
void register_util(nanobind::module_& m);

}  // namespace tripwire::bindings
