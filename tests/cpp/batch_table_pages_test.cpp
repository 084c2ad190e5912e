// Block tables sized by use (issue 39, item 2; docs/batch.md section 5,
// "Tables sized by use"): with BatchLimits::table_page_blocks = P a row is a
// directory of pages of P entries drawn from table_pages, taken when the row
// first names a block in a page's span and given back when a drop empties it.
// The pages in use follow what the sequences hold (a ring's row costs its
// window's pages), a verb short of pages is OutOfResources and changes
// nothing, and a paged cache plans exactly as an unpaged one.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "batch_reference.h"
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

// A flat and a ring(window 8, sinks 2) group, blocks of 2 rows, pages of
// `P` entries (0: unpaged), `pages` of them (0: every row full).
CacheConfig two_groups(int P, int pages) {
  CacheConfig cfg;
  cfg.capacity = 256;
  cfg.n_layers = 2;
  cfg.layers = {LayerConfig{LayerPolicy::flat(), 1, 4, 0}, LayerConfig{LayerPolicy::ring(8, 2), 1, 4, 0}};
  cfg.max_step = 6;
  cfg.batch.block_size = 2;
  cfg.batch.max_seqs = 5;
  cfg.batch.num_blocks = 400;
  cfg.batch.max_rewind = 0;
  cfg.batch.table_page_blocks = P;
  cfg.batch.table_pages = pages;
  return cfg;
}

std::unique_ptr<BatchCache> make(const CacheConfig& cfg) {
  auto c = BatchCache::create(cfg);
  return c.ok() ? std::move(*c) : nullptr;
}

int in_use(const BatchCache& c) { return c.table_pages() - c.free_table_pages(); }

// Decodes `seq` by `n` tokens, one step each.
void decode(BatchCache& c, int seq, int n) {
  for (int k = 0; k < n; ++k) {
    const StepEntry e{seq, 1, nullptr};
    auto step = c.begin_step(&e, 1);
    ASSERT_TRUE(step.ok()) << step.status().message().c_str();
    ASSERT_TRUE(c.commit(*step).ok());
  }
}

TEST(BatchTablePages, RowsCostThePagesOfWhatTheyHold) {
  auto c = make(two_groups(4, 0));
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->table_page_blocks(), 4);
  EXPECT_EQ(c->table_pages(), 2 * 5 * 32);  // 2 groups x 5 rows x ceil(128 / 4) pages
  EXPECT_EQ(in_use(*c), 0);
  ASSERT_TRUE(c->add_sequence(0).ok());
  EXPECT_EQ(in_use(*c), 0);  // an empty row holds no page
  decode(*c, 0, 1);
  EXPECT_EQ(in_use(*c), 2);  // block 0 in each group: one page each
  decode(*c, 0, 99);         // 100 positions: blocks 0 .. 49
  // Flat: pages 0 .. 12 (ceil(50 / 4)). Ring(8, sinks 2): the sink block's
  // page 0 and the window's last blocks (positions 91 .. 99 and the block
  // after: indices 45 .. 49, pages 11 and 12); the pages between went back.
  const int flat = 13;
  const int ring = in_use(*c) - flat;
  EXPECT_LE(ring, 3);
  EXPECT_GE(ring, 2);
  EXPECT_TRUE(c->check_tables().ok());
  for (int i = 0; i < 50; ++i) EXPECT_GE(c->block_at(0, 0, i), 0) << i;
  EXPECT_EQ(c->block_at(0, 1, 20), -1);  // the window passed it
  ASSERT_TRUE(c->release_sequence(0).ok());
  EXPECT_EQ(in_use(*c), 0);
  EXPECT_TRUE(c->check_tables().ok());
}

TEST(BatchTablePages, PagesNeededIsWhatAStepTakes) {
  auto c = make(two_groups(2, 0));
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->add_sequence(1).ok());
  ASSERT_TRUE(c->add_sequence(3).ok());
  decode(*c, 1, 3);
  const int before = in_use(*c);
  const int need = *c->table_pages_needed(1, 6) + *c->table_pages_needed(3, 5);
  EXPECT_GT(need, 0);
  const StepEntry entries[2] = {{1, 6, nullptr}, {3, 5, nullptr}};
  auto step = c->begin_step(entries, 2);
  ASSERT_TRUE(step.ok());
  EXPECT_EQ(in_use(*c) - before, need);
  // An aborted step gives back the pages only it filled, with its blocks.
  ASSERT_TRUE(c->abort(*step).ok());
  EXPECT_EQ(in_use(*c), before);
  EXPECT_EQ(*c->table_pages_needed(1, 6) + *c->table_pages_needed(3, 5), need);
  EXPECT_TRUE(c->check_tables().ok());
  EXPECT_EQ(c->table_pages_needed(2, 1).status().code(), Error::InvalidState);
  EXPECT_EQ(c->table_pages_needed(1, 7).status().code(), Error::InvalidArgument);
}

