// A Python Step: the C++ Step plus the cache that began it (kept alive).
#pragma once

#include <memory>

#include "kvcore/sequence_cache.h"

namespace kvcore_py {

struct StepHandle {
  std::shared_ptr<kvcore::SequenceCache> cache;
  kvcore::Step step;
};

}  // namespace kvcore_py
