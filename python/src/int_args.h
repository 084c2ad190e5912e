// Integer arguments of every binding. IntArg: one int, whose refusal (not an
// int) is a one-line TypeError naming the argument, not pybind11's listing of
// overloads. IntArray: a 1-D (or (n, k)) integer argument, read with no
// Python object per element: anything with the buffer protocol (numpy arrays,
// array.array, memoryview, ctypes arrays) of int32 or int64, contiguous, or a
// DLPack tensor (a CPU torch tensor) seen through numpy.from_dlpack; a list
// or tuple (or another ordered iterable: not a set or dict) of ints is also
// taken, one item at a time. Whatever the source,
// the integers are copied into the IntArray before its constructor returns,
// so what a binding validates is what it uses. Every refusal is an
// InvalidArgumentError (a TypeError for a list item that is not an int)
// naming the verb, the argument and the rule.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <cstring>
#include <memory>
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

/// Integers an IntArray owns: up to `Inline` of them in the object itself (no
/// heap allocation for the arrays of a decode step), more on the heap.
template <class T, std::size_t Inline>
class IntStore {
 public:
  IntStore() = default;
  IntStore(const IntStore&) = delete;
  IntStore& operator=(const IntStore&) = delete;

  /// Room for n integers (their values undefined), replacing any held.
  T* assign(std::size_t n) {
    if (n <= Inline) {
      heap_.reset();
      data_ = inline_;
    } else {
      heap_.reset(new T[n]);
      data_ = heap_.get();
    }
    return data_;
  }
  T* data() { return data_; }
  const T* data() const { return data_; }

 private:
  T inline_[Inline];
  std::unique_ptr<T[]> heap_;
  T* data_ = inline_;
};

class IntArray {
 public:
  // `verb` and `name` ("begin_step", "seqs") name the argument in messages.
  // With `allow_scalar`, one int (or a 0-d array) is taken too: is_scalar().
  // With `columns` > 0 the argument is (n, columns): a C-contiguous 2-D array
  // or a list of n rows of `columns` ints; size() counts every int, rows() n.
  //
  // The integers are copied into the object before the constructor returns:
  // no Python code (an __index__, a DLPack producer, another thread) can
  // change what a caller validated and then uses. The buffer is held only
  // while it is copied, with the GIL held.
  IntArray(const char* verb, const char* name, py::handle obj, bool allow_scalar = false, int columns = 0)
      : verb_(verb), name_(name), allow_scalar_(allow_scalar), columns_(columns) {
    py::object keep;  // the numpy array a DLPack tensor is read through
    if (!PyObject_CheckBuffer(obj.ptr()) && !py::isinstance<py::list>(obj) && !py::isinstance<py::tuple>(obj) &&
        py::hasattr(obj, "__dlpack__"))
      obj = keep = from_dlpack(obj);  // the producer's Python code runs here, before anything is read
    if (read_numpy(obj)) return;
    if (columns_ == 0 && read_exact_ints(obj)) return;
    if (PyObject_CheckBuffer(obj.ptr())) {
      read_buffer(obj);
    } else if (py::isinstance<py::list>(obj) || py::isinstance<py::tuple>(obj) ||
               (columns_ == 0 && !allow_scalar && py::isinstance<py::iterable>(obj) && !py::isinstance<py::str>(obj) &&
                !PyAnySet_Check(obj.ptr()) && !PyDict_Check(obj.ptr()))) {  // sets and dicts have no order
      if (columns_ > 0)
        read_rows(obj);
      else
        read_items(obj);
    } else if (allow_scalar && as_index(obj)) {
      read_items(py::make_tuple(obj));
      scalar_ = true;
    } else {
      raise(kvcore::Error::InvalidArgument,
            std::string(verb_) + ": " + name_ + " must be a " + shape_name() + " int32 or int64 array (numpy, a CPU torch tensor, "
            "anything with the buffer protocol) or a list of ints, got " + type_name(obj));
    }
  }
  IntArray(const IntArray&) = delete;
  IntArray& operator=(const IntArray&) = delete;

  /// Integers read: n, or n * columns for a 2-D argument.
  py::ssize_t size() const { return size_; }
  /// n: the length of a 1-D argument, the rows of a 2-D one.
  py::ssize_t rows() const { return columns_ > 0 ? size_ / columns_ : size_; }
  bool is_scalar() const { return scalar_; }
  /// Integer i (row-major for a 2-D argument), from the object's own copy.
  std::int64_t operator[](py::ssize_t i) const {
    const std::size_t at = static_cast<std::size_t>(i);
    return wide_ ? wide_values_.data()[at] : narrow_values_.data()[at];
  }
  // The elements as int32, in a new vector (at() names one that does not fit).
  std::vector<std::int32_t> take_int32s() {
    const std::int32_t* ids = int32s();
    return std::vector<std::int32_t>(ids, ids + size_);
  }

