"""StepLayout: how the layers of one policy of a ``TorchKVPool`` write and read one step.

kvcore's plan of a step says, with integers, which rows the step writes and which
rows its queries read; this module turns it, once per step and layer policy, into
what the torch pool indexes with: write destinations (a mirrored ring's repeated
rows included), the read spans in the pool's order, the key positions a mask is
built from, and a tree step's node rows. ``kvcore.torch.pool`` applies it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import torch

from kvcore._core import LayerGeometry, SeqStepPlan, Step
from kvcore._errors import InternalError

def read_positions(plan: SeqStepPlan) -> list[int]:
    """The logical positions a plan's read returns, in the order returned."""
    return [run.pos + i for run in plan.read for i in range(run.len)]


def _position_ranges(plan: SeqStepPlan) -> tuple[tuple[int, int], ...]:
    """The plan's read as position ranges [start, stop), adjacent runs merged."""
    out: list[tuple[int, int]] = []
    for r in plan.read:
        if out and out[-1][1] == r.pos:
            out[-1] = (out[-1][0], r.pos + r.len)
        else:
            out.append((r.pos, r.pos + r.len))
    return tuple(out)


class RowStorage:
    """Row facts shared by the layers of one policy, from kvcore's geometry, and the mirror."""

    __slots__ = ("geometry", "rows", "ring_start", "mirror_rows")

    def __init__(self, geometry: LayerGeometry, mirror: bool) -> None:
        self.geometry = geometry
        self.rows = geometry.rows  # kvcore's rows for the layer
        self.ring_start = geometry.sink_rows  # first ring row (the sinks)
        # Rows [rows, rows + mirror_rows) repeat [ring_start, ...).
        self.mirror_rows = geometry.mirror_rows if mirror else 0


