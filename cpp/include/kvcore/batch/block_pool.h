// BlockPool: the blocks of B rows every group of a BatchCache draws from (one
// budget: docs/design.md section 6). A block belongs to one group while it is
// held or cached: its rows are that group's layers' rows (a byte layer gives
// layers of different groups the same storage, so a block is one page of
// memory whichever group holds it). Each block has a reference count (the
// sequences holding it) and an optional content key (the chained hash of the
// token ids of a full block, for prefix reuse), looked up per group. Free
// blocks without a key wait in a min-heap (those never used yet only as a
// count past the highest one ever used, so a huge pool's heap stays as small
// as its traffic), so allocation takes the lowest free
// block and the blocks in use stay packed at the start of the pool (a byte
// layer's rows [0, used_blocks() * B) hold every live row); free blocks that
// keep a key wait in one LRU list for every group and are reclaimed only when
// no other block is free, least recently released first (vLLM's block pool
// reclaims cached blocks the same way), whichever group they belong to: memory
// goes where the traffic needs it. A commit names a block through
// name_or_share(), which trades a copy of content the group already keeps for
// that block; several blocks of a group carry one key only where one was
// named beside its copy (it had another holder, or set_key() named an
// imported record's): a lookup takes a held one when there is one, and
// at most one of them stays cached, so the content outlives whichever copy
// goes first.
// A pool given a KVEventQueue (attach_events) tells it when a key enters a
// group (its first block carrying it) and when it leaves (the last one loses
// it), with the namespace and token range the key names. Every table is
// allocated once, through nothrow new, by create(). GroupPool is one group's
// view of the pool, with the group's name for every call.
#pragma once

#include <cstdint>
#include <memory>
#include <new>
#include <utility>

#include "kvcore/batch/block_key.h"
#include "kvcore/batch/kv_events.h"
#include "kvcore/core/buffer.h"
#include "kvcore/core/result.h"

namespace kvcore {

class BlockPool {
 public:
  BlockPool() = default;
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;
  BlockPool(BlockPool&&) noexcept = default;
  BlockPool& operator=(BlockPool&&) noexcept = default;

  /// Allocates the tables for `n_blocks` blocks shared by `n_groups` groups,
  /// all free. Precondition: 1 <= n_blocks <= 2^30 (the key table has a power
  /// of two >= 2 n_blocks slots, indexed by int), n_groups >= 1.
  /// MemoryAllocationFailed (naming `what`): a table cannot be allocated; the
  /// pool is left as it was (nothing is assigned before every table is
  /// allocated).
  Status create(int n_blocks, const char* what, int n_groups = 1) noexcept {
    // One more entry: index n_blocks is the LRU list's sentinel.
    auto meta = internal::Buffer<Meta>::make(std::int64_t{n_blocks} + 1);
    auto heap = internal::Buffer<int>::make(n_blocks);
    auto cached = internal::Buffer<int>::make_zeroed(n_groups);
    auto held = internal::Buffer<int>::make_zeroed(n_groups);
    auto keyed = internal::Buffer<int>::make_zeroed(n_groups);
    std::int64_t n_slots = 2;
    while (n_slots < 2 * static_cast<std::int64_t>(n_blocks)) n_slots *= 2;
    auto slots = internal::Buffer<Slot>::make(n_slots);
    KVCORE_CHECK_OR_RETURN_ERROR(
        meta && heap && cached && held && keyed && slots,
        MemoryAllocationFailed, "cannot allocate the block tables of %s (%d blocks)", what, n_blocks);
    n_blocks_ = n_blocks;
    n_groups_ = n_groups;
    meta_ = std::move(meta);
    heap_ = std::move(heap);
    cached_of_ = std::move(cached);
    held_of_ = std::move(held);
    keyed_of_ = std::move(keyed);
    slots_ = std::move(slots);
    slot_mask_ = static_cast<int>(n_slots - 1);
    fresh_ = 0;  // the new records are as reset() leaves them
    reset();
    return Error::Ok;
  }

  /// Every block free, no key kept.
  void reset() noexcept {
    for (int b = 0; b < fresh_; ++b) meta_[b] = Meta{};  // blocks past fresh_ were never touched
    for (int g = 0; g < n_groups_; ++g) cached_of_[g] = held_of_[g] = keyed_of_[g] = 0;
    heap_size_ = 0;
    fresh_ = 0;
    meta_[n_blocks_].next = meta_[n_blocks_].prev = n_blocks_;
    cached_ = 0;
    used_ = 0;
    for (int i = 0; i <= slot_mask_; ++i) slots_[i] = Slot{};
  }

