// CacheSession: a cache installed in a registry for as long as the session
// lives. The runner creates one, hands key() to the backend (which finds the
// cache by that key), and the destructor erases the key. Move-only.
//
// A session is owned by one thread at a time; the registry it talks to is
// thread-safe. The cache outlives the session while anyone still holds it.
#pragma once

#include <memory>
#include <string_view>
#include <utility>

#include "kvcore/core/cache_base.h"
#include "kvcore/core/config.h"
#include "kvcore/core/result.h"
#include "kvcore/registry/cache_builder_registry.h"
#include "kvcore/registry/cache_registry.h"
#include "kvcore/registry/key.h"
#include "kvcore/registry/registry_storage.h"

namespace kvcore {

class CacheSession {
 public:
  /// Builds a cache with the builder of (backend_id, kind) and installs it
  /// under a fresh key "backend_id/kind#N". Errors of build() pass through;
  /// MemoryAllocationFailed: the key cannot be allocated (the cache is dropped).
  static Result<CacheSession> create(std::string_view backend_id, std::string_view kind,
                                     const CacheConfig& cfg,
                                     CacheRegistry& registry = global_caches(),
                                     const CacheBuilderRegistry& builders = global_builders()) {
    KVCORE_ASSIGN_OR_RETURN(std::shared_ptr<CacheBase> cache, builders.build(backend_id, kind, cfg));
    KVCORE_ASSIGN_OR_RETURN(Key backend_slash, Key::concat(backend_id, "/"));
    KVCORE_ASSIGN_OR_RETURN(Key prefix, Key::concat(backend_slash.view(), kind));
    return adopt(std::move(cache), prefix.view(), registry);
  }

  /// Installs an existing cache under a fresh key "key_prefix#N".
  /// InvalidArgument: null cache. MemoryAllocationFailed: as install_unique().
  static Result<CacheSession> adopt(std::shared_ptr<CacheBase> cache,
                                    std::string_view key_prefix = "session",
                                    CacheRegistry& registry = global_caches()) noexcept {
    KVCORE_ASSIGN_OR_RETURN(Key key, registry.install_unique(key_prefix, cache));
    return CacheSession(&registry, std::move(key), std::move(cache));
  }

  CacheSession(CacheSession&& other) noexcept
      : registry_(std::exchange(other.registry_, nullptr)),
        key_(std::move(other.key_)),
        cache_(std::move(other.cache_)) {}
  CacheSession& operator=(CacheSession&& other) noexcept {
    if (this != &other) {
      if (active()) (void)end();
      registry_ = std::exchange(other.registry_, nullptr);
      key_ = std::move(other.key_);
      cache_ = std::move(other.cache_);
    }
    return *this;
  }
  CacheSession(const CacheSession&) = delete;
  CacheSession& operator=(const CacheSession&) = delete;
  ~CacheSession() {
    if (active()) (void)end();
  }

  /// The key the cache is installed under (NUL-terminated: key().data() is a C
  /// string); empty once moved from or ended.
  std::string_view key() const noexcept { return key_.view(); }
  /// The cache (null once moved from). Stays valid after end().
  const std::shared_ptr<CacheBase>& cache() const noexcept { return cache_; }
  /// Runner face; null when the cache has none or the session was moved from.
  SequenceControl* control() const noexcept { return cache_ ? cache_->as_control() : nullptr; }
  /// Backend face; null when the cache has none or the session was moved from.
  SequencePlanner* planner() const noexcept { return cache_ ? cache_->as_planner() : nullptr; }
  /// True while the key is installed by this session.
  bool active() const noexcept { return registry_ != nullptr; }

  /// Erases the key now (the destructor then does nothing). Ok; NotFound when
  /// someone else erased the key or reused it for another cache (that cache is
  /// left alone); InvalidState when the session already ended.
  Status end() noexcept {
    if (registry_ == nullptr) return Status::make(Error::InvalidState, "the session already ended");
    CacheRegistry* registry = std::exchange(registry_, nullptr);
    Status status = registry->erase_if_same(key_.view(), cache_.get());
    key_ = Key();
    return status;
  }

 private:
  CacheSession(CacheRegistry* registry, Key key, std::shared_ptr<CacheBase> cache) noexcept
      : registry_(registry), key_(std::move(key)), cache_(std::move(cache)) {}

  CacheRegistry* registry_ = nullptr;
  Key key_;
  std::shared_ptr<CacheBase> cache_;
};

}  // namespace kvcore
