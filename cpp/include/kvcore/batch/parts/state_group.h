// StateGroup: the State layers of a BatchCache that keep the same number of
// state slots D (docs/design.md section 9, recurrent state: linear attention,
// gated DeltaNet, Mamba, short convolutions). Per active sequence (per table
// row, TableRows) the group keeps D logical slots, slot(p) = p mod D, exactly
// as StatePolicy keeps them for one sequence: held(s) is the position whose
// state logical slot s holds (-1: none), so can_rewind(n) is exact (the state
// after n - 1 is held, or n = 0).
//
// Physical slots. Each logical slot names a physical slot, the index kernels
// use (vLLM / SGLang `state_indices`: the state of layer l lives at
// state[l][physical]). The group owns rows * D + spare physical slots, taken
// from a free list and counted by references: a fork shares the
// source's snapshots (both sequences name the same physical slot, no bytes
// copied), and a snapshot is never written in place while another sequence
// names it: a step writing a logical slot whose physical slot is shared takes
// a fresh one (a state write replaces the whole state, so nothing is copied).
// The step keeps holding the physical slots it stopped naming until it ends,
// so no slot read in a step is written by another entry of the same step.
// Every table is allocated at create(); the step path never allocates and
// never runs short: each row names at most D slots, and a step stops naming at
// most min(T, D) slots per entry (one per kept state: every state of a verify
// step or tree, T <= D - 1, else the last), so at most spare =
// min(max_step_tokens, rows * D) in all (an entry is an active sequence).
//
// Per step the group plans, per token, the physical slot its state starts
// from (read_slots) and the one its state is written to (write_slots, -1 when
// the step does not keep that token's state). begin() updates held() as
// StatePolicy::note_begin does: a slot a step writes no longer holds what it
// held before, even when the step is later aborted (the backend may have
// written it), and even when the write took a fresh physical slot because the
// old one is shared: a sequence's rewind answers follow from its own steps,
// not from whether a sibling or snapshot still names the slot.
//
// Named snapshots (prefix reuse). When a committed step leaves a sequence at
// a length that ends a full block its prefix index keyed (and is a multiple
// of batch.state_block_size: the caller's test), the state after that
// block's last position is named by the block's key: the snapshot takes
// one more reference to the physical slot holding it (no bytes move; a later
// write of that logical slot takes a fresh slot, as for a fork). A sequence
// that adopts the prompt's prefix names the snapshot's slot as its own. At
// most `snapshots` are named (the least recently named or adopted is dropped
// first), so the group owns rows * D + spare + snapshots physical slots.
// SnapshotNames (snapshot_names.h) finds the names in O(1) and keeps them in
// least-recently-used order.
//
// States in the pool (batch.states_in_pool): the physical slots are blocks of
// the cache's one BlockPool, taken and counted there (its references), so a
// state costs a page of the budget only while someone needs it. A named
// snapshot is then a keyed block of the group (the pool's key table, no
// table here): held while a sequence names it, cached once none does, found
// by lookups until the pool reclaims it, least recently released first with
// every other cached block. A keyed slot is never written in place (a named
// block never changes), so a name takes no reference of its own. A sequence that adopts a
// snapshot holds it as long as it holds that prefix, as it holds the prefix's
// K/V blocks: a prompt many requests share keeps its state while any runs; and
// a sequence holds the latest state it named until it names a newer one, so
// its newest snapshot leaves with its blocks (vLLM keeps a request's last
// state block the same way). The step path still never allocates; whether
// the pool has the blocks a step or an import takes is the admission's count
// (blocks_for_entry, and L - from per import).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <utility>

#include "kvcore/batch/batch_plan.h"
#include "kvcore/batch/block_pool.h"
#include "kvcore/batch/parts/snapshot_names.h"
#include "kvcore/batch/parts/table_rows.h"
#include "kvcore/core/buffer.h"
#include "kvcore/core/config.h"
#include "kvcore/core/result.h"

namespace kvcore {

class StateGroup {
 public:
  StateGroup() = default;
  StateGroup(const StateGroup&) = delete;
  StateGroup& operator=(const StateGroup&) = delete;

