// StateGroupPlan: one State group's part of a BatchStepPlan (the slots its states are read from and written to).
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
#include "batch_plan_handles.h"
#include "errors.h"
#include "int_args.h"
#include "kvcore/batch/batch_cache.h"

namespace kvcore_py {

namespace {

using Cache = kvcore::BatchCache;
using CachePtr = std::shared_ptr<Cache>;

}  // namespace

void register_state_group_plan(py::module_& m) {
  py::class_<StateGroupPlanHandle>(
      m, "StateGroupPlan",
      "One State group's part of a BatchStepPlan (docs/batch.md section 10: the State layers keeping D "
      "state slots per sequence). Slots are physical state slot indices in [0, num_slots), the "
      "state_indices a recurrent kernel takes (layer l of the group keeps state i at state[l][i]), -1 "
      "for none. Arrays are read-only int32 views of the cache's buffers, one value per token of the "
      "step in token order (as GroupPlan.slots); reading one after the step ended raises "
      "InvalidStateError.")
      .def_readonly("state_group", &StateGroupPlanHandle::state_group,
                    "The State group's index (cache.state_group_of(layer)).")
      .def_property_readonly(
          "read_slots",
          [](const StateGroupPlanHandle& g) {
            throw_if_error(g.step.check());
            return view_of(g.plan.read_slots, {g.n_tokens()}, py::cast(g.step.cache));
          },
          "(n_tokens,) the physical slot holding the state token j starts from: for an entry's first "
          "token (a tree's root) the state after position first - 1, -1 at position 0 (zeros); for a "
          "tree node its parent's write slot; for a chain token j > 0 the previous token's write slot, "
          "or -1 when the step does not keep it (the state carried within the forward).")
      .def_property_readonly(
          "write_slots",
          [](const StateGroupPlanHandle& g) {
            throw_if_error(g.step.check());
            return view_of(g.plan.write_slots, {g.n_tokens()}, py::cast(g.step.cache));
          },
          "(n_tokens,) the physical slot where token j's state (the state after its position) is "
          "written, -1 when the step does not keep it: a chain entry without verify keeps only its "
          "last token's; a verify entry or a tree keeps every token's (tree node j in the slot of "
          "position first + chain_index[j], as a chain would). No slot one entry reads is written by "
          "another entry of the step.")
      .def_property_readonly(
          "slots_per_seq",
          [](const StateGroupPlanHandle& g) {
            throw_if_error(g.step.check());
            return g.plan.slots_per_seq;
          },
          "D: the logical state slots each sequence keeps (the policy's slots).")
      .def_property_readonly(
          "num_slots",
          [](const StateGroupPlanHandle& g) {
            throw_if_error(g.step.check());
            return g.plan.num_slots;
          },
          "Physical slots of the group (cache.num_state_slots): every slot named is below it.")
      .def_property_readonly(
          "policy",
          [](const StateGroupPlanHandle& g) {
            throw_if_error(g.step.check());
            return g.plan.policy;
          },
          "The group's State LayerPolicy (its slots: D).")
      .def("__repr__", [](const StateGroupPlanHandle& g) {
        return "StateGroupPlan(state_group=" + std::to_string(g.state_group) + ", n_tokens=" +
               std::to_string(g.n_tokens()) + ", slots_per_seq=" + std::to_string(g.plan.slots_per_seq) +
               (g.step.check().ok() ? ")" : ", stale: its step ended)");
      });
}

}  // namespace kvcore_py
