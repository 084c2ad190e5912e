// BatchCache draft trees on the Gemma-3-27B shape of batch_bench.cpp (62
// layers: 52 ring W = 1024, 10 flat, two groups; B = 16): 256 sequences at
// 1,500 positions each step 64 new tokens, as draft trees or as chains.
//   BM_BatchTreePlan/tree:1   begin_step of 256 trees of 64 nodes (a binary
//                             tree: node i's parent (i - 1) / 2, depth 6) +
//                             plan + abort
//   BM_BatchTreePlan/tree:0   the same with chains of 64 tokens
//   BM_BatchTreeCommit/path:N begin_step + plan + commit of an accepted path
//                             of m = 6 nodes (0: main line, 1: off the main
//                             line, 2: a chain's prefix) + rewind back: counters
//                             give the row copies per accepted token, per group
// Per iteration: one step of 256 x 64 = 16,384 tokens.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "bench_util.h"
#include "kvcore/batch/batch_cache.h"
#include "shapes.h"

namespace kvcore_bench {
namespace {

constexpr int kSeqs = 256;
constexpr int kNodes = 64;
constexpr int kLength = 1500;
constexpr int kBlock = 16;

struct TreeRig {
  std::unique_ptr<kvcore::BatchCache> cache;
  std::vector<int> tree_parents, chain_parents;
  std::vector<std::int32_t> tokens;
  std::vector<kvcore::StepEntry> trees, chains;
};

bool build(benchmark::State& state, TreeRig* rig) {
  kvcore::CacheConfig cfg = make_config(kGemma3_27B, 4096, kNodes);
  cfg.batch.block_size = kBlock;
  cfg.batch.max_seqs = kSeqs;
  cfg.batch.max_step_tokens = kSeqs * kNodes;
  // One pool: every sequence's flat table and as many again for the ring group's windows; one
  // ring and one flat group (page_layers = n_layers), as the per-group counts below divide by 2.
  cfg.batch.num_blocks = 2 * kSeqs * (4096 / kBlock);
  cfg.batch.page_layers = cfg.n_layers;
  auto made = kvcore::BatchCache::create(cfg);
  if (!made.ok()) return fail(state, made.message().c_str());
  rig->cache = std::move(made).get();
  for (int i = 0; i < kNodes; ++i) {
    rig->tree_parents.push_back(i == 0 ? -1 : (i - 1) / 2);
    rig->chain_parents.push_back(i - 1);
  }
  rig->tokens.resize(kLength + kNodes);
  for (int p = 0; p < kLength + kNodes; ++p) rig->tokens[static_cast<std::size_t>(p)] = 1000 + p % 7919;
  for (int s = 0; s < kSeqs; ++s) {
    if (!rig->cache->add_sequence(s).ok()) return fail(state, "add_sequence");
    for (int at = 0; at < kLength; at += kNodes) {
      const int T = kLength - at < kNodes ? kLength - at : kNodes;
      const kvcore::StepEntry e{s, T, rig->tokens.data() + at, nullptr};
      auto step = rig->cache->begin_step(&e, 1);
      if (!step.ok() || !rig->cache->commit(*step).ok()) return fail(state, "prefill");
    }
    rig->trees.push_back(kvcore::StepEntry{s, kNodes, rig->tokens.data() + kLength, rig->tree_parents.data()});
    rig->chains.push_back(kvcore::StepEntry{s, kNodes, rig->tokens.data() + kLength, nullptr});
  }
  return true;
}

void BM_BatchTreePlan(benchmark::State& state) {
  TreeRig rig;
  if (!build(state, &rig)) return;
  const bool tree = state.range(0) == 1;
  const std::vector<kvcore::StepEntry>& entries = tree ? rig.trees : rig.chains;
  for (auto _ : state) {
    auto step = rig.cache->begin_step(entries.data(), kSeqs);
    auto plan = rig.cache->plan(*step);
    benchmark::DoNotOptimize(plan->groups[0].slots);
    if (!rig.cache->abort(*step).ok()) return (void)fail(state, "abort");
  }
  state.SetItemsProcessed(state.iterations() * kSeqs * kNodes);
  state.SetLabel(tree ? "256 trees of 64 nodes" : "256 chains of 64 tokens");
}
BENCHMARK(BM_BatchTreePlan)->ArgName("tree")->Arg(1)->Arg(0)->Unit(benchmark::kMicrosecond);

// 0: the tree's main line (0, 1, 3, 7, 15, 31); 1: off it (0, 2, 6, 14, 30, 62);
// 2: a chain's first 6 tokens.
void BM_BatchTreeCommit(benchmark::State& state) {
  TreeRig rig;
  if (!build(state, &rig)) return;
  const int which = static_cast<int>(state.range(0));
  static const int kMain[6] = {0, 1, 3, 7, 15, 31}, kOff[6] = {0, 2, 6, 14, 30, 62}, kChain[6] = {0, 1, 2, 3, 4, 5};
  const int* path = which == 0 ? kMain : which == 1 ? kOff : kChain;
  const std::vector<kvcore::StepEntry>& entries = which == 2 ? rig.chains : rig.trees;
  std::vector<kvcore::AcceptedPath> accepted;
  for (int s = 0; s < kSeqs; ++s) accepted.push_back(kvcore::AcceptedPath{s, path, 6});
  long copies = 0;
  for (auto _ : state) {
    auto step = rig.cache->begin_step(entries.data(), kSeqs);
    auto plan = rig.cache->plan(*step);
    benchmark::DoNotOptimize(plan->groups[0].slots);
    auto done = rig.cache->commit(*step, accepted.data(), kSeqs);
    if (!done.ok()) return (void)fail(state, done.message().c_str());
    copies += done->total_copies();
    for (int s = 0; s < kSeqs; ++s)
      if (!rig.cache->rewind(s, kLength).ok()) return (void)fail(state, "rewind");
  }
  state.counters["copies_per_accepted_token_per_group"] =
      static_cast<double>(copies) / static_cast<double>(state.iterations()) / (kSeqs * 6.0 * 2);
  state.SetItemsProcessed(state.iterations() * kSeqs * kNodes);
  state.SetLabel(which == 0 ? "main line, m = 6" : which == 1 ? "off the main line, m = 6" : "chain prefix, m = 6");
}
BENCHMARK(BM_BatchTreeCommit)->ArgName("path")->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kvcore_bench
