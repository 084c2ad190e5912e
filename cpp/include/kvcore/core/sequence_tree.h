// SequenceTree: SequenceCache's draft-tree state (docs/design.md section 7):
// the begun tree's layout (DraftTree) and, per layer policy, the row copies of
// the last commit, in storage sized once and reused, so that begin_tree and
// commit(step, accepted) allocate nothing once trees of their size fit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>

#include "kvcore/core/buffer.h"
#include "kvcore/core/draft_tree.h"
#include "kvcore/core/layout_policy.h"

namespace kvcore {

/// One layer policy's row copies of a commit: `n` pairs (src row, dst row) a
/// backend performs, in order, before it writes the next step.
struct RowCopies {
  const TreeCopy* copies = nullptr;
  int n = 0;
};

class SequenceTree {
 public:
  /// Trees of this many nodes (or max_step, if smaller) fit from create().
  static constexpr int kReservedNodes = 128;

  SequenceTree() noexcept = default;
  SequenceTree(const SequenceTree&) = delete;
  SequenceTree& operator=(const SequenceTree&) = delete;

  /// Room for trees of up to `max_nodes` nodes over `n_policies` policies.
  /// Growing drops the begun tree's layout (the caller replaces it). No change
  /// when it fits. MemoryAllocationFailed (naming the size): nothing changes.
  Status reserve(int max_nodes, int n_policies) noexcept {
    if (max_nodes <= tree_.capacity() && n_policies == n_policies_) return Error::Ok;
    if (max_nodes < tree_.capacity()) max_nodes = tree_.capacity();
    auto rows = internal::Buffer<TreeCopy>::make(static_cast<std::int64_t>(max_nodes) * n_policies);
    auto counts = internal::Buffer<int>::make_zeroed(n_policies);
    KVCORE_CHECK_OR_RETURN_ERROR(rows != nullptr && counts != nullptr, MemoryAllocationFailed,
                                 "cannot allocate the commit copies of %d tree nodes", max_nodes);
    KVCORE_RETURN_IF_ERROR(tree_.reserve(max_nodes));
    // The last commit's copies stay readable across a growth.
    for (int p = 0; p < n_policies_ && p < n_policies; ++p) {
      counts[p] = n_copies_[p];
      for (int c = 0; c < n_copies_[p]; ++c)
        rows.get()[static_cast<std::ptrdiff_t>(p) * max_nodes + c] = row_copy(p)[c];
    }
    copies_ = std::move(rows);
    n_copies_ = std::move(counts);
    n_policies_ = n_policies;
    stride_ = max_nodes;
    return Error::Ok;
  }

  /// Trees of up to this many nodes fit without allocating.
  int capacity() const noexcept { return tree_.capacity(); }
  /// The begun (or last begun) tree's layout.
  const DraftTree& tree() const noexcept { return tree_; }
  /// Takes a checked tree that fits (capacity() >= n) at `position`.
  void assign(const int* parents, int n, int position) noexcept { tree_.assign(parents, n, position); }

  /// Policy `p`'s row copies of the last commit.
  RowCopies copies(int p) const noexcept { return RowCopies{row_copy(p), n_copies_[p]}; }

  /// Records a commit's copies: the chain-index copies of `accepted[0..m)`
  /// (checked against tree()), or none when `accepted` is null (a chain
  /// commit), mapped to each policy's rows for a step at `position`.
  void record_commit(const std::unique_ptr<LayoutPolicy>* policies, int position,
                     const int* accepted, int m) noexcept {
    for (int p = 0; p < n_policies_; ++p) {
      TreeCopy* out = row_copy(p);
      // A layer that holds no rows (Shared) copies none.
      const int n = accepted == nullptr || policies[p]->rows() == 0
                        ? 0
                        : tree_commit_copies(tree_.chain_indices(), accepted, m, out);
      for (int c = 0; c < n; ++c)
        out[c] = TreeCopy{policies[p]->row(position + out[c].src), policies[p]->row(position + out[c].dst)};
      n_copies_[p] = n;
    }
  }

  /// Copies everything into `other` (which reserves room): for clone().
  /// MemoryAllocationFailed as reserve(); `other` unchanged then.
  Status copy_to(SequenceTree& other) const noexcept {
    KVCORE_RETURN_IF_ERROR(other.reserve(capacity(), n_policies_));
    KVCORE_RETURN_IF_ERROR(tree_.copy_to(other.tree_));
    for (int p = 0; p < n_policies_; ++p) {
      other.n_copies_[p] = n_copies_[p];
      for (int c = 0; c < n_copies_[p]; ++c) other.row_copy(p)[c] = row_copy(p)[c];
    }
    return Error::Ok;
  }

 private:
  TreeCopy* row_copy(int p) noexcept { return copies_.get() + static_cast<std::ptrdiff_t>(p) * stride_; }
  const TreeCopy* row_copy(int p) const noexcept {
    return copies_.get() + static_cast<std::ptrdiff_t>(p) * stride_;
  }

  DraftTree tree_;
  int n_policies_ = 0;
  int stride_ = 0;  // copies per policy the storage holds: the tree capacity
  internal::Buffer<TreeCopy> copies_;  // n_policies_ x stride_
  internal::Buffer<int> n_copies_;     // per policy
};

}  // namespace kvcore
