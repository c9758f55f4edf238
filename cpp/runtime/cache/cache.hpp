// tripwire/cpp/runtime/cache/cache.hpp -- the per-function cache of compiled entries (issue 3).
//
// A Cache holds (GuardSet, payload) entries for one (function, backend) pair. lookup() checks the
// global-state probes once, narrows the entries with a dispatch index on one discriminating
// source (type, identity, constant value, length, or a tensor's/array's type and sizes, of a
// local, of a value below a local such as L['self'].mode, or of a global), then checks the
// candidates most recently used first. The
// Python-free bookkeeping (recency, recompile_limit groups, limits, eviction victims) is
// core::CachePolicy; this file binds it to guard sets, payloads and live values.
//
// Why the design is shaped this way:
// - Every GuardSet::check may run user code and so release the GIL: another thread may insert or
//   evict meanwhile. Entries are shared_ptr'd and a lookup works on its own copy of the candidate
//   list, so nothing it holds can be freed under it.
// - Dropping an entry releases its payload, which may run arbitrary code (including this cache's
//   own methods). Removed entries are parked in a local "graveyard" and released only after the
//   cache's structures are consistent again.
// - An entry is invalid as soon as an identity-held object of its GuardSet dies (the GuardSet's
//   own weakref callbacks); check() then fails, so an invalid entry never hits. The cache drops
//   such entries at its next operation, detected cheaply with runtime::invalidation_epoch().
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/cache_policy.hpp"
#include "runtime/eval/fetch.hpp"
#include "runtime/eval/guard_set.hpp"
#include "runtime/py.hpp"

namespace tripwire::runtime {

/// What happens when an insert would exceed a limit (core::CachePolicy decides).
using OnLimit = core::OnLimit;
/// Result of Cache::insert.
using InsertResult = core::InsertResult;

/// A dispatch key: the kind of observed property and its hash.
struct DispatchKey {
    std::uint8_t kind = 0;  ///< 0 type, 1 identity, 2 value, 3 length, 4 tensor/array type and sizes
    std::uintptr_t a = 0;   ///< type pointer, object pointer, or value type pointer
    std::intptr_t b = 0;    ///< value hash (kind 2), length (kind 3), sizes hash (kind 4)
    bool operator==(const DispatchKey& o) const { return kind == o.kind && a == o.a && b == o.b; }
};

/// One source on which an entry's guards impose a dispatch key.
struct EntryIndexKey {
    /// The source's identity across entries: printed text, step kinds and, for G[...], the
    /// globals dict. Equal signatures fetch the same value from the same locals.
    std::string signature;
    DispatchKey key;
    std::uint32_t node = 0;  ///< the source's node in the entry's program
};

struct CacheEntry;
using EntryPtr = std::shared_ptr<CacheEntry>;

/// One compiled entry. Shared between the cache and Python entry views.
struct CacheEntry {
    Ref guards;                    ///< the Python GuardSet object
    std::shared_ptr<GuardSet> gs;  ///< its runtime set (kept even if GC clears the Python object)
    Ref payload;                   ///< the user's payload (may be None)
    Ref name;                      ///< str or None
    Ref snapshot;  ///< tuple of probe values at insert time; null when the cache has no probes
    Ref globals;   ///< the dict the set's G[...] sources read, when known (for the index)
    std::uint64_t hits = 0;
    std::uint64_t stamp = 0;  ///< recency (core::CachePolicy): larger is more recently used
    bool in_cache = true;     ///< false once evicted, invalidated and dropped, or cleared
    core::CacheEntryId id = 0;
    /// The recompile_limit group key: (source text, object) of every ID_MATCH guard whose
    /// source is rooted at a local (L[...]), sorted and printed.
    std::string group;
    /// Every indexable source of the entry with its most selective key.
    std::vector<EntryIndexKey> index_keys;

    /// Whether the entry can still hit: in its cache, and no object its guards name died.
    bool valid() const { return in_cache && gs && !gs->invalid(); }
};

/// Counters readable from Python.
struct CacheStats {
    std::uint64_t hits = 0, misses = 0, recompiles = 0, invalidations = 0, evictions = 0, inserts = 0;
};

class Cache {
  public:
    Cache(std::size_t recompile_limit, std::size_t accumulated_limit, OnLimit on_limit);
    ~Cache();
    Cache(const Cache&) = delete;
    Cache& operator=(const Cache&) = delete;

    /// Add a probe (a callable taking no argument) checked once per lookup. Only while empty:
    /// existing entries have no snapshot value for it. Returns false if not empty.
    bool add_probe(PyObject* fn, std::string name);

