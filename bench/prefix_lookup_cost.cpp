// What long prompts cost on a large pool: a 4M-block BatchCache (one Flat
// layer, B = 16) caches 40 prompts of 100,000 tokens, computed in 4,096-token
// steps; then lookup_prefix of a cached prompt (its whole hit), and
// adopt_prefix with no lookup before it. Printed: each commit's cost per
// prompt, release_sequence's, adopt_prefix's (mean) and lookup_prefix's
// (median and spread over 200 calls), in microseconds. The pool's key table
// and block records are far larger than any CPU cache, as a server's are, so
// this measures the lookups' cache misses as much as their hashing.
//
// Standalone (not part of the suite), to compare versions side by side:
//   g++ -std=c++17 -O2 -Icpp/include bench/prefix_lookup_cost.cpp -o /tmp/lookup && /tmp/lookup
//   mkdir -p /tmp/before && git archive HEAD~1 cpp/include | tar -x -C /tmp/before
//   g++ -std=c++17 -O2 -I/tmp/before/cpp/include bench/prefix_lookup_cost.cpp -o /tmp/lookup_before
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "kvcore/batch/batch_cache.h"

namespace {

constexpr int kB = 16, kStep = 4096, kPrompts = 40, kLen = 100000;

double us_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main() {
  kvcore::CacheConfig cfg;
  cfg.capacity = 131072;
  cfg.max_step = kStep;
  cfg.n_layers = 1;
  cfg.layers.push_back(kvcore::LayerConfig{kvcore::LayerPolicy::flat(), 1, 8, 0});
  cfg.batch.block_size = kB;
  cfg.batch.max_seqs = 4;
  cfg.batch.num_blocks = 1 << 22;
  cfg.batch.max_step_tokens = kStep;
  auto created = kvcore::BatchCache::create(cfg);
  if (!created.ok()) {
    std::printf("create: %s\n", created.message().c_str());
    return 1;
  }
  kvcore::BatchCache& cache = **created;
  std::vector<std::vector<std::int32_t>> prompts(kPrompts, std::vector<std::int32_t>(kLen));
  std::uint64_t s = 1;
  for (auto& p : prompts)
    for (auto& t : p) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      t = static_cast<std::int32_t>(s >> 34);
    }

  double commit_us = 0, release_us = 0, adopt_us = 0;
  for (const auto& p : prompts) {
    (void)cache.add_sequence(0);
    for (int at = 0; at < kLen; at += kStep) {
      const kvcore::StepEntry e{0, std::min(kStep, kLen - at), p.data() + at};
      auto step = cache.begin_step(&e, 1);
      if (!step.ok()) {
        std::printf("begin_step: %s\n", step.message().c_str());
        return 1;
      }
      const auto t0 = std::chrono::steady_clock::now();
      (void)cache.commit(*step);
      commit_us += us_since(t0);
    }
    const auto t0 = std::chrono::steady_clock::now();
    (void)cache.release_sequence(0);
    release_us += us_since(t0);
  }
  for (int r = 0; r < kPrompts; ++r) {
    (void)cache.add_sequence(1);
    const auto t0 = std::chrono::steady_clock::now();
    (void)cache.adopt_prefix(1, prompts[static_cast<std::size_t>(r * 13 % kPrompts)].data(), kLen);
    adopt_us += us_since(t0);
    (void)cache.release_sequence(1);
  }
  std::vector<double> lookup_us;
  for (int rep = 0; rep < 200; ++rep) {
    const auto& p = prompts[static_cast<std::size_t>(rep * 7 % kPrompts)];
    const auto t0 = std::chrono::steady_clock::now();
    auto hit = cache.lookup_prefix(p.data(), kLen, 0);
    lookup_us.push_back(us_since(t0));
    if (!hit.ok() || *hit != (kLen - 1) / kB * kB) {
      std::printf("lookup_prefix: hit %d, expected %d\n", hit.ok() ? *hit : -1, (kLen - 1) / kB * kB);
      return 1;
    }
  }
  std::sort(lookup_us.begin(), lookup_us.end());
  std::printf("a %d-token prompt, B = %d, %d blocks: commits %.0f us, release_sequence %.0f us, "
              "adopt_prefix (no lookup before) %.0f us; lookup_prefix median %.0f us (p10 %.0f, p90 %.0f)\n",
              kLen, kB, cfg.batch.num_blocks, commit_us / kPrompts, release_us / kPrompts, adopt_us / kPrompts,
              lookup_us[lookup_us.size() / 2], lookup_us[lookup_us.size() / 10], lookup_us[lookup_us.size() * 9 / 10]);
  return 0;
}
