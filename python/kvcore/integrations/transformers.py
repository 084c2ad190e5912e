"""A Hugging Face transformers ``Cache`` backed by kvcore.

``KVCoreCache(model.config, max_step=...)`` is a drop-in cache for decoder models
whose layers are ``full_attention``, ``sliding_attention`` (Gemma 2 / Gemma 3
style), ``chunked_attention`` (Llama 4) or KV-shared (Gemma 3n's last layers),
mixed freely. A chunked layer is a ring of ``chunk + max_step - 1`` rows that
returns the keys of its chunk; a KV-shared layer holds nothing and is never
updated (the model hands it the K/V its source layer's update returned, as with
``DynamicCache``; the cache keeps those alive for the forward). One ``kvcore.SequenceCache`` keeps one logical length for
the whole model; each layer's K/V live in a torch pool laid out by kvcore plans
(``kvcore.torch.pool``). A sliding layer holds exactly
``window + max_step - 1`` rows (plus its sinks), and the cache can rewind to
``max_step`` tokens below the longest length it reached even after the window
wrapped, which transformers' own
sliding layers refuse unless they keep the whole history.

How a forward maps onto kvcore: a forward of ``T`` tokens is one kvcore step.
It is begun by ``attention_masks`` or by the update of layer 0 (which replaces
a step an interrupted forward left unfinished, unless it is the very step it
needs); ``get_mask_sizes`` begins nothing (it previews the step's plan). Every
layer must then follow in order with the same ``T``; each layer's K/V are
checked before its rows are written, and the update of the last layer commits
the step. An error in a layer's update aborts the step (kvcore's ``abort``), so
the cache is as before the forward (``kvcore.forward_step``). So the
length (``get_seq_length``) changes only when a whole forward succeeded, and a
forward may carry at most ``max_step`` tokens: feed longer prompts with
``generate(..., prefill_chunk_size=cache.max_step)`` or with ``prefill`` below.

Masks come from the step's plan: ``get_mask_sizes`` reports the plan's read
(one range of positions for a layer without sinks), and each layer returns
exactly those keys in position order, so transformers' masks agree and eager
and sdpa attention give DynamicCache's results. Attention sinks (``sinks > 0``)
keep the first positions visible forever, which transformers' masks cannot
express: for such a cache ``get_mask_sizes`` raises, and you pass the masks from
``cache.attention_masks(...)`` (built from the plan and kvcore's visibility
rule) yourself (``prefill`` does).

Draft trees (docs/trees.md): ``cache.begin_tree(parents)`` makes the next forward
a tree step of ``N = len(parents)`` tokens (token ``i`` at position ``length +
depth(i)``; pass ``position_ids=step.positions`` and the tree's masks from
``cache.attention_masks(model.config, N)``, as ``verify_tree`` does); the last
layer does not commit it, and ``cache.commit_tree(accepted)`` commits the
accepted root path and performs the row copies it returns.

Storage: sliding layers without sinks are mirrored by default
(``mirror_rings=True``): a window that wraps round the ring is returned as a
view, never gathered, at the price of ``window + max_step - 2`` more rows per
such layer. A layer with sinks gets no mirror: its read (sinks, then window) is
two spans and is gathered anyway.

Tested with transformers 5.24.0 and torch 2.13.0 (see docs/transformers.md).
Other 5.x releases are accepted only if the Cache API this module relies on is
there; anything else raises NotSupportedError at import rather than risk wrong
output.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any, Callable, Optional, Union

try:
    import torch
    import packaging  # noqa: F401  # the version gate's (transformers_release.py)
    import transformers
    from transformers import cache_utils
except ModuleNotFoundError as _missing:  # name the extra (private: Python deletes the name after the block)
    raise ModuleNotFoundError(
        f"kvcore.integrations.transformers needs torch, transformers and packaging ({_missing.name!r} is missing): "
        'pip install "kvcore[transformers]"',
        name=_missing.name,
    ) from _missing

from kvcore._core import LayerPolicy, SequenceCache, Step
from kvcore._errors import InternalError, InvalidArgumentError, InvalidStateError, NotSupportedError
from kvcore.forward_step import ForwardStep
from kvcore.integrations.hf_layers import FULL, SLIDING, cache_config_for
from kvcore.torch.layer import LayerPool
from kvcore.torch.pool import TorchKVPool
from kvcore.torch.quantized import TorchQuantizedKVPool
from kvcore.quantized import kv_format
from kvcore.torch.step_layout import StepLayout
from kvcore.integrations.transformers_release import CACHE_SUPPORTED, TESTED, check_release

TESTED_TRANSFORMERS = TESTED
SUPPORTED_TRANSFORMERS = CACHE_SUPPORTED

def check_transformers(version: str = transformers.__version__) -> None:
    """Raise NotSupportedError unless ``version`` and the installed Cache API are ones this module works with."""
    check_release(
        version,
        SUPPORTED_TRANSFORMERS,
        "kvcore.integrations.transformers",
        "Older 5.x releases size masks from cache_position and crop by absolute length, which this cache "
        "does not implement.",
        _cache_calls,
    )


def _cache_calls() -> dict[str, bool]:
    """The calls transformers makes into a cache, as of the tested release."""
    return {
        "CacheLayerMixin.get_mask_sizes(query_length)": _params(cache_utils.CacheLayerMixin.get_mask_sizes)
        == ["self", "query_length"],
        "Cache.get_mask_sizes(query_length, layer_idx)": _params(cache_utils.Cache.get_mask_sizes)
        == ["self", "query_length", "layer_idx"],
        "Cache.get_query_offset": hasattr(cache_utils.Cache, "get_query_offset"),
        "cache_utils.get_layer_types_and_kwargs": hasattr(cache_utils, "get_layer_types_and_kwargs"),
    }


def _params(fn: Any) -> list[str]:
    return list(inspect.signature(fn).parameters)


check_transformers()


# --- the cache ---------------------------------------------------------------------


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

    def __init__(self, owner: KVCoreCache, layer_idx: int, policy: LayerPolicy) -> None:
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

    def __init__(self, owner: KVCoreCache, layer_idx: int, policy: LayerPolicy) -> None:
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
        return self._owner.kv_layers[self.source].get_mask_sizes(query_length)

    def get_seq_length(self) -> int:
        """The cache's one length."""
        return self._owner.sequence.length

    def __repr__(self) -> str:
        return f"KVCoreSharedLayer({self.layer_idx}, source={self.source})"


