// KVPoolStorage: the layers of a KVPool (kv_pool.h) and what every verb of it
// shares: each layer's shape, rows and ring mirror as the planner reports
// them, the bytes in use, and the checks a plan's runs must pass before a verb
// reads or writes. The verbs stack on it, one concept a file: KVPoolStates
// (State layers' slots, kv_pool_states.h), KVPoolReads (gather, views, held
// rows, kv_pool_reads.h), and KVPool itself (creation and writes).
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

namespace kvcore {

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

/// The layers of a KVPool and the checks its verbs share (no verb of its own
/// but the bytes in use and the layer-kind check).
class KVPoolStorage : public PoolStorage<KVPoolTraits> {
 public:
  /// Every K and V block of an arena starts on this boundary.
  static constexpr std::size_t kArenaAlignment = PoolBytes::kArenaAlignment;

  /// Bytes of the rows that hold positions [0, length) (min(length, rows) rows
  /// per layer; a State layer's min(length, D) slots, a Shared layer's none):
  /// what a cache of that length keeps alive.
  std::size_t used_bytes(int length) const noexcept {
    std::size_t n = 0;
    if (length <= 0) return 0;
    for (int l = 0; l < n_layers_; ++l) {
      const PoolLayer& layer = layers_[l];
      const int held = length < layer.rows ? length : layer.rows;
      n += (layer.k_row_bytes + layer.v_row_bytes) * static_cast<std::size_t>(held);
    }
    return n;
  }
  /// Deprecated alias of used_bytes (PagedKVPool's name; removed in kvcore 0.2.0).
  [[deprecated("KVPool::in_use_bytes: use used_bytes (removed in kvcore 0.2.0)")]]
  std::size_t in_use_bytes(int length) const noexcept { return used_bytes(length); }

  /// Ok when a step writes K/V rows into `layer` (a Flat, Ring or
  /// Chunked layer). InvalidArgument naming `what`: bad layer, a Shared layer
  /// (it writes nothing: its source's rows are written), a State layer.
  Status check_writes_rows(int layer, const char* what) const noexcept {
    KVCORE_ASSIGN_OR_RETURN(const int from, row_layer(layer, what));
    KVCORE_CHECK_OR_RETURN_ERROR(from == layer, InvalidArgument,
                                 "%s: layer %d is Shared(%d): it writes nothing; write layer %d", what,
                                 layer, from, from);
    return Error::Ok;
  }

 protected:
  KVPoolStorage(DType dtype, PoolAllocator allocator) noexcept : PoolStorage(dtype, allocator) {}

  // Rows and one-past-the-last row of a checked list of runs.
  struct Extent {
    std::int64_t rows = 0;
    int end_row = 0;
  };

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

  // A plan may come from anywhere: every run must lie inside the layer's rows.
  Result<Extent> check_runs(int layer, const Run* runs, int n, int max_runs,
                            const char* what) const noexcept {
    const PoolLayer& stored = layers_[layer];
    KVCORE_CHECK_OR_RETURN_ERROR(n >= 0 && n <= max_runs, InvalidArgument,
                                 "%s runs of layer %d: n = %d, must be in [0, %d]", what,
                                 layer, n, max_runs);
    Extent extent;
    for (int i = 0; i < n; ++i) {
      const Run& r = runs[i];
      KVCORE_CHECK_OR_RETURN_ERROR(
          r.row >= 0 && r.len >= 1 && r.pos >= 0 &&
              static_cast<std::int64_t>(r.row) + r.len <= stored.rows,
          InvalidArgument,
          "%s run %d of layer %d (row %d, len %d, pos %d): must lie in rows [0, %d) with "
          "len >= 1 and pos >= 0",
          what, i, layer, r.row, r.len, r.pos, stored.rows);
      extent.rows += r.len;
      if (r.row + r.len > extent.end_row) extent.end_row = r.row + r.len;
    }
    return extent;
  }

  Result<Extent> check_read(int layer, const SeqStepPlan& plan) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_layer(layer));
    KVCORE_ASSIGN_OR_RETURN(const Extent extent,
                            check_runs(layer, plan.read, plan.n_read,
                                       SeqStepPlan::kMaxReadRuns, "read"));
    const PoolLayer& stored = layers_[layer];
    KVCORE_CHECK_OR_RETURN_ERROR(
        extent.end_row <= stored.allocated_rows, InvalidState,
        "read of layer %d reaches row %d, but the layer holds %d rows so far: write the step "
        "before reading it",
        layer, extent.end_row - 1, stored.allocated_rows);
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
};

}  // namespace kvcore
