// KVPool at the Python boundary (kv_pool*.cpp, step_mask.cpp): PyPool, the C++
// pool plus what numpy needs to see its rows.
//
// Every storage block the pool allocates is owned by a capsule; the pool holds
// one reference and each zero-copy view holds another (as its numpy base), so a
// view never points at freed memory, even after the pool grows or dies.
// update() is the per-layer hot path: it talks to numpy through its C API
// (no shape vectors, no Python-level calls) and shares one read-only positions
// array between the layers of a policy within a step.
#pragma once

#include <pybind11/numpy.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bindings.h"
#include "frozen_array.h"
#include "errors.h"
#include "kvcore/pool/kv_pool.h"
#include "kvcore/pool/kv_pool_tree.h"
#include "kvcore/core/sequence_cache.h"
#include "numpy_blocks.h"
#include "numpy_dtype.h"
#include "pool_binding.h"
#include "record_io.h"
#include "kvcore/state/sequence_export.h"
#include "kvcore/state/sequence_import.h"
#include "state_tensors.h"
#include "step_handle.h"
#include "tree_binding.h"

namespace kvcore_py {

namespace npy = py::detail;

constexpr const char* kBlockName = "kvcore.pool_block";

// The order a read returns rows in: the rows as they lie (one view, masked by
// positions; the default) or increasing positions (the plan's read runs).
enum class ReadOrder { Rows, Positions };

inline ReadOrder parse_order(const std::string& order) {
  if (order == "rows") return ReadOrder::Rows;
  if (order == "positions") return ReadOrder::Positions;
  raise(kvcore::Error::InvalidArgument,
        "order = '" + order + "': must be 'rows' (the held rows as they lie) or 'positions'");
}

// A read row's position: a tree step's rows at chain positions >= P hold
// nodes, whose positions are length + depth.
inline std::int64_t node_position(const kvcore::DraftTree* tree, std::int64_t p) {
  if (tree == nullptr || p < tree->position()) return p;
  return tree->positions()[tree->nodes_at()[p - tree->position()]];
}

// positions[r] = geometry.position_at(r, end) for r < rows, read-only;
// `tree` (the begun tree, or null) maps a tree step's chain positions to its nodes' positions.
inline py::array row_positions(const kvcore::LayerGeometry& geometry, int rows, int end, const kvcore::DraftTree* tree) {
  FrozenArray<std::int64_t> out({rows});
  for (int r = 0; r < rows; ++r) out.data[r] = node_position(tree, geometry.position_at(r, end));
  return out.array;
}

inline kvcore::RingStorage ring_storage(bool mirror_rings) {
  return mirror_rings ? kvcore::RingStorage::Mirrored : kvcore::RingStorage::Compact;
}

// A Python KVPool: the C++ pool plus what numpy needs to see its rows.
class PyPool : public PoolBinding<kvcore::KVPool, kvcore::SequenceCache> {
 public:
  PyPool(std::shared_ptr<kvcore::SequenceCache> cache, py::handle dtype_spec, bool mirror_rings,
         py::handle compute_spec, const StateTensors& states)
      : PoolBinding(std::move(cache), dtype_spec, kBlockName, "pool",
                    [mirror_rings, &states](const kvcore::SequenceCache& c, kvcore::DType type, kvcore::PoolAllocator a) {
                      return kvcore::KVPool::create(c, type, a, ring_storage(mirror_rings), states.slot_bytes());
                    },
                    compute_spec),
        mirror_rings_(mirror_rings),
        states_(states) {
    positions_.resize(static_cast<std::size_t>(cache_->n_groups()));
    row_positions_.resize(static_cast<std::size_t>(cache_->n_groups()));
    tree_writes_.resize(static_cast<std::size_t>(cache_->n_layers()));
  }

  bool mirror_rings() const { return mirror_rings_; }
  const StateTensors& states() const { return states_; }

  // The plan must be `layer`'s plan of the begun step: anything else is stale.
  void check_current_plan(int layer, const kvcore::SeqStepPlan& plan) const {
    const kvcore::Step& active = cache_->active_step();
    if (active.id == 0)
      raise(kvcore::Error::InvalidState, "plan of layer " + std::to_string(layer) +
                                             ": no step is begun (stale plan)");
    if (!(unwrap(cache_->plan(layer, active)) == plan))
      raise(kvcore::Error::InvalidState,
            "plan is not layer " + std::to_string(layer) + "'s plan of the begun step (position " +
                std::to_string(active.position) + ", T " + std::to_string(active.T) + ")");
  }

