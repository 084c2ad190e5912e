// The runner and backend faces of a cache, reached from CacheBase without RTTI,
// and the sharing of one policy object between layers with identical policies.
#include <gtest/gtest.h>

#include "cache_fixtures.h"
#include "kvcore/batch/batch_cache.h"
#include "kvcore/core/cache_base.h"

namespace kvcore_test {
namespace {

using kvcore::CacheBase;
using kvcore::SequenceControl;
using kvcore::SequencePlanner;

TEST(Faces, BothFacesAreTheSameCache) {
  auto cache = must_create(make_config(32, {LayerPolicy::ring(4), LayerPolicy::flat()}, 2));
  ASSERT_NE(cache, nullptr);
  CacheBase* base = cache.get();
  SequenceControl* control = base->as_control();
  SequencePlanner* planner = base->as_planner();
  ASSERT_NE(control, nullptr);
  ASSERT_NE(planner, nullptr);
  // Static downcasts back to the concrete type land on the very same object.
  EXPECT_EQ(static_cast<SequenceCache*>(control), cache.get());
  EXPECT_EQ(static_cast<SequenceCache*>(planner), cache.get());
  EXPECT_EQ(control, static_cast<SequenceControl*>(cache.get()));
  EXPECT_EQ(planner, static_cast<SequencePlanner*>(cache.get()));
}

TEST(Faces, RunnerAndBackendShareOneState) {
  auto cache = must_create(make_config(32, {LayerPolicy::ring(4), LayerPolicy::flat()}, 2));
  ASSERT_NE(cache, nullptr);
  SequenceControl& control = *cache->as_control();
  SequencePlanner& planner = *cache->as_planner();
  EXPECT_EQ(planner.n_layers(), 2);
  auto step = control.begin_step(2);
  ASSERT_TRUE(step.ok());
  // The backend plans the step the runner began...
  auto plan = planner.plan(1, step->position, step->T);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->write_len(), 2);
  ASSERT_TRUE(control.check_step(*step).ok());
  ASSERT_TRUE(control.commit(*step).ok());
  // ...and after the runner commits, that step is gone for the backend too.
  EXPECT_EQ(planner.plan(1, step->position, step->T).error(), Error::InvalidState);
  EXPECT_EQ(control.length(), 2);
  EXPECT_EQ(cache->length(), 2);
  EXPECT_EQ(control.capacity(), 32);
  EXPECT_EQ(control.max_step(), 2);
}

// A cache type with neither face: the defaults say so with nullptr.
class FacelessCache final : public CacheBase {};

TEST(Faces, DefaultFacesAreNull) {
  FacelessCache faceless;
  CacheBase& base = faceless;
  EXPECT_EQ(base.as_control(), nullptr);
  EXPECT_EQ(base.as_planner(), nullptr);
  EXPECT_EQ(base.as_batch_control(), nullptr);
  EXPECT_EQ(base.as_batch_planner(), nullptr);
}

// Each cache answers only its own faces: one sequence, or many.
TEST(Faces, EachCacheKindHasOnlyItsOwnFaces) {
  auto sequence = must_create(make_config(32, {kvcore::LayerPolicy::flat()}, 2));
  ASSERT_NE(sequence, nullptr);
  CacheBase& one = *sequence;
  EXPECT_EQ(one.as_control(), static_cast<SequenceControl*>(sequence.get()));
  EXPECT_EQ(one.as_batch_control(), nullptr);
  EXPECT_EQ(one.as_batch_planner(), nullptr);
  auto batch = kvcore::BatchCache::create(make_config(32, {kvcore::LayerPolicy::flat()}, 2));
  ASSERT_TRUE(batch.ok()) << batch.message().c_str();
  CacheBase& many = **batch;
  EXPECT_EQ(many.as_batch_control(), static_cast<kvcore::BatchControl*>(batch->get()));
  EXPECT_EQ(many.as_batch_planner(), static_cast<kvcore::BatchPlanner*>(batch->get()));
  EXPECT_EQ(many.as_control(), nullptr);
  EXPECT_EQ(many.as_planner(), nullptr);
}

TEST(PolicyDedup, FiveRingOneFlatHasTwoPolicies) {
  std::vector<LayerPolicy> layers;
  for (int i = 0; i < 5; ++i) layers.push_back(LayerPolicy::ring(512));
  layers.push_back(LayerPolicy::flat());
  auto cache = must_create(make_config(4096, layers, 8));
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(cache->n_groups(), 2);
  for (int l = 1; l < 5; ++l) {
    EXPECT_EQ(cache->group_of(l), cache->group_of(0));
    EXPECT_EQ(&cache->policy(l), &cache->policy(0));  // one object, not equal copies
  }
  EXPECT_NE(cache->group_of(5), cache->group_of(0));
  EXPECT_EQ(cache->policy(0).policy(), LayerPolicy::ring(512));
  EXPECT_EQ(cache->policy(5).policy(), LayerPolicy::flat());
}

TEST(PolicyDedup, DifferentSinksGetDistinctPolicies) {
  auto cache = must_create(make_config(
      256,
      {LayerPolicy::ring(16), LayerPolicy::ring(16, 4), LayerPolicy::ring(16, 4), LayerPolicy::ring(16, 1)},
      4));
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(cache->n_groups(), 3);
  EXPECT_NE(cache->group_of(0), cache->group_of(1));
  EXPECT_EQ(cache->group_of(1), cache->group_of(2));
  EXPECT_NE(cache->group_of(3), cache->group_of(1));
  EXPECT_NE(cache->group_of(3), cache->group_of(0));
  // Each layer's policy object carries that layer's own window and sinks.
  EXPECT_EQ(cache->policy(0).policy(), LayerPolicy::ring(16, 0));
  EXPECT_EQ(cache->policy(1).policy(), LayerPolicy::ring(16, 4));
  EXPECT_EQ(cache->policy(3).policy(), LayerPolicy::ring(16, 1));
  // Distinct sinks mean distinct rows: S + W + C - 1.
  EXPECT_EQ(*cache->rows(0), 0 + 16 + 4 - 1);
  EXPECT_EQ(*cache->rows(1), 4 + 16 + 4 - 1);
  EXPECT_EQ(*cache->rows(3), 1 + 16 + 4 - 1);
}

TEST(PolicyDedup, DifferentWindowsGetDistinctPolicies) {
  auto cache = must_create(
      make_config(256, {LayerPolicy::ring(8), LayerPolicy::ring(9), LayerPolicy::ring(8)}, 4));
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(cache->n_groups(), 2);
  EXPECT_EQ(cache->group_of(0), cache->group_of(2));
  EXPECT_NE(cache->group_of(0), cache->group_of(1));
}

TEST(PolicyDedup, BroadcastAndRepeatedFlatShareOne) {
  auto broadcast = must_create(make_config(64, {LayerPolicy::ring(4, 1)}, 2, /*n_layers=*/9));
  ASSERT_NE(broadcast, nullptr);
  EXPECT_EQ(broadcast->n_groups(), 1);
  auto flats = must_create(make_config(64, {LayerPolicy::flat(), LayerPolicy::flat(), LayerPolicy::flat()}));
  ASSERT_NE(flats, nullptr);
  EXPECT_EQ(flats->n_groups(), 1);
}

TEST(PolicyDedup, SharedPolicyLayersStillPlanIndependentlyCorrect) {
  // Sharing is an optimisation only: every layer's plan equals a cache with
  // that layer alone.
  const std::vector<LayerPolicy> layers = {LayerPolicy::ring(4, 1), LayerPolicy::flat(),
                                           LayerPolicy::ring(4, 1), LayerPolicy::ring(3)};
  auto shared = must_create(make_config(40, layers, 3));
  ASSERT_NE(shared, nullptr);
  std::vector<std::unique_ptr<SequenceCache>> alone;
  for (const LayerPolicy& p : layers) {
    alone.push_back(must_create(make_config(40, {p}, 3)));
    ASSERT_NE(alone.back(), nullptr);
  }
  for (int i = 0; i < 25; ++i) {
    const int T = 1 + i % 3;
    auto s = shared->begin_step(T);
    ASSERT_TRUE(s.ok());
    for (std::size_t l = 0; l < layers.size(); ++l) {
      auto a = alone[l]->begin_step(T);
      ASSERT_TRUE(a.ok());
      auto ps = shared->plan(static_cast<int>(l), *s);
      auto pa = alone[l]->plan(0, *a);
      ASSERT_TRUE(ps.ok() && pa.ok());
      EXPECT_EQ(describe(*ps), describe(*pa)) << "layer " << l << " step " << i;
      ASSERT_TRUE(alone[l]->commit(*a).ok());
    }
    ASSERT_TRUE(shared->commit(*s).ok());
    if (shared->length() + 3 > 40) break;
  }
}

}  // namespace
}  // namespace kvcore_test
