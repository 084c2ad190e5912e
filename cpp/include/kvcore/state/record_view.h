// RecordView: a parsed, validated sequence record (record_format.h) over the
// caller's bytes. parse() checks everything a reader relies on before anyone
// trusts a field: the size, the magic, the version, the checksum, then every
// field's rule (lengths, holes sorted inside the sequence, policies, shapes,
// each layer's row count). Nothing is copied or allocated.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvcore/state/record_format.h"

namespace kvcore {

/// Calls f(begin, end) for each maximal run of the positions `layer` carries
/// in a sequence of `length` positions whose head below `start` and holes
/// hole(0) .. hole(n_holes - 1) (sorted) were removed: visible positions below sink_end or from held_from on, in
/// increasing order.
template <class HoleAt, class F>
void for_each_carried_run(int length, int start, int n_holes, HoleAt hole, const RecordLayer& layer, F f) noexcept {
  const int bounds[2][2] = {{0, layer.sink_end < length ? layer.sink_end : length},
                            {layer.held_from > layer.sink_end ? layer.held_from : layer.sink_end, length}};
  int p = start;
  for (int h = 0; h <= n_holes; ++h) {
    const PositionRange r = h < n_holes ? hole(h) : PositionRange{length, length};
    const int end = r.begin;
    for (const auto& b : bounds) {
      const int lo = p > b[0] ? p : b[0];
      const int hi = end < b[1] ? end : b[1];
      if (lo < hi) f(lo, hi);
    }
    p = r.end;
  }
}

/// The first visible position (not below `start`, not in a hole) in [lo, hi),
/// or hi when none: holes hole(0) .. hole(n_holes - 1) are sorted.
template <class HoleAt>
int next_visible_position(int start, int n_holes, HoleAt hole, int lo, int hi) noexcept {
  int p = lo > start ? lo : start;
  for (int h = 0; h < n_holes && p < hi; ++h) {
    const PositionRange r = hole(h);
    if (p < r.begin) break;
    if (p < r.end) p = r.end;
  }
  return p < hi ? p : hi;
}

/// The first visible position that a query at position q (0 <= q <= length)
/// of a sequence (removed head `start`, sorted holes) sees on `layer` by its
/// policy (docs/design.md section 2: flat, every k < q; ring of window W and
/// S sinks, k < min(S, q) or k >= max(0, q - W + 1)) and that the layer does
/// not carry (it lies in [sink_end, held_from)); -1 when the layer carries
/// every position such a query needs. A record answering -1 for q = length
/// holds every rewind its bounds allow too: a rewind to n <= length needs the
/// sinks below min(S, n) (below min(S, length): checked) and the window
/// [max(0, n - W + 1), n), which an importer allows only from held_from on
/// (or below sink_end), where the record carries everything.
template <class HoleAt>
int first_needed_uncarried(int start, int n_holes, HoleAt hole, const RecordLayer& layer, int q) noexcept {
  const int gap_lo = layer.sink_end, gap_hi = layer.held_from < q ? layer.held_from : q;
  if (gap_lo >= gap_hi) return -1;  // the layer carries everything below q
  // The needed set below q: [0, sinks') and [window_begin, q) (flat: [0, q)).
  const bool ring = layer.policy.evicts();
  const int sinks = ring ? (layer.policy.sinks < q ? layer.policy.sinks : q) : 0;
  const int wb = layer.policy.window_begin(q);
  const int needed[2][2] = {{0, sinks}, {wb, q}};
  for (const auto& n : needed) {
    const int lo = n[0] > gap_lo ? n[0] : gap_lo;
    const int hi = n[1] < gap_hi ? n[1] : gap_hi;
    if (lo >= hi) continue;
    const int p = next_visible_position(start, n_holes, hole, lo, hi);
    if (p < hi) return p;
  }
  return -1;
}

/// Positions `layer` carries (see for_each_carried_run).
template <class HoleAt>
int carried_positions(int length, int start, int n_holes, HoleAt hole, const RecordLayer& layer) noexcept {
  int n = 0;
  for_each_carried_run(length, start, n_holes, hole, layer, [&n](int lo, int hi) { n += hi - lo; });
  return n;
}

class RecordView {
 public:
  /// Parses and validates `size` bytes at `data`. InvalidArgument naming the
  /// field and its rule: truncated (fewer bytes than the header or than its
  /// total_bytes), trailing bytes, bad magic, a header or layer-entry size
  /// other than every version has, a checksum mismatch (corrupt), or a field out of
  /// its rule. NotSupported: a version newer than this build reads, or a
  /// big-endian host.
  static Result<RecordView> parse(const void* data, std::size_t size) noexcept;

