// StepTrees: the draft trees of a BatchCache's begun step (docs/design.md
// section 7). A tree entry of N nodes takes the rows of a chain of N: node j
// writes the row of the entry's reserved position first + chain_index(j),
// where the main line (node 0, its lowest-index child, ...) keeps its chain
// places and every other node follows in node order. Per token it keeps the
// position (first + depth) and chain index, per tree entry the bit-packed
// ancestor mask; at commit it checks the accepted paths and lists the row
// copies that move each accepted node to the position it was accepted at.
// Chains (no parents, or parents[i] = i - 1) are plain steps: no mask.
#pragma once

#include <cstdint>
#include <memory>
#include <new>

#include "kvcore/batch/batch_plan.h"
#include "kvcore/core/buffer.h"
#include "kvcore/core/draft_tree.h"
#include "kvcore/core/result.h"

namespace kvcore {

class StepTrees {
 public:
  /// Buffers for steps of `max_step_tokens` tokens, `max_seqs` entries of up
  /// to `max_step` nodes and `n_groups` groups. MemoryAllocationFailed:
  /// nothing is assigned.
  Status create(int max_seqs, int n_groups, int max_step, int max_step_tokens) noexcept {
    StepTrees fresh;
    const std::int64_t tokens = max_step_tokens;
    // Mask rows up to kMaskNodes nodes wide for every token: a bound that stays
    // linear in the tokens when max_step is huge (check_mask_words refuses a step
    // whose trees need more).
    const std::int64_t words = tokens * tree_mask_words(max_step < kMaskNodes ? max_step : kMaskNodes);
    fresh.positions_ = internal::Buffer<int>::make(tokens);
    fresh.chain_index_ = internal::Buffer<int>::make(tokens);
    fresh.node_at_ = internal::Buffer<int>::make(tokens);
    fresh.parents_ = internal::Buffer<int>::make(tokens);
    fresh.masks_ = internal::Buffer<std::uint32_t>::make(words > 0 ? words : 1);
    fresh.mask_starts_ = internal::Buffer<int>::make(static_cast<std::int64_t>(max_seqs) + 1);
    fresh.accepted_ = internal::Buffer<int>::make(max_seqs);
    fresh.paths_ = internal::Buffer<const AcceptedPath*>::make(max_seqs);
    fresh.row_copies_ = internal::Buffer<TreeCopy>::make(static_cast<std::int64_t>(n_groups) * tokens);
    fresh.group_commits_ = internal::Buffer<GroupCommit>::make(n_groups);
    KVCORE_CHECK_OR_RETURN_ERROR(fresh.positions_ && fresh.chain_index_ && fresh.node_at_ && fresh.parents_ &&
                                     fresh.masks_ && fresh.mask_starts_ && fresh.accepted_ && fresh.paths_ && fresh.row_copies_ &&
                                     fresh.group_commits_,
                                 MemoryAllocationFailed, "cannot allocate the tree buffers of %d tokens",
                                 max_step_tokens);
    fresh.max_step_tokens_ = max_step_tokens;
    fresh.mask_capacity_ = words;
    fresh.n_groups_ = n_groups;
    *this = static_cast<StepTrees&&>(fresh);
    return Error::Ok;
  }

  /// InvalidArgument (naming the sequence, node and value) unless the entry's
  /// parents, when given, form a tree in topological order (draft_tree.h).
  static Status check_entry(const StepEntry& e) noexcept {
    if (e.parents == nullptr) return Error::Ok;
    return check_tree(e.parents, e.T, e.T);  // T itself is checked against max_step before
  }

  /// The mask words entry `e` (checked) needs: N x ceil(N / 32) for a tree,
  /// none for a chain.
  static std::int64_t mask_words(const StepEntry& e) noexcept {
    if (e.parents == nullptr || tree_is_chain(e.parents, e.T)) return 0;
    return static_cast<std::int64_t>(e.T) * tree_mask_words(e.T);
  }

  /// InvalidArgument unless the entries' trees fit the mask buffer: `words`,
  /// the sum of mask_words() over the entries. Only a step with trees of more
  /// than kMaskNodes nodes can need more than its tokens' share.
  Status check_mask_words(std::int64_t words) const noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(words <= mask_capacity_, InvalidArgument,
                                 "begin_step: the trees' ancestor masks need %lld words, the step buffers hold "
                                 "%lld (max_step_tokens x ceil(min(max_step, 256) / 32))",
                                 static_cast<long long>(words), static_cast<long long>(mask_capacity_));
    return Error::Ok;
  }