  // A tree step's input row i is node i (written to its chain index's row).
  void write(int layer, const kvcore::SeqStepPlan& plan, py::handle k, py::handle v) {
    throw_if_error(pool_->check_writes_rows(layer, "write"));  // a Shared or State layer: by name, first
    const Input in = checked_input(layer, k, v, "T", plan.write_len(), "dim", "dim");
    kvcore::SeqStepPlan& written = tree_writes(layer);
    if (const kvcore::DraftTree* tree = active_tree()) {
      if (quantized()) {
        const Staged staged = quantize_nodes(layer, in, tree->size());
        throw_if_error(kvcore::write_tree(*pool_, layer, plan, *tree, staged.k, staged.k_bytes, staged.v, staged.v_bytes));
      } else {
        throw_if_error(kvcore::write_tree(*pool_, layer, plan, *tree, in.k, in.k_bytes, in.v, in.v_bytes));
      }
      written = plan;
      return;
    }
    if (quantized()) {
      throw_if_error(pool_->write_values(layer, plan, blocks_.compute_type(), in.k, in.k_bytes, in.v, in.v_bytes));
    } else {
      throw_if_error(pool_->write(layer, plan, in.k, in.k_bytes, in.v, in.v_bytes));
    }
    written = kvcore::SeqStepPlan{};  // no tree rows to copy from now on
  }

  // Writes the states of `step` on State layer `layer`: states[name] (n,
  // *shape), n the plan's write_len (a tree step's: node i's state after its
  // token), packed into slots once every entry is checked.
  void write_state(int layer, const StepHandle& h, py::handle states) {
    throw_if_error(pool_->check_state_layer(layer, "write_state"));
    const kvcore::SeqStepPlan plan = unwrap(h.cache->plan(layer, h.step));
    states_.pack("write_state", layer, states, plan.write_len(), &staging_);
    kvcore::SeqStepPlan& written = tree_writes(layer);
    if (const kvcore::DraftTree* tree = active_tree()) {
      throw_if_error(kvcore::write_state_tree(*pool_, layer, plan, *tree, staging_.data(), staging_.size()));
      written = plan;
    } else {
      throw_if_error(pool_->write_state(layer, plan, staging_.data(), staging_.size()));
      written = kvcore::SeqStepPlan{};
    }
  }

  // The state `step` (or its tree node `node`) starts from on State layer `layer`.
  py::dict read_state(int layer, const StepHandle& h, py::handle node) {
    throw_if_error(pool_->check_state_layer(layer, "read_state"));
    const kvcore::SeqStepPlan plan = unwrap(h.cache->plan(layer, h.step));
    if (node.is_none()) {
      std::vector<unsigned char>& slot = staging_;
      slot.assign(states_.slot_bytes(layer), 0);
      throw_if_error(pool_->read_state(layer, plan, slot.data(), slot.size()));
      return states_.unpack(layer, slot.data());
    }
    const int i = to_int("node", py::cast<PyInt>(node));
    const kvcore::DraftTree* tree = active_tree();
    if (tree == nullptr)
      raise(kvcore::Error::InvalidArgument, "read_state of layer " + std::to_string(layer) + ": node = " +
                                                std::to_string(i) + ", but the step is not a tree step (begin_tree)");
    const int slot = unwrap(kvcore::node_read_slot(*pool_, layer, plan, *tree, i));
    return states_.unpack(layer, slot < 0 ? nullptr : unwrap(pool_->state_slot(layer, slot)));
  }

  // Read-only (D, *shape) view of tensor `name` in every slot of State layer `layer`.
  py::object state_slots(int layer, const std::string& name) const {
    throw_if_error(pool_->check_state_layer(layer, "state_slots"));
    const kvcore::PoolLayer shape = unwrap(pool_->layer(layer));
    return states_.slots_view(blocks_, layer, name, shape.k, shape.rows, shape.k_row_bytes);
  }

