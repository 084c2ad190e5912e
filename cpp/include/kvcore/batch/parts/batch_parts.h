// BatchParts: the parts one BatchCache is composed of (docs/design.md section
// 6), built together at create(), and the moves that keep them in step when a
// verb changes a sequence. BatchCache is the front: it checks each verb's
// arguments, and its base BatchQueries (batch_queries.h) answers the faces'
// queries; once a verb is admitted BatchCache calls one move here (activate,
// release, fork_into, adopt, truncate, clear_parts, import_sequence), and
// every move first ends any begun step (end_step: the tables a plan points
// into change). The moves release a sequence's blocks tail first across the
// groups, so the one pool's cached chains shorten from their end in every
// group alike. The parts: the GroupLayout, the one BlockPool and its
// BlockGroups, the StateGroups, the SequenceTable, the TableRows, the
// PrefixIndex, the StepState and the KV event queue. Every table is
// allocated in build(); no move allocates.
#pragma once

#include <cstdint>

#include "kvcore/batch/batch_plan.h"
#include "kvcore/batch/block_key.h"
#include "kvcore/batch/block_pool.h"
#include "kvcore/batch/kv_events.h"
#include "kvcore/batch/parts/batch_sizes.h"
#include "kvcore/batch/parts/block_group.h"
#include "kvcore/batch/parts/group_layout.h"
#include "kvcore/batch/parts/prefix_index.h"
#include "kvcore/batch/parts/sequence_admission.h"
#include "kvcore/batch/parts/sequence_table.h"
#include "kvcore/batch/parts/state_groups.h"
#include "kvcore/batch/parts/step_state.h"
#include "kvcore/batch/parts/table_pages.h"
#include "kvcore/batch/parts/table_rows.h"
#include "kvcore/core/buffer.h"
#include "kvcore/core/config.h"
#include "kvcore/core/result.h"

namespace kvcore {

class BatchParts {
 protected:
  /// The limits of `cfg` (validated); no part is built yet (build()).
  explicit BatchParts(const CacheConfig& cfg) noexcept
      : capacity_(cfg.capacity),
        n_layers_(cfg.n_layers),
        max_step_(cfg.effective_max_step()),
        max_rewind_(cfg.effective_max_rewind()),
        block_size_(cfg.batch.block_size),
        state_block_size_(cfg.batch.state_block_size != 0 ? cfg.batch.state_block_size : cfg.batch.block_size),
        max_seqs_(cfg.batch.max_seqs),
        max_holes_(cfg.batch.max_holes),
        stride_(ceil_div(cfg.capacity, cfg.batch.block_size)),
        max_step_tokens_(BatchSizes(cfg, 1).max_step_tokens) {}

  BatchParts(const BatchParts&) = delete;
  BatchParts& operator=(const BatchParts&) = delete;
  ~BatchParts() = default;

  /// ceil(a / b) for a >= 0, b > 0, without overflow.
  static int ceil_div(int a, int b) noexcept { return static_cast<int>((static_cast<std::int64_t>(a) + b - 1) / b); }

