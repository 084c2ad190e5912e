// A brute-force model of DESIGN.md section 9's recurrent state on the
// many-sequence cache (section 6), written from the contract, never from
// BatchCache's StateGroup: every sequence's state after position p is a tag
// (a hash chain of its tokens, zeros at p = -1), a simulated slot store per
// State group applies each plan's writes and each tree commit's slot copies,
// and check_reads() proves that every token of a step starts from exactly the
// state after the position before it (a tree node: its parent's), that no
// entry reads a slot another entry of the step writes, and that a step keeps
// every state of a verify step or tree and only the last otherwise. Per
// sequence the model keeps which position's state each logical slot p mod D
// holds, so can_rewind answers are checked exactly. Free of gtest: the batch
// fuzzer (tests/fuzz/batch_fuzzer.cpp) drives it too.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kvcore/batch/batch_cache.h"

namespace kvcore_test {
namespace state_ref {

constexpr std::uint64_t kZeros = 0x5eedull;     // the state before position 0
constexpr std::uint64_t kGarbage = 0xdeadull;  // a slot never written

inline std::uint64_t next_state(std::uint64_t h, std::int32_t token) {
  std::uint64_t z = h ^ (static_cast<std::uint64_t>(token) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// One sequence: its states (the state after each position) and, per State
/// group, the position each of its D logical slots holds.
struct Seq {
  bool active = false;
  std::vector<std::uint64_t> states;     // states[p]: the state after p
  std::vector<std::int32_t> tokens;      // tokens[p]: the token at p
  std::vector<std::vector<int>> held;    // [state group][slot]: position, -1
  int length() const { return static_cast<int>(states.size()); }
  std::uint64_t before(int p) const { return p == 0 ? kZeros : states[static_cast<std::size_t>(p - 1)]; }
};

/// One entry of a begun step, as the model needs it.
struct Entry {
  int seq = 0;
  int T = 0;
  bool keep_each = false;
  std::vector<int> parents;          // -1, 0, 1, ... for a chain
  std::vector<std::int32_t> tokens;
  std::vector<std::uint64_t> computed;  // each token's state (filled by check_reads)
};

class Model {
 public:
  Model(const kvcore::BatchCache& cache, int max_seqs) {
    for (int k = 0; k < cache.n_state_groups(); ++k) {
      D_.push_back(cache.state_group_policy(k)->slots);
      store_.emplace_back(static_cast<std::size_t>(*cache.num_state_slots(k)), kGarbage);
    }
    seqs_.resize(static_cast<std::size_t>(max_seqs));
    for (Seq& s : seqs_) reset(s);
  }

  int n_groups() const { return static_cast<int>(D_.size()); }
  int slots(int k) const { return D_[static_cast<std::size_t>(k)]; }
  int min_slots() const {
    int m = 1 << 30;
    for (int d : D_) m = d < m ? d : m;
    return m;
  }
  Seq& seq(int s) { return seqs_[static_cast<std::size_t>(s)]; }
  const Seq& seq(int s) const { return seqs_[static_cast<std::size_t>(s)]; }

  /// Section 9: the state after n - 1 is held in every State group (or n = 0).
  bool holds(int s, int n) const {
    if (n == 0) return true;
    const Seq& q = seq(s);
    for (int k = 0; k < n_groups(); ++k)
      if (q.held[static_cast<std::size_t>(k)][static_cast<std::size_t>((n - 1) % slots(k))] != n - 1) return false;
    return true;
  }
  /// Why begin_step refuses `e` for the State groups (0: it does not):
  /// 1 InvalidArgument (a verify step or tree longer than D - 1), 2
  /// InvalidState (the state after length - 1 is gone).
  int refusal(const Entry& e) const {
    if (n_groups() == 0) return 0;
    if (e.keep_each && e.T > min_slots() - 1) return 1;
    if (!holds(e.seq, seq(e.seq).length())) return 2;
    return 0;
  }

  void add(int s) { reset(seq(s)), seq(s).active = true; }
  void release(int s) { reset(seq(s)); }
  void clear() {
    for (Seq& q : seqs_) reset(q);
  }
  /// rewind / tail removal to n.
  void truncate(int s, int n) {
    Seq& q = seq(s);
    q.states.resize(static_cast<std::size_t>(n));
    q.tokens.resize(static_cast<std::size_t>(n));
    for (auto& h : q.held)
      for (int& p : h)
        if (p >= n) p = -1;
  }
  /// dst inherits the states of positions below upto and the snapshots src holds of them.
  void fork(int src, int dst, int upto) {
    Seq d;
    reset(d);
    d.active = true;
    const Seq& from = seq(src);
    d.states.assign(from.states.begin(), from.states.begin() + upto);
    d.tokens.assign(from.tokens.begin(), from.tokens.begin() + upto);
    for (int k = 0; k < n_groups(); ++k)
      for (int sl = 0; sl < slots(k); ++sl) {
        const int p = from.held[static_cast<std::size_t>(k)][static_cast<std::size_t>(sl)];
        d.held[static_cast<std::size_t>(k)][static_cast<std::size_t>(sl)] = p < upto ? p : -1;
      }
    seq(dst) = d;
  }

  /// `s` (holding nothing) adopted a prefix hit of tokens[0, L) (L > 0): its
  /// states are those tokens' (the contract: a state follows from the tokens
  /// before it), and each State group holds only the state after L - 1 (the
  /// named snapshot).
  void adopt(int s, const std::int32_t* tokens, int L) {
    Seq& q = seq(s);
    q.tokens.assign(tokens, tokens + L);
    q.states.clear();
    std::uint64_t h = kZeros;
    for (int p = 0; p < L; ++p) q.states.push_back(h = next_state(h, tokens[p]));
    for (int k = 0; k < n_groups(); ++k) {
      std::vector<int>& held = q.held[static_cast<std::size_t>(k)];
      for (int& p : held) p = -1;
      held[static_cast<std::size_t>((L - 1) % slots(k))] = L - 1;
    }
  }
  /// Token ids of `s`'s positions.
  const std::vector<std::int32_t>& tokens(int s) const { return seq(s).tokens; }

  /// A step begins: each entry's slots hold, from now on, the positions the
  /// step keeps (what they held before is gone, even if it is aborted).
  void begin(const std::vector<Entry>& entries) {
    for (const Entry& e : entries) {
      Seq& q = seq(e.seq);
      const int L = q.length();
      for (int k = 0; k < n_groups(); ++k) {
        std::vector<int>& h = q.held[static_cast<std::size_t>(k)];
        for (int& p : h)
          if (p >= L) p = -1;
        for (int c = e.keep_each ? 0 : e.T - 1; c < e.T; ++c) h[static_cast<std::size_t>((L + c) % slots(k))] = L + c;
      }
    }
  }

  /// Checks the plan's state slots against the store and the contract; fills
  /// each entry's computed states and the pending writes. "" when exact.
  std::string check_reads(const kvcore::BatchStepPlan& plan, std::vector<Entry>& entries) {
    if (plan.n_state_groups != n_groups()) return "the plan has " + std::to_string(plan.n_state_groups) + " state groups";
    writes_.assign(static_cast<std::size_t>(n_groups()), {});
    for (int i = 0; i < plan.n_entries; ++i) {
      Entry& e = entries[static_cast<std::size_t>(i)];
      const Seq& q = seq(e.seq);
      const int L = q.length();
      e.computed.assign(static_cast<std::size_t>(e.T), 0);
      for (int j = 0; j < e.T; ++j) {
        const int parent = e.parents[static_cast<std::size_t>(j)];
        const std::uint64_t start = parent < 0 ? q.before(L) : e.computed[static_cast<std::size_t>(parent)];
        e.computed[static_cast<std::size_t>(j)] = next_state(start, e.tokens[static_cast<std::size_t>(j)]);
      }
    }
    for (int k = 0; k < n_groups(); ++k) {
      const kvcore::StateGroupPlan& sp = plan.state_groups[k];
      if (sp.slots_per_seq != slots(k)) return "state group " + std::to_string(k) + ": slots_per_seq";
      const std::vector<std::uint64_t>& store = store_[static_cast<std::size_t>(k)];
      std::map<int, int> writer;  // slot -> entry
      std::vector<std::pair<int, int>> pre_reads;  // (slot, entry) read from before the step
      for (int i = 0; i < plan.n_entries; ++i) {
        const Entry& e = entries[static_cast<std::size_t>(i)];
        const int at = plan.query_starts[i];
        const int L = seq(e.seq).length();
        std::map<int, std::uint64_t> local;  // slots this entry wrote so far
        for (int j = 0; j < e.T; ++j) {
          const std::string where = "state group " + std::to_string(k) + ", seq " + std::to_string(e.seq) +
                                    " at length " + std::to_string(L) + ", token " + std::to_string(j);
          const int parent = e.parents[static_cast<std::size_t>(j)];
          const std::uint64_t want = parent < 0 ? seq(e.seq).before(L) : e.computed[static_cast<std::size_t>(parent)];
          const int r = sp.read_slots[at + j];
          std::uint64_t got;
          if (r >= 0) {
            if (r >= sp.num_slots) return where + ": read slot out of range";
            if (local.count(r)) {
              got = local[r];
            } else {
              got = store[static_cast<std::size_t>(r)];
              pre_reads.emplace_back(r, i);
            }
          } else if (parent < 0) {
            if (L != 0) return where + ": no read slot, but the state after " + std::to_string(L - 1) + " is not zeros";
            got = kZeros;
          } else {  // carried within the forward: only when the parent's state is not kept
            if (sp.write_slots[at + parent] >= 0) return where + ": no read slot though its parent's state was written";
            got = e.computed[static_cast<std::size_t>(parent)];
          }
          if (got != want) return where + ": starts from the wrong state (slot " + std::to_string(r) + ")";
          const int w = sp.write_slots[at + j];
          const bool kept = e.keep_each || j == e.T - 1;
          if ((w >= 0) != kept) return where + (kept ? ": a kept state has no write slot" : ": writes a state not kept");
          if (w >= sp.num_slots) return where + ": write slot out of range";
          if (w >= 0) {
            auto it = writer.find(w);
            if (it != writer.end() && it->second != i) return where + ": two entries write slot " + std::to_string(w);
            if (local.count(w)) return where + ": writes a slot an earlier token of its entry wrote";
            writer[w] = i;
            local[w] = e.computed[static_cast<std::size_t>(j)];
            writes_[static_cast<std::size_t>(k)].emplace_back(w, e.computed[static_cast<std::size_t>(j)]);
          }
        }
      }
      for (const auto& rd : pre_reads) {
        auto it = writer.find(rd.first);
        if (it != writer.end() && it->second != rd.second)
          return "state group " + std::to_string(k) + ": slot " + std::to_string(rd.first) +
                 " is read by one entry and written by another in one step";
      }
    }
    return "";
  }

  /// The backend performs the checked plan's writes.
  void apply_writes() {
    for (int k = 0; k < n_groups(); ++k)
      for (const auto& w : writes_[static_cast<std::size_t>(k)]) store_[static_cast<std::size_t>(k)][static_cast<std::size_t>(w.first)] = w.second;
    writes_.clear();
  }

  /// The step commits with `accepted` (per entry, the accepted node indices):
  /// the backend performs the commit's slot copies; each sequence's states grow.
  std::string commit(const std::vector<Entry>& entries, const std::vector<std::vector<int>>& accepted,
                     const kvcore::BatchCommit& done) {
    if (done.n_state_groups != n_groups()) return "the commit has the wrong number of state groups";
    for (int k = 0; k < n_groups(); ++k) {
      const kvcore::GroupCommit& gc = done.state_groups[k];
      std::vector<std::uint64_t>& store = store_[static_cast<std::size_t>(k)];
      for (int c = 0; c < gc.n_copies; ++c) {
        if (gc.copies[c].src < 0 || gc.copies[c].src >= static_cast<int>(store.size()) || gc.copies[c].dst < 0 ||
            gc.copies[c].dst >= static_cast<int>(store.size()))
          return "a state copy out of range";
        store[static_cast<std::size_t>(gc.copies[c].dst)] = store[static_cast<std::size_t>(gc.copies[c].src)];
      }
    }
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const Entry& e = entries[i];
      for (int node : accepted[i]) {
        seq(e.seq).states.push_back(e.computed[static_cast<std::size_t>(node)]);
        seq(e.seq).tokens.push_back(e.tokens[static_cast<std::size_t>(node)]);
      }
    }
    return "";
  }

 private:
  void reset(Seq& s) const {
    s = Seq{};
    s.held.assign(D_.size(), {});
    for (std::size_t k = 0; k < D_.size(); ++k) s.held[k].assign(static_cast<std::size_t>(D_[k]), -1);
  }

  std::vector<int> D_;
  std::vector<std::vector<std::uint64_t>> store_;
  std::vector<Seq> seqs_;
  std::vector<std::vector<std::pair<int, std::uint64_t>>> writes_;
};

}  // namespace state_ref
}  // namespace kvcore_test
