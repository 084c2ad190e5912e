// BatchCache::lookup_prefix (a hit without side effects, the same for every
// order of the groups) and the KV events (docs/batch.md, "Lookups and KV
// events"). The brute-force test checks both on random workloads against the
// reference model; these name the cases a router and a scheduler rely on.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cache_fixtures.h"
#include "kvcore/batch/batch_cache.h"

namespace kvcore_test {
namespace {

using kvcore::BatchCache;
using kvcore::BlockKey;
using kvcore::Error;
using kvcore::KVEvent;
using kvcore::KVEventKind;
using kvcore::StepEntry;

std::unique_ptr<BatchCache> batch(const std::vector<LayerPolicy>& policies, int block_size, int num_blocks,
                                  int capacity = 256, int max_step = 8) {
  CacheConfig cfg = make_config(capacity, policies, max_step);
  cfg.batch.block_size = block_size;
  cfg.batch.max_seqs = 8;
  cfg.batch.num_blocks = num_blocks;
  auto made = BatchCache::create(cfg);
  EXPECT_TRUE(made.ok()) << made.message().c_str();
  return made.ok() ? std::move(made).get() : nullptr;
}

// `seq` (fresh, namespace ns) computes `tokens` in steps of at most max_step.
void compute(BatchCache& c, int seq, const std::vector<std::int32_t>& tokens, std::uint64_t ns = 0) {
  ASSERT_TRUE(c.add_sequence(seq, ns).ok());
  for (std::size_t at = 0; at < tokens.size();) {
    const int T = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(c.max_step()), tokens.size() - at));
    const StepEntry e{seq, T, tokens.data() + at};
    auto begun = c.begin_step(&e, 1);
    ASSERT_TRUE(begun.ok()) << begun.message().c_str();
    ASSERT_TRUE(c.commit(*begun).ok());
    at += static_cast<std::size_t>(T);
  }
}

std::vector<std::int32_t> prompt_of(int n, std::int32_t first) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<std::size_t>(i)] = first + i;
  return t;
}

std::vector<KVEvent> drain(BatchCache& c) {
  std::vector<KVEvent> out(static_cast<std::size_t>(c.kv_events().size()));
  const auto n = c.drain_kv_events(out.data(), static_cast<int>(out.size()));
  EXPECT_TRUE(n.ok());
  out.resize(static_cast<std::size_t>(n.ok() ? *n : 0));
  return out;
}

TEST(PrefixLookup, AnswersWhatAdoptPrefixAdoptsAndChangesNothing) {
  auto c = batch({LayerPolicy::ring(8), LayerPolicy::flat()}, 4, 64);
  ASSERT_NE(c, nullptr);
  const std::vector<std::int32_t> shared = prompt_of(40, 100);
  compute(*c, 0, shared);
  ASSERT_TRUE(c->release_sequence(0).ok());  // its named blocks stay cached
  std::vector<std::int32_t> prompt = shared;
  prompt.resize(30);
  prompt.push_back(7);
  const int free0 = *c->free_blocks(0);
  const int free1 = *c->free_blocks(1);
  const int cached0 = *c->cached_blocks(0);
  const int cached1 = *c->cached_blocks(1);
  auto looked = c->lookup_prefix(prompt.data(), static_cast<int>(prompt.size()), 0);
  ASSERT_TRUE(looked.ok());
  EXPECT_EQ(*looked, 28);  // 7 full blocks of the 30 shared tokens (the last token is computed)
  EXPECT_EQ(*c->free_blocks(0), free0);
  EXPECT_EQ(*c->free_blocks(1), free1);
  EXPECT_EQ(*c->cached_blocks(0), cached0);
  EXPECT_EQ(*c->cached_blocks(1), cached1);
  EXPECT_EQ(*c->lookup_prefix(prompt.data(), static_cast<int>(prompt.size()), 5), 0) << "another namespace";
  ASSERT_TRUE(c->add_sequence(1).ok());
  EXPECT_EQ(*c->adopt_prefix(1, prompt.data(), static_cast<int>(prompt.size())), *looked);
}

