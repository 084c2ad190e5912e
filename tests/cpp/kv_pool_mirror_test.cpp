// KVPool with RingStorage::Mirrored: a read that wraps round a ring is one
// span. Expectations come from DESIGN.md section 2 (the needed set, R = W + C - 1)
// and a brute-force record of the last bytes written to each position, never
// from the pool.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "pool_fixtures.h"

namespace kvcore_test {
namespace {

using kvcore::RingStorage;

LayerConfig layer(LayerPolicy policy) { return LayerConfig{policy, 2, 3, 5}; }

// Ring(4), Ring(3) with 2 sinks, Flat; capacity 40, C = 3: both rings wrap.
CacheConfig mixed(int initial_capacity = 512) {
  return pool_config(40, {layer(LayerPolicy::ring(4)), layer(LayerPolicy::ring(3, 2)),
                          layer(LayerPolicy::flat())},
                     3, initial_capacity);
}

// Drives a cache and a pool with seeded random steps (retries and rewinds
// included) and checks every layer's views after every write.
class MirrorDriver {
 public:
  MirrorDriver(SequenceCache& cache, KVPool& pool, bool mirrored)
      : cache_(cache), pool_(pool), mirrored_(mirrored),
        latest_(static_cast<std::size_t>(cache.n_layers())) {}

  void step(int T, bool commit) {
    auto step = cache_.begin_step(T);
    ASSERT_TRUE(step.ok()) << step.message().c_str();
    const int id = ++write_id_;
    for (int l = 0; l < cache_.n_layers(); ++l) {
      auto plan = cache_.plan(l, *step);
      ASSERT_TRUE(plan.ok());
      const kvcore::PoolLayer shape = *pool_.layer(l);
      std::vector<unsigned char> k(shape.k_row_bytes * static_cast<std::size_t>(T));
      std::vector<unsigned char> v(shape.v_row_bytes * static_cast<std::size_t>(T));
      for (int j = 0; j < T; ++j) {
        const std::size_t row = static_cast<std::size_t>(j);
        for (std::size_t i = 0; i < shape.k_row_bytes; ++i)
          k[row * shape.k_row_bytes + i] = byte_of(id + 1000 * j, l, false, i);
        for (std::size_t i = 0; i < shape.v_row_bytes; ++i)
          v[row * shape.v_row_bytes + i] = byte_of(id + 1000 * j, l, true, i);
        latest_[static_cast<std::size_t>(l)][step->position + j] = id + 1000 * j;
      }
      ASSERT_OK(pool_.write(l, *plan, k.data(), k.size(), v.data(), v.size()));
    }
    for (int l = 0; l < cache_.n_layers(); ++l) {
      check_views(l, *step);
      check_held_rows(l, *step);
    }
    if (commit) ASSERT_OK(cache_.commit(*step));
  }

  // Row order (the default read) on either storage: held_rows() spans the
  // ring's own rows, never the mirror, and each row a query of the step sees
  // holds its position's latest bytes; those rows are the plan's reads.
  void check_held_rows(int l, const Step& step) {
    auto plan = cache_.plan(l, step);
    ASSERT_TRUE(plan.ok());
    auto held = pool_.held_rows(l, *plan);
    ASSERT_TRUE(held.ok()) << held.message().c_str();
    const kvcore::LayerGeometry geometry = *cache_.geometry(l);
    EXPECT_LE(held->rows, geometry.rows);
    const LayerModel model = LayerModel::of(config_of(cache_), l);
    const kvcore::PoolLayer shape = *pool_.layer(l);
    int seen = 0;
    for (int r = 0; r < held->rows; ++r) {
      const int p = geometry.position_at(r, step.end());
      ASSERT_GE(p, 0) << "row " << r << " of layer " << l;
      bool visible = false;
      for (int q = step.position; q < step.end(); ++q) visible = visible || model.visible(q, p);
      if (!visible) continue;
      ++seen;
      const int id = latest_[static_cast<std::size_t>(l)].at(p);
      const std::size_t row = static_cast<std::size_t>(r);
      for (std::size_t i = 0; i < shape.k_row_bytes; ++i)
        ASSERT_EQ(held->k[row * shape.k_row_bytes + i], byte_of(id, l, false, i))
            << "layer " << l << " K of position " << p << " in row " << r;
      for (std::size_t i = 0; i < shape.v_row_bytes; ++i)
        ASSERT_EQ(held->v[row * shape.v_row_bytes + i], byte_of(id, l, true, i))
            << "layer " << l << " V of position " << p << " in row " << r;
    }
    EXPECT_EQ(seen, plan->read_len()) << "layer " << l << " step at " << step.position;
  }

