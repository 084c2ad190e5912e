"""The transformers releases whose continuous-batching internals kvcore's batching plugs into.

kvcore serves transformers' continuous batching by handing its manager a cache
object (``KVCorePagedCache``) in place of ``PagedAttentionCache``. That object
answers the calls transformers' scheduler, batch processor and input builder
make into the cache, which are private and change between minor releases, so the
integration accepts only the releases it was written against and checks that
the calls it answers still exist.
"""

from __future__ import annotations

import inspect
from typing import Any

import transformers

from kvcore.integrations.transformers_release import BATCHING_SUPPORTED, TESTED, check_release

SUPPORTED = BATCHING_SUPPORTED


def check_batching_support(version: str = transformers.__version__) -> None:
    """Raise NotSupportedError unless ``version`` is in ``SUPPORTED`` and transformers'
    continuous-batching internals have the shape this integration relies on."""
    check_release(
        version,
        SUPPORTED,
        "kvcore's continuous batching",
        "It replaces transformers' PagedAttentionCache, whose private interface changes between minor releases.",
        _internals,
    )


def _internals() -> dict[str, bool]:
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


__all__ = ["SUPPORTED", "TESTED", "check_batching_support"]