  /// The group's policy (a State policy of D = policy.slots >= 1) and its
  /// first layer (whose bounds stand for the group's in an import); nothing
  /// is allocated.
  void set_policy(const LayerPolicy& policy, int first_layer) noexcept {
    policy_ = policy;
    slots_ = policy.slots;
    first_layer_ = first_layer;
  }
  const LayerPolicy& policy() const noexcept { return policy_; }
  int first_layer() const noexcept { return first_layer_; }
  /// D: logical state slots per sequence.
  int slots() const noexcept { return slots_; }
  /// Physical slots in all: rows * D + min(max_step_tokens, rows * D) +
  /// snapshots; with states in the pool, the pool's blocks (every slot index
  /// a plan names is in [0, num_slots())).
  int num_slots() const noexcept { return n_phys_; }
  /// Do the slots come from the pool (create() was given one)?
  bool in_pool() const noexcept { return in_pool_; }

  /// Sizes the tables for `rows` (which outlives the group), steps of
  /// `max_step_tokens` tokens and `snapshots` named snapshots (with `pool`,
  /// which outlives the group: any value > 0 turns naming on, and the slots
  /// are the pool's blocks, taken as group `owner`). InvalidArgument: the
  /// slots exceed 2^31 - 1. MemoryAllocationFailed: nothing is assigned.
  Status create(const TableRows& rows, int max_step_tokens, int snapshots, BlockPool* pool = nullptr,
                int owner = 0) noexcept {
    const std::int64_t logical = static_cast<std::int64_t>(rows.rows()) * slots_;
    const std::int64_t spare = max_step_tokens < logical ? max_step_tokens : logical;  // what one step stops naming
    in_pool_ = pool != nullptr;
    if (in_pool_) {
      pool_ = GroupPool(pool, owner);
      naming_ = snapshots > 0;
      snapshots = 0;  // the pool's key table names them
    }
    const std::int64_t phys = in_pool_ ? pool->n_blocks() : logical + spare + snapshots;
    const std::int64_t own_slots = in_pool_ ? 0 : phys;  // the tables of slots of its own
    KVCORE_CHECK_OR_RETURN_ERROR(phys <= 0x7fffffff, InvalidArgument,
                                 "a State group of %d slots: %d table rows x %d slots, + min(max_step_tokens = %d, "
                                 "that) + state_snapshots = %d exceed 2^31 - 1 state slots",
                                 slots_, rows.rows(), slots_, max_step_tokens, snapshots);
    auto held = internal::Buffer<int>::make(logical);
    const std::int64_t held_rows = in_pool_ ? rows.rows() : 0;  // the holds of states in the pool
    auto adopted = internal::Buffer<Held>::make(held_rows);
    auto named_held = internal::Buffer<Held>::make(held_rows);
    auto phys_of = internal::Buffer<int>::make(logical);
    auto refs = internal::Buffer<int>::make_zeroed(own_slots);
    auto free = internal::Buffer<int>::make(own_slots);
    auto deferred = internal::Buffer<int>::make(spare);
    auto reads = internal::Buffer<int>::make(max_step_tokens);
    auto writes = internal::Buffer<int>::make(max_step_tokens);
    SnapshotNames names;
    const bool names_made = names.allocate(snapshots);
    KVCORE_CHECK_OR_RETURN_ERROR(held && phys_of && ((adopted && named_held) || held_rows == 0) &&
                                     ((refs && free) || own_slots == 0) && deferred && reads && writes && names_made,
                                 MemoryAllocationFailed, "cannot allocate the state slot tables of %lld slots",
                                 static_cast<long long>(phys));
    held_ = std::move(held);
    adopted_ = std::move(adopted);
    named_held_ = std::move(named_held);
    phys_of_ = std::move(phys_of);
    refs_ = std::move(refs);
    free_ = std::move(free);
    deferred_ = std::move(deferred);
    reads_ = std::move(reads);
    writes_ = std::move(writes);
    names_ = std::move(names);
    if (!in_pool_) naming_ = snapshots > 0;
    rows_ = &rows;
    n_logical_ = static_cast<int>(logical);
    n_phys_ = static_cast<int>(phys);
    clear();
    return Error::Ok;
  }

  /// Every slot free, every table empty (with states in the pool, the pool
  /// is reset by its owner).
  void clear() noexcept {
    held_.fill(n_logical_, -1);
    phys_of_.fill(n_logical_, -1);
    n_deferred_ = 0;
    if (in_pool_) {
      adopted_.fill(rows_->rows(), Held{});
      named_held_.fill(rows_->rows(), Held{});
      return;
    }
    for (int i = 0; i < n_phys_; ++i) refs_[i] = 0;
    // Lowest slot taken first.
    n_free_ = n_phys_;
    for (int i = 0; i < n_phys_; ++i) free_[i] = n_phys_ - 1 - i;
    n_deferred_ = 0;
    names_.clear();
  }

