// PoolAllocator: where a growing KVPool gets its storage blocks. Plain function
// pointers (no std::function), and failure is nullptr, never an exception, so
// growth can report MemoryAllocationFailed and leave the pool as it was.
#pragma once

#include <cstddef>
#include <cstdlib>

namespace kvcore {

struct PoolAllocator {
  /// Passed back to both functions (e.g. the object that tracks the blocks).
  void* context = nullptr;
  /// A block of at least `bytes` bytes aligned for any scalar type, or nullptr.
  void* (*allocate)(void* context, std::size_t bytes) noexcept = nullptr;
  /// Gives back a block `allocate` returned; the pool never touches it again.
  void (*release)(void* context, void* block) noexcept = nullptr;

  /// std::malloc / std::free.
  static PoolAllocator heap() noexcept {
    PoolAllocator a;
    a.allocate = [](void*, std::size_t bytes) noexcept { return std::malloc(bytes); };
    a.release = [](void*, void* block) noexcept { std::free(block); };
    return a;
  }
};

}  // namespace kvcore
