// tripwire/cpp/core/ir.hpp -- the guard IR: roots, steps, guard kinds and declarations.
//
// This layer knows nothing of Python. Objects that guards name (types, constants, attribute
// names, dict keys) appear only as ConstId indices into a constant pool that the runtime layer
// owns. Two steps are the same step exactly when kind, operand and index are equal, so the
// runtime must intern equal keys to one ConstId for prefix sharing to work.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/guard_kind_table.hpp"

namespace tripwire::core {

/// Deepest nesting of containers in a constant (EQUALS_MATCH, DICT_KEYS keys, GLOBAL_STATE
/// snapshots). Bounds the recursion of constant comparisons by construction; a value nested deeper
/// than this never matches a constant.
inline constexpr int kMaxConstantDepth = 100;

/// Index into the runtime's constant pool.
using ConstId = std::uint32_t;
/// "No constant" marker for operands a kind does not use.
inline constexpr ConstId kNoConst = 0xFFFFFFFFu;

/// Where a source's first value is read. The Python package uses these enums as they are bound
/// (tripwire._core.RootKind, StepKind, GuardKind): one definition, named by the tables below.
enum class RootKind : std::uint8_t {
    Local = 0,    ///< L['x']: the locals mapping passed to check()
    Global = 1,   ///< G['x']: the globals dict given at build time
    Closure = 2,  ///< C['x']: a closure cell given at build time
};
inline constexpr int kRootKindCount = 3;

/// One step from a value to a child value.
enum class StepKind : std::uint8_t {
    Attr = 0,         ///< getattr(v, name)                    operand = name
    Item = 1,         ///< v[key]                              operand = key
    DictItem = 2,     ///< dict.__getitem__(v, key), no __missing__   operand = key
    Type = 3,         ///< type(v)
    Dict = 4,         ///< v.__dict__ (instance dict)
    Defaults = 5,     ///< v.__defaults__[index]
    KwDefaults = 6,   ///< v.__kwdefaults__[name]              operand = name
    Code = 7,         ///< v.__code__
    ClosureCell = 8,  ///< v.__closure__[index].cell_contents
    WeakrefCall = 9,  ///< v() for a weak reference
    DictKey = 10,     ///< list(dict.keys(v))[index]
    DictValue = 11,   ///< v[list(dict.keys(v))[index]]
    // Tensor and array properties (docs/guards.md, Sources). Read by a Python-level call, or by
    // the C-level reader of tensor fields where it answers (runtime/eval/tensor_props.hpp, the one
    // place it plugs in).
    Size = 12,           ///< v.size()[index] (numpy arrays: v.shape[index])
    Stride = 13,         ///< v.stride()[index] (numpy arrays: v.strides[index], in bytes)
    StorageOffset = 14,  ///< v.storage_offset() (numpy arrays have none: missing)
    // torch's TensorPropertyGuardAccessor and GradGuardAccessor: the C++ tensor's own fields,
    // read through the torch adapter and never through a Python method. A value whose type does
    // not derive from torch's TensorBase (or one torch refuses to read) is missing. Printed as
    // torch prints their sources (docs/guards.md, "C++ tensor steps").
    TensorSize = 15,           ///< sym_size(index) as an int; index >= dim: missing
    TensorStride = 16,         ///< sym_stride(index) as an int; index >= dim or no strides: missing
    TensorStorageOffset = 17,  ///< sym_storage_offset() as an int; no strides: missing
    Grad = 18,                 ///< the C++ grad() field; None when undefined
    // torch's TypeDictGuardAccessor and TypeMROGuardAccessor: a class's own fields, read from the
    // type object and never through an attribute lookup (no metaclass __getattribute__, no
    // descriptor). A value that is not a type is missing.
    TypeDict = 19,  ///< the class namespace dict (tp_dict; `type.__dict__['__dict__']` without the proxy)
    TypeMro = 20,   ///< the class's method resolution order (tp_mro, a tuple)
};
inline constexpr int kStepKindCount = 21;

/// Whether a step reads the C++ tensor through the torch adapter only (TensorSize..Grad).
constexpr bool is_cpp_tensor_step(StepKind k) {
    return k == StepKind::TensorSize || k == StepKind::TensorStride || k == StepKind::TensorStorageOffset ||
           k == StepKind::Grad;
}

/// Guard kinds of the catalogue (docs/guards.md): one enumerator per row of the kind table
/// (core/guard_kind_table.hpp), which holds every per-kind fact.
enum class GuardKind : std::uint8_t {
#define TRIPWIRE_X(Name, value, ...) Name = value,
    TRIPWIRE_GUARD_KINDS(TRIPWIRE_X)
#undef TRIPWIRE_X
};
/// One more than the largest kind's value (values below it that no row names are reserved).
inline constexpr int kGuardKindCount = [] {
    int n = 0;
#define TRIPWIRE_X(Name, value, ...) n = n > (value) + 1 ? n : (value) + 1;
    TRIPWIRE_GUARD_KINDS(TRIPWIRE_X)
#undef TRIPWIRE_X
    return n;
}();

/// One step of a source path.
struct Step {
    StepKind kind = StepKind::Attr;
    ConstId operand = kNoConst;  ///< attribute name or key, for Attr/Item/DictItem/KwDefaults
    std::int64_t index = 0;      ///< position, for Defaults/ClosureCell/DictKey/DictValue

