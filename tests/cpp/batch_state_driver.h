// Drives a BatchCache with State layers against batch_state_reference.h and
// a twin BatchCache of the same model without its State layers (the block
// groups must plan, copy and answer exactly as the twin's): random verbs and
// steps (chains with and without verify, trees with random accepted paths,
// aborts and steps left begun, forks, rewinds, removals, prefix lookups,
// clears), each checked against the contract; refused calls change nothing.
// With batch.states_in_pool the states take the pool's blocks, so the twin
// gets an ample pool and only the steps the cache begins: a step may be
// refused for blocks (OutOfResources, nothing changed), block ids are not
// compared (the pools differ), and no block a table names is a state slot
// some sequence or the step names (no block is in two places).
// `R` draws numbers: operator()(lo, hi) in [lo, hi] and percent(p). Free of
// gtest: batch_state_test.cpp (std::mt19937) and the batch fuzzer (its bytes)
// use it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "batch_reference.h"
#include "batch_state_reference.h"
#include "kvcore/batch/batch_cache.h"

namespace kvcore_test {
namespace state_ref {

using kvcore::AcceptedPath;
using kvcore::BatchCache;
using kvcore::CacheConfig;
using kvcore::Error;
using kvcore::LayerConfig;
using kvcore::LayerPolicy;
using kvcore::StepEntry;

/// `cfg` without its State layers (Shared sources renumbered); n_layers 0 when
/// every layer is a State layer.
inline CacheConfig without_state(const CacheConfig& cfg) {
  CacheConfig t = cfg;
  t.layers.clear();
  std::vector<int> index(static_cast<std::size_t>(cfg.n_layers), -1);
  for (int l = 0; l < cfg.n_layers; ++l) {
    LayerConfig lc = cfg.layer(l);
    if (lc.policy.kind == LayerPolicy::Kind::State) continue;
    if (lc.policy.kind == LayerPolicy::Kind::Shared)
      lc.policy = LayerPolicy::shared(index[static_cast<std::size_t>(lc.policy.source)]);
    index[static_cast<std::size_t>(l)] = static_cast<int>(t.layers.size());
    t.layers.push_back(lc);
  }
  t.n_layers = static_cast<int>(t.layers.size());
  return t;
}

struct Counts {
  int steps = 0, reads = 0, commits = 0, tree_commits = 0, state_copies = 0, aborts = 0, forks = 0,
      rewinds = 0, refusals = 0, rewind_checks = 0, hits = 0;
  int named_freed = 0;  // blocks release_named_state made free (states in the pool)
};

template <class R>
class Driver {
 public:
  Driver(const CacheConfig& cfg, R& r, Counts& counts) : cfg_(cfg), r_(r), n_(counts) {}

  /// Builds the cache and its twin; then up to `ops` operations, while
  /// more() says so. "" when every one followed the contract.
  template <class More>
  std::string run(int ops, More more) {
    auto made = BatchCache::create(cfg_);
    if (!made.ok()) return std::string("create: ") + made.message().c_str();
    cache_ = std::move(made).get();
    CacheConfig t = without_state(cfg_);
    if (t.n_layers > 0) {
      if (cfg_.batch.states_in_pool) t.batch.num_blocks = 1 << 16;  // ample: it never refuses for blocks
      auto twin = BatchCache::create(t);
      if (!twin.ok()) return std::string("the twin's create: ") + twin.message().c_str();
      twin_ = std::move(twin).get();
    }
    if (twin_ && cache_->n_groups() != twin_->n_groups()) return "n_groups differs from the twin's";
    model_.reset(new Model(*cache_, cfg_.batch.max_seqs));
    for (int op = 0; op < ops && more(); ++op) {
      const std::string err = one();
      if (!err.empty()) return "op " + std::to_string(op) + ": " + err;
      const std::string rw = check_answers();
      if (!rw.empty()) return "op " + std::to_string(op) + ": " + rw;
    }
    return "";
  }

