"""Bit-for-bit tensor comparison for "nothing changed" checks: rows a pool never wrote hold
whatever memory held (torch.empty), NaN bit patterns included, and NaN != NaN under torch.equal."""

from __future__ import annotations

from typing import Any

import torch


def same_bits(a: Any, b: Any) -> bool:
    """True when two tensors have the same shape and dtype and the same bytes."""
    return bool(
        a.shape == b.shape
        and a.dtype == b.dtype
        and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
    )
