"""abort(step): a failed forward ends its step without a commit.

A BatchCache is then exactly as before begin_step (lengths, block tables,
blocks held, free and cached counts, rewind answers); a SequenceCache keeps its
length and counts the step's rows as written (DESIGN.md section 2: a begun
step's rows may have been written), so its rewind answers stay the begun
step's. A stale, foreign or repeated abort raises InvalidStateError and changes
nothing. Expectations come from those rules, not from running the code.
"""

from __future__ import annotations

from typing import Any

import pytest

import kvcore
from batch_reference import observable


def batch_cache() -> kvcore.BatchCache:
    layers = [kvcore.LayerConfig(kvcore.Ring(3, 1), 1, 2), kvcore.LayerConfig(kvcore.Flat(), 1, 2)]
    # One pool for both groups: the flat layer's 16 blocks and as many for the ring's windows.
    limits = kvcore.BatchLimits(block_size=2, max_seqs=4, num_blocks=32)
    return kvcore.BatchCache(kvcore.CacheConfig(32, layers, max_step=4, batch=limits))


def batch_state(c: kvcore.BatchCache) -> tuple[Any, ...]:
    rewinds = tuple(c.can_rewind(s, n) for s in range(c.max_seqs) for n in range(-1, c.length(s) + 2))
    return observable(c), rewinds


def seq_cache() -> kvcore.SequenceCache:
    layers = [kvcore.LayerConfig(kvcore.Ring(4, 1), 1, 2), kvcore.LayerConfig(kvcore.Flat(), 1, 2)]
    return kvcore.SequenceCache(kvcore.CacheConfig(64, layers, max_step=4))


def test_batch_abort_leaves_the_cache_exactly_as_before_the_step() -> None:
    c = batch_cache()
    c.add_sequence(0)
    for t in range(3):
        c.step([(0, 4, [4 * t + j for j in range(4)])]).commit()
    c.step([(0, 1, [12])]).commit()  # length 13: ring blocks released behind the window
    c.fork(0, 1)  # shares the partly filled block of 12
    c.add_sequence(2)
    before = batch_state(c)
    step = c.begin_step([(0, 3), (1, 1), (2, 4, [7, 8, 9, 10])])
    planned = [(g.slots.tolist(), g.copies.tolist()) for g in step.plan().groups]
    assert any(len(copies) for _, copies in planned)  # copy-on-write of the shared block
    assert batch_state(c) != before  # the step took blocks
    c.abort(step)
    assert not step.is_current
    assert batch_state(c) == before
    with pytest.raises(kvcore.InvalidStateError, match="no step is begun"):
        step.commit()
    again = c.begin_step([(0, 3), (1, 1), (2, 4, [7, 8, 9, 10])])
    assert [(g.slots.tolist(), g.copies.tolist()) for g in again.plan().groups] == planned
    again.commit()
    assert [c.length(s) for s in range(3)] == [16, 14, 4]


def test_batch_step_abort_method_equals_cache_abort() -> None:
    c = batch_cache()
    c.add_sequence(0)
    before = batch_state(c)
    step = c.begin_step([(0, 2, [1, 2])])
    step.abort()
    assert batch_state(c) == before and c.length(0) == 0


def test_batch_abort_of_a_stale_foreign_or_repeated_step_changes_nothing() -> None:
    c, other = batch_cache(), batch_cache()
    for cache in (c, other):
        cache.add_sequence(0)
    committed = c.step([(0, 2)])
    committed.commit()
    foreign = other.begin_step([(0, 1)])
    step = c.begin_step([(0, 1)])
    begun = batch_state(c)
    with pytest.raises(kvcore.InvalidStateError, match=r"step \d+: not the begun step"):
        c.abort(committed)
    with pytest.raises(kvcore.InvalidStateError, match="abort: the step belongs to another cache"):
        c.abort(foreign)
    assert batch_state(c) == begun and step.is_current and foreign.is_current
    c.abort(step)
    with pytest.raises(kvcore.InvalidStateError, match=r"step \d+: no step is begun"):
        c.abort(step)
    with pytest.raises(kvcore.InvalidStateError, match=r"no step is begun"):
        step.abort()


def test_sequence_abort_keeps_the_length_and_counts_the_rows_as_written() -> None:
    c = seq_cache()
    for _ in range(3):
        c.step(4).commit()  # 12 positions: the ring (4 + 4 - 1 rows after 1 sink) wrapped
    at_rest = [c.can_rewind(n) for n in range(14)]
    step = c.begin_step(4)
    plans = [step.plan(layer) for layer in range(c.n_layers)]
    begun = [c.can_rewind(n) for n in range(14)]
    assert begun != at_rest  # the step's rows overwrote history a rewind needed
    c.abort(step)
    assert c.length == 12 and c.active_step is None and not step.is_current
    assert [c.can_rewind(n) for n in range(14)] == begun
    retry = c.begin_step(4)
    assert [retry.plan(layer) for layer in range(c.n_layers)] == plans
    retry.commit()
    assert c.length == 16


def test_sequence_abort_of_a_stale_foreign_or_repeated_step_changes_nothing() -> None:
    c, other = seq_cache(), seq_cache()
    done = c.step(2)
    done.commit()
    foreign = other.begin_step(1)
    step = c.begin_step(3)
    with pytest.raises(kvcore.InvalidStateError, match="not the begun step"):
        c.abort(done)
    with pytest.raises(kvcore.InvalidStateError, match="abort: the step belongs to another cache"):
        c.abort(foreign)
    assert c.length == 2 and step.is_current and foreign.is_current
    step.abort()
    with pytest.raises(kvcore.InvalidStateError, match="no step is begun"):
        step.abort()
    assert c.length == 2 and c.active_step is None
