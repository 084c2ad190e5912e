"""Exact speculative decoding on hybrid models (recurrent-state layers) through a ``KVCoreCache``.

transformers' assisted generation and prompt lookup need the cache to roll back the
rejected drafts. transformers 5.24 refuses both for every model that sets
``_is_stateful`` (``generation/utils.py``, ``_validate_generation_mode``: "assisted
generation is not supported with stateful models"): Qwen3-Next, Granite 4.0-H, Jamba,
Mamba, Falcon-Mamba, Kimi Linear... Its linear-attention ``crop`` rolls back only the
conv part of a layer anyway. kvcore keeps the state after every token of a verify
step in its own slot (``KVCoreCache.begin_verify``), so a rejected draft costs nothing
to undo: the next forward reads the slot of the last accepted token. (LFM2 is not
marked stateful: transformers' own prompt lookup runs on it, and through a
``KVCoreCache`` whose ``state_slots`` exceed its longest forward it is exact, since
``activate_past_recording`` makes such forwards verify steps.)

``speculative_generate(model, cache, input_ids, draft, max_new_tokens=...)`` is greedy
speculative decoding with verify steps: the prompt is prefilled in chunks of
``cache.max_step``; each verify forward carries the pending token and up to
``num_draft_tokens`` drafts from ``draft`` (``prompt_lookup_drafter``: draft tokens
copied from the latest earlier match of the last n-gram, as transformers'
``prompt_lookup_num_tokens``; ``draft_model_drafter``: a smaller model's greedy
continuation, as assisted generation), and ``commit_verify`` keeps the pending token
and the drafts the model's own greedy choice agrees with. Its tokens are plain greedy
decoding's, exactly. ``prompt_lookup_generate`` is it with prompt lookup.

Per layer type, how a verify step gets the state after each of its tokens:

- LFM2's short convolution (``conv``): ``update_conv_state`` receives every token's
  inputs, and the conv state after token ``q`` is the last ``kernel`` columns up to
  ``q``: exact, at no extra cost.
- Gated DeltaNet (Qwen3-Next and Qwen 3.5, ``linear_attn``) and Mamba-2 (Granite 4.0-H,
  ``mamba``; Nemotron-H, ``mixer``):
  transformers' layer returns only the last recurrent state, so
  ``state_layers_token_by_token`` runs each such mixer one token at a time inside the
  verify forward (``KVCoreCache.state_positions``): the single-token path decoding
  uses, the state after each token kept in its slot. Attention and MLPs still run
  once over the ``T`` tokens; the mixer costs ``T`` single-token calls instead of one
  chunked call (the recurrence is sequential anyway; the projections are batched ``T``
  times smaller).

- Bamba (Mamba-2, ``mamba``): as Granite's. Its model computes ``position_ids`` as
  ``arange(T)`` when none are given, whatever the cache holds, so every forward here passes
  each token's position.
- Jamba (Mamba, ``mamba``): token by token as above; and its multi-token path scans from a
  zero state (``SCAN_FROM_ZERO``: transformers' chunked prefill of Jamba is wrong with any
  cache, ``DynamicCache`` included), so its prompt is prefilled in one plain forward of up to
  ``max_step`` tokens from an empty cache and then in verify steps (mixer token by token),
  each committed whole: exact, at ``T`` single-token mixer calls per chunk.

Other model types with recurrent layers are refused by name (NotSupportedError).

``verify_tree(model, cache, tokens, parents)`` is one forward over a draft tree (docs/trees.md),
its logits uncommitted: the caller commits the accepted root path with ``cache.commit_tree``.
Every public name here is importable from ``kvcore.integrations.transformers`` too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, Callable, Optional, Union

import torch

from kvcore._errors import InvalidArgumentError
from kvcore.integrations.transformers_cache import KVCoreCache
from kvcore.integrations.transformers_mixers import (  # re-exported: the public names
    EXACT_PER_POSITION,
    NODE_BY_NODE_MIXERS,
    SCAN_FROM_ZERO,
    TOKEN_BY_TOKEN_MIXERS,
    state_layers_token_by_token,
)
from kvcore.integrations.transformers_prefill import cache_keyword, prefill


def lookup_drafts(tokens: list[int], max_ngram_size: int, n: int) -> list[int]:
    """Up to ``n`` draft tokens: what followed the latest earlier occurrence of the longest suffix
    n-gram of ``tokens`` (``max_ngram_size`` down to 1), as transformers' prompt lookup drafts."""
    for size in range(min(max_ngram_size, len(tokens) - 1), 0, -1):
        suffix = tokens[-size:]
        for start in range(len(tokens) - size - 1, -1, -1):
            if tokens[start : start + size] == suffix:
                return tokens[start + size : start + size + n]
    return []


Drafter = Callable[[list[int], int], list[int]]
"""A draft source: given the tokens so far and ``n``, up to ``n`` proposed next tokens."""


