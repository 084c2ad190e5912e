// Draft trees (docs/design.md section 7): the integer core both caches share.
// Integer-only, exception-free; nothing here allocates except DraftTree::reserve.
//
// A tree of N nodes is given by `parents`: parents[0] = -1 (the root), and
// 0 <= parents[i] < i for i > 0 (topological order). depth(0) = 0,
// depth(i) = depth(parents[i]) + 1; node i stands at position L + depth(i).
//
// Layout. A tree step reserves exactly the rows a chain step of T = N would:
// the rows of positions L .. L+N-1, through the layer's ordinary write runs.
// Node i is written to the row of "chain index" ci(i), i.e. of position
// L + ci(i):
//   - the main line (node 0, its lowest-index child, that child's lowest-index
//     child, ...; M nodes, the last one a leaf) takes chain indices 0..M-1, so
//     main-line node d lies at chain index d = its depth: in place;
//   - every other node takes M, M+1, ... in node order.
// Each node has a row of its own (ci is a bijection onto 0..N-1), and writing
// them destroys exactly what a chain step of N destroys: ring positions up to
// L + N - 1 - R, below L - W + 1 (R = W + C - 1, N <= C), while every node's
// query, at q >= L, needs history from q - W + 1 >= L - W + 1 on, sinks apart.
//
// Packed ancestor mask. Row i, bit j is set iff j == i or j is an ancestor of
// i. A row is mask_words(N) = ceil(N / 32) uint32 words; bit j lives in word
// j / 32 at bit j % 32 (little bit order). Rows follow each other with no
// padding between them: row i starts at word i * mask_words(N). This is
// TensorRT-LLM's spec-decoding packed mask (int32 [tokens, ceil(tokens/32)]),
// and on a little-endian machine each row's bytes equal FlashInfer's
// `packbits(row, bitorder="little")` padded to 4 bytes. FlashInfer's
// `packed_custom_mask` itself covers the history keys too and packs the whole
// (tokens, keys) matrix without row padding: build it from the dense mask
// (DraftTree::dense_mask) and pack that; the tree-only words here are what
// tree-attention kernels take beside a history length.
//
// Commit. `accepted` (m >= 1 node indices, accepted[0] = 0, accepted[d] a
// child of accepted[d - 1]) is the accepted root path; after the commit
// position L + d must hold node accepted[d]. Its copies are (src chain index
// ci(accepted[d]) -> dst chain index d) for every d with ci(accepted[d]) != d,
// in ascending d: zero on the main line, at most m - 1 otherwise (why the
// order is safe: tree_commit_copies()).
//
// Storage. DraftTree holds one tree's arrays (parents, position, chain index,
// node per chain index) and its mask, sized by reserve() and reused:
// assigning a tree never allocates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>

#include "kvcore/core/buffer.h"
#include "kvcore/core/config.h"
#include "kvcore/core/plan.h"
#include "kvcore/core/result.h"

