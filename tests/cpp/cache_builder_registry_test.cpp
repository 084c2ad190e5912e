// CacheBuilderRegistry: register/unregister/build, duplicates and missing
// builders, builder errors passing through, null results, builders that use
// the registry themselves, and the default ("cpu", "sequence") builder.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kvcore/registry/cache_builder_registry.h"
#include "kvcore/registry/default_builders.h"
#include "kvcore/registry/registry_storage.h"
#include "support/registry_text.h"
#include "kvcore/core/sequence_cache.h"

namespace kvcore {
namespace {

CacheConfig small_config(int capacity = 16) {
  CacheConfig cfg;
  cfg.capacity = capacity;
  cfg.n_layers = 2;
  cfg.layers = {LayerConfig{LayerPolicy::ring(4), 2, 8, 0}};
  cfg.max_step = 4;
  return cfg;
}

struct TaggedCache : CacheBase {
  explicit TaggedCache(int capacity) : capacity(capacity) {}
  int capacity;
};

Result<std::shared_ptr<CacheBase>> build_tagged(const CacheConfig& cfg) {
  return std::shared_ptr<CacheBase>(std::make_shared<TaggedCache>(cfg.capacity));
}
Result<std::shared_ptr<CacheBase>> build_failing(const CacheConfig& cfg) {
  return Status::make(Error::OutOfResources, "device has no room for %d rows", cfg.capacity);
}
Result<std::shared_ptr<CacheBase>> build_null(const CacheConfig&) {
  return std::shared_ptr<CacheBase>();
}

TEST(CacheBuilderRegistry, RegisterBuildUnregister) {
  CacheBuilderRegistry reg;
  ASSERT_EQ(reg.register_builder("npu", "tagged", &build_tagged), Error::Ok);
  EXPECT_TRUE(reg.contains("npu", "tagged"));
  EXPECT_EQ(reg.size(), 1u);
  auto built = reg.build("npu", "tagged", small_config(32));
  ASSERT_TRUE(built.ok()) << built.message().c_str();
  EXPECT_EQ(static_cast<TaggedCache&>(*built.get()).capacity, 32);

  ASSERT_EQ(reg.unregister_builder("npu", "tagged"), Error::Ok);
  EXPECT_FALSE(reg.contains("npu", "tagged"));
  EXPECT_EQ(reg.build("npu", "tagged", small_config()).error(), Error::NotFound);
}

TEST(CacheBuilderRegistry, KeyIsThePairNotAConcatenation) {
  // "a" + "bc" and "ab" + "c" would collide as one concatenated string.
  CacheBuilderRegistry reg;
  ASSERT_EQ(reg.register_builder("a", "bc", &build_tagged), Error::Ok);
  ASSERT_EQ(reg.register_builder("ab", "c", &build_failing), Error::Ok);
  EXPECT_TRUE(reg.build("a", "bc", small_config()).ok());
  EXPECT_EQ(reg.build("ab", "c", small_config()).error(), Error::OutOfResources);
  using Pair = std::pair<std::string, std::string>;
  EXPECT_EQ(kvcore_test::texts(reg.keys()), (std::vector<Pair>{{"a", "bc"}, {"ab", "c"}}));
}

TEST(CacheBuilderRegistry, DuplicateIsRefusedAndKeepsTheFirst) {
  CacheBuilderRegistry reg;
  ASSERT_EQ(reg.register_builder("npu", "k", &build_tagged), Error::Ok);
  Status s = reg.register_builder("npu", "k", &build_failing);
  EXPECT_EQ(s.code(), Error::RegistrationAlreadyRegistered);
  EXPECT_NE(std::strstr(s.message().c_str(), "'npu'"), nullptr) << s.message().c_str();
  EXPECT_TRUE(reg.build("npu", "k", small_config()).ok());
}

TEST(CacheBuilderRegistry, MissingBuilderIsNotFoundNamingThePair) {
  CacheBuilderRegistry reg;
  auto built = reg.build("gpu", "paged", small_config());
  EXPECT_EQ(built.error(), Error::NotFound);
  EXPECT_NE(std::strstr(built.message().c_str(), "'gpu'"), nullptr) << built.message().c_str();
  EXPECT_NE(std::strstr(built.message().c_str(), "'paged'"), nullptr) << built.message().c_str();
  EXPECT_EQ(reg.unregister_builder("gpu", "paged"), Error::NotFound);
}

TEST(CacheBuilderRegistry, InvalidNamesOrEmptyBuilderChangeNothing) {
  CacheBuilderRegistry reg;
  EXPECT_EQ(reg.register_builder("", "k", &build_tagged), Error::InvalidArgument);
  EXPECT_EQ(reg.register_builder("b", "", &build_tagged), Error::InvalidArgument);
  EXPECT_EQ(reg.register_builder("b", "k", CacheBuilder()), Error::InvalidArgument);
  EXPECT_EQ(reg.unregister_builder("", "k"), Error::InvalidArgument);
  EXPECT_EQ(reg.build("b", "", small_config()).error(), Error::InvalidArgument);
  EXPECT_EQ(reg.size(), 0u);
}

TEST(CacheBuilderRegistry, BuilderErrorPassesThroughUnchanged) {
  CacheBuilderRegistry reg;
  ASSERT_EQ(reg.register_builder("npu", "k", &build_failing), Error::Ok);
  auto built = reg.build("npu", "k", small_config(24));
  EXPECT_EQ(built.error(), Error::OutOfResources);
  EXPECT_STREQ(built.message().c_str(), "device has no room for 24 rows");
}

TEST(CacheBuilderRegistry, NullResultIsInternal) {
  CacheBuilderRegistry reg;
  ASSERT_EQ(reg.register_builder("npu", "k", &build_null), Error::Ok);
  auto built = reg.build("npu", "k", small_config());
  EXPECT_EQ(built.error(), Error::Internal);
  EXPECT_NE(std::strstr(built.message().c_str(), "null"), nullptr) << built.message().c_str();
}

TEST(CacheBuilderRegistry, InvalidConfigNeverReachesTheBuilder) {
  CacheBuilderRegistry reg;
  int calls = 0;
  ASSERT_EQ(reg.register_builder("npu", "k", kvcore_test::callable([&calls](const CacheConfig& c) {
              ++calls;
              return build_tagged(c);
            })),
            Error::Ok);
  CacheConfig bad = small_config();
  bad.capacity = 0;
  auto built = reg.build("npu", "k", bad);
  EXPECT_EQ(built.error(), Error::InvalidArgument);
  EXPECT_NE(std::strstr(built.message().c_str(), "capacity = 0"), nullptr) << built.message().c_str();
  EXPECT_EQ(calls, 0);
}

TEST(CacheBuilderRegistry, CapturingCallableKeepsItsState) {
  CacheBuilderRegistry reg;
  auto counter = std::make_shared<int>(0);
  ASSERT_EQ(reg.register_builder("npu", "counted",
                                 kvcore_test::callable([counter](const CacheConfig& c) {
                                   ++*counter;
                                   return build_tagged(c);
                                 })),
            Error::Ok);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(reg.build("npu", "counted", small_config()).ok());
  EXPECT_EQ(*counter, 3);
}

TEST(CacheBuilderRegistry, ABuilderMayUseTheRegistryItRunsIn) {
  // Builders run outside the lock; under it these calls would deadlock.
  CacheBuilderRegistry reg;
  ASSERT_EQ(reg.register_builder("npu", "inner", &build_tagged), Error::Ok);
  ASSERT_EQ(reg.register_builder("npu", "outer",
                                 kvcore_test::callable([&reg](const CacheConfig& c) {
                                   EXPECT_TRUE(reg.contains("npu", "inner"));
                                   EXPECT_EQ(reg.register_builder("npu", "late", &build_tagged),
                                             Error::Ok);
                                   return reg.build("npu", "inner", c);
                                 })),
            Error::Ok);
  auto built = reg.build("npu", "outer", small_config(40));
  ASSERT_TRUE(built.ok()) << built.message().c_str();
  EXPECT_EQ(static_cast<TaggedCache&>(*built.get()).capacity, 40);
  EXPECT_TRUE(reg.contains("npu", "late"));
}

TEST(CacheBuilderRegistry, UnregisteringDuringABuildKeepsItsStateUntilTheBuildEnds) {
  CacheBuilderRegistry reg;
  auto state = std::make_shared<int>(5);
  std::weak_ptr<int> watch = state;
  bool alive_after_unregister = false;
  ASSERT_EQ(reg.register_builder("npu", "self-removing",
                                 kvcore_test::callable([&reg, &alive_after_unregister,
                                                              state](const CacheConfig& c) {
                                   EXPECT_EQ(reg.unregister_builder("npu", "self-removing"),
                                             Error::Ok);
                                   alive_after_unregister = *state == 5;
                                   return build_tagged(c);
                                 })),
            Error::Ok);
  state.reset();
  EXPECT_FALSE(watch.expired());
  ASSERT_TRUE(reg.build("npu", "self-removing", small_config()).ok());
  EXPECT_TRUE(alive_after_unregister);
  EXPECT_TRUE(watch.expired());  // the build's copy was the last owner
  EXPECT_FALSE(reg.contains("npu", "self-removing"));
}

TEST(CacheBuilderRegistry, ConcurrentRegisterOfOnePairHasOneWinner) {
  CacheBuilderRegistry reg;
  constexpr int kThreads = 8;
  constexpr int kPairs = 500;
  std::atomic<int> wins{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&] {
      for (int k = 0; k < kPairs; ++k) {
        Status s = reg.register_builder("npu", "kind" + std::to_string(k), &build_tagged);
        if (s.ok()) ++wins;
        (void)reg.build("npu", "kind" + std::to_string(k / 2), small_config());
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(wins.load(), kPairs);
  EXPECT_EQ(reg.size(), static_cast<std::size_t>(kPairs));
}

TEST(DefaultBuilders, CpuSequenceBuildsASequenceCache) {
  CacheBuilderRegistry reg;
  ASSERT_EQ(register_default_builders(reg), Error::Ok);
  ASSERT_TRUE(reg.contains(kCpuBackend, kSequenceKind));
  const CacheConfig cfg = small_config(20);
  auto built = reg.build("cpu", "sequence", cfg);
  ASSERT_TRUE(built.ok()) << built.message().c_str();
  SequenceControl* control = built.get()->as_control();
  SequencePlanner* planner = built.get()->as_planner();
  ASSERT_NE(control, nullptr);
  ASSERT_NE(planner, nullptr);
  EXPECT_EQ(control->capacity(), 20);
  EXPECT_EQ(control->max_step(), 4);
  EXPECT_EQ(planner->n_layers(), 2);
  auto step = control->begin_step(3);
  ASSERT_TRUE(step.ok());
  auto plan = planner->plan(0, step->position, step->T);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->write_len(), 3);
}

TEST(DefaultBuilders, SequenceBuilderErrorsPassThrough) {
  CacheBuilderRegistry reg;
  ASSERT_EQ(register_default_builders(reg), Error::Ok);
  CacheConfig bad = small_config();
  bad.max_step = 99;  // > capacity
  auto built = reg.build("cpu", "sequence", bad);
  EXPECT_EQ(built.error(), Error::InvalidArgument);
  EXPECT_NE(std::strstr(built.message().c_str(), "max_step = 99"), nullptr) << built.message().c_str();
}

TEST(DefaultBuilders, RegisteringTwiceKeepsTheExistingBuilder) {
  CacheBuilderRegistry reg;
  ASSERT_EQ(reg.register_builder("cpu", "sequence", &build_failing), Error::Ok);
  EXPECT_EQ(register_default_builders(reg), Error::Ok);
  EXPECT_EQ(reg.build("cpu", "sequence", small_config()).error(), Error::OutOfResources);
  // The batch builder, not registered before, is added beside it.
  EXPECT_EQ(reg.size(), 2u);
  auto batch = reg.build("cpu", "batch", small_config());
  ASSERT_TRUE(batch.ok()) << batch.message().c_str();
  EXPECT_NE(batch.get()->as_batch_control(), nullptr);
  EXPECT_EQ(batch.get()->as_control(), nullptr);
}

TEST(DefaultBuilders, EachKindRegistersAloneAndTheDefaultRegistersBoth) {
  CacheBuilderRegistry sequence_only;
  ASSERT_EQ(register_sequence_builders(sequence_only), Error::Ok);
  EXPECT_EQ(sequence_only.size(), 1u);
  EXPECT_TRUE(sequence_only.contains(kCpuBackend, kSequenceKind));
  EXPECT_EQ(sequence_only.build(kCpuBackend, kBatchKind, small_config()).error(), Error::NotFound);
  EXPECT_EQ(register_sequence_builders(sequence_only), Error::Ok);  // again: kept, Ok
  EXPECT_EQ(sequence_only.size(), 1u);

  CacheBuilderRegistry batch_only;
  ASSERT_EQ(register_batch_builders(batch_only), Error::Ok);
  EXPECT_EQ(batch_only.size(), 1u);
  auto batch = batch_only.build(kCpuBackend, kBatchKind, small_config());
  ASSERT_TRUE(batch.ok()) << batch.message().c_str();
  EXPECT_NE(batch.get()->as_batch_control(), nullptr);
  EXPECT_FALSE(batch_only.contains(kCpuBackend, kSequenceKind));

  // The default after one kind adds the other beside it.
  EXPECT_EQ(register_default_builders(batch_only), Error::Ok);
  EXPECT_EQ(batch_only.size(), 2u);
  EXPECT_TRUE(batch_only.contains(kCpuBackend, kSequenceKind));
}

TEST(CacheBuilderRegistry, GlobalIsOneObjectBackedByTheStorage) {
  EXPECT_EQ(&global_builders(), &global_builders());
  EXPECT_EQ(&global_builders(), &registry_storage().builders);
}

}  // namespace
}  // namespace kvcore
