// Quantized K/V rows (docs/quantized.md): the codec of the two quantized
// storage formats, DType::QInt8 and DType::Fp8E4M3, one row at a time, per
// (row, head). Rows are laid out by QuantRowLayout (dtype.h): the values, then
// each head's float32 scale (and QInt8's int8 zero point), so a row carries
// its own scales wherever the byte layers move it.
//
// QInt8 is ExecuTorch's QuantizedKVCache rule bit for bit on float32 values
// (torch.ops.quantized_decomposed.choose_qparams_per_token_asymmetric,
// quantize_per_token, dequantize_per_token; tests/python/test_quantized_executorch.py):
//   min_neg = min(min(x), 0), max_pos = max(max(x), 0)          (float32)
//   scale   = max((max_pos - min_neg) / 255, FLT_EPSILON)         (float32)
//   zp      = round_half_even(clamp(-128 - min_neg / scale  if (-128 + min_neg / scale)
//             + (127 + max_pos / scale) > 0  else  127 - max_pos / scale, -128, 127))
//   q       = clamp(round_half_even(double(x) * (1.0 / double(scale)) + zp), -128, 127)
//   x'      = float(q - zp) * scale                               (exact product, rounded once)
// Fp8E4M3 (float8 e4m3fn, largest finite 448): scale = max(max|x| / 448,
// FLT_MIN); q = e4m3fn_round_half_even(clamp(x / scale, -448, 448)); x' =
// float(q) * scale: torch's (x / scale).clamp(-448, 448).to(float8_e4m3fn).
// Values come in and go out as float32, float16 or bfloat16; float16 and
// bfloat16 are widened to float32 exactly before quantizing (ExecuTorch's
// cache quantizes float32), and x' is rounded (half to even) to them from
// float32. Non-finite values (inf, NaN), and rows whose range max - min passes
// FLT_MAX, have no scale: check_quantizable refuses them before anything is
// written. Denormal values are quantized like any other.
//
// Nothing here allocates; every function works on caller memory.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kvcore/core/result.h"
#include "kvcore/pool/dtype.h"

