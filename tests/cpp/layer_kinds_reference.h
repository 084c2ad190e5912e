// The brute-force oracle of docs/design.md section 9 on SequenceCache (every
// layer kind): a simulated row/slot store checked against the contract's rules
// written out independently. Shared by layer_kinds_brute_force_test.cpp (random
// numbers from Rng) and the plan fuzzer (tests/fuzz/plan_fuzzer.cpp: the
// fuzzer's bytes); `Rand` has uniform(lo, hi) and percent(p). Free of gtest.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kvcore/core/sequence_cache.h"
#include "rng.h"

namespace kvcore_test {
namespace kinds {

using kvcore::CacheConfig;
using kvcore::Error;
using kvcore::LayerConfig;
using kvcore::LayerPolicy;
using kvcore::SeqStepPlan;
using Kind = LayerPolicy::Kind;

struct Cell {
  int pos = -1;
  std::uint64_t tag = 0;
  bool operator==(const Cell& o) const { return pos == o.pos && tag == o.tag; }
};

inline std::uint64_t mix(std::uint64_t h, std::int64_t token) {
  std::uint64_t z = h ^ (static_cast<std::uint64_t>(token) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
constexpr std::uint64_t kEmptyPrefix = 0x1234567ull;

// The contract's visibility rule of a kind that holds keys (section 2 and 9).
inline bool rule_sees(const LayerPolicy& p, int q, int k) {
  if (k > q) return false;
  switch (p.kind) {
    case Kind::Flat: return true;
    case Kind::Ring: return q - k < p.window || k < p.sinks;
    case Kind::Chunked: return k / p.window == q / p.window;
    default: return false;
  }
}

// The rows a layer holds by the contract: a ring wraps in S + W + C - 1 rows,
// a chunked layer in K + C - 1, unless the capacity is smaller.
inline int contract_rows(const LayerPolicy& p, int C, int capacity) {
  auto at_most_capacity = [capacity](long long r) { return r < capacity ? static_cast<int>(r) : capacity; };
  switch (p.kind) {
    case Kind::Ring: return at_most_capacity(static_cast<long long>(p.sinks) + p.window + C - 1);
    case Kind::Chunked: return at_most_capacity(static_cast<long long>(p.window) + C - 1);
    case Kind::Shared: return 0;
    case Kind::State: return p.slots;
    default: return capacity;
  }
}

inline std::string describe_kinds(const CacheConfig& c) {
  std::string s = "capacity " + std::to_string(c.capacity) + ", max_step " + std::to_string(c.max_step) + ", layers [";
  for (const LayerConfig& l : c.layers) {
    const LayerPolicy& p = l.policy;
    s += p.kind == Kind::Flat      ? " Flat"
         : p.kind == Kind::Ring    ? " Ring(" + std::to_string(p.window) + "," + std::to_string(p.sinks) + ")"
         : p.kind == Kind::Chunked ? " Chunked(" + std::to_string(p.window) + ")"
         : p.kind == Kind::Shared  ? " Shared(" + std::to_string(p.source) + ")"
                                   : " State(" + std::to_string(p.slots) + ")";
  }
  return s + " ]";
}

struct KindsCoverage {
  long cases = 0, chains = 0, verify_chains = 0, trees = 0, branched_commits = 0, partial_commits = 0;
  long partial_refused = 0, aborts = 0, begin_refused_lost_state = 0, verify_too_long = 0;
  long left_begun = 0, rewinds_ok = 0, rewinds_refused = 0, state_rewinds_ok = 0, state_copies = 0, chunk_crossing_steps = 0;
};

template <class Rand = Rng>
class KindsCase {
 public:
  KindsCase(const CacheConfig& cfg, Rand& rng, KindsCoverage& cov) : cfg_(cfg), rng_(rng), cov_(cov) {}

  std::string run() {
    auto made = kvcore::SequenceCache::create(cfg_);
    if (!made.ok()) return std::string("create: ") + made.status().message().c_str();
    cache_ = std::move(*made);
    C_ = cache_->max_step();
    const int L = cfg_.n_layers;
    store_.assign(static_cast<std::size_t>(L), {});
    for (int l = 0; l < L; ++l) {
      const LayerPolicy& p = policy(l);
      if (*cache_->rows(l) != contract_rows(p, C_, cfg_.capacity))
        return "layer " + std::to_string(l) + " rows " + std::to_string(*cache_->rows(l));
      store_[static_cast<std::size_t>(l)].assign(static_cast<std::size_t>(*cache_->rows(l)), Cell{});
    }
    const int n_ops = rng_.uniform(10, 60);
    for (op_ = 0; op_ < n_ops; ++op_) {
      const int what = rng_.uniform(0, 99);
      std::string err;
      if (what < 50) err = chain_step();
      else if (what < 70) err = tree_step();
      else if (what < 95) err = rewind();
      else { cache_->clear(); tags_.clear(); }
      if (std::getenv("KVCORE_KINDS_TRACE")) std::printf("op %d (%d): length %d\n", op_, what, length());
      if (err.empty()) err = check_can_rewind();
      if (!err.empty()) return "op " + std::to_string(op_) + ": " + err;
    }
    return "";
  }

 private:
  const LayerPolicy& policy(int l) const { return cfg_.layers[static_cast<std::size_t>(l)].policy; }
  std::vector<Cell>& store(int l) { return store_[static_cast<std::size_t>(l)]; }
  int length() const { return static_cast<int>(tags_.size()); }
  // A token never drawn before: the draw count joins the random id. The cache
  // never sees tokens, so a position written again (after a rewind, or by a
  // sibling node) must not match its old row even when the fuzzer's exhausted
  // input draws the same id again.
  std::int64_t next_token() { return static_cast<std::int64_t>(rng_.uniform(0, 1 << 30)) * (std::int64_t{1} << 24) + ++draws_; }
  std::uint64_t tag_before(int P) const { return P == 0 ? kEmptyPrefix : tags_[static_cast<std::size_t>(P - 1)]; }

  // The row (or state slot) position p lives in on layer l, by the contract:
  // row(p) = p until the layer wraps; a ring keeps its sinks and cycles the
  // rest through its W + C - 1 rows, a chunked layer through K + C - 1, a
  // state layer through its slots.
  int contract_row(int l, int p) const {
    const LayerPolicy& pol = policy(l);
    const int rows = static_cast<int>(store_[static_cast<std::size_t>(l)].size());
    if (rows == cfg_.capacity && pol.kind != Kind::State) return p;  // never wraps
    const int sinks = pol.kind == Kind::Ring ? pol.sinks : 0;
    return p < sinks ? p : sinks + (p - sinks) % (rows - sinks);
  }

  // Does layer l (a kind that holds keys or a state) hold what a query at n
  // needs, where the layout keeps it (a tree commit's copies leave stale
  // duplicates elsewhere, which no plan reads)?
  bool holds_for(int l, int n) const {
    const LayerPolicy& p = policy(l);
    const std::vector<Cell>& cells = store_[static_cast<std::size_t>(l)];
    auto held = [&](int k) {
      return cells[static_cast<std::size_t>(contract_row(l, k))] == Cell{k, tags_[static_cast<std::size_t>(k)]};
    };
    if (p.kind == Kind::Shared) return true;  // its source answers
    if (p.kind == Kind::State) return n == 0 || held(n - 1);
    for (int k = 0; k < n; ++k)
      if (rule_sees(p, n, k) && !held(k)) return false;
    return true;
  }
  bool oracle_can_rewind(int n) const {
    for (int l = 0; l < cfg_.n_layers; ++l)
      if (!holds_for(l, n)) return false;
    return true;
  }
  // Every state layer holds the state after `end - 1`: a step may start at `end`.
  bool states_hold(int end) const {
    for (int l = 0; l < cfg_.n_layers; ++l)
      if (policy(l).kind == Kind::State && !holds_for(l, end)) return false;
    return true;
  }

  std::string check_can_rewind() {
    for (int n = 0; n <= length(); ++n)
      if (cache_->can_rewind(n) != oracle_can_rewind(n) && std::getenv("KVCORE_KINDS_TRACE")) {
        for (int l = 0; l < cfg_.n_layers; ++l) {
          std::printf("layer %d holds_for %d:", l, holds_for(l, n));
          for (const Cell& c : store_[static_cast<std::size_t>(l)]) std::printf(" %d", c.pos);
          std::printf("\n");
        }
      }
    for (int n = 0; n <= length(); ++n)
      if (cache_->can_rewind(n) != oracle_can_rewind(n))
        return "can_rewind(" + std::to_string(n) + ") = " + std::to_string(cache_->can_rewind(n)) + " at length " +
               std::to_string(length());
    return "";
  }

  // Checks one read run set `plan.read` of an attention layer l against the
  // store of `holder` (l itself, or a Shared layer's source): every row a run
  // names holds its position with the right tag, and every key a query needs
  // is named. `tag_of(k)` is the expected tag of position k for these queries.
  template <class TagOf>
  std::string check_attention_reads(int l, int holder, const SeqStepPlan& plan, int P, int end, TagOf tag_of) {
    const LayerPolicy& rule = policy(holder);
    std::vector<char> named(static_cast<std::size_t>(end), 0);
    for (int r = 0; r < plan.n_read; ++r)
      for (int j = 0; j < plan.read[r].len; ++j) {
        const int pos = plan.read[r].pos + j, row = plan.read[r].row + j;
        if (row < 0 || row >= static_cast<int>(store(holder).size()) || pos < 0 || pos >= end)
          return "layer " + std::to_string(l) + " reads row " + std::to_string(row) + " pos " + std::to_string(pos);
        if (!(store(holder)[static_cast<std::size_t>(row)] == Cell{pos, tag_of(pos)}))
          return "layer " + std::to_string(l) + " row " + std::to_string(row) + " does not hold position " +
                 std::to_string(pos);
        named[static_cast<std::size_t>(pos)] = 1;
      }
    for (int q = P; q < end; ++q)
      for (int k = 0; k <= q; ++k)
        if (rule_sees(rule, q, k) && !named[static_cast<std::size_t>(k)])
          return "layer " + std::to_string(l) + " query " + std::to_string(q) + " misses key " + std::to_string(k);
    return "";
  }

  std::string chain_step() {
    const int P = length();
    int T = rng_.uniform(1, C_);
    if (rng_.percent(3)) T = C_ + 1;
    const bool verify = rng_.percent(50);
    bool want_ok = T >= 1 && T <= C_ && P + T <= cfg_.capacity;
    Error want = T > C_ ? Error::InvalidArgument : Error::OutOfResources;
    if (want_ok && verify)
      for (int l = 0; l < cfg_.n_layers; ++l)
        if (policy(l).kind == Kind::State && T > policy(l).slots - 1) want_ok = false, want = Error::InvalidArgument;
    if (want_ok && !states_hold(P)) want_ok = false, want = Error::InvalidState;
    auto step = cache_->begin_step(T, verify);
    if (step.ok() != want_ok)
      return "begin_step(" + std::to_string(T) + ", verify " + std::to_string(verify) + ") at " + std::to_string(P) +
             ": " + (step.ok() ? "accepted" : step.status().message().c_str());
    if (!step.ok()) {
      if (step.status().code() != want) return std::string("begin_step error code: ") + step.status().message().c_str();
      if (want == Error::InvalidState) ++cov_.begin_refused_lost_state;
      if (verify && want == Error::InvalidArgument && T <= C_) ++cov_.verify_too_long;
      return "";
    }
    ++cov_.chains;
    cov_.verify_chains += verify;
    if (std::getenv("KVCORE_KINDS_TRACE")) std::printf("  chain T %d verify %d at %d\n", T, verify, P);
    const int end = P + T;
    if (P / C_ != (end - 1) / C_) ++cov_.chunk_crossing_steps;
    std::vector<std::uint64_t> tags(tags_);  // the prefix tags with the step's tokens
    for (int p = P; p < end; ++p) tags.push_back(mix(p == 0 ? kEmptyPrefix : tags.back(), next_token()));
    auto tag_of = [&tags](int k) { return tags[static_cast<std::size_t>(k)]; };
    // Writes first, in layer order (a shared layer's source comes earlier).
    for (int l = 0; l < cfg_.n_layers; ++l) {
      const SeqStepPlan plan = *cache_->plan(l, *step);
      const LayerPolicy& p = policy(l);
      if (p.kind == Kind::State) {  // the kernel reads the state after P - 1, then writes
        const bool reads_one =
            plan.n_read == (P > 0 ? 1 : 0) && (P == 0 || (plan.read[0].len == 1 && plan.read[0].pos == P - 1));
        if (!reads_one) return "state layer " + std::to_string(l) + " read runs";
        if (P > 0 && !(store(l)[static_cast<std::size_t>(plan.read[0].row)] == Cell{P - 1, tag_before(P)}))
          return "state layer " + std::to_string(l) + " reads a slot without the state after " + std::to_string(P - 1);
      }
      std::vector<int> written;
      for (int r = 0; r < plan.n_write; ++r)
        for (int j = 0; j < plan.write[r].len; ++j) {
          const int pos = plan.write[r].pos + j, row = plan.write[r].row + j;
          if (row < 0 || row >= static_cast<int>(store(l).size())) return "write row " + std::to_string(row);
          store(l)[static_cast<std::size_t>(row)] = Cell{pos, tag_of(pos)};
          written.push_back(pos);
        }
      std::vector<int> want_written;
      if (p.kind == Kind::State && !verify) want_written.push_back(end - 1);
      else if (p.kind != Kind::Shared)
        for (int q = P; q < end; ++q) want_written.push_back(q);
      if (written != want_written) return "layer " + std::to_string(l) + " writes the wrong positions";
    }
    for (int l = 0; l < cfg_.n_layers; ++l) {
      const SeqStepPlan plan = *cache_->plan(l, *step);
      const LayerPolicy& p = policy(l);
      if (p.kind == Kind::State) continue;
      const int holder = p.kind == Kind::Shared ? p.source : l;
      const std::string err = check_attention_reads(l, holder, plan, P, end, tag_of);
      if (!err.empty()) return err;
    }
    const int how = rng_.uniform(0, 99);
    if (how < 60) {
      if (!cache_->commit(*step).ok()) return "commit refused";
      tags_ = tags;
    } else if (how < 80) {
      const int m = rng_.uniform(1, T);
      std::vector<int> path;
      for (int d = 0; d < m; ++d) path.push_back(d);
      std::vector<std::uint64_t> kept(tags.begin(), tags.begin() + P + m);
      std::vector<std::uint64_t> saved = tags_;
      tags_ = kept;  // what the store must hold for length P + m
      const bool want_commit = states_hold(P + m);
      const kvcore::Status st = cache_->commit(*step, path.data(), m);
      if (st.ok() != want_commit) return "partial commit of " + std::to_string(m) + " of " + std::to_string(T) + ": " + st.message().c_str();
      if (!st.ok()) {
        tags_ = saved;
        ++cov_.partial_refused;
        if (!cache_->abort(*step).ok()) return "abort after a refused commit";
      } else {
        ++cov_.partial_commits;
      }
    } else if (how < 90) {
      ++cov_.aborts;
      if (!cache_->abort(*step).ok()) return "abort refused";
    } else {
      ++cov_.left_begun;  // the next begin replaces it (its writes stay done), a rewind or clear ends it
    }
    return "";
  }

  std::string tree_step() {
    const int P = length();
    const int N = rng_.uniform(1, C_);
    std::vector<int> parents(static_cast<std::size_t>(N), -1);
    for (int i = 1; i < N; ++i) parents[static_cast<std::size_t>(i)] = rng_.percent(50) ? i - 1 : rng_.uniform(0, i - 1);
    bool want_ok = P + N <= cfg_.capacity;
    for (int l = 0; l < cfg_.n_layers; ++l)
      if (policy(l).kind == Kind::State && N > policy(l).slots - 1) want_ok = false;
    if (want_ok && !states_hold(P)) want_ok = false;
    auto step = cache_->begin_tree(parents.data(), N);
    if (step.ok() != want_ok) return "begin_tree(" + std::to_string(N) + ") at " + std::to_string(P) + ": " +
                                     (step.ok() ? "accepted" : step.status().message().c_str());
    if (!step.ok()) return "";
    ++cov_.trees;
    std::vector<int> depth(static_cast<std::size_t>(N), 0);
    std::vector<std::uint64_t> node_tag(static_cast<std::size_t>(N));
    for (int i = 0; i < N; ++i) {
      const int par = parents[static_cast<std::size_t>(i)];
      depth[static_cast<std::size_t>(i)] = par < 0 ? 0 : depth[static_cast<std::size_t>(par)] + 1;
      node_tag[static_cast<std::size_t>(i)] =
          mix(par < 0 ? tag_before(P) : node_tag[static_cast<std::size_t>(par)], next_token());
    }
    auto ancestor_or_self = [&](int j, int i) {
      for (int a = i; a >= 0; a = parents[static_cast<std::size_t>(a)])
        if (a == j) return true;
      return false;
    };
    // Writes: node i's K/V (or the state after it) into its row / slot; a state node first reads its parent's.
    std::vector<std::vector<int>> rows(static_cast<std::size_t>(cfg_.n_layers));
    for (int l = 0; l < cfg_.n_layers; ++l) {
      std::vector<int>& r = rows[static_cast<std::size_t>(l)];
      r.assign(static_cast<std::size_t>(N), -1);
      if (!cache_->tree_rows(l, *step, r.data()).ok()) return "tree_rows";
      const LayerPolicy& p = policy(l);
      if (p.kind == Kind::Shared) continue;
      if (p.kind == Kind::State) {
        const SeqStepPlan plan = *cache_->plan(l, *step);
        if (plan.n_read != (P > 0 ? 1 : 0)) return "tree state read runs";
        for (int i = 0; i < N; ++i) {  // parents come first: node order is a valid execution order
          const int par = parents[static_cast<std::size_t>(i)];
          if (par >= 0 || P > 0) {
            const int slot = par >= 0 ? r[static_cast<std::size_t>(par)] : plan.read[0].row;
            const Cell want = par >= 0 ? Cell{P + depth[static_cast<std::size_t>(par)], node_tag[static_cast<std::size_t>(par)]}
                                       : Cell{P - 1, tag_before(P)};
            if (!(store(l)[static_cast<std::size_t>(slot)] == want))
              return "tree node " + std::to_string(i) + " of state layer " + std::to_string(l) + " reads a wrong slot";
          }
          store(l)[static_cast<std::size_t>(r[static_cast<std::size_t>(i)])] =
              Cell{P + depth[static_cast<std::size_t>(i)], node_tag[static_cast<std::size_t>(i)]};
        }
        continue;
      }
      for (int i = 0; i < N; ++i)
        store(l)[static_cast<std::size_t>(r[static_cast<std::size_t>(i)])] =
            Cell{P + depth[static_cast<std::size_t>(i)], node_tag[static_cast<std::size_t>(i)]};
    }
    // Reads of attention layers, through the dense mask: row j of the read is
    // seen by node i exactly when it holds a history key the rule shows i or
    // an ancestor-or-self node the rule shows i.
    for (int l = 0; l < cfg_.n_layers; ++l) {
      const LayerPolicy& p = policy(l);
      if (p.kind == Kind::State) continue;
      const int holder = p.kind == Kind::Shared ? p.source : l;
      const LayerPolicy& rule = policy(holder);
      const SeqStepPlan plan = *cache_->plan(l, *step);
      std::vector<std::uint8_t> mask(static_cast<std::size_t>(N) * static_cast<std::size_t>(plan.read_len()));
      if (!cache_->dense_tree_mask(l, *step, mask.data()).ok()) return "dense_tree_mask";
      for (int i = 0; i < N; ++i) {
        const int q = P + depth[static_cast<std::size_t>(i)];
        std::vector<char> seen_hist(static_cast<std::size_t>(P), 0), seen_node(static_cast<std::size_t>(N), 0);
        int col = 0;
        for (int rr = 0; rr < plan.n_read; ++rr)
          for (int j = 0; j < plan.read[rr].len; ++j, ++col) {
            const Cell c = store(holder)[static_cast<std::size_t>(plan.read[rr].row + j)];
            bool want = false;
            if (c.pos >= 0 && c.pos < P && c.tag == tags_[static_cast<std::size_t>(c.pos)]) {
              want = rule_sees(rule, q, c.pos);
              if (want) seen_hist[static_cast<std::size_t>(c.pos)] = 1;
            } else {
              for (int a = 0; a < N; ++a)
                if (c == Cell{P + depth[static_cast<std::size_t>(a)], node_tag[static_cast<std::size_t>(a)]} &&
                    ancestor_or_self(a, i) && rule_sees(rule, q, c.pos))
                  want = true, seen_node[static_cast<std::size_t>(a)] = 1;
            }
            if ((mask[static_cast<std::size_t>(i) * static_cast<std::size_t>(plan.read_len()) + static_cast<std::size_t>(col)] != 0) != want)
              return "tree mask of layer " + std::to_string(l) + " node " + std::to_string(i) + " column " + std::to_string(col);
          }
        for (int k = 0; k < P; ++k)
          if (rule_sees(rule, q, k) && !seen_hist[static_cast<std::size_t>(k)])
            return "tree node " + std::to_string(i) + " of layer " + std::to_string(l) + " misses key " + std::to_string(k);
        for (int a = 0; a < N; ++a)
          if (ancestor_or_self(a, i) && rule_sees(rule, q, P + depth[static_cast<std::size_t>(a)]) && !seen_node[static_cast<std::size_t>(a)])
            return "tree node " + std::to_string(i) + " of layer " + std::to_string(l) + " misses node " + std::to_string(a);
      }
    }
    if (rng_.percent(20)) {
      ++cov_.aborts;
      return cache_->abort(*step).ok() ? "" : "tree abort";
    }
    if (rng_.percent(10)) return (++cov_.left_begun, "");  // replaced by the next begin
    // A random root path, then its copies applied to every store.
    std::vector<int> path{0};
    for (;;) {
      std::vector<int> kids;
      for (int i = 0; i < N; ++i)
        if (parents[static_cast<std::size_t>(i)] == path.back()) kids.push_back(i);
      if (kids.empty() || rng_.percent(25)) break;
      path.push_back(kids[static_cast<std::size_t>(rng_.uniform(0, static_cast<int>(kids.size()) - 1))]);
    }
    const int m = static_cast<int>(path.size());
    bool branched = false;
    for (int d = 0; d < m; ++d) branched |= path[static_cast<std::size_t>(d)] != d;
    const kvcore::Status st = cache_->commit(*step, path.data(), m);
    if (!st.ok()) return std::string("tree commit: ") + st.message().c_str();
    cov_.branched_commits += branched;
    for (int l = 0; l < cfg_.n_layers; ++l) {
      const kvcore::RowCopies copies = *cache_->commit_copies(l);
      if (policy(l).kind == Kind::Shared && copies.n != 0) return "a shared layer copies rows";
      if (policy(l).kind == Kind::State) cov_.state_copies += copies.n;
      for (int c = 0; c < copies.n; ++c)
        store(l)[static_cast<std::size_t>(copies.copies[c].dst)] = store(l)[static_cast<std::size_t>(copies.copies[c].src)];
    }
    for (int d = 0; d < m; ++d) tags_.push_back(node_tag[static_cast<std::size_t>(path[static_cast<std::size_t>(d)])]);
    return "";
  }

  std::string rewind() {
    const int n = rng_.uniform(0, length() + 1);
    const bool want = n <= length() && oracle_can_rewind(n);
    const kvcore::Status st = cache_->rewind(n);
    if (st.ok() != want) return "rewind(" + std::to_string(n) + ") at " + std::to_string(length()) + ": " + st.message().c_str();
    if (st.ok()) {
      ++cov_.rewinds_ok;
      for (int l = 0; l < cfg_.n_layers; ++l) cov_.state_rewinds_ok += policy(l).kind == Kind::State && n > 0;
      tags_.resize(static_cast<std::size_t>(n));
    } else {
      ++cov_.rewinds_refused;
    }
    return "";
  }

  CacheConfig cfg_;
  Rand& rng_;
  KindsCoverage& cov_;
  std::unique_ptr<kvcore::SequenceCache> cache_;
  int C_ = 1;
  int op_ = 0;
  std::int64_t draws_ = 0;  // tokens drawn so far (next_token)
  std::vector<std::vector<Cell>> store_;
  std::vector<std::uint64_t> tags_;  // tag of each committed position
};

}  // namespace kinds
}  // namespace kvcore_test
