"""A Hugging Face transformers ``Cache`` backed by kvcore.

``KVCoreCache(model.config, max_step=...)`` is a drop-in cache for decoder models
whose layers are ``full_attention``, ``sliding_attention`` (Gemma 2 / Gemma 3
style), ``chunked_attention`` (Llama 4), KV-shared (Gemma 3n's last layers) or
recurrent-state layers (``linear_attention``: Qwen3-Next's gated DeltaNet, Granite
4.0-H's Mamba-2; ``conv``: LFM2's short convolutions), mixed freely. A chunked layer is
a ring of ``chunk + max_step - 1`` rows that returns the keys of its chunk; a KV-shared
layer holds nothing and is never updated (the model hands it the K/V its source layer's
update returned, as with ``DynamicCache``; the cache keeps those alive for the forward).
One ``kvcore.SequenceCache`` keeps one logical length for
the whole model; each layer's K/V live in a torch pool laid out by kvcore plans
(``kvcore.torch.pool``). A sliding layer holds exactly
``window + max_step - 1`` rows (plus its sinks), and the cache can rewind to
``max_step`` tokens below the longest length it reached even after the window
wrapped, which transformers' own
sliding layers refuse unless they keep the whole history.

How a forward maps onto kvcore: a forward of ``T`` tokens is one kvcore step.
It is begun by ``attention_masks``, ``begin_verify``, ``begin_tree`` or by layer 0
(its update, or its first state call for a state layer; layer 0 replaces a step an
interrupted forward left unfinished, unless it is the very step it needs);
``get_mask_sizes`` begins nothing (it previews the step's plan). Every
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

Recurrent-state layers (hybrids) implement transformers' linear-attention cache API
(``get_conv_state`` / ``update_conv_state`` / ``get_recurrent_state`` /
``update_recurrent_state`` / ``has_previous_state``) over kvcore's State slots
(``kvcore.torch.state_slots``): ``state_slots`` snapshots per layer, ``slot(p) = p %
D``. A forward reads the state after its first position minus one and keeps its last
state (a plain step) or the state after each of its tokens (a verify step:
``begin_verify``, or every forward of ``T <= D - 1`` tokens after
``activate_past_recording``), so ``crop`` is exact wherever ``can_rewind`` allows.
A state call carries no token count: a forward whose layer 0 holds a state takes its
``T`` from the forward's ``get_mask_sizes`` (transformers' mask functions call it
first) or from a begun step. A layer's first state call of a forward serves it; when
the model's last layer holds a state, the forward commits at that call, and an error
in its later calls rewinds the cache to where the forward began. Exact speculative
decoding on these models: ``kvcore.integrations.transformers_speculative``.

Storage: sliding layers without sinks are mirrored by default
(``mirror_rings=True``): a window that wraps round the ring is returned as a
view, never gathered, at the price of ``window + max_step - 2`` more rows per
such layer. A layer with sinks gets no mirror: its read (sinks, then window) is
two spans and is gathered anyway.

Tested with transformers 5.24.0 and torch 2.13.0 (see docs/transformers.md).
Other 5.x releases are accepted only if the Cache API this module relies on is
there; anything else raises NotSupportedError at import rather than risk wrong
output.

This module is the public entry and holds the cache; its parts live beside it and
every name is importable from here: the layer classes (``KVCoreLayer``,
``KVCoreSharedLayer``, ``KVCoreStateLayer``) in ``kvcore.integrations.transformers_layers``,
the release and Cache API check (``check_transformers``) in
``kvcore.integrations.transformers_versions``. How a state layer's conv and recurrent
tensors become slot states is ``kvcore.integrations.transformers_state``.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Sequence
from typing import Any, Callable, Optional, TypeVar, Union

try:
    import numpy as np
    import torch
    import packaging  # noqa: F401  # the version gate's (transformers_release.py)
    import transformers  # noqa: F401  # named in the message when it is missing
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
from kvcore.integrations.hf_layers import DUMMY, FULL, SLIDING, STATE_TYPES, cache_config_for, hybrid_state_layers
from kvcore.integrations.transformers_mixers import state_layers_token_by_token
from kvcore.integrations.transformers_layers import KVCoreEmptyLayer, KVCoreLayer, KVCoreSharedLayer, KVCoreStateLayer
from kvcore.integrations.transformers_state import read_state, state_name, write_conv_states, write_recurrent_state
from kvcore.torch.pool import TorchKVPool
from kvcore.torch.quantized import TorchQuantizedKVPool
from kvcore.torch.state_slots import SlotSpan, TorchStateSlots
from kvcore.quantized import kv_format
from kvcore.torch.step_layout import StepLayout
from kvcore.integrations.transformers_versions import SUPPORTED_TRANSFORMERS, TESTED_TRANSFORMERS, check_transformers

_R = TypeVar("_R")


# --- the cache ---------------------------------------------------------------------


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
    def position(self) -> int:
        return self.step.position

    @property
    def is_current(self) -> bool:
        return self.step.is_current

    def plan(self, layer: int) -> Any:
        return self.step.plan(layer)

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
        # State layers: the layer being served, the forward's served count then, and its slots.
        self._state_call: Optional[tuple[int, int, SlotSpan]] = None
        # Positions the state layers' calls cover now (state_positions), else the whole step.
        self._state_range: Optional[tuple[int, int]] = None
        self._state_node: Optional[int] = None  # tree_node: the draft-tree node state calls cover
        # (length, T) of the last get_mask_sizes: the token count of a forward whose first
        # layer holds a state (a state call carries no token count).
        self._mask_hint: Optional[tuple[int, int]] = None
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
        """Bytes held by one layer or by all: K/V tensors (mirrors included) and a recurrent-state
        layer's ``D`` state snapshots (``cache.state``); what ``kvcore memory --hf-config`` plans.
        The gather / dequantization workspace is separate (``pool.workspace_nbytes``)."""
        if layer_idx is None:
            return self.pool.nbytes() + (self.state.nbytes() if self.state_layers else 0)
        if layer_idx in self._state_layer_set:
            return self.state.nbytes(layer_idx)
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
        verify = self._verify_forwards and bool(self.state_layers) and T <= self._max_verify_T
        chain = self.sequence.begin_step(T, verify=verify)  # when kvcore refuses, nothing changed
        self._forward.begin(lambda: chain)
        self._state_call = None
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
        forward's last layer does not commit the step; ``commit_tree`` does. A recurrent-state
        layer runs node by node (each node reads its parent's state and keeps its own:
        ``tree_node``; ``verify_tree`` arranges it). Raises
        InvalidArgumentError for a forward over ``max_step`` or parents kvcore refuses (see
        ``SequenceCache.begin_tree``), InvalidStateError while a forward is under way or a
        verified tree is not committed, CapacityError past the capacity. Nothing changes on
        an error.
        """
        return self._begin_uncommitted("begin_tree", len(parents), lambda: self.sequence.begin_tree(list(parents)))

    def begin_verify(self, T: int) -> Step:
        """Begin the next forward's step as a verify step of ``T`` tokens and return its kvcore ``Step``.

        A verify step may be rewound into: attention layers plan it as any step, and each
        recurrent-state layer keeps the state after every one of its tokens (kvcore's
        ``begin_step(T, verify=True)``: ``T <= state_slots - 1``). The forward's last layer does
        not commit it; ``commit_verify(n)`` keeps its first ``n`` tokens, and the next forward
        reads the state after the last kept one (nothing is recomputed). Transformers' gated
        DeltaNet and Mamba layers compute only their last recurrent state: run them token by
        token inside the forward (``kvcore.integrations.transformers_speculative``). Raises
        InvalidArgumentError for ``T`` outside ``[1, max_step]`` or over ``state_slots - 1``,
        InvalidStateError while a forward is under way or a verified step is not committed,
        CapacityError past the capacity. Nothing changes on an error.
        """
        return self._begin_uncommitted("begin_verify", T, lambda: self.sequence.begin_step(T, verify=True))

    def _begin_uncommitted(self, what: str, T: int, begin: Callable[[], Step]) -> Step:
        """Begin the next forward's step with ``begin()``; its last layer will not commit it."""
        if self._forward.step is not None and self._forward.served > 0:
            raise InvalidStateError(
                f"{what}: a forward is under way (layers 0..{self._forward.served - 1} served); finish it "
                f"or call cache.discard_forward()"
            )
        self._check_forward_size(T)
        self._check_no_tree()
        tree = _TreeStep(begin())
        self._forward.begin(lambda: tree)
        self._state_call = None
        self._T = tree.T
        self._layouts = self.pool.plan_step(tree.step)
        self._tree = tree
        return tree.step

    def commit_verify(self, accepted: int) -> None:
        """Keep the first ``accepted`` tokens of the verified ``begin_verify`` step: the length becomes
        ``length + accepted``. Raises InvalidArgumentError for ``accepted`` outside ``[1, T]``,
        InvalidStateError when no verify forward completed since ``begin_verify``; nothing changes
        on an error."""
        tree = self._tree
        if tree is not None and tree.verified and tree.is_current and not 1 <= accepted <= tree.T:
            raise InvalidArgumentError(f"commit_verify({accepted}): keep 1..{tree.T} tokens of the verify step")
        self.commit_tree(list(range(accepted)))

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
                "commit_tree: no verified draft tree or verify step (call begin_tree or begin_verify, run the "
                "forward over every layer, then commit_tree or commit_verify)"
            )
        copies = self.sequence.commit(tree.step, accepted=list(accepted))
        self._tree = None
        self._state_call = None
        if self.state_layers:  # their slot copies are the state slots'; the K/V pool takes the others
            self.state.apply_copies(copies)
        # State layers' copies went to the slots; a placeholder (no attention, no state) holds no rows.
        empty = np.zeros((0, 2), dtype=np.int32)
        copies = [empty if isinstance(layer, (KVCoreStateLayer, KVCoreEmptyLayer)) else c
                  for layer, c in zip(self.layers, copies)]  # fmt: skip
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
        skipped = [i for i in range(len(self.layers)) if i not in self._order]
        text = f"layers 0..{w[-1]}" if w == list(range(len(w))) else f"layers {w}"
        return text + (f" (KV-shared layers {skipped} are never updated)" if skipped else "")

    def _refuse_shared(self, layer_idx: int) -> None:
        """InvalidArgumentError for an update of a KV-shared layer (or an index outside the layers)."""
        n = len(self.layers)
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
            f"{self._n_layers} {'' if len(self.layers) == self._n_layers else 'writing layers '}and "
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


    # --- recurrent-state layers (transformers' linear-attention API) ---------------

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """The cache's length (every layer has it, state layers included)."""
        return self.sequence.length

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

    def state_positions(self, first: int, count: int) -> _StatePositions:
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
        return _StatePositions(self, (first, count), None)

    def tree_node(self, node: int) -> _StatePositions:
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
        return _StatePositions(self, None, node)

    def _verify_step(self) -> Optional[_TreeStep]:
        """The begun verify step (``begin_verify``), its forward under way or done, else None."""
        step = self._forward.step
        if not isinstance(step, _TreeStep):
            step = self._tree
        if step is None or not step.is_current or not step.step.verify or step.step.is_tree:
            return None
        return step

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
        tree = step.step if isinstance(step, _TreeStep) else step
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

    # --- length changes ----------------------------------------------------------------

    def rewind(self, length: int) -> None:
        """Set the length to ``length`` (kvcore's rewind: refused with InvalidStateError into evicted history)."""
        self.sequence.rewind(length)
        self._forward.end()  # rewind ended the begun step
        self._tree = None
        self._state_call = None
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
        """Length 0 (and forwards are plain steps again: ``activate_past_recording``); the tensors stay
        allocated for the next sequence."""
        self.sequence.clear()
        self._verify_forwards = False
        self._forward.end()  # clear ended the begun step
        self._tree = None
        self._state_call = None
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


