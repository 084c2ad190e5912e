// PagedKVPool: reference CPU storage for a many-sequence cache (BatchCache, or
// any BatchPlanner). Each layer keeps K and V as the rows of its group's block
// pool: num_blocks(group) * block_size rows of n_kv_heads x head_dim elements
// (V: n_kv_heads x value_dim), row-major [rows, heads, dim], in one element
// type chosen at construction. Row r of a layer is row r of its group's pool:
// block r / B, offset r % B, exactly as the plan's slots and block tables name
// it. The pool moves bytes; it never interprets elements. When the planner's
// groups draw their blocks from one pool (BatchCache), a layer shares the
// storage of the layer storage_layer() names (group g's j-th layer with every
// other group's j-th) when their rows have one size: a block is then one page
// of memory whichever group holds it, and the pool's bytes follow the blocks
// in use, not the number of groups.
//
// Per step and layer, update() performs the group's block copies (copy-on-write
// of shared, partly filled blocks), then writes the step's new rows to their
// slots. Attention then reads either
//  - rows(layer): the layer's live rows [0, used_blocks * B) as one zero-copy
//    span, masked by fill_step_mask() (batch/step_mask.h), for backends that
//    attend over a pool at once; or
//  - gather(layer, plan, entry): one sequence's visible history, contiguous and
//    in increasing positions, for backends that attend per sequence.
//
// Two modes, as KVPool:
//  - growing (create): each layer starts at min(initial_rows, rows) rows and
//    doubles, up to its rows, when a slot, a copy or the live rows reach
//    further; blocks come from a PoolAllocator, and a failed growth leaves the
//    pool as it was;
//  - arena (in_arena): one caller-provided block sized by required_bytes();
//    nothing is allocated, not even the layer table.
// Rows never written read as zeros in both modes. Nothing on the step path
// (update without growth, rows, gather, the state verbs, apply_copies)
// allocates. Every plan is checked against the pool before anything is written.
//
// The kinds of docs/design.md section 9, as KVPool stores them: a Shared
// layer stores nothing (every read verb answers from its source's rows, in
// the source's group; update on it is refused naming the source, since the
// source's update already wrote what it reads); a State layer stores its
// State group's num_state_slots() physical slots of a size the caller gives
// (StateSlotBytes: the pool never interprets a state's bytes), allocated in
// full at creation (or carved in the arena), indexed exactly as the plan's
// StateGroupPlan read_slots / write_slots name them (vLLM / SGLang
// `state_indices`), written and read with the state verbs (write_state,
// read_state, state_slot); apply_copies performs a tree commit's slot copies
// in every State layer of each State group. The K/V verbs refuse a State
// layer and the state verbs the other kinds, by name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kvcore/batch/batch_plan.h"
#include "kvcore/core/result.h"
#include "kvcore/pool/parts/paged_reads.h"
#include "kvcore/pool/quantize.h"

namespace kvcore {

/// The paged pool: PagedReads (and below it PagedStates, PagedStorage) plus
/// creation, the step's update and a tree commit's copies.
class PagedKVPool : public PagedReads {
 public:
  /// A growing pool for `planner`'s layers (shapes from layer_config(l), rows
  /// from num_blocks(group_of(l)) * block_size()), each starting at
  /// min(initial_rows, rows) rows; a Shared layer has no storage; a State
  /// layer's num_state_slots(state_group_of(l)) slots of
  /// state_slot_bytes.bytes[l] bytes are allocated in full (zeros). The
  /// planner must outlive the pool. InvalidArgument: dtype outside DType,
  /// allocator without both functions, initial_rows < 0, block_size < 1, a
  /// State layer without a slot size (or of 0 bytes), or a layer whose bytes
  /// overflow the address space. NotSupported: a State layer whose states
  /// live in another layer's pages (the planner's batch.states_in_pool).
  /// MemoryAllocationFailed: the layer table or the initial blocks cannot be
  /// allocated (nothing is kept).
  static Result<PagedKVPool> create(const BatchPlanner& planner, DType dtype,
                                    PoolAllocator allocator = PoolAllocator::heap(),
                                    int initial_rows = kDefaultInitialRows,
                                    StateSlotBytes state_slot_bytes = {}) noexcept {
    KVCORE_RETURN_IF_ERROR(check_dtype(dtype));
    KVCORE_RETURN_IF_ERROR(check_allocator(allocator));
    KVCORE_CHECK_OR_RETURN_ERROR(initial_rows >= 0, InvalidArgument,
                                 "initial_rows = %d: must be >= 0", initial_rows);
    PagedKVPool pool(planner, dtype, allocator);
    KVCORE_RETURN_IF_ERROR(
        pool.build(planner.n_layers(), initial_rows, PlannerShape{planner, dtype, state_slot_bytes}));
    for (int l = 0; l < pool.n_layers_; ++l) {  // every state slot from the start: the step path never grows one
      if (pool.layers_[l].policy.kind == LayerPolicy::Kind::State)
        KVCORE_RETURN_IF_ERROR(pool.grow(l, pool.layers_[l].rows));
    }
    return pool;
  }

