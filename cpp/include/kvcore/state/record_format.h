// The sequence record (docs/state.md): one sequence's state outside its
// process, self-describing, versioned, little-endian and checksummed. This file
// knows only bytes: the layout, how to write a record's tables into a caller's
// buffer, and its checksum (record_view.h parses and validates one). Which positions a cache puts
// in a record, and how a cache takes one back, are sequence_export.h's and
// sequence_import.h's. Nothing here allocates.
//
// Layout (every integer little-endian; offsets in bytes):
//   header   64   magic "KVCSEQ\0\1", u32 version (the oldest that describes
//                 the record: RecordFormat), u32 header_bytes (64),
//                 u64 total_bytes, u32 n_layers, i32 length, i32 max_step,
//                 i32 start, i32 n_holes, i32 n_tokens, u32 flags (0),
//                 u32 layer_bytes (40), 8 reserved zero bytes
//   holes    n_holes x (i32 begin, i32 end)
//   tokens   n_tokens x i32 (token ids of positions [0, n_tokens))
//   layers   n_layers x 40: u8 kind, u8 dtype, u16 0, i32 window, i32 sinks,
//            i32 n_kv_heads, i32 head_dim, i32 value_dim, i32 sink_end,
//            i32 held_from, i32 n_rows, i32 param (version 3: a Shared
//            layer's source, a State layer's slots D; else 0)
//   pad      zeros up to a multiple of 64
//   rows     per layer: n_rows K rows then n_rows V rows (row_size bytes
//            each: a quantized row carries its scales; each block padded
//            with zeros to a multiple of 64), in position order. A State
//            layer's rows are its states (dtype uint8, 1 head, head_dim the
//            state's bytes, value_dim 0: no V rows), row j the state after
//            position held_from + j; a Shared layer has none.
//   trailer  u64 checksum of every byte before it (kvcore::record_checksum)
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kvcore/batch/batch_plan.h"
#include "kvcore/core/config.h"
#include "kvcore/core/result.h"
#include "kvcore/pool/dtype.h"

namespace kvcore {

/// The record format's constants.
struct RecordFormat {
  /// The first 8 bytes of every record.
  static constexpr unsigned char kMagic[8] = {'K', 'V', 'C', 'S', 'E', 'Q', 0, 1};
  /// The newest version this build reads and writes. A record is written in
  /// the oldest version that describes it (version_for): version 1 for Flat,
  /// Ring and Chunked layers of plain dtypes; version 2 when a layer stores a
  /// quantized format (QInt8, Fp8E4M3: rows with their scales,
  /// docs/quantized.md); version 3 when a layer is Shared or State
  /// (docs/layer_kinds.md: the layer entry's last field is then the kind's
  /// parameter). Each version only adds, so a reader of version N reads every
  /// record written in N or older; a record naming what its version cannot
  /// describe (a quantized dtype before 2, a Shared or State layer before 3)
  /// is refused.
  static constexpr std::uint32_t kVersion = 3;
  /// The version a record of plain layers is written in.
  static constexpr std::uint32_t kPlainVersion = 1;
  /// The version that adds the quantized formats.
  static constexpr std::uint32_t kQuantizedVersion = 2;
  /// The version that adds Shared and State layers.
  static constexpr std::uint32_t kLayerKindsVersion = 3;
  static constexpr std::size_t kHeaderBytes = 64;
  static constexpr std::size_t kLayerBytes = 40;
  /// Where a layer entry's (sink_end, held_from) pair starts: after kind,
  /// dtype, the u16 and five i32s (window .. value_dim).
  static constexpr std::size_t kLayerBoundsOffset = 24;
  /// Row blocks start on this boundary (zero-copy views of any dtype).
  static constexpr std::size_t kAlign = 64;
  static constexpr std::size_t kTrailerBytes = 8;
};

/// One layer of a record: its policy and row shape, and which of the
/// sequence's visible positions its rows carry: those below `sink_end` and
/// those from `held_from` on (a ring's sinks and what its window still holds;
/// every visible position when held_from <= sink_end).
struct RecordLayer {
  LayerPolicy policy;
  DType dtype = DType::Float32;
  int n_kv_heads = 0;
  int head_dim = 0;
  int value_dim = 0;
  int sink_end = 0;
  int held_from = 0;
  /// Rows the record carries: the visible positions the two bounds select.
  int n_rows = 0;

