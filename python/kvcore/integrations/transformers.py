"""A Hugging Face transformers ``Cache`` backed by kvcore.

``KVCoreCache(model.config, max_step=...)`` is a drop-in cache for decoder models
whose layers are ``full_attention``, ``sliding_attention`` (Gemma 2 / Gemma 3
style), ``chunked_attention`` (Llama 4), KV-shared (Gemma 3n's last layers) or
recurrent-state layers (``linear_attention``: Qwen3-Next's gated DeltaNet, Granite
4.0-H's Mamba-2; ``conv``: LFM2's short convolutions), mixed freely. A chunked layer is
a ring of ``chunk + max_step - 1`` rows that returns the keys of its chunk; a KV-shared
layer holds nothing and is never updated (the model hands it the K/V its source layer's
update returned, as with ``DynamicCache``; the cache keeps those alive for the forward).
One ``kvcore.SequenceCache`` keeps one logical length for
the whole model; each layer's K/V live in a torch pool laid out by kvcore plans
(``kvcore.torch.pool``). A sliding layer holds exactly
``window + max_step - 1`` rows (plus its sinks), and the cache can rewind to
``max_step`` tokens below the longest length it reached even after the window
wrapped, which transformers' own
sliding layers refuse unless they keep the whole history.

How a forward maps onto kvcore: a forward of ``T`` tokens is one kvcore step.
It is begun by ``attention_masks``, ``begin_verify``, ``begin_tree`` or by layer 0
(its update, or its first state call for a state layer; layer 0 replaces a step an
interrupted forward left unfinished, unless it is the very step it needs);
``get_mask_sizes`` begins nothing (it previews the step's plan). Every
layer must then follow in order with the same ``T``; each layer's K/V are
checked before its rows are written, and the update of the last layer commits
the step. An error in a layer's update aborts the step (kvcore's ``abort``), so
the cache is as before the forward (``kvcore.forward_step``). So the
length (``get_seq_length``) changes only when a whole forward succeeded, and a
forward may carry at most ``max_step`` tokens: feed longer prompts with
``generate(..., prefill_chunk_size=cache.max_step)`` or with ``prefill`` below.

Masks come from the step's plan: ``get_mask_sizes`` reports the plan's read
(one range of positions for a layer without sinks), and each layer returns
exactly those keys in position order, so transformers' masks agree and eager
and sdpa attention give DynamicCache's results. Attention sinks (``sinks > 0``)
keep the first positions visible forever, which transformers' masks cannot
express: for such a cache ``get_mask_sizes`` raises, and you pass the masks from
``cache.attention_masks(...)`` (built from the plan and kvcore's visibility
rule) yourself (``prefill`` does).

Draft trees (docs/trees.md): ``cache.begin_tree(parents)`` makes the next forward
a tree step of ``N = len(parents)`` tokens (token ``i`` at position ``length +
depth(i)``; pass ``position_ids=step.positions`` and the tree's masks from
``cache.attention_masks(model.config, N)``, as ``verify_tree`` does); the last
layer does not commit it, and ``cache.commit_tree(accepted)`` commits the
accepted root path and performs the row copies it returns.

Recurrent-state layers (hybrids) implement transformers' linear-attention cache API
(``get_conv_state`` / ``update_conv_state`` / ``get_recurrent_state`` /
``update_recurrent_state`` / ``has_previous_state``) over kvcore's State slots
(``kvcore.torch.state_slots``): ``state_slots`` snapshots per layer, ``slot(p) = p %
D``. A forward reads the state after its first position minus one and keeps its last
state (a plain step) or the state after each of its tokens (a verify step:
``begin_verify``, or every forward of ``T <= D - 1`` tokens after
``activate_past_recording``), so ``crop`` is exact wherever ``can_rewind`` allows.
A state call carries no token count: a forward whose layer 0 holds a state takes its
``T`` from the forward's ``get_mask_sizes`` (transformers' mask functions call it
first) or from a begun step. A layer's first state call of a forward serves it; when
the model's last layer holds a state, the forward commits at that call, and an error
in its later calls rewinds the cache to where the forward began. Exact speculative
decoding on these models: ``kvcore.integrations.transformers_speculative``.

Storage: sliding layers without sinks are mirrored by default
(``mirror_rings=True``): a window that wraps round the ring is returned as a
view, never gathered, at the price of ``window + max_step - 2`` more rows per
such layer. A layer with sinks gets no mirror: its read (sinks, then window) is
two spans and is gathered anyway.

Tested with transformers 5.24.0 and torch 2.13.0 (see docs/transformers.md).
Other 5.x releases are accepted only if the Cache API this module relies on is
there; anything else raises NotSupportedError at import rather than risk wrong
output.

This module is the public entry: every public name of the integration is importable from
here, each defined in a module of one concept beside it:

- ``kvcore.integrations.transformers_cache``: ``KVCoreCache``, its construction, facts,
  ``update`` and length changes; its base classes ``..._steps`` (the step of one forward),
  ``..._trees`` (draft trees and verify steps), ``..._state_calls`` (the recurrent-state
  layers' calls) and ``..._masks`` (mask sizes and ``attention_masks``);
- ``kvcore.integrations.transformers_layers``: the layer classes (``KVCoreLayer``,
  ``KVCoreSharedLayer``, ``KVCoreStateLayer``, ``KVCoreEmptyLayer``);
- ``kvcore.integrations.transformers_prefill``: ``prefill``, ``cache_keyword``;
- ``kvcore.integrations.transformers_speculative``: ``verify_tree``, ``speculative_generate``,
  ``prompt_lookup_generate`` and the drafters;
- ``kvcore.integrations.transformers_config``: ``cache_config_for`` and the layer type names;
- ``kvcore.integrations.transformers_versions``: ``check_transformers``, the one version gate;
- ``kvcore.integrations.transformers_batch``: continuous batching (``generate_batch``, its manager),
  imported on first use.
"""

