// The scenarios of DESIGN.md section 5, one named test each. Expected runs are
// built in the test from DESIGN's row(p) formula and needed set; the simulated
// pools of reference.h prove every read row holds the position it claims.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cache_fixtures.h"

namespace kvcore_test {
namespace {

// Runs for `positions` (increasing) under DESIGN's rules: rows from row(p),
// merged where both rows and positions continue.
std::vector<Run> runs_of(const LayerModel& m, std::int64_t begin, std::int64_t end,
                         std::vector<Run> runs = {}) {
  for (std::int64_t p = begin; p < end; ++p) {
    const int row = static_cast<int>(m.row(p));
    if (!runs.empty() && runs.back().end_row() == row && runs.back().end_pos() == p)
      ++runs.back().len;
    else
      runs.push_back(kvcore::Run{row, 1, static_cast<int>(p)});
  }
  return runs;
}

// The expected reads of the step [P, P + T): sinks [0, min(S, P+T)) then the
// window [max(0, P - W + 1), P + T), or all of [0, P + T) for Flat.
std::vector<Run> expected_reads(const LayerModel& m, std::int64_t P, std::int64_t T) {
  if (!m.ring) return runs_of(m, 0, P + T);
  const std::int64_t end = P + T;
  const std::int64_t sink_end = m.sinks < end ? m.sinks : end;
  std::int64_t window_begin = P - m.window + 1 > 0 ? P - m.window + 1 : 0;
  if (window_begin < sink_end) window_begin = sink_end;
  return runs_of(m, window_begin, end, runs_of(m, 0, sink_end));
}

std::vector<Run> expected_writes(const LayerModel& m, std::int64_t P, std::int64_t T) {
  return runs_of(m, P, P + T);
}

std::vector<Run> reads_of(const SeqStepPlan& p) { return std::vector<Run>(p.read, p.read + p.n_read); }
std::vector<Run> writes_of(const SeqStepPlan& p) {
  return std::vector<Run>(p.write, p.write + p.n_write);
}

std::string describe(const std::vector<Run>& runs) {
  std::string s;
  for (const Run& r : runs) s += kvcore_test::describe(r) + " ";
  return s;
}

// One step through run_step() (simulated pools, exact reads), then the plan of
// every layer compared run by run with the DESIGN formulas. Returns the plans.
std::vector<SeqStepPlan> step_and_check(SequenceCache& cache, PoolSim& sim, int T,
                                        bool commit = true) {
  const int P = cache.length();
  Step step;
  const std::string err = run_step(cache, sim, T, /*commit=*/false, &step);
  EXPECT_EQ(err, "") << "step at " << P << ", T " << T;
  std::vector<SeqStepPlan> plans;
  if (!err.empty()) return plans;
  for (int l = 0; l < cache.n_layers(); ++l) {
    const LayerModel& m = sim.model(l);
    auto plan = cache.plan(l, step);
    EXPECT_TRUE(plan.ok());
    if (!plan.ok()) return plans;
    EXPECT_EQ(describe(writes_of(*plan)), describe(expected_writes(m, P, T)))
        << "layer " << l << " P " << P << " T " << T;
    EXPECT_EQ(describe(reads_of(*plan)), describe(expected_reads(m, P, T)))
        << "layer " << l << " P " << P << " T " << T;
    plans.push_back(*plan);
  }
  if (commit) {
    EXPECT_TRUE(cache.commit(step).ok());
    sim.commit();
  }
  return plans;
}

TEST(Scenarios, Scenario1_FlatStepsOf1And5AndMaxStepReadOneRun) {
  const int C = 8;
  CacheConfig cfg = make_config(64, {LayerPolicy::flat()}, C);
  auto cache = must_create(cfg);
  ASSERT_NE(cache, nullptr);
  PoolSim sim(cfg);
  EXPECT_EQ(*cache->rows(0), 64);
  for (int T : {1, 5, C, 1, C, 5, 1}) {
    const int P = cache->length();
    auto plans = step_and_check(*cache, sim, T);
    ASSERT_EQ(plans.size(), 1u);
    const SeqStepPlan& p = plans[0];
    ASSERT_EQ(p.n_read, 1);
    EXPECT_EQ(p.read[0], (kvcore::Run{0, P + T, 0}));  // [0, P+T), row(p) = p
    ASSERT_EQ(p.n_write, 1);
    EXPECT_EQ(p.write[0], (kvcore::Run{P, T, P}));
    EXPECT_TRUE(p.is_contiguous());
    EXPECT_EQ(cache->length(), P + T);
  }
}

TEST(Scenarios, Scenario2_RingW4C1DecodeWrapsIntoTwoRuns) {
  const int W = 4;
  CacheConfig cfg = make_config(64, {LayerPolicy::ring(W)}, /*max_step=*/1);
  auto cache = must_create(cfg);
  ASSERT_NE(cache, nullptr);
  PoolSim sim(cfg);
  EXPECT_EQ(*cache->rows(0), W + 1 - 1);  // S + W + C - 1 = 4
  int two_run_reads = 0;
  for (int P = 0; P <= 20; ++P) {
    auto plans = step_and_check(*cache, sim, 1);
    ASSERT_EQ(plans.size(), 1u);
    const SeqStepPlan& p = plans[0];
    // The window [max(0, P-3), P], in position order.
    const int first = P - W + 1 > 0 ? P - W + 1 : 0;
    EXPECT_EQ(p.read_len(), P - first + 1);
    EXPECT_EQ(p.read[0].pos, first);
    EXPECT_EQ(p.read[p.n_read - 1].end_pos(), P + 1);
    EXPECT_EQ(p.write[0], (kvcore::Run{P % W, 1, P}));
    if (p.n_read == 2) ++two_run_reads;
    EXPECT_LE(p.n_read, 2);  // no sinks: the window wraps at most once (docs/design.md section 2)
  }
  // The window wraps unless it starts on row 0: positions P-3..P with P % 4 != 3. Derived: of
  // P = 0..20, the full windows (P >= 3: 18) less those starting on row 0 (P = 3, 7, 11, 15, 19).
  EXPECT_EQ(two_run_reads, 18 - 5);
}

TEST(Scenarios, Scenario3_RingW4C4ChunkAfterWrapReadsSevenFreshPositions) {
  const int W = 4, C = 4;
  CacheConfig cfg = make_config(64, {LayerPolicy::ring(W)}, C);
  auto cache = must_create(cfg);
  ASSERT_NE(cache, nullptr);
  PoolSim sim(cfg);
  EXPECT_EQ(*cache->rows(0), W + C - 1);  // 7
  // Chunks of 4 cycle through 7 rows: every chunk after the first wraps or
  // overwrites rows the previous chunk's window still held.
  for (int i = 0; i < 8; ++i) {
    const int P = cache->length();
    auto plans = step_and_check(*cache, sim, C);
    ASSERT_EQ(plans.size(), 1u);
    // W - 1 + T = 7 positions once the window reaches back past position 0.
    EXPECT_EQ(plans[0].read_len(), P >= W - 1 ? W - 1 + C : P + C) << "P " << P;
  }
  // 8 chunks of C = 32 positions through W + C - 1 = 7 rows: wrapped more than once.
  EXPECT_EQ(cache->length(), 8 * C);
  EXPECT_GT(cache->length(), W + C - 1);
}

TEST(Scenarios, Scenario4_PromptLongerThanWindowFedInMaxStepChunks) {
  const int W = 8, C = 5, prompt = 37;
  CacheConfig cfg = make_config(128, {LayerPolicy::ring(W), LayerPolicy::ring(W, 3), LayerPolicy::flat()}, C);
  auto cache = must_create(cfg);
  ASSERT_NE(cache, nullptr);
  PoolSim sim(cfg);
  while (cache->length() < prompt) {
    const int T = prompt - cache->length() < C ? prompt - cache->length() : C;
    step_and_check(*cache, sim, T);
    ASSERT_FALSE(HasFailure()) << "stopping at the first wrong chunk";
  }
  EXPECT_EQ(cache->length(), prompt);
  // Then decoding continues on the same rows.
  for (int i = 0; i < 12; ++i) step_and_check(*cache, sim, 1);
  EXPECT_EQ(cache->length(), prompt + 12);
}

TEST(Scenarios, Scenario5_SinksPlusWindowUpToThreeRunsSinksNeverEvicted) {
  const int W = 4, S = 2;
  for (int C : {1, 3}) {
    CacheConfig cfg = make_config(80, {LayerPolicy::ring(W, S)}, C);
    auto cache = must_create(cfg);
    ASSERT_NE(cache, nullptr);
    PoolSim sim(cfg);
    EXPECT_EQ(*cache->rows(0), S + W + C - 1);
    int three_runs = 0;
    while (cache->length() + C <= 60) {
      const int P = cache->length();
      const int T = (P % 2 == 0) ? C : 1;
      auto plans = step_and_check(*cache, sim, T);
      ASSERT_EQ(plans.size(), 1u);
      const SeqStepPlan& p = plans[0];
      // Sinks are read from rows 0..S-1 at every step.
      ASSERT_GE(p.n_read, 1);
      EXPECT_EQ(p.read[0].row, 0);
      EXPECT_EQ(p.read[0].pos, 0);
      EXPECT_GE(p.read[0].len, P + T < S ? P + T : S);
      // No write ever lands on a sink row once the sinks are written.
      for (int i = 0; i < p.n_write && P >= S; ++i) EXPECT_GE(p.write[i].row, S);
      if (p.n_read == 3) ++three_runs;
    }
    // No draw: measured 41 reads of three runs with C = 1 and 17 with C = 3 (2026-12-06); the
    // floor asks only that the path (sinks, then a wrapped window) is reached for each C.
    EXPECT_GT(three_runs, 0) << "C " << C;
  }
}

TEST(Scenarios, Scenario6_MixedFiveRingOneFlatShareOneLength) {
  // Gemma 3 style: five sliding-window layers, then one global layer.
  std::vector<LayerPolicy> pattern;
  for (int block = 0; block < 2; ++block) {
    for (int i = 0; i < 5; ++i) pattern.push_back(LayerPolicy::ring(6));
    pattern.push_back(LayerPolicy::flat());
  }
  CacheConfig cfg = make_config(96, pattern, 4);
  auto cache = must_create(cfg);
  ASSERT_NE(cache, nullptr);
  PoolSim sim(cfg);
  EXPECT_EQ(cache->n_layers(), 12);
  EXPECT_EQ(cache->n_groups(), 2);
  for (int l = 0; l < 12; ++l)
    EXPECT_EQ(cache->group_of(l), cache->group_of(l % 6 == 5 ? 5 : 0)) << l;
  EXPECT_NE(cache->group_of(0), cache->group_of(5));
  // The deprecated names (until kvcore 0.2.0) answer as n_groups and group_of.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  EXPECT_EQ(cache->n_policies(), 2);
  for (int l = 0; l < 12; ++l) EXPECT_EQ(cache->policy_index(l), cache->group_of(l)) << l;
#pragma GCC diagnostic pop
  EXPECT_EQ(*cache->rows(0), 6 + 4 - 1);
  EXPECT_EQ(*cache->rows(5), 96);
  for (int i = 0; i < 30; ++i) {
    const int P = cache->length();
    const int T = 1 + i % 4;
    auto plans = step_and_check(*cache, sim, T);
    ASSERT_EQ(plans.size(), 12u);
    EXPECT_EQ(cache->length(), P + T);  // one length for every layer
  }
}

// A cache decoded past its wrap with steps of 1, plus its simulated pools.
struct Decoded {
  std::unique_ptr<SequenceCache> cache;
  std::unique_ptr<PoolSim> sim;
};

Decoded decode(const CacheConfig& cfg, int length) {
  Decoded d{must_create(cfg), std::unique_ptr<PoolSim>(new PoolSim(cfg))};
  if (!d.cache) return d;
  while (d.cache->length() < length) {
    const std::string err = run_step(*d.cache, *d.sim, 1);
    EXPECT_EQ(err, "");
    if (!err.empty()) break;
  }
  return d;
}

TEST(Scenarios, Scenario7_RewindAfterWrapUpToMaxStepThenDecodeExactly) {
  const int W = 4, C = 3, L = 30;
  CacheConfig cfg = make_config(64, {LayerPolicy::ring(W), LayerPolicy::flat()}, C);
  // Rows of a wrapped ring hold the last R = W + C - 1 positions, [L - R, L); a
  // query at L - k needs [L - k - W + 1, L - k), held iff k <= C.
  for (int k = 1; k <= C; ++k) {
    Decoded d = decode(cfg, L);
    ASSERT_NE(d.cache, nullptr);
    EXPECT_TRUE(d.sim->brute_can_rewind(L - k));
    EXPECT_TRUE(d.cache->can_rewind(L - k)) << "k " << k;
    ASSERT_TRUE(d.cache->rewind(L - k).ok()) << "k " << k;
    d.sim->rewind(L - k);
    EXPECT_EQ(d.cache->length(), L - k);
    for (int i = 0; i < 10; ++i) step_and_check(*d.cache, *d.sim, 1 + i % C);
  }
  // k = C + 1 is refused with nothing changed.
  Decoded d = decode(cfg, L);
  Decoded twin = decode(cfg, L);
  ASSERT_TRUE(d.cache && twin.cache);
  EXPECT_FALSE(d.sim->brute_can_rewind(L - C - 1));
  EXPECT_FALSE(d.cache->can_rewind(L - C - 1));
  kvcore::Status s = d.cache->rewind(L - C - 1);
  EXPECT_EQ(s.code(), Error::InvalidState);
  expect_same_state(*d.cache, *twin.cache);
}

TEST(Scenarios, Scenario7_SpeculativeVerifyThenRewindRejectedDrafts) {
  const int W = 5, C = 4, L = 40;
  CacheConfig cfg = make_config(96, {LayerPolicy::ring(W, 1), LayerPolicy::flat()}, C);
  for (int rejected = 0; rejected < C; ++rejected) {
    Decoded d = decode(cfg, L);
    ASSERT_NE(d.cache, nullptr);
    // Verify 1 token + 3 drafts in one step of C, keep C - rejected of them.
    step_and_check(*d.cache, *d.sim, C);
    const int keep = d.cache->length() - rejected;
    EXPECT_TRUE(d.cache->can_rewind(keep));
    ASSERT_TRUE(d.cache->rewind(keep).ok());
    d.sim->rewind(keep);
    for (int i = 0; i < 8; ++i) step_and_check(*d.cache, *d.sim, i % 2 ? C : 1);
  }
}

TEST(Scenarios, Scenario7_RewindToSinksOrBelowIsAlwaysAccepted) {
  const int W = 4, S = 2, C = 2;
  // Positions < S keep their own rows, so a query at n <= S needs nothing the
  // ring evicted, however far it has wrapped (and Flat layers allow any n).
  CacheConfig cfg = make_config(64, {LayerPolicy::ring(W, S), LayerPolicy::flat()}, C);
  for (int n = 0; n <= S; ++n) {
    Decoded d = decode(cfg, 33);
    ASSERT_NE(d.cache, nullptr);
    EXPECT_TRUE(d.sim->brute_can_rewind(n));
    EXPECT_TRUE(d.cache->can_rewind(n)) << n;
    ASSERT_TRUE(d.cache->rewind(n).ok());
    d.sim->rewind(n);
    for (int i = 0; i < 20; ++i) step_and_check(*d.cache, *d.sim, 1 + i % C);
  }
  // Just above the sinks, the window needs evicted positions: refused.
  Decoded d = decode(cfg, 33);
  ASSERT_NE(d.cache, nullptr);
  EXPECT_FALSE(d.sim->brute_can_rewind(S + 1));
  EXPECT_FALSE(d.cache->can_rewind(S + 1));
}

TEST(Scenarios, Scenario8_UncommittedStepThenRetryAtSamePositionReadsExactly) {
  const int W = 4, C = 4;
  CacheConfig cfg = make_config(64, {LayerPolicy::ring(W, 1), LayerPolicy::ring(W), LayerPolicy::flat()}, C);
  Decoded d = decode(cfg, 17);
  ASSERT_NE(d.cache, nullptr);
  const int P = d.cache->length();
  // Begin a full chunk, let the backend write it, then abandon it.
  std::vector<SeqStepPlan> abandoned = step_and_check(*d.cache, *d.sim, C, /*commit=*/false);
  ASSERT_EQ(abandoned.size(), 3u);
  const Step stale = d.cache->active_step();
  // Retry at the same position with fewer tokens: reads still exact.
  step_and_check(*d.cache, *d.sim, 2);
  EXPECT_EQ(d.cache->length(), P + 2);
  EXPECT_EQ(d.cache->commit(stale).code(), Error::InvalidState);
  // And decoding goes on exactly over rows the abandoned step dirtied.
  for (int i = 0; i < 10; ++i) step_and_check(*d.cache, *d.sim, 1 + i % C);
}

TEST(Scenarios, Scenario9_UncommittedStepBlocksRewindIntoOverwrittenRows) {
  const int W = 4, C = 4, L = 21;
  CacheConfig cfg = make_config(64, {LayerPolicy::ring(W)}, C);
  Decoded d = decode(cfg, L);
  Decoded twin = decode(cfg, L);
  ASSERT_TRUE(d.cache && twin.cache);
  // Without a begun step, rewinding by one is fine...
  EXPECT_TRUE(d.cache->can_rewind(L - 1));
  // ...but once a step of C tokens is begun, the R = W + C - 1 = 7 rows count as
  // holding [L + C - R, L + C) = [L - 3, L + 4), and a query at L - 1 needs L - 4.
  step_and_check(*d.cache, *d.sim, C, /*commit=*/false);
  step_and_check(*twin.cache, *twin.sim, C, /*commit=*/false);
  EXPECT_FALSE(d.sim->brute_can_rewind(L - 1));
  EXPECT_FALSE(d.cache->can_rewind(L - 1));
  EXPECT_EQ(d.cache->rewind(L - 1).code(), Error::InvalidState);
  EXPECT_TRUE(d.cache->can_rewind(L));  // the committed length itself is still fine
  expect_same_state(*d.cache, *twin.cache);
}

TEST(Scenarios, Scenario10_EveryInvalidInputLeavesStateUnchanged) {
  const int C = 3;
  CacheConfig cfg = make_config(24, {LayerPolicy::ring(4, 1), LayerPolicy::flat()}, C);
  // Each bad call runs on a cache with a begun step, against a twin without it.
  struct Bad {
    const char* what;
    Error code;
    Error (*call)(SequenceCache&, const Step& stale);
  };
  const Bad bad_calls[] = {
      {"begin_step(0)", Error::InvalidArgument,
       [](SequenceCache& c, const Step&) { return c.begin_step(0).error(); }},
      {"begin_step(-1)", Error::InvalidArgument,
       [](SequenceCache& c, const Step&) { return c.begin_step(-1).error(); }},
      {"begin_step(C + 1)", Error::InvalidArgument,
       [](SequenceCache& c, const Step&) { return c.begin_step(c.max_step() + 1).error(); }},
      {"plan(bad layer)", Error::InvalidArgument,
       [](SequenceCache& c, const Step&) { return c.plan(2, c.active_step()).error(); }},
      {"plan(-1)", Error::InvalidArgument,
       [](SequenceCache& c, const Step&) {
         return c.plan(-1, c.active_step().position, c.active_step().T).error();
       }},
      {"plan(wrong position)", Error::InvalidState,
       [](SequenceCache& c, const Step&) {
         return c.plan(0, c.active_step().position + 1, c.active_step().T).error();
       }},
      {"plan(wrong T)", Error::InvalidState,
       [](SequenceCache& c, const Step&) {
         return c.plan(0, c.active_step().position, c.active_step().T + 1).error();
       }},
      {"plan(stale step)", Error::InvalidState,
       [](SequenceCache& c, const Step& stale) { return c.plan(0, stale).error(); }},
      {"commit(stale step)", Error::InvalidState,
       [](SequenceCache& c, const Step& stale) { return c.commit(stale).code(); }},
      {"rewind(-1)", Error::InvalidArgument,
       [](SequenceCache& c, const Step&) { return c.rewind(-1).code(); }},
      {"rewind(length + 1)", Error::InvalidArgument,
       [](SequenceCache& c, const Step&) { return c.rewind(c.length() + 1).code(); }},
      {"rewind(evicted)", Error::InvalidState,
       [](SequenceCache& c, const Step&) { return c.rewind(c.length() - C - 1).code(); }},
      {"rows(bad layer)", Error::InvalidArgument,
       [](SequenceCache& c, const Step&) { return c.rows(5).error(); }},
      {"visible(bad layer)", Error::InvalidArgument,
       [](SequenceCache& c, const Step&) { return c.visible(-1, 3, 2).error(); }},
      {"visible(q < 0)", Error::InvalidArgument,
       [](SequenceCache& c, const Step&) { return c.visible(0, -1, 0).error(); }},
      {"visible(k < 0)", Error::InvalidArgument,
       [](SequenceCache& c, const Step&) { return c.visible(1, 3, -2).error(); }},
  };
  for (const Bad& bad : bad_calls) {
    SCOPED_TRACE(bad.what);
    Decoded d = decode(cfg, 15);
    Decoded twin = decode(cfg, 15);
    ASSERT_TRUE(d.cache && twin.cache);
    for (Decoded* x : {&d, &twin}) {
      // An abandoned step (so a stale handle exists), then the begun one.
      ASSERT_TRUE(x->cache->begin_step(2).ok());
      ASSERT_TRUE(x->cache->begin_step(1).ok());
    }
    const Step stale{15, 2, d.cache->active_step().id - 1};
    EXPECT_EQ(bad.call(*d.cache, stale), bad.code);
    expect_same_state(*d.cache, *twin.cache);
  }
  // Capacity exhaustion: OutOfResources, nothing changed.
  Decoded d = decode(cfg, 23);
  Decoded twin = decode(cfg, 23);
  ASSERT_TRUE(d.cache && twin.cache);
  EXPECT_EQ(d.cache->begin_step(2).error(), Error::OutOfResources);
  expect_same_state(*d.cache, *twin.cache);
}

}  // namespace
}  // namespace kvcore_test
