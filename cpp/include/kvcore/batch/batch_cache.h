// BatchCache: many sequences over paged block pools, one pool per group of
// layers sharing a policy (DESIGN.md section 6). Each sequence has its own
// length; each group maps a sequence's positions to blocks of B rows through a
// block table. Forks share blocks (copy-on-write for a shared, partly filled
// block), removals and rewinds release them, ring groups release blocks no
// future query can reach (keeping sinks and a max_step rewind margin), and
// full blocks named by their token ids are reused by new sequences with the
// same prefix. Every table is sized at create(); nothing on the step path
// (begin_step, plan, commit) or in a sequence verb allocates.
#pragma once

#include <cstdint>
#include <memory>
#include <new>

#include "kvcore/batch/batch_faces.h"
#include "kvcore/batch/batch_plan.h"
#include "kvcore/batch/block_pool.h"
#include "kvcore/core/cache_base.h"
#include "kvcore/core/config.h"
#include "kvcore/core/result.h"

namespace kvcore {

/// Checks the BatchLimits of `cfg` (after validate(cfg)). InvalidArgument names
/// the field, its value and the rule.
inline Status validate_batch(const CacheConfig& cfg) noexcept {
  KVCORE_RETURN_IF_ERROR(validate(cfg));
  const BatchLimits& b = cfg.batch;
  KVCORE_CHECK_OR_RETURN_ERROR(b.block_size >= 1, InvalidArgument,
                               "batch.block_size = %d: must be >= 1", b.block_size);
  KVCORE_CHECK_OR_RETURN_ERROR(b.max_seqs >= 1 && b.max_seqs <= (1 << 20), InvalidArgument,
                               "batch.max_seqs = %d: must be in [1, 1048576]", b.max_seqs);
  KVCORE_CHECK_OR_RETURN_ERROR(b.max_step_tokens >= 0, InvalidArgument,
                               "batch.max_step_tokens = %d: must be >= 1 (or 0 for the default)",
                               b.max_step_tokens);
  KVCORE_CHECK_OR_RETURN_ERROR(b.num_blocks >= 0, InvalidArgument,
                               "batch.num_blocks = %d: must be >= 1 (or 0 for the default)",
                               b.num_blocks);
  KVCORE_CHECK_OR_RETURN_ERROR(b.max_holes >= 0 && b.max_holes <= 4096, InvalidArgument,
                               "batch.max_holes = %d: must be in [0, 4096]", b.max_holes);
  return Error::Ok;
}

class BatchCache final : public CacheBase, public BatchControl, public BatchPlanner {
 public:
  /// Validates `cfg` (validate() and validate_batch(): InvalidArgument naming
  /// the field) and builds the cache with every table it will use. InvalidArgument:
  /// the tables would exceed the address space (2^31 entries each).
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
  BatchControl* as_batch_control() noexcept override { return this; }
  BatchPlanner* as_batch_planner() noexcept override { return this; }

  // --- BatchControl: limits -------------------------------------------------
  int max_seqs() const noexcept override { return max_seqs_; }
  int capacity() const noexcept override { return capacity_; }
  int max_step() const noexcept override { return max_step_; }
  int max_step_tokens() const noexcept override { return max_step_tokens_; }
  int n_groups() const noexcept override { return n_groups_; }
  int n_layers() const noexcept override { return n_layers_; }
  int block_size() const noexcept override { return block_size_; }
  /// Block table entries per sequence: ceil(capacity / B).
  int table_stride() const noexcept { return stride_; }
  /// `group`'s block tables, [max_seqs][table_stride()] (-1: no block), as a
  /// plan's GroupPlan::block_tables shows them. Precondition: a valid group.
  const int* block_tables(int group) const noexcept { return table(group, 0); }

  // --- BatchControl: sequence verbs ------------------------------------------

  Status add_sequence(int seq) noexcept override {
    KVCORE_RETURN_IF_ERROR(check_seq("add_sequence", seq));
    KVCORE_CHECK_OR_RETURN_ERROR(!seqs_[seq].active, InvalidState,
                                 "add_sequence(%d): the sequence is already active", seq);
    end_step();
    reset_seq(seq);
    seqs_[seq].active = true;
    return Error::Ok;
  }

  Status release_sequence(int seq) noexcept override {
    KVCORE_RETURN_IF_ERROR(check_active("release_sequence", seq));
    end_step();
    release_from(seq, 0);
    reset_seq(seq);
    return Error::Ok;
  }

  Status fork(int src, int dst, int upto) noexcept override {
    KVCORE_RETURN_IF_ERROR(check_active("fork", src));
    KVCORE_RETURN_IF_ERROR(check_seq("fork", dst));
    KVCORE_CHECK_OR_RETURN_ERROR(src != dst, InvalidArgument, "fork(%d, %d): src and dst are one sequence",
                                 src, dst);
    const Seq& s = seqs_[src];
    KVCORE_CHECK_OR_RETURN_ERROR(upto >= 0 && upto <= s.length, InvalidArgument,
                                 "fork(%d, %d, upto = %d): must be in [0, length = %d]", src, dst,
                                 upto, s.length);
    KVCORE_CHECK_OR_RETURN_ERROR(!seqs_[dst].active || holds_nothing(dst), InvalidState,
                                 "fork(%d, %d): dst holds %d positions; it must be empty", src, dst,
                                 seqs_[dst].length);
    const int blocking = rewind_blocker(src, upto);
    KVCORE_CHECK_OR_RETURN_ERROR(blocking < 0, InvalidState,
                                 "fork(%d, %d, upto = %d): group %d of the source no longer holds "
                                 "what a query at %d needs",
                                 src, dst, upto, blocking, upto);
    end_step();
    if (seqs_[dst].active) release_from(dst, 0);
    reset_seq(dst);
    Seq& d = seqs_[dst];
    d.active = true;
    d.length = upto;
    d.start = s.start < upto ? s.start : upto;
    for (int h = 0; h < s.n_holes && s_holes(src)[h].begin < upto; ++h) {
      PositionRange r = s_holes(src)[h];
      if (r.end > upto) r.end = upto;
      s_holes(dst)[d.n_holes++] = r;
    }
    const int end_block = ceil_div(upto, block_size_);
    for (int g = 0; g < n_groups_; ++g) {
      const int* from = table(g, src);
      int* to = table(g, dst);
      const int lost = lost_below(g, src);
      lost_below(g, dst) = lost < upto ? lost : upto;
      for (int i = first_block(src); i < end_block; ++i) {
        if (from[i] < 0) continue;
        const int hi = (i + 1) * block_size_ < upto ? (i + 1) * block_size_ : upto;
        if (next_kept(dst, i * block_size_) >= hi) continue;  // dst sees none of its positions
        groups_[g].pool.hold(from[i]);
        to[i] = from[i];
        ++held(g, dst);
      }
      evict(g, dst);
    }
    d.alloc_end = end_block;
    inherit_hashing(src, dst, upto);
    return Error::Ok;
  }

