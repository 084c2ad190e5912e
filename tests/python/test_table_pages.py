"""Block tables sized by use from Python (BatchLimits.table_page_blocks; docs/batch.md section 5,
"Tables sized by use"): the limits are checked by name, the pages follow what the rows hold, a
verb short of pages raises CapacityError and changes nothing, a plan's entry_tables reads either
layout, and a byte layer reading a paged plan reads what it reads from an unpaged one. The C++
suite (BatchTablePages.*, and the brute-force walk with paged tables) holds the planner to the
unpaged cache on random workloads."""

from __future__ import annotations

import numpy as np
import pytest

import kvcore

B = 2


def cache(page_blocks: int, pages: int = 0, max_seqs: int = 4) -> kvcore.BatchCache:
    """A Flat and a Ring(8, sinks 2) layer, blocks of 2 rows, 256 positions."""
    layers = [kvcore.LayerConfig(kvcore.Flat(), 1, 4), kvcore.LayerConfig(kvcore.Ring(8, sinks=2), 1, 4)]
    limits = kvcore.BatchLimits(
        block_size=B, max_seqs=max_seqs, num_blocks=400, max_rewind=0, table_page_blocks=page_blocks,
        table_pages=pages,
    )
    return kvcore.BatchCache(kvcore.CacheConfig(256, layers, max_step=8, batch=limits))


def state(c: kvcore.BatchCache) -> tuple[object, ...]:
    """Everything a refused verb must leave as it was."""
    rows = tuple(
        tuple(c.block_table(s, g).tolist()) for s in range(c.max_seqs) for g in range(c.n_groups)
    )
    return (rows, c.free_table_pages, c.free_blocks(0), tuple(c.sequence(s).length for s in range(c.max_seqs)))


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"table_page_blocks": 3}, "batch.table_page_blocks = 3: must be a power of two"),
        ({"table_page_blocks": 1 << 21}, "batch.table_page_blocks = 2097152"),
        ({"table_page_blocks": -4}, "batch.table_page_blocks = -4"),
        ({"table_page_blocks": 4, "table_pages": -1}, "batch.table_pages = -1: must be >= 1"),
    ],
    ids=["not_a_power_of_two", "past_2_to_20", "negative_page", "negative_pages"],
)
def test_bad_limits_are_refused_by_name(kwargs: dict[str, int], words: str) -> None:
    layers = kvcore.LayerConfig(kvcore.Flat(), 1, 4)
    with pytest.raises(kvcore.InvalidArgumentError, match=words):
        kvcore.BatchCache(kvcore.CacheConfig(64, layers, batch=kvcore.BatchLimits(**kwargs)))


def test_the_pages_follow_what_the_rows_hold() -> None:
    c = cache(4)
    assert (c.table_page_blocks, c.table_pages, c.free_table_pages) == (4, 2 * 4 * 32, 2 * 4 * 32)
    c.add_sequence(0)
    for _ in range(100):  # 100 positions: flat blocks 0 .. 49, 13 pages; the ring keeps its window's
        c.step([(0, 1)]).commit()
    in_use = c.table_pages - c.free_table_pages
    assert 13 + 2 <= in_use <= 13 + 3
    assert (c.block_table(0, 0) >= 0).all()
    assert c.block_table(0, 1)[20] == -1  # the window passed it: its page went back
    c.release_sequence(0)
    assert c.free_table_pages == c.table_pages


def test_unpaged_tables_keep_their_dense_view() -> None:
    c = cache(0)
    assert (c.table_page_blocks, c.free_table_pages) == (c.table_stride, 0)
    c.add_sequence(1)
    step = c.begin_step([(1, 5)])
    plan = step.plan()
    for g in plan.groups:
        dense = g.block_tables[plan.table_rows[plan.seq_ids]][:, : g.entry_tables.shape[1]]
        np.testing.assert_array_equal(g.entry_tables, dense)
    assert plan.arrays()[6][0][2] is not None


