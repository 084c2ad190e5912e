// Test-only helpers: config builders, a driver that runs one step of a cache
// against the simulated pools of reference.h, and a twin comparison that
// proves a failed call changed nothing.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "kvcore/core/sequence_cache.h"
#include "reference.h"

namespace kvcore_test {

using kvcore::Error;
using kvcore::LayerConfig;
using kvcore::SequenceCache;
using kvcore::Step;

inline LayerConfig layer_of(LayerPolicy p) { return LayerConfig{p, 2, 8, 0}; }

/// A config with one LayerConfig per policy (or one broadcast entry when
/// n_layers is larger than the list and the list has one entry).
inline CacheConfig make_config(int capacity, const std::vector<LayerPolicy>& policies,
                               int max_step = 0, int n_layers = 0) {
  CacheConfig cfg;
  cfg.capacity = capacity;
  cfg.n_layers = n_layers != 0 ? n_layers : static_cast<int>(policies.size());
  for (const LayerPolicy& p : policies) cfg.layers.push_back(layer_of(p));
  cfg.max_step = max_step;
  return cfg;
}

/// The config a cache reports through its planner face (max_step resolved).
/// (The core has no such call: building a std::vector could throw.)
inline CacheConfig config_of(const SequenceCache& cache) {
  CacheConfig cfg;
  cfg.capacity = cache.capacity();
  cfg.n_layers = cache.n_layers();
  cfg.max_step = cache.max_step();
  cfg.initial_capacity = cache.initial_capacity();
  for (int l = 0; l < cache.n_layers(); ++l) cfg.layers.push_back(*cache.layer_config(l));
  return cfg;
}

/// Creates the cache or records a failure and returns nullptr.
inline std::unique_ptr<SequenceCache> must_create(const CacheConfig& cfg) {
  auto r = SequenceCache::create(cfg);
  if (!r.ok()) {
    ADD_FAILURE() << "create(" << describe(cfg) << ") failed: " << r.message().c_str();
    return nullptr;
  }
  return std::move(r).get();
}

/// Begins a step of T tokens on `cache`, plans every layer through both plan
/// overloads (they must agree, and planning twice must give the same plan:
/// plans are pure), writes the plan into `sim`, checks every read, and commits
/// when `commit` is set. Returns "" on success, else what went wrong.
inline std::string run_step(SequenceCache& cache, PoolSim& sim, int T, bool commit = true,
                            Step* begun = nullptr) {
  auto step = cache.begin_step(T);
  if (!step.ok())
    return "begin_step(" + std::to_string(T) + ") at length " + std::to_string(cache.length()) +
           " failed: " + step.message().c_str();
  if (step->position != sim.length() || step->T != T)
    return "begin_step returned position " + std::to_string(step->position) + ", T " +
           std::to_string(step->T) + "; expected position " + std::to_string(sim.length());
  sim.begin(T);
  std::vector<SeqStepPlan> plans;
  for (int l = 0; l < cache.n_layers(); ++l) {
    auto by_pos = cache.plan(l, step->position, step->T);
    auto by_step = cache.plan(l, *step);
    auto again = cache.plan(l, step->position, step->T);
    if (!by_pos.ok() || !by_step.ok() || !again.ok())
      return "plan(" + std::to_string(l) + ") failed: " + by_pos.message().c_str() + by_step.message().c_str();
    if (*by_pos != *by_step || *by_pos != *again)
      return "plan overloads or repeated plans disagree on layer " + std::to_string(l);
    std::string err = sim.apply_writes(l, *by_pos);
    if (!err.empty()) return err;
    plans.push_back(*by_pos);
  }
  // Reads are checked after every layer's writes: the backend may write any time.
  for (int l = 0; l < cache.n_layers(); ++l) {
    std::string err = sim.check_reads(l, plans[static_cast<std::size_t>(l)]);
    if (!err.empty()) return err;
  }
  if (begun != nullptr) *begun = *step;
  if (commit) {
    kvcore::Status s = cache.commit(*step);
    if (!s.ok()) return std::string("commit failed: ") + s.message().c_str();
    sim.commit();
    if (cache.length() != sim.length())
      return "length " + std::to_string(cache.length()) + " after commit, expected " +
             std::to_string(sim.length());
  }
  return "";
}

/// Everything observable about `touched` equals the same on `twin`, a cache that
/// received the same successful calls but not the failed one: length, the begun
/// step, can_rewind everywhere, and the plans of the begun step. Then both
/// commit that step (if any) and plan one more step, which must agree too.
inline void expect_same_state(SequenceCache& touched, SequenceCache& twin) {
  EXPECT_EQ(touched.length(), twin.length());
  EXPECT_EQ(touched.active_step().id, twin.active_step().id);
  EXPECT_EQ(touched.active_step().position, twin.active_step().position);
  EXPECT_EQ(touched.active_step().T, twin.active_step().T);
  for (int n = -1; n <= twin.length() + 1; ++n)
    EXPECT_EQ(touched.can_rewind(n), twin.can_rewind(n)) << "can_rewind(" << n << ")";
  for (int n = 0; n <= twin.capacity() + 1; ++n)
    EXPECT_EQ(touched.can_extend(n), twin.can_extend(n)) << "can_extend(" << n << ")";
  const Step active = twin.active_step();
  if (active.id != 0) {
    for (int l = 0; l < twin.n_layers(); ++l) {
      auto a = touched.plan(l, active);
      auto b = twin.plan(l, active);
      ASSERT_TRUE(a.ok()) << "the begun step was lost: " << a.message().c_str();
      ASSERT_TRUE(b.ok());
      EXPECT_EQ(describe(*a), describe(*b)) << "layer " << l;
    }
    ASSERT_TRUE(touched.commit(active).ok());
    ASSERT_TRUE(twin.commit(active).ok());
  }
  if (twin.can_extend(1)) {
    auto a = touched.begin_step(1);
    auto b = twin.begin_step(1);
    ASSERT_TRUE(a.ok()) << a.message().c_str();
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(a->position, b->position);
    for (int l = 0; l < twin.n_layers(); ++l) {
      auto pa = touched.plan(l, *a);
      auto pb = twin.plan(l, *b);
      ASSERT_TRUE(pa.ok() && pb.ok());
      EXPECT_EQ(describe(*pa), describe(*pb)) << "layer " << l;
    }
  }
}

}  // namespace kvcore_test
