// tripwire/cpp/core/cache_policy.cpp -- CachePolicy: recency order, groups, limits, victims.
#include "core/cache_policy.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace tripwire::core {

CachePolicy::CachePolicy(std::size_t recompile_limit, std::size_t accumulated_limit, OnLimit on_limit)
    : recompile_limit_(std::max<std::size_t>(recompile_limit, 1)),
      accumulated_limit_(std::max<std::size_t>(accumulated_limit, 1)),
      on_limit_(on_limit) {}

InsertPlan CachePolicy::plan_insert(const std::string& group) const {
    InsertPlan plan;
    std::size_t in_group = group_size(group);
    std::size_t total = order_.size();
    if (in_group >= recompile_limit_) {
        if (on_limit_ != OnLimit::Evict) {
            plan.result = InsertResult::RecompileLimit;
            return plan;
        }
        // The group's least recently used entries, oldest first, until one slot is free.
        for (auto it = order_.rbegin(); it != order_.rend() && in_group >= recompile_limit_; ++it) {
            if (entries_.at(*it).group != group) continue;
            plan.victims.push_back(*it);
            --in_group;
            --total;
        }
    }
    if (total >= accumulated_limit_) {
        if (on_limit_ != OnLimit::Evict) {
            plan.result = InsertResult::AccumulatedLimit;
            return plan;
        }
        for (auto it = order_.rbegin(); it != order_.rend() && total >= accumulated_limit_; ++it) {
            // Victims of the group step are already counted; plans are short (few victims).
            if (std::find(plan.victims.begin(), plan.victims.end(), *it) != plan.victims.end()) continue;
            plan.victims.push_back(*it);
            --total;
        }
    }
    return plan;
}

std::uint64_t CachePolicy::insert(CacheEntryId id, std::string group) {
    if (entries_.count(id) != 0)
        throw std::invalid_argument("CachePolicy::insert: the id is already present");
    order_.push_front(id);
    Slot& s = entries_[id];
    s.pos = order_.begin();
    s.stamp = ++clock_;
    ++group_sizes_[group];
    s.group = std::move(group);
    return s.stamp;
}

std::uint64_t CachePolicy::touch(CacheEntryId id) {
    auto it = entries_.find(id);
    if (it == entries_.end()) return 0;
    order_.splice(order_.begin(), order_, it->second.pos);
    it->second.stamp = ++clock_;
    return it->second.stamp;
}

bool CachePolicy::remove(CacheEntryId id) {
    auto it = entries_.find(id);
    if (it == entries_.end()) return false;
    order_.erase(it->second.pos);
    // Forget empty groups: a cache whose entries name ever new objects must not grow.
    auto g = group_sizes_.find(it->second.group);
    if (g != group_sizes_.end() && --g->second == 0) group_sizes_.erase(g);
    entries_.erase(it);
    return true;
}

void CachePolicy::clear() {
    order_.clear();
    entries_.clear();
    group_sizes_.clear();
}

std::uint64_t CachePolicy::stamp(CacheEntryId id) const {
    auto it = entries_.find(id);
    return it == entries_.end() ? 0 : it->second.stamp;
}

std::size_t CachePolicy::group_size(const std::string& group) const {
    auto it = group_sizes_.find(group);
    return it == group_sizes_.end() ? 0 : it->second;
}

}  // namespace tripwire::core
