// Import: a record (record_format.h) back into a cache and its byte layer.
// The record is parsed and checked in full against the destination first
// (RecordView::parse, then layers, policies, shapes, dtype, the destination's
// state, capacity, blocks); only then are rows written and the sequence
// admitted, so a refused import changes nothing. Afterwards every plan, read
// and can_rewind answer equals the exporter's, except that rewind reaches back
// only as far as both the record and the importer's rows hold (docs/state.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kvcore/batch/batch_cache.h"
#include "kvcore/core/sequence_cache.h"
#include "kvcore/pool/kv_pool.h"
#include "kvcore/pool/paged_kv_pool.h"
#include "kvcore/state/record_view.h"

namespace kvcore {

/// Whether an import into a BatchCache names the sequence's blocks for prefix
/// reuse (docs/state.md "Trust"). A record's token ids are the sender's word:
/// named by them, its blocks would serve every later request of that prompt
/// with the record's K/V, whatever they are. So by default (untrusted) the
/// imported sequence names no block and shares none with the cache's prefixes;
/// name_blocks (Python: trust_tokens=True, or a namespace given) names its
/// full blocks by the record's token ids in `prefix_namespace` (0: the
/// default namespace) and shares cached blocks of that namespace's prompt.
/// A namespace of the sender's own (a tenant's salt) confines what it names
/// to the requests of that namespace.
struct RecordTrust {
  bool name_blocks = false;
  std::uint64_t prefix_namespace = 0;

