"""A torch byte layer: each layer's K/V rows in torch tensors, laid out by kvcore plans.

kvcore decides with integers where a step's rows go and which rows its queries
read (``SeqStepPlan``); this module owns the bytes. Per layer it keeps two
tensors shaped ``[batch, n_kv_heads, rows, dim]`` (keys and values). A step
writes its new rows with one slice copy per write run and returns the layer's
history in position order: a view of the pool when the read is one run (every
flat layer, a ring before it wraps), else the runs copied into a gather
workspace shared by all layers.

Allocation happens only while warming up: a ring layer is allocated whole
(``cache.rows(layer)`` = window + max_step - 1 rows, plus its sinks) on first
use; a flat layer starts at ``min(rows, initial_capacity)`` rows and doubles
(capped at ``rows``) when a write needs more; the gather workspace grows to the
largest wrapped read once. After that a step allocates nothing.

The returned history is valid until the next ``update`` of any layer of the same
pool (the workspace is reused, and a later step overwrites ring rows). That is
what an attention layer needs; it is also why the pool is for inference only
(autograd would reject a backward through overwritten rows).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kvcore._core import LayerConfig, SeqStepPlan, SequenceCache
from kvcore._errors import InvalidArgumentError


def read_positions(plan: SeqStepPlan) -> list[int]:
    """The logical positions a plan's read returns, in the order returned."""
    return [run.pos + i for run in plan.read for i in range(run.len)]


@dataclass
class LayerPool:
    """One layer's K/V rows: ``keys`` ``[B, H, allocated, D]``, ``values`` ``[B, H, allocated, Dv]``."""

    keys: torch.Tensor
    values: torch.Tensor
    rows: int  # kvcore's rows for the layer: the most this layer ever allocates

    @property
    def allocated_rows(self) -> int:
        return int(self.keys.shape[2])

    @property
    def batch_size(self) -> int:
        return int(self.keys.shape[0])

    @property
    def nbytes(self) -> int:
        return self.keys.numel() * self.keys.element_size() + self.values.numel() * self.values.element_size()


