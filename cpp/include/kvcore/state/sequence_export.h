// Export: one sequence of a cache and its byte layer as a record
// (record_format.h), into a buffer the caller sized with export_size(). Per
// layer the record carries the visible positions the layer's rows still hold:
// a flat layer every one, a ring its sinks (a BatchCache: its sink blocks) and
// what its window and rewind margin still hold (positions from held_from on),
// never what it released. Nothing is allocated.
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

namespace export_detail {

// A ring layer's bounds in their one written form: a held_from below the
// sinks' end selects no other position than that end does (positions below
// sink_end are carried either way), so it is raised to min(sink_end, length).
// Two caches holding the same positions then write the same bytes, whatever
// their rows held below the sinks' end (a re-export equals the record).
inline void canonical_bounds(RecordLayer& r, int length) noexcept {
  const int sinks_end = r.sink_end < length ? r.sink_end : length;
  if (r.held_from < sinks_end) r.held_from = sinks_end;
}

// The entry of a Shared layer: its config's shape (its source's) and the
// pool's dtype, no rows (RecordView's one written form).
inline RecordLayer shared_layer(const LayerConfig& lc, DType dtype, int length) noexcept {
  return RecordLayer{lc.policy, dtype, lc.n_kv_heads, lc.head_dim, lc.value_dim(), 0, length, 0};
}

// The entry of a State layer whose slots are `slot_bytes` each: its rows are
// the states after positions [held_from, length) (uint8 rows, one head, no V).
inline RecordLayer state_layer(const LayerConfig& lc, std::size_t slot_bytes, int held_from) noexcept {
  return RecordLayer{lc.policy, DType::UInt8, 1, static_cast<int>(slot_bytes), 0, 0, held_from, 0};
}

// A SequenceCache and its KVPool as a record's source.
struct SequenceSource {
  const SequenceCache& cache;
  const KVPool& pool;

  int length() const noexcept { return cache.length(); }
  int start() const noexcept { return 0; }
  int n_holes() const noexcept { return 0; }
  PositionRange hole(int) const noexcept { return PositionRange{}; }
  // Precondition: storage(l) is ok (size_of checked it).
  RecordLayer layer(int l) const noexcept {
    const LayerConfig lc = *cache.layer_config(l);
    if (lc.policy.kind == LayerPolicy::Kind::Shared) return shared_layer(lc, pool.dtype(), cache.length());
    if (lc.policy.kind == LayerPolicy::Kind::State)
      return state_layer(lc, (*pool.layer(l)).k_row_bytes, cache.held_from(l));
    RecordLayer r{lc.policy, pool.dtype(), lc.n_kv_heads, lc.head_dim, lc.value_dim(), 0, 0, 0};
    if (lc.policy.evicts()) {
      r.sink_end = lc.policy.sinks;
      r.held_from = cache.held_from(l);
      canonical_bounds(r, cache.length());
    }
    return r;
  }
  std::int64_t row(int l, int p) const noexcept { return (*cache.geometry(l)).row(p); }
  Result<LayerStorage> storage(int l) const noexcept {
    KVCORE_ASSIGN_OR_RETURN(const PoolLayer layer, pool.layer(l));
    return static_cast<const LayerStorage&>(layer);
  }
};

// Sequence `seq` of a BatchCache and its PagedKVPool as a record's source.
struct BatchSource {
  const BatchCache& cache;
  const PagedKVPool& pool;
  int seq;
  SequenceInfo info;

