// The many-sequence step and its plan, in the varlen paged format paged
// attention kernels consume (FlashInfer, flash-attn's block_table +
// cache_seqlens, vLLM): a row per new token, per sequence its query range,
// context length and block table (holes explicit), the window, and the block
// copies to perform first. Every array lives in buffers the cache sized at
// creation; a plan points into them and stays valid until the cache's next
// mutating call (begin_step, commit, any sequence verb).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvcore/core/config.h"
#include "kvcore/core/draft_tree.h"

namespace kvcore {

/// One sequence's part of a step: T new tokens at positions length(seq) ...
/// `tokens` (optional, T ids) names them for prefix reuse; without it the
/// sequence's later blocks cannot be found by their content. `parents`
/// (optional, T values) makes the tokens a draft tree of N = T nodes
/// (docs/design.md section 7): parents[0] = -1, 0 <= parents[i] < i; node i
/// stands at position length(seq) + depth(i). A chain (parents[i] = i - 1) is
/// the plain step. `verify`: a chain step that may be rewound into (a
/// speculative verify step): State groups keep the state after each of its
/// positions, which needs T <= slots - 1; without it they keep only the last
/// (a tree always keeps each node's). Models without State layers ignore it.
struct StepEntry {
  int seq = 0;
  int T = 0;
  const std::int32_t* tokens = nullptr;
  const int* parents = nullptr;
  bool verify = false;
};

/// The accepted root path of a tree entry, for commit(step, accepted): node
/// indices, nodes[0] = 0 and each the child of the one before, m >= 1 of them.
struct AcceptedPath {
  int seq = 0;
  const int* nodes = nullptr;
  int m = 0;
};

/// One group's row copies of a tree commit, in the order to perform them:
/// in every layer of the group, the K/V of row `src` to row `dst` (rows are
/// block * B + offset).
struct GroupCommit {
  const TreeCopy* copies = nullptr;
  int n_copies = 0;
};

/// What commit(step, accepted) asks of the backend before the next step: per
/// group, rows to copy so that each accepted node's K/V lands at the position
/// it was accepted at, and per State group, physical state slots to copy (in
/// every layer of the group, the state in slot `src` to slot `dst`) so that
/// each accepted node's state lands in the slot a chain decode would have
/// written. Points into the cache's buffers: valid until its next mutating call.
struct BatchCommit {
  int n_groups = 0;
  const GroupCommit* groups = nullptr;
  int n_state_groups = 0;
  const GroupCommit* state_groups = nullptr;
  /// Copies over every group and State group.
  int total_copies() const noexcept {
    int n = 0;
    for (int g = 0; g < n_groups; ++g) n += groups[g].n_copies;
    for (int g = 0; g < n_state_groups; ++g) n += state_groups[g].n_copies;
    return n;
  }
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
  /// The block tables, one row per active sequence: a row maps block index i
  /// (positions [iB, (i+1)B)) to a block, -1 for a hole (a block released:
  /// out of the window, removed, or never written). Entry i of the step reads
  /// row table_rows[seq_ids[i]] (BatchStepPlan), its first
  /// ceil(context_lens[i] / B) entries, through table_row(), which reads
  /// both layouts below.
  /// Unpaged tables (BatchLimits::table_page_blocks = 0): dense rows of
  /// `table_stride` entries, [rows][table_stride]. Paged: null.
  const int* block_tables = nullptr;
  /// Entries per row: ceil(capacity / B).
  int table_stride = 0;
  /// Every layout: row r's index i is entry i % page_blocks of page
  /// table_dir[r * dir_stride + i / page_blocks] of `table_pages` (pages of
  /// page_blocks entries; a page id of -1: every entry -1). Unpaged, a row is
  /// one page (dir_stride 1, page_blocks = table_stride). `page_shift`:
  /// i / page_blocks is i >> page_shift (31 when a row is one page).
  const int* table_pages = nullptr;
  const int* table_dir = nullptr;
  int dir_stride = 1;
  int page_blocks = 0;
  int page_shift = 31;
  /// The group's policy: the window bounds of the visibility rule (window and
  /// sinks of a ring; flat: every earlier position).
  LayerPolicy policy;
};

/// One State group's part of the plan (docs/design.md section 9: the State
/// layers keeping the same number D of state slots per sequence). Slots are
/// physical state slot indices in [0, num_slots), the `state_indices` a
/// recurrent kernel takes: layer l of the group keeps its state of slot i at
/// state[l][i]. Per token j of the step (token order, as GroupPlan::slots):
/// - read_slots[j]: the slot holding the state token j starts from: for an
///   entry's first token (a tree's root) the state after position first - 1,
///   -1 at position 0 (the state is zeros); for a tree node its parent's
///   write slot; for a chain token j > 0 the previous token's write slot, or
///   -1 when the step does not keep it (the previous token's state, carried
///   within this forward).
/// - write_slots[j]: where token j's state (the state after its position) is
///   written, -1 when the step does not keep it: a chain step without
///   `verify` keeps only its last token's; a verify step or a tree keeps every
///   token's (node j in the slot of position first + chain_index[j]).
/// No slot a step reads is written by another entry of the step; an entry may
/// write the slot it reads (a step of T = k * D tokens without verify).
struct StateGroupPlan {
  const int* read_slots = nullptr;   // n_tokens
  const int* write_slots = nullptr;  // n_tokens
  /// D: logical slots per sequence (the policy's slots).
  int slots_per_seq = 0;
  /// Physical slots of the group: rows x D + min(max_step_tokens, rows x D)
  /// + state_snapshots.
  int num_slots = 0;
  LayerPolicy policy;
};

/// The plan of a step: per-entry arrays (shared by every group) and one
/// GroupPlan per group. Tokens are laid out sequence after sequence in entry
/// order; entry i's queries are tokens [query_starts[i], query_starts[i + 1]),
/// at positions first_positions[i] + j for a chain, first_positions[i] +
/// depth(j) for a tree (`positions` gives each token's).
///
/// A tree entry of N nodes takes the rows a chain of T = N would: the block
/// table names positions [first, first + N) of the entry, and node j's row
/// (its slot) is the row of position first + chain_index[j] there. Reading a
/// tree entry's keys: its history [0, first) by the table and the rule at the
/// node's position, and its own nodes by `tree_masks` (ancestors and itself,
/// window applied by depth); fill_step_mask does both.
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
  /// Per sequence id (max_seqs of them): its row in every group's
  /// block_tables, -1 for an inactive sequence. Row s for sequence s unless
  /// BatchLimits::max_active_seqs is below max_seqs. Null: row seq_ids[i].
  const int* table_rows = nullptr;
  /// n_tokens: each token's position (first + j, or first + depth for a tree node).
  const int* positions = nullptr;
  /// n_tokens: each token's place among its entry's reserved positions (the
  /// table names node j at first + chain_index[j]); j for a chain.
  const int* chain_index = nullptr;
  /// n_entries + 1: entry i's ancestor mask is tree_masks[tree_mask_starts[i]
  /// .. tree_mask_starts[i + 1]) (32-bit words); an empty range is a chain.
  /// Layout: N rows of ceil(N / 32) words, row j bit k (word k / 32, bit
  /// k % 32) set when node k is j or an ancestor of j.
  const int* tree_mask_starts = nullptr;
  const std::uint32_t* tree_masks = nullptr;
  /// One StateGroupPlan per State group (none without State layers).
  int n_state_groups = 0;
  const StateGroupPlan* state_groups = nullptr;
  /// Is entry i a tree (not a chain)?
  bool is_tree(int entry) const noexcept {
    return tree_mask_starts != nullptr && tree_mask_starts[entry + 1] > tree_mask_starts[entry];
  }
};

