// Result<T>: a value or a Status, never both. Move-only; reading the value of
// an error aborts through an always-on check (not assert, which release drops).
// Propagation macros are plain C++ (no GNU statement expressions), so they stay
// clean under -Wpedantic.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <new>
#include <type_traits>
#include <utility>

#include "kvcore/core/error.h"
#include "kvcore/core/status.h"

/// Always-on invariant check: prints the message and aborts when `cond` is false.
#define KVCORE_CHECK(cond, msg)                                                      \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::fprintf(stderr, "kvcore: check failed at %s:%d: %s\n", __FILE__, __LINE__, \
                   (msg));                                                           \
      std::abort();                                                                  \
    }                                                                                \
  } while (0)

namespace kvcore {

/// A value or an error, never both (a union, as ExecuTorch's Result): a
/// success is just the value and a flag, an error is a Status whose message is
/// formatted only when asked for.
template <typename T>
class [[nodiscard]] Result {
  static_assert(!std::is_reference<T>::value, "Result<T&> is not supported");
  static_assert(!std::is_same<T, Status>::value, "Result<Status> is not supported: return a Status");

 public:
  Result(const T& value) : has_value_(true) { new (&value_) T(value); }        // NOLINT
  Result(T&& value) : has_value_(true) { new (&value_) T(std::move(value)); }  // NOLINT
  /// An error. An Ok status carries no value, so it becomes Internal.
  Result(const Status& status) noexcept : has_value_(false) {  // NOLINT
    new (&status_) Status(status.ok() ? Status::make(Error::Internal,
                                                     "Result built from Ok without a value")
                                      : status);
  }
  Result(Error code) noexcept : Result(Status(code)) {}  // NOLINT

  Result(Result&& other) noexcept(std::is_nothrow_move_constructible<T>::value)
      : has_value_(other.has_value_) {
    if (has_value_) {
      new (&value_) T(std::move(other.value_));
    } else {
      new (&status_) Status(other.status_);
    }
  }
  Result(const Result&) = delete;
  Result& operator=(const Result&) = delete;
  Result& operator=(Result&&) = delete;
  ~Result() {
    if (has_value_) value_.~T();
  }

  bool ok() const noexcept { return has_value_; }
  /// Error::Ok for a value.
  Error error() const noexcept { return has_value_ ? Error::Ok : status_.code(); }
  /// The error (Ok for a value).
  Status status() const noexcept { return has_value_ ? Status() : status_; }
  /// The error's message, formatted now; empty for a value.
  Message message() const noexcept { return has_value_ ? Message() : status_.message(); }

  T& get() & {
    KVCORE_CHECK(has_value_, "Result::get() on an error");
    return value_;
  }
  const T& get() const& {
    KVCORE_CHECK(has_value_, "Result::get() on an error");
    return value_;
  }
  T&& get() && {
    KVCORE_CHECK(has_value_, "Result::get() on an error");
    return std::move(value_);
  }
  T& operator*() & { return get(); }
  const T& operator*() const& { return get(); }
  T* operator->() { return &get(); }
  const T* operator->() const { return &get(); }

 private:
  union {
    T value_;
    Status status_;  // trivially destructible: only T needs its destructor run
  };
  bool has_value_;
};

namespace internal {
inline bool is_ok(const Status& s) noexcept { return s.ok(); }
inline bool is_ok(Error e) noexcept { return e == Error::Ok; }
template <typename T>
bool is_ok(const Result<T>& r) noexcept {
  return r.ok();
}
inline const Status& to_status(const Status& s) noexcept { return s; }
inline Status to_status(Error e) noexcept { return Status(e); }
template <typename T>
Status to_status(const Result<T>& r) noexcept {
  return r.status();
}
}  // namespace internal

}  // namespace kvcore

#define KVCORE_CONCAT_INNER_(a, b) a##b
#define KVCORE_CONCAT_(a, b) KVCORE_CONCAT_INNER_(a, b)

/// Returns Status(Error::code, message) from the enclosing function when `cond`
/// is false. The message is printf-style: KVCORE_CHECK_OR_RETURN_ERROR(t >= 1,
/// InvalidArgument, "T = %d: must be >= 1", t).
#define KVCORE_CHECK_OR_RETURN_ERROR(cond, code, ...)                 \
  do {                                                                \
    if (!(cond)) {                                                    \
      return ::kvcore::Status::make(::kvcore::Error::code, __VA_ARGS__); \
    }                                                                 \
  } while (0)

/// Returns the status of `expr` (Status, Error or Result) when it is an error.
/// Nothing is copied on success.
#define KVCORE_RETURN_IF_ERROR(expr)                                              \
  do {                                                                            \
    const auto& kvcore_outcome_ = (expr);                                         \
    if (!::kvcore::internal::is_ok(kvcore_outcome_))                              \
      return ::kvcore::internal::to_status(kvcore_outcome_);                      \
  } while (0)

/// `KVCORE_ASSIGN_OR_RETURN(auto x, make_x());` assigns the value of a Result
/// or returns its status from the enclosing function.
#define KVCORE_ASSIGN_OR_RETURN(lhs, expr) \
  KVCORE_ASSIGN_OR_RETURN_IMPL_(KVCORE_CONCAT_(kvcore_result_, __LINE__), lhs, expr)
#define KVCORE_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).get()
