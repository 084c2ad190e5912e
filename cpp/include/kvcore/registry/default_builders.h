// The builders kvcore ships, all kinds. Header-only code cannot register
// itself at load time, so a runner calls register_default_builders() once at
// start-up. A runner that wants one kind only includes sequence_builders.h or
// batch_builders.h and calls register_sequence_builders() or
// register_batch_builders(): it links only that kind's cache.
#pragma once

#include "kvcore/registry/batch_builders.h"
#include "kvcore/registry/builder_kinds.h"
#include "kvcore/registry/cache_builder_registry.h"
#include "kvcore/registry/registry_storage.h"
#include "kvcore/registry/sequence_builders.h"

namespace kvcore {

/// Registers both kinds: register_sequence_builders() then
/// register_batch_builders() (each leaves a pair that already has a builder
/// alone). Ok either way; MemoryAllocationFailed when registering cannot
/// allocate (the sequence builder may then be registered without the batch one).
inline Status register_default_builders(CacheBuilderRegistry& registry = global_builders()) noexcept {
  KVCORE_RETURN_IF_ERROR(register_sequence_builders(registry));
  return register_batch_builders(registry);
}

}  // namespace kvcore
