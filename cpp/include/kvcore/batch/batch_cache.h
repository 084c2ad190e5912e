// BatchCache: many sequences over one paged block pool, drawn on by groups of
// layers sharing a policy (docs/design.md section 6). Each sequence has its own
// length; each group maps a sequence's positions to blocks of B rows through a
// block table. Forks share blocks (copy-on-write for a shared, partly filled
// block), removals and rewinds release them, ring groups release blocks no
// future query can reach (keeping sinks and a max_step rewind margin), and
// full blocks named by their token ids are reused by new sequences with the
// same prefix. Every table is sized at create(); nothing on the step path
// (begin_step, plan, commit) or in a sequence verb allocates.
//
// The cache is a composition of parts (kvcore/batch/parts/), one concept each:
// the GroupLayout (which group each layer is in, fixed at create), the
// SequenceTable (lengths, removed heads and holes), one BlockGroup per group
// (its share of the one BlockPool, block tables; its GroupRule says what the
// policy releases and needs), the PrefixIndex (chained block keys, prompt
// lookup), the StepState (the begun step: admission, planning, commit and end
// share one walk), the TableRows (each active sequence's block table row),
// BatchSizes (the limits checked at create) and the StateGroups (one
// StateGroup per distinct State policy, and the rules they add to the verbs).
// BatchParts (batch_parts.h) holds them, builds them and makes each verb's
// moves; this class is the front: it implements the faces and checks each
// verb's arguments. The queries, which change nothing, are its base
// BatchQueries (batch_queries.h); this header is the one users include.
//
// State layers (docs/design.md section 9; docs/layer_kinds.md): layers of
// one State policy (D slots) form a State group, apart from the block groups
// (group_of() names none for them; state_group_of() does). Per sequence the
// group keeps D logical slots, slot(p) = p mod D, each naming a physical slot
// (the kernels' state_indices) from the group's pool of rows x D +
// max_step_tokens slots, all allocated at create(). The plan's StateGroupPlan
// says per token which slot its state starts from and where it is written
// (every token's for a verify step or a tree, T <= D - 1; else the last
// only). can_rewind(n) needs the state after n - 1 in every State group (the
// most restrictive group decides). A fork shares the source's snapshots below
// `upto` (no copy; a shared slot is never written in place: the next write
// takes a fresh slot). A tree commit returns slot copies beside the row
// copies. A prefix hit on a model with a State group reaches only a block
// whose state snapshot is named (batch.state_snapshots: a commit or a trusted
// import ending on that block names it), removing positions other than the
// tail is refused (a recurrent state cannot forget them), and a record carries
// the states it held (docs/state.md).
#pragma once

#include <cstdint>
#include <memory>
#include <new>

#include "kvcore/batch/batch_faces.h"
#include "kvcore/batch/batch_plan.h"
#include "kvcore/batch/batch_queries.h"
#include "kvcore/batch/block_pool.h"
#include "kvcore/batch/kv_events.h"
#include "kvcore/batch/parts/batch_parts.h"
#include "kvcore/batch/parts/block_group.h"
#include "kvcore/batch/parts/group_layout.h"
#include "kvcore/batch/parts/prefix_index.h"
#include "kvcore/batch/parts/sequence_admission.h"
#include "kvcore/batch/parts/sequence_table.h"
#include "kvcore/batch/parts/state_groups.h"
#include "kvcore/batch/parts/step_state.h"
#include "kvcore/batch/parts/table_rows.h"
#include "kvcore/core/buffer.h"
#include "kvcore/core/cache_base.h"
#include "kvcore/core/config.h"
#include "kvcore/core/result.h"

namespace kvcore {

class BatchCache final : public CacheBase, public BatchQueries {
 public:
  /// Validates `cfg` (validate() and validate_batch(): InvalidArgument naming
  /// the field) and builds the cache with every table it will use. InvalidArgument:
  /// the tables would exceed the address space (2^31 entries each).
  /// (A Shared layer reads its source's group, a Chunked layer has its own
  /// group, State layers of one policy form a State group.)
  /// MemoryAllocationFailed (naming what): a table cannot be allocated; nothing
  /// is kept. Never throws.
  static Result<std::unique_ptr<BatchCache>> create(const CacheConfig& cfg) noexcept {
    KVCORE_RETURN_IF_ERROR(validate_batch(cfg));
    std::unique_ptr<BatchCache> cache(new (std::nothrow) BatchCache(cfg));
    KVCORE_CHECK_OR_RETURN_ERROR(cache != nullptr, MemoryAllocationFailed,
                                 "cannot allocate a BatchCache of %d layers", cfg.n_layers);
    KVCORE_RETURN_IF_ERROR(cache->build(cfg));
    return cache;
  }

