// The two faces of a many-sequence cache, reachable from CacheBase without
// RTTI: the runner drives sequences (BatchControl), the backend asks where
// bytes go (BatchPlanner). CacheBase looks faces up by FaceId; this header
// types the batch ids by specializing FaceType (as_batch_control(),
// as_batch_planner()), so the core names no batch type. docs/design.md
// section 6 is the contract. Sequence ids are 0 .. max_seqs() - 1.
#pragma once

#include <cstdint>

#include "kvcore/batch/batch_plan.h"
#include "kvcore/core/cache_base.h"
#include "kvcore/core/config.h"
#include "kvcore/core/result.h"

namespace kvcore {

/// One sequence's state, as the runner sees it.
struct SequenceInfo {
  /// False until add_sequence() or fork() (and after release_sequence()).
  bool active = false;
  /// Committed length L: the next step writes positions L, L + 1, ...
  int length = 0;
  /// Positions below `visible_start` were removed (remove(seq, 0, p1)).
  int visible_start = 0;
  /// Removed middle ranges, sorted: holes[0 .. n_holes). `holes` points into
  /// the cache's own table: valid until the sequence's next remove, rewind,
  /// fork into it, release or clear (copy what you keep).
  int n_holes = 0;
  const PositionRange* holes = nullptr;

  /// Positions [0, length) not removed: how many the sequence still sees.
  int visible_positions() const noexcept {
    int n = length - visible_start;
    for (int i = 0; i < n_holes; ++i) n -= holes[i].end - holes[i].begin;
    return n;
  }
};

/// Runner face: sequences, steps, prefix reuse. Every failing call changes nothing.
class BatchControl {
 public:
  /// Sequence ids are 0 .. max_seqs() - 1 (BatchLimits::max_seqs).
  virtual int max_seqs() const noexcept = 0;
  /// Largest length of one sequence.
  virtual int capacity() const noexcept = 0;
  /// Largest T of one sequence in one step (C).
  virtual int max_step() const noexcept = 0;
  /// Largest number of new tokens of one step, over all its sequences.
  virtual int max_step_tokens() const noexcept = 0;

  /// Starts an empty sequence in the default prefix namespace (0).
  /// InvalidArgument: seq outside [0, max_seqs). InvalidState: seq is active.
  virtual Status add_sequence(int seq) noexcept = 0;
  /// Starts an empty sequence whose full blocks are named (and whose
  /// adopt_prefix looks up) in prefix namespace `prefix_namespace`, a 64-bit
  /// salt (0: the default namespace): blocks of different namespaces never
  /// match, so requests whose K/V differ for equal tokens (another tenant,
  /// LoRA adapter, model revision, multimodal input) never share them. Forks
  /// inherit it. Errors as add_sequence(seq).
  virtual Status add_sequence(int seq, std::uint64_t prefix_namespace) noexcept = 0;
  /// The prefix namespace `seq` names its blocks in (0 once released).
  /// InvalidArgument: seq out of range.
  virtual Result<std::uint64_t> prefix_namespace(int seq) const noexcept = 0;
  /// Ends a sequence; its blocks return to their pools once no sequence holds
  /// them (full blocks with a content key stay reusable). InvalidArgument: seq
  /// out of range. InvalidState: seq is not active.
  virtual Status release_sequence(int seq) noexcept = 0;
  /// `dst` inherits positions [0, upto) of `src` by sharing its blocks (no K/V
  /// copied; a shared, partly filled block is copied when one side writes into
  /// it), and src's prefix namespace. dst becomes active. InvalidArgument: ids out of range, src == dst, upto
  /// outside [0, length(src)]. InvalidState: src not active, dst active and not
  /// empty, or src no longer holds what a query of dst at `upto` needs (the
  /// rewind rule).
  virtual Status fork(int src, int dst, int upto) noexcept = 0;
  /// Positions [p0, min(p1, length)) leave the sequence's history, never to be
  /// seen by it again (llama.cpp's seq_rm). p0 < length <= p1 is a truncation:
  /// rewind(seq, p0), with its rule (always allowed for p0 = 0); p0 >= length
  /// (or p0 == p1) names no held position: a successful no-op, as seq_rm's
  /// (rewind refuses p0 > length). A block returns
  /// to its pool once no sequence holds a position in it. InvalidArgument: seq
  /// out of range, p0 < 0 or p1 < p0. InvalidState: seq not active, or the
  /// truncation breaks the rewind rule. OutOfResources: a middle range beyond
  /// BatchLimits::max_holes separate ones.
  virtual Status remove(int seq, int p0, int p1) noexcept = 0;
  /// length(seq) = n, docs/design.md section 2's rule per sequence: every ring group
  /// must still hold what a query at n needs below n (up to max_step tokens
  /// back always work; n <= sinks too). Ends a begun step. InvalidArgument: seq
  /// out of range, n outside [0, length]. InvalidState: seq not active, or
  /// history a query at n needs was released.
  virtual Status rewind(int seq, int n) noexcept = 0;
  /// True exactly when rewind(seq, n) would succeed. Never fails.
  virtual bool can_rewind(int seq, int n) const noexcept = 0;
  /// Prefix reuse: an empty active sequence adopts the longest run of cached
  /// full blocks that `tokens[0, n)` names in the sequence's prefix namespace
  /// (chained hashes of their ids from the namespace's root; at most n - 1
  /// tokens, so the last token is computed) and that every group holds (a
  /// ring group: what a query at the hit length needs). Returns the hit
  /// length, a multiple of B (0 on a miss); length(seq) becomes it.
  /// InvalidArgument: seq out of range, n < 0 or n > capacity, tokens null with
  /// n > 0. InvalidState: seq not active or not empty.
  virtual Result<int> adopt_prefix(int seq, const std::int32_t* tokens, int n) noexcept = 0;
  /// adopt_prefix(seq, tokens, n) after the empty sequence takes prefix
  /// namespace `prefix_namespace` (as add_sequence(seq, prefix_namespace)
  /// gives it; kept on a miss). Errors as adopt_prefix (nothing changes).
  virtual Result<int> adopt_prefix(int seq, const std::int32_t* tokens, int n,
                                   std::uint64_t prefix_namespace) noexcept = 0;
  /// The hit length adopt_prefix() would give an empty sequence of prefix
  /// namespace `prefix_namespace` for `tokens[0, n)` now, with no side effect:
  /// no block is held, no cached block's recency moves, a begun step stays
  /// begun. A scheduler asks it before deciding to admit. O(n / B) hashing and
  /// lookups per group, whatever the order of the groups. InvalidArgument: n
  /// < 0 or n > capacity, tokens null with n > 0.
  virtual Result<int> lookup_prefix(const std::int32_t* tokens, int n,
                                    std::uint64_t prefix_namespace) const noexcept = 0;

