// A brute-force model of DESIGN.md section 7 for BatchCache, written from its
// text: a twin of caches. The tree cache runs random draft-tree steps and
// commits random accepted root paths; the chain cache (same config) decodes
// only the accepted tokens, as a chain step each. Byte layers are tagged pools
// (batch_reference.h): a row's tag stands for its K/V, a rolling hash of the
// tokens on its root path, so an accepted node and the chain token at the
// same position carry the same tag. Checked:
//  - every node's read, in every group: the history keys the rule lets its
//    position see (each named by the table, holding its K/V) and exactly its
//    ancestors and itself within the window (each in its slot, holding its
//    K/V); fill_step_mask marks exactly those rows; positions are L + depth,
//    the packed mask is the ancestor relation, slots are distinct;
//  - each commit's copies: none on the main line, at most m - 1 otherwise;
//  - after each commit (and each other verb, done to both), the caches are
//    indistinguishable: sequences, blocks held, oldest held, every can_rewind
//    answer, free and cached blocks, which positions have blocks and the K/V
//    their rows hold, prefix-reuse hits.
// Free of gtest: the tree fuzzer (tests/fuzz/tree_fuzzer.cpp) uses it too.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "batch_reference.h"
#include "kvcore/batch/batch_cache.h"
#include "kvcore/batch/step_mask.h"

namespace kvcore_test {

/// What a twin run went through, summed.
struct TreeCoverage {
  long trees = 0;          // tree entries begun (not chains)
  long commits = 0;        // commits with accepted paths
  long off_main = 0;       // accepted paths leaving the main line
  long copies = 0;         // row copies returned
  long nodes_checked = 0;  // node reads checked key by key
  long refused = 0;        // error paths checked (nothing changed)
  long aborted = 0;
  long prefix_hits = 0;
  long forks = 0;
  long rewinds = 0;
  long exhausted = 0;
};

template <class Pick>
class TreeTwin {
 public:
  TreeTwin(const kvcore::CacheConfig& cfg, Pick pick) : cfg_(cfg), pick_(pick) {
    tree_ = std::move(kvcore::BatchCache::create(cfg)).get();
    chain_ = std::move(kvcore::BatchCache::create(cfg)).get();
    tree_pools_.reset(new TaggedPools(*tree_));
    chain_pools_.reset(new TaggedPools(*chain_));
    tags_.resize(static_cast<std::size_t>(cfg.batch.max_seqs));
    tokens_.resize(tags_.size());
  }

  TreeCoverage& coverage() { return cov_; }
  int last_op() const { return last_op_; }
  const kvcore::BatchCache& tree_cache() const { return *tree_; }

  /// One random operation; "" or what went wrong.
  std::string step() {
    const int op = pick_(0, 19);
    last_op_ = op;
    if (op < 12) return tree_step();
    if (op < 14) return fork();
    if (op < 16) return rewind();
    if (op < 17) return adopt();
    if (op < 18) return release();
    return add();
  }

