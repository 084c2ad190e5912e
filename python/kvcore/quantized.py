"""Quantized K/V storage by its model-level name (docs/quantized.md).

``kv_dtype="int8"`` stores K/V as the pool format ``"qint8"`` (ExecuTorch's
asymmetric int8: per (row, head) a float32 scale and an int8 zero point) and
``kv_dtype="fp8"`` as ``"fp8_e4m3"`` (float8 e4m3fn, per (row, head) a float32
scale). A row carries its scales: values, padding to 4 bytes, the float32
scales, the int8 zero points, padding to 4 bytes (``kvcore/pool/dtype.h``,
``QuantRowLayout``). This module names the formats and sizes their rows, for
the memory planner and the integrations; the codec itself is C++
(``kvcore/pool/quantize.h``), reached through ``kvcore.KVPool`` and
``kvcore.PagedKVPool`` with ``dtype="qint8"`` or ``"fp8_e4m3"``.
"""

from __future__ import annotations

from kvcore._errors import InvalidArgumentError

#: Pool storage format of each kv_dtype name.
KV_FORMATS = {"int8": "qint8", "fp8": "fp8_e4m3"}


def kv_format(kv_dtype: str) -> str:
    """The pool format (``"qint8"`` or ``"fp8_e4m3"``) of ``kv_dtype`` (``"int8"`` or ``"fp8"``).

    Raises InvalidArgumentError naming the value and the choices for anything else.
    """
    if not isinstance(kv_dtype, str) or kv_dtype not in KV_FORMATS:
        raise InvalidArgumentError(
            f"kv_dtype = {kv_dtype!r}: must be 'int8' (asymmetric int8, ExecuTorch's QuantizedKVCache "
            "rule) or 'fp8' (float8 e4m3fn), or None for the compute dtype unquantized")
    return KV_FORMATS[kv_dtype]


def row_bytes(kv_dtype: str, n_kv_heads: int, dim: int) -> int:
    """Bytes of one quantized K or V row of ``n_kv_heads`` x ``dim`` values, scales and zero points included.

    As ``QuantRowLayout`` lays it out: ``n_kv_heads * dim`` value bytes rounded up to 4, a float32
    scale per head, for ``"int8"`` an int8 zero point per head, the row rounded up to 4.
    Raises InvalidArgumentError for an unknown kv_dtype or negative sizes.
    """
    fmt = kv_format(kv_dtype)
    if n_kv_heads < 0 or dim < 0:
        raise InvalidArgumentError(f"n_kv_heads = {n_kv_heads}, dim = {dim}: must be >= 0")
    values = (n_kv_heads * dim + 3) // 4 * 4
    end = values + 4 * n_kv_heads + (n_kv_heads if fmt == "qint8" else 0)
    return (end + 3) // 4 * 4
