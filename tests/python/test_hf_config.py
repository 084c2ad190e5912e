"""kvcore.config_from_hf / model_shape_from_hf on config.json files written from
published facts (the models' Hugging Face configs and transformers' config classes).
Expected windows follow the rules as transformers states them, written out here:
Gemma 2 and gpt-oss slide on layer i when (i + 1) % 2 != 0, Gemma 3 when
(i + 1) % 6 != 0, Command R7B when (i + 1) % 4 != 0, Mistral on every layer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from needs import need

import kvcore
from kvcore.cli import main
from kvcore.hf_config import EmptyLayer, ModelShape, StateShape, default_state_slots, model_shape_from_hf
from kvcore.memory import kv_bytes, plan_memory

SLIDING, FULL = "sliding_attention", "full_attention"


def write(tmp_path: Path, config: Any, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


# openai/gpt-oss-20b config.json: it lists layer_types explicitly.
GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "head_dim": 64,
    "hidden_size": 2880,
    "num_attention_heads": 64,
    "num_hidden_layers": 24,
    "num_key_value_heads": 8,
    "sliding_window": 128,
    "max_position_embeddings": 131072,
    "layer_types": [SLIDING, FULL] * 12,
    "num_local_experts": 32,
    "rope_theta": 150000,
    "torch_dtype": "bfloat16",
}

# mistralai/Mistral-7B-v0.1 config.json: only sliding_window, no head_dim.
MISTRAL_7B_V01 = {
    "architectures": ["MistralForCausalLM"],
    "model_type": "mistral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "torch_dtype": "bfloat16",
    "vocab_size": 32000,
}

# google/gemma-3-4b-it config.json: multimodal; its text_config leaves the head
# counts and head_dim to Gemma3TextConfig's defaults (8 heads, 4 KV heads, 256).
GEMMA_3_4B = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "mm_tokens_per_image": 256,
    "text_config": {
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "model_type": "gemma3_text",
        "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "vision_config": {"hidden_size": 1152, "model_type": "siglip_vision_model", "num_hidden_layers": 27},
}


def test_layer_types_are_read_layer_by_layer(tmp_path: Path) -> None:
    shape = model_shape_from_hf(write(tmp_path, GPT_OSS_20B))
    assert shape.n_layers == 24
    assert shape.windows == tuple(128 if i % 2 == 0 else None for i in range(24))
    assert (shape.n_kv_heads, shape.head_dim, shape.value_dim) == (8, 64, 64)
    assert shape.max_position_embeddings == 131072
    assert shape.defaults == ()


def test_layer_types_win_over_the_family_pattern() -> None:
    # A gpt_oss config whose list is not the default alternation: the list decides.
    kinds = [FULL, SLIDING, SLIDING, FULL]
    shape = model_shape_from_hf({**GPT_OSS_20B, "num_hidden_layers": 4, "layer_types": kinds})
    assert shape.windows == (None, 128, 128, None)


def test_only_sliding_window_slides_every_mistral_layer(tmp_path: Path) -> None:
    shape = model_shape_from_hf(write(tmp_path, MISTRAL_7B_V01))
    assert shape.windows == (4096,) * 32
    assert shape.head_dim == 4096 // 32  # no head_dim field: hidden_size / num_attention_heads
    assert shape.n_kv_heads == 8


def test_mistral_with_a_null_window_is_all_full() -> None:
    # Mistral 7B v0.2 and later publish "sliding_window": null.
    shape = model_shape_from_hf({**MISTRAL_7B_V01, "sliding_window": None})
    assert shape.windows == (None,) * 32


def test_multimodal_config_reads_text_config_and_fills_family_defaults(tmp_path: Path) -> None:
    shape = model_shape_from_hf(write(tmp_path, GEMMA_3_4B))
    assert shape.model_type == "gemma3_text"
    assert (shape.n_kv_heads, shape.head_dim) == (4, 256)
    assert shape.windows == tuple(None if (i + 1) % 6 == 0 else 1024 for i in range(34))
    assert shape.max_position_embeddings == 131072
    filled = " ".join(shape.defaults)
    for field in ("num_key_value_heads=4", "head_dim=256", "max_position_embeddings=131072",
                  "sliding_window_pattern=6"):
        assert field in filled
    assert "Gemma3TextConfig" in filled


def test_gemma2_alternates_starting_with_a_sliding_layer() -> None:
    # google/gemma-2-9b config.json (no layer_types): 42 layers, window 4096.
    shape = model_shape_from_hf({"model_type": "gemma2", "num_hidden_layers": 42, "num_attention_heads": 16,
                                 "num_key_value_heads": 8, "head_dim": 256, "hidden_size": 3584,
                                 "sliding_window": 4096, "max_position_embeddings": 8192})
    assert shape.windows == tuple(4096 if (i + 1) % 2 else None for i in range(42))
    assert sum(w is None for w in shape.windows) == 21


def test_cohere2_pattern_and_derived_head_dim() -> None:
    # CohereLabs/c4ai-command-r7b-12-2024: 32 layers, 3 sliding (4096) : 1 global.
    cfg = {"model_type": "cohere2", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
           "hidden_size": 4096, "sliding_window": 4096, "sliding_window_pattern": 4}
    shape = model_shape_from_hf(cfg)
    assert shape.windows == tuple(None if (i + 1) % 4 == 0 else 4096 for i in range(32))
    assert shape.head_dim == 128
    with pytest.raises(kvcore.InvalidArgumentError, match=r"head_dim = 96: contradicts .* = 128"):
        model_shape_from_hf({**cfg, "head_dim": 96})


def test_qwen2_window_only_counts_when_use_sliding_window() -> None:
    # Qwen/Qwen2.5-7B-Instruct config.json: sliding_window 131072 but use_sliding_window false.
    qwen = {"model_type": "qwen2", "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
            "hidden_size": 3584, "max_position_embeddings": 32768, "sliding_window": 131072,
            "use_sliding_window": False, "max_window_layers": 28}
    assert model_shape_from_hf(qwen).windows == (None,) * 28
    on = {**qwen, "num_hidden_layers": 4, "use_sliding_window": True, "sliding_window": 32, "max_window_layers": 2}
    assert model_shape_from_hf(on).windows == (None, None, 32, 32)  # layers >= max_window_layers slide
    off = {**on, "use_sliding_window": False}
    assert model_shape_from_hf(off).windows == (None,) * 4
    # Any family: use_sliding_window false switches the recorded window off.
    assert model_shape_from_hf({**off, "model_type": "brand_new"}).windows == (None,) * 4


def test_llama_has_no_window() -> None:
    # meta-llama/Llama-3.1-8B config.json.
    shape = model_shape_from_hf({"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32,
                                 "num_key_value_heads": 8, "hidden_size": 4096,
                                 "max_position_embeddings": 131072})
    assert shape.windows == (None,) * 32
    assert (shape.n_kv_heads, shape.head_dim) == (8, 128)


def test_missing_num_key_value_heads_means_multi_head_attention() -> None:
    shape = model_shape_from_hf({"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 16,
                                 "hidden_size": 2048})
    assert shape.n_kv_heads == 16
    assert any("num_key_value_heads=16" in d for d in shape.defaults)


def test_a_directory_reads_its_config_json(tmp_path: Path) -> None:
    write(tmp_path, MISTRAL_7B_V01)
    assert model_shape_from_hf(tmp_path).windows == (4096,) * 32


def test_config_from_hf_builds_the_cache_config(tmp_path: Path) -> None:
    cfg = kvcore.config_from_hf(write(tmp_path, GPT_OSS_20B), context=4096, max_step=256, sinks=4)
    assert isinstance(cfg, kvcore.CacheConfig)
    assert (cfg.capacity, cfg.n_layers, cfg.max_step) == (4096, 24, 256)
    for i, layer in enumerate(cfg.layers):
        expected = kvcore.Ring(window=128, sinks=4) if i % 2 == 0 else kvcore.Flat()
        assert layer.policy == expected
        assert (layer.n_kv_heads, layer.head_dim) == (8, 64)
    cache = kvcore.SequenceCache(cfg)
    assert cache.rows(0) == 4 + 128 + 256 - 1  # DESIGN: S + W + C - 1
    assert cache.rows(1) == 4096


def test_config_from_hf_defaults(tmp_path: Path) -> None:
    cfg = kvcore.config_from_hf(MISTRAL_7B_V01)  # a mapping works too
    assert cfg.capacity == 32768  # max_position_embeddings
    assert cfg.max_step == 512  # kvcore's min(512, capacity)
    assert all(layer.policy == kvcore.Ring(window=4096, sinks=0) for layer in cfg.layers)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"context": 0}, r"context = 0: must be >= 1"),
        ({"context": 100, "max_step": 101}, r"max_step = 101: must be <= context = 100"),
        ({"context": 100, "max_step": 0}, r"max_step = 0: must be >= 1"),
        ({"context": 100, "sinks": -1}, r"sinks = -1: must be >= 0"),
        ({"context": "100"}, r"context = '100': must be an integer"),
    ],
)
def test_config_from_hf_rejects_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(kvcore.InvalidArgumentError, match=message):
        kvcore.config_from_hf(MISTRAL_7B_V01, **kwargs)


def test_context_needs_a_default_when_not_given() -> None:
    cfg = {k: v for k, v in MISTRAL_7B_V01.items() if k != "max_position_embeddings"}
    cfg["model_type"] = "some_new_model"
    cfg["layer_types"] = [SLIDING] * 32
    with pytest.raises(kvcore.InvalidArgumentError, match=r"context: not given.*max_position_embeddings"):
        kvcore.config_from_hf(cfg)
    assert kvcore.config_from_hf(cfg, context=1000).capacity == 1000


def test_malformed_json_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "mistral", "num_hidden_layers": 32,', encoding="utf-8")
    with pytest.raises(kvcore.InvalidArgumentError, match=r"config.json' is not valid JSON"):
        model_shape_from_hf(path)


def test_a_json_array_is_not_a_config(tmp_path: Path) -> None:
    with pytest.raises(kvcore.InvalidArgumentError, match=r"must hold a JSON object, not list"):
        model_shape_from_hf(write(tmp_path, [1, 2]))


def test_a_missing_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(kvcore.InvalidArgumentError, match=r"cannot read Hugging Face config .*nope.json"):
        model_shape_from_hf(tmp_path / "nope.json")


def _mistral(**changes: Any) -> dict[str, Any]:
    cfg = dict(MISTRAL_7B_V01)
    for key, value in changes.items():
        if value is _DROP:
            cfg.pop(key)
        else:
            cfg[key] = value
    return cfg


_DROP = object()


@pytest.mark.parametrize(
    ("config", "error", "message"),
    [
        (_mistral(num_hidden_layers="32"), kvcore.InvalidArgumentError,
         r"num_hidden_layers = '32': must be an integer"),
        (_mistral(num_hidden_layers=True), kvcore.InvalidArgumentError,
         r"num_hidden_layers = True: must be an integer"),
        (_mistral(num_hidden_layers=0), kvcore.InvalidArgumentError, r"num_hidden_layers = 0: must be >= 1"),
        (_mistral(sliding_window=0), kvcore.InvalidArgumentError, r"sliding_window = 0: must be >= 1"),
        (_mistral(num_key_value_heads=5), kvcore.InvalidArgumentError,
         r"num_key_value_heads = 5: must divide num_attention_heads = 32"),
        (_mistral(model_type="brand_new", num_hidden_layers=_DROP), kvcore.InvalidArgumentError,
         r"num_hidden_layers: missing, and model_type 'brand_new' has no default"),
        (_mistral(model_type="brand_new"), kvcore.InvalidArgumentError,
         r"sliding_window = 4096: model_type 'brand_new' is not a family kvcore knows.*add layer_types"),
        (_mistral(model_type="brand_new", hidden_size=4000, num_attention_heads=_DROP, num_key_value_heads=8),
         kvcore.InvalidArgumentError, r"head_dim: missing, and hidden_size = 4000 / num_attention_heads = None"),
        (_mistral(layer_types=[SLIDING] * 31), kvcore.InvalidArgumentError,
         r"layer_types has 31 entries: must have one per layer, num_hidden_layers = 32"),
        (_mistral(layer_types=[SLIDING, "chunked_attention"] * 16), kvcore.InvalidArgumentError,
         r"layer_types\[1\] = 'chunked_attention': contradicts attention_chunk_size, which is missing"),
        (_mistral(layer_types=[SLIDING, "indexed_attention"] * 16), kvcore.NotSupportedError,
         r"layer_types\[1\] = 'indexed_attention': kvcore models only"),
        (_mistral(layer_types=[SLIDING, "linear_attention"] * 16), kvcore.NotSupportedError,
         r"layer_types\[1\] = 'linear_attention': kvcore knows the recurrent state of the 'linear_attention' "
         r"layers of model_type 'bamba', .*'qwen3_next' and of the 'conv' layers of 'lfm2', not those of 'mistral'"),
        (_mistral(layer_types="sliding_attention"), kvcore.InvalidArgumentError,
         r"layer_types: must be a list of strings"),
        (_mistral(sliding_window=None, layer_types=[FULL, SLIDING] * 16), kvcore.InvalidArgumentError,
         r"layer_types\[1\] = 'sliding_attention': contradicts sliding_window"),
        (_mistral(model_type="gemma3_text", sliding_window_pattern=6, layer_types=[SLIDING, FULL] * 16),
         kvcore.InvalidArgumentError, r"sliding_window_pattern = 6: contradicts layer_types"),
        (_mistral(model_type="gemma2", sliding_window_pattern=3), kvcore.InvalidArgumentError,
         r"sliding_window_pattern = 3: transformers Gemma2Config always"),
        (_mistral(use_sliding_window="yes"), kvcore.InvalidArgumentError,
         r"use_sliding_window = 'yes': must be true or false"),
        (_mistral(kv_lora_rank=512), kvcore.NotSupportedError, r"kv_lora_rank = 512: multi-head latent"),
        (_mistral(num_kv_shared_layers=32), kvcore.InvalidArgumentError,
         r"num_kv_shared_layers = 32: must be < num_hidden_layers = 32"),
        (_mistral(num_kv_shared_layers=2, layer_types=[SLIDING] * 31 + [FULL]), kvcore.InvalidArgumentError,
         r"num_kv_shared_layers = 2: layer 31 is 'full_attention', and no layer before 30 is"),
        (_mistral(attention_chunk_size=8192), kvcore.InvalidArgumentError,
         r"attention_chunk_size = 8192: model_type 'mistral' is not a family kvcore knows.*add layer_types"),
        (_mistral(model_type=3), kvcore.InvalidArgumentError, r"model_type = 3: must be a string"),
        ({**GEMMA_3_4B, "num_hidden_layers": 34, "text_config": {**GEMMA_3_4B["text_config"],  # type: ignore[dict-item]
                                                                  "num_hidden_layers": 26}},
         kvcore.InvalidArgumentError, r"num_hidden_layers: the top level says 34, text_config says 26"),
        ({**GEMMA_3_4B, "text_config": [1]}, kvcore.InvalidArgumentError, r"text_config: must be an object"),
    ],
)
def test_bad_fields_are_named(config: dict[str, Any], error: type[Exception], message: str) -> None:
    before = json.dumps(config, sort_keys=True)
    with pytest.raises(error, match=message):
        model_shape_from_hf(config)
    assert json.dumps(config, sort_keys=True) == before  # the caller's dict is left alone


def test_unknown_family_with_layer_types_is_fine() -> None:
    shape = model_shape_from_hf(_mistral(model_type="brand_new", layer_types=[SLIDING, SLIDING, FULL] * 10 + [FULL] * 2))
    assert shape.windows == tuple([4096, 4096, None] * 10 + [None, None])


def test_unknown_family_with_a_pattern_uses_the_transformers_rule() -> None:
    shape = model_shape_from_hf(_mistral(model_type="brand_new", sliding_window_pattern=4))
    assert shape.windows == tuple(None if (i + 1) % 4 == 0 else 4096 for i in range(32))


def test_shape_cache_config_all_flat() -> None:
    shape = ModelShape(name="toy", model_type="", n_kv_heads=2, head_dim=16, windows=(8, None, 8))
    cfg = shape.cache_config(100, all_flat=True)
    assert all(layer.policy == kvcore.Flat() for layer in cfg.layers)
    rings = shape.cache_config(100, sinks=2)
    assert [layer.policy for layer in rings.layers] == [kvcore.Ring(8, 2), kvcore.Flat(), kvcore.Ring(8, 2)]


# --- chunked, KV-shared and recurrent-state layers, from transformers' own config classes ----------
# Tiny configs built with transformers 5.24's classes, written as config.json by to_dict() and
# read back by --hf-config. Expected kinds and state bytes follow the rules of docs/memory.md,
# worked out here from the numbers given.

TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=256)


def tiny(cls: str, **kwargs: Any) -> dict[str, Any]:
    transformers = need("transformers", reason="builds configs with transformers' classes")
    config: dict[str, Any] = getattr(transformers, cls)(**{**TINY, **kwargs}).to_dict()
    return config


def policies(source: Any, **kwargs: Any) -> list[tuple[str, int]]:
    """(kind, window / source / slots) of each layer of config_from_hf's CacheConfig."""
    cfg = kvcore.config_from_hf(source, **{"context": 4096, **kwargs})
    out = []
    for layer in cfg.layers:
        p = layer.policy
        kind = str(p.kind).rsplit(".", 1)[-1]
        out.append((kind, {"Ring": p.window, "Chunked": p.window, "Shared": p.source, "State": p.slots}.get(kind, 0)))
    return out


