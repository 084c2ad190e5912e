"""The requests of one forward: admitted one by one as transformers schedules, begun once when it builds inputs.

transformers' scheduler asks the cache, request by request, whether the next
tokens fit (``can_store_request_tokens``); kvcore admits a step when, in every
group, the blocks its entries need add up to at most the group's free blocks.
``StepRound`` keeps that sum: each admission asks kvcore what the new request
needs (``blocks_needed``, kvcore's own count per entry, so the answer is the one
``begin_step`` would give) and admits it if the sum still fits; nothing is begun
then. When transformers builds the forward's inputs the step is begun, once,
with what each request really carries (a parent of parallel samples may carry
one token less than it asked for) and its token ids (so full blocks get named
for prefix reuse), and its plan is turned into transformers' read and write
indices: one pool row per key a query reads, per attention type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import numpy.typing as npt

from kvcore._core import BatchCache, BatchStep
from kvcore._errors import CapacityError, InternalError
from kvcore.integrations.transformers_batch.group_view import GroupView

TMP_TOKEN_ID = -1  # transformers' placeholder for a token not sampled yet


@dataclass
class Admitted:
    """A request in the round: its id, kvcore sequence, transformers state, tokens admitted and
    the blocks they need per kvcore group."""

    request_id: str
    seq: int
    state: Any
    tokens: int
    need: list[int]


@dataclass
class PlannedEntry:
    """Where one request's step goes: its place, first position, tokens, and rows per group."""

    place: int
    first: int
    tokens: int
    writes: list[npt.NDArray[np.int64]]
    reads: list[npt.NDArray[np.int64]]


