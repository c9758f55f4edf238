// tripwire/cpp/runtime/eval/relational.cpp -- ALIAS and NO_ALIAS decisions.
#include "runtime/eval/relational.hpp"

#include <algorithm>

namespace tripwire::runtime {

bool relation_holds(core::GuardKind kind, PyObject* const* values, std::size_t n,
                    std::vector<PyObject*>& scratch) {
    if (kind == core::GuardKind::Alias) return n == 2 && values[0] == values[1];
    if (n <= kPairwiseLimit) {
        for (std::size_t i = 1; i < n; ++i) {
            for (std::size_t j = 0; j < i; ++j) {
                if (values[i] == values[j]) return false;
            }
        }
        return true;
    }
    scratch.assign(values, values + n);
    std::sort(scratch.begin(), scratch.end());
    return std::adjacent_find(scratch.begin(), scratch.end()) == scratch.end();
}

std::pair<std::size_t, std::size_t> relation_witness(core::GuardKind kind, PyObject* const* values,
                                                     std::size_t n) {
    if (kind == core::GuardKind::NoAlias) {
        for (std::size_t i = 1; i < n; ++i) {
            for (std::size_t j = 0; j < i; ++j) {
                if (values[i] == values[j]) return {j, i};
            }
        }
    }
    return {0, 1};
}

}  // namespace tripwire::runtime
