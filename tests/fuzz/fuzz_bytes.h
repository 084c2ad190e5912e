// The byte reader both fuzzers decode their inputs with. Reads front to back;
// past the end every read is 0, so any prefix of an input is an input too.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvcore_fuzz_input {

class Bytes {
 public:
  /// How many edge values edgy() draws from.
  static constexpr int kEdgeCount = 16;

  /// Reads `size` bytes at `data`; `edges` are the ints edgy() favours (where
  /// the fuzzed code's arithmetic breaks). Both must outlive the reader.
  Bytes(const std::uint8_t* data, std::size_t size, const int (&edges)[kEdgeCount])
      : data_(data), size_(size), edges_(edges) {}
  bool done() const { return at_ >= size_; }
  std::uint8_t u8() { return at_ < size_ ? data_[at_++] : 0; }
  std::uint32_t u32() {
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(u8()) << (8 * i);
    return v;
  }
  /// In [lo, hi] (lo <= hi).
  int in(int lo, int hi) {
    const std::uint64_t span = static_cast<std::uint64_t>(static_cast<std::int64_t>(hi) - lo) + 1;
    const std::uint64_t r = (span <= 256 ? u8() : u32()) % span;
    return static_cast<int>(lo + static_cast<std::int64_t>(r));
  }
  bool percent(int p) { return u8() % 100 < p; }
  /// Any int, half the time one of the edges.
  int edgy() {
    const std::uint8_t how = u8();
    if (how < 128) return edges_[how % kEdgeCount];
    return static_cast<int>(u32());
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  const int (&edges_)[kEdgeCount];
  std::size_t at_ = 0;
};

}  // namespace kvcore_fuzz_input