  /// Every part, through nothrow new, for `cfg` (the one the constructor
  /// read). InvalidArgument, MemoryAllocationFailed (naming what): as each
  /// part's create; ~BatchParts frees a partial build.
  Status build(const CacheConfig& cfg) noexcept {
    KVCORE_RETURN_IF_ERROR(layout_.create(cfg));
    n_groups_ = layout_.n_groups();
    n_state_groups_ = layout_.n_state_groups();
    groups_ = internal::Buffer<BlockGroup>::make(n_groups_ > 0 ? n_groups_ : 1);  // the last of the layer tables
    KVCORE_CHECK_OR_RETURN_ERROR(groups_, MemoryAllocationFailed, "cannot allocate the layer tables of %d layers",
                                 n_layers_);
    for (int g = 0; g < n_groups_; ++g) groups_[g].set_policy(layout_.group_policy(g), block_size_, max_step_, max_rewind_);
    KVCORE_RETURN_IF_ERROR(states_.set_layout(layout_));
    const BatchSizes sizes(cfg, n_groups_);
    KVCORE_RETURN_IF_ERROR(sizes.check_tables());
    const bool states_in_pool = layout_.states_in_pool() && n_state_groups_ > 0;
    KVCORE_ASSIGN_OR_RETURN(
        const int pages,
        sizes.pool_blocks(n_groups_, cfg.batch.num_blocks, [this](int g) -> const GroupRule& { return groups_[g].rule(); },
                          states_in_pool ? n_state_groups_ : 0, [this](int k) { return states_[k].slots(); }));
    KVCORE_RETURN_IF_ERROR(rows_.create(max_seqs_, sizes.rows));
    KVCORE_RETURN_IF_ERROR(table_pages_.create(static_cast<int>(sizes.table_pages()), sizes.page_blocks(),
                                               cfg.batch.table_page_blocks == 0));
    if (n_groups_ > 0 || states_in_pool) {  // a State group in the pool is the pool's group n_groups + k
      KVCORE_RETURN_IF_ERROR(pages_.create(pages, "the cache's pool", n_groups_ + (states_in_pool ? n_state_groups_ : 0)));
      pages_.attach_events(&events_, block_size_);
    }
    for (int g = 0; g < n_groups_; ++g)
      KVCORE_RETURN_IF_ERROR(groups_[g].create(pages_, g, max_seqs_, rows_, table_pages_, stride_, block_size_));
    KVCORE_RETURN_IF_ERROR(seqs_.create(max_seqs_, max_holes_));
    KVCORE_RETURN_IF_ERROR(prefix_.create(max_seqs_, block_size_, stride_, n_groups_));
    KVCORE_RETURN_IF_ERROR(states_.create(rows_, max_step_tokens_, cfg.batch.state_snapshots,
                                          states_in_pool ? &pages_ : nullptr, n_groups_));
    const StepLimits limits{max_seqs_,       n_groups_,        max_step_,
                            max_step_tokens_, block_size_,      capacity_,
                            n_state_groups_,  state_block_size_, n_groups_ > 0 ? groups_[0].page_shift() : 31};
    return step_.create(limits, groups_.get(), stride_, sizes.rows, table_pages_, states_.get());
  }

  /// OutOfResources unless a table row is free for `seq` to become active.
  Status check_row_free(const char* what, int seq) const noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(rows_.free_rows() > 0, OutOfResources,
                                 "%s(%d): %d sequences are active, batch.max_active_seqs = %d: release one "
                                 "first",
                                 what, seq, rows_.rows(), rows_.rows());
    return Error::Ok;
  }
  /// The longest prefix hit of tokens[0, n) in `prefix_namespace`, in blocks
  /// (PrefixIndex::longest_hit); it counts only as far as every State group
  /// holds a named snapshot of the state after its last block (docs/design.md
  /// section 9).
  int longest_hit(const std::int32_t* tokens, int n, std::uint64_t prefix_namespace) const noexcept {
    return prefix_.longest_hit(prefix_namespace, tokens, n, groups_.get(), n_groups_, [this](const BlockKey& key) {
      return states_.named(key);
    });
  }
  /// rewind_blocker()'s answer, for messages: "group" or "state group", and its index.
  const char* blocker_kind(int blocking) const noexcept { return blocking < n_groups_ ? "group" : "state group"; }
  int blocker_index(int blocking) const noexcept { return blocking < n_groups_ ? blocking : blocking - n_groups_; }

  /// Verbs change the tables a plan points into: any begun step is over, and
  /// the tables go back to what they were before it (StepState::end).
  void end_step() noexcept {
    step_.end(seqs_, groups_.get());
    states_.end_step();
  }

  /// Empty: no committed position, so no block outside the begun step (whose
  /// blocks go when the call asking ends it: fork and adopt_prefix into an
  /// empty sequence a step was begun for are fine).
  bool holds_nothing(int seq) const noexcept { return seqs_[seq].length == 0; }

  /// `seq` inactive, length 0, nothing held (its tables must already be released).
  void reset_seq(int seq) noexcept {
    seqs_.reset(seq);
    prefix_.reset(seq);
    for (int g = 0; g < n_groups_; ++g) groups_[g].lost_below(seq) = 0;
  }

