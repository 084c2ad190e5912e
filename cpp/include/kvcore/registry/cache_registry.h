// CacheRegistry: caches found by key. A runner installs a cache, a backend
// (often in another library) finds it by the key it was handed, and a session
// erases it when done. Values are shared pointers, so a holder keeps its cache
// alive after an erase: erasing while a backend is mid-step is safe.
//
// Thread-safe: every method locks one mutex for a map operation only. Nothing
// user-written runs under the lock (a cache's destructor runs after unlock),
// so a destructor may itself use the registry. Installing allocates; it is
// runtime glue, never on the per-step path.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvcore/core/cache_base.h"
#include "kvcore/core/result.h"

namespace kvcore {

class CacheRegistry {
 public:
  CacheRegistry() = default;
  CacheRegistry(const CacheRegistry&) = delete;
  CacheRegistry& operator=(const CacheRegistry&) = delete;

  /// The process-wide registry. Which storage backs it (one per library, or one
  /// per process across libraries) is chosen in registry_storage.h.
  static CacheRegistry& global() noexcept;

  /// Installs `cache` under `key`; never overwrites.
  /// InvalidArgument: empty key or null cache. RegistrationAlreadyRegistered: key taken.
  Status install(std::string_view key, std::shared_ptr<CacheBase> cache) {
    KVCORE_RETURN_IF_ERROR(check_key("install", key));
    KVCORE_CHECK_OR_RETURN_ERROR(cache != nullptr, InvalidArgument,
                                 "install(key '%.*s'): cache is null", printable(key), text(key));
    std::lock_guard<std::mutex> lock(mutex_);
    KVCORE_CHECK_OR_RETURN_ERROR(caches_.find(key) == caches_.end(), RegistrationAlreadyRegistered,
                                 "install(key '%.*s'): key is already taken", printable(key),
                                 text(key));
    caches_.emplace(std::string(key), std::move(cache));
    return Error::Ok;
  }

  /// Installs `cache` under a fresh key made from `prefix` (see make_unique_key)
  /// and returns the key; choosing and installing happen under one lock.
  /// InvalidArgument: null cache.
  Result<std::string> install_unique(std::string_view prefix, std::shared_ptr<CacheBase> cache) {
    KVCORE_CHECK_OR_RETURN_ERROR(cache != nullptr, InvalidArgument,
                                 "install_unique(prefix '%.*s'): cache is null", printable(prefix),
                                 text(prefix));
    std::lock_guard<std::mutex> lock(mutex_);
    std::string key = next_free_key(prefix);
    caches_.emplace(key, std::move(cache));
    return key;
  }

  /// The cache under `key`, or null when there is none.
  std::shared_ptr<CacheBase> get(std::string_view key) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = caches_.find(key);
    return it == caches_.end() ? nullptr : it->second;
  }

  /// The cache under `key`. NotFound when there is none.
  Result<std::shared_ptr<CacheBase>> find(std::string_view key) const {
    std::shared_ptr<CacheBase> cache = get(key);
    KVCORE_CHECK_OR_RETURN_ERROR(cache != nullptr, NotFound, "no cache is installed under key '%.*s'",
                                 printable(key), text(key));
    return cache;
  }

  bool contains(std::string_view key) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return caches_.find(key) != caches_.end();
  }

  /// Removes `key`. Holders of the cache keep it alive. NotFound: no such key.
  Status erase(std::string_view key) { return erase_impl("erase", key, nullptr); }

  /// Removes `key` only while it still holds `expected`, so an owner never
  /// erases a cache someone else installed under a reused key.
  /// NotFound: no such key, or it holds another cache.
  Status erase_if_same(std::string_view key, const CacheBase* expected) {
    return erase_impl("erase_if_same", key, expected);
  }

  /// Installed keys, sorted.
  std::vector<std::string> keys() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::string> out;
    out.reserve(caches_.size());
    for (const auto& entry : caches_) out.push_back(entry.first);
    return out;
  }

  std::size_t size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return caches_.size();
  }

  /// "prefix#N" ("cache#N" for an empty prefix) with N from a counter under the lock,
  /// skipping keys installed right now: distinct across threads and calls. It
  /// reserves nothing; install_unique() picks and installs atomically.
  std::string make_unique_key(std::string_view prefix) {
    std::lock_guard<std::mutex> lock(mutex_);
    return next_free_key(prefix);
  }

 private:
  // printf's %.*s takes an int length; keys longer than that are cut in messages only.
  static int printable(std::string_view s) noexcept {
    return s.size() > 4096 ? 4096 : static_cast<int>(s.size());
  }

  // Never null, so "%.*s" is defined even for an empty view.
  static const char* text(std::string_view s) noexcept { return s.empty() ? "" : s.data(); }

  static Status check_key(const char* what, std::string_view key) noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(!key.empty(), InvalidArgument, "%s: key is empty", what);
    return Error::Ok;
  }

  // Caller holds mutex_.
  std::string next_free_key(std::string_view prefix) {
    const std::string stem = std::string(prefix.empty() ? std::string_view("cache") : prefix) + "#";
    for (;;) {
      std::string key = stem + std::to_string(++last_id_);
      if (caches_.find(key) == caches_.end()) return key;
    }
  }

  Status erase_impl(const char* what, std::string_view key, const CacheBase* expected) {
    KVCORE_RETURN_IF_ERROR(check_key(what, key));
    std::shared_ptr<CacheBase> doomed;  // dies after the unlock
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = caches_.find(key);
      KVCORE_CHECK_OR_RETURN_ERROR(it != caches_.end(), NotFound,
                                   "%s(key '%.*s'): no cache is installed under that key", what,
                                   printable(key), text(key));
      KVCORE_CHECK_OR_RETURN_ERROR(expected == nullptr || it->second.get() == expected, NotFound,
                                   "%s(key '%.*s'): the key now holds another cache", what,
                                   printable(key), text(key));
      doomed = std::move(it->second);
      caches_.erase(it);
    }
    return Error::Ok;
  }

  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<CacheBase>, std::less<>> caches_;
  std::uint64_t last_id_ = 0;  // guarded by mutex_, so keys are unique across threads
};

}  // namespace kvcore

// global() is defined with the storage it returns.
#include "kvcore/registry/registry_storage.h"