namespace kvcore {

/// One row copy a backend performs after a tree commit, before the next step:
/// the K/V of `src` to `dst`. Chain indices (offsets from the step's position)
/// from DraftTree; rows of one layer policy from the caches.
struct TreeCopy {
  int src = 0;
  int dst = 0;
  friend bool operator==(const TreeCopy& a, const TreeCopy& b) noexcept {
    return a.src == b.src && a.dst == b.dst;
  }
  friend bool operator!=(const TreeCopy& a, const TreeCopy& b) noexcept { return !(a == b); }
};

/// uint32 words per row of a packed ancestor mask of n nodes: ceil(n / 32).
constexpr int tree_mask_words(int n) noexcept { return n <= 0 ? 0 : (n - 1) / 32 + 1; }

/// Bit j of a packed ancestor-mask row (tree_mask_words(n) words, bit j in
/// word j / 32 at bit j % 32): is node j the row's node or one of its
/// ancestors? Precondition: 0 <= j < n.
inline bool tree_mask_bit(const std::uint32_t* row, int j) noexcept {
  return ((row[j / 32] >> (j % 32)) & 1u) != 0;
}

/// Ok when `parents[0..n)` is a tree of 1 <= n <= max_nodes nodes in
/// topological order; else InvalidArgument naming the value and the rule:
/// n outside [1, max_nodes]; parents[0] != -1; a second root (parents[i] = -1,
/// i > 0); parents[i] outside [0, i).
inline Status check_tree(const int* parents, int n, int max_nodes) noexcept {
  KVCORE_CHECK_OR_RETURN_ERROR(n >= 1 && n <= max_nodes, InvalidArgument,
                               "tree of N = %d nodes: needs 1 <= N <= max_step = %d", n,
                               max_nodes);
  KVCORE_CHECK_OR_RETURN_ERROR(parents != nullptr, InvalidArgument,
                               "tree of N = %d nodes: parents is null", n);
  KVCORE_CHECK_OR_RETURN_ERROR(parents[0] == -1, InvalidArgument,
                               "parents[0] = %d: node 0 is the root, its parent must be -1",
                               parents[0]);
  for (int i = 1; i < n; ++i) {
    KVCORE_CHECK_OR_RETURN_ERROR(parents[i] != -1, InvalidArgument,
                                 "parents[%d] = -1: a second root; only node 0 may be a root", i);
    KVCORE_CHECK_OR_RETURN_ERROR(
        parents[i] >= 0 && parents[i] < i, InvalidArgument,
        "parents[%d] = %d: a node's parent must come before it (0 <= parents[i] < i = %d)", i,
        parents[i], i);
  }
  return Error::Ok;
}

/// True when the (valid) tree is a chain: parents[i] = i - 1 for every i > 0.
inline bool tree_is_chain(const int* parents, int n) noexcept {
  for (int i = 1; i < n; ++i)
    if (parents[i] != i - 1) return false;
  return true;
}

/// Ok when `accepted[0..m)` is a root path of the (valid) tree `parents[0..n)`:
/// 1 <= m <= n, accepted[0] = 0, every index in [0, n), accepted[d] a child of
/// accepted[d - 1]. Else InvalidArgument naming the index and the rule.
inline Status check_accepted(const int* parents, int n, const int* accepted, int m) noexcept {
  KVCORE_CHECK_OR_RETURN_ERROR(m >= 1 && m <= n, InvalidArgument,
                               "accepted path of %d nodes: needs 1 <= m <= N = %d", m, n);
  KVCORE_CHECK_OR_RETURN_ERROR(accepted != nullptr, InvalidArgument,
                               "accepted path of %d nodes: accepted is null", m);
  KVCORE_CHECK_OR_RETURN_ERROR(accepted[0] == 0, InvalidArgument,
                               "accepted[0] = %d: an accepted path starts at the root, node 0",
                               accepted[0]);
  for (int d = 1; d < m; ++d) {
    const int node = accepted[d];
    KVCORE_CHECK_OR_RETURN_ERROR(node >= 0 && node < n, InvalidArgument,
                                 "accepted[%d] = %d: a node index must be in [0, N = %d)", d,
                                 node, n);
    KVCORE_CHECK_OR_RETURN_ERROR(
        parents[node] == accepted[d - 1], InvalidArgument,
        "accepted[%d] = %d: not a child of accepted[%d] = %d (its parent is %d): not a root path",
        d, node, d - 1, accepted[d - 1], parents[node]);
  }
  return Error::Ok;
}

/// Lays out a valid tree (check_tree passed): fills depth[i], chain_index[i]
/// and node_at[c] (the node at chain index c), and, when `mask` is not null,
/// the packed ancestor mask (n rows of tree_mask_words(n) words). Returns M,
/// the main line's length. O(n * tree_mask_words(n)), no allocation.
inline int lay_out_tree(const int* parents, int n, int* depth, int* chain_index, int* node_at,
                        std::uint32_t* mask) noexcept {
  // Pass 1: depths, the main line in place, the others numbered 0, 1, ...
  // A node is on the main line iff its parent is the current main-line tip and
  // it is that tip's first child: the first node seen whose parent is the tip
  // (children come after their parent, so none was seen before).
  int tip = 0;
  int main_len = 1;
  int others = 0;
  depth[0] = 0;
  chain_index[0] = 0;
  for (int i = 1; i < n; ++i) {
    depth[i] = depth[parents[i]] + 1;
    if (parents[i] == tip) {
      tip = i;
      chain_index[i] = main_len++;
    } else {
      chain_index[i] = -1 - others++;  // provisional: off the main line
    }
  }
  // Pass 2: the others after the main line, in node order.
  for (int i = 0; i < n; ++i) {
    if (chain_index[i] < 0) chain_index[i] = main_len - 1 - chain_index[i];
    node_at[chain_index[i]] = i;
  }
  if (mask != nullptr) {
    const int words = tree_mask_words(n);
    for (int i = 0; i < n; ++i) {
      std::uint32_t* row = mask + static_cast<std::int64_t>(i) * words;
      const std::uint32_t* up =
          i == 0 ? nullptr : mask + static_cast<std::int64_t>(parents[i]) * words;
      for (int w = 0; w < words; ++w) row[w] = up == nullptr ? 0u : up[w];
      row[i / 32] |= std::uint32_t{1} << (i % 32);
    }
  }
  return main_len;
}

/// The copies of committing the root path `accepted[0..m)` (check_accepted
/// passed) of a tree laid out with `chain_index`: (ci(accepted[d]) -> d) for
/// each d with ci(accepted[d]) != d, ascending in d, into `out` (room for m).
/// Returns how many: 0 on the main line, at most m - 1 otherwise (the root
/// never moves).
///
/// Why ascending order is right. (1) Main-line node d has ci = d, and a path
/// that leaves the main line never returns, so the copied d form a suffix
/// d0..m-1 of off-main nodes. (2) An off-main node i has ci(i) > depth(i):
/// of its depth(i) + 1 path nodes, k are main-line ancestors with k < M (the
/// main line ends in a leaf, which has no descendants) and depth(i) + 1 - k
/// are off-main with indices <= i, so ci(i) >= M + depth(i) - k > depth(i).
/// (3) Sources s_d = ci(accepted[d]) strictly increase with d: off-main chain
/// indices follow node order, and indices increase along a path. Copy d reads
/// s_d and writes d. A later copy e > d reads s_e > e > d: never a chain index
/// an earlier copy wrote; it writes e, which an earlier copy may have read
/// (s_d = e) but already did. So every copy reads its node's original row. Chain
/// indices map to distinct rows (a chain step of N <= C), so rows behave alike.
inline int tree_commit_copies(const int* chain_index, const int* accepted, int m,
                              TreeCopy* out) noexcept {
  int n_out = 0;
  for (int d = 0; d < m; ++d) {
    const int src = chain_index[accepted[d]];
    if (src != d) out[n_out++] = TreeCopy{src, d};
  }
  return n_out;
}

/// The row the chain plan writes for chain index `c` (0 <= c < plan.write_len()).
inline int chain_row(const SeqStepPlan& plan, int c) noexcept {
  for (int i = 0; i < plan.n_write; ++i) {
    if (c < plan.write[i].len) return plan.write[i].row + c;
    c -= plan.write[i].len;
  }
  return -1;
}

/// A tree step's layout, in storage sized once (reserve) and reused: no
/// allocation per step. SequenceCache keeps one; a batched cache may keep one
/// per entry or use the free functions above on its own arrays.
class DraftTree {
 public:
  DraftTree() noexcept = default;
  DraftTree(const DraftTree&) = delete;
  DraftTree& operator=(const DraftTree&) = delete;

