"""`kvcore demo --tree N`: speculative decoding with draft trees (docs/trees.md).

Each step verifies a tree of at most N tokens in one forward: the last token
as the root, a main line of drafts below it, and at every depth of the main
line a second guess beside it. The drafter is a noisy oracle shaped like a
top-2 draft model: each main-line draft is the plain run's next token with
probability TOP1 (else a wrong one), and when it is wrong the second guess is
right with probability TOP2 (a top-2 guess never repeats the top-1). The longest root path
greedy decoding agrees with is committed (`cache.commit(step, accepted=...)`)
and its row copies applied (`pool.apply_copies`). The run must give the plain
run's tokens, and every kept logit row must equal the full recomputation; it
reports accepted tokens per forward against chain drafting of the same node
budget (N - 1 drafts from the same top-1 drafter).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from kvcore.demo.drafts import greedy
from kvcore.demo.model import Decoder, Model

TOP1 = 0.6  # the drafter's first guess is right this often
TOP2 = 0.5  # its second guess is right this often when the first is wrong


def other_than(token: int, rng: np.random.Generator, vocab: int) -> int:
    """A token id in [0, vocab) other than `token`."""
    return (token + 1 + int(rng.integers(0, vocab - 1))) % vocab


def top1_drafts(truth: list[int], rng: np.random.Generator, vocab: int) -> list[int]:
    """Each of truth's tokens, kept with probability TOP1, else a wrong one."""
    return [t if rng.random() < TOP1 else other_than(t, rng, vocab) for t in truth]


def draft_tree(truth: list[int], budget: int, rng: np.random.Generator, vocab: int) -> tuple[list[int], list[int]]:
    """(parents, tokens) of the drafts below a root, at most `budget` nodes: a
    main line of ceil(budget / 2) top-1 drafts, then beside each main-line
    draft its second guess, while the budget lasts. Entry i is step node i + 1
    (the root is node 0), so parents hold step node indices."""
    depth = min(len(truth), (budget + 1) // 2)
    tokens = top1_drafts(truth[:depth], rng, vocab)
    parents = list(range(depth))  # main line: draft d's parent is node d
    for d in range(depth):
        if len(tokens) >= budget:
            break
        right = tokens[d] != truth[d] and rng.random() < TOP2
        parents.append(d)  # beside main-line draft d: the same parent
        tokens.append(truth[d] if right else other_than(tokens[d], rng, vocab))
    return parents, tokens


def accepted_path(parents: list[int], tokens: list[int], logits: npt.NDArray[Any]) -> list[int]:
    """The longest root path greedy decoding agrees with: from node 0, each next
    node is the lowest-index child whose token is the greedy token of its
    parent's logits row."""
    path = [0]
    while True:
        want = greedy(logits[path[-1]])
        child = next((c for c in range(1, len(parents)) if parents[c] == path[-1] and tokens[c] == want), None)
        if child is None:
            return path
        path.append(child)


def run_trees(model: Model, budget: int, capacity: int, max_step: int, dtype: npt.DTypeLike,
              prompt: list[int], plain: list[int], gen_len: int, seed: int) -> dict[str, Any]:
    """Tree speculative decoding of gen_len tokens after `prompt` with trees of at
    most `budget` nodes; the report (tokens equal to `plain`, the worst logit
    difference against full recomputation, accepted tokens per forward)."""
    rng = np.random.default_rng(seed)
    vocab = model.config.vocab_size
    dec = Decoder(model, capacity, max_step, dtype)
    kept: dict[int, npt.NDArray[Any]] = {}
    prompt_logits = dec.feed(prompt)
    for p in range(len(prompt)):
        kept[p] = prompt_logits[p]
    out = [greedy(prompt_logits[-1])]
    forwards = copies = 0
    while len(out) < gen_len:
        P = dec.length
        truth = plain[len(out) : len(out) + budget - 1]
        below, drafts = draft_tree(truth, budget - 1, rng, vocab)
        parents = [-1] + [p for p in below]
        tokens = [out[-1], *drafts]
        step = dec.cache.begin_tree(parents)
        logits = model.forward_step(np.asarray(tokens, dtype=np.int64), step, dec.pool)
        path = accepted_path(parents, tokens, logits)
        moved = dec.cache.commit(step, accepted=path)
        dec.pool.apply_copies(moved)
        copies += int(moved[0].shape[0])
        for d, node in enumerate(path):
            kept[P + d] = logits[node]
        out.extend(tokens[node] for node in path[1:])
        out.append(greedy(logits[path[-1]]))
        forwards += 1
    out = out[:gen_len]
    fed = prompt + out[: dec.length - len(prompt)]
    oracle = model.forward_full(fed, kv_dtype=dtype)
    diff = max(float(np.abs(row - oracle[p]).max()) for p, row in kept.items() if p < len(fed))
    return {
        "forwards": forwards,
        "tokens_per_forward": (gen_len - 1) / max(forwards, 1),
        "copies_layer0": copies,
        "tokens_equal": out == plain,
        "max_abs_logit_diff": diff,
    }


def chain_tokens_per_forward(model: Model, budget: int, capacity: int, max_step: int, dtype: npt.DTypeLike,
                             prompt: list[int], plain: list[int], gen_len: int, seed: int) -> float:
    """Accepted tokens per forward of chain drafting with the same node budget:
    budget - 1 top-1 drafts per step (as draft_tree's main line)."""
    rng = np.random.default_rng(seed)
    dec = Decoder(model, capacity, max_step, dtype)
    out = [greedy(dec.feed(prompt)[-1])]
    forwards = 0
    while len(out) < gen_len:
        P = dec.length
        drafts = top1_drafts(plain[len(out) : len(out) + budget - 1], rng, model.config.vocab_size)
        logits = dec.step([out[-1], *drafts])
        a = 0
        while a < len(drafts) and drafts[a] == greedy(logits[a]):
            a += 1
        out.extend(drafts[:a])
        out.append(greedy(logits[a]))
        dec.rewind(P + 1 + a)
        forwards += 1
    return (gen_len - 1) / max(forwards, 1)
