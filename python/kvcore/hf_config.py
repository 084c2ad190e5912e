"""Read a Hugging Face ``config.json`` into the facts that size a KV cache.

The loader follows what transformers itself builds from the same file: the
family's config class fills fields the file leaves out, and the family's layer
pattern decides which layers slide (``layer_types`` when the file has it).
Anything kvcore cannot model, or that contradicts itself, is an error naming the
field; nothing is guessed. See docs/memory.md for the rules, field by field.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from kvcore._core import CacheConfig, Flat, LayerConfig, Ring
from kvcore._errors import InvalidArgumentError, NotSupportedError

#: The largest context kvcore can plan: positions are 32-bit signed ints.
MAX_CONTEXT = 2**31 - 1

HFSource = Union[Mapping[str, Any], str, "os.PathLike[str]"]

SLIDING = "sliding_attention"
FULL = "full_attention"


@dataclass(frozen=True)
class ModelShape:
    """What a model's config says about its KV cache.

    ``windows[i]`` is layer i's sliding window (keys a query sees, counting
    itself), or None for a full-attention layer.
    """

    name: str
    model_type: str
    n_kv_heads: int
    head_dim: int
    windows: tuple[Optional[int], ...]
    v_head_dim: int = 0  # 0: V rows are head_dim wide, like K rows
    max_position_embeddings: Optional[int] = None
    defaults: tuple[str, ...] = field(default=())  # "field=value (source)" the file left out

    @property
    def n_layers(self) -> int:
        return len(self.windows)

    @property
    def value_dim(self) -> int:
        return self.v_head_dim or self.head_dim

    def cache_config(
        self,
        context: int,
        *,
        max_step: Optional[int] = None,
        sinks: int = 0,
        all_flat: bool = False,
    ) -> CacheConfig:
        """The CacheConfig of this model for ``context`` positions.

        Sliding layers become Ring(window, sinks), full layers Flat();
        ``all_flat`` makes every layer Flat (the baseline that ignores windows).
        """
        _check_int("context", context, minimum=1)
        if context > MAX_CONTEXT:
            raise InvalidArgumentError(
                f"context = {context}: must be <= {MAX_CONTEXT} (kvcore positions are 32-bit signed ints)"
            )
        if max_step is not None:
            _check_int("max_step", max_step, minimum=1)
            if max_step > context:
                raise InvalidArgumentError(
                    f"max_step = {max_step}: must be <= context = {context} "
                    "(one step cannot hold more tokens than the cache)"
                )
        _check_int("sinks", sinks, minimum=0)
        layers = []
        for window in self.windows:
            policy = Flat() if window is None or all_flat else Ring(window, sinks)
            layers.append(LayerConfig(policy, self.n_kv_heads, self.head_dim, self.v_head_dim))
        return CacheConfig(context, layers, max_step=max_step)


@dataclass(frozen=True)
class _Family:
    """How transformers' config class for one model_type reads a config.json."""

    source: str
    defaults: Mapping[str, Any]
    # "none": no sliding layers; "all": every layer slides (Mistral);
    # "every": every `every`-th layer (1-based) is full, the rest slide;
    # "qwen2": layers >= max_window_layers slide when use_sliding_window is true.
    pattern: str
    every: int = 0
    every_field: Optional[str] = None  # the field that may override `every`
    derived_head_dim: bool = False  # head_dim is always hidden_size // num_attention_heads


# Defaults and patterns from the transformers config classes named in `source`
# (src/transformers/models/<family>/configuration_<family>.py).
_FAMILIES: dict[str, _Family] = {
    "llama": _Family(
        "transformers LlamaConfig",
        {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
         "max_position_embeddings": 2048},
        pattern="none",
    ),
    "mistral": _Family(
        "transformers MistralConfig",
        {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
         "num_key_value_heads": 8, "max_position_embeddings": 4096 * 32, "sliding_window": 4096},
        pattern="all",
    ),
    "qwen2": _Family(
        "transformers Qwen2Config",
        {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
         "num_key_value_heads": 32, "max_position_embeddings": 32768, "use_sliding_window": False,
         "sliding_window": 4096, "max_window_layers": 28},
        pattern="qwen2",
    ),
    "gemma2": _Family(
        "transformers Gemma2Config",
        {"hidden_size": 2304, "num_hidden_layers": 26, "num_attention_heads": 8,
         "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 8192,
         "sliding_window": 4096},
        pattern="every", every=2,
    ),
    "gemma3_text": _Family(
        "transformers Gemma3TextConfig",
        {"hidden_size": 2304, "num_hidden_layers": 26, "num_attention_heads": 8,
         "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 131072,
         "sliding_window": 4096},
        pattern="every", every=6, every_field="sliding_window_pattern",
    ),
    "cohere2": _Family(
        "transformers Cohere2Config",
        {"hidden_size": 8192, "num_hidden_layers": 40, "num_attention_heads": 64,
         "max_position_embeddings": 8192, "sliding_window": 4096},
        pattern="every", every=4, every_field="sliding_window_pattern", derived_head_dim=True,
    ),
    "gpt_oss": _Family(
        "transformers GptOssConfig",
        {"hidden_size": 2880, "num_hidden_layers": 36, "num_attention_heads": 64,
         "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 131072,
         "sliding_window": 128},
        pattern="every", every=2,
    ),
}

