// BatchCache (docs/batch.md): its construction, sizes and groups; its blocks,
// sequence verbs and steps are bound by batch_cache_blocks.cpp,
// batch_cache_sequences.cpp and batch_cache_steps.cpp, its prefix lookups and
// KV events by batch_prefix.cpp.
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
#include "batch_prefix.h"
#include "errors.h"
#include "int_args.h"
#include "kvcore/batch/batch_cache.h"

namespace kvcore_py {

namespace {

using Cache = kvcore::BatchCache;
using CachePtr = std::shared_ptr<Cache>;

}  // namespace

void register_batch_cache(py::module_& m) {
  py::class_<Cache, kvcore::CacheBase, CachePtr> cls(
      m, "BatchCache",
      "Many sequences over paged block pools (docs/design.md section 6): one pool of blocks per group "
      "of layers sharing a policy; forks share blocks, removals and rewinds release them, ring "
      "groups release what no future query can reach, and full blocks named by their token ids "
      "are reused by new sequences with the same prefix. Sequence ids are 0..max_seqs-1; every "
      "table is sized from config.batch (BatchLimits) at creation. A failing call raises and "
      "changes nothing.");
  cls.def(py::init([](const kvcore::CacheConfig& cfg) { return CachePtr(unwrap(Cache::create(cfg))); }),
           py::arg("config"),
           "Builds the cache. InvalidArgumentError names a bad config or BatchLimits field; "
           "AllocationError when its tables cannot be allocated.")
      .def_property_readonly("max_seqs", &Cache::max_seqs, "Sequence ids are 0..max_seqs-1.")
      .def_property_readonly("capacity", &Cache::capacity, "Largest length of one sequence (positions).")
      .def_property_readonly("max_step", &Cache::max_step, "Largest T of one sequence in one step.")
      .def_property_readonly("max_rewind", &Cache::max_rewind,
                             "Longest rewind, in positions, ring and chunked groups keep history for: can_rewind(s, n) "
                             "holds for n >= the longest length s committed minus this (batch.max_rewind, default max_step).")
      .def_property_readonly("max_step_tokens", &Cache::max_step_tokens, "Largest number of new tokens of one step.")
      .def_property_readonly("n_layers", &Cache::n_layers, "Number of layers (config.n_layers), in n_groups groups.")
      .def_property_readonly("n_groups", &Cache::n_groups, "Groups: layers sharing one policy and one block pool.")
      .def_property_readonly("block_size", &Cache::block_size, "Rows per block.")
      .def_property_readonly("state_block_size", &Cache::state_block_size,
                             "The State groups' block, in tokens (batch.state_block_size, 0 resolved to block_size): a "
                             "commit names the state at its end only at a length that is a multiple of it, so prefix "
                             "hits on State layers land there.")
      .def_property_readonly("table_stride", &Cache::table_stride, "Block table entries per row: ceil(capacity / block_size).")
      .def_property_readonly("max_active_seqs", &Cache::max_active_seqs,
                             "Sequences active at once (BatchLimits.max_active_seqs, default max_seqs): "
                             "the rows of each group's block tables.")
      .def_property_readonly("table_page_blocks", &Cache::table_page_blocks,
                             "Block table entries per table page: batch.table_page_blocks, or table_stride when "
                             "the tables are unpaged (a row is one page).")
      .def_property_readonly("table_pages", &Cache::table_pages,
                             "Table pages every group draws from (unpaged: one per row and group, each a row's).")
      .def_property_readonly("free_table_pages", &Cache::free_table_pages,
                             "Table pages no row holds (0 when unpaged). A step is admitted when its entries' "
                             "table_pages_needed sum to at most this.")
      .def_property_readonly("free_table_rows", &Cache::free_table_rows,
                             "Sequences that may still become active (add_sequence, fork into an inactive "
                             "one) before one is refused with CapacityError: max_active_seqs less the "
                             "active sequences (also when max_active_seqs == max_seqs).")
      .def("group_of", [](const Cache& c, const IntArg& layer) { return unwrap(c.group_of(to_int("layer", layer))); },
           py::arg("layer"),
           "The group of a layer. InvalidArgumentError: bad layer, or a State layer (it has no block "
           "group: state_group_of names its State group).")
      .def_property_readonly("n_state_groups", &Cache::n_state_groups,
                             "State groups: the State layers (recurrent state, docs/batch.md section 10) of "
                             "one policy, apart from the n_groups block groups. 0 without State layers.")
      .def("state_group_of",
           [](const Cache& c, const IntArg& layer) { return unwrap(c.state_group_of(to_int("layer", layer))); },
           py::arg("layer"),
           "The State group of a State layer, in [0, n_state_groups): index plan.state_groups and the "
           "State part of commit's copies with it. InvalidArgumentError: bad layer, or a layer that is "
           "not a State layer (the message names it; group_of names its block group).")
      .def("state_group_policy",
           [](const Cache& c, const IntArg& k) { return unwrap(c.state_group_policy(to_int("state_group", k))); },
           py::arg("state_group"),
           "The State policy of a State group's layers: its .slots is D, the logical state slots each "
           "sequence keeps (position p's state in slot p % D; a verify step needs T <= D - 1). "
           "InvalidArgumentError: state_group outside [0, n_state_groups).")
      .def("num_state_slots",
           [](const Cache& c, const IntArg& k) { return unwrap(c.num_state_slots(to_int("state_group", k))); },
           py::arg("state_group"),
           "Physical state slots of a State group (max_active_seqs * D + min(max_step_tokens, "
           "max_active_seqs * D) + batch.state_snapshots): every slot a plan or commit names is below it, and a byte layer of the "
           "group keeps this many states (state[l][slot]). InvalidArgumentError: state_group outside [0, "
           "n_state_groups).")
      .def("state_snapshots",
           [](const Cache& c, const IntArg& k) { return unwrap(c.state_snapshots(to_int("state_group", k))); },
           py::arg("state_group"),
           "Named state snapshots a State group keeps now, at most batch.state_snapshots: a committed step "
           "whose length ends a full block of known tokens names the state after it, and adopt_prefix starts "
           "a prompt with that prefix from it (docs/batch.md section 10). InvalidArgumentError: "
           "state_group outside [0, n_state_groups).")
      .def("group_policy",
           [](const Cache& c, const IntArg& group) { return unwrap(c.group_policy(to_int("group", group))); },
           py::arg("group"), "The policy of a group's layers. InvalidArgumentError: bad group.")
      .def("layer_config",
           [](const Cache& c, const IntArg& layer) { return unwrap(c.layer_config(to_int("layer", layer))); },
           py::arg("layer"), "A layer's policy and row shape. InvalidArgumentError: bad layer.");
  bind_batch_cache_blocks(cls);
  bind_batch_cache_sequences(cls);
  bind_batch_cache_steps(cls);
  cls
      .def("visible",
           [](const Cache& c, const IntArg& group, const IntArg& seq, const IntArg& q, const IntArg& k) {
             return unwrap(c.visible(to_int("group", group), to_int("seq", seq), to_int("q", q), to_int("k", k)));
           },
           py::arg("group"), py::arg("seq"), py::arg("q"), py::arg("k"),
           "May the sequence's query at position q see its key at position k on the group's layers? "
           "InvalidArgumentError: group outside [0, n_groups), seq outside [0, max_seqs), or q or k "
           "negative.")
      .def("clear", &Cache::clear, "Ends every sequence and forgets every cached block.")
      .def("__repr__", [](const Cache& c) {
        return "BatchCache(max_seqs=" + std::to_string(c.max_seqs()) + ", n_groups=" + std::to_string(c.n_groups()) +
               ", block_size=" + std::to_string(c.block_size()) + ", capacity=" + std::to_string(c.capacity()) + ")";
      });
  bind_batch_prefix(cls, m);
}

}  // namespace kvcore_py
