// tripwire/cpp/runtime/eval/relational.cpp -- ALIAS and NO_ALIAS decisions.
#include "runtime/eval/relational.hpp"

#include <algorithm>
#include <cstdint>

#include "runtime/tensors/readers.hpp"

namespace tripwire::runtime {
namespace {

// torch's check_overlapping: compute_overlapping_tensors over all values (every pair, whatever
// their storages: torch compares metadata only) must mark exactly the first `n_overlapping`.
bool storage_overlap_holds(PyObject* const* values, std::size_t n, std::int64_t n_overlapping) {
    const TwTorchAdapter* ad = torch_adapter();
    if (ad == nullptr) return false;
    // Pairs in torch's order (compute_overlapping_tensors: (i, j) with j < i); the flags live in a
    // per-thread buffer kept across checks (no steady-state allocation).
    thread_local std::vector<unsigned char> flagged;
    flagged.assign(n, 0);
    for (std::size_t i = 1; i < n; ++i) {
        for (std::size_t j = 0; j < i; ++j) {
            const int r = ad->tensors_may_overlap(values[i], values[j]);
            if (r < 0) return false;  // not a tensor, or torch threw: torch raises, this fails
            if (r == 1) flagged[i] = flagged[j] = 1;
        }
    }
    const auto first = static_cast<std::size_t>(n_overlapping);
    for (std::size_t i = 0; i < n; ++i) {
        if ((flagged[i] != 0) != (i < first)) return false;
    }
    return true;
}

}  // namespace

bool relation_holds(core::GuardKind kind, PyObject* const* values, std::size_t n,
                    std::vector<PyObject*>& scratch, std::int64_t n_overlapping) {
    if (kind == core::GuardKind::Alias) return n == 2 && values[0] == values[1];
    if (kind == core::GuardKind::StorageOverlapping) return storage_overlap_holds(values, n, n_overlapping);
    return all_distinct(values, n, scratch);
}

bool all_distinct(PyObject* const* values, std::size_t n, std::vector<PyObject*>& scratch) {
    if (n <= kPairwiseLimit) {
        for (std::size_t i = 1; i < n; ++i) {
            for (std::size_t j = 0; j < i; ++j) {
                if (values[i] == values[j]) return false;
            }
        }
        return true;
    }
    // An open-addressing set of pointers, at most half full: one probe sequence per value. Up to
    // kStackDistinct values it lives on the stack (no per-thread buffer to reach).
    PyObject* local[2 * kStackDistinct];
    std::size_t cap = 16;
    int shift = 60;
    while (cap < 2 * n) {
        cap <<= 1;
        --shift;
    }
    PyObject** table = local;
    if (cap > 2 * kStackDistinct) {
        scratch.assign(cap, nullptr);
        table = scratch.data();
    } else {
        std::fill(local, local + cap, nullptr);
    }
    for (std::size_t i = 0; i < n; ++i) {
        PyObject* v = values[i];
        std::size_t h = static_cast<std::size_t>(
            (reinterpret_cast<std::uintptr_t>(v) >> 4) * 0x9E3779B97F4A7C15ULL >> shift);
        while (table[h] != nullptr) {
            if (table[h] == v) return false;
            h = (h + 1) & (cap - 1);
        }
        table[h] = v;
    }
    return true;
}

std::pair<std::size_t, std::size_t> relation_witness(core::GuardKind kind, PyObject* const* values,
                                                     std::size_t n) {
    if (kind == core::GuardKind::StorageOverlapping) {
        // The first pair torch's rule calls overlapping (or any pair, for the message).
        const TwTorchAdapter* ad = torch_adapter();
        for (std::size_t i = 1; ad != nullptr && i < n; ++i) {
            for (std::size_t j = 0; j < i; ++j) {
                if (ad->tensors_may_overlap(values[i], values[j]) != 0) return {j, i};
            }
        }
        return {0, 1};
    }
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