  /// Trees up to this many nodes always fit the mask buffer.
  static constexpr int kMaskNodes = 256;

  /// Records every entry's positions, chain indices and masks (entries
  /// checked): start_record(), record_entry() for each entry in order,
  /// end_record(n). A chain entry records its positions and chain indices
  /// only; its parents and nodes (the identity) are filled when a commit
  /// names a path for it (check_accepted), the only reader of them.
  void start_record() noexcept {
    words_ = 0;
    n_trees_ = 0;
  }
  /// Entry i (T = N tokens from token `at`, its first position `first`).
  /// Returns whether it is a tree (not a chain).
  bool record_entry(int i, const StepEntry& e, int at, int first) noexcept {
    const int N = e.T;
    mask_starts_[i] = words_;
    if (e.parents == nullptr || tree_is_chain(e.parents, N)) {
      int* positions = positions_.get() + at;
      int* chain_index = chain_index_.get() + at;
      for (int j = 0; j < N; ++j) {
        positions[j] = first + j;
        chain_index[j] = j;
      }
      return false;
    }
    for (int j = 0; j < N; ++j) parents_[at + j] = e.parents[j];
    int* positions = positions_.get() + at;
    lay_out_tree(e.parents, N, positions, chain_index_.get() + at, node_at_.get() + at, masks_.get() + words_);
    for (int j = 0; j < N; ++j) positions[j] += first;  // depth to position
    words_ += N * tree_mask_words(N);
    ++n_trees_;
    return true;
  }
  void end_record(int n) noexcept {
    mask_starts_[n] = words_;
    n_entries_ = n;
  }

  const int* positions() const noexcept { return positions_.get(); }
  const int* chain_index() const noexcept { return chain_index_.get(); }
  /// Per tree entry's first token + chain place c: the node written at place
  /// c (a chain entry's place c holds node c; this is not filled for it).
  const int* node_at() const noexcept { return node_at_.get(); }
  const int* mask_starts() const noexcept { return mask_starts_.get(); }
  const std::uint32_t* masks() const noexcept { return masks_.get(); }
  bool is_tree(int entry) const noexcept { return mask_starts_[entry + 1] > mask_starts_[entry]; }

