// KVPool per step for a Gemma-3-1B-shaped cache (26 layers, 1 KV head x 256,
// window 512, float16): write the step's rows, gather or view what the step
// reads, each against a memcpy of exactly the same bytes.
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "bench_util.h"
#include "kvcore/pool/kv_pool.h"
#include "kvcore/core/sequence_cache.h"
#include "shapes.h"

namespace kvcore_bench {
namespace {

constexpr int kMaxStep = 512;
constexpr int kWriteCapacity = 16384;
constexpr kvcore::DType kDType = kvcore::DType::Float16;
const ModelShape& kShape = kGemma3_1B;

// A cache and a pool with every layer's storage reserved up front (no growth
// inside a measurement).
struct Fixture {
  std::unique_ptr<kvcore::SequenceCache> cache;
  std::unique_ptr<kvcore::KVPool> pool;
};

bool make_fixture(benchmark::State& state, int capacity, Fixture* out,
                  kvcore::RingStorage storage = kvcore::RingStorage::Compact) {
  auto cache = kvcore::SequenceCache::create(make_config(kShape, capacity, kMaxStep));
  if (!cache.ok()) return fail(state, cache.message().c_str());
  auto pool = kvcore::KVPool::create(**cache, kDType, kvcore::PoolAllocator::heap(), storage);
  if (!pool.ok()) return fail(state, pool.message().c_str());
  out->cache = std::move(*cache);
  out->pool.reset(new kvcore::KVPool(std::move(*pool)));
  for (int l = 0; l < kShape.n_layers; ++l) {
    const kvcore::Status s = out->pool->reserve(l, *out->cache->rows(l));
    if (!s.ok()) return fail(state, s.message().c_str());
  }
  return true;
}

std::size_t k_row() { return static_cast<std::size_t>(kv_row_bytes(kShape) / 2); }

// One step of T rows into every layer; the step stays begun (uncommitted).
bool write_step(benchmark::State& state, Fixture& f, int T, const unsigned char* k,
                const unsigned char* v, kvcore::Step* step_out) {
  auto step = f.cache->begin_step(T);
  if (!step.ok()) return fail(state, step.message().c_str());
  const std::size_t bytes = k_row() * static_cast<std::size_t>(T);
  for (int l = 0; l < kShape.n_layers; ++l) {
    auto plan = f.cache->plan(l, *step);
    if (!plan.ok()) return fail(state, plan.message().c_str());
    const kvcore::Status s = f.pool->write(l, *plan, k, bytes, v, bytes);
    if (!s.ok()) return fail(state, s.message().c_str());
  }
  *step_out = *step;
  return true;
}

// Fills positions [0, context) in max_step chunks, then begins (and writes) a
// one-token step at `context`: the decode step whose reads are measured.
bool decode_step_at(benchmark::State& state, Fixture& f, int context, kvcore::Step* step) {
  const std::vector<unsigned char> k = filled(k_row() * kMaxStep, 3);
  const std::vector<unsigned char> v = filled(k_row() * kMaxStep, 5);
  while (f.cache->length() < context) {
    const int T = context - f.cache->length() < kMaxStep ? context - f.cache->length() : kMaxStep;
    if (!write_step(state, f, T, k.data(), v.data(), step)) return false;
    if (!f.cache->commit(*step).ok()) return fail(state, "commit failed");
  }
  return write_step(state, f, 1, k.data(), v.data(), step);
}

void write_steps(benchmark::State& state, kvcore::RingStorage storage) {
  const int T = static_cast<int>(state.range(0));
  Fixture f;
  if (!make_fixture(state, kWriteCapacity, &f, storage)) return;
  const std::vector<unsigned char> k = filled(k_row() * static_cast<std::size_t>(T), 3);
  const std::vector<unsigned char> v = filled(k_row() * static_cast<std::size_t>(T), 5);
  kvcore::Step step;
  for (auto _ : state) {
    if (!f.cache->can_extend(T)) f.cache->clear();
    if (!write_step(state, f, T, k.data(), v.data(), &step)) return;
    if (!f.cache->commit(step).ok()) { fail(state, "commit failed"); return; }
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * T *
                          kv_row_bytes(kShape) * kShape.n_layers);
}

void pool_write_step(benchmark::State& state) { write_steps(state, kvcore::RingStorage::Compact); }

// With mirrored rings a write that lands in a ring's first R - 1 rows is copied twice.
void pool_write_step_mirrored(benchmark::State& state) {
  write_steps(state, kvcore::RingStorage::Mirrored);
}

// Floor for pool_write_step: the same rows copied into per-layer blocks of the
// same size as the pool's, at the same advancing offsets.
void memcpy_write_step(benchmark::State& state) {
  const int T = static_cast<int>(state.range(0));
  Fixture f;
  if (!make_fixture(state, kWriteCapacity, &f)) return;
  const std::size_t bytes = k_row() * static_cast<std::size_t>(T);
  const std::vector<unsigned char> k = filled(bytes, 3);
  const std::vector<unsigned char> v = filled(bytes, 5);
  std::vector<std::vector<unsigned char>> dst_k, dst_v;
  std::vector<int> rows;
  for (int l = 0; l < kShape.n_layers; ++l) {
    rows.push_back(*f.cache->rows(l));
    dst_k.push_back(filled(k_row() * static_cast<std::size_t>(rows.back()), 7));
    dst_v.push_back(filled(k_row() * static_cast<std::size_t>(rows.back()), 9));
  }
  f.pool.reset();  // only its shape was needed
  std::int64_t position = 0;
  for (auto _ : state) {
    if (position + T > kWriteCapacity) position = 0;
    for (int l = 0; l < kShape.n_layers; ++l) {
      const std::size_t row = static_cast<std::size_t>(position % (rows[l] - T + 1));
      std::memcpy(dst_k[l].data() + row * k_row(), k.data(), bytes);
      std::memcpy(dst_v[l].data() + row * k_row(), v.data(), bytes);
    }
    position += T;
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * T *
                          kv_row_bytes(kShape) * kShape.n_layers);
}

// Every layer's read of one decode step, gathered into contiguous buffers.
void pool_gather_step(benchmark::State& state) {
  const int context = static_cast<int>(state.range(0));
  Fixture f;
  kvcore::Step step;
  if (!make_fixture(state, context + kMaxStep, &f) || !decode_step_at(state, f, context, &step))
    return;
  std::vector<kvcore::SeqStepPlan> plans;
  std::size_t most = 0, total = 0;
  for (int l = 0; l < kShape.n_layers; ++l) {
    plans.push_back(*f.cache->plan(l, step));
    const std::size_t bytes = k_row() * static_cast<std::size_t>(plans.back().read_len());
    most = bytes > most ? bytes : most;
    total += 2 * bytes;
  }
  std::vector<unsigned char> k_out = filled(most), v_out = filled(most);
  for (auto _ : state) {
    for (int l = 0; l < kShape.n_layers; ++l) {
      const kvcore::SeqStepPlan& plan = plans[static_cast<std::size_t>(l)];
      const kvcore::Status s = f.pool->gather(l, plan, k_out.data(), most, v_out.data(), most);
      if (!s.ok()) { fail(state, s.message().c_str()); return; }
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * total));
}

// Floor for pool_gather_step: the same number of bytes per layer, copied
// from the layer's storage in one piece.
void memcpy_gather_step(benchmark::State& state) {
  const int context = static_cast<int>(state.range(0));
  Fixture f;
  kvcore::Step step;
  if (!make_fixture(state, context + kMaxStep, &f) || !decode_step_at(state, f, context, &step))
    return;
  std::vector<const unsigned char*> k_src, v_src;
  std::vector<std::size_t> bytes;
  std::size_t most = 0, total = 0;
  for (int l = 0; l < kShape.n_layers; ++l) {
    const kvcore::PoolLayer layer = *f.pool->layer(l);
    k_src.push_back(layer.k);
    v_src.push_back(layer.v);
    bytes.push_back(k_row() * static_cast<std::size_t>(f.cache->plan(l, step)->read_len()));
    most = bytes.back() > most ? bytes.back() : most;
    total += 2 * bytes.back();
  }
  std::vector<unsigned char> k_out = filled(most), v_out = filled(most);
  for (auto _ : state) {
    for (std::size_t l = 0; l < bytes.size(); ++l) {
      std::memcpy(k_out.data(), k_src[l], bytes[l]);
      std::memcpy(v_out.data(), v_src[l], bytes[l]);
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * total));
}

// Every layer's read of one decode step as zero-copy spans (no bytes move).
void views_steps(benchmark::State& state, kvcore::RingStorage storage) {
  const int context = static_cast<int>(state.range(0));
  Fixture f;
  kvcore::Step step;
  if (!make_fixture(state, context + kMaxStep, &f, storage) ||
      !decode_step_at(state, f, context, &step))
    return;
  std::vector<kvcore::SeqStepPlan> plans;
  for (int l = 0; l < kShape.n_layers; ++l) plans.push_back(*f.cache->plan(l, step));
  for (auto _ : state) {
    for (int l = 0; l < kShape.n_layers; ++l) {
      auto views = f.pool->views(l, plans[static_cast<std::size_t>(l)]);
      if (!views.ok()) { fail(state, views.message().c_str()); return; }
      benchmark::DoNotOptimize(views);
    }
  }
}

void pool_views_step(benchmark::State& state) { views_steps(state, kvcore::RingStorage::Compact); }

// One span per layer: what a backend needing contiguous K/V can use without a gather.
void pool_views_step_mirrored(benchmark::State& state) {
  views_steps(state, kvcore::RingStorage::Mirrored);
}

BENCHMARK(pool_write_step)->ArgName("T")->Arg(1)->Arg(512);
BENCHMARK(pool_write_step_mirrored)->ArgName("T")->Arg(1)->Arg(512);
BENCHMARK(memcpy_write_step)->ArgName("T")->Arg(1)->Arg(512);
BENCHMARK(pool_gather_step)->ArgName("context")->Arg(1024)->Arg(4096)->Arg(16384);
BENCHMARK(memcpy_gather_step)->ArgName("context")->Arg(1024)->Arg(4096)->Arg(16384);
BENCHMARK(pool_views_step)->ArgName("context")->Arg(1024)->Arg(4096)->Arg(16384);
BENCHMARK(pool_views_step_mirrored)->ArgName("context")->Arg(1024)->Arg(4096)->Arg(16384);

}  // namespace
}  // namespace kvcore_bench
