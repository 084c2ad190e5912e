// Python view of draft trees on SequenceCache (docs/trees.md): begin_tree,
// commit(step, accepted) and its copies, and a tree step's arrays (parents,
// positions, chain indices, the packed ancestor mask, per-layer rows and the
// dense mask). Registered after register_kv_pool: it adds to Step and
// SequenceCache. The arrays are read-only numpy copies made once per Step
// object: the core reuses (and may grow) its tree storage on the next
// begin_tree, which a view could outlive.
#include <pybind11/numpy.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bindings.h"
#include "errors.h"
#include "frozen_array.h"
#include "int_args.h"
#include "step_handle.h"
#include "tree_binding.h"

namespace kvcore_py {

namespace {

namespace npy = py::detail;

// The begun tree of `h`, or the error saying why not (a stale step).
const kvcore::DraftTree* tree_of(const StepHandle& h) {
  throw_if_error(h.cache->check_step(h.step));
  return h.step.tree ? unwrap(h.cache->tree(h.step)) : nullptr;
}

// parents, positions, chain_index, tree_mask_packed of the step (a chain step
// is the chain tree), made on first use.
const std::vector<py::object>& tree_arrays(StepHandle& h) {
  if (!h.tree_arrays.empty()) return h.tree_arrays;
  const kvcore::DraftTree* t = tree_of(h);
  const int n = h.step.T, words = kvcore::tree_mask_words(n);
  FrozenArray<std::int32_t> parents({n}), chain({n});
  FrozenArray<std::int64_t> positions({n});
  FrozenArray<std::uint32_t> mask({n, words});
  std::uint32_t* bits = mask.data;
  for (int i = 0; i < n; ++i) {
    parents.data[i] = t ? t->parents()[i] : i - 1;
    chain.data[i] = t ? t->chain_indices()[i] : i;
    positions.data[i] = t ? t->positions()[i] : h.step.position + i;
    for (int w = 0; w < words; ++w) {  // a chain: row i has bits 0..i
      const int lo = 32 * w, full = i + 1 - lo;
      const std::uint32_t chain_word = full >= 32 ? 0xffffffffu : full <= 0 ? 0u : (1u << full) - 1u;
      bits[i * words + w] = t ? t->mask()[i * words + w] : chain_word;
    }
  }
  h.tree_arrays = {parents.array, positions.array, chain.array, mask.array};
  return h.tree_arrays;
}

py::object tree_rows(const StepHandle& h, const PyInt& layer) {
  const int l = to_int("layer", layer);
  const kvcore::SeqStepPlan plan = unwrap(h.cache->plan(l, h.step));  // checks layer and step
  FrozenArray<std::int32_t> rows({h.step.T});
  if (h.step.tree) {
    throw_if_error(h.cache->tree_rows(l, h.step, rows.data));
  } else {
    for (int c = 0; c < h.step.T; ++c) rows.data[c] = kvcore::chain_row(plan, c);
  }
  return rows.array;
}

// Per layer, the (n, 2) int32 array [src row, dst row] of the last commit;
// layers of one policy share one array.
py::list copies_by_layer(const kvcore::SequenceCache& c) {
  std::vector<py::object> by_policy(static_cast<std::size_t>(c.n_groups()));
  py::list out;
  for (int l = 0; l < c.n_layers(); ++l) {
    py::object& a = by_policy[static_cast<std::size_t>(c.group_of(l))];
    if (!a) {
      const kvcore::RowCopies copies = unwrap(c.commit_copies(l));
      FrozenArray<std::int32_t> frozen({copies.n, 2});
      for (int i = 0; i < copies.n; ++i) frozen.data[2 * i] = copies.copies[i].src, frozen.data[2 * i + 1] = copies.copies[i].dst;
      a = frozen.array;
    }
    out.append(a);
  }
  return out;
}

}  // namespace

py::array_t<std::int32_t> copies_array(const kvcore::TreeCopy* copies, int n) {
  py::array_t<std::int32_t> out({n, 2});
  std::int32_t* at = out.mutable_data();
  for (int i = 0; i < n; ++i) *at++ = copies[i].src, *at++ = copies[i].dst;
  return out;
}

py::object commit_step(const StepHandle& h, py::handle accepted) {
  if (accepted.is_none()) {
    throw_if_error(h.cache->commit(h.step));
    return py::none();
  }
  const std::vector<int> path = IntArray("commit", "accepted", accepted).ints();  // a list or 1-D int array
  throw_if_error(h.cache->commit(h.step, path.data(), static_cast<int>(path.size())));
  return copies_by_layer(*h.cache);
}

py::array dense_tree_mask(const StepHandle& h, int layer) {
  const kvcore::SeqStepPlan plan = unwrap(h.cache->plan(layer, h.step));
  const kvcore::DraftTree* t = tree_of(h);
  if (t == nullptr) raise(kvcore::Error::InvalidArgument, "dense_tree_mask: the step was begun by begin_step, not begin_tree (use Step.mask)");
  FrozenArray<bool> out({t->size(), plan.read_len()});
  throw_if_error(h.cache->dense_tree_mask(layer, h.step, reinterpret_cast<std::uint8_t*>(out.data)));
  return out.array;
}

py::array tree_row_mask(const StepHandle& h, int layer) {
  const kvcore::DraftTree* t = tree_of(h);
  const kvcore::LayoutPolicy& policy = h.cache->policy(layer);
  const kvcore::LayerGeometry& g = h.cache->policy(h.cache->row_layer(layer)).geometry();  // the rows it reads
  const int n = t->size(), end = h.step.end(), rows = g.held_rows(end);
  FrozenArray<bool> out({n, rows});
  bool* cell = out.data;
  const kvcore::LayerPolicy rule = policy.visibility();
  for (int i = 0; i < n; ++i)
    for (int r = 0; r < rows; ++r) *cell++ = t->sees(rule, i, g.position_at(r, end));  // history, or a node's chain position
  return out.array;
}

void register_tree(py::module_& m) {
  auto step_cls = py::reinterpret_borrow<py::class_<StepHandle>>(py::type::of<StepHandle>());
  auto property = [&](const char* name, int index, const char* doc) {
    step_cls.def_property_readonly(
        name, [index](StepHandle& h) { return tree_arrays(h)[static_cast<std::size_t>(index)]; }, doc);
  };
  property("parents", 0,
           "int32 (T,): each token's parent in the step's tree, -1 for the root (a chain step: i - 1). "
           "Read-only copy, made once per Step. InvalidStateError: the step is no longer current.");
  property("positions", 1,
           "int64 (T,): each token's position, length + depth (a chain step: position + i): the "
           "position ids for RoPE. Read-only. InvalidStateError: the step is no longer current.");
  property("chain_index", 2,
           "int32 (T,): token i is written to the row the chain plan of T gives position "
           "step.position + chain_index[i]; the main line (node 0, its first child, ...) sits in place. "
           "Read-only. InvalidStateError: the step is no longer current.");
  property("tree_mask_packed", 3,
           "uint32 (T, ceil(T / 32)): the packed ancestor mask, row i bit j (word j // 32, bit j % 32, "
           "little bit order) set when token j is i or an ancestor of i: TensorRT-LLM's "
           "spec_decoding_packed_mask layout (view as int32). Read-only. InvalidStateError: the step "
           "is no longer current.");
  step_cls.def_property_readonly("is_tree", [](const StepHandle& h) { return h.branched; },
                                 "True for a draft tree that branches: begun by begin_tree with a node "
                                 "off the chain (commit it with its accepted path). A chain is not a tree "
                                 "however it was begun (begin_step, or begin_tree with parents[i] = i - 1), "
                                 "as for BatchStepPlan.is_tree.");
  step_cls.def(
      "tree_rows", &tree_rows, py::arg("layer"),
      "int32 (T,): the row each token writes on `layer` (its slot: the chain plan's row of "
      "position + chain_index). InvalidArgumentError: bad layer; InvalidStateError: the step is no "
      "longer current.");
  step_cls.def(
      "dense_tree_mask",
      [](const StepHandle& h, const PyInt& layer) { return dense_tree_mask(h, to_int("layer", layer)); },
      py::arg("layer"),
      "bool (T, read_len): mask[i, j] is True when token i may see the key of the j-th row of "
      "`layer`'s plan read (position order, as KVPool.update(..., order='positions') returns "
      "them): committed history by the layer's window rule at i's position, and in the tree only "
      "i itself and its ancestors, within the window. InvalidArgumentError: bad layer or a chain "
      "step; InvalidStateError: the step is no longer current.");
  step_cls.def(
      "commit", [](const StepHandle& h, py::object accepted) { return commit_step(h, accepted); },
      py::arg("accepted") = py::none(),
      "Without `accepted`: length = end (a tree step only when it is a chain), returns None. With "
      "`accepted` (node indices of the accepted root path, accepted[0] = 0, each a child of the one "
      "before; a list or 1-D int array): length = position + len(accepted), returns per layer an "
      "int32 (n, 2) array of row copies [src, dst] to perform, in order, before the next step "
      "(KVPool.apply_copies): none on the main line. InvalidArgumentError: a tree committed "
      "without `accepted` (not a chain), or `accepted` not a root path; InvalidStateError: the "
      "step is no longer current. Nothing changes on an error.");

  auto cache_cls = py::reinterpret_borrow<
      py::class_<kvcore::SequenceCache, kvcore::CacheBase, std::shared_ptr<kvcore::SequenceCache>>>(
      py::type::of<kvcore::SequenceCache>());
  cache_cls.def(
      "begin_tree",
      [](const std::shared_ptr<kvcore::SequenceCache>& c, py::handle parents) {
        const std::vector<int> p = IntArray("begin_tree", "parents", parents).ints();
        const int n = p.size() > 0x7fffffff ? 0x7fffffff : static_cast<int>(p.size());
        StepHandle h{c, unwrap(c->begin_tree(p.data(), n))};
        h.branched = !kvcore::tree_is_chain(p.data(), n);
        return h;
      },
      py::arg("parents"),
      "Begins a draft-tree step of N = len(parents) tokens (parents[0] = -1, then 0 <= parents[i] < "
      "i; a list or 1-D int array) and returns its Step (T = N; is_tree unless parents is a chain, "
      "parents[i] = i - 1). Token i stands at position "
      "length + depth(i); the step reserves and plans the rows of a chain step of N. "
      "InvalidArgumentError: N outside [1, max_step], parents[0] != -1, a second root, a parent "
      "not before its child; CapacityError: length + N > capacity. Nothing changes on an error.");
  cache_cls.def(
      "reserve_tree",
      [](kvcore::SequenceCache& c, const PyInt& n) { throw_if_error(c.reserve_tree(to_int("max_nodes", n))); },
      py::arg("max_nodes"),
      "Sizes the tree storage for trees of up to max_nodes tokens (128 or max_step are reserved at "
      "construction), so begin_tree never allocates. InvalidArgumentError: max_nodes outside [1, "
      "max_step]; InvalidStateError: a tree step is begun and would need more room.");
  cache_cls.def(
      "commit",
      [](kvcore::SequenceCache& c, const StepHandle& h, py::object accepted) {
        if (h.cache.get() != &c) raise(kvcore::Error::InvalidState, "commit: the step belongs to another cache");
        return commit_step(h, accepted);
      },
      py::arg("step"), py::arg("accepted") = py::none(),
      "Commits `step` as Step.commit(accepted) does (returns None, or the copies per layer with "
      "`accepted`). InvalidStateError: not this cache's begun step.");
  cache_cls.def(
      "commit_copies", [](const kvcore::SequenceCache& c) { return copies_by_layer(c); },
      "Per layer, the int32 (n, 2) row copies [src, dst] of the last commit (empty after a chain "
      "commit), as commit(step, accepted) returned them.");
  (void)m;
}

}  // namespace kvcore_py