  /// Checks `accepted[0, n)` against the begun step (entry_of(seq): the
  /// entry of a sequence in the step or -1; query_starts: the step's token
  /// offsets; step_seq: each entry's sequence) and records each entry's accepted length (an unlisted chain
  /// keeps every token). InvalidArgument, nothing recorded: a sequence not
  /// in the step or listed twice, m outside [1, N], nodes not a root path or
  /// out of range, a tree entry left unlisted.
  template <class EntryOf>
  Status check_accepted(const AcceptedPath* accepted, int n, const int* query_starts, const int* step_seq,
                        EntryOf entry_of) noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(n >= 0 && (accepted != nullptr || n == 0), InvalidArgument,
                                 "commit: %d accepted paths (accepted %s)", n,
                                 accepted != nullptr ? "set" : "null");
    query_starts_ = query_starts;
    whole_ = n == 0 && n_trees_ == 0;  // a plain commit of chains: every token of every entry
    if (whole_) return Error::Ok;
    for (int i = 0; i < n_entries_; ++i) accepted_[i] = -1, paths_[i] = nullptr;
    for (int a = 0; a < n; ++a)
      KVCORE_RETURN_IF_ERROR(check_path(accepted[a], query_starts, entry_of(accepted[a].seq)));
    for (int i = 0; i < n_entries_; ++i) {
      if (accepted_[i] >= 0) continue;
      KVCORE_CHECK_OR_RETURN_ERROR(!is_tree(i), InvalidArgument,
                                   "commit: sequence %d's entry is a tree of %d nodes with no accepted path "
                                   "(a tree step commits with commit(step, accepted))",
                                   step_seq[i], query_starts[i + 1] - query_starts[i]);
      accepted_[i] = query_starts[i + 1] - query_starts[i];
    }
    return Error::Ok;
  }

  /// Entry i's accepted length (after check_accepted).
  int accepted(int entry) const noexcept {
    return whole_ ? query_starts_[entry + 1] - query_starts_[entry] : accepted_[entry];
  }
  /// Entry i's accepted path, or null when it was not listed (a whole chain).
  const AcceptedPath* path(int entry) const noexcept { return whole_ ? nullptr : paths_[entry]; }

  /// Moves the accepted tokens of entry i into path order (tokens at its
  /// query start; each accepted node's index is >= its depth, so ascending
  /// moves never overwrite a source still to move).
  void order_tokens(const AcceptedPath* path, int at, std::int32_t* tokens) const noexcept {
    if (path == nullptr) return;
    for (int d = 0; d < path->m; ++d) tokens[at + d] = tokens[at + path->nodes[d]];
  }

  /// Group g's row copies of entry i's accepted path (path null: none), from
  /// its slots (the group's, by token): accepted[d]'s row to the row of
  /// chain place d, where they differ, ascending d.
  void add_copies(int g, const AcceptedPath* path, int at, const int* slots) noexcept {
    if (path == nullptr) return;
    GroupCommit& gc = group_commits_[g];
    TreeCopy* out = row_copies_.get() + static_cast<std::ptrdiff_t>(g) * max_step_tokens_ + gc.n_copies;
    // Chain places (src -> dst) first, then the group's rows: the slots of
    // the nodes at those places.
    const int n = tree_commit_copies(chain_index_.get() + at, path->nodes, path->m, out);
    for (int c = 0; c < n; ++c)
      out[c] = TreeCopy{slots[at + node_at_[at + out[c].src]], slots[at + node_at_[at + out[c].dst]]};
    gc.n_copies += n;
  }

  /// Empties every group's copies (the start of a commit).
  void clear_copies() noexcept {
    for (int g = 0; g < n_groups_; ++g)
      group_commits_[g] = GroupCommit{row_copies_.get() + static_cast<std::ptrdiff_t>(g) * max_step_tokens_, 0};
  }

  /// The last commit's copies.
  BatchCommit commit_plan() const noexcept { return BatchCommit{n_groups_, group_commits_.get()}; }

 private:
  Status check_path(const AcceptedPath& path, const int* query_starts, int entry) noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(entry >= 0, InvalidArgument,
                                 "commit: an accepted path for sequence %d, which is not in the step", path.seq);
    KVCORE_CHECK_OR_RETURN_ERROR(accepted_[entry] < 0, InvalidArgument,
                                 "commit: sequence %d has two accepted paths", path.seq);
    const int at = query_starts[entry];
    const int N = query_starts[entry + 1] - at;
    if (!is_tree(entry))  // a chain's parents and nodes, recorded only now (record_entry)
      for (int j = 0; j < N; ++j) parents_[at + j] = j - 1, node_at_[at + j] = j;
    KVCORE_RETURN_IF_ERROR(kvcore::check_accepted(parents_.get() + at, N, path.nodes, path.m));
    accepted_[entry] = path.m;
    paths_[entry] = &path;
    return Error::Ok;
  }

  int max_step_tokens_ = 0;
  int n_groups_ = 0;
  std::int64_t mask_capacity_ = 0;  // words
  int n_entries_ = 0;
  int words_ = 0;    // mask words recorded so far
  int n_trees_ = 0;  // tree entries (not chains) of the recorded step
  bool whole_ = false;  // check_accepted: no path, no tree: every entry keeps all its tokens
  const int* query_starts_ = nullptr;  // check_accepted's
  internal::Buffer<int> positions_;    // [token]
  internal::Buffer<int> chain_index_;  // [token]: node's place among the entry's positions
  internal::Buffer<int> node_at_;      // [entry's first token + place]: the node there (a chain's: lazily)
  internal::Buffer<int> parents_;      // [token]: the entry's parents (a chain's: lazily)
  internal::Buffer<std::uint32_t> masks_;
  internal::Buffer<int> mask_starts_;  // [entry + 1], in words
  internal::Buffer<int> accepted_;     // [entry]: accepted length at commit
  internal::Buffer<const AcceptedPath*> paths_;  // [entry]: its accepted path, or null
  internal::Buffer<TreeCopy> row_copies_;  // [g][max_step_tokens]
  internal::Buffer<GroupCommit> group_commits_;
};

}  // namespace kvcore
