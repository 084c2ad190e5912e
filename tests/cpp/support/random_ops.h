// The random-op loop the batch tests drive a cache with (batch_brute_force_test,
// paged_kv_pool_test): each op rolls a number in [0, 100) and runs the first
// op of a table whose bound is above it, so a test states its mix of verbs as
// a table and shares the loop, its stop at the first failure and its trace.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <string>

namespace kvcore_test {

/// The seeds a random test runs, [first, last]: 1 to `last` (> 1), or only
/// the seed the environment variable `env` names (to rerun a failing one).
struct Seeds {
  std::uint32_t first;
  std::uint32_t last;
};
inline Seeds seeds_from_env(const char* env, std::uint32_t last) {
  const char* only = std::getenv(env);
  if (only == nullptr) return Seeds{1, last};
  const std::uint32_t seed = static_cast<std::uint32_t>(std::atoi(only));
  return Seeds{seed, seed};
}

/// One kind of op of `Driver`: run when the roll is below `below` (and no
/// earlier op's bound).
template <class Driver>
struct RandomOp {
  int below;
  void (Driver::*run)();
};

/// Runs `ops` random ops of `d` (which has int pick(lo, hi), inclusive), each
/// followed by `after` when given; stops at the first gtest failure. Each
/// failure is traced with its op's number and roll.
template <class Driver>
void run_random_ops(Driver& d, int ops, std::initializer_list<RandomOp<Driver>> table,
                    void (Driver::*after)() = nullptr) {
  for (int op = 0; op < ops && !::testing::Test::HasFailure(); ++op) {
    const int what = d.pick(0, 99);
    SCOPED_TRACE("op " + std::to_string(op) + " (" + std::to_string(what) + ")");
    const RandomOp<Driver>* chosen = nullptr;
    for (const RandomOp<Driver>& o : table) {
      chosen = &o;
      if (what < o.below) break;
    }
    (d.*(chosen->run))();
    if (after != nullptr) (d.*after)();
  }
}

}  // namespace kvcore_test
