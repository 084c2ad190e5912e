// PoolBytes: byte arithmetic and buffer checks shared by the byte layers
// (KVPool, PagedKVPool): sizes checked against the address space before anything is
// allocated, arena carving, and the argument checks whose messages name the
// layer, the buffer and the rule.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "kvcore/core/config.h"
#include "kvcore/core/result.h"
#include "kvcore/pool/dtype.h"
#include "kvcore/pool/pool_allocator.h"

namespace kvcore {

/// Static helpers of the byte layers (they inherit them privately: no state).
struct PoolBytes {
  /// Alignment of every block an arena pool carves (the layer table, each K and
  /// each V), in bytes: a cache line, enough for any element type.
  static constexpr std::size_t kArenaAlignment = 64;

  /// Largest byte count a pool deals in: every size fits ptrdiff_t.
  static constexpr std::uint64_t kMaxBytes = static_cast<std::uint64_t>(PTRDIFF_MAX);

  /// *out = a * b; false (and *out untouched) when it would pass kMaxBytes.
  static bool checked_mul(std::uint64_t a, std::uint64_t b, std::uint64_t* out) noexcept {
    if (a != 0 && b > kMaxBytes / a) return false;
    *out = a * b;
    return true;
  }

  /// *out = a + b; false (and *out untouched) when it would pass kMaxBytes.
  static bool checked_add(std::uint64_t a, std::uint64_t b, std::uint64_t* out) noexcept {
    if (a > kMaxBytes || b > kMaxBytes - a) return false;
    *out = a + b;
    return true;
  }

  /// Bytes of one K row (n_kv_heads x head_dim elements of `dtype`; a quantized
  /// format's row with its scales, dtype.h's row_size) and one V row (n_kv_heads
  /// x value_dim) of `lc`; false (outputs untouched) when a count is negative or
  /// `rows` rows of both together pass kMaxBytes.
  static bool row_bytes(const LayerConfig& lc, DType dtype, std::uint64_t rows,
                        std::size_t* k_row_bytes, std::size_t* v_row_bytes) noexcept {
    if (lc.n_kv_heads < 0 || lc.head_dim < 0 || lc.value_dim() < 0) return false;
    std::uint64_t k_row = 0, v_row = 0, k_all = 0, v_all = 0;
    const std::uint64_t heads = static_cast<std::uint64_t>(lc.n_kv_heads);
    const bool fits = row_size(dtype, heads, static_cast<std::uint64_t>(lc.head_dim), kMaxBytes, &k_row) &&
                      row_size(dtype, heads, static_cast<std::uint64_t>(lc.value_dim()), kMaxBytes, &v_row) &&
                      checked_mul(k_row, rows, &k_all) && checked_mul(v_row, rows, &v_all) &&
                      checked_add(k_all, v_all, &k_all);
    if (!fits) return false;
    *k_row_bytes = static_cast<std::size_t>(k_row);
    *v_row_bytes = static_cast<std::size_t>(v_row);
    return true;
  }

  /// Bytes of one row of heads x dim values of a compute type (float32,
  /// float16, bfloat16). Precondition: the layer's own rows fit (they are at
  /// least half as large, for one-byte formats a quarter: fits 64 bits).
  static std::size_t value_row_bytes(int heads, int dim, DType type) noexcept {
    return static_cast<std::size_t>(heads) * static_cast<std::size_t>(dim) * element_size(type);
  }

  /// InvalidArgument unless `type` is float32, float16 or bfloat16: the types
  /// a quantized pool takes values in and gives them out as.
  static Status check_compute_type(int layer, const char* what, const char* name, DType type) noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(
        type == DType::Float32 || type == DType::Float16 || type == DType::BFloat16, InvalidArgument,
        "%s of layer %d: %s of %s: quantized rows take and give float32, float16 or bfloat16", what,
        layer, name, to_string(type));
    return Error::Ok;
  }