  /// Names nothing, shares nothing (the default).
  static RecordTrust untrusted() noexcept { return RecordTrust{}; }
  /// Names and shares blocks by the record's token ids in namespace `ns`.
  static RecordTrust tokens_in(std::uint64_t ns) noexcept { return RecordTrust{true, ns}; }
};

namespace import_detail {

// Each record layer against the destination's layer config and its pool
// (its dtype; a State layer's slot bytes).
template <class Planner, class Pool>
Status check_layers(const RecordView& rec, const Planner& planner, const Pool& pool) noexcept {
  const int n = planner.n_layers(), pool_layers = pool.n_layers();
  const DType pool_dtype = pool.dtype();
  KVCORE_CHECK_OR_RETURN_ERROR(rec.sequence().n_layers == n && pool_layers == n, InvalidArgument,
                               "import: the record has %d layers, the cache %d and its pool %d",
                               rec.sequence().n_layers, n, pool_layers);
  for (int l = 0; l < n; ++l) {
    const RecordLayer r = rec.layer(l);
    KVCORE_ASSIGN_OR_RETURN(const LayerConfig lc, planner.layer_config(l));
    KVCORE_CHECK_OR_RETURN_ERROR(r.policy == lc.policy, InvalidArgument,
                                 "import: layer %d policy (kind %d, window %d, sinks %d, source %d, slots %d) differs "
                                 "from the cache's (kind %d, window %d, sinks %d, source %d, slots %d)",
                                 l, static_cast<int>(r.policy.kind), r.policy.window, r.policy.sinks, r.policy.source,
                                 r.policy.slots, static_cast<int>(lc.policy.kind), lc.policy.window, lc.policy.sinks,
                                 lc.policy.source, lc.policy.slots);
    if (lc.policy.kind == LayerPolicy::Kind::State) {  // rows of the state's bytes (RecordView checked the form)
      KVCORE_ASSIGN_OR_RETURN(const auto layer, pool.layer(l));
      KVCORE_CHECK_OR_RETURN_ERROR(static_cast<std::size_t>(r.head_dim) == layer.k_row_bytes, InvalidArgument,
                                   "import: layer %d states of %d bytes differ from the pool's state slots of %zu "
                                   "bytes",
                                   l, r.head_dim, layer.k_row_bytes);
      continue;
    }
    KVCORE_CHECK_OR_RETURN_ERROR(
        r.n_kv_heads == lc.n_kv_heads && r.head_dim == lc.head_dim && r.value_dim == lc.value_dim(), InvalidArgument,
        "import: layer %d shape (n_kv_heads %d, head_dim %d, value_dim %d) differs from the cache's (%d, %d, %d)", l,
        r.n_kv_heads, r.head_dim, r.value_dim, lc.n_kv_heads, lc.head_dim, lc.value_dim());
    KVCORE_CHECK_OR_RETURN_ERROR(r.dtype == pool_dtype, InvalidArgument,
                                 "import: layer %d dtype %s differs from the pool's %s", l, to_string(r.dtype),
                                 to_string(pool_dtype));
  }
  return Error::Ok;
}

// The first position in [lo, hi) a layer without removals lacks, or -1.
inline int first_missing(const RecordLayer& r, int lo, int hi) noexcept {
  const int from = lo > r.sink_end ? lo : r.sink_end;
  const int upto = hi < r.held_from ? hi : r.held_from;
  return from < upto ? from : -1;
}

// Copies record rows of positions [lo, hi) (record row j0 on) of a layer to
// the pool rows row_of(p), one memcpy per run of consecutive rows.
template <class RowOf>
void put_rows(const unsigned char* k, const unsigned char* v, const RecordLayer& r, const LayerStorage& s, int lo,
              int hi, int j0, RowOf row_of) noexcept {
  const std::size_t kb = r.k_row_bytes(), vb = r.v_row_bytes();
  int p = lo;
  while (p < hi) {
    const std::int64_t first = row_of(p);
    int q = p + 1;
    while (q < hi && row_of(q) == first + (q - p)) ++q;
    const std::size_t n = static_cast<std::size_t>(q - p), j = static_cast<std::size_t>(j0 + (p - lo));
    std::memcpy(s.k + kb * static_cast<std::size_t>(first), k + kb * j, kb * n);
    if (vb != 0)  // a State layer has no V storage (its pointer may be null)
      std::memcpy(s.v + vb * static_cast<std::size_t>(first), v + vb * j, vb * n);
    p = q;
  }
}

// Where an empty SequenceCache's layer l starts holding the record's
// positions (its held_from after import): where the record holds everything
// from, and no lower than its ring's rows reach. -1 when the record lacks a
// position the layer must hold (a sink, or any position of a flat layer).
inline int sequence_floor(const RecordLayer& r, const LayerGeometry& g, int length) noexcept {
  const int sinks = r.policy.sinks;  // 0 but on a ring
  if (first_missing(r, 0, sinks < length ? sinks : length) >= 0) return -1;
  int floor = g.wraps() && length > g.ring_rows ? length - g.ring_rows : 0;
  if (first_missing(r, floor, length) >= 0) floor = r.held_from;
  if (!r.policy.evicts() && floor > 0) return -1;
  return floor;
}

}  // namespace import_detail

/// Imports the record at data[0, size) (8-byte aligned) into `cache` (empty,
/// no begun step) and `pool`: length L, and per layer the rows of the
/// positions the record carries that the cache's rows hold (a State layer:
/// the states it carries, into their slots; can_rewind then answers from
/// them). Errors (nothing changes; a growing pool may have grown):
/// RecordView::parse's; InvalidArgument: another layer count, a layer whose
/// policy, shape or dtype (a State layer: state bytes) differs, a record
/// lacking a flat layer's position or a sink;
/// NotSupported: a record with a removed head or holes (a SequenceCache has
/// none: import it into a BatchCache); InvalidState: the cache holds positions
/// or a begun step; OutOfResources: L over capacity; MemoryAllocationFailed:
/// the pool cannot grow.
inline Status import_record(const void* data, std::size_t size, SequenceCache& cache, KVPool& pool) noexcept {
  KVCORE_ASSIGN_OR_RETURN(const RecordView rec, RecordView::parse(data, size));
  const RecordSequence& seq = rec.sequence();
  KVCORE_RETURN_IF_ERROR(import_detail::check_layers(rec, cache, pool));
  KVCORE_CHECK_OR_RETURN_ERROR(seq.start == 0 && seq.n_holes == 0, NotSupported,
                               "import: the record removed positions (start %d, %d holes); a SequenceCache has no "
                               "holes: import it into a BatchCache",
                               seq.start, seq.n_holes);
  KVCORE_CHECK_OR_RETURN_ERROR(cache.active_step().id == 0 && cache.length() == 0, InvalidState,
                               "import: the cache holds %d positions%s; clear() it first", cache.length(),
                               cache.active_step().id != 0 ? " and a begun step" : "");
  KVCORE_CHECK_OR_RETURN_ERROR(seq.length <= cache.capacity(), OutOfResources,
                               "import: length %d exceeds capacity = %d", seq.length, cache.capacity());
  // A State layer holds the states the record carries; a Shared layer holds nothing.
  auto floor_of = [&](int l) {
    const RecordLayer r = rec.layer(l);
    if (r.policy.kind == LayerPolicy::Kind::State) return r.held_from;
    if (r.policy.kind == LayerPolicy::Kind::Shared) return 0;
    return import_detail::sequence_floor(r, *cache.geometry(l), seq.length);
  };
  for (int l = 0; l < seq.n_layers; ++l)
    KVCORE_CHECK_OR_RETURN_ERROR(floor_of(l) >= 0, InvalidArgument,
                                 "import: layer %d: the record lacks a position the cache keeps (a sink, or a flat "
                                 "layer's: sink_end %d, held_from %d)",
                                 l, rec.layer(l).sink_end, rec.layer(l).held_from);
  for (int l = 0; l < seq.n_layers; ++l)
    if (rec.layer(l).policy.holds_keys())  // a State layer's slots are all there from creation
      KVCORE_RETURN_IF_ERROR(pool.reserve(l, (*cache.geometry(l)).held_rows(seq.length)));
  for (int l = 0; l < seq.n_layers; ++l) {
    const RecordLayer r = rec.layer(l);
    const LayerGeometry g = *cache.geometry(l);
    const PoolLayer s = *pool.layer(l);
    const int sinks = r.policy.sinks;  // 0 but on a ring
    const int floor = floor_of(l);
    int j = 0;
    for_each_carried_run(seq.length, 0, 0, [](int) { return PositionRange{}; }, r, [&](int lo, int hi) {
      const int ranges[2][2] = {{lo, hi < sinks ? hi : sinks}, {lo > floor ? lo : floor, hi}};
      int done = lo;  // the two ranges overlap when the floor is below the sinks
      for (const auto& rg : ranges) {
        const int a = rg[0] > done ? rg[0] : done;
        if (a >= rg[1]) continue;
        import_detail::put_rows(rec.k_rows(l), rec.v_rows(l), r, s, a, rg[1], j + (a - lo),
                                [&g](int p) { return g.row(p); });
        for (int p = a; p < rg[1]; ++p) KVPoolTraits::mirror_run(s, Run{g.row(p), 1, p});
        done = rg[1];
      }
      j += hi - lo;
    });
  }
  return cache.restore(seq.length, floor_of);
}

/// Imports the record at data[0, size) (8-byte aligned) as sequence `seq`
/// (inactive) of `cache` and its `pool` (any block size): its length, removed
/// head and holes, and per group the blocks of the positions it carries. When
/// `trust` names blocks (RecordTrust::tokens_in) and the record knows every
/// token id and removed nothing, full blocks of a prefix the cache holds in
/// trust.prefix_namespace are shared instead of written, and the sequence's
/// blocks are named there for prefix reuse; untrusted (the default), the
/// sequence names and shares nothing. Any begun step ends. Errors (nothing
/// changes; a growing pool may have grown): RecordView::parse's;
/// InvalidArgument: another layer count, a layer whose policy, shape or dtype
/// differs, layers of one group carrying different positions, a flat layer
/// missing a visible position; plus BatchCache::admit's (InvalidState: seq
/// active; OutOfResources: no free table row (batch.max_active_seqs), length
/// over capacity, too many holes, too few blocks; NotSupported: a ring group's
/// sink blocks would keep a position the record lacks); MemoryAllocationFailed:
/// the pool cannot grow. Nothing else is allocated.
/// on_written(group, index, block) is called once per block the import wrote
/// (after its rows are in `pool`), never for a shared one: a byte layer that
/// keeps its own copy of the rows (torch) writes exactly those.
template <class OnWritten>
Status import_record(const void* data, std::size_t size, BatchCache& cache, PagedKVPool& pool, int seq,
                     const RecordTrust& trust, OnWritten on_written) noexcept {
  KVCORE_ASSIGN_OR_RETURN(const RecordView rec, RecordView::parse(data, size));
  const RecordSequence& rs = rec.sequence();
  KVCORE_RETURN_IF_ERROR(import_detail::check_layers(rec, cache, pool));
  const int B = cache.block_size();
  const int blocks = static_cast<int>((static_cast<std::int64_t>(rs.length) + B - 1) / B);
  // Fresh blocks come from the one pool every group draws from: below used + what every group
  // takes + every cached block (the lowest free ones, or cached ones of any group).
  std::int64_t bound = static_cast<std::int64_t>(cache.n_groups()) * blocks;
  if (cache.n_groups() > 0) bound += *cache.used_blocks(0);
  for (int g = 0; g < cache.n_groups(); ++g) bound += *cache.cached_blocks(g);
  bound *= B;
  for (int l = 0; l < rs.n_layers; ++l) {
    // Shared and State layers hold no blocks (admit refuses a model with State layers).
    if (!rec.layer(l).policy.holds_keys()) continue;
    const int rows = (*pool.layer(l)).rows;
    KVCORE_RETURN_IF_ERROR(pool.reserve(l, bound < rows ? static_cast<int>(bound) : rows));
  }
  const bool named = trust.name_blocks && rs.n_tokens == rs.length;
  const SequenceImport in{rs.length,          rs.start,
                          rs.n_holes,         rec.holes(),
                          named ? rec.tokens() : nullptr,
                          rec.layer_bounds(), static_cast<int>(RecordFormat::kLayerBytes / 4),
                          trust.prefix_namespace};
  auto hole_at = [&rec](int h) { return rec.hole(h); };
  const std::size_t rows_at = rec.row_offset(0);
  // Blocks [i, i + n) of group g, pool blocks [block, block + n): their rows
  // are consecutive, so each carried run is one copy per layer.
  struct BlockRun {
    int g = 0, i = 0, block = 0, n = 0;
  } run;
  auto write_run = [&]() {
    if (run.n == 0) return;
    const std::int64_t lo = static_cast<std::int64_t>(run.i) * B, end = lo + static_cast<std::int64_t>(run.n) * B;
    const int hi = end < rs.length ? static_cast<int>(end) : rs.length;
    std::size_t at = rows_at;  // layer l's K rows
    for (int l = 0; l < rs.n_layers; ++l) {
      const RecordLayer r = rec.layer(l);
      const unsigned char* k = static_cast<const unsigned char*>(data) + at;
      at += RecordLayout::row_block_bytes(r);
      if (!r.policy.holds_keys() || *cache.group_of(l) != run.g) continue;  // Shared, State: no blocks
      const unsigned char* v = k + record_detail::padded(static_cast<std::size_t>(r.n_rows) * r.k_row_bytes());
      const LayerStorage s = *pool.layer(l);
      int j = 0;  // record row of the run's first position
      for_each_carried_run(rs.length, rs.start, rs.n_holes, hole_at, r, [&](int a, int b) {
        const int from = a > lo ? a : static_cast<int>(lo);
        const int to = b < hi ? b : hi;
        if (from < to)
          import_detail::put_rows(k, v, r, s, from, to, j + (from - a),
                                  [&](int p) { return static_cast<std::int64_t>(run.block) * B + (p - lo); });
        j += b - a;
      });
    }
    for (int b = 0; b < run.n; ++b) on_written(run.g, run.i + b, run.block + b);
  };
  // The admission hands blocks over in index order, the lowest free first:
  // consecutive ones extend the run (long copies: 1.3x the throughput of block by block, bench/README.md).
  auto write_block = [&](int g, int i, int block) {
    if (run.n > 0 && g == run.g && i == run.i + run.n && block == run.block + run.n) {
      ++run.n;
      return;
    }
    write_run();
    run = BlockRun{g, i, block, 1};
  };
  KVCORE_RETURN_IF_ERROR(cache.admit(seq, in, write_block));
  write_run();  // the last run (admit changed nothing, and wrote nothing, if it refused)
  // States: admit gave each carried state a fresh physical slot of its own.
  for (int l = 0; l < rs.n_layers; ++l) {
    const RecordLayer r = rec.layer(l);
    if (r.policy.kind != LayerPolicy::Kind::State) continue;
    const int k = *cache.state_group_of(l);
    for (int j = 0; j < r.n_rows; ++j) {
      const int p = r.held_from + j;
      unsigned char* slot = *pool.state_slot(l, *cache.state_slot(k, seq, p % r.policy.slots));
      std::memcpy(slot, rec.k_rows(l) + static_cast<std::size_t>(j) * r.k_row_bytes(), r.k_row_bytes());
    }
  }
  return Error::Ok;
}

/// import_record, untrusted (RecordTrust::untrusted(): names and shares no block).
template <class OnWritten>
Status import_record(const void* data, std::size_t size, BatchCache& cache, PagedKVPool& pool, int seq,
                     OnWritten on_written) noexcept {
  return import_record(data, size, cache, pool, seq, RecordTrust::untrusted(), on_written);
}

/// import_record without the report of the written blocks.
inline Status import_record(const void* data, std::size_t size, BatchCache& cache, PagedKVPool& pool, int seq,
                            const RecordTrust& trust) noexcept {
  return import_record(data, size, cache, pool, seq, trust, [](int, int, int) {});
}

/// import_record, untrusted, without the report of the written blocks.
inline Status import_record(const void* data, std::size_t size, BatchCache& cache, PagedKVPool& pool, int seq) noexcept {
  return import_record(data, size, cache, pool, seq, RecordTrust::untrusted(), [](int, int, int) {});
}

}  // namespace kvcore
