"""A tiny random decoder on ``kvcache::update_and_attend`` (kvcore.integrations.executorch_runtime),
for checking ExecuTorch's runtime on kvcore's kernel and for quick demos: ``TinyConfig`` (its
layer kinds and sizes, and the kvcore metadata they give), ``TinyDecoder`` (calls the op once per
layer, with a plain PyTorch reference forward: explicit masks, no cache) and ``export_tiny`` (the
model and its ``.pte`` bytes, in about 5 s; ``forward`` and, by default, ``forward_last``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from kvcore.integrations.executorch_runtime import CHUNKED, FLAT, RING, KVCoreMetadata, export_program

def _rope_tables(positions: torch.Tensor, d: int, theta: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [T, d] of the rotary embedding at ``positions`` [T] (rotate-half form)."""
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    angles = positions.to(torch.float32)[:, None] * inv[None, :]  # [T, d/2]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x`` [B, H, T, D] with ``_rope_tables``' cos and sin."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def _rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * weight


@dataclass
class TinyConfig:
    """Shape of ``TinyDecoder``: ``kinds``/``windows``/``sinks`` per layer (``KVCoreMetadata``'s)."""

    kinds: tuple[int, ...] = (FLAT, RING, FLAT)
    windows: tuple[int, ...] = (0, 8, 0)
    sinks: tuple[int, ...] = (0, 0, 0)
    vocab_size: int = 64
    dim: int = 32
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 8
    hidden: int = 64
    capacity: int = 64
    max_step: int = 8
    seed: int = 0

    def metadata(self) -> KVCoreMetadata:
        """The cache facts a program of this model carries (``export_program`` writes them)."""
        return KVCoreMetadata(
            kinds=tuple(self.kinds), windows=tuple(self.windows), sinks=tuple(self.sinks),
            sources=(0,) * len(self.kinds), n_kv_heads=self.n_kv_heads, n_heads=self.n_heads, head_dim=self.head_dim,
            capacity=self.capacity, max_step=self.max_step, vocab_size=self.vocab_size,
        )


def _sees(kind: int, window: int, sinks: int, q: int, k: int) -> bool:
    """kvcore's visibility rule (docs/design.md sections 2 and 9) for Flat, Ring and Chunked."""
    if k > q:
        return False
    if kind == RING:
        return k < sinks or q - k < window
    if kind == CHUNKED:
        return k >= q - q % window
    return True


