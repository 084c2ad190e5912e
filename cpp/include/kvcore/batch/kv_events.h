// KVEventQueue: what a BatchCache tells a router or a lower tier about the
// blocks it can serve (vLLM's KV events, by which llm-d and Dynamo route).
// A block group *stores* a key when one of its blocks first carries it (the
// block's K/V for those tokens is there to reuse) and *evicts* it when the last
// block carrying it loses it (reclaimed for other rows); clear() says so once.
// With states in the pool (BatchLimits::states_in_pool) State group k is group
// n_groups + k: a key stored there names the state after the block it keys.
// Opt-in and bounded: enable() allocates the ring once; pushing never
// allocates (the step path pushes at commit), and a push into a full queue is
// dropped and counted, so a consumer that sees dropped() move knows its view
// is stale.
#pragma once

#include <cstdint>
#include <utility>

#include "kvcore/batch/block_key.h"
#include "kvcore/core/buffer.h"
#include "kvcore/core/result.h"

namespace kvcore {

/// What happened to a block key in a group.
enum class KVEventKind : std::uint8_t {
  Stored = 0,   ///< the group holds a block of this key now (reusable by a prefix hit)
  Evicted = 1,  ///< the group's last block of this key was reclaimed
  Cleared = 2,  ///< every group forgot every key (BatchCache::clear)
};

/// One event: group, key, namespace and the token positions the block holds,
/// [first_position, first_position + n_positions) of any sequence whose
/// prompt names the key (in State group k, numbered n_groups + k with states
/// in the pool: the state after them). A Cleared event has group -1 and no key.
struct KVEvent {
  KVEventKind kind = KVEventKind::Stored;
  int group = -1;
  BlockKey key;
  std::uint64_t prefix_namespace = 0;
  int first_position = 0;
  int n_positions = 0;
};

class KVEventQueue {
 public:
  /// Largest capacity enable() takes.
  static constexpr int kMaxCapacity = 1 << 24;

  /// Keeps up to `capacity` undrained events from now on (0 turns events off),
  /// forgetting any undrained ones and the dropped count. InvalidArgument:
  /// capacity outside [0, 2^24]. MemoryAllocationFailed: the ring cannot be
  /// allocated (the queue is left as it was).
  Status enable(int capacity) noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(capacity >= 0 && capacity <= kMaxCapacity, InvalidArgument,
                                 "kv events capacity = %d: must be in [0, %d]", capacity, kMaxCapacity);
    internal::Buffer<KVEvent> ring;
    if (capacity > 0) {
      ring = internal::Buffer<KVEvent>::make(capacity);
      KVCORE_CHECK_OR_RETURN_ERROR(ring != nullptr, MemoryAllocationFailed,
                                   "cannot allocate a queue of %d kv events", capacity);
    }
    ring_ = std::move(ring);
    capacity_ = capacity;
    head_ = size_ = 0;
    dropped_ = 0;
    return Error::Ok;
  }

  bool enabled() const noexcept { return capacity_ > 0; }
  int capacity() const noexcept { return capacity_; }
  /// Events waiting to be drained.
  int size() const noexcept { return size_; }
  /// Events dropped because the queue was full, since enable().
  std::int64_t dropped() const noexcept { return dropped_; }

  /// Appends `e` (when enabled); a full queue drops it and counts it.
  void push(const KVEvent& e) noexcept {
    if (capacity_ == 0) return;
    if (size_ == capacity_) {
      ++dropped_;
      return;
    }
    int at = head_ + size_;
    if (at >= capacity_) at -= capacity_;
    ring_[at] = e;
    ++size_;
  }

  /// Moves up to `max` of the oldest events to out[0, ...) and returns how
  /// many. Precondition: out holds `max` events (or max <= 0).
  int drain(KVEvent* out, int max) noexcept {
    const int n = max < size_ ? (max > 0 ? max : 0) : size_;
    for (int i = 0; i < n; ++i) {
      out[i] = ring_[head_];
      if (++head_ == capacity_) head_ = 0;
    }
    size_ -= n;
    return n;
  }

 private:
  internal::Buffer<KVEvent> ring_;
  int capacity_ = 0;
  int head_ = 0;
  int size_ = 0;
  std::int64_t dropped_ = 0;
};

}  // namespace kvcore
