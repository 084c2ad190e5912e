// LayerGeometry: how one layer's positions map onto its rows.
#include <pybind11/stl.h>

#include <memory>
#include <string>

#include "bindings.h"
#include "errors.h"
#include "kvcore/core/sequence_cache.h"

namespace kvcore_py {

void register_layer_geometry(py::module_& m) {
  py::class_<kvcore::LayerGeometry> geometry(
      m, "LayerGeometry",
      "How one layer's positions map onto its rows (SequenceCache.geometry(layer)): the one "
      "source of a layer's layout, which byte layers and the memory planner read.");
  copyable_value(geometry);
  geometry
      .def_readonly("rows", &kvcore::LayerGeometry::rows,
                    "Rows the layer's storage holds (rows(layer)).")
      .def_readonly("sink_rows", &kvcore::LayerGeometry::sink_rows,
                    "Rows [0, sink_rows) hold positions [0, sink_rows) for ever: a wrapping "
                    "ring's attention sinks (0 for flat layers and rings that never wrap).")
      .def_readonly("ring_rows", &kvcore::LayerGeometry::ring_rows,
                    "Rows reused in turn after the sinks: position p >= sink_rows lives in row "
                    "sink_rows + (p - sink_rows) % ring_rows; 0 when the layer never wraps.")
      .def_property_readonly("wraps", &kvcore::LayerGeometry::wraps,
                             "True when rows are reused (ring_rows != 0).")
      .def_property_readonly("mirror_rows", &kvcore::LayerGeometry::mirror_rows,
                             "Rows a mirrored byte layer repeats after the last row (copies of the "
                             "first ring rows) so a wrapped window is one span: ring_rows - 1 for a "
                             "wrapping ring without sinks, else 0.")
      .def("row",
           [](const kvcore::LayerGeometry& g, const PyInt& position) {
             const int p = to_int("position", position);
             if (p < 0) raise(kvcore::Error::InvalidArgument, "position = " + std::to_string(p) + ": must be >= 0");
             return g.row(p);
           },
           py::arg("position"), "The row that holds `position` (>= 0).")
      .def("held_rows",
           [](const kvcore::LayerGeometry& g, const PyInt& end) { return g.held_rows(to_int("end", end)); },
           py::arg("end"),
           "Rows that hold a position once positions [0, end) were written: min(end, rows).")
      .def("position_at",
           [](const kvcore::LayerGeometry& g, const PyInt& row, const PyInt& end) {
             return g.position_at(to_int("row", row), to_int("end", end));
           },
           py::arg("row"), py::arg("end"),
           "The position `row` stands for once positions [0, end) were written (the latest "
           "mapped to it); -1 when none is.")
      .def("__eq__", [](const kvcore::LayerGeometry& a, const kvcore::LayerGeometry& b) { return a == b; },
           py::is_operator())
      .def("__repr__", [](const kvcore::LayerGeometry& g) {
        return "LayerGeometry(rows=" + std::to_string(g.rows) + ", sink_rows=" +
               std::to_string(g.sink_rows) + ", ring_rows=" + std::to_string(g.ring_rows) + ")";
      });
}

}  // namespace kvcore_py
