// libFuzzer harness for sequence records (docs/state.md): bytes -> a record
// -> RecordView::parse -> import into a SequenceCache + KVPool or a
// BatchCache + PagedKVPool (block size 1, 2 or 4), or a SequenceCache of the
// section 9 kinds (bit 3). Input: byte 0 picks the
// destination (bits 1-2, 3) and whether the harness fixes the checksum first
// (bit 0: so that mutations reach the field checks past the envelope); the
// rest is the record. Checked, from the rules (docs/state.md and
// docs/design.md section 2), not from the code:
// - a parsed record's every table and row block lies inside the buffer, and
//   each layer's n_rows is the count of the visible positions its bounds
//   select;
// - a parsed record is complete: every visible position a query at its
//   length sees on a layer (flat: all below the length; ring of window W and
//   S sinks: below min(S, L), and from L - W + 1) is carried;
// - a refused import changes nothing (length 0 / inactive, every pool's free
//   blocks as before);
// - after an accepted import, the next step's read of every layer names, for
//   every position below the length, exactly the record's bytes of it.
//
// Fuzz build: tests/fuzz/CMakeLists.txt (clang, -fsanitize=fuzzer,address,undefined).
// The same source compiles into the gtest binary (tests/cpp/record_fuzz_replay_test.cpp,
// which defines KVCORE_FUZZ_NO_ENTRY_POINT), replaying tests/fuzz/record_corpus.
// tests/fuzz/make_record_corpus.py writes the seed corpus (valid records of
// every layout the destinations take).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kvcore/kvcore.h"

