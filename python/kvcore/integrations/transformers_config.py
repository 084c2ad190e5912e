"""What kvcore reads of a transformers model config: its layer types and their kvcore config.

Shared by the transformers cache (``kvcore.integrations.transformers``) and continuous
batching (``kvcore.integrations.transformers_batch``), below both (neither imports the other for it).
Needs ``transformers`` (it reads the config object through transformers' own helpers); a
config.json read without transformers is ``kvcore.hf_config``'s, and both plan each kind of
layer with the one mapping ``kvcore.hf_config.layer_config``. Was
``kvcore.integrations.hf_layers`` (deprecated, removed in 0.2.0).
"""

from __future__ import annotations

from typing import Any, Optional

from transformers import cache_utils

from kvcore._core import CacheConfig, LayerConfig, LayerPolicy
from kvcore._errors import InvalidArgumentError, NotSupportedError
from kvcore.hf_config import CHUNKED, FULL, HYBRID, SLIDING, default_state_slots, layer_config
from kvcore.hf_config.families import STATE_TYPES

# transformers' cache type of a layer that holds no cache (a KV-shared layer, or one without attention).
DUMMY = "dummy"
# The layer type names (FULL, SLIDING, CHUNKED; STATE_TYPES: transformers' recurrent-state layers,
# gated DeltaNet and Mamba "linear_attention", LFM2's short convolutions "conv", planned State(D);
# HYBRID: Falcon-H1's attention and Mamba-2 side by side, planned as Flat() at its index and a
# State(D) appended after the model's layers, hybrid_state_layers) are kvcore.hf_config's.


def hybrid_state_layers(config: Any) -> dict[int, int]:
    """For each ``hybrid`` layer of ``config`` (transformers' layer types), the index of the
    State layer ``cache_config_for`` appends for its recurrent part: ``n_layers + k`` for the
    k-th hybrid layer. Empty for a model without hybrid layers."""
    types, _ = cache_utils.get_layer_types_and_kwargs(config.get_text_config(decoder=True))
    hybrids = [i for i, kind in enumerate(types) if kind == HYBRID]
    return {i: len(types) + k for k, i in enumerate(hybrids)}


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
    ``max_position_embeddings``; ``sinks`` applies to every sliding layer.
    ``full_attention`` layers become ``Flat()``, ``sliding_attention`` ``Ring(sliding_window,
    sinks)``, ``chunked_attention`` (Llama 4) ``Chunked(attention_chunk_size)``, a
    KV-shared layer (Gemma 3n's ``kv_sharing_modes`` "reuse", transformers' "dummy" cache
    layer) ``Shared(source)``, ``source`` the layer of its attention type that stores K/V
    for it ("store"; its reported type is its attention type, what keys the model's masks), a
    layer without attention or state (transformers' "dummy" for "mlp" / "moe" layers,
    Nemotron-H's) a never-written ``Flat()`` placeholder of one head of one element that keeps
    the layer indices aligned (its type stays "dummy"), and a recurrent-state layer
    (``STATE_TYPES``) ``State(state_slots)``, by default
    ``kvcore.hf_config.default_state_slots(max_step)`` slots (room for a verify step of up to
    8 tokens). A ``hybrid`` layer (Falcon-H1: full attention and Mamba-2 side by side) is a
    ``Flat()`` layer at its index (type ``full_attention``) plus a ``State(state_slots)`` layer
    appended after the model's layers (type ``linear_attention``; ``hybrid_state_layers``).
    Raises NotSupportedError naming the layer for any other layer type,
    bidirectional attention, or two layers of one type that read differently;
    InvalidArgumentError for a missing capacity, ``state_slots < 1`` or negative sinks.
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
    types = list(layer_types)
    hybrids = 0
    for i, (kind, kwargs) in enumerate(zip(layer_types, layer_kwargs)):
        window: Optional[int] = None
        chunk: Optional[int] = None
        source: Optional[int] = None
        if kind == FULL:
            planned = "full"
        elif kind == HYBRID:  # its attention here, its state after the model's layers
            planned, types[i] = "full", FULL
            hybrids += 1
        elif kind == SLIDING:
            planned, window = "sliding", int(kwargs["sliding_window"])
        elif kind == CHUNKED:  # transformers passes attention_chunk_size as the layer's sliding_window
            planned, chunk = "chunked", int(kwargs["sliding_window"])
        elif kind == DUMMY and _sharing_mode(text, i) == "reuse":
            types[i], source = _shared_source(text, i)
            planned = "shared"
        elif kind == DUMMY:  # no attention, no state (an MLP or MoE layer): the model never calls the cache
            planned = "empty"
        elif kind in STATE_TYPES:
            planned = "state"
        else:
            raise NotSupportedError(
                f"layer {i} is {kind!r}: kvcore's transformers cache supports {FULL!r}, {SLIDING!r}, {CHUNKED!r}, "
                f"KV-shared, recurrent-state ({', '.join(map(repr, STATE_TYPES))}) and {HYBRID!r} layers"
            )
        # The one kind -> policy mapping, config.json's path's too (kvcore.hf_config.policies).
        layers.append(layer_config(planned, heads[i], dims[i], window=window, chunk=chunk, source=source,
                                   sinks=sinks, state_slots=state_slots))  # fmt: skip
    layers += [layer_config("state", state_slots=state_slots) for _ in range(hybrids)]
    types += ["linear_attention"] * hybrids
    _check_one_policy_per_type(types, layers)
    cfg = CacheConfig(capacity, layers, max_step=max_step, initial_capacity=initial_capacity)
    return cfg, types


def _sharing_mode(text: Any, layer: int) -> Any:
    """Gemma 3n's ``kv_sharing_modes[layer]`` ("reuse": reads another layer's K/V; "store": its
    K/V are read by such layers; None), None for a config without KV sharing."""
    modes = getattr(text, "kv_sharing_modes", None)
    return None if modes is None else modes[layer]


def _shared_source(text: Any, layer: int) -> tuple[str, int]:
    """A KV-shared layer's attention type and source: the layer of that type whose K/V the model
    stores for it (``kv_sharing_modes`` "store"; Gemma3nTextAttention reads
    ``shared_kv_states[layer_type]``). NotSupportedError when no layer stores them."""
    kind = text.layer_types[layer]
    stores = [j for j in range(layer) if text.layer_types[j] == kind and _sharing_mode(text, j) == "store"]
    if not stores:
        raise NotSupportedError(
            f"layer {layer} reuses the K/V of an earlier {kind!r} layer, and no earlier layer of that type "
            f"stores them (kv_sharing_modes): kvcore's transformers cache needs the source layer in the model"
        )
    return kind, stores[-1]


def _check_one_policy_per_type(layer_types: list[str], layers: list[LayerConfig]) -> None:
    # transformers builds one mask per layer type (from the first layer of that type), so
    # every layer of a type must read the same keys: one policy per type (a shared layer
    # reads its source's keys, so its source's policy counts).
    def reads(i: int) -> LayerPolicy:
        p = layers[i].policy
        return layers[p.source].policy if p.kind == LayerPolicy.Kind.Shared else p

    first: dict[str, int] = {}
    for i, kind in enumerate(layer_types):
        j = first.setdefault(kind, i)
        if reads(i) != reads(j):
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


__all__ = ["CHUNKED", "FULL", "HYBRID", "SLIDING", "STATE_TYPES", "cache_config_for", "hybrid_state_layers"]
