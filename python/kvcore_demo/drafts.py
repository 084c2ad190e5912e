"""Greedy decoding and speculative drafts, as both demos decode."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt


def greedy(logits: npt.NDArray[Any]) -> int:
    """The token with the highest logit (the demos decode greedily)."""
    return int(np.argmax(logits))


def corrupt_drafts(drafts: list[int], rng: np.random.Generator, vocab: int) -> list[int]:
    """A copy of `drafts` (token ids) with one token, at a place drawn from `rng`,
    replaced by a different id in [0, vocab); or none replaced (each of the
    len(drafts) + 1 outcomes equally likely). No draw when `drafts` is empty.
    Raises ValueError when a token must change and vocab < 2."""
    out = list(drafts)
    k = len(out)
    if k == 0:
        return out
    wrong = int(rng.integers(0, k + 1))
    if wrong < k:
        out[wrong] = (out[wrong] + 1 + int(rng.integers(0, vocab - 1))) % vocab
    return out


def accepted_prefix(drafts: Sequence[int], logits: npt.NDArray[Any]) -> int:
    """How many leading drafts greedy decoding accepts: drafts[j] is accepted when it
    is the greedy token of logits[j] (the row of the token before it) and every draft
    before it was. `logits` needs a row per draft (len(drafts) x vocab, at least)."""
    a = 0
    while a < len(drafts) and drafts[a] == greedy(logits[a]):
        a += 1
    return a
