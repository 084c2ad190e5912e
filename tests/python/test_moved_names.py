"""Every name the moved modules exported is importable from its old path (issue 41).

``kvcore/integrations/transformers.py`` became one module per concept behind the same
front module, ``kvcore/hf_config.py`` a package of its concepts, three version gates one
(``kvcore.integrations.transformers_versions``), and ``kvcore.integrations.hf_layers``
``kvcore.integrations.transformers_config`` (the old path warns, docs/deprecations.md).
Each list below is what the old path exported, written out by hand from the last release:
a name dropped from a front module fails here, by name.
"""

from __future__ import annotations

import importlib
import pickle
import re
import sys
from pathlib import Path

import pytest
from needs import need

need("torch", reason="the transformers integration needs torch")
transformers = need("transformers", reason="the transformers integration needs transformers")

import kvcore  # noqa: E402

# kvcore.integrations.transformers, as the single module of 1,045 lines exported them (its public
# module-level names), and what it exports since: speculative decoding and its drafters.
TRANSFORMERS = [
    "DUMMY", "FULL", "ForwardStep", "InternalError", "InvalidArgumentError", "InvalidStateError", "KVCoreCache",
    "KVCoreEmptyLayer", "KVCoreLayer", "KVCoreSharedLayer", "KVCoreStateLayer", "LayerPolicy", "NotSupportedError",
    "SLIDING", "STATE_TYPES", "SUPPORTED_TRANSFORMERS", "SequenceCache", "SlotSpan", "Step", "StepLayout",
    "TESTED_TRANSFORMERS", "TorchKVPool", "TorchQuantizedKVPool", "TorchStateSlots", "cache_config_for",
    "cache_keyword", "check_transformers", "hybrid_state_layers", "kv_format", "prefill", "read_state",
    "state_layers_token_by_token", "state_name", "verify_tree", "write_conv_states", "write_recurrent_state",
    # served on first use from kvcore.integrations.transformers_batch (was hf_batch)
    "BatchCounters", "BatchOptions", "KVCoreBatchingManager", "generate_batch", "init_kvcore_batching",
]  # fmt: skip
TRANSFORMERS_ADDED = [
    "Drafter", "draft_model_drafter", "lookup_drafts", "prompt_lookup_drafter", "prompt_lookup_generate",
    "speculative_generate",
]  # fmt: skip
SPECULATIVE = [
    "EXACT_PER_POSITION", "InvalidArgumentError", "KVCoreCache", "NODE_BY_NODE_MIXERS", "SCAN_FROM_ZERO",
    "TOKEN_BY_TOKEN_MIXERS", "cache_keyword", "draft_model_drafter", "lookup_drafts", "prefill",
    "prompt_lookup_drafter", "prompt_lookup_generate", "speculative_generate", "state_layers_token_by_token",
]  # fmt: skip
HF_CONFIG = [
    "CHUNKED", "ChunkedLayer", "DEFAULT_VERIFY_TOKENS", "EmptyLayer", "FULL", "HFSource", "HYBRID", "MAX_CONTEXT",
    "ModelShape", "SLIDING", "SharedLayer", "SpecialLayer", "StateShape", "config_from_hf", "default_context",
    "default_state_slots", "load_hf_config", "model_shape_from_hf",
    "_FAMILIES",  # the family table, which tests/python/test_transformers_hf_config.py reads
]  # fmt: skip
HF_LAYERS = ["CHUNKED", "DUMMY", "FULL", "HYBRID", "SLIDING", "STATE_TYPES", "cache_config_for", "hybrid_state_layers"]
VERSIONS = ["SUPPORTED_TRANSFORMERS", "TESTED_TRANSFORMERS", "check_transformers"]
# The two gates merged into transformers_versions (their modules are gone; their names are not).
RELEASE = ["BATCHING_SUPPORTED", "CACHE_SUPPORTED", "TESTED", "check_release"]
HF_BATCH_VERSIONS = ["SUPPORTED", "TESTED", "check_batching_support"]  # hf_batch.versions' names
HF_BATCH = [
    "SUPPORTED", "TESTED", "BatchCounters", "BatchOptions", "KVCoreBatchingManager", "KVCorePagedCache",
    "check_batching_support", "generate_batch", "init_kvcore_batching",
]  # fmt: skip


def names(module: str, wanted: list[str]) -> list[str]:
    mod = importlib.import_module(module)
    return [name for name in wanted if not hasattr(mod, name)]


