"""Deprecated: ``kvcore.integrations.torch_state`` moved to ``kvcore.torch.pool_records``.

This path keeps working until kvcore 0.2.0, where it is removed, and warns (DeprecationWarning)
when imported; import ``kvcore.torch.pool_records`` instead (docs/deprecations.md).
"""

from __future__ import annotations

import warnings
from typing import Union

import torch

from kvcore.state import RecordSource
from kvcore.torch.pool import TorchKVPool
from kvcore.torch.pool_records import export_sequence

warnings.warn(
    "kvcore.integrations.torch_state is deprecated: import kvcore.torch.pool_records (removed in kvcore 0.2.0)",
    DeprecationWarning,
    stacklevel=2,
)


def import_sequence(pool: TorchKVPool, record: RecordSource, *, device: Union[torch.device, str, None] = None) -> None:
    """Deprecated: ``pool.import_sequence(record, device=device)``."""
    pool.import_sequence(record, device=device)


__all__ = ["export_sequence", "import_sequence"]
