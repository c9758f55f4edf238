// tripwire/cpp/core/program.cpp -- building and validating the guard tree.
#include "core/program.hpp"

#include "core/kind_data.hpp"

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>

namespace tripwire::core {

bool step_takes_operand(StepKind k) {
    return k == StepKind::Attr || k == StepKind::Item || k == StepKind::DictItem || k == StepKind::KwDefaults;
}
bool step_takes_index(StepKind k) {
    return k == StepKind::Defaults || k == StepKind::ClosureCell || k == StepKind::DictKey ||
           k == StepKind::DictValue || k == StepKind::Size || k == StepKind::Stride ||
           k == StepKind::TensorSize || k == StepKind::TensorStride;
}

namespace {

[[noreturn]] void fail(const std::string& why) { throw InvalidProgram(why); }

[[noreturn]] void fail_const(ConstId c, std::size_t n_consts, const char* what) {
    fail(std::string(what) + " refers to constant " + std::to_string(c) + " of " + std::to_string(n_consts));
}

inline void check_const(ConstId c, std::size_t n_consts, const char* what) {
    if (c != kNoConst && c >= n_consts) fail_const(c, n_consts, what);
}

void validate_step(const Step& s, std::size_t n_consts) {
    if (static_cast<int>(s.kind) >= kStepKindCount) fail("unknown step kind");
    if (step_takes_operand(s.kind)) {
        if (s.operand == kNoConst) fail(std::string(step_kind_name(s.kind)) + " step needs an operand");
        check_const(s.operand, n_consts, "step");
    } else if (s.operand != kNoConst) {
        fail(std::string(step_kind_name(s.kind)) + " step takes no operand");
    }
    if (step_takes_index(s.kind) ? s.index < 0 : s.index != 0) {
        fail(std::string(step_kind_name(s.kind)) + " step has a bad index");
    }
}

void validate_source(const SourcePath& src, std::size_t n_consts) {
    if (static_cast<int>(src.root) > 2) fail("unknown root kind");
    if (src.name == kNoConst) fail("root needs a name");
    check_const(src.name, n_consts, "root");
    if (src.steps.size() > kMaxSourceDepth) {
        // Named, so that the caller can tell which source to leave out.
        fail("source deeper than " + std::to_string(kMaxSourceDepth) + " steps (" +
             std::to_string(src.steps.size()) + ")" + (src.texts.empty() ? "" : ": " + src.texts.back()));
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

/// validate() without validate_decl on each declaration: the tree, its ranges and derived facts.
void validate_structure(const Program& p, std::size_t n_consts);

/// compile()'s node per distinct SharedPath (by address): add() each path first, then node()
/// is its slot (kNoNode until set). A scan of a few entries while the set has few distinct
/// symbols (no allocation beyond one vector), a hash map past that.
class SharedPathNodes {
  public:
    /// Whether `path` was new (its slot is then kNoNode).
    bool add(const SourcePath* path) {
        if (map_.empty()) {
            for (const auto& [p, node] : few_)
                if (p == path) return false;
            if (few_.size() < kFew) {
                few_.emplace_back(path, kNoNode);
                return true;
            }
            map_.insert(few_.begin(), few_.end());
            few_.clear();
        }
        return map_.emplace(path, kNoNode).second;
    }
    /// The slot of a path add() was given (a reference valid until the next add()).
    std::uint32_t& node(const SourcePath* path) {
        if (!map_.empty()) return map_.at(path);
        for (auto& [p, node] : few_)
            if (p == path) return node;
        throw std::logic_error("compile: a SHAPE symbol's path was not counted");
    }

  private:
    static constexpr std::size_t kFew = 32;
    std::vector<std::pair<const SourcePath*, std::uint32_t>> few_;
    std::unordered_map<const SourcePath*, std::uint32_t> map_;
};
}  // namespace

void validate_decl(const GuardDecl& d, std::size_t n_consts) {
    if (!guard_kind_known(d.kind)) fail("unknown guard kind");
    const GuardShape shape = guard_shape(d.kind);
    // The kind's name only on failure: this runs for every guard at every load (decode, bind,
    // compile, validate), and most names are longer than a small-string buffer.
    auto name = [&d] { return std::string(guard_kind_name(d.kind)); };
    if (d.has_source && !shape.allows_source) fail(name() + " takes no source");
    if (!d.has_source && shape.needs_source) fail(name() + " needs a source");
    if (d.has_source) validate_source(d.source, n_consts);
    if (d.kind == GuardKind::Shape) {
        if (d.relation.empty()) fail("SHAPE needs a relation");
        if (d.symbols.size() != d.symbol_types.size()) fail("SHAPE needs one type per symbol");
        for (const SharedPath& sym : d.symbols) {
            if (sym == nullptr) fail("a SHAPE symbol without a source");
            validate_source(*sym, n_consts);
        }
        for (std::uint8_t t : d.symbol_types) {
            if (t > 1) fail("a SHAPE symbol is an int (0) or a float (1)");
        }
    } else if (!d.relation.empty() || !d.symbols.empty() || !d.symbol_types.empty()) {
        fail(name() + " takes no relation");
    }
    if (is_relational(d.kind)) {
        const std::size_t n = d.more_sources.size();
        if (d.kind == GuardKind::Alias ? n != 1 : (n < 1 || n > kMaxRelationalSources)) {
            fail(name() + " has a bad number of sources");
        }
        // STORAGE_OVERLAPPING: `n` sources (the first ones) overlap; never exactly one.
        if (d.kind == GuardKind::StorageOverlapping &&
            (d.n < 0 || d.n == 1 || d.n > static_cast<std::int64_t>(n + 1))) {
            fail(name() + " has a bad number of overlapping sources");
        }
        for (const SourcePath& src : d.more_sources) validate_source(src, n_consts);
    } else if (!d.more_sources.empty()) {
        fail(name() + " takes one source");
    }
    if (shape.operand && d.operand == kNoConst) fail(name() + " needs an operand");
    if (!shape.operand && d.operand != kNoConst && d.kind != GuardKind::GlobalState) {
        fail(name() + " takes no operand");
    }
    if (!shape.operand2 && d.operand2 != kNoConst) fail(name() + " takes no operand2");
    if (shape.operand2 && d.operand2 == kNoConst && d.kind != GuardKind::GlobalState)
        fail(name() + " needs operand2");
    if ((d.operand != kNoConst && d.operand >= n_consts) ||
        (d.operand2 != kNoConst && d.operand2 >= n_consts)) {
        check_const(d.operand, n_consts, name().c_str());
        check_const(d.operand2, n_consts, name().c_str());
    }
    switch (d.kind) {
        case GuardKind::DictKeys:
            if (d.operand2 == kNoConst) fail("DICT_KEYS needs its key tuple");
            break;
        case GuardKind::Length:
        case GuardKind::TupleIteratorLen:
            if (d.n < 0) fail(name() + " needs a non-negative length");
            break;
        case GuardKind::GlobalState:
            if (d.operand == kNoConst) {  // built-in probe
                if (d.n < 0 || d.n >= kBuiltinProbeCount) {
                    fail("unknown built-in probe " + std::to_string(d.n));
                }
                const auto probe = static_cast<BuiltinProbe>(d.n);
                const bool wants_object = probe == BuiltinProbe::TorchFunctionModeStack ||
                                          probe == BuiltinProbe::TorchDefaultDevice ||
                                          probe == BuiltinProbe::TorchSavedTensorsHooks ||
                                          probe == BuiltinProbe::TorchDualLevel;
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

Program compile(std::vector<GuardDecl> decls, std::size_t n_consts, bool decls_validated) {
    // A loaded set comes sorted (the decoder requires increasing ids): sorting would still move
    // every declaration.
    auto by_id = [](const GuardDecl& a, const GuardDecl& b) { return a.id < b.id; };
    if (!std::is_sorted(decls.begin(), decls.end(), by_id)) std::sort(decls.begin(), decls.end(), by_id);
    for (std::size_t i = 0; i < decls.size(); ++i) {
        if (!decls_validated) validate_decl(decls[i], n_consts);
        if (i > 0 && decls[i].id == decls[i - 1].id)
            fail("duplicate guard id " + std::to_string(decls[i].id));
    }

    Program p;
    // At most one node per root and step of every source: reserved, so that nodes are not moved.
    // A SHAPE symbol's SharedPath counts once however many relations name it (its node is
    // memoised by address: path_nodes, below).
    std::size_t most_nodes = 0;
    std::size_t n_shape = 0;
    std::size_t most_symbols = 0;
    std::size_t n_guards_on_nodes = 0;
    std::size_t n_members = 0;
    SharedPathNodes path_nodes;
    for (const GuardDecl& d : decls) {
        if (d.has_source) most_nodes += d.source.steps.size() + 1;
        for (const SourcePath& m : d.more_sources) most_nodes += m.steps.size() + 1;
        for (const SharedPath& m : d.symbols) {
            if (path_nodes.add(m.get())) most_nodes += m->steps.size() + 1;
        }
        n_shape += d.kind == GuardKind::Shape;
        most_symbols += d.symbols.size();
        if (d.kind != GuardKind::Shape && d.has_source) {
            if (is_relational(d.kind)) {
                n_members += d.more_sources.size() + 1;
            } else {
                ++n_guards_on_nodes;
            }
        }
    }
    p.nodes.reserve(most_nodes);
    // Intern nodes: first appearance order, so children and guards stay in installation order.
    std::map<RootKey, std::uint32_t> root_index;
    std::map<StepKey, std::uint32_t> step_index;
    // The guards and relational operands each node observes, as (node, entry) in installation
    // order: laid out per node by a stable counting pass below (no vector per node).
    std::vector<std::pair<std::uint32_t, std::uint32_t>> node_guards;
    std::vector<std::pair<std::uint32_t, Member>> node_members;
    node_guards.reserve(n_guards_on_nodes);
    node_members.reserve(n_members);

    auto new_node = [&](Node n) {
        p.nodes.push_back(std::move(n));
        return static_cast<std::uint32_t>(p.nodes.size() - 1);
    };

    // The node of a source, created (with its missing prefixes) on first use.
    auto intern_path = [&](const SourcePath& src) {
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
                step_index.emplace(sk, child);
                cur = child;
            } else {
                cur = jt->second;
            }
        }
        return cur;
    };

    // A SHAPE symbol's node by its SharedPath: the declarations of one set share one SourcePath
    // per distinct symbol (bindings' add_shape_decls), so the ~2 uses in 3 of a symbol find its
    // node without walking the interning maps again (the pointer is one path: the same node).
    auto symbol_node = [&](const SharedPath& path) {
        std::uint32_t& node = path_nodes.node(path.get());  // every symbol's path was added above
        if (node == kNoNode) node = intern_path(*path);
        return node;
    };

    // Shape symbols: one per distinct source (so per node), numbered in order of first use.
    std::vector<shape::ValueType> symbol_types;
    std::vector<shape::RelationInput> relations;
    relations.reserve(n_shape);
    p.shape_guards.reserve(n_shape);
    symbol_types.reserve(most_symbols);
    p.symbol_nodes.reserve(most_symbols);
    p.symbol_min_id.reserve(most_symbols);
    for (std::uint32_t gi = 0; gi < decls.size(); ++gi) {
        const GuardDecl& d = decls[gi];
        if (d.kind == GuardKind::Shape) {
            shape::RelationInput rel;
            rel.id = d.id;
            rel.text = d.relation;
            rel.symbols.reserve(d.symbols.size());
            for (std::size_t k = 0; k < d.symbols.size(); ++k) {
                const auto type = static_cast<shape::ValueType>(d.symbol_types[k]);
                const std::uint32_t node = symbol_node(d.symbols[k]);
                std::uint32_t sym = p.nodes[node].symbol;
                if (sym == kNoSymbol) {
                    sym = static_cast<std::uint32_t>(symbol_types.size());
                    symbol_types.push_back(type);
                    p.nodes[node].symbol = sym;
                    p.symbol_nodes.push_back(node);
                    p.symbol_min_id.push_back(d.id);
                } else if (symbol_types[sym] != type) {
                    fail("symbol " + d.symbols[k]->texts.back() + " is declared both an int and a float");
                }
                rel.symbols.push_back(sym);
            }
            relations.push_back(std::move(rel));
            p.shape_guards.push_back(gi);
            continue;
        }
        if (!d.has_source) {
            p.ambient.push_back(gi);
        } else if (is_relational(d.kind)) {
            p.relational.push_back(gi);
            for (std::uint32_t slot = 0; slot <= d.more_sources.size(); ++slot)
                node_members.emplace_back(intern_path(source_at(d, slot)), Member{gi, slot});
        } else {
            node_guards.emplace_back(intern_path(d.source), gi);
        }
    }
    try {
        p.shape = shape::compile_relations(std::move(relations), std::move(symbol_types));
    } catch (const shape::ShapeSyntaxError&) {
        throw;  // the caller reports text errors with their offset
    } catch (const std::invalid_argument& e) {
        fail(e.what());
    }

    // Flatten into contiguous ranges: per node, its guards, children and relational operands in
    // the order they were attached (a stable counting pass; each range's end counts, then fills).
    const auto n_nodes = static_cast<std::uint32_t>(p.nodes.size());
    for (const auto& [node, gi] : node_guards) ++p.nodes[node].guard_end;
    for (std::uint32_t ni = 0; ni < n_nodes; ++ni) {
        if (!p.nodes[ni].is_root) ++p.nodes[p.nodes[ni].parent].child_end;
    }
    for (const auto& [node, m] : node_members) ++p.nodes[node].member_end;
    std::uint32_t guards_at = 0;
    std::uint32_t children_at = 0;
    std::uint32_t members_at = 0;
    for (Node& n : p.nodes) {
        n.guard_begin = guards_at;
        guards_at += std::exchange(n.guard_end, guards_at);
        n.child_begin = children_at;
        children_at += std::exchange(n.child_end, children_at);
        n.member_begin = members_at;
        members_at += std::exchange(n.member_end, members_at);
    }
    p.node_guards.resize(guards_at);
    p.children.resize(children_at);  // every node but a root is one child
    p.node_members.resize(members_at);
    for (const auto& [node, gi] : node_guards) p.node_guards[p.nodes[node].guard_end++] = gi;
    for (std::uint32_t ni = 0; ni < n_nodes; ++ni) {
        if (!p.nodes[ni].is_root) p.children[p.nodes[p.nodes[ni].parent].child_end++] = ni;
    }
    for (const auto& [node, m] : node_members) p.node_members[p.nodes[node].member_end++] = m;
    for (const Node& n : p.nodes) {
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
        if (n.symbol != kNoSymbol) min_id = std::min(min_id, p.symbol_min_id[n.symbol]);
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
    validate_structure(p, n_consts);  // the declarations were validated above, unchanged since
    return p;
}

void validate(const Program& p, std::size_t n_consts) {
    for (const GuardDecl& d : p.guards) validate_decl(d, n_consts);
    validate_structure(p, n_consts);
}

namespace {

void validate_structure(const Program& p, std::size_t n_consts) {
    const auto n_nodes = static_cast<std::uint32_t>(p.nodes.size());
    const auto n_guards = static_cast<std::uint32_t>(p.guards.size());
    std::vector<std::uint8_t> guard_seen(n_guards, 0);
    std::vector<std::uint8_t> node_seen(n_nodes, 0);
    for (std::uint32_t g : p.ambient) {
        if (g >= n_guards || p.guards[g].has_source || p.guards[g].kind == GuardKind::Shape)
            fail("bad ambient guard");
        if (guard_seen[g]++) fail("guard listed twice");
    }
    // Shape: the program, its relations one per SHAPE guard (same ids, same order), each
    // symbol on the node of its own source, and the symbols' smallest relation ids.
    validate_shape(p.shape);
    const std::size_t n_sym = p.shape.n_symbols();
    if (p.shape_guards.size() != p.shape.relations.size()) fail("shape relations do not match SHAPE guards");
    if (p.symbol_nodes.size() != n_sym || p.symbol_min_id.size() != n_sym) fail("bad shape symbol table");
    std::vector<std::uint32_t> min_ids(n_sym, 0xFFFFFFFFu);
    for (std::size_t k = 0; k < p.shape_guards.size(); ++k) {
        const std::uint32_t g = p.shape_guards[k];
        if (g >= n_guards || p.guards[g].kind != GuardKind::Shape) fail("bad shape guard");
        if (guard_seen[g]++) fail("guard listed twice");
        const GuardDecl& d = p.guards[g];
        const shape::ShapeRelation& rel = p.shape.relations[k];
        if (rel.id != d.id || rel.symbols.size() != d.symbols.size())
            fail("shape relation does not match its guard");
        for (std::size_t j = 0; j < rel.symbols.size(); ++j) {
            const std::uint32_t sym = rel.symbols[j];
            if (sym >= n_sym || p.symbol_nodes[sym] >= n_nodes) fail("bad shape symbol");
            if (static_cast<std::uint8_t>(p.shape.symbol_types[sym]) != d.symbol_types[j])
                fail("shape symbol type mismatch");
            min_ids[sym] = std::min(min_ids[sym], d.id);
            // The symbol's node is the symbol's source.
            std::uint32_t at = p.symbol_nodes[sym];
            const SourcePath& src = *d.symbols[j];
            if (p.nodes[at].depth != src.steps.size()) fail("shape symbol on the wrong node");
            for (std::size_t s = src.steps.size(); s-- > 0; at = p.nodes[at].parent) {
                if (at >= n_nodes || !(p.nodes[at].step == src.steps[s]))
                    fail("shape symbol on the wrong node");
            }
            if (at >= n_nodes || !p.nodes[at].is_root || p.nodes[at].root != src.root ||
                p.nodes[at].root_name != src.name)
                fail("shape symbol on the wrong node");
        }
    }
    for (std::uint32_t s = 0; s < n_sym; ++s) {
        if (p.symbol_min_id[s] != min_ids[s]) fail("stale shape symbol facts");
        if (p.nodes[p.symbol_nodes[s]].symbol != s) fail("shape symbol node mismatch");
    }
    for (std::uint32_t ni = 0; ni < n_nodes; ++ni) {
        const std::uint32_t sym = p.nodes[ni].symbol;
        if (sym != kNoSymbol && (sym >= n_sym || p.symbol_nodes[sym] != ni)) fail("bad node symbol");
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
        if (n.parent != kNoNode && n.parent >= ni) fail("node before its parent");
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
        if (n.symbol != kNoSymbol) min_id = std::min(min_id, p.symbol_min_id[n.symbol]);
        for (std::uint32_t c = n.child_begin; c < n.child_end; ++c) {
            const Node& child = p.nodes[p.children[c]];
            min_id = std::min(min_id, child.min_guard_id);
            user = user || child.subtree_runs_user_code || step_runs_user_code(child.step.kind);
        }
        if (n.min_guard_id != min_id || n.subtree_runs_user_code != user) fail("stale subtree facts");
    }
    if (p.max_depth != max_depth) fail("bad max depth");
}

}  // namespace
}  // namespace tripwire::core

namespace tripwire::core {

void validate_shape(const shape::ShapeProgram& p) {
    using shape::Code;
    const std::size_t n = p.nodes.size();
    const std::size_t n_sym = p.n_symbols();
    if (n < n_sym || p.const_regs.size() < n_sym || p.const_regs.size() > n)
        fail("bad shape register layout");
    for (std::size_t k = 0; k < n; ++k) {
        const shape::ShapeNode& node = p.nodes[k];
        if (static_cast<int>(node.type) > 2) fail("bad shape value type");
        if (k < n_sym) {
            if (node.code != Code::Symbol || node.a != k || node.type != p.symbol_types[k])
                fail("bad shape symbol node");
            continue;
        }
        if (k < p.const_regs.size()) {
            if (node.code != Code::Const) fail("bad shape constant node");
            continue;
        }
        if (node.code == Code::Symbol || node.code == Code::Const || node.code == Code::Check ||
            static_cast<int>(node.code) > static_cast<int>(Code::Check))
            fail("bad shape operation");
        // Operands come first: evaluation in index order sees each operand computed.
        if (node.a >= k || node.b >= k || node.c >= k) fail("shape operand after its user");
    }
    for (const auto& [at, value] : p.big_consts) {
        (void)value;
        if (at < n_sym || at >= p.const_regs.size() || p.nodes[at].type != shape::ValueType::Int)
            fail("bad big constant");
    }
    if (!p.big_consts.empty() && p.fast_ok) fail("a program with big constants has no fast path");
    for (std::size_t k = 1; k < p.big_consts.size(); ++k) {
        if (p.big_consts[k].first <= p.big_consts[k - 1].first) fail("big constants out of order");
    }
    std::vector<std::uint8_t> computed(n, 0);
    for (std::size_t k = 0; k < p.const_regs.size(); ++k) computed[k] = 1;
    for (const shape::ShapeInstr& in : p.code) {
        if (in.code == Code::Check) {
            if (in.a >= n || !computed[in.a] || in.c >= p.relations.size()) fail("bad shape check");
            continue;
        }
        if (in.dst >= n || in.dst < p.const_regs.size() || computed[in.dst]) fail("bad shape instruction");
        const shape::ShapeNode& node = p.nodes[in.dst];
        if (in.code != node.code || in.a != node.a || in.b != node.b || in.c != node.c)
            fail("bad shape instruction");
        if (!computed[node.a] || !computed[node.b] || !computed[node.c])
            fail("shape instruction before its operands");
        computed[in.dst] = 1;
    }
    std::uint32_t prev = 0;
    for (std::size_t k = 0; k < p.kept.size(); ++k) {
        const std::uint32_t r = p.kept[k];
        if (r >= p.relations.size() || (k > 0 && r <= prev)) fail("bad kept relation");
        prev = r;
        const shape::ShapeRelation& rel = p.relations[r];
        if (rel.status != shape::RelationStatus::Kept || rel.root >= n ||
            p.nodes[rel.root].type != shape::ValueType::Bool)
            fail("bad kept relation");
    }
    for (std::size_t r = 0; r < p.relations.size(); ++r) {
        const shape::ShapeRelation& rel = p.relations[r];
        if (r > 0 && rel.id <= p.relations[r - 1].id) fail("shape relations not sorted by unique id");
        if (static_cast<int>(rel.status) > 2) fail("bad relation status");
        for (std::uint32_t s : rel.symbols) {
            if (s >= n_sym) fail("bad relation symbol");
        }
    }
    std::size_t n_kept = 0;
    for (const shape::ShapeRelation& rel : p.relations) n_kept += rel.status == shape::RelationStatus::Kept;
    if (n_kept != p.kept.size()) fail("kept relations do not match");
}

}  // namespace tripwire::core
