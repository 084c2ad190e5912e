// The many-sequence step and its plan, in the varlen paged format paged
// attention kernels consume (FlashInfer, flash-attn's block_table +
// cache_seqlens, vLLM): a row per new token, per sequence its query range,
// context length and block table (holes explicit), the window, and the block
// copies to perform first. Every array lives in buffers the cache sized at
// creation; a plan points into them and stays valid until the cache's next
// mutating call (begin_step, commit, any sequence verb).
#pragma once

#include <cstdint>

namespace kvcore {

/// One sequence's part of a step: T new tokens at positions length(seq) ...
/// `tokens` (optional, T ids) names them for prefix reuse; without it the
/// sequence's later blocks cannot be found by their content.
struct StepEntry {
  int seq = 0;
  int T = 0;
  const std::int32_t* tokens = nullptr;
};

/// A begun many-sequence step: the handle begin_step() returns.
struct BatchStep {
  /// Unique per begin_step() of one cache; 0 never names a begun step.
  std::uint64_t id = 0;
  /// Sequences in the step and their new tokens in all.
  int n_entries = 0;
  int n_tokens = 0;
};

/// A block a backend copies before writing (copy-on-write: a shared, partly
/// filled block that one holder now writes into): all B rows of `src` to `dst`.
struct BlockCopy {
  int src = 0;
  int dst = 0;
};

/// A removed range of positions [begin, end): never visible to its sequence again.
struct PositionRange {
  int begin = 0;
  int end = 0;
};

/// One group's part of the plan (a group: the layers sharing one policy and
/// one block pool).
struct GroupPlan {
  /// Physical row of each new token, in token order (block * B + offset): the
  /// write destinations (`slot_mapping`).
  const int* slots = nullptr;
  /// Copies to perform before writing.
  const BlockCopy* copies = nullptr;
  int n_copies = 0;
  /// The block tables of every sequence id: row `seq` (stride `table_stride`)
  /// maps block index i (positions [iB, (i+1)B)) to a block, -1 for a hole (a
  /// block released: out of the window, removed, or never written). Entry i of
  /// the step reads row seq_ids[i], its first ceil(context_lens[i] / B) entries.
  const int* block_tables = nullptr;
  int table_stride = 0;
};

/// The plan of a step: per-entry arrays (shared by every group) and one
/// GroupPlan per group. Tokens are laid out sequence after sequence in entry
/// order; entry i's queries are tokens [query_starts[i], query_starts[i + 1]),
/// at positions first_positions[i] + j.
struct BatchStepPlan {
  int n_entries = 0;
  int n_tokens = 0;
  int block_size = 0;
  const int* seq_ids = nullptr;          // n_entries
  const int* query_starts = nullptr;     // n_entries + 1
  const int* first_positions = nullptr;  // n_entries: length before the step
  const int* context_lens = nullptr;     // n_entries: length after the step
  /// Per entry: positions below `visible_starts[i]` are removed (never seen).
  const int* visible_starts = nullptr;
  /// Per entry: its removed middle ranges, sorted, holes[i][0 .. n_holes[i]).
  const PositionRange* const* holes = nullptr;
  const int* n_holes = nullptr;
  int n_groups = 0;
  const GroupPlan* groups = nullptr;
};

}  // namespace kvcore
