// Planning cost of a whole step for a Gemma-3-27B-shaped cache (62 layers,
// five ring : one flat): begin_step + plan(every layer) + commit, against a
// memcpy of that step's new K/V bytes into cache-cold rows (the least any
// backend must spend).
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "bench_util.h"
#include "kvcore/core/sequence_cache.h"
#include "shapes.h"

namespace kvcore_bench {
namespace {

constexpr int kMaxStep = 512;
// Large enough that the loop rarely hits capacity (then it clears, which is cheap).
constexpr int kPlanCapacity = 1 << 30;

// A Gemma-3-27B cache decoded past its window, so ring layers plan wrapped
// reads from the first timed step; nullptr (the run marked failed) on error.
std::unique_ptr<kvcore::SequenceCache> warmed_cache(benchmark::State& state, const ModelShape& shape) {
  auto made = kvcore::SequenceCache::create(make_config(shape, kPlanCapacity, kMaxStep));
  if (!made.ok()) { fail(state, made.message().c_str()); return nullptr; }
  std::unique_ptr<kvcore::SequenceCache> cache = std::move(*made);
  while (cache->length() < 4 * shape.window) {
    auto step = cache->begin_step(kMaxStep);
    if (!step.ok() || !cache->commit(*step).ok()) { fail(state, "warm-up step failed"); return nullptr; }
  }
  return cache;
}

void plan_step(benchmark::State& state) {
  const ModelShape& shape = kGemma3_27B;
  const int T = static_cast<int>(state.range(0));
  std::unique_ptr<kvcore::SequenceCache> warmed = warmed_cache(state, shape);
  if (!warmed) return;
  kvcore::SequenceCache& cache = *warmed;
  for (auto _ : state) {
    if (!cache.can_extend(T)) cache.clear();
    auto step = cache.begin_step(T);
    if (!step.ok()) { fail(state, step.message().c_str()); return; }
    for (int l = 0; l < shape.n_layers; ++l) {
      auto plan = cache.plan(l, *step);
      if (!plan.ok()) { fail(state, plan.message().c_str()); return; }
      benchmark::DoNotOptimize(plan);
    }
    if (!cache.commit(*step).ok()) { fail(state, "commit failed"); return; }
  }
  state.counters["layers"] = shape.n_layers;
}

// The same step through the faces a backend holds (CacheBase::as_control /
// as_planner: virtual calls, as from a cache found in the registry).
void plan_step_faces(benchmark::State& state) {
  const ModelShape& shape = kGemma3_27B;
  const int T = static_cast<int>(state.range(0));
  std::unique_ptr<kvcore::SequenceCache> warmed = warmed_cache(state, shape);
  if (!warmed) return;
  kvcore::CacheBase* base = warmed.get();
  benchmark::DoNotOptimize(base);  // the compiler may not see the concrete class
  kvcore::SequenceControl& control = *base->as_control();
  kvcore::SequencePlanner& planner = *base->as_planner();
  const int n_layers = planner.n_layers();
  for (auto _ : state) {
    if (!control.can_extend(T)) control.clear();
    auto step = control.begin_step(T);
    if (!step.ok()) { fail(state, step.message().c_str()); return; }
    for (int l = 0; l < n_layers; ++l) {
      auto plan = planner.plan(l, *step);
      if (!plan.ok()) { fail(state, plan.message().c_str()); return; }
      benchmark::DoNotOptimize(plan);
    }
    if (!control.commit(*step).ok()) { fail(state, "commit failed"); return; }
  }
  state.counters["layers"] = shape.n_layers;
}

// The same step planned the way a backend can use SequenceCache's policy
// sharing: one plan per distinct policy (two for Gemma 3), then every layer's
// plan by group_of(layer). Plans are pure, so these are the same plans.
void plan_step_shared(benchmark::State& state) {
  const ModelShape& shape = kGemma3_27B;
  const int T = static_cast<int>(state.range(0));
  std::unique_ptr<kvcore::SequenceCache> warmed = warmed_cache(state, shape);
  if (!warmed) return;
  kvcore::SequenceCache& cache = *warmed;
  std::vector<int> first_layer(static_cast<std::size_t>(cache.n_groups()), -1);
  for (int l = 0; l < shape.n_layers; ++l)
    if (first_layer[static_cast<std::size_t>(cache.group_of(l))] < 0)
      first_layer[static_cast<std::size_t>(cache.group_of(l))] = l;
  std::vector<kvcore::SeqStepPlan> by_policy(first_layer.size());
  for (auto _ : state) {
    if (!cache.can_extend(T)) cache.clear();
    auto step = cache.begin_step(T);
    if (!step.ok()) { fail(state, step.message().c_str()); return; }
    for (std::size_t p = 0; p < first_layer.size(); ++p) {
      auto plan = cache.plan(first_layer[p], *step);
      if (!plan.ok()) { fail(state, plan.message().c_str()); return; }
      by_policy[p] = *plan;
    }
    for (int l = 0; l < shape.n_layers; ++l) {
      kvcore::SeqStepPlan plan = by_policy[static_cast<std::size_t>(cache.group_of(l))];
      benchmark::DoNotOptimize(plan);
    }
    if (!cache.commit(*step).ok()) { fail(state, "commit failed"); return; }
  }
  state.counters["layers"] = shape.n_layers;
}

// The step's new K/V rows of every layer, copied once: the copy floor. Like a
// cache, each step writes rows it has not written lately: every layer's
// destination advances through a block far larger than the last-level cache.
void memcpy_step_kv(benchmark::State& state) {
  const ModelShape& shape = kGemma3_27B;
  const std::size_t step_bytes = static_cast<std::size_t>(state.range(0) * kv_row_bytes(shape));
  constexpr std::size_t kLayerBlock = std::size_t{4} << 20;  // 62 x 4 MiB >> L3
  const std::size_t steps_per_block = kLayerBlock / step_bytes > 2 ? kLayerBlock / step_bytes : 2;
  const std::size_t layer_bytes = step_bytes * steps_per_block;
  const std::vector<unsigned char> src = filled(step_bytes);
  std::vector<unsigned char> dst =
      filled(layer_bytes * static_cast<std::size_t>(shape.n_layers), 7);
  std::size_t slot = 0;
  for (auto _ : state) {
    unsigned char* at = dst.data() + step_bytes * slot;
    for (int l = 0; l < shape.n_layers; ++l, at += layer_bytes)
      std::memcpy(at, src.data(), step_bytes);
    slot = slot + 1 == steps_per_block ? 0 : slot + 1;
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(step_bytes) * shape.n_layers);
}

BENCHMARK(plan_step)->ArgName("T")->Arg(1)->Arg(512);
BENCHMARK(plan_step_faces)->ArgName("T")->Arg(1)->Arg(512);
BENCHMARK(plan_step_shared)->ArgName("T")->Arg(1)->Arg(512);
BENCHMARK(memcpy_step_kv)->ArgName("T")->Arg(1)->Arg(512);

}  // namespace
}  // namespace kvcore_bench
