// libFuzzer harness for the many-sequence cache (BatchCache, DESIGN.md
// section 6): bytes -> a CacheConfig with its BatchLimits and up to a few
// hundred operations. Nothing may crash, trip a sanitizer or disagree with
// the rules:
//
//  - small configs (capacity <= 48, up to 6 sequences, B from 1 to 16, flat
//    and ring groups, small pools so steps run short): every operation is
//    checked against the brute-force model of tests/cpp/batch_reference.h
//    (each sequence simulated alone; tagged pools apply the plans; every
//    query's every key is checked after every step). Steps are committed,
//    abandoned after the backend ran their plan, ran only its copies, or never
//    ran it at all. Every call's outcome is predicted from the rules (the
//    first broken one, in the order the cache checks them), refused calls must
//    change nothing (lengths, tables, blocks held, free and cached blocks, a
//    begun step), and after every call: each pool's free blocks plus the
//    blocks held (tables, and what a begun step copies from) are its blocks,
//    used_blocks is one past the highest held, ring groups stay within their
//    bound at rest.
//  - configs breaking one rule (validate's or BatchLimits'): create refuses
//    them with InvalidArgument.
//  - huge configs (capacity, window, sinks, max_step, B, pools, limits near
//    INT_MAX): create refuses exactly those whose tables would pass 2^31
//    entries or a pool 2^30 blocks (the rule stated here, not read from the
//    code); caches small enough to build (<= 64 MiB) run operations with
//    edgy values, checked by a length-only model.
//  - small configs with State layers (section 9): driven by
//    tests/cpp/batch_state_driver.h, every token's state read checked against
//    a simulated slot store, every can_rewind answer against the contract, the
//    block groups against a twin cache without the State layers.
//
// Fuzz build: tests/fuzz/CMakeLists.txt (clang, -fsanitize=fuzzer,address,undefined).
// The same source compiles into the gtest binary (tests/cpp/batch_fuzz_replay_test.cpp,
// which defines KVCORE_FUZZ_NO_ENTRY_POINT), replaying tests/fuzz/batch_corpus;
// there run_batch_fuzz() returns the failure instead of aborting.
#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fuzz_bytes.h"
#include "fuzz_harness.h"
#include "kvcore/batch/batch_cache.h"
#include "../cpp/batch_reference.h"
#include "../cpp/batch_state_driver.h"

