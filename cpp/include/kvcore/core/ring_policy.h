// RingPolicy: sliding window of W keys (counting the query itself) plus S
// attention sinks. Sinks own rows [0, S); positions >= S cycle through
// R = W + C - 1 ring rows, exactly enough for a step of C tokens to be written
// in place while its earliest query still sees its full window.
#pragma once

#include <cstdint>

#include "kvcore/core/layout_policy.h"

namespace kvcore {

class RingPolicy final : public LayoutPolicy {
 public:
  /// Preconditions (validate() checks them): window >= 1, sinks >= 0,
  /// 1 <= max_step <= capacity.
  RingPolicy(int window, int sinks, int max_step, int capacity) noexcept
      : LayoutPolicy(LayerGeometry::of(LayerPolicy::ring(window, sinks), max_step, capacity)),
        window_(window),
        sinks_(sinks) {}

  LayerPolicy policy() const noexcept override { return LayerPolicy::ring(window_, sinks_); }

  bool visible(int q, int k) const noexcept override { return policy().sees(q, k); }

  int window_begin(int q) const noexcept override { return policy().window_begin(q); }

  SeqStepPlan plan(int position, int T) const noexcept override {
    const int end = position + T;
    SeqStepPlan p;
    auto run_end = [this](int pos) { return row_run_end(pos); };
    append_runs(p.write, p.n_write, position, end, run_end);
    // Needed set: sinks [0, min(S, end)) and window [max(0, P - W + 1), end).
    const int begin = window_begin(position);
    const int sink_end = sinks_ < end ? sinks_ : end;
    if (begin <= sink_end) {
      append_runs(p.read, p.n_read, 0, end, run_end);
    } else {
      append_runs(p.read, p.n_read, 0, sink_end, run_end);
      append_runs(p.read, p.n_read, begin, end, run_end);
    }
    return p;
  }

  int held_floor(int end) const noexcept override {
    const int ring = geometry().ring_rows;  // 0: the layer never wraps, every row is kept
    if (ring == 0) return 0;
    return end > ring ? end - ring : 0;
  }

  int needed_floor(int n) const noexcept override {
    const std::int64_t lo = static_cast<std::int64_t>(n) - window_ + 1;
    const std::int64_t floor = lo > sinks_ ? lo : sinks_;
    return floor < n ? static_cast<int>(floor) : n;
  }

 private:
  // One past the last position whose row continues row(pos) without a jump.
  int row_run_end(int pos) const noexcept {
    const LayerGeometry& g = geometry();
    if (!g.wraps()) return capacity_end();
    if (pos < g.sink_rows) return g.rows;  // sinks run straight into ring row S
    // 64-bit and clamped: within R of INT_MAX, pos + rows left would overflow.
    const std::int64_t end = static_cast<std::int64_t>(pos) + (g.rows - row(pos));
    return end < capacity_end() ? static_cast<int>(end) : capacity_end();
  }
  static constexpr int capacity_end() noexcept { return 0x7fffffff; }

  int window_;
  int sinks_;
};

}  // namespace kvcore
