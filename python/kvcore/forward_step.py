"""One forward of a model through a kvcore cache, layer by layer: the step logic every
integration shares (the transformers cache and both ExecuTorch caches).

A model's forward is one kvcore step, and its attention layers update the cache one
after another. ``ForwardStep`` keeps the rules of that in one place:

- the first layer begins the step (``begin``), once its input is validated; a step
  an unfinished forward left begun is replaced (kvcore's retry path: ``begin_step``
  replaces a begun step);
- every layer is served once per forward (``serve``); its K/V are validated (shapes,
  dtypes) before its rows are written, and before the step commits;
- the step commits once ``commit_after`` layers were served: every layer for one
  sequence (its length changes only when the whole forward succeeded), or the first
  for ExecuTorch's cell cache (its reference claims a step's cells at the first
  layer, and ExecuTorch's suite runs steps that serve one layer only);
- an error while a layer is served aborts the step unless it committed, so a failed
  forward leaves the cache as it was before the forward began (kvcore's ``abort``:
  lengths, block tables and counts; a ``SequenceCache`` still counts the aborted
  step's rows as written for ``can_rewind``, since the backend may have written them).

It holds no bytes and knows nothing of torch: the integration validates and writes
inside the callable it passes to ``serve``.
"""

from __future__ import annotations

from typing import Any, Callable, Generic, Optional, Protocol, TypeVar

from kvcore._errors import InvalidArgumentError, InvalidStateError


class KVStep(Protocol):
    """What ForwardStep needs of a kvcore step (``kvcore.Step`` or ``kvcore.BatchStep``)."""

    @property
    def is_current(self) -> bool:
        """Whether the step is still its cache's begun step."""

    def commit(self) -> None:
        """Commits the step."""

    def abort(self) -> None:
        """Ends the step without committing it."""


S = TypeVar("S", bound=KVStep)
R = TypeVar("R")


class ForwardStep(Generic[S]):
    """The kvcore step of the forward under way and the layers it served (see the module docstring).

    ``n_layers``: layers a forward serves; ``commit_after``: how many of them must be
    served before the step commits (``n_layers``, or 1 for a cache that claims its
    rows at the first layer). Raises InvalidArgumentError for a ``commit_after`` outside
    ``[1, n_layers]``.
    """

    def __init__(self, n_layers: int, commit_after: int) -> None:
        if not 1 <= commit_after <= n_layers:
            raise InvalidArgumentError(f"commit_after = {commit_after}: must be in [1, n_layers = {n_layers}]")
        self.n_layers = n_layers
        self.commit_after = commit_after
        self._step: Optional[S] = None
        self._served: set[int] = set()
        self._committed = False

    @property
    def step(self) -> Optional[S]:
        """The forward's step while it is under way (begun, not every layer served), else None."""
        return self._step

    @property
    def committed(self) -> bool:
        """Whether the forward under way already committed its step (``commit_after`` layers served)."""
        return self._committed

    @property
    def served(self) -> int:
        """Layers the forward under way has served."""
        return len(self._served)

    def is_served(self, layer: int) -> bool:
        """Whether ``layer`` was served in the forward under way."""
        return layer in self._served

    def begin(self, begin: Callable[[], S]) -> S:
        """Starts a forward: ``begin()`` gives its kvcore step (a new one, which replaces a
        step an unfinished forward left begun, or that very step for its retry), after
        the caller validated the first layer's input. When ``begin()`` raises, nothing
        here changes (kvcore's refusals change nothing either)."""
        step = begin()
        self._step, self._served, self._committed = step, set(), False
        return step

    def serve(self, layer: int, write: Callable[..., R], *args: Any) -> R:
        """Serves ``layer`` of the forward under way: ``write(*args)`` validates the layer's K/V
        and writes its rows; then the layer counts as served, and the step commits when
        ``commit_after`` layers were. Any error from ``write()`` propagates; before the
        commit it aborts the step (the forward is over), after it the layer is not served. InvalidStateError (nothing changes): no forward under
        way, or ``layer`` already served in it."""
        step = self._step
        if step is None:
            raise InvalidStateError(f"layer {layer}: no forward is under way (its first layer begins each)")
        if layer in self._served:
            raise InvalidStateError(f"layer {layer} served twice in one forward")
        try:
            out = write(*args)  # args, not a closure: one call fewer per layer on the hot path
        except BaseException:
            if not self._committed:  # after the commit the forward goes on: that layer may come again
                self.abort()
            raise
        self._served.add(layer)
        if not self._committed and len(self._served) >= self.commit_after:
            step.commit()
            self._committed = True
        if len(self._served) == self.n_layers:
            self.end()
        return out

    def abort(self) -> None:
        """Ends the forward under way: its step is aborted unless it committed or a verb
        already ended it, so the cache is as before the forward began."""
        step = self._step
        if step is not None and not self._committed and step.is_current:
            step.abort()
        self.end()

    def end(self) -> None:
        """Forgets the forward under way without touching the cache (after a verb such as
        rewind, reset or a sequence verb, which ends a begun step itself)."""
        self._step, self._served, self._committed = None, set(), False


__all__ = ["ForwardStep", "KVStep"]
