// Named scenarios of DESIGN.md section 6 on BatchCache: a shared prefix held
// once, copy-on-write of a forked partial block, the ring groups' memory bound
// over long decodes, flat groups keeping history, least-recently-released
// reclaim of cached blocks only when a pool runs short, and holes. Every step
// is written into tagged pools (batch_reference.h) and every query's every key
// is checked against the model of each sequence alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "batch_reference.h"
#include "kvcore/batch/batch_cache.h"

namespace kvcore_test {
namespace {

using kvcore::BatchCache;
using kvcore::BatchStep;
using kvcore::CacheConfig;
using kvcore::Error;
using kvcore::LayerConfig;
using kvcore::LayerPolicy;
using kvcore::StepEntry;

CacheConfig config(int capacity, int max_step, std::vector<LayerPolicy> policies, int B, int max_seqs) {
  CacheConfig cfg;
  cfg.capacity = capacity;
  cfg.max_step = max_step;
  cfg.n_layers = static_cast<int>(policies.size());
  for (const LayerPolicy& p : policies) cfg.layers.push_back(LayerConfig{p, 1, 4, 0});
  cfg.batch.block_size = B;
  cfg.batch.max_seqs = max_seqs;
  return cfg;
}

// The cache, the model of each sequence alone and the tagged pools, driven
// together: every step is planned, written into the pools and checked key by key.
class Harness {
 public:
  explicit Harness(const CacheConfig& cfg)
      : cfg_(cfg), cache_(std::move(BatchCache::create(cfg)).get()), model_(cfg), pools_(*cache_) {}

  BatchCache& cache() { return *cache_; }
  SeqModel& model(int s) { return model_.seq(s); }
  int length(int s) { return cache_->sequence(s)->length; }
  int free(int g) { return *cache_->free_blocks(g); }
  int cached(int g) { return *cache_->cached_blocks(g); }
  int group_held(int g) { return *cache_->held_blocks(g); }  // blocks group g holds (of the one pool)
  int held(int s, int g) { return *cache_->blocks_held(s, g); }

  void add(int s) {
    ASSERT_TRUE(cache_->add_sequence(s).ok());
    model_.add(s);
  }
  void release(int s) {
    ASSERT_TRUE(cache_->release_sequence(s).ok());
    model_.release(s);
  }
  void fork(int src, int dst, int upto) {
    const kvcore::Status st = cache_->fork(src, dst, upto);
    ASSERT_TRUE(st.ok()) << st.message().c_str();
    model_.fork(src, dst, upto);
  }
  void remove(int s, int p0, int p1) {
    const kvcore::Status st = cache_->remove(s, p0, p1);
    ASSERT_TRUE(st.ok()) << st.message().c_str();
    if (p1 >= model_.seq(s).length()) return model_.truncate(s, p0);
    model_.seq(s) = model_.removed(s, p0, p1);
  }
  void rewind(int s, int n) {
    const kvcore::Status st = cache_->rewind(s, n);
    ASSERT_TRUE(st.ok()) << st.message().c_str();
    model_.truncate(s, n);
  }
  // Adopts the longest cached prefix of `prompt`; the model takes the K/V a
  // fresh computation of that prefix would hold.
  int adopt(int s, const std::vector<std::int32_t>& prompt) {
    auto hit = cache_->adopt_prefix(s, prompt.data(), static_cast<int>(prompt.size()));
    EXPECT_TRUE(hit.ok()) << hit.message().c_str();
    if (!hit.ok()) return -1;
    model_.adopt(s, prompt, *hit);
    return *hit;
  }

  struct Entry {
    int seq;
    std::vector<std::int32_t> tokens;  // T tokens; ids below 0 mean "none given"
  };

  // Begins a step over `entries`, checks its plan, writes it into the pools
  // (unless `write` is false: a backend that never ran it), and commits it
  // (unless `commit` is false: the model forgets it, the cache keeps it begun).
  // Returns "" or what went wrong.
  std::string step(const std::vector<Entry>& entries, bool commit = true, bool write = true,
                   kvcore::BatchStepPlan* plan_out = nullptr, BatchStep* step_out = nullptr) {
    std::vector<StepEntry> e;
    for (const Entry& x : entries)
      e.push_back(StepEntry{x.seq, static_cast<int>(x.tokens.size()), x.tokens[0] >= 0 ? x.tokens.data() : nullptr});
    auto begun = cache_->begin_step(e.data(), static_cast<int>(e.size()));
    if (!begun.ok()) return std::string("begin_step: ") + begun.message().c_str();
    std::vector<std::uint64_t> tags;
    for (const Entry& x : entries)
      model_.write(x.seq, x.tokens[0] >= 0 ? x.tokens.data() : nullptr, static_cast<int>(x.tokens.size()), &tags);
    auto plan = cache_->plan(*begun);
    if (!plan.ok()) return std::string("plan: ") + plan.message().c_str();
    if (plan_out != nullptr) *plan_out = *plan;
    if (step_out != nullptr) *step_out = *begun;
    std::string diff;
    if (write) {
      pools_.apply(*plan, tags);
      if (checking) diff = check_step(*cache_, model_, *plan, pools_);
    }
    if (commit) {
      const kvcore::Status st = cache_->commit(*begun);
      if (!st.ok()) return std::string("commit: ") + st.message().c_str();
      for (const Entry& x : entries) model_.commit(x.seq, x.tokens[0] >= 0);
    } else {
      for (const Entry& x : entries) model_.abandon(x.seq, static_cast<int>(x.tokens.size()));
    }
    return diff;
  }

  /// Steps check every query's every key while set (O(T x length) per step).
  bool checking = true;

  // Decodes `n` tokens of `seq` in steps of up to `T` (token ids from `tokens`
  // when given, else none).
  std::string decode(int seq, int n, int T, const std::vector<std::int32_t>* tokens = nullptr) {
    while (n > 0) {
      const int t = std::min(n, T);
      Entry e{seq, {}};
      for (int j = 0; j < t; ++j)
        e.tokens.push_back(tokens != nullptr ? (*tokens)[static_cast<std::size_t>(length(seq) + j)] : -1);
      const std::string err = step({e});
      if (!err.empty()) return err;
      n -= t;
    }
    return "";
  }