  /// Both caches show the same state ("" or the first difference).
  std::string same_state() const {
    const int B = cfg_.batch.block_size;
    for (int g = 0; g < tree_->n_groups(); ++g) {
      if (*tree_->free_blocks(g) != *chain_->free_blocks(g))
        return "group " + str(g) + ": free blocks differ (" + str(*tree_->free_blocks(g)) + " vs " +
               str(*chain_->free_blocks(g)) + ")";
      if (*tree_->cached_blocks(g) != *chain_->cached_blocks(g)) return "group " + str(g) + ": cached blocks differ";
    }
    for (int s = 0; s < cfg_.batch.max_seqs; ++s) {
      const kvcore::SequenceInfo a = *tree_->sequence(s), b = *chain_->sequence(s);
      if (a.active != b.active || a.length != b.length || a.visible_start != b.visible_start || a.n_holes != b.n_holes)
        return "seq " + str(s) + ": info differs (length " + str(a.length) + " vs " + str(b.length) + ")";
      for (int n = -1; n <= a.length + 1; ++n)
        if (tree_->can_rewind(s, n) != chain_->can_rewind(s, n)) return "seq " + str(s) + ": can_rewind(" + str(n) + ")";
      for (int g = 0; g < tree_->n_groups(); ++g) {
        if (*tree_->blocks_held(s, g) != *chain_->blocks_held(s, g)) return "seq " + str(s) + ": blocks held";
        if (*tree_->oldest_held(s, g) != *chain_->oldest_held(s, g)) return "seq " + str(s) + ": oldest held";
        const int* ta = tree_->block_tables(g) + static_cast<std::ptrdiff_t>(s) * tree_->table_stride();
        const int* tb = chain_->block_tables(g) + static_cast<std::ptrdiff_t>(s) * chain_->table_stride();
        for (int p = 0; p < a.length; ++p) {
          const int ba = ta[p / B], bb = tb[p / B];
          if ((ba < 0) != (bb < 0)) return "seq " + str(s) + " group " + str(g) + ": position " + str(p) + " held in one";
          // K/V compared where a query at the length sees it (a fresh block's
          // older rows are garbage in both, differently; the tree cache's
          // reads are checked against the model at every step).
          if (ba < 0 || !BatchModel::in_window(*tree_->group_policy(g), a.length, p)) continue;
          const std::uint64_t ra = tree_pools_->rows[static_cast<std::size_t>(g)][static_cast<std::size_t>(ba * B + p % B)];
          const std::uint64_t rb = chain_pools_->rows[static_cast<std::size_t>(g)][static_cast<std::size_t>(bb * B + p % B)];
          if (ra != rb) return "seq " + str(s) + " group " + str(g) + ": position " + str(p) + " holds other K/V";
        }
      }
    }
    return "";
  }

  /// A tree step: random entries, checked; then commit, abort or a retry.
  std::string tree_step() {
    std::vector<Entry> entries = random_entries();
    if (entries.empty()) return add();
    std::vector<kvcore::StepEntry> step_entries;
    for (Entry& e : entries)
      step_entries.push_back(kvcore::StepEntry{e.seq, e.n(), e.with_tokens ? e.tokens.data() : nullptr,
                                               e.as_tree ? e.parents.data() : nullptr});
    const Snapshot before = snapshot(*tree_);
    kvcore::Result<kvcore::BatchStep> begun = tree_->begin_step(step_entries.data(), static_cast<int>(step_entries.size()));
    if (!begun.ok()) {
      if (begun.error() != kvcore::Error::OutOfResources) return std::string("begin_step: ") + begun.status().message().c_str();
      ++cov_.exhausted;
      return snapshot(*tree_) == before ? "" : "a refused begin_step changed the cache";
    }
    for (const Entry& e : entries) cov_.trees += e.as_tree && !e.is_chain();
    const kvcore::BatchStepPlan plan = *tree_->plan(*begun);
    std::string err = check_plan(plan, entries);
    if (!err.empty()) return err;
    const int what = pick_(0, 9);
    if (what == 0) {  // abandoned: every table as before
      ++cov_.aborted;
      if (!tree_->abort(*begun).ok()) return "abort failed";
      err = reserve_in_twin(entries);  // a chain step of N begun and aborted: the same reclaimed prefixes
      return err.empty() ? same_state() : err;
    }
    return commit(*begun, entries);
  }

 private:
  struct Entry {
    int seq = 0;
    bool as_tree = true;     // parents given
    bool with_tokens = true;
    std::vector<int> parents;
    std::vector<std::int32_t> tokens;
    std::vector<std::uint64_t> node_tags;
    int n() const { return static_cast<int>(parents.size()); }
    bool is_chain() const {
      for (int i = 0; i < n(); ++i)
        if (parents[static_cast<std::size_t>(i)] != i - 1) return false;
      return true;
    }
    bool ancestor_or_self(int j, int i) const {
      for (; i >= 0; i = parents[static_cast<std::size_t>(i)])
        if (i == j) return true;
      return false;
    }
    int depth(int i) const { return i == 0 ? 0 : depth(parents[static_cast<std::size_t>(i)]) + 1; }
  };

