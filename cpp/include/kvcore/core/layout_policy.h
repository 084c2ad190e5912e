// LayoutPolicy: pure per-layer layout math (positions -> rows, visibility,
// what a write evicts) and the bookkeeping of what a sequence's rows still
// hold. Stateless after construction; one object serves every layer with the
// same policy, and each sequence keeps held_ints() integers of its own for it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvcore/core/config.h"
#include "kvcore/core/geometry.h"
#include "kvcore/core/plan.h"
#include "kvcore/core/result.h"

namespace kvcore {

class LayoutPolicy {
 public:
  virtual ~LayoutPolicy() = default;

  virtual LayerPolicy policy() const noexcept = 0;
  /// The policy whose rule masks this layer's queries: its own, a Shared
  /// layer's source's.
  virtual LayerPolicy visibility() const noexcept { return policy(); }
  /// How positions map onto rows (the one source of a layer's layout).
  const LayerGeometry& geometry() const noexcept { return geometry_; }
  /// Physical rows a byte layer allocates for a layer with this policy.
  int rows() const noexcept { return geometry_.rows; }
  /// The row that holds `position` (position >= 0).
  int row(int position) const noexcept { return geometry_.row(position); }
  /// May a query at q see key k? (q, k >= 0; always false on a State layer.)
  virtual bool visible(int q, int k) const noexcept = 0;
  /// The oldest position a query at q sees past the sinks (0 for full history):
  /// q sees [0, sinks) and [window_begin(q), q].
  virtual int window_begin(int q) const noexcept = 0;
  /// The plan of the step writing positions [position, position + T).
  /// `keep_each`: the step may be rewound into (a verify or tree step), so a
  /// State layer keeps the state after each of its positions, not only the
  /// last; attention layers ignore it. Precondition (checked by
  /// SequenceCache): 0 <= position, 1 <= T <= max_step, position + T <=
  /// capacity, and T <= slots - 1 on a State layer when keep_each.
  virtual SeqStepPlan plan(int position, int T, bool keep_each) const noexcept = 0;
  /// After positions below `end` were written, the oldest evictable position
  /// whose row can still hold it (0 when nothing is ever evicted).
  virtual int held_floor(int end) const noexcept = 0;
  /// The oldest evictable position a query at `n` needs below n; n when none.
  virtual int needed_floor(int n) const noexcept = 0;

  // What one sequence's rows hold, in held_ints() integers the cache keeps per
  // sequence and policy. The default (attention layers) is one integer, the
  // oldest evictable position still held (docs/design.md section 2); a State
  // layer keeps which position's state each slot holds.

  /// Integers of per-sequence bookkeeping.
  virtual int held_ints() const noexcept { return 1; }
  /// Nothing is held (a new or cleared sequence).
  virtual void reset_held(int* held) const noexcept { held[0] = 0; }
  /// The step (position, T, keep_each) begins: its writes count as done,
  /// whatever they overwrite is gone.
  virtual void note_begin(int* held, int position, int T, bool keep_each) const noexcept {
    (void)keep_each;
    const int floor = held_floor(position + T);
    if (floor > held[0]) held[0] = floor;
  }
  /// A tree step at `position` committed its accepted path of m nodes: after
  /// the commit's copies, position + d holds node accepted[d]'s rows (d < m).
  virtual void note_tree_commit(int* held, int position, int m) const noexcept {
    (void)held, (void)position, (void)m;
  }
  /// The length became n: rows of positions from n on hold nothing it needs.
  virtual void note_truncate(int* held, int n) const noexcept {
    if (held[0] > n) held[0] = n;
  }
  /// The oldest position from which on what the sequence holds is whole, at
  /// length `length` (what a record carries): attention layers, the oldest
  /// evictable position still held; a State layer, the oldest p whose state
  /// and every later one's up to length - 1 are held.
  virtual int held_from(const int* held, int length) const noexcept {
    (void)length;
    return held[0];
  }
  /// An imported sequence of `length` positions holds everything from
  /// `floor` on (held was reset): rows of [floor, length) (past the sinks),
  /// or a State layer's states after those positions.
  virtual void restore_held(int* held, int floor, int length) const noexcept {
    (void)length;
    held[0] = floor;
  }
  /// Does the sequence still hold what a query at n (within its length)
  /// needs? rewind(n) and the next step at n depend on it.
  virtual bool holds_for(const int* held, int n) const noexcept {
    const int needed = needed_floor(n);
    return needed >= n || needed >= held[0];
  }

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

  // The runs of positions [begin, end) in this geometry (sinks, then the ring).
  template <std::size_t kMax>
  void append_geometry_runs(Run (&runs)[kMax], int& n, int begin, int end) const noexcept {
    append_runs(runs, n, begin, end, [this](int pos) { return wrap_run_end(pos); });
  }

 private:
  // One past the last position whose row continues row(pos) without a jump.
  int wrap_run_end(int pos) const noexcept {
    constexpr int kNoEnd = 0x7fffffff;
    const LayerGeometry& g = geometry_;
    if (!g.wraps()) return kNoEnd;
    if (pos < g.sink_rows) return g.rows;  // sinks run straight into ring row S
    // 64-bit and clamped: within R of INT_MAX, pos + rows left would overflow.
    const std::int64_t end = static_cast<std::int64_t>(pos) + (g.rows - row(pos));
    return end < kNoEnd ? static_cast<int>(end) : kNoEnd;
  }

  LayerGeometry geometry_;
};

}  // namespace kvcore
