// SeqStepPlan: one layer's plan for one step of a SequenceCache, and the Runs of rows it names.
#include <pybind11/stl.h>

#include <memory>
#include <string>

#include "bindings.h"
#include "errors.h"
#include "kvcore/core/sequence_cache.h"

namespace kvcore_py {

namespace {

std::string repr(const kvcore::Run& r) {
  return "Run(row=" + std::to_string(r.row) + ", len=" + std::to_string(r.len) +
         ", pos=" + std::to_string(r.pos) + ")";
}

py::tuple runs(const kvcore::Run* runs, int n) {
  py::tuple out(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = runs[i];
  return out;
}

std::string repr(const kvcore::SeqStepPlan& p) {
  std::string s = "SeqStepPlan(write=[";
  for (int i = 0; i < p.n_write; ++i) s += (i ? ", " : "") + repr(p.write[i]);
  s += "], read=[";
  for (int i = 0; i < p.n_read; ++i) s += (i ? ", " : "") + repr(p.read[i]);
  return s + "])";
}

}  // namespace

void register_seq_step_plan(py::module_& m) {
  py::class_<kvcore::Run> run(m, "Run", "`len` consecutive rows from `row`, holding positions from `pos`.");
  copyable_value(run);
  run
      .def(py::init([](const PyInt& row, const PyInt& len, const PyInt& pos) {
             return kvcore::Run{to_int("row", row), to_int("len", len), to_int("pos", pos)};
           }),
           py::arg("row"), py::arg("len"), py::arg("pos"),
           "A run: `len` rows from `row` holding positions from `pos` (ints; InvalidArgumentError "
           "when one does not fit a 32-bit int). Plans check every run they are given.")
      .def_readonly("row", &kvcore::Run::row, "First row of the run.")
      .def_readonly("len", &kvcore::Run::len, "Rows (and positions) in the run.")
      .def_readonly("pos", &kvcore::Run::pos, "Position held by the first row; row + i holds pos + i.")
      // is_operator: comparing with another type gives NotImplemented (so False), not TypeError.
      .def("__eq__", [](const kvcore::Run& a, const kvcore::Run& b) { return a == b; }, py::is_operator())
      .def("__hash__", [](const kvcore::Run& r) { return py::hash(py::make_tuple(r.row, r.len, r.pos)); })
      .def("__iter__", [](const kvcore::Run& r) { return py::iter(py::make_tuple(r.row, r.len, r.pos)); })
      .def("__repr__", [](const kvcore::Run& r) { return repr(r); });

  py::class_<kvcore::SeqStepPlan> seq_step_plan(m, "SeqStepPlan", "One layer's plan for one step.");
  copyable_value(seq_step_plan);
  seq_step_plan
      .def_property_readonly("write", [](const kvcore::SeqStepPlan& p) { return runs(p.write, p.n_write); },
                             "Where the step's rows go: at most 2 Runs in position order (input row j "
                             "is position P + j).")
      .def_property_readonly("read", [](const kvcore::SeqStepPlan& p) { return runs(p.read, p.n_read); },
                             "Every row a query of the step may see: at most 3 Runs (sinks and a "
                             "wrapped window) in increasing position order.")
      .def_property_readonly("write_len", &kvcore::SeqStepPlan::write_len, "Rows the step writes: its T.")
      .def_property_readonly("read_len", &kvcore::SeqStepPlan::read_len, "Rows the read names.")
      .def_property_readonly("is_contiguous", &kvcore::SeqStepPlan::is_contiguous,
                             "True when the write and the read are one run each.")
      .def("__eq__", [](const kvcore::SeqStepPlan& a, const kvcore::SeqStepPlan& b) { return a == b; },
           py::is_operator())
      .def("__repr__", [](const kvcore::SeqStepPlan& p) { return repr(p); });
}

}  // namespace kvcore_py
