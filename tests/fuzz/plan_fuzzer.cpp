// libFuzzer harness: bytes -> a CacheConfig and a sequence of operations on a
// SequenceCache and a KVPool. Every plan is checked against the contract
// (tests/cpp/reference.h), every row the pool returns against the bytes written
// for the position it claims, every refused call against the error the rules
// give, and a refused call must change nothing. Nothing may crash or trip a
// sanitizer.
//
// The first byte picks one of two regimes:
//  - small: capacity <= 160; the simulated pools of reference.h judge plans,
//    reads and can_rewind exactly, and a real KVPool (growing through a failing
//    allocator, or in an arena; compact or mirrored ring rows) holds rows tagged
//    by (layer, position, write);
//  - small with a layer of section 9's new kinds (Chunked, Shared, State): a
//    layer's policy byte >= 253 (which older inputs used for a ring); the whole
//    run is then the brute-force oracle of tests/cpp/layer_kinds_reference.h
//    (chains with and without verify, trees, partial commits, rewinds, clears),
//    its choices read from the input;
//  - huge: capacity, window, sinks, max_step and T up to INT_MAX; plans are
//    checked in interval form (O(1) per run), and the pool only takes writes
//    whose blocks the allocator grants (it refuses anything over 1 MiB).
//
// Fuzz build: tests/fuzz/CMakeLists.txt (clang, -fsanitize=fuzzer,address,undefined).
// The same source compiles into the gtest binary (tests/cpp/fuzz_replay_test.cpp),
// which replays tests/fuzz/corpus; there run_plan_fuzz() returns the failure
// instead of aborting.
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_bytes.h"
#include "fuzz_harness.h"
#include "kvcore/pool/kv_pool.h"
#include "kvcore/core/sequence_cache.h"
#include "../cpp/reference.h"
#include "../cpp/layer_kinds_reference.h"

namespace kvcore_fuzz {

using kvcore::CacheConfig;
using kvcore::DType;
using kvcore::Error;
using kvcore::KVPool;
using kvcore::KVViews;
using kvcore::LayerConfig;
using kvcore::LayerPolicy;
using kvcore::PoolLayer;
using kvcore::Run;
using kvcore::SeqStepPlan;
using kvcore::SequenceCache;
using kvcore::Status;
using kvcore::Step;
using kvcore_test::LayerModel;
using kvcore_test::PoolSim;

/// What the inputs went through, summed (the replay test proves the corpus
/// reaches every interesting path).
struct Coverage {
  long inputs = 0;
  long invalid_configs = 0;
  long small_caches = 0;
  long huge_caches = 0;
  long arena_pools = 0;
  long mirrored_pools = 0;  // RingStorage::Mirrored with a ring layer that wraps
  long steps_begun = 0;
  long steps_committed = 0;
  long rewinds_accepted = 0;
  long rewinds_refused_state = 0;
  long rewinds_refused_range = 0;
  long capacity_refusals = 0;
  long clears = 0;
  long rows_checked = 0;  // pool rows whose bytes were checked against their tag
  long allocation_failures = 0;
  long aliasing_writes = 0;  // writes whose input was the pool's own rows
  long bad_pool_calls = 0;
  long huge_plans = 0;  // plans of steps ending above 2^30
  long kinds_caches = 0;    // small caches with a Chunked, Shared or State layer (section 9)
  long huge_kinds_caches = 0;  // near-INT_MAX ones (a spoiled kind byte), checked without a row store
  long kinds_verify_steps = 0;
  long kinds_trees = 0;
  long kinds_rewinds = 0;   // accepted and refused
};

/// When set, every input adds to it (the replay test reads it).
inline Coverage*& coverage() { return kvcore_fuzz_input::coverage_slot<Coverage>(); }

namespace detail {

// __extension__: -Wpedantic (the gtest build) knows no __int128.
__extension__ typedef unsigned __int128 u128;

constexpr int kSmallCapacity = 160;
constexpr std::size_t kBlockLimit = std::size_t{1} << 20;

using Bytes = kvcore_fuzz_input::Bytes;

// The ints Bytes::edgy() favours: where the arithmetic of sizes and positions breaks.
constexpr int kEdges[kvcore_fuzz_input::Bytes::kEdgeCount] = {
    0,       1,       -1,          2,           INT_MAX,      INT_MAX - 1, INT_MIN, INT_MIN + 1,
    1 << 30, (1 << 30) + 1, (1 << 30) - 1, 1 << 16, -(1 << 16), 511, 512, 513};

// A PoolAllocator that refuses blocks over a limit, can be told to fail the
// next allocation, and counts live blocks (all must be back when the pool dies).
struct TestAllocator {
  bool fail_next = false;
  std::size_t limit = kBlockLimit;
  long live = 0;

