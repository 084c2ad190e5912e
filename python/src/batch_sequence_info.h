// A BatchCache sequence as Python sees it (SequenceInfo, batch_sequence_info.cpp):
// a copy, and the removed ranges as a list of (begin, end).
#pragma once

#include <pybind11/pybind11.h>

#include <vector>

#include "kvcore/batch/batch_cache.h"

namespace kvcore_py {

namespace py = pybind11;

// A sequence's state copied out of the cache: kvcore::SequenceInfo points into
// the cache's hole table, which later calls change and the cache's end frees.
struct SequenceSnapshot {
  bool active = false;
  int length = 0;
  int visible_start = 0;
  int visible_positions = 0;
  std::vector<kvcore::PositionRange> holes;
};

inline SequenceSnapshot snapshot_of(const kvcore::SequenceInfo& s) {
  SequenceSnapshot out{s.active, s.length, s.visible_start, s.visible_positions(), {}};
  out.holes.assign(s.holes, s.holes + s.n_holes);
  return out;
}

inline py::list holes_of(const kvcore::PositionRange* holes, int n) {
  py::list out;
  for (int i = 0; i < n; ++i) out.append(py::make_tuple(holes[i].begin, holes[i].end));
  return out;
}

}  // namespace kvcore_py
