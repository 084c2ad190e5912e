"""``kvcore export``: a model to a ``.pte`` whose attention is ``kvcache::update_and_attend``, with
kvcore's cache metadata in it, for ``kvcore-run`` (ExecuTorch's C++ runtime on kvcore's kernel).

- ``register_attention()``: an off-graph attention for transformers models, registered in
  transformers' attention interface (and a mask function returning None: the op masks by
  kvcore's visibility rule, so no mask is traced). Each attention layer calls
  ``kvcache::update_and_attend(q, k, v, positions, layer_idx, scaling)`` with this forward's
  K/V only (the model runs with ``use_cache=False``); the cache lives outside the graph.
- ``OffGraphCausalLM``: a transformers causal LM as the program ``kvcore-run`` drives,
  ``forward(tokens [1, T], positions [T, 1]) -> logits [1, T, vocab]``, float32, and
  ``forward_last`` (same inputs) -> the last position's logits ``[1, 1, vocab]`` for prefill
  (the vocabulary head on one row: Gemma 3 270M's is 262144 x 640).
- ``transformers_metadata``: the ``KVCoreMetadata`` of a transformers config (its layer kinds,
  windows, sinks, shared sources, heads and dims, as kvcore's transformers cache plans them).
- ``export_transformers``: such a model to ``.pte`` bytes; ``export_model``: ``kvcore export``'s
  models by name (``tiny``: ``executorch_tiny``'s random decoder, seconds; ``gemma-3-270m``:
  Gemma 3 270M from PyPI, minutes).

Batch 1; a model's other operators run on ExecuTorch's portable CPU kernels (no delegate).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any, Optional

import torch

from kvcore.integrations.executorch_runtime import KV_DTYPES, KVCoreMetadata, export_program, register_out_variant

#: The models ``kvcore export --model`` knows.
MODELS = ("tiny", "gemma-3-270m")
#: The name the off-graph attention is registered under in transformers' attention interface.
ATTENTION = "kvcore_update_and_attend"


def _attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    position_ids: Optional[torch.Tensor] = None,
    scaling: Optional[float] = None,
    softcap: Optional[float] = None,
    head_mask: Optional[torch.Tensor] = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-interface signature: q [1, H, T, D], this forward's k/v [1, Hkv, T,
    D] -> ([1, T, H, D], None) through ``kvcache::update_and_attend``. ValueError for what the op
    cannot honour (dropout, a logit softcap, a head mask, no position_ids or scaling)."""
    if kwargs.get("dropout"):
        raise ValueError("kvcore's off-graph attention: dropout is not supported")
    if softcap is not None or head_mask is not None:
        raise ValueError("kvcore's off-graph attention: an attention logit softcap or a head mask is not supported")
    if position_ids is None or scaling is None:
        raise ValueError("kvcore's off-graph attention needs position_ids and scaling from the model")
    position = position_ids[0].reshape(-1, 1)
    layer = int(getattr(module, "layer_idx"))
    out: torch.Tensor = torch.ops.kvcache.update_and_attend(query, key, value, position, layer, float(scaling),
                                                            query.dtype)  # fmt: skip
    return out.transpose(1, 2).contiguous(), None


def _no_mask(*args: Any, **kwargs: Any) -> None:
    """No mask tensor: the op masks by kvcore's visibility rule."""
    return None


