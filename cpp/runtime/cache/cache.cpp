// tripwire/cpp/runtime/cache/cache.cpp -- Cache: entries, dispatch index, probes; policy in core.
//
// See cache.hpp for the design. The invariant that keeps the index correct: an entry is put in
// the bucket of key K only if every value that passes its guards on the index source has key K
// (TYPE_MATCH: the exact type; ID_MATCH: the object; EQUALS_MATCH on an exact int/str/bytes/
// bool/None/float: the value's type and hash, which EQUALS_MATCH's type-exact equality
// preserves, with every NaN under one key since NaN matches NaN; LENGTH: the length, but only
// for values whose length runs no user code, so lookup scans every entry when such an index
// meets any other value). The index value is fetched with the same fetch_step as the guards,
// and only along steps that run no user code for the values met, so it is the value the guards
// see. Every candidate is still checked in full, so a hash collision costs time, never a false
// hit.
#include "runtime/cache/cache.hpp"

#include "core/kind_data.hpp"
#include "runtime/tensors/readers.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <unordered_set>

#include "runtime/eval/dict_hint.hpp"
#include "runtime/eval/guard_kinds.hpp"

namespace tripwire::runtime {
namespace {

// Exact types whose equality implies equal hashes and whose hash runs no user code.
bool hashable_scalar(PyObject* o) {
    PyTypeObject* t = Py_TYPE(o);
    return t == &PyLong_Type || t == &PyUnicode_Type || t == &PyBytes_Type || t == &PyBool_Type ||
           o == Py_None;
}

// The key part of a NaN: EQUALS_MATCH matches any NaN with any NaN, but NaNs hash by identity
// (3.10+), so all of them share this value. A real float hashing to it only shares a bucket.
constexpr std::intptr_t kNanHash = 0x7ff8;

// The value key of an EQUALS_MATCH-able scalar (exact int/str/bytes/bool/None/float), false
// for any other value. 0.0 and -0.0 hash alike and so share a bucket; the entries' own checks
// tell them apart (EQUALS_MATCH compares the sign of a zero).
bool value_key(PyObject* o, DispatchKey& out) {
    std::intptr_t h = 0;
    if (PyFloat_CheckExact(o)) {
        const double d = PyFloat_AS_DOUBLE(o);
        h = std::isnan(d) ? kNanHash : static_cast<std::intptr_t>(PyObject_Hash(o));
    } else if (hashable_scalar(o)) {
        const Py_hash_t ph = PyObject_Hash(o);
        if (ph == -1) {
            PyErr_Clear();
            return false;
        }
        h = static_cast<std::intptr_t>(ph);
    } else {
        return false;
    }
    out = {2, reinterpret_cast<std::uintptr_t>(Py_TYPE(o)), h};
    return true;
}

// Whether getattr(obj, name) reads only the instance dict, a plain class attribute, a __slots__
// member or a module's dict: no property, no __getattr__, no __getattribute__, no descriptor.
bool plain_attribute(PyObject* obj, PyObject* name) {
    if (PyModule_CheckExact(obj)) {
        // Found in the module dict: no module __getattr__ runs.
        PyObject* v = PyDict_GetItemWithError(PyModule_GetDict(obj), name);
        if (v == nullptr) PyErr_Clear();
        return v != nullptr;
    }
    PyTypeObject* tp = Py_TYPE(obj);
    if (tp->tp_getattro != PyObject_GenericGetAttr) return false;
    PyObject* descr = _PyType_Lookup(tp, name);  // borrowed; an MRO walk, no user code
    if (descr == nullptr) return true;
    PyTypeObject* dt = Py_TYPE(descr);
    return dt->tp_descr_get == nullptr || dt == &PyMemberDescr_Type;
}

// Whether fetch_step(step, parent) runs no user code for this parent: the core's purity table
// for the step kind, else the cases fetch_step serves from built-in structures. A dict lookup
// with an exact scalar key may still compare with a stored key of a user type whose hash
// collides; the f_locals lookup of a root takes the same (accepted) risk, and the caller
// checks afterwards that the cache was not changed meanwhile.
bool pure_step(const RuntimeStep& step, PyObject* parent) {
    using core::StepKind;
    if (!core::step_runs_user_code(step.kind)) return true;
    switch (step.kind) {
        case StepKind::Attr: return plain_attribute(parent, step.operand);
        case StepKind::Item:
            if (PyDict_CheckExact(parent)) return hashable_scalar(step.operand);
            return (PyList_CheckExact(parent) || PyTuple_CheckExact(parent)) &&
                   PyLong_CheckExact(step.operand);
        case StepKind::DictItem: return PyDict_Check(parent) && hashable_scalar(step.operand);
        case StepKind::Defaults:
        case StepKind::KwDefaults:
        case StepKind::Code:
        case StepKind::ClosureCell: return PyFunction_Check(parent) != 0;
        // The interpreter's own getter; it may create the dict (an allocation), which is safe
        // here: the index fetch holds a reference to every value on its path, and the caller
        // checks that the cache was not changed meanwhile.
        case StepKind::Dict: return true;
        default: return false;
    }
}

// How selective a key kind is (higher: fewer entries share a key): value and shape, identity,
// length, type.
constexpr int kKindRank[] = {0, 2, 3, 1, 3};

// A key for a tensor's or an array's exact type and sizes (DispatchKey kind 4).
std::intptr_t shape_hash(const std::int64_t* sizes, std::int64_t ndim, std::size_t stride) {
    std::uint64_t h = 0x9E3779B97F4A7C15ULL ^ static_cast<std::uint64_t>(ndim);
    for (std::int64_t i = 0; i < ndim; ++i) {
        h ^= static_cast<std::uint64_t>(sizes[static_cast<std::size_t>(i) * stride]) + 0x9E3779B97F4A7C15ULL +
             (h << 6) + (h >> 2);
    }
    return static_cast<std::intptr_t>(h);
}

// The shape key a TENSOR_MATCH or ARRAY_MATCH guard imposes: when every size is checked, its
// value must have exactly these sizes and this type.
bool shape_key(const core::GuardDecl& d, PyObject* type, DispatchKey& out) {
    // The two layouts' constants are enumerators of two enums: each is made a size_t before one is chosen.
    const bool tensor = d.kind == core::GuardKind::TensorMatch;
    const std::size_t header =
        tensor ? std::size_t{core::tensor_data::kHeader} : std::size_t{core::array_data::kHeader};
    const std::int64_t ndim =
        d.data[tensor ? std::size_t{core::tensor_data::kNdim} : std::size_t{core::array_data::kNdim}];
    const std::int64_t* sizes = d.data.data() + header;
    for (std::int64_t i = 0; i < ndim; ++i) {
        if (sizes[2 * i] == core::kAny) return false;  // a dynamic dimension: not indexed
    }
    out = {4, reinterpret_cast<std::uintptr_t>(type), shape_hash(sizes, ndim, 2)};
    return true;
}

// Candidate lists reused across lookups on this thread, one per nesting level (a guard's user
// code may look a cache up again, and releasing a candidate may run a finalizer that does).
// Each level is its own heap object, so a nested lookup growing the pool moves no list in use.
thread_local std::vector<std::unique_ptr<std::vector<EntryPtr>>> t_candidate_pool;
thread_local std::size_t t_candidate_depth = 0;

}  // namespace

Cache::CandidateList::CandidateList() : level_(t_candidate_depth++) {
    if (t_candidate_pool.size() <= level_)
        t_candidate_pool.push_back(std::make_unique<std::vector<EntryPtr>>());
}

Cache::CandidateList::~CandidateList() {
    // Released while this level is still taken: a finalizer run by the last reference to an
    // entry may look a cache up, and uses the next level.
    t_candidate_pool[level_]->clear();
    --t_candidate_depth;
}

std::vector<EntryPtr>& Cache::CandidateList::get() const { return *t_candidate_pool[level_]; }

Cache::Cache(std::size_t recompile_limit, std::size_t accumulated_limit, OnLimit on_limit)
    : policy_(recompile_limit, accumulated_limit, on_limit), seen_epoch_(invalidation_epoch()) {}

Cache::~Cache() { clear(); }

bool Cache::add_probe(PyObject* fn, std::string name) {
    if (!policy_.empty()) return false;
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

Ref Cache::snapshot_of(PyObject* values) const {
    // A probe returning a mutable object (a config dict) would otherwise share it with the
    // snapshot, which would then change with it and match forever. Probe values must be
    // constants, as a GLOBAL_STATE probe's must, and are deep-copied like EQUALS constants.
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(values); ++i) {
        PyObject* v = PyTuple_GET_ITEM(values, i);
        const int r = is_constant(v);
        if (r < 0) return Ref();
        if (r == 0) {
            const std::size_t k = static_cast<std::size_t>(i);
            PyErr_Format(PyExc_TypeError,
                         "Cache probe %s returned %R, which is not a constant (int, float, complex, str, "
                         "bytes, bool, None, range, slice, Ellipsis, enum members, and containers of these)",
                         k < probe_names_.size() ? probe_names_[k].c_str() : "?", v);
            return Ref();
        }
    }
    static PyObject* deepcopy = [] {
        PyObject* copy = PyImport_ImportModule("copy");
        PyObject* fn = copy != nullptr ? PyObject_GetAttrString(copy, "deepcopy") : nullptr;
        Py_XDECREF(copy);
        return fn;  // held for the life of the interpreter
    }();
    if (deepcopy == nullptr) return Ref();
    return Ref::steal(PyObject_CallOneArg(deepcopy, values));
}

int Cache::snapshot_matches(const CacheEntry& e, PyObject* current) {
    if (!e.snapshot) return 1;
    if (e.snapshot.get() == current) return 1;
    // A probe added later than this entry's snapshot cannot happen (add_probe needs an empty
    // cache), so sizes always agree; equals_match compares them structurally and type-exactly.
    return equals_match(current, e.snapshot.get());
}

void Cache::drop_index() {
    // Drop the index now, not at the next lookup: its buckets would otherwise keep a removed
    // entry's payload alive (and hidden from the cycle collector, which sees only by_id_).
    // Every entry is still owned by by_id_ or a graveyard, so this runs no Python code.
    buckets_.clear();
    unindexed_.clear();
    index_dirty_ = true;
}

void Cache::remove(const EntryPtr& e, std::vector<EntryPtr>& graveyard) {
    if (!e->in_cache) return;
    policy_.remove(e->id);
    by_id_.erase(e->id);
    e->in_cache = false;
    graveyard.push_back(e);
    ++mutations_;
    if (front_ == e) front_ = policy_.empty() ? EntryPtr() : by_id_.at(policy_.order().front());
    drop_index();
}

void Cache::purge_invalid(std::vector<EntryPtr>& graveyard) {
    const std::uint64_t epoch = invalidation_epoch();
    if (epoch == seen_epoch_) return;
    seen_epoch_ = epoch;
    std::vector<EntryPtr> dead;
    for (const auto& [id, e] : by_id_)
        if (!e->valid()) dead.push_back(e);
    for (const EntryPtr& e : dead) {
        remove(e, graveyard);
        ++stats_.invalidations;
    }
}

void Cache::touch(const EntryPtr& e) {
    if (!e->in_cache) return;             // removed by another thread while it was being checked
    if (front_.get() == e.get()) return;  // already the most recently used: nothing changes
    e->stamp = policy_.touch(e->id);
    front_ = e;
}

void Cache::describe_entry(CacheEntry& e) const {
    GuardSet* gs = e.gs.get();
    const core::Program& p = gs->program();
    // recompile_limit group: ID_MATCH'd objects reached from the frame's locals only (Dynamo's
    // rule); an ID_MATCH on a global or closure value does not give an entry its own budget.
    std::vector<std::pair<std::string, std::uintptr_t>> ids;
    for (const core::GuardDecl& d : p.guards) {
        if (d.kind != core::GuardKind::IdMatch || d.operand == core::kNoConst) continue;
        if (!d.has_source || d.source.root != core::RootKind::Local || d.source.texts.empty()) continue;
        ids.emplace_back(d.source.texts.back(), reinterpret_cast<std::uintptr_t>(gs->constant(d.operand)));
    }
    std::sort(ids.begin(), ids.end());
    e.group.clear();
    for (const auto& [text, obj] : ids) {
        char buf[2 + 2 * sizeof(std::uintptr_t) + 1];
        std::snprintf(buf, sizeof buf, "%jx", static_cast<std::uintmax_t>(obj));
        e.group += text;
        e.group += '=';
        e.group += buf;
        e.group += '\n';
    }

    // Index keys: per source rooted at a local (or at a global when the globals dict is known),
    // the most selective key its guards impose.
    e.index_keys.clear();
    for (std::uint32_t ni = 0; ni < p.nodes.size(); ++ni) {
        const core::Node& n = p.nodes[ni];
        std::uint32_t root = ni;
        std::string kinds;
        while (!p.nodes[root].is_root) {
            kinds.insert(kinds.begin(), static_cast<char>('a' + static_cast<int>(p.nodes[root].step.kind)));
            root = p.nodes[root].parent;
        }
        const core::RootKind rk = p.nodes[root].root;
        if (rk == core::RootKind::Closure) continue;  // cells are per guard set
        if (rk == core::RootKind::Global && !e.globals) continue;
        bool found = false;
        int best = -1;
        DispatchKey best_key;
        for (std::uint32_t k = n.guard_begin; k < n.guard_end; ++k) {
            const core::GuardDecl& d = p.guards[p.node_guards[k]];
            PyObject* c = d.operand == core::kNoConst ? nullptr : gs->constant(d.operand);
            if (c == nullptr && d.kind != core::GuardKind::Length) continue;  // no operand, or dead
            DispatchKey key;
            if (d.kind == core::GuardKind::TypeMatch) {
                key = {0, reinterpret_cast<std::uintptr_t>(c), 0};
            } else if (d.kind == core::GuardKind::IdMatch) {
                key = {1, reinterpret_cast<std::uintptr_t>(c), 0};
            } else if (d.kind == core::GuardKind::Length) {
                key = {3, 0, static_cast<std::intptr_t>(d.n)};
            } else if (d.kind == core::GuardKind::TensorMatch || d.kind == core::GuardKind::ArrayMatch) {
                if (!shape_key(d, c, key)) continue;
            } else if (d.kind != core::GuardKind::EqualsMatch || d.flag || !value_key(c, key)) {
                // python_eq compares with Python's == (True == 1): no exact value key
                continue;
            }
            if (kKindRank[key.kind] > best) {
                best = kKindRank[key.kind];
                best_key = key;
                found = true;
            }
        }
        if (!found) continue;
        std::string sig = n.text;
        sig += '\x1f';
        sig += kinds;
        if (rk == core::RootKind::Global) {
            char buf[2 + 2 * sizeof(std::uintptr_t) + 1];
            std::snprintf(buf, sizeof buf, "%jx",
                          static_cast<std::uintmax_t>(reinterpret_cast<std::uintptr_t>(e.globals.get())));
            sig += '\x1f';
            sig += buf;
        }
        e.index_keys.push_back({std::move(sig), best_key, ni});
    }
}

void Cache::rebuild_index() {
    index_dirty_ = false;
    ++mutations_;      // the buckets move: pointers into them (lookup's few candidates) are stale
    buckets_.clear();  // every entry is still owned by by_id_: nothing is released here
    unindexed_.clear();
    index_text_.clear();
    index_signature_.clear();
    // Released when this function returns, once the new index is consistent: dropping the last
    // reference to a globals dict or a key can run finalizers, which may use this cache.
    const std::shared_ptr<IndexPath> old_path = std::move(index_path_);
    index_kinds_ = 0;
    if (policy_.size() < 2) return;
    // The source whose keys tell the most entries apart: the most distinct keys, then the most
    // entries keyed (ties: the first to get there, in MRU order). A source every entry keys
    // alike (all TYPE_MATCH int, say) narrows nothing and is never chosen.
    struct Score {
        std::unordered_set<DispatchKey, KeyHash> keys;
        std::size_t entries = 0;
        const EntryIndexKey* first = nullptr;
        const CacheEntry* first_entry = nullptr;
        std::size_t rank = 0;  // order of first appearance
    };
    std::unordered_map<std::string, Score> scores;
    for (core::CacheEntryId id : policy_.order()) {
        const CacheEntry& e = *by_id_.at(id);
        for (const EntryIndexKey& k : e.index_keys) {
            Score& sc = scores[k.signature];
            if (sc.first == nullptr) {
                sc.first = &k;
                sc.first_entry = &e;
                sc.rank = scores.size();
            }
            sc.keys.insert(k.key);
            ++sc.entries;
        }
    }
    const Score* best_score = nullptr;
    for (const auto& [sig, sc] : scores) {
        if (sc.keys.size() < 2) continue;
        if (best_score == nullptr || sc.keys.size() > best_score->keys.size() ||
            (sc.keys.size() == best_score->keys.size() &&
             (sc.entries > best_score->entries ||
              (sc.entries == best_score->entries && sc.rank < best_score->rank))))
            best_score = &sc;
    }
    if (best_score == nullptr) return;
    const EntryIndexKey* best = best_score->first;
    const CacheEntry* best_entry = best_score->first_entry;
    // The fetch path from the root, with operands from one entry's pool (held here: the entry
    // may be removed while the index lives).
    const GuardSet& gs = *best_entry->gs;
    const core::Program& p = gs.program();
    std::vector<std::uint32_t> path;
    for (std::uint32_t ni = best->node; !p.nodes[ni].is_root; ni = p.nodes[ni].parent) path.push_back(ni);
    std::uint32_t root = best->node;
    while (!p.nodes[root].is_root) root = p.nodes[root].parent;
    PyObject* name = gs.constant(p.nodes[root].root_name);
    if (name == nullptr || !PyUnicode_CheckExact(name)) return;
    auto fetch = std::make_shared<IndexPath>();
    for (auto it = path.rbegin(); it != path.rend(); ++it) {
        const core::Step& st = p.nodes[*it].step;
        RuntimeStep rs;
        rs.kind = st.kind;
        rs.index = static_cast<Py_ssize_t>(st.index);
        if (st.operand != core::kNoConst) {
            rs.operand = gs.constant(st.operand);
            if (rs.operand == nullptr) return;  // a dead weakly held key: the set is invalid anyway
            fetch->operands.push_back(Ref::borrow(rs.operand));
        }
        fetch->steps.push_back(rs);
    }
    fetch->root = p.nodes[root].root;
    if (fetch->root == core::RootKind::Global) {
        if (!best_entry->globals || !PyDict_Check(best_entry->globals.get())) return;
        fetch->globals = best_entry->globals;
    }
    fetch->name = Ref::borrow(name);
    index_signature_ = best->signature;
    index_text_ = p.nodes[best->node].text;
    index_path_ = std::move(fetch);
    for (core::CacheEntryId id : policy_.order()) {
        const EntryPtr& e = by_id_.at(id);
        const EntryIndexKey* k = nullptr;
        for (const EntryIndexKey& x : e->index_keys) {
            if (x.signature == index_signature_) k = &x;
        }
        if (k != nullptr) {
            buckets_[k->key].push_back(e);
            index_kinds_ |= static_cast<std::uint8_t>(1U << k->key.kind);
        } else {
            unindexed_.push_back(e);
        }
    }
}

const std::string& Cache::index_source() {
    if (index_dirty_) rebuild_index();
    return index_text_;
}

Ref Cache::fetch_index_value(const Locals& locals) {
    // Our own reference: a step may run user code that rebuilds the index (see IndexPath).
    const std::shared_ptr<IndexPath> path = index_path_;
    if (!path) return Ref();
    PyObject* root = nullptr;
    if (path->root == core::RootKind::Global) {
        root = PyDict_GetItemWithError(path->globals.get(), path->name.get());
    } else if (locals.is_arguments()) {
        root = locals.argument(path->name.get(), &path->slot);  // the caller keeps it alive
    } else if (PyDict_CheckExact(locals.mapping)) {
        root = PyDict_GetItemWithError(locals.mapping, path->name.get());
    }
    if (root == nullptr) {
        PyErr_Clear();  // missing or raised: the ordered scan decides
        return Ref();
    }
    // Our own reference to every value on the path: nothing below may be freed under us.
    Ref v = Ref::borrow(root);
    for (RuntimeStep& step : path->steps) {
        if (!pure_step(step, v.get())) return Ref();
        const Fetched f = fetch_step(step, v.get());
        if (f.status != FetchStatus::Ok) {
            if (f.status == FetchStatus::Error) PyErr_Clear();
            return Ref();
        }
        v = f.owned ? Ref::steal(f.value) : Ref::borrow(f.value);
    }
    return v;
}

void Cache::all_entries(std::vector<EntryPtr>& out) const {
    out.clear();
    out.reserve(policy_.size());
    for (core::CacheEntryId id : policy_.order()) out.push_back(by_id_.at(id));
}

template <typename Add>
bool Cache::bucket_entries(PyObject* o, Add add) {
    // No user code: hashes of exact int/str/bytes/bool/None/float, field lengths, map lookups.
    auto add_bucket = [&](const DispatchKey& k) {
        auto it = buckets_.find(k);
        if (it != buckets_.end())
            for (const EntryPtr& e : it->second) add(e);
    };
    if (index_kinds_ & 1U) add_bucket({0, reinterpret_cast<std::uintptr_t>(Py_TYPE(o)), 0});
    if (index_kinds_ & 2U) add_bucket({1, reinterpret_cast<std::uintptr_t>(o), 0});
    if (index_kinds_ & 4U) {
        DispatchKey k;
        if (value_key(o, k)) add_bucket(k);
    }
    if (index_kinds_ & 8U) {
        // A LENGTH guard on a type whose __len__ is user code may pass at any length: scan.
        Py_ssize_t n = 0;
        if (!builtin_length(o, n)) return false;
        add_bucket({3, 0, static_cast<std::intptr_t>(n)});
    }
    if (index_kinds_ & 16U) {
        // A tensor or array read without user code (the adapter, the numpy struct); anything
        // else (a tensor without the adapter, another value) scans, which is always sound.
        ShapeView shape;
        if (read_shape(o, shape) != ShapeRead::Ok) return false;
        add_bucket({4, reinterpret_cast<std::uintptr_t>(Py_TYPE(o)), shape_hash(shape.sizes, shape.ndim, 1)});
    }
    for (const EntryPtr& e : unindexed_) add(e);
    return true;
}

bool Cache::few_candidates(const Locals& locals, const EntryPtr** out, std::size_t& n) {
    n = 0;
    IndexPath* path = index_path_.get();
    if (path == nullptr || !path->steps.empty() || unindexed_.size() >= kFewCandidates) return false;
    // The root, read without user code (a dict of str keys, or an argument), borrowed: nothing
    // runs until the candidates are collected.
    PyObject* root = nullptr;
    if (path->root == core::RootKind::Global) {
        root = dict_get_pure(path->globals.get(), path->name.get(), &path->hint);
    } else if (locals.is_arguments()) {
        root = locals.argument(path->name.get(), &path->slot);
    } else if (PyDict_Check(locals.mapping)) {
        root = dict_get_pure(locals.mapping, path->name.get(), &path->hint);
    }
    if (root == nullptr) return false;
    bool fits = true;
    const bool scanned = bucket_entries(root, [&](const EntryPtr& e) {
        if (n < kFewCandidates) {
            out[n++] = &e;
        } else {
            fits = false;
        }
    });
    if (!scanned || !fits) return false;
    // Most recently used first, as the ordered scan would try them (insertion sort: few).
    for (std::size_t i = 1; i < n; ++i) {
        for (std::size_t j = i; j > 0 && (*out[j - 1])->stamp < (*out[j])->stamp; --j) {
            std::swap(out[j - 1], out[j]);
        }
    }
    return true;
}

void Cache::collect_candidates(const Locals& locals, std::vector<EntryPtr>& out) {
    out.clear();
    Ref v;
    if (index_path_) {
        const std::uint64_t before = mutations_;
        v = fetch_index_value(locals);
        // A dict lookup met a user key's __eq__ that changed this cache: the buckets are gone.
        if (mutations_ != before || index_dirty_) v = Ref();
    }
    if (!v) {
        all_entries(out);
        return;
    }
    // No user code runs from here to the end, and `v` is our own reference.
    if (!bucket_entries(v.get(), [&](const EntryPtr& e) { out.push_back(e); })) {
        all_entries(out);
        return;
    }
    // Most recently used first, as the ordered scan would try them.
    if (out.size() > 1) {
        std::sort(out.begin(), out.end(),
                  [](const EntryPtr& a, const EntryPtr& b) { return a->stamp > b->stamp; });
    }
}

int Cache::try_entry(const EntryPtr& c, const Locals& locals, PyObject* current, SnapshotMemo& memo) {
    if (!c->in_cache) return 0;  // removed by another thread while we were checking
    if (current != nullptr) {
        // Entries inserted under the same ambient state share one snapshot object.
        if (!memo.snapshot || memo.snapshot.get() != c->snapshot.get()) {
            memo.ok = snapshot_matches(*c, current);
            if (memo.ok < 0) return -1;
            memo.snapshot = c->snapshot;
        }
        if (memo.ok == 0) return 0;
    }
    GuardSet* gs = c->gs.get();
    if (gs->invalid()) return 0;
    return gs->check(locals);
}

int Cache::lookup_most_recent(const Locals& locals, Ref& payload, bool with_index) {
    if (!front_ || invalidation_epoch() != seen_epoch_ || index_dirty_ || (index_path_ && !with_index) ||
        !probes_.empty())
        return 0;
    // Borrowed: the fast pass runs no user code and allocates nothing, so no finalizer can run
    // and remove the entry meanwhile (docs/cpp.md, "Regions without user code").
    CacheEntry* e = front_.get();
    // A set with residues needs check(): do not run its fast pass twice.
    if (!e->gs->uses_fast_pass() || e->gs->check_without_user_code(locals) != 1) return 0;
    count_lookup(e);
    payload = e->payload;  // our own reference: calling the payload may evict the entry
    return 1;
}

bool Cache::lookup(const Locals& locals, EntryPtr& out, bool count) {
    out.reset();
    if (!find_entry(locals, out)) return false;
    // find_entry's last acts release what it held (candidates that user code removed from the
    // cache, the probe values): a finalizer run there may have killed an object the hit's set
    // names, and put a new object at its address where the check read it, or removed the hit
    // from this cache. Read after them, the hit's validity is final: nothing runs between here
    // and the caller's use of the entry, and the cache owns a valid entry, so dropping the
    // caller's reference to it runs nothing either (docs/cpp.md, "Regions without user code").
    if (out && !out->valid()) out.reset();  // may run a finalizer: a miss, whatever it does
    if (out) {
        record_hit(out, count);
    } else if (count) {
        count_lookup(nullptr);
    }
    return true;
}

bool Cache::find_entry(const Locals& locals, EntryPtr& out) {
    if (invalidation_epoch() != seen_epoch_) {
        std::vector<EntryPtr> graveyard;  // released at the end of this block, once consistent
        purge_invalid(graveyard);
    }
    if (index_dirty_) rebuild_index();
    Ref current;
    if (!probes_.empty()) {
        current = probe_values();
        if (!current) return false;
    }
    SnapshotMemo memo;
    // Our own reference for the whole lookup: a guard may run user code that removes the entry,
    // and `tried` is compared with the candidates below.
    EntryPtr front;
    const CacheEntry* tried = nullptr;
    if (!index_path_ && front_) {
        // Without an index the scan tries the most recently used entry first; trying it before
        // copying the candidate list makes the common repeated hit allocation-free.
        front = front_;
        const int r = try_entry(front, locals, current.get(), memo);
        if (r < 0) return false;
        if (r == 1) {
            out = std::move(front);
            return true;
        }
        tried = front.get();
    }
    // The common case without allocating: a few candidates, pointers into the buckets, valid
    // while the cache is unchanged; the one being checked is held (its check may remove it).
    const EntryPtr* few[kFewCandidates];
    std::size_t n_few = 0;
    const CacheEntry* tried_few[kFewCandidates];
    std::size_t n_tried = 0;
    if (few_candidates(locals, few, n_few)) {
        const std::uint64_t before = mutations_;
        std::size_t k = 0;
        for (; k < n_few && mutations_ == before && !index_dirty_; ++k) {
            if (few[k]->get() == tried) continue;
            const EntryPtr c = *few[k];
            tried_few[n_tried++] = c.get();
            const int r = try_entry(c, locals, current.get(), memo);
            if (r < 0) return false;
            if (r == 1) {
                out = c;
                return true;
            }
        }
        if (k == n_few && mutations_ == before) return true;  // a miss
        // A check changed the cache: collect again, skipping what was tried.
    }
    const CandidateList list;  // reused storage: no allocation per lookup once warm
    std::vector<EntryPtr>& candidates = list.get();
    collect_candidates(locals, candidates);
    for (const EntryPtr& c : candidates) {
        if (c.get() == tried || std::find(tried_few, tried_few + n_tried, c.get()) != tried_few + n_tried)
            continue;
        const int r = try_entry(c, locals, current.get(), memo);
        if (r < 0) return false;
        if (r == 1) {
            out = c;
            return true;
        }
    }
    return true;  // a miss
}

void Cache::record_hit(const EntryPtr& e, bool count) {
    touch(e);
    if (count) count_lookup(e.get());
}

bool Cache::insert(PyObject* guards, std::shared_ptr<GuardSet> gs, PyObject* payload, PyObject* name,
                   InsertResult& result) {
    Ref snapshot;
    if (!probes_.empty()) {
        snapshot = probe_values();
        if (snapshot) snapshot = snapshot_of(snapshot.get());
        if (!snapshot) return false;
    }
    // After the probes, which are user code and may have killed an object the set names.
    if (gs->invalid()) {
        PyErr_Format(PyExc_ValueError, "Cache.insert: the guard set is already invalid (%s)",
                     gs->invalid_reason().c_str());
        return false;
    }
    std::vector<EntryPtr> graveyard;
    purge_invalid(graveyard);
    if (snapshot && front_) {
        // Share the snapshot object with the most recent entry when equal: lookup compares each
        // distinct snapshot object once.
        const int same = snapshot_matches(*front_, snapshot.get());
        if (same < 0) PyErr_Clear();
        if (same == 1) snapshot = front_->snapshot;
    }

    auto e = std::make_shared<CacheEntry>();
    e->guards = Ref::borrow(guards);
    e->gs = std::move(gs);
    e->payload = Ref::borrow(payload);
    e->name = Ref::borrow(name);
    e->snapshot = snapshot;
    if (PyObject* g = e->gs->globals(); g != nullptr && PyDict_Check(g)) e->globals = Ref::borrow(g);
    describe_entry(*e);

    const core::InsertPlan plan = policy_.plan_insert(e->group);
    if (plan.result != InsertResult::Inserted) {
        result = plan.result;
        return true;
    }
    for (core::CacheEntryId victim : plan.victims) {
        const EntryPtr v = by_id_.at(victim);
        remove(v, graveyard);
        ++stats_.evictions;
    }
    e->id = next_id_++;
    e->stamp = policy_.insert(e->id, e->group);
    by_id_.emplace(e->id, e);
    front_ = e;
    ++mutations_;
    if (stats_.inserts++ > 0) ++stats_.recompiles;
    drop_index();
    result = InsertResult::Inserted;
    return true;
}

std::vector<EntryPtr> Cache::entries() {
    std::vector<EntryPtr> graveyard;
    purge_invalid(graveyard);
    std::vector<EntryPtr> out;
    all_entries(out);
    return out;
}

int Cache::limit_reached(PyObject* f_locals) {
    std::vector<EntryPtr> all = entries();  // a copy: reading a source may run user code
    if (all.size() >= accumulated_limit()) return 2;
    std::size_t same = 0;
    for (const EntryPtr& e : all) {
        const std::shared_ptr<GuardSet> gs = e->gs;  // held: user code may drop the entry
        if (!gs) continue;
        const core::Program& p = gs->program();
        bool match = true;
        for (std::uint32_t ni = 0; match && ni < p.nodes.size(); ++ni) {
            std::uint32_t root = ni;
            while (!p.nodes[root].is_root) root = p.nodes[root].parent;
            if (p.nodes[root].root != core::RootKind::Local) continue;
            const core::Node& n = p.nodes[ni];
            for (std::uint32_t k = n.guard_begin; match && k < n.guard_end; ++k) {
                const core::GuardDecl& d = p.guards[p.node_guards[k]];
                if (d.kind != core::GuardKind::IdMatch || d.operand == core::kNoConst) continue;
                Ref v = gs->read_node(ni, f_locals, e->globals.get());
                if (!v) {
                    // A source this frame does not have (or a fetch that raised): another object.
                    if (!PyErr_ExceptionMatches(PyExc_Exception)) return -1;
                    PyErr_Clear();
                    match = false;
                } else {
                    match = v.get() == gs->constant(d.operand);
                }
            }
        }
        if (match) ++same;
    }
    return same >= recompile_limit() ? 1 : 0;
}

std::size_t Cache::size() {
    std::vector<EntryPtr> graveyard;
    purge_invalid(graveyard);
    return policy_.size();
}

void Cache::clear() {
    // Move everything out first: releasing payloads may run code that uses this cache.
    std::unordered_map<core::CacheEntryId, EntryPtr> old;
    old.swap(by_id_);
    for (const auto& [id, e] : old) e->in_cache = false;
    policy_.clear();
    EntryPtr old_front = std::move(front_);
    front_.reset();
    ++mutations_;
    std::unordered_map<DispatchKey, std::vector<EntryPtr>, KeyHash> old_buckets;
    old_buckets.swap(buckets_);
    std::vector<EntryPtr> old_unindexed;
    old_unindexed.swap(unindexed_);
    // The index source holds the globals dict: the cycle collector's tp_clear must drop it too.
    const std::shared_ptr<IndexPath> old_path = std::move(index_path_);
    index_text_.clear();
    index_signature_.clear();
    index_dirty_ = true;
}

int Cache::traverse_entry(const CacheEntry& e, visitproc visit, void* arg) {
    Py_VISIT(e.guards.get());
    Py_VISIT(e.payload.get());
    Py_VISIT(e.name.get());
    Py_VISIT(e.snapshot.get());
    Py_VISIT(e.globals.get());
    return 0;
}

int Cache::traverse(visitproc visit, void* arg) const {
    for (const auto& [id, e] : by_id_) {
        if (const int r = traverse_entry(*e, visit, arg)) return r;
    }
    for (const Ref& p : probes_) Py_VISIT(p.get());
    if (index_path_) Py_VISIT(index_path_->globals.get());
    return 0;
}

}  // namespace tripwire::runtime
