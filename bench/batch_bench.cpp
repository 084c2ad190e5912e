// BatchCache on a Gemma-3-27B-shaped cache (62 layers: 52 ring W = 1024, 10
// flat, so two groups; B = 16; prefix reuse on: every step carries its token
// ids), the workloads bench/vllm_manager.py runs on vLLM's KVCacheManager
// (bench/batch_compare.py puts the two side by side):
//   batch_decode_step  one decode step of N sequences (T = 1 each, with its token
//                      id): begin_step + plan + commit. Every sequence adopted a
//                      2,000-token shared prompt, then decoded. Per sequence:
//                      step time / N.
//   batch_admit        one request with that prompt: add_sequence + adopt_prefix
//                      + the step computing its remaining tokens + plan + commit
//                      + release_sequence.
//   batch_ring_blocks  blocks one sequence holds in the ring group at a context
//                      (and the most it held on the way), against DESIGN.md
//                      section 6's bound; timed: a decode step at that context.
// C (max_step) is an argument: a ring group keeps a rewind margin of C tokens,
// so the blocks it holds depend on it.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "bench_util.h"
#include "kvcore/batch/batch_cache.h"
#include "shapes.h"

namespace kvcore_bench {
namespace {

constexpr int kBlock = 16;
constexpr int kPrompt = 2000;        // the shared prompt: tokens 100 .. 2099
constexpr int kMaxSeqs = 260;        // 256 decoding + the admission benchmark's seed
constexpr int kFlatBlocks = 20000;   // the flat group's share, like vLLM's num_blocks per group
constexpr int kWarmDecode = 64;      // decoded before blocks are counted and timing starts
constexpr int kCycle = 448;          // timed decode steps before the sequences are admitted again
constexpr int kDecodeCapacity = 4096;  // > kPrompt + kWarmDecode + kCycle

// Token ids, the same on the vLLM side (bench/vllm_manager.py).
std::int32_t prompt_token(int p) { return 100 + p; }
std::int32_t decode_token(int seq, int p) { return 3000 + (seq * 131 + p) % 20000; }

// Each sequence's token ids, by position: the prompt, then its own decode tokens.
std::vector<std::int32_t> token_row(int seq, int capacity) {
  std::vector<std::int32_t> row(static_cast<std::size_t>(capacity));
  for (int p = 0; p < capacity; ++p)
    row[static_cast<std::size_t>(p)] = p < kPrompt ? prompt_token(p) : decode_token(seq, p);
  return row;
}

struct Groups {
  int flat = -1;
  int ring = -1;
};

std::unique_ptr<kvcore::BatchCache> make_cache(benchmark::State& state, int capacity, int C,
                                               int max_seqs, Groups* groups) {
  kvcore::CacheConfig cfg = make_config(kGemma3_27B, capacity, C);
  cfg.batch.block_size = kBlock;
  cfg.batch.max_seqs = max_seqs;
  cfg.batch.max_step_tokens = max_seqs > C ? max_seqs : C;
  // One pool of both groups' 20,000 (vLLM's run: 20,000 blocks per group), one ring and one flat
  // group (page_layers = n_layers) as vLLM's "brief" grouping of bench/vllm_manager.py.
  cfg.batch.num_blocks = 2 * kFlatBlocks;
  cfg.batch.page_layers = cfg.n_layers;
  auto made = kvcore::BatchCache::create(cfg);
  if (!made.ok()) {
    fail(state, made.message().c_str());
    return nullptr;
  }
  std::unique_ptr<kvcore::BatchCache> cache = std::move(*made);
  for (int g = 0; g < cache->n_groups(); ++g) {
    auto policy = cache->group_policy(g);
    if (policy->kind == kvcore::LayerPolicy::Kind::Ring)
      groups->ring = g;
    else
      groups->flat = g;
  }
  if (cache->n_groups() != 2 || groups->ring < 0 || groups->flat < 0) {
    fail(state, "expected one ring and one flat group");
    return nullptr;
  }
  return cache;
}

bool run_step(benchmark::State& state, kvcore::BatchCache& cache, const kvcore::StepEntry* entries,
              int n) {
  auto step = cache.begin_step(entries, n);
  if (!step.ok()) return fail(state, step.message().c_str());
  auto plan = cache.plan(*step);
  if (!plan.ok()) return fail(state, plan.message().c_str());
  benchmark::DoNotOptimize(plan);
  const kvcore::Status s = cache.commit(*step);
  if (!s.ok()) return fail(state, s.message().c_str());
  return true;
}

// A request with the shared prompt: adopt the cached prefix, compute the rest
// in steps of at most C tokens. *length is the sequence's new length.
bool admit(benchmark::State& state, kvcore::BatchCache& cache, int seq,
           const std::vector<std::int32_t>& tokens, int* length) {
  kvcore::Status s = cache.add_sequence(seq);
  if (!s.ok()) return fail(state, s.message().c_str());
  auto hit = cache.adopt_prefix(seq, tokens.data(), kPrompt);
  if (!hit.ok()) return fail(state, hit.message().c_str());
  int at = *hit;
  while (at < kPrompt) {
    const int T = std::min(cache.max_step(), kPrompt - at);
    const kvcore::StepEntry entry{seq, T, tokens.data() + at};
    if (!run_step(state, cache, &entry, 1)) return false;
    at += T;
  }
  *length = at;
  return true;
}

// N decoding sequences; lengths kept by the runner, as a server does.
struct Decoders {
  std::vector<std::vector<std::int32_t>> tokens;
  std::vector<int> lengths;
  std::vector<kvcore::StepEntry> entries;

