// StepState: the begun step of a BatchCache and its plan: begin() takes each
// admitted entry's blocks and slots, plan() shows them, commit() makes the
// step's lengths the sequences' and lets the groups release what the windows
// passed. It stands on StepAdmission (whether a step fits, step_admission.h)
// and BegunStep (what the step recorded, end(), begun_step.h). A decode
// step's chain entry that writes within a block it holds alone is planned in
// place, with no walk. State groups (state_group.h) plan each entry's state
// slots after its blocks; a tree commit lists their slot copies beside the
// groups' row copies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "kvcore/batch/batch_faces.h"
#include "kvcore/batch/batch_plan.h"
#include "kvcore/batch/block_key.h"
#include "kvcore/batch/parts/begun_step.h"
#include "kvcore/batch/parts/block_group.h"
#include "kvcore/batch/parts/prefix_index.h"
#include "kvcore/batch/parts/sequence_table.h"
#include "kvcore/batch/parts/state_group.h"
#include "kvcore/batch/parts/step_admission.h"
#include "kvcore/batch/parts/table_pages.h"
#include "kvcore/core/result.h"

namespace kvcore {

class StepState : public StepAdmission {
 public:
  /// The step buffers, and each group's plan pointing into them and at the
  /// groups' block tables (`rows` rows of `stride` entries in `pages`).
  /// MemoryAllocationFailed: nothing is assigned (the buffers are built in
  /// another StepState, moved in once all exist).
  Status create(const StepLimits& limits, const BlockGroup* groups, int stride, int rows, const TablePages& pages,
                const StateGroup* states) noexcept {
    StepState fresh;
    KVCORE_RETURN_IF_ERROR(fresh.allocate(limits));
    KVCORE_RETURN_IF_ERROR(fresh.trees_.create(limits.max_seqs, limits.n_groups + limits.n_state_groups,
                                               limits.max_step, limits.max_step_tokens));
    for (int k = 0; k < limits.n_state_groups; ++k) {
      StateGroupPlan& sp = fresh.state_plans_[k];
      sp.read_slots = states[k].read_slots();
      sp.write_slots = states[k].write_slots();
      sp.slots_per_seq = states[k].slots();
      sp.num_slots = states[k].num_slots();
      sp.policy = states[k].policy();
    }
    fresh.lim_ = limits;
    fresh.div_.set(limits.block_size);
    for (int g = 0; g < limits.n_groups; ++g) {
      GroupPlan& gp = fresh.group_plans_[g];
      gp.slots = fresh.slots_.get() + static_cast<std::ptrdiff_t>(g) * limits.max_step_tokens;
      gp.copies = fresh.copies_.get() + static_cast<std::ptrdiff_t>(g) * limits.max_seqs;
      gp.block_tables = pages.pinned() ? pages.data() + static_cast<std::ptrdiff_t>(g) * rows * stride : nullptr;
      gp.table_stride = stride;
      gp.table_pages = pages.data();
      gp.table_dir = groups[g].directory();
      gp.dir_stride = groups[g].dir_stride();
      gp.page_blocks = pages.page_blocks();
      gp.page_shift = groups[g].page_shift();
      gp.policy = groups[g].policy();
    }
    *this = std::move(fresh);
    return Error::Ok;
  }

  /// Begins the admitted step (any begun one has ended): each entry's blocks
  /// and slots, copies of shared blocks. Never fails.
  BatchStep begin(const StepEntry* entries, int n, SequenceTable& seqs, BlockGroup* groups,
                  StateGroup* states) noexcept;

  /// Checks the accepted paths of a commit of the begun step (step checked):
  /// StepTrees::check_accepted. A plain commit is (nullptr, 0).
  Status check_accepted(const AcceptedPath* accepted, int n) noexcept {
    return trees_.check_accepted(accepted, n, query_starts_.get(), step_seq_.get(),
                                 [this](int seq) { return seq >= 0 && seq < lim_.max_seqs ? begun_entry(seq) : -1; });
  }

  /// Commits the begun step (checked, and its accepted paths): each entry's
  /// accepted tokens become the sequence's next positions (every token of a
  /// chain entry with no path), the blocks reserved past them return, prefix
  /// keys and window releases follow. Returns the row copies of tree entries.
  BatchCommit commit(SequenceTable& seqs, BlockGroup* groups, PrefixIndex& prefix, StateGroup* states) noexcept;

  /// After check_accepted, on a model with State groups: InvalidState when a
  /// path stops a chain entry begun without verify early (m < T): its State
  /// groups kept only the state after its last token. Changes nothing.
  Status check_state_commit(const AcceptedPath* accepted, int n) const noexcept {
    for (int a = 0; a < n; ++a) {
      const int i = begun_entry(accepted[a].seq);
      const int T = query_starts_[i + 1] - query_starts_[i];
      KVCORE_CHECK_OR_RETURN_ERROR(keep_each_[i] || accepted[a].m >= T, InvalidState,
                                   "commit: sequence %d accepts m = %d of its T = %d tokens, but its step was "
                                   "begun without verify: the State groups kept only the state after its "
                                   "last token",
                                   accepted[a].seq, accepted[a].m, T);
    }
    return Error::Ok;
  }

