// A brute-force model of DESIGN.md section 6, written from its text and never
// from BatchCache: each sequence is simulated alone, as section 2 does (its
// length, which positions were removed, the tokens it was given), and a
// simulated byte layer applies the cache's plans to tagged rows. A row's tag
// stands for its K/V: for a sequence whose history is a plain token prefix it
// is a hash of the tokens up to that position (so a block reused by a prefix
// hit must carry the tag a fresh computation would), otherwise a unique write
// id. check_step() proves that for every query of a step, every key the
// visibility rule lets it see is named by the plan and holds exactly that K/V,
// and that the planner's visibility answers match. Free of gtest: the batch
// fuzzer (tests/fuzz/batch_fuzzer.cpp) uses it too.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kvcore/batch/batch_cache.h"
#include "kvcore/batch/step_mask.h"

namespace kvcore_test {

/// A plan's arrays, copied out (a plan points into the cache's buffers).
struct PlanCopy {
  std::vector<int> ints;
  bool operator==(const PlanCopy& o) const { return ints == o.ints; }
};

inline PlanCopy copy_of(const kvcore::BatchStepPlan& p) {
  PlanCopy c;
  std::vector<int>& v = c.ints;
  v = {p.n_entries, p.n_tokens, p.block_size, p.n_groups};
  for (int i = 0; i < p.n_entries; ++i) {
    v.insert(v.end(), {p.seq_ids[i], p.query_starts[i], p.first_positions[i], p.context_lens[i], p.visible_starts[i],
                       p.n_holes[i]});
    for (int h = 0; h < p.n_holes[i]; ++h) v.insert(v.end(), {p.holes[i][h].begin, p.holes[i][h].end});
  }
  v.push_back(p.query_starts[p.n_entries]);
  for (int g = 0; g < p.n_groups; ++g) {
    const kvcore::GroupPlan& gp = p.groups[g];
    v.insert(v.end(), gp.slots, gp.slots + p.n_tokens);
    v.push_back(gp.n_copies);
    for (int c2 = 0; c2 < gp.n_copies; ++c2) v.insert(v.end(), {gp.copies[c2].src, gp.copies[c2].dst});
  }
  return c;
}

/// Everything the cache shows (what a refused call must leave as it was):
/// every sequence's info, blocks held, oldest held and rewind answers, every
/// pool's free and cached counts and every block table, every State group's
/// slots.
struct Snapshot {
  std::vector<int> ints;
  std::vector<bool> rewinds;
  bool operator==(const Snapshot& o) const { return ints == o.ints && rewinds == o.rewinds; }
};

inline Snapshot snapshot(const kvcore::BatchCache& c) {
  Snapshot s;
  std::vector<int>& v = s.ints;
  for (int q = 0; q < c.max_seqs(); ++q) {
    const kvcore::SequenceInfo info = *c.sequence(q);
    v.insert(v.end(), {info.active ? 1 : 0, info.length, info.visible_start, info.n_holes});
    for (int h = 0; h < info.n_holes; ++h) v.insert(v.end(), {info.holes[h].begin, info.holes[h].end});
    for (int g = 0; g < c.n_groups(); ++g) v.insert(v.end(), {*c.blocks_held(q, g), *c.oldest_held(q, g)});
    for (int n = -1; n <= info.length + 1; ++n) s.rewinds.push_back(c.can_rewind(q, n));
    s.rewinds.push_back(c.can_rewind(q, INT_MAX));
  }
  for (int g = 0; g < c.n_groups(); ++g) {
    v.insert(v.end(), {*c.free_blocks(g), *c.cached_blocks(g)});
    // Each active sequence's row, read through block_at: either table layout.
    for (int q = 0; q < c.max_seqs(); ++q)
      if (c.sequence(q)->active)
        for (int i = 0; i < c.table_stride(); ++i) v.push_back(c.block_at(q, g, i));
  }
  // State groups (section 9): each active sequence's logical slots, what they
  // hold and name, and the free physical slots.
  for (int k = 0; k < c.n_state_groups(); ++k) {
    v.push_back(*c.free_state_slots(k));
    for (int q = 0; q < c.max_seqs(); ++q) {
      if (!c.sequence(q)->active) continue;
      for (int sl = 0; sl < c.state_group_policy(k)->slots; ++sl)
        v.insert(v.end(), {*c.held_state(k, q, sl), *c.state_slot(k, q, sl)});
    }
  }
  return s;
}

/// One sequence, alone.
struct SeqModel {
  bool active = false;
  /// Per position: the tag of its K/V; 0 once removed (never seen again).
  std::vector<std::uint64_t> tags;
  /// Per position: the token, or -1 when none was given.
  std::vector<std::int32_t> tokens;
  /// False once its history stops being a plain token prefix (a removal, or a
  /// step without tokens): later K/V are then unique to it.
  bool plain = true;
  /// The longest committed length since it last went back to 0: ring groups keep
  /// what a rewind of up to max_step tokens from there needs.
  int peak = 0;

