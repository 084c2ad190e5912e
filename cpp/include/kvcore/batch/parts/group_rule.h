// What a group's policy decides about its blocks, one type per policy behind
// one interface (as SequenceCache's LayoutPolicy, FlatPolicy and RingPolicy):
// how many blocks its pool needs, which blocks a sequence at some length no
// longer needs (the ring's window releases them), what a query after a
// rewind needs, and what a prefix hit must bring. A flat group needs every
// position and releases none: its answers are trivial. BlockGroup (the only
// caller) asks its rule and never the policy's kind.
#pragma once

#include <cstdint>

#include "kvcore/core/config.h"

namespace kvcore {

/// Which block indices a query at some length needs in a group: the sink
/// blocks and [window_from, ...); everything when window_from is 0.
struct NeededBlocks {
  int sink_blocks = 0;
  int window_from = 0;
  bool contains(int i) const noexcept { return i < sink_blocks || i >= window_from; }
};

class GroupRule {
 public:
  /// Blocks of the group's pool, given `configured` (the config's or every
  /// table full) for `seqs` sequences of `stride` block indices each.
  virtual std::int64_t pool_blocks(std::int64_t configured, std::int64_t seqs, int stride) const noexcept = 0;
  /// Blocks below this index a sequence never needs again (sinks aside).
  virtual int sink_blocks() const noexcept = 0;
  /// The first block index a sequence of `length` positions still needs past
  /// its sinks: everything below it (past the sinks) can be released.
  virtual int release_floor_block(int length) const noexcept = 0;
  /// The lowest position (past the sinks) a query at n needs below n; n or
  /// more when it needs none (in 64 bits: sinks may round past 2^31).
  virtual std::int64_t needs_from(int n) const noexcept = 0;
  /// The blocks a sequence adopting a hit of `blocks` full blocks holds, as a
  /// sequence that computed the prefix itself would, and always the hit's last
  /// block: a hit names a prefix some sequence computed, even where no query
  /// past it reads a position of it (a window of 1, or a chunk boundary, with
  /// no rewind margin).
  virtual NeededBlocks needed(int blocks) const noexcept = 0;
  /// False only when release_floor_block() is 0 at every length: a sequence
  /// never gives a block back for its length alone (evict() skips the group).
  virtual bool releases_blocks() const noexcept { return true; }

 protected:
  ~GroupRule() = default;
};

/// Flat: every position stays; a query needs all of them.
class FlatRule final : public GroupRule {
 public:
  std::int64_t pool_blocks(std::int64_t configured, std::int64_t, int) const noexcept override { return configured; }
  int sink_blocks() const noexcept override { return 0; }
  int release_floor_block(int) const noexcept override { return 0; }
  std::int64_t needs_from(int) const noexcept override { return 0; }
  NeededBlocks needed(int) const noexcept override { return NeededBlocks{0, 0}; }
  bool releases_blocks() const noexcept override { return false; }
};

/// `from`, or the last of `blocks` blocks when `from` is past it (a hit's
/// last block is always needed: GroupRule::needed()).
inline int last_block_at_most(int from, int blocks) noexcept {
  return blocks > 0 && from > blocks - 1 ? blocks - 1 : from;
}

/// Blocks of a pool whose sequences each hold at most `sink_blocks` sink
/// blocks and W + C + R - 1 positions during a step (the window, a step of C,
/// a rewind margin of R; one straddle more), or `configured` when a full
/// table row is fewer.
inline std::int64_t window_pool_blocks(std::int64_t configured, std::int64_t seqs, int stride, int window,
                                       int max_step, int max_rewind, int block_size, int sink_blocks) noexcept {
  const std::int64_t span = static_cast<std::int64_t>(window) + max_step + max_rewind - 1;
  const std::int64_t per_seq = sink_blocks + (span + block_size - 1) / block_size + 1;
  std::int64_t blocks = per_seq < stride ? per_seq * seqs : configured;
  if (blocks > seqs * stride) blocks = seqs * stride;
  return blocks;
}

/// Ring(window, sinks): a query at q sees the sinks and (q - window, q]. No
/// query after a rewind of up to max_rewind positions needs a position below
/// length - max_rewind - window + 1 but the sinks: those blocks go.
class RingRule final : public GroupRule {
 public:
  void set(const LayerPolicy& policy, int block_size, int max_step, int max_rewind) noexcept {
    window_ = policy.window;
    block_size_ = block_size;
    max_step_ = max_step;
    max_rewind_ = max_rewind;
    sink_blocks_ = static_cast<int>((static_cast<std::int64_t>(policy.sinks) + block_size - 1) / block_size);
  }