  // The elements as int32, in the object's own storage: narrowed there once
  // when they came wider (at() names one that does not fit). Valid while the
  // object lives.
  const std::int32_t* int32s() {
    if (wide_) {
      std::int32_t* out = narrow_values_.assign(static_cast<std::size_t>(size_));
      for (py::ssize_t i = 0; i < size_; ++i) out[static_cast<std::size_t>(i)] = at(i);
      wide_ = false;
    }
    return narrow_values_.data();
  }

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

  std::string shape_name() const { return columns_ > 0 ? "(n, " + std::to_string(columns_) + ")" : "1-D"; }

  py::object from_dlpack(py::handle obj) const {
    try {
      return py::module_::import("numpy").attr("from_dlpack")(obj);
    } catch (py::error_already_set& e) {
      std::string why = py::str(e.value()).cast<std::string>();
      why = why.substr(0, why.find('\n'));
      raise(kvcore::Error::InvalidArgument, std::string(verb_) + ": " + name_ +
                                                ": numpy cannot read this DLPack tensor in place (" + why +
                                                "); pass a CPU tensor");
    }
  }

  // Copies `n` integers of `itemsize` bytes (4: int32, else int64) from `data`.
  void copy_from(const void* data, py::ssize_t n, py::ssize_t itemsize) {
    size_ = n;
    wide_ = itemsize == 8;
    const std::size_t count = static_cast<std::size_t>(n);
    if (wide_) {
      std::int64_t* out = wide_values_.assign(count);
      if (count > 0) std::memcpy(out, data, count * sizeof(std::int64_t));
    } else {
      std::int32_t* out = narrow_values_.assign(count);
      if (count > 0) std::memcpy(out, data, count * sizeof(std::int32_t));
    }
  }

  // The shape checks shared by numpy's fields and the buffer protocol: `strides`
  // null means C-contiguous (the buffer protocol allows it).
  void check_shape(int ndim, const py::ssize_t* shape, const py::ssize_t* strides, py::ssize_t itemsize,
                   py::ssize_t* n) {
    const int want = columns_ > 0 ? 2 : 1;
    if (ndim != want) {
      const bool empty = ndim == 1 && shape[0] == 0;  // [] as (0, columns)
      if (!empty)
        raise(kvcore::Error::InvalidArgument, std::string(verb_) + ": " + name_ + " has " + std::to_string(ndim) +
                                                  " dimensions: must be " + shape_name());
      *n = 0;
      return;
    }
    if (columns_ > 0 && shape[1] != columns_)
      raise(kvcore::Error::InvalidArgument, std::string(verb_) + ": " + name_ + " has shape (" +
                                                std::to_string(shape[0]) + ", " + std::to_string(shape[1]) +
                                                "): must be " + shape_name());
    *n = columns_ > 0 ? shape[0] * columns_ : shape[0];
    if (strides == nullptr || *n <= 1) return;
    const bool contiguous = columns_ > 0 ? (shape[0] <= 1 || strides[0] == itemsize * columns_) &&
                                               strides[1] == itemsize
                                         : strides[0] == itemsize;
    if (!contiguous)
      raise(kvcore::Error::InvalidArgument, std::string(verb_) + ": " + name_ +
                                                " is not contiguous: use numpy.ascontiguousarray");
  }

  // The dtype as numpy names it when the object has one, else its buffer format.
  static std::string dtype_of(py::handle obj, const char* format) {
    if (py::hasattr(obj, "dtype")) return py::str(obj.attr("dtype")).cast<std::string>();
    return std::string("format '") + (format ? format : "B") + "'";
  }

  // The common case, read from numpy's own fields (no buffer export): a
  // native int32 or int64 numpy array. Anything else takes read_buffer,
  // which also says what is wrong.
  bool read_numpy(py::handle obj) {
    auto& api = py::detail::npy_api::get();
    if (!api.PyArray_Check_(obj.ptr())) return false;
    static PyObject* const int32 = api.PyArray_DescrFromType_(py::detail::npy_api::NPY_INT32_);
    static PyObject* const int64 = api.PyArray_DescrFromType_(py::detail::npy_api::NPY_INT64_);
    const auto* a = py::detail::array_proxy(obj.ptr());
    const bool wide = a->descr == int64;
    if (a->descr != int32 && !wide) return false;
    const py::ssize_t itemsize = wide ? 8 : 4;
    if (a->nd == 0) {
      if (!allow_scalar_) return false;  // read_buffer names it
      scalar_ = true;
      copy_from(a->data, 1, itemsize);
      return true;
    }
    py::ssize_t n = 0;
    check_shape(a->nd, a->dimensions, a->strides, itemsize, &n);
    copy_from(a->data, n, itemsize);
    return true;
  }

