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

#include "kvcore/core/cache_base.h"
#include "kvcore/core/config.h"
#include "kvcore/core/geometry.h"
#include "kvcore/core/plan.h"
#include "kvcore/core/result.h"
#include "kvcore/pool/dtype.h"
#include "kvcore/pool/pool_allocator.h"
#include "kvcore/pool/pool_bytes.h"
#include "kvcore/pool/pool_storage.h"
#include "kvcore/pool/quantize.h"

namespace kvcore {

/// One read run as zero-copy spans: `run.len` rows of K from `k` and of V from `v`.
struct KVSpan {
  const unsigned char* k = nullptr;
  const unsigned char* v = nullptr;
  Run run;
};

/// A plan's read runs as spans, in position order.
struct KVViews {
  KVSpan span[SeqStepPlan::kMaxReadRuns];
  int n = 0;

  /// Rows over all spans (the plan's read_len).
  int len() const noexcept {
    int rows = 0;
    for (int i = 0; i < n; ++i) rows += span[i].run.len;
    return rows;
  }
};

/// A layer's rows that hold positions, in row order: rows [0, rows) as one
/// zero-copy span, row r holding the position `geometry.position_at(r, end)`.
struct HeldRows {
  const unsigned char* k = nullptr;
  const unsigned char* v = nullptr;
  int rows = 0;
  /// One past the last position written (the step's P + T).
  int end = 0;
};

/// How a pool stores the ring rows of ring layers that wrap (R = window + max_step - 1).
enum class RingStorage : int {
  /// rows(layer) rows: a read that wraps round the ring is two runs, two spans.
  Compact = 0,
  /// rows(layer) + R - 1 rows for a wrapping ring without sinks: ring rows
  /// [0, R - 1) are repeated after the last row, and views() returns a wrapped
  /// window as one span (LayerGeometry::mirror_rows; other layers as Compact).
  Mirrored = 1,
};

/// Shape and storage of one layer (rows: geometry.rows, rows(layer)). A
/// Shared layer has rows = 0 (no storage); a State layer has rows = D slots
/// of k_row_bytes bytes each, v_row_bytes = 0 and no heads.
struct PoolLayer : LayerStorage {
  /// The layer's policy (its kind; a Shared layer's source).
  LayerPolicy policy;
  /// How positions map onto rows, as the planner reported it.
  LayerGeometry geometry;
  /// First ring row (geometry.sink_rows).
  int ring_start = 0;
  /// Mirrored ring layers: rows [rows, rows + mirror_rows) repeat rows
  /// [ring_start, ring_start + mirror_rows), once allocated_rows == rows. Else 0.
  int mirror_rows = 0;

  /// Rows the storage blocks hold now: allocated_rows, plus the mirror once full.
  std::int64_t storage_rows() const noexcept {
    return static_cast<std::int64_t>(allocated_rows) + (allocated_rows == rows ? mirror_rows : 0);
  }
};

/// What PoolStorage needs to know of KVPool's layers (see pool_storage.h).
struct KVPoolTraits {
  using Layer = PoolLayer;
  static constexpr PoolNames kNames{"pool", "layer", "arena", ""};

  /// A layer count whose table does not fit.
  static Status bad_table(int n_layers) noexcept {
    return Status::make(Error::InvalidArgument,
                        "n_layers = %d: the layer table overflows the address space", n_layers);
  }

  /// Copies the rows of `run` that lie in a full mirrored layer's repeated
  /// range into the mirror (from the pool rows just written, never from the input).
  static void mirror_run(const PoolLayer& layer, const Run& run) noexcept {
    if (layer.mirror_rows == 0 || layer.allocated_rows != layer.rows) return;
    const int mirror_end = layer.ring_start + layer.mirror_rows;
    const int lo = run.row > layer.ring_start ? run.row : layer.ring_start;
    const int hi = run.row + run.len < mirror_end ? run.row + run.len : mirror_end;
    if (lo >= hi) return;
    const std::size_t from = static_cast<std::size_t>(lo);
    const std::size_t to =
        static_cast<std::size_t>(layer.rows) + static_cast<std::size_t>(lo - layer.ring_start);
    const std::size_t n = static_cast<std::size_t>(hi - lo);
    std::memcpy(layer.k + layer.k_row_bytes * to, layer.k + layer.k_row_bytes * from,
                layer.k_row_bytes * n);
    std::memcpy(layer.v + layer.v_row_bytes * to, layer.v + layer.v_row_bytes * from,
                layer.v_row_bytes * n);
  }

