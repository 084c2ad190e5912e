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

from kvcore._core import CacheConfig, Chunked, Flat, LayerConfig, Ring, Shared, State
from kvcore._errors import InvalidArgumentError, NotSupportedError

#: The largest context kvcore can plan: positions are 32-bit signed ints.
MAX_CONTEXT = 2**31 - 1

HFSource = Union[Mapping[str, Any], str, "os.PathLike[str]"]

SLIDING = "sliding_attention"
FULL = "full_attention"
CHUNKED = "chunked_attention"
#: transformers' layer type of a layer running full attention and a Mamba-2 mixer side by side (Falcon-H1).
HYBRID = "hybrid"

#: Verify-step tokens the default state slots allow: D = min(max_step, 8) + 1 (see default_state_slots).
DEFAULT_VERIFY_TOKENS = 8


@dataclass(frozen=True)
class ChunkedLayer:
    """A chunked-attention layer (Llama 4): a query sees the keys of its own ``chunk``-token chunk."""

    chunk: int


@dataclass(frozen=True)
class SharedLayer:
    """A layer that reads layer ``source``'s K/V (Gemma 3n's KV-shared layers) and holds none."""

    source: int


@dataclass(frozen=True)
class StateShape:
    """One recurrent layer's state for one sequence: what one snapshot (one state slot) holds.

    ``conv_channels`` x ``conv_width`` elements of convolution window, kept in the
    activation dtype; ``recurrent_elements`` elements of recurrent (SSM / DeltaNet)
    matrix, kept in float32 (``recurrent_dtype_bytes``). ``formula`` says where the
    shape comes from (docs/memory.md, "Recurrent state").
    """

    kind: str  # "gated_deltanet", "mamba2", "mamba" (Mamba-1) or "short_conv"
    conv_channels: int
    conv_width: int
    recurrent_elements: int = 0
    recurrent_dtype_bytes: int = 4
    formula: str = ""

    @property
    def conv_elements(self) -> int:
        """Elements of the convolution window."""
        return self.conv_channels * self.conv_width

    def conv_bytes(self, dtype_size: int) -> int:
        """Bytes of the convolution window at ``dtype_size`` bytes per element."""
        return self.conv_elements * dtype_size

    @property
    def recurrent_bytes(self) -> int:
        """Bytes of the recurrent matrix (float32 unless recurrent_dtype_bytes says otherwise)."""
        return self.recurrent_elements * self.recurrent_dtype_bytes

    def snapshot_bytes(self, dtype_size: int) -> int:
        """Bytes of one state snapshot (one slot), the conv part at ``dtype_size`` bytes per element."""
        return self.conv_bytes(dtype_size) + self.recurrent_bytes


@dataclass(frozen=True)
class EmptyLayer:
    """A layer without attention or recurrent state: it caches nothing (Nemotron-H's "-" MLP and "E"
    MoE layers; transformers' "dummy" cache layer for layer type "mlp" or "moe")."""

    block: str  # "mlp" or "moe"


#: A layer that is neither full nor sliding: its kind and what it needs.
SpecialLayer = Union[ChunkedLayer, SharedLayer, StateShape, EmptyLayer]


def default_state_slots(max_step: int) -> int:
    """State slots D by default: min(max_step, DEFAULT_VERIFY_TOKENS) + 1, room for a verify step of
    up to 8 tokens (a verify step of T tokens needs T <= D - 1). Pass D = max_step + 1 to let
    every step be a verify step, or 1 when nothing is ever rewound."""
    _check_int("max_step", max_step, minimum=1)
    return min(max_step, DEFAULT_VERIFY_TOKENS) + 1


