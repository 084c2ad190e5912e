// A Python BatchStep: the C++ BatchStep plus the BatchCache that began it
// (kept alive). Shared by batch_step.cpp (which registers it), the BatchCache
// and plan bindings and the PagedKVPool ones.
#pragma once

#include <memory>

#include "kvcore/batch/batch_cache.h"

namespace kvcore_py {

struct BatchStepHandle {
  std::shared_ptr<kvcore::BatchCache> cache;
  kvcore::BatchStep step;

  /// Ok while `step` is the cache's begun, uncommitted step; InvalidState after.
  kvcore::Status check() const { return cache->check_step(step); }
};

}  // namespace kvcore_py
