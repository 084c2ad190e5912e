"""``KVCoreCellCache``: many sequences behind ExecuTorch's ``kvcache::update_and_attend`` op, a
drop-in replacement for ExecuTorch's ``CellReferenceCache`` over a ``kvcore.BatchCache`` and a torch
paged store (kvcore.integrations.executorch says what both op caches promise).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

# executorch_spec first: its import names what to install when torch or executorch is missing.
from kvcore.integrations.executorch_spec import (
    AttendSpec,
    CacheSizing,
    CAUSAL_SPEC,
    check_layer,
    kvcore_layers,
    MaskKind,
    MAX_SEQS,
    NONE_SPEC,
    position_ranges,
)

import numpy as np  # noqa: E402
import torch  # noqa: E402

from kvcore._core import BatchCache, BatchLimits, BatchStep, CacheBase, CacheConfig, LayerPolicy, Ring  # noqa: E402
from kvcore._errors import CapacityError, InvalidArgumentError, InvalidStateError, KVCacheError  # noqa: E402
from kvcore.forward_step import ForwardStep  # noqa: E402
from kvcore.quantized import kv_format  # noqa: E402
from kvcore.torch.paged import TorchPagedKVPool  # noqa: E402
from kvcore.torch.quantized_paged import TorchQuantizedPagedKVPool  # noqa: E402


@dataclass
class _Declared:
    """A step declared by ``begin_step`` (and begun in kvcore, which admitted it), not yet
    placed by its forward."""

    seq_ids: list[int]  # per token, in the forward's order
    entries: list[tuple[int, int]]  # (seq, T) per sequence, in order of first appearance
    step: BatchStep  # kvcore's step; a verb before the forward may have ended it
    added: list[int]  # sequences begin_step made active: released again if the step is abandoned


@dataclass
class _Placed:
    """A step placed by its forward's first layer: per group the write rows, live rows and spec."""

    slots: list[torch.Tensor]
    rows: list[int]
    specs: list[Any]


