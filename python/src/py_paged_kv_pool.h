// PagedKVPool at the Python boundary (paged_kv_pool*.cpp): PyPagedPool, the
// C++ pool plus what numpy needs to see its rows.
//
// As KVPool (py_kv_pool.h): every storage block the pool allocates is owned by a
// capsule; the pool holds one reference and each zero-copy view holds another
// (as its numpy base), so a view never points at freed memory, even after the
// pool grows or dies. update() is the per-layer hot path: it talks to numpy
// through its C API (no shape vectors, no Python-level calls), and mask()
// builds one read-only mask per group and step, shared by the group's layers.
#pragma once

#include <pybind11/numpy.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "batch_step_handle.h"
#include "bindings.h"
#include "errors.h"
#include "int_args.h"
#include "kvcore/batch/batch_cache.h"
#include "kvcore/pool/paged_kv_pool.h"
#include "numpy_blocks.h"
#include "numpy_dtype.h"
#include "plan_mask.h"
#include "pool_binding.h"
#include "prefix_namespace.h"
#include "record_io.h"
#include "state_tensors.h"
#include "kvcore/state/sequence_export.h"
#include "kvcore/state/sequence_import.h"

namespace kvcore_py {

namespace npy = py::detail;

constexpr const char* kPagedBlockName = "kvcore.paged_pool_block";

using CachePtr = std::shared_ptr<kvcore::BatchCache>;

// Each layer's kind, for StateTensors::parse.
inline std::vector<kvcore::LayerPolicy::Kind> kinds_of(const kvcore::BatchCache& cache) {
  std::vector<kvcore::LayerPolicy::Kind> kinds;
  for (int l = 0; l < cache.n_layers(); ++l) kinds.push_back(unwrap(cache.layer_config(l)).policy.kind);
  return kinds;
}

class PyPagedPool : public PoolBinding<kvcore::PagedKVPool, kvcore::BatchCache> {
 public:
  PyPagedPool(CachePtr cache, py::handle dtype_spec, int initial_rows, py::handle compute_spec,
              const StateTensors& states)
      : PoolBinding(std::move(cache), dtype_spec, kPagedBlockName, "paged pool",
                    [initial_rows, &states](const kvcore::BatchCache& c, kvcore::DType type, kvcore::PoolAllocator a) {
                      return kvcore::PagedKVPool::create(c, type, a, initial_rows, states.slot_bytes());
                    },
                    compute_spec),
        states_(states) {
    masks_.resize(static_cast<std::size_t>(cache_->n_groups()));
  }

  const StateTensors& states() const { return states_; }

  // The plan of `step`, which must be this cache's begun step.
  kvcore::BatchStepPlan plan_of(const BatchStepHandle& h) const {
    if (h.cache.get() != cache_.get())
      raise(kvcore::Error::InvalidState, "the step belongs to another BatchCache than the pool's");
    return unwrap(cache_->plan(h.step));  // InvalidState: not the begun step
  }

  // (k_rows, v_rows) after writing the step's rows of `layer`.
  py::tuple update(int layer, const kvcore::BatchStepPlan& plan, py::handle k, py::handle v) {
    throw_if_error(pool_->check_writes_rows(layer, "update"));  // a Shared or State layer, by name
    const Input in = checked_input(layer, k, v, "n_tokens", plan.n_tokens, "head_dim", "value_dim");
    if (quantized()) {
      throw_if_error(pool_->update_values(layer, plan, blocks_.compute_type(), in.k, in.k_bytes, in.v, in.v_bytes));
    } else {
      throw_if_error(pool_->update(layer, plan, in.k, in.k_bytes, in.v, in.v_bytes));
    }
    return rows(layer);
  }

  // (k_rows, v_rows): read-only views of the layer's live rows (a quantized
  // pool's dequantized into the workspace, which the next read reuses).
  py::tuple rows(int layer) {
    const kvcore::PagedRows live = unwrap(pool_->rows(layer));
    py::object k, v;
    if (quantized()) {
      const Output out = values_out(layer, live.rows);
      unwrap(pool_->rows_values(layer, blocks_.compute_type(), blocks_.data_of(out.k), out.k_bytes,
                                blocks_.data_of(out.v), out.v_bytes));
      return py::reinterpret_steal<py::tuple>(PyTuple_Pack(2, out.k.ptr(), out.v.ptr()));
    }
    std::tie(k, v) = views(layer, live.k, live.k, live.v, live.v, live.rows);
    return py::reinterpret_steal<py::tuple>(PyTuple_Pack(2, k.ptr(), v.ptr()));
  }