  /// The begun step's plan (checked by the caller).
  BatchStepPlan plan() const noexcept;

 private:
  int place_entry(BlockGroup& group, int g, int i, int copies) noexcept;
  void fill_slots(const BlockGroup& group, int g, int i, bool tree) noexcept;
};

// Entry i's blocks in group g: new ones, private copies of shared or named
// ones (the step keeps holding the copied block until it commits, so no entry
// writes into it, another holder in this step copies too, and an abandoned
// step can give it back as it was, key included). Returns the group's copies so far.
inline int StepState::place_entry(BlockGroup& group, int g, int i, int copies) noexcept {
  const int seq = step_seq_[i];
  const std::ptrdiff_t row = group.row_offset(seq);
  GroupPool& pool = group.pool();
  const int first = div_.floor(first_positions_[i]);
  first_before(g, i) = group.block_at_row(row, first);  // what an abandoned step restores
  // walk_entry's blocks: no step is begun here (begin() runs after end()).
  const int end = ceil_blocks(context_lens_[i]);
  for (int b = first; b < end; ++b) {
    const int cur = group.block_at_row(row, b);
    if (cur < 0) {
      group.set_block(seq, b, pool.allocate());
      ++group.held(seq);
    } else if (must_copy(pool, cur)) {
      const int fresh = pool.allocate();
      group.set_block(seq, b, fresh);
      copies_[g * lim_.max_seqs + copies++] = BlockCopy{cur, fresh};
    }  // else its own unnamed block: written in place
  }
  return copies;
}

// Entry i's slots in group g: row of each new position, block by block,
// for the node written there (a tree's node at its chain place).
inline void StepState::fill_slots(const BlockGroup& group, int g, int i, bool tree) noexcept {
  const int B = lim_.block_size;
  const std::ptrdiff_t row = group.row_offset(step_seq_[i]);
  const int first = first_positions_[i];
  const int end = context_lens_[i];
  int* slots = slots_.get() + static_cast<std::ptrdiff_t>(g) * lim_.max_step_tokens + query_starts_[i];
  const int* node_at = trees_.node_at() + query_starts_[i];  // the node written at each position (a chain: itself)
  for (int p = first; p < end;) {
    const int b = div_.floor(p);
    const std::int64_t next = (static_cast<std::int64_t>(b) + 1) * B;
    const int block_end = next < end ? static_cast<int>(next) : end;
    const int base = group.block_at_row(row, b) * B - b * B;  // block * B + p % B for p in block b
    if (tree) {
      for (; p < block_end; ++p) slots[node_at[p - first]] = base + p;
    } else {
      for (; p < block_end; ++p) slots[p - first] = base + p;
    }
  }
}

// One pass over the entries: each entry's arrays, tokens and tree, then its
// blocks and slots in every group before the next entry (each group's
// allocations and copies still come in entry order).
inline BatchStep StepState::begin(const StepEntry* entries, int n, SequenceTable& seqs, BlockGroup* groups,
                                  StateGroup* states) noexcept {
  const int B = lim_.block_size;
  const int n_groups = lim_.n_groups;
  const std::ptrdiff_t group_slots = lim_.max_step_tokens;
  int* const step_seq = step_seq_.get();
  int* const entry_of = entry_of_.get();
  int* const query_starts = query_starts_.get();
  int* const first_positions = first_positions_.get();
  int* const context_lens = context_lens_.get();
  int* const visible_starts = visible_starts_.get();
  const PositionRange** const holes_of = holes_of_.get();
  int* const n_holes_of = n_holes_of_.get();
  bool* const tokens_given = tokens_given_.get();
  std::int32_t* const step_tokens = step_tokens_.get();
  int* const slots = slots_.get();
  for (int g = 0; g < n_groups; ++g) group_plans_[g].n_copies = 0;
  trees_.start_record();
  int at = 0;
  for (int i = 0; i < n; ++i) {
    const StepEntry& e = entries[i];
    const int seq = e.seq, T = e.T;
    SequenceState& s = seqs[seq];
    const int first = s.length;
    step_seq[i] = seq;
    entry_of[seq] = i;
    query_starts[i] = at;
    first_positions[i] = first;
    context_lens[i] = first + T;
    visible_starts[i] = s.start;
    holes_of[i] = seqs.holes(seq);
    n_holes_of[i] = s.n_holes;
    tokens_given[i] = e.tokens != nullptr;
    if (e.tokens == nullptr) {
      for (int j = 0; j < T; ++j) step_tokens[at + j] = 0;
    } else if (T == 1) {
      step_tokens[at] = e.tokens[0];
    } else {
      for (int j = 0; j < T; ++j) step_tokens[at + j] = e.tokens[j];
    }
    const bool tree = trees_.record_entry(i, e, at, first);
    const int b = div_.floor(first);
    // A chain within block b, which the sequence holds alone and unnamed,
    // writes in place: no block taken, slots in one run (the usual decode entry).
    const bool one_block = !tree && div_.floor(first + T - 1) == b;
    const std::ptrdiff_t row = n_groups > 0 ? groups[0].row_offset(seq) : 0;
    for (int g = 0; g < n_groups; ++g) {
      BlockGroup& group = groups[g];
      const int cur = group.block_at_row(row, b);
      if (one_block && cur >= 0 && !must_copy(group.pool(), cur)) {
        first_before(g, i) = cur;
        int* out = slots + g * group_slots + at;
        const int base = cur * B - b * B + first;  // row of position first
        if (T == 1) {
          out[0] = base;
        } else {
          for (int j = 0; j < T; ++j) out[j] = base + j;
        }
        continue;
      }
      group_plans_[g].n_copies = place_entry(group, g, i, group_plans_[g].n_copies);
      fill_slots(group, g, i, tree);
    }
    keep_each_[i] = e.verify || e.parents != nullptr;
    for (int k = 0; k < lim_.n_state_groups; ++k)
      states[k].begin_entry(seq, first, T, at, keep_each_[i], e.parents, trees_.chain_index() + at);
    const int end_block = ceil_blocks(first + T);
    if (end_block > s.alloc_end) s.alloc_end = end_block;
    at += T;
  }
  query_starts[n] = at;
  trees_.end_record(n);
  active_ = BatchStep{++last_step_id_, n, at};
  return active_;
}

inline BatchCommit StepState::commit(SequenceTable& seqs, BlockGroup* groups, PrefixIndex& prefix,
                                     StateGroup* states) noexcept {
  trees_.clear_copies();
  for (int g = 0; g < lim_.n_groups; ++g)  // the copies are made: their sources go
    for (int c = 0; c < group_plans_[g].n_copies; ++c) groups[g].pool().release(copies_[g * lim_.max_seqs + c].src);
  for (int i = 0; i < active_.n_entries; ++i) {
    const int seq = step_seq_[i];
    const int at = query_starts_[i];
    const int m = trees_.accepted(i);
    const AcceptedPath* path = trees_.path(i);
    SequenceState& s = seqs[seq];
    s.length = first_positions_[i] + m;
    if (path != nullptr || m < context_lens_[i] - first_positions_[i]) {
      const int kept = ceil_blocks(s.length);  // blocks reserved only for rejected nodes go
      const int reserved = ceil_blocks(context_lens_[i]);
      for (int g = 0; g < lim_.n_groups; ++g) {
        trees_.add_copies(g, path, at, slots_.get() + static_cast<std::ptrdiff_t>(g) * lim_.max_step_tokens);
        groups[g].drop_range(seq, kept, reserved);
      }
      for (int k = 0; k < lim_.n_state_groups; ++k)  // an accepted node's state to its chain place's slot
        trees_.add_copies(lim_.n_groups + k, path, at, states[k].write_slots());
      trees_.order_tokens(path, at, step_tokens_.get());
    }  // else every token is kept, in place: nothing to copy or drop
    const int kept = ceil_blocks(s.length);
    if (s.alloc_end > kept) s.alloc_end = kept;
    prefix.append_tokens(seq, step_tokens_.get() + at, m, tokens_given_[i], groups, lim_.n_groups);
    for (int g = 0; g < lim_.n_groups; ++g) groups[g].evict(seq, s.length);
    BlockKey key;  // a length ending on a keyed block and a State block: its state is named for prefix reuse
    if (lim_.n_state_groups > 0 && s.length % lim_.state_block_size == 0 && prefix.boundary_key(seq, s.length, &key))
      for (int k = 0; k < lim_.n_state_groups; ++k)
        states[k].name(seq, s.length, key, prefix.namespace_of(seq), s.length / lim_.block_size - 1);
  }
  active_ = BatchStep{};
  BatchCommit c = trees_.commit_plan();
  c.n_groups = lim_.n_groups;
  c.n_state_groups = lim_.n_state_groups;
  c.state_groups = c.groups + lim_.n_groups;
  return c;
}

inline BatchStepPlan StepState::plan() const noexcept {
  BatchStepPlan p;
  p.n_entries = active_.n_entries;
  p.n_tokens = active_.n_tokens;
  p.block_size = lim_.block_size;
  p.seq_ids = step_seq_.get();
  p.query_starts = query_starts_.get();
  p.first_positions = first_positions_.get();
  p.context_lens = context_lens_.get();
  p.visible_starts = visible_starts_.get();
  p.holes = holes_of_.get();
  p.n_holes = n_holes_of_.get();
  p.n_groups = lim_.n_groups;
  p.groups = group_plans_.get();
  p.positions = trees_.positions();
  p.chain_index = trees_.chain_index();
  p.tree_mask_starts = trees_.mask_starts();
  p.tree_masks = trees_.masks();
  p.n_state_groups = lim_.n_state_groups;
  p.state_groups = state_plans_.get();
  return p;
}

}  // namespace kvcore
