// Planning cost of a whole step for a Gemma-3-27B-shaped cache (62 layers,
// five ring : one flat): begin_step + plan(every layer) + commit, against a
// memcpy of that step's new K/V bytes (the least any backend must spend).
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstring>
#include <memory>
#include <vector>

#include "bench_util.h"
#include "kvcore/sequence_cache.h"
#include "shapes.h"

namespace kvcore_bench {
namespace {

constexpr int kMaxStep = 512;
// Large enough that the loop rarely hits capacity (then it clears, which is cheap).
constexpr int kPlanCapacity = 1 << 30;

void plan_step(benchmark::State& state) {
  const ModelShape& shape = kGemma3_27B;
  const int T = static_cast<int>(state.range(0));
  auto made = kvcore::SequenceCache::create(make_config(shape, kPlanCapacity, kMaxStep));
  if (!made.ok()) { fail(state, made.message()); return; }
  kvcore::SequenceCache& cache = **made;
  // Start past the window: ring layers plan wrapped reads from the first step.
  while (cache.length() < 4 * shape.window) {
    auto step = cache.begin_step(kMaxStep);
    if (!step.ok() || !cache.commit(*step).ok()) { fail(state, "warm-up step failed"); return; }
  }
  for (auto _ : state) {
    if (!cache.can_extend(T)) cache.clear();
    auto step = cache.begin_step(T);
    if (!step.ok()) { fail(state, step.message()); return; }
    for (int l = 0; l < shape.n_layers; ++l) {
      auto plan = cache.plan(l, *step);
      if (!plan.ok()) { fail(state, plan.message()); return; }
      benchmark::DoNotOptimize(plan);
    }
    if (!cache.commit(*step).ok()) { fail(state, "commit failed"); return; }
  }
  state.counters["layers"] = shape.n_layers;
}

// The step's new K/V rows of every layer, copied once: the copy floor.
void memcpy_step_kv(benchmark::State& state) {
  const ModelShape& shape = kGemma3_27B;
  const std::size_t step_bytes = static_cast<std::size_t>(state.range(0) * kv_row_bytes(shape));
  const std::vector<unsigned char> src = filled(step_bytes);
  std::vector<unsigned char> dst = filled(step_bytes * static_cast<std::size_t>(shape.n_layers), 7);
  for (auto _ : state) {
    for (int l = 0; l < shape.n_layers; ++l)
      std::memcpy(dst.data() + step_bytes * static_cast<std::size_t>(l), src.data(), step_bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(step_bytes) * shape.n_layers);
}

BENCHMARK(plan_step)->ArgName("T")->Arg(1)->Arg(512);
BENCHMARK(memcpy_step_kv)->ArgName("T")->Arg(1)->Arg(512);

}  // namespace
}  // namespace kvcore_bench