def test_llama4_chunked_layers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tiny("Llama4TextConfig", num_hidden_layers=8, head_dim=16, attention_chunk_size=32)
    assert policies(write(tmp_path, source)) == [("Chunked", 32)] * 3 + [("Flat", 0)] + [("Chunked", 32)] * 3 + [
        ("Flat", 0)
    ]
    # Without layer_types, Llama4TextConfig's rule: every no_rope_layer_interval-th layer is full.
    bare = {k: v for k, v in source.items() if k not in ("layer_types", "no_rope_layers")}
    assert policies({**bare, "no_rope_layer_interval": 2}) == [("Chunked", 32), ("Flat", 0)] * 4
    code = main(["memory", "--hf-config", str(write(tmp_path, source)), "--context", "1000", "--max-step", "8"])
    out = capsys.readouterr().out
    assert code == 0 and "6 chunked + 2 full" in out
    # chunked: min(1000, 32 + 8 - 1) = 39 rows x 2 heads x (16 + 16) x 2 B; full: 1000 rows.
    assert f"{6 * 39 * 128 + 2 * 1000 * 128:,} B" in out


def test_gemma3n_shared_layers_read_the_last_layer_of_their_type(tmp_path: Path) -> None:
    source = tiny("Gemma3nTextConfig", num_hidden_layers=10, head_dim=16, sliding_window=16, num_kv_shared_layers=5,
                  intermediate_size=[128] * 10, hidden_size_per_layer_input=8, laurel_rank=4)
    # Layers 4 and 9 full, the rest sliding; 5-9 share: sliding ones read 3, layer 9 (full) reads 4.
    assert policies(write(tmp_path, source)) == (
        [("Ring", 16)] * 4 + [("Flat", 0)] + [("Shared", 3)] * 4 + [("Shared", 4)]
    )
    multimodal = {"model_type": "gemma3n", "text_config": source}
    assert model_shape_from_hf(multimodal).special == model_shape_from_hf(source).special