 private:
  int max_seqs() const { return cfg_.batch.max_seqs; }
  bool active(int s) const { return cache_->sequence(s)->active; }
  int length(int s) const { return cache_->sequence(s)->length; }

  // A verb succeeded: a begun step has ended (the backend wrote some, all or none of it).
  void ended() {
    if (!begun_) return;
    if (r_.percent(50)) model_->apply_writes();
    begun_ = false;
  }

  std::string same(const kvcore::Status& a, const kvcore::Status& b, const char* what) {
    if (a.code() != b.code())
      return std::string(what) + ": " + a.message().c_str() + " vs the twin's " + b.message().c_str();
    return "";
  }

  std::string check_answers() {
    for (int s = 0; s < max_seqs(); ++s) {
      const kvcore::SequenceInfo info = *cache_->sequence(s);
      if (twin_ != nullptr) {
        const kvcore::SequenceInfo t = *twin_->sequence(s);
        if (t.active != info.active || t.length != info.length) return "seq " + std::to_string(s) + " differs from the twin";
      }
      if (info.active && info.length != model_->seq(s).length()) return "seq " + std::to_string(s) + ": length";
      for (int n = -1; n <= info.length + 1; ++n) {
        const bool kv = twin_ != nullptr ? twin_->can_rewind(s, n) : info.active && n >= 0 && n <= info.length;
        const bool want = kv && model_->holds(s, n);
        ++n_.rewind_checks;
        if (cache_->can_rewind(s, n) != want)
          return "can_rewind(" + std::to_string(s) + ", " + std::to_string(n) + ") = " +
                 std::to_string(!want) + ", the contract says " + std::to_string(want);
      }
    }
    return "";
  }

  int pick_active() {
    std::vector<int> a;
    for (int s = 0; s < max_seqs(); ++s)
      if (active(s)) a.push_back(s);
    return a.empty() ? -1 : a[static_cast<std::size_t>(r_(0, static_cast<int>(a.size()) - 1))];
  }

  std::string one() {
    const int kind = r_(0, 99);
    if (kind < 12) return add();
    if (kind < 16) return release();
    if (kind < 60) return step();
    if (kind < 70) return fork();
    if (kind < 80) return rewind();
    if (kind < 88) return remove();
    if (kind < 94) return adopt();
    if (kind < 95) {
      cache_->clear();
      if (twin_) twin_->clear();
      ended();
      model_->clear();
      return "";
    }
    return finish();  // commit or abort a begun step
  }

  std::string add() {
    const int s = r_(0, max_seqs() - 1);
    const kvcore::Status st = cache_->add_sequence(s);
    if (twin_) {
      const std::string e = same(st, twin_->add_sequence(s), "add_sequence");
      if (!e.empty()) return e;
    }
    if (st.ok()) ended(), model_->add(s);
    return "";
  }

  std::string release() {
    const int s = pick_active();
    if (s < 0) return "";
    if (cache_->release_sequence(s) != Error::Ok) return "release refused";
    if (twin_ && twin_->release_sequence(s) != Error::Ok) return "twin release refused";
    ended();
    model_->release(s);
    return "";
  }

  std::string fork() {
    const int src = pick_active();
    if (src < 0) return "";
    const int dst = r_(0, max_seqs() - 1);
    const int upto = r_(0, length(src));
    const bool state_refuses = dst != src && (!active(dst) || length(dst) == 0) && !model_->holds(src, upto);
    const Snapshot before = snapshot(*cache_);
    const kvcore::Status st = cache_->fork(src, dst, upto);
    if (state_refuses) {
      ++n_.refusals;
      if (st.code() != Error::InvalidState && st.code() != Error::OutOfResources)
        return "fork past a lost state: " + std::string(st.message().c_str());
      if (!(snapshot(*cache_) == before)) return "a refused fork changed the cache";
      return "";
    }
    if (twin_) {
      const std::string e = same(st, twin_->fork(src, dst, upto), "fork");
      if (!e.empty()) return e;
    }
    if (st.ok()) ended(), model_->fork(src, dst, upto), ++n_.forks;
    return "";
  }

