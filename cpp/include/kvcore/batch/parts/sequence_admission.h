// SequenceAdmission: how a BatchCache takes in a sequence that comes from
// outside (an imported record, kvcore/state/): which blocks each group needs
// for the positions the record carries, which of them a cached prefix already
// holds (shared, not copied), whether the pools have the rest, and then the
// tables, window floor and prefix keys the sequence starts with. The byte
// layer writes the rows of each fresh block as the admission hands it over.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvcore/batch/batch_plan.h"
#include "kvcore/batch/parts/block_group.h"
#include "kvcore/batch/parts/prefix_index.h"
#include "kvcore/batch/parts/sequence_table.h"
#include "kvcore/core/result.h"

namespace kvcore {

/// An incoming sequence: its length, removed head and holes, the token ids of
/// all its positions (or null: its blocks are named by nothing, and share
/// nothing; an importer gives them only when it trusts them), the prefix
/// namespace its blocks are named in, and per layer l which positions its rows come
/// with: the visible ones below bounds[l * bounds_stride] (sink_end) or from
/// bounds[l * bounds_stride + 1] (held_from) on. Strided so that a record's
/// layer table is read in place; layers of one group must agree (admit checks).
struct SequenceImport {
  int length = 0;
  int start = 0;
  int n_holes = 0;
  const PositionRange* holes = nullptr;
  const std::int32_t* tokens = nullptr;
  const std::int32_t* bounds = nullptr;
  int bounds_stride = 2;
  std::uint64_t prefix_namespace = 0;

  /// Layer l's sink_end and held_from.
  int sink_end(int l) const noexcept { return bounds[static_cast<std::ptrdiff_t>(l) * bounds_stride]; }
  int held_from(int l) const noexcept { return bounds[static_cast<std::ptrdiff_t>(l) * bounds_stride + 1]; }
};

class SequenceAdmission {
 public:
  /// `group_layer[g]`: a layer of group g (its bounds stand for the group's).
  SequenceAdmission(const SequenceImport& in, int block_size, const int* group_layer) noexcept
      : in_(in), B_(block_size), group_layer_(group_layer) {}

  /// InvalidArgument unless every layer carries the positions its group's
  /// first layer carries (layer_group[l]: the group of layer l; skip(l): a
  /// layer that carries no rows of its own, a Shared one).
  template <class Skip>
  Status check_layers(int n_layers, const int* layer_group, Skip skip) const noexcept {
    for (int l = 0; l < n_layers; ++l) {
      if (skip(l)) continue;
      const int g = layer_group[l], first = group_layer_[g];
      KVCORE_CHECK_OR_RETURN_ERROR(
          in_.sink_end(l) == in_.sink_end(first) && in_.held_from(l) == in_.held_from(first), InvalidArgument,
          "import: layer %d (group %d) carries sink_end %d / held_from %d, another layer of its group %d / %d", l, g,
          in_.sink_end(l), in_.held_from(l), in_.sink_end(first), in_.held_from(first));
    }
    return Error::Ok;
  }

  /// The first visible position >= p (length when none).
  int next_visible(int p) const noexcept {
    if (p < in_.start) p = in_.start;
    for (int h = 0; h < in_.n_holes; ++h) {
      if (p < in_.holes[h].begin) break;
      if (p < in_.holes[h].end) p = in_.holes[h].end;
    }
    return p < in_.length ? p : in_.length;
  }
  /// Does the record carry a visible position in [lo, hi) it lacks for group g?
  /// Returns the first such position, or -1.
  int first_missing(int g, int lo, int hi) const noexcept {
    const int sink_end = in_.sink_end(group_layer_[g]), held_from = in_.held_from(group_layer_[g]);
    const int from = lo > sink_end ? lo : sink_end;
    const int upto = hi < held_from ? hi : held_from;
    if (from >= upto) return -1;
    const int p = next_visible(from);
    return p < upto ? p : -1;
  }

  /// The position below which group g's rows are not trusted (past its sink
  /// blocks, ending at `sinks_end`): the record's held_from when it lacks
  /// anything below it, else no more than the sink blocks' end (as a cache
  /// that never released anything: its export then names the same bounds).
  int lost_below(int g, std::int64_t sinks_end) const noexcept {
    const int held_from = in_.held_from(group_layer_[g]);
    if (first_missing(g, 0, in_.length) >= 0) return held_from;
    return held_from < sinks_end ? held_from : static_cast<int>(sinks_end < in_.length ? sinks_end : in_.length);
  }

  /// Does group g (sink blocks `sink_blocks`) keep block index i: a visible
  /// position of it in the sink blocks or at or past lost_below(g)?
  bool keeps(int g, int sink_blocks, int i) const noexcept {
    const std::int64_t lo = static_cast<std::int64_t>(i) * B_;
    const std::int64_t end = lo + B_;
    const int hi = end < in_.length ? static_cast<int>(end) : in_.length;
    if (i < sink_blocks) return next_visible(static_cast<int>(lo)) < hi;
    const int lost = lost_below(g, static_cast<std::int64_t>(sink_blocks) * B_);
    const int from = lo > lost ? static_cast<int>(lo) : lost;
    return from < hi && next_visible(from) < hi;
  }

