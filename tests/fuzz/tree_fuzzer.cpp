// libFuzzer harness for BatchCache draft trees (DESIGN.md section 7): bytes ->
// a small config (flat and ring groups with sinks, B in 1, 2, 4, 16, 64,
// max_step up to 16) and a run of operations on the twin of
// tests/cpp/batch_tree_reference.h (tree steps with random trees and accepted
// paths, aborts, forks, rewinds, prefix reuse, all checked against a cache
// decoding the accepted chains, every node's read against the rule), mixed
// with raw `parents` and `accepted` arrays straight from the bytes: each is
// refused with InvalidArgument, changing nothing, exactly when it breaks the
// rules (stated here, not read from the code).
//
// Fuzz build: tests/fuzz/CMakeLists.txt (clang, -fsanitize=fuzzer,address,undefined).
// The same source compiles into the gtest binary (tests/cpp/tree_fuzz_replay_test.cpp,
// which defines KVCORE_FUZZ_NO_ENTRY_POINT), replaying tests/fuzz/tree_corpus.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "fuzz_bytes.h"
#include "fuzz_harness.h"
#include "kvcore/batch/batch_cache.h"
#include "../cpp/batch_reference.h"
#include "../cpp/batch_tree_reference.h"

namespace kvcore_tree_fuzz {

using kvcore::BatchCache;
using kvcore::CacheConfig;
using kvcore::LayerConfig;
using kvcore::LayerPolicy;
using kvcore_fuzz_input::Bytes;

constexpr int kEdges[Bytes::kEdgeCount] = {-2, -1, 0, 1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 32, 33};

struct BytePick {
  Bytes* bytes;
  int operator()(int lo, int hi) const { return bytes->in(lo, hi); }
};

/// What the corpus reached, summed (the replay test checks it reaches each).
struct Coverage {
  long inputs = 0;
  kvcore_test::TreeCoverage twin;
  long raw_trees_refused = 0;
  long raw_trees_taken = 0;
  long raw_paths_refused = 0;
  long raw_paths_taken = 0;
};
inline Coverage*& coverage() { return kvcore_fuzz_input::coverage_slot<Coverage>(); }

inline CacheConfig config_from(Bytes& in) {
  static const int kBlocks[5] = {1, 2, 4, 16, 64};
  CacheConfig cfg;
  cfg.batch.block_size = kBlocks[in.in(0, 4)];
  cfg.max_step = in.in(1, 16);
  cfg.capacity = in.in(cfg.max_step, 3 * cfg.batch.block_size + 48);
  cfg.n_layers = in.in(1, 3);
  for (int l = 0; l < cfg.n_layers; ++l) {
    const LayerPolicy p = in.percent(40) ? LayerPolicy::flat() : LayerPolicy::ring(in.in(1, 9), in.percent(40) ? in.in(1, 3) : 0);
    cfg.layers.push_back(LayerConfig{p, 1, 2, 0});
  }
  cfg.batch.max_seqs = in.in(1, 4);
  cfg.batch.num_blocks = 3 * cfg.batch.max_seqs * ((cfg.capacity + cfg.batch.block_size - 1) / cfg.batch.block_size);
  return cfg;
}

// A tree from raw bytes: valid exactly when parents[0] = -1 and 0 <= parents[i] < i.
inline std::string raw_tree(BatchCache& cache, Bytes& in, Coverage& cov) {
  const int seq = in.in(0, cache.max_seqs() - 1);
  const kvcore::SequenceInfo info = *cache.sequence(seq);
  if (!info.active || info.length + cache.max_step() > cache.capacity()) return "";
  const int n = in.in(1, cache.max_step());
  std::vector<int> parents(static_cast<std::size_t>(n));
  bool valid = true;
  for (int i = 0; i < n; ++i) {
    parents[static_cast<std::size_t>(i)] = in.percent(80) ? (i == 0 ? -1 : in.in(0, i - 1)) : in.edgy();
    const int p = parents[static_cast<std::size_t>(i)];
    valid = valid && (i == 0 ? p == -1 : (p >= 0 && p < i));
  }
  const kvcore_test::Snapshot before = kvcore_test::snapshot(cache);
  const kvcore::StepEntry e{seq, n, nullptr, parents.data()};
  kvcore::Result<kvcore::BatchStep> step = cache.begin_step(&e, 1);
  if (!valid) {
    ++cov.raw_trees_refused;
    if (step.error() != kvcore::Error::InvalidArgument) return "a bad tree was not refused";
    return kvcore_test::snapshot(cache) == before ? "" : "a refused tree changed the cache";
  }
  if (!step.ok()) return step.error() == kvcore::Error::OutOfResources ? "" : "a valid tree was refused";
  ++cov.raw_trees_taken;
  // A raw accepted path: valid exactly when it starts at 0, each node the
  // child of the one before, 1 <= m <= n.
  const int m = in.in(0, n + 1);
  std::vector<int> path(static_cast<std::size_t>(m));
  bool root_path = m >= 1 && m <= n;
  for (int d = 0; d < m; ++d) {
    path[static_cast<std::size_t>(d)] = in.percent(70) ? in.in(0, n - 1) : in.edgy();
    const int node = path[static_cast<std::size_t>(d)];
    const int want = d == 0 ? -1 : path[static_cast<std::size_t>(d - 1)];
    root_path = root_path && node >= 0 && node < n && parents[static_cast<std::size_t>(node)] == want;
  }
  const kvcore_test::Snapshot begun = kvcore_test::snapshot(cache);
  const kvcore::AcceptedPath accepted{seq, path.data(), m};
  kvcore::Result<kvcore::BatchCommit> done = cache.commit(*step, &accepted, 1);
  if (root_path) {
    ++cov.raw_paths_taken;
    return done.ok() && cache.sequence(seq)->length == info.length + m ? "" : "a root path was refused";
  }
  ++cov.raw_paths_refused;
  if (done.error() != kvcore::Error::InvalidArgument) return "a bad accepted path was not refused";
  if (!(kvcore_test::snapshot(cache) == begun) || !cache.check_step(*step).ok()) return "a refused path changed the cache";
  return cache.abort(*step).ok() ? "" : "abort";
}

/// Runs one input; "" or the first broken rule.
inline std::string run_tree_fuzz(const std::uint8_t* data, std::size_t size) {
  Bytes in(data, size, kEdges);
  Coverage local;
  Coverage& cov = coverage() != nullptr ? *coverage() : local;
  ++cov.inputs;
  const CacheConfig cfg = config_from(in);
  kvcore_test::TreeTwin<BytePick> twin(cfg, BytePick{&in});
  std::unique_ptr<BatchCache> raw = std::move(BatchCache::create(cfg)).get();
  for (int s = 0; s < cfg.batch.max_seqs; ++s)
    if (!raw->add_sequence(s).ok()) return "add_sequence";
  std::string err;
  for (int op = 0; op < 400 && !in.done() && err.empty(); ++op)
    err = in.percent(85) ? twin.step() : raw_tree(*raw, in, cov);
  const kvcore_test::TreeCoverage& t = twin.coverage();
  cov.twin.trees += t.trees;
  cov.twin.commits += t.commits;
  cov.twin.off_main += t.off_main;
  cov.twin.copies += t.copies;
  cov.twin.nodes_checked += t.nodes_checked;
  cov.twin.refused += t.refused;
  cov.twin.aborted += t.aborted;
  cov.twin.prefix_hits += t.prefix_hits;
  cov.twin.forks += t.forks;
  cov.twin.rewinds += t.rewinds;
  return err;
}

}  // namespace kvcore_tree_fuzz

KVCORE_FUZZ_ENTRY_POINT("tree_fuzzer", kvcore_tree_fuzz::run_tree_fuzz)