  /// Releases every block of `seq` at index >= `from` (every group), tail
  /// first across the groups: the one pool reclaims cached blocks least
  /// recently released first, so a cached chain shortens from its end in
  /// every group alike and what is left still serves a hit.
  void release_from(int seq, int from) noexcept {
    SequenceState& s = seqs_[seq];
    for (int i = s.alloc_end - 1; i >= from; --i)
      for (int g = 0; g < n_groups_; ++g) groups_[g].drop(seq, i);
    if (s.alloc_end > from) s.alloc_end = from;
  }

  /// Releases the blocks of positions [p0, p1) of `seq` whose every position
  /// below the length is removed, tail first.
  void release_removed(int seq, int p0, int p1) noexcept {
    const int B = block_size_;
    const int length = seqs_[seq].length;
    const int last = static_cast<int>((static_cast<std::int64_t>(p1) + B - 1) / B) - 1;
    for (int i = last; i >= p0 / B; --i) {
      const std::int64_t end = (static_cast<std::int64_t>(i) + 1) * B;
      const int hi = end < length ? static_cast<int>(end) : length;
      if (seqs_.next_kept(seq, i * B) < hi) continue;  // a position of it is still seen
      for (int g = 0; g < n_groups_; ++g) groups_[g].drop(seq, i);
    }
  }

  /// Internal unless the table pages are consistent: each page is free (no
  /// entry naming a block) or named by a row, and counts the blocks it names.
  Status check_table_pages() const noexcept {
    std::int64_t named = 0;
    for (int g = 0; g < n_groups_; ++g) KVCORE_RETURN_IF_ERROR(groups_[g].check_pages(&named));
    KVCORE_CHECK_OR_RETURN_ERROR(named + table_pages_.free_pages() == table_pages_.n_pages(), Internal,
                                 "the rows name %lld table pages and %d are free, of %d", static_cast<long long>(named),
                                 table_pages_.free_pages(), table_pages_.n_pages());
    for (int f = 0; f < table_pages_.free_pages(); ++f) {
      const int page = table_pages_.free_list()[f];
      for (int i = 0; i < table_pages_.page_blocks(); ++i)
        KVCORE_CHECK_OR_RETURN_ERROR(table_pages_.entry(page, i) < 0, Internal, "free table page %d names block %d",
                                     page, table_pages_.entry(page, i));
    }
    return Error::Ok;
  }

  /// The group (index) of `seq` whose rows no longer hold what a query at n
  /// needs below n, or n_groups + k for State group k that no longer holds
  /// the state after n - 1; -1 when none (n within [0, length]).
  int rewind_blocker(int seq, int n) const noexcept {
    for (int g = 0; g < n_groups_; ++g)
      if (groups_[g].loses(seqs_, seq, n)) return g;
    const int k = states_.first_lost(seq, n);
    return k < 0 ? -1 : n_groups_ + k;
  }

  /// remove's tail and rewind: `seq` (active) keeps positions [0, n), n
  /// within [0, length]; an emptied sequence stays active in its namespace.
  /// InvalidState (naming `what`): a group or State group no longer holds
  /// what a query at n needs; nothing changes then.
  Status truncate(int seq, int n, const char* what) noexcept {
    if (n > 0) {
      const int blocking = rewind_blocker(seq, n);
      KVCORE_CHECK_OR_RETURN_ERROR(blocking < 0 || blocking >= n_groups_, InvalidState,
                                   "%s(%d, %d): group %d no longer holds what a query at %d needs "
                                   "(released by its window)",
                                   what, seq, n, blocking, n);
      KVCORE_CHECK_OR_RETURN_ERROR(blocking < 0, InvalidState,
                                   "%s(%d, %d): state group %d no longer holds the state after position %d (a "
                                   "step begun without verify keeps only its last state)",
                                   what, seq, n, blocking - n_groups_, n - 1);
    }
    end_step();
    release_from(seq, ceil_div(n, block_size_));
    // Positions from n on are written again: the window has released none of
    // them. (Those below n it released stay lost, even in a block index the
    // next step fills afresh.)
    for (int g = 0; g < n_groups_; ++g)
      if (groups_[g].lost_below(seq) > n) groups_[g].lost_below(seq) = n;
    seqs_.truncate(seq, n);
    states_.truncate(seq, n);
    // The last, partly kept block goes too when every position it keeps is removed.
    if (n % block_size_ != 0) release_removed(seq, n - n % block_size_, n);
    if (n == 0) {
      const bool was_active = seqs_[seq].active;
      const std::uint64_t ns = prefix_.namespace_of(seq);  // an emptied sequence keeps its namespace
      reset_seq(seq);
      prefix_.set_namespace(seq, ns);
      seqs_[seq].active = was_active;
      return Error::Ok;
    }
    prefix_.rewind(seq, n, groups_.get(), n_groups_);
    return Error::Ok;
  }

