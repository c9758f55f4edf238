// tripwire/tests/fuzz/fuzz_cache_policy.cpp -- libFuzzer target for core::CachePolicy.
//
// The input bytes decode into limits and a sequence of operations (raw insert, planned insert,
// touch, remove, clear, plan queries, lookups, a reset with new limits). Each operation is applied
// to three real CachePolicy objects with the same limits, one per OnLimit policy (their state is
// the same: only plan_insert's answer depends on the policy), and to a small reference model: a
// vector in most-recently-used order and a map of group counts. After every operation:
//   - order() equals the model's MRU order, contains() / stamp() agree for every entry and for
//     unknown ids, stamps strictly decrease along the order, each stamp handed out is larger than
//     every earlier one (clear() included), and stamp(id) is what insert()/touch() returned;
//   - group_size() equals the model's count for every group in use and for absent groups;
//     group_count() is the number of distinct groups of live entries (empty groups are forgotten);
//   - plan_insert() of a group matches the model under each policy: Raise and Fallback report the
//     first limit reached (recompile_limit, then accumulated_limit) and name no victims; Evict
//     inserts after the group's least recently used entries (until the group has a free slot),
//     then the overall least recently used ones not already picked (until the cache has one);
//   - while every insert went through a plan, size() <= accumulated_limit and every group
//     <= recompile_limit; after an Evict plan is carried out, both hold whatever came before.
// A mismatch aborts with a message. Built with libFuzzer (TRIPWIRE_FUZZ, scripts/fuzz) or as a
// plain replay test (replay_main.cpp).
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/cache_policy.hpp"

