// Arrays the bindings hand out read-only for good. A numpy array can be made
// writable again (setflags(write=True)) when it owns its memory or its base
// chain ends in memory that is writable; an array whose memory is a bytes
// object cannot. Arrays that callers share (a step's mask, a tree's parents)
// are made this way, so writing them cannot change what later calls return.
#pragma once

#include <pybind11/numpy.h>

#include <initializer_list>

namespace kvcore_py {

namespace py = pybind11;

/// A new C-contiguous array of T and `shape` (one or two sizes) over the
/// memory of a fresh bytes object, and that memory, for the caller to fill
/// before anyone else sees the array. numpy refuses to make it writable.
template <typename T>
struct FrozenArray {
  py::array array;
  T* data = nullptr;

  explicit FrozenArray(std::initializer_list<py::ssize_t> shape) {
    auto& api = py::detail::npy_api::get();
    Py_intptr_t dims[2] = {0, 0};
    int nd = 0;
    py::ssize_t count = 1;
    for (py::ssize_t size : shape) {
      dims[nd++] = size;
      count *= size;
    }
    PyObject* raw = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(count * static_cast<py::ssize_t>(sizeof(T))));
    if (raw == nullptr) throw py::error_already_set();
    const py::object bytes = py::reinterpret_steal<py::object>(raw);
    data = reinterpret_cast<T*>(PyBytes_AS_STRING(raw));
    PyObject* arr = api.PyArray_NewFromDescr_(api.PyArray_Type_, py::dtype::of<T>().release().ptr(), nd, dims,
                                              nullptr, data, 0 /* flags: read-only */, nullptr);
    if (arr == nullptr) throw py::error_already_set();
    array = py::reinterpret_steal<py::array>(arr);
    py::detail::array_proxy(arr)->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
    if (api.PyArray_SetBaseObject_(arr, bytes.inc_ref().ptr()) != 0) throw py::error_already_set();
  }
};

}  // namespace kvcore_py
