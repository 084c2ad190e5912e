// The pool dtypes as numpy sees them, shared by KVPool (py_kv_pool.h) and
// PagedKVPool (py_paged_kv_pool.h).
#pragma once

#include <pybind11/numpy.h>

#include <string>
#include <utility>

#include "errors.h"
#include "kvcore/pool/dtype.h"

namespace kvcore_py {

inline std::string describe(py::handle obj) { return py::repr(obj).cast<std::string>(); }

// The quantized storage formats by name (docs/quantized.md): their rows are
// raw bytes to numpy (uint8); values go in and out in a compute dtype.
inline bool parse_quantized(py::handle given, kvcore::DType* out) {
  if (!py::isinstance<py::str>(given)) return false;
  const std::string name = given.cast<std::string>();
  if (name == "qint8") *out = kvcore::DType::QInt8;
  else if (name == "fp8_e4m3") *out = kvcore::DType::Fp8E4M3;
  else return false;
  return true;
}

// The numpy dtype for `spec` and the DType it stands for. "bfloat16" needs the
// ml_dtypes package, which registers that type with numpy. "qint8" and
// "fp8_e4m3" (the quantized formats) give numpy's uint8: their rows' bytes.
inline std::pair<py::dtype, kvcore::DType> parse_dtype(py::handle given) {
  kvcore::DType quantized = kvcore::DType::QInt8;
  if (parse_quantized(given, &quantized)) return {py::dtype("uint8"), quantized};
  py::object spec = py::reinterpret_borrow<py::object>(given);
  if (py::isinstance<py::str>(spec) && spec.cast<std::string>() == "bfloat16") {
    try {
      spec = py::module_::import("ml_dtypes").attr("bfloat16");
    } catch (py::error_already_set&) {
      raise(kvcore::Error::InvalidArgument,
            "dtype = 'bfloat16': needs the ml_dtypes package: pip install \"kvcore[bfloat16]\"");
    }
  }
  py::dtype dt;
  try {
    dt = py::dtype::from_args(spec);
  } catch (py::error_already_set&) {
    raise(kvcore::Error::InvalidArgument, "dtype = " + describe(spec) + ": not a numpy dtype");
  }
  const std::string name = py::str(dt.attr("name")).cast<std::string>();
  const bool native = dt.attr("isnative").cast<bool>();
  const char kind = dt.kind();
  const auto size = dt.itemsize();
  kvcore::DType out = kvcore::DType::Float32;
  bool known = native;
  if (kind == 'f' && size == 4) out = kvcore::DType::Float32;
  else if (kind == 'f' && size == 2) out = kvcore::DType::Float16;
  else if (kind == 'i' && size == 1) out = kvcore::DType::Int8;
  else if (kind == 'u' && size == 1) out = kvcore::DType::UInt8;
  else if (name == "bfloat16" && size == 2) out = kvcore::DType::BFloat16;
  else known = false;
  if (!known)
    raise(kvcore::Error::InvalidArgument,
          "dtype = " + describe(dt) +
              ": must be one of float32, float16, bfloat16 (ml_dtypes), int8, uint8 in native "
              "byte order, or a quantized format: 'qint8', 'fp8_e4m3'");
  return {dt, out};
}

}  // namespace kvcore_py
