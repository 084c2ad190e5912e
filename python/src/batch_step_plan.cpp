// BatchStepPlan: the plan of a begun BatchStep in the varlen paged format. Its
// arrays are read-only numpy views of the cache's own buffers (no copy); each
// keeps the cache alive, and shows the step it was made for until the cache's
// next mutating call.
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
#include "batch_sequence_info.h"
#include "errors.h"
#include "int_args.h"
#include "kvcore/batch/batch_cache.h"
#include "plan_mask.h"

namespace kvcore_py {

namespace {

using Cache = kvcore::BatchCache;
using CachePtr = std::shared_ptr<Cache>;

}  // namespace

void register_batch_step_plan(py::module_& m) {
  py::class_<BatchPlanHandle>(m, "BatchStepPlan",
                              "The plan of a begun BatchStep in the varlen paged format. Per-entry arrays "
                              "are read-only int32 views of the cache's buffers; entry i's queries are "
                              "tokens [query_starts[i], query_starts[i+1]) at positions first_positions[i] "
                              "+ j. Reading an array after the step ended raises InvalidStateError.")
      .def_property_readonly("n_entries", [](const BatchPlanHandle& h) { return current(h).n_entries; },
                             "Sequences in the step.")
      .def_property_readonly("n_tokens", [](const BatchPlanHandle& h) { return current(h).n_tokens; },
                             "New tokens of the step, all sequences.")
      .def_property_readonly("block_size", [](const BatchPlanHandle& h) { return h.plan.block_size; },
                             "Rows per block.")
      .def_property_readonly(
          "seq_ids", [](const BatchPlanHandle& h) { return view_of(current(h).seq_ids, {h.plan.n_entries}, py::cast(h.step.cache)); },
          "(n_entries,) the sequence of each entry.")
      .def_property_readonly(
          "table_rows",
          [](const BatchPlanHandle& h) { return view_of(current(h).table_rows, {h.step.cache->max_seqs()}, py::cast(h.step.cache)); },
          "(max_seqs,) each sequence id's row in every group's block_tables: an active sequence's "
          "row (its id when max_active_seqs == max_seqs), -1 for an inactive one whatever "
          "max_active_seqs.")
      .def_property_readonly(
          "query_starts",
          [](const BatchPlanHandle& h) { return view_of(current(h).query_starts, {h.plan.n_entries + 1}, py::cast(h.step.cache)); },
          "(n_entries + 1,) entry i's tokens are [query_starts[i], query_starts[i + 1]) (cu_seqlens_q).")
      .def_property_readonly(
          "first_positions",
          [](const BatchPlanHandle& h) { return view_of(current(h).first_positions, {h.plan.n_entries}, py::cast(h.step.cache)); },
          "(n_entries,) each sequence's length before the step: its first new position.")
      .def_property_readonly(
          "context_lens",
          [](const BatchPlanHandle& h) { return view_of(current(h).context_lens, {h.plan.n_entries}, py::cast(h.step.cache)); },
          "(n_entries,) each sequence's length after the step (cache_seqlens).")
      .def_property_readonly(
          "visible_starts",
          [](const BatchPlanHandle& h) { return view_of(current(h).visible_starts, {h.plan.n_entries}, py::cast(h.step.cache)); },
          "(n_entries,) positions below it were removed from the sequence: never visible.")
      .def(
          "holes",
          [](const BatchPlanHandle& h, const IntArg& entry) {
            const kvcore::BatchStepPlan& p = current(h);
            const int i = entry_of(p, entry);
            return holes_of(p.holes[i], p.n_holes[i]);
          },
          py::arg("entry"),
          "Entry i's removed middle ranges [(begin, end), ...] of positions: never visible. "
          "InvalidArgumentError: entry outside [0, n_entries). InvalidStateError: the step ended.")
      .def("arrays", &plan_arrays,
          "Every array of the plan in one call, as the properties give them (the same "
          "read-only views of the cache's buffers, no copy): (seq_ids, query_starts, "
          "first_positions, context_lens, visible_starts, table_rows, groups), groups holding "
          "(slots, copies, block_tables) per group, block_tables None when the tables are paged "
          "(GroupPlan.entry_tables reads them). One call instead of a property read per "
          "array: what a backend reads every step. InvalidStateError: the step ended.")
      .def_property_readonly(
          "positions", [](const BatchPlanHandle& h) { return view_of(current(h).positions, {h.plan.n_tokens}, py::cast(h.step.cache)); },
          "(n_tokens,) the position of each new token: first_positions[i] + j for a chain, "
          "first_positions[i] + depth(node) for a draft tree's node (RoPE and the mask use it).")
      .def_property_readonly(
          "chain_index",
          [](const BatchPlanHandle& h) { return view_of(current(h).chain_index, {h.plan.n_tokens}, py::cast(h.step.cache)); },
          "(n_tokens,) each token's place among its entry's reserved positions: a tree entry of N nodes "
          "takes the rows of positions [first, first + N) as a chain of N would, node j the row of "
          "position first + chain_index[j] in the block table (the main line in place). j for a chain.")
      .def_property_readonly(
          "tree_mask_starts",
          [](const BatchPlanHandle& h) { return view_of(current(h).tree_mask_starts, {h.plan.n_entries + 1}, py::cast(h.step.cache)); },
          "(n_entries + 1,) entry i's ancestor mask is tree_masks[tree_mask_starts[i]:tree_mask_starts[i + 1]] "
          "(uint32 words); an empty range: a chain (causal).")
      .def_property_readonly(
          "tree_masks",
          [](const BatchPlanHandle& h) {
            const kvcore::BatchStepPlan& p = current(h);
            return view_of(p.tree_masks, {p.tree_mask_starts[p.n_entries]}, py::cast(h.step.cache), py::detail::npy_api::NPY_UINT_);
          },
          "uint32 words of every tree entry's packed ancestor mask, entry after entry: N rows of "
          "ceil(N / 32) words, row j bit k (word k // 32, bit k % 32) set when node k is j or an ancestor "
          "of j (TensorRT-LLM's packed mask; each row's bytes are FlashInfer's packbits(bitorder='little')).")
      .def(
          "is_tree",
          [](const BatchPlanHandle& h, const IntArg& entry) {
            const kvcore::BatchStepPlan& p = current(h);
            return p.is_tree(entry_of(p, entry));
          },
          py::arg("entry"),
          "True when entry i is a draft tree (not a chain). InvalidArgumentError: entry outside "
          "[0, n_entries). InvalidStateError: the step ended.")
      .def(
          "mask",
          [](const BatchPlanHandle& h, const IntArg& group, const std::optional<PyInt>& rows) {
            const kvcore::BatchStepPlan& p = current(h);
            return plan_mask(*h.step.cache, p, to_int("group", group), rows);
          },
          py::arg("group"), py::arg("rows") = py::none(),
          "Boolean (n_tokens, rows) mask over the group's pool rows [0, rows) (default: "
          "used_blocks(group) * block_size, every live row): mask[t, r] is True when new token t "
          "may see the key in row r (its own sequence's, by the visibility rule, not removed; a tree "
          "node sees its history by the rule at its position and, of its tree, itself and its "
          "ancestors within the window). "
          "A new array. InvalidArgumentError: bad group or rows.")
      .def_property_readonly(
          "groups",
          [](const BatchPlanHandle& h) {
            const kvcore::BatchStepPlan& p = current(h);
            py::tuple out(static_cast<std::size_t>(p.n_groups));
            for (int g = 0; g < p.n_groups; ++g)
              out[static_cast<std::size_t>(g)] = GroupPlanHandle{h.step, g, p.groups[g]};
            return out;
          },
          "One GroupPlan per group (index with cache.group_of(layer)).")
      .def_property_readonly("n_state_groups", [](const BatchPlanHandle& h) { return current(h).n_state_groups; },
                             "State groups of the cache (0 without State layers).")
      .def_property_readonly(
          "state_groups",
          [](const BatchPlanHandle& h) {
            const kvcore::BatchStepPlan& p = current(h);
            py::tuple out(static_cast<std::size_t>(p.n_state_groups));
            for (int k = 0; k < p.n_state_groups; ++k)
              out[static_cast<std::size_t>(k)] = StateGroupPlanHandle{h.step, k, p.state_groups[k]};
            return out;
          },
          "One StateGroupPlan per State group (index with cache.state_group_of(layer)); empty without "
          "State layers. InvalidStateError: the step ended.")
      .def(
          "state_arrays",
          [](const BatchPlanHandle& h) {
            const kvcore::BatchStepPlan& p = current(h);
            const py::object owner = py::cast(h.step.cache);
            py::tuple out(static_cast<std::size_t>(p.n_state_groups));
            for (int k = 0; k < p.n_state_groups; ++k)
              out[static_cast<std::size_t>(k)] = py::make_tuple(view_of(p.state_groups[k].read_slots, {p.n_tokens}, owner),
                                                                view_of(p.state_groups[k].write_slots, {p.n_tokens}, owner));
            return out;
          },
          "Every State group's arrays in one call: a tuple of (read_slots, write_slots) per State group, "
          "the same read-only int32 (n_tokens,) views StateGroupPlan gives (physical state slots per "
          "token, -1 for none). Empty without State layers. InvalidStateError: the step ended.")
      .def("__repr__", [](const BatchPlanHandle& h) {
        return "BatchStepPlan(n_entries=" + std::to_string(h.plan.n_entries) + ", n_tokens=" +
               std::to_string(h.plan.n_tokens) + ", n_groups=" + std::to_string(h.plan.n_groups) +
               (h.step.check().ok() ? ")" : ", stale: its step ended)");
      });
}

}  // namespace kvcore_py
