// Uniform draws for the random tests that are the same on every standard library.
//
// The standard fixes what std::mt19937 and std::mt19937_64 output for a seed
// (their 10000th output is specified), but not how std::uniform_int_distribution,
// std::uniform_real_distribution or std::shuffle turn that output into numbers:
// libstdc++, libc++ and MSVC's STL draw different cases from one seed, and a
// minimum-count check tuned on one library (at least N prefix hits, M forks...)
// may fail on another for no fault of the code. These draws use only the
// engine's output and integer arithmetic written here, so a seed means one case
// everywhere (tests/cpp/support/uniform_test.cpp pins the first draws).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

namespace kvcore_test {

/// Uniform in [0, n), n >= 1, from a 32-bit (std::mt19937) or 64-bit
/// (std::mt19937_64) engine: the engine's word modulo n, rejecting the words
/// of the last partial run of n (so every residue is equally likely).
template <class Engine>
std::uint64_t below(Engine& rng, std::uint64_t n) {
  static_assert(Engine::min() == 0, "an engine whose outputs start at 0");
  static_assert(Engine::max() == 0xFFFFFFFFull || Engine::max() == ~0ull, "a 32-bit or 64-bit engine");
  if constexpr (Engine::max() == 0xFFFFFFFFull) {
    const std::uint64_t span = 1ull << 32;
    const std::uint64_t limit = span - span % n;  // a multiple of n (n <= 2^32)
    for (;;) {
      const std::uint64_t r = static_cast<std::uint64_t>(rng());
      if (r < limit) return r % n;
    }
  }
  const std::uint64_t reject = (0 - n) % n;  // 2^64 mod n: [reject, 2^64) holds whole runs of n
  for (;;) {
    const std::uint64_t r = static_cast<std::uint64_t>(rng());
    if (r >= reject) return r % n;
  }
}

/// Uniform in [lo, hi] (inclusive), lo <= hi.
template <class Engine>
int uniform_int(Engine& rng, int lo, int hi) {
  const std::uint64_t n = static_cast<std::uint64_t>(static_cast<std::int64_t>(hi) - lo) + 1;
  return static_cast<int>(static_cast<std::int64_t>(lo) + static_cast<std::int64_t>(below(rng, n)));
}

/// Uniform in [lo, hi]: one of 2^24 evenly spaced values (a float's precision).
template <class Engine>
float uniform_float(Engine& rng, float lo, float hi) {
  const float u = static_cast<float>(below(rng, 1ull << 24)) * (1.0f / 16777216.0f);  // exact
  return lo + (hi - lo) * u;
}

/// Fisher-Yates, from the last element down, with `below`.
template <class RandomIt, class Engine>
void shuffle(RandomIt first, RandomIt last, Engine& rng) {
  const std::ptrdiff_t n = last - first;
  for (std::ptrdiff_t i = n - 1; i > 0; --i) {
    const std::ptrdiff_t j = static_cast<std::ptrdiff_t>(below(rng, static_cast<std::uint64_t>(i) + 1));
    using std::swap;
    swap(first[i], first[j]);
  }
}

}  // namespace kvcore_test
