"""The masks of a forward through a ``KVCoreCache``: ``Masks`` sizes them and builds them.

Masks come from the step's plan: ``get_mask_sizes`` reports the plan's read (one range of
positions for a layer without sinks), and each layer returns exactly those keys in
position order, so transformers' masks agree and eager and sdpa attention give
DynamicCache's results. Attention sinks (``sinks > 0``) keep the first positions visible
forever, which transformers' masks cannot express: for such a cache ``get_mask_sizes``
raises, and you pass the masks from ``cache.attention_masks(...)`` (built from the plan
and kvcore's visibility rule) yourself (``kvcore.integrations.transformers.prefill``
does). Draft trees take theirs from ``attention_masks`` too.

``Masks`` is a base class of ``KVCoreCache`` (``kvcore.integrations.transformers_cache``);
it is not used alone.
"""

from __future__ import annotations

from typing import Any, Optional, Union

import torch

from kvcore._core import LayerPolicy
from kvcore._errors import InvalidArgumentError, NotSupportedError
from kvcore.integrations.transformers_layers import KVCoreLayer, KVCoreSharedLayer
from kvcore.integrations.transformers_steps import ForwardSteps


class Masks(ForwardSteps):
    """The mask sizes and masks of ``KVCoreCache`` (see the module docstring)."""

    # Set by KVCoreCache.__init__ (kvcore.integrations.transformers_cache).
    layer_types: list[str]  # each layer's transformers layer type
    kv_layers: list[KVCoreLayer]
    _group_of: list[int]  # layer -> its group's index in the step's layouts
    _masks_by_type: bool  # models with layer_types take a dict of masks per type; the others one 4-D mask

    def get_mask_sizes(self, query_length: int, layer_idx: int) -> tuple[int, int]:
        """(kv_length, kv_offset) of the next forward of ``query_length`` tokens for ``layer_idx``
        (a state layer answers as the first attention layer: it has no keys)."""
        self._mask_hint = (self.sequence.length, query_length)
        layer = self.layers[layer_idx]
        if isinstance(layer, (KVCoreLayer, KVCoreSharedLayer)):
            return layer.get_mask_sizes(query_length)
        if not self.kv_layers:
            self._check_forward_size(query_length)
            return query_length, 0
        return self.kv_layers[0].get_mask_sizes(query_length)

    def attention_masks(
        self,
        config: Any,
        query_length: int,
        *,
        attention_mask: Optional[torch.Tensor] = None,
        batch_size: Optional[int] = None,
        dtype: torch.dtype = torch.float32,
        device: Union[torch.device, str, None] = None,
    ) -> Union[dict[str, Optional[torch.Tensor]], torch.Tensor, None]:
        """Masks for the next forward of ``query_length`` tokens, per transformers layer type.

        Pass the result as ``attention_mask=`` to the model's forward: models whose config
        has ``layer_types`` (Gemma style) take a dict ``{layer_type: 4-D mask}`` of
        already-built masks; the others (Mistral, Phi-3, Mixtral, Starcoder2: one kind of
        layer) get the one 4-D mask, which transformers uses as it is. Each mask has one
        column per key the layer returns, in the same order: kvcore's plan of the step
        (which this begins) names the keys, and kvcore's visibility rule (``Step.mask``),
        sinks included, says which each query sees. ``attention_mask``: optional 2-D
        padding mask ``[batch, length + query_length]`` (1 = attend). Works for eager
        (float masks) and sdpa (boolean masks) attention. A recurrent-state layer type
        (``linear_attention``, ``conv``) gets what transformers' ``create_recurrent_attention_mask``
        gives it: the new tokens' columns of ``attention_mask``, or None without one.
        """
        impl = config.get_text_config(decoder=True)._attn_implementation
        if impl not in ("eager", "sdpa"):
            raise NotSupportedError(f"attention_masks: attn_implementation {impl!r}; use 'eager' or 'sdpa'")
        if not 1 <= query_length <= self.sequence.max_step:
            raise InvalidArgumentError(
                f"query_length = {query_length}: must be in [1, max_step = {self.sequence.max_step}]"
            )
        length = self.sequence.length
        if attention_mask is not None:
            if attention_mask.dim() != 2 or attention_mask.shape[1] < length + query_length:
                raise InvalidArgumentError(
                    f"attention_mask {tuple(attention_mask.shape)}: must be 2-D [batch, >= {length + query_length}]"
                )
            batch_size = int(attention_mask.shape[0]) if batch_size is None else batch_size
            device = attention_mask.device if device is None else device
        batch_size = 1 if batch_size is None else batch_size
        step = self._begin(query_length)
        masks: dict[str, Optional[torch.Tensor]] = {}
        for i, kind in enumerate(self.layer_types):
            if kind in masks:
                continue
            if self.sequence.layer_policy(i).kind == LayerPolicy.Kind.State:
                # transformers' recurrent mask: the new tokens' 2-D padding, None without padding.
                masks[kind] = None if attention_mask is None else attention_mask[:, -query_length:].contiguous()
                continue
            mask = torch.tensor(step.mask(i, order="positions"), device=device)[None, None].expand(batch_size, 1, -1, -1)
            if attention_mask is not None:
                layout = self._layouts[self._group_of[i]]
                keys = torch.cat([torch.arange(a, b, device=device) for a, b in layout.positions])
                mask = mask & attention_mask.to(device=device, dtype=torch.bool)[:, keys][:, None, None, :]
            if impl == "eager":
                masks[kind] = torch.where(
                    mask, torch.zeros((), dtype=dtype, device=device), torch.finfo(dtype).min
                )
            else:
                masks[kind] = mask
        if not self._masks_by_type:
            # The model builds one mask for all its layers; transformers made the types up.
            if len(masks) != 1:
                raise NotSupportedError(
                    f"the model's config has no layer_types but its layers are {sorted(masks)}: one mask "
                    f"cannot serve both"
                )
            return next(iter(masks.values()))
        return masks


__all__ = ["Masks"]
