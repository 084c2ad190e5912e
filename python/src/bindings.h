// One registration function per area of the Python module.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "kvcore/core/config.h"
#include "kvcore/core/sequence_cache.h"
#include "cache_cast.h"  // before any cast of a CacheBase: RTTI-free caches

namespace kvcore_py {

namespace py = pybind11;

void register_errors(py::module_& m);
void register_config(py::module_& m);
void register_cache(py::module_& m);
void register_pool(py::module_& m);  // after register_cache: adds Step.mask
void register_tree(py::module_& m);  // after register_pool: draft trees on Step and SequenceCache
void register_batch(py::module_& m);  // after register_cache: BatchCache derives CacheBase
void register_paged_pool(py::module_& m);  // after register_batch: takes BatchCache and BatchStep
void register_registry(py::module_& m);  // registries, builders, the capsule
void guard_uninitialized(py::module_& m);  // last: covers every class registered before

std::string repr_policy(const kvcore::LayerPolicy& p);

/// copy.copy / copy.deepcopy for an immutable value type: a copy of the value.
template <typename T, typename... Extra>
void copyable_value(py::class_<T, Extra...>& cls) {
  cls.def("__copy__", [](const T& self) { return T(self); }, "A copy of the value (it is immutable).");
  cls.def("__deepcopy__", [](const T& self, py::dict) { return T(self); }, py::arg("memo"),
          "A copy of the value (it is immutable).");
}
/// The config a cache was built from (max_step resolved, one entry per layer).
kvcore::CacheConfig config_of(const kvcore::SequenceCache& cache);

}  // namespace kvcore_py
