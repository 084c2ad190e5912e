// Named scenarios for docs/design.md section 9, one per rule (the brute-force
// oracle in layer_kinds_brute_force_test.cpp covers random mixtures), and the
// config, cache and byte-layer refusals of the new kinds.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "kvcore/batch/batch_cache.h"
#include "kvcore/core/sequence_cache.h"
#include "kvcore/pool/kv_pool.h"
#include "kvcore/pool/paged_kv_pool.h"
#include "kvcore/state/sequence_export.h"

namespace {

using kvcore::BatchCache;
using kvcore::CacheConfig;
using kvcore::Error;
using kvcore::LayerConfig;
using kvcore::LayerPolicy;
using kvcore::SeqStepPlan;
using kvcore::SequenceCache;

// One layer per policy: K/V layers 2 heads x 8, state layers no rows.
CacheConfig kinds_config(int capacity, int max_step, const std::vector<LayerPolicy>& policies) {
  CacheConfig cfg;
  cfg.capacity = capacity;
  cfg.max_step = max_step;
  cfg.n_layers = static_cast<int>(policies.size());
  for (const LayerPolicy& p : policies)
    cfg.layers.push_back(p.kind == LayerPolicy::Kind::State ? LayerConfig{p, 0, 0, 0} : LayerConfig{p, 2, 8, 0});
  return cfg;
}

std::unique_ptr<SequenceCache> make(const CacheConfig& cfg) {
  auto made = SequenceCache::create(cfg);
  EXPECT_TRUE(made.ok()) << made.status().message().c_str();
  return made.ok() ? std::move(*made) : nullptr;
}

void expect_refused(const kvcore::Status& st, Error code, const std::string& words) {
  EXPECT_EQ(st.code(), code) << st.message().c_str();
  EXPECT_NE(std::string(st.message().c_str()).find(words), std::string::npos) << st.message().c_str();
}

void commit_step(SequenceCache& c, int T, bool verify = false) {
  auto s = c.begin_step(T, verify);
  ASSERT_TRUE(s.ok()) << s.status().message().c_str();
  ASSERT_TRUE(c.commit(*s).ok());
}

// --- chunked attention ---------------------------------------------------------

TEST(LayerKinds, ChunkedQuerySeesOnlyItsOwnChunkAcrossABoundaryInOneStep) {
  auto c = make(kinds_config(64, 4, {LayerPolicy::chunked(4)}));
  commit_step(*c, 2);
  auto s = c->begin_step(4);  // positions 2..5 straddle chunks [0, 4) and [4, 8)
  ASSERT_TRUE(s.ok());
  const SeqStepPlan plan = *c->plan(0, *s);
  ASSERT_EQ(plan.n_read, 1);
  EXPECT_EQ(plan.read[0], (kvcore::Run{0, 6, 0}));  // from the first query's chunk start
  EXPECT_TRUE(*c->visible(0, 3, 0));
  EXPECT_FALSE(*c->visible(0, 4, 3));  // a new chunk sees nothing before it
  EXPECT_TRUE(*c->visible(0, 5, 4));
  EXPECT_FALSE(*c->visible(0, 5, 6));  // never the future
}

TEST(LayerKinds, ChunkedLivesInARingOfChunkPlusMaxStepMinusOneRows) {
  auto c = make(kinds_config(100, 3, {LayerPolicy::chunked(8)}));
  const kvcore::LayerGeometry g = *c->geometry(0);
  EXPECT_EQ(g.rows, 8 + 3 - 1);
  EXPECT_EQ(g.ring_rows, 10);
  EXPECT_EQ(g.sink_rows, 0);
  EXPECT_EQ(g.mirror_rows(), 9);  // a read that wraps is one span with a mirror
  auto small = make(kinds_config(9, 3, {LayerPolicy::chunked(8)}));
  EXPECT_FALSE(small->geometry(0)->wraps());  // the capacity is smaller: row(p) = p
}

TEST(LayerKinds, ChunkedRewindIsExactFromWhatRowsHold) {
  auto c = make(kinds_config(100, 2, {LayerPolicy::chunked(4)}));  // 5 rows
  for (int i = 0; i < 5; ++i) commit_step(*c, 2);                  // length 10, rows hold 5..9
  EXPECT_TRUE(c->can_rewind(8));   // a query at 8 needs nothing below 8
  EXPECT_TRUE(c->can_rewind(9));   // needs 8
  EXPECT_FALSE(c->can_rewind(7));  // needs 4, 5, 6: 4 is gone
  EXPECT_FALSE(c->can_rewind(5));  // needs 4
  EXPECT_TRUE(c->can_rewind(4));   // a chunk start needs nothing
  EXPECT_FALSE(c->can_rewind(3));  // needs 0, 1, 2
  expect_refused(c->rewind(7), Error::InvalidState, "layer 0 needs position 4");
}

// --- shared K/V ----------------------------------------------------------------

TEST(LayerKinds, SharedLayerHoldsNoRowsWritesNothingAndReadsItsSourcesPlan) {
  auto c = make(kinds_config(64, 4, {LayerPolicy::ring(6, 1), LayerPolicy::flat(), LayerPolicy::shared(0)}));
  EXPECT_EQ(*c->rows(2), 0);
  EXPECT_EQ(c->row_layer(2), 0);
  EXPECT_EQ(c->row_layer(1), 1);
  for (int i = 0; i < 5; ++i) commit_step(*c, 3);
  auto s = c->begin_step(4);
  ASSERT_TRUE(s.ok());
  SeqStepPlan source = *c->plan(0, *s), shared = *c->plan(2, *s);
  EXPECT_EQ(shared.n_write, 0);
  source.n_write = 0;
  EXPECT_EQ(shared, source);
  for (int q = 15; q < 19; ++q)
    for (int k = 0; k <= q; ++k) EXPECT_EQ(*c->visible(2, q, k), *c->visible(0, q, k)) << q << " " << k;
  ASSERT_TRUE(c->commit(*s).ok());
  // Its rewinds are its source's: the shared layer adds no constraint.
  auto alone = make(kinds_config(64, 4, {LayerPolicy::ring(6, 1), LayerPolicy::flat()}));
  for (int i = 0; i < 5; ++i) commit_step(*alone, 3);
  commit_step(*alone, 4);
  for (int n = 0; n <= c->length(); ++n) EXPECT_EQ(c->can_rewind(n), alone->can_rewind(n)) << n;
}

TEST(LayerKinds, SharedLayerCopiesNoRowsOnATreeCommit) {
  auto c = make(kinds_config(64, 4, {LayerPolicy::flat(), LayerPolicy::shared(0)}));
  const int parents[3] = {-1, 0, 0};
  auto s = c->begin_tree(parents, 3);
  ASSERT_TRUE(s.ok());
  int rows[3];
  ASSERT_TRUE(c->tree_rows(1, *s, rows).ok());  // the source's rows, which it reads
  EXPECT_EQ(rows[2], 2);
  const int path[2] = {0, 2};
  ASSERT_TRUE(c->commit(*s, path, 2).ok());
  EXPECT_EQ(c->commit_copies(0)->n, 1);
  EXPECT_EQ(c->commit_copies(1)->n, 0);
}

// --- recurrent state -------------------------------------------------------------

TEST(LayerKinds, StateStepReadsTheStateAfterPMinusOne) {
  auto c = make(kinds_config(64, 4, {LayerPolicy::state(5)}));
  auto first = c->begin_step(3);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(c->plan(0, *first)->n_read, 0);  // position 0 starts from zeros
  ASSERT_TRUE(c->commit(*first).ok());
  auto s = c->begin_step(2);
  const SeqStepPlan plan = *c->plan(0, *s);
  ASSERT_EQ(plan.n_read, 1);
  EXPECT_EQ(plan.read[0], (kvcore::Run{2, 1, 2}));  // slot(2) = 2 mod 5 holds the state after 2
}

TEST(LayerKinds, StateVerifyStepKeepsEveryStateOtherStepsOnlyTheLast) {
  auto c = make(kinds_config(64, 4, {LayerPolicy::state(5)}));
  commit_step(*c, 4);  // keeps only the state after 3
  EXPECT_TRUE(c->can_rewind(4));
  EXPECT_FALSE(c->can_rewind(3));
  EXPECT_TRUE(c->can_rewind(0));
  auto s = c->begin_step(3, true);  // positions 4, 5, 6 in slots 4, 0, 1
  const SeqStepPlan plan = *c->plan(0, *s);
  ASSERT_EQ(plan.n_write, 2);
  EXPECT_EQ(plan.write[0], (kvcore::Run{4, 1, 4}));
  EXPECT_EQ(plan.write[1], (kvcore::Run{0, 2, 5}));
  ASSERT_TRUE(c->commit(*s).ok());
  EXPECT_TRUE(c->can_rewind(5));
  EXPECT_TRUE(c->can_rewind(6));
  ASSERT_TRUE(c->rewind(5).ok());  // the state after 4 is in slot 4: nothing recomputed
}

TEST(LayerKinds, StateVerifyStepLongerThanSlotsMinusOneIsRefused) {
  auto c = make(kinds_config(64, 8, {LayerPolicy::flat(), LayerPolicy::state(4)}));
  expect_refused(c->begin_step(4, true).status(), Error::InvalidArgument, "needs T <= slots - 1 = 3");
  EXPECT_TRUE(c->begin_step(4, false).ok());  // keeps only its last state
  const int chain[4] = {-1, 0, 1, 2};
  expect_refused(c->begin_tree(chain, 4).status(), Error::InvalidArgument, "layer 1 keeps 4 state slots");
}

TEST(LayerKinds, StatePartialCommitNeedsAVerifyStep) {
  auto c = make(kinds_config(64, 4, {LayerPolicy::state(5)}));
  auto s = c->begin_step(3);
  const int path[2] = {0, 1};
  expect_refused(c->commit(*s, path, 2), Error::InvalidState, "no longer holds the state after position 1");
  EXPECT_TRUE(c->check_step(*s).ok());  // nothing changed: the step is still begun
  ASSERT_TRUE(c->abort(*s).ok());
  auto v = c->begin_step(3, true);
  ASSERT_TRUE(c->commit(*v, path, 2).ok());
  EXPECT_EQ(c->length(), 2);
}

TEST(LayerKinds, StateTreeNodeReadsItsParentsSlotAndTheCommitCopiesSlots) {
  auto c = make(kinds_config(64, 4, {LayerPolicy::state(5)}));
  commit_step(*c, 2);
  const int parents[4] = {-1, 0, 0, 2};  // main line 0, 1; branch 2 -> 3
  auto s = c->begin_tree(parents, 4);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->verify);
  int slots[4];
  ASSERT_TRUE(c->tree_rows(0, *s, slots).ok());
  // Node i writes the slot of position 2 + chain index; node 3 (depth 2) reads node 2's.
  EXPECT_EQ(slots[0], 2);
  EXPECT_EQ(slots[1], 3);
  const SeqStepPlan plan = *c->plan(0, *s);
  EXPECT_EQ(plan.read[0], (kvcore::Run{1, 1, 1}));  // the root reads the state after 1
  std::uint8_t mask[4];
  expect_refused(c->dense_tree_mask(0, *s, mask), Error::InvalidArgument, "layer 0 is a State layer: it has no keys");
  const int path[3] = {0, 2, 3};
  ASSERT_TRUE(c->commit(*s, path, 3).ok());
  const kvcore::RowCopies copies = *c->commit_copies(0);
  ASSERT_EQ(copies.n, 2);  // node 2 -> slot of position 3, node 3 -> slot of position 4
  EXPECT_EQ(copies.copies[0].src, slots[2]);
  EXPECT_EQ(copies.copies[0].dst, 3);
  EXPECT_EQ(copies.copies[1].src, slots[3]);
  EXPECT_EQ(copies.copies[1].dst, 4);
  EXPECT_TRUE(c->can_rewind(4));  // every accepted state sits at its position's slot
  EXPECT_TRUE(c->can_rewind(3));
}