  std::string truncate_like(int s, int n, const kvcore::Status& st, const kvcore::Status* twin_st) {
    if (n > 0 && !model_->holds(s, n)) {
      ++n_.refusals;
      if (st.code() != Error::InvalidState) return "a truncation past a lost state: " + std::string(st.message().c_str());
      return "";
    }
    if (twin_st != nullptr) {
      const std::string e = same(st, *twin_st, "truncation");
      if (!e.empty()) return e;
    }
    if (st.ok()) ended(), model_->truncate(s, n), ++n_.rewinds;
    return "";
  }

  std::string rewind() {
    const int s = pick_active();
    if (s < 0) return "";
    const int n = r_(0, length(s));
    const kvcore::Status st = cache_->rewind(s, n);
    if (n > 0 && !model_->holds(s, n)) return truncate_like(s, n, st, nullptr);
    kvcore::Status t;
    if (twin_) t = twin_->rewind(s, n);
    return truncate_like(s, n, st, twin_ ? &t : nullptr);
  }

  std::string remove() {
    const int s = pick_active();
    if (s < 0) return "";
    const int L = length(s);
    const int p0 = r_(0, L + 1);
    const int p1 = r_(p0, L + 2);
    const Snapshot before = snapshot(*cache_);
    const kvcore::Status st = cache_->remove(s, p0, p1);
    if (p1 >= L) {  // the tail, or nothing
      if (p0 >= L) {
        if (!st.ok()) return "a remove naming nothing refused";
        if (twin_ && twin_->remove(s, p0, p1) != Error::Ok) return "twin refused";
        ended();
        return "";
      }
      if (p0 > 0 && !model_->holds(s, p0)) return truncate_like(s, p0, st, nullptr);
      kvcore::Status t;
      if (twin_) t = twin_->remove(s, p0, p1);
      return truncate_like(s, p0, st, twin_ ? &t : nullptr);
    }
    if (p0 == p1 || p1 <= 0) {
      if (!st.ok()) return "an empty remove refused";
      if (twin_ && twin_->remove(s, p0, p1) != Error::Ok) return "twin refused";
      ended();
      return "";
    }
    ++n_.refusals;
    if (st.code() != Error::NotSupported) return "a middle remove: " + std::string(st.message().c_str());
    if (!(snapshot(*cache_) == before)) return "a refused remove changed the cache";
    return "";
  }

