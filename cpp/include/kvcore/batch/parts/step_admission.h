// StepAdmission: whether a step fits before it begins (begin_step refuses a
// step whole, changing nothing). begin() (StepState, step_state.h) walks each
// entry's block indices once per group, and admission counts them the same
// way beforehand (BegunStep::walk_entry sees each index as it will be once a
// begun step this one replaces has ended), so what admission counts is what
// planning takes. A pool with a free block for every index the entries write
// admits without counting (the usual step: check_entries sums the indices as
// it checks). What end() gives back (walk_begun) counts as free again.
#pragma once

#include <cstdint>

#include "kvcore/batch/batch_plan.h"
#include "kvcore/batch/block_pool.h"
#include "kvcore/batch/parts/begun_step.h"
#include "kvcore/batch/parts/block_group.h"
#include "kvcore/batch/parts/sequence_table.h"
#include "kvcore/batch/parts/step_trees.h"
#include "kvcore/batch/parts/table_pages.h"
#include "kvcore/core/result.h"

namespace kvcore {

class StepAdmission : public BegunStep {
 public:
  /// The entries of begin_step: n in [1, max_seqs], each an active sequence
  /// once, T in [1, max_step], within capacity, at most max_step_tokens in all.
  Status check_entries(const StepEntry* entries, int n, const SequenceTable& seqs) noexcept;

  /// OutOfResources unless `pool` has the blocks the entries need in every
  /// group (new ones, or private copies of shared ones) and `state_need`
  /// more (the State groups' blocks with states in the pool), judged on the
  /// block tables as end() leaves them (a begun step's state slots count as
  /// still held: at worst a replacing step is refused for blocks its
  /// predecessor's end would give back), and unless `tables` has the table
  /// pages the entries' rows lack for the indices they write (end() keeps a
  /// begun step's pages). Changes nothing.
  Status admit(const StepEntry* entries, int n, const SequenceTable& seqs, const BlockGroup* groups,
               std::int64_t state_need, const BlockPool& pool, const TablePages& tables) const noexcept;

  /// The blocks an entry of T tokens of `seq` takes in group g (new ones, or
  /// private copies of shared or named ones), judged as admit() judges each
  /// entry: admit() refuses a group whose entries' sum passes its free blocks
  /// (plus what end() gives back). Changes nothing.
  int entry_need(const SequenceTable& seqs, const BlockGroup& group, int g, int seq, int T) const noexcept;

