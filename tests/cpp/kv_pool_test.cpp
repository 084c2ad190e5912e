// KVPool: bytes follow plans. Expectations come from a brute-force reference
// written from DESIGN.md (which positions a step needs, and the last bytes
// written to each position), never from the pool or the policies.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "pool_fixtures.h"

namespace kvcore_test {
namespace {

using kvcore::PoolAllocator;

// Every key some query of the step [P, P+T) may see, in increasing order, by
// brute force over DESIGN.md section 2's visibility rule.
std::vector<int> needed_positions(const LayerModel& m, int P, int T) {
  std::vector<int> out;
  for (int k = 0; k < P + T; ++k) {
    for (int q = P; q < P + T; ++q) {
      if (m.visible(q, k)) {
        out.push_back(k);
        break;
      }
    }
  }
  return out;
}

// Drives a cache and a pool through steps, keeping the reference: for every
// layer, the write id that last wrote each position (counting uncommitted
// steps: the backend may have written them).
class Driver {
 public:
  Driver(SequenceCache& cache, KVPool& pool) : cache_(cache), pool_(pool) {
    latest_.resize(static_cast<std::size_t>(cache.n_layers()));
  }

  // Begins a step of T, writes every layer, checks every read (gather and
  // views), and commits when asked.
  void step(int T, bool commit = true) {
    auto step = cache_.begin_step(T);
    ASSERT_TRUE(step.ok()) << step.message().c_str();
    const int id = ++write_id_;
    for (int l = 0; l < cache_.n_layers(); ++l) {
      auto plan = cache_.plan(l, *step);
      ASSERT_TRUE(plan.ok()) << plan.message().c_str();
      auto shape = pool_.layer(l);
      ASSERT_TRUE(shape.ok());
      std::vector<unsigned char> k, v;
      for (int j = 0; j < T; ++j) {
        auto kr = row_bytes(id + j * 1000, l, false, shape->k_row_bytes);
        auto vr = row_bytes(id + j * 1000, l, true, shape->v_row_bytes);
        k.insert(k.end(), kr.begin(), kr.end());
        v.insert(v.end(), vr.begin(), vr.end());
        latest_[static_cast<std::size_t>(l)][step->position + j] = id + j * 1000;
      }
      ASSERT_OK(pool_.write(l, *plan, k.data(), k.size(), v.data(), v.size()));
    }
    for (int l = 0; l < cache_.n_layers(); ++l) check_reads(l, *step);
    if (commit) {
      ASSERT_OK(cache_.commit(*step));
    }
  }

  // gather() returns exactly the needed positions, each with its latest bytes,
  // and views() concatenated equal gather().
  void check_reads(int l, const Step& step) {
    auto plan = cache_.plan(l, step);
    ASSERT_TRUE(plan.ok());
    const LayerModel model = LayerModel::of(config_of(cache_), l);
    const std::vector<int> needed = needed_positions(model, step.position, step.T);
    ASSERT_EQ(plan->read_len(), static_cast<int>(needed.size()));
    auto shape = pool_.layer(l);
    ASSERT_TRUE(shape.ok());
    const std::size_t kb = shape->k_row_bytes, vb = shape->v_row_bytes;
    std::vector<unsigned char> k(needed.size() * kb), v(needed.size() * vb);
    ASSERT_OK(pool_.gather(l, *plan, k.data(), k.size(), v.data(), v.size()));
    for (std::size_t i = 0; i < needed.size(); ++i) {
      const int id = latest_[static_cast<std::size_t>(l)].at(needed[i]);
      EXPECT_EQ(std::vector<unsigned char>(k.begin() + static_cast<long>(i * kb),
                                           k.begin() + static_cast<long>((i + 1) * kb)),
                row_bytes(id, l, false, kb))
          << "layer " << l << " K of position " << needed[i] << " at step " << step.position;
      EXPECT_EQ(std::vector<unsigned char>(v.begin() + static_cast<long>(i * vb),
                                           v.begin() + static_cast<long>((i + 1) * vb)),
                row_bytes(id, l, true, vb))
          << "layer " << l << " V of position " << needed[i];
    }
    auto views = pool_.views(l, *plan);
    ASSERT_TRUE(views.ok()) << views.message().c_str();
    std::vector<unsigned char> k_cat, v_cat;
    std::vector<int> positions;
    for (int i = 0; i < views->n; ++i) {
      const kvcore::KVSpan& s = views->span[i];
      k_cat.insert(k_cat.end(), s.k, s.k + kb * static_cast<std::size_t>(s.run.len));
      v_cat.insert(v_cat.end(), s.v, s.v + vb * static_cast<std::size_t>(s.run.len));
      for (int j = 0; j < s.run.len; ++j) positions.push_back(s.run.pos + j);
    }
    EXPECT_EQ(k_cat, k);
    EXPECT_EQ(v_cat, v);
    EXPECT_EQ(positions, needed);
    check_held_rows(l, step, *plan, needed);
  }

