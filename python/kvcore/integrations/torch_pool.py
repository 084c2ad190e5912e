"""Deprecated: ``kvcore.integrations.torch_pool`` moved to ``kvcore.torch.pool``.

This path keeps working until kvcore 0.2.0, where it is removed, and warns (DeprecationWarning)
when imported; import ``kvcore.torch.pool`` instead (docs/deprecations.md).
"""

from __future__ import annotations

import warnings

from kvcore.torch.layer import NATIVE_WRITES, LayerPool
from kvcore.torch.pool import ORDERS, TorchKVPool
from kvcore.torch.step_layout import StepLayout, read_positions

warnings.warn(
    "kvcore.integrations.torch_pool is deprecated: import kvcore.torch.pool (removed in kvcore 0.2.0)",
    DeprecationWarning,
    stacklevel=2,
)


__all__ = ["LayerPool", "NATIVE_WRITES", "ORDERS", "StepLayout", "TorchKVPool", "read_positions"]
