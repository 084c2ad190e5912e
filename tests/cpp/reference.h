// Test-only reference for DESIGN.md section 2, written from the contract and
// not from the policies: the row formula, visibility, the needed set, and a
// simulated pool per layer that records which position (and which write of
// it) each row holds. Tests use it to derive expectations and to check plans.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvcore/core/config.h"
#include "kvcore/core/plan.h"

namespace kvcore_test {

using kvcore::CacheConfig;
using kvcore::LayerPolicy;
using kvcore::Run;
using kvcore::SeqStepPlan;

/// DESIGN default: max_step == 0 means min(512, capacity).
inline std::int64_t design_max_step(const CacheConfig& cfg) {
  if (cfg.max_step != 0) return cfg.max_step;
  return cfg.capacity < 512 ? cfg.capacity : 512;
}

/// One layer's layout as DESIGN.md section 2 states it, in 64-bit arithmetic.
struct LayerModel {
  bool ring = false;
  std::int64_t window = 0;   // W
  std::int64_t sinks = 0;    // S
  std::int64_t max_step = 0; // C
  std::int64_t capacity = 0;

  static LayerModel of(const CacheConfig& cfg, int layer) {
    const LayerPolicy p = cfg.layers.size() == 1 ? cfg.layers[0].policy
                                                  : cfg.layers[static_cast<std::size_t>(layer)].policy;
    LayerModel m;
    m.ring = p.kind == LayerPolicy::Kind::Ring;
    m.window = p.window;
    m.sinks = p.sinks;
    m.max_step = design_max_step(cfg);
    m.capacity = cfg.capacity;
    return m;
  }

