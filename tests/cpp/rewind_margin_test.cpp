// The rewind margin (BatchLimits::max_rewind, docs/batch.md section 5): ring
// and chunked groups keep what a rewind of up to R positions needs, R = max_step
// by default. A server that never rewinds (R = 0) holds a window's blocks, as
// vLLM's sliding window does; one that verifies k drafts sets R = k. The
// brute-force test draws R against its model; these name the figures a runtime
// sizes its memory by, and the refusals.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cache_fixtures.h"
#include "kvcore/batch/batch_cache.h"

namespace kvcore_test {
namespace {

using kvcore::BatchCache;
using kvcore::Error;
using kvcore::StepEntry;

constexpr int kW = 16;  // the ring's window
constexpr int kB = 4;   // block size
constexpr int kC = 8;   // max_step

std::unique_ptr<BatchCache> ring_cache(int max_rewind, LayerPolicy ring = LayerPolicy::ring(kW)) {
  CacheConfig cfg = make_config(256, {ring, LayerPolicy::flat()}, kC);
  cfg.batch.block_size = kB;
  cfg.batch.max_seqs = 2;
  cfg.batch.max_rewind = max_rewind;
  auto made = BatchCache::create(cfg);
  EXPECT_TRUE(made.ok()) << made.message().c_str();
  return made.ok() ? std::move(made).get() : nullptr;
}

// Sequence 0 computes n tokens in steps of max_step.
void compute(BatchCache& c, int n) {
  ASSERT_TRUE(c.add_sequence(0).ok());
  for (int at = 0; at < n; at += kC) {
    const int T = n - at < kC ? n - at : kC;
    const StepEntry e{0, T, nullptr};
    auto begun = c.begin_step(&e, 1);
    ASSERT_TRUE(begun.ok()) << begun.message().c_str();
    ASSERT_TRUE(c.commit(*begun).ok());
  }
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

TEST(RewindMargin, OutOfRangeIsRefused) {
  for (const int bad : {-2, 257}) {
    CacheConfig cfg = make_config(256, {LayerPolicy::ring(kW)}, kC);
    cfg.batch.max_rewind = bad;
    auto made = BatchCache::create(cfg);
    ASSERT_EQ(made.status().code(), Error::InvalidArgument) << bad;
    EXPECT_EQ(std::string(made.message().c_str()),
              "batch.max_rewind = " + std::to_string(bad) + ": must be in [0, capacity = 256] (or -1 for max_step)");
  }
}

TEST(RewindMargin, DefaultIsMaxStep) {
  auto c = ring_cache(-1);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->max_rewind(), kC);
  EXPECT_EQ(ring_cache(3)->max_rewind(), 3);
}

// At rest at length L a ring sequence holds the blocks of [L - R - W + 1, L):
// "what a query after a rewind of up to R needs". With R = 0 that is the
// window's W - 1 positions, vLLM's sliding window.
TEST(RewindMargin, ARingHoldsTheWindowAndTheMargin) {
  const int L = 101;  // not on a block boundary
  for (const int R : {0, 1, 5, kC, 2 * kC}) {
    SCOPED_TRACE("max_rewind " + std::to_string(R));
    auto c = ring_cache(R);
    ASSERT_NE(c, nullptr);
    compute(*c, L);
    const std::int64_t from = L - R - kW + 1;  // the first position kept
    const int held = static_cast<int>(ceil_div(L, kB) - from / kB);
    EXPECT_EQ(*c->blocks_held(0, 0), held);
    EXPECT_EQ(*c->oldest_held(0, 0), static_cast<int>(from / kB * kB));
    // Rewinds of up to R are always allowed; one that needs a released block is not.
    for (int n = L; n >= L - R; --n) EXPECT_TRUE(c->can_rewind(0, n)) << n;
    const int first_refused = static_cast<int>(from / kB * kB) + kW - 2;  // its query needs the block below
    EXPECT_FALSE(c->can_rewind(0, first_refused)) << first_refused;
    auto refused = c->rewind(0, first_refused);
    EXPECT_EQ(refused.code(), Error::InvalidState);
    EXPECT_TRUE(c->can_rewind(0, L));  // nothing changed: still at L
    EXPECT_EQ(*c->blocks_held(0, 0), held);
  }
}

// The default pool: a window's blocks for every sequence, W + C + R - 1
// positions during a step (one straddle more), so a smaller margin is a
// smaller default pool.
TEST(RewindMargin, TheDefaultPoolCountsTheMargin) {
  const std::int64_t stride = ceil_div(256, kB);
  for (const int R : {0, 2, kC}) {
    auto c = ring_cache(R);
    ASSERT_NE(c, nullptr);
    const std::int64_t ring = ceil_div(kW + kC + R - 1, kB) + 1;
    EXPECT_EQ(*c->num_blocks(0), 2 * (ring + stride)) << R;
  }
}

// A chunked group of chunk K keeps what a rewind of up to R needs: the blocks
// from the chunk start of L - R.
TEST(RewindMargin, AChunkedGroupKeepsTheChunkOfTheMargin) {
  const int K = 16, L = 70;
  for (const int R : {0, 6, kC}) {
    SCOPED_TRACE("max_rewind " + std::to_string(R));
    auto c = ring_cache(R, LayerPolicy::chunked(K));
    ASSERT_NE(c, nullptr);
    compute(*c, L);
    const int from = (L - R) / K * K;
    EXPECT_EQ(*c->blocks_held(0, 0), static_cast<int>(ceil_div(L, kB) - from / kB));
    EXPECT_TRUE(c->can_rewind(0, L - R));
  }
}

// With no margin, a window of 1 needs no history at all; a prefix hit still
// needs its last block, so it names a prefix some sequence computed.
TEST(RewindMargin, AHitNeedsItsLastBlockEvenWhenNoQueryReadsIt) {
  CacheConfig cfg = make_config(64, {LayerPolicy::ring(1)}, 4);
  cfg.batch.block_size = 2;
  cfg.batch.max_seqs = 2;
  cfg.batch.max_rewind = 0;
  auto made = BatchCache::create(cfg);
  ASSERT_TRUE(made.ok()) << made.message().c_str();
  BatchCache& c = **made;
  const std::vector<std::int32_t> prompt = {5, 6, 7, 8, 9};
  auto none = c.lookup_prefix(prompt.data(), static_cast<int>(prompt.size()), 0);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, 0);  // nothing was computed: no hit
  ASSERT_TRUE(c.add_sequence(0).ok());
  const StepEntry e{0, 4, prompt.data()};
  auto begun = c.begin_step(&e, 1);
  ASSERT_TRUE(begun.ok());
  ASSERT_TRUE(c.commit(*begun).ok());
  EXPECT_EQ(*c.blocks_held(0, 0), 0);  // a window of 1 and no margin: nothing below the length is needed
  // The released blocks wait in the pool under their keys: the computed prefix hits.
  auto after = c.lookup_prefix(prompt.data(), static_cast<int>(prompt.size()), 0);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(*after, 4);
  const std::vector<std::int32_t> other = {5, 6, 1, 2, 3};  // its second block was never computed
  EXPECT_EQ(*c.lookup_prefix(other.data(), static_cast<int>(other.size()), 0), 2);
}

}  // namespace
}  // namespace kvcore_test
