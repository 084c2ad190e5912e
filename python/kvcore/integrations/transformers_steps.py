"""The step of one forward through a ``KVCoreCache``: ``ForwardSteps`` begins, joins and ends it.

A forward of ``T`` tokens is one kvcore step. It is begun by ``attention_masks``,
``begin_verify``, ``begin_tree`` or by layer 0 (its update, or its first state call for a
state layer; layer 0 replaces a step an interrupted forward left unfinished, unless it is
the very step it needs); ``get_mask_sizes`` begins nothing (it previews the step's plan).
Every layer must then follow in order with the same ``T``, and the last layer commits the
step; an error in a layer aborts it (``kvcore.forward_step.ForwardStep`` keeps these
rules). A forward that stopped part-way is either retried (the same ``T`` at the same
length) or refused, and ``discard_forward`` drops it. A forward may carry at most
``max_step`` tokens.

``TreeStep`` is a step whose forward's last layer does not commit it: a draft tree or a
verify step, committed by ``commit_tree`` / ``commit_verify``
(``kvcore.integrations.transformers_trees``).

``ForwardSteps`` is a base class of ``KVCoreCache`` (``kvcore.integrations.transformers_cache``),
whose constructor sets the attributes it declares; it is not used alone.
"""

from __future__ import annotations

from typing import Any, Optional, Union

from kvcore._core import SequenceCache, Step
from kvcore._errors import InvalidArgumentError, InvalidStateError
from kvcore.forward_step import ForwardStep
from kvcore.integrations.transformers_layers import KVCoreStateLayer
from kvcore.torch.pool import TorchKVPool
from kvcore.torch.state_slots import SlotSpan
from kvcore.torch.step_layout import StepLayout


class TreeStep:
    """A draft tree's (or verify step's) kvcore step as a forward sees it: the forward's last layer
    "commits" it by marking it verified (kvcore commits a tree only with its accepted path:
    ``KVCoreCache.commit_tree``)."""

    def __init__(self, step: Step) -> None:
        self.step = step
        self.verified = False

    @property
    def T(self) -> int:
        """The step's token count (nodes of a tree)."""
        return self.step.T

    @property
    def position(self) -> int:
        """The length the step begins at."""
        return self.step.position

    @property
    def is_current(self) -> bool:
        """Whether the step is still its cache's begun step."""
        return self.step.is_current

    def plan(self, layer: int) -> Any:
        """The kvcore step's plan of ``layer``."""
        return self.step.plan(layer)

    def mask(self, layer: int, *, order: str = "rows") -> Any:
        """The kvcore step's visibility mask of ``layer``."""
        return self.step.mask(layer, order=order)

    def commit(self) -> None:
        """Mark the step verified: its forward's last layer was served (``commit_tree`` commits it)."""
        self.verified = True

    def abort(self) -> None:
        """Abort the kvcore step."""
        self.step.abort()


class ForwardSteps:
    """The step of one forward, as ``KVCoreCache`` begins, joins and ends it (see the module docstring)."""

    # Set by KVCoreCache.__init__ (kvcore.integrations.transformers_cache).
    sequence: SequenceCache
    pool: TorchKVPool
    layers: list[Any]
    state_layers: list[KVCoreStateLayer]
    writing_layers: list[int]  # the layers a forward updates, in order
    _n_layers: int  # len(writing_layers)
    _order: dict[int, int]  # writing layer -> its place in a forward
    # The forward under way: layer 0 begins its step, the last writing layer commits it, an
    # error while a layer is served aborts it (kvcore.forward_step).
    _forward: ForwardStep[Union[Step, TreeStep]]
    _T: int  # the begun step's T
    _layouts: list[StepLayout]  # the begun step's layouts, per policy
    _tree: Optional[TreeStep]  # a draft tree's (or verify) step between its forward and commit_tree
    _stopped_at: Optional[int]  # where the last unfinished forward stopped (a layer index)
    _state_call: Optional[tuple[int, int, SlotSpan]]  # state layers: the layer served, the served count, its slots
    # (length, T) of the last get_mask_sizes: the token count of a forward whose first layer
    # holds a state (a state call carries no token count).
    _mask_hint: Optional[tuple[int, int]]
    _verify_forwards: bool  # activate_past_recording: forwards of T <= state_slots - 1 are verify steps
    _max_verify_T: int

    def _begin(self, T: int) -> Union[Step, TreeStep]:
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


__all__ = ["ForwardSteps", "TreeStep"]
