"""``KVCoreContiguousCache``: one sequence behind ExecuTorch's ``kvcache::update_and_attend`` op,
a drop-in replacement for ExecuTorch's ``ContiguousReferenceCache`` over a ``kvcore.SequenceCache``
and a torch pool (kvcore.integrations.executorch says what both op caches promise).
"""

from __future__ import annotations

from typing import Any, Optional

# executorch_spec first: its import names what to install when torch or executorch is missing.
from kvcore.integrations.executorch_spec import (
    AttendSpec,
    CacheSizing,
    CAUSAL_SPEC,
    check_layer,
    check_positions,
    kvcore_layers,
    MaskKind,
    NONE_SPEC,
)

import numpy as np  # noqa: E402
import torch  # noqa: E402

from kvcore._core import CacheBase, CacheConfig, LayerPolicy, SequenceCache, Step  # noqa: E402
from kvcore._errors import CapacityError, InvalidArgumentError, InvalidStateError  # noqa: E402
from kvcore.forward_step import ForwardStep  # noqa: E402
from kvcore.quantized import kv_format  # noqa: E402
from kvcore.torch.pool import TorchKVPool  # noqa: E402
from kvcore.torch.quantized import TorchQuantizedKVPool  # noqa: E402
from kvcore.torch.step_layout import StepLayout  # noqa: E402



