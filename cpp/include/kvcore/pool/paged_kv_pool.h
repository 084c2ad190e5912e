// PagedKVPool: reference CPU storage for a many-sequence cache (BatchCache, or
// any BatchPlanner). Each layer keeps K and V as the rows of its group's block
// pool: num_blocks(group) * block_size rows of n_kv_heads x head_dim elements
// (V: n_kv_heads x value_dim), row-major [rows, heads, dim], in one element
// type chosen at construction. Row r of a layer is row r of its group's pool:
// block r / B, offset r % B, exactly as the plan's slots and block tables name
// it. The pool moves bytes; it never interprets elements.
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
// (update without growth, rows, gather) allocates. Every plan is checked
// against the pool before anything is written.
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
/// block_size).
struct PagedLayer : LayerStorage {
  /// The layer's group (its block pool) and that group's policy.
  int group = 0;
  LayerPolicy policy;

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
  /// min(initial_rows, rows) rows. The planner must outlive the pool.
  /// InvalidArgument: dtype outside DType, allocator without both functions,
  /// initial_rows < 0, block_size < 1, or a layer whose bytes overflow the
  /// address space. MemoryAllocationFailed: the layer table or the initial
  /// blocks cannot be allocated (nothing is kept).
  static Result<PagedKVPool> create(const BatchPlanner& planner, DType dtype,
                                    PoolAllocator allocator = PoolAllocator::heap(),
                                    int initial_rows = kDefaultInitialRows) noexcept {
    KVCORE_RETURN_IF_ERROR(check_dtype(dtype));
    KVCORE_RETURN_IF_ERROR(check_allocator(allocator));
    KVCORE_CHECK_OR_RETURN_ERROR(initial_rows >= 0, InvalidArgument,
                                 "initial_rows = %d: must be >= 0", initial_rows);
    PagedKVPool pool(planner, dtype, allocator);
    KVCORE_RETURN_IF_ERROR(pool.build(planner.n_layers(), initial_rows, PlannerShape{planner, dtype}));
    return pool;
  }

  /// Bytes in_arena() needs for `planner`'s layers, alignment slack included
  /// (any arena address works). InvalidArgument: dtype outside DType,
  /// block_size < 1, or the total overflows the address space.
  static Result<std::size_t> required_bytes(const BatchPlanner& planner, DType dtype) noexcept {
    KVCORE_RETURN_IF_ERROR(check_dtype(dtype));
    return arena_bytes(planner.n_layers(), PlannerShape{planner, dtype});
  }

  /// A pool whose table and rows all live in `arena` (at least
  /// required_bytes(planner, dtype) bytes, any alignment). Allocates nothing;
  /// the arena and the planner must outlive the pool. InvalidArgument: dtype
  /// outside DType, null arena, arena too small (the message names both
  /// sizes), or what required_bytes() refuses.
  static Result<PagedKVPool> in_arena(const BatchPlanner& planner, DType dtype, void* arena,
                                      std::size_t arena_bytes_given) noexcept {
    KVCORE_RETURN_IF_ERROR(check_dtype(dtype));
    PagedKVPool pool(planner, dtype, PoolAllocator{});
    KVCORE_RETURN_IF_ERROR(
        pool.carve(arena, arena_bytes_given, planner.n_layers(), PlannerShape{planner, dtype}));
    return pool;
  }

  /// Rows per block, B (the planner's block_size()).
  int block_size() const noexcept { return block_size_; }

