// BatchCache's steps: begin_step (or step), commit and abort (the entries' parsing: batch_step_entries.cpp).
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
#include "batch_step_handle.h"
#include "errors.h"
#include "int_args.h"
#include "kvcore/batch/batch_cache.h"

namespace kvcore_py {

namespace {

using Cache = kvcore::BatchCache;
using CachePtr = std::shared_ptr<Cache>;

}  // namespace

void bind_batch_cache_steps(BatchCacheClass& cls) {
  cls
      .def("begin_step", &begin_batch_step, py::arg("entries"), py::arg("T") = py::none(), py::arg("tokens") = py::none(),
           py::arg("token_offsets") = py::none(), py::arg("parents") = py::none(), py::kw_only(),
           py::arg("verify") = false,
           "Begins one forward; replaces an uncommitted step. Two forms:\n"
           "  begin_step(entries): entries [(seq, T), (seq, T, tokens) or (seq, T, tokens, parents), ...] "
           "(tokens: T ids, for prefix reuse, or None; parents: T ints making the tokens a draft tree of "
           "N = T nodes, parents[0] = -1 and 0 <= parents[i] < i, node i at position length + depth(i)), "
           "laid out entry after entry.\n"
           "  begin_step(seqs, T, tokens=None, token_offsets=None, parents=None): the same as arrays, with no Python "
           "object per entry: seqs the sequence of each entry; T one int for all or one per entry; "
           "tokens the step's ids flat, entry after entry (sum(T) of them), or with token_offsets "
           "(n + 1 values from 0 to len(tokens), non-decreasing) entry i's are "
           "tokens[token_offsets[i]:token_offsets[i + 1]], T[i] of them or none. Arrays: int32 or "
           "int64, 1-D, contiguous (numpy, array.array, a CPU torch tensor through DLPack) or lists "
           "of ints; int32 tokens are read in place. parents (arrays): the entries' trees flat like the "
           "tokens (by token_offsets when given: T[i] values or none, a chain; else T[i] each).\n"
           "verify (keyword, either form): True makes every entry a verify step, one that may be rewound into "
           "(speculative decoding): the State groups keep the state after each of its positions (needs T <= "
           "D - 1, D = state_group_policy(k).slots); False (the default) keeps only each entry's last. Or "
           "one bool per entry, in entry order (a list, a numpy bool array). A tree keeps every node's "
           "state anyway; models without State layers ignore it.\n"
           "T is the sequence's new tokens (positions) in this step. InvalidArgumentError: no entries "
           "or more than max_seqs, an entry not as above, seq outside [0, "
           "max_seqs), a sequence twice, T outside [1, max_step], more than max_step_tokens tokens "
           "in all, len(tokens) != T, parents not a tree in topological order (parents[0] != -1, a "
           "second root, parents[i] outside [0, i)) or not T of them; an array of another dtype, ndim "
           "or length, not contiguous, a "
           "value beyond 32 bits, token_offsets not as above; verify neither a bool nor one bool per entry "
           "(the message names the value), a verify entry with T > D - 1 of a State group. InvalidStateError: "
           "a sequence not active, or a State group no longer holds the state after length - 1 (an aborted "
           "step of T = k * D without verify: rewind first). CapacityError: length + T would pass capacity (positions), or a group's pool has "
           "fewer free blocks than the step needs. TypeError: entries neither. On any error nothing "
           "changes (a begun step stays begun).")
      .def("step", &begin_batch_step, py::arg("entries"), py::arg("T") = py::none(), py::arg("tokens") = py::none(),
           py::arg("token_offsets") = py::none(), py::arg("parents") = py::none(), py::kw_only(),
           py::arg("verify") = false,
          "begin_step(...) in either form, for `with cache.step(seqs, T) as step:`; raises as begin_step.");
  cls
      .def("commit", &commit_batch_step, py::arg("step"), py::arg("accepted") = py::none(),
           "commit(step) commits the begun step whole (every entry's length grows by its T) and returns "
           "None. commit(step, accepted) commits draft trees: accepted maps a sequence to its accepted "
           "root path of node ids ({seq: [0, a1, ...]} or [(seq, nodes), ...]; nodes[0] = 0, each the "
           "child of the one before); its length grows by len(nodes), position length + d holding node "
           "nodes[d]. Unlisted entries must be chains and commit whole. Blocks reserved only for rejected "
           "nodes return to their pools. Returns one (n_copies, 2) int32 array per group of rows (src, "
           "dst) to copy, in order, in every layer of the group before the next step (none when a path "
           "is its tree's main line, at most len(nodes) - 1 otherwise), then one per State group "
           "(index n_groups + k: physical state slots (src, dst), the state in slot src to slot dst in "
           "every layer of State group k, in order), n_groups + n_state_groups arrays in all; afterwards "
           "the cache is as if the sequence had decoded the accepted tokens as a chain (a verify chain "
           "for the State groups: each accepted node's state in the slot its position's chain token "
           "would have written). InvalidStateError: a stale step or "
           "one of another cache. InvalidArgumentError (nothing changes): a tree entry committed "
           "without a path, a sequence not in the step or listed twice, an empty path or one longer "
           "than N, a node outside [0, N), nodes not a root path; accepted not as above.")
      .def("abort",
           [](Cache& c, const BatchStepHandle& h) {
             if (h.cache.get() != &c) raise(kvcore::Error::InvalidState, "abort: the step belongs to another cache");
             throw_if_error(c.abort(h.step));
           },
           py::arg("step"),
           "Ends the begun step without committing it (a failed forward): every length, block "
           "table and count is as before it began. InvalidStateError: a stale step or one of "
           "another cache; nothing changes.");
}

}  // namespace kvcore_py
