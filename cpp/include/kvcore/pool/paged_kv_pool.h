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
// (update without growth, rows, gather, the state verbs, apply_commit)
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
// read_state, state_slot); apply_commit performs a tree commit's slot copies
// in every State layer of each State group. The K/V verbs refuse a State
// layer and the state verbs the other kinds, by name.
#pragma once

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kvcore/batch/batch_faces.h"
#include "kvcore/batch/batch_plan.h"
#include "kvcore/core/config.h"
#include "kvcore/core/result.h"
#include "kvcore/pool/dtype.h"
#include "kvcore/pool/pool_allocator.h"
#include "kvcore/pool/pool_bytes.h"
#include "kvcore/pool/pool_storage.h"
#include "kvcore/pool/quantize.h"

namespace kvcore {

/// Shape and storage of one layer of a PagedKVPool (rows: num_blocks(group) *
/// block_size). A Shared layer: its source's group and row shape, rows = 0
/// (no storage). A State layer: group = -1, rows = num_state_slots(state_group)
/// slots of k_row_bytes bytes each, v_row_bytes = 0 and no heads.
struct PagedLayer : LayerStorage {
  /// The layer's group (its block pool; a Shared layer's: its source's; -1
  /// for a State layer) and the layer's own policy (its kind; a Shared
  /// layer's source).
  int group = 0;
  LayerPolicy policy;
  /// A State layer's State group (planner.state_group_of(layer)), else -1.
  int state_group = -1;

  /// Rows the storage blocks hold now: allocated_rows.
  std::int64_t storage_rows() const noexcept { return allocated_rows; }
};

/// A layer's live rows [0, rows) as one zero-copy span (rows = used_blocks * B):
/// row r is block r / B, offset r % B of the group's pool.
struct PagedRows {
  const unsigned char* k = nullptr;
  const unsigned char* v = nullptr;
  int rows = 0;
};

/// What PoolStorage needs to know of PagedKVPool's layers (see pool_storage.h).
struct PagedKVPoolTraits {
  using Layer = PagedLayer;
  static constexpr PoolNames kNames{"paged pool", "paged layer", "paged arena", "the paged layer "};

  /// A negative layer count, or one whose table does not fit.
  static Status bad_table(int n_layers) noexcept {
    return Status::make(Error::InvalidArgument,
                        "n_layers = %d: the planner's layer count must be >= 0 and its table fit the "
                        "address space",
                        n_layers);
  }

  /// A growth needs nothing more: every row is a slot.
  static void grown(PagedLayer&) noexcept {}
};

class PagedKVPool : public PoolStorage<PagedKVPoolTraits> {
 public:
  /// Every K and V block of an arena starts on this boundary.
  static constexpr std::size_t kArenaAlignment = PoolBytes::kArenaAlignment;
  /// Rows a growing layer starts with (capped at its rows).
  static constexpr int kDefaultInitialRows = 256;

  /// A growing pool for `planner`'s layers (shapes from layer_config(l), rows
  /// from num_blocks(group_of(l)) * block_size()), each starting at
  /// min(initial_rows, rows) rows; a Shared layer has no storage; a State
  /// layer's num_state_slots(state_group_of(l)) slots of
  /// state_slot_bytes.bytes[l] bytes are allocated in full (zeros). The
  /// planner must outlive the pool. InvalidArgument: dtype outside DType,
  /// allocator without both functions, initial_rows < 0, block_size < 1, a
  /// State layer without a slot size (or of 0 bytes), or a layer whose bytes
  /// overflow the address space. MemoryAllocationFailed: the layer table or
  /// the initial blocks cannot be allocated (nothing is kept).
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

  /// Rows per block, B (the planner's block_size()).
  int block_size() const noexcept { return block_size_; }