/// One sequence's block table row in a plan, either layout: row[i] is the
/// block of block index i, -1 for a hole.
struct TableRow {
  const int* pages = nullptr;
  const int* dir = nullptr;
  int page_blocks = 0;
  int page_shift = 31;
  int operator[](int i) const noexcept {
    const int page = dir[i >> page_shift];
    const int at = page_shift >= 31 ? i : i & (page_blocks - 1);
    return page < 0 ? -1 : pages[static_cast<std::ptrdiff_t>(page) * page_blocks + at];
  }
};

/// The block table row of entry `entry` in group `g` of `plan`.
inline TableRow table_row(const BatchStepPlan& plan, int g, int entry) noexcept {
  const GroupPlan& gp = plan.groups[g];
  const int seq = plan.seq_ids[entry];
  const int row = plan.table_rows != nullptr ? plan.table_rows[seq] : seq;
  return TableRow{gp.table_pages, gp.table_dir + static_cast<std::ptrdiff_t>(row) * gp.dir_stride, gp.page_blocks,
                  gp.page_shift};
}

/// Calls f(begin, end) for each maximal run [begin, end) of the positions that
/// some query of entry `entry` at a position in [first, end_q) sees under
/// `policy` (the sinks [0, min(sinks, end_q)) and the window
/// [policy.window_begin(first), end_q)), less the entry's removed positions,
/// in increasing order; stops when f returns false. The entry's queries:
/// first = first_positions[entry], end_q = context_lens[entry]; one query q:
/// first = q, end_q = q + 1. A plan without hole arrays has no holes.
template <typename F>
void for_each_visible_run(const BatchStepPlan& plan, int entry, const LayerPolicy& policy, int first,
                          int end_q, F f) noexcept {
  const int start = plan.visible_starts[entry];
  const PositionRange* holes = plan.holes != nullptr ? plan.holes[entry] : nullptr;
  const int n_holes = plan.n_holes != nullptr && holes != nullptr ? plan.n_holes[entry] : 0;
  int ranges[2][2] = {{0, end_q}, {end_q, end_q}};
  const int window_from = policy.window_begin(first);
  const int sink_end = policy.sinks < end_q ? policy.sinks : end_q;
  if (sink_end < window_from) {
    ranges[0][1] = sink_end;
    ranges[1][0] = window_from;
  }
  for (const auto& range : ranges) {
    int cursor = range[0] > start ? range[0] : start;
    const int end = range[1];
    for (int h = 0; h < n_holes && cursor < end; ++h) {
      if (holes[h].end <= cursor) continue;
      if (holes[h].begin >= end) break;
      if (holes[h].begin > cursor && !f(cursor, holes[h].begin)) return;
      cursor = holes[h].end;
    }
    if (cursor < end && !f(cursor, end)) return;
  }
}

}  // namespace kvcore
