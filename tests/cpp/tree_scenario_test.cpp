// Named draft-tree scenarios of SequenceCache (docs/design.md section 7): a
// chain given as a tree plans exactly as a chain; a worked example's layout,
// mask and copies (flat and wrapped ring differ); trees wider than one mask
// word and larger than the storage reserved at create; clone and abort.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cache_fixtures.h"
#include "kvcore/core/draft_tree.h"
#include "support/counting_new.h"

namespace kvcore_test {
namespace {

using kvcore::DraftTree;
using kvcore::TreeCopy;

void fill(SequenceCache& cache, int length) {
  while (cache.length() < length) {
    const int T = length - cache.length() < cache.max_step() ? length - cache.length() : cache.max_step();
    auto s = cache.begin_step(T);
    ASSERT_TRUE(s.ok() && cache.commit(*s).ok());
  }
}

std::vector<TreeCopy> copies_of(const SequenceCache& cache, int layer) {
  auto c = cache.commit_copies(layer);
  EXPECT_TRUE(c.ok());
  return std::vector<TreeCopy>(c->copies, c->copies + c->n);
}

TEST(TreeScenario, ChainGivenAsTreeGivesTodaysPlans) {
  for (const LayerPolicy& p : {LayerPolicy::flat(), LayerPolicy::ring(4), LayerPolicy::ring(5, 2)}) {
    for (int L : {0, 3, 17, 40}) {
      for (int N = 1; N <= 6; ++N) {
        auto tree_cache = must_create(make_config(64, {p}, 6));
        auto chain_cache = must_create(make_config(64, {p}, 6));
        fill(*tree_cache, L);
        fill(*chain_cache, L);
        std::vector<int> chain(static_cast<std::size_t>(N));
        for (int i = 0; i < N; ++i) chain[static_cast<std::size_t>(i)] = i - 1;
        auto t = tree_cache->begin_tree(chain.data(), N);
        auto c = chain_cache->begin_step(N);
        ASSERT_TRUE(t.ok() && c.ok());
        EXPECT_EQ(*tree_cache->plan(0, *t), *chain_cache->plan(0, *c));
        const DraftTree& tree = **tree_cache->tree(*t);
        EXPECT_TRUE(tree.is_chain());
        for (int i = 0; i < N; ++i) EXPECT_EQ(tree.chain_indices()[i], i);
        ASSERT_TRUE(tree_cache->commit(*t).ok() && chain_cache->commit(*c).ok());
        EXPECT_TRUE(copies_of(*tree_cache, 0).empty());
        expect_same_state(*tree_cache, *chain_cache);
      }
    }
  }
}

// L = 12; nodes 0 -> {1, 2}, 2 -> 3: main line 0 1 (in place), then 2 and 3.
// Accepting 0 2 3 moves chain indices 2 -> 1 and 3 -> 2. A flat layer copies
// rows 14 -> 13 and 15 -> 14; a ring of W = 4, C = 4 (7 rows, wrapped: row(p) =
// p % 7) copies rows 0 -> 6 and 1 -> 0.
TEST(TreeScenario, WorkedExampleLayoutMaskAndCopies) {
  auto cache = must_create(make_config(100, {LayerPolicy::flat(), LayerPolicy::ring(4)}, 4));
  fill(*cache, 12);
  const std::vector<int> parents = {-1, 0, 0, 2};
  auto step = cache->begin_tree(parents.data(), 4);
  ASSERT_TRUE(step.ok());
  EXPECT_TRUE(step->tree);
  EXPECT_EQ(step->T, 4);
  const DraftTree& t = **cache->tree(*step);
  EXPECT_EQ(t.main_line(), 2);
  EXPECT_EQ(std::vector<int>(t.positions(), t.positions() + 4), (std::vector<int>{12, 13, 13, 14}));
  EXPECT_EQ(std::vector<int>(t.chain_indices(), t.chain_indices() + 4), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(t.mask_words(), 1);
  // Row i, bit j: j is i or an ancestor of i.
  EXPECT_EQ(std::vector<std::uint32_t>(t.mask(), t.mask() + 4), (std::vector<std::uint32_t>{0b1, 0b11, 0b101, 0b1101}));
  int rows[4];
  ASSERT_TRUE(cache->tree_rows(1, *step, rows).ok());
  EXPECT_EQ(std::vector<int>(rows, rows + 4), (std::vector<int>{5, 6, 0, 1}));
  // Ring reads positions 9..15 (W - 1 = 3 history keys, then the 4 node rows).
  std::vector<std::uint8_t> dense(4 * 7);
  ASSERT_TRUE(cache->dense_tree_mask(1, *step, dense.data()).ok());
  const std::vector<std::uint8_t> want = {
      1, 1, 1, 1, 0, 0, 0,  // node 0 at 12: sees 9, 10, 11 and itself
      0, 1, 1, 1, 1, 0, 0,  // node 1 at 13: window 10..13, the root and itself
      0, 1, 1, 1, 0, 1, 0,  // node 2 at 13: not its sibling 1
      0, 0, 1, 1, 0, 1, 1,  // node 3 at 14: window 11..14
  };
  EXPECT_EQ(dense, want);
  const std::vector<int> path = {0, 2, 3};
  ASSERT_TRUE(cache->commit(*step, path.data(), 3).ok());
  EXPECT_EQ(cache->length(), 15);
  EXPECT_EQ(copies_of(*cache, 0), (std::vector<TreeCopy>{{14, 13}, {15, 14}}));
  EXPECT_EQ(copies_of(*cache, 1), (std::vector<TreeCopy>{{0, 6}, {1, 0}}));
  // A chain commit afterwards reports no copies.
  auto next = cache->begin_step(1);
  ASSERT_TRUE(next.ok() && cache->commit(*next).ok());
  EXPECT_TRUE(copies_of(*cache, 1).empty());
}

TEST(TreeScenario, WideTreesSpanSeveralMaskWords) {
  auto cache = must_create(make_config(400, {LayerPolicy::ring(16, 2), LayerPolicy::flat()}, 300));
  fill(*cache, 50);
  // 200 nodes (beyond the 128 reserved at create): a star of 70 under the
  // root, then a line under the last of them.
  std::vector<int> parents(200);
  parents[0] = -1;
  for (int i = 1; i <= 70; ++i) parents[static_cast<std::size_t>(i)] = 0;
  for (int i = 71; i < 200; ++i) parents[static_cast<std::size_t>(i)] = i - 1;
  auto step = cache->begin_tree(parents.data(), 200);
  ASSERT_TRUE(step.ok()) << step.message().c_str();
  const DraftTree& t = **cache->tree(*step);
  EXPECT_EQ(t.mask_words(), 7);
  EXPECT_EQ(t.positions()[199], 50 + 130);
  EXPECT_TRUE(t.is_ancestor_or_self(70, 199) && t.is_ancestor_or_self(0, 199) && !t.is_ancestor_or_self(69, 199));
  std::vector<int> path = {0};
  for (int i = 70; i < 200; ++i) path.push_back(i);
  ASSERT_TRUE(cache->commit(*step, path.data(), static_cast<int>(path.size())).ok());
  EXPECT_EQ(cache->length(), 50 + 131);
  EXPECT_EQ(copies_of(*cache, 1).size(), 130u);  // all but the root leave the main line (0, 1)
  // Reserved ahead, the next large tree allocates nothing.
  ASSERT_TRUE(cache->reserve_tree(300).ok());
  const std::uint64_t before = operator_news();
  auto again = cache->begin_tree(parents.data(), 200);
  const bool ok = again.ok() && cache->commit(*again, path.data(), static_cast<int>(path.size())).ok();
  EXPECT_EQ(operator_news(), before);
  EXPECT_TRUE(ok);
}

TEST(TreeScenario, CloneCarriesTheBegunTreeAndTheCopies) {
  auto cache = must_create(make_config(60, {LayerPolicy::ring(3)}, 5));
  fill(*cache, 20);
  const std::vector<int> parents = {-1, 0, 0, 2, 2};
  auto step = cache->begin_tree(parents.data(), 5);
  ASSERT_TRUE(step.ok());
  auto copy = cache->clone();
  ASSERT_TRUE(copy.ok());
  const std::vector<int> path = {0, 2, 4};
  ASSERT_TRUE((*copy)->commit(*step, path.data(), 3).ok());
  ASSERT_TRUE(cache->commit(*step, path.data(), 3).ok());
  EXPECT_EQ(copies_of(**copy, 0), copies_of(*cache, 0));
  auto second = (*copy)->clone();  // the copies themselves are cloned
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(copies_of(**second, 0), copies_of(*cache, 0));
  expect_same_state(**copy, *cache);
}

// An aborted (or retried) tree counts its rows as written, as a chain of N does.
TEST(TreeScenario, AbortAndRetryCountTheTreesRows) {
  auto tree_cache = must_create(make_config(80, {LayerPolicy::ring(4, 1)}, 6));
  auto chain_cache = must_create(make_config(80, {LayerPolicy::ring(4, 1)}, 6));
  fill(*tree_cache, 30);
  fill(*chain_cache, 30);
  const std::vector<int> parents = {-1, 0, 0, 0, 1, 2};
  auto t = tree_cache->begin_tree(parents.data(), 6);
  auto c = chain_cache->begin_step(6);
  ASSERT_TRUE(t.ok() && c.ok());
  ASSERT_TRUE(tree_cache->abort(*t).ok() && chain_cache->abort(*c).ok());
  for (int n = 0; n <= 30; ++n) EXPECT_EQ(tree_cache->can_rewind(n), chain_cache->can_rewind(n)) << n;
  EXPECT_FALSE(tree_cache->can_rewind(27));  // rows of 30..35 overwrote 21..26, which 27 needs
  auto retry = tree_cache->begin_tree(parents.data(), 6);
  auto again = tree_cache->begin_tree(parents.data(), 6);  // replaces the first
  ASSERT_TRUE(retry.ok() && again.ok());
  const std::vector<int> path = {0, 1, 4};
  EXPECT_EQ(tree_cache->commit(*retry, path.data(), 3).code(), Error::InvalidState);
  EXPECT_TRUE(tree_cache->commit(*again, path.data(), 3).ok());
  EXPECT_TRUE(copies_of(*tree_cache, 0).empty());  // 0 1 4 is the main line
}

// A tree larger than the storage holds grows it; when memory runs out, the
// call reports it and changes nothing: the begun tree stays begun.
TEST(TreeScenario, GrowthFailureChangesNothing) {
  auto cache = must_create(make_config(400, {LayerPolicy::ring(8), LayerPolicy::flat()}, 300));
  fill(*cache, 10);
  const std::vector<int> small = {-1, 0, 0};
  auto begun = cache->begin_tree(small.data(), 3);
  ASSERT_TRUE(begun.ok());
  std::vector<int> big(200);
  for (int i = 0; i < 200; ++i) big[static_cast<std::size_t>(i)] = i - 1;
  int failures = 0;
  for (int successes = 0; successes < 10; ++successes) {  // begin_tree: the begun tree stays
    kvcore::Status outcome;
    bool failed = false;
    {
      FailNothrowNewAfter fail(successes);
      outcome = cache->begin_tree(big.data(), 200).status();
      failed = fail.failed_any();
    }
    if (!failed) break;
    ++failures;
    EXPECT_EQ(outcome.code(), Error::MemoryAllocationFailed);
    EXPECT_NE(std::string(outcome.message().c_str()).find("cannot allocate"), std::string::npos);
    ASSERT_EQ(cache->active_step().id, begun->id);
    auto tree = cache->tree(*begun);
    ASSERT_TRUE(tree.ok());
    EXPECT_EQ((*tree)->size(), 3);
    EXPECT_EQ((*tree)->chain_indices()[2], 2);
  }
  EXPECT_EQ(failures, 4);  // the copies, their counts, the tree's arrays, its mask
  auto again = cache->begin_tree(small.data(), 3);
  ASSERT_TRUE(again.ok() && cache->abort(*again).ok());
  auto fresh = must_create(make_config(400, {LayerPolicy::ring(8)}, 300));
  for (int successes = 0; successes < 4; ++successes) {  // reserve_tree
    FailNothrowNewAfter fail(successes);
    const kvcore::Status outcome = fresh->reserve_tree(300);
    EXPECT_TRUE(fail.failed_any());
    EXPECT_EQ(outcome.code(), Error::MemoryAllocationFailed);
  }
  const std::uint64_t before = operator_news();
  EXPECT_TRUE(fresh->reserve_tree(128).ok());  // still the 128 reserved at create: no growth
  EXPECT_EQ(operator_news(), before);
}

}  // namespace
}  // namespace kvcore_test