class _TreeStep:
    """A draft tree's kvcore step as a forward sees it: the forward's last layer "commits" it by
    marking it verified (kvcore commits a tree only with its accepted path: commit_tree)."""

    def __init__(self, step: Step) -> None:
        self.step = step
        self.verified = False

    @property
    def T(self) -> int:
        return self.step.T

    @property
    def is_current(self) -> bool:
        return self.step.is_current

    def mask(self, layer: int, *, order: str = "rows") -> Any:
        return self.step.mask(layer, order=order)

    def commit(self) -> None:
        self.verified = True

    def abort(self) -> None:
        self.step.abort()


class KVCoreCache(cache_utils.Cache):  # type: ignore[misc]
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
    model's dtype; raises InvalidArgumentError naming any other value.

    Chunked layers (Llama 4) are rings of ``chunk + max_step - 1`` rows; KV-shared layers
    (Gemma 3n) are ``KVCoreSharedLayer``s holding nothing, and ``writing_layers`` lists the
    layers a forward updates, in order (all the others). Raises NotSupportedError for layer
    kinds it does not serve (``cache_config_for``).
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
    ) -> None:
        if kv_dtype is not None:
            kv_format(kv_dtype)  # an unknown name is refused before anything is built
        cache_config, layer_types = cache_config_for(
            config, max_step=max_step, capacity=capacity, sinks=sinks, initial_capacity=initial_capacity
        )
        self.sequence = SequenceCache(cache_config)
        # Position order: transformers' own mask functions index keys by position.
        self.kv_dtype = kv_dtype
        self.pool = (
            TorchKVPool(self.sequence, mirror_rings=mirror_rings, order="positions")
            if kv_dtype is None
            else TorchQuantizedKVPool(self.sequence, kv_dtype, mirror_rings=mirror_rings, order="positions")
        )
        self.layer_types = layer_types
        n = len(layer_types)
        policies = [self.sequence.layer_policy(i) for i in range(n)]
        # The layers a forward updates, in order: all but the KV-shared ones (which the model
        # never updates: it hands them their source's K/V).
        self.writing_layers = [i for i in range(n) if self.sequence.row_layer(i) == i]
        # Layers whose returned K/V a shared layer uses later in the forward: kept alive (see update).
        self._sources = frozenset(self.sequence.row_layer(i) for i in range(n) if self.sequence.row_layer(i) != i)
        # Typed alias of Cache.layers (transformers types it as a union of layer kinds).
        self.kv_layers: list[Union[KVCoreLayer, KVCoreSharedLayer]] = [
            KVCoreLayer(self, i, p) if i in self.writing_layers else KVCoreSharedLayer(self, i, p)
            for i, p in enumerate(policies)
        ]
        super().__init__(layers=list(self.kv_layers))
        self._n_layers = len(self.writing_layers)
        self._chunked = [i for i, p in enumerate(policies) if p.kind == LayerPolicy.Kind.Chunked]
        self._order = {layer: k for k, layer in enumerate(self.writing_layers)}
        self._policy_of = self.pool.policy_of
        self._write_read = self.pool.write_read  # bound once: the per-layer path calls it 26 times a token
        # The forward under way: layer 0 begins its step, the last writing layer commits it, an
        # error while a layer is served aborts it (kvcore.forward_step).
        self._forward: ForwardStep[Union[Step, _TreeStep]] = ForwardStep(self._n_layers, commit_after=self._n_layers)
        self._T = 0  # the begun step's T
        self._layouts: list[StepLayout] = []
        # A draft tree's step (begin_tree) between its forward and commit_tree.
        self._tree: Optional[_TreeStep] = None
        # Where the last unfinished forward stopped (a layer index), to tell a retry from
        # a model running fewer layers than the cache was built for.
        self._stopped_at: Optional[int] = None
        # Models with layer_types take a dict of masks per type; the others one 4-D mask.
        self._masks_by_type = getattr(config.get_text_config(decoder=True), "layer_types", None) is not None

    # --- kvcore facts ----------------------------------------------------------------

    @property
    def max_step(self) -> int:
        """The most tokens one forward may carry."""
        return self.sequence.max_step

    @property
    def capacity(self) -> int:
        return self.sequence.capacity

    @property
    def has_sinks(self) -> bool:
        """Whether any sliding layer keeps attention sinks (then masks come from ``attention_masks``)."""
        return any(layer.sinks > 0 for layer in self.kv_layers)

    @property
    def mirror_rings(self) -> bool:
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
        """Bytes of K/V tensors held by one layer or by all, mirrors included (the gather workspace is separate)."""
        return self.pool.nbytes(layer_idx)

    # --- the step of one forward -----------------------------------------------------

    def _begin(self, T: int) -> Union[Step, _TreeStep]:
        """The begun kvcore step of the next forward of ``T`` tokens, beginning it if needed.

        Layer 0 of the forward (or ``attention_masks``) begins it; the other layers join
        it. Plans are pure, so a step an interrupted forward left at the same (length, T)
        is the same step: it is kept.
        """
        step = self._forward.step
        # is_current implies step.position == length: the length changes only by commit,
        # rewind or clear, and each of them ends the begun step.
        if step is not None and step.T == T and step.is_current:
            same = step
            return self._forward.begin(lambda: same)  # the same step, from layer 0 again
        self._check_forward_size(T)
        self._check_no_tree()
        # Replaces a step that an interrupted forward left uncommitted (kvcore's retry path).
        chain = self.sequence.begin_step(T)  # when kvcore refuses, nothing changed
        self._forward.begin(lambda: chain)
        self._T = T
        self._layouts = self.pool.plan_step(chain)
        return chain

    def _check_forward_size(self, T: int) -> None:
        if T > self.sequence.max_step:
            raise InvalidArgumentError(
                f"a forward of T = {T} tokens: must be <= max_step = {self.sequence.max_step}; feed longer "
                f"inputs in chunks (generate(..., prefill_chunk_size={self.sequence.max_step}) or "
                f"kvcore.integrations.transformers.prefill)"
            )

    def _check_no_tree(self) -> None:
        """InvalidStateError while a verified draft tree waits for ``commit_tree``: a new step would
        silently drop it (``discard_forward`` drops it on purpose)."""
        tree = self._tree
        if tree is not None and tree.verified and tree.is_current:
            raise InvalidStateError(
                f"a draft tree of {tree.T} tokens was verified and is not committed: call "
                f"cache.commit_tree(accepted) (or cache.discard_forward()) before the next forward"
            )

    def begin_tree(self, parents: Sequence[int]) -> Step:
        """Begin the next forward's step as a draft tree (docs/trees.md) and return its kvcore ``Step``.

        ``parents``: one entry per token of the forward, ``parents[0] = -1`` (the root, the
        last committed token's successor), then ``0 <= parents[i] < i``. Token ``i`` stands at
        position ``length + depth(i)``: give the forward ``position_ids=step.positions`` and
        ``attention_mask=cache.attention_masks(model.config, len(parents))`` (each token sees
        the history and its own root path, never a sibling), or call ``verify_tree``. The
        forward's last layer does not commit the step; ``commit_tree`` does. Raises
        InvalidArgumentError for a forward over ``max_step`` or parents kvcore refuses (see
        ``SequenceCache.begin_tree``), InvalidStateError while a forward is under way or a
        verified tree is not committed, CapacityError past the capacity. Nothing changes on
        an error.
        """
        if self._forward.step is not None and self._forward.served > 0:
            raise InvalidStateError(
                f"begin_tree: a forward is under way (layers 0..{self._forward.served - 1} served); finish it "
                f"or call cache.discard_forward()"
            )
        self._check_forward_size(len(parents))
        self._check_no_tree()
        tree = _TreeStep(self.sequence.begin_tree(list(parents)))
        self._forward.begin(lambda: tree)
        self._T = tree.T
        self._layouts = self.pool.plan_step(tree.step)
        self._tree = tree
        return tree.step

    def commit_tree(self, accepted: Sequence[int]) -> None:
        """Commit the verified draft tree with its accepted root path and copy the rows it moves.

        ``accepted``: node indices, ``accepted[0] = 0``, each a child of the one before. The
        length becomes ``length + len(accepted)`` and position ``length + d`` holds node
        ``accepted[d]``'s K/V (kvcore's commit returns the row copies; the pool performs them).
        Raises InvalidStateError when no tree forward completed since ``begin_tree`` (or it was
        replaced, rewound or reset), InvalidArgumentError for a path that is not a root path
        of the tree; nothing changes on an error.
        """
        tree = self._tree
        if tree is None or not tree.verified or not tree.is_current:
            raise InvalidStateError(
                "commit_tree: no verified draft tree (call begin_tree, run the forward over every layer, then "
                "commit_tree)"
            )
        copies = self.sequence.commit(tree.step, accepted=list(accepted))
        self._tree = None
        self.pool.apply_copies(copies)

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
        if layer_idx == 0:
            # Checked before _begin: beginning a step moves kvcore's rewind floors, so bad
            # input must be refused before it. A later layer's input is checked by write_read
            # before it writes; an error there aborts the step (the forward changed nothing).
            T = self.pool.check_input(0, key_states, value_states, position=self.sequence.length)
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
        layout = self._layouts[self._policy_of[layer_idx]]
        out = forward.serve(layer_idx, self._write_read, layer_idx, layout, key_states, value_states)
        if forward.step is None:  # the last layer committed the step
            self._stopped_at = None
        if layer_idx in self._sources and (layout.view is None or self.kv_dtype is not None):
            # A shared layer attends over these later in the forward, after other layers' updates
            # reused the workspace they were gathered (or dequantized) into: keep a copy.
            out = (out[0].clone(), out[1].clone())
        return out

    def _updated_layers(self) -> str:
        """The layers a forward updates, for messages: ``layers 0..n-1`` (and the shared ones it skips)."""
        w = self.writing_layers
        skipped = [i for i in range(len(self.kv_layers)) if i not in self._order]
        text = f"layers 0..{w[-1]}" if w == list(range(len(w))) else f"layers {w}"
        return text + (f" (KV-shared layers {skipped} are never updated)" if skipped else "")

    def _refuse_shared(self, layer_idx: int) -> None:
        """InvalidArgumentError for an update of a KV-shared layer (or an index outside the layers)."""
        n = len(self.kv_layers)
        if not 0 <= layer_idx < n:
            raise InvalidArgumentError(f"update of layer {layer_idx}: must be in [0, {n})")
        source = self.sequence.row_layer(layer_idx)
        raise InvalidArgumentError(
            f"update of layer {layer_idx}: it shares layer {source}'s K/V (kvcore.Shared({source})), holds no "
            f"rows and writes nothing; attend over the K/V layer {source}'s update returned in this forward"
        )

    def _check_previous_forward(self, T: int) -> None:
        """Refuse a forward after one that stopped part-way, unless it is that forward's retry.

        A forward that updated layers 0..k-1 of n and stopped either raised (its retry,
        the same T at the same length, is exact) or comes from a model with k layers, a
        config mismatch that would otherwise commit nothing and give wrong tokens. A
        different T, or a second forward stopping at the same layer, is not a retry.
        """
        stopped = self._forward.served
        if self._forward.step is None or not 0 < stopped < self._n_layers:
            return
        if T == self._T and self._stopped_at != stopped:
            self._stopped_at = stopped  # a retry; stopping here again would not be one
            return
        self._stopped_at = None
        raise InvalidStateError(
            f"the previous forward updated layers 0..{self.writing_layers[stopped - 1]} of this cache's "
            f"{self._n_layers} {'' if len(self.kv_layers) == self._n_layers else 'K/V-writing layers '}and "
            f"stopped; this forward is not its retry{' (it stopped there twice)' if T == self._T else ''}. "
            f"If the model has {stopped} layers, build the KVCoreCache from its config; if that forward "
            f"raised, call cache.discard_forward() before starting another"
        )

    def discard_forward(self) -> None:
        """Drop the step a forward left unfinished (the model raised between layers): kvcore
        aborts it, nothing it wrote is kept, the length is unchanged, and the next forward
        may have any size. (An error inside a layer's update aborts the step by itself.)"""
        self._forward.abort()
        tree, self._tree = self._tree, None
        if tree is not None and tree.is_current:  # a verified tree waiting for commit_tree
            tree.step.abort()
        self._stopped_at = None

    # --- length changes ----------------------------------------------------------------

    def rewind(self, length: int) -> None:
        """Set the length to ``length`` (kvcore's rewind: refused with InvalidStateError into evicted history)."""
        self.sequence.rewind(length)
        self._forward.end()  # rewind ended the begun step
        self._tree = None
        self._stopped_at = None

    def can_rewind(self, length: int) -> bool:
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
        """Length 0; the tensors stay allocated for the next sequence."""
        self.sequence.clear()
        self._forward.end()  # clear ended the begun step
        self._tree = None
        self._stopped_at = None

    # --- masks for sinks -------------------------------------------------------------

    def attention_masks(
        self,
        config: Any,
        query_length: int,
        *,
        attention_mask: Optional[torch.Tensor] = None,
        batch_size: Optional[int] = None,
        dtype: torch.dtype = torch.float32,
        device: Union[torch.device, str, None] = None,
    ) -> Union[dict[str, torch.Tensor], torch.Tensor]:
        """Masks for the next forward of ``query_length`` tokens, per transformers layer type.

        Pass the result as ``attention_mask=`` to the model's forward: models whose config
        has ``layer_types`` (Gemma style) take a dict ``{layer_type: 4-D mask}`` of
        already-built masks; the others (Mistral, Phi-3, Mixtral, Starcoder2: one kind of
        layer) get the one 4-D mask, which transformers uses as it is. Each mask has one
        column per key the layer returns, in the same order: kvcore's plan of the step
        (which this begins) names the keys, and kvcore's visibility rule (``Step.mask``),
        sinks included, says which each query sees. ``attention_mask``: optional 2-D
        padding mask ``[batch, length + query_length]`` (1 = attend). Works for eager
        (float masks) and sdpa (boolean masks) attention.
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
        masks: dict[str, torch.Tensor] = {}
        for i, kind in enumerate(self.layer_types):
            if kind in masks:
                continue
            mask = torch.tensor(step.mask(i, order="positions"), device=device)[None, None].expand(batch_size, 1, -1, -1)
            if attention_mask is not None:
                layout = self._layouts[self._policy_of[i]]
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


# --- driving a model -----------------------------------------------------------------


def cache_keyword(model: Any) -> str:
    """The keyword the model's forward takes its cache under (``cache`` in 5.24, ``past_key_values`` earlier)."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def prefill(
    model: Any,
    cache: KVCoreCache,
    input_ids: torch.Tensor,
    *,
    attention_mask: Optional[torch.Tensor] = None,
    position_ids: Optional[torch.Tensor] = None,
    **forward_kwargs: Any,
) -> Any:
    """Feed ``input_ids`` through ``model`` in chunks of ``cache.max_step`` tokens; return the last output.

    ``attention_mask`` (2-D, optional) covers the cached tokens and ``input_ids``;
    ``position_ids`` (optional) covers ``input_ids`` (the model's default is the cache
    length onwards). For a
    cache with sinks, each chunk's masks come from ``cache.attention_masks``. Also a
    decode step: ``prefill(model, cache, next_token)``.
    """
    if input_ids.dim() != 2 or input_ids.shape[1] < 1:
        raise InvalidArgumentError(f"input_ids {tuple(input_ids.shape)}: must be 2-D [batch, >= 1 tokens]")
    start_length = cache.sequence.length
    if attention_mask is not None and attention_mask.shape[-1] != start_length + input_ids.shape[1]:
        raise InvalidArgumentError(
            f"attention_mask {tuple(attention_mask.shape)}: must cover the {start_length} cached tokens and "
            f"the {input_ids.shape[1]} new ones"
        )
    keyword = cache_keyword(model)
    output = None
    for start in range(0, int(input_ids.shape[1]), cache.max_step):
        chunk = input_ids[:, start : start + cache.max_step]
        end = start_length + start + chunk.shape[1]
        kwargs: dict[str, Any] = dict(forward_kwargs)
        mask = None if attention_mask is None else attention_mask[:, :end]
        if cache.has_sinks:
            kwargs["attention_mask"] = cache.attention_masks(
                model.config,
                int(chunk.shape[1]),
                attention_mask=mask,
                batch_size=int(chunk.shape[0]),
                dtype=model.dtype,
                device=chunk.device,
            )
        elif mask is not None:
            kwargs["attention_mask"] = mask
        if position_ids is not None:
            kwargs["position_ids"] = position_ids[..., start : start + chunk.shape[1]]
        output = model(input_ids=chunk, use_cache=True, **{keyword: cache}, **kwargs)
    return output


