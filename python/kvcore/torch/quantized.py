"""TorchQuantizedKVPool: a ``TorchKVPool`` whose rows are stored quantized (docs/quantized.md).

``kv_dtype="int8"`` stores each row as ``kvcore.KVPool(cache, "qint8")`` does and
``kv_dtype="fp8"`` as ``"fp8_e4m3"``: the same bytes, laid out as ``QuantRowLayout``
(``kvcore/pool/dtype.h``): per row, its ``n_kv_heads x dim`` values, then each head's
float32 scale (and int8 zero point). A layer's keys and values tensors are these rows,
``[batch, 1, rows, row_bytes]`` uint8, so every path of ``TorchKVPool`` that moves rows
(wrapped writes, mirrors, tree writes, ``apply_copies``, growth) moves each row's scales
with it: nothing here knows about rows.

``update`` / ``write_read`` take keys and values ``[batch, n_kv_heads, T, dim]`` of a compute
dtype (float32, float16 or bfloat16), quantize them with kvcore's rule (the C++ codec's,
bit for bit: ExecuTorch's ``quantized_decomposed`` ops for int8; tests/python/test_quantized.py
checks both), write the rows, and return the rows the step reads dequantized into a workspace
``[batch, n_kv_heads, n, dim]`` of the compute dtype, valid until the next update of any layer
(as the base class's gathered reads). Values that are not finite, or a (row, head) whose range
passes FLT_MAX, are refused before anything is written (InvalidArgumentError). Records
(``export_sequence`` / ``import_sequence``) are byte for byte ``kvcore.KVPool(cache, "qint8" /
"fp8_e4m3")``'s (``kvcore.torch.pool_records`` given the pool's ``format``).
"""

from __future__ import annotations

from typing import Any, Optional, Union

import torch

from kvcore._core import LayerConfig, SequenceCache, Step
from kvcore._errors import InvalidArgumentError
from kvcore.quantized import kv_format, row_bytes
from kvcore.torch import pool_records
from kvcore.torch.pool import TorchKVPool
from kvcore.torch.record_dtypes import Tokens
from kvcore.torch.step_layout import StepLayout
from kvcore.torch.workspace import Workspace

#: The dtypes values come in and go out as (the compute dtypes).
COMPUTE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_EPS = torch.finfo(torch.float32).eps
_TINY = torch.finfo(torch.float32).tiny


def _offsets(n_kv_heads: int, dim: int, kv_dtype: str) -> tuple[int, int, int]:
    """(scales, zero points, row bytes) offsets of a quantized row, as QuantRowLayout."""
    scales = (n_kv_heads * dim + 3) // 4 * 4
    return scales, scales + 4 * n_kv_heads, row_bytes(kv_dtype, n_kv_heads, dim)


def check_compute_dtype(layer: int, key: torch.Tensor, value: torch.Tensor) -> None:
    """InvalidArgumentError naming both dtypes unless ``key`` and ``value`` hold one compute dtype
    (float32, float16 or bfloat16): what a quantized pool takes and gives."""
    if key.dtype not in COMPUTE_DTYPES or value.dtype != key.dtype:
        raise InvalidArgumentError(
            f"layer {layer}: key/value of {key.dtype}/{value.dtype}: a quantized pool takes float32, "
            "float16 or bfloat16 (both the same)")