  int length() const noexcept { return info.length; }
  int start() const noexcept { return info.visible_start; }
  int n_holes() const noexcept { return info.n_holes; }
  PositionRange hole(int h) const noexcept { return info.holes[h]; }
  RecordLayer layer(int l) const noexcept {
    const LayerConfig lc = *cache.layer_config(l);
    if (lc.policy.kind == LayerPolicy::Kind::Shared) return shared_layer(lc, pool.dtype(), info.length);
    if (lc.policy.kind == LayerPolicy::Kind::State) {  // the run of held states ending at the last one
      const int k = *cache.state_group_of(l);
      int from = info.length;
      while (from > 0 && *cache.held_state(k, seq, (from - 1) % lc.policy.slots) == from - 1) --from;
      return state_layer(lc, (*pool.layer(l)).k_row_bytes, from);
    }
    RecordLayer r{lc.policy, pool.dtype(), lc.n_kv_heads, lc.head_dim, lc.value_dim(), 0, 0, 0};
    if (lc.policy.evicts()) {
      const int B = cache.block_size();
      const std::int64_t sink_end = (static_cast<std::int64_t>(lc.policy.sinks) + B - 1) / B * B;
      r.sink_end = sink_end < info.length ? static_cast<int>(sink_end) : info.length;
      r.held_from = *cache.held_from(seq, *cache.group_of(l));
      canonical_bounds(r, info.length);
    }
    return r;
  }
  std::int64_t row(int l, int p) const noexcept {
    const LayerConfig lc = *cache.layer_config(l);
    if (lc.policy.kind == LayerPolicy::Kind::State)  // the physical slot holding the state after p
      return *cache.state_slot(*cache.state_group_of(l), seq, p % lc.policy.slots);
    const int B = cache.block_size();
    const int block = cache.block_at(seq, *cache.group_of(l), p / B);  // its own row, either layout
    return block < 0 ? -1 : static_cast<std::int64_t>(block) * B + p % B;
  }
  Result<LayerStorage> storage(int l) const noexcept {
    KVCORE_ASSIGN_OR_RETURN(const PagedLayer layer, pool.layer(l));
    return static_cast<const LayerStorage&>(layer);
  }
};

template <class Source>
RecordSequence sequence_of(const Source& src, int n_layers, int max_step, int n_tokens) noexcept {
  return RecordSequence{n_layers, src.length(), max_step, src.start(), src.n_holes(), n_tokens};
}

template <class Source>
RecordLayer counted_layer(const Source& src, int l) noexcept {
  RecordLayer r = src.layer(l);
  r.n_rows = carried_positions(src.length(), src.start(), src.n_holes(), [&src](int h) { return src.hole(h); }, r);
  return r;
}

// Copies the rows of positions [lo, hi) of layer l into k_out / v_out, one
// memcpy per run of consecutive rows. InvalidState: a position without a row.
template <class Source>
Status copy_rows(const Source& src, int l, const LayerStorage& s, int lo, int hi, unsigned char*& k_out,
                 unsigned char*& v_out) noexcept {
  int p = lo;
  while (p < hi) {
    const std::int64_t first = src.row(l, p);
    KVCORE_CHECK_OR_RETURN_ERROR(first >= 0 && first < s.allocated_rows, InvalidState,
                                 "export: layer %d position %d has no row in the pool (write the step first)", l, p);
    int q = p + 1;
    while (q < hi && src.row(l, q) == first + (q - p) && first + (q - p) < s.allocated_rows) ++q;
    const std::size_t n = static_cast<std::size_t>(q - p);
    std::memcpy(k_out, s.k + s.k_row_bytes * static_cast<std::size_t>(first), s.k_row_bytes * n);
    if (s.v_row_bytes != 0)  // a State layer has no V storage (its pointer may be null)
      std::memcpy(v_out, s.v + s.v_row_bytes * static_cast<std::size_t>(first), s.v_row_bytes * n);
    k_out += s.k_row_bytes * n;
    v_out += s.v_row_bytes * n;
    p = q;
  }
  return Error::Ok;
}

template <class Source>
Result<std::size_t> size_of(const Source& src, int n_layers, int max_step, int n_tokens) noexcept {
  KVCORE_CHECK_OR_RETURN_ERROR(n_tokens >= 0 && n_tokens <= src.length(), InvalidArgument,
                               "export: n_tokens = %d must be in [0, length = %d]", n_tokens, src.length());
  // The pool must be the cache's: its rows are the bytes the record's layer
  // table promises (a State layer's slot fits the record's int32: the pools
  // keep slots below 2^31 bytes, so a slot the int does not hold is another pool's).
  for (int l = 0; l < n_layers; ++l) {
    KVCORE_ASSIGN_OR_RETURN(const LayerStorage s, src.storage(l));
    const RecordLayer r = src.layer(l);
    KVCORE_CHECK_OR_RETURN_ERROR(r.k_row_bytes() == s.k_row_bytes && r.v_row_bytes() == s.v_row_bytes, InvalidArgument,
                                 "export: layer %d of the pool has rows of %zu / %zu bytes, the cache's layer %zu / "
                                 "%zu: the pool is another cache's",
                                 l, s.k_row_bytes, s.v_row_bytes, r.k_row_bytes(), r.v_row_bytes());
    KVCORE_CHECK_OR_RETURN_ERROR(
        r.policy.kind != LayerPolicy::Kind::State || src.length() == 0 || r.held_from < src.length(), InvalidState,
        "export: layer %d no longer holds the state after position %d (an aborted step may have overwritten its "
        "slot): rewind to a length can_rewind() allows first",
        l, src.length() - 1);
  }
  const RecordSequence seq = sequence_of(src, n_layers, max_step, n_tokens);
  return RecordLayout::of(seq, [&src](int l) { return counted_layer(src, l); }).total;
}

template <class Source>
Status write(const Source& src, int n_layers, int max_step, const std::int32_t* tokens, int n_tokens, void* out,
             std::size_t capacity) noexcept {
  KVCORE_ASSIGN_OR_RETURN(const std::size_t total, size_of(src, n_layers, max_step, n_tokens));
  KVCORE_CHECK_OR_RETURN_ERROR(out != nullptr && capacity >= total, InvalidArgument,
                               "export: the output holds %zu bytes, the record needs %zu (export_size)",
                               out != nullptr ? capacity : 0, total);
  KVCORE_CHECK_OR_RETURN_ERROR(tokens != nullptr || n_tokens == 0, InvalidArgument, "export: tokens is null");
  KVCORE_CHECK_OR_RETURN_ERROR(reinterpret_cast<std::uintptr_t>(out) % 8 == 0, InvalidArgument,
                               "export: the output starts %d bytes past an 8-byte boundary: it must start on one",
                               static_cast<int>(reinterpret_cast<std::uintptr_t>(out) % 8));
  const RecordSequence seq = sequence_of(src, n_layers, max_step, n_tokens);
  auto layer_at = [&src](int l) { return counted_layer(src, l); };
  auto hole_at = [&src](int h) { return src.hole(h); };
  const RecordLayout layout = RecordLayout::of(seq, layer_at);
  unsigned char* bytes = static_cast<unsigned char*>(out);
  write_record_tables(bytes, seq, layout, hole_at, tokens, layer_at);
  std::size_t at = layout.rows;
  for (int l = 0; l < n_layers; ++l) {
    const RecordLayer r = layer_at(l);
    const LayerStorage s = *src.storage(l);
    unsigned char* k_out = bytes + at;
    unsigned char* v_out = bytes + at + record_detail::padded(static_cast<std::size_t>(r.n_rows) * r.k_row_bytes());
    Status status = Error::Ok;
    for_each_carried_run(seq.length, seq.start, seq.n_holes, hole_at, r, [&](int lo, int hi) {
      if (status.ok()) status = copy_rows(src, l, s, lo, hi, k_out, v_out);
    });
    KVCORE_RETURN_IF_ERROR(status);
    at += RecordLayout::row_block_bytes(r);
  }
  seal_record(bytes, layout);
  return Error::Ok;
}

}  // namespace export_detail