class _StatePositions:
    """``KVCoreCache.state_positions`` / ``tree_node``: sets the positions or the draft-tree node
    state calls cover, restored on exit."""

    def __init__(self, cache: KVCoreCache, positions: Optional[tuple[int, int]], node: Optional[int]) -> None:
        self._cache = cache
        self._scope = (positions, node)
        self._before: tuple[Optional[tuple[int, int]], Optional[int]] = (None, None)

    def __enter__(self) -> None:
        c = self._cache
        self._before = (c._state_range, c._state_node)
        c._state_range, c._state_node = self._scope

    def __exit__(self, *exc: Any) -> None:
        self._cache._state_range, self._cache._state_node = self._before


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
    ``position_ids`` (optional) covers ``input_ids``: without it and without
    ``attention_mask`` the tokens stand at the cache length onwards, passed to the model
    (some models, Bamba's, would number every forward's tokens from 0). For a
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
    if position_ids is None and attention_mask is None:
        position_ids = torch.arange(start_length, start_length + input_ids.shape[1], device=input_ids.device)[None]
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
    picks the accepted root path and calls ``cache.commit_tree(path)``. Batch of one. On a
    hybrid model the recurrent mixers run node by node inside the forward
    (``kvcore.integrations.transformers_speculative.state_layers_token_by_token``: each node
    reads its parent's state slot and writes its own; ``commit_tree`` copies the accepted
    path's slots). Raises InvalidArgumentError when ``tokens`` and ``parents`` differ in
    length, NotSupportedError for a hybrid whose mixers kvcore cannot run node by node, and
    what ``KVCoreCache.begin_tree`` raises; a forward that raises leaves no step begun.
    """
    if len(tokens) != len(parents):
        raise InvalidArgumentError(f"verify_tree: {len(tokens)} tokens for {len(parents)} parents: one each")
    node_by_node: Any = contextlib.nullcontext()
    if cache.state_layers:  # each node reads its parent's state: the recurrent mixers run node by node
        node_by_node = state_layers_token_by_token(model, cache)  # NotSupportedError before anything begins
    with node_by_node:
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
    "KVCoreEmptyLayer",
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