TEST(PrefixLookup, KeepsABegunStepBegun) {
  auto c = batch({LayerPolicy::flat()}, 4, 64);
  ASSERT_NE(c, nullptr);
  const std::vector<std::int32_t> tokens = prompt_of(16, 1);
  compute(*c, 0, tokens);
  const std::int32_t next = 99;
  const StepEntry e{0, 1, &next};
  auto begun = c->begin_step(&e, 1);
  ASSERT_TRUE(begun.ok());
  EXPECT_EQ(*c->lookup_prefix(tokens.data(), 16, 0), 12);
  EXPECT_TRUE(c->check_step(*begun).ok()) << "the lookup ended the step";
  EXPECT_TRUE(c->commit(*begun).ok());
}

// A lookup moves no cached block in the LRU order: after the same pressure,
// a cache that was asked and one that was not reclaim the same blocks.
TEST(PrefixLookup, MovesNoCachedBlockInTheReclaimOrder) {
  auto asked = batch({LayerPolicy::flat()}, 4, 8, 64);
  auto quiet = batch({LayerPolicy::flat()}, 4, 8, 64);
  ASSERT_NE(asked, nullptr);
  ASSERT_NE(quiet, nullptr);
  const std::vector<std::int32_t> old_one = prompt_of(8, 1), new_one = prompt_of(8, 50);
  for (BatchCache* c : {asked.get(), quiet.get()}) {
    compute(*c, 0, old_one);  // released first: reclaimed first
    compute(*c, 1, new_one);
    ASSERT_TRUE(c->release_sequence(0).ok());
    ASSERT_TRUE(c->release_sequence(1).ok());
  }
  // An adopt would make old_one's blocks the most recently used; a lookup must not.
  EXPECT_EQ(*asked->lookup_prefix(old_one.data(), 8, 0), 4);
  for (BatchCache* c : {asked.get(), quiet.get()}) compute(*c, 2, prompt_of(24, 300));  // 6 blocks: 2 reclaimed
  for (BatchCache* c : {asked.get(), quiet.get()}) {
    EXPECT_EQ(*c->lookup_prefix(old_one.data(), 8, 0), 0) << "the older prompt's blocks go first";
    EXPECT_EQ(*c->lookup_prefix(new_one.data(), 8, 0), 4);
  }
}

// The hit does not depend on the order of the layers (so of the groups): a
// ring group first was quadratic on a miss and must give the same answers.
TEST(PrefixLookup, EveryGroupOrderGivesTheSameHit) {
  const std::vector<std::vector<LayerPolicy>> orders = {
      {LayerPolicy::ring(12, 2), LayerPolicy::flat(), LayerPolicy::chunked(8)},
      {LayerPolicy::flat(), LayerPolicy::chunked(8), LayerPolicy::ring(12, 2)},
      {LayerPolicy::chunked(8), LayerPolicy::ring(12, 2), LayerPolicy::flat()},
  };
  std::vector<std::unique_ptr<BatchCache>> caches;
  for (const auto& order : orders) caches.push_back(batch(order, 4, 80));
  std::mt19937 rng(7);
  std::vector<std::vector<std::int32_t>> seen;
  int hits = 0;
  for (int round = 0; round < 60; ++round) {
    // A prompt that extends an earlier one by a random amount, or a fresh one.
    std::vector<std::int32_t> p;
    if (!seen.empty() && rng() % 4 != 0) {
      p = seen[rng() % seen.size()];
      p.resize(rng() % (p.size() + 1));
    }
    for (int extra = static_cast<int>(rng() % 40); extra > 0 && p.size() < 200; --extra)
      p.push_back(static_cast<std::int32_t>(rng() % 3));
    int answer = -1;
    for (auto& c : caches) {
      const int h = *c->lookup_prefix(p.data(), static_cast<int>(p.size()), 0);
      if (answer < 0) answer = h;
      EXPECT_EQ(h, answer) << "round " << round;
    }
    hits += answer > 0;
    if (p.empty()) continue;
    for (auto& c : caches) {  // one sequence at a time: its blocks stay cached, reclaimed as needed
      compute(*c, 0, p);
      ASSERT_TRUE(c->release_sequence(0).ok());
    }
    seen.push_back(p);
  }
  EXPECT_GT(hits, 10);
}

