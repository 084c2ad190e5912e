// The test binary's replacement of global operator new (counting_new.cpp):
// counters that prove a path allocates nothing or leaks nothing, and a knob
// that makes nothrow allocations fail, as when memory runs out.
//
// A program may replace operator new only once, and the ThreadSanitizer
// runtime replaces it too: tests that include this header are left out of the
// TSan build (scripts/test.sh).
#pragma once

#include <cstdint>

namespace kvcore_test {

/// Calls of global operator new so far, every form, every thread.
std::uint64_t operator_news() noexcept;
/// Calls of the throwing forms only (new T, std::vector growth): under
/// -fno-exceptions their failure cannot be reported, only abort.
std::uint64_t throwing_news() noexcept;
/// Blocks operator new handed out that operator delete has not taken back.
std::int64_t live_news() noexcept;

/// While alive, the first `successes` nothrow operator new calls succeed and
/// every later one returns nullptr. The throwing forms are not affected.
class FailNothrowNewAfter {
 public:
  explicit FailNothrowNewAfter(std::int64_t successes) noexcept;
  ~FailNothrowNewAfter();
  FailNothrowNewAfter(const FailNothrowNewAfter&) = delete;
  FailNothrowNewAfter& operator=(const FailNothrowNewAfter&) = delete;

  /// Did a nothrow operator new return nullptr while this was alive?
  bool failed_any() const noexcept;
};

}  // namespace kvcore_test