  /// After a growth: a mirrored layer that reached its full rows starts its
  /// mirror equal to the ring rows it repeats.
  static void grown(PoolLayer& layer) noexcept {
    mirror_run(layer, Run{layer.ring_start, layer.mirror_rows, 0});
  }
};

class KVPool : public PoolStorage<KVPoolTraits> {
 public:
  /// Every K and V block of an arena starts on this boundary.
  static constexpr std::size_t kArenaAlignment = PoolBytes::kArenaAlignment;

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

  /// Bytes of the rows that hold positions [0, length) (min(length, rows) rows
  /// per layer; a State layer's min(length, D) slots, a Shared layer's none):
  /// what a cache of that length keeps alive.
  std::size_t in_use_bytes(int length) const noexcept {
    std::size_t n = 0;
    if (length <= 0) return 0;
    for (int l = 0; l < n_layers_; ++l) {
      const PoolLayer& layer = layers_[l];
      const int held = length < layer.rows ? length : layer.rows;
      n += (layer.k_row_bytes + layer.v_row_bytes) * static_cast<std::size_t>(held);
    }
    return n;
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
  Status write(int layer_index, const SeqStepPlan& plan, const void* k, std::size_t k_bytes,
               const void* v, std::size_t v_bytes) noexcept {
    KVCORE_RETURN_IF_ERROR(check_writes_rows(layer_index, "write"));
    KVCORE_ASSIGN_OR_RETURN(const Extent extent,
                            check_runs(layer_index, plan.write, plan.n_write,
                                       SeqStepPlan::kMaxWriteRuns, "write"));
    const PoolLayer& shape = layers_[layer_index];
    KVCORE_RETURN_IF_ERROR(check_buffer(layer_index, "write", "k", k, k_bytes, extent.rows,
                                        shape.k_row_bytes, /*exact=*/true));
    KVCORE_RETURN_IF_ERROR(check_buffer(layer_index, "write", "v", v, v_bytes, extent.rows,
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
                                   layer_index);
    }
    // Blocks a growth replaces are released only after the copy has read them.
    Blocks replaced;
    if (grows) {
      KVCORE_RETURN_IF_ERROR(grow(layer_index, grown_rows(shape, extent.end_row), &replaced));
    }
    const PoolLayer& layer = layers_[layer_index];
    for (int n = 0; n < plan.n_write; ++n) {
      const int i = reverse ? plan.n_write - 1 - n : n;
      const Run& run = plan.write[i];
      const std::size_t offset = i == 0 ? 0 : static_cast<std::size_t>(plan.write[0].len);
      const std::size_t k_run = layer.k_row_bytes * static_cast<std::size_t>(run.len);
      const std::size_t v_run = layer.v_row_bytes * static_cast<std::size_t>(run.len);
      std::memmove(layer.k + layer.k_row_bytes * static_cast<std::size_t>(run.row),
                   static_cast<const unsigned char*>(k) + layer.k_row_bytes * offset, k_run);
      std::memmove(layer.v + layer.v_row_bytes * static_cast<std::size_t>(run.row),
                   static_cast<const unsigned char*>(v) + layer.v_row_bytes * offset, v_run);
    }
    // After every run: the input (possibly a view of this pool) is fully read.
    for (int i = 0; i < plan.n_write; ++i) KVPoolTraits::mirror_run(layer, plan.write[i]);
    release(replaced);
    return Error::Ok;
  }

  /// Copies the plan's read runs, in position order, into contiguous k_out/v_out
  /// (at least read_len() rows each). InvalidArgument: bad layer, a run outside the
  /// layer's rows, an output too small or null, a State layer. InvalidState: a run reaches rows
  /// the pool has not grown to yet (write the step before reading it). A Shared
  /// layer's plan reads its source's rows: they are copied from the source.
  Status gather(int layer_index, const SeqStepPlan& plan, void* k_out, std::size_t k_capacity,
                void* v_out, std::size_t v_capacity) const noexcept {
    KVCORE_ASSIGN_OR_RETURN(const int from, row_layer(layer_index, "gather"));
    KVCORE_ASSIGN_OR_RETURN(const Extent extent, check_read(from, plan));
    const PoolLayer& layer = layers_[from];
    KVCORE_RETURN_IF_ERROR(check_buffer(layer_index, "gather", "k_out", k_out, k_capacity,
                                        extent.rows, layer.k_row_bytes, /*exact=*/false));
    KVCORE_RETURN_IF_ERROR(check_buffer(layer_index, "gather", "v_out", v_out, v_capacity,
                                        extent.rows, layer.v_row_bytes, /*exact=*/false));
    unsigned char* k_at = static_cast<unsigned char*>(k_out);
    unsigned char* v_at = static_cast<unsigned char*>(v_out);
    for (int i = 0; i < plan.n_read; ++i) {
      const Run& run = plan.read[i];
      const std::size_t k_run = layer.k_row_bytes * static_cast<std::size_t>(run.len);
      const std::size_t v_run = layer.v_row_bytes * static_cast<std::size_t>(run.len);
      std::memmove(k_at, layer.k + layer.k_row_bytes * static_cast<std::size_t>(run.row), k_run);
      std::memmove(v_at, layer.v + layer.v_row_bytes * static_cast<std::size_t>(run.row), v_run);
      k_at += k_run;
      v_at += v_run;
    }
    return Error::Ok;
  }

  /// The plan's read runs as zero-copy spans into the pool. A span shows the rows
  /// as they are: it stays valid until the layer grows (never in arena mode) and
  /// current until a later step writes those rows. In a mirrored ring layer a run
  /// that ends at the last row and the run that continues it from the first ring
  /// row are one span (its `run.row + run.len` then passes rows(layer): the rest
  /// is the mirror). A Shared layer's spans are its source's rows. Errors as
  /// gather() (no buffers).
  Result<KVViews> views(int layer_index, const SeqStepPlan& plan) const noexcept {
    KVCORE_ASSIGN_OR_RETURN(const int from, row_layer(layer_index, "views"));
    KVCORE_RETURN_IF_ERROR(check_read(from, plan));
    const PoolLayer& layer = layers_[from];
    const bool mirrored = layer.mirror_rows > 0 && layer.allocated_rows == layer.rows;
    KVViews out;
    for (int i = 0; i < plan.n_read; ++i) {
      const Run& run = plan.read[i];
      if (out.n > 0 && mirrored) {
        Run& last = out.span[out.n - 1].run;
        if (last.row + last.len == layer.rows && run.row == layer.ring_start &&
            run.pos == last.end_pos() && run.len <= layer.mirror_rows) {
          last.len += run.len;
          continue;
        }
      }
      KVSpan& span = out.span[out.n++];
      span.k = layer.k + layer.k_row_bytes * static_cast<std::size_t>(run.row);
      span.v = layer.v + layer.v_row_bytes * static_cast<std::size_t>(run.row);
      span.run = run;
    }
    return out;
  }

  /// Every row of `layer` that holds a position once `plan`'s step is written,
  /// in row order, as one zero-copy span: rows [0, geometry.held_rows(end)),
  /// end = plan.end_position(). Row r stands for position
  /// geometry.position_at(r, end): attention is order-invariant over keys, so a
  /// backend can attend over this span with a mask built from those positions
  /// (the visibility rule) instead of gathering a wrapped window into position
  /// order. Every position a query of the step sees is the position of exactly
  /// one row, which holds its K/V; the other rows (up to max_step - T on a
  /// wrapped ring, never more than rows(layer) in all) are invisible to every
  /// query and may hold anything, e.g. a rewound draft: the mask hides them. Validity as views().
  /// A Shared layer answers with its source's rows, `end` then being the end
  /// of its plan's last read run (its plan writes nothing). InvalidArgument:
  /// bad layer, a State layer, or a plan without writes (a Shared layer's:
  /// without reads) or reaching past the layer's rows.
  /// InvalidState: the rows are not all allocated yet (write the step first).
  Result<HeldRows> held_rows(int layer_index, const SeqStepPlan& plan) const noexcept {
    KVCORE_ASSIGN_OR_RETURN(const int from, row_layer(layer_index, "held_rows"));
    const bool shared = from != layer_index;
    const Run* runs = shared ? plan.read : plan.write;
    const int n_runs = shared ? plan.n_read : plan.n_write;
    KVCORE_RETURN_IF_ERROR(check_runs(from, runs, n_runs,
                                      shared ? SeqStepPlan::kMaxReadRuns : SeqStepPlan::kMaxWriteRuns,
                                      shared ? "read" : "write"));
    const PoolLayer& layer = layers_[from];
    KVCORE_CHECK_OR_RETURN_ERROR(n_runs >= 1, InvalidArgument, "held_rows of layer %d: the plan %s nothing",
                                 layer_index, shared ? "reads" : "writes");
    const int end = runs[n_runs - 1].end_pos();
    const int rows = layer.geometry.held_rows(end);
    KVCORE_CHECK_OR_RETURN_ERROR(
        rows <= layer.allocated_rows, InvalidState,
        "held_rows of layer %d: positions up to %d need %d rows, but the layer holds %d rows so "
        "far: write the step before reading it",
        layer_index, end - 1, rows, layer.allocated_rows);
    return HeldRows{layer.k, layer.v, rows, end};
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
  Status write_values(int layer_index, const SeqStepPlan& plan, DType in_type, const void* k,
                      std::size_t k_bytes, const void* v, std::size_t v_bytes) noexcept {
    KVCORE_RETURN_IF_ERROR(check_writes_rows(layer_index, "write_values"));
    if (!is_quantized(dtype_)) {
      KVCORE_CHECK_OR_RETURN_ERROR(in_type == dtype_, InvalidArgument,
                                   "write_values of layer %d: values of %s, the pool stores %s", layer_index,
                                   to_string(in_type), to_string(dtype_));
      return write(layer_index, plan, k, k_bytes, v, v_bytes);
    }
    KVCORE_RETURN_IF_ERROR(check_compute_type(layer_index, "write_values", "values", in_type));
    KVCORE_ASSIGN_OR_RETURN(const Extent extent,
                            check_runs(layer_index, plan.write, plan.n_write,
                                       SeqStepPlan::kMaxWriteRuns, "write"));
    const PoolLayer& shape = layers_[layer_index];
    const std::size_t k_in = value_row_bytes(shape.n_kv_heads, shape.head_dim, in_type);
    const std::size_t v_in = value_row_bytes(shape.n_kv_heads, shape.value_dim, in_type);
    KVCORE_RETURN_IF_ERROR(check_buffer(layer_index, "write_values", "k", k, k_bytes, extent.rows, k_in, true));
    KVCORE_RETURN_IF_ERROR(check_buffer(layer_index, "write_values", "v", v, v_bytes, extent.rows, v_in, true));
    KVCORE_RETURN_IF_ERROR(check_quantizable("write_values", "k", layer_index, in_type, k, extent.rows,
                                             shape.n_kv_heads, shape.head_dim));
    KVCORE_RETURN_IF_ERROR(check_quantizable("write_values", "v", layer_index, in_type, v, extent.rows,
                                             shape.n_kv_heads, shape.value_dim));
    KVCORE_RETURN_IF_ERROR(check_apart(shape, "write_values", layer_index, k, k_bytes, v, v_bytes));
    if (extent.end_row > shape.allocated_rows) {
      KVCORE_RETURN_IF_ERROR(grow(layer_index, grown_rows(shape, extent.end_row)));
    }
    const PoolLayer& layer = layers_[layer_index];
    std::size_t j = 0;  // input row
    for (int i = 0; i < plan.n_write; ++i) {
      const Run& run = plan.write[i];
      for (int r = 0; r < run.len; ++r, ++j) {
        const std::size_t row = static_cast<std::size_t>(run.row + r);
        quantize_row(dtype_, layer.n_kv_heads, layer.head_dim, in_type,
                     static_cast<const unsigned char*>(k) + k_in * j, layer.k + layer.k_row_bytes * row);
        quantize_row(dtype_, layer.n_kv_heads, layer.value_dim, in_type,
                     static_cast<const unsigned char*>(v) + v_in * j, layer.v + layer.v_row_bytes * row);
      }
    }
    for (int i = 0; i < plan.n_write; ++i) KVPoolTraits::mirror_run(layer, plan.write[i]);
    return Error::Ok;
  }

  /// gather() for values: the plan's read runs, in position order,
  /// dequantized into k_out/v_out as `out_type` values (at least read_len()
  /// rows of n_kv_heads x head_dim / value_dim each). Only a quantized pool.
  /// InvalidArgument: as gather(); a plain pool (use gather or views);
  /// `out_type` not float32, float16 or bfloat16. InvalidState: as gather().
  Status gather_values(int layer_index, const SeqStepPlan& plan, DType out_type, void* k_out,
                       std::size_t k_capacity, void* v_out, std::size_t v_capacity) const noexcept {
    KVCORE_ASSIGN_OR_RETURN(const int from, row_layer(layer_index, "gather_values"));
    KVCORE_ASSIGN_OR_RETURN(const Extent extent, check_read(from, plan));
    KVCORE_RETURN_IF_ERROR(check_dequantize(layer_index, "gather_values", out_type));
    const PoolLayer& layer = layers_[from];
    const std::size_t k_row = value_row_bytes(layer.n_kv_heads, layer.head_dim, out_type);
    const std::size_t v_row = value_row_bytes(layer.n_kv_heads, layer.value_dim, out_type);
    KVCORE_RETURN_IF_ERROR(check_buffer(layer_index, "gather_values", "k_out", k_out, k_capacity, extent.rows,
                                        k_row, false));
    KVCORE_RETURN_IF_ERROR(check_buffer(layer_index, "gather_values", "v_out", v_out, v_capacity, extent.rows,
                                        v_row, false));
    unsigned char* k_at = static_cast<unsigned char*>(k_out);
    unsigned char* v_at = static_cast<unsigned char*>(v_out);
    for (int i = 0; i < plan.n_read; ++i) {
      const Run& run = plan.read[i];
      const std::size_t row = static_cast<std::size_t>(run.row);
      dequantize_rows(dtype_, layer.n_kv_heads, layer.head_dim, layer.k + layer.k_row_bytes * row, run.len,
                      out_type, k_at);
      dequantize_rows(dtype_, layer.n_kv_heads, layer.value_dim, layer.v + layer.v_row_bytes * row, run.len,
                      out_type, v_at);
      k_at += k_row * static_cast<std::size_t>(run.len);
      v_at += v_row * static_cast<std::size_t>(run.len);
    }
    return Error::Ok;
  }

  /// held_rows() for values: the same rows, in row order, dequantized into
  /// k_out/v_out as `out_type` values; the result's k/v point at k_out/v_out.
  /// Only a quantized pool. Errors as held_rows(), plus gather_values()'s.
  Result<HeldRows> held_values(int layer_index, const SeqStepPlan& plan, DType out_type, void* k_out,
                               std::size_t k_capacity, void* v_out, std::size_t v_capacity) const noexcept {
    KVCORE_ASSIGN_OR_RETURN(const HeldRows held, held_rows(layer_index, plan));
    KVCORE_RETURN_IF_ERROR(check_dequantize(layer_index, "held_values", out_type));
    const PoolLayer& layer = layers_[layer_index];
    KVCORE_RETURN_IF_ERROR(check_buffer(layer_index, "held_values", "k_out", k_out, k_capacity, held.rows,
                                        value_row_bytes(layer.n_kv_heads, layer.head_dim, out_type), false));
    KVCORE_RETURN_IF_ERROR(check_buffer(layer_index, "held_values", "v_out", v_out, v_capacity, held.rows,
                                        value_row_bytes(layer.n_kv_heads, layer.value_dim, out_type), false));
    dequantize_rows(dtype_, layer.n_kv_heads, layer.head_dim, held.k, held.rows, out_type, k_out);
    dequantize_rows(dtype_, layer.n_kv_heads, layer.value_dim, held.v, held.rows, out_type, v_out);
    return HeldRows{static_cast<const unsigned char*>(k_out), static_cast<const unsigned char*>(v_out), held.rows,
                    held.end};
  }

  /// Ok when a step writes K/V rows into `layer_index` (a Flat, Ring or
  /// Chunked layer). InvalidArgument naming `what`: bad layer, a Shared layer
  /// (it writes nothing: its source's rows are written), a State layer.
  Status check_writes_rows(int layer_index, const char* what) const noexcept {
    KVCORE_ASSIGN_OR_RETURN(const int from, row_layer(layer_index, what));
    KVCORE_CHECK_OR_RETURN_ERROR(from == layer_index, InvalidArgument,
                                 "%s: layer %d is Shared(%d): it writes nothing; write layer %d", what,
                                 layer_index, from, from);
    return Error::Ok;
  }


  /// Copies the step's states into the slots `plan` (the State layer's plan
  /// of the step) writes: input slot j (k_row_bytes bytes each; `bytes`
  /// exactly write_len() slots) goes to the j-th written slot, i.e. the state
  /// after position write[..].pos + j. InvalidArgument (nothing written): bad
  /// layer, not a State layer, a write run outside the slots [0, D), `states`
  /// null or not exactly write_len() slots, or overlapping the layer's slots
  /// (pass a copy).
  Status write_state(int layer_index, const SeqStepPlan& plan, const void* states,
                     std::size_t bytes) noexcept {
    KVCORE_RETURN_IF_ERROR(check_state_layer(layer_index, "write_state"));
    KVCORE_ASSIGN_OR_RETURN(const Extent extent,
                            check_runs(layer_index, plan.write, plan.n_write,
                                       SeqStepPlan::kMaxWriteRuns, "write"));
    const PoolLayer& layer = layers_[layer_index];
    KVCORE_RETURN_IF_ERROR(check_state_input(layer, layer_index, "write_state", states, bytes, extent.rows));
    const unsigned char* in = static_cast<const unsigned char*>(states);
    for (int i = 0; i < plan.n_write; ++i) {
      const Run& run = plan.write[i];
      const std::size_t n = layer.k_row_bytes * static_cast<std::size_t>(run.len);
      std::memcpy(layer.k + layer.k_row_bytes * static_cast<std::size_t>(run.row), in, n);
      in += n;
    }
    return Error::Ok;
  }

  /// Copies the state `plan`'s step starts from into `out` (at least
  /// k_row_bytes bytes): the slot its read run names (the state after P - 1),
  /// or zeros when the plan reads none (P = 0: a state starts at zeros). Read
  /// it before write_state(): a step without verify may write its last state
  /// into that slot. InvalidArgument: bad layer, not a State layer, a read run
  /// outside the slots [0, D), a plan reading more than one slot, `out` null
  /// or too small.
  Status read_state(int layer_index, const SeqStepPlan& plan, void* out, std::size_t capacity) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_state_layer(layer_index, "read_state"));
    KVCORE_ASSIGN_OR_RETURN(const Extent extent,
                            check_runs(layer_index, plan.read, plan.n_read, SeqStepPlan::kMaxReadRuns, "read"));
    KVCORE_CHECK_OR_RETURN_ERROR(extent.rows <= 1, InvalidArgument,
                                 "read_state of layer %d: the plan reads %lld slots: a step starts from "
                                 "one state (none at position 0)",
                                 layer_index, static_cast<long long>(extent.rows));
    const PoolLayer& layer = layers_[layer_index];
    KVCORE_RETURN_IF_ERROR(check_buffer(layer_index, "read_state", "out", out, capacity, 1, layer.k_row_bytes,
                                        /*exact=*/false));
    if (plan.n_read == 0) {
      std::memset(out, 0, layer.k_row_bytes);
    } else {
      std::memmove(out, layer.k + layer.k_row_bytes * static_cast<std::size_t>(plan.read[0].row),
                   layer.k_row_bytes);
    }
    return Error::Ok;
  }