 private:
  Status admit_pages(const StepEntry* entries, int n, const SequenceTable& seqs, const BlockGroup* groups,
                     const TablePages& tables) const noexcept;
  bool frees_page(const SequenceTable& seqs, const BlockGroup& group, int g, int i, int p) const noexcept;
  std::uint64_t stamp_ = 0;
  std::int64_t walked_blocks_ = 0;  // check_entries: block indices the entries write, summed
  std::int64_t walked_pages_ = 0;   // check_entries: table pages those indices lie in, summed
};

inline Status StepAdmission::check_entries(const StepEntry* entries, int n, const SequenceTable& seqs) noexcept {
  KVCORE_CHECK_OR_RETURN_ERROR(n >= 1 && n <= lim_.max_seqs, InvalidArgument,
                               "begin_step: %d entries, must be in [1, max_seqs = %d]", n, lim_.max_seqs);
  KVCORE_CHECK_OR_RETURN_ERROR(entries != nullptr, InvalidArgument, "begin_step: entries is null");
  ++stamp_;
  std::int64_t tokens = 0;  // n values of T up to max_step each: 64 bits
  std::int64_t walked = 0;  // block indices the entries write, each at most once per entry
  std::int64_t walked_pages = 0;  // table pages they lie in (paged tables: P = 2^shift)
  const int page_shift = lim_.table_page_shift;
  std::int64_t mask_words = 0;  // the trees' ancestor masks
  for (int i = 0; i < n; ++i) {
    const StepEntry& e = entries[i];
    if (!seqs.is_active(e.seq)) return seqs.check_active("begin_step", e.seq);
    KVCORE_CHECK_OR_RETURN_ERROR(seen_[e.seq] != stamp_, InvalidArgument, "begin_step: sequence %d appears twice",
                                 e.seq);
    seen_[e.seq] = stamp_;
    KVCORE_CHECK_OR_RETURN_ERROR(e.T >= 1 && e.T <= lim_.max_step, InvalidArgument,
                                 "begin_step: sequence %d with T = %d, must be in [1, max_step = %d]", e.seq,
                                 e.T, lim_.max_step);
    if (e.parents != nullptr) {
      KVCORE_RETURN_IF_ERROR(StepTrees::check_entry(e));
      mask_words += StepTrees::mask_words(e);
    }
    const int length = seqs[e.seq].length;
    KVCORE_CHECK_OR_RETURN_ERROR(static_cast<std::int64_t>(length) + e.T <= lim_.capacity, OutOfResources,
                                 "begin_step: sequence %d at length %d with T = %d would pass "
                                 "capacity = %d",
                                 e.seq, length, e.T, lim_.capacity);
    tokens += e.T;
    KVCORE_CHECK_OR_RETURN_ERROR(tokens <= lim_.max_step_tokens, InvalidArgument,
                                 "begin_step: %d tokens or more, must be <= max_step_tokens = %d", tokens,
                                 lim_.max_step_tokens);
    const int first = div_.floor(length), last = div_.floor(length + e.T - 1);  // length + T - 1 < capacity
    walked += last - first + 1;
    walked_pages += (last >> page_shift) - (first >> page_shift) + 1;
  }
  walked_blocks_ = walked;
  walked_pages_ = walked_pages;
  return trees_.check_mask_words(mask_words);
}

inline int StepAdmission::entry_need(const SequenceTable& seqs, const BlockGroup& group, int g, int seq,
                                      int T) const noexcept {
  const GroupPool& pool = group.pool();
  int need = 0;
  walk_entry(group, g, seq, seqs[seq].length, T, [&](int, int cur) { need += cur < 0 || must_copy(pool, cur); });
  return need;
}

inline Status StepAdmission::admit(const StepEntry* entries, int n, const SequenceTable& seqs,
                                   const BlockGroup* groups, std::int64_t state_need, const BlockPool& pool,
                                   const TablePages& tables) const noexcept {
  KVCORE_RETURN_IF_ERROR(admit_pages(entries, n, seqs, groups, tables));
  if (lim_.n_groups == 0 && state_need == 0) return Error::Ok;
  // Every group draws from one pool. An entry takes at most one block per
  // index it writes in each group (check_entries counted them), and end()
  // only adds free blocks: a pool with that many free admits the step,
  // whatever the exact count below would say.
  if (pool.free_blocks() >= walked_blocks_ * lim_.n_groups + state_need) return Error::Ok;
  std::int64_t need = state_need;
  int freed = 0;  // what end() gives back
  for (int g = 0; g < lim_.n_groups; ++g) {
    for (int i = 0; i < n; ++i) need += entry_need(seqs, groups[g], g, entries[i].seq, entries[i].T);
    walk_begun(seqs, groups[g], g, [&](int, int, int, int) { ++freed; });
  }
  const int free = pool.free_blocks() + freed;
  KVCORE_CHECK_OR_RETURN_ERROR(need <= free || state_need > 0, OutOfResources,
                               "begin_step: the step needs %lld blocks over its %d group%s, %d of the pool's %d are free",
                               static_cast<long long>(need), lim_.n_groups, lim_.n_groups == 1 ? "" : "s", free,
                               pool.n_blocks());
  KVCORE_CHECK_OR_RETURN_ERROR(need <= free, OutOfResources,
                               "begin_step: the step needs %lld blocks over its %d groups (%lld of them for the "
                               "states of %d State group%s), %d of the pool's %d are free",
                               static_cast<long long>(need), lim_.n_groups + lim_.n_state_groups,
                               static_cast<long long>(state_need), lim_.n_state_groups,
                               lim_.n_state_groups == 1 ? "" : "s", free, pool.n_blocks());
  return Error::Ok;
}

// Does end() give page p of the row of begun entry i back in group g? It
// does when every block the page names is one the step placed where the row
// had none (end() puts -1 back there).
inline bool StepAdmission::frees_page(const SequenceTable& seqs, const BlockGroup& group, int g, int i,
                                      int p) const noexcept {
  const int seq = step_seq_[i];
  const int live = group.page_live(seq, p);
  if (live <= 0) return false;
  const int first = div_.floor(seqs[seq].length), end = ceil_blocks(context_lens_[i]);
  const int lo = group.page_first(p) > first ? group.page_first(p) : first;
  const int hi = group.page_first(p + 1) < end ? group.page_first(p + 1) : end;
  int placed = 0;
  for (int b = lo; b < hi; ++b)
    placed += group.block_at(seq, b) >= 0 && (b == first ? first_before(g, i) : -1) < 0;
  return placed == live;
}

inline Status StepAdmission::admit_pages(const StepEntry* entries, int n, const SequenceTable& seqs,
                                         const BlockGroup* groups, const TablePages& tables) const noexcept {
  // Each entry writes indices [floor(length / B), ceil((length + T) / B)),
  // in walked_pages_ pages per group at most: free pages for all admit.
  if (tables.pinned() || tables.free_pages() >= walked_pages_ * lim_.n_groups) return Error::Ok;
  // Judged on the rows as end() leaves them: the pages it gives back are
  // free, and an entry whose range lies in one of them needs it again.
  std::int64_t need = 0, freed = 0;
  for (int g = 0; g < lim_.n_groups; ++g) {
    const BlockGroup& group = groups[g];
    for (int i = 0; i < active_.n_entries; ++i) {
      const int seq = step_seq_[i];
      const int first = div_.floor(seqs[seq].length), end = ceil_blocks(context_lens_[i]);
      for (int p = group.page_of(first); first < end && p <= group.page_of(end - 1); ++p)
        freed += frees_page(seqs, group, g, i, p);
    }
    for (int i = 0; i < n; ++i) {
      const int seq = entries[i].seq, length = seqs[seq].length;
      const int first = div_.floor(length), end = ceil_blocks(length + entries[i].T);
      const int begun = begun_entry(seq);
      for (int p = group.page_of(first); p <= group.page_of(end - 1); ++p)
        need += group.page_live(seq, p) < 0 || (begun >= 0 && frees_page(seqs, group, g, begun, p));
    }
  }
  KVCORE_CHECK_OR_RETURN_ERROR(need <= tables.free_pages() + freed, OutOfResources,
                               "begin_step: the step's block tables need %lld more table pages, %lld of "
                               "batch.table_pages = %d are free",
                               static_cast<long long>(need), static_cast<long long>(tables.free_pages() + freed),
                               tables.n_pages());
  return Error::Ok;
}

}  // namespace kvcore
