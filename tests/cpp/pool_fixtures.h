// Test-only helpers for the byte layers' tests (KVPool, PagedKVPool): configs
// whose layers carry row shapes, the bytes a numbered write puts in a row, a
// snapshot of a pool's storage, a failing allocator, and Status assertions.
#pragma once

#include <gtest/gtest.h>

#include <climits>
#include <cstddef>
#include <cstdlib>
#include <utility>
#include <vector>

#include "cache_fixtures.h"
#include "kvcore/pool/kv_pool.h"
#include "kvcore/pool/pool_allocator.h"

// Status checks that print the message on failure.
#define ASSERT_OK(expr)                                            \
  do {                                                             \
    const kvcore::Status s_ = kvcore::internal::to_status((expr)); \
    ASSERT_TRUE(s_.ok()) << #expr << ": " << s_.message().c_str();         \
  } while (0)
#define EXPECT_OK(expr)                                            \
  do {                                                             \
    const kvcore::Status s_ = kvcore::internal::to_status((expr)); \
    EXPECT_TRUE(s_.ok()) << #expr << ": " << s_.message().c_str();         \
  } while (0)

namespace kvcore_test {

using kvcore::DType;
using kvcore::KVPool;

/// A config with exactly these layers (shapes included).
inline CacheConfig pool_config(int capacity, std::vector<LayerConfig> layers, int max_step,
                               int initial_capacity = 512) {
  CacheConfig cfg;
  cfg.capacity = capacity;
  cfg.n_layers = static_cast<int>(layers.size());
  cfg.layers = std::move(layers);
  cfg.max_step = max_step;
  cfg.initial_capacity = initial_capacity;
  return cfg;
}

inline LayerConfig flat_layer(int heads = 2, int dim = 3, int v_dim = 0) {
  return LayerConfig{LayerPolicy::flat(), heads, dim, v_dim};
}
inline LayerConfig ring_layer(int window, int sinks = 0, int heads = 2, int dim = 3,
                              int v_dim = 0) {
  return LayerConfig{LayerPolicy::ring(window, sinks), heads, dim, v_dim};
}

/// Byte i of the K (value = false) or V row that write `write_id` puts at a
/// position of `layer`: distinct per write, so a stale row never matches by accident.
inline unsigned char byte_of(int write_id, int layer, bool value, std::size_t i) {
  return static_cast<unsigned char>(write_id * 131 + layer * 29 + (value ? 71 : 0) + i * 7 + 1);
}

/// The first n bytes of that row.
inline std::vector<unsigned char> row_bytes(int write_id, int layer, bool value, std::size_t n) {
  std::vector<unsigned char> row(n);
  for (std::size_t i = 0; i < n; ++i) row[i] = byte_of(write_id, layer, value, i);
  return row;
}

/// Every byte of every allocated row of a KVPool or PagedKVPool, to prove a
/// refused or failed call wrote nothing.
template <typename Pool>
std::vector<unsigned char> snapshot(const Pool& pool) {
  std::vector<unsigned char> out;
  for (int l = 0; l < pool.n_layers(); ++l) {
    const auto shape = *pool.layer(l);
    const std::size_t rows = static_cast<std::size_t>(shape.allocated_rows);
    out.insert(out.end(), shape.k, shape.k + shape.k_row_bytes * rows);
    out.insert(out.end(), shape.v, shape.v + shape.v_row_bytes * rows);
  }
  return out;
}

// An allocator that counts live blocks and fails on demand.
struct TestAllocator {
  int live = 0;
  int allocations = 0;
  int fail_from = INT_MAX;  // the allocation with this index and later ones fail

  kvcore::PoolAllocator get() {
    kvcore::PoolAllocator a;
    a.context = this;
    a.allocate = [](void* ctx, std::size_t bytes) noexcept -> void* {
      auto* self = static_cast<TestAllocator*>(ctx);
      if (self->allocations++ >= self->fail_from) return nullptr;
      ++self->live;
      return std::malloc(bytes);
    };
    a.release = [](void* ctx, void* block) noexcept {
      --static_cast<TestAllocator*>(ctx)->live;
      std::free(block);
    };
    return a;
  }
};

}  // namespace kvcore_test
