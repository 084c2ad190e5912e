// PagedStorage: the layers of a PagedKVPool (paged_kv_pool.h) and what
// every verb of it shares: each layer's shape and rows as the planner reports
// them, the bytes they hold, and the checks a plan must pass before a verb
// reads or writes. The verbs stack on it, one concept a file: PagedStates
// (State layers' slots, paged_states.h), PagedReads (rows and gather,
// paged_reads.h), and PagedKVPool itself (creation, update, tree commits).
#pragma once

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kvcore/batch/batch_faces.h"
#include "kvcore/batch/batch_plan.h"
#include "kvcore/core/config.h"
#include "kvcore/core/result.h"
#include "kvcore/pool/dtype.h"
#include "kvcore/pool/pool_allocator.h"
#include "kvcore/pool/pool_bytes.h"
#include "kvcore/pool/pool_storage.h"

namespace kvcore {

/// Shape and storage of one layer of a PagedKVPool (rows: num_blocks(group) *
/// block_size). A Shared layer: its source's group and row shape, rows = 0
/// (no storage). A State layer: group = -1, rows = num_state_slots(state_group)
/// slots of k_row_bytes bytes each, v_row_bytes = 0 and no heads.
struct PagedLayer : LayerStorage {
  /// The layer's group (its block pool; a Shared layer's: its source's; -1
  /// for a State layer) and the layer's own policy (its kind; a Shared
  /// layer's source).
  int group = 0;
  LayerPolicy policy;
  /// A State layer's State group (planner.state_group_of(layer)), else -1.
  int state_group = -1;

  /// Rows the storage blocks hold now: allocated_rows.
  std::int64_t storage_rows() const noexcept { return allocated_rows; }
};

/// A layer's live rows [0, rows) as one zero-copy span (rows = used_blocks * B):
/// row r is block r / B, offset r % B of the group's pool.
struct PagedRows {
  const unsigned char* k = nullptr;
  const unsigned char* v = nullptr;
  int rows = 0;
};

/// What PoolStorage needs to know of PagedKVPool's layers (see pool_storage.h).
struct PagedKVPoolTraits {
  using Layer = PagedLayer;
  static constexpr PoolNames kNames{"paged pool", "paged layer", "paged arena", "the paged layer "};

  /// A negative layer count, or one whose table does not fit.
  static Status bad_table(int n_layers) noexcept {
    return Status::make(Error::InvalidArgument,
                        "n_layers = %d: the planner's layer count must be >= 0 and its table fit the "
                        "address space",
                        n_layers);
  }

  /// A growth needs nothing more: every row is a slot.
  static void grown(PagedLayer&) noexcept {}
};

/// The layers of a PagedKVPool and the checks its verbs share (no verb of its
/// own but the sizes and the layer-kind check).
class PagedStorage : public PoolStorage<PagedKVPoolTraits> {
 public:
  /// Every K and V block of an arena starts on this boundary.
  static constexpr std::size_t kArenaAlignment = PoolBytes::kArenaAlignment;
  /// Rows a growing layer starts with (capped at its rows).
  static constexpr int kDefaultInitialRows = 256;

  /// Rows per block, B (the planner's block_size()).
  int block_size() const noexcept { return block_size_; }

  /// Bytes of every layer's live rows [0, used_blocks * B) now: what rows()
  /// spans once the step's update has stored them (rows a growing pool has
  /// not reached yet are counted too; a storage several layers share,
  /// once); a State layer's slots in full (always stored), a Shared layer's
  /// none. A group the planner no longer knows
  /// counts 0.
  std::size_t used_bytes() const noexcept {
    std::size_t n = 0;
    for (int l = 0; l < n_layers_; ++l) {
      const PagedLayer& layer = layers_[l];
      if (layer.policy.kind == LayerPolicy::Kind::Shared || layer.storage_of >= 0) continue;  // counted once
      if (layer.policy.kind == LayerPolicy::Kind::State) {
        n += layer.k_row_bytes * static_cast<std::size_t>(layer.rows);
        continue;
      }
      Result<int> used = planner_->used_blocks(layer.group);
      if (!used.ok()) continue;
      n += (layer.k_row_bytes + layer.v_row_bytes) * static_cast<std::size_t>(*used) *
           static_cast<std::size_t>(block_size_);
    }
    return n;
  }