  // A prompt: often an active sequence's tokens (a prefix of them and a
  // tail), so that named state snapshots are hit.
  std::string adopt() {
    int s = r_(0, max_seqs() - 1);
    for (int q = 0; q < max_seqs(); ++q)  // mostly an empty active sequence: one that can adopt
      if (active(q) && length(q) == 0 && r_.percent(80)) s = q;
    std::vector<std::int32_t> tokens;
    const int from = pick_active();
    if (from >= 0 && r_.percent(70)) {
      const std::vector<std::int32_t>& known = model_->tokens(from);
      tokens.assign(known.begin(), known.begin() + r_(0, static_cast<int>(known.size())));
      for (int i = r_(1, 3); i > 0; --i) tokens.push_back(r_(0, 9));
      if (static_cast<int>(tokens.size()) > cfg_.capacity) tokens.resize(static_cast<std::size_t>(cfg_.capacity));
    } else {
      tokens.resize(static_cast<std::size_t>(r_(1, std::min(20, cfg_.capacity))));
      for (auto& t : tokens) t = r_(0, 3);
    }
    const int n = static_cast<int>(tokens.size());
    auto hit = cache_->adopt_prefix(s, tokens.data(), n);
    const int B = cfg_.batch.block_size;
    if (hit.ok() && *hit % B != 0) return "a hit of " + std::to_string(*hit) + " positions: not whole blocks";
    if (hit.ok() && *hit % cache_->state_block_size() != 0)  // states are named only on their block's multiples
      return "a hit of " + std::to_string(*hit) + " positions: not whole State blocks of " +
             std::to_string(cache_->state_block_size());
    if (hit.ok() && *hit > 0 && cfg_.batch.state_snapshots == 0) return "a prefix hit without state snapshots";
    if (twin_) {
      // The twin's block groups serve exactly the hit: a State group's
      // snapshots only shorten it (adopting at most hit / B blocks).
      auto t = twin_->adopt_prefix(s, tokens.data(), hit.ok() && *hit > 0 ? *hit + 1 : 0);
      const std::string e = same(hit.status(), t.status(), "adopt_prefix");
      if (!e.empty()) return e;
      if (hit.ok() && *t != *hit) return "the hit " + std::to_string(*hit) + " is not the twin's " + std::to_string(*t);
    }
    if (hit.ok()) {
      ended();
      if (*hit > 0) model_->adopt(s, tokens.data(), *hit), ++n_.hits;
      // Another sequence gives back the latest state it named (no draw: the
      // workloads stay as they were); its states still read right after.
      const int q = (s + 1) % max_seqs();
      if (active(q)) {
        const bool pooled = cache_->n_groups() > 0;
        const int free_before = pooled ? *cache_->free_blocks(0) : 0;
        auto freed = cache_->release_named_state(q);
        if (!freed.ok()) return std::string("release_named_state refused: ") + freed.message().c_str();
        if (*freed < 0 || (!cfg_.batch.states_in_pool && *freed != 0) || *freed > cache_->n_state_groups())
          return "release_named_state freed " + std::to_string(*freed) + " blocks";
        if (pooled && *cache_->free_blocks(0) != free_before + *freed)
          return "release_named_state freed " + std::to_string(*freed) + " blocks, free_blocks says otherwise";
        n_.named_freed += *freed;
      }
    }
    return "";
  }

