// Python view of SequenceCache, Step and plans (draft trees and commit: tree.cpp).
#include <pybind11/stl.h>

#include <memory>
#include <string>

#include "bindings.h"
#include "errors.h"
#include "step_handle.h"
#include "kvcore/core/sequence_cache.h"

namespace kvcore_py {

namespace {

std::string repr(const kvcore::Run& r) {
  return "Run(row=" + std::to_string(r.row) + ", len=" + std::to_string(r.len) +
         ", pos=" + std::to_string(r.pos) + ")";
}

py::tuple runs(const kvcore::Run* runs, int n) {
  py::tuple out(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = runs[i];
  return out;
}

std::string repr(const kvcore::SeqStepPlan& p) {
  std::string s = "SeqStepPlan(write=[";
  for (int i = 0; i < p.n_write; ++i) s += (i ? ", " : "") + repr(p.write[i]);
  s += "], read=[";
  for (int i = 0; i < p.n_read; ++i) s += (i ? ", " : "") + repr(p.read[i]);
  return s + "])";
}

std::string repr(const StepHandle& h) {
  return "Step(position=" + std::to_string(h.step.position) + ", T=" + std::to_string(h.step.T) +
         (h.branched ? ", tree=True" : "") + ")";
}

}  // namespace

kvcore::CacheConfig config_of(const kvcore::SequenceCache& cache) {
  kvcore::CacheConfig cfg;
  cfg.capacity = cache.capacity();
  cfg.n_layers = cache.n_layers();
  cfg.max_step = cache.max_step();
  cfg.initial_capacity = cache.initial_capacity();
  for (int l = 0; l < cache.n_layers(); ++l) cfg.layers.push_back(unwrap(cache.layer_config(l)));
  return cfg;
}

void register_cache(py::module_& m) {
  py::class_<kvcore::Run> run(m, "Run", "`len` consecutive rows from `row`, holding positions from `pos`.");
  copyable_value(run);
  run
      .def(py::init([](const PyInt& row, const PyInt& len, const PyInt& pos) {
             return kvcore::Run{to_int("row", row), to_int("len", len), to_int("pos", pos)};
           }),
           py::arg("row"), py::arg("len"), py::arg("pos"),
           "A run: `len` rows from `row` holding positions from `pos` (ints; InvalidArgumentError "
           "when one does not fit a 32-bit int). Plans check every run they are given.")
      .def_readonly("row", &kvcore::Run::row, "First row of the run.")
      .def_readonly("len", &kvcore::Run::len, "Rows (and positions) in the run.")
      .def_readonly("pos", &kvcore::Run::pos, "Position held by the first row; row + i holds pos + i.")
      // is_operator: comparing with another type gives NotImplemented (so False), not TypeError.
      .def("__eq__", [](const kvcore::Run& a, const kvcore::Run& b) { return a == b; }, py::is_operator())
      .def("__hash__", [](const kvcore::Run& r) { return py::hash(py::make_tuple(r.row, r.len, r.pos)); })
      .def("__iter__", [](const kvcore::Run& r) { return py::iter(py::make_tuple(r.row, r.len, r.pos)); })
      .def("__repr__", [](const kvcore::Run& r) { return repr(r); });

  py::class_<kvcore::SeqStepPlan> seq_step_plan(m, "SeqStepPlan", "One layer's plan for one step.");
  copyable_value(seq_step_plan);
  seq_step_plan
      .def_property_readonly("write", [](const kvcore::SeqStepPlan& p) { return runs(p.write, p.n_write); },
                             "Where the step's rows go: at most 2 Runs in position order (input row j "
                             "is position P + j).")
      .def_property_readonly("read", [](const kvcore::SeqStepPlan& p) { return runs(p.read, p.n_read); },
                             "Every row a query of the step may see: at most 3 Runs (sinks and a "
                             "wrapped window) in increasing position order.")
      .def_property_readonly("write_len", &kvcore::SeqStepPlan::write_len, "Rows the step writes: its T.")
      .def_property_readonly("read_len", &kvcore::SeqStepPlan::read_len, "Rows the read names.")
      .def_property_readonly("is_contiguous", &kvcore::SeqStepPlan::is_contiguous,
                             "True when the write and the read are one run each.")
      .def("__eq__", [](const kvcore::SeqStepPlan& a, const kvcore::SeqStepPlan& b) { return a == b; },
           py::is_operator())
      .def("__repr__", [](const kvcore::SeqStepPlan& p) { return repr(p); });

  py::class_<kvcore::LayerGeometry> geometry(
      m, "LayerGeometry",
      "How one layer's positions map onto its rows (SequenceCache.geometry(layer)): the one "
      "source of a layer's layout, which byte layers and the memory planner read.");
  copyable_value(geometry);
  geometry
      .def_readonly("rows", &kvcore::LayerGeometry::rows,
                    "Rows the layer's storage holds (rows(layer)).")
      .def_readonly("sink_rows", &kvcore::LayerGeometry::sink_rows,
                    "Rows [0, sink_rows) hold positions [0, sink_rows) for ever: a wrapping "
                    "ring's attention sinks (0 for flat layers and rings that never wrap).")
      .def_readonly("ring_rows", &kvcore::LayerGeometry::ring_rows,
                    "Rows reused in turn after the sinks: position p >= sink_rows lives in row "
                    "sink_rows + (p - sink_rows) % ring_rows; 0 when the layer never wraps.")
      .def_property_readonly("wraps", &kvcore::LayerGeometry::wraps,
                             "True when rows are reused (ring_rows != 0).")
      .def_property_readonly("mirror_rows", &kvcore::LayerGeometry::mirror_rows,
                             "Rows a mirrored byte layer repeats after the last row (copies of the "
                             "first ring rows) so a wrapped window is one span: ring_rows - 1 for a "
                             "wrapping ring without sinks, else 0.")
      .def("row",
           [](const kvcore::LayerGeometry& g, const PyInt& position) {
             const int p = to_int("position", position);
             if (p < 0) raise(kvcore::Error::InvalidArgument, "position = " + std::to_string(p) + ": must be >= 0");
             return g.row(p);
           },
           py::arg("position"), "The row that holds `position` (>= 0).")
      .def("held_rows",
           [](const kvcore::LayerGeometry& g, const PyInt& end) { return g.held_rows(to_int("end", end)); },
           py::arg("end"),
           "Rows that hold a position once positions [0, end) were written: min(end, rows).")
      .def("position_at",
           [](const kvcore::LayerGeometry& g, const PyInt& row, const PyInt& end) {
             return g.position_at(to_int("row", row), to_int("end", end));
           },
           py::arg("row"), py::arg("end"),
           "The position `row` stands for once positions [0, end) were written (the latest "
           "mapped to it); -1 when none is.")
      .def("__eq__", [](const kvcore::LayerGeometry& a, const kvcore::LayerGeometry& b) { return a == b; },
           py::is_operator())
      .def("__repr__", [](const kvcore::LayerGeometry& g) {
        return "LayerGeometry(rows=" + std::to_string(g.rows) + ", sink_rows=" +
               std::to_string(g.sink_rows) + ", ring_rows=" + std::to_string(g.ring_rows) + ")";
      });

  py::class_<kvcore::CacheBase, std::shared_ptr<kvcore::CacheBase>>(
      m, "CacheBase",
      "Any cache a registry can hold. A cache made by C++ code without RTTI reaches Python as "
      "this class; kvcore's own come as SequenceCache or BatchCache.");

  py::class_<StepHandle>(m, "Step",
                         "A begun step. As a context manager it commits on normal exit and "
                         "leaves the step uncommitted when the body raises.")
      .def_property_readonly("position", [](const StepHandle& h) { return h.step.position; },
                             "First position the step writes: the length when it was begun.")
      .def_property_readonly("T", [](const StepHandle& h) { return h.step.T; }, "Tokens in the step.")
      .def_property_readonly("verify", [](const StepHandle& h) { return h.step.verify; },
                             "True when the step may be rewound into (begun with verify=True, or a "
                             "tree): State layers keep the state after each of its positions.")
      .def_property_readonly("end", [](const StepHandle& h) { return h.step.end(); },
                             "position + T: the length once committed.")
      .def_property_readonly("is_current",
                             [](const StepHandle& h) { return h.cache->check_step(h.step).ok(); },
                             "True while this is the cache's begun, uncommitted step (a commit, "
                             "rewind, clear or new begin_step ends it).")
      .def_property_readonly("cache", [](const StepHandle& h) { return h.cache; },
                             "The SequenceCache that began the step (a byte layer refuses another "
                             "cache's step by it).")
      .def("plan",
           [](const StepHandle& h, const PyInt& layer) {
             return unwrap(h.cache->plan(to_int("layer", layer), h.step));
           },
           py::arg("layer"),
           "The SeqStepPlan of `layer` for this step. InvalidArgumentError: bad layer; "
           "InvalidStateError: the step is no longer current.")
      .def("abort", [](const StepHandle& h) { throw_if_error(h.cache->abort(h.step)); },
           "Ends the step without committing it: the length stays, no step is begun (its rows "
           "still count as written for can_rewind: the backend may have written them). "
           "InvalidStateError: the step is no longer current; nothing changes.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__",
           [](const StepHandle& h, py::object exc_type, py::object, py::object) {
             if (exc_type.is_none()) throw_if_error(h.cache->commit(h.step));
             return false;
           })
      .def("__deepcopy__",
           [](const StepHandle& h, py::dict memo) {
             // The step of the cache's copy (made once per deepcopy, through memo).
             py::object cache = py::module_::import("copy").attr("deepcopy")(py::cast(h.cache), memo);
             StepHandle copy{cache.cast<std::shared_ptr<kvcore::SequenceCache>>(), h.step};
             copy.branched = h.branched;
             return copy;
           },
           py::arg("memo"), "The same step of a deep copy of its cache (the clone keeps the begun step).")
      .def("__repr__", [](const StepHandle& h) { return repr(h); });

  py::class_<kvcore::SequenceCache, kvcore::CacheBase, std::shared_ptr<kvcore::SequenceCache>>(
      m, "SequenceCache",
      "One sequence's cache: one logical length over flat (full history), ring (sliding "
      "window, optional sinks), chunked (attention within chunks), shared (another layer's "
      "K/V) and state (recurrent state snapshots) layers. It plans each step with integers: where the step's K/V "
      "rows go and which rows each query reads (a byte layer such as KVPool applies the plans). "
      "Positions are token indices from 0; a step adds T tokens at positions length .. "
      "length + T - 1. A failing call raises and changes nothing.")
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
      .def_property_readonly("n_policies", &kvcore::SequenceCache::n_policies,
                             "Distinct policy objects (layers with identical policies share one).")
      .def_property_readonly("config", &config_of,
                             "The CacheConfig it was built from (max_step resolved, one entry per "
                             "layer), a new object.")
      .def("policy_index",
           [](const kvcore::SequenceCache& c, const PyInt& layer) {
             const int l = to_int("layer", layer);
             throw_if_error(kvcore::internal::to_status(c.rows(l)));
             return c.policy_index(l);
           },
           py::arg("layer"),
           "Index of the policy object `layer` uses (layers with the same index plan alike). "
           "InvalidArgumentError: bad layer.")
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
           py::arg("n") = 1, "True when n >= 0 and length + n <= capacity. Never raises.")
      .def("begin_step",
           [](const std::shared_ptr<kvcore::SequenceCache>& c, const PyInt& T, bool verify) {
             return StepHandle{c, unwrap(c->begin_step(to_int("T", T), verify))};
           },
           py::arg("T"), py::arg("verify") = false,
           "Begins a step of T tokens at position length (replacing an uncommitted step) and "
           "returns its Step. From then on the step's rows count as written. verify=True: the "
           "step may be rewound into (speculative verify), so State layers keep the state after "
           "each of its positions (needs T <= slots - 1); without it they keep only the last, "
           "and a rewind or partial commit into the step is refused. Other layers plan the same "
           "either way. InvalidArgumentError: T outside [1, max_step], or verify with T > "
           "slots - 1; CapacityError: length + T > capacity; InvalidStateError: a State layer "
           "lost the state after length - 1 (an aborted step overwrote its slot).")
      .def("step",
           [](const std::shared_ptr<kvcore::SequenceCache>& c, const PyInt& T, bool verify) {
             return StepHandle{c, unwrap(c->begin_step(to_int("T", T), verify))};
           },
           py::arg("T"), py::arg("verify") = false,
           "begin_step(T, verify), for use as `with cache.step(T) as step:`.")
      .def_property_readonly("active_step",
                             [](const std::shared_ptr<kvcore::SequenceCache>& c) -> py::object {
                               if (c->active_step().id == 0) return py::none();
                               StepHandle h{c, c->active_step()};
                               h.branched = h.step.tree && !unwrap(c->tree(h.step))->is_chain();
                               return py::cast(std::move(h));
                             },
                             "The begun, uncommitted Step, or None.")
      .def("plan",
           [](const kvcore::SequenceCache& c, const PyInt& layer, const PyInt& position, const PyInt& T) {
             return unwrap(c.plan(to_int("layer", layer), to_int("position", position), to_int("T", T)));
           },
           py::arg("layer"), py::arg("position"), py::arg("T"),
           "The SeqStepPlan of `layer` for the begun step at (position, T). InvalidArgumentError: "
           "bad layer; InvalidStateError: no such begun step.")
      .def("preview",
           [](const kvcore::SequenceCache& c, const PyInt& layer, const PyInt& T, bool verify) {
             return unwrap(c.preview(to_int("layer", layer), to_int("T", T), verify));
           },
           py::arg("layer"), py::arg("T"), py::arg("verify") = false,
           "The plan layer would get from the next step of T tokens, without beginning it: "
           "begin_step(T, verify) then gives this very plan. Errors as begin_step, and "
           "InvalidArgumentError for a bad layer.")
      .def("row_layer",
           [](const kvcore::SequenceCache& c, const PyInt& layer) {
             const int l = to_int("layer", layer);
             throw_if_error(kvcore::internal::to_status(c.rows(l)));
             return c.row_layer(l);
           },
           py::arg("layer"),
           "The layer whose rows `layer` reads: a Shared layer's source, else `layer` itself "
           "(a byte layer hands a Shared layer its source's K/V). InvalidArgumentError: bad layer.")
      .def("abort",
           [](kvcore::SequenceCache& c, const StepHandle& h) {
             if (h.cache.get() != &c)
               raise(kvcore::Error::InvalidState, "abort: the step belongs to another cache");
             throw_if_error(c.abort(h.step));
           },
           py::arg("step"),
           "Ends `step` without committing it (a failed forward): the length stays and no step "
           "is begun; its rows still count as written for can_rewind. InvalidStateError: not "
           "this cache's begun step; nothing changes.")
      .def("rewind", [](kvcore::SequenceCache& c, const PyInt& n) { throw_if_error(c.rewind(to_int("n", n))); },
           py::arg("n"),
           "length = n (speculative decoding's rejected drafts, a regenerated reply); ends a "
           "begun step. Allowed when every layer still holds what a query at n needs below n: "
           "any n on flat layers; once a ring wrapped, any n >= Lmax - max_step (Lmax: the "
           "longest length committed so far, not the length a rewind left) and n <= sinks. "
           "InvalidArgumentError: n outside [0, length]; InvalidStateError: history a query at "
           "n needs was overwritten.")
      .def("can_rewind",
           [](const kvcore::SequenceCache& c, const PyInt& n) {
             int v = 0;  // never raises: any int rewind() would refuse answers False
             return fits_int(n, &v) && c.can_rewind(v);
           },
           py::arg("n"), "True exactly when rewind(n) would succeed. Never raises.")
      .def("clear", &kvcore::SequenceCache::clear, "length = 0; ends a begun step. Never fails.")
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
