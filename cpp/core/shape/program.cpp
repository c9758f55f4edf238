// tripwire/cpp/core/shape/program.cpp -- compiling shape relations and running them.
#include "core/shape/program.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <unordered_map>

#include "core/shape/arith.hpp"
#include "core/shape/exact.hpp"

namespace tripwire::core::shape {
namespace {

int arity(Code code) {
    switch (code) {
        case Code::Symbol:
        case Code::Const: return 0;
        case Code::INeg:
        case Code::IAbs:
        case Code::FNeg:
        case Code::FAbs:
        case Code::IToF:
        case Code::FTrunc:
        case Code::FFloor:
        case Code::FCeil:
        case Code::FRound:
        case Code::FIsNan:
        case Code::Not: return 1;
        case Code::Select: return 3;
        default: return 2;
    }
}

bool commutative(Code code) {
    switch (code) {
        // Exact for ints; IEEE + and * are commutative, and == / != are symmetric. Not min/max of
        // floats (max(nan, 1.0) is nan, max(1.0, nan) is 1.0), nor and/or (short-circuit order).
        case Code::IAdd:
        case Code::IMul:
        case Code::IMin:
        case Code::IMax:
        case Code::FAdd:
        case Code::FMul:
        case Code::IEq:
        case Code::INe:
        case Code::FEq:
        case Code::FNe:
        case Code::BEq:
        case Code::BNe: return true;
        default: return false;
    }
}

// A constant's value, compactly (no allocation unless it is an int beyond int64).
struct ConstInfo {
    bool is_const = false;
    ValueType type = ValueType::Int;
    std::int64_t bits = 0;  ///< an int64, a bool (0/1), or a double's bits
    std::int32_t big = -1;  ///< index into Compiler::bigs_ for an int beyond int64
};

// Key of a node for sharing equal sub-expressions: the operation, its type, its operands and, for
// a constant, its value's bits.
struct NodeKey {
    std::uint8_t code = 0, type = 0;
    std::uint32_t a = 0, b = 0, c = 0;
    std::int64_t bits = 0;
    bool operator==(const NodeKey& o) const {
        return code == o.code && type == o.type && a == o.a && b == o.b && c == o.c && bits == o.bits;
    }
    std::uint64_t hash() const {
        std::uint64_t h = 1469598103934665603ULL;
        for (std::uint64_t x : {std::uint64_t{code} | (std::uint64_t{type} << 8), std::uint64_t{a},
                                std::uint64_t{b}, std::uint64_t{c}, static_cast<std::uint64_t>(bits)}) {
            h ^= x;
            h *= 1099511628211ULL;
            h ^= h >> 29;
        }
        return h;
    }
};

// Open addressing (linear probing) over one vector: interning allocates only when it grows.
class NodeTable {
  public:
    NodeTable() : slots_(64) {}
    // The node stored under `k`, or kNone.
    static constexpr std::uint32_t kNone = 0xFFFFFFFFu;
    std::uint32_t find(const NodeKey& k) const {
        for (std::size_t i = k.hash() & (slots_.size() - 1);; i = (i + 1) & (slots_.size() - 1)) {
            const Slot& s = slots_[i];
            if (s.node == kNone) return kNone;
            if (s.key == k) return s.node;
        }
    }
    void insert(const NodeKey& k, std::uint32_t node) {
        if (2 * (used_ + 1) > slots_.size()) grow();
        place(k, node);
        ++used_;
    }
    // The node stored under `k`, or kNone with `slot` the empty slot where `k` goes: a miss is
    // then inserted there (insert_at) without hashing and probing again.
    std::uint32_t find(const NodeKey& k, std::size_t& slot) const {
        for (std::size_t i = k.hash() & (slots_.size() - 1);; i = (i + 1) & (slots_.size() - 1)) {
            const Slot& s = slots_[i];
            if (s.node == kNone) {
                slot = i;
                return kNone;
            }
            if (s.key == k) return s.node;
        }
    }
    // insert(k, node) after find(k, slot) missed, with nothing inserted in between.
    void insert_at(std::size_t slot, const NodeKey& k, std::uint32_t node) {
        if (2 * (used_ + 1) > slots_.size()) {
            insert(k, node);  // grows: the slot moves
            return;
        }
        slots_[slot] = {k, node};
        ++used_;
    }

  private:
    struct Slot {
        NodeKey key;
        std::uint32_t node = kNone;
    };
    void place(const NodeKey& k, std::uint32_t node) {
        std::size_t i = k.hash() & (slots_.size() - 1);
        while (slots_[i].node != kNone) i = (i + 1) & (slots_.size() - 1);
        slots_[i] = {k, node};
    }
    void grow() {
        std::vector<Slot> old(slots_.size() * 2);
        old.swap(slots_);
        for (const Slot& s : old)
            if (s.node != kNone) place(s.key, s.node);
    }
    std::vector<Slot> slots_;
    std::size_t used_ = 0;
};

class Compiler {
  public:
    explicit Compiler(ShapeProgram& p) : p_(p) { add_symbols(); }

    void add_symbols() {
        for (std::uint32_t s = 0; s < p_.symbol_types.size(); ++s) {
            ShapeNode n;
            n.code = Code::Symbol;
            n.type = p_.symbol_types[s];
            n.a = s;
            p_.nodes.push_back(n);
            consts_.emplace_back();
        }
    }