  std::string step() {
    const int n = r_(1, 3);
    std::vector<Entry> entries;
    std::vector<StepEntry> raw;
    std::vector<bool> used(static_cast<std::size_t>(max_seqs()), false);
    for (int i = 0; i < n; ++i) {
      const int s = pick_active();
      if (s < 0 || used[static_cast<std::size_t>(s)]) continue;
      used[static_cast<std::size_t>(s)] = true;
      Entry e;
      e.seq = s;
      const int kind = r_(0, 2);
      const int keep_max = std::min(cfg_.effective_max_step(), model_->min_slots());  // may pass D - 1: refused
      e.T = kind == 0 ? r_(1, cfg_.effective_max_step()) : r_(1, keep_max);
      e.keep_each = kind != 0;
      e.parents.resize(static_cast<std::size_t>(e.T));
      for (int j = 0; j < e.T; ++j) e.parents[static_cast<std::size_t>(j)] = kind == 2 && j > 0 ? r_(0, j - 1) : j - 1;
      e.tokens.resize(static_cast<std::size_t>(e.T));
      for (auto& t : e.tokens) t = r_(0, 9);
      entries.push_back(e);
    }
    if (entries.empty()) return "";
    for (std::size_t i = 0; i < entries.size(); ++i) {
      StepEntry se{entries[i].seq, entries[i].T, entries[i].tokens.data(), nullptr};
      const bool tree = entries[i].keep_each && (r_.percent(50) || entries[i].parents != chain_of(entries[i].T));
      if (tree) se.parents = entries[i].parents.data();
      else se.verify = entries[i].keep_each;
      raw.push_back(se);
    }
    bool state_refuses = false;
    for (const auto& e : entries) state_refuses |= model_->refusal(e) != 0;
    const Snapshot before = snapshot(*cache_);
    auto step = cache_->begin_step(raw.data(), static_cast<int>(raw.size()));
    if (state_refuses) {
      ++n_.refusals;
      if (step.ok()) return "a step the State groups cannot take was begun";
      if (!(snapshot(*cache_) == before)) return "a refused step changed the cache";
      return "";
    }
    kvcore::BatchStep tstep;
    if (twin_ && (step.ok() || !cfg_.batch.states_in_pool)) {
      auto t = twin_->begin_step(raw.data(), static_cast<int>(raw.size()));
      const std::string e = same(step.status(), t.status(), "begin_step");
      if (!e.empty()) return e;
      if (t.ok()) tstep = *t;
    }
    if (!step.ok()) {
      if (!cfg_.batch.states_in_pool) return "";
      ++n_.refusals;
      const bool too_many = step.status().code() == Error::InvalidArgument && total_tokens(raw) > max_step_tokens();
      if (step.status().code() != Error::OutOfResources && !too_many)
        return std::string("a step refused with states in the pool: ") + step.status().message().c_str();
      if (!(snapshot(*cache_) == before)) return "a refused step changed the cache";
      return "";
    }
    ended();
    model_->begin(entries);
    const kvcore::BatchStepPlan plan = *cache_->plan(*step);
    if (cfg_.batch.states_in_pool) {
      const std::string e = states_apart(plan);
      if (!e.empty()) return e;
    }
    if (twin_ && !cfg_.batch.states_in_pool && !(copy_of(plan) == copy_of(*twin_->plan(tstep))))
      return "the block groups' plan differs from the twin's";
    const std::string err = model_->check_reads(plan, entries);
    if (!err.empty()) return err;
    ++n_.steps;
    n_.reads += plan.n_tokens;
    begun_ = true;
    step_ = *step;
    if (twin_) twin_step_ = tstep;
    entries_ = entries;
    raw_ = raw;
    return r_.percent(70) ? finish() : "";
  }

  // With states in the pool: no block a table row of the plan names is a
  // state slot a sequence's logical slot or the step's reads and writes name.
  std::string states_apart(const kvcore::BatchStepPlan& plan) {
    std::vector<int> states;
    for (int k = 0; k < cache_->n_state_groups(); ++k) {
      const int D = cache_->state_group_policy(k)->slots;
      for (int s = 0; s < max_seqs(); ++s)
        for (int i = 0; s < max_seqs() && active(s) && i < D; ++i) states.push_back(*cache_->state_slot(k, s, i));
      const kvcore::StateGroupPlan& sp = plan.state_groups[k];
      states.insert(states.end(), sp.read_slots, sp.read_slots + plan.n_tokens);
      states.insert(states.end(), sp.write_slots, sp.write_slots + plan.n_tokens);
    }
    std::sort(states.begin(), states.end());
    for (int g = 0; g < cache_->n_groups(); ++g) {  // every row: the step's and the other sequences'
      const int* tables = cache_->block_tables(g);
      for (std::ptrdiff_t i = 0; i < static_cast<std::ptrdiff_t>(cache_->max_active_seqs()) * cache_->table_stride(); ++i)
        if (tables[i] >= 0 && std::binary_search(states.begin(), states.end(), tables[i]))
          return "block " + std::to_string(tables[i]) + " of group " + std::to_string(g) + " is a state slot too";
    }
    return "";
  }

  static int total_tokens(const std::vector<StepEntry>& raw) {
    int n = 0;
    for (const StepEntry& e : raw) n += e.T;
    return n;
  }
  int max_step_tokens() const {
    return cfg_.batch.max_step_tokens != 0 ? cfg_.batch.max_step_tokens : cfg_.effective_max_step() * max_seqs();
  }

  static std::vector<int> chain_of(int T) {
    std::vector<int> p(static_cast<std::size_t>(T));
    for (int j = 0; j < T; ++j) p[static_cast<std::size_t>(j)] = j - 1;
    return p;
  }