  Status remove(int seq, int p0, int p1) noexcept override {
    KVCORE_RETURN_IF_ERROR(check_active("remove", seq));
    KVCORE_CHECK_OR_RETURN_ERROR(p0 >= 0 && p1 >= p0, InvalidArgument,
                                 "remove(%d, p0 = %d, p1 = %d): needs 0 <= p0 <= p1", seq, p0, p1);
    Seq& s = seqs_[seq];
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
    if (p0 <= s.start) {  // the head (and any hole it reaches)
      end_step();
      s.start = p1;
      int kept = 0;
      for (int h = 0; h < s.n_holes; ++h) {
        PositionRange& r = s_holes(seq)[h];
        if (r.end <= s.start) continue;
        if (r.begin <= s.start) {
          s.start = r.end;  // the hole now touches the head: merge it
          continue;
        }
        s_holes(seq)[kept++] = r;
      }
      s.n_holes = kept;
      s.hashing = false;  // later rows were computed without the removed positions
      release_removed(seq, 0, s.start);
      return Error::Ok;
    }
    // A middle range [p0, p1) with start < p0 <= p1 < length: merge it into the holes.
    PositionRange merged{p0, p1};
    int first = 0;
    while (first < s.n_holes && s_holes(seq)[first].end < p0) ++first;
    int last = first;  // holes [first, last) overlap or touch the range
    while (last < s.n_holes && s_holes(seq)[last].begin <= p1) {
      if (s_holes(seq)[last].begin < merged.begin) merged.begin = s_holes(seq)[last].begin;
      if (s_holes(seq)[last].end > merged.end) merged.end = s_holes(seq)[last].end;
      ++last;
    }
    const int n_after = s.n_holes - (last - first) + 1;
    KVCORE_CHECK_OR_RETURN_ERROR(n_after <= max_holes_, OutOfResources,
                                 "remove(%d, %d, %d): the sequence would keep %d separate removed "
                                 "ranges, more than batch.max_holes = %d",
                                 seq, p0, p1, n_after, max_holes_);
    end_step();
    PositionRange* holes = s_holes(seq);
    if (last - first != 1) {  // shift the tail to leave exactly one slot at `first`
      const int shift = 1 - (last - first);
      if (shift > 0) {
        for (int h = s.n_holes - 1; h >= last; --h) holes[h + shift] = holes[h];
      } else {
        for (int h = last; h < s.n_holes; ++h) holes[h + shift] = holes[h];
      }
    }
    holes[first] = merged;
    s.n_holes = n_after;
    s.hashing = false;
    release_removed(seq, merged.begin, merged.end);
    return Error::Ok;
  }

  Status rewind(int seq, int n) noexcept override {
    KVCORE_RETURN_IF_ERROR(check_active("rewind", seq));
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
    KVCORE_RETURN_IF_ERROR(check_active("adopt_prefix", seq));
    KVCORE_CHECK_OR_RETURN_ERROR(n >= 0 && n <= capacity_, InvalidArgument,
                                 "adopt_prefix(%d, n = %d): must be in [0, capacity = %d]", seq, n,
                                 capacity_);
    KVCORE_CHECK_OR_RETURN_ERROR(tokens != nullptr || n == 0, InvalidArgument,
                                 "adopt_prefix(%d): tokens is null", seq);
    KVCORE_CHECK_OR_RETURN_ERROR(holds_nothing(seq), InvalidState,
                                 "adopt_prefix(%d): the sequence holds %d positions; it must be empty",
                                 seq, seqs_[seq].length);
    end_step();
    // Keys of the full blocks of tokens[0, n - 1): the last token is always computed.
    const int B = block_size_;
    const int candidates = n > 0 ? (n - 1) / B : 0;
    BlockKey chain;
    for (int i = 0; i < candidates; ++i) {
      chain = BlockKey::chain(chain, tokens + static_cast<std::ptrdiff_t>(i) * B, B);
      scratch_keys_[i] = chain;
    }
    // The longest hit every group can serve.
    int hit_blocks = candidates;
    while (hit_blocks > 0 && !servable(hit_blocks)) --hit_blocks;
    Seq& s = seqs_[seq];
    for (int g = 0; g < n_groups_; ++g) {
      int* row = table(g, seq);
      const Needed need = needed_blocks(g, hit_blocks);
      for (int i = 0; i < hit_blocks; ++i) {
        if (!need.contains(i)) continue;
        const int b = groups_[g].pool.find(scratch_keys_[i]);
        groups_[g].pool.hold(b);
        row[i] = b;
        ++held(g, seq);
      }
      // Positions past the hit are the sequence's to write (and huge sinks may put
      // window_from past the int range in positions).
      lost_below(g, seq) = (need.window_from < hit_blocks ? need.window_from : hit_blocks) * B;
    }
    s.length = hit_blocks * B;
    s.alloc_end = hit_blocks;
    s.hashing = true;
    s.hashed_blocks = hit_blocks;
    s.partial = 0;
    s.chain = hit_blocks > 0 ? scratch_keys_[hit_blocks - 1] : BlockKey{};
    return s.length;
  }

  // --- BatchControl: steps -----------------------------------------------------

