// One budget (docs/batch.md section 5): every group draws its blocks from one
// pool, layers of one policy form groups of at most page_layers layers, and a
// paged pool gives group g's j-th layer the storage of every other group's
// j-th, so a block is one page of memory whichever group holds it. The
// brute-force test holds the pool to its model on random workloads; these
// name the rules a runtime sizes its memory by.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cache_fixtures.h"
#include "kvcore/batch/batch_cache.h"
#include "kvcore/pool/paged_kv_pool.h"

namespace kvcore_test {
namespace {

using kvcore::BatchCache;
using kvcore::Error;
using kvcore::StepEntry;

// Gemma 3's order: five sliding layers, then a full one, twice.
std::vector<LayerPolicy> gemma_like() {
  std::vector<LayerPolicy> p;
  for (int i = 0; i < 12; ++i) p.push_back(i % 6 == 5 ? LayerPolicy::flat() : LayerPolicy::ring(8));
  return p;
}

std::unique_ptr<BatchCache> batch(const std::vector<LayerPolicy>& policies, int page_layers, int num_blocks = 0) {
  CacheConfig cfg = make_config(64, policies, 4);
  cfg.batch.block_size = 4;
  cfg.batch.max_seqs = 8;
  cfg.batch.num_blocks = num_blocks;
  cfg.batch.page_layers = page_layers;
  auto made = BatchCache::create(cfg);
  EXPECT_TRUE(made.ok()) << made.message().c_str();
  return made.ok() ? std::move(made).get() : nullptr;
}

void compute(BatchCache& c, int seq, int n, std::int32_t first) {
  ASSERT_TRUE(c.add_sequence(seq).ok());
  for (int at = 0; at < n; at += c.max_step()) {
    const int T = n - at < c.max_step() ? n - at : c.max_step();
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(T));
    for (int j = 0; j < T; ++j) tokens[static_cast<std::size_t>(j)] = first + at + j;
    const StepEntry e{seq, T, tokens.data()};
    auto begun = c.begin_step(&e, 1);
    ASSERT_TRUE(begun.ok()) << begun.message().c_str();
    ASSERT_TRUE(c.commit(*begun).ok());
  }
}

TEST(OneBudget, BadPageLayersAreRefused) {
  CacheConfig cfg = make_config(64, gemma_like(), 4);
  cfg.batch.page_layers = -1;
  auto made = BatchCache::create(cfg);
  ASSERT_EQ(made.status().code(), Error::InvalidArgument);
  EXPECT_STREQ(made.message().c_str(), "batch.page_layers = -1: must be >= 1 (or 0 for the fewest layers of any policy)");
}

// "Layers of one policy form groups of at most page_layers layers (0: the
// fewest any policy has), each opened at its first layer."
TEST(OneBudget, LayersOfOnePolicyFormGroupsOfPageLayers) {
  struct Case {
    int page_layers;
    std::vector<int> group_of;
  };
  const std::vector<Case> cases = {
      {0, {0, 0, 1, 1, 2, 3, 2, 4, 4, 5, 5, 3}},  // 10 sliding, 2 full: groups of 2 (vLLM's rule)
      {5, {0, 0, 0, 0, 0, 1, 2, 2, 2, 2, 2, 1}},  // the sliding layers in groups of 5
      {12, {0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1}},  // one group per policy
  };
  for (const Case& k : cases) {
    auto c = batch(gemma_like(), k.page_layers);
    ASSERT_NE(c, nullptr);
    std::vector<int> got;
    for (int l = 0; l < c->n_layers(); ++l) got.push_back(*c->group_of(l));
    EXPECT_EQ(got, k.group_of) << "page_layers " << k.page_layers;
  }
}

// Group g's j-th layer shares the storage of the first layer that is any
// group's j-th.
TEST(OneBudget, EachGroupsJthLayerSharesTheFirstJthLayersStorage) {
  auto c = batch(gemma_like(), 5);  // groups: sliding 0-4, full {5, 11}, sliding 6-10
  ASSERT_NE(c, nullptr);
  const std::vector<int> want = {0, 1, 2, 3, 4, 0, 0, 1, 2, 3, 4, 1};
  for (int l = 0; l < c->n_layers(); ++l) EXPECT_EQ(*c->storage_layer(l), want[static_cast<std::size_t>(l)]) << l;
  EXPECT_EQ(c->storage_layer(12).status().code(), Error::InvalidArgument);
  // A paged pool keeps 5 storages, not 12: each layer of another group points into them.
  auto pool = kvcore::PagedKVPool::create(*c, kvcore::DType::Float32);
  ASSERT_TRUE(pool.ok()) << pool.message().c_str();
  for (int l = 0; l < c->n_layers(); ++l) {
    const auto layer = *pool->layer(l);
    const auto owner = *pool->layer(want[static_cast<std::size_t>(l)]);
    EXPECT_EQ(layer.storage_of, want[static_cast<std::size_t>(l)] == l ? -1 : want[static_cast<std::size_t>(l)]) << l;
    EXPECT_EQ(layer.k, owner.k) << l;
    EXPECT_EQ(layer.v, owner.v) << l;
  }
  const std::size_t row = 2 * 8 * 4 * 2;  // 2 heads x 8 dims x float32, K and V
  EXPECT_EQ(pool->reserved_bytes(), 5 * row * static_cast<std::size_t>(pool->layer(0)->allocated_rows));
}

// The budget moves between the groups: a long sequence holds mostly flat
// blocks, many short ones hold as many ring blocks as flat ones, and every
// block is free or held by exactly one group.
TEST(OneBudget, WhatTheFlatLayersFreeTheRingsTake) {
  auto c = batch({LayerPolicy::ring(4), LayerPolicy::flat()}, 0, 16);
  ASSERT_NE(c, nullptr);
  auto balance = [&]() { return *c->held_blocks(0) + *c->held_blocks(1) + *c->free_blocks(0); };
  compute(*c, 0, 48, 1);  // 12 flat blocks, the ring's window (and margin): 3
  EXPECT_EQ(*c->held_blocks(1), 12);
  EXPECT_LE(*c->held_blocks(0), 3);
  EXPECT_EQ(balance(), 16);
  ASSERT_TRUE(c->release_sequence(0).ok());
  for (int s = 0; s < 8; ++s) compute(*c, s, 4, 100 + 10 * s);  // 8 x (1 ring + 1 flat): the cached blocks go
  EXPECT_EQ(*c->held_blocks(0), 8);
  EXPECT_EQ(*c->held_blocks(1), 8);
  EXPECT_EQ(*c->free_blocks(0), 0);
  EXPECT_EQ(balance(), 16);
  // One more block in either group is refused, naming the pool, and changes nothing.
  const std::int32_t t = 7;
  const StepEntry e{0, 1, &t};
  auto refused = c->begin_step(&e, 1);
  ASSERT_EQ(refused.status().code(), Error::OutOfResources);
  EXPECT_STREQ(refused.message().c_str(), "begin_step: the step needs 2 blocks over its 2 groups, 0 of the pool's 16 are free");
  EXPECT_EQ(balance(), 16);
}

}  // namespace
}  // namespace kvcore_test