    ValueType type(std::uint32_t n) const { return p_.nodes[n].type; }
    const ConstInfo& const_info(std::uint32_t n) const { return consts_[n]; }
    const BigInt& big(std::int32_t k) const { return bigs_[static_cast<std::size_t>(k)]; }

    // A constant node (shared with any equal constant: ints and bools by value, floats by bits,
    // so -0.0 and 0.0 stay apart).
    std::uint32_t constant(ValueType t, std::int64_t bits, const BigInt* big_value = nullptr) {
        ConstInfo info;
        info.is_const = true;
        info.type = t;
        info.bits = bits;
        NodeKey key;
        key.code = static_cast<std::uint8_t>(Code::Const);
        key.type = static_cast<std::uint8_t>(t);
        key.bits = bits;
        std::size_t slot = 0;  // where a new key goes (table_.find)
        if (big_value != nullptr) {
            // Ints beyond int64 are rare: found by value among the others.
            for (std::size_t k = 0; k < bigs_.size(); ++k)
                if (bigs_[k] == *big_value) return big_nodes_[k];
            info.big = static_cast<std::int32_t>(bigs_.size());
            bigs_.push_back(*big_value);
        } else {
            const std::uint32_t found = table_.find(key, slot);
            if (found != NodeTable::kNone) return found;
        }
        ShapeNode n;
        n.code = Code::Const;
        n.type = t;
        p_.nodes.push_back(n);
        consts_.push_back(info);
        const auto id = static_cast<std::uint32_t>(p_.nodes.size() - 1);
        if (big_value != nullptr) {
            big_nodes_.push_back(id);
        } else {
            table_.insert_at(slot, key, id);
        }
        return id;
    }

    std::uint32_t constant(const ExactValue& v) {
        if (v.type == ValueType::Int) {
            std::int64_t small = 0;
            return v.i.to_int64(small) ? constant(ValueType::Int, small) : constant(ValueType::Int, 0, &v.i);
        }
        if (v.type == ValueType::Float) {
            std::int64_t bits = 0;
            std::memcpy(&bits, &v.f, sizeof bits);
            return constant(ValueType::Float, bits);
        }
        return constant(ValueType::Bool, v.b ? 1 : 0);
    }

    // The exact value of a constant node (for folding).
    ExactValue exact(std::uint32_t n) const {
        const ConstInfo& c = consts_[n];
        if (c.type == ValueType::Int) return ExactValue::of_int(c.big >= 0 ? big(c.big) : BigInt(c.bits));
        if (c.type == ValueType::Float) {
            double f = 0;
            std::memcpy(&f, &c.bits, sizeof f);
            return ExactValue::of_float(f);
        }
        return ExactValue::of_bool(c.bits != 0);
    }

    std::uint32_t make(Code code, ValueType t, std::uint32_t a, std::uint32_t b = 0, std::uint32_t c = 0) {
        // Canonical operand order: `a > b` is `b < a`, commutative operands sorted.
        switch (code) {
            case Code::IGt: code = Code::ILt, std::swap(a, b); break;
            case Code::IGe: code = Code::ILe, std::swap(a, b); break;
            case Code::FGt: code = Code::FLt, std::swap(a, b); break;
            case Code::FGe: code = Code::FLe, std::swap(a, b); break;
            default: break;
        }
        if (commutative(code) && b < a) std::swap(a, b);
        const int n_ops = arity(code);
        const std::uint32_t ops[3] = {a, b, c};
        bool all_const = true;
        for (int k = 0; k < n_ops; ++k) all_const = all_const && consts_[ops[k]].is_const;
        if (all_const) {
            // Fold, unless Python would raise: then the relation keeps the operation and fails
            // when evaluated, exactly as at run time.
            ExactValue v[3];
            for (int k = 0; k < n_ops; ++k) v[k] = exact(ops[k]);
            const ExactValue r =
                apply(code, &v[0], n_ops >= 2 ? &v[1] : nullptr, n_ops >= 3 ? &v[2] : nullptr);
            if (!r.is_error) return constant(r);
        }
        NodeKey key;
        key.code = static_cast<std::uint8_t>(code);
        key.type = static_cast<std::uint8_t>(t);
        key.a = a;
        key.b = b;
        key.c = c;
        std::size_t slot = 0;
        const std::uint32_t found = table_.find(key, slot);
        if (found != NodeTable::kNone) return found;
        ShapeNode n;
        n.code = code;
        n.type = t;
        n.a = a;
        n.b = b;
        n.c = c;
        p_.nodes.push_back(n);
        consts_.emplace_back();
        const auto id = static_cast<std::uint32_t>(p_.nodes.size() - 1);
        table_.insert_at(slot, key, id);
        return id;
    }

    std::uint32_t as_float(std::uint32_t n) {
        return type(n) == ValueType::Float ? n : make(Code::IToF, ValueType::Float, n);
    }

