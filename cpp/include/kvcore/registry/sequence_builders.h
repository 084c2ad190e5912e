// The sequence builder, ("cpu", "sequence") -> SequenceCache, on its own: a
// runner that registers only sequence caches includes this header and calls
// register_sequence_builders() once at start-up, and links no BatchCache.
#pragma once

#include <memory>

#include "kvcore/core/sequence_cache.h"
#include "kvcore/registry/builder_kinds.h"
#include "kvcore/registry/cache_builder_registry.h"
#include "kvcore/registry/registry_storage.h"

namespace kvcore {

/// Builds a SequenceCache; its errors (InvalidArgument naming the bad config
/// field, MemoryAllocationFailed) pass through, and MemoryAllocationFailed when
/// the shared pointer's control block cannot be allocated.
inline Result<std::shared_ptr<CacheBase>> build_sequence_cache(const CacheConfig& cfg) noexcept {
  return internal::build_shared<SequenceCache>(cfg);
}

/// Registers (kCpuBackend, kSequenceKind) -> build_sequence_cache unless that
/// pair already has a builder (a runner's own choice is never replaced), so
/// every library of a process may call it. Ok either way;
/// MemoryAllocationFailed when registering cannot allocate.
inline Status register_sequence_builders(CacheBuilderRegistry& registry = global_builders()) noexcept {
  return internal::register_if_absent(registry, kCpuBackend, kSequenceKind, &build_sequence_cache);
}

}  // namespace kvcore
