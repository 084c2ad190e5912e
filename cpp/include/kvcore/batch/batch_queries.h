// BatchQueries: the read-only half of BatchCache's front (batch_cache.h): the
// limits and the block tables' layout, what a step entry of a sequence would
// take, what each sequence holds, the State groups' slots and the planner's
// answers (BatchPlanner, and BatchControl's queries). Nothing here changes the
// cache, so the answers sit apart from the verbs: BatchCache derives from this
// class and adds them (each verb's argument checks, then its move in
// BatchParts, batch_parts.h). Users include batch_cache.h; this header is its
// lower half.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvcore/batch/batch_faces.h"
#include "kvcore/batch/batch_plan.h"
#include "kvcore/batch/parts/batch_parts.h"
#include "kvcore/core/config.h"
#include "kvcore/core/result.h"

namespace kvcore {

class BatchQueries : public BatchControl, public BatchPlanner, protected BatchParts {
 public:
  // --- BatchControl: limits -------------------------------------------------
  int max_seqs() const noexcept override { return max_seqs_; }
  int capacity() const noexcept override { return capacity_; }
  int max_step() const noexcept override { return max_step_; }
  int max_step_tokens() const noexcept override { return max_step_tokens_; }
  /// The longest rewind ring and chunked groups keep history for, in positions
  /// (BatchLimits::max_rewind with its default, max_step, applied).
  int max_rewind() const noexcept { return max_rewind_; }
  int n_groups() const noexcept override { return n_groups_; }
  int n_layers() const noexcept override { return n_layers_; }
  int block_size() const noexcept override { return block_size_; }
  int n_state_groups() const noexcept override { return n_state_groups_; }
  /// The State groups' block, in tokens (BatchLimits::state_block_size, 0
  /// resolved to block_size): a commit names the state at its end only at a
  /// length that is a multiple of it, so hits on State layers land there.
  int state_block_size() const noexcept { return state_block_size_; }
  /// Block table entries per row: ceil(capacity / B).
  int table_stride() const noexcept { return stride_; }
  /// Sequences active at once (BatchLimits::max_active_seqs, default
  /// max_seqs): the rows of each group's block tables.
  int max_active_seqs() const noexcept { return rows_.rows(); }
  /// `group`'s block tables, [max_active_seqs()][table_stride()] (-1: no
  /// block), as a plan's GroupPlan::block_tables shows them; sequence s uses
  /// row table_rows()[s]. Null with paged tables (block_at() reads either).
  /// Precondition: a valid group.
  const int* block_tables(int group) const noexcept {
    return table_pages_.pinned() ? table_pages_.data() + static_cast<std::ptrdiff_t>(group) * rows_.rows() * stride_
                                 : nullptr;
  }
  /// The block at block index `i` of active sequence `seq`'s row in `group`
  /// (-1: none), either table layout. Precondition: valid group, active seq,
  /// i in [0, table_stride()).
  int block_at(int seq, int group, int i) const noexcept { return groups_[group].block_at(seq, i); }
  /// Entries per table page (BatchLimits::table_page_blocks; table_stride()
  /// when unpaged: a row is one page).
  int table_page_blocks() const noexcept { return table_pages_.page_blocks(); }
  /// Table pages every group draws from (unpaged: one per row and group).
  int table_pages() const noexcept { return table_pages_.n_pages(); }
  /// Table pages no row holds (0 unpaged: every page is a row's).
  int free_table_pages() const noexcept { return table_pages_.free_pages(); }
  /// A consistency check of the table pages, for tests and debugging (O(the
  /// tables)): Internal naming the first page that is neither free nor named
  /// by one row, or whose count of blocks is off. Changes nothing.
  Status check_tables() const noexcept { return check_table_pages(); }
  /// Each sequence id's row in every group's block tables, -1 for an inactive
  /// one (whatever max_active_seqs()); an active s has row s when
  /// max_active_seqs() == max_seqs().
  const int* table_rows() const noexcept { return rows_.row_of(); }
  /// Sequences that may still become active (add_sequence, fork into an
  /// inactive one) before one is refused for want of a table row:
  /// max_active_seqs() less the active sequences.
  int free_table_rows() const noexcept { return rows_.free_rows(); }

