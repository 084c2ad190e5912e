// Positions up to 2^31 - 1 (DESIGN: "all sums done without int overflow"):
// drive caches of capacity INT_MAX to the very end in big steps and check every
// plan against the DESIGN formulas computed in 64-bit arithmetic.
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "cache_fixtures.h"

namespace kvcore_test {
namespace {

// Checks runs by their ends only (a run's rows are consecutive and inside the
// pool, so matching row(p) at both ends means matching it everywhere), merges
// them by position and compares with the expected intervals.
std::string check_runs(const LayerModel& m, const Run* runs, int n,
                       const std::vector<Interval>& expected, const char* what) {
  std::vector<Interval> got;
  for (int i = 0; i < n; ++i) {
    const Run& r = runs[i];
    const std::string at = std::string(what) + " run " + describe(r);
    if (r.len < 1 || r.row < 0 || static_cast<std::int64_t>(r.row) + r.len > m.rows())
      return at + " is empty or outside the pool";
    if (r.row != m.row(r.pos)) return at + ": first row is not row(pos)";
    const std::int64_t last = static_cast<std::int64_t>(r.pos) + r.len - 1;
    if (static_cast<std::int64_t>(r.row) + r.len - 1 != m.row(last)) return at + ": last row is not row(pos)";
    if (i > 0 && runs[i - 1].end_row() == r.row && runs[i - 1].end_pos() == r.pos)
      return at + " should be merged with the one before";
    if (!got.empty() && got.back().end == r.pos)
      got.back().end += r.len;
    else
      got.push_back({r.pos, static_cast<std::int64_t>(r.pos) + r.len});
  }
  if (got.size() != expected.size()) return std::string(what) + ": wrong number of position intervals";
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i].begin != expected[i].begin || got[i].end != expected[i].end)
      return std::string(what) + ": covers [" + std::to_string(got[i].begin) + ", " +
             std::to_string(got[i].end) + "), expected [" + std::to_string(expected[i].begin) +
             ", " + std::to_string(expected[i].end) + ")";
  return "";
}

void drive_to_int_max(const CacheConfig& cfg) {
  auto cache = must_create(cfg);
  ASSERT_NE(cache, nullptr);
  const int C = cache->max_step();
  int steps = 0;
  while (cache->length() < INT_MAX) {
    const std::int64_t room = static_cast<std::int64_t>(INT_MAX) - cache->length();
    const int T = room < C ? static_cast<int>(room) : C;
    auto step = cache->begin_step(T);
    ASSERT_TRUE(step.ok()) << step.message().c_str();
    for (int l = 0; l < cfg.n_layers; ++l) {
      const LayerModel m = LayerModel::of(cfg, l);
      auto plan = cache->plan(l, *step);
      ASSERT_TRUE(plan.ok()) << plan.message().c_str();
      // docs/design.md section 2 ("Plan of a step"): a write is at most 2 runs (a wrapped ring), a read 1 (Flat) or at
      // most 3 (Ring: the sinks and a wrapped window).
      ASSERT_LE(plan->n_write, 2);
      ASSERT_LE(plan->n_read, m.ring ? 3 : 1);
      const std::string werr =
          check_runs(m, plan->write, plan->n_write, {{step->position, step->end()}}, "write");
      ASSERT_EQ(werr, "") << describe(cfg) << " layer " << l << " step at " << step->position;
      const std::string rerr =
          check_runs(m, plan->read, plan->n_read, needed_intervals(m, step->position, T), "read");
      ASSERT_EQ(rerr, "") << describe(cfg) << " layer " << l << " step at " << step->position;
    }
    ASSERT_TRUE(cache->commit(*step).ok());
    ++steps;
  }
  EXPECT_EQ(cache->length(), INT_MAX);
  // Derived: steps of C (the last one shorter) from 0 to INT_MAX are ceil((2^31 - 1) / C) of
  // them, 128 for C = 2^24 and 129 for C = 2^24 - 3.
  EXPECT_EQ(steps, (static_cast<std::int64_t>(INT_MAX) + C - 1) / C);
  EXPECT_TRUE(cache->can_extend(0));
  EXPECT_FALSE(cache->can_extend(1));
  EXPECT_FALSE(cache->can_extend(INT_MAX));
  auto full = cache->begin_step(1);
  EXPECT_EQ(full.error(), Error::OutOfResources);

  // Visibility and rewind near the top, judged by the DESIGN formulas.
  const std::int64_t L = INT_MAX;
  for (int l = 0; l < cfg.n_layers; ++l) {
    const LayerModel m = LayerModel::of(cfg, l);
    for (std::int64_t k : {std::int64_t{0}, std::int64_t{1}, L - 9, L - 8, L - 2, L - 1}) {
      auto v = cache->visible(l, INT_MAX - 1, static_cast<int>(k));
      ASSERT_TRUE(v.ok());
      EXPECT_EQ(*v, m.visible(L - 1, k)) << "layer " << l << " k " << k;
    }
  }
  // Rows of a wrapped ring hold the last R positions written: [L - R, L).
  // rewind(n) needs [n - W + 1, n) (and sinks, never evicted) on every layer.
  auto allowed = [&](std::int64_t n) {
    for (int l = 0; l < cfg.n_layers; ++l) {
      const LayerModel m = LayerModel::of(cfg, l);
      if (!m.wraps()) continue;
      const std::int64_t oldest_needed = n - m.window + 1 > m.sinks ? n - m.window + 1 : m.sinks;
      if (oldest_needed < n && oldest_needed < L - m.ring_slots()) return false;
    }
    return true;
  };
  for (std::int64_t back : {0, 1, 2, 7, 8, 9, C - 1, C, C + 1, C + 2, 2 * C})
    EXPECT_EQ(cache->can_rewind(static_cast<int>(L - back)), allowed(L - back)) << "back " << back;
}

TEST(LargePositions, RingsWithSinksAndFlatReachIntMax) {
  drive_to_int_max(make_config(
      INT_MAX,
      {LayerPolicy::ring(8, 2), LayerPolicy::flat(), LayerPolicy::ring(INT_MAX), LayerPolicy::ring(1)},
      1 << 24));
}

TEST(LargePositions, OddStepSizeReachesIntMax) {
  // A step size coprime to most things, so wraps land at many different offsets.
  drive_to_int_max(make_config(INT_MAX, {LayerPolicy::ring(1000, 7), LayerPolicy::ring(3)},
                               (1 << 24) - 3));
}

}  // namespace
}  // namespace kvcore_test
