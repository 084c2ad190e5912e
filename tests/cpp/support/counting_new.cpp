// Replaces global operator new and delete for the whole test binary; see
// counting_new.h. Counters are atomic: registry tests allocate from threads.
#include "counting_new.h"

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

namespace kvcore_test {
namespace {

std::atomic<std::uint64_t> g_news{0};
std::atomic<std::uint64_t> g_throwing_news{0};
std::atomic<std::int64_t> g_live{0};
std::atomic<std::int64_t> g_nothrow_left{-1};  // nothrow news that may still succeed; -1: any
std::atomic<bool> g_nothrow_failed{false};

void* counted_malloc(std::size_t bytes) noexcept {
  void* p = std::malloc(bytes == 0 ? 1 : bytes);
  if (p != nullptr) g_live.fetch_add(1, std::memory_order_relaxed);
  return p;
}

// Over-aligned types (alignas above the default) take these forms.
void* counted_aligned_alloc(std::size_t bytes, std::align_val_t align) noexcept {
  const auto a = static_cast<std::size_t>(align);
  const std::size_t rounded = bytes == 0 ? a : (bytes + a - 1) / a * a;  // aligned_alloc's rule
  void* p = std::aligned_alloc(a, rounded);
  if (p != nullptr) g_live.fetch_add(1, std::memory_order_relaxed);
  return p;
}

// Takes one success from the budget; false once it is spent.
bool nothrow_may_succeed() noexcept {
  std::int64_t left = g_nothrow_left.load(std::memory_order_relaxed);
  while (left > 0 && !g_nothrow_left.compare_exchange_weak(left, left - 1)) {
  }
  return left != 0;
}

}  // namespace

std::uint64_t operator_news() noexcept { return g_news.load(); }
std::uint64_t throwing_news() noexcept { return g_throwing_news.load(); }
std::int64_t live_news() noexcept { return g_live.load(); }

FailNothrowNewAfter::FailNothrowNewAfter(std::int64_t successes) noexcept {
  g_nothrow_failed.store(false);
  g_nothrow_left.store(successes < 0 ? 0 : successes);
}
FailNothrowNewAfter::~FailNothrowNewAfter() { g_nothrow_left.store(-1); }
bool FailNothrowNewAfter::failed_any() const noexcept { return g_nothrow_failed.load(); }

}  // namespace kvcore_test

void* operator new(std::size_t bytes) {
  kvcore_test::g_news.fetch_add(1, std::memory_order_relaxed);
  kvcore_test::g_throwing_news.fetch_add(1, std::memory_order_relaxed);
  if (void* p = kvcore_test::counted_malloc(bytes)) return p;
  std::abort();  // built without exceptions: nothing to throw
}
void* operator new[](std::size_t bytes) { return ::operator new(bytes); }
void* operator new(std::size_t bytes, const std::nothrow_t&) noexcept {
  kvcore_test::g_news.fetch_add(1, std::memory_order_relaxed);
  if (!kvcore_test::nothrow_may_succeed()) {
    kvcore_test::g_nothrow_failed.store(true);
    return nullptr;
  }
  return kvcore_test::counted_malloc(bytes);
}
void* operator new[](std::size_t bytes, const std::nothrow_t& tag) noexcept {
  return ::operator new(bytes, tag);
}
void* operator new(std::size_t bytes, std::align_val_t align) {
  kvcore_test::g_news.fetch_add(1, std::memory_order_relaxed);
  kvcore_test::g_throwing_news.fetch_add(1, std::memory_order_relaxed);
  if (void* p = kvcore_test::counted_aligned_alloc(bytes, align)) return p;
  std::abort();
}
void* operator new[](std::size_t bytes, std::align_val_t align) { return ::operator new(bytes, align); }
void* operator new(std::size_t bytes, std::align_val_t align, const std::nothrow_t&) noexcept {
  kvcore_test::g_news.fetch_add(1, std::memory_order_relaxed);
  if (!kvcore_test::nothrow_may_succeed()) {
    kvcore_test::g_nothrow_failed.store(true);
    return nullptr;
  }
  return kvcore_test::counted_aligned_alloc(bytes, align);
}
void* operator new[](std::size_t bytes, std::align_val_t align, const std::nothrow_t& tag) noexcept {
  return ::operator new(bytes, align, tag);
}
void operator delete(void* p) noexcept {
  if (p == nullptr) return;
  kvcore_test::g_live.fetch_sub(1, std::memory_order_relaxed);
  std::free(p);
}
void operator delete[](void* p) noexcept { ::operator delete(p); }
void operator delete(void* p, std::size_t) noexcept { ::operator delete(p); }
void operator delete[](void* p, std::size_t) noexcept { ::operator delete(p); }
void operator delete(void* p, std::align_val_t) noexcept { ::operator delete(p); }
void operator delete[](void* p, std::align_val_t) noexcept { ::operator delete(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { ::operator delete(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { ::operator delete(p); }