  /// Bytes in_arena() needs for `planner`'s layers, alignment slack included
  /// (any arena address works); State layers' slots of state_slot_bytes
  /// included. InvalidArgument: dtype outside DType, block_size < 1, a State
  /// layer without a slot size (or of 0 bytes), or the total overflows the
  /// address space.
  static Result<std::size_t> required_bytes(const BatchPlanner& planner, DType dtype,
                                            StateSlotBytes state_slot_bytes = {}) noexcept {
    KVCORE_RETURN_IF_ERROR(check_dtype(dtype));
    return arena_bytes(planner.n_layers(), PlannerShape{planner, dtype, state_slot_bytes});
  }

  /// A pool whose table, rows and state slots all live in `arena` (at least
  /// required_bytes(planner, dtype, state_slot_bytes) bytes, any alignment).
  /// Allocates nothing; the arena and the planner must outlive the pool.
  /// InvalidArgument: dtype outside DType, null arena, arena too small (the
  /// message names both sizes), or what required_bytes() refuses.
  static Result<PagedKVPool> in_arena(const BatchPlanner& planner, DType dtype, void* arena,
                                      std::size_t arena_bytes_given,
                                      StateSlotBytes state_slot_bytes = {}) noexcept {
    KVCORE_RETURN_IF_ERROR(check_dtype(dtype));
    PagedKVPool pool(planner, dtype, PoolAllocator{});
    KVCORE_RETURN_IF_ERROR(pool.carve(arena, arena_bytes_given, planner.n_layers(),
                                      PlannerShape{planner, dtype, state_slot_bytes}));
    return pool;
  }

  /// Applies `layer`'s part of the step's plan: first every block copy of the
  /// layer's group, in order (all B rows of src to dst), then the step's
  /// n_tokens new rows, input row t (k: k_row_bytes, v: v_row_bytes each) to
  /// row slots[t]. Grows the layer (growing mode) so that it holds every slot,
  /// every copied block and every live row (used_blocks * B). InvalidArgument:
  /// bad layer; a plan whose block_size is not the pool's, without the
  /// layer's group, with n_tokens < 0, n_copies < 0 or null arrays; a slot
  /// outside the layer's rows; a copy outside its blocks; k/v not exactly
  /// n_tokens rows, null, or overlapping the layer's own storage (pass a copy);
  /// a Shared layer (it writes nothing: update its source, whose rows it
  /// reads; the message names the source) or a State layer (write_state).
  /// MemoryAllocationFailed: growth failed. Nothing is written on any error.
  Status update(int layer, const BatchStepPlan& plan, const void* k, std::size_t k_bytes,
                const void* v, std::size_t v_bytes) noexcept {
    KVCORE_RETURN_IF_ERROR(check_writes_rows(layer, "update"));
    const PagedLayer& shape = layers_[layer];
    return update_with(layer, plan, "update", k, k_bytes, shape.k_row_bytes, v, v_bytes, shape.v_row_bytes,
                       [](const PagedLayer& stored, std::size_t slot, const unsigned char* k_row,
                          const unsigned char* v_row) {
                         std::memcpy(stored.k + stored.k_row_bytes * slot, k_row, stored.k_row_bytes);
                         std::memcpy(stored.v + stored.v_row_bytes * slot, v_row, stored.v_row_bytes);
                       });
  }

