// tripwire/cpp/core/ir.cpp -- names and static properties of steps and guard kinds.
#include "core/ir.hpp"

namespace tripwire::core {

std::string_view guard_kind_name(GuardKind k) {
    switch (k) {
        case GuardKind::TypeMatch: return "TYPE_MATCH";
        case GuardKind::IdMatch: return "ID_MATCH";
        case GuardKind::None: return "NONE";
        case GuardKind::NotNone: return "NOT_NONE";
        case GuardKind::True: return "TRUE";
        case GuardKind::False: return "FALSE";
        case GuardKind::EqualsMatch: return "EQUALS_MATCH";
        case GuardKind::Length: return "LENGTH";
        case GuardKind::DictKeys: return "DICT_KEYS";
        case GuardKind::DictContains: return "DICT_CONTAINS";
        case GuardKind::HasAttr: return "HASATTR";
        case GuardKind::DictVersion: return "DICT_VERSION";
        case GuardKind::TupleIteratorLen: return "TUPLE_ITERATOR_LEN";
        case GuardKind::RangeIterator: return "RANGE_ITERATOR";
        case GuardKind::CodeMatch: return "CODE_MATCH";
        case GuardKind::WeakrefAlive: return "WEAKREF_ALIVE";
        case GuardKind::GlobalState: return "GLOBAL_STATE";
        case GuardKind::Lambda: return "LAMBDA";
        case GuardKind::TensorMatch: return "TENSOR_MATCH";
        case GuardKind::ArrayMatch: return "ARRAY_MATCH";
        case GuardKind::DimensionMarking: return "DIMENSION_MARKING";
        case GuardKind::Alias: return "ALIAS";
        case GuardKind::NoAlias: return "NO_ALIAS";
        case GuardKind::Shape: return "SHAPE";
        case GuardKind::StorageOverlapping: return "STORAGE_OVERLAPPING";
        case GuardKind::DispatchKeySetMatch: return "DISPATCH_KEY_SET_MATCH";
    }
    return "UNKNOWN";
}

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

bool guard_runs_user_code(GuardKind k) {
    switch (k) {
        // Identity, exact-type and structural comparisons of built-in constants only, none of
        // which allocates a Python object (EQUALS_MATCH and DICT_KEYS walk containers in place).
        case GuardKind::TypeMatch:
        case GuardKind::IdMatch:
        case GuardKind::None:
        case GuardKind::NotNone:
        case GuardKind::True:
        case GuardKind::False:
        case GuardKind::EqualsMatch:
        case GuardKind::DictKeys:
        case GuardKind::DictVersion:
        case GuardKind::WeakrefAlive:
        // Tensor fields through the adapter (C++ accessors), array fields from the numpy struct,
        // pointer comparisons; a declaration evaluated through Python says so (via_python).
        case GuardKind::TensorMatch:
        case GuardKind::ArrayMatch:
        case GuardKind::Alias:
        case GuardKind::NoAlias:
        // Tensor metadata through the adapter (no Python object is made).
        case GuardKind::StorageOverlapping:
        // A DispatchKeySet's bits and the thread-local key sets through the adapter.
        case GuardKind::DispatchKeySetMatch:
        // Relations among numbers read into C++ registers; a big int is converted in place.
        case GuardKind::Shape: return false;
        // len() of a user type, key lookups that may meet a user key's __eq__, getattr,
        // `v.__code__` on a non-function, Python probes and predicates; and the iterator kinds,
        // which read the iterator through a method call (a bound method and a result tuple are
        // allocated, and an allocation can start a collection that runs finalizers).
        case GuardKind::Length:
        case GuardKind::DictContains:
        case GuardKind::HasAttr:
        case GuardKind::TupleIteratorLen:
        case GuardKind::RangeIterator:
        case GuardKind::CodeMatch:
        case GuardKind::GlobalState:
        case GuardKind::Lambda:
        // torch's semantics: getattr of the marking attributes (properties, __getattr__) and
        // the runtime set's own issubset().
        case GuardKind::DimensionMarking: return true;
    }
    return true;
}

bool guard_runs_user_code(const GuardDecl& d) {
    return d.via_python || d.reads_by_code || guard_runs_user_code(d.kind);
}

bool is_relational(GuardKind k) {
    return k == GuardKind::Alias || k == GuardKind::NoAlias || k == GuardKind::StorageOverlapping;
}

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

GuardShape guard_shape(GuardKind k) {
    switch (k) {
        case GuardKind::TypeMatch:
        case GuardKind::IdMatch:
        case GuardKind::EqualsMatch:
        case GuardKind::DictContains:
        case GuardKind::HasAttr:
        case GuardKind::CodeMatch: return {true, true, true, false};
        case GuardKind::None:
        case GuardKind::NotNone:
        case GuardKind::True:
        case GuardKind::False:
        case GuardKind::Length:
        case GuardKind::DictVersion:
        case GuardKind::TupleIteratorLen:
        case GuardKind::WeakrefAlive:
        case GuardKind::DispatchKeySetMatch: return {true, true, false, false};  // n = expected bits
        case GuardKind::DictKeys: return {true, true, false, true};
        case GuardKind::RangeIterator:
            return {true, true, true, false};  // operand = the expected range object
        case GuardKind::GlobalState:
            return {false, false, false, true};  // operand = Python probe (optional), operand2 = snapshot
        case GuardKind::Lambda: return {false, true, true, false};
        case GuardKind::TensorMatch: return {true, true, true, false};  // operand = the exact type
        case GuardKind::ArrayMatch:
            return {true, true, true, true};  // operand = the exact type, operand2 = the dtype's description
        case GuardKind::DimensionMarking:
            // operand, operand2 = the expected _dynamo_shape_ids and _dynamo_unbacked_bounds
            // (None constants when not guarded; `flag` says whether they are)
            return {true, true, true, true};
        case GuardKind::Alias:
        case GuardKind::NoAlias:
        case GuardKind::StorageOverlapping:
            return {true, true, false, false};  // the other sources: more_sources
        // Its sources are its symbols (GuardDecl::symbols), not a single source.
        case GuardKind::Shape: return {false, false, false, false};
    }
    return {false, false, false, false};
}

}  // namespace tripwire::core