class StepLayout:
    """How the layers of one policy write and read one step (computed once per step and policy).

    ``writes``: ``(row, len, offset)`` copies of input rows ``[offset, offset + len)``,
    mirror copies included. ``index``: for ``T = 1``, the destination rows of the one
    new row (two when it is mirrored), else empty. ``view``: ``(row, len)`` when the read is one span
    of rows, else None and ``gather`` lists the spans. ``positions``: the plan's read as
    position ranges in increasing order. ``order``: the order reads return rows in;
    ``key_positions()`` gives the position of each returned row (what masks are built from).
    ``step``: the begun ``Step`` it was laid out for (``write_read`` refuses the layout once
    that step has ended).

    A draft-tree step (``tree``: the layer's ``step.tree_rows(layer)`` and the token
    position of each chain index, ``length + depth`` of the node there) writes by
    index instead: ``tree_dst`` lists destination rows (one per node, node order,
    then the mirror copies) and ``tree_src`` the input row (node) of each.
    """

    __slots__ = (
        "position", "T", "order", "writes", "flat_writes", "index", "pair", "write_end", "view", "gather", "read_len", "positions",
        "tree_dst", "tree_src", "step", "storage", "_chain_positions", "_geometry", "_key_positions", "_on", "_last", "_tree_on",
    )  # fmt: skip

    def __init__(
        self,
        plan: SeqStepPlan,
        storage: RowStorage,
        position: int,
        T: int,
        order: str = "rows",
        tree: Optional[tuple[Sequence[int], Sequence[int]]] = None,
        step: Optional[Step] = None,
    ) -> None:
        self.step = step
        self.storage = storage
        self.position = position
        self.T = T
        self.order = order
        self._geometry = storage.geometry
        self._key_positions: Optional[list[int]] = None
        self.tree_dst: tuple[int, ...] = ()
        self.tree_src: tuple[int, ...] = ()
        self._chain_positions: Optional[Sequence[int]] = None
        self._tree_on: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        writes: list[tuple[int, int, int]] = []
        j = 0
        for r in plan.write:
            writes.append((r.row, r.len, j))
            j += r.len
        if j > T:  # the writes read input rows [0, j): _copy_rows checks nothing
            raise InternalError(f"the plan writes {j} rows for a step of T = {T}")
        if storage.mirror_rows:
            lo_m, hi_m = storage.ring_start, storage.ring_start + storage.mirror_rows
            for row, n, off in list(writes):
                lo, hi = max(row, lo_m), min(row + n, hi_m)
                if lo < hi:
                    writes.append((storage.rows + lo - lo_m, hi - lo, off + lo - row))
        self.writes = tuple(writes)
        self.flat_writes = tuple(x for w in writes for x in w)  # what _copy_rows takes
        self.index: tuple[int, ...] = tuple(w[0] for w in writes) if T == 1 else ()
        # T = 1 written to a row and its mirror copy: (row, mirror row - row), else None.
        self.pair = (self.index[0], self.index[1] - self.index[0]) if len(self.index) == 2 else None
        self.write_end = max((row + n for row, n, _ in writes), default=0)  # 0: a Shared layer writes nothing
        if tree is not None:
            self._lay_out_tree(storage, *tree)
        self.positions = _position_ranges(plan)
        spans: list[tuple[int, int]] = []
        if order == "rows":  # every held row, as they lie: one view
            held = storage.geometry.held_rows(position + T)
            spans.append((0, held))
            self.read_len = held
        else:  # the plan's read in position order, a window that wraps continuing into the mirror
            next_pos = -1  # the position after the last span
            for r in plan.read:
                if spans and storage.mirror_rows:
                    row, n = spans[-1]
                    if (
                        row + n == storage.rows
                        and r.row == storage.ring_start
                        and r.pos == next_pos
                        and r.len <= storage.mirror_rows
                    ):
                        spans[-1] = (row, n + r.len)
                        next_pos += r.len
                        continue
                spans.append((r.row, r.len))
                next_pos = r.pos + r.len
            self.read_len = plan.read_len
        self.view: Optional[tuple[int, int]] = spans[0] if len(spans) == 1 else None
        self.gather = tuple(spans)
        self._on: dict[torch.device, torch.Tensor] = {}
        self._last: Optional[tuple[torch.device, torch.Tensor]] = None

    def _lay_out_tree(self, storage: RowStorage, rows: Sequence[int], chain_positions: Sequence[int]) -> None:
        """Index writes of a tree step: node i to rows[i], then the mirror copies of rows in the mirrored span."""
        dst = [int(r) for r in rows]
        src = list(range(len(dst)))
        lo_m, n_m = storage.ring_start, storage.mirror_rows
        for i, row in enumerate(list(dst)):
            if n_m and lo_m <= row < lo_m + n_m:
                dst.append(storage.rows + row - lo_m)
                src.append(i)
        self.tree_dst, self.tree_src = tuple(dst), tuple(src)
        self.writes, self.flat_writes, self.index, self.pair = (), (), (), None
        self.write_end = max(dst, default=-1) + 1
        self._chain_positions = chain_positions

    def key_positions(self) -> list[int]:
        """The logical position of each row a read returns, in the order returned (made once). A
        tree step's rows hold their node's position (``length + depth``), not their chain position."""
        if self._key_positions is None:
            if self.order == "rows":
                end = self.position + self.T
                at = [self._geometry.position_at(r, end) for r in range(self.read_len)]
            else:
                at = [p for a, b in self.positions for p in range(a, b)]
            tree, P = self._chain_positions, self.position
            self._key_positions = at if tree is None else [p if p < P else int(tree[p - P]) for p in at]
        return self._key_positions

    def tree_index_on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``(tree_dst, tree_src)`` as tensors on ``device`` (made once per step and device)."""
        got = self._tree_on.get(device)
        if got is None:
            got = (
                torch.tensor(self.tree_dst, dtype=torch.long, device=device),
                torch.tensor(self.tree_src, dtype=torch.long, device=device),
            )
            self._tree_on[device] = got
        return got

    def index_on(self, device: torch.device) -> torch.Tensor:
        """``index`` as a tensor on ``device`` (made once per step and device)."""
        last = self._last
        if last is not None and last[0] == device:  # every layer of a model is usually on one device
            return last[1]
        t = self._on.get(device)
        if t is None:
            t = torch.tensor(self.index, dtype=torch.long, device=device)
            self._on[device] = t
        self._last = (device, t)
        return t


__all__ = ["RowStorage", "StepLayout", "read_positions"]