def test_qwen3_next_linear_attention_is_state(tmp_path: Path) -> None:
    source = tiny("Qwen3NextConfig", num_hidden_layers=4, head_dim=16, linear_conv_kernel_dim=3, linear_key_head_dim=8,
                  linear_value_head_dim=4, linear_num_key_heads=2, linear_num_value_heads=6, num_experts=4,
                  num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)
    assert policies(write(tmp_path, source), max_step=16, state_slots=3) == [("State", 3)] * 3 + [("Flat", 0)]
    state = model_shape_from_hf(source).special[0]
    assert isinstance(state, StateShape)
    # conv (2 x 2 x 8 + 6 x 4) channels x 3 columns; recurrent 6 heads x 8 x 4.
    assert (state.conv_elements, state.recurrent_elements) == ((32 + 24) * 3, 6 * 8 * 4)
    assert state.snapshot_bytes(2) == 56 * 3 * 2 + 192 * 4


def test_lfm2_conv_layers_are_state() -> None:
    source = tiny("Lfm2Config", num_hidden_layers=5, full_attn_idxs=[1, 3], conv_L_cache=3)
    assert policies(source, max_step=4) == [("State", 5), ("Flat", 0), ("State", 5), ("Flat", 0), ("State", 5)]
    state = model_shape_from_hf(source).special[0]
    assert isinstance(state, StateShape) and (state.conv_elements, state.recurrent_elements) == (64 * 3, 0)


