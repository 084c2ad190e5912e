// Config validation: every rule of DESIGN.md section 2, field by field. Each
// bad config gives InvalidArgument with a message naming the field and value,
// both from validate() and from SequenceCache::create().
#include <gtest/gtest.h>

#include <climits>
#include <cstring>
#include <string>

#include "cache_fixtures.h"
#include "kvcore/core/config.h"
#include "kvcore/core/sequence_cache.h"

namespace kvcore_test {
namespace {

using kvcore::validate;

CacheConfig good_config() {
  return make_config(64, {LayerPolicy::ring(8, 2), LayerPolicy::flat(), LayerPolicy::ring(4)},
                     /*max_step=*/4);
}

// validate() and create() both refuse `cfg` with InvalidArgument, and the
// message contains `field` and the offending `value`.
void expect_invalid(const CacheConfig& cfg, const std::string& field, const std::string& value) {
  kvcore::Status s = validate(cfg);
  EXPECT_EQ(s.code(), Error::InvalidArgument) << describe(cfg);
  EXPECT_NE(std::strstr(s.message().c_str(), field.c_str()), nullptr)
      << "message '" << s.message().c_str() << "' does not name " << field;
  EXPECT_NE(std::strstr(s.message().c_str(), value.c_str()), nullptr)
      << "message '" << s.message().c_str() << "' does not show the value " << value;
  auto cache = SequenceCache::create(cfg);
  EXPECT_FALSE(cache.ok());
  EXPECT_EQ(cache.error(), Error::InvalidArgument);
  EXPECT_STREQ(cache.message().c_str(), s.message().c_str());
}

TEST(ConfigValidation, GoodConfigPasses) {
  EXPECT_TRUE(validate(good_config()).ok());
  EXPECT_TRUE(SequenceCache::create(good_config()).ok());
}

TEST(ConfigValidation, CapacityMustBeAtLeastOne) {
  for (int bad : {0, -1, INT_MIN}) {
    CacheConfig cfg = good_config();
    cfg.capacity = bad;
    cfg.max_step = 0;  // so only capacity is wrong
    expect_invalid(cfg, "capacity", std::to_string(bad));
  }
  CacheConfig one = good_config();
  one.capacity = 1;
  one.max_step = 0;
  EXPECT_TRUE(validate(one).ok());
}

TEST(ConfigValidation, NLayersMustBeAtLeastOne) {
  for (int bad : {0, -3}) {
    CacheConfig cfg = good_config();
    cfg.n_layers = bad;
    expect_invalid(cfg, "n_layers", std::to_string(bad));
  }
}

TEST(ConfigValidation, LayersEmptyIsRefused) {
  CacheConfig cfg = good_config();
  cfg.layers.clear();
  expect_invalid(cfg, "layers", "0");
}

TEST(ConfigValidation, LayersMustBeOneOrNLayers) {
  CacheConfig two = good_config();  // 3 layers, 2 entries
  two.layers.pop_back();
  expect_invalid(two, "layers", "2");
  CacheConfig four = good_config();  // 3 layers, 4 entries
  four.layers.push_back(layer_of(LayerPolicy::flat()));
  expect_invalid(four, "layers", "4");
  CacheConfig broadcast = good_config();
  broadcast.layers.resize(1);
  broadcast.n_layers = 7;
  EXPECT_TRUE(validate(broadcast).ok());
}

TEST(ConfigValidation, MaxStepNegativeIsRefused) {
  for (int bad : {-1, INT_MIN}) {
    CacheConfig cfg = good_config();
    cfg.max_step = bad;
    expect_invalid(cfg, "max_step", std::to_string(bad));
  }
}

TEST(ConfigValidation, MaxStepAboveCapacityIsRefused) {
  CacheConfig cfg = good_config();
  cfg.max_step = cfg.capacity + 1;
  expect_invalid(cfg, "max_step", std::to_string(cfg.capacity + 1));
  cfg.max_step = INT_MAX;
  expect_invalid(cfg, "max_step", std::to_string(INT_MAX));
  cfg.max_step = cfg.capacity;  // the boundary is allowed
  EXPECT_TRUE(validate(cfg).ok());
}

TEST(ConfigValidation, MaxStepDefaultIsMin512Capacity) {
  CacheConfig small = make_config(100, {LayerPolicy::flat()});
  auto a = must_create(small);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->max_step(), 100);
  CacheConfig large = make_config(5000, {LayerPolicy::flat()});
  auto b = must_create(large);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->max_step(), 512);
}

