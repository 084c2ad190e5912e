// GroupPlan: one group's part of a BatchStepPlan (its slots, copies and block tables).
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

void register_group_plan(py::module_& m) {
  py::class_<GroupPlanHandle>(m, "GroupPlan",
                              "One group's part of a BatchStepPlan (a group: the layers sharing a policy "
                              "and a block pool). Arrays are read-only int32 views of the cache's buffers; "
                              "reading one after the step ended raises InvalidStateError.")
      .def_readonly("group", &GroupPlanHandle::group, "The group's index.")
      .def_property_readonly(
          "slots",
          [](const GroupPlanHandle& g) {
            throw_if_error(g.step.check());
            return view_of(g.plan.slots, {g.n_tokens()}, py::cast(g.step.cache));
          },
          "(n_tokens,) physical row of each new token (block * block_size + offset), in token "
          "order: where to write (slot_mapping).")
      .def_property_readonly(
          "copies",
          [](const GroupPlanHandle& g) {
            throw_if_error(g.step.check());
            return view_of(reinterpret_cast<const int*>(g.plan.copies), {g.plan.n_copies, 2}, py::cast(g.step.cache));
          },
          "(n_copies, 2) blocks to copy, (src, dst), all block_size rows, before writing "
          "(copy-on-write of a shared, partly filled block).")
      .def_property_readonly(
          "block_tables",
          [](const GroupPlanHandle& g) {
            throw_if_error(g.step.check());
            return view_of(g.plan.block_tables, {g.step.cache->max_active_seqs(), g.plan.table_stride}, py::cast(g.step.cache));
          },
          "(max_active_seqs, table_stride) block of each block index, one row per active sequence, "
          "-1 for a hole; entry i reads row table_rows[seq_ids[i]] of the plan (row seq_ids[i] when "
          "max_active_seqs == max_seqs), its first ceil(context_lens[i] / block_size) entries.")
      .def_property_readonly(
          "policy",
          [](const GroupPlanHandle& g) {
            throw_if_error(g.step.check());
            return g.plan.policy;
          },
          "The group's LayerPolicy: the window bounds of the visibility rule (a ring's window "
          "and sinks in positions; Flat: every earlier position).")
      .def("__repr__", [](const GroupPlanHandle& g) {
        return "GroupPlan(group=" + std::to_string(g.group) + ", n_tokens=" + std::to_string(g.n_tokens()) +
               ", n_copies=" + std::to_string(g.plan.n_copies) +
               (g.step.check().ok() ? ")" : ", stale: its step ended)");
      });
}

}  // namespace kvcore_py
