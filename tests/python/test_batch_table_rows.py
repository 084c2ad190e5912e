"""Block tables sized by use (issue 19, item 3): ``BatchLimits(max_active_seqs=...)``.

Each group keeps one block table row per active sequence; the plan's ``table_rows`` names
each sequence id's row. Past the bound, making one more sequence active (``add_sequence``,
``add_sequences``, ``fork`` or ``fork_many`` into an inactive one) is a ``CapacityError``
that changes nothing.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

import kvcore
from batch_reference import observable

RING = kvcore.Ring(window=3, sinks=1)


def config(active: int = 2) -> kvcore.CacheConfig:
    layers = [kvcore.LayerConfig(RING, 1, 2), kvcore.LayerConfig(kvcore.Flat(), 1, 2)]
    limits = kvcore.BatchLimits(block_size=2, max_seqs=5, num_blocks=16, max_active_seqs=active)
    return kvcore.CacheConfig(16, layers, max_step=4, batch=limits)


def state(c: kvcore.BatchCache) -> tuple[Any, ...]:
    return observable(c)


def test_limits_carry_the_bound() -> None:
    limits = kvcore.BatchLimits(max_seqs=8, max_active_seqs=3)
    assert limits.max_active_seqs == 3
    assert "max_active_seqs=3" in repr(limits)
    assert kvcore.BatchLimits().max_active_seqs == 0
    assert "max_active_seqs" not in repr(kvcore.BatchLimits())


@pytest.mark.parametrize("bad", [-1, 6])
def test_a_bound_outside_its_range_is_refused_naming_it(bad: int) -> None:
    with pytest.raises(kvcore.InvalidArgumentError, match=f"batch.max_active_seqs = {bad}"):
        kvcore.BatchCache(config(bad))


def test_the_default_row_is_the_sequence_id() -> None:
    c = kvcore.BatchCache(config(0))
    assert c.max_active_seqs == 5
    c.add_sequence(3)
    with c.step([(3, 2)]) as step:
        plan = step.plan()
        assert plan.table_rows.tolist() == [-1, -1, -1, 3, -1]  # an inactive id has no row
        assert plan.groups[0].block_tables.shape == (5, c.table_stride)


def test_rows_are_taken_and_given_back_and_plans_name_them() -> None:
    c = kvcore.BatchCache(config())
    assert (c.max_active_seqs, c.free_table_rows) == (2, 2)
    c.add_sequence(4)
    c.add_sequence(1)
    assert c.free_table_rows == 0
    with c.step([(4, 3), (1, 2)]) as step:
        plan = step.plan()
        rows = plan.table_rows
        assert rows.tolist() == [-1, 1, -1, -1, 0]
        for g in plan.groups:
            tables = g.block_tables
            assert tables.shape == (2, c.table_stride)
            assert not tables.flags.writeable
            # entry 1 (sequence 1) writes its first token into the block its row names
            assert g.slots[3] == tables[rows[1]][0] * 2
    c.release_sequence(4)
    assert c.free_table_rows == 1
    c.fork(1, 0)
    with c.step([(0, 1)]) as step:
        assert step.plan().table_rows[0] == 0  # the row 4 gave back
        assert step.plan().groups[1].block_tables[0][0] >= 0


def cases() -> list[Any]:
    return [
        pytest.param(lambda c: c.add_sequence(3), "add_sequence(3): 2 sequences are active, batch.max_active_seqs = 2",
                     id="add_sequence"),
        pytest.param(lambda c: c.fork(0, 3), "fork(3): 2 sequences are active, batch.max_active_seqs = 2", id="fork"),
        pytest.param(lambda c: c.add_sequences(np.array([3, 4])),
                     "add_sequences: 2 sequences would become active, 0 table rows", id="add_sequences"),
        pytest.param(lambda c: c.fork_many(0, [3]), "fork_many: 1 sequences would become active, 0 table rows",
                     id="fork_many"),
    ]  # fmt: skip


@pytest.mark.parametrize("call, text", cases())
def test_past_the_bound_is_a_capacity_error_that_changes_nothing(
    call: Callable[[kvcore.BatchCache], object], text: str
) -> None:
    c = kvcore.BatchCache(config())
    c.add_sequence(0)
    c.step([(0, 3)]).commit()
    c.add_sequence(1)
    step = c.begin_step([(0, 1)])
    before = state(c)
    with pytest.raises(kvcore.CapacityError) as info:
        call(c)
    assert text in str(info.value), str(info.value)
    assert state(c) == before
    assert step.is_current


def test_many_verbs_past_the_free_rows_change_nothing() -> None:
    c = kvcore.BatchCache(config(3))
    c.add_sequence(0)
    before = state(c)
    with pytest.raises(kvcore.CapacityError, match="3 sequences would become active, 2 table rows are free"):
        c.add_sequences([1, 2, 3])
    with pytest.raises(kvcore.CapacityError, match="3 sequences would become active, 2 table rows are free"):
        c.fork_many(0, [1, 2, 3])
    assert state(c) == before
    c.fork_many(0, [1, 2])  # exactly the free rows
    assert c.free_table_rows == 0


@pytest.mark.parametrize("bound", [0, 5, 4])  # 0: the default, max_active_seqs = max_seqs = 5
def test_free_table_rows_counts_how_many_more_may_become_active_with_or_without_the_bound(bound: int) -> None:
    """batch.md section 2: free_table_rows is max_active_seqs less the active sequences, and
    (section 4) table_rows is -1 for an inactive id, whatever the bound."""
    c = kvcore.BatchCache(config(bound))
    rows = c.max_active_seqs
    assert c.free_table_rows == rows
    c.add_sequences([1, 3])
    assert c.free_table_rows == rows - 2
    c.fork_many(3, [4])
    assert c.free_table_rows == rows - 3
    with c.step([(3, 1)]) as step:
        assert step.plan().table_rows.tolist() == ([-1, 1, -1, 3, 4] if rows == 5 else [-1, 0, -1, 1, 2])
    c.release_sequence(1)
    assert c.free_table_rows == rows - 2
    c.add_sequences([0, 1])
    assert c.free_table_rows == rows - 4
    c.clear()
    assert c.free_table_rows == rows