  // The raw quantized live rows with their scales and zero points (raw_views).
  py::dict rows_quantized(int layer) const {
    if (!quantized())
      raise(kvcore::Error::InvalidArgument, "rows_quantized: the paged pool stores " +
                                                py::str(dtype()).cast<std::string>() +
                                                ", not a quantized format ('qint8', 'fp8_e4m3'): use rows");
    const kvcore::PagedRows live = unwrap(pool_->rows(layer));
    return raw_views(layer, live.k, live.k, live.v, live.v, live.rows);
  }

  // (k, v, positions) of one entry's visible history: new arrays.
  py::tuple gather(int layer, const kvcore::BatchStepPlan& plan, int entry) const {
    const int n = unwrap(pool_->gather_rows(layer, plan, entry));
    const Output out = empty(layer, n);
    py::array_t<std::int64_t> positions(n);
    if (quantized()) {
      unwrap(pool_->gather_values(layer, plan, entry, blocks_.compute_type(), blocks_.data_of(out.k), out.k_bytes,
                                  blocks_.data_of(out.v), out.v_bytes, positions.mutable_data(),
                                  static_cast<std::size_t>(n)));
    } else {
      unwrap(pool_->gather(layer, plan, entry, blocks_.data_of(out.k), out.k_bytes, blocks_.data_of(out.v),
                           out.v_bytes, positions.mutable_data(), static_cast<std::size_t>(n)));
    }
    const py::object& k = out.k;
    const py::object& v = out.v;
    return py::reinterpret_steal<py::tuple>(PyTuple_Pack(3, k.ptr(), v.ptr(), positions.ptr()));
  }

  // The (n_tokens, used_blocks * B) mask of `group` for the begun step, built
  // once per group and step.
  py::object mask(const BatchStepHandle& h, const kvcore::BatchStepPlan& plan, int group) {
    // A bad group raises here, before masks_ is indexed.
    throw_if_error(kvcore::internal::to_status(cache_->group_policy(group)));
    CachedMask& cached = masks_[static_cast<std::size_t>(group)];
    if (cached.step_id == h.step.id && cached.array) return cached.array;
    py::array out = plan_mask(*cache_, plan, group, std::nullopt, /*shared=*/true);
    cached.step_id = h.step.id;
    cached.array = out;
    return std::move(out);
  }

  // Performs a tree commit's copies: one (n, 2) int array per group, then
  // one per State group (as cache.commit(step, accepted) returns them).
  void apply_copies(const py::handle& copies) {
    const int n_groups = cache_->n_groups(), n_states = cache_->n_state_groups();
    const py::sequence per_group = py::reinterpret_borrow<py::sequence>(copies);
    if (!py::isinstance<py::sequence>(copies) || static_cast<int>(py::len(per_group)) != n_groups + n_states)
      raise(kvcore::Error::InvalidArgument,
            "apply_copies: copies must hold one (n, 2) array per group (" + std::to_string(n_groups) +
                ") and per State group (" + std::to_string(n_states) + "), as cache.commit(step, accepted) returns");
    std::vector<std::vector<kvcore::TreeCopy>> rows(static_cast<std::size_t>(n_groups + n_states));
    std::vector<kvcore::GroupCommit> groups(rows.size());
    for (std::size_t g = 0; g < rows.size(); ++g) {
      const bool state = static_cast<int>(g) >= n_groups;
      const std::string name = "copies[" + std::to_string(g) + "]";
      const IntArray pairs("apply_copies", name.c_str(), per_group[g], false, /*columns=*/2);
      for (py::ssize_t c = 0; c < pairs.rows(); ++c) {
        const std::int64_t src = pairs[2 * c], dst = pairs[2 * c + 1];
        if (src < 0 || dst < 0 || src > 0x7fffffff || dst > 0x7fffffff)
          raise(kvcore::Error::InvalidArgument,
                "apply_copies: " +
                    (state ? "State group " + std::to_string(static_cast<int>(g) - n_groups) : "group " + std::to_string(g)) +
                    "'s copy " + std::to_string(c) + " names a " + (state ? "slot" : "row") + " outside [0, 2^31)");
        rows[g].push_back(kvcore::TreeCopy{static_cast<int>(src), static_cast<int>(dst)});
      }
      groups[g] = kvcore::GroupCommit{rows[g].data(), static_cast<int>(rows[g].size())};
    }
    throw_if_error(pool_->apply_copies(
        kvcore::BatchCommit{n_groups, groups.data(), n_states, n_states > 0 ? groups.data() + n_groups : nullptr}));
  }

