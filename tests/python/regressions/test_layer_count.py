"""Regression (issue 7): CacheConfig(capacity, layer, n_layers=2**31 - 1) used to
be valid, and SequenceCache(cfg) then sized per-layer state for 2^31 layers:
minutes and ~12 GB here, an abort in a C++ build without exceptions. n_layers
is now capped at CacheConfig::kMaxLayers = 65536 and refused up front."""

from __future__ import annotations

import pytest

import kvcore

LAYER = kvcore.LayerConfig(kvcore.Ring(4), 1, 2)


@pytest.mark.parametrize("n", [65537, 2**20, 2**31 - 1])
def test_a_huge_layer_count_is_refused_up_front(n: int) -> None:
    with pytest.raises(kvcore.InvalidArgumentError, match=f"n_layers = {n}: must be <= 65536"):
        kvcore.CacheConfig(8, LAYER, n_layers=n)


def test_the_largest_layer_count_works() -> None:
    cache = kvcore.SequenceCache(kvcore.CacheConfig(8, LAYER, n_layers=65536))
    assert cache.n_layers == 65536 and cache.n_groups == 1
    with cache.step(1) as step:
        assert step.plan(65535) == step.plan(0)