// Steps that fill many blocks at once (keyed and named a batch at a time)
// and lookups whose first miss falls in any batch: every block is keyed as
// BlockKey::chain keys it one block after another, and every hit is the
// longest prefix of blocks the cache holds.
TEST(PrefixLookup, ManyBlocksAStepAreKeyedAndFoundAsOneAtATime) {
  for (const int B : {1, 4, 16, 40}) {
    for (const int head : {0, 1, B - 1}) {  // tokens of a first step, leaving a block part filled
      const int n = 40 * B + head + 3;
      // A flat group and a ring whose window holds the whole prompt: every
      // block is named in both, and every hit needs both.
      auto c = batch({LayerPolicy::flat(), LayerPolicy::ring(n + 1)}, B, 2 * (n / B + 2), n + 1, n);
      ASSERT_NE(c, nullptr);
      ASSERT_EQ(c->n_groups(), 2);
      ASSERT_TRUE(c->enable_kv_events(4 * n).ok());
      const std::vector<std::int32_t> tokens = prompt_of(n, 7);
      ASSERT_TRUE(c->add_sequence(0).ok());
      for (const auto& [from, T] : {std::pair<int, int>{0, head}, {head, n - head}}) {
        if (T == 0) continue;
        const StepEntry e{0, T, tokens.data() + from};
        auto begun = c->begin_step(&e, 1);
        ASSERT_TRUE(begun.ok()) << begun.message().c_str();
        ASSERT_TRUE(c->commit(*begun).ok());
      }
      std::vector<BlockKey> keys;
      BlockKey key;
      for (int i = 0; i < n / B; ++i) keys.push_back(key = BlockKey::chain(key, tokens.data() + i * B, B));
      std::vector<int> stored(keys.size() * 2, 0);
      for (const KVEvent& e : drain(*c)) {
        ASSERT_EQ(e.kind, KVEventKind::Stored);
        const int i = e.first_position / B;
        ASSERT_LT(i, static_cast<int>(keys.size()));
        EXPECT_EQ(e.key, keys[static_cast<std::size_t>(i)]) << "B " << B << ", head " << head << ", block " << i;
        ++stored[static_cast<std::size_t>(2 * i + e.group)];
      }
      for (int count : stored) EXPECT_EQ(count, 1) << "B " << B << ", head " << head;
      // A prompt that leaves the cached tokens at block m: the hit is m blocks.
      for (const int m : {0, 1, 15, 16, 17, 31, 33, n / B - 1}) {
        std::vector<std::int32_t> prompt = tokens;
        prompt[static_cast<std::size_t>(m * B)] = -1;
        EXPECT_EQ(*c->lookup_prefix(prompt.data(), n, 0), m * B) << "B " << B << ", head " << head << ", miss " << m;
      }
      EXPECT_EQ(*c->lookup_prefix(tokens.data(), n, 0), (n - 1) / B * B);
    }
  }
}

