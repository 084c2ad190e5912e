// Every error path of BatchCache (DESIGN.md section 6): the code, a message
// naming the bad value and the rule, and no change at all. "No change" is a
// snapshot of everything the cache shows (every sequence's state and
// can_rewind answers, blocks held and the oldest held position per group,
// free and cached blocks, the block tables themselves); when a step was begun
// before the refused call, it must still be the begun step with the very same
// plan, and commit afterwards. (A refused call never ends a step; a
// successful verb does.)
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "batch_reference.h"
#include "kvcore/batch/batch_cache.h"

namespace kvcore_test {
namespace {

using kvcore::BatchCache;
using kvcore::BatchStep;
using kvcore::BatchStepPlan;
using kvcore::CacheConfig;
using kvcore::Error;
using kvcore::LayerConfig;
using kvcore::LayerPolicy;
using kvcore::PositionRange;
using kvcore::Status;
using kvcore::StepEntry;

// --- the world every refusal is tried in -------------------------------------

constexpr int kCapacity = 64;
constexpr int kMaxStep = 4;
constexpr int kB = 4;
constexpr int kSeqs = 6;

// Three groups: ring(8, 2) (layers 0, 2), flat (layer 1), ring(5) (layer 3).
CacheConfig world_config() {
  CacheConfig cfg;
  cfg.capacity = kCapacity;
  cfg.max_step = kMaxStep;
  cfg.n_layers = 4;
  for (LayerPolicy p : {LayerPolicy::ring(8, 2), LayerPolicy::flat(), LayerPolicy::ring(8, 2), LayerPolicy::ring(5)})
    cfg.layers.push_back(LayerConfig{p, 1, 4, 0});
  cfg.batch.block_size = kB;
  cfg.batch.max_seqs = kSeqs;
  cfg.batch.max_holes = 2;
  cfg.batch.page_layers = cfg.n_layers;  // one group per policy (the two ring(8, 2) layers together): the errors name them
  return cfg;
}

std::vector<std::int32_t> tokens_of(int seq, int from, int n) {
  std::vector<std::int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(100 * seq + from + i);
  return t;
}

// Appends `n` tokens to `seq` in steps of up to max_step, committing each.
void decode(BatchCache& cache, int seq, int n) {
  while (n > 0) {
    const int T = n < kMaxStep ? n : kMaxStep;
    const std::vector<std::int32_t> t = tokens_of(seq, cache.sequence(seq)->length, T);
    StepEntry e{seq, T, t.data()};
    auto step = cache.begin_step(&e, 1);
    ASSERT_TRUE(step.ok()) << step.message().c_str();
    ASSERT_TRUE(cache.commit(*step).ok());
    n -= T;
  }
}

// seq 0: 30 positions decoded (the ring groups released what their windows
//        left behind: rewind(0, n) is refused below 24 by group 2, below 23 by
//        group 0); seq 1: a fork of seq 0 at 30 (sharing its partial block 7);
// seq 2: active and empty; seq 3, seq 5: inactive; seq 4: 12 positions with
//        holes [2, 4) and [6, 7) (max_holes = 2: no room for another).
// With `open`, a step is begun over seq 1 (T = 2: copy-on-write of block 7)
// and seq 2 (T = 3), and left uncommitted.
struct World {
  std::unique_ptr<BatchCache> cache;
  bool open = false;
  BatchStep step;
};

World make_world(bool open, const CacheConfig& cfg = world_config()) {
  World w;
  auto created = BatchCache::create(cfg);
  EXPECT_TRUE(created.ok()) << created.message().c_str();
  if (!created.ok()) return w;
  w.cache = std::move(created).get();
  BatchCache& c = *w.cache;
  EXPECT_TRUE(c.add_sequence(0).ok());
  decode(c, 0, 30);
  EXPECT_TRUE(c.fork(0, 1, 30).ok());
  EXPECT_TRUE(c.add_sequence(2).ok());
  EXPECT_TRUE(c.add_sequence(4).ok());
  decode(c, 4, 12);
  EXPECT_TRUE(c.remove(4, 2, 4).ok());
  EXPECT_TRUE(c.remove(4, 6, 7).ok());
  EXPECT_EQ(c.sequence(4)->n_holes, 2);
  if (open) {
    const std::vector<std::int32_t> t1 = tokens_of(1, 30, 2), t2 = tokens_of(2, 0, 3);
    const StepEntry entries[] = {{1, 2, t1.data()}, {2, 3, t2.data()}};
    auto step = c.begin_step(entries, 2);
    EXPECT_TRUE(step.ok()) << step.message().c_str();
    if (step.ok()) {
      w.open = true;
      w.step = *step;
      auto plan = c.plan(w.step);
      EXPECT_TRUE(plan.ok());
      EXPECT_EQ(plan->groups[1].n_copies, 1);  // the flat group copies the shared block 7
    }
  }
  return w;
}

struct Before {
  Snapshot snap;
  PlanCopy plan;
};

Before before(const World& w) {
  Before b{snapshot(*w.cache), {}};
  if (w.open) b.plan = copy_of(*w.cache->plan(w.step));
  return b;
}

void expect_message_has(const Status& st, const std::string& text) {
  EXPECT_NE(std::strstr(st.message().c_str(), text.c_str()), nullptr)
      << "message '" << st.message().c_str() << "' lacks '" << text << "'";
}

// The refusal: its code, every part of its message, and nothing changed (the
// begun step, if any, still begun with the same plan).
void expect_refused(const World& w, const Status& st, Error code, std::initializer_list<std::string> parts,
                    const Before& b) {
  EXPECT_EQ(st.code(), code) << st.message().c_str();
  for (const std::string& p : parts) expect_message_has(st, p);
  EXPECT_TRUE(snapshot(*w.cache) == b.snap) << "the refused call changed the cache: " << st.message().c_str();
  if (w.open) {
    EXPECT_TRUE(w.cache->check_step(w.step).ok()) << "the refused call ended the step: " << st.message().c_str();
    auto plan = w.cache->plan(w.step);
    ASSERT_TRUE(plan.ok()) << plan.message().c_str();
    EXPECT_TRUE(copy_of(*plan) == b.plan) << "the refused call changed the step's plan";
  }
}

// The begun step survived every refusal: it commits.
void expect_step_commits(World& w) {
  if (!w.open) return;
  EXPECT_TRUE(w.cache->commit(w.step).ok());
  EXPECT_EQ(w.cache->sequence(1)->length, 32);
  EXPECT_EQ(w.cache->sequence(2)->length, 3);
}

// Runs `body` in a world without and with a begun step.
template <typename Body>
void in_both_worlds(Body body) {
  for (bool open : {false, true}) {
    SCOPED_TRACE(open ? "with a begun step" : "without a begun step");
    World w = make_world(open);
    ASSERT_NE(w.cache, nullptr);
    body(w);
    expect_step_commits(w);
  }
}

const std::int32_t kTokens[kCapacity + 1] = {};

// The snapshot and the plan copy see a change of each kind, or "nothing
// changed" below would prove nothing.
TEST(BatchCacheErrors, TheSnapshotSeesEveryKindOfChange) {
  World w = make_world(true);
  ASSERT_NE(w.cache, nullptr);
  BatchCache& c = *w.cache;
  Before b = before(w);
  const StepEntry other{0, 1, nullptr};
  auto replaced = c.begin_step(&other, 1);  // a different step: a different plan
  ASSERT_TRUE(replaced.ok());
  EXPECT_FALSE(copy_of(*c.plan(*replaced)) == b.plan);
  w.open = false;
  struct Change {
    const char* what;
    Status (*run)(BatchCache&);
  };
  const Change changes[] = {
      {"add_sequence", [](BatchCache& k) { return k.add_sequence(3); }},       // active
      {"a step", [](BatchCache& k) {                                           // length, tables, free blocks
         const StepEntry e{3, 1, nullptr};
         auto s = k.begin_step(&e, 1);
         return s.ok() ? k.commit(*s) : s.status();
       }},
      {"remove of a middle range", [](BatchCache& k) { return k.remove(0, 26, 27); }},  // holes
      {"remove of the head", [](BatchCache& k) { return k.remove(4, 0, 1); }},         // visible start
      {"rewind within a block", [](BatchCache& k) { return k.rewind(0, 29); }},       // length only
      {"release", [](BatchCache& k) { return k.release_sequence(1); }},               // cached blocks
  };
  for (const Change& ch : changes) {
    b = before(w);
    ASSERT_TRUE(ch.run(c).ok()) << ch.what;
    EXPECT_FALSE(snapshot(c) == b.snap) << ch.what;
  }
}

// --- sequences out of range or not active, for every verb and query ----------

TEST(BatchCacheErrors, SequenceOutOfRangeIsInvalidArgumentForEveryVerb) {
  in_both_worlds([](World& w) {
    BatchCache& c = *w.cache;
    for (int bad : {-1, kSeqs, INT_MAX, INT_MIN}) {
      SCOPED_TRACE("seq " + std::to_string(bad));
      const std::string range = "sequence " + std::to_string(bad) + " must be in [0, max_seqs = 6)";
      const Before b = before(w);
      expect_refused(w, c.add_sequence(bad), Error::InvalidArgument, {"add_sequence: ", range}, b);
      expect_refused(w, c.release_sequence(bad), Error::InvalidArgument, {"release_sequence: ", range}, b);
      expect_refused(w, c.fork(bad, 3, 0), Error::InvalidArgument, {"fork: ", range}, b);
      expect_refused(w, c.fork(0, bad, 10), Error::InvalidArgument, {"fork: ", range}, b);
      expect_refused(w, c.remove(bad, 0, 1), Error::InvalidArgument, {"remove: ", range}, b);
      expect_refused(w, c.rewind(bad, 0), Error::InvalidArgument, {"rewind: ", range}, b);
      expect_refused(w, c.release_named_state(bad).status(), Error::InvalidArgument, {"release_named_state: ", range},
                     b);
      EXPECT_FALSE(c.can_rewind(bad, 0));
      expect_refused(w, c.adopt_prefix(bad, kTokens, 8).status(), Error::InvalidArgument, {"adopt_prefix: ", range},
                     b);
      const StepEntry entries[] = {{2, 1, nullptr}, {bad, 1, nullptr}};
      expect_refused(w, c.begin_step(entries, 2).status(), Error::InvalidArgument, {"begin_step: ", range}, b);
    }
  });
}

TEST(BatchCacheErrors, SequenceOutOfRangeIsInvalidArgumentForEveryQuery) {
  in_both_worlds([](World& w) {
    const BatchCache& c = *w.cache;
    for (int bad : {-1, kSeqs, INT_MAX, INT_MIN}) {
      SCOPED_TRACE("seq " + std::to_string(bad));
      const std::string range = "sequence " + std::to_string(bad) + " must be in [0, max_seqs = 6)";
      const Before b = before(w);
      expect_refused(w, c.sequence(bad).status(), Error::InvalidArgument, {"sequence: ", range}, b);
      expect_refused(w, c.blocks_held(bad, 0).status(), Error::InvalidArgument, {"blocks_held: ", range}, b);
      expect_refused(w, c.oldest_held(bad, 0).status(), Error::InvalidArgument, {"oldest_held: ", range}, b);
      expect_refused(w, c.visible(0, bad, 1, 0).status(), Error::InvalidArgument, {"visible: ", range}, b);
    }
  });
}

TEST(BatchCacheErrors, InactiveSequenceIsInvalidStateForEveryVerb) {
  in_both_worlds([](World& w) {
    BatchCache& c = *w.cache;
    for (int idle : {3, 5}) {
      SCOPED_TRACE("seq " + std::to_string(idle));
      const std::string inactive =
          "sequence " + std::to_string(idle) + " is not active (add_sequence or fork it first)";
      const Before b = before(w);
      expect_refused(w, c.release_sequence(idle), Error::InvalidState, {"release_sequence: ", inactive}, b);
      expect_refused(w, c.fork(idle, 2, 0), Error::InvalidState, {"fork: ", inactive}, b);
      expect_refused(w, c.remove(idle, 0, 1), Error::InvalidState, {"remove: ", inactive}, b);
      expect_refused(w, c.rewind(idle, 0), Error::InvalidState, {"rewind: ", inactive}, b);
      expect_refused(w, c.release_named_state(idle).status(), Error::InvalidState,
                     {"release_named_state: ", inactive}, b);
      EXPECT_FALSE(c.can_rewind(idle, 0));
      expect_refused(w, c.adopt_prefix(idle, kTokens, 8).status(), Error::InvalidState, {"adopt_prefix: ", inactive},
                     b);
      const StepEntry entries[] = {{0, 1, nullptr}, {idle, 1, nullptr}};
      expect_refused(w, c.begin_step(entries, 2).status(), Error::InvalidState, {"begin_step: ", inactive}, b);
      // Queries answer for inactive sequences: an empty one.
      EXPECT_FALSE(c.sequence(idle)->active);
      EXPECT_EQ(*c.blocks_held(idle, 1), 0);
    }
  });
}

TEST(BatchCacheErrors, AddingAnActiveSequenceIsInvalidState) {
  in_both_worlds([](World& w) {
    for (int seq : {0, 1, 2, 4}) {
      const Before b = before(w);
      expect_refused(w, w.cache->add_sequence(seq), Error::InvalidState,
                     {"add_sequence(" + std::to_string(seq) + "): the sequence is already active"}, b);
    }
  });
}

// --- fork --------------------------------------------------------------------

TEST(BatchCacheErrors, ForkIntoANonEmptySequenceIsInvalidState) {
  in_both_worlds([](World& w) {
    const Before b = before(w);
    expect_refused(w, w.cache->fork(0, 1, 10), Error::InvalidState,
                   {"fork(0, 1): dst holds 30 positions; it must be empty"}, b);
    expect_refused(w, w.cache->fork(1, 4, 10), Error::InvalidState,
                   {"fork(1, 4): dst holds 12 positions; it must be empty"}, b);
  });
}

TEST(BatchCacheErrors, ForkOntoItselfIsInvalidArgument) {
  in_both_worlds([](World& w) {
    const Before b = before(w);
    expect_refused(w, w.cache->fork(0, 0, 30), Error::InvalidArgument, {"fork(0, 0): src and dst are one sequence"},
                   b);
    expect_refused(w, w.cache->fork(2, 2, 0), Error::InvalidArgument, {"fork(2, 2): src and dst are one sequence"},
                   b);
  });
}

TEST(BatchCacheErrors, ForkUptoOutsideZeroToLengthIsInvalidArgument) {
  in_both_worlds([](World& w) {
    for (int upto : {-1, 31, INT_MAX, INT_MIN}) {
      const Before b = before(w);
      expect_refused(w, w.cache->fork(0, 3, upto), Error::InvalidArgument,
                     {"fork(0, 3, upto = " + std::to_string(upto) + "): must be in [0, length = 30]"}, b);
    }
    const Before b = before(w);
    expect_refused(w, w.cache->fork(2, 3, 1), Error::InvalidArgument, {"upto = 1): must be in [0, length = 0]"}, b);
  });
}

TEST(BatchCacheErrors, ForkBreakingTheRewindRuleIsInvalidState) {
  in_both_worlds([](World& w) {
    BatchCache& c = *w.cache;
    // Group 0 (ring 8, 2 sinks) released blocks 1..3 (positions 4..15): a query at 20 needs 13.
    for (int upto : {20, 10, 5}) {
      EXPECT_FALSE(c.can_rewind(0, upto));
      const Before b = before(w);
      expect_refused(w, c.fork(0, 3, upto), Error::InvalidState,
                     {"fork(0, 3, upto = " + std::to_string(upto) + "): group 0 of the source no longer holds what a "
                                                                     "query at " +
                      std::to_string(upto) + " needs"},
                     b);
    }
    // Group 0 can serve 23 and 1 .. 4, group 2 (ring 5, no sinks) released
    // positions 0 .. 19: a query at 23 needs 19, one at 3 needs 0.
    const Before b = before(w);
    expect_refused(w, c.fork(0, 3, 23), Error::InvalidState, {"upto = 23): group 2 of the source"}, b);
    expect_refused(w, c.fork(0, 3, 3), Error::InvalidState, {"upto = 3): group 2 of the source"}, b);
    // The rule's edges are allowed: 0 (the sinks of group 2), and up to max_step back.
    EXPECT_TRUE(c.can_rewind(0, 26));
    EXPECT_TRUE(c.can_rewind(0, 0));
  });
}

// --- remove ------------------------------------------------------------------

TEST(BatchCacheErrors, RemoveWithANegativeOrReversedRangeIsInvalidArgument) {
  in_both_worlds([](World& w) {
    for (auto r : {std::pair<int, int>{-1, 3}, {INT_MIN, 0}, {5, 4}, {20, 0}, {0, -1}, {INT_MAX, INT_MIN}}) {
      const Before b = before(w);
      expect_refused(w, w.cache->remove(0, r.first, r.second), Error::InvalidArgument,
                     {"remove(0, p0 = " + std::to_string(r.first) + ", p1 = " + std::to_string(r.second) +
                      "): needs 0 <= p0 <= p1"},
                     b);
    }
  });
}

TEST(BatchCacheErrors, RemoveBeyondMaxHolesIsOutOfResources) {
  in_both_worlds([](World& w) {
    BatchCache& c = *w.cache;
    // seq 4 keeps [2, 4) and [6, 7) apart already; a third separate range does not fit.
    for (auto r : {std::pair<int, int>{9, 10}, {8, 11}, {10, 11}, {5, 5 + 1}}) {
      if (r.first == 5) continue;  // [5, 6) would touch [6, 7): merged, allowed (below)
      const Before b = before(w);
      expect_refused(w, c.remove(4, r.first, r.second), Error::OutOfResources,
                     {"remove(4, " + std::to_string(r.first) + ", " + std::to_string(r.second) +
                          "): the sequence would keep 3 separate removed ranges, more than batch.max_holes = 2"},
                     b);
    }
  });
  // A range that touches a hole, or reaches the head or the tail, needs no new one.
  World w = make_world(false);
  BatchCache& c = *w.cache;
  EXPECT_TRUE(c.remove(4, 7, 8).ok());  // [6, 8)
  EXPECT_TRUE(c.remove(4, 4, 6).ok());  // [2, 4) + [4, 6) + [6, 8) = [2, 8)
  EXPECT_EQ(c.sequence(4)->n_holes, 1);
  EXPECT_TRUE(c.remove(4, 0, 1).ok());   // the head
  EXPECT_TRUE(c.remove(4, 9, 10).ok());   // a hole again: [2, 8) and [9, 10)
  EXPECT_TRUE(c.remove(4, 11, 12).ok());  // the tail
  EXPECT_EQ(c.sequence(4)->n_holes, 2);
  EXPECT_EQ(c.sequence(4)->length, 11);
}

TEST(BatchCacheErrors, RemoveTruncatingIntoReleasedHistoryIsInvalidState) {
  in_both_worlds([](World& w) {
    BatchCache& c = *w.cache;
    for (int p0 : {20, 10, 5}) {
      for (int p1 : {30, 31, INT_MAX}) {
        const Before b = before(w);
        expect_refused(w, c.remove(0, p0, p1), Error::InvalidState,
                       {"remove(0, " + std::to_string(p0) + "): group 0 no longer holds what a query at " +
                        std::to_string(p0) + " needs (released by its window)"},
                       b);
      }
    }
    const Before b = before(w);
    expect_refused(w, c.remove(0, 23, 40), Error::InvalidState, {"remove(0, 23): group 2 no longer holds"}, b);
    expect_refused(w, c.remove(0, 1, 30), Error::InvalidState, {"remove(0, 1): group 2 no longer holds"}, b);
  });
}

// --- rewind ------------------------------------------------------------------

TEST(BatchCacheErrors, RewindOutsideZeroToLengthIsInvalidArgument) {
  in_both_worlds([](World& w) {
    BatchCache& c = *w.cache;
    for (int n : {-1, 31, INT_MAX, INT_MIN}) {
      EXPECT_FALSE(c.can_rewind(0, n));
      const Before b = before(w);
      expect_refused(w, c.rewind(0, n), Error::InvalidArgument,
                     {"rewind(0, n = " + std::to_string(n) + "): must be in [0, length = 30]"}, b);
    }
    const Before b = before(w);
    expect_refused(w, c.rewind(2, 1), Error::InvalidArgument, {"rewind(2, n = 1): must be in [0, length = 0]"}, b);
  });
}

TEST(BatchCacheErrors, RewindIntoReleasedHistoryIsInvalidState) {
  in_both_worlds([](World& w) {
    BatchCache& c = *w.cache;
    for (int n = 5; n < 23; ++n) {  // group 0 released positions 4..15; queries at 5..22 need some
      EXPECT_FALSE(c.can_rewind(0, n)) << n;
      const Before b = before(w);
      expect_refused(w, c.rewind(0, n), Error::InvalidState,
                     {"rewind(0, " + std::to_string(n) + "): group 0 no longer holds what a query at " +
                      std::to_string(n) + " needs (released by its window)"},
                     b);
    }
    // Group 2 (ring 5, no sinks) released positions 0..19: queries at 1..4 and 23 need some.
    const Before b = before(w);
    for (int n : {1, 2, 3, 4, 23}) {
      EXPECT_FALSE(c.can_rewind(0, n)) << n;
      expect_refused(w, c.rewind(0, n), Error::InvalidState,
                     {"rewind(0, " + std::to_string(n) + "): group 2 no longer holds"}, b);
    }
    // The fork holds the same history (shared blocks): the same answers.
    expect_refused(w, c.rewind(1, 12), Error::InvalidState, {"rewind(1, 12): group 0"}, b);
    for (int n : {0, 24, 26, 29, 30}) EXPECT_TRUE(c.can_rewind(0, n)) << n;
  });
}

// --- adopt_prefix ------------------------------------------------------------

TEST(BatchCacheErrors, AdoptPrefixWithALengthOutsideZeroToCapacityIsInvalidArgument) {
  in_both_worlds([](World& w) {
    for (int n : {-1, kCapacity + 1, INT_MAX, INT_MIN}) {
      const Before b = before(w);
      expect_refused(w, w.cache->adopt_prefix(2, kTokens, n).status(), Error::InvalidArgument,
                     {"adopt_prefix(2, n = " + std::to_string(n) + "): must be in [0, capacity = 64]"}, b);
    }
  });
}

TEST(BatchCacheErrors, AdoptPrefixWithNullTokensIsInvalidArgument) {
  in_both_worlds([](World& w) {
    for (int n : {1, 8, kCapacity}) {
      const Before b = before(w);
      expect_refused(w, w.cache->adopt_prefix(2, nullptr, n).status(), Error::InvalidArgument,
                     {"adopt_prefix(2): tokens is null"}, b);
    }
  });
}

TEST(BatchCacheErrors, AdoptPrefixIntoANonEmptySequenceIsInvalidState) {
  in_both_worlds([](World& w) {
    const std::vector<std::int32_t> prompt = tokens_of(0, 0, 30);
    const Before b = before(w);
    expect_refused(w, w.cache->adopt_prefix(0, prompt.data(), 30).status(), Error::InvalidState,
                   {"adopt_prefix(0): the sequence holds 30 positions; it must be empty"}, b);
    expect_refused(w, w.cache->adopt_prefix(4, prompt.data(), 30).status(), Error::InvalidState,
                   {"adopt_prefix(4): the sequence holds 12 positions; it must be empty"}, b);
  });
}

// --- begin_step --------------------------------------------------------------

TEST(BatchCacheErrors, BeginStepWithNoneOrTooManyEntriesIsInvalidArgument) {
  in_both_worlds([](World& w) {
    const StepEntry entries[kSeqs + 1] = {{0, 1, nullptr}, {1, 1, nullptr}, {2, 1, nullptr}, {4, 1, nullptr}};
    for (int n : {0, -1, kSeqs + 1, INT_MAX, INT_MIN}) {
      const Before b = before(w);
      expect_refused(w, w.cache->begin_step(entries, n).status(), Error::InvalidArgument,
                     {"begin_step: " + std::to_string(n) + " entries, must be in [1, max_seqs = 6]"}, b);
    }
  });
}

TEST(BatchCacheErrors, BeginStepWithNullEntriesIsInvalidArgument) {
  in_both_worlds([](World& w) {
    const Before b = before(w);
    expect_refused(w, w.cache->begin_step(nullptr, 1).status(), Error::InvalidArgument,
                   {"begin_step: entries is null"}, b);
  });
}

TEST(BatchCacheErrors, BeginStepWithARepeatedSequenceIsInvalidArgument) {
  in_both_worlds([](World& w) {
    const StepEntry twice[] = {{0, 1, nullptr}, {2, 1, nullptr}, {0, 2, nullptr}};
    const Before b = before(w);
    expect_refused(w, w.cache->begin_step(twice, 3).status(), Error::InvalidArgument,
                   {"begin_step: sequence 0 appears twice"}, b);
    const StepEntry same[] = {{4, 1, nullptr}, {4, 1, nullptr}};
    expect_refused(w, w.cache->begin_step(same, 2).status(), Error::InvalidArgument,
                   {"begin_step: sequence 4 appears twice"}, b);
  });
}

TEST(BatchCacheErrors, BeginStepWithTOutsideOneToMaxStepIsInvalidArgument) {
  in_both_worlds([](World& w) {
    for (int T : {0, -1, kMaxStep + 1, INT_MAX, INT_MIN}) {
      const StepEntry entries[] = {{0, 1, nullptr}, {2, T, nullptr}};
      const Before b = before(w);
      expect_refused(w, w.cache->begin_step(entries, 2).status(), Error::InvalidArgument,
                     {"begin_step: sequence 2 with T = " + std::to_string(T) + ", must be in [1, max_step = 4]"}, b);
    }
  });
}

TEST(BatchCacheErrors, BeginStepPastCapacityIsOutOfResources) {
  for (bool open : {false, true}) {
    SCOPED_TRACE(open ? "with a begun step" : "without a begun step");
    World w = make_world(open);
    ASSERT_NE(w.cache, nullptr);
    BatchCache& c = *w.cache;
    // seq 4 grows to 62 (the begun step, if any, ends here and is begun again).
    decode(c, 4, 50);
    if (open) {
      const std::vector<std::int32_t> t1 = tokens_of(1, 30, 2), t2 = tokens_of(2, 0, 3);
      const StepEntry entries[] = {{1, 2, t1.data()}, {2, 3, t2.data()}};
      w.step = *c.begin_step(entries, 2);
    }
    for (int T : {3, 4}) {
      const StepEntry entries[] = {{0, 1, nullptr}, {4, T, nullptr}};
      const Before b = before(w);
      expect_refused(w, c.begin_step(entries, 2).status(), Error::OutOfResources,
                     {"begin_step: sequence 4 at length 62 with T = " + std::to_string(T) +
                      " would pass capacity = 64"},
                     b);
    }
    const StepEntry fits[] = {{4, 2, nullptr}};
    EXPECT_TRUE(c.begin_step(fits, 1).ok());  // exactly to capacity (and the begun step is replaced)
  }
}

TEST(BatchCacheErrors, BeginStepOverMaxStepTokensIsInvalidArgument) {
  CacheConfig cfg = world_config();
  cfg.batch.max_step_tokens = 6;
  for (bool open : {false, true}) {
    SCOPED_TRACE(open ? "with a begun step" : "without a begun step");
    World w = make_world(open, cfg);
    ASSERT_NE(w.cache, nullptr);
    EXPECT_EQ(w.cache->max_step_tokens(), 6);
    const StepEntry entries[] = {{0, 4, nullptr}, {2, 2, nullptr}, {4, 1, nullptr}};
    const Before b = before(w);
    expect_refused(w, w.cache->begin_step(entries, 3).status(), Error::InvalidArgument,
                   {"begin_step: 7 tokens or more, must be <= max_step_tokens = 6"}, b);
    EXPECT_TRUE(w.cache->begin_step(entries, 2).ok());  // 6 tokens fit
  }
  // The default: every sequence stepping max_step tokens.
  World w = make_world(false);
  EXPECT_EQ(w.cache->max_step_tokens(), kSeqs * kMaxStep);
}

// The tokens of a step are summed in 64 bits: T up to max_step = 2^31 - 1 per
// entry. Before the fix the sum wrapped (signed overflow) and the step was
// refused for the wrong reason (OutOfResources, 2049 blocks needed).
TEST(BatchCacheErrors, BeginStepWhoseTokensPass2To31IsInvalidArgument) {
  CacheConfig cfg;
  cfg.capacity = INT_MAX;
  cfg.max_step = INT_MAX;
  cfg.n_layers = 1;
  cfg.layers.push_back(LayerConfig{LayerPolicy::flat(), 1, 4, 0});
  cfg.batch.block_size = 1 << 20;
  cfg.batch.max_seqs = 2;
  cfg.batch.num_blocks = 1;
  World w;
  auto created = BatchCache::create(cfg);
  ASSERT_TRUE(created.ok()) << created.message().c_str();
  w.cache = std::move(created).get();
  ASSERT_TRUE(w.cache->add_sequence(0).ok());
  ASSERT_TRUE(w.cache->add_sequence(1).ok());
  EXPECT_EQ(w.cache->max_step_tokens(), 1 << 20);  // the default's cap
  const StepEntry entries[] = {{0, 5, nullptr}, {1, INT_MAX - 1, nullptr}};
  const Before b = before(w);
  expect_refused(w, w.cache->begin_step(entries, 2).status(), Error::InvalidArgument,
                 {"begin_step: 2147483651 tokens or more, must be <= max_step_tokens = 1048576"}, b);
}

// The one pool short of blocks refuses the whole step, giving the need summed
// over every group; reclaiming cached blocks comes first (they are free
// blocks). (Before the one budget each group had a pool and the refusal named
// the short group.)
TEST(BatchCacheErrors, BeginStepWhenAPoolIsShortIsOutOfResourcesNamingTheGroup) {
  CacheConfig cfg = world_config();  // groups: 0 ring(8, 2), 1 flat, 2 ring(5); B = 4, C = 4
  // What seq 0 at 36 and seq 1 at 8 hold below (21 blocks), and 3 more.
  cfg.batch.num_blocks = 24;
  auto created = BatchCache::create(cfg);
  ASSERT_TRUE(created.ok()) << created.message().c_str();
  World w;
  w.cache = std::move(created).get();
  BatchCache& c = *w.cache;
  for (int g = 0; g < 3; ++g) ASSERT_EQ(*c.num_blocks(g), 24);  // every group answers for the one pool
  ASSERT_TRUE(c.add_sequence(0).ok());
  decode(c, 0, 36);
  ASSERT_TRUE(c.add_sequence(1).ok());
  decode(c, 1, 8);
  ASSERT_TRUE(c.add_sequence(2).ok());
  // Held between steps at length L (group_rule.h): flat, ceil(L / B); a ring
  // the sink blocks and blocks from floor((L - C - W + 1) / B) on.
  // ring(8, 2): seq 0, block 0 and blocks 6..8 (floor(25 / 4) = 6); seq 1, blocks 0, 1.
  EXPECT_EQ(*c.held_blocks(0), 4 + 2);
  EXPECT_EQ(*c.held_blocks(1), 9 + 2);  // flat: 36 / 4 and 8 / 4
  // ring(5): seq 0, blocks 7, 8 (floor(28 / 4) = 7); seq 1, blocks 0, 1 (floor(0 / 4) = 0).
  EXPECT_EQ(*c.held_blocks(2), 2 + 2);
  for (int g = 0; g < 3; ++g) ASSERT_EQ(*c.free_blocks(g), 24 - 21);
  for (bool open : {false, true}) {
    SCOPED_TRACE(open ? "with a begun step" : "without a begun step");
    if (open) {
      const StepEntry one{2, 1, nullptr};
      w.step = *c.begin_step(&one, 1);  // takes the last 3 free blocks: block 0 of seq 2 in each group
      w.open = true;
    }
    // 3 blocks are free, or held by the begun step (which the new one would replace).
    EXPECT_EQ(*c.free_blocks(1), open ? 0 : 3);
    // seq 0 at 36 and seq 1 at 8 each start a block in each of the 3 groups: 6 blocks.
    const StepEntry entries[] = {{0, 1, nullptr}, {1, 4, nullptr}};
    const Before b = before(w);
    expect_refused(w, c.begin_step(entries, 2).status(), Error::OutOfResources,
                   {"begin_step: the step needs 6 blocks over its 3 groups, 3 of the pool's 24 are free"}, b);
  }
  EXPECT_TRUE(c.commit(w.step).ok());
  EXPECT_EQ(*c.free_blocks(1), 0);
  // Released sequences leave their full blocks cached; a step reclaims them.
  ASSERT_TRUE(c.release_sequence(1).ok());
  EXPECT_EQ(*c.free_blocks(1), 6);  // seq 1's 2 blocks in each group
  EXPECT_EQ(*c.cached_blocks(1), 2);
  const StepEntry entries[] = {{0, 1, nullptr}, {2, 4, nullptr}};  // 1 + 1 new blocks in each group
  EXPECT_TRUE(c.begin_step(entries, 2).ok());
  EXPECT_EQ(*c.free_blocks(1), 0);
  EXPECT_EQ(*c.cached_blocks(1), 0);
}

// --- stale steps -------------------------------------------------------------

TEST(BatchCacheErrors, AStaleStepIsInvalidStateForCommitAbortPlanAndCheckStep) {
  auto expect_stale = [](const World& w, const BatchStep& stale, const std::string& why) {
    SCOPED_TRACE(why);
    BatchCache& c = *w.cache;
    const Before b = before(w);
    const std::string id = "step " + std::to_string(stale.id) + ": ";
    const bool none = !w.open;
    const std::string rule = none ? "no step is begun" : "not the begun step (" + std::to_string(w.step.id) + ")";
    expect_refused(w, c.check_step(stale), Error::InvalidState, {id + rule}, b);
    expect_refused(w, c.plan(stale).status(), Error::InvalidState, {id + rule}, b);
    expect_refused(w, c.commit(stale), Error::InvalidState, {id + rule}, b);
    expect_refused(w, c.abort(stale), Error::InvalidState, {id + rule}, b);
  };
  World w = make_world(true);
  ASSERT_NE(w.cache, nullptr);
  BatchCache& c = *w.cache;
  const BatchStep first = w.step;
  // Forged handles while a step is begun.
  expect_stale(w, BatchStep{}, "the empty handle");
  expect_stale(w, BatchStep{first.id + 1, first.n_entries, first.n_tokens}, "a forged id");
  // After commit: no step is begun.
  ASSERT_TRUE(c.commit(first).ok());
  w.open = false;
  expect_stale(w, first, "after commit");
  // After a replacing begin_step.
  const StepEntry e0{0, 1, nullptr}, e2{2, 2, nullptr};
  const BatchStep replaced = *c.begin_step(&e0, 1);
  w.step = *c.begin_step(&e2, 1);
  w.open = true;
  expect_stale(w, replaced, "after a replacing begin_step");
  // After a verb: every successful verb ends the step, even one that changes nothing.
  const BatchStep ended = w.step;
  ASSERT_TRUE(c.rewind(0, c.sequence(0)->length).ok());
  w.open = false;
  expect_stale(w, ended, "after rewind to the length");
  auto begin = [&c] {
    const StepEntry again{0, 1, nullptr};
    auto s = c.begin_step(&again, 1);
    EXPECT_TRUE(s.ok()) << s.message().c_str();
    return s.ok() ? *s : BatchStep{};
  };
  BatchStep s = begin();
  ASSERT_TRUE(c.add_sequence(3).ok());
  expect_stale(w, s, "after add_sequence");
  s = begin();
  ASSERT_TRUE(c.release_sequence(3).ok());
  expect_stale(w, s, "after release_sequence");
  s = begin();
  ASSERT_TRUE(c.fork(0, 5, 26).ok());
  expect_stale(w, s, "after fork");
  s = begin();
  ASSERT_TRUE(c.remove(0, 40, 50).ok());
  expect_stale(w, s, "after a remove of nothing");
  s = begin();
  ASSERT_TRUE(c.remove(5, 0, 1).ok());
  expect_stale(w, s, "after a remove of the head");
  s = begin();
  ASSERT_TRUE(c.remove(5, 20, 21).ok());
  expect_stale(w, s, "after a remove of a middle range");
  s = begin();
  ASSERT_TRUE(c.rewind(5, 25).ok());
  expect_stale(w, s, "after rewind");
  ASSERT_TRUE(c.release_sequence(5).ok());
  ASSERT_TRUE(c.add_sequence(5).ok());
  s = begin();
  ASSERT_TRUE(c.adopt_prefix(5, kTokens, 0).ok());
  expect_stale(w, s, "after adopt_prefix");
  s = begin();
  c.clear();
  expect_stale(w, s, "after clear");
}

// --- groups, layers and positions of queries ---------------------------------

TEST(BatchCacheErrors, GroupOutOfRangeIsInvalidArgumentForEveryQuery) {
  in_both_worlds([](World& w) {
    const BatchCache& c = *w.cache;
    ASSERT_EQ(c.n_groups(), 3);
    for (int g : {-1, 3, INT_MAX, INT_MIN}) {
      SCOPED_TRACE("group " + std::to_string(g));
      const std::string range = "group = " + std::to_string(g) + ": must be in [0, n_groups = 3)";
      const Before b = before(w);
      expect_refused(w, c.free_blocks(g).status(), Error::InvalidArgument, {range}, b);
      expect_refused(w, c.cached_blocks(g).status(), Error::InvalidArgument, {range}, b);
      expect_refused(w, c.blocks_held(0, g).status(), Error::InvalidArgument, {range}, b);
      expect_refused(w, c.oldest_held(0, g).status(), Error::InvalidArgument, {range}, b);
      expect_refused(w, c.group_policy(g).status(), Error::InvalidArgument, {range}, b);
      expect_refused(w, c.num_blocks(g).status(), Error::InvalidArgument, {range}, b);
      expect_refused(w, c.visible(g, 0, 1, 0).status(), Error::InvalidArgument, {range}, b);
    }
  });
}

TEST(BatchCacheErrors, LayerOutOfRangeIsInvalidArgumentForEveryQuery) {
  in_both_worlds([](World& w) {
    const BatchCache& c = *w.cache;
    for (int l : {-1, 4, INT_MAX, INT_MIN}) {
      const std::string range = "layer = " + std::to_string(l) + ": must be in [0, n_layers = 4)";
      const Before b = before(w);
      expect_refused(w, c.group_of(l).status(), Error::InvalidArgument, {range}, b);
      expect_refused(w, c.layer_config(l).status(), Error::InvalidArgument, {range}, b);
    }
    EXPECT_EQ(*c.group_of(2), 0);
    EXPECT_EQ(*c.group_of(3), 2);
  });
}

TEST(BatchCacheErrors, VisibleWithANegativePositionIsInvalidArgument) {
  in_both_worlds([](World& w) {
    for (auto qk : {std::pair<int, int>{-1, 0}, {0, -1}, {INT_MIN, INT_MIN}}) {
      const Before b = before(w);
      expect_refused(w, w.cache->visible(1, 0, qk.first, qk.second).status(), Error::InvalidArgument,
                     {"visible(q = " + std::to_string(qk.first) + ", k = " + std::to_string(qk.second) +
                      "): positions must be >= 0"},
                     b);
    }
  });
}

// --- the config --------------------------------------------------------------

// create() refuses `cfg`; so does validate_batch() when `by_validate` (a field's
// rule, not a table's size).
void expect_config_refused(const CacheConfig& cfg, Error code, const std::string& text, bool by_validate = false) {
  auto created = BatchCache::create(cfg);
  EXPECT_EQ(created.error(), code) << created.message().c_str();
  expect_message_has(created.status(), text);
  const Status v = kvcore::validate_batch(cfg);
  if (by_validate) {
    EXPECT_EQ(v.code(), code);
    expect_message_has(v, text);
  } else {
    EXPECT_TRUE(v.ok()) << v.message().c_str();
  }
}

TEST(BatchCacheErrors, ValidateBatchNamesEachBadField) {
  struct Case {
    void (*edit)(kvcore::BatchLimits&);
    const char* message;
  };
  const Case cases[] = {
      {[](kvcore::BatchLimits& b) { b.block_size = 0; }, "batch.block_size = 0: must be >= 1"},
      {[](kvcore::BatchLimits& b) { b.block_size = INT_MIN; }, "batch.block_size = -2147483648: must be >= 1"},
      {[](kvcore::BatchLimits& b) { b.max_seqs = 0; }, "batch.max_seqs = 0: must be in [1, 1048576]"},
      {[](kvcore::BatchLimits& b) { b.max_seqs = -3; }, "batch.max_seqs = -3: must be in [1, 1048576]"},
      {[](kvcore::BatchLimits& b) { b.max_seqs = (1 << 20) + 1; }, "batch.max_seqs = 1048577: must be in [1, 1048576]"},
      {[](kvcore::BatchLimits& b) { b.max_step_tokens = -1; },
       "batch.max_step_tokens = -1: must be >= 1 (or 0 for the default)"},
      {[](kvcore::BatchLimits& b) { b.num_blocks = -1; }, "batch.num_blocks = -1: must be >= 1 (or 0 for the default)"},
      {[](kvcore::BatchLimits& b) { b.max_holes = -1; }, "batch.max_holes = -1: must be in [0, 4096]"},
      {[](kvcore::BatchLimits& b) { b.max_holes = 4097; }, "batch.max_holes = 4097: must be in [0, 4096]"},
  };
  for (const Case& c : cases) {
    CacheConfig cfg = world_config();
    c.edit(cfg.batch);
    SCOPED_TRACE(c.message);
    expect_config_refused(cfg, Error::InvalidArgument, c.message, /*by_validate=*/true);
  }
  // validate()'s rules come first, with their own messages.
  CacheConfig cfg = world_config();
  cfg.capacity = 0;
  cfg.batch.block_size = 0;
  EXPECT_EQ(kvcore::validate_batch(cfg).code(), Error::InvalidArgument);
  expect_message_has(kvcore::validate_batch(cfg), "capacity = 0: must be >= 1");
  // The edges are valid.
  cfg = world_config();
  cfg.batch.max_seqs = 1;
  cfg.batch.max_holes = 0;
  cfg.batch.block_size = 1;
  EXPECT_TRUE(kvcore::validate_batch(cfg).ok());
  EXPECT_TRUE(BatchCache::create(cfg).ok());
}

// Tables past 2^31 entries (or pools past 2^31 rows) are refused before they
// are allocated: each of these would ask for gigabytes.
TEST(BatchCacheErrors, TablesPast2To31EntriesAreRefusedBeforeAllocation) {
  CacheConfig cfg;
  cfg.n_layers = 1;
  cfg.layers.push_back(LayerConfig{LayerPolicy::flat(), 1, 4, 0});
  // Block tables: 1 group x 4 sequences x 2^30 blocks.
  cfg.capacity = 1 << 30;
  cfg.max_step = 1;
  cfg.batch.block_size = 1;
  cfg.batch.max_seqs = 4;
  expect_config_refused(cfg, Error::InvalidArgument,
                        "1 groups x 4 sequences x 1073741824 blocks per table: the tables would pass 2^31 entries");
  // Pools: 2^20 blocks of 4096 rows.
  cfg.capacity = 64;
  cfg.batch.block_size = 4096;
  cfg.batch.num_blocks = 1 << 20;
  // (One pool for every group: the message names the pool, not a group.)
  expect_config_refused(cfg, Error::InvalidArgument, "the pool: 1048576 blocks of 4096 rows pass 2^31 rows");
  // The default pool: the sum over the groups of what each would need alone,
  // here one flat group's max_seqs x ceil(capacity / B) = (2^18 + 1) x 4
  // blocks ("or more": the sum stops once past 2^30).
  cfg.capacity = 8192;
  cfg.batch.block_size = 2048;
  cfg.batch.num_blocks = 0;
  cfg.batch.max_seqs = (1 << 18) + 1;
  expect_config_refused(cfg, Error::InvalidArgument, "the pool: 1048580 or more blocks of 2048 rows pass 2^31 rows");
  // The step's slots: one per token of a step, per group. (The message named
  // the block tables, 2 x 4 x 16 entries, before it named the culprit.)
  cfg = world_config();
  cfg.batch.max_step_tokens = 1 << 30;
  expect_config_refused(cfg, Error::InvalidArgument,
                        "3 groups x batch.max_step_tokens = 1073741824: the step's slot tables would pass 2^31 "
                        "entries");
  // The removed ranges: max_holes per sequence.
  cfg = world_config();
  cfg.capacity = 1;
  cfg.max_step = 1;
  cfg.batch.max_seqs = 1 << 20;
  cfg.batch.max_holes = 4096;
  expect_config_refused(cfg, Error::InvalidArgument,
                        "batch.max_seqs = 1048576 x batch.max_holes = 4096: the removed-range tables would pass "
                        "2^31 entries");
  // The tokens of each sequence's block being filled (prefix keys): B per
  // sequence, however small the pools. (Unchecked before: a 16 GiB request.)
  cfg = world_config();
  cfg.layers.resize(1);
  cfg.n_layers = 1;
  cfg.layers[0].policy = LayerPolicy::flat();
  cfg.batch.max_seqs = 1 << 20;
  cfg.batch.block_size = 1 << 12;
  cfg.batch.num_blocks = 1;
  expect_config_refused(cfg, Error::InvalidArgument,
                        "batch.max_seqs = 1048576 x batch.block_size = 4096: the prefix-token tables would pass "
                        "2^31 entries");
}

}  // namespace
}  // namespace kvcore_test
