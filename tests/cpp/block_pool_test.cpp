// BlockPool's key table, called directly: open addressing by `key.lo` with
// linear probing and backward-shift deletion. Keys are built by hand so that
// their home slots collide, chains wrap around the table's end, and deletions
// fall in the middle and at the end of a chain. After every change, every key
// still named must be found at its block and every dropped key must not.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <vector>

#include "kvcore/batch/block_pool.h"

namespace {

using kvcore::BlockKey;
using kvcore::BlockPool;

// A key with a chosen home slot (lo) and a distinguishing hi.
BlockKey key(std::uint64_t lo, std::uint64_t hi = 0) { return BlockKey{lo, hi}; }

// A pool whose every block is held, with the keys it names checked against a map.
class KeyTable {
 public:
  explicit KeyTable(int n_blocks) {
    EXPECT_TRUE(pool_.create(n_blocks, "a test pool").ok());
    for (int b = 0; b < n_blocks; ++b) EXPECT_EQ(pool_.allocate(), b);
  }

  BlockPool& pool() { return pool_; }

  void name(int block, std::uint64_t lo, std::uint64_t hi = 0) {
    ASSERT_TRUE(pool_.set_key(block, key(lo, hi), 0, 0)) << "block " << block << " lo " << lo;
    named_[block] = key(lo, hi);
    dropped_.erase(block);
  }

  void drop(int block) {
    pool_.drop_key(block);
    dropped_[block] = named_.at(block);
    named_.erase(block);
  }

  // Every named key is found at its block; every dropped one is not found.
  void check(const char* when) {
    for (const auto& [block, k] : named_) {
      EXPECT_EQ(pool_.find(k), block) << when << ": lo " << k.lo << " hi " << k.hi;
      EXPECT_TRUE(pool_.keyed(block)) << when;
    }
    for (const auto& [block, k] : dropped_) {
      EXPECT_EQ(pool_.find(k), -1) << when << ": dropped lo " << k.lo << " hi " << k.hi;
      EXPECT_FALSE(pool_.keyed(block)) << when;
    }
  }