  /// Bytes of one K / V row (a quantized format's with its scales: row_size).
  /// Precondition: the sizes fit a size_t (a layer RecordView::parse accepted).
  std::size_t k_row_bytes() const noexcept { return row_bytes_of(head_dim); }
  std::size_t v_row_bytes() const noexcept { return row_bytes_of(value_dim); }
  std::size_t row_bytes_of(int dim) const noexcept {
    std::uint64_t n = 0;
    row_size(dtype, static_cast<std::uint64_t>(n_kv_heads), static_cast<std::uint64_t>(dim), UINT64_MAX, &n);
    return static_cast<std::size_t>(n);
  }
  /// Does the layer carry position p (a visible one)? A State layer: the
  /// state after p.
  bool carries(int p) const noexcept { return p < sink_end || p >= held_from; }

  /// The version a record needs for this layer (RecordFormat::kVersion's rule).
  std::uint32_t version_needed() const noexcept {
    if (policy.kind == LayerPolicy::Kind::Shared || policy.kind == LayerPolicy::Kind::State)
      return RecordFormat::kLayerKindsVersion;
    return is_quantized(dtype) ? RecordFormat::kQuantizedVersion : RecordFormat::kPlainVersion;
  }
  /// The layer entry's last field: a Shared layer's source, a State layer's D, else 0.
  int param() const noexcept {
    return policy.kind == LayerPolicy::Kind::Shared  ? policy.source
           : policy.kind == LayerPolicy::Kind::State ? policy.slots
                                                     : 0;
  }
};

/// The sequence-wide fields of a record.
struct RecordSequence {
  int n_layers = 0;
  /// Committed length L.
  int length = 0;
  /// The exporter's max_step (informational: its rewind margin).
  int max_step = 1;
  /// Positions below `start` were removed (the removed head).
  int start = 0;
  int n_holes = 0;
  /// Token ids of positions [0, n_tokens) are known (0: none).
  int n_tokens = 0;
};

namespace record_detail {

inline std::size_t padded(std::size_t n) noexcept {
  return (n + RecordFormat::kAlign - 1) / RecordFormat::kAlign * RecordFormat::kAlign;
}
inline void put_u32(unsigned char* p, std::uint32_t v) noexcept {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
inline void put_u64(unsigned char* p, std::uint64_t v) noexcept {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
inline std::uint32_t get_u32(const unsigned char* p) noexcept {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(p[i]) << (8 * i);
  return v;
}
inline std::uint64_t get_u64(const unsigned char* p) noexcept {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return v;
}
inline void put_i32(unsigned char* p, int v) noexcept { put_u32(p, static_cast<std::uint32_t>(v)); }

// Checked arithmetic for untrusted sizes: a * b (and a + b) into `out` when
// the result is at most `limit` (so it can neither wrap in 64 bits nor exceed
// a size_t when limit is one); false otherwise, `out` untouched.
inline bool mul_within(std::uint64_t a, std::uint64_t b, std::uint64_t limit, std::uint64_t& out) noexcept {
  if (a != 0 && b > limit / a) return false;
  out = a * b;
  return true;
}
inline bool add_within(std::uint64_t a, std::uint64_t b, std::uint64_t limit, std::uint64_t& out) noexcept {
  if (a > limit || b > limit - a) return false;
  out = a + b;
  return true;
}
inline int get_i32(const unsigned char* p) noexcept { return static_cast<int>(get_u32(p)); }

// Rows and token ids are copied as the host stores them: records are little-endian.
constexpr bool host_is_little_endian() noexcept {
#if defined(__BYTE_ORDER__) && defined(__ORDER_BIG_ENDIAN__)
  return __BYTE_ORDER__ != __ORDER_BIG_ENDIAN__;
#else
  return true;
#endif
}

}  // namespace record_detail

/// The record's checksum of `n` bytes: FNV-1a 64 run over little-endian 64-bit
/// words in four interleaved lanes (word i feeds lane i % 4; a lane takes
/// h = (h ^ word) * 0x100000001b3 from the offset basis 0xcbf29ce484222325
/// plus its lane index), the lanes then folded in order into lane 0 the same
/// way, then the n % 8 tail bytes one by one, then n. Word-wide so that it
/// keeps up with memcpy; not a cryptographic hash.
inline std::uint64_t record_checksum(const void* data, std::size_t n) noexcept {
  constexpr std::uint64_t kPrime = 0x100000001b3ull;
  constexpr std::uint64_t kBasis = 0xcbf29ce484222325ull;
  const unsigned char* p = static_cast<const unsigned char*>(data);
  // Four lanes in registers: independent multiply chains keep pace with memory.
  std::uint64_t a = kBasis, b = kBasis + 1, c = kBasis + 2, d = kBasis + 3;
  const std::size_t words = n / 8;
  std::size_t w = 0;
  // Records are little-endian and only little-endian hosts read them
  // (RecordView::parse refuses others), so a word is a plain load.
  for (; w + 4 <= words; w += 4) {
    std::uint64_t x[4];
    std::memcpy(x, p + w * 8, 32);
    a = (a ^ x[0]) * kPrime;
    b = (b ^ x[1]) * kPrime;
    c = (c ^ x[2]) * kPrime;
    d = (d ^ x[3]) * kPrime;
  }
  std::uint64_t* lane[4] = {&a, &b, &c, &d};
  for (; w < words; ++w) *lane[w % 4] = (*lane[w % 4] ^ record_detail::get_u64(p + w * 8)) * kPrime;
  std::uint64_t h = a;
  h = (h ^ b) * kPrime;
  h = (h ^ c) * kPrime;
  h = (h ^ d) * kPrime;
  for (std::size_t i = words * 8; i < n; ++i) h = (h ^ p[i]) * kPrime;
  return (h ^ static_cast<std::uint64_t>(n)) * kPrime;
}

/// Where each part of a record lies, from its sequence fields and layers.
struct RecordLayout {
  std::size_t holes = 0;
  std::size_t tokens = 0;
  std::size_t layers = 0;
  std::size_t rows = 0;  ///< the first layer's K rows
  std::size_t total = 0;

  /// The layout of a record with `seq` and layers layer_at(0) ..
  /// layer_at(n_layers - 1) (their n_rows set). Precondition: non-negative
  /// counts (64-bit sums of int-sized parts cannot overflow).
  template <class LayerAt>
  static RecordLayout of(const RecordSequence& seq, LayerAt layer_at) noexcept {
    RecordLayout l = tables(seq);
    std::size_t at = l.rows;
    for (int i = 0; i < seq.n_layers; ++i) at += row_block_bytes(layer_at(i));
    l.total = at + RecordFormat::kTrailerBytes;
    return l;
  }

  /// Everything but the rows (total left 0).
  static RecordLayout tables(const RecordSequence& seq) noexcept {
    RecordLayout l;
    l.holes = RecordFormat::kHeaderBytes;
    l.tokens = l.holes + 8 * static_cast<std::size_t>(seq.n_holes);
    l.layers = l.tokens + 4 * static_cast<std::size_t>(seq.n_tokens);
    l.rows = record_detail::padded(l.layers + RecordFormat::kLayerBytes * static_cast<std::size_t>(seq.n_layers));
    return l;
  }

  /// Bytes of a layer's K rows and V rows, each padded, computed without
  /// wrapping: false when they (or any product on the way) exceed `limit`
  /// (for an untrusted layer: the record's size). Fields must be >= 0.
  static bool checked_row_block_bytes(const RecordLayer& layer, std::uint64_t limit, std::uint64_t& out) noexcept {
    using record_detail::mul_within;
    const std::uint64_t rows = static_cast<std::uint64_t>(layer.n_rows);
    const std::uint64_t heads = static_cast<std::uint64_t>(layer.n_kv_heads);
    std::uint64_t k = 0, v = 0, k_rows = 0, v_rows = 0;
    if (!row_size(layer.dtype, heads, static_cast<std::uint64_t>(layer.head_dim), limit, &k) ||
        !mul_within(k, rows, limit, k_rows))
      return false;
    if (!row_size(layer.dtype, heads, static_cast<std::uint64_t>(layer.value_dim), limit, &v) ||
        !mul_within(v, rows, limit, v_rows))
      return false;
    // padded(x) <= x + 63: with x <= limit it stays within limit + 63.
    const std::uint64_t kp = (k_rows + RecordFormat::kAlign - 1) / RecordFormat::kAlign * RecordFormat::kAlign;
    const std::uint64_t vp = (v_rows + RecordFormat::kAlign - 1) / RecordFormat::kAlign * RecordFormat::kAlign;
    return record_detail::add_within(kp, vp, limit, out);
  }

  /// Bytes of a layer's K rows and V rows, each padded. Precondition: they
  /// fit a size_t (a layer RecordView::parse accepted, or the cache's own).
  static std::size_t row_block_bytes(const RecordLayer& layer) noexcept {
    const std::size_t n = static_cast<std::size_t>(layer.n_rows);
    return record_detail::padded(n * layer.k_row_bytes()) + record_detail::padded(n * layer.v_row_bytes());
  }
};

/// Writes a record into a caller's buffer of at least `layout.total` bytes
/// (the caller checked): the header, holes (hole_at(h)), tokens, the layer
/// table (layer_at(l)) and every padding byte (zero, so a record is a pure
/// function of the sequence). Returns where each layer's rows go: the caller
/// fills them layer by layer, in order, then calls seal_record().
template <class HoleAt, class LayerAt>
void write_record_tables(unsigned char* out, const RecordSequence& seq, const RecordLayout& layout, HoleAt hole_at,
                         const std::int32_t* tokens, LayerAt layer_at) noexcept {
  using namespace record_detail;
  std::memset(out, 0, layout.rows);
  std::memcpy(out, RecordFormat::kMagic, 8);
  std::uint32_t version = RecordFormat::kPlainVersion;
  for (int l = 0; l < seq.n_layers; ++l) {
    const std::uint32_t needed = layer_at(l).version_needed();
    if (needed > version) version = needed;
  }
  put_u32(out + 8, version);
  put_u32(out + 12, static_cast<std::uint32_t>(RecordFormat::kHeaderBytes));
  put_u64(out + 16, static_cast<std::uint64_t>(layout.total));
  put_u32(out + 24, static_cast<std::uint32_t>(seq.n_layers));
  const int fields[5] = {seq.length, seq.max_step, seq.start, seq.n_holes, seq.n_tokens};
  for (int f = 0; f < 5; ++f) put_i32(out + 28 + 4 * f, fields[f]);
  put_u32(out + 52, static_cast<std::uint32_t>(RecordFormat::kLayerBytes));
  for (int h = 0; h < seq.n_holes; ++h) {
    const PositionRange r = hole_at(h);
    put_i32(out + layout.holes + 8 * static_cast<std::size_t>(h), r.begin);
    put_i32(out + layout.holes + 8 * static_cast<std::size_t>(h) + 4, r.end);
  }
  for (int t = 0; t < seq.n_tokens; ++t) put_i32(out + layout.tokens + 4 * static_cast<std::size_t>(t), tokens[t]);
  std::size_t at = layout.rows;
  for (int l = 0; l < seq.n_layers; ++l) {
    unsigned char* e = out + layout.layers + RecordFormat::kLayerBytes * static_cast<std::size_t>(l);
    const RecordLayer r = layer_at(l);
    e[0] = static_cast<unsigned char>(r.policy.kind);
    e[1] = static_cast<unsigned char>(r.dtype);
    const int values[9] = {r.policy.window, r.policy.sinks, r.n_kv_heads, r.head_dim, r.value_dim,
                           r.sink_end,      r.held_from,    r.n_rows,     r.param()};
    for (int f = 0; f < 9; ++f) put_i32(e + 4 + 4 * f, values[f]);
    // Zero each row block's padding.
    const std::size_t k = static_cast<std::size_t>(r.n_rows) * r.k_row_bytes();
    const std::size_t v = static_cast<std::size_t>(r.n_rows) * r.v_row_bytes();
    std::memset(out + at + k, 0, padded(k) - k);
    at += padded(k);
    std::memset(out + at + v, 0, padded(v) - v);
    at += padded(v);
  }
}

/// Writes the checksum of a record whose every other byte is written.
inline void seal_record(unsigned char* out, const RecordLayout& layout) noexcept {
  const std::size_t body = layout.total - RecordFormat::kTrailerBytes;
  record_detail::put_u64(out + body, record_checksum(out, body));
}

}  // namespace kvcore