namespace kvcore_batch_fuzz {

using kvcore::BatchCache;
using kvcore::BatchStep;
using kvcore::BatchStepPlan;
using kvcore::CacheConfig;
using kvcore::Error;
using kvcore::LayerConfig;
using kvcore::LayerPolicy;
using kvcore::Status;
using kvcore::StepEntry;
using kvcore_test::BatchModel;
using kvcore_test::PrefixModel;
using kvcore_test::SeqModel;
using kvcore_test::TaggedPools;

/// What the inputs went through, summed (the replay test proves the corpus
/// reaches every interesting path).
struct Coverage {
  long inputs = 0;
  long invalid_configs = 0;
  long small_caches = 0;
  long huge_refused = 0;   // huge configs refused for their table sizes
  long huge_caches = 0;    // huge configs built and driven
  long huge_skipped = 0;   // valid but too big to build here
  long steps_checked = 0;  // steps whose every query's every key was checked
  long steps_committed = 0;
  long steps_abandoned_unrun = 0;  // abandoned before the backend ran the plan (or only its copies)
  long copies_planned = 0;
  long exhausted = 0;  // steps refused for want of blocks
  long prefix_hits = 0;
  long forks = 0;
  long rule_refusals = 0;  // fork, rewind or truncation refused by the rewind rule
  long holes_refused = 0;  // middle removals past max_holes
  long middle_removals = 0;
  long bad_calls = 0;  // refused calls of every other kind
  long clears = 0;
  long state_configs = 0;   // small configs with a State layer, driven (section 9)
  long state_steps = 0;     // their steps whose every token's state read was checked
  long state_tree_commits = 0;
  long state_refusals = 0;  // calls refused by a State group's rules
  long state_huge_skipped = 0;  // huge configs with a State layer: not driven
  long state_block_hits = 0;    // prefix hits on states named every state_block_size > block_size tokens
  long shared_layers = 0;   // shared layers checked to read their source's group
  long chunked_steps = 0;   // steps checked on a cache with a chunked group
  long chunked_hits = 0;    // prefix hits on a cache with a chunked group
  long margin_caches = 0;   // small caches whose rewind margin is not max_step (BatchLimits::max_rewind)
};

/// When set, every input adds to it (the replay test reads it).
inline Coverage*& coverage() { return kvcore_fuzz_input::coverage_slot<Coverage>(); }

namespace detail {

inline void bump(long Coverage::*field) {
  if (coverage() != nullptr) ++(coverage()->*field);
}

using Bytes = kvcore_fuzz_input::Bytes;

// The ints Bytes::edgy() favours: where the arithmetic of sizes and positions breaks.
constexpr int kEdges[kvcore_fuzz_input::Bytes::kEdgeCount] = {
    0,       1,       -1,          2,           INT_MAX,      INT_MAX - 1, INT_MIN, INT_MIN + 1,
    1 << 30, (1 << 30) + 1, (1 << 30) - 1, 1 << 20, (1 << 20) + 1, 1 << 16, 4096, 4097};

inline std::string str(long long v) { return std::to_string(v); }

inline std::string outcome(const Status& s) {
  return s.ok() ? std::string("Ok") : std::string(kvcore::to_string(s.code())) + " (" + s.message().c_str() + ")";
}

inline std::string describe(const CacheConfig& c) {
  std::string s = "capacity " + str(c.capacity) + ", n_layers " + str(c.n_layers) + ", max_step " + str(c.max_step) +
                  ", B " + str(c.batch.block_size) + ", max_seqs " + str(c.batch.max_seqs) + ", max_step_tokens " +
                  str(c.batch.max_step_tokens) + ", num_blocks " + str(c.batch.num_blocks) + ", max_holes " +
                  str(c.batch.max_holes) + ", max_rewind " + str(c.batch.max_rewind) + ", layers [";
  for (const LayerConfig& l : c.layers)
    s += l.policy.kind == LayerPolicy::Kind::Flat      ? std::string(" Flat")
         : l.policy.kind == LayerPolicy::Kind::Chunked ? " Chunked(" + str(l.policy.window) + ")"
         : l.policy.kind == LayerPolicy::Kind::Shared  ? " Shared(" + str(l.policy.source) + ")"
         : l.policy.kind == LayerPolicy::Kind::State   ? " State(" + str(l.policy.slots) + ")"
                                                       : " Ring(" + str(l.policy.window) + "," + str(l.policy.sinks) + ")";
  return s + " ]";
}

// --- the rules, stated here (DESIGN.md section 2, config.h's BatchLimits) ----

// Section 9 adds Chunked (K >= 1, no sinks) and Shared (an earlier layer that
// holds K/V, its shape, never broadcast); a field a kind does not use is 0.
// (State layers are valid configs: batch_state_driver.h drives them.)
inline bool valid_by_rules(const CacheConfig& cfg) {
  using Kind = LayerPolicy::Kind;
  if (cfg.capacity < 1 || cfg.n_layers < 1 || cfg.n_layers > 65536 || cfg.initial_capacity < 1) return false;
  if (cfg.layers.size() != 1 && cfg.layers.size() != static_cast<std::size_t>(cfg.n_layers)) return false;
  if (cfg.max_step < 0 || cfg.max_step > cfg.capacity) return false;
  for (std::size_t i = 0; i < cfg.layers.size(); ++i) {
    const LayerConfig& l = cfg.layers[i];
    const LayerPolicy& p = l.policy;
    if (p.kind == Kind::Flat || p.kind == Kind::Shared || p.kind == Kind::State) {
      if (p.window != 0 || p.sinks != 0) return false;
    } else if (p.kind == Kind::Ring) {
      if (p.window < 1 || p.sinks < 0) return false;
    } else if (p.kind == Kind::Chunked) {
      if (p.window < 1 || p.sinks != 0) return false;
    } else {
      return false;
    }
    if ((p.kind != Kind::Shared && p.source != 0) || (p.kind != Kind::State && p.slots != 0)) return false;
    if (p.kind == Kind::State) {
      if (p.slots < 1 || l.n_kv_heads != 0 || l.head_dim != 0 || l.v_head_dim != 0) return false;
      continue;
    }
    if (p.kind == Kind::Shared) {
      if (cfg.layers.size() == 1 || p.source < 0 || static_cast<std::size_t>(p.source) >= i) return false;
      const LayerConfig& src = cfg.layers[static_cast<std::size_t>(p.source)];
      if (src.policy.kind != Kind::Flat && src.policy.kind != Kind::Ring && src.policy.kind != Kind::Chunked) return false;
      if (l.n_kv_heads != src.n_kv_heads || l.head_dim != src.head_dim ||
          (l.v_head_dim == 0 ? l.head_dim : l.v_head_dim) != (src.v_head_dim == 0 ? src.head_dim : src.v_head_dim))
        return false;
    }
    if (l.n_kv_heads < 1 || l.head_dim < 1 || l.v_head_dim < 0) return false;
  }
  const kvcore::BatchLimits& b = cfg.batch;
  return b.block_size >= 1 && b.max_seqs >= 1 && b.max_seqs <= (1 << 20) && b.max_step_tokens >= 0 &&
         b.num_blocks >= 0 && b.max_holes >= 0 && b.max_holes <= 4096 && b.max_rewind >= -1 &&
         b.max_rewind <= cfg.capacity;
}

inline int design_max_step(const CacheConfig& cfg) {
  return cfg.max_step != 0 ? cfg.max_step : std::min(512, cfg.capacity);
}

// The rewind margin R (config.h's BatchLimits::max_rewind; -1: max_step).
inline int design_max_rewind(const CacheConfig& cfg) {
  return cfg.batch.max_rewind >= 0 ? cfg.batch.max_rewind : design_max_step(cfg);
}

// A rewind margin from fields already drawn (so every corpus input keeps its
// meaning): the default (max_step) in half the configs, else 0 or a small
// margin up to the capacity.
inline int derived_max_rewind(const CacheConfig& cfg) {
  const int v = (cfg.capacity / 4 + cfg.n_layers) % 4;
  return v < 2 ? -1 : v == 2 ? 0 : std::min(cfg.capacity, 1 + cfg.capacity % 7);
}

// Has cfg a State layer (a State group: batch_state_driver.h drives it)?
inline bool has_state_layer(const CacheConfig& cfg) {
  for (const LayerConfig& l : cfg.layers)
    if (l.policy.kind == LayerPolicy::Kind::State) return true;
  return false;
}

// The policy layer l follows: its own, or a Shared layer's source's (section 9).
inline LayerPolicy rule_of(const CacheConfig& cfg, int l) {
  LayerPolicy p = cfg.layer(l).policy;
  while (p.kind == LayerPolicy::Kind::Shared) p = cfg.layer(p.source).policy;
  return p;
}

// The groups' policies, in group order (docs/batch.md section 5, "One
// budget"): the K/V layers of one policy form groups of at most
// batch.page_layers layers (0: the fewest layers any policy has), each group
// opened at its first layer; a Shared layer has none (it reads its source's).
inline std::vector<LayerPolicy> groups_of(const CacheConfig& cfg) {
  std::vector<LayerPolicy> out;
  if (cfg.layers.size() == 1) {  // one config for every layer: one policy
    const LayerPolicy& p = cfg.layers[0].policy;
    if (p.kind == LayerPolicy::Kind::Shared) return out;
    const int size = cfg.batch.page_layers != 0 ? cfg.batch.page_layers : cfg.n_layers;
    const int n = (cfg.n_layers + size - 1) / size;
    for (int g = 0; g < n; ++g) out.push_back(p);
    return out;
  }
  std::vector<LayerPolicy> policies;  // distinct, in order of their first layer
  std::vector<int> count;             // layers of each
  for (int l = 0; l < cfg.n_layers; ++l) {
    const LayerPolicy& p = cfg.layer(l).policy;
    if (p.kind == LayerPolicy::Kind::Shared) continue;
    const std::size_t c = static_cast<std::size_t>(std::find(policies.begin(), policies.end(), p) - policies.begin());
    if (c == policies.size()) {
      policies.push_back(p);
      count.push_back(0);
    }
    ++count[c];
  }
  int size = cfg.batch.page_layers;
  if (size == 0)
    for (int n : count) size = size == 0 || n < size ? n : size;
  std::vector<int> filled(policies.size(), 0);
  std::vector<bool> open(policies.size(), false);
  for (int l = 0; l < cfg.n_layers; ++l) {
    const LayerPolicy& p = cfg.layer(l).policy;
    if (p.kind == LayerPolicy::Kind::Shared) continue;
    const std::size_t c = static_cast<std::size_t>(std::find(policies.begin(), policies.end(), p) - policies.begin());
    if (!open[c] || filled[c] == size) {
      open[c] = true;
      filled[c] = 0;
      out.push_back(p);
    }
    ++filled[c];
  }
  return out;
}

// What create() must do with a config that passes the rules: tables past 2^31
// entries and pools past 2^31 rows or 2^30 blocks are refused; `bytes` is
// about what it allocates (pools included up to the one refused).
struct Sizing {
  bool refused = false;
  bool refused_before_pools = false;
  std::int64_t bytes = 0;
};

inline Sizing sizing(const CacheConfig& cfg) {
  constexpr std::int64_t kMax = 0x7fffffff;
  const std::vector<LayerPolicy> groups = groups_of(cfg);
  const std::int64_t G = static_cast<std::int64_t>(groups.size());
  const std::int64_t B = cfg.batch.block_size, seqs = cfg.batch.max_seqs, C = design_max_step(cfg),
                     R = design_max_rewind(cfg);
  const std::int64_t stride = (cfg.capacity + B - 1) / B;
  const std::int64_t mst = cfg.batch.max_step_tokens != 0 ? cfg.batch.max_step_tokens : std::min(C * seqs, std::int64_t{1} << 20);
  Sizing s;
  s.bytes = 64 * static_cast<std::int64_t>(cfg.n_layers);
  if (G * seqs * stride > kMax || G * mst > kMax || seqs * cfg.batch.max_holes > kMax || seqs * B > kMax) {
    s.refused = s.refused_before_pools = true;
    return s;
  }
  // One pool for every group: num_blocks when set, else the sum of what each
  // group would need alone (create() stops summing past 2^30).
  std::int64_t blocks = cfg.batch.num_blocks;
  if (blocks == 0) {
    for (const LayerPolicy& p : groups) {
      std::int64_t own = seqs * stride;
      if (p.kind == LayerPolicy::Kind::Ring || p.kind == LayerPolicy::Kind::Chunked) {
        // What one sequence can hold during a step: the sink blocks, W + C + R - 1 positions (R: the rewind
        // margin), and one block more (a chunked group as a ring of window K, section 9).
        const std::int64_t per_seq = (p.sinks + B - 1) / B + (p.window + C + R - 1 + B - 1) / B + 1;
        if (per_seq < stride) own = per_seq * seqs;
        own = std::min(own, seqs * stride);
      }
      blocks += own;
      if (blocks > (std::int64_t{1} << 30)) break;
    }
  }
  if (G > 0) {
    if (blocks > kMax / B || blocks > (std::int64_t{1} << 30)) {
      s.refused = true;
      return s;
    }
    std::int64_t slots = 2;
    while (slots < 2 * blocks) slots *= 2;
    s.bytes += blocks * 61 + slots * 4;  // refs, owner, heap, links, key, span, keyed; the key slots
  }
  // The prefix index keeps one prompt's block keys and tokens: stride * 16 and stride * B * 4.
  s.bytes += G * seqs * stride * 4 + 6 * G * seqs * 4 + seqs * 64 + seqs * cfg.batch.max_holes * 8 + seqs * B * 4 +
             stride * 16 + stride * B * 4 + seqs * 48 + mst * 4 + G * mst * 4 + G * seqs * 8;
  return s;
}

constexpr std::int64_t kMaxBuildBytes = std::int64_t{64} << 20;

// --- one run of the harness ----------------------------------------------------

#define FUZZ_REQUIRE(cond, what)                                                    \
  do {                                                                              \
    if (!(cond)) return "op " + str(op_) + " (" + last_op_ + "): " + std::string(what); \
  } while (0)

// Everything a refused call must leave as it was.
struct Snapshot {
  std::vector<int> ints;
  bool operator==(const Snapshot& o) const { return ints == o.ints; }
};

class Harness {
 public:
  explicit Harness(Bytes& in) : in_(in) {}