class _Workspace:
    """Flat scratch buffers a wrapped read is gathered into; grown, never shrunk."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = {}

    def take(self, kind: str, shape: tuple[int, int, int, int], like: torch.Tensor) -> torch.Tensor:
        numel = shape[0] * shape[1] * shape[2] * shape[3]
        key = (kind, like.dtype, like.device)
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, dtype=like.dtype, device=like.device)
            self._buffers[key] = buf
        return buf[:numel].view(shape)

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers.values())

    def clear(self) -> None:
        self._buffers.clear()


class TorchKVPool:
    """K/V storage in torch tensors for every layer of one ``kvcore.SequenceCache``.

    Use it from a forward pass: begin a step on the cache, then per layer
    ``keys, values = pool.update(layer, step.plan(layer), new_keys, new_values)``
    with ``new_keys`` shaped ``[batch, n_kv_heads, T, head_dim]``; commit the step
    after the last layer. A layer is allocated on its first update (or by
    ``allocate``) with the batch size, dtype and device of what it is given.
    """

    def __init__(self, cache: SequenceCache) -> None:
        self.cache = cache
        cfg = cache.config
        self._initial_rows = cfg.initial_capacity
        # Resolved once: the per-step path reads these for every layer.
        self._configs = [cfg.layers[0 if len(cfg.layers) == 1 else i] for i in range(cache.n_layers)]
        self._layers: list[LayerPool | None] = [None] * cache.n_layers
        self._workspace = _Workspace()

    # --- allocation ----------------------------------------------------------

    def allocate(self, layer: int, *, batch_size: int, dtype: torch.dtype, device: torch.device | str) -> LayerPool:
        """(Re)allocate ``layer`` for ``batch_size`` sequences; its rows hold nothing yet."""
        lc = self._layer_config(layer)
        if batch_size < 1:
            raise InvalidArgumentError(f"batch_size = {batch_size}: must be >= 1")
        rows = self.cache.rows(layer)
        # A ring is small and cycles through all its rows at once; only flat layers grow.
        start = rows if lc.policy.is_ring else min(rows, self._initial_rows)
        shape_k = (batch_size, lc.n_kv_heads, start, lc.head_dim)
        shape_v = (batch_size, lc.n_kv_heads, start, lc.value_dim)
        pool = LayerPool(
            keys=torch.empty(shape_k, dtype=dtype, device=device),
            values=torch.empty(shape_v, dtype=dtype, device=device),
            rows=rows,
        )
        self._layers[layer] = pool
        return pool

    def layer(self, layer: int) -> LayerPool | None:
        """The layer's storage, or None before it is allocated."""
        self._layer_config(layer)
        return self._layers[layer]

    def nbytes(self, layer: int | None = None) -> int:
        """Bytes held by one layer's K/V tensors, or by every layer (workspace excluded)."""
        if layer is not None:
            pool = self.layer(layer)
            return 0 if pool is None else pool.nbytes
        return sum(p.nbytes for p in self._layers if p is not None)

    @property
    def workspace_nbytes(self) -> int:
        """Bytes of the shared gather workspace wrapped reads are returned in."""
        return self._workspace.nbytes

    def release(self) -> None:
        """Drop every tensor (the next update allocates again)."""
        self._layers = [None] * len(self._layers)
        self._workspace.clear()

    def map_batch(self, layer: int, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Replace the layer's batch with ``fn(tensor)`` (beam reorder / select / repeat on dim 0)."""
        pool = self.layer(layer)
        if pool is None:
            return
        keys, values = fn(pool.keys), fn(pool.values)
        if keys.shape[1:] != pool.keys.shape[1:] or values.shape[1:] != pool.values.shape[1:]:
            raise InvalidArgumentError("map_batch: fn may change only the batch dimension (dim 0)")
        pool.keys, pool.values = keys.contiguous(), values.contiguous()

    # --- the per-step path -----------------------------------------------------

    def update(
        self, layer: int, plan: SeqStepPlan, key: torch.Tensor, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the step's rows of ``layer`` where ``plan`` says, return its history in position order.

        ``key``/``value``: ``[batch, n_kv_heads, T, head_dim]`` / ``[..., value_dim]`` with
        ``T == plan.write_len``. Returns keys and values ``[batch, n_kv_heads, plan.read_len, dim]``
        holding positions ``read_positions(plan)`` in that order.
        """
        pool = self._pool_for(layer, plan, key, value)
        self._write(pool, plan, key, value)
        return self._read(pool, plan)

    def _pool_for(self, layer: int, plan: SeqStepPlan, key: torch.Tensor, value: torch.Tensor) -> LayerPool:
        lc = self._layer_config(layer)
        T = plan.write_len
        if key.dim() != 4 or value.dim() != 4:
            raise InvalidArgumentError(
                f"layer {layer}: key/value must be 4-D [batch, n_kv_heads, T, dim], got {tuple(key.shape)} "
                f"and {tuple(value.shape)}"
            )
        want_k = (key.shape[0], lc.n_kv_heads, T, lc.head_dim)
        want_v = (key.shape[0], lc.n_kv_heads, T, lc.value_dim)
        if tuple(key.shape) != want_k or tuple(value.shape) != want_v:
            raise InvalidArgumentError(
                f"layer {layer}: key {tuple(key.shape)} / value {tuple(value.shape)} do not match the step "
                f"(T = {T}) and the layer config: want {want_k} / {want_v}"
            )
        if key.dtype != value.dtype or key.device != value.device:
            raise InvalidArgumentError(
                f"layer {layer}: key ({key.dtype}, {key.device}) and value ({value.dtype}, {value.device}) differ"
            )
        pool = self._layers[layer]
        if pool is None or (
            pool.batch_size != key.shape[0] or pool.keys.dtype != key.dtype or pool.keys.device != key.device
        ):
            # A new batch/dtype/device may start only a new sequence: older rows would not match it.
            if pool is not None and plan.write[0].pos != 0:
                raise InvalidArgumentError(
                    f"layer {layer}: the pool holds batch {pool.batch_size} of {pool.keys.dtype} on "
                    f"{pool.keys.device}, got batch {key.shape[0]} of {key.dtype} on {key.device} at position "
                    f"{plan.write[0].pos}; a different batch, dtype or device can only start at position 0"
                )
            pool = self.allocate(layer, batch_size=int(key.shape[0]), dtype=key.dtype, device=key.device)
        return pool

    def _write(self, pool: LayerPool, plan: SeqStepPlan, key: torch.Tensor, value: torch.Tensor) -> None:
        runs = plan.write
        end = max(r.row + r.len for r in runs)
        if end > pool.allocated_rows:
            self._grow(pool, end)
        j = 0
        for r in runs:
            pool.keys[:, :, r.row : r.row + r.len].copy_(key[:, :, j : j + r.len])
            pool.values[:, :, r.row : r.row + r.len].copy_(value[:, :, j : j + r.len])
            j += r.len

    def _read(self, pool: LayerPool, plan: SeqStepPlan) -> tuple[torch.Tensor, torch.Tensor]:
        runs = plan.read
        if len(runs) == 1:
            r = runs[0]
            return pool.keys[:, :, r.row : r.row + r.len], pool.values[:, :, r.row : r.row + r.len]
        B, H, _, D = pool.keys.shape
        Dv = pool.values.shape[3]
        n = plan.read_len
        keys = self._workspace.take("k", (B, H, n, D), pool.keys)
        values = self._workspace.take("v", (B, H, n, Dv), pool.values)
        off = 0
        for r in runs:
            keys[:, :, off : off + r.len].copy_(pool.keys[:, :, r.row : r.row + r.len])
            values[:, :, off : off + r.len].copy_(pool.values[:, :, r.row : r.row + r.len])
            off += r.len
        return keys, values

    @staticmethod
    def _grow(pool: LayerPool, needed: int) -> None:
        # Doubling keeps growth amortised O(1) per row; never past kvcore's rows.
        new_rows = min(pool.rows, max(needed, 2 * pool.allocated_rows))
        old = pool.allocated_rows
        keys = pool.keys.new_empty((*pool.keys.shape[:2], new_rows, pool.keys.shape[3]))
        values = pool.values.new_empty((*pool.values.shape[:2], new_rows, pool.values.shape[3]))
        keys[:, :, :old].copy_(pool.keys)
        values[:, :, :old].copy_(pool.values)
        pool.keys, pool.values = keys, values

    def _layer_config(self, layer: int) -> LayerConfig:
        if not 0 <= layer < len(self._layers):
            raise InvalidArgumentError(f"layer = {layer}: must be in [0, n_layers = {len(self._layers)})")
        return self._configs[layer]


__all__ = ["LayerPool", "TorchKVPool", "read_positions"]