  // --- the moves of the verbs (arguments checked by BatchCache) -------------

  /// add_sequence: `seq` (inactive; a table row is free) becomes active,
  /// empty, keying its blocks in `prefix_namespace`.
  void activate(int seq, std::uint64_t prefix_namespace) noexcept {
    end_step();
    reset_seq(seq);
    prefix_.set_namespace(seq, prefix_namespace);
    seqs_[seq].active = true;
    rows_.take(seq);
  }

  /// release_sequence: `seq` (active) drops every block and state slot and
  /// gives its table row (and its table pages) back.
  void release(int seq) noexcept {
    end_step();
    release_from(seq, 0);
    for (int g = 0; g < n_groups_; ++g) groups_[g].free_pages(seq);
    states_.release(seq);
    reset_seq(seq);
    rows_.give(seq);
  }

  /// The table pages a fork of `src` (active) up to `upto` takes at most: its
  /// rows' pages holding a block below ceil(upto / B), over every group.
  std::int64_t fork_pages(int src, int upto) const noexcept {
    const int first = seqs_[src].start / block_size_, end = ceil_div(upto, block_size_);
    std::int64_t n = 0;
    for (int g = 0; g < n_groups_; ++g) n += groups_[g].held_pages(src, first, end);
    return n;
  }
  /// The table pages `seq`'s rows hold over every group (0 inactive or unpaged).
  std::int64_t pages_held(int seq) const noexcept {
    if (!seqs_[seq].active) return 0;
    std::int64_t n = 0;
    for (int g = 0; g < n_groups_; ++g) n += groups_[g].held_pages(seq, 0, stride_);
    return n;
  }

  /// OutOfResources unless the table pages free, with those `dst` holds
  /// (fork_into gives them back first), cover the pages of `src`'s rows
  /// holding a block below ceil(upto / B): what `dst` shares takes at most
  /// those. `what` names the verb.
  Status check_fork_pages(const char* what, int src, int dst, int upto) const noexcept {
    if (table_pages_.pinned()) return Error::Ok;
    const std::int64_t need = fork_pages(src, upto), freed = pages_held(dst);
    KVCORE_CHECK_OR_RETURN_ERROR(need <= table_pages_.free_pages() + freed, OutOfResources,
                                 "%s(%d, %d, upto = %d): the copy's block tables need up to %lld table pages, "
                                 "%lld of batch.table_pages = %d are free",
                                 what, src, dst, upto, static_cast<long long>(need),
                                 static_cast<long long>(table_pages_.free_pages() + freed), table_pages_.n_pages());
    return Error::Ok;
  }

