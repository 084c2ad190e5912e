"""One layer's K/V rows of a ``TorchKVPool``: two torch tensors and how a step writes them.

``LayerPool`` holds a layer's keys ``[batch, n_kv_heads, rows (+ mirror), head_dim]`` and
values ``[..., value_dim]``, the shapes a step of ``T`` new rows must pass in, and the
strides ``TorchKVPool.write_read`` reads and writes them through (``as_strided`` views,
``kvcore._core._copy_rows`` on CPU). It decides nothing about rows: ``kvcore.torch.pool``
lays steps out from kvcore's plans.
"""

from __future__ import annotations

from typing import Optional

import torch

# CPU pools write through kvcore._core._copy_rows (one native call per layer); False: torch ops
# only (what other devices use). A switch so the tests cover both write paths.
NATIVE_WRITES = True


def _native_dst(t: torch.Tensor) -> tuple[int, ...]:
    """A pool tensor as ``_copy_rows`` takes it, but its address: (B, H, D, then the four element strides)."""
    return (int(t.shape[0]), int(t.shape[1]), int(t.shape[3]), *t.stride())


class LayerPool:
    """One layer's K/V rows: ``keys`` ``[B, H, allocated (+ mirror), D]``, ``values`` ``[..., Dv]``."""

    __slots__ = (
        "keys", "values", "rows", "mirror_rows", "batch_size", "dtype", "device",
        "T", "k_shape", "v_shape", "tensor_rows", "_k_geometry", "_v_geometry", "native",
    )  # fmt: skip

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, rows: int, mirror_rows: int = 0) -> None:
        self.rows = rows  # kvcore's rows for the layer: the most this layer ever allocates
        self.mirror_rows = mirror_rows  # extra rows after `rows` repeating the first ring rows
        self.set_tensors(keys, values)

    def set_tensors(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.keys, self.values = keys, values
        self.batch_size = int(keys.shape[0])
        self.dtype = keys.dtype
        self.device = keys.device
        self.tensor_rows = int(keys.shape[2])  # allocated rows, the mirror included
        # What a step of T new rows must pass in (set for the T of the last step).
        self.T = 0
        self.k_shape = self.v_shape = torch.Size()
        # (B, H, D), strides, offset: a read is an as_strided view (cheaper than narrow).
        self._k_geometry = (*keys.shape[:2], keys.shape[3], keys.stride(), keys.storage_offset())
        self._v_geometry = (*values.shape[:2], values.shape[3], values.stride(), values.storage_offset())
        # CPU tensors of one dtype: writes go through kvcore._core._copy_rows (one call for K and V,
        # where torch needs two to four): K's and V's sizes and strides, and the element size. The
        # addresses are read at each write, never kept (a deep copy of the pool has its own).
        self.native: Optional[tuple[tuple[int, ...], tuple[int, ...], int]] = None
        if NATIVE_WRITES and keys.device.type == "cpu" and values.dtype == keys.dtype:
            self.native = (_native_dst(keys), _native_dst(values), keys.element_size())

    def expect(self, T: int) -> None:
        """Set the shapes a step of ``T`` new rows must have."""
        B, H, D = self._k_geometry[:3]
        self.T = T
        self.k_shape = torch.Size((B, H, T, D))
        self.v_shape = torch.Size((B, H, T, self._v_geometry[2]))

    def view(self, row: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows ``[row, row + n)`` of K and V as views (``row + n`` may reach into the mirror)."""
        B, H, D, st, off = self._k_geometry
        keys = self.keys.as_strided((B, H, n, D), st, off + row * st[2])
        B, H, D, st, off = self._v_geometry
        return keys, self.values.as_strided((B, H, n, D), st, off + row * st[2])

    @property
    def allocated_rows(self) -> int:
        """Rows allocated now, not counting the mirror."""
        return int(self.keys.shape[2]) - self.mirror_rows

    @property
    def nbytes(self) -> int:
        """Bytes of the K and V tensors (the mirror included)."""
        return self.keys.numel() * self.keys.element_size() + self.values.numel() * self.values.element_size()


__all__ = ["NATIVE_WRITES", "LayerPool"]
