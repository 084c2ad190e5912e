// BatchCache draft trees (DESIGN.md section 7) against the brute-force twin of
// batch_tree_reference.h on thousands of random trees per configuration (flat,
// ring with and without sinks, mixed; B in 1, 16, 64; trees after the wrap,
// forks, rewinds and prefix reuse around them), a chain given as a tree
// against a plain step, and every error path giving InvalidArgument with
// nothing changed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "batch_reference.h"
#include "batch_tree_reference.h"
#include "kvcore/batch/batch_cache.h"
#include "kvcore/pool/paged_kv_pool.h"
#include "support/uniform.h"

namespace kvcore_test {
namespace {

using kvcore::AcceptedPath;
using kvcore::BatchCache;
using kvcore::BatchStep;
using kvcore::CacheConfig;
using kvcore::Error;
using kvcore::LayerConfig;
using kvcore::LayerPolicy;
using kvcore::StepEntry;

CacheConfig tree_config(std::vector<LayerPolicy> policies, int B, int capacity, int max_step) {
  CacheConfig cfg;
  cfg.capacity = capacity;
  cfg.max_step = max_step;
  cfg.n_layers = static_cast<int>(policies.size());
  for (const LayerPolicy& p : policies) cfg.layers.push_back(LayerConfig{p, 1, 2, 0});
  cfg.batch.block_size = B;
  cfg.batch.max_seqs = 4;
  // Room for every held and cached block: a tree reserves the blocks of a
  // chain of N, and where a pool runs short that reservation reclaims cached
  // prefixes a chain of m would have kept (docs/batch.md), which the twins
  // would then disagree on.
  cfg.batch.num_blocks = 3 * cfg.batch.max_seqs * ((capacity + B - 1) / B);
  return cfg;
}

struct RandomPick {
  std::mt19937* rng;
  int operator()(int lo, int hi) const { return kvcore_test::uniform_int(*rng, lo, hi); }
};

// Runs the twin for `ops` operations on each of `seeds` seeds; returns the coverage.
TreeCoverage run_twin(const CacheConfig& cfg, int seeds, int ops) {
  TreeCoverage total;
  for (int seed = 1; seed <= seeds; ++seed) {
    std::mt19937 rng(static_cast<std::uint32_t>(seed * 7919));
    TreeTwin<RandomPick> twin(cfg, RandomPick{&rng});
    for (int op = 0; op < ops; ++op) {
      const std::string err = twin.step();
      if (!err.empty()) {
        ADD_FAILURE() << "seed " << seed << " op " << op << ": " << err;
        return total;
      }
    }
    const TreeCoverage& c = twin.coverage();
    total.trees += c.trees;
    total.commits += c.commits;
    total.off_main += c.off_main;
    total.copies += c.copies;
    total.nodes_checked += c.nodes_checked;
    total.refused += c.refused;
    total.aborted += c.aborted;
    total.prefix_hits += c.prefix_hits;
    total.forks += c.forks;
    total.rewinds += c.rewinds;
    total.exhausted += c.exhausted;
  }
  std::printf("trees %ld, commits %ld (off the main line %ld, copies %ld), nodes checked %ld, refused %ld, "
              "aborted %ld, prefix hits %ld, forks %ld, rewinds %ld\n",
              total.trees, total.commits, total.off_main, total.copies, total.nodes_checked, total.refused,
              total.aborted, total.prefix_hits, total.forks, total.rewinds);
  return total;
}

void expect_covered(const TreeCoverage& c, bool hits) {
  // The smallest of the 18 runs measured 2026-12-05 (support/uniform.h's draws): 3,409 trees,
  // 862 commits off the main line; the other counts only need to be reached.
  EXPECT_GE(c.trees, 1000);
  EXPECT_GT(c.off_main, 100);
  EXPECT_GT(c.copies, 0);
  EXPECT_GT(c.refused, 0);
  EXPECT_GT(c.aborted, 0);
  EXPECT_GT(c.forks, 0);
  EXPECT_GT(c.rewinds, 0);
  if (hits) {
    EXPECT_GT(c.prefix_hits, 0);
  }
}

class TreeTwinByBlock : public ::testing::TestWithParam<int> {};

TEST_P(TreeTwinByBlock, FlatGroup) {
  const int B = GetParam();
  expect_covered(run_twin(tree_config({LayerPolicy::flat()}, B, 6 * B + 40, 8), 4, 2000), B <= 16);
}

TEST_P(TreeTwinByBlock, RingAfterTheWrapWithFlat) {
  const int B = GetParam();
  expect_covered(run_twin(tree_config({LayerPolicy::ring(5, 0), LayerPolicy::flat()}, B, 6 * B + 60, 8), 4, 2000),
                 B <= 16);
}

TEST_P(TreeTwinByBlock, RingWithSinks) {
  const int B = GetParam();
  expect_covered(run_twin(tree_config({LayerPolicy::ring(7, 2), LayerPolicy::ring(3, 1)}, B, 6 * B + 60, 12), 4, 2000),
                 B <= 16);
}

TEST_P(TreeTwinByBlock, WindowOfOneAndWideTrees) {
  const int B = GetParam();
  expect_covered(run_twin(tree_config({LayerPolicy::ring(1, 0), LayerPolicy::ring(2, 3)}, B, 6 * B + 60, 16), 4, 2000),
                 B <= 16);
}

// Section 9: a chunked group (its chunk boundaries fall inside trees) and a
// shared layer reading it, beside a flat group.
TEST_P(TreeTwinByBlock, ChunkedSharedAndFlat) {
  const int B = GetParam();
  expect_covered(run_twin(tree_config({LayerPolicy::chunked(5), LayerPolicy::flat(), LayerPolicy::shared(0)}, B,
                                      6 * B + 60, 8),
                          4, 2000),
                 B <= 16);
}

TEST_P(TreeTwinByBlock, ChunksOfOneAndThreeWithRing) {
  const int B = GetParam();
  expect_covered(run_twin(tree_config({LayerPolicy::chunked(1), LayerPolicy::chunked(3), LayerPolicy::shared(1),
                                       LayerPolicy::ring(2, 1)},
                                      B, 6 * B + 60, 12),
                          4, 2000),
                 B <= 16);
}

INSTANTIATE_TEST_SUITE_P(BlockSizes, TreeTwinByBlock, ::testing::Values(1, 16, 64));

// A cache with one active sequence at length 5 (tokens 0..4), ring and flat groups.
std::unique_ptr<BatchCache> small_cache(int max_step = 6) {
  CacheConfig cfg = tree_config({LayerPolicy::ring(3, 1), LayerPolicy::flat()}, 2, 40, max_step);
  std::unique_ptr<BatchCache> c = std::move(BatchCache::create(cfg)).get();
  EXPECT_TRUE(c->add_sequence(0).ok());
  EXPECT_TRUE(c->add_sequence(1).ok());
  const std::int32_t tokens[5] = {0, 1, 2, 3, 4};
  const StepEntry e{0, 5, tokens, nullptr};
  const BatchStep step = *c->begin_step(&e, 1);
  EXPECT_TRUE(c->commit(step).ok());
  return c;
}

TEST(BatchTreeErrors, BadTreesAreRefusedAndChangeNothing) {
  std::unique_ptr<BatchCache> c = small_cache();
  const Snapshot before = snapshot(*c);
  const std::int32_t tokens[7] = {0};
  const std::vector<std::vector<int>> bad = {
      {0, 0, 1},       // parents[0] is not -1
      {-1, 0, -1},     // a second root
      {-1, 1, 0},      // not topological: parents[1] = 1
      {-1, 0, 3, 1},   // not topological: a later parent
      {-1, 0, -2},     // out of range
  };
  for (const std::vector<int>& parents : bad) {
    const StepEntry e{0, static_cast<int>(parents.size()), tokens, parents.data()};
    EXPECT_EQ(c->begin_step(&e, 1).error(), Error::InvalidArgument);
    EXPECT_TRUE(snapshot(*c) == before);
  }
  const int seven[7] = {-1, 0, 0, 0, 0, 0, 0};
  const StepEntry too_big{0, 7, tokens, seven};  // N above C = 6
  EXPECT_EQ(c->begin_step(&too_big, 1).error(), Error::InvalidArgument);
  const StepEntry empty{0, 0, tokens, seven};  // N of 0
  EXPECT_EQ(c->begin_step(&empty, 1).error(), Error::InvalidArgument);
  EXPECT_TRUE(snapshot(*c) == before);
  // A begun step stays begun when a bad one is refused.
  const int ok_tree[3] = {-1, 0, 0};
  const StepEntry good{0, 3, tokens, ok_tree};
  const BatchStep step = *c->begin_step(&good, 1);
  const StepEntry bad_entry{0, 3, tokens, bad[1].data()};
  EXPECT_EQ(c->begin_step(&bad_entry, 1).error(), Error::InvalidArgument);
  EXPECT_TRUE(c->check_step(step).ok());
}

TEST(BatchTreeErrors, TreesWhoseMasksPassTheStepBuffersAreRefused) {
  // max_step 512 over max_step_tokens 512: masks of 512 x 8 words (trees of up to 256 nodes always fit).
  CacheConfig cfg = tree_config({LayerPolicy::flat()}, 16, 1024, 512);
  cfg.batch.max_step_tokens = 512;
  std::unique_ptr<BatchCache> c = std::move(BatchCache::create(cfg)).get();
  ASSERT_TRUE(c->add_sequence(0).ok());
  std::vector<int> parents(512);
  for (int i = 0; i < 512; ++i) parents[static_cast<std::size_t>(i)] = i == 0 ? -1 : (i - 1) / 2;
  const Snapshot before = snapshot(*c);
  const StepEntry big{0, 512, nullptr, parents.data()};
  EXPECT_EQ(c->begin_step(&big, 1).error(), Error::InvalidArgument);  // 512 x 16 words
  EXPECT_TRUE(snapshot(*c) == before);
  const StepEntry fits{0, 256, nullptr, parents.data()};
  EXPECT_TRUE(c->begin_step(&fits, 1).ok());
  for (int i = 0; i < 512; ++i) parents[static_cast<std::size_t>(i)] = i - 1;  // a chain needs no mask
  EXPECT_TRUE(c->begin_step(&big, 1).ok());
}

TEST(BatchTreeErrors, BadAcceptedPathsAreRefusedAndChangeNothing) {
  std::unique_ptr<BatchCache> c = small_cache();
  const std::int32_t tokens[5] = {7, 8, 9, 10, 11};
  const int parents[5] = {-1, 0, 0, 1, 2};
  const int chain[2] = {-1, 0};
  const StepEntry entries[2] = {{0, 5, tokens, parents}, {1, 2, tokens, chain}};
  const BatchStep step = *c->begin_step(entries, 2);
  const Snapshot before = snapshot(*c);
  const kvcore::BatchStepPlan plan_before = *c->plan(step);
  const PlanCopy plan_copy = copy_of(plan_before);
  const int not_root[2] = {1, 3};
  const int not_path[3] = {0, 1, 4};
  const int out_of_range[2] = {0, 5};
  const int negative[2] = {0, -1};
  const int good[3] = {0, 2, 4};
  const std::vector<std::vector<AcceptedPath>> bad = {
      {{0, not_root, 2}},                // does not start at the root
      {{0, not_path, 3}},                // 4 is not a child of 1
      {{0, out_of_range, 2}},            // an index out of range
      {{0, negative, 2}},                // a negative index
      {{0, good, 0}},                    // m of 0
      {{0, good, 6}},                    // m above N
      {{0, good, 3}, {0, good, 3}},      // a sequence twice
      {{0, good, 3}, {2, good, 1}},      // a sequence not in the step
      {{0, good, 3}, {99, good, 1}},     // a sequence out of range
      {{1, good, 1}},                    // the tree entry has no path
      {{0, nullptr, 2}},                 // nodes null
  };
  for (const std::vector<AcceptedPath>& paths : bad) {
    EXPECT_EQ(c->commit(step, paths.data(), static_cast<int>(paths.size())).error(), Error::InvalidArgument);
    EXPECT_TRUE(snapshot(*c) == before);
    EXPECT_TRUE(c->check_step(step).ok());
    EXPECT_TRUE(copy_of(*c->plan(step)) == plan_copy);
  }
  EXPECT_EQ(c->commit(step, nullptr, 1).error(), Error::InvalidArgument);
  const AcceptedPath one{0, good, 3};
  EXPECT_EQ(c->commit(step, &one, -1).error(), Error::InvalidArgument);
  EXPECT_EQ(c->commit(step).code(), Error::InvalidArgument);  // a tree step committed as a chain
  EXPECT_TRUE(snapshot(*c) == before);
  // Then the right commit works: node 2 then 4 accepted, off the main line.
  const AcceptedPath right{0, good, 3};
  const kvcore::BatchCommit done = *c->commit(step, &right, 1);
  EXPECT_EQ(c->sequence(0)->length, 8);
  EXPECT_EQ(c->sequence(1)->length, 2);  // the chain entry committed whole
  for (int g = 0; g < done.n_groups; ++g) EXPECT_EQ(done.groups[g].n_copies, 2);
  // A stale step.
  EXPECT_EQ(c->commit(step, &right, 1).error(), Error::InvalidState);
}

TEST(BatchTree, AChainGivenAsATreeGivesTodaysPlans) {
  std::unique_ptr<BatchCache> a = small_cache(), b = small_cache();
  const std::int32_t tokens[6] = {5, 6, 7, 8, 9, 10};
  const int chain[6] = {-1, 0, 1, 2, 3, 4};
  for (int n = 1; n <= 6; ++n) {
    const StepEntry plain[2] = {{0, n, tokens, nullptr}, {1, 7 - n, tokens, nullptr}};
    const StepEntry tree[2] = {{0, n, tokens, chain}, {1, 7 - n, tokens, chain}};
    const BatchStep sa = *a->begin_step(plain, 2), sb = *b->begin_step(tree, 2);
    const kvcore::BatchStepPlan pa = *a->plan(sa), pb = *b->plan(sb);
    EXPECT_TRUE(copy_of(pa) == copy_of(pb)) << n;
    for (int t = 0; t < pa.n_tokens; ++t) {
      EXPECT_EQ(pa.positions[t], pb.positions[t]);
      EXPECT_EQ(pb.chain_index[t], t < n ? t : t - n);
    }
    EXPECT_FALSE(pb.is_tree(0));
    EXPECT_FALSE(pb.is_tree(1));
    EXPECT_TRUE(a->commit(sa).ok());
    EXPECT_TRUE(b->commit(sb).ok());  // a chain commits whole without a path
    EXPECT_TRUE(snapshot(*a) == snapshot(*b)) << n;
  }
}

TEST(BatchTree, MainLineCommitsCopyNothingAndRejectedBlocksReturn) {
  std::unique_ptr<BatchCache> c = small_cache();  // B = 2, length 5
  const std::int32_t tokens[6] = {1, 2, 3, 4, 5, 6};
  const int parents[6] = {-1, 0, 1, 2, 0, 4};  // main line 0-1-2-3, a branch 4-5
  const StepEntry e{0, 6, tokens, parents};
  // One pool for both groups: free_blocks is the pool's, held_blocks(1) the flat group's.
  const int free_before = *c->free_blocks(1), held_before = *c->held_blocks(1);
  const BatchStep step = *c->begin_step(&e, 1);
  const kvcore::BatchStepPlan plan = *c->plan(step);
  EXPECT_TRUE(plan.is_tree(0));
  const int positions[6] = {5, 6, 7, 8, 6, 7};
  const int places[6] = {0, 1, 2, 3, 4, 5};
  for (int j = 0; j < 6; ++j) {
    EXPECT_EQ(plan.positions[j], positions[j]);
    EXPECT_EQ(plan.chain_index[j], places[j]);
  }
  EXPECT_EQ(*c->held_blocks(1), held_before + 3);  // positions 5..10: blocks 2 (shared start), 3, 4, 5
  // The ring(3, 1) group takes the same 3 (with C = 6 it releases nothing
  // inside a step): 6 of the pool's blocks.
  EXPECT_EQ(*c->free_blocks(1), free_before - 2 * 3);
  const int main_path[2] = {0, 1};
  const AcceptedPath path{0, main_path, 2};
  const kvcore::BatchCommit done = *c->commit(step, &path, 1);
  EXPECT_EQ(done.total_copies(), 0);
  EXPECT_EQ(c->sequence(0)->length, 7);
  EXPECT_EQ(*c->held_blocks(1), held_before + 1);  // block 3 (positions 6, 7) kept, 4 and 5 returned
  // In each group (the ring's floor 7 - 6 - 3 + 1 < 0 releases nothing).
  EXPECT_EQ(*c->free_blocks(1), free_before - 2 * 1);
}

// Section 7's visibility with removed positions: a node sees its history by
// the rule at its own position, never a removed position, and of the tree only
// itself and its ancestors within the window (ring(3, 1): sink 0, window 3).
TEST(BatchTree, TreeNodesNeverSeeRemovedPositions) {
  std::unique_ptr<BatchCache> c = small_cache();  // length 5, B = 2
  ASSERT_TRUE(c->remove(0, 1, 2).ok());
  ASSERT_TRUE(c->remove(0, 3, 4).ok());  // in the ring's window of the root (q = 5)
  const int parents[4] = {-1, 0, 0, 1};  // positions 5, 6, 6, 7; node 2 is node 1's sibling
  const StepEntry e{0, 4, nullptr, parents};
  const BatchStep step = *c->begin_step(&e, 1);
  const kvcore::BatchStepPlan plan = *c->plan(step);
  const int positions[4] = {5, 6, 6, 7};
  const bool ancestor_or_self[4][4] = {{1, 0, 0, 0}, {1, 1, 0, 0}, {1, 0, 1, 0}, {1, 1, 0, 1}};
  for (int g = 0; g < plan.n_groups; ++g) {
    const kvcore::GroupPlan& gp = plan.groups[g];
    const int rows = *c->used_blocks(g) * plan.block_size;
    std::vector<unsigned char> mask(static_cast<std::size_t>(plan.n_tokens) * rows);
    ASSERT_TRUE(kvcore::fill_step_mask(plan, g, rows, mask.data()).ok());
    const int* table = gp.block_tables;  // seq 0's row
    for (int j = 0; j < 4; ++j) {
      std::vector<unsigned char> want(static_cast<std::size_t>(rows), 0);
      for (int k : {0, 2, 4})  // 1 and 3 were removed
        if (gp.policy.sees(positions[j], k)) want[static_cast<std::size_t>(table[k / 2] * 2 + k % 2)] = 1;
      for (int a = 0; a < 4; ++a)
        if (ancestor_or_self[j][a] && gp.policy.sees(positions[j], positions[a]))
          want[static_cast<std::size_t>(gp.slots[a])] = 1;
      for (int k : {1, 3}) {  // the removed positions' rows, where a block still holds them
        const int block = table[k / 2];
        if (block < 0) continue;
        EXPECT_EQ(mask[static_cast<std::size_t>(j * rows + block * 2 + k % 2)], 0) << "group " << g << " node " << j << " position " << k;
      }
      EXPECT_TRUE(std::equal(want.begin(), want.end(), mask.begin() + static_cast<std::ptrdiff_t>(j) * rows))
          << "group " << g << " node " << j;
    }
  }
  // Hand-worked: the flat group's root sees history 0, 2, 4; the ring's root (window [3, 5]) sees 0 and 4.
  const int flat = plan.groups[0].policy == LayerPolicy::flat() ? 0 : 1;
  const int root_rows[2] = {*c->used_blocks(0) * 2, *c->used_blocks(1) * 2};
  for (int g = 0; g < 2; ++g) {
    std::vector<unsigned char> mask(static_cast<std::size_t>(plan.n_tokens) * root_rows[g]);
    ASSERT_TRUE(kvcore::fill_step_mask(plan, g, root_rows[g], mask.data()).ok());
    const int* table = plan.groups[g].block_tables;
    int seen = 0;
    for (int k = 0; k < 5; ++k) {
      const int block = table[k / 2];
      seen += block >= 0 && mask[static_cast<std::size_t>(block * 2 + k % 2)] != 0 ? 1 << k : 0;
    }
    EXPECT_EQ(seen, g == flat ? 0b10101 : 0b10001) << "group " << g;
  }
}

TEST(BatchTree, PagedKVPoolWritesATreeAndAppliesItsCommit) {
  std::unique_ptr<BatchCache> c = small_cache();  // length 5, B = 2; K/V rows of 1 x 2 floats
  kvcore::Result<kvcore::PagedKVPool> made = kvcore::PagedKVPool::create(*c, kvcore::DType::Float32);
  ASSERT_TRUE(made.ok());
  kvcore::PagedKVPool pool = std::move(made).get();
  const int parents[5] = {-1, 0, 0, 1, 2};
  const StepEntry e{0, 5, nullptr, parents};
  const BatchStep step = *c->begin_step(&e, 1);
  const kvcore::BatchStepPlan plan = *c->plan(step);
  float kv[10];
  for (int i = 0; i < 10; ++i) kv[i] = static_cast<float>(i / 2);  // node j's row holds j, j
  for (int l = 0; l < c->n_layers(); ++l) ASSERT_TRUE(pool.update(l, plan, kv, sizeof kv, kv, sizeof kv).ok());
  const int path[3] = {0, 2, 4};
  const AcceptedPath accepted{0, path, 3};
  const kvcore::BatchCommit done = *c->commit(step, &accepted, 1);
  // A commit of another shape, a copy outside the rows: refused, nothing copied.
  const kvcore::BatchCommit one_group{1, done.groups};
  EXPECT_EQ(pool.apply_copies(one_group).code(), Error::InvalidArgument);
  const kvcore::TreeCopy far{1 << 20, 0};
  const kvcore::GroupCommit bad_groups[2] = {{&far, 1}, done.groups[1]};
  EXPECT_EQ(pool.apply_copies(kvcore::BatchCommit{2, bad_groups}).code(), Error::InvalidArgument);
  ASSERT_TRUE(pool.apply_copies(done).ok());
  // A caller-built copy of a row onto itself changes nothing (and overlaps: memmove).
  const kvcore::TreeCopy self{0, 0};
  const kvcore::GroupCommit self_groups[2] = {{&self, 1}, {&self, 1}};
  ASSERT_TRUE(pool.apply_copies(kvcore::BatchCommit{2, self_groups}).ok());
  // The deprecated name (until kvcore 0.2.0) is apply_copies: the same refusal, the same copies.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  const kvcore::Status old_refused = pool.apply_commit(one_group);
  ASSERT_TRUE(pool.apply_commit(kvcore::BatchCommit{2, self_groups}).ok());
#pragma GCC diagnostic pop
  EXPECT_EQ(old_refused.code(), Error::InvalidArgument);
  EXPECT_STREQ(old_refused.message().c_str(), pool.apply_copies(one_group).message().c_str());
  // Positions 5, 6, 7 now hold nodes 0, 2, 4 in every layer.
  const StepEntry next{0, 1, nullptr, nullptr};
  const BatchStep s2 = *c->begin_step(&next, 1);
  const kvcore::BatchStepPlan p2 = *c->plan(s2);
  for (int l = 0; l < c->n_layers(); ++l) {
    const kvcore::GroupPlan& gp = p2.groups[*c->group_of(l)];
    const int* table = gp.block_tables;  // seq 0's row
    const float zero[2] = {0, 0};
    ASSERT_TRUE(pool.update(l, p2, zero, sizeof zero, zero, sizeof zero).ok());
    const kvcore::PagedRows rows = *pool.rows(l);
    const float* k = reinterpret_cast<const float*>(rows.k);
    for (int d = 0; d < 3; ++d) {
      const int p = 5 + d;
      const int row = table[p / 2] * 2 + p % 2;
      EXPECT_EQ(k[2 * row], static_cast<float>(path[d])) << "layer " << l << " position " << p;
    }
  }
}

}  // namespace
}  // namespace kvcore_test