  std::string run() {
    const std::uint8_t regime = in_.u8() % 16;
    CacheConfig cfg = regime < 14 ? small_config() : huge_config();
    if (regime >= 11 && regime < 14) break_a_rule(&cfg);
    last_op_ = "create(" + describe(cfg) + ")";
    if (!valid_by_rules(cfg)) {
      auto created = BatchCache::create(cfg);
      FUZZ_REQUIRE(!created.ok() && created.error() == Error::InvalidArgument && !created.message().empty(),
                   "a config breaking a rule: " + (created.ok() ? std::string("Ok") : outcome(created.status())));
      FUZZ_REQUIRE(kvcore::validate_batch(cfg).code() == Error::InvalidArgument, "validate_batch accepted it");
      bump(&Coverage::invalid_configs);
      return "";
    }
    if (has_state_layer(cfg)) {  // section 9: State groups, against the state model and a twin
      FUZZ_REQUIRE(kvcore::validate_batch(cfg).ok(), "validate_batch refused a valid config");
      if (regime >= 14) {
        bump(&Coverage::state_huge_skipped);
        return "";
      }
      struct Draw {
        Bytes& in;
        int operator()(int lo, int hi) { return in.in(lo, hi); }
        bool percent(int p) { return in.percent(p); }
      } draw{in_};
      // Named state snapshots (prefix reuse) in three of four configs, from a
      // field already drawn (so every input keeps its meaning). The default
      // rewind margin: the state driver's rule is the one of R = max_step.
      cfg.batch.state_snapshots = cfg.capacity % 4;
      // A State block of one to three K/V blocks in a third of them, likewise.
      const int every = cfg.batch.block_size * (1 + cfg.max_step % 3);
      if (cfg.capacity % 3 == 1 && every <= cfg.capacity) cfg.batch.state_block_size = every;
      cfg.batch.max_rewind = -1;
      kvcore_test::state_ref::Counts counts;
      kvcore_test::state_ref::Driver<Draw> driver(cfg, draw, counts);
      const std::string err = driver.run(400, [this] { return !in_.done(); });
      FUZZ_REQUIRE(err.empty(), "State layers: " + err);
      bump(&Coverage::state_configs);
      if (coverage() != nullptr) {
        coverage()->state_steps += counts.steps;
        coverage()->state_tree_commits += counts.tree_commits;
        coverage()->state_refusals += counts.refusals;
        if (cfg.batch.state_block_size > cfg.batch.block_size) coverage()->state_block_hits += counts.hits;
      }
      return "";
    }
    FUZZ_REQUIRE(kvcore::validate_batch(cfg).ok(), "validate_batch refused a valid config");
    const Sizing size = sizing(cfg);
    if (size.bytes > kMaxBuildBytes && !size.refused_before_pools) {
      bump(&Coverage::huge_skipped);  // valid, but more memory than a fuzzing process has
      return "";
    }
    auto created = BatchCache::create(cfg);
    if (size.refused) {
      FUZZ_REQUIRE(!created.ok() && created.error() == Error::InvalidArgument && !created.message().empty(),
                   "tables past 2^31 entries accepted: " + (created.ok() ? std::string("Ok") : outcome(created.status())));
      bump(&Coverage::huge_refused);
      return "";
    }
    FUZZ_REQUIRE(created.ok(), "a valid config refused: " + outcome(created.status()));
    cfg_ = cfg;
    cache_ = std::move(created).get();
    C_ = cache_->max_step();
    FUZZ_REQUIRE(C_ == design_max_step(cfg), "max_step " + str(C_));
    R_ = cache_->max_rewind();
    FUZZ_REQUIRE(R_ == design_max_rewind(cfg), "max_rewind " + str(R_));
    FUZZ_REQUIRE(cache_->n_groups() == static_cast<int>(groups_of(cfg).size()), "n_groups");
    for (int l = 0; l < cfg.n_layers; ++l) {
      auto g = cache_->group_of(l);
      FUZZ_REQUIRE(g.ok() && *cache_->group_policy(*g) == rule_of(cfg, l), "group_of(" + str(l) + ")");
      if (cfg.layer(l).policy.kind == LayerPolicy::Kind::Shared) {  // its source's group (section 9)
        FUZZ_REQUIRE(*g == *cache_->group_of(cfg.layer(l).policy.source), "shared layer " + str(l) + "'s group");
        bump(&Coverage::shared_layers);
      }
      if (cfg.layers.size() == 1 && l > 4) break;
    }
    if (regime >= 14) {
      bump(&Coverage::huge_caches);
      return run_huge();
    }
    bump(&Coverage::small_caches);
    if (R_ != C_) bump(&Coverage::margin_caches);
    model_.reset(new BatchModel(cfg));
    pools_.reset(new TaggedPools(*cache_));
    prefix_.reset(new PrefixModel(*cache_));
    return run_small();
  }

 private:
  // --- configs -----------------------------------------------------------------

  CacheConfig small_config() {
    CacheConfig cfg;
    cfg.capacity = in_.in(1, 48);
    cfg.max_step = in_.percent(20) ? 0 : in_.in(1, std::min(6, cfg.capacity));
    std::vector<LayerPolicy> policies;
    for (int i = in_.in(1, 3); i > 0; --i) {
      // The policy byte: % 3 == 0 flat, else a ring; 253 and 254 (section 9,
      // appended: older inputs read them as rings) chunked, 255 (flat) state.
      const std::uint8_t kind = in_.u8();
      if (kind >= 253) {
        policies.push_back(kind == 255 ? LayerPolicy::state(in_.in(1, 4)) : LayerPolicy::chunked(in_.in(1, 10)));
      } else if (kind % 3 == 0) {
        policies.push_back(LayerPolicy::flat());
      } else {
        const int window = in_.in(1, 10);
        const int sinks = in_.percent(70) ? 0 : in_.percent(90) ? in_.in(1, 4) : INT_MAX - in_.in(0, 3);
        policies.push_back(LayerPolicy::ring(window, sinks));
      }
    }
    cfg.n_layers = in_.in(1, 4);
    auto layer_of = [](const LayerPolicy& p) {  // a State layer holds no K/V rows: shape 0
      return p.kind == LayerPolicy::Kind::State ? LayerConfig{p, 0, 0, 0} : LayerConfig{p, 1, 2, 0};
    };
    if (in_.percent(20)) {
      cfg.layers.push_back(layer_of(policies[0]));
    } else {
      for (int l = 0; l < cfg.n_layers; ++l) {
        // The pick byte: % policies; from 253 on (appended) a layer past the
        // first shares an earlier one that holds K/V (section 9).
        const std::uint8_t pick = in_.u8();
        // (Only a pick from 253 on names a source: below it, pick - 253 is negative.)
        int src = pick >= 253 && l > 0 ? l - 1 - (pick - 253) % l : -1;
        while (src >= 0 && !cfg.layers[static_cast<std::size_t>(src)].policy.holds_keys()) --src;
        if (pick >= 253 && src >= 0) {
          cfg.layers.push_back(LayerConfig{LayerPolicy::shared(src), 1, 2, 0});
          continue;
        }
        cfg.layers.push_back(layer_of(policies[static_cast<std::size_t>(pick % policies.size())]));
      }
    }
    static const int kB[] = {1, 1, 2, 3, 4, 5, 8, 16};
    cfg.batch.block_size = kB[in_.u8() % 8];
    cfg.batch.max_seqs = in_.in(1, 6);
    cfg.batch.max_step_tokens = in_.percent(50) ? 0 : in_.in(1, 16);
    const int stride = (cfg.capacity + cfg.batch.block_size - 1) / cfg.batch.block_size;
    cfg.batch.num_blocks = in_.percent(35) ? in_.in(1, 3 * stride + 2) : 0;  // small pools run short
    cfg.batch.max_holes = in_.in(0, 4);
    cfg.batch.max_rewind = derived_max_rewind(cfg);
    // Paged block tables for a third of the configs, from what was read (no
    // byte of the input is spent on it); every row may fill its pages.
    cfg.batch.table_page_blocks = cfg.capacity % 3 == 0 ? 1 << (cfg.max_step % 4) : 0;
    return cfg;
  }

