// Model facts and per-layer policies, validated by validate() before any cache
// trusts them.
#pragma once

#include <cstdint>
#include <vector>

#include "kvcore/core/result.h"

namespace kvcore {

/// How one layer keeps its history (docs/design.md sections 2 and 9).
struct LayerPolicy {
  /// Serialized values: append-only.
  enum class Kind : int {
    Flat = 0,     ///< full history: a query sees every key up to itself
    Ring = 1,     ///< sliding window of `window` keys plus `sinks` attention sinks
    Chunked = 2,  ///< chunked attention: a query sees keys of its own chunk of `window` positions
    Shared = 3,   ///< holds no rows: reads what layer `source` reads, after its writes
    State = 4,    ///< recurrent state in `slots` snapshots, slot(p) = p mod slots
  };

  Kind kind = Kind::Flat;
  /// Ring: keys a query sees counting itself (q - k < window). Chunked: the
  /// chunk size K (a query at q sees [K * floor(q / K), q]). Otherwise 0.
  int window = 0;
  /// Ring: the first `sinks` positions stay visible forever (StreamingLLM). Otherwise 0.
  int sinks = 0;
  /// Shared: the earlier layer whose K/V this layer reads (a Flat, Ring or
  /// Chunked layer with a lower index). Otherwise 0.
  int source = 0;
  /// State: D, the state snapshots kept per sequence (slot(p) = p mod D; a
  /// verify step of T tokens needs T <= D - 1). Otherwise 0.
  int slots = 0;

  static LayerPolicy flat() noexcept { return LayerPolicy{Kind::Flat, 0, 0, 0, 0}; }
  static LayerPolicy ring(int window, int sinks = 0) noexcept {
    return LayerPolicy{Kind::Ring, window, sinks, 0, 0};
  }
  static LayerPolicy chunked(int chunk) noexcept { return LayerPolicy{Kind::Chunked, chunk, 0, 0, 0}; }
  static LayerPolicy shared(int source_layer) noexcept {
    return LayerPolicy{Kind::Shared, 0, 0, source_layer, 0};
  }
  static LayerPolicy state(int n_slots) noexcept { return LayerPolicy{Kind::State, 0, 0, 0, n_slots}; }

  /// True for the kinds whose rows are reused, so that old positions leave
  /// them: a window (Ring) or a chunk (Chunked) evicts what no query needs.
  bool evicts() const noexcept { return kind == Kind::Ring || kind == Kind::Chunked; }
  /// True for the kinds whose rows hold K/V a query attends over with a mask
  /// (Flat, Ring, Chunked); Shared reads its source's, State holds snapshots.
  bool holds_keys() const noexcept { return kind == Kind::Flat || kind == Kind::Ring || kind == Kind::Chunked; }

  /// The oldest position past the sinks a query at q sees (q >= 0):
  /// max(0, q - window + 1) for a ring, K * floor(q / K) for a chunked layer,
  /// 0 when flat. Shared and State layers: 0 (ask the source; a state layer
  /// has no keys).
  int window_begin(int q) const noexcept {
    if (kind == Kind::Chunked) return q - q % window;
    if (kind != Kind::Ring) return 0;
    const std::int64_t lo = static_cast<std::int64_t>(q) - window + 1;  // 64-bit: no underflow
    return lo > 0 ? static_cast<int>(lo) : 0;
  }
  /// docs/design.md sections 2 and 9: may a query at q see the key at k (q, k >= 0)?
  /// k <= q, and k is a sink or from window_begin(q) on. False on a State layer
  /// (it has no keys); a Shared layer's answer is its source's (ask the cache).
  bool sees(int q, int k) const noexcept {
    if (kind == Kind::State) return false;
    return k <= q && (k < sinks || k >= window_begin(q));
  }
  friend bool operator==(const LayerPolicy& a, const LayerPolicy& b) noexcept {
    return a.kind == b.kind && a.window == b.window && a.sinks == b.sinks && a.source == b.source &&
           a.slots == b.slots;
  }
  friend bool operator!=(const LayerPolicy& a, const LayerPolicy& b) noexcept { return !(a == b); }
};

/// The kind's name ("Flat", "Ring", "Chunked", "Shared", "State"); nullptr
/// for a value outside LayerPolicy::Kind.
inline const char* to_string(LayerPolicy::Kind kind) noexcept {
  using Kind = LayerPolicy::Kind;
  return kind == Kind::Flat      ? "Flat"
         : kind == Kind::Ring    ? "Ring"
         : kind == Kind::Chunked ? "Chunked"
         : kind == Kind::Shared  ? "Shared"
         : kind == Kind::State   ? "State"
                                 : nullptr;
}

/// One layer's policy and the shape of one K/V row (the byte layer sizes rows from it).
struct LayerConfig {
  LayerPolicy policy;
  int n_kv_heads = 0;
  int head_dim = 0;
  /// Width of a V row per head; 0 means head_dim (MLA-style models differ).
  int v_head_dim = 0;

