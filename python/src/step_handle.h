// A Python Step: the C++ Step plus the cache that began it (kept alive).
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <vector>

#include "kvcore/core/sequence_cache.h"

namespace kvcore_py {

struct StepHandle {
  std::shared_ptr<kvcore::SequenceCache> cache;
  kvcore::Step step;
  // Step.is_tree: begun by begin_tree with nodes that branch (a chain given to
  // begin_tree is a chain, as a chain entry of a BatchCache step).
  bool branched = false;
  // Step.mask's read-only arrays, one per distinct policy and read order, made
  // on first use.
  std::vector<pybind11::object> masks{};      // position order
  std::vector<pybind11::object> row_masks{};  // row order
  // parents, positions, chain_index, tree_mask_packed (tree.cpp), made on first use.
  std::vector<pybind11::object> tree_arrays{};
};

}  // namespace kvcore_py