# A multimodal config keeps the language model under text_config.
_TEXT_MODEL_TYPE = {"gemma3": "gemma3_text"}

# Fields that mean the KV cache is not per-layer K/V rows of one shape.
_UNSUPPORTED: dict[str, str] = {
    "kv_lora_rank": "multi-head latent attention caches a compressed latent, not per-head K/V rows",
    "num_kv_shared_layers": "layers that reuse another layer's K/V (Gemma 3n) are not modelled",
    "attention_chunk_size": "chunked attention (Llama 4) is not a sliding window",
    "global_head_dim": "full and sliding layers with different head sizes are not modelled",
    "num_global_key_value_heads": "full and sliding layers with different KV head counts are not modelled",
    "use_bidirectional_attention": "a bidirectional (non-causal) model keeps no decoding KV cache",
    # Hybrids: transformers gives these layers a recurrent state, not K/V rows.
    "mamba_d_state": "state-space (Mamba) layers keep a recurrent state, not K/V rows; hybrid models are not modelled",
    "block_types": "recurrent blocks (RecurrentGemma) keep a recurrent state, not K/V rows; hybrids are not modelled",
}

# per_layer_config (transformers' heterogeneous configs) fields that would give a
# layer its own K/V shape; per-layer sliding_window is read.
_PER_LAYER_KV_FIELDS = (
    "num_key_value_heads", "num_attention_heads", "head_dim", "v_head_dim", "hidden_size",
    "attention_chunk_size", "kv_lora_rank", "skip",
)  # fmt: skip


def load_hf_config(source: HFSource) -> dict[str, Any]:
    """The config dict from a mapping, a config.json path, or a model directory."""
    if isinstance(source, Mapping):
        return dict(source)
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise InvalidArgumentError(f"cannot read Hugging Face config {str(path)!r}: {e.strerror}") from e
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidArgumentError(
            f"{str(path)!r} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}"
        ) from e
    if not isinstance(data, dict):
        raise InvalidArgumentError(f"{str(path)!r}: a config.json must hold a JSON object, not {type(data).__name__}")
    return data


def model_shape_from_hf(source: HFSource, *, name: Optional[str] = None) -> ModelShape:
    """The KV-cache facts of a Hugging Face config (mapping, config.json path, or directory).

    Raises InvalidArgumentError naming the field for a missing, mistyped or
    contradictory field, and NotSupportedError for attention kvcore does not model.
    """
    raw = load_hf_config(source)
    cfg, model_type = _language_model(raw)
    for key, why in _UNSUPPORTED.items():
        if cfg.get(key) not in (None, 0):
            raise NotSupportedError(f"{key} = {cfg[key]!r}: {why}")
    r = _Reader(cfg, model_type)
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
    head_dim = _head_dim(r, n_heads)
    v_head_dim = _optional_int(cfg.get("v_head_dim"), "v_head_dim") or 0
    max_pos = r.optional_int("max_position_embeddings")
    windows = _per_layer_windows(cfg.get("per_layer_config"), _layer_windows(r, n_layers))
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
    )


def config_from_hf(
    source: HFSource,
    *,
    context: Optional[int] = None,
    max_step: Optional[int] = None,
    sinks: int = 0,
) -> CacheConfig:
    """A validated CacheConfig for a Hugging Face config.

    ``context`` (the cache capacity) defaults to the config's
    max_position_embeddings; ``max_step`` to kvcore's min(512, context);
    ``sinks`` attention sinks are kept by every sliding layer.
    """
    shape = model_shape_from_hf(source)
    return shape.cache_config(default_context(shape, context), max_step=max_step, sinks=sinks)


def default_context(shape: ModelShape, context: Optional[int]) -> int:
    """``context``, or the model's max_position_embeddings when it is None."""
    if context is not None:
        return context
    if shape.max_position_embeddings is None:
        raise InvalidArgumentError(
            f"context: not given, and {shape.name}'s config has no max_position_embeddings to default to"
        )
    return shape.max_position_embeddings


