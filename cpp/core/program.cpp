// tripwire/cpp/core/program.cpp -- building and validating the guard tree.
#include "core/program.hpp"

#include "core/kind_data.hpp"

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <utility>

namespace tripwire::core {
namespace {

[[noreturn]] void fail(const std::string& why) { throw InvalidProgram(why); }

void check_const(ConstId c, std::size_t n_consts, const char* what) {
    if (c != kNoConst && c >= n_consts) {
        fail(std::string(what) + " refers to constant " + std::to_string(c) + " of " +
             std::to_string(n_consts));
    }
}

bool step_has_operand(StepKind k) {
    return k == StepKind::Attr || k == StepKind::Item || k == StepKind::DictItem || k == StepKind::KwDefaults;
}
bool step_has_index(StepKind k) {
    return k == StepKind::Defaults || k == StepKind::ClosureCell || k == StepKind::DictKey ||
           k == StepKind::DictValue;
}

void validate_step(const Step& s, std::size_t n_consts) {
    if (static_cast<int>(s.kind) >= kStepKindCount) fail("unknown step kind");
    if (step_has_operand(s.kind)) {
        if (s.operand == kNoConst) fail(std::string(step_kind_name(s.kind)) + " step needs an operand");
        check_const(s.operand, n_consts, "step");
    } else if (s.operand != kNoConst) {
        fail(std::string(step_kind_name(s.kind)) + " step takes no operand");
    }
    if (step_has_index(s.kind) ? s.index < 0 : s.index != 0) {
        fail(std::string(step_kind_name(s.kind)) + " step has a bad index");
    }
}

void validate_source(const SourcePath& src, std::size_t n_consts) {
    if (static_cast<int>(src.root) > 2) fail("unknown root kind");
    if (src.name == kNoConst) fail("root needs a name");
    check_const(src.name, n_consts, "root");
    if (src.steps.size() > kMaxSourceDepth) {
        fail("source deeper than " + std::to_string(kMaxSourceDepth) + " steps");
    }
    if (src.texts.size() != src.steps.size() + 1) fail("source texts do not match steps");
    for (const Step& s : src.steps) validate_step(s, n_consts);
}

// The source of slot `slot` of a declaration (0: its source; i + 1: more_sources[i]).
const SourcePath& source_at(const GuardDecl& d, std::uint32_t slot) {
    return slot == 0 ? d.source : d.more_sources[slot - 1];
}

// Key identifying a node among its siblings.
using RootKey = std::pair<int, ConstId>;
using StepKey = std::tuple<std::uint32_t, int, ConstId, std::int64_t>;

}  // namespace

void validate_decl(const GuardDecl& d, std::size_t n_consts) {
    if (static_cast<int>(d.kind) >= kGuardKindCount) fail("unknown guard kind");
    const GuardShape shape = guard_shape(d.kind);
    const std::string name(guard_kind_name(d.kind));
    if (d.has_source && !shape.allows_source) fail(name + " takes no source");
    if (!d.has_source && shape.needs_source) fail(name + " needs a source");
    if (d.has_source) validate_source(d.source, n_consts);
    if (is_relational(d.kind)) {
        const std::size_t n = d.more_sources.size();
        if (d.kind == GuardKind::Alias ? n != 1 : (n < 1 || n > kMaxRelationalSources)) {
            fail(name + " has a bad number of sources");
        }
        for (const SourcePath& src : d.more_sources) validate_source(src, n_consts);
    } else if (!d.more_sources.empty()) {
        fail(name + " takes one source");
    }
    if (shape.operand && d.operand == kNoConst) fail(name + " needs an operand");
    if (!shape.operand && d.operand != kNoConst && d.kind != GuardKind::GlobalState) {
        fail(name + " takes no operand");
    }
    if (!shape.operand2 && d.operand2 != kNoConst) fail(name + " takes no operand2");
    if (shape.operand2 && d.operand2 == kNoConst && d.kind != GuardKind::GlobalState)
        fail(name + " needs operand2");
    check_const(d.operand, n_consts, name.c_str());
    check_const(d.operand2, n_consts, name.c_str());
    switch (d.kind) {
        case GuardKind::DictKeys:
            if (d.operand2 == kNoConst) fail("DICT_KEYS needs its key tuple");
            break;
        case GuardKind::Length:
        case GuardKind::TupleIteratorLen:
            if (d.n < 0) fail(name + " needs a non-negative length");
            break;
        case GuardKind::GlobalState:
            if (d.operand == kNoConst) {  // built-in probe
                if (d.n < 0 || d.n >= kBuiltinProbeCount) {
                    fail("unknown built-in probe " + std::to_string(d.n));
                }
                const auto probe = static_cast<BuiltinProbe>(d.n);
                const bool wants_object = probe == BuiltinProbe::TorchFunctionModeStack ||
                                          probe == BuiltinProbe::TorchDefaultDevice;
                if (wants_object != (d.operand2 != kNoConst)) {
                    fail(std::string("built-in probe ") + std::string(builtin_probe_name(probe)) +
                         (wants_object ? " needs its snapshot" : " takes no snapshot object"));
                }
            } else if (d.operand2 == kNoConst) {
                fail("GLOBAL_STATE with a Python probe needs a snapshot");
            }
            break;
        default: break;
    }
    validate_data(d);
}

Program compile(std::vector<GuardDecl> decls, std::size_t n_consts) {
    std::sort(decls.begin(), decls.end(), [](const GuardDecl& a, const GuardDecl& b) { return a.id < b.id; });
    for (std::size_t i = 0; i < decls.size(); ++i) {
        validate_decl(decls[i], n_consts);
        if (i > 0 && decls[i].id == decls[i - 1].id)
            fail("duplicate guard id " + std::to_string(decls[i].id));
    }

    Program p;
    // Intern nodes: first appearance order, so children and guards stay in installation order.
    std::map<RootKey, std::uint32_t> root_index;
    std::map<StepKey, std::uint32_t> step_index;
    std::vector<std::vector<std::uint32_t>> kids;    // per node, child nodes in order
    std::vector<std::vector<std::uint32_t>> guards;  // per node, guard indices in order
    std::vector<std::vector<Member>> members;        // per node, relational operands in order

    auto new_node = [&](Node n) {
        p.nodes.push_back(std::move(n));
        kids.emplace_back();
        guards.emplace_back();
        members.emplace_back();
        return static_cast<std::uint32_t>(p.nodes.size() - 1);
    };
    // The node of a source, created (with its prefixes) on first use.
    auto node_of = [&](const SourcePath& src) {
        RootKey rk{static_cast<int>(src.root), src.name};
        auto it = root_index.find(rk);
        std::uint32_t cur;
        if (it == root_index.end()) {
            Node n;
            n.is_root = true;
            n.root = src.root;
            n.root_name = src.name;
            n.text = src.texts[0];
            cur = new_node(std::move(n));
            root_index.emplace(rk, cur);
            p.roots.push_back(cur);
        } else {
            cur = it->second;
        }
        for (std::size_t si = 0; si < src.steps.size(); ++si) {
            const Step& s = src.steps[si];
            StepKey sk{cur, static_cast<int>(s.kind), s.operand, s.index};
            auto jt = step_index.find(sk);
            if (jt == step_index.end()) {
                Node n;
                n.step = s;
                n.parent = cur;
                n.depth = p.nodes[cur].depth + 1;
                n.text = src.texts[si + 1];
                const std::uint32_t child = new_node(std::move(n));
                kids[cur].push_back(child);
                step_index.emplace(sk, child);
                cur = child;
            } else {
                cur = jt->second;
            }
        }
        return cur;
    };

    for (std::uint32_t gi = 0; gi < decls.size(); ++gi) {
        const GuardDecl& d = decls[gi];
        if (!d.has_source) {
            p.ambient.push_back(gi);
        } else if (is_relational(d.kind)) {
            p.relational.push_back(gi);
            for (std::uint32_t slot = 0; slot <= d.more_sources.size(); ++slot)
                members[node_of(source_at(d, slot))].push_back({gi, slot});
        } else {
            guards[node_of(d.source)].push_back(gi);
        }
    }

    // Flatten into contiguous ranges.
    for (std::uint32_t ni = 0; ni < p.nodes.size(); ++ni) {
        Node& n = p.nodes[ni];
        n.guard_begin = static_cast<std::uint32_t>(p.node_guards.size());
        p.node_guards.insert(p.node_guards.end(), guards[ni].begin(), guards[ni].end());
        n.guard_end = static_cast<std::uint32_t>(p.node_guards.size());
        n.child_begin = static_cast<std::uint32_t>(p.children.size());
        p.children.insert(p.children.end(), kids[ni].begin(), kids[ni].end());
        n.child_end = static_cast<std::uint32_t>(p.children.size());
        n.member_begin = static_cast<std::uint32_t>(p.node_members.size());
        p.node_members.insert(p.node_members.end(), members[ni].begin(), members[ni].end());
        n.member_end = static_cast<std::uint32_t>(p.node_members.size());
        p.max_depth = std::max(p.max_depth, n.depth);
    }
    // Subtree facts, children before parents: nodes are created parent-first, so walk backwards.
    for (std::size_t k = p.nodes.size(); k-- > 0;) {
        Node& n = p.nodes[k];
        std::uint32_t min_id = 0xFFFFFFFFu;
        bool user = false;
        for (std::uint32_t g = n.guard_begin; g < n.guard_end; ++g) {
            const GuardDecl& d = decls[p.node_guards[g]];
            min_id = std::min(min_id, d.id);
            user = user || guard_runs_user_code(d);
        }
        for (std::uint32_t m = n.member_begin; m < n.member_end; ++m)
            min_id = std::min(min_id, decls[p.node_members[m].guard].id);
        for (std::uint32_t c = n.child_begin; c < n.child_end; ++c) {
            const Node& child = p.nodes[p.children[c]];
            min_id = std::min(min_id, child.min_guard_id);
            user = user || child.subtree_runs_user_code || step_runs_user_code(child.step.kind);
        }
        n.min_guard_id = min_id;
        n.subtree_runs_user_code = user;
    }
    p.guards = std::move(decls);
    validate(p, n_consts);
    return p;
}

void validate(const Program& p, std::size_t n_consts) {
    const auto n_nodes = static_cast<std::uint32_t>(p.nodes.size());
    const auto n_guards = static_cast<std::uint32_t>(p.guards.size());
    std::vector<std::uint8_t> guard_seen(n_guards, 0);
    std::vector<std::uint8_t> node_seen(n_nodes, 0);
    for (const GuardDecl& d : p.guards) validate_decl(d, n_consts);
    for (std::uint32_t g : p.ambient) {
        if (g >= n_guards || p.guards[g].has_source) fail("bad ambient guard");
        if (guard_seen[g]++) fail("guard listed twice");
    }
    // Relational guards: listed once, each source slot observed by exactly one node.
    std::vector<std::uint32_t> slot_base(n_guards, 0);
    std::uint32_t n_slots = 0;
    for (std::uint32_t g : p.relational) {
        if (g >= n_guards || !p.guards[g].has_source || !is_relational(p.guards[g].kind)) {
            fail("bad relational guard");
        }
        if (guard_seen[g]++) fail("guard listed twice");
        slot_base[g] = n_slots;
        n_slots += static_cast<std::uint32_t>(p.guards[g].more_sources.size() + 1);
    }
    if (p.node_members.size() != n_slots) fail("relational operands do not match their guards");
    std::vector<std::uint8_t> slot_seen(n_slots, 0);
    for (std::uint32_t r : p.roots) {
        if (r >= n_nodes || !p.nodes[r].is_root) fail("bad root index");
        if (node_seen[r]++) fail("node listed twice");
    }
    for (std::uint32_t ni = 0; ni < n_nodes; ++ni) {
        const Node& n = p.nodes[ni];
        if (n.guard_begin > n.guard_end || n.guard_end > p.node_guards.size()) fail("bad guard range");
        if (n.child_begin > n.child_end || n.child_end > p.children.size()) fail("bad child range");
        if (n.member_begin > n.member_end || n.member_end > p.node_members.size()) fail("bad member range");
        for (std::uint32_t m = n.member_begin; m < n.member_end; ++m) {
            const Member& mb = p.node_members[m];
            if (mb.guard >= n_guards || !is_relational(p.guards[mb.guard].kind) ||
                !p.guards[mb.guard].has_source || mb.slot > p.guards[mb.guard].more_sources.size()) {
                fail("bad relational operand");
            }
            // A relational guard that is not in `relational` has slot_base 0 and is caught
            // below (a guard attached to no list).
            const std::uint32_t at = slot_base[mb.guard] + mb.slot;
            if (at >= n_slots || slot_seen[at]++) fail("relational operand listed twice");
        }
        if (n.depth > kMaxSourceDepth) fail("node too deep");
        if (n.is_root) {
            if (n.parent != kNoNode || n.depth != 0) fail("root with a parent");
            check_const(n.root_name, n_consts, "root");
        } else {
            if (n.parent >= n_nodes) fail("node without a valid parent");
            validate_step(n.step, n_consts);
        }
        for (std::uint32_t g = n.guard_begin; g < n.guard_end; ++g) {
            const std::uint32_t gi = p.node_guards[g];
            if (gi >= n_guards || !p.guards[gi].has_source || is_relational(p.guards[gi].kind)) {
                fail("bad node guard");
            }
            if (guard_seen[gi]++) fail("guard listed twice");
        }
        for (std::uint32_t c = n.child_begin; c < n.child_end; ++c) {
            const std::uint32_t ci = p.children[c];
            // Children come after parents, which also rules out cycles.
            if (ci >= n_nodes || ci <= ni || p.nodes[ci].parent != ni) fail("bad child link");
            if (p.nodes[ci].depth != n.depth + 1) fail("bad child depth");
            if (node_seen[ci]++) fail("node listed twice");
        }
    }
    for (std::uint32_t ni = 0; ni < n_nodes; ++ni) {
        if (!node_seen[ni]) fail("unreachable node");
    }
    for (std::uint8_t s : slot_seen) {
        if (!s) fail("relational operand observed by no node");
    }
    for (std::uint32_t gi = 0; gi < n_guards; ++gi) {
        if (!guard_seen[gi]) fail("guard attached to no node");
        if (gi > 0 && p.guards[gi].id <= p.guards[gi - 1].id) fail("guards not sorted by unique id");
    }
    // Derived facts the runtime trusts (borrowing a value is only safe when nothing below it can run
    // user code; why_not prunes by min_guard_id), and each guard sits on the node of its own source.
    std::uint32_t max_depth = 0;
    for (std::size_t k = n_nodes; k-- > 0;) {
        const Node& n = p.nodes[k];
        max_depth = std::max(max_depth, n.depth);
        std::uint32_t min_id = 0xFFFFFFFFu;
        bool user = false;
        // Whether node k is the node of `src` (walking parents from k).
        auto is_node_of = [&](const SourcePath& src) {
            if (src.steps.size() != n.depth) return false;
            std::uint32_t at = static_cast<std::uint32_t>(k);
            for (std::size_t s = src.steps.size(); s-- > 0; at = p.nodes[at].parent) {
                if (!(p.nodes[at].step == src.steps[s])) return false;
            }
            return p.nodes[at].root == src.root && p.nodes[at].root_name == src.name;
        };
        for (std::uint32_t g = n.guard_begin; g < n.guard_end; ++g) {
            const GuardDecl& d = p.guards[p.node_guards[g]];
            min_id = std::min(min_id, d.id);
            user = user || guard_runs_user_code(d);
            if (!is_node_of(d.source)) fail("guard attached to the wrong node");
        }
        for (std::uint32_t m = n.member_begin; m < n.member_end; ++m) {
            const GuardDecl& d = p.guards[p.node_members[m].guard];
            min_id = std::min(min_id, d.id);
            if (!is_node_of(source_at(d, p.node_members[m].slot)))
                fail("relational operand on the wrong node");
        }
        for (std::uint32_t c = n.child_begin; c < n.child_end; ++c) {
            const Node& child = p.nodes[p.children[c]];
            min_id = std::min(min_id, child.min_guard_id);
            user = user || child.subtree_runs_user_code || step_runs_user_code(child.step.kind);
        }
        if (n.min_guard_id != min_id || n.subtree_runs_user_code != user) fail("stale subtree facts");
    }
    if (p.max_depth != max_depth) fail("bad max depth");
}

}  // namespace tripwire::core
