"""Each kind of layer as kvcore plans it: the one mapping from a layer's kind to its ``LayerConfig``.

Both config paths use it: ``ModelShape.cache_config`` (a config.json read by
``model_shape_from_hf``) and ``kvcore.integrations.transformers_config.cache_config_for`` (a
transformers config object), so the memory planner and the transformers cache plan the
same layers. The kinds are ``ModelShape.layer_kind``'s: "full" -> ``Flat()``, "sliding" ->
``Ring(window, sinks)``, "chunked" -> ``Chunked(chunk)``, "shared" -> ``Shared(source)``,
"state" -> ``State(state_slots)`` (no K/V rows) and "empty" (no attention, no state) -> a
never-written ``Flat()`` placeholder of one head of one element that keeps the layer
indices aligned. The state slots by default are ``default_state_slots(max_step)``.
"""

from __future__ import annotations

from typing import Optional

from kvcore._core import Chunked, Flat, LayerConfig, LayerPolicy, Ring, Shared, State
from kvcore._errors import InvalidArgumentError
from kvcore.hf_config.fields import check_int

#: The kinds of layer ``layer_config`` plans (``ModelShape.layer_kind``'s names).
LAYER_KINDS = ("full", "sliding", "chunked", "shared", "state", "empty")

#: Verify-step tokens the default state slots allow: D = min(max_step, 8) + 1 (see default_state_slots).
DEFAULT_VERIFY_TOKENS = 8


def default_state_slots(max_step: int) -> int:
    """State slots D by default: min(max_step, DEFAULT_VERIFY_TOKENS) + 1, room for a verify step of
    up to 8 tokens (a verify step of T tokens needs T <= D - 1). Pass D = max_step + 1 to let
    every step be a verify step, or 1 when nothing is ever rewound."""
    check_int("max_step", max_step, minimum=1)
    return min(max_step, DEFAULT_VERIFY_TOKENS) + 1


def layer_config(
    kind: str,
    n_kv_heads: int = 1,
    head_dim: int = 1,
    v_head_dim: int = 0,
    *,
    window: Optional[int] = None,
    chunk: Optional[int] = None,
    source: Optional[int] = None,
    sinks: int = 0,
    state_slots: int = DEFAULT_VERIFY_TOKENS + 1,
    all_flat: bool = False,
) -> LayerConfig:
    """The kvcore ``LayerConfig`` of one layer of ``kind`` (one of ``LAYER_KINDS``; see the module
    docstring): K/V rows of ``n_kv_heads`` x ``head_dim`` (V: ``v_head_dim``, 0 for ``head_dim``)
    for the attention kinds, ``window`` for "sliding", ``chunk`` for "chunked", ``source`` for
    "shared", ``state_slots`` for "state". ``all_flat`` plans "sliding" and "chunked" layers
    ``Flat()`` (the baseline that ignores windows and chunks). InvalidArgumentError for another
    kind or a kind's missing argument."""
    if kind == "state":
        return LayerConfig(State(state_slots))
    if kind == "empty":  # nothing cached: a placeholder at its index, never written
        return LayerConfig(Flat(), 1, 1)
    policy: LayerPolicy
    if kind == "full" or (all_flat and kind in ("sliding", "chunked")):
        policy = Flat()
    elif kind == "sliding" and window is not None:
        policy = Ring(window, sinks)
    elif kind == "chunked" and chunk is not None:
        policy = Chunked(chunk)
    elif kind == "shared" and source is not None:
        policy = Shared(source)
    elif kind in LAYER_KINDS:
        needed = {"sliding": "window", "chunked": "chunk"}.get(kind, "source")
        raise InvalidArgumentError(f"a {kind!r} layer needs its {needed}")
    else:
        raise InvalidArgumentError(f"layer kind {kind!r}: must be one of {', '.join(map(repr, LAYER_KINDS))}")
    return LayerConfig(policy, n_kv_heads, head_dim, v_head_dim)


__all__ = ["DEFAULT_VERIFY_TOKENS", "LAYER_KINDS", "default_state_slots", "layer_config"]
