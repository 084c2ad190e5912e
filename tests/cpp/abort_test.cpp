// abort(step): a begun step ends without a commit. A BatchCache is then exactly
// as before begin_step (every table, block, count and rewind answer); a
// SequenceCache keeps its length and counts the step's rows as written (the
// backend may have written them), so its rewind answers stay those of the
// begun step. A refused abort changes nothing.
#include <gtest/gtest.h>

#include <climits>
#include <vector>

#include "batch_reference.h"
#include "cache_fixtures.h"

namespace kvcore_test {
namespace {

using kvcore::BatchCache;
using kvcore::BatchStep;
using kvcore::StepEntry;

std::vector<bool> rewind_answers(const SequenceCache& c) {
  std::vector<bool> v;
  for (int n = -1; n <= c.length() + 1; ++n) v.push_back(c.can_rewind(n));
  return v;
}

TEST(Abort, SequenceCacheKeepsTheLengthAndCountsTheStepsRowsAsWritten) {
  // Ring W = 4 with C = 4: 7 ring rows, wrapped after 12 positions.
  auto cache = must_create(make_config(64, {LayerPolicy::ring(4, 1), LayerPolicy::flat()}, 4));
  ASSERT_NE(cache, nullptr);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(cache->commit(*cache->begin_step(4)).ok());
  const std::vector<bool> at_rest = rewind_answers(*cache);
  const Step step = *cache->begin_step(4);
  const kvcore::SeqStepPlan ring_plan = *cache->plan(0, step);
  const std::vector<bool> begun = rewind_answers(*cache);
  EXPECT_NE(begun, at_rest);  // the step's rows overwrote history a rewind needed

  ASSERT_TRUE(cache->abort(step).ok());
  EXPECT_EQ(cache->length(), 12);
  EXPECT_EQ(cache->active_step().id, 0u);
  EXPECT_EQ(rewind_answers(*cache), begun);
  EXPECT_EQ(cache->commit(step).code(), Error::InvalidState);
  EXPECT_EQ(cache->plan(0, step).error(), Error::InvalidState);
  // The retry plans exactly what the aborted step planned.
  const Step retry = *cache->begin_step(4);
  EXPECT_EQ(*cache->plan(0, retry), ring_plan);
  ASSERT_TRUE(cache->commit(retry).ok());
  EXPECT_EQ(cache->length(), 16);
}

TEST(Abort, SequenceCacheRefusesAStaleOrForgedStepAndChangesNothing) {
  auto cache = must_create(make_config(64, {LayerPolicy::ring(4, 1)}, 4));
  auto twin = must_create(make_config(64, {LayerPolicy::ring(4, 1)}, 4));
  ASSERT_TRUE(cache != nullptr && twin != nullptr);
  Step committed{};
  for (SequenceCache* c : {cache.get(), twin.get()}) {
    committed = *c->begin_step(3);
    ASSERT_TRUE(c->commit(committed).ok());
  }
  EXPECT_EQ(cache->abort(committed).code(), Error::InvalidState);  // no step is begun
  EXPECT_EQ(cache->abort(Step{}).code(), Error::InvalidState);
  expect_same_state(*cache, *twin);
  Step begun{};
  for (SequenceCache* c : {cache.get(), twin.get()}) begun = *c->begin_step(2);
  EXPECT_EQ(cache->abort(committed).code(), Error::InvalidState);
  EXPECT_EQ(cache->abort(Step{begun.position, begun.T, begun.id + 1}).code(), Error::InvalidState);
  EXPECT_EQ(cache->abort(Step{begun.position, begun.T + 1, begun.id}).code(), Error::InvalidState);
  expect_same_state(*cache, *twin);  // commits the begun step on both
  begun = *cache->begin_step(1);
  ASSERT_TRUE(cache->abort(begun).ok());
  EXPECT_EQ(cache->abort(begun).code(), Error::InvalidState);  // twice
}

CacheConfig batch_config() {
  CacheConfig cfg;
  cfg.capacity = 128;
  cfg.n_layers = 2;
  cfg.max_step = 4;
  cfg.layers = {LayerConfig{LayerPolicy::ring(4, 1), 1, 4, 0}, LayerConfig{LayerPolicy::flat(), 1, 4, 0}};
  cfg.batch.block_size = 4;
  cfg.batch.max_seqs = 4;
  cfg.batch.num_blocks = 40;
  return cfg;
}

void decode(BatchCache& c, int seq, int n) {
  std::vector<std::int32_t> tokens(4);
  while (n > 0) {
    const int T = n < 4 ? n : 4;
    for (int j = 0; j < T; ++j) tokens[j] = 100 * seq + c.sequence(seq)->length + j;
    const StepEntry e{seq, T, tokens.data()};
    auto step = c.begin_step(&e, 1);
    ASSERT_TRUE(step.ok()) << step.message().c_str();
    ASSERT_TRUE(c.commit(*step).ok());
    n -= T;
  }
}

TEST(Abort, BatchCacheIsExactlyAsBeforeTheStep) {
  auto created = BatchCache::create(batch_config());
  ASSERT_TRUE(created.ok()) << created.message().c_str();
  BatchCache& c = **created;
  ASSERT_TRUE(c.add_sequence(0).ok());
  decode(c, 0, 18);  // ring blocks released behind the window
  ASSERT_TRUE(c.fork(0, 1, 18).ok());  // shares the partly filled block 4
  ASSERT_TRUE(c.add_sequence(2).ok());
  const Snapshot before = snapshot(c);
  // Copy-on-write for 0 and 1 (the shared block), fresh blocks for 2, in-place
  // writes and a new block past the boundary for 0.
  const StepEntry entries[] = {{0, 4, nullptr}, {1, 1, nullptr}, {2, 3, nullptr}};
  const BatchStep step = *c.begin_step(entries, 3);
  const PlanCopy planned = copy_of(*c.plan(step));
  EXPECT_FALSE(snapshot(c) == before);  // the step took blocks
  ASSERT_TRUE(c.abort(step).ok());
  EXPECT_EQ(snapshot(c), before);
  EXPECT_EQ(c.commit(step).code(), Error::InvalidState);
  EXPECT_EQ(c.plan(step).error(), Error::InvalidState);
  EXPECT_EQ(c.abort(step).code(), Error::InvalidState);
  EXPECT_EQ(snapshot(c), before);
  // Beginning it again plans the very same rows and copies.
  const BatchStep again = *c.begin_step(entries, 3);
  EXPECT_EQ(copy_of(*c.plan(again)), planned);
  ASSERT_TRUE(c.commit(again).ok());
  EXPECT_EQ(c.sequence(0)->length, 22);
  EXPECT_EQ(c.sequence(2)->length, 3);
}

TEST(Abort, BatchCacheRefusesAForgedStepAndChangesNothing) {
  auto created = BatchCache::create(batch_config());
  ASSERT_TRUE(created.ok());
  BatchCache& c = **created;
  ASSERT_TRUE(c.add_sequence(0).ok());
  decode(c, 0, 5);
  const StepEntry e{0, 2, nullptr};
  const BatchStep step = *c.begin_step(&e, 1);
  const Snapshot begun = snapshot(c);
  EXPECT_EQ(c.abort(BatchStep{}).code(), Error::InvalidState);
  EXPECT_EQ(c.abort(BatchStep{step.id + 1, step.n_entries, step.n_tokens}).code(), Error::InvalidState);
  EXPECT_EQ(snapshot(c), begun);
  EXPECT_TRUE(c.check_step(step).ok());
}

}  // namespace
}  // namespace kvcore_test
