// Draft-tree helpers tree.cpp defines for the other bindings: the commit of a
// Step (step.cpp's Step, sequence_cache.cpp's SequenceCache), the masks of a tree step
// (step_mask.cpp's Step.mask), and a commit's row copies as an array (batch_step_entries.cpp).
#pragma once

#include <pybind11/numpy.h>

#include <cstdint>

#include "kvcore/core/draft_tree.h"
#include "step_handle.h"

namespace kvcore_py {

namespace py = pybind11;

/// Commits `h` (None: a plain commit, returns None) or its accepted root path
/// (returns per layer the (n, 2) int32 row copies). Raises as the core refuses.
py::object commit_step(const StepHandle& h, py::handle accepted);

/// A new (n, 2) int32 array [src row, dst row] of `n` row copies.
py::array_t<std::int32_t> copies_array(const kvcore::TreeCopy* copies, int n);

/// (T, read_len) mask of a tree step over `layer`'s plan read, position order.
py::array dense_tree_mask(const StepHandle& h, int layer);

/// (T, held rows) mask of a tree step over `layer`'s rows as they lie.
py::array tree_row_mask(const StepHandle& h, int layer);

}  // namespace kvcore_py
