// Every allocating public call when memory runs out. The core is built without
// exceptions, so each allocation must go through a nothrow path, and each
// failure must come back as MemoryAllocationFailed, change nothing and leak
// nothing. Failures are injected by the binary's operator new
// (support/counting_new.h), which also counts the throwing forms: under
// -fno-exceptions their failure could only abort, so no call may use one.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cache_fixtures.h"
#include "kvcore/batch/batch_cache.h"
#include "kvcore/registry/cache_session.h"
#include "kvcore/registry/default_builders.h"
#include "kvcore/registry/shared.h"
#include "support/counting_new.h"
#include "support/registry_text.h"

namespace kvcore_test {
namespace {

using kvcore::CacheBuilder;
using kvcore::CacheBuilderRegistry;
using kvcore::CacheRegistry;
using kvcore::CacheSession;
using kvcore::Key;
using kvcore::Status;

// Duplicate policies (shared objects), a broadcast entry, a single Flat layer.
std::vector<CacheConfig> configs() {
  return {make_config(48, {LayerPolicy::ring(4, 2), LayerPolicy::flat(), LayerPolicy::ring(3),
                           LayerPolicy::ring(4, 2)},
                      4),
          make_config(64, {LayerPolicy::ring(8)}, 2, /*n_layers=*/62),
          make_config(16, {LayerPolicy::flat()})};
}

// Runs `attempt` with the first 0, 1, 2, ... nothrow allocations succeeding and
// the rest failing, until one run allocates all it needs. `attempt` returns the
// outcome; a run that saw a failure must report MemoryAllocationFailed with a
// "cannot allocate" message, and `unchanged` (checked after every failed run)
// must hold. Every run must leave no block behind once its results are dropped,
// and use no throwing operator new. Returns the number of failed runs.
int fail_each_allocation(const std::function<Status()>& attempt,
                         const std::function<void()>& unchanged, int line = __builtin_LINE()) {
  SCOPED_TRACE(line);
  int failures = 0;
  for (int successes = 0;; ++successes) {
    EXPECT_LT(successes, 200) << "the call kept failing";
    if (successes >= 200) return failures;
    const std::int64_t live_before = live_news();
    const std::uint64_t throwing_before = throwing_news();
    bool failed_any = false;
    Status outcome;
    {
      FailNothrowNewAfter fail(successes);
      outcome = attempt();
      failed_any = fail.failed_any();
    }
    EXPECT_EQ(throwing_news(), throwing_before) << "a throwing operator new after " << successes;
    if (!failed_any) {
      EXPECT_TRUE(outcome.ok()) << outcome.message().c_str();
      return failures;
    }
    ++failures;
    EXPECT_EQ(outcome.code(), kvcore::Error::MemoryAllocationFailed) << "after " << successes;
    EXPECT_EQ(std::strncmp(outcome.message().c_str(), "cannot allocate ", 16), 0)
        << outcome.message().c_str();
    unchanged();
    EXPECT_EQ(live_news(), live_before) << "blocks leaked after " << successes << " successes";
  }
}

// fail_each_allocation over Cache::create(cfg): `cache` keeps the cache the
// last (successful) run built.
template <class Cache>
int fail_each_create(const CacheConfig& cfg, std::unique_ptr<Cache>& cache, int line = __builtin_LINE()) {
  return fail_each_allocation(
      [&] {
        auto created = Cache::create(cfg);
        if (!created.ok()) return created.status();
        cache = std::move(created).get();
        return Status();
      },
      [] {}, line);
}

TEST(AllocationFailure, CreateReportsEveryFailedAllocationAndLeaksNothing) {
  for (const CacheConfig& cfg : configs()) {
    SCOPED_TRACE(describe(cfg));
    const std::int64_t live_before = live_news();
    std::unique_ptr<SequenceCache> cache;
    const int failures = fail_each_create(cfg, cache);
    // Every allocation succeeded at last: a working cache.
    ASSERT_NE(cache, nullptr);
    {
      PoolSim sim(cfg);
      for (int T : {2, 1, 1}) EXPECT_EQ(run_step(*cache, sim, T), "");
    }
    cache.reset();
    // The cache object and its tables at least: more than one allocation is checked.
    EXPECT_GE(failures, 2);
    EXPECT_EQ(live_news(), live_before);
  }
}

// BatchCache: three groups with holes and a small block; one broadcast ring
// group, cell-granular; one flat layer with an explicit pool and no holes.
std::vector<CacheConfig> batch_configs() {
  std::vector<CacheConfig> out = configs();
  out[0].batch.block_size = 4;
  out[0].batch.max_seqs = 5;
  out[0].batch.max_holes = 2;
  out[1].batch.block_size = 1;
  out[1].batch.max_seqs = 3;
  out[2].batch.block_size = 16;
  out[2].batch.max_seqs = 1;
  out[2].batch.max_holes = 0;
  out[2].batch.num_blocks = 7;
  return out;
}

// Every nothrow allocation of BatchCache::create fails in turn: the cache
// object, its 4 layer tables, each group pool's 7 tables, the 8 block-table
// and sequence tables and the 14 step buffers. Each reports MemoryAllocationFailed naming
// what, leaks nothing, and no throwing operator new is used.
TEST(AllocationFailure, BatchCreateReportsEveryFailedAllocationAndLeaksNothing) {
  for (const CacheConfig& cfg : batch_configs()) {
    SCOPED_TRACE(describe(cfg));
    const std::int64_t live_before = live_news();
    std::unique_ptr<kvcore::BatchCache> cache;
    const int failures = fail_each_create(cfg, cache);
    ASSERT_NE(cache, nullptr);
    EXPECT_GE(failures, 1 + 3 + 7 * cache->n_groups() + 8 + 14);
    // Every allocation succeeded at last: a working cache.
    ASSERT_EQ(cache->add_sequence(0), kvcore::Error::Ok);
    for (int T : {2, 1, 1}) {
      const kvcore::StepEntry e{0, T, nullptr};
      auto step = cache->begin_step(&e, 1);
      ASSERT_TRUE(step.ok()) << step.message().c_str();
      ASSERT_TRUE(cache->plan(*step).ok());
      ASSERT_EQ(cache->commit(*step), kvcore::Error::Ok);
    }
    EXPECT_EQ(cache->sequence(0)->length, 4);
    if (cache->max_seqs() > 1) {
      EXPECT_EQ(cache->fork(0, 1, 3), kvcore::Error::Ok);
    }
    cache.reset();
    EXPECT_EQ(live_news(), live_before);
    // Through the default builder: the shared pointer's control block too.
    EXPECT_GE(fail_each_allocation([&] { return kvcore::build_batch_cache(cfg).status(); }, [] {}),
              failures + 1);
  }
}

// Section 9: a model with all five layer kinds (SequenceCache) and one with
// chunked groups and shared layers (BatchCache). State layers hold no K/V rows.
CacheConfig five_kinds_config() {
  CacheConfig cfg;
  cfg.capacity = 40;
  cfg.max_step = 3;
  cfg.n_layers = 6;
  cfg.layers = {LayerConfig{LayerPolicy::flat(), 2, 8, 0},       LayerConfig{LayerPolicy::ring(5, 2), 2, 8, 0},
                LayerConfig{LayerPolicy::chunked(4), 2, 8, 0},   LayerConfig{LayerPolicy::shared(2), 2, 8, 0},
                LayerConfig{LayerPolicy::state(4), 0, 0, 0},     LayerConfig{LayerPolicy::shared(0), 2, 8, 0}};
  return cfg;
}

CacheConfig chunked_shared_batch_config() {
  CacheConfig cfg;
  cfg.capacity = 48;
  cfg.max_step = 4;
  cfg.n_layers = 5;
  cfg.layers = {LayerConfig{LayerPolicy::chunked(5), 2, 8, 0}, LayerConfig{LayerPolicy::flat(), 2, 8, 0},
                LayerConfig{LayerPolicy::shared(0), 2, 8, 0},  LayerConfig{LayerPolicy::chunked(3), 2, 8, 0},
                LayerConfig{LayerPolicy::shared(1), 2, 8, 0}};
  cfg.batch.block_size = 2;
  cfg.batch.max_seqs = 3;
  cfg.batch.max_holes = 2;
  return cfg;
}

TEST(AllocationFailure, SectionNineKindsCreateReportsEveryFailureAndLeaksNothing) {
  const CacheConfig cfg = five_kinds_config();
  ASSERT_TRUE(kvcore::validate(cfg).ok());
  SCOPED_TRACE(describe(cfg));  // before the count, as above: gtest's first trace allocates its stack
  const std::int64_t live_before = live_news();
  std::unique_ptr<SequenceCache> cache;
  const int failures = fail_each_create(cfg, cache);
  ASSERT_NE(cache, nullptr);
  EXPECT_GE(failures, 2);
  // A working cache: verify steps, a rewind into one, a tree.
  for (int T : {3, 2, 3}) {
    auto step = cache->begin_step(T, /*verify=*/true);
    ASSERT_TRUE(step.ok()) << step.message().c_str();
    for (int l = 0; l < cache->n_layers(); ++l) ASSERT_TRUE(cache->plan(l, *step).ok());
    ASSERT_EQ(cache->commit(*step), Error::Ok);
  }
  ASSERT_EQ(cache->rewind(cache->length() - 2), Error::Ok);
  const int parents[3] = {-1, 0, 0};
  const int path[2] = {0, 2};
  auto tree = cache->begin_tree(parents, 3);
  ASSERT_TRUE(tree.ok()) << tree.message().c_str();
  ASSERT_EQ(cache->commit(*tree, path, 2), Error::Ok);
  EXPECT_EQ(cache->length(), 8);
  cache.reset();
  EXPECT_EQ(live_news(), live_before);
}

// The five kinds in a BatchCache: the State group's 7 slot tables fail in
// turn too, and the cache built at last plans verify steps, a fork (which
// shares the state snapshot), a tree and its commit without allocating more.
TEST(AllocationFailure, StateGroupBatchCreateReportsEveryFailureAndLeaksNothing) {
  CacheConfig cfg = five_kinds_config();
  cfg.batch.block_size = 2;
  cfg.batch.max_seqs = 3;
  SCOPED_TRACE(describe(cfg));
  const std::int64_t live_before = live_news();
  std::unique_ptr<kvcore::BatchCache> cache;
  const int failures = fail_each_create(cfg, cache);
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(cache->n_state_groups(), 1);
  EXPECT_GE(failures, 1 + 6 + 7 * cache->n_groups() + 7 + 8 + 16);
  ASSERT_EQ(cache->add_sequence(0), Error::Ok);
  for (int T : {3, 2, 3}) {
    kvcore::StepEntry e{0, T, nullptr};
    e.verify = true;
    auto step = cache->begin_step(&e, 1);
    ASSERT_TRUE(step.ok()) << step.message().c_str();
    ASSERT_TRUE(cache->plan(*step).ok());
    ASSERT_EQ(cache->commit(*step), Error::Ok);
  }
  ASSERT_EQ(cache->rewind(0, 6), Error::Ok);
  ASSERT_EQ(cache->fork(0, 1, 6), Error::Ok);
  const int parents[3] = {-1, 0, 0};
  const int nodes[2] = {0, 2};
  const kvcore::StepEntry tree{1, 3, nullptr, parents};
  auto step = cache->begin_step(&tree, 1);
  ASSERT_TRUE(step.ok()) << step.message().c_str();
  const kvcore::AcceptedPath path{1, nodes, 2};
  auto done = cache->commit(*step, &path, 1);
  ASSERT_TRUE(done.ok()) << done.message().c_str();
  EXPECT_EQ(done->state_groups[0].n_copies, 1);
  EXPECT_EQ(cache->sequence(1)->length, 8);
  cache.reset();
  EXPECT_EQ(live_news(), live_before);
}

TEST(AllocationFailure, ChunkedAndSharedBatchCreateReportsEveryFailureAndLeaksNothing) {
  const CacheConfig cfg = chunked_shared_batch_config();
  SCOPED_TRACE(describe(cfg));
  const std::int64_t live_before = live_news();
  std::unique_ptr<kvcore::BatchCache> cache;
  const int failures = fail_each_create(cfg, cache);
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(cache->n_groups(), 3);  // shared layers hold no group of their own
  EXPECT_GE(failures, 1 + 3 + 7 * cache->n_groups() + 8 + 14);
  ASSERT_EQ(cache->add_sequence(0), Error::Ok);
  for (int i = 0; i < 8; ++i) {
    const kvcore::StepEntry e{0, 1 + i % 4, nullptr};
    auto step = cache->begin_step(&e, 1);
    ASSERT_TRUE(step.ok()) << step.message().c_str();
    ASSERT_TRUE(cache->plan(*step).ok());
    ASSERT_EQ(cache->commit(*step), Error::Ok);
  }
  EXPECT_LT(*cache->blocks_held(0, *cache->group_of(0)), *cache->blocks_held(0, *cache->group_of(1)));  // chunks went
  EXPECT_EQ(cache->fork(0, 1, cache->sequence(0)->length - 1), Error::Ok);
  cache.reset();
  EXPECT_EQ(live_news(), live_before);
}

// A pool of more than 2^30 blocks is refused before its tables are asked for
// (its key table takes 2 int slots per block). Before the fix nothing refused
// it: with B = 1 up to 2^31 - 1 blocks passed the rows check, BlockPool asked
// for some 30 GiB and sized its key table past INT_MAX (signed overflow). The
// allocations after the layer tables fail here, so the unfixed code returned
// MemoryAllocationFailed instead of trying.
// The same model with its states in the pool (batch.states_in_pool): the
// State groups' tables and the pool's extra groups fail as cleanly.
TEST(AllocationFailure, StatesInThePoolBatchCreateReportsEveryFailureAndLeaksNothing) {
  CacheConfig cfg = five_kinds_config();
  cfg.batch.block_size = 2;
  cfg.batch.max_seqs = 3;
  cfg.batch.states_in_pool = true;
  cfg.batch.state_snapshots = 1;
  SCOPED_TRACE(describe(cfg));
  const std::int64_t live_before = live_news();
  {
    std::unique_ptr<kvcore::BatchCache> cache;
    const int failures = fail_each_create(cfg, cache);
    ASSERT_NE(cache, nullptr);
    EXPECT_GE(failures, 1 + 6 + 7 * cache->n_groups());
    EXPECT_EQ(*cache->num_state_slots(0), *cache->num_blocks(0));
    ASSERT_EQ(cache->add_sequence(0), Error::Ok);
    kvcore::StepEntry e{0, 3, nullptr};
    auto step = cache->begin_step(&e, 1);
    ASSERT_TRUE(step.ok()) << step.message().c_str();
    ASSERT_EQ(cache->commit(*step), Error::Ok);
  }
  EXPECT_EQ(live_news(), live_before);
}

TEST(AllocationFailure, ABatchPoolPast2To30BlocksIsRefusedBeforeItsTables) {
  CacheConfig cfg = configs()[2];  // capacity 16, one flat layer
  cfg.batch.block_size = 1;
  cfg.batch.max_seqs = 1;
  cfg.batch.num_blocks = (1 << 30) + 1;
  Status outcome;
  {
    // The cache object, its 7 layer tables, the 5 tables forming the groups and the 2 sharing storage.
    FailNothrowNewAfter fail(15);
    outcome = kvcore::BatchCache::create(cfg).status();
  }
  EXPECT_EQ(outcome.code(), kvcore::Error::InvalidArgument) << outcome.message().c_str();
  EXPECT_STREQ(outcome.message().c_str(), "the pool: 1073741825 blocks: a pool holds at most 2^30 blocks");
  // 2^30 blocks pass (the pool asks for its tables, which fail here).
  cfg.batch.num_blocks = 1 << 30;
  {
    FailNothrowNewAfter fail(20);  // as above, the 2 of its table rows and the 3 of its table pages
    outcome = kvcore::BatchCache::create(cfg).status();
  }
  EXPECT_EQ(outcome.code(), kvcore::Error::MemoryAllocationFailed);
  EXPECT_STREQ(outcome.message().c_str(), "cannot allocate the block tables of the cache's pool (1073741824 blocks)");
}

// A KV event queue that cannot be allocated leaves the old one: its capacity,
// its undrained events and its dropped count.
TEST(AllocationFailure, AKVEventQueueThatCannotBeAllocatedLeavesTheOldOne) {
  CacheConfig cfg = configs()[2];  // capacity 16, one flat layer
  cfg.batch.block_size = 2;
  cfg.batch.max_seqs = 2;
  auto cache = std::move(kvcore::BatchCache::create(cfg)).get();
  ASSERT_TRUE(cache->enable_kv_events(1).ok());
  ASSERT_TRUE(cache->add_sequence(0).ok());
  const std::int32_t tokens[] = {1, 2, 3, 4};
  const kvcore::StepEntry e{0, 4, tokens};
  auto begun = cache->begin_step(&e, 1);
  ASSERT_TRUE(begun.ok());
  ASSERT_TRUE(cache->commit(*begun).ok());  // two blocks stored: one queued, one dropped
  ASSERT_EQ(cache->kv_events().size(), 1);
  ASSERT_EQ(cache->kv_events().dropped(), 1);
  Status outcome;
  {
    FailNothrowNewAfter fail(0);
    outcome = cache->enable_kv_events(1 << 24);
  }
  EXPECT_EQ(outcome.code(), kvcore::Error::MemoryAllocationFailed);
  EXPECT_STREQ(outcome.message().c_str(), "cannot allocate a queue of 16777216 kv events");
  EXPECT_EQ(cache->kv_events().capacity(), 1);
  EXPECT_EQ(cache->kv_events().size(), 1);
  EXPECT_EQ(cache->kv_events().dropped(), 1);
}

// A pool whose create() fails keeps what it had: its old tables, counts and
// keys (nothing is assigned before every new table is allocated).
TEST(AllocationFailure, BlockPoolCreateThatFailsKeepsThePoolAsItWas) {
  kvcore::BlockPool pool;
  ASSERT_TRUE(pool.create(4, "a test pool").ok());
  const int held = pool.allocate();
  const kvcore::BlockKey key{1, 2};
  ASSERT_TRUE(pool.set_key(held, key, 0, 0));
  // Every failed run must leave the 4-block pool as it was; the last run
  // (all 6 tables allocated) makes it a 64-block pool.
  const int failures = fail_each_allocation([&] { return pool.create(64, "a bigger pool"); },
                                            [&] {
                                              EXPECT_EQ(pool.n_blocks(), 4);
                                              EXPECT_EQ(pool.used_blocks(), 1);
                                              EXPECT_EQ(pool.free_blocks(), 3);
                                              EXPECT_EQ(pool.refs(held), 1);
                                              EXPECT_EQ(pool.find(key), held);
                                            });
  // One per table: the blocks' records (refs, owner, LRU links, key), the
  // heap, the one pool's per-group cached, held and keyed counts, and the key slots.
  EXPECT_EQ(failures, 6);
  EXPECT_EQ(pool.n_blocks(), 64);
  EXPECT_EQ(pool.free_blocks(), 64);
  EXPECT_EQ(pool.find(key), -1);
}

TEST(AllocationFailure, RegistryInstallsAndListsThroughNothrowPathsOnly) {
  CacheRegistry reg;
  std::shared_ptr<kvcore::CacheBase> cache = must_create(configs()[2]);
  // Enough entries that the table grows while we fail.
  for (int i = 0; i < 4; ++i) ASSERT_EQ(reg.install("before" + std::to_string(i), cache), kvcore::Error::Ok);
  const std::vector<std::string> keys_before = texts(reg.keys());
  auto unchanged = [&] { EXPECT_EQ(texts(reg.keys()), keys_before); };
  EXPECT_GE(fail_each_allocation([&] { return reg.install("installed", cache); }, unchanged), 2);
  EXPECT_TRUE(reg.contains("installed"));
  ASSERT_EQ(reg.erase("installed"), kvcore::Error::Ok);

  EXPECT_GE(fail_each_allocation(
                [&] {
                  auto key = reg.install_unique("unique", cache);
                  if (key.ok()) {
                    EXPECT_EQ(reg.erase(key->view()), kvcore::Error::Ok);
                  }
                  return key.status();
                },
                unchanged),
            2);
  EXPECT_GE(fail_each_allocation([&] { return reg.keys().status(); }, unchanged), 2);
  EXPECT_GE(fail_each_allocation([&] { return reg.make_unique_key("k").status(); }, unchanged), 1);
}

TEST(AllocationFailure, BuilderRegistryRegistersAndListsThroughNothrowPathsOnly) {
  CacheBuilderRegistry reg;
  for (int i = 0; i < 4; ++i)
    ASSERT_EQ(reg.register_builder("b" + std::to_string(i), "sequence", &kvcore::build_sequence_cache),
              kvcore::Error::Ok);
  const auto names_before = texts(reg.keys());
  auto unchanged = [&] { EXPECT_EQ(texts(reg.keys()), names_before); };
  EXPECT_GE(fail_each_allocation(
                [&] {
                  Status s = reg.register_builder("npu", "sequence", &kvcore::build_sequence_cache);
                  if (s.ok()) {
                    EXPECT_EQ(reg.unregister_builder("npu", "sequence"), kvcore::Error::Ok);
                  }
                  return s;
                },
                unchanged),
            3);
  EXPECT_GE(fail_each_allocation([&] { return reg.keys().status(); }, unchanged), 2);
  int state = 7;
  EXPECT_GE(fail_each_allocation(
                [&] {
                  auto builder = CacheBuilder::from_callable(
                      [state](const CacheConfig& c) {
                        (void)state;  // a capture: the callable is stored, not a plain function
                        return kvcore::build_sequence_cache(c);
                      });
                  return builder.status();
                },
                [] {}),
            2);
  // Building: the cache, its tables and the shared pointer's control block.
  ASSERT_EQ(reg.register_builder("cpu", "sequence", &kvcore::build_sequence_cache), kvcore::Error::Ok);
  const CacheConfig cfg = configs()[0];
  EXPECT_GE(fail_each_allocation([&] { return reg.build("cpu", "sequence", cfg).status(); },
                                 [] {}),
            3);
}

TEST(AllocationFailure, SessionsCreateAndAdoptThroughNothrowPathsOnly) {
  CacheRegistry caches;
  CacheBuilderRegistry builders;
  ASSERT_EQ(kvcore::register_default_builders(builders), kvcore::Error::Ok);
  auto unchanged = [&] { EXPECT_EQ(caches.size(), 0u); };
  const CacheConfig cfg = configs()[0];
  EXPECT_GE(fail_each_allocation(
                [&] {
                  auto session = CacheSession::create(kvcore::kCpuBackend, kvcore::kSequenceKind,
                                                      cfg, caches, builders);
                  if (session.ok()) {
                    EXPECT_EQ(caches.size(), 1u);
                  }
                  return session.status();
                },
                unchanged),
            5);
  std::shared_ptr<kvcore::CacheBase> cache = must_create(configs()[2]);
  EXPECT_GE(fail_each_allocation(
                [&] { return CacheSession::adopt(cache, "adopted", caches).status(); }, unchanged),
            2);
}

TEST(AllocationFailure, ShareAndKeyReportFailure) {
  EXPECT_EQ(fail_each_allocation(
                [] {
                  std::unique_ptr<int> object(new (std::nothrow) int(3));
                  if (object == nullptr)
                    return Status::make(kvcore::Error::MemoryAllocationFailed, "cannot allocate the int");
                  return kvcore::share(std::move(object)).status();
                },
                [] {}),
            2);  // the int itself, then the control block (the int is deleted)
  EXPECT_EQ(fail_each_allocation([] { return Key::concat("prefix", "#1").status(); }, [] {}), 1);
}

}  // namespace
}  // namespace kvcore_test
