// The registries' allocation-free results (Key, Table) as std types, so tests
// compare them with EXPECT_EQ.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "kvcore/registry/cache_builder_registry.h"
#include "kvcore/registry/cache_registry.h"

namespace kvcore_test {

inline std::string text(const kvcore::Key& key) { return std::string(key.view()); }

inline std::string text(const kvcore::Result<kvcore::Key>& key) {
  EXPECT_TRUE(key.ok()) << key.message().c_str();
  return key.ok() ? text(key.get()) : std::string();
}

inline std::vector<std::string> texts(const kvcore::Result<kvcore::Table<kvcore::Key>>& keys) {
  EXPECT_TRUE(keys.ok()) << keys.message().c_str();
  std::vector<std::string> out;
  if (keys.ok())
    for (const kvcore::Key& k : keys.get()) out.push_back(text(k));
  return out;
}

inline std::vector<std::pair<std::string, std::string>> texts(
    const kvcore::Result<kvcore::Table<kvcore::BuilderName>>& names) {
  EXPECT_TRUE(names.ok()) << names.message().c_str();
  std::vector<std::pair<std::string, std::string>> out;
  if (names.ok())
    for (const kvcore::BuilderName& n : names.get()) out.emplace_back(text(n.backend_id), text(n.kind));
  return out;
}

/// CacheBuilder::from_callable, which must succeed.
template <typename F>
kvcore::CacheBuilder callable(F f) {
  auto built = kvcore::CacheBuilder::from_callable(std::move(f));
  EXPECT_TRUE(built.ok()) << built.message().c_str();
  return built.ok() ? std::move(built).get() : kvcore::CacheBuilder();
}

}  // namespace kvcore_test
