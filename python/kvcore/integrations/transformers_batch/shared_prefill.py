"""Which new requests should wait for a shared prompt another request is computing.

transformers' scheduler admits new requests into a forward as long as the
budget lasts, so requests that start with the same system prompt, admitted
together, all compute it: nothing is cached yet. ``SharedPrefill`` remembers the
first block of every request still prefilling its prompt; a new request whose
prompt starts with such a block waits (its admission is refused for that
forward) until that request has computed and committed its prompt, then adopts
all of it from the cache. Requests whose first block nobody is computing are
admitted as usual.
"""

from __future__ import annotations

from typing import Any


class SharedPrefill:
    """First blocks (``block_size`` token ids) of the prompts being prefilled, by request."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._first_block: dict[str, tuple[int, ...]] = {}
        self._count: dict[tuple[int, ...], int] = {}

    def note(self, request_id: str, state: Any, tokens: int) -> None:
        """After a forward carrying ``tokens`` of the request: remember it while its prompt has
        tokens left to compute, forget it once done."""
        prompt = state.initial_tokens
        if state.position_offset + tokens < len(prompt) and len(prompt) > self.block_size:
            if request_id not in self._first_block:
                key = tuple(prompt[: self.block_size])
                self._first_block[request_id] = key
                self._count[key] = self._count.get(key, 0) + 1
        else:
            self.forget(request_id)

    def forget(self, request_id: str) -> None:
        """The request left, or finished its prompt."""
        key = self._first_block.pop(request_id, None)
        if key is not None:
            self._count[key] -= 1
            if not self._count[key]:
                del self._count[key]

    def should_wait(self, prompt: list[int]) -> bool:
        """Does a request still prefilling start with this prompt's first block?"""
        return len(prompt) > self.block_size and tuple(prompt[: self.block_size]) in self._count

    def clear(self) -> None:
        """Forget every request."""
        self._first_block.clear()
        self._count.clear()


__all__ = ["SharedPrefill"]