  Result<BatchStep> begin_step(const StepEntry* entries, int n) noexcept override {
    KVCORE_CHECK_OR_RETURN_ERROR(n >= 1 && n <= max_seqs_, InvalidArgument,
                                 "begin_step: %d entries, must be in [1, max_seqs = %d]", n,
                                 max_seqs_);
    KVCORE_CHECK_OR_RETURN_ERROR(entries != nullptr, InvalidArgument, "begin_step: entries is null");
    ++stamp_;
    std::int64_t tokens = 0;  // n values of T up to max_step each: 64 bits
    for (int i = 0; i < n; ++i) {
      const StepEntry& e = entries[i];
      KVCORE_RETURN_IF_ERROR(check_active("begin_step", e.seq));
      KVCORE_CHECK_OR_RETURN_ERROR(seen_[e.seq] != stamp_, InvalidArgument,
                                   "begin_step: sequence %d appears twice", e.seq);
      seen_[e.seq] = stamp_;
      KVCORE_CHECK_OR_RETURN_ERROR(e.T >= 1 && e.T <= max_step_, InvalidArgument,
                                   "begin_step: sequence %d with T = %d, must be in [1, max_step = %d]",
                                   e.seq, e.T, max_step_);
      const int length = seqs_[e.seq].length;
      KVCORE_CHECK_OR_RETURN_ERROR(static_cast<std::int64_t>(length) + e.T <= capacity_, OutOfResources,
                                   "begin_step: sequence %d at length %d with T = %d would pass "
                                   "capacity = %d",
                                   e.seq, length, e.T, capacity_);
      tokens += e.T;
      KVCORE_CHECK_OR_RETURN_ERROR(tokens <= max_step_tokens_, InvalidArgument,
                                   "begin_step: %d tokens or more, must be <= max_step_tokens = %d",
                                   tokens, max_step_tokens_);
    }
    // Admission: the blocks each group needs (new, or private copies of shared
    // ones), judged on the tables as end_step() leaves them: a begun step this
    // one replaces gives back every block it took.
    for (int g = 0; g < n_groups_; ++g) {
      const BlockPool& pool = groups_[g].pool;
      int need = 0;
      for (int i = 0; i < n; ++i) {
        const int seq = entries[i].seq;
        const int* row = table(g, seq);
        const int length = seqs_[seq].length;
        const int begun = begun_entry(seq);
        for (int b = length / block_size_; b < ceil_div(length + entries[i].T, block_size_); ++b) {
          int cur = row[b];
          if (begun >= 0) cur = b == length / block_size_ ? first_before_[g * max_seqs_ + begun] : -1;
          if (cur < 0 || pool.refs(cur) > 1) ++need;
        }
      }
      const int free = pool.free_blocks() + begun_blocks(g);
      KVCORE_CHECK_OR_RETURN_ERROR(need <= free, OutOfResources,
                                   "begin_step: group %d needs %d blocks, %d of its %d are free", g,
                                   need, free, pool.n_blocks());
    }
    // Admitted: nothing below can fail. A replaced step's blocks go first.
    end_step();
    int at = 0;
    for (int i = 0; i < n; ++i) {
      const StepEntry& e = entries[i];
      Seq& s = seqs_[e.seq];
      step_seq_[i] = e.seq;
      entry_of_[e.seq] = i;
      query_starts_[i] = at;
      first_positions_[i] = s.length;
      context_lens_[i] = s.length + e.T;
      visible_starts_[i] = s.start;
      holes_of_[i] = s_holes(e.seq);
      n_holes_of_[i] = s.n_holes;
      tokens_given_[i] = e.tokens != nullptr;
      for (int j = 0; j < e.T; ++j) step_tokens_[at + j] = e.tokens != nullptr ? e.tokens[j] : 0;
      at += e.T;
    }
    query_starts_[n] = at;
    for (int g = 0; g < n_groups_; ++g) {
      BlockPool& pool = groups_[g].pool;
      int copies = 0;
      for (int i = 0; i < n; ++i) {
        const int seq = step_seq_[i];
        int* row = table(g, seq);
        const int first = first_positions_[i];
        first_before_[g * max_seqs_ + i] = row[first / block_size_];  // what an abandoned step restores
        const int end_block = ceil_div(context_lens_[i], block_size_);
        for (int b = first / block_size_; b < end_block; ++b) {
          const int cur = row[b];
          if (cur < 0) {
            row[b] = pool.allocate();
            ++held(g, seq);
          } else if (pool.refs(cur) > 1) {
            // Copy-on-write. The step keeps holding `cur` until it commits, so
            // no entry writes into it (another holder in this step copies too)
            // and an abandoned step can give it back as it was.
            row[b] = pool.allocate();
            copies_[g * max_seqs_ + copies++] = BlockCopy{cur, row[b]};
          } else {
            pool.drop_key(cur);  // its rows change: it no longer names that content
          }
        }
        int* slots = slots_.get() + static_cast<std::ptrdiff_t>(g) * max_step_tokens_ + query_starts_[i];
        for (int p = first; p < context_lens_[i]; ++p)
          slots[p - first] = row[p / block_size_] * block_size_ + p % block_size_;
        if (end_block > seqs_[seq].alloc_end) seqs_[seq].alloc_end = end_block;
      }
      group_plans_[g].n_copies = copies;
    }
    active_ = BatchStep{++last_step_id_, n, at};
    return active_;
  }

  Status check_step(const BatchStep& step) const noexcept override {
    KVCORE_CHECK_OR_RETURN_ERROR(active_.id != 0, InvalidState, "step %llu: no step is begun",
                                 static_cast<unsigned long long>(step.id));
    KVCORE_CHECK_OR_RETURN_ERROR(step.id == active_.id, InvalidState,
                                 "step %llu: not the begun step (%llu)",
                                 static_cast<unsigned long long>(step.id),
                                 static_cast<unsigned long long>(active_.id));
    return Error::Ok;
  }

  Status commit(const BatchStep& step) noexcept override {
    KVCORE_RETURN_IF_ERROR(check_step(step));
    for (int g = 0; g < n_groups_; ++g)  // the copies are made: their sources go
      for (int c = 0; c < group_plans_[g].n_copies; ++c) groups_[g].pool.release(copies_[g * max_seqs_ + c].src);
    for (int i = 0; i < active_.n_entries; ++i) {
      const int seq = step_seq_[i];
      Seq& s = seqs_[seq];
      s.length = context_lens_[i];
      hash_tokens(seq, step_tokens_.get() + query_starts_[i], query_starts_[i + 1] - query_starts_[i],
                  tokens_given_[i]);
      for (int g = 0; g < n_groups_; ++g) evict(g, seq);
    }
    active_ = BatchStep{};
    return Error::Ok;
  }

