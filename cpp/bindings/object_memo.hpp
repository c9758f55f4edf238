// tripwire/cpp/bindings/object_memo.hpp -- a bounded memo keyed by a Python object's address.
//
// The bindings keep what they derive from an immutable object (a Source's decoding for the
// example check, its declaration template for a set) by the object's address. Each value holds a
// strong reference to its key, so the address names no other object while the entry lives.
// Dropping an entry can drop the last reference to a Python object and so run user code (a
// finalizer that may use this memo again): entries are dropped only once the memo is consistent.
#pragma once

#include <Python.h>

#include <cstddef>
#include <memory>
#include <unordered_map>
#include <utility>

namespace tripwire::bindings {

/// A memo of `T` by the address of the object it was derived from (every `T` holds a strong
/// reference to that object), emptied when it reaches `Bound` entries. The GIL guards it.
template <typename T, std::size_t Bound>
class ObjectMemo {
  public:
    /// The value kept for `key`, or null.
    std::shared_ptr<const T> find(PyObject* key) const {
        const auto it = map_.find(key);
        return it != map_.end() ? it->second : nullptr;
    }

    /// Keep `value` for `key`, replacing any. Call it after whatever made `value` ran its user
    /// code: that code may have changed the memo, so nothing found before is reused here.
    void put(PyObject* key, std::shared_ptr<const T> value) {
        if (map_.size() >= Bound) clear();
        std::shared_ptr<const T>& slot = map_[key];
        const std::shared_ptr<const T> replaced = std::move(slot);
        slot = std::move(value);
        // `replaced` is released on return, after the slot holds the new value.
    }

    /// Empty the memo: the entries are swapped out first, then released.
    void clear() {
        Map old;
        old.swap(map_);
    }

  private:
    using Map = std::unordered_map<PyObject*, std::shared_ptr<const T>>;
    Map map_;
};

}  // namespace tripwire::bindings