  /// Tells `events` (null: nobody) when a key enters or leaves a group, whose
  /// blocks hold `block_size` positions. The queue must outlive the pool.
  void attach_events(KVEventQueue* events, int block_size) noexcept {
    events_ = events;
    block_size_ = block_size;
  }

  int n_blocks() const noexcept { return n_blocks_; }
  /// Blocks no sequence holds (cached ones included: they are reclaimable).
  int free_blocks() const noexcept { return heap_size_ + (n_blocks_ - fresh_) + cached_; }
  /// Free blocks that still keep a key (reused on a prefix hit until
  /// reclaimed), of every group.
  int cached_blocks() const noexcept { return cached_; }
  /// Group g's free blocks that still keep a key.
  int cached_blocks(int group) const noexcept { return cached_of_[group]; }
  /// Blocks group g's sequences hold.
  int held_blocks(int group) const noexcept { return held_of_[group]; }
  /// Group g's blocks that carry a key, held or cached.
  int keyed_blocks(int group) const noexcept { return keyed_of_[group]; }
  /// One past the highest block some sequence holds: every held block is below it.
  int used_blocks() const noexcept { return used_; }
  int refs(int block) const noexcept { return meta_[block].refs; }
  bool keyed(int block) const noexcept { return meta_[block].keyed != kUnkeyed; }
  const BlockKey& key(int block) const noexcept { return meta_[block].key; }

  /// Takes the lowest free block without a key, else the least recently
  /// released cached one of any group (dropping its key), held once by
  /// `group`. Precondition: free_blocks() > 0 (the caller admitted the need);
  /// broken, it aborts with a message (an admission that under-counts fails
  /// at once, instead of taking the LRU list's sentinel and corrupting the
  /// tables).
  int allocate(int group = 0) noexcept {
    KVCORE_CHECK(free_blocks() > 0, "BlockPool::allocate: no free block (the admission under-counted)");
    int b;
    if (heap_size_ > 0) {
      b = pop_lowest();  // below fresh_: the lowest free block without a key
    } else if (fresh_ < n_blocks_) {
      b = fresh_++;
    } else {
      b = meta_[n_blocks_].next;
      unlink(b);
      --cached_;
      --cached_of_[meta_[b].owner];
      drop_key(b);
    }
    meta_[b].refs = 1;
    meta_[b].owner = group;
    ++held_of_[group];
    if (b >= used_) used_ = b + 1;
    return b;
  }

  /// One more holder of `block` (held, or free and cached: a prefix hit).
  void hold(int block) noexcept {
    if (meta_[block].refs++ == 0) {  // only cached blocks are found while free
      unlink(block);
      --cached_;
      --cached_of_[meta_[block].owner];
      ++held_of_[meta_[block].owner];
      if (block >= used_) used_ = block + 1;
    }
  }

  /// One holder fewer; the last one frees the block: to the LRU list's back
  /// when it keeps a key (reclaimed last), else to the heap. A cached copy of
  /// the same content in its group already waiting goes to the heap without
  /// its key: one cached copy per content, the most recently released.
  void release(int block) noexcept {
    if (--meta_[block].refs != 0) return;
    const int g = meta_[block].owner;
    --held_of_[g];
    if (meta_[block].keyed != kUnkeyed) {
      // Only a block that met a twin when keyed can have a cached copy to give back.
      const int older = meta_[block].keyed == kTwin ? find_cached(meta_[block].key, g, block) : -1;
      if (older >= 0) {
        unlink(older);
        --cached_;
        --cached_of_[g];
        drop_key(older);
        push(older);
      }
      ++cached_;
      ++cached_of_[g];
      link_before(block, n_blocks_);
    } else {
      push(block);
    }
    // Usually one step: allocation keeps the blocks in use packed at the start.
    while (used_ > 0 && meta_[used_ - 1].refs == 0) --used_;
  }

