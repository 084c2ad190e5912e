// The loop every fuzz replay test runs (fuzz_replay_test.cpp,
// batch_fuzz_replay_test.cpp, tree_fuzz_replay_test.cpp, record_fuzz_replay_test.cpp): each input of a
// committed corpus through the fuzzer's harness, its coverage counters
// summed, a failure naming the input and how to rerun it.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "corpus_files.h"

namespace kvcore_test {

/// Runs every input of the corpus at `dir` through `run` ("" when it held)
/// with `*slot` pointing at `cov` meanwhile; at most 5 failures are reported.
/// Fails when the corpus has fewer than `min_inputs` inputs. Returns how many
/// inputs it ran.
template <class Coverage>
long replay_corpus(const std::string& dir, const char* fuzzer, std::string (*run)(const std::uint8_t*, std::size_t),
                   Coverage*& slot, Coverage* cov, std::size_t min_inputs) {
  const std::vector<std::string> files = corpus_files(dir);
  EXPECT_GE(files.size(), min_inputs) << "the corpus at " << dir << " is missing or tiny";
  slot = cov;
  int failures = 0;
  for (const std::string& path : files) {
    std::vector<std::uint8_t> data;
    if (!read_file(path, &data)) {
      ADD_FAILURE() << "cannot read " << path;
      break;
    }
    const std::string err = run(data.data(), data.size());
    if (!err.empty()) {
      ADD_FAILURE() << path << " (rerun: " << fuzzer << " " << path << "): " << err;
      if (++failures == 5) break;
    }
  }
  slot = nullptr;
  return static_cast<long>(files.size());
}

}  // namespace kvcore_test
