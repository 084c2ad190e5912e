"""batch.max_rewind from Python (docs/batch.md section 5, "The rewind margin"): the binding
reads, prints and refuses it as the C++ core does, and a smaller margin holds fewer ring blocks
and admits what the default refuses. The brute-force state machine (test_batch_stateful.py)
draws the margin against its model; rewind_margin_test.cpp names the C++ figures."""
from __future__ import annotations

import math

import pytest

import kvcore

W, B, C = 16, 4, 8


def ring_cache(max_rewind: int, num_blocks: int = 0) -> kvcore.BatchCache:
    limits = kvcore.BatchLimits(block_size=B, max_seqs=4, num_blocks=num_blocks, max_rewind=max_rewind)
    layers = [kvcore.LayerConfig(kvcore.Ring(W), 1, 2), kvcore.LayerConfig(kvcore.Flat(), 1, 2)]
    return kvcore.BatchCache(kvcore.CacheConfig(256, layers, max_step=C, batch=limits))


def compute(cache: kvcore.BatchCache, seq: int, n: int) -> None:
    cache.add_sequence(seq)
    for at in range(0, n, C):
        cache.commit(cache.begin_step([(seq, min(C, n - at))]))


def test_the_limit_reads_and_prints_as_given() -> None:
    limits = kvcore.BatchLimits(max_rewind=3)
    assert limits.max_rewind == 3
    assert kvcore.BatchLimits().max_rewind == -1  # the default: max_step
    assert "max_rewind=3" in repr(limits) and "max_rewind" not in repr(kvcore.BatchLimits())
    assert ring_cache(-1).max_rewind == C and ring_cache(0).max_rewind == 0


@pytest.mark.parametrize("bad", [-2, 257])
def test_out_of_range_is_refused_naming_the_value(bad: int) -> None:
    with pytest.raises(kvcore.InvalidArgumentError, match=rf"batch.max_rewind = {bad}: must be in \[0, capacity = 256\] \(or -1 for max_step\)"):
        ring_cache(bad)


@pytest.mark.parametrize("R", [0, 3, C])
def test_a_ring_holds_the_window_and_the_margin(R: int) -> None:
    cache, L = ring_cache(R), 101
    compute(cache, 0, L)
    first_kept = L - R - W + 1  # "what a query after a rewind of up to R needs"
    assert cache.blocks_held(0, 0) == math.ceil(L / B) - first_kept // B
    assert all(cache.can_rewind(0, n) for n in range(L - R, L + 1))
    refused = first_kept // B * B + W - 2  # its query needs the block below the first kept one
    assert not cache.can_rewind(0, refused)
    with pytest.raises(kvcore.InvalidStateError):
        cache.rewind(0, refused)
    assert cache.can_rewind(0, L) and cache.blocks_held(0, 0) == math.ceil(L / B) - first_kept // B


def test_no_margin_holds_fewer_blocks_and_fits_where_the_default_does_not() -> None:
    L = 60
    flat, held = math.ceil(L / B), {}
    for R in (0, C):
        cache = ring_cache(R, num_blocks=1000)
        compute(cache, 0, L)
        compute(cache, 1, L)
        held[R] = cache.num_blocks(0) - cache.free_blocks(0)
        ring = math.ceil(L / B) - (L - R - W + 1) // B
        assert held[R] == 2 * (flat + ring), R
    assert held[0] < held[C]
    # The smallest pool the workload fits with no margin (its rest and one step's new blocks):
    # there the default margin runs out in the second sequence's prefill, and the refused step
    # changes nothing.
    def fits(R: int, pool: int) -> bool:
        try:
            cache = ring_cache(R, num_blocks=pool)
            compute(cache, 0, L)
            compute(cache, 1, L)
            return True
        except kvcore.CapacityError:
            return False

    pool = next(p for p in range(held[0], held[C] + 20) if fits(0, p))
    assert not fits(C, pool)
    short = ring_cache(C, num_blocks=pool)
    compute(short, 0, L)
    short.add_sequence(1)
    with pytest.raises(kvcore.CapacityError):
        for at in range(0, L, C):
            free = short.free_blocks(0)
            short.commit(short.begin_step([(1, min(C, L - at))]))
    assert short.free_blocks(0) == free and short.length(1) == at