  /// Ok when a step writes K/V rows into `layer` (a Flat, Ring or
  /// Chunked layer). InvalidArgument naming `what`: bad layer, a Shared layer
  /// (it writes nothing: its source's update writes the rows it reads), a
  /// State layer.
  Status check_writes_rows(int layer, const char* what) const noexcept {
    KVCORE_ASSIGN_OR_RETURN(const int from, row_layer(layer, what));
    KVCORE_CHECK_OR_RETURN_ERROR(from == layer, InvalidArgument,
                                 "%s: layer %d is Shared(%d): it writes nothing; update layer %d, then read "
                                 "this one (its reads answer from layer %d's rows)",
                                 what, layer, from, from, from);
    return Error::Ok;
  }

 protected:
  PagedStorage(const BatchPlanner& planner, DType dtype, PoolAllocator allocator) noexcept
      : PoolStorage(dtype, allocator), planner_(&planner), block_size_(planner.block_size()) {}

  // Shapes layer l as `planner` reports it (PoolStorage's shape_of).
  struct PlannerShape {
    const BatchPlanner& planner;
    DType dtype;
    StateSlotBytes state_slot_bytes;

    Status operator()(int l, PagedLayer* out) const noexcept {
      return shape_layer(planner, l, dtype, state_slot_bytes, out);
    }
  };

  // What every use of a plan needs: the pool's block size, the layer's group,
  // sane counts and the arrays they index (the per-entry ones for gather).
  Status check_plan(int layer, const BatchStepPlan& plan, bool gather) const noexcept {
    const int group = layers_[layer].group;
    const bool entries = !gather || plan.n_entries == 0 ||
                         (plan.seq_ids != nullptr && plan.first_positions != nullptr &&
                          plan.context_lens != nullptr && plan.visible_starts != nullptr);
    KVCORE_CHECK_OR_RETURN_ERROR(
        plan.block_size == block_size_ && plan.n_groups > group && plan.groups != nullptr &&
            plan.n_tokens >= 0 && plan.n_entries >= 0 && entries,
        InvalidArgument,
        "%s of layer %d: the plan (block_size %d, %d groups, %d tokens, %d entries) does not fit "
        "the pool (block_size %d, the layer in group %d) or lacks an array",
        gather ? "gather" : "update", layer, plan.block_size, plan.n_groups, plan.n_tokens, plan.n_entries,
        block_size_, group);
    return Error::Ok;
  }

  const BatchPlanner* planner_;
  int block_size_ = 1;

