// tripwire/cpp/core/shape/small_eval.hpp -- a relation's truth on small ints, from its parse tree.
//
// The builder checks each relation once on its example. Compiling it (compile_relation_scratch)
// is most of that check's cost, yet on an example the values are nearly always ints that fit
// int64 and the relation a few +, -, *, //, % and comparisons. This evaluates such a parse tree
// directly; anything else (a float, a bool compared, an error Python would raise, an overflow, a
// type error) is left undecided for the compiled program, which decides it as a check does.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/shape/parser.hpp"

namespace tripwire::core::shape {

/// What holds_on_small_ints decided.
enum class SmallTruth : std::uint8_t {
    Fails,      ///< the relation is false on the values
    Holds,      ///< the relation is true on the values
    Undecided,  ///< not decided here: compile the relation (compile_relation_scratch) and run it
};

/// The truth of `r` on int symbol values `values[0..n)` (symbol k of the parse is values[k]),
/// exactly as the compiled program decides it, when every node is an int or bool operation whose
/// operands have the types the compiler requires (so the compiler would raise no type error) and
/// no operation raises or leaves int64 (so short-circuits and the fast path's fallback change
/// nothing); Undecided otherwise, including when `n` is not the parse's number of symbols.
SmallTruth holds_on_small_ints(const ParsedRelation& r, const std::int64_t* values, std::size_t n);

}  // namespace tripwire::core::shape
