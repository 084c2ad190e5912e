// One registration function per class (or small family of one concept) of the
// Python module, called in this order by module.cpp.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "kvcore/core/config.h"
#include "kvcore/core/sequence_cache.h"
#include "cache_cast.h"  // before any cast of a CacheBase: RTTI-free caches

namespace kvcore_py {

namespace py = pybind11;

void register_errors(py::module_& m);

// Config values (layer_policy.cpp, layer_config.cpp, batch_limits.cpp, cache_config.cpp).
void register_layer_policy(py::module_& m);  // LayerPolicy, its Kind, and Flat, Ring, Chunked, Shared, State
void register_layer_config(py::module_& m);
void register_batch_limits(py::module_& m);
void register_cache_config(py::module_& m);

// SequenceCache and its steps (seq_step_plan.cpp, layer_geometry.cpp, sequence_cache.cpp, step.cpp).
void register_seq_step_plan(py::module_& m);  // Run and SeqStepPlan
void register_layer_geometry(py::module_& m);
void register_cache_base(py::module_& m);
void register_step(py::module_& m);
void register_sequence_cache(py::module_& m);

// KVPool (kv_pool*.cpp), records (records.cpp) and Step.mask (step_mask.cpp).
void register_kv_pool(py::module_& m);
void register_records(py::module_& m);     // check_record, seal_record
void register_step_mask(py::module_& m);   // after register_step: adds Step.mask
void register_tree(py::module_& m);        // after register_kv_pool: draft trees on Step and SequenceCache

// BatchCache, its steps and their plans (batch_*.cpp, group_plan.cpp, state_group_plan.cpp).
void register_batch_sequence_info(py::module_& m);  // SequenceInfo
void register_group_plan(py::module_& m);
void register_state_group_plan(py::module_& m);
void register_batch_step_plan(py::module_& m);
void register_batch_step(py::module_& m);
void register_batch_cache(py::module_& m);  // after register_cache_base: BatchCache derives CacheBase

void register_paged_kv_pool(py::module_& m);  // after register_batch_cache: takes BatchCache and BatchStep
void register_registry(py::module_& m);  // registries, builders, the capsule
void guard_uninitialized(py::module_& m);  // last: covers every class registered before

std::string repr_policy(const kvcore::LayerPolicy& p);

/// The SequenceCache class; sequence_cache_steps.cpp adds its step verbs.
using SequenceCacheClass =
    py::class_<kvcore::SequenceCache, kvcore::CacheBase, std::shared_ptr<kvcore::SequenceCache>>;
void bind_sequence_cache_steps(SequenceCacheClass& cls);

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
