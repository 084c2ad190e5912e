// Every draft-tree error path of SequenceCache (docs/design.md section 7) gives
// its error and changes nothing: a twin cache that received the same
// successful calls but not the failed one stays indistinguishable (length,
// the begun step and its tree, can_rewind, plans, the last commit's copies),
// and both then commit the same accepted path with the same copies.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cache_fixtures.h"
#include "kvcore/core/draft_tree.h"

namespace kvcore_test {
namespace {

using kvcore::DraftTree;

const std::vector<int> kTree = {-1, 0, 0, 1, 2, 4};  // main line 0 1 3; 2 4 5 off it
const std::vector<int> kPath = {0, 2, 4, 5};

std::unique_ptr<SequenceCache> cache_with_history() {
  auto cache = must_create(make_config(40, {LayerPolicy::ring(3, 1), LayerPolicy::flat()}, 6));
  for (int i = 0; i < 4; ++i) {  // past the ring's wrap (rows 1 + 3 + 6 - 1 = 9)
    auto s = cache->begin_step(3);
    EXPECT_TRUE(s.ok() && cache->commit(*s).ok());
  }
  return cache;
}

void expect_same_copies(const SequenceCache& a, const SequenceCache& b) {
  for (int l = 0; l < b.n_layers(); ++l) {
    auto ca = a.commit_copies(l);
    auto cb = b.commit_copies(l);
    ASSERT_TRUE(ca.ok() && cb.ok());
    ASSERT_EQ(ca->n, cb->n) << "layer " << l;
    for (int c = 0; c < cb->n; ++c) EXPECT_EQ(ca->copies[c], cb->copies[c]) << "layer " << l << " copy " << c;
  }
}

// `touched` got a failed call `twin` did not; both have the tree step `step`
// begun (same id, since both got the same successful calls).
void expect_same_tree_state(SequenceCache& touched, SequenceCache& twin, const Step& step) {
  EXPECT_EQ(touched.length(), twin.length());
  EXPECT_EQ(touched.active_step().id, twin.active_step().id);
  EXPECT_TRUE(touched.active_step().tree);
  for (int n = -1; n <= twin.length() + 1; ++n) EXPECT_EQ(touched.can_rewind(n), twin.can_rewind(n));
  expect_same_copies(touched, twin);
  auto ta = touched.tree(step);
  auto tb = twin.tree(step);
  ASSERT_TRUE(ta.ok() && tb.ok()) << ta.message().c_str();
  const DraftTree& a = **ta;
  const DraftTree& b = **tb;
  ASSERT_EQ(a.size(), b.size());
  for (int i = 0; i < b.size(); ++i) {
    EXPECT_EQ(a.positions()[i], b.positions()[i]);
    EXPECT_EQ(a.chain_indices()[i], b.chain_indices()[i]);
    EXPECT_EQ(a.mask()[i * b.mask_words()], b.mask()[i * b.mask_words()]);
  }
  for (int l = 0; l < twin.n_layers(); ++l) EXPECT_EQ(*touched.plan(l, step), *twin.plan(l, step));
  ASSERT_TRUE(touched.commit(step, kPath.data(), static_cast<int>(kPath.size())).ok());
  ASSERT_TRUE(twin.commit(step, kPath.data(), static_cast<int>(kPath.size())).ok());
  expect_same_copies(touched, twin);
  EXPECT_EQ(touched.length(), twin.length());
}

struct Pair {
  std::unique_ptr<SequenceCache> touched = cache_with_history();
  std::unique_ptr<SequenceCache> twin = cache_with_history();
  Step step;
  Pair() {
    auto a = touched->begin_tree(kTree.data(), static_cast<int>(kTree.size()));
    auto b = twin->begin_tree(kTree.data(), static_cast<int>(kTree.size()));
    EXPECT_TRUE(a.ok() && b.ok());
    step = *a;
  }
  void check() { expect_same_tree_state(*touched, *twin, step); }
};

void expect_error(const kvcore::Status& s, Error code, const char* contains) {
  EXPECT_EQ(s.code(), code) << s.message().c_str();
  EXPECT_NE(std::string(s.message().c_str()).find(contains), std::string::npos) << s.message().c_str();
}

TEST(TreeErrors, BadParentsChangeNothing) {
  const std::vector<std::pair<std::vector<int>, const char*>> bad = {
      {{0, 0}, "parents[0] = 0"},            // the root needs -1
      {{-1, 0, -1}, "a second root"},        // a second root
      {{-1, 1}, "parents[1] = 1"},           // a parent that is not before its child
      {{-1, 0, 3, 1}, "parents[2] = 3"},     // not topological
      {{-1, 0, -2}, "parents[2] = -2"},      // below -1
  };
  for (const auto& [parents, what] : bad) {
    Pair p;
    expect_error(p.touched->begin_tree(parents.data(), static_cast<int>(parents.size())).status(),
                 Error::InvalidArgument, what);
    p.check();
  }
}

TEST(TreeErrors, NodeCountOutOfRangeChangesNothing) {
  const std::vector<int> big(7, 0);
  Pair p;
  expect_error(p.touched->begin_tree(kTree.data(), 0).status(), Error::InvalidArgument, "N = 0");
  expect_error(p.touched->begin_tree(big.data(), 7).status(), Error::InvalidArgument, "N = 7");
  expect_error(p.touched->begin_tree(nullptr, 3).status(), Error::InvalidArgument, "parents is null");
  p.check();
}

TEST(TreeErrors, CapacityChangesNothing) {
  auto a = must_create(make_config(8, {LayerPolicy::flat()}, 6));
  auto b = must_create(make_config(8, {LayerPolicy::flat()}, 6));
  for (auto* c : {a.get(), b.get()}) {
    auto s = c->begin_step(4);
    ASSERT_TRUE(s.ok() && c->commit(*s).ok());
  }
  const std::vector<int> five = {-1, 0, 0, 1, 3};
  EXPECT_EQ(a->begin_tree(five.data(), 5).status().code(), Error::OutOfResources);
  expect_same_state(*a, *b);
}

TEST(TreeErrors, BadAcceptedPathsChangeNothing) {
  const std::vector<std::pair<std::vector<int>, const char*>> bad = {
      {{}, "accepted path of 0 nodes"},
      {{1}, "accepted[0] = 1"},
      {{0, 3}, "accepted[1] = 3: not a child"},  // a grandchild: skips a level
      {{0, 1, 4}, "accepted[2] = 4: not a child"},  // a cousin
      {{0, 6}, "accepted[1] = 6: a node index must be in [0, N = 6)"},
      {{0, -1}, "accepted[1] = -1"},
      {{0, 2, 4, 5, 1, 3, 0}, "accepted path of 7 nodes"},  // longer than N
  };
  for (const auto& [path, what] : bad) {
    Pair p;
    const int* data = path.empty() ? kPath.data() : path.data();
    expect_error(p.touched->commit(p.step, data, static_cast<int>(path.size())), Error::InvalidArgument, what);
    p.check();
  }
  Pair p;
  expect_error(p.touched->commit(p.step, nullptr, 2), Error::InvalidArgument, "accepted is null");
  p.check();
}

TEST(TreeErrors, CommittingATreeAsAChainChangesNothing) {
  Pair p;
  expect_error(p.touched->commit(p.step), Error::InvalidArgument, "not a chain");
  p.check();
}

TEST(TreeErrors, StaleAndWrongKindStepsChangeNothing) {
  Pair p;
  Step stale = p.step;
  stale.id += 7;
  expect_error(p.touched->commit(stale, kPath.data(), 4), Error::InvalidState, "not the begun step");
  expect_error(p.touched->tree(stale).status(), Error::InvalidState, "not the begun step");
  Step as_chain = p.step;
  as_chain.tree = false;  // the same id, but not what was begun
  expect_error(p.touched->commit(as_chain), Error::InvalidState, "not the begun step");
  int rows[6];
  std::uint8_t mask[6 * 32];
  expect_error(p.touched->tree_rows(5, p.step, rows), Error::InvalidArgument, "layer = 5");
  expect_error(p.touched->dense_tree_mask(-1, p.step, mask), Error::InvalidArgument, "layer = -1");
  expect_error(p.touched->commit_copies(2).status(), Error::InvalidArgument, "layer = 2");
  expect_error(p.touched->reserve_tree(0), Error::InvalidArgument, "reserve_tree(0)");
  expect_error(p.touched->reserve_tree(7), Error::InvalidArgument, "max_step = 6");
  p.check();
}

TEST(TreeErrors, ChainStepsRefuseTreeCallsAndNonPrefixPaths) {
  auto a = cache_with_history();
  auto b = cache_with_history();
  auto sa = a->begin_step(4);
  auto sb = b->begin_step(4);
  ASSERT_TRUE(sa.ok() && sb.ok());
  expect_error(a->tree(*sa).status(), Error::InvalidArgument, "begun by begin_step");
  int rows[4];
  expect_error(a->tree_rows(0, *sa, rows), Error::InvalidArgument, "begun by begin_step");
  const std::vector<int> skip = {0, 2};
  expect_error(a->commit(*sa, skip.data(), 2), Error::InvalidArgument, "accepted[1] = 2");
  const std::vector<int> five = {0, 1, 2, 3, 4};
  expect_error(a->commit(*sa, five.data(), 5), Error::InvalidArgument, "1 <= m <= T = 4");
  expect_same_state(*a, *b);
}

TEST(TreeErrors, ReserveDuringABegunTreeThatWouldGrowIsRefused) {
  auto a = must_create(make_config(400, {LayerPolicy::ring(8)}, 300));
  auto b = must_create(make_config(400, {LayerPolicy::ring(8)}, 300));
  const std::vector<int> chain3 = {-1, 0, 1};
  auto sa = a->begin_tree(chain3.data(), 3);
  auto sb = b->begin_tree(chain3.data(), 3);
  ASSERT_TRUE(sa.ok() && sb.ok());
  expect_error(a->reserve_tree(200), Error::InvalidState, "a tree step is begun");
  EXPECT_TRUE(a->reserve_tree(100).ok());  // fits already: no growth, nothing dropped
  ASSERT_TRUE(a->commit(*sa).ok() && b->commit(*sb).ok());  // a chain commits plainly
  expect_same_state(*a, *b);
}

}  // namespace
}  // namespace kvcore_test
