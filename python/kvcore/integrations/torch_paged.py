"""Deprecated: ``kvcore.integrations.torch_paged`` moved to ``kvcore.torch.paged``.

This path keeps working until kvcore 0.2.0, where it is removed, and warns (DeprecationWarning)
when imported; import ``kvcore.torch.paged`` instead (docs/deprecations.md).
"""

from __future__ import annotations

import warnings

from kvcore.torch.paged import TorchPagedKVPool

TorchPagedKV = TorchPagedKVPool  # the name of the last release

warnings.warn(
    "kvcore.integrations.torch_paged is deprecated: import kvcore.torch.paged (removed in kvcore 0.2.0)",
    DeprecationWarning,
    stacklevel=2,
)


__all__ = ["TorchPagedKV", "TorchPagedKVPool"]
