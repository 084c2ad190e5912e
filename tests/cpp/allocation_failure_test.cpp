// SequenceCache::create when memory runs out: the core is built without
// exceptions, so every allocation create makes must be checked and reported
// as MemoryAllocationFailed, leaving nothing behind. Failures are injected by
// the binary's operator new (support/counting_new.h).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cache_fixtures.h"
#include "support/counting_new.h"

namespace kvcore_test {
namespace {

// Duplicate policies (shared objects), a broadcast entry, a single Flat layer.
std::vector<CacheConfig> configs() {
  return {make_config(48, {LayerPolicy::ring(4, 2), LayerPolicy::flat(), LayerPolicy::ring(3),
                           LayerPolicy::ring(4, 2)},
                      4),
          make_config(64, {LayerPolicy::ring(8)}, 2, /*n_layers=*/62),
          make_config(16, {LayerPolicy::flat()})};
}

// Fails the first, second, ... nothrow allocation of create() until one create
// allocates all it needs: each failure must be reported and leak nothing.
TEST(AllocationFailure, CreateReportsEveryFailedAllocationAndLeaksNothing) {
  for (const CacheConfig& cfg : configs()) {
    SCOPED_TRACE(describe(cfg));
    int failures = 0;
    for (int successes = 0;; ++successes) {
      ASSERT_LT(successes, 100) << "create() kept failing";
      const std::int64_t live_before = live_news();
      bool failed_any = false;
      {
        kvcore::Result<std::unique_ptr<SequenceCache>> created = [&] {
          FailNothrowNewAfter fail(successes);
          auto r = SequenceCache::create(cfg);
          failed_any = fail.failed_any();
          return r;
        }();
        if (failed_any) {
          ++failures;
          EXPECT_EQ(created.error(), Error::MemoryAllocationFailed) << "after " << successes;
          const std::string message = created.ok() ? "" : created.message();
          EXPECT_EQ(message.rfind("cannot allocate ", 0), 0u) << message;
        } else {
          // Every allocation succeeded: a working cache.
          ASSERT_TRUE(created.ok()) << created.message();
          EXPECT_GT(live_news(), live_before);  // the leak check below sees the cache's blocks
          SequenceCache& cache = **created;
          PoolSim sim(cfg);
          for (int T : {2, 1, 1}) EXPECT_EQ(run_step(cache, sim, T), "");
        }
      }
      EXPECT_EQ(live_news(), live_before) << "blocks leaked after " << successes << " successes";
      if (!failed_any) break;
    }
    // The cache object and its tables at least: more than one allocation is checked.
    EXPECT_GE(failures, 2);
  }
}

// create() allocates through the throwing operator new (which can only abort
// here) no more than copying the config costs: CacheConfig::layers is a
// std::vector, the one allocation the public type forces on it.
TEST(AllocationFailure, CreateUsesNoThrowingAllocationBeyondTheConfigCopy) {
  for (const CacheConfig& cfg : configs()) {
    SCOPED_TRACE(describe(cfg));
    std::uint64_t before = throwing_news();
    { const CacheConfig copy = cfg; }
    const std::uint64_t copy_cost = throwing_news() - before;
    before = throwing_news();
    auto created = SequenceCache::create(cfg);
    const std::uint64_t create_cost = throwing_news() - before;
    ASSERT_TRUE(created.ok()) << created.message();
    EXPECT_EQ(create_cost, copy_cost);
  }
}

}  // namespace
}  // namespace kvcore_test
