// StepState: the begun step of a BatchCache and its plan. begin() walks each
// entry's block indices once per group, and admission counts them the same way
// beforehand (walk_entry sees each index as it will be once a begun step this
// one replaces has ended), so what admission counts is what planning takes.
// A pool with a free block for every index the entries write admits without
// counting (the usual step: check_entries sums the indices as it checks).
// end() gives back what the begun step took (walk_begun), which is also what
// admission counts as free again. commit() makes the step's lengths the
// sequences' and lets the groups release what the windows passed. A decode
// step's chain entry that writes within a block it holds alone is planned in
// place, with no walk. State groups (state_group.h) plan each entry's state
// slots after its blocks; a tree commit lists their slot copies beside the
// groups' row copies.
#pragma once

#include <cstdint>
#include <memory>
#include <new>
#include <utility>

#include "kvcore/batch/batch_faces.h"
#include "kvcore/batch/batch_plan.h"
#include "kvcore/batch/parts/block_divisor.h"
#include "kvcore/batch/parts/block_group.h"
#include "kvcore/batch/parts/prefix_index.h"
#include "kvcore/batch/parts/sequence_table.h"
#include "kvcore/batch/parts/state_group.h"
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
  int table_page_blocks = 0;  ///< BatchLimits::table_page_blocks (0: unpaged)
};

class StepState {
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

  /// The entries of begin_step: n in [1, max_seqs], each an active sequence
  /// once, T in [1, max_step], within capacity, at most max_step_tokens in all.
  Status check_entries(const StepEntry* entries, int n, const SequenceTable& seqs) noexcept;

  /// OutOfResources unless `pool` has the blocks the entries need in every
  /// group (new ones, or private copies of shared ones) and `state_need`
  /// more (the State groups' blocks with states in the pool), judged on the
  /// block tables as end() leaves them (a begun step's state slots count as
  /// still held: at worst a replacing step is refused for blocks its
  /// predecessor's end would give back), and unless `tables` has the table
  /// pages the entries' rows lack for the indices they write (end() keeps a
  /// begun step's pages). Changes nothing.
  Status admit(const StepEntry* entries, int n, const SequenceTable& seqs, const BlockGroup* groups,
               std::int64_t state_need, const BlockPool& pool, const TablePages& tables) const noexcept;

  /// The blocks an entry of T tokens of `seq` takes in group g (new ones, or
  /// private copies of shared or named ones), judged as admit() judges each
  /// entry: admit() refuses a group whose entries' sum passes its free blocks
  /// (plus what end() gives back). Changes nothing.
  int entry_need(const SequenceTable& seqs, const BlockGroup& group, int g, int seq, int T) const noexcept;

  /// Begins the admitted step (any begun one has ended): each entry's blocks
  /// and slots, copies of shared blocks. Never fails.
  BatchStep begin(const StepEntry* entries, int n, SequenceTable& seqs, BlockGroup* groups,
                  StateGroup* states) noexcept;

  /// Ends a begun step: the tables go back to what they were before it. The
  /// blocks it allocated return to the pools: those past each sequence's
  /// length, and at the index of its first new position a fresh block or a
  /// copy-on-write block (the backend may never have made the copy: the
  /// sequence gets back the shared block it copied from, which the step kept
  /// holding).
  void end(SequenceTable& seqs, BlockGroup* groups) noexcept;

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

  Status allocate(const StepLimits& limits) noexcept;
  Status admit_pages(const StepEntry* entries, int n, const SequenceTable& seqs, const BlockGroup* groups,
                     const TablePages& tables) const noexcept;
  // log2(P) for paged tables of P entries a page, 31 unpaged (a row is one page).
  static int page_shift_of(int page_blocks) noexcept {
    for (int s = 0; s < 31; ++s)
      if (page_blocks == (1 << s)) return s;
    return 31;
  }
  int place_entry(BlockGroup& group, int g, int i, int copies) noexcept;
  void fill_slots(const BlockGroup& group, int g, int i, bool tree) noexcept;