    /// Insert an entry (front of the MRU order): `gs` is the runtime set of the Python guard-set
    /// object `guards` (kept for the entry's view). On a limit, applies the policy: Evict drops
    /// the least recently used entry of the group concerned and inserts; Raise and Fallback
    /// insert nothing and report which limit was hit. The set's globals dict (GuardSet::globals)
    /// lets its G[...] sources serve as the dispatch index. Returns false with a Python error set
    /// if a probe raised or the set is already invalid.
    bool insert(PyObject* guards, std::shared_ptr<GuardSet> gs, PyObject* payload, PyObject* name,
                InsertResult& result);

    /// The first entry, most recently used first, whose probes snapshot and guards hold; null
    /// on a miss. Returns false with a Python error set when a probe or a guard raised an error
    /// that check() propagates. A hit is valid (CacheEntry::valid) when this returns, read after
    /// the last thing the lookup released: an entry that a finalizer run by those releases
    /// invalidated or removed is a miss. The cache owns the entry returned, so the caller's
    /// reference to it is never the last one while nothing else runs.
    /// With `count` false the lookup is a probe: no hit or miss is counted (a caller looking up
    /// again under its own lock after a counted miss).
    bool lookup(const Locals& locals, EntryPtr& out, bool count = true);
    bool lookup(PyObject* f_locals, EntryPtr& out, bool count = true) {
        return lookup(Locals::of_mapping(f_locals), out, count);
    }
    /// Count a lookup made with `count` false: a hit of `hit`, or a miss when it is null. For a
    /// caller whose own work after the lookup may still end the hit (Cache.lookup_entry's view
    /// is an allocation: a collection there may kill an object the entry's guards name), so that
    /// the counters say what the caller answered.
    void count_lookup(CacheEntry* hit) {
        if (hit == nullptr) {
            ++stats_.misses;
            return;
        }
        ++hit->hits;
        ++stats_.hits;
    }
    /// The shortcut of a repeated hit: when nothing died since the last operation and there is
    /// no probe, the most recently used entry is the first entry of lookup()'s order (the index
    /// only leaves out entries that cannot pass); if its guard set's fast pass (no user code)
    /// holds, that is a hit: `payload` is set and the hit counted, and 1 returned. 0 otherwise
    /// (nothing counted): call lookup(). With an index it is tried only when `with_index` (a
    /// caller whose calls mostly repeat; otherwise the index is usually cheaper).
    int lookup_most_recent(const Locals& locals, Ref& payload, bool with_index = false);

    /// Current probe values as a tuple (new reference), or null with an error set.
    Ref probe_values();
    /// An entry's snapshot of probe values: checked to be constants and deep-copied (new
    /// reference), or null with a TypeError naming the probe.
    Ref snapshot_of(PyObject* values) const;
    /// Whether an entry's snapshot matches `current` (1/0, -1 on error).
    static int snapshot_matches(const CacheEntry& e, PyObject* current);
    const std::vector<std::string>& probe_names() const { return probe_names_; }

    /// Which limit an insert of a new entry compiled for these locals would reach, asked before
    /// compiling (a compile whose insert is refused is wasted): 2 when the cache holds
    /// accumulated_limit entries, 1 when recompile_limit entries have every ID_MATCH guard on a
    /// local source (L[...]) passing on `f_locals` (Dynamo's rule: entries for the same
    /// identity-matched objects), else 0; -1 with a Python error set. Reading a source may run
    /// user code (a property), as a lookup does. The policy (Evict) is the caller's business.
    int limit_reached(PyObject* f_locals);

    /// Entries in MRU order (after dropping invalid ones).
    std::vector<EntryPtr> entries();
    std::size_t size();
    /// Drop every entry.
    void clear();

    const CacheStats& stats() const { return stats_; }
    /// The printed source the dispatch index uses, empty when there is none (after a rebuild).
    const std::string& index_source();
    std::size_t recompile_limit() const { return policy_.recompile_limit(); }
    std::size_t accumulated_limit() const { return policy_.accumulated_limit(); }
    /// See CachePolicy::set_limits.
    void set_limits(std::size_t recompile_limit, std::size_t accumulated_limit) {
        policy_.set_limits(recompile_limit, accumulated_limit);
    }
    OnLimit on_limit() const { return policy_.on_limit(); }

    /// Visit every strong reference (tp_traverse of the owning Python object).
    int traverse(visitproc visit, void* arg) const;
    /// Visit the strong references one entry holds (for an owner of the entry alone).
    static int traverse_entry(const CacheEntry& e, visitproc visit, void* arg);

  private:
    struct KeyHash {
        std::size_t operator()(const DispatchKey& k) const {
            return std::hash<std::uintptr_t>()(k.a) * 31U + std::hash<std::intptr_t>()(k.b) * 7U + k.kind;
        }
    };