def _language_model(raw: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The dict that describes the language model, and its model_type."""
    model_type = raw.get("model_type")
    text = raw.get("text_config")
    if text is not None:
        if not isinstance(text, dict):
            raise InvalidArgumentError(f"text_config: must be an object, not {type(text).__name__}")
        for key in ("num_hidden_layers", "num_key_value_heads", "head_dim", "sliding_window", "layer_types"):
            if key in raw and key in text and raw[key] != text[key]:
                raise InvalidArgumentError(
                    f"{key}: the top level says {raw[key]!r}, text_config says {text[key]!r}"
                )
        if "num_hidden_layers" not in raw:
            inner = text.get("model_type")
            if inner is None and isinstance(model_type, str):
                inner = _TEXT_MODEL_TYPE.get(model_type)
            return text, _model_type(inner)
    return raw, _model_type(model_type)


def _model_type(value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidArgumentError(f"model_type = {value!r}: must be a string")
    return value


class _Reader:
    """Reads fields of one config, filling the family's defaults and noting each one used."""

    def __init__(self, cfg: dict[str, Any], model_type: str) -> None:
        self.cfg = cfg
        self.model_type = model_type
        self.family = _FAMILIES.get(model_type)
        self.defaults: list[str] = []

    def get(self, key: str) -> Any:
        if key in self.cfg:
            return self.cfg[key]
        if self.family is not None and key in self.family.defaults:
            return self.default(key, self.family.defaults[key])
        return None

    def default(self, key: str, value: Any) -> Any:
        assert self.family is not None
        self.defaults.append(f"{key}={value!r} ({self.family.source} default)")
        return value

    def optional_int(self, key: str, *, minimum: int = 1) -> Optional[int]:
        return _optional_int(self.get(key), key, minimum=minimum)

    def required_int(self, key: str) -> int:
        value = self.optional_int(key)
        if value is None:
            raise InvalidArgumentError(
                f"{key}: missing, and model_type {self.model_type or '(missing)'!r} "
                "has no default kvcore knows"
            )
        return value


def _head_dim(r: _Reader, n_heads: Optional[int]) -> int:
    family = r.family
    if family is not None and family.derived_head_dim:
        hidden = r.optional_int("hidden_size")
        if hidden is None or n_heads is None or hidden % n_heads != 0:
            raise InvalidArgumentError(
                f"hidden_size = {hidden}, num_attention_heads = {n_heads}: {family.source} derives "
                "head_dim = hidden_size // num_attention_heads, which needs both, evenly divisible"
            )
        given = _optional_int(r.cfg.get("head_dim"), "head_dim")
        if given is not None and given != hidden // n_heads:
            raise InvalidArgumentError(
                f"head_dim = {given}: contradicts hidden_size // num_attention_heads = "
                f"{hidden // n_heads}, which {family.source} always uses"
            )
        return hidden // n_heads
    given = r.optional_int("head_dim")
    if given is not None:
        return given
    hidden = r.optional_int("hidden_size")
    if hidden is None or n_heads is None or hidden % n_heads != 0:
        raise InvalidArgumentError(
            f"head_dim: missing, and hidden_size = {hidden} / num_attention_heads = {n_heads} "
            "cannot stand in for it (both needed, evenly divisible)"
        )
    return hidden // n_heads


def _layer_windows(r: _Reader, n_layers: int) -> tuple[Optional[int], ...]:
    """Per layer: its sliding window, or None for full attention."""
    family = r.family
    if family is not None and family.pattern == "none":
        window: Optional[int] = None  # the config class has no sliding window at all
    else:
        use_sliding = r.get("use_sliding_window")
        if use_sliding is not None and not isinstance(use_sliding, bool):
            raise InvalidArgumentError(f"use_sliding_window = {use_sliding!r}: must be true or false")
        # use_sliding_window = false: transformers drops the window; the field only records its size.
        window = None if use_sliding is False else r.optional_int("sliding_window")

    every = _optional_int(r.cfg.get("sliding_window_pattern"), "sliding_window_pattern")
    if every is not None and family is not None and family.pattern == "every" and family.every_field is None:
        if every != family.every:
            raise InvalidArgumentError(
                f"sliding_window_pattern = {every}: {family.source} always makes every "
                f"layer i with (i + 1) % {family.every} == 0 full"
            )

    kinds = r.cfg.get("layer_types")
    if kinds is not None:
        return _from_layer_types(kinds, window, every, n_layers)
    if window is None:
        return (None,) * n_layers
    if family is None:
        if every is not None:
            return _every(every, window, n_layers)
        if r.cfg.get("use_sliding_window") is True:
            return (window,) * n_layers
        raise InvalidArgumentError(
            f"sliding_window = {window}: model_type {r.model_type or '(missing)'!r} is not a family "
            "kvcore knows, so it cannot tell which layers slide; add layer_types (one "
            f"{SLIDING!r} or {FULL!r} per layer) or sliding_window_pattern"
        )
    if family.pattern == "all":
        return (window,) * n_layers
    if family.pattern == "qwen2":
        first = r.optional_int("max_window_layers", minimum=0)
        assert first is not None  # the family default supplies it
        return tuple(window if i >= first else None for i in range(n_layers))
    if every is None:
        every = family.every
        if family.every_field is not None:
            r.default(family.every_field, every)
    return _every(every, window, n_layers)


def _every(every: int, window: int, n_layers: int) -> tuple[Optional[int], ...]:
    # transformers: "sliding_attention" if (i + 1) % pattern else "full_attention".
    return tuple(None if (i + 1) % every == 0 else window for i in range(n_layers))


def _from_layer_types(
    kinds: Any, window: Optional[int], every: Optional[int], n_layers: int
) -> tuple[Optional[int], ...]:
    if not isinstance(kinds, Sequence) or isinstance(kinds, str):
        raise InvalidArgumentError(f"layer_types: must be a list of strings, not {type(kinds).__name__}")
    if len(kinds) != n_layers:
        raise InvalidArgumentError(
            f"layer_types has {len(kinds)} entries: must have one per layer, num_hidden_layers = {n_layers}"
        )
    out: list[Optional[int]] = []
    for i, kind in enumerate(kinds):
        if kind == FULL:
            out.append(None)
        elif kind == SLIDING:
            if window is None:
                raise InvalidArgumentError(
                    f"layer_types[{i}] = {SLIDING!r}: contradicts sliding_window, which is missing, "
                    "null or switched off by use_sliding_window = false"
                )
            out.append(window)
        else:
            raise NotSupportedError(
                f"layer_types[{i}] = {kind!r}: kvcore models only {FULL!r} and {SLIDING!r} layers"
            )
    if every is not None:
        expected = [None if (i + 1) % every == 0 else window for i in range(n_layers)]
        if out != expected:
            raise InvalidArgumentError(
                f"sliding_window_pattern = {every}: contradicts layer_types "
                f"(first difference at layer {next(i for i in range(n_layers) if out[i] != expected[i])})"
            )
    return tuple(out)


def _per_layer_windows(
    per_layer: Any, windows: tuple[Optional[int], ...]
) -> tuple[Optional[int], ...]:
    """Apply ``per_layer_config``: a sparse {layer index: overrides} map (transformers'
    heterogeneous configs). A sliding layer's ``sliding_window`` override is its
    window; an override of a K/V shape field is not modelled."""
    if per_layer is None:
        return windows
    if not isinstance(per_layer, Mapping):
        raise InvalidArgumentError(
            f"per_layer_config: must be an object mapping layer indices to overrides, not {type(per_layer).__name__}"
        )
    out = list(windows)
    for key, overrides in per_layer.items():
        try:
            i = int(key)
        except (TypeError, ValueError):
            i = -1
        if not 0 <= i < len(out) or isinstance(key, bool):
            raise InvalidArgumentError(
                f"per_layer_config key {key!r}: must be a layer index in [0, num_hidden_layers = {len(out)})"
            )
        if not isinstance(overrides, Mapping):
            raise InvalidArgumentError(f"per_layer_config[{key!r}]: must be an object, not {type(overrides).__name__}")
        for field_name in _PER_LAYER_KV_FIELDS:
            if field_name in overrides and (field_name != "skip" or overrides[field_name]):
                raise NotSupportedError(
                    f"per_layer_config[{key!r}].{field_name} = {overrides[field_name]!r}: layers with their own "
                    "K/V shape are not modelled"
                )
        if "sliding_window" in overrides and out[i] is not None:  # a full layer stays full, as in transformers
            window = _optional_int(overrides["sliding_window"], f"per_layer_config[{key!r}].sliding_window")
            if window is None:
                raise InvalidArgumentError(
                    f"per_layer_config[{key!r}].sliding_window = None: contradicts layer {i}, which slides"
                )
            out[i] = window
    return tuple(out)


def _check_int(name: str, value: Any, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{name} = {value!r}: must be an integer")
    if value < minimum:
        raise InvalidArgumentError(f"{name} = {value}: must be >= {minimum}")


def _optional_int(value: Any, name: str, *, minimum: int = 1) -> Optional[int]:
    if value is None:
        return None
    _check_int(name, value, minimum=minimum)
    return int(value)