TEST(LayerKinds, StateAbortThatOverwroteTheReadSlotBlocksTheNextStep) {
  auto c = make(kinds_config(64, 4, {LayerPolicy::state(2)}));
  commit_step(*c, 3);  // the state after 2 in slot 0
  auto s = c->begin_step(2);  // its last state (after 4) goes to slot 0 too: read, then overwritten
  ASSERT_TRUE(c->abort(*s).ok());
  expect_refused(c->begin_step(1).status(), Error::InvalidState, "no longer holds the state after position 2");
  EXPECT_FALSE(c->can_rewind(3));
  EXPECT_TRUE(c->can_rewind(0));
  ASSERT_TRUE(c->rewind(0).ok());
  EXPECT_TRUE(c->begin_step(1).ok());
}

// --- mixed models -----------------------------------------------------------------

TEST(LayerKinds, TheMostRestrictiveLayerDecidesCanRewind) {
  auto c = make(kinds_config(256, 4,
                             {LayerPolicy::flat(), LayerPolicy::ring(8, 2), LayerPolicy::chunked(8),
                              LayerPolicy::shared(2), LayerPolicy::state(5)}));
  for (int i = 0; i < 10; ++i) commit_step(*c, 4, true);  // length 40
  // The state layer holds the states after 35..39; the ring (13 rows) positions 29..39.
  for (int n = 0; n <= 40; ++n) {
    const bool state_ok = n == 0 || n >= 36;
    const bool ring_ok = n <= 2 || n - 8 + 1 >= 29;  // past the sinks it needs [max(2, n - 7), n)
    const bool chunk_ok = n % 8 == 0 || n - n % 8 >= 29;
    EXPECT_EQ(c->can_rewind(n), state_ok && ring_ok && chunk_ok) << n;
  }
}

