// The batch builder, ("cpu", "batch") -> BatchCache, on its own: a runner
// that serves many sequences calls register_batch_builders() once at start-up
// (register_default_builders() in default_builders.h registers it too).
#pragma once

#include <memory>

#include "kvcore/batch/batch_cache.h"
#include "kvcore/registry/builder_kinds.h"
#include "kvcore/registry/cache_builder_registry.h"
#include "kvcore/registry/registry_storage.h"

namespace kvcore {

/// Builds a BatchCache from cfg (its BatchLimits included); errors as
/// BatchCache::create, and MemoryAllocationFailed for the control block.
inline Result<std::shared_ptr<CacheBase>> build_batch_cache(const CacheConfig& cfg) noexcept {
  return internal::build_shared<BatchCache>(cfg);
}

/// Registers (kCpuBackend, kBatchKind) -> build_batch_cache unless that pair
/// already has a builder (a runner's own choice is never replaced), so every
/// library of a process may call it. Ok either way; MemoryAllocationFailed
/// when registering cannot allocate.
inline Status register_batch_builders(CacheBuilderRegistry& registry = global_builders()) noexcept {
  return internal::register_if_absent(registry, kCpuBackend, kBatchKind, &build_batch_cache);
}

}  // namespace kvcore