  // One field (or one layer's) breaks its rule.
  void break_a_rule(CacheConfig* cfg) {
    LayerConfig& layer = cfg->layers[static_cast<std::size_t>(in_.in(0, static_cast<int>(cfg->layers.size()) - 1))];
    auto nonpositive = [&] { return in_.percent(50) ? -in_.in(0, 3) : INT_MIN + in_.in(0, 1); };
    switch (in_.in(0, 15)) {
      case 0: cfg->capacity = nonpositive(); break;
      case 1: cfg->n_layers = in_.percent(50) ? nonpositive() : 65537 + in_.in(0, 3); break;
      case 2: cfg->layers.push_back(cfg->layers[0]), cfg->layers.push_back(cfg->layers[0]), cfg->n_layers = 1; break;
      case 3: cfg->max_step = in_.percent(50) ? -in_.in(1, 3) : cfg->capacity + in_.in(1, 3); break;
      case 4: cfg->initial_capacity = nonpositive(); break;
      case 5: layer.policy = LayerPolicy{LayerPolicy::Kind::Flat, in_.in(0, 1), 1 - in_.in(0, 1) * 2, 0, 0}; break;
      case 6: layer.policy = LayerPolicy::ring(nonpositive(), 0); break;
      case 7: layer.policy = LayerPolicy::ring(3, -in_.in(1, 2)); break;
      case 8: layer.policy.kind = static_cast<LayerPolicy::Kind>(in_.in(2, 9)); break;
      case 9: layer.n_kv_heads = nonpositive(); break;
      case 10: layer.head_dim = nonpositive(); break;
      case 11: layer.v_head_dim = -in_.in(1, 3); break;
      case 12: cfg->batch.block_size = nonpositive(); break;
      case 13: cfg->batch.max_seqs = in_.percent(50) ? nonpositive() : (1 << 20) + in_.in(1, 3); break;
      case 14:
        if (in_.percent(50)) cfg->batch.max_step_tokens = -in_.in(1, 3);
        else if (cfg->capacity % 2 != 0) cfg->batch.max_rewind = cfg->capacity > 1 ? cfg->capacity + 1 : -2;
        else cfg->batch.num_blocks = -in_.in(1, 3);
        break;
      default: cfg->batch.max_holes = in_.percent(50) ? -in_.in(1, 3) : 4097 + in_.in(0, 3); break;
    }
  }

  CacheConfig huge_config() {
    CacheConfig cfg;
    auto big = [&](int small_hi) { return in_.percent(50) ? in_.in(1, small_hi) : std::max(1, in_.edgy()); };
    cfg.capacity = big(1 << 16);
    cfg.max_step = in_.percent(30) ? 0 : std::min(cfg.capacity, big(64));
    cfg.n_layers = in_.in(1, 3);
    for (int l = 0; l < cfg.n_layers; ++l) {
      if (in_.percent(30)) {
        cfg.layers.push_back(LayerConfig{LayerPolicy::flat(), 1, 2, 0});
      } else {
        const int window = big(1 << 12);
        const int sinks = in_.percent(50) ? 0 : std::max(0, in_.edgy());
        cfg.layers.push_back(LayerConfig{LayerPolicy::ring(window, sinks), 1, 2, 0});
      }
    }
    cfg.batch.block_size = in_.percent(50) ? 1 << in_.in(0, 20) : big(1 << 12);
    cfg.batch.max_seqs = in_.percent(70) ? in_.in(1, 8) : in_.in(1, 1 << 20);
    cfg.batch.max_step_tokens = in_.percent(50) ? 0 : std::max(0, in_.edgy());
    cfg.batch.num_blocks = in_.percent(50) ? 0 : std::max(0, in_.edgy());
    cfg.batch.max_holes = in_.percent(70) ? in_.in(0, 8) : in_.in(0, 4096);
    cfg.batch.max_rewind = derived_max_rewind(cfg);
    return cfg;
  }

  // --- state checks ----------------------------------------------------------------

  bool has_chunked_group() const {
    for (int g = 0; g < cache_->n_groups(); ++g)
      if (cache_->group_policy(g)->kind == LayerPolicy::Kind::Chunked) return true;
    return false;
  }

  Snapshot snapshot() const {
    Snapshot s;
    std::vector<int>& v = s.ints;
    for (int q = 0; q < cache_->max_seqs(); ++q) {
      const kvcore::SequenceInfo info = *cache_->sequence(q);
      v.insert(v.end(), {info.active ? 1 : 0, info.length, info.visible_start, info.n_holes});
      for (int h = 0; h < info.n_holes; ++h) v.insert(v.end(), {info.holes[h].begin, info.holes[h].end});
      for (int g = 0; g < cache_->n_groups(); ++g) {
        v.push_back(*cache_->blocks_held(q, g));
        if (tables_checked_) v.push_back(*cache_->oldest_held(q, g));  // linear in the table's length
      }
    }
    for (int g = 0; g < cache_->n_groups(); ++g) {
      v.insert(v.end(), {*cache_->free_blocks(g), *cache_->cached_blocks(g), *cache_->used_blocks(g)});
      if (tables_checked_)  // each active sequence's row, either table layout
        for (int q = 0; q < cache_->max_seqs(); ++q)
          if (cache_->sequence(q)->active)
            for (int i = 0; i < cache_->table_stride(); ++i) v.push_back(cache_->block_at(q, g, i));
    }
    v.push_back(static_cast<int>(step_open_ ? open_step_.id : 0));
    return s;
  }

  // A refused call: the code it must have, a message, and nothing changed
  // (a begun step still begun).
  std::string refused(const Status& st, Error code, const Snapshot& before, long Coverage::*what = &Coverage::bad_calls) {
    FUZZ_REQUIRE(st.code() == code, "expected " + std::string(kvcore::to_string(code)) + ", got " + outcome(st));
    FUZZ_REQUIRE(!st.message().empty(), "a refusal without a message");
    FUZZ_REQUIRE(snapshot() == before, "a refused call changed the cache: " + outcome(st));
    if (step_open_) FUZZ_REQUIRE(cache_->check_step(open_step_).ok(), "a refused call ended the begun step");
    bump(what);
    return "";
  }

  // A successful verb ends a begun step.
  std::string verb_done() {
    if (step_open_) FUZZ_REQUIRE(cache_->check_step(open_step_).code() == Error::InvalidState, "a verb left the step begun");
    step_open_ = false;
    return "";
  }

  int any_seq() {
    const std::uint8_t how = in_.u8();
    if (how < 230) return in_.in(0, cfg_.batch.max_seqs - 1);
    if (how < 240) return how % 2 ? -1 : cfg_.batch.max_seqs;
    return in_.edgy();
  }
  bool in_range(int s) const { return s >= 0 && s < cfg_.batch.max_seqs; }
  bool active(int s) const { return in_range(s) && model_->seq(s).active; }

  // Range first, then activity: the cache's check_active.
  bool seq_refusal(int s, Error* code) const {
    if (!in_range(s)) return *code = Error::InvalidArgument, true;
    if (!model_->seq(s).active) return *code = Error::InvalidState, true;
    return false;
  }

  // Must a rewind (or fork) of `s` to n succeed? The model's rule.
  bool must_allow(int s, int n) const { return model_->must_allow(cfg_, R_, s, n); }
  static int holes(const SeqModel& m) { return BatchModel::holes(m); }