    // The typed DAG of one parsed relation; its root.
    std::uint32_t lower(const ParsedRelation& r, const std::vector<std::uint32_t>& symbols) {
        std::vector<std::uint32_t>& dag = dag_;
        dag.assign(r.nodes.size(), 0);
        // Children precede parents in the parse tree: one pass, no recursion.
        for (std::size_t k = 0; k < r.nodes.size(); ++k) dag[k] = lower_node(r, r.nodes[k], dag, symbols);
        const std::uint32_t root = dag[r.root];
        if (type(root) != ValueType::Bool) {
            throw ShapeSyntaxError(r.nodes[r.root].offset,
                                   std::string("a relation must be a comparison or a logical combination of "
                                               "comparisons; this is an ") +
                                       (type(root) == ValueType::Int ? "int" : "float") + " expression");
        }
        return root;
    }

  private:
    [[noreturn]] static void type_error(const AstNode& n, const std::string& why) {
        throw ShapeSyntaxError(n.offset, why);
    }

    static const char* tname(ValueType t) {
        return t == ValueType::Int ? "an int" : t == ValueType::Float ? "a float" : "a comparison (a bool)";
    }

    std::uint32_t lower_node(const ParsedRelation& r, const AstNode& n, const std::vector<std::uint32_t>& dag,
                             const std::vector<std::uint32_t>& symbols) {
        auto arg = [&](std::size_t k) { return dag[n.args[k]]; };
        auto number = [&](std::uint32_t x) {
            if (type(x) == ValueType::Bool) {
                type_error(n, std::string("'") + std::string(op_name(n.op)) + "' takes numbers, not " +
                                  tname(ValueType::Bool));
            }
            return x;
        };
        auto logical = [&](std::uint32_t x) {
            if (type(x) != ValueType::Bool) {
                type_error(n, std::string("'") + std::string(op_name(n.op)) + "' takes comparisons, not " +
                                  tname(type(x)));
            }
            return x;
        };
        switch (n.op) {
            case Op::IntConst:
                if (n.big_int == 0) return constant(ValueType::Int, n.int_small);
                if (r.big_ints[n.big_int - 1].bit_length() > kMaxIntBits)
                    type_error(n, "int literal over " + std::to_string(kMaxIntBits) + " bits");
                return constant(ValueType::Int, 0, &r.big_ints[n.big_int - 1]);
            case Op::FloatConst: return constant(ExactValue::of_float(n.float_value));
            case Op::BoolConst: return constant(ValueType::Bool, n.bool_value ? 1 : 0);
            case Op::Symbol:
                if (n.symbol >= symbols.size()) type_error(n, "symbol without a binding");
                return symbols[n.symbol];
            case Op::Neg: {
                const std::uint32_t a = number(arg(0));
                return type(a) == ValueType::Int ? make(Code::INeg, ValueType::Int, a)
                                                 : make(Code::FNeg, ValueType::Float, a);
            }
            case Op::Abs: {
                const std::uint32_t a = number(arg(0));
                return type(a) == ValueType::Int ? make(Code::IAbs, ValueType::Int, a)
                                                 : make(Code::FAbs, ValueType::Float, a);
            }
            case Op::Add:
            case Op::Sub:
            case Op::Mul:
            case Op::FloorDiv:
            case Op::Mod: {
                const std::uint32_t a = number(arg(0)), b = number(arg(1));
                const Code ic = n.op == Op::Add        ? Code::IAdd
                                : n.op == Op::Sub      ? Code::ISub
                                : n.op == Op::Mul      ? Code::IMul
                                : n.op == Op::FloorDiv ? Code::IFloorDiv
                                                       : Code::IMod;
                const Code fc = n.op == Op::Add        ? Code::FAdd
                                : n.op == Op::Sub      ? Code::FSub
                                : n.op == Op::Mul      ? Code::FMul
                                : n.op == Op::FloorDiv ? Code::FFloorDiv
                                                       : Code::FMod;
                if (type(a) == ValueType::Int && type(b) == ValueType::Int)
                    return make(ic, ValueType::Int, a, b);
                const std::uint32_t fa = as_float(a);
                return make(fc, ValueType::Float, fa, as_float(b));
            }
            case Op::TrueDiv: {
                const std::uint32_t a = number(arg(0)), b = number(arg(1));
                if (type(a) == ValueType::Int && type(b) == ValueType::Int)
                    return make(Code::IDiv, ValueType::Float, a, b);
                if (n.bool_value) type_error(n, "IntTrueDiv takes ints");
                const std::uint32_t fa = as_float(a);
                return make(Code::FDiv, ValueType::Float, fa, as_float(b));
            }
            case Op::Pow: {
                const std::uint32_t a = number(arg(0)), b = number(arg(1));
                if (type(a) != ValueType::Int || type(b) != ValueType::Int)
                    type_error(n, "'**' takes ints (a natural power); float powers are not supported");
                return make(Code::IPow, ValueType::Int, a, b);
            }
            case Op::Min:
            case Op::Max: {
                const std::uint32_t a = number(arg(0)), b = number(arg(1));
                if (type(a) != type(b)) {
                    type_error(n, std::string(op_name(n.op)) +
                                      "() of an int and a float is not supported "
                                      "(Python's result type would depend on the values)");
                }
                const bool is_int = type(a) == ValueType::Int;
                const Code code =
                    n.op == Op::Min ? (is_int ? Code::IMin : Code::FMin) : (is_int ? Code::IMax : Code::FMax);
                return make(code, type(a), a, b);
            }
            case Op::ToFloat: return as_float(number(arg(0)));
            case Op::Trunc:
            case Op::Floor:
            case Op::Ceil:
            case Op::Round: {
                const std::uint32_t a = number(arg(0));
                if (type(a) == ValueType::Int) return a;  // math.floor(int) is the int itself
                const Code code = n.op == Op::Trunc   ? Code::FTrunc
                                  : n.op == Op::Floor ? Code::FFloor
                                  : n.op == Op::Ceil  ? Code::FCeil
                                                      : Code::FRound;
                return make(code, ValueType::Int, a);
            }
            case Op::IsNan: return make(Code::FIsNan, ValueType::Bool, as_float(number(arg(0))));
            case Op::Eq:
            case Op::Ne:
            case Op::Lt:
            case Op::Le:
            case Op::Gt:
            case Op::Ge: return comparison(n, arg(0), arg(1));
            case Op::And:
            case Op::Or: {
                const std::uint32_t a = logical(arg(0)), b = logical(arg(1));
                return make(n.op == Op::And ? Code::And : Code::Or, ValueType::Bool, a, b);
            }
            case Op::Not: return make(Code::Not, ValueType::Bool, logical(arg(0)));
            case Op::Select: {
                const std::uint32_t cond = logical(arg(0)), a = arg(1), b = arg(2);
                if (type(a) != type(b)) {
                    type_error(n, std::string("the branches of 'if-else' are ") + tname(type(a)) + " and " +
                                      tname(type(b)));
                }
                return make(Code::Select, type(a), a, b, cond);
            }
        }
        type_error(n, "unsupported operation");
    }

