// CacheConfig: model facts and per-layer policies, validated on construction.
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "bindings.h"
#include "config_repr.h"
#include "errors.h"
#include "kvcore/core/config.h"

namespace kvcore_py {

// Mirrors the constructor call, so the repr reads as the config it is (beside
// config_repr.h's reprs of its parts).
static std::string repr(const kvcore::CacheConfig& c) {
  std::string layers;
  if (c.layers.size() == 1) {
    layers = repr(c.layers.front());
  } else {
    layers = "[";
    for (std::size_t i = 0; i < c.layers.size(); ++i) layers += (i ? ", " : "") + repr(c.layers[i]);
    layers += "]";
  }
  std::string s = "CacheConfig(capacity=" + std::to_string(c.capacity) + ", layers=" + layers +
                  ", n_layers=" + std::to_string(c.n_layers) +
                  ", max_step=" + std::to_string(c.max_step);
  if (c.initial_capacity != 512) s += ", initial_capacity=" + std::to_string(c.initial_capacity);
  const kvcore::BatchLimits d;
  const kvcore::BatchLimits& b = c.batch;
  if (b.block_size != d.block_size || b.max_seqs != d.max_seqs || b.max_step_tokens != d.max_step_tokens ||
      b.num_blocks != d.num_blocks || b.max_holes != d.max_holes || b.max_active_seqs != d.max_active_seqs ||
      b.state_snapshots != d.state_snapshots || b.page_layers != d.page_layers || b.max_rewind != d.max_rewind ||
      b.states_in_pool != d.states_in_pool || b.table_page_blocks != d.table_page_blocks ||
      b.table_pages != d.table_pages || b.state_block_size != d.state_block_size)
    s += ", batch=" + repr(b);
  return s + ")";
}

using LayersArg = std::variant<kvcore::LayerConfig, std::vector<kvcore::LayerConfig>>;

void register_cache_config(py::module_& m) {
  py::class_<kvcore::CacheConfig> cache_config(m, "CacheConfig", "Model facts and per-layer policies, validated on construction.");
  copyable_value(cache_config);
  cache_config
      // Typed arguments: a wrong type is a TypeError naming the signature.
      .def(py::init([](const PyInt& capacity, const LayersArg& layers,
                       const std::optional<PyInt>& n_layers, const std::optional<PyInt>& max_step,
                       const PyInt& initial_capacity, const kvcore::BatchLimits& batch) {
             kvcore::CacheConfig cfg;
             cfg.capacity = to_int("capacity", capacity);
             if (const auto* one = std::get_if<kvcore::LayerConfig>(&layers)) {
               cfg.layers = {*one};
             } else {
               cfg.layers = std::get<std::vector<kvcore::LayerConfig>>(layers);
             }
             if (n_layers) {
               cfg.n_layers = to_int("n_layers", *n_layers);
             } else {
               if (cfg.layers.empty())
                 raise(kvcore::Error::InvalidArgument,
                       "layers is empty: give one LayerConfig (broadcast) or one per layer");
               cfg.n_layers = static_cast<int>(cfg.layers.size());
             }
             if (max_step) {
               cfg.max_step = to_int("max_step", *max_step);
               if (cfg.max_step < 1)
                 raise(kvcore::Error::InvalidArgument,
                       "max_step = " + std::to_string(cfg.max_step) + ": must be >= 1");
             }
             cfg.initial_capacity = to_int("initial_capacity", initial_capacity);
             cfg.batch = batch;
             throw_if_error(kvcore::validate(cfg));
             cfg.max_step = cfg.effective_max_step();
             return cfg;
           }),
           py::arg("capacity"), py::arg("layers"), py::kw_only(), py::arg("n_layers") = py::none(),
           py::arg("max_step") = py::none(), py::arg("initial_capacity") = 512,
           py::arg("batch") = kvcore::BatchLimits(),
           "capacity: largest logical length (positions). layers: one LayerConfig for every layer "
           "or one per layer. n_layers: defaults to len(layers). max_step: largest T of one step "
           "(default min(512, capacity)). initial_capacity: rows a byte layer allocates per layer "
           "before growing. batch: the limits of a BatchCache built from it. Validated here: "
           "InvalidArgumentError naming the field and the rule.")
      .def_readonly("capacity", &kvcore::CacheConfig::capacity, "Largest logical length (positions 0..capacity-1).")
      .def_readonly("n_layers", &kvcore::CacheConfig::n_layers, "Number of layers.")
      .def_readonly("max_step", &kvcore::CacheConfig::max_step, "Largest T (tokens) of one step, default applied.")
      .def_readonly("initial_capacity", &kvcore::CacheConfig::initial_capacity,
                    "Rows a byte layer (KVPool) allocates per flat layer before growing lazily.")
      .def_readonly("batch", &kvcore::CacheConfig::batch,
                    "The limits a many-sequence cache (BatchCache) built from it has.")
      .def_property_readonly("layers",
                             [](const kvcore::CacheConfig& c) {
                               py::list out;
                               for (int l = 0; l < c.n_layers; ++l) out.append(c.layer(l));
                               return py::tuple(out);
                             },
                             "One LayerConfig per layer (a broadcast config repeated).")
      .def("__repr__", [](const kvcore::CacheConfig& c) { return repr(c); });
}

}  // namespace kvcore_py
