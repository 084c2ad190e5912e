"""Workspace: flat scratch tensors a byte layer returns its reads in, grown to the largest read, reused.

A torch byte layer that cannot return a read as a view of its storage (a gathered
read of ``TorchKVPool``, the dequantized rows of the quantized pools) copies it into
one of these buffers, one per (kind, dtype, device): allocated once for the largest
read and reused by the next, so a step allocates nothing once warm. A returned view is
valid until the next read of the same kind: what an attention layer needs.
"""

from __future__ import annotations

import torch


class Workspace:
    """Flat scratch buffers by (kind, dtype, device); grown to the largest request, never shrunk."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = {}

    def take(self, kind: str, shape: tuple[int, int, int, int], like: torch.Tensor) -> torch.Tensor:
        """A tensor of ``shape`` with ``like``'s dtype and device, a view of the ``kind`` buffer (grown
        when smaller; its contents are whatever the last read left)."""
        return self.take_as(kind, shape, like.dtype, like.device)

    def take_as(self, kind: str, shape: tuple[int, int, int, int], dtype: torch.dtype,
                device: torch.device) -> torch.Tensor:
        """``take`` for a ``dtype`` and ``device`` given by name."""
        numel = shape[0] * shape[1] * shape[2] * shape[3]
        key = (kind, dtype, device)
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, dtype=dtype, device=device)
            self._buffers[key] = buf
        return buf[:numel].view(shape)

    @property
    def nbytes(self) -> int:
        """Bytes of every buffer."""
        return sum(b.numel() * b.element_size() for b in self._buffers.values())

    def clear(self) -> None:
        """Drop every buffer."""
        self._buffers.clear()


__all__ = ["Workspace"]
