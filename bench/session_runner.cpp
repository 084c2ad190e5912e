// A registry + session runner that registers sequence caches only: what an
// embedded runtime links when it builds its cache through the builder registry
// (register_sequence_builders(), CacheSession) and plans steps through the
// session's faces. It links no BatchCache. Built at -Os by bench/compilers.sh
// and by the size test (tests/cpp/text_size_check.sh) to measure .text; it
// also runs, so the measured code is the code that works. Built with
// -DKVCORE_RUNNER_ALL_KINDS it calls register_default_builders() instead and
// links BatchCache too (the size test checks both).
#include <cstdio>

#include "kvcore/registry/cache_session.h"
#ifdef KVCORE_RUNNER_ALL_KINDS
#include "kvcore/registry/default_builders.h"
#else
#include "kvcore/registry/sequence_builders.h"
#endif

int main() {
#ifdef KVCORE_RUNNER_ALL_KINDS
  if (!kvcore::register_default_builders().ok()) return 1;
#else
  if (!kvcore::register_sequence_builders().ok()) return 1;
#endif
  kvcore::CacheConfig cfg;
  cfg.capacity = 4096;
  cfg.n_layers = 6;
  cfg.max_step = 8;
  cfg.layers.assign(5, kvcore::LayerConfig{kvcore::LayerPolicy::ring(64, 2), 1, 8, 0});
  cfg.layers.push_back(kvcore::LayerConfig{kvcore::LayerPolicy::flat(), 1, 8, 0});
  auto session = kvcore::CacheSession::create(kvcore::kCpuBackend, kvcore::kSequenceKind, cfg);
  if (!session.ok()) {
    std::printf("%s\n", session.message().c_str());
    return 1;
  }
  kvcore::SequenceControl* control = session->control();
  kvcore::SequencePlanner* planner = session->planner();
  if (control == nullptr || planner == nullptr) return 1;
  long rows_read = 0;
  for (int i = 0; i < 200; ++i) {
    auto step = control->begin_step(1 + i % 8);
    if (!step.ok()) break;
    for (int l = 0; l < planner->n_layers(); ++l) {
      auto plan = planner->plan(l, *step);
      if (!plan.ok()) return 1;
      rows_read += plan->read_len();
    }
    if (!control->commit(*step).ok()) return 1;
    if (i % 17 == 16 && control->can_rewind(control->length() - 3)) (void)control->rewind(control->length() - 3);
  }
  std::printf("%ld rows read\n", rows_read);
  return 0;
}