  static std::string str(long v) { return std::to_string(v); }

  static std::uint64_t roll(std::uint64_t before, std::int32_t token) {
    std::uint64_t x = before ^ (static_cast<std::uint64_t>(static_cast<std::uint32_t>(token)) + 0x9e3779b97f4a7c15ull);
    x ^= x >> 31;
    x *= 0x7fb5d329728ea185ull;
    x ^= x >> 27;
    x *= 0x81dadef4bc2dd44dull;
    return (x ^ (x >> 33)) | 1;
  }
  std::uint64_t last_tag(int s) const {
    const std::vector<std::uint64_t>& t = tags_[static_cast<std::size_t>(s)];
    return t.empty() ? 0x2545f4914f6cdd1dull : t.back();
  }

  std::vector<Entry> random_entries() {
    std::vector<Entry> out;
    const int C = tree_->max_step();
    int budget = tree_->max_step_tokens();
    for (int s = 0; s < cfg_.batch.max_seqs; ++s) {
      const kvcore::SequenceInfo info = *tree_->sequence(s);
      if (!info.active || pick_(0, 3) == 0) continue;
      const int room = std::min({C, cfg_.capacity - info.length, budget});
      if (room < 1) continue;
      Entry e;
      e.seq = s;
      const int n = pick_(1, room);
      budget -= n;
      const int shape = pick_(0, 9);  // 0: a chain without parents, 1: a chain as a tree, else a random tree
      e.as_tree = shape != 0;
      e.with_tokens = pick_(0, 7) != 0;
      const int fan = pick_(0, 3);  // how bushy: 0 nearly a chain, 3 wide
      for (int i = 0; i < n; ++i) {
        int parent = i - 1;
        if (i > 0 && shape >= 2 && pick_(0, 3) < fan) parent = pick_(std::max(0, i - 1 - 2 * fan), i - 1);
        if (i > 0 && shape >= 2 && pick_(0, 9) == 0) parent = pick_(0, i - 1);
        e.parents.push_back(parent);
        e.tokens.push_back(pick_(0, 1 << 20));
      }
      for (int i = 0; i < n; ++i) {
        const int p = e.parents[static_cast<std::size_t>(i)];
        const std::uint64_t up = p < 0 ? last_tag(s) : e.node_tags[static_cast<std::size_t>(p)];
        e.node_tags.push_back(e.with_tokens ? roll(up, e.tokens[static_cast<std::size_t>(i)]) : roll(up, 1000 + i));
      }
      if (!e.with_tokens) e.tokens.assign(static_cast<std::size_t>(n), 0);
      out.push_back(std::move(e));
    }
    return out;
  }

