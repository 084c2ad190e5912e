// Every error path of SequenceCache: the right code, a message naming the bad
// value, and no change at all, proven against an untouched twin cache that got
// the same successful calls (length, begun step, can_rewind, and the plans
// that follow must all be identical).
#include <gtest/gtest.h>

#include <climits>
#include <cstring>
#include <string>

#include "cache_fixtures.h"

namespace kvcore_test {
namespace {

const int kCapacity = 40;
const int kMaxStep = 4;

CacheConfig mixed_config() {
  return make_config(kCapacity, {LayerPolicy::ring(5, 2), LayerPolicy::flat(), LayerPolicy::ring(3)},
                     kMaxStep);
}

// Two caches given the same successful history: decode to `length` with
// steps of up to max_step, then (when begun_T > 0) begin an uncommitted step.
struct Twins {
  std::unique_ptr<SequenceCache> cache;  // receives the bad call
  std::unique_ptr<SequenceCache> twin;   // does not
  bool ok() const { return cache != nullptr && twin != nullptr; }
};

Twins make_twins(int length, int begun_T = 0, const CacheConfig& cfg = mixed_config()) {
  Twins t{must_create(cfg), must_create(cfg)};
  if (!t.ok()) return t;
  for (SequenceCache* c : {t.cache.get(), t.twin.get()}) {
    while (c->length() < length) {
      const int left = length - c->length();
      auto step = c->begin_step(left < c->max_step() ? left : c->max_step());
      EXPECT_TRUE(step.ok());
      if (!step.ok() || !c->commit(*step).ok()) return Twins{};
    }
    if (begun_T > 0) {
      EXPECT_TRUE(c->begin_step(begun_T).ok());
    }
  }
  return t;
}

void expect_message_has(const char* message, const std::string& text) {
  EXPECT_NE(std::strstr(message, text.c_str()), nullptr)
      << "message '" << message << "' lacks '" << text << "'";
}

// --- begin_step ------------------------------------------------------------

TEST(SequenceCacheErrors, BeginStepTOutsideOneToMaxStep) {
  for (int begun : {0, 2}) {
    for (int T : {0, -1, INT_MIN, kMaxStep + 1, INT_MAX}) {
      SCOPED_TRACE("T " + std::to_string(T) + " begun " + std::to_string(begun));
      Twins t = make_twins(9, begun);
      ASSERT_TRUE(t.ok());
      auto p = t.cache->preview(0, T);  // the same rule, before anything is begun
      EXPECT_EQ(p.error(), Error::InvalidArgument);
      expect_message_has(p.message().c_str(), "T = " + std::to_string(T));
      expect_same_state(*t.cache, *t.twin);
      auto r = t.cache->begin_step(T);
      EXPECT_EQ(r.error(), Error::InvalidArgument);
      expect_message_has(r.message().c_str(), "T = " + std::to_string(T));
      expect_message_has(r.message().c_str(), "max_step = " + std::to_string(kMaxStep));
      expect_same_state(*t.cache, *t.twin);
    }
  }
}

TEST(SequenceCacheErrors, BeginStepBeyondCapacityIsOutOfResources) {
  for (int length : {kCapacity - 3, kCapacity - 1, kCapacity}) {
    for (int begun : {0, 1}) {
      if (length == kCapacity && begun) continue;  // nothing can be begun at capacity
      SCOPED_TRACE("length " + std::to_string(length) + " begun " + std::to_string(begun));
      Twins t = make_twins(length, begun);
      ASSERT_TRUE(t.ok());
      const int T = kCapacity - length + 1;
      if (T > kMaxStep) continue;
      auto p = t.cache->preview(0, T);
      EXPECT_EQ(p.error(), Error::OutOfResources);
      expect_message_has(p.message().c_str(), "capacity = " + std::to_string(kCapacity));
      expect_same_state(*t.cache, *t.twin);
      auto r = t.cache->begin_step(T);
      EXPECT_EQ(r.error(), Error::OutOfResources);
      expect_message_has(r.message().c_str(), "capacity = " + std::to_string(kCapacity));
      expect_same_state(*t.cache, *t.twin);
    }
  }
}

TEST(SequenceCacheErrors, PreviewOfABadLayerIsInvalidAndChangesNothing) {
  for (int begun : {0, 2}) {
    for (int layer : {-1, INT_MIN, 3, INT_MAX}) {  // mixed_config has 3 layers
      SCOPED_TRACE("layer " + std::to_string(layer) + " begun " + std::to_string(begun));
      Twins t = make_twins(9, begun);
      ASSERT_TRUE(t.ok());
      auto p = t.cache->preview(layer, 1);
      EXPECT_EQ(p.error(), Error::InvalidArgument);
      expect_message_has(p.message().c_str(), "layer = " + std::to_string(layer));
      expect_same_state(*t.cache, *t.twin);
    }
  }
}

TEST(SequenceCacheErrors, FailedBeginStepKeepsTheBegunStep) {
  Twins t = make_twins(10, 3);
  ASSERT_TRUE(t.ok());
  const Step begun = t.cache->active_step();
  EXPECT_FALSE(t.cache->begin_step(0).ok());
  EXPECT_EQ(t.cache->active_step().id, begun.id);
  EXPECT_TRUE(t.cache->plan(0, begun).ok());
  EXPECT_TRUE(t.cache->commit(begun).ok());
  EXPECT_EQ(t.cache->length(), 13);
}

TEST(SequenceCacheErrors, CapacityIsReachableExactly) {
  Twins t = make_twins(kCapacity - 2);
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(t.cache->can_extend(2));
  EXPECT_FALSE(t.cache->can_extend(3));
  EXPECT_FALSE(t.cache->can_extend(-1));
  EXPECT_FALSE(t.cache->can_extend(INT_MAX));  // no overflow of length + n
  EXPECT_FALSE(t.cache->can_extend(INT_MIN));
  auto s = t.cache->begin_step(2);
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(t.cache->commit(*s).ok());
  EXPECT_EQ(t.cache->length(), kCapacity);
  EXPECT_TRUE(t.cache->can_extend(0));
  EXPECT_EQ(t.cache->begin_step(1).error(), Error::OutOfResources);
}

// --- plan / rows / visible ---------------------------------------------------

TEST(SequenceCacheErrors, BadLayerIsInvalidArgument) {
  for (int layer : {-1, 3, INT_MAX, INT_MIN}) {
    SCOPED_TRACE("layer " + std::to_string(layer));
    Twins t = make_twins(12, 2);
    ASSERT_TRUE(t.ok());
    const Step s = t.cache->active_step();
    auto a = t.cache->plan(layer, s.position, s.T);
    EXPECT_EQ(a.error(), Error::InvalidArgument);
    expect_message_has(a.message().c_str(), "layer = " + std::to_string(layer));
    EXPECT_EQ(t.cache->plan(layer, s).error(), Error::InvalidArgument);
    auto rows = t.cache->rows(layer);
    EXPECT_EQ(rows.error(), Error::InvalidArgument);
    expect_message_has(rows.message().c_str(), "layer = " + std::to_string(layer));
    EXPECT_EQ(t.cache->visible(layer, 5, 4).error(), Error::InvalidArgument);
    expect_same_state(*t.cache, *t.twin);
  }
}

TEST(SequenceCacheErrors, VisibleNegativePositionIsInvalidArgument) {
  Twins t = make_twins(6);
  ASSERT_TRUE(t.ok());
  auto q = t.cache->visible(0, -1, 0);
  EXPECT_EQ(q.error(), Error::InvalidArgument);
  expect_message_has(q.message().c_str(), "q = -1");
  auto k = t.cache->visible(0, 3, -5);
  EXPECT_EQ(k.error(), Error::InvalidArgument);
  expect_message_has(k.message().c_str(), "k = -5");
  expect_same_state(*t.cache, *t.twin);
}

TEST(SequenceCacheErrors, PlanWithoutBegunStepIsInvalidState) {
  Twins t = make_twins(8);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t.cache->plan(0, 8, 1).error(), Error::InvalidState);
  EXPECT_EQ(t.cache->plan(1, Step{8, 1, 1}).error(), Error::InvalidState);
  EXPECT_EQ(t.cache->plan(1, Step{}).error(), Error::InvalidState);
  expect_same_state(*t.cache, *t.twin);
}

TEST(SequenceCacheErrors, PlanWithWrongPositionOrTIsInvalidState) {
  Twins t = make_twins(8, 3);
  ASSERT_TRUE(t.ok());
  const Step s = t.cache->active_step();
  ASSERT_EQ(s.position, 8);
  for (int layer = 0; layer < 3; ++layer) {
    auto wrong_pos = t.cache->plan(layer, s.position - 1, s.T);
    EXPECT_EQ(wrong_pos.error(), Error::InvalidState);
    expect_message_has(wrong_pos.message().c_str(), "position 7");
    EXPECT_EQ(t.cache->plan(layer, s.position + 1, s.T).error(), Error::InvalidState);
    auto wrong_T = t.cache->plan(layer, s.position, s.T - 1);
    EXPECT_EQ(wrong_T.error(), Error::InvalidState);
    EXPECT_EQ(t.cache->plan(layer, s.position, s.T + 1).error(), Error::InvalidState);
    EXPECT_EQ(t.cache->plan(layer, Step{s.position, s.T, s.id + 1}).error(), Error::InvalidState);
    EXPECT_EQ(t.cache->plan(layer, Step{s.position + 1, s.T, s.id}).error(), Error::InvalidState);
  }
  expect_same_state(*t.cache, *t.twin);
}

// --- commit -------------------------------------------------------------------

TEST(SequenceCacheErrors, CommitAfterRetryIsInvalidState) {
  Twins t = make_twins(11);
  ASSERT_TRUE(t.ok());
  Step stale{};
  for (SequenceCache* c : {t.cache.get(), t.twin.get()}) {
    auto first = c->begin_step(3);
    ASSERT_TRUE(first.ok());
    stale = *first;
    ASSERT_TRUE(c->begin_step(3).ok());  // retry: same position and T, new id
  }
  kvcore::Status s = t.cache->commit(stale);
  EXPECT_EQ(s.code(), Error::InvalidState);
  EXPECT_EQ(t.cache->plan(0, stale).error(), Error::InvalidState);
  expect_same_state(*t.cache, *t.twin);
}

TEST(SequenceCacheErrors, CommitAfterRewindIsInvalidState) {
  Twins t = make_twins(11, 2);
  ASSERT_TRUE(t.ok());
  const Step stale = t.cache->active_step();
  for (SequenceCache* c : {t.cache.get(), t.twin.get()}) ASSERT_TRUE(c->rewind(10).ok());
  EXPECT_EQ(t.cache->commit(stale).code(), Error::InvalidState);
  EXPECT_EQ(t.cache->plan(2, stale).error(), Error::InvalidState);
  expect_same_state(*t.cache, *t.twin);
}

TEST(SequenceCacheErrors, CommitAfterRewindToSameLengthIsInvalidState) {
  Twins t = make_twins(11, 2);
  ASSERT_TRUE(t.ok());
  const Step stale = t.cache->active_step();
  for (SequenceCache* c : {t.cache.get(), t.twin.get()}) ASSERT_TRUE(c->rewind(11).ok());
  EXPECT_EQ(t.cache->commit(stale).code(), Error::InvalidState);
  expect_same_state(*t.cache, *t.twin);
}

TEST(SequenceCacheErrors, CommitAfterClearIsInvalidState) {
  Twins t = make_twins(11, 2);
  ASSERT_TRUE(t.ok());
  const Step stale = t.cache->active_step();
  for (SequenceCache* c : {t.cache.get(), t.twin.get()}) c->clear();
  EXPECT_EQ(t.cache->length(), 0);
  EXPECT_EQ(t.cache->commit(stale).code(), Error::InvalidState);
  expect_same_state(*t.cache, *t.twin);
}

TEST(SequenceCacheErrors, CommitAfterClearAndRegrowthIsInvalidState) {
  // The stale handle names position 0 again after clear(): only the id differs.
  Twins t = make_twins(0, 2);
  ASSERT_TRUE(t.ok());
  const Step stale = t.cache->active_step();
  for (SequenceCache* c : {t.cache.get(), t.twin.get()}) {
    c->clear();
    ASSERT_TRUE(c->begin_step(2).ok());
  }
  EXPECT_EQ(t.cache->active_step().position, stale.position);
  EXPECT_EQ(t.cache->commit(stale).code(), Error::InvalidState);
  expect_same_state(*t.cache, *t.twin);
}

TEST(SequenceCacheErrors, DoubleCommitIsInvalidState) {
  Twins t = make_twins(5, 4);
  ASSERT_TRUE(t.ok());
  const Step s = t.cache->active_step();
  for (SequenceCache* c : {t.cache.get(), t.twin.get()}) ASSERT_TRUE(c->commit(s).ok());
  kvcore::Status again = t.cache->commit(s);
  EXPECT_EQ(again.code(), Error::InvalidState);
  EXPECT_EQ(t.cache->length(), 9);
  expect_same_state(*t.cache, *t.twin);
}

TEST(SequenceCacheErrors, CommitWithoutStepOrForgedStepIsInvalidState) {
  Twins t = make_twins(5);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t.cache->commit(Step{}).code(), Error::InvalidState);
  EXPECT_EQ(t.cache->commit(Step{5, 1, 0}).code(), Error::InvalidState);
  expect_same_state(*t.cache, *t.twin);
  Twins u = make_twins(5, 2);
  ASSERT_TRUE(u.ok());
  const Step s = u.cache->active_step();
  EXPECT_EQ(u.cache->commit(Step{s.position, s.T + 1, s.id}).code(), Error::InvalidState);
  EXPECT_EQ(u.cache->commit(Step{s.position + 1, s.T, s.id}).code(), Error::InvalidState);
  EXPECT_EQ(u.cache->commit(Step{s.position, s.T, s.id + 7}).code(), Error::InvalidState);
  expect_same_state(*u.cache, *u.twin);
}