  int length() const { return static_cast<int>(tags.size()); }
};

class BatchModel {
 public:
  explicit BatchModel(const kvcore::CacheConfig& cfg) {
    seqs_.resize(static_cast<std::size_t>(cfg.batch.max_seqs));
  }

  SeqModel& seq(int s) { return seqs_[static_cast<std::size_t>(s)]; }
  const SeqModel& seq(int s) const { return seqs_[static_cast<std::size_t>(s)]; }

  /// DESIGN.md section 2's rule for a policy, and section 9's for a chunked
  /// layer of chunk K: k <= q and k / K == q / K. (A shared layer reads its
  /// source's group: callers pass the source's policy.)
  static bool in_window(const kvcore::LayerPolicy& p, int q, int k) {
    if (k > q) return false;
    if (p.kind == kvcore::LayerPolicy::Kind::Chunked) return k / p.window == q / p.window;
    if (p.kind != kvcore::LayerPolicy::Kind::Ring) return true;
    return q - k < p.window || k < p.sinks;
  }

  /// The policy whose rule layer l of `cfg` follows: its own, or for a Shared
  /// layer its source's (section 9: it reads exactly what its source reads).
  static kvcore::LayerPolicy effective_policy(const kvcore::CacheConfig& cfg, int l) {
    kvcore::LayerPolicy p = cfg.layer(l).policy;
    while (p.kind == kvcore::LayerPolicy::Kind::Shared) p = cfg.layer(p.source).policy;
    return p;
  }

  /// Section 9: a shared layer holds no blocks and reads its source's group;
  /// every other layer's group follows its own policy; layers with identical
  /// policies share a group. Returns "" or the first difference.
  static std::string check_layer_groups(const kvcore::BatchCache& cache, const kvcore::CacheConfig& cfg) {
    std::vector<kvcore::LayerPolicy> distinct;
    for (int l = 0; l < cfg.n_layers; ++l) {
      const kvcore::LayerPolicy own = cfg.layer(l).policy;
      const kvcore::LayerPolicy eff = effective_policy(cfg, l);
      const int g = *cache.group_of(l);
      if (*cache.group_policy(g) != eff) return "layer " + std::to_string(l) + ": its group's policy is not its rule";
      if (own.kind == kvcore::LayerPolicy::Kind::Shared) {
        if (g != *cache.group_of(own.source))
          return "shared layer " + std::to_string(l) + ": not its source's group";
        continue;
      }
      if (std::find(distinct.begin(), distinct.end(), own) == distinct.end()) distinct.push_back(own);
    }
    // "Layers of one policy form groups of at most page_layers layers (0: the
    // fewest any policy has), each opened at its first layer": the expected
    // group of every K/V layer, counted here from the rule.
    std::vector<int> count(distinct.size(), 0);
    for (int l = 0; l < cfg.n_layers; ++l)
      if (cfg.layer(l).policy.holds_keys())
        ++count[static_cast<std::size_t>(std::find(distinct.begin(), distinct.end(), cfg.layer(l).policy) - distinct.begin())];
    int size = cfg.batch.page_layers;
    if (size == 0)
      for (int c : count)
        if (c > 0) size = size == 0 || c < size ? c : size;
    std::vector<int> open(distinct.size(), -1), filled(distinct.size(), 0);
    int groups = 0;
    for (int l = 0; l < cfg.n_layers; ++l) {
      if (!cfg.layer(l).policy.holds_keys()) continue;
      const std::size_t c =
          static_cast<std::size_t>(std::find(distinct.begin(), distinct.end(), cfg.layer(l).policy) - distinct.begin());
      if (open[c] < 0 || filled[c] == size) {
        open[c] = groups++;
        filled[c] = 0;
      }
      ++filled[c];
      if (*cache.group_of(l) != open[c]) return "layer " + std::to_string(l) + ": not in group " + std::to_string(open[c]);
    }
    if (cache.n_groups() != groups) return "groups: " + std::to_string(cache.n_groups()) + ", the rule makes " + std::to_string(groups);
    return "";
  }

  // --- what a verb that succeeded does to the model ------------------------
  // (one place for the brute-force test, the fuzzer, the pool and scenario tests)