  BatchCache(const BatchCache&) = delete;
  BatchCache& operator=(const BatchCache&) = delete;

  // CacheBase.
  void* face(FaceId id) noexcept override {
    if (id == FaceId::batch_control) return static_cast<BatchControl*>(this);
    if (id == FaceId::batch_planner) return static_cast<BatchPlanner*>(this);
    return nullptr;
  }

  // --- BatchControl: sequence verbs ------------------------------------------

  Status add_sequence(int seq) noexcept override { return add_sequence(seq, 0); }

  Status add_sequence(int seq, std::uint64_t prefix_namespace) noexcept override {
    KVCORE_RETURN_IF_ERROR(seqs_.check_seq("add_sequence", seq));
    KVCORE_CHECK_OR_RETURN_ERROR(!seqs_[seq].active, InvalidState,
                                 "add_sequence(%d): the sequence is already active", seq);
    KVCORE_RETURN_IF_ERROR(check_row_free("add_sequence", seq));
    activate(seq, prefix_namespace);
    return Error::Ok;
  }

  Result<std::uint64_t> prefix_namespace(int seq) const noexcept override {
    KVCORE_RETURN_IF_ERROR(seqs_.check_seq("prefix_namespace", seq));
    return prefix_.namespace_of(seq);
  }

  Status release_sequence(int seq) noexcept override {
    KVCORE_RETURN_IF_ERROR(seqs_.check_active("release_sequence", seq));
    release(seq);
    return Error::Ok;
  }

  Status fork(int src, int dst, int upto) noexcept override {
    KVCORE_RETURN_IF_ERROR(seqs_.check_active("fork", src));
    KVCORE_RETURN_IF_ERROR(seqs_.check_seq("fork", dst));
    KVCORE_CHECK_OR_RETURN_ERROR(src != dst, InvalidArgument, "fork(%d, %d): src and dst are one sequence",
                                 src, dst);
    const SequenceState& s = seqs_[src];
    KVCORE_CHECK_OR_RETURN_ERROR(upto >= 0 && upto <= s.length, InvalidArgument,
                                 "fork(%d, %d, upto = %d): must be in [0, length = %d]", src, dst,
                                 upto, s.length);
    KVCORE_CHECK_OR_RETURN_ERROR(!seqs_[dst].active || holds_nothing(dst), InvalidState,
                                 "fork(%d, %d): dst holds %d positions; it must be empty", src, dst,
                                 seqs_[dst].length);
    const int blocking = rewind_blocker(src, upto);
    KVCORE_CHECK_OR_RETURN_ERROR(blocking < 0, InvalidState,
                                 "fork(%d, %d, upto = %d): %s %d of the source no longer holds "
                                 "what a query at %d needs",
                                 src, dst, upto, blocker_kind(blocking), blocker_index(blocking), upto);
    if (!seqs_[dst].active) KVCORE_RETURN_IF_ERROR(check_row_free("fork", dst));
    KVCORE_RETURN_IF_ERROR(check_fork_pages("fork", src, dst, upto));
    fork_into(src, dst, upto);
    return Error::Ok;
  }

  Status remove(int seq, int p0, int p1) noexcept override {
    KVCORE_RETURN_IF_ERROR(seqs_.check_active("remove", seq));
    KVCORE_CHECK_OR_RETURN_ERROR(p0 >= 0 && p1 >= p0, InvalidArgument,
                                 "remove(%d, p0 = %d, p1 = %d): needs 0 <= p0 <= p1", seq, p0, p1);
    const SequenceState& s = seqs_[seq];
    if (p1 >= s.length) {  // the tail: a truncation
      if (p0 >= s.length) {
        end_step();
        return Error::Ok;
      }
      return truncate(seq, p0, "remove");
    }
    if (p0 == p1 || p1 <= s.start) {
      end_step();
      return Error::Ok;
    }
    KVCORE_CHECK_OR_RETURN_ERROR(n_state_groups_ == 0, NotSupported,
                                 "remove(%d, %d, %d): the model has State layers (state group 0 keeps %d "
                                 "slots), whose state after position %d already folds in positions [%d, %d); "
                                 "only the tail can be removed (p1 >= length = %d)",
                                 seq, p0, p1, n_state_groups_ > 0 ? states_[0].slots() : 0, s.length - 1,
                                 p0 > s.start ? p0 : s.start, p1, s.length);
    if (p0 <= s.start) {  // the head (and any hole it reaches)
      end_step();
      seqs_.remove_head(seq, p1);
      prefix_.stop(seq);  // later rows were computed without the removed positions
      release_removed(seq, 0, seqs_[seq].start);
      return Error::Ok;
    }
    // A middle range [p0, p1) with start < p0 <= p1 < length: merge it into the holes.
    const SequenceTable::HoleMerge merge = seqs_.plan_hole(seq, p0, p1);
    KVCORE_CHECK_OR_RETURN_ERROR(merge.n_after <= max_holes_, OutOfResources,
                                 "remove(%d, %d, %d): the sequence would keep %d separate removed "
                                 "ranges, more than batch.max_holes = %d",
                                 seq, p0, p1, merge.n_after, max_holes_);
    end_step();
    seqs_.merge_hole(seq, merge);
    prefix_.stop(seq);
    release_removed(seq, merge.merged.begin, merge.merged.end);
    return Error::Ok;
  }

