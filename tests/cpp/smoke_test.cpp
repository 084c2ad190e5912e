#include <gtest/gtest.h>

#include "kvcore/kvcore.h"

TEST(Smoke, FlatPlan) {
  kvcore::CacheConfig cfg;
  cfg.capacity = 16;
  cfg.n_layers = 1;
  cfg.layers = {kvcore::LayerConfig{kvcore::LayerPolicy::flat(), 1, 4, 0}};
  auto cache = kvcore::SequenceCache::create(cfg);
  ASSERT_TRUE(cache.ok());
  auto step = (*cache)->begin_step(3);
  ASSERT_TRUE(step.ok());
  auto plan = (*cache)->plan(0, step->position, step->T);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->read_len(), 3);
}
