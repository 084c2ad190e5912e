// SequenceTable: what each sequence of a BatchCache is, position by position:
// active or not, its committed length, the head it removed (positions below
// `start`), the middle ranges it removed (holes: sorted, disjoint, at most
// max_holes) and alloc_end, past which its block tables hold nothing. It
// knows no block and no policy: those are the groups' (block_group.h).
#pragma once

#include <cstdint>
#include <memory>
#include <new>
#include <utility>

#include "kvcore/batch/batch_plan.h"
#include "kvcore/core/buffer.h"
#include "kvcore/core/result.h"

namespace kvcore {

/// One sequence's row of the SequenceTable.
struct SequenceState {
  bool active = false;
  int length = 0;     ///< committed positions [0, length)
  int start = 0;      ///< positions below were removed
  int n_holes = 0;    ///< removed middle ranges in the table's holes
  int alloc_end = 0;  ///< block indices >= this hold nothing (tables are -1 there)
};

class SequenceTable {
 public:
  /// Tables for `max_seqs` sequences of up to `max_holes` holes each, every
  /// sequence inactive. MemoryAllocationFailed: nothing is assigned.
  Status create(int max_seqs, int max_holes) noexcept {
    const std::int64_t hole_entries = static_cast<std::int64_t>(max_seqs) * max_holes;
    auto seqs = internal::Buffer<SequenceState>::make(max_seqs);
    auto holes = internal::Buffer<PositionRange>::make(hole_entries > 0 ? hole_entries : 1);
    KVCORE_CHECK_OR_RETURN_ERROR(seqs && holes, MemoryAllocationFailed,
                                 "cannot allocate the sequence tables of %d sequences", max_seqs);
    seqs_ = std::move(seqs);
    holes_ = std::move(holes);
    max_seqs_ = max_seqs;
    max_holes_ = max_holes;
    return Error::Ok;
  }