  const RecordSequence& sequence() const noexcept { return seq_; }
  std::uint32_t version() const noexcept { return version_; }
  /// Layer l (0 <= l < n_layers; decoded from the bytes).
  RecordLayer layer(int l) const noexcept { return decode_layer(l); }
  /// Hole h (0 <= h < n_holes).
  PositionRange hole(int h) const noexcept {
    return PositionRange{record_detail::get_i32(bytes_ + layout_.holes + 8 * static_cast<std::size_t>(h)),
                         record_detail::get_i32(bytes_ + layout_.holes + 8 * static_cast<std::size_t>(h) + 4)};
  }
  /// Token id of position p (0 <= p < n_tokens).
  std::int32_t token(int p) const noexcept {
    return record_detail::get_i32(bytes_ + layout_.tokens + 4 * static_cast<std::size_t>(p));
  }
  /// The holes as stored (int32 begin, end pairs; 8-byte aligned).
  const PositionRange* holes() const noexcept {
    return reinterpret_cast<const PositionRange*>(bytes_ + layout_.holes);
  }
  /// The token ids, as stored (little-endian int32: the host's order; parse()
  /// checked the record is 8-byte aligned).
  const std::int32_t* tokens() const noexcept { return reinterpret_cast<const std::int32_t*>(bytes_ + layout_.tokens); }
  /// Layer 0's (sink_end, held_from) pair as stored: layer l's is
  /// kLayerBytes / 4 int32s further on (4-byte aligned in an aligned record).
  const std::int32_t* layer_bounds() const noexcept {
    return reinterpret_cast<const std::int32_t*>(bytes_ + layout_.layers + RecordFormat::kLayerBoundsOffset);
  }
  /// Layer l's K rows (n_rows of k_row_bytes, in position order) and V rows.
  const unsigned char* k_rows(int l) const noexcept { return bytes_ + row_offset(l); }
  const unsigned char* v_rows(int l) const noexcept {
    const RecordLayer r = layer(l);
    return bytes_ + row_offset(l) + record_detail::padded(static_cast<std::size_t>(r.n_rows) * r.k_row_bytes());
  }
  /// Offset of layer l's K rows from the record's first byte.
  std::size_t row_offset(int l) const noexcept {
    std::size_t at = layout_.rows;
    for (int i = 0; i < l; ++i) at += RecordLayout::row_block_bytes(layer(i));
    return at;
  }
  std::size_t size() const noexcept { return layout_.total; }

 private:
  RecordLayer decode_layer(int l) const noexcept {
    const unsigned char* e = bytes_ + layout_.layers + RecordFormat::kLayerBytes * static_cast<std::size_t>(l);
    RecordLayer r;
    r.policy.kind = static_cast<LayerPolicy::Kind>(e[0]);
    r.dtype = static_cast<DType>(e[1]);
    int* fields[8] = {&r.policy.window, &r.policy.sinks, &r.n_kv_heads, &r.head_dim,
                      &r.value_dim,     &r.sink_end,     &r.held_from,  &r.n_rows};
    for (int f = 0; f < 8; ++f) *fields[f] = record_detail::get_i32(e + 4 + 4 * f);
    const int param = record_detail::get_i32(e + 36);
    if (r.policy.kind == LayerPolicy::Kind::Shared) r.policy.source = param;
    if (r.policy.kind == LayerPolicy::Kind::State) r.policy.slots = param;
    return r;
  }
  Status check_envelope(std::size_t size) noexcept;
  Status check_sequence() const noexcept;
  Status check_layer(int l) const noexcept;
  Status check_shared_layer(int l, const RecordLayer& r) const noexcept;
  Status check_state_layer(int l, const RecordLayer& r) const noexcept;

