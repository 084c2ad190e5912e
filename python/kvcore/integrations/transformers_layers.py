"""The layers of a ``KVCoreCache``: what transformers' model code calls per layer.

``KVCoreCache.layers`` holds one per model layer: ``KVCoreLayer`` (full, sliding or
chunked attention: its K/V rows live in the cache's pool), ``KVCoreSharedLayer``
(a KV-shared layer, Gemma 3n's last ones: it holds nothing) and ``KVCoreStateLayer``
(a recurrent-state layer: its states live in the cache's state slots). A layer keeps
no state of its own: its length is the cache's, and each call goes to its owning
cache, which these classes see as a ``LayerOwner`` (the calls they make into it), so
this module does not import the cache's. All three are importable from
``kvcore.integrations.transformers``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable, Optional, Protocol

import torch
from transformers import cache_utils

from kvcore._core import LayerPolicy, SequenceCache
from kvcore._errors import InternalError, InvalidArgumentError, NotSupportedError
from kvcore.integrations.transformers_versions import check_transformers
from kvcore.torch.layer import LayerPool
from kvcore.torch.pool import TorchKVPool
from kvcore.torch.state_slots import TorchStateSlots

check_transformers()  # before subclassing: a release without the classes below is refused by name


class LayerOwner(Protocol):
    """The cache a layer belongs to, as its layer classes call it (``KVCoreCache`` is one)."""

    _mask_hint: Optional[tuple[int, int]]  # (length, T) of the last get_mask_sizes

    @property
    def sequence(self) -> SequenceCache:
        """The one ``kvcore.SequenceCache`` of every layer."""

    @property
    def pool(self) -> TorchKVPool:
        """The attention layers' K/V."""

    @property
    def state(self) -> TorchStateSlots:
        """The recurrent-state layers' slots."""

    @property
    def layers(self) -> Sequence[Any]:
        """Every layer, in order."""

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write a forward's K/V of ``layer_idx``; return its history."""

    def update_conv_state(
        self, conv_states: torch.Tensor, layer_idx: int, state_idx: int = 0, **kwargs: Any
    ) -> torch.Tensor:
        """Store a state layer's conv windows."""

    def update_recurrent_state(
        self, recurrent_states: torch.Tensor, layer_idx: int, state_idx: int = 0, **kwargs: Any
    ) -> torch.Tensor:
        """Store a state layer's recurrent state."""

    def reset(self) -> None:
        """Length 0 for every layer."""

    def _check_forward_size(self, T: int) -> None: ...

    def _first_position(self) -> int: ...


def _read_from_pool(name: str, get: Callable[[KVCoreLayer], Any], reset: Any = None) -> property:
    """A KVCoreLayer attribute read from the pool; assigning it anything but ``reset`` raises."""

    def refuse(self: KVCoreLayer, value: Any) -> None:
        # CacheLayerMixin.__init__ assigns the reset value; anything else (offloading) is not supported.
        if value is not reset:
            raise NotSupportedError(
                f"layer {self.layer_idx}: {name} is read from the kvcore pool and cannot be assigned "
                f"(offloading is not supported)"
            )

    return property(get, refuse)


