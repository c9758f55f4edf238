// tripwire/cpp/core/guard_kind_table.hpp -- the one table of per-kind facts of the guard catalogue.
//
// Every fact about a guard kind that code decides by kind is a column of this X-macro, in the
// style of CPython's opcode tables: the GuardKind enum, its names, the declaration's shape, the
// user-code and relational properties, what a held guard implies, the record version and the
// codec that stores it, the fast-pass op and the evaluator are all expanded from these rows, and
// the Python catalogue reads them through the binding (tripwire._core.guard_kind_table). How a
// kind evaluates, stores or compiles stays in functions; which function handles a kind is this
// table's. Adding a kind is a row here plus the functions its row names (docs/cpp.md, "Adding a
// guard kind").
//
// X(Name, value, "NAME", SOURCE, OPERAND, OPERAND2, USER_CODE, RELATIONAL, IMPLIED, RECORD,
//   PAYLOAD, FAST, EVAL, LOAD, ADAPTER, NEVER_STORED), one row per kind, in value order:
//
//   Name          the GuardKind enumerator.
//   value         its number: stored in files and bound to Python, so never reused or moved (a
//                 value missing from the table is reserved: guard_kind_known says no).
//   "NAME"        the catalogue's spelling (docs/guards.md).
//   SOURCE        KindSource: Required, Optional (LAMBDA without one reads f_locals) or Absent
//                 (ambient state; SHAPE reads its symbols' sources).
//   OPERAND       KindOperand: No; Value (a constant, key, name, probe, predicate); Identity (an
//                 object compared by identity: the Python side holds it weakly where it can).
//   OPERAND2      whether the declaration uses operand2 (a key tuple, a dtype, a snapshot).
//   USER_CODE     whether evaluating it can run code that is not the interpreter's own, directly or
//                 by allocating (a collection runs finalizers): guard_runs_user_code.
//   RELATIONAL    whether it relates the values of several sources (more_sources): is_relational.
//   IMPLIED       Implied: for how long a guard that held keeps holding without being evaluated
//                 (the fast pass's unchanged-subtree skip, docs/cpp.md).
//   RECORD        the record version the encoder writes for the kind; 0: never stored.
//   PAYLOAD       the payload codec (core/codec/guard_records.cpp: write_<PAYLOAD>, read_<PAYLOAD>).
//   FAST          the fast pass's op (runtime/eval/guard_set.hpp, FastOp::Code): SlowGuard for a
//                 kind with no form free of user code (evaluated as a residue) and for the kinds
//                 that are never a node's guard (relational, SHAPE). Read by the runtime only.
//   EVAL          the runtime's evaluator of one guard on one value (runtime/eval/guard_kinds.cpp),
//                 `int EVAL(const RuntimeGuard&, PyObject*)`. Read by the runtime only.
//   LOAD          KindLoad: how a loaded record's operands are checked: Native (in C++,
//                 runtime/serial/loaded.cpp's check_operands) or Python (the loader builds the
//                 guard's spec at load, which checks them: torch-build codes, plain data).
//   ADAPTER       whether it is read through the torch adapter only (no Python reader): a loaded
//                 set holding it switches torch support on (LoadedFacts::reads_torch_adapter).
//   NEVER_STORED  why it is never stored (RECORD 0), or nullptr.
#pragma once

#include <cstdint>