  /// add_sequence(s).
  void add(int s) {
    seq(s) = SeqModel{};
    seq(s).active = true;
  }
  /// release_sequence(s).
  void release(int s) { seq(s) = SeqModel{}; }
  /// clear().
  void clear() {
    for (SeqModel& m : seqs_) m = SeqModel{};
  }
  /// A begun step writes T positions of s (`tokens` null: none given); each
  /// position's tag is appended to `tags`. Undone by abandon(), kept by commit().
  void write(int s, const std::int32_t* tokens, int T, std::vector<std::uint64_t>* tags) {
    SeqModel& m = seq(s);
    for (int j = 0; j < T; ++j) {
      const std::int32_t t = tokens != nullptr ? tokens[j] : -1;
      const std::uint64_t tag = tag_for(s, m.length(), t);
      m.tags.push_back(tag);
      m.tokens.push_back(t);
      tags->push_back(tag);
    }
  }
  /// The step that wrote s is committed (`tokens_given`: its entry carried ids).
  void commit(int s, bool tokens_given) {
    SeqModel& m = seq(s);
    if (!tokens_given) m.plain = false;
    m.peak = std::max(m.peak, m.length());
  }
  /// The step that wrote T positions of s ended uncommitted: they are forgotten.
  void abandon(int s, int T) {
    SeqModel& m = seq(s);
    m.tags.resize(m.tags.size() - static_cast<std::size_t>(T));
    m.tokens.resize(m.tags.size());
  }
  /// fork(src, dst, upto).
  void fork(int src, int dst, int upto) {
    SeqModel copy = seq(src);
    copy.tags.resize(static_cast<std::size_t>(upto));
    copy.tokens.resize(static_cast<std::size_t>(upto));
    copy.plain = upto == 0 || plain(copy);  // at length 0 a history is a plain prefix
    seq(dst) = copy;
  }
  /// rewind(s, n), or a remove(s, n, p1) with p1 >= length (a truncation).
  void truncate(int s, int n) {
    SeqModel& m = seq(s);
    m.tags.resize(static_cast<std::size_t>(n));
    m.tokens.resize(static_cast<std::size_t>(n));
    m.plain = n == 0 || plain(m);
    if (n == 0) m.peak = 0;
  }
  /// s after remove(s, p0, p1) of its head or middle (p1 < length): the
  /// positions leave its history (tag 0). Not applied: the caller checks it first.
  SeqModel removed(int s, int p0, int p1) const {
    SeqModel after = seq(s);
    const int end = std::min(p1, after.length());
    for (int p = p0; p < end; ++p) after.tags[static_cast<std::size_t>(p)] = 0;
    if (p0 < end) after.plain = false;
    return after;
  }
  /// adopt_prefix(s, prompt) on an empty s returned `hit`: s holds the K/V a
  /// fresh computation of prompt[0, hit) would.
  void adopt(int s, const std::vector<std::int32_t>& prompt, int hit) {
    SeqModel& m = seq(s);
    m = SeqModel{};
    m.active = true;
    m.peak = hit;
    for (int p = 0; p < hit; ++p) {
      m.tokens.push_back(prompt[static_cast<std::size_t>(p)]);
      m.tags.push_back(prefix_tag(prompt, p));
    }
  }

  /// A history is a plain token prefix when nothing was removed and every
  /// token is known (the only histories whose K/V prefix reuse may share).
  static bool plain(const SeqModel& m) {
    for (std::size_t p = 0; p < m.tags.size(); ++p)
      if (m.tags[p] == 0 || m.tokens[p] < 0) return false;
    return m.plain;
  }

  /// Removed ranges that neither start at 0 nor touch another: what
  /// batch.max_holes counts.
  static int holes(const SeqModel& m) {
    int n = 0;
    std::size_t p = 0;
    while (p < m.tags.size() && m.tags[p] == 0) ++p;
    for (; p < m.tags.size(); ++p)
      if (m.tags[p] == 0 && m.tags[p - 1] != 0) ++n;
    return n;
  }

  /// Must a rewind (or fork, or truncation) of `s` to n succeed under `cfg`'s
  /// layers and the cache's rewind margin `R` (max_rewind, default max_step)? Up
  /// to R back from the longest length since it last was 0 always does, and so
  /// does n <= the smallest ring's sinks (so n = 0 too).
  bool must_allow(const kvcore::CacheConfig& cfg, int R, int s, int n) const {
    const SeqModel& m = seq(s);
    if (n < 0 || n > m.length()) return false;
    if (n >= m.peak - R) return true;
    // A chunked layer (section 9) has no sinks: only n = 0 below the margin.
    int sinks = INT_MAX;
    for (const kvcore::LayerConfig& l : cfg.layers)
      if (l.policy.kind == kvcore::LayerPolicy::Kind::Ring) sinks = std::min(sinks, l.policy.sinks);
      else if (l.policy.kind == kvcore::LayerPolicy::Kind::Chunked) sinks = 0;
    return n <= sinks;
  }

  /// The tag position p of `s` gets when written now with token `t` (-1: none).
  std::uint64_t tag_for(int s, int p, std::int32_t t) {
    SeqModel& m = seq(s);
    if (!m.plain || t < 0) return next_unique_++;
    return chain_tag(m.tokens.data(), p, t);
  }

  /// The tag a plain token prefix gives position p (for checking adopted blocks).
  static std::uint64_t prefix_tag(const std::vector<std::int32_t>& tokens, int p) {
    return chain_tag(tokens.data(), p, tokens[static_cast<std::size_t>(p)]);
  }

