"""The states transformers' linear-attention layers pass a cache, kept in kvcore's State slots.

transformers' recurrent-state layers (Qwen3-Next's gated DeltaNet, Granite 4.0-H's Mamba-2,
LFM2's short convolutions) hand their cache a conv state and a recurrent state per layer;
``KVCoreCache`` keeps each in a ``kvcore.torch.TorchStateSlots`` under a name (``"conv"``,
``"recurrent"``; ``"conv1"``... for ``state_idx > 0``) and, for one call of a layer, the
slots its ``SlotSpan`` names: the one it reads (the state after the call's first position
minus one) and the ones the step keeps. These functions turn the model's tensors into those
states and back; the cache serves each call within its forward (which slots, in which
order, what an error undoes) and calls them with the call's span.
"""

from __future__ import annotations

from typing import Optional

import torch

from kvcore._errors import InternalError, InvalidArgumentError, InvalidStateError, NotSupportedError
from kvcore.torch.state_slots import SlotSpan, TorchStateSlots


def state_name(kind: str, state_idx: int) -> str:
    """The TorchStateSlots name of transformers' conv or recurrent state ``state_idx``."""
    return kind if state_idx == 0 else f"{kind}{state_idx}"


def read_state(
    slots: TorchStateSlots, layer_idx: int, span: SlotSpan, name: str, recurrent: bool
) -> Optional[torch.Tensor]:
    """The state ``name`` the call's tokens read, in the slot that will hold the state after its last
    token (``TorchStateSlots.prepare``); None at position 0, as DynamicCache. InvalidStateError when
    no such state is stored for a position above 0; ``recurrent``: see ``check_last_state_only``."""
    if recurrent:
        check_last_state_only(span)
    if span.first == 0:
        return None  # position 0: no previous state (DynamicCache's None)
    if slots.tensor(layer_idx, name) is None:
        raise InvalidStateError(
            f"layer {layer_idx} holds no {name!r} state for position {span.first}: the forwards before "
            f"it did not run this layer"
        )
    return slots.prepare(layer_idx, name, span)


def check_last_state_only(span: SlotSpan) -> None:
    """NotSupportedError when the call keeps more than its last state: transformers' layer computes
    only its last recurrent state."""
    if len(span.keep) > 1:
        raise NotSupportedError(
            f"layer {span.layer}: a verify step of {span.count} tokens keeps the state after each, and "
            f"transformers' layer computes only its last recurrent state: run the state layers token by "
            f"token (kvcore.integrations.transformers_speculative)"
        )


def write_conv_states(
    slots: TorchStateSlots, layer_idx: int, span: SlotSpan, state_idx: int, new: torch.Tensor, kernel: Optional[int]
) -> torch.Tensor:
    """Store the conv window after each kept position of the call; return the state it read
    (``kernel`` columns, zeros at position 0) followed by ``new`` (one column per token of the call).
    ``kernel``: the model's ``conv_kernel_size`` (None: the stored state's width, else ``new``'s).
    InvalidArgumentError: not one column per token of the call."""
    name = state_name("conv", state_idx)
    if new.dim() < 2 or int(new.shape[-1]) != span.count:
        raise InvalidArgumentError(
            f"update_conv_state of layer {layer_idx}: conv_states {tuple(new.shape)} must be [batch, "
            f"channels, {span.count}] (one column per token of the call)"
        )
    stored = slots.tensor(layer_idx, name)
    if kernel is None:
        kernel = int(stored.shape[-1]) if stored is not None else int(new.shape[-1])
    prev = slots.read_state(layer_idx, name, span)
    if prev is None:
        prev = new.new_zeros((*new.shape[:-1], kernel))
    full = torch.cat([prev.to(new.dtype), new], dim=-1)
    # Column window j of full ends at the call's (j - 1)-th token: the state after it.
    windows = full.unfold(-1, kernel, 1)[..., 1:, :]  # [batch, channels, count, kernel]
    slots.write_states(layer_idx, name, span, windows.movedim(-2, 1))
    return full


def write_recurrent_state(
    slots: TorchStateSlots, layer_idx: int, span: SlotSpan, state_idx: int, state: torch.Tensor
) -> torch.Tensor:
    """Store the recurrent state after the call's last token (``[batch, *shape]``) in the slot the step
    keeps it in; return that slot. See ``check_last_state_only``; InvalidArgumentError: a state
    without a batch dimension."""
    check_last_state_only(span)
    if state.dim() < 1:
        raise InvalidArgumentError(f"update_recurrent_state of layer {layer_idx}: a state must be [batch, ...]")
    out = slots.write_states(layer_idx, state_name("recurrent", state_idx), span, state[:, None])
    if out is None:  # a span always keeps its last position (a plain step's, or each of a verify step's)
        last = span.first + span.count - 1
        raise InternalError(f"layer {layer_idx}: the step keeps no state after position {last}")
    return out


__all__ = ["check_last_state_only", "read_state", "state_name", "write_conv_states", "write_recurrent_state"]