namespace tripwire::core {
namespace {

[[noreturn]] void bug(const char* what, const std::string& detail = "") {
    std::fprintf(stderr, "fuzz_cache_policy: %s %s\n", what, detail.c_str());
    std::abort();
}
#define CHECK(cond)                                                                      \
    do {                                                                                 \
        if (!(cond)) bug("check failed:", #cond " at line " + std::to_string(__LINE__)); \
    } while (0)

constexpr std::size_t kMaxOps = 4096;
constexpr std::size_t kMaxEntries = 512;  // inserts beyond this are skipped (bounds the work per op)
constexpr std::array<OnLimit, 3> kPolicies = {OnLimit::Raise, OnLimit::Fallback, OnLimit::Evict};

/// Reads the input front to back; past the end every read returns zero.
class Reader {
  public:
    Reader(const std::uint8_t* data, std::size_t size) : p_(data), end_(data + size) {}
    bool empty() const { return p_ == end_; }
    std::uint8_t byte() { return p_ == end_ ? 0 : *p_++; }
    std::uint64_t u64() {
        std::uint64_t v = 0;
        for (int i = 0; i < 8; ++i) v |= std::uint64_t{byte()} << (8 * i);
        return v;
    }

  private:
    const std::uint8_t* p_;
    const std::uint8_t* end_;
};

/// The reference: entries in MRU order, group counts, the limits. Obviously correct, slow.
struct Model {
    struct Entry {
        CacheEntryId id;
        std::string group;
        std::uint64_t stamp;
    };
    std::size_t recompile_limit = 1, accumulated_limit = 1;
    std::vector<Entry> mru;  // most recently used first
    std::map<std::string, std::size_t> groups;

    std::size_t find(CacheEntryId id) const {
        for (std::size_t i = 0; i < mru.size(); ++i) {
            if (mru[i].id == id) return i;
        }
        return mru.size();
    }
    bool contains(CacheEntryId id) const { return find(id) != mru.size(); }
    std::size_t group_size(const std::string& g) const {
        auto it = groups.find(g);
        return it == groups.end() ? 0 : it->second;
    }
    void insert(CacheEntryId id, const std::string& g, std::uint64_t stamp) {
        mru.insert(mru.begin(), Entry{id, g, stamp});
        ++groups[g];
    }
    void touch(std::size_t i, std::uint64_t stamp) {
        Entry e = mru[i];
        e.stamp = stamp;
        mru.erase(mru.begin() + static_cast<std::ptrdiff_t>(i));
        mru.insert(mru.begin(), e);
    }
    void remove(std::size_t i) {
        if (--groups[mru[i].group] == 0) groups.erase(mru[i].group);
        mru.erase(mru.begin() + static_cast<std::ptrdiff_t>(i));
    }
    void clear() {
        mru.clear();
        groups.clear();
    }
    bool within_limits() const {
        if (mru.size() > accumulated_limit) return false;
        return std::all_of(groups.begin(), groups.end(),
                           [&](const auto& kv) { return kv.second <= recompile_limit; });
    }

    /// What plan_insert must answer, from the contract in cache_policy.hpp.
    InsertPlan plan(const std::string& g, OnLimit policy) const {
        InsertPlan p;
        const std::size_t in_group = group_size(g);
        const std::size_t total = mru.size();
        if (policy != OnLimit::Evict) {
            if (in_group >= recompile_limit) {
                p.result = InsertResult::RecompileLimit;
            } else if (total >= accumulated_limit) {
                p.result = InsertResult::AccumulatedLimit;
            }
            return p;
        }
        // The group's entries, least recently used first: drop until one slot of the group is free.
        std::size_t group_victims = in_group >= recompile_limit ? in_group - recompile_limit + 1 : 0;
        for (auto it = mru.rbegin(); it != mru.rend() && group_victims > 0; ++it) {
            if (it->group != g) continue;
            p.victims.push_back(it->id);
            --group_victims;
        }
        // Then every entry, least recently used first: drop until one slot of the cache is free.
        const std::size_t left = total - p.victims.size();
        std::size_t more = left >= accumulated_limit ? left - accumulated_limit + 1 : 0;
        const std::size_t n_group_victims = p.victims.size();
        for (auto it = mru.rbegin(); it != mru.rend() && more > 0; ++it) {
            const auto first = p.victims.begin();
            const auto last = first + static_cast<std::ptrdiff_t>(n_group_victims);
            if (std::find(first, last, it->id) != last) continue;
            p.victims.push_back(it->id);
            --more;
        }
        return p;
    }
};

std::string show(const std::vector<CacheEntryId>& ids) {
    std::string s = "[";
    for (CacheEntryId id : ids) s += std::to_string(id) + " ";
    return s + "]";
}

class Harness {
  public:
    explicit Harness(Reader& in) : in_(in) { reset(); }

    void run() {
        for (std::size_t n = 0; n < kMaxOps && !in_.empty(); ++n) {
            step();
            check_state();
        }
    }

  private:
    Reader& in_;
    std::array<std::unique_ptr<CachePolicy>, 3> real_;  // one per kPolicies entry, same state
    Model model_;
    std::uint64_t last_stamp_ = 0;  // the largest stamp handed out by real_[0]
    bool only_planned_ = true;      // every insert since the last reset or clear went through a plan
    std::vector<std::string> seen_groups_;

    void reset() {
        // Limits 0..8 and 0..16: 0 is raised to 1.
        const std::size_t rl = in_.byte() % 9;
        const std::size_t al = in_.byte() % 17;
        for (std::size_t k = 0; k < kPolicies.size(); ++k) {
            real_[k] = std::make_unique<CachePolicy>(rl, al, kPolicies[k]);
            CHECK(real_[k]->on_limit() == kPolicies[k]);
            CHECK(real_[k]->recompile_limit() == std::max<std::size_t>(rl, 1));
            CHECK(real_[k]->accumulated_limit() == std::max<std::size_t>(al, 1));
            CHECK(real_[k]->empty() && real_[k]->size() == 0 && real_[k]->group_count() == 0);
        }
        model_ = Model{};
        model_.recompile_limit = std::max<std::size_t>(rl, 1);
        model_.accumulated_limit = std::max<std::size_t>(al, 1);
        last_stamp_ = 0;
        only_planned_ = true;
    }

    std::string group() {
        static const std::array<const char*, 6> names = {"", "A", "B", "self=C", "obj@0x7f00", "A "};
        const std::uint8_t b = in_.byte();
        std::string g = b < 0xC0 ? names[b % names.size()] : "g" + std::to_string(in_.byte());
        if (std::find(seen_groups_.begin(), seen_groups_.end(), g) == seen_groups_.end() &&
            seen_groups_.size() < 300) {
            seen_groups_.push_back(g);
        }
        return g;
    }

    /// An id: usually a live entry's, else a small number, sometimes any 64-bit value.
    CacheEntryId id() {
        const std::uint8_t b = in_.byte();
        if (b >= 0xF0) return in_.u64();
        if ((b & 1) != 0 && !model_.mru.empty()) return model_.mru[(b >> 1) % model_.mru.size()].id;
        return b >> 1;
    }

    /// An id no entry has.
    CacheEntryId fresh_id() {
        CacheEntryId v = id();
        while (model_.contains(v)) ++v;
        return v;
    }

    /// A new stamp from every real policy: the same value, larger than every earlier one.
    void check_new_stamp(const std::array<std::uint64_t, 3>& s) {
        CHECK(s[0] == s[1] && s[1] == s[2]);
        CHECK(s[0] > last_stamp_);
        last_stamp_ = s[0];
    }

    void do_insert(CacheEntryId v, const std::string& g) {
        std::array<std::uint64_t, 3> s{};
        for (std::size_t k = 0; k < 3; ++k) s[k] = real_[k]->insert(v, g);
        check_new_stamp(s);
        model_.insert(v, g, s[0]);
    }

    void check_plans(const std::string& g) {
        for (std::size_t k = 0; k < 3; ++k) {
            const InsertPlan want = model_.plan(g, kPolicies[k]);
            const InsertPlan got = real_[k]->plan_insert(g);
            if (got.result != want.result || got.victims != want.victims) {
                bug("plan_insert mismatch:", "policy " + std::to_string(k) + " group '" + g + "' result " +
                                                 std::to_string(static_cast<int>(got.result)) + " want " +
                                                 std::to_string(static_cast<int>(want.result)) + " victims " +
                                                 show(got.victims) + " want " + show(want.victims));
            }
        }
    }

    void step() {
        const std::uint8_t op = in_.byte();
        switch (op % 16) {
            case 0:
            case 1: {  // raw insert of an id that is not present (a precondition of insert)
                const CacheEntryId v = fresh_id();
                const std::string g = group();
                if (model_.mru.size() >= kMaxEntries) break;
                do_insert(v, g);
                only_planned_ = false;
                break;
            }
            case 2:
            case 3:
            case 4:
            case 5: {  // planned insert, as runtime::Cache does it, under the policy chosen by the input
                const std::size_t k = in_.byte() % 3;
                const std::string g = group();
                check_plans(g);
                const bool bounded_before = model_.within_limits();
                const InsertPlan plan = real_[k]->plan_insert(g);
                if (plan.result != InsertResult::Inserted) {
                    CHECK(kPolicies[k] != OnLimit::Evict);
                    break;
                }
                for (CacheEntryId v : plan.victims) {
                    for (auto& p : real_) CHECK(p->remove(v));
                    const std::size_t i = model_.find(v);
                    CHECK(i != model_.mru.size());
                    model_.remove(i);
                }
                if (model_.mru.size() >= kMaxEntries) break;
                do_insert(fresh_id(), g);
                CHECK(!bounded_before || model_.within_limits());
                if (kPolicies[k] == OnLimit::Evict) {
                    CHECK(real_[k]->size() <= model_.accumulated_limit);
                    CHECK(real_[k]->group_size(g) <= model_.recompile_limit);
                }
                break;
            }
            case 6:
            case 7:
            case 8: {  // touch (a hit), of a live or an unknown id
                const CacheEntryId v = id();
                const std::size_t i = model_.find(v);
                std::array<std::uint64_t, 3> s{};
                for (std::size_t k = 0; k < 3; ++k) s[k] = real_[k]->touch(v);
                if (i == model_.mru.size()) {
                    CHECK(s[0] == 0 && s[1] == 0 && s[2] == 0);
                } else {
                    check_new_stamp(s);
                    model_.touch(i, s[0]);
                }
                break;
            }
            case 9:
            case 10: {  // remove, of a live or an unknown id
                const CacheEntryId v = id();
                const std::size_t i = model_.find(v);
                for (auto& p : real_) CHECK(p->remove(v) == (i != model_.mru.size()));
                if (i != model_.mru.size()) model_.remove(i);
                CHECK(!model_.contains(v));
                break;
            }
            case 11:  // plan queries only: nothing changes
            case 12: check_plans(group()); break;
            case 13: {  // lookups
                const CacheEntryId v = id();
                const std::size_t i = model_.find(v);
                const std::string g = group();
                for (auto& p : real_) {
                    CHECK(p->contains(v) == (i != model_.mru.size()));
                    CHECK(p->stamp(v) == (i == model_.mru.size() ? 0 : model_.mru[i].stamp));
                    CHECK(p->group_size(g) == model_.group_size(g));
                }
                break;
            }
            case 14:
                if (op & 0x10) {
                    for (auto& p : real_) p->clear();
                    model_.clear();
                    only_planned_ = true;
                } else {
                    check_plans(group());
                }
                break;
            default:
                if (op & 0x20) {
                    reset();
                } else {
                    check_plans(group());
                }
                break;
        }
    }

    void check_state() {
        const std::size_t n = model_.mru.size();
        for (const auto& p : real_) {
            const CachePolicy& c = *p;
            CHECK(c.size() == n);
            CHECK(c.empty() == (n == 0));
            CHECK(c.order().size() == n);
            std::size_t i = 0;
            std::uint64_t prev = 0;
            for (CacheEntryId v : c.order()) {
                const Model::Entry& e = model_.mru[i];
                if (v != e.id) {
                    bug("order mismatch at",
                        std::to_string(i) + ": " + std::to_string(v) + " want " + std::to_string(e.id));
                }
                CHECK(c.contains(v));
                const std::uint64_t s = c.stamp(v);
                CHECK(s == e.stamp);
                CHECK(s != 0 && s <= last_stamp_);
                CHECK(i == 0 || s < prev);  // strictly decreasing along the MRU order
                prev = s;
                ++i;
            }
            // Empty groups are forgotten: the table holds exactly the groups of live entries.
            CHECK(c.group_count() == model_.groups.size());
            CHECK(c.group_count() <= n);
            for (const auto& [g, count] : model_.groups) CHECK(c.group_size(g) == count);
            for (const std::string& g : seen_groups_) CHECK(c.group_size(g) == model_.group_size(g));
            CHECK(n <= kMaxEntries);
            if (only_planned_) {
                CHECK(n <= c.accumulated_limit());
                for (const auto& [g, count] : model_.groups) CHECK(count <= c.recompile_limit());
            }
        }
    }
};

int test_one_input(const std::uint8_t* data, std::size_t size) {
    Reader in(data, size);
    Harness h(in);
    h.run();
    return 0;
}

}  // namespace
}  // namespace tripwire::core

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    return tripwire::core::test_one_input(data, size);
}
