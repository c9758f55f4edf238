// tripwire/cpp/runtime/eval/relational.cpp -- ALIAS and NO_ALIAS decisions.
#include "runtime/eval/relational.hpp"

#include <cstdint>

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
    // An open-addressing set of pointers, at most half full: one probe sequence per value.
    std::size_t cap = 64;
    int shift = 58;
    while (cap < 2 * n) {
        cap <<= 1;
        --shift;
    }
    scratch.assign(cap, nullptr);
    for (std::size_t i = 0; i < n; ++i) {
        PyObject* v = values[i];
        std::size_t h = static_cast<std::size_t>(
            (reinterpret_cast<std::uintptr_t>(v) >> 4) * 0x9E3779B97F4A7C15ULL >> shift);
        while (scratch[h] != nullptr) {
            if (scratch[h] == v) return false;
            h = (h + 1) & (cap - 1);
        }
        scratch[h] = v;
    }
    return true;
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