  std::int64_t pool_blocks(std::int64_t configured, std::int64_t seqs, int stride) const noexcept override {
    return window_pool_blocks(configured, seqs, stride, window_, max_step_, max_rewind_, block_size_, sink_blocks_);
  }
  int sink_blocks() const noexcept override { return sink_blocks_; }
  int release_floor_block(int length) const noexcept override {
    const std::int64_t floor = release_floor(length);
    return floor > 0 ? static_cast<int>(floor / block_size_) : 0;
  }
  std::int64_t needs_from(int n) const noexcept override {
    const std::int64_t sinks_end = static_cast<std::int64_t>(sink_blocks_) * block_size_;
    const std::int64_t window_from = static_cast<std::int64_t>(n) - window_ + 1;
    return window_from > sinks_end ? window_from : sinks_end;
  }
  NeededBlocks needed(int blocks) const noexcept override {
    const int from = last_block_at_most(release_floor_block(blocks * block_size_), blocks);
    return NeededBlocks{sink_blocks_, from > sink_blocks_ ? from : sink_blocks_};
  }

 private:
  // At length L, after a rewind of up to max_rewind positions, no query sees a
  // position below this but the sinks (in 64 bits: it may lie far below 0).
  std::int64_t release_floor(int length) const noexcept {
    return static_cast<std::int64_t>(length) - max_rewind_ - window_ + 1;
  }

  int window_ = 1;
  int block_size_ = 1;
  int max_step_ = 1;
  int max_rewind_ = 1;
  int sink_blocks_ = 0;
};

/// Chunked(K): a query at q sees its own chunk, [K * floor(q / K), q]. No
/// query after a rewind of up to max_rewind positions needs a position below
/// the chunk start of length - max_rewind: those blocks go. A sequence holds
/// at most K + C + R - 1 positions during a step, as a ring of window K.
class ChunkedRule final : public GroupRule {
 public:
  void set(const LayerPolicy& policy, int block_size, int max_step, int max_rewind) noexcept {
    chunk_ = policy.window;
    block_size_ = block_size;
    max_step_ = max_step;
    max_rewind_ = max_rewind;
  }

  std::int64_t pool_blocks(std::int64_t configured, std::int64_t seqs, int stride) const noexcept override {
    return window_pool_blocks(configured, seqs, stride, chunk_, max_step_, max_rewind_, block_size_, 0);
  }
  int sink_blocks() const noexcept override { return 0; }
  int release_floor_block(int length) const noexcept override {
    const int lo = length > max_rewind_ ? length - max_rewind_ : 0;
    return (lo - lo % chunk_) / block_size_;
  }
  std::int64_t needs_from(int n) const noexcept override { return n - n % chunk_; }
  NeededBlocks needed(int blocks) const noexcept override {
    const int from = release_floor_block(static_cast<int>(static_cast<std::int64_t>(blocks) * block_size_));
    return NeededBlocks{0, last_block_at_most(from, blocks)};
  }

 private:
  int chunk_ = 1;
  int block_size_ = 1;
  int max_step_ = 1;
  int max_rewind_ = 1;
};

}  // namespace kvcore
