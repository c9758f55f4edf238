// tripwire/cpp/bindings/register.hpp -- one registration function per bound area.
#pragma once

#include <nanobind/nanobind.h>

#include <memory>
#include <vector>

namespace tripwire::runtime {
class GuardSet;
class Cache;
}  // namespace tripwire::runtime

namespace tripwire::core {
struct GuardDecl;
}  // namespace tripwire::core

namespace tripwire::core::codec {
struct Document;
}  // namespace tripwire::core::codec

namespace tripwire::bindings {

/// The runtime guard set behind a tripwire._core.GuardSetCore instance (or a subclass), or null
/// for any other object or a set cleared by the garbage collector. Borrowed: valid while `o` is.
runtime::GuardSet* guard_set_of(PyObject* o);
/// The same, sharing ownership (a Cache entry keeps its runtime set).
std::shared_ptr<runtime::GuardSet> shared_guard_set_of(PyObject* o);

/// The runtime cache behind a tripwire._core.CacheCore instance (or a subclass), or null for any
/// other object or a cache cleared by the garbage collector. Borrowed: valid while `o` is.
runtime::Cache* cache_of(PyObject* o);

/// The document behind a tripwire._core.Decoded instance (bind_serial.cpp), or null for any other
/// object. Borrowed: valid while `o` is.
const core::codec::Document* decoded_document(PyObject* o);
/// Move the declarations out of a tripwire._core.Decoded (a loaded set compiles them without a
/// copy); its decls()/decl()/check_loaded() raise afterwards. Throws nb::type_error for another
/// object and std::runtime_error when they were taken already.
std::vector<core::GuardDecl> take_decoded_decls(PyObject* o);

/// Whether `f_locals` may be given to a check or lookup: a dict (one type-flag test, the path
/// every call takes) or another collections.abc.Mapping. Otherwise sets TypeError naming `method`
/// and the type, and returns false: a list or None would fail every guard silently (a miss that
/// looks like an answer). Needs the GIL.
bool require_locals_mapping(PyObject* f_locals, const char* method);

/// tripwire._core.testing: the switches and hooks only tests and benchmarks use (each register_*
/// puts its own there). Made by the module before any register_* runs.
nanobind::module_ testing_module(nanobind::module_& m);

/// The IR: RootKind, StepKind, GuardKind, and the typed declarations (bind_ir.cpp). First.
void register_ir(nanobind::module_& m);
/// GuardSetCore: the compiled guard set (bind_guard_set.cpp).
void register_guard_set(nanobind::module_& m);
/// CacheCore and CacheEntry: the per-function entry cache (bind_cache.cpp). After register_guard_set.
void register_cache(nanobind::module_& m);
/// FastDispatch: the C++ hit path of tripwire.specialize (bind_specialize.cpp). After register_cache.
void register_specialize(nanobind::module_& m);
/// read_source, is_constant, equals_match, probes, dict versions: the engine's reading of
/// values, for the builder (bind_values.cpp).
void register_values(nanobind::module_& m);
/// parse_relation, evaluate_relation: the shape-relation syntax and evaluator (bind_shape.cpp).
void register_shape(nanobind::module_& m);
/// Tensors, arrays, torch's state, the torch adapter, constant types (bind_tensors.cpp).
void register_tensors(nanobind::module_& m);
/// The frame runtime: hooks, per-code caches and strategies, Replacement (bind_frame.cpp). After
/// register_cache.
void register_frame(nanobind::module_& m);
/// The binary format: encode_guard_set, decode_guard_set, Decoded (bind_serial.cpp).
void register_serial(nanobind::module_& m);
/// Switches and facts for tests and benchmarks (bind_diagnostics.cpp).
void register_diagnostics(nanobind::module_& m);

}  // namespace tripwire::bindings
