// Integer arguments of the batch verbs. IntArg: one int, whose refusal (not an
// int) is a one-line TypeError naming the argument, not pybind11's listing of
// overloads. IntArray: a one-dimensional integer argument, read with
// no Python object per element: anything with the buffer protocol (numpy
// arrays, array.array, memoryview) of int32 or int64, or a DLPack tensor (a
// CPU torch tensor) seen through numpy.from_dlpack, without a copy. A list or
// tuple of ints is also taken (copied, one item at a time) for convenience.
// Every refusal is an InvalidArgumentError (a TypeError for a list item that
// is not an int) naming the verb, the argument and the rule.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "errors.h"

namespace kvcore_py {

// Throws "seq = 'a': must be an int, got str" (the value's repr cut to 40 characters).
[[noreturn]] inline void refuse_non_int(const std::string& what, py::handle x) {
  std::string shown = py::repr(x).cast<std::string>();
  if (shown.size() > 40) shown = shown.substr(0, 37) + "...";
  throw py::type_error(what + " = " + shown + ": must be an int, got " +
                       py::str(py::type::handle_of(x).attr("__name__")).cast<std::string>());
}

/// An integer argument that pybind11 passes through unchecked: to_int(name, arg)
/// takes anything with __index__ and refuses the rest with refuse_non_int.
struct IntArg {
  py::object value;
};

/// The argument as a Python int, or a TypeError naming it.
inline PyInt index_of(const char* name, const IntArg& arg) {
  std::optional<PyInt> v = as_index(arg.value);
  if (!v) refuse_non_int(name, arg.value);
  return std::move(*v);
}

/// The argument narrowed to a C int: TypeError for a non-int, InvalidArgumentError beyond 32 bits.
inline int to_int(const char* name, const IntArg& arg) { return to_int(name, index_of(name, arg)); }

class IntArray {
 public:
  // `verb` and `name` ("begin_step", "seqs") name the argument in messages.
  // With `allow_scalar`, one int (or a 0-d array) is taken too: is_scalar().
  IntArray(const char* verb, const char* name, py::handle obj, bool allow_scalar = false)
      : verb_(verb), name_(name), allow_scalar_(allow_scalar) {
    if (!PyObject_CheckBuffer(obj.ptr()) && !py::isinstance<py::list>(obj) && !py::isinstance<py::tuple>(obj) &&
        py::hasattr(obj, "__dlpack__"))
      obj = from_dlpack(obj);
    if (read_numpy(obj)) return;
    if (PyObject_CheckBuffer(obj.ptr())) {
      read_buffer(obj);
    } else if (py::isinstance<py::list>(obj) || py::isinstance<py::tuple>(obj)) {
      read_items(obj);
    } else if (allow_scalar && as_index(obj)) {
      read_items(py::make_tuple(obj));
      scalar_ = true;
    } else {
      raise(kvcore::Error::InvalidArgument,
            std::string(verb_) + ": " + name_ + " must be a 1-D int32 or int64 array (numpy, a CPU torch tensor, "
            "anything with the buffer protocol) or a list of ints, got " + type_name(obj));
    }
  }
  ~IntArray() {
    if (has_view_) PyBuffer_Release(&view_);
  }
  IntArray(const IntArray&) = delete;
  IntArray& operator=(const IntArray&) = delete;

  py::ssize_t size() const { return size_; }
  bool is_scalar() const { return scalar_; }
  std::int64_t operator[](py::ssize_t i) const {
    if (wide_) return static_cast<const std::int64_t*>(data_)[i];
    return static_cast<const std::int32_t*>(data_)[i];
  }
  // The elements as int32 in place (no copy), or null when they are int64.
  const std::int32_t* int32_data() const { return wide_ ? nullptr : static_cast<const std::int32_t*>(data_); }

  // Element i narrowed to a C int, or InvalidArgumentError naming it.
  int at(py::ssize_t i) const {
    const std::int64_t v = (*this)[i];
    if (v < INT32_MIN || v > INT32_MAX)
      raise(kvcore::Error::InvalidArgument, std::string(verb_) + ": " + name_ + "[" + std::to_string(i) +
                                                "] = " + std::to_string(v) + ": must fit in a 32-bit signed int");
    return static_cast<int>(v);
  }

  // Every element narrowed to a C int, in a new vector (at() names one that does not fit).
  std::vector<int> ints() const {
    std::vector<int> out(static_cast<std::size_t>(size_));
    for (py::ssize_t i = 0; i < size_; ++i) out[static_cast<std::size_t>(i)] = at(i);
    return out;
  }

  const char* name() const { return name_; }

 private:
  static std::string type_name(py::handle x) {
    return py::str(py::type::handle_of(x).attr("__name__")).cast<std::string>();
  }

