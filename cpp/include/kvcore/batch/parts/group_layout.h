// GroupLayout: which group each layer of a BatchCache belongs to, fixed at
// create() from the config and read-only afterwards (docs/design.md sections 6
// and 9). The K/V layers of one policy form block groups of at most
// batch.page_layers layers each (0: the fewest layers any policy has, vLLM's
// rule), each group opened at its first layer; a Shared layer reads its
// source's group and holds no blocks; the State layers of one State policy
// form a State group, apart from the block groups (with batch.states_in_pool,
// State groups of at most page_layers layers, whose states live in the pool's
// pages: storage_layer() names where). Every group's blocks come
// from one pool, so group g's j-th K/V layer shares the storage of the first
// layer that is any group's j-th (storage_layer()). The cache's BlockGroup
// and StateGroup objects take their policies from here; the layer queries of the
// BatchPlanner face (group_of, state_group_of, layer_config, storage_layer)
// only read these tables. Every table is allocated once, at create().
#pragma once

#include "kvcore/core/buffer.h"
#include "kvcore/core/config.h"
#include "kvcore/core/result.h"

namespace kvcore {

class GroupLayout {
 public:
  GroupLayout() = default;
  GroupLayout(const GroupLayout&) = delete;
  GroupLayout& operator=(const GroupLayout&) = delete;

  /// Reads the layers of `cfg` (validated: validate_batch) and forms the
  /// State groups, the block groups (of at most cfg.batch.page_layers layers)
  /// and the shared storage. MemoryAllocationFailed (naming what): a table
  /// cannot be allocated; the layout stays unusable.
  Status create(const CacheConfig& cfg) noexcept {
    n_layers_ = cfg.n_layers;
    configs_ = internal::Buffer<LayerConfig>::make(n_layers_);
    layer_group_ = internal::Buffer<int>::make(n_layers_);
    group_layer_ = internal::Buffer<int>::make(n_layers_);  // at worst one group per layer
    layer_state_ = internal::Buffer<int>::make(n_layers_);
    storage_layer_ = internal::Buffer<int>::make(n_layers_);
    KVCORE_CHECK_OR_RETURN_ERROR(configs_ && layer_group_ && group_layer_ && layer_state_ && storage_layer_,
                                 MemoryAllocationFailed, "cannot allocate the layer tables of %d layers", n_layers_);
    states_in_pool_ = cfg.batch.states_in_pool;
    for (int l = 0; l < n_layers_; ++l) {
      configs_[l] = cfg.layer(l);
      const LayerPolicy& policy = configs_[l].policy;
      layer_group_[l] = -1;  // a K/V layer's group: form_groups()
      layer_state_[l] = -1;  // with states in the pool, form_groups() forms the State groups too
      if (policy.kind != LayerPolicy::Kind::State || states_in_pool_) continue;
      int first = 0;  // a State group, no blocks: the first earlier layer of the same policy's
      while (first < l && (layer_state_[first] < 0 || configs_[first].policy != policy)) ++first;
      layer_state_[l] = first < l ? layer_state_[first] : n_state_groups_++;
    }
    KVCORE_RETURN_IF_ERROR(form_groups(cfg.batch.page_layers));
    return share_storage();
  }

  /// Do the State groups draw their slots from the pool (batch.states_in_pool)?
  bool states_in_pool() const noexcept { return states_in_pool_; }

  /// Layers, block groups and State groups of the cache.
  int n_layers() const noexcept { return n_layers_; }
  int n_groups() const noexcept { return n_groups_; }
  int n_state_groups() const noexcept { return n_state_groups_; }