  static void* allocate(void* self, std::size_t bytes) noexcept {
    auto* a = static_cast<TestAllocator*>(self);
    if (a->fail_next || bytes > a->limit) {
      a->fail_next = false;
      return nullptr;
    }
    void* p = std::malloc(bytes == 0 ? 1 : bytes);
    if (p != nullptr) ++a->live;
    return p;
  }
  static void release(void* self, void* block) noexcept {
    --static_cast<TestAllocator*>(self)->live;
    std::free(block);
  }
  kvcore::PoolAllocator get() {
    kvcore::PoolAllocator out;
    out.context = this;
    out.allocate = &TestAllocator::allocate;
    out.release = &TestAllocator::release;
    return out;
  }
};

std::string str(long long v) { return std::to_string(v); }

std::string outcome(const Status& s) {
  return s.ok() ? std::string("Ok") : std::string(kvcore::to_string(s.code())) + " (" + s.message().c_str() + ")";
}

// The config rules of DESIGN.md section 2 (and config.h's initial_capacity),
// stated independently of validate().
// Section 9 adds: Chunked(K >= 1, no sinks); Shared(source) reads an earlier
// layer that holds K/V, with its shape, and is never broadcast; State(slots >=
// 1) holds no K/V rows (shape 0). A field a kind does not use is 0.
bool valid_by_rules(const CacheConfig& cfg) {
  using Kind = LayerPolicy::Kind;
  if (cfg.capacity < 1 || cfg.n_layers < 1 || cfg.initial_capacity < 1) return false;
  if (cfg.n_layers > 65536) return false;  // CacheConfig::kMaxLayers
  if (cfg.layers.size() != 1 && cfg.layers.size() != static_cast<std::size_t>(cfg.n_layers)) return false;
  if (cfg.max_step != 0 && (cfg.max_step < 1 || cfg.max_step > cfg.capacity)) return false;
  for (std::size_t i = 0; i < cfg.layers.size(); ++i) {
    const LayerConfig& l = cfg.layers[i];
    const LayerPolicy& p = l.policy;
    if (p.kind == Kind::Flat) {
      if (p.window != 0 || p.sinks != 0) return false;
    } else if (p.kind == Kind::Ring) {
      if (p.window < 1 || p.sinks < 0) return false;
    } else if (p.kind == Kind::Chunked) {
      if (p.window < 1 || p.sinks != 0) return false;
    } else if (p.kind == Kind::Shared || p.kind == Kind::State) {
      if (p.window != 0 || p.sinks != 0) return false;
    } else {
      return false;
    }
    if (p.kind != Kind::Shared && p.source != 0) return false;
    if (p.kind != Kind::State && p.slots != 0) return false;
    if (p.kind == Kind::State) {
      if (p.slots < 1 || l.n_kv_heads != 0 || l.head_dim != 0 || l.v_head_dim != 0) return false;
      continue;
    }
    if (p.kind == Kind::Shared) {
      if (cfg.layers.size() == 1 || p.source < 0 || static_cast<std::size_t>(p.source) >= i) return false;
      const LayerConfig& src = cfg.layers[static_cast<std::size_t>(p.source)];
      if (src.policy.kind != Kind::Flat && src.policy.kind != Kind::Ring && src.policy.kind != Kind::Chunked)
        return false;
      const int v = l.v_head_dim == 0 ? l.head_dim : l.v_head_dim;
      const int src_v = src.v_head_dim == 0 ? src.head_dim : src.v_head_dim;
      if (l.n_kv_heads != src.n_kv_heads || l.head_dim != src.head_dim || v != src_v) return false;
    }
    if (l.n_kv_heads < 1 || l.head_dim < 1 || l.v_head_dim < 0) return false;
  }
  return true;
}

// Does cfg have a layer of section 9's new kinds?
bool has_new_kinds(const CacheConfig& cfg) {
  for (const LayerConfig& l : cfg.layers)
    if (l.policy.kind != LayerPolicy::Kind::Flat && l.policy.kind != LayerPolicy::Kind::Ring) return true;
  return false;
}

const LayerConfig& layer_config(const CacheConfig& cfg, int l) {
  return cfg.layers.size() == 1 ? cfg.layers[0] : cfg.layers[static_cast<std::size_t>(l)];
}

// The bytes a row holds after the write of `version` to (layer, position): a
// hash, so a row holding any other write shows.
void tag(unsigned char* out, std::size_t n, int layer, int position, std::uint64_t version, int which) {
  std::uint64_t state = (static_cast<std::uint64_t>(layer) << 48) ^ (static_cast<std::uint64_t>(position) << 16) ^
                        (version << 2) ^ static_cast<std::uint64_t>(which);
  for (std::size_t i = 0; i < n; i += 8) {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    for (std::size_t j = 0; j < 8 && i + j < n; ++j) out[i + j] = static_cast<unsigned char>(z >> (8 * j));
  }
}

// Where the plan's runs end and how many rows they name.
struct Extent {
  std::int64_t rows = 0;
  std::int64_t end_row = 0;
};
Extent extent_of(const Run* runs, int n) {
  Extent e;
  for (int i = 0; i < n; ++i) {
    e.rows += runs[i].len;
    const std::int64_t end = static_cast<std::int64_t>(runs[i].row) + runs[i].len;
    if (end > e.end_row) e.end_row = end;
  }
  return e;
}

// Interval form of the plan contract, for any position up to INT_MAX: write
// covers [P, P+T) in order, read covers exactly the needed set in increasing
// order, every run sits where row(p) says at both ends (with rows in range,
// that rules out a wrap inside a run), and no two adjacent runs could merge.
std::string check_plan_intervals(const LayerModel& m, const SeqStepPlan& plan, std::int64_t P, std::int64_t T) {
  const std::string where = " in plan(P " + str(P) + ", T " + str(T) + ") = " + kvcore_test::describe(plan);
  if (plan.n_write < 1 || plan.n_write > SeqStepPlan::kMaxWriteRuns) return "n_write" + where;
  if (plan.n_read < 1 || plan.n_read > (m.ring ? SeqStepPlan::kMaxReadRuns : 1)) return "n_read" + where;
  auto check_runs = [&](const Run* runs, int n, const char* what) -> std::string {
    for (int i = 0; i < n; ++i) {
      const Run& r = runs[i];
      const std::int64_t last = static_cast<std::int64_t>(r.pos) + r.len - 1;
      if (r.len < 1 || r.row < 0 || r.pos < 0 || static_cast<std::int64_t>(r.row) + r.len > m.rows())
        return std::string(what) + " run out of range" + where;
      if (m.row(r.pos) != r.row || m.row(last) != static_cast<std::int64_t>(r.row) + r.len - 1)
        return std::string(what) + " run not where row(p) puts it" + where;
      if (i > 0) {
        const Run& prev = runs[i - 1];
        const std::int64_t prev_end_pos = static_cast<std::int64_t>(prev.pos) + prev.len;
        const std::int64_t prev_end_row = static_cast<std::int64_t>(prev.row) + prev.len;
        if (prev_end_pos > r.pos) return std::string(what) + " runs overlap or go backwards" + where;
        if (prev_end_row == r.row && prev_end_pos == r.pos) return std::string(what) + " runs should merge" + where;
      }
    }
    return "";
  };
  std::string err = check_runs(plan.write, plan.n_write, "write");
  if (err.empty()) err = check_runs(plan.read, plan.n_read, "read");
  if (!err.empty()) return err;
  std::int64_t next = P;
  for (int i = 0; i < plan.n_write; ++i) {
    if (plan.write[i].pos != next) return "write runs do not continue" + where;
    next += plan.write[i].len;
  }
  if (next != P + T) return "write runs do not end at P + T" + where;
  // Needed set: Flat [0, P+T); Ring [0, min(S, P+T)) u [max(0, P-W+1), P+T).
  std::int64_t want[2][2];
  int n_want = 0;
  const std::int64_t end = P + T;
  const std::int64_t sink_end = m.sinks < end ? m.sinks : end;
  const std::int64_t window_begin = P - m.window + 1 > 0 ? P - m.window + 1 : 0;
  if (!m.ring || window_begin <= sink_end) {
    want[n_want][0] = 0, want[n_want++][1] = end;
  } else {
    if (sink_end > 0) want[n_want][0] = 0, want[n_want++][1] = sink_end;
    want[n_want][0] = window_begin, want[n_want++][1] = end;
  }
  std::int64_t got[SeqStepPlan::kMaxReadRuns][2];
  int n_got = 0;
  for (int i = 0; i < plan.n_read; ++i) {
    const std::int64_t b = plan.read[i].pos, e = b + plan.read[i].len;
    if (n_got > 0 && got[n_got - 1][1] == b) {
      got[n_got - 1][1] = e;
    } else {
      got[n_got][0] = b, got[n_got++][1] = e;
    }
  }
  bool same = n_got == n_want;
  for (int i = 0; same && i < n_got; ++i) same = got[i][0] == want[i][0] && got[i][1] == want[i][1];
  if (!same) return "read positions are not the needed set" + where;
  return "";
}

// --- one run of the harness ------------------------------------------------------

#define FUZZ_REQUIRE(cond, what)                                                        \
  do {                                                                                  \
    if (!(cond)) return "op " + str(op) + " (" + last_op + "): " + std::string(what); \
  } while (0)

class Harness {
 public:
  explicit Harness(Bytes& in) : in_(in) {}

  std::string run() {
    huge_ = in_.u8() % 4 == 3;
    CacheConfig cfg = huge_ ? huge_config() : small_config();
    const DType dtype = pick_dtype();
    const std::uint8_t storage = in_.u8() % 8;
    ring_storage_ = storage < 4 ? kvcore::RingStorage::Compact
                    : storage < 7 ? kvcore::RingStorage::Mirrored
                                  : static_cast<kvcore::RingStorage>(in_.percent(50) ? 2 : -1);

    auto created = SequenceCache::create(cfg);
    const bool valid = valid_by_rules(cfg);
    auto required = KVPool::required_bytes(cfg, dtype, ring_storage_);
    const bool dtype_ok = kvcore::element_size(dtype) != 0 && (ring_storage_ == kvcore::RingStorage::Compact ||
                                                               ring_storage_ == kvcore::RingStorage::Mirrored);
    if (!valid) {
      if (created.ok() || created.error() != Error::InvalidArgument || created.message().c_str()[0] == '\0')
        return "config breaking a rule: create gave " + outcome(kvcore::internal::to_status(created)) + " for " +
               kvcore_test::describe(cfg);
      if (required.error() != Error::InvalidArgument)
        return "config breaking a rule: required_bytes did not refuse it";
      bump(&Coverage::invalid_configs);
      return "";
    }
    if (!created.ok()) return "valid config refused: " + outcome(created.status()) + " for " + kvcore_test::describe(cfg);
    if (has_new_kinds(cfg)) return huge_ ? run_huge_kinds(cfg, *created) : run_kinds(cfg);
    cache_ = std::move(created).get();
    cfg_ = cfg;
    C_ = cache_->max_step();
    if (C_ != kvcore_test::design_max_step(cfg)) return "max_step " + str(C_) + " for " + kvcore_test::describe(cfg);
    for (int l = 0; l < cfg.n_layers; ++l) {
      models_.push_back(LayerModel::of(cfg, l));
      auto rows = cache_->rows(l);
      if (!rows.ok() || *rows != models_.back().rows()) return "rows of layer " + str(l);
    }
    std::string err = check_required_bytes(required, dtype, dtype_ok);
    if (!err.empty()) return err;
    if (!dtype_ok) return "";

    if (huge_) {
      bump(&Coverage::huge_caches);
      err = make_pool(dtype, /*allow_arena=*/false);
      if (err.empty()) err = run_huge();
    } else {
      bump(&Coverage::small_caches);
      sim_.reset(new PoolSim(cfg));
      committed_.assign(static_cast<std::size_t>(cfg.capacity), 0);
      err = make_pool(dtype, /*allow_arena=*/true);
      if (err.empty()) err = run_small();
    }
    pool_.reset();
    if (err.empty() && allocator_.live != 0) err = "the pool left " + str(allocator_.live) + " blocks allocated";
    return err;
  }

