// SequenceCache: one logical length for every layer; each layer plans through
// its LayoutPolicy (flat, ring, chunked, shared or state: docs/design.md
// sections 2 and 9), and identical policies share one object (layer_policies.h
// keeps them). Per policy it keeps a few integers of what the rows still hold (a window's oldest
// position, a state layer's slot table), which makes can_rewind() exact. Draft trees (section 7) step through the same
// plans: a tree of N nodes reserves the rows of a chain step of N
// (sequence_tree.h keeps the tree's layout and the commit's copies). Nothing
// on the per-step path allocates (a tree larger than any before grows the
// tree storage once: reserve_tree() sizes it ahead).
#pragma once

#include <cstdint>
#include <memory>
#include <new>

#include "kvcore/core/buffer.h"
#include "kvcore/core/cache_base.h"
#include "kvcore/core/config.h"
#include "kvcore/core/layer_policies.h"
#include "kvcore/core/sequence_tree.h"

namespace kvcore {

class SequenceCache final : public CacheBase, public SequenceControl, public SequencePlanner {
 public:
  /// Validates `cfg` (InvalidArgument naming the bad field) and builds the cache.
  /// MemoryAllocationFailed (naming what) when the cache object, its tables or a
  /// policy cannot be allocated; nothing is kept. Every allocation is nothrow:
  /// create() never throws or aborts.
  static Result<std::unique_ptr<SequenceCache>> create(const CacheConfig& cfg) noexcept {
    KVCORE_RETURN_IF_ERROR(validate(cfg));
    std::unique_ptr<SequenceCache> cache(new (std::nothrow) SequenceCache(cfg));
    KVCORE_CHECK_OR_RETURN_ERROR(cache != nullptr, MemoryAllocationFailed,
                                 "cannot allocate a SequenceCache of %d layers", cfg.n_layers);
    KVCORE_RETURN_IF_ERROR(cache->build_tables(cfg.layers.data(), cfg.layers.size()));
    return cache;
  }

  SequenceCache(const SequenceCache&) = delete;
  SequenceCache& operator=(const SequenceCache&) = delete;

  /// An independent cache in the same state: config, length, the begun step
  /// (its id included, so a copy of its handle commits the clone) and every
  /// policy's rewind floor; it continues exactly as this one would.
  /// MemoryAllocationFailed (naming what): as create(); nothing is kept.
  Result<std::unique_ptr<SequenceCache>> clone() const noexcept {
    std::unique_ptr<SequenceCache> copy(new (std::nothrow) SequenceCache(*this, Cloning{}));
    KVCORE_CHECK_OR_RETURN_ERROR(copy != nullptr, MemoryAllocationFailed,
                                 "cannot allocate a SequenceCache of %d layers", n_layers_);
    KVCORE_RETURN_IF_ERROR(copy->build_tables(policies_.configs(), static_cast<std::size_t>(n_layers_)));
    copy->length_ = length_;
    copy->active_ = active_;
    copy->last_step_id_ = last_step_id_;
    copy->policies_.copy_state_from(policies_);
    KVCORE_RETURN_IF_ERROR(tree_.copy_to(copy->tree_));
    return copy;
  }

  // CacheBase.
  void* face(FaceId id) noexcept override {
    if (id == FaceId::sequence_control) return static_cast<SequenceControl*>(this);
    if (id == FaceId::sequence_planner) return static_cast<SequencePlanner*>(this);
    return nullptr;
  }

  // SequenceControl.
  int length() const noexcept override { return length_; }
  int capacity() const noexcept override { return capacity_; }
  int max_step() const noexcept override { return max_step_; }

  bool can_extend(int n) const noexcept override {
    return n >= 0 && static_cast<std::int64_t>(length_) + n <= capacity_;
  }

  Result<Step> begin_step(int T) noexcept override { return begin_step(T, false); }