// --- rewind ---------------------------------------------------------------------

TEST(SequenceCacheErrors, RewindOutsideZeroToLengthIsInvalidArgument) {
  for (int begun : {0, 2}) {
    for (int n : {-1, INT_MIN, 14, 15, INT_MAX}) {
      SCOPED_TRACE("n " + std::to_string(n) + " begun " + std::to_string(begun));
      Twins t = make_twins(13, begun);
      ASSERT_TRUE(t.ok());
      EXPECT_FALSE(t.cache->can_rewind(n));
      kvcore::Status s = t.cache->rewind(n);
      EXPECT_EQ(s.code(), Error::InvalidArgument);
      expect_message_has(s.message().c_str(), "n = " + std::to_string(n));
      expect_message_has(s.message().c_str(), "length = 13");
      expect_same_state(*t.cache, *t.twin);
    }
  }
}

TEST(SequenceCacheErrors, RewindPastHeldHistoryIsInvalidState) {
  // Layer 0, Ring W=5 S=2 C=4: R = 8 ring rows. Decoded to 30, they hold the
  // last 8 positions [22, 30); a query at n needs [n - 4, n), so n >= 26 (a
  // rewind by up to C). Layer 2 (W=3, R=6) holds [24, 30) and needs [n - 2, n):
  // n >= 26 too. n = 25 needs the evicted 21.
  for (int begun : {0, 1}) {
    SCOPED_TRACE("begun " + std::to_string(begun));
    Twins t = make_twins(30, begun);
    ASSERT_TRUE(t.ok());
    EXPECT_FALSE(t.cache->can_rewind(25));
    kvcore::Status s = t.cache->rewind(25);
    EXPECT_EQ(s.code(), Error::InvalidState);
    expect_message_has(s.message().c_str(), "n = 25");
    expect_same_state(*t.cache, *t.twin);
  }
  Twins ok = make_twins(30);
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE(ok.cache->can_rewind(26));
  EXPECT_TRUE(ok.cache->rewind(26).ok());
}

