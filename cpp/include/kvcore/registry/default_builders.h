// The builders kvcore ships. Header-only code cannot register itself at load
// time, so a runner calls register_default_builders() once at start-up.
#pragma once

#include <memory>

#include "kvcore/core/sequence_cache.h"
#include "kvcore/registry/cache_builder_registry.h"
#include "kvcore/registry/registry_storage.h"
#include "kvcore/registry/shared.h"

namespace kvcore {

/// The backend and kind of the reference SequenceCache builder.
constexpr const char* kCpuBackend = "cpu";
constexpr const char* kSequenceKind = "sequence";

/// Builds a SequenceCache; its errors (InvalidArgument naming the bad config
/// field, MemoryAllocationFailed) pass through, and MemoryAllocationFailed when
/// the shared pointer's control block cannot be allocated.
inline Result<std::shared_ptr<CacheBase>> build_sequence_cache(const CacheConfig& cfg) noexcept {
  KVCORE_ASSIGN_OR_RETURN(std::unique_ptr<SequenceCache> cache, SequenceCache::create(cfg));
  KVCORE_ASSIGN_OR_RETURN(std::shared_ptr<SequenceCache> shared, share(std::move(cache)));
  return std::shared_ptr<CacheBase>(std::move(shared));
}

/// Registers (kCpuBackend, kSequenceKind) -> build_sequence_cache unless that
/// pair already has a builder (a runner's own choice is never replaced), so
/// every library of a process may call it. Ok either way;
/// MemoryAllocationFailed when registering cannot allocate.
inline Status register_default_builders(CacheBuilderRegistry& registry = global_builders()) noexcept {
  Status status = registry.register_builder(kCpuBackend, kSequenceKind, &build_sequence_cache);
  if (status.code() == Error::RegistrationAlreadyRegistered) return Error::Ok;
  return status;
}

}  // namespace kvcore
