"""Options of kvcore's continuous batching, checked before anything runs, and the kvcore config they give.

``BatchOptions`` holds what sizes kvcore's side: block size, blocks, sequences,
the tokens of one forward and the longest request. ``batch_config`` turns a
model config and the options into a ``kvcore.CacheConfig`` whose groups are
transformers' attention types, and refuses a model kvcore cannot serve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from transformers.generation.continuous_batching.cache import group_layers_by_attn_type

from kvcore._core import BatchLimits, CacheConfig, LayerPolicy
from kvcore._errors import InvalidArgumentError, NotSupportedError
from kvcore.integrations.transformers_config import CHUNKED, FULL, SLIDING, cache_config_for
from kvcore.quantized import kv_format

_MAX_IDS = 1 << 20  # BatchLimits' bound on sequences and on the tokens of one step
DEFAULT_CAPACITY = 4096


@dataclass(frozen=True)
class BatchOptions:
    """Sizes of kvcore's side of continuous batching.

    - ``block_size``: rows per block (tokens of one sequence per block), >= 1.
    - ``max_seqs``: sequences held at once (requests and parallel samples), in [1, 2**20].
    - ``max_batch_tokens``: new tokens of one forward over all requests, in [1, 2**20].
    - ``max_step``: the most tokens of one request in one forward (kvcore's ``max_step``), in
      [1, max_batch_tokens] (default ``min(64, max_batch_tokens)`` with sliding or chunked layers, else
      ``max_batch_tokens``). Sliding groups hold up to
      ``window + 2 * max_step`` positions per request, so a small one holds less K/V; a longer
      prompt is prefilled over several forwards.
    - ``capacity``: the longest request, prompt plus new tokens (default: the model's
      ``max_position_embeddings``, at most 4096).
    - ``num_blocks``: blocks of the one pool every attention type draws from (default: what each
      type would need alone, summed: ``max_seqs`` requests at ``capacity`` for full attention, their
      windows for sliding types); at least the blocks of one request at ``capacity``
      (docs/batch.md section 5, "One budget").
    - ``max_tokens_read``: cache positions one forward may read over all its requests (transformers'
      read budget; default ``max_seqs * capacity``).
    - ``wait_for_shared_prefill``: a new request whose prompt starts with the first block of a
      prompt another request is still prefilling waits for it, then adopts it (default True).
    - ``kv_dtype``: None (the default) stores K/V in the model's dtype; ``"int8"`` (ExecuTorch's
      asymmetric rule) or ``"fp8"`` (e4m3fn) stores each row quantized with per-head float32 scales
      (``kvcore.torch.TorchQuantizedPagedKVPool``, docs/quantized.md), read back in the model's
      dtype. Any other value: InvalidArgumentError naming it and the choices.
    """

    block_size: int = 16
    max_seqs: int = 32
    max_batch_tokens: int = 256
    max_step: Optional[int] = None
    capacity: Optional[int] = None
    num_blocks: Optional[int] = None
    max_tokens_read: Optional[int] = None
    wait_for_shared_prefill: bool = True
    kv_dtype: Optional[str] = None

    def __post_init__(self) -> None:
        if not isinstance(self.wait_for_shared_prefill, bool):
            raise InvalidArgumentError(f"wait_for_shared_prefill = {self.wait_for_shared_prefill!r}: must be a bool")
        if self.kv_dtype is not None:
            kv_format(self.kv_dtype)  # names the value and the choices
        for name in self.names()[:-2]:  # the int options
            value = getattr(self, name)
            if value is None and name in ("max_step", "capacity", "num_blocks", "max_tokens_read"):
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidArgumentError(f"{name} = {value!r}: must be an int")
            if value < 1:
                raise InvalidArgumentError(f"{name} = {value}: must be >= 1")
        for name in ("max_seqs", "max_batch_tokens"):
            if getattr(self, name) > _MAX_IDS:
                raise InvalidArgumentError(f"{name} = {getattr(self, name)}: must be <= 2**20")
        if self.max_step is not None and self.max_step > self.max_batch_tokens:
            raise InvalidArgumentError(
                f"max_step = {self.max_step}: must be <= max_batch_tokens = {self.max_batch_tokens}"
            )
        if self.capacity is not None:
            self.check_num_blocks(self.capacity)

    def check_num_blocks(self, capacity: int) -> None:
        """InvalidArgumentError unless ``num_blocks`` (when set) holds one request of ``capacity``
        positions."""
        need = math.ceil(capacity / self.block_size)
        if self.num_blocks is not None and self.num_blocks < need:
            raise InvalidArgumentError(
                f"num_blocks = {self.num_blocks}: a request of capacity = {capacity} positions needs "
                f"{need} blocks of block_size = {self.block_size}; raise num_blocks or lower capacity"
            )

    @staticmethod
    def names() -> tuple[str, ...]:
        """The option names ``generate_batch`` and the manager accept."""
        return ("block_size", "max_seqs", "max_batch_tokens", "max_step", "capacity", "num_blocks", "max_tokens_read",
                "wait_for_shared_prefill", "kv_dtype")  # fmt: skip

    def chunk(self, capacity: int, sliding: bool) -> int:
        """kvcore's ``max_step``: ``max_step``, or by default ``min(64, max_batch_tokens)`` for a model
        with sliding layers (their blocks grow with it) and ``max_batch_tokens`` otherwise; at most
        ``capacity``."""
        default = min(64, self.max_batch_tokens) if sliding else self.max_batch_tokens
        return min(self.max_step or default, capacity)


def resolved_capacity(options: BatchOptions, text_config: Any) -> int:
    """``options.capacity``, or the model's ``max_position_embeddings`` capped at 4096."""
    if options.capacity is not None:
        return options.capacity
    return min(int(getattr(text_config, "max_position_embeddings", None) or DEFAULT_CAPACITY), DEFAULT_CAPACITY)


