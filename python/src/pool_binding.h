// PoolBinding: what both Python byte layers hold (KVPool in py_kv_pool.h,
// PagedKVPool in py_paged_kv_pool.h): the C++ pool over its cache, the numpy
// blocks it allocates through (NumpyBlocks), each layer's row shape, and the
// checks every call starts with (the layer, the k/v inputs); def_storage()
// registers the Python calls both classes share.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "errors.h"
#include "kvcore/core/config.h"
#include "kvcore/pool/quantize.h"
#include "numpy_blocks.h"

namespace kvcore_py {

template <typename Pool, typename Cache>
class PoolBinding {
 public:
  PoolBinding(const PoolBinding&) = delete;
  PoolBinding& operator=(const PoolBinding&) = delete;

  const std::shared_ptr<Cache>& cache() const { return cache_; }
  // The storage format: a numpy dtype, or the name of a quantized format.
  py::object dtype() const {
    if (blocks_.quantized()) return py::str(kvcore::to_string(blocks_.element_type()));
    return blocks_.dtype();
  }
  // The dtype values go in and come out as (a plain pool's own dtype).
  const py::dtype& compute_dtype() const { return blocks_.compute_dtype(); }
  bool quantized() const { return blocks_.quantized(); }
  // The spec that rebuilds this pool's storage (its dtype, "qint8", "fp8_e4m3").
  py::object dtype_spec() const { return dtype(); }
  const Pool& pool() const { return *pool_; }
  Pool& pool() { return *pool_; }

  // `layer` as an int; InvalidArgument unless it is one of the pool's layers.
  int checked_layer(const PyInt& layer) const {
    const int l = to_int("layer", layer);
    throw_if_error(kvcore::internal::to_status(pool_->layer(l)));
    return l;
  }

 protected:
  // A layer's row shape: heads x head_dim for K, heads x value_dim for V.
  struct LayerShape {
    int heads;
    int head_dim;
    int value_dim;
  };

  // k and v of one call, checked: their data and byte counts.
  struct Input {
    const char* k;
    std::size_t k_bytes;
    const char* v;
    std::size_t v_bytes;
  };

  // Blocks of the dtype `dtype_spec` names, capsules named `capsule_name`,
  // errors naming `pool_name` ("pool", "paged pool"); the pool is
  // create(cache, element type, allocator), a Result<Pool>.
  template <typename Create>
  PoolBinding(std::shared_ptr<Cache> cache, py::handle dtype_spec, const char* capsule_name,
              const char* pool_name, Create create, py::handle compute_spec = py::none())
      : blocks_(dtype_spec, capsule_name, pool_name, compute_spec), cache_(std::move(cache)) {
    pool_.reset(new Pool(unwrap(create(*cache_, blocks_.element_type(), blocks_.allocator()))));
    for (int l = 0; l < cache_->n_layers(); ++l) {
      const kvcore::LayerConfig lc = unwrap(cache_->layer_config(l));
      layers_.push_back(LayerShape{lc.n_kv_heads, lc.head_dim, lc.value_dim()});
    }
  }

  // The pool releases its blocks through `blocks_`, so it must go first.
  ~PoolBinding() { pool_.reset(); }

  const LayerShape& shape(int layer) const { return layers_[static_cast<std::size_t>(layer)]; }

  // k (rows, n_kv_heads, head_dim) and v (rows, n_kv_heads, value_dim) for
  // `layer`, checked by NumpyBlocks::check_input (InvalidArgument names the
  // rule; `rows_name`, `k_dim` and `v_dim` name the shape's parts).
  Input checked_input(int layer, py::handle k, py::handle v, const char* rows_name, int rows,
                      const char* k_dim, const char* v_dim) const {
    const LayerShape& s = shape(layer);
    const char* k_data = blocks_.check_input("k", k, rows_name, rows, s.heads, k_dim, s.head_dim);
    const char* v_data = blocks_.check_input("v", v, rows_name, rows, s.heads, v_dim, s.value_dim);
    return Input{k_data, blocks_.bytes_of(rows, s.heads, s.head_dim), v_data,
                 blocks_.bytes_of(rows, s.heads, s.value_dim)};
  }

  // Read-only zero-copy (k, v) views of `rows` rows starting at k/v, which
  // lie in the blocks k_block/v_block of `layer` (kept alive by the views).
  std::pair<py::object, py::object> views(int layer, const unsigned char* k_block, const unsigned char* k,
                                          const unsigned char* v_block, const unsigned char* v,
                                          Py_intptr_t rows) const {
    const LayerShape& s = shape(layer);
    return {blocks_.view(k_block, k, rows, s.heads, s.head_dim),
            blocks_.view(v_block, v, rows, s.heads, s.value_dim)};
  }

  struct Output {
    py::object k;
    std::size_t k_bytes;
    py::object v;
    std::size_t v_bytes;
  };

