// tripwire/tests/fuzz/fuzz_program.cpp -- libFuzzer target for the core's tree compiler and validator.
//
// The input bytes decode into a constant-pool size and a list of guard declarations, biased towards
// well-formed ones so that compile() gets past validation often. The rules:
//   - compile() either returns a Program or throws InvalidProgram; any other exception, a crash or a
//     sanitizer report is a bug;
//   - a compiled Program passes validate() and matches an independent oracle: every guard attached
//     exactly once, children after parents, one node per distinct source prefix, guards sorted by
//     id, min_guard_id / subtree_runs_user_code / max_depth as recomputed by brute force, and the
//     same result for the declarations in reverse order;
//   - the rest of the input then corrupts fields of the compiled Program (as a loader of untrusted
//     data might see it); validate() must reject it or the Program must still satisfy the oracle's
//     structural rules, which the runtime relies on for memory safety.
// Built with libFuzzer (TRIPWIRE_FUZZ, scripts/fuzz) or as a plain replay test (replay_main.cpp).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "core/ir.hpp"
#include "core/kind_data.hpp"
#include "core/program.hpp"

namespace tripwire::core {
namespace {

[[noreturn]] void bug(const char* what, const std::string& detail = "") {
    std::fprintf(stderr, "fuzz_program: %s %s\n", what, detail.c_str());
    std::abort();
}
#define CHECK(cond)                                                                      \
    do {                                                                                 \
        if (!(cond)) bug("check failed:", #cond " at line " + std::to_string(__LINE__)); \
    } while (0)

/// Reads the input front to back; past the end every read returns zero.
class Reader {
  public:
    Reader(const std::uint8_t* data, std::size_t size) : p_(data), end_(data + size) {}
    bool empty() const { return p_ == end_; }
    std::uint8_t byte() { return p_ == end_ ? 0 : *p_++; }
    std::uint32_t u16() { return byte() | (std::uint32_t{byte()} << 8); }
    std::uint32_t u32() { return u16() | (u16() << 16); }
    std::int64_t small_signed() { return static_cast<std::int8_t>(byte()); }

  private:
    const std::uint8_t* p_;
    const std::uint8_t* end_;
};

struct Decoder {
    Reader& in;
    std::size_t n_consts;

    // A constant id: usually in range, sometimes kNoConst or just past the pool.
    ConstId cid() {
        const std::uint8_t b = in.byte();
        if (b == 0xFF) return kNoConst;
        if (b == 0xFE) return static_cast<ConstId>(n_consts);
        if (b == 0xFD) return in.u32();
        return n_consts == 0 ? static_cast<ConstId>(b) : static_cast<ConstId>(b % n_consts);
    }

    Step step() {
        Step s;
        const std::uint8_t k = in.byte();
        const bool smart = (k & 0x80) == 0;
        s.kind = static_cast<StepKind>(smart ? (k % kStepKindCount) : (k & 0x7F));
        const bool has_operand = s.kind == StepKind::Attr || s.kind == StepKind::Item ||
                                 s.kind == StepKind::DictItem || s.kind == StepKind::KwDefaults;
        const bool has_index = s.kind == StepKind::Defaults || s.kind == StepKind::ClosureCell ||
                               s.kind == StepKind::DictKey || s.kind == StepKind::DictValue;
        if (smart) {
            s.operand = has_operand ? cid() : kNoConst;
            s.index = has_index ? (in.byte() % 4) : 0;
        } else {
            s.operand = cid();
            s.index = in.small_signed();
        }
        return s;
    }

    SourcePath source() {
        SourcePath src;
        const std::uint8_t b = in.byte();
        src.root = static_cast<RootKind>(b & 0x80 ? (b & 0x7F) : b % 3);
        src.name = cid();
        std::size_t depth = in.byte();
        if (depth == 0xFF) {
            depth = kMaxSourceDepth + (in.byte() % 2);  // at and just past the limit
        } else {
            depth %= 5;
        }
        // Deep sources repeat one step so that they stay cheap to describe in the input.
        for (std::size_t i = 0; i < depth; ++i) src.steps.push_back(i < 6 ? step() : src.steps.back());
        std::string text = "L['" + std::to_string(src.name) + "']";
        src.texts.push_back(text);
        for (const Step& s : src.steps) {
            text += "." + std::string(step_kind_name(s.kind)) + std::to_string(s.operand);
            src.texts.push_back(text);
        }
        const std::uint8_t t = in.byte();
        if (t == 0xFF) src.texts.pop_back();
        if (t == 0xFE) src.texts.emplace_back("extra");
        return src;
    }

    // Per-kind data: the layout of kind_data.hpp in smart mode (ndim 0-2, sizes maybe kAny),
    // a few arbitrary integers otherwise.
    std::vector<std::int64_t> data(GuardKind k, bool smart) {
        std::vector<std::int64_t> d;
        const std::uint8_t b = in.byte();
        auto dim_value = [&] { return in.byte() == 0xFF ? kAny : in.small_signed(); };
        if (!smart || (b & 0x80)) {
            for (int i = 0; i < (b & 7); ++i) d.push_back(in.byte() == 0xFF ? kAny : in.small_signed());
            return d;
        }
        const int ndim = b % 3;
        switch (k) {
            case GuardKind::TensorMatch:
                d = {in.small_signed(), in.byte() % 16, -1, in.byte() & 1, ndim, kAny};
                break;
            case GuardKind::ArrayMatch: d = {ndim, in.byte() % 8, in.byte() & 1}; break;
            case GuardKind::DimensionMarking:
                for (int a = 0; a < marking_data::kAttrCount; ++a) {
                    const int n = static_cast<int>(in.byte() % 4) - 1;
                    d.push_back(n);
                    for (int j = 0; j < n; ++j) d.push_back(in.byte() % 4);
                }
                return d;
            default: return d;
        }
        for (int i = 0; i < ndim; ++i) {
            d.push_back(dim_value());
            d.push_back(dim_value());
        }
        return d;
    }

    GuardDecl decl(std::uint32_t i) {
        GuardDecl d;
        const std::uint8_t k = in.byte();
        const bool smart = (k & 0x80) == 0;
        d.kind = static_cast<GuardKind>(smart ? (k % kGuardKindCount) : (k & 0x7F));
        const GuardShape shape = guard_shape(d.kind);
        const std::uint8_t flags = in.byte();
        d.has_source = smart ? (shape.needs_source || (shape.allows_source && (flags & 1))) : (flags & 1);
        if (d.has_source) d.source = source();
        if (smart) {
            d.operand = shape.operand ? cid() : kNoConst;
            d.operand2 = shape.operand2 ? cid() : kNoConst;
            if (d.kind == GuardKind::GlobalState && (flags & 2)) {
                d.operand = kNoConst;  // built-in probe
                d.operand2 = kNoConst;
            } else if (d.kind == GuardKind::GlobalState && (flags & 4)) {
                d.operand = cid();
            }
        } else {
            d.operand = cid();
            d.operand2 = cid();
        }
        d.n = in.small_signed();
        d.n2 = in.small_signed();
        d.n3 = in.small_signed();
        d.flag = (flags & 8) != 0;
        if (smart && is_relational(d.kind)) {
            const std::size_t n = d.kind == GuardKind::Alias ? 1 : 1 + in.byte() % 3;
            for (std::size_t j = 0; j < n; ++j) d.more_sources.push_back(source());
        } else if (flags & 16) {
            d.more_sources.push_back(source());
        }
        d.data = data(d.kind, smart);
        d.via_python = (flags & 32) != 0;
        // Ids: unique and shuffled in smart mode, anything (duplicates included) otherwise.
        d.id = smart ? ((i * 2654435761u) >> 4) : in.u16();
        return d;
    }
};

// -- the oracle ------------------------------------------------------------------------------------

using PathKey = std::tuple<int, ConstId, std::vector<std::tuple<int, ConstId, std::int64_t>>>;

PathKey path_key(const SourcePath& s, std::size_t len) {
    PathKey k{static_cast<int>(s.root), s.name, {}};
    for (std::size_t i = 0; i < len; ++i) {
        std::get<2>(k).emplace_back(static_cast<int>(s.steps[i].kind), s.steps[i].operand, s.steps[i].index);
    }
    return k;
}

// The path of a node, read by walking parents (the Program must already be structurally sound).
PathKey node_key(const Program& p, std::uint32_t ni) {
    std::vector<std::tuple<int, ConstId, std::int64_t>> steps;
    while (!p.nodes.at(ni).is_root) {
        const Step& s = p.nodes.at(ni).step;
        steps.emplace_back(static_cast<int>(s.kind), s.operand, s.index);
        ni = p.nodes.at(ni).parent;
        CHECK(steps.size() <= kMaxSourceDepth);
    }
    std::reverse(steps.begin(), steps.end());
    return PathKey{static_cast<int>(p.nodes.at(ni).root), p.nodes.at(ni).root_name, steps};
}

// The sources of a guard: its own, then a relational guard's others.
std::vector<const SourcePath*> sources_of(const GuardDecl& d) {
    std::vector<const SourcePath*> out;
    if (!d.has_source) return out;
    out.push_back(&d.source);
    if (is_relational(d.kind)) {
        for (const SourcePath& s : d.more_sources) out.push_back(&s);
    }
    return out;
}

/// Structural rules the runtime's evaluator relies on. Uses checked accesses throughout.
void check_structure(const Program& p) {
    const std::size_t n_nodes = p.nodes.size(), n_guards = p.guards.size();
    std::vector<int> guard_seen(n_guards, 0), node_seen(n_nodes, 0);
    for (std::uint32_t g : p.ambient) {
        CHECK(g < n_guards && !p.guards.at(g).has_source);
        ++guard_seen.at(g);
    }
    std::map<std::pair<std::uint32_t, std::uint32_t>, int> slot_seen;  // (guard, slot) -> count
    for (std::uint32_t g : p.relational) {
        CHECK(g < n_guards && p.guards.at(g).has_source && is_relational(p.guards.at(g).kind));
        ++guard_seen.at(g);
        for (std::uint32_t s = 0; s <= p.guards.at(g).more_sources.size(); ++s) slot_seen[{g, s}] = 0;
    }
    for (std::uint32_t r : p.roots) {
        CHECK(r < n_nodes && p.nodes.at(r).is_root && p.nodes.at(r).depth == 0);
        ++node_seen.at(r);
    }
    std::uint32_t max_depth = 0;
    for (std::size_t ni = 0; ni < n_nodes; ++ni) {
        const Node& n = p.nodes[ni];
        CHECK(n.guard_begin <= n.guard_end && n.guard_end <= p.node_guards.size());
        CHECK(n.child_begin <= n.child_end && n.child_end <= p.children.size());
        CHECK(n.depth <= kMaxSourceDepth);
        max_depth = std::max(max_depth, n.depth);
        for (std::uint32_t g = n.guard_begin; g < n.guard_end; ++g) {
            const std::uint32_t gi = p.node_guards.at(g);
            CHECK(gi < n_guards && p.guards.at(gi).has_source && !is_relational(p.guards.at(gi).kind));
            ++guard_seen.at(gi);
        }
        CHECK(n.member_begin <= n.member_end && n.member_end <= p.node_members.size());
        for (std::uint32_t m = n.member_begin; m < n.member_end; ++m) {
            const Member& mb = p.node_members.at(m);
            auto it = slot_seen.find({mb.guard, mb.slot});
            CHECK(it != slot_seen.end());
            ++it->second;
        }
        for (std::uint32_t c = n.child_begin; c < n.child_end; ++c) {
            const std::uint32_t ci = p.children.at(c);
            CHECK(ci > ni && ci < n_nodes);  // children after parents: no cycles
            CHECK(!p.nodes.at(ci).is_root && p.nodes.at(ci).parent == ni);
            CHECK(p.nodes.at(ci).depth == n.depth + 1);
            ++node_seen.at(ci);
        }
    }
    CHECK(max_depth == p.max_depth);
    for (int s : guard_seen) CHECK(s == 1);                  // every guard attached exactly once
    for (const auto& kv : slot_seen) CHECK(kv.second == 1);  // every relational operand observed once
    for (int s : node_seen) CHECK(s == 1);                   // every node reachable exactly once
    for (std::size_t gi = 1; gi < n_guards; ++gi) CHECK(p.guards[gi - 1].id < p.guards[gi].id);
    // Each guard sits on the node of its source; derived facts match a brute-force recomputation.
    for (std::uint32_t ni = 0; ni < n_nodes; ++ni) {
        const Node& n = p.nodes[ni];
        const PathKey key = node_key(p, ni);
        for (std::uint32_t g = n.guard_begin; g < n.guard_end; ++g) {
            const SourcePath& s = p.guards.at(p.node_guards.at(g)).source;
            CHECK(path_key(s, s.steps.size()) == key);
        }
        for (std::uint32_t m = n.member_begin; m < n.member_end; ++m) {
            const Member& mb = p.node_members.at(m);
            const std::vector<const SourcePath*> srcs = sources_of(p.guards.at(mb.guard));
            CHECK(mb.slot < srcs.size());
            CHECK(path_key(*srcs[mb.slot], srcs[mb.slot]->steps.size()) == key);
        }
        std::uint32_t min_id = 0xFFFFFFFFu;
        bool user = false;
        for (const GuardDecl& d : p.guards) {
            for (const SourcePath* s : sources_of(d)) {
                if (s->steps.size() < n.depth || path_key(*s, n.depth) != key) continue;
                min_id = std::min(min_id, d.id);
                // The guard itself counts where it is attached: at the end of its own source.
                if (!is_relational(d.kind) && s->steps.size() >= n.depth)
                    user = user || guard_runs_user_code(d);
                for (std::size_t i = n.depth; i < s->steps.size(); ++i) {
                    user = user || step_runs_user_code(s->steps[i].kind);
                }
            }
        }
        CHECK(n.min_guard_id == min_id);
        CHECK(n.subtree_runs_user_code == user);
    }
}

bool same_program(const Program& a, const Program& b) {
    if (a.guards.size() != b.guards.size() || a.nodes.size() != b.nodes.size() ||
        a.node_guards != b.node_guards || a.children != b.children || a.roots != b.roots ||
        a.ambient != b.ambient || a.max_depth != b.max_depth || a.node_members != b.node_members ||
        a.relational != b.relational) {
        return false;
    }
    for (std::size_t i = 0; i < a.guards.size(); ++i) {
        if (a.guards[i].id != b.guards[i].id) return false;
    }
    for (std::size_t i = 0; i < a.nodes.size(); ++i) {
        const Node &x = a.nodes[i], &y = b.nodes[i];
        if (x.is_root != y.is_root || x.root != y.root || x.root_name != y.root_name || !(x.step == y.step) ||
            x.parent != y.parent || x.depth != y.depth || x.guard_begin != y.guard_begin ||
            x.guard_end != y.guard_end || x.child_begin != y.child_begin || x.child_end != y.child_end ||
            x.member_begin != y.member_begin || x.member_end != y.member_end ||
            x.min_guard_id != y.min_guard_id || x.subtree_runs_user_code != y.subtree_runs_user_code ||
            x.text != y.text) {
            return false;
        }
    }
    return true;
}

void check_compiled(const Program& p, const std::vector<GuardDecl>& decls, std::size_t n_consts) {
    validate(p, n_consts);  // must not throw
    CHECK(p.guards.size() == decls.size());
    check_structure(p);
    // One node per distinct source prefix.
    std::set<PathKey> prefixes;
    for (const GuardDecl& d : decls) {
        for (const SourcePath* s : sources_of(d)) {
            for (std::size_t len = 0; len <= s->steps.size(); ++len) prefixes.insert(path_key(*s, len));
        }
    }
    CHECK(prefixes.size() == p.nodes.size());
    // Declaration order does not matter (ids do).
    std::vector<GuardDecl> reversed(decls.rbegin(), decls.rend());
    CHECK(same_program(p, compile(reversed, n_consts)));
}

/// Overwrite one field of the Program, chosen by the input.
void corrupt(Program& p, Reader& in) {
    const std::uint8_t what = in.byte();
    const std::uint32_t v = (in.byte() & 1) ? in.u32() : in.byte();
    auto pick = [&](auto& vec) -> decltype(vec.front())& { return vec[in.byte() % vec.size()]; };
    const std::uint8_t field = what % 20;
    if (field >= 16) {
        switch (field) {
            case 16:
                if (!p.node_members.empty()) pick(p.node_members).guard = v;
                break;
            case 17:
                if (!p.node_members.empty()) pick(p.node_members).slot = v;
                break;
            case 18:
                if (p.relational.empty()) {
                    p.relational.push_back(v);
                } else {
                    pick(p.relational) = v;
                }
                break;
            default:
                if (!p.nodes.empty())
                    ((in.byte() & 1) ? pick(p.nodes).member_begin : pick(p.nodes).member_end) = v;
                break;
        }
        return;
    }
    if (field <= 8 || field == 15) {
        if (p.nodes.empty()) return;
        Node& n = pick(p.nodes);
        switch (field) {
            case 0: n.parent = v; break;
            case 1: n.guard_begin = v; break;
            case 2: n.guard_end = v; break;
            case 3: n.child_begin = v; break;
            case 4: n.child_end = v; break;
            case 5: n.depth = v; break;
            case 6: n.is_root = !n.is_root; break;
            case 7: n.min_guard_id = v; break;
            case 8: n.subtree_runs_user_code = !n.subtree_runs_user_code; break;
            default:
                n.step.kind = static_cast<StepKind>(v % 16);
                n.step.operand = (in.byte() & 1) ? kNoConst : v;
                break;
        }
        return;
    }
    switch (field) {
        case 9:
            if (!p.node_guards.empty()) pick(p.node_guards) = v;
            break;
        case 10:
            if (!p.children.empty()) pick(p.children) = v;
            break;
        case 11:
            if (p.roots.empty()) {
                p.roots.push_back(v);
            } else {
                pick(p.roots) = v;
            }
            break;
        case 12:
            if (p.ambient.empty()) {
                p.ambient.push_back(v);
            } else {
                pick(p.ambient) = v;
            }
            break;
        case 13:
            if (!p.guards.empty()) pick(p.guards).id = v;
            break;
        default: p.max_depth = v; break;
    }
}

int test_one_input(const std::uint8_t* data, std::size_t size) {
    Reader in(data, size);
    const std::size_t n_consts = in.byte() % 17;
    const std::size_t n_decls = in.byte() % 24;
    Decoder dec{in, n_consts};
    std::vector<GuardDecl> decls;
    for (std::size_t i = 0; i < n_decls; ++i) decls.push_back(dec.decl(static_cast<std::uint32_t>(i)));

    Program p;
    try {
        p = compile(decls, n_consts);
    } catch (const InvalidProgram&) {
        return 0;  // a declaration broke the rules: expected
    }
    check_compiled(p, decls, n_consts);

    // Corrupt the compiled program a few times; validate() is the gate for untrusted programs.
    while (!in.empty()) {
        const std::uint8_t rounds = 1 + in.byte() % 3;
        Program q = p;
        for (std::uint8_t r = 0; r < rounds; ++r) corrupt(q, in);
        try {
            validate(q, n_consts);
        } catch (const InvalidProgram&) {
            continue;
        }
        check_structure(q);
    }
    return 0;
}

}  // namespace
}  // namespace tripwire::core

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    return tripwire::core::test_one_input(data, size);
}
