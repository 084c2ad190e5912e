// PagedReads: how attention reads a PagedKVPool's K/V rows (paged_kv_pool.h):
// rows(layer), the layer's live rows as one zero-copy span for backends that
// attend over the whole pool (masked by fill_step_mask, batch/step_mask.h),
// and gather(layer, plan, entry), one sequence's visible history copied
// contiguously in increasing positions for backends that attend per
// sequence; their _values forms dequantize a quantized pool's rows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kvcore/batch/batch_plan.h"
#include "kvcore/core/result.h"
#include "kvcore/pool/parts/paged_states.h"
#include "kvcore/pool/quantize.h"

namespace kvcore {

/// PagedStates plus the K/V read verbs.
class PagedReads : public PagedStates {
 public:
  /// The layer's live rows [0, used_blocks(group) * B) as one zero-copy span:
  /// every row any sequence's block table names lies in it. Attention over the
  /// whole pool at once masks it with fill_step_mask(plan, group, rows, mask).
  /// A span shows the rows as they are: valid until the layer
  /// grows (never in arena mode), current until a later update writes them.
  /// A Shared layer's span is its source's rows. InvalidArgument: bad layer,
  /// a State layer (state_slot). InvalidState: the live rows reach past the
  /// storage (update the layer for the begun step first).
  Result<PagedRows> rows(int layer) const noexcept {
    KVCORE_ASSIGN_OR_RETURN(const int from, row_layer(layer, "rows"));
    const PagedLayer& stored = layers_[from];
    KVCORE_ASSIGN_OR_RETURN(const int used, planner_->used_blocks(stored.group));
    const std::int64_t live = static_cast<std::int64_t>(used) * block_size_;
    KVCORE_CHECK_OR_RETURN_ERROR(
        live <= stored.allocated_rows, InvalidState,
        "rows of layer %d: %lld live rows (used_blocks * block_size), but the layer holds %d rows "
        "so far: update the layer for the step first",
        from, static_cast<long long>(live), stored.allocated_rows);
    return PagedRows{stored.k, stored.v, static_cast<int>(live)};
  }

