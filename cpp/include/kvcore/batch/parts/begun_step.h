// BegunStep: what the begun step of a BatchCache recorded, in buffers sized
// at create: its entries (sequence, first position, context length, tokens,
// the block its first index held before the step), each group's slots and
// copies, the State groups' plans and the draft trees. The step's verbs stack
// on it, one concept a file: StepAdmission (whether a step fits before it
// begins, step_admission.h) and StepState (begin, plan and commit,
// step_state.h). Both see the tables through the walks here: walk_entry sees
// each index an entry writes as it will be once the begun step has ended, and
// end() gives back what the begun step took (walk_begun), which is also what
// admission counts as free again.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvcore/batch/batch_plan.h"
#include "kvcore/batch/block_pool.h"
#include "kvcore/batch/parts/block_divisor.h"
#include "kvcore/batch/parts/block_group.h"
#include "kvcore/batch/parts/sequence_table.h"
#include "kvcore/batch/parts/step_trees.h"
#include "kvcore/core/buffer.h"
#include "kvcore/core/result.h"

namespace kvcore {

/// The sizes a StepState is built for.
struct StepLimits {
  int max_seqs = 1;
  int n_groups = 1;
  int max_step = 1;         ///< largest T of one entry
  int max_step_tokens = 1;  ///< tokens of one step
  int block_size = 1;
  int capacity = 1;
  int n_state_groups = 0;
  int state_block_size = 1;   ///< a commit names the state at its end only on multiples of it
  int table_page_shift = 31;  ///< the groups' BlockGroup::page_shift(): 31 when a row is one page
};

// A step writing into `block` copies it when another sequence holds it, or
// when it is named: a named block never changes, so its key survives an
// abandoned step and stays true for the sequences that find it later.
inline bool must_copy(const GroupPool& pool, int block) noexcept {
  return pool.refs(block) > 1 || pool.keyed(block);
}

class BegunStep {
 public:
  /// The begun step, or id 0.
  const BatchStep& active() const noexcept { return active_; }
  Status check(const BatchStep& step) const noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(active_.id != 0, InvalidState, "step %llu: no step is begun",
                                 static_cast<unsigned long long>(step.id));
    KVCORE_CHECK_OR_RETURN_ERROR(step.id == active_.id, InvalidState,
                                 "step %llu: not the begun step (%llu)",
                                 static_cast<unsigned long long>(step.id),
                                 static_cast<unsigned long long>(active_.id));
    return Error::Ok;
  }

  /// Ends a begun step: the tables go back to what they were before it. The
  /// blocks it allocated return to the pools: those past each sequence's
  /// length, and at the index of its first new position a fresh block or a
  /// copy-on-write block (the backend may never have made the copy: the
  /// sequence gets back the shared block it copied from, which the step kept
  /// holding).
  void end(SequenceTable& seqs, BlockGroup* groups) noexcept;

 protected:
  int ceil_blocks(int positions) const noexcept { return div_.ceil(positions); }
  // The entry of `seq` in the begun step, or -1.
  int begun_entry(int seq) const noexcept {
    if (active_.id == 0) return -1;
    const int i = entry_of_[seq];
    return i < active_.n_entries && step_seq_[i] == seq ? i : -1;
  }
  int& first_before(int g, int entry) noexcept { return first_before_[g * lim_.max_seqs + entry]; }
  int first_before(int g, int entry) const noexcept { return first_before_[g * lim_.max_seqs + entry]; }

  // Visits (index, block) for the block indices an entry of T tokens at
  // `length` writes in group g, each block as it is once any begun step has
  // ended (the same walk before end(), for admission, and after, for planning).
  template <class Visit>
  void walk_entry(const BlockGroup& group, int g, int seq, int length, int T, Visit visit) const noexcept {
    const std::ptrdiff_t row = group.row_offset(seq);
    const int begun = begun_entry(seq);
    const int first = div_.floor(length);
    const int end = ceil_blocks(length + T);
    for (int b = first; b < end; ++b) {
      int cur = group.block_at_row(row, b);
      if (begun >= 0) cur = b == first ? first_before(g, begun) : -1;
      visit(b, cur);
    }
  }

  // Visits (seq, index, block, before) for each block the begun step put in
  // group g's tables in place of `before` (-1: none).
  template <class Visit>
  void walk_begun(const SequenceTable& seqs, const BlockGroup& group, int g, Visit visit) const noexcept {
    for (int i = 0; i < active_.n_entries; ++i) {
      const int seq = step_seq_[i];
      const std::ptrdiff_t row = group.row_offset(seq);
      const int first = div_.floor(seqs[seq].length);
      const int end = ceil_blocks(context_lens_[i]);
      for (int b = first; b < end; ++b) {
        const int before = b == first ? first_before(g, i) : -1;
        const int block = group.block_at_row(row, b);
        if (block != before) visit(seq, b, block, before);
      }
    }
  }

