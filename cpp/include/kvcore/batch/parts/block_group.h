// BlockGroup: the layers of a BatchCache that share one policy. It draws its
// blocks from the cache's one BlockPool (as its GroupPool) and keeps, per
// active sequence, a block table row (position p lives in block row[p / B];
// TableRows says which row), the blocks held and, for a window that releases
// blocks, the position below which it released every block past the sinks. A
// row is a directory of table pages (TablePages): entry i lives in page
// dir[i / P] at i % P, a page taken when the row first names a block in its
// span and given back when a drop leaves it empty; unpaged, the directory is
// one pinned page per row. What depends on the policy is asked of its
// GroupRule (group_rule.h); nothing here branches on the policy's kind.
#pragma once

#include <cstdint>
#include <memory>
#include <new>
#include <utility>

#include "kvcore/batch/block_pool.h"
#include "kvcore/batch/parts/group_rule.h"
#include "kvcore/batch/parts/sequence_table.h"
#include "kvcore/batch/parts/table_pages.h"
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

  /// Draws from `pool` as group `group` and keeps its rows of `stride` block
  /// indices in `pages` (pinned pages: page group * rows + r is row r); `rows`
  /// says each sequence's row. Allocates the directories of `rows.rows()` rows
  /// and the counts of `max_seqs` sequences. The pool, pages and rows must
  /// outlive the group. MemoryAllocationFailed: nothing is assigned.
  Status create(BlockPool& pool, int group, int max_seqs, const TableRows& rows, TablePages& pages, int stride,
                int block_size) noexcept {
    const int P = pages.page_blocks();
    const int dir_stride = pages.pinned() ? 1 : static_cast<int>((static_cast<std::int64_t>(stride) + P - 1) / P);
    const std::int64_t dir_entries = static_cast<std::int64_t>(rows.rows()) * dir_stride;
    auto dir = internal::Buffer<int>::make(dir_entries);
    auto held = internal::Buffer<int>::make_zeroed(max_seqs);
    auto lost = internal::Buffer<int>::make_zeroed(max_seqs);
    KVCORE_CHECK_OR_RETURN_ERROR(dir && held && lost, MemoryAllocationFailed,
                                 "cannot allocate the sequence tables of %d sequences", max_seqs);
    pool_ = GroupPool(&pool, group);
    pages_ = &pages;
    dir_ = std::move(dir);
    held_ = std::move(held);
    lost_below_ = std::move(lost);
    rows_ = &rows;
    max_seqs_ = max_seqs;
    dir_stride_ = dir_stride;
    group_ = group;
    shift_ = table_page_shift(P, dir_stride);
    mask_ = shift_ < 31 ? P - 1 : 0x7fffffff;  // one page per row: entry i is at i
    // Unpaged: the group's pinned pages are its dense rows, read and written
    // in place (no directory lookup, no counts: a pinned page never goes back).
    dense_ = pages.pinned() ? pages.data() + static_cast<std::ptrdiff_t>(group) * rows.rows() * stride : nullptr;
    stride_ = stride;
    block_size_ = block_size;
    clear_directory();
    return Error::Ok;
  }

  GroupPool& pool() noexcept { return pool_; }
  const GroupPool& pool() const noexcept { return pool_; }
  /// The directory of every row, [rows][dir_stride()] page ids of the
  /// TablePages (-1: no page, every entry -1).
  const int* directory() const noexcept { return dir_.get(); }
  /// Page ids per row: ceil(stride / P), 1 when unpaged.
  int dir_stride() const noexcept { return dir_stride_; }
  /// i >> page_shift() is index i's page in a row's directory (31: one page).
  int page_shift() const noexcept { return shift_; }
  /// Where the directory of `seq`'s row starts: the same in every group (one
  /// TableRows, one stride), so a caller planning an entry in every group
  /// looks it up once. Precondition: `seq` holds a row (it is active).
  std::ptrdiff_t row_offset(int seq) const noexcept {
    return static_cast<std::ptrdiff_t>(rows_->row(seq)) * dir_stride_;
  }
  /// Block index i of the row at `offset` (row_offset()), -1 for none.
  int block_at_row(std::ptrdiff_t offset, int i) const noexcept {
    if (dense_ != nullptr) return dense_[offset * stride_ + i];  // unpaged: offset is the row
    const int page = dir_.get()[offset + (i >> shift_)];
    return page < 0 ? -1 : pages_->entry(page, i & mask_);
  }
  /// Block index i of `seq`'s row, -1 for none. Precondition: `seq` is active.
  int block_at(int seq, int i) const noexcept { return block_at_row(row_offset(seq), i); }
  /// Sets block index i of `seq`'s row to `block` (>= 0), taking a page when
  /// its span has none: the caller counted it (missing_pages) before.
  void set_block(int seq, int i, int block) noexcept {
    if (dense_ != nullptr) {
      dense_[row_offset(seq) * stride_ + i] = block;
      return;
    }
    int& page = dir_.get()[row_offset(seq) + (i >> shift_)];
    if (page < 0) page = pages_->take();
    int& e = pages_->entry(page, i & mask_);
    pages_->live(page) += (block >= 0) - (e >= 0);
    e = block;
  }
  /// An abandoned step puts back what block index i of `seq` held before it
  /// (`before`, -1 for none; the pool's references are the caller's): a page
  /// left naming no block goes back to the TablePages.
  void restore_block(int seq, int i, int before) noexcept {
    if (before >= 0 || dense_ != nullptr) {
      set_block(seq, i, before);
      return;
    }
    int& page = dir_.get()[row_offset(seq) + (i >> shift_)];
    if (page < 0) return;
    int& e = pages_->entry(page, i & mask_);
    if (e < 0) return;
    e = -1;
    if (--pages_->live(page) == 0) {
      pages_->give(page);
      page = -1;
    }
  }
  /// The blocks page p of `seq`'s row names, -1 when the row has no page p.
  int page_live(int seq, int p) const noexcept {
    const int page = dir_.get()[row_offset(seq) + p];
    return page < 0 ? -1 : pages_->live(page);
  }
  /// Pages the row of `seq` lacks for block indices [first, end): what
  /// set_block() there takes at most (0 unpaged).
  int missing_pages(int seq, int first, int end) const noexcept { return count_pages(seq, first, end, false); }
  /// Pages the row of `seq` holds among those of block indices [first, end).
  int held_pages(int seq, int first, int end) const noexcept { return count_pages(seq, first, end, true); }
  /// Pages `seq`'s row lacks among those the indices `need` keeps of [0,
  /// blocks) lie in: what adopting them takes (0 unpaged).
  int pages_for(int seq, const NeededBlocks& need, int blocks) const noexcept {
    if (pages_->pinned() || blocks <= 0) return 0;
    const std::ptrdiff_t row = row_offset(seq);
    int n = 0;
    for (int p = 0; p <= (blocks - 1) >> shift_; ++p) {
      const std::int64_t lo = static_cast<std::int64_t>(p) << shift_, hi = lo + mask_;  // its first and last index
      n += (lo < need.sink_blocks || hi >= need.window_from) && dir_.get()[row + p] < 0;
    }
    return n;
  }
  /// The page of block index i in a row's directory (i >> page_shift()).
  int page_of(int i) const noexcept { return i >> shift_; }
  /// The first block index of page p (capped at 2^31 - 1: one page per row).
  int page_first(int p) const noexcept {
    const std::int64_t first = static_cast<std::int64_t>(p) << shift_;
    return first < 0x7fffffff ? static_cast<int>(first) : 0x7fffffff;
  }
  /// Are the tables unpaged (one pinned page per row)?
  bool unpaged() const noexcept { return pages_->pinned(); }
  /// Gives back every page of `seq`'s row (its entries are all -1: every
  /// block dropped). Unpaged: nothing to do.
  void free_pages(int seq) noexcept {
    if (pages_->pinned()) return;
    int* dir = dir_.get() + row_offset(seq);
    for (int p = 0; p < dir_stride_; ++p)
      if (dir[p] >= 0) {
        pages_->give(dir[p]);
        dir[p] = -1;
      }
  }
  int& held(int seq) noexcept { return held_[seq]; }
  int held(int seq) const noexcept { return held_[seq]; }
  /// Positions below were released by the window (past the sinks): lost even
  /// where a later step refilled their block index.
  int& lost_below(int seq) noexcept { return lost_below_[seq]; }
  int lost_below(int seq) const noexcept { return lost_below_[seq]; }

  /// `seq` holds `block` (one more holder) at index i.
  void share(int seq, int i, int block) noexcept {
    pool_.hold(block);
    set_block(seq, i, block);
    ++held_[seq];
  }
  /// `seq` gives back its block at index i, if any; a page left without
  /// blocks goes back to the TablePages.
  void drop(int seq, int i) noexcept {
    if (dense_ != nullptr) {
      int& e = dense_[row_offset(seq) * stride_ + i];
      if (e < 0) return;
      pool_.release(e);
      e = -1;
      --held_[seq];
      return;
    }
    int& page = dir_.get()[row_offset(seq) + (i >> shift_)];
    if (page < 0) return;
    int& e = pages_->entry(page, i & mask_);
    if (e < 0) return;
    pool_.release(e);
    e = -1;
    --held_[seq];
    if (--pages_->live(page) == 0) {
      pages_->give(page);
      page = -1;
    }
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
    const std::ptrdiff_t from = row_offset(src);
    const int lost = lost_below_[src];
    lost_below_[dst] = lost < upto ? lost : upto;
    for (int i = seqs[src].start / block_size_; i < end_block; ++i) {
      const int block = block_at_row(from, i);
      if (block < 0) continue;
      // Block boundaries in 64 bits (the last block may end past 2^31 - 1).
      const std::int64_t end = (static_cast<std::int64_t>(i) + 1) * block_size_;
      const int hi = end < upto ? static_cast<int>(end) : upto;
      if (seqs.next_kept(dst, i * block_size_) >= hi) continue;  // dst sees none of its positions
      share(dst, i, block);
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
    const std::ptrdiff_t row = row_offset(seq);
    const int end = static_cast<int>((static_cast<std::int64_t>(s.length) + block_size_ - 1) / block_size_);
    for (int i = s.start / block_size_; i < end; ++i)
      if (block_at_row(row, i) >= 0) return i * block_size_ > s.start ? i * block_size_ : s.start;
    return s.length;
  }

  /// Internal unless each page a row names counts its entries naming a block
  /// (live); adds the pages named to `*named`. O(the rows' pages). Unpaged
  /// rows keep no counts: each is its one pinned page.
  Status check_pages(std::int64_t* named) const noexcept {
    if (dense_ != nullptr) {
      *named += rows_->rows();
      return Error::Ok;
    }
    const int P = pages_->page_blocks();
    for (std::int64_t d = 0; d < static_cast<std::int64_t>(rows_->rows()) * dir_stride_; ++d) {
      const int page = dir_.get()[d];
      if (page < 0) continue;
      ++*named;
      int live = 0;
      for (int i = 0; i < P; ++i) live += pages_->entry(page, i) >= 0;
      KVCORE_CHECK_OR_RETURN_ERROR(live == pages_->live(page), Internal,
                                   "group %d: table page %d holds %d blocks but counts %d", group_, page, live,
                                   pages_->live(page));
    }
    return Error::Ok;
  }

  /// Every table empty (the cache resets the pool and the TablePages).
  void clear() noexcept {
    clear_directory();
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
  // Pages of block indices [first, end) the row of `seq` holds (or lacks).
  int count_pages(int seq, int first, int end, bool held) const noexcept {
    if (pages_->pinned() || first >= end) return 0;
    const std::ptrdiff_t row = row_offset(seq);
    int n = 0;
    for (int p = first >> shift_; p <= (end - 1) >> shift_; ++p) n += (dir_.get()[row + p] >= 0) == held;
    return n;
  }

  // Every row without a page; unpaged, row r's pinned page is group * rows + r.
  void clear_directory() noexcept {
    const int rows = rows_->rows();
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(rows) * dir_stride_; ++i)
      dir_.get()[i] = pages_->pinned() ? group_ * rows + static_cast<int>(i) : -1;
  }

  const TableRows* rows_ = nullptr;
  TablePages* pages_ = nullptr;
  int max_seqs_ = 0;
  int dir_stride_ = 1;
  int stride_ = 0;
  int group_ = 0;
  int* dense_ = nullptr;  // unpaged: the group's rows, [rows][stride_]
  int shift_ = 31;          // i >> shift_: the page of index i in the directory
  int mask_ = 0x7fffffff;   // i & mask_: its entry in that page
  int block_size_ = 1;
  internal::Buffer<int> dir_;  // [rows][dir_stride_] page ids, -1: none
  internal::Buffer<int> held_;
  internal::Buffer<int> lost_below_;
};

}  // namespace kvcore
