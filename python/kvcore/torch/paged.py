"""TorchPagedKVPool: a ``kvcore.BatchCache``'s K/V rows in torch tensors, one per layer, by pool row.

The torch counterpart of ``kvcore.PagedKVPool`` (``kvcore.torch``: docs/pool.md).

A ``BatchCache`` keeps, per group of layers sharing a policy, a pool of blocks
of ``block_size`` rows and decides where every new token goes (the plan's
``slots``) and which blocks to copy first (``copies``, copy-on-write of a shared,
partly filled block). This module owns the bytes: per layer two tensors
``[1, n_kv_heads, rows, dim]`` (keys, values) whose row ``r`` is row ``r`` of the
layer's group pool. It performs a step's copies, writes the new rows at their
slots and returns a layer's live rows ``[0, used_blocks * block_size)`` as views
(blocks are allocated lowest index first, so the live rows are packed at the
start: no gather). A draft tree's nodes are written at their slots like any
token (mask them with the plan's tree-aware ``mask``); ``apply_copies`` performs
a tree commit's row copies. ``export_sequence`` / ``import_sequence`` move one
sequence as a record (docs/state.md, ``kvcore.torch.paged_records``).

Layer kinds (docs/layer_kinds.md). A Shared layer stores nothing: ``read``,
``tensors`` and ``allocated_rows`` answer from its source's K/V (what the
source's ``write_read`` wrote this step); ``write_read`` on it is refused naming
the source. A State layer stores, as ``TorchStateSlots`` does for one sequence,
any number of named tensors, each with its own shape and dtype (taken from its
first write), indexed by the State group's physical slot: ``state_slots(layer, name)``
is ``[num_slots, *shape]``, the tensor a recurrent kernel indexes with the plan's
``state_groups[k].read_slots`` / ``write_slots`` (vLLM / SGLang
``state_indices``); ``write_state`` / ``read_state`` store and gather by those
slot arrays, and ``apply_copies`` performs a tree commit's slot copies too.

Sizing: ``preallocate=True`` allocates every layer up front (``rows_hint`` rows,
default the group's whole pool); otherwise a layer starts empty and grows by
doubling, never past its group's pool. New rows are zeros: rows a step returns
but masks out must hold finite values (attention computes scores before masking,
and a NaN would survive it).
"""

from __future__ import annotations

import warnings
from typing import Any, Optional, Sequence, Union, cast

import numpy as np
import numpy.typing as npt
import torch

from kvcore._core import BatchCache, LayerPolicy
from kvcore._errors import InvalidArgumentError, InvalidStateError, NotSupportedError
from kvcore.state import RecordSource
from kvcore.torch import paged_records
from kvcore.torch.record_dtypes import RECORD_DTYPE
from kvcore.torch.state_slots import check_like


