"""The transformers releases kvcore's integrations accept: the one version gate.

``kvcore.integrations.transformers`` (``KVCoreCache``) relies on transformers' public Cache
API and accepts 5.x from 5.24 (``SUPPORTED_TRANSFORMERS``); continuous batching
(``kvcore.integrations.transformers_batch``) replaces private internals that change between minor
releases and accepts the tested minor release only (``SUPPORTED_BATCHING``). Each checks
its range and then that the calls it relies on are there (``check_release``):
``check_transformers`` runs at import of ``kvcore.integrations.transformers_layers``, before
it subclasses transformers' layer classes, and ``check_batching_support`` when a batching
manager is built, so another release raises NotSupportedError rather than risk wrong output.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import transformers
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from transformers import cache_utils

from kvcore._errors import NotSupportedError

#: The transformers release both integrations are tested with.
TESTED = "5.24.0"
#: The releases ``KVCoreCache`` accepts (transformers' public Cache API).
CACHE_SUPPORTED = ">=5.24,<6"
#: The releases continuous batching accepts (transformers' private batching internals).
BATCHING_SUPPORTED = ">=5.24,<5.25"

# The names each integration exports them under.
TESTED_TRANSFORMERS = TESTED
SUPPORTED_TRANSFORMERS = CACHE_SUPPORTED
SUPPORTED_BATCHING = BATCHING_SUPPORTED


def check_release(version: str, supported: str, user: str, why: str, needed: Callable[[], dict[str, bool]]) -> None:
    """Raise NotSupportedError unless transformers ``version`` (its base release: a pre-release of
    5.24.0 counts as 5.24.0) is in ``supported`` and every call ``needed()`` names exists.
    ``user`` names the integration in the message, ``why`` says why other releases are refused."""
    if not SpecifierSet(supported).contains(Version(Version(version).base_version)):
        raise NotSupportedError(
            f"{user} needs transformers {supported} (tested with {TESTED}); found {version}. {why}"
        )
    missing = [name for name, ok in needed().items() if not ok]
    if missing:
        raise NotSupportedError(
            f"transformers {version} lacks {', '.join(missing)}, which {user} relies on (tested with {TESTED})"
        )


# --- the transformers cache ---------------------------------------------------------------


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


# --- continuous batching ------------------------------------------------------------------


def check_batching_support(version: str = transformers.__version__) -> None:
    """Raise NotSupportedError unless ``version`` is in ``SUPPORTED_BATCHING`` and transformers'
    continuous-batching internals have the shape kvcore's batching relies on: it hands
    transformers' manager a cache object (``KVCorePagedCache``) in place of
    ``PagedAttentionCache`` that answers the calls transformers' scheduler, batch processor and
    input builder make into the cache, which are private and change between minor releases."""
    check_release(
        version,
        SUPPORTED_BATCHING,
        "kvcore's continuous batching",
        "It replaces transformers' PagedAttentionCache, whose private interface changes between minor releases.",
        _batching_internals,
    )


def _batching_internals() -> dict[str, bool]:
    from transformers.generation.continuous_batching import cache, continuous_api, input_outputs, scheduler

    manager = continuous_api.ContinuousBatchingManager
    paged = cache.PagedAttentionCache
    return {
        "ContinuousBatchingManager._create_batch_processor": hasattr(manager, "_create_batch_processor"),
        "ContinuousBatchProcessor(cache, ..., scheduler, distributed_helper)": _params(
            continuous_api.ContinuousBatchProcessor.__init__
        )[:2]
        == ["self", "cache"]
        and "scheduler" in _params(continuous_api.ContinuousBatchProcessor.__init__),
        "PagedAttentionCache.extend_read_and_write_indices": _params(
            getattr(paged, "extend_read_and_write_indices", None)
        )
        == ["self", "request_id", "past_length", "query_length", "read_index", "write_index"],
        "PagedAttentionCache.update(key_states, value_states, layer_idx, kwargs)": _params(
            getattr(paged, "update", None)
        )
        == ["self", "key_states", "value_states", "layer_idx", "kwargs"],
        "PagedAttentionCache.can_store_request_tokens": hasattr(paged, "can_store_request_tokens"),
        "PagedAttentionCache.prepare_fork_request": hasattr(paged, "prepare_fork_request"),
        "PagedAttentionCache.search_prefix_match": hasattr(paged, "search_prefix_match"),
        "scheduler.SCHEDULER_MAPPING": hasattr(scheduler, "SCHEDULER_MAPPING"),
        "input_outputs.ContinuousBatchingIOs": hasattr(input_outputs, "ContinuousBatchingIOs"),
    }


def _params(fn: Any) -> list[str]:
    if fn is None:
        return []
    return list(inspect.signature(fn).parameters)


__all__ = [
    "BATCHING_SUPPORTED",
    "CACHE_SUPPORTED",
    "SUPPORTED_BATCHING",
    "SUPPORTED_TRANSFORMERS",
    "TESTED",
    "TESTED_TRANSFORMERS",
    "check_batching_support",
    "check_release",
    "check_transformers",
]
