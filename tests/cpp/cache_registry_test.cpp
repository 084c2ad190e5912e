// CacheRegistry: install/get/find/erase, duplicate and missing keys, unique
// keys across threads, and concurrent install/erase/get with no lost or
// duplicated entry.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kvcore/registry/cache_registry.h"
#include "kvcore/registry/registry_storage.h"
#include "support/registry_text.h"

namespace kvcore {
namespace {

// A cache that records its own destruction and may touch a registry while dying.
struct ProbeCache : CacheBase {
  explicit ProbeCache(int tag = 0, CacheRegistry* touch = nullptr, bool* destroyed = nullptr)
      : tag(tag), touch(touch), destroyed(destroyed) {}
  ~ProbeCache() override {
    if (touch != nullptr) seen_size_in_destructor = static_cast<int>(touch->size());
    if (destroyed != nullptr) *destroyed = true;
  }
  int tag;
  CacheRegistry* touch;
  bool* destroyed;
  static int seen_size_in_destructor;
};
int ProbeCache::seen_size_in_destructor = -1;

std::shared_ptr<CacheBase> probe(int tag = 0) { return std::make_shared<ProbeCache>(tag); }

TEST(CacheRegistry, InstallGetFindErase) {
  CacheRegistry reg;
  auto cache = probe(7);
  ASSERT_EQ(reg.install("runner/a", cache), Error::Ok);
  EXPECT_EQ(reg.size(), 1u);
  EXPECT_TRUE(reg.contains("runner/a"));
  EXPECT_EQ(reg.get("runner/a"), cache);
  auto found = reg.find("runner/a");
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(found.get(), cache);
  EXPECT_EQ(kvcore_test::texts(reg.keys()), std::vector<std::string>{"runner/a"});

  ASSERT_EQ(reg.erase("runner/a"), Error::Ok);
  EXPECT_EQ(reg.size(), 0u);
  EXPECT_EQ(reg.get("runner/a"), nullptr);
  EXPECT_FALSE(reg.contains("runner/a"));
}

TEST(CacheRegistry, DuplicateKeyIsRefusedAndKeepsTheFirstCache) {
  CacheRegistry reg;
  auto first = probe(1);
  auto second = probe(2);
  ASSERT_EQ(reg.install("k", first), Error::Ok);
  Status s = reg.install("k", second);
  EXPECT_EQ(s.code(), Error::RegistrationAlreadyRegistered);
  EXPECT_NE(std::strstr(s.message().c_str(), "'k'"), nullptr) << s.message().c_str();
  EXPECT_EQ(reg.get("k"), first);
  EXPECT_EQ(reg.size(), 1u);
}

TEST(CacheRegistry, MissingKeyIsNotFound) {
  CacheRegistry reg;
  ASSERT_EQ(reg.install("present", probe()), Error::Ok);
  EXPECT_EQ(reg.get("absent"), nullptr);
  auto found = reg.find("absent");
  EXPECT_EQ(found.error(), Error::NotFound);
  EXPECT_NE(std::strstr(found.message().c_str(), "'absent'"), nullptr) << found.message().c_str();
  Status erased = reg.erase("absent");
  EXPECT_EQ(erased.code(), Error::NotFound);
  EXPECT_NE(std::strstr(erased.message().c_str(), "'absent'"), nullptr) << erased.message().c_str();
  EXPECT_EQ(kvcore_test::texts(reg.keys()), std::vector<std::string>{"present"});
}

TEST(CacheRegistry, EmptyKeyOrNullCacheIsInvalidAndChangesNothing) {
  CacheRegistry reg;
  EXPECT_EQ(reg.install("", probe()), Error::InvalidArgument);
  Status null_cache = reg.install("k", nullptr);
  EXPECT_EQ(null_cache.code(), Error::InvalidArgument);
  EXPECT_NE(std::strstr(null_cache.message().c_str(), "null"), nullptr) << null_cache.message().c_str();
  EXPECT_EQ(reg.erase(""), Error::InvalidArgument);
  EXPECT_EQ(reg.install_unique("p", nullptr).error(), Error::InvalidArgument);
  EXPECT_EQ(reg.size(), 0u);
}

TEST(CacheRegistry, KeysAreSorted) {
  CacheRegistry reg;
  for (const char* k : {"b", "c", "a"}) ASSERT_EQ(reg.install(k, probe()), Error::Ok);
  EXPECT_EQ(kvcore_test::texts(reg.keys()), (std::vector<std::string>{"a", "b", "c"}));
}

TEST(CacheRegistry, AHolderKeepsTheCacheAliveAfterErase) {
  CacheRegistry reg;
  bool destroyed = false;
  ASSERT_EQ(reg.install("k", std::make_shared<ProbeCache>(3, nullptr, &destroyed)), Error::Ok);
  std::shared_ptr<CacheBase> held = reg.get("k");
  ASSERT_EQ(reg.erase("k"), Error::Ok);
  EXPECT_FALSE(destroyed);
  EXPECT_EQ(static_cast<ProbeCache&>(*held).tag, 3);
  held.reset();
  EXPECT_TRUE(destroyed);
}

TEST(CacheRegistry, TheLastOwnerDiesOutsideTheLock) {
  // Destroying under the lock would deadlock here: the destructor asks size().
  CacheRegistry reg;
  ProbeCache::seen_size_in_destructor = -1;
  ASSERT_EQ(reg.install("other", probe()), Error::Ok);
  ASSERT_EQ(reg.install("k", std::make_shared<ProbeCache>(0, &reg)), Error::Ok);
  ASSERT_EQ(reg.erase("k"), Error::Ok);
  EXPECT_EQ(ProbeCache::seen_size_in_destructor, 1);
}

TEST(CacheRegistry, EraseIfSameLeavesAReusedKeyAlone) {
  CacheRegistry reg;
  auto mine = probe(1);
  auto theirs = probe(2);
  ASSERT_EQ(reg.install("k", theirs), Error::Ok);
  EXPECT_EQ(reg.erase_if_same("k", mine.get()), Error::NotFound);
  EXPECT_EQ(reg.get("k"), theirs);
  EXPECT_EQ(reg.erase_if_same("k", theirs.get()), Error::Ok);
  EXPECT_EQ(reg.size(), 0u);
}

TEST(CacheRegistry, UniqueKeysSkipInstalledKeys) {
  CacheRegistry reg;
  std::set<std::string> taken;
  for (int i = 0; i < 5; ++i) {
    const std::string k = "p#" + std::to_string(i);
    ASSERT_EQ(reg.install(k, probe()), Error::Ok);
    taken.insert(k);
  }
  std::set<std::string> made;
  for (int i = 0; i < 5; ++i) {
    const std::string k = kvcore_test::text(reg.make_unique_key("p"));
    EXPECT_EQ(k.rfind("p#", 0), 0u) << k;
    EXPECT_EQ(taken.count(k), 0u) << k;
    made.insert(k);
  }
  EXPECT_EQ(made.size(), 5u);
  EXPECT_EQ(kvcore_test::text(reg.make_unique_key("")).rfind("cache#", 0), 0u);
}

TEST(CacheRegistry, InstallUniqueReturnsTheKeyItUsed) {
  CacheRegistry reg;
  auto cache = probe();
  auto key = reg.install_unique("runner", cache);
  ASSERT_TRUE(key.ok()) << key.message().c_str();
  EXPECT_EQ(kvcore_test::text(*key).rfind("runner#", 0), 0u);
  EXPECT_EQ(reg.get(key->view()), cache);
}

TEST(CacheRegistry, UniqueKeysAcross8ThreadsOf10000) {
  CacheRegistry reg;
  constexpr int kThreads = 8;
  constexpr int kPerThread = 10000;
  std::vector<std::vector<std::string>> made(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      made[t].reserve(kPerThread);
      for (int i = 0; i < kPerThread; ++i) made[t].push_back(kvcore_test::text(reg.make_unique_key("k")));
    });
  }
  for (auto& th : threads) th.join();
  std::set<std::string> all;
  for (const auto& v : made) all.insert(v.begin(), v.end());
  EXPECT_EQ(all.size(), static_cast<std::size_t>(kThreads * kPerThread));
}