  /// Room for trees of up to `max_nodes` nodes. Growing drops the current
  /// tree (size() becomes 0); a call that needs no growth changes nothing.
  /// MemoryAllocationFailed (naming the size) when the storage cannot be
  /// allocated; nothing changes then. The only call that allocates.
  Status reserve(int max_nodes) noexcept {
    if (max_nodes <= capacity_) return Error::Ok;
    const std::int64_t words = static_cast<std::int64_t>(max_nodes) * tree_mask_words(max_nodes);
    auto ints = internal::Buffer<int>::make(static_cast<std::int64_t>(max_nodes) * kArrays);
    auto mask = internal::Buffer<std::uint32_t>::make(words);
    KVCORE_CHECK_OR_RETURN_ERROR(ints != nullptr && mask != nullptr, MemoryAllocationFailed,
                                 "cannot allocate the draft tree storage of %d nodes", max_nodes);
    n_ = 0;
    main_line_ = 0;
    ints_ = std::move(ints);
    mask_ = std::move(mask);
    capacity_ = max_nodes;
    return Error::Ok;
  }

  /// Trees of up to this many nodes fit without reserve().
  int capacity() const noexcept { return capacity_; }

  /// Takes the tree `parents[0..n)` standing at `position`. Precondition:
  /// check_tree(parents, n, capacity()) passed (the caches check it first, so
  /// that a bad tree changes nothing).
  void assign(const int* parents, int n, int position) noexcept {
    n_ = n;
    position_ = position;
    for (int i = 0; i < n; ++i) array(kParents)[i] = parents[i];
    // Depths land in the positions array, then shift by the step's position.
    main_line_ = lay_out_tree(parents, n, array(kPosition), array(kChainIndex), array(kNodeAt),
                              mask_.get());
    for (int i = 0; i < n; ++i) array(kPosition)[i] += position;
  }

