// The order in which the byte layers move bytes within one call, each held by
// a scenario whose reads come out wrong in any other order (issue 23's thin
// spots, once caught by only one or two tests):
//  - PagedKVPool::update performs the step's copy-on-write block copies before
//    it writes the step's rows: a new token lands in the copy's rows, so a
//    copy made after the write would overwrite it with the shared block's row;
//  - KVPool::write of a wrapped step (two runs) whose input is a view of the
//    layer's own rows copies first the run whose destination the other run's
//    input does not cover: last run first when the first run's destination
//    overlaps the input, in plan order when the second run's does.
// Expectations are written out by hand from the rows' contents before the call.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "kvcore/batch/batch_cache.h"
#include "kvcore/pool/paged_kv_pool.h"
#include "pool_fixtures.h"

namespace kvcore_test {
namespace {

using kvcore::BatchCache;
using kvcore::BatchStepPlan;
using kvcore::PagedKVPool;
using kvcore::PoolAllocator;
using kvcore::StepEntry;

// --- PagedKVPool: copies before writes ----------------------------------------

// One flat layer of 1 head x 1 dim in uint8 (a row is one byte), blocks of 4
// rows, two sequences. Sequence 0 holds positions 0..5 with bytes 1..6, so its
// block 1 holds positions 4, 5 in rows 0, 1 and nothing (zero) in rows 2, 3.
struct ForkedBlock {
  std::unique_ptr<BatchCache> cache;
  std::unique_ptr<PagedKVPool> pool;

  ForkedBlock() {
    CacheConfig cfg;
    cfg.capacity = 32;
    cfg.max_step = 4;
    cfg.n_layers = 1;
    cfg.layers = {LayerConfig{LayerPolicy::flat(), 1, 1, 0}};
    cfg.batch.block_size = 4;
    cfg.batch.max_seqs = 2;
    auto made = BatchCache::create(cfg);
    KVCORE_CHECK(made.ok(), made.message().c_str());
    cache = std::move(made).get();
    auto p = PagedKVPool::create(*cache, DType::UInt8, PoolAllocator::heap(), 0);
    KVCORE_CHECK(p.ok(), p.message().c_str());
    pool.reset(new PagedKVPool(std::move(p).get()));
    KVCORE_CHECK(cache->add_sequence(0).ok(), "add_sequence");
    const unsigned char first[4] = {1, 2, 3, 4}, second[2] = {5, 6};
    step({StepEntry{0, 4, nullptr}}, first, true);
    step({StepEntry{0, 2, nullptr}}, second, true);
  }

  // Begins a step of `entries`, updates the layer with one byte per token
  // (K = byte, V = byte + 100), commits when asked; returns the plan.
  BatchStepPlan step(std::vector<StepEntry> entries, const unsigned char* bytes, bool commit) {
    auto begun = cache->begin_step(entries.data(), static_cast<int>(entries.size()));
    KVCORE_CHECK(begun.ok(), begun.message().c_str());
    BatchStepPlan plan = *cache->plan(*begun);
    std::vector<unsigned char> k(bytes, bytes + plan.n_tokens), v(k);
    for (unsigned char& b : v) b = static_cast<unsigned char>(b + 100);
    KVCORE_CHECK(pool->update(0, plan, k.data(), k.size(), v.data(), v.size()).ok(), "update");
    if (commit) KVCORE_CHECK(cache->commit(*begun).ok(), "commit");
    return plan;
  }

  // Byte of `seq`'s position `pos` in the layer's K (or V) storage.
  unsigned char at(int seq, int pos, bool value) const {
    const int block = cache->block_tables(0)[seq * cache->table_stride() + pos / 4];
    const kvcore::PagedLayer layer = *pool->layer(0);
    return (value ? layer.v : layer.k)[block * 4 + pos % 4];
  }
};

TEST(PoolWriteOrder, PagedUpdateCopiesTheSharedBlockBeforeWritingTheNewTokenIntoTheCopy) {
  ForkedBlock rig;
  ASSERT_OK(rig.cache->fork(0, 1, 6));  // sequence 1 shares block 1 (positions 4, 5, partly filled)
  const unsigned char token[1] = {7};
  const BatchStepPlan plan = rig.step({StepEntry{1, 1, nullptr}}, token, false);
  // The step copies the shared block for its writer and puts position 6 in the copy.
  const kvcore::GroupPlan& gp = plan.groups[0];
  ASSERT_EQ(gp.n_copies, 1);
  const int shared = rig.cache->block_tables(0)[0 * rig.cache->table_stride() + 1];
  EXPECT_EQ(gp.copies[0].src, shared);
  ASSERT_EQ(gp.slots[0] / 4, gp.copies[0].dst);
  // Written first, the token would be overwritten by the shared block's (empty) row 2.
  const kvcore::PagedLayer layer = *rig.pool->layer(0);
  EXPECT_EQ(layer.k[gp.slots[0]], 7);
  EXPECT_EQ(layer.v[gp.slots[0]], 107);
  // gather: sequence 1 sees positions 0..6 with bytes 1..7, the copy's first rows included.
  unsigned char k[8] = {}, v[8] = {};
  std::int64_t positions[8] = {};
  auto n = rig.pool->gather(0, plan, 0, k, sizeof(k), v, sizeof(v), positions, 8);
  ASSERT_TRUE(n.ok()) << n.message().c_str();
  ASSERT_EQ(*n, 7);
  for (int p = 0; p < 7; ++p) {
    EXPECT_EQ(positions[p], p);
    EXPECT_EQ(k[p], p + 1) << "K of position " << p;
    EXPECT_EQ(v[p], p + 101) << "V of position " << p;
  }
  // The shared block is untouched: sequence 0 still holds positions 4, 5 and nothing after.
  EXPECT_EQ(layer.k[shared * 4 + 0], 5);
  EXPECT_EQ(layer.k[shared * 4 + 1], 6);
  EXPECT_EQ(layer.k[shared * 4 + 2], 0);
}

TEST(PoolWriteOrder, PagedUpdateOfBothForksWritesEachTokenIntoItsOwnCopyAfterCopying) {
  ForkedBlock rig;
  ASSERT_OK(rig.cache->fork(0, 1, 6));
  const unsigned char tokens[2] = {7, 8};
  const BatchStepPlan plan = rig.step({StepEntry{0, 1, nullptr}, StepEntry{1, 1, nullptr}}, tokens, true);
  ASSERT_EQ(plan.groups[0].n_copies, 2);
  for (int seq = 0; seq < 2; ++seq) {
    for (int p = 0; p < 6; ++p) EXPECT_EQ(rig.at(seq, p, false), p + 1) << "seq " << seq << " position " << p;
    EXPECT_EQ(rig.at(seq, 6, false), 7 + seq) << "seq " << seq;
    EXPECT_EQ(rig.at(seq, 6, true), 107 + seq) << "seq " << seq;
  }
}

// --- KVPool: a wrapped write from a view of its own rows ------------------------

// One ring layer, window 3, max_step 4: R = 6 ring rows, 1 head x 1 dim in
// uint8. Row r holds K = 10 + r and V = 20 + r (positions 0..5); the cache is
// rewound to 5, and a step of 2 writes position 5 to row 5 (run 0) and
// position 6 to row 0 (run 1).
struct WrappedWrite {
  std::unique_ptr<SequenceCache> cache;
  std::unique_ptr<KVPool> pool;
  kvcore::Step step;
  kvcore::SeqStepPlan plan;

