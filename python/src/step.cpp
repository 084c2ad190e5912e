// Step: a begun step of a SequenceCache, a context manager that commits on normal exit
// (its draft-tree members: tree.cpp; its mask: step_mask.cpp).
#include <pybind11/stl.h>

#include <memory>
#include <string>

#include "bindings.h"
#include "errors.h"
#include "kvcore/core/sequence_cache.h"
#include "step_handle.h"

namespace kvcore_py {

namespace {

std::string repr(const StepHandle& h) {
  return "Step(position=" + std::to_string(h.step.position) + ", T=" + std::to_string(h.step.T) +
         (h.branched ? ", tree=True" : "") + ")";
}

}  // namespace

void register_step(py::module_& m) {
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
}

}  // namespace kvcore_py