  // Performs a commit's copies: `copies` has one (n, 2) [src, dst] int array per
  // layer (SequenceCache.commit's answer). Every layer is checked before any copies.
  void apply_copies(py::handle copies) {
    py::sequence seq = py::reinterpret_borrow<py::sequence>(copies);
    if (!py::isinstance<py::sequence>(copies) || static_cast<int>(py::len(seq)) != pool_->n_layers())
      raise(kvcore::Error::InvalidArgument,
            "apply_copies: copies must be a list of one (n, 2) int array per layer (" +
                std::to_string(pool_->n_layers()) + " layers)");
    std::vector<std::vector<kvcore::TreeCopy>> all(static_cast<std::size_t>(pool_->n_layers()));
    for (int l = 0; l < pool_->n_layers(); ++l) {
      const std::string name = "copies[" + std::to_string(l) + "]";
      const IntArray a("apply_copies", name.c_str(), seq[static_cast<std::size_t>(l)], false, /*columns=*/2);
      std::vector<kvcore::TreeCopy>& out = all[static_cast<std::size_t>(l)];
      for (py::ssize_t i = 0; i < a.rows(); ++i) out.push_back(kvcore::TreeCopy{a.at(2 * i), a.at(2 * i + 1)});
      throw_if_error(kvcore::check_copies(*pool_, l, out.data(), static_cast<int>(out.size())));
      check_tree_rows(l, out);
    }
    for (int l = 0; l < pool_->n_layers(); ++l) {
      const std::vector<kvcore::TreeCopy>& c = all[static_cast<std::size_t>(l)];
      throw_if_error(kvcore::copy_rows(*pool_, l, c.data(), static_cast<int>(c.size())));
      if (!c.empty()) tree_writes_[static_cast<std::size_t>(l)] = kvcore::SeqStepPlan{};  // copied once
    }
  }

  // InvalidStateError unless every copy's rows are rows the layer's last tree
  // step wrote (a commit moves accepted nodes within them): other rows hold
  // committed history or nothing.
  void check_tree_rows(int layer, const std::vector<kvcore::TreeCopy>& copies) const {
    const kvcore::SeqStepPlan& written = tree_writes_[static_cast<std::size_t>(layer)];
    auto wrote = [&](int row) {
      for (int i = 0; i < written.n_write; ++i)
        if (row >= written.write[i].row && row < written.write[i].row + written.write[i].len) return true;
      return false;
    };
    for (std::size_t c = 0; c < copies.size(); ++c)
      for (const int row : {copies[c].src, copies[c].dst})
        if (!wrote(row))
          raise(kvcore::Error::InvalidState,
                "apply_copies: copies[" + std::to_string(layer) + "][" + std::to_string(c) + "] names row " +
                    std::to_string(row) + ", which the layer's last tree step did not write (" +
                    (written.n_write == 0 ? std::string("no tree step was written since the last copies")
                                          : std::to_string(written.write_len()) + " rows written") +
                    "): copies come from commit(step, accepted) after writing that step");
  }

  // Quantized rows of a tree step's `n` nodes, each quantized on its own into
  // the staging rows (grown once to the largest step; write_tree then places them).
  struct Staged {
    const unsigned char* k;
    std::size_t k_bytes;
    const unsigned char* v;
    std::size_t v_bytes;
  };
  Staged quantize_nodes(int layer, const Input& in, int n) {
    const kvcore::PoolLayer shape = unwrap(pool_->layer(layer));
    const kvcore::DType type = blocks_.compute_type();
    throw_if_error(kvcore::check_quantizable("write", "k", layer, type, in.k, n, shape.n_kv_heads, shape.head_dim));
    throw_if_error(kvcore::check_quantizable("write", "v", layer, type, in.v, n, shape.n_kv_heads, shape.value_dim));
    const std::size_t k_bytes = shape.k_row_bytes * static_cast<std::size_t>(n);
    const std::size_t v_bytes = shape.v_row_bytes * static_cast<std::size_t>(n);
    if (staging_.size() < k_bytes + v_bytes) staging_.resize(k_bytes + v_bytes);
    unsigned char* k = staging_.data();
    unsigned char* v = staging_.data() + k_bytes;
    const std::size_t k_in = kvcore::PoolBytes::value_row_bytes(shape.n_kv_heads, shape.head_dim, type);
    const std::size_t v_in = kvcore::PoolBytes::value_row_bytes(shape.n_kv_heads, shape.value_dim, type);
    for (int i = 0; i < n; ++i) {
      const std::size_t r = static_cast<std::size_t>(i);
      kvcore::quantize_row(pool_->dtype(), shape.n_kv_heads, shape.head_dim, type,
                           reinterpret_cast<const unsigned char*>(in.k) + k_in * r, k + shape.k_row_bytes * r);
      kvcore::quantize_row(pool_->dtype(), shape.n_kv_heads, shape.value_dim, type,
                           reinterpret_cast<const unsigned char*>(in.v) + v_in * r, v + shape.v_row_bytes * r);
    }
    return Staged{k, k_bytes, v, v_bytes};
  }

