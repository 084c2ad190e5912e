"""kvcore.hf_config against transformers' own reading of the same config: which layers slide, and how far.

A config is built with transformers' config class (small sizes, no weights) and
written out as a config.json would hold it: ``to_dict()``, ``to_diff_dict()``
(only what differs from the class defaults) and, for the families hf_config
knows by name, without ``layer_types`` (older files leave it out and the family's
rule decides). The reference is transformers reading that dict back: the layer
types and windows of ``cache_utils.get_layer_types_and_kwargs`` and the layer
classes ``DynamicCache(config=...)`` builds. ``config_from_hf`` must give a Ring
of that window exactly where transformers slides, and Flat elsewhere.

Every other family transformers 5.24 ships with sliding layers must either agree
or be refused with a kvcore error: never a silent disagreement.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from typing import Any, Optional

import pytest
from needs import need

import kvcore
from kvcore.hf_config import _FAMILIES, config_from_hf, model_shape_from_hf

S, F = "sliding_attention", "full_attention"
SMALL = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=256)


def transformers_module() -> Any:
    return need("transformers", reason="the comparison needs transformers")


# --- transformers' view ------------------------------------------------------------------


def transformers_windows(config: Any) -> list[Optional[Any]]:
    """Per layer: the window of a sliding layer, None for a full one, else the layer type."""
    from transformers import cache_utils

    types, kwargs = cache_utils.get_layer_types_and_kwargs(config.get_text_config(decoder=True))
    return [kw["sliding_window"] if t == S else None if t == F else t for t, kw in zip(types, kwargs)]


def dynamic_cache_windows(config: Any) -> list[Optional[int]]:
    """The layers DynamicCache(config=...) builds: a sliding-window layer's window, or None."""
    from transformers import DynamicCache, cache_utils

    out: list[Optional[int]] = []
    for layer in DynamicCache(config=config).layers:
        if isinstance(layer, cache_utils.DynamicSlidingWindowLayer):
            out.append(int(layer.sliding_window))
        else:
            assert type(layer) is cache_utils.DynamicLayer, type(layer)
            out.append(None)
    return out


def kvcore_view(shape: Any) -> list[Any]:
    """Per layer, as transformers_windows names it: a sliding window, None for full, else the
    transformers layer type ("chunked_attention", "dummy" for a KV-shared layer or one without
    attention or state, "linear_attention" or "conv" for a recurrent-state layer)."""
    names = {"chunked": "chunked_attention", "shared": "dummy", "empty": "dummy"}
    out: list[Any] = []
    for i, window in enumerate(shape.windows):
        kind = shape.layer_kind(i)
        if kind == "state":
            out.append("conv" if shape.special[i].kind == "short_conv" else "linear_attention")
        else:
            out.append(names.get(kind, window))
    return out


def kvcore_windows(source: dict[str, Any]) -> list[Optional[int]]:
    """Per layer of config_from_hf's CacheConfig: the Ring's window, or None for Flat."""
    cfg = config_from_hf(source, context=4096)
    return [lc.policy.window if lc.policy.is_ring else None for lc in cfg.layers]


# --- the families hf_config knows by name ------------------------------------------------

# (label, transformers config class, kwargs): mixed sliding/full families first.
CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("gemma2", "Gemma2Config", dict(num_hidden_layers=7, sliding_window=64, head_dim=16)),
    ("gemma2-layer-types", "Gemma2Config",
     dict(num_hidden_layers=4, sliding_window=64, head_dim=16, layer_types=[F, S, S, F])),
    ("gemma3_text", "Gemma3TextConfig", dict(num_hidden_layers=13, sliding_window=64, head_dim=16)),
    ("gemma3_text-pattern-3", "Gemma3TextConfig",
     dict(num_hidden_layers=8, sliding_window=64, head_dim=16, sliding_window_pattern=3)),
    ("cohere2", "Cohere2Config", dict(num_hidden_layers=9, sliding_window=64)),
    ("cohere2-pattern-3", "Cohere2Config", dict(num_hidden_layers=7, sliding_window=64, sliding_window_pattern=3)),
    ("gpt_oss", "GptOssConfig", dict(num_hidden_layers=5, sliding_window=32, head_dim=16, num_local_experts=4)),
    ("qwen2-sliding-from-layer-3", "Qwen2Config",
     dict(num_hidden_layers=6, sliding_window=64, use_sliding_window=True, max_window_layers=3)),
    ("qwen2-no-sliding", "Qwen2Config", dict(num_hidden_layers=4, sliding_window=64)),
    ("mistral", "MistralConfig", dict(num_hidden_layers=3, sliding_window=64)),
    ("mistral-no-window", "MistralConfig", dict(num_hidden_layers=3, sliding_window=None)),
    ("llama", "LlamaConfig", dict(num_hidden_layers=3)),
]  # fmt: skip


