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
  kvcore_py::register_config(m);
  kvcore_py::register_cache(m);
  kvcore_py::register_pool(m);
  kvcore_py::register_tree(m);
  kvcore_py::register_batch(m);
  kvcore_py::register_paged_pool(m);
  kvcore_py::register_registry(m);
  kvcore_py::register_row_copy(m);
  kvcore_py::guard_uninitialized(m);
}