// A begun step's pages count as free for a step that replaces it, and
// neither an abandoned nor a replaced step leaves pages behind (a review's
// reproducers: before, both refused the second step with every page held).
TEST(BatchTablePages, AnAbandonedStepLeavesNoPagesBehind) {
  CacheConfig cfg = two_groups(1, 8);
  cfg.layers = {LayerConfig{LayerPolicy::flat(), 1, 4, 0}};
  cfg.n_layers = 1;
  cfg.batch.block_size = 1;
  cfg.max_step = 8;
  for (const bool replace : {false, true}) {
    auto c = make(cfg);
    ASSERT_NE(c, nullptr);
    ASSERT_TRUE(c->add_sequence(0).ok());
    ASSERT_TRUE(c->add_sequence(1).ok());
    const StepEntry all{0, 8, nullptr}, one{1, 1, nullptr};
    auto first = c->begin_step(&all, 1);  // every page
    ASSERT_TRUE(first.ok());
    EXPECT_EQ(c->free_table_pages(), 0);
    if (!replace) {
      ASSERT_TRUE(c->abort(*first).ok());
      EXPECT_EQ(c->free_table_pages(), 8);
      ASSERT_TRUE(c->rewind(0, 0).ok());
    }
    auto second = c->begin_step(&one, 1);  // replaces the first: its 8 pages are free then
    ASSERT_TRUE(second.ok()) << second.status().message().c_str();
    EXPECT_EQ(c->free_table_pages(), 7);
    EXPECT_TRUE(c->check_tables().ok());
    // A replacing step that needs a page the begun one alone holds needs it again.
    const StepEntry again[2] = {{0, 8, nullptr}, {1, 1, nullptr}};
    auto third = c->begin_step(again, 2);
    EXPECT_EQ(third.status().code(), Error::OutOfResources);
    EXPECT_TRUE(c->check_step(*second).ok());  // refused: the begun step stays
    ASSERT_TRUE(c->commit(*second).ok());
    EXPECT_TRUE(c->check_tables().ok());
  }
}

TEST(BatchTablePages, ARefusalForPagesChangesNothing) {
  // 6 pages of 2 entries: 12 block indices over both groups.
  auto c = make(two_groups(2, 6));
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->add_sequence(0).ok());
  std::vector<std::int32_t> tokens(12);
  for (int i = 0; i < 12; ++i) tokens[static_cast<std::size_t>(i)] = 7 + i;
  const StepEntry first{0, 6, tokens.data()};
  auto s1 = c->begin_step(&first, 1);  // blocks 0 .. 2: pages 0, 1 in each group
  ASSERT_TRUE(s1.ok());
  ASSERT_TRUE(c->commit(*s1).ok());
  EXPECT_EQ(c->free_table_pages(), 2);
  const StepEntry grow{0, 6, tokens.data() + 6};  // blocks 3 .. 5: pages 1, 2 in each group
  EXPECT_EQ(*c->table_pages_needed(0, 6), 2);
  ASSERT_TRUE(c->add_sequence(2).ok());
  const StepEntry both[2] = {grow, {2, 6, tokens.data()}};  // 2 + 4 pages, 2 free
  const Snapshot before = snapshot(*c);
  auto refused = c->begin_step(both, 2);
  EXPECT_EQ(refused.status().code(), Error::OutOfResources);
  EXPECT_NE(std::string(refused.status().message().c_str()).find("batch.table_pages = 6"), std::string::npos)
      << refused.status().message().c_str();
  EXPECT_TRUE(snapshot(*c) == before);
  EXPECT_EQ(c->free_table_pages(), 2);
  // A fork of sequence 0 needs its 4 pages: refused, nothing changes.
  auto fork = c->fork(0, 4, 6);
  EXPECT_EQ(fork.code(), Error::OutOfResources);
  EXPECT_NE(std::string(fork.message().c_str()).find("table pages"), std::string::npos) << fork.message().c_str();
  EXPECT_TRUE(snapshot(*c) == before);
  EXPECT_FALSE(c->sequence(4)->active);
  // Adopting sequence 0's three keyed blocks needs 4 pages: refused too.
  auto adopt = c->adopt_prefix(2, tokens.data(), 12);
  EXPECT_EQ(adopt.status().code(), Error::OutOfResources);
  EXPECT_TRUE(snapshot(*c) == before);
  EXPECT_EQ(c->sequence(2)->length, 0);
  // Its own step alone fits.
  auto s2 = c->begin_step(&grow, 1);
  ASSERT_TRUE(s2.ok()) << s2.status().message().c_str();
  ASSERT_TRUE(c->commit(*s2).ok());
  EXPECT_EQ(c->free_table_pages(), 0);
  EXPECT_TRUE(c->check_tables().ok());
}