  // --- What a step entry takes (begin_step() counts the same) ----------------

  /// The blocks a step entry of `T` tokens of `seq` takes in each group, as
  /// begin_step() counts them (new blocks, and private copies of blocks other
  /// sequences hold or that are named), written to need[0, n_groups()).
  /// begin_step() admits a step when, in every group, its entries' sum is at
  /// most free_blocks(group), plus the blocks a begun step it replaces took:
  /// so a runner admitting requests one by one adds their needs up and begins
  /// the step once. Changes nothing. InvalidArgument: seq outside [0,
  /// max_seqs), T outside [1, max_step], need null. InvalidState: seq not
  /// active. OutOfResources: length + T > capacity.
  Status blocks_needed(int seq, int T, int* need) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_entry("blocks_needed", seq, T));
    KVCORE_CHECK_OR_RETURN_ERROR(need != nullptr, InvalidArgument, "blocks_needed(%d): need is null", seq);
    for (int g = 0; g < n_groups_; ++g) need[g] = step_.entry_need(seqs_, groups_[g], g, seq, T);
    return Error::Ok;
  }

  /// The table pages a step entry of `T` tokens of `seq` takes over every
  /// group (paged tables: pages its rows lack for the indices it writes; 0
  /// unpaged). begin_step() admits a step whose entries' sum is at most
  /// free_table_pages(). Changes nothing. Errors as blocks_needed.
  Result<int> table_pages_needed(int seq, int T) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_entry("table_pages_needed", seq, T));
    const int length = seqs_[seq].length, B = block_size_;
    int need = 0;
    for (int g = 0; g < n_groups_; ++g)
      need += groups_[g].missing_pages(seq, length / B,
                                       static_cast<int>((static_cast<std::int64_t>(length) + T + B - 1) / B));
    return need;
  }
  /// The table pages fork(src, dst, upto) takes at most over every group
  /// (paged tables: src's rows' pages holding a block below ceil(upto / B);
  /// 0 unpaged): fork() admits it when they are at most free_table_pages()
  /// plus table_pages_held(dst). Precondition: src active, upto in [0,
  /// length(src)].
  int fork_table_pages(int src, int upto) const noexcept { return static_cast<int>(fork_pages(src, upto)); }
  /// The table pages the rows of `seq` hold over every group (0 for an
  /// inactive sequence or unpaged tables); a fork into it gives them back
  /// first. Precondition: seq in [0, max_seqs).
  int table_pages_held(int seq) const noexcept { return static_cast<int>(pages_held(seq)); }
  /// With batch.states_in_pool, the pool's blocks a step entry of `T` tokens
  /// of `seq` takes for its states in every State group, as begin_step()
  /// counts them (one per state it keeps, every token's with `verify`, else
  /// the last, whose logical slot names no physical slot, a shared one or a
  /// named one); 0 without. begin_step() admits a step when the entries'
  /// blocks_needed over every group plus these fit the pool's free blocks.
  /// Changes nothing. Errors as blocks_needed (need aside); InvalidArgument
  /// too for a verify entry of T > D - 1 in some State group.
  Result<int> state_blocks_needed(int seq, int T, bool verify) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_entry("state_blocks_needed", seq, T));
    const int length = seqs_[seq].length;
    int need = 0;
    for (int k = 0; k < n_state_groups_; ++k) {
      KVCORE_CHECK_OR_RETURN_ERROR(!verify || T <= states_[k].slots() - 1, InvalidArgument,
                                   "state_blocks_needed(%d, T = %d): a verify step keeps every state, and state "
                                   "group %d keeps %d state slots: needs T <= slots - 1 = %d",
                                   seq, T, k, states_[k].slots(), states_[k].slots() - 1);
      need += states_[k].blocks_for_entry(seq, length, T, verify);
    }
    return need;
  }

  // --- BatchControl: queries -------------------------------------------------

  Result<SequenceInfo> sequence(int seq) const noexcept override {
    KVCORE_RETURN_IF_ERROR(seqs_.check_seq("sequence", seq));
    const SequenceState& s = seqs_[seq];
    return SequenceInfo{s.active, s.length, s.start, s.n_holes, seqs_.holes(seq)};
  }

  Result<int> free_blocks(int group) const noexcept override {
    KVCORE_RETURN_IF_ERROR(check_group(group));
    return pages_.free_blocks();
  }

  Result<int> cached_blocks(int group) const noexcept override {
    KVCORE_RETURN_IF_ERROR(check_group(group));
    return groups_[group].pool().cached_blocks();
  }

  Result<int> blocks_held(int seq, int group) const noexcept override {
    KVCORE_RETURN_IF_ERROR(seqs_.check_seq("blocks_held", seq));
    KVCORE_RETURN_IF_ERROR(check_group(group));
    return groups_[group].held(seq);
  }

  Result<int> oldest_held(int seq, int group) const noexcept override {
    KVCORE_RETURN_IF_ERROR(seqs_.check_seq("oldest_held", seq));
    KVCORE_RETURN_IF_ERROR(check_group(group));
    return groups_[group].oldest_held(seqs_[seq], seq);
  }

  /// The oldest position past its sink blocks whose rows group `group` still
  /// holds for `seq`: visible positions from here on are in its blocks (what
  /// an export carries). InvalidArgument: bad seq or group.
  Result<int> held_from(int seq, int group) const noexcept {
    KVCORE_RETURN_IF_ERROR(seqs_.check_seq("held_from", seq));
    KVCORE_RETURN_IF_ERROR(check_group(group));
    return groups_[group].lost_below(seq);
  }
  /// True between begin_step() and the commit, abort or verb that ends it.
  bool has_begun_step() const noexcept { return step_.active().id != 0; }

  // --- BatchPlanner ------------------------------------------------------------

  /// InvalidArgument also for a State layer (it has no block group:
  /// state_group_of() names its State group).
  Result<int> group_of(int layer) const noexcept override { return layout_.group_of(layer); }

  Result<int> state_group_of(int layer) const noexcept override { return layout_.state_group_of(layer); }

  Result<LayerPolicy> state_group_policy(int state_group) const noexcept override {
    KVCORE_RETURN_IF_ERROR(states_.check_group(state_group));
    return states_[state_group].policy();
  }

  Result<int> num_state_slots(int state_group) const noexcept override {
    KVCORE_RETURN_IF_ERROR(states_.check_group(state_group));
    return states_[state_group].num_slots();
  }

  /// The position whose state logical slot `slot` of `seq` in State group
  /// `state_group` holds (-1: none; slot(p) = p mod D), and the physical slot
  /// it names (-1: none), for tests and tools. InvalidArgument: bad state
  /// group, seq out of range or inactive, slot outside [0, D).
  Result<int> held_state(int state_group, int seq, int slot) const noexcept {
    KVCORE_RETURN_IF_ERROR(states_.check_slot(state_group, seqs_, max_seqs_, seq, slot));
    return states_[state_group].held(seq, slot);
  }
  Result<int> state_slot(int state_group, int seq, int slot) const noexcept {
    KVCORE_RETURN_IF_ERROR(states_.check_slot(state_group, seqs_, max_seqs_, seq, slot));
    return states_[state_group].physical(seq, slot);
  }
  /// Named state snapshots `state_group` keeps now (at most
  /// batch.state_snapshots; with states in the pool, its blocks carrying a
  /// key, held or cached, however many the pool keeps). InvalidArgument: bad
  /// state group.
  Result<int> state_snapshots(int state_group) const noexcept {
    KVCORE_RETURN_IF_ERROR(states_.check_group(state_group));
    return states_[state_group].named_count();
  }
  /// Physical slots of `state_group` no sequence names (with states in the
  /// pool: the pool's free blocks, cached ones included). InvalidArgument:
  /// bad state group.
  Result<int> free_state_slots(int state_group) const noexcept {
    KVCORE_RETURN_IF_ERROR(states_.check_group(state_group));
    return states_[state_group].free_slots();
  }

  Result<LayerConfig> layer_config(int layer) const noexcept override { return layout_.layer_config(layer); }

  Result<LayerPolicy> group_policy(int group) const noexcept override {
    KVCORE_RETURN_IF_ERROR(check_group(group));
    return groups_[group].policy();
  }

  Result<int> num_blocks(int group) const noexcept override {
    KVCORE_RETURN_IF_ERROR(check_group(group));
    return pages_.n_blocks();
  }

  Result<int> used_blocks(int group) const noexcept override {
    KVCORE_RETURN_IF_ERROR(check_group(group));
    return pages_.used_blocks();
  }

  /// Blocks group `group`'s sequences hold now (of the one pool's
  /// num_blocks()): how the budget splits between the groups. InvalidArgument:
  /// bad group.
  Result<int> held_blocks(int group) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_group(group));
    return pages_.held_blocks(group);
  }

  /// Group g's j-th layer that holds K/V rows shares the storage of the first
  /// such layer (by index) that is any group's j-th: every group's blocks come
  /// from one pool, so a block is one page of those layers' memory whichever
  /// group holds it (vLLM's KV cache tensors shared by the groups' layers).
  Result<int> storage_layer(int layer) const noexcept override { return layout_.storage_layer(layer); }

  Result<BatchStepPlan> plan(const BatchStep& step) const noexcept override {
    KVCORE_RETURN_IF_ERROR(step_.check(step));
    BatchStepPlan p = step_.plan();
    p.table_rows = rows_.row_of();
    return p;
  }

  Result<bool> visible(int group, int seq, int q, int k) const noexcept override {
    KVCORE_RETURN_IF_ERROR(check_group(group));
    KVCORE_RETURN_IF_ERROR(seqs_.check_seq("visible", seq));
    KVCORE_CHECK_OR_RETURN_ERROR(q >= 0 && k >= 0, InvalidArgument,
                                 "visible(q = %d, k = %d): positions must be >= 0", q, k);
    return groups_[group].policy().sees(q, k) && !seqs_.removed(seq, k);
  }

 protected:
  explicit BatchQueries(const CacheConfig& cfg) noexcept : BatchParts(cfg) {}
  ~BatchQueries() = default;

 private:
  // The arguments of an entry `what` counts the blocks of (blocks_needed,
  // state_blocks_needed): an active seq, T in [1, max_step], length + T
  // within capacity; InvalidArgument / InvalidState / OutOfResources naming them.
  Status check_entry(const char* what, int seq, int T) const noexcept {
    KVCORE_RETURN_IF_ERROR(seqs_.check_active(what, seq));
    KVCORE_CHECK_OR_RETURN_ERROR(T >= 1 && T <= max_step_, InvalidArgument, "%s(%d, T = %d): must be in [1, max_step = %d]",
                                 what, seq, T, max_step_);
    const int length = seqs_[seq].length;
    KVCORE_CHECK_OR_RETURN_ERROR(static_cast<std::int64_t>(length) + T <= capacity_, OutOfResources,
                                 "%s(%d, T = %d): length %d + T would pass capacity = %d", what, seq, T, length,
                                 capacity_);
    return Error::Ok;
  }

  Status check_group(int group) const noexcept { return layout_.check_group(group); }
};

}  // namespace kvcore
