// KVPool: reference CPU storage for a SequenceCache's K/V rows and state slots.
// Its construction and sizes here; its rows (write, read, update):
// kv_pool_rows.cpp; its state slots: kv_pool_states.cpp; its records:
// kv_pool_records.cpp.
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

void register_kv_pool(py::module_& m) {
  py::class_<PyPool> cls(m, "KVPool",
                         "Reference CPU storage for a SequenceCache's K/V rows and state slots: applies plans.\n\n"
                         "A Shared layer stores nothing (read gives its source's rows); a State layer keeps "
                         "its D state slots of the named tensors state_tensors gives (read_state, write_state, "
                         "state_slots).\n\n"
                         "dtype: float32, float16, bfloat16 (from ml_dtypes; \"bfloat16\" also works), "
                         "int8 or uint8. Arrays are (T, n_kv_heads, head_dim) for K and (T, n_kv_heads, "
                         "value_dim) for V, C-contiguous, of exactly the pool's dtype.");
  cls.def(py::init([](std::shared_ptr<kvcore::SequenceCache> cache, py::object dtype,
                      bool mirror_rings, py::object compute_dtype, py::object state_tensors) {
            if (!cache) raise(kvcore::Error::InvalidArgument, "cache: must not be None");
            std::vector<kvcore::LayerPolicy::Kind> kinds;
            for (int l = 0; l < cache->n_layers(); ++l) kinds.push_back(unwrap(cache->layer_config(l)).policy.kind);
            const StateTensors states = StateTensors::parse(state_tensors, kinds);
            return new PyPool(std::move(cache), dtype, mirror_rings, compute_dtype, states);
          }),
          py::arg("cache"), py::arg("dtype") = py::module_::import("numpy").attr("float16"),
          py::kw_only(), py::arg("mirror_rings") = false, py::arg("compute_dtype") = py::none(),
          py::arg("state_tensors") = py::none(),
          "Storage for every layer of `cache` in `dtype` (float32, float16, \"bfloat16\" with "
          "ml_dtypes, int8, uint8). Construction gives every layer, flat or ring, "
          "min(config.initial_capacity, rows(layer)) rows; a layer's storage then doubles, up "
          "to rows(layer), when a write reaches further (reserve() grows it ahead). "
          "mirror_rings: see the property. dtype 'qint8' or 'fp8_e4m3' stores quantized rows "
          "(docs/quantized.md): values go in and come out as compute_dtype (float32 by default, "
          "float16 or \"bfloat16\"). A Shared layer stores nothing: reads answer from its source's rows. "
          "state_tensors: the named tensors of each State layer's state, {name: (shape, dtype)} for "
          "every State layer or {layer: {name: (shape, dtype)}} per layer (numeric numpy dtypes or "
          "\"bfloat16\"; each tensor 16-byte aligned in a slot); the pool keeps rows(layer) slots of "
          "them per State layer (docs/layer_kinds.md). InvalidArgumentError: another dtype or cache None, a "
          "compute_dtype other than those (or, for a plain dtype, other than it), state_tensors missing "
          "for a State layer, naming a layer that is not one, an empty name, a dim < 1, another dtype "
          "or a slot that overflows; AllocationError when memory runs out (at construction or on growth).");
  def_storage(cls, StorageDocs{
                       "The SequenceCache whose plans this pool applies (kept alive by it).",
                       "Storage format: the numpy dtype of every stored element, or 'qint8' / 'fp8_e4m3' "
                       "for quantized rows (docs/quantized.md).",
                       "numpy dtype that write/update take and read/update return (a plain pool's dtype; "
                       "float32, float16 or bfloat16 for a quantized one).",
                       "Number of layers, as the cache's.",
                       "Bytes of storage allocated now.",
                       "Rows `layer` has storage for now (it doubles up to rows(layer) when a write reaches "
                       "further). InvalidArgumentError: bad layer.",
                       "Grows `layer`'s storage now to at least `rows` rows, so later writes below it never "
                       "allocate. InvalidArgumentError: bad layer, rows outside [0, rows(layer)]; "
                       "AllocationError: the growth failed (nothing changed).",
                   });
  cls.def_property_readonly(
         "mirror_rings", [](const PyPool& p) { return p.mirror_rings(); },
         "True when wrapping ring layers keep a mirror of their first R - 1 rows, so every "
         "read without sinks is a zero-copy view.")
      .def_property_readonly(
          "nbytes", [](const PyPool& p) { return p.pool().used_bytes(p.cache()->length()); },
          "Bytes of the rows holding the cache's committed positions (a State layer's: min(length, D) "
          "slots; a Shared layer's: none).")
      .def("rows", [](const PyPool& p, const PyInt& layer) {
             return p.pool().layer(p.checked_layer(layer))->rows;
           }, py::arg("layer"),
           "Rows `layer` holds at most (the cache's rows(layer)). InvalidArgumentError: bad layer.");
  bind_kv_pool_rows(cls);
  bind_kv_pool_states(cls);
  cls
      .def("apply_copies", [](PyPool& p, py::handle copies) { p.apply_copies(copies); }, py::arg("copies"),
           "Performs a draft-tree commit's row copies: `copies` is what SequenceCache.commit(step, "
           "accepted) returned, one int (n, 2) array [src row, dst row] per layer (a State layer's: "
           "state slots), copied in order. "
           "Call it after the commit and before writing the next step. InvalidArgumentError: not one "
           "(n, 2) array per layer, or a row outside the layer; InvalidStateError: a row the tree step "
           "never wrote. Every layer is checked before anything is copied.")
      .def_static(
          "required_bytes",
          [](const kvcore::CacheConfig& config, py::object dtype, bool mirror_rings, py::object state_tensors) {
            throw_if_error(kvcore::validate(config));
            std::vector<kvcore::LayerPolicy::Kind> kinds;
            for (int l = 0; l < config.n_layers; ++l) kinds.push_back(config.layer(l).policy.kind);
            const StateTensors states = StateTensors::parse(state_tensors, kinds);
            return unwrap(kvcore::KVPool::required_bytes(config, parse_dtype(dtype).second,
                                                         ring_storage(mirror_rings), states.slot_bytes()));
          },
          py::arg("config"), py::arg("dtype"), py::kw_only(), py::arg("mirror_rings") = false,
          py::arg("state_tensors") = py::none(),
          "Bytes one arena must have for a pool of a cache built from `config` in `dtype`, as the "
          "C++ KVPool::in_arena takes them: every layer at its full rows(layer) for K and V (with "
          "mirror_rings, plus the R - 1 mirror rows of each wrapping ring layer without sinks), "
          "the layer table and each K and V block rounded up to 64 bytes, and 63 bytes of slack to "
          "align the start, so any address works; each State layer's D slots of its state_tensors "
          "(as KVPool takes them). Builds no pool. InvalidArgumentError: `config` "
          "breaks a CacheConfig rule, another dtype, bad state_tensors (as KVPool), or the total "
          "overflows the address space.")
      .def("__deepcopy__",
           [](const PyPool& p, py::dict memo) {
             // Its cache's copy (once per deepcopy, through memo), then every stored row.
             py::object cache = py::module_::import("copy").attr("deepcopy")(py::cast(p.cache()), memo);
             auto* copy = new PyPool(cache.cast<std::shared_ptr<kvcore::SequenceCache>>(), p.dtype_spec(),
                                     p.mirror_rings(), p.quantized() ? py::object(p.compute_dtype()) : py::object(py::none()),
                                     p.states());
             py::object owned = py::cast(copy, py::return_value_policy::take_ownership);
             for (int l = 0; l < p.pool().n_layers(); ++l) {
               const kvcore::PoolLayer from = unwrap(p.pool().layer(l));
               throw_if_error(copy->pool().reserve(l, from.allocated_rows));
               const kvcore::PoolLayer to = unwrap(copy->pool().layer(l));
               const std::size_t n = static_cast<std::size_t>(from.storage_rows());
               if (from.k_row_bytes * n != 0) std::memcpy(to.k, from.k, from.k_row_bytes * n);
               if (from.v_row_bytes * n != 0) std::memcpy(to.v, from.v, from.v_row_bytes * n);  // a State layer has no V
             }
             return owned;
           },
           py::arg("memo"),
           "An independent pool holding a copy of every row and state slot, over a deep copy of its cache "
           "(shared with other objects of the same deepcopy). AllocationError when it cannot be "
           "allocated.");
  bind_kv_pool_records(cls);
  cls
      .def("__repr__", [](const PyPool& p) {
        return "KVPool(n_layers=" + std::to_string(p.pool().n_layers()) +
               ", dtype=" + (p.quantized() ? py::str(p.dtype()).cast<std::string>()
                                           : p.dtype().attr("name").cast<std::string>()) +
               (p.quantized() ? ", compute_dtype=" + p.compute_dtype().attr("name").cast<std::string>() : "") +
               (p.mirror_rings() ? ", mirror_rings=True" : "") +
               ", reserved_bytes=" + std::to_string(p.pool().reserved_bytes()) + state_bytes(p) + ")";
      });
}

}  // namespace kvcore_py
