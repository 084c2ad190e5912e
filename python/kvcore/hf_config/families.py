"""The model-family table: how transformers' config class of each model_type reads a config.json.

``FAMILIES`` holds each known family's defaults (the fields its config class fills when the
file leaves them out) and its layer pattern; the tables below it say which fields a family
explains, which ones mean a cache kvcore does not model, and the layer type names
transformers uses. Defaults and patterns come from the transformers 5.24 config classes
each entry names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

# transformers' layer type names (``layer_types``), the ones every family uses.
SLIDING = "sliding_attention"
FULL = "full_attention"
CHUNKED = "chunked_attention"

#: transformers' layer type of a layer running full attention and a Mamba-2 mixer side by side (Falcon-H1).
HYBRID = "hybrid"


@dataclass(frozen=True)
class Family:
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
FAMILIES: dict[str, Family] = {
    "llama": Family(
        "transformers LlamaConfig",
        {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
         "max_position_embeddings": 2048},
        pattern="none",
    ),
    "mistral": Family(
        "transformers MistralConfig",
        {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
         "num_key_value_heads": 8, "max_position_embeddings": 4096 * 32, "sliding_window": 4096},
        pattern="all",
    ),
    "qwen2": Family(
        "transformers Qwen2Config",
        {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
         "num_key_value_heads": 32, "max_position_embeddings": 32768, "use_sliding_window": False,
         "sliding_window": 4096, "max_window_layers": 28},
        pattern="qwen2",
    ),
    "gemma2": Family(
        "transformers Gemma2Config",
        {"hidden_size": 2304, "num_hidden_layers": 26, "num_attention_heads": 8,
         "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 8192,
         "sliding_window": 4096},
        pattern="every", every=2,
    ),
    "gemma3_text": Family(
        "transformers Gemma3TextConfig",
        {"hidden_size": 2304, "num_hidden_layers": 26, "num_attention_heads": 8,
         "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 131072,
         "sliding_window": 4096},
        pattern="every", every=6, every_field="sliding_window_pattern",
    ),
    "cohere2": Family(
        "transformers Cohere2Config",
        {"hidden_size": 8192, "num_hidden_layers": 40, "num_attention_heads": 64,
         "max_position_embeddings": 8192, "sliding_window": 4096},
        pattern="every", every=4, every_field="sliding_window_pattern", derived_head_dim=True,
    ),
    "gpt_oss": Family(
        "transformers GptOssConfig",
        {"hidden_size": 2880, "num_hidden_layers": 36, "num_attention_heads": 64,
         "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 131072,
         "sliding_window": 128},
        pattern="every", every=2,
    ),
}

# Families with chunked, KV-shared or recurrent-state layers (section 9 of docs/design.md). Their
# layer kinds come from layer_types when the file has it, else from the rule in family_layer_types;
# defaults from the transformers 5.24 config classes named here.
FAMILIES.update({
    "llama4_text": Family(
        "transformers Llama4TextConfig",
        {"hidden_size": 5120, "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8,
         "head_dim": 128, "max_position_embeddings": 131072, "attention_chunk_size": 8192,
         "no_rope_layer_interval": 4},
        pattern="kinds",
    ),
    "gemma3n_text": Family(
        "transformers Gemma3nTextConfig",
        {"hidden_size": 2048, "num_hidden_layers": 35, "num_attention_heads": 8, "num_key_value_heads": 2,
         "head_dim": 256, "max_position_embeddings": 32768, "sliding_window": 512, "num_kv_shared_layers": 15},
        pattern="kinds",
    ),
    "qwen3_next": Family(
        "transformers Qwen3NextConfig",
        {"hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2,
         "head_dim": 256, "max_position_embeddings": 32768, "linear_conv_kernel_dim": 4,
         "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16,
         "linear_num_value_heads": 32, "full_attention_interval": 4},
        pattern="kinds",
    ),
    "lfm2": Family(
        "transformers Lfm2Config",
        {"hidden_size": 2560, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
         "max_position_embeddings": 128000, "conv_L_cache": 3},
        pattern="kinds",
    ),
    "granitemoehybrid": Family(
        "transformers GraniteMoeHybridConfig",
        {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "max_position_embeddings": 2048,
         "mamba_n_heads": 128, "mamba_n_groups": 1, "mamba_d_state": 256, "mamba_d_head": "auto",
         "mamba_d_conv": 4, "mamba_expand": 2},
        pattern="kinds",
    ),
    "qwen3_5_text": Family(
        "transformers Qwen3_5TextConfig",
        {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 16, "num_key_value_heads": 4,
         "head_dim": 256, "max_position_embeddings": 32768, "linear_conv_kernel_dim": 4,
         "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16,
         "linear_num_value_heads": 32, "full_attention_interval": 4},
        pattern="kinds",
    ),
    "bamba": Family(
        "transformers BambaConfig",
        {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
         "max_position_embeddings": 262144, "mamba_n_heads": 128, "mamba_d_head": "auto", "mamba_n_groups": 1,
         "mamba_d_state": 256, "mamba_d_conv": 4, "mamba_expand": 2},
        pattern="kinds",
    ),
    "jamba": Family(
        "transformers JambaConfig",
        {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
         "max_position_embeddings": 262144, "attn_layer_period": 8, "attn_layer_offset": 4, "mamba_d_state": 16,
         "mamba_d_conv": 4, "mamba_expand": 2},
        pattern="kinds",
    ),
    # Every layer "hybrid" (FalconH1Config.layers_block_type): attention and Mamba-2 side by side. head_dim
    # has no default: FalconH1Attention takes hidden_size // num_attention_heads when the file has none.
    "falcon_h1": Family(
        "transformers FalconH1Config",
        {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
         "max_position_embeddings": 8192, "mamba_d_ssm": 1024, "mamba_n_heads": 128, "mamba_d_head": "auto",
         "mamba_n_groups": 1, "mamba_d_state": 256, "mamba_d_conv": 4, "mamba_expand": 2},
        pattern="kinds",
    ),
    # num_hidden_layers: NemotronHConfig derives it from the layer list (nemotron_h_types).
    "nemotron_h": Family(
        "transformers NemotronHConfig",
        {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
         "max_position_embeddings": 4096, "ssm_state_size": 128, "mamba_num_heads": 128, "mamba_head_dim": 64,
         "n_groups": 8, "conv_kernel": 4},
        pattern="kinds",
    ),
})

# Fields of UNSUPPORTED that a family's own layers explain (read in family_layer_types and state_shape).
READS: dict[str, tuple[str, ...]] = {
    "granitemoehybrid": ("mamba_d_state", "layers_block_type"),
    "bamba": ("mamba_d_state", "layers_block_type"),
    "jamba": ("mamba_d_state", "layers_block_type"),
    "falcon_h1": ("mamba_d_state",),
    "nemotron_h": ("layers_block_type", "hybrid_override_pattern"),
}

# Where a family's config class takes layer_types from a field of another name (its attribute_map).
LAYER_TYPES_ALIAS = {"granitemoehybrid": "layers_block_type", "nemotron_h": "layers_block_type"}

# transformers' legacy layer type names (configuration_utils._LEGACY_LAYER_TYPE_REMAP).
LEGACY_LAYER_TYPES = {"mamba": "linear_attention", "attention": FULL}

# transformers' recurrent-state layer types (gated DeltaNet and Mamba layers: "linear_attention";
# LFM2's short convolutions: "conv"): kvcore plans them as State(D).
STATE_TYPES = ("linear_attention", "conv")

# Layer types without attention or state: transformers gives them a "dummy" cache layer
# (cache_utils.get_layer_types_and_kwargs), kvcore an EmptyLayer, in the families that are known
# to mean that by them (Dory's config.json, for one, lists "mlp" blocks that are halves of a layer).
EMPTY_TYPES = ("mlp", "moe")

EMPTY_FAMILIES = ("nemotron_h",)

# The families whose "hybrid" layers (attention and a recurrent mixer in one layer) kvcore plans: each as
# a full-attention layer at its index plus a state layer appended after the model's layers.
HYBRID_FAMILIES = ("falcon_h1",)

# A multimodal config keeps the language model under text_config.
TEXT_MODEL_TYPE = {"gemma3": "gemma3_text", "gemma3n": "gemma3n_text", "llama4": "llama4_text",
                   "qwen3_5": "qwen3_5_text"}

# Fields that mean the KV cache is not per-layer K/V rows of one shape.
UNSUPPORTED: dict[str, str] = {
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
PER_LAYER_KV_FIELDS = (
    "num_key_value_heads", "num_attention_heads", "head_dim", "v_head_dim", "hidden_size",
    "attention_chunk_size", "kv_lora_rank", "skip",
)  # fmt: skip

# NemotronHConfig._pattern_to_list: one character per layer.
NEMOTRON_H_PATTERN = {"M": "linear_attention", "*": FULL, "-": "mlp", "E": "moe"}

#: The model_types whose recurrent state state_shape knows.
STATE_FAMILIES = ("bamba", "granitemoehybrid", "jamba", "lfm2", "nemotron_h", "qwen3_5_text", "qwen3_next")


__all__ = [
    "CHUNKED", "EMPTY_FAMILIES", "EMPTY_TYPES", "FAMILIES", "FULL", "Family", "HYBRID", "HYBRID_FAMILIES",
    "LAYER_TYPES_ALIAS", "LEGACY_LAYER_TYPES", "NEMOTRON_H_PATTERN", "PER_LAYER_KV_FIELDS", "READS", "SLIDING",
    "STATE_FAMILIES", "STATE_TYPES", "TEXT_MODEL_TYPE", "UNSUPPORTED",
]  # fmt: skip
