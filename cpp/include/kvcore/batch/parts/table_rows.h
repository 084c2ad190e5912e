// TableRows: which block table row each active sequence of a BatchCache uses
// (the same row in every group). With as many rows as sequence ids a
// sequence's row is its id; with fewer (BatchLimits::max_active_seqs) it is a
// free row. Either way a sequence takes its row when it becomes active and
// gives it back when released (an inactive id has none: -1), and free_rows()
// counts the sequences that may still become active, so the tables cost rows x ceil(capacity / B) entries per group
// however many ids are accepted. A row given back is empty (every entry -1):
// releasing a sequence drops each of its blocks first.
#pragma once

#include <memory>
#include <new>
#include <utility>

#include "kvcore/core/buffer.h"
#include "kvcore/core/result.h"

namespace kvcore {

class TableRows {
 public:
  /// Rows for `max_seqs` sequence ids, `rows` of them (1 <= rows <= max_seqs),
  /// all free. MemoryAllocationFailed: nothing is assigned.
  Status create(int max_seqs, int rows) noexcept {
    auto row_of = internal::Buffer<int>::make(max_seqs);
    auto free = internal::Buffer<int>::make(rows);
    KVCORE_CHECK_OR_RETURN_ERROR(row_of && free, MemoryAllocationFailed,
                                 "cannot allocate the table rows of %d sequences", max_seqs);
    row_of_ = std::move(row_of);
    free_ = std::move(free);
    max_seqs_ = max_seqs;
    rows_ = rows;
    clear();
    return Error::Ok;
  }

  /// Rows in all (each group's tables hold this many).
  int rows() const noexcept { return rows_; }
  /// Is each sequence's row its id (as many rows as ids)?
  bool by_id() const noexcept { return rows_ == max_seqs_; }
  /// Rows no sequence holds.
  int free_rows() const noexcept { return n_free_; }
  /// The row of `seq` (its id when by_id()), -1 until it takes one.
  int row(int seq) const noexcept { return row_of_[seq]; }
  /// Every sequence id's row (-1: none), as the plan's table_rows shows it.
  const int* row_of() const noexcept { return row_of_.get(); }

  /// `seq` (holding no row) takes one. Precondition: free_rows() > 0.
  void take(int seq) noexcept {
    row_of_[seq] = by_id() ? seq : free_[n_free_ - 1];
    --n_free_;
  }
  /// `seq` gives its row back (its entries are all -1 by then), if it holds one.
  void give(int seq) noexcept {
    if (row_of_[seq] < 0) return;
    if (!by_id()) free_[n_free_] = row_of_[seq];
    ++n_free_;
    row_of_[seq] = -1;
  }

  /// Every row free.
  void clear() noexcept {
    for (int seq = 0; seq < max_seqs_; ++seq) row_of_[seq] = -1;
    // Lowest row taken first: the first sequences use the first rows.
    n_free_ = rows_;
    for (int i = 0; i < n_free_; ++i) free_[i] = rows_ - 1 - i;
  }

 private:
  internal::Buffer<int> row_of_;  // [max_seqs]
  internal::Buffer<int> free_;    // stack of free rows, [0, n_free_)
  int max_seqs_ = 0;
  int rows_ = 0;
  int n_free_ = 0;
};

}  // namespace kvcore
