// Table<T>: a growable array whose storage comes from nothrow new, so an
// insertion reports MemoryAllocationFailed instead of throwing or aborting
// (std::vector can only abort under -fno-exceptions). The registries keep
// their sorted entries in one.
#pragma once

#include <cstddef>
#include <new>
#include <utility>

#include "kvcore/core/result.h"

namespace kvcore {

template <typename T>
class Table {
 public:
  Table() noexcept = default;
  Table(Table&& other) noexcept
      : items_(std::exchange(other.items_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        capacity_(std::exchange(other.capacity_, 0)) {}
  Table& operator=(Table&& other) noexcept {
    if (this != &other) {
      delete[] items_;
      items_ = std::exchange(other.items_, nullptr);
      size_ = std::exchange(other.size_, 0);
      capacity_ = std::exchange(other.capacity_, 0);
    }
    return *this;
  }
  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;
  ~Table() { delete[] items_; }

  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  T& operator[](std::size_t i) noexcept { return items_[i]; }
  const T& operator[](std::size_t i) const noexcept { return items_[i]; }
  T* begin() noexcept { return items_; }
  T* end() noexcept { return items_ + size_; }
  const T* begin() const noexcept { return items_; }
  const T* end() const noexcept { return items_ + size_; }

  /// Room for `n` items, so that inserting up to n - size() of them cannot fail.
  /// MemoryAllocationFailed: the storage cannot be allocated (nothing changes).
  Status reserve(std::size_t n) noexcept {
    if (n <= capacity_) return Error::Ok;
    T* grown = new (std::nothrow) T[n];
    KVCORE_CHECK_OR_RETURN_ERROR(grown != nullptr, MemoryAllocationFailed,
                                 "cannot allocate a table of %zu entries", n);
    for (std::size_t i = 0; i < size_; ++i) grown[i] = std::move(items_[i]);
    delete[] items_;
    items_ = grown;
    capacity_ = n;
    return Error::Ok;
  }

  /// Inserts `item` before index `at` (0 <= at <= size()), doubling the storage
  /// when full. MemoryAllocationFailed: growth failed (nothing changes).
  Status insert(std::size_t at, T&& item) noexcept {
    if (size_ == capacity_) KVCORE_RETURN_IF_ERROR(reserve(capacity_ == 0 ? 4 : capacity_ * 2));
    for (std::size_t i = size_; i > at; --i) items_[i] = std::move(items_[i - 1]);
    items_[at] = std::move(item);
    ++size_;
    return Error::Ok;
  }

  /// Removes index `at` and returns it (moved out), so the caller decides when it dies.
  T take(std::size_t at) noexcept {
    T out = std::move(items_[at]);
    for (std::size_t i = at; i + 1 < size_; ++i) items_[i] = std::move(items_[i + 1]);
    --size_;
    items_[size_] = T();
    return out;
  }

  /// Appends `item`; as insert(size(), item).
  Status push_back(T&& item) noexcept { return insert(size_, std::move(item)); }

 private:
  T* items_ = nullptr;  // capacity_ default-constructed slots, the first size_ in use
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
};

}  // namespace kvcore