TEST(CacheRegistry, ConcurrentInstallOfTheSameKeysHasExactlyOneWinnerEach) {
  CacheRegistry reg;
  constexpr int kThreads = 8;
  constexpr int kKeys = 2000;
  std::vector<std::shared_ptr<CacheBase>> caches;  // caches[t * kKeys + k]
  for (int i = 0; i < kThreads * kKeys; ++i) caches.push_back(probe(i));
  std::vector<std::vector<int>> won(kThreads);  // keys each thread installed
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < kKeys; ++k) {
        const int key = (k * 7 + t * 131) % kKeys;  // different orders per thread
        Status s = reg.install("key" + std::to_string(key), caches[t * kKeys + key]);
        if (s.ok()) won[t].push_back(key);
        else EXPECT_EQ(s.code(), Error::RegistrationAlreadyRegistered);
        (void)reg.get("key" + std::to_string((key + 1) % kKeys));
      }
    });
  }
  for (auto& th : threads) th.join();
  std::vector<int> winners(kKeys, 0);
  for (int t = 0; t < kThreads; ++t)
    for (int key : won[t]) {
      ++winners[key];
      EXPECT_EQ(reg.get("key" + std::to_string(key)), caches[t * kKeys + key]);
    }
  for (int key = 0; key < kKeys; ++key) EXPECT_EQ(winners[key], 1) << "key" << key;
  EXPECT_EQ(reg.size(), static_cast<std::size_t>(kKeys));
}