  /// begin_step(T) for a step that may be rewound into when `verify` (a
  /// speculative verify step): State layers then keep the state after each of
  /// its positions, so rewind() and commit(step, accepted) may stop anywhere
  /// in it; without it they keep only the last (docs/design.md section 9).
  /// Layers of other kinds plan the same either way. Errors as begin_step(T),
  /// plus InvalidArgument: verify with T > slots - 1 on a State layer;
  /// InvalidState: a State layer no longer holds the state after length - 1
  /// (an aborted step overwrote its slot: rewind to a held length or clear()).
  /// Any error changes nothing.
  Result<Step> begin_step(int T, bool verify) noexcept {
    KVCORE_RETURN_IF_ERROR(check_next_step(T, verify));
    return start_step(T, false, verify);
  }

  /// Begins a draft-tree step (docs/design.md section 7) of N = n nodes given
  /// by `parents` (parents[0] = -1, 0 <= parents[i] < i): node i stands at
  /// position length() + depth(i). The step is planned as a chain step of
  /// T = N (plan() gives exactly that plan, the same rows); tree(step) gives
  /// each node's position, chain index (its row is the one of position
  /// length() + chain index) and the packed ancestor mask. A chain given as a
  /// tree plans exactly as begin_step(N). Replaces an uncommitted step.
  /// InvalidArgument: N outside [1, max_step], parents[0] != -1, a second root,
  /// parents[i] outside [0, i), N > slots - 1 on a State layer (node i
  /// reads its parent's state slot and writes its own). OutOfResources:
  /// length + N > capacity. InvalidState: as begin_step(T, verify).
  /// MemoryAllocationFailed: a tree larger than any before (beyond
  /// SequenceTree::kReservedNodes or reserve_tree()) found no memory. Any error
  /// changes nothing.
  Result<Step> begin_tree(const int* parents, int n) noexcept {
    KVCORE_RETURN_IF_ERROR(check_tree(parents, n, max_step_));
    KVCORE_RETURN_IF_ERROR(check_next_step(n, true));
    KVCORE_RETURN_IF_ERROR(tree_.reserve(n, policies_.size()));  // grows only past every earlier tree
    tree_.assign(parents, n, length_);
    return start_step(n, true, true);
  }

  /// Sizes the tree storage for trees of up to `max_nodes` nodes, so that
  /// begin_tree never allocates. InvalidArgument: max_nodes outside
  /// [1, max_step]. MemoryAllocationFailed: nothing changes.
  Status reserve_tree(int max_nodes) noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(max_nodes >= 1 && max_nodes <= max_step_, InvalidArgument,
                                 "reserve_tree(%d): needs 1 <= max_nodes <= max_step = %d",
                                 max_nodes, max_step_);
    if (max_nodes <= tree_.capacity()) return Error::Ok;
    KVCORE_CHECK_OR_RETURN_ERROR(!active_.tree, InvalidState,
                                 "reserve_tree(%d): a tree step is begun and growing would drop "
                                 "its layout: reserve before begin_tree",
                                 max_nodes);
    return tree_.reserve(max_nodes, policies_.size());
  }


  Status check_step(const Step& step) const noexcept override {
    KVCORE_CHECK_OR_RETURN_ERROR(active_.id != 0, InvalidState,
                                 "step (position %d, T %d): no step is begun", step.position,
                                 step.T);
    KVCORE_CHECK_OR_RETURN_ERROR(
        step.id == active_.id && step.position == active_.position && step.T == active_.T &&
            step.tree == active_.tree && step.verify == active_.verify,
        InvalidState, "step (position %d, T %d): not the begun step (position %d, T %d)",
        step.position, step.T, active_.position, active_.T);
    return Error::Ok;
  }

