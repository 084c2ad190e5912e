// DType: the storage format of a pool's K/V rows. The byte layer only moves
// rows, so all it needs to know about a format is its name and a row's size.
// Plain types store n_kv_heads x dim elements per row. The quantized formats
// (QInt8, Fp8E4M3; docs/quantized.md) store one byte per element followed, in
// the same row, by each head's float32 scale (and QInt8's int8 zero point): a
// row that moves (a write, a ring mirror, a copy, a record) moves its scales.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvcore {

/// Serialized values: append-only.
enum class DType : int {
  Float32 = 0,
  Float16 = 1,
  BFloat16 = 2,
  Int8 = 3,
  UInt8 = 4,
  /// Asymmetric int8 per (row, head), ExecuTorch's QuantizedKVCache rule:
  /// int8 values, then per head a float32 scale and an int8 zero point.
  QInt8 = 5,
  /// float8 e4m3fn per (row, head): fp8 values, then per head a float32 scale.
  Fp8E4M3 = 6,
};

/// True for the formats whose rows carry per-head scales (QInt8, Fp8E4M3).
constexpr bool is_quantized(DType dtype) noexcept {
  return dtype == DType::QInt8 || dtype == DType::Fp8E4M3;
}

/// Bytes of one element (of a quantized format: of one stored value, its scales
/// aside; see row_size); 0 for a value outside the enum (never a valid type).
constexpr std::size_t element_size(DType dtype) noexcept {
  switch (dtype) {
    case DType::Float32: return 4;
    case DType::Float16: return 2;
    case DType::BFloat16: return 2;
    case DType::Int8: return 1;
    case DType::UInt8: return 1;
    case DType::QInt8: return 1;
    case DType::Fp8E4M3: return 1;
  }
  return 0;
}

/// The numpy-style name, e.g. "float16"; "unknown" for values outside the enum.
constexpr const char* to_string(DType dtype) noexcept {
  switch (dtype) {
    case DType::Float32: return "float32";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Int8: return "int8";
    case DType::UInt8: return "uint8";
    case DType::QInt8: return "qint8";
    case DType::Fp8E4M3: return "fp8_e4m3";
  }
  return "unknown";
}

/// Where the parts of one quantized row of `heads` x `dim` values lie, in bytes
/// from the row's start: the values (head h at h * dim), each head's float32
/// scale at `scales + 4 * h`, QInt8's int8 zero point at `zeros + h`; `bytes`
/// is the whole row, a multiple of 4 so that every row's scales are aligned.
struct QuantRowLayout {
  std::size_t scales = 0;
  std::size_t zeros = 0;
  std::size_t bytes = 0;

  /// The layout for `dtype` (a quantized one); the caller checked that
  /// heads * (dim + 9) + 6 fits a size_t (row_size does).
  static constexpr QuantRowLayout of(DType dtype, std::size_t heads, std::size_t dim) noexcept {
    QuantRowLayout l;
    l.scales = (heads * dim + 3) / 4 * 4;
    l.zeros = l.scales + 4 * heads;
    const std::size_t end = l.zeros + (dtype == DType::QInt8 ? heads : 0);
    l.bytes = (end + 3) / 4 * 4;
    return l;
  }
};

/// *out = bytes of one row of `heads` x `dim` elements stored as `dtype` (a
/// quantized format's row includes its scales and zero points); false (*out
/// untouched) for an unknown dtype or when the size passes `limit`.
inline bool row_size(DType dtype, std::uint64_t heads, std::uint64_t dim, std::uint64_t limit,
                     std::uint64_t* out) noexcept {
  const std::uint64_t size = element_size(dtype);
  if (size == 0) return false;
  if (heads != 0 && dim > limit / heads) return false;
  const std::uint64_t values = heads * dim;
  if (!is_quantized(dtype)) {
    if (values > limit / size) return false;
    *out = values * size;
    return true;
  }
  // values + up to 3 pad + 5 bytes per head + up to 3 pad.
  if (limit < 6 || heads > (limit - 6) / 8 || values > limit - 6 - 8 * heads) return false;
  *out = QuantRowLayout::of(dtype, static_cast<std::size_t>(heads), static_cast<std::size_t>(dim)).bytes;
  return *out <= limit;
}

}  // namespace kvcore