    std::uint32_t comparison(const AstNode& n, std::uint32_t a, std::uint32_t b) {
        const ValueType ta = type(a), tb = type(b);
        const int k = static_cast<int>(n.op) - static_cast<int>(Op::Eq);  // Eq Ne Lt Le Gt Ge
        if (ta == ValueType::Bool || tb == ValueType::Bool) {
            if (ta != tb) type_error(n, std::string("cannot compare ") + tname(ta) + " with " + tname(tb));
            if (n.op != Op::Eq && n.op != Op::Ne) type_error(n, "comparisons of bools are == and != only");
            return make(n.op == Op::Eq ? Code::BEq : Code::BNe, ValueType::Bool, a, b);
        }
        static const Code int_codes[] = {Code::IEq, Code::INe, Code::ILt, Code::ILe, Code::IGt, Code::IGe};
        static const Code float_codes[] = {Code::FEq, Code::FNe, Code::FLt, Code::FLe, Code::FGt, Code::FGe};
        static const Code mixed_codes[] = {Code::MEq, Code::MNe, Code::MLt, Code::MLe, Code::MGt, Code::MGe};
        // Mirror of each comparison when its operands swap places.
        static const int mirrored[] = {0, 1, 4, 5, 2, 3};
        if (ta == ValueType::Int && tb == ValueType::Int) return make(int_codes[k], ValueType::Bool, a, b);
        if (ta == ValueType::Float && tb == ValueType::Float)
            return make(float_codes[k], ValueType::Bool, a, b);
        // An int and a float compare exactly (Python never rounds the int): the int goes first.
        if (ta == ValueType::Int) return make(mixed_codes[k], ValueType::Bool, a, b);
        return make(mixed_codes[mirrored[k]], ValueType::Bool, b, a);
    }

