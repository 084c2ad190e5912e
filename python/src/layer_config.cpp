// LayerConfig: one layer's policy and K/V row shape, checked on construction.
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

void register_layer_config(py::module_& m) {
  py::class_<kvcore::LayerConfig> layer_config(m, "LayerConfig", "One layer's policy and K/V row shape.");
  copyable_value(layer_config);
  layer_config
      .def(py::init([](const kvcore::LayerPolicy& policy, const PyInt& n_kv_heads,
                       const PyInt& head_dim, const PyInt& v_head_dim) {
             kvcore::LayerConfig l;
             l.policy = policy;
             l.n_kv_heads = to_int("n_kv_heads", n_kv_heads);
             l.head_dim = to_int("head_dim", head_dim);
             l.v_head_dim = to_int("v_head_dim", v_head_dim);
             // Check the layer alone now, so the error points at this line; the
             // message names the field as the caller wrote it ("head_dim", not
             // "layers[0].head_dim"). A Shared layer is checked behind a source of
             // its own shape: its real source is checked by CacheConfig.
             kvcore::CacheConfig probe;
             probe.capacity = 1;
             const bool shared = policy.kind == kvcore::LayerPolicy::Kind::Shared;
             kvcore::LayerConfig alone = l;
             if (shared) alone.policy = kvcore::LayerPolicy::shared(0);
             probe.layers = shared ? std::vector<kvcore::LayerConfig>{kvcore::LayerConfig{kvcore::LayerPolicy::flat(), l.n_kv_heads, l.head_dim, l.v_head_dim}, alone}
                                   : std::vector<kvcore::LayerConfig>{alone};
             probe.n_layers = static_cast<int>(probe.layers.size());
             kvcore::Status status = kvcore::validate_layer(probe, 0);
             if (status.ok() && shared) status = kvcore::validate_layer(probe, 1);
             if (!status.ok()) {
               std::string message = status.message().c_str();
               for (const std::string prefix : {"layers[0].", "layers[1].", "layers[0]: ", "layers[1]: "})
                 if (message.compare(0, prefix.size(), prefix) == 0) message.erase(0, prefix.size());
               raise(status.code(), message);
             }
             return l;
           }),
           py::arg("policy"), py::arg("n_kv_heads") = 0, py::arg("head_dim") = 0, py::arg("v_head_dim") = 0,
           "policy: Flat(), Ring(...), Chunked(...), Shared(...) or State(...). A K row is "
           "n_kv_heads x head_dim elements, a V row n_kv_heads x v_head_dim (0: head_dim). A "
           "State layer holds no K/V rows: leave the three at 0. InvalidArgumentError naming the "
           "field when a count is below 1 (v_head_dim: below 0), or nonzero on a State layer.")
      .def_readonly("policy", &kvcore::LayerConfig::policy, "Flat(), Ring(...), Chunked(...), Shared(...) or State(...).")
      .def_readonly("n_kv_heads", &kvcore::LayerConfig::n_kv_heads, "K/V heads per row.")
      .def_readonly("head_dim", &kvcore::LayerConfig::head_dim, "Elements per head of a K row.")
      .def_readonly("v_head_dim", &kvcore::LayerConfig::v_head_dim,
                    "Elements per head of a V row as given; 0 means head_dim (see value_dim).")
      .def_property_readonly("value_dim", &kvcore::LayerConfig::value_dim,
                             "Elements per head of a V row: v_head_dim, or head_dim when it is 0.")
      .def("__eq__",
           [](const kvcore::LayerConfig& a, const kvcore::LayerConfig& b) {
             return a.policy == b.policy && a.n_kv_heads == b.n_kv_heads &&
                    a.head_dim == b.head_dim && a.value_dim() == b.value_dim();
           },
           py::is_operator())
      .def("__repr__", [](const kvcore::LayerConfig& l) { return repr(l); });
}

}  // namespace kvcore_py
