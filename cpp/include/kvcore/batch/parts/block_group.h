// BlockGroup: the layers of a BatchCache that share one policy. It draws its
// blocks from the cache's one BlockPool (as its GroupPool) and keeps, per
// active sequence, a block table row (position p lives in
// block row[p / B]; TableRows says which row), the blocks held and, for a window that releases blocks, the
// position below which it released every block past the sinks. What depends
// on the policy is asked of its GroupRule (group_rule.h); nothing here branches
// on the policy's kind.
#pragma once

#include <cstdint>
#include <memory>
#include <new>
#include <utility>

#include "kvcore/batch/block_pool.h"
#include "kvcore/batch/parts/group_rule.h"
#include "kvcore/batch/parts/sequence_table.h"
#include "kvcore/batch/parts/table_rows.h"
#include "kvcore/core/buffer.h"
#include "kvcore/core/config.h"
#include "kvcore/core/result.h"

namespace kvcore {

class BlockGroup {
 public:
  BlockGroup() = default;
  BlockGroup(const BlockGroup&) = delete;
  BlockGroup& operator=(const BlockGroup&) = delete;

  /// The group's policy (its rule follows from it) under steps of up to
  /// `max_step` positions and rewinds of up to `max_rewind`; nothing is allocated.
  void set_policy(const LayerPolicy& policy, int block_size, int max_step, int max_rewind) noexcept {
    policy_ = policy;
    ring_.set(policy, block_size, max_step, max_rewind);
    chunked_.set(policy, block_size, max_step, max_rewind);
    rule_ = policy.kind == LayerPolicy::Kind::Ring      ? static_cast<const GroupRule*>(&ring_)
            : policy.kind == LayerPolicy::Kind::Chunked ? static_cast<const GroupRule*>(&chunked_)
                                                        : &flat_;
    releases_ = rule_->releases_blocks();
  }
  const LayerPolicy& policy() const noexcept { return policy_; }
  const GroupRule& rule() const noexcept { return *rule_; }

  /// Draws from `pool` as group `group`; allocates `rows.rows()` table rows of
  /// `stride` block indices (all empty; `rows`, which outlives the group, says
  /// each sequence's) and the counts of `max_seqs` sequences. The pool must
  /// outlive the group. MemoryAllocationFailed: nothing is assigned.
  Status create(BlockPool& pool, int group, int max_seqs, const TableRows& rows, int stride, int block_size) noexcept {
    const std::int64_t entries = static_cast<std::int64_t>(rows.rows()) * stride;
    auto tables = internal::Buffer<int>::make(entries);
    auto held = internal::Buffer<int>::make_zeroed(max_seqs);
    auto lost = internal::Buffer<int>::make_zeroed(max_seqs);
    KVCORE_CHECK_OR_RETURN_ERROR(tables && held && lost, MemoryAllocationFailed,
                                 "cannot allocate the sequence tables of %d sequences", max_seqs);
    tables.fill(entries, -1);
    pool_ = GroupPool(&pool, group);
    tables_ = std::move(tables);
    held_ = std::move(held);
    lost_below_ = std::move(lost);
    rows_ = &rows;
    max_seqs_ = max_seqs;
    stride_ = stride;
    block_size_ = block_size;
    return Error::Ok;
  }

  GroupPool& pool() noexcept { return pool_; }
  const GroupPool& pool() const noexcept { return pool_; }
  /// Every row of the tables, [rows][stride] (-1: no block).
  const int* tables() const noexcept { return tables_.get(); }
  /// The row of `seq`. Precondition: `seq` holds a row (it is active).
  int* table(int seq) noexcept { return tables_.get() + static_cast<std::ptrdiff_t>(rows_->row(seq)) * stride_; }
  const int* table(int seq) const noexcept {
    return tables_.get() + static_cast<std::ptrdiff_t>(rows_->row(seq)) * stride_;
  }
  /// Where the row of `seq` starts in the tables: the same in every group
  /// (one TableRows, one stride), so a caller planning an entry in every
  /// group looks it up once. Precondition: `seq` holds a row.
  std::ptrdiff_t row_offset(int seq) const noexcept { return static_cast<std::ptrdiff_t>(rows_->row(seq)) * stride_; }
  /// The row starting at `offset` (row_offset()).
  int* table_at(std::ptrdiff_t offset) noexcept { return tables_.get() + offset; }
  int& held(int seq) noexcept { return held_[seq]; }
  int held(int seq) const noexcept { return held_[seq]; }
  /// Positions below were released by the window (past the sinks): lost even
  /// where a later step refilled their block index.
  int& lost_below(int seq) noexcept { return lost_below_[seq]; }
  int lost_below(int seq) const noexcept { return lost_below_[seq]; }

