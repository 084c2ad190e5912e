// Step.mask(): which of a layer's read rows each query of a SequenceCache step may see.
#include <pybind11/numpy.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "errors.h"
#include "frozen_array.h"
#include "py_kv_pool.h"
#include "step_handle.h"
#include "tree_binding.h"

namespace kvcore_py {

namespace {

// mask[i, j]: may the step's query i (position P + i) see the j-th read row?
// Query q sees [0, sinks) and [window_begin(q), q], so each run of a row is at
// most two spans. Layers of one policy share one read-only array per step.
py::object position_order_mask(const StepHandle& h, int l, const kvcore::SeqStepPlan& plan) {
  const kvcore::LayoutPolicy& policy = h.cache->policy(l);
  const int sinks = policy.visibility().sinks, T = h.step.T, R = plan.read_len();  // a Shared layer's: its source's
  FrozenArray<bool> out({T, R});
  bool* row = out.data;
  std::memset(row, 0, static_cast<std::size_t>(T) * static_cast<std::size_t>(R));
  for (int i = 0; i < T; ++i, row += R) {
    const int q = h.step.position + i, begin = policy.window_begin(q);
    bool* cell = row;
    for (int r = 0; r < plan.n_read; ++r) {
      const kvcore::Run& run = plan.read[r];
      const int run_end = run.pos + run.len;
      auto mark = [&](int lo, int hi) {  // positions [lo, hi) within the run
        lo = lo > run.pos ? lo : run.pos;
        hi = hi < run_end ? hi : run_end;
        if (lo < hi) std::memset(cell + (lo - run.pos), 1, static_cast<std::size_t>(hi - lo));
      };
      mark(0, sinks < q + 1 ? sinks : q + 1);
      mark(begin, q + 1);
      cell += run.len;
    }
  }
  return out.array;
}

// mask[i, r]: may query i see the position held row r stands for (row order)?
py::object row_order_mask(const StepHandle& h, int l) {
  const kvcore::LayoutPolicy& policy = h.cache->policy(l);
  const kvcore::LayerGeometry& geometry = h.cache->policy(h.cache->row_layer(l)).geometry();  // the rows it reads
  const int T = h.step.T, end = h.step.end(), rows = geometry.held_rows(end);
  FrozenArray<bool> out({T, rows});
  bool* row = out.data;
  for (int i = 0; i < T; ++i, row += rows) {
    const int q = h.step.position + i;
    for (int r = 0; r < rows; ++r) row[r] = policy.visible(q, geometry.position_at(r, end));
  }
  return out.array;
}

py::object step_mask(StepHandle& h, const PyInt& layer, const std::string& order_name) {
  const ReadOrder order = parse_order(order_name);
  const int l = to_int("layer", layer);
  const kvcore::SeqStepPlan plan = unwrap(h.cache->plan(l, h.step));  // checks layer and step
  if (h.cache->policy(l).policy().kind == kvcore::LayerPolicy::Kind::State)
    raise(kvcore::Error::InvalidArgument, "mask: layer " + std::to_string(l) +
                                              " is a State layer: it has no keys to mask (the step reads "
                                              "the state slot plan.read names)");
  std::vector<py::object>& masks = order == ReadOrder::Rows ? h.row_masks : h.masks;
  const auto index = static_cast<std::size_t>(h.cache->group_of(l));
  if (masks.empty()) masks.resize(static_cast<std::size_t>(h.cache->n_groups()));
  if (masks[index]) return masks[index];
  py::object out;
  if (h.step.tree)
    out = order == ReadOrder::Rows ? py::object(tree_row_mask(h, l)) : py::object(dense_tree_mask(h, l));
  else
    out = order == ReadOrder::Rows ? row_order_mask(h, l) : position_order_mask(h, l, plan);
  masks[index] = out;
  return out;
}

}  // namespace

void register_step_mask(py::module_& m) {
  // Step is registered by register_step(); mask() joins it here.
  py::object step_type = m.attr("Step");
  step_type.attr("mask") = py::cpp_function(
      &step_mask, py::name("mask"), py::is_method(step_type), py::arg("layer"), py::kw_only(),
      py::arg("order") = "rows",
      "Boolean numpy array (T, n): mask[i, j] is True when the "
      "step's query i (position P + i) may see the j-th row of layer's read (the visibility "
      "rule), in the order KVPool.update/read return them with the same `order`: 'rows' (n = "
      "the held rows, as they lie) or 'positions' (n = the plan's read_len, increasing "
      "positions). Read-only: layers of one policy share it. A Shared layer's mask is its "
      "source's. InvalidArgumentError: bad layer or order, or a State layer (it has no keys); "
      "InvalidStateError: the step is no longer the begun step.");
}

}  // namespace kvcore_py