TEST(CacheRegistry, ConcurrentInstallEraseGetLosesNothing) {
  // Each thread owns its keys: installs them all, erases the odd ones, while
  // every thread also reads everyone's keys. At the end exactly the even keys
  // of every thread remain, each with the cache its owner installed.
  CacheRegistry reg;
  constexpr int kThreads = 8;
  constexpr int kKeys = 2000;
  std::atomic<int> wrong_get{0};
  std::atomic<int> failed{0};
  auto name = [](int t, int k) { return "t" + std::to_string(t) + "/" + std::to_string(k); };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < kKeys; ++k) {
        if (!reg.install(name(t, k), probe(t * kKeys + k)).ok()) ++failed;
        auto other = reg.get(name((t + 1) % kThreads, k));
        if (other && static_cast<ProbeCache&>(*other).tag != ((t + 1) % kThreads) * kKeys + k)
          ++wrong_get;
        if (k % 2 == 1 && !reg.erase(name(t, k)).ok()) ++failed;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(wrong_get.load(), 0);
  std::vector<std::string> expected;
  for (int t = 0; t < kThreads; ++t)
    for (int k = 0; k < kKeys; k += 2) expected.push_back(name(t, k));
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(kvcore_test::texts(reg.keys()), expected);
  for (int t = 0; t < kThreads; ++t)
    for (int k = 0; k < kKeys; k += 2) {
      auto c = reg.get(name(t, k));
      ASSERT_NE(c, nullptr);
      EXPECT_EQ(static_cast<ProbeCache&>(*c).tag, t * kKeys + k);
    }
}

TEST(CacheRegistry, GlobalIsOneObjectBackedByTheStorage) {
  EXPECT_EQ(&global_caches(), &global_caches());
  EXPECT_EQ(&global_caches(), &registry_storage().caches);
  EXPECT_EQ(check_registry_storage(&registry_storage()), Error::Ok);
  const std::string key = kvcore_test::text(global_caches().make_unique_key("global-test"));
  ASSERT_EQ(global_caches().install(key, probe()), Error::Ok);
  EXPECT_TRUE(registry_storage().caches.contains(key));
  EXPECT_EQ(global_caches().erase(key), Error::Ok);
}

TEST(RegistryStorage, IncompatibleStorageIsRefusedWithTheReason) {
  EXPECT_EQ(check_registry_storage(nullptr), Error::InvalidArgument);
  RegistryStorage other_version;
  other_version.abi_version = kRegistryAbiVersion + 1;
  Status s = check_registry_storage(&other_version);
  EXPECT_EQ(s.code(), Error::NotSupported);
  EXPECT_NE(std::strstr(s.message().c_str(), "ABI version"), nullptr) << s.message().c_str();
  RegistryStorage other_size;
  other_size.size = other_size.size + 8;
  EXPECT_EQ(check_registry_storage(&other_size), Error::NotSupported);
  RegistryStorage other_stdlib;
  other_stdlib.abi_tag = "some-other-stdlib";
  s = check_registry_storage(&other_stdlib);
  EXPECT_EQ(s.code(), Error::NotSupported);
  EXPECT_NE(std::strstr(s.message().c_str(), "some-other-stdlib"), nullptr) << s.message().c_str();
}

}  // namespace
}  // namespace kvcore
