// Export and import of one sequence (kvcore/state/) against a memcpy of the
// same bytes, for Gemma-3 shapes at 8K and 32K positions in float16: the
// record's throughput (bytes per second) and its size beside an all-flat
// cache's (counters record_bytes, flat_bytes). A SequenceCache + KVPool and a
// BatchCache (B = 16) + PagedKVPool; rows are whatever the pools hold (the
// bytes are not what is measured).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "bench_util.h"
#include "kvcore/kvcore.h"
#include "shapes.h"

namespace kvcore_bench {
namespace {

constexpr int kMaxStep = 512;

// A SequenceCache at `length` whose pool holds every row it needs.
struct SequenceFixture {
  std::unique_ptr<kvcore::SequenceCache> cache;
  std::unique_ptr<kvcore::KVPool> pool;
  std::vector<std::uint64_t> record;
  std::size_t size = 0;

  // rows = false: the pool keeps its first rows only (for export_size alone).
  SequenceFixture(const ModelShape& shape, int length, bool rows = true) {
    kvcore::CacheConfig cfg = make_config(shape, length, kMaxStep);
    cfg.initial_capacity = 16;
    cache = std::move(kvcore::SequenceCache::create(cfg)).get();
    pool.reset(new kvcore::KVPool(std::move(kvcore::KVPool::create(*cache, kvcore::DType::Float16)).get()));
    for (int l = 0; rows && l < cache->n_layers(); ++l) (void)pool->reserve(l, (*cache->geometry(l)).held_rows(length));
    while (cache->length() < length) {
      auto step = cache->begin_step(kMaxStep < length - cache->length() ? kMaxStep : length - cache->length());
      (void)cache->commit(*step);
    }
    size = *kvcore::export_size(*cache, *pool);
    if (rows) record.resize(size / 8 + 1);
  }
};

std::int64_t flat_bytes(const ModelShape& shape, int length) {
  return static_cast<std::int64_t>(shape.n_layers) * length * kv_row_bytes(shape);
}

void BM_ExportSequence(benchmark::State& state, const ModelShape& shape) {
  const int length = static_cast<int>(state.range(0));
  SequenceFixture f(shape, length);
  for (auto _ : state) {
    const kvcore::Status s = kvcore::export_to(*f.cache, *f.pool, nullptr, 0, f.record.data(), f.size);
    if (!s.ok()) fail(state, s.message().c_str());
    benchmark::DoNotOptimize(f.record.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(f.size));
}

// A record's bytes against an all-flat cache's K/V bytes at the same length
// (ring layers ship their sinks, window and rewind margin only).
void BM_RecordBytes(benchmark::State& state, const ModelShape& shape) {
  const int length = static_cast<int>(state.range(0));
  SequenceFixture f(shape, length, /*rows=*/false);
  for (auto _ : state) benchmark::DoNotOptimize(*kvcore::export_size(*f.cache, *f.pool));
  state.counters["record_bytes"] = static_cast<double>(f.size);
  state.counters["flat_bytes"] = static_cast<double>(flat_bytes(shape, length));
  state.counters["record_over_flat"] = static_cast<double>(f.size) / static_cast<double>(flat_bytes(shape, length));
}

void BM_ImportSequence(benchmark::State& state, const ModelShape& shape) {
  const int length = static_cast<int>(state.range(0));
  SequenceFixture f(shape, length);
  (void)kvcore::export_to(*f.cache, *f.pool, nullptr, 0, f.record.data(), f.size);
  for (auto _ : state) {
    f.cache->clear();
    const kvcore::Status s = kvcore::import_record(f.record.data(), f.size, *f.cache, *f.pool);
    if (!s.ok()) fail(state, s.message().c_str());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(f.size));
}

void BM_ImportIntoBatch(benchmark::State& state, const ModelShape& shape) {
  const int length = static_cast<int>(state.range(0));
  SequenceFixture f(shape, length);
  (void)kvcore::export_to(*f.cache, *f.pool, nullptr, 0, f.record.data(), f.size);
  kvcore::CacheConfig cfg = make_config(shape, length, kMaxStep);
  cfg.batch.block_size = 16;
  cfg.batch.max_seqs = 1;
  auto batch = std::move(kvcore::BatchCache::create(cfg)).get();
  auto paged = std::move(kvcore::PagedKVPool::create(*batch, kvcore::DType::Float16)).get();
  for (auto _ : state) {
    const kvcore::Status s = kvcore::import_record(f.record.data(), f.size, *batch, paged, 0);
    if (!s.ok()) fail(state, s.message().c_str());
    state.PauseTiming();
    (void)batch->release_sequence(0);
    state.ResumeTiming();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(f.size));
}

// The floor: one memcpy of as many bytes as the record holds.
void BM_MemcpyRecordBytes(benchmark::State& state, const ModelShape& shape) {
  const int length = static_cast<int>(state.range(0));
  SequenceFixture f(shape, length);
  std::vector<unsigned char> from(f.size, 1), to(f.size);
  for (auto _ : state) {
    std::memcpy(to.data(), from.data(), f.size);
    benchmark::DoNotOptimize(to.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(f.size));
}

BENCHMARK_CAPTURE(BM_ExportSequence, gemma3_1b, kGemma3_1B)->Arg(8192)->Arg(32768)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_ImportSequence, gemma3_1b, kGemma3_1B)->Arg(8192)->Arg(32768)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_ImportIntoBatch, gemma3_1b, kGemma3_1B)->Arg(8192)->Arg(32768)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_MemcpyRecordBytes, gemma3_1b, kGemma3_1B)->Arg(8192)->Arg(32768)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_RecordBytes, gemma3_1b, kGemma3_1B)->Arg(8192)->Arg(32768);
BENCHMARK_CAPTURE(BM_RecordBytes, gemma3_27b, kGemma3_27B)->Arg(8192)->Arg(32768);

}  // namespace
}  // namespace kvcore_bench