  std::string finish() {
    if (!begun_) return "";
    if (r_.percent(20)) {
      if (cache_->abort(step_) != Error::Ok) return "abort refused";
      if (twin_ && twin_->abort(twin_step_) != Error::Ok) return "twin abort refused";
      ++n_.aborts;
      ended();
      return "";
    }
    // Accepted paths: a random root path of each tree; a random prefix of a
    // verify chain; sometimes a prefix of a chain without verify (refused).
    std::vector<std::vector<int>> accepted(entries_.size());
    std::vector<AcceptedPath> paths;
    bool refuse = false;
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      const Entry& e = entries_[i];
      std::vector<int>& nodes = accepted[i];
      const bool tree = raw_[i].parents != nullptr;
      if (tree) {
        nodes.push_back(0);
        for (;;) {
          std::vector<int> kids;
          for (int j = 0; j < e.T; ++j)
            if (e.parents[static_cast<std::size_t>(j)] == nodes.back()) kids.push_back(j);
          if (kids.empty() || r_.percent(25)) break;
          nodes.push_back(kids[static_cast<std::size_t>(r_(0, static_cast<int>(kids.size()) - 1))]);
        }
      } else {
        const bool partial = e.keep_each ? r_.percent(50) : r_.percent(10);
        const int m = partial ? r_(1, e.T) : e.T;
        for (int j = 0; j < m; ++j) nodes.push_back(j);
        if (!partial) continue;
        if (!e.keep_each && m < e.T) refuse = true;
      }
      paths.push_back(AcceptedPath{e.seq, nodes.data(), static_cast<int>(nodes.size())});
    }
    // Unlisted chains commit whole.
    for (std::size_t i = 0; i < entries_.size(); ++i)
      if (accepted[i].empty()) accepted[i] = seq_nodes(entries_[i].T);
    auto done = cache_->commit(step_, paths.data(), static_cast<int>(paths.size()));
    if (refuse) {
      ++n_.refusals;
      if (done.ok() || done.status().code() != Error::InvalidState)
        return "a partial commit of a step without verify: " + std::string(done.status().message().c_str());
      return "";
    }
    if (!done.ok()) return "commit refused: " + std::string(done.status().message().c_str());
    if (twin_) {
      auto t = twin_->commit(twin_step_, paths.data(), static_cast<int>(paths.size()));
      if (!t.ok()) return "twin commit refused";
      if (t->n_groups != done->n_groups) return "commit groups differ";
      for (int g = 0; g < t->n_groups; ++g) {
        if (t->groups[g].n_copies != done->groups[g].n_copies) return "commit copies differ from the twin's";
        for (int c = 0; c < t->groups[g].n_copies && !cfg_.batch.states_in_pool; ++c)
          if (t->groups[g].copies[c] != done->groups[g].copies[c]) return "commit copies differ from the twin's";
      }
    }
    model_->apply_writes();
    for (int k = 0; k < done->n_state_groups; ++k) n_.state_copies += done->state_groups[k].n_copies;
    const std::string e = model_->commit(entries_, accepted, *done);
    if (!e.empty()) return e;
    ++n_.commits;
    for (const auto& p : raw_) n_.tree_commits += p.parents != nullptr;
    begun_ = false;
    return "";
  }

  static std::vector<int> seq_nodes(int T) {
    std::vector<int> v(static_cast<std::size_t>(T));
    for (int j = 0; j < T; ++j) v[static_cast<std::size_t>(j)] = j;
    return v;
  }

  CacheConfig cfg_;
  R& r_;
  Counts& n_;
  std::unique_ptr<BatchCache> cache_, twin_;
  std::unique_ptr<Model> model_;
  bool begun_ = false;
  kvcore::BatchStep step_, twin_step_;
  std::vector<Entry> entries_;
  std::vector<StepEntry> raw_;
};

}  // namespace state_ref
}  // namespace kvcore_test