  /// InvalidArgument unless k and v (k_bytes, v_bytes) share no byte with the
  /// layer's K and V storage (rows written one at a time could overwrite them).
  template <typename Layer>
  static Status check_apart(const Layer& stored, const char* what, int layer, const void* k,
                            std::size_t k_bytes, const void* v, std::size_t v_bytes) noexcept {
    const std::size_t k_all = stored.k_row_bytes * static_cast<std::size_t>(stored.storage_rows());
    const std::size_t v_all = stored.v_row_bytes * static_cast<std::size_t>(stored.storage_rows());
    KVCORE_CHECK_OR_RETURN_ERROR(disjoint(k, k_bytes, stored.k, k_all) && disjoint(k, k_bytes, stored.v, v_all) &&
                                     disjoint(v, v_bytes, stored.k, k_all) && disjoint(v, v_bytes, stored.v, v_all),
                                 InvalidArgument, "%s of layer %d: k/v overlap the layer's own rows: pass a copy",
                                 what, layer);
    return Error::Ok;
  }

  /// n rounded up to kArenaAlignment; n <= kMaxBytes, so this cannot wrap.
  static std::uint64_t round_up(std::uint64_t n) noexcept {
    return (n + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
  }

  /// The first kArenaAlignment-aligned address at or after p.
  static unsigned char* align_up(unsigned char* p) noexcept {
    const std::uintptr_t misalign = reinterpret_cast<std::uintptr_t>(p) % kArenaAlignment;
    return misalign == 0 ? p : p + (kArenaAlignment - misalign);
  }

  /// True when the byte ranges [a, a + a_bytes) and [b, b + b_bytes) share no byte.
  static bool disjoint(const void* a, std::size_t a_bytes, const void* b,
                       std::size_t b_bytes) noexcept {
    const std::uintptr_t x = reinterpret_cast<std::uintptr_t>(a);
    const std::uintptr_t y = reinterpret_cast<std::uintptr_t>(b);
    return a_bytes == 0 || b_bytes == 0 || x + a_bytes <= y || y + b_bytes <= x;
  }

  /// InvalidArgument unless dtype is one of kvcore::DType's values.
  static Status check_dtype(DType dtype) noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(element_size(dtype) != 0, InvalidArgument,
                                 "dtype = %d: not a kvcore::DType", static_cast<int>(dtype));
    return Error::Ok;
  }

  /// InvalidArgument unless buffer `name` of call `what` on layer `layer`
  /// holds `rows` rows of `row_bytes` bytes: exactly that many bytes (exact) or
  /// at least (an output), and is not null unless it needs no byte.
  static Status check_buffer(int layer, const char* what, const char* name, const void* data,
                             std::size_t bytes, std::int64_t rows, std::size_t row_bytes,
                             bool exact) noexcept {
    std::uint64_t need = 0;
    const bool sized = checked_mul(static_cast<std::uint64_t>(rows), row_bytes, &need);
    const bool ok = sized && (exact ? bytes == need : bytes >= need);
    KVCORE_CHECK_OR_RETURN_ERROR(
        ok, InvalidArgument, "%s of layer %d: %s has %zu bytes, %s %lld rows of %zu bytes = %llu",
        what, layer, name, bytes, exact ? "must be exactly" : "needs at least",
        static_cast<long long>(rows), row_bytes, static_cast<unsigned long long>(need));
    KVCORE_CHECK_OR_RETURN_ERROR(data != nullptr || need == 0, InvalidArgument,
                                 "%s of layer %d: %s is null", what, layer, name);
    return Error::Ok;
  }

  /// A growing layer's next size: doubling from its storage until `needed`
  /// rows fit, capped at its rows.
  template <typename Layer>
  static int grown_rows(const Layer& layer, int needed) noexcept {
    std::int64_t target = layer.allocated_rows > 0 ? layer.allocated_rows : 1;
    while (target < needed) target *= 2;
    return target < layer.rows ? static_cast<int>(target) : layer.rows;
  }

  /// Gives every layer's K and V blocks back to `allocator` and frees the
  /// layer table (calloc'ed); an arena pool owns nothing. Leaves `layers` null.
  template <typename Layer>
  static void release_layers(Layer*& layers, int n_layers, bool arena,
                             const PoolAllocator& allocator) noexcept {
    if (layers == nullptr || arena) return;
    for (int l = 0; l < n_layers; ++l) {
      if (layers[l].storage_of >= 0) continue;  // its owner's blocks
      if (layers[l].k != nullptr) allocator.release(allocator.context, layers[l].k);
      if (layers[l].v != nullptr) allocator.release(allocator.context, layers[l].v);
    }
    std::free(layers);
    layers = nullptr;
  }
};

}  // namespace kvcore
