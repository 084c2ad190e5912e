"""``kvcore demo --tree N --model NAME``: draft trees on a real model, verified through transformers.

Each forward verifies a tree of at most ``N`` tokens: the last token as the root, a
main line of drafts below it and beside each main-line draft a second guess, as
``kvcore demo --tree`` builds them (kvcore_demo.trees.tree_step). The drafts come from
the real model's own first layers (kvcore_demo.real_early_exit: early exit, weights
shared; all but the last sixth by default, ``--draft-layers``: a quarter, as the random
model's demo takes, drafts almost nothing Gemma 3 270M's full depth agrees with). The tree goes through the model in one forward with
``kvcore.integrations.transformers.verify_tree``: ``KVCoreCache.begin_tree`` plans
the step, every node stands at ``length + depth`` (``position_ids``) and sees the
history and its own root path only (kvcore's tree masks, passed to transformers as
its per-layer-type masks); the longest root path greedy decoding agrees with is
committed with ``KVCoreCache.commit_tree``, which performs the row copies kvcore
returns (none on the main line).

For comparison, ``decode_chain`` decodes with the same drafter's ``N - 1`` greedy
drafts per forward (a chain of the same node budget) and rewinds the rejected ones.
Both must give plain greedy decoding's tokens; the demo checks that, and the kept
logits against a full recomputation.
"""

from __future__ import annotations

import time
from typing import Any

from kvcore_demo import real
from kvcore.integrations import transformers_models as real_model
from kvcore_demo.real_early_exit import HFEarlyExitDrafter
from kvcore_demo.runner import Progress
from kvcore_demo.trees import accepted_path, tree_step


def new_drafter(loaded: real_model.LoadedModel, opts: real.RealDemoOptions, prompt_len: int) -> HFEarlyExitDrafter:
    """The early-exit drafter of a run over a prompt of `prompt_len` tokens: the model's first
    `opts.tree_draft_layers` layers; its cache holds the prompt, the generated tokens and a step
    of drafts; forwards of at most `opts.max_step`."""
    capacity = prompt_len + opts.gen_len + max(opts.draft, opts.tree) + 1
    return HFEarlyExitDrafter(loaded.model, opts.tree_draft_layers, capacity, min(opts.max_step, capacity))


def decode_tree(
    loaded: real_model.LoadedModel,
    opts: real.RealDemoOptions,
    start: real.Prefilled,
    budget: int,
    progress: Progress | None = None,
    drafter: HFEarlyExitDrafter | None = None,
) -> tuple[real.Decoded, dict[str, Any]]:
    """Greedy decoding from `start` with draft trees of at most `budget` tokens (>= 2, <=
    the cache's max_step) per forward, drafted by `drafter` (default: ``new_drafter``).
    Returns the run (logits of every kept position) and its counts: forwards, tokens per
    forward, accepted drafts, accepted paths off the main line, row copies of layer 0,
    the drafter's layers and shallow forwards. Raises ValueError for a budget outside
    [2, max_step]."""
    import torch

    from kvcore.integrations.transformers import verify_tree

    cache = start.cache
    if not 2 <= budget <= cache.max_step:
        raise ValueError(f"--tree = {budget}: must be in [2, --max-step = {cache.max_step}]")
    bar = progress or Progress(None)
    draft = drafter or new_drafter(loaded, opts, len(start.prompt_ids))
    eos, n, logits = loaded.tokenizer.eos_token_id, len(start.prompt_ids), start.logits
    t1 = time.perf_counter()
    out = [int(logits[n - 1].argmax())]
    forwards = accepted = off_main = copies = 0
    with torch.no_grad():
        while len(out) < opts.gen_len and out[-1] != eos:
            P = cache.get_seq_length()
            parents, tokens = tree_step(draft, start.prompt_ids + out, budget, opts.gen_len - len(out))
            rows = verify_tree(loaded.model, cache, tokens, parents)
            path = accepted_path(parents, tokens, rows.numpy())
            # A drafted end-of-text token ends the text: keep nothing after it.
            cut = next((d for d, node in enumerate(path[1:], 1) if tokens[node] == eos), None)
            path = path if cut is None else path[: cut + 1]
            cache.commit_tree(path)
            copies += int(cache.sequence.commit_copies()[0].shape[0])
            off_main += path != list(range(len(path)))
            for d, node in enumerate(path):
                logits[P + d] = rows[node]
            out += [tokens[node] for node in path[1:]]
            if cut is None:
                out.append(int(rows[path[-1]].argmax()))
            forwards, accepted = forwards + 1, accepted + len(path) - 1
            bar.update("trees", min(len(out), opts.gen_len), opts.gen_len)
    if eos in out:
        out = out[: out.index(eos) + 1]
    out = out[: opts.gen_len]
    fed = n + len(out) - 1
    kept = {p: row for p, row in logits.items() if p < fed}
    run = real.Decoded(start.prompt_ids, out, kept, cache, start.seconds, time.perf_counter() - t1)
    return run, {
        "budget": budget,
        "forwards": forwards,
        "tokens_per_forward": (len(out) - 1) / max(forwards, 1),
        "accepted": accepted,
        "paths_off_main_line": off_main,
        "copies_layer0": copies,
        "draft_layers": draft.layers,
        "draft_forwards": draft.forwards,
        "tokens_per_s": (len(out) - 1) / max(run.decode_seconds, 1e-9),
    }


def decode_chain(
    loaded: real_model.LoadedModel,
    opts: real.RealDemoOptions,
    start: real.Prefilled,
    budget: int,
    progress: Progress | None = None,
    drafter: HFEarlyExitDrafter | None = None,
) -> tuple[real.Decoded, dict[str, Any]]:
    """Greedy decoding from `start` with chains of the same node budget: each forward
    carries the last token and `budget - 1` greedy drafts of `drafter` (default:
    ``new_drafter``), the rejected ones rewound (``real.decode_speculative``). Returns the
    run and its counts (forwards, drafted, accepted, rewinds, tokens per forward and per
    second, the drafter's layers and shallow forwards)."""
    draft = drafter or new_drafter(loaded, opts, len(start.prompt_ids))

    def greedy_drafts(context: list[int], k: int) -> list[int]:
        return draft.draft(context, k, 1)[0] if k > 0 else []

    run, counts = real.decode_speculative(loaded, opts, start, progress, drafter=greedy_drafts, draft=budget - 1)
    counts.update(
        budget=budget,
        tokens_per_forward=(len(run.tokens) - 1) / max(counts["forwards"], 1),
        tokens_per_s=(len(run.tokens) - 1) / max(run.decode_seconds, 1e-9),
        draft_layers=draft.layers,
        draft_forwards=draft.forwards,
    )
    return run, counts


__all__ = ["decode_chain", "decode_tree", "new_drafter"]
