// tripwire/cpp/core/cache_policy.hpp -- the Python-free bookkeeping of a compiled-entry cache.
//
// CachePolicy decides everything about a cache that needs no Python object: the recency order
// (most recently used first), the recompile_limit groups (entries with the same group key), the
// accumulated limit, and which entries an insert beyond a limit evicts. It works on opaque entry
// ids and group keys; runtime::Cache maps them to its entries (guard sets and payloads) and
// carries out the decisions. Keeping it here makes the policy testable without an interpreter.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>
#include <vector>

namespace tripwire::core {

/// What happens when an insert would exceed a limit.
enum class OnLimit : std::uint8_t { Raise, Fallback, Evict };

/// Outcome of an insert: inserted, or refused because of the named limit.
enum class InsertResult : std::uint8_t { Inserted, RecompileLimit, AccumulatedLimit };

/// An entry's identity, chosen by the caller; unique among the entries in the policy.
using CacheEntryId = std::uint64_t;

/// What an insert must do under the limits, computed before anything changes.
struct InsertPlan {
    /// Inserted: go ahead (after evicting `victims`); otherwise the limit that refuses it.
    InsertResult result = InsertResult::Inserted;
    /// Entries to drop first, in order (only under OnLimit::Evict).
    std::vector<CacheEntryId> victims;
};

class CachePolicy {
  public:
    /// Both limits must be at least 1.
    CachePolicy(std::size_t recompile_limit, std::size_t accumulated_limit, OnLimit on_limit);
    // Entries hold iterators into this object's own list: a copy would point into the original.
    CachePolicy(const CachePolicy&) = delete;
    CachePolicy& operator=(const CachePolicy&) = delete;

    /// What inserting an entry of `group` requires. recompile_limit counts the entries of the same
    /// group; accumulated_limit counts all entries. Under Evict the victims are the least recently
    /// used entries of the group, then (if the cache is still full) the least recently used
    /// entries overall; under Raise and Fallback nothing is evicted and the first limit reached is
    /// reported.
    InsertPlan plan_insert(const std::string& group) const;

    /// Add an entry at the front of the recency order. Returns its recency stamp (larger is more
    /// recent). The id must not be present (std::invalid_argument otherwise).
    std::uint64_t insert(CacheEntryId id, std::string group);
    /// Move an entry to the front (a hit). Returns its new stamp, 0 if the id is unknown.
    std::uint64_t touch(CacheEntryId id);
    /// Forget an entry (evicted, invalidated or dropped). False if the id is unknown.
    bool remove(CacheEntryId id);
    /// Forget every entry. Stamps keep increasing.
    void clear();

    /// Entry ids, most recently used first.
    const std::list<CacheEntryId>& order() const { return order_; }
    std::size_t size() const { return order_.size(); }
    bool empty() const { return order_.empty(); }
    bool contains(CacheEntryId id) const { return entries_.count(id) != 0; }
    /// The entry's stamp, 0 if unknown.
    std::uint64_t stamp(CacheEntryId id) const;
    /// How many entries share `group`.
    std::size_t group_size(const std::string& group) const;
    /// How many distinct groups have entries (bounded by size(): empty groups are forgotten).
    std::size_t group_count() const { return group_sizes_.size(); }

    std::size_t recompile_limit() const { return recompile_limit_; }
    std::size_t accumulated_limit() const { return accumulated_limit_; }
    OnLimit on_limit() const { return on_limit_; }
    /// New limits (both at least 1) for the inserts to come: entries already over a lowered
    /// limit stay (Dynamo's config read on each miss works the same way; plan_insert evicts or
    /// refuses from the current counts).
    void set_limits(std::size_t recompile_limit, std::size_t accumulated_limit) {
        recompile_limit_ = recompile_limit < 1 ? 1 : recompile_limit;
        accumulated_limit_ = accumulated_limit < 1 ? 1 : accumulated_limit;
    }

  private:
    struct Slot {
        std::list<CacheEntryId>::iterator pos;
        std::string group;
        std::uint64_t stamp = 0;
    };

    std::size_t recompile_limit_, accumulated_limit_;
    OnLimit on_limit_;
    std::list<CacheEntryId> order_;  // MRU first
    std::unordered_map<CacheEntryId, Slot> entries_;
    std::unordered_map<std::string, std::size_t> group_sizes_;
    std::uint64_t clock_ = 0;
};

}  // namespace tripwire::core
