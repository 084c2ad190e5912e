// The boolean attention mask of a step's plan over one group's pool rows, as a
// numpy array: BatchStepPlan.mask (batch_step_plan.cpp) returns it, PagedKVPool.mask
// (py_paged_kv_pool.h) keeps it per group and step.
#pragma once

#include <pybind11/numpy.h>

#include <optional>
#include <string>

#include "errors.h"
#include "frozen_array.h"
#include "kvcore/batch/batch_cache.h"
#include "kvcore/batch/step_mask.h"

namespace kvcore_py {

/// A new (plan.n_tokens, rows) mask of `group` over its pool rows [0, rows)
/// (default: used_blocks(group) * block_size, every live row): mask[t, r] is
/// True when token t may see the key in row r. InvalidArgumentError: bad group
/// or rows.
/// `shared`: read-only for good (FrozenArray), for a mask several callers see;
/// else a plain writable array the caller owns (torch.from_numpy takes it as is).
inline py::array plan_mask(const kvcore::BatchCache& cache, const kvcore::BatchStepPlan& plan, int group,
                           const std::optional<PyInt>& rows = std::nullopt, bool shared = false) {
  unwrap(cache.group_policy(group));  // checks the group
  const int n = rows ? to_int("rows", *rows) : unwrap(cache.used_blocks(group)) * plan.block_size;
  if (n < 0) raise(kvcore::Error::InvalidArgument, "rows = " + std::to_string(n) + ": must be >= 0");
  if (shared) {
    FrozenArray<bool> out({plan.n_tokens, n});
    throw_if_error(kvcore::fill_step_mask(plan, group, n, reinterpret_cast<unsigned char*>(out.data)));
    return out.array;
  }
  py::array_t<bool> out({plan.n_tokens, n});
  throw_if_error(kvcore::fill_step_mask(plan, group, n, reinterpret_cast<unsigned char*>(out.mutable_data())));
  return std::move(out);
}

}  // namespace kvcore_py
