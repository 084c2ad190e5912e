// LayerGeometry: how one layer's positions map onto its rows. The one source
// of a layer's row layout: policies plan with it, the planner face reports it,
// byte layers (KVPool, the torch pool) and the memory planner read it and
// derive nothing themselves.
#pragma once

#include <cstdint>

#include "kvcore/core/config.h"

namespace kvcore {

struct LayerGeometry {
  /// Rows the layer's storage holds: positions never need more.
  int rows = 0;
  /// Rows [0, sink_rows) hold positions [0, sink_rows) for ever: a wrapping
  /// ring's attention sinks. 0 for flat layers and rings that never wrap.
  int sink_rows = 0;
  /// Rows [sink_rows, sink_rows + ring_rows) are reused in turn: position
  /// p >= sink_rows lives in row sink_rows + (p - sink_rows) % ring_rows.
  /// 0 when the layer never wraps (row(p) = p).
  int ring_rows = 0;
  /// True for a State layer: its rows are state snapshots, slot(p) = p mod
  /// rows, each read alone (so never mirrored).
  bool state_slots = false;

  /// True when rows are reused (a ring or chunked layer whose sinks + W + C - 1
  /// rows are fewer than the capacity; always for a State layer).
  bool wraps() const noexcept { return ring_rows != 0; }

  /// The row that holds `position` (0 <= position < capacity).
  int row(int position) const noexcept {
    if (!wraps() || position < sink_rows) return position;
    return sink_rows + (position - sink_rows) % ring_rows;
  }

  /// Rows a mirrored byte layer repeats after its last row, copies of ring
  /// rows [sink_rows, sink_rows + mirror_rows()), so that a window that wraps
  /// round the ring is one span: ring_rows - 1 for a ring that wraps without
  /// sinks; 0 otherwise (with sinks a read is two spans anyway, so a mirror
  /// would cost rows and save no copy).
  int mirror_rows() const noexcept {
    return wraps() && sink_rows == 0 && !state_slots ? ring_rows - 1 : 0;
  }

  /// Rows that hold a position once positions [0, end) were written: rows
  /// [0, held_rows(end)), each holding position_at(row, end).
  int held_rows(int end) const noexcept { return end < rows ? end : rows; }

  /// The position `row` holds once positions [0, end) were written: the latest
  /// one mapped to it. -1 when none is (row >= held_rows(end)).
  int position_at(int row_index, int end) const noexcept {
    if (row_index < 0 || row_index >= held_rows(end)) return -1;
    if (!wraps() || row_index < sink_rows) return row_index;
    // Latest offset o <= last (offsets count from the first ring position) with
    // o = row_index - sink_rows (mod ring_rows).
    const int last = end - 1 - sink_rows;
    const int slot = row_index - sink_rows;
    return sink_rows + last - ((last - slot) % ring_rows);
  }

  /// The geometry of a layer with `policy` in a cache of `capacity` positions
  /// stepping at most `max_step` tokens. Preconditions (validate() checks
  /// them): a valid policy, 1 <= max_step <= capacity.
  static LayerGeometry of(const LayerPolicy& policy, int max_step, int capacity) noexcept {
    LayerGeometry g;
    g.rows = capacity;
    switch (policy.kind) {
      case LayerPolicy::Kind::Shared:  // holds no rows: it reads its source's
        g.rows = 0;
        return g;
      case LayerPolicy::Kind::State:  // D snapshots in turn, whatever the capacity
        g.rows = g.ring_rows = policy.slots;
        g.state_slots = true;
        return g;
      case LayerPolicy::Kind::Ring:
      case LayerPolicy::Kind::Chunked:
        break;
      default:
        return g;
    }
    // A ring needs W + C - 1 rows after its sinks: a step of C tokens is then
    // written in place while its first query still sees its whole window. A
    // chunked layer's query looks back at most K - 1 positions: the same ring
    // with W = K and no sinks. 64-bit: W + C - 1 + S can exceed INT_MAX.
    const std::int64_t ring = static_cast<std::int64_t>(policy.window) + max_step - 1;
    if (ring + policy.sinks >= capacity) return g;  // never wraps: row(p) = p
    g.rows = static_cast<int>(ring + policy.sinks);
    g.sink_rows = policy.sinks;
    g.ring_rows = static_cast<int>(ring);
    return g;
  }

  friend bool operator==(const LayerGeometry& a, const LayerGeometry& b) noexcept {
    return a.rows == b.rows && a.sink_rows == b.sink_rows && a.ring_rows == b.ring_rows &&
           a.state_slots == b.state_slots;
  }
  friend bool operator!=(const LayerGeometry& a, const LayerGeometry& b) noexcept { return !(a == b); }
};

}  // namespace kvcore
