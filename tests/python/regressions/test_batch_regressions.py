"""Regressions found by the Python tests of BatchCache (issue 12), each kept as
the shortest call sequence that showed it.

1. An abandoned step's copy-on-write. A step that writes into a block a fork
   shares gets a private block and a copy (src, dst) the backend makes before
   writing. When that step was abandoned (replaced by a retry, or ended by a
   rewind or any other verb) the sequence kept the private block, but nothing
   says the backend ever made the copy (docs/design.md section 2: the backend *may*
   write any time after begin_step; a retry replaces an uncommitted step): the
   retry's plan had no copy, and the sequence read garbage for the positions it
   had shared. And when both holders of the shared block were in the step, the
   second wrote into the shared block in place, so giving the first its block
   back would have been wrong too. Now a step keeps every block it copies from
   until it commits (no entry writes into it), and an abandoned step gives each
   sequence its shared block back. In general an abandoned step now leaves
   every block table as it was: a fresh block it gave a sequence at the index
   of its first new position (one whose earlier positions were all removed)
   was kept before, held for no position the sequence sees.
2. A rewind below a removed head left the sequence's first held block index
   where the removal had put it, above the blocks the next steps wrote: a fork
   of the sequence skipped them (its queries found holes where their keys
   were) and oldest_held() named a later position than the oldest held. A fork
   passed the same stale index on to its new sequence (fork(src, dst, 0) of a
   sequence with a removed head), with the same effect on the fork's forks.
   Also: a removed head moved that index past every block entirely below the
   head's end, and past the block the head's end lies in as well; when that
   block had been released (by a ring's window) and was written again after a
   rewind, a fork skipped it, and its queries found a hole where a key in
   their window was.
   And a truncation whose last, partly kept block held only removed positions
   kept that block (the sequence holds no position in it: it goes back), as
   did a fork whose last inherited block held only positions removed from it.
3. fork(src, dst) and adopt_prefix(seq) refused an empty sequence that a
   begun step had given blocks ("dst holds 0 positions; it must be empty"),
   although the call ends that step and its blocks go back: a runner that
   begins a prefill, abandons it and then adopts a cached prefix was refused.
4. A step that replaced a begun one was admitted against the pools as they
   were with the begun step's blocks still taken, although replacing it gives
   them back: a retry over other sequences (a scheduler that preempts one and
   tries again) was refused with blocks to spare. Admission now judges the
   tables as ending the begun step leaves them.
5. `cache.sequence(seq)` returned a SequenceInfo whose holes pointed into the
   cache's table: it changed under later calls and read freed memory after the
   cache was gone. It is a copy now.
6. `begin_step(entries)` walked `entries` twice, so a generator lost every
   entry's tokens (no prefix could be reused), and a non-integer seq, T or token
   raised pybind11's RuntimeError("Unable to cast ...") instead of a TypeError
   naming the field.
"""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest

import kvcore

B = 4  # rows per block of cache()


def cache(*policies: kvcore.LayerPolicy, num_blocks: int = 16) -> kvcore.BatchCache:
    layers = [kvcore.LayerConfig(p, 1, 2) for p in policies or (kvcore.Flat(),)]
    limits = kvcore.BatchLimits(block_size=B, max_seqs=4, num_blocks=num_blocks)
    return kvcore.BatchCache(kvcore.CacheConfig(32, layers, max_step=4, batch=limits))