 private:
  static void bump(long Coverage::*field) {
    if (coverage() != nullptr) ++(coverage()->*field);
  }

  // The oracle's choices, read from the input.
  struct InputRand {
    Bytes* in;
    int uniform(int lo, int hi) { return in->in(lo, hi); }
    bool percent(int p) { return in->percent(p); }
  };

  // Section 9's kinds: the brute-force oracle runs the cache (its own store
  // of rows and state slots stands for the pool).
  std::string run_kinds(const CacheConfig& given) {
    bump(&Coverage::kinds_caches);
    // The oracle reads one entry per layer: a broadcast entry, spelled out.
    const CacheConfig cfg = given.layers.size() == 1 ? broadcast(given) : given;
    InputRand rand{&in_};
    kvcore_test::kinds::KindsCoverage cov;
    kvcore_test::kinds::KindsCase<InputRand> one(cfg, rand, cov);
    const std::string err = one.run();
    if (coverage() != nullptr) {
      coverage()->kinds_verify_steps += cov.verify_chains;
      coverage()->kinds_trees += cov.trees;
      coverage()->kinds_rewinds += cov.rewinds_ok + cov.rewinds_refused;
    }
    return err.empty() ? err : err + " for " + kvcore_test::kinds::describe_kinds(cfg);
  }

  // A near-INT_MAX config with a section-9 kind (a spoiled kind byte can make
  // one valid): the oracle's per-row store would not fit, so the checks are
  // the ones integers allow: each layer's rows by the contract, and two steps
  // (a longest one from 0, then one token) whose runs stay inside the rows
  // and write exactly the step's positions.
  std::string run_huge_kinds(const CacheConfig& given, std::unique_ptr<SequenceCache>& cache) {
    bump(&Coverage::huge_kinds_caches);
    const CacheConfig cfg = given.layers.size() == 1 ? broadcast(given) : given;
    const int C = cache->max_step();
    for (int l = 0; l < cfg.n_layers; ++l) {
      const LayerPolicy& p = cfg.layers[static_cast<std::size_t>(l)].policy;
      if (*cache->rows(l) != kvcore_test::kinds::contract_rows(p, C, cfg.capacity))
        return "huge kinds: layer " + str(l) + " rows " + str(*cache->rows(l)) + " for " +
               kvcore_test::kinds::describe_kinds(cfg);
    }
    for (const int T : {C, 1}) {
      if (static_cast<std::int64_t>(cache->length()) + T > cfg.capacity) break;
      const int P = cache->length();
      auto step = cache->begin_step(T);
      if (!step.ok()) return "huge kinds: begin_step(" + str(T) + ") at " + str(P) + ": " + outcome(step.status());
      for (int l = 0; l < cfg.n_layers; ++l) {
        const LayerPolicy& p = cfg.layers[static_cast<std::size_t>(l)].policy;
        const SeqStepPlan plan = *cache->plan(l, *step);
        const int rows = p.kind == LayerPolicy::Kind::Shared ? *cache->rows(p.source) : *cache->rows(l);
        std::int64_t written = 0;
        for (int r = 0; r < plan.n_write; ++r) {
          const kvcore::Run& w = plan.write[r];
          if (w.row < 0 || w.len < 1 || static_cast<std::int64_t>(w.row) + w.len > rows || w.pos < P ||
              static_cast<std::int64_t>(w.pos) + w.len > static_cast<std::int64_t>(P) + T)
            return "huge kinds: layer " + str(l) + " writes outside its rows or its step";
          written += w.len;
        }
        const std::int64_t want = p.kind == LayerPolicy::Kind::Shared ? 0 : p.kind == LayerPolicy::Kind::State ? 1 : T;
        if (written != want) return "huge kinds: layer " + str(l) + " writes " + str(static_cast<long long>(written)) + " rows";
        for (int r = 0; r < plan.n_read; ++r) {
          const kvcore::Run& rd = plan.read[r];
          if (rd.row < 0 || rd.len < 1 || static_cast<std::int64_t>(rd.row) + rd.len > rows || rd.pos < 0 ||
              static_cast<std::int64_t>(rd.pos) + rd.len > static_cast<std::int64_t>(P) + T)
            return "huge kinds: layer " + str(l) + " reads outside its rows or the length";
        }
      }
      const Status c = cache->commit(*step);
      if (!c.ok() || cache->length() != P + T) return "huge kinds: commit " + outcome(c);
    }
    return "";
  }

  static CacheConfig broadcast(const CacheConfig& given) {
    CacheConfig cfg = given;
    cfg.layers.assign(static_cast<std::size_t>(cfg.n_layers), given.layers[0]);
    return cfg;
  }

  // --- configs ----------------------------------------------------------------

  // Small values, with a chance of breaking each rule on purpose.
  CacheConfig small_config() {
    CacheConfig cfg;
    const bool spoil = in_.percent(12);
    cfg.capacity = in_.in(1, kSmallCapacity);
    const int max_c = cfg.capacity < 12 ? cfg.capacity : 12;
    cfg.max_step = (cfg.capacity <= 12 && in_.percent(20)) ? 0 : in_.in(1, max_c);
    cfg.n_layers = in_.in(1, 6);
    cfg.initial_capacity = in_.in(1, 24);
    const int entries = in_.percent(20) ? 1 : cfg.n_layers;
    for (int i = 0; i < entries; ++i) {
      LayerConfig l;
      // The policy byte: % 100 below 30 flat, else a ring; 253, 254, 255 (section
      // 9, appended: older inputs read them as rings) chunked, shared, state.
      const std::uint8_t kind = in_.u8();
      if (kind >= 253) {
        const int what = kind - 253;  // 0 chunked, 1 shared, 2 state
        if (what == 1 && i > 0) {
          l.policy = LayerPolicy::shared(in_.in(0, i - 1));
        } else if (what == 2) {
          l.policy = LayerPolicy::state(in_.in(1, 8));
        } else {
          l.policy = LayerPolicy::chunked(in_.in(1, 24));
        }
      } else if (kind % 100 >= 30) {
        // Locals: the order in which call arguments are evaluated is unspecified,
        // and gcc (the corpus replay) and clang (the fuzzer) would read differently.
        const int window = in_.in(1, 24);
        const int sinks = in_.percent(50) ? 0 : in_.in(1, 6);
        l.policy = LayerPolicy::ring(window, sinks);
      }
      l.n_kv_heads = in_.in(1, 2);
      l.head_dim = in_.in(2, 6);
      l.v_head_dim = in_.percent(70) ? 0 : in_.in(1, 6);
      if (l.policy.kind == LayerPolicy::Kind::State) l.n_kv_heads = l.head_dim = l.v_head_dim = 0;
      if (l.policy.kind == LayerPolicy::Kind::Shared) {  // its source's shape (a spoil may break the rest)
        const LayerConfig& src = cfg.layers[static_cast<std::size_t>(l.policy.source)];
        l.n_kv_heads = src.n_kv_heads, l.head_dim = src.head_dim, l.v_head_dim = src.v_head_dim;
      }
      cfg.layers.push_back(l);
    }
    if (spoil) spoil_one_rule(cfg);
    return cfg;
  }

  void spoil_one_rule(CacheConfig& cfg) {
    LayerConfig& l = cfg.layers[static_cast<std::size_t>(in_.in(0, static_cast<int>(cfg.layers.size()) - 1))];
    switch (in_.in(0, 12)) {
      case 0: cfg.capacity = -in_.in(0, 3); break;
      case 1: cfg.n_layers = in_.percent(50) ? -in_.in(0, 2) : in_.in(65537, INT_MAX); break;
      case 2: {
        const LayerConfig first = cfg.layers[0];
        cfg.layers.resize(cfg.layers.size() + 1 + (cfg.layers.size() == 1 ? 1 : 0), first);
        break;
      }
      case 3: cfg.max_step = in_.percent(50) || cfg.capacity == INT_MAX ? -1 : cfg.capacity + 1; break;
      case 4: cfg.initial_capacity = -in_.in(0, 3); break;
      case 5: l.policy = LayerPolicy{LayerPolicy::Kind::Flat, in_.in(1, 4), 0, 0, 0}; break;
      case 6: l.policy = LayerPolicy{LayerPolicy::Kind::Flat, 0, in_.in(1, 4), 0, 0}; break;
      case 7: l.policy = LayerPolicy::ring(-in_.in(0, 3), 0); break;
      case 8: l.policy = LayerPolicy::ring(4, -in_.in(1, 3)); break;
      case 9: l.policy.kind = static_cast<LayerPolicy::Kind>(in_.in(2, 255)); break;
      case 10: l.n_kv_heads = -in_.in(0, 3); break;
      case 11: l.head_dim = -in_.in(0, 3); break;
      default: l.v_head_dim = -in_.in(1, 3); break;
    }
  }

