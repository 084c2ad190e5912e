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
#include <string>
#include <vector>

#include "errors.h"
#include "int_args.h"

namespace kvcore_py {

namespace py = pybind11;

/// The token ids of a record (None: none), copied as int32 (IntArray's rules:
/// a 1-D int32 or int64 array or a list of ints). `verb` names the call in
/// refusals. InvalidArgumentError: another dtype, not 1-D, not contiguous, an
/// id beyond 32 bits; TypeError: a list item that is not an int (1.5).
inline std::vector<std::int32_t> token_ids_of(const char* verb, py::handle tokens) {
  if (tokens.is_none()) return {};
  return IntArray(verb, "tokens", tokens).take_int32s();
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

/// An output buffer `out` held for the call: writable, C-contiguous (its bytes
/// in order: a negative-stride, stride-0 or Fortran-ordered view would get
/// them in other places) and at least `size` bytes. InvalidArgumentError
/// naming the rule otherwise, before anything is written.
class OutputBuffer {
 public:
  OutputBuffer(const char* verb, py::handle out, std::size_t size) {
    if (!PyObject_CheckBuffer(out.ptr()))
      raise(kvcore::Error::InvalidArgument, std::string(verb) + ": out: must be a writable buffer (a numpy uint8 "
                                            "array, a bytearray), got " + py::str(py::type::handle_of(out).attr("__name__")).cast<std::string>());
    if (PyObject_GetBuffer(out.ptr(), &view_, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) != 0) {
      PyErr_Clear();
      Py_buffer probe{};
      const bool contiguous = PyObject_GetBuffer(out.ptr(), &probe, PyBUF_C_CONTIGUOUS) == 0;
      if (contiguous) PyBuffer_Release(&probe);
      PyErr_Clear();
      if (contiguous) raise(kvcore::Error::InvalidArgument, std::string(verb) + ": out: is read-only: must be writable");
      raise(kvcore::Error::InvalidArgument, std::string(verb) + ": out: is not C-contiguous (a strided, negative-stride, "
                                            "stride-0 or Fortran-ordered view): pass a contiguous buffer");
    }
    data = static_cast<unsigned char*>(view_.buf);
    bytes = static_cast<std::size_t>(view_.len);
    if (bytes < size) {
      PyBuffer_Release(&view_);
      raise(kvcore::Error::InvalidArgument, std::string(verb) + ": out: holds " + std::to_string(bytes) +
                                                " bytes, the record needs " + std::to_string(size) + " (export_size)");
    }
  }
  ~OutputBuffer() { PyBuffer_Release(&view_); }
  OutputBuffer(const OutputBuffer&) = delete;
  OutputBuffer& operator=(const OutputBuffer&) = delete;

  unsigned char* data = nullptr;
  std::size_t bytes = 0;  // the whole buffer's length in bytes

 private:
  Py_buffer view_{};
};

}  // namespace kvcore_py