  /// update() for values: the step's rows as n_kv_heads x head_dim (V:
  /// value_dim) values of `in_type` each; a quantized pool (QInt8, Fp8E4M3)
  /// quantizes every (row, head) into its slot's row, scales and zero points
  /// included (quantize.h), after the block copies; a plain pool takes only
  /// its own dtype and writes as update(). InvalidArgument (nothing written):
  /// as update(); `in_type` not float32, float16 or bfloat16 (or, for a plain
  /// pool, not its dtype); a value that is not finite or a (row, head) whose
  /// range passes FLT_MAX. MemoryAllocationFailed: growth failed.
  Status update_values(int layer, const BatchStepPlan& plan, DType in_type, const void* k,
                       std::size_t k_bytes, const void* v, std::size_t v_bytes) noexcept {
    KVCORE_RETURN_IF_ERROR(check_writes_rows(layer, "update_values"));
    if (!is_quantized(dtype_)) {
      KVCORE_CHECK_OR_RETURN_ERROR(in_type == dtype_, InvalidArgument,
                                   "update_values of layer %d: values of %s, the pool stores %s", layer,
                                   to_string(in_type), to_string(dtype_));
      return update(layer, plan, k, k_bytes, v, v_bytes);
    }
    KVCORE_RETURN_IF_ERROR(check_compute_type(layer, "update_values", "values", in_type));
    const PagedLayer& shape = layers_[layer];
    const std::size_t k_in = value_row_bytes(shape.n_kv_heads, shape.head_dim, in_type);
    const std::size_t v_in = value_row_bytes(shape.n_kv_heads, shape.value_dim, in_type);
    const std::int64_t n = plan.n_tokens < 0 ? 0 : plan.n_tokens;
    if (k_bytes == k_in * static_cast<std::size_t>(n) && k != nullptr) {
      KVCORE_RETURN_IF_ERROR(
          check_quantizable("update_values", "k", layer, in_type, k, n, shape.n_kv_heads, shape.head_dim));
    }
    if (v_bytes == v_in * static_cast<std::size_t>(n) && v != nullptr) {
      KVCORE_RETURN_IF_ERROR(
          check_quantizable("update_values", "v", layer, in_type, v, n, shape.n_kv_heads, shape.value_dim));
    }
    const DType format = dtype_;
    return update_with(layer, plan, "update_values", k, k_bytes, k_in, v, v_bytes, v_in,
                       [format, in_type](const PagedLayer& stored, std::size_t slot, const unsigned char* k_row,
                                         const unsigned char* v_row) {
                         quantize_row(format, stored.n_kv_heads, stored.head_dim, in_type, k_row,
                                      stored.k + stored.k_row_bytes * slot);
                         quantize_row(format, stored.n_kv_heads, stored.value_dim, in_type, v_row,
                                      stored.v + stored.v_row_bytes * slot);
                       });
  }

