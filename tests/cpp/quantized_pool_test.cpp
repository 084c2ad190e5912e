// Quantized storage formats (QInt8, Fp8E4M3; docs/quantized.md): the codec's
// conversions and rules by hand, then the byte layers driven with values.
// Expectations come from a model that quantizes each written row on its own
// (quantize_row into a buffer of one row, never the pool's) and remembers the
// last row written at each position: a scale or zero point that does not
// follow its row, through wraps, mirrors, rewinds, copies and records, fails.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "kvcore/batch/batch_cache.h"
#include "kvcore/pool/paged_kv_pool.h"
#include "kvcore/pool/quantize.h"
#include "kvcore/state/sequence_export.h"
#include "kvcore/state/sequence_import.h"
#include "pool_fixtures.h"
#include "support/counting_new.h"
#include "support/uniform.h"

namespace kvcore_test {
namespace {

using kvcore::BatchCache;
using kvcore::BatchStepPlan;
using kvcore::PagedKVPool;
using kvcore::QuantRowLayout;
using kvcore::RingStorage;
using kvcore::StepEntry;
namespace qd = kvcore::quant_detail;

float bits_float(std::uint32_t x) { return qd::float_of(x); }

TEST(QuantizedCodec, HalfAndBfloat16RoundTripEveryValue) {
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    const float f = qd::half_to_float(static_cast<std::uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(qd::float_to_half(f), h) << h;
    const float b = qd::bf16_to_float(static_cast<std::uint16_t>(h));
    if (!std::isnan(b)) {
      EXPECT_EQ(qd::float_to_bf16(b), h) << h;
    }
  }
  // Ties go to even; overflow goes to inf.
  EXPECT_EQ(qd::float_to_half(1.0f + 1.0f / 2048), 0x3C00);            // 1 + half an ulp: to 1
  EXPECT_EQ(qd::float_to_half(1.0f + 3.0f / 2048), 0x3C02);            // 1 + 1.5 ulp: to 1 + 2 ulp
  EXPECT_EQ(qd::float_to_half(65520.0f), 0x7C00);
  EXPECT_EQ(qd::float_to_half(bits_float(0x33000000u)), 0x0000);       // 2^-25: half of the least subnormal
  EXPECT_EQ(qd::float_to_half(bits_float(0x33000001u)), 0x0001);
  EXPECT_EQ(qd::float_to_bf16(bits_float(0x3F808000u)), 0x3F80);       // tie to even
  EXPECT_EQ(qd::float_to_bf16(bits_float(0x3F818000u)), 0x3F82);
}

TEST(QuantizedCodec, E4m3RoundTripsEveryFiniteCodeAndRoundsHalfToEven) {
  for (int c = 0; c < 256; ++c) {
    const float f = qd::e4m3_to_float(static_cast<std::uint8_t>(c));
    if (std::isnan(f)) {
      EXPECT_EQ(c & 0x7F, 0x7F);
      continue;
    }
    EXPECT_EQ(qd::float_to_e4m3(f), c) << c;
  }
  EXPECT_EQ(qd::e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(qd::e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(qd::float_to_e4m3(std::ldexp(0.5f, -9)), 0x00);   // tie between 0 and the least: 0 (even)
  EXPECT_EQ(qd::float_to_e4m3(std::ldexp(1.5f, -9)), 0x02);   // tie between 1 and 2: 2
  EXPECT_EQ(qd::float_to_e4m3(1.0625f), 0x38);                // 1 + 1/16: tie, to 1.0
  EXPECT_EQ(qd::float_to_e4m3(1.1875f), 0x3A);                // 1 + 3/16: tie, to 1.25
  EXPECT_EQ(qd::float_to_e4m3(-448.0f), 0xFE);
}

// ExecuTorch's rule by hand: x = {-1, 0, 1, 2}: scale 3/255, zero point -43.
TEST(QuantizedCodec, QInt8FollowsExecuTorchsRuleByHand) {
  const float x[4] = {-1.0f, 0.0f, 1.0f, 2.0f};
  const QuantRowLayout layout = QuantRowLayout::of(DType::QInt8, 1, 4);
  EXPECT_EQ(layout.scales, 4u);
  EXPECT_EQ(layout.zeros, 8u);
  EXPECT_EQ(layout.bytes, 12u);
  unsigned char row[12];
  std::memset(row, 0xEE, sizeof(row));
  kvcore::quantize_row(DType::QInt8, 1, 4, DType::Float32, x, row);
  float scale;
  std::memcpy(&scale, row + 4, 4);
  EXPECT_EQ(scale, 3.0f / 255.0f);
  EXPECT_EQ(static_cast<std::int8_t>(row[8]), -43);
  EXPECT_EQ(static_cast<std::int8_t>(row[0]), -128);
  EXPECT_EQ(static_cast<std::int8_t>(row[1]), -43);
  EXPECT_EQ(static_cast<std::int8_t>(row[3]), 127);
  for (int i = 9; i < 12; ++i) EXPECT_EQ(row[i], 0) << "padding is zero";
  float back[4];
  kvcore::dequantize_rows(DType::QInt8, 1, 4, row, 1, DType::Float32, back);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(back[i], static_cast<float>(static_cast<std::int8_t>(row[i]) + 43) * scale);
  // A constant zero row: scale eps, every value back to exactly 0.
  const float zeros[4] = {0, 0, 0, 0};
  kvcore::quantize_row(DType::QInt8, 1, 4, DType::Float32, zeros, row);
  std::memcpy(&scale, row + 4, 4);
  EXPECT_EQ(scale, FLT_EPSILON);
  kvcore::dequantize_rows(DType::QInt8, 1, 4, row, 1, DType::Float32, back);
  for (float b : back) EXPECT_EQ(b, 0.0f);
}

// Edges of the rule that random rows rarely reach (issue 43 item 6: scripts/mutate.py's
// quantization mutants survived the C++ suite), each worked by hand from the rule in
// docs/quantized.md, in float32 where ExecuTorch computes in float32. ExecuTorch's
// QuantizedKVCache._quantize gives the same bytes for both int8 rows (checked 2026-12-05).
TEST(QuantizedCodec, QInt8ClampsAValueTheZeroPointsRoundingPushesPastMinus128) {
  // lo = -0.0011609311, hi = 0.59091187 (float32 0xba982a62, 0x3f174600): scale = (hi - lo) / 255
  // = 0.0023218540; lo / scale = -0.50000173, so -128 - lo / scale = -127.49999827, which is
  // -127.5 in float32 and rounds half to even to a zero point of -128. lo then maps to
  // nearbyint(lo * (1.0 / scale) + zp) = nearbyint(-128.50000175) = -129: clamped to -128.
  const float x[2] = {-0.0011609310749918222f, 0.590911865234375f};
  unsigned char row[12];
  kvcore::quantize_row(DType::QInt8, 1, 2, DType::Float32, x, row);
  EXPECT_EQ(static_cast<std::int8_t>(row[8]), -128);  // the zero point
  EXPECT_EQ(static_cast<std::int8_t>(row[0]), -128);  // -129 before the clamp
  EXPECT_EQ(static_cast<std::int8_t>(row[1]), 127);   // 254.50000948 - 128 rounds to 127
}

TEST(QuantizedCodec, QInt8AnExactTieOfTheZeroPointsTwoFormulasTakesTheSecond) {
  // lo = -2.5871059e-9, hi = 1.2179679e-7: a range below 255 * FLT_EPSILON, so the scale is
  // FLT_EPSILON; lo / scale = -0.021702217 and hi / scale = 1.0217055, and in float32
  // (-128 + lo / scale) + (127 + hi / scale) is exactly 0: not > 0, so the zero point is
  // 127 - hi / scale = 125.978 -> 126 (the other formula, -128 - lo / scale, would give -128).
  const float x[2] = {-2.587105862872363e-09f, 1.2179678776647052e-07f};
  unsigned char row[12];
  kvcore::quantize_row(DType::QInt8, 1, 2, DType::Float32, x, row);
  float scale;
  std::memcpy(&scale, row + 4, 4);
  EXPECT_EQ(scale, FLT_EPSILON);
  EXPECT_EQ(static_cast<std::int8_t>(row[8]), 126);
  EXPECT_EQ(static_cast<std::int8_t>(row[0]), 126);  // -0.0217 + 126
  EXPECT_EQ(static_cast<std::int8_t>(row[1]), 127);  // 1.0217 + 126
}

TEST(QuantizedCodec, ScaleFloorsHoldForTinyRangesNotOnlyForZeroRows) {
  // qint8: a range of 1e-6 gives (hi - lo) / 255 = 3.9e-9 < FLT_EPSILON: the scale is
  // FLT_EPSILON, the zero point -128 - 0 = -128, and 1e-6 maps to nearbyint(1e-6 / FLT_EPSILON
  // - 128) = nearbyint(8.39 - 128) = -120.
  const float tiny[2] = {0.0f, 1e-6f};
  unsigned char row[12];
  kvcore::quantize_row(DType::QInt8, 1, 2, DType::Float32, tiny, row);
  float scale;
  std::memcpy(&scale, row + 4, 4);
  EXPECT_EQ(scale, FLT_EPSILON);
  EXPECT_EQ(static_cast<std::int8_t>(row[8]), -128);
  EXPECT_EQ(static_cast<std::int8_t>(row[1]), -120);
  // fp8: max|x| / 448 = 2.2e-40 < FLT_MIN for max|x| = 1e-37: the scale is FLT_MIN (the
  // values are then in [0, 448] as e4m3 needs, 1e-37 / FLT_MIN = 8.5).
  const float small[2] = {1e-37f, 0.0f};
  unsigned char f8[8];
  kvcore::quantize_row(DType::Fp8E4M3, 1, 2, DType::Float32, small, f8);
  std::memcpy(&scale, f8 + 4, 4);
  EXPECT_EQ(scale, FLT_MIN);
}

TEST(QuantizedCodec, RowSizesCarryScalesAndZeroPoints) {
  std::uint64_t n = 0;
  ASSERT_TRUE(kvcore::row_size(DType::QInt8, 1, 256, UINT64_MAX, &n));
  EXPECT_EQ(n, 264u);  // 256 values, a float32 scale, an int8 zero point, 3 bytes to align
  ASSERT_TRUE(kvcore::row_size(DType::Fp8E4M3, 1, 256, UINT64_MAX, &n));
  EXPECT_EQ(n, 260u);
  ASSERT_TRUE(kvcore::row_size(DType::QInt8, 3, 5, UINT64_MAX, &n));
  EXPECT_EQ(n, 32u);  // 15 -> 16, + 12 scales, + 3 zero points = 31 -> 32
  EXPECT_FALSE(kvcore::row_size(DType::QInt8, 1u << 31, 1u << 31, UINT64_MAX / 8, &n));  // 2^62 values
}

// Random values, some rows constant, some tiny (denormal) or large.
std::vector<float> values(std::mt19937& rng, int rows, int heads, int dim) {
  std::vector<float> out(static_cast<std::size_t>(rows) * static_cast<std::size_t>(heads * dim));
  for (std::size_t r = 0; r < static_cast<std::size_t>(rows * heads); ++r) {
    const int k = kvcore_test::uniform_int(rng, 0, 5);
    for (int d = 0; d < dim; ++d) {
      float x = kvcore_test::uniform_float(rng, -3.0f, 3.0f);
      if (k == 0) x = 0.0f;
      if (k == 1) x = 1.5f;
      if (k == 2) x *= 1e-40f;  // denormal
      if (k == 3) x *= 1e30f;
      out[r * static_cast<std::size_t>(dim) + static_cast<std::size_t>(d)] = x;
    }
  }
  return out;
}

// The rows a value row becomes, quantized on its own.
std::vector<unsigned char> quantized(DType format, int heads, int dim, const float* row) {
  std::vector<unsigned char> out(QuantRowLayout::of(format, static_cast<std::size_t>(heads), static_cast<std::size_t>(dim)).bytes);
  kvcore::quantize_row(format, heads, dim, DType::Float32, row, out.data());
  return out;
}

std::vector<float> dequantized(DType format, int heads, int dim, const std::vector<unsigned char>& row) {
  std::vector<float> out(static_cast<std::size_t>(heads * dim));
  kvcore::dequantize_rows(format, heads, dim, row.data(), 1, DType::Float32, out.data());
  return out;
}

struct Param {
  DType format;
  RingStorage storage;
};

class QuantizedKVPool : public ::testing::TestWithParam<Param> {};

// Ring W=4 C=3 (wraps), ring W=3 with 2 sinks, flat; random steps with
// retries and rewinds after the wrap. After every write, the raw rows (views,
// held_rows: values and scales) equal the model's rows of each position, and
// the dequantized reads (gather_values, held_values) equal their values.
TEST_P(QuantizedKVPool, WrapsMirrorsAndRewindsCarryScalesWithTheirRows) {
  const DType format = GetParam().format;
  const CacheConfig cfg = pool_config(
      60, {LayerConfig{LayerPolicy::ring(4), 2, 3, 5}, LayerConfig{LayerPolicy::ring(3, 2), 2, 3, 5},
           LayerConfig{LayerPolicy::flat(), 2, 3, 5}},
      3, 4);
  auto cache = std::move(SequenceCache::create(cfg)).get();
  auto made = KVPool::create(*cache, format, kvcore::PoolAllocator::heap(), GetParam().storage);
  ASSERT_TRUE(made.ok()) << made.message().c_str();
  KVPool pool = std::move(made).get();
  std::mt19937 rng(7);
  // model[layer][position] = (k row, v row) as quantized on their own
  std::vector<std::map<int, std::pair<std::vector<unsigned char>, std::vector<unsigned char>>>> model(3);
  for (int iter = 0; iter < 120; ++iter) {
    const int T = 1 + static_cast<int>(rng() % 3);
    if (!cache->can_extend(T)) break;
    auto step = cache->begin_step(T);
    ASSERT_TRUE(step.ok());
    for (int l = 0; l < 3; ++l) {
      auto plan = cache->plan(l, *step);
      ASSERT_TRUE(plan.ok());
      const std::vector<float> k = values(rng, T, 2, 3), v = values(rng, T, 2, 5);
      ASSERT_OK(pool.write_values(l, *plan, DType::Float32, k.data(), k.size() * 4, v.data(), v.size() * 4));
      for (int j = 0; j < T; ++j)
        model[static_cast<std::size_t>(l)][step->position + j] = {
            quantized(format, 2, 3, k.data() + 6 * j), quantized(format, 2, 5, v.data() + 10 * j)};
      const kvcore::PoolLayer shape = *pool.layer(l);
      // Position-order reads: raw spans (mirror included) and dequantized values.
      auto views = pool.views(l, *plan);
      ASSERT_TRUE(views.ok());
      std::vector<float> gk(static_cast<std::size_t>(plan->read_len() * 6)), gv(static_cast<std::size_t>(plan->read_len() * 10));
      ASSERT_OK(pool.gather_values(l, *plan, DType::Float32, gk.data(), gk.size() * 4, gv.data(), gv.size() * 4));
      int at = 0;
      for (int s = 0; s < views->n; ++s) {
        const kvcore::KVSpan& span = views->span[s];
        for (int r = 0; r < span.run.len; ++r, ++at) {
          const auto& want = model[static_cast<std::size_t>(l)].at(span.run.pos + r);
          ASSERT_EQ(0, std::memcmp(span.k + shape.k_row_bytes * static_cast<std::size_t>(r), want.first.data(), shape.k_row_bytes))
              << "layer " << l << " position " << span.run.pos + r;
          ASSERT_EQ(0, std::memcmp(span.v + shape.v_row_bytes * static_cast<std::size_t>(r), want.second.data(), shape.v_row_bytes));
          const std::vector<float> wk = dequantized(format, 2, 3, want.first), wv = dequantized(format, 2, 5, want.second);
          ASSERT_EQ(0, std::memcmp(gk.data() + 6 * at, wk.data(), 24));
          ASSERT_EQ(0, std::memcmp(gv.data() + 10 * at, wv.data(), 40));
        }
      }
      // Row-order reads: every held row that stands for a visible position.
      auto held = pool.held_rows(l, *plan);
      ASSERT_TRUE(held.ok());
      std::vector<float> hk(static_cast<std::size_t>(held->rows * 6)), hv(static_cast<std::size_t>(held->rows * 10));
      auto hvals = pool.held_values(l, *plan, DType::Float32, hk.data(), hk.size() * 4, hv.data(), hv.size() * 4);
      ASSERT_TRUE(hvals.ok());
      for (int r = 0; r < held->rows; ++r) {
        const int p = shape.geometry.position_at(r, held->end);
        bool read = false;  // a position the step's queries need
        for (int i = 0; i < plan->n_read; ++i) read = read || (p >= plan->read[i].pos && p < plan->read[i].end_pos());
        if (!read) continue;
        const auto& want = model[static_cast<std::size_t>(l)].at(p);
        ASSERT_EQ(0, std::memcmp(held->k + shape.k_row_bytes * static_cast<std::size_t>(r), want.first.data(), shape.k_row_bytes));
        const std::vector<float> wv = dequantized(format, 2, 5, want.second);
        ASSERT_EQ(0, std::memcmp(hv.data() + 10 * r, wv.data(), 40));
      }
    }
    const unsigned roll = rng() % 10;
    if (roll == 0) continue;  // abandoned: the next step retries at the same position
    ASSERT_OK(cache->commit(*step));
    if (roll == 1) {
      const int back = 1 + static_cast<int>(rng() % 3);
      if (cache->can_rewind(cache->length() - back)) ASSERT_OK(cache->rewind(cache->length() - back));
    }
  }
}

// Quantizing rows writes those rows only: every other row, its scales and
// zero points included, keeps its bytes.
TEST_P(QuantizedKVPool, QuantizingARowTouchesNoOtherRow) {
  const DType format = GetParam().format;
  const CacheConfig cfg = pool_config(16, {LayerConfig{LayerPolicy::flat(), 3, 5, 2}}, 4, 16);
  auto cache = std::move(SequenceCache::create(cfg)).get();
  KVPool pool = std::move(KVPool::create(*cache, format)).get();
  const kvcore::PoolLayer shape = *pool.layer(0);
  for (std::size_t i = 0; i < shape.k_row_bytes * 16; ++i) shape.k[i] = static_cast<unsigned char>(i * 37 + 11);
  for (std::size_t i = 0; i < shape.v_row_bytes * 16; ++i) shape.v[i] = static_cast<unsigned char>(i * 53 + 5);
  ASSERT_OK(cache->commit(*cache->begin_step(4)));
  ASSERT_OK(cache->commit(*cache->begin_step(1)));
  const std::vector<unsigned char> before = snapshot(pool);
  auto step = cache->begin_step(2);  // positions 5, 6
  std::mt19937 rng(3);
  const std::vector<float> k = values(rng, 2, 3, 5), v = values(rng, 2, 3, 2);
  ASSERT_OK(pool.write_values(0, *cache->plan(0, *step), DType::Float32, k.data(), k.size() * 4, v.data(), v.size() * 4));
  const std::vector<unsigned char> after = snapshot(pool);
  const std::size_t k_all = shape.k_row_bytes * 16;
  for (std::size_t i = 0; i < after.size(); ++i) {
    const bool in_k = i < k_all;
    const std::size_t row = in_k ? i / shape.k_row_bytes : (i - k_all) / shape.v_row_bytes;
    if (row == 5 || row == 6) continue;
    ASSERT_EQ(before[i], after[i]) << (in_k ? "K" : "V") << " row " << row;
  }
  EXPECT_EQ(0, std::memcmp(shape.k + shape.k_row_bytes * 6, quantized(format, 3, 5, k.data() + 15).data(), shape.k_row_bytes));
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantizedKVPool,
                         ::testing::Values(Param{DType::QInt8, RingStorage::Compact},
                                           Param{DType::QInt8, RingStorage::Mirrored},
                                           Param{DType::Fp8E4M3, RingStorage::Compact},
                                           Param{DType::Fp8E4M3, RingStorage::Mirrored}));

// Bad values and types are refused by name, and nothing is written.
TEST(QuantizedKVPoolErrors, NonFiniteValuesAndWrongTypesAreRefusedWithNothingWritten) {
  const CacheConfig cfg = pool_config(16, {LayerConfig{LayerPolicy::flat(), 1, 4, 0}}, 4, 16);
  auto cache = std::move(SequenceCache::create(cfg)).get();
  KVPool pool = std::move(KVPool::create(*cache, DType::QInt8)).get();
  auto step = cache->begin_step(2);
  const kvcore::SeqStepPlan plan = *cache->plan(0, *step);
  std::vector<float> k(8, 1.0f), v(8, 1.0f);
  const std::vector<unsigned char> before = snapshot(pool);
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    k[5] = bad;
    const kvcore::Status s = pool.write_values(0, plan, DType::Float32, k.data(), 32, v.data(), 32);
    EXPECT_EQ(s.code(), kvcore::Error::InvalidArgument);
    EXPECT_NE(std::string(s.message().c_str()).find("k row 1 head 0 holds"), std::string::npos) << s.message().c_str();
  }
  k[5] = 3e38f;
  k[6] = -3e38f;
  const kvcore::Status range = pool.write_values(0, plan, DType::Float32, k.data(), 32, v.data(), 32);
  EXPECT_NE(std::string(range.message().c_str()).find("passes FLT_MAX"), std::string::npos) << range.message().c_str();
  k.assign(8, 1.0f);
  const kvcore::Status int_in = pool.write_values(0, plan, DType::Int8, k.data(), 8, v.data(), 8);
  EXPECT_NE(std::string(int_in.message().c_str()).find("values of int8"), std::string::npos) << int_in.message().c_str();
  EXPECT_EQ(snapshot(pool), before);
  // A plain pool: values of its own dtype only; no dequantized reads.
  KVPool plain = std::move(KVPool::create(*cache, DType::Float16)).get();
  const kvcore::Status mixed = plain.write_values(0, plan, DType::Float32, k.data(), 32, v.data(), 32);
  EXPECT_NE(std::string(mixed.message().c_str()).find("values of float32, the pool stores float16"), std::string::npos);
  float out[64];
  const kvcore::Status read = plain.gather_values(0, plan, DType::Float32, out, sizeof(out), out, sizeof(out));
  EXPECT_NE(std::string(read.message().c_str()).find("not a quantized format"), std::string::npos) << read.message().c_str();
}

// PagedKVPool's value calls refuse what KVPool's refuse.
TEST(QuantizedKVPoolErrors, PagedRefusesMismatchedTypes) {
  CacheConfig cfg;
  cfg.capacity = 16;
  cfg.max_step = 2;
  cfg.n_layers = 1;
  cfg.layers = {LayerConfig{LayerPolicy::flat(), 1, 4, 0}};
  cfg.batch.block_size = 4;
  cfg.batch.max_seqs = 1;
  auto cache = std::move(BatchCache::create(cfg)).get();
  PagedKVPool plain = std::move(PagedKVPool::create(*cache, DType::Float16)).get();
  PagedKVPool quant = std::move(PagedKVPool::create(*cache, DType::QInt8)).get();
  ASSERT_OK(cache->add_sequence(0));
  StepEntry e{0, 2, nullptr};
  auto step = cache->begin_step(&e, 1);
  const BatchStepPlan plan = *cache->plan(*step);
  std::vector<float> k(8, 1.0f), v(8, 1.0f);
  const kvcore::Status mixed = plain.update_values(0, plan, DType::Float32, k.data(), 32, v.data(), 32);
  EXPECT_NE(std::string(mixed.message().c_str()).find("update_values of layer 0: values of float32, the pool stores float16"),
            std::string::npos);
  float out[64];
  const kvcore::Status rows = plain.rows_values(0, DType::Float32, out, sizeof(out), out, sizeof(out)).status();
  EXPECT_NE(std::string(rows.message().c_str()).find("not a quantized format"), std::string::npos) << rows.message().c_str();
  const kvcore::Status gathered = plain.gather_values(0, plan, 0, DType::Float32, out, sizeof(out), out, sizeof(out)).status();
  EXPECT_NE(std::string(gathered.message().c_str()).find("gather_values of layer 0: the pool stores float16"), std::string::npos);
  k[3] = NAN;
  const kvcore::Status nan = quant.update_values(0, plan, DType::Float32, k.data(), 32, v.data(), 32);
  EXPECT_NE(std::string(nan.message().c_str()).find("update_values of layer 0: k row 0 head 0 holds NaN"), std::string::npos)
      << nan.message().c_str();
  const kvcore::Status half = quant.rows_values(0, DType::UInt8, out, sizeof(out), out, sizeof(out)).status();
  EXPECT_EQ(half.code(), kvcore::Error::InvalidArgument);
}

// Values inside the pool's own rows are refused (they would be overwritten while read).
TEST(QuantizedKVPoolErrors, InputInsideThePoolIsRefused) {
  const CacheConfig cfg = pool_config(64, {LayerConfig{LayerPolicy::flat(), 1, 8, 0}}, 2, 64);
  auto cache = std::move(SequenceCache::create(cfg)).get();
  KVPool pool = std::move(KVPool::create(*cache, DType::QInt8)).get();
  auto step = cache->begin_step(1);
  const kvcore::PoolLayer shape = *pool.layer(0);
  std::vector<float> v(8, 0.5f);
  const std::vector<unsigned char> before = snapshot(pool);
  const kvcore::Status s = pool.write_values(0, *cache->plan(0, *step), DType::Float32, shape.k + shape.k_row_bytes * 4, 32,
                                             v.data(), 32);
  EXPECT_NE(std::string(s.message().c_str()).find("write_values of layer 0: k/v overlap the layer's own rows"),
            std::string::npos)
      << s.message().c_str();
  EXPECT_EQ(snapshot(pool), before);
}

// A record carries quantized rows with their scales byte for byte (version
// 2); a pool of another format refuses it by name.
TEST(QuantizedRecords, RoundTripByteForByteAndRefusedByAnotherFormat) {
  const CacheConfig cfg = pool_config(40, {LayerConfig{LayerPolicy::ring(4), 2, 3, 5}, LayerConfig{LayerPolicy::flat(), 2, 3, 5}}, 3, 8);
  for (DType format : {DType::QInt8, DType::Fp8E4M3}) {
    auto cache = std::move(SequenceCache::create(cfg)).get();
    KVPool pool = std::move(KVPool::create(*cache, format)).get();
    std::mt19937 rng(11);
    for (int s = 0; s < 9; ++s) {
      auto step = cache->begin_step(3);
      for (int l = 0; l < 2; ++l) {
        const std::vector<float> k = values(rng, 3, 2, 3), v = values(rng, 3, 2, 5);
        ASSERT_OK(pool.write_values(l, *cache->plan(l, *step), DType::Float32, k.data(), k.size() * 4, v.data(), v.size() * 4));
      }
      ASSERT_OK(cache->commit(*step));
    }
    const std::size_t size = *kvcore::export_size(*cache, pool);
    std::vector<std::uint64_t> record((size + 7) / 8);
    ASSERT_OK(kvcore::export_to(*cache, pool, nullptr, 0, record.data(), size));
    auto view = kvcore::RecordView::parse(record.data(), size);
    ASSERT_TRUE(view.ok()) << view.message().c_str();
    EXPECT_EQ(view->version(), 2u);
    auto other = std::move(SequenceCache::create(cfg)).get();
    KVPool imported = std::move(KVPool::create(*other, format)).get();
    ASSERT_OK(kvcore::import_record(record.data(), size, *other, imported));
    // The importer holds the same rows, scales and zero points: its export is the record, byte for byte.
    std::vector<std::uint64_t> again((size + 7) / 8);
    ASSERT_EQ(*kvcore::export_size(*other, imported), size);
    ASSERT_OK(kvcore::export_to(*other, imported, nullptr, 0, again.data(), size));
    EXPECT_EQ(0, std::memcmp(record.data(), again.data(), size));
    auto third = std::move(SequenceCache::create(cfg)).get();
    KVPool plain = std::move(KVPool::create(*third, DType::Float16)).get();
    const kvcore::Status refused = kvcore::import_record(record.data(), size, *third, plain);
    EXPECT_EQ(refused.code(), kvcore::Error::InvalidArgument);
    EXPECT_NE(std::string(refused.message().c_str()).find(std::string("dtype ") + kvcore::to_string(format) +
                                                        " differs from the pool's float16"),
              std::string::npos)
        << refused.message().c_str();
    EXPECT_EQ(third->length(), 0);
  }
}

// Many sequences: a fork's shared, partly filled block is copied before
// either side writes into it, scales and zero points along; each sequence
// then gathers its own history, dequantized.
TEST(QuantizedPagedKVPool, CopyOnWriteCarriesScalesAndGatherDequantizesEachSequence) {
  CacheConfig cfg;
  cfg.capacity = 32;
  cfg.max_step = 4;
  cfg.n_layers = 2;
  cfg.layers = {LayerConfig{LayerPolicy::flat(), 2, 3, 0}, LayerConfig{LayerPolicy::ring(4, 1), 2, 3, 0}};
  cfg.batch.block_size = 4;
  cfg.batch.max_seqs = 3;
  for (DType format : {DType::QInt8, DType::Fp8E4M3}) {
    auto cache = std::move(BatchCache::create(cfg)).get();
    PagedKVPool pool = std::move(PagedKVPool::create(*cache, format, kvcore::PoolAllocator::heap(), 0)).get();
    std::mt19937 rng(5);
    std::map<std::pair<int, int>, std::vector<unsigned char>> model[2];  // (seq, position) -> k row
    auto run = [&](std::vector<StepEntry> entries) {
      auto step = cache->begin_step(entries.data(), static_cast<int>(entries.size()));
      ASSERT_TRUE(step.ok()) << step.message().c_str();
      const BatchStepPlan plan = *cache->plan(*step);
      for (int l = 0; l < 2; ++l) {
        const std::vector<float> k = values(rng, plan.n_tokens, 2, 3), v = values(rng, plan.n_tokens, 2, 3);
        ASSERT_OK(pool.update_values(l, plan, DType::Float32, k.data(), k.size() * 4, v.data(), v.size() * 4));
        int t = 0;
        for (int e = 0; e < plan.n_entries; ++e)
          for (int j = 0; j < entries[static_cast<std::size_t>(e)].T; ++j, ++t)
            model[l][{plan.seq_ids[e], plan.first_positions[e] + j}] = quantized(format, 2, 3, k.data() + 6 * t);
      }
      for (int l = 0; l < 2; ++l)
        for (int e = 0; e < plan.n_entries; ++e) {
          const int n = *pool.gather_rows(l, plan, e);
          std::vector<float> k(static_cast<std::size_t>(n) * 6), v(k.size());
          std::vector<std::int64_t> positions(static_cast<std::size_t>(n));
          auto got = pool.gather_values(l, plan, e, DType::Float32, k.data(), k.size() * 4, v.data(), v.size() * 4,
                                        positions.data(), positions.size());
          ASSERT_TRUE(got.ok()) << got.message().c_str();
          for (int r = 0; r < n; ++r) {
            const auto want = dequantized(format, 2, 3, model[l].at({plan.seq_ids[e], static_cast<int>(positions[static_cast<std::size_t>(r)])}));
            ASSERT_EQ(0, std::memcmp(k.data() + 6 * r, want.data(), 24)) << "layer " << l << " entry " << e << " row " << r;
          }
        }
      ASSERT_OK(cache->commit(*step));
    };
    ASSERT_OK(cache->add_sequence(0));
    run({StepEntry{0, 4, nullptr}});
    run({StepEntry{0, 2, nullptr}});
    ASSERT_OK(cache->fork(0, 1, 6));
    for (int p = 0; p < 6; ++p)
      for (int l = 0; l < 2; ++l) model[l][{1, p}] = model[l][{0, p}];
    run({StepEntry{0, 1, nullptr}, StepEntry{1, 2, nullptr}});
    run({StepEntry{1, 3, nullptr}, StepEntry{0, 4, nullptr}});
    // The live rows dequantize as a whole, too.
    auto live = pool.rows(0);
    ASSERT_TRUE(live.ok());
    std::vector<float> k(static_cast<std::size_t>(live->rows) * 6), v(k.size());
    EXPECT_OK(pool.rows_values(0, DType::Float16, k.data(), k.size() * 2, v.data(), v.size() * 2));
  }
}

// The per-step path of a quantized arena pool allocates nothing: write_values,
// gather_values, held_values and a refused write (NaN), over 40 steps, between
// two reads of the operator-new counter; the arena pool never calls its allocator.
TEST(QuantizedKVPool, ArenaStepsNeverAllocate) {
  const CacheConfig cfg = pool_config(
      60, {LayerConfig{LayerPolicy::ring(4), 2, 8, 0}, LayerConfig{LayerPolicy::flat(), 2, 8, 0}}, 3, 4);
  auto cache = std::move(SequenceCache::create(cfg)).get();
  for (DType format : {DType::QInt8, DType::Fp8E4M3}) {
    const std::size_t need = *KVPool::required_bytes(cfg, format, RingStorage::Mirrored);
    std::vector<unsigned char> arena(need);
    KVPool pool = std::move(KVPool::in_arena(*cache, format, arena.data(), arena.size(), RingStorage::Mirrored)).get();
    std::mt19937 rng(9);
    std::vector<float> values = kvcore_test::values(rng, 3, 2, 8);
    std::vector<float> nan_values = values;
    nan_values[5] = NAN;
    std::vector<std::uint16_t> out_k(60 * 16), out_v(60 * 16);
    cache->clear();
    int good = 0, refused = 0;
    const std::uint64_t before = operator_news();
    for (int s = 0; s < 40 && cache->can_extend(1); ++s) {
      const int T = 1 + s % 3;
      if (!cache->can_extend(T)) break;
      auto step = cache->begin_step(T);
      for (int l = 0; l < 2; ++l) {
        auto plan = cache->plan(l, *step);
        const std::size_t bytes = static_cast<std::size_t>(T) * 16 * 4;
        refused += pool.write_values(l, *plan, DType::Float32, nan_values.data(), bytes, values.data(), bytes).ok() ? 0 : 1;
        good += pool.write_values(l, *plan, DType::Float32, values.data(), bytes, values.data(), bytes).ok() ? 1 : 0;
        good += pool.gather_values(l, *plan, DType::Float16, out_k.data(), out_k.size() * 2, out_v.data(), out_v.size() * 2).ok() ? 1 : 0;
        good += pool.held_values(l, *plan, DType::BFloat16, out_k.data(), out_k.size() * 2, out_v.data(), out_v.size() * 2).ok() ? 1 : 0;
      }
      good += cache->commit(*step).ok() ? 0 : -1000;
    }
    const std::uint64_t after = operator_news();
    EXPECT_EQ(after, before) << kvcore::to_string(format);
    EXPECT_GT(good, 100);
    EXPECT_EQ(good % 3, 0);
    EXPECT_GT(refused, 0);
  }
}

}  // namespace
}  // namespace kvcore_test