  /// Is every position of block i (all B of them, below the length) carried
  /// and kept by group g? Only such blocks are named by their tokens.
  bool complete(int g, int sink_blocks, int i) const noexcept {
    const std::int64_t lo = static_cast<std::int64_t>(i) * B_;
    if (lo + B_ > in_.length) return false;
    if (in_.start > 0 || in_.n_holes > 0) return false;
    if (first_missing(g, static_cast<int>(lo), static_cast<int>(lo + B_)) >= 0) return false;
    return i < sink_blocks || lo >= lost_below(g, static_cast<std::int64_t>(sink_blocks) * B_);
  }

  /// The blocks group g needs from its pool (fresh ones, and cached ones a
  /// prefix hit of `hit` blocks adopts) beyond those other sequences hold.
  int blocks_needed(int g, const BlockGroup& group, const BlockKey* hit_keys, int hit) const noexcept {
    const NeededBlocks need = group.rule().needed(hit);
    const int sink_blocks = group.rule().sink_blocks();
    int n = 0;
    for (int i = 0; i < ceil_blocks(); ++i) {
      if (!keeps(g, sink_blocks, i)) continue;
      if (i < hit && need.contains(i)) {
        if (group.pool().refs(group.pool().find(hit_keys[i])) == 0) ++n;  // a cached block comes back
      } else {
        ++n;
      }
    }
    return n;
  }

  /// Group g's table of `seq` (reset) shares the blocks of the hit it keeps.
  /// Every group shares before any allocates: the groups draw from one pool,
  /// and a fresh allocation must not reclaim a cached block a hit adopts.
  void share_hit(int g, BlockGroup& group, int seq, const BlockKey* hit_keys, int hit) const noexcept {
    const NeededBlocks need = group.rule().needed(hit);
    const int sink_blocks = group.rule().sink_blocks();
    for (int i = 0; i < hit && i < ceil_blocks(); ++i)
      if (need.contains(i) && keeps(g, sink_blocks, i)) group.share(seq, i, group.pool().find(hit_keys[i]));
  }

  /// Then the other blocks group g keeps are fresh, and write_block(g, i,
  /// block) writes each fresh one's rows. Admitted by blocks_needed: never fails.
  template <class WriteBlock>
  void fill(int g, BlockGroup& group, int seq, int hit, WriteBlock& write_block) const noexcept {
    const NeededBlocks need = group.rule().needed(hit);
    const int sink_blocks = group.rule().sink_blocks();
    for (int i = 0; i < ceil_blocks(); ++i) {
      if (!keeps(g, sink_blocks, i) || (i < hit && need.contains(i))) continue;
      const int b = group.pool().allocate();
      group.set_block(seq, i, b);
      ++group.held(seq);
      write_block(g, i, b);
    }
    group.lost_below(seq) = lost_below(g, static_cast<std::int64_t>(sink_blocks) * B_);
  }

  /// The table pages group g's row of the sequence takes (every index it
  /// keeps: the hit it shares and the blocks it fills), in an empty row.
  int pages_needed(int g, const BlockGroup& group) const noexcept {
    if (group.unpaged()) return 0;
    const int sink_blocks = group.rule().sink_blocks();
    int n = 0, last = -1;
    for (int i = 0; i < ceil_blocks(); ++i)
      if (keeps(g, sink_blocks, i) && group.page_of(i) != last) {
        last = group.page_of(i);
        ++n;
      }
    return n;
  }

  int ceil_blocks() const noexcept {
    return static_cast<int>((static_cast<std::int64_t>(in_.length) + B_ - 1) / B_);
  }

  /// Checks group g can keep what the record carries: every visible position
  /// of its sink blocks is carried (a flat group: every visible position), and
  /// a ring group's window is whole. (Whether the pool has the blocks every
  /// group takes is the caller's sum of blocks_needed.)
  Status check_group(int g, const BlockGroup& group) const noexcept {
    const bool ring = group.policy().evicts();
    const std::int64_t sinks_end = static_cast<std::int64_t>(group.rule().sink_blocks()) * B_;
    const int keep_end = !ring ? in_.length : (sinks_end < in_.length ? static_cast<int>(sinks_end) : in_.length);
    const int missing = first_missing(g, 0, keep_end);
    KVCORE_CHECK_OR_RETURN_ERROR(ring || missing < 0, InvalidArgument,
                                 "import: group %d is flat and keeps every visible position, but the record lacks "
                                 "position %d",
                                 g, missing);
    KVCORE_CHECK_OR_RETURN_ERROR(missing < 0, NotSupported,
                                 "import: group %d keeps positions [0, %d) whole, but the record lacks position %d "
                                 "(its exporter's window released it); use a block size that divides the sinks",
                                 g, keep_end, missing);
    // A ring group's next query (at the length) needs its window: a record lacking
    // part of it would leave holes the next gather reads (RecordView::parse refuses
    // such a record first; this guards a direct admit()).
    const int wb = group.policy().window_begin(in_.length);
    const int lacks = ring ? first_missing(g, wb, in_.length) : -1;
    KVCORE_CHECK_OR_RETURN_ERROR(lacks < 0, InvalidArgument,
                                 "import: group %d (window or chunk %d) lacks position %d, which a query at length %d "
                                 "needs: incomplete",
                                 g, group.policy().window, lacks, in_.length);
    return Error::Ok;
  }

 private:
  const SequenceImport& in_;
  int B_;
  const int* group_layer_;
};

}  // namespace kvcore
