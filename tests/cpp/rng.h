// Test-only random numbers: splitmix64, tiny, and the same sequence on every
// platform and library, so a seed reproduces a case anywhere.
#pragma once

#include <cstdint>

namespace kvcore_test {

class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  /// Uniform in [lo, hi] (the modulo bias is irrelevant here).
  int uniform(int lo, int hi) {
    return lo + static_cast<int>(next() % static_cast<std::uint64_t>(hi - lo + 1));
  }
  bool percent(int p) { return uniform(0, 99) < p; }

 private:
  std::uint64_t state_;
};

}  // namespace kvcore_test