    ShapeProgram& p_;
    std::vector<std::uint32_t> dag_;  // lower(): parse node -> DAG node (kept for its capacity)
    NodeTable table_;
    std::vector<ConstInfo> consts_;  // per node
    std::vector<BigInt> bigs_;       // constants beyond int64
    std::vector<std::uint32_t> big_nodes_;
};

// A bound on one int symbol implied by a relation: lower <= s <= upper.
struct Bound {
    std::uint32_t symbol = 0;
    std::optional<std::int64_t> lower, upper;
};

// The bounds a relation is made of, in `out`, when it is a conjunction of comparisons of one int
// symbol with an int64 constant; false otherwise. `out` and `todo` are the caller's scratch
// (emptied here; kept for their capacity across relations).
bool bounds_of(const ShapeProgram& p, const Compiler& comp, std::uint32_t root, std::vector<Bound>& out,
               std::vector<std::uint32_t>& todo) {
    out.clear();
    todo.assign(1, root);
    while (!todo.empty()) {
        const std::uint32_t n = todo.back();
        todo.pop_back();
        const ShapeNode& node = p.nodes[n];
        if (node.code == Code::And) {
            todo.push_back(node.a);
            todo.push_back(node.b);
            continue;
        }
        if (node.code != Code::ILe && node.code != Code::ILt && node.code != Code::IEq) return false;
        const ShapeNode& x = p.nodes[node.a];
        const ShapeNode& y = p.nodes[node.b];
        // An int64 constant (bigger ones are never bounds here).
        auto small = [&](std::uint32_t n, std::int64_t& out) {
            const ConstInfo& ci = comp.const_info(n);
            out = ci.bits;
            return ci.type == ValueType::Int && ci.big < 0;
        };
        std::int64_t c = 0;
        Bound b;
        if (x.code == Code::Symbol && y.code == Code::Const && small(node.b, c)) {
            b.symbol = x.a;  // s <= c, s < c, s == c
            if (node.code == Code::ILt) {
                if (c == INT64_MIN) return false;
                b.upper = c - 1;
            } else {
                b.upper = c;
                if (node.code == Code::IEq) b.lower = c;
            }
        } else if (y.code == Code::Symbol && x.code == Code::Const && small(node.a, c)) {
            b.symbol = y.a;  // c <= s, c < s, c == s
            if (node.code == Code::ILt) {
                if (c == INT64_MAX) return false;
                b.lower = c + 1;
            } else {
                b.lower = c;
                if (node.code == Code::IEq) b.upper = c;
            }
        } else {
            return false;
        }
        out.push_back(b);
    }
    return true;
}

}  // namespace

std::string_view value_type_name(ValueType t) {
    switch (t) {
        case ValueType::Int: return "int";
        case ValueType::Float: return "float";
        case ValueType::Bool: return "bool";
    }
    return "?";
}

ShapeProgram compile_relations(std::vector<RelationInput> relations, std::vector<ValueType> symbol_types) {
    ShapeProgram p;
    for (ValueType t : symbol_types) {
        if (t != ValueType::Int && t != ValueType::Float)
            throw std::invalid_argument("a symbol is an int or a float");
    }
    p.symbol_types = std::move(symbol_types);
    p.nodes.reserve(p.symbol_types.size() + 8 * relations.size());
    p.relations.reserve(relations.size());
    // A set's relations come in id order (compile() sorts its declarations): checked, not sorted.
    const auto by_id = [](const RelationInput& a, const RelationInput& b) { return a.id < b.id; };
    if (!std::is_sorted(relations.begin(), relations.end(), by_id))
        std::sort(relations.begin(), relations.end(), by_id);
    Compiler comp(p);
    for (std::size_t k = 0; k < relations.size(); ++k) {
        RelationInput& in = relations[k];
        if (k > 0 && in.id == relations[k - 1].id) throw std::invalid_argument("duplicate relation id");
        const std::shared_ptr<const ParsedRelation> memo = parse_relation_shared(in.text);
        const ParsedRelation& parsed = *memo;
        if (parsed.symbols.size() != in.symbols.size()) {
            throw std::invalid_argument("relation " + std::to_string(in.id) + " names " +
                                        std::to_string(parsed.symbols.size()) + " symbols but binds " +
                                        std::to_string(in.symbols.size()));
        }
        for (std::uint32_t s : in.symbols) {
            if (s >= p.n_symbols()) throw std::invalid_argument("relation symbol out of range");
        }
        ShapeRelation rel;
        rel.id = in.id;
        rel.root = comp.lower(parsed, in.symbols);
        // The input's text and symbols are not read again: moved, not copied.
        rel.text = std::move(in.text);
        rel.text.resize(parsed.code_end);
        rel.symbols = std::move(in.symbols);
        p.relations.push_back(std::move(rel));
    }

    // Merge duplicates, drop bounds implied by earlier kept bounds.
    // Per node: 1 + the index of the kept relation whose root it is (0: none). Roots are nodes.
    std::vector<std::uint32_t> kept_root(p.nodes.size(), 0);
    struct Tightest {
        bool any = false;  ///< some kept bound relation bounds this symbol
        std::optional<std::int64_t> lower, upper;
        std::uint32_t lower_by = 0, upper_by = 0;
    };
    std::vector<Tightest> tightest(p.n_symbols());  // per symbol, over kept bound relations
    std::vector<Bound> bounds;
    std::vector<std::uint32_t> todo;
    p.kept.reserve(p.relations.size());
    for (std::uint32_t r = 0; r < p.relations.size(); ++r) {
        ShapeRelation& rel = p.relations[r];
        if (kept_root[rel.root] != 0) {
            rel.status = RelationStatus::Merged;
            rel.by = p.relations[kept_root[rel.root] - 1].id;
            continue;
        }
        if (bounds_of(p, comp, rel.root, bounds, todo)) {
            bool implied = true;
            std::uint32_t by = 0;
            for (const Bound& b : bounds) {
                const Tightest& t = tightest[b.symbol];
                if (!t.any) {
                    implied = false;
                    break;
                }
                if (b.lower && !(t.lower && *t.lower >= *b.lower)) implied = false;
                if (b.upper && !(t.upper && *t.upper <= *b.upper)) implied = false;
                if (!implied) break;
                by = b.lower ? t.lower_by : t.upper_by;
            }
            if (implied && !bounds.empty()) {
                rel.status = RelationStatus::Implied;
                rel.by = by;
                continue;
            }
            for (const Bound& b : bounds) {
                Tightest& t = tightest[b.symbol];
                t.any = true;
                if (b.lower && (!t.lower || *b.lower > *t.lower)) t.lower = b.lower, t.lower_by = rel.id;
                if (b.upper && (!t.upper || *b.upper < *t.upper)) t.upper = b.upper, t.upper_by = rel.id;
            }
        }
        kept_root[rel.root] = r + 1;
        p.kept.push_back(r);
    }

    // Keep the nodes the kept relations reach, renumbered: symbols, then constants, then the
    // computed nodes in creation order (operands are always created before their users).
    const std::size_t n_sym = p.n_symbols();
    std::vector<std::uint8_t> reach(p.nodes.size(), 0);
    for (std::uint32_t s = 0; s < n_sym; ++s) reach[s] = 1;
    {
        todo.clear();
        for (std::uint32_t r : p.kept) todo.push_back(p.relations[r].root);
        while (!todo.empty()) {
            const std::uint32_t n = todo.back();
            todo.pop_back();
            if (reach[n]) continue;
            reach[n] = 1;
            const ShapeNode& node = p.nodes[n];
            const std::uint32_t ops[3] = {node.a, node.b, node.c};
            for (int k = 0; k < arity(node.code); ++k) todo.push_back(ops[k]);
        }
    }
    std::vector<std::uint32_t> order;
    order.reserve(p.nodes.size());
    for (std::uint32_t s = 0; s < n_sym; ++s) order.push_back(s);
    for (std::uint32_t n = static_cast<std::uint32_t>(n_sym); n < p.nodes.size(); ++n)
        if (reach[n] && p.nodes[n].code == Code::Const) order.push_back(n);
    const std::size_t const_end = order.size();
    for (std::uint32_t n = static_cast<std::uint32_t>(n_sym); n < p.nodes.size(); ++n)
        if (reach[n] && p.nodes[n].code != Code::Const) order.push_back(n);
    std::vector<std::uint32_t> new_id(p.nodes.size(), 0xFFFFFFFFu);
    for (std::uint32_t k = 0; k < order.size(); ++k) new_id[order[k]] = k;
    std::vector<ShapeNode> nodes;
    nodes.reserve(order.size());
    p.const_regs.assign(const_end, ShapeReg{0});
    for (std::uint32_t k = 0; k < order.size(); ++k) {
        ShapeNode n = p.nodes[order[k]];
        if (n.code == Code::Const) {
            const ConstInfo& ci = comp.const_info(order[k]);
            ShapeReg reg{0};
            std::memcpy(&reg, &ci.bits, sizeof reg);  // an int64, a bool, or a double's bits
            if (ci.big >= 0) {
                reg.i = 0;
                p.big_consts.emplace_back(k, comp.big(ci.big));
                p.fast_ok = false;
            }
            p.const_regs[k] = reg;
        } else if (n.code != Code::Symbol) {
            n.a = new_id[n.a];
            if (arity(n.code) >= 2) n.b = new_id[n.b];
            if (arity(n.code) >= 3) n.c = new_id[n.c];
        }
        nodes.push_back(n);
    }
    p.nodes = std::move(nodes);
    for (ShapeRelation& rel : p.relations)
        rel.root = rel.status == RelationStatus::Kept ? new_id[rel.root] : 0;

    // Code: per kept relation in id order, the nodes it needs that are not computed yet
    // (post-order), then its check.
    std::vector<std::uint8_t> done(p.nodes.size(), 0);
    for (std::uint32_t k = 0; k < const_end; ++k) done[k] = 1;
    std::vector<std::pair<std::uint32_t, bool>> stack;  // one for every relation: its capacity kept
    p.code.reserve(p.nodes.size() - const_end + p.kept.size());
    for (std::uint32_t r : p.kept) {
        stack.assign(1, {p.relations[r].root, false});
        while (!stack.empty()) {
            auto [n, expanded] = stack.back();
            stack.pop_back();
            if (done[n]) continue;
            const ShapeNode& node = p.nodes[n];
            if (expanded) {
                done[n] = 1;
                p.code.push_back({node.code, n, node.a, node.b, node.c});
                continue;
            }
            stack.emplace_back(n, true);
            const std::uint32_t ops[3] = {node.a, node.b, node.c};
            for (int k = arity(node.code); k-- > 0;)
                if (!done[ops[k]]) stack.emplace_back(ops[k], false);
        }
        p.code.push_back({Code::Check, 0, p.relations[r].root, 0, r});
    }
    return p;
}

ShapeFrame::ShapeFrame(const ShapeProgram& p) : p_(p) {
    const std::size_t n = p.nodes.size();
    const std::size_t ns = p.n_symbols();
    if (n <= kInlineRegs) {
        regs_ = inline_regs_;
    } else {
        heap_regs_.reset(new ShapeReg[n]);  // NOLINT(cppcoreguidelines-owning-memory): default-initialised
        regs_ = heap_regs_.get();
    }
    if (ns <= kInlineSymbols) {
        states_ = inline_states_;
    } else {
        heap_states_.resize(ns);
        states_ = heap_states_.data();
    }
    for (std::size_t s = 0; s < ns; ++s) states_[s] = SymbolState::Unread;
    const std::size_t nc = p.const_regs.size();
    if (nc > ns) std::memcpy(regs_ + ns, p.const_regs.data() + ns, (nc - ns) * sizeof(ShapeReg));
}

void ShapeFrame::set_big(std::uint32_t sym, BigInt v) {
    states_[sym] = SymbolState::Big;
    has_big_ = true;
    for (auto& [s, b] : bigs_) {
        if (s == sym) {
            b = std::move(v);
            return;
        }
    }
    bigs_.emplace_back(sym, std::move(v));
}

const BigInt* ShapeFrame::big(std::uint32_t sym) const {
    for (const auto& [s, b] : bigs_)
        if (s == sym) return &b;
    return nullptr;
}

bool relation_readable(const ShapeProgram& p, const ShapeFrame& f, std::uint32_t r) {
    for (std::uint32_t s : p.relations[r].symbols)
        if (f.state(s) == SymbolState::Unread) return false;
    return true;
}

std::int32_t run_fast(const ShapeProgram& p, ShapeFrame& f) {
    if (!p.fast_ok || f.has_big()) return kShapeUndecided;
    ShapeReg* r = f.regs();
    for (const ShapeInstr& in : p.code) {
        ShapeReg& d = r[in.dst];
        const ShapeReg a = r[in.a];
        const ShapeReg b = r[in.b];
        switch (in.code) {
            case Code::IAdd:
                if (__builtin_add_overflow(a.i, b.i, &d.i)) return kShapeUndecided;
                break;
            case Code::ISub:
                if (__builtin_sub_overflow(a.i, b.i, &d.i)) return kShapeUndecided;
                break;
            case Code::IMul:
                if (__builtin_mul_overflow(a.i, b.i, &d.i)) return kShapeUndecided;
                break;
            case Code::IFloorDiv:
                if (!arith::floor_div(a.i, b.i, d.i)) return kShapeUndecided;
                break;
            case Code::IMod:
                if (!arith::mod(a.i, b.i, d.i)) return kShapeUndecided;
                break;
            case Code::INeg:
                if (a.i == INT64_MIN) return kShapeUndecided;
                d.i = -a.i;
                break;
            case Code::IAbs:
                if (a.i == INT64_MIN) return kShapeUndecided;
                d.i = a.i < 0 ? -a.i : a.i;
                break;
            case Code::IPow:
                if (!arith::pow(a.i, b.i, d.i)) return kShapeUndecided;
                break;
            case Code::IMin: d.i = b.i < a.i ? b.i : a.i; break;
            case Code::IMax: d.i = b.i > a.i ? b.i : a.i; break;
            case Code::FAdd: d.f = a.f + b.f; break;
            case Code::FSub: d.f = a.f - b.f; break;
            case Code::FMul: d.f = a.f * b.f; break;
            case Code::FDiv:
                if (b.f == 0.0) return kShapeUndecided;
                d.f = a.f / b.f;
                break;
            case Code::FFloorDiv: {
                if (b.f == 0.0) return kShapeUndecided;
                double m = 0;
                arith::float_div_mod(a.f, b.f, d.f, m);
                break;
            }
            case Code::FMod:
                if (b.f == 0.0) return kShapeUndecided;
                d.f = arith::float_mod(a.f, b.f);
                break;
            case Code::FNeg: d.f = -a.f; break;
            case Code::FAbs: d.f = std::fabs(a.f); break;
            case Code::FMin: d.f = b.f < a.f ? b.f : a.f; break;
            case Code::FMax: d.f = b.f > a.f ? b.f : a.f; break;
            case Code::IDiv: {
                // Exact operands below 2**53: one IEEE division is correctly rounded.
                constexpr std::int64_t kExact = std::int64_t{1} << 53;
                if (b.i == 0 || a.i > kExact || a.i < -kExact || b.i > kExact || b.i < -kExact)
                    return kShapeUndecided;
                d.f = static_cast<double>(a.i) / static_cast<double>(b.i);
                break;
            }
            case Code::IToF: d.f = static_cast<double>(a.i); break;  // rounds to nearest even
            case Code::FTrunc:
            case Code::FFloor:
            case Code::FCeil:
            case Code::FRound: {
                if (!std::isfinite(a.f)) return kShapeUndecided;
                const double x = in.code == Code::FTrunc   ? std::trunc(a.f)
                                 : in.code == Code::FFloor ? std::floor(a.f)
                                 : in.code == Code::FCeil  ? std::ceil(a.f)
                                                           : arith::round_half_even(a.f);
                if (!arith::double_to_int64(x, d.i)) return kShapeUndecided;
                break;
            }
            case Code::FIsNan: d.i = std::isnan(a.f) ? 1 : 0; break;
            case Code::IEq: d.i = a.i == b.i; break;
            case Code::INe: d.i = a.i != b.i; break;
            case Code::ILt: d.i = a.i < b.i; break;
            case Code::ILe: d.i = a.i <= b.i; break;
            case Code::IGt: d.i = a.i > b.i; break;
            case Code::IGe: d.i = a.i >= b.i; break;
            case Code::FEq: d.i = a.f == b.f; break;
            case Code::FNe: d.i = a.f != b.f; break;
            case Code::FLt: d.i = a.f < b.f; break;
            case Code::FLe: d.i = a.f <= b.f; break;
            case Code::FGt: d.i = a.f > b.f; break;
            case Code::FGe: d.i = a.f >= b.f; break;
            case Code::MEq: d.i = arith::compare_int_double(a.i, b.f) == 0; break;
            case Code::MNe: d.i = arith::compare_int_double(a.i, b.f) != 0; break;
            case Code::MLt: d.i = arith::compare_int_double(a.i, b.f) == -1; break;
            case Code::MLe: {
                const int c = arith::compare_int_double(a.i, b.f);
                d.i = c == -1 || c == 0;
                break;
            }
            case Code::MGt: d.i = arith::compare_int_double(a.i, b.f) == 1; break;
            case Code::MGe: {
                const int c = arith::compare_int_double(a.i, b.f);
                d.i = c == 1 || c == 0;
                break;
            }
            case Code::BEq: d.i = a.i == b.i; break;
            case Code::BNe: d.i = a.i != b.i; break;
            // No operation above raised (that ends the pass), so evaluating both sides of and/or
            // and both branches of a select gives what short-circuit evaluation gives.
            case Code::And: d.i = a.i & b.i; break;
            case Code::Or: d.i = a.i | b.i; break;
            case Code::Not: d.i = a.i ^ 1; break;
            case Code::Select: d = r[in.c].i ? a : b; break;
            case Code::Check:
                if (a.i == 0) return static_cast<std::int32_t>(in.c);
                break;
            case Code::Symbol:
            case Code::Const: break;
        }
    }
    return kShapePass;
}

std::vector<ExactResult> run_exact(const ShapeProgram& p, const ShapeFrame& f) {
    std::vector<ExactValue> v(p.nodes.size());
    const ShapeReg* regs = f.regs();
    std::size_t big_index = 0;
    for (std::uint32_t n = 0; n < p.nodes.size(); ++n) {
        const ShapeNode& node = p.nodes[n];
        switch (node.code) {
            case Code::Symbol:
                switch (f.state(node.a)) {
                    case SymbolState::Small: v[n] = ExactValue::of_int(BigInt(regs[n].i)); break;
                    case SymbolState::Float: v[n] = ExactValue::of_float(regs[n].f); break;
                    case SymbolState::Big: {
                        const BigInt* b = f.big(node.a);
                        v[n] = b != nullptr ? ExactValue::of_int(*b) : ExactValue::fail("unread symbol");
                        if (b != nullptr && b->bit_length() > kMaxIntBits) {
                            v[n] = ExactValue::fail(
                                "OverflowError: integer over 65536 bits (tripwire's limit for shape guards)");
                        }
                        break;
                    }
                    case SymbolState::TooBig:
                        v[n] = ExactValue::fail(
                            "OverflowError: integer over 65536 bits (tripwire's limit for shape guards)");
                        break;
                    case SymbolState::Unread: v[n] = ExactValue::fail("unread symbol"); break;
                }
                break;
            case Code::Const:
                if (node.type == ValueType::Int) {
                    if (big_index < p.big_consts.size() && p.big_consts[big_index].first == n) {
                        v[n] = ExactValue::of_int(p.big_consts[big_index++].second);
                    } else {
                        v[n] = ExactValue::of_int(BigInt(regs[n].i));
                    }
                } else if (node.type == ValueType::Float) {
                    v[n] = ExactValue::of_float(regs[n].f);
                } else {
                    v[n] = ExactValue::of_bool(regs[n].i != 0);
                }
                break;
            default: {
                const int k = arity(node.code);
                v[n] = apply(node.code, &v[node.a], k >= 2 ? &v[node.b] : nullptr,
                             k >= 3 ? &v[node.c] : nullptr);
                break;
            }
        }
    }
    std::vector<ExactResult> out(p.relations.size());
    for (std::uint32_t r : p.kept) {
        const ExactValue& x = v[p.relations[r].root];
        out[r].holds = !x.is_error && x.b;
        if (x.is_error) out[r].error = x.error;
    }
    return out;
}

std::int32_t first_failing(const ShapeProgram& p, ShapeFrame& f) {
    const std::int32_t fast = run_fast(p, f);
    if (fast == kShapePass) return -1;
    if (fast >= 0) return fast;
    const std::vector<ExactResult> exact = run_exact(p, f);
    for (std::uint32_t r : p.kept)
        if (!exact[r].holds) return static_cast<std::int32_t>(r);
    return -1;
}

namespace {

std::mutex g_program_memo_mutex;
std::unordered_map<std::string, std::shared_ptr<const ShapeProgram>>& program_memo() {
    static auto* memo = new std::unordered_map<std::string, std::shared_ptr<const ShapeProgram>>();
    return *memo;  // never destroyed: no order-of-destruction question at exit
}

}  // namespace

std::shared_ptr<const ShapeProgram> compile_relation_shared(const std::string& text,
                                                            const std::vector<ValueType>& types) {
    std::string key = text;
    key.push_back('\0');  // a relation's text has no NUL: the types follow it unambiguously
    for (ValueType t : types) key.push_back(static_cast<char>('0' + static_cast<int>(t)));
    {
        const std::lock_guard<std::mutex> lock(g_program_memo_mutex);
        auto it = program_memo().find(key);
        if (it != program_memo().end()) return it->second;
    }
    RelationInput in;
    in.text = text;
    for (std::uint32_t k = 0; k < types.size(); ++k) in.symbols.push_back(k);
    auto p = std::make_shared<const ShapeProgram>(compile_relations({in}, types));
    {
        const std::lock_guard<std::mutex> lock(g_program_memo_mutex);
        auto& memo = program_memo();
        if (memo.size() >= kProgramMemo) memo.clear();
        memo.emplace(std::move(key), p);
    }
    return p;
}

void clear_shape_memos() {
    std::unordered_map<std::string, std::shared_ptr<const ShapeProgram>> old;
    {
        const std::lock_guard<std::mutex> lock(g_program_memo_mutex);
        old.swap(program_memo());
    }
    clear_parse_memo();
}

}  // namespace tripwire::core::shape
