// BatchCache's sequence verbs: add, release, fork, remove, rewind and adopt a prefix, one sequence or many.
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
#include "batch_arrays.h"
#include "batch_bindings.h"
#include "batch_sequence_info.h"
#include "errors.h"
#include "int_args.h"
#include "kvcore/batch/batch_cache.h"
#include "prefix_namespace.h"

namespace kvcore_py {

namespace {

using Cache = kvcore::BatchCache;
using CachePtr = std::shared_ptr<Cache>;

}  // namespace

void bind_batch_cache_sequences(BatchCacheClass& cls) {
  cls
      .def("sequence", [](const Cache& c, const IntArg& seq) { return snapshot_of(unwrap(c.sequence(to_int("seq", seq)))); },
           py::arg("seq"), "The sequence's SequenceInfo. InvalidArgumentError: seq out of range.")
      .def("length", [](const Cache& c, const IntArg& seq) { return unwrap(c.sequence(to_int("seq", seq))).length; },
           py::arg("seq"),
           "The sequence's committed length in positions (0 for an inactive one). "
           "InvalidArgumentError: seq outside [0, max_seqs).")
      .def("add_sequence",
           [](Cache& c, const IntArg& seq, const py::handle& ns) {
             const int s = to_int("seq", seq);
             throw_if_error(c.add_sequence(s, prefix_namespace_of(ns)));
           },
           py::arg("seq"), py::arg("namespace") = py::none(),
           "Starts an empty sequence (length 0) in prefix namespace `namespace`: None (the default "
           "namespace, 0), an int in [0, 2**64), or bytes / str hashed once (BLAKE2b, 8 bytes). Its "
           "full blocks are named, and its adopt_prefix looks prompts up, in that namespace only: "
           "give requests whose K/V differ for equal tokens (a tenant, LoRA adapter, model revision, "
           "multimodal input) their own. Forks inherit it. InvalidArgumentError: seq outside [0, "
           "max_seqs), a bad namespace. InvalidStateError: it is already active. CapacityError: "
           "max_active_seqs sequences are active (no table row is free).")
      .def("prefix_namespace", [](const Cache& c, const IntArg& seq) { return unwrap(c.prefix_namespace(to_int("seq", seq))); },
           py::arg("seq"),
           "The 64-bit prefix namespace the sequence names its blocks in (0: the default; 0 once "
           "released). InvalidArgumentError: seq outside [0, max_seqs).")
      .def("release_sequence", [](Cache& c, const IntArg& seq) { throw_if_error(c.release_sequence(to_int("seq", seq))); },
           py::arg("seq"),
           "Ends a sequence and releases its blocks. InvalidArgumentError: seq outside [0, max_seqs). "
           "InvalidStateError: it is not active.")
      .def("release_named_state", [](Cache& c, const IntArg& seq) { return unwrap(c.release_named_state(to_int("seq", seq))); },
           py::arg("seq"),
           "With batch.states_in_pool, seq stops holding the latest state it named in each State group, which it"
           " holds beyond its logical slots so that the state leaves with the blocks it ends. The state stays "
           "named (lookups still find it) and is cached, counted free and reclaimed least recently released "
           "first, once nothing else holds it; seq holds the next state it names. A scheduler short of blocks "
           "calls it before it preempts a sequence: a later hit traded for a running request. Returns the blocks"
           " it made free (0 without states in the pool). Ends a begun step, as every sequence verb does. "
           "InvalidArgumentError: seq outside [0, max_seqs). InvalidStateError: it is not active.")
      .def("fork",
           [](Cache& c, const IntArg& src, const IntArg& dst, const std::optional<IntArg>& upto) {
             const int s = to_int("src", src);
             const int at = upto ? to_int("upto", *upto) : (s >= 0 && s < c.max_seqs() ? unwrap(c.sequence(s)).length : 0);
             throw_if_error(c.fork(s, to_int("dst", dst), at));
           },
           py::arg("src"), py::arg("dst"), py::arg("upto") = py::none(),
           "dst inherits positions [0, upto) of src (default: all) by sharing blocks, copying no "
           "K/V. InvalidArgumentError: bad ids or upto. InvalidStateError: src not active, dst not "
           "empty, or src no longer holds what a query of dst at upto needs. CapacityError: dst is "
           "inactive and max_active_seqs sequences are active.")
      .def("remove",
           [](Cache& c, const IntArg& seq, const IntArg& p0, const std::optional<IntArg>& p1) {
             const int s = to_int("seq", seq);
             const int end = p1 ? to_int("p1", *p1) : 0x7fffffff;
             throw_if_error(c.remove(s, to_int("p0", p0), end));
           },
           py::arg("seq"), py::arg("p0"), py::arg("p1") = py::none(),
           "Positions [p0, p1) leave the sequence's history: it never sees them again; its length and "
           "positions do not change. A middle range becomes a hole, a head range moves visible_start; "
           "p0 < length <= p1 (or p1 = None) is a truncation, rewind(seq, p0); p0 >= length or p0 == p1 "
           "removes nothing: a successful no-op (llama.cpp's seq_rm), where rewind refuses p0 > length. "
           "InvalidArgumentError: seq "
           "outside [0, max_seqs), p0 < 0 or p1 < p0. InvalidStateError: seq not active, or a "
           "truncation that breaks the rewind rule (a ring group released history a query at p0 "
           "needs). CapacityError: the sequence would keep more than max_holes separate removed "
           "middle ranges.")
      .def("rewind", [](Cache& c, const IntArg& seq, const IntArg& n) { throw_if_error(c.rewind(to_int("seq", seq), to_int("n", n))); },
           py::arg("seq"), py::arg("n"),
           "length(seq) = n (positions); the sequence's blocks from index ceil(n / block_size) on are "
           "released. InvalidArgumentError: seq outside [0, max_seqs), n outside [0, length(seq)]. "
           "InvalidStateError: seq not active, or a ring group released history a query at n needs "
           "(can_rewind tells first).")
      .def("can_rewind",
           [](const Cache& c, const IntArg& seq, const IntArg& n) {
             int s = 0, v = 0;
             const PyInt seq_index = index_of("seq", seq), n_index = index_of("n", n);  // TypeError first
             return fits_int(seq_index, &s) && fits_int(n_index, &v) && c.can_rewind(s, v);
           },
           py::arg("seq"), py::arg("n"), "True exactly when rewind(seq, n) would succeed. Never raises.")
      .def("adopt_prefix",
           [](Cache& c, const IntArg& seq, const py::handle& tokens, const py::handle& ns) {
             const int s = to_int("seq", seq);
             const bool given = !ns.is_none();
             const std::uint64_t space = prefix_namespace_of(ns);
             IntArray ids("adopt_prefix", "tokens", tokens);
             // More than INT_MAX ids is more than any capacity: the cache refuses the clamped count.
             const int n = static_cast<int>(std::min<py::ssize_t>(ids.size(), INT_MAX));
             return unwrap(given ? c.adopt_prefix(s, ids.int32s(), n, space) : c.adopt_prefix(s, ids.int32s(), n));
           },
           py::arg("seq"), py::arg("tokens"), py::arg("namespace") = py::none(),
           "An empty active sequence adopts the longest cached prefix of `tokens` (a 1-D int32 or int64 "
           "array, or an ordered iterable of ints, not a set or dict; copied once) (full blocks, "
           "at most len(tokens) - 1 tokens) every group holds, in the sequence's prefix namespace; "
           "returns its length in positions, a multiple of block_size (0: a miss), which becomes the "
           "sequence's length. `namespace` (None: keep the sequence's, as add_sequence gave it) sets "
           "the namespace first (as add_sequence's). InvalidArgumentError: seq outside [0, "
           "max_seqs), len(tokens) > capacity, a bad namespace. InvalidStateError: seq not active, "
           "or not empty (length > 0).");
  cls
      .def("add_sequences", &add_sequences, py::arg("seqs"),
           "add_sequence for every id of seqs (an int32/int64 array or a list of ints), all or "
           "none: InvalidArgumentError names an id outside [0, max_seqs) or repeated, "
           "InvalidStateError one already active, CapacityError more ids than free_table_rows, and "
           "nothing changes. Empty seqs: changes nothing but ends a begun step, as every "
           "successful verb does.")
      .def("release_sequences", &release_sequences, py::arg("seqs"),
           "release_sequence for every id of seqs (an int32/int64 array or a list of ints), all or "
           "none: InvalidArgumentError names an id outside [0, max_seqs) or repeated, "
           "InvalidStateError one not active, and nothing changes. Empty seqs: changes nothing but "
           "ends a begun step, as every successful verb does.")
      .def("fork_many", &fork_many, py::arg("src"), py::arg("dsts"), py::arg("upto") = py::none(),
           "fork(src, dst, upto) for every dst of dsts (an int32/int64 array or a list of ints): "
           "each inherits positions [0, upto) of src (default: all) by sharing blocks, as for "
           "parallel sampling. All or none: InvalidArgumentError for a bad src, upto or dst id, a "
           "dst repeated or equal to src; InvalidStateError for src not active or no longer holding "
           "what a query at upto needs, or a dst not empty; CapacityError for more inactive dsts "
           "than free_table_rows; nothing changes then. Empty dsts (src and upto valid): changes "
           "nothing but ends a begun step, as every successful verb does.");
}

}  // namespace kvcore_py
