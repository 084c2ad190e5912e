// Docs against code (issue 27, item 7), the two rules of docs/batch.md
// section 5 the docs left open, pinned in C++ as tests/python/test_batch_rules.py
// pins them in Python: at the first position of the block being filled the
// "block being filled" clause wins over the boundary clause (naming goes on),
// and two sequences that compute one prompt keep one copy, which one commit
// can both copy and pass (released twice, cached once).
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "kvcore/batch/batch_cache.h"

namespace kvcore_test {
namespace {

using kvcore::BatchCache;
using kvcore::BatchStep;
using kvcore::CacheConfig;
using kvcore::LayerConfig;
using kvcore::LayerPolicy;
using kvcore::StepEntry;

// One Ring(window = 1) layer, blocks of 2 rows.
std::unique_ptr<BatchCache> window_1_ring(int max_seqs, int max_step) {
  CacheConfig cfg;
  cfg.capacity = 32;
  cfg.n_layers = 1;
  cfg.layers = {LayerConfig{LayerPolicy::ring(1, 0), 1, 8, 0}};
  cfg.max_step = max_step;
  cfg.batch.block_size = 2;
  cfg.batch.max_seqs = max_seqs;
  auto created = BatchCache::create(cfg);
  EXPECT_TRUE(created.ok()) << created.message().c_str();
  return created.ok() ? std::move(*created) : nullptr;
}

// Block `i` of `seq`'s table (group 0), -1 for a hole.
int block_of(const BatchCache& c, int seq, int i) {
  return c.block_tables(0)[static_cast<std::ptrdiff_t>(c.table_rows()[seq]) * c.table_stride() + i];
}

void step(BatchCache& c, std::vector<StepEntry> entries) {
  auto begun = c.begin_step(entries.data(), static_cast<int>(entries.size()));
  ASSERT_TRUE(begun.ok()) << begun.message().c_str();
  ASSERT_TRUE(c.commit(*begun).ok());
}

TEST(BatchRules, ARewindToTheFirstPositionOfTheBlockBeingFilledKeepsNamingOnAWindow1Ring) {
  auto c = window_1_ring(2, 1);
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->add_sequence(0).ok());
  for (std::int32_t t : {1, 2, 3, 4, 5}) step(*c, {StepEntry{0, 1, &t}});
  EXPECT_EQ(block_of(*c, 0, 0), -1);  // blocks 0 and 1 given back: no group holds the block before 4
  EXPECT_EQ(block_of(*c, 0, 1), -1);
  ASSERT_TRUE(c->rewind(0, 4).ok());  // the first position of block 2, the block being filled
  for (std::int32_t t : {9, 10}) step(*c, {StepEntry{0, 1, &t}});  // fills block 2: named if seq 0 still names
  ASSERT_TRUE(c->add_sequence(1).ok());
  const std::int32_t prompt[] = {1, 2, 3, 4, 9, 10, 11};
  auto hit = c->adopt_prefix(1, prompt, 7);
  ASSERT_TRUE(hit.ok());
  EXPECT_EQ(*hit, 6);  // block 2 found by its name; had naming stopped, 4 (block 1, cached)
  EXPECT_EQ(block_of(*c, 1, 2), block_of(*c, 0, 2));
}

TEST(BatchRules, TwoSequencesComputingOnePromptShareOneCopyThatOneCommitCopiesAndPasses) {
  auto c = window_1_ring(3, 2);
  ASSERT_NE(c, nullptr);
  const std::int32_t head[] = {1, 2}, tail[] = {3, 4};
  for (int s : {0, 1}) {  // both compute [1, 2, 3, 4]: the second commit trades its copy for the first's
    ASSERT_TRUE(c->add_sequence(s).ok());
    step(*c, {StepEntry{s, 2, head}});
    step(*c, {StepEntry{s, 2, tail}});
  }
  const int shared = block_of(*c, 0, 1);
  ASSERT_GE(shared, 0);
  EXPECT_EQ(block_of(*c, 1, 1), shared);
  EXPECT_EQ(*c->free_blocks(0), *c->num_blocks(0) - 1);  // [1, 2] went with the window; one [3, 4]
  ASSERT_TRUE(c->rewind(0, 3).ok());
  // One commit releases the block twice: seq 0 writes into it (a copy, the
  // source goes at commit), seq 1's window passes it. It stays cached.
  const std::int32_t seven[] = {7}, five_six[] = {5, 6};
  const StepEntry entries[] = {StepEntry{0, 1, seven}, StepEntry{1, 2, five_six}};
  auto begun = c->begin_step(entries, 2);
  ASSERT_TRUE(begun.ok());
  const kvcore::BatchStepPlan plan = *c->plan(*begun);
  ASSERT_EQ(plan.groups[0].n_copies, 1);
  EXPECT_EQ(plan.groups[0].copies[0].src, shared);
  ASSERT_TRUE(c->commit(*begun).ok());
  EXPECT_EQ(*c->cached_blocks(0), 2);  // [1, 2] and [3, 4]
  ASSERT_TRUE(c->add_sequence(2).ok());
  const std::int32_t prompt[] = {1, 2, 3, 4, 8};
  auto hit = c->adopt_prefix(2, prompt, 5);
  ASSERT_TRUE(hit.ok());
  EXPECT_EQ(*hit, 4);
  EXPECT_EQ(block_of(*c, 2, 1), shared);
}

}  // namespace
}  // namespace kvcore_test
