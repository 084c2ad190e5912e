// The limits of a BatchCache's config: validate_batch() checks each field of
// BatchLimits; BatchSizes works out the tables create() would allocate (one
// block table row per active sequence and group) and refuses, before any of
// them, tables past what int indexing (2^31 entries) or a pool (2^30 blocks,
// 2^31 rows) can hold.
#pragma once

#include <cstdint>

#include "kvcore/batch/parts/group_rule.h"
#include "kvcore/core/config.h"
#include "kvcore/core/result.h"

namespace kvcore {

/// Checks the BatchLimits of `cfg` (after validate(cfg)). InvalidArgument names
/// the field, its value and the rule. (The end of the last block a table names,
/// ceil(capacity / block_size) * block_size, may pass 2^31 - 1: block
/// boundaries are computed in 64 bits.)
inline Status validate_batch(const CacheConfig& cfg) noexcept {
  KVCORE_RETURN_IF_ERROR(validate(cfg));
  const BatchLimits& b = cfg.batch;
  KVCORE_CHECK_OR_RETURN_ERROR(b.block_size >= 1, InvalidArgument,
                               "batch.block_size = %d: must be >= 1", b.block_size);
  KVCORE_CHECK_OR_RETURN_ERROR(b.max_seqs >= 1 && b.max_seqs <= (1 << 20), InvalidArgument,
                               "batch.max_seqs = %d: must be in [1, 1048576]", b.max_seqs);
  KVCORE_CHECK_OR_RETURN_ERROR(b.max_step_tokens >= 0, InvalidArgument,
                               "batch.max_step_tokens = %d: must be >= 1 (or 0 for the default)",
                               b.max_step_tokens);
  KVCORE_CHECK_OR_RETURN_ERROR(b.num_blocks >= 0, InvalidArgument,
                               "batch.num_blocks = %d: must be >= 1 (or 0 for the default)",
                               b.num_blocks);
  KVCORE_CHECK_OR_RETURN_ERROR(b.max_holes >= 0 && b.max_holes <= 4096, InvalidArgument,
                               "batch.max_holes = %d: must be in [0, 4096]", b.max_holes);
  KVCORE_CHECK_OR_RETURN_ERROR(b.state_snapshots >= 0 && b.state_snapshots <= (1 << 20), InvalidArgument,
                               "batch.state_snapshots = %d: must be in [0, 1048576]", b.state_snapshots);
  KVCORE_CHECK_OR_RETURN_ERROR(b.state_block_size == 0 || b.state_block_size == b.block_size ||
                                   (b.state_block_size > b.block_size && b.state_block_size <= cfg.capacity &&
                                    b.state_block_size % b.block_size == 0),
                               InvalidArgument,
                               "batch.state_block_size = %d: must be a multiple of batch.block_size = %d in "
                               "[block_size, capacity = %d] (or 0 for block_size)",
                               b.state_block_size, b.block_size, cfg.capacity);
  KVCORE_CHECK_OR_RETURN_ERROR(b.page_layers >= 0, InvalidArgument,
                               "batch.page_layers = %d: must be >= 1 (or 0 for the fewest layers of any policy)",
                               b.page_layers);
  KVCORE_CHECK_OR_RETURN_ERROR(b.max_rewind >= -1 && b.max_rewind <= cfg.capacity, InvalidArgument,
                               "batch.max_rewind = %d: must be in [0, capacity = %d] (or -1 for max_step)",
                               b.max_rewind, cfg.capacity);
  const int P = b.table_page_blocks;
  KVCORE_CHECK_OR_RETURN_ERROR(P == 0 || (P >= 1 && P <= (1 << 20) && (P & (P - 1)) == 0), InvalidArgument,
                               "batch.table_page_blocks = %d: must be a power of two in [1, 1048576] (or 0 for "
                               "unpaged tables)",
                               P);
  KVCORE_CHECK_OR_RETURN_ERROR(b.table_pages >= 0, InvalidArgument,
                               "batch.table_pages = %d: must be >= 1 (or 0 for every row full)", b.table_pages);
  KVCORE_CHECK_OR_RETURN_ERROR(b.max_active_seqs >= 0 && b.max_active_seqs <= b.max_seqs, InvalidArgument,
                               "batch.max_active_seqs = %d: must be in [1, batch.max_seqs = %d] (or 0 for "
                               "max_seqs)",
                               b.max_active_seqs, b.max_seqs);
  return Error::Ok;
}

/// The table sizes of a BatchCache over `cfg` (valid by validate_batch), with
/// `n_groups` groups.
struct BatchSizes {
  int max_seqs = 1;
  int rows = 1;    ///< block table rows per group: max_active_seqs (default max_seqs)
  int stride = 1;  ///< block table entries per row: ceil(capacity / B)
  int block_size = 1;
  int max_step = 1;
  int max_holes = 0;
  int max_step_tokens = 1;
  int n_groups = 1;
  int page_blocks_config = 0;  ///< BatchLimits::table_page_blocks (0: unpaged)
  int table_pages_config = 0;  ///< BatchLimits::table_pages (0: every row full)

