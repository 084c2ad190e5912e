"""Room for a ``chunked_attention`` type in transformers' continuous-batching inputs.

transformers 5.24's input builder (``ContinuousBatchingIOs``) keeps key lengths and
attention masks for two attention types by name, ``full_attention`` and
``sliding_attention``, and has no allocator for chunked layers (Llama 4). kvcore plans
chunked layers itself (a group of its own, ``GroupView`` with a chunk size), so the
input builder only needs a place for the type: the sliding type's row of its bulk
tensor (unused: kvcore serves chunked layers beside full ones only) and a mask of the
full type's size. The builder then fills both as for any type: key lengths from
``GroupView.get_seqlen_k``, a causal mask over each request's keys, exact because no
forward carries a request across a chunk boundary (``capped_scheduler``).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from transformers.generation.continuous_batching import initialization

from kvcore.integrations.transformers_config import CHUNKED, FULL, SLIDING

_SLIDING_ROW = 5  # ContinuousBatchingIOs' bulk-tensor row of the sliding type's cumulative key lengths


def make_room_for_chunked(io: Any, allocators: dict[str, Any]) -> None:
    """Add the ``chunked_attention`` entries to transformers' input builder ``io`` when the
    cache's ``allocators`` have that type (idempotent; nothing otherwise)."""
    if CHUNKED not in allocators or CHUNKED in io.cumulative_seqlens_k:
        return
    assert SLIDING not in io.cumulative_seqlens_k, "kvcore serves chunked layers beside full ones only"
    io.cumulative_seqlens_k[CHUNKED] = io._bulk_input_tensor[_SLIDING_ROW, : io.max_requests_per_batch + 1]
    io.total_seqlen_k[CHUNKED] = 0
    io.max_length_k[CHUNKED] = 0
    if io.attention_mask is not None:
        full = io.attention_mask[FULL]
        io.attention_mask[CHUNKED] = torch.full_like(full, torch.finfo(full.dtype).min)


@contextlib.contextmanager
def chunked_types_pass_setup() -> Iterator[None]:
    """While transformers' manager resolves its config: its decode-fast-path check groups the
    layers by type and raises on ``chunked_attention``; kvcore turns that path off
    (``max_blocks_per_request = 0``), so for a config with chunked layers the check sees one
    full group. Other configs get transformers' own answer."""
    original = initialization.group_layers_by_attn_type

    def grouped(config: Any) -> dict[str, list[int]]:
        types = getattr(config, "layer_types", None) or []
        if CHUNKED in types:
            return {FULL: list(range(len(types)))}
        return dict(original(config))

    initialization.group_layers_by_attn_type = grouped
    try:
        yield
    finally:
        initialization.group_layers_by_attn_type = original


__all__ = ["chunked_types_pass_setup", "make_room_for_chunked"]
