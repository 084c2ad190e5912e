// KVPoolReads: how attention reads a KVPool's K/V rows (kv_pool.h): gather
// copies the plan's read runs contiguously in position order, views hands
// them out as zero-copy spans (one span per run; a Mirrored ring makes a
// wrapped window one), held_rows the layer's rows that hold positions as one
// span; the _values forms dequantize a quantized pool's rows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kvcore/core/config.h"
#include "kvcore/core/geometry.h"
#include "kvcore/core/plan.h"
#include "kvcore/core/result.h"
#include "kvcore/pool/parts/kv_pool_states.h"
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

/// KVPoolStates plus the K/V read verbs.
class KVPoolReads : public KVPoolStates {
 public:
  /// Copies the plan's read runs, in position order, into contiguous k_out/v_out
  /// (at least read_len() rows each). InvalidArgument: bad layer, a run outside the
  /// layer's rows, an output too small or null, a State layer. InvalidState: a run reaches rows
  /// the pool has not grown to yet (write the step before reading it). A Shared
  /// layer's plan reads its source's rows: they are copied from the source.
  Status gather(int layer, const SeqStepPlan& plan, void* k_out, std::size_t k_capacity,
                void* v_out, std::size_t v_capacity) const noexcept {
    KVCORE_ASSIGN_OR_RETURN(const int from, row_layer(layer, "gather"));
    KVCORE_ASSIGN_OR_RETURN(const Extent extent, check_read(from, plan));
    const PoolLayer& stored = layers_[from];
    KVCORE_RETURN_IF_ERROR(check_buffer(layer, "gather", "k_out", k_out, k_capacity,
                                        extent.rows, stored.k_row_bytes, /*exact=*/false));
    KVCORE_RETURN_IF_ERROR(check_buffer(layer, "gather", "v_out", v_out, v_capacity,
                                        extent.rows, stored.v_row_bytes, /*exact=*/false));
    unsigned char* k_at = static_cast<unsigned char*>(k_out);
    unsigned char* v_at = static_cast<unsigned char*>(v_out);
    for (int i = 0; i < plan.n_read; ++i) {
      const Run& run = plan.read[i];
      const std::size_t k_run = stored.k_row_bytes * static_cast<std::size_t>(run.len);
      const std::size_t v_run = stored.v_row_bytes * static_cast<std::size_t>(run.len);
      std::memmove(k_at, stored.k + stored.k_row_bytes * static_cast<std::size_t>(run.row), k_run);
      std::memmove(v_at, stored.v + stored.v_row_bytes * static_cast<std::size_t>(run.row), v_run);
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
  Result<KVViews> views(int layer, const SeqStepPlan& plan) const noexcept {
    KVCORE_ASSIGN_OR_RETURN(const int from, row_layer(layer, "views"));
    KVCORE_RETURN_IF_ERROR(check_read(from, plan));
    const PoolLayer& stored = layers_[from];
    const bool mirrored = stored.mirror_rows > 0 && stored.allocated_rows == stored.rows;
    KVViews out;
    for (int i = 0; i < plan.n_read; ++i) {
      const Run& run = plan.read[i];
      if (out.n > 0 && mirrored) {
        Run& last = out.span[out.n - 1].run;
        if (last.row + last.len == stored.rows && run.row == stored.ring_start &&
            run.pos == last.end_pos() && run.len <= stored.mirror_rows) {
          last.len += run.len;
          continue;
        }
      }
      KVSpan& span = out.span[out.n++];
      span.k = stored.k + stored.k_row_bytes * static_cast<std::size_t>(run.row);
      span.v = stored.v + stored.v_row_bytes * static_cast<std::size_t>(run.row);
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
  Result<HeldRows> held_rows(int layer, const SeqStepPlan& plan) const noexcept {
    KVCORE_ASSIGN_OR_RETURN(const int from, row_layer(layer, "held_rows"));
    const bool shared = from != layer;
    const Run* runs = shared ? plan.read : plan.write;
    const int n_runs = shared ? plan.n_read : plan.n_write;
    KVCORE_RETURN_IF_ERROR(check_runs(from, runs, n_runs,
                                      shared ? SeqStepPlan::kMaxReadRuns : SeqStepPlan::kMaxWriteRuns,
                                      shared ? "read" : "write"));
    const PoolLayer& stored = layers_[from];
    KVCORE_CHECK_OR_RETURN_ERROR(n_runs >= 1, InvalidArgument, "held_rows of layer %d: the plan %s nothing",
                                 layer, shared ? "reads" : "writes");
    const int end = runs[n_runs - 1].end_pos();
    const int rows = stored.geometry.held_rows(end);
    KVCORE_CHECK_OR_RETURN_ERROR(
        rows <= stored.allocated_rows, InvalidState,
        "held_rows of layer %d: positions up to %d need %d rows, but the layer holds %d rows so "
        "far: write the step before reading it",
        layer, end - 1, rows, stored.allocated_rows);
    return HeldRows{stored.k, stored.v, rows, end};
  }

  /// gather() for values: the plan's read runs, in position order,
  /// dequantized into k_out/v_out as `out_type` values (at least read_len()
  /// rows of n_kv_heads x head_dim / value_dim each). Only a quantized pool.
  /// InvalidArgument: as gather(); a plain pool (use gather or views);
  /// `out_type` not float32, float16 or bfloat16. InvalidState: as gather().
  Status gather_values(int layer, const SeqStepPlan& plan, DType out_type, void* k_out,
                       std::size_t k_capacity, void* v_out, std::size_t v_capacity) const noexcept {
    KVCORE_ASSIGN_OR_RETURN(const int from, row_layer(layer, "gather_values"));
    KVCORE_ASSIGN_OR_RETURN(const Extent extent, check_read(from, plan));
    KVCORE_RETURN_IF_ERROR(check_dequantize(layer, "gather_values", out_type));
    const PoolLayer& stored = layers_[from];
    const std::size_t k_row = value_row_bytes(stored.n_kv_heads, stored.head_dim, out_type);
    const std::size_t v_row = value_row_bytes(stored.n_kv_heads, stored.value_dim, out_type);
    KVCORE_RETURN_IF_ERROR(check_buffer(layer, "gather_values", "k_out", k_out, k_capacity, extent.rows,
                                        k_row, false));
    KVCORE_RETURN_IF_ERROR(check_buffer(layer, "gather_values", "v_out", v_out, v_capacity, extent.rows,
                                        v_row, false));
    unsigned char* k_at = static_cast<unsigned char*>(k_out);
    unsigned char* v_at = static_cast<unsigned char*>(v_out);
    for (int i = 0; i < plan.n_read; ++i) {
      const Run& run = plan.read[i];
      const std::size_t row = static_cast<std::size_t>(run.row);
      dequantize_rows(dtype_, stored.n_kv_heads, stored.head_dim, stored.k + stored.k_row_bytes * row, run.len,
                      out_type, k_at);
      dequantize_rows(dtype_, stored.n_kv_heads, stored.value_dim, stored.v + stored.v_row_bytes * row, run.len,
                      out_type, v_at);
      k_at += k_row * static_cast<std::size_t>(run.len);
      v_at += v_row * static_cast<std::size_t>(run.len);
    }
    return Error::Ok;
  }

  /// held_rows() for values: the same rows, in row order, dequantized into
  /// k_out/v_out as `out_type` values; the result's k/v point at k_out/v_out.
  /// Only a quantized pool. Errors as held_rows(), plus gather_values()'s.
  Result<HeldRows> held_values(int layer, const SeqStepPlan& plan, DType out_type, void* k_out,
                               std::size_t k_capacity, void* v_out, std::size_t v_capacity) const noexcept {
    KVCORE_ASSIGN_OR_RETURN(const HeldRows held, held_rows(layer, plan));
    KVCORE_RETURN_IF_ERROR(dequantize_span(layer, "held_values", held.k, held.v, held.rows, out_type, k_out,
                                           k_capacity, v_out, v_capacity));
    return HeldRows{static_cast<const unsigned char*>(k_out), static_cast<const unsigned char*>(v_out), held.rows,
                    held.end};
  }

 protected:
  KVPoolReads(DType dtype, PoolAllocator allocator) noexcept : KVPoolStates(dtype, allocator) {}
};

}  // namespace kvcore
