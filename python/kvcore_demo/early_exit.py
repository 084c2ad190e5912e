"""A cheap drafter made from the demo model itself: self-speculative early exit.

The drafter is the model's first `layers` layers followed by its final norm and
its (tied) LM head: the same weights, nothing trained (LayerSkip and
Draft & Verify draft this way). It runs greedily through its own SequenceCache
and KVPool over the tokens the target has committed, so drafting a step costs
one shallow forward per draft depth. It never sees the target's logits or
tokens other than the committed ones.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from kvcore_demo.model import Decoder, Model


def shallow_model(model: Model, layers: int) -> Model:
    """`model` cut after its first `layers` layers (weights shared, not copied), its final
    norm and head kept. Raises ValueError unless 1 <= layers <= model's layers."""
    if not 1 <= layers <= model.config.n_layers:
        raise ValueError(f"draft layers = {layers}: must be in [1, {model.config.n_layers}]")
    out = copy.copy(model)
    out.layers = model.layers[:layers]
    out.config = dataclasses.replace(model.config, n_layers=layers)
    return out


class EarlyExitDrafter:
    """Drafts from the first `layers` layers of `model` (its own cache: `capacity`
    positions, steps of at most `max_step` tokens, K/V in `dtype`)."""

    def __init__(self, model: Model, layers: int, capacity: int, max_step: int, dtype: npt.DTypeLike) -> None:
        self.dec = Decoder(shallow_model(model, layers), capacity, max_step, dtype)
        self.held: list[int] = []  # the tokens the drafter's cache holds, in order
        self.forwards = 0  # shallow forwards run (prefill chunks included)

    def _sync(self, context: Sequence[int]) -> npt.NDArray[Any]:
        """Makes the cache hold exactly `context` (at least one token) and returns the
        logits row of its last token: rewinds to the longest common prefix (kept
        short of the last token, whose row is needed; to nothing when the rings
        no longer allow that rewind) and feeds the rest."""
        n = min(len(self.held), len(context) - 1)
        common = 0
        while common < n and self.held[common] == context[common]:
            common += 1
        if common < len(self.held):
            # A ring layer may have overwritten what a deep rewind needs: then start over.
            common = common if self.dec.cache.can_rewind(common) else 0
            self.dec.rewind(common)
            del self.held[common:]
        return self._feed(context[common:])

    def _feed(self, tokens: Sequence[int]) -> npt.NDArray[Any]:
        """Feeds `tokens` (at least one) through the shallow decoder, counting its
        forwards and the tokens its cache holds; the logits row of the last one."""
        C = self.dec.cache.max_step
        self.forwards += (len(tokens) + C - 1) // C
        rows = self.dec.feed(tokens)
        self.held.extend(tokens)
        out: npt.NDArray[Any] = rows[-1]
        return out

    def draft(self, context: Sequence[int], depth: int, width: int) -> tuple[list[int], list[list[int]]]:
        """(main, others) for the tokens after `context` (the committed tokens and the
        step's root): main[d] is the drafter's greedy token at depth d + 1 following
        main[:d], others[d] its next `width - 1` choices there, best first. `depth`
        >= 1 drafts cost `depth - 1` one-token shallow forwards after the sync."""
        row = self._sync(context)
        main: list[int] = []
        others: list[list[int]] = []
        for d in range(depth):
            ranked = np.argsort(-row, kind="stable")[:width]
            main.append(int(ranked[0]))
            others.append([int(t) for t in ranked[1:]])
            if d + 1 < depth:
                row = self._feed(main[-1:])
        return main, others
