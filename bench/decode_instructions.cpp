// The C++ core's cost of a many-sequence decode step, for instruction counts
// (callgrind): bench/batch_bench.cpp's decode workload (Gemma-3-27B shape, 62
// layers: 52 ring W = 1024, 10 flat; B = 16; C = 16; token ids given). N
// sequences adopt a cached 2,000-token prompt, decode 64 steps, then STEPS
// more; run_steps() holds only the decode steps (begin_step + plan + commit,
// and the entries' refill), so
//   valgrind --tool=callgrind --toggle-collect='*run_steps*' ./decode N STEPS
// counts (64 + STEPS) x N sequence-steps. Also prints wall-clock ns per
// sequence per step of the STEPS (noisy on a shared machine).
//
// Standalone (not part of the suite): build it against any checkout's headers
// to compare versions, e.g. main's before a change:
//   g++ -std=c++17 -O2 -Icpp/include -Ibench bench/decode_instructions.cpp -o /tmp/decode
//   mkdir -p /tmp/main && git archive main cpp/include | tar -x -C /tmp/main
//   g++ -std=c++17 -O2 -I/tmp/main/cpp/include -Ibench bench/decode_instructions.cpp -o /tmp/decode_main
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kvcore/batch/batch_cache.h"
#include "shapes.h"

namespace {

constexpr int kPrompt = 2000;
constexpr int kCapacity = 4096;
constexpr int kMaxStep = 16;

std::int32_t token(int seq, int p) { return p < kPrompt ? 100 + p : 3000 + (seq * 131 + p) % 20000; }

void check(const kvcore::Status& s) {
  if (s.ok()) return;
  std::fprintf(stderr, "%s\n", s.message().c_str());
  std::exit(1);
}

__attribute__((noinline)) void run_steps(kvcore::BatchCache& cache, std::vector<kvcore::StepEntry>& entries,
                                         const std::vector<std::vector<std::int32_t>>& rows, std::vector<int>& lengths,
                                         int steps) {
  const int n = static_cast<int>(lengths.size());
  for (int k = 0; k < steps; ++k) {
    for (int s = 0; s < n; ++s) entries[s] = kvcore::StepEntry{s, 1, rows[s].data() + lengths[s]};
    auto step = cache.begin_step(entries.data(), n);
    check(step.status());
    auto plan = cache.plan(*step);
    check(plan.status());
    asm volatile("" : : "r"(plan->groups) : "memory");
    check(cache.commit(*step));
    for (int& length : lengths) ++length;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 64;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 136;
  if (n < 1 || n > 256 || steps < 0 || kPrompt + 64 + steps > kCapacity) {
    std::fprintf(stderr, "usage: decode [N in 1..256] [STEPS in 0..%d]\n", kCapacity - kPrompt - 64);
    return 2;
  }
  kvcore::CacheConfig cfg = kvcore_bench::make_config(kvcore_bench::kGemma3_27B, kCapacity, kMaxStep);
  cfg.batch.block_size = 16;
  cfg.batch.max_seqs = 260;
  cfg.batch.max_step_tokens = 260;
  cfg.batch.num_blocks = 40000;
  auto made = kvcore::BatchCache::create(cfg);
  check(made.status());
  kvcore::BatchCache& cache = **made;
  std::vector<std::vector<std::int32_t>> rows(n, std::vector<std::int32_t>(kCapacity));
  for (int s = 0; s < n; ++s)
    for (int p = 0; p < kCapacity; ++p) rows[s][p] = token(s, p);
  std::vector<int> lengths(n);
  std::vector<kvcore::StepEntry> entries(n);
  for (int s = 0; s < n; ++s) {
    check(cache.add_sequence(s));
    auto hit = cache.adopt_prefix(s, rows[s].data(), kPrompt);
    check(hit.status());
    int at = *hit;
    while (at < kPrompt) {
      const int T = kPrompt - at < kMaxStep ? kPrompt - at : kMaxStep;
      const kvcore::StepEntry one{s, T, rows[s].data() + at};
      auto step = cache.begin_step(&one, 1);
      check(step.status());
      check(cache.commit(*step));
      at += T;
    }
    lengths[s] = at;
  }
  run_steps(cache, entries, rows, lengths, 64);
  const auto t0 = std::chrono::steady_clock::now();
  run_steps(cache, entries, rows, lengths, steps);
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  std::printf("N = %d, %d + %d decode steps (sequence-steps for callgrind: %d); %.1f ns per sequence per step\n", n, 64,
              steps, (64 + steps) * n, steps > 0 ? ns / steps / n : 0.0);
  return 0;
}
