"""What a record's rows and a torch tensor's share: the dtypes both hold, and a tensor's bytes.

A record (docs/state.md) stores rows as float32, float16, bfloat16, int8 or uint8;
``TORCH_DTYPE`` maps each record dtype name (numpy's) to the torch dtype holding the
same bytes, ``RECORD_DTYPE`` the other way. ``byte_view`` gives a CPU tensor's bytes as
numpy ``uint8`` (bfloat16 through int16: numpy has no bfloat16). A quantized record
format (``"qint8"``, ``"fp8_e4m3"``: docs/quantized.md) is held by the quantized torch pools
as uint8 rows of ``row_bytes`` bytes, one "head" wide (``stored_rows``); ``KV_DTYPE_OF_FORMAT``
names each format's ``kv_dtype``. Used by the record export and import of the torch byte
layers (``pool_records``, ``paged_records``).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import numpy as np
import numpy.typing as npt
import torch

from kvcore.quantized import KV_FORMATS

# The record dtypes a torch tensor can hold, by numpy name, and back.
TORCH_DTYPE: dict[str, torch.dtype] = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int8": torch.int8, "uint8": torch.uint8,
}  # fmt: skip
RECORD_DTYPE: dict[torch.dtype, str] = {t: n for n, t in TORCH_DTYPE.items()}
#: The ``kv_dtype`` name ("int8", "fp8") of each quantized record format ("qint8", "fp8_e4m3").
KV_DTYPE_OF_FORMAT: dict[str, str] = {fmt: name for name, fmt in KV_FORMATS.items()}

# Token ids of positions [0, len(tokens)) an export stores (a list or an int array), or None.
Tokens = Optional[Union[Sequence[int], "npt.NDArray[np.integer[Any]]"]]


def byte_view(t: torch.Tensor) -> npt.NDArray[np.uint8]:
    """A contiguous CPU tensor's bytes as a flat ``uint8`` numpy array sharing its memory (no copy)."""
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().reshape(-1).view(np.uint8)


def tensor_of(rows: npt.NDArray[Any], dtype: torch.dtype) -> torch.Tensor:
    """Numpy rows (a record's, any shape) as a torch tensor of ``dtype`` holding the same bytes
    (one copy when ``rows`` is a read-only view: torch wants writable memory)."""
    data = np.array(rows, copy=True).view(np.uint8)
    return torch.from_numpy(data).view(dtype).reshape(rows.shape)


def stored_rows(t: torch.Tensor) -> torch.Tensor:
    """A record's rows ``(n, n_kv_heads, dim)`` as they are, or a quantized layer's ``(n, row_bytes)``
    as ``(n, 1, row_bytes)``: the shape the quantized torch pools hold them in."""
    return t.unsqueeze(1) if t.dim() == 2 else t


__all__ = ["KV_DTYPE_OF_FORMAT", "RECORD_DTYPE", "TORCH_DTYPE", "Tokens", "byte_view", "stored_rows", "tensor_of"]