  /// Performs a tree commit's copies (BatchCache::commit(step, accepted)):
  /// in every layer that stores K/V rows, its group's row copies, in order, K
  /// and V of row src to row dst; in every State layer, its State group's
  /// slot copies, in order, the state in physical slot src to slot dst (a
  /// Shared layer stores nothing: its source's copies serve it). Call it once
  /// per commit, before the next step's update. InvalidArgument (nothing
  /// copied): a commit of another group or State group count (a commit
  /// without its state_groups on a cache with State groups among them), a row
  /// copy outside a layer's stored rows, a slot copy outside [0, num_slots).
  Status apply_copies(const BatchCommit& commit) noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(commit.n_groups == planner_->n_groups() && (commit.groups != nullptr || commit.n_groups == 0),
                                 InvalidArgument, "apply_copies: a commit of %d groups, the pool's cache has %d",
                                 commit.n_groups, planner_->n_groups());
    KVCORE_CHECK_OR_RETURN_ERROR(
        commit.n_state_groups == planner_->n_state_groups() &&
            (commit.state_groups != nullptr || commit.n_state_groups == 0),
        InvalidArgument,
        "apply_copies: a commit of %d State groups, the pool's cache has %d (pass the whole commit: its "
        "state_groups carry the slot copies)",
        commit.n_state_groups, planner_->n_state_groups());
    for (int l = 0; l < n_layers(); ++l) {
      const PagedLayer& layer = layers_[l];
      if (layer.policy.kind == LayerPolicy::Kind::Shared) continue;
      const bool state = layer.policy.kind == LayerPolicy::Kind::State;
      const GroupCommit& gc = state ? commit.state_groups[layer.state_group] : commit.groups[layer.group];
      KVCORE_CHECK_OR_RETURN_ERROR(gc.n_copies >= 0 && (gc.n_copies == 0 || gc.copies != nullptr), InvalidArgument,
                                   "apply_copies: layer %d's %s %d has n_copies = %d (copies %s): must be >= 0 "
                                   "with its array set",
                                   l, state ? "State group" : "group", state ? layer.state_group : layer.group,
                                   gc.n_copies, gc.copies != nullptr ? "set" : "null");
      for (int c = 0; c < gc.n_copies; ++c) {
        const TreeCopy cp = gc.copies[c];
        KVCORE_CHECK_OR_RETURN_ERROR(cp.src >= 0 && cp.dst >= 0 && cp.src < layer.allocated_rows &&
                                         cp.dst < layer.allocated_rows,
                                     InvalidArgument,
                                     "apply_copies: %slayer %d's copy %d (%s %d -> %s %d) must lie in its %d %s",
                                     state ? "State " : "", l, c, state ? "slot" : "row", cp.src,
                                     state ? "slot" : "row", cp.dst, layer.allocated_rows,
                                     state ? "state slots" : "stored rows");
      }
    }
    for (int l = 0; l < n_layers(); ++l) {
      const PagedLayer& layer = layers_[l];
      if (layer.policy.kind == LayerPolicy::Kind::Shared) continue;
      const bool state = layer.policy.kind == LayerPolicy::Kind::State;
      const GroupCommit& gc = state ? commit.state_groups[layer.state_group] : commit.groups[layer.group];
      for (int c = 0; c < gc.n_copies; ++c) {
        const std::size_t src = static_cast<std::size_t>(gc.copies[c].src), dst = static_cast<std::size_t>(gc.copies[c].dst);
        // memmove: a caller-built commit may name src == dst (kv_pool_tree.h's copy_rows does the same).
        std::memmove(layer.k + layer.k_row_bytes * dst, layer.k + layer.k_row_bytes * src, layer.k_row_bytes);
        if (!state)
          std::memmove(layer.v + layer.v_row_bytes * dst, layer.v + layer.v_row_bytes * src, layer.v_row_bytes);
      }
    }
    return Error::Ok;
  }

  /// Deprecated alias of apply_copies (removed in kvcore 0.2.0): performs a
  /// tree commit's copies, with apply_copies's errors.
  [[deprecated("PagedKVPool::apply_commit: use apply_copies (removed in kvcore 0.2.0)")]]
  Status apply_commit(const BatchCommit& commit) noexcept {
    return apply_copies(commit);
  }

 private:
  PagedKVPool(const BatchPlanner& planner, DType dtype, PoolAllocator allocator) noexcept
      : PagedReads(planner, dtype, allocator) {}