def test_granite_mamba2_layers_are_state() -> None:
    source = tiny("GraniteMoeHybridConfig", num_hidden_layers=4, layer_types=["mamba", "attention", "mamba", "mamba"],
                  mamba_n_heads=8, mamba_d_head=16, mamba_d_state=8, mamba_d_conv=4, mamba_n_groups=2,
                  mamba_expand=2, num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=32)
    assert policies(source, state_slots=2) == [("State", 2), ("Flat", 0), ("State", 2), ("State", 2)]
    state = model_shape_from_hf(source).special[0]
    # conv (2 x 64 + 2 x 2 x 8) channels x 4; SSM 8 heads x 16 x 8.
    assert isinstance(state, StateShape)
    assert (state.conv_elements, state.recurrent_elements) == ((128 + 32) * 4, 8 * 16 * 8)
    # The legacy names of a published config.json read the same.
    legacy = {**source, "layer_types": ["mamba", "attention", "mamba", "mamba"]}
    assert model_shape_from_hf(legacy).special == model_shape_from_hf(source).special


# The other hybrid families, from minimal config.json dicts (no transformers needed). Each test works
# out the state of one layer from the numbers given, then what the planner gives at 100 tokens with
# max_step 4 (D = 5 state slots), bfloat16 K/V rows and conv windows, float32 recurrent states.