 private:
  // The K/V a computation of tokens[0, p) then `t` puts at position p: a hash
  // of them all, never 0.
  static std::uint64_t chain_tag(const std::int32_t* tokens, int p, std::int32_t t) {
    std::uint64_t h = 0x2545f4914f6cdd1dull;
    for (int i = 0; i < p; ++i) h = mix(h ^ static_cast<std::uint32_t>(tokens[i]));
    return mix(h ^ static_cast<std::uint32_t>(t)) | 1;
  }

  static std::uint64_t mix(std::uint64_t x) {
    x ^= x >> 31;
    x *= 0x7fb5d329728ea185ull;
    x ^= x >> 27;
    x *= 0x81dadef4bc2dd44dull;
    return x ^ (x >> 33);
  }

  std::vector<SeqModel> seqs_;
  std::uint64_t next_unique_ = 1ull << 62;
};

/// The byte layer: per group, the tag each row holds.
struct TaggedPools {
  std::vector<std::vector<std::uint64_t>> rows;

  explicit TaggedPools(const kvcore::BatchCache& cache) {
    for (int g = 0; g < cache.n_groups(); ++g)
      rows.emplace_back(static_cast<std::size_t>(*cache.num_blocks(g)) *
                            static_cast<std::size_t>(cache.block_size()),
                        0);
  }

  /// Copies, then writes: what a backend does with a plan.
  void apply(const kvcore::BatchStepPlan& plan, const std::vector<std::uint64_t>& token_tags) {
    const std::size_t B = static_cast<std::size_t>(plan.block_size);
    for (int g = 0; g < plan.n_groups; ++g) {
      std::vector<std::uint64_t>& pool = rows[static_cast<std::size_t>(g)];
      const kvcore::GroupPlan& gp = plan.groups[g];
      for (int c = 0; c < gp.n_copies; ++c)
        std::copy_n(pool.begin() + static_cast<long>(gp.copies[c].src * B), B,
                    pool.begin() + static_cast<long>(gp.copies[c].dst * B));
      for (int t = 0; t < plan.n_tokens; ++t)
        pool[static_cast<std::size_t>(gp.slots[t])] = token_tags[static_cast<std::size_t>(t)];
    }
  }
};

/// Every query of the begun step sees exactly the keys the rule allows, each
/// named by the plan's block table and holding its latest K/V. Returns "" or
/// the first difference.
inline std::string check_step(const kvcore::BatchCache& cache, const BatchModel& model,
                              const kvcore::BatchStepPlan& plan, const TaggedPools& pools) {
  const int B = plan.block_size;
  // The dense masks over each group's live rows, to compare with the rule below.
  std::vector<std::vector<unsigned char>> masks;
  std::vector<int> mask_rows;
  for (int g = 0; g < plan.n_groups; ++g) {
    mask_rows.push_back(*cache.used_blocks(g) * B);
    masks.emplace_back(static_cast<std::size_t>(plan.n_tokens) * static_cast<std::size_t>(mask_rows.back()));
    const kvcore::Status st = kvcore::fill_step_mask(plan, g, mask_rows.back(), masks.back().data());
    if (!st.ok()) return std::string("fill_step_mask: ") + st.message().c_str();
  }
  for (int i = 0; i < plan.n_entries; ++i) {
    const int s = plan.seq_ids[i];
    const SeqModel& m = model.seq(s);
    if (plan.context_lens[i] != m.length()) return "entry " + std::to_string(i) + ": context length";
    for (int g = 0; g < plan.n_groups; ++g) {
      const kvcore::LayerPolicy policy = *cache.group_policy(g);
      const kvcore::TableRow table = kvcore::table_row(plan, g, i);  // either table layout
      for (int q = plan.first_positions[i]; q < plan.context_lens[i]; ++q) {
        const int t = plan.query_starts[i] + (q - plan.first_positions[i]);
        std::vector<unsigned char> want(static_cast<std::size_t>(mask_rows[static_cast<std::size_t>(g)]), 0);
        for (int k = 0; k <= q; ++k) {
          const bool seen = BatchModel::in_window(policy, q, k) && m.tags[static_cast<std::size_t>(k)] != 0;
          // Made only for a failure: this loop runs for every key of every query.
          auto where = [&] {
            return "seq " + std::to_string(s) + " group " + std::to_string(g) + " query " + std::to_string(q) +
                   " key " + std::to_string(k);
          };
          if (*cache.visible(g, s, q, k) != seen) return where() + ": visible() disagrees";
          // The plan's removed ranges say the same.
          bool removed = k < plan.visible_starts[i];
          for (int h = 0; h < plan.n_holes[i]; ++h)
            removed = removed || (k >= plan.holes[i][h].begin && k < plan.holes[i][h].end);
          if (removed != (m.tags[static_cast<std::size_t>(k)] == 0)) return where() + ": removed ranges disagree";
          if (!seen) continue;
          const int block = table[k / B];
          if (block < 0) return where() + ": a needed key's block is a hole";
          const std::uint64_t held = pools.rows[static_cast<std::size_t>(g)][static_cast<std::size_t>(block * B + k % B)];
          if (held != m.tags[static_cast<std::size_t>(k)]) return where() + ": the row holds other K/V";
          if (block * B + k % B >= mask_rows[static_cast<std::size_t>(g)]) return where() + ": past used_blocks";
          want[static_cast<std::size_t>(block * B + k % B)] = 1;
        }
        const unsigned char* got = masks[static_cast<std::size_t>(g)].data() +
                                   static_cast<std::ptrdiff_t>(t) * mask_rows[static_cast<std::size_t>(g)];
        if (!std::equal(want.begin(), want.end(), got))
          return "seq " + std::to_string(s) + " group " + std::to_string(g) + " query " + std::to_string(q) +
                 ": fill_step_mask marks other rows than the rule";
      }
    }
  }
  return "";
}

/// The block pools as docs/batch.md section 5 states them, to predict every
/// adopt_prefix hit exactly (and every admission). Written from the docs, not
/// from BatchCache: a block's name is the token ids of its whole prefix (not a
/// hash), and each rule below quotes the docs. Driven with the calls the cache
/// accepted.
class PrefixModel {
 public:
  explicit PrefixModel(const kvcore::BatchCache& cache)
      : B_(cache.block_size()), R_(cache.max_rewind()), stride_(cache.table_stride()) {
    // "Every group draws from one pool" (docs/design.md section 6, "One budget").
    if (cache.n_groups() > 0) blocks_.resize(static_cast<std::size_t>(*cache.num_blocks(0)));
    for (int g = 0; g < cache.n_groups(); ++g) {
      Group grp;
      grp.index = g;
      grp.policy = *cache.group_policy(g);
      grp.tables.assign(static_cast<std::size_t>(cache.max_seqs()), std::vector<int>(static_cast<std::size_t>(stride_), -1));
      groups_.push_back(grp);
    }
    seqs_.resize(static_cast<std::size_t>(cache.max_seqs()));
  }

