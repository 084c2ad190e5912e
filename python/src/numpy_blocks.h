// NumpyBlocks: the storage side both Python byte layers share (KVPool in
// py_kv_pool.h, PagedKVPool in py_paged_kv_pool.h). Every block the C++ pool allocates
// through allocator() is owned by a capsule; the pool holds one reference and
// each zero-copy view holds another (as its numpy base), so a view never points
// at freed memory, even after the pool grows or dies. Inputs are checked, and
// arrays made, through numpy's C API: no shape vectors, no Python-level calls
// on the per-layer hot path.
#pragma once

#include <pybind11/numpy.h>

#include <cstddef>
#include <cstdlib>
#include <string>
#include <unordered_map>

#include "errors.h"
#include "kvcore/pool/pool_allocator.h"
#include "kvcore/pool/quantize.h"
#include "numpy_dtype.h"

namespace kvcore_py {

class NumpyBlocks {
 public:
  // Blocks of the dtype `dtype_spec` names (parse_dtype: InvalidArgument for
  // anything else); `capsule_name` (a string literal) names the capsules and
  // `pool` ("pool", "paged pool") the owner in error messages.
  // `compute_spec` (None: float32) is the dtype values come in and go out as
  // for a quantized format (float32, float16, bfloat16); a plain pool's values
  // are its own dtype, and a compute dtype other than that is refused.
  NumpyBlocks(py::handle dtype_spec, const char* capsule_name, const char* pool,
              py::handle compute_spec = py::none())
      : capsule_name_(capsule_name), pool_(pool) {
    auto parsed = parse_dtype(dtype_spec);
    dtype_ = parsed.first;
    element_type_ = parsed.second;
    element_size_ = kvcore::element_size(parsed.second);
    compute_dtype_ = dtype_;
    compute_type_ = element_type_;
    if (kvcore::is_quantized(element_type_)) {
      auto compute = parse_dtype(compute_spec.is_none() ? py::handle(py::str("float32")) : compute_spec);
      if (!kvcore::is_compute_type(compute.second))
        raise(kvcore::Error::InvalidArgument,
              "compute_dtype = " + describe(compute.first) + ": a " + kvcore::to_string(element_type_) + " " +
                  pool + " takes and gives float32, float16 or bfloat16 values");
      compute_dtype_ = compute.first;
      compute_type_ = compute.second;
    } else if (!compute_spec.is_none()) {
      auto compute = parse_dtype(compute_spec);
      if (compute.second != element_type_)
        raise(kvcore::Error::InvalidArgument,
              "compute_dtype = " + describe(compute.first) + ": a " + pool + " of " + kvcore::to_string(element_type_) +
                  " takes and gives its own dtype; a compute dtype is for 'qint8' and 'fp8_e4m3'");
    }
    element_size_ = kvcore::element_size(compute_type_);
  }

  // True for a quantized format: values in and out are compute_dtype().
  bool quantized() const { return kvcore::is_quantized(element_type_); }
  const py::dtype& compute_dtype() const { return compute_dtype_; }
  kvcore::DType compute_type() const { return compute_type_; }

  // Blocks drop their last owner reference with the views that hold them.
  NumpyBlocks(const NumpyBlocks&) = delete;
  NumpyBlocks& operator=(const NumpyBlocks&) = delete;

  // The allocator to give the C++ pool; this object must outlive the pool.
  kvcore::PoolAllocator allocator() {
    kvcore::PoolAllocator alloc;
    alloc.context = this;
    alloc.allocate = &NumpyBlocks::allocate_block;
    alloc.release = &NumpyBlocks::release_block;
    return alloc;
  }

  const py::dtype& dtype() const { return dtype_; }
  kvcore::DType element_type() const { return element_type_; }

  // Bytes of a (rows, heads, dim) array of the compute dtype (a plain pool's own).
  std::size_t bytes_of(Py_intptr_t rows, int heads, int dim) const {
    return static_cast<std::size_t>(rows) * static_cast<std::size_t>(heads) *
           static_cast<std::size_t>(dim) * element_size_;
  }

  static char* data_of(py::handle a) { return py::detail::array_proxy(a.ptr())->data; }

  static void set_read_only(py::handle a) {
    py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  }