def kinds(shape: ModelShape) -> list[str]:
    return [shape.layer_kind(i) for i in range(shape.n_layers)]


QWEN3_5_TEXT = {"model_type": "qwen3_5_text", "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 4096,
                "full_attention_interval": 2, "linear_conv_kernel_dim": 3, "linear_num_key_heads": 2,
                "linear_key_head_dim": 8, "linear_num_value_heads": 4, "linear_value_head_dim": 6}  # fmt: skip


def test_qwen3_5_gated_deltanet_layers_are_state() -> None:
    shape = model_shape_from_hf(QWEN3_5_TEXT)
    assert kinds(shape) == ["state", "full", "state", "full"]  # every full_attention_interval = 2nd layer full
    state = shape.special[0]
    # conv (2 x 2 key heads x 8 + 4 value heads x 6) = 56 channels x 3 columns; recurrent 4 x 8 x 6, float32.
    assert isinstance(state, StateShape) and state.kind == "gated_deltanet"
    assert (state.conv_elements, state.recurrent_elements) == (56 * 3, 4 * 8 * 6)
    assert state.snapshot_bytes(2) == 56 * 3 * 2 + 192 * 4  # 1104 B
    # 2 full layers x 100 rows x 2 KV heads x (16 K + 16 V) x 2 B; 2 state layers x 5 slots x 1104 B.
    assert kv_bytes(shape, 100, max_step=4) == 2 * 100 * 2 * 32 * 2 + 2 * 5 * 1104
    # Qwen 3.5's config.json wraps it (model_type qwen3_5, the text model under text_config, which may
    # leave its own model_type out) beside a vision_config.
    for text in (QWEN3_5_TEXT, {k: v for k, v in QWEN3_5_TEXT.items() if k != "model_type"}):
        wrapped = model_shape_from_hf({"model_type": "qwen3_5", "text_config": text, "vision_config": {"depth": 2}})
        assert (wrapped.model_type, wrapped.special) == ("qwen3_5_text", shape.special)
    # Qwen3_5TextConfig's defaults: conv (2 x 16 x 128 + 32 x 128) x 4, recurrent 32 x 128 x 128 float32 (2 MiB).
    default = model_shape_from_hf({"model_type": "qwen3_5_text"})
    assert kinds(default) == ["state", "state", "state", "full"] * 8
    assert isinstance(default.special[0], StateShape) and default.special[0].snapshot_bytes(2) == (
        8192 * 4 * 2 + 32 * 128 * 128 * 4
    )
    assert "linear_num_value_heads=32 (transformers Qwen3_5TextConfig default)" in default.defaults


BAMBA = {"model_type": "bamba", "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
         "num_key_value_heads": 2, "max_position_embeddings": 4096, "attn_layer_indices": [2], "mamba_n_heads": 8,
         "mamba_d_head": "auto", "mamba_n_groups": 2, "mamba_d_state": 8, "mamba_d_conv": 3,
         "mamba_expand": 2}  # fmt: skip


