// Replays the committed libFuzzer corpus (tests/fuzz/corpus) through the plan
// fuzzer's harness, so every build checks it without clang or libFuzzer, and
// proves the corpus reaches the paths that matter (a corpus that only builds
// invalid configs would pass and prove nothing).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "../fuzz/plan_fuzzer.cpp"

#include "support/corpus_files.h"

#ifndef KVCORE_FUZZ_CORPUS_DIR
#error "tests/cpp/CMakeLists.txt defines KVCORE_FUZZ_CORPUS_DIR"
#endif

namespace {

using kvcore_test::corpus_files;
using kvcore_test::read_file;

TEST(FuzzCorpus, EveryInputHoldsAndTheCorpusReachesEveryPath) {
  const std::vector<std::string> files = corpus_files(KVCORE_FUZZ_CORPUS_DIR);
  ASSERT_GE(files.size(), 50u) << "the corpus at " << KVCORE_FUZZ_CORPUS_DIR << " is missing or tiny";
  kvcore_fuzz::Coverage cov;
  kvcore_fuzz::coverage() = &cov;
  int failures = 0;
  for (const std::string& path : files) {
    std::vector<std::uint8_t> data;
    ASSERT_TRUE(read_file(path, &data)) << path;
    const std::string err = kvcore_fuzz::run_plan_fuzz(data.data(), data.size());
    if (!err.empty()) {
      ADD_FAILURE() << path << " (rerun: plan_fuzzer " << path << "): " << err;
      if (++failures == 5) break;
    }
  }
  kvcore_fuzz::coverage() = nullptr;
  EXPECT_EQ(cov.inputs, static_cast<long>(files.size()));
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
