// Replays the committed corpus of the tree fuzzer (tests/fuzz/tree_corpus)
// through its harness, so every build checks it without clang or libFuzzer,
// and proves the corpus reaches the paths that matter.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#define KVCORE_FUZZ_NO_ENTRY_POINT
#include "../fuzz/tree_fuzzer.cpp"

#include "support/corpus_replay.h"

#ifndef KVCORE_TREE_FUZZ_CORPUS_DIR
#error "tests/cpp/CMakeLists.txt defines KVCORE_TREE_FUZZ_CORPUS_DIR"
#endif

namespace {

using kvcore_test::replay_corpus;

TEST(TreeFuzzCorpus, EveryInputHoldsAndTheCorpusReachesEveryPath) {
  kvcore_tree_fuzz::Coverage cov;
  const long inputs = replay_corpus(KVCORE_TREE_FUZZ_CORPUS_DIR, "tree_fuzzer", kvcore_tree_fuzz::run_tree_fuzz,
                                    kvcore_tree_fuzz::coverage(), &cov, 20u);
  EXPECT_EQ(cov.inputs, inputs);
  EXPECT_GT(cov.twin.trees, 0);
  EXPECT_GT(cov.twin.off_main, 0);
  EXPECT_GT(cov.twin.copies, 0);
  EXPECT_GT(cov.twin.aborted, 0);
  EXPECT_GT(cov.twin.forks, 0);
  EXPECT_GT(cov.twin.rewinds, 0);
  EXPECT_GT(cov.raw_trees_refused, 0);
  EXPECT_GT(cov.raw_trees_taken, 0);
  EXPECT_GT(cov.raw_paths_refused, 0);
  EXPECT_GT(cov.raw_paths_taken, 0);
  std::printf("tree fuzz corpus: %ld inputs, %ld trees (%ld off the main line, %ld copies), %ld raw trees refused, "
              "%ld raw paths refused\n",
              cov.inputs, cov.twin.trees, cov.twin.off_main, cov.twin.copies, cov.raw_trees_refused,
              cov.raw_paths_refused);
}

}  // namespace
