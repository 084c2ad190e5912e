// Umbrella header: the whole kvcore core, layer by layer (each layer includes
// only the ones above it in this list). Not the adapters/ (ExecuTorch, the
// Python capsule), which need third-party headers.
#pragma once

#include "kvcore/version.h"

// core/: outcomes, config, plans, layout policies, the caches and their faces.
#include "kvcore/core/error.h"
#include "kvcore/core/status.h"
#include "kvcore/core/result.h"
#include "kvcore/core/config.h"
#include "kvcore/core/step.h"
#include "kvcore/core/plan.h"
#include "kvcore/core/draft_tree.h"
#include "kvcore/core/layout_policy.h"
#include "kvcore/core/flat_policy.h"
#include "kvcore/core/ring_policy.h"
#include "kvcore/core/chunked_policy.h"
#include "kvcore/core/shared_policy.h"
#include "kvcore/core/state_policy.h"
#include "kvcore/core/cache_base.h"
#include "kvcore/core/sequence_cache.h"

// batch/: many sequences over paged block pools (docs/design.md section 6).
#include "kvcore/batch/block_pool.h"
#include "kvcore/batch/batch_plan.h"
#include "kvcore/batch/batch_faces.h"
#include "kvcore/batch/batch_cache.h"
#include "kvcore/batch/step_mask.h"

// registry/: caches by key, builders by (backend, kind), sessions.
#include "kvcore/registry/cache_registry.h"
#include "kvcore/registry/cache_builder_registry.h"
#include "kvcore/registry/registry_storage.h"
#include "kvcore/registry/cache_session.h"
#include "kvcore/registry/builder_kinds.h"
#include "kvcore/registry/sequence_builders.h"
#include "kvcore/registry/batch_builders.h"
#include "kvcore/registry/default_builders.h"

// pool/: the reference byte layer that applies plans to memory.
#include "kvcore/pool/dtype.h"
#include "kvcore/pool/pool_allocator.h"
#include "kvcore/pool/kv_pool.h"
#include "kvcore/pool/kv_pool_tree.h"
#include "kvcore/pool/paged_kv_pool.h"

// state/: a sequence's state outside its process (records, export, import).
#include "kvcore/state/record_format.h"
#include "kvcore/state/record_view.h"
#include "kvcore/state/sequence_export.h"
#include "kvcore/state/sequence_import.h"