namespace kvcore_record_fuzz {

using kvcore::BatchCache;
using kvcore::CacheConfig;
using kvcore::LayerConfig;
using kvcore::LayerPolicy;
using kvcore::RecordLayer;
using kvcore::RecordView;

/// What the replay test asserts the corpus reaches.
struct Coverage {
  long inputs = 0;
  long parsed = 0;          // RecordView::parse accepted
  long refused_parse = 0;   // ... refused
  long imported_seq = 0;    // accepted by a SequenceCache
  long imported_batch = 0;  // accepted by a BatchCache
  long imported_kinds = 0;  // accepted by the kinds destination (Shared and State layers)
  long refused_import = 0;  // parsed, refused by the destination
  long rows_checked = 0;    // read rows compared with the record's
};
inline Coverage*& coverage() {
  static Coverage* c = nullptr;
  return c;
}

// The destinations' model: what tests/fuzz/make_record_corpus.py exports.
inline CacheConfig destination(int block_size) {
  CacheConfig cfg;
  cfg.capacity = 64;
  cfg.n_layers = 3;
  cfg.layers = {LayerConfig{LayerPolicy::ring(4, 1), 1, 2, 0}, LayerConfig{LayerPolicy::flat(), 1, 2, 0},
                LayerConfig{LayerPolicy::ring(6, 2), 1, 2, 0}};
  cfg.max_step = 3;
  cfg.initial_capacity = 8;
  cfg.batch.block_size = block_size;
  cfg.batch.max_seqs = 2;
  cfg.batch.max_holes = 4;
  return cfg;
}

// The visible positions of [lo, hi) as the format defines them, walked
// position by position (hi - lo is bounded by the caller).
struct Visibility {
  const RecordView& rec;
  bool visible(int p) const {
    const kvcore::RecordSequence& s = rec.sequence();
    if (p < s.start || p >= s.length) return false;
    for (int h = 0; h < s.n_holes; ++h)
      if (p >= rec.hole(h).begin && p < rec.hole(h).end) return false;
    return true;
  }
};

inline bool carries(const RecordLayer& r, int p) { return p < r.sink_end || p >= r.held_from; }

// The record's properties that hold of any record parse accepts. "" or what broke.
inline std::string check_parsed(const RecordView& rec, std::size_t size) {
  const kvcore::RecordSequence& s = rec.sequence();
  const Visibility vis{rec};
  const auto* base = reinterpret_cast<const unsigned char*>(rec.k_rows(0)) - rec.row_offset(0);
  for (int l = 0; l < s.n_layers; ++l) {
    const RecordLayer r = rec.layer(l);
    const std::size_t k_end = static_cast<std::size_t>(rec.k_rows(l) - base) + static_cast<std::size_t>(r.n_rows) * r.k_row_bytes();
    const std::size_t v_end = static_cast<std::size_t>(rec.v_rows(l) - base) + static_cast<std::size_t>(r.n_rows) * r.v_row_bytes();
    if (k_end > size - 8 || v_end > size - 8) return "layer " + std::to_string(l) + "'s rows reach past the record";
    // Completeness, position by position, within a bounded walk: a query at
    // L needs the sinks and the window (flat: everything below L; chunked,
    // section 9: its chunk, from K * floor(L / K)).
    // A State layer (section 9) needs the state after L - 1 and holds at
    // most D; a Shared layer needs nothing of its own.
    const bool ring = r.policy.kind == LayerPolicy::Kind::Ring;
    const bool chunked = r.policy.kind == LayerPolicy::Kind::Chunked && r.policy.window >= 1;
    const bool state = r.policy.kind == LayerPolicy::Kind::State;
    const std::int64_t L = s.length;
    if (r.policy.kind == LayerPolicy::Kind::Shared && r.n_rows != 0) return "a Shared layer carries rows";
    if (state && r.n_rows > r.policy.slots) return "a State layer carries more than D states";
    const std::int64_t sinks = ring ? (r.policy.sinks < L ? r.policy.sinks : L) : 0;
    const std::int64_t wb = ring      ? (L - r.policy.window + 1 > 0 ? L - r.policy.window + 1 : 0)
                            : chunked ? L - L % r.policy.window
                            : state   ? (L > 0 ? L - 1 : 0)
                            : r.policy.kind == LayerPolicy::Kind::Shared ? L
                                                                         : 0;
    const std::int64_t ranges[2][2] = {{0, sinks}, {wb, L}};
    long walked = 0;
    for (const auto& range : ranges)
      for (std::int64_t p = range[0]; p < range[1] && walked < 4096; ++p, ++walked)
        if (vis.visible(static_cast<int>(p)) && !carries(r, static_cast<int>(p)))
          return "layer " + std::to_string(l) + " lacks position " + std::to_string(p) + " a query at " +
                 std::to_string(L) + " needs, yet parse accepted it";
    if (L <= 4096) {
      int n = 0;
      for (int p = 0; p < L; ++p) n += vis.visible(p) && carries(r, p);
      if (n != r.n_rows) return "layer " + std::to_string(l) + " n_rows disagrees with its bounds";
    }
  }
  return "";
}

// The record row of position p in layer r (-1: not carried).
inline int record_row(const RecordView& rec, const RecordLayer& r, int p) {
  const Visibility vis{rec};
  if (!vis.visible(p) || !carries(r, p)) return -1;
  int j = 0;
  for (int q = 0; q < p; ++q) j += vis.visible(q) && carries(r, q);
  return j;
}

// Compares a read row (position p, K bytes k, V bytes v) with the record's.
inline std::string same_row(const RecordView& rec, int l, std::int64_t p, const unsigned char* k, const unsigned char* v) {
  const RecordLayer r = rec.layer(l);
  if (p >= rec.sequence().length) return "";  // the step's own position
  const int j = record_row(rec, r, static_cast<int>(p));
  if (j < 0) return "layer " + std::to_string(l) + " reads position " + std::to_string(p) + ", which the record does not carry";
  if (std::memcmp(k, rec.k_rows(l) + static_cast<std::size_t>(j) * r.k_row_bytes(), r.k_row_bytes()) != 0 ||
      std::memcmp(v, rec.v_rows(l) + static_cast<std::size_t>(j) * r.v_row_bytes(), r.v_row_bytes()) != 0)
    return "layer " + std::to_string(l) + " position " + std::to_string(p) + " reads other bytes than the record's";
  if (coverage() != nullptr) ++coverage()->rows_checked;
  return "";
}

inline std::string into_sequence_cache(const RecordView& rec, const void* data, std::size_t size) {
  auto cache = std::move(kvcore::SequenceCache::create(destination(1))).get();
  auto pool = std::move(kvcore::KVPool::create(*cache, kvcore::DType::Float16)).get();
  const kvcore::Status st = kvcore::import_record(data, size, *cache, pool);
  if (!st.ok()) {
    if (coverage() != nullptr) ++coverage()->refused_import;
    return cache->length() == 0 ? "" : "a refused import into a SequenceCache changed its length";
  }
  if (coverage() != nullptr) ++coverage()->imported_seq;
  if (cache->length() != rec.sequence().length) return "the imported length differs";
  if (cache->length() >= cache->capacity()) return "";
  auto step = cache->begin_step(1);
  if (!step.ok()) return std::string("a step after the import was refused: ") + step.message().c_str();
  for (int l = 0; l < cache->n_layers(); ++l) {
    const kvcore::SeqStepPlan plan = *cache->plan(l, *step);
    const RecordLayer r = rec.layer(l);
    std::vector<unsigned char> k(r.k_row_bytes()), v(r.v_row_bytes());
    if (!pool.write(l, plan, k.data(), k.size(), v.data(), v.size()).ok()) return "writing the step failed";
    std::vector<unsigned char> rk(r.k_row_bytes() * static_cast<std::size_t>(plan.read_len()));
    std::vector<unsigned char> rv(r.v_row_bytes() * static_cast<std::size_t>(plan.read_len()));
    const kvcore::Status g = pool.gather(l, plan, rk.data(), rk.size(), rv.data(), rv.size());
    if (!g.ok()) return std::string("gather after the import: ") + g.message().c_str();
    std::size_t i = 0;
    for (int run = 0; run < plan.n_read; ++run)
      for (int j = 0; j < plan.read[run].len; ++j, ++i) {
        const std::string e = same_row(rec, l, plan.read[run].pos + j, rk.data() + i * r.k_row_bytes(),
                                       rv.data() + i * r.v_row_bytes());
        if (!e.empty()) return "SequenceCache: " + e;
      }
  }
  return "";
}

// The kinds destination (mode bit 3): a SequenceCache of Ring, Flat, Shared
// and State layers (section 9), what make_record_corpus.py's kinds records
// export. After an accepted import the next step reads the record's rows, a
// Shared layer its source's, and a State layer starts from the record's last
// state; every rewind the cache then allows lands on a state the record
// carries, in its slot.
constexpr std::size_t kStateBytes = 64;  // make_record_corpus.py: 16 float32
inline CacheConfig kinds_destination() {
  CacheConfig cfg = destination(1);
  cfg.n_layers = 4;
  cfg.layers = {LayerConfig{LayerPolicy::ring(4, 1), 1, 2, 0}, LayerConfig{LayerPolicy::flat(), 1, 2, 0},
                LayerConfig{LayerPolicy::shared(0), 1, 2, 0}, LayerConfig{LayerPolicy::state(4), 0, 0, 0}};
  return cfg;
}

inline std::string into_kinds_cache(const RecordView& rec, const void* data, std::size_t size) {
  auto cache = std::move(kvcore::SequenceCache::create(kinds_destination())).get();
  const std::size_t slots[4] = {0, 0, 0, kStateBytes};
  auto pool = std::move(kvcore::KVPool::create(*cache, kvcore::DType::Float16, kvcore::PoolAllocator::heap(),
                                               kvcore::RingStorage::Compact, kvcore::StateSlotBytes{slots, 4}))
                  .get();
  const kvcore::Status st = kvcore::import_record(data, size, *cache, pool);
  if (!st.ok()) {
    if (coverage() != nullptr) ++coverage()->refused_import;
    return cache->length() == 0 ? "" : "a refused import into the kinds cache changed its length";
  }
  if (coverage() != nullptr) ++coverage()->imported_kinds;
  const int L = rec.sequence().length;
  if (cache->length() != L) return "the imported length differs";
  const RecordLayer sr = rec.layer(3);
  for (int n = 1; n <= L; ++n) {  // a held state is the record's, in slot (n - 1) mod D
    if (!cache->can_rewind(n)) continue;
    if (n - 1 < sr.held_from) return "the kinds cache allows rewind(" + std::to_string(n) + "), a state the record lacks";
    const unsigned char* slot = *pool.state_slot(3, (n - 1) % sr.policy.slots);
    if (std::memcmp(slot, rec.k_rows(3) + static_cast<std::size_t>(n - 1 - sr.held_from) * kStateBytes, kStateBytes) != 0)
      return "the state after " + std::to_string(n - 1) + " differs from the record's";
    if (coverage() != nullptr) ++coverage()->rows_checked;
  }
  if (L >= cache->capacity()) return "";
  auto step = cache->begin_step(1);
  if (!step.ok()) return std::string("a step after the import was refused: ") + step.message().c_str();
  for (int l = 0; l < 3; ++l) {
    const kvcore::SeqStepPlan plan = *cache->plan(l, *step);
    const int from = l == 2 ? 0 : l;  // the Shared layer reads its source's rows
    const RecordLayer r = rec.layer(from);
    std::vector<unsigned char> k(r.k_row_bytes()), v(r.v_row_bytes());
    if (l != 2 && !pool.write(l, plan, k.data(), k.size(), v.data(), v.size()).ok()) return "writing the step failed";
    std::vector<unsigned char> rk(r.k_row_bytes() * static_cast<std::size_t>(plan.read_len()));
    std::vector<unsigned char> rv(r.v_row_bytes() * static_cast<std::size_t>(plan.read_len()));
    if (!pool.gather(l, plan, rk.data(), rk.size(), rv.data(), rv.size()).ok()) return "gather after the import failed";
    std::size_t i = 0;
    for (int run = 0; run < plan.n_read; ++run)
      for (int j = 0; j < plan.read[run].len; ++j, ++i) {
        const std::string e = same_row(rec, from, plan.read[run].pos + j, rk.data() + i * r.k_row_bytes(),
                                       rv.data() + i * r.v_row_bytes());
        if (!e.empty()) return "kinds cache layer " + std::to_string(l) + ": " + e;
      }
  }
  std::vector<unsigned char> state(kStateBytes, 0xEE);
  if (!pool.read_state(3, *cache->plan(3, *step), state.data(), state.size()).ok()) return "read_state failed";
  const std::vector<unsigned char> want =
      L == 0 ? std::vector<unsigned char>(kStateBytes, 0)
             : std::vector<unsigned char>(rec.k_rows(3) + static_cast<std::size_t>(sr.n_rows - 1) * kStateBytes,
                                          rec.k_rows(3) + static_cast<std::size_t>(sr.n_rows) * kStateBytes);
  if (state != want) return "the step after the import starts from another state than the record's last";
  return "";
}

inline std::string into_batch_cache(const RecordView& rec, const void* data, std::size_t size, int block_size) {
  auto cache = std::move(BatchCache::create(destination(block_size))).get();
  auto pool = std::move(kvcore::PagedKVPool::create(*cache, kvcore::DType::Float16)).get();
  int free[8];
  for (int g = 0; g < cache->n_groups(); ++g) free[g] = *cache->free_blocks(g);
  const kvcore::Status st = kvcore::import_record(data, size, *cache, pool, 1);
  if (!st.ok()) {
    if (coverage() != nullptr) ++coverage()->refused_import;
    if (cache->sequence(1)->active) return "a refused import activated the sequence";
    for (int g = 0; g < cache->n_groups(); ++g)
      if (*cache->free_blocks(g) != free[g]) return "a refused import took blocks";
    return "";
  }
  if (coverage() != nullptr) ++coverage()->imported_batch;
  if (cache->sequence(1)->length != rec.sequence().length) return "the imported length differs";
  if (rec.sequence().length >= cache->capacity()) return "";
  const kvcore::StepEntry entry{1, 1, nullptr};
  auto step = cache->begin_step(&entry, 1);
  if (!step.ok()) return "";  // too few blocks for the step: an admission question, not the record's
  const kvcore::BatchStepPlan plan = *cache->plan(*step);
  for (int l = 0; l < cache->n_layers(); ++l) {
    const RecordLayer r = rec.layer(l);
    std::vector<unsigned char> k(r.k_row_bytes()), v(r.v_row_bytes());
    if (!pool.update(l, plan, k.data(), k.size(), v.data(), v.size()).ok()) return "writing the step failed";
    auto n = pool.gather_rows(l, plan, 0);
    if (!n.ok()) return std::string("gather after the import: ") + n.message().c_str();
    std::vector<unsigned char> rk(r.k_row_bytes() * static_cast<std::size_t>(*n));
    std::vector<unsigned char> rv(r.v_row_bytes() * static_cast<std::size_t>(*n));
    std::vector<std::int64_t> pos(static_cast<std::size_t>(*n));
    auto g = pool.gather(l, plan, 0, rk.data(), rk.size(), rv.data(), rv.size(), pos.data(), pos.size());
    if (!g.ok()) return std::string("gather after the import: ") + g.message().c_str();
    for (std::size_t i = 0; i < pos.size(); ++i) {
      const std::string e =
          same_row(rec, l, pos[i], rk.data() + i * r.k_row_bytes(), rv.data() + i * r.v_row_bytes());
      if (!e.empty()) return "BatchCache: " + e;
    }
  }
  return "";
}

/// Runs one input; "" when every property held, else what broke.
inline std::string run_record_fuzz(const std::uint8_t* data, std::size_t size) {
  if (coverage() != nullptr) ++coverage()->inputs;
  if (size == 0) return "";
  const std::uint8_t mode = data[0];
  const std::size_t n = size - 1;
  std::vector<std::uint64_t> words((n + 7) / 8 + 1);
  unsigned char* bytes = reinterpret_cast<unsigned char*>(words.data());
  if (n > 0) std::memcpy(bytes, data + 1, n);
  if ((mode & 1) != 0 && n >= 72) kvcore::record_detail::put_u64(bytes + n - 8, kvcore::record_checksum(bytes, n - 8));
  auto parsed = RecordView::parse(bytes, n);
  if (!parsed.ok()) {
    if (coverage() != nullptr) ++coverage()->refused_parse;
    return "";
  }
  if (coverage() != nullptr) ++coverage()->parsed;
  const RecordView& rec = *parsed;
  std::string err = check_parsed(rec, n);
  if (!err.empty()) return err;
  if ((mode & 8) != 0) return into_kinds_cache(rec, bytes, n);
  const int dest = (mode >> 1) & 3;
  if (dest == 0) return into_sequence_cache(rec, bytes, n);
  return into_batch_cache(rec, bytes, n, dest == 1 ? 1 : dest == 2 ? 2 : 4);
}

}  // namespace kvcore_record_fuzz

#ifndef KVCORE_FUZZ_NO_ENTRY_POINT
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string err = kvcore_record_fuzz::run_record_fuzz(data, size);
  if (!err.empty()) {
    std::fprintf(stderr, "record_fuzzer: %s\n", err.c_str());
    std::abort();
  }
  return 0;
}
#endif
