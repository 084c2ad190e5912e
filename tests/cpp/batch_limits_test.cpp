// Integers bounded where they enter (issue 18, item 4): BatchCache::create
// refuses a config whose positions or rows could pass the int range, each
// limit tested just below (accepted) and at it (refused), and a cache whose
// block boundaries lie just below 2^31 keeps every block a query needs.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>

#include "kvcore/batch/batch_cache.h"

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

// The issue's reproduction: capacity 2^31 - 1 over blocks of 2^28 rows puts the
// end of the last block a table can name, ceil(capacity / B) * B = 2^31, past
// int. Stepping to 2047 * 2^20 positions then made remove() index past the
// table (a crash) and fork() skip the block the source holds. create() now
// refuses it, naming the rule.
TEST(BatchLimits, IssueOverflowConfigIsRefusedAtCreate) {
  auto created = BatchCache::create(ring_config(0x7fffffff, 1 << 28));
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.error(), Error::InvalidArgument);
  EXPECT_STREQ(created.message().c_str(),
               "capacity = 2147483647, batch.block_size = 268435456: the last block ends at position "
               "2147483648; ceil(capacity / block_size) * block_size must be <= 2^31 - 1");
}

// The block-boundary limit at its edge: a last block ending at 2^31 - 1 passes,
// one ending a block later is refused; blocks of one row reach 2^31 - 1 too.
TEST(BatchLimits, LastBlockEndIsBoundedAtTwoTo31Minus1) {
  const int B = (1 << 28) - 1;  // 8 blocks end at 2^31 - 8, 9 blocks pass it
  CacheConfig below = ring_config(8 * B, B);
  EXPECT_TRUE(kvcore::validate_batch(below).ok()) << kvcore::validate_batch(below).message().c_str();
  CacheConfig at = ring_config(8 * B + 1, B);
  const kvcore::Status refused = kvcore::validate_batch(at);
  EXPECT_EQ(refused.code(), Error::InvalidArgument);
  EXPECT_NE(std::strstr(refused.message().c_str(), "must be <= 2^31 - 1"), nullptr) << refused.message().c_str();
  // ceil((2^31 - 1) / 1) * 1 = 2^31 - 1 is still a position.
  CacheConfig one_row = ring_config(0x7fffffff, 1);
  EXPECT_TRUE(kvcore::validate_batch(one_row).ok()) << kvcore::validate_batch(one_row).message().c_str();
  // 2^28 rows: 7 blocks end at 2^31 - 2^28 (passes), capacity one past needs 8.
  EXPECT_TRUE(kvcore::validate_batch(ring_config(7 << 28, 1 << 28)).ok());
  EXPECT_EQ(kvcore::validate_batch(ring_config((7 << 28) + 1, 1 << 28)).code(), Error::InvalidArgument);
}

// Block boundaries past 2^30: blocks of 2^29 - 1 rows, three per table (the
// last ends at capacity = 3 * (2^29 - 1)). A sequence stepped into its last
// block forks with every block it holds and removes its head down to one
// position without touching past its table. (2^30 positions of steps: the
// slowest test here, about a second.)
TEST(BatchLimits, BlocksNearTwoTo31ForkAndRemoveExactly) {
  const int B = (1 << 29) - 1;
  auto created = BatchCache::create(ring_config(3 * B, B));
  ASSERT_TRUE(created.ok()) << created.message().c_str();
  BatchCache& cache = **created;
  ASSERT_TRUE(cache.add_sequence(0).ok());
  grow(cache, 1024);  // 2^30 positions: into the last block, which starts at 2B
  const int length = cache.sequence(0)->length;
  ASSERT_EQ(length, 1 << 30);
  ASSERT_GT(length, 2 * B);
  const int held = *cache.blocks_held(0, 0);
  ASSERT_GE(held, 1);
  ASSERT_TRUE(cache.fork(0, 1, length).ok());
  EXPECT_EQ(*cache.blocks_held(1, 0), held);
  EXPECT_EQ(*cache.oldest_held(1, 0), *cache.oldest_held(0, 0));
  ASSERT_TRUE(cache.remove(0, 0, length - 1).ok());
  EXPECT_EQ(cache.sequence(0)->visible_start, length - 1);
  EXPECT_EQ(*cache.blocks_held(0, 0), 1);  // the last block keeps position length - 1
  EXPECT_EQ(*cache.oldest_held(0, 0), length - 1);
}

}  // namespace
}  // namespace kvcore_test
