// Step: the handle begin_step() returns. `id` tells a retried or rewound step
// from the current one, so a stale handle can never be committed.
#pragma once

#include <cstdint>

namespace kvcore {

struct Step {
  /// First logical position the step writes (the committed length when begun).
  int position = 0;
  /// Tokens in the step: positions [position, position + T).
  int T = 0;
  /// Unique per begin_step() of one cache; 0 never names a begun step.
  std::uint64_t id = 0;
  /// True when begun by begin_tree(): its T nodes form a draft tree
  /// (docs/design.md section 7) rather than a chain of positions.
  bool tree = false;
  /// True when the step may be rewound into (begun with verify, or a tree):
  /// State layers keep the state after each of its positions
  /// (docs/design.md section 9).
  bool verify = false;

  int end() const noexcept { return position + T; }
};

}  // namespace kvcore
