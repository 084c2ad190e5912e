// share(): a std::shared_ptr whose control block is allocated with nothrow new
// ahead of time, so making one reports MemoryAllocationFailed instead of
// throwing or aborting (std::shared_ptr's own constructors can only do that
// under -fno-exceptions). Registries and builders hand caches out this way.
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

#include "kvcore/core/result.h"

namespace kvcore {
namespace internal {

// Bytes set aside for a control block (pointer, deleter, this allocator and
// two counts: about 40 on libstdc++ and libc++); checked at compile time.
constexpr std::size_t kControlBlockBytes = 64;

// Hands out the one block allocated ahead; never fails.
template <typename T>
struct PreallocatedBlock {
  using value_type = T;
  void* block = nullptr;

  explicit PreallocatedBlock(void* b) noexcept : block(b) {}
  template <typename U>
  PreallocatedBlock(const PreallocatedBlock<U>& other) noexcept : block(other.block) {}  // NOLINT

  T* allocate(std::size_t n) noexcept {
    static_assert(sizeof(T) <= kControlBlockBytes, "raise kControlBlockBytes");
    static_assert(alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__, "over-aligned control block");
    KVCORE_CHECK(n == 1 && block != nullptr, "a preallocated control block is used once");
    return static_cast<T*>(block);
  }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(static_cast<void*>(p)); }
  template <typename U>
  bool operator==(const PreallocatedBlock<U>& other) const noexcept {
    return block == other.block;
  }
  template <typename U>
  bool operator!=(const PreallocatedBlock<U>& other) const noexcept {
    return block != other.block;
  }
};

}  // namespace internal

/// Shared ownership of `object` (deleted with `delete` by the last owner).
/// InvalidArgument: object is null. MemoryAllocationFailed: the control block
/// cannot be allocated; `object` is then deleted, so nothing leaks.
template <typename T>
Result<std::shared_ptr<T>> share(std::unique_ptr<T> object) noexcept {
  KVCORE_CHECK_OR_RETURN_ERROR(object != nullptr, InvalidArgument, "share: the object is null");
  void* block = ::operator new(internal::kControlBlockBytes, std::nothrow);
  KVCORE_CHECK_OR_RETURN_ERROR(block != nullptr, MemoryAllocationFailed,
                               "cannot allocate a shared pointer's control block");
  return std::shared_ptr<T>(object.release(), std::default_delete<T>(),
                            internal::PreallocatedBlock<T>(block));
}

}  // namespace kvcore