  /// fork: `dst` (inactive with a free row, or active and empty) becomes a
  /// copy of `src`'s positions [0, upto), sharing its blocks and state
  /// snapshots (rewind_blocker(src, upto) < 0 and check_fork_pages: checked).
  void fork_into(int src, int dst, int upto) noexcept {
    end_step();
    if (seqs_[dst].active) {
      release_from(dst, 0);
      for (int g = 0; g < n_groups_; ++g) groups_[g].free_pages(dst);
      states_.release(dst);
    } else {
      rows_.take(dst);  // a row given back names no state slot
    }
    reset_seq(dst);
    seqs_.copy_prefix(src, dst, upto);
    const int end_block = ceil_div(upto, block_size_);
    for (int g = 0; g < n_groups_; ++g) groups_[g].share_prefix(seqs_, src, dst, upto, end_block);
    states_.fork(src, dst, upto);
    seqs_[dst].alloc_end = end_block;
    const SequenceState& s = seqs_[src];
    prefix_.inherit(src, dst, upto, s.start == 0 && s.n_holes == 0, groups_.get(), n_groups_);
  }

  /// adopt_prefix: `seq` (active, empty) keys in `prefix_namespace` and
  /// shares the longest prefix hit of tokens[0, n); returns its new length
  /// (a multiple of B, in positions). OutOfResources: the hit's table
  /// entries need more table pages than are free; nothing changes then.
  Result<int> adopt(int seq, const std::int32_t* tokens, int n, std::uint64_t prefix_namespace) noexcept {
    const int hit = longest_hit(tokens, n, prefix_namespace);
    std::int64_t pages = 0;  // a begun step's pages stay the row's: end_step() frees none
    for (int g = 0; g < n_groups_; ++g) pages += groups_[g].pages_for(seq, groups_[g].rule().needed(hit), hit);
    KVCORE_CHECK_OR_RETURN_ERROR(pages <= table_pages_.free_pages(), OutOfResources,
                                 "adopt_prefix(%d): the hit of %d blocks needs %lld table pages, %d of "
                                 "batch.table_pages = %d are free",
                                 seq, hit, static_cast<long long>(pages), table_pages_.free_pages(),
                                 table_pages_.n_pages());
    end_step();
    prefix_.set_namespace(seq, prefix_namespace);
    for (int g = 0; g < n_groups_; ++g) groups_[g].adopt(seq, prefix_.prompt_keys(), hit);
    if (hit > 0) states_.adopt(seq, prefix_.prompt_keys()[hit - 1], hit * block_size_);
    SequenceState& s = seqs_[seq];
    s.length = hit * block_size_;
    s.alloc_end = hit;
    prefix_.adopted(seq, hit);
    return s.length;
  }

  /// clear: every sequence inactive and empty, every block free and every
  /// key forgotten (a Cleared event).
  void clear_parts() noexcept {
    end_step();
    for (int seq = 0; seq < max_seqs_; ++seq) reset_seq(seq);
    rows_.clear();
    table_pages_.clear();
    for (int g = 0; g < n_groups_; ++g) groups_[g].clear();
    if (pages_.n_blocks() > 0) pages_.reset();
    states_.clear();
    events_.push(KVEvent{KVEventKind::Cleared, -1, BlockKey{}, 0, 0, 0});
  }

