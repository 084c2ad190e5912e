"""Deprecated: ``kvcore.integrations.torch_paged_state`` moved to ``kvcore.torch.paged_records``.

This path keeps working until kvcore 0.2.0, where it is removed, and warns (DeprecationWarning)
when imported; import ``kvcore.torch.paged_records`` instead (docs/deprecations.md).
"""

from __future__ import annotations

import warnings
from kvcore.state import RecordSource
from kvcore.torch.paged import TorchPagedKVPool
from kvcore.torch.paged_records import export_sequence

warnings.warn(
    "kvcore.integrations.torch_paged_state is deprecated: import kvcore.torch.paged_records (removed in kvcore 0.2.0)",
    DeprecationWarning,
    stacklevel=2,
)


def import_sequence(kv: TorchPagedKVPool, record: RecordSource, seq: int) -> None:
    """Deprecated: ``kv.import_sequence(seq, record)`` (this old function keeps its old order)."""
    kv.import_sequence(seq, record)


__all__ = ["export_sequence", "import_sequence"]
