// KVPool: reference CPU storage that applies plans. Each layer keeps K and V as
// rows of n_kv_heads x head_dim elements (V: n_kv_heads x value_dim), row-major
// [rows, heads, dim], in one element type chosen at construction. The pool
// moves bytes; it never interprets elements.
//
// Two modes:
//  - growing (create): each layer starts at initial_capacity rows and doubles,
//    up to rows(layer), when a write reaches further; blocks come from a
//    PoolAllocator, and a failed growth leaves the pool as it was;
//  - arena (in_arena): one caller-provided block sized by required_bytes();
//    nothing is allocated, not even the layer table.
// Rows never written read as zeros in both modes.
//
// The kinds of docs/design.md section 9: a Shared layer stores nothing (its
// reads answer from its source's rows; writing it is refused); a State layer
// stores D state slots of a size the caller gives (StateSlotBytes: the pool
// never interprets a state's bytes), allocated in full at creation, written
// and read with the state verbs (write_state, read_state, state_slot); the
// K/V verbs refuse it and the state verbs refuse the other kinds, by name.
//
// RingStorage::Mirrored (either mode) repeats the first R - 1 ring rows of each
// wrapping ring layer without sinks (LayerGeometry::mirror_rows) after its last
// row, so a read that wraps round the ring is one contiguous span: backends
// that attend over contiguous K/V in position order then never copy a window.
// It costs R - 1 rows per such layer and a second copy of the rows a write
// lands in those first R - 1 ring rows. (held_rows() is one span without it.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kvcore/core/config.h"
#include "kvcore/core/geometry.h"
#include "kvcore/core/plan.h"
#include "kvcore/core/result.h"
#include "kvcore/pool/dtype.h"
#include "kvcore/pool/pool_allocator.h"
#include "kvcore/pool/parts/kv_pool_reads.h"
#include "kvcore/pool/quantize.h"

namespace kvcore {

/// The one-sequence pool: KVPoolReads (and below it KVPoolStates,
/// KVPoolStorage) plus creation and the step's writes.
class KVPool : public KVPoolReads {
 public:
  /// A growing pool for `planner`'s layers (shapes from layer_config(l), rows and
  /// ring layout from geometry(l)), each starting at min(initial_capacity(), rows)
  /// rows; a State layer's D slots of state_slot_bytes.bytes[l] bytes are
  /// allocated in full. InvalidArgument: dtype outside DType, allocator without both
  /// functions, ring storage outside RingStorage, a State layer without a slot
  /// size (or of 0 bytes), or a layer whose bytes overflow the address space.
  /// MemoryAllocationFailed: the initial blocks cannot be allocated (nothing is kept).
  static Result<KVPool> create(const SequencePlanner& planner, DType dtype,
                               PoolAllocator allocator = PoolAllocator::heap(),
                               RingStorage ring_storage = RingStorage::Compact,
                               StateSlotBytes state_slot_bytes = {}) noexcept {
    KVCORE_RETURN_IF_ERROR(check_dtype(dtype));
    KVCORE_RETURN_IF_ERROR(check_ring_storage(ring_storage));
    KVCORE_RETURN_IF_ERROR(check_allocator(allocator));
    KVPool pool(dtype, allocator);
    KVCORE_RETURN_IF_ERROR(pool.build(planner.n_layers(), planner.initial_capacity(),
                                      PlannerShape{planner, dtype, ring_storage, state_slot_bytes}));
    for (int l = 0; l < pool.n_layers_; ++l) {  // D is small: every slot from the start
      if (pool.layers_[l].policy.kind == LayerPolicy::Kind::State)
        KVCORE_RETURN_IF_ERROR(pool.grow(l, pool.layers_[l].rows));
    }
    return pool;
  }

  /// Bytes in_arena() needs for a cache built from `config`, alignment slack
  /// included (any arena address works). InvalidArgument: `config` breaks a rule
  /// of validate(), dtype outside DType, ring storage outside RingStorage, a
  /// State layer without a slot size (or of 0 bytes, or of 2^31 or more), or the total overflows
  /// the address space.
  static Result<std::size_t> required_bytes(const CacheConfig& config, DType dtype,
                                            RingStorage ring_storage = RingStorage::Compact,
                                            StateSlotBytes state_slot_bytes = {}) noexcept {
    KVCORE_RETURN_IF_ERROR(validate(config));
    KVCORE_RETURN_IF_ERROR(check_dtype(dtype));
    KVCORE_RETURN_IF_ERROR(check_ring_storage(ring_storage));
    return arena_bytes(config.n_layers, [&](int l, PoolLayer* out) {
      const LayerGeometry geometry = LayerGeometry::of(
          config.layer(l).policy, config.effective_max_step(), config.capacity);
      return shape_layer(l, config.layer(l), geometry, dtype, ring_storage, state_slot_bytes, out);
    });
  }

