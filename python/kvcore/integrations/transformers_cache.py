"""``KVCoreCache``: a transformers ``Cache`` whose layers are planned by kvcore.

The class and its cache protocol: construction from a model config, the facts of its
layers (``rows``, ``nbytes``...), ``update`` (a layer's K/V), the length and its changes
(``get_seq_length``, ``crop``, ``rewind``, ``reset``). Its other parts are its base
classes, one concept each: the step of one forward (``kvcore.integrations.transformers_steps``),
draft trees and verify steps (``kvcore.integrations.transformers_trees``), the
recurrent-state layers' calls (``kvcore.integrations.transformers_state_calls``) and masks
(``kvcore.integrations.transformers_masks``); its layer classes are
``kvcore.integrations.transformers_layers``. How a forward maps onto kvcore:
``kvcore.integrations.transformers``' docstring. Import it from there.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from transformers import cache_utils

from kvcore._core import LayerPolicy, SequenceCache
from kvcore._errors import InvalidArgumentError, InvalidStateError, NotSupportedError
from kvcore.forward_step import ForwardStep
from kvcore.integrations.transformers_config import DUMMY, STATE_TYPES, cache_config_for, hybrid_state_layers
from kvcore.integrations.transformers_layers import KVCoreEmptyLayer, KVCoreLayer, KVCoreSharedLayer, KVCoreStateLayer
from kvcore.integrations.transformers_masks import Masks
from kvcore.integrations.transformers_state_calls import StateCalls
from kvcore.quantized import kv_format
from kvcore.torch.pool import TorchKVPool
from kvcore.torch.quantized import TorchQuantizedKVPool
from kvcore.torch.state_slots import TorchStateSlots


class KVCoreCache(StateCalls, Masks, cache_utils.Cache):  # type: ignore[misc]
    """A transformers Cache whose layers are planned by kvcore (see the module docstring).

    ``config``: the model's config (``model.config``). ``max_step``: the most tokens
    one forward may carry (kvcore's default: min(512, capacity)). ``capacity``: the
    longest sequence (default: ``max_position_embeddings``). ``sinks``: attention
    sinks of every sliding layer. ``initial_capacity``: rows a full-attention
    layer allocates before it grows by doubling. ``mirror_rings``: sliding layers
    without sinks keep a copy of their first ring rows after the last, so a window
    that wraps is returned as a view instead of a gathered copy (faster; ``R - 1``
    more rows per such layer, see docs/transformers.md). Sliding layers with sinks
    are never mirrored: their read is two spans, gathered either way. ``kv_dtype``:
    None stores K/V in the model's dtype; "int8" (ExecuTorch's asymmetric rule) or "fp8"
    (e4m3fn) stores each row quantized with per-head float32 scales
    (``kvcore.torch.quantized``, docs/quantized.md) and returns them dequantized in the
    model's dtype; raises InvalidArgumentError naming any other value. ``state_slots``: the
    state snapshots ``D`` each recurrent-state layer (``linear_attention``, ``conv``) keeps
    per sequence (default ``min(max_step, 8) + 1``): a plain forward keeps only its last
    state, a verify step (``begin_verify``) of ``T <= D - 1`` tokens the state after each
    token, so ``crop`` is exact wherever ``can_rewind`` allows it (docs/transformers.md).

    Chunked layers (Llama 4) are rings of ``chunk + max_step - 1`` rows; KV-shared layers
    (Gemma 3n) are ``KVCoreSharedLayer``s holding nothing, and ``writing_layers`` lists the
    layers a forward updates, in order (all the others). Raises NotSupportedError for layer
    kinds it does not serve (``cache_config_for``).

    Attributes: ``sequence`` (the ``kvcore.SequenceCache``), ``pool`` (the attention layers'
    K/V, ``kvcore.torch.TorchKVPool``), ``state`` (the state layers' slots,
    ``kvcore.torch.TorchStateSlots``), ``kv_layers`` / ``shared_layers`` / ``state_layers``
    (the layers of each kind, in order; ``layers`` has them all).
    """

    def __init__(
        self,
        config: Any,
        *,
        max_step: Optional[int] = None,
        capacity: Optional[int] = None,
        sinks: int = 0,
        initial_capacity: int = 512,
        mirror_rings: bool = True,
        kv_dtype: Optional[str] = None,
        state_slots: Optional[int] = None,
    ) -> None:
        if kv_dtype is not None:
            kv_format(kv_dtype)  # an unknown name is refused before anything is built
        cache_config, layer_types = cache_config_for(
            config, max_step=max_step, capacity=capacity, sinks=sinks, initial_capacity=initial_capacity,
            state_slots=state_slots,
        )  # fmt: skip
        self.sequence = SequenceCache(cache_config)
        # Position order: transformers' own mask functions index keys by position.
        self.kv_dtype = kv_dtype
        self.pool = (
            TorchKVPool(self.sequence, mirror_rings=mirror_rings, order="positions")
            if kv_dtype is None
            else TorchQuantizedKVPool(self.sequence, kv_dtype, mirror_rings=mirror_rings, order="positions")
        )
        # The recurrent states of the State layers, D slots each (kvcore.torch.state_slots).
        self.state = TorchStateSlots(self.sequence)
        self.layer_types = layer_types
        n = len(layer_types)
        policies = [self.sequence.layer_policy(i) for i in range(n)]
        # The layers a forward updates (K/V or states), in order: all but the KV-shared ones
        # (which the model never updates: it hands them their source's K/V).
        # (and the placeholders of layers without attention or state, which the model never calls).
        # A hybrid layer (Falcon-H1) is two kvcore layers: its attention at its index, its state after
        # the model's layers (hybrid_state_layers); the model runs the mixer first, then attention.
        self._state_of = hybrid_state_layers(config)
        self._model_layer_of = {s: i for i, s in self._state_of.items()}
        model_layers = n - len(self._state_of)
        self.writing_layers = [
            j for i in range(model_layers) if self.sequence.row_layer(i) == i and layer_types[i] != DUMMY
            for j in ([self._state_of[i], i] if i in self._state_of else [i])
        ]  # fmt: skip
        # Layers whose returned K/V a shared layer uses later in the forward: kept alive (see update).
        self._sources = frozenset(self.sequence.row_layer(i) for i in range(n) if self.sequence.row_layer(i) != i)
        # (Typed Any: transformers types Cache.layers as a union of its own layer kinds.)
        layers: list[Any] = [
            KVCoreStateLayer(self, i, p) if kind in STATE_TYPES
            else KVCoreEmptyLayer(self, i) if kind == DUMMY
            else KVCoreLayer(self, i, p) if i in self.writing_layers
            else KVCoreSharedLayer(self, i, p)
            for i, (kind, p) in enumerate(zip(layer_types, policies))
        ]  # fmt: skip
        # Typed aliases of Cache.layers (transformers types it as a union of layer kinds).
        self.kv_layers = [layer for layer in layers if isinstance(layer, KVCoreLayer)]
        self.shared_layers = [layer for layer in layers if isinstance(layer, KVCoreSharedLayer)]
        self.state_layers = [layer for layer in layers if isinstance(layer, KVCoreStateLayer)]
        self._state_layer_set = frozenset(layer.layer_idx for layer in self.state_layers)
        super().__init__(layers=layers)
        self._n_layers = len(self.writing_layers)
        self._chunked = [i for i, p in enumerate(policies) if p.kind == LayerPolicy.Kind.Chunked]
        self._order = {layer: k for k, layer in enumerate(self.writing_layers)}
        self._group_of = self.pool.group_of
        self._write_read = self.pool.write_read  # bound once: the per-layer path calls it 26 times a token
        # The forward under way: layer 0 begins its step, the last writing layer commits it, an
        # error while a layer is served aborts it (kvcore.forward_step).
        self._forward = ForwardStep(self._n_layers, commit_after=self._n_layers)
        self._T = 0  # the begun step's T
        self._layouts = []
        # A draft tree's step (begin_tree) between its forward and commit_tree.
        self._tree = None
        # Where the last unfinished forward stopped (a layer index), to tell a retry from
        # a model running fewer layers than the cache was built for.
        self._stopped_at = None
        # Models with layer_types take a dict of masks per type; the others one 4-D mask.
        self._masks_by_type = getattr(config.get_text_config(decoder=True), "layer_types", None) is not None
        # State layers: the layer being served, the forward's served count then, and its slots.
        self._state_call = None
        # Positions the state layers' calls cover now (state_positions), else the whole step.
        self._state_range = None
        self._state_node = None  # tree_node: the draft-tree node state calls cover
        # (length, T) of the last get_mask_sizes: the token count of a forward whose first
        # layer holds a state (a state call carries no token count).
        self._mask_hint = None
        # activate_past_recording: forwards of T <= state_slots - 1 tokens are verify steps.
        self._verify_forwards = False
        self._max_verify_T = min((layer.slots for layer in self.state_layers), default=1) - 1

    # --- kvcore facts ----------------------------------------------------------------

    @property
    def max_step(self) -> int:
        """The most tokens one forward may carry."""
        return self.sequence.max_step

    @property
    def capacity(self) -> int:
        """The longest sequence the cache holds."""
        return self.sequence.capacity

    @property
    def has_sinks(self) -> bool:
        """Whether any sliding layer keeps attention sinks (then masks come from ``attention_masks``)."""
        return any(layer.sinks > 0 for layer in self.kv_layers)

    @property
    def mirror_rings(self) -> bool:
        """Whether sliding layers without sinks keep a mirror of their first ring rows."""
        return self.pool.mirror_rings

    def rows(self, layer_idx: int) -> int:
        """Rows kvcore gives the layer: window + max_step - 1 (+ sinks) for a sliding layer, capacity for a full one."""
        return self.sequence.rows(layer_idx)

    def allocated_rows(self, layer_idx: int) -> int:
        """Rows the layer's tensors hold now, not counting a mirror (0 before its first update)."""
        pool = self.pool.layer(layer_idx)
        return 0 if pool is None else pool.allocated_rows

    def mirror_rows(self, layer_idx: int) -> int:
        """Rows a mirrored sliding layer keeps after its last row (R - 1 = window + max_step - 2; 0 with sinks)."""
        return self.pool.mirror_rows(layer_idx)

    def nbytes(self, layer_idx: Optional[int] = None) -> int:
        """Bytes held by one layer or by all: K/V tensors (mirrors included) and a recurrent-state
        layer's ``D`` state snapshots (``cache.state``); what ``kvcore memory --hf-config`` plans.
        The gather / dequantization workspace is separate (``pool.workspace_nbytes``)."""
        if layer_idx is None:
            return self.pool.nbytes() + (self.state.nbytes() if self.state_layers else 0)
        if layer_idx in self._state_layer_set:
            return self.state.nbytes(layer_idx)
        return self.pool.nbytes(layer_idx)

    # --- a layer's K/V ---------------------------------------------------------------

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the forward's new K/V of ``layer_idx`` and return its history (layer 0 begins the step,
        the last layer that holds K/V commits it).

        A KV-shared layer is refused with InvalidArgumentError naming it and its source, before
        anything changes: it holds no rows and writes nothing (transformers' Gemma 3n code never
        updates it; it uses the K/V its source's update returned). Errors otherwise: see the
        module docstring (InvalidArgumentError for K/V that do not fit, InvalidStateError for a
        layer out of order or another T), and NotSupportedError for a batch of more than one
        sequence on a model with chunked layers (transformers shifts each row's chunks by its
        left padding; kvcore's chunks start at position 0), refused before the step begins.
        """
        order = self._order.get(layer_idx)
        if order is None:
            self._refuse_shared(layer_idx)
        if order == 0:
            # Checked before _begin: beginning a step moves kvcore's rewind floors, so bad
            # input must be refused before it. A later layer's input is checked by write_read
            # before it writes; an error there aborts the step (the forward changed nothing).
            T = self.pool.check_input(layer_idx, key_states, value_states, position=self.sequence.length)
            if self._chunked and key_states.shape[0] > 1:
                raise NotSupportedError(
                    f"a batch of {key_states.shape[0]} sequences on chunked layers (layer {self._chunked[0]}): "
                    f"transformers starts each row's chunks after its left padding, kvcore's at position 0; "
                    f"give each sequence its own KVCoreCache"
                )
            self._check_previous_forward(T)
            self._begin(T)
        else:
            T = int(key_states.shape[-2])
        forward = self._forward
        if order != forward.served or forward.step is None:
            raise InvalidStateError(
                f"update of layer {layer_idx}: a forward updates {self._updated_layers()} in order, "
                f"and layer {self.writing_layers[forward.served]} is next"
            )
        if T != self._T:
            raise InvalidStateError(
                f"update of layer {layer_idx} with T = {T} tokens, but this forward's step has T = {self._T}"
            )
        layout = self._layouts[self._group_of[layer_idx]]
        out = forward.serve(layer_idx, self._write_read, layer_idx, layout, key_states, value_states)
        if forward.step is None:  # the last layer committed the step
            self._stopped_at = None
        if layer_idx in self._sources and (layout.view is None or self.kv_dtype is not None):
            # A shared layer attends over these later in the forward, after other layers' updates
            # reused the workspace they were gathered (or dequantized) into: keep a copy.
            out = (out[0].clone(), out[1].clone())
        return out

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """The cache's length (every layer has it, state layers included)."""
        return self.sequence.length

    # --- length changes ----------------------------------------------------------------

    def rewind(self, length: int) -> None:
        """Set the length to ``length`` (kvcore's rewind: refused with InvalidStateError into evicted history)."""
        self.sequence.rewind(length)
        self._forward.end()  # rewind ended the begun step
        self._tree = None
        self._state_call = None
        self._stopped_at = None

    def can_rewind(self, length: int) -> bool:
        """Whether ``rewind(length)`` is allowed (kvcore's ``can_rewind``)."""
        return self.sequence.can_rewind(length)

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last ``-tokens_to_remove`` tokens (transformers' convention: a count <= 0)."""
        if tokens_to_remove > 0:
            raise InvalidArgumentError(
                f"crop({tokens_to_remove}): pass minus the number of tokens to remove (a count <= 0)"
            )
        if tokens_to_remove < 0:
            self.rewind(self.sequence.length + tokens_to_remove)

    def reset(self) -> None:
        """Length 0 (and forwards are plain steps again: ``activate_past_recording``); the tensors stay
        allocated for the next sequence."""
        self.sequence.clear()
        self._verify_forwards = False
        self._forward.end()  # clear ended the begun step
        self._tree = None
        self._state_call = None
        self._stopped_at = None


__all__ = ["KVCoreCache"]