  /// Begins one forward over `entries[0, n)` (distinct sequences, tokens laid
  /// out entry after entry), replacing an uncommitted step. A step that ends
  /// uncommitted (replaced, or ended by any verb) leaves every block table as
  /// it was: the backend may have written none, some or all of its plan. While
  /// it is begun, it keeps holding the blocks its copies read. Admission is
  /// decided here: when a group lacks the blocks the step needs (after
  /// reclaiming cached ones and the replaced step's), nothing changes.
  /// An entry with `parents` is a draft tree of T nodes (batch_plan.h): it
  /// takes the blocks of a chain of T. InvalidArgument: n outside [1, max_seqs], a bad or
  /// repeated seq, T outside [1, max_step], more than max_step_tokens tokens,
  /// parents not a tree in topological order (parents[0] != -1, a second
  /// root, parents[i] outside [0, i)).
  /// InvalidState: a sequence not active. OutOfResources: a sequence would pass
  /// capacity, or a group's pool is short (the message names it).
  virtual Result<BatchStep> begin_step(const StepEntry* entries, int n) noexcept = 0;
  /// Ok when `step` is the begun, uncommitted step; InvalidState otherwise.
  virtual Status check_step(const BatchStep& step) const noexcept = 0;
  /// Every entry's length grows by its T; full blocks named by their tokens
  /// become reusable; ring groups release blocks out of every future query's
  /// reach. InvalidState unless `step` is the begun step. InvalidArgument
  /// (nothing changes) when an entry is a tree (not a chain): commit it with
  /// its accepted path.
  virtual Status commit(const BatchStep& step) noexcept = 0;
  /// Commits the begun step with the accepted root path of each listed
  /// sequence (docs/design.md section 7): its length grows by the path's m
  /// nodes, position length + d holding node nodes[d]; unlisted entries must
  /// be chains and commit whole. Blocks reserved only for rejected nodes
  /// return to their pools. Returns per group the row copies the backend
  /// performs before the next step (in order; none for a main-line path, at
  /// most m - 1 per path otherwise), in the cache's buffers until its next
  /// mutating call; afterwards the cache is as if each sequence had decoded
  /// its accepted tokens as a chain. InvalidState unless `step` is the begun
  /// step. InvalidArgument (nothing changes): n < 0, accepted null with n > 0,
  /// a sequence not in the step or listed twice, m outside [1, N], a node
  /// index outside [0, N), nodes not a root path, a tree entry not listed.
  virtual Result<BatchCommit> commit(const BatchStep& step, const AcceptedPath* accepted, int n) noexcept = 0;
  /// Ends `step`, the begun step, without committing it: every table, block,
  /// count and length is as before begin_step (the blocks it allocated return
  /// to their pools, a copy-on-write source is shared again), but a State
  /// group's state slot the step writes stays lost, even a fresh physical one
  /// (docs/batch.md section 10). InvalidState (nothing changes) unless `step`
  /// is the begun step.
  virtual Status abort(const BatchStep& step) noexcept = 0;
  /// Ends every sequence and forgets every cached block. Always succeeds.
  virtual void clear() noexcept = 0;