def check_fits(prompt: list[int], max_new_tokens: Optional[int], capacity: int, what: str) -> None:
    """InvalidArgumentError (naming ``what``) unless the prompt plus ``max_new_tokens`` is in
    ``[1, capacity]``: kvcore sizes a request by both before it runs."""
    if not prompt or max_new_tokens is None or len(prompt) + max_new_tokens > capacity:
        raise InvalidArgumentError(
            f"{what}: {len(prompt)} prompt tokens + max_new_tokens = {max_new_tokens} "
            f"must be in [1, capacity = {capacity}] (set max_new_tokens, or capacity=)"
        )


def attention_groups(text_config: Any) -> dict[str, list[int]]:
    """transformers' continuous-batching groups (layers per attention type, in its order), and a
    ``chunked_attention`` group (Llama 4) beside the full one: transformers' input builder has
    key lengths and masks for two types, so a chunked model takes the sliding type's place.

    Raises NotSupportedError for a layer type without an allocator in transformers (linear
    attention, convolutions, ...) or chunked layers beside sliding ones (three types)."""
    types = list(getattr(text_config, "layer_types", None) or [])
    if CHUNKED in types:
        groups = {t: [i for i, x in enumerate(types) if x == t] for t in dict.fromkeys(types)}
        if set(groups) - {FULL, CHUNKED}:
            raise NotSupportedError(
                f"{type(text_config).__name__}: layer types {sorted(groups)}: kvcore serves {CHUNKED!r} beside "
                f"{FULL!r} only (transformers' input builder has room for two attention types)"
            )
        return groups
    try:
        groups = group_layers_by_attn_type(text_config)
    except ValueError as e:  # a layer type transformers' continuous batching has no allocator for
        raise NotSupportedError(
            f"{type(text_config).__name__}: {e}; kvcore's continuous batching serves {FULL!r}, {SLIDING!r} and "
            f"{CHUNKED!r} layers. Recurrent and convolution layers (hybrid models) are not served: "
            f"transformers' layer code runs them over a forward's packed tokens as one sequence, so "
            f"requests would share one state; KVCoreCache serves hybrids through model.generate"
        ) from e
    return dict(groups)


def batch_config(text_config: Any, options: BatchOptions) -> tuple[CacheConfig, dict[str, list[int]]]:
    """The kvcore config serving ``text_config`` under ``options``, and transformers' layers per
    attention type (its continuous-batching groups, in its order).

    KV-shared layers (Gemma 3n) are served: they read their source's blocks and write none.
    Chunked layers (Llama 4) are served beside full ones (``attention_groups``). Raises
    NotSupportedError for a layer kind kvcore cannot serve here (linear or convolution layers:
    hybrids; bidirectional attention, one type with two windows, a window that is not the
    config's ``sliding_window``), InvalidArgumentError for options that do not fit.
    """
    capacity = resolved_capacity(options, text_config)
    options.check_num_blocks(capacity)
    groups = attention_groups(text_config)
    max_step = options.chunk(capacity, sliding=SLIDING in groups or CHUNKED in groups)
    base, layer_types = cache_config_for(text_config, max_step=max_step, capacity=capacity)
    for kind, layers in groups.items():
        wrong = [i for i in layers if layer_types[i] != kind]
        if wrong:
            raise NotSupportedError(
                f"layer {wrong[0]}: transformers' continuous batching treats it as {kind!r} but its cache "
                f"config says {layer_types[wrong[0]]!r}"
            )
    window = getattr(text_config, "sliding_window", None)
    for i, layer in enumerate(base.layers):
        shared = layer.policy.kind == LayerPolicy.Kind.Shared  # masked as its source
        if layer_types[i] == SLIDING and not shared and layer.policy.window != window:
            raise NotSupportedError(
                f"layer {i}: window {layer.policy.window} differs from sliding_window = {window}, which "
                f"transformers' continuous batching masks every sliding layer with"
            )
    limits = BatchLimits(
        block_size=options.block_size,
        max_seqs=options.max_seqs,
        max_step_tokens=options.max_batch_tokens,
        num_blocks=options.num_blocks or 0,
        # One kvcore group per attention type: transformers' input builder reads one set of
        # row indices per type, so the layers of a type cannot be split into page-sized groups.
        page_layers=len(base.layers),
        # The loop rewinds a sequence only to 0 (a refused admission), which is always allowed:
        # rings keep the window, not a chunk's rewind margin (docs/batch.md section 5).
        max_rewind=0,
    )
    return CacheConfig(capacity, list(base.layers), max_step=max_step, batch=limits), groups


__all__ = ["BatchOptions", "attention_groups", "batch_config", "check_fits", "resolved_capacity"]