def prompt_lookup_drafter(max_ngram_size: int = 2) -> Drafter:
    """Prompt lookup (transformers' ``prompt_lookup_num_tokens``) as a Drafter: ``lookup_drafts``."""
    if max_ngram_size < 1:
        raise InvalidArgumentError(f"max_ngram_size = {max_ngram_size}: must be >= 1")
    return lambda tokens, n: lookup_drafts(tokens, max_ngram_size, n)


def draft_model_drafter(draft_model: Any) -> Drafter:
    """A smaller model's greedy continuation as a Drafter (assisted generation). The draft model
    recomputes its forward over the whole history for each proposal (no cache of its own): simple
    and exact, for small draft models."""

    def draft(tokens: list[int], n: int) -> list[int]:
        ids = torch.tensor([tokens], device=draft_model.device)
        out = draft_model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        return [int(t) for t in out[0, len(tokens) :].tolist()]

    return draft


def speculative_generate(
    model: Any,
    cache: KVCoreCache,
    input_ids: torch.Tensor,
    draft: Drafter,
    *,
    max_new_tokens: int,
    num_draft_tokens: int = 3,
    eos_token_id: Union[int, Sequence[int], None] = None,
    stats: Optional[dict[str, int]] = None,
) -> torch.Tensor:
    """Greedy decoding of ``max_new_tokens`` tokens after ``input_ids`` (``[1, n]``) with drafts from
    ``draft`` verified by kvcore verify steps; returns ``[1, n + generated]`` token ids, equal to
    plain greedy decoding's.

    ``cache``: an empty or partly filled ``KVCoreCache`` of ``model`` (``input_ids`` continue it).
    Each verify forward (``cache.begin_verify``) carries the pending token and at most
    ``num_draft_tokens`` drafts, bounded by the cache (``max_step - 1`` and ``state_slots - 2``:
    a verify step of ``T`` tokens needs ``T <= state_slots - 1``); ``commit_verify`` keeps the
    pending token and the drafts the model's greedy choice agrees with, and the next forward
    reads the state after the last of them (nothing recomputed). Stops after a token of
    ``eos_token_id`` (one id or several), as ``generate``. ``stats`` (optional dict) receives
    ``forwards``, ``drafted`` and ``accepted`` counts. Raises InvalidArgumentError for a batch
    other than 1, ``max_new_tokens < 1`` or ``num_draft_tokens < 0``; NotSupportedError for a
    model whose state layers kvcore cannot run token by token; what the model and the cache raise
    (a forward that raises is discarded: the cache keeps what was committed before it).
    """
    if input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] < 1:
        raise InvalidArgumentError(f"input_ids {tuple(input_ids.shape)}: must be [1, >= 1 tokens] (a batch of one)")
    if max_new_tokens < 1 or num_draft_tokens < 0:
        raise InvalidArgumentError(
            f"max_new_tokens = {max_new_tokens}, num_draft_tokens = {num_draft_tokens}: need >= 1 and >= 0"
        )
    slots = min((s.slots for s in cache.state_layers), default=cache.max_step + 1)
    room = max(0, min(num_draft_tokens, cache.max_step - 1, slots - 2))
    counts = {"forwards": 0, "drafted": 0, "accepted": 0}
    eos = {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id or ())
    tokens = input_ids[0].tolist()
    generated: list[int] = []
    keyword = cache_keyword(model)
    with torch.no_grad(), state_layers_token_by_token(model, cache):
        out, forwards = _prefill(model, cache, input_ids, slots)
        counts["forwards"] += forwards
        pending = int(out.logits[0, -1].argmax())
        while True:
            generated.append(pending)
            if len(generated) >= max_new_tokens or pending in eos:
                break
            n = min(room, max_new_tokens - len(generated), cache.capacity - cache.sequence.length - 1)
            drafts = [int(t) for t in draft(tokens + generated, n)][:n] if n > 0 else []
            length = cache.sequence.length
            cache.begin_verify(1 + len(drafts))
            try:
                logits = model(input_ids=torch.tensor([[pending, *drafts]], device=input_ids.device), use_cache=True,
                               position_ids=_positions(length, 1 + len(drafts), input_ids.device),
                               **{keyword: cache}).logits[0]  # fmt: skip
            except BaseException:
                cache.discard_forward()
                raise
            choice = logits.argmax(-1).tolist()
            agree = 0
            while agree < len(drafts) and drafts[agree] == choice[agree]:
                agree += 1
            cache.commit_verify(1 + agree)
            counts["forwards"] += 1
            counts["drafted"] += len(drafts)
            counts["accepted"] += agree
            done = False
            for token in drafts[:agree]:
                generated.append(token)
                if len(generated) >= max_new_tokens or token in eos:
                    done = True
                    break
            if done:
                break
            pending = int(choice[agree])
    if stats is not None:
        stats.update(counts)
    return torch.tensor([tokens + generated], dtype=input_ids.dtype, device=input_ids.device)


def _positions(first: int, count: int, device: Any) -> torch.Tensor:
    """``[1, count]`` positions from ``first``: passed to every forward (Bamba's model would
    otherwise number each forward's tokens from 0)."""
    return torch.arange(first, first + count, device=device)[None]


