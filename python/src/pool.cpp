// Python view of KVPool: numpy arrays in, numpy arrays out, and Step.mask().
//
// Every storage block the pool allocates is owned by a capsule; the pool holds
// one reference and each zero-copy view holds another (as its numpy base), so a
// view never points at freed memory, even after the pool grows or dies.
// update() is the per-layer hot path: it talks to numpy through its C API
// (no shape vectors, no Python-level calls) and shares one read-only positions
// array between the layers of a policy within a step.
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

namespace {

namespace npy = py::detail;

constexpr const char* kBlockName = "kvcore.pool_block";

// The order a read returns rows in: the rows as they lie (one view, masked by
// positions; the default) or increasing positions (the plan's read runs).
enum class ReadOrder { Rows, Positions };

ReadOrder parse_order(const std::string& order) {
  if (order == "rows") return ReadOrder::Rows;
  if (order == "positions") return ReadOrder::Positions;
  raise(kvcore::Error::InvalidArgument,
        "order = '" + order + "': must be 'rows' (the held rows as they lie) or 'positions'");
}

// A read row's position: a tree step's rows at chain positions >= P hold
// nodes, whose positions are length + depth.
std::int64_t node_position(const kvcore::DraftTree* tree, std::int64_t p) {
  if (tree == nullptr || p < tree->position()) return p;
  return tree->positions()[tree->nodes_at()[p - tree->position()]];
}

// positions[r] = geometry.position_at(r, end) for r < rows, read-only;
// `tree` (the begun tree, or null) maps a tree step's chain positions to its nodes' positions.
py::array row_positions(const kvcore::LayerGeometry& geometry, int rows, int end, const kvcore::DraftTree* tree) {
  FrozenArray<std::int64_t> out({rows});
  for (int r = 0; r < rows; ++r) out.data[r] = node_position(tree, geometry.position_at(r, end));
  return out.array;
}

kvcore::RingStorage ring_storage(bool mirror_rings) {
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
    positions_.resize(static_cast<std::size_t>(cache_->n_policies()));
    row_positions_.resize(static_cast<std::size_t>(cache_->n_policies()));
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
        row_positions_[static_cast<std::size_t>(cache_->policy_index(layer))];
    if (cached.step_id == step_id && step_id != 0) return cached.array;
    const kvcore::LayerGeometry& geometry = cache_->policy(cache_->row_layer(layer)).geometry();  // the rows it reads
    py::array out = row_positions(geometry, held.rows, held.end, active_tree());
    cached.step_id = step_id;
    cached.array = out;
    return std::move(out);
  }

