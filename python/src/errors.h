// The Python boundary for kvcore outcomes: a Status becomes the Python
// exception class of its code (defined in kvcore/_errors.py), nothing else.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <exception>
#include <limits>
#include <string>

#include "kvcore/result.h"

namespace kvcore_py {

namespace py = pybind11;

/// Carries a Status from binding code to the exception translator.
class StatusError : public std::exception {
 public:
  explicit StatusError(kvcore::Status status) : status_(status) {}
  const char* what() const noexcept override { return status_.message(); }
  const kvcore::Status& status() const noexcept { return status_; }

 private:
  kvcore::Status status_;
};

[[noreturn]] inline void raise(kvcore::Error code, const std::string& message) {
  throw StatusError(kvcore::Status::make(code, "%s", message.c_str()));
}

inline void throw_if_error(const kvcore::Status& status) {
  if (!status.ok()) throw StatusError(status);
}

template <typename T>
T unwrap(kvcore::Result<T>&& result) {
  if (!result.ok()) throw StatusError(result.status());
  return std::move(result).get();
}

/// Narrows a Python int to a C int, or raises InvalidArgumentError naming it.
inline int to_int(const char* name, std::int64_t value) {
  if (value < std::numeric_limits<int>::min() || value > std::numeric_limits<int>::max()) {
    raise(kvcore::Error::InvalidArgument, std::string(name) + " = " + std::to_string(value) +
                                              ": must fit in a 32-bit signed int");
  }
  return static_cast<int>(value);
}

void register_errors(py::module_& m);

}  // namespace kvcore_py