TEST(SequenceCacheErrors, RefusedRewindBelowBegunStepKeepsTheStep) {
  Twins t = make_twins(30, 4);
  ASSERT_TRUE(t.ok());
  const Step s = t.cache->active_step();
  EXPECT_FALSE(t.cache->rewind(22).ok());
  EXPECT_EQ(t.cache->active_step().id, s.id);
  EXPECT_TRUE(t.cache->commit(s).ok());
  EXPECT_EQ(t.cache->length(), 34);
}

TEST(SequenceCacheErrors, RewindAndClearEndTheBegunStep) {
  Twins t = make_twins(9, 2);
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(t.cache->rewind(9).ok());
  EXPECT_EQ(t.cache->active_step().id, 0u);
  EXPECT_EQ(t.cache->plan(0, 9, 2).error(), Error::InvalidState);
  ASSERT_TRUE(t.twin->begin_step(1).ok());
  t.twin->clear();
  EXPECT_EQ(t.twin->active_step().id, 0u);
  EXPECT_EQ(t.twin->length(), 0);
  EXPECT_EQ(t.twin->plan(0, 9, 1).error(), Error::InvalidState);
  EXPECT_TRUE(t.twin->can_rewind(0));
  EXPECT_FALSE(t.twin->can_rewind(1));
}

TEST(SequenceCacheErrors, ErrorsOnAFreshCache) {
  Twins t = make_twins(0);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t.cache->commit(Step{}).code(), Error::InvalidState);
  EXPECT_EQ(t.cache->rewind(1).code(), Error::InvalidArgument);
  EXPECT_EQ(t.cache->plan(0, 0, 1).error(), Error::InvalidState);
  EXPECT_TRUE(t.cache->can_rewind(0));
  EXPECT_TRUE(t.cache->rewind(0).ok());
  t.twin->clear();
  expect_same_state(*t.cache, *t.twin);
}

}  // namespace
}  // namespace kvcore_test