class KVCoreCellCache:
    """Many sequences behind ``update_and_attend``: a drop-in for ExecuTorch's ``CellReferenceCache``.

    Tokens of every sequence share one axis (``B = 1``); ``begin_step(seq_ids)`` names each
    token's sequence, the forward brings the positions. kvcore's ``BatchCache`` places them:
    one pool of blocks per group of layers sharing a policy (one group per distinct window),
    blocks allocated lowest index first so a group's live rows stay packed at the start of
    its pool. kvcore-only keywords:

    - ``block_size``: rows per block (default 1: cell-granular, like the reference);
    - ``max_seqs``: sequence ids are ``0 .. max_seqs - 1`` (default 63, ExecuTorch's
      ``MAX_SEQS``; kvcore has no bitset, any value up to 2**20 works);
    - ``max_step``: the most tokens of one sequence in one step (default
      ``min(512, capacity)``); a ring group keeps ``window + max_step - 1`` positions of a
      sequence (and releases the rest), so keep it near your prefill chunk;
    - ``max_holes``: separate removed middle ranges one sequence may have (default 8);
    - ``max_active_seqs``: sequences holding positions at once (default 16, at most
      ``max_seqs``); kvcore keeps one block table row of ``capacity / block_size`` entries
      per group for each, so this, not ``max_seqs``, sizes the tables. A step or ``seq_cp``
      that would make one more sequence active raises ``kvcore.CapacityError``
      (``RuntimeError``) and changes nothing; a sequence ``seq_rm`` empties gives its row back;
    - ``v_head_dim``: the value head dim when it differs from ``head_dim``;
    - ``kv_dtype``: None (default: rows stored in ``config.dtype``), ``"int8"`` (ExecuTorch's
      ``QuantizedKVCache`` rule) or ``"fp8"`` (float8 e4m3fn): rows stored quantized, each with
      its scales, in a ``TorchQuantizedPagedKVPool`` (forks, copies and ``seq_rm`` move them
      with their rows); the history is returned dequantized in the dtype ``k`` and ``v`` come
      in (float32, float16 or bfloat16, both the same). ``ValueError``
      (``kvcore.InvalidArgumentError``) naming any other value and the choices, before
      anything is built.

    Differences from the reference, all documented in docs/executorch.md: kvcore appends, so a
    sequence's tokens must be at its length onwards (``ValueError`` naming it otherwise); ring
    layers release cells out of every future window (so ``seq_rm`` truncating into released
    history raises ``RuntimeError``); ``seq_cp`` into a sequence that still sees positions
    raises ``RuntimeError`` (the reference would merge the two); the spec is ``NONE`` or
    ``CAUSAL`` when that is exact.
    """

    def __init__(
        self,
        config: Any,
        *,
        block_size: int = 1,
        max_seqs: int = MAX_SEQS,
        max_step: Optional[int] = None,
        max_holes: int = 8,
        max_active_seqs: int = 16,
        v_head_dim: Optional[int] = None,
        kv_dtype: Optional[str] = None,
    ) -> None:
        if kv_dtype is not None:
            kv_format(kv_dtype)  # an unknown name is refused before anything is built
        if config.batch_size != 1:
            raise InvalidArgumentError("cell cache is flat on the token axis: batch_size must be 1")
        self.config = config
        capacity = int(config.capacity)
        if block_size < 1:
            raise InvalidArgumentError(f"block_size = {block_size}: must be >= 1")
        if max_active_seqs < 1:
            raise InvalidArgumentError(f"max_active_seqs = {max_active_seqs}: must be >= 1")
        layer_configs = kvcore_layers(config, v_head_dim)
        active = min(max_active_seqs, max_seqs)

        def limits_of(num_blocks: int) -> BatchLimits:
            # One group per window (page_layers = n_layers), as the reference keeps one mask per window.
            return BatchLimits(block_size=block_size, max_seqs=max_seqs, num_blocks=num_blocks, max_holes=max_holes,
                               max_active_seqs=active, page_layers=int(config.n_layers))

        # Every group draws from one pool (docs/batch.md section 5): each flat group gets the
        # reference's `capacity` cells, each ring group what kvcore's default gives its windows.
        probe = BatchCache(CacheConfig(capacity, layer_configs, max_step=max_step, batch=limits_of(0)))
        stride = -(-capacity // block_size)
        flat_groups = sum(1 for g in range(probe.n_groups) if probe.group_policy(g).kind == LayerPolicy.Kind.Flat)
        windows = probe.num_blocks(0) - flat_groups * active * probe.table_stride if probe.n_groups else 0
        limits = limits_of(flat_groups * stride + windows)
        self.cache = BatchCache(CacheConfig(capacity, layer_configs, max_step=max_step, batch=limits))
        self.block_size = block_size
        self.max_seqs = self.cache.max_seqs
        self._n_layers = int(config.n_layers)
        self._n_groups = self.cache.n_groups
        self._static = config.sizing is CacheSizing.STATIC
        # STATIC: the whole pool's rows per storage (the groups' layers share them)
        rows_hint = [self.cache.num_blocks(g) * block_size for g in range(self._n_groups)]
        #: None (rows stored in ``config.dtype``), ``"int8"`` or ``"fp8"`` (stored quantized).
        self.kv_dtype = kv_dtype
        self.storage = (
            TorchPagedKVPool(self.cache, dtype=config.dtype, preallocate=self._static, rows_hint=rows_hint)
            if kv_dtype is None
            else TorchQuantizedPagedKVPool(self.cache, kv_dtype, preallocate=self._static, rows_hint=rows_hint)
        )
        self._group_of = self.storage.group_of
        self._declared: Optional[_Declared] = None
        self._placed: Optional[_Placed] = None
        # The forward under way: its first layer places and commits the step (the reference
        # claims cells there), an error before that commit aborts it (forward_step).
        self._forward: ForwardStep[BatchStep] = ForwardStep(self._n_layers, commit_after=1)
        self._added: list[int] = []  # sequences the placed step made active, until it commits

    # --- kvcore facts -------------------------------------------------------------

    @property
    def kvcore(self) -> CacheBase:
        """The kvcore cache planning this one (a ``kvcore.BatchCache``), e.g. for kvcore's registry."""
        return self.cache

    def nbytes(self, layer_id: Optional[int] = None) -> int:
        """Bytes of K/V tensors held by one layer or all."""
        return self.storage.nbytes(layer_id)

    # --- runner face: admission, lifecycle, sequence verbs ----------------------

    def free_cells(self) -> int:
        """Rows free for new tokens: each flat group's share of the one pool is the reference's
        ``capacity`` cells, so ``min over flat groups of (capacity blocks - held_blocks(g)) *
        block_size``, at most the pool's free blocks (with no flat group: the free blocks shared
        out over the groups, a block of new tokens taking one in each).

        With flat layers this is the reference's count. Ring groups draw from the same pool,
        sized by kvcore for their windows and released as they slide.
        """
        c = self.cache
        free = c.free_blocks(0) if self._n_groups else 0
        flat = [g for g in range(self._n_groups) if c.group_policy(g).kind == LayerPolicy.Kind.Flat]
        if not flat:
            return free // max(self._n_groups, 1) * self.block_size
        share = min(c.table_stride - c.held_blocks(g) for g in flat)
        return min(share, free) * self.block_size

    def can_extend(self, n: int = 1) -> bool:
        """Whether ``n`` more tokens fit: ``free_cells() >= n`` (exact with ``block_size=1``;
        with larger blocks ``begin_step`` decides exactly)."""
        return self.free_cells() >= n

    def seq_len(self, seq_id: int) -> int:
        """Positions the sequence still sees (its length less removed ones); 0 for one never used.

        ``ValueError`` (``kvcore.InvalidArgumentError``): ``seq_id`` outside ``[0, max_seqs)``.
        """
        self._check_seq_id(seq_id)
        return self.cache.sequence(seq_id).visible_positions

    def begin_step(self, seq_ids: Sequence[int]) -> None:
        """Declare the sequence each of the next forward's tokens belongs to (any order).

        Admission is kvcore's: the step is begun here (sequences are added on first use),
        so a step that passes cannot then fail to place unless a verb in between changes
        the pools. ``ValueError``: no tokens, a bad id, more than ``max_step`` tokens of one
        sequence or ``max_step_tokens`` in all. ``RuntimeError``: the pools or a sequence's
        capacity cannot take the step. A refused step changes nothing.
        """
        ids = [int(s) for s in seq_ids]
        if not ids:
            raise InvalidArgumentError("a step carries at least one token")
        counts: dict[int, int] = {}
        for seq_id in ids:
            self._check_seq_id(seq_id)
            counts[seq_id] = counts.get(seq_id, 0) + 1
        entries = list(counts.items())
        capacity = self.cache.capacity
        for seq_id, T in entries:  # first, as the reference: kvcore would name max_step before capacity
            length = self.cache.length(seq_id)
            if length + T > capacity:
                raise CapacityError(
                    f"KV cache full: sequence {seq_id} at length {length} with {T} new tokens passes capacity {capacity}"
                )
        added = self._activate(entries)
        try:
            step = self.cache.begin_step(entries)  # replaces a declared step no forward placed
        except KVCacheError:
            self._release_empty(added)
            raise
        # A declared step no forward placed is replaced (kvcore's begin_step ended it); the
        # sequences it added stay active and empty: releasing them now would end this step.
        self._declared = _Declared(ids, entries, step, added)
        self._placed = None
        self._forward.end()

    def _activate(self, entries: list[tuple[int, int]]) -> list[int]:
        added = [seq_id for seq_id, _ in entries if not self.cache.sequence(seq_id).active]
        self.cache.add_sequences(added)  # all or none (CapacityError past max_active_seqs)
        return added

    def _release_empty(self, seq_ids: list[int]) -> None:
        """Release the sequences a step made active that still hold nothing (the step did not commit)."""
        for seq_id in seq_ids:
            info = self.cache.sequence(seq_id)
            if info.active and info.length == 0:
                self.cache.release_sequence(seq_id)

    def seq_cp(self, src_id: int, dst_id: int, upto: Optional[int] = None) -> None:
        """``dst_id`` inherits ``src_id``'s positions below ``upto`` (None: all), sharing rows, copying no K/V.

        ``RuntimeError`` when ``dst_id`` still sees positions of its own (kvcore forks into an
        empty sequence), or when a ring layer of ``src_id`` released what ``dst_id`` would need.
        A refused ``seq_cp`` changes nothing.
        """
        self._check_seq_id(src_id)
        self._check_seq_id(dst_id)
        self._placed = None
        src = self.cache.sequence(src_id)
        if not src.active or src_id == dst_id:
            return  # nothing to share (the reference's no-op)
        n = src.length if upto is None else max(0, min(int(upto), src.length))
        dst = self.cache.sequence(dst_id)
        if dst.active and dst.length > 0 and dst.visible_positions == 0:
            # It sees nothing: forking into it is the reference's merge. kvcore forks into an
            # empty sequence, so dst goes first, but only once the fork cannot be refused.
            if not self.cache.can_rewind(src_id, n):
                raise InvalidStateError(
                    f"seq_cp({src_id}, {dst_id}, upto = {n}): a ring layer of sequence {src_id} no longer holds "
                    f"what a query at {n} needs (kvcore's rewind rule); nothing changed"
                )
            self.cache.release_sequence(dst_id)
        self.cache.fork(src_id, dst_id, n)

    def seq_rm(self, seq_id: int, p0: int = 0, p1: Optional[int] = None) -> None:
        """Drop ``seq_id``'s positions ``[p0, p1)`` (``p1`` None: to its end); a row frees when no sequence holds it.

        ``RuntimeError`` when truncating into history a ring layer already released, or
        (``kvcore.CapacityError``) when the sequence would keep more than ``max_holes`` removed ranges.
        """
        self._check_seq_id(seq_id)
        self._placed = None
        if not self.cache.sequence(seq_id).active:
            return
        p0 = max(0, int(p0))
        if p1 is not None and int(p1) <= p0:
            return
        self.cache.remove(seq_id, p0, None if p1 is None else int(p1))
        if self.cache.sequence(seq_id).length == 0:
            self.cache.release_sequence(seq_id)  # holds nothing: its table row goes back

    def reset(self) -> None:
        """Forget every sequence; ``DYNAMIC`` sizing also gives the tensors back."""
        self.cache.clear()
        self._declared = None
        self._placed = None
        self._added = []
        self._forward.end()  # clear ended a begun step
        if not self._static:
            self.storage.release()

    # --- op face ------------------------------------------------------------------------

    def update_and_fetch(
        self, layer_id: int, k: torch.Tensor, v: torch.Tensor, position: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """Write this step's K/V of ``layer_id`` at its rows, return the group's live rows and the spec.

        The first layer served places the step (kvcore's plan) and, once its K/V are checked
        and written, commits it: the tokens join their sequences, as the reference claims
        cells there; the others reuse the placement. History: rows ``[0, used_blocks *
        block_size)`` of the layer's group pool, ``[1, H, rows, dim]`` views (with ``kv_dtype``:
        dequantized in ``k``'s dtype into a workspace the next update reuses); the spec's mask
        (one object per group and step) is ``[n_tokens, rows]``.

        Errors (kvcore's exceptions subclass the builtins named). The first layer's placement
        uses up the declaration, so after a failure there ``begin_step`` must come again; a
        failure there changes nothing (kvcore aborts the step):

        - ``ValueError`` (``kvcore.InvalidArgumentError``): ``layer_id`` outside ``[0, n_layers)``;
          the forward carries another number of tokens than ``begin_step`` declared; a
          sequence's positions are not its length onwards, each once; ``k``/``v`` not
          ``[1, n_kv_heads, n_tokens, dim]``; with ``kv_dtype``, ``k``/``v`` not of one dtype of
          float32, float16, bfloat16, or holding inf or NaN, or a (token, head) whose range
          passes FLT_MAX (checked before any row of the layer is written).
        - ``RuntimeError``: ``kvcore.InvalidStateError`` when no step is declared or the layer was
          already served for it; ``kvcore.CapacityError`` when a verb between ``begin_step`` and
          the forward left the pools unable to take the step.
        - ``NotImplementedError``: ``position`` not ``[n_tokens, 1]`` (one position per token).
        """
        check_layer(layer_id, self._n_layers)
        if self._forward.is_served(layer_id):
            raise InvalidStateError(
                f"layer {layer_id} served twice for one step: begin_step must precede every forward"
            )
        placed = self._placed
        if placed is None:
            placed = self._placed = self._place(position)
        g = self._group_of[layer_id]

        def write() -> tuple[torch.Tensor, torch.Tensor, Any]:
            keys, values = self.storage.write_read(layer_id, placed.slots[g], k, v, placed.rows[g])
            return keys, values, placed.specs[g]

        committed = self._forward.committed
        try:
            out = self._forward.serve(layer_id, write)  # the first layer served commits
        except BaseException:
            if not committed:  # aborted: the sequences the step made active go again
                self._placed = None
                self._release_empty(self._added)
            raise
        self._added = []
        return out

    def _place(self, position: torch.Tensor) -> _Placed:
        """Lay the declared step out on the forward's token order and perform its block copies;
        the forward's step from then on. Any error aborts the step (nothing changes)."""
        declared = self._declared
        if declared is None:
            raise InvalidStateError("no step declared: begin_step must precede every forward")
        self._declared = None  # one declaration, one attempt at placing it
        try:
            placed, step = self._lay_out(declared, position)
        except BaseException:
            if declared.step.is_current:
                declared.step.abort()
            self._release_empty(declared.added)
            raise
        self._added = declared.added
        self._forward.begin(lambda: step)
        return placed

    def _lay_out(self, declared: _Declared, position: torch.Tensor) -> tuple[_Placed, BatchStep]:
        if position.dim() != 2 or int(position.shape[-1]) != 1:
            raise NotImplementedError(
                f"cell placement needs one position per token ([n_tokens, 1]), got {tuple(position.shape)}"
            )
        order = self._token_order(declared, position.reshape(-1).tolist())
        step = declared.step
        if not step.is_current:  # a verb since begin_step ended it (and may have released a sequence)
            declared.added += self._activate(declared.entries)
            step = self.cache.begin_step(declared.entries)
        plan = step.plan()
        for g, group in enumerate(plan.groups):  # copy-on-write of shared, partly filled blocks, before any write
            self.storage.copy_blocks(g, group.copies)
        identity = order == list(range(len(order)))
        index = None if identity else torch.tensor(order, dtype=torch.long)
        slots, rows, specs = [], [], []
        for g, group in enumerate(plan.groups):
            s = torch.from_numpy(group.slots.astype(np.int64))
            mask_np = plan.mask(g)  # over rows [0, used_blocks * block_size): every live row
            mask = torch.from_numpy(mask_np)
            if index is not None:
                s, mask = s[index], mask[index]
            slots.append(s)
            rows.append(int(mask_np.shape[1]))
            specs.append(_cell_spec(mask_np, mask, identity))
        return _Placed(slots, rows, specs), step

    def _token_order(self, declared: _Declared, positions: list[int]) -> list[int]:
        """Where each of the forward's tokens sits in kvcore's layout (sequence after sequence,
        entry order). ValueError unless each sequence's tokens are at its length onwards, each once."""
        if len(positions) != len(declared.seq_ids):
            raise InvalidArgumentError(
                f"begin_step declared {len(declared.seq_ids)} tokens, the forward carries {len(positions)}"
            )
        start: dict[int, tuple[int, int, int]] = {}  # seq -> (first token in kvcore's order, length, T)
        at = 0
        for seq_id, T in declared.entries:
            start[seq_id] = (at, self.cache.length(seq_id), T)
            at += T
        order = [0] * len(positions)
        taken = [False] * len(positions)
        for t, (seq_id, pos) in enumerate(zip(declared.seq_ids, positions)):
            first, length, T = start[seq_id]
            j = pos - length
            if not 0 <= j < T or taken[first + j]:
                got = [p for s, p in zip(declared.seq_ids, positions) if s == seq_id]
                raise InvalidArgumentError(
                    f"sequence {seq_id}: its {T} tokens are at positions {position_ranges(sorted(got))}, but they must be "
                    f"{length}..{length + T - 1} (kvcore appends at the sequence's length; seq_rm to go back)"
                )
            taken[first + j] = True
            order[t] = first + j
        return order

    def _check_seq_id(self, seq_id: int) -> None:
        if not 0 <= seq_id < self.max_seqs:
            raise InvalidArgumentError(f"seq_id {seq_id} outside [0, {self.max_seqs})")


def _cell_spec(mask_np: Any, mask: torch.Tensor, identity: bool) -> Any:
    """NONE when every token sees every row, CAUSAL when the rows are exactly the tokens, each seeing itself
    and the earlier ones, else EXPLICIT with the mask (bool [n_tokens, rows], True = attend)."""
    n, rows = mask_np.shape
    if mask_np.all():
        return NONE_SPEC
    if identity and n == rows and np.array_equal(mask_np, np.tri(n, dtype=bool)):
        return CAUSAL_SPEC
    return AttendSpec(kind=MaskKind.EXPLICIT, mask=mask)


__all__ = ["KVCoreCellCache"]