from __future__ import annotations

from typing import Any

try:
    import numpy as np  # noqa: F401
    import torch  # noqa: F401
    import packaging  # noqa: F401  # the version gate's (transformers_versions.py)
    import transformers  # noqa: F401  # named in the message when it is missing
    from transformers import cache_utils  # noqa: F401
except ModuleNotFoundError as _missing:  # name the extra (private: Python deletes the name after the block)
    raise ModuleNotFoundError(
        f"kvcore.integrations.transformers needs torch, transformers and packaging ({_missing.name!r} is missing): "
        'pip install "kvcore[transformers]"',
        name=_missing.name,
    ) from _missing

# The names of the last release's single module, from the modules of one concept each.
from kvcore._core import LayerPolicy, SequenceCache, Step
from kvcore._errors import InternalError, InvalidArgumentError, InvalidStateError, NotSupportedError
from kvcore.forward_step import ForwardStep
from kvcore.integrations.transformers_config import (
    DUMMY,
    FULL,
    SLIDING,
    STATE_TYPES,
    cache_config_for,
    hybrid_state_layers,
)
from kvcore.integrations.transformers_cache import KVCoreCache
from kvcore.integrations.transformers_layers import KVCoreEmptyLayer, KVCoreLayer, KVCoreSharedLayer, KVCoreStateLayer
from kvcore.integrations.transformers_prefill import cache_keyword, prefill
from kvcore.integrations.transformers_speculative import (
    Drafter,
    draft_model_drafter,
    lookup_drafts,
    prompt_lookup_drafter,
    prompt_lookup_generate,
    speculative_generate,
    state_layers_token_by_token,
    verify_tree,
)
from kvcore.integrations.transformers_state import read_state, state_name, write_conv_states, write_recurrent_state
from kvcore.integrations.transformers_versions import SUPPORTED_TRANSFORMERS, TESTED_TRANSFORMERS, check_transformers
from kvcore.quantized import kv_format
from kvcore.torch.pool import TorchKVPool
from kvcore.torch.quantized import TorchQuantizedKVPool
from kvcore.torch.state_slots import SlotSpan, TorchStateSlots
from kvcore.torch.step_layout import StepLayout

__all__ = [
    "FULL",
    "Drafter",
    "KVCoreCache",
    "KVCoreEmptyLayer",
    "KVCoreLayer",
    "KVCoreSharedLayer",
    "KVCoreStateLayer",
    "SLIDING",
    "SUPPORTED_TRANSFORMERS",
    "TESTED_TRANSFORMERS",
    "cache_config_for",
    "cache_keyword",
    "check_transformers",
    "draft_model_drafter",
    "lookup_drafts",
    "prefill",
    "prompt_lookup_drafter",
    "prompt_lookup_generate",
    "speculative_generate",
    "state_layers_token_by_token",
    "verify_tree",
]

# Continuous batching lives in kvcore.integrations.transformers_batch; these names are served from
# here too, imported on first use (transformers_batch does not import this module: no cycle).
_BATCHING = ("BatchCounters", "BatchOptions", "KVCoreBatchingManager", "generate_batch", "init_kvcore_batching")


def __getattr__(name: str) -> Any:
    if name in _BATCHING:
        from kvcore.integrations import transformers_batch

        return getattr(transformers_batch, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
