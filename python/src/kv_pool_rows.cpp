// KVPool's rows: write, read (and read_quantized) and update, the per-layer hot path.
#include <pybind11/numpy.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "errors.h"
#include "py_kv_pool.h"
#include "kvcore/state/sequence_export.h"
#include "kvcore/state/sequence_import.h"
#include "numpy_dtype.h"
#include "record_io.h"
#include "state_tensors.h"
#include "step_handle.h"

namespace kvcore_py {

void bind_kv_pool_rows(py::class_<PyPool>& cls) {
  cls
      .def("write",
           [](PyPool& p, const PyInt& layer, const kvcore::SeqStepPlan& plan, py::handle k,
              py::handle v) {
             const int l = p.checked_layer(layer);
             p.check_current_plan(l, plan);
             p.write(l, plan, k, v);
           },
           py::arg("layer"), py::arg("plan"), py::arg("k"), py::arg("v"),
           "Writes the step's rows: k (T, n_kv_heads, head_dim) and v (T, n_kv_heads, value_dim), "
           "C-contiguous, of the pool's dtype, go where `plan` (layer's plan of the begun step) "
           "says; input row j is position P + j (a tree step's: token j, written to the row of its "
           "chain_index). InvalidArgumentError: bad layer or arrays; "
           "InvalidStateError: a stale plan; AllocationError: growth failed. Nothing is written "
           "on any error.")
      .def("read",
           [](PyPool& p, const PyInt& layer, const kvcore::SeqStepPlan& plan, const std::string& order) {
             const ReadOrder o = parse_order(order);
             const int l = p.checked_layer(layer);
             p.check_current_plan(l, plan);
             return p.read_in(o, l, plan, p.cache()->active_step().id);
           },
           py::arg("layer"), py::arg("plan"), py::kw_only(), py::arg("order") = "rows",
           "(k, v, positions) of `plan`'s step after its rows were written. order='rows' (the "
           "default): every held row as it lies, one zero-copy read-only view, positions[r] the "
           "position row r stands for (mask with step.mask(layer)); order='positions': the plan's "
           "read in increasing positions, a view when it is one run, else a gathered copy. "
           "InvalidArgumentError: bad layer or order; InvalidStateError: a stale plan or rows not "
           "written yet. A quantized pool returns the rows dequantized into compute_dtype, in a "
           "workspace the next read of any layer reuses (copy what must outlive it).")
      .def("read_quantized",
           [](PyPool& p, const PyInt& layer, const kvcore::SeqStepPlan& plan) {
             const int l = p.checked_layer(layer);
             p.check_current_plan(l, plan);
             return p.read_quantized(l, plan, p.cache()->active_step().id);
           },
           py::arg("layer"), py::arg("plan"),
           "The raw quantized rows of `plan`'s step in row order (as read(order='rows')), zero-copy and "
           "read-only: a dict of k, v (int8 values for 'qint8'; uint8 bytes of float8 e4m3fn for "
           "'fp8_e4m3', view them with ml_dtypes.float8_e4m3fn), k_scales, v_scales (float32, (rows, "
           "n_kv_heads)), k_zero_points, v_zero_points (int8, (rows, n_kv_heads); None for fp8) and "
           "positions. InvalidArgumentError: bad layer, a pool that is not quantized; "
           "InvalidStateError: a stale plan or rows not written yet.")
      .def("update",
           [](PyPool& p, const PyInt& layer, const StepHandle& step, py::handle k, py::handle v,
              const std::string& order) {
             const ReadOrder o = parse_order(order);
             const int l = p.checked_layer(layer);
             const StepHandle& h = checked_step(p, step);
             const kvcore::SeqStepPlan plan = unwrap(h.cache->plan(l, h.step));
             p.write(l, plan, k, v);
             return p.read_in(o, l, plan, h.step.id);
           },
           py::arg("layer"), py::arg("step"), py::arg("k"), py::arg("v"), py::kw_only(),
           py::arg("order") = "rows",
           "write then read in one call, the per-layer hot path: writes k/v (T rows) for the "
           "begun `step` and returns (k, v, positions) as read(layer, plan, order=order). Errors "
           "as write and read; InvalidStateError: `step` is stale or of another cache. A tree step "
           "(begin_tree) writes token i to the row of its chain_index and its positions give each "
           "row's token position (length + depth); mask with step.mask(layer, order=order). A Shared "
           "layer is refused naming its source (update the source, then read the Shared layer: its "
           "source's rows); a State layer is refused (write_state, read_state).");
}

}  // namespace kvcore_py
