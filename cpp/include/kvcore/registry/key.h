// Key: an owned, immutable string (a registry key, a backend id, a kind),
// allocated with nothrow new, so making or copying one reports
// MemoryAllocationFailed instead of throwing or aborting.
#pragma once

#include <cstddef>
#include <cstring>
#include <new>
#include <string_view>

#include "kvcore/core/result.h"

namespace kvcore {

class Key {
 public:
  /// The empty key; allocates nothing.
  Key() noexcept = default;

  /// A copy of `text`. MemoryAllocationFailed: the copy cannot be allocated.
  static Result<Key> copy_of(std::string_view text) noexcept { return concat(text, {}); }

  /// The concatenation of `a` and `b` (e.g. a stem and a counter).
  /// MemoryAllocationFailed: it cannot be allocated.
  static Result<Key> concat(std::string_view a, std::string_view b) noexcept {
    Key key;
    if (a.empty() && b.empty()) return key;
    char* text = new (std::nothrow) char[a.size() + b.size() + 1];
    KVCORE_CHECK_OR_RETURN_ERROR(text != nullptr, MemoryAllocationFailed,
                                 "cannot allocate a key of %zu bytes", a.size() + b.size());
    if (!a.empty()) std::memcpy(text, a.data(), a.size());
    if (!b.empty()) std::memcpy(text + a.size(), b.data(), b.size());
    text[a.size() + b.size()] = '\0';
    key.text_ = text;
    key.size_ = a.size() + b.size();
    return key;
  }

  Key(Key&& other) noexcept : text_(other.text_), size_(other.size_) {
    other.text_ = nullptr;
    other.size_ = 0;
  }
  Key& operator=(Key&& other) noexcept {
    if (this != &other) {
      delete[] text_;
      text_ = other.text_;
      size_ = other.size_;
      other.text_ = nullptr;
      other.size_ = 0;
    }
    return *this;
  }
  Key(const Key&) = delete;
  Key& operator=(const Key&) = delete;
  ~Key() { delete[] text_; }

  std::string_view view() const noexcept { return std::string_view(c_str(), size_); }
  /// NUL-terminated; "" for the empty key.
  const char* c_str() const noexcept { return text_ != nullptr ? text_ : ""; }
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }

 private:
  char* text_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace kvcore