  // Sizes near INT_MAX: the 64-bit paths of the policies and the pool's
  // overflow checks.
  CacheConfig huge_config() {
    CacheConfig cfg;
    cfg.capacity = in_.percent(50) ? INT_MAX - in_.in(0, 3) : in_.in(1, INT_MAX);
    cfg.max_step = in_.percent(30) ? in_.in(1, 64) : in_.in(1, cfg.capacity);
    if (in_.percent(10)) cfg.max_step = 0;
    cfg.n_layers = in_.in(1, 4);
    cfg.initial_capacity = in_.in(1, 64);
    const int entries = in_.percent(30) ? 1 : cfg.n_layers;
    for (int i = 0; i < entries; ++i) {
      LayerConfig l;
      if (!in_.percent(25)) {
        const int window = in_.percent(40) ? in_.in(1, 64) : in_.in(1, INT_MAX);
        const int sinks = in_.percent(50) ? 0 : in_.percent(50) ? in_.in(1, 8) : in_.in(0, INT_MAX);
        l.policy = LayerPolicy::ring(window, sinks);
      }
      l.n_kv_heads = in_.percent(85) ? in_.in(1, 4) : in_.in(1, INT_MAX);
      l.head_dim = in_.percent(85) ? in_.in(1, 16) : in_.in(1, INT_MAX);
      l.v_head_dim = in_.percent(80) ? 0 : in_.in(0, INT_MAX);
      cfg.layers.push_back(l);
    }
    if (in_.percent(8)) spoil_one_rule(cfg);
    return cfg;
  }

  DType pick_dtype() {
    const int d = in_.in(0, 15);
    if (d == 15) return static_cast<DType>(in_.percent(50) ? 99 : -1);  // not a DType (5 and 6 are the quantized formats now)
    return static_cast<DType>(d % 5);
  }

  // --- the pool -----------------------------------------------------------------

  // required_bytes lies between the bytes of every row (a mirrored wrapping ring
  // without sinks repeats R - 1 of them) and that plus the layer table and alignment slack; or
  // the total overflows the address space.
  std::string check_required_bytes(const kvcore::Result<std::size_t>& required, DType dtype, bool dtype_ok) {
    if (!dtype_ok) {
      if (required.error() != Error::InvalidArgument) return "required_bytes accepted a bad dtype or ring storage";
      return "";
    }
    u128 rows_bytes = 0;
    const u128 size = kvcore::element_size(dtype);
    for (int l = 0; l < cfg_.n_layers; ++l) {
      const LayerConfig& lc = layer_config(cfg_, l);
      const LayerModel& m = models_[static_cast<std::size_t>(l)];
      const bool mirrored = ring_storage_ == kvcore::RingStorage::Mirrored && m.wraps() && m.sinks == 0;
      const u128 rows = static_cast<u128>(m.rows() + (mirrored ? m.ring_slots() - 1 : 0));
      const int v_dim = lc.v_head_dim == 0 ? lc.head_dim : lc.v_head_dim;
      rows_bytes += rows * size *
                    (static_cast<u128>(lc.n_kv_heads) * static_cast<u128>(lc.head_dim) +
                     static_cast<u128>(lc.n_kv_heads) * static_cast<u128>(v_dim));
    }
    const u128 slack = static_cast<u128>(cfg_.n_layers) * (sizeof(PoolLayer) + 2 * 64) + 2 * 64;
    const u128 max_bytes = static_cast<u128>(PTRDIFF_MAX);
    if (!required.ok()) {
      if (required.error() != Error::InvalidArgument || rows_bytes <= max_bytes - slack)
        return "required_bytes refused a pool of " + str(static_cast<long long>(rows_bytes < max_bytes ? rows_bytes : max_bytes)) +
               " bytes: " + outcome(required.status());
      return "";
    }
    if (*required < rows_bytes || *required > rows_bytes + slack)
      return "required_bytes = " + str(static_cast<long long>(*required)) + ", rows need " +
             str(static_cast<long long>(rows_bytes));
    return "";
  }

  std::string make_pool(DType dtype, bool allow_arena) {
    if (allow_arena && in_.percent(25)) {
      auto need = KVPool::required_bytes(cfg_, dtype, ring_storage_);
      if (!need.ok()) return "required_bytes of a small valid config: " + outcome(need.status());
      const std::size_t misalign = in_.in(0, 63);
      arena_.assign(*need + misalign, 0xA5);
      void* at = arena_.data() + misalign;
      auto null_arena = KVPool::in_arena(*cache_, dtype, nullptr, *need, ring_storage_);
      auto too_small = KVPool::in_arena(*cache_, dtype, at, *need - 1, ring_storage_);
      if (null_arena.error() != Error::InvalidArgument || too_small.error() != Error::InvalidArgument)
        return "in_arena accepted a null or too small arena";
      auto pool = KVPool::in_arena(*cache_, dtype, at, *need, ring_storage_);
      if (!pool.ok()) return "in_arena of required_bytes failed: " + outcome(pool.status());
      pool_.reset(new KVPool(std::move(pool).get()));
      bump(&Coverage::arena_pools);
      count_mirror();
      return "";
    }
    allocator_.fail_next = in_.percent(5);
    const bool failing = allocator_.fail_next;
    auto pool = KVPool::create(*cache_, dtype, allocator_.get(), ring_storage_);
    allocator_.fail_next = false;
    if (!pool.ok()) {
      // Overflowing shapes (huge configs) are InvalidArgument; blocks the
      // allocator refuses are MemoryAllocationFailed. Either leaves nothing behind.
      if (pool.error() != Error::InvalidArgument && pool.error() != Error::MemoryAllocationFailed)
        return "KVPool::create: " + outcome(pool.status());
      if (pool.error() == Error::MemoryAllocationFailed) bump(&Coverage::allocation_failures);
      if (!failing && pool.error() == Error::MemoryAllocationFailed && !huge_)
        return "KVPool::create of a small cache failed: " + outcome(pool.status());
      if (allocator_.live != 0) return "a failed KVPool::create kept " + str(allocator_.live) + " blocks";
      return "";
    }
    pool_.reset(new KVPool(std::move(pool).get()));
    count_mirror();
    return "";
  }

  std::size_t k_row(int l) const { return pool_->layer(l)->k_row_bytes; }
  std::size_t v_row(int l) const { return pool_->layer(l)->v_row_bytes; }

  // What a failed pool call must leave alone.
  struct PoolState {
    std::vector<int> allocated;
    std::size_t reserved = 0;
    bool operator==(const PoolState& o) const { return allocated == o.allocated && reserved == o.reserved; }
  };
  PoolState pool_state() const {
    PoolState s;
    for (int l = 0; l < pool_->n_layers(); ++l) s.allocated.push_back(pool_->layer(l)->allocated_rows);
    s.reserved = pool_->reserved_bytes();
    return s;
  }

  // Writes the begun step's rows of `layer`, tagged with the step's version.
  // The allocator may be told to fail first: then nothing may change, and the
  // write is repeated.
  std::string write_layer(int layer, const SeqStepPlan& plan) {
    const std::size_t T = static_cast<std::size_t>(plan.write_len());
    std::vector<unsigned char> k(T * k_row(layer)), v(T * v_row(layer));
    for (std::size_t j = 0; j < T; ++j) {
      const int p = step_.position + static_cast<int>(j);
      tag(k.data() + j * k_row(layer), k_row(layer), layer, p, step_version_, 0);
      tag(v.data() + j * v_row(layer), v_row(layer), layer, p, step_version_, 1);
    }
    if (in_.percent(10)) {
      const std::string err = write_from_the_pool(layer, plan);
      if (!err.empty()) return err;
    }
    if (!pool_->uses_arena() && in_.percent(8)) {
      const PoolState before = pool_state();
      allocator_.fail_next = true;
      const Status s = pool_->write(layer, plan, k.data(), k.size(), v.data(), v.size());
      const bool consumed = !allocator_.fail_next;  // the write tried to grow
      allocator_.fail_next = false;
      if (consumed) {
        if (s.code() != Error::MemoryAllocationFailed) return "write with a failing allocator: " + outcome(s);
        if (!(pool_state() == before)) return "a failed write changed the pool";
        bump(&Coverage::allocation_failures);
      } else if (!s.ok()) {
        return "write without growth failed: " + outcome(s);
      } else {
        return "";
      }
    }
    const Status s = pool_->write(layer, plan, k.data(), k.size(), v.data(), v.size());
    if (!s.ok()) return "write of layer " + str(layer) + ": " + outcome(s);
    return "";
  }

