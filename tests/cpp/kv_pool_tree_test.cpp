// KVPool with draft trees (pool/kv_pool_tree.h), byte-exact: a pool over a
// cache that verifies random trees (writing every node's K/V, committing a
// random accepted path and performing its copies) reads exactly what a pool
// over a cache that wrote the accepted tokens as a chain (a chain step of N
// whose rows hold the accepted tokens, then a rewind to the accepted length)
// reads, step after step, on flat and ring layers with and without sinks,
// compact and mirrored. And the error paths of write_tree / copy_rows.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kvcore/pool/kv_pool_tree.h"
#include "pool_fixtures.h"
#include "rng.h"

namespace kvcore_test {
namespace {

using kvcore::DraftTree;
using kvcore::RingStorage;
using kvcore::TreeCopy;

KVPool make_pool(const SequenceCache& cache, RingStorage storage) {
  auto r = KVPool::create(cache, DType::Float32, kvcore::PoolAllocator::heap(), storage);
  KVCORE_CHECK(r.ok(), r.message().c_str());
  return std::move(r).get();
}

// n rows of a layer, row i the bytes of write ids[i].
std::vector<unsigned char> rows_of(const std::vector<int>& ids, int layer, bool value, std::size_t n_bytes) {
  std::vector<unsigned char> out;
  for (int id : ids) {
    const std::vector<unsigned char> r = row_bytes(id, layer, value, n_bytes);
    out.insert(out.end(), r.begin(), r.end());
  }
  return out;
}

// Gathers every layer's read of the begun step on both pools: byte-equal.
void expect_same_reads(const SequenceCache& a, const KVPool& pa, const SequenceCache& b, const KVPool& pb,
                       std::uint64_t seed) {
  for (int l = 0; l < a.n_layers(); ++l) {
    const kvcore::SeqStepPlan plan = *a.plan(l, a.active_step());
    ASSERT_EQ(plan, *b.plan(l, b.active_step()));
    const kvcore::PoolLayer shape = *pa.layer(l);
    const std::size_t rows = static_cast<std::size_t>(plan.read_len());
    std::vector<unsigned char> ka(rows * shape.k_row_bytes), va(rows * shape.v_row_bytes);
    std::vector<unsigned char> kb(ka.size()), vb(va.size());
    ASSERT_OK(pa.gather(l, plan, ka.data(), ka.size(), va.data(), va.size()));
    ASSERT_OK(pb.gather(l, plan, kb.data(), kb.size(), vb.data(), vb.size()));
    ASSERT_EQ(ka, kb) << "seed " << seed << " layer " << l << " K";
    ASSERT_EQ(va, vb) << "seed " << seed << " layer " << l << " V";
  }
}

TEST(KVPoolTree, CommittedTreesReadAsChainsOfTheAcceptedTokens) {
  for (std::uint64_t seed = 1; seed <= 150; ++seed) {
    Rng rng(seed);
    const int C = rng.uniform(1, 8);
    const CacheConfig cfg = pool_config(
        C + rng.uniform(10, 80),
        {flat_layer(), ring_layer(rng.uniform(1, 6)), ring_layer(rng.uniform(1, 6), rng.uniform(1, 3), 1, 2, 3)}, C,
        rng.uniform(1, 16));
    auto tree_cache = must_create(cfg);
    auto chain_cache = must_create(cfg);
    const RingStorage storage = rng.percent(50) ? RingStorage::Mirrored : RingStorage::Compact;
    KVPool tree_pool = make_pool(*tree_cache, storage);
    KVPool chain_pool = make_pool(*chain_cache, storage);
    int next_id = 1;
    while (tree_cache->length() < tree_cache->capacity()) {
      const int L = tree_cache->length();
      const int n = rng.uniform(1, C < tree_cache->capacity() - L ? C : tree_cache->capacity() - L);
      std::vector<int> parents(static_cast<std::size_t>(n), -1), ids(static_cast<std::size_t>(n));
      std::vector<std::vector<int>> children(static_cast<std::size_t>(n));
      for (int i = 0; i < n; ++i) {
        if (i > 0) parents[static_cast<std::size_t>(i)] = rng.percent(40) ? i - 1 : rng.uniform(0, i - 1);
        if (i > 0) children[static_cast<std::size_t>(parents[static_cast<std::size_t>(i)])].push_back(i);
        ids[static_cast<std::size_t>(i)] = next_id++;
      }
      std::vector<int> path{0};
      while (!children[static_cast<std::size_t>(path.back())].empty() && rng.percent(75)) {
        const auto& c = children[static_cast<std::size_t>(path.back())];
        path.push_back(c[static_cast<std::size_t>(rng.uniform(0, static_cast<int>(c.size()) - 1))]);
      }
      const int m = static_cast<int>(path.size());
      auto t = tree_cache->begin_tree(parents.data(), n);
      auto c = chain_cache->begin_step(n);
      ASSERT_TRUE(t.ok() && c.ok());
      const DraftTree& tree = **tree_cache->tree(*t);
      // The chain pool holds the accepted tokens at their positions, other
      // tokens (rejected drafts) after them.
      std::vector<int> chain_ids;
      for (int d = 0; d < m; ++d) chain_ids.push_back(ids[static_cast<std::size_t>(path[static_cast<std::size_t>(d)])]);
      while (static_cast<int>(chain_ids.size()) < n) chain_ids.push_back(next_id++);
      for (int l = 0; l < cfg.n_layers; ++l) {
        const kvcore::PoolLayer shape = *tree_pool.layer(l);
        const std::vector<unsigned char> k = rows_of(ids, l, false, shape.k_row_bytes);
        const std::vector<unsigned char> v = rows_of(ids, l, true, shape.v_row_bytes);
        ASSERT_OK(kvcore::write_tree(tree_pool, l, *tree_cache->plan(l, *t), tree, k.data(), k.size(), v.data(),
                                     v.size()));
        const std::vector<unsigned char> ck = rows_of(chain_ids, l, false, shape.k_row_bytes);
        const std::vector<unsigned char> cv = rows_of(chain_ids, l, true, shape.v_row_bytes);
        ASSERT_OK(chain_pool.write(l, *chain_cache->plan(l, *c), ck.data(), ck.size(), cv.data(), cv.size()));
      }
      ASSERT_OK(tree_cache->commit(*t, path.data(), m));
      ASSERT_OK(chain_cache->commit(*c));
      ASSERT_OK(chain_cache->rewind(L + m));
      for (int l = 0; l < cfg.n_layers; ++l) {
        const kvcore::RowCopies copies = *tree_cache->commit_copies(l);
        ASSERT_OK(kvcore::copy_rows(tree_pool, l, copies.copies, copies.n));
      }
      // The next step, written alike on both, reads alike on both.
      if (!tree_cache->can_extend(1)) break;
      const int T = rng.uniform(1, C < tree_cache->capacity() - tree_cache->length() ? C : tree_cache->capacity() - tree_cache->length());
      auto a = tree_cache->begin_step(T);
      auto b = chain_cache->begin_step(T);
      ASSERT_TRUE(a.ok() && b.ok());
      std::vector<int> step_ids;
      for (int j = 0; j < T; ++j) step_ids.push_back(next_id++);
      for (int l = 0; l < cfg.n_layers; ++l) {
        const kvcore::PoolLayer shape = *tree_pool.layer(l);
        const std::vector<unsigned char> k = rows_of(step_ids, l, false, shape.k_row_bytes);
        const std::vector<unsigned char> v = rows_of(step_ids, l, true, shape.v_row_bytes);
        ASSERT_OK(tree_pool.write(l, *tree_cache->plan(l, *a), k.data(), k.size(), v.data(), v.size()));
        ASSERT_OK(chain_pool.write(l, *chain_cache->plan(l, *b), k.data(), k.size(), v.data(), v.size()));
      }
      expect_same_reads(*tree_cache, tree_pool, *chain_cache, chain_pool, seed);
      if (HasFatalFailure()) return;
      ASSERT_OK(tree_cache->commit(*a));
      ASSERT_OK(chain_cache->commit(*b));
    }
  }
}

TEST(KVPoolTree, ErrorsWriteAndCopyNothing) {
  auto cache = must_create(pool_config(40, {ring_layer(4)}, 4, 4));  // 7 rows, 4 allocated
  KVPool pool = make_pool(*cache, RingStorage::Compact);
  const std::vector<int> parents = {-1, 0, 0};
  auto step = cache->begin_tree(parents.data(), 3);
  ASSERT_TRUE(step.ok());
  const DraftTree& tree = **cache->tree(*step);
  const kvcore::SeqStepPlan plan = *cache->plan(0, *step);
  const kvcore::PoolLayer shape = *pool.layer(0);
  std::vector<unsigned char> k(3 * shape.k_row_bytes, 1), v(3 * shape.v_row_bytes, 2);
  const std::vector<unsigned char> before = snapshot(pool);
  EXPECT_EQ(kvcore::write_tree(pool, 1, plan, tree, k.data(), k.size(), v.data(), v.size()).code(),
            Error::InvalidArgument);  // bad layer
  EXPECT_EQ(kvcore::write_tree(pool, 0, plan, tree, k.data(), k.size() - 1, v.data(), v.size()).code(),
            Error::InvalidArgument);  // not N rows
  kvcore::SeqStepPlan other = plan;
  other.write[0].pos += 1;
  EXPECT_EQ(kvcore::write_tree(pool, 0, other, tree, k.data(), k.size(), v.data(), v.size()).code(),
            Error::InvalidArgument);  // not the tree's step
  kvcore::SeqStepPlan outside_rows = plan;
  outside_rows.write[0].row = 40;
  EXPECT_EQ(kvcore::write_tree(pool, 0, outside_rows, tree, k.data(), k.size(), v.data(), v.size()).code(),
            Error::InvalidArgument);  // a run outside the rows
  const kvcore::PoolLayer rows = *pool.layer(0);
  EXPECT_EQ(kvcore::write_tree(pool, 0, plan, tree, rows.k, k.size(), v.data(), v.size()).code(),
            Error::InvalidArgument);  // input inside the pool
  const TreeCopy outside[1] = {{0, 99}};
  EXPECT_EQ(kvcore::copy_rows(pool, 0, outside, 1).code(), Error::InvalidArgument);
  EXPECT_EQ(kvcore::copy_rows(pool, 0, nullptr, 1).code(), Error::InvalidArgument);
  const TreeCopy unwritten[1] = {{shape.rows - 1, 0}};
  ASSERT_LT(shape.allocated_rows, shape.rows);
  EXPECT_EQ(kvcore::copy_rows(pool, 0, unwritten, 1).code(), Error::InvalidState);
  EXPECT_EQ(snapshot(pool), before);
  EXPECT_OK(kvcore::copy_rows(pool, 0, nullptr, 0));
}

}  // namespace
}  // namespace kvcore_test
