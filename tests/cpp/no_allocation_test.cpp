// Proof that the per-step path never allocates: this file replaces the global
// operator new/delete with counting versions (for the whole test binary; they
// only count), then runs every per-step call on a mixed cache, error paths
// included, and asserts the count did not move.
#include <gtest/gtest.h>

#include <atomic>
#include <climits>
#include <cstdlib>
#include <new>

#include "cache_fixtures.h"

namespace {

std::atomic<long> g_allocations{0};

void* counted_alloc(std::size_t size) noexcept {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(size == 0 ? 1 : size);
}

void* counted_aligned_alloc(std::size_t size, std::align_val_t align) noexcept {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  void* p = nullptr;
  const std::size_t a = static_cast<std::size_t>(align) < sizeof(void*) ? sizeof(void*)
                                                                          : static_cast<std::size_t>(align);
  return posix_memalign(&p, a, size == 0 ? 1 : size) == 0 ? p : nullptr;
}

// The throwing forms cannot throw here (-fno-exceptions): running out of
// memory in a test is fatal anyway.
void* must(void* p) {
  if (p == nullptr) std::abort();
  return p;
}

}  // namespace

void* operator new(std::size_t size) { return must(counted_alloc(size)); }
void* operator new[](std::size_t size) { return must(counted_alloc(size)); }
void* operator new(std::size_t size, const std::nothrow_t&) noexcept { return counted_alloc(size); }
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept { return counted_alloc(size); }
void* operator new(std::size_t size, std::align_val_t a) { return must(counted_aligned_alloc(size, a)); }
void* operator new[](std::size_t size, std::align_val_t a) { return must(counted_aligned_alloc(size, a)); }
void* operator new(std::size_t size, std::align_val_t a, const std::nothrow_t&) noexcept {
  return counted_aligned_alloc(size, a);
}
void* operator new[](std::size_t size, std::align_val_t a, const std::nothrow_t&) noexcept {
  return counted_aligned_alloc(size, a);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }

namespace kvcore_test {
namespace {

// The counter must see allocations at all, or a zero below proves nothing.
TEST(NoAllocation, CounterSeesAllocations) {
  const long before = g_allocations.load();
  auto cache = SequenceCache::create(make_config(64, {LayerPolicy::ring(4), LayerPolicy::flat()}, 4));
  ASSERT_TRUE(cache.ok());
  EXPECT_GT(g_allocations.load(), before);  // create() may allocate; it is not per-step
}

// Every outcome is written into plain locals inside the counted region and
// asserted after it, so gtest's own bookkeeping cannot allocate in between.
TEST(NoAllocation, PerStepPathNeverAllocates) {
  const int C = 4;
  const CacheConfig cfg = make_config(
      48, {LayerPolicy::ring(5, 2), LayerPolicy::flat(), LayerPolicy::ring(3), LayerPolicy::ring(5, 2)},
      C);
  auto created = SequenceCache::create(cfg);
  ASSERT_TRUE(created.ok());
  SequenceCache& cache = **created;
  kvcore::CacheBase& base = cache;

  int good = 0, expected_good = 0;  // successful calls that must succeed
  int bad = 0, expected_bad = 0;    // failing calls that must fail
  long checksum = 0;                // keeps results observable
  auto ok = [&](bool b) { ++expected_good; good += b ? 1 : 0; };
  auto fails = [&](bool b) { ++expected_bad; bad += b ? 0 : 1; };

  const long before = g_allocations.load();
  for (int round = 0; round < 3; ++round) {
    // Decode and chunk past several wraps, planning through both overloads.
    for (int i = 0; i < 20; ++i) {
      const int T = 1 + i % C;
      if (!cache.can_extend(T)) break;
      if (i % 3 == 0) {  // begin, abandon, retry: the retry path
        auto abandoned = cache.begin_step(T);
        ok(abandoned.ok());
      }
      auto step = cache.begin_step(T);
      ok(step.ok());
      for (int l = 0; l < cache.n_layers(); ++l) {
        auto a = cache.plan(l, step->position, step->T);
        auto b = cache.plan(l, *step);
        ok(a.ok() && b.ok());
        checksum += a->read_len() + b->write_len();
        auto rows = cache.rows(l);
        ok(rows.ok());
        auto vis = cache.visible(l, step->end() - 1, 0);
        ok(vis.ok());
      }
      for (int n = 0; n <= cache.length(); ++n) checksum += cache.can_rewind(n) ? 1 : 0;
      ok(cache.commit(*step).ok());
    }
    // Error paths: each formats a message into the Status, still no allocation.
    fails(cache.begin_step(0).ok());
    fails(cache.begin_step(C + 1).ok());
    fails(cache.plan(-1, 0, 1).ok());
    fails(cache.plan(0, Step{}).ok());
    fails(cache.commit(Step{}).ok());
    fails(cache.rewind(-1).ok());
    fails(cache.rewind(cache.length() + 1).ok());
    fails(cache.rewind(cache.length() - C - 3).ok());  // into evicted history
    fails(cache.can_rewind(-5));
    fails(cache.rows(99).ok());
    fails(cache.visible(0, -1, 0).ok());
    fails(cache.can_extend(INT_MAX));
    {
      auto stale = cache.begin_step(1);
      ok(stale.ok());
      ok(cache.begin_step(1).ok());
      fails(cache.commit(*stale).ok());
      fails(cache.plan(1, *stale).ok());
    }
    // Rewind within the allowed range, then clear.
    ok(cache.rewind(cache.length() - 1).ok());
    ok(base.as_control()->rewind(cache.length() - 1).ok());
    ok(base.as_planner()->rows(0).ok());
    while (cache.can_extend(C)) {
      auto s = cache.begin_step(C);
      ok(s.ok() && cache.commit(*s).ok());
    }
    fails(cache.begin_step(C).ok());  // OutOfResources: the loop above filled the cache
    cache.clear();
    ok(cache.length() == 0);
  }
  const long allocations = g_allocations.load() - before;

  EXPECT_EQ(allocations, 0);
  EXPECT_EQ(good, expected_good);
  EXPECT_EQ(bad, expected_bad);
  EXPECT_GT(expected_good, 100);
  EXPECT_GT(checksum, 0);
}

}  // namespace
}  // namespace kvcore_test