  /// The position whose state logical slot `s` of `seq` holds, -1 when none.
  /// Precondition: `seq` holds a row, 0 <= s < D.
  int held(int seq, int s) const noexcept { return held_[base(seq) + s]; }
  /// The physical slot logical slot `s` of `seq` names, -1 when none.
  int physical(int seq, int s) const noexcept { return phys_of_[base(seq) + s]; }
  /// Is the state after n - 1 held (or n = 0)? Precondition: `seq` holds a row.
  bool holds(int seq, int n) const noexcept { return n == 0 || held_[base(seq) + (n - 1) % slots_] == n - 1; }
  /// The physical slot holding the state after n - 1, -1 when n = 0 or not held.
  int slot_after(int seq, int n) const noexcept { return holds(seq, n) && n > 0 ? physical(seq, (n - 1) % slots_) : -1; }

  /// States of positions >= n are no longer the sequence's (a rewind or truncation to n);
  /// with states in the pool a snapshot it adopted at a length above n is no longer held.
  void truncate(int seq, int n) noexcept {
    int* held = held_.get() + base(seq);
    for (int s = 0; s < slots_; ++s)
      if (held[s] >= n) held[s] = -1;
    drop_held(seq, n);
  }

  /// With states in the pool, `seq`'s logical slots that hold no state (a
  /// rewind or truncation dropped it) give their blocks back: a state costs
  /// the budget only while someone needs it. A no-op otherwise (the slots are
  /// the row's own). Precondition: `seq` holds a row, no step is begun.
  void drop_unheld(int seq) noexcept {
    if (!in_pool_) return;
    const int b = base(seq);
    for (int s = 0; s < slots_; ++s) {
      if (held_[b + s] >= 0) continue;
      unref(phys_of_[b + s]);
      phys_of_[b + s] = -1;
    }
  }

  /// With states in the pool, `seq` stops holding the latest state it
  /// named: it stays named, cached once nothing else holds it (its logical
  /// slot may still: then it is the live state). `seq` holds the next one it
  /// names. A no-op otherwise. Precondition: `seq` holds a row.
  void release_named(int seq) noexcept {
    if (!in_pool_) return;
    Held& h = named_held_[rows_->row(seq)];
    unref(h.phys);
    h = Held{};
  }

  /// `seq` names no slot any more (release, or before a fork into it).
  /// Precondition: `seq` holds a row.
  void release(int seq) noexcept {
    const int b = base(seq);
    drop_held(seq, 0);
    for (int s = 0; s < slots_; ++s) {
      unref(phys_of_[b + s]);
      phys_of_[b + s] = -1;
      held_[b + s] = -1;
    }
  }

  /// `dst` (naming nothing) shares every snapshot `src` holds of a position
  /// below `upto` (the state after upto - 1 among them: the fork's rule was checked).
  void fork(int src, int dst, int upto) noexcept {
    const int from = base(src), to = base(dst);
    for (int s = 0; s < slots_; ++s) {
      const int p = held_[from + s];
      if (p < 0 || p >= upto) continue;
      phys_of_[to + s] = phys_of_[from + s];
      ref(phys_of_[from + s]);
      held_[to + s] = p;
    }
  }

  /// Plans entry `seq` of a step: T tokens from token `at` at length L (the
  /// state after L - 1 is held: checked), keeping each token's state
  /// (`keep_each`: a verify step or a tree, T <= D - 1, checked) or only the
  /// last. A tree (parents and chain_index non-null, T nodes) writes node j's
  /// state in the logical slot of position L + chain_index[j], as a chain of
  /// T would, and node j reads its parent's. Never fails.
  void begin_entry(int seq, int L, int T, int at, bool keep_each, const int* parents,
                   const int* chain_index) noexcept {
    const int b = base(seq);
    const int read = L > 0 ? phys_of_[b + (L - 1) % slots_] : -1;  // before any write takes a fresh slot
    truncate(seq, L);  // states past the length belong to a replaced or aborted step
    const int first = keep_each ? 0 : T - 1;
    for (int c = first; c < T; ++c) {
      const int s = (L + c) % slots_;
      own(b + s);
      held_[b + s] = L + c;
    }
    int* reads = reads_.get() + at;
    int* writes = writes_.get() + at;
    if (parents != nullptr) {
      for (int j = 0; j < T; ++j) writes[j] = phys_of_[b + (L + chain_index[j]) % slots_];
      for (int j = 0; j < T; ++j) reads[j] = parents[j] < 0 ? read : writes[parents[j]];
      return;
    }
    for (int j = 0; j < T; ++j) writes[j] = j >= first ? phys_of_[b + (L + j) % slots_] : -1;
    reads[0] = read;
    for (int j = 1; j < T; ++j) reads[j] = writes[j - 1];
  }

