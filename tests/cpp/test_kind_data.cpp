// tripwire/tests/cpp/test_kind_data.cpp -- per-kind plain data (kind_data.hpp) and relational guards.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/ir.hpp"
#include "core/kind_data.hpp"
#include "core/program.hpp"
#include "testing.hpp"

namespace tripwire::core {
namespace {

using test_util::attr;
using test_util::local;
using test_util::on;
using test_util::relate;

constexpr std::size_t kConsts = 8;

GuardDecl with_data(GuardKind k, std::vector<std::int64_t> data) {
    GuardDecl d = on(0, local(0), k, 1);
    d.data = std::move(data);
    return d;
}

// A 2-D tensor [4, 8] with strides [8, 1]: header then (size, stride) pairs.
std::vector<std::int64_t> tensor_2d() { return {0x8001, 6, -1, 0, 2, kAny, 4, 8, 8, 1}; }

TEST(KindData, TensorLayout) {
    EXPECT_NO_THROW(validate_decl(with_data(GuardKind::TensorMatch, tensor_2d()), kConsts));
    auto dynamic = tensor_2d();
    dynamic[tensor_data::kHeader] = kAny;  // size[0] unchecked
    dynamic[tensor_data::kHeader + 3] = kAny;
    EXPECT_NO_THROW(validate_decl(with_data(GuardKind::TensorMatch, dynamic), kConsts));
    // Too short, an ndim that does not match, a negative size, a bad flag or offset.
    for (const auto& bad : std::vector<std::vector<std::int64_t>>{
             {},
             {0, 6, -1, 0},
             {0, 6, -1, 0, 3, kAny, 4, 8, 8, 1},
             {0, 6, -1, 0, 1, kAny, -4, 1},
             {0, 6, -1, 2, 0, kAny},
             {0, 6, -2, 0, 0, kAny},
             {0, 6, -1, 0, 0, -5},
             {0, 300, -1, 0, 0, kAny},
             {0, 6, -1, 0, kMaxDims + 1, kAny},
             {0, 6, -1, 0, -1, kAny},
         }) {
        EXPECT_THROW(validate_decl(with_data(GuardKind::TensorMatch, bad), kConsts), InvalidProgram);
    }
}

TEST(KindData, ArrayLayout) {
    EXPECT_NO_THROW(validate_decl(with_data(GuardKind::ArrayMatch, {2, 5, 1, 3, 32, 4, 8}), kConsts));
    EXPECT_NO_THROW(
        validate_decl(with_data(GuardKind::ArrayMatch, {1, 0, 0, kAny, -8}), kConsts));  // negative stride
    for (const auto& bad : std::vector<std::vector<std::int64_t>>{
             {2, 5, 1, 3, 32},
             {0, 8, 1},
             {0, -1, 1},
             {0, 0, 2},
             {1, 0, 1, -3, 8},
         }) {
        EXPECT_THROW(validate_decl(with_data(GuardKind::ArrayMatch, bad), kConsts), InvalidProgram);
    }
}

TEST(KindData, MarkingLayout) {
    EXPECT_NO_THROW(
        validate_decl(with_data(GuardKind::DimensionMarking, {2, 0, 1, -1, -1, 0, 1, 3}), kConsts));
    for (const auto& bad : std::vector<std::vector<std::int64_t>>{
             {-1, -1, -1, -1},
             {-1, -1, -1, -1, -1, 7},
             {2, 0, -1, -1, -1, -1},
             {-2, -1, -1, -1, -1},
         }) {
        EXPECT_THROW(validate_decl(with_data(GuardKind::DimensionMarking, bad), kConsts), InvalidProgram);
    }
    EXPECT_EQ(marking_data::attr_name(0), "_dynamo_dynamic_indices");
    EXPECT_EQ(marking_data::attr_name(marking_data::kGateAttr), "_dynamo_unbacked_indices");
    EXPECT_EQ(marking_data::attr_name(4), "_dynamo_static_indices");
}

TEST(KindData, KindsWithoutDataRejectIt) {
    GuardDecl d = on(0, local(0), GuardKind::TypeMatch, 1);
    d.data = {1};
    EXPECT_THROW(validate_decl(d, kConsts), InvalidProgram);
}

GuardDecl torch_probe(BuiltinProbe p) {
    GuardDecl d = test_util::ambient(0, p);
    return d;
}

TEST(KindData, TorchProbesCarryTheirSnapshots) {
    GuardDecl state = torch_probe(BuiltinProbe::TorchGlobalState);
    EXPECT_THROW(validate_decl(state, kConsts), InvalidProgram);  // no snapshot
    state.data = {1, 1, 0, 0, 0, 0, 0, 0, 2, 6, 1, 2, 0, 1, 0, 0, 15, 5};
    EXPECT_NO_THROW(validate_decl(state, kConsts));
    state.data[torch_state::kGradMode] = 2;
    EXPECT_THROW(validate_decl(state, kConsts), InvalidProgram);
    state.data[torch_state::kGradMode] = 1;
    state.data[torch_state::kAutocastDevices] = 3;  // does not match the size
    EXPECT_THROW(validate_decl(state, kConsts), InvalidProgram);
    EXPECT_EQ(torch_state::field_name(torch_state::kAllowTf32), "allow_tf32");

    for (BuiltinProbe p : {BuiltinProbe::TorchFunctionModeStack, BuiltinProbe::TorchDefaultDevice,
                           BuiltinProbe::TorchSavedTensorsHooks, BuiltinProbe::TorchDualLevel}) {
        GuardDecl d = torch_probe(p);
        EXPECT_THROW(validate_decl(d, kConsts), InvalidProgram);  // the snapshot object is missing
        d.operand2 = 3;
        EXPECT_NO_THROW(validate_decl(d, kConsts));
        d.data = {1};
        EXPECT_THROW(validate_decl(d, kConsts), InvalidProgram);
    }
    GuardDecl gc = torch_probe(BuiltinProbe::GcEnabled);
    gc.operand2 = 3;
    EXPECT_THROW(validate_decl(gc, kConsts), InvalidProgram);
}

TEST(Relational, SourceCounts) {
    EXPECT_NO_THROW(validate_decl(relate(0, GuardKind::Alias, {local(0), local(1)}), kConsts));
    EXPECT_THROW(validate_decl(relate(0, GuardKind::Alias, {local(0)}), kConsts), InvalidProgram);
    EXPECT_THROW(validate_decl(relate(0, GuardKind::Alias, {local(0), local(1), local(2)}), kConsts),
                 InvalidProgram);
    EXPECT_THROW(validate_decl(relate(0, GuardKind::NoAlias, {local(0)}), kConsts), InvalidProgram);
    EXPECT_NO_THROW(validate_decl(relate(0, GuardKind::NoAlias, {local(0), local(1), local(2)}), kConsts));
    // Other kinds take one source; the other sources are validated too.
    GuardDecl d = on(0, local(0));
    d.more_sources.push_back(local(1));
    EXPECT_THROW(validate_decl(d, kConsts), InvalidProgram);
    GuardDecl far = relate(0, GuardKind::Alias, {local(0), local(kConsts)});
    EXPECT_THROW(validate_decl(far, kConsts), InvalidProgram);
}

TEST(Relational, CompileAttachesOneOperandPerSource) {
    // L['c0'].c3 and L['c1'] related; a TYPE_MATCH shares the L['c0'] prefix.
    std::vector<GuardDecl> decls{on(0, local(0)),
                                 relate(1, GuardKind::NoAlias, {local(0, {attr(3)}), local(1)}),
                                 relate(2, GuardKind::Alias, {local(1), local(0, {attr(3)})})};
    const Program p = compile(decls, kConsts);
    ASSERT_EQ(p.relational.size(), 2u);
    EXPECT_EQ(p.node_members.size(), 4u);
    EXPECT_TRUE(p.ambient.empty());
    EXPECT_EQ(p.node_guards.size(), 1u);
    // Three nodes: L['c0'], L['c0'].c3, L['c1'].
    ASSERT_EQ(p.nodes.size(), 3u);
    const Node& c0 = p.nodes[0];
    const Node& c3 = p.nodes[1];
    const Node& c1 = p.nodes[2];
    EXPECT_EQ(c0.member_end - c0.member_begin, 0u);
    ASSERT_EQ(c3.member_end - c3.member_begin, 2u);
    EXPECT_EQ(p.node_members[c3.member_begin], (Member{1, 0}));
    EXPECT_EQ(p.node_members[c3.member_begin + 1], (Member{2, 1}));
    ASSERT_EQ(c1.member_end - c1.member_begin, 2u);
    EXPECT_EQ(p.node_members[c1.member_begin], (Member{1, 1}));
    EXPECT_EQ(p.node_members[c1.member_begin + 1], (Member{2, 0}));
    // min_guard_id counts relational operands: L['c1'] carries only guards 1 and 2.
    EXPECT_EQ(c1.min_guard_id, 1u);
    EXPECT_EQ(c0.min_guard_id, 0u);
    // Comparing pointers runs no user code; the attribute step does.
    EXPECT_FALSE(c1.subtree_runs_user_code);
    EXPECT_TRUE(c0.subtree_runs_user_code);
}

TEST(Relational, ValidateRejectsBrokenOperands) {
    std::vector<GuardDecl> decls{relate(0, GuardKind::NoAlias, {local(0), local(1), local(2)})};
    const Program good = compile(decls, kConsts);
    EXPECT_NO_THROW(validate(good, kConsts));
    {
        Program p = good;  // an operand moved to another node
        std::swap(p.node_members[0], p.node_members[1]);
        EXPECT_THROW(validate(p, kConsts), InvalidProgram);
    }
    {
        Program p = good;  // an operand listed twice
        p.node_members[1] = p.node_members[0];
        EXPECT_THROW(validate(p, kConsts), InvalidProgram);
    }
    {
        Program p = good;  // the guard dropped from the relational list
        p.relational.clear();
        EXPECT_THROW(validate(p, kConsts), InvalidProgram);
    }
    {
        Program p = good;  // a relational guard attached as a node guard
        p.relational.clear();
        p.node_guards.push_back(0);
        p.nodes[0].guard_end = 1;
        EXPECT_THROW(validate(p, kConsts), InvalidProgram);
    }
    {
        Program p = good;  // an operand slot out of range
        p.node_members[2].slot = 7;
        EXPECT_THROW(validate(p, kConsts), InvalidProgram);
    }
    {
        Program p = good;  // a member range past the end
        p.nodes[2].member_end = 9;
        EXPECT_THROW(validate(p, kConsts), InvalidProgram);
    }
}

TEST(Relational, ViaPythonMarksTheSubtreeImpure) {
    GuardDecl t = with_data(GuardKind::TensorMatch, tensor_2d());
    EXPECT_FALSE(compile({t}, kConsts).nodes[0].subtree_runs_user_code);
    t.via_python = true;
    EXPECT_TRUE(compile({t}, kConsts).nodes[0].subtree_runs_user_code);
}

}  // namespace
}  // namespace tripwire::core