  /// Bytes of every layer's live rows [0, used_blocks * B) now: what rows()
  /// spans once the step's update has stored them (rows a growing pool has
  /// not reached yet are counted too; a storage several layers share,
  /// once); a State layer's slots in full (always stored), a Shared layer's
  /// none. A group the planner no longer knows
  /// counts 0.
  std::size_t used_bytes() const noexcept {
    std::size_t n = 0;
    for (int l = 0; l < n_layers_; ++l) {
      const PagedLayer& layer = layers_[l];
      if (layer.policy.kind == LayerPolicy::Kind::Shared || layer.storage_of >= 0) continue;  // counted once
      if (layer.policy.kind == LayerPolicy::Kind::State) {
        n += layer.k_row_bytes * static_cast<std::size_t>(layer.rows);
        continue;
      }
      Result<int> used = planner_->used_blocks(layer.group);
      if (!used.ok()) continue;
      n += (layer.k_row_bytes + layer.v_row_bytes) * static_cast<std::size_t>(*used) *
           static_cast<std::size_t>(block_size_);
    }
    return n;
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
  Status update(int layer_index, const BatchStepPlan& plan, const void* k, std::size_t k_bytes,
                const void* v, std::size_t v_bytes) noexcept {
    KVCORE_RETURN_IF_ERROR(check_writes_rows(layer_index, "update"));
    const PagedLayer& shape = layers_[layer_index];
    return update_with(layer_index, plan, "update", k, k_bytes, shape.k_row_bytes, v, v_bytes, shape.v_row_bytes,
                       [](const PagedLayer& layer, std::size_t slot, const unsigned char* k_row,
                          const unsigned char* v_row) {
                         std::memcpy(layer.k + layer.k_row_bytes * slot, k_row, layer.k_row_bytes);
                         std::memcpy(layer.v + layer.v_row_bytes * slot, v_row, layer.v_row_bytes);
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
  Status update_values(int layer_index, const BatchStepPlan& plan, DType in_type, const void* k,
                       std::size_t k_bytes, const void* v, std::size_t v_bytes) noexcept {
    KVCORE_RETURN_IF_ERROR(check_writes_rows(layer_index, "update_values"));
    if (!is_quantized(dtype_)) {
      KVCORE_CHECK_OR_RETURN_ERROR(in_type == dtype_, InvalidArgument,
                                   "update_values of layer %d: values of %s, the pool stores %s", layer_index,
                                   to_string(in_type), to_string(dtype_));
      return update(layer_index, plan, k, k_bytes, v, v_bytes);
    }
    KVCORE_RETURN_IF_ERROR(check_compute_type(layer_index, "update_values", "values", in_type));
    const PagedLayer& shape = layers_[layer_index];
    const std::size_t k_in = value_row_bytes(shape.n_kv_heads, shape.head_dim, in_type);
    const std::size_t v_in = value_row_bytes(shape.n_kv_heads, shape.value_dim, in_type);
    const std::int64_t n = plan.n_tokens < 0 ? 0 : plan.n_tokens;
    if (k_bytes == k_in * static_cast<std::size_t>(n) && k != nullptr) {
      KVCORE_RETURN_IF_ERROR(
          check_quantizable("update_values", "k", layer_index, in_type, k, n, shape.n_kv_heads, shape.head_dim));
    }
    if (v_bytes == v_in * static_cast<std::size_t>(n) && v != nullptr) {
      KVCORE_RETURN_IF_ERROR(
          check_quantizable("update_values", "v", layer_index, in_type, v, n, shape.n_kv_heads, shape.value_dim));
    }
    const DType format = dtype_;
    return update_with(layer_index, plan, "update_values", k, k_bytes, k_in, v, v_bytes, v_in,
                       [format, in_type](const PagedLayer& layer, std::size_t slot, const unsigned char* k_row,
                                         const unsigned char* v_row) {
                         quantize_row(format, layer.n_kv_heads, layer.head_dim, in_type, k_row,
                                      layer.k + layer.k_row_bytes * slot);
                         quantize_row(format, layer.n_kv_heads, layer.value_dim, in_type, v_row,
                                      layer.v + layer.v_row_bytes * slot);
                       });
  }

 private:
  // update()'s checks, growth and block copies; then write_row(layer, slot, k
  // row, v row) per new token, the input rows k_in_row / v_in_row bytes each.
  template <typename WriteRow>
  Status update_with(int layer_index, const BatchStepPlan& plan, const char* what, const void* k,
                     std::size_t k_bytes, std::size_t k_in_row, const void* v, std::size_t v_bytes,
                     std::size_t v_in_row, WriteRow write_row) noexcept {
    KVCORE_RETURN_IF_ERROR(check_plan(layer_index, plan, /*gather=*/false));
    const PagedLayer& shape = layers_[layer_index];
    const GroupPlan& gp = plan.groups[shape.group];
    const std::int64_t B = block_size_;
    KVCORE_CHECK_OR_RETURN_ERROR(
        (plan.n_tokens == 0 || gp.slots != nullptr) && gp.n_copies >= 0 &&
            (gp.n_copies == 0 || gp.copies != nullptr),
        InvalidArgument,
        "update of layer %d: group %d's plan has n_copies = %d (copies %s, slots %s): counts must "
        "be >= 0 and arrays set",
        layer_index, shape.group, gp.n_copies, gp.copies != nullptr ? "set" : "null",
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
          layer_index, c, cp.src, cp.dst, n_blocks);
      const std::int64_t reach = (static_cast<std::int64_t>(cp.src > cp.dst ? cp.src : cp.dst) + 1) * B;
      if (reach > end_row) end_row = reach;
    }
    for (int t = 0; t < plan.n_tokens; ++t) {
      const int slot = gp.slots[t];
      KVCORE_CHECK_OR_RETURN_ERROR(slot >= 0 && slot < shape.rows, InvalidArgument,
                                   "update of layer %d: token %d's slot %d must lie in rows [0, %d)",
                                   layer_index, t, slot, shape.rows);
      if (slot + 1 > end_row) end_row = slot + 1;
    }
    KVCORE_RETURN_IF_ERROR(check_buffer(layer_index, what, "k", k, k_bytes, plan.n_tokens, k_in_row,
                                        /*exact=*/true));
    KVCORE_RETURN_IF_ERROR(check_buffer(layer_index, what, "v", v, v_bytes, plan.n_tokens, v_in_row,
                                        /*exact=*/true));
    // Copies and scattered writes could overwrite input rows before they are
    // read: an input inside the layer's own storage is refused.
    const std::size_t k_storage = shape.k_row_bytes * static_cast<std::size_t>(shape.allocated_rows);
    const std::size_t v_storage = shape.v_row_bytes * static_cast<std::size_t>(shape.allocated_rows);
    const bool apart = disjoint(k, k_bytes, shape.k, k_storage) && disjoint(k, k_bytes, shape.v, v_storage) &&
                       disjoint(v, v_bytes, shape.k, k_storage) && disjoint(v, v_bytes, shape.v, v_storage);
    KVCORE_CHECK_OR_RETURN_ERROR(apart, InvalidArgument,
                                 "update of layer %d: k/v overlap the layer's own rows: pass a copy",
                                 layer_index);
    KVCORE_ASSIGN_OR_RETURN(const int used, planner_->used_blocks(shape.group));
    const std::int64_t live = static_cast<std::int64_t>(used) * B;
    if (live > end_row) end_row = live < shape.rows ? live : shape.rows;
    if (end_row > shape.allocated_rows) {
      KVCORE_RETURN_IF_ERROR(grow(layer_index, grown_rows(shape, static_cast<int>(end_row))));
    }
    const PagedLayer& layer = layers_[layer_index];
    const std::size_t k_block = layer.k_row_bytes * static_cast<std::size_t>(B);
    const std::size_t v_block = layer.v_row_bytes * static_cast<std::size_t>(B);
    for (int c = 0; c < gp.n_copies; ++c) {
      const BlockCopy& cp = gp.copies[c];
      if (cp.src == cp.dst) continue;
      std::memcpy(layer.k + k_block * static_cast<std::size_t>(cp.dst),
                  layer.k + k_block * static_cast<std::size_t>(cp.src), k_block);
      std::memcpy(layer.v + v_block * static_cast<std::size_t>(cp.dst),
                  layer.v + v_block * static_cast<std::size_t>(cp.src), v_block);
    }
    const unsigned char* k_in = static_cast<const unsigned char*>(k);
    const unsigned char* v_in = static_cast<const unsigned char*>(v);
    for (int t = 0; t < plan.n_tokens; ++t) {
      write_row(layer, static_cast<std::size_t>(gp.slots[t]), k_in + k_in_row * static_cast<std::size_t>(t),
                v_in + v_in_row * static_cast<std::size_t>(t));
    }
    return Error::Ok;
  }

 public:

  /// Performs a tree commit's copies (BatchCache::commit(step, accepted)):
  /// in every layer that stores K/V rows, its group's row copies, in order, K
  /// and V of row src to row dst; in every State layer, its State group's
  /// slot copies, in order, the state in physical slot src to slot dst (a
  /// Shared layer stores nothing: its source's copies serve it). Call it once
  /// per commit, before the next step's update. InvalidArgument (nothing
  /// copied): a commit of another group or State group count (a commit
  /// without its state_groups on a cache with State groups among them), a row
  /// copy outside a layer's stored rows, a slot copy outside [0, num_slots).
  Status apply_commit(const BatchCommit& commit) noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(commit.n_groups == planner_->n_groups() && (commit.groups != nullptr || commit.n_groups == 0),
                                 InvalidArgument, "apply_commit: a commit of %d groups, the pool's cache has %d",
                                 commit.n_groups, planner_->n_groups());
    KVCORE_CHECK_OR_RETURN_ERROR(
        commit.n_state_groups == planner_->n_state_groups() &&
            (commit.state_groups != nullptr || commit.n_state_groups == 0),
        InvalidArgument,
        "apply_commit: a commit of %d State groups, the pool's cache has %d (pass the whole commit: its "
        "state_groups carry the slot copies)",
        commit.n_state_groups, planner_->n_state_groups());
    for (int l = 0; l < n_layers(); ++l) {
      const PagedLayer& layer = layers_[l];
      if (layer.policy.kind == LayerPolicy::Kind::Shared) continue;
      const bool state = layer.policy.kind == LayerPolicy::Kind::State;
      const GroupCommit& gc = state ? commit.state_groups[layer.state_group] : commit.groups[layer.group];
      KVCORE_CHECK_OR_RETURN_ERROR(gc.n_copies >= 0 && (gc.n_copies == 0 || gc.copies != nullptr), InvalidArgument,
                                   "apply_commit: layer %d's %s %d has n_copies = %d (copies %s): must be >= 0 "
                                   "with its array set",
                                   l, state ? "State group" : "group", state ? layer.state_group : layer.group,
                                   gc.n_copies, gc.copies != nullptr ? "set" : "null");
      for (int c = 0; c < gc.n_copies; ++c) {
        const TreeCopy cp = gc.copies[c];
        KVCORE_CHECK_OR_RETURN_ERROR(cp.src >= 0 && cp.dst >= 0 && cp.src < layer.allocated_rows &&
                                         cp.dst < layer.allocated_rows,
                                     InvalidArgument,
                                     "apply_commit: %slayer %d's copy %d (%s %d -> %s %d) must lie in its %d %s",
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

  /// The layer's live rows [0, used_blocks(group) * B) as one zero-copy span:
  /// every row any sequence's block table names lies in it. Attention over the
  /// whole pool at once masks it with fill_step_mask(plan, group, rows, mask).
  /// A span shows the rows as they are: valid until the layer
  /// grows (never in arena mode), current until a later update writes them.
  /// A Shared layer's span is its source's rows. InvalidArgument: bad layer,
  /// a State layer (state_slot). InvalidState: the live rows reach past the
  /// storage (update the layer for the begun step first).
  Result<PagedRows> rows(int layer_index_given) const noexcept {
    KVCORE_ASSIGN_OR_RETURN(const int layer_index, row_layer(layer_index_given, "rows"));
    const PagedLayer& layer = layers_[layer_index];
    KVCORE_ASSIGN_OR_RETURN(const int used, planner_->used_blocks(layer.group));
    const std::int64_t live = static_cast<std::int64_t>(used) * block_size_;
    KVCORE_CHECK_OR_RETURN_ERROR(
        live <= layer.allocated_rows, InvalidState,
        "rows of layer %d: %lld live rows (used_blocks * block_size), but the layer holds %d rows "
        "so far: update the layer for the step first",
        layer_index, static_cast<long long>(live), layer.allocated_rows);
    return PagedRows{layer.k, layer.v, static_cast<int>(live)};
  }

  /// Rows gather(layer, plan, entry) writes: the entry's visible positions
  /// (see gather). Errors as gather(), without the buffers.
  Result<int> gather_rows(int layer_index_given, const BatchStepPlan& plan, int entry) const noexcept {
    KVCORE_ASSIGN_OR_RETURN(const int layer_index, row_layer(layer_index_given, "gather_rows"));
    KVCORE_RETURN_IF_ERROR(check_plan(layer_index, plan, /*gather=*/true));
    return check_entry(layer_index, plan, entry);
  }

  /// One sequence's visible history, for backends that attend per sequence:
  /// every position k < context_lens[entry] that some query of the entry sees
  /// (k <= q, inside q's window or a sink, not removed), in increasing order,
  /// copied contiguously into k_out/v_out (rows of k_row_bytes / v_row_bytes),
  /// and, when `positions` is set, each row's position. A flat group gives
  /// every kept position; a ring group the sinks and [first - W + 1, context).
  /// Returns the rows written (gather_rows()). InvalidArgument: bad layer, a
  /// plan gather cannot use (as update), entry outside [0, n_entries), an
  /// entry whose positions or table do not fit, a visible position whose
  /// block is a hole or outside the pool, an output too small or null.
  /// InvalidState: a visible row lies past the storage (update the layer
  /// first). Nothing is written on any error. A Shared layer gathers its
  /// source's rows; a State layer is refused (InvalidArgument: read_state).
  Result<int> gather(int layer_index_given, const BatchStepPlan& plan, int entry, void* k_out,
                     std::size_t k_capacity, void* v_out, std::size_t v_capacity,
                     std::int64_t* positions = nullptr, std::size_t positions_capacity = 0) const noexcept {
    KVCORE_ASSIGN_OR_RETURN(const int layer_index, row_layer(layer_index_given, "gather"));
    const PagedLayer& shape = layers_[layer_index];
    return gather_with(layer_index, plan, entry, "gather", k_out, k_capacity, shape.k_row_bytes, v_out, v_capacity,
                       shape.v_row_bytes, positions, positions_capacity,
                       [](const PagedLayer& layer, std::size_t row, int len, unsigned char* k_at,
                          unsigned char* v_at) {
                         std::memcpy(k_at, layer.k + layer.k_row_bytes * row,
                                     layer.k_row_bytes * static_cast<std::size_t>(len));
                         std::memcpy(v_at, layer.v + layer.v_row_bytes * row,
                                     layer.v_row_bytes * static_cast<std::size_t>(len));
                       });
  }

  /// gather() for values: the entry's visible history dequantized into
  /// k_out/v_out as `out_type` values (rows of n_kv_heads x head_dim /
  /// value_dim). Only a quantized pool. Errors as gather(); InvalidArgument: a
  /// plain pool (use gather), `out_type` not float32, float16 or bfloat16.
  Result<int> gather_values(int layer_index_given, const BatchStepPlan& plan, int entry, DType out_type,
                            void* k_out, std::size_t k_capacity, void* v_out, std::size_t v_capacity,
                            std::int64_t* positions = nullptr, std::size_t positions_capacity = 0) const noexcept {
    KVCORE_ASSIGN_OR_RETURN(const int layer_index, row_layer(layer_index_given, "gather_values"));
    KVCORE_RETURN_IF_ERROR(check_dequantize(layer_index, "gather_values", out_type));
    const PagedLayer& shape = layers_[layer_index];
    const DType format = dtype_;
    return gather_with(layer_index, plan, entry, "gather_values", k_out, k_capacity,
                       value_row_bytes(shape.n_kv_heads, shape.head_dim, out_type), v_out, v_capacity,
                       value_row_bytes(shape.n_kv_heads, shape.value_dim, out_type), positions, positions_capacity,
                       [format, out_type](const PagedLayer& layer, std::size_t row, int len, unsigned char* k_at,
                                          unsigned char* v_at) {
                         dequantize_rows(format, layer.n_kv_heads, layer.head_dim, layer.k + layer.k_row_bytes * row,
                                         len, out_type, k_at);
                         dequantize_rows(format, layer.n_kv_heads, layer.value_dim,
                                         layer.v + layer.v_row_bytes * row, len, out_type, v_at);
                       });
  }

  /// rows() for values: the live rows dequantized into k_out/v_out as
  /// `out_type` values (at least rows x n_kv_heads x head_dim / value_dim);
  /// the result's k/v point at k_out/v_out. Only a quantized pool. Errors as
  /// rows(); InvalidArgument: a plain pool, another out_type, outputs too small.
  Result<PagedRows> rows_values(int layer_index_given, DType out_type, void* k_out, std::size_t k_capacity,
                                void* v_out, std::size_t v_capacity) const noexcept {
    KVCORE_ASSIGN_OR_RETURN(const PagedRows live, rows(layer_index_given));
    const int layer_index = layers_[layer_index_given].policy.kind == LayerPolicy::Kind::Shared
                                ? layers_[layer_index_given].policy.source
                                : layer_index_given;
    KVCORE_RETURN_IF_ERROR(check_dequantize(layer_index, "rows_values", out_type));
    const PagedLayer& layer = layers_[layer_index];
    KVCORE_RETURN_IF_ERROR(check_buffer(layer_index, "rows_values", "k_out", k_out, k_capacity, live.rows,
                                        value_row_bytes(layer.n_kv_heads, layer.head_dim, out_type), false));
    KVCORE_RETURN_IF_ERROR(check_buffer(layer_index, "rows_values", "v_out", v_out, v_capacity, live.rows,
                                        value_row_bytes(layer.n_kv_heads, layer.value_dim, out_type), false));
    dequantize_rows(dtype_, layer.n_kv_heads, layer.head_dim, live.k, live.rows, out_type, k_out);
    dequantize_rows(dtype_, layer.n_kv_heads, layer.value_dim, live.v, live.rows, out_type, v_out);
    return PagedRows{static_cast<const unsigned char*>(k_out), static_cast<const unsigned char*>(v_out), live.rows};
  }

  // --- layer kinds ---------------------------------------------------------------

  /// Ok when a step writes K/V rows into `layer_index` (a Flat, Ring or
  /// Chunked layer). InvalidArgument naming `what`: bad layer, a Shared layer
  /// (it writes nothing: its source's update writes the rows it reads), a
  /// State layer.
  Status check_writes_rows(int layer_index, const char* what) const noexcept {
    KVCORE_ASSIGN_OR_RETURN(const int from, row_layer(layer_index, what));
    KVCORE_CHECK_OR_RETURN_ERROR(from == layer_index, InvalidArgument,
                                 "%s: layer %d is Shared(%d): it writes nothing; update layer %d, then read "
                                 "this one (its reads answer from layer %d's rows)",
                                 what, layer_index, from, from, from);
    return Error::Ok;
  }


  // --- State layers ---------------------------------------------------------------

  /// Tokens [begin, end) of a step, in the plan's token order.
  struct StepTokens {
    int begin = 0;
    int end = 0;
  };

  /// Entry `entry`'s tokens [query_starts[entry], query_starts[entry + 1]).
  /// InvalidArgument: entry outside [0, n_entries), no query_starts, or
  /// starts outside [0, n_tokens].
  static Result<StepTokens> entry_tokens(const BatchStepPlan& plan, int entry) noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(entry >= 0 && entry < plan.n_entries && plan.query_starts != nullptr,
                                 InvalidArgument, "entry = %d: must be in [0, n_entries = %d) of a plan with "
                                 "query_starts", entry, plan.n_entries);
    const StepTokens t{plan.query_starts[entry], plan.query_starts[entry + 1]};
    KVCORE_CHECK_OR_RETURN_ERROR(t.begin >= 0 && t.begin <= t.end && t.end <= plan.n_tokens, InvalidArgument,
                                 "entry %d: tokens [%d, %d) must lie in [0, n_tokens = %d)", entry, t.begin,
                                 t.end, plan.n_tokens);
    return t;
  }

  /// States write_state(layer, plan, tokens, ...) takes: the tokens of
  /// [tokens.begin, tokens.end) whose write slot is set (every token of a
  /// verify step or a tree, the last of a chain step without verify). Errors
  /// as write_state, without the states.
  Result<int> kept_states(int layer_index, const BatchStepPlan& plan, StepTokens tokens) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_state_layer(layer_index, "kept_states"));
    KVCORE_ASSIGN_OR_RETURN(const StateGroupPlan* sp, check_state_plan(layer_index, plan, "kept_states"));
    return check_writes(layer_index, plan, *sp, tokens, "kept_states");
  }

  /// Copies the states the step keeps for tokens [tokens.begin, tokens.end)
  /// into their slots: the i-th of `states` (k_row_bytes bytes each; exactly
  /// kept_states() of them, in token order) goes to the physical slot
  /// write_slots[t] of the i-th token t of the range whose write slot is set,
  /// i.e. the state after t's position; tokens whose write slot is -1 take
  /// none. InvalidArgument (nothing written): bad layer, not a State layer, a
  /// plan without the layer's State group, with another num_slots or lacking
  /// its arrays, tokens outside [0, n_tokens], a write slot outside [-1,
  /// num_slots), `states` null or not exactly kept_states() slots, or
  /// overlapping the layer's slots (pass a copy).
  Status write_state(int layer_index, const BatchStepPlan& plan, StepTokens tokens, const void* states,
                     std::size_t bytes) noexcept {
    KVCORE_RETURN_IF_ERROR(check_state_layer(layer_index, "write_state"));
    KVCORE_ASSIGN_OR_RETURN(const StateGroupPlan* sp, check_state_plan(layer_index, plan, "write_state"));
    KVCORE_ASSIGN_OR_RETURN(const int kept, check_writes(layer_index, plan, *sp, tokens, "write_state"));
    const PagedLayer& layer = layers_[layer_index];
    KVCORE_RETURN_IF_ERROR(check_buffer(layer_index, "write_state", "states", states, bytes, kept,
                                        layer.k_row_bytes, /*exact=*/true));
    const std::size_t all = layer.k_row_bytes * static_cast<std::size_t>(layer.rows);
    KVCORE_CHECK_OR_RETURN_ERROR(disjoint(states, bytes, layer.k, all), InvalidArgument,
                                 "write_state of layer %d: the states overlap the layer's slots: pass a copy",
                                 layer_index);
    const unsigned char* in = static_cast<const unsigned char*>(states);
    for (int t = tokens.begin; t < tokens.end; ++t) {
      const int slot = sp->write_slots[t];
      if (slot < 0) continue;
      std::memcpy(layer.k + layer.k_row_bytes * static_cast<std::size_t>(slot), in, layer.k_row_bytes);
      in += layer.k_row_bytes;
    }
    return Error::Ok;
  }

  /// Copies the state step token `token` starts from into `out` (at least
  /// k_row_bytes bytes): the slot read_slots[token] names (the state after
  /// position - 1: an entry's first token's, a tree node's parent's, a kept
  /// previous token's), or zeros for a token at position 0. Read it before
  /// write_state() (an entry may write the slot it reads). InvalidArgument
  /// (nothing written): bad layer, not a State layer, a plan as write_state
  /// refuses, token outside [0, n_tokens), a read slot outside [-1,
  /// num_slots), a token past position 0 whose read slot is -1 (its state is
  /// carried within the forward from the previous token: the step does not
  /// keep it), a plan without positions for such a token, `out` null or too
  /// small.
  Status read_state(int layer_index, const BatchStepPlan& plan, int token, void* out,
                    std::size_t capacity) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_state_layer(layer_index, "read_state"));
    KVCORE_ASSIGN_OR_RETURN(const StateGroupPlan* sp, check_state_plan(layer_index, plan, "read_state"));
    const PagedLayer& layer = layers_[layer_index];
    KVCORE_CHECK_OR_RETURN_ERROR(token >= 0 && token < plan.n_tokens, InvalidArgument,
                                 "read_state of layer %d: token = %d: must be in [0, n_tokens = %d)", layer_index,
                                 token, plan.n_tokens);
    const int slot = sp->read_slots[token];
    KVCORE_CHECK_OR_RETURN_ERROR(slot >= -1 && slot < layer.rows, InvalidArgument,
                                 "read_state of layer %d: token %d's read slot %d must be -1 or in [0, "
                                 "num_slots = %d)",
                                 layer_index, token, slot, layer.rows);
    if (slot < 0) {
      KVCORE_CHECK_OR_RETURN_ERROR(plan.positions != nullptr, InvalidArgument,
                                   "read_state of layer %d: token %d reads no slot and the plan has no "
                                   "positions to tell position 0 (zeros) from a carried state",
                                   layer_index, token);
      KVCORE_CHECK_OR_RETURN_ERROR(plan.positions[token] == 0, InvalidArgument,
                                   "read_state of layer %d: token %d (position %d) reads no slot: the step "
                                   "keeps no state before it (a chain step without verify carries it within "
                                   "the forward from token %d)",
                                   layer_index, token, plan.positions[token], token - 1);
    }
    KVCORE_RETURN_IF_ERROR(check_buffer(layer_index, "read_state", "out", out, capacity, 1, layer.k_row_bytes,
                                        /*exact=*/false));
    if (slot < 0) {
      std::memset(out, 0, layer.k_row_bytes);
    } else {
      std::memmove(out, layer.k + layer.k_row_bytes * static_cast<std::size_t>(slot), layer.k_row_bytes);
    }
    return Error::Ok;
  }

  /// Physical slot `slot` of State layer `layer_index`, zero-copy:
  /// k_row_bytes bytes, for kernels that read and write slots themselves
  /// (vLLM / SGLang `state_indices`: the plan's StateGroupPlan read_slots and
  /// write_slots per token). Slot i of every layer is at state_slot(layer, 0)
  /// + i * k_row_bytes. Valid for the pool's life (a State layer never grows
  /// after creation). InvalidArgument: bad layer, not a State layer, slot
  /// outside [0, num_slots).
  Result<unsigned char*> state_slot(int layer_index, int slot) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_state_layer(layer_index, "state_slot"));
    const PagedLayer& layer = layers_[layer_index];
    KVCORE_CHECK_OR_RETURN_ERROR(slot >= 0 && slot < layer.rows, InvalidArgument,
                                 "state_slot of layer %d: slot = %d: must be in [0, num_slots = %d)", layer_index,
                                 slot, layer.rows);
    return layer.k + layer.k_row_bytes * static_cast<std::size_t>(slot);
  }