class KVCoreLayer(cache_utils.CacheLayerMixin):  # type: ignore[misc]  # transformers is Any to mypy
    """One layer of a KVCoreCache. Its rows live in the cache's pool; its length is the cache's.

    ``keys``/``values`` are the pool tensors in row order (not position order; a
    mirrored ring's copy of its first ring rows follows its last row); the history
    in position order is what ``update`` returns.
    """

    is_compileable = False
    is_croppable = True  # within kvcore's rewind rule: n >= Lmax - max_step once a window wrapped

    def __init__(self, owner: LayerOwner, layer_idx: int, policy: LayerPolicy) -> None:
        self._owner = owner
        self.layer_idx = layer_idx
        super().__init__()
        self.policy = policy
        # A chunked layer is "sliding" to transformers (DynamicCache keeps it in a sliding layer
        # of the chunk's size): its chunked mask is sized from the first such layer.
        chunked = policy.kind == LayerPolicy.Kind.Chunked
        self.is_sliding = policy.is_ring or chunked
        self.sliding_window: Optional[int] = policy.window if self.is_sliding else None
        self.sinks = policy.sinks

    # The pool owns the tensors; these read them, so nothing is copied per step.
    def _pool_layer(self) -> Optional[LayerPool]:
        return self._owner.pool.layer(self.layer_idx)

    def _allocated(self, name: str) -> LayerPool:
        pool = self._pool_layer()
        if pool is None:
            raise AttributeError(f"{name}: the layer is not allocated yet")
        return pool

    keys = _read_from_pool("keys", lambda self: None if (p := self._pool_layer()) is None else p.keys)
    values = _read_from_pool("values", lambda self: None if (p := self._pool_layer()) is None else p.values)
    is_initialized = _read_from_pool("is_initialized", lambda self: self._pool_layer() is not None, reset=False)

    @property
    def device(self) -> torch.device:
        return self._allocated("device").device

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self._owner.pool.allocate(
            self.layer_idx,
            batch_size=int(key_states.shape[0]),
            dtype=key_states.dtype,
            device=key_states.device,
        )

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self._owner.update(key_states, value_states, self.layer_idx)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        if self.sinks > 0:
            raise NotSupportedError(
                f"layer {self.layer_idx} keeps {self.sinks} attention sinks, which transformers' masks cannot "
                f"express: pass attention_mask=cache.attention_masks(model.config, {query_length}) (or use "
                f"kvcore.integrations.transformers.prefill), not generate()"
            )
        # A query, not the step: preview plans the forward's step without beginning it.
        self._owner._check_forward_size(query_length)
        self._owner._mask_hint = (self._owner.sequence.length, query_length)
        plan = self._owner.sequence.preview(self.layer_idx, query_length)
        start, last = plan.read[0].pos, plan.read[-1]
        stop = last.pos + last.len
        if plan.read_len != stop - start:  # not an assert: it must hold under -O too
            raise InternalError(f"layer {self.layer_idx}: a read without sinks is {plan.read}, not one range")
        return stop - start, start

    def get_seq_length(self) -> int:
        return self._owner.sequence.length

    def get_max_length(self) -> int:
        return self._owner.sequence.capacity

    @property
    def batch_size(self) -> int:
        return self._allocated("batch_size").batch_size

    def crop(self, tokens_to_remove: int) -> None:
        raise NotSupportedError(
            f"crop on layer {self.layer_idx} alone: kvcore keeps one length for every layer; crop the KVCoreCache"
        )

    def reset(self) -> None:
        self._owner.reset()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._owner.pool.map_batch(self.layer_idx, lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._owner.pool.map_batch(self.layer_idx, lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._owner.pool.map_batch(self.layer_idx, lambda t: t[indices.to(t.device)])

    def __repr__(self) -> str:
        return f"KVCoreLayer({self.layer_idx}, {self.policy!r})"


class KVCoreSharedLayer(cache_utils.DummyLayer):  # type: ignore[misc]
    """A KV-shared layer of a KVCoreCache (``kvcore.Shared(source)``; Gemma 3n's last layers).

    It holds no rows and is never updated: transformers' model code hands it the K/V its
    source layer's update returned in the same forward, exactly as with ``DynamicCache``,
    whose layer there is transformers' ``DummyLayer`` (this is one: ``keys``/``values`` are
    None). ``update`` raises InvalidArgumentError naming the layer and its source;
    ``get_mask_sizes`` is its source's (it reads the source's keys).
    """

    sinks = 0
    is_sliding = False  # as DynamicCache's DummyLayer: masks are sized from layers that hold K/V

    def __init__(self, owner: LayerOwner, layer_idx: int, policy: LayerPolicy) -> None:
        super().__init__()
        self._owner = owner
        self.layer_idx = layer_idx
        self.policy = policy
        self.source = int(policy.source)

    def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> Any:
        """Refused (InvalidArgumentError): a shared layer writes nothing (see ``KVCoreCache.update``)."""
        return self._owner.update(key_states, value_states, self.layer_idx)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """``(kv_length, kv_offset)`` of the keys it reads: its source layer's."""
        source = self._owner.layers[self.source]
        if not isinstance(source, KVCoreLayer):  # not an assert: it must hold under -O too
            raise InternalError(f"layer {self.layer_idx}: its source layer {self.source} holds no K/V")
        return source.get_mask_sizes(query_length)

    def get_seq_length(self) -> int:
        """The cache's one length."""
        return self._owner.sequence.length

    def __repr__(self) -> str:
        return f"KVCoreSharedLayer({self.layer_idx}, source={self.source})"


class KVCoreEmptyLayer(cache_utils.DummyLayer):  # type: ignore[misc]
    """A layer of a KVCoreCache without attention or state (an MLP or MoE layer: transformers'
    "dummy" cache layer, Nemotron-H's "-" layers). The model never calls the cache for it; it
    holds nothing (kvcore keeps a never-written ``Flat()`` placeholder at its index). ``update``
    raises InvalidArgumentError naming the layer."""

    sinks = 0
    is_sliding = False

    def __init__(self, owner: LayerOwner, layer_idx: int) -> None:
        super().__init__()
        self._owner = owner
        self.layer_idx = layer_idx

    def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> Any:
        """Refused (InvalidArgumentError): the layer has no attention."""
        raise InvalidArgumentError(
            f"update of layer {self.layer_idx}: the model's config gives it no attention and no state "
            f"(transformers' 'dummy' layer); nothing is cached for it"
        )

    def get_seq_length(self) -> int:
        """The cache's one length."""
        return self._owner.sequence.length

    def __repr__(self) -> str:
        return f"KVCoreEmptyLayer({self.layer_idx})"


class KVCoreStateLayer(cache_utils.LinearAttentionCacheLayerMixin):  # type: ignore[misc]
    """One recurrent-state layer of a KVCoreCache (transformers' linear-attention layer API).

    Its states (``"conv"``, ``"recurrent"``; ``"conv1"``... for ``state_idx > 0``) live in
    the cache's ``TorchStateSlots`` (``cache.state``), ``D`` slots each: the model's calls
    ``get_conv_state`` / ``update_conv_state`` / ``get_recurrent_state`` /
    ``update_recurrent_state`` go through the cache, which reads the state after the
    forward's first position minus one and writes the states the step's plan keeps
    (docs/transformers.md, "Hybrid models"). Its length is the cache's.
    """

    is_compileable = False
    is_croppable = True  # kvcore's rewind rule: to n when the state after n - 1 is held
    supports_early_init = False
    record_past = False  # kvcore keeps what its rewinds need; the model's in-place decode kernels stay on

    def __init__(self, owner: LayerOwner, layer_idx: int, policy: LayerPolicy) -> None:
        # The mixin's own dicts are not used: the states live in the cache's slots.
        self._owner = owner
        self.layer_idx = layer_idx
        self.policy = policy
        self.slots = policy.slots
        self.is_sliding = False

    @property  # the mixin's attribute, computed here (a read-only property over it)
    def has_previous_state(self) -> dict[int, bool]:  # type: ignore[override, unused-ignore]
        """Per state index: whether the next forward reads a state (the length is above 0)."""
        previous = self._owner._first_position() > 0
        return {0: previous}

    @property
    def batch_size(self) -> int:
        """Sequences in the stored states (AttributeError before the first write)."""
        size = self._owner.state.batch_size
        if size is None:
            raise AttributeError("batch_size: no state is stored yet")
        return size

    def lazy_initialization(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to do: each state is allocated by its first write (``TorchStateSlots``)."""

    def update_conv_state(self, conv_states: torch.Tensor, state_idx: int = 0, **kwargs: Any) -> torch.Tensor:
        """``KVCoreCache.update_conv_state`` for this layer."""
        return self._owner.update_conv_state(conv_states, self.layer_idx, state_idx, **kwargs)

    def update_recurrent_state(self, recurrent_states: torch.Tensor, state_idx: int = 0, **kwargs: Any) -> torch.Tensor:
        """``KVCoreCache.update_recurrent_state`` for this layer."""
        return self._owner.update_recurrent_state(recurrent_states, self.layer_idx, state_idx, **kwargs)

    def get_seq_length(self) -> int:
        """The cache's length in tokens."""
        return self._owner.sequence.length

    def get_max_length(self) -> int:
        """-1: a state layer has no sequence dimension (transformers' convention)."""
        return -1

    def activate_past_recording(self) -> None:
        """Nothing to do: kvcore's slots keep what a rewind needs (see ``KVCoreCache.can_rewind``)."""

    def crop(self, tokens_to_remove: int) -> None:
        """NotSupportedError: kvcore keeps one length for every layer (crop the KVCoreCache)."""
        raise NotSupportedError(
            f"crop on layer {self.layer_idx} alone: kvcore keeps one length for every layer; crop the KVCoreCache"
        )

    def reset(self) -> None:
        """Reset the whole cache (one length for every layer)."""
        self._owner.reset()

    def offload(self) -> None:
        """NotSupportedError: the states stay where the cache keeps them."""
        raise NotSupportedError(f"layer {self.layer_idx}: offloading is not supported")

    prefetch = offload

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Reorder the batch of every state slot (beam search)."""
        self._owner.state.map_batch(self.layer_idx, lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat each sequence's states ``repeats`` times along the batch."""
        self._owner.state.map_batch(self.layer_idx, lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the sequences ``indices`` of the batch."""
        self._owner.state.map_batch(self.layer_idx, lambda t: t[indices.to(t.device)])

    def __repr__(self) -> str:
        return f"KVCoreStateLayer({self.layer_idx}, {self.policy!r})"


__all__ = ["KVCoreLayer", "KVCoreSharedLayer", "KVCoreStateLayer", "LayerOwner"]