def test_a_verb_short_of_pages_is_refused_and_changes_nothing() -> None:
    c = cache(2, pages=6)
    tokens = list(range(7, 19))
    c.add_sequence(0)
    c.step([(0, 6, tokens[:6])]).commit()  # blocks 0 .. 2: two pages in each group
    c.add_sequence(2)
    assert c.table_pages_needed(0, 6) == 2 and c.table_pages_needed(2, 6) == 4
    before = state(c)
    with pytest.raises(kvcore.CapacityError, match="4 more table pages|6 more table pages"):
        c.begin_step([(0, 6, tokens[6:]), (2, 6, tokens[:6])])
    assert state(c) == before
    with pytest.raises(kvcore.CapacityError, match="table pages"):
        c.fork(0, 3, 6)
    assert state(c) == before and not c.sequence(3).active
    with pytest.raises(kvcore.CapacityError, match="table pages"):
        c.adopt_prefix(2, tokens)
    assert state(c) == before
    c.step([(0, 6, tokens[6:])]).commit()  # alone it fits
    assert c.free_table_pages == 0
    with pytest.raises(kvcore.InvalidStateError):
        c.table_pages_needed(1, 1)
    with pytest.raises(kvcore.InvalidArgumentError):
        c.table_pages_needed(0, 9)


def test_fork_many_short_of_pages_forks_none() -> None:
    # A review's reproducer: the first fork fit, the second did not, and fork_many left one made.
    limits = kvcore.BatchLimits(block_size=1, max_seqs=4, table_page_blocks=1, table_pages=10)
    c = kvcore.BatchCache(kvcore.CacheConfig(64, kvcore.LayerConfig(kvcore.Flat(), 1, 8), batch=limits))
    c.add_sequence(0)
    c.step([(0, 4)]).commit()
    assert c.free_table_pages == 6
    before = state(c)
    with pytest.raises(kvcore.CapacityError, match="2 forks need up to 8 table pages, 6 of"):
        c.fork_many(0, [1, 2])
    assert state(c) == before and not c.sequence(1).active and not c.sequence(2).active
    c.fork_many(0, [1])  # one fits
    assert c.free_table_pages == 2 and c.sequence(1).length == 4


def test_an_aborted_step_gives_its_pages_back() -> None:
    c = cache(2, pages=8)
    c.add_sequence(0)
    c.add_sequence(1)
    step = c.begin_step([(0, 8)])  # blocks 0 .. 3: two pages in each group
    assert c.free_table_pages == 4
    step.abort()
    assert c.free_table_pages == 8
    c.begin_step([(0, 8)])
    c.begin_step([(1, 8)])  # replaces it: its pages are free again
    assert c.free_table_pages == 4


def test_entry_tables_and_a_byte_layer_read_paged_tables_as_unpaged_ones() -> None:
    rng = np.random.default_rng(39)
    paged, dense = cache(2, max_seqs=3), cache(0, max_seqs=3)
    pools = [kvcore.PagedKVPool(c, np.float32) for c in (paged, dense)]
    for c in (paged, dense):
        for s in range(3):
            c.add_sequence(s)
    for _ in range(40):
        entries = [(s, int(rng.integers(1, 5))) for s in range(3) if paged.sequence(s).length < 240]
        steps = [c.begin_step(entries) for c in (paged, dense)]
        plans = [st.plan() for st in steps]
        for g in range(paged.n_groups):
            np.testing.assert_array_equal(plans[0].groups[g].entry_tables, plans[1].groups[g].entry_tables)
            with pytest.raises(kvcore.NotSupportedError, match="paged"):
                plans[0].groups[g].block_tables
        n = plans[0].n_tokens
        k = rng.standard_normal((n, 1, 4), dtype=np.float32)
        v = rng.standard_normal((n, 1, 4), dtype=np.float32)
        for pool, st in zip(pools, steps):
            for layer in range(2):
                pool.update(layer, st, k, v)
        for i in range(plans[0].n_entries):
            for layer in range(2):
                got = [pool.gather(layer, st, i) for pool, st in zip(pools, steps)]
                for a, b in zip(got[0], got[1]):
                    np.testing.assert_array_equal(a, b)
                assert len(got[0][2]) > 0
        for st in steps:
            st.commit()
    assert paged.free_table_pages < paged.table_pages
