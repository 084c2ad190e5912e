"""Recurrent mixers run token by token (verify steps) or node by node (draft trees) inside a forward.

transformers' gated DeltaNet and Mamba layers compute only the last recurrent state of a
multi-token call, and every position of a call from the state before its first token. A
``KVCoreCache`` verify step keeps the state after each of its tokens, and a draft tree's
node reads its parent's state: ``state_layers_token_by_token(model, cache)`` wraps each
such mixer of ``model`` so that, inside those forwards, it runs one token at a time
(``KVCoreCache.state_positions`` / ``tree_node`` say which slots each call reads and keeps).
Used by ``KVCoreCache``'s ``verify_tree`` and by ``kvcore.integrations.transformers_speculative``
(which documents the cost per layer type). The cache is duck-typed here (this module sits
below ``kvcore.integrations.transformers``, which imports it).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable

import torch

from kvcore._errors import NotSupportedError

# model_type -> the attribute of a decoder layer holding its recurrent mixer, for the models whose
# mixer computes only its last recurrent state. LFM2 ("conv") needs none: its conv states come
# from update_conv_state's inputs, every position's exactly.
TOKEN_BY_TOKEN_MIXERS = {
    "qwen3_next": "linear_attn",
    "qwen3_5_text": "linear_attn",
    "granitemoehybrid": "mamba",
    "nemotron_h": "mixer",
    "bamba": "mamba",
    "jamba": "mamba",
    "falcon_h1": "mamba",
}
EXACT_PER_POSITION = ("lfm2",)
# The mixers that give each position's state from one call (EXACT_PER_POSITION) still run node by
# node in a draft tree, where a node's state follows its parent, not the node before it.
NODE_BY_NODE_MIXERS = {"lfm2": "conv"}
# Models whose mixer, given several tokens, scans them from a zero state and ignores the cached one
# (transformers 5.24's Jamba: ``mamba_selective_scan`` gets no initial state): a forward after the
# first one must run the mixer token by token, so their prompt is prefilled in verify steps.
SCAN_FROM_ZERO = ("jamba",)


def _mixers(model: Any, cache: Any) -> tuple[list[Any], bool]:
    """The recurrent mixers of ``model`` that a verify step or a draft tree must run token by
    token, and whether verify steps need it (False: only trees, ``NODE_BY_NODE_MIXERS``)."""
    if not cache.state_layers:
        return [], False
    text = model.config.get_text_config(decoder=True)
    model_type = getattr(text, "model_type", "")
    chains = model_type not in EXACT_PER_POSITION
    attr = TOKEN_BY_TOKEN_MIXERS.get(model_type) if chains else NODE_BY_NODE_MIXERS.get(model_type)
    layers = getattr(getattr(model, "model", None), "layers", None)
    if attr is None or layers is None:
        raise NotSupportedError(
            f"model_type {model_type!r}: kvcore does not know how its recurrent layers give the state after "
            f"each token of a verify step (it knows {sorted(TOKEN_BY_TOKEN_MIXERS) + list(EXACT_PER_POSITION)})"
        )
    mixers = []
    for state_layer in cache.state_layers:
        index = cache.model_layer(state_layer.layer_idx)
        mixer = getattr(layers[index], attr, None)
        if mixer is None:
            raise NotSupportedError(f"layer {index} of the model has no {attr!r} mixer")
        mixers.append(mixer)
    return mixers, chains


def _token_by_token(cache: Any, forward: Callable[..., Any], chains: bool) -> Callable[..., Any]:
    """``forward`` of a mixer, run one token at a time inside a draft tree (node by node: each reads
    its parent's state) and, with ``chains``, inside a verify step of more than one token."""

    def run(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        step = cache.sequence.active_step
        T = int(hidden_states.shape[1])
        if step is None or T == 1 or not (step.is_tree or (chains and step.verify)):
            return forward(hidden_states, *args, **kwargs)
        mask = kwargs.get("attention_mask")
        outs = []
        for i in range(T):
            if isinstance(mask, torch.Tensor) and mask.dim() == 2 and mask.shape[-1] == T:
                kwargs["attention_mask"] = mask[:, i : i + 1]
            scope = cache.tree_node(i) if step.is_tree else cache.state_positions(step.position + i, 1)
            with scope:
                outs.append(forward(hidden_states[:, i : i + 1], *args, **kwargs))
        return torch.cat(outs, dim=1)

    def entry(*args: Any, **kwargs: Any) -> Any:
        if "hidden_states" in kwargs:
            return run(kwargs.pop("hidden_states"), *args, **kwargs)
        return run(*args, **kwargs)

    return entry


@contextmanager
def state_layers_token_by_token(model: Any, cache: Any) -> Iterator[None]:
    """Within the context, a verify step's forward (``cache.begin_verify``) runs each recurrent mixer
    of ``model`` that computes only its last state one token at a time, so the cache keeps the state
    after every token, and a draft tree's forward (``cache.begin_tree``) runs every recurrent mixer
    node by node (``cache.tree_node``: each node reads its parent's state); other forwards run as
    they are. The mixers' ``forward`` is restored on exit.
    NotSupportedError: a model type whose state layers kvcore does not know (see the module docstring).
    """
    mixers, chains = _mixers(model, cache)
    for mixer in mixers:
        mixer.forward = _token_by_token(cache, mixer.forward, chains)
    try:
        yield
    finally:
        for mixer in mixers:
            del mixer.forward  # the class's forward again


__all__ = [
    "EXACT_PER_POSITION",
    "NODE_BY_NODE_MIXERS",
    "SCAN_FROM_ZERO",
    "TOKEN_BY_TOKEN_MIXERS",
    "state_layers_token_by_token",
]