  /// Names a held block by its content in its group (other blocks may carry
  /// the same key): block `index` of a sequence keying in prefix namespace
  /// `ns` (it holds positions [index * B, (index + 1) * B)); false (nothing
  /// changes) when this one has a key already.
  bool set_key(int block, const BlockKey& key, std::uint64_t ns, int index) noexcept {
    if (meta_[block].keyed != kUnkeyed) return false;
    const int g = meta_[block].owner;
    // One walk of the key's cluster: is the key there already (for the event),
    // and the empty slot that ends it.
    const std::uint32_t t = tag(key, g);
    bool known = false;
    int i = home(t);
    for (; slots_[i].block >= 0; i = (i + 1) & slot_mask_) {
      if (!is(slots_[i], t, key, g)) continue;
      known = true;
      meta_[slots_[i].block].keyed = kTwin;  // its release must look for this copy
    }
    name_at(block, key, ns, index, i, known);
    return true;
  }

  /// A committed block's naming: when another block of its group already
  /// carries `key` (held or cached, the one find() picks) and no one else holds
  /// `block`, that copy gets `block`'s holder and `block` goes back unnamed,
  /// so one content keeps one block (two sequences that computed one prompt
  /// side by side end holding one copy); else set_key(). Returns the block
  /// the holder keeps. One walk of the key's cluster when the key is new.
  /// Precondition: `block` is held (a sequence's block its commit filled).
  int name_or_share(int block, const BlockKey& key, std::uint64_t ns, int index) noexcept {
    if (meta_[block].keyed != kUnkeyed) return block;
    int copy = -1;
    const int end = probe(key, meta_[block].owner, &copy);
    if (copy < 0) {
      name_at(block, key, ns, index, end, false);
    } else if (meta_[block].refs == 1) {
      hold(copy);
      release(block);
      return copy;
    } else {
      set_key(block, key, ns, index);
    }
    return block;
  }

  /// A block of `group` whose content has `key`: the lowest held one when
  /// there is one (sharing it takes no free block), else the cached one; -1
  /// when none.
  int find(const BlockKey& key, int group = 0) const noexcept {
    int copy = -1;
    probe(key, group, &copy);
    return copy;
  }

  /// A hint that set_key(block, key, ...) follows: starts loading the key
  /// table's slot and the block's record, so the keyings of a block index in
  /// every group wait for memory together instead of one after another (an
  /// ample pool's tables are far larger than any cache). Changes nothing.
  void prefetch_keying(int block, const BlockKey& key) const noexcept {
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch(&slots_[home(tag(key, meta_[block].owner))], 1);
    __builtin_prefetch(&meta_[block].keyed, 1);
#else
    (void)block;
    (void)key;
#endif
  }

  /// Hints that find(key, group) follows, in two stages for a batch of keys:
  /// prefetch_find() starts loading the first slot the key probes, and
  /// prefetch_found(), once that slot has had time to arrive, the record of
  /// the block it names when the tag matches (find compares its whole key). A
  /// prompt's lookups then wait for memory together instead of two misses
  /// after another per block. Change nothing.
  void prefetch_find(const BlockKey& key, int group) const noexcept {
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch(&slots_[home(tag(key, group))]);
#else
    (void)key;
    (void)group;
#endif
  }
  void prefetch_found(const BlockKey& key, int group) const noexcept {
#if defined(__GNUC__) || defined(__clang__)
    const std::uint32_t t = tag(key, group);
    const Slot& slot = slots_[home(t)];
    if (slot.block >= 0 && slot.tag == t) __builtin_prefetch(&meta_[slot.block]);
#else
    (void)key;
    (void)group;
#endif
  }