  /// As SequenceControl::commit; a tree step commits this way only when it is
  /// a chain. InvalidArgument (nothing changes): a tree step that is not a
  /// chain (commit it with its accepted path).
  Status commit(const Step& step) noexcept override {
    KVCORE_RETURN_IF_ERROR(check_step(step));
    KVCORE_CHECK_OR_RETURN_ERROR(
        !active_.tree || tree_.tree().is_chain(), InvalidArgument,
        "commit(step): the step at position %d is a draft tree of %d nodes, not a chain: "
        "commit it with its accepted path",
        active_.position, active_.T);
    tree_.record_commit(policies_.objects(), active_.position, nullptr, 0);
    if (active_.tree)  // a chain given as a tree: node i is position + i
      for (int i = 0; i < policies_.size(); ++i) policies_[i].note_tree_commit(held(i), active_.position, active_.T);
    length_ = active_.end();
    active_ = Step{};
    return Error::Ok;
  }

  /// Commits the accepted root path `accepted[0..m)` of `step` (a tree step,
  /// or a chain step whose path is 0, 1, ..., m - 1): length = position + m,
  /// and commit_copies(layer) lists the row copies the backend performs before
  /// the next step, after which position + d holds node accepted[d]'s K/V.
  /// None on the main line, at most m - 1 otherwise. The cache is then exactly
  /// one that stepped a chain of N and rewound to position + m.
  /// InvalidState: `step` is not the begun step; a chain step begun without
  /// verify stops early (m < T) on a model whose State layers kept only its
  /// last state. InvalidArgument: m outside [1, N], accepted[0] != 0, an index
  /// outside [0, N), accepted[d] not a child of accepted[d - 1]. Any error
  /// changes nothing.
  Status commit(const Step& step, const int* accepted, int m) noexcept {
    KVCORE_RETURN_IF_ERROR(check_step(step));
    const int end = active_.position + m;
    if (active_.tree) {
      KVCORE_RETURN_IF_ERROR(check_accepted(tree_.tree().parents(), active_.T, accepted, m));
    } else {
      KVCORE_RETURN_IF_ERROR(check_chain_path(accepted, m));
      const int blocking = rewind_blocker(end);
      if (blocking >= 0) return blocked("commit(step, accepted) to length", end, blocking);
    }
    tree_.record_commit(policies_.objects(), active_.position, active_.tree ? accepted : nullptr, m);
    // As rewind(end) after a chain of N: rows above the length are dead.
    for (int i = 0; i < policies_.size(); ++i) {
      if (active_.tree) policies_[i].note_tree_commit(held(i), active_.position, m);
      policies_[i].note_truncate(held(i), end);
    }
    length_ = end;
    active_ = Step{};
    return Error::Ok;
  }