  /// The sequence's state. InvalidArgument: seq out of range.
  virtual Result<SequenceInfo> sequence(int seq) const noexcept = 0;
  /// Groups: one per distinct layer policy, each with its own block pool.
  virtual int n_groups() const noexcept = 0;
  /// Blocks of `group` no sequence holds (reclaimable cached ones included).
  /// InvalidArgument: group out of range.
  virtual Result<int> free_blocks(int group) const noexcept = 0;
  /// Free blocks of `group` that still hold a reusable prefix (named by their
  /// tokens). InvalidArgument: group out of range.
  virtual Result<int> cached_blocks(int group) const noexcept = 0;
  /// Blocks of `group` the sequence holds. InvalidArgument: bad seq or group.
  virtual Result<int> blocks_held(int seq, int group) const noexcept = 0;
  /// The oldest position whose block `group` still holds for the sequence
  /// (length when none). InvalidArgument: bad seq or group.
  virtual Result<int> oldest_held(int seq, int group) const noexcept = 0;

 protected:
  ~BatchControl() = default;
};

/// Backend face: groups, their pools, and the plan of the begun step.
class BatchPlanner {
 public:
  /// Layers of the model the cache was built for.
  virtual int n_layers() const noexcept = 0;
  /// Groups: one per distinct layer policy; a plan has one GroupPlan each.
  virtual int n_groups() const noexcept = 0;
  /// Rows per block, B.
  virtual int block_size() const noexcept = 0;
  /// The group (policy and block pool) of `layer`. InvalidArgument: bad
  /// layer, or a State layer (it has no block group: state_group_of).
  virtual Result<int> group_of(int layer) const noexcept = 0;
  /// State groups: one per distinct State policy (docs/design.md section 9);
  /// a plan has one StateGroupPlan each. 0 without State layers (the
  /// default for planners that plan none).
  virtual int n_state_groups() const noexcept { return 0; }
  /// The State group of State layer `layer`. InvalidArgument: bad layer, or
  /// not a State layer.
  virtual Result<int> state_group_of(int /*layer*/) const noexcept { return Error::InvalidArgument; }
  /// The State policy (slots D) of `state_group`'s layers. InvalidArgument:
  /// bad state group.
  virtual Result<LayerPolicy> state_group_policy(int /*state_group*/) const noexcept { return Error::InvalidArgument; }
  /// Physical state slots of `state_group` (every slot a plan or commit names
  /// is below it; a layer of the group keeps this many states).
  /// InvalidArgument: bad state group.
  virtual Result<int> num_state_slots(int /*state_group*/) const noexcept { return Error::InvalidArgument; }
  /// `layer`'s policy and row shape. InvalidArgument: bad layer.
  virtual Result<LayerConfig> layer_config(int layer) const noexcept = 0;
  /// The policy of `group`'s layers. InvalidArgument: bad group.
  virtual Result<LayerPolicy> group_policy(int group) const noexcept = 0;
  /// Blocks in `group`'s pool (its rows: num_blocks * B). InvalidArgument: bad group.
  virtual Result<int> num_blocks(int group) const noexcept = 0;
  /// One past the highest block of `group` any sequence holds (BatchCache: of
  /// any group, they draw from one pool): every live row of the group lies in
  /// rows [0, used_blocks * B) (allocation takes the lowest free block, so
  /// this stays near the blocks in use). InvalidArgument: bad group.
  virtual Result<int> used_blocks(int group) const noexcept = 0;
  /// The layer whose storage `layer`'s K/V rows may live in: itself, or an
  /// earlier layer of another group when the groups draw their blocks from
  /// one pool (a block belongs to one group at a time, so row r of the two
  /// layers is never live in both). A byte layer shares the storage when the
  /// two layers' rows have one size, else gives each its own. The default
  /// (planners whose groups have pools of their own): the layer itself.
  /// InvalidArgument: bad layer.
  virtual Result<int> storage_layer(int layer) const noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(layer >= 0 && layer < n_layers(), InvalidArgument,
                                 "layer = %d: must be in [0, n_layers = %d)", layer, n_layers());
    return layer;
  }
  /// The plan of the begun step. InvalidState: `step` is not the begun step.
  virtual Result<BatchStepPlan> plan(const BatchStep& step) const noexcept = 0;
  /// May a query of `seq` at position q see its key at k on `group`'s layers?
  /// (k <= q, not removed, and in the window or a sink.) InvalidArgument: bad
  /// group or seq, q or k < 0.
  virtual Result<bool> visible(int group, int seq, int q, int k) const noexcept = 0;

 protected:
  ~BatchPlanner() = default;
};

/// The batch faces' types for CacheBase's face lookup (as_batch_control(),
/// as_batch_planner(), as_face<FaceId::batch_control>()).
template <>
struct FaceType<FaceId::batch_control> : FaceTypeIs<BatchControl> {};
template <>
struct FaceType<FaceId::batch_planner> : FaceTypeIs<BatchPlanner> {};

}  // namespace kvcore
