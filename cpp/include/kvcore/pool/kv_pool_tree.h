// Draft trees on KVPool (docs/design.md section 7): writing a tree step's node
// rows and performing a commit's row copies. A tree step's plan is the chain
// plan of T = N; node i goes to the row of chain index ci(i), i.e. the
// ci(i)-th row of the plan's write runs. Reads are the chain plan's reads
// (KVPool::gather / views / held_rows), masked by the tree (DraftTree::dense_mask).
// A State layer's nodes write state slots (write_state_tree) and node i starts
// from its parent's slot (node_read_slot); copy_rows copies slots alike.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kvcore/core/draft_tree.h"
#include "kvcore/pool/kv_pool.h"

namespace kvcore {

/// One past the last row `plan` writes, checked to be the tree step's plan on
/// `layer` (shape): N rows from the tree's position, every run inside the
/// layer's rows. InvalidArgument naming `what` otherwise.
inline Result<int> tree_write_end(const PoolLayer& shape, int layer, const SeqStepPlan& plan, const DraftTree& tree,
                                  const char* what) noexcept {
  KVCORE_CHECK_OR_RETURN_ERROR(
      plan.n_write >= 1 && plan.n_write <= SeqStepPlan::kMaxWriteRuns &&
          plan.write_len() == tree.size() && plan.write[0].pos == tree.position(),
      InvalidArgument,
      "%s of layer %d: the plan (%d write runs, %d rows) is not the tree's step (%d "
      "nodes at position %d)",
      what, layer, plan.n_write, plan.write_len(), tree.size(), tree.position());
  int end_row = 0;
  for (int i = 0; i < plan.n_write; ++i) {
    const Run& r = plan.write[i];
    KVCORE_CHECK_OR_RETURN_ERROR(r.row >= 0 && r.len >= 1 && static_cast<std::int64_t>(r.row) + r.len <= shape.rows,
                                 InvalidArgument,
                                 "%s of layer %d: write run %d (row %d, len %d) must lie in "
                                 "rows [0, %d)",
                                 what, layer, i, r.row, r.len, shape.rows);
    if (r.row + r.len > end_row) end_row = r.row + r.len;
  }
  return end_row;
}

/// Writes the tree step's N node rows on `layer`: input row i (node i; k:
/// k_row_bytes, v: v_row_bytes each, exactly N rows) goes to the row of chain
/// index tree.chain_indices()[i] in `plan` (`layer`'s plan of the tree step).
/// Grows the layer as KVPool::write does. InvalidArgument: bad layer, a write
/// run outside the layer's rows, a plan that is not the tree's step (its
/// write_len() != N or its first position != tree.position()), k/v null, not
/// exactly N rows, or overlapping the layer's storage (pass a copy); a
/// Shared or State layer (KVPool::check_writes_rows); nothing
/// is written. MemoryAllocationFailed: growth failed (nothing written).
inline Status write_tree(KVPool& pool, int layer, const SeqStepPlan& plan, const DraftTree& tree,
                         const void* k, std::size_t k_bytes, const void* v,
                         std::size_t v_bytes) noexcept {
  KVCORE_RETURN_IF_ERROR(pool.check_writes_rows(layer, "write_tree"));
  PoolLayer shape = *pool.layer(layer);
  KVCORE_ASSIGN_OR_RETURN(const int end_row, tree_write_end(shape, layer, plan, tree, "write_tree"));
  const std::size_t n = static_cast<std::size_t>(tree.size());
  KVCORE_CHECK_OR_RETURN_ERROR(k != nullptr && v != nullptr && k_bytes == n * shape.k_row_bytes &&
                                   v_bytes == n * shape.v_row_bytes,
                               InvalidArgument,
                               "write_tree of layer %d: k and v must be %d rows of %d and %d bytes "
                               "(got %d and %d bytes)",
                               layer, tree.size(), static_cast<int>(shape.k_row_bytes),
                               static_cast<int>(shape.v_row_bytes), static_cast<std::int64_t>(k_bytes),
                               static_cast<std::int64_t>(v_bytes));
  if (end_row > shape.allocated_rows) {
    KVCORE_RETURN_IF_ERROR(pool.reserve(layer, end_row));
    shape = *pool.layer(layer);  // the rows moved to new blocks
  }
  // Rows are written one at a time: an input inside the layer could be overwritten before it is read.
  const std::size_t k_all = shape.k_row_bytes * static_cast<std::size_t>(shape.storage_rows());
  const std::size_t v_all = shape.v_row_bytes * static_cast<std::size_t>(shape.storage_rows());
  auto apart = [](const void* a, std::size_t an, const void* b, std::size_t bn) {
    const std::uintptr_t x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
    return x + an <= y || y + bn <= x;
  };
  KVCORE_CHECK_OR_RETURN_ERROR(apart(k, k_bytes, shape.k, k_all) && apart(k, k_bytes, shape.v, v_all) &&
                                   apart(v, v_bytes, shape.k, k_all) && apart(v, v_bytes, shape.v, v_all),
                               InvalidArgument,
                               "write_tree of layer %d: k/v overlap the layer's rows: pass a copy", layer);
  for (int i = 0; i < tree.size(); ++i) {
    const std::size_t row = static_cast<std::size_t>(chain_row(plan, tree.chain_indices()[i]));
    std::memcpy(shape.k + shape.k_row_bytes * row,
                static_cast<const unsigned char*>(k) + shape.k_row_bytes * static_cast<std::size_t>(i),
                shape.k_row_bytes);
    std::memcpy(shape.v + shape.v_row_bytes * row,
                static_cast<const unsigned char*>(v) + shape.v_row_bytes * static_cast<std::size_t>(i),
                shape.v_row_bytes);
  }
  for (int i = 0; i < plan.n_write; ++i) KVPoolTraits::mirror_run(shape, plan.write[i]);
  return Error::Ok;
}

/// Ok when copy_rows(pool, layer, copies, n) would succeed (it copies
/// nothing): its errors, so that a caller copying several layers can check
/// them all first.
inline Status check_copies(const KVPool& pool, int layer, const TreeCopy* copies, int n) noexcept {
  KVCORE_ASSIGN_OR_RETURN(const PoolLayer shape, pool.layer(layer));
  KVCORE_CHECK_OR_RETURN_ERROR(n >= 0 && (n == 0 || copies != nullptr), InvalidArgument,
                               "copy_rows of layer %d: %d copies (copies null: %d)", layer, n,
                               copies == nullptr ? 1 : 0);
  for (int c = 0; c < n; ++c) {
    const TreeCopy& cp = copies[c];
    KVCORE_CHECK_OR_RETURN_ERROR(cp.src >= 0 && cp.src < shape.rows && cp.dst >= 0 && cp.dst < shape.rows,
                                 InvalidArgument,
                                 "copy_rows of layer %d: copy %d (row %d to row %d) must lie in rows "
                                 "[0, %d)",
                                 layer, c, cp.src, cp.dst, shape.rows);
    KVCORE_CHECK_OR_RETURN_ERROR(cp.src < shape.allocated_rows && cp.dst < shape.allocated_rows, InvalidState,
                                 "copy_rows of layer %d: copy %d (row %d to row %d) reaches rows the "
                                 "layer has not grown to (%d): write the tree step first",
                                 layer, c, cp.src, cp.dst, shape.allocated_rows);
  }
  return Error::Ok;
}

/// Performs a commit's row copies on `layer`, in order: the K and V of row
/// copies[c].src to row copies[c].dst (SequenceCache::commit_copies(layer);
/// on a State layer the state slot src to slot dst, on a Shared layer none),
/// before the next step is written. InvalidArgument: bad layer, n < 0, copies
/// null with n > 0, a row outside [0, rows); InvalidState: a row the layer has
/// not grown to (the tree step was not written). Nothing is copied on an error.
inline Status copy_rows(KVPool& pool, int layer, const TreeCopy* copies, int n) noexcept {
  KVCORE_RETURN_IF_ERROR(check_copies(pool, layer, copies, n));
  const PoolLayer shape = *pool.layer(layer);
  for (int c = 0; c < n; ++c) {
    const std::size_t src = static_cast<std::size_t>(copies[c].src), dst = static_cast<std::size_t>(copies[c].dst);
    std::memmove(shape.k + shape.k_row_bytes * dst, shape.k + shape.k_row_bytes * src, shape.k_row_bytes);
    if (shape.v_row_bytes != 0)  // a State layer's slots have no V
      std::memmove(shape.v + shape.v_row_bytes * dst, shape.v + shape.v_row_bytes * src, shape.v_row_bytes);
    KVPoolTraits::mirror_run(shape, Run{copies[c].dst, 1, 0});
  }
  return Error::Ok;
}

/// write_state() for a tree step on State layer `layer`: input slot i (node
/// i's state after its token, k_row_bytes bytes; exactly N slots) goes to
/// node i's slot, the slot of chain index tree.chain_indices()[i] in `plan`
/// (SequenceCache::tree_rows). InvalidArgument (nothing written): bad layer,
/// not a State layer, a plan that is not the tree's step, a write run outside
/// the slots, `states` null, not exactly N slots or overlapping the slots.
inline Status write_state_tree(KVPool& pool, int layer, const SeqStepPlan& plan, const DraftTree& tree,
                               const void* states, std::size_t bytes) noexcept {
  KVCORE_RETURN_IF_ERROR(pool.check_state_layer(layer, "write_state_tree"));
  const PoolLayer shape = *pool.layer(layer);
  KVCORE_RETURN_IF_ERROR(tree_write_end(shape, layer, plan, tree, "write_state_tree").status());
  KVCORE_RETURN_IF_ERROR(
      KVPool::check_state_input(shape, layer, "write_state_tree", states, bytes, tree.size()));
  for (int i = 0; i < tree.size(); ++i) {
    const std::size_t slot = static_cast<std::size_t>(chain_row(plan, tree.chain_indices()[i]));
    std::memcpy(shape.k + shape.k_row_bytes * slot,
                static_cast<const unsigned char*>(states) + shape.k_row_bytes * static_cast<std::size_t>(i),
                shape.k_row_bytes);
  }
  return Error::Ok;
}

/// The state slot node `node` of the tree step starts from on State layer
/// `layer`: its parent's slot (where write_state_tree put the parent's
/// state); the root's is the plan's read slot, -1 when the plan reads none
/// (position 0: zeros). InvalidArgument: bad layer, not a State layer, a plan
/// that is not the tree's step (or reads more than one slot), node outside [0, N).
inline Result<int> node_read_slot(const KVPool& pool, int layer, const SeqStepPlan& plan, const DraftTree& tree,
                                  int node) noexcept {
  KVCORE_RETURN_IF_ERROR(pool.check_state_layer(layer, "node_read_slot"));
  const PoolLayer shape = *pool.layer(layer);
  KVCORE_RETURN_IF_ERROR(tree_write_end(shape, layer, plan, tree, "node_read_slot").status());
  KVCORE_CHECK_OR_RETURN_ERROR(node >= 0 && node < tree.size(), InvalidArgument,
                               "node_read_slot of layer %d: node = %d: must be in [0, N = %d)", layer, node,
                               tree.size());
  const int parent = tree.parents()[node];
  if (parent >= 0) return chain_row(plan, tree.chain_indices()[parent]);
  KVCORE_CHECK_OR_RETURN_ERROR(plan.n_read <= 1 && (plan.n_read == 0 || plan.read[0].len == 1), InvalidArgument,
                               "node_read_slot of layer %d: the plan reads %d runs of %d slots: a step starts "
                               "from one state (none at position 0)",
                               layer, plan.n_read, plan.read_len());
  if (plan.n_read == 0) return -1;
  const Run& r = plan.read[0];
  KVCORE_CHECK_OR_RETURN_ERROR(r.row >= 0 && r.row < shape.rows, InvalidArgument,
                               "node_read_slot of layer %d: read slot %d: must be in [0, D = %d)", layer, r.row,
                               shape.rows);
  return r.row;
}

}  // namespace kvcore
