// KVPoolStates: the State layers' verbs of a KVPool (kv_pool.h): a State
// layer holds D state slots of a size the caller gives, allocated in full at
// creation; write_state / read_state copy the step's states in and out as the
// State layer's plan names them, state_slot hands a kernel a slot in place.
// The K/V verbs refuse a State layer, these the other kinds, by name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kvcore/core/config.h"
#include "kvcore/core/geometry.h"
#include "kvcore/core/plan.h"
#include "kvcore/core/result.h"
#include "kvcore/pool/parts/kv_pool_storage.h"

namespace kvcore {

/// KVPoolStorage plus the State layers' verbs.
class KVPoolStates : public KVPoolStorage {
 public:
  /// Copies the step's states into the slots `plan` (the State layer's plan
  /// of the step) writes: input slot j (k_row_bytes bytes each; `bytes`
  /// exactly write_len() slots) goes to the j-th written slot, i.e. the state
  /// after position write[..].pos + j. InvalidArgument (nothing written): bad
  /// layer, not a State layer, a write run outside the slots [0, D), `states`
  /// null or not exactly write_len() slots, or overlapping the layer's slots
  /// (pass a copy).
  Status write_state(int layer, const SeqStepPlan& plan, const void* states,
                     std::size_t bytes) noexcept {
    KVCORE_RETURN_IF_ERROR(check_state_layer(layer, "write_state"));
    KVCORE_ASSIGN_OR_RETURN(const Extent extent,
                            check_runs(layer, plan.write, plan.n_write,
                                       SeqStepPlan::kMaxWriteRuns, "write"));
    const PoolLayer& stored = layers_[layer];
    KVCORE_RETURN_IF_ERROR(check_state_input(stored, layer, "write_state", states, bytes, extent.rows));
    const unsigned char* in = static_cast<const unsigned char*>(states);
    for (int i = 0; i < plan.n_write; ++i) {
      const Run& run = plan.write[i];
      const std::size_t n = stored.k_row_bytes * static_cast<std::size_t>(run.len);
      std::memcpy(stored.k + stored.k_row_bytes * static_cast<std::size_t>(run.row), in, n);
      in += n;
    }
    return Error::Ok;
  }

  /// Copies the state `plan`'s step starts from into `out` (at least
  /// k_row_bytes bytes): the slot its read run names (the state after P - 1),
  /// or zeros when the plan reads none (P = 0: a state starts at zeros). Read
  /// it before write_state(): a step without verify may write its last state
  /// into that slot. InvalidArgument: bad layer, not a State layer, a read run
  /// outside the slots [0, D), a plan reading more than one slot, `out` null
  /// or too small.
  Status read_state(int layer, const SeqStepPlan& plan, void* out, std::size_t capacity) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_state_layer(layer, "read_state"));
    KVCORE_ASSIGN_OR_RETURN(const Extent extent,
                            check_runs(layer, plan.read, plan.n_read, SeqStepPlan::kMaxReadRuns, "read"));
    KVCORE_CHECK_OR_RETURN_ERROR(extent.rows <= 1, InvalidArgument,
                                 "read_state of layer %d: the plan reads %lld slots: a step starts from "
                                 "one state (none at position 0)",
                                 layer, static_cast<long long>(extent.rows));
    const PoolLayer& stored = layers_[layer];
    KVCORE_RETURN_IF_ERROR(check_buffer(layer, "read_state", "out", out, capacity, 1, stored.k_row_bytes,
                                        /*exact=*/false));
    if (plan.n_read == 0) {
      std::memset(out, 0, stored.k_row_bytes);
    } else {
      std::memmove(out, stored.k + stored.k_row_bytes * static_cast<std::size_t>(plan.read[0].row),
                   stored.k_row_bytes);
    }
    return Error::Ok;
  }

  /// Slot `slot` of State layer `layer`, zero-copy: k_row_bytes bytes
  /// for a kernel that reads and writes slots itself (vLLM-style
  /// state_indices: the plan's read run's row is the slot it starts from, its
  /// write runs' rows the slots it fills, in order). Valid for the pool's life
  /// (a State layer never grows after creation). InvalidArgument: bad layer,
  /// not a State layer, slot outside [0, D).
  Result<unsigned char*> state_slot(int layer, int slot) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_state_layer(layer, "state_slot"));
    const PoolLayer& stored = layers_[layer];
    KVCORE_CHECK_OR_RETURN_ERROR(slot >= 0 && slot < stored.rows, InvalidArgument,
                                 "state_slot of layer %d: slot = %d: must be in [0, D = %d)", layer, slot,
                                 stored.rows);
    return stored.k + stored.k_row_bytes * static_cast<std::size_t>(slot);
  }

  /// InvalidArgument unless `states` (`bytes`) are exactly `slots` states of
  /// State layer `layer` and share no byte with its slots (`what` names the verb).
  static Status check_state_input(const PoolLayer& stored, int layer, const char* what, const void* states,
                                  std::size_t bytes, std::int64_t slots) noexcept {
    KVCORE_RETURN_IF_ERROR(
        check_buffer(layer, what, "states", states, bytes, slots, stored.k_row_bytes, /*exact=*/true));
    const std::size_t all = stored.k_row_bytes * static_cast<std::size_t>(stored.rows);
    KVCORE_CHECK_OR_RETURN_ERROR(disjoint(states, bytes, stored.k, all), InvalidArgument,
                                 "%s of layer %d: the states overlap the layer's slots: pass a copy", what,
                                 layer);
    return Error::Ok;
  }

 protected:
  KVPoolStates(DType dtype, PoolAllocator allocator) noexcept : KVPoolStorage(dtype, allocator) {}
};

}  // namespace kvcore