 private:
  CacheConfig cfg_;
  std::unique_ptr<BatchCache> cache_;
  BatchModel model_;
  TaggedPools pools_;
};

std::vector<std::int32_t> tokens(int first, int n) {
  std::vector<std::int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(first + i);
  return t;
}

std::vector<std::int32_t> none(int n) { return std::vector<std::int32_t>(static_cast<std::size_t>(n), -1); }

int ring_bound(const LayerPolicy& p, int B, int C) {
  return (p.sinks + B - 1) / B + (p.window + C - 1 + B - 1) / B + 1;
}

// --- a shared prefix ---------------------------------------------------------

// N sequences adopting one prompt's cached prefix hold its blocks once: free
// blocks drop by the prefix's blocks when it is first computed (or first
// adopted back from the cache), never again per sequence; every adopter reads
// the K/V a fresh computation would give.
TEST(BatchScenarios, APrefixSharedByNSequencesIsHeldOnce) {
  const int N = 8, B = 4, C = 8;
  Harness h(config(128, C, {LayerPolicy::flat(), LayerPolicy::ring(16, 4)}, B, N + 1));
  BatchCache& c = h.cache();
  ASSERT_EQ(c.n_groups(), 2);
  const std::vector<std::int32_t> prompt = tokens(1000, 42);  // 10 full blocks and 2 tokens
  // One pool for both groups (free_blocks(g) is the same for every g): what
  // each group takes shows in held_blocks(g).
  const int free_all = h.free(0);
  EXPECT_EQ(h.free(1), free_all);
  h.add(0);
  ASSERT_EQ(h.decode(0, 42, C, &prompt), "");
  EXPECT_EQ(h.held(0, 0), 11);
  const int after_all = h.free(0), after_ring = h.group_held(1);
  EXPECT_EQ(h.group_held(0), 11);
  EXPECT_EQ(after_all, free_all - 11 - h.held(0, 1));
  for (int s = 1; s <= N; ++s) {
    h.add(s);
    std::vector<std::int32_t> own = prompt;
    for (int j = 0; j < 3; ++j) own.push_back(5000 + 10 * s + j);  // each request's own question
    const int before_all = h.free(0);
    EXPECT_EQ(h.adopt(s, own), 40) << "seq " << s;  // the 10 full blocks (the 11th is partial)
    EXPECT_EQ(h.length(s), 40);
    EXPECT_EQ(h.held(s, 0), 10);
    // The ring group keeps the sink block and the window's blocks only.
    EXPECT_EQ(h.held(s, 1), 1 + 6);
    // Held once: adopting takes no block from the pool, in either group.
    EXPECT_EQ(h.free(0), before_all);
    std::vector<std::int32_t> rest(own.begin() + 40, own.end());
    ASSERT_EQ(h.step({{s, rest}}), "") << "seq " << s;  // reads the adopted blocks: exact
  }
  // Each adopter wrote only its own 2 blocks (positions 40..44) in the flat group.
  EXPECT_EQ(h.group_held(0), 11 + 2 * N);
  EXPECT_GT(h.group_held(1), after_ring);  // the ring group took blocks too
  EXPECT_EQ(h.free(0), free_all - h.group_held(0) - h.group_held(1));
  // Released, the full blocks stay cached; adopting them back takes them from
  // the pool once, however many sequences adopt.
  for (int s = 0; s <= N; ++s) h.release(s);
  EXPECT_EQ(h.free(0), free_all);
  EXPECT_EQ(h.cached(0), 10 + N);  // the prefix, and each adopter's block 10 (full: 40..43)
  for (int s = 1; s <= N; ++s) {
    h.add(s);
    std::vector<std::int32_t> own = prompt;
    own.push_back(7);
    EXPECT_EQ(h.adopt(s, own), 40);
    // The prefix's 10 blocks once, and one block of each earlier adopter's step.
    EXPECT_EQ(h.group_held(0), 10 + (s - 1)) << "after " << s << " adopters";
    EXPECT_EQ(h.free(0), free_all - h.group_held(0) - h.group_held(1)) << "after " << s << " adopters";
    ASSERT_EQ(h.step({{s, {own[40], own[41], own[42]}}}), "");
  }
}

// --- copy-on-write -----------------------------------------------------------

// A fork shares a partly filled block; the first side to write into it gets a
// private copy (one copy in the plan), and the other side's rows stay intact.
TEST(BatchScenarios, AForkedPartialBlockIsCopiedOnWriteOnce) {
  const int B = 4;
  Harness h(config(64, 4, {LayerPolicy::flat(), LayerPolicy::ring(6, 1)}, B, 4));
  BatchCache& c = h.cache();
  h.add(0);
  ASSERT_EQ(h.decode(0, 6, 4), "");  // block 0 full, block 1 holds positions 4, 5
  const int shared_flat = c.block_tables(0)[1], shared_ring = c.block_tables(1)[1];
  h.fork(0, 1, 6);
  const int stride = c.table_stride();
  EXPECT_EQ(c.block_tables(0)[stride + 1], shared_flat);  // shared, not copied
  const int free_all = h.free(0), held_flat = h.group_held(0);
  kvcore::BatchStepPlan plan;
  ASSERT_EQ(h.step({{1, none(1)}}, true, true, &plan), "");
  for (int g = 0; g < 2; ++g) {
    ASSERT_EQ(plan.groups[g].n_copies, 1) << "group " << g;
    EXPECT_EQ(plan.groups[g].copies[0].src, g == 0 ? shared_flat : shared_ring);
    EXPECT_EQ(plan.groups[g].copies[0].dst, c.block_tables(g)[stride + 1]);
    EXPECT_EQ(plan.groups[g].slots[0], plan.groups[g].copies[0].dst * B + 2);
  }
  EXPECT_EQ(h.group_held(0), held_flat + 1);
  EXPECT_EQ(h.free(0), free_all - 2);  // one copy in each group, both from the one pool
  EXPECT_EQ(c.block_tables(0)[1], shared_flat);  // the source keeps its block
  // The source writes into its block in place now (no one shares it), and
  // both read exactly their own history.
  ASSERT_EQ(h.step({{0, none(2)}}, true, true, &plan), "");
  EXPECT_EQ(plan.groups[0].n_copies, 0);
  ASSERT_EQ(h.step({{0, none(1)}, {1, none(3)}}, true, true, &plan), "");
  EXPECT_EQ(plan.groups[0].n_copies, 0);
  EXPECT_EQ(plan.groups[1].n_copies, 0);
  // A fork at a block boundary shares only full blocks: nothing to copy.
  h.fork(0, 2, 8);
  ASSERT_EQ(h.step({{2, none(2)}, {0, none(1)}}, true, true, &plan), "");
  EXPECT_EQ(plan.groups[0].n_copies, 0);
}

// --- memory of ring and flat groups -------------------------------------------

// Thousands of decode steps, with chunks, speculative rewinds and a fork: at
// rest, every ring group holds at most ceil(S/B) + ceil((W + C - 1)/B) + 1
// blocks per sequence, and the flat group every block of the history.
TEST(BatchScenarios, RingGroupsStayWithinTheirBoundOverALongDecode) {
  const int C = 4;
  const std::vector<LayerPolicy> policies = {LayerPolicy::ring(32, 4), LayerPolicy::flat(), LayerPolicy::ring(7)};
  for (int B : {1, 3, 4, 16}) {
    SCOPED_TRACE("B " + std::to_string(B));
    Harness h(config(4096, C, policies, B, 3));
    BatchCache& c = h.cache();
    ASSERT_EQ(c.n_groups(), 3);
    h.add(0);
    h.add(1);
    int checked = 0;
    for (int i = 0; i < 3000 && !HasFailure(); ++i) {
      // seq 0 decodes a token a step; every other step seq 1 verifies drafts
      // (T up to C) and rejects some (a rewind of up to C - 1); from step 1000
      // on, seq 2 (a fork of seq 0) decodes too.
      std::vector<Harness::Entry> entries = {{0, none(1)}};
      const int T1 = 1 + (i / 2) % C;
      if (i % 2 == 0) entries.push_back({1, none(T1)});
      if (h.model(2).active) entries.push_back({2, none(1)});
      h.checking = i % 97 == 0;  // every key of every query, now and then
      ASSERT_EQ(h.step(entries), "") << "step " << i;
      if (i % 2 == 0 && T1 > 1 && (i / 2) % 3 == 0) h.rewind(1, h.length(1) - (T1 - 1));
      if (i == 1000) h.fork(0, 2, h.length(0) - 2);
      for (int s = 0; s < 3; ++s) {
        if (!h.model(s).active) continue;
        const int L = h.length(s);
        for (int g = 0; g < 3; ++g) {
          const LayerPolicy p = *c.group_policy(g);
          if (p.kind == LayerPolicy::Kind::Flat) {
            EXPECT_EQ(h.held(s, g), (L + B - 1) / B) << "seq " << s << " at " << L;
            EXPECT_EQ(*c.oldest_held(s, g), 0);
          } else {
            EXPECT_LE(h.held(s, g), ring_bound(p, B, C)) << "seq " << s << " group " << g << " at " << L;
            // The next query's window is held.
            EXPECT_LE(*c.oldest_held(s, g), std::max(0, L - p.window + 1)) << "seq " << s << " at " << L;
          }
        }
        ++checked;
      }
      // seq 0 never rewinds: a rewind of up to C from its length always works.
      for (int k = 0; k <= C; ++k) EXPECT_TRUE(c.can_rewind(0, std::max(0, h.length(0) - k)));
    }
    EXPECT_EQ(h.length(0), 3000);
    // Derived from the schedule (no draw): seq 1 steps at the 1,500 even steps, T1 cycling 1..4
    // (3,750 positions), and every third of them (k = i / 2, k % 3 == 0) rewinds T1 - 1 = k % 4,
    // which cycles 0, 3, 2, 1 with period 12: 125 cycles of 6, 750 positions back.
    EXPECT_EQ(h.length(1), 3750 - 750);
    // Seqs 0 and 1 at each of the 3,000 steps, seq 2 from its fork at step 1000 on (2,000).
    EXPECT_EQ(checked, 2 * 3000 + 2000);
    // The flat group's blocks are the only ones that grew with the history
    // (one pool: num_blocks is the same for every group; held_blocks splits it);
    // a ring group holds at most ring_bound blocks for each of the 3 sequences.
    for (int g : {0, 2}) EXPECT_LE(*c.held_blocks(g), 3 * ring_bound(*c.group_policy(g), B, C)) << "group " << g;
    EXPECT_GE(*c.held_blocks(1), (3000 + B - 1) / B);  // seq 0's history alone
  }
}

// Flat groups release nothing: any rewind is allowed and reads exactly.
TEST(BatchScenarios, FlatGroupsKeepAllHistory) {
  for (int B : {1, 5, 16}) {
    SCOPED_TRACE("B " + std::to_string(B));
    Harness h(config(1024, 8, {LayerPolicy::flat()}, B, 2));
    BatchCache& c = h.cache();
    h.add(0);
    ASSERT_EQ(h.decode(0, 1000, 8), "");
    EXPECT_EQ(h.held(0, 0), (1000 + B - 1) / B);
    EXPECT_EQ(*c.oldest_held(0, 0), 0);
    for (int n = 0; n <= 1000; ++n) ASSERT_TRUE(c.can_rewind(0, n)) << n;
    h.fork(0, 1, 3);
    h.rewind(0, 17);
    EXPECT_EQ(h.held(0, 0), (17 + B - 1) / B);
    ASSERT_EQ(h.step({{0, none(8)}, {1, none(8)}}), "");  // every key below 25 and 11, exact
  }
}

// --- reclaim of cached blocks ------------------------------------------------

// Full blocks of released sequences stay cached and reusable; a step takes
// free blocks without a key first, and reclaims a cached block only when none
// is left, the least recently released first.
TEST(BatchScenarios, CachedBlocksAreReclaimedLeastRecentlyReleasedFirstOnlyWhenShort) {
  const int B = 4;
  CacheConfig cfg = config(64, 4, {LayerPolicy::flat()}, B, 4);
  cfg.batch.num_blocks = 12;
  Harness h(cfg);
  const std::vector<std::int32_t> a = tokens(100, 9), b = tokens(200, 9);  // 2 full blocks each (+ 1 to compute)
  h.add(0);
  ASSERT_EQ(h.decode(0, 8, 4, &a), "");
  h.release(0);  // tail first: A1 then A0
  h.add(0);
  ASSERT_EQ(h.decode(0, 8, 4, &b), "");
  h.release(0);  // then B1, B0
  EXPECT_EQ(h.free(0), 12);
  EXPECT_EQ(h.cached(0), 4);
  // 8 blocks without a key are free: a sequence fills them, the cache stays.
  h.add(1);
  ASSERT_EQ(h.decode(1, 32, 4), "");
  EXPECT_EQ(h.free(0), 4);
  EXPECT_EQ(h.cached(0), 4);
  // Adopting A back and releasing it again makes it the most recently
  // released: the order is B1, B0, A1, A0 now.
  h.add(2);
  EXPECT_EQ(h.adopt(2, a), 8);
  EXPECT_EQ(h.free(0), 2);
  EXPECT_EQ(h.cached(0), 2);
  h.release(2);
  EXPECT_EQ(h.cached(0), 4);
  // The pool is short now: each new block reclaims the least recently released.
  ASSERT_EQ(h.decode(1, 1, 1), "");  // block 8 of seq 1: takes B1, B's tail
  EXPECT_EQ(h.cached(0), 3);
  h.add(2);
  EXPECT_EQ(h.adopt(2, b), 4);  // B's head outlived its tail
  h.release(2);                 // B0 released again: A1, A0, B0
  h.add(2);
  EXPECT_EQ(h.adopt(2, a), 8);  // A whole
  h.release(2);                 // A1, A0 released again: B0, A1, A0
  ASSERT_EQ(h.decode(1, 4, 4), "");  // block 9 of seq 1: takes B0
  EXPECT_EQ(h.cached(0), 2);
  EXPECT_EQ(h.free(0), 2);
  h.add(2);
  EXPECT_EQ(h.adopt(2, b), 0);
  h.release(2);
  h.release(1);  // room for one more step
  h.add(2);
  EXPECT_EQ(h.adopt(2, a), 8);
  ASSERT_EQ(h.step({{2, {a[8]}}}), "");  // reads the adopted K/V: exact
}

// DESIGN section 6: on a ring group a prefix hit counts as far as the blocks a
// query at the hit length needs are held (the window and the rewind margin);
// blocks below them may be gone. Ring(4), B = 2, C = 1: a hit of h positions
// needs ring block indices from (h - 4) / 2 on. The pool holds 8 blocks;
// a sequence decoding without token ids makes the pool reclaim cached blocks,
// least recently released first. (The ring is the only group: beside a flat
// group the one pool would be the flat group's 64 blocks too, and its cached
// blocks would share the LRU order this test follows. Its default is the
// ring's alone, 2 x (ceil((W + 2C - 1)/B) + 1) = 8, the ring pool of old.)
TEST(BatchScenarios, ARingPrefixHitCountsAsFarAsTheBlocksItsQueriesNeedAreHeld) {
  const int B = 2;
  Harness h(config(64, 1, {LayerPolicy::ring(4)}, B, 2));
  const int ring = *h.cache().group_of(0);
  ASSERT_EQ(*h.cache().num_blocks(ring), 8);
  const std::vector<std::int32_t> prompt = tokens(500, 13);  // 6 full blocks adoptable
  h.add(0);
  ASSERT_EQ(h.decode(0, 12, 1, &prompt), "");
  h.release(0);  // ring blocks 0..3 were released by the window, then 4, 5
  ASSERT_EQ(h.cached(ring), 6);
  // Another sequence takes the 2 blocks without a key, then reclaims the
  // least recently released: ring index 0, which a hit of 12 does not need.
  h.add(1);
  ASSERT_EQ(h.decode(1, 12, 1), "");
  ASSERT_EQ(h.cached(ring), 5);
  h.add(0);
  EXPECT_EQ(h.adopt(0, prompt), 12);  // needs ring blocks 4, 5 only: a whole hit
  ASSERT_EQ(h.step({{0, {prompt[12]}}}), "");
  h.release(0);
  // Adopting the 8-position prefix makes ring blocks 2, 3 the most recently
  // released; reclaims then take 1, 4 and 5 first, which hits of 12 and 10
  // need. (A sequence decoding alone reuses the blocks its window gives back:
  // two at once make the pool short.)
  h.add(0);
  const std::vector<std::int32_t> shorter(prompt.begin(), prompt.begin() + 9);
  EXPECT_EQ(h.adopt(0, shorter), 8);
  h.release(0);
  h.add(0);
  for (int i = 0; i < 12 && h.cached(ring) > 2; ++i) ASSERT_EQ(h.step({{0, none(1)}, {1, none(1)}}), "");
  ASSERT_EQ(h.cached(ring), 2);
  h.release(0);
  h.add(0);
  EXPECT_EQ(h.adopt(0, prompt), 8);  // shorter: as far as its queries' blocks are held
  ASSERT_EQ(h.step({{0, {prompt[8]}}}), "");  // and exact
}

// --- holes -------------------------------------------------------------------

// remove(s, p0, p1) in the middle frees the blocks whose every position left
// (once no other sequence holds them), keeps partly removed ones, and no later
// query of s sees a removed position; a fork made before keeps seeing them.
TEST(BatchScenarios, AMiddleRemovalFreesWholeBlocksAndRemovedPositionsAreNeverSeen) {
  const int B = 4;
  Harness h(config(64, 4, {LayerPolicy::flat(), LayerPolicy::ring(8)}, B, 3));
  BatchCache& c = h.cache();
  h.add(0);
  ASSERT_EQ(h.decode(0, 24, 4), "");
  h.fork(0, 1, 24);  // shares every block
  const int free_flat = h.free(0);
  h.remove(0, 5, 15);  // block 2 (8..11) entirely; blocks 1 and 3 partly
  EXPECT_EQ(h.held(0, 0), 5);
  EXPECT_EQ(h.free(0), free_flat);  // seq 1 still holds block 2
  EXPECT_EQ(c.block_tables(0)[2], -1);  // a hole in seq 0's table
  const kvcore::SequenceInfo info = *c.sequence(0);
  ASSERT_EQ(info.n_holes, 1);
  EXPECT_EQ(info.holes[0].begin, 5);
  EXPECT_EQ(info.holes[0].end, 15);
  EXPECT_EQ(info.visible_positions(), 14);
  for (int k = 5; k < 15; ++k) EXPECT_FALSE(*c.visible(0, 0, 30, k)) << k;
  EXPECT_TRUE(*c.visible(0, 0, 30, 4));
  EXPECT_TRUE(*c.visible(0, 1, 30, 10));  // the fork still sees it
  kvcore::BatchStepPlan plan;
  ASSERT_EQ(h.step({{0, none(4)}, {1, none(4)}}, true, true, &plan), "");  // every key, exact
  ASSERT_EQ(plan.n_holes[0], 1);
  EXPECT_EQ(plan.holes[0][0].begin, 5);
  EXPECT_EQ(plan.n_holes[1], 0);
  h.release(1);
  // The step took a new block for each; releasing seq 1 frees the two only it
  // held (block 2, removed from seq 0, and its own new one).
  EXPECT_EQ(h.free(0), free_flat);
  // A removal of exactly one block frees it at once.
  const int before = h.free(0);
  const int held_flat = h.group_held(0);
  h.remove(0, 16, 20);
  // Block 4 (16..19) in each group: the ring(8) at 28 holds blocks from
  // floor((28 - C - W + 1) / B) = 4 on; both go back to the one pool.
  EXPECT_EQ(h.group_held(0), held_flat - 1);
  EXPECT_EQ(h.free(0), before + 2);
  EXPECT_EQ(h.held(0, 0), 6 - 1);
  for (int i = 0; i < 10 && !HasFailure(); ++i) ASSERT_EQ(h.step({{0, none(1 + i % 4)}}), "");
  for (int k = 16; k < 20; ++k) EXPECT_FALSE(*c.visible(0, 0, h.length(0), k));
}

// --- abandoned steps ----------------------------------------------------------

// A step takes a fresh block at its first position's index when the sequence
// stands on a block boundary; abandoned (by a verb, or replaced by a retry),
// the block goes back and blocks_held counts it no more. Its later blocks go
// too. (A mutation run found only the brute force and the fuzz corpus holding
// this: the fresh block was given back to the pool but still counted held.)
TEST(BatchScenarios, AnAbandonedStepsFreshBlockIsSubtractedFromBlocksHeld) {
  const int B = 4;
  for (const bool by_retry : {false, true}) {
    SCOPED_TRACE(by_retry ? "replaced by a retry" : "ended by a verb");
    Harness h(config(64, 8, {LayerPolicy::flat(), LayerPolicy::ring(4)}, B, 2));
    h.add(0);
    h.add(1);
    ASSERT_EQ(h.decode(0, 8, 8), "");  // two full blocks: the next step starts a fresh one
    const int held_flat = h.held(0, 0), held_ring = h.held(0, 1);
    const int free_all = h.free(0);  // the one pool's
    ASSERT_EQ(h.step({{0, none(6)}}, /*commit=*/false), "");  // fresh blocks 2 and 3
    EXPECT_EQ(h.held(0, 0), held_flat + 2);
    EXPECT_EQ(h.held(0, 1), held_ring + 2);
    if (by_retry) {
      ASSERT_EQ(h.step({{1, none(1)}}, /*commit=*/false), "");  // replaces it
    } else {
      h.rewind(0, 8);  // changes nothing but ends the step
    }
    EXPECT_EQ(h.held(0, 0), held_flat);
    EXPECT_EQ(h.held(0, 1), held_ring);
    const int taken = by_retry ? 1 : 0;  // the retry's own block for sequence 1, in each group
    EXPECT_EQ(h.free(0), free_all - 2 * taken);
    EXPECT_EQ(h.free(1), free_all - 2 * taken);
    ASSERT_EQ(h.step({{0, none(1)}}), "");
    EXPECT_EQ(h.held(0, 0), held_flat + 1);
  }
}

// --- colliding keys ------------------------------------------------------------

// Prompts whose block keys share one home slot in the pools' key table
// (found by hashing candidates with BlockKey::chain), computed, released,
// reclaimed from the middle and the end of their probe chain, and computed
// again: every prompt whose blocks are still cached must be adopted whole
// (the longest cached prefix). Before the key table was tested directly,
// breaking its deletion (`home > i` -> `home >= i`) passed the whole suite:
// hits shrank silently.
TEST(BatchScenarios, CollidingBlockKeysKeepEveryPrefixHitMaximal) {
  const int B = 2, n_blocks = 8;  // 8 blocks: a key table of 16 slots
  CacheConfig cfg = config(32, 4, {LayerPolicy::flat()}, B, 3);
  cfg.batch.num_blocks = n_blocks;
  Harness h(cfg);
  const std::uint64_t mask = 15;
  // Second blocks after one shared first block [1, 2], all with home slot 14:
  // the chain wraps around the table's end.
  const std::int32_t head[] = {1, 2};
  const kvcore::BlockKey first = kvcore::BlockKey::chain(kvcore::BlockKey{}, head, B);
  std::vector<std::vector<std::int32_t>> prompts;
  for (std::int32_t a = 10; prompts.size() < 5; ++a) {
    const std::int32_t tail[] = {a, a + 1000};
    if ((kvcore::BlockKey::chain(first, tail, B).lo & mask) == 14) prompts.push_back({1, 2, a, a + 1000, 7});
  }
  ASSERT_NE(first.lo & mask, 14u) << "pick another slot: the head collides too";
  // Each prompt computed by its own sequence, then released: 1 + 5 cached blocks.
  for (const std::vector<std::int32_t>& p : prompts) {
    h.add(0);
    EXPECT_EQ(h.adopt(0, p), prompts.front() == p ? 0 : 2);  // the shared head is cached after the first
    ASSERT_EQ(h.decode(0, 4 - h.length(0), 4, &p), "");
    h.release(0);
  }
  ASSERT_EQ(h.cached(0), 6);
  // Sequence 0 adopts prompts[k] for each k of `order` and releases it again:
  // the hits must be `want` (a release makes the prompt's blocks the most
  // recently released, tail first).
  auto adopt_each = [&](std::vector<std::size_t> order, std::vector<int> want) {
    for (std::size_t i = 0; i < order.size(); ++i) {
      h.add(0);
      EXPECT_EQ(h.adopt(0, prompts[order[i]]), want[i]) << "prompt " << order[i];
      h.release(0);
    }
  };
  adopt_each({0, 1, 2, 3, 4}, {4, 4, 4, 4, 4});
  // The free blocks without a key go to a sequence without token ids: each
  // block it takes from now on reclaims the least recently released.
  h.add(1);
  ASSERT_EQ(h.decode(1, 2 * (n_blocks - h.cached(0)), 2), "");
  ASSERT_EQ(h.free(0), h.cached(0));
  // Released tail first, the chain's blocks wait as P0 .. P4, then the head.
  // Re-adopting 3, 4, 0, 1 leaves P2 (the middle of the probe chain, past the
  // table's end) least recently released: the next block reclaims it.
  adopt_each({3, 4, 0, 1}, {4, 4, 4, 4});
  ASSERT_EQ(h.decode(1, 1, 1), "");
  ASSERT_EQ(h.cached(0), 5);
  adopt_each({0, 1, 2, 3, 4}, {4, 4, 2, 4, 4});
  // Now P3, P4, P0, P1, head: re-adopting 0, 1, 3 leaves P4 first, the end of
  // the chain, for the next reclaim.
  adopt_each({0, 1, 3}, {4, 4, 4});
  ASSERT_EQ(h.decode(1, 2, 2), "");
  ASSERT_EQ(h.cached(0), 4);
  adopt_each({0, 1, 2, 3, 4}, {4, 4, 2, 4, 2});
  // Re-inserted: prompt 2 computed again names its second block again.
  h.release(1);
  h.add(0);
  ASSERT_EQ(h.adopt(0, prompts[2]), 2);
  ASSERT_EQ(h.decode(0, 2, 2, &prompts[2]), "");
  h.release(0);
  adopt_each({0, 1, 2, 3, 4}, {4, 4, 4, 4, 2});
}

// Two sequences compute one prompt side by side (neither can hit the other's
// blocks before the step commits): each commit that fills a block whose
// content the pool already keeps gives the second copy back unnamed, and the
// sequence shares the first, in every group. One KV event per content. (Before,
// both copies stayed held and named until their sequences ended.)
TEST(BatchScenarios, TwoSequencesThatComputeOnePromptKeepOneCopy) {
  const int B = 2;
  CacheConfig cfg = config(32, 8, {LayerPolicy::flat(), LayerPolicy::ring(8, 0)}, B, 3);
  cfg.batch.num_blocks = 16;
  Harness h(cfg);
  ASSERT_TRUE(h.cache().enable_kv_events(64).ok());
  const std::vector<std::int32_t> prompt = tokens(40, 8);
  const std::vector<std::int32_t> five(prompt.begin(), prompt.begin() + 5);
  h.add(0);
  h.add(1);
  ASSERT_EQ(h.step({{0, five}, {1, five}}), "");
  // Blocks 0 and 1 full: one copy each, held twice; block 2 (one position) each its own.
  for (int g = 0; g < 2; ++g) {
    for (int i = 0; i < 2; ++i) EXPECT_EQ(h.cache().block_at(1, g, i), h.cache().block_at(0, g, i));
    EXPECT_NE(h.cache().block_at(1, g, 2), h.cache().block_at(0, g, 2));
    EXPECT_EQ(h.held(0, g), 3);
    EXPECT_EQ(h.held(1, g), 3);
    EXPECT_EQ(h.cached(g), 0);
  }
  EXPECT_EQ(h.free(0), 16 - 2 * 4);  // 4 blocks a group: 2 shared, 2 partial
  ASSERT_EQ(h.step({{0, {prompt[5]}}, {1, {prompt[5]}}}), "");  // block 2 fills in both
  EXPECT_EQ(h.free(0), 16 - 2 * 3);
  kvcore::KVEvent events[16];
  EXPECT_EQ(*h.cache().drain_kv_events(events, 16), 2 * 3);  // one store per content and group
  h.release(0);  // sequence 1 still holds every block
  for (int g = 0; g < 2; ++g) EXPECT_EQ(h.cached(g), 0);
  h.add(2);
  EXPECT_EQ(h.adopt(2, prompt), 6);
  ASSERT_EQ(h.step({{2, {prompt[6]}}}), "");
}

// A rewind into a full, named block, then a step: the step writes a copy, so
// the named block stays whole whether the step is committed or abandoned, and
// the prompt is adopted whole afterwards. (Before, the step wrote in place
// and dropped the key, and an abandoned step did not give it back.)
TEST(BatchScenarios, AStepAfterARewindIntoANamedBlockLeavesTheNameWhole) {
  const int B = 4;
  for (const bool commit : {false, true}) {
    SCOPED_TRACE(commit ? "committed" : "abandoned");
    Harness h(config(32, 4, {LayerPolicy::flat(), LayerPolicy::ring(8, 1)}, B, 3));
    const std::vector<std::int32_t> prompt = tokens(60, 9);
    h.add(0);
    ASSERT_EQ(h.decode(0, 8, 4, &prompt), "");  // blocks 0 and 1 named
    h.rewind(0, 6);                             // inside block 1
    kvcore::BatchStepPlan plan;
    ASSERT_EQ(h.step({{0, {1, 2}}}, commit, /*write=*/true, &plan), "");
    for (int g = 0; g < 2; ++g) EXPECT_EQ(plan.groups[g].n_copies, 1) << "group " << g;
    h.add(1);  // a verb: an uncommitted step is over
    EXPECT_EQ(h.adopt(1, prompt), 8);
    ASSERT_EQ(h.step({{1, {prompt[8]}}}), "");  // the adopted rows are the prompt's
  }
}

// The example: two sequences compute [1, 2, 3, 4, 5] (B = 2); the
// second, whose blocks are copies, rewinds to a block boundary and writes
// [7, 8, 9]: it keeps naming, so [1, 2, 7, 8, 9] is adopted up to its last
// token (was 2). A fork of nothing names like any empty sequence, and so
// does rewind(s, 0).
TEST(BatchScenarios, ABoundaryRewindOfACopyAndAForkOfNothingKeepNaming) {
  const int B = 2;
  Harness h(config(32, 4, {LayerPolicy::flat()}, B, 4));
  const std::vector<std::int32_t> first = {1, 2, 3, 4, 5};
  for (int s : {0, 1}) {
    h.add(s);
    ASSERT_EQ(h.decode(s, 5, 4, &first), "");
  }
  h.rewind(1, 2);
  ASSERT_EQ(h.step({{1, {7, 8, 9}}}), "");
  h.add(2);
  EXPECT_EQ(h.adopt(2, {1, 2, 7, 8, 9}), 4);
  // Sequence 3: a step without tokens stops its naming; a fork of nothing
  // from it names again.
  h.add(3);
  ASSERT_EQ(h.step({{3, none(2)}}), "");
  h.release(2);
  h.fork(3, 2, 0);
  const std::vector<std::int32_t> other = {5, 6, 7, 8, 9};
  ASSERT_EQ(h.decode(2, 4, 4, &other), "");
  h.rewind(3, 0);  // the same for rewind(s, 0)
  const std::vector<std::int32_t> third = {9, 8, 7, 6, 5};
  ASSERT_EQ(h.decode(3, 4, 4, &third), "");
  h.release(0);
  h.add(0);
  EXPECT_EQ(h.adopt(0, other), 4);
  ASSERT_EQ(h.step({{0, {other[4]}}}), "");  // the adopted rows are that prompt's
  h.release(0);
  h.add(0);
  EXPECT_EQ(h.adopt(0, third), 4);
  ASSERT_EQ(h.step({{0, {third[4]}}}), "");
}

}  // namespace
}  // namespace kvcore_test

