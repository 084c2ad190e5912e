// Creates a SequenceCache through the umbrella header and runs one step;
// exits 0 when every call succeeds. Only the public API of README.md.
#include "kvcore/kvcore.h"

#include <cstdio>

static_assert(__cplusplus >= 201703L, "kvcore::kvcore must bring C++17 to its consumers");

int main() {
  kvcore::CacheConfig cfg;
  cfg.capacity = 16;
  cfg.n_layers = 2;
  cfg.max_step = 4;
  cfg.layers.push_back({kvcore::LayerPolicy::ring(4, 1), 1, 8, 0});
  cfg.layers.push_back({kvcore::LayerPolicy::flat(), 1, 8, 0});

  auto created = kvcore::SequenceCache::create(cfg);
  if (!created.ok()) {
    std::fprintf(stderr, "create: error %d: %s\n", static_cast<int>(created.error()), created.message().c_str());
    return 1;
  }
  kvcore::SequenceCache& cache = **created;

  auto step = cache.begin_step(3);
  if (!step.ok()) {
    std::fprintf(stderr, "begin_step: error %d: %s\n", static_cast<int>(step.error()), step.message().c_str());
    return 1;
  }
  kvcore::Error err = cache.commit(*step);
  if (err != kvcore::Error::Ok) {
    std::fprintf(stderr, "commit: error %d\n", static_cast<int>(err));
    return 1;
  }
  std::printf("kvcore consumer: one step of 3 tokens committed\n");
  return 0;
}