def test_bamba_mamba2_layers_are_state() -> None:
    shape = model_shape_from_hf(BAMBA)
    assert kinds(shape) == ["state", "state", "full", "state"]  # attn_layer_indices = [2]
    state = shape.special[0]
    # mamba_d_head "auto" = 2 x 64 // 8 = 16; conv (2 x 64 + 2 x 2 x 8) = 160 channels x 3; SSM 8 x 16 x 8 float32.
    assert isinstance(state, StateShape) and state.kind == "mamba2"
    assert (state.conv_elements, state.recurrent_elements) == (160 * 3, 8 * 16 * 8)
    # head_dim = 64 / 4 = 16: 1 full layer x 100 x 2 x 32 x 2 B; 3 state layers x 5 x (480 x 2 + 1024 x 4) B.
    assert kv_bytes(shape, 100, max_step=4) == 100 * 2 * 32 * 2 + 3 * 5 * (480 * 2 + 1024 * 4)
    # Without attn_layer_indices, BambaConfig.layers_block_type makes every layer Mamba-2.
    assert kinds(model_shape_from_hf({k: v for k, v in BAMBA.items() if k != "attn_layer_indices"})) == ["state"] * 4
    # A layers_block_type (legacy names) that says what attn_layer_indices says reads the same.
    listed = {**BAMBA, "layers_block_type": ["mamba", "mamba", "attention", "mamba"]}
    assert model_shape_from_hf(listed).special == shape.special


JAMBA = {"model_type": "jamba", "num_hidden_layers": 6, "hidden_size": 64, "intermediate_size": 200,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096, "attn_layer_period": 3,
         "attn_layer_offset": 1, "mamba_d_state": 8, "mamba_d_conv": 3, "mamba_expand": 2}  # fmt: skip


def test_jamba_mamba_layers_are_state() -> None:
    shape = model_shape_from_hf(JAMBA)
    assert kinds(shape) == ["state", "full", "state", "state", "full", "state"]  # attention where i % 3 == 1
    state = shape.special[0]
    # Mamba-1 over 2 x 64 = 128 channels (mamba_expand x hidden_size; intermediate_size is the MLP's):
    # conv 128 x 3, SSM 128 x 8 float32.
    assert isinstance(state, StateShape) and state.kind == "mamba"
    assert (state.conv_elements, state.recurrent_elements) == (128 * 3, 128 * 8)
    # head_dim = 64 / 4 = 16: 2 full layers x 100 x 2 x 32 x 2 B; 4 state layers x 5 x (384 x 2 + 1024 x 4) B.
    assert kv_bytes(shape, 100, max_step=4) == 2 * 100 * 2 * 32 * 2 + 4 * 5 * (384 * 2 + 1024 * 4)
    # JambaConfig's defaults: attention where i % 8 == 4.
    bare = {k: v for k, v in JAMBA.items() if k not in ("attn_layer_period", "attn_layer_offset")}
    assert kinds(model_shape_from_hf(bare)) == ["state"] * 4 + ["full", "state"]


NEMOTRON_H = {"model_type": "nemotron_h", "num_hidden_layers": 5, "hybrid_override_pattern": "M-M*E",
              "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
              "max_position_embeddings": 4096, "mamba_num_heads": 6, "mamba_head_dim": 8, "n_groups": 2,
              "ssm_state_size": 4, "conv_kernel": 3, "expand": 2}  # fmt: skip


def test_nemotron_h_mamba2_layers_are_state_and_mlp_layers_hold_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shape = model_shape_from_hf(NEMOTRON_H)
    # "M" Mamba-2, "-" MLP, "*" attention, "E" MoE: the "-" and "E" layers are neither attention nor state.
    assert kinds(shape) == ["state", "empty", "state", "full", "empty"]
    assert (shape.special[1], shape.special[4]) == (EmptyLayer("mlp"), EmptyLayer("moe"))
    state = shape.special[0]
    # intermediate = mamba_num_heads x mamba_head_dim = 6 x 8 = 48 (not expand x hidden_size = 128):
    # conv (48 + 2 x 2 x 4) = 64 channels x 3; SSM 6 x 8 x 4 float32.
    assert isinstance(state, StateShape) and state.kind == "mamba2"
    assert (state.conv_elements, state.recurrent_elements) == (64 * 3, 6 * 8 * 4)
    # The "*" layer: 100 x 2 x (16 + 16) x 2 B; 2 "M" layers x 5 x (192 x 2 + 192 x 4) B; "-" and "E": 0.
    plan = plan_memory(shape, context=100, max_step=4)
    assert plan.total_bytes == 100 * 2 * 32 * 2 + 2 * 5 * (192 * 2 + 192 * 4)
    assert [(k.layers, k.rows, k.total_bytes) for k in plan.kinds if k.kind == "empty"] == [((1, 4), 0, 0)]
    cfg = kvcore.config_from_hf(NEMOTRON_H, context=100, max_step=4)  # a placeholder at each empty layer
    assert (cfg.layers[1].policy, cfg.layers[1].n_kv_heads, cfg.layers[1].head_dim) == (kvcore.Flat(), 1, 1)
    # transformers' own spelling (NemotronHConfig.to_dict): layers_block_type, no num_hidden_layers; and
    # the legacy mamba_n_groups / mamba_d_conv names, which NemotronHConfig takes over n_groups / conv_kernel.
    listed = {k: v for k, v in NEMOTRON_H.items() if k not in ("hybrid_override_pattern", "num_hidden_layers")}
    listed.update(layers_block_type=["mamba", "mlp", "mamba", "attention", "moe"], n_groups=7, conv_kernel=9,
                  mamba_n_groups=2, mamba_d_conv=3)
    assert model_shape_from_hf(listed).special == shape.special
    code = main(["memory", "--hf-config", str(write(tmp_path, NEMOTRON_H)), "--context", "100", "--max-step", "4"])
    out = capsys.readouterr().out
    assert code == 0 and f"{12800 + 11520:,} B" in out