  // A mirrored layer (a wrapping ring without sinks in a mirrored pool): one
  // span per needed interval. Any other: one span per plan run.
  // Either way the spans hold exactly the needed positions' latest bytes.
  void check_views(int l, const Step& step) {
    auto plan = cache_.plan(l, step);
    ASSERT_TRUE(plan.ok());
    const std::vector<Interval> intervals =
        needed_intervals(LayerModel::of(config_of(cache_), l), step.position, step.T);
    auto views = pool_.views(l, *plan);
    ASSERT_TRUE(views.ok()) << views.message().c_str();
    const kvcore::PoolLayer shape = *pool_.layer(l);
    const kvcore::LayerGeometry geometry = *cache_.geometry(l);
    EXPECT_EQ(shape.mirror_rows, mirrored_ ? geometry.mirror_rows() : 0);
    if (shape.mirror_rows > 0) {
      ASSERT_EQ(views->n, static_cast<int>(intervals.size()))
          << "layer " << l << " step at " << step.position << " T " << step.T;
    } else {
      ASSERT_EQ(views->n, plan->n_read);
    }
    std::vector<int> seen;
    for (int s = 0; s < views->n; ++s) {
      const kvcore::KVSpan& span = views->span[s];
      for (int j = 0; j < span.run.len; ++j) {
        const int position = span.run.pos + j;
        seen.push_back(position);
        const int id = latest_[static_cast<std::size_t>(l)].at(position);
        const std::size_t row = static_cast<std::size_t>(j);
        for (std::size_t i = 0; i < shape.k_row_bytes; ++i)
          ASSERT_EQ(span.k[row * shape.k_row_bytes + i], byte_of(id, l, false, i))
              << "layer " << l << " K of position " << position << " at step " << step.position;
        for (std::size_t i = 0; i < shape.v_row_bytes; ++i)
          ASSERT_EQ(span.v[row * shape.v_row_bytes + i], byte_of(id, l, true, i))
              << "layer " << l << " V of position " << position << " at step " << step.position;
      }
    }
    if (mirrored_ && shape.mirror_rows > 0 && shape.allocated_rows == shape.rows) {
      // PoolLayer's invariant: the mirror repeats the ring's first mirror_rows rows.
      const std::size_t head = static_cast<std::size_t>(shape.ring_start);
      const std::size_t tail = static_cast<std::size_t>(shape.rows);
      const std::size_t n = static_cast<std::size_t>(shape.mirror_rows);
      ASSERT_EQ(std::vector<unsigned char>(shape.k + head * shape.k_row_bytes,
                                           shape.k + (head + n) * shape.k_row_bytes),
                std::vector<unsigned char>(shape.k + tail * shape.k_row_bytes,
                                           shape.k + (tail + n) * shape.k_row_bytes))
          << "layer " << l << " K mirror after step at " << step.position;
      ASSERT_EQ(std::vector<unsigned char>(shape.v + head * shape.v_row_bytes,
                                           shape.v + (head + n) * shape.v_row_bytes),
                std::vector<unsigned char>(shape.v + tail * shape.v_row_bytes,
                                           shape.v + (tail + n) * shape.v_row_bytes))
          << "layer " << l << " V mirror after step at " << step.position;
    }
    std::vector<int> want;
    for (const Interval& iv : intervals)
      for (std::int64_t p = iv.begin; p < iv.end; ++p) want.push_back(static_cast<int>(p));
    ASSERT_EQ(seen, want) << "layer " << l << " step at " << step.position;
  }

  // Random steps to the end of capacity: T in [1, C], a retry now and then, and
  // rewinds of up to C tokens when the cache allows them.
  void run(std::uint32_t seed) {
    std::mt19937 rng(seed);
    const int C = cache_.max_step();
    while (!::testing::Test::HasFatalFailure()) {
      const int left = cache_.capacity() - cache_.length();
      if (left == 0) break;
      const int T = 1 + static_cast<int>(rng() % static_cast<unsigned>(left < C ? left : C));
      const unsigned roll = rng() % 10;
      if (roll == 0) step(T, /*commit=*/false);  // abandoned, then retried below
      step(T, /*commit=*/true);
      const int back = 1 + static_cast<int>(rng() % static_cast<unsigned>(C));
      if (roll == 1 && cache_.can_rewind(cache_.length() - back))
        ASSERT_OK(cache_.rewind(cache_.length() - back));
    }
  }