  // The plan's tree arrays, and every node's read in every group (the plan
  // applied to the tree cache's pools first).
  std::string check_plan(const kvcore::BatchStepPlan& plan, const std::vector<Entry>& entries) {
    std::vector<std::uint64_t> token_tags;
    for (const Entry& e : entries) token_tags.insert(token_tags.end(), e.node_tags.begin(), e.node_tags.end());
    tree_pools_->apply(plan, token_tags);
    const int B = plan.block_size;
    for (int i = 0; i < plan.n_entries; ++i) {
      const Entry& e = entries[static_cast<std::size_t>(i)];
      const int at = plan.query_starts[i], L = plan.first_positions[i], n = e.n();
      const bool tree = e.as_tree && !e.is_chain();
      if (plan.is_tree(i) != tree) return "entry " + str(i) + ": is_tree";
      if (plan.context_lens[i] != L + n) return "entry " + str(i) + ": context_lens is not a chain of N";
      std::vector<bool> places(static_cast<std::size_t>(n), false);
      for (int j = 0; j < n; ++j) {
        if (plan.positions[at + j] != L + e.depth(j)) return "entry " + str(i) + " node " + str(j) + ": position";
        const int c = plan.chain_index[at + j];
        if (c < 0 || c >= n || places[static_cast<std::size_t>(c)]) return "entry " + str(i) + ": chain index";
        places[static_cast<std::size_t>(c)] = true;
        if (!tree && c != j) return "entry " + str(i) + ": a chain's chain index";
        if (tree) {
          const std::uint32_t* row = plan.tree_masks + plan.tree_mask_starts[i] +
                                     static_cast<std::ptrdiff_t>(j) * kvcore::tree_mask_words(n);
          for (int k = 0; k < n; ++k)
            if ((((row[k / 32] >> (k % 32)) & 1u) != 0) != e.ancestor_or_self(k, j))
              return "entry " + str(i) + ": mask bit (" + str(j) + ", " + str(k) + ")";
        }
      }
      for (int g = 0; g < plan.n_groups; ++g) {
        const kvcore::GroupPlan& gp = plan.groups[g];
        const int* table = gp.block_tables + static_cast<std::ptrdiff_t>(e.seq) * gp.table_stride;
        for (int j = 0; j < n; ++j) {
          const int p = L + plan.chain_index[at + j];
          if (table[p / B] < 0 || gp.slots[at + j] != table[p / B] * B + p % B)
            return "entry " + str(i) + " group " + str(g) + ": node " + str(j) + "'s slot is not its chain place's row";
        }
      }
    }
    return check_reads(plan, entries);
  }

  std::string check_reads(const kvcore::BatchStepPlan& plan, const std::vector<Entry>& entries) {
    const int B = plan.block_size;
    for (int g = 0; g < plan.n_groups; ++g) {
      const int rows = *tree_->used_blocks(g) * B;
      std::vector<unsigned char> mask(static_cast<std::size_t>(plan.n_tokens) * static_cast<std::size_t>(rows));
      if (!kvcore::fill_step_mask(plan, g, rows, mask.data()).ok()) return "fill_step_mask failed";
      const kvcore::GroupPlan& gp = plan.groups[g];
      const std::vector<std::uint64_t>& pool = tree_pools_->rows[static_cast<std::size_t>(g)];
      for (int i = 0; i < plan.n_entries; ++i) {
        const Entry& e = entries[static_cast<std::size_t>(i)];
        const int at = plan.query_starts[i], L = plan.first_positions[i];
        const int* table = gp.block_tables + static_cast<std::ptrdiff_t>(e.seq) * gp.table_stride;
        const std::vector<std::uint64_t>& hist = tags_[static_cast<std::size_t>(e.seq)];
        for (int j = 0; j < e.n(); ++j) {
          ++cov_.nodes_checked;
          const int q = L + e.depth(j);
          std::vector<unsigned char> want(static_cast<std::size_t>(rows), 0);
          auto where = [&] { return "entry " + str(i) + " group " + str(g) + " node " + str(j) + " (q " + str(q) + ")"; };
          for (int k = 0; k < L; ++k) {
            if (!BatchModel::in_window(gp.policy, q, k)) continue;
            const int block = table[k / B];
            if (block < 0) return where() + ": history key " + str(k) + "'s block is a hole";
            const int r = block * B + k % B;
            if (pool[static_cast<std::size_t>(r)] != hist[static_cast<std::size_t>(k)])
              return where() + ": history key " + str(k) + " holds other K/V";
            if (r < rows) want[static_cast<std::size_t>(r)] = 1;
          }
          for (int a = 0; a < e.n(); ++a) {
            if (!e.ancestor_or_self(a, j) || !BatchModel::in_window(gp.policy, q, L + e.depth(a))) continue;
            const int r = gp.slots[at + a];
            if (pool[static_cast<std::size_t>(r)] != e.node_tags[static_cast<std::size_t>(a)])
              return where() + ": node " + str(a) + "'s row holds other K/V";
            if (r < rows) want[static_cast<std::size_t>(r)] = 1;
          }
          if (!std::equal(want.begin(), want.end(), mask.begin() + static_cast<std::ptrdiff_t>(at + j) * rows))
            return where() + ": fill_step_mask marks other rows than the rule";
        }
      }
    }
    return "";
  }