 private:
  BlockPool pool_;
  std::map<int, BlockKey> named_;
  std::map<int, BlockKey> dropped_;
};

// The repro: 4 blocks (8 slots), lo = 5 and lo = 13 share slot 5.
TEST(BlockPoolKeys, DroppingTheFirstOfTwoCollidingKeysKeepsTheSecondFound) {
  KeyTable t(4);
  t.name(0, 5);
  t.name(1, 13);
  t.check("both named");
  t.drop(0);
  t.check("the first dropped");
  EXPECT_EQ(t.pool().find(key(13)), 1);
}

TEST(BlockPoolKeys, KeysSharingAHomeSlotAreAllFoundAndTheirHiTellsThemApart) {
  KeyTable t(4);
  t.name(0, 3, 1);
  t.name(1, 3, 2);  // the same lo: only hi differs
  t.name(2, 11, 1);
  t.check("three at home slot 3");
  EXPECT_EQ(t.pool().find(key(3, 3)), -1);
  EXPECT_FALSE(t.pool().set_key(1, key(3, 3), 0, 0)) << "a block with a key already";
  EXPECT_EQ(t.pool().find(key(3, 3)), -1);
}

// Two blocks with one content (two sequences computed the same prompt): both
// carry the key, a lookup takes the lowest held one, and when it goes the
// other is found; at most one copy stays cached, the most recently released.
TEST(BlockPoolKeys, CopiesOfOneContentAreFoundUntilTheLastGoes) {
  BlockPool pool;
  ASSERT_TRUE(pool.create(4, "a test pool").ok());
  for (int b = 0; b < 4; ++b) ASSERT_EQ(pool.allocate(), b);
  const BlockKey k = key(7, 1);
  ASSERT_TRUE(pool.set_key(2, k, 0, 0));
  ASSERT_TRUE(pool.set_key(1, k, 0, 0));  // a copy is named too
  EXPECT_EQ(pool.find(k), 1);       // the lowest held copy
  pool.drop_key(1);                 // block 1 is written: block 2 still holds the content
  EXPECT_EQ(pool.find(k), 2);
  ASSERT_TRUE(pool.set_key(1, k, 0, 0));
  pool.release(1);  // cached; block 2 is held: the held copy is found
  EXPECT_EQ(pool.find(k), 2);
  EXPECT_EQ(pool.cached_blocks(), 1);
  pool.release(2);  // the most recently released copy stays cached, block 1 is freed unnamed
  EXPECT_EQ(pool.cached_blocks(), 1);
  EXPECT_EQ(pool.find(k), 2);
  EXPECT_FALSE(pool.keyed(1));
  EXPECT_EQ(pool.free_blocks(), 2);
  pool.hold(2);  // a hit revives it
  EXPECT_EQ(pool.cached_blocks(), 0);
  EXPECT_EQ(pool.refs(2), 1);
}

TEST(BlockPoolKeys, AProbeChainWrappingAroundTheTableEndSurvivesEveryDeletion) {
  // 8 slots: homes 6, 7, 7, 6 fill slots 6, 7, 0, 1.
  for (int victim = 0; victim < 4; ++victim) {
    KeyTable t(4);
    t.name(0, 6);
    t.name(1, 7);
    t.name(2, 15);
    t.name(3, 14);
    t.check("the chain wraps");
    t.drop(victim);
    t.check("one dropped");
    t.name(victim, 22);  // home 6 again: re-inserted behind the others
    t.check("re-inserted");
  }
}

TEST(BlockPoolKeys, DeletionsInTheMiddleAndAtTheEndOfAChain) {
  KeyTable t(8);  // 16 slots
  // A chain from slot 2: homes 2, 2, 3, 2, 5 fill slots 2..6.
  t.name(0, 2);
  t.name(1, 18);
  t.name(2, 3);
  t.name(3, 34);
  t.name(4, 5);
  t.name(5, 9);  // a key outside the chain
  t.check("a chain of five");
  t.drop(2);  // the middle
  t.check("the middle dropped");
  t.drop(4);  // the end
  t.check("the end dropped");
  t.drop(0);  // the head
  t.check("the head dropped");
  t.name(0, 2);
  t.name(2, 3);
  t.name(4, 5);
  t.check("all re-inserted");
}

TEST(BlockPoolKeys, ATableFilledToItsLimitWithOneHomeSlot) {
  // 5 blocks: 16 slots. Every block's key has home slot 14: the chain wraps.
  KeyTable t(5);
  for (int b = 0; b < 5; ++b) t.name(b, 14 + 16 * static_cast<std::uint64_t>(b));
  t.check("every block named");
  for (int b : {2, 0, 4, 1, 3}) {
    t.drop(b);
    t.check("dropping one by one");
  }
  for (int b : {3, 1, 4}) t.name(b, 30 + 16 * static_cast<std::uint64_t>(b), 1);
  t.check("re-inserted after every deletion");
}

TEST(BlockPoolKeys, RandomNamingAndDroppingAgainstAMap) {
  // Small tables and few home slots: long chains, collisions and wraps.
  std::uint64_t state = 0x1234567;
  auto next = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 33;
  };
  for (int round = 0; round < 200 && !::testing::Test::HasFailure(); ++round) {
    const int n = 1 + static_cast<int>(next() % 9);
    KeyTable t(n);
    std::vector<bool> named(static_cast<std::size_t>(n), false);
    int serial = 0;
    for (int op = 0; op < 60; ++op) {
      const int b = static_cast<int>(next() % static_cast<std::uint64_t>(n));
      if (named[static_cast<std::size_t>(b)]) {
        t.drop(b);
      } else {
        // lo in a handful of values near the table's end; hi unique.
        t.name(b, 2 * static_cast<std::uint64_t>(n) - 1 - next() % 3 + 1024 * (next() % 4), ++serial);
      }
      named[static_cast<std::size_t>(b)] = !named[static_cast<std::size_t>(b)];
      t.check("random");
    }
  }
}

TEST(BlockPoolKeys, AReclaimedCachedBlockLosesItsKeyAndItsNeighboursKeepTheirs) {
  KeyTable t(2);  // 4 slots
  t.name(0, 1);
  t.name(1, 5);  // home 1 too
  t.pool().release(0);
  t.pool().release(1);
  EXPECT_EQ(t.pool().cached_blocks(), 2);
  // No unkeyed block is free: allocation reclaims the least recently released.
  EXPECT_EQ(t.pool().allocate(), 0);
  EXPECT_EQ(t.pool().find(key(1)), -1);
  EXPECT_EQ(t.pool().find(key(5)), 1);
}

// An admission that under-counts must fail at once, not take the LRU list's
// sentinel for a block (the batch corpus replay used to spin to its timeout).
TEST(BlockPoolDeathTest, AllocatingFromAnEmptyPoolAborts) {
  BlockPool pool;
  ASSERT_TRUE(pool.create(2, "a test pool").ok());
  pool.allocate();
  pool.allocate();
  EXPECT_DEATH(pool.allocate(), "no free block");
}

}  // namespace
