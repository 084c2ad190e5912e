// Replays the committed libFuzzer corpus (tests/fuzz/corpus) through the plan
// fuzzer's harness, so every build checks it without clang or libFuzzer, and
// proves the corpus reaches the paths that matter (a corpus that only builds
// invalid configs would pass and prove nothing).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "../fuzz/plan_fuzzer.cpp"

#include "support/corpus_replay.h"

#ifndef KVCORE_FUZZ_CORPUS_DIR
#error "tests/cpp/CMakeLists.txt defines KVCORE_FUZZ_CORPUS_DIR"
#endif

namespace {

using kvcore_test::replay_corpus;

TEST(FuzzCorpus, EveryInputHoldsAndTheCorpusReachesEveryPath) {
  kvcore_fuzz::Coverage cov;
  const long inputs = replay_corpus(KVCORE_FUZZ_CORPUS_DIR, "plan_fuzzer", kvcore_fuzz::run_plan_fuzz,
                                    kvcore_fuzz::coverage(), &cov, 50u);
  EXPECT_EQ(cov.inputs, inputs);
  EXPECT_GT(cov.invalid_configs, 0);
  EXPECT_GT(cov.small_caches, 0);
  EXPECT_GT(cov.huge_caches, 0);
  EXPECT_GT(cov.arena_pools, 0);
  EXPECT_GT(cov.mirrored_pools, 0);
  EXPECT_GT(cov.steps_begun, 0);
  EXPECT_GT(cov.steps_committed, 0);
  EXPECT_GT(cov.rewinds_accepted, 0);
  EXPECT_GT(cov.rewinds_refused_state, 0);
  EXPECT_GT(cov.rewinds_refused_range, 0);
  EXPECT_GT(cov.capacity_refusals, 0);
  EXPECT_GT(cov.clears, 0);
  EXPECT_GT(cov.rows_checked, 0);
  EXPECT_GT(cov.allocation_failures, 0);
  EXPECT_GT(cov.aliasing_writes, 0);
  EXPECT_GT(cov.bad_pool_calls, 0);
  EXPECT_GT(cov.huge_plans, 0);
  // Section 9's kinds (Chunked, Shared, State) through the oracle.
  EXPECT_GT(cov.kinds_caches, 0);
  EXPECT_GT(cov.kinds_verify_steps, 0);
  EXPECT_GT(cov.kinds_trees, 0);
  EXPECT_GT(cov.kinds_rewinds, 0);
  EXPECT_GT(cov.huge_kinds_caches, 0);
  std::printf("fuzz corpus, section 9 kinds: %ld caches (%ld near INT_MAX), %ld verify steps, %ld trees, %ld rewinds\n",
              cov.kinds_caches, cov.huge_kinds_caches, cov.kinds_verify_steps, cov.kinds_trees, cov.kinds_rewinds);
  std::printf(
      "fuzz corpus: %ld inputs (%ld invalid configs, %ld small and %ld huge caches, %ld arena and %ld mirrored "
      "pools), %ld steps "
      "begun, %ld committed, rewinds %ld accepted / %ld refused (state) / %ld refused (range), %ld capacity "
      "refusals, %ld clears, %ld pool rows checked, %ld allocation failures, %ld writes from the pool itself, %ld bad "
      "pool calls refused, %ld plans above 2^30\n",
      cov.inputs, cov.invalid_configs, cov.small_caches, cov.huge_caches, cov.arena_pools, cov.mirrored_pools,
      cov.steps_begun,
      cov.steps_committed, cov.rewinds_accepted, cov.rewinds_refused_state, cov.rewinds_refused_range,
      cov.capacity_refusals, cov.clears, cov.rows_checked, cov.allocation_failures, cov.aliasing_writes, cov.bad_pool_calls,
      cov.huge_plans);
}

}  // namespace