  std::string invariants() {
    for (int s = 0; s < cfg_.batch.max_seqs; ++s) {
      const SeqModel& m = model_->seq(s);
      const kvcore::SequenceInfo info = *cache_->sequence(s);
      FUZZ_REQUIRE(info.active == m.active, "seq " + str(s) + " active");
      if (!m.active) {
        for (int g = 0; g < cache_->n_groups(); ++g) FUZZ_REQUIRE(*cache_->blocks_held(s, g) == 0, "an inactive sequence holds blocks");
        continue;
      }
      FUZZ_REQUIRE(info.length == m.length(), "seq " + str(s) + " length " + str(info.length) + ", model " + str(m.length()));
      int visible = 0;
      for (std::uint64_t t : m.tags) visible += t != 0;
      FUZZ_REQUIRE(info.visible_positions() == visible, "seq " + str(s) + " visible positions");
      if (step_open_) continue;
      for (int g = 0; g < cache_->n_groups(); ++g) {  // DESIGN.md section 6's bound, at rest
        const LayerPolicy p = *cache_->group_policy(g);
        if (p.kind != LayerPolicy::Kind::Ring && p.kind != LayerPolicy::Kind::Chunked) continue;  // chunked: a ring of K
        const std::int64_t B = cfg_.batch.block_size;
        const std::int64_t bound = (p.sinks + B - 1) / B + (p.window + R_ - 1 + B - 1) / B + 1;
        FUZZ_REQUIRE(*cache_->blocks_held(s, g) <= bound, "seq " + str(s) + " holds more than the ring bound in group " + str(g));
      }
    }
    if (step_open_) FUZZ_REQUIRE(cache_->check_step(open_step_).ok(), "the begun step was lost");
    if (tables_checked_) FUZZ_REQUIRE(cache_->check_tables().ok(), cache_->check_tables().message().c_str());
    // Blocks of the one pool every group draws from: free + held (in any
    // group's table, or copied from by the begun step) = all, and
    // used_blocks is one past the highest held.
    auto plan = step_open_ ? cache_->plan(open_step_) : kvcore::Result<BatchStepPlan>(Error::InvalidState);
    if (cache_->n_groups() > 0) {
      const int n_blocks = *cache_->num_blocks(0);
      held_.assign(static_cast<std::size_t>(n_blocks), 0);
      int used = 0, distinct = 0;
      auto mark = [&](int b) {
        if (b < 0) return;
        used = std::max(used, b + 1);
        distinct += held_[static_cast<std::size_t>(b)] == 0;
        held_[static_cast<std::size_t>(b)] = 1;
      };
      for (int g = 0; g < cache_->n_groups(); ++g) {
        for (int q = 0; q < cache_->max_seqs(); ++q)
          if (cache_->sequence(q)->active)
            for (int i = 0; i < cache_->table_stride(); ++i) mark(cache_->block_at(q, g, i));
        if (plan.ok())
          for (int c = 0; c < plan->groups[g].n_copies; ++c) mark(plan->groups[g].copies[c].src);
      }
      FUZZ_REQUIRE(*cache_->free_blocks(0) + distinct == n_blocks,
                   str(*cache_->free_blocks(0)) + " free + " + str(distinct) + " held != " + str(n_blocks));
      FUZZ_REQUIRE(*cache_->used_blocks(0) == used, "used_blocks");
    }
    for (int g = 0; g < cache_->n_groups(); ++g) {
      FUZZ_REQUIRE(*cache_->num_blocks(g) == *cache_->num_blocks(0) && *cache_->free_blocks(g) == *cache_->free_blocks(0) &&
                       *cache_->used_blocks(g) == *cache_->used_blocks(0),
                   "group " + str(g) + ": not the one pool's counts");
      FUZZ_REQUIRE(*cache_->cached_blocks(g) <= *cache_->free_blocks(g), "cached blocks that are not free");
      // The pools as the docs state them (batch_reference.h's PrefixModel).
      FUZZ_REQUIRE(*cache_->free_blocks(g) == prefix_->free_blocks() && *cache_->cached_blocks(g) == prefix_->cached_blocks(g),
                   "group " + str(g) + ": free " + str(*cache_->free_blocks(g)) + ", cached " + str(*cache_->cached_blocks(g)) +
                       "; the model's " + str(prefix_->free_blocks()) + ", " + str(prefix_->cached_blocks(g)));
      for (int s = 0; s < cfg_.batch.max_seqs; ++s)
        FUZZ_REQUIRE(*cache_->blocks_held(s, g) == prefix_->blocks_held(s, g),
                     "seq " + str(s) + " group " + str(g) + " holds " + str(*cache_->blocks_held(s, g)) + ", the model " +
                         str(prefix_->blocks_held(s, g)));
    }
    return "";
  }

  // --- the small regime: every call against the model --------------------------------

  std::string run_small() {
    tables_checked_ = true;
    const int ops = in_.in(1, 300);
    for (op_ = 0; op_ < ops && !in_.done(); ++op_) {
      const int what = in_.u8() % 100;
      std::string err;
      if (what < 9) err = add();
      else if (what < 12) err = release();
      else if (what < 50) err = step();
      else if (what < 58) err = fork();
      else if (what < 67) err = remove();
      else if (what < 77) err = rewind();
      else if (what < 87) err = adopt();
      else if (what < 89) err = clear();
      else err = abuse();
      if (!err.empty()) return err;
      err = invariants();
      if (!err.empty()) return err;
    }
    return "";
  }

  std::string add() {
    const int s = any_seq();
    last_op_ = "add_sequence(" + str(s) + ")";
    const Snapshot before = snapshot();
    const Status st = cache_->add_sequence(s);
    if (!in_range(s)) return refused(st, Error::InvalidArgument, before);
    if (model_->seq(s).active) return refused(st, Error::InvalidState, before);
    FUZZ_REQUIRE(st.ok(), outcome(st));
    model_->add(s);
    prefix_->add(s);
    return verb_done();
  }

  std::string release() {
    const int s = any_seq();
    last_op_ = "release_sequence(" + str(s) + ")";
    const Snapshot before = snapshot();
    const Status st = cache_->release_sequence(s);
    Error code;
    if (seq_refusal(s, &code)) return refused(st, code, before);
    FUZZ_REQUIRE(st.ok(), outcome(st));
    model_->release(s);
    prefix_->release(s);
    return verb_done();
  }

  std::string step() {
    std::vector<int> seqs;
    for (int s = 0; s < cfg_.batch.max_seqs; ++s)
      if (model_->seq(s).active) seqs.push_back(s);
    // Entries: distinct active sequences in an order the input picks.
    std::vector<int> chosen;
    const int k = seqs.empty() ? 0 : in_.in(1, static_cast<int>(seqs.size()));
    for (int i = 0; i < k; ++i) {
      const int at = in_.in(0, static_cast<int>(seqs.size()) - 1);
      chosen.push_back(seqs[static_cast<std::size_t>(at)]);
      seqs.erase(seqs.begin() + at);
    }
    std::vector<StepEntry> entries;
    std::vector<std::vector<std::int32_t>> tokens(chosen.size() + 1);
    for (std::size_t i = 0; i < chosen.size(); ++i) {
      const int T = in_.in(1, C_);
      const bool given = in_.u8() % 10 != 0;
      for (int j = 0; j < T; ++j) tokens[i].push_back(in_.in(0, 2));  // a tiny vocabulary: prefixes repeat
      entries.push_back(StepEntry{chosen[i], T, given ? tokens[i].data() : nullptr});
    }
    // Now and then a bad entry list.
    int n = static_cast<int>(entries.size());
    const StepEntry* data = entries.data();
    const std::uint8_t abuse = in_.u8();
    if (abuse < 6 && !entries.empty()) {
      entries.push_back(entries[static_cast<std::size_t>(in_.in(0, n - 1))]);  // a repeat
      ++n;
      data = entries.data();
    } else if (abuse < 10) {
      entries.push_back(StepEntry{any_seq(), in_.in(1, C_), nullptr});  // any sequence
      ++n;
      data = entries.data();
    } else if (abuse < 14 && !entries.empty()) {
      const int bad_T = in_.percent(50) ? in_.in(-2, 0) : C_ + in_.in(1, 2);  // read before the index, as C++17 orders `a[i] = v`
      entries[static_cast<std::size_t>(in_.in(0, n - 1))].T = bad_T;
    } else if (abuse < 16) {
      n = in_.percent(50) ? in_.in(-1, 0) : cfg_.batch.max_seqs + in_.in(1, 2);
    } else if (abuse < 17) {
      data = nullptr;
      n = std::max(n, 1);
    }
    // The first broken rule, in the order the cache checks them.
    Error expected = Error::Ok;
    if (n < 1 || n > cfg_.batch.max_seqs || data == nullptr) {
      expected = Error::InvalidArgument;
    } else {
      std::int64_t total = 0;
      std::vector<int> seen;
      for (int i = 0; i < n && expected == Error::Ok; ++i) {
        const StepEntry& e = data[i];
        if (seq_refusal(e.seq, &expected)) break;
        if (std::find(seen.begin(), seen.end(), e.seq) != seen.end()) expected = Error::InvalidArgument;
        else if (e.T < 1 || e.T > C_) expected = Error::InvalidArgument;
        else if (model_->seq(e.seq).length() + e.T > cfg_.capacity) expected = Error::OutOfResources;
        else if ((total += e.T) > cache_->max_step_tokens()) expected = Error::InvalidArgument;
        seen.push_back(e.seq);
      }
    }
    last_op_ = "begin_step(";
    for (int i = 0; data != nullptr && i < n && i < static_cast<int>(entries.size()); ++i)
      last_op_ += " " + str(data[i].seq) + ":" + str(data[i].T);
    last_op_ += " )";
    std::vector<PrefixModel::Entry> model_entries;
    for (int i = 0; expected == Error::Ok && i < n; ++i) {
      PrefixModel::Entry e{data[i].seq, std::vector<std::int32_t>(static_cast<std::size_t>(data[i].T), -1)};
      if (data[i].tokens != nullptr) e.tokens.assign(data[i].tokens, data[i].tokens + data[i].T);
      model_entries.push_back(e);
    }
    const bool fits = expected == Error::Ok && prefix_->admits(model_entries);
    const Snapshot before = snapshot();
    auto begun = cache_->begin_step(data, n);
    if (expected != Error::Ok) return refused(begun.status(), expected, before);
    FUZZ_REQUIRE(begun.ok() == fits, fits ? "refused a step the pools hold: " + outcome(begun.status())
                                          : std::string("admitted a step the pools cannot hold"));
    if (!begun.ok()) return refused(begun.status(), Error::OutOfResources, before, &Coverage::exhausted);
    prefix_->begin(model_entries);
    step_open_ = false;  // a replaced step is gone (the model forgot it when it was left)
    // The model writes the step (undone below when it is not committed).
    std::vector<std::uint64_t> token_tags;
    int total = 0;
    for (const StepEntry& e : entries) {
      model_->write(e.seq, e.tokens, e.T, &token_tags);
      total += e.T;
    }
    auto plan = cache_->plan(*begun);
    FUZZ_REQUIRE(plan.ok(), "plan of the begun step: " + outcome(plan.status()));
    FUZZ_REQUIRE(plan->n_tokens == total && plan->n_entries == n, "the plan's tokens or entries");
    for (int g = 0; g < plan->n_groups; ++g) {
      if (coverage() != nullptr) coverage()->copies_planned += plan->groups[g].n_copies;
    }
    // The backend runs the plan (usually), only its copies, or nothing.
    const std::uint8_t how = in_.u8() % 10;
    if (how >= 2) {
      pools_->apply(*plan, token_tags);
      const std::string diff = kvcore_test::check_step(*cache_, *model_, *plan, *pools_);
      FUZZ_REQUIRE(diff.empty(), diff + " in " + describe(cfg_));
      bump(&Coverage::steps_checked);
      if (has_chunked_group()) bump(&Coverage::chunked_steps);
    } else if (how == 1) {
      for (int g = 0; g < plan->n_groups; ++g) {
        std::vector<std::uint64_t>& rows = pools_->rows[static_cast<std::size_t>(g)];
        const std::size_t B = static_cast<std::size_t>(plan->block_size);
        for (int c = 0; c < plan->groups[g].n_copies; ++c)
          std::copy_n(rows.begin() + static_cast<long>(plan->groups[g].copies[c].src * B), B,
                      rows.begin() + static_cast<long>(plan->groups[g].copies[c].dst * B));
      }
    }
    if (how >= 2 && in_.percent(80)) {
      FUZZ_REQUIRE(cache_->commit(*begun).ok(), "commit of the begun step");
      prefix_->commit();
      for (const StepEntry& e : entries) model_->commit(e.seq, e.tokens != nullptr);
      FUZZ_REQUIRE(cache_->commit(*begun).code() == Error::InvalidState, "a second commit");
      bump(&Coverage::steps_committed);
      return "";
    }
    // Left begun: the model forgets it (a retry, a verb or clear ends it).
    for (const StepEntry& e : entries) model_->abandon(e.seq, e.T);
    if (how < 2) bump(&Coverage::steps_abandoned_unrun);
    step_open_ = true;
    open_step_ = *begun;
    return "";
  }