FALCON_H1 = {"model_type": "falcon_h1", "num_hidden_layers": 3, "hidden_size": 64, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 4096, "mamba_d_ssm": 96,
             "mamba_n_heads": 6, "mamba_d_head": "auto", "mamba_n_groups": 2, "mamba_d_state": 8, "mamba_d_conv": 3,
             "mamba_expand": 2}  # fmt: skip


def test_falcon_h1_hybrid_layers_are_attention_then_appended_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shape = model_shape_from_hf(FALCON_H1)
    # Each of the 3 "hybrid" layers runs attention and Mamba-2 side by side: 3 full layers (0-2), then
    # their 3 states appended as layers 3-5, as kvcore's transformers cache holds them.
    assert kinds(shape) == ["full"] * 3 + ["state"] * 3
    state = shape.special[3]
    # intermediate = mamba_d_ssm = 96 (not mamba_expand x hidden_size = 128); mamba_d_head "auto" = 96 // 6 = 16;
    # conv (96 + 2 x 2 x 8) = 128 channels x 3; SSM 6 x 16 x 8 = 768 float32.
    assert isinstance(state, StateShape) and state.kind == "mamba2"
    assert (state.conv_elements, state.recurrent_elements) == (128 * 3, 6 * 16 * 8)
    assert state.snapshot_bytes(2) == 384 * 2 + 768 * 4  # 3840 B
    # 3 full layers x 100 x 2 KV heads x (8 K + 8 V) x 2 B; 3 state layers x 5 slots x 3840 B.
    plan = plan_memory(shape, context=100, max_step=4)
    assert plan.total_bytes == 3 * 100 * 2 * 16 * 2 + 3 * 5 * 3840 == 76800
    cfg = kvcore.config_from_hf(FALCON_H1, context=100, max_step=4)
    assert [lc.policy.kind == kvcore.LayerPolicy.Kind.State for lc in cfg.layers] == [False] * 3 + [True] * 3
    # mamba_d_ssm null: intermediate = mamba_expand x hidden_size = 128, mamba_d_head "auto" = 128 // 8 = 16:
    # conv (128 + 2 x 2 x 8) = 160 x 3; SSM 8 x 16 x 8.
    expand = model_shape_from_hf({**FALCON_H1, "mamba_d_ssm": None, "mamba_n_heads": 8}).special[3]
    assert isinstance(expand, StateShape) and (expand.conv_elements, expand.recurrent_elements) == (160 * 3, 1024)
    # FalconH1Config's defaults: 32 layers; head_dim = 4096 / 32 = 128; intermediate = mamba_d_ssm = 1024,
    # mamba_d_head = 1024 // 128 = 8: conv (1024 + 2 x 1 x 256) = 1536 x 4; SSM 128 x 8 x 256.
    default = model_shape_from_hf({"model_type": "falcon_h1"})
    assert kinds(default) == ["full"] * 32 + ["state"] * 32 and (default.n_kv_heads, default.head_dim) == (8, 128)
    assert isinstance(default.special[32], StateShape)
    assert (default.special[32].conv_elements, default.special[32].recurrent_elements) == (1536 * 4, 128 * 8 * 256)
    assert "mamba_d_ssm=1024 (transformers FalconH1Config default)" in default.defaults
    # The report says how the layers were counted.
    code = main(["memory", "--hf-config", str(write(tmp_path, FALCON_H1)), "--context", "100", "--max-step", "4"])
    out = capsys.readouterr().out
    assert code == 0 and "6 layers (3 full + 3 state)" in out and "76,800 B" in out
    assert ("note: Falcon-H1 (model_type 'falcon_h1') runs full attention and a Mamba-2 mixer side by side in each "
            "of its 3 'hybrid' layers: kvcore counts them as 3 attention layers (0-2) and 3 state layers (3-5)") in out