  // Writes the step's rows of `layer` from rows the pool already holds (the
  // input is a view of this very layer, possibly overlapping the rows written,
  // and the write may grow the layer and move them): the step's rows must then
  // hold the input as it was before the write, unless no order of a wrapped
  // write's two copies can keep the input intact (then nothing is written). The
  // caller writes the real rows next.
  std::string write_from_the_pool(int layer, const SeqStepPlan& plan) {
    const PoolLayer shape = *pool_->layer(layer);
    const int T = plan.write_len();
    if (shape.allocated_rows < T) return "";
    SeqStepPlan source;
    source.n_read = 1;
    source.read[0] = Run{in_.in(0, shape.allocated_rows - T), T, 0};
    auto views = pool_->views(layer, source);
    if (!views.ok()) return "views of grown rows: " + outcome(views.status());
    const std::size_t kb = shape.k_row_bytes, vb = shape.v_row_bytes, n = static_cast<std::size_t>(T);
    const std::vector<unsigned char> was_k(views->span[0].k, views->span[0].k + n * kb);
    const std::vector<unsigned char> was_v(views->span[0].v, views->span[0].v + n * vb);
    // Refused only when, without growth, each of two runs would overwrite rows the
    // other still has to read (no order of the two copies works).
    const int r0 = source.read[0].row;
    auto rows_overlap = [](std::int64_t a, std::int64_t a_len, std::int64_t b, std::int64_t b_len) {
      return a < b + b_len && b < a + a_len;
    };
    const Run* w = plan.write;
    const bool crosswise = plan.n_write == 2 && extent_of(w, 2).end_row <= shape.allocated_rows &&
                           rows_overlap(w[0].row, w[0].len, r0 + w[0].len, w[1].len) &&
                           rows_overlap(w[1].row, w[1].len, r0, w[0].len);
    const PoolState before = pool_state();
    const Status s = pool_->write(layer, plan, views->span[0].k, n * kb, views->span[0].v, n * vb);
    if (crosswise) {
      if (s.code() != Error::InvalidArgument || !(pool_state() == before))
        return "a write crossing its own input rows: " + outcome(s);
      bump(&Coverage::bad_pool_calls);
      return "";
    }
    if (!s.ok()) return "write from the pool itself: " + outcome(s);
    SeqStepPlan written;  // the rows just written, read back in position order
    written.n_read = plan.n_write;
    for (int i = 0; i < plan.n_write; ++i) written.read[i] = plan.write[i];
    std::vector<unsigned char> k(n * kb), v(n * vb);
    const Status g = pool_->gather(layer, written, k.data(), k.size(), v.data(), v.size());
    if (!g.ok()) return "gather of the rows just written: " + outcome(g);
    if (k != was_k || v != was_v)
      return "layer " + str(layer) + ": a write from the pool's own rows " + kvcore_test::describe(source) +
             " did not copy them as they were, plan " + kvcore_test::describe(plan);
    bump(&Coverage::aliasing_writes);
    return "";
  }

  // Gathers the plan's reads and checks every row against its tag (this step's
  // version at and above P, the committing step's below), and that the
  // zero-copy views show the same bytes.
  std::string check_pool_reads(int layer, const SeqStepPlan& plan) {
    const std::size_t R = static_cast<std::size_t>(plan.read_len());
    const std::size_t kb = k_row(layer), vb = v_row(layer);
    std::vector<unsigned char> k(R * kb), v(R * vb), want_k(kb), want_v(vb);
    const Status s = pool_->gather(layer, plan, k.data(), k.size(), v.data(), v.size());
    if (!s.ok()) return "gather of layer " + str(layer) + ": " + outcome(s);
    std::size_t i = 0;
    for (int r = 0; r < plan.n_read; ++r)
      for (int j = 0; j < plan.read[r].len; ++j, ++i) {
        const int p = plan.read[r].pos + j;
        const std::uint64_t version = p >= step_.position ? step_version_ : committed_[static_cast<std::size_t>(p)];
        tag(want_k.data(), kb, layer, p, version, 0);
        tag(want_v.data(), vb, layer, p, version, 1);
        if (std::memcmp(k.data() + i * kb, want_k.data(), kb) != 0 ||
            std::memcmp(v.data() + i * vb, want_v.data(), vb) != 0)
          return "layer " + str(layer) + ": the pool row read as position " + str(p) +
                 " does not hold that position's bytes, plan " + kvcore_test::describe(plan);
        bump(&Coverage::rows_checked);
      }
    return check_views(layer, plan, k, v);
  }

  // views() of a plan shows, span after span, exactly the rows gather() copied
  // (`k`, `v`), from inside the layer's storage (a mirrored ring's spans may run
  // on into its mirror rows, which must repeat the ring rows).
  std::string check_views(int layer, const SeqStepPlan& plan, const std::vector<unsigned char>& k,
                          const std::vector<unsigned char>& v) {
    auto views = pool_->views(layer, plan);
    if (!views.ok()) return "views: " + outcome(views.status());
    const PoolLayer shape = *pool_->layer(layer);
    const std::size_t kb = shape.k_row_bytes, vb = shape.v_row_bytes;
    if (views->n > plan.n_read || views->len() != plan.read_len()) return "views do not cover the plan's reads";
    std::size_t at = 0;
    for (int r = 0; r < views->n; ++r) {
      const kvcore::KVSpan& span = views->span[r];
      const std::size_t first = static_cast<std::size_t>(span.run.row), len = static_cast<std::size_t>(span.run.len);
      if (span.k != shape.k + first * kb || span.v != shape.v + first * vb ||
          static_cast<std::int64_t>(first + len) > shape.storage_rows())
        return "a view of layer " + str(layer) + " points outside the layer's storage";
      if (std::memcmp(span.k, k.data() + at * kb, len * kb) != 0 || std::memcmp(span.v, v.data() + at * vb, len * vb) != 0)
        return "views of layer " + str(layer) + " differ from gather, plan " + kvcore_test::describe(plan);
      at += len;
    }
    return "";
  }

  // A plan from the fuzzer's bytes: mostly broken, sometimes fine.
  SeqStepPlan junk_plan() {
    SeqStepPlan p;
    p.n_write = in_.in(-1, 3);
    p.n_read = in_.in(-1, 4);
    for (Run& r : p.write) r = Run{in_.percent(50) ? in_.in(-2, 40) : in_.edgy(), in_.percent(50) ? in_.in(-1, 8) : in_.edgy(), in_.in(-1, 200)};
    for (Run& r : p.read) r = Run{in_.percent(50) ? in_.in(-2, 40) : in_.edgy(), in_.percent(50) ? in_.in(-1, 8) : in_.edgy(), in_.in(-1, 200)};
    return p;
  }

  // describe() with the run counts clamped to the arrays (junk counts are not).
  static std::string describe_junk(const SeqStepPlan& plan) {
    SeqStepPlan shown = plan;
    auto clamp = [](int n, int max) { return n < 0 ? 0 : n > max ? max : n; };
    shown.n_write = clamp(plan.n_write, SeqStepPlan::kMaxWriteRuns);
    shown.n_read = clamp(plan.n_read, SeqStepPlan::kMaxReadRuns);
    return "(n_write " + str(plan.n_write) + ", n_read " + str(plan.n_read) + ") " + kvcore_test::describe(shown);
  }

  // Counts the pools whose ring rows are mirrored (some ring layer wraps).
  void count_mirror() {
    for (int l = 0; l < pool_->n_layers(); ++l)
      if (pool_->layer(l)->mirror_rows > 0) {
        bump(&Coverage::mirrored_pools);
        return;
      }
  }