  // The data of input `name`, checked to be a C-contiguous numpy array of the
  // pool's dtype shaped (rows, heads, dim); InvalidArgument names the rule,
  // with `rows_name` and `dim_name` as the shape's first and last names.
  const char* check_input(const char* name, py::handle a, const char* rows_name, Py_intptr_t rows,
                          int heads, const char* dim_name, int dim) const {
    auto& api = py::detail::npy_api::get();
    if (!api.PyArray_Check_(a.ptr()))
      raise(kvcore::Error::InvalidArgument,
            std::string(name) + ": must be a numpy.ndarray, got " +
                py::str(py::type::handle_of(a).attr("__name__")).cast<std::string>());
    const auto* p = py::detail::array_proxy(a.ptr());
    if (p->descr != compute_dtype_.ptr() && !api.PyArray_EquivTypes_(p->descr, compute_dtype_.ptr()))
      raise(kvcore::Error::InvalidArgument,
            std::string(name) + ".dtype = " + describe(p->descr) + ": the " + pool_ +
                (quantized() ? std::string(" (") + kvcore::to_string(element_type_) + ") takes values of " +
                                   describe(compute_dtype_)
                             : std::string(" stores ") + describe(dtype_)));
    if (p->nd != 3 || p->dimensions[0] != rows || p->dimensions[1] != heads || p->dimensions[2] != dim)
      raise(kvcore::Error::InvalidArgument,
            std::string(name) + ".shape = " + describe(py::reinterpret_borrow<py::object>(a).attr("shape")) +
                ": must be (" + rows_name + ", n_kv_heads, " + dim_name + ") = (" + std::to_string(rows) +
                ", " + std::to_string(heads) + ", " + std::to_string(dim) + ")");
    if ((p->flags & py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_) == 0)
      raise(kvcore::Error::InvalidArgument,
            std::string(name) + ": must be C-contiguous (use numpy.ascontiguousarray)");
    return p->data;
  }

  // A read-only (rows, heads, dim) array over `data`, inside `block` (a block
  // the pool allocated), keeping the block alive; no rows: an empty array.
  py::object view(const unsigned char* block, const unsigned char* data, Py_intptr_t rows, int heads,
                  int dim) const {
    if (rows == 0) {
      py::object out = empty(0, heads, dim);
      set_read_only(out);
      return out;
    }
    auto owner = owners_.find(const_cast<unsigned char*>(block));
    if (owner == owners_.end())
      raise(kvcore::Error::Internal, std::string("a ") + pool_ + " block has no owner");
    auto& api = py::detail::npy_api::get();
    const Py_intptr_t dims[3] = {rows, heads, dim};
    Py_INCREF(dtype_.ptr());  // NewFromDescr steals it
    PyObject* arr = api.PyArray_NewFromDescr_(api.PyArray_Type_, dtype_.ptr(), 3, dims, nullptr,
                                              const_cast<unsigned char*>(data), 0, nullptr);
    if (arr == nullptr) throw py::error_already_set();
    py::object out = py::reinterpret_steal<py::object>(arr);
    if (api.PyArray_SetBaseObject_(arr, owner->second.inc_ref().ptr()) != 0) throw py::error_already_set();
    return out;
  }

  // A read-only array of `descr` over `data` (inside the pool block `block`,
  // kept alive by the array), of `nd` dims and byte strides: the raw parts of
  // quantized rows (values, scales, zero points), which interleave in a row.
  py::object strided_view(const unsigned char* block, const unsigned char* data, const py::dtype& descr, int nd,
                          const Py_intptr_t* dims, const Py_intptr_t* strides) const {
    auto& api = py::detail::npy_api::get();
    Py_INCREF(descr.ptr());
    PyObject* arr = api.PyArray_NewFromDescr_(api.PyArray_Type_, descr.ptr(), nd, const_cast<Py_intptr_t*>(dims),
                                              const_cast<Py_intptr_t*>(strides),
                                              dims[0] == 0 ? nullptr : const_cast<unsigned char*>(data), 0, nullptr);
    if (arr == nullptr) throw py::error_already_set();
    py::object out = py::reinterpret_steal<py::object>(arr);
    if (dims[0] != 0) {
      auto owner = owners_.find(const_cast<unsigned char*>(block));
      if (owner == owners_.end()) raise(kvcore::Error::Internal, std::string("a ") + pool_ + " block has no owner");
      if (api.PyArray_SetBaseObject_(arr, owner->second.inc_ref().ptr()) != 0) throw py::error_already_set();
    }
    set_read_only(out);
    return out;
  }

