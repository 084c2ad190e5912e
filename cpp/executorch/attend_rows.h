// attend_rows: the element work of AttendSession's attention: staging the op's K/V into
// the pool's row layout, reading stored rows as float32, and the dot product of scores.
#pragma once

#include <cstddef>

#include "kvcore/pool/dtype.h"
#include "kvcore/pool/quantize.h"

namespace kvcore {
namespace et {
namespace attend_rows {

inline std::size_t at(int i) noexcept { return static_cast<std::size_t>(i); }

/// [heads, T, dim] of type `in` at `src` -> rows [T, heads, dim] of type `to` at `out`.
inline void stage(DType in, const void* src, int heads, int T, int dim, DType to, unsigned char* out) noexcept {
  const unsigned char* from = static_cast<const unsigned char*>(src);
  for (int h = 0; h < heads; ++h) {
    for (int t = 0; t < T; ++t) {
      const std::size_t row = at(t) * at(heads) + at(h), input = at(h) * at(T) + at(t);
      for (int e = 0; e < dim; ++e) {
        quant_detail::store(to, out, row * at(dim) + at(e), quant_detail::load(in, from, input * at(dim) + at(e)));
      }
    }
  }
}

/// `n` consecutive rows (`row_bytes` apart, `heads` x `dim` elements of `stored`) as float32:
/// in place when `stored` is float32, else widened or dequantized into `buf` (n x heads x dim floats).
inline const float* as_float(DType stored, const unsigned char* rows, std::size_t row_bytes, int n, int heads,
                             int dim, float* buf) noexcept {
  if (stored == DType::Float32) return reinterpret_cast<const float*>(rows);
  if (is_quantized(stored)) {
    dequantize_rows(stored, heads, dim, rows, n, DType::Float32, buf);
  } else {
    const std::size_t per_row = at(heads) * at(dim);
    for (int r = 0; r < n; ++r) {
      for (std::size_t i = 0; i < per_row; ++i) buf[at(r) * per_row + i] = quant_detail::load(stored, rows + row_bytes * at(r), i);
    }
  }
  return buf;
}

/// The dot product of `n` floats, in four chains the compiler can vectorize.
inline float dot(const float* a, const float* b, std::size_t n) noexcept {
  float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
  std::size_t e = 0;
  for (; e + 4 <= n; e += 4) {
    s0 += a[e] * b[e];
    s1 += a[e + 1] * b[e + 1];
    s2 += a[e + 2] * b[e + 2];
    s3 += a[e + 3] * b[e + 3];
  }
  for (; e < n; ++e) s0 += a[e] * b[e];
  return (s0 + s1) + (s2 + s3);
}

}  // namespace attend_rows
}  // namespace et
}  // namespace kvcore
