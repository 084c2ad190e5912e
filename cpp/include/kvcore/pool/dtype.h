// DType: the element type of a pool's K/V rows. The byte layer only moves
// bytes, so all it needs to know about a type is its name and its size.
#pragma once

#include <cstddef>

namespace kvcore {

/// Serialized values: append-only.
enum class DType : int {
  Float32 = 0,
  Float16 = 1,
  BFloat16 = 2,
  Int8 = 3,
  UInt8 = 4,
};

/// Bytes of one element; 0 for a value outside the enum (never a valid type).
constexpr std::size_t element_size(DType dtype) noexcept {
  switch (dtype) {
    case DType::Float32: return 4;
    case DType::Float16: return 2;
    case DType::BFloat16: return 2;
    case DType::Int8: return 1;
    case DType::UInt8: return 1;
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
  }
  return "unknown";
}

}  // namespace kvcore
