"""transformers' linear-attention cache API over kvcore's State slots: ``StateCalls``.

Recurrent-state layers (hybrids) implement transformers' linear-attention cache API
(``get_conv_state`` / ``update_conv_state`` / ``get_recurrent_state`` /
``update_recurrent_state`` / ``has_previous_state``) over kvcore's State slots
(``kvcore.torch.state_slots``): ``state_slots`` snapshots per layer, ``slot(p) = p % D``.
A forward reads the state after its first position minus one and keeps its last state (a
plain step) or the state after each of its tokens (a verify step: ``begin_verify``, or
every forward of ``T <= D - 1`` tokens after ``activate_past_recording``), so ``crop`` is
exact wherever ``can_rewind`` allows. A state call carries no token count: a forward whose
layer 0 holds a state takes its ``T`` from the forward's ``get_mask_sizes`` (transformers'
mask functions call it first) or from a begun step. A layer's first state call of a
forward serves it; when the model's last layer holds a state, the forward commits at that
call, and an error in its later calls rewinds the cache to where the forward began.
``state_positions`` and ``tree_node`` narrow the calls to some positions of a verify step
or one node of a draft tree (a mixer run token by token:
``kvcore.integrations.transformers_mixers``). How the model's conv and recurrent tensors
become slot states is ``kvcore.integrations.transformers_state``.

``StateCalls`` is a base class of ``KVCoreCache`` (``kvcore.integrations.transformers_cache``);
it is not used alone.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, TypeVar

import torch

from kvcore._errors import InternalError, InvalidArgumentError, InvalidStateError
from kvcore.integrations.transformers_layers import KVCoreStateLayer
from kvcore.integrations.transformers_state import read_state, state_name, write_conv_states, write_recurrent_state
from kvcore.integrations.transformers_steps import TreeStep
from kvcore.integrations.transformers_trees import DraftTrees
from kvcore.torch.state_slots import SlotSpan

_R = TypeVar("_R")


class StateCalls(DraftTrees):
    """The recurrent-state layers' calls of ``KVCoreCache`` (see the module docstring)."""

    # Set by KVCoreCache.__init__ (kvcore.integrations.transformers_cache).
    # A hybrid layer (Falcon-H1) is two kvcore layers: its attention at its index, its state after
    # the model's layers; _state_of maps the model's layer to that State layer, _model_layer_of back.
    _state_of: dict[int, int]
    _model_layer_of: dict[int, int]
    # Positions the state layers' calls cover now (state_positions), else the whole step.
    _state_range: Optional[tuple[int, int]]
    _state_node: Optional[int]  # tree_node: the draft-tree node state calls cover

    def model_layer(self, layer: int) -> int:
        """The model's layer index a kvcore layer serves: itself, except the State layer appended for a
        hybrid layer's recurrent part (Falcon-H1), which serves that layer."""
        return self._model_layer_of.get(layer, layer)

    def has_previous_state(self, layer_idx: Optional[int] = None, state_idx: Optional[int] = None) -> bool:
        """Whether the forward under way (else the next one) reads a state: its first position is above 0."""
        if layer_idx is not None:
            self._state_layer(self._state_of.get(layer_idx, layer_idx))
        return self._first_position() > 0

    def activate_past_recording(self) -> None:
        """From now on (until ``reset``), a forward of ``T <= state_slots - 1`` tokens is a verify step,
        so ``crop`` can rewind into it: transformers calls this before assisted generation and prompt
        lookup. State layers then keep the state after each token of such forwards; gated DeltaNet
        and Mamba layers need ``state_layers_token_by_token``
        (``kvcore.integrations.transformers_speculative``), or their forward raises
        NotSupportedError. A cache without state layers changes nothing (its rewinds need no slots)."""
        self._verify_forwards = True

    def is_recording_past(self, layer_idx: int) -> bool:
        """False: kvcore's slots keep what a rewind needs, so the model's in-place decode kernels stay on."""
        return False

    def get_conv_state(self, layer_idx: int, state_idx: int = 0) -> Optional[torch.Tensor]:
        """The conv state the forward's tokens read in ``layer_idx`` (None at position 0, as DynamicCache).

        It is the slot that will hold the state after the call's last token, filled with the
        state after the one before its first: a kernel that updates it in place (transformers'
        single-token decode) leaves the new state where the step's plan keeps it. The layer's
        first call of a forward serves it (layer 0's begins the forward's step: the token count
        comes from the forward's ``get_mask_sizes``, a begun ``begin_verify`` step or
        ``attention_masks``). InvalidStateError: out of layer order, no token count known, or no
        state stored for a position above 0.
        """
        return self._state_guard(self._get_state, layer_idx, state_name("conv", state_idx), False)

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0) -> Optional[torch.Tensor]:
        """The recurrent state the forward's tokens read in ``layer_idx``: as ``get_conv_state``.
        NotSupportedError (the step is aborted) in a verify step whose call covers more than one
        token: transformers' layer computes only the last recurrent state, and a verify step keeps
        each one (run the layer token by token: ``kvcore.integrations.transformers_speculative``)."""
        return self._state_guard(self._get_state, layer_idx, state_name("recurrent", state_idx), True)

    def update_conv_state(
        self, conv_states: torch.Tensor, layer_idx: int, state_idx: int = 0, **kwargs: Any
    ) -> torch.Tensor:
        """Store the conv windows after each kept position of the call; return the inputs the causal
        conv needs: the state the call read (``kernel`` columns, zeros at position 0) followed by
        ``conv_states`` (``[batch, channels, T]``, one column per token of the call). The state after
        position ``q`` is the last ``conv_kernel_size`` columns up to ``q``, so a verify step keeps
        every position's exactly. InvalidArgumentError: not one column per token of the call, or a
        shape other than the stored one (the forward is aborted).
        """
        return self._state_guard(self._update_conv, layer_idx, state_idx, conv_states,
                                 kwargs.get("conv_kernel_size"))  # fmt: skip

    def update_recurrent_state(
        self, recurrent_states: torch.Tensor, layer_idx: int, state_idx: int = 0, **kwargs: Any
    ) -> torch.Tensor:
        """Store the recurrent state after the call's last token (``[batch, *shape]``) in the slot
        the step keeps it in; return that slot. NotSupportedError in a verify step whose call covers
        more than one token (see ``get_recurrent_state``); InvalidArgumentError: a shape, dtype or
        device other than the stored one. Either aborts the forward."""
        return self._state_guard(self._update_recurrent, layer_idx, state_idx, recurrent_states)

    def state_positions(self, first: int, count: int) -> StatePositions:
        """A context in which the state layers' calls cover positions ``[first, first + count)`` of
        the begun verify step instead of all of it: a layer run token by token (one call per
        token) reads the state its previous call left and keeps each one.
        ``kvcore.integrations.transformers_speculative`` uses it. InvalidStateError: no verify
        step is begun; InvalidArgumentError: positions outside it."""
        step = self._verify_step()
        if step is None:
            raise InvalidStateError("state_positions: no verify step is begun (begin_verify)")
        if count < 1 or not step.position <= first or first + count > step.position + step.T:
            raise InvalidArgumentError(
                f"state_positions({first}, {count}): the verify step covers [{step.position}, "
                f"{step.position + step.T})"
            )
        return StatePositions(self, (first, count), None)

    def tree_node(self, node: int) -> StatePositions:
        """A context in which the state layers' calls cover node ``node`` alone of the begun draft
        tree (``begin_tree``): the call reads the state after the node's parent (the root: after the
        last committed token) and keeps the state after the node in its own slot, so a layer run
        node by node (one call per node) gives every node its root path's state.
        ``kvcore.integrations.transformers_speculative`` uses it. InvalidStateError: no draft tree is
        begun; InvalidArgumentError: a node outside it."""
        tree = self._tree
        if tree is None or not tree.is_current or not tree.step.is_tree:
            raise InvalidStateError("tree_node: no draft tree is begun (begin_tree)")
        if not 0 <= node < tree.T:
            raise InvalidArgumentError(f"tree_node({node}): the draft tree has nodes [0, {tree.T})")
        return StatePositions(self, None, node)

    def _first_position(self) -> int:
        step = self._forward.step
        return int(step.position) if step is not None and step.is_current else self.sequence.length

    def _state_layer(self, layer_idx: int) -> KVCoreStateLayer:
        layer = self.layers[layer_idx] if 0 <= layer_idx < len(self.layers) else None
        if not isinstance(layer, KVCoreStateLayer):
            raise InvalidArgumentError(
                f"layer {layer_idx}: not a recurrent-state layer of this cache (its state layers: "
                f"{[s.layer_idx for s in self.state_layers]})"
            )
        return layer

    def _state_guard(self, fn: Callable[..., _R], layer_idx: int, *args: Any) -> _R:
        """Run one state call of the model's layer ``layer_idx`` (a hybrid layer's: its appended State
        layer); an error ends the forward as an attention layer's does (aborted; a verify step is
        dropped, never left to ``commit_verify``; a plain step this layer already committed is
        rewound to where the forward began when kvcore can)."""
        layer_idx = self._state_of.get(layer_idx, layer_idx)
        try:
            return fn(layer_idx, *args)
        except BaseException:
            call = self._state_call
            tree = self._tree
            if self._forward.step is not None:
                self._forward.abort()
            elif tree is not None and tree.is_current:  # a verify step whose last layer failed: not committable
                tree.step.abort()
                self._tree = None
            elif call is not None and call[0] == layer_idx and call[1] == self._n_layers:
                start = call[2].first  # a plain step (only those commit at their last layer)
                if self.sequence.length > start and self.sequence.can_rewind(start):
                    self.sequence.rewind(start)
            self._state_call = None
            raise

    def _state_span(self, layer_idx: int) -> SlotSpan:
        """The slots this call of state layer ``layer_idx`` reads and keeps; its first call in a
        forward serves the layer (layer 0's begins the step)."""
        self._state_layer(layer_idx)
        forward = self._forward
        call = self._state_call
        # The same layer's next call in this forward (after the commit: only the committing call's).
        served = forward.served if forward.step is not None else self._n_layers
        if call is not None and call[0] == layer_idx and call[1] == served:
            span = call[2]
            if self._state_node is not None:
                tree = self._tree
                if tree is None:  # not reached: tree_node needs a begun tree
                    raise InternalError(f"layer {layer_idx}: node {self._state_node} outside a begun draft tree")
                node_span = self.state.node_span(layer_idx, tree.step, self._state_node)
                if node_span == span:
                    return span
                self._state_call = (layer_idx, call[1], node_span)
                return node_span
            rng = self._state_range
            if rng is None or (span.first, span.count) == rng:
                return span
            verify = self._verify_step()
            if verify is None:  # not reached: state_positions needs a begun verify step
                raise InternalError(f"layer {layer_idx}: positions {rng} outside a begun verify step")
            span = self.state.span(layer_idx, verify.plan(layer_idx), *rng)
            self._state_call = (layer_idx, call[1], span)
            return span
        if self._order.get(layer_idx) == 0:
            T = self._state_forward_T()
            self._check_previous_forward(T)
            self._begin(T)
        if self._order.get(layer_idx) != forward.served or forward.step is None:
            raise InvalidStateError(
                f"state call of layer {layer_idx}: a forward serves {self._updated_layers()} in order, "
                f"and layer {self.writing_layers[forward.served]} is next"
            )
        span = forward.serve(layer_idx, self._enter_state, layer_idx)
        self._state_call = (layer_idx, forward.served if forward.step is not None else self._n_layers, span)
        if forward.step is None:
            self._stopped_at = None
        return span

    def _enter_state(self, layer_idx: int) -> SlotSpan:
        step = self._forward.step
        if step is None:  # serve checked it
            raise InternalError(f"layer {layer_idx}: no forward under way")
        tree = step.step if isinstance(step, TreeStep) else step
        if tree.is_tree:
            if self._state_node is not None:
                return self.state.node_span(layer_idx, tree, self._state_node)
            if step.T > 1:
                raise InvalidStateError(
                    f"state call of layer {layer_idx} over a draft tree of {step.T} nodes: each node reads its "
                    f"parent's state, so the layer must run node by node (cache.tree_node(i); verify_tree and "
                    f"kvcore.integrations.transformers_speculative.state_layers_token_by_token arrange it)"
                )
        first, count = self._state_range or (int(step.position), int(step.T))
        return self.state.span(layer_idx, step.plan(layer_idx), first, count)

    def _state_forward_T(self) -> int:
        """The token count of a forward whose first call is a state layer's."""
        step = self._forward.step
        if step is not None and self._forward.served == 0 and step.is_current:
            return int(step.T)  # begun by begin_verify, begin_tree or attention_masks
        hint = self._mask_hint
        if hint is not None and hint[0] == self.sequence.length:
            return hint[1]
        raise InvalidStateError(
            "layer 0 holds a recurrent state and its calls carry no token count: begin the forward with "
            "get_mask_sizes (transformers' mask functions call it), attention_masks or begin_verify"
        )

    # What a state call does with the model's tensors (kvcore.integrations.transformers_state), once
    # _state_span served the layer: inside _state_guard, so an error ends the forward.

    def _get_state(self, layer_idx: int, name: str, recurrent: bool) -> Optional[torch.Tensor]:
        return read_state(self.state, layer_idx, self._state_span(layer_idx), name, recurrent)

    def _update_conv(
        self, layer_idx: int, state_idx: int, new: torch.Tensor, kernel: Optional[int]
    ) -> torch.Tensor:
        return write_conv_states(self.state, layer_idx, self._state_span(layer_idx), state_idx, new, kernel)

    def _update_recurrent(self, layer_idx: int, state_idx: int, state: torch.Tensor) -> torch.Tensor:
        return write_recurrent_state(self.state, layer_idx, self._state_span(layer_idx), state_idx, state)


class StatePositions:
    """``KVCoreCache.state_positions`` / ``tree_node``: sets the positions or the draft-tree node
    state calls cover, restored on exit."""

    def __init__(self, cache: StateCalls, positions: Optional[tuple[int, int]], node: Optional[int]) -> None:
        self._cache = cache
        self._scope = (positions, node)
        self._before: tuple[Optional[tuple[int, int]], Optional[int]] = (None, None)

    def __enter__(self) -> None:
        c = self._cache
        self._before = (c._state_range, c._state_node)
        c._state_range, c._state_node = self._scope

    def __exit__(self, *exc: Any) -> None:
        self._cache._state_range, self._cache._state_node = self._before


__all__ = ["StateCalls", "StatePositions"]
