"""Model.forward_batch: one step over many sequences through BatchCache + PagedKVPool."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import kvcore
from kvcore.model import Model, ModelConfig


def test_forward_batch_equals_forward_full_per_sequence() -> None:
    # Three sequences of different lengths, chunked prefill side by side, one forked
    # mid-way (a shared partial block, copied on write): each row is its own sequence's.
    model = Model(ModelConfig(n_layers=4, flat_every=2, window=5, sinks=1, d_model=32, d_ff=64, head_dim=8,
                              vocab_size=64))
    cfg = model.config
    layers = [kvcore.LayerConfig(cfg.policy(i), cfg.n_kv_heads, cfg.head_dim) for i in range(cfg.n_layers)]
    cache = kvcore.BatchCache(kvcore.CacheConfig(64, layers, max_step=4,
                                                 batch=kvcore.BatchLimits(block_size=8, max_seqs=4)))
    pool = kvcore.PagedKVPool(cache, np.float32)
    rng = np.random.default_rng(3)
    seqs = {s: rng.integers(0, 64, size=n).tolist() for s, n in ((0, 23), (1, 9), (2, 17))}
    rows: dict[int, dict[int, Any]] = {s: {} for s in (0, 1, 2, 3)}
    for s in (0, 1, 2):
        cache.add_sequence(s)
    forked = False
    while True:
        entries = []
        for s, ids in seqs.items():
            L = cache.length(s)
            if L < len(ids):
                entries.append((s, min(4, len(ids) - L), ids[L : L + 4]))
        if not entries:
            break
        with cache.step(entries) as step:
            logits = model.forward_batch([t for _, _, ids in entries for t in ids], step, pool)
        start = 0
        for s, T, _ in entries:
            L = cache.length(s) - T
            for j in range(T):
                rows[s][L + j] = logits[start + j]
            start += T
        if not forked and cache.length(0) == 12:  # fork inside block 1
            cache.fork(0, 3)
            seqs[3] = seqs[0][:12] + rng.integers(0, 64, size=8).tolist()
            rows[3] = {p: r for p, r in rows[0].items() if p < 12}
            forked = True
    assert forked
    for s, ids in seqs.items():
        ref = model.forward_full(ids)
        assert sorted(rows[s]) == list(range(len(ids)))
        got = np.stack([rows[s][p] for p in range(len(ids))])
        assert np.abs(got - ref).max() <= 1e-4, s


def test_forward_batch_refuses_a_token_count_that_is_not_the_steps() -> None:
    model = Model(ModelConfig(n_layers=1, d_model=16, d_ff=32, head_dim=4, n_heads=2, n_kv_heads=1, vocab_size=16))
    cache = kvcore.BatchCache(kvcore.CacheConfig(16, [kvcore.LayerConfig(kvcore.Flat(), 1, 4)], max_step=4,
                                                 batch=kvcore.BatchLimits(block_size=2, max_seqs=1)))
    pool = kvcore.PagedKVPool(cache, np.float32)
    cache.add_sequence(0)
    step = cache.begin_step([(0, 2, [1, 2])])
    with pytest.raises(ValueError, match="3 tokens for a step of n_tokens = 2"):
        model.forward_batch([1, 2, 3], step, pool)
