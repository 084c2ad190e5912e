// StatePolicy: a recurrent-state layer (linear attention, gated DeltaNet,
// Mamba, short convolutions; docs/design.md section 9). The token at p reads
// the state after p - 1 (zeros at p = 0) and produces the state after p. The
// layer keeps D state snapshots, slot(p) = p mod D: section 2's ring, each row
// a snapshot. A step that may be rewound into (keep_each: a verify or tree
// step) writes the state after each of its positions (T <= D - 1, so never
// the slot it reads); any other step writes only its last. Per sequence the
// policy keeps which position's state each slot holds, which makes
// can_rewind(n) exact: true when the state after n - 1 is held.
#pragma once

#include "kvcore/core/layout_policy.h"

namespace kvcore {

class StatePolicy final : public LayoutPolicy {
 public:
  /// Precondition (validate() checks it): slots >= 1.
  explicit StatePolicy(int slots) noexcept
      : LayoutPolicy(LayerGeometry::of(LayerPolicy::state(slots), 1, 1)), slots_(slots) {}

  LayerPolicy policy() const noexcept override { return LayerPolicy::state(slots_); }
  /// A state layer has no keys: no query sees one.
  bool visible(int /*q*/, int /*k*/) const noexcept override { return false; }
  int window_begin(int q) const noexcept override { return q; }

  /// Writes: the slots of positions [P, P + T) when keep_each, else the slot
  /// of P + T - 1. Reads: the slot of P - 1 (the state the step starts from),
  /// none at P = 0 (the state is zeros).
  SeqStepPlan plan(int position, int T, bool keep_each) const noexcept override {
    const int end = position + T;
    SeqStepPlan p;
    append_geometry_runs(p.write, p.n_write, keep_each ? position : end - 1, end);
    if (position > 0) p.read[p.n_read++] = Run{row(position - 1), 1, position - 1};
    return p;
  }

  // The floor bookkeeping of attention layers does not apply: the slot table
  // below answers instead.
  int held_floor(int /*end*/) const noexcept override { return 0; }
  int needed_floor(int n) const noexcept override { return n > 0 ? n - 1 : 0; }

  /// held[s]: the position whose state slot s holds, -1 when none.
  int held_ints() const noexcept override { return slots_; }
  void reset_held(int* held) const noexcept override {
    for (int s = 0; s < slots_; ++s) held[s] = -1;
  }
  void note_begin(int* held, int position, int T, bool keep_each) const noexcept override {
    note_truncate(held, position);  // states past the length belong to a replaced or aborted step
    // (A tree node's slot holds a node's state until the commit's copies: past
    // the length either way, so no query sees the difference.)
    const int end = position + T;
    for (int p = keep_each ? position : end - 1; p < end; ++p) held[row(p)] = p;
  }
  void note_tree_commit(int* held, int position, int m) const noexcept override {
    for (int d = 0; d < m; ++d) held[row(position + d)] = position + d;
  }
  void note_truncate(int* held, int n) const noexcept override {
    for (int s = 0; s < slots_; ++s)
      if (held[s] >= n) held[s] = -1;
  }
  int held_from(const int* held, int length) const noexcept override {
    int p = length;
    while (p > 0 && held[row(p - 1)] == p - 1) --p;
    return p;
  }
  void restore_held(int* held, int floor, int length) const noexcept override {
    for (int p = floor; p < length; ++p) held[row(p)] = p;
  }
  bool holds_for(const int* held, int n) const noexcept override {
    return n == 0 || held[row(n - 1)] == n - 1;
  }

 private:
  int slots_;
};

}  // namespace kvcore
