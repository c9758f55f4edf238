// tripwire/cpp/core/fail_order.hpp -- adaptive fail-fast ordering of sibling checks.
//
// Each node's guards and children are evaluated in a permutation of their installation order.
// When one fails, it moves one place towards the front if it now fails more often than the entry
// before it, so entries that usually fail end up first and a failing check stops early. Moving by
// one place per failure keeps the cost O(1) and makes a single unlucky failure harmless.
#pragma once

#include <cstdint>
#include <utility>

namespace tripwire::core {

/// `order[begin..end)` holds entry ids; `fails[id]` counts failures of entry `id`. Record a
/// failure of the entry at position `pos` and promote it by one place if it now fails more often
/// than its predecessor. Returns the entry's new position.
inline std::uint32_t record_failure(std::uint32_t* order, std::uint32_t* fails, std::uint32_t begin,
                                    std::uint32_t pos) {
    const std::uint32_t id = order[pos];
    if (fails[id] != 0xFFFFFFFFu) ++fails[id];  // saturate instead of wrapping to zero
    if (pos > begin && fails[id] > fails[order[pos - 1]]) {
        std::swap(order[pos], order[pos - 1]);
        return pos - 1;
    }
    return pos;
}

}  // namespace tripwire::core
