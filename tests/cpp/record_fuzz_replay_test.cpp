// Replays the committed corpus of the record fuzzer (tests/fuzz/record_corpus)
// through its harness, so every build checks it without clang or libFuzzer,
// and proves the corpus reaches the paths that matter: records parsed and
// refused, imports into both caches accepted and refused, rows compared.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#define KVCORE_FUZZ_NO_ENTRY_POINT
#include "../fuzz/record_fuzzer.cpp"

#include "support/corpus_files.h"

#ifndef KVCORE_RECORD_FUZZ_CORPUS_DIR
#error "tests/cpp/CMakeLists.txt defines KVCORE_RECORD_FUZZ_CORPUS_DIR"
#endif

namespace {

using kvcore_test::corpus_files;
using kvcore_test::read_file;

TEST(RecordFuzzCorpus, EveryInputHoldsAndTheCorpusReachesEveryPath) {
  const std::vector<std::string> files = corpus_files(KVCORE_RECORD_FUZZ_CORPUS_DIR);
  ASSERT_GE(files.size(), 20u) << "the corpus at " << KVCORE_RECORD_FUZZ_CORPUS_DIR << " is missing or tiny";
  kvcore_record_fuzz::Coverage cov;
  kvcore_record_fuzz::coverage() = &cov;
  int failures = 0;
  for (const std::string& path : files) {
    std::vector<std::uint8_t> data;
    ASSERT_TRUE(read_file(path, &data)) << path;
    const std::string err = kvcore_record_fuzz::run_record_fuzz(data.data(), data.size());
    if (!err.empty()) {
      ADD_FAILURE() << path << " (rerun: record_fuzzer " << path << "): " << err;
      if (++failures == 5) break;
    }
  }
  kvcore_record_fuzz::coverage() = nullptr;
  EXPECT_EQ(cov.inputs, static_cast<long>(files.size()));
  EXPECT_GT(cov.parsed, 0);
  EXPECT_GT(cov.refused_parse, 0);
  EXPECT_GT(cov.imported_seq, 0);
  EXPECT_GT(cov.imported_batch, 0);
  EXPECT_GT(cov.refused_import, 0);
  EXPECT_GT(cov.rows_checked, 0);
  std::printf("record fuzz corpus: %ld inputs, %ld parsed, %ld refused by parse, %ld + %ld imported, %ld imports "
              "refused, %ld rows compared\n",
              cov.inputs, cov.parsed, cov.refused_parse, cov.imported_seq, cov.imported_batch, cov.refused_import,
              cov.rows_checked);
}

}  // namespace
