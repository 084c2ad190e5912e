// StateGroups: every State group of a BatchCache as one part (docs/design.md
// section 9; docs/state.md). One StateGroup (state_group.h) per distinct
// State policy of the GroupLayout, each with its first layer; a sequence verb
// reaches them all at once here (release, fork, truncate, a step's end), and
// so do the rules the State groups add to the cache's verbs: what a step's
// entries, an import and a rewind need (the most restrictive group decides),
// and the checked queries of one group's slots. The groups are allocated at
// set_layout() and their slot tables at create(); nothing here allocates
// afterwards. Without State layers every loop is empty and every check passes.
#pragma once

#include <cstdint>
#include <utility>

#include "kvcore/batch/batch_plan.h"
#include "kvcore/batch/block_key.h"
#include "kvcore/batch/parts/group_layout.h"
#include "kvcore/batch/parts/sequence_admission.h"
#include "kvcore/batch/parts/sequence_table.h"
#include "kvcore/batch/parts/state_group.h"
#include "kvcore/batch/parts/table_rows.h"
#include "kvcore/core/buffer.h"
#include "kvcore/core/config.h"
#include "kvcore/core/result.h"

namespace kvcore {

class StateGroups {
 public:
  StateGroups() = default;
  StateGroups(const StateGroups&) = delete;
  StateGroups& operator=(const StateGroups&) = delete;

  /// One StateGroup per State group of `layout`, with its policy and first
  /// layer; no slot table yet (create()). MemoryAllocationFailed (the cache's
  /// layer tables): nothing is kept.
  Status set_layout(const GroupLayout& layout) noexcept {
    const int n = layout.n_state_groups();
    auto groups = internal::Buffer<StateGroup>::make(n > 0 ? n : 1);
    KVCORE_CHECK_OR_RETURN_ERROR(groups, MemoryAllocationFailed, "cannot allocate the layer tables of %d layers",
                                 layout.n_layers());  // the cache's layer tables, as GroupLayout's
    groups_ = std::move(groups);
    for (int k = 0; k < n; ++k) groups_[k].set_policy(layout.config(layout.state_layer(k)).policy, layout.state_layer(k));
    n_ = n;
    return Error::Ok;
  }
  /// Each group's slot tables (StateGroup::create) for the rows of `rows`
  /// (which outlives the groups), steps of `max_step_tokens` tokens and
  /// `snapshots` named snapshots; with `pool` (states in the pool), group k
  /// takes its slots from it as group `first_owner + k`. InvalidArgument,
  /// MemoryAllocationFailed: as StateGroup::create.
  Status create(const TableRows& rows, int max_step_tokens, int snapshots, BlockPool* pool = nullptr,
                int first_owner = 0) noexcept {
    for (int k = 0; k < n_; ++k)
      KVCORE_RETURN_IF_ERROR(groups_[k].create(rows, max_step_tokens, snapshots, pool, first_owner + k));
    return Error::Ok;
  }

  /// State groups in all.
  int size() const noexcept { return n_; }
  /// State group `k`. Precondition: 0 <= k < size().
  StateGroup& operator[](int k) noexcept { return groups_[k]; }
  const StateGroup& operator[](int k) const noexcept { return groups_[k]; }
  /// The groups as an array of size() (what the step state walks).
  StateGroup* get() noexcept { return groups_.get(); }
  const StateGroup* get() const noexcept { return groups_.get(); }

  // --- every group at once (StateGroup's verbs of the same names) -----------

