// tripwire/cpp/runtime/cache.hpp -- the per-function cache of compiled entries (issue 3).
//
// A Cache holds (GuardSet, payload) entries for one (function, backend) pair. lookup() checks the
// global-state probes once, narrows the entries with a dispatch index on one discriminating
// local (type, identity, constant value or length), then checks the candidates most recently
// used first.
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
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "guard_set.hpp"
#include "py.hpp"

namespace tripwire::runtime {

/// Maps a Python guard-set object (tripwire.GuardSet) to its runtime set; null if it is not one
/// or was cleared by the garbage collector. Installed by the bindings; used once per insert.
using GuardSetResolver = std::shared_ptr<GuardSet> (*)(PyObject*);

/// What happens when an insert would exceed a limit.
enum class OnLimit : std::uint8_t { Raise, Fallback, Evict };

/// Result of Cache::insert.
enum class InsertResult : std::uint8_t { Inserted, RecompileLimit, AccumulatedLimit };

struct CacheEntry;
using EntryPtr = std::shared_ptr<CacheEntry>;

/// One compiled entry. Shared between the cache and Python entry views.
struct CacheEntry {
    Ref guards;    ///< the Python GuardSet object
    std::shared_ptr<GuardSet> gs;  ///< its runtime set (kept even if GC clears the Python object)
    Ref payload;   ///< the user's payload (may be None)
    Ref name;      ///< str or None
    Ref snapshot;  ///< tuple of probe values at insert time; null when the cache has no probes
    std::uint64_t hits = 0;
    std::uint64_t stamp = 0;  ///< recency: larger is more recently used (inserted or hit)
    bool in_cache = true;     ///< false once evicted, invalidated and dropped, or cleared
    /// (source text, object) of every ID_MATCH guard, sorted: the recompile_limit group key.
    std::vector<std::pair<std::string, std::uintptr_t>> id_key;
    std::list<EntryPtr>::iterator pos;  ///< position in Cache::order_ while in_cache
};

/// Counters readable from Python.
struct CacheStats {
    std::uint64_t hits = 0, misses = 0, recompiles = 0, invalidations = 0, evictions = 0, inserts = 0;
};

class Cache {
  public:
    Cache(std::size_t recompile_limit, std::size_t accumulated_limit, OnLimit on_limit,
          GuardSetResolver resolver);
    ~Cache();
    Cache(const Cache&) = delete;
    Cache& operator=(const Cache&) = delete;

    /// Add a probe (a callable taking no argument) checked once per lookup. Only while empty:
    /// existing entries have no snapshot value for it. Returns false if not empty.
    bool add_probe(PyObject* fn, std::string name);

    /// Insert an entry (front of the MRU order). On a limit, applies the policy: Evict drops the
    /// least recently used entry of the group concerned and inserts; Raise and Fallback insert
    /// nothing and report which limit was hit. Returns false with a Python error set if a probe
    /// raised or `guards` is not a GuardSet.
    bool insert(PyObject* guards, PyObject* payload, PyObject* name, InsertResult& result);

    /// The first entry, most recently used first, whose probes snapshot and guards hold; null
    /// on a miss. Returns false with a Python error set when a probe or a guard raised an error
    /// that check() propagates.
    /// With `count` false the lookup is a probe: no hit or miss is counted (a caller looking up
    /// again under its own lock after a counted miss).
    bool lookup(const Frame& frame, EntryPtr& out, bool count = true);
    bool lookup(PyObject* f_locals, EntryPtr& out, bool count = true) {
        return lookup(Frame::of_mapping(f_locals), out, count);
    }

    /// Current probe values as a tuple (new reference), or null with an error set.
    Ref probe_values();
    /// Whether an entry's snapshot matches `current` (1/0, -1 on error).
    static int snapshot_matches(const CacheEntry& e, PyObject* current);
    const std::vector<std::string>& probe_names() const { return probe_names_; }

    /// Entries in MRU order (after dropping invalid ones).
    std::vector<EntryPtr> entries();
    std::size_t size();
    /// Drop every entry.
    void clear();
    /// Whether an entry can still hit (in the cache and its guard set is valid).
    bool entry_valid(const CacheEntry& e) const;

    const CacheStats& stats() const { return stats_; }
    /// The printed source the dispatch index uses, empty when there is none (after a rebuild).
    const std::string& index_source();
    std::size_t recompile_limit() const { return recompile_limit_; }
    std::size_t accumulated_limit() const { return accumulated_limit_; }
    OnLimit on_limit() const { return on_limit_; }

    /// Visit every strong reference (tp_traverse of the owning Python object).
    int traverse(visitproc visit, void* arg) const;

  private:
    /// A dispatch key: the kind of observed property and its hash.
    struct Key {
        std::uint8_t kind = 0;  // 0 type, 1 identity, 2 value, 3 length
        std::uintptr_t a = 0;   // type pointer, object pointer, or value type pointer
        std::intptr_t b = 0;    // value hash (kind 2), length (kind 3)
        bool operator==(const Key& o) const { return kind == o.kind && a == o.a && b == o.b; }
    };
    struct KeyHash {
        std::size_t operator()(const Key& k) const {
            return std::hash<std::uintptr_t>()(k.a) * 31U + std::hash<std::intptr_t>()(k.b) * 7U + k.kind;
        }
    };

    void purge_invalid(std::vector<EntryPtr>& graveyard);
    void remove(const EntryPtr& e, std::vector<EntryPtr>& graveyard);
    void rebuild_index();
    /// The key an entry's guards on the root local `text` impose, if any.
    bool entry_key(const CacheEntry& e, const std::string& text, Key& out) const;
    void collect_candidates(const Frame& frame, std::vector<EntryPtr>& out);
    void touch(const EntryPtr& e);
    void record_hit(const EntryPtr& e, bool count);
    /// The probe snapshot last compared, shared by consecutive entries with the same snapshot.
    struct SnapshotMemo {
        const CacheEntry* owner = nullptr;
        int ok = 0;
    };
    /// Whether entry `c` matches (1/0, -1 with a Python error set).
    int try_entry(const EntryPtr& c, const Frame& frame, PyObject* current, SnapshotMemo& memo);

    std::size_t recompile_limit_, accumulated_limit_;
    OnLimit on_limit_;
    GuardSetResolver resolver_;
    std::list<EntryPtr> order_;  // MRU first
    std::uint64_t clock_ = 0;
    std::uint64_t seen_epoch_ = 0;
    std::vector<Ref> probes_;
    std::vector<std::string> probe_names_;
    CacheStats stats_;

    // Dispatch index, rebuilt lazily after any insert or removal.
    bool index_dirty_ = true;
    std::string index_text_;        // "L['x']"; empty: no index
    Ref index_name_;                // the local's name (interned str)
    Py_ssize_t index_slot_ = -1;    // argument-index hint for Frame::argument
    std::uint8_t index_kinds_ = 0;  // bit per Key::kind present
    std::unordered_map<Key, std::vector<EntryPtr>, KeyHash> buckets_;
    std::vector<EntryPtr> unindexed_;
};

}  // namespace tripwire::runtime