  /// `seq` holds `block` (one more holder) at index i.
  void share(int seq, int i, int block) noexcept {
    pool_.hold(block);
    table(seq)[i] = block;
    ++held_[seq];
  }
  /// `seq` gives back its block at index i, if any.
  void drop(int seq, int i) noexcept {
    int* row = table(seq);
    if (row[i] < 0) return;
    pool_.release(row[i]);
    row[i] = -1;
    --held_[seq];
  }
  /// Drops every block of `seq` at indices [from, end), tail first: a cached
  /// chain's head is reclaimed after its tail.
  void drop_range(int seq, int from, int end) noexcept {
    for (int i = end - 1; i >= from; --i) drop(seq, i);
  }

  /// dst (just forked from src up to `upto`) shares src's blocks below
  /// `end_block` that hold a position dst still sees, then releases what its
  /// window no longer needs at `upto`.
  void share_prefix(const SequenceTable& seqs, int src, int dst, int upto, int end_block) noexcept {
    const int* from = table(src);
    const int lost = lost_below_[src];
    lost_below_[dst] = lost < upto ? lost : upto;
    for (int i = seqs[src].start / block_size_; i < end_block; ++i) {
      if (from[i] < 0) continue;
      // Block boundaries in 64 bits (the last block may end past 2^31 - 1).
      const std::int64_t end = (static_cast<std::int64_t>(i) + 1) * block_size_;
      const int hi = end < upto ? static_cast<int>(end) : upto;
      if (seqs.next_kept(dst, i * block_size_) >= hi) continue;  // dst sees none of its positions
      share(dst, i, from[i]);
    }
    evict(dst, upto);
  }

  /// Releases the blocks of `seq` at `length` that no query after a rewind of
  /// up to max_step positions can need (the sinks stay).
  void evict(int seq, int length) noexcept {
    if (!releases_) return;
    const int floor_block = rule_->release_floor_block(length);
    int& lost = lost_below_[seq];
    // Nothing past `lost` to release (the usual step: the floor moves one
    // block every B positions): the range below is empty, `lost` stays.
    if (floor_block * block_size_ <= lost) return;
    const int from = lost / block_size_;  // the block holding `lost` may hold positions written since
    drop_range(seq, from > rule_->sink_blocks() ? from : rule_->sink_blocks(), floor_block);
    if (floor_block * block_size_ > lost) lost = floor_block * block_size_;
  }

  /// Does this group no longer hold what a query at n (within the length)
  /// needs below n? Removed positions are not needed.
  bool loses(const SequenceTable& seqs, int seq, int n) const noexcept {
    const std::int64_t from = rule_->needs_from(n);
    if (from >= n) return false;  // a query at n needs nothing below n past the sinks
    const int needed = seqs.next_kept(seq, static_cast<int>(from));
    return needed < n && needed < lost_below_[seq];
  }

  /// Does a query here need every block below it (a flat group's rule)? Then
  /// a prefix hit ends at the first block this group lacks.
  bool needs_every_block() const noexcept { return !releases_; }

  /// `seq` (empty) takes the cached blocks of a hit of `blocks` full blocks it
  /// needs (PrefixIndex::longest_hit() found them all).
  void adopt(int seq, const BlockKey* keys, int blocks) noexcept {
    const NeededBlocks need = rule_->needed(blocks);
    for (int i = 0; i < blocks; ++i)
      if (need.contains(i)) share(seq, i, pool_.find(keys[i]));
    // Positions past the hit are the sequence's to write.
    lost_below_[seq] = (need.window_from < blocks ? need.window_from : blocks) * block_size_;
  }

  /// The first position of `seq` a block of it holds, or its length.
  int oldest_held(const SequenceState& s, int seq) const noexcept {
    if (s.length == 0) return 0;  // holds nothing (and an inactive sequence has no row)
    const int* row = table(seq);
    const int end = static_cast<int>((static_cast<std::int64_t>(s.length) + block_size_ - 1) / block_size_);
    for (int i = s.start / block_size_; i < end; ++i)
      if (row[i] >= 0) return i * block_size_ > s.start ? i * block_size_ : s.start;
    return s.length;
  }

  /// Every table empty (the cache resets the pool).
  void clear() noexcept {
    const std::int64_t entries = static_cast<std::int64_t>(rows_->rows()) * stride_;
    tables_.fill(entries, -1);
    for (int seq = 0; seq < max_seqs_; ++seq) held_[seq] = lost_below_[seq] = 0;
  }

 private:
  LayerPolicy policy_;
  FlatRule flat_;
  RingRule ring_;
  ChunkedRule chunked_;
  const GroupRule* rule_ = &flat_;
  bool releases_ = false;  // rule_->releases_blocks(): evict() has work to do
  GroupPool pool_;
  const TableRows* rows_ = nullptr;
  int max_seqs_ = 0;
  int stride_ = 0;
  int block_size_ = 1;
  internal::Buffer<int> tables_;
  internal::Buffer<int> held_;
  internal::Buffer<int> lost_below_;
};

}  // namespace kvcore
