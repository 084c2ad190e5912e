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
  Result<int> kept_states(int layer, const BatchStepPlan& plan, StepTokens tokens) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_state_layer(layer, "kept_states"));
    KVCORE_ASSIGN_OR_RETURN(const StateGroupPlan* sp, check_state_plan(layer, plan, "kept_states"));
    return check_writes(layer, plan, *sp, tokens, "kept_states");
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
  Status write_state(int layer, const BatchStepPlan& plan, StepTokens tokens, const void* states,
                     std::size_t bytes) noexcept {
    KVCORE_RETURN_IF_ERROR(check_state_layer(layer, "write_state"));
    KVCORE_ASSIGN_OR_RETURN(const StateGroupPlan* sp, check_state_plan(layer, plan, "write_state"));
    KVCORE_ASSIGN_OR_RETURN(const int kept, check_writes(layer, plan, *sp, tokens, "write_state"));
    const PagedLayer& stored = layers_[layer];
    KVCORE_RETURN_IF_ERROR(check_buffer(layer, "write_state", "states", states, bytes, kept,
                                        stored.k_row_bytes, /*exact=*/true));
    const std::size_t all = stored.k_row_bytes * static_cast<std::size_t>(stored.rows);
    KVCORE_CHECK_OR_RETURN_ERROR(disjoint(states, bytes, stored.k, all), InvalidArgument,
                                 "write_state of layer %d: the states overlap the layer's slots: pass a copy",
                                 layer);
    const unsigned char* in = static_cast<const unsigned char*>(states);
    for (int t = tokens.begin; t < tokens.end; ++t) {
      const int slot = sp->write_slots[t];
      if (slot < 0) continue;
      std::memcpy(stored.k + stored.k_row_bytes * static_cast<std::size_t>(slot), in, stored.k_row_bytes);
      in += stored.k_row_bytes;
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
  Status read_state(int layer, const BatchStepPlan& plan, int token, void* out,
                    std::size_t capacity) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_state_layer(layer, "read_state"));
    KVCORE_ASSIGN_OR_RETURN(const StateGroupPlan* sp, check_state_plan(layer, plan, "read_state"));
    const PagedLayer& stored = layers_[layer];
    KVCORE_CHECK_OR_RETURN_ERROR(token >= 0 && token < plan.n_tokens, InvalidArgument,
                                 "read_state of layer %d: token = %d: must be in [0, n_tokens = %d)", layer,
                                 token, plan.n_tokens);
    const int slot = sp->read_slots[token];
    KVCORE_CHECK_OR_RETURN_ERROR(slot >= -1 && slot < stored.rows, InvalidArgument,
                                 "read_state of layer %d: token %d's read slot %d must be -1 or in [0, "
                                 "num_slots = %d)",
                                 layer, token, slot, stored.rows);
    if (slot < 0) {
      KVCORE_CHECK_OR_RETURN_ERROR(plan.positions != nullptr, InvalidArgument,
                                   "read_state of layer %d: token %d reads no slot and the plan has no "
                                   "positions to tell position 0 (zeros) from a carried state",
                                   layer, token);
      KVCORE_CHECK_OR_RETURN_ERROR(plan.positions[token] == 0, InvalidArgument,
                                   "read_state of layer %d: token %d (position %d) reads no slot: the step "
                                   "keeps no state before it (a chain step without verify carries it within "
                                   "the forward from token %d)",
                                   layer, token, plan.positions[token], token - 1);
    }
    KVCORE_RETURN_IF_ERROR(check_buffer(layer, "read_state", "out", out, capacity, 1, stored.k_row_bytes,
                                        /*exact=*/false));
    if (slot < 0) {
      std::memset(out, 0, stored.k_row_bytes);
    } else {
      std::memmove(out, stored.k + stored.k_row_bytes * static_cast<std::size_t>(slot), stored.k_row_bytes);
    }
    return Error::Ok;
  }

  /// Physical slot `slot` of State layer `layer`, zero-copy:
  /// k_row_bytes bytes, for kernels that read and write slots themselves
  /// (vLLM / SGLang `state_indices`: the plan's StateGroupPlan read_slots and
  /// write_slots per token). Slot i of every layer is at state_slot(layer, 0)
  /// + i * k_row_bytes. Valid for the pool's life (a State layer never grows
  /// after creation). InvalidArgument: bad layer, not a State layer, slot
  /// outside [0, num_slots).
  Result<unsigned char*> state_slot(int layer, int slot) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_state_layer(layer, "state_slot"));
    const PagedLayer& stored = layers_[layer];
    KVCORE_CHECK_OR_RETURN_ERROR(slot >= 0 && slot < stored.rows, InvalidArgument,
                                 "state_slot of layer %d: slot = %d: must be in [0, num_slots = %d)", layer,
                                 slot, stored.rows);
    return stored.k + stored.k_row_bytes * static_cast<std::size_t>(slot);
  }

 protected:
  PagedStates(const BatchPlanner& planner, DType dtype, PoolAllocator allocator) noexcept
      : PagedStorage(planner, dtype, allocator) {}

 private:
  // The State layer's StateGroupPlan in `plan`, checked: its group present,
  // its slot count the pool's, its arrays set.
  Result<const StateGroupPlan*> check_state_plan(int layer, const BatchStepPlan& plan,
                                                 const char* what) const noexcept {
    const PagedLayer& stored = layers_[layer];
    const int k = stored.state_group;
    KVCORE_CHECK_OR_RETURN_ERROR(plan.n_state_groups > k && plan.state_groups != nullptr && plan.n_tokens >= 0,
                                 InvalidArgument,
                                 "%s of layer %d: the plan (%d State groups, %d tokens) lacks the layer's State "
                                 "group %d",
                                 what, layer, plan.n_state_groups, plan.n_tokens, k);
    const StateGroupPlan& sp = plan.state_groups[k];
    KVCORE_CHECK_OR_RETURN_ERROR(
        sp.num_slots == stored.rows && (plan.n_tokens == 0 || (sp.read_slots != nullptr && sp.write_slots != nullptr)),
        InvalidArgument,
        "%s of layer %d: State group %d's plan (num_slots %d, read_slots %s, write_slots %s) does not fit the "
        "layer's %d slots or lacks an array",
        what, layer, k, sp.num_slots, sp.read_slots != nullptr ? "set" : "null",
        sp.write_slots != nullptr ? "set" : "null", stored.rows);
    return &sp;
  }

  // Tokens inside the step, every write slot of them in [-1, num_slots);
  // returns how many are set.
  Result<int> check_writes(int layer, const BatchStepPlan& plan, const StateGroupPlan& sp, StepTokens tokens,
                           const char* what) const noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(tokens.begin >= 0 && tokens.begin <= tokens.end && tokens.end <= plan.n_tokens,
                                 InvalidArgument, "%s of layer %d: tokens [%d, %d) must lie in [0, n_tokens = %d]",
                                 what, layer, tokens.begin, tokens.end, plan.n_tokens);
    const int n_slots = layers_[layer].rows;
    int kept = 0;
    for (int t = tokens.begin; t < tokens.end; ++t) {
      const int slot = sp.write_slots[t];
      KVCORE_CHECK_OR_RETURN_ERROR(slot >= -1 && slot < n_slots, InvalidArgument,
                                   "%s of layer %d: token %d's write slot %d must be -1 or in [0, num_slots = %d)",
                                   what, layer, t, slot, n_slots);
      if (slot >= 0) ++kept;
    }
    return kept;
  }
};

}  // namespace kvcore