  /// Copies this tree into `other` (reserving room there): for clone().
  /// MemoryAllocationFailed as reserve(); `other` is unchanged then.
  Status copy_to(DraftTree& other) const noexcept {
    KVCORE_RETURN_IF_ERROR(other.reserve(capacity_));
    if (n_ > 0) other.assign(parents(), n_, position_);
    return Error::Ok;
  }

  /// Nodes N (0 before the first assign).
  int size() const noexcept { return n_; }
  /// The step's first position L (the root's position).
  int position() const noexcept { return position_; }
  /// Length of the main line (node 0, its first child, ...): its nodes sit in place.
  int main_line() const noexcept { return main_line_; }
  /// True when the tree is a chain (parents[i] = i - 1).
  bool is_chain() const noexcept { return main_line_ == n_; }

  /// Per node i: its parent (-1 for the root).
  const int* parents() const noexcept { return array(kParents); }
  /// Per node i: its position L + depth(i) (what RoPE and the mask use;
  /// depth(i) = positions()[i] - position()).
  const int* positions() const noexcept { return array(kPosition); }
  /// Per node i: its chain index ci(i): it is written to the row the chain step
  /// of T = N gives position L + ci(i).
  const int* chain_indices() const noexcept { return array(kChainIndex); }
  /// Per chain index c: the node written there (the inverse of chain_indices()).
  const int* nodes_at() const noexcept { return array(kNodeAt); }
  /// uint32 words per mask row: tree_mask_words(size()).
  int mask_words() const noexcept { return tree_mask_words(n_); }
  /// The packed ancestor mask: size() rows of mask_words() words (header comment).
  const std::uint32_t* mask() const noexcept { return mask_.get(); }

  /// Does node i's query see node j of the tree (j is i or an ancestor of i)?
  /// Section 2's window rule between their positions is the caller's (see
  /// dense_mask). Precondition: 0 <= i, j < size().
  bool is_ancestor_or_self(int j, int i) const noexcept {
    return tree_mask_bit(mask_.get() + static_cast<std::int64_t>(i) * mask_words(), j);
  }

  /// Fills `out` (size() rows of plan.read_len() bytes, row-major) with the
  /// dense (tokens, keys) mask of this tree step for a layer with `policy`
  /// whose plan of the step is `plan` (the chain plan of T = size()): key
  /// column c is the c-th row `plan.read` names; out = 1 where node i's query
  /// sees it (section 7: history by section 2's rule at i's position; the
  /// step's rows hold node nodes_at()[chain index], seen iff it is i or an
  /// ancestor of i and section 2's rule holds between their positions).
  void dense_mask(const LayerPolicy& policy, const SeqStepPlan& plan,
                  std::uint8_t* out) const noexcept {
    std::int64_t at = 0;
    for (int i = 0; i < n_; ++i) {
      for (int r = 0; r < plan.n_read; ++r) {
        for (int k = 0; k < plan.read[r].len; ++k) out[at++] = sees(policy, i, plan.read[r].pos + k) ? 1 : 0;
      }
    }
  }

  /// Does node i's query (at positions()[i]) see the key a row holding chain
  /// position `claimed` holds, for a layer with `policy`? Below position():
  /// history, by section 2's rule; else the node written at chain index
  /// claimed - position(), seen iff it is i or an ancestor of i and the rule
  /// holds between their positions. Precondition: 0 <= i < size(),
  /// claimed < position() + size().
  bool sees(const LayerPolicy& policy, int i, int claimed) const noexcept {
    const int q = positions()[i];
    if (claimed < position_) return policy.sees(q, claimed);
    const int j = nodes_at()[claimed - position_];
    return is_ancestor_or_self(j, i) && policy.sees(q, positions()[j]);
  }

 private:
  enum Array { kParents = 0, kPosition = 1, kChainIndex = 2, kNodeAt = 3, kArrays = 4 };
  int* array(Array a) noexcept { return ints_.get() + static_cast<std::ptrdiff_t>(a) * capacity_; }
  const int* array(Array a) const noexcept {
    return ints_.get() + static_cast<std::ptrdiff_t>(a) * capacity_;
  }

  int capacity_ = 0;
  int n_ = 0;
  int position_ = 0;
  int main_line_ = 0;
  internal::Buffer<int> ints_;  // kArrays arrays of capacity_ ints (Array)
  internal::Buffer<std::uint32_t> mask_;
};

}  // namespace kvcore