  /// Layer `layer`'s config. Precondition: a valid layer.
  const LayerConfig& config(int layer) const noexcept { return configs_[layer]; }
  /// Every layer's block group, -1 for a State layer ([n_layers()]).
  const int* layer_groups() const noexcept { return layer_group_.get(); }
  /// Every block group's first layer, whose bounds stand for the group's in
  /// an import ([n_groups()]).
  const int* group_layers() const noexcept { return group_layer_.get(); }
  /// Block group `group`'s policy: its first layer's. Precondition: a valid group.
  const LayerPolicy& group_policy(int group) const noexcept { return configs_[group_layer_[group]].policy; }
  /// Layer `layer`'s State group, -1 for a layer that is not a State layer.
  /// Precondition: a valid layer.
  int state_group(int layer) const noexcept { return layer_state_[layer]; }
  /// State group `k`'s first layer (a scan of the layers: for create()).
  /// Precondition: a valid State group.
  int state_layer(int k) const noexcept {
    int l = 0;
    while (layer_state_[l] != k) ++l;
    return l;
  }

  /// InvalidArgument unless `layer` is in [0, n_layers()).
  Status check_layer(int layer) const noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(layer >= 0 && layer < n_layers_, InvalidArgument,
                                 "layer = %d: must be in [0, n_layers = %d)", layer, n_layers_);
    return Error::Ok;
  }
  /// InvalidArgument unless `group` is in [0, n_groups()).
  Status check_group(int group) const noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(group >= 0 && group < n_groups_, InvalidArgument,
                                 "group = %d: must be in [0, n_groups = %d)", group, n_groups_);
    return Error::Ok;
  }

  /// BatchPlanner::group_of: the block group of `layer`. InvalidArgument: a
  /// bad layer, or a State layer (it has no block group).
  Result<int> group_of(int layer) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_layer(layer));
    KVCORE_CHECK_OR_RETURN_ERROR(layer_group_[layer] >= 0, InvalidArgument,
                                 "group_of(layer = %d): a State layer has no block group (state_group_of(%d) "
                                 "names its State group)",
                                 layer, layer);
    return layer_group_[layer];
  }
  /// BatchPlanner::state_group_of: the State group of `layer`.
  /// InvalidArgument: a bad layer, or a layer that is not a State layer.
  Result<int> state_group_of(int layer) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_layer(layer));
    KVCORE_CHECK_OR_RETURN_ERROR(layer_state_[layer] >= 0, InvalidArgument,
                                 "state_group_of(layer = %d): not a State layer (group_of(%d) names its group)",
                                 layer, layer);
    return layer_state_[layer];
  }
  /// BatchPlanner::layer_config. InvalidArgument: a bad layer.
  Result<LayerConfig> layer_config(int layer) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_layer(layer));
    return configs_[layer];
  }
  /// BatchPlanner::storage_layer: the layer whose storage the K/V rows of
  /// `layer` share (itself for a Shared layer, which holds none, and for a
  /// State layer whose states are not in the pool). A State layer of a cache
  /// with states in the pool: the layer whose pages hold its states, a K/V
  /// layer when one is any group's j-th as it is its State group's j-th,
  /// else the first State layer that is. InvalidArgument: a bad layer.
  Result<int> storage_layer(int layer) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_layer(layer));
    return storage_layer_[layer];
  }

 private:
  // The block groups: the K/V layers of one policy, in groups of at most
  // `page_layers` (0: the fewest layers any policy has, vLLM's rule), each
  // group opened at its first layer; a Shared layer reads its source's group.
  // With states in the pool the State layers of one policy form State groups
  // the same way (their states live in the pool's pages as K/V rows do).
  // Pages of one size (storage_layer_) leave no storage unused when the
  // groups have one size. MemoryAllocationFailed: a scratch table.
  Status form_groups(int page_layers) noexcept {
    auto policy_of = internal::Buffer<int>::make(n_layers_);      // per layer: its policy's index
    auto first = internal::Buffer<int>::make(n_layers_);          // per policy: its first layer
    auto count = internal::Buffer<int>::make_zeroed(n_layers_);   // per policy: its layers
    auto open = internal::Buffer<int>::make(n_layers_);           // per policy: the group filling now
    auto filled = internal::Buffer<int>::make_zeroed(n_layers_);  // per policy: layers in that group
    KVCORE_CHECK_OR_RETURN_ERROR(policy_of && first && count && open && filled, MemoryAllocationFailed,
                                 "cannot allocate the group tables of %d layers", n_layers_);
    int n_policies = 0;
    for (int l = 0; l < n_layers_; ++l) {
      if (!paged(l)) continue;
      int c = 0;
      while (c < n_policies && configs_[first[c]].policy != configs_[l].policy) ++c;
      if (c == n_policies) first[n_policies++] = l;
      policy_of[l] = c;
      ++count[c];
    }
    int size = page_layers;
    if (size == 0)
      for (int c = 0; c < n_policies; ++c) size = size == 0 || count[c] < size ? count[c] : size;
    for (int c = 0; c < n_policies; ++c) open[c] = -1;
    for (int l = 0; l < n_layers_; ++l) {
      const LayerPolicy& policy = configs_[l].policy;
      if (policy.kind == LayerPolicy::Kind::Shared) {  // reads its source's group, holds no blocks
        layer_group_[l] = layer_group_[policy.source];
        continue;
      }
      if (!paged(l)) continue;
      const int c = policy_of[l];
      const bool state = policy.kind == LayerPolicy::Kind::State;
      if (open[c] < 0 || filled[c] == size) {
        open[c] = state ? n_state_groups_++ : n_groups_;
        filled[c] = 0;
        if (!state) group_layer_[n_groups_++] = l;
      }
      (state ? layer_state_[l] : layer_group_[l]) = open[c];
      ++filled[c];
    }
    return Error::Ok;
  }

  // Does layer l take pages of the pool: a K/V layer, or a State layer when
  // the states are in the pool?
  bool paged(int l) const noexcept {
    const LayerPolicy& policy = configs_[l].policy;
    return policy.holds_keys() || (states_in_pool_ && policy.kind == LayerPolicy::Kind::State);
  }

  // storage_layer_: group g's j-th K/V layer to the first layer that is any
  // group's j-th (Shared layers hold no K/V rows: themselves). With states in
  // the pool, State group k's j-th layer to that K/V layer too (its states
  // live in its pages), else to the first State layer that is a State
  // group's j-th; without, State layers keep their own slots: themselves.
  // MemoryAllocationFailed: a scratch table.
  Status share_storage() noexcept {
    auto count = internal::Buffer<int>::make_zeroed(n_groups_ > 0 ? n_groups_ : 1);  // K/V layers per group so far
    auto first = internal::Buffer<int>::make(n_layers_);                           // slot j: its first layer
    KVCORE_CHECK_OR_RETURN_ERROR(count && first, MemoryAllocationFailed,
                                 "cannot allocate the storage tables of %d layers", n_layers_);
    int slots = 0;
    for (int l = 0; l < n_layers_; ++l) {
      storage_layer_[l] = l;
      if (!configs_[l].policy.holds_keys()) continue;
      const int j = count[layer_group_[l]]++;
      if (j == slots) first[slots++] = l;
      storage_layer_[l] = first[j];
    }
    if (!states_in_pool_) return Error::Ok;
    auto state_count = internal::Buffer<int>::make_zeroed(n_state_groups_ > 0 ? n_state_groups_ : 1);  // per State group
    KVCORE_CHECK_OR_RETURN_ERROR(state_count, MemoryAllocationFailed, "cannot allocate the storage tables of %d layers",
                                 n_layers_);
    for (int l = 0; l < n_layers_; ++l) {  // after every K/V layer: a K/V layer owns a storage it shares
      if (layer_state_[l] < 0) continue;
      const int j = state_count[layer_state_[l]]++;
      if (j == slots) first[slots++] = l;
      storage_layer_[l] = first[j];
    }
    return Error::Ok;
  }

  int n_layers_ = 0;
  int n_groups_ = 0;
  int n_state_groups_ = 0;
  bool states_in_pool_ = false;
  internal::Buffer<LayerConfig> configs_;
  internal::Buffer<int> layer_group_;    // per layer: its block group, -1 (State)
  internal::Buffer<int> group_layer_;    // per block group: its first layer
  internal::Buffer<int> layer_state_;    // per layer: its State group, -1
  internal::Buffer<int> storage_layer_;  // per layer: the layer whose storage its K/V rows share
};

}  // namespace kvcore
