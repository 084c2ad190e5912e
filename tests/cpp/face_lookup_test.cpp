// CacheBase finds every face by FaceId (issue 18, item 5): the core declares
// only the ids and its own faces; the batch layer types its ids (FaceType), so
// the lookup works without RTTI and without core/ naming a batch type.
#include <gtest/gtest.h>

#include <type_traits>

#include "cache_fixtures.h"
#include "kvcore/batch/batch_cache.h"

namespace kvcore_test {
namespace {

using kvcore::CacheBase;
using kvcore::FaceId;

static_assert(std::is_same<kvcore::FaceType<FaceId::batch_control>::type, kvcore::BatchControl>::value,
              "batch_faces.h types the batch runner face");
static_assert(std::is_same<kvcore::FaceType<FaceId::batch_planner>::type, kvcore::BatchPlanner>::value,
              "batch_faces.h types the batch backend face");
static_assert(std::is_same<kvcore::FaceType<FaceId::sequence_control>::type, kvcore::SequenceControl>::value,
              "the core types its own faces");

TEST(FaceLookup, EachIdAnswersItsFaceOrNull) {
  auto batch = kvcore::BatchCache::create(make_config(32, {LayerPolicy::flat()}, 2));
  ASSERT_TRUE(batch.ok()) << batch.message().c_str();
  CacheBase& many = **batch;
  EXPECT_EQ(many.as_face<FaceId::batch_control>(), static_cast<kvcore::BatchControl*>(batch->get()));
  EXPECT_EQ(many.as_face<FaceId::batch_planner>(), static_cast<kvcore::BatchPlanner*>(batch->get()));
  EXPECT_EQ(many.face(FaceId::batch_control), static_cast<void*>(static_cast<kvcore::BatchControl*>(batch->get())));
  EXPECT_EQ(many.face(FaceId::sequence_control), nullptr);
  EXPECT_EQ(many.face(FaceId::sequence_planner), nullptr);
  // The face works through the lookup: a step begun through it.
  kvcore::BatchControl& control = *many.as_batch_control();
  ASSERT_TRUE(control.add_sequence(0).ok());
  const kvcore::StepEntry entry{0, 2, nullptr};
  auto step = control.begin_step(&entry, 1);
  ASSERT_TRUE(step.ok()) << step.message().c_str();
  EXPECT_EQ(many.as_batch_planner()->plan(*step)->n_tokens, 2);

  auto one = must_create(make_config(32, {LayerPolicy::flat()}, 2));
  ASSERT_NE(one, nullptr);
  CacheBase& single = *one;
  EXPECT_EQ(single.face(FaceId::sequence_control), static_cast<void*>(static_cast<kvcore::SequenceControl*>(one.get())));
  EXPECT_EQ(single.as_face<FaceId::sequence_planner>(), static_cast<kvcore::SequencePlanner*>(one.get()));
  EXPECT_EQ(single.face(FaceId::batch_control), nullptr);
  EXPECT_EQ(single.face(FaceId::batch_planner), nullptr);
}

}  // namespace
}  // namespace kvcore_test
