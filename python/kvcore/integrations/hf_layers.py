"""Deprecated: ``kvcore.integrations.hf_layers`` moved to ``kvcore.integrations.transformers_config``.

This path keeps working until kvcore 0.2.0, where it is removed, and warns
(DeprecationWarning) when imported; import ``kvcore.integrations.transformers_config``
instead (docs/deprecations.md).
"""

from __future__ import annotations

import warnings

from kvcore.integrations.transformers_config import (
    CHUNKED,
    DUMMY,
    FULL,
    HYBRID,
    SLIDING,
    STATE_TYPES,
    cache_config_for,
    hybrid_state_layers,
)

warnings.warn(
    "kvcore.integrations.hf_layers is deprecated: import kvcore.integrations.transformers_config "
    "(removed in kvcore 0.2.0)",
    DeprecationWarning,
    stacklevel=2,
)


__all__ = ["CHUNKED", "DUMMY", "FULL", "HYBRID", "SLIDING", "STATE_TYPES", "cache_config_for", "hybrid_state_layers"]
