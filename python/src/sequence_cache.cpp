// SequenceCache: one sequence's cache, its construction, sizes and layers (its
// steps and rewinds: sequence_cache_steps.cpp; draft trees: tree.cpp), and
// CacheBase, the class every cache a registry holds derives.
#include <pybind11/stl.h>

#include <memory>
#include <string>

#include "bindings.h"
#include "deprecated.h"
#include "errors.h"
#include "kvcore/core/sequence_cache.h"
#include "step_handle.h"

namespace kvcore_py {

kvcore::CacheConfig config_of(const kvcore::SequenceCache& cache) {
  kvcore::CacheConfig cfg;
  cfg.capacity = cache.capacity();
  cfg.n_layers = cache.n_layers();
  cfg.max_step = cache.max_step();
  cfg.initial_capacity = cache.initial_capacity();
  for (int l = 0; l < cache.n_layers(); ++l) cfg.layers.push_back(unwrap(cache.layer_config(l)));
  return cfg;
}

void register_cache_base(py::module_& m) {
  py::class_<kvcore::CacheBase, std::shared_ptr<kvcore::CacheBase>>(
      m, "CacheBase",
      "Any cache a registry can hold. A cache made by C++ code without RTTI reaches Python as "
      "this class; kvcore's own come as SequenceCache or BatchCache.");
}

void register_sequence_cache(py::module_& m) {
  SequenceCacheClass cls(
      m, "SequenceCache",
      "One sequence's cache: one logical length over flat (full history), ring (sliding "
      "window, optional sinks), chunked (attention within chunks), shared (another layer's "
      "K/V) and state (recurrent state snapshots) layers. It plans each step with integers: where the step's K/V "
      "rows go and which rows each query reads (a byte layer such as KVPool applies the plans). "
      "Positions are token indices from 0; a step adds T tokens at positions length .. "
      "length + T - 1. A failing call raises and changes nothing.");
  cls
      .def(py::init([](const kvcore::CacheConfig& cfg) {
             return std::shared_ptr<kvcore::SequenceCache>(unwrap(kvcore::SequenceCache::create(cfg)));
           }),
           py::arg("config"),
           "Builds the cache (identical layer policies share one policy object). AllocationError "
           "when its tables cannot be allocated.")
      .def_property_readonly("length", &kvcore::SequenceCache::length,
                             "Committed length L: positions [0, L) hold K/V.")
      .def_property_readonly("capacity", &kvcore::SequenceCache::capacity,
                             "Largest allowed length (positions 0 .. capacity - 1).")
      .def_property_readonly("max_step", &kvcore::SequenceCache::max_step,
                             "Largest T of one step (C).")
      .def_property_readonly("n_layers", &kvcore::SequenceCache::n_layers, "Layers.")
      .def_property_readonly("n_groups", &kvcore::SequenceCache::n_groups,
                             "Groups: layers with identical policies share one policy object and "
                             "plan alike (every layer has a group, a State or Shared one too).")
      .def_property_readonly(
          "n_policies",
          [](const kvcore::SequenceCache& c) {
            warn_deprecated("SequenceCache.n_policies", "SequenceCache.n_groups");
            return c.n_groups();
          },
          "Deprecated alias of n_groups (removed in kvcore 0.2.0): groups, layers with identical "
          "policies sharing one policy object. Warns DeprecationWarning.")
      .def_property_readonly("config", &config_of,
                             "The CacheConfig it was built from (max_step resolved, one entry per "
                             "layer), a new object.")
      .def("group_of",
           [](const kvcore::SequenceCache& c, const PyInt& layer) {
             const int l = to_int("layer", layer);
             throw_if_error(kvcore::internal::to_status(c.rows(l)));
             return c.group_of(l);
           },
           py::arg("layer"),
           "The group of `layer`, in [0, n_groups): layers of one group share one policy object "
           "and plan alike. InvalidArgumentError: bad layer.")
      .def("policy_index",
           [](const kvcore::SequenceCache& c, const PyInt& layer) {
             warn_deprecated("SequenceCache.policy_index", "SequenceCache.group_of");
             const int l = to_int("layer", layer);
             throw_if_error(kvcore::internal::to_status(c.rows(l)));
             return c.group_of(l);
           },
           py::arg("layer"),
           "Deprecated alias of group_of (removed in kvcore 0.2.0): the group of `layer`. Warns "
           "DeprecationWarning; InvalidArgumentError: bad layer.")
      .def("rows",
           [](const kvcore::SequenceCache& c, const PyInt& layer) { return unwrap(c.rows(to_int("layer", layer))); },
           py::arg("layer"),
           "Rows a byte layer holds for `layer`: capacity for a flat layer, min(capacity, sinks + "
           "window + max_step - 1) for a ring, min(capacity, chunk + max_step - 1) for a chunked "
           "layer, 0 for a shared layer, slots (state snapshots) for a state layer. "
           "InvalidArgumentError: bad layer.")
      .def("geometry",
           [](const kvcore::SequenceCache& c, const PyInt& layer) {
             return unwrap(c.geometry(to_int("layer", layer)));
           },
           py::arg("layer"),
           "The LayerGeometry of `layer`: how its positions map onto its rows. "
           "InvalidArgumentError: bad layer.")
      .def("can_extend",
           [](const kvcore::SequenceCache& c, const PyInt& n) {
             int v = 0;
             return fits_int(n, &v) && c.can_extend(v);
           },
           py::arg("n") = 1, "True when n >= 0 and length + n <= capacity. Never raises.");
  bind_sequence_cache_steps(cls);
  cls
      .def("visible",
           [](const kvcore::SequenceCache& c, const PyInt& layer, const PyInt& q, const PyInt& k) {
             return unwrap(c.visible(to_int("layer", layer), to_int("q", q), to_int("k", k)));
           },
           py::arg("layer"), py::arg("q"), py::arg("k"),
           "May a query at position q see the key at k on `layer`? (k <= q; on a ring also "
           "q - k < window or k < sinks; on a chunked layer k // chunk == q // chunk; a shared "
           "layer answers as its source; a state layer has no keys: False.) "
           "InvalidArgumentError: bad layer, q or k < 0.")
      .def("layer_policy",
           [](const kvcore::SequenceCache& c, const PyInt& layer) {
             const int l = to_int("layer", layer);
             throw_if_error(kvcore::internal::to_status(c.rows(l)));
             return unwrap(c.layer_config(l)).policy;
           },
           py::arg("layer"), "The LayerPolicy of `layer`. InvalidArgumentError: bad layer.")
      .def("__copy__", [](const kvcore::SequenceCache& c) { return std::shared_ptr<kvcore::SequenceCache>(unwrap(c.clone())); },
           "An independent cache in the same state (copy.copy and copy.deepcopy alike): it "
           "continues exactly as this one would. AllocationError when it cannot be allocated.")
      .def("__deepcopy__",
           [](const std::shared_ptr<kvcore::SequenceCache>& c, py::dict memo) {
             py::object copy = py::cast(std::shared_ptr<kvcore::SequenceCache>(unwrap(c->clone())));
             memo[py::int_(reinterpret_cast<std::uintptr_t>(py::cast(c).ptr()))] = copy;
             return copy;
           },
           py::arg("memo"), "As __copy__; registered in `memo`, so objects sharing this cache share the copy.")
      .def("__repr__", [](const kvcore::SequenceCache& c) {
        return "SequenceCache(length=" + std::to_string(c.length()) +
               ", capacity=" + std::to_string(c.capacity()) +
               ", max_step=" + std::to_string(c.max_step()) +
               ", n_layers=" + std::to_string(c.n_layers()) + ")";
      });
}

}  // namespace kvcore_py
