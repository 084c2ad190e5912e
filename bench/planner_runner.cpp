// A planner-only runner: what an embedded runtime links when it uses kvcore's
// core to plan steps and nothing else (no registry, no byte layer). Built at
// -Os by bench/compilers.sh to measure the core's code size; it also runs, so
// the measured code is the code that works.
#include <cstdio>

#include "kvcore/core/sequence_cache.h"

int main() {
  kvcore::CacheConfig cfg;
  cfg.capacity = 4096;
  cfg.n_layers = 6;
  cfg.max_step = 8;
  cfg.layers.assign(5, kvcore::LayerConfig{kvcore::LayerPolicy::ring(64, 2), 1, 8, 0});
  cfg.layers.push_back(kvcore::LayerConfig{kvcore::LayerPolicy::flat(), 1, 8, 0});
  auto created = kvcore::SequenceCache::create(cfg);
  if (!created.ok()) {
    std::printf("%s\n", created.message().c_str());
    return 1;
  }
  kvcore::SequenceCache& cache = **created;
  kvcore::SequencePlanner& planner = cache;
  long rows_read = 0;
  for (int i = 0; i < 200; ++i) {
    auto step = cache.begin_step(1 + i % 8);
    if (!step.ok()) break;
    for (int l = 0; l < planner.n_layers(); ++l) {
      auto plan = planner.plan(l, *step);
      if (!plan.ok()) return 1;
      rows_read += plan->read_len();
    }
    if (!cache.commit(*step).ok()) return 1;
    if (i % 17 == 16 && cache.can_rewind(cache.length() - 3)) (void)cache.rewind(cache.length() - 3);
  }
  std::printf("%ld rows read\n", rows_read);
  return 0;
}
