"""Docs against code (issue 27, item 7): one rule each where docs/batch.md and docs/trees.md
and the code disagreed or the docs were silent. Each test fails on the behaviour before it.
(free_table_rows and table_rows: test_batch_table_rows.py; the parallel samples' prompt
token: test_hf_batch.py.)
"""

from __future__ import annotations

import copy
from typing import Callable

import numpy as np
import pytest

import kvcore


def batch(layers: list[kvcore.LayerConfig], B: int, max_seqs: int, max_step: int, capacity: int = 32) -> kvcore.BatchCache:
    limits = kvcore.BatchLimits(block_size=B, max_seqs=max_seqs)
    return kvcore.BatchCache(kvcore.CacheConfig(capacity, layers, max_step=max_step, batch=limits))


def ring(window: int) -> list[kvcore.LayerConfig]:
    return [kvcore.LayerConfig(kvcore.Ring(window=window), n_kv_heads=1, head_dim=8)]


# --- an empty array verb ends a begun step, as every successful verb ------------------------


@pytest.mark.parametrize(
    "verb",
    [
        lambda c: c.add_sequences([]),
        lambda c: c.release_sequences([]),
        lambda c: c.fork_many(0, []),
        lambda c: c.add_sequences(np.empty(0, np.int32)),
        lambda c: c.release_sequences(np.empty(0, np.int64)),
        lambda c: c.fork_many(0, np.empty(0, np.int32), 1),
    ],
    ids=["add_sequences", "release_sequences", "fork_many", "add_array", "release_array", "fork_many_upto"],
)
def test_an_empty_array_verb_ends_a_begun_step(verb: Callable[[kvcore.BatchCache], None]) -> None:
    c = batch([kvcore.LayerConfig(kvcore.Flat(), 1, 8)], B=2, max_seqs=3, max_step=2)
    c.add_sequence(0)
    c.step([(0, 2)]).commit()
    free = c.free_blocks(0)
    step = c.begin_step([(0, 2)])  # takes a block
    assert step.is_current and c.free_blocks(0) == free - 1
    verb(c)
    assert not step.is_current  # ended: its block is free again, the lengths as before
    assert c.free_blocks(0) == free and c.length(0) == 2
    assert [c.sequence(s).active for s in range(3)] == [True, False, False]


def test_a_refused_empty_array_verb_leaves_the_begun_step_begun() -> None:
    c = batch([kvcore.LayerConfig(kvcore.Flat(), 1, 8)], B=2, max_seqs=3, max_step=2)
    c.add_sequence(0)
    step = c.begin_step([(0, 1)])
    with pytest.raises(kvcore.InvalidStateError):
        c.fork_many(1, [])  # src not active: refused, nothing changes
    with pytest.raises(kvcore.InvalidArgumentError):
        c.fork_many(0, [], 5)  # upto past the length
    assert step.is_current


def test_an_empty_array_verb_without_a_begun_step_changes_nothing() -> None:
    c = batch([kvcore.LayerConfig(kvcore.Flat(), 1, 8)], B=2, max_seqs=3, max_step=2)
    c.add_sequences([])
    c.release_sequences([])
    assert c.free_table_rows == 3 and not any(c.sequence(s).active for s in range(3))


# --- is_tree: a chain is not a tree however it is given -------------------------------------


def test_a_chain_given_to_begin_tree_is_not_a_tree_as_a_chain_entry_of_a_batch_step() -> None:
    seq = kvcore.SequenceCache(kvcore.CacheConfig(64, [kvcore.LayerConfig(kvcore.Flat(), 1, 8)], max_step=4))
    chain = seq.begin_tree([-1, 0, 1])
    assert not chain.is_tree and "tree=True" not in repr(chain)
    assert seq.active_step is not None and not seq.active_step.is_tree
    assert chain.parents.tolist() == [-1, 0, 1] and chain.chain_index.tolist() == [0, 1, 2]
    chain.commit()  # a chain commits whole, without accepted
    tree = seq.begin_tree([-1, 0, 0])
    assert tree.is_tree and "tree=True" in repr(tree)
    assert seq.active_step is not None and seq.active_step.is_tree
    assert copy.deepcopy(tree).is_tree
    assert not seq.begin_step(2).is_tree

    b = batch([kvcore.LayerConfig(kvcore.Flat(), 1, 8)], B=2, max_seqs=2, max_step=4)
    b.add_sequences([0, 1])
    plan = b.begin_step([(0, 3, [1, 2, 3], [-1, 0, 1]), (1, 3, [1, 2, 3], [-1, 0, 0])]).plan()
    assert [plan.is_tree(0), plan.is_tree(1)] == [chain.is_tree, tree.is_tree] == [False, True]


# --- a rewind to the first position of the block being filled keeps naming ------------------


def test_a_rewind_to_the_first_position_of_the_block_being_filled_keeps_naming_on_a_window_1_ring() -> None:
    """batch.md section 5: the first position of the block being filled is also a block
    boundary; the "block being filled" clause wins, so naming goes on although no group holds
    the block before it (a window-1 ring gave it back)."""
    c = batch(ring(1), B=2, max_seqs=2, max_step=1)
    c.add_sequence(0)
    for t in [1, 2, 3, 4, 5]:
        c.step([(0, 1, [t])]).commit()
    assert c.block_table(0, 0).tolist()[:2] == [-1, -1]  # blocks 0 and 1 given back (cached)
    c.rewind(0, 4)  # the first position of block 2, the block being filled
    for t in [9, 10]:
        c.step([(0, 1, [t])]).commit()  # fills block 2: named only if seq 0 still names
    c.add_sequence(1)
    # Block 2 is what a query at 6 needs; it is found by its name. Had seq 0 stopped naming,
    # the hit would stop at 4 (block 1, cached by name).
    assert c.adopt_prefix(1, [1, 2, 3, 4, 9, 10, 11]) == 6
    assert c.block_table(1, 0).tolist()[2] == c.block_table(0, 0).tolist()[2]


# --- two sequences that compute one prompt keep one copy ------------------------------------


def test_two_sequences_computing_one_prompt_share_one_copy_that_one_commit_copies_and_passes() -> None:
    """batch.md section 5, copies: the commit that fills a block whose content the group already
    keeps (held or cached) gives the block back unnamed and shares that copy; one commit that
    both copies it (a write after a rewind) and passes it (a window) leaves it cached once."""
    c = batch(ring(1), B=2, max_seqs=3, max_step=2)
    for s in (0, 1):  # both compute [1, 2, 3, 4]: the second commit trades its copy for the first's
        c.add_sequence(s)
        c.step([(s, 2, [1, 2])]).commit()
        c.step([(s, 2, [3, 4])]).commit()
    shared = c.block_table(0, 0).tolist()[1]
    assert c.block_table(1, 0).tolist()[1] == shared
    assert c.cached_blocks(0) == 1 and c.free_blocks(0) == c.num_blocks(0) - 1  # [1, 2] cached, [3, 4] held once
    c.rewind(0, 3)
    # One commit releases it twice: seq 0 writes into it (a copy; the source goes at commit),
    # seq 1's window passes it.
    step = c.begin_step([(0, 1, [7]), (1, 2, [5, 6])])
    assert step.plan().groups[0].copies.tolist() == [[shared, step.plan().groups[0].copies.tolist()[0][1]]]
    step.commit()
    assert c.cached_blocks(0) == 2  # [1, 2] and [3, 4]
    c.add_sequence(2)
    assert c.adopt_prefix(2, [1, 2, 3, 4, 8]) == 4
    assert c.block_table(2, 0).tolist()[1] == shared
