// Sequence records at the Python boundary (kvcore/state/): token ids in, a
// record out as bytes (written in place, no second copy), a record in from any
// buffer (bytes, bytearray, memoryview, a numpy array: read in place when it
// starts on an 8-byte boundary, else copied once to one that does).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "errors.h"

namespace kvcore_py {

namespace py = pybind11;

/// Token ids as a C-contiguous int32 array (None: an empty one).
/// InvalidArgumentError: not a 1-D sequence of integers.
inline py::array_t<std::int32_t> token_array(py::handle tokens) {
  if (tokens.is_none()) return py::array_t<std::int32_t>(0);
  py::array_t<std::int32_t, py::array::c_style | py::array::forcecast> a;
  try {
    a = py::array_t<std::int32_t, py::array::c_style | py::array::forcecast>::ensure(tokens);
  } catch (const py::error_already_set&) {
    a = py::array_t<std::int32_t>();
  }
  if (!a || a.ndim() != 1) raise(kvcore::Error::InvalidArgument, "tokens: must be a 1-D sequence of token ids or None");
  return a;
}

/// A record's bytes (any C-contiguous buffer), 8-byte aligned, held for the
/// call. InvalidArgumentError: not a buffer, or not C-contiguous.
class RecordBytes {
 public:
  explicit RecordBytes(py::handle record) {
    if (!PyObject_CheckBuffer(record.ptr()))
      raise(kvcore::Error::InvalidArgument, "record: must be bytes-like (bytes, bytearray, memoryview, numpy array)");
    if (PyObject_GetBuffer(record.ptr(), &view_, PyBUF_C_CONTIGUOUS) != 0) {
      PyErr_Clear();
      raise(kvcore::Error::InvalidArgument, "record: the buffer must be C-contiguous");
    }
    size = static_cast<std::size_t>(view_.len);
    data = view_.buf;
    if (reinterpret_cast<std::uintptr_t>(data) % 8 != 0) {  // read in place only when aligned
      copy_.resize((size + 7) / 8);
      std::memcpy(copy_.data(), data, size);
      data = copy_.data();
    }
  }
  ~RecordBytes() { PyBuffer_Release(&view_); }
  RecordBytes(const RecordBytes&) = delete;
  RecordBytes& operator=(const RecordBytes&) = delete;

  const void* data = nullptr;
  std::size_t size = 0;

 private:
  Py_buffer view_{};
  std::vector<std::uint64_t> copy_;
};

/// A bytes object of `size` bytes that write(out) fills (8-byte aligned: a
/// bytes object's data is), returned once written.
template <typename Write>
py::bytes new_record(std::size_t size, Write write) {
  PyObject* raw = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(size));
  if (raw == nullptr) throw py::error_already_set();
  py::bytes out = py::reinterpret_steal<py::bytes>(raw);
  char* data = PyBytes_AsString(out.ptr());
  if (reinterpret_cast<std::uintptr_t>(data) % 8 != 0) {  // never on CPython; fall back to a copy
    std::vector<std::uint64_t> aligned((size + 7) / 8);
    write(static_cast<void*>(aligned.data()));
    std::memcpy(data, aligned.data(), size);
  } else {
    write(static_cast<void*>(data));
  }
  return out;
}

/// A writable buffer of at least `size` bytes for export_into. InvalidArgumentError:
/// read-only, not C-contiguous, too small.
inline py::buffer_info writable_buffer(py::handle out, std::size_t size) {
  if (!PyObject_CheckBuffer(out.ptr())) raise(kvcore::Error::InvalidArgument, "out: must be a writable buffer");
  py::buffer_info info = py::reinterpret_borrow<py::buffer>(out).request(true);
  const std::size_t have = static_cast<std::size_t>(info.size) * static_cast<std::size_t>(info.itemsize);
  if (have < size)
    raise(kvcore::Error::InvalidArgument,
          "out: holds " + std::to_string(have) + " bytes, the record needs " + std::to_string(size) + " (export_size)");
  return info;
}

}  // namespace kvcore_py
