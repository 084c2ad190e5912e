// TablePages: the storage of a BatchCache's block tables, pages of P block
// indices shared by every group (BatchLimits::table_page_blocks). A group's
// row is a directory of page ids (BlockGroup): a page is taken when a
// sequence first names a block in its span and given back once none of its
// entries names one, so the tables cost what the sequences hold, not
// max_active_seqs x ceil(capacity / B) per group. Unpaged tables are the
// special case of one pinned page per row and group (P = ceil(capacity /
// B)): the dense [rows][stride] layout, never given back. Every page is
// allocated at create(); take() and give() are O(1) on a free stack.
#pragma once

#include <cstdint>
#include <utility>

#include "kvcore/core/buffer.h"
#include "kvcore/core/result.h"

namespace kvcore {

/// i >> table_page_shift(P, dir_stride) is block index i's page in a row's
/// directory: log2(P) for rows of several pages (P a power of two), 31 for
/// rows of one page (every index maps to page 0).
inline int table_page_shift(int page_blocks, int dir_stride) noexcept {
  if (dir_stride > 1)
    for (int s = 0; s < 31; ++s)
      if ((1 << s) == page_blocks) return s;
  return 31;
}

class TablePages {
 public:
  /// `n_pages` pages of `page_blocks` entries, every entry -1. Pinned: every
  /// page is in use from the start (unpaged rows), none is ever free.
  /// MemoryAllocationFailed: nothing is assigned.
  Status create(int n_pages, int page_blocks, bool pinned) noexcept {
    const std::int64_t entries = static_cast<std::int64_t>(n_pages) * page_blocks;
    auto data = internal::Buffer<int>::make(entries);
    auto live = internal::Buffer<int>::make_zeroed(n_pages);
    auto free = internal::Buffer<int>::make(pinned ? 0 : n_pages);
    KVCORE_CHECK_OR_RETURN_ERROR(data && live && (pinned || free), MemoryAllocationFailed,
                                 "cannot allocate %d table pages of %d entries", n_pages, page_blocks);
    data.fill(entries, -1);
    data_ = std::move(data);
    live_ = std::move(live);
    free_ = std::move(free);
    n_pages_ = n_pages;
    page_blocks_ = page_blocks;
    pinned_ = pinned;
    clear();
    return Error::Ok;
  }

  /// Entries per page (P).
  int page_blocks() const noexcept { return page_blocks_; }
  int n_pages() const noexcept { return n_pages_; }
  /// Pages no row names (0 when pinned).
  int free_pages() const noexcept { return n_free_; }
  /// Are the pages pinned rows (unpaged tables)?
  bool pinned() const noexcept { return pinned_; }
  /// Every page's entries, page after page.
  const int* data() const noexcept { return data_.get(); }
  int* data() noexcept { return data_.get(); }

  /// Entry `i` of page `page`.
  int& entry(int page, int i) noexcept { return data_.get()[static_cast<std::int64_t>(page) * page_blocks_ + i]; }
  int entry(int page, int i) const noexcept { return data_.get()[static_cast<std::int64_t>(page) * page_blocks_ + i]; }
  /// Entries of `page` that name a block (>= 0).
  int& live(int page) noexcept { return live_[page]; }

  /// A free page, every entry -1. Precondition: free_pages() > 0.
  int take() noexcept { return free_[--n_free_]; }
  /// Gives `page` back (not pinned); its entries become -1.
  void give(int page) noexcept {
    int* e = data_.get() + static_cast<std::int64_t>(page) * page_blocks_;
    for (int i = 0; i < page_blocks_; ++i) e[i] = -1;
    live_[page] = 0;
    free_[n_free_++] = page;
  }

  /// The free pages, [0, free_pages()).
  const int* free_list() const noexcept { return free_.get(); }
  int live(int page) const noexcept { return live_[page]; }

  /// Every entry -1; every page free unless pinned.
  void clear() noexcept {
    data_.fill(static_cast<std::int64_t>(n_pages_) * page_blocks_, -1);
    for (int p = 0; p < n_pages_; ++p) live_[p] = 0;
    n_free_ = pinned_ ? 0 : n_pages_;
    // Lowest page taken first.
    for (int i = 0; i < n_free_; ++i) free_[i] = n_pages_ - 1 - i;
  }

 private:
  internal::Buffer<int> data_;  // [n_pages][page_blocks]
  internal::Buffer<int> live_;  // [n_pages]
  internal::Buffer<int> free_;  // stack of free pages, [0, n_free_)
  int n_pages_ = 0;
  int page_blocks_ = 1;
  int n_free_ = 0;
  bool pinned_ = false;
};

}  // namespace kvcore