  /// Slot `slot` of State layer `layer_index`, zero-copy: k_row_bytes bytes
  /// for a kernel that reads and writes slots itself (vLLM-style
  /// state_indices: the plan's read run's row is the slot it starts from, its
  /// write runs' rows the slots it fills, in order). Valid for the pool's life
  /// (a State layer never grows after creation). InvalidArgument: bad layer,
  /// not a State layer, slot outside [0, D).
  Result<unsigned char*> state_slot(int layer_index, int slot) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_state_layer(layer_index, "state_slot"));
    const PoolLayer& layer = layers_[layer_index];
    KVCORE_CHECK_OR_RETURN_ERROR(slot >= 0 && slot < layer.rows, InvalidArgument,
                                 "state_slot of layer %d: slot = %d: must be in [0, D = %d)", layer_index, slot,
                                 layer.rows);
    return layer.k + layer.k_row_bytes * static_cast<std::size_t>(slot);
  }

  /// InvalidArgument unless `states` (`bytes`) are exactly `slots` states of
  /// State layer `layer` and share no byte with its slots (`what` names the verb).
  static Status check_state_input(const PoolLayer& layer, int layer_index, const char* what, const void* states,
                                  std::size_t bytes, std::int64_t slots) noexcept {
    KVCORE_RETURN_IF_ERROR(
        check_buffer(layer_index, what, "states", states, bytes, slots, layer.k_row_bytes, /*exact=*/true));
    const std::size_t all = layer.k_row_bytes * static_cast<std::size_t>(layer.rows);
    KVCORE_CHECK_OR_RETURN_ERROR(disjoint(states, bytes, layer.k, all), InvalidArgument,
                                 "%s of layer %d: the states overlap the layer's slots: pass a copy", what,
                                 layer_index);
    return Error::Ok;
  }

 private:
  // Rows and one-past-the-last row of a checked list of runs.
  struct Extent {
    std::int64_t rows = 0;
    int end_row = 0;
  };

  KVPool(DType dtype, PoolAllocator allocator) noexcept : PoolStorage(dtype, allocator) {}

  Status check_dequantize(int layer_index, const char* what, DType out_type) const noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(is_quantized(dtype_), InvalidArgument,
                                 "%s of layer %d: the pool stores %s, not a quantized format (qint8, "
                                 "fp8_e4m3): read its rows as they are",
                                 what, layer_index, to_string(dtype_));
    return check_compute_type(layer_index, what, "values", out_type);
  }

  static Status check_ring_storage(RingStorage storage) noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(
        storage == RingStorage::Compact || storage == RingStorage::Mirrored, InvalidArgument,
        "ring_storage = %d: must be Compact (0) or Mirrored (1)", static_cast<int>(storage));
    return Error::Ok;
  }

  // Shapes layer l as `planner` reports it (PoolStorage's shape_of).
  struct PlannerShape {
    const SequencePlanner& planner;
    DType dtype;
    RingStorage ring_storage;
    StateSlotBytes state_slot_bytes;

    Status operator()(int l, PoolLayer* out) const noexcept {
      KVCORE_ASSIGN_OR_RETURN(const LayerConfig config, planner.layer_config(l));
      KVCORE_ASSIGN_OR_RETURN(const LayerGeometry geometry, planner.geometry(l));
      return shape_layer(l, config, geometry, dtype, ring_storage, state_slot_bytes, out);
    }
  };

  // Row sizes and mirror of layer `l` (a Shared layer: its source's row
  // sizes, no rows); fails when its rows (mirror included) overflow the
  // address space. A State layer: shape_state().
  static Status shape_layer(int l, const LayerConfig& lc, const LayerGeometry& geometry, DType dtype,
                            RingStorage ring_storage, StateSlotBytes state, PoolLayer* out) noexcept {
    out->policy = lc.policy;
    if (lc.policy.kind == LayerPolicy::Kind::State) return shape_state(l, geometry, state, out);
    const int rows = geometry.rows;
    const int mirror_rows = ring_storage == RingStorage::Mirrored ? geometry.mirror_rows() : 0;
    const std::uint64_t storage =
        static_cast<std::uint64_t>(rows) + static_cast<std::uint64_t>(mirror_rows);
    KVCORE_CHECK_OR_RETURN_ERROR(
        row_bytes(lc, dtype, storage, &out->k_row_bytes, &out->v_row_bytes), InvalidArgument,
        "layer %d: %d rows of %d heads x (%d + %d) dims of %s overflow the address space", l,
        rows, lc.n_kv_heads, lc.head_dim, lc.value_dim(), to_string(dtype));
    out->n_kv_heads = lc.n_kv_heads;
    out->head_dim = lc.head_dim;
    out->value_dim = lc.value_dim();
    out->rows = rows;
    out->geometry = geometry;
    out->ring_start = geometry.sink_rows;
    out->mirror_rows = mirror_rows;
    return Error::Ok;
  }

  // State layer `l`: D = geometry.rows slots of state.bytes[l] bytes (K), no V.
  static Status shape_state(int l, const LayerGeometry& geometry, StateSlotBytes state, PoolLayer* out) noexcept {
    KVCORE_ASSIGN_OR_RETURN(const std::size_t slot, state.of(l));
    std::uint64_t all = 0;
    KVCORE_CHECK_OR_RETURN_ERROR(checked_mul(static_cast<std::uint64_t>(geometry.rows), slot, &all),
                                 InvalidArgument,
                                 "layer %d: %d state slots of %zu bytes overflow the address space", l,
                                 geometry.rows, slot);
    out->k_row_bytes = slot;
    out->v_row_bytes = 0;
    out->rows = geometry.rows;
    out->geometry = geometry;
    return Error::Ok;
  }

  // A plan may come from anywhere: every run must lie inside the layer's rows.
  Result<Extent> check_runs(int layer_index, const Run* runs, int n, int max_runs,
                            const char* what) const noexcept {
    const PoolLayer& layer = layers_[layer_index];
    KVCORE_CHECK_OR_RETURN_ERROR(n >= 0 && n <= max_runs, InvalidArgument,
                                 "%s runs of layer %d: n = %d, must be in [0, %d]", what,
                                 layer_index, n, max_runs);
    Extent extent;
    for (int i = 0; i < n; ++i) {
      const Run& r = runs[i];
      KVCORE_CHECK_OR_RETURN_ERROR(
          r.row >= 0 && r.len >= 1 && r.pos >= 0 &&
              static_cast<std::int64_t>(r.row) + r.len <= layer.rows,
          InvalidArgument,
          "%s run %d of layer %d (row %d, len %d, pos %d): must lie in rows [0, %d) with "
          "len >= 1 and pos >= 0",
          what, i, layer_index, r.row, r.len, r.pos, layer.rows);
      extent.rows += r.len;
      if (r.row + r.len > extent.end_row) extent.end_row = r.row + r.len;
    }
    return extent;
  }

  Result<Extent> check_read(int layer_index, const SeqStepPlan& plan) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_layer(layer_index));
    KVCORE_ASSIGN_OR_RETURN(const Extent extent,
                            check_runs(layer_index, plan.read, plan.n_read,
                                       SeqStepPlan::kMaxReadRuns, "read"));
    const PoolLayer& layer = layers_[layer_index];
    KVCORE_CHECK_OR_RETURN_ERROR(
        extent.end_row <= layer.allocated_rows, InvalidState,
        "read of layer %d reaches row %d, but the layer holds %d rows so far: write the step "
        "before reading it",
        layer_index, extent.end_row - 1, layer.allocated_rows);
    return extent;
  }

  // Whether copying write run `first` (of two) leaves intact the input of the
  // other run: its destination rows, in K and in V, overlap neither input span.
  static bool copy_keeps_input(const PoolLayer& layer, const SeqStepPlan& plan, const void* k,
                               const void* v, int first) noexcept {
    const Run& dst = plan.write[first];
    const Run& src = plan.write[1 - first];
    const std::size_t src_offset = first == 0 ? static_cast<std::size_t>(plan.write[0].len) : 0;
    const std::size_t dst_rows = static_cast<std::size_t>(dst.len);
    const std::size_t src_rows = static_cast<std::size_t>(src.len);
    const unsigned char* dst_k = layer.k + layer.k_row_bytes * static_cast<std::size_t>(dst.row);
    const unsigned char* dst_v = layer.v + layer.v_row_bytes * static_cast<std::size_t>(dst.row);
    const unsigned char* in_k = static_cast<const unsigned char*>(k) + layer.k_row_bytes * src_offset;
    const unsigned char* in_v = static_cast<const unsigned char*>(v) + layer.v_row_bytes * src_offset;
    const std::size_t dk = layer.k_row_bytes * dst_rows, dv = layer.v_row_bytes * dst_rows;
    const std::size_t sk = layer.k_row_bytes * src_rows, sv = layer.v_row_bytes * src_rows;
    return disjoint(dst_k, dk, in_k, sk) && disjoint(dst_k, dk, in_v, sv) && disjoint(dst_v, dv, in_k, sk) &&
           disjoint(dst_v, dv, in_v, sv);
  }
};

}  // namespace kvcore
