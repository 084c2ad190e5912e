"""What kvcore's continuous batching did in a run: prefix hits, forks, tokens computed, peak memory."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class BatchCounters:
    """Counters of one manager's run (``reset()`` zeroes them; a manager zeroes them at ``start``).

    - ``prefix_hits``: requests that adopted a cached prompt prefix.
    - ``prefix_hit_tokens``: prompt tokens adopted, so not recomputed.
    - ``forks``: sequences forked from a parent for parallel samples (``num_return_sequences``).
    - ``prompt_tokens_computed``: prompt tokens run through the model. A request with parallel
      samples counts its last prompt token once per sample (``prompt + forks``): transformers'
      scheduler prefills all but that token, forks, and each sample computes it for its own
      logits (kvcore's fork shares the rest, so nothing else is computed twice).
    - ``tokens_computed``: all tokens run through the model (prompt and decode).
    - ``forwards``: forwards (steps) committed.
    - ``preempted``: requests whose cache was released to let others continue (recomputed later,
      mostly from their own cached blocks).
    - ``peak_blocks``: blocks held by sequences at the fullest moment (inside a step), over all groups.
    - ``peak_kv_bytes``: K/V bytes of those blocks (every layer of each group).
    """

    prefix_hits: int = 0
    prefix_hit_tokens: int = 0
    forks: int = 0
    prompt_tokens_computed: int = 0
    tokens_computed: int = 0
    forwards: int = 0
    preempted: int = 0
    peak_blocks: int = 0
    peak_kv_bytes: int = 0

    def reset(self) -> None:
        """Zero every counter."""
        for name in asdict(self):
            setattr(self, name, 0)

    def as_dict(self) -> dict[str, int]:
        """The counters by name."""
        return asdict(self)


__all__ = ["BatchCounters"]
