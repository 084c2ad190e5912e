// SharedPolicy: a layer that reuses an earlier layer's K/V (Gemma 3n's
// num_kv_shared_layers; docs/design.md section 9). It holds no rows and writes
// nothing; its plan reads exactly what its source's plan reads, after the
// source's writes of the same step, and its queries see what the source's see.
#pragma once

#include "kvcore/core/layout_policy.h"

namespace kvcore {

class SharedPolicy final : public LayoutPolicy {
 public:
  /// `source`: the policy of layer `source_layer`, owned by the same cache and
  /// outliving this one (validate() checked it holds K/V rows).
  SharedPolicy(const LayoutPolicy& source, int source_layer) noexcept
      : LayoutPolicy(LayerGeometry::of(LayerPolicy::shared(source_layer), 1, 1)),
        source_(source),
        source_layer_(source_layer) {}

  LayerPolicy policy() const noexcept override { return LayerPolicy::shared(source_layer_); }
  LayerPolicy visibility() const noexcept override { return source_.visibility(); }
  bool visible(int q, int k) const noexcept override { return source_.visible(q, k); }
  int window_begin(int q) const noexcept override { return source_.window_begin(q); }

  /// The source's plan with its writes dropped: the read runs name the
  /// source's rows.
  SeqStepPlan plan(int position, int T, bool keep_each) const noexcept override {
    SeqStepPlan p = source_.plan(position, T, keep_each);
    p.n_write = 0;
    return p;
  }

  // Holds nothing itself: what it reads, its source holds (and answers for).
  int held_floor(int /*end*/) const noexcept override { return 0; }
  int needed_floor(int n) const noexcept override { return n; }

 private:
  const LayoutPolicy& source_;
  int source_layer_;
};

}  // namespace kvcore
