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
            if (g.plan.block_tables == nullptr)
              raise(kvcore::Error::NotSupported,
                    "block_tables: the cache's block tables are paged (batch.table_page_blocks = " +
                        std::to_string(g.plan.page_blocks) + "): read entry_tables, or table_pages through table_dir");
            return view_of(g.plan.block_tables, {g.step.cache->max_active_seqs(), g.plan.table_stride}, py::cast(g.step.cache));
          },
          "(max_active_seqs, table_stride) block of each block index, one row per active sequence, "
          "-1 for a hole; entry i reads row table_rows[seq_ids[i]] of the plan (row seq_ids[i] when "
          "max_active_seqs == max_seqs), its first ceil(context_lens[i] / block_size) entries. A zero-copy "
          "view of unpaged tables; NotSupportedError when the tables are paged (batch.table_page_blocks > 0: "
          "entry_tables reads either layout).")
      .def_property_readonly(
          "entry_tables",
          [](const GroupPlanHandle& g) {
            throw_if_error(g.step.check());
            const kvcore::BatchStepPlan p = unwrap(g.step.cache->plan(g.step.step));
            const std::int64_t B = p.block_size;
            py::ssize_t width = 0;
            for (int i = 0; i < p.n_entries; ++i)
              width = std::max<py::ssize_t>(width, static_cast<py::ssize_t>((p.context_lens[i] + B - 1) / B));
            py::array_t<std::int32_t> out({static_cast<py::ssize_t>(p.n_entries), width});
            std::int32_t* o = out.mutable_data();
            for (int i = 0; i < p.n_entries; ++i) {
              const kvcore::TableRow row = kvcore::table_row(p, g.group, i);
              const py::ssize_t n = static_cast<py::ssize_t>((p.context_lens[i] + B - 1) / B);
              for (py::ssize_t j = 0; j < width; ++j) o[i * width + j] = j < n ? row[static_cast<int>(j)] : -1;
            }
            return out;
          },
          "(n_entries, max over entries of ceil(context_lens[i] / block_size)) int32: row i is entry i's "
          "block table (the block of each block index, -1 for a hole), its first ceil(context_lens[i] / "
          "block_size) entries, -1 past them: flash-attn's and vLLM's block_table for the step. A copy "
          "(O(the step's blocks)), made from either table layout, paged or not.")
      .def_property_readonly(
          "table_pages",
          [](const GroupPlanHandle& g) {
            throw_if_error(g.step.check());
            return view_of(g.plan.table_pages, {g.step.cache->table_pages(), g.plan.page_blocks}, py::cast(g.step.cache));
          },
          "(table_pages, page_blocks) the pages every group's rows live in (-1 entries: no block). Row r's "
          "block index j is table_pages[table_dir[r, j // page_blocks], j % page_blocks] (a page id of -1: "
          "every entry -1). Unpaged, a row is one page of table_stride entries. A zero-copy view.")
      .def_property_readonly(
          "table_dir",
          [](const GroupPlanHandle& g) {
            throw_if_error(g.step.check());
            return view_of(g.plan.table_dir, {g.step.cache->max_active_seqs(), g.plan.dir_stride}, py::cast(g.step.cache));
          },
          "(max_active_seqs, ceil(table_stride / page_blocks)) the page ids of each row of this group "
          "(table_rows names a sequence's row), -1 for a page the row holds no block in. A zero-copy view.")
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
