// fill_step_mask: a step's visibility as a dense mask over a group's pool rows.
// The random workloads of batch_brute_force_test.cpp compare it with the rule
// for every query; here a hand-worked case and every refused argument.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "kvcore/batch/batch_cache.h"
#include "kvcore/batch/step_mask.h"

namespace kvcore {
namespace {

std::unique_ptr<BatchCache> two_groups() {
  CacheConfig cfg;
  cfg.capacity = 32;
  cfg.n_layers = 2;
  cfg.max_step = 4;
  cfg.layers = {LayerConfig{LayerPolicy::ring(2, 1), 1, 2, 0}, LayerConfig{LayerPolicy::flat(), 1, 2, 0}};
  cfg.batch.block_size = 2;
  cfg.batch.max_seqs = 2;
  return std::move(BatchCache::create(cfg)).get();
}

TEST(StepMask, EachTokenSeesItsOwnSequencesRowsByTheRule) {
  auto cache = two_groups();
  ASSERT_TRUE(cache->add_sequence(0).ok() && cache->add_sequence(1).ok());
  // The groups draw from one pool: a step allocates entry after entry, each
  // in every group (ring, then flat), the lowest free block first.
  // seq 0: positions 0..3 in ring blocks 0, 1 and flat blocks 2, 3; seq 1:
  // positions 0..1 in ring block 4 and flat block 5.
  const StepEntry first[] = {{0, 4, nullptr}, {1, 2, nullptr}};
  auto prefill = cache->begin_step(first, 2);
  ASSERT_TRUE(prefill.ok() && cache->commit(*prefill).ok());
  // One more token each (the ring(2, 1) released nothing: 4 - C - W + 1 < 0):
  // seq 0 at position 4 in ring block 6, flat block 7; seq 1 at 2 in ring
  // block 8, flat block 9.
  const StepEntry next[] = {{0, 1, nullptr}, {1, 1, nullptr}};
  auto step = cache->begin_step(next, 2);
  ASSERT_TRUE(step.ok());
  auto plan = cache->plan(*step);
  ASSERT_TRUE(plan.ok());
  const int rows = *cache->used_blocks(0) * 2;
  ASSERT_EQ(rows, 20);
  // The plan carries each group's window bounds; the mask follows them.
  EXPECT_EQ(plan->groups[0].policy, LayerPolicy::ring(2, 1));
  EXPECT_EQ(plan->groups[1].policy, LayerPolicy::flat());
  std::vector<unsigned char> ring(2 * rows), flat(2 * rows);
  ASSERT_TRUE(fill_step_mask(*plan, 0, rows, ring.data()).ok());
  ASSERT_TRUE(fill_step_mask(*plan, 1, rows, flat.data()).ok());
  // Ring (window 2, sink 1): seq 0's query at 4 sees 0 (row 0), 3 (row 3), 4 (row 12);
  // seq 1's query at 2 sees 0 (row 8), 1 (row 9), 2 (row 16).
  const std::vector<unsigned char> want_ring = {1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,
                                                0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0};
  EXPECT_EQ(ring, want_ring);
  // Flat: every position of its own sequence up to itself: seq 0 rows 4..7
  // and 14, seq 1 rows 10, 11 and 18.
  const std::vector<unsigned char> want_flat = {0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0,
                                                0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 0};
  EXPECT_EQ(flat, want_flat);
}

TEST(StepMask, BadArgumentsAreRefused) {
  auto cache = two_groups();
  ASSERT_TRUE(cache->add_sequence(0).ok());
  const StepEntry one[] = {{0, 1, nullptr}};
  auto step = cache->begin_step(one, 1);
  ASSERT_TRUE(step.ok());
  auto plan = cache->plan(*step);
  unsigned char cell = 7;
  Status s = fill_step_mask(*plan, 2, 1, &cell);
  EXPECT_EQ(s.code(), Error::InvalidArgument);
  EXPECT_STREQ(s.message().c_str(), "group = 2: must be in [0, n_groups = 2)");
  s = fill_step_mask(*plan, 0, -1, &cell);
  EXPECT_EQ(s.code(), Error::InvalidArgument);
  EXPECT_STREQ(s.message().c_str(), "rows = -1: must be >= 0");
  s = fill_step_mask(*plan, 0, 1, nullptr);
  EXPECT_EQ(s.code(), Error::InvalidArgument);
  EXPECT_STREQ(s.message().c_str(), "fill_step_mask: mask is null");
  EXPECT_EQ(cell, 7);  // nothing written on a refusal
  EXPECT_TRUE(fill_step_mask(*plan, 0, 0, nullptr).ok());  // no rows, nothing to fill
}

}  // namespace
}  // namespace kvcore