def serialized(config: Any, *, known_family: bool) -> Iterator[tuple[str, dict[str, Any]]]:
    """The dicts a config.json of this config could hold."""
    full = config.to_dict()
    yield "to_dict", full
    yield "to_diff_dict", config.to_diff_dict()
    if known_family and "layer_types" in full:
        yield "without layer_types", {k: v for k, v in full.items() if k != "layer_types"}


@pytest.mark.parametrize(("label", "cls", "kwargs"), CASES, ids=[c[0] for c in CASES])
def test_config_from_hf_slides_exactly_where_transformers_does(label: str, cls: str, kwargs: dict[str, Any]) -> None:
    transformers = transformers_module()
    config_class = getattr(transformers, cls)
    config = config_class(**{**SMALL, **kwargs})
    assert config.model_type in _FAMILIES  # a family hf_config reads by name
    for how, source in serialized(config, known_family=True):
        reread = config_class.from_dict(source)  # transformers' reading of the same dict
        want = transformers_windows(reread)
        assert dynamic_cache_windows(reread) == want, (label, how)
        assert kvcore_windows(source) == want, (label, how, source.get("layer_types"))
    if label.startswith(("gemma", "cohere2", "gpt_oss", "qwen2-sliding")):  # the mixed families
        assert None in want and any(w is not None for w in want), want


def test_multimodal_gemma3_reads_its_text_config() -> None:
    transformers = transformers_module()
    text = transformers.Gemma3TextConfig(**SMALL, num_hidden_layers=7, sliding_window=64, head_dim=16)
    config = transformers.Gemma3Config(text_config=text.to_dict())
    for how, source in serialized(config, known_family=False):
        want = transformers_windows(transformers.Gemma3Config.from_dict(source))
        assert kvcore_windows(source) == want == [64] * 5 + [None, 64], how


# --- every family transformers ships with sliding layers ----------------------------------


def sliding_families() -> list[str]:
    """model_types whose transformers config class mentions sliding_attention layers."""
    try:
        import transformers
    except ImportError:
        return []
    root = os.path.dirname(transformers.__file__)
    out = []
    for path in sorted(glob.glob(os.path.join(root, "models", "*", "configuration_*.py"))):
        with open(path, encoding="utf-8") as f:
            if S in f.read():
                out.append(os.path.basename(path)[len("configuration_") : -len(".py")])
    return out


def test_every_sliding_family_agrees_or_is_refused_never_silently_wrong() -> None:
    transformers_module()
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    families = sliding_families()
    assert len(families) >= 20  # the scan found transformers' sliding families
    agreed, refused = [], []
    for family in families:
        if family not in CONFIG_MAPPING:
            continue  # a config class without an AutoConfig entry (e.g. a sub-config)
        config = CONFIG_MAPPING[family]()  # the class defaults; configs hold no weights
        want = transformers_windows(config)
        for how, source in serialized(config, known_family=family in _FAMILIES):
            try:
                got = kvcore_view(model_shape_from_hf(source))
            except kvcore.KVCacheError:
                refused.append((family, how))
                continue
            assert got == want, (family, how)
            agreed.append((family, how))
    agreed_families = {f for f, _ in agreed}
    # The mixed sliding/full families hf_config must read, not refuse.
    assert {"gemma2", "gemma3", "cohere2", "gpt_oss", "neomme"} <= agreed_families, sorted(agreed_families)
    assert len(agreed_families) >= 20


# --- hybrid families: which layers are attention, recurrent state, or nothing -----------------

