"""From a config.json to kvcore: ``model_shape_from_hf`` (the KV-cache facts) and ``config_from_hf``
(a validated ``CacheConfig``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Optional

from kvcore._core import CacheConfig
from kvcore._errors import InvalidArgumentError, NotSupportedError
from kvcore.hf_config.families import READS, UNSUPPORTED
from kvcore.hf_config.fields import optional_int, quoted_names
from kvcore.hf_config.layer_types import (
    has_special_layers,
    layer_windows,
    nemotron_h_types,
    per_layer_windows,
    special_layer_kinds,
)
from kvcore.hf_config.reading import HFSource, Reader, head_dim_of, language_model, load_hf_config
from kvcore.hf_config.shapes import ModelShape, SpecialLayer

def model_shape_from_hf(source: HFSource, *, name: Optional[str] = None) -> ModelShape:
    """The KV-cache facts of a Hugging Face config (mapping, config.json path, or directory):
    per layer its kind (full, sliding, chunked, KV-shared, recurrent state with its StateShape
    in elements, or empty), K/V heads and head sizes, and the family defaults it used.

    Raises InvalidArgumentError naming the field for a missing, mistyped or
    contradictory field, and NotSupportedError for attention kvcore does not model
    (including a recurrent or hybrid layer of a model_type whose state formula it lacks).
    """
    raw = load_hf_config(source)
    cfg, model_type = language_model(raw)
    for key, why in UNSUPPORTED.items():
        if cfg.get(key) not in (None, 0) and key not in READS.get(model_type, ()):
            readers = sorted(mt for mt, keys in READS.items() if key in keys)
            if readers:
                why += (f"; kvcore reads it for model_type {quoted_names(readers)} only, not "
                        f"{model_type or '(missing)'!r}")
            raise NotSupportedError(f"{key} = {cfg[key]!r:.80}: {why}")
    r = Reader(cfg, model_type)
    if model_type == "nemotron_h":  # NemotronHConfig: as many layers as its layer list has
        n_layers = len(nemotron_h_types(r))
    else:
        n_layers = r.required_int("num_hidden_layers")
    n_heads = r.optional_int("num_attention_heads")
    n_kv_heads = r.optional_int("num_key_value_heads")
    if n_kv_heads is None:
        # Every transformers config class: num_key_value_heads=None means multi-head attention.
        if n_heads is None:
            raise InvalidArgumentError(
                "num_key_value_heads: missing, and so is num_attention_heads it would default to"
            )
        n_kv_heads = n_heads
        r.defaults.append(f"num_key_value_heads={n_heads} (= num_attention_heads)")
    if n_heads is not None and n_heads % n_kv_heads != 0:
        raise InvalidArgumentError(
            f"num_key_value_heads = {n_kv_heads}: must divide num_attention_heads = {n_heads} "
            "(each KV head serves a whole group of query heads)"
        )
    head_dim = head_dim_of(r, n_heads)
    v_head_dim = optional_int(cfg.get("v_head_dim"), "v_head_dim") or 0
    max_pos = r.optional_int("max_position_embeddings")
    special: tuple[Optional[SpecialLayer], ...] = ()
    notes: tuple[str, ...] = ()
    if has_special_layers(r):
        windows, special = special_layer_kinds(r, n_layers)
        if len(windows) > n_layers:  # "hybrid" layers: their states appended after the model's layers
            hybrid = len(windows) - n_layers
            notes = (f"Falcon-H1 (model_type {model_type!r}) runs full attention and a Mamba-2 mixer side by side "
                     f"in each of its {hybrid} 'hybrid' layers: kvcore counts them as {n_layers} attention layers "
                     f"(0-{n_layers - 1}) and {hybrid} state layers ({n_layers}-{n_layers + hybrid - 1}) appended "
                     f"after them, {n_layers + hybrid} layers in all, as its transformers cache holds them",)
    else:
        windows = layer_windows(r, n_layers)
    windows = per_layer_windows(cfg.get("per_layer_config"), windows)
    label = name or raw.get("_name_or_path") or (None if isinstance(source, Mapping) else str(source))
    return ModelShape(
        name=str(label or model_type or "model"),
        model_type=model_type,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        windows=windows,
        v_head_dim=v_head_dim,
        max_position_embeddings=max_pos,
        defaults=tuple(r.defaults),
        special=special,
        notes=notes,
    )


def config_from_hf(
    source: HFSource,
    *,
    context: Optional[int] = None,
    max_step: Optional[int] = None,
    sinks: int = 0,
    state_slots: Optional[int] = None,
) -> CacheConfig:
    """A validated CacheConfig for a Hugging Face config.

    ``context`` (the cache capacity) defaults to the config's
    max_position_embeddings; ``max_step`` to kvcore's min(512, context);
    ``sinks`` attention sinks are kept by every sliding layer; ``state_slots``
    (D, default default_state_slots(max_step)) by every recurrent-state layer.
    Chunked layers become Chunked(chunk), KV-shared layers Shared(source).
    Errors as model_shape_from_hf and ModelShape.cache_config.
    """
    shape = model_shape_from_hf(source)
    return shape.cache_config(default_context(shape, context), max_step=max_step, sinks=sinks,
                              state_slots=state_slots)


def default_context(shape: ModelShape, context: Optional[int]) -> int:
    """``context``, or the model's max_position_embeddings when it is None."""
    if context is not None:
        return context
    if shape.max_position_embeddings is None:
        raise InvalidArgumentError(
            f"context: not given, and {shape.name}'s config has no max_position_embeddings to default to"
        )
    return shape.max_position_embeddings


__all__ = ["config_from_hf", "default_context", "model_shape_from_hf"]