  /// Forgets a block's key (its rows are about to change). Precondition: the
  /// block is held, or is being reclaimed by allocate().
  void drop_key(int block) noexcept {
    if (meta_[block].keyed == kUnkeyed) return;
    int i = home(tag(meta_[block].key, meta_[block].owner));
    while (slots_[i].block != block) i = (i + 1) & slot_mask_;
    // Linear probing's backward-shift deletion: no tombstones, lookups stay short.
    for (int j = (i + 1) & slot_mask_; slots_[j].block >= 0; j = (j + 1) & slot_mask_) {
      const int home_j = home(slots_[j].tag);
      // Move slots_[j] into the hole at i unless its home lies in (i, j].
      const bool home_between = i <= j ? (home_j > i && home_j <= j) : (home_j > i || home_j <= j);
      if (!home_between) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = Slot{};
    meta_[block].keyed = kUnkeyed;
    const int g = meta_[block].owner;
    --keyed_of_[g];
    if (events_ != nullptr && find(meta_[block].key, g) < 0)  // no other block of the group carries it
      events_->push(event(KVEventKind::Evicted, g, meta_[block].key, meta_[block].ns, meta_[block].index));
  }

 private:
  // One walk of `key`'s cluster in group g: the empty slot that ends it, and
  // in *copy the block find() picks (-1: none).
  int probe(const BlockKey& key, int g, int* copy) const noexcept {
    int held = -1, cached = -1;
    const std::uint32_t t = tag(key, g);
    int i = home(t);
    for (; slots_[i].block >= 0; i = (i + 1) & slot_mask_) {
      if (!is(slots_[i], t, key, g)) continue;
      const int b = slots_[i].block;
      if (meta_[b].refs == 0) cached = b;
      else if (held < 0 || b < held) held = b;
    }
    *copy = held >= 0 ? held : cached;
    return i;
  }
  // Names `block` at the empty slot `slot` of its key's cluster; `known`: a
  // block of its group carries the key already (no event, a twin).
  void name_at(int block, const BlockKey& key, std::uint64_t ns, int index, int slot, bool known) noexcept {
    const int g = meta_[block].owner;
    if (events_ != nullptr && !known) events_->push(event(KVEventKind::Stored, g, key, ns, index));
    slots_[slot] = Slot{block, tag(key, g)};
    meta_[block].key = key;
    meta_[block].ns = ns;
    meta_[block].index = index;
    meta_[block].keyed = known ? kTwin : kKeyed;
    ++keyed_of_[g];
  }

  static constexpr std::uint64_t kGroupSpread = 0x9e3779b97f4a7c15u;
  // A block's key state: none; a key; a key another block of its group carried
  // too when either was keyed (only then may release() find a cached copy).
  static constexpr std::uint8_t kUnkeyed = 0, kKeyed = 1, kTwin = 2;

  // Everything the pool keeps of one block, together: a lookup, a keying or
  // a release touches one or two cache lines of it instead of one line in
  // each of seven tables (the pool of an ample budget spans millions of blocks).
  struct Meta {
    BlockKey key;           // its content key, when keyed != kUnkeyed
    std::uint64_t ns = 0;   // what the key names besides its hash: the namespace
    int index = 0;          // ... and the block index
    int refs = 0;           // the sequences holding it
    int owner = 0;          // the group holding or caching it
    int next = 0, prev = 0; // its neighbours in the LRU list of cached blocks
    std::uint8_t keyed = kUnkeyed;
  };

  // A slot of the key table: a block and its key's tag in its group (-1: empty).
  // Probes compare tags, so a cluster is walked without reading other blocks'
  // keys (one cache line holds eight slots).
  struct Slot {
    int block = -1;
    std::uint32_t tag = 0;
  };

  // The tag of `key` in `group`: its low bits are the key's home slot (groups
  // hold the same keys: each starts elsewhere), all 32 filter the probes.
  static std::uint32_t tag(const BlockKey& key, int group) noexcept {
    const std::uint64_t spread = static_cast<std::uint64_t>(static_cast<std::uint32_t>(group)) * kGroupSpread;
    return static_cast<std::uint32_t>(key.lo + spread);
  }
  // The first slot a key of tag t probes.
  int home(std::uint32_t t) const noexcept { return static_cast<int>(t & static_cast<std::uint32_t>(slot_mask_)); }
  // Does `slot` hold a block of `group` whose content has `key` (tag t)?
  bool is(const Slot& slot, std::uint32_t t, const BlockKey& key, int group) const noexcept {
    return slot.tag == t && meta_[slot.block].key == key && meta_[slot.block].owner == group;
  }

  KVEvent event(KVEventKind kind, int group, const BlockKey& key, std::uint64_t ns, int index) const noexcept {
    return KVEvent{kind, group, key, ns, index * block_size_, block_size_};
  }

  // The free block of `group` other than `except` carrying `key`, or -1
  // (release() keeps at most one).
  int find_cached(const BlockKey& key, int group, int except) const noexcept {
    const std::uint32_t t = tag(key, group);
    for (int i = home(t); slots_[i].block >= 0; i = (i + 1) & slot_mask_) {
      const int b = slots_[i].block;
      if (b != except && is(slots_[i], t, key, group) && meta_[b].refs == 0) return b;
    }
    return -1;
  }

  // The min-heap of free blocks without a key.
  void push(int b) noexcept {
    int i = heap_size_++;
    while (i > 0 && heap_[(i - 1) / 2] > b) {
      heap_[i] = heap_[(i - 1) / 2];
      i = (i - 1) / 2;
    }
    heap_[i] = b;
  }
  int pop_lowest() noexcept {
    const int top = heap_[0];
    const int last = heap_[--heap_size_];
    int i = 0;
    for (;;) {
      int child = 2 * i + 1;
      if (child >= heap_size_) break;
      if (child + 1 < heap_size_ && heap_[child + 1] < heap_[child]) ++child;
      if (heap_[child] >= last) break;
      heap_[i] = heap_[child];
      i = child;
    }
    heap_[i] = last;
    return top;
  }

  // The LRU list of free cached blocks, n_blocks_ its sentinel.
  void unlink(int b) noexcept {
    meta_[meta_[b].prev].next = meta_[b].next;
    meta_[meta_[b].next].prev = meta_[b].prev;
  }
  void link_before(int b, int at) noexcept {
    meta_[b].prev = meta_[at].prev;
    meta_[b].next = at;
    meta_[meta_[at].prev].next = b;
    meta_[at].prev = b;
  }

  int n_blocks_ = 0;
  int n_groups_ = 1;
  int block_size_ = 1;
  KVEventQueue* events_ = nullptr;
  int heap_size_ = 0;
  int fresh_ = 0;  // blocks [fresh_, n_blocks_) were never allocated: free, keyless, not in the heap
  int cached_ = 0;
  int used_ = 0;
  int slot_mask_ = 0;
  internal::Buffer<Meta> meta_;  // [n_blocks + 1]: each block's, then the LRU list's sentinel
  internal::Buffer<int> heap_;
  internal::Buffer<int> cached_of_;  // per group: its cached blocks
  internal::Buffer<int> held_of_;    // per group: its held blocks
  internal::Buffer<int> keyed_of_;   // per group: its blocks carrying a key
  internal::Buffer<Slot> slots_;  // open addressing from tag(key, owner) & slot_mask_
};

/// One group's view of the BlockPool: every call names the group.
class GroupPool {
 public:
  GroupPool() = default;
  GroupPool(BlockPool* pool, int group) noexcept : pool_(pool), group_(group) {}

