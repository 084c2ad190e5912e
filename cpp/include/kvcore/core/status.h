// Status: an Error plus a short message formatted into inline storage, so
// reporting an error never allocates. Converts to and from Error.
#pragma once

#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "kvcore/core/error.h"

namespace kvcore {

class [[nodiscard]] Status {
 public:
  /// Messages longer than this are truncated (never overflowed).
  static constexpr int kMessageCapacity = 160;

  Status() noexcept : code_(Error::Ok) { message_[0] = '\0'; }
  // Implicit so that `return Error::Ok;` and `Status s = e;` read naturally.
  Status(Error code) noexcept : code_(code) { message_[0] = '\0'; }  // NOLINT
  // Copies only the used part of the message: Ok statuses travel cheaply.
  Status(const Status& other) noexcept : code_(other.code_) { copy_message(other); }
  Status& operator=(const Status& other) noexcept {
    code_ = other.code_;
    copy_message(other);
    return *this;
  }

  /// An error with a printf-style message naming the value and the rule it broke.
#if defined(__GNUC__)
  __attribute__((format(printf, 2, 3)))
#endif
  static Status make(Error code, const char* format, ...) noexcept {
    Status s(code);
    va_list args;
    va_start(args, format);
    std::vsnprintf(s.message_, sizeof(s.message_), format, args);
    va_end(args);
    return s;
  }

  bool ok() const noexcept { return code_ == Error::Ok; }
  Error code() const noexcept { return code_; }
  /// Empty for Ok and for errors made from a bare code.
  const char* message() const noexcept { return message_; }
  // Implicit so that functions documented as returning Error can return Status.
  operator Error() const noexcept { return code_; }  // NOLINT

 private:
  void copy_message(const Status& other) noexcept {
    std::size_t n = std::strlen(other.message_);
    std::memcpy(message_, other.message_, n + 1);
  }

  Error code_;
  char message_[kMessageCapacity];
};

}  // namespace kvcore
