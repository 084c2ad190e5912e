// The backend and kinds of the builders kvcore ships, and how they register:
// each kind has its own header (sequence_builders.h, batch_builders.h), so a
// runner links only the caches it registers; default_builders.h registers both.
#pragma once

#include <memory>
#include <utility>

#include "kvcore/core/cache_base.h"
#include "kvcore/core/config.h"
#include "kvcore/core/status.h"
#include "kvcore/registry/cache_builder_registry.h"
#include "kvcore/registry/shared.h"

namespace kvcore {

/// The backend and kinds of the reference builders: one sequence
/// (SequenceCache) and many (BatchCache).
constexpr const char* kCpuBackend = "cpu";
constexpr const char* kSequenceKind = "sequence";
constexpr const char* kBatchKind = "batch";

namespace internal {

// Cache::create(cfg) as the shared CacheBase a builder returns: Cache's own
// errors pass through (InvalidArgument naming the bad config field,
// MemoryAllocationFailed), and MemoryAllocationFailed when the shared
// pointer's control block cannot be allocated.
template <class Cache>
Result<std::shared_ptr<CacheBase>> build_shared(const CacheConfig& cfg) noexcept {
  KVCORE_ASSIGN_OR_RETURN(std::unique_ptr<Cache> cache, Cache::create(cfg));
  KVCORE_ASSIGN_OR_RETURN(std::shared_ptr<Cache> shared, share(std::move(cache)));
  return std::shared_ptr<CacheBase>(std::move(shared));
}

// Registers (backend, kind) -> builder unless that pair already has a builder
// (a runner's own choice is never replaced): Ok either way;
// MemoryAllocationFailed when registering cannot allocate.
inline Status register_if_absent(CacheBuilderRegistry& registry, const char* backend, const char* kind,
                                 CacheBuilder builder) noexcept {
  Status status = registry.register_builder(backend, kind, std::move(builder));
  if (status.code() == Error::RegistrationAlreadyRegistered) return Error::Ok;
  return status;
}

}  // namespace internal
}  // namespace kvcore
