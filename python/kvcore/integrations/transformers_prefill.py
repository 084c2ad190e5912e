"""Running a model's forwards through a ``KVCoreCache``: ``prefill`` and ``cache_keyword``.

A forward may carry at most ``cache.max_step`` tokens: ``prefill`` feeds longer inputs in
chunks of that size (or use ``generate(..., prefill_chunk_size=cache.max_step)``), with
the masks of ``cache.attention_masks`` when the cache keeps attention sinks. Speculative
decoding and draft-tree verification are ``kvcore.integrations.transformers_speculative``.
Both are importable from ``kvcore.integrations.transformers``.
"""

from __future__ import annotations

import inspect
from typing import Any, Optional

import torch

from kvcore._errors import InvalidArgumentError
from kvcore.integrations.transformers_cache import KVCoreCache


def cache_keyword(model: Any) -> str:
    """The keyword the model's forward takes its cache under (``cache`` in 5.24, ``past_key_values`` earlier)."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def prefill(
    model: Any,
    cache: KVCoreCache,
    input_ids: torch.Tensor,
    *,
    attention_mask: Optional[torch.Tensor] = None,
    position_ids: Optional[torch.Tensor] = None,
    **forward_kwargs: Any,
) -> Any:
    """Feed ``input_ids`` through ``model`` in chunks of ``cache.max_step`` tokens; return the last output.

    ``attention_mask`` (2-D, optional) covers the cached tokens and ``input_ids``;
    ``position_ids`` (optional) covers ``input_ids``: without it and without
    ``attention_mask`` the tokens stand at the cache length onwards, passed to the model
    (some models, Bamba's, would number every forward's tokens from 0). For a
    cache with sinks, each chunk's masks come from ``cache.attention_masks``. Also a
    decode step: ``prefill(model, cache, next_token)``.
    """
    if input_ids.dim() != 2 or input_ids.shape[1] < 1:
        raise InvalidArgumentError(f"input_ids {tuple(input_ids.shape)}: must be 2-D [batch, >= 1 tokens]")
    start_length = cache.sequence.length
    if attention_mask is not None and attention_mask.shape[-1] != start_length + input_ids.shape[1]:
        raise InvalidArgumentError(
            f"attention_mask {tuple(attention_mask.shape)}: must cover the {start_length} cached tokens and "
            f"the {input_ids.shape[1]} new ones"
        )
    keyword = cache_keyword(model)
    if position_ids is None and attention_mask is None:
        position_ids = torch.arange(start_length, start_length + input_ids.shape[1], device=input_ids.device)[None]
    output = None
    for start in range(0, int(input_ids.shape[1]), cache.max_step):
        chunk = input_ids[:, start : start + cache.max_step]
        end = start_length + start + chunk.shape[1]
        kwargs: dict[str, Any] = dict(forward_kwargs)
        mask = None if attention_mask is None else attention_mask[:, :end]
        if cache.has_sinks:
            kwargs["attention_mask"] = cache.attention_masks(
                model.config,
                int(chunk.shape[1]),
                attention_mask=mask,
                batch_size=int(chunk.shape[0]),
                dtype=model.dtype,
                device=chunk.device,
            )
        elif mask is not None:
            kwargs["attention_mask"] = mask
        if position_ids is not None:
            kwargs["position_ids"] = position_ids[..., start : start + chunk.shape[1]]
        output = model(input_ids=chunk, use_cache=True, **{keyword: cache}, **kwargs)
    return output


__all__ = ["cache_keyword", "prefill"]
