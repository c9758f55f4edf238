// tripwire/tests/cpp/test_ir.cpp -- names, operand shapes and purity tables of the guard IR.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "core/ir.hpp"
#include "core/kind_data.hpp"
#include "core/program.hpp"
#include "testing.hpp"

namespace tripwire::core {
namespace {

using test_util::local;

constexpr std::size_t kConsts = 8;

GuardKind guard_kind(int i) { return static_cast<GuardKind>(i); }
StepKind step_kind(int i) { return static_cast<StepKind>(i); }

/// The smallest declaration of `k` that its shape allows: a source when it needs one, the
/// operands the shape names, and a known built-in probe for GLOBAL_STATE.
GuardDecl minimal_decl(GuardKind k) {
    const GuardShape shape = guard_shape(k);
    GuardDecl d;
    d.kind = k;
    d.has_source = shape.needs_source;
    if (d.has_source) d.source = local(0);
    d.operand = shape.operand ? 1 : kNoConst;
    d.operand2 = shape.operand2 ? 2 : kNoConst;
    if (k == GuardKind::GlobalState) {
        d.operand2 = kNoConst;  // a built-in probe carries its snapshot in n2
        d.n = static_cast<std::int64_t>(BuiltinProbe::RecursionLimit);
    }
    if (k == GuardKind::Shape) d.relation = "1 < 2";  // a relation, with no symbols
    if (is_relational(k)) d.more_sources.push_back(local(1));
    d.data = test_util::minimal_data(k);
    return d;
}

TEST(IrNames, GuardKindNamesAreDistinctAndKnown) {
    std::set<std::string> seen;
    int known = 0;
    for (int i = 0; i < kGuardKindCount; ++i) {
        EXPECT_TRUE(guard_kind_known(guard_kind(i))) << "kind " << i;
        ++known;
        const std::string name(guard_kind_name(guard_kind(i)));
        EXPECT_NE(name, "UNKNOWN") << "kind " << i;
        EXPECT_FALSE(name.empty());
        EXPECT_TRUE(seen.insert(name).second) << "duplicate name " << name;
    }
    EXPECT_EQ(guard_kind_name(GuardKind::TypeMatch), "TYPE_MATCH");
    EXPECT_EQ(guard_kind_name(GuardKind::EqualsMatch), "EQUALS_MATCH");
    EXPECT_EQ(guard_kind_name(GuardKind::HasAttr), "HASATTR");
    EXPECT_EQ(guard_kind_name(GuardKind::TupleIteratorLen), "TUPLE_ITERATOR_LEN");
    EXPECT_EQ(guard_kind_name(GuardKind::Lambda), "LAMBDA");
    EXPECT_EQ(guard_kind_name(GuardKind::Shape), "SHAPE");
    EXPECT_EQ(guard_kind_name(GuardKind::TensorMatch), "TENSOR_MATCH");
    EXPECT_EQ(guard_kind_name(GuardKind::NoAlias), "NO_ALIAS");
    // Every value below kGuardKindCount is a kind: 0..17, the tensor kinds 18..22, SHAPE 23,
    // STORAGE_OVERLAPPING 24, DISPATCH_KEY_SET_MATCH 25, SET_CONTAINS 26.
    EXPECT_EQ(known, 27);
    EXPECT_EQ(guard_kind_name(GuardKind::SetContains), "SET_CONTAINS");
    EXPECT_EQ(static_cast<int>(GuardKind::SetContains), 26);
    EXPECT_EQ(guard_kind_name(GuardKind::DispatchKeySetMatch), "DISPATCH_KEY_SET_MATCH");
    EXPECT_FALSE(is_relational(GuardKind::DispatchKeySetMatch));
    EXPECT_EQ(guard_kind_name(GuardKind::StorageOverlapping), "STORAGE_OVERLAPPING");
    EXPECT_TRUE(is_relational(GuardKind::StorageOverlapping));
    EXPECT_EQ(static_cast<int>(GuardKind::TensorMatch), 18);
    EXPECT_EQ(static_cast<int>(GuardKind::NoAlias), 22);
    EXPECT_EQ(static_cast<int>(GuardKind::Shape), 23);
}

// The kind table's columns against facts written here by hand (core/guard_kind_table.hpp): the
// shape derived from SOURCE and OPERAND, and each kind's IMPLIED and OPERAND.
TEST(IrKindTable, ColumnsAgreeWithTheFactsTheyEncode) {
    const std::set<GuardKind> identity_operand = {GuardKind::TypeMatch, GuardKind::IdMatch,
                                                  GuardKind::CodeMatch, GuardKind::TensorMatch,
                                                  GuardKind::ArrayMatch};
    const std::set<GuardKind> dict_state = {GuardKind::DictKeys, GuardKind::DictContains,
                                            GuardKind::DictVersion};
    const std::set<GuardKind> identity = {GuardKind::IdMatch, GuardKind::None, GuardKind::NotNone,
                                          GuardKind::True, GuardKind::False};
    for (int i = 0; i < kGuardKindCount; ++i) {
        const GuardKind k = guard_kind(i);
        const GuardShape shape = guard_shape(k);
        EXPECT_EQ(shape.needs_source, guard_source(k) == KindSource::Required) << guard_kind_name(k);
        EXPECT_EQ(shape.allows_source, guard_source(k) != KindSource::Absent) << guard_kind_name(k);
        EXPECT_EQ(shape.operand, guard_operand(k) != KindOperand::No) << guard_kind_name(k);
        EXPECT_EQ(guard_operand(k) == KindOperand::Identity, identity_operand.count(k) == 1)
            << guard_kind_name(k);
        if (is_relational(k)) {
            EXPECT_EQ(guard_source(k), KindSource::Required) << guard_kind_name(k);
        }
        Implied want = Implied::Never;
        if (identity.count(k) != 0) want = Implied::Identity;
        if (dict_state.count(k) != 0) want = Implied::DictState;
        if (k == GuardKind::TypeMatch) want = Implied::IfImmutableType;
        if (k == GuardKind::EqualsMatch) want = Implied::IfImmutableConstant;
        if (k == GuardKind::Length) want = Implied::DictStateOrFixedSize;
        EXPECT_EQ(guard_implied(k), want) << guard_kind_name(k);
    }
    EXPECT_EQ(guard_source(GuardKind::Lambda), KindSource::Optional);
    EXPECT_EQ(guard_source(GuardKind::GlobalState), KindSource::Absent);
    EXPECT_EQ(guard_source(GuardKind::Shape), KindSource::Absent);
    // Out of the table: no source, no operand, never implied.
    EXPECT_EQ(guard_implied(guard_kind(kGuardKindCount)), Implied::Never);
    EXPECT_EQ(guard_operand(guard_kind(kGuardKindCount)), KindOperand::No);
}

TEST(IrNames, KindsPastTheCountAreUnknownAndRefused) {
    for (int i : {kGuardKindCount, kGuardKindCount + 1, 255}) {
        EXPECT_FALSE(guard_kind_known(guard_kind(i))) << i;
        GuardDecl d;
        d.kind = guard_kind(i);
        EXPECT_THROW(validate_decl(d, kConsts), InvalidProgram) << i;
        d.has_source = true;
        d.source = local(0);
        EXPECT_THROW(validate_decl(d, kConsts), InvalidProgram) << i;
    }
}

TEST(IrNames, StepKindNamesAreDistinctAndKnown) {
    std::set<std::string> seen;
    for (int i = 0; i < kStepKindCount; ++i) {
        const std::string name(step_kind_name(step_kind(i)));
        EXPECT_NE(name, "UNKNOWN") << "step " << i;
        EXPECT_TRUE(seen.insert(name).second) << "duplicate name " << name;
    }
    EXPECT_EQ(step_kind_name(StepKind::Attr), "ATTR");
    EXPECT_EQ(step_kind_name(StepKind::DictValue), "DICT_VALUE");
    EXPECT_EQ(step_kind_name(StepKind::Size), "SIZE");
    EXPECT_EQ(step_kind_name(StepKind::StorageOffset), "STORAGE_OFFSET");
    EXPECT_EQ(step_kind_name(StepKind::TensorSize), "TENSOR_SIZE");
    EXPECT_EQ(step_kind_name(StepKind::Grad), "GRAD");
    EXPECT_EQ(step_kind_name(StepKind::TypeDict), "TYPE_DICT");
    EXPECT_EQ(step_kind_name(StepKind::TypeMro), "TYPE_MRO");
}

TEST(IrNames, RootKindsAndBuiltinProbesAreNamed) {
    EXPECT_EQ(root_kind_name(RootKind::Local), "LOCAL");
    EXPECT_EQ(root_kind_name(RootKind::Global), "GLOBAL");
    EXPECT_EQ(root_kind_name(RootKind::Closure), "CLOSURE");
    EXPECT_EQ(root_kind_name(static_cast<RootKind>(kRootKindCount)), "UNKNOWN");
    EXPECT_EQ(static_cast<int>(RootKind::Closure) + 1, kRootKindCount);
    EXPECT_EQ(builtin_probe_name(BuiltinProbe::RecursionLimit), "recursion_limit");
    EXPECT_EQ(builtin_probe_name(BuiltinProbe::GcEnabled), "gc_enabled");
    EXPECT_EQ(builtin_probe_name(BuiltinProbe::TorchGlobalState), "torch_global_state");
    EXPECT_EQ(builtin_probe_name(BuiltinProbe::TorchFunctionModeStack), "torch_function_mode_stack");
    EXPECT_EQ(builtin_probe_name(BuiltinProbe::TorchDefaultDevice), "torch_default_device");
    EXPECT_EQ(builtin_probe_name(BuiltinProbe::TorchSavedTensorsHooks), "torch_saved_tensors_hooks");
    EXPECT_TRUE(builtin_probe_reads_framework(BuiltinProbe::TorchSavedTensorsHooks));
    EXPECT_EQ(builtin_probe_name(static_cast<BuiltinProbe>(kBuiltinProbeCount)), "unknown");
    EXPECT_EQ(builtin_probe_name(BuiltinProbe::TorchDualLevel), "torch_dual_level");
    EXPECT_TRUE(builtin_probe_reads_framework(BuiltinProbe::TorchDualLevel));
    EXPECT_EQ(static_cast<int>(BuiltinProbe::TorchDualLevel) + 1, kBuiltinProbeCount);
    EXPECT_FALSE(builtin_probe_reads_framework(BuiltinProbe::GcEnabled));
    EXPECT_TRUE(builtin_probe_reads_framework(BuiltinProbe::TorchGlobalState));
}

TEST(IrNames, OutOfRangeKindsAreUnknown) {
    EXPECT_EQ(guard_kind_name(guard_kind(kGuardKindCount)), "UNKNOWN");
    EXPECT_EQ(guard_kind_name(guard_kind(255)), "UNKNOWN");
    EXPECT_EQ(step_kind_name(step_kind(kStepKindCount)), "UNKNOWN");
    EXPECT_EQ(step_kind_name(step_kind(255)), "UNKNOWN");
}

TEST(IrNames, CountsMatchTheLastEnumerator) {
    EXPECT_EQ(static_cast<int>(GuardKind::SetContains) + 1, kGuardKindCount);
    EXPECT_EQ(static_cast<int>(StepKind::TypeMro) + 1, kStepKindCount);
}

TEST(IrShape, TableIsSelfConsistent) {
    for (int i = 0; i < kGuardKindCount; ++i) {
        const GuardShape s = guard_shape(guard_kind(i));
        // A kind that needs a source must allow one.
        EXPECT_TRUE(!s.needs_source || s.allows_source) << guard_kind_name(guard_kind(i));
    }
    // Only the ambient kinds may go without a source.
    EXPECT_FALSE(guard_shape(GuardKind::GlobalState).needs_source);
    EXPECT_FALSE(guard_shape(GuardKind::GlobalState).allows_source);
    EXPECT_FALSE(guard_shape(GuardKind::Lambda).needs_source);
    EXPECT_TRUE(guard_shape(GuardKind::Lambda).allows_source);
    EXPECT_TRUE(guard_shape(GuardKind::DictKeys).operand2);
    EXPECT_FALSE(guard_shape(GuardKind::DictKeys).operand);
}

TEST(IrShape, UnknownKindHasEmptyShape) {
    const GuardShape s = guard_shape(guard_kind(kGuardKindCount));
    EXPECT_FALSE(s.needs_source || s.allows_source || s.operand || s.operand2);
}

// validate_decl agrees with guard_shape: the minimal declaration passes, and removing or adding
// each slot fails exactly when the table says it should.
TEST(IrShape, ValidateDeclFollowsTheTable) {
    for (int i = 0; i < kGuardKindCount; ++i) {
        const GuardKind k = guard_kind(i);
        const GuardShape shape = guard_shape(k);
        SCOPED_TRACE(std::string(guard_kind_name(k)));
        const GuardDecl base = minimal_decl(k);
        EXPECT_NO_THROW(validate_decl(base, kConsts));

        // Source slot.
        GuardDecl flipped = base;
        flipped.has_source = !base.has_source;
        if (flipped.has_source) flipped.source = local(0);
        const bool source_ok = flipped.has_source ? shape.allows_source : !shape.needs_source;
        if (source_ok) {
            EXPECT_NO_THROW(validate_decl(flipped, kConsts));
        } else {
            EXPECT_THROW(validate_decl(flipped, kConsts), InvalidProgram);
        }

        // Operand slot: required when the table says so, rejected when unused (GLOBAL_STATE's
        // operand is an optional Python probe, which then needs a snapshot in operand2).
        GuardDecl op = base;
        if (shape.operand) {
            op.operand = kNoConst;
            EXPECT_THROW(validate_decl(op, kConsts), InvalidProgram);
        } else if (k == GuardKind::GlobalState) {
            op.operand = 3;
            EXPECT_THROW(validate_decl(op, kConsts), InvalidProgram);  // no snapshot
            op.operand2 = 4;
            EXPECT_NO_THROW(validate_decl(op, kConsts));
        } else {
            op.operand = 3;
            EXPECT_THROW(validate_decl(op, kConsts), InvalidProgram);
        }

        // Operand2 slot: DICT_KEYS needs its key tuple; kinds that do not use it reject it.
        GuardDecl op2 = base;
        if (shape.operand2 && k != GuardKind::GlobalState) {
            op2.operand2 = kNoConst;
            EXPECT_THROW(validate_decl(op2, kConsts), InvalidProgram);
        } else if (!shape.operand2) {
            op2.operand2 = 3;
            EXPECT_THROW(validate_decl(op2, kConsts), InvalidProgram);
        }

        // Every used constant must be in range.
        if (shape.operand) {
            GuardDecl far = base;
            far.operand = kConsts;
            EXPECT_THROW(validate_decl(far, kConsts), InvalidProgram);
        }
        if (shape.operand2 && k != GuardKind::GlobalState) {
            GuardDecl far = base;
            far.operand2 = kConsts;
            EXPECT_THROW(validate_decl(far, kConsts), InvalidProgram);
        }
    }
}

TEST(IrShape, LengthsMustBeNonNegative) {
    for (GuardKind k : {GuardKind::Length, GuardKind::TupleIteratorLen}) {
        GuardDecl d = minimal_decl(k);
        d.n = 0;
        EXPECT_NO_THROW(validate_decl(d, kConsts));
        d.n = -1;
        EXPECT_THROW(validate_decl(d, kConsts), InvalidProgram);
    }
}

TEST(IrShape, BuiltinProbes) {
    GuardDecl d = minimal_decl(GuardKind::GlobalState);
    for (BuiltinProbe p : {BuiltinProbe::RecursionLimit, BuiltinProbe::GcEnabled}) {
        d.n = static_cast<std::int64_t>(p);
        EXPECT_NO_THROW(validate_decl(d, kConsts));
    }
    for (std::int64_t bad : {std::int64_t{-1}, std::int64_t{kBuiltinProbeCount}, std::int64_t{1} << 40}) {
        d.n = bad;
        EXPECT_THROW(validate_decl(d, kConsts), InvalidProgram) << bad;
    }
}

TEST(IrPurity, GuardKinds) {
    // Identity, exact-type and in-place structural comparisons never run user code and never
    // allocate (an allocation may start a collection that runs finalizers)...
    for (GuardKind k : {GuardKind::TypeMatch, GuardKind::IdMatch, GuardKind::None, GuardKind::NotNone,
                        GuardKind::True, GuardKind::False, GuardKind::EqualsMatch, GuardKind::DictKeys,
                        GuardKind::DictVersion, GuardKind::WeakrefAlive, GuardKind::TensorMatch,
                        GuardKind::ArrayMatch, GuardKind::Alias, GuardKind::NoAlias, GuardKind::Shape,
                        GuardKind::StorageOverlapping, GuardKind::DispatchKeySetMatch}) {
        EXPECT_FALSE(guard_runs_user_code(k)) << guard_kind_name(k);
        // ...unless the runtime evaluates the declaration through Python.
        GuardDecl d = minimal_decl(k);
        EXPECT_FALSE(guard_runs_user_code(d)) << guard_kind_name(k);
        d.via_python = true;
        EXPECT_TRUE(guard_runs_user_code(d)) << guard_kind_name(k);
    }
    // ...while len(), lookups (a colliding key's or element's __eq__), getattr, probes and
    // predicates may, and the iterator kinds allocate a bound method and a tuple.
    for (GuardKind k :
         {GuardKind::Length, GuardKind::DictContains, GuardKind::SetContains, GuardKind::HasAttr,
          GuardKind::TupleIteratorLen, GuardKind::RangeIterator, GuardKind::CodeMatch, GuardKind::GlobalState,
          GuardKind::Lambda, GuardKind::DimensionMarking}) {
        EXPECT_TRUE(guard_runs_user_code(k)) << guard_kind_name(k);
    }
    // Unknown kinds are treated as impure (the safe answer).
    EXPECT_TRUE(guard_runs_user_code(guard_kind(kGuardKindCount)));
}

TEST(IrPurity, StepKinds) {
    // The class-dict and MRO steps read borrowed fields of the type object.
    for (StepKind k : {StepKind::Type, StepKind::WeakrefCall, StepKind::DictKey, StepKind::DictValue,
                       StepKind::TypeDict, StepKind::TypeMro}) {
        EXPECT_FALSE(step_runs_user_code(k)) << step_kind_name(k);
    }
    // __dict__ may have to create the instance dict: an allocation.
    // Tensor and array properties call the object's methods unless the C-level reader answers
    // (runtime/tensors/property_reader.hpp), which only the runtime can tell per value.
    for (StepKind k : {StepKind::Attr, StepKind::Item, StepKind::DictItem, StepKind::Dict, StepKind::Defaults,
                       StepKind::KwDefaults, StepKind::Code, StepKind::ClosureCell, StepKind::Size,
                       StepKind::Stride, StepKind::StorageOffset}) {
        EXPECT_TRUE(step_runs_user_code(k)) << step_kind_name(k);
    }
    // The C++ tensor steps box what they read (an int, a grad's Python object): an allocation.
    for (StepKind k :
         {StepKind::TensorSize, StepKind::TensorStride, StepKind::TensorStorageOffset, StepKind::Grad}) {
        EXPECT_TRUE(step_runs_user_code(k)) << step_kind_name(k);
        EXPECT_TRUE(is_cpp_tensor_step(k)) << step_kind_name(k);
    }
    EXPECT_FALSE(is_cpp_tensor_step(StepKind::Size));
    EXPECT_TRUE(step_runs_user_code(step_kind(kStepKindCount)));
}

TEST(IrPurity, EveryKindIsClassified) {
    // Each kind appears in exactly one of the two lists above; this catches a new enumerator
    // that was added to the enum but not to the tests.
    int pure = 0, impure = 0;
    for (int i = 0; i < kGuardKindCount; ++i) (guard_runs_user_code(guard_kind(i)) ? impure : pure)++;
    EXPECT_EQ(pure, 17);
    EXPECT_EQ(impure, 10);
    pure = impure = 0;
    for (int i = 0; i < kStepKindCount; ++i) (step_runs_user_code(step_kind(i)) ? impure : pure)++;
    EXPECT_EQ(pure, 6);
    EXPECT_EQ(impure, 15);
}

TEST(IrStep, EqualityComparesKindOperandAndIndex) {
    const Step a{StepKind::Attr, 1, 0};
    EXPECT_EQ(a, (Step{StepKind::Attr, 1, 0}));
    EXPECT_FALSE(a == (Step{StepKind::Item, 1, 0}));
    EXPECT_FALSE(a == (Step{StepKind::Attr, 2, 0}));
    EXPECT_FALSE(a == (Step{StepKind::Attr, 1, 1}));
}

}  // namespace
}  // namespace tripwire::core