  /// BatchCache::admit (its comment says what it checks and does): admits
  /// `seq` from `in`, write_block(group, index, block) writing each fresh
  /// block's rows. Nothing changes on an error.
  template <class WriteBlock>
  Status import_sequence(int seq, const SequenceImport& in, WriteBlock write_block) noexcept {
    KVCORE_RETURN_IF_ERROR(seqs_.check_seq("import", seq));
    KVCORE_CHECK_OR_RETURN_ERROR(!seqs_[seq].active, InvalidState,
                                 "import: sequence %d is active; release it first", seq);
    KVCORE_RETURN_IF_ERROR(check_row_free("import", seq));
    KVCORE_RETURN_IF_ERROR(states_.check_import(in, layout_));
    KVCORE_CHECK_OR_RETURN_ERROR(in.length <= capacity_, OutOfResources,
                                 "import: length %d exceeds capacity = %d", in.length, capacity_);
    KVCORE_CHECK_OR_RETURN_ERROR(in.n_holes <= max_holes_, OutOfResources,
                                 "import: %d holes exceed batch.max_holes = %d", in.n_holes, max_holes_);
    const SequenceAdmission admission(in, block_size_, layout_.group_layers());
    KVCORE_RETURN_IF_ERROR(admission.check_layers(n_layers_, layout_.layer_groups(), [this](int l) {
      return !layout_.config(l).policy.holds_keys();  // Shared: its source's; State: StateGroups::check_import
    }));
    const bool named = in.tokens != nullptr && in.start == 0 && in.n_holes == 0;
    const int hit =
        named ? prefix_.longest_hit(in.prefix_namespace, in.tokens, in.length, groups_.get(), n_groups_) : 0;
    std::int64_t need = 0;  // every group draws from the one pool
    for (int g = 0; g < n_groups_; ++g) {
      KVCORE_RETURN_IF_ERROR(admission.check_group(g, groups_[g]));
      need += admission.blocks_needed(g, groups_[g], prefix_.prompt_keys(), hit);
    }
    std::int64_t pages = 0;  // an inactive sequence's row holds no page
    for (int g = 0; g < n_groups_; ++g) pages += admission.pages_needed(g, groups_[g]);
    KVCORE_CHECK_OR_RETURN_ERROR(pages <= table_pages_.free_pages(), OutOfResources,
                                 "import: the sequence's block tables need %lld table pages, %d of "
                                 "batch.table_pages = %d are free",
                                 static_cast<long long>(pages), table_pages_.free_pages(), table_pages_.n_pages());
    const std::int64_t in_pool = states_.blocks_to_restore(in);  // with states in the pool: a block per carried state
    need += in_pool;
    KVCORE_CHECK_OR_RETURN_ERROR(need <= pages_.free_blocks(), OutOfResources,
                                 "import: the sequence needs %lld blocks over %d group%s, %d of the pool's %d are free",
                                 static_cast<long long>(need), n_groups_ + (in_pool > 0 ? n_state_groups_ : 0),
                                 n_groups_ + (in_pool > 0 ? n_state_groups_ : 0) == 1 ? "" : "s", pages_.free_blocks(),
                                 pages_.n_blocks());
    end_step();
    reset_seq(seq);
    rows_.take(seq);
    seqs_.admit(seq, in.length, in.start, in.holes, in.n_holes, admission.ceil_blocks());
    for (int g = 0; g < n_groups_; ++g) admission.share_hit(g, groups_[g], seq, prefix_.prompt_keys(), hit);
    for (int g = 0; g < n_groups_; ++g) admission.fill(g, groups_[g], seq, hit, write_block);
    states_.restore(seq, in);  // the states each State group carries, in fresh slots
    prefix_.set_namespace(seq, in.prefix_namespace);
    if (!named) {
      prefix_.stop(seq);
      return Error::Ok;
    }
    prefix_.imported(seq, in.prefix_namespace, in.tokens, in.length, groups_.get(), n_groups_, [&](int g, int i) {
      return admission.complete(g, groups_[g].rule().sink_blocks(), i);
    });
    // A length ending on a keyed block: the imported state is named by that
    // block's key, as a commit names it, so the prefix outlives the sequence.
    BlockKey key;
    if (prefix_.boundary_key(seq, in.length, &key))
      states_.name(seq, in.length, key, in.prefix_namespace, in.length / block_size_ - 1);
    return Error::Ok;
  }

  // --- the parts ---------------------------------------------------------------

  int capacity_;
  int n_layers_;
  int max_step_;
  int max_rewind_;
  int block_size_;
  int state_block_size_;  ///< batch.state_block_size, 0 resolved to block_size
  int max_seqs_;
  int max_holes_;
  int stride_;
  int max_step_tokens_;
  int n_groups_ = 0;
  int n_state_groups_ = 0;
  GroupLayout layout_;                   // which group each layer is in
  BlockPool pages_;                      // every group's blocks: one budget
  internal::Buffer<BlockGroup> groups_;  // [n_groups_]
  StateGroups states_;                   // [n_state_groups_]
  SequenceTable seqs_;
  TableRows rows_;           // before groups_ is built; the groups point at it
  TablePages table_pages_;  // every group's block table storage; the groups point at it
  PrefixIndex prefix_;
  StepState step_;
  KVEventQueue events_;  // off until enable_kv_events(); the pools push into it
};

}  // namespace kvcore
