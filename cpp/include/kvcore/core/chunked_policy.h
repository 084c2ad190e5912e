// ChunkedPolicy: chunked attention (Llama 4's chunked_attention, chunk size
// K): a query at q sees k <= q iff both lie in the same chunk of K positions
// (docs/design.md section 9). A query looks back at most K - 1 positions, so
// the layer lives in a ring of K + C - 1 rows, exactly as a ring of window K
// without sinks; only the mask and what a rewind needs differ.
#pragma once

#include "kvcore/core/layout_policy.h"

namespace kvcore {

class ChunkedPolicy final : public LayoutPolicy {
 public:
  /// Preconditions (validate() checks them): chunk >= 1, 1 <= max_step <= capacity.
  ChunkedPolicy(int chunk, int max_step, int capacity) noexcept
      : LayoutPolicy(LayerGeometry::of(LayerPolicy::chunked(chunk), max_step, capacity)),
        chunk_(chunk) {}

  LayerPolicy policy() const noexcept override { return LayerPolicy::chunked(chunk_); }
  bool visible(int q, int k) const noexcept override { return policy().sees(q, k); }
  int window_begin(int q) const noexcept override { return q - q % chunk_; }

  SeqStepPlan plan(int position, int T, bool /*keep_each*/) const noexcept override {
    const int end = position + T;
    SeqStepPlan p;
    append_geometry_runs(p.write, p.n_write, position, end);
    // Needed set: [K * floor(P / K), P + T): later queries of the step read
    // from their own, later, chunk starts.
    append_geometry_runs(p.read, p.n_read, window_begin(position), end);
    return p;
  }

  int held_floor(int end) const noexcept override {
    const int ring = geometry().ring_rows;  // 0: the layer never wraps, every row is kept
    if (ring == 0) return 0;
    return end > ring ? end - ring : 0;
  }

  int needed_floor(int n) const noexcept override { return window_begin(n); }

 private:
  int chunk_;
};

}  // namespace kvcore