  /// Bytes of every layer's live rows [0, used_blocks * B) now: what rows()
  /// spans once the step's update has stored them (rows a growing pool has
  /// not reached yet are counted too). A group the planner no longer knows
  /// counts 0.
  std::size_t used_bytes() const noexcept {
    std::size_t n = 0;
    for (int l = 0; l < n_layers_; ++l) {
      const PagedLayer& layer = layers_[l];
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
  /// n_tokens rows, null, or overlapping the layer's own storage (pass a copy).
  /// MemoryAllocationFailed: growth failed. Nothing is written on any error.
  Status update(int layer_index, const BatchStepPlan& plan, const void* k, std::size_t k_bytes,
                const void* v, std::size_t v_bytes) noexcept {
    KVCORE_RETURN_IF_ERROR(check_layer(layer_index));
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
    KVCORE_RETURN_IF_ERROR(check_layer(layer_index));
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

  /// Performs a tree commit's row copies (BatchCache::commit(step, accepted))
  /// in every layer: each group's copies, in order, K and V of row src to row
  /// dst. Call it once per commit, before the next step's update.
  /// InvalidArgument (nothing copied): a commit of another group count, a
  /// copy outside a layer's stored rows.
  Status apply_commit(const BatchCommit& commit) noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(commit.n_groups == planner_->n_groups() && (commit.groups != nullptr || commit.n_groups == 0),
                                 InvalidArgument, "apply_commit: a commit of %d groups, the pool's cache has %d",
                                 commit.n_groups, planner_->n_groups());
    for (int l = 0; l < n_layers(); ++l) {
      const PagedLayer& layer = layers_[l];
      const GroupCommit& gc = commit.groups[layer.group];
      for (int c = 0; c < gc.n_copies; ++c) {
        const TreeCopy cp = gc.copies[c];
        KVCORE_CHECK_OR_RETURN_ERROR(cp.src >= 0 && cp.dst >= 0 && cp.src < layer.allocated_rows &&
                                         cp.dst < layer.allocated_rows,
                                     InvalidArgument,
                                     "apply_commit: layer %d's copy %d (row %d -> row %d) must lie in its "
                                     "%d stored rows",
                                     l, c, cp.src, cp.dst, layer.allocated_rows);
      }
    }
    for (int l = 0; l < n_layers(); ++l) {
      const PagedLayer& layer = layers_[l];
      const GroupCommit& gc = commit.groups[layer.group];
      for (int c = 0; c < gc.n_copies; ++c) {
        const std::size_t src = static_cast<std::size_t>(gc.copies[c].src), dst = static_cast<std::size_t>(gc.copies[c].dst);
        // memmove: a caller-built commit may name src == dst (kv_pool_tree.h's copy_rows does the same).
        std::memmove(layer.k + layer.k_row_bytes * dst, layer.k + layer.k_row_bytes * src, layer.k_row_bytes);
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
  /// InvalidArgument: bad layer. InvalidState: the live rows reach past the
  /// storage (update the layer for the begun step first).
  Result<PagedRows> rows(int layer_index) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_layer(layer_index));
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
  Result<int> gather_rows(int layer_index, const BatchStepPlan& plan, int entry) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_layer(layer_index));
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
  /// first). Nothing is written on any error.
  Result<int> gather(int layer_index, const BatchStepPlan& plan, int entry, void* k_out,
                     std::size_t k_capacity, void* v_out, std::size_t v_capacity,
                     std::int64_t* positions = nullptr, std::size_t positions_capacity = 0) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_layer(layer_index));
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
  Result<int> gather_values(int layer_index, const BatchStepPlan& plan, int entry, DType out_type, void* k_out,
                            std::size_t k_capacity, void* v_out, std::size_t v_capacity,
                            std::int64_t* positions = nullptr, std::size_t positions_capacity = 0) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_layer(layer_index));
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
  Result<PagedRows> rows_values(int layer_index, DType out_type, void* k_out, std::size_t k_capacity, void* v_out,
                                std::size_t v_capacity) const noexcept {
    KVCORE_ASSIGN_OR_RETURN(const PagedRows live, rows(layer_index));
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

    Status operator()(int l, PagedLayer* out) const noexcept { return shape_layer(planner, l, dtype, out); }
  };

  // Layer `l`'s group, policy, row sizes and rows, as the planner reports them;
  // fails when its rows overflow an int or its bytes the address space.
  static Status shape_layer(const BatchPlanner& planner, int l, DType dtype, PagedLayer* out) noexcept {
    const int B = planner.block_size();
    KVCORE_CHECK_OR_RETURN_ERROR(B >= 1, InvalidArgument,
                                 "block_size = %d: the planner's blocks must hold >= 1 row", B);
    KVCORE_ASSIGN_OR_RETURN(const LayerConfig lc, planner.layer_config(l));
    KVCORE_CHECK_OR_RETURN_ERROR(lc.policy.holds_keys(), NotSupported,
                                 "layer %d: PagedKVPool stores the K/V rows of Flat, Ring and Chunked layers; "
                                 "a Shared layer has none, a State layer keeps state slots (docs/layer_kinds.md)",
                                 l);
    KVCORE_ASSIGN_OR_RETURN(const int group, planner.group_of(l));
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