def register_attention() -> str:
    """Register kvcore's off-graph attention (``ATTENTION``) in transformers' attention and mask
    interfaces (idempotent) and ``kvcache::update_and_attend.out``; returns the name to set as
    ``config._attn_implementation``."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    ALL_ATTENTION_FUNCTIONS.register(ATTENTION, _attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, _no_mask)
    register_out_variant()
    return ATTENTION


class OffGraphCausalLM(torch.nn.Module):
    """A transformers causal LM with kvcore's off-graph attention: ``forward(tokens [1, T] int64,
    positions [T, 1] int64) -> logits [1, T, vocab]`` float32, the K/V cache behind the op
    (``kvcore-run``'s program signature)."""

    def __init__(self, model: torch.nn.Module, max_step: int) -> None:
        """Wraps ``model`` (its attention switched to ``ATTENTION``); ``max_step``: the most tokens
        of one forward (the exported token dimension's upper bound)."""
        super().__init__()
        config: Any = getattr(model, "config")
        config._attn_implementation = register_attention()
        self.model = model
        self.max_step = max_step

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits [1, T, vocab] (float32) of ``tokens`` [1, T] at ``positions`` [T, 1]."""
        out = self.model(input_ids=tokens, position_ids=positions.reshape(1, -1), use_cache=False)
        logits: torch.Tensor = out.logits.float()
        return logits

    def forward_last(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The last position's logits [1, 1, vocab] (float32) of ``tokens`` [1, T] at ``positions``
        [T, 1]: every token's K/V goes to the cache as in ``forward``, the head runs on the last
        row only (transformers' ``logits_to_keep=1``)."""
        out = self.model(input_ids=tokens, position_ids=positions.reshape(1, -1), use_cache=False, logits_to_keep=1)
        logits: torch.Tensor = out.logits.float()
        return logits

    def example_inputs(self, T: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs of a forward of ``T`` tokens at positions 0 .. T - 1."""
        return torch.zeros(1, T, dtype=torch.long), torch.arange(T, dtype=torch.long)[:, None]

    def dynamic_shapes(self) -> Any:
        """The token dimension dynamic, 1 .. max_step, shared by ``tokens`` and ``positions``."""
        T = torch.export.Dim("T", min=1, max=self.max_step)
        return {"tokens": {1: T}, "positions": {0: T}}


def transformers_metadata(config: Any, *, capacity: int, max_step: int, kv_dtype: str = "float32") -> KVCoreMetadata:
    """The cache facts of a transformers model ``config``, as kvcore's transformers cache plans
    its layers (``kvcore.integrations.transformers_config.cache_config_for``): full -> FLAT,
    sliding -> RING(window), chunked -> CHUNKED(chunk), KV-shared -> SHARED(source).
    ``capacity`` (positions) and ``max_step`` (tokens per forward) as the program will have them;
    ``kv_dtype``: the storage the program suggests (a ``KV_DTYPES`` name).
    ValueError for another ``kv_dtype``; kvcore's NotSupportedError / InvalidArgumentError (both
    ValueErrors) for a layer type the kernel cannot serve (recurrent state) or bad sizes."""
    from kvcore.integrations.transformers_config import cache_config_for

    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv_dtype {kv_dtype!r}: must be one of {', '.join(KV_DTYPES)}")
    cfg, _ = cache_config_for(config, capacity=capacity, max_step=max_step)
    kinds = [int(layer.policy.kind) for layer in cfg.layers]
    if any(kind > 3 for kind in kinds):
        raise ValueError(f"layer {next(i for i, k in enumerate(kinds) if k > 3)} keeps a recurrent state: the "
                         "ExecuTorch kernel serves attention layers only (flat, ring, chunked, shared)")  # fmt: skip
    first = cfg.layers[0]
    if any((layer.n_kv_heads, layer.head_dim, layer.value_dim) != (first.n_kv_heads, first.head_dim, first.value_dim)
           for layer in cfg.layers):  # fmt: skip
        raise ValueError("layers of different KV heads or dims: the ExecuTorch kernel takes one shape for all")
    text = config.get_text_config(decoder=True)
    return KVCoreMetadata(
        kinds=tuple(kinds),
        windows=tuple(int(layer.policy.window) if kind in (1, 2) else 0 for layer, kind in zip(cfg.layers, kinds)),
        sinks=tuple(int(layer.policy.sinks) if kind == 1 else 0 for layer, kind in zip(cfg.layers, kinds)),
        sources=tuple(int(layer.policy.source) if kind == 3 else 0 for layer, kind in zip(cfg.layers, kinds)),
        n_kv_heads=int(first.n_kv_heads), n_heads=int(text.num_attention_heads), head_dim=int(first.head_dim),
        v_head_dim=int(first.value_dim) if first.value_dim != first.head_dim else 0,
        capacity=capacity, max_step=max_step, vocab_size=int(text.vocab_size), kv_dtype=KV_DTYPES[kv_dtype],
    )  # fmt: skip


def export_transformers(model: torch.nn.Module, *, capacity: int, max_step: int, kv_dtype: str = "float32",
                        forward_last: bool = True) -> bytes:  # fmt: skip
    """The ``.pte`` bytes of a transformers causal LM (float32, eval mode) with kvcore's off-graph
    attention and its ``transformers_metadata`` as constant methods: ``forward`` (every
    position's logits) and, unless ``forward_last=False``, ``forward_last`` (the last
    position's, ``OffGraphCausalLM.forward_last``; the weights stored once); the model's own
    attention implementation is restored after. Takes minutes for a real model (Gemma 3 270M:
    about 2.5 min and 3.8 GB peak RSS on a shared 2-core machine). Errors as
    ``transformers_metadata``'s."""
    config: Any = getattr(model, "config")
    meta = transformers_metadata(config, capacity=capacity, max_step=max_step, kv_dtype=kv_dtype)
    attention = config._attn_implementation
    try:
        wrapped = OffGraphCausalLM(model.eval(), max_step).eval()
        # linear kept whole: ExecuTorch's optimized kernel, not a transposed copy of each weight
        # per forward (Gemma 3 270M's tied 262144 x 640 head: 671 MB a forward).
        return export_program(wrapped, wrapped.example_inputs(2), meta, wrapped.dynamic_shapes(),
                              preserve_ops=[torch.ops.aten.linear.default], forward_last=forward_last)
    finally:
        config._attn_implementation = attention  # the model runs as before in PyTorch


@dataclasses.dataclass(frozen=True)
class ExportOptions:
    """What ``kvcore export`` exports: ``model`` (one of ``MODELS``), ``capacity`` (positions the
    program may hold; None: the model's default), ``max_step`` (tokens per forward; None: the
    model's default), ``kv_dtype`` (the K/V storage the program suggests), ``seed`` (``tiny``'s weights)."""

    model: str = "tiny"
    capacity: Optional[int] = None
    max_step: Optional[int] = None
    kv_dtype: str = "float32"
    seed: int = 0

    #: (capacity, max_step) when not given, per model.
    DEFAULTS = {"tiny": (64, 8), "gemma-3-270m": (2048, 64)}

    def sizes(self) -> tuple[int, int]:
        """(capacity, max_step), the defaults filled in."""
        capacity, max_step = self.DEFAULTS[self.model]
        return (self.capacity or capacity, self.max_step or max_step)

    def check(self) -> None:
        """ValueError naming the first option that cannot be honoured: an unknown model or
        ``kv_dtype``, a capacity or max_step below 1, max_step above capacity, a negative seed."""
        if self.model not in MODELS:
            raise ValueError(f"--model {self.model!r}: must be one of {', '.join(MODELS)}")
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"--kv-dtype {self.kv_dtype!r}: must be one of {', '.join(KV_DTYPES)}")
        for name, value in (("capacity", self.capacity), ("max_step", self.max_step), ("seed", self.seed)):
            low = 0 if name == "seed" else 1
            if value is not None and value < low:
                raise ValueError(f"--{name.replace('_', '-')} = {value}: must be >= {low}")
        capacity, max_step = self.sizes()
        if max_step > capacity:
            raise ValueError(f"--max-step = {max_step}: must be <= --capacity = {capacity}")


def export_model(opts: ExportOptions, load: Optional[Callable[[str], Any]] = None) -> tuple[bytes, KVCoreMetadata]:
    """The ``.pte`` bytes of ``opts.model`` and the metadata written into it (methods ``forward`` and
    ``forward_last``). ``tiny``: the random
    decoder of ``executorch_tiny`` (seconds); a real model: ``load(name)`` gives the transformers
    model (``kvcore_demo.real_model.load(name).model``; required), exported in minutes.
    ValueError as ``ExportOptions.check``."""
    opts.check()
    capacity, max_step = opts.sizes()
    if opts.model == "tiny":
        tiny = importlib.import_module("kvcore.integrations.executorch_tiny")
        config = tiny.TinyConfig(capacity=capacity, max_step=max_step, seed=opts.seed)
        meta = dataclasses.replace(config.metadata(), kv_dtype=KV_DTYPES[opts.kv_dtype])
        model = tiny.TinyDecoder(config).eval()
        meta = dataclasses.replace(meta, forward_last=1)
        return export_program(model, model.example_inputs(2), meta, model.dynamic_shapes(), forward_last=True), meta
    if load is None:
        raise ValueError(f"--model {opts.model}: a real model needs a loader")
    model = load(opts.model)
    meta = transformers_metadata(model.config, capacity=capacity, max_step=max_step, kv_dtype=opts.kv_dtype)
    meta = dataclasses.replace(meta, forward_last=1)
    return export_transformers(model, capacity=capacity, max_step=max_step, kv_dtype=opts.kv_dtype), meta


__all__ = [
    "ATTENTION",
    "MODELS",
    "ExportOptions",
    "OffGraphCausalLM",
    "export_model",
    "export_transformers",
    "register_attention",
    "transformers_metadata",
]
