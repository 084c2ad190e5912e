"""The order the byte layers move bytes in within one call, from Python.

PagedKVPool.update performs a step's copy-on-write block copies before it
writes the step's rows (the new token lands in the copy); KVPool.write of a
wrapped step (two runs) whose input is a view of the pool's own rows copies
first the run whose destination the other run's input does not cover. Each
expectation is written out from the rows' contents before the call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import kvcore

Array = npt.NDArray[Any]


def rows(values: Sequence[float], dim: int = 2) -> Array:
    return np.repeat(np.asarray(values, np.float32)[:, None, None], dim, axis=2)


def test_paged_update_copies_the_shared_block_before_writing_the_new_token_into_the_copy() -> None:
    batch = kvcore.BatchLimits(block_size=4, max_seqs=2, num_blocks=0, max_holes=4)
    cache = kvcore.BatchCache(kvcore.CacheConfig(32, [kvcore.LayerConfig(kvcore.Flat(), 1, 2)], max_step=4, batch=batch))
    pool = kvcore.PagedKVPool(cache, np.float32, initial_rows=0)
    cache.add_sequence(0)
    for values in ([1, 2, 3, 4], [5, 6]):  # block 1 holds positions 4, 5 and two empty rows
        with cache.step([(0, len(values))]) as step:
            pool.update(0, step, rows(values), -rows(values))
    cache.fork(0, 1)  # sequence 1 shares the partly filled block
    with cache.step([(1, 1)]) as step:  # only sequence 1 writes: it gets a private copy
        copies = step.plan().groups[0].copies
        assert copies.shape == (1, 2)
        k_rows, v_rows = pool.update(0, step, rows([7]), -rows([7]))
        k, v, positions = pool.gather(0, step, 0)
        assert positions.tolist() == list(range(7))
        assert k[:, 0, 0].tolist() == [1, 2, 3, 4, 5, 6, 7]
        assert v[:, 0, 0].tolist() == [-1, -2, -3, -4, -5, -6, -7]
        src, dst = (int(x) for x in copies[0])
        # The copy holds the shared rows and then the token; the shared block is untouched.
        assert k_rows[dst * 4 : dst * 4 + 3, 0, 0].tolist() == [5, 6, 7]
        assert k_rows[src * 4 : src * 4 + 3, 0, 0].tolist() == [5, 6, 0]


@pytest.mark.parametrize(
    ("first", "after"),
    [
        # Rows 4, 5: run 0 (row 5 <- row 4) overwrites run 1's input: run 1 goes first.
        (4, [15, 11, 12, 13, 14, 14]),
        # Rows 0, 1: run 1 (row 0 <- row 1) overwrites run 0's input: plan order.
        (0, [11, 11, 12, 13, 14, 10]),
        # Rows 2, 3: neither run writes them.
        (2, [13, 11, 12, 13, 14, 12]),
    ],
    ids=["overlaps-the-first-runs-destination", "overlaps-the-second-runs-destination", "apart"],
)
def test_kvpool_write_from_a_view_of_its_own_rows_copies_the_input_as_it_was(first: int, after: list[int]) -> None:
    # Ring W=3, C=4: R = 6 rows; positions 0..5 hold 10..15 in rows 0..5. Rewound
    # to 5, a step of 2 writes position 5 to row 5 (run 0) and 6 to row 0 (run 1).
    cache = kvcore.SequenceCache(kvcore.CacheConfig(32, kvcore.LayerConfig(kvcore.Ring(3), 1, 2), max_step=4))
    pool = kvcore.KVPool(cache, np.float32)
    for values in ([10, 11, 12, 13], [14, 15]):
        with cache.step(len(values)) as step:
            k_held, v_held, _ = pool.update(0, step, rows(values), -rows(values))
    assert k_held.shape[0] == 6 and not k_held.flags.owndata  # a view of rows 0..5
    cache.rewind(5)
    step = cache.begin_step(2)
    plan = step.plan(0)
    assert [tuple(r) for r in plan.write] == [(5, 1, 5), (0, 1, 6)]
    pool.write(0, plan, k_held[first : first + 2], v_held[first : first + 2])
    assert k_held[:, 0, 0].tolist() == after
    assert v_held[:, 0, 0].tolist() == [-x for x in after]