  bool runs_fit(const Run* runs, int n, int max, int rows) const {
    if (n < 0 || n > max) return false;
    for (int i = 0; i < n; ++i)
      if (runs[i].row < 0 || runs[i].len < 1 || runs[i].pos < 0 ||
          static_cast<std::int64_t>(runs[i].row) + runs[i].len > rows)
        return false;
    return true;
  }

  // Calls the pool cannot honour: each must be refused with the documented
  // code, a message, and no change. Reads of a junk plan whose runs happen to
  // fit are served, from the layer's own storage.
  std::string abuse_pool(int op, std::string& last_op) {
    const PoolState before = pool_state();
    const int n_layers = pool_->n_layers();
    const int layer = in_.percent(30) ? in_.edgy() : in_.in(0, n_layers - 1);
    const bool layer_ok = layer >= 0 && layer < n_layers;
    SeqStepPlan plan = junk_plan();
    unsigned char buf[256] = {};
    const std::size_t k_bytes = in_.percent(50) ? in_.in(0, 256) : static_cast<std::size_t>(in_.u32());
    const std::size_t v_bytes = in_.percent(50) ? in_.in(0, 256) : static_cast<std::size_t>(in_.u32());
    const int what = in_.in(0, 4);
    last_op = "pool abuse " + str(what) + " layer " + str(layer) + " plan " + describe_junk(plan);
    Status s;
    bool expect_ok = false;
    if (what == 0) {
      // Writes: only with a plan the pool must refuse, or sizes it must refuse.
      const int rows = layer_ok ? pool_->layer(layer)->rows : 0;
      const bool fits = layer_ok && runs_fit(plan.write, plan.n_write, SeqStepPlan::kMaxWriteRuns, rows);
      const Extent e = extent_of(plan.write, fits ? plan.n_write : 0);
      const bool sizes_ok = fits && k_bytes == static_cast<std::size_t>(e.rows) * k_row(layer) &&
                            v_bytes == static_cast<std::size_t>(e.rows) * v_row(layer);
      if (sizes_ok) return "";  // a valid write of junk would spoil the tags
      // Pointers: the buffer when it is large enough to read, else null.
      const void* kp = k_bytes <= sizeof(buf) ? buf : nullptr;
      const void* vp = v_bytes <= sizeof(buf) ? buf : nullptr;
      s = pool_->write(layer, plan, kp, k_bytes, vp, v_bytes);
    } else if (what <= 2) {
      // gather / views: any plan; served when its runs fit the rows grown so far.
      const PoolLayer shape = layer_ok ? *pool_->layer(layer) : PoolLayer{};
      const bool fits = layer_ok && runs_fit(plan.read, plan.n_read, SeqStepPlan::kMaxReadRuns, shape.rows);
      const Extent e = extent_of(plan.read, fits ? plan.n_read : 0);
      const bool grown = fits && e.end_row <= shape.allocated_rows;
      if (what == 1) {
        const std::uint64_t k_need = static_cast<std::uint64_t>(e.rows) * shape.k_row_bytes;
        const std::uint64_t v_need = static_cast<std::uint64_t>(e.rows) * shape.v_row_bytes;
        if (k_need > kBlockLimit || v_need > kBlockLimit) return "";
        std::vector<unsigned char> k(k_need + 8), v(v_need + 8);
        std::size_t k_cap = k.size(), v_cap = v.size();
        void* kp = k.data();
        switch (in_.in(0, 3)) {
          case 0: break;
          case 1: k_cap = k_need > 0 ? k_need - 1 : 0; break;
          case 2: v_cap = v_need > 0 ? v_need - 1 : 0; break;
          default: kp = nullptr; break;
        }
        const bool buffers_ok = k_cap >= k_need && v_cap >= v_need && (kp != nullptr || k_need == 0);
        expect_ok = grown && buffers_ok;
        s = pool_->gather(layer, plan, kp, k_cap, v.data(), v_cap);
        FUZZ_REQUIRE(!(fits && !grown) || s.code() == Error::InvalidState, "gather beyond the grown rows: " + outcome(s));
        FUZZ_REQUIRE(!(grown && !buffers_ok) || s.code() == Error::InvalidArgument, "gather into a bad buffer: " + outcome(s));
      } else {
        expect_ok = grown;
        auto views = pool_->views(layer, plan);
        s = kvcore::internal::to_status(views);
        FUZZ_REQUIRE(!(fits && !grown) || s.code() == Error::InvalidState, "views beyond the grown rows: " + outcome(s));
        const std::uint64_t k_need = static_cast<std::uint64_t>(e.rows) * shape.k_row_bytes;
        const std::uint64_t v_need = static_cast<std::uint64_t>(e.rows) * shape.v_row_bytes;
        if (views.ok() && k_need <= kBlockLimit && v_need <= kBlockLimit) {
          std::vector<unsigned char> k(k_need), v(v_need);
          FUZZ_REQUIRE(pool_->gather(layer, plan, k.data(), k.size(), v.data(), v.size()).ok(), "views without gather");
          const std::string err = check_views(layer, plan, k, v);
          FUZZ_REQUIRE(err.empty(), err);
        }
      }
    } else if (what == 3) {
      const int rows = in_.percent(50) ? in_.in(-2, 300) : in_.edgy();
      const int max_rows = layer_ok ? pool_->layer(layer)->rows : 0;
      if (layer_ok && rows >= 0 && rows <= max_rows) return "";  // a valid reserve grows the pool
      s = pool_->reserve(layer, rows);
    } else {
      s = kvcore::internal::to_status(pool_->layer(layer));
      expect_ok = layer_ok;
    }
    if (expect_ok) {
      FUZZ_REQUIRE(s.ok(), "refused: " + outcome(s));
    } else {
      FUZZ_REQUIRE(!s.ok(), "accepted a call the pool must refuse");
      FUZZ_REQUIRE(s.code() == Error::InvalidArgument || s.code() == Error::InvalidState,
                   "unexpected code " + outcome(s));
      FUZZ_REQUIRE(s.message().c_str()[0] != '\0', "an error without a message");
      bump(&Coverage::bad_pool_calls);
    }
    FUZZ_REQUIRE(pool_state() == before, "a pool call without growth changed the pool");
    return "";
  }

  // --- the small regime: exact, against the simulated pools ----------------------