  /// `layer`'s row copies (src row, dst row) of the last commit: performed in
  /// order before the next step. Empty after a chain commit. Valid until the
  /// next commit. InvalidArgument: bad layer.
  Result<RowCopies> commit_copies(int layer) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_layer(layer));
    return tree_.copies(group_of(layer));
  }

  /// The begun tree step's layout: per node its position, chain index and the
  /// packed ancestor mask (draft_tree.h). Valid until the next begin.
  /// InvalidState: `step` is not the begun step. InvalidArgument: it was begun
  /// by begin_step, not begin_tree.
  Result<const DraftTree*> tree(const Step& step) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_step(step));
    KVCORE_CHECK_OR_RETURN_ERROR(active_.tree, InvalidArgument,
                                 "step at position %d (T %d) was begun by begin_step, not "
                                 "begin_tree: it has no tree",
                                 active_.position, active_.T);
    return &tree_.tree();
  }

  /// Fills `rows[0..N)` with the row each node of the begun tree step writes
  /// on `layer` (the row of position + chain index): on a State layer the
  /// node's state slot (node i reads its parent's, the root the plan's read
  /// slot); on a Shared layer the row its source writes, which it reads.
  /// Errors as tree(step), plus InvalidArgument for a bad layer.
  Status tree_rows(int layer, const Step& step, int* rows) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_layer(layer));
    KVCORE_ASSIGN_OR_RETURN(const DraftTree* t, tree(step));
    const LayoutPolicy& holder = policy(row_layer(layer));
    for (int i = 0; i < t->size(); ++i) rows[i] = holder.row(t->position() + t->chain_indices()[i]);
    return Error::Ok;
  }

  /// Fills `out` (N rows of plan(layer).read_len() bytes) with the dense
  /// (tokens, keys) mask of the begun tree step on `layer`: 1 where node i's
  /// query sees the key the read row holds (DraftTree::dense_mask). Errors as
  /// tree_rows(), plus InvalidArgument on a State layer (it has no keys).
  Status dense_tree_mask(int layer, const Step& step, std::uint8_t* out) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_layer(layer));
    KVCORE_ASSIGN_OR_RETURN(const DraftTree* t, tree(step));
    KVCORE_CHECK_OR_RETURN_ERROR(policies_.config(layer).policy.kind != LayerPolicy::Kind::State,
                                 InvalidArgument,
                                 "layer %d is a State layer: it has no keys to mask (node i "
                                 "reads its parent's state slot)",
                                 layer);
    t->dense_mask(policy(layer).visibility(), step_plan(layer), out);
    return Error::Ok;
  }

  Status abort(const Step& step) noexcept override {
    KVCORE_RETURN_IF_ERROR(check_step(step));
    // The step's rows count as written (what they overwrote is gone), but
    // what it wrote belongs to no committed position.
    for (int i = 0; i < policies_.size(); ++i) policies_[i].note_truncate(held(i), active_.position);
    active_ = Step{};
    return Error::Ok;
  }

  Status rewind(int n) noexcept override {
    KVCORE_CHECK_OR_RETURN_ERROR(n >= 0 && n <= length_, InvalidArgument,
                                 "rewind(n = %d): must be in [0, length = %d]", n, length_);
    const int blocking = rewind_blocker(n);
    if (blocking >= 0) return blocked("rewind(n", n, blocking);
    length_ = n;
    active_ = Step{};
    // Rows above n are dead: nothing above n is held.
    for (int i = 0; i < policies_.size(); ++i) policies_[i].note_truncate(held(i), n);
    return Error::Ok;
  }

  bool can_rewind(int n) const noexcept override {
    return n >= 0 && n <= length_ && rewind_blocker(n) < 0;
  }

  void clear() noexcept override {
    length_ = 0;
    active_ = Step{};
    for (int i = 0; i < policies_.size(); ++i) policies_[i].reset_held(held(i));
  }

  // SequencePlanner.
  int n_layers() const noexcept override { return n_layers_; }

  Result<int> rows(int layer) const noexcept override {
    KVCORE_RETURN_IF_ERROR(check_layer(layer));
    return policy(layer).rows();
  }

  Result<LayerGeometry> geometry(int layer) const noexcept override {
    KVCORE_RETURN_IF_ERROR(check_layer(layer));
    return policy(layer).geometry();
  }

  Result<LayerConfig> layer_config(int layer) const noexcept override {
    KVCORE_RETURN_IF_ERROR(check_layer(layer));
    return policies_.config(layer);
  }

  Result<SeqStepPlan> plan(int layer, int position, int T) const noexcept override {
    KVCORE_RETURN_IF_ERROR(check_layer(layer));
    KVCORE_CHECK_OR_RETURN_ERROR(active_.id != 0, InvalidState,
                                 "plan(position %d, T %d): no step is begun", position, T);
    KVCORE_CHECK_OR_RETURN_ERROR(
        position == active_.position && T == active_.T, InvalidState,
        "plan(position %d, T %d): not the begun step (position %d, T %d)", position, T,
        active_.position, active_.T);
    return step_plan(layer);
  }

  /// The plan `layer` would get from the next step of T tokens (position =
  /// length()), without beginning it or changing anything: for sizing masks or
  /// buffers before the step. begin_step(T) then gives this very plan.
  /// Errors as begin_step(T), plus InvalidArgument for a bad layer.
  Result<SeqStepPlan> preview(int layer, int T) const noexcept override {
    return preview(layer, T, false);
  }

  /// preview(layer, T) of begin_step(T, verify). Errors as begin_step(T, verify),
  /// plus InvalidArgument for a bad layer.
  Result<SeqStepPlan> preview(int layer, int T, bool verify) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_layer(layer));
    KVCORE_RETURN_IF_ERROR(check_next_step(T, verify));
    return policy(layer).plan(length_, T, verify);
  }

  Result<SeqStepPlan> plan(int layer, const Step& step) const noexcept override {
    KVCORE_RETURN_IF_ERROR(check_layer(layer));
    KVCORE_RETURN_IF_ERROR(check_step(step));
    return step_plan(layer);
  }

  Result<bool> visible(int layer, int q, int k) const noexcept override {
    KVCORE_RETURN_IF_ERROR(check_layer(layer));
    KVCORE_CHECK_OR_RETURN_ERROR(q >= 0 && k >= 0, InvalidArgument,
                                 "visible(q = %d, k = %d): positions must be >= 0", q, k);
    return policy(layer).visible(q, k);
  }

  int initial_capacity() const noexcept override { return initial_capacity_; }

  // Introspection.
  /// The begun, uncommitted step; id == 0 when there is none.
  const Step& active_step() const noexcept { return active_; }
  /// Groups: layers with identical policies share one policy object and plan
  /// alike (every layer has a group, a State or Shared one too), as a
  /// BatchCache's layers sharing a policy form a group.
  int n_groups() const noexcept { return policies_.size(); }
  /// The group of `layer`, in [0, n_groups()). Precondition: 0 <= layer < n_layers.
  int group_of(int layer) const noexcept {
    return policies_.of(layer);
  }
  /// Deprecated alias of n_groups (removed in kvcore 0.2.0).
  [[deprecated("SequenceCache::n_policies: use n_groups (removed in kvcore 0.2.0)")]]
  int n_policies() const noexcept { return n_groups(); }
  /// Deprecated alias of group_of (removed in kvcore 0.2.0).
  [[deprecated("SequenceCache::policy_index: use group_of (removed in kvcore 0.2.0)")]]
  int policy_index(int layer) const noexcept { return group_of(layer); }
  const LayoutPolicy& policy(int layer) const noexcept {
    return policies_[group_of(layer)];
  }
  /// The oldest position past the sinks `layer`'s rows still hold: positions
  /// [held_from, length) and the sinks are in its rows (what an export
  /// carries). A State layer: the oldest p whose state and every later one's
  /// (up to length - 1) its slots hold (length when it holds none). Not
  /// meaningful for a Shared layer (its source's answers).
  /// Precondition: 0 <= layer < n_layers.
  int held_from(int layer) const noexcept {
    const int i = group_of(layer);
    return policies_[i].held_from(held(i), length_);
  }

  /// The layer whose rows `layer` reads: its Shared source, else itself.
  /// Precondition: 0 <= layer < n_layers.
  int row_layer(int layer) const noexcept {
    const LayerPolicy& p = policies_.config(layer).policy;
    return p.kind == LayerPolicy::Kind::Shared ? p.source : layer;
  }

  /// Takes an imported sequence's state (kvcore/state/sequence_import.h: its
  /// rows and states are written already; commit_copies() is then empty):
  /// length `length`, and per layer l the oldest position past the sinks its
  /// rows hold, held_from(l) (a State layer: the oldest position whose state
  /// its slots hold, every later one's held too; a Shared layer's is
  /// ignored; layers of one policy take the largest). InvalidState: a step is
  /// begun or the cache holds positions. OutOfResources: length over
  /// capacity. InvalidArgument: a held_from outside [0, length], or a State
  /// layer's outside [length - D, length - 1] (at least the last state, at
  /// most D). Nothing changes on an error.
  template <class HeldFrom>
  Status restore(int length, HeldFrom held_from) noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(active_.id == 0 && length_ == 0, InvalidState,
                                 "import: the cache holds %d positions%s; clear() it first", length_,
                                 active_.id != 0 ? " and a begun step" : "");
    KVCORE_CHECK_OR_RETURN_ERROR(length >= 0 && length <= capacity_, OutOfResources,
                                 "import: length %d exceeds capacity = %d", length, capacity_);
    for (int l = 0; l < n_layers_; ++l) {
      const LayerPolicy& p = policies_.config(l).policy;
      if (p.kind == LayerPolicy::Kind::Shared) continue;
      const int h = held_from(l);
      KVCORE_CHECK_OR_RETURN_ERROR(h >= 0 && h <= length, InvalidArgument,
                                   "import: layer %d held_from = %d must be in [0, length = %d]", l, h, length);
      KVCORE_CHECK_OR_RETURN_ERROR(
          p.kind != LayerPolicy::Kind::State || length == 0 || (h <= length - 1 && length - h <= p.slots),
          InvalidArgument,
          "import: layer %d is State(slots %d): held_from = %d at length %d must keep the last state and at most "
          "%d",
          l, p.slots, h, length, p.slots);
    }
    for (int i = 0; i < policies_.size(); ++i) {
      int floor = 0;
      for (int l = 0; l < n_layers_; ++l)
        if (policies_.of(l) == i && policies_.config(l).policy.kind != LayerPolicy::Kind::Shared &&
            held_from(l) > floor)
          floor = held_from(l);
      policies_[i].reset_held(held(i));
      policies_[i].restore_held(held(i), floor, length);
    }
    length_ = length;
    // An earlier tree commit's row copies would move the imported rows: none are pending now.
    tree_.record_commit(policies_.objects(), 0, nullptr, 0);
    return Error::Ok;
  }

 private:
  // The config's scalars only: its layers (a std::vector, whose copy could only
  // throw) are copied by build_tables() through nothrow new.
  explicit SequenceCache(const CacheConfig& cfg) noexcept
      : capacity_(cfg.capacity),
        n_layers_(cfg.n_layers),
        max_step_(cfg.effective_max_step()),
        initial_capacity_(cfg.initial_capacity) {}

  struct Cloning {};
  // clone()'s scalars; its tables are built from `other`'s layer configs.
  SequenceCache(const SequenceCache& other, Cloning) noexcept
      : capacity_(other.capacity_),
        n_layers_(other.n_layers_),
        max_step_(other.max_step_),
        initial_capacity_(other.initial_capacity_) {}

  // The policy tables (LayerPolicies) and the tree storage, through nothrow
  // new: the core reports a failed allocation instead of throwing.
  // ~SequenceCache frees a partial build. Layer l's config is layers[l], or
  // layers[0] for every layer when there is one entry (a broadcast config).
  Status build_tables(const LayerConfig* layers, std::size_t n_entries) noexcept {
    KVCORE_RETURN_IF_ERROR(policies_.build(layers, n_entries, n_layers_, max_step_, capacity_));
    const int tree_nodes = max_step_ < SequenceTree::kReservedNodes ? max_step_ : SequenceTree::kReservedNodes;
    return tree_.reserve(tree_nodes, policies_.size());
  }

  // The begun step's plan of `layer` (computed by begin_step; plans are pure).
  const SeqStepPlan& step_plan(int layer) const noexcept { return policies_.step_plan(policies_.of(layer)); }
  int* held(int i) noexcept { return policies_.held(i); }
  const int* held(int i) const noexcept { return policies_.held(i); }

  Status check_next_step(int T, bool verify) const noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(T >= 1 && T <= max_step(), InvalidArgument,
                                 "T = %d: a step needs 1 <= T <= max_step = %d", T, max_step());
    KVCORE_CHECK_OR_RETURN_ERROR(can_extend(T), OutOfResources,
                                 "T = %d at length %d: length would exceed capacity = %d", T,
                                 length_, capacity_);
    for (int i = 0; i < policies_.size(); ++i) {
      const LayerPolicy p = policies_[i].policy();
      KVCORE_CHECK_OR_RETURN_ERROR(
          p.kind != LayerPolicy::Kind::State || !verify || T <= p.slots - 1, InvalidArgument,
          "T = %d: a verify or tree step keeps the state after each of its positions, and layer "
          "%d keeps %d state slots: needs T <= slots - 1 = %d",
          T, policies_.first_layer_of(i), p.slots, p.slots - 1);
    }
    for (int i = 0; i < policies_.size(); ++i) {  // attention layers always hold what the length needs
      KVCORE_CHECK_OR_RETURN_ERROR(policies_[i].holds_for(held(i), length_), InvalidState,
                                   "step at length %d: layer %d no longer holds the state after "
                                   "position %d (an aborted step overwrote its slot): rewind to a "
                                   "length can_rewind() allows, or clear()",
                                   length_, policies_.first_layer_of(i), length_ - 1);
    }
    return Error::Ok;
  }

  // Plans every policy for a step of T at length_ (checked) and begins it.
  Step start_step(int T, bool tree, bool verify) noexcept {
    // From here on the step's rows count as written: what they held is gone.
    // Each distinct policy is planned once here, so plan(layer) is a lookup.
    for (int i = 0; i < policies_.size(); ++i) {
      policies_[i].note_begin(held(i), length_, T, verify);
      policies_.step_plan(i) = policies_[i].plan(length_, T, verify);
    }
    active_ = Step{length_, T, ++last_step_id_, tree, verify};
    return active_;
  }

  // InvalidState naming what `blocking` (a policy) lacks for a length of n;
  // `what` opens the message ("rewind(n" reads "rewind(n = 5): ...").
  Status blocked(const char* what, int n, int blocking) const noexcept {
    const LayoutPolicy& p = policies_[blocking];
    if (p.policy().kind == LayerPolicy::Kind::State)
      return Status::make(Error::InvalidState,
                          "%s = %d): layer %d no longer holds the state after position %d "
                          "(a step begun without verify keeps only its last state)",
                          what, n, policies_.first_layer_of(blocking), n - 1);
    return Status::make(Error::InvalidState,
                        "%s = %d): layer %d needs position %d, but its rows now hold only "
                        "positions >= %d",
                        what, n, policies_.first_layer_of(blocking), p.needed_floor(n), held(blocking)[0]);
  }

  // A chain step's accepted path: 0, 1, ..., m - 1 with 1 <= m <= T.
  Status check_chain_path(const int* accepted, int m) const noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(m >= 1 && m <= active_.T && accepted != nullptr, InvalidArgument,
                                 "accepted path of %d nodes: needs 1 <= m <= T = %d", m,
                                 active_.T);
    for (int d = 0; d < m; ++d)
      KVCORE_CHECK_OR_RETURN_ERROR(accepted[d] == d, InvalidArgument,
                                   "accepted[%d] = %d: a chain step's accepted path is 0, 1, ..., "
                                   "m - 1",
                                   d, accepted[d]);
    return Error::Ok;
  }

  Status check_layer(int layer) const noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(layer >= 0 && layer < n_layers_, InvalidArgument,
                                 "layer = %d: must be in [0, n_layers = %d)", layer, n_layers_);
    return Error::Ok;
  }

  // The first policy whose rows no longer hold what a query at n (0 <= n <=
  // length) needs below n; -1 when rewind(n) may go ahead. Makes no message:
  // can_rewind() answers with it.
  int rewind_blocker(int n) const noexcept {
    for (int i = 0; i < policies_.size(); ++i)
      if (!policies_[i].holds_for(held(i), n)) return i;
    return -1;
  }

  int capacity_;
  int n_layers_;
  int max_step_;  // the default resolved
  int initial_capacity_;
  int length_ = 0;
  Step active_;
  std::uint64_t last_step_id_ = 0;
  LayerPolicies policies_;  // each layer's policy object, what its rows hold, its plan of the begun step
  SequenceTree tree_;  // the begun tree's layout and the last commit's copies
};

}  // namespace kvcore