  // update()'s checks, growth and block copies; then write_row(layer, slot, k
  // row, v row) per new token, the input rows k_in_row / v_in_row bytes each.
  template <typename WriteRow>
  Status update_with(int layer, const BatchStepPlan& plan, const char* what, const void* k,
                     std::size_t k_bytes, std::size_t k_in_row, const void* v, std::size_t v_bytes,
                     std::size_t v_in_row, WriteRow write_row) noexcept {
    KVCORE_RETURN_IF_ERROR(check_plan(layer, plan, /*gather=*/false));
    const PagedLayer& shape = layers_[layer];
    const GroupPlan& gp = plan.groups[shape.group];
    const std::int64_t B = block_size_;
    KVCORE_CHECK_OR_RETURN_ERROR(
        (plan.n_tokens == 0 || gp.slots != nullptr) && gp.n_copies >= 0 &&
            (gp.n_copies == 0 || gp.copies != nullptr),
        InvalidArgument,
        "update of layer %d: group %d's plan has n_copies = %d (copies %s, slots %s): counts must "
        "be >= 0 and arrays set",
        layer, shape.group, gp.n_copies, gp.copies != nullptr ? "set" : "null",
        gp.slots != nullptr ? "set" : "null");
    // Every row the step touches must lie in the layer; the storage must reach
    // the furthest of them and every live row.
    std::int64_t end_row = 0;
    const int n_blocks = static_cast<int>(shape.rows / B);
    for (int c = 0; c < gp.n_copies; ++c) {
      const BlockCopy& cp = gp.copies[c];
      KVCORE_CHECK_OR_RETURN_ERROR(
          cp.src >= 0 && cp.src < n_blocks && cp.dst >= 0 && cp.dst < n_blocks, InvalidArgument,
          "update of layer %d: copy %d (block %d -> block %d) must lie in blocks [0, %d)",
          layer, c, cp.src, cp.dst, n_blocks);
      const std::int64_t reach = (static_cast<std::int64_t>(cp.src > cp.dst ? cp.src : cp.dst) + 1) * B;
      if (reach > end_row) end_row = reach;
    }
    for (int t = 0; t < plan.n_tokens; ++t) {
      const int slot = gp.slots[t];
      KVCORE_CHECK_OR_RETURN_ERROR(slot >= 0 && slot < shape.rows, InvalidArgument,
                                   "update of layer %d: token %d's slot %d must lie in rows [0, %d)",
                                   layer, t, slot, shape.rows);
      if (slot + 1 > end_row) end_row = slot + 1;
    }
    KVCORE_RETURN_IF_ERROR(check_buffer(layer, what, "k", k, k_bytes, plan.n_tokens, k_in_row,
                                        /*exact=*/true));
    KVCORE_RETURN_IF_ERROR(check_buffer(layer, what, "v", v, v_bytes, plan.n_tokens, v_in_row,
                                        /*exact=*/true));
    // Copies and scattered writes could overwrite input rows before they are
    // read: an input inside the layer's own storage is refused.
    const std::size_t k_storage = shape.k_row_bytes * static_cast<std::size_t>(shape.allocated_rows);
    const std::size_t v_storage = shape.v_row_bytes * static_cast<std::size_t>(shape.allocated_rows);
    const bool apart = disjoint(k, k_bytes, shape.k, k_storage) && disjoint(k, k_bytes, shape.v, v_storage) &&
                       disjoint(v, v_bytes, shape.k, k_storage) && disjoint(v, v_bytes, shape.v, v_storage);
    KVCORE_CHECK_OR_RETURN_ERROR(apart, InvalidArgument,
                                 "update of layer %d: k/v overlap the layer's own rows: pass a copy",
                                 layer);
    KVCORE_ASSIGN_OR_RETURN(const int used, planner_->used_blocks(shape.group));
    const std::int64_t live = static_cast<std::int64_t>(used) * B;
    if (live > end_row) end_row = live < shape.rows ? live : shape.rows;
    if (end_row > shape.allocated_rows) {
      KVCORE_RETURN_IF_ERROR(grow(layer, grown_rows(shape, static_cast<int>(end_row))));
    }
    const PagedLayer& stored = layers_[layer];
    const std::size_t k_block = stored.k_row_bytes * static_cast<std::size_t>(B);
    const std::size_t v_block = stored.v_row_bytes * static_cast<std::size_t>(B);
    for (int c = 0; c < gp.n_copies; ++c) {
      const BlockCopy& cp = gp.copies[c];
      if (cp.src == cp.dst) continue;
      std::memcpy(stored.k + k_block * static_cast<std::size_t>(cp.dst),
                  stored.k + k_block * static_cast<std::size_t>(cp.src), k_block);
      std::memcpy(stored.v + v_block * static_cast<std::size_t>(cp.dst),
                  stored.v + v_block * static_cast<std::size_t>(cp.src), v_block);
    }
    const unsigned char* k_in = static_cast<const unsigned char*>(k);
    const unsigned char* v_in = static_cast<const unsigned char*>(v);
    for (int t = 0; t < plan.n_tokens; ++t) {
      write_row(stored, static_cast<std::size_t>(gp.slots[t]), k_in + k_in_row * static_cast<std::size_t>(t),
                v_in + v_in_row * static_cast<std::size_t>(t));
    }
    return Error::Ok;
  }
};

}  // namespace kvcore