  py::object positions_of(int layer, const kvcore::SeqStepPlan& plan, std::uint64_t step_id) {
    CachedPositions& cached =
        positions_[static_cast<std::size_t>(cache_->policy_index(layer))];
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
std::string state_bytes(const PyPool& p) {
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

const StepHandle& checked_step(const PyPool& p, const StepHandle& h) {
  if (h.cache.get() != p.cache().get())
    raise(kvcore::Error::InvalidState, "the step belongs to another cache than the pool's");
  throw_if_error(h.cache->check_step(h.step));
  return h;
}

// mask[i, j]: may the step's query i (position P + i) see the j-th read row?
// Query q sees [0, sinks) and [window_begin(q), q], so each run of a row is at
// most two spans. Layers of one policy share one read-only array per step.
py::object position_order_mask(const StepHandle& h, int l, const kvcore::SeqStepPlan& plan) {
  const kvcore::LayoutPolicy& policy = h.cache->policy(l);
  const int sinks = policy.visibility().sinks, T = h.step.T, R = plan.read_len();  // a Shared layer's: its source's
  FrozenArray<bool> out({T, R});
  bool* row = out.data;
  std::memset(row, 0, static_cast<std::size_t>(T) * static_cast<std::size_t>(R));
  for (int i = 0; i < T; ++i, row += R) {
    const int q = h.step.position + i, begin = policy.window_begin(q);
    bool* cell = row;
    for (int r = 0; r < plan.n_read; ++r) {
      const kvcore::Run& run = plan.read[r];
      const int run_end = run.pos + run.len;
      auto mark = [&](int lo, int hi) {  // positions [lo, hi) within the run
        lo = lo > run.pos ? lo : run.pos;
        hi = hi < run_end ? hi : run_end;
        if (lo < hi) std::memset(cell + (lo - run.pos), 1, static_cast<std::size_t>(hi - lo));
      };
      mark(0, sinks < q + 1 ? sinks : q + 1);
      mark(begin, q + 1);
      cell += run.len;
    }
  }
  return out.array;
}

// mask[i, r]: may query i see the position held row r stands for (row order)?
py::object row_order_mask(const StepHandle& h, int l) {
  const kvcore::LayoutPolicy& policy = h.cache->policy(l);
  const kvcore::LayerGeometry& geometry = h.cache->policy(h.cache->row_layer(l)).geometry();  // the rows it reads
  const int T = h.step.T, end = h.step.end(), rows = geometry.held_rows(end);
  FrozenArray<bool> out({T, rows});
  bool* row = out.data;
  for (int i = 0; i < T; ++i, row += rows) {
    const int q = h.step.position + i;
    for (int r = 0; r < rows; ++r) row[r] = policy.visible(q, geometry.position_at(r, end));
  }
  return out.array;
}

py::object step_mask(StepHandle& h, const PyInt& layer, const std::string& order_name) {
  const ReadOrder order = parse_order(order_name);
  const int l = to_int("layer", layer);
  const kvcore::SeqStepPlan plan = unwrap(h.cache->plan(l, h.step));  // checks layer and step
  if (h.cache->policy(l).policy().kind == kvcore::LayerPolicy::Kind::State)
    raise(kvcore::Error::InvalidArgument, "mask: layer " + std::to_string(l) +
                                              " is a State layer: it has no keys to mask (the step reads "
                                              "the state slot plan.read names)");
  std::vector<py::object>& masks = order == ReadOrder::Rows ? h.row_masks : h.masks;
  const auto index = static_cast<std::size_t>(h.cache->policy_index(l));
  if (masks.empty()) masks.resize(static_cast<std::size_t>(h.cache->n_policies()));
  if (masks[index]) return masks[index];
  py::object out;
  if (h.step.tree)
    out = order == ReadOrder::Rows ? py::object(tree_row_mask(h, l)) : py::object(dense_tree_mask(h, l));
  else
    out = order == ReadOrder::Rows ? row_order_mask(h, l) : position_order_mask(h, l, plan);
  masks[index] = out;
  return out;
}

}  // namespace

void register_pool(py::module_& m) {
  py::class_<PyPool> cls(m, "KVPool",
                         "Reference CPU storage for a SequenceCache's K/V rows and state slots: applies plans.\n\n"
                         "A Shared layer stores nothing (read gives its source's rows); a State layer keeps "
                         "its D state slots of the named tensors state_tensors gives (read_state, write_state, "
                         "state_slots).\n\n"
                         "dtype: float32, float16, bfloat16 (from ml_dtypes; \"bfloat16\" also works), "
                         "int8 or uint8. Arrays are (T, n_kv_heads, head_dim) for K and (T, n_kv_heads, "
                         "value_dim) for V, C-contiguous, of exactly the pool's dtype.");
  cls.def(py::init([](std::shared_ptr<kvcore::SequenceCache> cache, py::object dtype,
                      bool mirror_rings, py::object compute_dtype, py::object state_tensors) {
            if (!cache) raise(kvcore::Error::InvalidArgument, "cache: must not be None");
            std::vector<kvcore::LayerPolicy::Kind> kinds;
            for (int l = 0; l < cache->n_layers(); ++l) kinds.push_back(unwrap(cache->layer_config(l)).policy.kind);
            const StateTensors states = StateTensors::parse(state_tensors, kinds);
            return new PyPool(std::move(cache), dtype, mirror_rings, compute_dtype, states);
          }),
          py::arg("cache"), py::arg("dtype") = py::module_::import("numpy").attr("float16"),
          py::kw_only(), py::arg("mirror_rings") = false, py::arg("compute_dtype") = py::none(),
          py::arg("state_tensors") = py::none(),
          "Storage for every layer of `cache` in `dtype` (float32, float16, \"bfloat16\" with "
          "ml_dtypes, int8, uint8). Construction gives every layer, flat or ring, "
          "min(config.initial_capacity, rows(layer)) rows; a layer's storage then doubles, up "
          "to rows(layer), when a write reaches further (reserve() grows it ahead). "
          "mirror_rings: see the property. dtype 'qint8' or 'fp8_e4m3' stores quantized rows "
          "(docs/quantized.md): values go in and come out as compute_dtype (float32 by default, "
          "float16 or \"bfloat16\"). A Shared layer stores nothing: reads answer from its source's rows. "
          "state_tensors: the named tensors of each State layer's state, {name: (shape, dtype)} for "
          "every State layer or {layer: {name: (shape, dtype)}} per layer (numeric numpy dtypes or "
          "\"bfloat16\"; each tensor 16-byte aligned in a slot); the pool keeps rows(layer) slots of "
          "them per State layer (docs/layer_kinds.md). InvalidArgumentError: another dtype or cache None, a "
          "compute_dtype other than those (or, for a plain dtype, other than it), state_tensors missing "
          "for a State layer, naming a layer that is not one, an empty name, a dim < 1, another dtype "
          "or a slot that overflows; AllocationError when memory runs out (at construction or on growth).");
  def_storage(cls, StorageDocs{
                       "The SequenceCache whose plans this pool applies (kept alive by it).",
                       "Storage format: the numpy dtype of every stored element, or 'qint8' / 'fp8_e4m3' "
                       "for quantized rows (docs/quantized.md).",
                       "numpy dtype that write/update take and read/update return (a plain pool's dtype; "
                       "float32, float16 or bfloat16 for a quantized one).",
                       "Number of layers, as the cache's.",
                       "Bytes of storage allocated now.",
                       "Rows `layer` has storage for now (it doubles up to rows(layer) when a write reaches "
                       "further). InvalidArgumentError: bad layer.",
                       "Grows `layer`'s storage now to at least `rows` rows, so later writes below it never "
                       "allocate. InvalidArgumentError: bad layer, rows outside [0, rows(layer)]; "
                       "AllocationError: the growth failed (nothing changed).",
                   });
  cls.def_property_readonly(
         "mirror_rings", [](const PyPool& p) { return p.mirror_rings(); },
         "True when wrapping ring layers keep a mirror of their first R - 1 rows, so every "
         "read without sinks is a zero-copy view.")
      .def_property_readonly(
          "nbytes", [](const PyPool& p) { return p.pool().in_use_bytes(p.cache()->length()); },
          "Bytes of the rows holding the cache's committed positions (a State layer's: min(length, D) "
          "slots; a Shared layer's: none).")
      .def("rows", [](const PyPool& p, const PyInt& layer) {
             return p.pool().layer(p.checked_layer(layer))->rows;
           }, py::arg("layer"),
           "Rows `layer` holds at most (the cache's rows(layer)). InvalidArgumentError: bad layer.")
      .def("write",
           [](PyPool& p, const PyInt& layer, const kvcore::SeqStepPlan& plan, py::handle k,
              py::handle v) {
             const int l = p.checked_layer(layer);
             p.check_current_plan(l, plan);
             p.write(l, plan, k, v);
           },
           py::arg("layer"), py::arg("plan"), py::arg("k"), py::arg("v"),
           "Writes the step's rows: k (T, n_kv_heads, head_dim) and v (T, n_kv_heads, value_dim), "
           "C-contiguous, of the pool's dtype, go where `plan` (layer's plan of the begun step) "
           "says; input row j is position P + j (a tree step's: token j, written to the row of its "
           "chain_index). InvalidArgumentError: bad layer or arrays; "
           "InvalidStateError: a stale plan; AllocationError: growth failed. Nothing is written "
           "on any error.")
      .def("read",
           [](PyPool& p, const PyInt& layer, const kvcore::SeqStepPlan& plan, const std::string& order) {
             const ReadOrder o = parse_order(order);
             const int l = p.checked_layer(layer);
             p.check_current_plan(l, plan);
             return p.read_in(o, l, plan, p.cache()->active_step().id);
           },
           py::arg("layer"), py::arg("plan"), py::kw_only(), py::arg("order") = "rows",
           "(k, v, positions) of `plan`'s step after its rows were written. order='rows' (the "
           "default): every held row as it lies, one zero-copy read-only view, positions[r] the "
           "position row r stands for (mask with step.mask(layer)); order='positions': the plan's "
           "read in increasing positions, a view when it is one run, else a gathered copy. "
           "InvalidArgumentError: bad layer or order; InvalidStateError: a stale plan or rows not "
           "written yet. A quantized pool returns the rows dequantized into compute_dtype, in a "
           "workspace the next read of any layer reuses (copy what must outlive it).")
      .def("read_quantized",
           [](PyPool& p, const PyInt& layer, const kvcore::SeqStepPlan& plan) {
             const int l = p.checked_layer(layer);
             p.check_current_plan(l, plan);
             return p.read_quantized(l, plan, p.cache()->active_step().id);
           },
           py::arg("layer"), py::arg("plan"),
           "The raw quantized rows of `plan`'s step in row order (as read(order='rows')), zero-copy and "
           "read-only: a dict of k, v (int8 values for 'qint8'; uint8 bytes of float8 e4m3fn for "
           "'fp8_e4m3', view them with ml_dtypes.float8_e4m3fn), k_scales, v_scales (float32, (rows, "
           "n_kv_heads)), k_zero_points, v_zero_points (int8, (rows, n_kv_heads); None for fp8) and "
           "positions. InvalidArgumentError: bad layer, a pool that is not quantized; "
           "InvalidStateError: a stale plan or rows not written yet.")
      .def("update",
           [](PyPool& p, const PyInt& layer, const StepHandle& step, py::handle k, py::handle v,
              const std::string& order) {
             const ReadOrder o = parse_order(order);
             const int l = p.checked_layer(layer);
             const StepHandle& h = checked_step(p, step);
             const kvcore::SeqStepPlan plan = unwrap(h.cache->plan(l, h.step));
             p.write(l, plan, k, v);
             return p.read_in(o, l, plan, h.step.id);
           },
           py::arg("layer"), py::arg("step"), py::arg("k"), py::arg("v"), py::kw_only(),
           py::arg("order") = "rows",
           "write then read in one call, the per-layer hot path: writes k/v (T rows) for the "
           "begun `step` and returns (k, v, positions) as read(layer, plan, order=order). Errors "
           "as write and read; InvalidStateError: `step` is stale or of another cache. A tree step "
           "(begin_tree) writes token i to the row of its chain_index and its positions give each "
           "row's token position (length + depth); mask with step.mask(layer, order=order). A Shared "
           "layer is refused naming its source (update the source, then read the Shared layer: its "
           "source's rows); a State layer is refused (write_state, read_state).")
      .def("state_names",
           [](const PyPool& p, const PyInt& layer) { return p.states().checked_names(p.pool(), p.checked_layer(layer)); },
           py::arg("layer"),
           "The names of State layer `layer`'s state tensors, in the order state_tensors gave them. "
           "InvalidArgumentError: bad layer, a layer that is not a State layer.")
      .def("write_state",
           [](PyPool& p, const PyInt& layer, const StepHandle& step, py::handle states) {
             const int l = p.checked_layer(layer);
             p.write_state(l, checked_step(p, step), states);
           },
           py::arg("layer"), py::arg("step"), py::arg("states"),
           "Stores the states the begun `step` produces on State layer `layer`: states[name] is an "
           "array (n, *shape) of the tensor's dtype, C-contiguous, for every tensor of the layer, row j "
           "the state after the j-th position the step keeps: n = step.plan(layer).write_len, T for a "
           "verify step (begin_step(T, verify=True)), 1 (the last position's) for any other chain step, "
           "N for a tree step (row i: node i's). Every name, shape and dtype is checked before anything "
           "is written. InvalidArgumentError: bad layer, not a State layer, a missing or unknown name, "
           "another shape or dtype, not C-contiguous; InvalidStateError: `step` is stale or of another cache.")
      .def("read_state",
           [](PyPool& p, const PyInt& layer, const StepHandle& step, py::handle node) {
             const int l = p.checked_layer(layer);
             return p.read_state(l, checked_step(p, step), node);
           },
           py::arg("layer"), py::arg("step"), py::kw_only(), py::arg("node") = py::none(),
           "The state the begun `step` starts from on State layer `layer`, as a dict name -> read-only "
           "array of the tensor's shape (a copy): the state after position P - 1, zeros at P = 0. "
           "Read it before write_state (a step without verify may write its last state into that slot). "
           "node=i (a tree step): the state tree node i starts from, its parent's (write_state the "
           "tree first), the root's being the step's. InvalidArgumentError: bad layer, not a State "
           "layer, node outside [0, N) or given for a chain step; InvalidStateError: `step` is stale "
           "or of another cache.")
      .def("state_slots",
           [](const PyPool& p, const PyInt& layer, const std::string& name) {
             return p.state_slots(p.checked_layer(layer), name);
           },
           py::arg("layer"), py::arg("name"),
           "Read-only zero-copy array (D, *shape) of tensor `name` in every slot of State layer `layer` "
           "(D = rows(layer)), for kernels that index slots themselves (vLLM-style state_indices: "
           "step.plan(layer).read names the slot a step starts from, its write runs the slots it fills). "
           "InvalidArgumentError: bad layer, not a State layer, no such tensor.")
      .def("apply_copies", [](PyPool& p, py::handle copies) { p.apply_copies(copies); }, py::arg("copies"),
           "Performs a draft-tree commit's row copies: `copies` is what SequenceCache.commit(step, "
           "accepted) returned, one int (n, 2) array [src row, dst row] per layer (a State layer's: "
           "state slots), copied in order. "
           "Call it after the commit and before writing the next step. InvalidArgumentError: not one "
           "(n, 2) array per layer, or a row outside the layer; InvalidStateError: a row the tree step "
           "never wrote. Every layer is checked before anything is copied.")
      .def_static(
          "required_bytes",
          [](const kvcore::CacheConfig& config, py::object dtype, bool mirror_rings, py::object state_tensors) {
            throw_if_error(kvcore::validate(config));
            std::vector<kvcore::LayerPolicy::Kind> kinds;
            for (int l = 0; l < config.n_layers; ++l) kinds.push_back(config.layer(l).policy.kind);
            const StateTensors states = StateTensors::parse(state_tensors, kinds);
            return unwrap(kvcore::KVPool::required_bytes(config, parse_dtype(dtype).second,
                                                         ring_storage(mirror_rings), states.slot_bytes()));
          },
          py::arg("config"), py::arg("dtype"), py::kw_only(), py::arg("mirror_rings") = false,
          py::arg("state_tensors") = py::none(),
          "Bytes one arena must have for a pool of a cache built from `config` in `dtype`, as the "
          "C++ KVPool::in_arena takes them: every layer at its full rows(layer) for K and V (with "
          "mirror_rings, plus the R - 1 mirror rows of each wrapping ring layer without sinks), "
          "the layer table and each K and V block rounded up to 64 bytes, and 63 bytes of slack to "
          "align the start, so any address works; each State layer's D slots of its state_tensors "
          "(as KVPool takes them). Builds no pool. InvalidArgumentError: `config` "
          "breaks a CacheConfig rule, another dtype, bad state_tensors (as KVPool), or the total "
          "overflows the address space.")
      .def("__deepcopy__",
           [](const PyPool& p, py::dict memo) {
             // Its cache's copy (once per deepcopy, through memo), then every stored row.
             py::object cache = py::module_::import("copy").attr("deepcopy")(py::cast(p.cache()), memo);
             auto* copy = new PyPool(cache.cast<std::shared_ptr<kvcore::SequenceCache>>(), p.dtype_spec(),
                                     p.mirror_rings(), p.quantized() ? py::object(p.compute_dtype()) : py::object(py::none()),
                                     p.states());
             py::object owned = py::cast(copy, py::return_value_policy::take_ownership);
             for (int l = 0; l < p.pool().n_layers(); ++l) {
               const kvcore::PoolLayer from = unwrap(p.pool().layer(l));
               throw_if_error(copy->pool().reserve(l, from.allocated_rows));
               const kvcore::PoolLayer to = unwrap(copy->pool().layer(l));
               const std::size_t n = static_cast<std::size_t>(from.storage_rows());
               if (from.k_row_bytes * n != 0) std::memcpy(to.k, from.k, from.k_row_bytes * n);
               if (from.v_row_bytes * n != 0) std::memcpy(to.v, from.v, from.v_row_bytes * n);  // a State layer has no V
             }
             return owned;
           },
           py::arg("memo"),
           "An independent pool holding a copy of every row and state slot, over a deep copy of its cache "
           "(shared with other objects of the same deepcopy). AllocationError when it cannot be "
           "allocated.")
      .def(
          "export_size",
          [](const PyPool& p, const PyInt& n_tokens) {
            return unwrap(kvcore::export_size(*p.cache(), p.pool(), to_int("n_tokens", n_tokens)));
          },
          py::arg("n_tokens") = 0,
          "Bytes export_sequence() gives for the cache's sequence with `n_tokens` known token ids. "
          "InvalidArgumentError: n_tokens outside [0, length].")
      .def(
          "export_sequence",
          [](const PyPool& p, py::object tokens) {
            const std::vector<std::int32_t> t = token_ids_of("export_sequence", tokens);
            const int n = static_cast<int>(t.size());
            const std::size_t size = unwrap(kvcore::export_size(*p.cache(), p.pool(), n));
            return new_record(size, [&](void* out) {
              throw_if_error(kvcore::export_to(*p.cache(), p.pool(), t.data(), n, out, size));
            });
          },
          py::arg("tokens") = py::none(),
          "The cache's sequence as a record (bytes, docs/state.md): length, per layer the rows its "
          "layer still holds (a ring's sinks and window, not what it released; a Shared layer none; a "
          "State layer its states after positions [held_from, length): the last one and the run of held "
          "states before it, what a rewind needs; record version 3) and `tokens` (the ids of "
          "positions [0, len(tokens)), optional: a 1-D int32 or int64 array or a list of ints, copied; "
          "never cast from floats, bools or strings). InvalidArgumentError: more tokens than the length, "
          "tokens of another dtype or shape, an id beyond 32 bits; TypeError: a list item that is not an "
          "int; InvalidStateError: a step is begun.")
      .def(
          "export_into",
          [](const PyPool& p, py::object out, py::object tokens) {
            const std::vector<std::int32_t> t = token_ids_of("export_into", tokens);
            const int n = static_cast<int>(t.size());
            const std::size_t size = unwrap(kvcore::export_size(*p.cache(), p.pool(), n));
            const OutputBuffer buffer("export_into", out, size);
            throw_if_error(kvcore::export_to(*p.cache(), p.pool(), t.data(), n, buffer.data, size));
            return size;
          },
          py::arg("out"), py::arg("tokens") = py::none(),
          "Writes the record export_sequence() gives into the first bytes of the buffer `out` (writable, "
          "C-contiguous, 8-byte aligned, at least export_size() bytes, e.g. a numpy uint8 array) and "
          "returns its size in bytes. InvalidArgumentError: out not a buffer, read-only, not C-contiguous "
          "(a strided, negative-stride, stride-0 or Fortran-ordered view), misaligned or too small, checked "
          "before anything is written; errors as export_sequence.")
      .def(
          "import_sequence",
          [](PyPool& p, py::object record) {
            const RecordBytes r(record);
            throw_if_error(kvcore::import_record(r.data, r.size, *p.cache(), p.pool()));
          },
          py::arg("record"),
          "Admits the sequence of `record` (any bytes-like object) into the empty cache and this pool: "
          "its length, rows and states; every later plan and read equals the exporter's, and can_rewind "
          "allows what the record carries (never more than the exporter). Checks everything first and "
          "changes nothing on an error. InvalidArgumentError: truncated, corrupt (checksum), bad magic, or "
          "a policy, shape or dtype other than the cache's (a State layer: D or the bytes of its state "
          "tensors); "
          "NotSupportedError: a newer record version, or a record with holes or a removed head; "
          "InvalidStateError: the cache holds positions or a begun step; CapacityError: its "
          "length exceeds the capacity.")
      .def("__repr__", [](const PyPool& p) {
        return "KVPool(n_layers=" + std::to_string(p.pool().n_layers()) +
               ", dtype=" + (p.quantized() ? py::str(p.dtype()).cast<std::string>()
                                           : p.dtype().attr("name").cast<std::string>()) +
               (p.quantized() ? ", compute_dtype=" + p.compute_dtype().attr("name").cast<std::string>() : "") +
               (p.mirror_rings() ? ", mirror_rings=True" : "") +
               ", reserved_bytes=" + std::to_string(p.pool().reserved_bytes()) + state_bytes(p) + ")";
      });

  m.def(
      "check_record",
      [](py::object record) {
        const RecordBytes r(record);
        throw_if_error(kvcore::RecordView::parse(r.data, r.size).status());
      },
      py::arg("record"),
      "Validates a sequence record (docs/state.md) as an import does before reading it: size, magic, "
      "version, checksum and every field. InvalidArgumentError: truncated, corrupt or malformed (the "
      "message names the field); NotSupportedError: a version newer than this build reads.");

  m.def(
      "seal_record",
      [](py::object out) {
        // A writer outside the core (the torch pools) fills a record's rows and seals it here.
        constexpr std::size_t kMin = kvcore::RecordFormat::kHeaderBytes + kvcore::RecordFormat::kTrailerBytes;
        const OutputBuffer buffer("seal_record", out, kMin);
        const std::size_t body = buffer.bytes - kvcore::RecordFormat::kTrailerBytes;
        unsigned char* bytes = buffer.data;
        kvcore::record_detail::put_u64(bytes + body, kvcore::record_checksum(bytes, body));
      },
      py::arg("out"),
      "Writes the checksum of the record in the buffer `out` (its last 8 bytes, over every byte "
      "before them), for a writer that filled a record's rows itself. InvalidArgumentError: out not "
      "a buffer, read-only, not C-contiguous, or shorter than 72 bytes.");

  // Step is registered by register_cache(); mask() joins it here.
  py::object step_type = py::type::of<StepHandle>();
  step_type.attr("mask") = py::cpp_function(
      &step_mask, py::name("mask"), py::is_method(step_type), py::arg("layer"), py::kw_only(),
      py::arg("order") = "rows",
      "Boolean numpy array (T, n): mask[i, j] is True when the "
      "step's query i (position P + i) may see the j-th row of layer's read (the visibility "
      "rule), in the order KVPool.update/read return them with the same `order`: 'rows' (n = "
      "the held rows, as they lie) or 'positions' (n = the plan's read_len, increasing "
      "positions). Read-only: layers of one policy share it. A Shared layer's mask is its "
      "source's. InvalidArgumentError: bad layer or order, or a State layer (it has no keys); "
      "InvalidStateError: the step is no longer the begun step.");
}

}  // namespace kvcore_py
