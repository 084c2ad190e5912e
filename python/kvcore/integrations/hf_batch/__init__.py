"""Deprecated: ``kvcore.integrations.hf_batch`` moved to ``kvcore.integrations.transformers_batch``.

This path keeps working until kvcore 0.2.0, where it is removed, and warns (DeprecationWarning)
when imported; import ``kvcore.integrations.transformers_batch`` (or the same names from
``kvcore.integrations.transformers``) instead (docs/deprecations.md). It serves the package's
names; its submodules are ``kvcore.integrations.transformers_batch``'s.
"""

from __future__ import annotations

import warnings

from kvcore.integrations.transformers_batch import (
    SUPPORTED,
    TESTED,
    BatchCounters,
    BatchOptions,
    KVCoreBatchingManager,
    KVCorePagedCache,
    check_batching_support,
    generate_batch,
    init_kvcore_batching,
)

warnings.warn(
    "kvcore.integrations.hf_batch is deprecated: import kvcore.integrations.transformers_batch "
    "(removed in kvcore 0.2.0)",
    DeprecationWarning,
    stacklevel=2,
)


__all__ = [
    "SUPPORTED",
    "TESTED",
    "BatchCounters",
    "BatchOptions",
    "KVCoreBatchingManager",
    "KVCorePagedCache",
    "check_batching_support",
    "generate_batch",
    "init_kvcore_batching",
]