/// Bytes export_to() writes for `cache`'s sequence (rows in `pool`) with the
/// token ids of its first n_tokens positions (a Shared layer carries no
/// rows; a State layer its states after positions [held_from(l), length):
/// the last one and those a rewind needs). InvalidArgument: n_tokens outside
/// [0, length], a pool of another layer count. InvalidState: a State layer no
/// longer holds the state after length - 1.
inline Result<std::size_t> export_size(const SequenceCache& cache, const KVPool& pool, int n_tokens = 0) noexcept {
  return export_detail::size_of(export_detail::SequenceSource{cache, pool}, cache.n_layers(), cache.max_step(),
                                n_tokens);
}

/// Writes the record of `cache`'s sequence into `out` (8-byte aligned, at
/// least export_size() bytes), with tokens[0, n_tokens) as its known token ids.
/// InvalidArgument: n_tokens out of range, tokens null, out null, misaligned
/// or too small, a pool of another layer count. InvalidState: a step is begun
/// (commit or abort it first), or a held position has no row in the pool.
/// `out` is left partly written on an error.
inline Status export_to(const SequenceCache& cache, const KVPool& pool, const std::int32_t* tokens, int n_tokens,
                        void* out, std::size_t capacity) noexcept {
  KVCORE_CHECK_OR_RETURN_ERROR(cache.active_step().id == 0, InvalidState,
                               "export: a step is begun; commit or abort it first");
  KVCORE_CHECK_OR_RETURN_ERROR(pool.n_layers() == cache.n_layers(), InvalidArgument,
                               "export: the pool has %d layers, the cache %d", pool.n_layers(), cache.n_layers());
  return export_detail::write(export_detail::SequenceSource{cache, pool}, cache.n_layers(), cache.max_step(), tokens,
                              n_tokens, out, capacity);
}

/// Bytes export_to() writes for sequence `seq` of `cache` (rows in `pool`).
/// InvalidArgument: bad seq, n_tokens outside [0, length], a pool of another
/// layer count. InvalidState: seq is not active, or a State layer no longer
/// holds the state after length - 1.
inline Result<std::size_t> export_size(const BatchCache& cache, const PagedKVPool& pool, int seq,
                                       int n_tokens = 0) noexcept {
  KVCORE_ASSIGN_OR_RETURN(const SequenceInfo info, cache.sequence(seq));
  KVCORE_CHECK_OR_RETURN_ERROR(info.active, InvalidState, "export: sequence %d is not active", seq);
  return export_detail::size_of(export_detail::BatchSource{cache, pool, seq, info}, cache.n_layers(),
                                cache.max_step(), n_tokens);
}

/// Writes the record of sequence `seq` of `cache` into `out` (as the
/// SequenceCache overload). InvalidState also: seq not active.
inline Status export_to(const BatchCache& cache, const PagedKVPool& pool, int seq, const std::int32_t* tokens,
                        int n_tokens, void* out, std::size_t capacity) noexcept {
  KVCORE_ASSIGN_OR_RETURN(const SequenceInfo info, cache.sequence(seq));
  KVCORE_CHECK_OR_RETURN_ERROR(info.active, InvalidState, "export: sequence %d is not active", seq);
  KVCORE_CHECK_OR_RETURN_ERROR(!cache.has_begun_step(), InvalidState,
                               "export: a step is begun; commit or abort it first");
  KVCORE_CHECK_OR_RETURN_ERROR(pool.n_layers() == cache.n_layers(), InvalidArgument,
                               "export: the pool has %d layers, the cache %d", pool.n_layers(), cache.n_layers());
  return export_detail::write(export_detail::BatchSource{cache, pool, seq, info}, cache.n_layers(),
                              cache.max_step(), tokens, n_tokens, out, capacity);
}

}  // namespace kvcore