TEST(ConfigValidation, FlatWithWindowIsRefused) {
  CacheConfig cfg = good_config();
  cfg.layers[1].policy.window = 3;
  expect_invalid(cfg, "layers[1].policy.window", "3");
}

TEST(ConfigValidation, FlatWithSinksIsRefused) {
  CacheConfig cfg = good_config();
  cfg.layers[1].policy.sinks = 1;
  expect_invalid(cfg, "layers[1].policy.sinks", "1");
}

TEST(ConfigValidation, RingWindowMustBeAtLeastOne) {
  for (int bad : {0, -4}) {
    CacheConfig cfg = good_config();
    cfg.layers[2].policy.window = bad;
    expect_invalid(cfg, "layers[2].policy.window", std::to_string(bad));
  }
  CacheConfig one = good_config();
  one.layers[2].policy.window = 1;
  EXPECT_TRUE(validate(one).ok());
}

TEST(ConfigValidation, RingNegativeSinksAreRefused) {
  CacheConfig cfg = good_config();
  cfg.layers[0].policy.sinks = -1;
  expect_invalid(cfg, "layers[0].policy.sinks", "-1");
}

TEST(ConfigValidation, UnknownKindIsRefused) {
  for (int bad : {5, -1, 77}) {
    CacheConfig cfg = good_config();
    cfg.layers[1].policy.kind = static_cast<LayerPolicy::Kind>(bad);
    expect_invalid(cfg, "layers[1].policy.kind", std::to_string(bad));
  }
}

TEST(ConfigValidation, NKvHeadsMustBeAtLeastOne) {
  CacheConfig cfg = good_config();
  cfg.layers[2].n_kv_heads = 0;
  expect_invalid(cfg, "layers[2].n_kv_heads", "0");
}

TEST(ConfigValidation, HeadDimMustBeAtLeastOne) {
  CacheConfig cfg = good_config();
  cfg.layers[0].head_dim = -8;
  expect_invalid(cfg, "layers[0].head_dim", "-8");
}

TEST(ConfigValidation, VHeadDimMustNotBeNegative) {
  CacheConfig cfg = good_config();
  cfg.layers[1].v_head_dim = -1;
  expect_invalid(cfg, "layers[1].v_head_dim", "-1");
}

TEST(ConfigValidation, VHeadDimZeroMeansHeadDim) {
  CacheConfig cfg = good_config();
  cfg.layers[0].head_dim = 64;
  cfg.layers[0].v_head_dim = 0;
  cfg.layers[1].head_dim = 192;
  cfg.layers[1].v_head_dim = 128;  // MLA-style: V narrower than K
  EXPECT_TRUE(validate(cfg).ok());
  EXPECT_EQ(cfg.layers[0].value_dim(), 64);
  EXPECT_EQ(cfg.layers[1].value_dim(), 128);
}

TEST(ConfigValidation, InitialCapacityMustBeAtLeastOne) {
  for (int bad : {0, -1}) {
    CacheConfig cfg = good_config();
    cfg.initial_capacity = bad;
    expect_invalid(cfg, "initial_capacity", std::to_string(bad));
  }
}

TEST(ConfigValidation, BroadcastEntryIsValidatedAsLayerZero) {
  CacheConfig cfg = make_config(32, {LayerPolicy::ring(0)}, 0, /*n_layers=*/4);
  expect_invalid(cfg, "layers[0].policy.window", "0");
}

TEST(ConfigValidation, BroadcastAppliesToEveryLayer) {
  CacheConfig cfg = make_config(32, {LayerPolicy::ring(6, 1)}, 2, /*n_layers=*/4);
  auto cache = must_create(cfg);
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(cache->n_layers(), 4);
  EXPECT_EQ(cache->n_groups(), 1);
  for (int l = 0; l < 4; ++l) {
    EXPECT_EQ(cache->policy(l).policy(), LayerPolicy::ring(6, 1));
    EXPECT_EQ(*cache->rows(l), 1 + 6 + 2 - 1);  // S + W + C - 1
  }
}

