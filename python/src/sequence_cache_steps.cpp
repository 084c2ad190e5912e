// SequenceCache's steps: begin_step (or step), its plans and preview, abort, rewind and clear.
#include <pybind11/stl.h>

#include <memory>
#include <string>

#include "bindings.h"
#include "errors.h"
#include "kvcore/core/sequence_cache.h"
#include "step_handle.h"

namespace kvcore_py {

void bind_sequence_cache_steps(SequenceCacheClass& cls) {
  cls
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
      .def("clear", &kvcore::SequenceCache::clear, "length = 0; ends a begun step. Never fails.");
}

}  // namespace kvcore_py
