// BatchStep: a begun step of a BatchCache, a context manager that commits on normal exit.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "bindings.h"
#include "batch_bindings.h"
#include "batch_plan_handles.h"
#include "errors.h"
#include "int_args.h"
#include "kvcore/batch/batch_cache.h"

namespace kvcore_py {

namespace {

using Cache = kvcore::BatchCache;
using CachePtr = std::shared_ptr<Cache>;

}  // namespace

void register_batch_step(py::module_& m) {
  py::class_<BatchStepHandle>(m, "BatchStep",
                              "A begun step of a BatchCache. As a context manager it commits on normal "
                              "exit and leaves the step uncommitted when the body raises.")
      .def_property_readonly("n_entries", [](const BatchStepHandle& h) { return h.step.n_entries; },
                             "Sequences in the step.")
      .def_property_readonly("n_tokens", [](const BatchStepHandle& h) { return h.step.n_tokens; },
                             "New tokens in the step, all sequences.")
      .def_property_readonly("is_current", [](const BatchStepHandle& h) { return h.check().ok(); },
                             "True while this is the cache's begun, uncommitted step.")
      .def("plan", [](const BatchStepHandle& h) { return BatchPlanHandle{h, unwrap(h.cache->plan(h.step))}; },
           "The step's BatchStepPlan. InvalidStateError: the step is no longer the begun one.")
      .def("commit", [](const BatchStepHandle& h, const py::handle& accepted) { return commit_batch_step(*h.cache, h, accepted); },
           py::arg("accepted") = py::none(),
           "Commits the step: as cache.commit(step, accepted). InvalidStateError: stale step. "
           "InvalidArgumentError: see cache.commit.")
      .def("abort", [](const BatchStepHandle& h) { throw_if_error(h.cache->abort(h.step)); },
           "Ends the step without committing it: every length, block table and count is as "
           "before the step began (its blocks return to the pools). InvalidStateError: stale "
           "step; nothing changes.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__",
           [](const BatchStepHandle& h, py::object exc_type, py::object, py::object) {
             if (exc_type.is_none()) throw_if_error(h.cache->commit(h.step));
             return false;
           })
      .def("__repr__", [](const BatchStepHandle& h) {
        return "BatchStep(n_entries=" + std::to_string(h.step.n_entries) + ", n_tokens=" + std::to_string(h.step.n_tokens) + ")";
      });
}

}  // namespace kvcore_py