  /// `seq` names no state slot any more.
  void release(int seq) noexcept {
    for (int k = 0; k < n_; ++k) groups_[k].release(seq);
  }
  /// `seq` stops holding the latest state it named (states in the pool).
  void release_named(int seq) noexcept {
    for (int k = 0; k < n_; ++k) groups_[k].release_named(seq);
  }
  /// `dst` shares the snapshots of `src` below `upto`.
  void fork(int src, int dst, int upto) noexcept {
    for (int k = 0; k < n_; ++k) groups_[k].fork(src, dst, upto);
  }
  /// `seq` keeps the states after positions below `n`; with states in the
  /// pool the slots left holding none give their blocks back (no step is begun).
  void truncate(int seq, int n) noexcept {
    for (int k = 0; k < n_; ++k) {
      groups_[k].truncate(seq, n);
      groups_[k].drop_unheld(seq);
    }
  }
  /// The begun step has ended: the slots it stopped naming go back.
  void end_step() noexcept {
    for (int k = 0; k < n_; ++k) groups_[k].end_step();
  }
  /// Every slot free, every snapshot forgotten.
  void clear() noexcept {
    for (int k = 0; k < n_; ++k) groups_[k].clear();
  }
  /// `seq` starts at length L from the snapshots named `key` (named(key)).
  void adopt(int seq, const BlockKey& key, int L) noexcept {
    for (int k = 0; k < n_; ++k) groups_[k].adopt(seq, key, L);
  }
  /// Names the state after L - 1 of `seq` by `key` (block `index` of prefix
  /// namespace `ns`) in every group (StateGroup::name: a no-op without
  /// snapshots or a held state).
  void name(int seq, int L, const BlockKey& key, std::uint64_t ns, int index) noexcept {
    for (int k = 0; k < n_; ++k) groups_[k].name(seq, L, key, ns, index);
  }
  /// `seq`, imported by `in` (check_import passed), holds the states after
  /// [held_from of each group's first layer, length), each in a fresh slot.
  void restore(int seq, const SequenceImport& in) noexcept {
    for (int k = 0; k < n_; ++k)
      groups_[k].restore(seq, in.length > 0 ? in.held_from(groups_[k].first_layer()) : 0, in.length);
  }

  /// The pool's blocks restore(seq, in) takes in all (0 without states in the
  /// pool): a fresh one for each state a group carries (the row `seq` takes
  /// names none).
  std::int64_t blocks_to_restore(const SequenceImport& in) const noexcept {
    std::int64_t n = 0;
    for (int k = 0; k < n_; ++k)
      if (groups_[k].in_pool() && in.length > 0) n += in.length - in.held_from(groups_[k].first_layer());
    return n;
  }
  /// The pool's blocks the steps' entries[0, n) take in every group
  /// (StateGroup::blocks_for_entry; `seqs` gives their lengths).
  std::int64_t blocks_for_step(const StepEntry* entries, int n, const SequenceTable& seqs) const noexcept {
    std::int64_t need = 0;
    for (int k = 0; k < n_; ++k) {
      if (!groups_[k].in_pool()) continue;
      for (int i = 0; i < n; ++i) {
        const StepEntry& e = entries[i];
        need += groups_[k].blocks_for_entry(e.seq, seqs[e.seq].length, e.T, e.verify || e.parents != nullptr);
      }
    }
    return need;
  }

  /// The first group that no longer holds the state after n - 1 of `seq`,
  /// -1 when every one does (or n = 0). Precondition: `seq` holds a row.
  int first_lost(int seq, int n) const noexcept {
    for (int k = 0; k < n_; ++k)
      if (!groups_[k].holds(seq, n)) return k;
    return -1;
  }
  /// Does every group keep a snapshot named `key` (true without groups)?
  bool named(const BlockKey& key) const noexcept {
    for (int k = 0; k < n_; ++k)
      if (!groups_[k].named(key)) return false;
    return true;
  }

  // --- the rules of the cache's verbs ----------------------------------------

