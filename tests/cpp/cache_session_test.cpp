// CacheSession: installs under a unique key, erases on scope exit, moves
// transfer ownership, and erasing never touches a cache someone else installed.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "kvcore/registry/cache_session.h"
#include "kvcore/registry/default_builders.h"
#include "kvcore/core/sequence_cache.h"

namespace kvcore {
namespace {

CacheConfig flat_config(int capacity) {
  CacheConfig cfg;
  cfg.capacity = capacity;
  cfg.n_layers = 1;
  cfg.layers = {LayerConfig{LayerPolicy::flat(), 1, 4, 0}};
  return cfg;
}

struct Registries {
  Registries() { EXPECT_EQ(register_default_builders(builders), Error::Ok); }
  CacheRegistry caches;
  CacheBuilderRegistry builders;
};

TEST(CacheSession, InstallsOnCreateAndErasesOnScopeExit) {
  Registries r;
  std::string key;
  std::weak_ptr<CacheBase> watch;
  {
    auto session = CacheSession::create("cpu", "sequence", flat_config(8), r.caches, r.builders);
    ASSERT_TRUE(session.ok()) << session.message().c_str();
    key = session->key();
    watch = session->cache();
    EXPECT_EQ(key.rfind("cpu/sequence#", 0), 0u) << key;
    EXPECT_TRUE(session->active());
    EXPECT_EQ(r.caches.get(key), session->cache());
    ASSERT_NE(session->control(), nullptr);
    ASSERT_NE(session->planner(), nullptr);
    EXPECT_EQ(session->control()->capacity(), 8);
  }
  EXPECT_FALSE(r.caches.contains(key));
  EXPECT_EQ(r.caches.size(), 0u);
  EXPECT_TRUE(watch.expired());
}

TEST(CacheSession, ABackendHoldingTheCacheOutlivesTheSession) {
  Registries r;
  std::shared_ptr<CacheBase> backend_handle;
  {
    auto session = CacheSession::create("cpu", "sequence", flat_config(8), r.caches, r.builders);
    ASSERT_TRUE(session.ok());
    backend_handle = r.caches.get(session->key());
  }
  ASSERT_NE(backend_handle, nullptr);
  EXPECT_EQ(backend_handle->as_control()->capacity(), 8);
  EXPECT_EQ(r.caches.size(), 0u);
}

TEST(CacheSession, BuildErrorsPassThroughAndInstallNothing) {
  Registries r;
  auto missing = CacheSession::create("gpu", "paged", flat_config(8), r.caches, r.builders);
  EXPECT_EQ(missing.error(), Error::NotFound);
  auto bad = CacheSession::create("cpu", "sequence", flat_config(0), r.caches, r.builders);
  EXPECT_EQ(bad.error(), Error::InvalidArgument);
  EXPECT_EQ(r.caches.size(), 0u);
}

TEST(CacheSession, AdoptInstallsAnExistingCache) {
  Registries r;
  auto made = SequenceCache::create(flat_config(5));
  ASSERT_TRUE(made.ok());
  std::shared_ptr<CacheBase> cache(std::move(made).get());
  {
    auto session = CacheSession::adopt(cache, "runner", r.caches);
    ASSERT_TRUE(session.ok());
    EXPECT_EQ(session->key().rfind("runner#", 0), 0u);
    EXPECT_EQ(r.caches.get(session->key()), cache);
  }
  EXPECT_EQ(r.caches.size(), 0u);
  EXPECT_EQ(CacheSession::adopt(nullptr, "runner", r.caches).error(), Error::InvalidArgument);
}

TEST(CacheSession, TwoSessionsGetDistinctKeys) {
  Registries r;
  auto a = CacheSession::create("cpu", "sequence", flat_config(4), r.caches, r.builders);
  auto b = CacheSession::create("cpu", "sequence", flat_config(4), r.caches, r.builders);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->key(), b->key());
  EXPECT_EQ(r.caches.size(), 2u);
}

TEST(CacheSession, MoveTransfersTheErase) {
  Registries r;
  auto made = CacheSession::create("cpu", "sequence", flat_config(4), r.caches, r.builders);
  ASSERT_TRUE(made.ok());
  CacheSession first = std::move(made).get();
  const std::string key(first.key());
  {
    CacheSession second = std::move(first);
    EXPECT_FALSE(first.active());  // NOLINT(bugprone-use-after-move): checking the moved-from state
    EXPECT_TRUE(first.key().empty());
    EXPECT_EQ(first.control(), nullptr);
    EXPECT_EQ(second.key(), key);
    EXPECT_TRUE(r.caches.contains(key));
  }
  EXPECT_FALSE(r.caches.contains(key));
}

TEST(CacheSession, MoveAssignmentEndsTheOverwrittenSession) {
  Registries r;
  auto a = CacheSession::create("cpu", "sequence", flat_config(4), r.caches, r.builders);
  auto b = CacheSession::create("cpu", "sequence", flat_config(4), r.caches, r.builders);
  ASSERT_TRUE(a.ok() && b.ok());
  const std::string key_a(a->key());
  const std::string key_b(b->key());
  a.get() = std::move(b.get());
  EXPECT_FALSE(r.caches.contains(key_a));
  EXPECT_TRUE(r.caches.contains(key_b));
  EXPECT_EQ(a->key(), key_b);
}

TEST(CacheSession, EndErasesOnceAndReportsAnEndedSession) {
  Registries r;
  auto s = CacheSession::create("cpu", "sequence", flat_config(4), r.caches, r.builders);
  ASSERT_TRUE(s.ok());
  const std::string key(s->key());
  EXPECT_EQ(s->end(), Error::Ok);
  EXPECT_FALSE(r.caches.contains(key));
  EXPECT_FALSE(s->active());
  EXPECT_NE(s->cache(), nullptr);  // the session still holds its cache
  EXPECT_EQ(s->end(), Error::InvalidState);
}

TEST(CacheSession, NeverErasesACacheSomeoneElseInstalledUnderItsKey) {
  Registries r;
  auto s = CacheSession::create("cpu", "sequence", flat_config(4), r.caches, r.builders);
  ASSERT_TRUE(s.ok());
  const std::string key(s->key());
  ASSERT_EQ(r.caches.erase(key), Error::Ok);
  auto other = SequenceCache::create(flat_config(4));
  ASSERT_TRUE(other.ok());
  std::shared_ptr<CacheBase> theirs(std::move(other).get());
  ASSERT_EQ(r.caches.install(key, theirs), Error::Ok);
  EXPECT_EQ(s->end(), Error::NotFound);
  EXPECT_EQ(r.caches.get(key), theirs);
}

TEST(CacheSession, DefaultsUseTheGlobalRegistries) {
  ASSERT_EQ(register_default_builders(), Error::Ok);
  std::string key;
  {
    auto s = CacheSession::create("cpu", "sequence", flat_config(4));
    ASSERT_TRUE(s.ok()) << s.message().c_str();
    key = s->key();
    EXPECT_EQ(global_caches().get(key), s->cache());
  }
  EXPECT_FALSE(global_caches().contains(key));
}

}  // namespace
}  // namespace kvcore
