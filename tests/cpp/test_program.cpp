// tripwire/tests/cpp/test_program.cpp -- compile(): prefix sharing, layout, derived facts, and
// validate(): every rule a declaration or a hand-corrupted program can break.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/program.hpp"
#include "testing.hpp"

namespace tripwire::core {
namespace {

using test_util::ambient;
using test_util::attr;
using test_util::defaults;
using test_util::dict_item;
using test_util::item;
using test_util::local;
using test_util::on;
using test_util::source;
using test_util::type_of;

constexpr std::size_t kConsts = 16;
// Constant ids used as names below.
constexpr ConstId A = 0, B = 1, C = 2, D = 3, T = 4;

std::vector<std::uint32_t> guard_ids(const Program& p, const Node& n) {
    std::vector<std::uint32_t> out;
    for (std::uint32_t g = n.guard_begin; g < n.guard_end; ++g) out.push_back(p.guards[p.node_guards[g]].id);
    return out;
}

std::vector<std::string> child_texts(const Program& p, const Node& n) {
    std::vector<std::string> out;
    for (std::uint32_t c = n.child_begin; c < n.child_end; ++c) out.push_back(p.nodes[p.children[c]].text);
    return out;
}

const Node& find(const Program& p, const std::string& text) {
    for (const Node& n : p.nodes) {
        if (n.text == text) return n;
    }
    ADD_FAILURE() << "no node " << text;
    static const Node none;
    return none;
}

// -- compile: shape of the tree ------------------------------------------------------------------

TEST(Compile, EmptyDeclListGivesEmptyProgram) {
    const Program p = compile({}, 0);
    EXPECT_TRUE(p.guards.empty());
    EXPECT_TRUE(p.nodes.empty());
    EXPECT_TRUE(p.node_guards.empty());
    EXPECT_TRUE(p.children.empty());
    EXPECT_TRUE(p.roots.empty());
    EXPECT_TRUE(p.ambient.empty());
    EXPECT_EQ(p.max_depth, 0u);
    EXPECT_NO_THROW(validate(p, 0));
}

TEST(Compile, SiblingAttributesShareTheirRoot) {
    // L['a'].b and L['a'].c: one L['a'] node with two children.
    const Program p = compile({on(0, local(A, {attr(B)})), on(1, local(A, {attr(C)}))}, kConsts);
    ASSERT_EQ(p.roots.size(), 1u);
    ASSERT_EQ(p.nodes.size(), 3u);
    const Node& root = p.nodes[p.roots[0]];
    EXPECT_TRUE(root.is_root);
    EXPECT_EQ(root.root, RootKind::Local);
    EXPECT_EQ(root.root_name, A);
    EXPECT_EQ(root.text, "L['c0']");
    EXPECT_EQ(root.child_end - root.child_begin, 2u);
    EXPECT_EQ(root.guard_end, root.guard_begin);
    EXPECT_EQ(child_texts(p, root), (std::vector<std::string>{"L['c0'].c1", "L['c0'].c2"}));
    for (std::uint32_t c = root.child_begin; c < root.child_end; ++c) {
        const Node& child = p.nodes[p.children[c]];
        EXPECT_FALSE(child.is_root);
        EXPECT_EQ(child.parent, p.roots[0]);
        EXPECT_EQ(child.depth, 1u);
        EXPECT_EQ(child.step.kind, StepKind::Attr);
        EXPECT_EQ(child.guard_end - child.guard_begin, 1u);
    }
    EXPECT_EQ(p.max_depth, 1u);
}

TEST(Compile, OneNodePerDistinctSource) {
    // Many guards, few distinct sources: count nodes == distinct prefixes.
    std::vector<GuardDecl> ds;
    std::uint32_t id = 0;
    for (int rep = 0; rep < 3; ++rep) {
        ds.push_back(on(id++, local(A)));
        ds.push_back(on(id++, local(A, {attr(B)})));
        ds.push_back(on(id++, local(A, {attr(B), item(C)})));
        ds.push_back(on(id++, local(A, {attr(B), dict_item(C)})));  // different step kind, same key
        ds.push_back(on(id++, local(A, {attr(C)})));
        ds.push_back(on(id++, local(B, {type_of()})));
        ds.push_back(on(id++, source(RootKind::Global, A)));  // G['a'] is not L['a']
        ds.push_back(on(id++, local(A, {defaults(0)})));
        ds.push_back(on(id++, local(A, {defaults(1)})));  // index distinguishes steps
    }
    const Program p = compile(ds, kConsts);
    // L['a'], .b, .b['c'], .b[dict 'c'], .c, L['b'], type(L['b']), G['a'], defaults 0, defaults 1
    EXPECT_EQ(p.nodes.size(), 10u);
    EXPECT_EQ(p.roots.size(), 3u);
    // No two siblings fetch the same way.
    for (const Node& n : p.nodes) {
        for (std::uint32_t i = n.child_begin; i < n.child_end; ++i) {
            for (std::uint32_t j = i + 1; j < n.child_end; ++j) {
                EXPECT_FALSE(p.nodes[p.children[i]].step == p.nodes[p.children[j]].step) << n.text;
            }
        }
    }
    // Every node carries the three repetitions of its guard.
    for (const Node& n : p.nodes) {
        if (n.is_root && n.root_name == A && n.root == RootKind::Local) continue;  // also has children
        if (n.child_end == n.child_begin) {
            EXPECT_EQ(n.guard_end - n.guard_begin, 3u) << n.text;
        }
    }
    EXPECT_EQ(guard_ids(p, find(p, "L['c0']")), (std::vector<std::uint32_t>{0, 9, 18}));
    EXPECT_EQ(p.max_depth, 2u);
}

TEST(Compile, GuardsAreSortedById) {
    std::vector<GuardDecl> ds = {on(7, local(A)), on(2, local(B)), on(5, local(A)), ambient(3),
                                 on(0, local(C))};
    const Program p = compile(ds, kConsts);
    ASSERT_EQ(p.guards.size(), 5u);
    for (std::size_t i = 1; i < p.guards.size(); ++i) EXPECT_LT(p.guards[i - 1].id, p.guards[i].id);
    // Node guards refer to the sorted array; roots appear in the order of their first (smallest) id.
    std::vector<std::string> roots;
    for (std::uint32_t r : p.roots) roots.push_back(p.nodes[r].text);
    EXPECT_EQ(roots, (std::vector<std::string>{"L['c2']", "L['c1']", "L['c0']"}));
    EXPECT_EQ(guard_ids(p, find(p, "L['c0']")), (std::vector<std::uint32_t>{5, 7}));
    ASSERT_EQ(p.ambient.size(), 1u);
    EXPECT_EQ(p.guards[p.ambient[0]].id, 3u);
}

TEST(Compile, ChildrenAndGuardsInInstallationOrder) {
    std::vector<GuardDecl> ds = {
        on(0, local(A, {attr(D)})),         on(1, local(A)),
        on(2, local(A, {attr(B)})),         on(3, local(A), GuardKind::NotNone),
        on(4, local(A, {attr(C)})),         on(5, local(A, {attr(B)}), GuardKind::Length),
        on(6, local(A), GuardKind::Length),
    };
    const Program p = compile(ds, kConsts);
    const Node& root = find(p, "L['c0']");
    EXPECT_EQ(child_texts(p, root), (std::vector<std::string>{"L['c0'].c3", "L['c0'].c1", "L['c0'].c2"}));
    EXPECT_EQ(guard_ids(p, root), (std::vector<std::uint32_t>{1, 3, 6}));
    EXPECT_EQ(guard_ids(p, find(p, "L['c0'].c1")), (std::vector<std::uint32_t>{2, 5}));
}

TEST(Compile, RangesAreContiguousAndCoverEverything) {
    std::vector<GuardDecl> ds;
    for (std::uint32_t i = 0; i < 40; ++i) {
        std::vector<Step> steps;
        for (std::uint32_t s = 0; s < i % 5; ++s) steps.push_back(attr((i + s) % 3));
        ds.push_back(on(i, local(i % 4, steps)));
        if (i % 7 == 0) ds.push_back(ambient(100 + i));
    }
    const Program p = compile(ds, kConsts);
    std::uint32_t next_guard = 0, next_child = 0;
    for (const Node& n : p.nodes) {
        EXPECT_EQ(n.guard_begin, next_guard);
        EXPECT_EQ(n.child_begin, next_child);
        next_guard = n.guard_end;
        next_child = n.child_end;
    }
    EXPECT_EQ(next_guard + p.ambient.size(), p.guards.size());
    EXPECT_EQ(next_child + p.roots.size(), p.nodes.size());
}

TEST(Compile, DeepSourceWithinLimit) {
    std::vector<Step> steps(kMaxSourceDepth, attr(B));
    const Program p = compile({on(0, local(A, steps))}, kConsts);
    EXPECT_EQ(p.nodes.size(), kMaxSourceDepth + 1);
    EXPECT_EQ(p.max_depth, kMaxSourceDepth);
    for (std::size_t i = 1; i < p.nodes.size(); ++i) {
        EXPECT_EQ(p.nodes[i].parent, i - 1);
        EXPECT_EQ(p.nodes[i].depth, i);
    }
}

// -- compile: derived facts ----------------------------------------------------------------------

TEST(Compile, MinGuardIdOfSubtrees) {
    std::vector<GuardDecl> ds = {
        on(4, local(A)),
        on(9, local(A, {attr(B)})),
        on(2, local(A, {attr(B), item(C)})),
        on(7, local(A, {attr(C)})),
        on(1, local(B, {attr(C)})),
        on(8, local(B)),
    };
    const Program p = compile(ds, kConsts);
    EXPECT_EQ(find(p, "L['c0']").min_guard_id, 2u);
    EXPECT_EQ(find(p, "L['c0'].c1").min_guard_id, 2u);
    EXPECT_EQ(find(p, "L['c0'].c1['c2']").min_guard_id, 2u);
    EXPECT_EQ(find(p, "L['c0'].c2").min_guard_id, 7u);
    EXPECT_EQ(find(p, "L['c1']").min_guard_id, 1u);
    EXPECT_EQ(find(p, "L['c1'].c2").min_guard_id, 1u);
}

TEST(Compile, SubtreeRunsUserCode) {
    std::vector<GuardDecl> ds = {
        // type(L['a']) is TYPE_MATCH'd: pure step, pure guard.
        on(0, local(A, {type_of()})),
        // L['b']: a pure guard; below it, a LENGTH (user __len__) behind a pure step.
        on(1, local(B)),
        on(2, local(B, {type_of()}), GuardKind::Length),
        // L['c'].b: an attribute fetch may run user code even under a pure guard.
        on(3, local(C, {attr(B)})),
        // L['d']: only pure guards.
        on(4, local(D), GuardKind::NotNone),
    };
    const Program p = compile(ds, kConsts);
    EXPECT_FALSE(find(p, "L['c0']").subtree_runs_user_code);
    EXPECT_FALSE(find(p, "type(L['c0'])").subtree_runs_user_code);
    EXPECT_TRUE(find(p, "L['c1']").subtree_runs_user_code);
    EXPECT_TRUE(find(p, "type(L['c1'])").subtree_runs_user_code);
    EXPECT_TRUE(find(p, "L['c2']").subtree_runs_user_code);      // the .b fetch below it
    EXPECT_FALSE(find(p, "L['c2'].c1").subtree_runs_user_code);  // the fetch of itself is its parent's
    EXPECT_FALSE(find(p, "L['c3']").subtree_runs_user_code);
}

TEST(Compile, AmbientGuardsHaveNoNode) {
    GuardDecl lambda;
    lambda.kind = GuardKind::Lambda;
    lambda.has_source = false;
    lambda.operand = T;
    lambda.id = 2;
    GuardDecl probe = ambient(0);
    probe.operand = T;  // a Python probe with its snapshot
    probe.operand2 = T + 1;
    const Program p = compile({lambda, ambient(1, BuiltinProbe::RecursionLimit), probe}, kConsts);
    EXPECT_TRUE(p.nodes.empty());
    EXPECT_TRUE(p.node_guards.empty());
    ASSERT_EQ(p.ambient.size(), 3u);
    for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(p.guards[p.ambient[i]].id, i);
}

TEST(Compile, LambdaMayHaveASource) {
    GuardDecl d = on(0, local(A), GuardKind::Lambda, T);
    const Program p = compile({d}, kConsts);
    EXPECT_TRUE(p.ambient.empty());
    ASSERT_EQ(p.nodes.size(), 1u);
    EXPECT_TRUE(p.nodes[0].subtree_runs_user_code);
}

// -- compile: rejected declarations --------------------------------------------------------------

TEST(CompileRejects, ConstantOutOfRange) {
    EXPECT_THROW(compile({on(0, local(A), GuardKind::TypeMatch, kConsts)}, kConsts), InvalidProgram);
    EXPECT_THROW(compile({on(0, local(kConsts))}, kConsts), InvalidProgram);              // root name
    EXPECT_THROW(compile({on(0, local(A, {attr(kConsts)}))}, kConsts), InvalidProgram);   // step
    EXPECT_THROW(compile({on(0, local(A, {attr(B)}))}, /*n_consts=*/1), InvalidProgram);  // B >= 1
    EXPECT_NO_THROW(compile({on(0, local(A, {attr(B)}), GuardKind::TypeMatch, 1)}, 2));
    GuardDecl keys = on(0, local(A), GuardKind::DictKeys, kConsts);
    EXPECT_THROW(compile({keys}, kConsts), InvalidProgram);
    GuardDecl probe = ambient(0);
    probe.operand = T;
    probe.operand2 = kConsts;
    EXPECT_THROW(compile({probe}, kConsts), InvalidProgram);
}

TEST(CompileRejects, MissingOperands) {
    for (GuardKind k :
         {GuardKind::TypeMatch, GuardKind::IdMatch, GuardKind::EqualsMatch, GuardKind::DictContains,
          GuardKind::HasAttr, GuardKind::CodeMatch, GuardKind::RangeIterator, GuardKind::Lambda}) {
        GuardDecl d = on(0, local(A), k);
        d.operand = kNoConst;
        EXPECT_THROW(compile({d}, kConsts), InvalidProgram) << guard_kind_name(k);
    }
    GuardDecl keys = on(0, local(A), GuardKind::DictKeys);
    keys.operand2 = kNoConst;
    EXPECT_THROW(compile({keys}, kConsts), InvalidProgram);
    GuardDecl probe = ambient(0);  // Python probe without snapshot
    probe.operand = T;
    EXPECT_THROW(compile({probe}, kConsts), InvalidProgram);
    // A source root needs a name; operand-bearing steps need their operand.
    EXPECT_THROW(compile({on(0, local(kNoConst))}, kConsts), InvalidProgram);
    for (StepKind k : {StepKind::Attr, StepKind::Item, StepKind::DictItem, StepKind::KwDefaults}) {
        EXPECT_THROW(compile({on(0, local(A, {Step{k, kNoConst, 0}}))}, kConsts), InvalidProgram)
            << step_kind_name(k);
        EXPECT_NO_THROW(compile({on(0, local(A, {Step{k, B, 0}}))}, kConsts)) << step_kind_name(k);
    }
}

TEST(CompileRejects, StepOperandsAndIndices) {
    // Steps without an operand reject one; only indexed steps take a (non-negative) index.
    EXPECT_THROW(compile({on(0, local(A, {Step{StepKind::Type, B, 0}}))}, kConsts), InvalidProgram);
    EXPECT_THROW(compile({on(0, local(A, {Step{StepKind::Type, kNoConst, 1}}))}, kConsts), InvalidProgram);
    EXPECT_THROW(compile({on(0, local(A, {Step{StepKind::Attr, B, 1}}))}, kConsts), InvalidProgram);
    EXPECT_THROW(compile({on(0, local(A, {defaults(-1)}))}, kConsts), InvalidProgram);
    for (StepKind k : {StepKind::Defaults, StepKind::ClosureCell, StepKind::DictKey, StepKind::DictValue}) {
        EXPECT_NO_THROW(compile({on(0, local(A, {Step{k, kNoConst, 3}}))}, kConsts)) << step_kind_name(k);
        EXPECT_THROW(compile({on(0, local(A, {Step{k, B, 3}}))}, kConsts), InvalidProgram)
            << step_kind_name(k);
    }
}

TEST(CompileRejects, WrongTextsLength) {
    GuardDecl d = on(0, local(A, {attr(B), attr(C)}));
    d.source.texts.pop_back();
    EXPECT_THROW(compile({d}, kConsts), InvalidProgram);
    d = on(0, local(A, {attr(B)}));
    d.source.texts.emplace_back("extra");
    EXPECT_THROW(compile({d}, kConsts), InvalidProgram);
    d = on(0, local(A));
    d.source.texts.clear();
    EXPECT_THROW(compile({d}, kConsts), InvalidProgram);
}

TEST(CompileRejects, DeeperThanTheLimit) {
    std::vector<Step> steps(kMaxSourceDepth + 1, attr(B));
    EXPECT_THROW(compile({on(0, local(A, steps))}, kConsts), InvalidProgram);
}

TEST(CompileRejects, DuplicateIds) {
    EXPECT_THROW(compile({on(3, local(A)), on(3, local(B))}, kConsts), InvalidProgram);
    EXPECT_THROW(compile({on(1, local(A)), ambient(0), ambient(1)}, kConsts), InvalidProgram);
    EXPECT_NO_THROW(compile({on(3, local(A)), on(4, local(A))}, kConsts));
}

TEST(CompileRejects, UnknownKinds) {
    for (int bad : {kGuardKindCount, 100, 255}) {
        GuardDecl d = on(0, local(A));
        d.kind = static_cast<GuardKind>(bad);
        EXPECT_THROW(compile({d}, kConsts), InvalidProgram) << bad;
        d.has_source = false;
        EXPECT_THROW(compile({d}, kConsts), InvalidProgram) << bad;
    }
    for (int bad : {kStepKindCount, 200, 255}) {
        EXPECT_THROW(compile({on(0, local(A, {Step{static_cast<StepKind>(bad), kNoConst, 0}}))}, kConsts),
                     InvalidProgram)
            << bad;
    }
    for (int bad : {3, 255}) {
        EXPECT_THROW(compile({on(0, source(static_cast<RootKind>(bad), A))}, kConsts), InvalidProgram) << bad;
    }
}

TEST(CompileRejects, SourceOnAmbientKindAndMissingSource) {
    GuardDecl g = ambient(0);
    g.has_source = true;
    g.source = local(A);
    EXPECT_THROW(compile({g}, kConsts), InvalidProgram);
    GuardDecl t = on(0, local(A));
    t.has_source = false;
    EXPECT_THROW(compile({t}, kConsts), InvalidProgram);
}

TEST(CompileRejects, UnknownBuiltinProbe) {
    EXPECT_THROW(compile({ambient(0, static_cast<BuiltinProbe>(2))}, kConsts), InvalidProgram);
    EXPECT_THROW(compile({ambient(0, static_cast<BuiltinProbe>(-1))}, kConsts), InvalidProgram);
    EXPECT_NO_THROW(compile({ambient(0, BuiltinProbe::RecursionLimit)}, kConsts));
}

TEST(CompileRejects, NegativeLength) {
    GuardDecl d = on(0, local(A), GuardKind::Length);
    d.n = -1;
    EXPECT_THROW(compile({d}, kConsts), InvalidProgram);
}

TEST(CompileRejects, ErrorsNameTheProblem) {
    try {
        compile({on(0, local(A)), on(0, local(B))}, kConsts);
        FAIL() << "no exception";
    } catch (const InvalidProgram& e) {
        EXPECT_NE(std::string(e.what()).find("duplicate guard id 0"), std::string::npos) << e.what();
    }
    try {
        compile({on(0, local(A), GuardKind::TypeMatch, 99)}, kConsts);
        FAIL() << "no exception";
    } catch (const InvalidProgram& e) {
        EXPECT_NE(std::string(e.what()).find("constant 99"), std::string::npos) << e.what();
    }
    // InvalidProgram is an invalid_argument, so callers can catch the standard type.
    EXPECT_THROW(compile({on(0, local(kConsts))}, kConsts), std::invalid_argument);
}

// -- validate: hand-corrupted programs -----------------------------------------------------------

// A program with a bit of everything: two roots, shared prefixes, a deep chain, ambient guards.
Program sample() {
    return compile(
        {
            on(0, local(A)),
            on(1, local(A, {attr(B)})),
            on(2, local(A, {attr(C)}), GuardKind::Length),
            on(3, local(A, {attr(B), item(C)})),
            ambient(4),
            on(5, local(B, {type_of()})),
            on(6, local(A, {attr(B)}), GuardKind::NotNone),
        },
        kConsts);
}

using Corruption = std::function<void(Program&)>;

void expect_rejected(const char* what, const Corruption& corrupt) {
    Program p = sample();
    ASSERT_NO_THROW(validate(p, kConsts));
    corrupt(p);
    EXPECT_THROW(validate(p, kConsts), InvalidProgram) << what;
}

std::uint32_t index_of(const Program& p, const std::string& text) {
    for (std::uint32_t i = 0; i < p.nodes.size(); ++i) {
        if (p.nodes[i].text == text) return i;
    }
    ADD_FAILURE() << "no node " << text;
    return 0;
}

TEST(Validate, AcceptsCompiledPrograms) {
    const Program p = sample();
    EXPECT_NO_THROW(validate(p, kConsts));
    // A program validated against fewer constants than it uses is rejected.
    EXPECT_THROW(validate(p, 2), InvalidProgram);
}

TEST(Validate, RejectsBadRanges) {
    expect_rejected("guard_end past node_guards", [](Program& p) { p.nodes.back().guard_end = 1000; });
    expect_rejected("guard_begin > guard_end", [](Program& p) {
        Node& n = p.nodes[index_of(p, "L['c0'].c1")];
        n.guard_begin = n.guard_end + 1;
    });
    expect_rejected("child_end past children", [](Program& p) { p.nodes[0].child_end = 1000; });
    expect_rejected("child_begin > child_end",
                    [](Program& p) { p.nodes[0].child_begin = p.nodes[0].child_end + 1; });
    expect_rejected("overlapping guard ranges", [](Program& p) {
        Node& n = p.nodes[index_of(p, "L['c0'].c1")];
        n.guard_end += 1;
    });
    expect_rejected("a guard dropped from its node", [](Program& p) {
        Node& n = p.nodes[index_of(p, "L['c0'].c1")];
        n.guard_end -= 1;
    });
    expect_rejected("a child dropped", [](Program& p) { p.nodes[0].child_end -= 1; });
}

TEST(Validate, RejectsBadIndices) {
    expect_rejected("node guard out of range", [](Program& p) { p.node_guards[0] = 1000; });
    expect_rejected("child out of range", [](Program& p) { p.children[0] = 1000; });
    expect_rejected("root out of range", [](Program& p) { p.roots[0] = 1000; });
    expect_rejected("ambient out of range", [](Program& p) { p.ambient[0] = 1000; });
    expect_rejected("ambient guard with a source", [](Program& p) { p.ambient[0] = p.node_guards[0]; });
    expect_rejected("node guard without a source", [](Program& p) { p.node_guards[0] = p.ambient[0]; });
    expect_rejected("guard listed twice", [](Program& p) { p.node_guards[1] = p.node_guards[0]; });
    expect_rejected("root listed twice", [](Program& p) { p.roots.emplace_back(p.roots[0]); });
    expect_rejected("non-root in roots", [](Program& p) { p.roots[0] = p.children[0]; });
    expect_rejected("root missing from roots", [](Program& p) { p.roots.pop_back(); });
}

TEST(Validate, RejectsBadParents) {
    expect_rejected("wrong parent", [](Program& p) {
        p.nodes[index_of(p, "L['c0'].c1['c2']")].parent = index_of(p, "L['c0'].c2");
    });
    expect_rejected("parent out of range", [](Program& p) { p.nodes[p.children[0]].parent = 1000; });
    expect_rejected("non-root without parent", [](Program& p) { p.nodes[p.children[0]].parent = kNoNode; });
    expect_rejected("root with a parent", [](Program& p) { p.nodes[p.roots[1]].parent = p.roots[0]; });
    expect_rejected("root with a depth", [](Program& p) { p.nodes[p.roots[0]].depth = 1; });
    expect_rejected("child with a wrong depth", [](Program& p) { p.nodes[p.children[0]].depth = 5; });
    expect_rejected("too deep", [](Program& p) { p.nodes[p.children[0]].depth = kMaxSourceDepth + 1; });
    expect_rejected("root demoted to an orphan", [](Program& p) { p.nodes[p.roots[0]].is_root = false; });
}

TEST(Validate, RejectsCycles) {
    // A child link pointing back at an ancestor (or at itself) makes a cycle.
    expect_rejected("child is its own parent", [](Program& p) {
        const std::uint32_t n = index_of(p, "L['c0'].c1");
        p.nodes[n].parent = n;
        p.children[p.nodes[n].child_begin] = n;
    });
    expect_rejected("child points at the root", [](Program& p) {
        const std::uint32_t root = p.roots[0];
        const std::uint32_t n = index_of(p, "L['c0'].c1");
        p.nodes[root].is_root = false;
        p.nodes[root].parent = n;
        p.nodes[root].depth = 2;
        p.children[p.nodes[n].child_begin] = root;
    });
    expect_rejected("parent and child swapped", [](Program& p) {
        // Swap the order of a parent and its child in the children array.
        const std::uint32_t a = index_of(p, "L['c0'].c1"), b = index_of(p, "L['c0'].c1['c2']");
        std::swap(p.nodes[a], p.nodes[b]);
    });
}

TEST(Validate, RejectsBadStepsAndConstants) {
    expect_rejected("step without operand",
                    [](Program& p) { p.nodes[p.children[0]].step.operand = kNoConst; });
    expect_rejected("step operand out of range",
                    [](Program& p) { p.nodes[p.children[0]].step.operand = 99; });
    expect_rejected("unknown step kind", [](Program& p) {
        p.nodes[p.children[0]].step.kind = static_cast<StepKind>(kStepKindCount);
    });
    expect_rejected("root name out of range", [](Program& p) { p.nodes[p.roots[0]].root_name = 99; });
    expect_rejected("guard operand out of range", [](Program& p) { p.guards[0].operand = 99; });
    expect_rejected("unknown guard kind", [](Program& p) { p.guards[0].kind = static_cast<GuardKind>(200); });
    expect_rejected("unknown builtin probe", [](Program& p) { p.guards[p.ambient[0]].n = 7; });
}

TEST(Validate, RejectsDuplicateOrUnsortedIds) {
    expect_rejected("duplicate id", [](Program& p) { p.guards[1].id = p.guards[0].id; });
    expect_rejected("unsorted ids", [](Program& p) { std::swap(p.guards[0].id, p.guards[1].id); });
}

TEST(Validate, RejectsStaleDerivedFacts) {
    expect_rejected("min_guard_id too large", [](Program& p) { p.nodes[p.roots[0]].min_guard_id = 5; });
    expect_rejected("min_guard_id too small",
                    [](Program& p) { p.nodes[index_of(p, "L['c0'].c2")].min_guard_id = 0; });
    expect_rejected("subtree claimed pure", [](Program& p) {
        p.nodes[index_of(p, "L['c0'].c2")].subtree_runs_user_code = false;  // has a LENGTH guard
    });
    expect_rejected("subtree claimed pure above a fetch", [](Program& p) {
        p.nodes[p.roots[0]].subtree_runs_user_code = false;  // attribute fetches below it
    });
    expect_rejected("wrong max_depth", [](Program& p) { p.max_depth = 1; });
}

TEST(Validate, RejectsGuardOnTheWrongNode) {
    expect_rejected("guard moved to a sibling", [](Program& p) {
        // Swap the guards of L['a'].b and L['a'].c (ranges stay valid, sources do not match).
        const Node& b = p.nodes[index_of(p, "L['c0'].c1")];
        const Node& c = p.nodes[index_of(p, "L['c0'].c2")];
        std::swap(p.node_guards[b.guard_begin], p.node_guards[c.guard_begin]);
    });
    expect_rejected("guard's source edited", [](Program& p) {
        for (GuardDecl& d : p.guards) {
            if (d.id == 3) d.source.steps[1] = dict_item(C);
        }
    });
    expect_rejected("guard's root edited", [](Program& p) { p.guards[0].source.root = RootKind::Global; });
}

}  // namespace
}  // namespace tripwire::core
