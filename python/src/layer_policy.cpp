// LayerPolicy and its factories Flat, Ring, Chunked, Shared and State.
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "bindings.h"
#include "errors.h"
#include "kvcore/core/config.h"

namespace kvcore_py {

namespace {

kvcore::LayerPolicy make_ring(const PyInt& window, const PyInt& sinks) {
  kvcore::LayerPolicy p = kvcore::LayerPolicy::ring(to_int("window", window), to_int("sinks", sinks));
  if (p.window < 1)
    raise(kvcore::Error::InvalidArgument,
          "window = " + std::to_string(p.window) + ": a Ring layer needs window >= 1");
  if (p.sinks < 0)
    raise(kvcore::Error::InvalidArgument,
          "sinks = " + std::to_string(p.sinks) + ": a Ring layer needs sinks >= 0");
  return p;
}

// One positive field of a policy factory, checked as the config would.
int positive(const char* kind, const char* field, const PyInt& value) {
  const int v = to_int(field, value);
  if (v < 1)
    raise(kvcore::Error::InvalidArgument,
          std::string(field) + " = " + std::to_string(v) + ": a " + kind + " layer needs " + field + " >= 1");
  return v;
}

}  // namespace

std::string repr_policy(const kvcore::LayerPolicy& p) {
  using Kind = kvcore::LayerPolicy::Kind;
  switch (p.kind) {
    case Kind::Flat: return "Flat()";
    case Kind::Ring: return "Ring(window=" + std::to_string(p.window) + ", sinks=" + std::to_string(p.sinks) + ")";
    case Kind::Chunked: return "Chunked(chunk=" + std::to_string(p.window) + ")";
    case Kind::Shared: return "Shared(source=" + std::to_string(p.source) + ")";
    case Kind::State: return "State(slots=" + std::to_string(p.slots) + ")";
  }
  return "LayerPolicy(kind=" + std::to_string(static_cast<int>(p.kind)) + ")";
}

void register_layer_policy(py::module_& m) {
  py::class_<kvcore::LayerPolicy> policy(
      m, "LayerPolicy",
      "How one layer keeps its history: Flat(), Ring(...), Chunked(...), Shared(...) or State(...) "
      "(docs/design.md sections 2 and 9; docs/layer_kinds.md).");
  py::enum_<kvcore::LayerPolicy::Kind>(policy, "Kind",
                                       "Flat (full history), Ring (sliding window), Chunked (attention "
                                       "within chunks), Shared (another layer's K/V) or State "
                                       "(recurrent state snapshots).")
      .value("Flat", kvcore::LayerPolicy::Kind::Flat)
      .value("Ring", kvcore::LayerPolicy::Kind::Ring)
      .value("Chunked", kvcore::LayerPolicy::Kind::Chunked)
      .value("Shared", kvcore::LayerPolicy::Kind::Shared)
      .value("State", kvcore::LayerPolicy::Kind::State);
  policy.def_readonly("kind", &kvcore::LayerPolicy::kind, "The LayerPolicy.Kind.")
      .def_readonly("window", &kvcore::LayerPolicy::window,
                    "Ring: keys a query sees, counting itself (positions q - window + 1 .. q). "
                    "Chunked: the chunk size K (a query at q sees K * (q // K) .. q). Otherwise 0.")
      .def_readonly("sinks", &kvcore::LayerPolicy::sinks,
                    "Ring: first positions every query sees, kept forever. Otherwise 0.")
      .def_readonly("source", &kvcore::LayerPolicy::source,
                    "Shared: the earlier layer whose K/V this layer reads. Otherwise 0.")
      .def_readonly("slots", &kvcore::LayerPolicy::slots,
                    "State: state snapshots kept per sequence, D (slot of position p: p % D). "
                    "Otherwise 0.")
      .def_property_readonly(
          "is_ring", [](const kvcore::LayerPolicy& p) { return p.kind == kvcore::LayerPolicy::Kind::Ring; },
          "True for a Ring policy.")
      // is_operator: comparing with another type gives NotImplemented (so False), not TypeError.
      .def("__eq__", [](const kvcore::LayerPolicy& a, const kvcore::LayerPolicy& b) { return a == b; },
           py::is_operator())
      .def("__hash__",
           [](const kvcore::LayerPolicy& p) {
             return py::hash(py::make_tuple(static_cast<int>(p.kind), p.window, p.sinks, p.source, p.slots));
           })
      .def("__repr__", [](const kvcore::LayerPolicy& p) { return repr_policy(p); });
  copyable_value(policy);

  m.def("Flat", [] { return kvcore::LayerPolicy::flat(); }, "Full history: every earlier key is visible.");
  m.def("Ring", &make_ring, py::arg("window"), py::arg("sinks") = 0,
        "Sliding window of `window` keys counting the query itself, plus `sinks` first "
        "positions kept forever.");
  m.def(
      "Chunked", [](const PyInt& chunk) { return kvcore::LayerPolicy::chunked(positive("Chunked", "chunk", chunk)); },
      py::arg("chunk"),
      "Chunked attention (Llama 4): a query at q sees the keys k <= q of its own chunk, "
      "k // chunk == q // chunk. Its rows: a ring of chunk + max_step - 1. InvalidArgumentError: "
      "chunk < 1.");
  m.def(
      "Shared",
      [](const PyInt& source) {
        const int s = to_int("source", source);
        if (s < 0)
          raise(kvcore::Error::InvalidArgument,
                "source = " + std::to_string(s) + ": a Shared layer's source is a layer index >= 0");
        return kvcore::LayerPolicy::shared(s);
      },
      py::arg("source"),
      "A layer that reuses layer `source`'s K/V (Gemma 3n's shared KV layers): it holds no rows, "
      "writes nothing and reads what its source reads after the source's writes. The source "
      "must be an earlier Flat, Ring or Chunked layer of the same shape (CacheConfig checks). "
      "InvalidArgumentError: source < 0.");
  m.def(
      "State", [](const PyInt& slots) { return kvcore::LayerPolicy::state(positive("State", "slots", slots)); },
      py::arg("slots"),
      "A recurrent-state layer (Mamba, gated DeltaNet, short convolutions) keeping `slots` state "
      "snapshots per sequence, slot(p) = p % slots: the token at p reads the state after p - 1 "
      "and writes the state after p. A verify step (begin_step(T, verify=True)) or tree keeps "
      "the state after each position and needs T <= slots - 1; other steps keep only the last. "
      "Its LayerConfig has n_kv_heads = head_dim = 0 (the byte layer knows the state's shape). "
      "InvalidArgumentError: slots < 1.");
}

}  // namespace kvcore_py
