// tripwire/tests/cpp/test_fail_order.cpp -- record_failure: adaptive move-toward-front ordering.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "core/fail_order.hpp"

namespace tripwire::core {
namespace {

constexpr std::uint32_t kSaturated = 0xFFFFFFFFu;

std::vector<std::uint32_t> iota(std::uint32_t n) {
    std::vector<std::uint32_t> v(n);
    std::iota(v.begin(), v.end(), 0u);
    return v;
}

TEST(FailOrder, FirstFailurePromotesByOnePlace) {
    std::vector<std::uint32_t> order = iota(4), fails(4, 0);
    EXPECT_EQ(record_failure(order.data(), fails.data(), 0, 3), 2u);
    EXPECT_EQ(order, (std::vector<std::uint32_t>{0, 1, 3, 2}));
    EXPECT_EQ(fails[3], 1u);
    // Only one place per failure, however often it fails.
    EXPECT_EQ(record_failure(order.data(), fails.data(), 0, 2), 1u);
    EXPECT_EQ(order, (std::vector<std::uint32_t>{0, 3, 1, 2}));
    EXPECT_EQ(record_failure(order.data(), fails.data(), 0, 1), 0u);
    EXPECT_EQ(order, (std::vector<std::uint32_t>{3, 0, 1, 2}));
    EXPECT_EQ(fails[3], 3u);
}

TEST(FailOrder, FrontEntryStaysInPlace) {
    std::vector<std::uint32_t> order = iota(3), fails(3, 0);
    EXPECT_EQ(record_failure(order.data(), fails.data(), 0, 0), 0u);
    EXPECT_EQ(order, iota(3));
    EXPECT_EQ(fails[0], 1u);
}

TEST(FailOrder, NoPromotionPastAnEntryThatFailsAsOften) {
    std::vector<std::uint32_t> order = iota(3), fails = {2, 0, 0};
    // Entry 1 fails once: 1 < 2, it stays put.
    EXPECT_EQ(record_failure(order.data(), fails.data(), 0, 1), 1u);
    EXPECT_EQ(order, iota(3));
    // At 2 == 2 it still stays: promotion needs strictly more failures.
    EXPECT_EQ(record_failure(order.data(), fails.data(), 0, 1), 1u);
    EXPECT_EQ(order, iota(3));
    // At 3 > 2 it moves.
    EXPECT_EQ(record_failure(order.data(), fails.data(), 0, 1), 0u);
    EXPECT_EQ(order, (std::vector<std::uint32_t>{1, 0, 2}));
}

TEST(FailOrder, SaturatesInsteadOfWrapping) {
    std::vector<std::uint32_t> order = iota(2), fails = {kSaturated, kSaturated - 1};
    EXPECT_EQ(record_failure(order.data(), fails.data(), 0, 1), 1u);  // reaches the max: tie, no move
    EXPECT_EQ(fails[1], kSaturated);
    EXPECT_EQ(record_failure(order.data(), fails.data(), 0, 1), 1u);  // stays saturated
    EXPECT_EQ(fails[1], kSaturated);
    EXPECT_EQ(record_failure(order.data(), fails.data(), 0, 0), 0u);
    EXPECT_EQ(fails[0], kSaturated);
    EXPECT_EQ(order, iota(2));
}

TEST(FailOrder, NeverLeavesItsRange) {
    // Two ranges in one array, as node_guards holds the guards of several nodes: [0,3) and [3,6).
    // Failures in the second range never cross into the first, even when they fail far more.
    std::vector<std::uint32_t> order = iota(6), fails(6, 0);
    for (int i = 0; i < 100; ++i) {
        const std::uint32_t pos =
            static_cast<std::uint32_t>(std::find(order.begin(), order.end(), 5u) - order.begin());
        const std::uint32_t now = record_failure(order.data(), fails.data(), 3, pos);
        EXPECT_GE(now, 3u);
    }
    EXPECT_EQ(order, (std::vector<std::uint32_t>{0, 1, 2, 5, 3, 4}));
}

TEST(FailOrder, UsuallyFailingEntryReachesTheFront) {
    std::vector<std::uint32_t> order = iota(8), fails(8, 0);
    std::mt19937 rng(1234);
    std::bernoulli_distribution hot(0.8);
    std::uniform_int_distribution<std::uint32_t> other(0, 6);
    for (int i = 0; i < 2000; ++i) {
        const std::uint32_t id = hot(rng) ? 7u : other(rng);
        const auto pos =
            static_cast<std::uint32_t>(std::find(order.begin(), order.end(), id) - order.begin());
        record_failure(order.data(), fails.data(), 0, pos);
    }
    EXPECT_EQ(order[0], 7u);
}

TEST(FailOrder, RandomFailuresKeepEachRangeAPermutation) {
    // Several ranges, random failures everywhere: each range stays a permutation of its ids and
    // the returned position always holds the entry that failed.
    const std::vector<std::uint32_t> bounds = {0, 1, 5, 6, 20, 50};
    const std::uint32_t n = bounds.back();
    std::vector<std::uint32_t> order = iota(n), fails(n, 0);
    std::mt19937 rng(42);
    for (int i = 0; i < 100000; ++i) {
        const std::size_t r = std::uniform_int_distribution<std::size_t>(0, bounds.size() - 2)(rng);
        const std::uint32_t begin = bounds[r], end = bounds[r + 1];
        // Skewed choice so that promotions happen often.
        std::uint32_t pos = std::uniform_int_distribution<std::uint32_t>(begin, end - 1)(rng);
        if (rng() % 3 == 0) pos = end - 1;
        const std::uint32_t id = order[pos];
        const std::uint32_t now = record_failure(order.data(), fails.data(), begin, pos);
        ASSERT_TRUE(now == pos || now + 1 == pos);
        ASSERT_GE(now, begin);
        ASSERT_EQ(order[now], id);
    }
    std::uint64_t total = 0;
    for (std::size_t r = 0; r + 1 < bounds.size(); ++r) {
        std::vector<std::uint32_t> part(order.begin() + bounds[r], order.begin() + bounds[r + 1]);
        std::sort(part.begin(), part.end());
        std::vector<std::uint32_t> want(bounds[r + 1] - bounds[r]);
        std::iota(want.begin(), want.end(), bounds[r]);
        EXPECT_EQ(part, want) << "range " << r;
    }
    for (std::uint32_t f : fails) total += f;
    EXPECT_EQ(total, 100000u);
}

}  // namespace
}  // namespace tripwire::core
