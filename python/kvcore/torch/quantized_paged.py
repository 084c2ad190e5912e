"""TorchQuantizedPagedKVPool: a ``TorchPagedKVPool`` whose rows are stored quantized (docs/quantized.md).

``kv_dtype="int8"`` stores each row as ``kvcore.PagedKVPool(cache, "qint8")`` does and
``kv_dtype="fp8"`` as ``"fp8_e4m3"``: per layer two tensors ``[1, 1, pool rows, row_bytes]``
uint8 whose row ``r`` holds, laid out as ``QuantRowLayout`` (``kvcore/pool/dtype.h``), the
``n_kv_heads x dim`` values of pool row ``r`` followed by each head's float32 scale (and
int8 zero point). So every path of ``TorchPagedKVPool`` that moves rows (a step's block
copies: copy-on-write of a fork's shared block; a tree commit's ``apply_copies``; growth;
records) moves each row's scales with it, and nothing here knows about blocks.

``write_read`` / ``write_gather`` take a step's keys and values ``[1, n_kv_heads, T, dim]`` of
a compute dtype (float32, float16 or bfloat16), quantize them with
``kvcore.torch.quantized.quantize_rows`` (kvcore's rule, the C++ codec's bit for bit), write the
rows at the plan's slots, and return rows dequantized (``dequantize_rows``) into a workspace of
the compute dtype, reused by the next read (``kvcore.torch.workspace``): ``write_read`` the live
rows ``[0, rows)`` (what ``PagedKVPool.update`` returns), ``write_gather`` only the rows named by
a read index (what continuous batching attends over). Records: ``export_sequence`` /
``import_sequence`` as ``TorchPagedKVPool``'s, byte for byte a ``PagedKVPool(cache, "qint8" /
"fp8_e4m3")``'s records.
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from kvcore._core import BatchCache
from kvcore._errors import InvalidArgumentError
from kvcore.quantized import kv_format, row_bytes
from kvcore.torch.paged import TorchPagedKVPool
from kvcore.torch.quantized import check_compute_dtype, dequantize_rows, quantize_rows
from kvcore.torch.workspace import Workspace


class TorchQuantizedPagedKVPool(TorchPagedKVPool):
    """A ``BatchCache``'s K/V rows in torch tensors ``[1, 1, pool rows, row_bytes]`` uint8, each row
    quantized (``kv_dtype`` "int8" or "fp8") with its scales; values in and out in a compute dtype.

    ``device``, ``preallocate``, ``rows_hint``: as ``TorchPagedKVPool`` (``dtype`` is always uint8:
    the stored bytes). ``tensors(layer)`` gives the stored rows; ``value_heads`` / ``value_dims``
    each layer's real shape. Raises InvalidArgumentError naming an unknown ``kv_dtype`` and the
    choices, before anything is built.
    """

    def __init__(
        self,
        cache: BatchCache,
        kv_dtype: str,
        *,
        device: Union[torch.device, str] = "cpu",
        preallocate: bool = False,
        rows_hint: Optional[list[int]] = None,
    ) -> None:
        self.format = kv_format(kv_dtype)  # refuses an unknown name before anything is built
        self.kv_dtype = kv_dtype
        super().__init__(cache, dtype=torch.uint8, device=device, preallocate=False, rows_hint=rows_hint)
        #: Each layer's heads and (key, value) dims of the values; the base class stores packed rows.
        self.value_heads = list(self._heads)
        self.value_dims = list(self._dims)
        self._heads = [1] * len(self._heads)
        self._dims = [(row_bytes(kv_dtype, h, dk), row_bytes(kv_dtype, h, dv)) for h, (dk, dv) in
                      zip(self.value_heads, self.value_dims)]
        self._workspace = Workspace()
        self._preallocate = preallocate
        if preallocate:
            self.allocate_all()

    @property
    def record_format(self) -> Optional[str]:
        """The record dtype of the stored rows: ``"qint8"`` or ``"fp8_e4m3"``."""
        return self.format

    @property
    def workspace_nbytes(self) -> int:
        """Bytes of the workspace the dequantized reads are returned in (transient, not storage)."""
        return self._workspace.nbytes

    def release(self) -> None:
        """Drop every tensor (re-allocated as configured) and the workspace."""
        super().release()
        self._workspace.clear()

    def write_read(
        self, layer: int, slots: torch.Tensor, key: torch.Tensor, value: torch.Tensor, rows: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Quantize the step's rows of ``layer`` and write them at ``slots`` (as
        ``TorchPagedKVPool.write_read``), then return the live rows ``[0, rows)`` dequantized,
        ``[1, n_kv_heads, rows, dim]`` of ``key``'s dtype, in a workspace the next read reuses.

        ``key``/``value``: ``[1, n_kv_heads, n_tokens, dim]`` of float32, float16 or bfloat16 (one
        dtype). InvalidArgumentError, before any row is written: as the base class; another dtype or
        shape; a value that is not finite or a (row, head) whose range passes FLT_MAX.
        """
        packed_k, packed_v = self._quantize(layer, key, value)
        rows_k, rows_v = super().write_read(layer, slots, packed_k, packed_v, rows)
        return self._dequantize(layer, rows_k, rows_v, key)

    def write_gather(
        self, layer: int, slots: torch.Tensor, key: torch.Tensor, value: torch.Tensor, rows: int, read: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``write_read``, returning only the rows at ``read`` (a 1-D int64 tensor of rows in
        ``[0, rows)``, repeats allowed) dequantized in that order, ``[1, n_kv_heads, len(read),
        dim]``: the base class's ``write_gather`` without dequantizing rows nobody reads.
        InvalidArgumentError, before any row is written: as ``write_read``, or a bad ``read``."""
        self._check_read(layer, read, rows)
        packed_k, packed_v = self._quantize(layer, key, value)
        rows_k, rows_v = super().write_read(layer, slots, packed_k, packed_v, rows)
        return self._dequantize(layer, rows_k.index_select(2, read), rows_v.index_select(2, read), key)

    def _quantize(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The checked values as quantized rows ``[1, 1, T, row_bytes]`` (nothing written yet); a
        Shared or State layer is refused by name first, as the base class refuses it."""
        self._check_writes(layer, "write_read")
        h, (dk, dv) = self.value_heads[layer], self.value_dims[layer]
        if (key.dim() != 4 or value.dim() != 4 or tuple(key.shape[:2]) != (1, h) or tuple(value.shape[:2]) != (1, h)
                or key.shape[3] != dk or value.shape[3] != dv or key.shape[2] != value.shape[2]):
            raise InvalidArgumentError(
                f"layer {layer}: key {tuple(key.shape)} / value {tuple(value.shape)}: want "
                f"[1, {h}, n_tokens, {dk}] / [1, {h}, n_tokens, {dv}]")
        check_compute_dtype(layer, key, value)
        if key.requires_grad or value.requires_grad:  # inference only: the values, never the graph
            key, value = key.detach(), value.detach()
        return quantize_rows(self.kv_dtype, key, "key"), quantize_rows(self.kv_dtype, value, "value")

    def _dequantize(
        self, layer: int, rows_k: torch.Tensor, rows_v: torch.Tensor, like: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Quantized rows ``[1, 1, n, row_bytes]`` as values ``[1, n_kv_heads, n, dim]`` in the workspace."""
        h, (dk, dv) = self.value_heads[layer], self.value_dims[layer]
        n = int(rows_k.shape[2])
        ws = self._workspace
        keys = dequantize_rows(self.kv_dtype, rows_k, h, dk, ws.take("k", (1, h, n, dk), like), ws)
        values = dequantize_rows(self.kv_dtype, rows_v, h, dv, ws.take("v", (1, h, n, dv), like), ws)
        return keys, values


__all__ = ["TorchQuantizedPagedKVPool"]