namespace kvcore {

namespace quant_detail {

inline std::uint32_t bits_of(float f) noexcept {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  return x;
}
inline float float_of(std::uint32_t x) noexcept {
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

/// IEEE half (binary16) bits -> float (exact).
inline float half_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu;
  const std::uint32_t man = h & 0x3FFu;
  if (exp == 0) {
    const float v = static_cast<float>(man) * 5.9604644775390625e-08f;  // man * 2^-24
    return sign != 0 ? -v : v;
  }
  if (exp == 31) return float_of(sign | 0x7F800000u | (man << 13));
  return float_of(sign | ((exp + 112u) << 23) | (man << 13));
}

/// float -> IEEE half bits, rounded half to even (overflow to inf, as a cast).
inline std::uint16_t float_to_half(float f) noexcept {
  const std::uint32_t x = bits_of(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t a = x & 0x7FFFFFFFu;
  if (a >= 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7C00u | (a > 0x7F800000u ? 0x200u : 0u));
  if (a >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // >= 65520: inf
  if (a < 0x38800000u) {                                                  // below 2^-14: subnormal
    const float m = std::nearbyint(float_of(a) * 16777216.0f);            // * 2^24, exact; <= 1024
    return static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(m));
  }
  const std::uint32_t r = a - (112u << 23);
  return static_cast<std::uint16_t>(sign | ((r + 0xFFFu + ((r >> 13) & 1u)) >> 13));
}

inline float bf16_to_float(std::uint16_t b) noexcept { return float_of(static_cast<std::uint32_t>(b) << 16); }

/// float -> bfloat16 bits, rounded half to even (NaN stays a quiet NaN).
inline std::uint16_t float_to_bf16(float f) noexcept {
  const std::uint32_t x = bits_of(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  return static_cast<std::uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

/// float8 e4m3fn bits -> float (exact; 0x7F / 0xFF are NaN, never produced here).
inline float e4m3_to_float(std::uint8_t q) noexcept {
  const std::uint32_t exp = (q >> 3) & 0xFu;
  const std::uint32_t man = q & 0x7u;
  float v;
  if (exp == 0) {
    v = static_cast<float>(man) * 0.001953125f;  // man * 2^-9
  } else if (exp == 15 && man == 7) {
    v = NAN;
  } else {
    v = float_of(((exp + 120u) << 23) | (man << 20));
  }
  return (q & 0x80u) != 0 ? -v : v;
}

/// float with |f| <= 448 -> float8 e4m3fn bits, rounded half to even.
inline std::uint8_t float_to_e4m3(float f) noexcept {
  const std::uint32_t x = bits_of(f);
  const std::uint32_t sign = (x >> 24) & 0x80u;
  const std::uint32_t a = x & 0x7FFFFFFFu;
  if (a < 0x3C800000u) {  // below 2^-6: subnormal, man * 2^-9
    const float m = std::nearbyint(float_of(a) * 512.0f);  // exact scaling; <= 8 (8 = 2^-6)
    return static_cast<std::uint8_t>(sign | static_cast<std::uint32_t>(m));
  }
  const std::uint32_t r = (a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20;  // exponent and 3 mantissa bits
  return static_cast<std::uint8_t>(sign | (r - (120u << 3)));
}

/// Element `i` of `n` values of plain type `type` at `p`, as float.
inline float load(DType type, const unsigned char* p, std::size_t i) noexcept {
  switch (type) {
    case DType::Float16: {
      std::uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      return half_to_float(h);
    }
    case DType::BFloat16: {
      std::uint16_t b;
      std::memcpy(&b, p + 2 * i, 2);
      return bf16_to_float(b);
    }
    default: {
      float f;
      std::memcpy(&f, p + 4 * i, 4);
      return f;
    }
  }
}

inline void store(DType type, unsigned char* p, std::size_t i, float v) noexcept {
  switch (type) {
    case DType::Float16: {
      const std::uint16_t h = float_to_half(v);
      std::memcpy(p + 2 * i, &h, 2);
      return;
    }
    case DType::BFloat16: {
      const std::uint16_t b = float_to_bf16(v);
      std::memcpy(p + 2 * i, &b, 2);
      return;
    }
    default:
      std::memcpy(p + 4 * i, &v, 4);
      return;
  }
}

}  // namespace quant_detail

/// True for the types values come in and go out as: float32, float16, bfloat16.
constexpr bool is_compute_type(DType type) noexcept {
  return type == DType::Float32 || type == DType::Float16 || type == DType::BFloat16;
}

/// The QInt8 parameters of one head's values (ExecuTorch's
/// choose_qparams_per_token_asymmetric on float32): a float32 scale and an
/// integer zero point in [-128, 127]. Precondition: every value finite.
struct QInt8Params {
  float scale = 1.0f;
  int zero = 0;

  /// From the head's value range: lo = min(min(x), 0), hi = max(max(x), 0).
  static QInt8Params of_range(float lo, float hi) noexcept {
    QInt8Params p;
    p.scale = (hi - lo) / 255.0f;
    if (!(p.scale >= FLT_EPSILON)) p.scale = FLT_EPSILON;
    const float descaled_min = lo / p.scale;
    const float descaled_max = hi / p.scale;
    const float from_min = -128.0f + descaled_min;
    const float from_max = 127.0f + descaled_max;
    float zp = from_min + from_max > 0.0f ? -128.0f - descaled_min : 127.0f - descaled_max;
    zp = zp < -128.0f ? -128.0f : (zp > 127.0f ? 127.0f : zp);
    p.zero = static_cast<int>(std::nearbyint(zp));
    return p;
  }

  /// One value, as quantize_per_token computes it (in double: 1.0 / scale is a
  /// double there). The product is stored before the add so that no compiler
  /// contracts the two into one fused multiply-add (which rounds once).
  std::int8_t quantize(float x, double inverse) const noexcept {
    volatile double product = static_cast<double>(x) * inverse;
    double q = std::nearbyint(product + static_cast<double>(zero));
    q = q < -128.0 ? -128.0 : (q > 127.0 ? 127.0 : q);
    return static_cast<std::int8_t>(q);
  }
};

/// InvalidArgument unless `n_rows` rows of `heads` x `dim` values of
/// `in_type` at `in` can be quantized: every value finite and, per (row,
/// head), max - min finite. `what`, `name` and `layer` name the call in the
/// message (e.g. "write", "k", 3), with the row, the head and the rule.
inline Status check_quantizable(const char* what, const char* name, int layer, DType in_type,
                                const void* in, std::int64_t n_rows, int heads, int dim) noexcept {
  const unsigned char* p = static_cast<const unsigned char*>(in);
  const std::size_t per_row = static_cast<std::size_t>(heads) * static_cast<std::size_t>(dim);
  for (std::int64_t r = 0; r < n_rows; ++r) {
    for (int h = 0; h < heads; ++h) {
      float lo = 0.0f, hi = 0.0f;
      const std::size_t base = static_cast<std::size_t>(r) * per_row + static_cast<std::size_t>(h) * static_cast<std::size_t>(dim);
      for (int d = 0; d < dim; ++d) {
        const float x = quant_detail::load(in_type, p, base + static_cast<std::size_t>(d));
        KVCORE_CHECK_OR_RETURN_ERROR(std::isfinite(x), InvalidArgument,
                                     "%s of layer %d: %s row %lld head %d holds %s: a quantized pool stores "
                                     "finite values only",
                                     what, layer, name, static_cast<long long>(r), h, std::isnan(x) ? "NaN" : "inf");
        if (x < lo) lo = x;
        if (x > hi) hi = x;
      }
      KVCORE_CHECK_OR_RETURN_ERROR(std::isfinite(hi - lo), InvalidArgument,
                                   "%s of layer %d: %s row %lld head %d: its range max - min passes FLT_MAX, "
                                   "no float32 scale holds it",
                                   what, layer, name, static_cast<long long>(r), h);
    }
  }
  return Error::Ok;
}

/// Quantizes one row of `heads` x `dim` values of `in_type` (float32, float16
/// or bfloat16) at `in` into the `format` row at `out` (QuantRowLayout bytes):
/// values, scales, zero points and padding (zero). Writes nothing else. Preconditions:
/// is_quantized(format), is_compute_type(in_type), check_quantizable passed.
inline void quantize_row(DType format, int heads, int dim, DType in_type, const void* in,
                         unsigned char* out) noexcept {
  using quant_detail::load;
  const QuantRowLayout layout =
      QuantRowLayout::of(format, static_cast<std::size_t>(heads), static_cast<std::size_t>(dim));
  const unsigned char* p = static_cast<const unsigned char*>(in);
  for (int h = 0; h < heads; ++h) {
    const std::size_t base = static_cast<std::size_t>(h) * static_cast<std::size_t>(dim);
    float lo = 0.0f, hi = 0.0f;  // min(min(x), 0), max(max(x), 0)
    for (int d = 0; d < dim; ++d) {
      const float x = load(in_type, p, base + static_cast<std::size_t>(d));
      lo = x < lo ? x : lo;
      hi = x > hi ? x : hi;
    }
    float scale;
    if (format == DType::QInt8) {
      const QInt8Params params = QInt8Params::of_range(lo, hi);
      const double inverse = 1.0 / static_cast<double>(params.scale);
      for (int d = 0; d < dim; ++d) {
        const std::int8_t q = params.quantize(load(in_type, p, base + static_cast<std::size_t>(d)), inverse);
        std::memcpy(out + base + static_cast<std::size_t>(d), &q, 1);
      }
      scale = params.scale;
      const std::int8_t zero = static_cast<std::int8_t>(params.zero);
      std::memcpy(out + layout.zeros + static_cast<std::size_t>(h), &zero, 1);
    } else {
      const float amax = -lo > hi ? -lo : hi;
      scale = amax / 448.0f;
      if (!(scale >= FLT_MIN)) scale = FLT_MIN;
      for (int d = 0; d < dim; ++d) {
        float v = load(in_type, p, base + static_cast<std::size_t>(d)) / scale;
        v = v < -448.0f ? -448.0f : (v > 448.0f ? 448.0f : v);
        out[base + static_cast<std::size_t>(d)] = quant_detail::float_to_e4m3(v);
      }
    }
    std::memcpy(out + layout.scales + 4 * static_cast<std::size_t>(h), &scale, 4);
  }
  const std::size_t values = static_cast<std::size_t>(heads) * static_cast<std::size_t>(dim);
  if (layout.scales > values) std::memset(out + values, 0, layout.scales - values);
  const std::size_t end = layout.zeros + (format == DType::QInt8 ? static_cast<std::size_t>(heads) : 0);
  if (layout.bytes > end) std::memset(out + end, 0, layout.bytes - end);
}

/// Dequantizes `n_rows` consecutive `format` rows at `rows` (QuantRowLayout
/// bytes each) into `n_rows` x heads x dim values of `out_type` (float32,
/// float16 or bfloat16) at `out`. Preconditions: is_quantized(format),
/// is_compute_type(out_type), `out` holds them.
inline void dequantize_rows(DType format, int heads, int dim, const unsigned char* rows, std::int64_t n_rows,
                            DType out_type, void* out) noexcept {
  const QuantRowLayout layout =
      QuantRowLayout::of(format, static_cast<std::size_t>(heads), static_cast<std::size_t>(dim));
  unsigned char* o = static_cast<unsigned char*>(out);
  const std::size_t per_row = static_cast<std::size_t>(heads) * static_cast<std::size_t>(dim);
  for (std::int64_t r = 0; r < n_rows; ++r) {
    const unsigned char* row = rows + layout.bytes * static_cast<std::size_t>(r);
    for (int h = 0; h < heads; ++h) {
      float scale;
      std::memcpy(&scale, row + layout.scales + 4 * static_cast<std::size_t>(h), 4);
      const std::size_t base = static_cast<std::size_t>(h) * static_cast<std::size_t>(dim);
      const std::size_t at = static_cast<std::size_t>(r) * per_row + base;
      if (format == DType::QInt8) {
        const int zero = static_cast<std::int8_t>(row[layout.zeros + static_cast<std::size_t>(h)]);
        for (int d = 0; d < dim; ++d) {
          const int q = static_cast<std::int8_t>(row[base + static_cast<std::size_t>(d)]);
          quant_detail::store(out_type, o, at + static_cast<std::size_t>(d), static_cast<float>(q - zero) * scale);
        }
      } else {
        for (int d = 0; d < dim; ++d) {
          const float q = quant_detail::e4m3_to_float(row[base + static_cast<std::size_t>(d)]);
          quant_detail::store(out_type, o, at + static_cast<std::size_t>(d), q * scale);
        }
      }
    }
  }
}

}  // namespace kvcore
