// FlatPolicy: full history, row(p) = p, nothing is ever evicted.
#pragma once

#include "kvcore/core/layout_policy.h"

namespace kvcore {

class FlatPolicy final : public LayoutPolicy {
 public:
  explicit FlatPolicy(int capacity) noexcept
      : LayoutPolicy(LayerGeometry::of(LayerPolicy::flat(), 1, capacity)) {}

  LayerPolicy policy() const noexcept override { return LayerPolicy::flat(); }
  bool visible(int q, int k) const noexcept override { return k <= q; }
  int window_begin(int /*q*/) const noexcept override { return 0; }

  SeqStepPlan plan(int position, int T, bool /*keep_each*/) const noexcept override {
    SeqStepPlan p;
    p.write[p.n_write++] = Run{position, T, position};
    p.read[p.n_read++] = Run{0, position + T, 0};
    return p;
  }

  int held_floor(int /*end*/) const noexcept override { return 0; }
  int needed_floor(int n) const noexcept override { return n; }
};

}  // namespace kvcore
