// What every libFuzzer harness of tests/fuzz shares besides its byte reader
// (fuzz_bytes.h): the slot its coverage counters are kept in while a replay
// test (tests/cpp/*_fuzz_replay_test.cpp) runs it, and its entry point, which
// runs one input and aborts on the first violation, naming the fuzzer.
//
// A harness defines `std::string run_x_fuzz(const std::uint8_t*, std::size_t)`
// ("" when every rule held) and ends with
//   KVCORE_FUZZ_ENTRY_POINT("x_fuzzer", ns::run_x_fuzz)
// A replay test that includes the harness's .cpp defines
// KVCORE_FUZZ_NO_ENTRY_POINT first (one gtest binary holds several).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fuzz_bytes.h"

namespace kvcore_fuzz_input {

/// One input through `Harness` (Harness(Bytes&) reads it, run() drives the
/// code and checks every rule): "" when all held, else the first violation.
/// Counts the input in `cov` when a replay keeps counters.
template <class Harness, class Coverage>
std::string run_input(Coverage* cov, const int (&edges)[Bytes::kEdgeCount], const std::uint8_t* data,
                      std::size_t size) {
  if (cov != nullptr) ++cov->inputs;
  Bytes in(data, size, edges);
  Harness harness(in);
  return harness.run();
}

/// The counters a replay test points a harness at while it runs the corpus
/// (null: none kept), one slot per Coverage type.
template <class Coverage>
Coverage*& coverage_slot() {
  static Coverage* c = nullptr;
  return c;
}

/// One libFuzzer input through `run`: aborts with "fuzzer: violation" on stderr
/// when a rule broke (so libFuzzer keeps the input as a crash).
inline int fuzz_one(const char* fuzzer, std::string (*run)(const std::uint8_t*, std::size_t),
                    const std::uint8_t* data, std::size_t size) {
  const std::string err = run(data, size);
  if (!err.empty()) {
    std::fprintf(stderr, "%s: %s\n", fuzzer, err.c_str());
    std::abort();
  }
  return 0;
}

}  // namespace kvcore_fuzz_input

#ifndef KVCORE_FUZZ_NO_ENTRY_POINT
#define KVCORE_FUZZ_ENTRY_POINT(fuzzer, run)                                               \
  extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) { \
    return ::kvcore_fuzz_input::fuzz_one(fuzzer, run, data, size);                     \
  }
#else
#define KVCORE_FUZZ_ENTRY_POINT(fuzzer, run)
#endif
