// LayoutPolicy: pure per-layer layout math (positions -> rows, visibility,
// what a write evicts). Stateless after construction; one object serves every
// layer with the same policy.
#pragma once

#include <cstddef>

#include "kvcore/core/config.h"
#include "kvcore/core/geometry.h"
#include "kvcore/core/plan.h"
#include "kvcore/core/result.h"

namespace kvcore {

class LayoutPolicy {
 public:
  virtual ~LayoutPolicy() = default;

  virtual LayerPolicy policy() const noexcept = 0;
  /// How positions map onto rows (the one source of a layer's layout).
  const LayerGeometry& geometry() const noexcept { return geometry_; }
  /// Physical rows a byte layer allocates for a layer with this policy.
  int rows() const noexcept { return geometry_.rows; }
  /// The row that holds `position` (position >= 0).
  int row(int position) const noexcept { return geometry_.row(position); }
  /// May a query at q see key k? (q, k >= 0)
  virtual bool visible(int q, int k) const noexcept = 0;
  /// The oldest position a query at q sees past the sinks (0 for full history):
  /// q sees [0, sinks) and [window_begin(q), q].
  virtual int window_begin(int q) const noexcept = 0;
  /// The plan of the step writing positions [position, position + T).
  /// Precondition (checked by SequenceCache): 0 <= position, 1 <= T <= max_step,
  /// position + T <= capacity.
  virtual SeqStepPlan plan(int position, int T) const noexcept = 0;
  /// After positions below `end` were written, the oldest evictable position
  /// whose row can still hold it (0 when nothing is ever evicted).
  virtual int held_floor(int end) const noexcept = 0;
  /// The oldest evictable position a query at `n` needs below n; n when none.
  virtual int needed_floor(int n) const noexcept = 0;

 protected:
  explicit LayoutPolicy(const LayerGeometry& geometry) noexcept : geometry_(geometry) {}

  // Appends the runs of positions [begin, end) to `runs`; `row_run_end(p)` is
  // one past the last position whose row follows row(p) consecutively, so each
  // run is maximal. Callers pass disjoint, non-adjacent intervals, so runs of
  // different calls never need merging.
  template <std::size_t kMax, typename RowRunEnd>
  void append_runs(Run (&runs)[kMax], int& n, int begin, int end, RowRunEnd row_run_end) const
      noexcept {
    constexpr int kRuns = static_cast<int>(kMax);
    for (int p = begin; p < end;) {
      const int run_end = row_run_end(p);
      const int stop = run_end < end ? run_end : end;
      KVCORE_CHECK(n < kRuns, "plan needs more runs than a SeqStepPlan holds");
      runs[n++] = Run{row(p), stop - p, p};
      p = stop;
    }
  }

 private:
  LayerGeometry geometry_;
};

}  // namespace kvcore
