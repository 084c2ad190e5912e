// BatchCache's blocks: what each group's pool holds, frees and caches, and a sequence's block table.
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
#include "batch_sequence_info.h"
#include "errors.h"
#include "int_args.h"
#include "kvcore/batch/batch_cache.h"

namespace kvcore_py {

namespace {

using Cache = kvcore::BatchCache;
using CachePtr = std::shared_ptr<Cache>;

// blocks_needed(seq, T): a list of n_groups ints; with arrays, an (n, n_groups) int32 array of
// the entries' needs, each counted alone (a scheduler weighs a step's entries in one call).
py::object blocks_needed(const Cache& c, const py::object& seq, const py::object& T) {
  const std::size_t groups = static_cast<std::size_t>(c.n_groups());
  std::vector<int> need(groups);
  if (as_index(seq) && as_index(T)) {
    throw_if_error(c.blocks_needed(to_int("seq", IntArg{seq}), to_int("T", IntArg{T}), need.data()));
    return py::cast(need);
  }
  const IntArray seqs("blocks_needed", "seq", seq), ts("blocks_needed", "T", T);
  if (seqs.size() != ts.size())
    raise(kvcore::Error::InvalidArgument, "blocks_needed: seq (" + std::to_string(seqs.size()) + " entries) and T (" +
                                              std::to_string(ts.size()) + "): must be arrays of one length");
  py::array_t<std::int32_t> out({seqs.size(), static_cast<py::ssize_t>(groups)});
  std::int32_t* w = out.mutable_data();
  for (py::ssize_t i = 0; i < seqs.size(); ++i) {
    const kvcore::Status status = c.blocks_needed(seqs.at(i), ts.at(i), need.data());
    if (!status.ok())
      raise(status.code(), "entry " + std::to_string(i) + ": " + status.message().c_str());
    std::copy(need.begin(), need.end(), w + static_cast<std::size_t>(i) * groups);
  }
  return std::move(out);
}

// block_table(seq, group): a copy of the sequence's table row, its committed blocks.
py::array_t<std::int32_t> block_table(const Cache& c, const IntArg& seq_arg, const IntArg& group_arg) {
  const int seq = to_int("seq", seq_arg), group = to_int("group", group_arg);
  if (seq < 0 || seq >= c.max_seqs())
    raise(kvcore::Error::InvalidArgument, "block_table: sequence " + std::to_string(seq) + " must be in [0, max_seqs = " +
                                              std::to_string(c.max_seqs()) + ")");
  if (group < 0 || group >= c.n_groups())
    raise(kvcore::Error::InvalidArgument, "block_table: group = " + std::to_string(group) + ": must be in [0, n_groups = " +
                                              std::to_string(c.n_groups()) + ")");
  const kvcore::SequenceInfo info = unwrap(c.sequence(seq));
  const std::int64_t B = c.block_size();
  const py::ssize_t n = info.active ? static_cast<py::ssize_t>((info.length + B - 1) / B) : 0;
  py::array_t<std::int32_t> out(n);
  std::int32_t* ids = out.mutable_data();
  for (py::ssize_t i = 0; i < n; ++i) ids[i] = c.block_at(seq, group, static_cast<int>(i));  // either layout
  return out;
}

}  // namespace

void bind_batch_cache_blocks(BatchCacheClass& cls) {
  cls
      .def("num_blocks", [](const Cache& c, const IntArg& group) { return unwrap(c.num_blocks(to_int("group", group))); },
           py::arg("group"),
           "Blocks of the one pool every group draws from (the same for every group; a layer's rows: "
           "num_blocks * block_size). InvalidArgumentError: group outside [0, n_groups).")
      .def("used_blocks", [](const Cache& c, const IntArg& group) { return unwrap(c.used_blocks(to_int("group", group))); },
           py::arg("group"),
           "One past the highest block of the one pool any sequence holds (the same for every group): "
           "every live row lies in rows [0, used_blocks * block_size) (allocation takes the lowest free "
           "block). InvalidArgumentError: group outside [0, n_groups).")
      .def("held_blocks", [](const Cache& c, const IntArg& group) { return unwrap(c.held_blocks(to_int("group", group))); },
           py::arg("group"),
           "Blocks of the one pool the group's sequences hold now: how the budget splits between the "
           "groups (the sum over groups is num_blocks - free_blocks). InvalidArgumentError: group "
           "outside [0, n_groups).")
      .def("storage_layer", [](const Cache& c, const IntArg& layer) { return unwrap(c.storage_layer(to_int("layer", layer))); },
           py::arg("layer"),
           "The layer whose storage this layer's K/V rows may share: group g's j-th K/V layer shares with "
           "the first layer that is any group's j-th (the groups draw their blocks from one pool, so a "
           "block is one page of those layers' memory whichever group holds it); a byte layer shares when "
           "the rows have one size. Shared and State layers: themselves. InvalidArgumentError: bad layer.")
      .def("free_blocks", [](const Cache& c, const IntArg& group) { return unwrap(c.free_blocks(to_int("group", group))); },
           py::arg("group"),
           "Blocks of the one pool no sequence holds (reclaimable cached ones included; the same for every "
           "group). InvalidArgumentError: group outside [0, n_groups).")
      .def("blocks_needed", &blocks_needed, py::arg("seq"), py::arg("T"),
           "The blocks a step entry of T tokens of seq takes in each group (new blocks, and private copies "
           "of blocks other sequences hold or that are named), a list of n_groups ints, as begin_step counts "
           "them: begin_step admits a step when its entries' sum over every group is at most free_blocks "
           "(plus what a begun step it replaces took), so requests admitted one by one can add their needs up "
           "and begin the step once. Array form: seq and T 1-D int arrays (or lists) of one length n, the "
           "entries of a step a scheduler weighs (each counted alone, as begin_step adds them up): an int32 "
           "array (n, n_groups), one call instead of n. Changes nothing. InvalidArgumentError: seq outside "
           "[0, max_seqs), T outside [1, max_step], seq and T not both ints or both arrays of one length; "
           "InvalidStateError: seq not active; CapacityError: length + T > capacity (the array form's "
           "message names the entry).")
      .def("table_pages_needed",
           [](const Cache& c, const IntArg& seq, const IntArg& T) {
             return unwrap(c.table_pages_needed(to_int("seq", seq), to_int("T", T)));
           },
           py::arg("seq"), py::arg("T"),
           "The table pages a step entry of T tokens of seq takes over every group (paged tables: the pages its "
           "rows lack for the block indices it writes; 0 unpaged): begin_step admits a step when its entries' sum "
           "is at most free_table_pages. Changes nothing. InvalidArgumentError: seq outside [0, max_seqs), T "
           "outside [1, max_step]; InvalidStateError: seq not active; CapacityError: length + T > capacity.")
      .def("state_blocks_needed",
           [](const Cache& c, const IntArg& seq, const IntArg& T, const py::object& verify) {
             const std::optional<bool> flag = verify_flag(verify);
             if (!flag)
               raise(kvcore::Error::InvalidArgument,
                     "verify = " + py::repr(verify).cast<std::string>() + ": must be a bool (or 0 / 1)");
             return unwrap(c.state_blocks_needed(to_int("seq", seq), to_int("T", T), *flag));
           },
           py::arg("seq"), py::arg("T"), py::arg("verify") = false,
           "With batch.states_in_pool, the pool's blocks a step entry of T tokens of seq takes for its states "
           "in every State group, as begin_step counts them (one per state kept: every token's with verify, "
           "else the last, whose logical slot names no physical slot, a shared or a named one); 0 without. "
           "begin_step admits a step when its entries' blocks_needed over every group plus these fit the "
           "pool's free blocks. Changes nothing. InvalidArgumentError: seq outside [0, max_seqs), T outside "
           "[1, max_step], verify not a bool (or 0 / 1, as begin_step takes it), a verify entry of T > D - 1; "
           "InvalidStateError: seq not active; "
           "CapacityError: length + T > capacity.")
      .def("cached_blocks",
           [](const Cache& c, const IntArg& group) { return unwrap(c.cached_blocks(to_int("group", group))); },
           py::arg("group"),
           "Free blocks of the group that still hold a reusable prefix (reclaimed least recently released "
           "first, whatever their group). InvalidArgumentError: group outside [0, n_groups).")
      .def("blocks_held",
           [](const Cache& c, const IntArg& seq, const IntArg& group) {
             return unwrap(c.blocks_held(to_int("seq", seq), to_int("group", group)));
           },
           py::arg("seq"), py::arg("group"),
           "Blocks of a group the sequence holds (0 for an inactive one), shared ones included. "
           "InvalidArgumentError: seq outside [0, max_seqs) or group outside [0, n_groups).")
      .def("oldest_held",
           [](const Cache& c, const IntArg& seq, const IntArg& group) {
             return unwrap(c.oldest_held(to_int("seq", seq), to_int("group", group)));
           },
           py::arg("seq"), py::arg("group"),
           "The oldest position whose block the group still holds for the sequence (its length in "
           "positions when it holds none). InvalidArgumentError: seq outside [0, max_seqs) or group outside [0, n_groups).")
      .def("block_table", &block_table, py::arg("seq"), py::arg("group"),
           "block_table(seq, group) -> int32 (ceil(length / block_size),): the block id holding each "
           "block of the sequence's committed positions in the group's pool, by block index (block i "
           "holds positions [i * block_size, (i + 1) * block_size), its rows [id * block_size, (id + 1) "
           "* block_size) of every layer of the group); -1 for a block the group released or never kept "
           "(a ring's passed window, a removed range). A new array (a copy: later verbs do not change "
           "it); empty for an inactive sequence. Between steps it names where the rows lie; during a "
           "begun step it already names the step's copy-on-write destinations. InvalidArgumentError: seq "
           "outside [0, max_seqs) or group outside [0, n_groups).");
}

}  // namespace kvcore_py