class KVCoreContiguousCache:
    """One sequence's K/V behind ``update_and_attend``: a drop-in for ExecuTorch's ``ContiguousReferenceCache``.

    ``config``: ExecuTorch's ``CacheConfig`` (``n_layers``, ``n_kv_heads``, ``head_dim``,
    ``capacity``, ``sizing``, ``dtype``, ``batch_size``, per-layer ``LayerPolicy``).
    kvcore-only keywords:

    - ``max_step``: the most tokens one forward may carry (default ``min(512, capacity)``);
      a ring layer holds ``window + max_step - 1`` rows, so keep it near your prefill chunk.
    - ``initial_capacity``: rows a flat layer allocates first under ``DYNAMIC`` sizing
      before doubling (default 512); ``STATIC`` allocates every layer whole at construction.
    - ``mirror_rings``: a ring layer also keeps a copy of its first ``window + max_step - 2``
      rows, so a window that wraps round the ring is returned as a view rather than copied
      (default True; False halves ring bytes and gathers a wrapped window into a workspace
      the layers share: valid until the next ``update_and_fetch``, as the op uses it).
      Only with ``order="positions"``: ``"rows"`` reads are views without a mirror, and keep none.
    - ``order``: ``"positions"`` (default: the history is exactly the keys the step's queries
      may see, in position order, so a decode is unmasked) or ``"rows"`` (every row the layer
      holds, as it lies: always a view, with an explicit mask).
    - ``v_head_dim``: the value head dim when it differs from ``head_dim`` (e.g. MLA).
    - ``kv_dtype``: None (default: K/V stored in ``config.dtype``, inputs cast to it), ``"int8"``
      (ExecuTorch's ``QuantizedKVCache`` rule: per (token, head) int8 values, a float32 scale
      and an int8 zero point) or ``"fp8"`` (float8 e4m3fn, a float32 scale): rows stored
      quantized in a ``TorchQuantizedKVPool``, the history returned dequantized in the dtype
      ``k`` and ``v`` come in (float32, float16 or bfloat16, both the same; ``config.dtype`` is
      not used). ``ValueError`` (``kvcore.InvalidArgumentError``) naming any other value and
      the choices, before anything is built.

    A forward is one kvcore step: the update of layer 0 begins it (``position`` must be the
    sequence's length onwards, else ``ValueError``), every layer is then served once with the
    same tokens (each layer's K/V checked before its rows are written), and the last one
    served commits it. An error while a layer is served aborts the step, so the cache is as
    before the forward (``kvcore.forward_step``). Layer 0 arriving again before
    the forward completed restarts the step (the retry path). A step that would pass
    ``capacity`` raises ``RuntimeError`` (``kvcore.CapacityError``), as the reference does.
    """

    def __init__(
        self,
        config: Any,
        *,
        max_step: Optional[int] = None,
        initial_capacity: int = 512,
        mirror_rings: bool = True,
        order: str = "positions",
        v_head_dim: Optional[int] = None,
        kv_dtype: Optional[str] = None,
    ) -> None:
        if kv_dtype is not None:
            kv_format(kv_dtype)  # an unknown name is refused before anything is built
        self.config = config
        #: None (K/V stored in ``config.dtype``), ``"int8"`` or ``"fp8"`` (stored quantized).
        self.kv_dtype = kv_dtype
        self._static = config.sizing is CacheSizing.STATIC
        capacity = int(config.capacity)
        kv_config = CacheConfig(
            capacity,
            kvcore_layers(config, v_head_dim),
            max_step=max_step,
            initial_capacity=capacity if self._static else max(1, initial_capacity),
        )
        self.sequence = SequenceCache(kv_config)
        self.pool = (
            TorchKVPool(self.sequence, mirror_rings=mirror_rings, order=order)
            if kv_dtype is None
            else TorchQuantizedKVPool(self.sequence, kv_dtype, mirror_rings=mirror_rings, order=order)
        )
        self.order = order
        self.dtype: torch.dtype = config.dtype
        self.batch_size = int(config.batch_size)
        self._n_layers = int(config.n_layers)
        self._group_of = self.pool.group_of
        policies = [self.sequence.layer_policy(layer) for layer in range(self._n_layers)]
        # Per layer: the window (0 for a flat layer), for the spec's kind.
        self._window = [p.window if p.is_ring else 0 for p in policies]
        # The forward under way: layer 0 begins its step, the last layer served commits it, an
        # error while a layer is served aborts it (kvcore.forward_step).
        self._forward: ForwardStep[Step] = ForwardStep(self._n_layers, commit_after=self._n_layers)
        self._position: Optional[torch.Tensor] = None
        self._layouts: list[StepLayout] = []
        self._specs: list[Any] = []
        self._checked: Any = None  # the (shapes, devices) of the last input check_input passed
        if self._static:
            self._allocate_all()

    def _allocate_all(self) -> None:
        for layer in range(self._n_layers):
            self.pool.allocate(layer, batch_size=self.batch_size, dtype=self.dtype, device="cpu")

    # --- kvcore facts -------------------------------------------------------------

    @property
    def kvcore(self) -> CacheBase:
        """The kvcore cache planning this one (a ``kvcore.SequenceCache``), e.g. for kvcore's registry."""
        return self.sequence

    @property
    def length(self) -> int:
        """Committed length: positions ``0 .. length - 1`` are cached; the next forward starts there."""
        return self.sequence.length

    @property
    def max_step(self) -> int:
        """The most tokens one forward may carry (the constructor's ``max_step``, default
        ``min(512, capacity)``). A longer forward raises ``ValueError``; a ring layer holds
        ``window + max_step - 1`` rows."""
        return self.sequence.max_step

    def rows(self, layer_id: int) -> int:
        """Rows kvcore gives the layer: ``window + max_step - 1`` for a ring layer (at most capacity), capacity for a flat one.

        The most a layer ever allocates (a flat layer under ``DYNAMIC`` grows up to it), not counting a
        ring's mirror (``nbytes`` counts it). ``ValueError`` (``kvcore.InvalidArgumentError``): ``layer_id``
        outside ``[0, n_layers)``.
        """
        return self.sequence.rows(layer_id)

    def used(self, layer_id: int) -> int:
        """Positions the layer's history spans after its last update (the reference's ``used``)."""
        check_layer(layer_id, self._n_layers)
        step = self._forward.step
        if step is not None and self._forward.is_served(layer_id) and step.is_current:
            return step.end
        return self.sequence.length

    def nbytes(self, layer_id: Optional[int] = None) -> int:
        """Bytes of K/V tensors held by one layer or all (ring mirrors included)."""
        return self.pool.nbytes(layer_id)

    # --- runner verbs ---------------------------------------------------------------

    def reset(self) -> None:
        """Length 0. ``DYNAMIC`` sizing also gives the tensors back (as the reference does)."""
        self.sequence.clear()
        self._end()
        if not self._static:
            self.pool.release()

    def can_extend(self, n: int = 1) -> bool:
        """Whether ``n`` more tokens fit under ``capacity``."""
        return self.sequence.can_extend(n)

    def can_rewind(self, length: int) -> bool:
        """Whether ``rewind(length)`` would succeed (a ring layer keeps ``max_step`` tokens of rewind)."""
        return self.sequence.can_rewind(length)

    def rewind(self, length: int) -> None:
        """Back to ``length`` tokens (speculative decoding). ``RuntimeError`` when a ring layer no longer holds the history."""
        self.sequence.rewind(length)
        self._end()

    def _end(self) -> None:
        self._forward.end()  # the verb that called this ended a begun step itself
        self._position = None

    # --- op face ----------------------------------------------------------------------

    def update_and_fetch(
        self, layer_id: int, k: torch.Tensor, v: torch.Tensor, position: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """Write this forward's K/V of ``layer_id``, return its history and the ``AttendSpec`` over it.

        ``k``: ``[batch, n_kv_heads, T, head_dim]``, ``v``: ``[..., v_head_dim]``, ``position``:
        ``[T, 1]`` (``[T, n]`` is accepted and not checked: placement follows the length).
        Returns ``[batch, n_kv_heads, n, dim]`` K and V (see ``order``) and the spec; with
        ``kv_dtype`` dequantized in ``k``'s dtype, in a workspace the next update reuses.

        Errors (kvcore's exceptions, subclasses of the builtins named; nothing is written):

        - ``ValueError`` (``kvcore.InvalidArgumentError``): ``layer_id`` outside ``[0, n_layers)``;
          ``k``/``v`` not shaped for the config (``batch_size``, heads, head dims) and ``T``;
          on layer 0, more than ``max_step`` tokens, or a ``[T, 1]`` position other than
          ``length .. length + T - 1``, or one not ``[T, n]``; on a later layer, a token count
          or position other than layer 0's in the same forward. With ``kv_dtype``: ``k``/``v``
          not of one dtype of float32, float16, bfloat16, or holding inf or NaN, or a (token,
          head) whose range passes FLT_MAX (on a later layer the forward is aborted).
        - ``RuntimeError``: ``kvcore.CapacityError`` when layer 0's forward would pass ``capacity``;
          ``kvcore.InvalidStateError`` when a later layer comes with no forward under way (layer
          0 begins each) or a layer is served twice in one forward.

        It raises no ``NotImplementedError``: multi-component positions are accepted.
        """
        if not 0 <= layer_id < self._n_layers:
            check_layer(layer_id, self._n_layers)
        if self.kv_dtype is None:  # quantized: the values' own dtype, checked by the pool
            if k.dtype != self.dtype:
                k = k.to(self.dtype)
            if v.dtype != self.dtype:
                v = v.to(self.dtype)
        step = self._forward.step
        if layer_id == 0:
            step = self._begin(k, v, position)
        elif step is None or not step.is_current:
            raise InvalidStateError(
                f"update_and_fetch of layer {layer_id}: no forward is under way (layer 0 begins each forward)"
            )
        else:
            if self._forward.is_served(layer_id):
                raise InvalidStateError(
                    f"layer {layer_id} served twice in one forward (layer 0 begins the next forward)"
                )
            if int(k.shape[-2]) != step.T:
                raise InvalidArgumentError(
                    f"layer {layer_id}: {int(k.shape[-2])} new tokens, but this forward (begun by layer 0) has {step.T}"
                )
            first = self._position
            if position is not first and (first is None or not torch.equal(position, first)):
                raise InvalidArgumentError(f"layer {layer_id}: position differs from layer 0's in the same forward")
        begun = step
        p = self._group_of[layer_id]

        def write() -> tuple[torch.Tensor, torch.Tensor, Any]:
            keys, values = self.pool.write_read(layer_id, self._layouts[p], k, v)
            spec = self._specs[p]
            if spec is None:  # before the last layer commits: the plan is the begun step's
                spec = self._specs[p] = self._spec(layer_id, begun)
            return keys, values, spec

        out = self._forward.serve(layer_id, write)
        if self._forward.step is None:  # the last layer committed the step
            self._position = None
        return out

    def _begin(self, k: torch.Tensor, v: torch.Tensor, position: torch.Tensor) -> Step:
        """Begin the kvcore step of a forward (layer 0), after checking everything that can be wrong."""
        T = int(k.shape[-2])
        length = self.sequence.length
        if length + T > self.sequence.capacity:
            raise CapacityError(
                f"KV cache overflow: {length} cached + {T} new tokens exceeds capacity {self.sequence.capacity}"
            )
        if T > self.sequence.max_step:
            raise InvalidArgumentError(
                f"a forward of {T} tokens: must be <= max_step = {self.sequence.max_step}; feed longer "
                f"prompts in chunks (or raise max_step)"
            )
        if int(k.shape[0]) != self.batch_size:
            raise InvalidArgumentError(f"k has batch {int(k.shape[0])}, the config's batch_size is {self.batch_size}")
        check_positions(position, T, length)
        seen = (k.shape, v.shape, k.device, v.device, k.dtype, v.dtype)
        if seen != self._checked:  # checked once per shape: write_read checks the rest on its slow path
            self.pool.check_input(0, k, v, position=length, T=T)
            self._checked = seen
        step = self._forward.begin(lambda: self.sequence.begin_step(T))  # replaces an unfinished forward's
        self._position = position
        self._layouts = self.pool.plan_step(step)
        self._specs = [None] * len(self._layouts)
        return step

    def _spec(self, layer_id: int, step: Step) -> Any:
        """The cheapest exact AttendSpec for the layer's history this step (shared by its policy's layers)."""
        P, T = step.position, step.T
        n = self._layouts[self._group_of[layer_id]].read_len
        window = self._window[layer_id]
        if T == 1 and n == (min(P + 1, window) if window else P + 1):
            return NONE_SPEC  # the one query sees every returned key
        if P == 0 and n == T and (window == 0 or T <= window):
            return CAUSAL_SPEC  # the history is the step's own tokens, none out of a window
        mask = step.mask(layer_id, order=self.order)
        return AttendSpec(kind=MaskKind.EXPLICIT, mask=torch.from_numpy(np.array(mask)))


__all__ = ["KVCoreContiguousCache"]
