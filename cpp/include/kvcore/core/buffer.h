// internal::Buffer<T>: a table of T allocated once through nothrow new, sized
// and indexed in the types kvcore's tables use. Sizes are std::int64_t (a
// product of int limits, e.g. groups x sequences, never negative) and indices
// are int (sequence ids, block ids, rows, entries: ints with -1 for "none" in
// the public API) or std::size_t; the one conversion to the unsigned index of
// the underlying array is made here, so call sites index with their own types
// and the headers build clean under -Wconversion -Wsign-conversion. Other
// integer types do not convert implicitly (an overload set of int and
// std::size_t: an int64_t or unsigned index is ambiguous, so a wider index is
// narrowed where it is computed, visibly).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>

namespace kvcore {
namespace internal {

template <typename T>
class Buffer {
 public:
  Buffer() noexcept = default;
  Buffer(Buffer&&) noexcept = default;
  Buffer& operator=(Buffer&&) noexcept = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  /// `n` elements, default-initialized (ints left unset); empty (false) when
  /// the allocation fails. Precondition: n >= 0.
  static Buffer make(std::int64_t n) noexcept { return Buffer(new (std::nothrow) T[to_size(n)]); }
  /// `n` elements, value-initialized (ints zero, bools false); empty (false)
  /// when the allocation fails. Precondition: n >= 0.
  static Buffer make_zeroed(std::int64_t n) noexcept { return Buffer(new (std::nothrow) T[to_size(n)]()); }

  explicit operator bool() const noexcept { return data_ != nullptr; }
  friend bool operator==(const Buffer& b, std::nullptr_t) noexcept { return b.data_ == nullptr; }
  friend bool operator!=(const Buffer& b, std::nullptr_t) noexcept { return b.data_ != nullptr; }

  /// Element i. Precondition: 0 <= i < the size made.
  T& operator[](int i) const noexcept { return data_[static_cast<std::size_t>(i)]; }
  T& operator[](std::size_t i) const noexcept { return data_[i]; }

  T* get() const noexcept { return data_.get(); }
  /// Sets elements [0, n) to `value`. Precondition: 0 <= n <= the size made.
  void fill(std::int64_t n, const T& value) const noexcept {
    for (std::size_t i = 0, end = to_size(n); i < end; ++i) data_[i] = value;
  }
  /// Frees the elements; the buffer is empty.
  void reset() noexcept { data_.reset(); }

 private:
  explicit Buffer(T* data) noexcept : data_(data) {}
  static std::size_t to_size(std::int64_t n) noexcept { return static_cast<std::size_t>(n); }

  std::unique_ptr<T[]> data_;
};

}  // namespace internal
}  // namespace kvcore