 private:
  // The State layer's StateGroupPlan in `plan`, checked: its group present,
  // its slot count the pool's, its arrays set.
  Result<const StateGroupPlan*> check_state_plan(int layer_index, const BatchStepPlan& plan,
                                                 const char* what) const noexcept {
    const PagedLayer& layer = layers_[layer_index];
    const int k = layer.state_group;
    KVCORE_CHECK_OR_RETURN_ERROR(plan.n_state_groups > k && plan.state_groups != nullptr && plan.n_tokens >= 0,
                                 InvalidArgument,
                                 "%s of layer %d: the plan (%d State groups, %d tokens) lacks the layer's State "
                                 "group %d",
                                 what, layer_index, plan.n_state_groups, plan.n_tokens, k);
    const StateGroupPlan& sp = plan.state_groups[k];
    KVCORE_CHECK_OR_RETURN_ERROR(
        sp.num_slots == layer.rows && (plan.n_tokens == 0 || (sp.read_slots != nullptr && sp.write_slots != nullptr)),
        InvalidArgument,
        "%s of layer %d: State group %d's plan (num_slots %d, read_slots %s, write_slots %s) does not fit the "
        "layer's %d slots or lacks an array",
        what, layer_index, k, sp.num_slots, sp.read_slots != nullptr ? "set" : "null",
        sp.write_slots != nullptr ? "set" : "null", layer.rows);
    return &sp;
  }

