// CacheBuilderRegistry: how to make a cache, keyed by (backend_id, kind), e.g.
// ("cpu", "sequence"). A runner asks for a cache by backend and kind without
// knowing the concrete class; backends register what they can build.
//
// A builder is a plain function pointer plus optional shared state (a small
// type-erased callable without std::function). build() copies the builder
// under the lock and calls it after unlocking, so a builder may itself use
// this registry (or a cache registry), and unregistering while a build runs
// is safe: the running call keeps its state alive. Registering allocates
// through nothrow paths only (MemoryAllocationFailed, nothing changed). The
// process-wide registry is global_builders() (registry_storage.h).
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <mutex>
#include <new>
#include <string_view>
#include <utility>

#include "kvcore/core/cache_base.h"
#include "kvcore/core/config.h"
#include "kvcore/core/result.h"
#include "kvcore/registry/key.h"
#include "kvcore/registry/shared.h"
#include "kvcore/registry/table.h"

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
  /// (e.g. a capturing lambda), moved into one allocation made here.
  /// MemoryAllocationFailed: that allocation failed.
  template <typename F>
  static Result<CacheBuilder> from_callable(F f) noexcept {
    std::unique_ptr<F> state(new (std::nothrow) F(std::move(f)));
    KVCORE_CHECK_OR_RETURN_ERROR(state != nullptr, MemoryAllocationFailed,
                                 "cannot allocate a builder's state of %zu bytes", sizeof(F));
    KVCORE_ASSIGN_OR_RETURN(std::shared_ptr<F> shared, share(std::move(state)));
    return CacheBuilder(
        [](void* s, const CacheConfig& cfg) -> Result<std::shared_ptr<CacheBase>> {
          return (*static_cast<F*>(s))(cfg);
        },
        std::shared_ptr<void>(std::move(shared)));
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

/// A registered (backend_id, kind) pair.
struct BuilderName {
  Key backend_id;
  Key kind;
};

class CacheBuilderRegistry {
 public:
  CacheBuilderRegistry() = default;
  CacheBuilderRegistry(const CacheBuilderRegistry&) = delete;
  CacheBuilderRegistry& operator=(const CacheBuilderRegistry&) = delete;

  /// InvalidArgument: empty backend_id or kind, or an empty builder.
  /// RegistrationAlreadyRegistered: (backend_id, kind) already has a builder.
  /// MemoryAllocationFailed: the names' copies or the table's growth failed.
  Status register_builder(std::string_view backend_id, std::string_view kind,
                          CacheBuilder builder) noexcept {
    KVCORE_RETURN_IF_ERROR(check_names("register_builder", backend_id, kind));
    KVCORE_CHECK_OR_RETURN_ERROR(static_cast<bool>(builder), InvalidArgument,
                                 "register_builder(backend '%s', kind '%s'): builder is empty",
                                 backend_id, kind);
    KVCORE_ASSIGN_OR_RETURN(Key owned_backend, Key::copy_of(backend_id));
    KVCORE_ASSIGN_OR_RETURN(Key owned_kind, Key::copy_of(kind));
    std::lock_guard<std::mutex> lock(mutex_);
    const std::size_t at = lower_bound(backend_id, kind);
    KVCORE_CHECK_OR_RETURN_ERROR(
        !holds(at, backend_id, kind), RegistrationAlreadyRegistered,
        "register_builder(backend '%s', kind '%s'): a builder is already registered", backend_id,
        kind);
    return entries_.insert(
        at, Entry{BuilderName{std::move(owned_backend), std::move(owned_kind)}, std::move(builder)});
  }

  /// InvalidArgument: empty names. NotFound: no builder for (backend_id, kind).
  /// The builder's state is released after the unlock (and after any build
  /// still running with it).
  Status unregister_builder(std::string_view backend_id, std::string_view kind) noexcept {
    KVCORE_RETURN_IF_ERROR(check_names("unregister_builder", backend_id, kind));
    Entry doomed;  // dies after the unlock
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const std::size_t at = lower_bound(backend_id, kind);
      KVCORE_CHECK_OR_RETURN_ERROR(holds(at, backend_id, kind), NotFound,
                                   "unregister_builder: no builder for (backend '%s', kind '%s')",
                                   backend_id, kind);
      doomed = entries_.take(at);
    }
    return Error::Ok;
  }

  bool contains(std::string_view backend_id, std::string_view kind) const noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    return holds(lower_bound(backend_id, kind), backend_id, kind);
  }

  /// Registered (backend_id, kind) pairs, sorted. MemoryAllocationFailed: the
  /// copies cannot be allocated.
  Result<Table<BuilderName>> keys() const noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    Table<BuilderName> out;
    KVCORE_RETURN_IF_ERROR(out.reserve(entries_.size()));
    for (const Entry& e : entries_) {
      KVCORE_ASSIGN_OR_RETURN(Key backend, Key::copy_of(e.name.backend_id.view()));
      KVCORE_ASSIGN_OR_RETURN(Key kind, Key::copy_of(e.name.kind.view()));
      KVCORE_RETURN_IF_ERROR(out.push_back(BuilderName{std::move(backend), std::move(kind)}));
    }
    return out;
  }

  std::size_t size() const noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    return entries_.size();
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
      const std::size_t at = lower_bound(backend_id, kind);
      KVCORE_CHECK_OR_RETURN_ERROR(holds(at, backend_id, kind), NotFound,
                                   "build: no builder for (backend '%s', kind '%s')", backend_id,
                                   kind);
      builder = entries_[at].builder;  // copies a shared_ptr: no allocation
    }
    KVCORE_RETURN_IF_ERROR(validate(cfg));
    Result<std::shared_ptr<CacheBase>> built = builder(cfg);
    if (!built.ok()) return built;
    KVCORE_CHECK_OR_RETURN_ERROR(built.get() != nullptr, Internal,
                                 "build: the builder for (backend '%s', kind '%s') returned a "
                                 "null cache",
                                 backend_id, kind);
    return built;
  }

 private:
  struct Entry {
    BuilderName name;
    CacheBuilder builder;
  };

  static Status check_names(const char* what, std::string_view backend_id,
                            std::string_view kind) noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(!backend_id.empty(), InvalidArgument, "%s: backend_id is empty",
                                 what);
    KVCORE_CHECK_OR_RETURN_ERROR(!kind.empty(), InvalidArgument, "%s(backend '%s'): kind is empty",
                                 what, backend_id);
    return Error::Ok;
  }

  static bool less(const BuilderName& a, std::string_view backend_id, std::string_view kind) noexcept {
    const int c = a.backend_id.view().compare(backend_id);
    return c < 0 || (c == 0 && a.kind.view() < kind);
  }

  // Caller holds mutex_. The first entry not less than (backend_id, kind).
  std::size_t lower_bound(std::string_view backend_id, std::string_view kind) const noexcept {
    const Entry* at = std::partition_point(entries_.begin(), entries_.end(), [&](const Entry& e) {
      return less(e.name, backend_id, kind);
    });
    return static_cast<std::size_t>(at - entries_.begin());
  }
  bool holds(std::size_t at, std::string_view backend_id, std::string_view kind) const noexcept {
    return at < entries_.size() && entries_[at].name.backend_id.view() == backend_id &&
           entries_[at].name.kind.view() == kind;
  }

  mutable std::mutex mutex_;
  Table<Entry> entries_;  // sorted by (backend_id, kind)
};

}  // namespace kvcore
