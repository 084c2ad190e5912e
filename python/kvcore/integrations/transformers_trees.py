"""Draft trees and verify steps through a ``KVCoreCache``: ``DraftTrees`` begins and commits them.

Draft trees (docs/trees.md): ``cache.begin_tree(parents)`` makes the next forward a tree
step of ``N = len(parents)`` tokens (token ``i`` at position ``length + depth(i)``; pass
``position_ids=step.positions`` and the tree's masks from ``cache.attention_masks(model.config,
N)``, as ``kvcore.integrations.transformers_speculative.verify_tree`` does); the last layer
does not commit it, and ``cache.commit_tree(accepted)`` commits the accepted root path and
performs the row copies it returns. A verify step (``begin_verify``) is a chain: its
recurrent-state layers keep the state after each of its tokens, and ``commit_verify(n)``
keeps its first ``n``.

``DraftTrees`` is a base class of ``KVCoreCache`` (``kvcore.integrations.transformers_cache``);
it is not used alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Callable, Optional

import numpy as np

from kvcore._core import Step
from kvcore._errors import InvalidArgumentError, InvalidStateError
from kvcore.integrations.transformers_layers import KVCoreEmptyLayer, KVCoreStateLayer
from kvcore.integrations.transformers_steps import ForwardSteps, TreeStep
from kvcore.torch.state_slots import TorchStateSlots


class DraftTrees(ForwardSteps):
    """The draft-tree and verify steps of ``KVCoreCache`` (see the module docstring)."""

    state: TorchStateSlots  # the recurrent-state layers' slots (set by KVCoreCache.__init__)

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
        tree = TreeStep(begin())
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

    def _verify_step(self) -> Optional[TreeStep]:
        """The begun verify step (``begin_verify``), its forward under way or done, else None."""
        step = self._forward.step
        if not isinstance(step, TreeStep):
            step = self._tree
        if step is None or not step.is_current or not step.step.verify or step.step.is_tree:
            return None
        return step


__all__ = ["DraftTrees"]
