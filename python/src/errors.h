// The Python boundary for kvcore outcomes: a Status becomes the Python
// exception class of its code (defined in kvcore/_errors.py), nothing else.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <exception>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "kvcore/core/result.h"

namespace kvcore_py {

namespace py = pybind11;

/// Carries an error code and its whole message from binding code to the
/// exception translator (a std::string: binding messages may quote long values).
class StatusError : public std::exception {
 public:
  explicit StatusError(const kvcore::Status& status)
      : code_(status.code()), message_(status.message().c_str()) {}
  StatusError(kvcore::Error code, std::string message) : code_(code), message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }
  kvcore::Error code() const noexcept { return code_; }

 private:
  kvcore::Error code_;
  std::string message_;
};

[[noreturn]] inline void raise(kvcore::Error code, const std::string& message) {
  throw StatusError(code, message);
}

inline void throw_if_error(const kvcore::Status& status) {
  if (!status.ok()) throw StatusError(status);
}

template <typename T>
T unwrap(kvcore::Result<T>&& result) {
  if (!result.ok()) throw StatusError(result.status());
  return std::move(result).get();
}

/// A Python int of any size (or any object with __index__, like numpy ints).
/// Binding integer arguments as PyInt instead of std::int64_t lets to_int() report
/// 2**70 as an InvalidArgumentError naming the value rather than a TypeError.
struct PyInt {
  py::int_ value;
};

/// `x` as a Python int (anything with __index__, as every integer argument
/// takes: bool is an int in Python; floats and str are refused), or nothing:
/// the caller raises the TypeError.
inline std::optional<PyInt> as_index(py::handle x) {
  PyObject* index = PyNumber_Index(x.ptr());
  if (index == nullptr) {
    PyErr_Clear();
    return std::nullopt;
  }
  return PyInt{py::reinterpret_steal<py::int_>(index)};
}

}  // namespace kvcore_py

namespace pybind11 {
namespace detail {

template <>
struct type_caster<kvcore_py::PyInt> {
  PYBIND11_TYPE_CASTER(kvcore_py::PyInt, const_name("typing.SupportsIndex"));

  bool load(handle src, bool /*convert*/) {
    if (!src) return false;
    std::optional<kvcore_py::PyInt> index = kvcore_py::as_index(src);
    if (!index) return false;
    value = std::move(*index);
    return true;
  }
};

}  // namespace detail
}  // namespace pybind11

namespace kvcore_py {

/// True, with *out set, when `value` fits a C int. For the predicates
/// (can_rewind, can_extend) that answer False instead of raising.
inline bool fits_int(const PyInt& value, int* out) {
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(value.value.ptr(), &overflow);
  if (overflow != 0 || v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
    return false;
  *out = static_cast<int>(v);
  return true;
}

/// Narrows a Python int to a C int, or raises InvalidArgumentError naming it.
inline int to_int(const char* name, const PyInt& value) {
  int v = 0;
  if (!fits_int(value, &v)) {
    std::string shown = py::repr(value.value).cast<std::string>();  // an int's repr: its digits
    if (shown.size() > 40) shown = shown.substr(0, 20) + "...(" + std::to_string(shown.size()) + " digits)";
    raise(kvcore::Error::InvalidArgument,
          std::string(name) + " = " + shown + ": must fit in a 32-bit signed int");
  }
  return v;
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
