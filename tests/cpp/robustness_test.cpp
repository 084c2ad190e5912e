// Robustness (issue 7): reproducers of what it found in the core, kept so the
// bugs stay fixed, and error paths docs/errors.md needed a test for.
#include <gtest/gtest.h>

#include <climits>
#include <cstring>

#include "kvcore/pool/kv_pool.h"
#include "kvcore/core/sequence_cache.h"

namespace {

using kvcore::CacheConfig;
using kvcore::Error;
using kvcore::LayerConfig;
using kvcore::LayerPolicy;

CacheConfig broadcast(int n_layers) {
  CacheConfig cfg;
  cfg.capacity = 8;
  cfg.n_layers = n_layers;
  cfg.layers = {LayerConfig{LayerPolicy::ring(4), 1, 2, 0}};
  return cfg;
}

// n_layers = INT_MAX with one broadcast entry used to pass validate(); create()
// then sized per-layer vectors for 2^31 layers (gigabytes, and an abort on
// bad_alloc in a build without exceptions). Now refused before any allocation.
TEST(RobustnessRegressions, AHugeLayerCountIsRefusedBeforeAnythingIsAllocated) {
  for (int n : {CacheConfig::kMaxLayers + 1, 1 << 20, INT_MAX}) {
    const CacheConfig cfg = broadcast(n);
    const kvcore::Status s = kvcore::validate(cfg);
    EXPECT_EQ(s.code(), Error::InvalidArgument);
    EXPECT_NE(std::strstr(s.message().c_str(), "must be <= 65536"), nullptr) << s.message().c_str();
    EXPECT_EQ(kvcore::SequenceCache::create(cfg).error(), Error::InvalidArgument);
    EXPECT_EQ(kvcore::KVPool::required_bytes(cfg, kvcore::DType::Float16).error(), Error::InvalidArgument);
  }
}

TEST(RobustnessRegressions, TheLargestLayerCountWorks) {
  auto cache = kvcore::SequenceCache::create(broadcast(CacheConfig::kMaxLayers));
  ASSERT_TRUE(cache.ok()) << cache.message().c_str();
  EXPECT_EQ((*cache)->n_layers(), 65536);
  EXPECT_EQ((*cache)->n_groups(), 1);
  auto step = (*cache)->begin_step(1);
  ASSERT_TRUE(step.ok());
  EXPECT_TRUE((*cache)->plan(65535, *step).ok());
}

// Each layer alone fits the address space (shape checks pass), the sum does not.
TEST(ErrorCatalogue, AnArenaOfLayersThatOnlyFitOneByOneIsRefused) {
  CacheConfig cfg;
  cfg.capacity = INT_MAX;
  cfg.max_step = 1;
  cfg.n_layers = 4;
  // 2^14 heads x 2^14 dims x 4 bytes = 2^30 bytes per K row and per V row:
  // 2^61 bytes of K and 2^61 of V per layer, 2^64 over four layers.
  cfg.layers = {LayerConfig{LayerPolicy::flat(), 1 << 14, 1 << 14, 0}};
  auto bytes = kvcore::KVPool::required_bytes(cfg, kvcore::DType::Float32);
  EXPECT_EQ(bytes.error(), Error::InvalidArgument);
  EXPECT_NE(std::strstr(bytes.message().c_str(), "the arena would overflow the address space"), nullptr)
      << bytes.message().c_str();
  cfg.n_layers = 1;  // one layer alone is fine (about 2^62 bytes: computed, never allocated)
  EXPECT_TRUE(kvcore::KVPool::required_bytes(cfg, kvcore::DType::Float32).ok());
}

// Found by the fuzzer (tests/fuzz/corpus/write-from-a-view-crossing-both-runs):
// a wrapped write (two runs) whose input is a view of the layer's own rows
// overwrote, with its first run, input the second run had still to read. Now the
// runs go in an order that keeps the input intact, or, when none does, the write
// is refused and nothing changes.
TEST(RobustnessRegressions, AWrappedWriteFromItsOwnRowsCopiesTheInputAsItWas) {
  CacheConfig cfg;
  cfg.capacity = 32;
  cfg.max_step = 4;
  cfg.n_layers = 1;
  cfg.layers = {LayerConfig{LayerPolicy::ring(3), 1, 1, 0}};  // R = 3 + 4 - 1 = 6 rows
  auto cache = kvcore::SequenceCache::create(cfg);
  ASSERT_TRUE(cache.ok());
  kvcore::SequenceCache& c = **cache;
  auto made = kvcore::KVPool::create(c, kvcore::DType::UInt8);
  ASSERT_TRUE(made.ok());
  kvcore::KVPool& pool = *made;
  // Rows 0..5 hold k = 10 + row, v = 20 + row (positions 0..5).
  for (int base : {0, 4}) {
    auto step = c.begin_step(base == 0 ? 4 : 2);
    ASSERT_TRUE(step.ok());
    auto plan = c.plan(0, *step);
    unsigned char k[4], v[4];
    for (int j = 0; j < step->T; ++j) k[j] = static_cast<unsigned char>(10 + base + j), v[j] = static_cast<unsigned char>(20 + base + j);
    ASSERT_TRUE(pool.write(0, *plan, k, static_cast<std::size_t>(step->T), v, static_cast<std::size_t>(step->T)).ok());
    ASSERT_TRUE(c.commit(*step).ok());
  }
  ASSERT_TRUE(c.rewind(3).ok());
  auto step = c.begin_step(4);  // positions 3..6 -> rows 3, 4, 5, then 0
  ASSERT_TRUE(step.ok());
  auto plan = c.plan(0, *step);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->n_write, 2);
  const kvcore::PoolLayer layer = *pool.layer(0);
  // Rows 0..3 as input: each run overwrites the other's input. Refused.
  const kvcore::Status crossing = pool.write(0, *plan, layer.k, 4, layer.v, 4);
  EXPECT_EQ(crossing.code(), Error::InvalidArgument);
  EXPECT_NE(std::strstr(crossing.message().c_str(), "pass a copy"), nullptr) << crossing.message().c_str();
  for (int row = 0; row < 6; ++row) {
    EXPECT_EQ(layer.k[row], 10 + row) << "row " << row;
    EXPECT_EQ(layer.v[row], 20 + row) << "row " << row;
  }
  // Rows 1..4 as input: the second run (row 0 <- row 4) goes first.
  ASSERT_TRUE(pool.write(0, *plan, layer.k + 1, 4, layer.v + 1, 4).ok());
  const int want[6] = {14, 11, 12, 11, 12, 13};  // rows 3, 4, 5 <- rows 1, 2, 3; row 0 <- row 4
  for (int row = 0; row < 6; ++row) {
    EXPECT_EQ(layer.k[row], want[row]) << "row " << row;
    EXPECT_EQ(layer.v[row], want[row] + 10) << "row " << row;
  }
}

}  // namespace