  Status rewind(int seq, int n) noexcept override {
    KVCORE_RETURN_IF_ERROR(seqs_.check_active("rewind", seq));
    KVCORE_CHECK_OR_RETURN_ERROR(n >= 0 && n <= seqs_[seq].length, InvalidArgument,
                                 "rewind(%d, n = %d): must be in [0, length = %d]", seq, n,
                                 seqs_[seq].length);
    return truncate(seq, n, "rewind");
  }

  bool can_rewind(int seq, int n) const noexcept override {
    return seq >= 0 && seq < max_seqs_ && seqs_[seq].active && n >= 0 && n <= seqs_[seq].length &&
           rewind_blocker(seq, n) < 0;
  }

  Result<int> adopt_prefix(int seq, const std::int32_t* tokens, int n) noexcept override {
    KVCORE_RETURN_IF_ERROR(seqs_.check_seq("adopt_prefix", seq));
    return adopt_prefix(seq, tokens, n, prefix_.namespace_of(seq));
  }

  Result<int> adopt_prefix(int seq, const std::int32_t* tokens, int n,
                           std::uint64_t prefix_namespace) noexcept override {
    KVCORE_RETURN_IF_ERROR(seqs_.check_active("adopt_prefix", seq));
    KVCORE_CHECK_OR_RETURN_ERROR(n >= 0 && n <= capacity_, InvalidArgument,
                                 "adopt_prefix(%d, n = %d): must be in [0, capacity = %d]", seq, n,
                                 capacity_);
    KVCORE_CHECK_OR_RETURN_ERROR(tokens != nullptr || n == 0, InvalidArgument,
                                 "adopt_prefix(%d): tokens is null", seq);
    KVCORE_CHECK_OR_RETURN_ERROR(holds_nothing(seq), InvalidState,
                                 "adopt_prefix(%d): the sequence holds %d positions; it must be empty",
                                 seq, seqs_[seq].length);
    return adopt(seq, tokens, n, prefix_namespace);
  }

  Result<int> lookup_prefix(const std::int32_t* tokens, int n, std::uint64_t prefix_namespace) const noexcept override {
    KVCORE_CHECK_OR_RETURN_ERROR(n >= 0 && n <= capacity_, InvalidArgument,
                                 "lookup_prefix(n = %d): must be in [0, capacity = %d]", n, capacity_);
    KVCORE_CHECK_OR_RETURN_ERROR(tokens != nullptr || n == 0, InvalidArgument, "lookup_prefix: tokens is null");
    return longest_hit(tokens, n, prefix_namespace) * block_size_;
  }

  // --- BatchControl: steps -----------------------------------------------------

  Result<BatchStep> begin_step(const StepEntry* entries, int n) noexcept override {
    KVCORE_RETURN_IF_ERROR(step_.check_entries(entries, n, seqs_));
    KVCORE_RETURN_IF_ERROR(states_.check_entries(entries, n, seqs_));
    // Judged on the tables as end_step() leaves them: a begun step this one
    // replaces gives back every block it took.
    KVCORE_RETURN_IF_ERROR(step_.admit(entries, n, seqs_, groups_.get(), states_.blocks_for_step(entries, n, seqs_),
                                       pages_, table_pages_));
    // Admitted: nothing below can fail. A replaced step's blocks go first.
    end_step();
    return step_.begin(entries, n, seqs_, groups_.get(), states_.get());
  }