// --- refusals -----------------------------------------------------------------------

TEST(LayerKindsConfig, EveryBadFieldIsNamed) {
  struct Bad {
    std::vector<LayerPolicy> policies;
    const char* words;
  };
  LayerPolicy chunk_with_sinks = LayerPolicy::chunked(4);
  chunk_with_sinks.sinks = 2;
  LayerPolicy state_with_window = LayerPolicy::state(3);
  state_with_window.window = 5;
  LayerPolicy flat_with_source = LayerPolicy::flat();
  flat_with_source.source = 1;
  LayerPolicy ring_with_slots = LayerPolicy::ring(4);
  ring_with_slots.slots = 2;
  const Bad cases[] = {
      {{LayerPolicy::chunked(0)}, "layers[0].policy.window = 0: a Chunked layer needs a chunk size window >= 1"},
      {{LayerPolicy::flat(), chunk_with_sinks}, "layers[1].policy.sinks = 2: a Chunked layer needs sinks == 0"},
      {{state_with_window}, "layers[0].policy.window = 5: a State layer needs window == 0"},
      {{flat_with_source}, "layers[0].policy.source = 1: a Flat layer needs source == 0"},
      {{ring_with_slots}, "layers[0].policy.slots = 2: a Ring layer needs slots == 0"},
      {{LayerPolicy::state(0)}, "layers[0].policy.slots = 0: a State layer needs slots >= 1"},
      {{LayerPolicy::flat(), LayerPolicy::shared(1)}, "layers[1].policy.source = 1: a Shared layer reads an earlier layer"},
      {{LayerPolicy::flat(), LayerPolicy::shared(-1)}, "layers[1].policy.source = -1"},
      {{LayerPolicy::state(2), LayerPolicy::shared(0)}, "layer 0 is kind 4; a Shared layer's source must hold K/V rows"},
      {{LayerPolicy::flat(), LayerPolicy::shared(0), LayerPolicy::shared(1)}, "layer 1 is kind 3"},
  };
  for (const Bad& b : cases) {
    const CacheConfig cfg = kinds_config(64, 4, b.policies);
    expect_refused(kvcore::validate(cfg), Error::InvalidArgument, b.words);
    EXPECT_FALSE(SequenceCache::create(cfg).ok());
  }
}