  Status abort(const BatchStep& step) noexcept override {
    KVCORE_RETURN_IF_ERROR(check_step(step));
    end_step();
    return Error::Ok;
  }

  void clear() noexcept override {
    end_step();
    for (int seq = 0; seq < max_seqs_; ++seq) reset_seq(seq);
    for (int g = 0; g < n_groups_; ++g) {
      groups_[g].pool.reset();
      for (int seq = 0; seq < max_seqs_; ++seq) {
        int* row = table(g, seq);
        for (int i = 0; i < stride_; ++i) row[i] = -1;
        held(g, seq) = 0;
        lost_below(g, seq) = 0;
      }
    }
  }

  // --- BatchControl: queries -------------------------------------------------

  Result<SequenceInfo> sequence(int seq) const noexcept override {
    KVCORE_RETURN_IF_ERROR(check_seq("sequence", seq));
    const Seq& s = seqs_[seq];
    return SequenceInfo{s.active, s.length, s.start, s.n_holes, holes_.get() + static_cast<std::ptrdiff_t>(seq) * hole_stride()};
  }

  Result<int> free_blocks(int group) const noexcept override {
    KVCORE_RETURN_IF_ERROR(check_group(group));
    return groups_[group].pool.free_blocks();
  }

  Result<int> cached_blocks(int group) const noexcept override {
    KVCORE_RETURN_IF_ERROR(check_group(group));
    return groups_[group].pool.cached_blocks();
  }

  Result<int> blocks_held(int seq, int group) const noexcept override {
    KVCORE_RETURN_IF_ERROR(check_seq("blocks_held", seq));
    KVCORE_RETURN_IF_ERROR(check_group(group));
    return held(group, seq);
  }

  Result<int> oldest_held(int seq, int group) const noexcept override {
    KVCORE_RETURN_IF_ERROR(check_seq("oldest_held", seq));
    KVCORE_RETURN_IF_ERROR(check_group(group));
    const int* row = table(group, seq);
    const int end = ceil_div(seqs_[seq].length, block_size_);
    for (int i = first_block(seq); i < end; ++i)
      if (row[i] >= 0) return i * block_size_ > seqs_[seq].start ? i * block_size_ : seqs_[seq].start;
    return seqs_[seq].length;
  }

  // --- BatchPlanner ------------------------------------------------------------

  Result<int> group_of(int layer) const noexcept override {
    KVCORE_RETURN_IF_ERROR(check_layer(layer));
    return layer_group_[layer];
  }

  Result<LayerConfig> layer_config(int layer) const noexcept override {
    KVCORE_RETURN_IF_ERROR(check_layer(layer));
    return layer_configs_[layer];
  }

  Result<LayerPolicy> group_policy(int group) const noexcept override {
    KVCORE_RETURN_IF_ERROR(check_group(group));
    return groups_[group].policy;
  }

  Result<int> num_blocks(int group) const noexcept override {
    KVCORE_RETURN_IF_ERROR(check_group(group));
    return groups_[group].pool.n_blocks();
  }

  Result<int> used_blocks(int group) const noexcept override {
    KVCORE_RETURN_IF_ERROR(check_group(group));
    return groups_[group].pool.used_blocks();
  }

  Result<BatchStepPlan> plan(const BatchStep& step) const noexcept override {
    KVCORE_RETURN_IF_ERROR(check_step(step));
    BatchStepPlan p;
    p.n_entries = active_.n_entries;
    p.n_tokens = active_.n_tokens;
    p.block_size = block_size_;
    p.seq_ids = step_seq_.get();
    p.query_starts = query_starts_.get();
    p.first_positions = first_positions_.get();
    p.context_lens = context_lens_.get();
    p.visible_starts = visible_starts_.get();
    p.holes = holes_of_.get();
    p.n_holes = n_holes_of_.get();
    p.n_groups = n_groups_;
    p.groups = group_plans_.get();
    return p;
  }

  Result<bool> visible(int group, int seq, int q, int k) const noexcept override {
    KVCORE_RETURN_IF_ERROR(check_group(group));
    KVCORE_RETURN_IF_ERROR(check_seq("visible", seq));
    KVCORE_CHECK_OR_RETURN_ERROR(q >= 0 && k >= 0, InvalidArgument,
                                 "visible(q = %d, k = %d): positions must be >= 0", q, k);
    return sees(group, seq, q, k);
  }

 private:
  struct Seq {
    bool active = false;
    int length = 0;
    int start = 0;      // positions below were removed
    int n_holes = 0;    // removed middle ranges in holes_
    int alloc_end = 0;  // block indices >= this hold nothing (tables are -1 there)
    // Prefix keys: the first hashed_blocks blocks have known keys (the last is
    // `chain`), then `partial` tokens of the current block wait in partial_.
    bool hashing = true;
    int hashed_blocks = 0;
    int partial = 0;
    BlockKey chain;
  };

  struct Group {
    LayerPolicy policy;
    BlockPool pool;
    int sink_blocks = 0;  // ring: blocks holding a sink (never released by the window)
  };

  // Which block indices a query at `length` needs in a group: all below
  // `length` for a flat group; sink blocks and [window_from, ...) for a ring.
  struct Needed {
    int sink_blocks = 0;
    int window_from = 0;
    bool contains(int i) const noexcept { return i < sink_blocks || i >= window_from; }
  };

  explicit BatchCache(const CacheConfig& cfg) noexcept
      : capacity_(cfg.capacity),
        n_layers_(cfg.n_layers),
        max_step_(cfg.effective_max_step()),
        block_size_(cfg.batch.block_size),
        max_seqs_(cfg.batch.max_seqs),
        max_holes_(cfg.batch.max_holes),
        stride_(ceil_div(cfg.capacity, cfg.batch.block_size)) {
    // Default: every sequence stepping max_step tokens at once (capped at 2^20 tokens).
    const std::int64_t every = static_cast<std::int64_t>(max_step_) * max_seqs_;
    max_step_tokens_ = cfg.batch.max_step_tokens != 0 ? cfg.batch.max_step_tokens
                                                       : static_cast<int>(every < (1 << 20) ? every : (1 << 20));
  }

