// LayerPolicies: which LayoutPolicy object each layer of a SequenceCache
// plans through (identical layer policies share one object, so a step plans
// each distinct policy once), what each policy's rows still hold (its share of
// the held ints LayoutPolicy::note_* keep: a window's oldest position, a State
// layer's slot table) and its plan of the begun step. Built once, through
// nothrow new; nothing on the step path allocates.
#pragma once

#include <cstddef>
#include <memory>
#include <new>

#include "kvcore/core/buffer.h"
#include "kvcore/core/chunked_policy.h"
#include "kvcore/core/config.h"
#include "kvcore/core/flat_policy.h"
#include "kvcore/core/ring_policy.h"
#include "kvcore/core/shared_policy.h"
#include "kvcore/core/state_policy.h"

namespace kvcore {

class LayerPolicies {
 public:
  LayerPolicies() = default;
  LayerPolicies(const LayerPolicies&) = delete;
  LayerPolicies& operator=(const LayerPolicies&) = delete;

  /// Builds the tables of `n_layers` layers whose configs are layers[l] (or
  /// layers[0] for every layer when n_entries == 1, a broadcast config), for
  /// steps of at most `max_step` on `capacity` positions (a validated
  /// config's). MemoryAllocationFailed naming what: a partial build is freed
  /// with the object.
  Status build(const LayerConfig* layers, std::size_t n_entries, int n_layers, int max_step,
               int capacity) noexcept {
    n_layers_ = n_layers;
    configs_ = internal::Buffer<LayerConfig>::make(n_layers);
    policy_of_ = internal::Buffer<int>::make(n_layers);
    // Sized for the worst case, one distinct policy per layer.
    policies_ = internal::Buffer<std::unique_ptr<LayoutPolicy>>::make(n_layers);
    KVCORE_CHECK_OR_RETURN_ERROR(configs_ != nullptr && policy_of_ != nullptr && policies_ != nullptr,
                                 MemoryAllocationFailed, "cannot allocate the policy tables of %d layers", n_layers);
    for (int l = 0; l < n_layers; ++l) {
      configs_[l] = layers[n_entries == 1 ? 0 : l];
      const LayerPolicy lp = configs_[l].policy;
      int index = 0;
      while (index < n_ && policies_[index]->policy() != lp) ++index;
      if (index == n_) {
        policies_[index] = make_policy(lp, max_step, capacity);
        KVCORE_CHECK_OR_RETURN_ERROR(policies_[index] != nullptr, MemoryAllocationFailed,
                                     "cannot allocate the policy of layer %d", l);
        n_held_ += policies_[index]->held_ints();
        ++n_;
      }
      policy_of_[l] = index;
    }
    held_ = internal::Buffer<int>::make(n_held_);
    held_offset_ = internal::Buffer<int>::make(n_);
    step_plans_ = internal::Buffer<SeqStepPlan>::make(n_);
    KVCORE_CHECK_OR_RETURN_ERROR(held_ != nullptr && held_offset_ != nullptr && step_plans_ != nullptr,
                                 MemoryAllocationFailed, "cannot allocate the step state of %d policies", n_);
    for (int i = 0, offset = 0; i < n_; offset += policies_[i]->held_ints(), ++i) {
      held_offset_[i] = offset;
      policies_[i]->reset_held(held(i));
    }
    return Error::Ok;
  }

  /// Distinct policy objects.
  int size() const noexcept { return n_; }
  /// The policy object `layer` plans through. Precondition: 0 <= layer < n_layers.
  int of(int layer) const noexcept { return policy_of_[layer]; }
  /// Policy object i. Precondition: 0 <= i < size().
  LayoutPolicy& operator[](int i) const noexcept { return *policies_[i]; }
  /// Every policy object, [0, size()) (a commit's row copies are planned over them).
  const std::unique_ptr<LayoutPolicy>* objects() const noexcept { return policies_.get(); }
  /// Layer `layer`'s config, broadcast resolved; every layer's in configs().
  const LayerConfig& config(int layer) const noexcept { return configs_[layer]; }
  const LayerConfig* configs() const noexcept { return configs_.get(); }
  /// The first layer planning through policy i, -1 when none (messages name it).
  int first_layer_of(int i) const noexcept {
    for (int l = 0; l < n_layers_; ++l)
      if (policy_of_[l] == i) return l;
    return -1;
  }

  /// Policy i's share of the held bookkeeping.
  int* held(int i) noexcept { return held_.get() + held_offset_[i]; }
  const int* held(int i) const noexcept { return held_.get() + held_offset_[i]; }
  /// Policy i's plan of the begun step (plans are pure: computed once a step).
  SeqStepPlan& step_plan(int i) noexcept { return step_plans_[i]; }
  const SeqStepPlan& step_plan(int i) const noexcept { return step_plans_[i]; }

  /// Takes `other`'s held bookkeeping and step plans (tables built from the
  /// same configs: a clone's).
  void copy_state_from(const LayerPolicies& other) noexcept {
    for (int i = 0; i < n_held_; ++i) held_[i] = other.held_[i];
    for (int i = 0; i < n_; ++i) step_plans_[i] = other.step_plans_[i];
  }

 private:
  // nullptr when the allocation fails. A Shared layer's source (an earlier
  // layer, validate() checked) has its policy already.
  std::unique_ptr<LayoutPolicy> make_policy(const LayerPolicy& lp, int max_step, int capacity) const noexcept {
    LayoutPolicy* made = nullptr;
    switch (lp.kind) {
      case LayerPolicy::Kind::Ring:
        made = new (std::nothrow) RingPolicy(lp.window, lp.sinks, max_step, capacity);
        break;
      case LayerPolicy::Kind::Chunked:
        made = new (std::nothrow) ChunkedPolicy(lp.window, max_step, capacity);
        break;
      case LayerPolicy::Kind::Shared:
        made = new (std::nothrow) SharedPolicy(*policies_[policy_of_[lp.source]], lp.source);
        break;
      case LayerPolicy::Kind::State:
        made = new (std::nothrow) StatePolicy(lp.slots);
        break;
      default:
        made = new (std::nothrow) FlatPolicy(capacity);
    }
    return std::unique_ptr<LayoutPolicy>(made);
  }

  int n_layers_ = 0;
  int n_ = 0;       // distinct policies: the first n_ of policies_ are set
  int n_held_ = 0;  // ints of held bookkeeping over every policy
  internal::Buffer<std::unique_ptr<LayoutPolicy>> policies_;
  internal::Buffer<LayerConfig> configs_;     // per layer, broadcast resolved
  internal::Buffer<int> policy_of_;           // per layer: index into policies_
  internal::Buffer<int> held_;                // what the rows hold (LayoutPolicy::note_*), per policy
  internal::Buffer<int> held_offset_;         // per policy: where its share of held_ starts
  internal::Buffer<SeqStepPlan> step_plans_;  // per policy: its plan of the begun step
};

}  // namespace kvcore
