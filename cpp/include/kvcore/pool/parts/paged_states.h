// PagedStates: the State layers' verbs of a PagedKVPool (paged_kv_pool.h):
// each State layer holds its State group's physical slots, indexed as the
// plan's StateGroupPlan read_slots / write_slots name them (vLLM / SGLang
// `state_indices`); write_state / read_state copy states in and out, state_slot
// hands a kernel a slot in place. The K/V verbs refuse a State layer, these
// the other kinds, by name.
#pragma once

#include <cstddef>
#include <cstring>

#include "kvcore/batch/batch_plan.h"
#include "kvcore/core/result.h"
#include "kvcore/pool/parts/paged_storage.h"

namespace kvcore {

/// PagedStorage plus the State layers' verbs.
class PagedStates : public PagedStorage {
 public:
  /// Tokens [begin, end) of a step, in the plan's token order.
  struct StepTokens {
    int begin = 0;
    int end = 0;
  };

  /// Entry `entry`'s tokens [query_starts[entry], query_starts[entry + 1]).
  /// InvalidArgument: entry outside [0, n_entries), no query_starts, or
  /// starts outside [0, n_tokens].
  static Result<StepTokens> entry_tokens(const BatchStepPlan& plan, int entry) noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(entry >= 0 && entry < plan.n_entries && plan.query_starts != nullptr,
                                 InvalidArgument, "entry = %d: must be in [0, n_entries = %d) of a plan with "
                                 "query_starts", entry, plan.n_entries);
    const StepTokens t{plan.query_starts[entry], plan.query_starts[entry + 1]};
    KVCORE_CHECK_OR_RETURN_ERROR(t.begin >= 0 && t.begin <= t.end && t.end <= plan.n_tokens, InvalidArgument,
                                 "entry %d: tokens [%d, %d) must lie in [0, n_tokens = %d)", entry, t.begin,
                                 t.end, plan.n_tokens);
    return t;
  }