  // Read-only (k, v) workspace views of `rows` rows of `layer`'s values, and
  // their byte counts: where a quantized read is dequantized.
  Output values_out(int layer, Py_intptr_t rows) {
    const LayerShape& s = shape(layer);
    return Output{blocks_.workspace(0, rows, s.heads, s.head_dim), blocks_.bytes_of(rows, s.heads, s.head_dim),
                  blocks_.workspace(1, rows, s.heads, s.value_dim), blocks_.bytes_of(rows, s.heads, s.value_dim)};
  }

  // The raw parts of `rows` quantized rows of `layer` at k/v (in the blocks
  // k_block/v_block), as a dict of read-only views: k and v (values: int8, or
  // uint8 bytes of float8 e4m3fn), k_scales and v_scales (float32, (rows,
  // heads)), k_zero_points and v_zero_points (int8, (rows, heads); None for fp8).
  py::dict raw_views(int layer, const unsigned char* k_block, const unsigned char* k, const unsigned char* v_block,
                     const unsigned char* v, Py_intptr_t rows) const {
    const LayerShape& s = shape(layer);
    const kvcore::DType format = blocks_.element_type();
    const py::dtype values(format == kvcore::DType::QInt8 ? "int8" : "uint8");
    py::dict out;
    const char* names[2][4] = {{"k", "k_scales", "k_zero_points", ""}, {"v", "v_scales", "v_zero_points", ""}};
    for (int which = 0; which < 2; ++which) {
      const int dim = which == 0 ? s.head_dim : s.value_dim;
      const unsigned char* block = which == 0 ? k_block : v_block;
      const unsigned char* at = which == 0 ? k : v;
      const kvcore::QuantRowLayout layout =
          kvcore::QuantRowLayout::of(format, static_cast<std::size_t>(s.heads), static_cast<std::size_t>(dim));
      const Py_intptr_t row = static_cast<Py_intptr_t>(layout.bytes);
      const Py_intptr_t vd[3] = {rows, s.heads, dim}, vs[3] = {row, dim, 1};
      out[names[which][0]] = blocks_.strided_view(block, at, values, 3, vd, vs);
      const Py_intptr_t sd[2] = {rows, s.heads}, ss[2] = {row, 4};
      out[names[which][1]] =
          blocks_.strided_view(block, at + layout.scales, py::dtype("float32"), 2, sd, ss);
      const Py_intptr_t zs[2] = {row, 1};
      out[names[which][2]] = format == kvcore::DType::QInt8
                                 ? blocks_.strided_view(block, at + layout.zeros, py::dtype("int8"), 2, sd, zs)
                                 : py::object(py::none());
    }
    return out;
  }

  // New writable (k, v) arrays of `rows` rows of `layer`, with their byte counts.
  Output empty(int layer, Py_intptr_t rows) const {
    const LayerShape& s = shape(layer);
    return Output{blocks_.empty(rows, s.heads, s.head_dim), blocks_.bytes_of(rows, s.heads, s.head_dim),
                  blocks_.empty(rows, s.heads, s.value_dim), blocks_.bytes_of(rows, s.heads, s.value_dim)};
  }

  // Declared first so it is destroyed last: the pool's release hook erases from it.
  NumpyBlocks blocks_;
  std::shared_ptr<Cache> cache_;
  std::unique_ptr<Pool> pool_;
  std::vector<LayerShape> layers_;
};

// Docstrings of the Python calls both pool classes have, one per call.
struct StorageDocs {
  const char *cache, *dtype, *compute_dtype, *n_layers, *reserved_bytes, *allocated_rows, *reserve;
};

// Registers on `cls` the properties cache, dtype, n_layers, reserved_bytes and
// the methods allocated_rows(layer), reserve(layer, rows) of a PoolBinding.
template <typename Binding>
void def_storage(py::class_<Binding>& cls, const StorageDocs& docs) {
  cls.def_property_readonly("cache", [](const Binding& p) { return p.cache(); }, docs.cache)
      .def_property_readonly("dtype", [](const Binding& p) { return p.dtype(); }, docs.dtype)
      .def_property_readonly("compute_dtype", [](const Binding& p) { return p.compute_dtype(); }, docs.compute_dtype)
      .def_property_readonly("n_layers", [](const Binding& p) { return p.pool().n_layers(); }, docs.n_layers)
      .def_property_readonly(
          "reserved_bytes", [](const Binding& p) { return p.pool().reserved_bytes(); }, docs.reserved_bytes)
      .def(
          "allocated_rows",
          [](const Binding& p, const PyInt& layer) { return p.pool().layer(p.checked_layer(layer))->allocated_rows; },
          py::arg("layer"), docs.allocated_rows)
      .def(
          "reserve",
          [](Binding& p, const PyInt& layer, const PyInt& rows) {
            throw_if_error(p.pool().reserve(p.checked_layer(layer), to_int("rows", rows)));
          },
          py::arg("layer"), py::arg("rows"), docs.reserve);
}

}  // namespace kvcore_py
