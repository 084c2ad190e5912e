// The visibility of a many-sequence step as a dense mask over a group's rows:
// what a byte layer that attends over a pool's rows [0, rows) at once (eager
// attention, ExecuTorch's op) hands to attention. Row r of the pool may hold a
// key of several sequences (a shared block); a query sees it when one of its
// own sequence's positions lives there and the visibility rule of section 2
// (window, sinks), minus removed positions, lets it.
#pragma once

#include <cstdint>
#include <cstring>

#include "kvcore/batch/batch_plan.h"
#include "kvcore/core/config.h"
#include "kvcore/core/draft_tree.h"
#include "kvcore/core/result.h"

namespace kvcore {

/// Marks in `out` (row `t` of a mask over `rows` rows) the slots of the
/// nodes of tree entry `entry` that token t's query sees: itself and its
/// ancestors (the packed mask) within the policy's window of its position.
inline void mark_tree_keys(const BatchStepPlan& plan, const GroupPlan& gp, int entry, int t, int rows,
                           unsigned char* out) noexcept {
  const int at = plan.query_starts[entry];
  const int n = plan.query_starts[entry + 1] - at;
  const int words = tree_mask_words(n);
  const std::uint32_t* row = plan.tree_masks + plan.tree_mask_starts[entry] + static_cast<std::ptrdiff_t>(t - at) * words;
  for (int j = 0; j < n; ++j) {
    if (!tree_mask_bit(row, j) || !gp.policy.sees(plan.positions[t], plan.positions[at + j])) continue;
    if (gp.slots[at + j] < rows) out[gp.slots[at + j]] = 1;
  }
}

/// Fills `mask[t * rows + r]` (n_tokens x rows bytes, 1 = attend) for every
/// new token t of `plan` and row r of group `group`'s pool, by the group's
/// policy (plan.groups[group].policy); a tree entry's node sees its history
/// by the rule at its position and, among the step's rows, only itself and
/// its ancestors (docs/design.md section 7). Rows at or past `rows` are left out (give the group's
/// used_blocks * block_size to cover every live row). Work: clearing
/// n_tokens x rows bytes, then the tokens times the keys each sees.
/// InvalidArgument: group out of range, rows < 0, mask null with rows > 0.
inline Status fill_step_mask(const BatchStepPlan& plan, int group, int rows, unsigned char* mask) noexcept {
  KVCORE_CHECK_OR_RETURN_ERROR(group >= 0 && group < plan.n_groups, InvalidArgument,
                               "group = %d: must be in [0, n_groups = %d)", group, plan.n_groups);
  KVCORE_CHECK_OR_RETURN_ERROR(rows >= 0, InvalidArgument, "rows = %d: must be >= 0", rows);
  KVCORE_CHECK_OR_RETURN_ERROR(mask != nullptr || rows == 0, InvalidArgument,
                               "fill_step_mask: mask is null");
  if (rows == 0) return Error::Ok;
  std::memset(mask, 0, static_cast<std::size_t>(plan.n_tokens) * static_cast<std::size_t>(rows));
  const GroupPlan& gp = plan.groups[group];
  const int B = plan.block_size;
  for (int i = 0; i < plan.n_entries; ++i) {
    const TableRow table = table_row(plan, group, i);
    const int first = plan.first_positions[i];
    const bool tree = plan.is_tree(i);
    for (int t = plan.query_starts[i]; t < plan.query_starts[i + 1]; ++t) {
      const int q = plan.positions[t];  // first + j for a chain, first + depth for a tree node
      unsigned char* out = mask + static_cast<std::ptrdiff_t>(t) * rows;
      // A tree node reads the table for its history only; its tree keys follow.
      const int end_q = tree ? first : q + 1;
      for_each_visible_run(plan, i, gp.policy, q, end_q, [&](int begin, int end) {
        for (int k = begin; k < end; ++k) {
          const int block = table[k / B];
          const std::int64_t row = static_cast<std::int64_t>(block) * B + k % B;
          if (block >= 0 && row < rows) out[row] = 1;
        }
        return true;
      });
      if (tree) mark_tree_keys(plan, gp, i, t, rows, out);
    }
  }
  return Error::Ok;
}

}  // namespace kvcore