class StepRound:
    """The step being assembled (``admit``), then begun and planned (``plan``) and run by the layers."""

    def __init__(self, batch: BatchCache, views: list[GroupView]) -> None:
        self.batch = batch
        self.views = views
        self.admitted: list[Admitted] = []
        self.needed = [0] * batch.n_groups  # per group: the admitted requests' blocks_needed, summed
        self._by_id: dict[str, Admitted] = {}
        self._unsettled: Optional[Admitted] = None  # the last admitted, until it is scheduled
        self.step: Optional[BatchStep] = None
        self.planned: Optional[dict[str, PlannedEntry]] = None
        self.next_place = 0
        self.copies: list[npt.NDArray[np.int32]] = []
        self.live_rows: list[int] = []
        self.layers_done = 0

    # --- admission ------------------------------------------------------------------

    def admit(self, request_id: str, seq: int, state: Any, tokens: int) -> bool:
        """Admit the request's next ``tokens`` if the pool has the blocks they need in every group
        besides those of the requests admitted before (kvcore's count); False (nothing changes)
        otherwise."""
        try:
            need = self.batch.blocks_needed(seq, tokens)
        except CapacityError:
            return False
        if not self.fits(need):
            return False
        a = Admitted(request_id, seq, state, tokens, need)
        self.admitted.append(a)
        self._by_id[request_id] = a
        self._count(need, 1)
        self._unsettled = a
        return True

    def fits(self, extra: Optional[list[int]] = None) -> bool:
        """Do the admitted requests (plus ``extra`` blocks per group) fit the free blocks of the one
        pool every group draws from (their needs added up over the groups, as begin_step counts)?
        Asked again after a verb that takes free blocks (a prefix adopted)."""
        self._settle()
        total = sum(self.needed) + (sum(extra) if extra is not None else 0)
        return total <= (self.batch.free_blocks(0) if self.batch.n_groups else 0)

    def _count(self, need: list[int], sign: int) -> None:
        for g, n in enumerate(need):
            self.needed[g] += sign * n

    def _settle(self) -> None:
        # transformers schedules a request right after admitting it (before it asks about the next
        # one) and may give it one token less than asked (a parent of parallel samples): count what
        # the last one admitted really carries.
        a, self._unsettled = self._unsettled, None
        if a is None:
            return
        carried = len(a.state.tokens_to_process)
        if 1 <= carried < a.tokens:
            self._count(a.need, -1)
            a.tokens = carried
            a.need = self.batch.blocks_needed(a.seq, carried)
            self._count(a.need, 1)

    def drop(self, request_id: str) -> None:
        """Forget a request admitted but not planned (cancelled before its forward)."""
        a = self._by_id.pop(request_id, None)
        if a is not None:
            self.admitted.remove(a)
            self._count(a.need, -1)
            if self._unsettled is a:
                self._unsettled = None

    def holds(self, request_id: str) -> bool:
        """Is the request in this round?"""
        return request_id in self._by_id

    def end(self) -> None:
        """Leave the round: the admissions are dropped, a begun, uncommitted step is aborted (its
        blocks go back)."""
        if self.step is not None and self.step.is_current:
            self.batch.abort(self.step)
        self.admitted, self.step, self.planned = [], None, None
        self.needed = [0] * len(self.needed)
        self._by_id, self._unsettled = {}, None
        self.next_place, self.layers_done = 0, 0

    # --- the exact step -----------------------------------------------------------------

    def plan(self, batch: list[Any]) -> None:
        """Begin the forward's one step: what the scheduled ``batch`` (transformers' future states, in
        input order) really carries, with its token ids; and lay out its indices. Raises InternalError
        if the batch is not the admitted requests, or kvcore refuses what they were admitted for."""
        by_id = self._by_id
        if sorted(by_id) != sorted(f.state.request_id for f in batch):
            raise InternalError(
                f"the scheduled batch {[f.state.request_id for f in batch]} is not the admitted {sorted(by_id)}"
            )
        self.admitted = [by_id[f.state.request_id] for f in batch]
        seqs, counts, tokens, offsets = [], [], [], [0]
        for a, future in zip(self.admitted, batch):
            carried = list(a.state.tokens_to_process)
            length = self.batch.length(a.seq)
            planned = 1 <= len(carried) <= a.tokens and len(carried) == future.query_length
            if not planned or a.state.position_offset != length:
                raise InternalError(
                    f"request {a.request_id}: carries {len(carried)} tokens at position {a.state.position_offset}; "
                    f"kvcore admitted {a.tokens} at its length {length}"
                )
            seqs.append(a.seq)
            counts.append(len(carried))
            if TMP_TOKEN_ID not in carried:  # ids known: the blocks they fill get named
                tokens.extend(carried)
            offsets.append(len(tokens))
        try:
            self.step = self.batch.begin_step(
                np.array(seqs, np.int32),
                np.array(counts, np.int32),
                np.array(tokens, np.int64),
                np.array(offsets, np.int32),
            )
        except CapacityError as e:  # each request carries at most what it was admitted for
            raise InternalError(f"kvcore refused the admitted step: {e}") from e
        self._lay_out()

    def _lay_out(self) -> None:
        assert self.step is not None
        plan = self.step.plan()
        B = plan.block_size
        starts, firsts, ends = plan.query_starts, plan.first_positions, plan.context_lens
        planned: dict[str, PlannedEntry] = {}
        groups = [plan.groups[v.group] for v in self.views]
        tables = [g.entry_tables for g in groups]  # per entry, either table layout
        self.copies = [np.array(g.copies) for g in groups]
        self.live_rows = [self.batch.used_blocks(v.group) * B for v in self.views]
        for i, a in enumerate(self.admitted):
            first, end = int(firsts[i]), int(ends[i])
            writes, reads = [], []
            for view, group, table in zip(self.views, groups, tables):
                writes.append(np.asarray(group.slots[starts[i] : starts[i + 1]], np.int64))
                positions = np.arange(view.first_read(first), end, dtype=np.int64)
                blocks = table[i][positions // B].astype(np.int64)
                if len(blocks) and blocks.min() < 0:  # kvcore holds every block a query needs
                    raise InternalError(f"request {a.request_id}: group {view.group} reads a released block")
                reads.append(blocks * B + positions % B)
            planned[a.request_id] = PlannedEntry(i, first, end - first, writes, reads)
        self.planned = planned


__all__ = ["Admitted", "PlannedEntry", "StepRound"]
