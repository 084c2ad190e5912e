// SequenceInfo: one sequence of a BatchCache, a copy taken by cache.sequence(seq).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "bindings.h"
#include "batch_sequence_info.h"
#include "errors.h"
#include "int_args.h"
#include "kvcore/batch/batch_cache.h"

namespace kvcore_py {

namespace {

using Cache = kvcore::BatchCache;
using CachePtr = std::shared_ptr<Cache>;

}  // namespace

void register_batch_sequence_info(py::module_& m) {
  py::class_<SequenceSnapshot>(m, "SequenceInfo",
                               "One sequence of a BatchCache, as the runner sees it: a copy, taken when "
                               "cache.sequence(seq) was called.")
      .def_readonly("active", &SequenceSnapshot::active,
                    "False until add_sequence() or fork() (and after release_sequence()).")
      .def_readonly("length", &SequenceSnapshot::length,
                    "Committed length L: the next step writes positions L, L + 1, ...")
      .def_readonly("visible_start", &SequenceSnapshot::visible_start,
                    "Positions below it were removed (remove(seq, 0, p1)).")
      .def_property_readonly("holes",
                             [](const SequenceSnapshot& s) { return holes_of(s.holes.data(), static_cast<int>(s.holes.size())); },
                             "Removed middle ranges [(begin, end), ...], sorted.")
      .def_readonly("visible_positions", &SequenceSnapshot::visible_positions,
                    "Positions [0, length) not removed: what the sequence still sees.")
      .def("__repr__", [](const SequenceSnapshot& s) {
        return "SequenceInfo(active=" + std::string(s.active ? "True" : "False") +
               ", length=" + std::to_string(s.length) + ", visible_start=" + std::to_string(s.visible_start) +
               ", holes=" + py::repr(holes_of(s.holes.data(), static_cast<int>(s.holes.size()))).cast<std::string>() + ")";
      });
}

}  // namespace kvcore_py
