"""What kvcore reads of a transformers model config: its layer types and their kvcore config.

Shared by the transformers cache (``kvcore.integrations.transformers``) and continuous
batching (``kvcore.integrations.hf_batch``), below both (neither imports the other for it).
Needs ``transformers``.
"""

from __future__ import annotations

from typing import Any, Optional

from transformers import cache_utils

from kvcore._core import CacheConfig, Flat, LayerConfig, Ring, State
from kvcore._errors import InvalidArgumentError, NotSupportedError
from kvcore.hf_config import default_state_slots

FULL = "full_attention"
SLIDING = "sliding_attention"
# transformers' recurrent-state layer types (its LinearAttentionLayer): gated DeltaNet and Mamba
# layers are "linear_attention", LFM2's short convolutions "conv". kvcore plans them as State(D).
STATE_TYPES = ("linear_attention", "conv")

# Layer kinds kvcore's core plans (kvcore.Chunked, Shared) that this cache does not serve yet.
_NOT_YET = {
    "chunked_attention": "chunked attention, kvcore.Chunked",
    "dummy": "a KV-shared layer reading an earlier layer's K/V, kvcore.Shared",
}


def cache_config_for(
    config: Any,
    *,
    max_step: Optional[int] = None,
    capacity: Optional[int] = None,
    sinks: int = 0,
    initial_capacity: int = 512,
    state_slots: Optional[int] = None,
) -> tuple[CacheConfig, list[str]]:
    """The kvcore config for a transformers model config, and each layer's transformers layer type.

    Layer types, windows, KV heads and head_dim come from transformers' own helpers
    (what ``DynamicCache(config=...)`` reads). ``capacity`` defaults to
    ``max_position_embeddings``; ``sinks`` applies to every sliding layer. A recurrent-state
    layer (``STATE_TYPES``) becomes ``State(state_slots)``, by default
    ``kvcore.hf_config.default_state_slots(max_step)`` slots (room for a verify step of up to
    8 tokens). Raises InvalidArgumentError for ``state_slots < 1`` or ``sinks < 0``,
    NotSupportedError for a layer type kvcore's transformers cache does not serve.
    """
    text = config.get_text_config(decoder=True)
    if getattr(text, "use_bidirectional_attention", False) or not getattr(text, "is_causal", True):
        raise NotSupportedError("bidirectional attention: kvcore plans causal attention only")
    layer_types, layer_kwargs = cache_utils.get_layer_types_and_kwargs(text)
    n_layers = len(layer_types)
    heads, dims = _head_shapes(text, n_layers)
    if capacity is None:
        capacity = getattr(text, "max_position_embeddings", None)
        if capacity is None:
            raise InvalidArgumentError("capacity: the config has no max_position_embeddings; pass capacity=")
    if sinks < 0:
        raise InvalidArgumentError(f"sinks = {sinks}: must be >= 0")
    if state_slots is None:
        state_slots = default_state_slots(max_step if max_step is not None else min(512, capacity))
    elif state_slots < 1:
        raise InvalidArgumentError(
            f"state_slots = {state_slots}: must be >= 1 (a verify step of T tokens needs T <= state_slots - 1)"
        )
    layers = []
    for i, (kind, kwargs) in enumerate(zip(layer_types, layer_kwargs)):
        if kind == FULL:
            policy = Flat()
        elif kind == SLIDING:
            policy = Ring(int(kwargs["sliding_window"]), sinks)
        elif kind in STATE_TYPES:
            layers.append(LayerConfig(State(state_slots)))
            continue
        else:
            what = _NOT_YET.get(kind)
            raise NotSupportedError(
                f"layer {i} is {kind!r}"
                + (f" ({what}; kvcore plans it, but its transformers integration has not landed yet)" if what else "")
                + f": kvcore's transformers cache supports {FULL!r}, {SLIDING!r} and recurrent-state "
                f"({', '.join(map(repr, STATE_TYPES))}) layers"
            )
        layers.append(LayerConfig(policy, heads[i], dims[i]))
    _check_one_policy_per_type(layer_types, layers)
    cfg = CacheConfig(capacity, layers, max_step=max_step, initial_capacity=initial_capacity)
    return cfg, list(layer_types)


def _check_one_policy_per_type(layer_types: list[str], layers: list[LayerConfig]) -> None:
    # transformers builds one mask per layer type (from the first layer of that type), so
    # every layer of a type must read the same keys: one policy per type.
    first: dict[str, int] = {}
    for i, kind in enumerate(layer_types):
        j = first.setdefault(kind, i)
        if layers[i].policy != layers[j].policy:
            raise NotSupportedError(
                f"layers {j} and {i} are both {kind!r} but have different policies ({layers[j].policy} and "
                f"{layers[i].policy}, e.g. per_layer_config windows): transformers builds one mask per layer "
                f"type, so every layer of a type must have the same window"
            )


def _head_shapes(text: Any, n_layers: int) -> tuple[list[int], list[int]]:
    per_layer = getattr(text, "per_layer_config", None) or [text] * n_layers
    heads = [int(getattr(c, "num_key_value_heads", None) or c.num_attention_heads) for c in per_layer]
    dims = [int(getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads) for c in per_layer]
    return heads, dims


__all__ = ["FULL", "SLIDING", "STATE_TYPES", "cache_config_for"]