class Rows:
    """A byte layer that stores one number per row: the tag written there."""

    def __init__(self, c: kvcore.BatchCache) -> None:
        self.B = c.block_size
        self.rows = [np.full(c.num_blocks(g) * self.B, -1, np.int64) for g in range(c.n_groups)]

    def apply(self, plan: kvcore.BatchStepPlan, tags: list[int], copies: bool = True, writes: bool = True) -> None:
        for g, group in enumerate(plan.groups):
            if copies:
                for src, dst in group.copies.tolist():
                    self.rows[g][dst * self.B : (dst + 1) * self.B] = self.rows[g][src * self.B : (src + 1) * self.B]
            if writes:
                self.rows[g][group.slots] = tags

    def read(self, plan: kvcore.BatchStepPlan, entry: int, group: int = 0) -> list[int]:
        """What entry `entry` reads at positions 0 .. context_lens[entry] - 1."""
        seq = int(plan.seq_ids[entry])
        table = plan.groups[group].block_tables[seq]
        B = self.B
        return [int(self.rows[group][table[k // B] * B + k % B]) for k in range(int(plan.context_lens[entry]))]


def step(c: kvcore.BatchCache, rows: Rows, entries: list[Any], tags: list[int], **how: Any) -> kvcore.BatchStep:
    s = c.begin_step(entries)
    rows.apply(s.plan(), tags, **how)
    return s


@pytest.mark.parametrize("applied", ["nothing", "copies", "all"])
@pytest.mark.parametrize("then", ["retry", "rewind", "remove", "add"])
def test_an_abandoned_copy_on_write_step_leaves_the_fork_its_rows(applied: str, then: str) -> None:
    c = cache()
    rows = Rows(c)
    c.add_sequence(0)
    step(c, rows, [(0, 3)], [100, 101, 102]).commit()
    c.fork(0, 1)  # shares the partly filled block 0
    how = {"nothing": {"copies": False, "writes": False}, "copies": {"writes": False}, "all": {}}[applied]
    abandoned = step(c, rows, [(1, 1)], [900], **how)
    assert abandoned.plan().groups[0].copies.tolist() != []
    if then == "rewind":
        c.rewind(1, 2)
    elif then == "remove":
        c.remove(1, 5)  # past the end: nothing removed, but the step is over
    elif then == "add":
        c.add_sequence(2)
    retry = c.begin_step([(1, 1)])
    assert not abandoned.is_current
    plan = retry.plan()
    rows.apply(plan, [200])
    expected = {"rewind": [100, 101, 200]}.get(then, [100, 101, 102, 200])
    assert rows.read(plan, 0) == expected
    retry.commit()
    # The source sequence was never touched.
    s0 = step(c, rows, [(0, 1)], [103])
    assert rows.read(s0.plan(), 0) == [100, 101, 102, 103]


@pytest.mark.parametrize("applied", ["nothing", "copies", "all"])
def test_an_abandoned_step_over_both_holders_of_a_shared_block_leaves_both_their_rows(applied: str) -> None:
    c = cache(kvcore.Flat(), kvcore.Ring(3, 1))
    rows = Rows(c)
    c.add_sequence(0)
    step(c, rows, [(0, 4)], [100, 101, 102, 103]).commit()
    step(c, rows, [(0, 2)], [104, 105]).commit()
    c.fork(0, 1, 5)  # shares block 1, where 0 holds 4, 5 and 1 holds 4
    how = {"nothing": {"copies": False, "writes": False}, "copies": {"writes": False}, "all": {}}[applied]
    free = [c.free_blocks(g) for g in range(c.n_groups)]
    abandoned = step(c, rows, [(0, 1), (1, 2)], [906, 905, 906], **how)
    c.rewind(0, 6)  # ends the step (a rewind to the length itself)
    assert not abandoned.is_current
    assert [c.free_blocks(g) for g in range(c.n_groups)] == free  # nothing leaked
    for seq, history in ((0, [100, 101, 102, 103, 104, 105]), (1, [100, 101, 102, 103, 104])):
        s = c.begin_step([(seq, 1)])
        plan = s.plan()
        rows.apply(plan, [300 + seq])
        for g in range(c.n_groups):
            policy = c.group_policy(g)
            got = rows.read(plan, 0, g)
            q = len(history)
            for k, tag in enumerate(history):
                if not policy.is_ring or q - k < policy.window or k < policy.sinks:
                    assert got[k] == tag, (seq, g, k)
        s.commit()


@pytest.mark.parametrize("policy", [kvcore.Flat(), kvcore.Ring(7, 1)], ids=repr)
def test_a_fork_after_a_rewind_below_a_removed_head_inherits_every_block(policy: kvcore.LayerPolicy) -> None:
    layer = kvcore.LayerConfig(policy, 1, 2)
    c = kvcore.BatchCache(kvcore.CacheConfig(55, layer, max_step=4, batch=kvcore.BatchLimits(block_size=1, max_seqs=3)))
    rows = Rows(c)
    c.add_sequence(2)
    step(c, rows, [(2, 4)], [0, 1, 2, 3]).commit()
    step(c, rows, [(2, 1)], [4]).commit()
    c.remove(2, 0, 4)  # the head: positions 0..3 and their blocks go
    c.rewind(2, 2)
    step(c, rows, [(2, 4)], [12, 13, 14, 15]).commit()  # positions 2..5 again
    assert c.oldest_held(2, 0) == 2
    c.fork(2, 1, 4)
    assert c.blocks_held(1, 0) == 2 and c.oldest_held(1, 0) == 2
    s = c.begin_step([(1, 1)])
    rows.apply(s.plan(), [24])
    assert rows.read(s.plan(), 0)[2:] == [12, 13, 24]


@pytest.mark.parametrize("policy", [kvcore.Flat(), kvcore.Ring(7, 1)], ids=repr)
def test_a_fork_of_a_fork_of_a_sequence_with_a_removed_head_inherits_every_block(policy: kvcore.LayerPolicy) -> None:
    layer = kvcore.LayerConfig(policy, 1, 2)
    c = kvcore.BatchCache(kvcore.CacheConfig(55, layer, max_step=4, batch=kvcore.BatchLimits(block_size=1, max_seqs=3)))
    rows = Rows(c)
    c.add_sequence(1)
    step(c, rows, [(1, 4)], [0, 1, 2, 3]).commit()
    step(c, rows, [(1, 1)], [4]).commit()
    c.remove(1, 0, 4)
    c.fork(1, 0, 0)  # an empty sequence, from a source whose blocks start at 4
    step(c, rows, [(0, 3)], [10, 11, 12]).commit()
    assert c.oldest_held(0, 0) == 0
    c.fork(0, 2)
    assert c.blocks_held(2, 0) == 3 and c.oldest_held(2, 0) == 0
    s = c.begin_step([(2, 1)])
    rows.apply(s.plan(), [23])
    assert rows.read(s.plan(), 0) == [10, 11, 12, 23]


def test_fork_and_adopt_into_an_empty_sequence_with_an_abandoned_step() -> None:
    c = cache()
    rows = Rows(c)
    c.add_sequence(0)
    step(c, rows, [(0, 4, [1, 2, 3, 4])], [1, 2, 3, 4]).commit()
    step(c, rows, [(0, 1, [5])], [5]).commit()
    free = c.free_blocks(0)
    for verb in ("adopt", "fork"):
        c.add_sequence(1)
        abandoned = c.begin_step([(1, 2)])  # an empty sequence's prefill, never committed
        if verb == "adopt":
            assert c.adopt_prefix(1, [1, 2, 3, 4, 5]) == 4
        else:
            c.fork(0, 1)
        assert not abandoned.is_current and c.free_blocks(0) == free
        s = c.begin_step([(1, 1)])
        rows.apply(s.plan(), [9])
        assert rows.read(s.plan(), 0)[:4] == [1, 2, 3, 4]
        c.release_sequence(1)


def test_an_abandoned_step_leaves_no_fresh_block_behind() -> None:
    c = kvcore.BatchCache(kvcore.CacheConfig(16, kvcore.LayerConfig(kvcore.Flat(), 1, 2), max_step=2, batch=kvcore.BatchLimits(block_size=2, max_seqs=2)))
    c.add_sequence(0)
    c.step([(0, 2)]).commit()
    c.step([(0, 1)]).commit()
    c.remove(0, 0, 2)  # block 0 goes
    c.rewind(0, 1)  # position 0 only, removed: block index 0 is empty
    free, held = c.free_blocks(0), c.blocks_held(0, 0)
    abandoned = c.begin_step([(0, 1)])  # a fresh block 0 for position 1
    assert c.blocks_held(0, 0) == held + 1
    c.add_sequence(1)  # ends the step
    assert not abandoned.is_current
    assert (c.free_blocks(0), c.blocks_held(0, 0), c.used_blocks(0)) == (free, held, 0)


def test_a_block_rewritten_below_a_removed_heads_end_is_forked_and_found() -> None:
    layer = kvcore.LayerConfig(kvcore.Ring(2), 1, 2)
    c = kvcore.BatchCache(kvcore.CacheConfig(16, layer, max_step=1, batch=kvcore.BatchLimits(block_size=3, max_seqs=2)))
    rows = Rows(c)
    c.add_sequence(0)
    for p in range(7):
        step(c, rows, [(0, 1)], [100 + p]).commit()  # the window released block 0 (positions 0..2)
    c.remove(0, 1, 3)
    c.rewind(0, 2)  # allowed: a query at 2 needs position 1, which is removed
    c.remove(0, 0, 1)  # the head: nothing left is seen
    step(c, rows, [(0, 1)], [202]).commit()  # position 2: block 0 again
    assert c.oldest_held(0, 0) == 2 and c.blocks_held(0, 0) == 1
    c.fork(0, 1)
    assert c.blocks_held(1, 0) == 1
    s = c.begin_step([(1, 1)])
    rows.apply(s.plan(), [303])
    assert rows.read(s.plan(), 0)[2:] == [202, 303]  # the query at 3 sees 2 and itself


def test_a_truncation_releases_a_last_block_it_sees_nothing_of() -> None:
    c = kvcore.BatchCache(kvcore.CacheConfig(16, kvcore.LayerConfig(kvcore.Flat(), 1, 2), max_step=1, batch=kvcore.BatchLimits(block_size=3, max_seqs=2)))
    c.add_sequence(0)
    c.step([(0, 1)]).commit()
    c.step([(0, 1)]).commit()
    c.remove(0, 0, 1)  # position 0 removed; block 0 still holds position 1
    free = c.free_blocks(0)
    c.rewind(0, 1)  # the sequence sees nothing now
    assert c.blocks_held(0, 0) == 0 and c.free_blocks(0) == free + 1
    assert c.oldest_held(0, 0) == 1 and c.sequence(0).visible_positions == 0
    c.step([(0, 1)]).commit()  # position 1 again, in a new block 0
    assert c.blocks_held(0, 0) == 1 and c.oldest_held(0, 0) == 1


def test_a_fork_inherits_no_block_it_sees_nothing_of() -> None:
    c = kvcore.BatchCache(kvcore.CacheConfig(16, kvcore.LayerConfig(kvcore.Flat(), 1, 2), max_step=4, batch=kvcore.BatchLimits(block_size=3, max_seqs=2)))
    rows = Rows(c)
    c.add_sequence(0)
    step(c, rows, [(0, 4)], [10, 11, 12, 13]).commit()
    step(c, rows, [(0, 2)], [14, 15]).commit()
    c.remove(0, 3, 4)  # block 1 holds 3 (removed), 4 and 5
    c.fork(0, 1, 4)  # of block 1, the fork would hold position 3 only
    assert c.blocks_held(1, 0) == 1 and c.sequence(1).holes == [(3, 4)]
    s = c.begin_step([(1, 1)])  # position 4: a new block 1, no copy
    rows.apply(s.plan(), [24])
    assert s.plan().groups[0].copies.tolist() == []
    assert rows.read(s.plan(), 0)[:3] + rows.read(s.plan(), 0)[4:] == [10, 11, 12, 24]


def test_a_retry_over_other_sequences_gets_the_blocks_the_replaced_step_took() -> None:
    c = kvcore.BatchCache(kvcore.CacheConfig(16, kvcore.LayerConfig(kvcore.Flat(), 1, 2), max_step=4, batch=kvcore.BatchLimits(block_size=2, max_seqs=3, num_blocks=3)))
    rows = Rows(c)
    for seq in range(3):
        c.add_sequence(seq)
    first = c.begin_step([(0, 4)])  # two of the three blocks
    assert c.free_blocks(0) == 1
    retry = step(c, rows, [(1, 4)], [10, 11, 12, 13])  # two blocks: the ones the first step took
    assert not first.is_current and c.free_blocks(0) == 1
    with pytest.raises(kvcore.CapacityError, match="the step needs 4 blocks over its 1 group, 3 of the pool.s 3 are free"):
        c.begin_step([(1, 4), (2, 4)])  # more than all of them: refused, the retry stays begun
    assert retry.is_current and c.free_blocks(0) == 1
    retry.commit()
    # The same sequence again, with a copy-on-write block: its copy comes back too.
    c.fork(1, 2, 3)
    again = c.begin_step([(2, 1)])
    assert again.plan().groups[0].copies.shape == (1, 2) and c.free_blocks(0) == 0
    retry2 = step(c, rows, [(2, 1)], [23])
    assert rows.read(retry2.plan(), 0) == [10, 11, 12, 23]


def test_sequence_info_is_a_copy_that_outlives_the_cache() -> None:
    c = cache()
    c.add_sequence(0)
    c.step([(0, 4)]).commit()
    c.step([(0, 4)]).commit()
    c.remove(0, 2, 3)
    info = c.sequence(0)
    c.remove(0, 5, 7)
    c.rewind(0, 1)
    assert (info.length, info.visible_start, info.holes, info.visible_positions) == (8, 0, [(2, 3)], 7)
    del c
    gc.collect()
    churn = [np.full(1 << 10, 7, np.int32) for _ in range(64)]  # would reuse the freed tables
    assert info.holes == [(2, 3)]
    assert repr(info) == "SequenceInfo(active=True, length=8, visible_start=0, holes=[(2, 3)])"
    del churn


def test_entries_from_a_generator_keep_their_tokens() -> None:
    c = cache()
    c.add_sequence(0)
    c.step(e for e in [(0, 3, [1, 2, 3])]).commit()
    c.step(e for e in [(0, 3, iter([4, 5, 6]))]).commit()
    c.add_sequence(1)
    assert c.adopt_prefix(1, [1, 2, 3, 4, 5, 6]) == 4


@pytest.mark.parametrize(
    "entries, text",
    [
        ([(0, 1.5)], "begin_step: T = 1.5: must be an int, got float"),
        ([("0", 1)], "begin_step: seq = '0': must be an int, got str"),
        (["ab"], "begin_step: seq = 'a': must be an int, got str"),
        ([(0, 2, [1, 2.0])], "begin_step: token = 2.0: must be an int, got float"),
        ([(0, 2, "ab")], "begin_step: token = 'a': must be an int, got str"),
        ([(None, 1)], "begin_step: seq = None: must be an int, got NoneType"),
    ],
)
def test_a_step_entry_that_is_not_an_int_is_a_type_error_naming_it(entries: Any, text: str) -> None:
    c = cache()
    c.add_sequence(0)
    with pytest.raises(TypeError) as info:
        c.begin_step(entries)
    assert str(info.value) == text
    with pytest.raises(TypeError, match=r"adopt_prefix: tokens\[1\] = 1.0: must be an int, got float"):
        c.adopt_prefix(0, [0, 1.0])  # type: ignore[list-item]