class TorchPagedKVPool:
    """K/V tensors ``[1, n_kv_heads, rows, dim]`` per layer of a ``BatchCache``, indexed by pool row.

    ``dtype``/``device``: what every tensor holds. ``preallocate``: allocate each layer
    now (``rows_hint(group)`` rows if given, else the group's whole pool) instead of
    growing lazily. A Shared layer stores nothing (its reads are its source's); a State layer
    stores named state tensors by physical slot (see the module docstring). Raises
    InvalidArgumentError for a bad layer or tensors that do not fit, NotSupportedError for a
    cache whose states live in the pool's pages (``BatchLimits.states_in_pool``).
    """

    def __init__(
        self,
        cache: BatchCache,
        *,
        dtype: torch.dtype = torch.float32,
        device: Union[torch.device, str] = "cpu",
        preallocate: bool = False,
        rows_hint: Optional[list[int]] = None,
    ) -> None:
        self.cache = cache
        self.dtype = dtype
        self.device = torch.device(device)
        self.block_size = cache.block_size
        n = cache.n_layers
        configs = [cache.layer_config(layer) for layer in range(n)]
        policies = [c.policy for c in configs]
        # A State layer has no block group (-1): it keeps state slots of its State group.
        self.group_of = [-1 if p.kind == LayerPolicy.Kind.State else cache.group_of(i) for i, p in enumerate(policies)]
        # The layer whose K/V each layer reads: a Shared layer's source, else itself (-1: a State layer).
        self.source_of = [
            int(p.source) if p.kind == LayerPolicy.Kind.Shared else (-1 if p.kind == LayerPolicy.Kind.State else i)
            for i, p in enumerate(policies)
        ]
        self.state_group_of = {i: cache.state_group_of(i) for i, p in enumerate(policies) if p.kind == LayerPolicy.Kind.State}
        for layer in self.state_group_of:  # checked before anything is allocated
            if cache.storage_layer(layer) != layer:
                raise NotSupportedError(
                    f"layer {layer}: its states live in the pages of layer {cache.storage_layer(layer)}'s storage "
                    "(the cache's batch.states_in_pool), and a TorchPagedKVPool keeps state slots apart from K/V "
                    "rows: apply such plans with page-contiguous storage of your own, or build the cache without "
                    "states_in_pool"
                )
        self.num_state_slots = [cache.num_state_slots(k) for k in range(cache.n_state_groups)]
        self._states: dict[int, dict[str, torch.Tensor]] = {i: {} for i in self.state_group_of}
        self._heads = [c.n_kv_heads for c in configs]
        self._dims = [(c.head_dim, c.value_dim) for c in configs]
        # The layer whose tensors each K/V layer's rows live in (the cache's groups draw their blocks
        # from one pool: group g's j-th layer shares storage with every other group's j-th when the
        # shapes agree, so a block is one page of memory whichever group holds it); -1: a State layer.
        own: list[int] = []
        for i, source in enumerate(self.source_of):
            if source != i:  # a Shared or State layer stores nothing
                own.append(-1)
                continue
            owner = cache.storage_layer(i)
            same = owner != i and self._heads[owner] == self._heads[i] and self._dims[owner] == self._dims[i]
            own.append(owner if same else i)
        # A Shared layer reads its source's storage.
        self.store_of: list[int] = [own[source] if source >= 0 else -1 for source in self.source_of]
        # The most rows a layer can need: its group's whole pool.
        self.max_rows = [cache.num_blocks(g) * self.block_size for g in range(cache.n_groups)]
        self._keys: list[Optional[torch.Tensor]] = [None] * n
        self._values: list[Optional[torch.Tensor]] = [None] * n
        self._preallocate = preallocate
        # The slots, rows and group write_read checked last (the other layers of the group skip it).
        self._checked: Optional[tuple[torch.Tensor, int, int]] = None
        # The read index and rows write_gather checked last (the other layers of the group skip it).
        self._read_checked: Optional[tuple[torch.Tensor, int]] = None
        self._rows_hint = rows_hint
        if preallocate:
            self.allocate_all()

    # --- allocation -------------------------------------------------------------

    def allocate_all(self) -> None:
        """Allocate every layer: ``rows_hint[group]`` rows (capped at the pool; the largest hint of
        the groups sharing a storage), else the whole pool."""
        rows_of: dict[int, int] = {}
        for layer, g in enumerate(self.group_of):
            if self.source_of[layer] != layer:  # a Shared or State layer stores no K/V
                continue
            rows = self.max_rows[g] if self._rows_hint is None else min(self._rows_hint[g], self.max_rows[g])
            store = self.store_of[layer]
            rows_of[store] = max(rows_of.get(store, 0), rows)
        for store, rows in rows_of.items():
            self._keys[store], self._values[store] = self._zeros(store, rows)

    def _zeros(self, layer: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        h, (dk, dv) = self._heads[layer], self._dims[layer]
        keys = torch.zeros((1, h, rows, dk), dtype=self.dtype, device=self.device)
        values = torch.zeros((1, h, rows, dv), dtype=self.dtype, device=self.device)
        return keys, values

    def allocated_rows(self, layer: int) -> int:
        """Rows the layer's tensors hold now (0 before its first write; a Shared layer's source's,
        a State layer's 0: it holds state slots)."""
        self._check_layer(layer)
        store = self.store_of[layer]
        keys = self._keys[store] if store >= 0 else None
        return 0 if keys is None else int(keys.shape[2])

    def tensors(self, layer: int) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """The layer's K and V tensors ``[1, n_kv_heads, allocated_rows, dim]`` (row ``r`` is row
        ``r`` of its group's pool; a Shared layer's: its source's), or None before its first write.
        InvalidArgumentError: bad layer, a State layer (``state_slots``)."""
        store = self.store_of[self._row_layer(layer, "tensors")]
        keys, values = self._keys[store], self._values[store]
        return None if keys is None or values is None else (keys, values)

    def read(
        self, layer: int, rows: int, index: Optional[torch.Tensor] = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows ``[0, rows)`` of the layer's K and V as views ``[1, H, rows, dim]`` (a Shared layer's:
        its source's, as the source's ``write_read`` left them), or, with ``index`` (a 1-D int64
        tensor of rows in ``[0, rows)``), those rows in that order as new tensors (what
        ``write_gather`` returns). InvalidArgumentError: bad layer, a State layer, ``rows`` outside
        ``[0, max_rows]``, a bad ``index``; InvalidStateError: the layer's tensors hold fewer than
        ``rows`` rows (write the source's step first)."""
        source = self._row_layer(layer, "read")
        top = self.max_rows[self.group_of[source]]
        if not 0 <= rows <= top:
            raise InvalidArgumentError(f"read of layer {layer}: rows = {rows}: must be in [0, {top}] (the group's pool)")
        if index is not None:
            self._check_read(layer, index, rows)
        keys, values = self._keys[self.store_of[source]], self._values[self.store_of[source]]
        have = 0 if keys is None else int(keys.shape[2])
        if keys is None or values is None or rows > have:
            raise InvalidStateError(
                f"read of layer {layer}: rows = {rows}, but layer {source}'s tensors hold {have} rows: write the "
                f"step's rows of layer {source} first"
            )
        if index is not None:
            return keys.index_select(2, index), values.index_select(2, index)
        return keys[:, :, :rows], values[:, :, :rows]

    def ensure(self, layer: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Make the layer hold at least ``rows`` rows, doubling (rows keep their index and bytes);
        returns its K and V tensors (a storage shared with other groups' layers grows for all)."""
        layer = self.store_of[layer]
        keys, values = self._keys[layer], self._values[layer]
        have = 0 if keys is None else int(keys.shape[2])
        if keys is not None and values is not None and rows <= have:
            return keys, values
        grown = max(have, 1)
        while grown < rows:
            grown *= 2
        grown = min(grown, self.max_rows[self.group_of[layer]])
        new_keys, new_values = self._zeros(layer, grown)
        if keys is not None and values is not None and have:
            new_keys[:, :, :have].copy_(keys)
            new_values[:, :, :have].copy_(values)
        self._keys[layer], self._values[layer] = new_keys, new_values
        return new_keys, new_values

    def release(self) -> None:
        """Drop every tensor, state tensors included (K/V re-allocated as configured)."""
        self._keys = [None] * len(self._keys)
        self._values = [None] * len(self._values)
        self._states = {i: {} for i in self.state_group_of}
        if self._preallocate:
            self.allocate_all()

    def nbytes(self, layer: Optional[int] = None) -> int:
        """Bytes of one layer's K/V tensors (a Shared layer's none) or state tensors, or of every
        layer's (a storage several layers share counted once, at the layer that owns it)."""
        layers = range(len(self._keys)) if layer is None else [layer]
        total = 0
        for i in layers:
            store = i if layer is None or self.store_of[i] < 0 or self.source_of[i] != i else self.store_of[i]
            keys, values = self._keys[store], self._values[store]
            if keys is not None and values is not None:
                total += keys.numel() * keys.element_size() + values.numel() * values.element_size()
            total += sum(t.numel() * t.element_size() for t in self._states.get(i, {}).values())
        return total

    # --- the per-step path --------------------------------------------------------

    def copy_blocks(self, group: int, copies: npt.NDArray[np.int32]) -> None:
        """Perform a plan's block copies ``(src, dst)`` of ``group`` in every allocated layer of it."""
        if len(copies) == 0:
            return
        B = self.block_size
        # Once per group, not per layer: every layer's tensors live on self.device.
        src = torch.from_numpy((copies[:, 0:1].astype(np.int64) * B + np.arange(B)).reshape(-1)).to(self.device)
        dst = torch.from_numpy((copies[:, 1:2].astype(np.int64) * B + np.arange(B)).reshape(-1)).to(self.device)
        rows = (int(copies[:, 1].max()) + 1) * B  # past the last destination row
        for layer, g in enumerate(self.group_of):
            if g != group or self.source_of[layer] != layer:
                continue
            keys, values = self._keys[self.store_of[layer]], self._values[self.store_of[layer]]
            if keys is None or values is None:
                continue
            keys, values = self.ensure(layer, rows)
            keys.index_copy_(2, dst, keys.index_select(2, src))
            values.index_copy_(2, dst, values.index_select(2, src))

    def apply_copies(self, copies: Sequence[npt.ArrayLike]) -> None:
        """Perform a draft-tree commit's copies: ``copies`` is what ``cache.commit(step, accepted=...)``
        returned, one ``(n, 2)`` int array per group (rows ``(src, dst)``, in every allocated layer of
        the group; a Shared layer's rows are its source's) and then one per State group (physical slots
        ``(src, dst)``, in order, in every state tensor of each State layer of the group). Each row
        copy reads its node's row as the step wrote it (no copy reads a row an earlier one wrote:
        docs/batch.md section 9), so each group's row copies run as one gather and one scatter.
        Raises InvalidArgumentError when ``copies`` is not one ``(n, 2)`` int array per group and State
        group, a row lies outside the group's pool ``[0, num_blocks * block_size)`` or a slot outside
        ``[0, num_state_slots)``, InvalidStateError when a row lies past what an allocated layer holds
        (the tree step was not written). Everything is checked before anything is copied."""
        n_groups, n_states = len(self.max_rows), len(self.num_state_slots)
        if len(copies) != n_groups + n_states:
            raise InvalidArgumentError(
                f"apply_copies: {len(copies)} arrays of copies for {n_groups} groups and {n_states} State groups: "
                "pass what cache.commit(step, accepted=...) returned"
            )
        checked = []
        for group, pairs in enumerate(copies):
            state = group >= n_groups
            name = f"copies[{group}] (State group {group - n_groups})" if state else f"copies[{group}]"
            a = np.asarray(pairs)
            if a.ndim != 2 or a.shape[1] != 2 or not (a.size == 0 or np.issubdtype(a.dtype, np.integer)):
                raise InvalidArgumentError(f"apply_copies: {name} must be an (n, 2) int array, got shape {a.shape}")
            top = self.num_state_slots[group - n_groups] if state else self.max_rows[group]
            bad = np.flatnonzero(((a < 0) | (a >= top)).any(axis=1))
            if bad.size:
                i = int(bad[0])
                what = "slot" if state else "row"
                raise InvalidArgumentError(
                    f"apply_copies: {name}[{i}] ({what} {int(a[i, 0])} to {what} {int(a[i, 1])}) must lie in "
                    f"{what}s [0, {top})"
                )
            if not state:
                allocated = [self.allocated_rows(layer) for layer, g in enumerate(self.group_of)
                             if g == group and self.source_of[layer] == layer and self.allocated_rows(layer)]
                if a.size and allocated and int(a.max()) >= min(allocated):
                    raise InvalidStateError(
                        f"apply_copies: copies[{group}] reach row {int(a.max())}, past the {min(allocated)} rows a "
                        f"layer of group {group} holds: write the tree step first"
                    )
            checked.append(a)
        for group, a in enumerate(checked[:n_groups]):
            if a.size == 0:
                continue
            src = torch.from_numpy(np.ascontiguousarray(a[:, 0], dtype=np.int64)).to(self.device)
            dst = torch.from_numpy(np.ascontiguousarray(a[:, 1], dtype=np.int64)).to(self.device)
            for layer, g in enumerate(self.group_of):
                if g != group or self.source_of[layer] != layer:
                    continue
                keys, values = self._keys[self.store_of[layer]], self._values[self.store_of[layer]]
                if keys is None or values is None:
                    continue
                keys.index_copy_(2, dst, keys.index_select(2, src))
                values.index_copy_(2, dst, values.index_select(2, src))
        for k, a in enumerate(checked[n_groups:]):
            for layer, lk in self.state_group_of.items():
                if lk != k:
                    continue
                for t in self._states[layer].values():
                    for src_slot, dst_slot in a.tolist():  # in order, as the commit lists them
                        t[dst_slot].copy_(t[src_slot])

    def apply_commit(self, copies: Sequence[npt.ArrayLike]) -> None:
        """Deprecated alias of ``apply_copies`` (removed in kvcore 0.2.0): performs a draft-tree
        commit's copies. Warns DeprecationWarning; errors as ``apply_copies``."""
        _deprecated("TorchPagedKVPool.apply_commit", "TorchPagedKVPool.apply_copies")
        self.apply_copies(copies)

    def write_read(
        self, layer: int, slots: torch.Tensor, key: torch.Tensor, value: torch.Tensor, rows: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the step's rows of ``layer`` at ``slots`` (a 1-D int64 tensor on the store's device, one
        pool row per token, in the tokens' order: the plan's slots), return rows ``[0, rows)`` of K
        and V as views. ``key``/``value``: ``[1, H, n_tokens, dim]``, taken detached when they
        require grad (the values are stored, never their autograd history: the store is for
        inference). InvalidArgumentError, before any row is written: a bad layer, tensors that do
        not fit it, ``rows`` outside ``[0, max_rows]`` or a slot outside ``[0, rows)``; a Shared layer
        (it writes nothing: write its source, named in the message, then ``read`` the Shared layer);
        a State layer (``write_state``)."""
        self._check_writes(layer, "write_read")
        group = self.group_of[layer]
        checked = self._checked  # once per step and group: the same slots object, rows and group
        if checked is None or checked[0] is not slots or checked[1:] != (rows, group):
            self._check_slots(layer, slots, rows)
            self._checked = (slots, rows, group)
        h, (dk, dv) = self._heads[layer], self._dims[layer]
        n = int(slots.shape[0])
        if key.device != self.device or value.device != self.device:
            raise InvalidArgumentError(
                f"layer {layer}: key on {key.device} / value on {value.device}: the store is on {self.device}"
            )
        if tuple(key.shape) != (1, h, n, dk) or tuple(value.shape) != (1, h, n, dv):
            raise InvalidArgumentError(
                f"layer {layer}: key {tuple(key.shape)} / value {tuple(value.shape)}: want "
                f"{(1, h, n, dk)} / {(1, h, n, dv)} for a step of {n} tokens"
            )
        if key.requires_grad or value.requires_grad:  # inference only: the values, never the graph
            key, value = key.detach(), value.detach()
        keys, values = self.ensure(layer, rows)
        keys.index_copy_(2, slots, key.to(self.dtype))
        values.index_copy_(2, slots, value.to(self.dtype))
        return keys[:, :, :rows], values[:, :, :rows]

    def write_gather(
        self, layer: int, slots: torch.Tensor, key: torch.Tensor, value: torch.Tensor, rows: int, read: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``write_read``, then the rows at ``read`` (a 1-D int64 tensor of rows in ``[0, rows)``,
        repeats allowed), in that order: new tensors ``[1, H, len(read), dim]`` (what continuous
        batching attends over: each request's keys in position order). InvalidArgumentError, before
        any row is written: as ``write_read``, ``read`` not a 1-D int64 tensor or a row outside
        ``[0, rows)``."""
        self._check_writes(layer, "write_gather")
        self._check_read(layer, read, rows)
        keys, values = self.write_read(layer, slots, key, value, rows)
        return keys.index_select(2, read), values.index_select(2, read)

    def _check_read(self, layer: int, read: torch.Tensor, rows: int) -> None:
        """InvalidArgumentError unless ``read`` is a 1-D int64 tensor of rows in ``[0, rows)``;
        remembered so the other layers of the step skip it."""
        checked = self._read_checked
        if checked is not None and checked[0] is read and checked[1] == rows:
            return
        if not isinstance(read, torch.Tensor) or read.dim() != 1 or read.dtype != torch.int64:
            what = f"{read.dtype} of shape {tuple(read.shape)}" if isinstance(read, torch.Tensor) else type(read).__name__
            raise InvalidArgumentError(f"layer {layer}: read must be a 1-D int64 tensor, got {what}")
        if read.numel() and (int(read.min()) < 0 or int(read.max()) >= rows):
            raise InvalidArgumentError(
                f"layer {layer}: read reaches rows [{int(read.min())}, {int(read.max())}]: must lie in [0, rows = {rows})"
            )
        self._read_checked = (read, rows)

    def _check_slots(self, layer: int, slots: torch.Tensor, rows: int) -> None:
        """InvalidArgumentError unless ``slots`` is a 1-D int64 tensor of rows in ``[0, rows)`` and
        ``rows`` fits the layer's group pool; remembered so the other layers of the step skip it."""
        top = self.max_rows[self.group_of[layer]]
        if not 0 <= rows <= top:
            raise InvalidArgumentError(f"layer {layer}: rows = {rows}: must be in [0, {top}] (the group's pool)")
        if not isinstance(slots, torch.Tensor) or slots.dim() != 1 or slots.dtype != torch.int64:
            what = f"{slots.dtype} of shape {tuple(slots.shape)}" if isinstance(slots, torch.Tensor) else type(slots).__name__
            raise InvalidArgumentError(f"layer {layer}: slots must be a 1-D int64 tensor, got {what}")
        if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= rows):
            raise InvalidArgumentError(
                f"layer {layer}: slots reach rows [{int(slots.min())}, {int(slots.max())}]: must lie in [0, rows = {rows})"
            )

    # --- State layers (recurrent state by physical slot) ----------------------------------

    @property
    def state_layers(self) -> tuple[int, ...]:
        """The cache's State layers, in order."""
        return tuple(self.state_group_of)

    def state_names(self, layer: int) -> tuple[str, ...]:
        """The state names ``layer`` holds so far (each allocated by its first write).
        InvalidArgumentError: not a State layer."""
        return tuple(self._states[self._check_state_layer(layer, "state_names")])

    def state_slots(self, layer: int, name: str) -> Optional[torch.Tensor]:
        """The whole storage ``[num_slots, *shape]`` of state ``name`` of State layer ``layer`` (slot
        ``i`` at index ``i``: the tensor a kernel indexes with the plan's ``state_groups[k]``
        ``read_slots`` / ``write_slots``; writing it writes the slots), or None before its first
        write. InvalidArgumentError: not a State layer."""
        return self._states[self._check_state_layer(layer, "state_slots")].get(name)

    def state(self, layer: int, name: str) -> Optional[torch.Tensor]:
        """Deprecated alias of ``state_slots`` (removed in kvcore 0.2.0): the whole storage of state
        ``name`` of State layer ``layer``. Warns DeprecationWarning; errors as ``state_slots``."""
        _deprecated("TorchPagedKVPool.state", "TorchPagedKVPool.state_slots")
        return self.state_slots(layer, name)

    def write_state(self, layer: int, name: str, slots: Any, states: torch.Tensor) -> int:
        """Store ``states[i]`` (``states``: ``[n, *shape]``, taken detached) in physical slot
        ``slots[i]`` of state ``name`` of State layer ``layer``; rows whose slot is -1 are dropped (a
        step without verify keeps only each entry's last state). ``slots``: n ints, a 1-D int tensor
        or array, typically the plan's ``state_groups[k].write_slots`` (k =
        ``cache.state_group_of(layer)``) or a slice of it. Returns the states stored. The first write
        of ``name`` allocates it (zeros ``[num_slots, *shape]``, dtype and device of ``states``); later
        ones must match them. InvalidArgumentError, before anything is written: not a State layer,
        ``states`` with fewer than 1 dim or not ``n`` rows, a slot outside ``[-1, num_slots)``, a slot
        named twice, another shape, dtype or device than the stored one."""
        self._check_state_layer(layer, "write_state")
        index = self._slots(layer, "write_state", slots)
        if not isinstance(states, torch.Tensor) or states.dim() < 1 or int(states.shape[0]) != int(index.numel()):
            shape = tuple(states.shape) if isinstance(states, torch.Tensor) else type(states).__name__
            raise InvalidArgumentError(
                f"write_state of layer {layer}: states {shape} must be [n, *state shape] with n = {int(index.numel())} "
                "(one per slot)"
            )
        keep = index >= 0
        kept = index[keep]
        if int(kept.numel()) != int(torch.unique(kept).numel()):
            raise InvalidArgumentError(f"write_state of layer {layer}: slots name a slot twice")
        t = self._states[layer].get(name)
        one = states[0] if int(states.shape[0]) else states.new_zeros(states.shape[1:])
        if t is not None:
            check_like(layer, name, t[0], one)
        else:
            t = torch.zeros((self.num_state_slots[self.state_group_of[layer]], *states.shape[1:]), dtype=states.dtype, device=states.device)
            self._states[layer][name] = t
        if int(kept.numel()):
            t.index_copy_(0, kept.to(t.device), states.detach()[keep.to(states.device)])
        return int(kept.numel())

    def read_state(self, layer: int, name: str, slots: Any) -> Optional[torch.Tensor]:
        """The states in physical slots ``slots`` of state ``name`` of State layer ``layer``, as a new
        tensor ``[n, *shape]``: typically the plan's ``read_slots`` (the state each token starts from);
        a slot of -1 reads zeros (a token at position 0; a token whose state the step carries within
        the forward is the caller's). None before ``name``'s first write. InvalidArgumentError: not a
        State layer, a slot outside ``[-1, num_slots)``."""
        self._check_state_layer(layer, "read_state")
        index = self._slots(layer, "read_state", slots)
        t = self._states[layer].get(name)
        if t is None:
            return None
        out = t.index_select(0, index.clamp(min=0).to(t.device))
        out[(index < 0).to(t.device)] = 0
        return out

    def _check_state_layer(self, layer: int, what: str) -> int:
        if layer not in self._states:
            raise InvalidArgumentError(
                f"{what}: layer = {layer} is not a State layer of the cache (its State layers: {list(self._states)})"
            )
        return layer

    def _slots(self, layer: int, what: str, slots: Any) -> torch.Tensor:
        """``slots`` as a 1-D int64 CPU tensor, each in ``[-1, num_slots)``; InvalidArgumentError otherwise."""
        if isinstance(slots, torch.Tensor):
            index = slots.detach().to("cpu")
        else:
            a = np.asarray(slots)
            if a.size == 0:
                a = a.astype(np.int64)
            if not np.issubdtype(a.dtype, np.integer):
                raise InvalidArgumentError(f"{what} of layer {layer}: slots must be ints, got {a.dtype}")
            index = torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))
        if index.dim() != 1 or index.dtype.is_floating_point or index.dtype == torch.bool:
            raise InvalidArgumentError(
                f"{what} of layer {layer}: slots must be a 1-D int array, got {index.dtype} of shape {tuple(index.shape)}"
            )
        index = index.to(torch.int64)
        top = self.num_state_slots[self.state_group_of[layer]]
        if index.numel() and (int(index.min()) < -1 or int(index.max()) >= top):
            raise InvalidArgumentError(
                f"{what} of layer {layer}: slots reach [{int(index.min())}, {int(index.max())}]: must be -1 or in "
                f"[0, num_slots = {top})"
            )
        return index

    # --- sequence records (docs/state.md) ---------------------------------------------

    @property
    def record_format(self) -> Optional[str]:
        """The record dtype the tensors' rows are stored as (numpy's name: ``"float32"``, ...), or
        None for a dtype no record holds (``export_sequence`` / ``import_sequence`` refuse it)."""
        return RECORD_DTYPE.get(self.dtype)

    def export_sequence(
        self, seq: int, tokens: Optional[Union[Sequence[int], npt.NDArray[np.integer[Any]]]] = None
    ) -> bytes:
        """Sequence ``seq`` as a record (bytes, docs/state.md), byte for byte what a ``PagedKVPool``
        holding the same rows gives; ``tokens``: ids of positions ``[0, len(tokens))`` (all of them
        let an importer share a prefix it caches). Holds a transient numpy pool spanning the rows up
        to the sequence's highest block. Errors: ``paged_records.export_sequence``; NotSupportedError: a
        Shared or State layer (a torch pool's records carry Flat, Ring and Chunked layers only)."""
        self._check_record_layers("export")
        return paged_records.export_sequence(self, seq, tokens)

    def import_sequence(
        self,
        seq: int,
        record: RecordSource,
        *,
        trust_tokens: bool = False,
        namespace: Optional[Union[int, bytes, str]] = None,
    ) -> None:
        """Admits the sequence of ``record`` (bytes-like or a path; from any kvcore pool) as sequence
        ``seq`` (inactive), the record validated before any growth, and writes the rows of the blocks the import
        wrote (blocks of a prefix the cache holds are shared, not written, when trusted:
        ``trust_tokens`` or a ``namespace``, as ``PagedKVPool.import_sequence``); changes nothing on
        an error. ``import_sequence(record, seq)``, the order of the last release, still works and
        warns (DeprecationWarning). Errors: ``paged_records.import_sequence``; NotSupportedError: a
        Shared or State layer (a torch pool's records carry Flat, Ring and Chunked layers only)."""
        self._check_record_layers("import")
        if isinstance(record, (int, np.integer)) and not isinstance(record, bool) and not isinstance(seq, (int, np.integer)):
            warnings.warn(
                "TorchPagedKVPool.import_sequence(record, seq) is deprecated: pass import_sequence(seq, record) "
                "(removed in kvcore 0.2.0)",
                DeprecationWarning,
                stacklevel=2,
            )
            seq, record = cast(int, record), cast(RecordSource, seq)
        paged_records.import_sequence(self, seq, record, trust_tokens=trust_tokens, namespace=namespace)

    def _check_layer(self, layer: int) -> None:
        if not 0 <= layer < len(self._keys):
            raise InvalidArgumentError(f"layer = {layer}: must be in [0, n_layers = {len(self._keys)})")

    def _row_layer(self, layer: int, what: str) -> int:
        """The layer whose K/V ``what`` reads on ``layer``: a Shared layer's source, else itself.
        InvalidArgumentError: bad layer, a State layer."""
        self._check_layer(layer)
        source = self.source_of[layer]
        if source < 0:
            raise InvalidArgumentError(
                f"{what} of layer {layer}: a State layer holds state slots, not K/V rows (use write_state, "
                "read_state, state_slots)"
            )
        return source

    def _check_writes(self, layer: int, what: str) -> None:
        """InvalidArgumentError unless ``layer`` stores the K/V rows it is written (a Flat, Ring or
        Chunked layer): a Shared layer is refused naming its source, a State layer by kind."""
        source = self._row_layer(layer, what)
        if source != layer:
            raise InvalidArgumentError(
                f"{what}: layer {layer} is Shared({source}): it writes nothing; write layer {source}, then read "
                f"this one (read(layer, rows): layer {source}'s rows)"
            )

    def _check_record_layers(self, what: str) -> None:
        for layer, source in enumerate(self.source_of):
            if source != layer:
                kind = "State" if source < 0 else "Shared"
                raise NotSupportedError(
                    f"{what}: layer {layer} is a {kind} layer: a torch pool's records carry Flat, Ring and Chunked "
                    "layers only (a PagedKVPool's carry every kind)"
                )


def _deprecated(old: str, new: str) -> None:
    """Warns DeprecationWarning that ``old`` is a name kept one release for ``new`` (docs/deprecations.md)."""
    warnings.warn(f"{old} is deprecated: use {new} (removed in kvcore 0.2.0)", DeprecationWarning, stacklevel=3)


def __getattr__(name: str) -> Any:
    """``TorchPagedKV``: the name of the last release, deprecated (DeprecationWarning), removed in kvcore 0.2.0."""
    if name == "TorchPagedKV":
        warnings.warn("TorchPagedKV is deprecated: use kvcore.torch.TorchPagedKVPool (removed in kvcore 0.2.0)",
                      DeprecationWarning, stacklevel=2)
        return TorchPagedKVPool
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["TorchPagedKVPool"]
