// tripwire/cpp/runtime/cache.cpp -- Cache: MRU entries, dispatch index, limits, probes.
//
// See cache.hpp for the design. The invariant that keeps the index correct: an entry is put in
// the bucket of key K only if every value that passes its guards on the index source has key K
// (TYPE_MATCH: the exact type; ID_MATCH: the object; EQUALS_MATCH on an exact int/str/bytes/
// bool/None: the value's type and hash, which EQUALS_MATCH's type-exact equality preserves;
// LENGTH: the length, but only for values whose length runs no user code, so lookup scans every
// entry when such an index meets any other value). Every candidate is still checked in full, so a hash
// collision costs time, never a false hit.
#include "cache.hpp"

#include <algorithm>

#include "predicates.hpp"

namespace tripwire::runtime {
namespace {

// Exact types whose equality implies equal hashes and whose hash runs no user code. float is
// left out: EQUALS_MATCH treats NaN as equal to NaN, but NaNs hash by identity.
bool hashable_scalar(PyObject* o) {
    PyTypeObject* t = Py_TYPE(o);
    return t == &PyLong_Type || t == &PyUnicode_Type || t == &PyBytes_Type || t == &PyBool_Type ||
           o == Py_None;
}

// The length of `o` when reading it runs no user code (exact containers and strings): these
// lengths are what LENGTH sees, deterministically. False for every other type.
bool plain_length(PyObject* o, Py_ssize_t& n) {
    if (PyList_CheckExact(o) || PyTuple_CheckExact(o) || PyBytes_CheckExact(o)) {
        n = Py_SIZE(o);
        return true;
    }
    if (PyDict_CheckExact(o)) {
        n = PyDict_GET_SIZE(o);
        return true;
    }
    if (PyUnicode_CheckExact(o)) {
        n = PyUnicode_GET_LENGTH(o);
        return true;
    }
    return false;
}

// How selective a key kind is (higher: fewer entries share a key): value, identity, length, type.
constexpr int kKindRank[] = {0, 2, 3, 1};

}  // namespace

Cache::Cache(std::size_t recompile_limit, std::size_t accumulated_limit, OnLimit on_limit,
             GuardSetResolver resolver)
    : recompile_limit_(recompile_limit),
      accumulated_limit_(accumulated_limit),
      on_limit_(on_limit),
      resolver_(resolver),
      seen_epoch_(invalidation_epoch()) {}

Cache::~Cache() { clear(); }

bool Cache::add_probe(PyObject* fn, std::string name) {
    if (!order_.empty()) return false;
    probes_.push_back(Ref::borrow(fn));
    probe_names_.push_back(std::move(name));
    return true;
}

Ref Cache::probe_values() {
    Ref t = Ref::steal(PyTuple_New(static_cast<Py_ssize_t>(probes_.size())));
    if (!t) return Ref();
    // Copy the callables: a probe may add another probe through the cache (re-entrancy).
    const std::vector<Ref> probes = probes_;
    for (std::size_t i = 0; i < probes.size(); ++i) {
        PyObject* v = PyObject_CallNoArgs(probes[i].get());
        if (v == nullptr) return Ref();
        PyTuple_SET_ITEM(t.get(), static_cast<Py_ssize_t>(i), v);
    }
    return t;
}

int Cache::snapshot_matches(const CacheEntry& e, PyObject* current) {
    if (!e.snapshot) return 1;
    if (e.snapshot.get() == current) return 1;
    // A probe added later than this entry's snapshot cannot happen (add_probe needs an empty
    // cache), so sizes always agree; equals_match compares them structurally and type-exactly.
    return equals_match(current, e.snapshot.get());
}

bool Cache::entry_valid(const CacheEntry& e) const {
    if (!e.in_cache) return false;
    return e.gs && !e.gs->invalid();
}

void Cache::remove(const EntryPtr& e, std::vector<EntryPtr>& graveyard) {
    if (!e->in_cache) return;
    order_.erase(e->pos);
    e->in_cache = false;
    graveyard.push_back(e);
    // Drop the index now, not at the next lookup: its buckets would otherwise keep the removed
    // entry's payload alive (and hidden from the cycle collector, which sees only order_).
    // Every other entry is still owned by order_, so this runs no Python code.
    buckets_.clear();
    unindexed_.clear();
    index_dirty_ = true;
}

void Cache::purge_invalid(std::vector<EntryPtr>& graveyard) {
    const std::uint64_t epoch = invalidation_epoch();
    if (epoch == seen_epoch_) return;
    seen_epoch_ = epoch;
    std::vector<EntryPtr> dead;
    for (const EntryPtr& e : order_)
        if (!entry_valid(*e)) dead.push_back(e);
    for (const EntryPtr& e : dead) {
        remove(e, graveyard);
        ++stats_.invalidations;
    }
}

void Cache::touch(const EntryPtr& e) {
    e->stamp = ++clock_;
    if (e->in_cache) order_.splice(order_.begin(), order_, e->pos);
}

bool Cache::entry_key(const CacheEntry& e, const std::string& text, Key& out) const {
    GuardSet* gs = e.gs.get();
    if (gs == nullptr) return false;
    const core::Program& p = gs->program();
    bool found = false;
    int best = -1;  // the most selective key (kKindRank)
    for (std::uint32_t ni : p.roots) {
        const core::Node& n = p.nodes[ni];
        if (!n.is_root || n.root != core::RootKind::Local || n.text != text) continue;
        for (std::uint32_t k = n.guard_begin; k < n.guard_end; ++k) {
            const core::GuardDecl& d = p.guards[p.node_guards[k]];
            PyObject* c = d.operand == core::kNoConst ? nullptr : gs->constant(d.operand);
            if (c == nullptr && d.kind != core::GuardKind::Length) continue;  // no operand, or dead
            Key key;
            if (d.kind == core::GuardKind::TypeMatch) {
                key = {0, reinterpret_cast<std::uintptr_t>(c), 0};
            } else if (d.kind == core::GuardKind::IdMatch) {
                key = {1, reinterpret_cast<std::uintptr_t>(c), 0};
            } else if (d.kind == core::GuardKind::Length) {
                key = {3, 0, static_cast<std::intptr_t>(d.n)};
            } else if (d.kind == core::GuardKind::EqualsMatch && hashable_scalar(c)) {
                const Py_hash_t h = PyObject_Hash(c);
                if (h == -1) {
                    PyErr_Clear();
                    continue;
                }
                key = {2, reinterpret_cast<std::uintptr_t>(Py_TYPE(c)), static_cast<std::intptr_t>(h)};
            } else {
                continue;
            }
            if (kKindRank[key.kind] > best) {
                best = kKindRank[key.kind];
                out = key;
                found = true;
            }
        }
    }
    return found;
}

void Cache::rebuild_index() {
    index_dirty_ = false;
    buckets_.clear();
    unindexed_.clear();
    index_text_.clear();
    index_name_ = Ref();
    index_kinds_ = 0;
    if (order_.size() < 2) return;
    // The root local on which the most entries carry an indexable guard.
    std::unordered_map<std::string, std::size_t> counts;
    std::string best;
    std::size_t best_count = 0;
    PyObject* best_name = nullptr;
    for (const EntryPtr& e : order_) {
        GuardSet* gs = e->gs.get();
        if (gs == nullptr) continue;
        const core::Program& p = gs->program();
        for (std::uint32_t ni : p.roots) {
            const core::Node& n = p.nodes[ni];
            if (!n.is_root || n.root != core::RootKind::Local) continue;
            Key k;
            if (!entry_key(*e, n.text, k)) continue;
            const std::size_t c = ++counts[n.text];
            if (c > best_count) {
                best_count = c;
                best = n.text;
                best_name = gs->constant(n.root_name);
            }
        }
    }
    if (best_count < 2 || best_name == nullptr || !PyUnicode_CheckExact(best_name)) return;
    index_text_ = best;
    index_name_ = Ref::borrow(best_name);
    for (const EntryPtr& e : order_) {
        Key k;
        if (entry_key(*e, index_text_, k)) {
            buckets_[k].push_back(e);
            index_kinds_ |= static_cast<std::uint8_t>(1U << k.kind);
        } else {
            unindexed_.push_back(e);
        }
    }
}

const std::string& Cache::index_source() {
    if (index_dirty_) rebuild_index();
    return index_text_;
}

void Cache::collect_candidates(const Frame& frame, std::vector<EntryPtr>& out) {
    out.clear();
    PyObject* v = nullptr;
    if (!index_text_.empty()) {
        if (frame.is_arguments()) {
            v = frame.argument(index_name_.get(), &index_slot_);  // the caller keeps it alive
        } else if (PyDict_CheckExact(frame.locals)) {
            v = PyDict_GetItemWithError(frame.locals, index_name_.get());
            if (v == nullptr) PyErr_Clear();  // missing or raised: the ordered scan decides
        }
    }
    if (v == nullptr) {
        out.assign(order_.begin(), order_.end());
        return;
    }
    // No user code runs from here to the end: `v` is borrowed from the dict and stays alive.
    auto add = [&](const Key& k) {
        auto it = buckets_.find(k);
        if (it != buckets_.end()) out.insert(out.end(), it->second.begin(), it->second.end());
    };
    if (index_kinds_ & 1U) add({0, reinterpret_cast<std::uintptr_t>(Py_TYPE(v)), 0});
    if (index_kinds_ & 2U) add({1, reinterpret_cast<std::uintptr_t>(v), 0});
    if ((index_kinds_ & 4U) && hashable_scalar(v)) {
        const Py_hash_t h = PyObject_Hash(v);
        if (h == -1) {
            PyErr_Clear();
            out.assign(order_.begin(), order_.end());
            return;
        }
        add({2, reinterpret_cast<std::uintptr_t>(Py_TYPE(v)), static_cast<std::intptr_t>(h)});
    }
    if (index_kinds_ & 8U) {
        // A LENGTH guard on a type whose __len__ is user code may pass at any length: scan.
        Py_ssize_t n = 0;
        if (!plain_length(v, n)) {
            out.assign(order_.begin(), order_.end());
            return;
        }
        add({3, 0, static_cast<std::intptr_t>(n)});
    }
    out.insert(out.end(), unindexed_.begin(), unindexed_.end());
    // Most recently used first, as the ordered scan would try them.
    if (out.size() > 1) {
        std::sort(out.begin(), out.end(),
                  [](const EntryPtr& a, const EntryPtr& b) { return a->stamp > b->stamp; });
    }
}

int Cache::try_entry(const EntryPtr& c, const Frame& frame, PyObject* current, SnapshotMemo& memo) {
    if (!c->in_cache) return 0;  // removed by another thread while we were checking
    if (current != nullptr) {
        // Entries inserted under the same ambient state share one snapshot object.
        if (memo.owner == nullptr || memo.owner->snapshot.get() != c->snapshot.get()) {
            memo.ok = snapshot_matches(*c, current);
            if (memo.ok < 0) return -1;
            memo.owner = c.get();
        }
        if (memo.ok == 0) return 0;
    }
    GuardSet* gs = c->gs.get();
    if (gs->invalid()) return 0;
    return gs->check(frame);
}

bool Cache::lookup(const Frame& frame, EntryPtr& out, bool count) {
    out.reset();
    std::vector<EntryPtr> graveyard;  // released last, after the structures are consistent
    purge_invalid(graveyard);
    if (index_dirty_) rebuild_index();
    Ref current;
    if (!probes_.empty()) {
        current = probe_values();
        if (!current) return false;
    }
    SnapshotMemo memo;
    const CacheEntry* tried = nullptr;
    if (index_text_.empty() && !order_.empty()) {
        // Without an index the scan tries the most recently used entry first; trying it before
        // copying the candidate list makes the common repeated hit allocation-free.
        EntryPtr front = order_.front();  // our own reference: a guard may run user code
        const int r = try_entry(front, frame, current.get(), memo);
        if (r < 0) return false;
        if (r == 1) {
            record_hit(front, count);
            out = std::move(front);
            return true;
        }
        tried = front.get();
    }
    std::vector<EntryPtr> candidates;
    collect_candidates(frame, candidates);
    for (const EntryPtr& c : candidates) {
        if (c.get() == tried) continue;
        const int r = try_entry(c, frame, current.get(), memo);
        if (r < 0) return false;
        if (r == 1) {
            record_hit(c, count);
            out = c;
            return true;
        }
    }
    if (count) ++stats_.misses;
    return true;
}

void Cache::record_hit(const EntryPtr& e, bool count) {
    touch(e);
    if (!count) return;
    ++e->hits;
    ++stats_.hits;
}

bool Cache::insert(PyObject* guards, PyObject* payload, PyObject* name, InsertResult& result) {
    std::shared_ptr<GuardSet> gs = resolver_(guards);
    if (!gs) {
        PyErr_SetString(PyExc_TypeError, "Cache.insert: guards must be a tripwire.GuardSet");
        return false;
    }
    if (gs->invalid()) {
        PyErr_Format(PyExc_ValueError, "Cache.insert: the guard set is already invalid (%s)",
                     gs->invalid_reason().c_str());
        return false;
    }
    Ref snapshot;
    if (!probes_.empty()) {
        snapshot = probe_values();
        if (!snapshot) return false;
    }
    std::vector<EntryPtr> graveyard;
    purge_invalid(graveyard);
    if (snapshot && !order_.empty()) {
        // Share the snapshot object with the most recent entry when equal: lookup compares each
        // distinct snapshot object once.
        const int same = snapshot_matches(*order_.front(), snapshot.get());
        if (same < 0) PyErr_Clear();
        if (same == 1) snapshot = order_.front()->snapshot;
    }

    auto e = std::make_shared<CacheEntry>();
    e->guards = Ref::borrow(guards);
    e->gs = gs;
    e->payload = Ref::borrow(payload);
    e->name = Ref::borrow(name);
    e->snapshot = snapshot;
    for (const core::GuardDecl& d : gs->program().guards) {
        if (d.kind != core::GuardKind::IdMatch || d.operand == core::kNoConst) continue;
        const std::string text =
            d.has_source && !d.source.texts.empty() ? d.source.texts.back() : std::string();
        e->id_key.emplace_back(text, reinterpret_cast<std::uintptr_t>(gs->constant(d.operand)));
    }
    std::sort(e->id_key.begin(), e->id_key.end());

    // recompile_limit: entries with the same ID_MATCH'd objects (Dynamo's rule).
    auto same_group = [&] {
        std::size_t n = 0;
        for (const EntryPtr& x : order_) n += x->id_key == e->id_key ? 1 : 0;
        return n;
    };
    while (same_group() >= recompile_limit_) {
        if (on_limit_ != OnLimit::Evict) {
            result = InsertResult::RecompileLimit;
            return true;
        }
        for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
            if ((*it)->id_key == e->id_key) {
                const EntryPtr victim = *it;
                remove(victim, graveyard);
                ++stats_.evictions;
                break;
            }
        }
    }
    while (order_.size() >= accumulated_limit_) {
        if (on_limit_ != OnLimit::Evict) {
            result = InsertResult::AccumulatedLimit;
            return true;
        }
        const EntryPtr victim = order_.back();
        remove(victim, graveyard);
        ++stats_.evictions;
    }
    e->stamp = ++clock_;
    order_.push_front(e);
    e->pos = order_.begin();
    if (stats_.inserts++ > 0) ++stats_.recompiles;
    index_dirty_ = true;
    result = InsertResult::Inserted;
    return true;
}

std::vector<EntryPtr> Cache::entries() {
    std::vector<EntryPtr> graveyard;
    purge_invalid(graveyard);
    return {order_.begin(), order_.end()};
}

std::size_t Cache::size() {
    std::vector<EntryPtr> graveyard;
    purge_invalid(graveyard);
    return order_.size();
}

void Cache::clear() {
    // Move everything out first: releasing payloads may run code that uses this cache.
    std::list<EntryPtr> old;
    old.swap(order_);
    for (const EntryPtr& e : old) e->in_cache = false;
    std::unordered_map<Key, std::vector<EntryPtr>, KeyHash> old_buckets;
    old_buckets.swap(buckets_);
    std::vector<EntryPtr> old_unindexed;
    old_unindexed.swap(unindexed_);
    index_dirty_ = true;
}

int Cache::traverse(visitproc visit, void* arg) const {
    for (const EntryPtr& e : order_) {
        Py_VISIT(e->guards.get());
        Py_VISIT(e->payload.get());
        Py_VISIT(e->name.get());
        Py_VISIT(e->snapshot.get());
    }
    for (const Ref& p : probes_) Py_VISIT(p.get());
    return 0;
}

}  // namespace tripwire::runtime
