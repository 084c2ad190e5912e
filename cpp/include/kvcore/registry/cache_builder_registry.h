// CacheBuilderRegistry: how to make a cache, keyed by (backend_id, kind), e.g.
// ("cpu", "sequence"). A runner asks for a cache by backend and kind without
// knowing the concrete class; backends register what they can build.
//
// A builder is a plain function pointer plus optional shared state (a small
// type-erased callable without std::function). build() copies the builder
// under the lock and calls it after unlocking, so a builder may itself use
// this registry (or a cache registry), and unregistering while a build runs
// is safe: the running call keeps its state alive.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvcore/core/cache_base.h"
#include "kvcore/core/config.h"
#include "kvcore/core/result.h"

namespace kvcore {

/// A cache factory: `fn(state, cfg)`. `state` is owned by a shared pointer so
/// copies of the builder (one per running build) keep it alive.
class CacheBuilder {
 public:
  using Function = Result<std::shared_ptr<CacheBase>> (*)(void* state, const CacheConfig& cfg);
  using PlainFunction = Result<std::shared_ptr<CacheBase>> (*)(const CacheConfig& cfg);

  CacheBuilder() = default;
  /// A stateless builder; no allocation.
  CacheBuilder(PlainFunction fn) noexcept : plain_(fn) {}  // NOLINT: implicit on purpose
  /// A builder with state; `state` may be null.
  CacheBuilder(Function fn, std::shared_ptr<void> state) noexcept
      : fn_(fn), state_(std::move(state)) {}

  /// Wraps any callable `Result<std::shared_ptr<CacheBase>>(const CacheConfig&)`
  /// (e.g. a capturing lambda). Allocates one copy of it, once.
  template <typename F>
  static CacheBuilder from_callable(F f) {
    auto state = std::make_shared<F>(std::move(f));
    return CacheBuilder(
        [](void* s, const CacheConfig& cfg) -> Result<std::shared_ptr<CacheBase>> {
          return (*static_cast<F*>(s))(cfg);
        },
        std::shared_ptr<void>(std::move(state)));
  }

  explicit operator bool() const noexcept { return plain_ != nullptr || fn_ != nullptr; }

  /// Calls the builder. Precondition: it is not empty.
  Result<std::shared_ptr<CacheBase>> operator()(const CacheConfig& cfg) const {
    if (plain_ != nullptr) return plain_(cfg);
    return fn_(state_.get(), cfg);
  }

 private:
  PlainFunction plain_ = nullptr;
  Function fn_ = nullptr;
  std::shared_ptr<void> state_;
};

class CacheBuilderRegistry {
 public:
  CacheBuilderRegistry() = default;
  CacheBuilderRegistry(const CacheBuilderRegistry&) = delete;
  CacheBuilderRegistry& operator=(const CacheBuilderRegistry&) = delete;

  /// The process-wide builder registry (storage chosen in registry_storage.h).
  static CacheBuilderRegistry& global() noexcept;

  /// InvalidArgument: empty backend_id or kind, or an empty builder.
  /// RegistrationAlreadyRegistered: (backend_id, kind) already has a builder.
  Status register_builder(std::string_view backend_id, std::string_view kind,
                          CacheBuilder builder) {
    KVCORE_RETURN_IF_ERROR(check_names("register_builder", backend_id, kind));
    KVCORE_CHECK_OR_RETURN_ERROR(static_cast<bool>(builder), InvalidArgument,
                                 "register_builder(backend '%.*s', kind '%.*s'): builder is empty",
                                 printable(backend_id), text(backend_id), printable(kind), text(kind));
    std::lock_guard<std::mutex> lock(mutex_);
    KVCORE_CHECK_OR_RETURN_ERROR(
        builders_.find(Names{backend_id, kind}) == builders_.end(), RegistrationAlreadyRegistered,
        "register_builder(backend '%.*s', kind '%.*s'): a builder is already registered",
        printable(backend_id), text(backend_id), printable(kind), text(kind));
    builders_.emplace(Key{std::string(backend_id), std::string(kind)}, std::move(builder));
    return Error::Ok;
  }