  int value_dim() const noexcept { return v_head_dim == 0 ? head_dim : v_head_dim; }
};

/// Limits of a many-sequence cache (BatchCache, kvcore/batch/): every table it
/// keeps is sized from these at creation, so no step allocates. A single
/// sequence's cache (SequenceCache) ignores them.
struct BatchLimits {
  /// Rows per block (B >= 1; 1 is cell-granular, like llama.cpp's cells).
  int block_size = 16;
  /// Sequence ids are 0 .. max_seqs - 1.
  int max_seqs = 64;
  /// New tokens of one step over all its sequences; 0 means max_seqs * max_step
  /// (at most 2^20).
  int max_step_tokens = 0;
  /// Blocks of the one pool every group draws from; 0 means what every group
  /// needs with max_active_seqs sequences at full capacity (a ring group:
  /// sinks + W + 2C - 1 positions, + 1 block, per sequence; with
  /// states_in_pool, each State group's max_active_seqs x D + min(
  /// max_step_tokens, max_active_seqs x D) states too).
  int num_blocks = 0;
  /// Sequences active at once (added or forked into, not yet released); 0
  /// means max_seqs. Each group keeps one block table row of
  /// ceil(capacity / B) entries per active sequence, so the tables take
  /// n_groups x max_active_seqs x ceil(capacity / B) ints: bound it when many
  /// ids are accepted but few are used at once (add_sequence and fork past it:
  /// OutOfResources). Below max_seqs a sequence's row is not its id: the plan's
  /// table_rows names it.
  int max_active_seqs = 0;
  /// Block table entries per table page, a power of two in [1, 2^20], or 0
  /// for unpaged tables (docs/batch.md section 5, "Tables sized by use").
  /// 0: each group keeps a dense row of ceil(capacity / B) entries per active
  /// sequence, so the tables take n_groups x max_active_seqs x
  /// ceil(capacity / B) ints whatever the sequences hold. P > 0: a row is a
  /// directory of ceil(ceil(capacity / B) / P) page ids, and a page of P
  /// entries is drawn from table_pages when the sequence first names a block
  /// in its span and given back once no entry of it names one (a window
  /// slid past it, a rewind, a release): the tables cost what the sequences
  /// hold. A plan's GroupPlan then has no dense block_tables: backends read
  /// an entry's row through table_row() (C++) or entry_tables (Python).
  int table_page_blocks = 0;
  /// With table_page_blocks = P > 0: table pages every group draws from, the
  /// tables' bound (P ints each); 0 means every active row full in every
  /// group (n_groups x max_active_seqs x ceil(ceil(capacity / B) / P), never
  /// short). A step, fork, adopt_prefix or import whose table entries need
  /// more pages than are free is OutOfResources and changes nothing. Ignored
  /// when table_page_blocks = 0.
  int table_pages = 0;
  /// Ranges removed from the middle of one sequence (remove(s, p0, p1)) it can
  /// keep apart at once; removing the head or the tail needs none.
  int max_holes = 8;
  /// Named state snapshots each State group keeps for prefix reuse
  /// (docs/design.md section 9): the state after a step that ends on a full,
  /// keyed block is named by that block's key, so a later prompt with that
  /// prefix starts from it (adopt_prefix). Each takes one state slot; the
  /// least recently used goes first. 0: none, and a model with State layers
  /// never hits a prefix.
  int state_snapshots = 0;
  /// The State groups' block, in tokens: a committed step names the state at
  /// its end only when its length is a multiple of it (and ends a keyed K/V
  /// block), so prefix hits on a model with State layers land on multiples of
  /// it (vLLM's mamba align mode at its block size). 0 or block_size (the
  /// default rule), or a larger multiple of block_size up to capacity. A
  /// larger block names fewer states, so decode keeps fewer snapshots (each a
  /// state slot or, with states_in_pool, a page) at the cost of coarser hits.
  /// An imported record still names the one state it carries, at its length,
  /// when that ends a keyed block, whatever this is.
  int state_block_size = 0;
  /// Layers of one policy form groups of at most this many layers, all
  /// drawing blocks from one pool whose pages span one layer of each group
  /// (docs/batch.md section 5, "One budget"): groups of one size leave no page
  /// storage unused. 0: the fewest layers any policy has (vLLM's rule; a
  /// model whose policies have one layer count keeps one group per policy).
  /// A large value (n_layers) keeps one group per policy whatever the counts.
  int page_layers = 0;
  /// The longest rewind, in positions, that ring and chunked groups keep
  /// history for: at length L they release what no query after a rewind to
  /// L - max_rewind or later needs, so can_rewind(s, n) always holds for
  /// n >= Lmax - max_rewind. Each position of margin costs every sequence
  /// that many ring positions (docs/batch.md section 5). -1: max_step (a
  /// rewind of a whole step, DESIGN section 2); a server that verifies at most
  /// k drafts sets k, one that never rewinds 0 (vLLM's sliding window). In
  /// [-1, capacity].
  int max_rewind = -1;
  /// State groups draw their physical state slots from the one pool, one
  /// block per state, as vLLM's hybrid allocator does (docs/batch.md section
  /// 10, "States in the pool"): memory moves between K/V and states with the
  /// traffic, a named snapshot is a cached block (kept until the pool needs
  /// it, least recently released first, whatever group it is in), and State
  /// layers form State groups of at most page_layers layers, each layer's
  /// states kept in the pages of the storage it shares (storage_layer). A
  /// byte layer must then hold a state inside one page. false: each State
  /// group owns max_active_seqs x D + min(max_step_tokens, max_active_seqs x
  /// D) + state_snapshots slots of its own, apart from the pool.
  bool states_in_pool = false;
};

struct CacheConfig {
  /// Most layers a cache may have. Per-layer state is sized at creation, so an
  /// unbounded count (n_layers = INT_MAX with one broadcast entry) would ask
  /// for gigabytes; real models have a few hundred layers at most.
  static constexpr int kMaxLayers = 1 << 16;

