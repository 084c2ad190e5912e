// BlockKey::chain, the content key prefix hits are found by: every id, its
// place in the block, the block's length and the parent key each change both
// lanes of the key. Block lengths cover both paths of chain(): below 32 ids a
// round a pair; from 32 on, eight ids at a time over four accumulators a lane,
// then the pairs and a lone id left.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "kvcore/batch/block_key.h"
#include "rng.h"

namespace {

using kvcore::BlockKey;

constexpr int kLengths[] = {1, 2, 3, 15, 16, 31, 32, 33, 39, 40, 41, 64, 100, 512};

std::vector<std::int32_t> random_ids(kvcore_test::Rng& rng, int n) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
  for (auto& id : ids) id = static_cast<std::int32_t>(rng.next());
  return ids;
}

// Both lanes differ: a hit must match both, so neither may ignore a change.
void expect_apart(const BlockKey& a, const BlockKey& b, const char* what, int n, int at) {
  EXPECT_NE(a.lo, b.lo) << what << " (n = " << n << ", at " << at << ")";
  EXPECT_NE(a.hi, b.hi) << what << " (n = " << n << ", at " << at << ")";
}

TEST(BlockKey, EveryIdChangesBothLanes) {
  kvcore_test::Rng rng(1);
  const BlockKey parent = BlockKey::root(7);
  for (const int n : kLengths) {
    std::vector<std::int32_t> ids = random_ids(rng, n);
    const BlockKey key = BlockKey::chain(parent, ids.data(), n);
    for (int at = 0; at < n; ++at) {
      for (const std::uint32_t bit : {1u, 1u << 17, 1u << 31}) {
        ids[at] = static_cast<std::int32_t>(static_cast<std::uint32_t>(ids[at]) ^ bit);
        expect_apart(BlockKey::chain(parent, ids.data(), n), key, "one id's bit flipped", n, at);
        ids[at] = static_cast<std::int32_t>(static_cast<std::uint32_t>(ids[at]) ^ bit);
      }
    }
    EXPECT_EQ(BlockKey::chain(parent, ids.data(), n), key) << "the same ids, the same key";
  }
}

TEST(BlockKey, MovingIdsChangesBothLanes) {
  kvcore_test::Rng rng(2);
  for (const int n : kLengths) {
    std::vector<std::int32_t> ids = random_ids(rng, n);
    const BlockKey key = BlockKey::chain(BlockKey{}, ids.data(), n);
    // Swaps within a word (1 id apart), across accumulators (2 and 6 apart),
    // between one accumulator's rounds (8 apart), and end to end.
    for (const int gap : {1, 2, 6, 8, n - 1}) {
      for (int at = 0; at + gap < n && gap > 0; ++at) {
        std::swap(ids[at], ids[at + gap]);
        expect_apart(BlockKey::chain(BlockKey{}, ids.data(), n), key, "two ids swapped", n, at);
        std::swap(ids[at], ids[at + gap]);
      }
    }
  }
}

TEST(BlockKey, LengthAndParentChangeTheKey) {
  kvcore_test::Rng rng(3);
  const std::vector<std::int32_t> ids = random_ids(rng, 600);
  std::set<std::pair<std::uint64_t, std::uint64_t>> seen;
  // Every length of one id sequence (a zero id past the end would otherwise
  // hide in the pair it completes), from two parents.
  for (const BlockKey& parent : {BlockKey{}, BlockKey::root(1)}) {
    for (int n = 1; n <= 600; ++n) {
      const BlockKey k = BlockKey::chain(parent, ids.data(), n);
      EXPECT_TRUE(seen.insert({k.lo, k.hi}).second) << "n = " << n;
    }
  }
  std::vector<std::int32_t> zeros(64, 0);
  for (const int n : {31, 32, 33, 63}) {
    expect_apart(BlockKey::chain(BlockKey{}, zeros.data(), n), BlockKey::chain(BlockKey{}, zeros.data(), n + 1),
                 "zero ids, one more", n, n);
  }
}

}  // namespace