// clang-format off
#define TRIPWIRE_GUARD_KINDS(X) \
    /*Name                 val "NAME"                    SOURCE    OPERAND   OP2 USER REL IMPLIED               REC PAYLOAD       FAST                 EVAL                         LOAD    ADA NEVER_STORED */ \
    X(TypeMatch,           0,  "TYPE_MATCH",             Required, Identity, 0,  0,   0,  IfImmutableType,      1,  Operand,      TypeIs,              eval_type_match,             Native, 0,  nullptr) \
    X(IdMatch,             1,  "ID_MATCH",               Required, Identity, 0,  0,   0,  Identity,             1,  Operand,      IdIs,                eval_id_match,               Native, 0,  nullptr) \
    X(None,                2,  "NONE",                   Required, No,       0,  0,   0,  Identity,             1,  Nothing,      IsNone,              eval_none,                   Native, 0,  nullptr) \
    X(NotNone,             3,  "NOT_NONE",               Required, No,       0,  0,   0,  Identity,             1,  Nothing,      IsNotNone,           eval_not_none,               Native, 0,  nullptr) \
    X(True,                4,  "TRUE",                   Required, No,       0,  0,   0,  Identity,             1,  Nothing,      IsTrue,              eval_true,                   Native, 0,  nullptr) \
    X(False,               5,  "FALSE",                  Required, No,       0,  0,   0,  Identity,             1,  Nothing,      IsFalse,             eval_false,                  Native, 0,  nullptr) \
    X(EqualsMatch,         6,  "EQUALS_MATCH",           Required, Value,    0,  0,   0,  IfImmutableConstant,  1,  Equals,       Equals,              eval_equals_match,           Native, 0,  nullptr) \
    X(Length,              7,  "LENGTH",                 Required, No,       0,  1,   0,  DictStateOrFixedSize, 1,  Count,        LengthExact,         eval_length,                 Native, 0,  nullptr) \
    X(DictKeys,            8,  "DICT_KEYS",              Required, No,       1,  0,   0,  DictState,            1,  KeyTuple,     DictKeys,            eval_dict_keys,              Native, 0,  nullptr) \
    X(DictContains,        9,  "DICT_CONTAINS",          Required, Value,    0,  1,   0,  DictState,            1,  OperandFlag,  DictContains,        eval_dict_contains,          Native, 0,  nullptr) \
    X(HasAttr,             10, "HASATTR",                Required, Value,    0,  1,   0,  Never,                1,  OperandFlag,  HasAttr,             eval_has_attr,               Native, 0,  nullptr) \
    X(DictVersion,         11, "DICT_VERSION",           Required, No,       0,  0,   0,  DictState,            0,  Never,        DictVersion,         eval_dict_version,           Native, 0,  "a dict version is a counter of this process: it cannot be compared in another one") \
    X(TupleIteratorLen,    12, "TUPLE_ITERATOR_LEN",     Required, No,       0,  1,   0,  Never,                1,  Count,        SlowGuard,           eval_tuple_iterator_len,     Native, 0,  nullptr) \
    X(RangeIterator,       13, "RANGE_ITERATOR",         Required, Value,    0,  1,   0,  Never,                1,  Operand,      SlowGuard,           eval_range_iterator,         Native, 0,  nullptr) \
    X(CodeMatch,           14, "CODE_MATCH",             Required, Identity, 0,  1,   0,  Never,                1,  Operand,      CodeIs,              eval_code_match,             Native, 0,  nullptr) \
    X(WeakrefAlive,        15, "WEAKREF_ALIVE",          Required, No,       0,  0,   0,  Never,                1,  Nothing,      WeakrefAlive,        eval_weakref_alive,          Native, 0,  nullptr) \
    X(GlobalState,         16, "GLOBAL_STATE",           Absent,   No,       1,  1,   0,  Never,                1,  Probe,        SlowGuard,           eval_global_state,           Python, 0,  nullptr) \
    X(Lambda,              17, "LAMBDA",                 Optional, Value,    0,  1,   0,  Never,                0,  Never,        SlowGuard,           eval_lambda,                 Native, 0,  "a predicate is code; the format never stores code") \
    X(TensorMatch,         18, "TENSOR_MATCH",           Required, Identity, 0,  0,   0,  Never,                1,  Tensor,       TensorMatch,         eval_tensor_match,           Python, 0,  nullptr) \
    X(ArrayMatch,          19, "ARRAY_MATCH",            Required, Identity, 1,  0,   0,  Never,                1,  Array,        ArrayMatch,          eval_array_match,            Python, 0,  nullptr) \
    X(DimensionMarking,    20, "DIMENSION_MARKING",      Required, Value,    1,  1,   0,  Never,                1,  Markings,     DimensionMarking,    eval_dimension_marking,      Python, 0,  nullptr) \
    X(Alias,               21, "ALIAS",                  Required, No,       0,  0,   1,  Never,                1,  OtherSource,  SlowGuard,           eval_decided_by_set,         Native, 0,  nullptr) \
    X(NoAlias,             22, "NO_ALIAS",               Required, No,       0,  0,   1,  Never,                1,  OtherSources, SlowGuard,           eval_decided_by_set,         Native, 0,  nullptr) \
    X(Shape,               23, "SHAPE",                  Absent,   No,       0,  0,   0,  Never,                1,  Relation,     SlowGuard,           eval_decided_by_set,         Python, 0,  nullptr) \
    X(StorageOverlapping,  24, "STORAGE_OVERLAPPING",    Required, No,       0,  0,   1,  Never,                1,  Overlap,      SlowGuard,           eval_decided_by_set,         Native, 1,  nullptr) \
    X(DispatchKeySetMatch, 25, "DISPATCH_KEY_SET_MATCH", Required, No,       0,  0,   0,  Never,                1,  KeyBits,      DispatchKeySetMatch, eval_dispatch_key_set_match, Python, 1,  nullptr) \
    X(SetContains,         26, "SET_CONTAINS",           Required, Value,    0,  1,   0,  Never,                1,  OperandFlag,  SetContains,         eval_set_contains,           Native, 0,  nullptr)
// clang-format on

namespace tripwire::core {

/// Whether a kind's declaration has a source (the table's SOURCE column).
enum class KindSource : std::uint8_t {
    Required,  ///< reads one source (a relational kind: its first)
    Optional,  ///< LAMBDA: without a source the predicate reads f_locals
    Absent,    ///< ambient state (GLOBAL_STATE), or sources of its own (SHAPE's symbols)
};

/// What a kind's operand is (the table's OPERAND column).
enum class KindOperand : std::uint8_t {
    No,        ///< unused (GLOBAL_STATE's optional Python probe is checked by validate_decl)
    Value,     ///< a constant, key, attribute name, probe or predicate
    Identity,  ///< an object the guard compares by identity (a type, an object, a code object)
};

/// How a loaded record's operands are checked (the table's LOAD column).
enum class KindLoad : std::uint8_t {
    Native,  ///< in C++ (runtime/serial/loaded.cpp, check_operands), per record
    Python,  ///< by the Python loader, which builds the guard's spec at load
};

/// For how long a guard that held keeps holding without being evaluated again (the table's
/// IMPLIED column). Conditional forms are decided on the guard's own operand by the runtime.
enum class Implied : std::uint8_t {
    Never,                 ///< evaluated on every check: the value can change behind the object
    Identity,              ///< holds forever on the same live object
    IfImmutableType,       ///< Identity when the type is immutable (no __class__ assignment), else Never
    IfImmutableConstant,   ///< Identity when the constant is built of immutable objects, else Never
    DictState,             ///< holds while the node's dict is unchanged (its tag)
    DictStateOrFixedSize,  ///< DictState; Identity on a node also matched to a fixed-size type
};

}  // namespace tripwire::core