@pytest.mark.parametrize(
    ("config", "error", "message"),
    [
        ({**BAMBA, "attn_layer_indices": [4]}, kvcore.InvalidArgumentError,
         r"attn_layer_indices = \[4\]: must be a list of layer indices in \[0, 4\)"),
        ({**BAMBA, "layer_types": ["full_attention"] * 4}, kvcore.InvalidArgumentError,
         r"layer_types = .*: contradicts attn_layer_indices = \[2\], from which transformers BambaConfig derives"),
        ({**JAMBA, "attn_layer_offset": 3}, kvcore.InvalidArgumentError,
         r"attn_layer_offset = 3: must be < attn_layer_period = 3"),
        ({**JAMBA, "layers_block_type": ["attention"] * 6}, kvcore.InvalidArgumentError,
         r"layers_block_type = .*: contradicts attn_layer_period = 3, attn_layer_offset = 1"),
        ({**NEMOTRON_H, "num_hidden_layers": 6}, kvcore.InvalidArgumentError,
         r"num_hidden_layers = 6: contradicts the layer list, which has 5 layers"),
        ({**NEMOTRON_H, "hybrid_override_pattern": "M-X*E"}, kvcore.InvalidArgumentError,
         r"hybrid_override_pattern\[2\] = 'X': must be one of 'M' \(Mamba-2\)"),
        ({**NEMOTRON_H, "layers_block_type": ["mamba"] * 5}, kvcore.InvalidArgumentError,
         r"hybrid_override_pattern = 'M-M\*E': contradicts layers_block_type"),
        ({**NEMOTRON_H, "ssm_state_size": None}, kvcore.InvalidArgumentError, r"ssm_state_size: missing"),
        ({**FALCON_H1, "mamba_d_head": 12}, kvcore.InvalidArgumentError,
         r"mamba_d_head = 12: mamba_n_heads x mamba_d_head must equal mamba_d_ssm = 96"),
        # FalconH1Config cannot load a file that lists its layer types (every layer is "hybrid").
        ({**FALCON_H1, "layer_types": ["hybrid"] * 3}, kvcore.InvalidArgumentError,
         r"layer_types = .*: transformers FalconH1Config makes every layer 'hybrid'"),
        # "hybrid" layers of any other family stay refused.
        ({**QWEN3_5_TEXT, "model_type": "brand_new", "layer_types": [FULL, "hybrid"] * 2}, kvcore.NotSupportedError,
         r"layer_types\[1\] = 'hybrid': kvcore models only .*'hybrid' layers of model_type 'falcon_h1'"),
        # A hybrid layer pattern of a family kvcore does not know is refused, not read as all attention.
        ({**NEMOTRON_H, "model_type": "brand_new"}, kvcore.NotSupportedError,
         r"hybrid_override_pattern = 'M-M\*E': a hybrid layer pattern .*; kvcore reads it for model_type "
         r"'nemotron_h' only, not 'brand_new'"),
        ({**QWEN3_5_TEXT, "model_type": "brand_new", "layers_block_type": ["mamba", "attention"] * 2},
         kvcore.NotSupportedError, r"layers_block_type = .*: a hybrid layer pattern"),
        # "mlp" layers hold nothing in Nemotron-H; elsewhere they may mean something else (Dory's are half a layer).
        ({**QWEN3_5_TEXT, "model_type": "brand_new", "layer_types": [FULL, "mlp"] * 2}, kvcore.NotSupportedError,
         r"layer_types\[1\] = 'mlp': kvcore models only .*'mlp' and 'moe' layers of model_type 'nemotron_h'"),
    ],
)  # fmt: skip
def test_bad_hybrid_configs_are_named(config: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        model_shape_from_hf(config)


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        # Zamba shares attention blocks across its Mamba layers: no formula, refused.
        ({"model_type": "zamba"}, kvcore.NotSupportedError,
         r"mamba_d_state = 8: state-space \(Mamba\) layers .*; kvcore reads it for model_type 'bamba', "
         r"'falcon_h1', 'granitemoehybrid' and 'jamba' only, not 'zamba'"),
        ({"mamba_d_head": 5}, kvcore.InvalidArgumentError,
         r"mamba_d_head = 5: mamba_n_heads x mamba_d_head must equal mamba_expand x hidden_size = 128"),
        ({"mamba_d_conv": None}, kvcore.InvalidArgumentError, r"mamba_d_conv: missing"),
        ({"layer_types": ["mamba", "attention", "moe_only", "mamba"]}, kvcore.NotSupportedError,
         r"layer_types\[2\] = 'moe_only': kvcore models only"),
    ],
)  # fmt: skip
def test_bad_state_configs_are_named(changes: dict[str, Any], error: type[Exception], message: str) -> None:
    source = {"model_type": "granitemoehybrid", "num_hidden_layers": 4, "num_attention_heads": 4,
              "hidden_size": 64, "max_position_embeddings": 4096, "layer_types": ["mamba", "attention"] * 2,
              "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_d_state": 8, "mamba_d_conv": 4, "mamba_n_groups": 1,
              "mamba_expand": 2}  # fmt: skip
    with pytest.raises(error, match=message):
        model_shape_from_hf({**source, **changes})


def test_state_slots_are_checked() -> None:
    shape = model_shape_from_hf(tiny("Lfm2Config", num_hidden_layers=2, full_attn_idxs=[1]))
    with pytest.raises(kvcore.InvalidArgumentError, match=r"state_slots = 0: must be >= 1"):
        shape.cache_config(100, state_slots=0)
    assert default_state_slots(1) == 2 and default_state_slots(512) == 9