  std::string fork() {
    const int src = any_seq(), dst = any_seq();
    const int L = active(src) ? model_->seq(src).length() : 0;
    const int upto = in_.percent(90) ? in_.in(-1, L + 1) : in_.edgy();
    last_op_ = "fork(" + str(src) + ", " + str(dst) + ", " + str(upto) + ")";
    const Snapshot before = snapshot();
    const bool can = cache_->can_rewind(src, upto);
    const Status st = cache_->fork(src, dst, upto);
    Error code;
    if (seq_refusal(src, &code)) return refused(st, code, before);
    if (!in_range(dst) || src == dst || upto < 0 || upto > L) return refused(st, Error::InvalidArgument, before);
    const SeqModel& d = model_->seq(dst);
    // Empty means no committed position: blocks a begun step gave dst go back
    // when the fork ends that step.
    if (d.active && d.length() != 0) return refused(st, Error::InvalidState, before);
    if (must_allow(src, upto)) FUZZ_REQUIRE(can, "can_rewind refuses a fork the rule allows");
    if (!can) return refused(st, Error::InvalidState, before, &Coverage::rule_refusals);
    FUZZ_REQUIRE(st.ok(), outcome(st));
    model_->fork(src, dst, upto);
    prefix_->fork(src, dst, upto);
    bump(&Coverage::forks);
    return verb_done();
  }

  std::string remove() {
    const int s = any_seq();
    const int L = active(s) ? model_->seq(s).length() : 0;
    int p0 = in_.in(-1, L + 1), p1 = in_.in(std::max(p0, 0) - 1, L + 3);
    if (in_.percent(25)) p0 = 0;  // heads are common
    if (in_.percent(3)) p0 = in_.edgy();
    if (in_.percent(3)) p1 = in_.edgy();
    last_op_ = "remove(" + str(s) + ", " + str(p0) + ", " + str(p1) + ")";
    const Snapshot before = snapshot();
    const bool can_truncate = cache_->can_rewind(s, p0);
    const Status st = cache_->remove(s, p0, p1);
    Error code;
    if (seq_refusal(s, &code)) return refused(st, code, before);
    if (p0 < 0 || p1 < p0) return refused(st, Error::InvalidArgument, before);
    SeqModel& m = model_->seq(s);
    if (p1 >= L && p0 < L) {  // a truncation: the rewind rule
      if (must_allow(s, p0)) FUZZ_REQUIRE(can_truncate, "can_rewind refuses a truncation the rule allows");
      if (!can_truncate && p0 != 0) return refused(st, Error::InvalidState, before, &Coverage::rule_refusals);
      FUZZ_REQUIRE(st.ok(), outcome(st));
      model_->truncate(s, p0);
      prefix_->rewind(s, p0);
      return verb_done();
    }
    const SeqModel after = model_->removed(s, p0, p1);
    if (holes(after) > cfg_.batch.max_holes) return refused(st, Error::OutOfResources, before, &Coverage::holes_refused);
    FUZZ_REQUIRE(st.ok(), outcome(st));
    if (p0 > 0 && p0 < std::min(p1, L)) bump(&Coverage::middle_removals);
    m = after;
    prefix_->remove(s, p0, p1);
    return verb_done();
  }

  std::string rewind() {
    const int s = any_seq();
    const int L = active(s) ? model_->seq(s).length() : 0;
    const int n = in_.percent(25) ? (in_.percent(90) ? in_.in(-1, L + 1) : in_.edgy()) : L - in_.in(0, C_ + 2);
    last_op_ = "rewind(" + str(s) + ", " + str(n) + ")";
    const Snapshot before = snapshot();
    const bool can = cache_->can_rewind(s, n);
    const Status st = cache_->rewind(s, n);
    Error code;
    if (seq_refusal(s, &code)) {
      FUZZ_REQUIRE(!can, "can_rewind of a sequence that cannot rewind");
      return refused(st, code, before);
    }
    if (n < 0 || n > L) {
      FUZZ_REQUIRE(!can, "can_rewind out of range");
      return refused(st, Error::InvalidArgument, before);
    }
    if (must_allow(s, n)) FUZZ_REQUIRE(can, "can_rewind refuses a rewind the rule allows");
    if (!can) return refused(st, Error::InvalidState, before, &Coverage::rule_refusals);
    FUZZ_REQUIRE(st.ok(), outcome(st));
    model_->truncate(s, n);
    prefix_->rewind(s, n);
    return verb_done();
  }

