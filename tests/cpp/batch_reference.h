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
/// pool's free and cached counts and every block table.
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
    v.insert(v.end(), c.block_tables(g), c.block_tables(g) + c.max_seqs() * c.table_stride());
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

  /// DESIGN.md section 2's rule for a policy.
  static bool in_window(const kvcore::LayerPolicy& p, int q, int k) {
    if (k > q) return false;
    if (p.kind != kvcore::LayerPolicy::Kind::Ring) return true;
    return q - k < p.window || k < p.sinks;
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
      const int* table = plan.groups[g].block_tables + static_cast<std::ptrdiff_t>(s) * plan.groups[g].table_stride;
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

}  // namespace kvcore_test
