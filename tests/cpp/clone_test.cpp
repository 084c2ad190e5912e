// SequenceCache::clone(): an independent cache in the same state, which then
// continues exactly as the original does (plans, rewinds, the begun step).
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>

#include "cache_fixtures.h"
#include "support/counting_new.h"
#include "support/uniform.h"

namespace kvcore_test {
namespace {

CacheConfig mixed() {
  return make_config(64, {LayerPolicy::ring(4, 1), LayerPolicy::ring(4, 1), LayerPolicy::flat(), LayerPolicy::ring(6)}, 3);
}

void expect_same_plans(SequenceCache& a, SequenceCache& b, const Step& sa, const Step& sb) {
  for (int l = 0; l < a.n_layers(); ++l) {
    auto pa = a.plan(l, sa), pb = b.plan(l, sb);
    ASSERT_TRUE(pa.ok() && pb.ok());
    EXPECT_TRUE(*pa == *pb) << "layer " << l;
  }
}

TEST(Clone, TheCloneContinuesExactlyAsTheOriginal) {
  std::mt19937 rng(5);
  auto original = must_create(mixed());
  for (int T : {3, 3, 1, 2, 3, 1, 1}) {
    auto step = original->begin_step(T);
    ASSERT_TRUE(step.ok() && original->commit(*step).ok());
  }
  auto begun = original->begin_step(2);  // cloned with a begun step
  ASSERT_TRUE(begun.ok());
  auto cloned = original->clone();
  ASSERT_TRUE(cloned.ok()) << cloned.message().c_str();
  SequenceCache& copy = **cloned;
  EXPECT_EQ(copy.length(), original->length());
  EXPECT_TRUE(copy.check_step(*begun).ok());  // the begun step's handle names the clone's too
  expect_same_plans(*original, copy, *begun, *begun);
  ASSERT_TRUE(copy.commit(*begun).ok());
  ASSERT_TRUE(original->commit(*begun).ok());
  for (int i = 0; i < 40; ++i) {
    const int choice = kvcore_test::uniform_int(rng, 0, 3);
    if (choice == 0) {
      const int n = original->length() - kvcore_test::uniform_int(rng, 0, 5);
      EXPECT_EQ(copy.can_rewind(n), original->can_rewind(n)) << n;
      EXPECT_EQ(copy.rewind(n).code(), original->rewind(n).code());
      continue;
    }
    const int T = kvcore_test::uniform_int(rng, 1, 3);
    auto a = original->begin_step(T), b = copy.begin_step(T);
    ASSERT_EQ(a.error(), b.error());
    if (!a.ok()) continue;
    expect_same_plans(*original, copy, *a, *b);
    ASSERT_TRUE(original->commit(*a).ok() && copy.commit(*b).ok());
    EXPECT_EQ(copy.length(), original->length());
  }
}

TEST(Clone, TheCloneIsIndependent) {
  auto original = must_create(mixed());
  auto step = original->begin_step(3);
  ASSERT_TRUE(step.ok() && original->commit(*step).ok());
  auto cloned = original->clone();
  ASSERT_TRUE(cloned.ok());
  auto more = (*cloned)->begin_step(2);
  ASSERT_TRUE(more.ok() && (*cloned)->commit(*more).ok());
  EXPECT_EQ((*cloned)->length(), 5);
  EXPECT_EQ(original->length(), 3);
  original->clear();
  EXPECT_EQ((*cloned)->length(), 5);
}

TEST(Clone, EveryFailedAllocationIsReportedAndNothingLeaks) {
  auto original = must_create(mixed());
  for (int successes = 0;; ++successes) {
    ASSERT_LT(successes, 50);
    const std::int64_t live = live_news();
    bool failed = false;
    {
      FailNothrowNewAfter fail(successes);
      auto cloned = original->clone();
      failed = fail.failed_any();
      if (failed) {
        EXPECT_EQ(cloned.error(), kvcore::Error::MemoryAllocationFailed);
        EXPECT_EQ(std::string(cloned.message().c_str()).rfind("cannot allocate ", 0), 0u);
      } else {
        EXPECT_TRUE(cloned.ok());
      }
    }
    EXPECT_EQ(live_news(), live);
    if (!failed) break;
  }
}

}  // namespace
}  // namespace kvcore_test