// --- Huge values: creating must not overflow, and rows follow DESIGN's formula
// computed in 64-bit arithmetic.

void expect_rows(const CacheConfig& cfg) {
  auto cache = must_create(cfg);
  ASSERT_NE(cache, nullptr);
  for (int l = 0; l < cfg.n_layers; ++l) {
    const LayerModel m = LayerModel::of(cfg, l);
    auto rows = cache->rows(l);
    ASSERT_TRUE(rows.ok());
    EXPECT_EQ(static_cast<std::int64_t>(*rows), m.rows()) << describe(cfg) << " layer " << l;
    EXPECT_GE(*rows, 1);
    EXPECT_LE(*rows, cfg.capacity);
    // row(p) agrees with the formula everywhere (small) or at both ends (huge).
    const kvcore::LayoutPolicy& policy = cache->policy(l);
    auto expect_row = [&](std::int64_t p) {
      EXPECT_EQ(static_cast<std::int64_t>(policy.row(static_cast<int>(p))), m.row(p))
          << describe(cfg) << " layer " << l << " position " << p;
    };
    if (cfg.capacity <= 4096) {
      for (std::int64_t p = 0; p < cfg.capacity; ++p) expect_row(p);
    } else {
      for (std::int64_t p = 0; p < 64; ++p) expect_row(p);
      for (std::int64_t p = cfg.capacity - 64; p < cfg.capacity; ++p) expect_row(p);
    }
  }
}

TEST(ConfigValidation, HugeCapacityFlat) {
  CacheConfig cfg = make_config(INT_MAX, {LayerPolicy::flat()});
  expect_rows(cfg);
  auto cache = must_create(cfg);
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(*cache->rows(0), INT_MAX);
  EXPECT_EQ(cache->max_step(), 512);
  EXPECT_TRUE(cache->can_extend(INT_MAX));
  EXPECT_FALSE(cache->can_extend(-1));
}

TEST(ConfigValidation, HugeWindowDoesNotOverflowRows) {
  // W + C - 1 exceeds INT_MAX: the layer never wraps, rows = capacity.
  expect_rows(make_config(INT_MAX, {LayerPolicy::ring(INT_MAX)}));
  expect_rows(make_config(INT_MAX, {LayerPolicy::ring(INT_MAX, INT_MAX)}, INT_MAX));
  expect_rows(make_config(100, {LayerPolicy::ring(INT_MAX, INT_MAX)}));
  expect_rows(make_config(INT_MAX, {LayerPolicy::ring(INT_MAX - 10, 5)}, 8));
}

TEST(ConfigValidation, HugeSinksDoNotOverflowRows) {
  expect_rows(make_config(INT_MAX, {LayerPolicy::ring(1, INT_MAX)}, 1));
  expect_rows(make_config(INT_MAX, {LayerPolicy::ring(4, INT_MAX - 4)}, 1));
  expect_rows(make_config(1000, {LayerPolicy::ring(16, INT_MAX)}, 8));
}

TEST(ConfigValidation, SmallRingInHugeCapacityWraps) {
  CacheConfig cfg = make_config(INT_MAX, {LayerPolicy::ring(4, 2), LayerPolicy::flat()}, 1);
  expect_rows(cfg);
  auto cache = must_create(cfg);
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(*cache->rows(0), 2 + 4 + 1 - 1);
  EXPECT_EQ(*cache->rows(1), INT_MAX);
}

TEST(ConfigValidation, WrapBoundaryIsExact) {
  // S + R == capacity: never wraps, rows = capacity. One more capacity: wraps.
  const int W = 5, S = 3, C = 4;  // S + R = 3 + 8 = 11
  expect_rows(make_config(11, {LayerPolicy::ring(W, S)}, C));
  expect_rows(make_config(12, {LayerPolicy::ring(W, S)}, C));
  expect_rows(make_config(10, {LayerPolicy::ring(W, S)}, C));
  auto at = must_create(make_config(11, {LayerPolicy::ring(W, S)}, C));
  auto above = must_create(make_config(12, {LayerPolicy::ring(W, S)}, C));
  ASSERT_TRUE(at && above);
  EXPECT_EQ(*at->rows(0), 11);
  EXPECT_EQ(*above->rows(0), 11);
}

}  // namespace
}  // namespace kvcore_test
