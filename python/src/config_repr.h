// The reprs of the config values, each mirroring its constructor call
// (LayerConfig and BatchLimits also appear inside CacheConfig's).
#pragma once

#include <string>

#include "bindings.h"
#include "kvcore/core/config.h"

namespace kvcore_py {

inline std::string repr(const kvcore::LayerConfig& l) {
  std::string s = "LayerConfig(" + repr_policy(l.policy) + ", n_kv_heads=" + std::to_string(l.n_kv_heads) +
                  ", head_dim=" + std::to_string(l.head_dim);
  if (l.v_head_dim != 0) s += ", v_head_dim=" + std::to_string(l.v_head_dim);
  return s + ")";
}

inline std::string repr(const kvcore::BatchLimits& b) {
  return "BatchLimits(block_size=" + std::to_string(b.block_size) + ", max_seqs=" + std::to_string(b.max_seqs) +
         ", max_step_tokens=" + std::to_string(b.max_step_tokens) + ", num_blocks=" + std::to_string(b.num_blocks) +
         ", max_holes=" + std::to_string(b.max_holes) +
         (b.max_active_seqs != 0 ? ", max_active_seqs=" + std::to_string(b.max_active_seqs) : std::string()) +
         (b.state_snapshots != 0 ? ", state_snapshots=" + std::to_string(b.state_snapshots) : std::string()) +
         (b.page_layers != 0 ? ", page_layers=" + std::to_string(b.page_layers) : std::string()) +
         (b.max_rewind != -1 ? ", max_rewind=" + std::to_string(b.max_rewind) : std::string()) +
         (b.states_in_pool ? ", states_in_pool=True" : std::string()) +
         (b.table_page_blocks != 0 ? ", table_page_blocks=" + std::to_string(b.table_page_blocks) : std::string()) +
         (b.table_pages != 0 ? ", table_pages=" + std::to_string(b.table_pages) : std::string()) +
         (b.state_block_size != 0 ? ", state_block_size=" + std::to_string(b.state_block_size) : std::string()) + ")";
}

}  // namespace kvcore_py