  static int ceil_div(int a, int b) noexcept { return static_cast<int>((static_cast<std::int64_t>(a) + b - 1) / b); }

  // Every table, through nothrow new; ~BatchCache frees a partial build.
  Status build(const CacheConfig& cfg) noexcept {
    layer_configs_.reset(new (std::nothrow) LayerConfig[n_layers_]);
    layer_group_.reset(new (std::nothrow) int[n_layers_]);
    groups_.reset(new (std::nothrow) Group[n_layers_]);  // at worst one group per layer
    KVCORE_CHECK_OR_RETURN_ERROR(layer_configs_ && layer_group_ && groups_, MemoryAllocationFailed,
                                 "cannot allocate the layer tables of %d layers", n_layers_);
    for (int l = 0; l < n_layers_; ++l) {
      layer_configs_[l] = cfg.layer(l);
      int g = 0;
      while (g < n_groups_ && groups_[g].policy != layer_configs_[l].policy) ++g;
      if (g == n_groups_) groups_[n_groups_++].policy = layer_configs_[l].policy;
      layer_group_[l] = g;
    }
    // Table sizes, checked against int indexing.
    const std::int64_t seqs = max_seqs_;
    const std::int64_t table_entries = static_cast<std::int64_t>(n_groups_) * seqs * stride_;
    const std::int64_t step_slots = static_cast<std::int64_t>(n_groups_) * max_step_tokens_;
    const std::int64_t hole_entries = seqs * hole_stride();
    const std::int64_t token_entries = seqs * block_size_;
    constexpr std::int64_t kMax = 0x7fffffff;
    KVCORE_CHECK_OR_RETURN_ERROR(table_entries <= kMax, InvalidArgument,
                                 "%d groups x %d sequences x %d blocks per table: the tables would "
                                 "pass 2^31 entries",
                                 n_groups_, max_seqs_, stride_);
    KVCORE_CHECK_OR_RETURN_ERROR(step_slots <= kMax, InvalidArgument,
                                 "%d groups x batch.max_step_tokens = %d: the step's slot tables "
                                 "would pass 2^31 entries",
                                 n_groups_, max_step_tokens_);
    KVCORE_CHECK_OR_RETURN_ERROR(hole_entries <= kMax, InvalidArgument,
                                 "batch.max_seqs = %d x batch.max_holes = %d: the removed-range "
                                 "tables would pass 2^31 entries",
                                 max_seqs_, max_holes_);
    KVCORE_CHECK_OR_RETURN_ERROR(token_entries <= kMax, InvalidArgument,
                                 "batch.max_seqs = %d x batch.block_size = %d: the prefix-token "
                                 "tables would pass 2^31 entries",
                                 max_seqs_, block_size_);
    for (int g = 0; g < n_groups_; ++g) {
      Group& group = groups_[g];
      std::int64_t blocks = cfg.batch.num_blocks != 0 ? cfg.batch.num_blocks : seqs * stride_;
      if (group.policy.kind == LayerPolicy::Kind::Ring) {
        group.sink_blocks = ceil_div(group.policy.sinks, block_size_);
        // What one sequence can hold during a step: sinks, W + 2C - 1 positions, one straddle.
        const std::int64_t span =
            static_cast<std::int64_t>(group.policy.window) + 2 * static_cast<std::int64_t>(max_step_) - 1;
        const std::int64_t per_seq = group.sink_blocks + (span + block_size_ - 1) / block_size_ + 1;
        if (per_seq < stride_) blocks = per_seq * seqs;
        if (blocks > seqs * stride_) blocks = seqs * stride_;
      }
      KVCORE_CHECK_OR_RETURN_ERROR(blocks <= kMax / block_size_, InvalidArgument,
                                   "group %d: %lld blocks of %d rows pass 2^31 rows", g,
                                   static_cast<long long>(blocks), block_size_);
      // A pool's key table takes a power of two >= 2 slots per block, in int.
      KVCORE_CHECK_OR_RETURN_ERROR(blocks <= (1 << 30), InvalidArgument,
                                   "group %d: %lld blocks: a pool holds at most 2^30 blocks", g,
                                   static_cast<long long>(blocks));
      KVCORE_RETURN_IF_ERROR(group.pool.create(static_cast<int>(blocks), "a group's pool"));
    }
    tables_.reset(new (std::nothrow) int[table_entries]);
    held_.reset(new (std::nothrow) int[n_groups_ * seqs]());
    lost_below_.reset(new (std::nothrow) int[n_groups_ * seqs]());
    seqs_.reset(new (std::nothrow) Seq[seqs]);
    holes_.reset(new (std::nothrow) PositionRange[hole_entries > 0 ? hole_entries : 1]);
    partial_.reset(new (std::nothrow) std::int32_t[seqs * block_size_]);
    seen_.reset(new (std::nothrow) std::uint64_t[seqs]());
    scratch_keys_.reset(new (std::nothrow) BlockKey[stride_]);
    KVCORE_CHECK_OR_RETURN_ERROR(tables_ && held_ && lost_below_ && seqs_ && holes_ &&
                                     partial_ && seen_ && scratch_keys_,
                                 MemoryAllocationFailed,
                                 "cannot allocate the sequence tables of %d sequences", max_seqs_);
    for (std::int64_t i = 0; i < table_entries; ++i) tables_[i] = -1;
    step_seq_.reset(new (std::nothrow) int[seqs]);
    entry_of_.reset(new (std::nothrow) int[seqs]());
    query_starts_.reset(new (std::nothrow) int[seqs + 1]);
    first_positions_.reset(new (std::nothrow) int[seqs]);
    context_lens_.reset(new (std::nothrow) int[seqs]);
    visible_starts_.reset(new (std::nothrow) int[seqs]);
    holes_of_.reset(new (std::nothrow) const PositionRange*[seqs]);
    n_holes_of_.reset(new (std::nothrow) int[seqs]);
    tokens_given_.reset(new (std::nothrow) bool[seqs]);
    step_tokens_.reset(new (std::nothrow) std::int32_t[max_step_tokens_]);
    slots_.reset(new (std::nothrow) int[step_slots]);
    copies_.reset(new (std::nothrow) BlockCopy[n_groups_ * seqs]);
    first_before_.reset(new (std::nothrow) int[n_groups_ * seqs]);
    group_plans_.reset(new (std::nothrow) GroupPlan[n_groups_]);
    KVCORE_CHECK_OR_RETURN_ERROR(step_seq_ && entry_of_ && query_starts_ && first_positions_ &&
                                     context_lens_ && visible_starts_ && holes_of_ && n_holes_of_ &&
                                     tokens_given_ && step_tokens_ && slots_ && copies_ && first_before_ &&
                                     group_plans_,
                                 MemoryAllocationFailed,
                                 "cannot allocate the step buffers of %d tokens", max_step_tokens_);
    for (int g = 0; g < n_groups_; ++g) {
      GroupPlan& gp = group_plans_[g];
      gp.slots = slots_.get() + static_cast<std::ptrdiff_t>(g) * max_step_tokens_;
      gp.copies = copies_.get() + static_cast<std::ptrdiff_t>(g) * max_seqs_;
      gp.block_tables = tables_.get() + static_cast<std::ptrdiff_t>(g) * max_seqs_ * stride_;
      gp.table_stride = stride_;
      gp.policy = groups_[g].policy;
    }
    return Error::Ok;
  }