  /// A pool whose table and rows all live in `arena` (at least
  /// required_bytes(config, dtype, ring_storage) bytes for the config `planner`
  /// was built from, any alignment). Allocates nothing; the arena must outlive
  /// the pool. InvalidArgument: dtype outside DType, ring storage outside
  /// RingStorage, null arena, arena too small (the message names both sizes),
  /// a State layer without a slot size (or of 0 bytes, or of 2^31 or more).
  static Result<KVPool> in_arena(const SequencePlanner& planner, DType dtype, void* arena,
                                 std::size_t arena_bytes_given,
                                 RingStorage ring_storage = RingStorage::Compact,
                                 StateSlotBytes state_slot_bytes = {}) noexcept {
    KVCORE_RETURN_IF_ERROR(check_dtype(dtype));
    KVCORE_RETURN_IF_ERROR(check_ring_storage(ring_storage));
    KVPool pool(dtype, PoolAllocator{});
    KVCORE_RETURN_IF_ERROR(pool.carve(arena, arena_bytes_given, planner.n_layers(),
                                      PlannerShape{planner, dtype, ring_storage, state_slot_bytes}));
    return pool;
  }

  /// Copies the step's rows into the plan's write runs: input row j (k: k_row_bytes,
  /// v: v_row_bytes each) goes to the j-th written row. Grows the layer when the
  /// runs reach past its storage. k/v may be views of this pool, even of the rows
  /// written: they are copied as they were before the write. InvalidArgument: bad
  /// layer, a run outside the layer's rows, k/v not exactly write_len() rows, or
  /// k/v overlapping rows each of a wrapped write's two runs overwrites before the
  /// other reads them (pass a copy); nothing is written.
  /// A Shared or State layer: InvalidArgument (check_writes_rows()).
  /// MemoryAllocationFailed: growth failed (nothing written, pool unchanged).
  Status write(int layer, const SeqStepPlan& plan, const void* k, std::size_t k_bytes,
               const void* v, std::size_t v_bytes) noexcept {
    KVCORE_RETURN_IF_ERROR(check_writes_rows(layer, "write"));
    KVCORE_ASSIGN_OR_RETURN(const Extent extent,
                            check_runs(layer, plan.write, plan.n_write,
                                       SeqStepPlan::kMaxWriteRuns, "write"));
    const PoolLayer& shape = layers_[layer];
    KVCORE_RETURN_IF_ERROR(check_buffer(layer, "write", "k", k, k_bytes, extent.rows,
                                        shape.k_row_bytes, /*exact=*/true));
    KVCORE_RETURN_IF_ERROR(check_buffer(layer, "write", "v", v, v_bytes, extent.rows,
                                        shape.v_row_bytes, /*exact=*/true));
    // The input may be a view of this layer. Each run is a memmove; with two
    // runs, the first to go must not overwrite input the other still reads.
    // (A growth moves the rows to new blocks, which no input can overlap.)
    const bool grows = extent.end_row > shape.allocated_rows;
    bool reverse = false;
    if (plan.n_write == 2 && !grows && !copy_keeps_input(shape, plan, k, v, 0)) {
      reverse = true;
      KVCORE_CHECK_OR_RETURN_ERROR(copy_keeps_input(shape, plan, k, v, 1), InvalidArgument,
                                   "write of layer %d: k/v overlap rows both runs write before "
                                   "reading them: pass a copy",
                                   layer);
    }
    // Blocks a growth replaces are released only after the copy has read them.
    Blocks replaced;
    if (grows) {
      KVCORE_RETURN_IF_ERROR(grow(layer, grown_rows(shape, extent.end_row), &replaced));
    }
    const PoolLayer& stored = layers_[layer];
    for (int n = 0; n < plan.n_write; ++n) {
      const int i = reverse ? plan.n_write - 1 - n : n;
      const Run& run = plan.write[i];
      const std::size_t offset = i == 0 ? 0 : static_cast<std::size_t>(plan.write[0].len);
      const std::size_t k_run = stored.k_row_bytes * static_cast<std::size_t>(run.len);
      const std::size_t v_run = stored.v_row_bytes * static_cast<std::size_t>(run.len);
      std::memmove(stored.k + stored.k_row_bytes * static_cast<std::size_t>(run.row),
                   static_cast<const unsigned char*>(k) + stored.k_row_bytes * offset, k_run);
      std::memmove(stored.v + stored.v_row_bytes * static_cast<std::size_t>(run.row),
                   static_cast<const unsigned char*>(v) + stored.v_row_bytes * offset, v_run);
    }
    // After every run: the input (possibly a view of this pool) is fully read.
    for (int i = 0; i < plan.n_write; ++i) KVPoolTraits::mirror_run(stored, plan.write[i]);
    release(replaced);
    return Error::Ok;
  }