# (label, transformers config class, kwargs): each family whose recurrent state hf_config knows.
HYBRIDS: list[tuple[str, str, dict[str, Any]]] = [
    ("qwen3_next", "Qwen3NextConfig", dict(num_hidden_layers=6, full_attention_interval=3, num_experts=4,
                                           num_experts_per_tok=2)),
    ("qwen3_5_text", "Qwen3_5TextConfig", dict(num_hidden_layers=6, full_attention_interval=3)),
    ("lfm2", "Lfm2Config", dict(num_hidden_layers=5, full_attn_idxs=[1, 4])),
    ("granitemoehybrid", "GraniteMoeHybridConfig",
     dict(num_hidden_layers=4, layer_types=["mamba", "attention", "mamba", "mamba"], mamba_n_heads=8, mamba_d_head=16,
          num_local_experts=4, num_experts_per_tok=2)),
    ("bamba", "BambaConfig", dict(num_hidden_layers=5, attn_layer_indices=[1, 3], mamba_n_heads=8)),
    ("bamba-all-mamba", "BambaConfig", dict(num_hidden_layers=3, mamba_n_heads=8)),
    ("jamba", "JambaConfig", dict(num_hidden_layers=7, attn_layer_period=3, attn_layer_offset=2, num_experts=4)),
    ("nemotron_h", "NemotronHConfig",
     dict(hybrid_override_pattern="M-M*EM", mamba_num_heads=4, mamba_head_dim=16, n_groups=1)),
    ("nemotron_h-default-layers", "NemotronHConfig", dict(mamba_num_heads=4, mamba_head_dim=16, n_groups=1)),
    # Every layer "hybrid": attention and Mamba-2 side by side (see planned_view).
    ("falcon_h1", "FalconH1Config", dict(num_hidden_layers=3, mamba_d_ssm=64, mamba_n_heads=4, mamba_d_state=8)),
    ("falcon_h1-expand", "FalconH1Config",
     dict(num_hidden_layers=2, mamba_d_ssm=None, mamba_n_heads=8, mamba_n_groups=2, mamba_d_state=4)),
]  # fmt: skip


def planned_view(types: list[Any]) -> list[Any]:
    """transformers_windows as kvcore plans it: a "hybrid" layer (Falcon-H1) is a full-attention layer
    (None) at its index plus a "linear_attention" state layer appended after the model's layers, as
    kvcore.integrations.transformers_config.cache_config_for builds it."""
    hybrids = sum(t == "hybrid" for t in types)
    return [None if t == "hybrid" else t for t in types] + ["linear_attention"] * hybrids