  /// R = W + C - 1 ring slots after the S sink slots.
  std::int64_t ring_slots() const { return window + max_step - 1; }
  bool wraps() const { return ring && sinks + ring_slots() < capacity; }
  std::int64_t rows() const {
    if (!ring) return capacity;
    const std::int64_t wanted = sinks + ring_slots();
    return wanted < capacity ? wanted : capacity;
  }
  std::int64_t row(std::int64_t p) const {
    if (!wraps() || p < sinks) return p;
    return sinks + (p - sinks) % ring_slots();
  }
  /// May a query at q see key k?
  bool visible(std::int64_t q, std::int64_t k) const {
    if (k > q) return false;
    if (!ring) return true;
    return q - k < window || k < sinks;
  }
  /// Is position p in the needed set of the step [P, P + T)?
  bool needed(std::int64_t p, std::int64_t P, std::int64_t T) const {
    if (p < 0 || p >= P + T) return false;
    if (!ring) return true;
    const std::int64_t window_begin = P - window + 1 > 0 ? P - window + 1 : 0;
    return p < sinks || p >= window_begin;
  }
};

/// Positions [begin, end).
struct Interval {
  std::int64_t begin, end;
};

/// The needed set of the step [P, P + T) as at most two intervals: the sinks,
/// then the window; one interval when they touch.
inline std::vector<Interval> needed_intervals(const LayerModel& m, std::int64_t P, std::int64_t T) {
  const std::int64_t end = P + T;
  if (!m.ring) return {{0, end}};
  const std::int64_t sink_end = m.sinks < end ? m.sinks : end;
  const std::int64_t window_begin = P - m.window + 1 > 0 ? P - m.window + 1 : 0;
  if (window_begin <= sink_end) return {{0, end}};
  std::vector<Interval> out;
  if (sink_end > 0) out.push_back({0, sink_end});
  out.push_back({window_begin, end});
  return out;
}

inline std::string describe(const Run& r) {
  return "{row " + std::to_string(r.row) + ", len " + std::to_string(r.len) + ", pos " +
         std::to_string(r.pos) + "}";
}

inline std::string describe(const SeqStepPlan& p) {
  std::string s = "write [";
  for (int i = 0; i < p.n_write; ++i) s += (i ? " " : "") + describe(p.write[i]);
  s += "] read [";
  for (int i = 0; i < p.n_read; ++i) s += (i ? " " : "") + describe(p.read[i]);
  return s + "]";
}

inline std::string describe(const CacheConfig& cfg) {
  std::string s = "capacity " + std::to_string(cfg.capacity) + ", n_layers " +
                  std::to_string(cfg.n_layers) + ", max_step " + std::to_string(cfg.max_step) +
                  ", layers [";
  for (std::size_t i = 0; i < cfg.layers.size(); ++i) {
    const LayerPolicy& p = cfg.layers[i].policy;
    if (i) s += " ";
    if (p.kind == LayerPolicy::Kind::Ring)
      s += "Ring(" + std::to_string(p.window) + "," + std::to_string(p.sinks) + ")";
    else
      s += "Flat";
  }
  return s + "]";
}

/// Structural check of one layer's plan for the step [P, P + T) against the
/// contract: write runs cover [P, P + T) in order (<= 2 runs), read runs cover
/// exactly the needed set in increasing position order (Flat 1 run, Ring <= 3),
/// every row is where row(p) puts it, and no two adjacent runs could be merged.
/// Returns "" when the plan is right, else what is wrong.
inline std::string check_plan_shape(const LayerModel& m, const SeqStepPlan& plan, std::int64_t P,
                                    std::int64_t T) {
  const std::string where = " in plan(P " + std::to_string(P) + ", T " + std::to_string(T) +
                            ") = " + describe(plan);
  if (plan.n_write < 1 || plan.n_write > SeqStepPlan::kMaxWriteRuns)
    return "n_write = " + std::to_string(plan.n_write) + where;
  if (plan.n_read < 1 || plan.n_read > SeqStepPlan::kMaxReadRuns)
    return "n_read = " + std::to_string(plan.n_read) + where;
  if (!m.ring && plan.n_read != 1) return "a Flat layer reads more than one run" + where;

  auto check_runs = [&](const Run* runs, int n, const char* what) -> std::string {
    for (int i = 0; i < n; ++i) {
      const Run& r = runs[i];
      if (r.len < 1) return std::string(what) + " run of len < 1" + where;
      if (r.row < 0 || static_cast<std::int64_t>(r.row) + r.len > m.rows())
        return std::string(what) + " run outside rows [0, " + std::to_string(m.rows()) + ")" + where;
      for (std::int64_t j = 0; j < r.len; ++j)
        if (r.row + j != m.row(r.pos + j))
          return std::string(what) + " row of position " + std::to_string(r.pos + j) + " is " +
                 std::to_string(r.row + j) + ", row(p) says " + std::to_string(m.row(r.pos + j)) +
                 where;
      if (i > 0) {
        const Run& prev = runs[i - 1];
        if (prev.end_pos() > r.pos)
          return std::string(what) + " runs not in increasing position order" + where;
        if (prev.end_row() == r.row && prev.end_pos() == r.pos)
          return std::string(what) + " runs " + std::to_string(i - 1) + " and " +
                 std::to_string(i) + " should be merged" + where;
      }
    }
    return "";
  };
  std::string err = check_runs(plan.write, plan.n_write, "write");
  if (!err.empty()) return err;
  err = check_runs(plan.read, plan.n_read, "read");
  if (!err.empty()) return err;

  // Writes: exactly [P, P + T), consecutive in position order.
  std::int64_t next = P;
  for (int i = 0; i < plan.n_write; ++i) {
    if (plan.write[i].pos != next) return "write runs do not continue at " + std::to_string(next) + where;
    next += plan.write[i].len;
  }
  if (next != P + T) return "write runs end at " + std::to_string(next) + where;

  // Reads: exactly the needed set. Runs are increasing and disjoint (checked
  // above), so counting positions in the set and comparing sizes suffices.
  std::int64_t covered = 0;
  for (int i = 0; i < plan.n_read; ++i)
    for (std::int64_t j = 0; j < plan.read[i].len; ++j) {
      const std::int64_t p = plan.read[i].pos + j;
      if (!m.needed(p, P, T)) return "reads position " + std::to_string(p) + ", not needed" + where;
      ++covered;
    }
  std::int64_t wanted = 0;
  for (std::int64_t p = 0; p < P + T; ++p) wanted += m.needed(p, P, T) ? 1 : 0;
  if (covered != wanted)
    return "reads " + std::to_string(covered) + " positions, the needed set has " +
           std::to_string(wanted) + where;
  return "";
}

/// Simulated pools of a whole cache: each row remembers the position last
/// written to it and which write (a version) that was. A position's committed
/// version is the step that committed it, so a row holding the right position
/// from an aborted step still counts as stale.
class PoolSim {
 public:
  explicit PoolSim(const CacheConfig& cfg) {
    for (int l = 0; l < cfg.n_layers; ++l) {
      models_.push_back(LayerModel::of(cfg, l));
      pools_.emplace_back(static_cast<std::size_t>(models_.back().rows()), Slot{});
    }
    committed_.assign(static_cast<std::size_t>(cfg.capacity), 0);
  }

  int n_layers() const { return static_cast<int>(models_.size()); }
  const LayerModel& model(int layer) const { return models_[static_cast<std::size_t>(layer)]; }
  int length() const { return length_; }
  bool has_step() const { return step_version_ != 0; }

  /// A step [length, length + T) begins: from now on its rows count as written.
  /// Call apply_writes() for every layer next.
  void begin(int T) {
    step_P_ = length_;
    step_T_ = T;
    step_version_ = ++last_version_;
  }