  /// The whole pool's blocks, free blocks and one past its highest held block.
  int n_blocks() const noexcept { return pool_->n_blocks(); }
  int free_blocks() const noexcept { return pool_->free_blocks(); }
  int used_blocks() const noexcept { return pool_->used_blocks(); }
  /// This group's cached blocks.
  int cached_blocks() const noexcept { return pool_->cached_blocks(group_); }
  /// This group's blocks carrying a key, held or cached.
  int keyed_blocks() const noexcept { return pool_->keyed_blocks(group_); }
  int refs(int block) const noexcept { return pool_->refs(block); }
  bool keyed(int block) const noexcept { return pool_->keyed(block); }
  const BlockKey& key(int block) const noexcept { return pool_->key(block); }
  int allocate() noexcept { return pool_->allocate(group_); }
  void hold(int block) noexcept { pool_->hold(block); }
  void release(int block) noexcept { pool_->release(block); }
  bool set_key(int block, const BlockKey& key, std::uint64_t ns, int index) noexcept {
    return pool_->set_key(block, key, ns, index);
  }
  int name_or_share(int block, const BlockKey& key, std::uint64_t ns, int index) noexcept {
    return pool_->name_or_share(block, key, ns, index);
  }
  void prefetch_keying(int block, const BlockKey& key) const noexcept { pool_->prefetch_keying(block, key); }
  int find(const BlockKey& key) const noexcept { return pool_->find(key, group_); }
  void prefetch_find(const BlockKey& key) const noexcept { pool_->prefetch_find(key, group_); }
  void prefetch_found(const BlockKey& key) const noexcept { pool_->prefetch_found(key, group_); }
  void drop_key(int block) noexcept { pool_->drop_key(block); }

 private:
  BlockPool* pool_ = nullptr;
  int group_ = 0;
};

}  // namespace kvcore
