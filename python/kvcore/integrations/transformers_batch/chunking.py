"""A scheduler that cuts each request's chunk at kvcore's ``max_step``.

transformers' schedulers give one request as many tokens as the forward's
budget has left. kvcore sizes a sliding group's blocks per sequence from the
largest chunk of one sequence (``max_step``: the window plus twice that, so a
chunk can be written and rewound in place), so a small ``max_step`` holds less
K/V than a whole forward's budget would. ``capped_scheduler`` derives, from
transformers' scheduler class, one whose ``_schedule_request`` never gives a
request more than ``max_step`` tokens; the rest of the forward's budget goes to
other requests, and the request continues in the next forward.
"""

from __future__ import annotations

from typing import Any


def capped_scheduler(base: Any, max_step: int, chunk: int = 0) -> type:
    """A subclass of transformers' scheduler class ``base`` that schedules at most ``max_step``
    tokens of one request per forward and, with ``chunk`` > 0 (a model with chunked layers),
    never carries a request across a multiple of ``chunk``: its queries then all see the same
    chunk, which transformers' causal mask over the chunk's keys expresses exactly."""

    def _schedule_request(
        self: Any, state: Any, request_tokens: list[int], token_budget: int, removed: set[str]
    ) -> None:
        budget = min(token_budget, max_step)
        if chunk:
            budget = min(budget, chunk - state.position_offset % chunk)
        base._schedule_request(self, state, request_tokens, budget, removed)

    return type(f"KVCore{base.__name__}", (base,), {"_schedule_request": _schedule_request, "max_step": max_step})


__all__ = ["capped_scheduler"]