TEST(BatchTablePages, AnImportShortOfPagesChangesNothing) {
  // 12 positions, everything carried: each group keeps blocks 0 .. 5, pages
  // 0 .. 2 of its row.
  const std::int32_t bounds[4] = {0, 0, 2, 2};
  const kvcore::SequenceImport in{12, 0, 0, nullptr, nullptr, bounds, 2};
  int written = 0;
  auto count = [&written](int, int, int) { ++written; };
  auto short_of_pages = make(two_groups(2, 5));
  ASSERT_NE(short_of_pages, nullptr);
  const Snapshot before = snapshot(*short_of_pages);
  const kvcore::Status refused = short_of_pages->admit(0, in, count);
  EXPECT_EQ(refused.code(), Error::OutOfResources);
  EXPECT_STREQ(refused.message().c_str(),
               "import: the sequence's block tables need 6 table pages, 5 of batch.table_pages = 5 are free");
  EXPECT_TRUE(snapshot(*short_of_pages) == before);
  EXPECT_EQ(written, 0);
  auto enough = make(two_groups(2, 6));
  ASSERT_NE(enough, nullptr);
  ASSERT_TRUE(enough->admit(0, in, count).ok());
  EXPECT_EQ(enough->free_table_pages(), 0);
  EXPECT_EQ(written, 12);  // each group keeps the six carried blocks
  EXPECT_TRUE(enough->check_tables().ok());
}

TEST(BatchTablePages, ConfigFieldsAreChecked) {
  CacheConfig cfg = two_groups(3, 0);
  auto bad = BatchCache::create(cfg);
  EXPECT_EQ(bad.status().code(), Error::InvalidArgument);
  EXPECT_NE(std::string(bad.status().message().c_str()).find("batch.table_page_blocks = 3"), std::string::npos);
  cfg = two_groups(4, -1);
  auto negative = BatchCache::create(cfg);
  EXPECT_EQ(negative.status().code(), Error::InvalidArgument);
  EXPECT_NE(std::string(negative.status().message().c_str()).find("batch.table_pages = -1"), std::string::npos);
  cfg = two_groups(1 << 21, 0);
  EXPECT_EQ(BatchCache::create(cfg).status().code(), Error::InvalidArgument);
  cfg = two_groups(1 << 20, 0);  // a page past a whole row (128 entries) is one row's page
  auto capped = make(cfg);
  ASSERT_NE(capped, nullptr);
  EXPECT_EQ(capped->table_page_blocks(), 128);
  EXPECT_EQ(capped->table_pages(), 2 * 5);
  cfg = two_groups(64, 1 << 26);  // 2^32 entries
  auto pages = BatchCache::create(cfg);
  EXPECT_EQ(pages.status().code(), Error::InvalidArgument);
  EXPECT_STREQ(pages.status().message().c_str(),
               "67108864 table pages of batch.table_page_blocks = 64 entries: the tables would pass 2^31 entries");
  cfg = two_groups(1, 1);
  cfg.capacity = 4096;
  cfg.batch.block_size = 1;
  cfg.batch.max_seqs = 1 << 20;  // 2 groups x 2^20 rows x 4096 page ids
  auto dirs = BatchCache::create(cfg);
  EXPECT_EQ(dirs.status().code(), Error::InvalidArgument);
  EXPECT_STREQ(dirs.status().message().c_str(),
               "2 groups x 1048576 sequences x 4096 table pages per row: the page directories would pass 2^31 entries");
}

