"""Deprecated: ``kvcore.integrations.torch_paged`` moved to ``kvcore.torch.paged``.

This path keeps working for one release and warns (DeprecationWarning) when imported;
import ``kvcore.torch.paged`` instead (docs/pool.md, README's layout table).
"""

from __future__ import annotations

import warnings

from kvcore.torch.paged import TorchPagedKVPool

TorchPagedKV = TorchPagedKVPool  # the name of the last release

warnings.warn(
    "kvcore.integrations.torch_paged is deprecated: import kvcore.torch.paged", DeprecationWarning, stacklevel=2
)


__all__ = ["TorchPagedKV", "TorchPagedKVPool"]