    friend bool operator==(const Step& a, const Step& b) {
        return a.kind == b.kind && a.operand == b.operand && a.index == b.index;
    }
};

/// A root plus steps; `texts[i]` is the printed form of the prefix with i steps.
struct SourcePath {
    RootKind root = RootKind::Local;
    ConstId name = kNoConst;  ///< the root's name (a str constant)
    std::vector<Step> steps;
    std::vector<std::string> texts;  ///< steps.size() + 1 printed prefixes
};

/// An immutable SourcePath shared by every declaration that names it: a SHAPE symbol is named
/// by many relations of a set, and a copy per use (its steps, its texts, their strings) was a
/// tenth of building a set of 20 relations. Never null in a valid declaration (validate_decl).
using SharedPath = std::shared_ptr<const SourcePath>;

/// One declared guard, as handed to compile().
struct GuardDecl {
    GuardKind kind = GuardKind::TypeMatch;
    bool has_source = true;  ///< false only for GlobalState and sourceless Lambda
    SourcePath source;
    ConstId operand = kNoConst;   ///< main object: type, object, constant, key, name, probe, fn
    ConstId operand2 = kNoConst;  ///< second object: snapshot (GlobalState), key tuple (DictKeys)
    /// length, version, builtin-probe id; STORAGE_OVERLAPPING: how many of the sources, first
    /// ones first, may overlap another (torch's tensors_definitely_do_not_overlap);
    /// DISPATCH_KEY_SET_MATCH: the raw bits of the expected applied key set (a torch._C.DispatchKeySet
    /// with the thread's include/exclude sets applied, Python keys masked as torch's guards mask them)
    std::int64_t n = 0;
    std::int64_t n2 = 0;   ///< range stop
    std::int64_t n3 = 0;   ///< range step
    bool flag = false;     ///< present (DictContains/HasAttr), ordered (DictKeys)
    std::uint32_t id = 0;  ///< installation order; why_not reports the smallest failing id
    /// Per-kind plain data: a tensor's or array's expectation, dimension markings, a framework
    /// state snapshot. Layouts and their validation in core/kind_data.hpp.
    std::vector<std::int64_t> data;
    /// The sources after `source` of a relational guard (ALIAS: one, NO_ALIAS: one or more).
    std::vector<SourcePath> more_sources;
    /// Evaluated through a Python-level call (a reader of tensor fields without the torch
    /// adapter, a dtype numpy must compare). Set by the runtime when it binds the declaration,
    /// never trusted from the caller; counts as user code (guard_runs_user_code).
    bool via_python = false;
    /// TENSOR_MATCH only: a value of this type may be a tensor whose metadata is answered by code
    /// (a torch.Tensor subclass: a __torch_dispatch__ wrapper with a custom sizes, device or layout
    /// policy), which the check then reads through the Python reader. Set by the runtime when it
    /// binds the declaration, never trusted from the caller; counts as user code.
    bool reads_by_code = false;
    /// SHAPE only: one relation among symbols (docs/guards.md, SHAPE).
    std::string relation;             ///< its text, in the syntax of core/shape/parser.hpp
    std::vector<SharedPath> symbols;  ///< each distinct symbol's source, in the order the text names them
    std::vector<std::uint8_t> symbol_types;  ///< per symbol: 0 int, 1 float (shape::ValueType)
};

/// Whether `k` names a kind of the catalogue (a value below kGuardKindCount may be reserved).
bool guard_kind_known(GuardKind k);
/// Printable names, as the catalogue spells them ("TYPE_MATCH").
std::string_view guard_kind_name(GuardKind k);
std::string_view step_kind_name(StepKind k);
std::string_view root_kind_name(RootKind k);

/// Whether evaluating the guard can run Python code that is not the interpreter's own (a user
/// __eq__, __len__, __getattr__, a predicate), directly or by allocating a Python object: on
/// CPython an allocation can start a garbage collection, which runs finalizers and weakref
/// callbacks. A subtree of guards and steps for which both are false runs no user code at all,
/// so the engine may borrow the values it reads instead of holding references (docs/cpp.md,
/// "Regions without user code").
bool guard_runs_user_code(GuardKind k);
/// The same for one declaration: its kind, or a Python-level evaluation path (`via_python`).
bool guard_runs_user_code(const GuardDecl& d);
/// Whether a kind relates the values of several sources (ALIAS, NO_ALIAS): such a guard is not
/// attached to one node but observes the value of each of its sources (Program::node_members).
bool is_relational(GuardKind k);
/// The same for fetching a step: properties, __getattr__, __getitem__, a dict lookup that
/// compares against a user key's __eq__, creating an instance __dict__.
bool step_runs_user_code(StepKind k);

/// The kind table's SOURCE, OPERAND and IMPLIED columns (core/guard_kind_table.hpp).
KindSource guard_source(GuardKind k);
KindLoad guard_load(GuardKind k);
/// Whether the kind is read through the torch adapter only (the table's ADAPTER column).
bool guard_reads_adapter_only(GuardKind k);
KindOperand guard_operand(GuardKind k);
Implied guard_implied(GuardKind k);

/// The operand slots a kind uses (the kind table's SOURCE, OPERAND and OPERAND2 columns);
/// validate() checks declarations against them.
struct GuardShape {
    bool needs_source;   ///< must have a source
    bool allows_source;  ///< may have a source
    bool operand;        ///< uses operand
    bool operand2;       ///< uses operand2
};
GuardShape guard_shape(GuardKind k);

/// Built-in global-state probes evaluated in C++ (GuardDecl::n for GlobalState with no operand).
enum class BuiltinProbe : std::int64_t {
    RecursionLimit = 0,
    GcEnabled = 1,
    /// torch's global state (grad mode, autocast, torch function, determinism, TF32, reduced
    /// precision reductions, threads, default dtype): snapshot in GuardDecl::data
    /// (kind_data.hpp, TorchState). Read through the torch adapter, or a Python reader.
    TorchGlobalState = 2,
    /// The types of the modes on torch's torch-function mode stack: snapshot in operand2 (a
    /// tuple of types).
    TorchFunctionModeStack = 3,
    /// torch.utils._device.CURRENT_DEVICE: snapshot in operand2 (None or the device as a str).
    TorchDefaultDevice = 4,
    /// The top of torch's saved-tensor default hooks stack as Dynamo's
    /// AUTOGRAD_SAVED_TENSORS_HOOKS guard sees it: None when the stack is empty or its top pair
    /// is not two torch.fx.GraphModule instances, else the pair's ids. Snapshot in operand2
    /// (None or a tuple of two ints).
    TorchSavedTensorsHooks = 5,
    /// torch.autograd.forward_ad._current_level, as Dynamo's DUAL_LEVEL_MATCH guard reads it
    /// (getattr on the module; an exact int). Snapshot in operand2 (an int).
    TorchDualLevel = 6,
};
inline constexpr int kBuiltinProbeCount = 7;
/// Whether a built-in probe reads a framework (torch) rather than the interpreter: its snapshot
/// is structured (data or operand2) instead of GuardDecl::n2.
bool builtin_probe_reads_framework(BuiltinProbe p);
/// The name users give a built-in probe ("recursion_limit", "gc_enabled", "torch_global_state").
std::string_view builtin_probe_name(BuiltinProbe p);

}  // namespace tripwire::core
