// The planner -> backend hand-off: where a step's rows go and what it reads.
#pragma once

namespace kvcore {

/// `len` consecutive rows starting at `row`, holding consecutive logical
/// positions starting at `pos`.
struct Run {
  int row = 0;
  int len = 0;
  int pos = 0;

  int end_row() const noexcept { return row + len; }
  int end_pos() const noexcept { return pos + len; }
  friend bool operator==(const Run& a, const Run& b) noexcept {
    return a.row == b.row && a.len == b.len && a.pos == b.pos;
  }
  friend bool operator!=(const Run& a, const Run& b) noexcept { return !(a == b); }
};

/// One layer's plan for one step, in position order. Input row j of the step
/// goes to position P + j; `read` lists every row the step's queries may see.
struct SeqStepPlan {
  static constexpr int kMaxWriteRuns = 2;  // a ring wraps at most once per step
  static constexpr int kMaxReadRuns = 3;   // sinks + a wrapped window

  Run write[kMaxWriteRuns];
  int n_write = 0;
  Run read[kMaxReadRuns];
  int n_read = 0;

  int write_len() const noexcept {
    int n = 0;
    for (int i = 0; i < n_write; ++i) n += write[i].len;
    return n;
  }
  int read_len() const noexcept {
    int n = 0;
    for (int i = 0; i < n_read; ++i) n += read[i].len;
    return n;
  }
  /// One past the last position the step writes (its P + T); 0 without writes.
  int end_position() const noexcept { return n_write == 0 ? 0 : write[n_write - 1].end_pos(); }
  /// True when a backend can write and read with one contiguous span each.
  bool is_contiguous() const noexcept { return n_write == 1 && n_read == 1; }

  friend bool operator==(const SeqStepPlan& a, const SeqStepPlan& b) noexcept {
    if (a.n_write != b.n_write || a.n_read != b.n_read) return false;
    for (int i = 0; i < a.n_write; ++i)
      if (a.write[i] != b.write[i]) return false;
    for (int i = 0; i < a.n_read; ++i)
      if (a.read[i] != b.read[i]) return false;
    return true;
  }
  friend bool operator!=(const SeqStepPlan& a, const SeqStepPlan& b) noexcept { return !(a == b); }
};

}  // namespace kvcore