  int hole_stride() const noexcept { return max_holes_; }
  PositionRange* s_holes(int seq) noexcept { return holes_.get() + static_cast<std::ptrdiff_t>(seq) * hole_stride(); }
  const PositionRange* s_holes(int seq) const noexcept {
    return holes_.get() + static_cast<std::ptrdiff_t>(seq) * hole_stride();
  }
  int* table(int g, int seq) noexcept {
    return tables_.get() + (static_cast<std::ptrdiff_t>(g) * max_seqs_ + seq) * stride_;
  }
  const int* table(int g, int seq) const noexcept {
    return tables_.get() + (static_cast<std::ptrdiff_t>(g) * max_seqs_ + seq) * stride_;
  }
  int& held(int g, int seq) noexcept { return held_[g * max_seqs_ + seq]; }
  int held(int g, int seq) const noexcept { return held_[g * max_seqs_ + seq]; }
  int& lost_below(int g, int seq) noexcept { return lost_below_[g * max_seqs_ + seq]; }
  int lost_below(int g, int seq) const noexcept { return lost_below_[g * max_seqs_ + seq]; }
  // The lowest block index `seq` may hold: blocks wholly below its removed head are gone.
  int first_block(int seq) const noexcept { return seqs_[seq].start / block_size_; }

  Status check_seq(const char* what, int seq) const noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(seq >= 0 && seq < max_seqs_, InvalidArgument,
                                 "%s: sequence %d must be in [0, max_seqs = %d)", what, seq, max_seqs_);
    return Error::Ok;
  }
  Status check_active(const char* what, int seq) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_seq(what, seq));
    KVCORE_CHECK_OR_RETURN_ERROR(seqs_[seq].active, InvalidState,
                                 "%s: sequence %d is not active (add_sequence or fork it first)",
                                 what, seq);
    return Error::Ok;
  }
  Status check_group(int group) const noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(group >= 0 && group < n_groups_, InvalidArgument,
                                 "group = %d: must be in [0, n_groups = %d)", group, n_groups_);
    return Error::Ok;
  }
  Status check_layer(int layer) const noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(layer >= 0 && layer < n_layers_, InvalidArgument,
                                 "layer = %d: must be in [0, n_layers = %d)", layer, n_layers_);
    return Error::Ok;
  }

  // Verbs change the tables a plan points into: any begun step is over, and
  // the tables go back to what they were before it. The blocks it allocated
  // return to the pools: those past each sequence's length, and at the index
  // of its first new position a fresh block or a copy-on-write block (the
  // backend may never have made the copy: the sequence gets back the shared
  // block it copied from, which the step kept holding).
  void end_step() noexcept {
    if (active_.id != 0) {
      for (int g = 0; g < n_groups_; ++g) {
        for (int i = 0; i < active_.n_entries; ++i) {
          const int seq = step_seq_[i];
          int& block = table(g, seq)[seqs_[seq].length / block_size_];
          const int before = first_before_[g * max_seqs_ + i];
          if (block == before) continue;  // its own block, written in place
          groups_[g].pool.release(block);
          if (before < 0) --held(g, seq);
          block = before;
        }
        group_plans_[g].n_copies = 0;
      }
    }
    for (int i = 0; i < active_.n_entries; ++i) {
      const int seq = step_seq_[i];
      if (seqs_[seq].active) release_from(seq, ceil_div(seqs_[seq].length, block_size_));
    }
    active_ = BatchStep{};
  }

  // The entry of `seq` in the begun step, or -1.
  int begun_entry(int seq) const noexcept {
    if (active_.id == 0) return -1;
    const int i = entry_of_[seq];
    return i < active_.n_entries && step_seq_[i] == seq ? i : -1;
  }

  // Blocks of group g the begun step allocated: end_step() gives them back.
  int begun_blocks(int g) const noexcept {
    if (active_.id == 0) return 0;
    int n = 0;
    for (int i = 0; i < active_.n_entries; ++i) {
      const int seq = step_seq_[i];
      const int first = seqs_[seq].length / block_size_;
      n += ceil_div(context_lens_[i], block_size_) - 1 - first;  // past the first: all new
      if (table(g, seq)[first] != first_before_[g * max_seqs_ + i]) ++n;  // the first: new, or a copy
    }
    return n;
  }

  // Empty: no committed position, so no block outside the begun step (whose
  // blocks go when the call asking ends it: fork and adopt_prefix into an
  // empty sequence a step was begun for are fine).
  bool holds_nothing(int seq) const noexcept { return seqs_[seq].length == 0; }

  // Inactive, length 0, nothing held (its tables must already be released).
  void reset_seq(int seq) noexcept {
    seqs_[seq] = Seq{};
    for (int g = 0; g < n_groups_; ++g) {
      lost_below(g, seq) = 0;
    }
  }

  // Releases every block of `seq` at index >= `from` (every group).
  void release_from(int seq, int from) noexcept {
    for (int g = 0; g < n_groups_; ++g) {
      int* row = table(g, seq);
      for (int i = from; i < seqs_[seq].alloc_end; ++i) {
        if (row[i] < 0) continue;
        groups_[g].pool.release(row[i]);
        row[i] = -1;
        --held(g, seq);
      }
    }
    if (seqs_[seq].alloc_end > from) seqs_[seq].alloc_end = from;
  }

  // Is position p removed from `seq` (below its start, or in a hole)?
  bool removed(int seq, int p) const noexcept {
    const Seq& s = seqs_[seq];
    if (p < s.start) return true;
    for (int h = 0; h < s.n_holes; ++h) {
      const PositionRange& r = s_holes(seq)[h];
      if (p < r.begin) return false;
      if (p < r.end) return true;
    }
    return false;
  }

  // The first position >= p that `seq` has not removed.
  int next_kept(int seq, int p) const noexcept {
    const Seq& s = seqs_[seq];
    if (p < s.start) p = s.start;
    for (int h = 0; h < s.n_holes; ++h) {
      const PositionRange& r = s_holes(seq)[h];
      if (p < r.begin) break;
      if (p < r.end) p = r.end;
    }
    return p;
  }

  bool sees(int g, int seq, int q, int k) const noexcept { return groups_[g].policy.sees(q, k) && !removed(seq, k); }

  // Releases the blocks of [p0, p1) whose every position below the length is removed.
  void release_removed(int seq, int p0, int p1) noexcept {
    const int B = block_size_;
    const int length = seqs_[seq].length;
    for (int i = p0 / B; i * B < p1; ++i) {
      const int lo = i * B;
      const int hi = (i + 1) * B < length ? (i + 1) * B : length;
      if (next_kept(seq, lo) < hi) continue;  // a position of it is still seen
      for (int g = 0; g < n_groups_; ++g) {
        int* row = table(g, seq);
        if (row[i] < 0) continue;
        groups_[g].pool.release(row[i]);
        row[i] = -1;
        --held(g, seq);
      }
    }
  }

  // The ring group (index) of `seq` whose rows no longer hold what a query at n
  // needs below n; -1 when none (n within [0, length]).
  int rewind_blocker(int seq, int n) const noexcept {
    for (int g = 0; g < n_groups_; ++g) {
      const Group& group = groups_[g];
      if (group.policy.kind != LayerPolicy::Kind::Ring) continue;
      // Released by the window: positions [lo, hi) (in 64 bits: sinks may round
      // up past 2^31).
      const std::int64_t lo = static_cast<std::int64_t>(group.sink_blocks) * block_size_;
      const std::int64_t hi = lost_below(g, seq);
      const std::int64_t window_from = static_cast<std::int64_t>(n) - group.policy.window + 1;
      const std::int64_t from = window_from > lo ? window_from : lo;
      if (from >= n) continue;  // a query at n needs nothing below n past the sinks
      const int needed = next_kept(seq, static_cast<int>(from));  // removed positions are not needed
      if (needed < n && needed < hi) return g;
    }
    return -1;
  }

  Status truncate(int seq, int n, const char* what) noexcept {
    if (n > 0) {
      const int blocking = rewind_blocker(seq, n);
      KVCORE_CHECK_OR_RETURN_ERROR(blocking < 0, InvalidState,
                                   "%s(%d, %d): group %d no longer holds what a query at %d needs "
                                   "(released by its window)",
                                   what, seq, n, blocking, n);
    }
    end_step();
    Seq& s = seqs_[seq];
    release_from(seq, ceil_div(n, block_size_));
    // Positions from n on are written again: the window has released none of
    // them. (Those below n it released stay lost, even in a block index the
    // next step fills afresh.)
    for (int g = 0; g < n_groups_; ++g)
      if (lost_below(g, seq) > n) lost_below(g, seq) = n;
    s.length = n;
    if (s.start > n) s.start = n;
    while (s.n_holes > 0 && s_holes(seq)[s.n_holes - 1].begin >= n) --s.n_holes;
    if (s.n_holes > 0 && s_holes(seq)[s.n_holes - 1].end > n) s_holes(seq)[s.n_holes - 1].end = n;
    // The last, partly kept block goes too when every position it keeps is removed.
    if (n % block_size_ != 0) release_removed(seq, n - n % block_size_, n);
    if (n == 0) {
      const bool was_active = s.active;
      reset_seq(seq);
      s.active = was_active;
      return Error::Ok;
    }
    rewind_hashing(seq, n);
    return Error::Ok;
  }

  // Ring group g at length L: no query after a rewind of up to max_step
  // positions sees a position below L - max_step - window + 1 but the sinks
  // (in 64 bits: it may lie far below 0).
  std::int64_t release_floor(int g, int length) const noexcept {
    return static_cast<std::int64_t>(length) - max_step_ - groups_[g].policy.window + 1;
  }

  // Ring groups: release the blocks below what a query after a rewind of up to
  // max_step tokens can need (sink blocks stay).
  void evict(int g, int seq) noexcept {
    Group& group = groups_[g];
    if (group.policy.kind != LayerPolicy::Kind::Ring) return;
    const std::int64_t floor = release_floor(g, seqs_[seq].length);
    if (floor <= 0) return;
    const int floor_block = static_cast<int>(floor / block_size_);
    int& lost = lost_below(g, seq);
    int* row = table(g, seq);
    const int from = lost / block_size_;  // the block holding `lost` may hold positions written since
    for (int i = from > group.sink_blocks ? from : group.sink_blocks; i < floor_block; ++i) {
      if (row[i] < 0) continue;
      group.pool.release(row[i]);
      row[i] = -1;
      --held(g, seq);
    }
    if (floor_block * block_size_ > lost) lost = floor_block * block_size_;
  }

  // The blocks a sequence adopting a hit of `blocks` full blocks needs in group
  // g: what its queries need after a rewind of up to max_step tokens, as a
  // sequence that computed the prefix itself would hold.
  Needed needed_blocks(int g, int blocks) const noexcept {
    const Group& group = groups_[g];
    if (group.policy.kind != LayerPolicy::Kind::Ring) return Needed{0, 0};
    const std::int64_t window_from = release_floor(g, blocks * block_size_);
    const int from = window_from > 0 ? static_cast<int>(window_from / block_size_) : 0;
    return Needed{group.sink_blocks, from > group.sink_blocks ? from : group.sink_blocks};
  }

  // Does every group hold (as cached blocks) what a hit of `blocks` blocks needs?
  bool servable(int blocks) const noexcept {
    for (int g = 0; g < n_groups_; ++g) {
      const Needed need = needed_blocks(g, blocks);
      for (int i = 0; i < blocks; ++i)
        if (need.contains(i) && groups_[g].pool.find(scratch_keys_[i]) < 0) return false;
    }
    return true;
  }

  // Folds a committed step's tokens into the sequence's prefix keys; each block
  // they fill is named in every group that holds it.
  void hash_tokens(int seq, const std::int32_t* tokens, int T, bool given) noexcept {
    Seq& s = seqs_[seq];
    if (!s.hashing) return;
    if (!given) {
      s.hashing = false;
      return;
    }
    std::int32_t* partial = partial_.get() + static_cast<std::ptrdiff_t>(seq) * block_size_;
    for (int j = 0; j < T; ++j) {
      partial[s.partial++] = tokens[j];
      if (s.partial < block_size_) continue;
      s.chain = BlockKey::chain(s.chain, partial, block_size_);
      for (int g = 0; g < n_groups_; ++g) {
        const int b = table(g, seq)[s.hashed_blocks];
        if (b >= 0) groups_[g].pool.set_key(b, s.chain);
      }
      ++s.hashed_blocks;
      s.partial = 0;
    }
  }

  // After the length went down to n: the prefix keys of what is left, when known.
  void rewind_hashing(int seq, int n) noexcept {
    Seq& s = seqs_[seq];
    if (!s.hashing) return;
    if (n >= s.hashed_blocks * block_size_) {
      s.partial = n - s.hashed_blocks * block_size_;
      return;
    }
    s.hashing = restore_chain(seq, seq, n);
  }

  // Sets dst's keys to src's at position n when they are known: n on a block
  // boundary whose last block still carries its key in some group.
  bool restore_chain(int src, int dst, int n) noexcept {
    Seq& d = seqs_[dst];
    d.partial = 0;
    if (n % block_size_ != 0) return false;
    d.hashed_blocks = n / block_size_;
    if (n == 0) {
      d.chain = BlockKey{};
      return true;
    }
    for (int g = 0; g < n_groups_; ++g) {
      const int b = table(g, src)[d.hashed_blocks - 1];
      if (b >= 0 && groups_[g].pool.keyed(b)) {
        d.chain = groups_[g].pool.key(b);
        return true;
      }
    }
    return false;
  }

  void inherit_hashing(int src, int dst, int upto) noexcept {
    const Seq& s = seqs_[src];
    Seq& d = seqs_[dst];
    d.hashing = s.hashing && s.start == 0 && s.n_holes == 0;
    if (!d.hashing) return;
    if (upto >= s.hashed_blocks * block_size_) {
      d.chain = s.chain;
      d.hashed_blocks = s.hashed_blocks;
      d.partial = upto - s.hashed_blocks * block_size_;
      const std::int32_t* from = partial_.get() + static_cast<std::ptrdiff_t>(src) * block_size_;
      std::int32_t* to = partial_.get() + static_cast<std::ptrdiff_t>(dst) * block_size_;
      for (int j = 0; j < d.partial; ++j) to[j] = from[j];
      return;
    }
    d.hashing = restore_chain(src, dst, upto);
  }

  int capacity_;
  int n_layers_;
  int max_step_;
  int block_size_;
  int max_seqs_;
  int max_holes_;
  int stride_;
  int max_step_tokens_ = 0;
  int n_groups_ = 0;
  std::unique_ptr<LayerConfig[]> layer_configs_;
  std::unique_ptr<int[]> layer_group_;
  std::unique_ptr<Group[]> groups_;  // the first n_groups_
  // Per group and sequence: block tables [g][seq][stride_], blocks held, and
  // (rings) the position below which the window released every block past
  // the sinks: those positions are lost even where a later step refilled
  // their block index.
  std::unique_ptr<int[]> tables_;
  std::unique_ptr<int[]> held_;
  std::unique_ptr<int[]> lost_below_;
  // Per sequence.
  std::unique_ptr<Seq[]> seqs_;
  std::unique_ptr<PositionRange[]> holes_;   // [seq][max_holes]
  std::unique_ptr<std::int32_t[]> partial_;  // [seq][B]: tokens of the block being filled
  std::unique_ptr<std::uint64_t[]> seen_;    // begin_step's repeat check
  std::uint64_t stamp_ = 0;
  std::unique_ptr<BlockKey[]> scratch_keys_;  // adopt_prefix: a prompt's block keys
  // The begun step and its plan.
  BatchStep active_;
  std::uint64_t last_step_id_ = 0;
  std::unique_ptr<int[]> step_seq_;
  std::unique_ptr<int[]> entry_of_;  // [seq]: its entry in the begun step (check step_seq_)
  std::unique_ptr<int[]> query_starts_;
  std::unique_ptr<int[]> first_positions_;
  std::unique_ptr<int[]> context_lens_;
  std::unique_ptr<int[]> visible_starts_;
  std::unique_ptr<const PositionRange*[]> holes_of_;
  std::unique_ptr<int[]> n_holes_of_;
  std::unique_ptr<bool[]> tokens_given_;
  std::unique_ptr<std::int32_t[]> step_tokens_;
  std::unique_ptr<int[]> slots_;         // [g][max_step_tokens_]
  std::unique_ptr<BlockCopy[]> copies_;  // [g][max_seqs_]
  std::unique_ptr<int[]> first_before_;  // [g][entry]: the block at its first position's index before the step
  std::unique_ptr<GroupPlan[]> group_plans_;
};

}  // namespace kvcore