  py::object from_dlpack(py::handle obj) {
    try {
      keep_ = py::module_::import("numpy").attr("from_dlpack")(obj);
    } catch (py::error_already_set& e) {
      std::string why = py::str(e.value()).cast<std::string>();
      why = why.substr(0, why.find('\n'));
      raise(kvcore::Error::InvalidArgument, std::string(verb_) + ": " + name_ +
                                                ": numpy cannot read this DLPack tensor in place (" + why +
                                                "); pass a CPU tensor");
    }
    return keep_;
  }

  // The dtype as numpy names it when the object has one, else its buffer format.
  std::string dtype_of(py::handle obj) const {
    if (py::hasattr(obj, "dtype")) return py::str(obj.attr("dtype")).cast<std::string>();
    return std::string("format '") + (view_.format ? view_.format : "B") + "'";
  }

  // The common case, read from numpy's own fields (no buffer export): a 1-D
  // contiguous int32 or int64 numpy array. Anything else takes read_buffer,
  // which also says what is wrong.
  bool read_numpy(py::handle obj) {
    auto& api = py::detail::npy_api::get();
    if (!api.PyArray_Check_(obj.ptr())) return false;
    static PyObject* const int32 = api.PyArray_DescrFromType_(py::detail::npy_api::NPY_INT32_);
    static PyObject* const int64 = api.PyArray_DescrFromType_(py::detail::npy_api::NPY_INT64_);
    const auto* a = py::detail::array_proxy(obj.ptr());
    const bool wide = a->descr == int64;
    if ((a->descr != int32 && !wide) || a->nd != 1) return false;
    const py::ssize_t itemsize = wide ? 8 : 4;
    if (a->dimensions[0] > 1 && a->strides[0] != itemsize) return false;
    size_ = a->dimensions[0];
    wide_ = wide;
    data_ = a->data;
    return true;
  }

  void read_buffer(py::handle obj) {
    if (PyObject_GetBuffer(obj.ptr(), &view_, PyBUF_STRIDES | PyBUF_FORMAT) != 0) throw py::error_already_set();
    has_view_ = true;
    const char* f = view_.format ? view_.format : "B";
    if (*f == '@' || *f == '=' || *f == '<') ++f;
    const bool signed_int = std::strlen(f) == 1 && std::strchr("ilq", *f) != nullptr;
    if (!signed_int || (view_.itemsize != 4 && view_.itemsize != 8))
      raise(kvcore::Error::InvalidArgument, std::string(verb_) + ": " + name_ + ".dtype = " + dtype_of(obj) +
                                                ": must be int32 or int64");
    if (view_.ndim == 0 && allow_scalar_) {
      size_ = 1;
      scalar_ = true;
      wide_ = view_.itemsize == 8;
      data_ = view_.buf;
      return;
    }
    if (view_.ndim != 1)
      raise(kvcore::Error::InvalidArgument, std::string(verb_) + ": " + name_ + " has " +
                                                std::to_string(view_.ndim) + " dimensions: must be 1-D");
    size_ = view_.shape[0];
    if (size_ > 1 && view_.strides[0] != view_.itemsize)
      raise(kvcore::Error::InvalidArgument, std::string(verb_) + ": " + name_ +
                                                " is not contiguous: use numpy.ascontiguousarray");
    wide_ = view_.itemsize == 8;
    data_ = view_.buf;
  }

  void read_items(py::handle obj) {
    const py::sequence items = py::reinterpret_borrow<py::sequence>(obj);
    owned_.reserve(items.size());
    for (py::handle x : items) {
      const std::optional<PyInt> v = as_index(x);
      if (!v)
        refuse_non_int(std::string(verb_) + ": " + name_ + "[" + std::to_string(owned_.size()) + "]", x);
      int overflow = 0;
      const long long value = PyLong_AsLongLongAndOverflow(v->value.ptr(), &overflow);
      if (overflow != 0)
        raise(kvcore::Error::InvalidArgument, std::string(verb_) + ": " + name_ + "[" +
                                                  std::to_string(owned_.size()) + "] = " +
                                                  py::repr(v->value).cast<std::string>() +
                                                  ": must fit in a 32-bit signed int");
      owned_.push_back(value);
    }
    size_ = static_cast<py::ssize_t>(owned_.size());
    wide_ = true;
    data_ = owned_.data();
  }

  const char* verb_;
  const char* name_;
  bool allow_scalar_ = false;
  bool scalar_ = false;
  Py_buffer view_{};
  bool has_view_ = false;
  py::object keep_;  // the numpy array a DLPack tensor was read through
  std::vector<std::int64_t> owned_;  // a list's items
  const void* data_ = nullptr;
  py::ssize_t size_ = 0;
  bool wide_ = false;
};

}  // namespace kvcore_py

namespace pybind11 {
namespace detail {

template <>
struct type_caster<kvcore_py::IntArg> {
  PYBIND11_TYPE_CASTER(kvcore_py::IntArg, const_name("typing.SupportsIndex"));

  bool load(handle src, bool /*convert*/) {
    if (!src) return false;
    value.value = reinterpret_borrow<object>(src);
    return true;
  }
};

}  // namespace detail
}  // namespace pybind11