  std::string run_small() {
    const int n_layers = cfg_.n_layers;
    std::vector<Step> handles;  // every step begun; all but the active one are stale
    std::vector<SeqStepPlan> plans;
    std::vector<bool> written;  // per layer: the begun step's rows are in the pool
    std::string last_op = "create";
    int op = 0;
    for (; op < 400 && !in_.done(); ++op) {
      const int L = sim_->length();
      const int kind = in_.in(0, 99);
      const Step before = cache_->active_step();
      if (kind < 40) {
        int T = in_.in(1, C_);
        if (in_.percent(15)) {
          const int bad[] = {0, -1, C_ + 1, cfg_.capacity - L + 1, in_.edgy()};
          T = bad[in_.in(0, 4)];
        }
        last_op = "begin_step(" + str(T) + ") at " + str(L);
        auto step = cache_->begin_step(T);
        if (T < 1 || T > C_) {
          FUZZ_REQUIRE(step.error() == Error::InvalidArgument, "expected InvalidArgument, got " + outcome(kvcore::internal::to_status(step)));
        } else if (static_cast<std::int64_t>(L) + T > cfg_.capacity) {
          FUZZ_REQUIRE(step.error() == Error::OutOfResources, "expected OutOfResources");
          bump(&Coverage::capacity_refusals);
        } else {
          FUZZ_REQUIRE(step.ok(), "refused: " + outcome(step.status()));
          FUZZ_REQUIRE(step->position == L && step->T == T, "wrong position or T");
          bump(&Coverage::steps_begun);
          handles.push_back(*step);
          step_ = *step;
          step_version_ = ++last_version_;
          sim_->begin(T);
          plans.clear();
          for (int l = 0; l < n_layers; ++l) {
            auto a = cache_->plan(l, step_.position, step_.T);
            auto b = cache_->plan(l, step_);
            FUZZ_REQUIRE(a.ok() && b.ok() && *a == *b, "plan overloads disagree on layer " + str(l));
            const std::string err = sim_->apply_writes(l, *a);
            FUZZ_REQUIRE(err.empty(), err);
            plans.push_back(*a);
          }
          for (int l = 0; l < n_layers; ++l) {
            const std::string err = sim_->check_reads(l, plans[static_cast<std::size_t>(l)]);
            FUZZ_REQUIRE(err.empty(), err);
          }
          // The backend may write any time after begin_step: now, some layers
          // now and the rest before commit, or (for a step it abandons) never.
          written.assign(static_cast<std::size_t>(n_layers), false);
          if (pool_ != nullptr) {
            const int now = in_.percent(60) ? n_layers : in_.in(0, n_layers);
            for (int l = 0; l < now; ++l) {
              std::string err = write_layer(l, plans[static_cast<std::size_t>(l)]);
              if (err.empty()) err = check_pool_reads(l, plans[static_cast<std::size_t>(l)]);
              FUZZ_REQUIRE(err.empty(), err);
              written[static_cast<std::size_t>(l)] = true;
            }
          }
        }
        if (!step.ok()) FUZZ_REQUIRE(step.message().c_str()[0] != '\0', "an error without a message");
      } else if (kind < 70) {
        if (sim_->has_step()) {
          last_op = "commit(" + str(step_.position) + ", " + str(step_.T) + ")";
          if (pool_ != nullptr) {
            for (int l = 0; l < n_layers; ++l) {
              if (written[static_cast<std::size_t>(l)]) continue;
              std::string err = write_layer(l, plans[static_cast<std::size_t>(l)]);
              if (err.empty()) err = check_pool_reads(l, plans[static_cast<std::size_t>(l)]);
              FUZZ_REQUIRE(err.empty(), err);
              written[static_cast<std::size_t>(l)] = true;
            }
          }
          const Status s = cache_->commit(handles.back());
          FUZZ_REQUIRE(s.ok(), "refused: " + outcome(s));
          sim_->commit();
          for (int p = step_.position; p < step_.end(); ++p) committed_[static_cast<std::size_t>(p)] = step_version_;
          bump(&Coverage::steps_committed);
        } else {
          last_op = "commit without a begun step";
          const Step h = handles.empty() ? Step{} : handles[static_cast<std::size_t>(in_.in(0, static_cast<int>(handles.size()) - 1))];
          const Status s = cache_->commit(h);
          FUZZ_REQUIRE(s.code() == Error::InvalidState && s.message().c_str()[0] != '\0', "expected InvalidState, got " + outcome(s));
        }
      } else if (kind < 85) {
        int n;
        const int how = in_.in(0, 9);
        if (how < 6) n = L - in_.in(0, C_ + 3);
        else if (how < 8) n = in_.in(0, L);
        else n = in_.edgy();
        last_op = "rewind(" + str(n) + ") at " + str(L);
        const bool allowed = sim_->brute_can_rewind(n);
        FUZZ_REQUIRE(cache_->can_rewind(n) == allowed, "can_rewind disagrees with the brute force");
        const Status s = cache_->rewind(n);
        if (allowed) {
          FUZZ_REQUIRE(s.ok(), "refused: " + outcome(s));
          sim_->rewind(n);
          bump(&Coverage::rewinds_accepted);
        } else if (n < 0 || n > L) {
          FUZZ_REQUIRE(s.code() == Error::InvalidArgument, "expected InvalidArgument, got " + outcome(s));
          bump(&Coverage::rewinds_refused_range);
        } else {
          FUZZ_REQUIRE(s.code() == Error::InvalidState, "expected InvalidState, got " + outcome(s));
          bump(&Coverage::rewinds_refused_state);
        }
        if (!s.ok()) FUZZ_REQUIRE(s.message().c_str()[0] != '\0', "an error without a message");
      } else if (kind < 89) {
        last_op = "clear";
        cache_->clear();
        sim_->clear();
        bump(&Coverage::clears);
      } else if (kind < 94) {
        // Planning anything but the begun step, or a bad layer.
        const int layer = in_.percent(50) ? in_.edgy() : in_.in(-1, n_layers);
        const int position = in_.percent(50) ? before.position + in_.in(-2, 2) : in_.edgy();
        const int T = in_.percent(50) ? before.T + in_.in(-1, 1) : in_.edgy();
        last_op = "plan(" + str(layer) + ", " + str(position) + ", " + str(T) + ")";
        auto p = cache_->plan(layer, position, T);
        const bool layer_ok = layer >= 0 && layer < n_layers;
        const bool step_ok = sim_->has_step() && position == before.position && T == before.T;
        if (!layer_ok) FUZZ_REQUIRE(p.error() == Error::InvalidArgument, "bad layer accepted");
        else if (!step_ok) FUZZ_REQUIRE(p.error() == Error::InvalidState, "plan of no begun step accepted");
        else FUZZ_REQUIRE(p.ok() && *p == plans[static_cast<std::size_t>(layer)], "plan changed");
        if (!handles.empty()) {
          const Step h = handles[static_cast<std::size_t>(in_.in(0, static_cast<int>(handles.size()) - 1))];
          const bool current = sim_->has_step() && h.id == before.id;
          auto q = cache_->plan(layer_ok ? layer : 0, h);
          FUZZ_REQUIRE(q.ok() == current, "plan(layer, step) of a stale step");
        }
      } else if (kind < 97) {
        if (pool_ != nullptr) {
          const std::string err = abuse_pool(op, last_op);
          if (!err.empty()) return err;
        }
      } else {
        const int layer = in_.in(-1, n_layers);
        const int q = in_.percent(50) ? in_.in(-1, cfg_.capacity) : in_.edgy();
        const int k = in_.percent(50) ? in_.in(-1, cfg_.capacity) : in_.edgy();
        last_op = "visible(" + str(layer) + ", " + str(q) + ", " + str(k) + ")";
        auto v = cache_->visible(layer, q, k);
        if (layer < 0 || layer >= n_layers || q < 0 || k < 0)
          FUZZ_REQUIRE(v.error() == Error::InvalidArgument, "bad visible() accepted");
        else
          FUZZ_REQUIRE(v.ok() && *v == models_[static_cast<std::size_t>(layer)].visible(q, k), "visible disagrees");
      }

      // After every operation: one length, the same begun step, can_rewind
      // equal to the brute force everywhere, can_extend by the rule.
      FUZZ_REQUIRE(cache_->length() == sim_->length(), "length " + str(cache_->length()) + ", expected " + str(sim_->length()));
      FUZZ_REQUIRE((cache_->active_step().id != 0) == sim_->has_step(), "begun step mismatch");
      const std::vector<bool> allowed = sim_->brute_can_rewind_all();
      for (int n = -1; n <= sim_->length() + 1; ++n) {
        const bool want = n >= 0 && n <= sim_->length() && allowed[static_cast<std::size_t>(n)];
        FUZZ_REQUIRE(cache_->can_rewind(n) == want, "can_rewind(" + str(n) + ") disagrees with the brute force");
      }
      FUZZ_REQUIRE(!cache_->can_rewind(INT_MAX) && !cache_->can_rewind(INT_MIN), "can_rewind of an edge");
      const int room = cfg_.capacity - sim_->length();
      FUZZ_REQUIRE(cache_->can_extend(room) && !cache_->can_extend(room + 1) && !cache_->can_extend(-1) &&
                       !cache_->can_extend(INT_MAX) && !cache_->can_extend(INT_MIN),
                   "can_extend");
    }
    return "";
  }

  // --- the huge regime: arithmetic at the edges --------------------------------------

