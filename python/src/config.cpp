// Python view of LayerPolicy / LayerConfig / CacheConfig.
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "bindings.h"
#include "errors.h"
#include "kvcore/core/config.h"

namespace kvcore_py {

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

namespace {

std::string repr(const kvcore::LayerConfig& l) {
  std::string s = "LayerConfig(" + repr_policy(l.policy) + ", n_kv_heads=" + std::to_string(l.n_kv_heads) +
                  ", head_dim=" + std::to_string(l.head_dim);
  if (l.v_head_dim != 0) s += ", v_head_dim=" + std::to_string(l.v_head_dim);
  return s + ")";
}

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

std::string repr(const kvcore::BatchLimits& b) {
  return "BatchLimits(block_size=" + std::to_string(b.block_size) + ", max_seqs=" + std::to_string(b.max_seqs) +
         ", max_step_tokens=" + std::to_string(b.max_step_tokens) + ", num_blocks=" + std::to_string(b.num_blocks) +
         ", max_holes=" + std::to_string(b.max_holes) +
         (b.max_active_seqs != 0 ? ", max_active_seqs=" + std::to_string(b.max_active_seqs) : std::string()) +
         (b.state_snapshots != 0 ? ", state_snapshots=" + std::to_string(b.state_snapshots) : std::string()) +
         (b.page_layers != 0 ? ", page_layers=" + std::to_string(b.page_layers) : std::string()) +
         (b.max_rewind != -1 ? ", max_rewind=" + std::to_string(b.max_rewind) : std::string()) + ")";
}

// Mirrors the constructor call, so the repr reads as the config it is.
std::string repr(const kvcore::CacheConfig& c) {
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
      b.state_snapshots != d.state_snapshots || b.page_layers != d.page_layers || b.max_rewind != d.max_rewind)
    s += ", batch=" + repr(b);
  return s + ")";
}

using LayersArg = std::variant<kvcore::LayerConfig, std::vector<kvcore::LayerConfig>>;

}  // namespace

void register_config(py::module_& m) {
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

  py::class_<kvcore::BatchLimits> batch_limits(
      m, "BatchLimits",
      "Limits of a many-sequence cache (BatchCache), fixed at its creation: every table it "
      "keeps is sized from them, so no step allocates. A SequenceCache ignores them.");
  copyable_value(batch_limits);
  batch_limits
      .def(py::init([](const PyInt& block_size, const PyInt& max_seqs, const PyInt& max_step_tokens,
                       const PyInt& num_blocks, const PyInt& max_holes, const PyInt& max_active_seqs,
                       const PyInt& state_snapshots, const PyInt& page_layers, const PyInt& max_rewind) {
             kvcore::BatchLimits b;
             b.block_size = to_int("block_size", block_size);
             b.max_seqs = to_int("max_seqs", max_seqs);
             b.max_step_tokens = to_int("max_step_tokens", max_step_tokens);
             b.num_blocks = to_int("num_blocks", num_blocks);
             b.max_holes = to_int("max_holes", max_holes);
             b.max_active_seqs = to_int("max_active_seqs", max_active_seqs);
             b.state_snapshots = to_int("state_snapshots", state_snapshots);
             b.page_layers = to_int("page_layers", page_layers);
             b.max_rewind = to_int("max_rewind", max_rewind);
             return b;
           }),
           py::kw_only(), py::arg("block_size") = 16, py::arg("max_seqs") = 64,
           py::arg("max_step_tokens") = 0, py::arg("num_blocks") = 0, py::arg("max_holes") = 8, py::arg("max_active_seqs") = 0,
           py::arg("state_snapshots") = 0, py::arg("page_layers") = 0, py::arg("max_rewind") = -1,
           "block_size: rows per block (1 = cell-granular). max_seqs: sequence ids are "
           "0..max_seqs-1. max_step_tokens: new tokens of one step over all its sequences (0: "
           "max_seqs * max_step, at most 2**20). num_blocks: blocks of the one pool every group draws from "
           "(0: what each group would need alone for max_active_seqs sequences, summed: a full table row per "
           "flat group, a window's blocks per ring). max_holes: removed middle "
           "ranges one sequence keeps apart. max_active_seqs: sequences active at once (0: max_seqs); "
           "each group's block tables hold one row of ceil(capacity / block_size) entries per active "
           "sequence. state_snapshots: named state "
           "snapshots each State group keeps for prefix reuse (a step ending on a full block names the state "
           "after it; 0: a model with State layers never hits a prefix), one state slot each. page_layers: layers "
           "of one policy form groups of at most this many, so that the pool's pages (one layer of each group) "
           "leave no storage unused (0: the fewest layers any policy has, vLLM's rule). max_rewind: the longest "
           "rewind, in positions, that ring and chunked groups keep history for (each position costs every "
           "sequence a ring position; -1: max_step, 0: never rewinds, as vLLM's sliding window; in "
           "[-1, capacity]). Checked when a "
           "BatchCache is built (InvalidArgumentError naming the field).")
      .def_readonly("block_size", &kvcore::BatchLimits::block_size, "Rows per block.")
      .def_readonly("max_seqs", &kvcore::BatchLimits::max_seqs, "Sequence ids are 0..max_seqs-1.")
      .def_readonly("max_step_tokens", &kvcore::BatchLimits::max_step_tokens,
                    "New tokens of one step over all sequences (0: the default).")
      .def_readonly("num_blocks", &kvcore::BatchLimits::num_blocks,
                    "Blocks of the one pool every group draws from (0: the default).")
      .def_readonly("max_holes", &kvcore::BatchLimits::max_holes,
                    "Removed middle ranges one sequence keeps apart.")
      .def_readonly("max_active_seqs", &kvcore::BatchLimits::max_active_seqs,
                    "Sequences active at once: block table rows per group (0: max_seqs).")
      .def_readonly("state_snapshots", &kvcore::BatchLimits::state_snapshots,
                    "Named state snapshots per State group for prefix reuse (0: none).")
      .def_readonly("page_layers", &kvcore::BatchLimits::page_layers,
                    "Most layers of one group (0: the fewest layers any policy has).")
      .def_readonly("max_rewind", &kvcore::BatchLimits::max_rewind,
                    "Longest rewind, in positions, ring and chunked groups keep history for (-1: max_step).")
      .def("__repr__", [](const kvcore::BatchLimits& b) { return repr(b); });

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