  // held_rows(): rows [0, n) in row order, no more than rows(layer); the rows
  // whose positions (from the geometry) a query of the step sees are exactly
  // the needed positions, one row each, holding their latest bytes. Other rows
  // may hold anything (a rewound draft, say): the mask hides them.
  void check_held_rows(int l, const Step& step, const kvcore::SeqStepPlan& plan,
                       const std::vector<int>& needed) {
    auto held = pool_.held_rows(l, plan);
    ASSERT_TRUE(held.ok()) << held.message().c_str();
    auto shape = pool_.layer(l);
    const kvcore::LayerGeometry geometry = *cache_.geometry(l);
    EXPECT_EQ(held->end, step.end());
    EXPECT_LE(held->rows, geometry.rows);
    EXPECT_EQ(held->k, shape->k);
    const LayerModel model = LayerModel::of(config_of(cache_), l);
    std::map<int, int> rows_of_position;
    for (int r = 0; r < held->rows; ++r) {
      const int p = geometry.position_at(r, step.end());
      ASSERT_GE(p, 0) << "row " << r << " of layer " << l;
      ASSERT_LT(p, step.end());
      EXPECT_EQ(geometry.row(p), r);
      bool seen = false;
      for (int q = step.position; q < step.end(); ++q) seen = seen || model.visible(q, p);
      if (!seen) continue;
      ++rows_of_position[p];
      const int id = latest_[static_cast<std::size_t>(l)].at(p);
      const std::size_t kb = shape->k_row_bytes, vb = shape->v_row_bytes;
      EXPECT_EQ(std::vector<unsigned char>(held->k + kb * r, held->k + kb * (r + 1)),
                row_bytes(id, l, false, kb))
          << "layer " << l << " held row " << r << " (position " << p << ")";
      EXPECT_EQ(std::vector<unsigned char>(held->v + vb * r, held->v + vb * (r + 1)),
                row_bytes(id, l, true, vb));
    }
    EXPECT_EQ(rows_of_position.size(), needed.size());
    EXPECT_EQ(geometry.position_at(held->rows, step.end()), -1);
    for (int p : needed) EXPECT_EQ(rows_of_position[p], 1) << "needed position " << p << " of layer " << l;
  }

