"""KVPool(..., mirror_rings=True): a wrapped ring window comes back as a zero-copy view.

Expectations come from docs/design.md section 2 (the needed set; R = W + C - 1 ring
rows) and a brute-force record of the data last written to each position, never
from the pool's own answers.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import kvcore
from reference import needed

Array = npt.NDArray[Any]


def config(policies: list[kvcore.LayerPolicy], capacity: int = 40, max_step: int = 3, **kw: Any) -> kvcore.CacheConfig:
    return kvcore.CacheConfig(capacity, [kvcore.LayerConfig(p, 2, 4, 3) for p in policies], max_step=max_step, **kw)


def drive(cache: kvcore.SequenceCache, pool: kvcore.KVPool, seed: int) -> list[tuple[int, bool, bool, bool]]:
    """Random steps (retries and rewinds included) to the end of capacity; checks
    every read against what was written. Returns, per read, (layer, needed positions
    contiguous, plan read split into several runs, returned as views)."""
    rng = np.random.default_rng(seed)
    written: list[dict[int, tuple[Array, Array]]] = [{} for _ in range(cache.n_layers)]
    seen = []
    while cache.length < cache.capacity:
        T = int(rng.integers(1, min(cache.max_step, cache.capacity - cache.length) + 1))
        for commit in ([False, True] if rng.random() < 0.1 else [True]):
            step = cache.begin_step(T)
            for layer in range(cache.n_layers):
                cfg = cache.config.layers[layer]
                k = rng.standard_normal((T, 2, cfg.head_dim)).astype(pool.dtype)
                v = rng.standard_normal((T, 2, cfg.value_dim)).astype(pool.dtype)
                split = len(step.plan(layer).read) > 1
                got_k, got_v, positions = pool.update(layer, step, k, v, order="positions")
                for j in range(T):
                    written[layer][step.position + j] = (k[j], v[j])
                want = needed(cache.layer_policy(layer), step.position, T)
                assert positions.tolist() == want
                np.testing.assert_array_equal(got_k, np.stack([written[layer][p][0] for p in want]))
                np.testing.assert_array_equal(got_v, np.stack([written[layer][p][1] for p in want]))
                contiguous = want == list(range(want[0], want[-1] + 1))
                seen.append((layer, contiguous, split, not got_k.flags.owndata and not got_v.flags.owndata))
            if commit:
                step.commit()
        back = int(rng.integers(1, cache.max_step + 1))
        if rng.random() < 0.1 and cache.can_rewind(cache.length - back):
            cache.rewind(cache.length - back)
    return seen


@pytest.mark.parametrize("initial_capacity", [1, 512])
def test_mirrored_reads_are_views_whenever_the_needed_positions_are_contiguous(initial_capacity: int) -> None:
    for seed in range(8):
        cfg = config([kvcore.Ring(4), kvcore.Ring(3, 2), kvcore.Flat()], initial_capacity=initial_capacity)
        cache = kvcore.SequenceCache(cfg)
        pool = kvcore.KVPool(cache, np.float32, mirror_rings=True)
        assert pool.mirror_rings
        seen = drive(cache, pool, seed)
        for layer, contiguous, _, is_view in seen:
            assert is_view == contiguous, f"layer {layer}: contiguous={contiguous} but view={is_view}"
        # The mirror was exercised: windows the plan splits at the ring's end came back as views.
        assert any(split and is_view for layer, _, split, is_view in seen if layer == 0)


def test_compact_pool_still_gathers_a_wrapped_window() -> None:
    cache = kvcore.SequenceCache(config([kvcore.Ring(4)]))
    pool = kvcore.KVPool(cache, np.float32)
    assert not pool.mirror_rings
    seen = drive(cache, pool, 3)
    # In a compact pool a window split at the ring's end is one gathered copy.
    assert any(split for _, _, split, _ in seen)
    for _, contiguous, split, is_view in seen:
        assert contiguous and is_view != split


def test_mirror_costs_r_minus_one_rows_per_wrapping_ring_without_sinks() -> None:
    C = 3
    policies = [kvcore.Ring(4), kvcore.Ring(3, 2), kvcore.Flat(), kvcore.Ring(30, 1)]  # 1 + 30 + 2 >= 32: no wrap
    cfg = config(policies, capacity=32, max_step=C)
    row = 2 * (4 + 3) * 2  # float16 K + V bytes of one row
    extra = ((4 + C - 1) - 1) * row  # Ring(3, 2) has sinks: its read is two spans anyway, no mirror
    cache = kvcore.SequenceCache(cfg)
    assert [cache.geometry(i).mirror_rows for i in range(4)] == [4 + C - 2, 0, 0, 0]
    compact = kvcore.KVPool(cache, np.float16)
    mirrored = kvcore.KVPool(cache, np.float16, mirror_rings=True)
    assert mirrored.reserved_bytes == compact.reserved_bytes + extra
    # An arena rounds each K and V block to 64 bytes: the difference is the mirror, give or take that.
    more = kvcore.KVPool.required_bytes(cfg, np.float16, mirror_rings=True) - kvcore.KVPool.required_bytes(
        cfg, np.float16
    )
    assert abs(more - extra) < 2 * 64
    assert "mirror_rings=True" in repr(mirrored) and "mirror_rings" not in repr(compact)


def test_mirror_rings_is_keyword_only() -> None:
    cache = kvcore.SequenceCache(config([kvcore.Ring(4)]))
    with pytest.raises(TypeError):
        kvcore.KVPool(cache, np.float32, True)  # type: ignore[misc]
