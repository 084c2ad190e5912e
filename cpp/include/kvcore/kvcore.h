// Umbrella header: the whole kvcore core.
#pragma once

#include "kvcore/cache_base.h"
#include "kvcore/config.h"
#include "kvcore/error.h"
#include "kvcore/flat_policy.h"
#include "kvcore/layout_policy.h"
#include "kvcore/plan.h"
#include "kvcore/result.h"
#include "kvcore/ring_policy.h"
#include "kvcore/sequence_cache.h"
#include "kvcore/status.h"
#include "kvcore/step.h"
#include "kvcore/version.h"
