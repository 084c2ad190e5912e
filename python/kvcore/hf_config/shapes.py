"""What a model's config says about its KV cache: ``ModelShape`` and the kinds of its special layers.

``ModelShape`` holds per layer its sliding window (or None) and, for a layer of another kind,
a ``ChunkedLayer``, ``SharedLayer``, ``StateShape`` (a recurrent state's size) or
``EmptyLayer``; ``ModelShape.cache_config`` plans it (``kvcore.hf_config.policies``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

from kvcore._core import CacheConfig, LayerConfig
from kvcore._errors import InvalidArgumentError
from kvcore.hf_config.fields import check_int
from kvcore.hf_config.policies import default_state_slots, layer_config

#: The largest context kvcore can plan: positions are 32-bit signed ints.
MAX_CONTEXT = 2**31 - 1


@dataclass(frozen=True)
class ChunkedLayer:
    """A chunked-attention layer (Llama 4): a query sees the keys of its own ``chunk``-token chunk."""

    chunk: int


@dataclass(frozen=True)
class SharedLayer:
    """A layer that reads layer ``source``'s K/V (Gemma 3n's KV-shared layers) and holds none."""

    source: int


@dataclass(frozen=True)
class StateShape:
    """One recurrent layer's state for one sequence: what one snapshot (one state slot) holds.

    ``conv_channels`` x ``conv_width`` elements of convolution window, kept in the
    activation dtype; ``recurrent_elements`` elements of recurrent (SSM / DeltaNet)
    matrix, kept in float32 (``recurrent_dtype_bytes``). ``formula`` says where the
    shape comes from (docs/memory.md, "Recurrent state").
    """

    kind: str  # "gated_deltanet", "mamba2", "mamba" (Mamba-1) or "short_conv"
    conv_channels: int
    conv_width: int
    recurrent_elements: int = 0
    recurrent_dtype_bytes: int = 4
    formula: str = ""

    @property
    def conv_elements(self) -> int:
        """Elements of the convolution window."""
        return self.conv_channels * self.conv_width

    def conv_bytes(self, dtype_size: int) -> int:
        """Bytes of the convolution window at ``dtype_size`` bytes per element."""
        return self.conv_elements * dtype_size

    @property
    def recurrent_bytes(self) -> int:
        """Bytes of the recurrent matrix (float32 unless recurrent_dtype_bytes says otherwise)."""
        return self.recurrent_elements * self.recurrent_dtype_bytes

    def snapshot_bytes(self, dtype_size: int) -> int:
        """Bytes of one state snapshot (one slot), the conv part at ``dtype_size`` bytes per element."""
        return self.conv_bytes(dtype_size) + self.recurrent_bytes


@dataclass(frozen=True)
class EmptyLayer:
    """A layer without attention or recurrent state: it caches nothing (Nemotron-H's "-" MLP and "E"
    MoE layers; transformers' "dummy" cache layer for layer type "mlp" or "moe")."""

    block: str  # "mlp" or "moe"


#: A layer that is neither full nor sliding: its kind and what it needs.
SpecialLayer = Union[ChunkedLayer, SharedLayer, StateShape, EmptyLayer]


@dataclass(frozen=True)
class ModelShape:
    """What a model's config says about its KV cache.

    ``windows[i]`` is layer i's sliding window (keys a query sees, counting
    itself), or None for a full-attention layer. ``special[i]`` (empty when the
    model has none) is a ChunkedLayer, SharedLayer, StateShape or EmptyLayer for
    a layer of another kind (its window is None), else None. A model whose layers
    run attention and a recurrent mixer side by side (Falcon-H1's "hybrid" layers)
    has two planned layers per model layer: n attention layers, then n state
    layers appended after them (as kvcore's transformers cache holds them);
    ``notes`` says so.
    """

    name: str
    model_type: str
    n_kv_heads: int
    head_dim: int
    windows: tuple[Optional[int], ...]
    v_head_dim: int = 0  # 0: V rows are head_dim wide, like K rows
    max_position_embeddings: Optional[int] = None
    defaults: tuple[str, ...] = field(default=())  # "field=value (source)" the file left out
    special: tuple[Optional[SpecialLayer], ...] = field(default=())
    notes: tuple[str, ...] = field(default=())  # how the layers were counted, for the memory report

    def __post_init__(self) -> None:
        if self.special and len(self.special) != len(self.windows):
            raise InvalidArgumentError(
                f"special has {len(self.special)} entries: must be empty or one per layer ({len(self.windows)})"
            )
        for i, other in enumerate(self.special):
            if other is not None and self.windows[i] is not None:
                raise InvalidArgumentError(f"layer {i}: sliding (window {self.windows[i]}) and {other}")

    @property
    def n_layers(self) -> int:
        """Planned layers (a hybrid model's appended state layers included)."""
        return len(self.windows)

    def layer_kind(self, layer: int) -> str:
        """"sliding", "full", "chunked", "shared", "state" or "empty" (no attention, no state: it
        caches nothing): what ``layer`` is."""
        other = self.special[layer] if self.special else None
        if isinstance(other, ChunkedLayer):
            return "chunked"
        if isinstance(other, SharedLayer):
            return "shared"
        if isinstance(other, StateShape):
            return "state"
        if isinstance(other, EmptyLayer):
            return "empty"
        return "full" if self.windows[layer] is None else "sliding"

    @property
    def has_state(self) -> bool:
        """True when some layer keeps a recurrent state."""
        return any(isinstance(o, StateShape) for o in self.special)

    @property
    def value_dim(self) -> int:
        """A V row's head size: ``v_head_dim``, else ``head_dim``."""
        return self.v_head_dim or self.head_dim

    def cache_config(
        self,
        context: int,
        *,
        max_step: Optional[int] = None,
        sinks: int = 0,
        all_flat: bool = False,
        state_slots: Optional[int] = None,
    ) -> CacheConfig:
        """The CacheConfig of this model for ``context`` positions.

        Sliding layers become Ring(window, sinks), full layers Flat(), chunked
        layers Chunked(chunk), KV-shared layers Shared(source), recurrent
        layers State(state_slots) (default: default_state_slots(max_step)), and
        empty layers (EmptyLayer) a never-written Flat() placeholder of one head
        of one element that keeps the layer indices aligned, as kvcore's
        transformers cache builds it (the memory planner counts it 0 bytes).
        ``all_flat`` makes every sliding and chunked layer Flat (the baseline that
        ignores windows and chunks); shared, state and empty layers stay as they are.
        InvalidArgumentError names a bad argument.
        """
        check_int("context", context, minimum=1)
        if context > MAX_CONTEXT:
            raise InvalidArgumentError(
                f"context = {context}: must be <= {MAX_CONTEXT} (kvcore positions are 32-bit signed ints)"
            )
        if max_step is not None:
            check_int("max_step", max_step, minimum=1)
            if max_step > context:
                raise InvalidArgumentError(
                    f"max_step = {max_step}: must be <= context = {context} "
                    "(one step cannot hold more tokens than the cache)"
                )
        check_int("sinks", sinks, minimum=0)
        if state_slots is not None:
            check_int("state_slots", state_slots, minimum=1)
        if state_slots is None and self.has_state:
            state_slots = default_state_slots(max_step if max_step is not None else min(512, context))
        return CacheConfig(context, [self._layer_config(i, sinks, all_flat, state_slots) for i in range(self.n_layers)],
                           max_step=max_step)

    def _layer_config(self, layer: int, sinks: int, all_flat: bool, state_slots: Optional[int]) -> LayerConfig:
        """Layer ``layer``'s LayerConfig: its kind planned by ``kvcore.hf_config.policies.layer_config``."""
        other = self.special[layer] if self.special else None
        return layer_config(
            self.layer_kind(layer), self.n_kv_heads, self.head_dim, self.v_head_dim, window=self.windows[layer],
            chunk=other.chunk if isinstance(other, ChunkedLayer) else None,
            source=other.source if isinstance(other, SharedLayer) else None,
            sinks=sinks, all_flat=all_flat, state_slots=state_slots or 1,
        )  # fmt: skip


__all__ = ["MAX_CONTEXT", "ChunkedLayer", "EmptyLayer", "ModelShape", "SharedLayer", "SpecialLayer", "StateShape"]