  /// InvalidArgument unless seq is in [0, max_seqs); `what` names the call.
  Status check_seq(const char* what, int seq) const noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(seq >= 0 && seq < max_seqs_, InvalidArgument,
                                 "%s: sequence %d must be in [0, max_seqs = %d)", what, seq, max_seqs_);
    return Error::Ok;
  }
  /// check_seq, then InvalidState unless the sequence is active.
  Status check_active(const char* what, int seq) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_seq(what, seq));
    KVCORE_CHECK_OR_RETURN_ERROR(seqs_[seq].active, InvalidState,
                                 "%s: sequence %d is not active (add_sequence or fork it first)", what, seq);
    return Error::Ok;
  }

  /// Is `seq` in [0, max_seqs) and active (check_active without a message)?
  bool is_active(int seq) const noexcept { return seq >= 0 && seq < max_seqs_ && seqs_[seq].active; }

  int max_holes() const noexcept { return max_holes_; }
  SequenceState& operator[](int seq) noexcept { return seqs_[seq]; }
  const SequenceState& operator[](int seq) const noexcept { return seqs_[seq]; }
  PositionRange* holes(int seq) noexcept { return holes_.get() + static_cast<std::ptrdiff_t>(seq) * max_holes_; }
  const PositionRange* holes(int seq) const noexcept {
    return holes_.get() + static_cast<std::ptrdiff_t>(seq) * max_holes_;
  }
  /// Inactive, length 0, nothing removed.
  void reset(int seq) noexcept { seqs_[seq] = SequenceState{}; }

  /// Is position p removed from `seq` (below its start, or in a hole)?
  bool removed(int seq, int p) const noexcept {
    const SequenceState& s = seqs_[seq];
    if (p < s.start) return true;
    for (int h = 0; h < s.n_holes; ++h) {
      const PositionRange& r = holes(seq)[h];
      if (p < r.begin) return false;
      if (p < r.end) return true;
    }
    return false;
  }

  /// The first position >= p that `seq` has not removed.
  int next_kept(int seq, int p) const noexcept {
    const SequenceState& s = seqs_[seq];
    if (p < s.start) p = s.start;
    for (int h = 0; h < s.n_holes; ++h) {
      const PositionRange& r = holes(seq)[h];
      if (p < r.begin) break;
      if (p < r.end) p = r.end;
    }
    return p;
  }

  /// Removes the head up to p1 (start = p1, p1 past start): holes it reaches
  /// merge into the head.
  void remove_head(int seq, int p1) noexcept {
    SequenceState& s = seqs_[seq];
    s.start = p1;
    int kept = 0;
    for (int h = 0; h < s.n_holes; ++h) {
      PositionRange& r = holes(seq)[h];
      if (r.end <= s.start) continue;
      if (r.begin <= s.start) {
        s.start = r.end;  // the hole now touches the head: merge it
        continue;
      }
      holes(seq)[kept++] = r;
    }
    s.n_holes = kept;
  }

  /// Where a middle range [p0, p1) lands among the holes: holes [first, last)
  /// overlap or touch it, and `merged` covers them and it.
  struct HoleMerge {
    int first = 0;
    int last = 0;
    PositionRange merged;
    int n_after = 0;  ///< holes the sequence keeps after the merge
  };
  HoleMerge plan_hole(int seq, int p0, int p1) const noexcept {
    const SequenceState& s = seqs_[seq];
    const PositionRange* hs = holes(seq);
    HoleMerge m;
    m.merged = PositionRange{p0, p1};
    while (m.first < s.n_holes && hs[m.first].end < p0) ++m.first;
    m.last = m.first;
    while (m.last < s.n_holes && hs[m.last].begin <= p1) {
      if (hs[m.last].begin < m.merged.begin) m.merged.begin = hs[m.last].begin;
      if (hs[m.last].end > m.merged.end) m.merged.end = hs[m.last].end;
      ++m.last;
    }
    m.n_after = s.n_holes - (m.last - m.first) + 1;
    return m;
  }

  /// Applies plan_hole's merge (n_after <= max_holes).
  void merge_hole(int seq, const HoleMerge& m) noexcept {
    SequenceState& s = seqs_[seq];
    PositionRange* hs = holes(seq);
    if (m.last - m.first != 1) {  // shift the tail to leave exactly one slot at `first`
      const int shift = 1 - (m.last - m.first);
      if (shift > 0) {
        for (int h = s.n_holes - 1; h >= m.last; --h) hs[h + shift] = hs[h];
      } else {
        for (int h = m.last; h < s.n_holes; ++h) hs[h + shift] = hs[h];
      }
    }
    hs[m.first] = m.merged;
    s.n_holes = m.n_after;
  }

  /// Length n (at most the length): the head and the holes end at n too.
  void truncate(int seq, int n) noexcept {
    SequenceState& s = seqs_[seq];
    s.length = n;
    if (s.start > n) s.start = n;
    PositionRange* hs = holes(seq);
    while (s.n_holes > 0 && hs[s.n_holes - 1].begin >= n) --s.n_holes;
    if (s.n_holes > 0 && hs[s.n_holes - 1].end > n) hs[s.n_holes - 1].end = n;
  }

  /// `seq` (reset) becomes active with `length` positions, those below `start`
  /// and in holes[0, n_holes) removed (an imported sequence), its tables holding
  /// nothing at block indices >= alloc_end.
  void admit(int seq, int length, int start, const PositionRange* holes, int n_holes, int alloc_end) noexcept {
    seqs_[seq] = SequenceState{true, length, start, n_holes, alloc_end};
    for (int h = 0; h < n_holes; ++h) this->holes(seq)[h] = holes[h];
  }

  /// dst (reset) becomes active with src's positions [0, upto): its length,
  /// head and holes, cut at upto.
  void copy_prefix(int src, int dst, int upto) noexcept {
    const SequenceState& s = seqs_[src];
    SequenceState& d = seqs_[dst];
    d.active = true;
    d.length = upto;
    d.start = s.start < upto ? s.start : upto;
    for (int h = 0; h < s.n_holes && holes(src)[h].begin < upto; ++h) {
      PositionRange r = holes(src)[h];
      if (r.end > upto) r.end = upto;
      holes(dst)[d.n_holes++] = r;
    }
  }

 private:
  int max_seqs_ = 0;
  int max_holes_ = 0;
  internal::Buffer<SequenceState> seqs_;
  internal::Buffer<PositionRange> holes_;  // [seq][max_holes]
};

}  // namespace kvcore
