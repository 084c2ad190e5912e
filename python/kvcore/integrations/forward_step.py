"""Deprecated: ``kvcore.integrations.forward_step`` moved to ``kvcore.forward_step``.

This path keeps working until kvcore 0.2.0, where it is removed, and warns (DeprecationWarning)
when imported; import ``kvcore.forward_step`` instead (docs/deprecations.md).
"""

from __future__ import annotations

import warnings

from kvcore.forward_step import ForwardStep, KVStep

warnings.warn(
    "kvcore.integrations.forward_step is deprecated: import kvcore.forward_step (removed in kvcore 0.2.0)",
    DeprecationWarning,
    stacklevel=2,
)


__all__ = ["ForwardStep", "KVStep"]