  // A new (or emptied) sequence adopts a prompt built from another's tokens.
  std::string adopt() {
    const int s = any_seq();
    if (in_range(s) && in_.percent(70) && (!model_->seq(s).active || model_->seq(s).length() != 0)) {
      last_op_ = "make " + str(s) + " fresh";
      if (model_->seq(s).active) FUZZ_REQUIRE(cache_->release_sequence(s).ok(), "release");
      FUZZ_REQUIRE(cache_->add_sequence(s).ok(), "add");
      model_->add(s);
      prefix_->release(s);
      const std::string err = verb_done();
      if (!err.empty()) return err;
    }
    std::vector<std::int32_t> prompt;
    std::vector<int> seqs;
    for (int q = 0; q < cfg_.batch.max_seqs; ++q)
      if (model_->seq(q).active) seqs.push_back(q);
    if (!seqs.empty()) {
      const SeqModel& from = model_->seq(seqs[static_cast<std::size_t>(in_.in(0, static_cast<int>(seqs.size()) - 1))]);
      for (std::int32_t t : from.tokens) prompt.push_back(t < 0 ? 0 : t);
      prompt.resize(static_cast<std::size_t>(in_.in(0, static_cast<int>(prompt.size()))));
    }
    for (int extra = in_.in(0, 4); extra > 0; --extra) prompt.push_back(in_.in(0, 2));
    if (static_cast<int>(prompt.size()) > cfg_.capacity) prompt.resize(static_cast<std::size_t>(cfg_.capacity));
    int n = static_cast<int>(prompt.size());
    const std::int32_t* tokens = prompt.data();
    const std::uint8_t abuse = in_.u8();
    if (abuse < 5) n = in_.percent(50) ? -in_.in(1, 2) : cfg_.capacity + in_.in(1, 2);
    else if (abuse < 8) tokens = nullptr, n = std::max(n, 1);
    if (prompt.empty() && tokens != nullptr) tokens = nullptr;  // n = 0: tokens may be null
    last_op_ = "adopt_prefix(" + str(s) + ", " + str(n) + " tokens)";
    const Snapshot before = snapshot();
    auto hit = cache_->adopt_prefix(s, tokens, n);
    Error code;
    if (seq_refusal(s, &code)) return refused(hit.status(), code, before);
    if (n < 0 || n > cfg_.capacity || (tokens == nullptr && n > 0)) return refused(hit.status(), Error::InvalidArgument, before);
    SeqModel& m = model_->seq(s);
    if (m.length() != 0) return refused(hit.status(), Error::InvalidState, before);  // empty: no committed position
    FUZZ_REQUIRE(hit.ok(), outcome(hit.status()));
    const int h = *hit;
    const std::vector<std::int32_t> given(prompt.begin(), prompt.begin() + n);
    const int longest = prefix_->adopt(s, given);
    FUZZ_REQUIRE(h == longest, "hit " + str(h) + ", the longest cached prefix is " + str(longest));
    FUZZ_REQUIRE(h % cfg_.batch.block_size == 0 && h <= std::max(0, n - 1) && cache_->sequence(s)->length == h,
                 "hit " + str(h));
    model_->adopt(s, prompt, h);  // what a fresh computation would hold
    if (h > 0) bump(&Coverage::prefix_hits);
    if (h > 0 && has_chunked_group()) bump(&Coverage::chunked_hits);
    return verb_done();
  }

  std::string clear() {
    last_op_ = "clear";
    cache_->clear();
    model_->clear();
    prefix_->clear();
    for (int g = 0; g < cache_->n_groups(); ++g)
      FUZZ_REQUIRE(*cache_->free_blocks(g) == *cache_->num_blocks(g) && *cache_->cached_blocks(g) == 0, "clear");
    bump(&Coverage::clears);
    return verb_done();
  }

  // Queries and stale steps with any arguments: the predicted answer, or the
  // predicted refusal, and nothing changed.
  std::string abuse() {
    const int G = cache_->n_groups();
    const int s = any_seq();
    const int g = in_.percent(85) ? in_.in(0, G - 1) : (in_.percent(50) ? in_.in(-1, G) : in_.edgy());
    const bool g_ok = g >= 0 && g < G;
    const Snapshot before = snapshot();
    switch (in_.u8() % 8) {
      case 0: {
        last_op_ = "sequence(" + str(s) + ")";
        auto r = cache_->sequence(s);
        if (!in_range(s)) return refused(r.status(), Error::InvalidArgument, before);
        FUZZ_REQUIRE(r.ok() && r->active == model_->seq(s).active, "sequence()");
        return "";
      }
      case 1: {
        last_op_ = "blocks_held / oldest_held(" + str(s) + ", " + str(g) + ")";
        auto held = cache_->blocks_held(s, g);
        auto oldest = cache_->oldest_held(s, g);
        if (!in_range(s) || !g_ok) {
          const std::string err = refused(held.status(), Error::InvalidArgument, before);
          return err.empty() ? refused(oldest.status(), Error::InvalidArgument, before) : err;
        }
        FUZZ_REQUIRE(held.ok() && oldest.ok() && *oldest >= 0 && *oldest <= cache_->sequence(s)->length, "oldest_held");
        return "";
      }
      case 2: {
        last_op_ = "pool queries(" + str(g) + ")";
        auto f = cache_->free_blocks(g);
        auto c = cache_->cached_blocks(g);
        auto u = cache_->used_blocks(g);
        auto n = cache_->num_blocks(g);
        auto p = cache_->group_policy(g);
        if (!g_ok) {
          for (const Status& st : {f.status(), c.status(), u.status(), n.status(), p.status()}) {
            const std::string err = refused(st, Error::InvalidArgument, before);
            if (!err.empty()) return err;
          }
          return "";
        }
        FUZZ_REQUIRE(f.ok() && c.ok() && u.ok() && n.ok() && p.ok() && *u <= *n && *f <= *n, "pool queries");
        return "";
      }
      case 3: {
        const int l = in_.percent(80) ? in_.in(0, cfg_.n_layers - 1) : in_.edgy();
        last_op_ = "group_of / layer_config(" + str(l) + ")";
        auto gr = cache_->group_of(l);
        auto lc = cache_->layer_config(l);
        if (l < 0 || l >= cfg_.n_layers) {
          const std::string err = refused(gr.status(), Error::InvalidArgument, before);
          return err.empty() ? refused(lc.status(), Error::InvalidArgument, before) : err;
        }
        FUZZ_REQUIRE(gr.ok() && lc.ok() && lc->policy == cfg_.layer(l).policy &&
                         *cache_->group_policy(*gr) == rule_of(cfg_, l),
                     "group_of / layer_config");
        return "";
      }
      case 4: {
        const int q = in_.percent(80) ? in_.in(-1, cfg_.capacity) : in_.edgy();
        const int k = in_.percent(80) ? in_.in(-1, cfg_.capacity) : in_.edgy();
        last_op_ = "visible(" + str(g) + ", " + str(s) + ", " + str(q) + ", " + str(k) + ")";
        auto v = cache_->visible(g, s, q, k);
        if (!g_ok || !in_range(s) || q < 0 || k < 0) return refused(v.status(), Error::InvalidArgument, before);
        const SeqModel& m = model_->seq(s);
        // The window's rule, and not removed (past the length nothing is).
        bool want = BatchModel::in_window(*cache_->group_policy(g), q, k);
        if (m.active && k < m.length()) want = want && m.tags[static_cast<std::size_t>(k)] != 0;
        FUZZ_REQUIRE(v.ok() && *v == want, "visible()");
        return "";
      }
      case 5: {
        // A forged or stale step handle: never the begun one.
        BatchStep forged{step_open_ ? open_step_.id + 1 + in_.u8() : in_.u8(), in_.in(0, 3), in_.in(0, 9)};
        if (in_.percent(30)) forged.id = 0;
        last_op_ = "stale step " + str(static_cast<long long>(forged.id));
        const std::string err = refused(cache_->check_step(forged), Error::InvalidState, before);
        if (!err.empty()) return err;
        const std::string err2 = refused(cache_->plan(forged).status(), Error::InvalidState, before);
        return err2.empty() ? refused(cache_->commit(forged), Error::InvalidState, before) : err2;
      }
      case 6: {
        const int n = in_.edgy();
        last_op_ = "can_rewind(" + str(s) + ", " + str(n) + ")";
        const bool can = cache_->can_rewind(s, n);
        if (!active(s) || n < 0 || n > model_->seq(s).length()) FUZZ_REQUIRE(!can, "can_rewind out of range");
        return "";
      }
      default: {
        // The plan of the begun step is pure: asked again, the same.
        if (!step_open_) return "";
        last_op_ = "plan of the begun step, again";
        auto a = cache_->plan(open_step_);
        auto b = cache_->plan(open_step_);
        FUZZ_REQUIRE(a.ok() && b.ok() && a->n_tokens == b->n_tokens && a->groups == b->groups &&
                         a->seq_ids == b->seq_ids,
                     "plan purity");
        return "";
      }
    }
  }

  // --- the huge regime: lengths only --------------------------------------------------

