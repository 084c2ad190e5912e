// Replays the committed corpus of the batch fuzzer (tests/fuzz/batch_corpus)
// through its harness, so every build checks it without clang or libFuzzer,
// and proves the corpus reaches the paths that matter (a corpus of refused
// configs would pass and prove nothing).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#define KVCORE_FUZZ_NO_ENTRY_POINT  // the plan fuzzer's replay defines the libFuzzer entry point
#include "../fuzz/batch_fuzzer.cpp"

#include "support/corpus_replay.h"

#ifndef KVCORE_BATCH_FUZZ_CORPUS_DIR
#error "tests/cpp/CMakeLists.txt defines KVCORE_BATCH_FUZZ_CORPUS_DIR"
#endif

namespace {

using kvcore_test::replay_corpus;

TEST(BatchFuzzCorpus, EveryInputHoldsAndTheCorpusReachesEveryPath) {
  kvcore_batch_fuzz::Coverage cov;
  const long inputs = replay_corpus(KVCORE_BATCH_FUZZ_CORPUS_DIR, "batch_fuzzer", kvcore_batch_fuzz::run_batch_fuzz,
                                    kvcore_batch_fuzz::coverage(), &cov, 50u);
  EXPECT_EQ(cov.inputs, inputs);
  EXPECT_GT(cov.invalid_configs, 0);
  EXPECT_GT(cov.small_caches, 0);
  EXPECT_GT(cov.huge_refused, 0);
  EXPECT_GT(cov.huge_caches, 0);
  EXPECT_GT(cov.huge_skipped, 0);
  EXPECT_GT(cov.steps_checked, 0);
  EXPECT_GT(cov.steps_committed, 0);
  EXPECT_GT(cov.steps_abandoned_unrun, 0);
  EXPECT_GT(cov.copies_planned, 0);
  EXPECT_GT(cov.exhausted, 0);
  EXPECT_GT(cov.prefix_hits, 0);
  EXPECT_GT(cov.forks, 0);
  EXPECT_GT(cov.rule_refusals, 0);
  EXPECT_GT(cov.holes_refused, 0);
  EXPECT_GT(cov.middle_removals, 0);
  EXPECT_GT(cov.bad_calls, 0);
  EXPECT_GT(cov.clears, 0);
  // Section 9's kinds (committed inputs that reach them).
  EXPECT_GT(cov.state_configs, 0);
  EXPECT_GT(cov.state_steps, 0);
  EXPECT_GT(cov.state_tree_commits, 0);
  EXPECT_GT(cov.state_refusals, 0);
  EXPECT_GT(cov.state_block_hits, 0);
  EXPECT_GT(cov.shared_layers, 0);
  EXPECT_GT(cov.chunked_steps, 0);
  EXPECT_GT(cov.chunked_hits, 0);
  EXPECT_GT(cov.margin_caches, 0);
  std::printf("batch fuzz corpus, section 9 kinds: %ld State configs driven (%ld steps with every state read "
              "checked, %ld tree commits, %ld refused by a State group's rules, %ld huge skipped, %ld prefix hits on "
              "states named every State block of several blocks), %ld shared layers "
              "checked, %ld steps and %ld prefix hits on a chunked group, %ld small caches with a rewind margin other than "
              "max_step\n",
              cov.state_configs, cov.state_steps, cov.state_tree_commits, cov.state_refusals, cov.state_huge_skipped,
              cov.state_block_hits,
              cov.shared_layers, cov.chunked_steps, cov.chunked_hits, cov.margin_caches);
  std::printf(
      "batch fuzz corpus: %ld inputs (%ld invalid configs, %ld huge refused, %ld huge skipped, %ld huge and %ld small "
      "caches), %ld steps checked key by key, %ld committed, %ld abandoned before their plan ran, %ld copies planned, "
      "%ld refused for want of blocks, %ld prefix hits, %ld forks, %ld rewind-rule refusals, %ld middle removals, "
      "%ld refused past max_holes, %ld other refused calls, %ld clears\n",
      cov.inputs, cov.invalid_configs, cov.huge_refused, cov.huge_skipped, cov.huge_caches, cov.small_caches,
      cov.steps_checked, cov.steps_committed, cov.steps_abandoned_unrun, cov.copies_planned, cov.exhausted,
      cov.prefix_hits, cov.forks, cov.rule_refusals, cov.middle_removals, cov.holes_refused, cov.bad_calls,
      cov.clears);
}

}  // namespace
