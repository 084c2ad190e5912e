// Integers bounded where they enter (issue 18, item 4): BatchCache::create
// refuses a config whose tables or rows could pass the int range, each limit
// tested just below (accepted) and at it (refused), and a cache whose last
// block ends past 2^31 - 1 keeps every block a query needs (block boundaries
// in 64 bits).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>

#include "kvcore/batch/batch_cache.h"
#include "support/counting_new.h"

namespace kvcore_test {
namespace {

using kvcore::BatchCache;
using kvcore::CacheConfig;
using kvcore::Error;
using kvcore::LayerConfig;
using kvcore::LayerPolicy;
using kvcore::StepEntry;

// One Ring(1) layer, two sequences, steps of up to 2^20 tokens, blocks of B rows.
CacheConfig ring_config(int capacity, int block_size) {
  CacheConfig cfg;
  cfg.capacity = capacity;
  cfg.n_layers = 1;
  cfg.layers.push_back(LayerConfig{LayerPolicy::ring(1), 1, 4, 0});
  cfg.max_step = 1 << 20;
  cfg.batch.block_size = block_size;
  cfg.batch.max_seqs = 2;
  return cfg;
}

// Steps sequence 0 by max_step tokens `steps` times (tokens not given).
void grow(BatchCache& cache, int steps) {
  for (int i = 0; i < steps; ++i) {
    const StepEntry entry{0, cache.max_step(), nullptr};
    auto step = cache.begin_step(&entry, 1);
    ASSERT_TRUE(step.ok()) << step.message().c_str();
    ASSERT_TRUE(cache.commit(*step).ok());
  }
}

// The reproduction: capacity 2^31 - 1 over blocks of 2^28 rows puts the
// end of the last block a table names, ceil(capacity / B) * B = 2^31, past
// int. Stepped to 2047 * 2^20 positions (into that last block), remove() used
// to index past the table (a crash) and fork() to skip the block the source
// holds ((i + 1) * B and i * B < p1 overflowed). Block boundaries are now
// computed in 64 bits. (2^31 positions of steps: about a second.)
TEST(BatchLimits, BlocksEndingPastTwoTo31ForkAndRemoveExactly) {
  auto created = BatchCache::create(ring_config(0x7fffffff, 1 << 28));
  ASSERT_TRUE(created.ok()) << created.message().c_str();
  BatchCache& cache = **created;
  ASSERT_TRUE(cache.add_sequence(0).ok());
  grow(cache, 2047);
  const int length = cache.sequence(0)->length;
  ASSERT_EQ(length, 2047 * (1 << 20));
  ASSERT_GT(length, 7 * (1 << 28));  // in block 7, which ends at 2^31
  ASSERT_EQ(*cache.blocks_held(0, 0), 1);
  ASSERT_TRUE(cache.fork(0, 1, length).ok());
  EXPECT_EQ(*cache.blocks_held(1, 0), 1);  // was 0
  const int stride = cache.table_stride();
  EXPECT_EQ(cache.block_tables(0)[stride + 7], cache.block_tables(0)[7]);
  EXPECT_GE(cache.block_tables(0)[7], 0);
  EXPECT_EQ(*cache.oldest_held(1, 0), *cache.oldest_held(0, 0));
  // dst steps on from the shared block: a copy of it, read from its own row.
  const StepEntry entry{1, 1, nullptr};
  auto step = cache.begin_step(&entry, 1);
  ASSERT_TRUE(step.ok()) << step.message().c_str();
  const kvcore::BatchStepPlan plan = *cache.plan(*step);
  ASSERT_EQ(plan.groups[0].n_copies, 1);
  EXPECT_EQ(plan.groups[0].copies[0].src, cache.block_tables(0)[7]);
  EXPECT_EQ(plan.groups[0].slots[0], plan.groups[0].copies[0].dst * (1 << 28) + length % (1 << 28));
  ASSERT_TRUE(cache.commit(*step).ok());
  ASSERT_TRUE(cache.remove(0, 0, length - 1).ok());  // was a crash
  EXPECT_EQ(cache.sequence(0)->visible_start, length - 1);
  EXPECT_EQ(*cache.blocks_held(0, 0), 1);  // the last block keeps position length - 1
  EXPECT_EQ(*cache.oldest_held(0, 0), length - 1);
  EXPECT_EQ(*cache.blocks_held(1, 0), 1);
}

// create() with every allocation after the cache object, its 7 layer
// tables, the 5 tables forming the groups and the 2 sharing storage failing
// (as in allocation_failure_test.cpp): a config within every limit gets
// MemoryAllocationFailed (it passed the checks), one past a limit
// InvalidArgument naming it.
kvcore::Status create_without_memory(const CacheConfig& cfg) {
  kvcore_test::FailNothrowNewAfter fail(15);
  return BatchCache::create(cfg).status();
}

void expect_limit(const CacheConfig& below, const CacheConfig& at, const char* message) {
  EXPECT_EQ(create_without_memory(below).code(), Error::MemoryAllocationFailed)
      << create_without_memory(below).message().c_str();
  const kvcore::Status refused = create_without_memory(at);
  EXPECT_EQ(refused.code(), Error::InvalidArgument);
  EXPECT_STREQ(refused.message().c_str(), message);
}

CacheConfig flat_config(int capacity, int block_size, int max_seqs) {
  CacheConfig cfg;
  cfg.capacity = capacity;
  cfg.n_layers = 1;
  cfg.layers.push_back(LayerConfig{LayerPolicy::flat(), 1, 4, 0});
  cfg.max_step = 1;
  cfg.batch.block_size = block_size;
  cfg.batch.max_seqs = max_seqs;
  cfg.batch.num_blocks = 1;
  return cfg;
}

// Each table limit of create() at its edge: 2^31 - 1 entries (or rows) pass, 2^31 are refused.
TEST(BatchLimits, EachTableLimitPassesJustBelowAndRefusesAt) {
  // Block tables: groups x sequences x ceil(capacity / B).
  expect_limit(flat_config((1 << 30) - 1, 1, 2), flat_config(1 << 30, 1, 2),
               "1 groups x 2 sequences x 1073741824 blocks per table: the tables would pass 2^31 entries");
  // The step's slots: groups x max_step_tokens.
  CacheConfig two_groups = flat_config(4, 1, 1);
  two_groups.n_layers = 2;
  two_groups.layers.push_back(LayerConfig{LayerPolicy::ring(2), 1, 4, 0});
  CacheConfig slots_below = two_groups, slots_at = two_groups;
  slots_below.batch.max_step_tokens = (1 << 30) - 1;
  slots_at.batch.max_step_tokens = 1 << 30;
  expect_limit(slots_below, slots_at,
               "2 groups x batch.max_step_tokens = 1073741824: the step's slot tables would pass 2^31 entries");
  // Removed ranges: max_seqs x max_holes.
  CacheConfig holes_below = flat_config(1, 1, 1 << 20), holes_at = holes_below;
  holes_below.batch.max_holes = 2047;
  holes_at.batch.max_holes = 2048;
  expect_limit(holes_below, holes_at,
               "batch.max_seqs = 1048576 x batch.max_holes = 2048: the removed-range tables would pass 2^31 "
               "entries");
  // Prefix tokens: max_seqs x B.
  expect_limit(flat_config(2047, 2047, 1 << 20), flat_config(2048, 2048, 1 << 20),
               "batch.max_seqs = 1048576 x batch.block_size = 2048: the prefix-token tables would pass 2^31 "
               "entries");
  // Pool rows: blocks x B (2^31 - 1 is prime: blocks of 2^16 rows, 32767 of them pass).
  CacheConfig rows_below = flat_config(1 << 16, 1 << 16, 1), rows_at = rows_below;
  rows_below.batch.num_blocks = 32767;
  rows_at.batch.num_blocks = 32768;
  expect_limit(rows_below, rows_at, "the pool: 32768 blocks of 65536 rows pass 2^31 rows");  // one pool, no group
}

}  // namespace
}  // namespace kvcore_test
