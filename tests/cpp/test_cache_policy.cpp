// tripwire/tests/cpp/test_cache_policy.cpp -- CachePolicy: recency order, recompile_limit groups,
// accumulated_limit, the raise/fallback/evict policies and removal bookkeeping.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "core/cache_policy.hpp"

namespace tripwire::core {
namespace {

std::vector<CacheEntryId> order_of(const CachePolicy& p) { return {p.order().begin(), p.order().end()}; }

using Ids = std::vector<CacheEntryId>;

TEST(CachePolicyOrder, InsertAndTouchKeepMostRecentlyUsedFirst) {
    CachePolicy p(100, 100, OnLimit::Raise);
    EXPECT_TRUE(p.empty());
    const std::uint64_t s1 = p.insert(1, "");
    const std::uint64_t s2 = p.insert(2, "");
    const std::uint64_t s3 = p.insert(3, "");
    EXPECT_EQ(order_of(p), (Ids{3, 2, 1}));
    EXPECT_LT(s1, s2);
    EXPECT_LT(s2, s3);
    const std::uint64_t t1 = p.touch(1);
    EXPECT_GT(t1, s3);
    EXPECT_EQ(p.stamp(1), t1);
    EXPECT_EQ(order_of(p), (Ids{1, 3, 2}));
    p.touch(2);
    EXPECT_EQ(order_of(p), (Ids{2, 1, 3}));
    p.touch(2);  // already first: no change in order
    EXPECT_EQ(order_of(p), (Ids{2, 1, 3}));
    EXPECT_EQ(p.touch(42), 0U);  // unknown id
    EXPECT_EQ(p.size(), 3U);
}

TEST(CachePolicyLimits, RecompileLimitCountsTheGroupOnly) {
    CachePolicy p(2, 100, OnLimit::Raise);
    p.insert(1, "self=A");
    p.insert(2, "self=A");
    p.insert(3, "self=B");
    EXPECT_EQ(p.group_size("self=A"), 2U);
    EXPECT_EQ(p.group_size("self=B"), 1U);
    EXPECT_EQ(p.group_count(), 2U);
    const InsertPlan a = p.plan_insert("self=A");
    EXPECT_EQ(a.result, InsertResult::RecompileLimit);
    EXPECT_TRUE(a.victims.empty());
    const InsertPlan b = p.plan_insert("self=B");
    EXPECT_EQ(b.result, InsertResult::Inserted);
    EXPECT_TRUE(b.victims.empty());
    EXPECT_EQ(p.plan_insert("").result, InsertResult::Inserted);  // a new group
}

TEST(CachePolicyLimits, AccumulatedLimitCountsEveryEntry) {
    CachePolicy p(100, 3, OnLimit::Fallback);
    p.insert(1, "a");
    p.insert(2, "b");
    EXPECT_EQ(p.plan_insert("c").result, InsertResult::Inserted);
    p.insert(3, "c");
    const InsertPlan plan = p.plan_insert("d");
    EXPECT_EQ(plan.result, InsertResult::AccumulatedLimit);
    EXPECT_TRUE(plan.victims.empty());
}

TEST(CachePolicyLimits, RecompileLimitIsReportedBeforeAccumulatedLimit) {
    CachePolicy p(1, 1, OnLimit::Raise);
    p.insert(1, "g");
    EXPECT_EQ(p.plan_insert("g").result, InsertResult::RecompileLimit);
    EXPECT_EQ(p.plan_insert("h").result, InsertResult::AccumulatedLimit);
}

TEST(CachePolicyEvict, RecompileLimitEvictsTheGroupsLeastRecentlyUsed) {
    CachePolicy p(2, 100, OnLimit::Evict);
    p.insert(1, "A");
    p.insert(2, "B");
    p.insert(3, "A");
    p.insert(4, "B");
    // A's entries: 3 (newer), 1 (older); B's 4 is the most recent overall.
    InsertPlan plan = p.plan_insert("A");
    EXPECT_EQ(plan.result, InsertResult::Inserted);
    EXPECT_EQ(plan.victims, (Ids{1}));
    p.touch(1);  // now 3 is A's least recently used
    plan = p.plan_insert("A");
    EXPECT_EQ(plan.victims, (Ids{3}));
    // Group B is evicted independently of A's recency.
    EXPECT_EQ(p.plan_insert("B").victims, (Ids{2}));
}

TEST(CachePolicyEvict, AccumulatedLimitEvictsTheOverallLeastRecentlyUsed) {
    CachePolicy p(100, 3, OnLimit::Evict);
    p.insert(1, "x");
    p.insert(2, "y");
    p.insert(3, "z");
    p.touch(1);  // order 1, 3, 2
    InsertPlan plan = p.plan_insert("w");
    EXPECT_EQ(plan.result, InsertResult::Inserted);
    EXPECT_EQ(plan.victims, (Ids{2}));
    for (CacheEntryId v : plan.victims) p.remove(v);
    p.insert(4, "w");
    EXPECT_EQ(order_of(p), (Ids{4, 1, 3}));
    EXPECT_EQ(p.plan_insert("v").victims, (Ids{3}));
}

TEST(CachePolicyEvict, BothLimitsEvictWithoutPickingAnEntryTwice) {
    CachePolicy p(2, 3, OnLimit::Evict);
    p.insert(1, "A");
    p.insert(2, "B");
    p.insert(3, "A");  // order 3, 2, 1; A = {3, 1}
    // Group A is full: evict 1 (A's LRU); the cache then holds 2 entries < 3: nothing else.
    EXPECT_EQ(p.plan_insert("A").victims, (Ids{1}));
    p.insert(4, "C");  // order 4, 3, 2, 1 (over the accumulated limit as built by hand)
    // A group victim also frees a slot of the accumulated limit: 1, then the overall LRU (2).
    const InsertPlan plan = p.plan_insert("A");
    EXPECT_EQ(plan.victims, (Ids{1, 2}));
}

TEST(CachePolicyEvict, RaiseAndFallbackNeverNameVictims) {
    for (OnLimit policy : {OnLimit::Raise, OnLimit::Fallback}) {
        CachePolicy p(1, 2, policy);
        p.insert(1, "A");
        EXPECT_TRUE(p.plan_insert("A").victims.empty());
        p.insert(2, "B");
        const InsertPlan plan = p.plan_insert("C");
        EXPECT_EQ(plan.result, InsertResult::AccumulatedLimit);
        EXPECT_TRUE(plan.victims.empty());
        EXPECT_EQ(p.size(), 2U);
    }
}

TEST(CachePolicyRemoval, RemoveUpdatesOrderGroupsAndVictims) {
    CachePolicy p(2, 100, OnLimit::Evict);
    p.insert(1, "A");
    p.insert(2, "A");
    p.insert(3, "B");
    EXPECT_TRUE(p.remove(1));  // an invalidation: the group has room again
    EXPECT_FALSE(p.remove(1));
    EXPECT_FALSE(p.contains(1));
    EXPECT_EQ(p.stamp(1), 0U);
    EXPECT_EQ(p.group_size("A"), 1U);
    EXPECT_EQ(order_of(p), (Ids{3, 2}));
    EXPECT_TRUE(p.plan_insert("A").victims.empty());
    EXPECT_TRUE(p.remove(3));
    EXPECT_EQ(p.group_size("B"), 0U);
    EXPECT_EQ(p.group_count(), 1U);  // empty groups are forgotten
    p.insert(4, "A");
    EXPECT_EQ(p.plan_insert("A").victims, (Ids{2}));
}

TEST(CachePolicyRemoval, ClearForgetsEverythingButStampsKeepGrowing) {
    CachePolicy p(2, 2, OnLimit::Raise);
    p.insert(1, "A");
    const std::uint64_t before = p.insert(2, "A");
    p.clear();
    EXPECT_TRUE(p.empty());
    EXPECT_EQ(p.group_count(), 0U);
    EXPECT_EQ(p.group_size("A"), 0U);
    EXPECT_EQ(p.plan_insert("A").result, InsertResult::Inserted);
    EXPECT_GT(p.insert(1, "A"), before);  // ids may be reused after removal
    EXPECT_EQ(order_of(p), (Ids{1}));
}

TEST(CachePolicyRemoval, GroupTableStaysBoundedOverManyDistinctGroups) {
    CachePolicy p(8, 8, OnLimit::Evict);
    for (CacheEntryId id = 1; id <= 10000; ++id) {
        const std::string group = "obj@" + std::to_string(id);
        for (CacheEntryId v : p.plan_insert(group).victims) p.remove(v);
        p.insert(id, group);
        if (id % 4 == 0) p.remove(id);  // invalidated at once
    }
    EXPECT_LE(p.size(), 8U);
    EXPECT_LE(p.group_count(), 8U);
}

TEST(CachePolicy, LimitsBelowOneAreRaisedToOne) {
    CachePolicy p(0, 0, OnLimit::Raise);
    EXPECT_EQ(p.recompile_limit(), 1U);
    EXPECT_EQ(p.accumulated_limit(), 1U);
    EXPECT_EQ(p.on_limit(), OnLimit::Raise);
    EXPECT_EQ(p.plan_insert("").result, InsertResult::Inserted);
}

TEST(CachePolicy, InsertingAPresentIdIsRefused) {
    CachePolicy p(4, 4, OnLimit::Evict);
    p.insert(7, "g");
    EXPECT_THROW(p.insert(7, "g"), std::invalid_argument);
    EXPECT_EQ(p.size(), 1U);
    EXPECT_EQ(p.group_size("g"), 1U);
}

}  // namespace
}  // namespace tripwire::core
