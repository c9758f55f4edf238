// tripwire/tests/cpp/same_parse.hpp -- whether two shape parses are the same (test and fuzz code).
//
// The plain parser (run_plain), the recursive one and the parse memos must make identical trees:
// tests/cpp/test_shape.cpp and tests/fuzz/fuzz_shape.cpp compare them with this.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/shape/parser.hpp"

namespace tripwire::core::shape::parse_check {

/// The bits of a double (NaN constants compare by bits).
inline std::uint64_t bits_of(double d) {
    std::uint64_t b = 0;
    std::memcpy(&b, &d, sizeof b);
    return b;
}

/// Two parses give the same tree (every field of every node; int literals by value), spans,
/// symbol texts and code end.
inline bool same_parse(const ParsedRelation& a, const ParsedRelation& b) {
    if (a.root != b.root || a.code_end != b.code_end || a.symbols != b.symbols ||
        a.nodes.size() != b.nodes.size() || a.spans.size() != b.spans.size())
        return false;
    for (std::size_t k = 0; k < a.spans.size(); ++k) {
        const SymbolSpan &x = a.spans[k], &y = b.spans[k];
        if (x.begin != y.begin || x.end != y.end || x.symbol != y.symbol) return false;
    }
    for (std::size_t k = 0; k < a.nodes.size(); ++k) {
        const AstNode &x = a.nodes[k], &y = b.nodes[k];
        if (x.op != y.op || x.offset != y.offset || x.args.n != y.args.n || x.int_small != y.int_small ||
            (x.big_int != 0) != (y.big_int != 0) || a.int_literal(x) != b.int_literal(y) ||
            bits_of(x.float_value) != bits_of(y.float_value) || x.bool_value != y.bool_value ||
            x.symbol != y.symbol)
            return false;
        for (std::size_t j = 0; j < x.args.n; ++j)
            if (x.args.v[j] != y.args.v[j]) return false;
    }
    return true;
}

}  // namespace tripwire::core::shape::parse_check
