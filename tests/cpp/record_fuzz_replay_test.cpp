// Replays the committed corpus of the record fuzzer (tests/fuzz/record_corpus)
// through its harness, so every build checks it without clang or libFuzzer,
// and proves the corpus reaches the paths that matter: records parsed and
// refused, imports into both caches accepted and refused, rows compared.
#include <gtest/gtest.h>

#include <cstdio>

#define KVCORE_FUZZ_NO_ENTRY_POINT
#include "../fuzz/record_fuzzer.cpp"

#include "support/corpus_replay.h"

#ifndef KVCORE_RECORD_FUZZ_CORPUS_DIR
#error "tests/cpp/CMakeLists.txt defines KVCORE_RECORD_FUZZ_CORPUS_DIR"
#endif

namespace {

using kvcore_test::replay_corpus;

TEST(RecordFuzzCorpus, EveryInputHoldsAndTheCorpusReachesEveryPath) {
  kvcore_record_fuzz::Coverage cov;
  const long inputs = replay_corpus(KVCORE_RECORD_FUZZ_CORPUS_DIR, "record_fuzzer", kvcore_record_fuzz::run_record_fuzz,
                                    kvcore_record_fuzz::coverage(), &cov, 20u);
  EXPECT_EQ(cov.inputs, inputs);
  EXPECT_GT(cov.parsed, 0);
  EXPECT_GT(cov.refused_parse, 0);
  EXPECT_GT(cov.imported_seq, 0);
  EXPECT_GT(cov.imported_batch, 0);
  EXPECT_GT(cov.imported_kinds, 0);
  EXPECT_GT(cov.refused_import, 0);
  EXPECT_GT(cov.rows_checked, 0);
  std::printf("record fuzz corpus: %ld inputs, %ld parsed, %ld refused by parse, %ld + %ld + %ld (kinds) imported, "
              "%ld imports refused, %ld rows compared\n",
              cov.inputs, cov.parsed, cov.refused_parse, cov.imported_seq, cov.imported_batch, cov.imported_kinds, cov.refused_import,
              cov.rows_checked);
}

}  // namespace
