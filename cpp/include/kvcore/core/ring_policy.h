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

  SeqStepPlan plan(int position, int T, bool /*keep_each*/) const noexcept override {
    const int end = position + T;
    SeqStepPlan p;
    append_geometry_runs(p.write, p.n_write, position, end);
    // Needed set: sinks [0, min(S, end)) and window [max(0, P - W + 1), end).
    const int begin = window_begin(position);
    const int sink_end = sinks_ < end ? sinks_ : end;
    if (begin <= sink_end) {
      append_geometry_runs(p.read, p.n_read, 0, end);
    } else {
      append_geometry_runs(p.read, p.n_read, 0, sink_end);
      append_geometry_runs(p.read, p.n_read, begin, end);
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
  int window_;
  int sinks_;
};

}  // namespace kvcore