  // The buffers below (the trees have their own create), all or
  // MemoryAllocationFailed: StepState::create allocates into a fresh
  // StepState and moves it in only when every buffer exists.
  Status allocate(const StepLimits& limits) noexcept;

  StepLimits lim_;
  BlockDivisor div_;
  BatchStep active_;
  std::uint64_t last_step_id_ = 0;
  internal::Buffer<std::uint64_t> seen_;  // StepAdmission::check_entries' repeat check
  internal::Buffer<int> step_seq_;
  internal::Buffer<int> entry_of_;  // [seq]: its entry in the begun step (check step_seq_)
  internal::Buffer<int> query_starts_;
  internal::Buffer<int> first_positions_;
  internal::Buffer<int> context_lens_;
  internal::Buffer<int> visible_starts_;
  internal::Buffer<const PositionRange*> holes_of_;
  internal::Buffer<int> n_holes_of_;
  internal::Buffer<bool> tokens_given_;
  internal::Buffer<std::int32_t> step_tokens_;
  internal::Buffer<int> slots_;         // [g][max_step_tokens]
  internal::Buffer<BlockCopy> copies_;  // [g][max_seqs]
  internal::Buffer<int> first_before_;  // [g][entry]: the block at its first position's index before the step
  internal::Buffer<GroupPlan> group_plans_;
  internal::Buffer<StateGroupPlan> state_plans_;  // [state group]
  internal::Buffer<bool> keep_each_;              // [entry]: verify or tree: each state kept
  StepTrees trees_;
};

inline Status BegunStep::allocate(const StepLimits& limits) noexcept {
  const std::int64_t seqs = limits.max_seqs;
  const std::int64_t per_groups = limits.n_groups * seqs;
  seen_ = internal::Buffer<std::uint64_t>::make_zeroed(seqs);
  step_seq_ = internal::Buffer<int>::make(seqs);
  entry_of_ = internal::Buffer<int>::make_zeroed(seqs);
  query_starts_ = internal::Buffer<int>::make(seqs + 1);
  first_positions_ = internal::Buffer<int>::make(seqs);
  context_lens_ = internal::Buffer<int>::make(seqs);
  visible_starts_ = internal::Buffer<int>::make(seqs);
  holes_of_ = internal::Buffer<const PositionRange*>::make(seqs);
  n_holes_of_ = internal::Buffer<int>::make(seqs);
  tokens_given_ = internal::Buffer<bool>::make(seqs);
  step_tokens_ = internal::Buffer<std::int32_t>::make(limits.max_step_tokens);
  slots_ = internal::Buffer<int>::make(static_cast<std::int64_t>(limits.n_groups) * limits.max_step_tokens);
  copies_ = internal::Buffer<BlockCopy>::make(per_groups);
  first_before_ = internal::Buffer<int>::make(per_groups);
  group_plans_ = internal::Buffer<GroupPlan>::make(limits.n_groups);
  state_plans_ = internal::Buffer<StateGroupPlan>::make(limits.n_state_groups);
  keep_each_ = internal::Buffer<bool>::make(seqs);
  KVCORE_CHECK_OR_RETURN_ERROR(seen_ && step_seq_ && entry_of_ && query_starts_ && first_positions_ &&
                                   context_lens_ && visible_starts_ && holes_of_ && n_holes_of_ &&
                                   tokens_given_ && step_tokens_ && slots_ && copies_ && first_before_ &&
                                   group_plans_ && state_plans_ && keep_each_,
                               MemoryAllocationFailed, "cannot allocate the step buffers of %d tokens",
                               limits.max_step_tokens);
  return Error::Ok;
}

inline void BegunStep::end(SequenceTable& seqs, BlockGroup* groups) noexcept {
  if (active_.id == 0) return;
  for (int g = 0; g < lim_.n_groups; ++g) {
    BlockGroup& group = groups[g];
    walk_begun(seqs, group, g, [&](int seq, int b, int block, int before) {
      group.pool().release(block);
      if (before < 0) --group.held(seq);
      group.restore_block(seq, b, before);  // a page only the step filled goes back
    });
    group_plans_[g].n_copies = 0;
  }
  for (int i = 0; i < active_.n_entries; ++i) {
    SequenceState& s = seqs[step_seq_[i]];
    const int end = ceil_blocks(s.length);
    if (s.alloc_end > end) s.alloc_end = end;
  }
  active_ = BatchStep{};
}

}  // namespace kvcore