  BatchSizes(const CacheConfig& cfg, int groups) noexcept
      : max_seqs(cfg.batch.max_seqs),
        rows(cfg.batch.max_active_seqs != 0 ? cfg.batch.max_active_seqs : cfg.batch.max_seqs),
        stride(static_cast<int>((static_cast<std::int64_t>(cfg.capacity) + cfg.batch.block_size - 1) /
                                cfg.batch.block_size)),
        block_size(cfg.batch.block_size),
        max_step(cfg.effective_max_step()),
        max_holes(cfg.batch.max_holes),
        n_groups(groups),
        page_blocks_config(cfg.batch.table_page_blocks),
        table_pages_config(cfg.batch.table_pages) {
    // Default: every sequence stepping max_step tokens at once (capped at 2^20 tokens).
    const std::int64_t every = static_cast<std::int64_t>(max_step) * max_seqs;
    max_step_tokens = cfg.batch.max_step_tokens != 0 ? cfg.batch.max_step_tokens
                                                     : static_cast<int>(every < (1 << 20) ? every : (1 << 20));
  }

  /// Entries per table page: the config's, at most the power of two that
  /// holds a whole row (a larger page would be one page per row, mostly
  /// unused), or a whole row unpaged.
  int page_blocks() const noexcept {
    if (page_blocks_config == 0) return stride;
    int row = 1;
    while (row < stride && row < page_blocks_config) row *= 2;
    return row;
  }
  /// Page ids per row's directory: ceil(stride / P), 1 unpaged.
  std::int64_t dir_stride() const noexcept {
    return page_blocks_config != 0 ? (static_cast<std::int64_t>(stride) + page_blocks() - 1) / page_blocks() : 1;
  }
  /// Table pages of every group: one pinned page per row and group unpaged;
  /// paged, the config's or every row full.
  std::int64_t table_pages() const noexcept {
    const std::int64_t full = static_cast<std::int64_t>(n_groups) * rows * dir_stride();
    return page_blocks_config != 0 && table_pages_config != 0 ? table_pages_config : full;
  }

  /// InvalidArgument when a table would pass 2^31 entries (int indexing).
  Status check_tables() const noexcept {
    const std::int64_t seqs = max_seqs;
    constexpr std::int64_t kMax = 0x7fffffff;
    KVCORE_CHECK_OR_RETURN_ERROR(page_blocks_config != 0 || static_cast<std::int64_t>(n_groups) * rows * stride <= kMax,
                                 InvalidArgument,
                                 "%d groups x %d sequences x %d blocks per table: the tables would "
                                 "pass 2^31 entries",
                                 n_groups, rows, stride);
    KVCORE_CHECK_OR_RETURN_ERROR(table_pages() * page_blocks() <= kMax, InvalidArgument,
                                 "%lld table pages of batch.table_page_blocks = %d entries: the tables would pass "
                                 "2^31 entries",
                                 static_cast<long long>(table_pages()), page_blocks());
    KVCORE_CHECK_OR_RETURN_ERROR(static_cast<std::int64_t>(n_groups) * rows * dir_stride() <= kMax, InvalidArgument,
                                 "%d groups x %d sequences x %lld table pages per row: the page directories "
                                 "would pass 2^31 entries",
                                 n_groups, rows, static_cast<long long>(dir_stride()));
    KVCORE_CHECK_OR_RETURN_ERROR(static_cast<std::int64_t>(n_groups) * max_step_tokens <= kMax, InvalidArgument,
                                 "%d groups x batch.max_step_tokens = %d: the step's slot tables "
                                 "would pass 2^31 entries",
                                 n_groups, max_step_tokens);
    KVCORE_CHECK_OR_RETURN_ERROR(seqs * max_holes <= kMax, InvalidArgument,
                                 "batch.max_seqs = %d x batch.max_holes = %d: the removed-range "
                                 "tables would pass 2^31 entries",
                                 max_seqs, max_holes);
    KVCORE_CHECK_OR_RETURN_ERROR(seqs * block_size <= kMax, InvalidArgument,
                                 "batch.max_seqs = %d x batch.block_size = %d: the prefix-token "
                                 "tables would pass 2^31 entries",
                                 max_seqs, block_size);
    return Error::Ok;
  }

  /// The blocks of the one pool every group draws from: `num_blocks` (the
  /// config's) when set, else what the groups' old pools held together, each
  /// as its rule sizes it with every table row full (rule_of(g): group g's
  /// GroupRule), and with states in the pool each State group's rows x D +
  /// min(max_step_tokens, rows x D) states (slots_of(k): its D, n_state
  /// groups; none without). InvalidArgument past 2^31 rows or 2^30 blocks.
  template <class RuleOf, class SlotsOf>
  Result<int> pool_blocks(int n_groups, int num_blocks, RuleOf rule_of, int n_state, SlotsOf slots_of) const noexcept {
    const std::int64_t full = static_cast<std::int64_t>(rows) * stride;
    std::int64_t blocks = num_blocks;
    if (num_blocks == 0) {
      for (int g = 0; g < n_groups && blocks <= (1 << 30); ++g) blocks += rule_of(g).pool_blocks(full, rows, stride);
      for (int k = 0; k < n_state; ++k) {
        const std::int64_t logical = static_cast<std::int64_t>(rows) * slots_of(k);
        blocks += logical + (max_step_tokens < logical ? max_step_tokens : logical);
      }
    }
    KVCORE_CHECK_OR_RETURN_ERROR(blocks <= 0x7fffffff / block_size, InvalidArgument,
                                 "the pool: %lld%s blocks of %d rows pass 2^31 rows", static_cast<long long>(blocks),
                                 num_blocks == 0 ? " or more" : "", block_size);
    // A pool's key table takes a power of two >= 2 slots per block, in int.
    KVCORE_CHECK_OR_RETURN_ERROR(blocks <= (1 << 30), InvalidArgument,
                                 "the pool: %lld%s blocks: a pool holds at most 2^30 blocks",
                                 static_cast<long long>(blocks), num_blocks == 0 ? " or more" : "");
    return static_cast<int>(blocks);
  }
};

}  // namespace kvcore
