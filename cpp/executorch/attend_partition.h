// AttendPartition: how one layer's attention is cut into tasks for AttendSession's
// workers, and how the split-K partial softmaxes are merged (flash-decoding).
//
// The work is a grid: query items (query head x token, decode has 1 token and a few
// heads) by key blocks (kBlock visible K/V rows each). Tasks take a range of items and a
// range of blocks. Key ranges come first (k_parts), because each task widens its blocks
// once for all its items and a decode step has few items but many blocks; the items are
// split (q_parts) only when the blocks run out. A task with a key range writes partial
// softmax state (running max, sum, weighted values) for its items into the slot of its
// key range; merge() then combines the slots of an item in key-range order. The cut
// depends only on the sizes and the worker count, never on scheduling, so a result is
// the same run to run; with one key range it is the single-thread result bit for bit
// (splitting items changes no arithmetic).
#pragma once

#include <cmath>
#include <cstddef>
#include <limits>

namespace kvcore {
namespace et {

struct AttendPartition {
  int items = 1;    // query items: query heads x tokens
  int blocks = 1;   // key blocks
  int q_parts = 1;  // item ranges
  int k_parts = 1;  // key-block ranges: partial-softmax slots

  /// Tasks per worker at most: smaller tasks let the workers that run share out the work of
  /// one the machine's load keeps from running (a task claimed waits for its worker).
  static constexpr int kTasksPerWorker = 4;

  /// The cut for `workers` workers of `items` x `blocks` whose whole cost is `work`
  /// (multiply-adds): at most kTasksPerWorker tasks per worker (one for one worker) and one
  /// per `min_task_work` of work; key ranges first (at most one per block and `max_k_parts`),
  /// then item ranges with what is left.
  static AttendPartition choose(int workers, int items, int blocks, std::size_t work, std::size_t min_task_work,
                                int max_k_parts) noexcept {
    AttendPartition p;
    p.items = items;
    p.blocks = blocks;
    const std::size_t cap = static_cast<std::size_t>(workers == 1 ? 1 : workers * kTasksPerWorker);
    std::size_t most = min_task_work == 0 ? cap : work / min_task_work;
    if (most > cap) most = cap;
    const int tasks = most < 1 ? 1 : static_cast<int>(most);
    p.k_parts = blocks < tasks ? (blocks < 1 ? 1 : blocks) : tasks;
    if (p.k_parts > max_k_parts) p.k_parts = max_k_parts < 1 ? 1 : max_k_parts;
    const int left = tasks / p.k_parts;
    p.q_parts = items < left ? items : left;
    return p;
  }

  int tasks() const noexcept { return q_parts * k_parts; }
  /// Task `task`'s key range (its slot) and item range: [*begin, *end).
  int k_part(int task) const noexcept { return task % k_parts; }
  void block_range(int task, int* begin, int* end) const noexcept { split(blocks, k_parts, task % k_parts, begin, end); }
  void item_range(int task, int* begin, int* end) const noexcept { split(items, q_parts, task / k_parts, begin, end); }

  /// An item's softmax state ([max, sum, dv weighted values]) from its `k_parts` slots,
  /// `slot_stride` floats apart, in slot order, written to `into` (may be slot 0).
  /// A slot whose max is -inf saw none of the item's rows and adds nothing (every item
  /// sees its own position, so some slot's max is finite).
  static void merge(const float* slot0, std::size_t slot_stride, int k_parts, std::size_t dv, float* into) noexcept {
    const float minus_inf = -std::numeric_limits<float>::infinity();
    float best = minus_inf;
    for (int s = 0; s < k_parts; ++s) {
      const float m = slot0[static_cast<std::size_t>(s) * slot_stride];
      if (m > best) best = m;
    }
    float sum = 0.0f;
    // `into` may alias slot 0: read its scale first, then accumulate slot by slot.
    for (int s = 0; s < k_parts; ++s) {
      const float* a = slot0 + static_cast<std::size_t>(s) * slot_stride;
      const float factor = a[0] == minus_inf ? 0.0f : std::exp(a[0] - best);
      sum += a[1] * factor;
      for (std::size_t e = 0; e < dv; ++e) {
        const float x = a[2 + e] * factor;
        into[2 + e] = s == 0 ? x : into[2 + e] + x;
      }
    }
    into[0] = best;
    into[1] = sum;
  }

 private:
  static void split(int n, int parts, int i, int* begin, int* end) noexcept {
    *begin = static_cast<int>(static_cast<long long>(n) * i / parts);
    *end = static_cast<int>(static_cast<long long>(n) * (i + 1) / parts);
  }
};

}  // namespace et
}  // namespace kvcore