  // The raw quantized rows of `plan`'s step in row order (held_rows) with
  // their scales and zero points (raw_views), and their positions.
  py::dict read_quantized(int layer, const kvcore::SeqStepPlan& plan, std::uint64_t step_id) {
    if (!quantized())
      raise(kvcore::Error::InvalidArgument, "read_quantized: the pool stores " +
                                                py::str(dtype()).cast<std::string>() +
                                                ", not a quantized format ('qint8', 'fp8_e4m3'): use read");
    const kvcore::HeldRows held = unwrap(pool_->held_rows(layer, plan));
    py::dict out = raw_views(layer, held.k, held.k, held.v, held.v, held.rows);
    out["positions"] = row_positions_of(layer, held, step_id);
    return out;
  }

  // (k, v, positions): a zero-copy view when the read is one span (one run, or
  // a wrapped window of a mirrored ring), else a copy. A quantized pool's k, v
  // are the read's rows dequantized into the workspace (the next read reuses it).
  py::tuple read(int layer, const kvcore::SeqStepPlan& plan, std::uint64_t step_id) {
    const Py_intptr_t rows = plan.read_len();
    py::object k, v;
    if (quantized()) {
      const Output out = values_out(layer, rows);
      throw_if_error(pool_->gather_values(layer, plan, blocks_.compute_type(), blocks_.data_of(out.k), out.k_bytes,
                                          blocks_.data_of(out.v), out.v_bytes));
      py::object positions = positions_of(layer, plan, step_id);
      return py::reinterpret_steal<py::tuple>(PyTuple_Pack(3, out.k.ptr(), out.v.ptr(), positions.ptr()));
    }
    const kvcore::KVViews views = unwrap(pool_->views(layer, plan));
    if (views.n == 1) {
      const kvcore::PoolLayer shape = unwrap(pool_->layer(cache_->row_layer(layer)));  // a Shared layer's: its source's
      std::tie(k, v) = this->views(layer, shape.k, views.span[0].k, shape.v, views.span[0].v, rows);
    } else {
      const Output out = empty(layer, rows);
      throw_if_error(pool_->gather(layer, plan, blocks_.data_of(out.k), out.k_bytes, blocks_.data_of(out.v),
                                   out.v_bytes));
      k = out.k;
      v = out.v;
    }
    py::object positions = positions_of(layer, plan, step_id);
    return py::reinterpret_steal<py::tuple>(PyTuple_Pack(3, k.ptr(), v.ptr(), positions.ptr()));
  }

  // (k, v, positions) in row order: always a zero-copy view of the rows that
  // hold positions (KVPool::held_rows), positions[r] the one row r stands for.
  py::tuple read_rows(int layer, const kvcore::SeqStepPlan& plan, std::uint64_t step_id) {
    const kvcore::HeldRows held = unwrap(pool_->held_rows(layer, plan));
    py::object k, v;
    if (quantized()) {
      const Output out = values_out(layer, held.rows);
      unwrap(pool_->held_values(layer, plan, blocks_.compute_type(), blocks_.data_of(out.k), out.k_bytes,
                                blocks_.data_of(out.v), out.v_bytes));
      k = out.k;
      v = out.v;
    } else {
      std::tie(k, v) = views(layer, held.k, held.k, held.v, held.v, held.rows);
    }
    py::object positions = row_positions_of(layer, held, step_id);
    return py::reinterpret_steal<py::tuple>(PyTuple_Pack(3, k.ptr(), v.ptr(), positions.ptr()));
  }