  /// Rows gather(layer, plan, entry) writes: the entry's visible positions
  /// (see gather). Errors as gather(), without the buffers.
  Result<int> gather_rows(int layer, const BatchStepPlan& plan, int entry) const noexcept {
    KVCORE_ASSIGN_OR_RETURN(const int from, row_layer(layer, "gather_rows"));
    KVCORE_RETURN_IF_ERROR(check_plan(from, plan, /*gather=*/true));
    return check_entry(from, plan, entry);
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
  Result<int> gather(int layer, const BatchStepPlan& plan, int entry, void* k_out,
                     std::size_t k_capacity, void* v_out, std::size_t v_capacity,
                     std::int64_t* positions = nullptr, std::size_t positions_capacity = 0) const noexcept {
    KVCORE_ASSIGN_OR_RETURN(const int from, row_layer(layer, "gather"));
    const PagedLayer& shape = layers_[from];
    return gather_with(from, plan, entry, "gather", k_out, k_capacity, shape.k_row_bytes, v_out, v_capacity,
                       shape.v_row_bytes, positions, positions_capacity,
                       [](const PagedLayer& stored, std::size_t row, int len, unsigned char* k_at,
                          unsigned char* v_at) {
                         std::memcpy(k_at, stored.k + stored.k_row_bytes * row,
                                     stored.k_row_bytes * static_cast<std::size_t>(len));
                         std::memcpy(v_at, stored.v + stored.v_row_bytes * row,
                                     stored.v_row_bytes * static_cast<std::size_t>(len));
                       });
  }

  /// gather() for values: the entry's visible history dequantized into
  /// k_out/v_out as `out_type` values (rows of n_kv_heads x head_dim /
  /// value_dim). Only a quantized pool. Errors as gather(); InvalidArgument: a
  /// plain pool (use gather), `out_type` not float32, float16 or bfloat16.
  Result<int> gather_values(int layer, const BatchStepPlan& plan, int entry, DType out_type,
                            void* k_out, std::size_t k_capacity, void* v_out, std::size_t v_capacity,
                            std::int64_t* positions = nullptr, std::size_t positions_capacity = 0) const noexcept {
    KVCORE_ASSIGN_OR_RETURN(const int from, row_layer(layer, "gather_values"));
    KVCORE_RETURN_IF_ERROR(check_dequantize(from, "gather_values", out_type));
    const PagedLayer& shape = layers_[from];
    const DType format = dtype_;
    return gather_with(from, plan, entry, "gather_values", k_out, k_capacity,
                       value_row_bytes(shape.n_kv_heads, shape.head_dim, out_type), v_out, v_capacity,
                       value_row_bytes(shape.n_kv_heads, shape.value_dim, out_type), positions, positions_capacity,
                       [format, out_type](const PagedLayer& stored, std::size_t row, int len, unsigned char* k_at,
                                          unsigned char* v_at) {
                         dequantize_rows(format, stored.n_kv_heads, stored.head_dim, stored.k + stored.k_row_bytes * row,
                                         len, out_type, k_at);
                         dequantize_rows(format, stored.n_kv_heads, stored.value_dim,
                                         stored.v + stored.v_row_bytes * row, len, out_type, v_at);
                       });
  }

  /// rows() for values: the live rows dequantized into k_out/v_out as
  /// `out_type` values (at least rows x n_kv_heads x head_dim / value_dim);
  /// the result's k/v point at k_out/v_out. Only a quantized pool. Errors as
  /// rows(); InvalidArgument: a plain pool, another out_type, outputs too small.
  Result<PagedRows> rows_values(int layer, DType out_type, void* k_out, std::size_t k_capacity,
                                void* v_out, std::size_t v_capacity) const noexcept {
    KVCORE_ASSIGN_OR_RETURN(const PagedRows live, rows(layer));
    const int from = layers_[layer].policy.kind == LayerPolicy::Kind::Shared
                                ? layers_[layer].policy.source
                                : layer;
    KVCORE_RETURN_IF_ERROR(dequantize_span(from, "rows_values", live.k, live.v, live.rows, out_type, k_out,
                                           k_capacity, v_out, v_capacity));
    return PagedRows{static_cast<const unsigned char*>(k_out), static_cast<const unsigned char*>(v_out), live.rows};
  }

 protected:
  PagedReads(const BatchPlanner& planner, DType dtype, PoolAllocator allocator) noexcept
      : PagedStates(planner, dtype, allocator) {}

 private:
  // gather()'s checks and walk; copy(layer, first row, len, k_at, v_at) moves
  // each stretch of consecutive rows, k_out_row / v_out_row bytes a row out.
  template <typename CopyRows>
  Result<int> gather_with(int layer, const BatchStepPlan& plan, int entry, const char* what, void* k_out,
                          std::size_t k_capacity, std::size_t k_out_row, void* v_out, std::size_t v_capacity,
                          std::size_t v_out_row, std::int64_t* positions, std::size_t positions_capacity,
                          CopyRows copy) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_plan(layer, plan, /*gather=*/true));
    KVCORE_ASSIGN_OR_RETURN(const int n, check_entry(layer, plan, entry));
    const PagedLayer& stored = layers_[layer];
    KVCORE_RETURN_IF_ERROR(check_buffer(layer, what, "k_out", k_out, k_capacity, n, k_out_row,
                                        /*exact=*/false));
    KVCORE_RETURN_IF_ERROR(check_buffer(layer, what, "v_out", v_out, v_capacity, n, v_out_row,
                                        /*exact=*/false));
    KVCORE_CHECK_OR_RETURN_ERROR(
        positions == nullptr || positions_capacity >= static_cast<std::size_t>(n), InvalidArgument,
        "gather of layer %d: positions holds %zu, needs %d", layer, positions_capacity, n);
    const int B = block_size_;
    const TableRow table = entry_table(stored, plan, entry);
    unsigned char* k_at = static_cast<unsigned char*>(k_out);
    unsigned char* v_at = static_cast<unsigned char*>(v_out);
    std::int64_t* pos_at = positions;
    for_each_visible(stored, plan, entry, [&](int begin, int end) {
      for (int p = begin; p < end;) {
        const int offset = p % B;
        const int len = B - offset < end - p ? B - offset : end - p;
        const std::size_t row =
            static_cast<std::size_t>(table[p / B]) * static_cast<std::size_t>(B) + static_cast<std::size_t>(offset);
        copy(stored, row, len, k_at, v_at);
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

  TableRow entry_table(const PagedLayer& layer, const BatchStepPlan& plan, int entry) const noexcept {
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
  Result<int> check_entry(int layer, const BatchStepPlan& plan, int entry) const noexcept {
    const PagedLayer& stored = layers_[layer];
    const GroupPlan& gp = plan.groups[stored.group];
    KVCORE_CHECK_OR_RETURN_ERROR(entry >= 0 && entry < plan.n_entries, InvalidArgument,
                                 "gather of layer %d: entry = %d, must be in [0, n_entries = %d)",
                                 layer, entry, plan.n_entries);
    const int seq = plan.seq_ids[entry], first = plan.first_positions[entry], ctx = plan.context_lens[entry];
    const int B = block_size_;
    KVCORE_CHECK_OR_RETURN_ERROR(
        seq >= 0 && (plan.table_rows == nullptr || plan.table_rows[seq] >= 0) && first >= 0 && first <= ctx && plan.visible_starts[entry] >= 0 && gp.table_pages != nullptr && gp.table_dir != nullptr &&
            static_cast<std::int64_t>(ctx) <= static_cast<std::int64_t>(gp.table_stride) * B,
        InvalidArgument,
        "gather of layer %d: entry %d (seq %d, positions [%d, %d), table_stride %d) does not fit "
        "its block table",
        layer, entry, seq, first, ctx, gp.table_stride);
    const TableRow table = entry_table(stored, plan, entry);
    const int n_blocks = stored.rows / B;
    int n = 0;
    Status bad;
    for_each_visible(stored, plan, entry, [&](int begin, int end) {
      for (int i = begin / B; i <= (end - 1) / B; ++i) {
        const int block = table[i];
        const int p = i * B > begin ? i * B : begin;
        if (block < 0 || block >= n_blocks) {
          bad = Status::make(Error::InvalidArgument,
                             "gather of layer %d: entry %d sees position %d, but its block %d is "
                             "not in [0, %d)",
                             layer, entry, p, block, n_blocks);
          return false;
        }
        const std::int64_t row_end = static_cast<std::int64_t>(block) * B + B;
        if (row_end > stored.allocated_rows) {
          bad = Status::make(Error::InvalidState,
                             "gather of layer %d: position %d lives in block %d, but the layer holds "
                             "%d rows so far: update the layer for the step first",
                             layer, p, block, stored.allocated_rows);
          return false;
        }
      }
      n += end - begin;
      return true;
    });
    if (!bad.ok()) return bad;
    return n;
  }
};

}  // namespace kvcore
