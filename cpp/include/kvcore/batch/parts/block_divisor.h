// BlockDivisor: a position's block index, p / B and ceil(p / B), by a shift
// when the block size is a power of two (the usual sizes), else a division:
// the begun step (step_state.h) divides some twenty times per entry, and a
// 64-bit division costs tens of cycles.
#pragma once

#include <cstdint>

namespace kvcore {

/// Divisions of non-negative positions by the block size: a shift when it is
/// a power of two (the usual sizes), else a division. A decode step divides
/// some twenty times per entry; a 64-bit division costs tens of cycles.
class BlockDivisor {
 public:
  void set(int block_size) noexcept {
    size_ = block_size;
    shift_ = -1;
    for (int s = 0; s < 31; ++s)
      if ((1 << s) == block_size) shift_ = s;
  }
  /// p / B for p >= 0.
  int floor(int p) const noexcept { return shift_ >= 0 ? p >> shift_ : p / size_; }
  /// ceil(p / B) for p >= 0 (in 64 bits: p + B - 1 may pass 2^31 - 1).
  int ceil(int p) const noexcept {
    const std::int64_t x = static_cast<std::int64_t>(p) + size_ - 1;
    return static_cast<int>(shift_ >= 0 ? x >> shift_ : x / size_);
  }

 private:
  int size_ = 1;
  int shift_ = 0;
};

}  // namespace kvcore
