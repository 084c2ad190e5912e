// The builders kvcore ships. Header-only code cannot register itself at load
// time, so a runner calls register_default_builders() once at start-up.
#pragma once

#include <memory>

#include "kvcore/batch/batch_cache.h"
#include "kvcore/core/sequence_cache.h"
#include "kvcore/registry/cache_builder_registry.h"
#include "kvcore/registry/registry_storage.h"
#include "kvcore/registry/shared.h"

namespace kvcore {

/// The backend and kinds of the reference builders: one sequence
/// (SequenceCache) and many (BatchCache).
constexpr const char* kCpuBackend = "cpu";
constexpr const char* kSequenceKind = "sequence";
constexpr const char* kBatchKind = "batch";

/// Builds a SequenceCache; its errors (InvalidArgument naming the bad config
/// field, MemoryAllocationFailed) pass through, and MemoryAllocationFailed when
/// the shared pointer's control block cannot be allocated.
inline Result<std::shared_ptr<CacheBase>> build_sequence_cache(const CacheConfig& cfg) noexcept {
  KVCORE_ASSIGN_OR_RETURN(std::unique_ptr<SequenceCache> cache, SequenceCache::create(cfg));
  KVCORE_ASSIGN_OR_RETURN(std::shared_ptr<SequenceCache> shared, share(std::move(cache)));
  return std::shared_ptr<CacheBase>(std::move(shared));
}

/// Builds a BatchCache from cfg (its BatchLimits included); errors as
/// BatchCache::create, and MemoryAllocationFailed for the control block.
inline Result<std::shared_ptr<CacheBase>> build_batch_cache(const CacheConfig& cfg) noexcept {
  KVCORE_ASSIGN_OR_RETURN(std::unique_ptr<BatchCache> cache, BatchCache::create(cfg));
  KVCORE_ASSIGN_OR_RETURN(std::shared_ptr<BatchCache> shared, share(std::move(cache)));
  return std::shared_ptr<CacheBase>(std::move(shared));
}

/// Registers (kCpuBackend, kSequenceKind) -> build_sequence_cache and
/// (kCpuBackend, kBatchKind) -> build_batch_cache, each unless that pair
/// already has a builder (a runner's own choice is never replaced), so every
/// library of a process may call it. Ok either way; MemoryAllocationFailed when
/// registering cannot allocate.
inline Status register_default_builders(CacheBuilderRegistry& registry = global_builders()) noexcept {
  Status status = registry.register_builder(kCpuBackend, kSequenceKind, &build_sequence_cache);
  if (!status.ok() && status.code() != Error::RegistrationAlreadyRegistered) return status;
  status = registry.register_builder(kCpuBackend, kBatchKind, &build_batch_cache);
  if (status.code() == Error::RegistrationAlreadyRegistered) return Error::Ok;
  return status;
}

}  // namespace kvcore