 private:
  SequenceCache& cache_;
  KVPool& pool_;
  std::vector<std::map<int, int>> latest_;
  int write_id_ = 0;
};

KVPool must_pool(const SequenceCache& cache, DType dtype, PoolAllocator a = PoolAllocator::heap()) {
  auto r = KVPool::create(cache, dtype, a);
  KVCORE_CHECK(r.ok(), r.message().c_str());
  return std::move(r).get();
}

// ---------------------------------------------------------------------------

TEST(KVPool, RowShapesFollowConfigAndDType) {
  auto cache = must_create(pool_config(
      32, {flat_layer(2, 3), ring_layer(4, 1, 3, 5, 7), flat_layer(1, 1)}, 2));
  for (DType dt : {DType::Float32, DType::Float16, DType::BFloat16, DType::Int8, DType::UInt8}) {
    KVPool pool = must_pool(*cache, dt);
    EXPECT_EQ(pool.dtype(), dt);
    EXPECT_EQ(pool.n_layers(), 3);
    const std::size_t e = kvcore::element_size(dt);
    const std::size_t expect_k[] = {2 * 3 * e, 3 * 5 * e, 1 * 1 * e};
    const std::size_t expect_v[] = {2 * 3 * e, 3 * 7 * e, 1 * 1 * e};
    for (int l = 0; l < 3; ++l) {
      auto shape = pool.layer(l);
      ASSERT_TRUE(shape.ok());
      EXPECT_EQ(shape->k_row_bytes, expect_k[l]) << kvcore::to_string(dt) << " layer " << l;
      EXPECT_EQ(shape->v_row_bytes, expect_v[l]) << kvcore::to_string(dt) << " layer " << l;
      EXPECT_EQ(shape->rows, *cache->rows(l));
    }
  }
  EXPECT_EQ(kvcore::element_size(DType::Float32), 4u);
  EXPECT_EQ(kvcore::element_size(DType::BFloat16), 2u);
  EXPECT_STREQ(kvcore::to_string(DType::BFloat16), "bfloat16");
}

TEST(KVPool, FlatStepsOf1And5AndMaxStep) {
  auto cache = must_create(pool_config(40, {flat_layer()}, 6));
  KVPool pool = must_pool(*cache, DType::Float32);
  Driver d(*cache, pool);
  for (int T : {1, 5, 6, 1, 1, 6, 5}) d.step(T);
}

TEST(KVPool, RingDecodeWrapsAndReadsExactBytes) {
  auto cache = must_create(pool_config(64, {ring_layer(4)}, 1));
  KVPool pool = must_pool(*cache, DType::Float16);
  Driver d(*cache, pool);
  for (int i = 0; i < 21; ++i) d.step(1);
}

TEST(KVPool, MixedModelWithSinksChunksAndDecode) {
  std::vector<LayerConfig> layers(5, ring_layer(4, 2, 2, 3, 5));
  layers.push_back(flat_layer(2, 3, 5));
  auto cache = must_create(pool_config(80, layers, 4));
  KVPool pool = must_pool(*cache, DType::BFloat16);
  Driver d(*cache, pool);
  for (int T : {4, 4, 3, 4, 1, 1, 2, 4, 1, 1, 1, 4, 4})
    d.step(T);
}

TEST(KVPool, RewindAfterWrapThenDecodeReadsLatestBytes) {
  auto cache = must_create(pool_config(64, {ring_layer(4, 1), flat_layer()}, 3));
  KVPool pool = must_pool(*cache, DType::Int8);
  Driver d(*cache, pool);
  for (int T : {3, 3, 3, 1, 1}) d.step(T);
  // A speculative step of 3 drafts, two rejected.
  d.step(3);
  ASSERT_OK(cache->rewind(cache->length() - 2));
  for (int T : {1, 3, 1}) d.step(T);
  // An uncommitted step, retried at the same position.
  d.step(2, /*commit=*/false);
  d.step(2);
  d.step(1);
}

TEST(KVPool, LazyGrowthDoublesAndKeepsData) {
  auto cache = must_create(pool_config(40, {flat_layer(), ring_layer(3)}, 4, /*initial=*/2));
  TestAllocator alloc;
  KVPool pool = must_pool(*cache, DType::Float32, alloc.get());
  EXPECT_EQ(pool.layer(0)->allocated_rows, 2);
  EXPECT_EQ(pool.layer(1)->allocated_rows, 2);
  const std::size_t row = pool.layer(0)->k_row_bytes + pool.layer(0)->v_row_bytes;
  EXPECT_EQ(pool.reserved_bytes(), 4 * row);
  Driver d(*cache, pool);
  // Flat: rows needed 3 -> 4; 7 -> 8; 11 -> 16; 40 rows cap the doubling at 40.
  const int expect_flat[] = {4, 8, 16, 16, 32, 32, 32, 32, 40, 40};
  const int ring_rows = *cache->rows(1);  // W + C - 1 = 6
  int length = 0;
  for (int i = 0; i < 10; ++i) {
    d.step(4);
    length += 4;
    EXPECT_EQ(pool.layer(0)->allocated_rows, expect_flat[i]) << "after length " << length;
    EXPECT_LE(pool.layer(1)->allocated_rows, ring_rows);
  }
  EXPECT_EQ(pool.layer(1)->allocated_rows, ring_rows);
  EXPECT_EQ(pool.reserved_bytes(), (40 + static_cast<std::size_t>(ring_rows)) * row);
  EXPECT_EQ(alloc.live, 4);  // old blocks were released on every growth
}

TEST(KVPool, UsedBytesCountsHeldPositions) {
  auto cache = must_create(pool_config(100, {flat_layer(1, 2), ring_layer(4, 1, 1, 2)}, 2));
  KVPool pool = must_pool(*cache, DType::Float16);
  const std::size_t row = 2 * 2 * 2;  // K + V, 1 head x 2 dims x 2 bytes
  const int ring_rows = *cache->rows(1);
  EXPECT_EQ(pool.used_bytes(0), 0u);
  EXPECT_EQ(pool.used_bytes(-3), 0u);
  EXPECT_EQ(pool.used_bytes(3), (3 + 3) * row);
  EXPECT_EQ(pool.used_bytes(50), (50 + static_cast<std::size_t>(ring_rows)) * row);
  // The deprecated name (until kvcore 0.2.0) answers as used_bytes.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  for (int length : {-3, 0, 3, 50}) EXPECT_EQ(pool.in_use_bytes(length), pool.used_bytes(length)) << length;
#pragma GCC diagnostic pop
}

TEST(KVPool, GrowthFailureLeavesPoolIntact) {
  auto cache = must_create(pool_config(64, {flat_layer()}, 4, /*initial=*/4));
  TestAllocator alloc;
  KVPool pool = must_pool(*cache, DType::Float32, alloc.get());
  Driver d(*cache, pool);
  d.step(4);
  const std::vector<unsigned char> before = snapshot(pool);
  const std::size_t reserved = pool.reserved_bytes();
  auto step = cache->begin_step(2);
  ASSERT_TRUE(step.ok());
  auto plan = cache->plan(0, *step);
  const std::size_t kb = pool.layer(0)->k_row_bytes, vb = pool.layer(0)->v_row_bytes;
  std::vector<unsigned char> k(2 * kb, 0xAB), v(2 * vb, 0xCD);
  // Fail the K block, then (a second time) only the V block.
  for (int fail_after : {0, 1}) {
    alloc.fail_from = alloc.allocations + fail_after;
    kvcore::Status s = pool.write(0, *plan, k.data(), k.size(), v.data(), v.size());
    EXPECT_EQ(s.code(), Error::MemoryAllocationFailed);
    EXPECT_NE(std::string(s.message().c_str()).find("grow from 4 to 8 rows"), std::string::npos)
        << s.message().c_str();
    EXPECT_EQ(pool.layer(0)->allocated_rows, 4);
    EXPECT_EQ(pool.reserved_bytes(), reserved);
    EXPECT_EQ(snapshot(pool), before);
    EXPECT_EQ(alloc.live, 2);  // a K block allocated before V failed was given back
  }
  alloc.fail_from = INT_MAX;
  ASSERT_OK(cache->commit(*step));
  ASSERT_OK(cache->rewind(4));
  d.step(2);  // the same write now succeeds and all reads are exact
  EXPECT_EQ(pool.layer(0)->allocated_rows, 8);
}

TEST(KVPool, CreateFailureReleasesEverything) {
  auto cache = must_create(pool_config(16, {flat_layer(), flat_layer(), flat_layer()}, 2));
  for (int fail_from = 0; fail_from < 6; ++fail_from) {
    TestAllocator alloc;
    alloc.fail_from = fail_from;
    auto r = KVPool::create(*cache, DType::Float32, alloc.get());
    EXPECT_EQ(r.error(), Error::MemoryAllocationFailed) << "fail_from " << fail_from;
    EXPECT_EQ(alloc.live, 0) << "fail_from " << fail_from;
  }
  TestAllocator alloc;
  {
    auto r = KVPool::create(*cache, DType::Float32, alloc.get());
    ASSERT_TRUE(r.ok());
    KVPool moved(std::move(r).get());
    EXPECT_EQ(alloc.live, 6);
  }
  EXPECT_EQ(alloc.live, 0);  // released once, by the pool that owned the blocks
}

TEST(KVPool, ReserveGrowsNowAndChecksRange) {
  auto cache = must_create(pool_config(32, {flat_layer()}, 4, /*initial=*/2));
  KVPool pool = must_pool(*cache, DType::UInt8);
  EXPECT_OK(pool.reserve(0, 20));
  EXPECT_EQ(pool.layer(0)->allocated_rows, 20);
  EXPECT_OK(pool.reserve(0, 3));  // never shrinks
  EXPECT_EQ(pool.layer(0)->allocated_rows, 20);
  EXPECT_EQ(pool.reserve(0, 33).code(), Error::InvalidArgument);
  EXPECT_EQ(pool.reserve(0, -1).code(), Error::InvalidArgument);
  EXPECT_EQ(pool.reserve(1, 4).code(), Error::InvalidArgument);
  EXPECT_EQ(pool.layer(0)->allocated_rows, 20);
}

TEST(KVPool, ArenaRequiredBytesFitsAndRowsStartZeroed) {
  std::vector<LayerConfig> layers(5, ring_layer(4, 2, 2, 4, 6));
  layers.push_back(flat_layer(2, 4));
  const CacheConfig cfg = pool_config(50, layers, 3);
  auto cache = must_create(cfg);
  auto required = KVPool::required_bytes(cfg, DType::Float16);
  ASSERT_TRUE(required.ok()) << required.message().c_str();
  EXPECT_EQ(*KVPool::required_bytes(config_of(*cache), DType::Float16), *required);
  // At least the rows themselves; at most that plus alignment padding.
  std::size_t rows_bytes = 0;
  for (int l = 0; l < 6; ++l) {
    const LayerConfig& lc = cfg.layer(l);
    rows_bytes += static_cast<std::size_t>(*cache->rows(l)) * 2 *
                  static_cast<std::size_t>(lc.n_kv_heads * (lc.head_dim + lc.value_dim()));
  }
  EXPECT_GE(*required, rows_bytes);
  EXPECT_LE(*required, rows_bytes + 64 * (2 * 6 + 2) + 6 * sizeof(kvcore::PoolLayer));
  // Dirty, deliberately misaligned memory: any address works, rows start zeroed.
  std::vector<unsigned char> memory(*required + 1, 0xEE);
  void* arena = memory.data() + 1;

  auto made = KVPool::in_arena(*cache, DType::Float16, arena, *required);
  ASSERT_TRUE(made.ok()) << made.message().c_str();
  KVPool& pool = *made;
  EXPECT_TRUE(pool.uses_arena());
  for (int l = 0; l < 6; ++l) {
    auto shape = pool.layer(l);
    EXPECT_EQ(shape->allocated_rows, *cache->rows(l));
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(shape->k) % KVPool::kArenaAlignment, 0u);
    EXPECT_GE(shape->k, memory.data());
    EXPECT_LE(shape->v + shape->v_row_bytes * static_cast<std::size_t>(shape->rows),
              memory.data() + memory.size());
    for (std::size_t i = 0; i < shape->k_row_bytes * static_cast<std::size_t>(shape->rows); ++i)
      ASSERT_EQ(shape->k[i], 0) << "layer " << l;
    for (std::size_t i = 0; i < shape->v_row_bytes * static_cast<std::size_t>(shape->rows); ++i)
      ASSERT_EQ(shape->v[i], 0) << "layer " << l;
  }
  // Stepping through an arena allocates nothing: no_allocation_test.cpp.
  // A smaller or null arena is refused, naming both sizes.
  auto small = KVPool::in_arena(*cache, DType::Float16, arena, *required - 1);
  EXPECT_EQ(small.error(), Error::InvalidArgument);
  EXPECT_NE(std::string(small.message().c_str()).find(std::to_string(*required)), std::string::npos);
  EXPECT_EQ(KVPool::in_arena(*cache, DType::Float16, nullptr, *required).error(),
            Error::InvalidArgument);
}

TEST(KVPool, ArenaRunsTheReferenceScenario) {
  std::vector<LayerConfig> layers(2, ring_layer(3, 1));
  layers.push_back(flat_layer());
  const CacheConfig cfg = pool_config(40, layers, 2);
  auto cache = must_create(cfg);
  auto required = KVPool::required_bytes(cfg, DType::Float32);
  ASSERT_TRUE(required.ok());
  std::vector<unsigned char> memory(*required);
  auto made = KVPool::in_arena(*cache, DType::Float32, memory.data(), memory.size());
  ASSERT_TRUE(made.ok());
  Driver d(*cache, *made);
  for (int T : {2, 2, 1, 2, 1, 1, 2, 2, 1}) d.step(T);
  ASSERT_OK(cache->rewind(cache->length() - 1));
  for (int T : {1, 2, 2}) d.step(T);
}

TEST(KVPool, RequiredBytesRejectsBadConfigAndOverflow) {
  CacheConfig bad = pool_config(0, {flat_layer()}, 0);
  EXPECT_EQ(KVPool::required_bytes(bad, DType::Float32).error(), Error::InvalidArgument);
  CacheConfig huge = pool_config(INT_MAX, {flat_layer(1 << 20, 1 << 20)}, 1);
  auto r = KVPool::required_bytes(huge, DType::Float32);
  EXPECT_EQ(r.error(), Error::InvalidArgument);
  EXPECT_NE(std::string(r.message().c_str()).find("overflow"), std::string::npos) << r.message().c_str();
  EXPECT_EQ(KVPool::required_bytes(pool_config(4, {flat_layer()}, 1), static_cast<DType>(99))
                .error(),
            Error::InvalidArgument);
}

TEST(KVPool, CreateRejectsOverflowAndBadArguments) {
  auto huge = must_create(pool_config(INT_MAX, {flat_layer(1 << 20, 1 << 20)}, 1, 1));
  TestAllocator alloc;
  auto r = KVPool::create(*huge, DType::Float32, alloc.get());
  EXPECT_EQ(r.error(), Error::InvalidArgument);
  EXPECT_NE(std::string(r.message().c_str()).find("overflow"), std::string::npos) << r.message().c_str();
  EXPECT_EQ(alloc.allocations, 0);
  auto cache = must_create(pool_config(8, {flat_layer()}, 1));
  EXPECT_EQ(KVPool::create(*cache, static_cast<DType>(-1)).error(), Error::InvalidArgument);
  PoolAllocator half = PoolAllocator::heap();
  half.release = nullptr;
  EXPECT_EQ(KVPool::create(*cache, DType::Float32, half).error(), Error::InvalidArgument);
}

// A pool after a few steps, plus the plan of a begun step, for abuse.
struct KVPoolAbuse : ::testing::Test {
  void SetUp() override {
    cache = must_create(pool_config(32, {ring_layer(4, 1), flat_layer()}, 3, /*initial=*/8));
    auto made = KVPool::create(*cache, DType::Float32);
    ASSERT_TRUE(made.ok());
    pool.reset(new KVPool(std::move(made).get()));
    Driver d(*cache, *pool);
    for (int T : {3, 3, 1}) d.step(T);
    auto s = cache->begin_step(2);
    ASSERT_TRUE(s.ok());
    step = *s;
    plan = *cache->plan(0, step);
    kb = pool->layer(0)->k_row_bytes;
    vb = pool->layer(0)->v_row_bytes;
    k.assign(2 * kb, 0x5A);
    v.assign(2 * vb, 0xA5);
    before = snapshot(*pool);
  }
  // A failed call changed no byte and no storage.
  void expect_untouched() {
    EXPECT_EQ(snapshot(*pool), before);
    EXPECT_EQ(pool->layer(0)->allocated_rows, *cache->rows(0));
  }
  kvcore::Status write(const SeqStepPlan& p, int layer = 0) {
    return pool->write(layer, p, k.data(), k.size(), v.data(), v.size());
  }

