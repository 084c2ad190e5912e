// Brute-force reference check: random configs (mixed Flat/Ring, sinks, window
// 1..20, max_step 1..8, capacity up to 200) driven by random operation
// sequences (begin/plan/write/commit, abandoned steps and retries, rewinds in
// and out of the allowed range, clears, capacity exhaustion, stale handles).
// Every plan is written into simulated pools (reference.h) and checked; after
// every operation can_rewind(n) must equal a brute-force judgement from the
// simulated rows for every n. Seeded and reproducible:
//   KVCORE_BRUTE_SEED=<seed>   run only that case
//   KVCORE_BRUTE_CASES=<n>     run n cases (default 3000)
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cache_fixtures.h"
#include "rng.h"

namespace kvcore_test {
namespace {

// What the random cases went through, summed over all of them, so the test
// also proves the generator reaches every interesting path.
struct Coverage {
  long cases = 0;
  long ops = 0;
  long full_length = 0;  // ops that found the cache at capacity
  long steps_committed = 0;
  long steps_abandoned = 0;  // replaced by a retry, or ended by rewind/clear
  long rewinds_accepted_wrapped = 0;  // accepted on a cache whose rings had wrapped
  long rewinds_refused_evicted = 0;   // InvalidState
  long rewinds_refused_range = 0;     // InvalidArgument
  long capacity_exhausted = 0;
  long bad_T = 0;
  long stale_commits = 0;
  long bad_plans = 0;
  long clears = 0;
  long three_run_reads = 0;
  long two_run_writes = 0;
};

CacheConfig random_config(Rng& rng) {
  CacheConfig cfg;
  cfg.capacity = rng.percent(30) ? rng.uniform(1, 20) : rng.uniform(21, 200);
  const int C = rng.uniform(1, cfg.capacity < 8 ? cfg.capacity : 8);
  // max_step 0 means min(512, capacity): only usable when that is <= 8.
  cfg.max_step = (cfg.capacity <= 8 && rng.percent(20)) ? 0 : C;
  cfg.n_layers = rng.uniform(1, 6);
  const int entries = rng.percent(15) ? 1 : cfg.n_layers;
  for (int i = 0; i < entries; ++i) {
    LayerPolicy p = LayerPolicy::flat();
    if (!rng.percent(25)) p = LayerPolicy::ring(rng.uniform(1, 20), rng.percent(50) ? 0 : rng.uniform(1, 6));
    cfg.layers.push_back(layer_of(p));
  }
  return cfg;
}

#define BF_REQUIRE(cond, what)                                                           \
  do {                                                                                   \
    if (!(cond)) return "op " + std::to_string(op) + " (" + last_op + "): " + (what); \
  } while (0)

// One random case. Returns "" when everything agreed, else the first mismatch.
std::string run_case(std::uint64_t seed, Coverage& cov) {
  Rng rng(seed);
  const CacheConfig cfg = random_config(rng);
  auto created = SequenceCache::create(cfg);
  if (!created.ok()) return "create failed: " + std::string(created.message().c_str());
  SequenceCache& cache = **created;
  PoolSim sim(cfg);
  const int C = cache.max_step();
  int op = -1;
  std::string last_op = "create";
  if (C != design_max_step(cfg)) return "max_step " + std::to_string(C);
  for (int l = 0; l < cfg.n_layers; ++l)
    BF_REQUIRE(*cache.rows(l) == sim.model(l).rows(), "rows of layer " + std::to_string(l));

  std::vector<Step> handles;  // every step ever begun; all but the active one are stale
  std::vector<SeqStepPlan> active_plans;
  bool wrapped = false;  // some written position reached a ring's wrap
  ++cov.cases;
  const int n_ops = rng.uniform(40, 160);
  for (op = 0; op < n_ops; ++op) {
    ++cov.ops;
    const int L = sim.length();
    if (L == cfg.capacity) ++cov.full_length;
    // With a begun step, mostly commit it (sequences must grow to wrap and to
    // reach capacity); sometimes retry it, rewind it away or clear it.
    int kind = rng.uniform(0, 99);
    if (sim.has_step() && kind < 45 && rng.percent(60)) kind = 45;
    if (kind < 45) {
      // begin_step: mostly valid T, sometimes invalid on purpose.
      int T = rng.uniform(1, C);
      if (rng.percent(12)) {
        const int bad[] = {0, -1, C + 1, cfg.capacity - L + 1};
        T = bad[rng.uniform(0, 3)];
      }
      last_op = "begin_step(" + std::to_string(T) + ") at " + std::to_string(L);
      const Step before = cache.active_step();
      // preview: begins nothing (the checks after this operation would see it)
      // and fails exactly as begin_step does; its plans are compared below.
      std::vector<kvcore::Result<kvcore::SeqStepPlan>> previews;
      for (int l = 0; l < cfg.n_layers; ++l) previews.push_back(cache.preview(l, T));
      BF_REQUIRE(cache.active_step().id == before.id, "preview changed the begun step");
      auto step = cache.begin_step(T);
      for (const auto& p : previews)
        BF_REQUIRE(p.error() == step.error(), "preview and begin_step disagree on the error");
      if (T < 1 || T > C) {
        BF_REQUIRE(step.error() == kvcore::Error::InvalidArgument, "expected InvalidArgument");
        ++cov.bad_T;
      } else if (L + T > cfg.capacity) {
        BF_REQUIRE(step.error() == kvcore::Error::OutOfResources, "expected OutOfResources");
        ++cov.capacity_exhausted;
      } else {
        BF_REQUIRE(step.ok(), std::string("failed: ") + step.message().c_str());
        BF_REQUIRE(step->position == L && step->T == T, "wrong step position/T");
        if (before.id != 0) ++cov.steps_abandoned;
        handles.push_back(*step);
        sim.begin(T);
        active_plans.clear();
        for (int l = 0; l < cfg.n_layers; ++l) {
          auto a = cache.plan(l, step->position, step->T);
          auto b = cache.plan(l, *step);
          BF_REQUIRE(a.ok() && b.ok(), "plan failed");
          BF_REQUIRE(*a == *b, "plan overloads disagree on layer " + std::to_string(l));
          BF_REQUIRE(*previews[static_cast<std::size_t>(l)] == *a,
                     "preview differs from the begun step's plan on layer " + std::to_string(l));
          const std::string err = sim.apply_writes(l, *a);
          BF_REQUIRE(err.empty(), err);
          active_plans.push_back(*a);
          if (a->n_read == 3) ++cov.three_run_reads;
          if (a->n_write == 2) ++cov.two_run_writes;
          if (sim.model(l).wraps() && step->end() > sim.model(l).rows()) wrapped = true;
        }
        for (int l = 0; l < cfg.n_layers; ++l) {
          const std::string err = sim.check_reads(l, active_plans[static_cast<std::size_t>(l)]);
          BF_REQUIRE(err.empty(), err);
        }
      }
      if (!step.ok()) BF_REQUIRE(cache.active_step().id == before.id, "failed begin_step changed the step");
    } else if (kind < 75) {
      // commit the begun step, or (without one) any handle: must be refused.
      const Step active = cache.active_step();
      if (sim.has_step()) {
        last_op = "commit(" + std::to_string(active.position) + ", " + std::to_string(active.T) + ")";
        kvcore::Status s = cache.commit(handles.back());
        BF_REQUIRE(s.ok(), std::string("commit failed: ") + s.message().c_str());
        sim.commit();
        ++cov.steps_committed;
      } else {
        last_op = "commit without a begun step";
        const Step h = handles.empty() ? Step{} : handles[static_cast<std::size_t>(rng.uniform(0, static_cast<int>(handles.size()) - 1))];
        BF_REQUIRE(cache.commit(h).code() == kvcore::Error::InvalidState, "expected InvalidState");
        ++cov.stale_commits;
      }
    } else if (kind < 80) {
      // commit / plan a stale handle (any but the active one).
      last_op = "stale commit";
      if (handles.size() >= 2 || (!handles.empty() && !sim.has_step())) {
        const int last = static_cast<int>(handles.size()) - (sim.has_step() ? 2 : 1);
        const Step h = handles[static_cast<std::size_t>(rng.uniform(0, last))];
        BF_REQUIRE(cache.plan(0, h).error() == kvcore::Error::InvalidState, "stale plan accepted");
        BF_REQUIRE(cache.commit(h).code() == kvcore::Error::InvalidState, "stale commit accepted");
        ++cov.stale_commits;
      }
    } else if (kind < 92) {
      // rewind: near the end (the interesting edge), anywhere, or out of range.
      int n;
      const int how = rng.uniform(0, 9);
      if (how < 7) n = L - rng.uniform(0, C + 3);
      else if (how < 9) n = rng.uniform(0, L);
      else n = rng.percent(50) ? -1 - rng.uniform(0, 3) : L + 1 + rng.uniform(0, 3);
      last_op = "rewind(" + std::to_string(n) + ") at " + std::to_string(L);
      const bool expect_ok = sim.brute_can_rewind(n);
      const Step before = cache.active_step();
      kvcore::Status s = cache.rewind(n);
      if (expect_ok) {
        BF_REQUIRE(s.ok(), std::string("refused: ") + s.message().c_str());
        if (sim.has_step()) ++cov.steps_abandoned;
        sim.rewind(n);
        if (wrapped && n < L) ++cov.rewinds_accepted_wrapped;
      } else if (n < 0 || n > L) {
        BF_REQUIRE(s.code() == kvcore::Error::InvalidArgument, "expected InvalidArgument");
        ++cov.rewinds_refused_range;
      } else {
        BF_REQUIRE(s.code() == kvcore::Error::InvalidState,
                   std::string("expected InvalidState, got ") + kvcore::to_string(s.code()));
        ++cov.rewinds_refused_evicted;
      }
      if (!s.ok()) BF_REQUIRE(cache.active_step().id == before.id, "failed rewind changed the step");
    } else if (kind < 95) {
      last_op = "clear";
      if (sim.has_step()) ++cov.steps_abandoned;
      cache.clear();
      sim.clear();
      ++cov.clears;
    } else {
      // plan with a bad layer or a position/T that is not the begun step.
      last_op = "bad plan";
      const Step a = cache.active_step();
      const int layer = rng.uniform(0, cfg.n_layers - 1);
      BF_REQUIRE(cache.plan(cfg.n_layers + rng.uniform(0, 2), a.position, a.T).error() ==
                     kvcore::Error::InvalidArgument, "bad layer accepted");
      BF_REQUIRE(cache.plan(-1 - rng.uniform(0, 2), a).error() == kvcore::Error::InvalidArgument,
                 "negative layer accepted");
      const kvcore::Error wrong = cache.plan(layer, a.position + 1 + rng.uniform(0, 2), a.T).error();
      BF_REQUIRE(wrong == kvcore::Error::InvalidState, "wrong position accepted");
      if (a.id != 0) {
        BF_REQUIRE(cache.plan(layer, a.position, a.T + 1).error() == kvcore::Error::InvalidState,
                   "wrong T accepted");
      }
      ++cov.bad_plans;
    }

    // After every operation: one length, the same begun step, pure plans,
    // visibility as DESIGN says, and can_rewind equal to the brute force.
    BF_REQUIRE(cache.length() == sim.length(),
               "length " + std::to_string(cache.length()) + ", expected " + std::to_string(sim.length()));
    BF_REQUIRE((cache.active_step().id != 0) == sim.has_step(), "begun step mismatch");
    if (sim.has_step()) {
      for (int l = 0; l < cfg.n_layers; ++l) {
        auto again = cache.plan(l, cache.active_step());
        BF_REQUIRE(again.ok() && *again == active_plans[static_cast<std::size_t>(l)],
                   "plan changed between calls on layer " + std::to_string(l));
      }
    }
    {
      const int l = rng.uniform(0, cfg.n_layers - 1);
      const int q = rng.uniform(0, cfg.capacity);
      const int k = rng.uniform(0, cfg.capacity);
      auto v = cache.visible(l, q, k);
      BF_REQUIRE(v.ok() && *v == sim.model(l).visible(q, k),
                 "visible(" + std::to_string(l) + ", " + std::to_string(q) + ", " + std::to_string(k) + ")");
      // window_begin: q sees exactly [0, sinks) and [window_begin(q), q].
      const kvcore::LayoutPolicy& policy = cache.policy(l);
      const int sinks = policy.policy().sinks, begin = policy.window_begin(q);
      for (int key = 0; key <= q + 1; ++key)
        BF_REQUIRE(sim.model(l).visible(q, key) == (key <= q && (key < sinks || key >= begin)),
                   "window_begin(" + std::to_string(q) + ") = " + std::to_string(begin) + " on layer " +
                       std::to_string(l) + " disagrees with visibility of key " + std::to_string(key));
    }
    const std::vector<bool> allowed = sim.brute_can_rewind_all();
    for (int n = -2; n <= sim.length() + 2; ++n) {
      const bool want = n >= 0 && n <= sim.length() && allowed[static_cast<std::size_t>(n)];
      BF_REQUIRE(cache.can_rewind(n) == want,
                 "can_rewind(" + std::to_string(n) + ") = " + (want ? "false" : "true") +
                     ", brute force says " + (want ? "true" : "false") + " at length " +
                     std::to_string(sim.length()));
    }
    if (op % 16 == 0) {  // the two brute-force forms agree with each other
      const int n = rng.uniform(0, sim.length());
      BF_REQUIRE(sim.brute_can_rewind(n) == allowed[static_cast<std::size_t>(n)], "brute forms disagree");
    }
    BF_REQUIRE(cache.can_extend(cfg.capacity - sim.length()) && !cache.can_extend(cfg.capacity - sim.length() + 1),
               "can_extend");
  }
  return "";
}

#undef BF_REQUIRE

std::uint64_t case_seed(int i) { return 0x6b76636f72650000ull + static_cast<std::uint64_t>(i); }

TEST(BruteForce, RandomConfigsAndOperationsMatchTheReference) {
  Coverage cov;
  if (const char* only = std::getenv("KVCORE_BRUTE_SEED")) {
    const std::uint64_t seed = std::strtoull(only, nullptr, 0);
    Rng rng(seed);
    const CacheConfig cfg = random_config(rng);
    const std::string err = run_case(seed, cov);
    EXPECT_EQ(err, "") << "seed " << seed << ", config " << describe(cfg);
    return;
  }
  int cases = 3000;
  if (const char* n = std::getenv("KVCORE_BRUTE_CASES")) cases = std::atoi(n);
  int failures = 0;
  for (int i = 0; i < cases && failures < 5; ++i) {
    const std::uint64_t seed = case_seed(i);
    const std::string err = run_case(seed, cov);
    if (!err.empty()) {
      Rng rng(seed);
      ADD_FAILURE() << "seed " << seed << " (rerun alone: KVCORE_BRUTE_SEED=" << seed
                    << "), config " << describe(random_config(rng)) << ": " << err;
      ++failures;
    }
  }
  EXPECT_EQ(cov.cases, cases);
  // The generator must reach every interesting path, or the check proves little.
  EXPECT_GT(cov.steps_committed, 0);
  EXPECT_GT(cov.steps_abandoned, 0);
  EXPECT_GT(cov.rewinds_accepted_wrapped, 0);
  EXPECT_GT(cov.rewinds_refused_evicted, 0);
  EXPECT_GT(cov.rewinds_refused_range, 0);
  EXPECT_GT(cov.capacity_exhausted, 0);
  EXPECT_GT(cov.full_length, 0);
  EXPECT_GT(cov.bad_T, 0);
  EXPECT_GT(cov.stale_commits, 0);
  EXPECT_GT(cov.bad_plans, 0);
  EXPECT_GT(cov.clears, 0);
  EXPECT_GT(cov.three_run_reads, 0);
  EXPECT_GT(cov.two_run_writes, 0);
  std::printf(
      "brute force: %ld cases, %ld ops (%ld at capacity), %ld commits, %ld abandoned steps, %ld wrapped rewinds "
      "accepted, %ld refused (evicted), %ld refused (range), %ld capacity exhaustions, %ld "
      "3-run reads, %ld 2-run writes\n",
      cov.cases, cov.ops, cov.full_length, cov.steps_committed, cov.steps_abandoned, cov.rewinds_accepted_wrapped,
      cov.rewinds_refused_evicted, cov.rewinds_refused_range, cov.capacity_exhausted,
      cov.three_run_reads, cov.two_run_writes);
}

}  // namespace
}  // namespace kvcore_test
