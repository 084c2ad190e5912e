"""Deprecated: ``kvcore.integrations.forward_step`` moved to ``kvcore.forward_step``.

This path keeps working for one release and warns (DeprecationWarning) when imported;
import ``kvcore.forward_step`` instead (docs/pool.md, README's layout table).
"""

from __future__ import annotations

import warnings

from kvcore.forward_step import ForwardStep, KVStep

warnings.warn(
    "kvcore.integrations.forward_step is deprecated: import kvcore.forward_step", DeprecationWarning, stacklevel=2
)


__all__ = ["ForwardStep", "KVStep"]