TEST(LayerKindsConfig, ShapesOfSharedAndStateLayersAreChecked) {
  CacheConfig shared = kinds_config(64, 4, {LayerPolicy::flat(), LayerPolicy::shared(0)});
  shared.layers[1].head_dim = 4;
  expect_refused(kvcore::validate(shared), Error::InvalidArgument,
                 "layers[1]: a Shared layer attends over layer 0's K/V: needs its n_kv_heads, head_dim, v_head_dim "
                 "(2, 4, 4) equal to the source's (2, 8, 8)");
  CacheConfig state = kinds_config(64, 4, {LayerPolicy::state(3)});
  state.layers[0].n_kv_heads = 1;
  expect_refused(kvcore::validate(state), Error::InvalidArgument, "a State layer holds no K/V rows");
  CacheConfig broadcast = kinds_config(64, 4, {LayerPolicy::shared(0)});
  broadcast.n_layers = 3;
  expect_refused(kvcore::validate(broadcast), Error::InvalidArgument, "give one entry per layer");
}

// BatchCache keeps State layers' slots (batch_state_test.cpp): a State group beside the block groups.
TEST(LayerKindsRefusals, BatchCacheKeepsStateLayersInAStateGroup) {
  CacheConfig cfg = kinds_config(64, 4, {LayerPolicy::flat(), LayerPolicy::state(3)});
  auto made = BatchCache::create(cfg);
  ASSERT_TRUE(made.ok()) << made.message().c_str();
  EXPECT_EQ((*made)->n_groups(), 1);
  EXPECT_EQ((*made)->n_state_groups(), 1);
  EXPECT_EQ(*(*made)->state_group_of(1), 0);
}