 private:
  SequenceCache& cache_;
  KVPool& pool_;
  bool mirrored_;
  std::vector<std::map<int, int>> latest_;
  int write_id_ = 0;
};

TEST(KVPoolMirror, GrowingPoolReadsEveryWindowAsOneSpanPerNeededInterval) {
  for (std::uint32_t seed = 1; seed <= 40 && !HasFatalFailure(); ++seed) {
    // initial_capacity 1: layers grow by doubling into their full rows mid-run.
    auto cache = must_create(mixed(/*initial_capacity=*/1));
    auto pool = KVPool::create(*cache, DType::UInt8, kvcore::PoolAllocator::heap(),
                               RingStorage::Mirrored);
    ASSERT_TRUE(pool.ok()) << pool.message().c_str();
    MirrorDriver(*cache, *pool, /*mirrored=*/true).run(seed);
  }
}

TEST(KVPoolMirror, ArenaPoolReadsEveryWindowAsOneSpanPerNeededInterval) {
  for (std::uint32_t seed = 1; seed <= 20 && !HasFatalFailure(); ++seed) {
    auto cache = must_create(mixed());
    auto bytes = KVPool::required_bytes(config_of(*cache), DType::Float16, RingStorage::Mirrored);
    ASSERT_TRUE(bytes.ok());
    std::vector<unsigned char> arena(*bytes + 3);
    // An odd address: the arena works at any alignment.
    auto pool = KVPool::in_arena(*cache, DType::Float16, arena.data() + 3, *bytes,
                                 RingStorage::Mirrored);
    ASSERT_TRUE(pool.ok()) << pool.message().c_str();
    MirrorDriver(*cache, *pool, /*mirrored=*/true).run(seed);
  }
}

TEST(KVPoolMirror, CompactPoolKeepsOneSpanPerRun) {
  auto cache = must_create(mixed());
  auto pool = KVPool::create(*cache, DType::UInt8);
  ASSERT_TRUE(pool.ok());
  MirrorDriver(*cache, *pool, /*mirrored=*/false).run(7);
}

// Mirror rows: R - 1 per wrapping ring layer without sinks (R = W + C - 1),
// none for flat layers, rings with sinks (their read is two spans anyway) or
// rings that never wrap (S + R >= capacity).
TEST(KVPoolMirror, ReservesRMinusOneExtraRowsPerWrappingRingWithoutSinks) {
  const int C = 3;
  const CacheConfig cfg = pool_config(
      12, {layer(LayerPolicy::ring(4)), layer(LayerPolicy::ring(3, 2)), layer(LayerPolicy::flat()),
           layer(LayerPolicy::ring(9, 1))},  // 1 + 9 + 3 - 1 = 12 rows: never wraps
      C);
  auto cache = must_create(cfg);
  auto compact = KVPool::create(*cache, DType::Float32);
  auto mirrored =
      KVPool::create(*cache, DType::Float32, kvcore::PoolAllocator::heap(), RingStorage::Mirrored);
  ASSERT_TRUE(compact.ok() && mirrored.ok());
  const std::size_t row = 2 * 3 * 4 + 2 * 5 * 4;  // K + V bytes of one row
  const std::size_t extra = static_cast<std::size_t>((4 + C - 1) - 1) * row;
  EXPECT_EQ(mirrored->reserved_bytes(), compact->reserved_bytes() + extra);
  EXPECT_EQ(mirrored->layer(0)->mirror_rows, 4 + C - 2);
  EXPECT_EQ(mirrored->layer(1)->mirror_rows, 0);
  EXPECT_EQ(mirrored->layer(1)->ring_start, 2);
  EXPECT_EQ(mirrored->layer(2)->mirror_rows, 0);
  EXPECT_EQ(mirrored->layer(3)->mirror_rows, 0);
  EXPECT_EQ(compact->layer(0)->mirror_rows, 0);
  // used_bytes counts positions, not storage: the mirror does not change it.
  EXPECT_EQ(mirrored->used_bytes(12), compact->used_bytes(12));

  auto need_compact = KVPool::required_bytes(cfg, DType::Float32);
  auto need_mirrored = KVPool::required_bytes(cfg, DType::Float32, RingStorage::Mirrored);
  ASSERT_TRUE(need_compact.ok() && need_mirrored.ok());
  EXPECT_GE(*need_mirrored, *need_compact + extra);
  std::vector<unsigned char> arena(*need_mirrored);
  auto too_small = KVPool::in_arena(*cache, DType::Float32, arena.data(), *need_compact,
                                    RingStorage::Mirrored);
  EXPECT_EQ(too_small.error(), Error::InvalidArgument);
}

TEST(KVPoolMirror, RingStorageOutsideTheEnumIsRefused) {
  auto cache = must_create(mixed());
  const auto bad = static_cast<RingStorage>(7);
  auto created = KVPool::create(*cache, DType::UInt8, kvcore::PoolAllocator::heap(), bad);
  EXPECT_EQ(created.error(), Error::InvalidArgument);
  EXPECT_NE(std::string(created.message().c_str()).find("ring_storage = 7"), std::string::npos)
      << created.message().c_str();
  EXPECT_EQ(KVPool::required_bytes(config_of(*cache), DType::UInt8, bad).error(),
            Error::InvalidArgument);
  std::vector<unsigned char> arena(1 << 16);
  EXPECT_EQ(KVPool::in_arena(*cache, DType::UInt8, arena.data(), arena.size(), bad).error(),
            Error::InvalidArgument);
}

}  // namespace
}  // namespace kvcore_test
