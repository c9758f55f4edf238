// tripwire/cpp/runtime/eval/relational.hpp -- ALIAS and NO_ALIAS on the values of their sources.
//
// A relational guard is not attached to one node: each of its sources' nodes hands it that
// source's value (core::Program::node_members), and it is decided once all of them are known,
// after the walk (or at the end of the fast pass, from its registers). Deciding compares pointers
// only: no user code, no allocation (a NO_ALIAS over many sources fills a hash set of pointers in
// scratch space the caller keeps).
#pragma once

#include <cstdint>
#include <vector>

#include "core/ir.hpp"
#include "runtime/py.hpp"

namespace tripwire::runtime {

/// Sources above which NO_ALIAS uses a hash set of pointers instead of comparing every pair
/// (a pair costs about as much as a hashed insert: beyond a handful, pairs grow as n^2).
inline constexpr std::size_t kPairwiseLimit = 4;
/// Sources up to which that set lives on the caller's stack.
inline constexpr std::size_t kStackDistinct = 64;

/// Whether ALIAS (values[0] is values[1]), NO_ALIAS (all distinct) or STORAGE_OVERLAPPING (the
/// first `n_overlapping` values are exactly those that may overlap another, by torch's rule,
/// through the torch adapter; fails without it or on a non-tensor) holds for `n` values.
/// `scratch` holds the hash set of a large NO_ALIAS and should be kept by the caller (no
/// steady-state allocation once it has grown). Null values are never passed.
bool relation_holds(core::GuardKind kind, PyObject* const* values, std::size_t n,
                    std::vector<PyObject*>& scratch, std::int64_t n_overlapping = 0);

/// Whether the `n` values are pairwise distinct pointers (NO_ALIAS). `scratch` as above, used
/// only beyond kStackDistinct values.
bool all_distinct(PyObject* const* values, std::size_t n, std::vector<PyObject*>& scratch);

/// For why_not: the positions (slots) of the first two values that break the relation, e.g. two
/// sources holding one object for NO_ALIAS. (0, 1) for ALIAS.
std::pair<std::size_t, std::size_t> relation_witness(core::GuardKind kind, PyObject* const* values,
                                                     std::size_t n);

}  // namespace tripwire::runtime
