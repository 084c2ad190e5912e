// CacheRegistry: caches found by key. A runner installs a cache, a backend
// (often in another library) finds it by the key it was handed, and a session
// erases it when done. Values are shared pointers, so a holder keeps its cache
// alive after an erase: erasing while a backend is mid-step is safe.
//
// Thread-safe: every method locks one mutex for a table operation only.
// Nothing user-written runs under the lock (a cache's destructor runs after
// unlock), so a destructor may itself use the registry. Installing allocates
// (the key's copy, table growth), always through nothrow paths: a failure is
// MemoryAllocationFailed and changes nothing. It is runtime glue, never on the
// per-step path. The process-wide registry is global_caches() (registry_storage.h).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string_view>
#include <utility>

#include "kvcore/core/cache_base.h"
#include "kvcore/core/result.h"
#include "kvcore/registry/key.h"
#include "kvcore/registry/table.h"

namespace kvcore {

class CacheRegistry {
 public:
  CacheRegistry() = default;
  CacheRegistry(const CacheRegistry&) = delete;
  CacheRegistry& operator=(const CacheRegistry&) = delete;

  /// Installs `cache` under `key`; never overwrites.
  /// InvalidArgument: empty key or null cache. RegistrationAlreadyRegistered: key
  /// taken. MemoryAllocationFailed: the key's copy or the table's growth failed.
  Status install(std::string_view key, std::shared_ptr<CacheBase> cache) noexcept {
    KVCORE_RETURN_IF_ERROR(check_key("install", key));
    KVCORE_CHECK_OR_RETURN_ERROR(cache != nullptr, InvalidArgument,
                                 "install(key '%s'): cache is null", key);
    KVCORE_ASSIGN_OR_RETURN(Key owned, Key::copy_of(key));
    std::lock_guard<std::mutex> lock(mutex_);
    const std::size_t at = lower_bound(key);
    KVCORE_CHECK_OR_RETURN_ERROR(!holds(at, key), RegistrationAlreadyRegistered,
                                 "install(key '%s'): key is already taken", key);
    return entries_.insert(at, Entry{std::move(owned), std::move(cache)});
  }

  /// Installs `cache` under a fresh key made from `prefix` (see make_unique_key)
  /// and returns the key; choosing and installing happen under one lock.
  /// InvalidArgument: null cache. MemoryAllocationFailed: as install().
  Result<Key> install_unique(std::string_view prefix, std::shared_ptr<CacheBase> cache) noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(cache != nullptr, InvalidArgument,
                                 "install_unique(prefix '%s'): cache is null", prefix);
    std::lock_guard<std::mutex> lock(mutex_);
    KVCORE_ASSIGN_OR_RETURN(Key key, next_free_key(prefix));
    KVCORE_ASSIGN_OR_RETURN(Key stored, Key::copy_of(key.view()));
    KVCORE_RETURN_IF_ERROR(entries_.insert(lower_bound(key.view()), Entry{std::move(stored), std::move(cache)}));
    return key;
  }

  /// The cache under `key`, or null when there is none.
  std::shared_ptr<CacheBase> get(std::string_view key) const noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::size_t at = lower_bound(key);
    return holds(at, key) ? entries_[at].cache : nullptr;
  }

  /// The cache under `key`. NotFound when there is none.
  Result<std::shared_ptr<CacheBase>> find(std::string_view key) const noexcept {
    std::shared_ptr<CacheBase> cache = get(key);
    KVCORE_CHECK_OR_RETURN_ERROR(cache != nullptr, NotFound,
                                 "no cache is installed under key '%s'", key);
    return cache;
  }

  bool contains(std::string_view key) const noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    return holds(lower_bound(key), key);
  }

  /// Removes `key`. Holders of the cache keep it alive. InvalidArgument: empty
  /// key. NotFound: no such key.
  Status erase(std::string_view key) noexcept { return erase_impl("erase", key, nullptr); }

  /// Removes `key` only while it still holds `expected`, so an owner never
  /// erases a cache someone else installed under a reused key.
  /// NotFound: no such key, or it holds another cache.
  Status erase_if_same(std::string_view key, const CacheBase* expected) noexcept {
    return erase_impl("erase_if_same", key, expected);
  }

  /// Installed keys, sorted. MemoryAllocationFailed: the copies cannot be allocated.
  Result<Table<Key>> keys() const noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    Table<Key> out;
    KVCORE_RETURN_IF_ERROR(out.reserve(entries_.size()));
    for (const Entry& e : entries_) {
      KVCORE_ASSIGN_OR_RETURN(Key copy, Key::copy_of(e.key.view()));
      KVCORE_RETURN_IF_ERROR(out.push_back(std::move(copy)));
    }
    return out;
  }

  std::size_t size() const noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    return entries_.size();
  }

  /// "prefix#N" ("cache#N" for an empty prefix) with N from a counter under the
  /// lock, skipping keys installed right now: distinct across threads and calls.
  /// It reserves nothing; install_unique() picks and installs atomically.
  /// MemoryAllocationFailed: the key cannot be allocated.
  Result<Key> make_unique_key(std::string_view prefix) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    return next_free_key(prefix);
  }

 private:
  struct Entry {
    Key key;
    std::shared_ptr<CacheBase> cache;
  };

  static Status check_key(const char* what, std::string_view key) noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(!key.empty(), InvalidArgument, "%s: key is empty", what);
    return Error::Ok;
  }

  // Caller holds mutex_. The first entry whose key is not less than `key`.
  std::size_t lower_bound(std::string_view key) const noexcept {
    const Entry* at = std::partition_point(entries_.begin(), entries_.end(),
                                           [key](const Entry& e) { return e.key.view() < key; });
    return static_cast<std::size_t>(at - entries_.begin());
  }
  bool holds(std::size_t at, std::string_view key) const noexcept {
    return at < entries_.size() && entries_[at].key.view() == key;
  }

  // Caller holds mutex_.
  Result<Key> next_free_key(std::string_view prefix) noexcept {
    const std::string_view stem = prefix.empty() ? std::string_view("cache") : prefix;
    for (;;) {
      char counter[24];
      const int n = std::snprintf(counter, sizeof(counter), "#%llu",
                                  static_cast<unsigned long long>(++last_id_));
      KVCORE_ASSIGN_OR_RETURN(Key key, Key::concat(stem, std::string_view(counter, static_cast<std::size_t>(n))));
      if (!holds(lower_bound(key.view()), key.view())) return key;
    }
  }

  Status erase_impl(const char* what, std::string_view key, const CacheBase* expected) noexcept {
    KVCORE_RETURN_IF_ERROR(check_key(what, key));
    Entry doomed;  // dies after the unlock
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const std::size_t at = lower_bound(key);
      KVCORE_CHECK_OR_RETURN_ERROR(holds(at, key), NotFound,
                                   "%s(key '%s'): no cache is installed under that key", what, key);
      KVCORE_CHECK_OR_RETURN_ERROR(expected == nullptr || entries_[at].cache.get() == expected,
                                   NotFound, "%s(key '%s'): the key now holds another cache", what,
                                   key);
      doomed = entries_.take(at);
    }
    return Error::Ok;
  }

  mutable std::mutex mutex_;
  Table<Entry> entries_;     // sorted by key
  std::uint64_t last_id_ = 0;  // guarded by mutex_, so keys are unique across threads
};

}  // namespace kvcore