  /// The step has ended (committed or not): the physical slots it stopped
  /// naming go back unless a sequence still names them.
  void end_step() noexcept {
    for (int i = 0; i < n_deferred_; ++i) unref(deferred_[i]);
    n_deferred_ = 0;
  }

  /// Names the state after L - 1 of `seq` (held: a committed step's length)
  /// by `key`, the key of the full block ending at L - 1 (in prefix
  /// namespace `ns`, block `block_index`: what the pool's KV events tell). A
  /// name already known is only marked as used (its state is the same by the
  /// contract); with every name taken the least recently used one is
  /// dropped. In the pool the block is keyed and reclaimed as cached blocks
  /// are; when the group already keeps a copy (held or cached) and no one
  /// else holds this block, the sequence's slot takes that copy and the
  /// block goes back unnamed (BlockPool::name_or_share: two sequences that
  /// computed one prompt keep one snapshot), else it is a twin of the copy.
  /// No-op without snapshots.
  void name(int seq, int L, const BlockKey& key, std::uint64_t ns, int block_index) noexcept {
    if (!naming_) return;
    const int phys = slot_after(seq, L);
    if (phys < 0) return;
    if (in_pool_) {
      const int kept = pool_.name_or_share(phys, key, ns, block_index);
      phys_of_[base(seq) + (L - 1) % slots_] = kept;  // the slot's hold moved with it
      hold(named_held_, seq, kept, L);
      return;
    }
    const int i = names_.find(key);
    if (i >= 0) {
      names_.touch(i);
      return;
    }
    unref(names_.add(key, phys));  // the slot of the least recently used name, if it made room
    ++refs_[phys];
  }
  /// Is a snapshot named `key`?
  bool named(const BlockKey& key) const noexcept { return in_pool_ ? pool_.find(key) >= 0 : names_.find(key) >= 0; }
  /// Named snapshots now (in the pool: the group's keyed blocks, held or cached).
  int named_count() const noexcept { return in_pool_ ? pool_.keyed_blocks() : names_.size(); }
  /// `seq` (holding no position) starts at length L from the snapshot named
  /// `key` (named(key): checked): its logical slot of L - 1 names the
  /// snapshot's physical slot.
  void adopt(int seq, const BlockKey& key, int L) noexcept {
    const int i = in_pool_ ? -1 : names_.find(key);
    truncate(seq, 0);  // an ended step's states past the length are not the prompt's
    const int s = base(seq) + (L - 1) % slots_;
    const int phys = in_pool_ ? pool_.find(key) : names_.physical(i);
    ref(phys);
    unref(phys_of_[s]);
    phys_of_[s] = phys;
    held_[s] = L - 1;
    if (!in_pool_) names_.touch(i);
    if (in_pool_) hold(adopted_, seq, phys, L);  // as the sequence holds the prefix's K/V blocks
  }

  /// Blocks of the pool entry `seq` of a step of T tokens at length L takes
  /// (keep_each: every token's state kept, else the last): one per logical
  /// slot it writes that names no physical slot, a shared one or a named one.
  /// 0 without states in the pool. Precondition: `seq` holds a row.
  int blocks_for_entry(int seq, int L, int T, bool keep_each) const noexcept {
    if (!in_pool_) return 0;
    const int b = base(seq);
    int n = 0;
    for (int c = keep_each ? 0 : T - 1; c < T; ++c) n += !writable(phys_of_[b + (L + c) % slots_]);
    return n;
  }

  /// `seq` (an imported sequence: holding no position, no step begun) holds
  /// the states after positions [from, L) (from >= L - D): each logical
  /// slot of them names a physical slot of its own, for the importer to
  /// fill. Never runs short (a row's D slots are always free for it).
  void restore(int seq, int from, int L) noexcept {
    truncate(seq, 0);
    const int b = base(seq);
    for (int p = from; p < L; ++p) {
      own(b + p % slots_);
      held_[b + p % slots_] = p;
    }
  }

