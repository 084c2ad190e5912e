// Umbrella header: the whole kvcore core (not the ExecuTorch adapter or the
// Python capsule helper, which need third-party headers).
#pragma once

#include "kvcore/cache_base.h"
#include "kvcore/cache_builder_registry.h"
#include "kvcore/cache_registry.h"
#include "kvcore/cache_session.h"
#include "kvcore/config.h"
#include "kvcore/default_builders.h"
#include "kvcore/dtype.h"
#include "kvcore/error.h"
#include "kvcore/flat_policy.h"
#include "kvcore/kv_pool.h"
#include "kvcore/layout_policy.h"
#include "kvcore/plan.h"
#include "kvcore/pool_allocator.h"
#include "kvcore/registry_storage.h"
#include "kvcore/result.h"
#include "kvcore/ring_policy.h"
#include "kvcore/sequence_cache.h"
#include "kvcore/status.h"
#include "kvcore/step.h"
#include "kvcore/version.h"
