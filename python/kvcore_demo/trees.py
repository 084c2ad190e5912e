"""`kvcore demo --tree N`: speculative decoding with draft trees (docs/trees.md).

Each step verifies a tree of at most N tokens in one forward: the last token
as the root, a main line of drafts below it, and at every depth of the main
line a second guess beside it. The drafts come from a real cheap drafter, the
model's own first layers (kvcore_demo.early_exit: self-speculative early exit,
the first quarter of the layers, at least one, then the final norm and the LM
head): the main line is its greedy continuation and each second guess its
second choice at that depth. It sees only the committed tokens, never the
plain run's. The longest root path greedy decoding agrees with is committed
(`cache.commit(step, accepted=...)`) and its row copies applied
(`pool.apply_copies`). The run must give the plain run's tokens, and every
kept logit row must equal the full recomputation; it reports accepted tokens
per forward against chain drafting of the same node budget (the same
drafter's N - 1 greedy drafts per step).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from kvcore_demo.drafts import accepted_prefix, greedy
from kvcore_demo.early_exit import EarlyExitDrafter
from kvcore_demo.model import Decoder, Model, ModelConfig


def draft_layers(cfg: ModelConfig) -> int:
    """The drafter's depth (layers) for a model of shape `cfg`: the first quarter of
    its layers, at least one."""
    return max(1, cfg.n_layers // 4)


def main_line_depth(budget: int) -> int:
    """Main-line drafts of a tree of `budget` drafts below its root: ceil(budget / 2),
    the rest being second guesses beside the first main-line drafts."""
    return (budget + 1) // 2


def draft_tree(main: list[int], others: list[list[int]], budget: int) -> tuple[list[int], list[int]]:
    """(parents, tokens) of the drafts below a root, at most `budget` nodes: the
    main line `main` (the drafter's greedy tokens, depth after depth), then
    beside each main-line draft its second guess `others[d][0]`, while the
    budget lasts. Entry i is step node i + 1 (the root is node 0), so parents
    hold step node indices."""
    tokens = list(main[:budget])
    parents = list(range(len(tokens)))  # main line: draft d's parent is node d
    for d in range(len(tokens)):
        if len(tokens) >= budget:
            break
        if others[d]:
            parents.append(d)  # beside main-line draft d: the same parent
            tokens.append(others[d][0])
    return parents, tokens


class TreeDrafter(Protocol):
    """What tree_step needs of a drafter (``EarlyExitDrafter``, or the real model's
    ``kvcore_demo.real_early_exit.HFEarlyExitDrafter``)."""

    def draft(self, context: Sequence[int], depth: int, width: int) -> tuple[list[int], list[list[int]]]:
        """(main, others): the greedy tokens after `context`, `depth` deep, and beside each
        its next `width - 1` choices."""
        ...


def tree_step(drafter: TreeDrafter, context: list[int], budget: int, left: int) -> tuple[list[int], list[int]]:
    """(parents, tokens) of one step's tree of at most `budget` nodes: the root is
    context[-1] (the last committed token, not in the cache yet), the drafts below
    it `drafter`'s (draft_tree), the main line at most `left` deep (the tokens
    still to generate, >= 1)."""
    depth = min(main_line_depth(budget - 1), left)
    main, others = drafter.draft(context, depth, 2)
    below, drafts = draft_tree(main, others, budget - 1)
    return [-1, *below], [context[-1], *drafts]


def root_paths(parents: list[int] | None, n: int) -> list[list[int]]:
    """The root-to-leaf node paths of a step of `n` tokens: one path of every node
    for a chain (`parents` None), one path per leaf of a tree; every node lies
    on at least one."""
    if parents is None:
        return [list(range(n))]
    inner = set(parents[1:])
    paths = []
    for leaf in (i for i in range(n) if i not in inner):
        path = [leaf]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        paths.append(path[::-1])
    return paths


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
              prompt: list[int], plain: list[int], gen_len: int) -> dict[str, Any]:
    """Tree speculative decoding of gen_len tokens after `prompt` with trees of at
    most `budget` nodes drafted by the early-exit drafter; the report (tokens
    equal to `plain`, which only the check reads; the worst logit difference
    against full recomputation; accepted tokens per forward; the drafter's
    layers and shallow forwards)."""
    dec = Decoder(model, capacity, max_step, dtype)
    drafter = EarlyExitDrafter(model, draft_layers(model.config), capacity, max_step, dtype)
    kept: dict[int, npt.NDArray[Any]] = {}
    prompt_logits = dec.feed(prompt)
    for p in range(len(prompt)):
        kept[p] = prompt_logits[p]
    out = [greedy(prompt_logits[-1])]
    forwards = copies = off_main = 0
    while len(out) < gen_len:
        P = dec.length
        parents, tokens = tree_step(drafter, prompt + out, budget, gen_len - len(out))
        step = dec.cache.begin_tree(parents)
        logits = model.forward_step(np.asarray(tokens, dtype=np.int64), step, dec.pool)
        path = accepted_path(parents, tokens, logits)
        moved = dec.cache.commit(step, accepted=path)
        dec.pool.apply_copies(moved)
        copies += int(moved[0].shape[0])
        off_main += path != list(range(len(path)))
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
        "paths_off_main_line": off_main,
        "copies_layer0": copies,
        "draft_layers": draft_layers(model.config),
        "draft_forwards": drafter.forwards,
        "tokens_equal": out == plain,
        "max_abs_logit_diff": diff,
    }


def chain_tokens_per_forward(model: Model, budget: int, capacity: int, max_step: int, dtype: npt.DTypeLike,
                             prompt: list[int], gen_len: int) -> float:
    """Accepted tokens per forward of chain drafting with the same node budget and
    drafter: its budget - 1 greedy drafts per step (a tree's main line, longer)."""
    dec = Decoder(model, capacity, max_step, dtype)
    drafter = EarlyExitDrafter(model, draft_layers(model.config), capacity, max_step, dtype)
    out = [greedy(dec.feed(prompt)[-1])]
    forwards = 0
    while len(out) < gen_len:
        P = dec.length
        drafts, _ = drafter.draft(prompt + out, min(budget - 1, gen_len - len(out)), 1)
        logits = dec.step([out[-1], *drafts])
        a = accepted_prefix(drafts, logits)
        out.extend(drafts[:a])
        out.append(greedy(logits[a]))
        dec.rewind(P + 1 + a)
        forwards += 1
    return (gen_len - 1) / max(forwards, 1)