TEST(KVEvents, StoredAndEvictedCarryGroupNamespaceKeyAndTokens) {
  auto c = batch({LayerPolicy::flat(), LayerPolicy::ring(4)}, 4, 16, 64, 4);
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->enable_kv_events(64).ok());
  const std::vector<std::int32_t> tokens = prompt_of(12, 10);
  compute(*c, 0, tokens, 42);
  const std::vector<KVEvent> events = drain(*c);
  // Flat keeps all three blocks; the ring keys each block it still holds when it fills.
  BlockKey key = BlockKey::root(42);
  std::vector<BlockKey> flat_keys;
  for (int i = 0; i < 3; ++i) {
    key = BlockKey::chain(key, tokens.data() + 4 * i, 4);
    flat_keys.push_back(key);
    int found = 0;
    for (const KVEvent& e : events)
      if (e.group == 0 && e.kind == KVEventKind::Stored && e.key == key) {
        ++found;
        EXPECT_EQ(e.prefix_namespace, 42u);
        EXPECT_EQ(e.first_position, 4 * i);
        EXPECT_EQ(e.n_positions, 4);
      }
    EXPECT_EQ(found, 1) << "block " << i << " stored once in the flat group";
  }
  for (const KVEvent& e : events) EXPECT_NE(e.kind, KVEventKind::Evicted);
  // Pressure reclaims the released blocks: each eviction names a key its
  // group stored, and the evicted prompt's hit shrinks with them.
  std::vector<std::int32_t> prompt = tokens;
  prompt.push_back(0);
  ASSERT_EQ(*c->lookup_prefix(prompt.data(), 13, 42), 12);
  ASSERT_TRUE(c->release_sequence(0).ok());
  compute(*c, 1, prompt_of(48, 500));  // 12 flat blocks and the ring's window: some cached blocks go
  int flat_evicted = 0;
  for (const KVEvent& e : drain(*c)) {
    if (e.kind != KVEventKind::Evicted || e.prefix_namespace != 42) continue;
    if (e.group == 0) {
      ++flat_evicted;
      EXPECT_EQ(e.key, flat_keys[static_cast<std::size_t>(e.first_position / 4)]) << "an evicted key names its block";
    }
  }
  EXPECT_GE(flat_evicted, 1);
  EXPECT_LT(*c->lookup_prefix(prompt.data(), 13, 42), 12);
  c->clear();
  const std::vector<KVEvent> cleared = drain(*c);
  ASSERT_EQ(cleared.size(), 1u);
  EXPECT_EQ(cleared[0].kind, KVEventKind::Cleared);
  EXPECT_EQ(cleared[0].group, -1);
}

TEST(KVEvents, AFullQueueDropsAndCountsAndTwoCopiesOfAKeyAreOneStore) {
  auto c = batch({LayerPolicy::flat()}, 4, 32);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->kv_events().capacity(), 0);
  compute(*c, 0, prompt_of(8, 1));
  EXPECT_EQ(c->kv_events().size(), 0) << "events are off by default";
  ASSERT_TRUE(c->enable_kv_events(2).ok());
  compute(*c, 1, prompt_of(8, 1));  // the same content, computed again: no new key
  EXPECT_EQ(c->kv_events().size(), 0);
  compute(*c, 2, prompt_of(16, 100));  // four new keys into a queue of two
  EXPECT_EQ(c->kv_events().size(), 2);
  EXPECT_EQ(c->kv_events().dropped(), 2);
  KVEvent two[2];
  EXPECT_EQ(*c->drain_kv_events(two, 2), 2);
  EXPECT_EQ(two[0].first_position, 0);
  EXPECT_EQ(two[1].first_position, 4);
  ASSERT_TRUE(c->enable_kv_events(0).ok());
  EXPECT_EQ(c->kv_events().dropped(), 0);
}

TEST(KVEvents, BadArgumentsAreRefusedAndChangeNothing) {
  auto c = batch({LayerPolicy::flat()}, 4, 32);
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->enable_kv_events(4).ok());
  compute(*c, 0, prompt_of(4, 1));
  auto st = c->enable_kv_events(-1);
  EXPECT_EQ(st.code(), Error::InvalidArgument);
  EXPECT_NE(std::string(st.message().c_str()).find("capacity = -1: must be in [0, 16777216]"), std::string::npos)
      << st.message().c_str();
  EXPECT_EQ(c->enable_kv_events((1 << 24) + 1).code(), Error::InvalidArgument);
  EXPECT_EQ(c->kv_events().capacity(), 4);
  EXPECT_EQ(c->kv_events().size(), 1);
  EXPECT_EQ(c->drain_kv_events(nullptr, -1).status().code(), Error::InvalidArgument);
  EXPECT_EQ(c->drain_kv_events(nullptr, 1).status().code(), Error::InvalidArgument);
  EXPECT_EQ(c->kv_events().size(), 1);
  const std::int32_t t = 0;
  EXPECT_EQ(c->lookup_prefix(&t, -1, 0).status().code(), Error::InvalidArgument);
  EXPECT_EQ(c->lookup_prefix(&t, 257, 0).status().code(), Error::InvalidArgument);
  EXPECT_EQ(c->lookup_prefix(nullptr, 3, 0).status().code(), Error::InvalidArgument);
  EXPECT_EQ(*c->lookup_prefix(nullptr, 0, 0), 0);
}

}  // namespace
}  // namespace kvcore_test