// The same random verbs on a paged cache with few pages and an unpaged one:
// where the paged one is refused for want of pages nothing changes, and
// otherwise both answer alike and hold the same blocks everywhere.
TEST(BatchTablePages, PagedPlansAsUnpaged) {
  for (const int P : {1, 2, 8}) {
    for (const int pages : {8, 24, 0}) {
      SCOPED_TRACE("P " + std::to_string(P) + ", pages " + std::to_string(pages));
      auto paged = make(two_groups(P, pages));
      auto dense = make(two_groups(0, 0));
      ASSERT_NE(paged, nullptr);
      ASSERT_NE(dense, nullptr);
      std::mt19937 rng(static_cast<std::uint32_t>(39 + P * 7 + pages));
      std::vector<std::int32_t> prompt(256);
      for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<std::int32_t>(i % 11);
      int refused = 0;
      for (int op = 0; op < 1500 && !::testing::Test::HasFailure(); ++op) {
        const int seq = static_cast<int>(rng() % 5), other = static_cast<int>(rng() % 5);
        const Snapshot before = snapshot(*paged);
        const int free_before = paged->free_table_pages();
        kvcore::Status a, b;
        switch (rng() % 6) {
          case 0:
            a = paged->add_sequence(seq), b = dense->add_sequence(seq);
            break;
          case 1:
            a = paged->release_sequence(seq), b = dense->release_sequence(seq);
            break;
          case 2: {
            const int upto = paged->sequence(seq)->active ? static_cast<int>(rng() % (paged->sequence(seq)->length + 1)) : 0;
            a = paged->fork(seq, other, upto);
            if (a.code() != Error::OutOfResources) b = dense->fork(seq, other, upto);
            break;
          }
          case 3: {
            const int n = paged->sequence(seq)->length - static_cast<int>(rng() % 5);
            a = paged->rewind(seq, n), b = dense->rewind(seq, n);
            break;
          }
          case 4: {
            const int n = static_cast<int>(rng() % 40);
            auto ra = paged->adopt_prefix(seq, prompt.data(), n);
            a = ra.status();
            if (a.code() != Error::OutOfResources) {
              auto rb = dense->adopt_prefix(seq, prompt.data(), n);
              b = rb.status();
              if (ra.ok() && rb.ok()) {
                ASSERT_EQ(*ra, *rb);
              }
            }
            break;
          }
          default: {
            std::vector<StepEntry> entries;
            for (int s = 0; s < 5; ++s)
              if (paged->sequence(s)->active && rng() % 2) {
                const int length = paged->sequence(s)->length;
                const int T = 1 + static_cast<int>(rng() % 6);
                if (length + T <= 256) entries.push_back({s, T, prompt.data() + length});
              }
            if (entries.empty()) break;
            int need = 0;
            for (const StepEntry& e : entries) need += *paged->table_pages_needed(e.seq, e.T);
            auto sa = paged->begin_step(entries.data(), static_cast<int>(entries.size()));
            a = sa.status();
            // Admitted exactly when the entries' pages are free (or the blocks refuse first).
            if (need <= free_before) {
              EXPECT_EQ(std::string(a.message().c_str()).find("table pages"), std::string::npos);
            }
            if (!sa.ok() && need > free_before) break;
            auto sb = dense->begin_step(entries.data(), static_cast<int>(entries.size()));
            b = sb.status();
            ASSERT_EQ(a.code(), b.code()) << a.message().c_str();
            if (!sa.ok()) break;
            EXPECT_EQ(free_before - paged->free_table_pages(), need);
            const BatchStepPlan pa = *paged->plan(*sa), pb = *dense->plan(*sb);
            EXPECT_EQ(pa.groups[0].block_tables, nullptr);
            for (int g = 0; g < 2; ++g) {
              for (int t = 0; t < pa.n_tokens; ++t) ASSERT_EQ(pa.groups[g].slots[t], pb.groups[g].slots[t]);
              for (int i = 0; i < pa.n_entries; ++i)
                for (int j = 0; j < (pa.context_lens[i] + 1) / 2; ++j)
                  ASSERT_EQ(kvcore::table_row(pa, g, i)[j], kvcore::table_row(pb, g, i)[j]);
            }
            if (rng() % 4 == 0) {
              a = paged->abort(*sa), b = dense->abort(*sb);
            } else {
              a = paged->commit(*sa), b = dense->commit(*sb);
            }
          }
        }
        if (a.code() == Error::OutOfResources && std::string(a.message().c_str()).find("table pages") != std::string::npos) {
          ++refused;
          ASSERT_TRUE(snapshot(*paged) == before) << a.message().c_str();
          ASSERT_EQ(paged->free_table_pages(), free_before);
          continue;
        }
        ASSERT_EQ(a.code(), b.code()) << a.message().c_str() << " / " << b.message().c_str();
        ASSERT_TRUE(snapshot(*paged) == snapshot(*dense));
        const kvcore::Status ok = paged->check_tables();
        ASSERT_TRUE(ok.ok()) << ok.message().c_str();
      }
      if (pages == 8) {
        EXPECT_GT(refused, 0);  // the bound was reached
      }
      if (pages == 0) {
        EXPECT_EQ(refused, 0);
      }
    }
  }
}

TEST(BatchTablePages, TakingAndGivingPagesAllocatesNothing) {
  auto c = make(two_groups(2, 0));
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->add_sequence(0).ok());
  const std::uint64_t before = operator_news();
  decode(*c, 0, 120);  // pages taken and the ring's given back
  ASSERT_TRUE(c->fork(0, 1, 120).ok());
  ASSERT_TRUE(c->remove(0, 0, 40).ok());  // the head: its pages go back
  ASSERT_TRUE(c->release_sequence(1).ok());
  ASSERT_TRUE(c->release_sequence(0).ok());
  EXPECT_EQ(operator_news(), before);
  EXPECT_EQ(c->free_table_pages(), c->table_pages());
}

}  // namespace
}  // namespace kvcore_test