  explicit Decoders(int n) : lengths(static_cast<std::size_t>(n)), entries(static_cast<std::size_t>(n)) {
    for (int s = 0; s < n; ++s) tokens.push_back(token_row(s, kDecodeCapacity));
  }
  int n() const { return static_cast<int>(lengths.size()); }

  bool step(benchmark::State& state, kvcore::BatchCache& cache) {
    for (int s = 0; s < n(); ++s) {
      const std::size_t i = static_cast<std::size_t>(s);
      entries[i] = kvcore::StepEntry{s, 1, tokens[i].data() + lengths[i]};
    }
    if (!run_step(state, cache, entries.data(), n())) return false;
    for (int& length : lengths) ++length;
    return true;
  }

  // Every sequence admitted with the shared prompt (the first one computes it
  // when it is not cached), then kWarmDecode decode steps of all of them.
  bool start(benchmark::State& state, kvcore::BatchCache& cache) {
    for (int s = 0; s < n(); ++s)
      if (!admit(state, cache, s, tokens[static_cast<std::size_t>(s)], &lengths[static_cast<std::size_t>(s)]))
        return false;
    for (int d = 0; d < kWarmDecode; ++d)
      if (!step(state, cache)) return false;
    return true;
  }

  bool release(benchmark::State& state, kvcore::BatchCache& cache) {
    for (int s = 0; s < n(); ++s) {
      const kvcore::Status st = cache.release_sequence(s);
      if (!st.ok()) return fail(state, st.message().c_str());
    }
    return true;
  }
};

int in_use(const kvcore::BatchCache& cache, int g) { return *cache.num_blocks(g) - *cache.free_blocks(g); }

// Distinct blocks of group g holding prompt positions [0, prefix) over sequences [0, n).
int distinct_blocks(const kvcore::BatchCache& cache, int g, int n, int prefix) {
  std::set<int> blocks;
  const int* tables = cache.block_tables(g);
  for (int s = 0; s < n; ++s)
    for (int i = 0; i < prefix / kBlock; ++i) {
      const int b = tables[static_cast<std::ptrdiff_t>(s) * cache.table_stride() + i];
      if (b >= 0) blocks.insert(b);
    }
  return static_cast<int>(blocks.size());
}

// DESIGN.md section 6: ceil(S/B) + ceil((W + C - 1)/B) + 1 blocks per sequence (S = 0 sinks).
int ring_bound(int C) {
  const int W = kGemma3_27B.window;
  return (W + C - 1 + kBlock - 1) / kBlock + 1;
}

void batch_decode_step(benchmark::State& state) {
  const int N = static_cast<int>(state.range(0));
  const int C = static_cast<int>(state.range(1));
  Groups groups;
  std::unique_ptr<kvcore::BatchCache> made = make_cache(state, kDecodeCapacity, C, kMaxSeqs, &groups);
  if (!made) return;
  kvcore::BatchCache& cache = *made;
  Decoders decoders(N);
  if (!decoders.start(state, cache)) return;
  // Blocks in use at context kPrompt + kWarmDecode, as vllm_manager.py counts them.
  const int flat = in_use(cache, groups.flat);
  const int ring = in_use(cache, groups.ring);
  const int hit_prefix = (kPrompt - 1) / kBlock * kBlock;
  const int prompt_flat = distinct_blocks(cache, groups.flat, N, hit_prefix);
  const int prompt_ring = distinct_blocks(cache, groups.ring, N, hit_prefix);
  int ring_per_seq = 0;
  for (int s = 0; s < N; ++s) ring_per_seq = std::max(ring_per_seq, *cache.blocks_held(s, groups.ring));

  int steps = 0;
  for (auto _ : state) {
    if (steps == kCycle) {  // keep the context near 2K: end the sequences, admit them again
      state.PauseTiming();
      if (!decoders.release(state, cache) || !decoders.start(state, cache)) return;
      steps = 0;
      state.ResumeTiming();
    }
    if (!decoders.step(state, cache)) return;
    ++steps;
  }
  state.counters["seqs"] = N;
  state.counters["C"] = C;
  state.counters["context"] = kPrompt + kWarmDecode;
  state.counters["blocks_flat"] = flat;
  state.counters["blocks_ring"] = ring;
  state.counters["blocks_total"] = flat + ring;
  state.counters["prompt_blocks_flat"] = prompt_flat;
  state.counters["prompt_blocks_ring"] = prompt_ring;
  state.counters["ring_held_max"] = ring_per_seq;
  state.counters["ring_bound"] = ring_bound(C);
  state.counters["ns_per_seq"] = benchmark::Counter(
      static_cast<double>(N), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

void batch_admit(benchmark::State& state) {
  const int C = static_cast<int>(state.range(0));
  Groups groups;
  std::unique_ptr<kvcore::BatchCache> made = make_cache(state, kDecodeCapacity, C, kMaxSeqs, &groups);
  if (!made) return;
  kvcore::BatchCache& cache = *made;
  // Sequence 0 computed the prompt and is still running; requests come and go as sequence 1.
  const std::vector<std::int32_t> tokens = token_row(1, kDecodeCapacity);
  int length = 0;
  if (!admit(state, cache, 0, tokens, &length)) return;
  for (auto _ : state) {
    if (!admit(state, cache, 1, tokens, &length)) return;
    const kvcore::Status s = cache.release_sequence(1);
    if (!s.ok()) { fail(state, s.message().c_str()); return; }
  }
  // One more, counted while it runs.
  if (!cache.add_sequence(1).ok()) { fail(state, "add_sequence failed"); return; }
  auto hit = cache.adopt_prefix(1, tokens.data(), kPrompt);
  if (!hit.ok()) { fail(state, hit.message().c_str()); return; }
  const kvcore::StepEntry entry{1, kPrompt - *hit, tokens.data() + *hit};
  if (!run_step(state, cache, &entry, 1)) return;
  state.counters["C"] = C;
  state.counters["hit_tokens"] = *hit;
  state.counters["computed_tokens"] = kPrompt - *hit;
  state.counters["blocks_flat"] = in_use(cache, groups.flat);
  state.counters["blocks_ring"] = in_use(cache, groups.ring);
  state.counters["blocks_total"] = in_use(cache, groups.flat) + in_use(cache, groups.ring);
}

// One sequence grown to `context` in chunks of C with token ids, then decoded:
// the blocks it holds in the ring group after every begin_step and commit.
void batch_ring_blocks(benchmark::State& state) {
  const int context = static_cast<int>(state.range(0));
  const int C = static_cast<int>(state.range(1));
  const int kTimedSteps = 1000;
  const int capacity = context + kTimedSteps + 1;
  Groups groups;
  std::unique_ptr<kvcore::BatchCache> made = make_cache(state, capacity, C, 1, &groups);
  if (!made) return;
  kvcore::BatchCache& cache = *made;
  const std::vector<std::int32_t> tokens = token_row(0, capacity);
  if (!cache.add_sequence(0).ok()) { fail(state, "add_sequence failed"); return; }
  int held_max = 0;         // after any begin_step or commit
  int held_max_decode = 0;  // ... of a decode step (T = 1)
  int length = 0;
  auto grow = [&](int T) {
    const kvcore::StepEntry entry{0, T, tokens.data() + length};
    auto step = cache.begin_step(&entry, 1);
    if (!step.ok()) return fail(state, step.message().c_str());
    const int begun = *cache.blocks_held(0, groups.ring);
    if (!cache.commit(*step).ok()) return fail(state, "commit failed");
    const int most = std::max(begun, *cache.blocks_held(0, groups.ring));
    held_max = std::max(held_max, most);
    if (T == 1) held_max_decode = std::max(held_max_decode, most);
    length += T;
    return true;
  };
  const int decoded = 64;
  while (length < context - decoded)
    if (!grow(std::min(C, context - decoded - length))) return;
  while (length < context)
    if (!grow(1)) return;
  const int held = *cache.blocks_held(0, groups.ring);
  const int held_flat = *cache.blocks_held(0, groups.flat);
  for (auto _ : state)
    if (!grow(1)) return;
  state.counters["context"] = context;
  state.counters["C"] = C;
  state.counters["ring_held"] = held;
  state.counters["ring_held_max"] = held_max;
  state.counters["ring_held_max_decode"] = held_max_decode;
  state.counters["ring_bound"] = ring_bound(C);
  state.counters["flat_held"] = held_flat;
}

// C = 1: no rewind margin beyond the step (the 16 tokens left after a prefix hit
// are computed in 16 steps); C = 16: the smallest C that computes them in one
// step, as in batch_admit; C = 512: the default max_step, a prefill chunk.
BENCHMARK(batch_decode_step)->ArgNames({"seqs", "C"})->ArgsProduct({{1, 16, 64, 256}, {1, 16, 512}});
BENCHMARK(batch_admit)->ArgName("C")->Arg(16)->Arg(512);
// Fixed iterations: the timed decode steps must stay below the capacity.
BENCHMARK(batch_ring_blocks)
    ->ArgNames({"context", "C"})
    ->ArgsProduct({{2048, 8192, 32768}, {1, 16, 512}})
    ->Iterations(1000);

}  // namespace
}  // namespace kvcore_bench
