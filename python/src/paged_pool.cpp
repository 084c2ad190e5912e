// Python view of PagedKVPool: the byte layer of a BatchCache, numpy in and out.
//
// As KVPool (pool.cpp): every storage block the pool allocates is owned by a
// capsule; the pool holds one reference and each zero-copy view holds another
// (as its numpy base), so a view never points at freed memory, even after the
// pool grows or dies. update() is the per-layer hot path: it talks to numpy
// through its C API (no shape vectors, no Python-level calls), and mask()
// builds one read-only mask per group and step, shared by the group's layers.
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

namespace {

namespace npy = py::detail;

constexpr const char* kPagedBlockName = "kvcore.paged_pool_block";

using CachePtr = std::shared_ptr<kvcore::BatchCache>;

// Each layer's kind, for StateTensors::parse.
std::vector<kvcore::LayerPolicy::Kind> kinds_of(const kvcore::BatchCache& cache) {
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
  void apply_commit(const py::handle& copies) {
    const int n_groups = cache_->n_groups(), n_states = cache_->n_state_groups();
    const py::sequence per_group = py::reinterpret_borrow<py::sequence>(copies);
    if (!py::isinstance<py::sequence>(copies) || static_cast<int>(py::len(per_group)) != n_groups + n_states)
      raise(kvcore::Error::InvalidArgument,
            "apply_commit: copies must hold one (n, 2) array per group (" + std::to_string(n_groups) +
                ") and per State group (" + std::to_string(n_states) + "), as cache.commit(step, accepted) returns");
    std::vector<std::vector<kvcore::TreeCopy>> rows(static_cast<std::size_t>(n_groups + n_states));
    std::vector<kvcore::GroupCommit> groups(rows.size());
    for (std::size_t g = 0; g < rows.size(); ++g) {
      const bool state = static_cast<int>(g) >= n_groups;
      const std::string name = "copies[" + std::to_string(g) + "]";
      const IntArray pairs("apply_commit", name.c_str(), per_group[g], false, /*columns=*/2);
      for (py::ssize_t c = 0; c < pairs.rows(); ++c) {
        const std::int64_t src = pairs[2 * c], dst = pairs[2 * c + 1];
        if (src < 0 || dst < 0 || src > 0x7fffffff || dst > 0x7fffffff)
          raise(kvcore::Error::InvalidArgument,
                "apply_commit: " +
                    (state ? "State group " + std::to_string(static_cast<int>(g) - n_groups) : "group " + std::to_string(g)) +
                    "'s copy " + std::to_string(c) + " names a " + (state ? "slot" : "row") + " outside [0, 2^31)");
        rows[g].push_back(kvcore::TreeCopy{static_cast<int>(src), static_cast<int>(dst)});
      }
      groups[g] = kvcore::GroupCommit{rows[g].data(), static_cast<int>(rows[g].size())};
    }
    throw_if_error(pool_->apply_commit(
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
py::array_t<std::int32_t> import_reporting(PyPagedPool& p, int seq, const RecordBytes& r,
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

}  // namespace

void register_paged_pool(py::module_& m) {
  py::class_<PyPagedPool> cls(
      m, "PagedKVPool",
      "Reference CPU storage for a BatchCache's K/V rows and state slots: each layer holds its group's "
      "block pool (num_blocks * block_size rows of n_kv_heads x dim elements), grown by doubling as steps "
      "reach further. update() performs a step's block copies and writes its new rows; attention reads the "
      "live rows with mask(), or one sequence's history with gather(). A Shared layer stores nothing "
      "(rows and gather give its source's rows); a State layer keeps its State group's num_state_slots "
      "physical slots of the named tensors state_tensors gives (write_state, read_state, "
      "state_slots).\n\n"
      "dtype: float32, float16, bfloat16 (from ml_dtypes; \"bfloat16\" also works), int8 or uint8. "
      "Arrays are (n_tokens, n_kv_heads, head_dim) for K and (n_tokens, n_kv_heads, value_dim) for V, "
      "C-contiguous, of exactly the pool's dtype.");
  cls.def(py::init([](CachePtr cache, py::object dtype, const PyInt& initial_rows, py::object compute_dtype,
                      py::object state_tensors) {
            if (!cache) raise(kvcore::Error::InvalidArgument, "cache: must not be None");
            const StateTensors states = StateTensors::parse(state_tensors, kinds_of(*cache));
            return new PyPagedPool(std::move(cache), dtype, to_int("initial_rows", initial_rows), compute_dtype,
                                   states);
          }),
          py::arg("cache"), py::arg("dtype") = py::module_::import("numpy").attr("float16"), py::kw_only(),
          py::arg("initial_rows") = kvcore::PagedKVPool::kDefaultInitialRows, py::arg("compute_dtype") = py::none(),
          py::arg("state_tensors") = py::none(),
          "PagedKVPool(cache, dtype=numpy.float16, *, initial_rows=256, compute_dtype=None, "
          "state_tensors=None): storage for `cache` in `dtype` "
          "(float32, float16, 'bfloat16' via ml_dtypes, int8, uint8); each layer starts with "
          "min(initial_rows, its rows) rows. dtype 'qint8' or 'fp8_e4m3' stores quantized rows "
          "(docs/quantized.md): update takes values of compute_dtype (float32 by default, float16 or "
          "'bfloat16') and rows/gather return them dequantized. A Shared layer stores nothing: its reads "
          "answer from its source's rows. state_tensors: the named tensors of each State layer's state, "
          "{name: (shape, dtype)} for every State layer or {layer: {name: (shape, dtype)}} per layer "
          "(numeric numpy dtypes or \"bfloat16\"; each tensor 16-byte aligned in a slot), as KVPool "
          "takes them; the pool keeps cache.num_state_slots(cache.state_group_of(layer)) slots of them per "
          "State layer, allocated (zeros) now. InvalidArgumentError: bad dtype, compute_dtype or "
          "initial_rows < 0; state_tensors missing for a State layer, naming a layer that is not one, an "
          "empty name, a dim < 1, another dtype or a slot that overflows. "
          "AllocationError: the first blocks or the state slots cannot be allocated.");
  def_storage(cls, StorageDocs{
                       "The BatchCache it stores.",
                       "Storage format: the numpy dtype of every K/V element, or 'qint8' / 'fp8_e4m3' for "
                       "quantized rows (docs/quantized.md).",
                       "numpy dtype update takes and rows/gather return (a plain pool's dtype; float32, "
                       "float16 or bfloat16 for a quantized one).",
                       "Number of layers the pool stores, as the cache's (cache.n_layers); each holds its "
                       "group's blocks (a Shared layer none, a State layer its state slots).",
                       "Bytes of storage allocated now (K and V, every layer).",
                       "Rows of the layer backed by storage now (at most num_blocks(group) * block_size). "
                       "InvalidArgumentError: bad layer.",
                       "Grows the layer now to at least `rows` rows, so later updates below it never allocate. "
                       "InvalidArgumentError: bad layer, rows outside [0, num_blocks * block_size]. "
                       "AllocationError: growth failed (nothing changed).",
                   });
  cls.def_property_readonly("nbytes", &PyPagedPool::nbytes,
                            "Bytes (K and V, every layer) of the rows in blocks some sequence holds now: "
                            "held_blocks(group) * block_size rows per layer of the group (a Shared layer's "
                            "none), plus every State layer's state slots (always stored).")
      .def(
          "update",
          [](PyPagedPool& p, const PyInt& layer, const BatchStepHandle& step, py::handle k, py::handle v) {
            const int l = p.checked_layer(layer);
            return p.update(l, p.plan_of(step), k, v);
          },
          py::arg("layer"), py::arg("step"), py::arg("k"), py::arg("v"),
          "update(layer, step, k, v) -> (k_rows, v_rows): performs the layer's block copies of the begun "
          "step (copy-on-write), writes the step's new rows (k: (n_tokens, n_kv_heads, head_dim), v: "
          "(n_tokens, n_kv_heads, value_dim), C-contiguous, the pool's dtype; token t to its slot), and "
          "returns read-only zero-copy views of the layer's live rows, (used_blocks * block_size, "
          "n_kv_heads, dim): attend over them with mask(step, group). Views keep their storage alive. "
          "InvalidArgumentError: bad layer or array (nothing written); a Shared layer (it writes nothing: "
          "update its source, named in the message, then read the Shared layer with rows or gather); a "
          "State layer (write_state). InvalidStateError: a stale step, "
          "or a step of another cache. AllocationError: growth failed (nothing written).")
      .def("apply_commit", &PyPagedPool::apply_commit, py::arg("copies"),
           "apply_commit(copies): performs a draft-tree commit's copies in every layer, copies being "
           "what cache.commit(step, accepted) returned: one (n, 2) int array of (src, dst) rows per group, "
           "then one of (src, dst) physical state slots per State group (n_groups + n_state_groups arrays), "
           "each performed in order in every layer of its group (a Shared layer's rows are its source's). "
           "Call it once per commit, before the next step's update(). InvalidArgumentError "
           "(nothing copied): not one (n, 2) array per group and State group, a row outside a layer's "
           "stored rows, a slot outside [0, num_state_slots).")
      .def(
          "state_names",
          [](const PyPagedPool& p, const PyInt& layer) { return p.states().checked_names(p.pool(), p.checked_layer(layer)); },
          py::arg("layer"),
          "The names of State layer `layer`'s state tensors, in the order state_tensors gave them. "
          "InvalidArgumentError: bad layer, a layer that is not a State layer.")
      .def(
          "write_state",
          [](PyPagedPool& p, const PyInt& layer, const BatchStepHandle& step, py::handle states, py::handle entry) {
            const int l = p.checked_layer(layer);
            p.write_state(l, p.plan_of(step), states, entry);
          },
          py::arg("layer"), py::arg("step"), py::arg("states"), py::kw_only(), py::arg("entry") = py::none(),
          "write_state(layer, step, states, *, entry=None): stores the states the begun `step` keeps on "
          "State layer `layer`, for every token of the step (or of entry `entry` only): states[name] is an "
          "array (n, *shape) of the tensor's dtype, C-contiguous, for every tensor of the layer, row i the "
          "state after the position of the i-th token whose write slot is set (plan.state_groups[k]"
          ".write_slots >= 0, k = cache.state_group_of(layer)), in token order: every token of a verify "
          "step or a tree, the last of each other entry. Each goes to its physical slot. Every name, shape "
          "and dtype is checked before anything is written. InvalidArgumentError: bad layer, not a State "
          "layer, a bad entry, a missing or unknown name, another shape or dtype, not C-contiguous; "
          "InvalidStateError: a stale step or another cache's.")
      .def(
          "read_state",
          [](PyPagedPool& p, const PyInt& layer, const BatchStepHandle& step, const PyInt& token) {
            const int l = p.checked_layer(layer);
            return p.read_state(l, p.plan_of(step), to_int("token", token));
          },
          py::arg("layer"), py::arg("step"), py::arg("token"),
          "read_state(layer, step, token) -> dict: the state token `token` of the begun `step` starts from "
          "on State layer `layer`, as name -> read-only array of the tensor's shape (a copy): the slot "
          "plan.state_groups[k].read_slots[token] names (the state after position - 1: an entry's first "
          "token's, a tree node's parent's, a verify step's previous token's), zeros at position 0. Read an "
          "entry's first token before write_state (an entry may write the slot it reads). "
          "InvalidArgumentError: bad layer, not a State layer, token outside [0, n_tokens), a token past "
          "position 0 that reads no slot (its state is carried within the forward: a step without verify "
          "keeps only its last); InvalidStateError: a stale step or another cache's.")
      .def(
          "state_slots",
          [](const PyPagedPool& p, const PyInt& layer, const std::string& name) {
            return p.state_slots(p.checked_layer(layer), name);
          },
          py::arg("layer"), py::arg("name"),
          "Read-only zero-copy array (num_slots, *shape) of tensor `name` in every physical slot of State "
          "layer `layer` (num_slots = cache.num_state_slots(cache.state_group_of(layer))), for kernels that "
          "index slots themselves (vLLM / SGLang state_indices: plan.state_groups[k].read_slots and "
          "write_slots per token). The view keeps the storage alive. InvalidArgumentError: bad layer, not a "
          "State layer, no such tensor.")
      .def(
          "rows",
          [](PyPagedPool& p, const PyInt& layer) { return p.rows(p.checked_layer(layer)); },
          py::arg("layer"),
          "rows(layer) -> (k_rows, v_rows): the views update() returns, without writing (a quantized "
          "pool's: the live rows dequantized into a workspace the next read reuses); a Shared layer's are "
          "its source's rows. InvalidArgumentError: bad layer, a State layer (state_slots). InvalidStateError: the live rows are not all stored yet "
          "(update the layer for the begun step first).")
      .def(
          "rows_quantized",
          [](const PyPagedPool& p, const PyInt& layer) { return p.rows_quantized(p.checked_layer(layer)); },
          py::arg("layer"),
          "The raw quantized live rows, zero-copy and read-only: a dict of k, v (int8 values for 'qint8'; "
          "uint8 bytes of float8 e4m3fn for 'fp8_e4m3'), k_scales, v_scales (float32, (rows, n_kv_heads)), "
          "k_zero_points, v_zero_points (int8; None for fp8). InvalidArgumentError: bad layer, a pool "
          "that is not quantized. InvalidStateError: the live rows are not all stored yet.")
      .def(
          "mask",
          [](PyPagedPool& p, const BatchStepHandle& step, const PyInt& group) {
            const kvcore::BatchStepPlan plan = p.plan_of(step);
            return p.mask(step, plan, to_int("group", group));
          },
          py::arg("step"), py::arg("group"),
          "mask(step, group) -> bool (n_tokens, used_blocks * block_size): mask[t, r] is True when the "
          "step's token t may see the key in row r of the group's layers (its own sequence's, by the "
          "visibility rule, not removed): the columns of update()'s rows. Read-only, built once per group "
          "and step and shared by the group's layers (step.plan().mask(group) gives a new one). "
          "InvalidArgumentError: bad group. InvalidStateError: a stale step or another cache's.")
      .def(
          "gather",
          [](const PyPagedPool& p, const PyInt& layer, const BatchStepHandle& step, const PyInt& entry) {
            const int l = p.checked_layer(layer);
            return p.gather(l, p.plan_of(step), to_int("entry", entry));
          },
          py::arg("layer"), py::arg("step"), py::arg("entry"),
          "gather(layer, step, entry) -> (k, v, positions): the history entry `entry` of the step sees on "
          "this layer (every position below its context length that one of its queries sees: the sinks and "
          "the first query's window on a ring, all kept positions when flat; removed ones skipped), in "
          "increasing positions, as new contiguous arrays (n, n_kv_heads, dim) and int64 (n,); a Shared "
          "layer's are its source's. Call it after update(). InvalidArgumentError: bad layer or entry, a "
          "State layer (read_state). InvalidStateError: a stale step, or "
          "the layer not updated for it yet.")
      .def_static(
          "required_bytes",
          [](const CachePtr& cache, py::object dtype, py::object state_tensors) {
            if (!cache) raise(kvcore::Error::InvalidArgument, "cache: must not be None");
            const StateTensors states = StateTensors::parse(state_tensors, kinds_of(*cache));
            return unwrap(kvcore::PagedKVPool::required_bytes(*cache, parse_dtype(dtype).second, states.slot_bytes()));
          },
          py::arg("cache"), py::arg("dtype"), py::kw_only(), py::arg("state_tensors") = py::none(),
          "Bytes a pool of `cache`'s layers in `dtype` holds at most (every block of every layer and every "
          "State layer's slots of its state_tensors, as the C++ arena mode takes them, alignment slack "
          "included). InvalidArgumentError: bad dtype, bad state_tensors (as PagedKVPool).")
      .def(
          "export_size",
          [](const PyPagedPool& p, const PyInt& seq, const PyInt& n_tokens) {
            return unwrap(kvcore::export_size(*p.cache(), p.pool(), to_int("seq", seq), to_int("n_tokens", n_tokens)));
          },
          py::arg("seq"), py::arg("n_tokens") = 0,
          "Bytes export_sequence(seq) gives with `n_tokens` known token ids. InvalidArgumentError: bad "
          "seq, n_tokens outside [0, length]; InvalidStateError: seq not active.")
      .def(
          "export_sequence",
          [](const PyPagedPool& p, const PyInt& seq_arg, py::object tokens) {
            const int seq = to_int("seq", seq_arg);
            const std::vector<std::int32_t> t = token_ids_of("export_sequence", tokens);
            const int n = static_cast<int>(t.size());
            const std::size_t size = unwrap(kvcore::export_size(*p.cache(), p.pool(), seq, n));
            return new_record(size, [&](void* out) {
              throw_if_error(kvcore::export_to(*p.cache(), p.pool(), seq, t.data(), n, out, size));
            });
          },
          py::arg("seq"), py::arg("tokens") = py::none(),
          "Sequence `seq` as a record (bytes, docs/state.md): length, removed head and holes, per layer "
          "the rows its group still holds (a ring's sink blocks and window, not what it released) and "
          "`tokens` (the ids of positions [0, len(tokens)), optional, a 1-D int32 or int64 array or a list "
          "of ints, copied and never cast; with all of them an importer can share a prefix it caches). "
          "InvalidArgumentError: bad seq, more tokens than the length, tokens of another dtype or shape, an "
          "id beyond 32 bits; TypeError: a list item that is not an int; InvalidStateError: seq not "
          "active, or a step is begun.")
      .def(
          "export_into",
          [](const PyPagedPool& p, const PyInt& seq_arg, py::object out, py::object tokens) {
            const int seq = to_int("seq", seq_arg);
            const std::vector<std::int32_t> t = token_ids_of("export_into", tokens);
            const int n = static_cast<int>(t.size());
            const std::size_t size = unwrap(kvcore::export_size(*p.cache(), p.pool(), seq, n));
            const OutputBuffer buffer("export_into", out, size);
            throw_if_error(kvcore::export_to(*p.cache(), p.pool(), seq, t.data(), n, buffer.data, size));
            return size;
          },
          py::arg("seq"), py::arg("out"), py::arg("tokens") = py::none(),
          "Writes export_sequence(seq)'s record into the first bytes of the buffer `out` (writable, "
          "C-contiguous, 8-byte aligned, at least export_size() bytes) and returns its size in bytes. InvalidArgumentError: "
          "out not a buffer, read-only, not C-contiguous, misaligned or too small, checked before anything "
          "is written; errors as export_sequence.")
      .def(
          "import_sequence",
          [](PyPagedPool& p, const PyInt& seq, py::object record, bool written, bool trust_tokens,
             const py::handle& ns) -> py::object {
            const int s = to_int("seq", seq);
            const kvcore::RecordTrust trust{trust_tokens || !ns.is_none(), prefix_namespace_of(ns)};
            const RecordBytes r(record);
            if (!written) {
              throw_if_error(kvcore::import_record(r.data, r.size, *p.cache(), p.pool(), s, trust));
              return py::none();
            }
            return import_reporting(p, s, r, trust);
          },
          py::arg("seq"), py::arg("record"), py::kw_only(), py::arg("written") = false,
          py::arg("trust_tokens") = false, py::arg("namespace") = py::none(),
          "Admits the sequence of `record` (any bytes-like object; any block size, from a BatchCache or "
          "a SequenceCache) as sequence `seq` (inactive): its length, removed head, holes and rows. "
          "A record's token ids are its sender's word: by default the sequence names no block by them "
          "and shares none with this cache's prefixes (an untrusted record cannot change what a later "
          "request reads). trust_tokens=True, or a `namespace` (as add_sequence's; trust_tokens then "
          "implied), names its full blocks by the record's token ids in that namespace (default: 0) "
          "and shares the blocks of a prefix this cache holds there (when the record knows every "
          "token id), not copied. Every later plan and read equals the exporter's, and so does every can_rewind "
          "answer the record reaches (a ring's window and sinks, a State layer's run of states ending at the "
          "last one). Checks "
          "everything first and changes nothing on an error (any begun step ends on success). "
          "InvalidArgumentError: truncated, corrupt (checksum), bad magic, a policy, shape or dtype "
          "other than the cache's; NotSupportedError: a newer record version, or a ring group whose sink "
          "blocks would keep a position the record lacks; InvalidStateError: seq is active; "
          "CapacityError: no free table row (batch.max_active_seqs sequences are active), length "
          "over capacity, too many holes, too few free blocks; InvalidArgumentError also: a bad "
          "namespace.\n\n"
          "written=True: returns the blocks the import wrote, an int32 (n, 3) array of rows (group, "
          "block index in the sequence, block id): every block of the sequence but the shared ones (a "
          "byte layer keeping its own copy of the rows, as TorchPagedKVPool, writes exactly these). None "
          "otherwise.")
      .def("__repr__", [](const PyPagedPool& p) {
        return "PagedKVPool(n_layers=" + std::to_string(p.pool().n_layers()) +
               ", dtype=" + (p.quantized() ? py::str(p.dtype()).cast<std::string>()
                                           : p.dtype().attr("name").cast<std::string>()) +
               ", block_size=" + std::to_string(p.pool().block_size()) +
               ", reserved_bytes=" + std::to_string(p.pool().reserved_bytes()) + ")";
      });
}

}  // namespace kvcore_py