  std::string run_huge() {
    const int n_layers = cfg_.n_layers;
    std::vector<Step> handles;
    std::string last_op = "create";
    int op = 0;
    for (; op < 200 && !in_.done(); ++op) {
      const int L = cache_->length();
      const int kind = in_.in(0, 99);
      if (kind < 40) {
        int T;
        const int how = in_.in(0, 3);
        if (how == 0) T = in_.in(1, C_);
        else if (how == 1) T = C_;
        else if (how == 2) T = cfg_.capacity - L < C_ ? cfg_.capacity - L : C_;
        else T = in_.edgy();
        last_op = "begin_step(" + str(T) + ") at " + str(L);
        auto step = cache_->begin_step(T);
        if (T < 1 || T > C_) {
          FUZZ_REQUIRE(step.error() == Error::InvalidArgument, "expected InvalidArgument");
        } else if (static_cast<std::int64_t>(L) + T > cfg_.capacity) {
          FUZZ_REQUIRE(step.error() == Error::OutOfResources, "expected OutOfResources");
          bump(&Coverage::capacity_refusals);
        } else {
          FUZZ_REQUIRE(step.ok(), "refused: " + outcome(step.status()));
          FUZZ_REQUIRE(step->position == L && step->T == T, "wrong position or T");
          handles.push_back(*step);
          bump(&Coverage::steps_begun);
          if (static_cast<std::int64_t>(L) + T > (1 << 30)) bump(&Coverage::huge_plans);
          for (int l = 0; l < n_layers; ++l) {
            auto plan = cache_->plan(l, *step);
            FUZZ_REQUIRE(plan.ok(), "plan failed: " + outcome(plan.status()));
            const std::string err = check_plan_intervals(models_[static_cast<std::size_t>(l)], *plan, L, T);
            FUZZ_REQUIRE(err.empty(), "layer " + str(l) + ": " + err);
            if (pool_ != nullptr && in_.percent(50)) {
              const std::string perr = huge_pool_step(l, *plan);
              FUZZ_REQUIRE(perr.empty(), perr);
            }
          }
        }
      } else if (kind < 65) {
        const Step active = cache_->active_step();
        const Step h = handles.empty() || in_.percent(70) ? active
                                                          : handles[static_cast<std::size_t>(in_.in(0, static_cast<int>(handles.size()) - 1))];
        last_op = "commit";
        const Status s = cache_->commit(h);
        const bool current = active.id != 0 && h.id == active.id;
        FUZZ_REQUIRE(s.ok() == current, "commit: " + outcome(s));
        if (current) {
          FUZZ_REQUIRE(cache_->length() == active.end(), "length after commit");
          bump(&Coverage::steps_committed);
        }
      } else if (kind < 88) {
        int n;
        const int S = ring_sinks();
        switch (in_.in(0, 6)) {
          case 0: n = L; break;
          case 1: n = L - in_.in(0, C_ < 64 ? C_ + 1 : 64); break;
          case 2: n = L - (C_ - in_.in(0, 2)); break;
          case 3: n = S == INT_MAX ? L : S + in_.in(-1, 0); break;
          case 4: n = in_.in(0, L); break;
          default: n = in_.edgy(); break;
        }
        last_op = "rewind(" + str(n) + ") at " + str(L);
        const bool predicted = cache_->can_rewind(n);
        // Always allowed: rewinding to the length, and into the sinks of every ring.
        if (n >= 0 && n <= L && (n == L || n <= S)) FUZZ_REQUIRE(predicted, "can_rewind refuses a rewind the rules allow");
        const Status s = cache_->rewind(n);
        FUZZ_REQUIRE(s.ok() == predicted, "rewind disagrees with can_rewind: " + outcome(s));
        if (s.ok()) {
          FUZZ_REQUIRE(cache_->length() == n && cache_->active_step().id == 0, "rewind did not rewind");
          bump(&Coverage::rewinds_accepted);
        } else {
          FUZZ_REQUIRE(cache_->length() == L, "a refused rewind changed the length");
          FUZZ_REQUIRE(s.code() == ((n < 0 || n > L) ? Error::InvalidArgument : Error::InvalidState), "rewind code: " + outcome(s));
          bump((n < 0 || n > L) ? &Coverage::rewinds_refused_range : &Coverage::rewinds_refused_state);
        }
      } else if (kind < 92) {
        last_op = "clear";
        cache_->clear();
        FUZZ_REQUIRE(cache_->length() == 0 && cache_->active_step().id == 0 && cache_->can_rewind(0), "clear");
        bump(&Coverage::clears);
      } else if (kind < 96) {
        const int layer = in_.in(-1, n_layers);
        const int q = in_.edgy(), k = in_.edgy();
        last_op = "visible(" + str(layer) + ", " + str(q) + ", " + str(k) + ")";
        auto v = cache_->visible(layer, q, k);
        if (layer < 0 || layer >= n_layers || q < 0 || k < 0)
          FUZZ_REQUIRE(v.error() == Error::InvalidArgument, "bad visible() accepted");
        else
          FUZZ_REQUIRE(v.ok() && *v == models_[static_cast<std::size_t>(layer)].visible(q, k), "visible disagrees");
      } else if (pool_ != nullptr) {
        const std::string err = abuse_pool(op, last_op);
        if (!err.empty()) return err;
      }
      const int len = cache_->length();
      const int room = cfg_.capacity - len;
      FUZZ_REQUIRE(cache_->can_extend(room) && (room == INT_MAX || !cache_->can_extend(room + 1)) &&
                       !cache_->can_extend(-1) && !cache_->can_extend(INT_MIN),
                   "can_extend");
      FUZZ_REQUIRE(cache_->can_rewind(len) && !cache_->can_rewind(-1) && (len == INT_MAX || !cache_->can_rewind(len + 1)),
                   "can_rewind at the ends");
    }
    return "";
  }

  // Smallest sink count over ring layers (n <= it is always a legal rewind);
  // INT_MAX when every layer is flat (every rewind in range is legal).
  int ring_sinks() const {
    int s = INT_MAX;
    for (const LayerModel& m : models_)
      if (m.ring && m.sinks < s) s = static_cast<int>(m.sinks);
    return s;
  }

  // A step at a huge position: write it when the input fits 1 MiB (the
  // allocator may refuse the growth), then read it when the read fits too.
  std::string huge_pool_step(int layer, const SeqStepPlan& plan) {
    const PoolLayer shape = *pool_->layer(layer);
    const std::uint64_t T = static_cast<std::uint64_t>(plan.write_len());
    if (T * shape.k_row_bytes > kBlockLimit || T * shape.v_row_bytes > kBlockLimit) return "";
    std::vector<unsigned char> k(T * shape.k_row_bytes + 1), v(T * shape.v_row_bytes + 1);
    const PoolState before = pool_state();
    const Status s = pool_->write(layer, plan, k.data(), k.size() - 1, v.data(), v.size() - 1);
    const Extent w = extent_of(plan.write, plan.n_write);
    if (s.code() == Error::MemoryAllocationFailed) {
      if (!(pool_state() == before)) return "a failed huge write changed the pool";
      bump(&Coverage::allocation_failures);
      return "";
    }
    if (!s.ok()) return "huge write: " + outcome(s);
    if (pool_->layer(layer)->allocated_rows < w.end_row) return "a write did not grow the layer to its rows";
    const std::uint64_t R = static_cast<std::uint64_t>(plan.read_len());
    if (R * shape.k_row_bytes > kBlockLimit || R * shape.v_row_bytes > kBlockLimit) return "";
    std::vector<unsigned char> kr(R * shape.k_row_bytes + 1), vr(R * shape.v_row_bytes + 1);
    const Status g = pool_->gather(layer, plan, kr.data(), kr.size(), vr.data(), vr.size());
    const Extent r = extent_of(plan.read, plan.n_read);
    const bool grown = r.end_row <= pool_->layer(layer)->allocated_rows;
    if (grown ? !g.ok() : g.code() != Error::InvalidState) return "huge gather: " + outcome(g);
    return "";
  }

  Bytes& in_;
  bool huge_ = false;
  kvcore::RingStorage ring_storage_ = kvcore::RingStorage::Compact;
  CacheConfig cfg_;
  int C_ = 0;
  std::unique_ptr<SequenceCache> cache_;
  std::vector<LayerModel> models_;
  std::unique_ptr<PoolSim> sim_;
  TestAllocator allocator_;  // outlives pool_ (declared before it)
  std::vector<unsigned char> arena_;
  std::unique_ptr<KVPool> pool_;
  Step step_;  // the begun step (sim_->has_step() tells whether there is one)
  std::uint64_t step_version_ = 0;
  std::uint64_t last_version_ = 0;
  std::vector<std::uint64_t> committed_;  // per position: the version its commit wrote
};

#undef FUZZ_REQUIRE

}  // namespace detail

/// Runs one input; "" when everything held, else the first violation.
inline std::string run_plan_fuzz(const std::uint8_t* data, std::size_t size) {
  return kvcore_fuzz_input::run_input<detail::Harness>(coverage(), detail::kEdges, data, size);
}

}  // namespace kvcore_fuzz

KVCORE_FUZZ_ENTRY_POINT("plan_fuzzer", kvcore_fuzz::run_plan_fuzz)