  WrappedWrite() {
    cache = must_create(pool_config(32, {LayerConfig{LayerPolicy::ring(3), 1, 1, 0}}, 4));
    auto p = KVPool::create(*cache, DType::UInt8);
    KVCORE_CHECK(p.ok(), p.message().c_str());
    pool.reset(new KVPool(std::move(p).get()));
    for (int T : {4, 2}) {
      auto s = cache->begin_step(T);
      KVCORE_CHECK(s.ok(), s.message().c_str());
      unsigned char k[4], v[4];
      for (int j = 0; j < T; ++j) {
        k[j] = static_cast<unsigned char>(10 + s->position + j);
        v[j] = static_cast<unsigned char>(20 + s->position + j);
      }
      auto run_plan = cache->plan(0, *s);
      const std::size_t n = static_cast<std::size_t>(T);
      KVCORE_CHECK(pool->write(0, *run_plan, k, n, v, n).ok(), "write");
      KVCORE_CHECK(cache->commit(*s).ok(), "commit");
    }
    KVCORE_CHECK(cache->rewind(5).ok(), "rewind");
    auto s = cache->begin_step(2);
    KVCORE_CHECK(s.ok(), s.message().c_str());
    step = *s;
    plan = *cache->plan(0, step);
  }

  // Writes the step from rows [first, first + 2) of the layer itself.
  kvcore::Status write_from_rows(int first) {
    const kvcore::PoolLayer layer = *pool->layer(0);
    return pool->write(0, plan, layer.k + first, 2, layer.v + first, 2);
  }

  // K bytes of rows 0..5 (V must be K + 10 in every row).
  std::vector<int> rows() const {
    const kvcore::PoolLayer layer = *pool->layer(0);
    std::vector<int> out;
    for (int r = 0; r < 6; ++r) {
      EXPECT_EQ(layer.v[r], layer.k[r] + 10) << "row " << r;
      out.push_back(layer.k[r]);
    }
    return out;
  }
};

TEST(PoolWriteOrder, WrappedWriteRunsAsThePlanSays) {
  WrappedWrite rig;
  ASSERT_EQ(rig.plan.n_write, 2);
  EXPECT_EQ(rig.plan.write[0].row, 5);
  EXPECT_EQ(rig.plan.write[0].len, 1);
  EXPECT_EQ(rig.plan.write[1].row, 0);
  EXPECT_EQ(rig.plan.write[1].len, 1);
  EXPECT_EQ(rig.rows(), (std::vector<int>{10, 11, 12, 13, 14, 15}));
}

TEST(PoolWriteOrder, KVPoolWriteFromAViewOverlappingTheFirstRunsDestinationCopiesTheLastRunFirst) {
  // Input rows 4, 5: run 0 (row 5 <- row 4) would overwrite run 1's input
  // (row 5) before run 1 (row 0 <- row 5) read it.
  WrappedWrite rig;
  ASSERT_OK(rig.write_from_rows(4));
  EXPECT_EQ(rig.rows(), (std::vector<int>{15, 11, 12, 13, 14, 14}));
}

TEST(PoolWriteOrder, KVPoolWriteFromAViewOverlappingTheSecondRunsDestinationCopiesInPlanOrder) {
  // Input rows 0, 1: run 1 (row 0 <- row 1) would overwrite run 0's input
  // (row 0) before run 0 (row 5 <- row 0) read it.
  WrappedWrite rig;
  ASSERT_OK(rig.write_from_rows(0));
  EXPECT_EQ(rig.rows(), (std::vector<int>{11, 11, 12, 13, 14, 10}));
}

TEST(PoolWriteOrder, KVPoolWriteFromAViewApartFromBothDestinationsCopiesItAsItWas) {
  WrappedWrite rig;
  ASSERT_OK(rig.write_from_rows(2));  // rows 2, 3: neither run writes them
  EXPECT_EQ(rig.rows(), (std::vector<int>{13, 11, 12, 13, 14, 12}));
}

}  // namespace
}  // namespace kvcore_test