def verify_tree(model: Any, cache: KVCoreCache, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
    """One forward of ``model`` over a draft tree through ``cache``; the tree's logits, uncommitted.

    ``tokens[i]`` is node ``i``'s token id and ``parents[i]`` its parent (``parents[0] =
    -1``, the root; then ``0 <= parents[i] < i``; at most ``cache.max_step`` nodes). Every
    node stands at position ``length + depth`` and attends over the cached history and its
    own root path (kvcore's tree mask, sinks and windows included). Returns float32 logits
    ``[N, vocab]`` (row ``i``: the distribution after node ``i``'s root path); the caller
    picks the accepted root path and calls ``cache.commit_tree(path)``. Batch of one. Raises
    InvalidArgumentError when ``tokens`` and ``parents`` differ in length, and what
    ``KVCoreCache.begin_tree`` raises; a forward that raises leaves no step begun.
    """
    if len(tokens) != len(parents):
        raise InvalidArgumentError(f"verify_tree: {len(tokens)} tokens for {len(parents)} parents: one each")
    step = cache.begin_tree(parents)
    try:
        masks = cache.attention_masks(model.config, len(parents), dtype=model.dtype)
        positions = torch.tensor(step.positions.tolist(), dtype=torch.long)[None]
        out = model(input_ids=torch.tensor([list(tokens)]), position_ids=positions, attention_mask=masks,
                    use_cache=True, **{cache_keyword(model): cache})  # fmt: skip
    except BaseException:
        cache.discard_forward()
        raise
    logits: torch.Tensor = out.logits[0].float()
    return logits


__all__ = [
    "FULL",
    "KVCoreCache",
    "KVCoreLayer",
    "KVCoreSharedLayer",
    "SLIDING",
    "SUPPORTED_TRANSFORMERS",
    "TESTED_TRANSFORMERS",
    "cache_config_for",
    "cache_keyword",
    "check_transformers",
    "prefill",
    "verify_tree",
]

# Continuous batching lives in kvcore.integrations.hf_batch; these names are served from here
# too, imported on first use (hf_batch does not import this module: no cycle).
_BATCHING = ("BatchCounters", "BatchOptions", "KVCoreBatchingManager", "generate_batch", "init_kvcore_batching")


def __getattr__(name: str) -> Any:
    if name in _BATCHING:
        from kvcore.integrations import hf_batch

        return getattr(hf_batch, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
