// PagedKVPool: the byte layer of a BatchCache. Its construction, rows, masks
// and gathers here; its state slots: paged_kv_pool_states.cpp; its records:
// paged_kv_pool_records.cpp.
#include <pybind11/numpy.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "batch_step_handle.h"
#include "deprecated.h"
#include "errors.h"
#include "int_args.h"
#include "kvcore/state/sequence_export.h"
#include "kvcore/state/sequence_import.h"
#include "numpy_dtype.h"
#include "py_paged_kv_pool.h"
#include "prefix_namespace.h"
#include "record_io.h"
#include "state_tensors.h"

namespace kvcore_py {

void register_paged_kv_pool(py::module_& m) {
  py::class_<PyPagedPool> cls(
      m, "PagedKVPool",
      "Reference CPU storage for a BatchCache's K/V rows and state slots: each layer holds its group's "
      "block pool (num_blocks * block_size rows of n_kv_heads x dim elements), grown by doubling as steps "
      "reach further. update() performs a step's block copies and writes its new rows; attention reads the "
      "live rows with mask(), or one sequence's history with gather(). A Shared layer stores nothing "
      "(rows and gather give its source's rows); a State layer keeps its State group's num_state_slots "
      "physical slots of the named tensors state_tensors gives (write_state, read_state, "
      "state_slots).\n\n"
      "dtype: float32, float16, bfloat16 (from ml_dtypes; \"bfloat16\" also works), int8 or uint8. "
      "Arrays are (n_tokens, n_kv_heads, head_dim) for K and (n_tokens, n_kv_heads, value_dim) for V, "
      "C-contiguous, of exactly the pool's dtype.");
  cls.def(py::init([](CachePtr cache, py::object dtype, const PyInt& initial_rows, py::object compute_dtype,
                      py::object state_tensors) {
            if (!cache) raise(kvcore::Error::InvalidArgument, "cache: must not be None");
            const StateTensors states = StateTensors::parse(state_tensors, kinds_of(*cache));
            return new PyPagedPool(std::move(cache), dtype, to_int("initial_rows", initial_rows), compute_dtype,
                                   states);
          }),
          py::arg("cache"), py::arg("dtype") = py::module_::import("numpy").attr("float16"), py::kw_only(),
          py::arg("initial_rows") = kvcore::PagedKVPool::kDefaultInitialRows, py::arg("compute_dtype") = py::none(),
          py::arg("state_tensors") = py::none(),
          "PagedKVPool(cache, dtype=numpy.float16, *, initial_rows=256, compute_dtype=None, "
          "state_tensors=None): storage for `cache` in `dtype` "
          "(float32, float16, 'bfloat16' via ml_dtypes, int8, uint8); each layer starts with "
          "min(initial_rows, its rows) rows. dtype 'qint8' or 'fp8_e4m3' stores quantized rows "
          "(docs/quantized.md): update takes values of compute_dtype (float32 by default, float16 or "
          "'bfloat16') and rows/gather return them dequantized. A Shared layer stores nothing: its reads "
          "answer from its source's rows. state_tensors: the named tensors of each State layer's state, "
          "{name: (shape, dtype)} for every State layer or {layer: {name: (shape, dtype)}} per layer "
          "(numeric numpy dtypes or \"bfloat16\"; each tensor 16-byte aligned in a slot), as KVPool "
          "takes them; the pool keeps cache.num_state_slots(cache.state_group_of(layer)) slots of them per "
          "State layer, allocated (zeros) now. InvalidArgumentError: bad dtype, compute_dtype or "
          "initial_rows < 0; state_tensors missing for a State layer, naming a layer that is not one, an "
          "empty name, a dim < 1, another dtype or a slot that overflows. "
          "NotSupportedError: a cache whose states live in the pool's pages (BatchLimits.states_in_pool). "
          "AllocationError: the first blocks or the state slots cannot be allocated.");
  def_storage(cls, StorageDocs{
                       "The BatchCache it stores.",
                       "Storage format: the numpy dtype of every K/V element, or 'qint8' / 'fp8_e4m3' for "
                       "quantized rows (docs/quantized.md).",
                       "numpy dtype update takes and rows/gather return (a plain pool's dtype; float32, "
                       "float16 or bfloat16 for a quantized one).",
                       "Number of layers the pool stores, as the cache's (cache.n_layers); each holds its "
                       "group's blocks (a Shared layer none, a State layer its state slots).",
                       "Bytes of storage allocated now (K and V, every layer).",
                       "Rows of the layer backed by storage now (at most num_blocks(group) * block_size). "
                       "InvalidArgumentError: bad layer.",
                       "Grows the layer now to at least `rows` rows, so later updates below it never allocate. "
                       "InvalidArgumentError: bad layer, rows outside [0, num_blocks * block_size]. "
                       "AllocationError: growth failed (nothing changed).",
                   });
  cls.def_property_readonly("nbytes", &PyPagedPool::nbytes,
                            "Bytes (K and V, every layer) of the rows in blocks some sequence holds now: "
                            "held_blocks(group) * block_size rows per layer of the group (a Shared layer's "
                            "none), plus every State layer's state slots (always stored).")
      .def(
          "update",
          [](PyPagedPool& p, const PyInt& layer, const BatchStepHandle& step, py::handle k, py::handle v) {
            const int l = p.checked_layer(layer);
            return p.update(l, p.plan_of(step), k, v);
          },
          py::arg("layer"), py::arg("step"), py::arg("k"), py::arg("v"),
          "update(layer, step, k, v) -> (k_rows, v_rows): performs the layer's block copies of the begun "
          "step (copy-on-write), writes the step's new rows (k: (n_tokens, n_kv_heads, head_dim), v: "
          "(n_tokens, n_kv_heads, value_dim), C-contiguous, the pool's dtype; token t to its slot), and "
          "returns read-only zero-copy views of the layer's live rows, (used_blocks * block_size, "
          "n_kv_heads, dim): attend over them with mask(step, group). Views keep their storage alive. "
          "InvalidArgumentError: bad layer or array (nothing written); a Shared layer (it writes nothing: "
          "update its source, named in the message, then read the Shared layer with rows or gather); a "
          "State layer (write_state). InvalidStateError: a stale step, "
          "or a step of another cache. AllocationError: growth failed (nothing written).")
      .def("apply_copies", &PyPagedPool::apply_copies, py::arg("copies"),
           "apply_copies(copies): performs a draft-tree commit's copies in every layer, copies being "
           "what cache.commit(step, accepted) returned: one (n, 2) int array of (src, dst) rows per group, "
           "then one of (src, dst) physical state slots per State group (n_groups + n_state_groups arrays), "
           "each performed in order in every layer of its group (a Shared layer's rows are its source's). "
           "Call it once per commit, before the next step's update(). InvalidArgumentError "
           "(nothing copied): not one (n, 2) array per group and State group, a row outside a layer's "
           "stored rows, a slot outside [0, num_state_slots).")
      .def("apply_commit",
           [](PyPagedPool& p, const py::handle& copies) {
             warn_deprecated("PagedKVPool.apply_commit", "PagedKVPool.apply_copies");
             p.apply_copies(copies);
           },
           py::arg("copies"),
           "Deprecated alias of apply_copies (removed in kvcore 0.2.0): performs a draft-tree commit's "
           "copies. Warns DeprecationWarning; errors as apply_copies.");
  bind_paged_kv_pool_states(cls);
  cls
      .def(
          "rows",
          [](PyPagedPool& p, const PyInt& layer) { return p.rows(p.checked_layer(layer)); },
          py::arg("layer"),
          "rows(layer) -> (k_rows, v_rows): the views update() returns, without writing (a quantized "
          "pool's: the live rows dequantized into a workspace the next read reuses); a Shared layer's are "
          "its source's rows. InvalidArgumentError: bad layer, a State layer (state_slots). InvalidStateError: the live rows are not all stored yet "
          "(update the layer for the begun step first).")
      .def(
          "rows_quantized",
          [](const PyPagedPool& p, const PyInt& layer) { return p.rows_quantized(p.checked_layer(layer)); },
          py::arg("layer"),
          "The raw quantized live rows, zero-copy and read-only: a dict of k, v (int8 values for 'qint8'; "
          "uint8 bytes of float8 e4m3fn for 'fp8_e4m3'), k_scales, v_scales (float32, (rows, n_kv_heads)), "
          "k_zero_points, v_zero_points (int8; None for fp8). InvalidArgumentError: bad layer, a pool "
          "that is not quantized. InvalidStateError: the live rows are not all stored yet.")
      .def(
          "mask",
          [](PyPagedPool& p, const BatchStepHandle& step, const PyInt& group) {
            const kvcore::BatchStepPlan plan = p.plan_of(step);
            return p.mask(step, plan, to_int("group", group));
          },
          py::arg("step"), py::arg("group"),
          "mask(step, group) -> bool (n_tokens, used_blocks * block_size): mask[t, r] is True when the "
          "step's token t may see the key in row r of the group's layers (its own sequence's, by the "
          "visibility rule, not removed): the columns of update()'s rows. Read-only, built once per group "
          "and step and shared by the group's layers (step.plan().mask(group) gives a new one). "
          "InvalidArgumentError: bad group. InvalidStateError: a stale step or another cache's.")
      .def(
          "gather",
          [](const PyPagedPool& p, const PyInt& layer, const BatchStepHandle& step, const PyInt& entry) {
            const int l = p.checked_layer(layer);
            return p.gather(l, p.plan_of(step), to_int("entry", entry));
          },
          py::arg("layer"), py::arg("step"), py::arg("entry"),
          "gather(layer, step, entry) -> (k, v, positions): the history entry `entry` of the step sees on "
          "this layer (every position below its context length that one of its queries sees: the sinks and "
          "the first query's window on a ring, all kept positions when flat; removed ones skipped), in "
          "increasing positions, as new contiguous arrays (n, n_kv_heads, dim) and int64 (n,); a Shared "
          "layer's are its source's. Call it after update(). InvalidArgumentError: bad layer or entry, a "
          "State layer (read_state). InvalidStateError: a stale step, or "
          "the layer not updated for it yet.")
      .def_static(
          "required_bytes",
          [](const CachePtr& cache, py::object dtype, py::object state_tensors) {
            if (!cache) raise(kvcore::Error::InvalidArgument, "cache: must not be None");
            const StateTensors states = StateTensors::parse(state_tensors, kinds_of(*cache));
            return unwrap(kvcore::PagedKVPool::required_bytes(*cache, parse_dtype(dtype).second, states.slot_bytes()));
          },
          py::arg("cache"), py::arg("dtype"), py::kw_only(), py::arg("state_tensors") = py::none(),
          "Bytes a pool of `cache`'s layers in `dtype` holds at most (every block of every layer and every "
          "State layer's slots of its state_tensors, as the C++ arena mode takes them, alignment slack "
          "included). InvalidArgumentError: bad dtype, bad state_tensors (as PagedKVPool).");
  bind_paged_kv_pool_records(cls);
  cls
      .def("__repr__", [](const PyPagedPool& p) {
        return "PagedKVPool(n_layers=" + std::to_string(p.pool().n_layers()) +
               ", dtype=" + (p.quantized() ? py::str(p.dtype()).cast<std::string>()
                                           : p.dtype().attr("name").cast<std::string>()) +
               ", block_size=" + std::to_string(p.pool().block_size()) +
               ", reserved_bytes=" + std::to_string(p.pool().reserved_bytes()) + ")";
      });
}

}  // namespace kvcore_py