  /// Checks the plan's shape, then writes its rows with the step's version.
  std::string apply_writes(int layer, const SeqStepPlan& plan) {
    const LayerModel& m = model(layer);
    std::string err = check_plan_shape(m, plan, step_P_, step_T_);
    if (!err.empty()) return "layer " + std::to_string(layer) + ": " + err;
    std::vector<Slot>& pool = pools_[static_cast<std::size_t>(layer)];
    for (int i = 0; i < plan.n_write; ++i)
      for (int j = 0; j < plan.write[i].len; ++j)
        pool[static_cast<std::size_t>(plan.write[i].row + j)] = Slot{plan.write[i].pos + j, step_version_};
    return "";
  }

  /// After the writes: every row the plan reads holds the position it claims,
  /// written by the step that committed it (or by this step).
  std::string check_reads(int layer, const SeqStepPlan& plan) const {
    const std::vector<Slot>& pool = pools_[static_cast<std::size_t>(layer)];
    for (int i = 0; i < plan.n_read; ++i)
      for (int j = 0; j < plan.read[i].len; ++j) {
        const int p = plan.read[i].pos + j;
        const Slot& s = pool[static_cast<std::size_t>(plan.read[i].row + j)];
        const std::uint64_t want = p >= step_P_ ? step_version_ : committed_[static_cast<std::size_t>(p)];
        if (s.position != p || s.version != want)
          return "layer " + std::to_string(layer) + ": row " + std::to_string(plan.read[i].row + j) +
                 " claimed to hold position " + std::to_string(p) + " but holds position " +
                 std::to_string(s.position) + (s.position == p ? " from a stale write" : "") +
                 " (step P " + std::to_string(step_P_) + ", T " + std::to_string(step_T_) + ") " +
                 describe(plan);
      }
    return "";
  }

  void commit() {
    for (int p = step_P_; p < step_P_ + step_T_; ++p) committed_[static_cast<std::size_t>(p)] = step_version_;
    length_ = step_P_ + step_T_;
    step_version_ = 0;
  }
  void rewind(int n) {
    length_ = n;
    step_version_ = 0;
  }
  void clear() { rewind(0); }

  /// Independent judgement of rewind(n) from the simulated rows: allowed iff
  /// 0 <= n <= length and, on every layer, every position below n that a
  /// query at n can see is still held (its row holds its committed write).
  bool brute_can_rewind(int n) const {
    if (n < 0 || n > length_) return false;
    for (int l = 0; l < n_layers(); ++l) {
      const std::vector<bool> held = held_positions(l);
      for (int p = 0; p < n; ++p)
        if (model(l).visible(n, p) && !held[static_cast<std::size_t>(p)]) return false;
    }
    return true;
  }

  /// brute_can_rewind for every n in [0, length] at once (the same rule, with
  /// one pass over the rows per layer instead of one per n).
  std::vector<bool> brute_can_rewind_all() const {
    std::vector<bool> ok(static_cast<std::size_t>(length_) + 1, true);
    for (int l = 0; l < n_layers(); ++l) {
      const LayerModel& m = model(l);
      const std::vector<bool> held = held_positions(l);
      // missing[p] = positions below p not held.
      std::vector<int> missing(static_cast<std::size_t>(length_) + 1, 0);
      for (int p = 0; p < length_; ++p)
        missing[static_cast<std::size_t>(p) + 1] = missing[static_cast<std::size_t>(p)] + (held[static_cast<std::size_t>(p)] ? 0 : 1);
      auto missing_in = [&](std::int64_t a, std::int64_t b) {  // [a, b)
        if (a < 0) a = 0;
        if (b <= a) return 0;
        return missing[static_cast<std::size_t>(b)] - missing[static_cast<std::size_t>(a)];
      };
      for (int n = 0; n <= length_; ++n) {
        int miss;
        if (!m.ring) {
          miss = missing_in(0, n);
        } else {
          const std::int64_t sink_end = m.sinks < n ? m.sinks : n;
          const std::int64_t window_begin = n - m.window + 1;
          miss = missing_in(0, sink_end) +
                 missing_in(window_begin > sink_end ? window_begin : sink_end, n);
        }
        if (miss != 0) ok[static_cast<std::size_t>(n)] = false;
      }
    }
    return ok;
  }

 private:
  struct Slot {
    int position = -1;
    std::uint64_t version = 0;
  };

  // held[p] for p < length: some row of the layer holds p's committed write.
  std::vector<bool> held_positions(int layer) const {
    std::vector<bool> held(static_cast<std::size_t>(length_), false);
    for (const Slot& s : pools_[static_cast<std::size_t>(layer)])
      if (s.position >= 0 && s.position < length_ &&
          s.version == committed_[static_cast<std::size_t>(s.position)])
        held[static_cast<std::size_t>(s.position)] = true;
    return held;
  }

  std::vector<LayerModel> models_;
  std::vector<std::vector<Slot>> pools_;
  std::vector<std::uint64_t> committed_;  // per position: version that committed it
  int length_ = 0;
  int step_P_ = 0;
  int step_T_ = 0;
  std::uint64_t step_version_ = 0;  // 0: no begun step
  std::uint64_t last_version_ = 0;
};

}  // namespace kvcore_test