  /// NotFound: no builder for (backend_id, kind). The builder's state is
  /// released after the unlock (and after any build still running with it).
  Status unregister_builder(std::string_view backend_id, std::string_view kind) {
    KVCORE_RETURN_IF_ERROR(check_names("unregister_builder", backend_id, kind));
    CacheBuilder doomed;  // dies after the unlock
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = builders_.find(Names{backend_id, kind});
      KVCORE_CHECK_OR_RETURN_ERROR(
          it != builders_.end(), NotFound,
          "unregister_builder: no builder for (backend '%.*s', kind '%.*s')",
          printable(backend_id), text(backend_id), printable(kind), text(kind));
      doomed = std::move(it->second);
      builders_.erase(it);
    }
    return Error::Ok;
  }

  bool contains(std::string_view backend_id, std::string_view kind) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return builders_.find(Names{backend_id, kind}) != builders_.end();
  }

  /// Registered (backend_id, kind) pairs, sorted.
  std::vector<std::pair<std::string, std::string>> keys() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::pair<std::string, std::string>> out;
    out.reserve(builders_.size());
    for (const auto& entry : builders_) out.push_back(entry.first);
    return out;
  }

  std::size_t size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return builders_.size();
  }

  /// Builds a cache with the builder of (backend_id, kind), called outside the lock.
  /// InvalidArgument: empty names, or `cfg` breaks a rule of validate() (builders
  /// only ever see valid configs). NotFound: no such builder. A builder's own
  /// error passes through unchanged. Internal: the builder returned null.
  Result<std::shared_ptr<CacheBase>> build(std::string_view backend_id, std::string_view kind,
                                           const CacheConfig& cfg) const {
    KVCORE_RETURN_IF_ERROR(check_names("build", backend_id, kind));
    CacheBuilder builder;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = builders_.find(Names{backend_id, kind});
      KVCORE_CHECK_OR_RETURN_ERROR(it != builders_.end(), NotFound,
                                   "build: no builder for (backend '%.*s', kind '%.*s')",
                                   printable(backend_id), text(backend_id), printable(kind),
                                   text(kind));
      builder = it->second;
    }
    KVCORE_RETURN_IF_ERROR(validate(cfg));
    Result<std::shared_ptr<CacheBase>> built = builder(cfg);
    if (!built.ok()) return built;
    KVCORE_CHECK_OR_RETURN_ERROR(built.get() != nullptr, Internal,
                                 "build: the builder for (backend '%.*s', kind '%.*s') returned a "
                                 "null cache",
                                 printable(backend_id), text(backend_id), printable(kind),
                                 text(kind));
    return built;
  }

 private:
  using Key = std::pair<std::string, std::string>;
  using Names = std::pair<std::string_view, std::string_view>;

  // Compares owned keys and borrowed names alike, so lookups never allocate.
  struct KeyLess {
    using is_transparent = void;
    template <typename A, typename B>
    bool operator()(const A& a, const B& b) const noexcept {
      return Names{a.first, a.second} < Names{b.first, b.second};
    }
  };

  static int printable(std::string_view s) noexcept {
    return s.size() > 4096 ? 4096 : static_cast<int>(s.size());
  }
  static const char* text(std::string_view s) noexcept { return s.empty() ? "" : s.data(); }

  static Status check_names(const char* what, std::string_view backend_id,
                            std::string_view kind) noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(!backend_id.empty(), InvalidArgument, "%s: backend_id is empty",
                                 what);
    KVCORE_CHECK_OR_RETURN_ERROR(!kind.empty(), InvalidArgument,
                                 "%s(backend '%.*s'): kind is empty", what, printable(backend_id),
                                 text(backend_id));
    return Error::Ok;
  }

  mutable std::mutex mutex_;
  std::map<Key, CacheBuilder, KeyLess> builders_;
};

}  // namespace kvcore

// global() is defined with the storage it returns.
#include "kvcore/registry/registry_storage.h"