  const unsigned char* bytes_ = nullptr;
  std::uint32_t version_ = 0;
  RecordSequence seq_;
  RecordLayout layout_;
};

// The size, magic, version and checksum: what must hold before any field is read.
inline Status RecordView::check_envelope(std::size_t size) noexcept {
  using namespace record_detail;
  constexpr std::size_t kMin = RecordFormat::kHeaderBytes + RecordFormat::kTrailerBytes;
  KVCORE_CHECK_OR_RETURN_ERROR(size >= kMin, InvalidArgument,
                               "record: truncated: %zu bytes, a record has at least %zu", size, kMin);
  bool magic = true;
  for (int i = 0; i < 8; ++i) magic = magic && bytes_[i] == RecordFormat::kMagic[i];
  KVCORE_CHECK_OR_RETURN_ERROR(magic, InvalidArgument, "record: bad magic: not a kvcore sequence record");
  version_ = get_u32(bytes_ + 8);
  KVCORE_CHECK_OR_RETURN_ERROR(version_ <= RecordFormat::kVersion, NotSupported,
                               "record: version %u is newer than this build reads (%u)", version_,
                               RecordFormat::kVersion);
  KVCORE_CHECK_OR_RETURN_ERROR(version_ >= 1, InvalidArgument, "record: version 0 is not a version");
  const std::uint32_t header = get_u32(bytes_ + 12);
  const std::uint32_t entry = get_u32(bytes_ + 52);
  KVCORE_CHECK_OR_RETURN_ERROR(header == RecordFormat::kHeaderBytes && entry == RecordFormat::kLayerBytes,
                               InvalidArgument, "record: header_bytes %u / layer_bytes %u: every version has 64 / 40",
                               header, entry);
  const std::uint64_t total = get_u64(bytes_ + 16);
  KVCORE_CHECK_OR_RETURN_ERROR(total <= size, InvalidArgument,
                               "record: truncated: %zu bytes, its total_bytes says %llu", size,
                               static_cast<unsigned long long>(total));
  KVCORE_CHECK_OR_RETURN_ERROR(total == size && total >= kMin, InvalidArgument,
                               "record: total_bytes %llu: the buffer has %zu bytes (trailing bytes)",
                               static_cast<unsigned long long>(total), size);
  const std::uint64_t stored = get_u64(bytes_ + size - 8);
  const std::uint64_t computed = record_checksum(bytes_, size - 8);
  KVCORE_CHECK_OR_RETURN_ERROR(stored == computed, InvalidArgument,
                               "record: checksum mismatch (stored %016llx, computed %016llx): corrupt",
                               static_cast<unsigned long long>(stored), static_cast<unsigned long long>(computed));
  return Error::Ok;
}

// The sequence fields and holes, and that the layer table lies within the record.
inline Status RecordView::check_sequence() const noexcept {
  const RecordSequence& s = seq_;
  KVCORE_CHECK_OR_RETURN_ERROR(s.n_layers >= 1 && s.n_layers <= CacheConfig::kMaxLayers, InvalidArgument,
                               "record: n_layers = %d: must be in [1, %d]", s.n_layers, CacheConfig::kMaxLayers);
  KVCORE_CHECK_OR_RETURN_ERROR(s.length >= 0 && s.max_step >= 1, InvalidArgument,
                               "record: length = %d, max_step = %d: need length >= 0, max_step >= 1", s.length,
                               s.max_step);
  KVCORE_CHECK_OR_RETURN_ERROR(s.start >= 0 && s.start <= s.length, InvalidArgument,
                               "record: start = %d: must be in [0, length = %d]", s.start, s.length);
  KVCORE_CHECK_OR_RETURN_ERROR(s.n_tokens >= 0 && s.n_tokens <= s.length, InvalidArgument,
                               "record: n_tokens = %d: must be in [0, length = %d]", s.n_tokens, s.length);
  KVCORE_CHECK_OR_RETURN_ERROR(s.n_holes >= 0 && s.n_holes <= s.length, InvalidArgument,
                               "record: n_holes = %d: must be in [0, length = %d]", s.n_holes, s.length);
  // 64-bit sums of counts below 2^31 (and n_layers <= 2^16): no wrap, on any size_t.
  const std::uint64_t tables = RecordFormat::kHeaderBytes + 8 * static_cast<std::uint64_t>(s.n_holes) +
                               4 * static_cast<std::uint64_t>(s.n_tokens) +
                               RecordFormat::kLayerBytes * static_cast<std::uint64_t>(s.n_layers);
  KVCORE_CHECK_OR_RETURN_ERROR(tables + RecordFormat::kTrailerBytes <= layout_.total, InvalidArgument,
                               "record: total_bytes %zu: too small for its %d holes, %d tokens and %d layers",
                               layout_.total, s.n_holes, s.n_tokens, s.n_layers);
  int prev_end = s.start;
  for (int h = 0; h < s.n_holes; ++h) {
    const PositionRange r = hole(h);
    KVCORE_CHECK_OR_RETURN_ERROR(r.begin > prev_end && r.end > r.begin && r.end <= s.length, InvalidArgument,
                                 "record: hole %d [%d, %d): holes must be sorted, apart, past start = %d and "
                                 "within length = %d",
                                 h, r.begin, r.end, s.start, s.length);
    prev_end = r.end;
  }
  return Error::Ok;
}

// Layer l's policy, shape, dtype, bounds and row count.
inline Status RecordView::check_layer(int l) const noexcept {
  const RecordLayer r = layer(l);
  const LayerPolicy::Kind kind = r.policy.kind;
  KVCORE_CHECK_OR_RETURN_ERROR(element_size(r.dtype) != 0, InvalidArgument, "record: layer %d dtype %d: unknown", l,
                               static_cast<int>(r.dtype));
  KVCORE_CHECK_OR_RETURN_ERROR(version_ >= r.version_needed(), InvalidArgument,
                               "record: layer %d (kind %d, dtype %s) needs record version %u, the record says %u "
                               "(RecordFormat::kVersion's rule)",
                               l, static_cast<int>(kind), to_string(r.dtype), r.version_needed(), version_);
  const int param = record_detail::get_i32(bytes_ + layout_.layers + RecordFormat::kLayerBytes * static_cast<std::size_t>(l) + 36);
  KVCORE_CHECK_OR_RETURN_ERROR(param == r.param(), InvalidArgument,
                               "record: layer %d's last field is %d: only a Shared or State layer has one", l,
                               param);
  if (kind == LayerPolicy::Kind::Shared) return check_shared_layer(l, r);
  if (kind == LayerPolicy::Kind::State) return check_state_layer(l, r);
  const bool ring = r.policy.evicts();
  const bool policy_ok = kind == LayerPolicy::Kind::Ring      ? r.policy.window >= 1 && r.policy.sinks >= 0
                         : kind == LayerPolicy::Kind::Chunked ? r.policy.window >= 1 && r.policy.sinks == 0
                                                              : kind == LayerPolicy::Kind::Flat &&
                                                                    r.policy.window == 0 && r.policy.sinks == 0;
  KVCORE_CHECK_OR_RETURN_ERROR(policy_ok, InvalidArgument,
                               "record: layer %d policy (kind %d, window %d, sinks %d) breaks the config rules", l,
                               static_cast<int>(kind), r.policy.window, r.policy.sinks);
  KVCORE_CHECK_OR_RETURN_ERROR(r.n_kv_heads >= 1 && r.head_dim >= 1 && r.value_dim >= 1, InvalidArgument,
                               "record: layer %d shape (heads %d, head_dim %d, value_dim %d): each must be >= 1", l,
                               r.n_kv_heads, r.head_dim, r.value_dim);
  KVCORE_CHECK_OR_RETURN_ERROR(r.sink_end >= 0 && r.held_from >= 0 && r.held_from <= seq_.length, InvalidArgument,
                               "record: layer %d sink_end %d / held_from %d: need >= 0, held_from <= length %d", l,
                               r.sink_end, r.held_from, seq_.length);
  const int carried = carried_positions(seq_.length, seq_.start, seq_.n_holes, [this](int h) { return hole(h); }, r);
  KVCORE_CHECK_OR_RETURN_ERROR(r.n_rows == carried, InvalidArgument,
                               "record: layer %d n_rows = %d: its sink_end/held_from select %d positions", l,
                               r.n_rows, carried);
  // Complete: the layer carries every visible position a query at the length
  // needs by its policy (and so every rewind its bounds allow).
  const int missing =
      first_needed_uncarried(seq_.start, seq_.n_holes, [this](int h) { return hole(h); }, r, seq_.length);
  KVCORE_CHECK_OR_RETURN_ERROR(missing < 0, InvalidArgument,
                               "record: layer %d (%s, window %d, sinks %d) lacks position %d, which a query at "
                               "length %d needs (sink_end %d, held_from %d): incomplete",
                               l, ring ? "ring" : "flat", r.policy.window, r.policy.sinks, missing, seq_.length,
                               r.sink_end, r.held_from);
  return Error::Ok;
}

// A Shared layer (version 3): reads an earlier K/V layer's rows, carries none,
// in one written form (no rows, sink_end 0, held_from = length), with its
// source's shape and dtype.
inline Status RecordView::check_shared_layer(int l, const RecordLayer& r) const noexcept {
  const int src = r.policy.source;
  KVCORE_CHECK_OR_RETURN_ERROR(src >= 0 && src < l && r.policy.window == 0 && r.policy.sinks == 0, InvalidArgument,
                               "record: layer %d is Shared(%d) (window %d, sinks %d): its source must be an earlier "
                               "layer, window and sinks 0",
                               l, src, r.policy.window, r.policy.sinks);
  const RecordLayer s = layer(src);
  KVCORE_CHECK_OR_RETURN_ERROR(s.policy.holds_keys(), InvalidArgument,
                               "record: layer %d is Shared(%d), and layer %d (kind %d) holds no K/V rows", l, src,
                               src, static_cast<int>(s.policy.kind));
  KVCORE_CHECK_OR_RETURN_ERROR(
      r.dtype == s.dtype && r.n_kv_heads == s.n_kv_heads && r.head_dim == s.head_dim && r.value_dim == s.value_dim,
      InvalidArgument,
      "record: layer %d is Shared(%d): its shape (%s, heads %d, head_dim %d, value_dim %d) must be its source's "
      "(%s, %d, %d, %d)",
      l, src, to_string(r.dtype), r.n_kv_heads, r.head_dim, r.value_dim, to_string(s.dtype), s.n_kv_heads,
      s.head_dim, s.value_dim);
  KVCORE_CHECK_OR_RETURN_ERROR(r.n_rows == 0 && r.sink_end == 0 && r.held_from == seq_.length, InvalidArgument,
                               "record: layer %d is Shared: it carries no rows (n_rows %d, sink_end %d, held_from %d; "
                               "need 0, 0, length = %d)",
                               l, r.n_rows, r.sink_end, r.held_from, seq_.length);
  return Error::Ok;
}

// A State layer (version 3): D slots; its rows are the states after
// positions [held_from, length), at least the last one (the next token reads
// it) and at most D (what the importer's slots hold), of `head_dim` bytes
// each (dtype uint8, one head, no V). Its sequence removed nothing (a model
// with State layers cannot: docs/layer_kinds.md).
inline Status RecordView::check_state_layer(int l, const RecordLayer& r) const noexcept {
  const int D = r.policy.slots, L = seq_.length;
  KVCORE_CHECK_OR_RETURN_ERROR(D >= 1 && r.policy.window == 0 && r.policy.sinks == 0, InvalidArgument,
                               "record: layer %d is State(slots %d) (window %d, sinks %d): needs slots >= 1, window "
                               "and sinks 0",
                               l, D, r.policy.window, r.policy.sinks);
  KVCORE_CHECK_OR_RETURN_ERROR(
      r.dtype == DType::UInt8 && r.n_kv_heads == 1 && r.head_dim >= 1 && r.value_dim == 0, InvalidArgument,
      "record: layer %d is State: its rows are states of head_dim bytes (dtype uint8, 1 head, value_dim 0), the "
      "record says %s, heads %d, head_dim %d, value_dim %d",
      l, to_string(r.dtype), r.n_kv_heads, r.head_dim, r.value_dim);
  KVCORE_CHECK_OR_RETURN_ERROR(seq_.start == 0 && seq_.n_holes == 0, InvalidArgument,
                               "record: layer %d is State, and the record removed positions (start %d, %d holes): "
                               "a model with State layers removes none",
                               l, seq_.start, seq_.n_holes);
  const std::int64_t lowest = L > D ? static_cast<std::int64_t>(L) - D : 0;
  const int highest = L > 0 ? L - 1 : 0;
  KVCORE_CHECK_OR_RETURN_ERROR(r.sink_end == 0 && r.held_from >= lowest && r.held_from <= highest, InvalidArgument,
                               "record: layer %d is State(slots %d) at length %d: sink_end %d / held_from %d: needs "
                               "sink_end 0 and held_from in [%lld, %d] (the last state, at most D states)",
                               l, D, L, r.sink_end, r.held_from, static_cast<long long>(lowest), highest);
  KVCORE_CHECK_OR_RETURN_ERROR(r.n_rows == L - r.held_from, InvalidArgument,
                               "record: layer %d n_rows = %d: its held_from selects %d states", l, r.n_rows,
                               L - r.held_from);
  return Error::Ok;
}

inline Result<RecordView> RecordView::parse(const void* data, std::size_t size) noexcept {
  KVCORE_CHECK_OR_RETURN_ERROR(record_detail::host_is_little_endian(), NotSupported,
                               "record: this host is big-endian; records are little-endian");
  KVCORE_CHECK_OR_RETURN_ERROR(data != nullptr || size == 0, InvalidArgument, "record: data is null");
  KVCORE_CHECK_OR_RETURN_ERROR(reinterpret_cast<std::uintptr_t>(data) % 8 == 0, InvalidArgument,
                               "record: the data starts %d bytes past an 8-byte boundary: a record must start on one",
                               static_cast<int>(reinterpret_cast<std::uintptr_t>(data) % 8));
  RecordView v;
  v.bytes_ = static_cast<const unsigned char*>(data);
  KVCORE_RETURN_IF_ERROR(v.check_envelope(size));
  using record_detail::get_i32;
  v.seq_.n_layers = get_i32(v.bytes_ + 24);
  v.seq_.length = get_i32(v.bytes_ + 28);
  v.seq_.max_step = get_i32(v.bytes_ + 32);
  v.seq_.start = get_i32(v.bytes_ + 36);
  v.seq_.n_holes = get_i32(v.bytes_ + 40);
  v.seq_.n_tokens = get_i32(v.bytes_ + 44);
  // Only the holes' offset (fixed) and the size are known before the counts pass.
  v.layout_.holes = RecordFormat::kHeaderBytes;
  v.layout_.total = size;
  KVCORE_RETURN_IF_ERROR(v.check_sequence());
  const std::size_t total = size;
  v.layout_ = RecordLayout::tables(v.seq_);  // fits: check_sequence() bounded it by the size
  v.layout_.total = total;
  // Every size below is at most the record's: checked before it is added.
  std::uint64_t at = v.layout_.rows;
  for (int l = 0; l < v.seq_.n_layers; ++l) {
    KVCORE_RETURN_IF_ERROR(v.check_layer(l));
    const RecordLayer r = v.layer(l);
    std::uint64_t bytes = 0;
    KVCORE_CHECK_OR_RETURN_ERROR(RecordLayout::checked_row_block_bytes(r, size, bytes), InvalidArgument,
                                 "record: layer %d: %d rows of %d heads x (head_dim %d + value_dim %d) %s "
                                 "elements are more bytes than the record's %zu",
                                 l, r.n_rows, r.n_kv_heads, r.head_dim, r.value_dim, to_string(r.dtype), size);
    at += bytes;  // both at most size < 2^63: no wrap
    KVCORE_CHECK_OR_RETURN_ERROR(at + RecordFormat::kTrailerBytes <= size, InvalidArgument,
                                 "record: layer %d's rows end past total_bytes %zu", l, size);
  }
  KVCORE_CHECK_OR_RETURN_ERROR(at + RecordFormat::kTrailerBytes == size, InvalidArgument,
                               "record: total_bytes %zu: its layers' rows end at %zu", size,
                               static_cast<std::size_t>(at + RecordFormat::kTrailerBytes));
  return v;
}

}  // namespace kvcore