  py::tuple read_in(ReadOrder order, int layer, const kvcore::SeqStepPlan& plan, std::uint64_t step_id) {
    return order == ReadOrder::Rows ? read_rows(layer, plan, step_id) : read(layer, plan, step_id);
  }

 private:
  // The write runs of `layer`'s last tree step, forgotten when a new step begins
  // (an abandoned tree step's rows name nothing then).
  kvcore::SeqStepPlan& tree_writes(int layer) {
    const std::uint64_t step_id = cache_->active_step().id;
    if (step_id != tree_writes_step_) {
      for (kvcore::SeqStepPlan& runs : tree_writes_) runs = kvcore::SeqStepPlan{};
      tree_writes_step_ = step_id;
    }
    return tree_writes_[static_cast<std::size_t>(layer)];
  }

  // The begun step's tree, or null when none (or a chain step) is begun.
  const kvcore::DraftTree* active_tree() const {
    const kvcore::Step& active = cache_->active_step();
    return active.tree ? unwrap(cache_->tree(active)) : nullptr;
  }

  // Positions of one policy's reads for one step (shared, read-only).
  struct CachedPositions {
    std::uint64_t step_id = 0;
    py::object array;
  };

  py::object row_positions_of(int layer, const kvcore::HeldRows& held, std::uint64_t step_id) {
    CachedPositions& cached =
        row_positions_[static_cast<std::size_t>(cache_->group_of(layer))];
    if (cached.step_id == step_id && step_id != 0) return cached.array;
    const kvcore::LayerGeometry& geometry = cache_->policy(cache_->row_layer(layer)).geometry();  // the rows it reads
    py::array out = row_positions(geometry, held.rows, held.end, active_tree());
    cached.step_id = step_id;
    cached.array = out;
    return std::move(out);
  }

  py::object positions_of(int layer, const kvcore::SeqStepPlan& plan, std::uint64_t step_id) {
    CachedPositions& cached =
        positions_[static_cast<std::size_t>(cache_->group_of(layer))];
    if (cached.step_id == step_id && step_id != 0) return cached.array;
    FrozenArray<std::int64_t> out({plan.read_len()});
    std::int64_t* at = out.data;
    const kvcore::DraftTree* tree = active_tree();
    for (int i = 0; i < plan.n_read; ++i)
      for (int j = 0; j < plan.read[i].len; ++j) *at++ = node_position(tree, plan.read[i].pos + j);
    cached.step_id = step_id;
    cached.array = out.array;
    return out.array;
  }

  bool mirror_rings_ = false;
  StateTensors states_;                          // each State layer's named tensors in a slot
  std::vector<unsigned char> staging_;          // a quantized tree step's rows before write_tree places them; states
  std::vector<CachedPositions> positions_;      // per policy: position-order reads
  std::vector<CachedPositions> row_positions_;  // per policy: row-order reads
  std::vector<kvcore::SeqStepPlan> tree_writes_;  // per layer: the write runs of its last tree step, until copied
  std::uint64_t tree_writes_step_ = 0;             // the step tree_writes_ belong to
};

// ", state_bytes=N" (every State layer's slots; in reserved_bytes too), or "" without State layers.
inline std::string state_bytes(const PyPool& p) {
  std::size_t n = 0;
  bool any = false;
  for (int l = 0; l < p.pool().n_layers(); ++l) {
    const kvcore::PoolLayer layer = unwrap(p.pool().layer(l));
    if (layer.policy.kind != kvcore::LayerPolicy::Kind::State) continue;
    any = true;
    n += layer.k_row_bytes * static_cast<std::size_t>(layer.rows);
  }
  return any ? ", state_bytes=" + std::to_string(n) : std::string();
}

inline const StepHandle& checked_step(const PyPool& p, const StepHandle& h) {
  if (h.cache.get() != p.cache().get())
    raise(kvcore::Error::InvalidState, "the step belongs to another cache than the pool's");
  throw_if_error(h.cache->check_step(h.step));
  return h;
}

/// KVPool's rows (kv_pool_rows.cpp), state slots (kv_pool_states.cpp) and records (kv_pool_records.cpp).
void bind_kv_pool_rows(py::class_<PyPool>& cls);
void bind_kv_pool_states(py::class_<PyPool>& cls);
void bind_kv_pool_records(py::class_<PyPool>& cls);

}  // namespace kvcore_py
