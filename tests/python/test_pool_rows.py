"""KVPool's row-order reads (the default of update/read and Step.mask): every
held row as it lies, one zero-copy view, no more rows than the layer's; each
row stands for the position LayerGeometry.position_at names, and the mask is
the visibility rule on those positions. Checked against a brute-force reference
(every position's latest bytes, docs/design.md section 2's rule) on random
workloads with chunks, wraps, rewinds and retries."""

from __future__ import annotations

import random

import numpy as np
import pytest

import kvcore
from reference import visible

H, D, DV = 2, 3, 2


def make(policies: list[kvcore.LayerPolicy], capacity: int, max_step: int) -> tuple[kvcore.SequenceCache, kvcore.KVPool]:
    layers = [kvcore.LayerConfig(p, n_kv_heads=H, head_dim=D, v_head_dim=DV) for p in policies]
    cache = kvcore.SequenceCache(kvcore.CacheConfig(capacity, layers, max_step=max_step, initial_capacity=4))
    return cache, kvcore.KVPool(cache, np.float32)


def rows_of(value: float, n: int, dim: int) -> np.ndarray:
    out = np.empty((n, H, dim), np.float32)
    out[:] = value
    return out


def run(seed: int, steps: int = 60) -> int:
    rng = random.Random(seed)
    window = rng.randint(1, 6)
    policies = [kvcore.Ring(window, rng.choice([0, 0, 1, 2])), kvcore.Flat(), kvcore.Ring(rng.randint(1, 4))]
    max_step = rng.randint(1, 4)
    cache, pool = make(policies, capacity=rng.randint(20, 80), max_step=max_step)
    latest: list[dict[int, float]] = [{} for _ in policies]
    checked = 0
    for n in range(steps):
        T = rng.randint(1, max_step)
        if not cache.can_extend(T):
            break
        step = cache.begin_step(T)
        for layer, policy in enumerate(policies):
            values = [1000.0 * n + 10 * layer + p - step.position for p in range(step.position, step.end)]
            k_new = np.stack([rows_of(x, 1, D)[0] for x in values])
            v_new = np.stack([rows_of(-x, 1, DV)[0] for x in values])
            for p, x in zip(range(step.position, step.end), values):
                latest[layer][p] = x
            k, v, positions = pool.update(layer, step, k_new, v_new)
            geometry = cache.geometry(layer)
            held = geometry.held_rows(step.end)
            assert k.shape == (held, H, D) and v.shape == (held, H, DV) and held <= cache.rows(layer)
            assert not k.flags.writeable and not k.flags.owndata  # a view of the pool
            assert positions.tolist() == [geometry.position_at(r, step.end) for r in range(held)]
            mask = step.mask(layer)
            assert mask.shape == (T, held)
            seen = []
            for r, p in enumerate(positions.tolist()):
                rule = [visible(policy, q, p) for q in range(step.position, step.end)]
                assert mask[:, r].tolist() == rule, (seed, layer, r, p)
                if any(rule):
                    seen.append(p)
                    assert np.all(k[r] == latest[layer][p]) and np.all(v[r] == -latest[layer][p]), (seed, layer, p)
            needed = sorted(
                p for p in range(step.end) if any(visible(policy, q, p) for q in range(step.position, step.end))
            )
            assert sorted(seen) == needed, (seed, layer)
            # The same rows through read(): the same view, positions and bytes.
            k2, _, positions2 = pool.read(layer, step.plan(layer))
            assert np.shares_memory(k, k2) and positions2 is positions
            checked += 1
        action = rng.random()
        if action < 0.15:
            continue  # left uncommitted: the next begin_step retries at the same position
        step.commit()
        if action < 0.4:
            back = cache.length - rng.randint(1, max_step + 1)
            if back >= 0 and cache.can_rewind(back):
                cache.rewind(back)  # rewound rows stay in the pool, stale: masks must hide them
    return checked


@pytest.mark.parametrize("seed", range(40))
def test_row_order_reads_are_exact_on_random_workloads(seed: int) -> None:
    assert run(seed) > 0


def test_row_order_is_the_default_and_positions_stays_available() -> None:
    cache, pool = make([kvcore.Ring(3)], capacity=40, max_step=2)
    for _ in range(9):
        with cache.step(1) as step:
            pool.update(0, step, rows_of(1.0, 1, D), rows_of(2.0, 1, DV))
    step = cache.begin_step(2)
    k_rows, _, rows = pool.update(0, step, rows_of(1.0, 2, D), rows_of(2.0, 2, DV))
    k_pos, _, positions = pool.read(0, step.plan(0), order="positions")
    # R = 3 + 2 - 1 = 4 ring rows hold positions 8, 9, 10, 7; the window is 7..10.
    assert rows.tolist() == [8, 9, 10, 7] and positions.tolist() == [7, 8, 9, 10]
    assert step.mask(0).tolist() == [[True, True, False, True], [True, True, True, False]]
    assert step.mask(0, order="positions").tolist() == [[True, True, True, False], [False, True, True, True]]
    assert np.shares_memory(k_rows, pool.read(0, step.plan(0))[0])
    assert not np.shares_memory(k_pos, k_rows)  # a wrapped window in position order is gathered


@pytest.mark.parametrize("call", ["update", "read", "mask"])
def test_an_unknown_order_is_refused_and_changes_nothing(call: str) -> None:
    cache, pool = make([kvcore.Flat()], capacity=8, max_step=2)
    step = cache.begin_step(1)
    before = pool.reserved_bytes
    with pytest.raises(kvcore.InvalidArgumentError, match="order = 'sideways': must be 'rows'"):
        if call == "update":
            pool.update(0, step, rows_of(1.0, 1, D), rows_of(1.0, 1, DV), order="sideways")
        elif call == "read":
            pool.read(0, step.plan(0), order="sideways")
        else:
            step.mask(0, order="sideways")
    assert pool.reserved_bytes == before and step.is_current
    assert pool.allocated_rows(0) == 4


def test_geometry_reports_rows_and_positions() -> None:
    cache = kvcore.SequenceCache(
        kvcore.CacheConfig(64, [kvcore.LayerConfig(p, 1, 2) for p in (kvcore.Ring(4, 2), kvcore.Ring(4), kvcore.Flat())], max_step=3)
    )
    sinks, ring, flat = (cache.geometry(i) for i in range(3))
    assert (sinks.rows, sinks.sink_rows, sinks.ring_rows, sinks.wraps, sinks.mirror_rows) == (8, 2, 6, True, 0)
    assert (ring.rows, ring.sink_rows, ring.ring_rows, ring.mirror_rows) == (6, 0, 6, 5)
    assert (flat.rows, flat.ring_rows, flat.wraps) == (64, 0, False)
    assert [sinks.row(p) for p in (0, 1, 2, 7, 8, 13)] == [0, 1, 2, 7, 2, 7]
    assert sinks.position_at(2, 9) == 8 and sinks.position_at(3, 9) == 3 and sinks.position_at(9, 40) == -1
    assert flat.held_rows(10) == 10 and ring.held_rows(100) == 6
    assert sinks == cache.geometry(0) and sinks != ring
    assert "LayerGeometry(rows=8, sink_rows=2, ring_rows=6)" == repr(sinks)
    with pytest.raises(kvcore.InvalidArgumentError, match="position = -1: must be >= 0"):
        sinks.row(-1)