  /// InvalidArgument unless `state_group` is in [0, size()).
  Status check_group(int state_group) const noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(state_group >= 0 && state_group < n_, InvalidArgument,
                                 "state_group = %d: must be in [0, n_state_groups = %d)", state_group, n_);
    return Error::Ok;
  }
  /// InvalidArgument unless `state_group` is valid, `seq` an active sequence
  /// of `seqs` (ids in [0, max_seqs)) and `slot` in [0, D) of that group.
  Status check_slot(int state_group, const SequenceTable& seqs, int max_seqs, int seq, int slot) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_group(state_group));
    KVCORE_CHECK_OR_RETURN_ERROR(seq >= 0 && seq < max_seqs && seqs[seq].active, InvalidArgument,
                                 "seq = %d: must be an active sequence in [0, max_seqs = %d)", seq, max_seqs);
    const int D = groups_[state_group].slots();
    KVCORE_CHECK_OR_RETURN_ERROR(slot >= 0 && slot < D, InvalidArgument,
                                 "slot = %d: must be in [0, slots = %d) of state group %d", slot, D, state_group);
    return Error::Ok;
  }
  /// An imported sequence on a model with State groups (docs/state.md): it
  /// removed nothing, and the layers of each State group (by `layout`) carry
  /// the same states after [held_from, length): the last one and at most D.
  /// InvalidArgument otherwise. Changes nothing.
  Status check_import(const SequenceImport& in, const GroupLayout& layout) const noexcept {
    if (n_ == 0) return Error::Ok;
    KVCORE_CHECK_OR_RETURN_ERROR(in.start == 0 && in.n_holes == 0, InvalidArgument,
                                 "import: the model has State layers, and the sequence removed positions (start "
                                 "%d, %d holes): a recurrent state cannot forget them",
                                 in.start, in.n_holes);
    for (int l = 0; l < layout.n_layers(); ++l) {
      const int k = layout.state_group(l);
      if (k < 0) continue;
      const int first = groups_[k].first_layer(), D = groups_[k].slots(), h = in.held_from(l);
      KVCORE_CHECK_OR_RETURN_ERROR(in.held_from(first) == h && in.sink_end(l) == 0, InvalidArgument,
                                   "import: State layer %d carries states from %d (sink_end %d), layer %d of its "
                                   "State group from %d",
                                   l, h, in.sink_end(l), first, in.held_from(first));
      const bool ok = in.length == 0 ? h == 0 : h <= in.length - 1 && in.length - h <= D;
      KVCORE_CHECK_OR_RETURN_ERROR(ok, InvalidArgument,
                                   "import: State layer %d (slots %d) carries states from %d at length %d: it needs "
                                   "the last state and at most D",
                                   l, D, h, in.length);
    }
    return Error::Ok;
  }
  /// The State groups' rules for begin_step's entries[0, n) (checked
  /// otherwise against `seqs`): a verify or tree entry of T > D - 1 is
  /// InvalidArgument, a sequence whose state after length - 1 is not held
  /// InvalidState. Changes nothing.
  Status check_entries(const StepEntry* entries, int n, const SequenceTable& seqs) const noexcept {
    for (int k = 0; k < n_; ++k) {
      const StateGroup& sg = groups_[k];
      for (int i = 0; i < n; ++i) {
        const StepEntry& e = entries[i];
        const bool keep_each = e.verify || e.parents != nullptr;
        KVCORE_CHECK_OR_RETURN_ERROR(
            !keep_each || e.T <= sg.slots() - 1, InvalidArgument,
            "begin_step: sequence %d with T = %d: a %s keeps the state after each of its positions, and "
            "state group %d keeps %d state slots: needs T <= slots - 1 = %d",
            e.seq, e.T, e.parents != nullptr ? "tree" : "verify step", k, sg.slots(), sg.slots() - 1);
        const int length = seqs[e.seq].length;
        KVCORE_CHECK_OR_RETURN_ERROR(sg.holds(e.seq, length), InvalidState,
                                     "begin_step: sequence %d at length %d: state group %d no longer holds the "
                                     "state after position %d (a step begun without verify keeps only its last "
                                     "state; an aborted step may have written its slot)",
                                     e.seq, length, k, length - 1);
      }
    }
    return Error::Ok;
  }

 private:
  internal::Buffer<StateGroup> groups_;  // [size()], at least one allocated
  int n_ = 0;
};

}  // namespace kvcore
