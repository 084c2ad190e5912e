// Block tables sized by use (issue 19, item 3): BatchLimits::max_active_seqs
// bounds the sequences active at once, and each group keeps one table row per
// active sequence instead of one per id. A sequence takes a free row when it
// becomes active (add_sequence, fork into an inactive one) and gives it back
// when released; past the bound those verbs fail with OutOfResources and
// change nothing. Plans name each sequence's row (table_rows), and a bounded
// cache plans every step as an unbounded one does.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "kvcore/batch/batch_cache.h"
#include "support/counting_new.h"

namespace kvcore_test {
namespace {

using kvcore::BatchCache;
using kvcore::BatchStepPlan;
using kvcore::CacheConfig;
using kvcore::Error;
using kvcore::LayerConfig;
using kvcore::LayerPolicy;
using kvcore::StepEntry;

// A flat and a ring group, blocks of 4 rows, 6 ids, `active` rows.
CacheConfig two_groups(int active) {
  CacheConfig cfg;
  cfg.capacity = 64;
  cfg.n_layers = 2;
  cfg.layers = {LayerConfig{LayerPolicy::flat(), 1, 4, 0}, LayerConfig{LayerPolicy::ring(6, 2), 1, 4, 0}};
  cfg.max_step = 4;
  cfg.batch.block_size = 4;
  cfg.batch.max_seqs = 6;
  cfg.batch.num_blocks = 64;
  cfg.batch.max_active_seqs = active;
  return cfg;
}

std::unique_ptr<BatchCache> make(const CacheConfig& cfg) {
  auto created = BatchCache::create(cfg);
  EXPECT_TRUE(created.ok()) << created.message().c_str();
  return created.ok() ? std::move(*created) : nullptr;
}

// Everything a caller can see of the cache but the rows' placement: each
// sequence's state, blocks held, and its table as its row shows it.
std::vector<int> observable(const BatchCache& c) {
  std::vector<int> v;
  for (int g = 0; g < c.n_groups(); ++g) v.push_back(*c.free_blocks(g));
  for (int s = 0; s < c.max_seqs(); ++s) {
    const kvcore::SequenceInfo info = *c.sequence(s);
    v.insert(v.end(), {info.active, info.length, info.visible_start, info.n_holes, c.table_rows()[s] >= 0});
    for (int g = 0; g < c.n_groups(); ++g) {
      v.push_back(*c.blocks_held(s, g));
      if (c.table_rows()[s] < 0) continue;
      const int* row = c.block_tables(g) + static_cast<std::ptrdiff_t>(c.table_rows()[s]) * c.table_stride();
      v.insert(v.end(), row, row + c.table_stride());
    }
  }
  return v;
}

TEST(BatchTableRows, DefaultRowIsTheSequenceId) {
  auto cache = make(two_groups(0));
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(cache->max_active_seqs(), 6);
  EXPECT_EQ(cache->free_table_rows(), 6);
  ASSERT_TRUE(cache->add_sequence(3).ok());
  const StepEntry e{3, 2, nullptr};
  auto step = cache->begin_step(&e, 1);
  ASSERT_TRUE(step.ok());
  const BatchStepPlan plan = *cache->plan(*step);
  EXPECT_EQ(plan.table_rows[3], 3);
  const int* dense = plan.groups[0].block_tables + 3 * plan.groups[0].table_stride;  // unpaged: row 3
  const kvcore::TableRow row = kvcore::table_row(plan, 0, 0);
  for (int i = 0; i < plan.groups[0].table_stride; ++i) EXPECT_EQ(row[i], dense[i]) << i;
  EXPECT_GE(row[0], 0);
}

// docs/batch.md sections 2 and 4, one rule with or without the bound:
// free_table_rows() is max_active_seqs() less the active sequences, and
// table_rows() is -1 for an inactive id (an active one's row is its id by
// default). Before issue 27 the default counted max_seqs and named every id.
TEST(BatchTableRows, WithoutTheBoundFreeRowsCountTheInactiveAndInactiveIdsHaveNoRow) {
  for (const int active : {0, 6}) {  // 0: the default, max_seqs
    auto cache = make(two_groups(active));
    ASSERT_NE(cache, nullptr);
    auto rows = [&] { return std::vector<int>(cache->table_rows(), cache->table_rows() + 6); };
    EXPECT_EQ(rows(), std::vector<int>(6, -1));
    EXPECT_EQ(cache->free_table_rows(), 6);
    ASSERT_TRUE(cache->add_sequence(3).ok());
    ASSERT_TRUE(cache->add_sequence(0).ok());
    EXPECT_EQ(cache->free_table_rows(), 4);
    EXPECT_EQ(rows(), (std::vector<int>{0, -1, -1, 3, -1, -1}));
    ASSERT_TRUE(cache->fork(3, 5, 0).ok());  // into an inactive id: it becomes active
    ASSERT_TRUE(cache->fork(3, 0, 0).ok());  // into an active, empty one: no row taken
    EXPECT_EQ(cache->free_table_rows(), 3);
    EXPECT_EQ(rows(), (std::vector<int>{0, -1, -1, 3, -1, 5}));
    ASSERT_TRUE(cache->release_sequence(3).ok());
    EXPECT_EQ(cache->free_table_rows(), 4);
    EXPECT_EQ(rows(), (std::vector<int>{0, -1, -1, -1, -1, 5}));
    EXPECT_EQ(cache->add_sequence(5).code(), Error::InvalidState);  // refused: nothing changes
    EXPECT_EQ(cache->free_table_rows(), 4);
    for (int s : {1, 2, 3, 4}) ASSERT_TRUE(cache->add_sequence(s).ok());
    EXPECT_EQ(cache->free_table_rows(), 0);
    EXPECT_EQ(rows(), (std::vector<int>{0, 1, 2, 3, 4, 5}));
    cache->clear();
    EXPECT_EQ(cache->free_table_rows(), 6);
    EXPECT_EQ(rows(), std::vector<int>(6, -1));
  }
}

TEST(BatchTableRows, ActiveSequencesTakeAndGiveBackRows) {
  auto cache = make(two_groups(2));
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(cache->max_active_seqs(), 2);
  EXPECT_EQ(cache->free_table_rows(), 2);
  for (int s = 0; s < 6; ++s) EXPECT_EQ(cache->table_rows()[s], -1);
  ASSERT_TRUE(cache->add_sequence(4).ok());
  EXPECT_EQ(cache->table_rows()[4], 0);  // lowest row first
  ASSERT_TRUE(cache->add_sequence(1).ok());
  EXPECT_EQ(cache->table_rows()[1], 1);
  EXPECT_EQ(cache->free_table_rows(), 0);
  const StepEntry entries[2] = {{4, 4, nullptr}, {1, 3, nullptr}};
  auto step = cache->begin_step(entries, 2);
  ASSERT_TRUE(step.ok());
  const BatchStepPlan plan = *cache->plan(*step);
  for (int g = 0; g < 2; ++g) {
    const kvcore::TableRow row = kvcore::table_row(plan, g, 1);  // sequence 1, row 1
    EXPECT_EQ(row[0], plan.groups[g].block_tables[plan.groups[g].table_stride]);
    EXPECT_EQ(plan.groups[g].slots[4], row[0] * 4);  // its first token's slot is in its row's block
  }
  ASSERT_TRUE(cache->commit(*step).ok());

  // Released: the row is free again and empty; the next sequence takes it.
  ASSERT_TRUE(cache->release_sequence(4).ok());
  EXPECT_EQ(cache->table_rows()[4], -1);
  EXPECT_EQ(cache->free_table_rows(), 1);
  for (int g = 0; g < 2; ++g)
    for (int i = 0; i < cache->table_stride(); ++i) EXPECT_EQ(cache->block_tables(g)[i], -1);
  ASSERT_TRUE(cache->fork(1, 5, cache->sequence(1)->length).ok());
  EXPECT_EQ(cache->table_rows()[5], 0);
  EXPECT_EQ(*cache->blocks_held(5, 0), 1);
  // clear(): every row free.
  cache->clear();
  EXPECT_EQ(cache->free_table_rows(), 2);
  for (int s = 0; s < 6; ++s) EXPECT_EQ(cache->table_rows()[s], -1);
}

TEST(BatchTableRows, PastTheBoundAddAndForkFailAndChangeNothing) {
  auto cache = make(two_groups(2));
  ASSERT_NE(cache, nullptr);
  ASSERT_TRUE(cache->add_sequence(0).ok());
  ASSERT_TRUE(cache->add_sequence(2).ok());
  const StepEntry e{0, 3, nullptr};
  auto step = cache->begin_step(&e, 1);
  ASSERT_TRUE(step.ok());
  ASSERT_TRUE(cache->commit(*step).ok());
  auto begun = cache->begin_step(&e, 1);  // a begun step a failing verb must not end
  ASSERT_TRUE(begun.ok());
  const std::vector<int> before = observable(*cache);

  const kvcore::Status add = cache->add_sequence(3);
  EXPECT_EQ(add.code(), Error::OutOfResources);
  EXPECT_NE(std::string(add.message().c_str()).find("batch.max_active_seqs = 2"), std::string::npos)
      << add.message().c_str();
  const kvcore::Status fork = cache->fork(0, 5, 3);
  EXPECT_EQ(fork.code(), Error::OutOfResources);
  EXPECT_NE(std::string(fork.message().c_str()).find("fork(5)"), std::string::npos) << fork.message().c_str();
  EXPECT_EQ(observable(*cache), before);
  EXPECT_TRUE(cache->check_step(*begun).ok());  // still begun
  EXPECT_FALSE(cache->sequence(3)->active);
  // Into an active, empty sequence a fork needs no new row.
  ASSERT_TRUE(cache->fork(0, 2, 2).ok());
  EXPECT_EQ(cache->sequence(2)->length, 2);
}

TEST(BatchTableRows, BoundOutOfRangeIsInvalid) {
  for (const int bad : {-1, 7}) {
    auto created = BatchCache::create(two_groups(bad));
    ASSERT_FALSE(created.ok());
    EXPECT_EQ(created.status().code(), Error::InvalidArgument);
    EXPECT_NE(std::string(created.message().c_str()).find("batch.max_active_seqs = " + std::to_string(bad)),
              std::string::npos)
        << created.message().c_str();
  }
}

// Full tables past 2^31 entries are refused; the same ids with few rows build,
// and the tables (and a flat pool's default) are sized by the rows.
TEST(BatchTableRows, TablesAreSizedByTheBound) {
  CacheConfig cfg = two_groups(0);
  cfg.capacity = 1 << 19;
  cfg.batch.block_size = 1;
  cfg.batch.max_seqs = 4096;
  cfg.batch.num_blocks = 0;
  cfg.max_step = 16;
  EXPECT_EQ(BatchCache::create(cfg).status().code(), Error::InvalidArgument);  // 2 x 4096 x 2^19 entries
  cfg.batch.max_active_seqs = 2;
  auto cache = make(cfg);
  ASSERT_NE(cache, nullptr);
  // The one pool's default sums each group's: the flat group's two full rows
  // (2 x 2^19), and the ring(6, 2)'s 2 x (ceil(S/B) + ceil((W + 2C - 1)/B) + 1)
  // = 2 x (2 + 37 + 1) with B = 1, C = 16.
  EXPECT_EQ(*cache->num_blocks(0), (2 << 19) + 2 * (2 + 37 + 1));
  EXPECT_EQ(*cache->num_blocks(1), *cache->num_blocks(0));
  ASSERT_TRUE(cache->add_sequence(4000).ok());
  EXPECT_EQ(cache->table_rows()[4000], 0);
  const StepEntry e{4000, 16, nullptr};
  auto step = cache->begin_step(&e, 1);
  ASSERT_TRUE(step.ok());
  EXPECT_EQ(cache->plan(*step)->table_rows[4000], 0);
}

// The same random verbs on a bounded cache and an unbounded one: every plan
// (slots, copies, each entry's row) and everything observable agree.
TEST(BatchTableRows, BoundedPlansAsUnbounded) {
  auto bounded = make(two_groups(3));
  auto full = make(two_groups(0));
  ASSERT_NE(bounded, nullptr);
  ASSERT_NE(full, nullptr);
  std::mt19937 rng(19);
  int active = 0;
  for (int op = 0; op < 3000; ++op) {
    const int seq = static_cast<int>(rng() % 6), other = static_cast<int>(rng() % 6);
    const bool was_active = bounded->sequence(seq)->active;
    switch (rng() % 5) {
      case 0:
        if (!was_active && active == 3) {
          EXPECT_EQ(bounded->add_sequence(seq).code(), Error::OutOfResources);
          break;
        }
        EXPECT_EQ(bounded->add_sequence(seq).code(), full->add_sequence(seq).code());
        active += !was_active;
        break;
      case 1:
        EXPECT_EQ(bounded->release_sequence(seq).code(), full->release_sequence(seq).code());
        active -= was_active;
        break;
      case 2: {
        const bool dst_active = bounded->sequence(other)->active;
        if (!dst_active && active == 3 && bounded->sequence(seq)->active && seq != other &&
            bounded->can_rewind(seq, bounded->sequence(seq)->length)) {
          EXPECT_EQ(bounded->fork(seq, other, bounded->sequence(seq)->length).code(), Error::OutOfResources);
          break;
        }
        const int upto = bounded->sequence(seq)->length;
        const Error e = bounded->fork(seq, other, upto).code();
        EXPECT_EQ(e, full->fork(seq, other, upto).code());
        if (e == Error::Ok) active += !dst_active;
        break;
      }
      case 3: {
        const int n = static_cast<int>(bounded->sequence(seq)->length) - static_cast<int>(rng() % 6);
        EXPECT_EQ(bounded->rewind(seq, n).code(), full->rewind(seq, n).code());
        break;
      }
      default: {
        std::vector<StepEntry> entries;
        for (int s = 0; s < 6; ++s)
          if (bounded->sequence(s)->active && rng() % 2) entries.push_back({s, 1 + static_cast<int>(rng() % 4), nullptr});
        if (entries.empty()) break;
        auto a = bounded->begin_step(entries.data(), static_cast<int>(entries.size()));
        auto b = full->begin_step(entries.data(), static_cast<int>(entries.size()));
        ASSERT_EQ(a.status().code(), b.status().code());
        if (!a.ok()) break;
        const BatchStepPlan pa = *bounded->plan(*a), pb = *full->plan(*b);
        for (int g = 0; g < 2; ++g) {
          for (int t = 0; t < pa.n_tokens; ++t) ASSERT_EQ(pa.groups[g].slots[t], pb.groups[g].slots[t]);
          ASSERT_EQ(pa.groups[g].n_copies, pb.groups[g].n_copies);
          for (int i = 0; i < pa.n_entries; ++i)
            for (int j = 0; j < (pa.context_lens[i] + 3) / 4; ++j)
              ASSERT_EQ(kvcore::table_row(pa, g, i)[j], kvcore::table_row(pb, g, i)[j]);
        }
        if (rng() % 4 == 0) {
          ASSERT_TRUE(bounded->abort(*a).ok());
          ASSERT_TRUE(full->abort(*b).ok());
        } else {
          ASSERT_TRUE(bounded->commit(*a).ok());
          ASSERT_TRUE(full->commit(*b).ok());
        }
      }
    }
    // The same state, row placement aside (the unbounded cache's rows by id).
    for (int s = 0; s < 6; ++s) {
      ASSERT_EQ(bounded->sequence(s)->length, full->sequence(s)->length);
      ASSERT_EQ(bounded->sequence(s)->active, full->sequence(s)->active);
      ASSERT_EQ(bounded->table_rows()[s] >= 0, full->sequence(s)->active) << "op " << op;
      for (int g = 0; g < 2; ++g) ASSERT_EQ(*bounded->blocks_held(s, g), *full->blocks_held(s, g));
    }
    // Used blocks (the ring pools differ in size: each is sized per table row).
    for (int g = 0; g < 2; ++g) ASSERT_EQ(*bounded->used_blocks(g), *full->used_blocks(g));
  }
}

// Taking and giving back rows allocates nothing, refusals included.
TEST(BatchTableRows, NoAllocationAfterCreate) {
  auto cache = make(two_groups(2));
  ASSERT_NE(cache, nullptr);
  const std::uint64_t news = operator_news();
  for (int round = 0; round < 20; ++round) {
    ASSERT_TRUE(cache->add_sequence(round % 6).ok());
    ASSERT_TRUE(cache->fork(round % 6, (round + 2) % 6, 0).ok());               // the second row
    EXPECT_EQ(cache->add_sequence((round + 3) % 6).code(), Error::OutOfResources);  // no third
    const StepEntry e{round % 6, 2, nullptr};
    auto step = cache->begin_step(&e, 1);
    ASSERT_TRUE(step.ok());
    ASSERT_TRUE(cache->plan(*step).ok());
    ASSERT_TRUE(cache->commit(*step).ok());
    for (int s = 0; s < 6; ++s) {
      if (cache->sequence(s)->active) {
        ASSERT_TRUE(cache->release_sequence(s).ok());
      }
    }
  }
  EXPECT_EQ(operator_news(), news);
}

}  // namespace
}  // namespace kvcore_test
