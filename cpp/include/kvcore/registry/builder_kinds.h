// The backend and kinds of the builders kvcore ships, and how they register:
// each kind has its own header (sequence_builders.h, batch_builders.h), so a
// runner links only the caches it registers; default_builders.h registers both.
#pragma once

#include <utility>

#include "kvcore/core/status.h"
#include "kvcore/registry/cache_builder_registry.h"

namespace kvcore {

/// The backend and kinds of the reference builders: one sequence
/// (SequenceCache) and many (BatchCache).
constexpr const char* kCpuBackend = "cpu";
constexpr const char* kSequenceKind = "sequence";
constexpr const char* kBatchKind = "batch";

namespace internal {

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