  // Tokens inside the step, every write slot of them in [-1, num_slots);
  // returns how many are set.
  Result<int> check_writes(int layer_index, const BatchStepPlan& plan, const StateGroupPlan& sp, StepTokens tokens,
                           const char* what) const noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(tokens.begin >= 0 && tokens.begin <= tokens.end && tokens.end <= plan.n_tokens,
                                 InvalidArgument, "%s of layer %d: tokens [%d, %d) must lie in [0, n_tokens = %d]",
                                 what, layer_index, tokens.begin, tokens.end, plan.n_tokens);
    const int n_slots = layers_[layer_index].rows;
    int kept = 0;
    for (int t = tokens.begin; t < tokens.end; ++t) {
      const int slot = sp.write_slots[t];
      KVCORE_CHECK_OR_RETURN_ERROR(slot >= -1 && slot < n_slots, InvalidArgument,
                                   "%s of layer %d: token %d's write slot %d must be -1 or in [0, num_slots = %d)",
                                   what, layer_index, t, slot, n_slots);
      if (slot >= 0) ++kept;
    }
    return kept;
  }

 public:

 private:
  Status check_dequantize(int layer_index, const char* what, DType out_type) const noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(is_quantized(dtype_), InvalidArgument,
                                 "%s of layer %d: the pool stores %s, not a quantized format (qint8, "
                                 "fp8_e4m3): read its rows as they are",
                                 what, layer_index, to_string(dtype_));
    return check_compute_type(layer_index, what, "values", out_type);
  }

  // gather()'s checks and walk; copy(layer, first row, len, k_at, v_at) moves
  // each stretch of consecutive rows, k_out_row / v_out_row bytes a row out.
  template <typename CopyRows>
  Result<int> gather_with(int layer_index, const BatchStepPlan& plan, int entry, const char* what, void* k_out,
                          std::size_t k_capacity, std::size_t k_out_row, void* v_out, std::size_t v_capacity,
                          std::size_t v_out_row, std::int64_t* positions, std::size_t positions_capacity,
                          CopyRows copy) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_plan(layer_index, plan, /*gather=*/true));
    KVCORE_ASSIGN_OR_RETURN(const int n, check_entry(layer_index, plan, entry));
    const PagedLayer& layer = layers_[layer_index];
    KVCORE_RETURN_IF_ERROR(check_buffer(layer_index, what, "k_out", k_out, k_capacity, n, k_out_row,
                                        /*exact=*/false));
    KVCORE_RETURN_IF_ERROR(check_buffer(layer_index, what, "v_out", v_out, v_capacity, n, v_out_row,
                                        /*exact=*/false));
    KVCORE_CHECK_OR_RETURN_ERROR(
        positions == nullptr || positions_capacity >= static_cast<std::size_t>(n), InvalidArgument,
        "gather of layer %d: positions holds %zu, needs %d", layer_index, positions_capacity, n);
    const int B = block_size_;
    const int* table = entry_table(layer, plan, entry);
    unsigned char* k_at = static_cast<unsigned char*>(k_out);
    unsigned char* v_at = static_cast<unsigned char*>(v_out);
    std::int64_t* pos_at = positions;
    for_each_visible(layer, plan, entry, [&](int begin, int end) {
      for (int p = begin; p < end;) {
        const int offset = p % B;
        const int len = B - offset < end - p ? B - offset : end - p;
        const std::size_t row =
            static_cast<std::size_t>(table[p / B]) * static_cast<std::size_t>(B) + static_cast<std::size_t>(offset);
        copy(layer, row, len, k_at, v_at);
        k_at += k_out_row * static_cast<std::size_t>(len);
        v_at += v_out_row * static_cast<std::size_t>(len);
        if (pos_at != nullptr)
          for (int j = 0; j < len; ++j) *pos_at++ = p + j;
        p += len;
      }
      return true;
    });
    return n;
  }

 private:

  PagedKVPool(const BatchPlanner& planner, DType dtype, PoolAllocator allocator) noexcept
      : PoolStorage(dtype, allocator), planner_(&planner), block_size_(planner.block_size()) {}

  // Shapes layer l as `planner` reports it (PoolStorage's shape_of).
  struct PlannerShape {
    const BatchPlanner& planner;
    DType dtype;
    StateSlotBytes state_slot_bytes;

    Status operator()(int l, PagedLayer* out) const noexcept {
      return shape_layer(planner, l, dtype, state_slot_bytes, out);
    }
  };

  // Layer `l`'s group, policy, row sizes and rows, as the planner reports them;
  // fails when its rows overflow an int or its bytes the address space.
  // A Shared layer: its source's group and row sizes, no rows. A State
  // layer: shape_state().
  static Status shape_layer(const BatchPlanner& planner, int l, DType dtype, StateSlotBytes state,
                            PagedLayer* out) noexcept {
    const int B = planner.block_size();
    KVCORE_CHECK_OR_RETURN_ERROR(B >= 1, InvalidArgument,
                                 "block_size = %d: the planner's blocks must hold >= 1 row", B);
    KVCORE_ASSIGN_OR_RETURN(const LayerConfig lc, planner.layer_config(l));
    if (lc.policy.kind == LayerPolicy::Kind::State) return shape_state(planner, l, lc, state, out);
    KVCORE_ASSIGN_OR_RETURN(const int group, planner.group_of(l));
    if (lc.policy.kind == LayerPolicy::Kind::Shared) {
      // validate() made the source an earlier Flat, Ring or Chunked layer of this shape: shaped
      // (and its row size checked) before this one.
      KVCORE_ASSIGN_OR_RETURN(const LayerConfig source, planner.layer_config(lc.policy.source));
      (void)row_bytes(source, dtype, 0, &out->k_row_bytes, &out->v_row_bytes);
      out->n_kv_heads = source.n_kv_heads;
      out->head_dim = source.head_dim;
      out->value_dim = source.value_dim();
      out->group = group;
      out->policy = lc.policy;
      out->rows = 0;
      return Error::Ok;
    }
    KVCORE_ASSIGN_OR_RETURN(const int blocks, planner.num_blocks(group));
    const std::uint64_t rows = static_cast<std::uint64_t>(blocks < 0 ? 0 : blocks) * static_cast<std::uint64_t>(B);
    const bool fits = blocks >= 0 && rows <= static_cast<std::uint64_t>(INT_MAX) &&
                      row_bytes(lc, dtype, rows, &out->k_row_bytes, &out->v_row_bytes);
    KVCORE_CHECK_OR_RETURN_ERROR(
        fits, InvalidArgument,
        "layer %d: %d blocks of %d rows of %d heads x (%d + %d) dims of %s overflow the address "
        "space",
        l, blocks, B, lc.n_kv_heads, lc.head_dim, lc.value_dim(), to_string(dtype));
    out->n_kv_heads = lc.n_kv_heads;
    out->head_dim = lc.head_dim;
    out->value_dim = lc.value_dim();
    out->group = group;
    out->policy = lc.policy;
    out->rows = static_cast<int>(rows);
    out->storage_of = -1;
    // The planner's groups draw from one pool: share the storage it names
    // when its rows are of this layer's size and count (else keep our own).
    KVCORE_ASSIGN_OR_RETURN(const int owner, planner.storage_layer(l));
    if (owner != l && owner >= 0 && owner < l) {
      KVCORE_ASSIGN_OR_RETURN(const LayerConfig oc, planner.layer_config(owner));
      KVCORE_ASSIGN_OR_RETURN(const int owner_group, planner.group_of(owner));
      KVCORE_ASSIGN_OR_RETURN(const int owner_blocks, planner.num_blocks(owner_group));
      if (oc.n_kv_heads == lc.n_kv_heads && oc.head_dim == lc.head_dim && oc.value_dim() == lc.value_dim() &&
          owner_blocks == blocks)
        out->storage_of = owner;
    }
    return Error::Ok;
  }

  // State layer `l`: its State group's num_state_slots() slots of
  // state.bytes[l] bytes (K), no V, no heads.
  static Status shape_state(const BatchPlanner& planner, int l, const LayerConfig& lc, StateSlotBytes state,
                            PagedLayer* out) noexcept {
    KVCORE_ASSIGN_OR_RETURN(const int k, planner.state_group_of(l));
    KVCORE_ASSIGN_OR_RETURN(const int slots, planner.num_state_slots(k));
    KVCORE_ASSIGN_OR_RETURN(const std::size_t slot, state.of(l));
    std::uint64_t all = 0;
    KVCORE_CHECK_OR_RETURN_ERROR(slots >= 0 && checked_mul(static_cast<std::uint64_t>(slots), slot, &all),
                                 InvalidArgument, "layer %d: %d state slots of %zu bytes overflow the address space",
                                 l, slots, slot);
    out->k_row_bytes = slot;
    out->v_row_bytes = 0;
    out->group = -1;
    out->state_group = k;
    out->policy = lc.policy;
    out->rows = slots;
    return Error::Ok;
  }

  // What every use of a plan needs: the pool's block size, the layer's group,
  // sane counts and the arrays they index (the per-entry ones for gather).
  Status check_plan(int layer_index, const BatchStepPlan& plan, bool gather) const noexcept {
    const int group = layers_[layer_index].group;
    const bool entries = !gather || plan.n_entries == 0 ||
                         (plan.seq_ids != nullptr && plan.first_positions != nullptr &&
                          plan.context_lens != nullptr && plan.visible_starts != nullptr);
    KVCORE_CHECK_OR_RETURN_ERROR(
        plan.block_size == block_size_ && plan.n_groups > group && plan.groups != nullptr &&
            plan.n_tokens >= 0 && plan.n_entries >= 0 && entries,
        InvalidArgument,
        "%s of layer %d: the plan (block_size %d, %d groups, %d tokens, %d entries) does not fit "
        "the pool (block_size %d, the layer in group %d) or lacks an array",
        gather ? "gather" : "update", layer_index, plan.block_size, plan.n_groups, plan.n_tokens, plan.n_entries,
        block_size_, group);
    return Error::Ok;
  }

  const int* entry_table(const PagedLayer& layer, const BatchStepPlan& plan, int entry) const noexcept {
    return table_row(plan, layer.group, entry);
  }

  // Calls f(begin, end) for each maximal run of positions the entry's queries
  // see; stops when f returns false.
  template <typename F>
  static void for_each_visible(const PagedLayer& layer, const BatchStepPlan& plan, int entry, F f) noexcept {
    // A tree entry's nodes are read through its mask: gather gives its history.
    const int end = plan.is_tree(entry) ? plan.first_positions[entry] : plan.context_lens[entry];
    for_each_visible_run(plan, entry, layer.policy, plan.first_positions[entry], end, f);
  }

  // The entry's shape, and every visible position's block: inside the pool and
  // its storage. Returns the visible positions.
  Result<int> check_entry(int layer_index, const BatchStepPlan& plan, int entry) const noexcept {
    const PagedLayer& layer = layers_[layer_index];
    const GroupPlan& gp = plan.groups[layer.group];
    KVCORE_CHECK_OR_RETURN_ERROR(entry >= 0 && entry < plan.n_entries, InvalidArgument,
                                 "gather of layer %d: entry = %d, must be in [0, n_entries = %d)",
                                 layer_index, entry, plan.n_entries);
    const int seq = plan.seq_ids[entry], first = plan.first_positions[entry], ctx = plan.context_lens[entry];
    const int B = block_size_;
    KVCORE_CHECK_OR_RETURN_ERROR(
        seq >= 0 && (plan.table_rows == nullptr || plan.table_rows[seq] >= 0) && first >= 0 && first <= ctx && plan.visible_starts[entry] >= 0 && gp.block_tables != nullptr &&
            static_cast<std::int64_t>(ctx) <= static_cast<std::int64_t>(gp.table_stride) * B,
        InvalidArgument,
        "gather of layer %d: entry %d (seq %d, positions [%d, %d), table_stride %d) does not fit "
        "its block table",
        layer_index, entry, seq, first, ctx, gp.table_stride);
    const int* table = entry_table(layer, plan, entry);
    const int n_blocks = layer.rows / B;
    int n = 0;
    Status bad;
    for_each_visible(layer, plan, entry, [&](int begin, int end) {
      for (int i = begin / B; i <= (end - 1) / B; ++i) {
        const int block = table[i];
        const int p = i * B > begin ? i * B : begin;
        if (block < 0 || block >= n_blocks) {
          bad = Status::make(Error::InvalidArgument,
                             "gather of layer %d: entry %d sees position %d, but its block %d is "
                             "not in [0, %d)",
                             layer_index, entry, p, block, n_blocks);
          return false;
        }
        const std::int64_t row_end = static_cast<std::int64_t>(block) * B + B;
        if (row_end > layer.allocated_rows) {
          bad = Status::make(Error::InvalidState,
                             "gather of layer %d: position %d lives in block %d, but the layer holds "
                             "%d rows so far: update the layer for the step first",
                             layer_index, p, block, layer.allocated_rows);
          return false;
        }
      }
      n += end - begin;
      return true;
    });
    if (!bad.ok()) return bad;
    return n;
  }

  const BatchPlanner* planner_;
  int block_size_ = 1;
};

}  // namespace kvcore