  // --- verbs ---------------------------------------------------------------------

  void add(int s) {
    end_step();
    reset(s);
  }
  // "A released sequence's blocks go tail first": its highest index first.
  void release(int s) {
    end_step();
    release_from(s, 0);
    reset(s);
  }
  void clear() {
    for (Block& b : blocks_) b = Block{};
    for (Group& g : groups_) {
      for (std::vector<int>& t : g.tables) std::fill(t.begin(), t.end(), -1);
      g.copies.clear();
      g.writes.clear();
    }
    for (std::size_t s = 0; s < seqs_.size(); ++s) reset(static_cast<int>(s));
    step_.clear();
  }

  // "A fork shares every block of the source that holds a position the new
  // sequence sees"; rings then give back what a query at `upto` cannot need.
  void fork(int src, int dst, int upto) {
    end_step();
    release_from(dst, 0);
    Seq& d = seq(dst);
    const Seq& from = seq(src);
    d = Seq{};
    d.tokens.assign(from.tokens.begin(), from.tokens.begin() + upto);
    d.removed.assign(from.removed.begin(), from.removed.begin() + upto);
    for (Group& g : groups_) {
      for (int i = 0; i * B_ < upto; ++i) {
        const int b = g.table(src)[i];
        bool seen = false;
        for (int p = i * B_; p < std::min((i + 1) * B_, upto); ++p) seen = seen || !d.removed[static_cast<std::size_t>(p)];
        if (b < 0 || !seen) continue;
        hold(g, b);
        g.table(dst)[i] = b;
      }
      evict(g, dst);
    }
    // Naming: a fork of nothing names; else as the source does, when the cut
    // keeps what its keys need (a boundary, or inside the block being filled).
    if (upto == 0) return;
    d.names = from.names && cut_keeps_names(src, upto);
    d.named_blocks = d.names ? std::min(from.named_blocks, upto / B_) : 0;
  }

  // remove(s, p0, p1) that removes something (a truncation goes to rewind):
  // "the blocks whose every position below the length is removed" are released.
  void remove(int s, int p0, int p1) {
    end_step();
    Seq& m = seq(s);
    bool any = false;
    for (int p = p0; p < std::min(p1, m.length()); ++p) {
      any = any || !m.removed[static_cast<std::size_t>(p)];
      m.removed[static_cast<std::size_t>(p)] = true;
    }
    if (!any) return;
    m.names = false;  // "after a remove of its head or middle"
    for (int i = ceil_div(m.length(), B_) - 1; i >= 0; --i)
      if (all_removed(s, i * B_, std::min((i + 1) * B_, m.length())))
        for (Group& g : groups_) release_at(g, s, i);
  }

  void rewind(int s, int n) {
    end_step();
    Seq& m = seq(s);
    const bool keeps = n == 0 || (m.names && cut_keeps_names(s, n));
    release_from(s, ceil_div(n, B_));
    m.tokens.resize(static_cast<std::size_t>(n));
    m.removed.resize(static_cast<std::size_t>(n));
    // The last, partly kept block goes too when every position it keeps is removed.
    if (n % B_ != 0 && all_removed(s, n - n % B_, n))
      for (Group& g : groups_) release_at(g, s, n / B_);
    if (n == 0) return reset(s);
    m.names = keeps;
    m.named_blocks = std::min(m.named_blocks, n / B_);
  }

