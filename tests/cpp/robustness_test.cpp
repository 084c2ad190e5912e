// Robustness (issue 7): reproducers of what it found in the core, kept so the
// bugs stay fixed, and error paths docs/errors.md needed a test for.
#include <gtest/gtest.h>

#include <climits>
#include <cstring>

#include "kvcore/kv_pool.h"
#include "kvcore/sequence_cache.h"

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
    EXPECT_NE(std::strstr(s.message(), "must be <= 65536"), nullptr) << s.message();
    EXPECT_EQ(kvcore::SequenceCache::create(cfg).error(), Error::InvalidArgument);
    EXPECT_EQ(kvcore::KVPool::required_bytes(cfg, kvcore::DType::Float16).error(), Error::InvalidArgument);
  }
}

TEST(RobustnessRegressions, TheLargestLayerCountWorks) {
  auto cache = kvcore::SequenceCache::create(broadcast(CacheConfig::kMaxLayers));
  ASSERT_TRUE(cache.ok()) << cache.message();
  EXPECT_EQ((*cache)->n_layers(), 65536);
  EXPECT_EQ((*cache)->n_policies(), 1);
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
  EXPECT_NE(std::strstr(bytes.message(), "the arena would overflow the address space"), nullptr)
      << bytes.message();
  cfg.n_layers = 1;  // one layer alone is fine (about 2^62 bytes: computed, never allocated)
  EXPECT_TRUE(kvcore::KVPool::required_bytes(cfg, kvcore::DType::Float32).ok());
}

}  // namespace
