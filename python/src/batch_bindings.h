// What the BatchCache registrars share (batch_cache.cpp and the files that add
// its verbs): the class they add to, and the step verbs BatchStep also calls.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <optional>

#include "batch_step_handle.h"
#include "kvcore/batch/batch_cache.h"

namespace kvcore_py {

namespace py = pybind11;

using BatchCacheClass = py::class_<kvcore::BatchCache, kvcore::CacheBase, std::shared_ptr<kvcore::BatchCache>>;

/// num_blocks, used_blocks, ..., block_table: the blocks each group holds (batch_cache_blocks.cpp).
void bind_batch_cache_blocks(BatchCacheClass& cls);
/// sequence, add_sequence, fork, remove, rewind, adopt_prefix and their many-sequence forms
/// (batch_cache_sequences.cpp).
void bind_batch_cache_sequences(BatchCacheClass& cls);
/// begin_step, step, commit and abort (batch_cache_steps.cpp).
void bind_batch_cache_steps(BatchCacheClass& cls);

/// begin_step(entries) or begin_step(seqs, T, tokens, token_offsets, parents): the
/// array form when T is given (batch_step_entries.cpp).
BatchStepHandle begin_batch_step(const std::shared_ptr<kvcore::BatchCache>& c, const py::handle& entries,
                                 const py::handle& T, const py::handle& tokens, const py::handle& token_offsets,
                                 const py::handle& parents, const py::handle& verify);

/// One verify flag: a bool (numpy's too) or an int 0 or 1; nullopt otherwise
/// (batch_step_entries.cpp: begin_step's verify and state_blocks_needed's).
std::optional<bool> verify_flag(const py::handle& x);

/// commit(step) or commit(step, accepted): the row copies per group and State
/// group, (n, 2) int32 arrays (new), or None for a plain commit.
py::object commit_batch_step(kvcore::BatchCache& c, const BatchStepHandle& h, const py::handle& accepted);

}  // namespace kvcore_py