@dataclass(frozen=True)
class ModelShape:
    """What a model's config says about its KV cache.

    ``windows[i]`` is layer i's sliding window (keys a query sees, counting
    itself), or None for a full-attention layer. ``special[i]`` (empty when the
    model has none) is a ChunkedLayer, SharedLayer, StateShape or EmptyLayer for
    a layer of another kind (its window is None), else None. A model whose layers
    run attention and a recurrent mixer side by side (Falcon-H1's "hybrid" layers)
    has two planned layers per model layer: n attention layers, then n state
    layers appended after them (as kvcore's transformers cache holds them);
    ``notes`` says so.
    """

    name: str
    model_type: str
    n_kv_heads: int
    head_dim: int
    windows: tuple[Optional[int], ...]
    v_head_dim: int = 0  # 0: V rows are head_dim wide, like K rows
    max_position_embeddings: Optional[int] = None
    defaults: tuple[str, ...] = field(default=())  # "field=value (source)" the file left out
    special: tuple[Optional[SpecialLayer], ...] = field(default=())
    notes: tuple[str, ...] = field(default=())  # how the layers were counted, for the memory report

    def __post_init__(self) -> None:
        if self.special and len(self.special) != len(self.windows):
            raise InvalidArgumentError(
                f"special has {len(self.special)} entries: must be empty or one per layer ({len(self.windows)})"
            )
        for i, other in enumerate(self.special):
            if other is not None and self.windows[i] is not None:
                raise InvalidArgumentError(f"layer {i}: sliding (window {self.windows[i]}) and {other}")

    @property
    def n_layers(self) -> int:
        return len(self.windows)

    def layer_kind(self, layer: int) -> str:
        """"sliding", "full", "chunked", "shared", "state" or "empty" (no attention, no state: it
        caches nothing): what ``layer`` is."""
        other = self.special[layer] if self.special else None
        if isinstance(other, ChunkedLayer):
            return "chunked"
        if isinstance(other, SharedLayer):
            return "shared"
        if isinstance(other, StateShape):
            return "state"
        if isinstance(other, EmptyLayer):
            return "empty"
        return "full" if self.windows[layer] is None else "sliding"

    @property
    def has_state(self) -> bool:
        """True when some layer keeps a recurrent state."""
        return any(isinstance(o, StateShape) for o in self.special)

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
        state_slots: Optional[int] = None,
    ) -> CacheConfig:
        """The CacheConfig of this model for ``context`` positions.

        Sliding layers become Ring(window, sinks), full layers Flat(), chunked
        layers Chunked(chunk), KV-shared layers Shared(source), recurrent
        layers State(state_slots) (default: default_state_slots(max_step)), and
        empty layers (EmptyLayer) a never-written Flat() placeholder of one head
        of one element that keeps the layer indices aligned, as kvcore's
        transformers cache builds it (the memory planner counts it 0 bytes).
        ``all_flat`` makes every sliding and chunked layer Flat (the baseline that
        ignores windows and chunks); shared, state and empty layers stay as they are.
        InvalidArgumentError names a bad argument.
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
        if state_slots is not None:
            _check_int("state_slots", state_slots, minimum=1)
        if not self.special:
            layers = []
            for window in self.windows:
                policy = Flat() if window is None or all_flat else Ring(window, sinks)
                layers.append(LayerConfig(policy, self.n_kv_heads, self.head_dim, self.v_head_dim))
            return CacheConfig(context, layers, max_step=max_step)
        return CacheConfig(context, self._special_layers(context, max_step, sinks, all_flat, state_slots),
                           max_step=max_step)

    def _special_layers(self, context: int, max_step: Optional[int], sinks: int, all_flat: bool,
                        state_slots: Optional[int]) -> list[LayerConfig]:
        """LayerConfigs of a model with chunked, shared, state or empty layers."""
        if state_slots is None:
            state_slots = default_state_slots(max_step if max_step is not None else min(512, context))
        layers = []
        for window, other in zip(self.windows, self.special):
            if isinstance(other, StateShape):
                layers.append(LayerConfig(State(state_slots)))
                continue
            if isinstance(other, EmptyLayer):  # nothing cached: a placeholder at its index, never written
                layers.append(LayerConfig(Flat(), 1, 1))
                continue
            if isinstance(other, SharedLayer):
                policy = Shared(other.source)
            elif isinstance(other, ChunkedLayer):
                policy = Flat() if all_flat else Chunked(other.chunk)
            else:
                policy = Flat() if window is None or all_flat else Ring(window, sinks)
            layers.append(LayerConfig(policy, self.n_kv_heads, self.head_dim, self.v_head_dim))
        return layers


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

# Families with chunked, KV-shared or recurrent-state layers (section 9 of docs/design.md). Their
# layer kinds come from layer_types when the file has it, else from the rule in _family_layer_types;
# defaults from the transformers 5.24 config classes named here.
_FAMILIES.update({
    "llama4_text": _Family(
        "transformers Llama4TextConfig",
        {"hidden_size": 5120, "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8,
         "head_dim": 128, "max_position_embeddings": 131072, "attention_chunk_size": 8192,
         "no_rope_layer_interval": 4},
        pattern="kinds",
    ),
    "gemma3n_text": _Family(
        "transformers Gemma3nTextConfig",
        {"hidden_size": 2048, "num_hidden_layers": 35, "num_attention_heads": 8, "num_key_value_heads": 2,
         "head_dim": 256, "max_position_embeddings": 32768, "sliding_window": 512, "num_kv_shared_layers": 15},
        pattern="kinds",
    ),
    "qwen3_next": _Family(
        "transformers Qwen3NextConfig",
        {"hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2,
         "head_dim": 256, "max_position_embeddings": 32768, "linear_conv_kernel_dim": 4,
         "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16,
         "linear_num_value_heads": 32, "full_attention_interval": 4},
        pattern="kinds",
    ),
    "lfm2": _Family(
        "transformers Lfm2Config",
        {"hidden_size": 2560, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
         "max_position_embeddings": 128000, "conv_L_cache": 3},
        pattern="kinds",
    ),
    "granitemoehybrid": _Family(
        "transformers GraniteMoeHybridConfig",
        {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "max_position_embeddings": 2048,
         "mamba_n_heads": 128, "mamba_n_groups": 1, "mamba_d_state": 256, "mamba_d_head": "auto",
         "mamba_d_conv": 4, "mamba_expand": 2},
        pattern="kinds",
    ),
    "qwen3_5_text": _Family(
        "transformers Qwen3_5TextConfig",
        {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 16, "num_key_value_heads": 4,
         "head_dim": 256, "max_position_embeddings": 32768, "linear_conv_kernel_dim": 4,
         "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16,
         "linear_num_value_heads": 32, "full_attention_interval": 4},
        pattern="kinds",
    ),
    "bamba": _Family(
        "transformers BambaConfig",
        {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
         "max_position_embeddings": 262144, "mamba_n_heads": 128, "mamba_d_head": "auto", "mamba_n_groups": 1,
         "mamba_d_state": 256, "mamba_d_conv": 4, "mamba_expand": 2},
        pattern="kinds",
    ),
    "jamba": _Family(
        "transformers JambaConfig",
        {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
         "max_position_embeddings": 262144, "attn_layer_period": 8, "attn_layer_offset": 4, "mamba_d_state": 16,
         "mamba_d_conv": 4, "mamba_expand": 2},
        pattern="kinds",
    ),
    # Every layer "hybrid" (FalconH1Config.layers_block_type): attention and Mamba-2 side by side. head_dim
    # has no default: FalconH1Attention takes hidden_size // num_attention_heads when the file has none.
    "falcon_h1": _Family(
        "transformers FalconH1Config",
        {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
         "max_position_embeddings": 8192, "mamba_d_ssm": 1024, "mamba_n_heads": 128, "mamba_d_head": "auto",
         "mamba_n_groups": 1, "mamba_d_state": 256, "mamba_d_conv": 4, "mamba_expand": 2},
        pattern="kinds",
    ),
    # num_hidden_layers: NemotronHConfig derives it from the layer list (_nemotron_h_types).
    "nemotron_h": _Family(
        "transformers NemotronHConfig",
        {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
         "max_position_embeddings": 4096, "ssm_state_size": 128, "mamba_num_heads": 128, "mamba_head_dim": 64,
         "n_groups": 8, "conv_kernel": 4},
        pattern="kinds",
    ),
})

# Fields of _UNSUPPORTED that a family's own layers explain (read in _family_layer_types and _state_shape).
_READS: dict[str, tuple[str, ...]] = {
    "granitemoehybrid": ("mamba_d_state", "layers_block_type"),
    "bamba": ("mamba_d_state", "layers_block_type"),
    "jamba": ("mamba_d_state", "layers_block_type"),
    "falcon_h1": ("mamba_d_state",),
    "nemotron_h": ("layers_block_type", "hybrid_override_pattern"),
}

# Where a family's config class takes layer_types from a field of another name (its attribute_map).
_LAYER_TYPES_ALIAS = {"granitemoehybrid": "layers_block_type", "nemotron_h": "layers_block_type"}

# transformers' legacy layer type names (configuration_utils._LEGACY_LAYER_TYPE_REMAP).
_LEGACY_LAYER_TYPES = {"mamba": "linear_attention", "attention": FULL}
_STATE_TYPES = ("linear_attention", "conv")
# Layer types without attention or state: transformers gives them a "dummy" cache layer
# (cache_utils.get_layer_types_and_kwargs), kvcore an EmptyLayer, in the families that are known
# to mean that by them (Dory's config.json, for one, lists "mlp" blocks that are halves of a layer).
_EMPTY_TYPES = ("mlp", "moe")
_EMPTY_FAMILIES = ("nemotron_h",)
# The families whose "hybrid" layers (attention and a recurrent mixer in one layer) kvcore plans: each as
# a full-attention layer at its index plus a state layer appended after the model's layers.
_HYBRID_FAMILIES = ("falcon_h1",)

# A multimodal config keeps the language model under text_config.
_TEXT_MODEL_TYPE = {"gemma3": "gemma3_text", "gemma3n": "gemma3n_text", "llama4": "llama4_text",
                    "qwen3_5": "qwen3_5_text"}

# Fields that mean the KV cache is not per-layer K/V rows of one shape.
_UNSUPPORTED: dict[str, str] = {
    "kv_lora_rank": "multi-head latent attention caches a compressed latent, not per-head K/V rows",
    "global_head_dim": "full and sliding layers with different head sizes are not modelled",
    "num_global_key_value_heads": "full and sliding layers with different KV head counts are not modelled",
    "use_bidirectional_attention": "a bidirectional (non-causal) model keeps no decoding KV cache",
    # Hybrids: transformers gives these layers a recurrent state, not K/V rows.
    "mamba_d_state": "state-space (Mamba) layers keep a recurrent state whose shape depends on the family's "
                     "modeling code",
    "layers_block_type": "a hybrid layer pattern (attention, Mamba, MLP-only layers) whose meaning depends on "
                         "the family's config class",
    "hybrid_override_pattern": "a hybrid layer pattern (attention, Mamba, MLP-only layers) whose meaning depends "
                               "on the family's config class",
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
    """The KV-cache facts of a Hugging Face config (mapping, config.json path, or directory):
    per layer its kind (full, sliding, chunked, KV-shared, recurrent state with its StateShape
    in elements, or empty), K/V heads and head sizes, and the family defaults it used.

    Raises InvalidArgumentError naming the field for a missing, mistyped or
    contradictory field, and NotSupportedError for attention kvcore does not model
    (including a recurrent or hybrid layer of a model_type whose state formula it lacks).
    """
    raw = load_hf_config(source)
    cfg, model_type = _language_model(raw)
    for key, why in _UNSUPPORTED.items():
        if cfg.get(key) not in (None, 0) and key not in _READS.get(model_type, ()):
            readers = sorted(mt for mt, keys in _READS.items() if key in keys)
            if readers:
                why += (f"; kvcore reads it for model_type {_names(readers)} only, not "
                        f"{model_type or '(missing)'!r}")
            raise NotSupportedError(f"{key} = {cfg[key]!r:.80}: {why}")
    r = _Reader(cfg, model_type)
    if model_type == "nemotron_h":  # NemotronHConfig: as many layers as its layer list has
        n_layers = len(_nemotron_h_types(r))
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
    head_dim = _head_dim(r, n_heads)
    v_head_dim = _optional_int(cfg.get("v_head_dim"), "v_head_dim") or 0
    max_pos = r.optional_int("max_position_embeddings")
    special: tuple[Optional[SpecialLayer], ...] = ()
    notes: tuple[str, ...] = ()
    if _has_special_layers(r):
        windows, special = _special_layer_kinds(r, n_layers)
        if len(windows) > n_layers:  # "hybrid" layers: their states appended after the model's layers
            hybrid = len(windows) - n_layers
            notes = (f"Falcon-H1 (model_type {model_type!r}) runs full attention and a Mamba-2 mixer side by side "
                     f"in each of its {hybrid} 'hybrid' layers: kvcore counts them as {n_layers} attention layers "
                     f"(0-{n_layers - 1}) and {hybrid} state layers ({n_layers}-{n_layers + hybrid - 1}) appended "
                     f"after them, {n_layers + hybrid} layers in all, as its transformers cache holds them",)
    else:
        windows = _layer_windows(r, n_layers)
    windows = _per_layer_windows(cfg.get("per_layer_config"), windows)
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
        self.note(f"{key}={value!r} ({self.family.source} default)")
        return value

    def note(self, text: str) -> None:
        """Record a default the file left out, once however often it is read."""
        if text not in self.defaults:
            self.defaults.append(text)

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


def _has_special_layers(r: _Reader) -> bool:
    """True when the config has chunked, KV-shared or recurrent-state layers (or a layer kind
    other than full and sliding), which _special_layer_kinds reads."""
    family = r.family
    if family is not None and family.pattern == "kinds":
        return True
    if r.cfg.get("num_kv_shared_layers") not in (None, 0) or r.cfg.get("attention_chunk_size") is not None:
        return True
    kinds = r.cfg.get("layer_types")
    return isinstance(kinds, Sequence) and not isinstance(kinds, str) and any(k not in (FULL, SLIDING) for k in kinds)


def _special_layer_kinds(
    r: _Reader, n_layers: int
) -> tuple[tuple[Optional[int], ...], tuple[Optional[SpecialLayer], ...]]:
    """(windows, special) of a model with chunked, KV-shared, state or empty layers: per layer its
    sliding window (or None), and its ChunkedLayer / SharedLayer / StateShape / EmptyLayer (or None).
    A "hybrid" layer (Falcon-H1) is a full-attention layer at its index plus a state layer appended
    after the model's ``n_layers`` (index n_layers + k for the k-th), as kvcore's transformers cache
    (integrations.hf_layers.cache_config_for) builds it."""
    types = _family_layer_types(r, n_layers)
    windows: list[Optional[int]] = []
    special: list[Optional[SpecialLayer]] = []
    state: Optional[StateShape] = None
    hybrids = 0
    for i, kind in enumerate(types):
        window: Optional[int] = None
        other: Optional[SpecialLayer] = None
        if kind == SLIDING:
            window = r.optional_int("sliding_window")
            if window is None:
                raise InvalidArgumentError(f"layer_types[{i}] = {SLIDING!r}: contradicts sliding_window, which is missing")
        elif kind == CHUNKED:
            chunk = r.optional_int("attention_chunk_size")
            if chunk is None:
                raise InvalidArgumentError(
                    f"layer_types[{i}] = {CHUNKED!r}: contradicts attention_chunk_size, which is missing"
                )
            other = ChunkedLayer(chunk)
        elif kind in _STATE_TYPES:
            state = state or _state_shape(r, kind, i)
            other = state
        elif kind in _EMPTY_TYPES and r.model_type in _EMPTY_FAMILIES:
            other = EmptyLayer(kind)
        elif kind == HYBRID and r.model_type in _HYBRID_FAMILIES:
            state = state or _state_shape(r, kind, i)  # its attention here, its state appended below
            hybrids += 1
        elif kind != FULL:
            raise NotSupportedError(
                f"layer_types[{i}] = {kind!r}: kvcore models only {FULL!r}, {SLIDING!r}, {CHUNKED!r} and the "
                f"recurrent {' and '.join(repr(t) for t in _STATE_TYPES)} layers (and the "
                f"{' and '.join(repr(t) for t in _EMPTY_TYPES)} layers of model_type {_names(_EMPTY_FAMILIES)}, "
                f"which cache nothing, and the {HYBRID!r} layers of model_type {_names(_HYBRID_FAMILIES)})"
            )
        windows.append(window)
        special.append(other)
    shared = r.optional_int("num_kv_shared_layers", minimum=0) or 0
    if shared:
        _share_kv(types, special, windows, shared)
    windows += [None] * hybrids
    special += [state] * hybrids
    return tuple(windows), tuple(special)


def _family_layer_types(r: _Reader, n_layers: int) -> list[str]:
    """Each layer's transformers layer type (what cache_utils.get_layer_types_and_kwargs reads, before
    it renames "mlp" and "moe" to "dummy"): layer_types when the file has it, else the family's rule.
    Bamba and Jamba always derive theirs (their config classes cannot load a file that sets them),
    Nemotron-H reads layers_block_type or hybrid_override_pattern."""
    mt = r.model_type
    if mt in ("bamba", "jamba"):
        return _derived_hybrid_types(r, n_layers)
    if mt == "nemotron_h":
        return _nemotron_h_types(r)
    if mt == "falcon_h1":  # FalconH1Config.layers_block_type: every layer "hybrid", a read-only property
        if r.cfg.get("layer_types") is not None:
            raise InvalidArgumentError(
                f"layer_types = {r.cfg['layer_types']!r:.60}: transformers FalconH1Config makes every layer "
                f"{HYBRID!r} and cannot load a file that sets layer_types"
            )
        return [HYBRID] * n_layers
    kinds = _file_layer_types(r, n_layers)
    if kinds is not None:
        return kinds
    if mt == "llama4_text":  # Llama4TextConfig: layers with RoPE chunk, every no_rope_layer_interval-th is full
        chunk = r.optional_int("attention_chunk_size")
        rope = r.cfg.get("no_rope_layers")
        if not rope:
            every = r.optional_int("no_rope_layer_interval")
            assert every is not None  # the family default supplies it
            rope = [int((i + 1) % every != 0) for i in range(n_layers)]
        if not isinstance(rope, Sequence) or len(rope) != n_layers:
            raise InvalidArgumentError(f"no_rope_layers: must hold one 0 or 1 per layer ({n_layers})")
        return [CHUNKED if flag and chunk is not None else FULL for flag in rope]
    if mt == "gemma3n_text":  # Gemma3nTextConfig: every 5th layer full, the rest sliding
        return [FULL if (i + 1) % 5 == 0 else SLIDING for i in range(n_layers)]
    if mt in ("qwen3_next", "qwen3_5_text"):
        # Qwen3NextConfig, Qwen3_5TextConfig: every full_attention_interval-th layer full, the rest linear.
        every = r.optional_int("full_attention_interval")
        assert every is not None
        return ["linear_attention" if (i + 1) % every else FULL for i in range(n_layers)]
    if mt == "lfm2":  # Lfm2Config: full_attn_idxs are full (default: every layer), the rest short convs
        idxs = r.cfg.get("full_attn_idxs")
        if idxs is None:
            idxs = list(range(n_layers))
            r.note("full_attn_idxs=every layer (transformers Lfm2Config default)")
        if not isinstance(idxs, Sequence) or not all(isinstance(i, int) and 0 <= i < n_layers for i in idxs):
            raise InvalidArgumentError(f"full_attn_idxs = {idxs!r:.60}: must be a list of layer indices")
        return [FULL if i in idxs else "conv" for i in range(n_layers)]
    if mt == "granitemoehybrid":  # GraniteMoeHybridConfig: every layer Mamba-2 by default
        r.note("layer_types=every layer 'linear_attention' (transformers GraniteMoeHybridConfig default)")
        return ["linear_attention"] * n_layers
    if r.cfg.get("attention_chunk_size") is not None:
        raise InvalidArgumentError(
            f"attention_chunk_size = {r.cfg['attention_chunk_size']!r}: model_type {mt or '(missing)'!r} is not a "
            f"family kvcore knows, so it cannot tell which layers are chunked; add layer_types"
        )
    return [FULL if w is None else SLIDING for w in _layer_windows(r, n_layers)]


def _file_layer_types(r: _Reader, n_layers: Optional[int]) -> Optional[list[str]]:
    """The file's layer_types (or the family's alias of it, e.g. Nemotron-H's layers_block_type), legacy
    names ("mamba", "attention") renamed as transformers renames them; None when the file has none.
    InvalidArgumentError for a malformed list, one of the wrong length (``n_layers``, when given), or an
    alias that contradicts layer_types."""
    found: list[tuple[str, list[str]]] = []
    alias = _LAYER_TYPES_ALIAS.get(r.model_type)
    for key in ("layer_types", *((alias,) if alias else ())):
        kinds = r.cfg.get(key)
        if kinds is None:
            continue
        if not isinstance(kinds, Sequence) or isinstance(kinds, str) or not all(isinstance(k, str) for k in kinds):
            raise InvalidArgumentError(f"{key}: must be a list of strings, not {kinds!r:.60}")
        if n_layers is not None and len(kinds) != n_layers:
            raise InvalidArgumentError(
                f"{key} has {len(kinds)} entries: must have one per layer, num_hidden_layers = {n_layers}"
            )
        found.append((key, [str(_LEGACY_LAYER_TYPES.get(k, k)) for k in kinds]))
    if len(found) == 2 and found[0][1] != found[1][1]:
        raise InvalidArgumentError(f"{found[1][0]}: contradicts layer_types (transformers reads them as one field)")
    return found[0][1] if found else None


def _derived_hybrid_types(r: _Reader, n_layers: int) -> list[str]:
    """Bamba's and Jamba's layer types as their transformers config classes derive them (the
    layers_block_type / layer_types properties): Bamba's attn_layer_indices are full attention,
    Jamba's layers with i % attn_layer_period == attn_layer_offset; every other layer Mamba. A file that
    lists layer_types or layers_block_type itself must agree (transformers cannot load it otherwise)."""
    if r.model_type == "bamba":
        idxs = r.cfg.get("attn_layer_indices")
        if "attn_layer_indices" not in r.cfg:
            r.note("attn_layer_indices=None, every layer Mamba-2 (transformers BambaConfig default)")
        if idxs is None:
            idxs = []
        if (not isinstance(idxs, Sequence) or isinstance(idxs, str)
                or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n_layers for i in idxs)):
            raise InvalidArgumentError(
                f"attn_layer_indices = {idxs!r:.60}: must be a list of layer indices in [0, {n_layers})"
            )
        rule = f"attn_layer_indices = {list(idxs)!r:.60}"
        kinds = [FULL if i in idxs else "linear_attention" for i in range(n_layers)]
    else:
        period = r.optional_int("attn_layer_period")
        offset = r.optional_int("attn_layer_offset", minimum=0)
        assert period is not None and offset is not None  # the family defaults supply them
        if offset >= period:
            raise InvalidArgumentError(
                f"attn_layer_offset = {offset}: must be < attn_layer_period = {period} (transformers JambaConfig)"
            )
        rule = f"attn_layer_period = {period}, attn_layer_offset = {offset}"
        kinds = [FULL if i % period == offset else "linear_attention" for i in range(n_layers)]
    for key in ("layer_types", "layers_block_type"):
        listed = r.cfg.get(key)
        if listed is None:
            continue
        if not isinstance(listed, Sequence) or isinstance(listed, str) or not all(isinstance(k, str) for k in listed):
            raise InvalidArgumentError(f"{key}: must be a list of strings, not {listed!r:.60}")
        if [_LEGACY_LAYER_TYPES.get(k, k) for k in listed] != kinds:
            family = _FAMILIES[r.model_type].source
            raise InvalidArgumentError(
                f"{key} = {listed!r:.60}: contradicts {rule}, from which {family} derives the layer kinds"
            )
    return kinds


# NemotronHConfig._pattern_to_list: one character per layer.
_NEMOTRON_H_PATTERN = {"M": "linear_attention", "*": FULL, "-": "mlp", "E": "moe"}


def _nemotron_h_types(r: _Reader) -> list[str]:
    """Nemotron-H's layer types as NemotronHConfig reads them: layers_block_type (or layer_types), else
    hybrid_override_pattern ("M" Mamba-2, "*" attention, "-" MLP, "E" MoE), else its default
    [linear_attention, moe, full_attention, mlp]. The number of layers is the list's length; a
    num_hidden_layers that says otherwise is an error (transformers would ignore it)."""
    kinds = _file_layer_types(r, None)
    pattern = r.cfg.get("hybrid_override_pattern")
    if pattern is not None:
        if not isinstance(pattern, str) or not pattern:
            raise InvalidArgumentError(f"hybrid_override_pattern = {pattern!r:.60}: must be a non-empty string")
        bad = next((i for i, c in enumerate(pattern) if c not in _NEMOTRON_H_PATTERN), None)
        if bad is not None:
            raise InvalidArgumentError(
                f"hybrid_override_pattern[{bad}] = {pattern[bad]!r}: must be one of 'M' (Mamba-2), '*' (attention), "
                "'-' (MLP) and 'E' (MoE)"
            )
        from_pattern = [_NEMOTRON_H_PATTERN[c] for c in pattern]
        if kinds is not None and kinds != from_pattern:
            raise InvalidArgumentError(
                f"hybrid_override_pattern = {pattern!r:.60}: contradicts layers_block_type "
                "(transformers NemotronHConfig reads layers_block_type and ignores the pattern)"
            )
        kinds = from_pattern
    if kinds is None:
        kinds = ["linear_attention", "moe", FULL, "mlp"]
        r.note(f"layers_block_type={kinds!r} (transformers NemotronHConfig default)")
    if not kinds:
        raise InvalidArgumentError("layers_block_type: empty, a model needs at least one layer")
    given = r.optional_int("num_hidden_layers")
    if given is not None and given != len(kinds):
        raise InvalidArgumentError(
            f"num_hidden_layers = {given}: contradicts the layer list, which has {len(kinds)} layers "
            "(transformers NemotronHConfig takes the number of layers from it)"
        )
    return kinds


def _share_kv(types: list[str], special: list[Optional[SpecialLayer]], windows: list[Optional[int]],
              shared: int) -> None:
    """Make the last ``shared`` layers SharedLayer: each reads the last earlier non-shared layer of its
    own layer type (transformers Gemma3nTextConfig.kv_sharing_modes)."""
    n = len(types)
    if shared >= n:
        raise InvalidArgumentError(
            f"num_kv_shared_layers = {shared}: must be < num_hidden_layers = {n} (some layer must write K/V)"
        )
    first = n - shared
    for i in range(first, n):
        if isinstance(special[i], (StateShape, EmptyLayer)):
            what = "a recurrent" if isinstance(special[i], StateShape) else "an MLP-only"
            raise InvalidArgumentError(f"num_kv_shared_layers = {shared}: layer {i} is {what} layer, not attention")
        source = next((j for j in range(first - 1, -1, -1) if types[j] == types[i]), None)
        if source is None:
            raise InvalidArgumentError(
                f"num_kv_shared_layers = {shared}: layer {i} is {types[i]!r}, and no layer before {first} is, "
                "so it has no layer to share K/V with"
            )
        special[i] = SharedLayer(source)
        windows[i] = None


def _state_shape(r: _Reader, kind: str, layer: int) -> StateShape:
    """The per-sequence state of a recurrent layer, from the model's modeling code in transformers
    5.24 (docs/memory.md, "Recurrent state", cites each line). NotSupportedError for a model_type
    whose state formula kvcore does not have; InvalidArgumentError for a missing or contradictory field."""
    mt = r.model_type
    if mt in ("qwen3_next", "qwen3_5_text") and kind == "linear_attention":
        # modeling_qwen3_next.Qwen3NextGatedDeltaNet, modeling_qwen3_5.Qwen3_5GatedDeltaNet: conv_dim =
        # 2 * key_dim + value_dim over linear_conv_kernel_dim columns; recurrent state (num_v_heads,
        # head_k_dim, head_v_dim), float32 (torch_chunk_gated_delta_rule casts its inputs .to(torch.float32)).
        width = _need(r, "linear_conv_kernel_dim")
        nk, dk = _need(r, "linear_num_key_heads"), _need(r, "linear_key_head_dim")
        nv, dv = _need(r, "linear_num_value_heads"), _need(r, "linear_value_head_dim")
        return StateShape("gated_deltanet", 2 * nk * dk + nv * dv, width, nv * dk * dv,
                          formula="conv (2 x linear_num_key_heads x linear_key_head_dim + linear_num_value_heads "
                          "x linear_value_head_dim) x linear_conv_kernel_dim; recurrent linear_num_value_heads x "
                          "linear_key_head_dim x linear_value_head_dim float32")
    if mt in ("granitemoehybrid", "bamba") and kind == "linear_attention":
        # modeling_granitemoehybrid.GraniteMoeHybridMambaLayer, modeling_bamba.BambaMixer: conv_dim =
        # intermediate + 2 * n_groups * d_state over mamba_d_conv columns, intermediate = mamba_expand *
        # hidden_size; SSM state (mamba_n_heads, mamba_d_head, mamba_d_state), float32 (the chunked scan runs
        # in .float()).
        hidden, expand = _need(r, "hidden_size"), _need(r, "mamba_expand")
        heads, groups = _need(r, "mamba_n_heads"), _need(r, "mamba_n_groups")
        d_state, d_conv = _need(r, "mamba_d_state"), _need(r, "mamba_d_conv")
        inner = expand * hidden
        d_head = r.get("mamba_d_head")
        if d_head == "auto":
            d_head = inner // heads
        d_head = _optional_int(d_head, "mamba_d_head")
        if d_head is None or d_head * heads != inner:
            raise InvalidArgumentError(
                f"mamba_d_head = {d_head}: mamba_n_heads x mamba_d_head must equal mamba_expand x hidden_size = {inner}"
            )
        return StateShape("mamba2", inner + 2 * groups * d_state, d_conv, heads * d_head * d_state,
                          formula="conv (mamba_expand x hidden_size + 2 x mamba_n_groups x mamba_d_state) x "
                          "mamba_d_conv; SSM mamba_n_heads x mamba_d_head x mamba_d_state float32")
    if mt == "falcon_h1" and kind == HYBRID:
        # modeling_falcon_h1.FalconH1Mixer: intermediate = mamba_d_ssm, or int(mamba_expand * hidden_size) when
        # it is None; conv_dim = intermediate + 2 * n_groups * d_state over mamba_d_conv columns; SSM state
        # (mamba_n_heads, mamba_d_head, mamba_d_state), float32 (mamba2_chunk_scan runs in .float()).
        # FalconH1Config: mamba_d_head "auto" = intermediate // mamba_n_heads.
        ssm = r.get("mamba_d_ssm")
        if ssm is None:
            inner = _need(r, "mamba_expand") * _need(r, "hidden_size")
            what = "mamba_expand x hidden_size"
        else:
            inner = _need(r, "mamba_d_ssm")
            what = "mamba_d_ssm"
        heads, groups = _need(r, "mamba_n_heads"), _need(r, "mamba_n_groups")
        d_state, d_conv = _need(r, "mamba_d_state"), _need(r, "mamba_d_conv")
        d_head = r.get("mamba_d_head")
        if d_head == "auto":
            d_head = inner // heads
        d_head = _optional_int(d_head, "mamba_d_head")
        if d_head is None or d_head * heads != inner:
            raise InvalidArgumentError(
                f"mamba_d_head = {d_head}: mamba_n_heads x mamba_d_head must equal {what} = {inner}"
            )
        return StateShape("mamba2", inner + 2 * groups * d_state, d_conv, heads * d_head * d_state,
                          formula="conv (mamba_d_ssm, else mamba_expand x hidden_size, + 2 x mamba_n_groups x "
                          "mamba_d_state) x mamba_d_conv; SSM mamba_n_heads x mamba_d_head x mamba_d_state float32")
    if mt == "nemotron_h" and kind == "linear_attention":
        # modeling_nemotron_h.NemotronHMamba2Mixer: intermediate = mamba_num_heads * mamba_head_dim (not
        # expand * hidden_size), conv_dim = intermediate + 2 * n_groups * ssm_state_size over conv_kernel
        # columns; SSM state (mamba_num_heads, mamba_head_dim, ssm_state_size), float32 (mamba2_chunk_scan
        # runs in .float()). NemotronHConfig takes the legacy mamba_n_groups / mamba_d_conv over them.
        heads, d_head = _need(r, "mamba_num_heads"), _need(r, "mamba_head_dim")
        groups = _need(r, "mamba_n_groups" if "mamba_n_groups" in r.cfg else "n_groups")
        d_conv = _need(r, "mamba_d_conv" if "mamba_d_conv" in r.cfg else "conv_kernel")
        d_state = _need(r, "ssm_state_size")
        inner = heads * d_head
        return StateShape("mamba2", inner + 2 * groups * d_state, d_conv, heads * d_head * d_state,
                          formula="conv (mamba_num_heads x mamba_head_dim + 2 x n_groups x ssm_state_size) x "
                          "conv_kernel; SSM mamba_num_heads x mamba_head_dim x ssm_state_size float32")
    if mt == "jamba" and kind == "linear_attention":
        # modeling_jamba.JambaMambaMixer (Mamba-1): a depthwise conv over intermediate = mamba_expand *
        # hidden_size channels, mamba_d_conv columns; SSM state (intermediate, mamba_d_state), float32
        # (mamba_selective_scan's discretized A and B are float32, so the scanned state is).
        hidden, expand = _need(r, "hidden_size"), _need(r, "mamba_expand")
        d_state, d_conv = _need(r, "mamba_d_state"), _need(r, "mamba_d_conv")
        inner = expand * hidden
        return StateShape("mamba", inner, d_conv, inner * d_state,
                          formula="conv (mamba_expand x hidden_size) x mamba_d_conv; SSM (mamba_expand x "
                          "hidden_size) x mamba_d_state float32")
    if mt == "lfm2" and kind == "conv":
        # modeling_lfm2.Lfm2ShortConv: a depthwise conv over hidden_size channels, conv_L_cache columns.
        return StateShape("short_conv", _need(r, "hidden_size"), _need(r, "conv_L_cache"),
                          formula="conv hidden_size x conv_L_cache")
    raise NotSupportedError(
        f"layer_types[{layer}] = {kind!r}: kvcore knows the recurrent state of the 'linear_attention' layers of "
        f"model_type {_names([t for t in _STATE_FAMILIES if t != 'lfm2'])} and of the 'conv' layers of 'lfm2', "
        f"not those of {mt or '(missing)'!r}"
    )


#: The model_types whose recurrent state _state_shape knows.
_STATE_FAMILIES = ("bamba", "granitemoehybrid", "jamba", "lfm2", "nemotron_h", "qwen3_5_text", "qwen3_next")


def _names(items: Sequence[str]) -> str:
    """'a', 'b' and 'c'."""
    quoted = [repr(x) for x in items]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} and {quoted[-1]}"


def _need(r: _Reader, key: str) -> int:
    value = r.optional_int(key)
    if value is None:
        raise InvalidArgumentError(f"{key}: missing, and model_type {r.model_type!r}'s recurrent layers need it")
    return value


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