  // Writes the states the step keeps for its tokens (or entry `entry`'s) on
  // State layer `layer`, packed into slots once every entry is checked.
  void write_state(int layer, const kvcore::BatchStepPlan& plan, py::handle states, py::handle entry) {
    throw_if_error(pool_->check_state_layer(layer, "write_state"));
    kvcore::PagedKVPool::StepTokens tokens{0, plan.n_tokens};
    if (!entry.is_none())
      tokens = unwrap(kvcore::PagedKVPool::entry_tokens(plan, to_int("entry", py::cast<PyInt>(entry))));
    const int kept = unwrap(pool_->kept_states(layer, plan, tokens));
    states_.pack("write_state", layer, states, kept, &staging_);
    throw_if_error(pool_->write_state(layer, plan, tokens, staging_.data(), staging_.size()));
  }

  // The state token `token` of the step starts from on State layer `layer` (a copy).
  py::dict read_state(int layer, const kvcore::BatchStepPlan& plan, int token) {
    throw_if_error(pool_->check_state_layer(layer, "read_state"));
    staging_.assign(states_.slot_bytes(layer), 0);
    throw_if_error(pool_->read_state(layer, plan, token, staging_.data(), staging_.size()));
    return states_.unpack(layer, staging_.data());
  }

  // Read-only zero-copy (num_slots, *shape) view of tensor `name` in every slot of State layer `layer`.
  py::object state_slots(int layer, const std::string& name) const {
    throw_if_error(pool_->check_state_layer(layer, "state_slots"));
    const kvcore::PagedLayer shape = unwrap(pool_->layer(layer));
    return states_.slots_view(blocks_, layer, name, shape.k, shape.rows, shape.k_row_bytes);
  }

  // Bytes of the rows of blocks some sequence holds, K and V of every layer
  // (a Shared layer's none; each layer its own group's blocks of the one
  // pool), and every State layer's slots.
  std::size_t nbytes() const {
    std::size_t n = 0;
    for (int l = 0; l < pool_->n_layers(); ++l) {
      const kvcore::PagedLayer shape = unwrap(pool_->layer(l));
      if (shape.policy.kind == kvcore::LayerPolicy::Kind::Shared) continue;
      if (shape.policy.kind == kvcore::LayerPolicy::Kind::State) {
        n += shape.k_row_bytes * static_cast<std::size_t>(shape.rows);
        continue;
      }
      const int held = unwrap(cache_->held_blocks(shape.group));
      n += (shape.k_row_bytes + shape.v_row_bytes) * static_cast<std::size_t>(held) *
           static_cast<std::size_t>(pool_->block_size());
    }
    return n;
  }

 private:
  struct CachedMask {
    std::uint64_t step_id = 0;
    py::object array;
  };

  std::vector<CachedMask> masks_;  // per group: the mask of the last step asked for
  StateTensors states_;            // each State layer's named tensors in a slot
  std::vector<unsigned char> staging_;  // a step's states packed, or one state read
};

// import_sequence(seq, record, written=True): the import, and the (group,
// index, block) rows of the blocks it wrote. The array is sized before the
// import (a table row of every group at most: no second parse and checksum
// of the record), so the report allocates nothing while the import runs.
inline py::array_t<std::int32_t> import_reporting(PyPagedPool& p, int seq, const RecordBytes& r,
                                           const kvcore::RecordTrust& trust) {
  const py::ssize_t most = static_cast<py::ssize_t>(p.cache()->table_stride()) * p.cache()->n_groups();
  py::array_t<std::int32_t> out({most, static_cast<py::ssize_t>(3)});
  std::int32_t* rows = out.mutable_data();
  py::ssize_t n = 0;
  throw_if_error(kvcore::import_record(r.data, r.size, *p.cache(), p.pool(), seq, trust, [&](int g, int i, int block) {
    if (n < most) {
      rows[3 * n] = g;
      rows[3 * n + 1] = i;
      rows[3 * n + 2] = block;
    }
    ++n;
  }));
  if (n > most) n = most;  // never: admit writes each kept block once
  py::array_t<std::int32_t> exact({n, static_cast<py::ssize_t>(3)});
  if (n > 0) std::memcpy(exact.mutable_data(), rows, static_cast<std::size_t>(n) * 3 * sizeof(std::int32_t));
  return exact;
}

/// PagedKVPool's state slots (paged_kv_pool_states.cpp) and records (paged_kv_pool_records.cpp).
void bind_paged_kv_pool_states(py::class_<PyPagedPool>& cls);
void bind_paged_kv_pool_records(py::class_<PyPagedPool>& cls);

}  // namespace kvcore_py