  /// Largest logical length (positions 0..capacity-1).
  int capacity = 0;
  /// 1 <= n_layers <= kMaxLayers.
  int n_layers = 0;
  /// One entry (broadcast to every layer) or exactly n_layers entries.
  std::vector<LayerConfig> layers;
  /// Largest T of one step; 0 means min(512, capacity).
  int max_step = 0;
  /// Rows a byte layer allocates per layer before growing lazily.
  int initial_capacity = 512;
  /// Limits of a many-sequence cache built from this config (BatchCache).
  BatchLimits batch;

  /// The config of `layer` (resolves broadcast). Precondition: validate() passed
  /// and 0 <= layer < n_layers.
  const LayerConfig& layer(int layer) const noexcept {
    return layers.size() == 1 ? layers.front() : layers[static_cast<std::size_t>(layer)];
  }
  /// max_step with the default applied.
  int effective_max_step() const noexcept {
    if (max_step != 0) return max_step;
    return capacity < 512 ? capacity : 512;
  }
  /// batch.max_rewind with the default (max_step) applied, in positions.
  int effective_max_rewind() const noexcept { return batch.max_rewind >= 0 ? batch.max_rewind : effective_max_step(); }
};

namespace internal {

// Checks 0 on every LayerPolicy field the kind does not use.
inline Status check_unused(int idx, const char* kind, const char* field, int value) noexcept {
  KVCORE_CHECK_OR_RETURN_ERROR(value == 0, InvalidArgument,
                               "layers[%d].policy.%s = %d: a %s layer needs %s == 0", idx, field,
                               value, kind, field);
  return Error::Ok;
}

}  // namespace internal

/// Checks entry `idx` of cfg.layers (its policy's fields for its kind, a
/// Shared layer's source, the row shape). InvalidArgument naming the field,
/// its value and the rule. Precondition: idx < cfg.layers.size().
inline Status validate_layer(const CacheConfig& cfg, int idx) noexcept {
  using Kind = LayerPolicy::Kind;
  const LayerConfig& l = cfg.layers[static_cast<std::size_t>(idx)];
  const LayerPolicy& p = l.policy;
  const char* name = to_string(p.kind);
  if (name == nullptr)
    return Status::make(Error::InvalidArgument,
                        "layers[%d].policy.kind = %d: must be Flat (0), Ring (1), Chunked (2), "
                        "Shared (3) or State (4)",
                        idx, static_cast<int>(p.kind));
  if (p.kind == Kind::Ring) {
    KVCORE_CHECK_OR_RETURN_ERROR(p.window >= 1, InvalidArgument,
                                 "layers[%d].policy.window = %d: a Ring layer needs window >= 1",
                                 idx, p.window);
    KVCORE_CHECK_OR_RETURN_ERROR(p.sinks >= 0, InvalidArgument,
                                 "layers[%d].policy.sinks = %d: a Ring layer needs sinks >= 0",
                                 idx, p.sinks);
  } else if (p.kind == Kind::Chunked) {
    KVCORE_CHECK_OR_RETURN_ERROR(p.window >= 1, InvalidArgument,
                                 "layers[%d].policy.window = %d: a Chunked layer needs a chunk "
                                 "size window >= 1",
                                 idx, p.window);
  } else {
    KVCORE_RETURN_IF_ERROR(internal::check_unused(idx, name, "window", p.window));
  }
  if (p.kind != Kind::Ring) KVCORE_RETURN_IF_ERROR(internal::check_unused(idx, name, "sinks", p.sinks));
  if (p.kind != Kind::Shared) KVCORE_RETURN_IF_ERROR(internal::check_unused(idx, name, "source", p.source));
  if (p.kind != Kind::State) KVCORE_RETURN_IF_ERROR(internal::check_unused(idx, name, "slots", p.slots));
  if (p.kind == Kind::State) {
    KVCORE_CHECK_OR_RETURN_ERROR(p.slots >= 1, InvalidArgument,
                                 "layers[%d].policy.slots = %d: a State layer needs slots >= 1",
                                 idx, p.slots);
    // Its state's shape belongs to the byte layer: the planner counts slots, not rows.
    KVCORE_CHECK_OR_RETURN_ERROR(
        l.n_kv_heads == 0 && l.head_dim == 0 && l.v_head_dim == 0, InvalidArgument,
        "layers[%d]: a State layer holds no K/V rows: needs n_kv_heads = head_dim = v_head_dim = 0 "
        "(got %d, %d, %d)",
        idx, l.n_kv_heads, l.head_dim, l.v_head_dim);
    return Error::Ok;
  }
  if (p.kind == Kind::Shared) {
    KVCORE_CHECK_OR_RETURN_ERROR(
        cfg.layers.size() > 1, InvalidArgument,
        "layers[0].policy: a Shared layer broadcast to every layer would make layer 0 share an "
        "earlier layer, and there is none: give one entry per layer");
    KVCORE_CHECK_OR_RETURN_ERROR(p.source >= 0 && p.source < idx, InvalidArgument,
                                 "layers[%d].policy.source = %d: a Shared layer reads an earlier "
                                 "layer: needs 0 <= source < %d",
                                 idx, p.source, idx);
    const LayerConfig& src = cfg.layers[static_cast<std::size_t>(p.source)];
    KVCORE_CHECK_OR_RETURN_ERROR(src.policy.holds_keys(), InvalidArgument,
                                 "layers[%d].policy.source = %d: layer %d is kind %d; a Shared "
                                 "layer's source must hold K/V rows (Flat, Ring or Chunked)",
                                 idx, p.source, p.source, static_cast<int>(src.policy.kind));
    KVCORE_CHECK_OR_RETURN_ERROR(
        l.n_kv_heads == src.n_kv_heads && l.head_dim == src.head_dim &&
            l.value_dim() == src.value_dim(),
        InvalidArgument,
        "layers[%d]: a Shared layer attends over layer %d's K/V: needs its n_kv_heads, head_dim, "
        "v_head_dim (%d, %d, %d) equal to the source's (%d, %d, %d)",
        idx, p.source, l.n_kv_heads, l.head_dim, l.value_dim(), src.n_kv_heads, src.head_dim,
        src.value_dim());
  }
  KVCORE_CHECK_OR_RETURN_ERROR(l.n_kv_heads >= 1, InvalidArgument,
                               "layers[%d].n_kv_heads = %d: must be >= 1", idx, l.n_kv_heads);
  KVCORE_CHECK_OR_RETURN_ERROR(l.head_dim >= 1, InvalidArgument,
                               "layers[%d].head_dim = %d: must be >= 1", idx, l.head_dim);
  KVCORE_CHECK_OR_RETURN_ERROR(l.v_head_dim >= 0, InvalidArgument,
                               "layers[%d].v_head_dim = %d: must be >= 1 (or 0 for head_dim)",
                               idx, l.v_head_dim);
  return Error::Ok;
}

/// Checks every rule of docs/design.md section 2. Returns InvalidArgument with a
/// message naming the field, its value and the rule; Ok when the config is usable.
inline Status validate(const CacheConfig& cfg) noexcept {
  KVCORE_CHECK_OR_RETURN_ERROR(cfg.capacity >= 1, InvalidArgument,
                               "capacity = %d: must be >= 1", cfg.capacity);
  KVCORE_CHECK_OR_RETURN_ERROR(cfg.n_layers >= 1, InvalidArgument,
                               "n_layers = %d: must be >= 1", cfg.n_layers);
  KVCORE_CHECK_OR_RETURN_ERROR(cfg.n_layers <= CacheConfig::kMaxLayers, InvalidArgument,
                               "n_layers = %d: must be <= %d (CacheConfig::kMaxLayers)",
                               cfg.n_layers, CacheConfig::kMaxLayers);
  const std::size_t n_entries = cfg.layers.size();
  KVCORE_CHECK_OR_RETURN_ERROR(
      n_entries == 1 || n_entries == static_cast<std::size_t>(cfg.n_layers), InvalidArgument,
      "layers has %zu entries: must be 1 (broadcast) or n_layers = %d", n_entries, cfg.n_layers);
  KVCORE_CHECK_OR_RETURN_ERROR(cfg.max_step >= 0, InvalidArgument,
                               "max_step = %d: must be >= 1 (or 0 for the default)", cfg.max_step);
  KVCORE_CHECK_OR_RETURN_ERROR(cfg.max_step <= cfg.capacity, InvalidArgument,
                               "max_step = %d: must be <= capacity = %d", cfg.max_step,
                               cfg.capacity);
  KVCORE_CHECK_OR_RETURN_ERROR(cfg.initial_capacity >= 1, InvalidArgument,
                               "initial_capacity = %d: must be >= 1", cfg.initial_capacity);
  for (std::size_t i = 0; i < n_entries; ++i) {
    KVCORE_RETURN_IF_ERROR(validate_layer(cfg, static_cast<int>(i)));
  }
  return Error::Ok;
}

}  // namespace kvcore
