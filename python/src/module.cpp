// kvcore._core: the compiled half of the kvcore package.
#include "bindings.h"
#include "kvcore/version.h"

namespace kvcore_py {
void register_row_copy(py::module_& m);  // _copy_rows: torch_pool's CPU write path (row_copy.cpp)
}  // namespace kvcore_py

PYBIND11_MODULE(_core, m) {
  m.doc() = "kvcore's C++ core (use the kvcore package, not this module).";
  m.attr("__version__") = KVCORE_VERSION;
  kvcore_py::register_errors(m);
  // Config values.
  kvcore_py::register_layer_policy(m);
  kvcore_py::register_layer_config(m);
  kvcore_py::register_batch_limits(m);
  kvcore_py::register_cache_config(m);
  // SequenceCache, its steps and plans.
  kvcore_py::register_seq_step_plan(m);
  kvcore_py::register_layer_geometry(m);
  kvcore_py::register_cache_base(m);
  kvcore_py::register_step(m);
  kvcore_py::register_sequence_cache(m);
  // KVPool, records, and the masks and draft trees of a Step.
  kvcore_py::register_kv_pool(m);
  kvcore_py::register_records(m);
  kvcore_py::register_step_mask(m);
  kvcore_py::register_tree(m);
  // BatchCache, its steps and plans, and PagedKVPool.
  kvcore_py::register_batch_sequence_info(m);
  kvcore_py::register_group_plan(m);
  kvcore_py::register_state_group_plan(m);
  kvcore_py::register_batch_step_plan(m);
  kvcore_py::register_batch_step(m);
  kvcore_py::register_batch_cache(m);
  kvcore_py::register_paged_kv_pool(m);
  kvcore_py::register_registry(m);
  kvcore_py::register_row_copy(m);
  kvcore_py::guard_uninitialized(m);
}