class TinyDecoder(torch.nn.Module):
    """A tiny random decoder (RMSNorm, GQA attention with RoPE, SiLU MLP) whose attention is
    ``kvcache::update_and_attend``: ``forward(tokens [1, T], positions [T, 1]) -> logits [1, T,
    vocab]``; ``forward_last`` the same forward returning only the last position's logits ``[1, 1,
    vocab]`` (the head applied to that row only). ``reference(tokens [1, N])`` computes every
    position's logits in plain PyTorch from the whole sequence with explicit masks (no cache),
    for checking a runtime's."""

    def __init__(self, config: TinyConfig) -> None:
        """Random weights from ``config.seed`` (the same config gives the same model)."""
        super().__init__()
        self.config = c = config
        gen = torch.Generator().manual_seed(c.seed)

        def w(*shape: int, scale: float = 0.3) -> torch.nn.Parameter:
            return torch.nn.Parameter(torch.randn(*shape, generator=gen) * scale, requires_grad=False)

        n = len(c.kinds)
        self.embed = w(c.vocab_size, c.dim, scale=1.0)
        self.wq = torch.nn.ParameterList([w(c.n_heads * c.head_dim, c.dim) for _ in range(n)])
        self.wk = torch.nn.ParameterList([w(c.n_kv_heads * c.head_dim, c.dim) for _ in range(n)])
        self.wv = torch.nn.ParameterList([w(c.n_kv_heads * c.head_dim, c.dim) for _ in range(n)])
        self.wo = torch.nn.ParameterList([w(c.dim, c.n_heads * c.head_dim) for _ in range(n)])
        self.w1 = torch.nn.ParameterList([w(c.hidden, c.dim) for _ in range(n)])
        self.w3 = torch.nn.ParameterList([w(c.hidden, c.dim) for _ in range(n)])
        self.w2 = torch.nn.ParameterList([w(c.dim, c.hidden) for _ in range(n)])
        self.norm1 = torch.nn.ParameterList([w(c.dim, scale=0.1) for _ in range(n)])
        self.norm2 = torch.nn.ParameterList([w(c.dim, scale=0.1) for _ in range(n)])
        self.norm_out = w(c.dim, scale=0.1)
        self.head = w(c.vocab_size, c.dim)
        self.scale = 1.0 / math.sqrt(c.head_dim)

    def _layers(self, x: torch.Tensor, positions: torch.Tensor, attend: Callable[..., torch.Tensor]) -> torch.Tensor:
        return self._head(self._hidden(x, positions, attend))

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        return _rms(x, 1.0 + self.norm_out) @ self.head.T

    def _hidden(self, x: torch.Tensor, positions: torch.Tensor, attend: Callable[..., torch.Tensor]) -> torch.Tensor:
        c = self.config
        B, T, _ = x.shape
        cos, sin = _rope_tables(positions, c.head_dim)
        for layer in range(len(c.kinds)):
            h = _rms(x, 1.0 + self.norm1[layer])
            q = (h @ self.wq[layer].T).view(B, T, c.n_heads, c.head_dim).transpose(1, 2)
            k = (h @ self.wk[layer].T).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
            v = (h @ self.wv[layer].T).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            o = attend(q.contiguous(), k.contiguous(), v.contiguous(), layer)
            x = x + o.transpose(1, 2).reshape(B, T, c.n_heads * c.head_dim) @ self.wo[layer].T
            h = _rms(x, 1.0 + self.norm2[layer])
            x = x + (torch.nn.functional.silu(h @ self.w1[layer].T) * (h @ self.w3[layer].T)) @ self.w2[layer].T
        return x

    def _cached_hidden(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        op = torch.ops.kvcache.update_and_attend.default

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
            out: torch.Tensor = op(q, k, v, positions, layer, self.scale, torch.float32)
            return out

        return self._hidden(self.embed[tokens], positions[:, 0], attend)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits [1, T, vocab] of ``tokens`` [1, T] at ``positions`` [T, 1] (int64), the cache
        behind ``kvcache::update_and_attend`` (eagerly: ExecuTorch's registry's active cache)."""
        return self._head(self._cached_hidden(tokens, positions))

    def forward_last(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``forward``'s last row only: logits [1, 1, vocab] of the last of ``tokens`` [1, T] at
        ``positions`` [T, 1], every token's K/V written to the cache as ``forward`` writes them
        (the final norm and head run on one row, not T)."""
        return self._head(self._cached_hidden(tokens, positions)[:, -1:])

    def reference(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits of every position of ``tokens`` [1, N], from the whole sequence at once."""
        c = self.config
        N = tokens.shape[1]
        positions = torch.arange(N)
        rep = c.n_heads // c.n_kv_heads

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
            kind, window, sinks = c.kinds[layer], c.windows[layer], c.sinks[layer]
            mask = torch.tensor([[_sees(kind, window, sinks, i, j) for j in range(N)] for i in range(N)])
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            out: torch.Tensor = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
            return out

        with torch.no_grad():
            return self._layers(self.embed[tokens], positions, attend)

    def example_inputs(self, T: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs of a forward of ``T`` tokens at positions 0 .. T - 1."""
        return torch.zeros(1, T, dtype=torch.long), torch.arange(T, dtype=torch.long)[:, None]

    def dynamic_shapes(self) -> Any:
        """The token dimension dynamic, 1 .. max_step, shared by ``tokens`` and ``positions``."""
        T = torch.export.Dim("T", min=1, max=self.config.max_step)
        return {"tokens": {1: T}, "positions": {0: T}}


def export_tiny(config: Optional[TinyConfig] = None, forward_last: bool = True) -> tuple[TinyDecoder, bytes]:
    """A ``TinyDecoder`` for ``config`` (default: 3 layers, the middle one a ring of window 8) and
    its ``.pte`` bytes (kvcore's metadata included): methods ``forward`` and, unless
    ``forward_last=False`` (a program as exported before that method existed), ``forward_last``."""
    config = config or TinyConfig()
    model = TinyDecoder(config).eval()
    pte = export_program(model, model.example_inputs(2), config.metadata(), model.dynamic_shapes(),
                         forward_last=forward_last)  # fmt: skip
    return model, pte


__all__ = ["TinyConfig", "TinyDecoder", "export_tiny"]