    void purge_invalid(std::vector<EntryPtr>& graveyard);
    void remove(const EntryPtr& e, std::vector<EntryPtr>& graveyard);
    /// Forget the index (its buckets hold entries) and mark it for a rebuild.
    void drop_index();
    void rebuild_index();
    /// Fill e.index_keys and e.group from its guard set (at insert).
    void describe_entry(CacheEntry& e) const;
    /// The index source's current value (new reference), or null when it is missing, fetching
    /// it failed, or a step could run user code: the caller then scans every entry.
    Ref fetch_index_value(const Locals& locals);
    void all_entries(std::vector<EntryPtr>& out) const;
    void collect_candidates(const Locals& locals, std::vector<EntryPtr>& out);
    /// Candidates read without user code, for the common lookup: the index source is a root
    /// read purely (an argument, a str key of a dict of str keys), few candidates. Fills `out`
    /// with pointers into the buckets (valid while `mutations_` and the index are unchanged);
    /// false when this path does not apply (the caller collects the ordinary way).
    static constexpr std::size_t kFewCandidates = 8;
    bool few_candidates(const Locals& locals, const EntryPtr** out, std::size_t& n);
    /// Append the bucket entries of index value `o` (and the unindexed ones) to `add`; false
    /// when every entry must be scanned.
    template <typename Add>
    bool bucket_entries(PyObject* o, Add add);
    /// lookup() without counting: the first matching entry in `out` (null on a miss), false with
    /// a Python error set. What it held (candidates, probe values) is released when it returns,
    /// which may run user code: lookup() decides on `out` only after that.
    bool find_entry(const Locals& locals, EntryPtr& out);
    void touch(const EntryPtr& e);
    void record_hit(const EntryPtr& e, bool count);
    /// The probe snapshot last compared, shared by consecutive entries with the same snapshot.
    /// Holds the snapshot itself, not the entry: a check may remove (and free) the entry.
    struct SnapshotMemo {
        Ref snapshot;
        int ok = 0;
    };
    /// Whether entry `c` matches (1/0, -1 with a Python error set).
    int try_entry(const EntryPtr& c, const Locals& locals, PyObject* current, SnapshotMemo& memo);
    /// The candidate list of one lookup: storage reused per thread and nesting level, so that a
    /// lookup allocates nothing once warm. Emptied (the entries released) when it goes.
    class CandidateList {
      public:
        CandidateList();
        ~CandidateList();
        CandidateList(const CandidateList&) = delete;
        CandidateList& operator=(const CandidateList&) = delete;
        std::vector<EntryPtr>& get() const;

      private:
        std::size_t level_;
    };

    core::CachePolicy policy_;  // recency order, groups, limits (by entry id)
    std::unordered_map<core::CacheEntryId, EntryPtr> by_id_;
    EntryPtr front_;  // the most recently used entry (policy_.order().front()), null when empty
    core::CacheEntryId next_id_ = 1;
    std::uint64_t seen_epoch_ = 0;
    std::uint64_t mutations_ = 0;  // bumped by every insert and removal, and by index rebuilds
    std::vector<Ref> probes_;
    std::vector<std::string> probe_names_;
    CacheStats stats_;

    /// How to fetch the index source from a locals. Shared with every lookup in flight: a fetch
    /// can run user code (a colliding dict key's __eq__) that inserts entries and so rebuilds
    /// the index; the lookup's own reference keeps the steps and their operands alive.
    struct IndexPath {
        core::RootKind root = core::RootKind::Local;
        Ref name;                        ///< the root's name (interned str)
        Ref globals;                     ///< the globals dict, for a G[...] root
        std::vector<RuntimeStep> steps;  ///< root to source; operands held by `operands`
        std::vector<Ref> operands;
        Py_ssize_t slot = -1;  ///< argument-index hint for Locals::argument
        Py_ssize_t hint = -1;  ///< dict entry hint for the root read from a dict (dict_hint.hpp)
    };

    // Dispatch index, rebuilt lazily after any insert or removal.
    bool index_dirty_ = true;
    std::string index_text_;                 // "L['x']", "L['self'].mode", "G['flag']"; empty: no index
    std::string index_signature_;            // EntryIndexKey::signature of the source
    std::shared_ptr<IndexPath> index_path_;  // null: no index
    std::uint8_t index_kinds_ = 0;           // bit per DispatchKey::kind present
    std::unordered_map<DispatchKey, std::vector<EntryPtr>, KeyHash> buckets_;
    std::vector<EntryPtr> unindexed_;
};

}  // namespace tripwire::runtime