  std::unique_ptr<SequenceCache> cache;
  std::unique_ptr<KVPool> pool;
  Step step;
  SeqStepPlan plan;
  std::size_t kb = 0, vb = 0;
  std::vector<unsigned char> k, v, before;
};

TEST_F(KVPoolAbuse, BadLayerIsRejected) {
  for (int layer : {-1, 2, INT_MAX, INT_MIN}) {
    kvcore::Status s = write(plan, layer);
    EXPECT_EQ(s.code(), Error::InvalidArgument);
    EXPECT_NE(std::string(s.message().c_str()).find("layer = " + std::to_string(layer)),
              std::string::npos)
        << s.message().c_str();
    EXPECT_EQ(pool->views(layer, plan).error(), Error::InvalidArgument);
    std::vector<unsigned char> out(64 * kb);
    EXPECT_EQ(pool->gather(layer, plan, out.data(), out.size(), out.data(), out.size()).code(),
              Error::InvalidArgument);
    EXPECT_EQ(pool->layer(layer).error(), Error::InvalidArgument);
  }
  expect_untouched();
}

TEST_F(KVPoolAbuse, HostileWriteRunsNeverWriteOutOfBounds) {
  const int rows = *cache->rows(0);
  const kvcore::Run bad_runs[] = {
      kvcore::Run{rows - 1, 2, 0},   // one past the last row
      kvcore::Run{rows, 1, 0},       // starts past the end
      kvcore::Run{-1, 2, 0},         // negative row
      kvcore::Run{0, 0, 0},          // empty run
      kvcore::Run{0, -2, 0},         // negative length
      kvcore::Run{INT_MAX, 2, 0},    // row + len overflows int
      kvcore::Run{0, 2, -1},         // negative position
  };
  for (const kvcore::Run& r : bad_runs) {
    SeqStepPlan p = plan;
    p.n_write = 1;
    p.write[0] = r;
    kvcore::Status s = write(p);
    EXPECT_EQ(s.code(), Error::InvalidArgument) << r.row << "," << r.len;
    EXPECT_NE(std::string(s.message().c_str()).find("write run 0 of layer 0"), std::string::npos)
        << s.message().c_str();
  }
  SeqStepPlan too_many = plan;
  too_many.n_write = 3;
  EXPECT_EQ(write(too_many).code(), Error::InvalidArgument);
  too_many.n_write = -1;
  EXPECT_EQ(write(too_many).code(), Error::InvalidArgument);
  expect_untouched();
}

TEST_F(KVPoolAbuse, HostileReadRunsAreRejected) {
  const int rows = *cache->rows(0);
  std::vector<unsigned char> k_out(64 * kb, 0x11), v_out(64 * vb, 0x22);
  const std::vector<unsigned char> k_fresh = k_out;
  for (const kvcore::Run& r : {kvcore::Run{rows - 2, 3, 0}, kvcore::Run{-1, 1, 0}, kvcore::Run{0, 0, 0}, kvcore::Run{INT_MAX, 1, 0}}) {
    SeqStepPlan p = plan;
    p.read[p.n_read - 1] = r;
    EXPECT_EQ(pool->views(0, p).error(), Error::InvalidArgument);
    EXPECT_EQ(pool->gather(0, p, k_out.data(), k_out.size(), v_out.data(), v_out.size()).code(),
              Error::InvalidArgument);
  }
  SeqStepPlan p = plan;
  p.n_read = 4;
  EXPECT_EQ(pool->views(0, p).error(), Error::InvalidArgument);
  EXPECT_EQ(k_out, k_fresh);  // gather wrote nothing on failure
  expect_untouched();
}

TEST_F(KVPoolAbuse, WrongBufferSizesAndNullsAreRejected) {
  std::vector<unsigned char> short_k(kb), long_k(3 * kb), short_v(vb);
  EXPECT_EQ(pool->write(0, plan, short_k.data(), short_k.size(), v.data(), v.size()).code(),
            Error::InvalidArgument);
  EXPECT_EQ(pool->write(0, plan, long_k.data(), long_k.size(), v.data(), v.size()).code(),
            Error::InvalidArgument);
  EXPECT_EQ(pool->write(0, plan, k.data(), k.size(), short_v.data(), short_v.size()).code(),
            Error::InvalidArgument);
  kvcore::Status null_k = pool->write(0, plan, nullptr, k.size(), v.data(), v.size());
  EXPECT_EQ(null_k.code(), Error::InvalidArgument);
  EXPECT_NE(std::string(null_k.message().c_str()).find("k is null"), std::string::npos)
      << null_k.message().c_str();
  const std::size_t read_rows = static_cast<std::size_t>(plan.read_len());
  std::vector<unsigned char> k_out(read_rows * kb - 1), v_out(read_rows * vb);
  kvcore::Status s = pool->gather(0, plan, k_out.data(), k_out.size(), v_out.data(), v_out.size());
  EXPECT_EQ(s.code(), Error::InvalidArgument);
  EXPECT_NE(std::string(s.message().c_str()).find("needs at least"), std::string::npos) << s.message().c_str();
  EXPECT_EQ(pool->gather(0, plan, nullptr, read_rows * kb, v_out.data(), v_out.size()).code(),
            Error::InvalidArgument);
  expect_untouched();
  // The same write with the right sizes is accepted.
  EXPECT_OK(write(plan));
}

TEST(KVPool, ReadingRowsNotGrownYetIsInvalidState) {
  auto cache = must_create(pool_config(32, {flat_layer()}, 4, /*initial=*/2));
  KVPool pool = must_pool(*cache, DType::Float32);
  auto step = cache->begin_step(4);
  auto plan = cache->plan(0, *step);
  auto views = pool.views(0, *plan);
  EXPECT_EQ(views.error(), Error::InvalidState);
  EXPECT_NE(std::string(views.message().c_str()).find("write the step"), std::string::npos);
  // Within the grown rows, unwritten rows read as zeros.
  auto one = cache->begin_step(2);
  auto small = cache->plan(0, *one);
  std::vector<unsigned char> k_out(2 * pool.layer(0)->k_row_bytes, 0xFF), v_out = k_out;
  ASSERT_OK(pool.gather(0, *small, k_out.data(), k_out.size(), v_out.data(), v_out.size()));
  EXPECT_EQ(k_out, std::vector<unsigned char>(k_out.size(), 0));
}

// A write whose input is a view of the same layer, when that write makes the
// layer grow: the input must be read before the old blocks are released.
TEST(KVPool, WriteFromAViewOfTheGrowingLayerCopiesBeforeReleasing) {
  auto cache = must_create(pool_config(16, {flat_layer()}, 4, /*initial=*/4));
  TestAllocator alloc;
  KVPool pool = must_pool(*cache, DType::Float32, alloc.get());
  const kvcore::PoolLayer shape = *pool.layer(0);
  std::vector<unsigned char> k(shape.k_row_bytes * 4), v(shape.v_row_bytes * 4);
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = static_cast<unsigned char>(i * 7 + 1);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<unsigned char>(i * 5 + 3);
  auto first = cache->begin_step(4);
  ASSERT_TRUE(first.ok());
  ASSERT_OK(pool.write(0, *cache->plan(0, *first), k.data(), k.size(), v.data(), v.size()));
  ASSERT_OK(cache->commit(*first));
  ASSERT_EQ(pool.layer(0)->allocated_rows, 4);

  auto second = cache->begin_step(4);  // rows 4..7: the layer must grow
  ASSERT_TRUE(second.ok());
  const kvcore::PoolLayer before = *pool.layer(0);  // rows 0..3 as the input
  ASSERT_OK(pool.write(0, *cache->plan(0, *second), before.k, k.size(), before.v, v.size()));
  EXPECT_GT(pool.layer(0)->allocated_rows, 4);
  EXPECT_EQ(alloc.live, 2);  // the replaced blocks were released after the copy
  auto plan = cache->plan(0, *second);
  std::vector<unsigned char> k_out(shape.k_row_bytes * 8), v_out(shape.v_row_bytes * 8);
  ASSERT_OK(pool.gather(0, *plan, k_out.data(), k_out.size(), v_out.data(), v_out.size()));
  for (std::size_t i = 0; i < k.size(); ++i) {
    ASSERT_EQ(k_out[k.size() + i], k[i]) << "K byte " << i << " of the copied rows";
  }
  for (std::size_t i = 0; i < v.size(); ++i) {
    ASSERT_EQ(v_out[v.size() + i], v[i]) << "V byte " << i << " of the copied rows";
  }
}

}  // namespace
}  // namespace kvcore_test

namespace kvcore_test {
namespace {

TEST(KVPool, HeldRowsRefusesAPlanWithoutWritesOrNotYetWritten) {
  auto cache = must_create(pool_config(64, {flat_layer()}, 4, /*initial_capacity=*/8));
  KVPool pool = must_pool(*cache, DType::Float32);
  auto held = pool.held_rows(0, kvcore::SeqStepPlan{});
  EXPECT_EQ(held.error(), Error::InvalidArgument);
  EXPECT_STREQ(held.message().c_str(), "held_rows of layer 0: the plan writes nothing");
  // Positions 0..9 need 10 rows; the layer holds 8 until a write grows it.
  kvcore::SeqStepPlan far;
  far.write[far.n_write++] = kvcore::Run{6, 4, 6};
  auto unwritten = pool.held_rows(0, far);
  EXPECT_EQ(unwritten.error(), Error::InvalidState);
  EXPECT_STREQ(unwritten.message().c_str(),
               "held_rows of layer 0: positions up to 9 need 10 rows, but the layer holds 8 rows "
               "so far: write the step before reading it");
  EXPECT_EQ(pool.held_rows(1, far).error(), Error::InvalidArgument);
}

}  // namespace
}  // namespace kvcore_test