def _prefill(model: Any, cache: KVCoreCache, input_ids: torch.Tensor, slots: int) -> tuple[Any, int]:
    """Feed the prompt (chunks of ``cache.max_step``); return the last output and the forwards run.
    A ``SCAN_FROM_ZERO`` model's forwards after the first one are verify steps of at most
    ``min(max_step, slots - 1)`` tokens, committed whole (its mixer then runs token by token
    from the cached state)."""
    n, length, device = int(input_ids.shape[1]), cache.sequence.length, input_ids.device
    model_type = getattr(model.config.get_text_config(decoder=True), "model_type", "")
    if model_type not in SCAN_FROM_ZERO or not cache.state_layers:
        out = prefill(model, cache, input_ids, position_ids=_positions(length, n, device))
        return out, -(-n // cache.max_step)
    start, forwards, out = 0, 0, None
    if length == 0:  # from a zero state: one plain forward is exact
        start = min(n, cache.max_step)
        out = prefill(model, cache, input_ids[:, :start], position_ids=_positions(0, start, device))
        forwards = 1
    keyword = cache_keyword(model)
    while start < n:
        T = min(n - start, cache.max_step, slots - 1)
        first = cache.sequence.length
        cache.begin_verify(T)
        try:
            out = model(input_ids=input_ids[:, start : start + T], position_ids=_positions(first, T, device),
                        use_cache=True, **{keyword: cache})  # fmt: skip
        except BaseException:
            cache.discard_forward()
            raise
        cache.commit_verify(T)
        start, forwards = start + T, forwards + 1
    return out, forwards


def prompt_lookup_generate(
    model: Any,
    cache: KVCoreCache,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int,
    num_draft_tokens: int = 3,
    max_ngram_size: int = 2,
    eos_token_id: Union[int, Sequence[int], None] = None,
    stats: Optional[dict[str, int]] = None,
) -> torch.Tensor:
    """``speculative_generate`` with prompt-lookup drafts (``prompt_lookup_drafter(max_ngram_size)``):
    what ``model.generate(ids, prompt_lookup_num_tokens=num_draft_tokens)`` does, exact on models
    transformers refuses it for. Same arguments, result and errors."""
    return speculative_generate(model, cache, input_ids, prompt_lookup_drafter(max_ngram_size),
                                max_new_tokens=max_new_tokens, num_draft_tokens=num_draft_tokens,
                                eos_token_id=eos_token_id, stats=stats)  # fmt: skip


def verify_tree(model: Any, cache: KVCoreCache, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
    """One forward of ``model`` over a draft tree through ``cache``; the tree's logits, uncommitted.

    ``tokens[i]`` is node ``i``'s token id and ``parents[i]`` its parent (``parents[0] =
    -1``, the root; then ``0 <= parents[i] < i``; at most ``cache.max_step`` nodes). Every
    node stands at position ``length + depth`` and attends over the cached history and its
    own root path (kvcore's tree mask, sinks and windows included). Returns float32 logits
    ``[N, vocab]`` (row ``i``: the distribution after node ``i``'s root path); the caller
    picks the accepted root path and calls ``cache.commit_tree(path)``. Batch of one. On a
    hybrid model the recurrent mixers run node by node inside the forward
    (``kvcore.integrations.transformers_speculative.state_layers_token_by_token``: each node
    reads its parent's state slot and writes its own; ``commit_tree`` copies the accepted
    path's slots). Raises InvalidArgumentError when ``tokens`` and ``parents`` differ in
    length, NotSupportedError for a hybrid whose mixers kvcore cannot run node by node, and
    what ``KVCoreCache.begin_tree`` raises; a forward that raises leaves no step begun.
    """
    if len(tokens) != len(parents):
        raise InvalidArgumentError(f"verify_tree: {len(tokens)} tokens for {len(parents)} parents: one each")
    node_by_node: Any = contextlib.nullcontext()
    if cache.state_layers:  # each node reads its parent's state: the recurrent mixers run node by node
        node_by_node = state_layers_token_by_token(model, cache)  # NotSupportedError before anything begins
    with node_by_node:
        step = cache.begin_tree(parents)
        try:
            masks = cache.attention_masks(model.config, len(parents), dtype=model.dtype)
            positions = torch.tensor(step.positions.tolist(), dtype=torch.long)[None]
            out = model(input_ids=torch.tensor([list(tokens)]), position_ids=positions, attention_mask=masks,
                        use_cache=True, **{cache_keyword(model): cache})  # fmt: skip
        except BaseException:
            cache.discard_forward()
            raise
    logits: torch.Tensor = out.logits[0].float()
    return logits


__all__ = [
    "EXACT_PER_POSITION",
    "NODE_BY_NODE_MIXERS",
    "SCAN_FROM_ZERO",
    "TOKEN_BY_TOKEN_MIXERS",
    "Drafter",
    "draft_model_drafter",
    "lookup_drafts",
    "prompt_lookup_drafter",
    "prompt_lookup_generate",
    "speculative_generate",
    "state_layers_token_by_token",
    "verify_tree",
]
