// tripwire/cpp/core/ir.cpp -- names and static properties of steps and guard kinds.
#include "core/ir.hpp"

namespace tripwire::core {

// Each fact below is a column of the kind table (core/guard_kind_table.hpp), expanded into a
// switch: the compiler checks that every kind is covered once.
#define TRIPWIRE_COLUMN(fn, Result, column, otherwise) \
    Result fn(GuardKind k) {                           \
        switch (k) { TRIPWIRE_GUARD_KINDS(column) }    \
        return otherwise;                              \
    }

#define TRIPWIRE_X(Name, value, name, ...) \
    case GuardKind::Name: return name;
TRIPWIRE_COLUMN(guard_kind_name, std::string_view, TRIPWIRE_X, "UNKNOWN")
#undef TRIPWIRE_X

bool guard_kind_known(GuardKind k) { return guard_kind_name(k) != "UNKNOWN"; }

std::string_view root_kind_name(RootKind k) {
    switch (k) {
        case RootKind::Local: return "LOCAL";
        case RootKind::Global: return "GLOBAL";
        case RootKind::Closure: return "CLOSURE";
    }
    return "UNKNOWN";
}

std::string_view builtin_probe_name(BuiltinProbe p) {
    switch (p) {
        case BuiltinProbe::RecursionLimit: return "recursion_limit";
        case BuiltinProbe::GcEnabled: return "gc_enabled";
        case BuiltinProbe::TorchGlobalState: return "torch_global_state";
        case BuiltinProbe::TorchFunctionModeStack: return "torch_function_mode_stack";
        case BuiltinProbe::TorchDefaultDevice: return "torch_default_device";
        case BuiltinProbe::TorchSavedTensorsHooks: return "torch_saved_tensors_hooks";
        case BuiltinProbe::TorchDualLevel: return "torch_dual_level";
    }
    return "unknown";
}

bool builtin_probe_reads_framework(BuiltinProbe p) {
    return p == BuiltinProbe::TorchGlobalState || p == BuiltinProbe::TorchFunctionModeStack ||
           p == BuiltinProbe::TorchDefaultDevice || p == BuiltinProbe::TorchSavedTensorsHooks ||
           p == BuiltinProbe::TorchDualLevel;
}

std::string_view step_kind_name(StepKind k) {
    switch (k) {
        case StepKind::Attr: return "ATTR";
        case StepKind::Item: return "ITEM";
        case StepKind::DictItem: return "DICT_ITEM";
        case StepKind::Type: return "TYPE";
        case StepKind::Dict: return "DICT";
        case StepKind::Defaults: return "DEFAULTS";
        case StepKind::KwDefaults: return "KWDEFAULTS";
        case StepKind::Code: return "CODE";
        case StepKind::ClosureCell: return "CLOSURE_CELL";
        case StepKind::WeakrefCall: return "WEAKREF_CALL";
        case StepKind::DictKey: return "DICT_KEY";
        case StepKind::DictValue: return "DICT_VALUE";
        case StepKind::Size: return "SIZE";
        case StepKind::Stride: return "STRIDE";
        case StepKind::StorageOffset: return "STORAGE_OFFSET";
        case StepKind::TensorSize: return "TENSOR_SIZE";
        case StepKind::TensorStride: return "TENSOR_STRIDE";
        case StepKind::TensorStorageOffset: return "TENSOR_STORAGE_OFFSET";
        case StepKind::Grad: return "GRAD";
        case StepKind::TypeDict: return "TYPE_DICT";
        case StepKind::TypeMro: return "TYPE_MRO";
    }
    return "UNKNOWN";
}

// USER_CODE: identity, exact-type and structural comparisons of built-in constants (EQUALS_MATCH
// and DICT_KEYS walk containers in place), tensor fields and dispatch key sets through the adapter,
// array fields from the numpy struct, pointer comparisons and relations among numbers read into
// C++ registers allocate no Python object; a declaration evaluated through Python says so
// (via_python, reads_by_code). len() of a user type, key lookups that may meet a user key's __eq__,
// getattr, `v.__code__` on a non-function, probes, predicates, torch's marking attributes and the
// iterator kinds (a bound method and a result tuple are allocated, and an allocation can start a
// collection that runs finalizers) may run user code. An unknown kind is assumed to.
#define TRIPWIRE_X(Name, value, name, source, operand, operand2, user_code, ...) \
    case GuardKind::Name: return (user_code) != 0;
TRIPWIRE_COLUMN(guard_runs_user_code, bool, TRIPWIRE_X, true)
#undef TRIPWIRE_X

bool guard_runs_user_code(const GuardDecl& d) {
    return d.via_python || d.reads_by_code || guard_runs_user_code(d.kind);
}

#define TRIPWIRE_X(Name, value, name, source, operand, operand2, user_code, relational, ...) \
    case GuardKind::Name: return (relational) != 0;
TRIPWIRE_COLUMN(is_relational, bool, TRIPWIRE_X, false)
#undef TRIPWIRE_X

#define TRIPWIRE_X(Name, value, name, source, ...) \
    case GuardKind::Name: return KindSource::source;
TRIPWIRE_COLUMN(guard_source, KindSource, TRIPWIRE_X, KindSource::Absent)
#undef TRIPWIRE_X

#define TRIPWIRE_X(Name, value, name, source, operand, operand2, user_code, relational, implied, record, \
                   payload, fast, eval, load, ...)                                                       \
    case GuardKind::Name: return KindLoad::load;
