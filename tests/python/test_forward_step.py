"""kvcore.forward_step: the step of one forward, shared by the transformers
cache and both ExecuTorch caches. A fake step records what the helper asks of kvcore;
the integrations' own tests (test_transformers_cache.py, test_executorch_op.py) run it
against real caches."""

from __future__ import annotations

import pytest

import kvcore
from kvcore.forward_step import ForwardStep


class FakeStep:
    """A kvcore step that records commit and abort, and refuses both once it ended."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.is_current = True

    def commit(self) -> None:
        assert self.is_current, "commit of an ended step"
        self.log.append("commit")
        self.is_current = False

    def abort(self) -> None:
        assert self.is_current, "abort of an ended step"
        self.log.append("abort")
        self.is_current = False


def test_the_last_layer_commits_and_ends_the_forward() -> None:
    forward: ForwardStep[FakeStep] = ForwardStep(3, commit_after=3)
    step = forward.begin(FakeStep)
    assert [forward.serve(layer, lambda: layer * 10) for layer in (0, 1)] == [0, 10]
    assert step.log == [] and forward.served == 2 and not forward.committed
    forward.serve(2, lambda: None)
    assert step.log == ["commit"] and forward.step is None and forward.served == 0


def test_a_cell_cache_commits_at_its_first_layer() -> None:
    forward: ForwardStep[FakeStep] = ForwardStep(3, commit_after=1)
    step = forward.begin(FakeStep)
    forward.serve(1, lambda: None)
    assert step.log == ["commit"] and forward.committed and forward.step is step
    with pytest.raises(RuntimeError):
        forward.serve(0, lambda: (_ for _ in ()).throw(RuntimeError("bad layer 0")))
    assert step.log == ["commit"]  # committed: an error after it aborts nothing
    forward.serve(0, lambda: None)  # the failed layer was not served: it may come again
    forward.serve(2, lambda: None)
    assert forward.step is None


@pytest.mark.parametrize("layer", [0, 1])
def test_an_error_while_a_layer_is_served_aborts_the_step(layer: int) -> None:
    forward: ForwardStep[FakeStep] = ForwardStep(2, commit_after=2)
    step = forward.begin(FakeStep)
    if layer:
        forward.serve(0, lambda: None)

    def bad() -> None:
        raise kvcore.InvalidArgumentError(f"layer {layer}: bad K/V")

    with pytest.raises(kvcore.InvalidArgumentError, match=f"layer {layer}: bad K/V"):
        forward.serve(layer, bad)
    assert step.log == ["abort"] and forward.step is None and forward.served == 0
    with pytest.raises(kvcore.InvalidStateError, match="no forward is under way"):
        forward.serve(1, lambda: None)


def test_a_layer_served_twice_is_refused_and_changes_nothing() -> None:
    forward: ForwardStep[FakeStep] = ForwardStep(2, commit_after=2)
    step = forward.begin(FakeStep)
    forward.serve(0, lambda: None)
    with pytest.raises(kvcore.InvalidStateError, match="layer 0 served twice in one forward"):
        forward.serve(0, lambda: None)
    assert step.log == [] and forward.served == 1 and forward.step is step


def test_a_retry_replaces_the_forward_and_a_refused_begin_changes_nothing() -> None:
    forward: ForwardStep[FakeStep] = ForwardStep(2, commit_after=2)
    first = forward.begin(FakeStep)
    forward.serve(0, lambda: None)

    def refused() -> FakeStep:
        raise kvcore.CapacityError("begin_step: refused")

    with pytest.raises(kvcore.CapacityError):
        forward.begin(refused)
    assert forward.step is first and forward.served == 1 and first.log == []  # as kvcore: nothing changed
    retry = forward.begin(FakeStep)  # kvcore's begin_step replaced the first step
    assert forward.step is retry and forward.served == 0


def test_abort_skips_a_step_a_verb_already_ended() -> None:
    forward: ForwardStep[FakeStep] = ForwardStep(2, commit_after=2)
    step = forward.begin(FakeStep)
    step.is_current = False  # a rewind or a sequence verb ended it
    forward.abort()
    assert step.log == [] and forward.step is None


def test_commit_after_must_be_a_layer_count() -> None:
    for bad in (0, 3):
        with pytest.raises(kvcore.InvalidArgumentError, match=f"commit_after = {bad}: must be in \\[1, n_layers = 2\\]"):
            ForwardStep(2, commit_after=bad)