  std::string run_huge() {
    tables_checked_ = static_cast<std::int64_t>(cache_->max_seqs()) * cache_->table_stride() <= (1 << 14);
    lengths_.assign(static_cast<std::size_t>(cache_->max_seqs()), -1);
    const int ops = in_.in(1, 40);
    const int seqs = std::min(cache_->max_seqs(), 4);
    for (op_ = 0; op_ < ops && !in_.done(); ++op_) {
      const int s = in_.percent(90) ? in_.in(0, seqs - 1) : in_.edgy();
      const bool ok_s = s >= 0 && s < cache_->max_seqs();
      const bool act = ok_s && lengths_[static_cast<std::size_t>(s)] >= 0;
      const int L = act ? lengths_[static_cast<std::size_t>(s)] : 0;
      const Snapshot before = snapshot();
      switch (in_.u8() % 6) {
        case 0: {
          last_op_ = "add_sequence(" + str(s) + ")";
          const Status st = cache_->add_sequence(s);
          FUZZ_REQUIRE(st.ok() == (ok_s && !act), outcome(st));
          if (st.ok()) lengths_[static_cast<std::size_t>(s)] = 0, step_open_ = false;
          break;
        }
        case 1: {
          // T: small, up to max_step, or anything.
          const int T = in_.percent(60) ? in_.in(1, std::min(C_, 64)) : in_.percent(50) ? C_ : in_.edgy();
          last_op_ = "begin_step(" + str(s) + ": " + str(T) + ") at " + str(L);
          const StepEntry e{s, T, nullptr};
          // Per-token work is linear in T: leave steps past 2^20 tokens to the rules that refuse them.
          if (act && T >= 1 && T <= C_ && static_cast<std::int64_t>(L) + T <= cfg_.capacity &&
              T <= cache_->max_step_tokens() && T > (1 << 20))
            break;
          auto begun = cache_->begin_step(&e, 1);
          Error want = Error::Ok;
          if (!ok_s) want = Error::InvalidArgument;
          else if (!act) want = Error::InvalidState;
          else if (T < 1 || T > C_) want = Error::InvalidArgument;
          else if (static_cast<std::int64_t>(L) + T > cfg_.capacity) want = Error::OutOfResources;
          else if (T > cache_->max_step_tokens()) want = Error::InvalidArgument;
          if (want != Error::Ok || !begun.ok()) {
            const std::string err = refused(begun.status(), want == Error::Ok ? Error::OutOfResources : want, before);
            if (!err.empty()) return err;
            break;
          }
          auto plan = cache_->plan(*begun);
          FUZZ_REQUIRE(plan.ok() && plan->n_tokens == T && plan->first_positions[0] == L && plan->context_lens[0] == L + T,
                       "plan");
          const std::int64_t rows = static_cast<std::int64_t>(*cache_->num_blocks(0)) * cache_->block_size();
          FUZZ_REQUIRE(plan->groups[0].slots[0] >= 0 && plan->groups[0].slots[0] < rows &&
                           plan->groups[0].slots[T - 1] >= 0 && plan->groups[0].slots[T - 1] < rows,
                       "a slot outside the pool");
          if (in_.percent(70)) {
            FUZZ_REQUIRE(cache_->commit(*begun).ok(), "commit");
            lengths_[static_cast<std::size_t>(s)] = L + T;
            step_open_ = false;
          } else {
            step_open_ = true;
            open_step_ = *begun;
          }
          break;
        }
        case 2: {
          const int n = in_.percent(50) ? L - in_.in(0, 3) : in_.percent(50) ? in_.in(0, std::max(L, 0)) : in_.edgy();
          last_op_ = "rewind(" + str(s) + ", " + str(n) + ") at " + str(L);
          const bool can = cache_->can_rewind(s, n);
          const Status st = cache_->rewind(s, n);
          FUZZ_REQUIRE(st.ok() == can, "rewind disagrees with can_rewind: " + outcome(st));
          if (!st.ok()) {
            const Error want = !ok_s ? Error::InvalidArgument : !act ? Error::InvalidState
                               : (n < 0 || n > L) ? Error::InvalidArgument : Error::InvalidState;
            const std::string err = refused(st, want, before);
            if (!err.empty()) return err;
          } else {
            lengths_[static_cast<std::size_t>(s)] = n;
            step_open_ = false;
          }
          break;
        }
        case 3: {
          const int dst = in_.in(0, seqs - 1);
          const int upto = in_.percent(50) ? L - in_.in(0, 3) : in_.edgy();
          last_op_ = "fork(" + str(s) + ", " + str(dst) + ", " + str(upto) + ")";
          // Empty: no committed position (blocks a begun step gave it go with the step).
          const bool dst_empty = lengths_[static_cast<std::size_t>(dst)] <= 0;
          const bool can = cache_->can_rewind(s, upto);
          const Status st = cache_->fork(s, dst, upto);
          const bool want = act && s != dst && upto >= 0 && upto <= L && dst_empty && can;
          FUZZ_REQUIRE(st.ok() == want, "fork: " + outcome(st));
          if (st.ok()) {
            lengths_[static_cast<std::size_t>(dst)] = upto;
            step_open_ = false;
          } else {
            FUZZ_REQUIRE(snapshot() == before, "a refused fork changed the cache");
          }
          break;
        }
        case 4: {
          const int p0 = in_.percent(50) ? in_.in(0, std::max(L, 0)) : in_.edgy();
          const int p1 = in_.percent(50) ? in_.in(std::max(p0, 0), std::max(L, std::max(p0, 0))) : in_.edgy();
          last_op_ = "remove(" + str(s) + ", " + str(p0) + ", " + str(p1) + ") at " + str(L);
          const bool can = cache_->can_rewind(s, p0);
          const Status st = cache_->remove(s, p0, p1);
          if (!act || p0 < 0 || p1 < p0) {
            FUZZ_REQUIRE(!st.ok(), "remove accepted a bad call");
            const std::string err = refused(st, !ok_s || (act && (p0 < 0 || p1 < p0)) ? Error::InvalidArgument : Error::InvalidState, before);
            if (!err.empty()) return err;
          } else if (p1 >= L && p0 < L) {
            FUZZ_REQUIRE(st.ok() == (can || p0 == 0), "a truncation disagrees with can_rewind: " + outcome(st));
            if (st.ok()) lengths_[static_cast<std::size_t>(s)] = p0;
          } else if (!st.ok()) {
            const std::string err = refused(st, Error::OutOfResources, before);  // max_holes
            if (!err.empty()) return err;
          }
          if (st.ok()) step_open_ = false;
          break;
        }
        default: {
          const int g = in_.in(0, cache_->n_groups() - 1);
          const int q = in_.edgy(), k = in_.edgy();
          last_op_ = "visible(" + str(g) + ", " + str(s) + ", " + str(q) + ", " + str(k) + ")";
          auto v = cache_->visible(g, s, q, k);
          FUZZ_REQUIRE(v.ok() == (ok_s && q >= 0 && k >= 0), "visible: " + outcome(v.status()));
          break;
        }
      }
      // Lengths, and the ring bound at rest.
      for (int q = 0; q < cache_->max_seqs() && q < 8; ++q) {
        const kvcore::SequenceInfo info = *cache_->sequence(q);
        const int want = lengths_[static_cast<std::size_t>(q)];
        FUZZ_REQUIRE(info.active == (want >= 0) && (want < 0 || info.length == want), "seq " + str(q) + " length");
        if (step_open_ || want < 0) continue;
        for (int g = 0; g < cache_->n_groups(); ++g) {
          const LayerPolicy p = *cache_->group_policy(g);
          if (p.kind != LayerPolicy::Kind::Ring && p.kind != LayerPolicy::Kind::Chunked) continue;
          const std::int64_t B = cache_->block_size();
          const std::int64_t bound = (static_cast<std::int64_t>(p.sinks) + B - 1) / B +
                                     (static_cast<std::int64_t>(p.window) + R_ - 1 + B - 1) / B + 1;
          FUZZ_REQUIRE(*cache_->blocks_held(q, g) <= bound, "ring bound");
        }
      }
      for (int g = 0; g < cache_->n_groups(); ++g)
        FUZZ_REQUIRE(*cache_->free_blocks(g) <= *cache_->num_blocks(g) && *cache_->used_blocks(g) <= *cache_->num_blocks(g),
                     "pool counts");
    }
    return "";
  }

  Bytes& in_;
  CacheConfig cfg_;
  int C_ = 0;
  int R_ = 0;  // the rewind margin (max_rewind, resolved)
  std::unique_ptr<BatchCache> cache_;
  std::unique_ptr<BatchModel> model_;
  std::unique_ptr<TaggedPools> pools_;
  std::unique_ptr<PrefixModel> prefix_;  // the pools as the docs state them: every hit and admission
  bool step_open_ = false;
  BatchStep open_step_;
  bool tables_checked_ = false;
  std::vector<int> lengths_;    // the huge regime's model: -1 inactive
  std::vector<char> held_;      // scratch: blocks seen held
  int op_ = 0;
  std::string last_op_;
};

#undef FUZZ_REQUIRE

}  // namespace detail

/// Runs one input; "" when everything held, else the first violation.
inline std::string run_batch_fuzz(const std::uint8_t* data, std::size_t size) {
  return kvcore_fuzz_input::run_input<detail::Harness>(coverage(), detail::kEdges, data, size);
}

}  // namespace kvcore_batch_fuzz

KVCORE_FUZZ_ENTRY_POINT("batch_fuzzer", kvcore_batch_fuzz::run_batch_fuzz)