  // "adopt_prefix hashes the full blocks of tokens[0, len - 1), then takes the
  // longest run, from block 0, that every group can serve": flat groups every
  // block, rings their sinks and what a query at the hit length needs.
  int predict_hit(const std::vector<std::int32_t>& tokens) const {
    int h = tokens.empty() ? 0 : (static_cast<int>(tokens.size()) - 1) / B_;
    for (; h > 0; --h) {
      bool servable = true;
      for (const Group& g : groups_)
        for (int i = 0; i < h && servable; ++i)
          servable = !needed(g, h, i) || find(g, name_of(tokens, i)) >= 0;
      if (servable) break;
    }
    return h * B_;
  }

  int adopt(int s, const std::vector<std::int32_t>& tokens) {
    end_step();
    const int hit = predict_hit(tokens);
    const int h = hit / B_;
    reset(s);
    Seq& m = seq(s);
    m.tokens.assign(tokens.begin(), tokens.begin() + hit);
    m.removed.assign(static_cast<std::size_t>(hit), false);
    m.named_blocks = h;
    for (Group& g : groups_)
      for (int i = 0; i < h; ++i) {
        if (!needed(g, h, i)) continue;
        const int b = find(g, name_of(tokens, i));
        hold(g, b);
        g.table(s)[i] = b;
      }
    return hit;
  }

  // --- steps -----------------------------------------------------------------------

  struct Entry {
    int seq;
    std::vector<std::int32_t> tokens;  // T ids, or -1s when none were given
  };

  /// Would the pools admit the step, once a begun one is given back? "Each
  /// entry needs its new blocks and a private copy of every shared or named
  /// block it writes into."
  bool admits(const std::vector<Entry>& entries) const {
    PrefixModel after = *this;
    after.end_step();
    int need = 0;  // "every group draws from one pool"
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      const Group& grp = after.groups_[g];
      for (const Entry& e : entries) {
        const int L = after.seq(e.seq).length();
        for (int i = L / B_; i < ceil_div(L + static_cast<int>(e.tokens.size()), B_); ++i) {
          const int b = grp.table(e.seq)[i];
          need += b < 0 || after.must_copy(b);
        }
      }
    }
    return need <= after.free_blocks();
  }

  void begin(const std::vector<Entry>& entries) {
    end_step();
    // Entry after entry, each in every group: the order blocks are taken in.
    for (const Entry& e : entries) {
      for (Group& g : groups_) {
        const int L = seq(e.seq).length();
        Step::Write w{e.seq, L / B_, g.table(e.seq)[L / B_]};
        for (int i = L / B_; i < ceil_div(L + static_cast<int>(e.tokens.size()), B_); ++i) {
          int& b = g.table(e.seq)[i];
          if (b < 0) {
            b = allocate(g);
          } else if (must_copy(b)) {
            g.copies.push_back(b);  // held until commit: an abandoned step restores it
            b = allocate(g);
          }
        }
        g.writes.push_back(w);
      }
    }
    step_ = entries;
  }

  void commit() {
    for (Group& g : groups_) {
      for (int b : g.copies) release_block(g, b);
      g.copies.clear();
      g.writes.clear();
    }
    const std::vector<Entry> entries = step_;
    step_.clear();
    for (const Entry& e : entries) {
      Seq& m = seq(e.seq);
      const int L = m.length();
      for (std::int32_t t : e.tokens) {
        m.tokens.push_back(t);
        m.removed.push_back(false);
      }
      // "when a committed step passed the tokens that filled it"
      if (e.tokens[0] < 0) m.names = false;
      for (int i = L / B_; m.names && (i + 1) * B_ <= m.length(); ++i) {
        if (i < m.named_blocks) continue;
        for (Group& g : groups_) name_or_share(g, e.seq, i, name_of(m.tokens, i));
        m.named_blocks = i + 1;
      }
      for (Group& g : groups_) evict(g, e.seq);
    }
  }

  /// A begun step given back: its new blocks and copies return, the tables are
  /// as before. Cached blocks it reclaimed stay reclaimed.
  void end_step() {
    if (step_.empty()) return;
    for (Group& g : groups_) {
      for (const Step::Write& w : g.writes) {
        int& b = g.table(w.seq)[w.first];
        if (b != w.before) release_block(g, b);
        b = w.before;
        for (int i = w.first + 1; i < stride_; ++i) release_at(g, w.seq, i);
      }
      g.writes.clear();
      g.copies.clear();
    }
    step_.clear();
  }

