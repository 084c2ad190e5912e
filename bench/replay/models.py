"""The model shapes the replay runs (Layer, Model, make_model) and the block size vLLM runs a
hybrid model at (vllm_block_size).

Models (bfloat16 K/V): `llama` 32 full-attention layers x 8 KV heads x 128; `gemma3` 62 layers,
every sixth full (10) and 52 sliding (W = 1,024), 16 KV heads x 128; `qwen3next` 48 layers,
every fourth full (12: 2 KV heads x 256), 36 gated-DeltaNet layers with a (8192 x 3) conv
state and a 32 x 128 x 128 recurrent state (1.05 MiB a layer, 37.7 MiB a sequence). kvcore
builds one LayerConfig per layer (Flat, Ring(1024), State(1)); vLLM gets FullAttentionSpec /
SlidingWindowSpec / MambaSpec(mamba_cache_mode="align", the GDN backend) layers grouped by its
own `_get_kv_cache_groups_uniform_page_size`; on the hybrid its block size is what vLLM's
`Platform._align_hybrid_block_size` makes of the requested one (kernel alignment 16, the
attention page at least the state page: 544 tokens for 16, 1,024 for 512).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

BF16 = 2


@dataclass(frozen=True)
class Layer:
    """One layer: kind 'full', 'sliding' (window tokens) or 'state' (recurrent state shapes)."""

    kind: str
    kv_heads: int = 0
    head_dim: int = 0
    window: int = 0
    state_shapes: tuple[tuple[int, ...], ...] = ()

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V bytes of one token in this layer (bfloat16); 0 for a state layer."""
        return 2 * self.kv_heads * self.head_dim * BF16 if self.kind != "state" else 0

    @property
    def state_bytes(self) -> int:
        """Bytes of one sequence's state in this layer (bfloat16); 0 for an attention layer."""
        return sum(math.prod(s) for s in self.state_shapes) * BF16


@dataclass(frozen=True)
class Model:
    """A model's layers in order."""

    name: str
    layers: tuple[Layer, ...]

    def bytes_per_token(self, kind: str) -> int:
        """K/V bytes one token takes in all layers of `kind`."""
        return sum(lay.kv_bytes_per_token for lay in self.layers if lay.kind == kind)

    def without(self, kind: str) -> Model:
        """The model less its layers of `kind` (for byte counts)."""
        return Model(self.name, tuple(lay for lay in self.layers if lay.kind != kind))

    @property
    def state_bytes(self) -> int:
        """Bytes of one sequence's state over all state layers."""
        return sum(lay.state_bytes for lay in self.layers)

    @property
    def window(self) -> int:
        """The sliding window (tokens), 0 without sliding layers."""
        return max((lay.window for lay in self.layers if lay.kind == "sliding"), default=0)

    @property
    def has_state(self) -> bool:
        """True when the model has recurrent-state layers."""
        return any(lay.kind == "state" for lay in self.layers)


def make_model(name: str) -> Model:
    """'llama', 'gemma3' or 'qwen3next' (shapes in the module docstring). ValueError otherwise."""
    if name == "llama":
        return Model(name, tuple(Layer("full", 8, 128) for _ in range(32)))
    if name == "gemma3":
        return Model(name, tuple(Layer("full", 16, 128) if (i + 1) % 6 == 0
                                 else Layer("sliding", 16, 128, window=1024) for i in range(62)))
    if name == "qwen3next":
        gdn = Layer("state", state_shapes=((8192, 3), (32, 128, 128)))
        return Model(name, tuple(Layer("full", 2, 256) if (i + 1) % 4 == 0 else gdn for i in range(48)))
    raise ValueError(f"model {name!r}: expected llama, gemma3 or qwen3next")


def vllm_block_size(model: Model, block: int) -> int:
    """The block size vLLM runs `model` at when `block` is asked for: `block` itself, or on a
    hybrid model vLLM's Platform._align_hybrid_block_size rule (kernel alignment max(16, block);
    the smallest multiple of it whose attention page holds the state page)."""
    if not model.has_state:
        return block
    per_layer_state = max(lay.state_bytes for lay in model.layers if lay.kind == "state")
    attn_1 = max(lay.kv_bytes_per_token for lay in model.layers if lay.kind == "full")
    align = max(16, block)
    return align * -(-per_layer_state // (align * attn_1))