TRIPWIRE_COLUMN(guard_load, KindLoad, TRIPWIRE_X, KindLoad::Native)
#undef TRIPWIRE_X

#define TRIPWIRE_X(Name, value, name, source, operand, operand2, user_code, relational, implied, record, \
                   payload, fast, eval, load, adapter, ...)                                              \
    case GuardKind::Name: return (adapter) != 0;
TRIPWIRE_COLUMN(guard_reads_adapter_only, bool, TRIPWIRE_X, false)
#undef TRIPWIRE_X

#define TRIPWIRE_X(Name, value, name, source, operand, ...) \
    case GuardKind::Name: return KindOperand::operand;
TRIPWIRE_COLUMN(guard_operand, KindOperand, TRIPWIRE_X, KindOperand::No)
#undef TRIPWIRE_X

#define TRIPWIRE_X(Name, value, name, source, operand, operand2, user_code, relational, implied, ...) \
    case GuardKind::Name: return Implied::implied;
TRIPWIRE_COLUMN(guard_implied, Implied, TRIPWIRE_X, Implied::Never)
#undef TRIPWIRE_X

bool step_runs_user_code(StepKind k) {
    switch (k) {
        case StepKind::Type:
        // Fields of the type object, borrowed: no lookup, no allocation.
        case StepKind::TypeDict:
        case StepKind::TypeMro:
        case StepKind::WeakrefCall:
        case StepKind::DictKey:
        case StepKind::DictValue: return false;
        // Attribute lookups, generic __getitem__, and dict lookups (a stored key of a user
        // type whose hash collides gets its __eq__ called) can all run arbitrary code. The
        // instance __dict__ may have to be created (CPython keeps attributes inline until the
        // dict is asked for): an allocation, so a collection and its finalizers may run.
        case StepKind::Attr:
        case StepKind::Item:
        case StepKind::DictItem:
        case StepKind::Dict:
        case StepKind::Defaults:
        case StepKind::KwDefaults:
        case StepKind::Code:
        case StepKind::ClosureCell:
        // Tensor and array properties are read by calling the object's own methods
        // (v.size(), v.stride(), v.storage_offset(), v.shape, v.strides) until a C-level reader
        // of tensor fields is wired in (runtime/eval/tensor_props.hpp).
        case StepKind::Size:
        case StepKind::Stride:
        case StepKind::StorageOffset:
        // The C++ tensor steps box what they read (a new int; THPVariable_Wrap of a grad that has
        // no Python object yet), and an allocation can start a collection.
        case StepKind::TensorSize:
        case StepKind::TensorStride:
        case StepKind::TensorStorageOffset:
        case StepKind::Grad: return true;
    }
    return true;
}

#define TRIPWIRE_X(Name, value, name, source, operand, operand2, ...)                                 \
    case GuardKind::Name:                                                                             \
        return {KindSource::source == KindSource::Required, KindSource::source != KindSource::Absent, \
                KindOperand::operand != KindOperand::No, (operand2) != 0};
TRIPWIRE_COLUMN(guard_shape, GuardShape, TRIPWIRE_X, (GuardShape{false, false, false, false}))
#undef TRIPWIRE_X

#undef TRIPWIRE_COLUMN

}  // namespace tripwire::core
