"""How many of a step's tokens are prompt tokens, from a transformers request state."""

from __future__ import annotations

from typing import Any


def prompt_tokens_in_step(state: Any) -> int:
    """Prompt tokens among the tokens the request carries in this step: those at positions below
    its prompt's length (a request recomputed after preemption counts its generated tokens as prompt)."""
    first = int(state.position_offset)
    carried = len(state.tokens_to_process)
    return max(0, min(first + carried, len(state.initial_tokens)) - first)


__all__ = ["prompt_tokens_in_step"]