def hybrid_sources(label: str, config: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """to_dict, to_diff_dict, and the older spellings a published config.json may have."""
    full = config.to_dict()
    yield "to_dict", full
    yield "to_diff_dict", config.to_diff_dict()
    if label == "granitemoehybrid":  # GraniteMoeHybridConfig.attribute_map: layers_block_type is layer_types
        yield "layers_block_type", {**{k: v for k, v in full.items() if k != "layer_types"},
                                    "layers_block_type": full["layer_types"]}
    if label.startswith("nemotron_h"):  # a published Nemotron-H config.json: a pattern and num_hidden_layers
        pattern = config.hybrid_override_pattern
        yield "hybrid_override_pattern", {**{k: v for k, v in full.items() if k != "layers_block_type"},
                                          "hybrid_override_pattern": pattern, "num_hidden_layers": len(pattern)}
    if label.startswith("qwen3"):  # without layer_types: full_attention_interval decides
        yield "without layer_types", {k: v for k, v in full.items() if k != "layer_types"}


@pytest.mark.parametrize(("label", "cls", "kwargs"), HYBRIDS, ids=[c[0] for c in HYBRIDS])
def test_hybrid_layer_kinds_are_transformers_own(label: str, cls: str, kwargs: dict[str, Any]) -> None:
    # Which layers are attention, recurrent state or hold nothing ("dummy": Nemotron-H's "-" and "E"
    # layers), exactly as cache_utils.get_layer_types_and_kwargs reads the same dict back.
    transformers = transformers_module()
    config_class = getattr(transformers, cls)
    config = config_class(**{**SMALL, **kwargs})
    for how, source in hybrid_sources(label, config):
        want = planned_view(transformers_windows(config_class.from_dict(source)))
        assert kvcore_view(model_shape_from_hf(source)) == want, (label, how)
        assert "linear_attention" in want or "conv" in want, want
    if label.startswith("nemotron_h"):
        assert "dummy" in want and None in want, want
    if label.startswith("falcon_h1"):  # n attention layers, then their n states
        from kvcore.integrations.transformers_config import cache_config_for

        n = config.num_hidden_layers
        assert want == [None] * n + ["linear_attention"] * n, want
        assert len(cache_config_for(config)[0].layers) == 2 * n


def test_qwen3_5_reads_its_text_config() -> None:
    transformers = transformers_module()
    text = transformers.Qwen3_5TextConfig(**SMALL, num_hidden_layers=4, head_dim=16)
    config = transformers.Qwen3_5Config(text_config=text.to_dict())
    for how, source in serialized(config, known_family=False):
        want = transformers_windows(transformers.Qwen3_5Config.from_dict(source))
        assert kvcore_view(model_shape_from_hf(source)) == want == ["linear_attention"] * 3 + [None], how


# --- per_layer_config: transformers' heterogeneous configs -----------------------------------


def test_per_layer_sliding_windows_are_each_layers_window() -> None:
    transformers_module()
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    # NeoMME alternates a short and a long window by per_layer_config.
    config = CONFIG_MAPPING["neomme"](num_hidden_layers=8)
    source = config.to_dict()
    assert source["per_layer_config"]  # the windows really are per layer
    want = transformers_windows(type(config).from_dict(source))
    assert len({w for w in want if w is not None}) == 2
    assert kvcore_windows(source) == want


def base(**extra: Any) -> dict[str, Any]:
    return dict(model_type="brand_new", num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                head_dim=16, sliding_window=8, layer_types=[S, S, F, S], **extra)  # fmt: skip


def test_per_layer_sliding_window_without_transformers() -> None:
    assert model_shape_from_hf(base(per_layer_config={"01": {"sliding_window": 32}})).windows == (8, 32, None, 8)
    # A full layer stays full whatever its sliding_window (transformers builds it from layer_types).
    assert model_shape_from_hf(base(per_layer_config={"2": {"sliding_window": 32}})).windows == (8, 8, None, 8)
    # Fields that do not shape K/V are not kvcore's business.
    assert model_shape_from_hf(base(per_layer_config={"0": {"intermediate_size": 7, "skip": []}})).windows == (
        8, 8, None, 8,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("per_layer", "error", "message"),
    [
        ([1, 2], kvcore.InvalidArgumentError, r"per_layer_config: must be an object mapping layer indices"),
        ({"4": {}}, kvcore.InvalidArgumentError, r"per_layer_config key '4': must be a layer index in \[0, "),
        ({"x": {}}, kvcore.InvalidArgumentError, r"per_layer_config key 'x': must be a layer index"),
        ({"1": 3}, kvcore.InvalidArgumentError, r"per_layer_config\['1'\]: must be an object, not int"),
        ({"1": {"sliding_window": None}}, kvcore.InvalidArgumentError,
         r"per_layer_config\['1'\].sliding_window = None: contradicts layer 1, which slides"),
        ({"1": {"sliding_window": 0}}, kvcore.InvalidArgumentError,
         r"per_layer_config\['1'\].sliding_window = 0: must be >= 1"),
        ({"2": {"head_dim": 32}}, kvcore.NotSupportedError,
         r"per_layer_config\['2'\].head_dim = 32: layers with their own K/V shape"),
        ({"2": {"num_key_value_heads": 1}}, kvcore.NotSupportedError, r"\.num_key_value_heads = 1"),
        ({"0": {"skip": ["self_attn"]}}, kvcore.NotSupportedError, r"\.skip = \['self_attn'\]"),
    ],
)  # fmt: skip
def test_bad_per_layer_config_is_named(per_layer: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        model_shape_from_hf(base(per_layer_config=per_layer))


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("mamba_d_state", 16, r"mamba_d_state = 16: state-space \(Mamba\) layers .*not 'brand_new'"),
     ("block_types", ["recurrent", "attention"], r"block_types = \['recurrent', 'attention'\]: recurrent blocks"),
     ("layers_block_type", ["mamba", "attention", "mlp", "mamba"], r"layers_block_type = .*: a hybrid layer pattern"),
     ("hybrid_override_pattern", "M*-M", r"hybrid_override_pattern = 'M\*-M': a hybrid layer pattern")],
)  # fmt: skip
def test_hybrid_recurrent_models_are_refused_not_read_as_all_full(field: str, value: Any, message: str) -> None:
    # Without layer_types, these used to read as every layer full attention (no sliding_window).
    source = {k: v for k, v in base(**{field: value}).items() if k not in ("layer_types", "sliding_window")}
    with pytest.raises(kvcore.NotSupportedError, match=message):
        model_shape_from_hf(source)


@pytest.mark.parametrize("family", ["zamba", "zamba2", "minimax"])
def test_hybrids_without_a_state_formula_are_refused(family: str) -> None:
    # Zamba shares attention blocks across Mamba layers, MiniMax's linear attention has its own
    # state: kvcore has no formula for them, so their config.json is refused, never planned as
    # attention. (Falcon-H1's "hybrid" layers are served: see HYBRIDS.)
    transformers_module()
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config = CONFIG_MAPPING[family]()
    for how, source in serialized(config, known_family=False):
        with pytest.raises(kvcore.NotSupportedError, match=rf"not '{family}'|not those of '{family}'"):
            model_shape_from_hf(source)
