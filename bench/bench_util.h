// Helpers shared by the micro-benchmarks: failing a benchmark loudly (the
// smoke test relies on a non-zero exit) and byte buffers that are touched
// before timing starts, so page faults never land inside a measurement.
#pragma once

#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstring>
#include <vector>

namespace kvcore_bench {

/// Set when any benchmark failed; main() then exits 1.
inline bool& failed() {
  static bool flag = false;
  return flag;
}

/// Marks the run failed and stops this benchmark with `message`; false, so a
/// setup helper can `return fail(...)`.
inline bool fail(benchmark::State& state, const char* message) {
  failed() = true;
  state.SkipWithError(message);
  return false;
}

/// `bytes` of storage filled with a byte pattern (pages faulted in now).
inline std::vector<unsigned char> filled(std::size_t bytes, unsigned char seed = 1) {
  std::vector<unsigned char> out(bytes);
  for (std::size_t i = 0; i < bytes; ++i) out[i] = static_cast<unsigned char>(seed + i * 31u);
  return out;
}

}  // namespace kvcore_bench
