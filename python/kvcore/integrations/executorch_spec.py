"""What kvcore's caches behind ExecuTorch's ``kvcache::update_and_attend`` op share
(kvcore.integrations.executorch): ExecuTorch's reference types (``AttendSpec``, ``MaskKind``,
``CacheSizing``, ``LayerKind``, ``MAX_SEQS``), imported once with a message naming what to
install when they are missing, the kvcore layer configs of an ExecuTorch ``CacheConfig`` (``kvcore_layers``), and
the checks of a layer id and of a forward's positions both caches make.

Tested with executorch 1.5.1 and torch 2.13.0.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any, Optional

try:
    import torch

    # ExecuTorch has no type information (no py.typed): import it as a module object, so its names are Any.
    _reference: Any = importlib.import_module("executorch.extension.llm.cache.reference_cache")
except ModuleNotFoundError as _missing:  # name what to install (private: Python deletes the name after the block)
    raise ModuleNotFoundError(
        f"kvcore.integrations.executorch needs torch and executorch ({_missing.name!r} is missing): "
        "pip install torch && pip install --no-deps executorch==1.5.1 && pip install ruamel.yaml flatbuffers tabulate",
        name=_missing.name,
    ) from _missing

from kvcore._core import Flat, LayerConfig, Ring
from kvcore._errors import InvalidArgumentError

TESTED_EXECUTORCH = "1.5.1"

AttendSpec: Any = _reference.AttendSpec
MaskKind: Any = _reference.MaskKind
CacheSizing: Any = _reference.CacheSizing
LayerKind: Any = _reference.LayerKind
#: ExecuTorch's CellReferenceCache limit (its owner bitset); KVCoreCellCache's default max_seqs.
MAX_SEQS: int = int(_reference.MAX_SEQS)

#: The op's specs without a mask: every row seen (NONE), or the step's own tokens causally (CAUSAL).
NONE_SPEC: Any = AttendSpec(kind=MaskKind.NONE)
CAUSAL_SPEC: Any = AttendSpec(kind=MaskKind.CAUSAL)


def kvcore_layers(config: Any, v_head_dim: Optional[int]) -> list[LayerConfig]:
    """kvcore layer configs for an ExecuTorch CacheConfig: FLAT -> Flat(), RING -> Ring(window)."""
    out = []
    for layer in range(config.n_layers):
        policy = config.policy_for(layer)
        kvpolicy = Ring(int(policy.window)) if policy.kind is LayerKind.RING else Flat()
        out.append(LayerConfig(kvpolicy, int(config.n_kv_heads), int(config.head_dim), int(v_head_dim or 0)))
    return out


def check_layer(layer_id: int, n_layers: int) -> None:
    """InvalidArgumentError naming ``layer_id`` unless 0 <= layer_id < n_layers."""
    if not 0 <= layer_id < n_layers:
        raise InvalidArgumentError(f"layer_id = {layer_id}: must be in [0, n_layers = {n_layers})")


def check_positions(position: torch.Tensor, T: int, length: int) -> None:
    """Checks a forward's ``position`` tensor against a sequence of ``length`` tokens: kvcore
    appends, so a [T, 1] tensor must hold length .. length + T - 1 (a [T, n] one of several
    components, M-RoPE's, is not read). InvalidArgumentError naming the shape or the positions."""
    if position.dim() != 2 or int(position.shape[0]) != T:
        raise InvalidArgumentError(f"position {tuple(position.shape)}: must be [T = {T}, n_dims]")
    if int(position.shape[1]) != 1:
        return  # multi-component positions (e.g. M-RoPE): placement follows the length, as the reference's
    got = position.reshape(-1).tolist()
    if got != list(range(length, length + T)):
        raise InvalidArgumentError(
            f"positions {position_ranges(got)}: the sequence has {length} tokens, so this forward's must be "
            f"{length}..{length + T - 1} (kvcore appends; rewind() or reset() to go back)"
        )


def position_ranges(positions: Sequence[int]) -> str:
    """A short rendering of a position list: runs as a..b."""
    runs: list[str] = []
    start = prev = None
    for p in list(positions) + [None]:
        if start is not None and p is not None and prev is not None and p == prev + 1:
            prev = p
            continue
        if start is not None:
            runs.append(str(start) if start == prev else f"{start}..{prev}")
        start = prev = p
    return "[" + ", ".join(runs) + "]"
