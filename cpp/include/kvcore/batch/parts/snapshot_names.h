// SnapshotNames: the named snapshots of a State group whose slots are its own
// (StateGroup, state_group.h; with states in the pool the pool's key table
// names them instead). A name is the key of a full block; it names the
// physical slot holding the state after that block's last position. At most
// `capacity` are named; the least recently named or adopted makes room.
// Names are found through a hash index (open addressing on the key's low
// lane, at most half full) and kept in least-recently-used order by a list
// through the snapshots: naming, adopting and dropping are O(1), so a
// lookup of a prompt of n blocks costs O(n) with thousands of snapshots.
// The table counts no references: the group holds one per name, and add()
// tells it which slot a dropped name gave up.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "kvcore/batch/block_key.h"
#include "kvcore/core/buffer.h"

namespace kvcore {

class SnapshotNames {
 public:
  /// Sizes the tables for `capacity` names (0: none) and empties them; false
  /// when an allocation fails: nothing is assigned. (StateGroup::create
  /// allocates into a fresh table and moves it in once all its tables are made.)
  bool allocate(int capacity) noexcept {
    std::int64_t index_size = 0;  // a power of two >= 2 * capacity: at most half full
    if (capacity > 0)
      for (index_size = 2; index_size < 2 * static_cast<std::int64_t>(capacity);) index_size *= 2;
    auto snapshots = internal::Buffer<Snapshot>::make(capacity);
    auto probes = internal::Buffer<int>::make(index_size);
    if (!((snapshots && probes) || capacity == 0)) return false;
    named_ = std::move(snapshots);
    index_ = std::move(probes);
    index_mask_ = static_cast<std::uint64_t>(index_size - 1);
    index_size_ = index_size;
    max_named_ = capacity;
    clear();
    return true;
  }

  /// Every name dropped.
  void clear() noexcept {
    n_named_ = 0;
    index_.fill(index_size_, -1);
    lru_first_ = lru_last_ = -1;
  }

  /// Names now.
  int size() const noexcept { return n_named_; }
  /// The snapshot named `key`, -1 when none.
  int find(const BlockKey& key) const noexcept {
    if (n_named_ == 0) return -1;
    for (std::size_t h = home(key); index_[h] >= 0; h = next(h))
      if (named_[index_[h]].key == key) return index_[h];
    return -1;
  }
  /// The physical slot snapshot i (found) names.
  int physical(int i) const noexcept { return named_[i].phys; }
  /// Snapshot i was named or adopted again: the most recently used now.
  void touch(int i) noexcept {
    if (i == lru_last_) return;
    unlink(i);
    link_last(i);
  }
  /// Names physical slot `phys` by `key` (find(key) < 0), the most recently
  /// used; with every name taken the least recently used one is dropped.
  /// Returns the physical slot the dropped name gave up, -1 when none.
  /// Precondition: capacity > 0.
  int add(const BlockKey& key, int phys) noexcept {
    int i = n_named_;
    int dropped = -1;
    if (n_named_ < max_named_) {
      ++n_named_;
    } else {  // the least recently named or adopted makes room
      i = lru_first_;
      unlink(i);
      unindex(i);
      dropped = named_[i].phys;
    }
    named_[i].key = key;
    named_[i].phys = phys;
    index(i);
    link_last(i);
    return dropped;
  }

 private:
  // A named state: the physical slot holding the state after a keyed block,
  // and its neighbours in least-recently-used order (-1: none).
  struct Snapshot {
    BlockKey key;
    int phys = -1;
    int older = -1;
    int newer = -1;
  };

  // The index slot a key's probe starts from: the key is a hash already.
  std::size_t home(const BlockKey& key) const noexcept { return static_cast<std::size_t>(key.lo & index_mask_); }
  std::size_t next(std::size_t h) const noexcept { return (h + 1) & static_cast<std::size_t>(index_mask_); }
  void index(int i) noexcept {
    std::size_t h = home(named_[i].key);
    while (index_[h] >= 0) h = next(h);
    index_[h] = i;
  }
  // Removes snapshot i from the index, shifting back the probes that passed
  // its slot (linear probing without tombstones).
  void unindex(int i) noexcept {
    std::size_t hole = home(named_[i].key);
    while (index_[hole] != i) hole = next(hole);
    for (std::size_t j = next(hole); index_[j] >= 0; j = next(j)) {
      const std::size_t h = home(named_[index_[j]].key);
      // Move j into the hole unless its home lies cyclically in (hole, j].
      const bool stays = hole <= j ? (h > hole && h <= j) : (h > hole || h <= j);
      if (!stays) {
        index_[hole] = index_[j];
        hole = j;
      }
    }
    index_[hole] = -1;
  }
  void unlink(int i) noexcept {
    Snapshot& n = named_[i];
    (n.older >= 0 ? named_[n.older].newer : lru_first_) = n.newer;
    (n.newer >= 0 ? named_[n.newer].older : lru_last_) = n.older;
    n.older = n.newer = -1;
  }
  void link_last(int i) noexcept {
    named_[i].older = lru_last_;
    named_[i].newer = -1;
    (lru_last_ >= 0 ? named_[lru_last_].newer : lru_first_) = i;
    lru_last_ = i;
  }

  internal::Buffer<Snapshot> named_;  // [0, n_named_): named snapshots
  internal::Buffer<int> index_;       // [index_size_]: a snapshot, -1 (empty); probed from home(key)
  std::uint64_t index_mask_ = 0;
  std::int64_t index_size_ = 0;
  int lru_first_ = -1;  // least recently named or adopted
  int lru_last_ = -1;   // most recently
  int max_named_ = 0;
  int n_named_ = 0;
};

}  // namespace kvcore