// --- regressions -------------------------------------------------------------

namespace kvcore_test {
namespace {

// A step is begun, its plan copies a forked partial block, and the backend
// never runs it (the runner fails before the forward and retries, or a verb
// ends the step). The copy was never made, so the retry's plan must make it
// again. Before the fix the retry planned no copy: the private block kept
// whatever it held, and the sequence read garbage for its inherited positions.
TEST(BatchRegressions, AnAbandonedCopyOnWriteIsPlannedAgain) {
  for (bool by_verb : {false, true}) {
    SCOPED_TRACE(by_verb ? "ended by a verb" : "replaced by a retry");
    Harness h(config(64, 4, {LayerPolicy::flat(), LayerPolicy::ring(6, 1)}, 4, 4));
    h.add(0);
    ASSERT_EQ(h.decode(0, 6, 4), "");
    h.fork(0, 1, 6);  // block 1 (positions 4, 5) shared
    const int free_all = h.free(0);  // the one pool's
    kvcore::BatchStepPlan plan;
    ASSERT_EQ(h.step({{1, none(1)}}, /*commit=*/false, /*write=*/false, &plan), "");
    ASSERT_EQ(plan.groups[0].n_copies, 1);
    ASSERT_EQ(plan.groups[1].n_copies, 1);  // the ring(6, 1) holds block 1 too
    EXPECT_EQ(h.free(0), free_all - 2);     // one copy per group, from the one pool
    if (by_verb) {
      h.rewind(1, 6);  // changes nothing but ends the step
      EXPECT_EQ(h.free(0), free_all);  // the copies are undone
    }
    ASSERT_EQ(h.step({{1, none(2)}}, true, true, &plan), "");  // every key of seq 1, exact
    for (int g = 0; g < 2; ++g) EXPECT_EQ(plan.groups[g].n_copies, 1) << "group " << g;
    ASSERT_EQ(h.step({{0, none(3)}, {1, none(1)}}), "");  // both sides intact
  }
}

// Two holders of a shared partial block write into it in one step, the
// backend runs the plan, and the step is abandoned: neither may have written
// into the shared block (both copy it), so undoing the copies restores
// exactly what each held.
TEST(BatchRegressions, TwoHoldersWritingASharedBlockInOneStepBothCopyIt) {
  Harness h(config(64, 4, {LayerPolicy::flat()}, 4, 4));
  h.add(0);
  ASSERT_EQ(h.decode(0, 6, 4), "");
  h.fork(0, 1, 6);
  h.rewind(0, 5);  // seq 0 holds position 4 of block 1, seq 1 positions 4 and 5
  kvcore::BatchStepPlan plan;
  ASSERT_EQ(h.step({{1, none(1)}, {0, none(2)}}, /*commit=*/false, /*write=*/true, &plan), "");
  EXPECT_EQ(plan.groups[0].n_copies, 2);
  ASSERT_EQ(h.step({{1, none(1)}}), "");  // seq 1's position 5 is its own again
  ASSERT_EQ(h.step({{0, none(2)}}), "");
  ASSERT_EQ(h.step({{0, none(1)}, {1, none(1)}}), "");
}

// begin_step replaces an uncommitted step: the blocks that step holds are the
// new step's to take. Before the fix admission counted only the pool's free
// blocks, and refused a retry that fits once the replaced step is gone.
TEST(BatchRegressions, ARetryReclaimsTheBlocksOfTheStepItReplaces) {
  CacheConfig cfg = config(64, 4, {LayerPolicy::flat()}, 4, 3);
  cfg.batch.num_blocks = 4;
  Harness h(cfg);
  h.add(0);
  h.add(1);
  h.add(2);
  ASSERT_EQ(h.decode(0, 4, 4), "");
  ASSERT_EQ(h.decode(1, 6, 4), "");  // 3 blocks held, 1 free
  // A step that takes the last block, replaced by one over another sequence
  // (refused before the fix: "group 0 needs 1 blocks, 0 of its 4 are free"),
  // replaced again, and committed.
  ASSERT_EQ(h.step({{0, none(1)}}, /*commit=*/false), "");
  EXPECT_EQ(h.free(0), 0);
  ASSERT_EQ(h.step({{2, none(4)}}, /*commit=*/false), "");
  ASSERT_EQ(h.step({{2, none(1)}}), "");
  EXPECT_EQ(h.free(0), 0);
  // A copy-on-write taking the last block, retried: the copy is undone and made again.
  h.release(1);  // 2 free
  h.fork(2, 1, 1);  // seq 1 shares seq 2's partial block 0
  ASSERT_EQ(h.step({{0, none(2)}}), "");  // takes one: 1 free
  ASSERT_EQ(h.free(0), 1);
  ASSERT_EQ(h.step({{1, none(1)}}, /*commit=*/false), "");  // copies block 0 into the last free block
  EXPECT_EQ(h.free(0), 0);
  kvcore::BatchStepPlan plan;
  ASSERT_EQ(h.step({{1, none(2)}}, true, true, &plan), "");  // the retry: admitted, copies again
  EXPECT_EQ(plan.groups[0].n_copies, 1);
  // A step that truly does not fit is still refused, and leaves a begun step begun.
  BatchStep begun;
  ASSERT_EQ(h.step({{1, none(1)}}, /*commit=*/false, true, nullptr, &begun), "");
  const StepEntry too_much[] = {{0, 4, nullptr}, {2, 4, nullptr}};
  auto refused = h.cache().begin_step(too_much, 2);
  EXPECT_EQ(refused.error(), Error::OutOfResources);
  EXPECT_STREQ(refused.message().c_str(),
               "begin_step: the step needs 2 blocks over its 1 group, 0 of the pool's 4 are free");
  EXPECT_TRUE(h.cache().check_step(begun).ok());
}

// A head removal moves a sequence's lowest held block up; a rewind below it
// must move it down again, since the next step writes from block n / B. Before
// the fix it stayed up: a later fork copied none of the blocks below it (the
// fork read holes where its history was) and oldest_held skipped them.
TEST(BatchRegressions, ARewindBelowARemovedHeadThenAForkSharesEveryHeldBlock) {
  const int B = 4;
  Harness h(config(64, 4, {LayerPolicy::flat()}, B, 3));
  BatchCache& c = h.cache();
  h.add(0);
  ASSERT_EQ(h.decode(0, 12, 4), "");
  h.remove(0, 0, 9);  // blocks 0 and 1 leave; the lowest held is block 2
  EXPECT_EQ(*c.oldest_held(0, 0), 9);
  h.rewind(0, 2);     // block 2 leaves too; positions 0, 1 stay removed
  ASSERT_EQ(h.decode(0, 4, 4), "");  // positions 2..5 in new blocks 0 and 1
  EXPECT_EQ(*c.oldest_held(0, 0), 2);  // was 6 (the length: "nothing held")
  h.fork(0, 1, 6);
  EXPECT_EQ(h.held(1, 0), 2);  // was 0
  ASSERT_EQ(h.step({{1, none(2)}, {0, none(1)}}), "");  // was "a needed key's block is a hole"
}

// A fork of nothing (upto = 0) from a sequence whose head was removed gives an
// empty sequence; a prefix it then adopts lies in blocks 0, 1, ... Before the
// fix the fork gave it the source's lowest held block, so forking it in turn
// shared none of the adopted blocks.
TEST(BatchRegressions, AnEmptyForkAdoptsAPrefixThatForksWhole) {
  const int B = 4;
  Harness h(config(64, 4, {LayerPolicy::flat(), LayerPolicy::ring(16)}, B, 3));
  BatchCache& c = h.cache();
  const std::vector<std::int32_t> prompt = tokens(300, 9);
  h.add(0);
  ASSERT_EQ(h.decode(0, 8, 4, &prompt), "");  // blocks 0 and 1, named by their tokens
  h.remove(0, 0, 5);  // block 0 leaves (cached), the lowest held is block 1
  h.fork(0, 1, 0);
  EXPECT_EQ(h.adopt(1, prompt), 8);
  EXPECT_EQ(*c.oldest_held(1, 0), 0);  // was 4
  h.fork(1, 2, 8);
  EXPECT_EQ(h.held(2, 0), 2);  // was 1
  ASSERT_EQ(h.step({{2, {prompt[8]}}}), "");  // was "a needed key's block is a hole"
}

// Sinks beyond the capacity make every position a sink: nothing is released
// and every rewind is allowed. Before the fix the sink blocks' first position
// (ceil(S / B) * B) was computed in int and wrapped for S near 2^31 (signed
// overflow), and rewinds the sinks allow were refused.
TEST(BatchRegressions, ARingWhoseSinksRoundPast2To31AllowsEveryRewind) {
  for (int B : {2, 3, 16}) {
    SCOPED_TRACE("B " + std::to_string(B));
    Harness h(config(64, 4, {LayerPolicy::ring(4, INT_MAX), LayerPolicy::ring(4, INT_MAX - 1)}, B, 3));
    BatchCache& c = h.cache();
    h.add(0);
    ASSERT_EQ(h.decode(0, 20, 4), "");
    for (int n = 0; n <= 20; ++n) EXPECT_TRUE(c.can_rewind(0, n)) << n;  // 14 were refused with B = 2
    EXPECT_EQ(h.held(0, 0), (20 + B - 1) / B);
    h.fork(0, 1, 3);
    h.rewind(0, 7);
    ASSERT_EQ(h.step({{0, none(4)}, {1, none(4)}}), "");  // every key still held, exact
  }
}

// A ring group's pool holds, per sequence, the sink blocks and the blocks of
// W + 2C - 1 positions. With max_step near 2^31, 2C was computed in int and
// wrapped (signed overflow; found by the batch fuzzer): this pool got 0
// blocks instead of 2047, and the config below it, whose pool passes 2^31
// rows, was accepted.
TEST(BatchRegressions, ARingPoolIsSizedWithoutOverflowWhenMaxStepIsNearIntMax) {
  CacheConfig cfg = config(INT_MAX - (1 << 20), INT_MAX - (1 << 20), {LayerPolicy::ring(4)}, 1 << 20, 1);
  auto created = BatchCache::create(cfg);
  ASSERT_TRUE(created.ok()) << created.message().c_str();
  EXPECT_EQ(*(*created)->num_blocks(0), 2047);  // max_seqs x ceil(capacity / B): W + 2C - 1 is past the capacity
  // One more block per table, and the pool would pass 2^31 rows.
  cfg.capacity = INT_MAX;
  cfg.max_step = INT_MAX;
  auto refused = BatchCache::create(cfg);
  EXPECT_EQ(refused.error(), Error::InvalidArgument);
  // The default pool sums each group's (" or more": the sum stops past 2^30).
  EXPECT_STREQ(refused.message().c_str(), "the pool: 2048 or more blocks of 1048576 rows pass 2^31 rows");
}

// A ring's window released positions 0..7 (blocks 0 and 1); a truncation to 7
// then let the next step refill block index 1 with position 7 alone. Position
// 4, which a query at 6 needs, stays lost. Before the fix the window's release
// point was kept in whole blocks and cut back to n / B = 1 by the truncation
// (and by a fork up to 7), so can_rewind(6) said yes and the next step read a
// fresh block's garbage as position 4 (found in review).
TEST(BatchRegressions, ATruncationDoesNotBringBackWhatTheWindowReleased) {
  const int B = 4;
  for (const bool by_fork : {false, true}) {
    SCOPED_TRACE(by_fork ? "fork(0, 1, 7)" : "rewind(0, 7)");
    Harness h(config(64, 1, {LayerPolicy::ring(3)}, B, 2));
    BatchCache& c = h.cache();
    h.add(0);
    ASSERT_EQ(h.decode(0, 12, 1), "");  // the window released blocks 0 and 1
    h.remove(0, 5, 7);                  // a query at 7 needs nothing below 7 now
    int s = 0;
    if (by_fork) {
      h.fork(0, 1, 7);
      s = 1;
    } else {
      h.rewind(0, 7);
    }
    EXPECT_FALSE(c.can_rewind(s, 6));  // needs position 4, released
    ASSERT_EQ(h.decode(s, 1, 1), "");   // position 7: block index 1 afresh
    EXPECT_FALSE(c.can_rewind(s, 6));  // was true
    EXPECT_EQ(c.rewind(s, 6).code(), Error::InvalidState);
    EXPECT_TRUE(c.can_rewind(s, 7));   // within max_step of the length: guaranteed
  }
}

// blocks_needed(seq, T) is what begin_step counts per entry: a step takes the
// sum of its entries' needs from each group, and is admitted exactly when each
// sum fits the group's free blocks (a runner admitting requests one by one adds
// the needs up and begins the step once).
TEST(BatchScenarios, BlocksNeededAddUpToWhatBeginStepTakesAndAdmits) {
  const int B = 4;
  CacheConfig cfg = config(64, 8, {LayerPolicy::flat(), LayerPolicy::ring(6, 1)}, B, 4);
  // One pool: seq 0 at 6 holds blocks 0, 1 in each group (the ring(6, 1) with
  // C = 8 releases nothing below 6 - 8 - 6 + 1 < 0), its fork shares them:
  // 4 held, and 14 free for the steps below.
  cfg.batch.num_blocks = 18;
  auto created = BatchCache::create(cfg);
  ASSERT_TRUE(created.ok()) << created.message().c_str();
  BatchCache& c = **created;
  for (int s = 0; s < 3; ++s) ASSERT_TRUE(c.add_sequence(s).ok());
  // seq 0 at 6 (block 1 partly filled), seq 1 its fork (that block shared), seq 2 empty.
  StepEntry first{0, 6, nullptr, nullptr};
  auto step = c.begin_step(&first, 1);
  ASSERT_TRUE(step.ok());
  ASSERT_TRUE(c.commit(*step).ok());
  ASSERT_TRUE(c.fork(0, 1, 6).ok());
  auto need = [&](int seq, int T) {
    std::vector<int> n(2, -1);
    EXPECT_EQ(c.blocks_needed(seq, T, n.data()), Error::Ok);
    return n;
  };
  EXPECT_EQ(need(0, 1), (std::vector<int>{1, 1}));  // writes into the shared block: a copy
  EXPECT_EQ(need(1, 3), (std::vector<int>{2, 2}));  // a copy and a fresh block
  EXPECT_EQ(need(2, 5), (std::vector<int>{2, 2}));  // two fresh blocks
  const std::vector<StepEntry> entries = {{0, 1, nullptr, nullptr}, {1, 3, nullptr, nullptr},
                                          {2, 5, nullptr, nullptr}};
  std::vector<int> sum(2, 0), held_before(2);
  for (const StepEntry& e : entries) {
    const std::vector<int> n = need(e.seq, e.T);
    for (int g = 0; g < 2; ++g) sum[static_cast<std::size_t>(g)] += n[static_cast<std::size_t>(g)];
  }
  for (int g = 0; g < 2; ++g) held_before[static_cast<std::size_t>(g)] = *c.held_blocks(g);
  const int free_before = *c.free_blocks(0);
  auto all = c.begin_step(entries.data(), 3);
  ASSERT_TRUE(all.ok()) << all.message().c_str();
  for (int g = 0; g < 2; ++g)
    EXPECT_EQ(*c.held_blocks(g), held_before[static_cast<std::size_t>(g)] + sum[static_cast<std::size_t>(g)])
        << "group " << g;
  EXPECT_EQ(*c.free_blocks(0), free_before - sum[0] - sum[1]);  // both groups draw from the one pool
  ASSERT_TRUE(c.abort(*all).ok());
  // The one pool is the bound: a step needing exactly its free blocks (summed
  // over both groups) is admitted, one needing more is refused, as the sums say.
  ASSERT_EQ(*c.free_blocks(0), 14);
  const std::vector<StepEntry> fits = {{2, 8, nullptr, nullptr}, {1, 8, nullptr, nullptr}, {0, 6, nullptr, nullptr}};
  const std::vector<StepEntry> over = {{2, 8, nullptr, nullptr}, {1, 8, nullptr, nullptr}, {0, 7, nullptr, nullptr}};
  int fits_sum = 0, over_sum = 0;
  for (int i = 0; i < 3; ++i) {
    for (int g = 0; g < 2; ++g) {
      fits_sum += need(fits[static_cast<std::size_t>(i)].seq, fits[static_cast<std::size_t>(i)].T)[static_cast<std::size_t>(g)];
      over_sum += need(over[static_cast<std::size_t>(i)].seq, over[static_cast<std::size_t>(i)].T)[static_cast<std::size_t>(g)];
    }
  }
  // Per group (the ring releases nothing inside a step): seq 2 two fresh
  // blocks, seq 1 a copy and two fresh, seq 0 a copy and one fresh (T = 7: two).
  EXPECT_EQ(fits_sum, 2 * (2 + 3 + 2));
  EXPECT_EQ(over_sum, 2 * (2 + 3 + 3));
  auto fitting = c.begin_step(fits.data(), 3);
  ASSERT_TRUE(fitting.ok()) << fitting.message().c_str();
  ASSERT_TRUE(c.abort(*fitting).ok());
  EXPECT_EQ(c.begin_step(over.data(), 3).error(), Error::OutOfResources);
  // Errors: an inactive sequence, T outside [1, max_step], past capacity, null.
  std::vector<int> n(2);
  EXPECT_EQ(c.blocks_needed(3, 1, n.data()).code(), Error::InvalidState);
  EXPECT_EQ(c.blocks_needed(0, 0, n.data()).code(), Error::InvalidArgument);
  EXPECT_EQ(c.blocks_needed(0, 9, n.data()).code(), Error::InvalidArgument);
  EXPECT_EQ(c.blocks_needed(0, 1, nullptr).code(), Error::InvalidArgument);
  auto small = BatchCache::create(config(8, 4, {LayerPolicy::flat()}, B, 1));
  ASSERT_TRUE(small.ok());
  ASSERT_TRUE((*small)->add_sequence(0).ok());
  const StepEntry six{0, 4, nullptr, nullptr}, two{0, 2, nullptr, nullptr};
  ASSERT_TRUE((*small)->commit(*(*small)->begin_step(&six, 1)).ok());
  ASSERT_TRUE((*small)->commit(*(*small)->begin_step(&two, 1)).ok());
  const kvcore::Status past = (*small)->blocks_needed(0, 4, n.data());
  EXPECT_EQ(past.code(), Error::OutOfResources);
  EXPECT_STREQ(past.message().c_str(), "blocks_needed(0, T = 4): length 6 + T would pass capacity = 8");
}

}  // namespace
}  // namespace kvcore_test