def quantize_rows(kv_dtype: str, x: torch.Tensor, what: str = "key") -> torch.Tensor:
    """``x`` ``[batch, n_kv_heads, T, dim]`` (float32, float16 or bfloat16) as quantized rows
    ``[batch, 1, T, row_bytes]`` uint8, per (row, head) by kvcore's rule (docs/quantized.md).

    Raises InvalidArgumentError for a value that is not finite or a (row, head) whose range
    max - min passes FLT_MAX.
    """
    B, H, T, D = x.shape
    xf = x.to(torch.float32)
    if not bool(torch.isfinite(xf).all()):
        raise InvalidArgumentError(f"{what}: holds inf or NaN: a quantized pool stores finite values only")
    lo = xf.amin(dim=-1).clamp(max=0.0)
    hi = xf.amax(dim=-1).clamp(min=0.0)
    if not bool(torch.isfinite(hi - lo).all()):
        raise InvalidArgumentError(f"{what}: a (row, head) range max - min passes FLT_MAX: no float32 scale holds it")
    s_off, z_off, nbytes = _offsets(H, D, kv_dtype)
    out = torch.zeros((B, T, nbytes), dtype=torch.uint8, device=x.device)
    if kv_dtype == "int8":
        scale = ((hi - lo) / 255.0).clamp(min=_EPS)
        dmin, dmax = lo / scale, hi / scale
        zp = torch.where((-128 + dmin) + (127 + dmax) > 0, -128 - dmin, 127 - dmax).clamp(-128, 127).round()
        q = (xf.to(torch.float64) * (1.0 / scale.to(torch.float64)).unsqueeze(-1) + zp.to(torch.float64).unsqueeze(-1))
        q = q.round().clamp(-128, 127).to(torch.int8)
        out[:, :, z_off:z_off + H] = zp.to(torch.int8).transpose(1, 2).view(torch.uint8)
    else:
        scale = (torch.maximum(-lo, hi) / 448.0).clamp(min=_TINY)
        q = (xf / scale.unsqueeze(-1)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    out[:, :, : H * D] = q.view(torch.uint8).transpose(1, 2).reshape(B, T, H * D)
    # A fresh (B, T, H) tensor has unit last stride even when H = 1 (contiguous() keeps a size-1 dim's stride).
    scales = torch.empty((B, T, H), dtype=torch.float32, device=x.device)
    scales.copy_(scale.transpose(1, 2))
    out[:, :, s_off:s_off + 4 * H] = scales.view(torch.uint8)
    return out.unsqueeze(1)


#: Values dequantized per piece: bounds the float32 / int32 scratch at 1 MiB each, whatever the read.
DEQUANTIZE_PIECE = 1 << 18


def dequantize_rows(
    kv_dtype: str, rows: torch.Tensor, n_kv_heads: int, dim: int, out: torch.Tensor,
    scratch: Optional[Workspace] = None,
) -> torch.Tensor:
    """Quantized rows ``[batch, 1, n, row_bytes]`` uint8 into ``out`` ``[batch, n_kv_heads, n, dim]``
    (its dtype: float32, float16 or bfloat16), values rounded from float32 as the C++ codec does.

    The rows go through in pieces of about ``DEQUANTIZE_PIECE`` values, in ``scratch`` buffers
    (a pool's workspace: nothing allocated once warm; a fresh one when None), so a read of a
    long context needs no float32 copy of its whole K or V beside ``out``."""
    B, _, n, _ = rows.shape
    H, D = n_kv_heads, dim
    s_off, z_off, _ = _offsets(H, D, kv_dtype)
    ws = Workspace() if scratch is None else scratch
    r = rows[:, 0]
    values = r[:, :, : H * D].reshape(B, n, H, D).transpose(1, 2)
    step = max(1, DEQUANTIZE_PIECE // max(1, B * H * D))
    for a in range(0, n, step):
        m = min(step, n - a)
        part = r[:, a:a + m, None]  # [B, m, 1, row_bytes]
        scale_bytes = ws.take_as("dq_scale", (B, m, 1, 4 * H), torch.uint8, rows.device)
        scale_bytes.copy_(part[..., s_off:s_off + 4 * H])
        scale = scale_bytes.view(torch.float32).permute(0, 3, 1, 2)  # [B, H, m, 1]
        f32 = ws.take_as("dq_f32", (B, H, m, D), torch.float32, rows.device)
        if kv_dtype == "int8":
            zp = ws.take_as("dq_zp", (B, m, 1, H), torch.int8, rows.device)
            zp.copy_(part[..., z_off:z_off + H].view(torch.int8))
            i32 = ws.take_as("dq_i32", (B, H, m, D), torch.int32, rows.device)
            i32.copy_(values[:, :, a:a + m].view(torch.int8))
            i32.sub_(zp.permute(0, 3, 1, 2))
            f32.copy_(i32)
        else:
            f32.copy_(values[:, :, a:a + m].view(torch.float8_e4m3fn))
        f32.mul_(scale)
        out[:, :, a:a + m].copy_(f32)
    return out


class TorchQuantizedKVPool(TorchKVPool):
    """K/V of a ``SequenceCache`` in torch tensors, each row stored quantized (``kv_dtype``
    "int8" or "fp8"); values in and out in a compute dtype. See the module docstring; the
    rest (orders, mirrors, trees, ``apply_copies``) is ``TorchKVPool``'s.

    Raises InvalidArgumentError for an unknown ``kv_dtype`` (naming it and the choices) or order.
    """

    def __init__(self, cache: SequenceCache, kv_dtype: str, *, mirror_rings: bool = False,
                 order: str = "rows") -> None:
        format_ = kv_format(kv_dtype)  # refuses an unknown name before anything is built
        super().__init__(cache, mirror_rings=mirror_rings, order=order)
        self.kv_dtype = kv_dtype
        #: The pool format of the rows, as ``kvcore.KVPool`` names it: "qint8" or "fp8_e4m3".
        self.format = format_
        #: Each layer's real shape (values); ``_configs`` holds the packed rows' shape the base class stores.
        self.value_configs = list(self._configs)
        self._configs = [
            LayerConfig(lc.policy, 1, row_bytes(kv_dtype, lc.n_kv_heads, lc.head_dim),
                        row_bytes(kv_dtype, lc.n_kv_heads, lc.value_dim))
            for lc in self.value_configs
        ]

    def write_read(
        self, layer: int, layout: StepLayout, key: torch.Tensor, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``TorchKVPool.write_read`` for values: quantize, write the rows, return the read dequantized.

        ``key``/``value``: ``[batch, n_kv_heads, T, dim]`` of float32, float16 or bfloat16.
        Returns ``[batch, n_kv_heads, n, dim]`` of the same dtype (a workspace the next update of
        any layer reuses). InvalidArgumentError: as the base class, another dtype, non-finite values.
        """
        self._check_values(layer, key, value)
        lc = self.value_configs[layer]
        if key.requires_grad or value.requires_grad:
            key, value = key.detach(), value.detach()
        packed_k = quantize_rows(self.kv_dtype, key, "key")
        packed_v = quantize_rows(self.kv_dtype, value, "value")
        rows_k, rows_v = super().write_read(layer, layout, packed_k, packed_v)
        B, _, n, _ = rows_k.shape
        keys = dequantize_rows(self.kv_dtype, rows_k, lc.n_kv_heads, lc.head_dim,
                               self._workspace.take("dk", (B, lc.n_kv_heads, n, lc.head_dim), key), self._workspace)
        values = dequantize_rows(self.kv_dtype, rows_v, lc.n_kv_heads, lc.value_dim,
                                 self._workspace.take("dv", (B, lc.n_kv_heads, n, lc.value_dim), value),
                                 self._workspace)  # fmt: skip
        return keys, values

    def read(self, layer: int, step: Step, *, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """``TorchKVPool.read`` dequantized into ``dtype`` (float32, float16 or bfloat16): the K/V the
        layer's source wrote in ``step``, without writing (a workspace the next update or read reuses).
        Errors: ``TorchKVPool.read``'s, and InvalidArgumentError for another dtype."""
        if dtype not in COMPUTE_DTYPES:
            raise InvalidArgumentError(f"read: dtype = {dtype}: a quantized pool returns float32, float16 or bfloat16")
        rows_k, rows_v = super().read(layer, step)
        lc = self.value_configs[layer]
        B, _, n, _ = rows_k.shape
        ws, device = self._workspace, rows_k.device
        keys = dequantize_rows(self.kv_dtype, rows_k, lc.n_kv_heads, lc.head_dim,
                               ws.take_as("dk", (B, lc.n_kv_heads, n, lc.head_dim), dtype, device), ws)
        values = dequantize_rows(self.kv_dtype, rows_v, lc.n_kv_heads, lc.value_dim,
                                 ws.take_as("dv", (B, lc.n_kv_heads, n, lc.value_dim), dtype, device), ws)
        return keys, values

    def _check_values(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> None:
        """InvalidArgumentError unless key/value are values that fit ``layer``: 4-D, its heads and
        dims, the same batch and T, one dtype of float32, float16, bfloat16."""
        if not 0 <= layer < len(self._configs):
            raise InvalidArgumentError(f"layer = {layer}: must be in [0, n_layers = {len(self._configs)})")
        lc = self.value_configs[layer]
        if (key.dim() != 4 or value.dim() != 4 or key.shape[1] != lc.n_kv_heads or value.shape[1] != lc.n_kv_heads
                or key.shape[3] != lc.head_dim or value.shape[3] != lc.value_dim or key.shape[:3] != value.shape[:3]):
            raise InvalidArgumentError(
                f"layer {layer}: key {tuple(key.shape)} / value {tuple(value.shape)} must be "
                f"[batch, {lc.n_kv_heads}, T, {lc.head_dim}] / [batch, {lc.n_kv_heads}, T, {lc.value_dim}]")
        check_compute_dtype(layer, key, value)

    def check_input(
        self, layer: int, key: torch.Tensor, value: torch.Tensor, *, position: int, T: Optional[int] = None
    ) -> int:
        """``TorchKVPool.check_input`` for values (or, from the base class's own path, quantized rows):
        InvalidArgumentError unless they fit ``layer`` for ``T`` new rows at ``position``; returns T."""
        if key.dtype == torch.uint8 and value.dtype == torch.uint8:
            return super().check_input(layer, key, value, position=position, T=T)
        self._check_values(layer, key, value)
        packed = self._configs[layer]
        B, _, t, _ = key.shape
        k = torch.empty((B, 1, t, packed.head_dim), dtype=torch.uint8, device=key.device)
        v = torch.empty((B, 1, t, packed.value_dim), dtype=torch.uint8, device=key.device)
        return super().check_input(layer, k, v, position=position, T=T)

    def allocate(self, layer: int, *, batch_size: int, dtype: torch.dtype,
                 device: Union[torch.device, str]) -> Any:
        """``TorchKVPool.allocate`` of the layer's quantized rows (``dtype`` is always uint8 here)."""
        return super().allocate(layer, batch_size=batch_size, dtype=torch.uint8, device=device)

    def export_sequence(self, tokens: Tokens = None, *, dtype: Optional[torch.dtype] = None) -> bytes:
        """The cache's sequence as a record (bytes, docs/state.md, version 2), byte for byte what
        ``kvcore.KVPool(cache, "qint8" / "fp8_e4m3")`` holding the same rows gives: each row's
        values, scales and zero points as stored. ``tokens``: ids of positions ``[0, len(tokens))``.
        ``dtype``: ignored (the rows are the format's bytes). Errors: ``pool_records.export_sequence``."""
        return pool_records.export_sequence(self, tokens, record_format=self.format)

    def import_sequence(self, record: Any, *, device: Union[torch.device, str, None] = None) -> None:
        """Admits the sequence of a record of this pool's format (from this pool, a ``KVPool(cache,
        "qint8" / "fp8_e4m3")`` or a quantized paged pool) into the empty cache and new batch-1
        tensors on ``device``, the record validated before anything is allocated; changes nothing on
        an error. A record of another storage format (plain or the other quantized one) is refused
        naming both (InvalidArgumentError). Errors: ``pool_records.import_layers``."""
        self._install(pool_records.import_layers(self, record, device=device, record_format=self.format))


__all__ = ["COMPUTE_DTYPES", "DEQUANTIZE_PIECE", "TorchQuantizedKVPool", "check_compute_dtype", "dequantize_rows", "quantize_rows"]