  /// States write_state(layer, plan, tokens, ...) takes: the tokens of
  /// [tokens.begin, tokens.end) whose write slot is set (every token of a
  /// verify step or a tree, the last of a chain step without verify). Errors
  /// as write_state, without the states.
  Result<int> kept_states(int layer_index, const BatchStepPlan& plan, StepTokens tokens) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_state_layer(layer_index, "kept_states"));
    KVCORE_ASSIGN_OR_RETURN(const StateGroupPlan* sp, check_state_plan(layer_index, plan, "kept_states"));
    return check_writes(layer_index, plan, *sp, tokens, "kept_states");
  }

  /// Copies the states the step keeps for tokens [tokens.begin, tokens.end)
  /// into their slots: the i-th of `states` (k_row_bytes bytes each; exactly
  /// kept_states() of them, in token order) goes to the physical slot
  /// write_slots[t] of the i-th token t of the range whose write slot is set,
  /// i.e. the state after t's position; tokens whose write slot is -1 take
  /// none. InvalidArgument (nothing written): bad layer, not a State layer, a
  /// plan without the layer's State group, with another num_slots or lacking
  /// its arrays, tokens outside [0, n_tokens], a write slot outside [-1,
  /// num_slots), `states` null or not exactly kept_states() slots, or
  /// overlapping the layer's slots (pass a copy).
  Status write_state(int layer_index, const BatchStepPlan& plan, StepTokens tokens, const void* states,
                     std::size_t bytes) noexcept {
    KVCORE_RETURN_IF_ERROR(check_state_layer(layer_index, "write_state"));
    KVCORE_ASSIGN_OR_RETURN(const StateGroupPlan* sp, check_state_plan(layer_index, plan, "write_state"));
    KVCORE_ASSIGN_OR_RETURN(const int kept, check_writes(layer_index, plan, *sp, tokens, "write_state"));
    const PagedLayer& layer = layers_[layer_index];
    KVCORE_RETURN_IF_ERROR(check_buffer(layer_index, "write_state", "states", states, bytes, kept,
                                        layer.k_row_bytes, /*exact=*/true));
    const std::size_t all = layer.k_row_bytes * static_cast<std::size_t>(layer.rows);
    KVCORE_CHECK_OR_RETURN_ERROR(disjoint(states, bytes, layer.k, all), InvalidArgument,
                                 "write_state of layer %d: the states overlap the layer's slots: pass a copy",
                                 layer_index);
    const unsigned char* in = static_cast<const unsigned char*>(states);
    for (int t = tokens.begin; t < tokens.end; ++t) {
      const int slot = sp->write_slots[t];
      if (slot < 0) continue;
      std::memcpy(layer.k + layer.k_row_bytes * static_cast<std::size_t>(slot), in, layer.k_row_bytes);
      in += layer.k_row_bytes;
    }
    return Error::Ok;
  }

  /// Copies the state step token `token` starts from into `out` (at least
  /// k_row_bytes bytes): the slot read_slots[token] names (the state after
  /// position - 1: an entry's first token's, a tree node's parent's, a kept
  /// previous token's), or zeros for a token at position 0. Read it before
  /// write_state() (an entry may write the slot it reads). InvalidArgument
  /// (nothing written): bad layer, not a State layer, a plan as write_state
  /// refuses, token outside [0, n_tokens), a read slot outside [-1,
  /// num_slots), a token past position 0 whose read slot is -1 (its state is
  /// carried within the forward from the previous token: the step does not
  /// keep it), a plan without positions for such a token, `out` null or too
  /// small.
  Status read_state(int layer_index, const BatchStepPlan& plan, int token, void* out,
                    std::size_t capacity) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_state_layer(layer_index, "read_state"));
    KVCORE_ASSIGN_OR_RETURN(const StateGroupPlan* sp, check_state_plan(layer_index, plan, "read_state"));
    const PagedLayer& layer = layers_[layer_index];
    KVCORE_CHECK_OR_RETURN_ERROR(token >= 0 && token < plan.n_tokens, InvalidArgument,
                                 "read_state of layer %d: token = %d: must be in [0, n_tokens = %d)", layer_index,
                                 token, plan.n_tokens);
    const int slot = sp->read_slots[token];
    KVCORE_CHECK_OR_RETURN_ERROR(slot >= -1 && slot < layer.rows, InvalidArgument,
                                 "read_state of layer %d: token %d's read slot %d must be -1 or in [0, "
                                 "num_slots = %d)",
                                 layer_index, token, slot, layer.rows);
    if (slot < 0) {
      KVCORE_CHECK_OR_RETURN_ERROR(plan.positions != nullptr, InvalidArgument,
                                   "read_state of layer %d: token %d reads no slot and the plan has no "
                                   "positions to tell position 0 (zeros) from a carried state",
                                   layer_index, token);
      KVCORE_CHECK_OR_RETURN_ERROR(plan.positions[token] == 0, InvalidArgument,
                                   "read_state of layer %d: token %d (position %d) reads no slot: the step "
                                   "keeps no state before it (a chain step without verify carries it within "
                                   "the forward from token %d)",
                                   layer_index, token, plan.positions[token], token - 1);
    }
    KVCORE_RETURN_IF_ERROR(check_buffer(layer_index, "read_state", "out", out, capacity, 1, layer.k_row_bytes,
                                        /*exact=*/false));
    if (slot < 0) {
      std::memset(out, 0, layer.k_row_bytes);
    } else {
      std::memmove(out, layer.k + layer.k_row_bytes * static_cast<std::size_t>(slot), layer.k_row_bytes);
    }
    return Error::Ok;
  }

  /// Physical slot `slot` of State layer `layer_index`, zero-copy:
  /// k_row_bytes bytes, for kernels that read and write slots themselves
  /// (vLLM / SGLang `state_indices`: the plan's StateGroupPlan read_slots and
  /// write_slots per token). Slot i of every layer is at state_slot(layer, 0)
  /// + i * k_row_bytes. Valid for the pool's life (a State layer never grows
  /// after creation). InvalidArgument: bad layer, not a State layer, slot
  /// outside [0, num_slots).
  Result<unsigned char*> state_slot(int layer_index, int slot) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_state_layer(layer_index, "state_slot"));
    const PagedLayer& layer = layers_[layer_index];
    KVCORE_CHECK_OR_RETURN_ERROR(slot >= 0 && slot < layer.rows, InvalidArgument,
                                 "state_slot of layer %d: slot = %d: must be in [0, num_slots = %d)", layer_index,
                                 slot, layer.rows);
    return layer.k + layer.k_row_bytes * static_cast<std::size_t>(slot);
  }

 protected:
  PagedStates(const BatchPlanner& planner, DType dtype, PoolAllocator allocator) noexcept
      : PagedStorage(planner, dtype, allocator) {}

 private:
  // The State layer's StateGroupPlan in `plan`, checked: its group present,
  // its slot count the pool's, its arrays set.
  Result<const StateGroupPlan*> check_state_plan(int layer_index, const BatchStepPlan& plan,
                                                 const char* what) const noexcept {
    const PagedLayer& layer = layers_[layer_index];
    const int k = layer.state_group;
    KVCORE_CHECK_OR_RETURN_ERROR(plan.n_state_groups > k && plan.state_groups != nullptr && plan.n_tokens >= 0,
                                 InvalidArgument,
                                 "%s of layer %d: the plan (%d State groups, %d tokens) lacks the layer's State "
                                 "group %d",
                                 what, layer_index, plan.n_state_groups, plan.n_tokens, k);
    const StateGroupPlan& sp = plan.state_groups[k];
    KVCORE_CHECK_OR_RETURN_ERROR(
        sp.num_slots == layer.rows && (plan.n_tokens == 0 || (sp.read_slots != nullptr && sp.write_slots != nullptr)),
        InvalidArgument,
        "%s of layer %d: State group %d's plan (num_slots %d, read_slots %s, write_slots %s) does not fit the "
        "layer's %d slots or lacks an array",
        what, layer_index, k, sp.num_slots, sp.read_slots != nullptr ? "set" : "null",
        sp.write_slots != nullptr ? "set" : "null", layer.rows);
    return &sp;
  }

  // Tokens inside the step, every write slot of them in [-1, num_slots);
  // returns how many are set.
  Result<int> check_writes(int layer_index, const BatchStepPlan& plan, const StateGroupPlan& sp, StepTokens tokens,
                           const char* what) const noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(tokens.begin >= 0 && tokens.begin <= tokens.end && tokens.end <= plan.n_tokens,
                                 InvalidArgument, "%s of layer %d: tokens [%d, %d) must lie in [0, n_tokens = %d]",
                                 what, layer_index, tokens.begin, tokens.end, plan.n_tokens);
    const int n_slots = layers_[layer_index].rows;
    int kept = 0;
    for (int t = tokens.begin; t < tokens.end; ++t) {
      const int slot = sp.write_slots[t];
      KVCORE_CHECK_OR_RETURN_ERROR(slot >= -1 && slot < n_slots, InvalidArgument,
                                   "%s of layer %d: token %d's write slot %d must be -1 or in [0, num_slots = %d)",
                                   what, layer_index, t, slot, n_slots);
      if (slot >= 0) ++kept;
    }
    return kept;
  }
};

}  // namespace kvcore
