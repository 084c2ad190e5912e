// kvcore._core._copy_rows: a layer's new K/V rows copied into a torch pool in one
// call (kvcore.torch.pool's CPU fast path). Through torch, the same
// writes are two to four tensor calls of about 1.5 us each per layer; here they
// are one call. The module does not link torch: the caller passes the tensors'
// addresses and strides, and has checked shapes, dtype, device and bounds
// (TorchKVPool.write_read in python/kvcore/integrations/torch_pool.py names each
// check; its tests/python/test_transformers_torch_pool.py runs both write paths).
#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

#include <pybind11/stl.h>

#include "bindings.h"

namespace kvcore_py {

namespace {

using Index = std::int64_t;
// A pool tensor: address, then sizes (B, H, D) and element strides (b, h, row, d).
using Dst = std::array<Index, 8>;
using Strides = std::array<Index, 4>;

// Copies rows [off, off + n) of src to rows [row, row + n) of dst, for every batch and head.
void copy_tensor(const Dst& dst, Index esize, const std::vector<Index>& writes, Index src, const Strides& ss) {
  auto* d0 = reinterpret_cast<char*>(static_cast<std::uintptr_t>(dst[0]));
  const auto* s0 = reinterpret_cast<const char*>(static_cast<std::uintptr_t>(src));
  const Index B = dst[1], H = dst[2], D = dst[3];
  const bool rows_contiguous = dst[7] == 1 && ss[3] == 1;
  for (std::size_t w = 0; w + 2 < writes.size(); w += 3) {
    const Index row = writes[w], n = writes[w + 1], off = writes[w + 2];
    for (Index b = 0; b < B; ++b) {
      for (Index h = 0; h < H; ++h) {
        for (Index t = 0; t < n; ++t) {
          char* d = d0 + (b * dst[4] + h * dst[5] + (row + t) * dst[6]) * esize;
          const char* s = s0 + (b * ss[0] + h * ss[1] + (off + t) * ss[2]) * esize;
          if (rows_contiguous) {
            std::memmove(d, s, static_cast<std::size_t>(D * esize));
          } else {
            for (Index i = 0; i < D; ++i) std::memmove(d + i * dst[7] * esize, s + i * ss[3] * esize, esize);
          }
        }
      }
    }
  }
}

}  // namespace

void register_row_copy(py::module_& m) {
  m.def(
      "_copy_rows",
      [](const Dst& k_dst, const Dst& v_dst, Index esize, const std::vector<Index>& writes, Index k_src,
         const Strides& k_strides, Index v_src, const Strides& v_strides) {
        copy_tensor(k_dst, esize, writes, k_src, k_strides);
        copy_tensor(v_dst, esize, writes, v_src, v_strides);
      },
      py::arg("k_dst"), py::arg("v_dst"), py::arg("esize"), py::arg("writes"), py::arg("k_src"),
      py::arg("k_strides"), py::arg("v_src"), py::arg("v_strides"),
      "Internal (kvcore.torch.pool): copies rows of two source tensors into two pool tensors.\n\n"
      "``k_dst``/``v_dst``: (address, B, H, D, stride b, stride h, stride row, stride d) of a pool tensor\n"
      "[B, H, rows, D]; ``esize``: bytes per element; ``writes``: flat (row, n, offset) triples, source\n"
      "rows [offset, offset + n) to pool rows [row, row + n); ``k_src``/``v_src``: addresses of the\n"
      "[B, H, T, D] sources, ``k_strides``/``v_strides`` their element strides. Nothing is checked: the\n"
      "caller guarantees same dtype, CPU memory, and rows within both tensors (wrong values corrupt memory).");
}

}  // namespace kvcore_py