  void read_buffer(py::handle obj) {
    Py_buffer view{};
    if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_RECORDS_RO) != 0) throw py::error_already_set();
    struct Release {
      Py_buffer* v;
      ~Release() { PyBuffer_Release(v); }
    } release{&view};
    const char* f = view.format ? view.format : "B";
    if (*f == '@' || *f == '=' || *f == '<') ++f;  // native or little-endian (this build's order)
    const bool signed_int = std::strlen(f) == 1 && std::strchr("ilqn", *f) != nullptr;
    if (!signed_int || (view.itemsize != 4 && view.itemsize != 8))
      raise(kvcore::Error::InvalidArgument, std::string(verb_) + ": " + name_ + ".dtype = " +
                                                dtype_of(obj, view.format) + ": must be int32 or int64");
    if (view.ndim == 0 && allow_scalar_) {
      scalar_ = true;
      copy_from(view.buf, 1, view.itemsize);
      return;
    }
    py::ssize_t n = 0;
    check_shape(view.ndim, view.shape, view.strides, view.itemsize, &n);
    copy_from(view.buf, n, view.itemsize);
  }

  // The common list case: a list or tuple whose items are all exact ints
  // that fit in 32 bits (what a tokenizer returns), read straight into int32
  // storage. No Python code runs while the items are read (an exact int has
  // no __index__ to call), so the list cannot change under the loop. Anything
  // else (a bool, an int subclass, a wider value, a non-int) returns false
  // and the caller reads the object again item by item (read_items), which
  // says what is wrong.
  bool read_exact_ints(py::handle obj) {
    PyObject* o = obj.ptr();
    if (!PyList_Check(o) && !PyTuple_Check(o)) return false;
    const py::ssize_t n = PySequence_Fast_GET_SIZE(o);
    PyObject** items = PySequence_Fast_ITEMS(o);
    std::int32_t* out = narrow_values_.assign(static_cast<std::size_t>(n));
    for (py::ssize_t i = 0; i < n; ++i) {
      PyObject* x = items[i];
      if (!PyLong_CheckExact(x)) return false;
      int overflow = 0;
      const long v = PyLong_AsLongAndOverflow(x, &overflow);
      if (overflow != 0 || v < INT32_MIN || v > INT32_MAX) return false;
      out[i] = static_cast<std::int32_t>(v);
    }
    size_ = n;
    wide_ = false;
    return true;
  }

  // A list or tuple of ints, each through __index__. __index__ may run Python
  // code that changes the list: the items are taken into a tuple first, and
  // each value is copied once.
  void read_items(py::handle obj) {
    std::vector<std::int64_t> values;
    append_items(obj, &values);
    store_wide(values);
  }

  void append_items(py::handle obj, std::vector<std::int64_t>* values) {
    const py::tuple items = py::reinterpret_steal<py::tuple>(PySequence_Tuple(obj.ptr()));
    if (!items) throw py::error_already_set();
    values->reserve(values->size() + items.size());
    for (py::handle x : items) {
      const std::size_t i = values->size();
      const std::optional<PyInt> v = as_index(x);
      if (!v) refuse_non_int(std::string(verb_) + ": " + name_ + "[" + std::to_string(i) + "]", x);
      int overflow = 0;
      const long long value = PyLong_AsLongLongAndOverflow(v->value.ptr(), &overflow);
      if (overflow != 0)
        raise(kvcore::Error::InvalidArgument, std::string(verb_) + ": " + name_ + "[" + std::to_string(i) +
                                                  "] = " + py::repr(v->value).cast<std::string>() +
                                                  ": must fit in a 32-bit signed int");
      values->push_back(value);
    }
  }

  void store_wide(const std::vector<std::int64_t>& values) {
    std::int64_t* out = wide_values_.assign(values.size());
    if (!values.empty()) std::memcpy(out, values.data(), values.size() * sizeof(std::int64_t));
    size_ = static_cast<py::ssize_t>(values.size());
    wide_ = true;
  }

  // A list of rows, each a list or tuple of `columns` ints.
  void read_rows(py::handle obj) {
    const py::tuple rows = py::reinterpret_steal<py::tuple>(PySequence_Tuple(obj.ptr()));
    if (!rows) throw py::error_already_set();
    std::vector<std::int64_t> values;
    for (py::handle row : rows) {
      const std::size_t r = values.size() / static_cast<std::size_t>(columns_);
      if (!(py::isinstance<py::list>(row) || py::isinstance<py::tuple>(row)) ||
          py::len(row) != static_cast<std::size_t>(columns_))
        raise(kvcore::Error::InvalidArgument, std::string(verb_) + ": " + name_ + "[" + std::to_string(r) +
                                                  "] must be a list of " + std::to_string(columns_) + " ints");
      append_items(row, &values);
    }
    store_wide(values);
  }

  const char* verb_;
  const char* name_;
  bool allow_scalar_ = false;
  int columns_ = 0;
  bool scalar_ = false;
  // The integers: int32 ones (and lists of small exact ints) in narrow_values_,
  // int64 ones and other Python ints in wide_values_ (wide_). Inline up to 256
  // (a decode step's ids at N = 256), on the heap beyond.
  IntStore<std::int32_t, 256> narrow_values_;
  IntStore<std::int64_t, 256> wide_values_;
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
