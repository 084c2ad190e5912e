"""The transformers releases and Cache API that ``KVCoreCache`` accepts: ``check_transformers``.

``kvcore.integrations.transformers`` relies on transformers' public Cache API: the
release range comes from ``kvcore.integrations.transformers_release`` (the one version
gate, shared with continuous batching), the calls it makes into that API are listed
here. ``kvcore.integrations.transformers_layers`` runs the check at import, before it
subclasses transformers' layer classes, so importing ``kvcore.integrations.transformers``
on another release raises NotSupportedError rather than risk wrong output.
"""

from __future__ import annotations

import inspect
from typing import Any

import transformers
from transformers import cache_utils

from kvcore.integrations.transformers_release import CACHE_SUPPORTED, TESTED, check_release

TESTED_TRANSFORMERS = TESTED
SUPPORTED_TRANSFORMERS = CACHE_SUPPORTED


def check_transformers(version: str = transformers.__version__) -> None:
    """Raise NotSupportedError unless ``version`` and the installed Cache API are ones ``KVCoreCache`` works with."""
    check_release(
        version,
        SUPPORTED_TRANSFORMERS,
        "kvcore.integrations.transformers",
        "Older 5.x releases size masks from cache_position and crop by absolute length, which this cache "
        "does not implement.",
        _cache_calls,
    )


def _cache_calls() -> dict[str, bool]:
    """The calls transformers makes into a cache, as of the tested release."""
    return {
        "CacheLayerMixin.get_mask_sizes(query_length)": _params(cache_utils.CacheLayerMixin.get_mask_sizes)
        == ["self", "query_length"],
        "Cache.get_mask_sizes(query_length, layer_idx)": _params(cache_utils.Cache.get_mask_sizes)
        == ["self", "query_length", "layer_idx"],
        "Cache.get_query_offset": hasattr(cache_utils.Cache, "get_query_offset"),
        "cache_utils.get_layer_types_and_kwargs": hasattr(cache_utils, "get_layer_types_and_kwargs"),
        # Hybrids: the linear-attention layer API the models call (KVCoreStateLayer implements it).
        "cache_utils.LinearAttentionCacheLayerMixin": hasattr(cache_utils, "LinearAttentionCacheLayerMixin"),
        "Cache.update_conv_state(conv_states, layer_idx, state_idx)": _params(cache_utils.Cache.update_conv_state)[:4]
        == ["self", "conv_states", "layer_idx", "state_idx"],
    }


def _params(fn: Any) -> list[str]:
    return list(inspect.signature(fn).parameters)


__all__ = ["SUPPORTED_TRANSFORMERS", "TESTED_TRANSFORMERS", "check_transformers"]
