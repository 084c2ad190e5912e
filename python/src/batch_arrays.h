// BatchCache verbs over arrays (batch_arrays.cpp): a step's entries given as
// sequence ids, T per entry and token ids flat with per-entry offsets, and
// sequence verbs over many sequences. Each reads its arrays with no Python
// object per element (IntArray) and checks everything before changing
// anything: a refusal leaves the cache as it was.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "int_args.h"
#include "kvcore/batch/batch_cache.h"

namespace kvcore_py {

/// The entries of begin_step(seqs, T, tokens, token_offsets), read from arrays
/// (each copied once: `token_offsets` is read by the caller). Entries point
/// into `*token_ids` (the tokens' IntArray, emplaced here). InvalidArgumentError (or TypeError for a list item) on a
/// bad array; what the cache itself checks (ids in range, repeats, T,
/// capacity) it leaves to it.
std::vector<kvcore::StepEntry> array_tokens(const kvcore::BatchCache& c, const IntArray& seqs, py::handle T,
                                            py::handle tokens, const IntArray* token_offsets,
                                            std::optional<IntArray>* token_ids);

/// array_tokens, and with `parents` (not None) each entry's draft tree: flat
/// like the tokens (by token_offsets when given: T[i] values or none, a
/// chain; else T[i] each in entry order), copied into `*parent_ids`.
std::vector<kvcore::StepEntry> array_entries(const kvcore::BatchCache& c, const IntArray& seqs, py::handle T,
                                             py::handle tokens, py::handle token_offsets, py::handle parents,
                                             std::optional<IntArray>* token_ids, std::vector<int>* parent_ids);

/// add_sequences / release_sequences / fork_many: all or nothing.
void add_sequences(kvcore::BatchCache& c, py::handle seqs);
void release_sequences(kvcore::BatchCache& c, py::handle seqs);
void fork_many(kvcore::BatchCache& c, const IntArg& src, py::handle dsts, const std::optional<IntArg>& upto);

}  // namespace kvcore_py
