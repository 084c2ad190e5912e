// Replays the committed corpus of the tree fuzzer (tests/fuzz/tree_corpus)
// through its harness, so every build checks it without clang or libFuzzer,
// and proves the corpus reaches the paths that matter.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#define KVCORE_FUZZ_NO_ENTRY_POINT
#include "../fuzz/tree_fuzzer.cpp"

#include "support/corpus_files.h"

#ifndef KVCORE_TREE_FUZZ_CORPUS_DIR
#error "tests/cpp/CMakeLists.txt defines KVCORE_TREE_FUZZ_CORPUS_DIR"
#endif

namespace {

using kvcore_test::corpus_files;
using kvcore_test::read_file;

TEST(TreeFuzzCorpus, EveryInputHoldsAndTheCorpusReachesEveryPath) {
  const std::vector<std::string> files = corpus_files(KVCORE_TREE_FUZZ_CORPUS_DIR);
  ASSERT_GE(files.size(), 20u) << "the corpus at " << KVCORE_TREE_FUZZ_CORPUS_DIR << " is missing or tiny";
  kvcore_tree_fuzz::Coverage cov;
  kvcore_tree_fuzz::coverage() = &cov;
  int failures = 0;
  for (const std::string& path : files) {
    std::vector<std::uint8_t> data;
    ASSERT_TRUE(read_file(path, &data)) << path;
    const std::string err = kvcore_tree_fuzz::run_tree_fuzz(data.data(), data.size());
    if (!err.empty()) {
      ADD_FAILURE() << path << " (rerun: tree_fuzzer " << path << "): " << err;
      if (++failures == 5) break;
    }
  }
  kvcore_tree_fuzz::coverage() = nullptr;
  EXPECT_EQ(cov.inputs, static_cast<long>(files.size()));
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