  // A random root path of e: main line sometimes, else random children.
  std::vector<int> random_path(const Entry& e) {
    std::vector<int> path{0};
    const bool main = pick_(0, 2) == 0;
    const int want = pick_(1, e.n());
    while (static_cast<int>(path.size()) < want) {
      std::vector<int> kids;
      for (int k = path.back() + 1; k < e.n(); ++k)
        if (e.parents[static_cast<std::size_t>(k)] == path.back()) kids.push_back(k);
      if (kids.empty()) break;
      path.push_back(main ? kids.front() : kids[static_cast<std::size_t>(pick_(0, static_cast<int>(kids.size()) - 1))]);
    }
    return path;
  }

  static bool on_main_line(const Entry& e, const std::vector<int>& path) {
    for (std::size_t d = 1; d < path.size(); ++d)
      for (int k = path[d - 1] + 1; k < path[d]; ++k)
        if (e.parents[static_cast<std::size_t>(k)] == path[d - 1]) return false;  // an earlier sibling
    return true;
  }

  std::string commit(const kvcore::BatchStep& step, const std::vector<Entry>& entries) {
    std::vector<std::vector<int>> paths(entries.size());
    std::vector<kvcore::AcceptedPath> accepted;
    bool any_tree = false;
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const Entry& e = entries[i];
      const bool tree = e.as_tree && !e.is_chain();
      any_tree = any_tree || tree;
      if (!tree && pick_(0, 2) == 0) continue;  // a chain commits whole
      paths[i] = random_path(e);
    }
    for (std::size_t i = 0; i < entries.size(); ++i)
      if (!paths[i].empty())
        accepted.push_back(kvcore::AcceptedPath{entries[i].seq, paths[i].data(), static_cast<int>(paths[i].size())});
    if (any_tree && pick_(0, 5) == 0) {  // committing a tree step as a chain: refused, nothing changed
      const Snapshot before = snapshot(*tree_);
      const kvcore::Status st = tree_->commit(step);
      if (st.code() != kvcore::Error::InvalidArgument) return "a plain commit of a tree step was not refused";
      if (!(snapshot(*tree_) == before) || !tree_->check_step(step).ok()) return "a refused commit changed the cache";
      ++cov_.refused;
    }
    kvcore::Result<kvcore::BatchCommit> done = tree_->commit(step, accepted.data(), static_cast<int>(accepted.size()));
    if (!done.ok()) return std::string("commit: ") + done.status().message().c_str();
    ++cov_.commits;
    const kvcore::BatchCommit cp = *done;
    // Copies per group: at most m - 1 per path, none on the main line.
    long bound = 0;
    bool all_main = true;
    for (std::size_t i = 0; i < entries.size(); ++i) {
      if (paths[i].empty()) continue;
      bound += static_cast<long>(paths[i].size()) - 1;
      const bool main = on_main_line(entries[i], paths[i]);
      all_main = all_main && main;
      cov_.off_main += !main;
    }
    for (int g = 0; g < cp.n_groups; ++g) {
      const kvcore::GroupCommit& gc = cp.groups[g];
      if (gc.n_copies > bound || (all_main && gc.n_copies != 0)) return "group " + str(g) + ": too many copies";
      cov_.copies += gc.n_copies;
      std::vector<std::uint64_t>& pool = tree_pools_->rows[static_cast<std::size_t>(g)];
      for (int c = 0; c < gc.n_copies; ++c)
        pool[static_cast<std::size_t>(gc.copies[c].dst)] = pool[static_cast<std::size_t>(gc.copies[c].src)];
    }
    // The chain twin reserves what the tree did (a chain of N, aborted: where
    // a pool ran short, the same cached prefixes are reclaimed), then decodes
    // the accepted tokens.
    std::string err = reserve_in_twin(entries);
    if (!err.empty()) return err;
    std::vector<std::vector<std::int32_t>> chain_tokens(entries.size());
    std::vector<kvcore::StepEntry> chain_entries;
    std::vector<std::uint64_t> chain_tags;
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const Entry& e = entries[i];
      std::vector<int> path = paths[i];
      if (path.empty())
        for (int k = 0; k < e.n(); ++k) path.push_back(k);
      for (int node : path) {
        chain_tokens[i].push_back(e.tokens[static_cast<std::size_t>(node)]);
        chain_tags.push_back(e.node_tags[static_cast<std::size_t>(node)]);
        tags_[static_cast<std::size_t>(e.seq)].push_back(e.node_tags[static_cast<std::size_t>(node)]);
        tokens_[static_cast<std::size_t>(e.seq)].push_back(e.with_tokens ? e.tokens[static_cast<std::size_t>(node)] : -1);
      }
      chain_entries.push_back(kvcore::StepEntry{e.seq, static_cast<int>(path.size()),
                                                e.with_tokens ? chain_tokens[i].data() : nullptr, nullptr});
    }
    kvcore::Result<kvcore::BatchStep> twin = chain_->begin_step(chain_entries.data(), static_cast<int>(chain_entries.size()));
    if (!twin.ok()) return std::string("the chain twin's step: ") + twin.status().message().c_str();
    chain_pools_->apply(*chain_->plan(*twin), chain_tags);
    if (!chain_->commit(*twin).ok()) return "the chain twin's commit";
    return same_state();
  }

  std::string reserve_in_twin(const std::vector<Entry>& entries) {
    std::vector<kvcore::StepEntry> chains;
    for (const Entry& e : entries) chains.push_back(kvcore::StepEntry{e.seq, e.n(), nullptr, nullptr});
    kvcore::Result<kvcore::BatchStep> step = chain_->begin_step(chains.data(), static_cast<int>(chains.size()));
    if (!step.ok()) return std::string("the chain twin's chain of N: ") + step.status().message().c_str();
    return chain_->abort(*step).ok() ? "" : "the chain twin's abort";
  }

  int active_seq(bool active) {
    std::vector<int> ids;
    for (int s = 0; s < cfg_.batch.max_seqs; ++s)
      if (tree_->sequence(s)->active == active) ids.push_back(s);
    return ids.empty() ? -1 : ids[static_cast<std::size_t>(pick_(0, static_cast<int>(ids.size()) - 1))];
  }

  // A verb done to both twins: the same outcome, the same state.
  template <class Verb>
  std::string both(const char* what, Verb verb) {
    const kvcore::Status a = verb(*tree_), b = verb(*chain_);
    if (a.code() != b.code()) return std::string(what) + ": the twins disagree";
    return same_state();
  }

  // Adds an inactive sequence (adding) or releases an active one; the other
  // when there is none.
  std::string add_or_release(bool adding) {
    int s = active_seq(!adding);
    if (s < 0) {
      adding = !adding;
      s = active_seq(!adding);
    }
    tags_[static_cast<std::size_t>(s)].clear();
    tokens_[static_cast<std::size_t>(s)].clear();
    return both(adding ? "add_sequence" : "release_sequence",
                [&](kvcore::BatchCache& c) { return adding ? c.add_sequence(s) : c.release_sequence(s); });
  }
  std::string add() { return add_or_release(true); }
  std::string release() { return add_or_release(false); }

  std::string rewind() {
    const int s = active_seq(true);
    if (s < 0) return add();
    const int length = tree_->sequence(s)->length;
    const int n = pick_(0, 1) == 0 ? std::max(0, length - pick_(0, tree_->max_step() + 1)) : pick_(0, length);
    std::string err = both("rewind", [&](kvcore::BatchCache& c) { return c.rewind(s, n); });
    if (tree_->sequence(s)->length == n) {
      tags_[static_cast<std::size_t>(s)].resize(static_cast<std::size_t>(n));
      tokens_[static_cast<std::size_t>(s)].resize(static_cast<std::size_t>(n));
      ++cov_.rewinds;
    }
    return err;
  }

  std::string fork() {
    const int src = active_seq(true), dst = active_seq(false);
    if (src < 0 || dst < 0) return add();
    const int length = tree_->sequence(src)->length;
    const int upto = pick_(0, 1) == 0 ? length : pick_(0, length);
    std::string err = both("fork", [&](kvcore::BatchCache& c) { return c.fork(src, dst, upto); });
    if (tree_->sequence(dst)->active) {
      const std::vector<std::uint64_t>& from = tags_[static_cast<std::size_t>(src)];
      tags_[static_cast<std::size_t>(dst)].assign(from.begin(), from.begin() + upto);
      const std::vector<std::int32_t>& ids = tokens_[static_cast<std::size_t>(src)];
      tokens_[static_cast<std::size_t>(dst)].assign(ids.begin(), ids.begin() + upto);
      ++cov_.forks;
    }
    return err;
  }

  // An empty sequence adopts a prefix of another's accepted tokens.
  std::string adopt() {
    const int src = active_seq(true), dst = active_seq(false);
    if (src < 0 || dst < 0) return add();
    if (!tree_->add_sequence(dst).ok() || !chain_->add_sequence(dst).ok()) return "add_sequence before adopt";
    tags_[static_cast<std::size_t>(dst)].clear();
    tokens_[static_cast<std::size_t>(dst)].clear();
    std::vector<std::int32_t> prompt = accepted_tokens(src, pick_(1, 3 * cfg_.batch.block_size));
    if (static_cast<int>(prompt.size()) > cfg_.capacity) prompt.resize(static_cast<std::size_t>(cfg_.capacity));
    const kvcore::Result<int> a = tree_->adopt_prefix(dst, prompt.data(), static_cast<int>(prompt.size()));
    const kvcore::Result<int> b = chain_->adopt_prefix(dst, prompt.data(), static_cast<int>(prompt.size()));
    if (!a.ok() || !b.ok() || *a != *b) return "adopt_prefix: the twins disagree";
    cov_.prefix_hits += *a > 0;
    std::uint64_t tag = 0x2545f4914f6cdd1dull;
    for (int p = 0; p < *a; ++p) {
      tags_[static_cast<std::size_t>(dst)].push_back(tag = roll(tag, prompt[static_cast<std::size_t>(p)]));
      tokens_[static_cast<std::size_t>(dst)].push_back(prompt[static_cast<std::size_t>(p)]);
    }
    return same_state();
  }

  // src's tokens up to the first step without any, then random ones.
  std::vector<std::int32_t> accepted_tokens(int src, int extra) {
    std::vector<std::int32_t> out;
    for (std::int32_t t : tokens_[static_cast<std::size_t>(src)]) {
      if (t < 0) break;
      out.push_back(t);
    }
    for (int k = 0; k < extra; ++k) out.push_back(pick_(0, 1 << 20));
    return out;
  }

  kvcore::CacheConfig cfg_;
  Pick pick_;
  std::unique_ptr<kvcore::BatchCache> tree_, chain_;
  std::unique_ptr<TaggedPools> tree_pools_, chain_pools_;
  std::vector<std::vector<std::uint64_t>> tags_;  // per sequence: the K/V tag of each position
  // Per sequence: the token of each position, -1 where none was given. Tokens
  // come from a wide alphabet: two sequences never compute the same block
  // content on their own, so no two blocks carry one key (which of them a
  // prefix hit shares depends on block ids, and the twins' ids differ).
  std::vector<std::vector<std::int32_t>> tokens_;
  TreeCoverage cov_;
  int last_op_ = -1;
};

}  // namespace kvcore_test