  StepLimits lim_;
  BlockDivisor div_;
  BatchStep active_;
  std::uint64_t last_step_id_ = 0;
  std::uint64_t stamp_ = 0;
  std::int64_t walked_blocks_ = 0;  // check_entries: block indices the entries write, summed
  std::int64_t walked_pages_ = 0;   // check_entries: table pages those indices lie in, summed
  internal::Buffer<std::uint64_t> seen_;  // check_entries' repeat check
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

// A step writing into `block` copies it when another sequence holds it, or
// when it is named: a named block never changes, so its key survives an
// abandoned step and stays true for the sequences that find it later.
inline bool must_copy(const GroupPool& pool, int block) noexcept {
  return pool.refs(block) > 1 || pool.keyed(block);
}

inline Status StepState::allocate(const StepLimits& limits) noexcept {
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

inline Status StepState::check_entries(const StepEntry* entries, int n, const SequenceTable& seqs) noexcept {
  KVCORE_CHECK_OR_RETURN_ERROR(n >= 1 && n <= lim_.max_seqs, InvalidArgument,
                               "begin_step: %d entries, must be in [1, max_seqs = %d]", n, lim_.max_seqs);
  KVCORE_CHECK_OR_RETURN_ERROR(entries != nullptr, InvalidArgument, "begin_step: entries is null");
  ++stamp_;
  std::int64_t tokens = 0;  // n values of T up to max_step each: 64 bits
  std::int64_t walked = 0;  // block indices the entries write, each at most once per entry
  std::int64_t walked_pages = 0;  // table pages they lie in (paged tables: P = 2^shift)
  const int page_shift = page_shift_of(lim_.table_page_blocks);
  std::int64_t mask_words = 0;  // the trees' ancestor masks
  for (int i = 0; i < n; ++i) {
    const StepEntry& e = entries[i];
    if (!seqs.is_active(e.seq)) return seqs.check_active("begin_step", e.seq);
    KVCORE_CHECK_OR_RETURN_ERROR(seen_[e.seq] != stamp_, InvalidArgument, "begin_step: sequence %d appears twice",
                                 e.seq);
    seen_[e.seq] = stamp_;
    KVCORE_CHECK_OR_RETURN_ERROR(e.T >= 1 && e.T <= lim_.max_step, InvalidArgument,
                                 "begin_step: sequence %d with T = %d, must be in [1, max_step = %d]", e.seq,
                                 e.T, lim_.max_step);
    if (e.parents != nullptr) {
      KVCORE_RETURN_IF_ERROR(StepTrees::check_entry(e));
      mask_words += StepTrees::mask_words(e);
    }
    const int length = seqs[e.seq].length;
    KVCORE_CHECK_OR_RETURN_ERROR(static_cast<std::int64_t>(length) + e.T <= lim_.capacity, OutOfResources,
                                 "begin_step: sequence %d at length %d with T = %d would pass "
                                 "capacity = %d",
                                 e.seq, length, e.T, lim_.capacity);
    tokens += e.T;
    KVCORE_CHECK_OR_RETURN_ERROR(tokens <= lim_.max_step_tokens, InvalidArgument,
                                 "begin_step: %d tokens or more, must be <= max_step_tokens = %d", tokens,
                                 lim_.max_step_tokens);
    const int first = div_.floor(length), last = div_.floor(length + e.T - 1);  // length + T - 1 < capacity
    walked += last - first + 1;
    walked_pages += (last >> page_shift) - (first >> page_shift) + 1;
  }
  walked_blocks_ = walked;
  walked_pages_ = walked_pages;
  return trees_.check_mask_words(mask_words);
}

inline int StepState::entry_need(const SequenceTable& seqs, const BlockGroup& group, int g, int seq,
                                  int T) const noexcept {
  const GroupPool& pool = group.pool();
  int need = 0;
  walk_entry(group, g, seq, seqs[seq].length, T, [&](int, int cur) { need += cur < 0 || must_copy(pool, cur); });
  return need;
}

inline Status StepState::admit(const StepEntry* entries, int n, const SequenceTable& seqs,
                               const BlockGroup* groups, std::int64_t state_need, const BlockPool& pool,
                               const TablePages& tables) const noexcept {
  KVCORE_RETURN_IF_ERROR(admit_pages(entries, n, seqs, groups, tables));
  if (lim_.n_groups == 0 && state_need == 0) return Error::Ok;
  // Every group draws from one pool. An entry takes at most one block per
  // index it writes in each group (check_entries counted them), and end()
  // only adds free blocks: a pool with that many free admits the step,
  // whatever the exact count below would say.
  if (pool.free_blocks() >= walked_blocks_ * lim_.n_groups + state_need) return Error::Ok;
  std::int64_t need = state_need;
  int freed = 0;  // what end() gives back
  for (int g = 0; g < lim_.n_groups; ++g) {
    for (int i = 0; i < n; ++i) need += entry_need(seqs, groups[g], g, entries[i].seq, entries[i].T);
    walk_begun(seqs, groups[g], g, [&](int, int, int, int) { ++freed; });
  }
  const int free = pool.free_blocks() + freed;
  KVCORE_CHECK_OR_RETURN_ERROR(need <= free || state_need > 0, OutOfResources,
                               "begin_step: the step needs %lld blocks over its %d group%s, %d of the pool's %d are free",
                               static_cast<long long>(need), lim_.n_groups, lim_.n_groups == 1 ? "" : "s", free,
                               pool.n_blocks());
  KVCORE_CHECK_OR_RETURN_ERROR(need <= free, OutOfResources,
                               "begin_step: the step needs %lld blocks over its %d groups (%lld of them for the "
                               "states of %d State group%s), %d of the pool's %d are free",
                               static_cast<long long>(need), lim_.n_groups + lim_.n_state_groups,
                               static_cast<long long>(state_need), lim_.n_state_groups,
                               lim_.n_state_groups == 1 ? "" : "s", free, pool.n_blocks());
  return Error::Ok;
}

inline Status StepState::admit_pages(const StepEntry* entries, int n, const SequenceTable& seqs,
                                     const BlockGroup* groups, const TablePages& tables) const noexcept {
  // Each entry writes indices [floor(length / B), ceil((length + T) / B)),
  // in walked_pages_ pages per group at most: free pages for all admit.
  if (tables.pinned() || tables.free_pages() >= walked_pages_ * lim_.n_groups) return Error::Ok;
  std::int64_t need = 0;
  for (int g = 0; g < lim_.n_groups; ++g)
    for (int i = 0; i < n; ++i) {
      const int length = seqs[entries[i].seq].length;
      need += groups[g].missing_pages(entries[i].seq, div_.floor(length), ceil_blocks(length + entries[i].T));
    }
  KVCORE_CHECK_OR_RETURN_ERROR(need <= tables.free_pages(), OutOfResources,
                               "begin_step: the step's block tables need %lld more table pages, %d of "
                               "batch.table_pages = %d are free",
                               static_cast<long long>(need), tables.free_pages(), tables.n_pages());
  return Error::Ok;
}

inline void StepState::end(SequenceTable& seqs, BlockGroup* groups) noexcept {
  if (active_.id == 0) return;
  for (int g = 0; g < lim_.n_groups; ++g) {
    BlockGroup& group = groups[g];
    walk_begun(seqs, group, g, [&](int seq, int b, int block, int before) {
      group.pool().release(block);
      if (before < 0) --group.held(seq);
      group.set_block(seq, b, before);  // the step's page stays the row's
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
    BlockKey key;  // a length ending on a keyed block: its state is named for prefix reuse
    if (lim_.n_state_groups > 0 && prefix.boundary_key(seq, s.length, &key))
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