  /// write() for values: the step's rows as n_kv_heads x head_dim (V:
  /// value_dim) values of `in_type` each. A quantized pool (QInt8, Fp8E4M3)
  /// quantizes every (row, head) into its row, scales and zero points included
  /// (quantize.h); another pool takes only its own dtype and writes as write().
  /// InvalidArgument (nothing written): as write(); `in_type` not float32,
  /// float16 or bfloat16 (or, for a plain pool, not its dtype); a value that is
  /// not finite or a (row, head) whose range passes FLT_MAX (quantize.h); k/v
  /// overlapping the layer's storage; a Shared or State layer.
  /// MemoryAllocationFailed: growth failed.
  Status write_values(int layer, const SeqStepPlan& plan, DType in_type, const void* k,
                      std::size_t k_bytes, const void* v, std::size_t v_bytes) noexcept {
    KVCORE_RETURN_IF_ERROR(check_writes_rows(layer, "write_values"));
    if (!is_quantized(dtype_)) {
      KVCORE_CHECK_OR_RETURN_ERROR(in_type == dtype_, InvalidArgument,
                                   "write_values of layer %d: values of %s, the pool stores %s", layer,
                                   to_string(in_type), to_string(dtype_));
      return write(layer, plan, k, k_bytes, v, v_bytes);
    }
    KVCORE_RETURN_IF_ERROR(check_compute_type(layer, "write_values", "values", in_type));
    KVCORE_ASSIGN_OR_RETURN(const Extent extent,
                            check_runs(layer, plan.write, plan.n_write,
                                       SeqStepPlan::kMaxWriteRuns, "write"));
    const PoolLayer& shape = layers_[layer];
    const std::size_t k_in = value_row_bytes(shape.n_kv_heads, shape.head_dim, in_type);
    const std::size_t v_in = value_row_bytes(shape.n_kv_heads, shape.value_dim, in_type);
    KVCORE_RETURN_IF_ERROR(check_buffer(layer, "write_values", "k", k, k_bytes, extent.rows, k_in, true));
    KVCORE_RETURN_IF_ERROR(check_buffer(layer, "write_values", "v", v, v_bytes, extent.rows, v_in, true));
    KVCORE_RETURN_IF_ERROR(check_quantizable("write_values", "k", layer, in_type, k, extent.rows,
                                             shape.n_kv_heads, shape.head_dim));
    KVCORE_RETURN_IF_ERROR(check_quantizable("write_values", "v", layer, in_type, v, extent.rows,
                                             shape.n_kv_heads, shape.value_dim));
    KVCORE_RETURN_IF_ERROR(check_apart(shape, "write_values", layer, k, k_bytes, v, v_bytes));
    if (extent.end_row > shape.allocated_rows) {
      KVCORE_RETURN_IF_ERROR(grow(layer, grown_rows(shape, extent.end_row)));
    }
    const PoolLayer& stored = layers_[layer];
    std::size_t j = 0;  // input row
    for (int i = 0; i < plan.n_write; ++i) {
      const Run& run = plan.write[i];
      for (int r = 0; r < run.len; ++r, ++j) {
        const std::size_t row = static_cast<std::size_t>(run.row + r);
        quantize_row(dtype_, stored.n_kv_heads, stored.head_dim, in_type,
                     static_cast<const unsigned char*>(k) + k_in * j, stored.k + stored.k_row_bytes * row);
        quantize_row(dtype_, stored.n_kv_heads, stored.value_dim, in_type,
                     static_cast<const unsigned char*>(v) + v_in * j, stored.v + stored.v_row_bytes * row);
      }
    }
    for (int i = 0; i < plan.n_write; ++i) KVPoolTraits::mirror_run(stored, plan.write[i]);
    return Error::Ok;
  }

 private:
  KVPool(DType dtype, PoolAllocator allocator) noexcept : KVPoolReads(dtype, allocator) {}
};

}  // namespace kvcore