  /// Per token of the begun step: the physical slot it reads / writes.
  const int* read_slots() const noexcept { return reads_.get(); }
  const int* write_slots() const noexcept { return writes_.get(); }
  /// Physical slots no sequence names and no step holds (in the pool: its
  /// free blocks, cached ones included).
  int free_slots() const noexcept { return in_pool_ ? pool_.free_blocks() : n_free_; }

 private:
  // With states in the pool, a snapshot a sequence holds beyond its logical
  // slots (its block, -1: none, and the length it serves): the one it adopted,
  // so a prompt many requests share keeps its state while any of them runs,
  // and the latest it named, so its newest state is released with its blocks,
  // not long before them (a write after a named state takes a fresh block; the
  // named one would be cached then, and reclaimed first when memory is short,
  // leaving its K/V blocks without the state a hit needs).
  struct Held {
    int phys = -1;
    int length = 0;
  };
  // `seq` holds `phys` (serving length L) as `which`, the one it held so before going back.
  void hold(internal::Buffer<Held>& which, int seq, int phys, int L) noexcept {
    Held& h = which[rows_->row(seq)];
    if (h.phys == phys) return;
    ref(phys);
    unref(h.phys);
    h = Held{phys, L};
  }
  // Stops holding `seq`'s snapshots that serve a length above n.
  void drop_held(int seq, int n) noexcept {
    if (!in_pool_) return;
    for (Held* h : {&adopted_[rows_->row(seq)], &named_held_[rows_->row(seq)]}) {
      if (h->phys < 0 || h->length <= n) continue;
      unref(h->phys);
      *h = Held{};
    }
  }

  int base(int seq) const noexcept { return rows_->row(seq) * slots_; }  // < 2^31: checked at create
  void ref(int phys) noexcept {
    if (in_pool_) pool_.hold(phys);
    else ++refs_[phys];
  }
  void unref(int phys) noexcept {
    if (phys < 0) return;
    if (in_pool_) pool_.release(phys);
    else if (--refs_[phys] == 0) free_[n_free_++] = phys;
  }
  int take() noexcept {
    if (in_pool_) return pool_.allocate();
    const int phys = free_[--n_free_];
    refs_[phys] = 1;
    return phys;
  }
  // May a step write physical slot `phys` in place: one that only this
  // logical slot names (and, in the pool, no name: a named block never changes)?
  bool writable(int phys) const noexcept {
    if (phys < 0) return false;
    return in_pool_ ? pool_.refs(phys) == 1 && !pool_.keyed(phys) : refs_[phys] == 1;
  }
  // Logical slot i names a physical slot no one else names: a fresh one when
  // it names none or a shared or named one (which the step keeps holding until it ends).
  void own(int i) noexcept {
    const int cur = phys_of_[i];
    if (writable(cur)) return;
    if (cur >= 0) deferred_[n_deferred_++] = cur;  // its reference moves to the step
    phys_of_[i] = take();
  }

  LayerPolicy policy_;
  GroupPool pool_;       // with states in the pool: where the slots come from
  bool in_pool_ = false;
  bool naming_ = false;  // are snapshots named (batch.state_snapshots > 0)?
  int slots_ = 1;
  int first_layer_ = 0;
  const TableRows* rows_ = nullptr;
  int n_logical_ = 0;
  int n_phys_ = 0;
  int n_free_ = 0;
  int n_deferred_ = 0;
  internal::Buffer<int> held_;      // [row][D]: the position whose state the slot holds, -1
  internal::Buffer<Held> adopted_;     // [row]: with states in the pool, the snapshot adopted, held
  internal::Buffer<Held> named_held_;  // [row]: ... and the latest one named, held
  internal::Buffer<int> phys_of_;   // [row][D]: its physical slot, -1
  internal::Buffer<int> refs_;      // [physical]: logical slots (and the step) naming it
  internal::Buffer<int> free_;      // stack of free physical slots, [0, n_free_)
  internal::Buffer<int> deferred_;  // physical slots the begun step holds, [0, n_deferred_)
  internal::Buffer<int> reads_;     // [token]
  internal::Buffer<int> writes_;    // [token]
  SnapshotNames names_;  // without the pool: the named snapshots
};

}  // namespace kvcore