  // A read-only (rows, heads, dim) view of the compute dtype over the start of
  // workspace `which` (0: K, 1: V), grown (never shrunk) to hold it: where a
  // quantized pool dequantizes a read. The next read overwrites it.
  py::object workspace(int which, Py_intptr_t rows, int heads, int dim) {
    py::object& ws = workspace_[which];
    const Py_intptr_t n = rows * heads * dim;
    auto& api = py::detail::npy_api::get();
    if (!ws || py::detail::array_proxy(ws.ptr())->dimensions[0] < n) {
      Py_intptr_t grown = ws ? py::detail::array_proxy(ws.ptr())->dimensions[0] * 2 : 0;
      if (grown < n) grown = n;
      Py_INCREF(compute_dtype_.ptr());
      PyObject* arr = api.PyArray_NewFromDescr_(api.PyArray_Type_, compute_dtype_.ptr(), 1, &grown, nullptr, nullptr,
                                                0, nullptr);
      if (arr == nullptr) throw py::error_already_set();
      ws = py::reinterpret_steal<py::object>(arr);
    }
    const Py_intptr_t dims[3] = {rows, heads, dim};
    Py_INCREF(compute_dtype_.ptr());
    PyObject* arr = api.PyArray_NewFromDescr_(api.PyArray_Type_, compute_dtype_.ptr(), 3, const_cast<Py_intptr_t*>(dims),
                                              nullptr, data_of(ws), 0, nullptr);
    if (arr == nullptr) throw py::error_already_set();
    py::object out = py::reinterpret_steal<py::object>(arr);
    if (api.PyArray_SetBaseObject_(arr, ws.inc_ref().ptr()) != 0) throw py::error_already_set();
    set_read_only(out);
    return out;
  }

  // Bytes of the workspace's capacity, K and V.
  std::size_t workspace_bytes() const {
    std::size_t n = 0;
    for (const py::object& ws : workspace_)
      if (ws) n += static_cast<std::size_t>(py::detail::array_proxy(ws.ptr())->dimensions[0]) * element_size_;
    return n;
  }

  // A new, writable (rows, heads, dim) array of the compute dtype (a plain pool's own).
  py::object empty(Py_intptr_t rows, int heads, int dim) const {
    auto& api = py::detail::npy_api::get();
    const Py_intptr_t dims[3] = {rows, heads, dim};
    Py_INCREF(compute_dtype_.ptr());
    PyObject* arr = api.PyArray_NewFromDescr_(api.PyArray_Type_, compute_dtype_.ptr(), 3, dims, nullptr, nullptr, 0,
                                              nullptr);
    if (arr == nullptr) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(arr);
  }

 private:
  static void* allocate_block(void* context, std::size_t bytes) noexcept {
    auto* self = static_cast<NumpyBlocks*>(context);
    void* block = std::malloc(bytes == 0 ? 1 : bytes);
    if (block == nullptr) return nullptr;
    PyObject* capsule = PyCapsule_New(block, self->capsule_name_, [](PyObject* cap) {
      std::free(PyCapsule_GetPointer(cap, PyCapsule_GetName(cap)));
    });
    if (capsule == nullptr) {
      PyErr_Clear();
      std::free(block);
      return nullptr;
    }
    try {
      self->owners_.emplace(block, py::reinterpret_steal<py::object>(capsule));
    } catch (...) {
      Py_DECREF(capsule);  // frees the block
      return nullptr;
    }
    return block;
  }

  static void release_block(void* context, void* block) noexcept {
    // Drops the pool's reference; views keep theirs until numpy lets them go.
    static_cast<NumpyBlocks*>(context)->owners_.erase(block);
  }

  std::unordered_map<void*, py::object> owners_;
  py::object workspace_[2];
  py::dtype dtype_;
  py::dtype compute_dtype_;
  kvcore::DType compute_type_ = kvcore::DType::Float32;
  kvcore::DType element_type_ = kvcore::DType::Float32;
  std::size_t element_size_ = 0;
  const char* capsule_name_;
  const char* pool_;
};

}  // namespace kvcore_py
