// KVPool over the layer kinds of docs/design.md section 9: a Shared layer
// answers every read from its source's rows and refuses writes; a State layer
// keeps D state slots written and read with the state verbs. A reference
// model drives a SequenceCache of every kind through random steps (verify and
// not, partial commits, aborts, rewinds, trees with their copies applied) in
// both pool modes, with each state a deterministic function of the tokens so
// far, and checks every read the pool gives against it; then one test per
// refusal.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kvcore/core/sequence_cache.h"
#include "kvcore/pool/kv_pool.h"
#include "kvcore/pool/kv_pool_tree.h"
#include "kvcore/state/sequence_export.h"
#include "kvcore/state/sequence_import.h"
#include "rng.h"

namespace {

using kvcore::CacheConfig;
using kvcore::DType;
using kvcore::Error;
using kvcore::KVPool;
using kvcore::LayerConfig;
using kvcore::LayerPolicy;
using kvcore::SeqStepPlan;
using kvcore::SequenceCache;
using kvcore::StateSlotBytes;
using Kind = LayerPolicy::Kind;

// K/V rows: one head of 16 uint8 elements = (position, tag) as two uint64.
constexpr int kHeadDim = 16;

CacheConfig config_of(const std::vector<LayerPolicy>& policies, int capacity, int max_step, int initial) {
  CacheConfig cfg;
  cfg.capacity = capacity;
  cfg.max_step = max_step;
  cfg.initial_capacity = initial;
  cfg.n_layers = static_cast<int>(policies.size());
  for (const LayerPolicy& p : policies)
    cfg.layers.push_back(p.kind == Kind::State ? LayerConfig{p, 0, 0, 0} : LayerConfig{p, 1, kHeadDim, 0});
  return cfg;
}

std::uint64_t mix(std::uint64_t h, std::uint64_t token) {
  std::uint64_t z = h ^ (token + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The bytes a layer stores for (position, tag): K/V rows of 16 bytes, state
// slots of `bytes` bytes (the pair repeated, salted by the layer).
std::vector<unsigned char> cell(std::size_t bytes, int layer, int pos, std::uint64_t tag) {
  std::vector<unsigned char> out(bytes, 0);
  for (std::size_t at = 0; at + 16 <= bytes; at += 16) {
    const std::uint64_t p = static_cast<std::uint64_t>(pos) + (static_cast<std::uint64_t>(layer) << 40);
    const std::uint64_t t = tag ^ at;
    std::memcpy(out.data() + at, &p, 8);
    std::memcpy(out.data() + at + 8, &t, 8);
  }
  return out;
}

// The value of a result that must be ok.
template <class T>
T take(kvcore::Result<T>&& r) {
  EXPECT_TRUE(r.ok()) << r.status().message().c_str();
  return std::move(r).get();
}

std::string msg(const kvcore::Status& st) { return st.message().c_str(); }

void expect_refused(const kvcore::Status& st, Error code, const std::string& words) {
  EXPECT_EQ(st.code(), code) << msg(st);
  EXPECT_NE(msg(st).find(words), std::string::npos) << msg(st);
}

// Drives one cache and its pool; the reference is the committed tags (tag of
// position p = the state after p: mix of the tags before and p's token).
class KindsPoolCase {
 public:
  KindsPoolCase(const CacheConfig& cfg, const std::vector<std::size_t>& slot_bytes, bool arena, std::uint64_t seed)
      : cfg_(cfg), slot_bytes_(slot_bytes), rng_(seed) {
    cache_ = take(SequenceCache::create(cfg));
    const StateSlotBytes state{slot_bytes_.data(), static_cast<int>(slot_bytes_.size())};
    if (arena) {
      const std::size_t need = *KVPool::required_bytes(cfg, DType::UInt8, kvcore::RingStorage::Compact, state);
      arena_.assign(need, 0xAB);
      pool_.reset(new KVPool(take(KVPool::in_arena(*cache_, DType::UInt8, arena_.data(), need,
                                                         kvcore::RingStorage::Compact, state))));
    } else {
      pool_.reset(new KVPool(take(KVPool::create(*cache_, DType::UInt8, kvcore::PoolAllocator::heap(),
                                                       kvcore::RingStorage::Compact, state))));
    }
  }

  int reads_checked = 0, shared_reads = 0, trees = 0, copies = 0, partial = 0, aborts = 0, rewinds = 0;
  int round_trips = 0, states_carried = 0;

  // With `records`, some ops move the sequence through a record into a fresh
  // cache and pool, and the walk goes on there (round_trip()).
  void run(int ops, bool records = false) {
    for (int op = 0; op < ops && !::testing::Test::HasFailure(); ++op) {
      const int what = rng_.uniform(0, 99);
      if (records && rng_.percent(10)) round_trip();
      else if (what < 55) chain_step();
      else if (what < 75) tree_step();
      else if (what < 97) rewind();
      else {
        cache_->clear();
        tags_.clear();
      }
    }
  }

 private:
  int L() const { return cfg_.n_layers; }
  const LayerPolicy& policy(int l) const { return cfg_.layers[static_cast<std::size_t>(l)].policy; }
  int P() const { return static_cast<int>(tags_.size()); }
  std::size_t slot(int l) const { return slot_bytes_[static_cast<std::size_t>(l)]; }

  // What read_state returns for a step starting after `tag` at position P.
  std::vector<unsigned char> state_after(int l, int pos, std::uint64_t tag) const {
    return pos < 0 ? std::vector<unsigned char>(slot(l), 0) : cell(slot(l), l, pos, tag);
  }

  void check_state_read(int l, const SeqStepPlan& plan, int pos, std::uint64_t tag) {
    std::vector<unsigned char> got(slot(l) + 3, 0x5A);
    ASSERT_TRUE(pool_->read_state(l, plan, got.data(), got.size()).ok());
    got.resize(slot(l));
    ASSERT_EQ(got, state_after(l, pos, tag)) << "layer " << l << " read_state at position " << P();
    ++reads_checked;
  }

  // Every row a Shared layer reads equals its source's read, and each holds
  // the K/V of its position (`tag_of`).
  template <class TagOf>
  void check_shared_reads(int l, const SeqStepPlan& plan, const SeqStepPlan& source_plan, TagOf tag_of) {
    const int src = policy(l).source;
    const std::size_t n = static_cast<std::size_t>(plan.read_len()) * kHeadDim;
    std::vector<unsigned char> k(n), v(n), sk(n), sv(n);
    ASSERT_TRUE(pool_->gather(l, plan, k.data(), n, v.data(), n).ok());
    ASSERT_TRUE(pool_->gather(src, source_plan, sk.data(), n, sv.data(), n).ok());
    ASSERT_EQ(k, sk);
    ASSERT_EQ(v, sv);
    std::size_t at = 0;
    for (int r = 0; r < plan.n_read; ++r)
      for (int j = 0; j < plan.read[r].len; ++j, at += kHeadDim) {
        const int pos = plan.read[r].pos + j;
        ASSERT_EQ(std::vector<unsigned char>(k.begin() + static_cast<long>(at), k.begin() + static_cast<long>(at) + kHeadDim),
                  cell(kHeadDim, src, pos, tag_of(pos)));
      }
    const kvcore::KVViews views = *pool_->views(l, plan), source_views = *pool_->views(src, source_plan);
    ASSERT_EQ(views.n, source_views.n);
    for (int i = 0; i < views.n; ++i) ASSERT_EQ(views.span[i].k, source_views.span[i].k);
    const kvcore::HeldRows held = *pool_->held_rows(l, plan), source_held = *pool_->held_rows(src, source_plan);
    ASSERT_EQ(held.k, source_held.k);
    ASSERT_EQ(held.rows, source_held.rows);
    ASSERT_EQ(held.end, source_held.end);
    ++shared_reads;
  }

  void write_kv(int l, const SeqStepPlan& plan, const std::vector<std::uint64_t>& tags) {
    std::vector<unsigned char> k, v;
    for (int r = 0; r < plan.n_write; ++r)
      for (int j = 0; j < plan.write[r].len; ++j) {
        const int pos = plan.write[r].pos + j;
        const auto c = cell(kHeadDim, l, pos, tags[static_cast<std::size_t>(pos)]);
        k.insert(k.end(), c.begin(), c.end());
        const auto d = cell(kHeadDim, l, pos, ~tags[static_cast<std::size_t>(pos)]);
        v.insert(v.end(), d.begin(), d.end());
      }
    ASSERT_TRUE(pool_->write(l, plan, k.data(), k.size(), v.data(), v.size()).ok());
  }

  void chain_step() {
    const int T = rng_.uniform(1, cache_->max_step());
    const bool verify = rng_.percent(50);
    auto step = cache_->begin_step(T, verify);
    if (!step.ok()) {  // capacity, a verify step too long, a lost state: the planner's business
      if (step.status().code() == Error::InvalidState) {
        ASSERT_TRUE(cache_->rewind(0).ok());
        tags_.clear();
      }
      return;
    }
    std::vector<std::uint64_t> tags(tags_);
    for (int p = P(); p < P() + T; ++p)
      tags.push_back(mix(p == 0 ? 0x1234567ull : tags.back(), static_cast<std::uint64_t>(rng_.uniform(0, 1 << 30))));
    for (int l = 0; l < L(); ++l) {
      const SeqStepPlan plan = *cache_->plan(l, *step);
      if (policy(l).kind == Kind::State) {
        check_state_read(l, plan, P() - 1, P() > 0 ? tags_.back() : 0);
        if (::testing::Test::HasFailure()) return;
        std::vector<unsigned char> states;
        for (int r = 0; r < plan.n_write; ++r)
          for (int j = 0; j < plan.write[r].len; ++j) {
            const int pos = plan.write[r].pos + j;
            const auto c = cell(slot(l), l, pos, tags[static_cast<std::size_t>(pos)]);
            states.insert(states.end(), c.begin(), c.end());
          }
        ASSERT_TRUE(pool_->write_state(l, plan, states.data(), states.size()).ok());
      } else if (policy(l).kind == Kind::Shared) {
        check_shared_reads(l, plan, *cache_->plan(policy(l).source, *step),
                           [&tags](int p) { return tags[static_cast<std::size_t>(p)]; });
      } else {
        write_kv(l, plan, tags);
      }
      if (::testing::Test::HasFailure()) return;
    }
    const int how = rng_.uniform(0, 99);
    if (how < 60) {
      ASSERT_TRUE(cache_->commit(*step).ok());
      tags_ = tags;
    } else if (how < 85) {
      const int m = rng_.uniform(1, T);
      std::vector<int> path;
      for (int d = 0; d < m; ++d) path.push_back(d);
      if (cache_->commit(*step, path.data(), m).ok()) {
        tags_.assign(tags.begin(), tags.begin() + P() + m);
        ++partial;
      } else {
        ASSERT_TRUE(cache_->abort(*step).ok());
        ++aborts;
      }
    } else {
      ASSERT_TRUE(cache_->abort(*step).ok());
      ++aborts;
    }
  }

  void tree_step() {
    const int N = rng_.uniform(1, cache_->max_step());
    std::vector<int> parents(static_cast<std::size_t>(N), -1);
    for (int i = 1; i < N; ++i) parents[static_cast<std::size_t>(i)] = rng_.percent(50) ? i - 1 : rng_.uniform(0, i - 1);
    auto step = cache_->begin_tree(parents.data(), N);
    if (!step.ok()) {
      if (step.status().code() == Error::InvalidState) {
        ASSERT_TRUE(cache_->rewind(0).ok());
        tags_.clear();
      }
      return;
    }
    ++trees;
    const kvcore::DraftTree& tree = **cache_->tree(*step);
    std::vector<int> depth(static_cast<std::size_t>(N), 0);
    std::vector<std::uint64_t> node_tag(static_cast<std::size_t>(N));
    const std::uint64_t before = P() > 0 ? tags_.back() : 0x1234567ull;
    for (int i = 0; i < N; ++i) {
      const int par = parents[static_cast<std::size_t>(i)];
      depth[static_cast<std::size_t>(i)] = par < 0 ? 0 : depth[static_cast<std::size_t>(par)] + 1;
      node_tag[static_cast<std::size_t>(i)] = mix(par < 0 ? before : node_tag[static_cast<std::size_t>(par)],
                                                  static_cast<std::uint64_t>(rng_.uniform(0, 1 << 30)) * 4096 + static_cast<std::uint64_t>(i));
    }
    for (int l = 0; l < L(); ++l) {
      const SeqStepPlan plan = *cache_->plan(l, *step);
      if (policy(l).kind == Kind::Shared) continue;
      if (policy(l).kind == Kind::State) {
        check_state_read(l, plan, P() - 1, P() > 0 ? tags_.back() : 0);  // the root's
        if (::testing::Test::HasFailure()) return;
        std::vector<unsigned char> states;
        for (int i = 0; i < N; ++i) {
          const auto c = cell(slot(l), l, P() + depth[static_cast<std::size_t>(i)], node_tag[static_cast<std::size_t>(i)]);
          states.insert(states.end(), c.begin(), c.end());
        }
        ASSERT_TRUE(kvcore::write_state_tree(*pool_, l, plan, tree, states.data(), states.size()).ok());
        // Node i starts from its parent's state (the root from the state after P - 1).
        for (int i = 0; i < N; ++i) {
          const int par = parents[static_cast<std::size_t>(i)];
          const int s = *kvcore::node_read_slot(*pool_, l, plan, tree, i);
          std::vector<unsigned char> got(slot(l), 0);
          if (s >= 0) std::memcpy(got.data(), *pool_->state_slot(l, s), slot(l));
          const auto want = par >= 0 ? state_after(l, P() + depth[static_cast<std::size_t>(par)], node_tag[static_cast<std::size_t>(par)])
                                     : state_after(l, P() - 1, before);
          ASSERT_EQ(got, want) << "tree node " << i << " of layer " << l;
          ++reads_checked;
        }
        continue;
      }
      std::vector<unsigned char> k, v;
      for (int i = 0; i < N; ++i) {
        const auto c = cell(kHeadDim, l, P() + depth[static_cast<std::size_t>(i)], node_tag[static_cast<std::size_t>(i)]);
        k.insert(k.end(), c.begin(), c.end());
        v.insert(v.end(), c.begin(), c.end());
      }
      ASSERT_TRUE(kvcore::write_tree(*pool_, l, plan, tree, k.data(), k.size(), v.data(), v.size()).ok());
    }
    // A Shared layer reads its source's rows: the same bytes, through every read verb.
    for (int l = 0; l < L(); ++l) {
      if (policy(l).kind != Kind::Shared) continue;
      const SeqStepPlan plan = *cache_->plan(l, *step), source = *cache_->plan(policy(l).source, *step);
      const std::size_t n = static_cast<std::size_t>(plan.read_len()) * kHeadDim;
      std::vector<unsigned char> k(n), v(n), sk(n), sv(n);
      ASSERT_TRUE(pool_->gather(l, plan, k.data(), n, v.data(), n).ok());
      ASSERT_TRUE(pool_->gather(policy(l).source, source, sk.data(), n, sv.data(), n).ok());
      ASSERT_EQ(k, sk);
      ASSERT_EQ(v, sv);
      ++shared_reads;
    }
    const int how = rng_.uniform(0, 99);
    if (how < 20) {
      ASSERT_TRUE(cache_->abort(*step).ok());
      ++aborts;
      return;
    }
    std::vector<int> path{0};
    for (;;) {
      std::vector<int> kids;
      for (int i = 0; i < N; ++i)
        if (parents[static_cast<std::size_t>(i)] == path.back()) kids.push_back(i);
      if (kids.empty() || rng_.percent(25)) break;
      path.push_back(kids[static_cast<std::size_t>(rng_.uniform(0, static_cast<int>(kids.size()) - 1))]);
    }
    const int m = static_cast<int>(path.size());
    ASSERT_TRUE(cache_->commit(*step, path.data(), m).ok());
    for (int l = 0; l < L(); ++l) {
      const kvcore::RowCopies c = *cache_->commit_copies(l);
      ASSERT_TRUE(kvcore::copy_rows(*pool_, l, c.copies, c.n).ok());
      copies += c.n;
    }
    for (int d = 0; d < m; ++d) tags_.push_back(node_tag[static_cast<std::size_t>(path[static_cast<std::size_t>(d)])]);
  }

  void rewind() {
    std::vector<int> allowed;
    for (int n = 0; n <= P(); ++n)
      if (cache_->can_rewind(n)) allowed.push_back(n);
    ASSERT_FALSE(allowed.empty());
    const int n = allowed[static_cast<std::size_t>(rng_.uniform(0, static_cast<int>(allowed.size()) - 1))];
    ASSERT_TRUE(cache_->rewind(n).ok());
    tags_.resize(static_cast<std::size_t>(n));
    ++rewinds;
  }

  // Exports the sequence, imports the record into a fresh cache and pool and
  // goes on with those: every later read (checked against the tags) and
  // every rewind the importer allows must be exact. The importer never
  // claims a rewind the exporter could not make, holds the length, and
  // re-exports the record byte for byte.
  void round_trip() {
    auto sized = kvcore::export_size(*cache_, *pool_);
    if (!sized.ok() && sized.status().code() == Error::InvalidState && !cache_->can_rewind(P()))
      return;  // an aborted step lost the last state: nothing to carry
    const std::size_t size = take(std::move(sized));
    std::vector<std::uint64_t> buffer((size + 7) / 8);
    ASSERT_TRUE(kvcore::export_to(*cache_, *pool_, nullptr, 0, buffer.data(), size).ok());
    const kvcore::RecordView rec = take(kvcore::RecordView::parse(buffer.data(), size));
    EXPECT_EQ(rec.version(), 3u);
    for (int l = 0; l < L(); ++l)
      if (policy(l).kind == Kind::State) states_carried += rec.layer(l).n_rows;
    std::unique_ptr<SequenceCache> cache = take(SequenceCache::create(cfg_));
    const StateSlotBytes state{slot_bytes_.data(), static_cast<int>(slot_bytes_.size())};
    std::unique_ptr<KVPool> pool(new KVPool(take(KVPool::create(*cache, DType::UInt8, kvcore::PoolAllocator::heap(),
                                                                kvcore::RingStorage::Compact, state))));
    ASSERT_TRUE(kvcore::import_record(buffer.data(), size, *cache, *pool).ok());
    ASSERT_EQ(cache->length(), P());
    ASSERT_TRUE(cache->can_rewind(P()));
    for (int n = 0; n <= P(); ++n)
      ASSERT_TRUE(!cache->can_rewind(n) || cache_->can_rewind(n)) << "the importer claims rewind(" << n << ")";
    std::vector<std::uint64_t> again((size + 7) / 8);
    ASSERT_EQ(take(kvcore::export_size(*cache, *pool)), size);
    ASSERT_TRUE(kvcore::export_to(*cache, *pool, nullptr, 0, again.data(), size).ok());
    ASSERT_EQ(std::memcmp(buffer.data(), again.data(), size), 0) << "a re-export differs from the record";
    cache_ = std::move(cache);
    pool_ = std::move(pool);
    arena_.clear();
    ++round_trips;
  }

  CacheConfig cfg_;
  std::vector<std::size_t> slot_bytes_;
  kvcore_test::Rng rng_;
  std::vector<unsigned char> arena_;
  std::unique_ptr<SequenceCache> cache_;
  std::unique_ptr<KVPool> pool_;
  std::vector<std::uint64_t> tags_;
};

const std::vector<LayerPolicy> kKinds = {LayerPolicy::flat(),      LayerPolicy::ring(4, 1), LayerPolicy::chunked(4),
                                         LayerPolicy::shared(1),   LayerPolicy::state(5),   LayerPolicy::shared(2),
                                         LayerPolicy::state(6)};
const std::vector<std::size_t> kSlots = {0, 0, 0, 0, 24, 0, 48};

TEST(KVPoolKinds, EveryStateReadIsTheStateAfterTheLastPositionAndSharedReadsAreTheSources) {
  long reads = 0, shared = 0, trees = 0, copies = 0, partial = 0, aborts = 0, rewinds = 0;
  for (int seed = 1; seed <= 24 && !HasFailure(); ++seed) {
    const bool arena = seed % 2 == 0;
    KindsPoolCase c(config_of(kKinds, 48, 4, 2), kSlots, arena, static_cast<std::uint64_t>(seed));
    c.run(80);
    reads += c.reads_checked, shared += c.shared_reads, trees += c.trees, copies += c.copies;
    partial += c.partial, aborts += c.aborts, rewinds += c.rewinds;
  }
  std::printf("reads %ld shared %ld trees %ld copies %ld partial %ld aborts %ld rewinds %ld\n", reads, shared, trees,
              copies, partial, aborts, rewinds);
  // The walk reached every path it claims to check. Measured 2026-12-05 (kvcore_test::Rng, splitmix64:
  // the same everywhere): 4,640 reads, 2,834 shared, 368 trees, 115 copies, 184 partial, 291 aborts,
  // 433 rewinds; the floors sit about 10x under.
  EXPECT_GT(reads, 500);
  EXPECT_GT(shared, 300);
  EXPECT_GT(trees, 50);
  EXPECT_GT(copies, 10);
  EXPECT_GT(partial, 20);
  EXPECT_GT(aborts, 20);
  EXPECT_GT(rewinds, 50);
}

// Records (docs/state.md, version 3) carry every kind: a Shared layer no rows,
// a State layer its states after [held_from, length). A sequence moved
// through a record at random points goes on exactly in the importer.
TEST(KVPoolKinds, RecordsOfEveryKindRoundTripAndTheImporterGoesOnExactly) {
  long reads = 0, trips = 0, states = 0, rewinds = 0, trees = 0;
  for (int seed = 1; seed <= 24 && !HasFailure(); ++seed) {
    KindsPoolCase c(config_of(kKinds, 48, 4, 2), kSlots, /*arena=*/false, static_cast<std::uint64_t>(seed) + 1000);
    c.run(90, /*records=*/true);
    reads += c.reads_checked, trips += c.round_trips, states += c.states_carried, rewinds += c.rewinds;
    trees += c.trees;
  }
  std::printf("round trips %ld states carried %ld reads %ld rewinds %ld trees %ld\n", trips, states, reads, rewinds,
              trees);
  // Measured 2026-12-05 (kvcore_test::Rng): 224 round trips, 980 states carried, 4,874 reads, 440 rewinds.
  EXPECT_GT(trips, 100);
  EXPECT_GT(states, 200);  // verify steps' states too, not only the last one
  EXPECT_GT(reads, 500);
  EXPECT_GT(rewinds, 40);
}

// --- one small pool for the refusals ------------------------------------------------

struct Small {
  std::unique_ptr<SequenceCache> cache;
  std::unique_ptr<KVPool> pool;
  std::vector<std::size_t> slots{0, 0, 16};
  Small() {
    cache = take(SequenceCache::create(config_of({LayerPolicy::flat(), LayerPolicy::shared(0), LayerPolicy::state(3)}, 32, 2, 4)));
    pool.reset(new KVPool(take(KVPool::create(*cache, DType::UInt8, kvcore::PoolAllocator::heap(),
                                                    kvcore::RingStorage::Compact, StateSlotBytes{slots.data(), 3}))));
  }
};

TEST(KVPoolKinds, SharedLayersStoreNothingAndStateLayersTheirSlots) {
  Small s;
  EXPECT_EQ(s.pool->layer(1)->rows, 0);
  EXPECT_EQ(s.pool->layer(2)->rows, 3);
  EXPECT_EQ(s.pool->layer(2)->allocated_rows, 3);  // allocated in full
  // flat: 4 initial rows of 16 + 16 bytes; shared: none; state: 3 slots of 16.
  EXPECT_EQ(s.pool->reserved_bytes(), 4u * 32u + 3u * 16u);
  EXPECT_EQ(s.pool->used_bytes(2), 2u * 32u + 2u * 16u);
  const std::size_t need = *KVPool::required_bytes(
      config_of({LayerPolicy::flat(), LayerPolicy::shared(0), LayerPolicy::state(3)}, 32, 2, 4), DType::UInt8,
      kvcore::RingStorage::Compact, StateSlotBytes{s.slots.data(), 3});
  const std::size_t without = *KVPool::required_bytes(config_of({LayerPolicy::flat()}, 32, 2, 4), DType::UInt8);
  auto table = [](std::size_t n) { return (n * sizeof(kvcore::PoolLayer) + 63) / 64 * 64; };
  EXPECT_EQ(need - without, table(3) - table(1) + 64);  // two more table entries, one 64-byte state block
  auto step = s.cache->begin_step(2);
  ASSERT_TRUE(step.ok());
  const SeqStepPlan plan = *s.cache->plan(2, *step);
  std::vector<unsigned char> zeros(16, 7);
  ASSERT_TRUE(s.pool->read_state(2, plan, zeros.data(), zeros.size()).ok());
  EXPECT_EQ(zeros, std::vector<unsigned char>(16, 0));  // position 0: the state starts at zeros
  std::vector<unsigned char> state(16, 9);
  ASSERT_TRUE(s.pool->write_state(2, plan, state.data(), state.size()).ok());
  EXPECT_EQ(std::memcmp(*s.pool->state_slot(2, plan.write[0].row), state.data(), 16), 0);
}

TEST(KVPoolKinds, AStateLayerNeedsAPositiveSlotSizeThatFits) {
  auto c = take(SequenceCache::create(config_of({LayerPolicy::flat(), LayerPolicy::state(3)}, 32, 2, 4)));
  const CacheConfig cfg = config_of({LayerPolicy::flat(), LayerPolicy::state(3)}, 32, 2, 4);
  expect_refused(KVPool::create(*c, DType::UInt8).status(), Error::InvalidArgument,
                 "layer 1 is a State layer: its state slot size is missing (state_slot_bytes has 0 entries, needs one per layer)");
  const std::size_t one[1] = {8};
  expect_refused(KVPool::required_bytes(cfg, DType::UInt8, kvcore::RingStorage::Compact, StateSlotBytes{one, 1}).status(),
                 Error::InvalidArgument, "state_slot_bytes has 1 entries");
  const std::size_t zero[2] = {0, 0};
  expect_refused(KVPool::create(*c, DType::UInt8, kvcore::PoolAllocator::heap(), kvcore::RingStorage::Compact,
                                StateSlotBytes{zero, 2})
                     .status(),
                 Error::InvalidArgument, "layer 1 is a State layer: state_slot_bytes[1] = 0: a slot needs >= 1 byte");
  const std::size_t huge[2] = {0, SIZE_MAX / 2};
  std::vector<unsigned char> arena(4096);
  expect_refused(KVPool::in_arena(*c, DType::UInt8, arena.data(), arena.size(), kvcore::RingStorage::Compact,
                                  StateSlotBytes{huge, 2})
                     .status(),
                 Error::InvalidArgument, "state_slot_bytes[1] = 9223372036854775807: a slot holds at most 2^31 - 1 bytes");
  // A record names a state's bytes in an int32: 2^31 is refused without allocating anything.
  const std::size_t big[2] = {0, std::size_t{1} << 31};
  expect_refused(KVPool::required_bytes(cfg, DType::UInt8, kvcore::RingStorage::Compact, StateSlotBytes{big, 2}).status(),
                 Error::InvalidArgument,
                 "layer 1 is a State layer: state_slot_bytes[1] = 2147483648: a slot holds at most 2^31 - 1 bytes");
}

TEST(KVPoolKinds, WritingASharedLayerIsRefusedNamingItsSource) {
  Small s;
  auto step = s.cache->begin_step(2);
  ASSERT_TRUE(step.ok());
  const SeqStepPlan plan = *s.cache->plan(1, *step);
  std::vector<unsigned char> kv(2 * kHeadDim, 1);
  expect_refused(s.pool->write(1, plan, kv.data(), kv.size(), kv.data(), kv.size()), Error::InvalidArgument,
                 "write: layer 1 is Shared(0): it writes nothing; write layer 0");
  expect_refused(s.pool->write_values(1, plan, DType::UInt8, kv.data(), kv.size(), kv.data(), kv.size()),
                 Error::InvalidArgument, "write_values: layer 1 is Shared(0)");
  auto tree_cache = take(SequenceCache::create(config_of({LayerPolicy::flat(), LayerPolicy::shared(0)}, 32, 2, 4)));
  auto tree_pool = take(KVPool::create(*tree_cache, DType::UInt8));
  const int parents[2] = {-1, 0};
  auto tree_step = tree_cache->begin_tree(parents, 2);
  ASSERT_TRUE(tree_step.ok());
  expect_refused(kvcore::write_tree(tree_pool, 1, *tree_cache->plan(1, *tree_step), **tree_cache->tree(*tree_step),
                                    kv.data(), kv.size(), kv.data(), kv.size()),
                 Error::InvalidArgument, "write_tree: layer 1 is Shared(0)");
  // The source's rows are what the shared layer reads, through every read verb.
  ASSERT_TRUE(s.pool->write(0, *s.cache->plan(0, *step), kv.data(), kv.size(), kv.data(), kv.size()).ok());
  const kvcore::KVViews a = *s.pool->views(1, plan), b = *s.pool->views(0, *s.cache->plan(0, *step));
  ASSERT_EQ(a.n, 1);
  EXPECT_EQ(a.span[0].k, b.span[0].k);
  const kvcore::HeldRows held = *s.pool->held_rows(1, plan);
  EXPECT_EQ(held.k, s.pool->layer(0)->k);
  EXPECT_EQ(held.rows, 2);
  EXPECT_EQ(held.end, 2);
  SeqStepPlan none = plan;
  none.n_read = 0;
  expect_refused(s.pool->held_rows(1, none).status(), Error::InvalidArgument, "held_rows of layer 1: the plan reads nothing");
}

TEST(KVPoolKinds, KVVerbsRefuseStateLayersAndStateVerbsTheOtherKinds) {
  Small s;
  auto step = s.cache->begin_step(2);
  ASSERT_TRUE(step.ok());
  const SeqStepPlan state_plan = *s.cache->plan(2, *step), flat_plan = *s.cache->plan(0, *step);
  std::vector<unsigned char> buf(64, 0);
  expect_refused(s.pool->write(2, state_plan, buf.data(), 16, buf.data(), 0), Error::InvalidArgument,
                 "write of layer 2: a State layer holds state slots, not K/V rows (use write_state, read_state, state_slot)");
  expect_refused(s.pool->gather(2, state_plan, buf.data(), 64, buf.data(), 64), Error::InvalidArgument,
                 "gather of layer 2: a State layer");
  expect_refused(s.pool->views(2, state_plan).status(), Error::InvalidArgument, "views of layer 2: a State layer");
  expect_refused(s.pool->held_rows(2, state_plan).status(), Error::InvalidArgument, "held_rows of layer 2: a State layer");
  expect_refused(s.pool->write_state(0, flat_plan, buf.data(), 32), Error::InvalidArgument,
                 "write_state of layer 0: a Flat layer has no state slots (the state verbs take State layers)");
  expect_refused(s.pool->read_state(1, flat_plan, buf.data(), 64), Error::InvalidArgument,
                 "read_state of layer 1: a Shared layer has no state slots");
  expect_refused(s.pool->state_slot(0, 0).status(), Error::InvalidArgument, "state_slot of layer 0: a Flat layer");
  expect_refused(s.pool->state_slot(2, 3).status(), Error::InvalidArgument,
                 "state_slot of layer 2: slot = 3: must be in [0, D = 3)");
  expect_refused(s.pool->state_slot(2, -1).status(), Error::InvalidArgument, "slot = -1");
  // Nothing was written by any refusal.
  for (int slot = 0; slot < 3; ++slot)
    EXPECT_EQ(std::memcmp(*s.pool->state_slot(2, slot), std::vector<unsigned char>(16, 0).data(), 16), 0);
}

TEST(KVPoolKinds, StateVerbsCheckTheirPlansAndBuffers) {
  Small s;
  auto step = s.cache->begin_step(2, /*verify=*/true);
  ASSERT_TRUE(step.ok());
  const SeqStepPlan plan = *s.cache->plan(2, *step);
  ASSERT_EQ(plan.write_len(), 2);
  std::vector<unsigned char> states(32, 3);
  expect_refused(s.pool->write_state(2, plan, states.data(), 31), Error::InvalidArgument,
                 "write_state of layer 2: states has 31 bytes, must be exactly 2 rows of 16 bytes = 32");
  expect_refused(s.pool->write_state(2, plan, nullptr, 32), Error::InvalidArgument, "write_state of layer 2: states is null");
  expect_refused(s.pool->write_state(2, plan, *s.pool->state_slot(2, 1), 32), Error::InvalidArgument,
                 "write_state of layer 2: the states overlap the layer's slots: pass a copy");
  SeqStepPlan outside = plan;
  outside.write[0].row = 2;  // rows 2, 3 of 3
  expect_refused(s.pool->write_state(2, outside, states.data(), 32), Error::InvalidArgument,
                 "write run 0 of layer 2 (row 2, len 2, pos 0): must lie in rows [0, 3)");
  SeqStepPlan two = plan;
  two.n_read = 1;
  two.read[0] = kvcore::Run{0, 2, 0};
  expect_refused(s.pool->read_state(2, two, states.data(), 32), Error::InvalidArgument,
                 "read_state of layer 2: the plan reads 2 slots: a step starts from one state (none at position 0)");
  expect_refused(s.pool->read_state(2, plan, states.data(), 15), Error::InvalidArgument,
                 "read_state of layer 2: out has 15 bytes, needs at least 1 rows of 16 bytes = 16");
  for (int slot = 0; slot < 3; ++slot)
    EXPECT_EQ(std::memcmp(*s.pool->state_slot(2, slot), std::vector<unsigned char>(16, 0).data(), 16), 0);
}

TEST(KVPoolKinds, TreeStateVerbsCheckTheTreeAndTheNode) {
  Small s;
  const int parents[2] = {-1, 0};
  auto step = s.cache->begin_tree(parents, 2);
  ASSERT_TRUE(step.ok());
  const kvcore::DraftTree& tree = **s.cache->tree(*step);
  const SeqStepPlan plan = *s.cache->plan(2, *step);
  std::vector<unsigned char> states(32, 3);
  SeqStepPlan short_plan = plan;
  short_plan.write[0].len = 1;
  expect_refused(kvcore::write_state_tree(*s.pool, 2, short_plan, tree, states.data(), 16), Error::InvalidArgument,
                 "write_state_tree of layer 2: the plan (1 write runs, 1 rows) is not the tree's step (2 nodes at position 0)");
  expect_refused(kvcore::write_state_tree(*s.pool, 0, *s.cache->plan(0, *step), tree, states.data(), 32),
                 Error::InvalidArgument, "write_state_tree of layer 0: a Flat layer has no state slots");
  expect_refused(kvcore::write_state_tree(*s.pool, 2, plan, tree, states.data(), 16), Error::InvalidArgument,
                 "write_state_tree of layer 2: states has 16 bytes, must be exactly 2 rows of 16 bytes = 32");
  expect_refused(kvcore::node_read_slot(*s.pool, 2, plan, tree, 2).status(), Error::InvalidArgument,
                 "node_read_slot of layer 2: node = 2: must be in [0, N = 2)");
  SeqStepPlan two = plan;
  two.n_read = 2;
  two.read[0] = kvcore::Run{0, 1, 0};
  two.read[1] = kvcore::Run{1, 1, 1};
  expect_refused(kvcore::node_read_slot(*s.pool, 2, two, tree, 0).status(), Error::InvalidArgument,
                 "node_read_slot of layer 2: the plan reads 2 runs of 2 slots: a step starts from one state");
  SeqStepPlan far = plan;
  far.n_read = 1;
  far.read[0] = kvcore::Run{7, 1, 0};
  expect_refused(kvcore::node_read_slot(*s.pool, 2, far, tree, 0).status(), Error::InvalidArgument,
                 "node_read_slot of layer 2: read slot 7: must be in [0, D = 3)");
  EXPECT_EQ(*kvcore::node_read_slot(*s.pool, 2, plan, tree, 0), -1);  // the root at position 0: zeros
  // Node 1 starts from its parent's slot. Its parent, node 0, is the root: on the main line at
  // depth 0, so chain index 0 (docs/trees.md, "Layout"), written where the chain plan writes
  // position + 0: the first row of the plan's first write run.
  EXPECT_EQ(tree.chain_indices()[0], 0);
  ASSERT_GE(plan.n_write, 1);
  ASSERT_GE(plan.write[0].len, 1);
  EXPECT_EQ(*kvcore::node_read_slot(*s.pool, 2, plan, tree, 1), plan.write[0].row);
}

}  // namespace
