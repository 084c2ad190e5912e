// Model-shaped cache configs the benchmarks share. Layer i is a full-history
// layer when (i + 1) % 6 == 0, as transformers' Gemma3TextConfig builds
// layer_types (sliding_window_pattern = 6): five ring layers, then one flat.
#pragma once

#include "kvcore/core/config.h"

namespace kvcore_bench {

struct ModelShape {
  const char* name;
  int n_layers;
  int n_kv_heads;
  int head_dim;
  int window;
};

/// google/gemma-3-27b: 62 layers, 16 KV heads x 128, sliding window 1024.
constexpr ModelShape kGemma3_27B{"gemma-3-27b", 62, 16, 128, 1024};
/// google/gemma-3-1b: 26 layers, 1 KV head x 256, sliding window 512.
constexpr ModelShape kGemma3_1B{"gemma-3-1b", 26, 1, 256, 512};

inline bool is_flat_layer(int layer) { return (layer + 1) % 6 == 0; }

inline kvcore::CacheConfig make_config(const ModelShape& shape, int capacity, int max_step) {
  kvcore::CacheConfig cfg;
  cfg.capacity = capacity;
  cfg.n_layers = shape.n_layers;
  cfg.max_step = max_step;
  for (int l = 0; l < shape.n_layers; ++l) {
    kvcore::LayerConfig lc;
    lc.policy = is_flat_layer(l) ? kvcore::LayerPolicy::flat()
                                 : kvcore::LayerPolicy::ring(shape.window);
    lc.n_kv_heads = shape.n_kv_heads;
    lc.head_dim = shape.head_dim;
    cfg.layers.push_back(lc);
  }
  return cfg;
}

/// Bytes of one K row plus one V row of one layer in float16/bfloat16.
constexpr long long kv_row_bytes(const ModelShape& shape) {
  return 2LL * shape.n_kv_heads * shape.head_dim * 2;
}

}  // namespace kvcore_bench