@pytest.mark.parametrize(("module", "wanted"), [
    ("kvcore.integrations.transformers", TRANSFORMERS + TRANSFORMERS_ADDED),
    ("kvcore.integrations.transformers_speculative", SPECULATIVE + ["verify_tree"]),
    ("kvcore.hf_config", HF_CONFIG),
    ("kvcore.integrations.transformers_config", HF_LAYERS),
    ("kvcore.integrations.transformers_versions", VERSIONS + RELEASE + ["check_batching_support"]),
    ("kvcore.integrations.transformers_batch", HF_BATCH + HF_BATCH_VERSIONS),
], ids=lambda x: x if isinstance(x, str) else "")  # fmt: skip
def test_every_name_of_the_old_path_is_importable(module: str, wanted: list[str]) -> None:
    assert names(module, wanted) == []


def test_the_front_module_serves_the_concept_modules_objects() -> None:
    front = importlib.import_module("kvcore.integrations.transformers")
    for module in ("transformers_cache", "transformers_prefill", "transformers_speculative", "transformers_layers",
                   "transformers_config", "transformers_versions"):  # fmt: skip
        mod = importlib.import_module(f"kvcore.integrations.{module}")
        for name in getattr(mod, "__all__"):
            if hasattr(front, name):
                assert getattr(front, name) is getattr(mod, name), (module, name)
    assert set(TRANSFORMERS_ADDED) <= set(front.__all__)
    # A reference to the class by its old dotted path still resolves (pickle stores the class by name).
    cache = front.KVCoreCache
    assert pickle.loads(pickle.dumps(cache)) is cache
    assert cache.__module__ == "kvcore.integrations.transformers_cache"


@pytest.mark.parametrize(("old", "new", "wanted"), [
    ("kvcore.integrations.hf_layers", "kvcore.integrations.transformers_config", HF_LAYERS),
    ("kvcore.integrations.hf_batch", "kvcore.integrations.transformers_batch", HF_BATCH),
])  # fmt: skip
def test_an_old_transformers_path_warns_and_serves_every_name(
    monkeypatch: pytest.MonkeyPatch, old: str, new: str, wanted: list[str]
) -> None:
    monkeypatch.delitem(sys.modules, old, raising=False)
    message = f"{old} is deprecated: import {new} (removed in kvcore 0.2.0)"
    with pytest.warns(DeprecationWarning, match=re.escape(message)):
        module = importlib.import_module(old)
    for name in wanted:
        assert getattr(module, name) is getattr(importlib.import_module(new), name), name
    assert f"`{old}`" in (Path(__file__).resolve().parents[2] / "docs" / "deprecations.md").read_text()


# --- one kind -> policy mapping for both config paths -----------------------------------------


def test_both_config_paths_plan_each_kind_with_one_function(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvcore.hf_config import policies, shapes
    from kvcore.integrations import transformers_config

    assert transformers_config.layer_config is shapes.layer_config is policies.layer_config
    calls: list[str] = []

    def counting(kind: str, *args: object, **kwargs: object) -> kvcore.LayerConfig:
        calls.append(kind)
        return policies.layer_config(kind, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(shapes, "layer_config", counting)
    monkeypatch.setattr(transformers_config, "layer_config", counting)
    config = transformers.Gemma2Config(num_hidden_layers=4, hidden_size=64, intermediate_size=64, head_dim=16,
                                       num_attention_heads=4, num_key_value_heads=2, sliding_window=8)  # fmt: skip
    from_object, _ = transformers_config.cache_config_for(config, capacity=64)
    assert calls == ["sliding", "full"] * 2
    from_file = kvcore.config_from_hf(config.to_dict(), context=64)
    assert calls == ["sliding", "full"] * 4
    assert [layer.policy for layer in from_object.layers] == [layer.policy for layer in from_file.layers]


@pytest.mark.parametrize(("kind", "kwargs", "policy"), [
    ("full", {}, "Flat()"),
    ("sliding", {"window": 8, "sinks": 2}, "Ring(window=8, sinks=2)"),
    ("sliding", {"window": 8, "all_flat": True}, "Flat()"),
    ("chunked", {"chunk": 16}, "Chunked(chunk=16)"),
    ("shared", {"source": 1}, "Shared(source=1)"),
    ("state", {"state_slots": 5}, "State(slots=5)"),
    ("empty", {}, "Flat()"),
])  # fmt: skip
def test_layer_config_plans_each_kind(kind: str, kwargs: dict[str, object], policy: str) -> None:
    from kvcore.hf_config import layer_config

    layer = layer_config(kind, 2, 16, **kwargs)  # type: ignore[arg-type]
    assert str(layer.policy) == policy


def test_layer_config_refuses_an_unknown_kind_or_a_missing_argument() -> None:
    from kvcore.hf_config import layer_config

    with pytest.raises(kvcore.InvalidArgumentError, match="layer kind 'ring': must be one of 'full', 'sliding'"):
        layer_config("ring", 2, 16)
    with pytest.raises(kvcore.InvalidArgumentError, match="a 'sliding' layer needs its window"):
        layer_config("sliding", 2, 16)