TEST(LayerKinds, PagedKVPoolStoresNothingForASharedLayer) {
  // KVPool and PagedKVPool store both kinds (kv_pool_kinds_test.cpp, paged_pool_kinds_test.cpp).
  auto batch = BatchCache::create(kinds_config(64, 4, {LayerPolicy::flat(), LayerPolicy::shared(0)}));
  ASSERT_TRUE(batch.ok());
  EXPECT_EQ(*(*batch)->group_of(1), *(*batch)->group_of(0));  // the shared layer reads its source's group
  auto pool = kvcore::PagedKVPool::create(**batch, kvcore::DType::Float32);
  ASSERT_TRUE(pool.ok()) << pool.message().c_str();
  EXPECT_EQ(pool->layer(1)->rows, 0);
  EXPECT_EQ(pool->reserved_bytes(), static_cast<std::size_t>(pool->layer(0)->storage_rows()) *
                                       (pool->layer(0)->k_row_bytes + pool->layer(0)->v_row_bytes));
}

// restore() (what import_record calls) holds a State layer to what a record
// may carry: the last state, at most D; nothing changes on a refusal.
TEST(LayerKindsRefusals, RestoreKeepsAStateLayersLastStateAndAtMostDStates) {
  auto c = make(kinds_config(64, 4, {LayerPolicy::flat(), LayerPolicy::state(3)}));
  expect_refused(c->restore(5, [](int l) { return l == 1 ? 5 : 0; }), Error::InvalidArgument,
                 "layer 1 is State(slots 3): held_from = 5 at length 5 must keep the last state and at most 3");
  expect_refused(c->restore(5, [](int l) { return l == 1 ? 1 : 0; }), Error::InvalidArgument,
                 "held_from = 1 at length 5");
  EXPECT_EQ(c->length(), 0);
  ASSERT_TRUE(c->restore(5, [](int l) { return l == 1 ? 2 : 0; }).ok());
  EXPECT_EQ(c->held_from(1), 2);
  for (int n = 0; n <= 5; ++n) EXPECT_EQ(c->can_rewind(n), n == 0 || n >= 3) << n;
}

}  // namespace