  /// Free blocks of the one pool (cached ones included).
  int free_blocks() const {
    int n = 0;
    for (const Block& b : blocks_) n += b.refs == 0;
    return n;
  }
  int cached_blocks(int g) const {
    int n = 0;
    for (const Block& b : blocks_) n += b.refs == 0 && b.named && b.group == g;
    return n;
  }
  /// The content keys group g's blocks carry (each named block's tokens
  /// chained from the default namespace's root, block by block), as KV
  /// events should have told them: one entry per distinct key.
  std::set<std::pair<std::uint64_t, std::uint64_t>> named_keys(int g) const {
    std::set<std::pair<std::uint64_t, std::uint64_t>> out;
    for (const Block& b : blocks_) {
      if (!b.named || b.group != g) continue;
      kvcore::BlockKey key = kvcore::BlockKey::root(0);
      for (std::size_t i = 0; i + static_cast<std::size_t>(B_) <= b.name.size(); i += static_cast<std::size_t>(B_))
        key = kvcore::BlockKey::chain(key, b.name.data() + i, B_);
      out.emplace(key.lo, key.hi);
    }
    return out;
  }
  /// Every table and block, for a failure's message.
  std::string describe() const {
    std::string out;
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      out += "group " + std::to_string(g) + ":";
      for (std::size_t s = 0; s < seqs_.size(); ++s) {
        out += " [";
        for (int b : groups_[g].tables[s]) out += " " + std::to_string(b);
        out += " ]";
      }
      out += "\n";
    }
    out += "blocks:";
    for (const Block& b : blocks_)
      out += " g" + std::to_string(b.group) + ":" + std::to_string(b.refs) +
             (b.named ? "n" + std::to_string(b.name.size()) : "") + "@" + std::to_string(b.released);
    return out + "\n";
  }
  int blocks_held(int s, int g) const {
    int n = 0;
    for (int b : groups_[static_cast<std::size_t>(g)].table(s)) n += b >= 0;
    return n;
  }

 private:
  struct Block {
    int group = -1;  // the group holding or caching it
    int refs = 0;
    bool named = false;
    std::vector<std::int32_t> name;  // the token ids of this block and every block before it
    long released = 0;               // when it was last freed (cached blocks: the LRU order)
  };
  struct Step {
    struct Write {
      int seq, first, before;  // the step's first block index of `seq` and what it held there
    };
  };
  struct Group {
    int index = 0;
    kvcore::LayerPolicy policy;
    std::vector<std::vector<int>> tables;
    std::vector<int> copies;               // the begun step's copy sources
    std::vector<Step::Write> writes;       // the begun step's entries
    std::vector<int>& table(int s) { return tables[static_cast<std::size_t>(s)]; }
    const std::vector<int>& table(int s) const { return tables[static_cast<std::size_t>(s)]; }
  };
  struct Seq {
    std::vector<std::int32_t> tokens;  // -1: none given
    std::vector<bool> removed;
    bool names = true;     // names the full blocks its steps fill
    int named_blocks = 0;  // blocks whose names it knows (a prefix of its history)
    int length() const { return static_cast<int>(tokens.size()); }
  };

  static int ceil_div(int a, int b) { return (a + b - 1) / b; }
  Seq& seq(int s) { return seqs_[static_cast<std::size_t>(s)]; }
  const Seq& seq(int s) const { return seqs_[static_cast<std::size_t>(s)]; }

  std::vector<std::int32_t> name_of(const std::vector<std::int32_t>& tokens, int i) const {
    return std::vector<std::int32_t>(tokens.begin(), tokens.begin() + (i + 1) * B_);
  }

  void reset(int s) { seq(s) = Seq{}; }

  bool all_removed(int s, int lo, int hi) const {
    for (int p = lo; p < hi; ++p)
      if (!seq(s).removed[static_cast<std::size_t>(p)]) return false;
    return true;
  }

  // "A rewind (or fork) to a block boundary or inside the block being filled
  // keeps naming" (the cache keeps the ids of that block only); at a boundary
  // the name of the block before it must still be held by some group.
  bool cut_keeps_names(int s, int n) const {
    const Seq& m = seq(s);
    if (n >= m.named_blocks * B_) return true;
    if (n % B_ != 0) return false;
    for (const Group& g : groups_) {
      const int b = g.table(s)[n / B_ - 1];
      if (b >= 0 && blocks_[static_cast<std::size_t>(b)].named) return true;
    }
    return false;
  }

  // "A step copies a block it writes into when another sequence holds it, or
  // when it is named (a named block never changes)."
  bool must_copy(int b) const {
    return blocks_[static_cast<std::size_t>(b)].refs > 1 || blocks_[static_cast<std::size_t>(b)].named;
  }

  // Rings: a sequence at length L holds its sink blocks and every block not
  // wholly below L - R - W + 1 ("what a query after a rewind of up to R =
  // max_rewind needs"). Chunked groups (section 9: "a paged group returns
  // blocks of finished chunks"): at length L every block not wholly below
  // K * floor((L - R) / K), the chunk start of the lowest length a rewind of up
  // to R reaches.
  bool needed_at(const Group& g, int L, int i) const {
    if (g.policy.kind == kvcore::LayerPolicy::Kind::Chunked) {
      const std::int64_t K = g.policy.window, low = static_cast<std::int64_t>(L) - R_;
      const std::int64_t floor = low >= 0 ? low / K * K : -((-low + K - 1) / K) * K;
      return static_cast<std::int64_t>(i + 1) * B_ > floor;
    }
    if (g.policy.kind != kvcore::LayerPolicy::Kind::Ring) return true;
    const std::int64_t sink_blocks = (static_cast<std::int64_t>(g.policy.sinks) + B_ - 1) / B_;
    const std::int64_t floor = static_cast<std::int64_t>(L) - R_ - g.policy.window + 1;
    return i < sink_blocks || static_cast<std::int64_t>(i + 1) * B_ > floor;
  }
  // A hit of h blocks needs what a sequence at h * B holds, and its last
  // block always ("a hit names a prefix some sequence computed").
  bool needed(const Group& g, int h, int i) const { return needed_at(g, h * B_, i) || i == h - 1; }
  // "After a commit at length L, a ring group releases a sequence's blocks
  // that lie wholly below L - R - W + 1, except the sink blocks" (tail first).
  void evict(Group& g, int s) {
    const int L = seq(s).length();
    for (int i = ceil_div(L, B_) - 1; i >= 0; --i)
      if (!needed_at(g, L, i)) release_at(g, s, i);
  }

  // "A hit shares the lowest held copy of the content in the group when
  // there is one, else the cached one." (Block ids: allocation takes the
  // lowest free block without a name, so the model's ids are the cache's.)
  int find(const Group& g, const std::vector<std::int32_t>& name) const {
    int cached = -1;
    for (std::size_t b = 0; b < blocks_.size(); ++b) {
      const Block& blk = blocks_[b];
      if (!blk.named || blk.group != g.index || blk.name != name) continue;
      if (blk.refs > 0) return static_cast<int>(b);
      cached = static_cast<int>(b);
    }
    return cached;
  }

  void hold(Group&, int b) { ++blocks_[static_cast<std::size_t>(b)].refs; }

  // "A committed block whose content its group already keeps (held or cached)
  // goes back unnamed when no one else holds it, and its holder shares that
  // copy"; else it is named.
  void name_or_share(Group& g, int s, int i, const std::vector<std::int32_t>& name) {
    int& b = g.table(s)[static_cast<std::size_t>(i)];
    Block& blk = blocks_[static_cast<std::size_t>(b)];
    if (blk.named) return;
    const int copy = blk.refs == 1 ? find(g, name) : -1;
    if (copy < 0) {
      blk.named = true, blk.name = name;
      return;
    }
    hold(g, copy);
    release_block(g, b);
    b = copy;
  }

  // "Allocation takes the lowest free block without a name, else reclaims
  // the least recently released cached one of any group (its name goes)."
  int allocate(Group& g) {
    int pick = -1;
    for (std::size_t b = 0; b < blocks_.size() && pick < 0; ++b)
      if (blocks_[b].refs == 0 && !blocks_[b].named) pick = static_cast<int>(b);
    if (pick < 0)
      for (std::size_t b = 0; b < blocks_.size(); ++b)
        if (blocks_[b].refs == 0 && (pick < 0 || blocks_[b].released < blocks_[static_cast<std::size_t>(pick)].released))
          pick = static_cast<int>(b);
    Block& blk = blocks_[static_cast<std::size_t>(pick)];
    blk = Block{};
    blk.group = g.index;
    blk.refs = 1;
    return pick;
  }

  // One holder fewer. A named block no one holds stays cached, the most
  // recently released; "at most one copy of a content stays cached" in its
  // group: an older cached copy loses its name.
  void release_block(Group&, int b) {
    Block& blk = blocks_[static_cast<std::size_t>(b)];
    if (--blk.refs > 0) return;
    blk.released = ++clock_;
    if (!blk.named) return;
    for (std::size_t o = 0; o < blocks_.size(); ++o) {
      Block& other = blocks_[o];
      if (static_cast<int>(o) != b && other.refs == 0 && other.named && other.group == blk.group &&
          other.name == blk.name) {
        other.named = false;
        other.name.clear();
      }
    }
  }
  void release_at(Group& g, int s, int i) {
    int& b = g.table(s)[static_cast<std::size_t>(i)];
    if (b < 0) return;
    release_block(g, b);
    b = -1;
  }
  // "Tail first across the groups": index after index from the end, each in
  // every group.
  void release_from(int s, int from) {
    for (int i = stride_ - 1; i >= from; --i)
      for (Group& g : groups_) release_at(g, s, i);
  }

  int B_, R_, stride_;
  std::vector<Block> blocks_;  // the one pool every group draws from
  std::vector<Group> groups_;
  std::vector<Seq> seqs_;
  std::vector<Entry> step_;
  long clock_ = 0;
};

}  // namespace kvcore_test