  /// With batch.states_in_pool, `seq` stops holding the latest state it
  /// named in each State group, which it holds beyond its logical slots so
  /// that the state leaves with the blocks it ends (docs/batch.md section
  /// 10). The state stays named, so lookups still find it, and is cached
  /// (counted free, reclaimed least recently released first) once nothing
  /// else holds it; `seq` holds the next state it names. A scheduler short of
  /// blocks calls it before it preempts a sequence: a later hit traded for a
  /// running request. Returns the blocks it made free (0 without states in
  /// the pool). Ends a begun step, as every sequence verb does.
  /// InvalidArgument: `seq` outside [0, max_seqs); InvalidState: `seq`
  /// inactive. A refused call changes nothing.
  Result<int> release_named_state(int seq) noexcept {
    KVCORE_RETURN_IF_ERROR(seqs_.check_active("release_named_state", seq));
    end_step();
    const int before = pages_.free_blocks();
    states_.release_named(seq);
    return pages_.free_blocks() - before;
  }

  Status check_step(const BatchStep& step) const noexcept override { return step_.check(step); }

  Status commit(const BatchStep& step) noexcept override { return commit(step, nullptr, 0).status(); }

  Result<BatchCommit> commit(const BatchStep& step, const AcceptedPath* accepted, int n) noexcept override {
    KVCORE_RETURN_IF_ERROR(step_.check(step));
    KVCORE_RETURN_IF_ERROR(step_.check_accepted(accepted, n));
    if (n_state_groups_ > 0) KVCORE_RETURN_IF_ERROR(step_.check_state_commit(accepted, n));
    const BatchCommit done = step_.commit(seqs_, groups_.get(), prefix_, states_.get());
    states_.end_step();
    return done;
  }

  Status abort(const BatchStep& step) noexcept override {
    KVCORE_RETURN_IF_ERROR(check_step(step));
    end_step();
    return Error::Ok;
  }

  void clear() noexcept override {
    clear_parts();
  }

  // --- KV events (kv_events.h) -------------------------------------------------

  /// Keeps up to `capacity` undrained KV events from now on (0: none, the
  /// default), forgetting undrained ones. Not a step-path call: it allocates
  /// the queue once. InvalidArgument: capacity outside [0, 2^24].
  /// MemoryAllocationFailed: the queue cannot be allocated (events stay as
  /// they were).
  Status enable_kv_events(int capacity) noexcept { return events_.enable(capacity); }
  /// Moves up to `max` of the oldest undrained events to out[0, ...) and
  /// returns how many (never allocates). InvalidArgument: max < 0, out null
  /// with max > 0.
  Result<int> drain_kv_events(KVEvent* out, int max) noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(max >= 0, InvalidArgument, "drain_kv_events(max = %d): must be >= 0", max);
    KVCORE_CHECK_OR_RETURN_ERROR(out != nullptr || max == 0, InvalidArgument, "drain_kv_events: out is null");
    return events_.drain(out, max);
  }
  /// The queue: capacity, undrained events, events dropped while it was full.
  const KVEventQueue& kv_events() const noexcept { return events_; }

  // --- Importing a sequence (kvcore/state/sequence_import.h) -----------------

  /// Admits `seq` (inactive) from outside, as kvcore/state/sequence_import.h
  /// does: length, removed head and holes, and per group the blocks of the
  /// positions `in` carries; full blocks of a prefix this cache holds (by
  /// `in.tokens`, in namespace `in.prefix_namespace`) are shared, every other
  /// block is fresh and write_block(group, index, block) writes its rows; the
  /// sequence keys in `in.prefix_namespace`, naming its blocks by `in.tokens`
  /// (none: it names nothing); each State group holds the states after
  /// [held_from, length) of its layers' bounds, each in a fresh physical slot
  /// (state_slot() names them, for the importer to fill), and a sequence named
  /// by its tokens whose length ends a full block names the state after it by
  /// that block's key, as a commit does (a snapshot for later prefix hits,
  /// with batch.state_snapshots). Any begun step ends.
  /// `in` gives the bounds of n_layers() layers.
  /// InvalidState: seq is active. OutOfResources: no free table row
  /// (batch.max_active_seqs sequences are active), length over capacity, more
  /// holes than batch.max_holes, or a group without the blocks. InvalidArgument:
  /// bad seq, layers of one group carrying different positions, a flat group
  /// missing a visible position; on a model with State layers, removed
  /// positions, or a State group's layers carrying different states, without
  /// the last one or more than D. NotSupported: a ring
  /// group's sink blocks would keep a position the record lacks. Nothing
  /// changes on an error.
  template <class WriteBlock>
  Status admit(int seq, const SequenceImport& in, WriteBlock write_block) noexcept {
    return import_sequence(seq, in, write_block);
  }

 private:
  explicit BatchCache(const CacheConfig& cfg) noexcept : BatchQueries(cfg) {}
};

}  // namespace kvcore