 private:
  // Layer `l`'s group, policy, row sizes and rows, as the planner reports them;
  // fails when its rows overflow an int or its bytes the address space.
  // A Shared layer: its source's group and row sizes, no rows. A State
  // layer: shape_state().
  static Status shape_layer(const BatchPlanner& planner, int l, DType dtype, StateSlotBytes state,
                            PagedLayer* out) noexcept {
    const int B = planner.block_size();
    KVCORE_CHECK_OR_RETURN_ERROR(B >= 1, InvalidArgument,
                                 "block_size = %d: the planner's blocks must hold >= 1 row", B);
    KVCORE_ASSIGN_OR_RETURN(const LayerConfig lc, planner.layer_config(l));
    if (lc.policy.kind == LayerPolicy::Kind::State) return shape_state(planner, l, lc, state, out);
    KVCORE_ASSIGN_OR_RETURN(const int group, planner.group_of(l));
    if (lc.policy.kind == LayerPolicy::Kind::Shared) {
      // validate() made the source an earlier Flat, Ring or Chunked layer of this shape: shaped
      // (and its row size checked) before this one.
      KVCORE_ASSIGN_OR_RETURN(const LayerConfig source, planner.layer_config(lc.policy.source));
      (void)row_bytes(source, dtype, 0, &out->k_row_bytes, &out->v_row_bytes);
      out->n_kv_heads = source.n_kv_heads;
      out->head_dim = source.head_dim;
      out->value_dim = source.value_dim();
      out->group = group;
      out->policy = lc.policy;
      out->rows = 0;
      return Error::Ok;
    }
    KVCORE_ASSIGN_OR_RETURN(const int blocks, planner.num_blocks(group));
    const std::uint64_t rows = static_cast<std::uint64_t>(blocks < 0 ? 0 : blocks) * static_cast<std::uint64_t>(B);
    const bool fits = blocks >= 0 && rows <= static_cast<std::uint64_t>(INT_MAX) &&
                      row_bytes(lc, dtype, rows, &out->k_row_bytes, &out->v_row_bytes);
    KVCORE_CHECK_OR_RETURN_ERROR(
        fits, InvalidArgument,
        "layer %d: %d blocks of %d rows of %d heads x (%d + %d) dims of %s overflow the address "
        "space",
        l, blocks, B, lc.n_kv_heads, lc.head_dim, lc.value_dim(), to_string(dtype));
    out->n_kv_heads = lc.n_kv_heads;
    out->head_dim = lc.head_dim;
    out->value_dim = lc.value_dim();
    out->group = group;
    out->policy = lc.policy;
    out->rows = static_cast<int>(rows);
    out->storage_of = -1;
    // The planner's groups draw from one pool: share the storage it names
    // when its rows are of this layer's size and count (else keep our own).
    KVCORE_ASSIGN_OR_RETURN(const int owner, planner.storage_layer(l));
    if (owner != l && owner >= 0 && owner < l) {
      KVCORE_ASSIGN_OR_RETURN(const LayerConfig oc, planner.layer_config(owner));
      KVCORE_ASSIGN_OR_RETURN(const int owner_group, planner.group_of(owner));
      KVCORE_ASSIGN_OR_RETURN(const int owner_blocks, planner.num_blocks(owner_group));
      if (oc.n_kv_heads == lc.n_kv_heads && oc.head_dim == lc.head_dim && oc.value_dim() == lc.value_dim() &&
          owner_blocks == blocks)
        out->storage_of = owner;
    }
    return Error::Ok;
  }

  // State layer `l`: its State group's num_state_slots() slots of
  // state.bytes[l] bytes (K), no V, no heads. NotSupported: a cache whose
  // states live in the pages of another layer's storage (batch.states_in_pool).
  static Status shape_state(const BatchPlanner& planner, int l, const LayerConfig& lc, StateSlotBytes state,
                            PagedLayer* out) noexcept {
    KVCORE_ASSIGN_OR_RETURN(const int pages_of, planner.storage_layer(l));
    KVCORE_CHECK_OR_RETURN_ERROR(pages_of == l, NotSupported,
                                 "layer %d: its states live in the pages of layer %d's storage (the cache's "
                                 "batch.states_in_pool), and a PagedKVPool keeps state slots apart from K/V rows: "
                                 "apply such plans with page-contiguous storage of your own, or build the cache "
                                 "without states_in_pool",
                                 l, pages_of);
    KVCORE_ASSIGN_OR_RETURN(const int k, planner.state_group_of(l));
    KVCORE_ASSIGN_OR_RETURN(const int slots, planner.num_state_slots(k));
    KVCORE_ASSIGN_OR_RETURN(const std::size_t slot, state.of(l));
    std::uint64_t all = 0;
    KVCORE_CHECK_OR_RETURN_ERROR(slots >= 0 && checked_mul(static_cast<std::uint64_t>(slots), slot, &all),
                                 InvalidArgument, "layer %d: %d state slots of %zu bytes overflow the address space",
                                 l, slots, slot);
    out->k_row_bytes = slot;
    out->v_row_bytes = 0;
    out->group = -1;
    out->state_group = k;
    out->policy = lc.policy;
    out->rows = slots;
    return Error::Ok;
  }
};

}  // namespace kvcore
