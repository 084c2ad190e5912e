"""What a record's rows and a torch tensor's share: the dtypes both hold, and a tensor's bytes.

A record (docs/state.md) stores rows as float32, float16, bfloat16, int8 or uint8;
``TORCH_DTYPE`` maps each record dtype name (numpy's) to the torch dtype holding the
same bytes, ``RECORD_DTYPE`` the other way. ``byte_view`` gives a CPU tensor's bytes as
numpy ``uint8`` (bfloat16 through int16: numpy has no bfloat16). Used by the record
export and import of both torch byte layers (``pool_records``, ``paged_records``).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import numpy as np
import numpy.typing as npt
import torch

# The record dtypes a torch tensor can hold, by numpy name, and back.
TORCH_DTYPE: dict[str, torch.dtype] = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int8": torch.int8, "uint8": torch.uint8,
}  # fmt: skip
RECORD_DTYPE: dict[torch.dtype, str] = {t: n for n, t in TORCH_DTYPE.items()}

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


__all__ = ["RECORD_DTYPE", "TORCH_DTYPE", "Tokens", "byte_view", "tensor_of"]
