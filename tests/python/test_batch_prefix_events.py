"""BatchCache.lookup_prefix, the KV event queue and kvcore.block_keys from Python
(docs/batch.md section 5, "Lookups and KV events"; the C++ suite's PrefixLookup
and KVEvents tests and the brute-force model hold the rules on random workloads)."""

from __future__ import annotations

import numpy as np
import pytest

import kvcore


def cache(num_blocks: int = 32, capacity: int = 64) -> kvcore.BatchCache:
    layers = [kvcore.LayerConfig(kvcore.Ring(8), 1, 4), kvcore.LayerConfig(kvcore.Flat(), 1, 4)]
    limits = kvcore.BatchLimits(block_size=4, max_seqs=4, num_blocks=num_blocks)
    return kvcore.BatchCache(kvcore.CacheConfig(capacity, layers, max_step=4, batch=limits))


def compute(c: kvcore.BatchCache, seq: int, tokens: list[int], namespace: object = None) -> None:
    c.add_sequence(seq, namespace=namespace)
    for at in range(0, len(tokens), c.max_step):
        chunk = tokens[at : at + c.max_step]
        c.step([(seq, len(chunk), chunk)]).commit()


def test_lookup_prefix_answers_adopt_prefix_and_changes_nothing() -> None:
    c = cache()
    prompt = list(range(100, 124))
    compute(c, 0, prompt)
    c.release_sequence(0)
    counts = [(c.free_blocks(g), c.cached_blocks(g), c.held_blocks(g)) for g in range(c.n_groups)]
    assert c.lookup_prefix(prompt + [7]) == 24
    assert c.lookup_prefix(prompt[:10]) == 8  # full blocks of at most len - 1 tokens
    assert c.lookup_prefix(prompt + [7], namespace="tenant-b") == 0
    assert [(c.free_blocks(g), c.cached_blocks(g), c.held_blocks(g)) for g in range(c.n_groups)] == counts
    c.add_sequence(1)
    assert c.adopt_prefix(1, np.array(prompt + [7], dtype=np.int64)) == 24


def test_lookup_prefix_refusals_name_the_value() -> None:
    c = cache()
    with pytest.raises(kvcore.InvalidArgumentError, match=r"lookup_prefix\(n = 65\): must be in \[0, capacity = 64\]"):
        c.lookup_prefix(list(range(65)))
    with pytest.raises(kvcore.InvalidArgumentError, match="namespace"):
        c.lookup_prefix([1, 2], namespace=-1)


def test_events_tell_what_each_group_stores_and_evicts() -> None:
    c = cache(num_blocks=8)
    c.enable_kv_events(128)
    assert (c.kv_events_capacity, c.kv_events_pending, c.kv_events_dropped) == (128, 0, 0)
    prompt = list(range(1, 17))
    compute(c, 0, prompt, namespace=9)
    events = c.drain_kv_events()
    assert events.dtype.names == ("kind", "group", "key_lo", "key_hi", "namespace", "start", "end")
    assert events.dtype.isalignedstruct and events.dtype.itemsize == 40  # C layout: every field aligned
    flat = c.group_of(1)
    stored = events[(events["kind"] == kvcore.KV_EVENT_STORED) & (events["group"] == flat)]
    keys = kvcore.block_keys(prompt, 4, namespace=9)
    assert keys.shape == (4, 2) and keys.dtype == np.uint64
    assert [(int(e["start"]), int(e["end"])) for e in stored] == [(0, 4), (4, 8), (8, 12), (12, 16)]
    assert np.array_equal(np.stack([stored["key_lo"], stored["key_hi"]], axis=1), keys)
    assert set(stored["namespace"].tolist()) == {9}
    # Another prompt takes the pool: the first one's cached blocks are evicted, each key once.
    c.release_sequence(0)
    compute(c, 1, list(range(200, 216)))
    evicted = [e for e in c.drain_kv_events() if e["kind"] == kvcore.KV_EVENT_EVICTED and e["namespace"] == 9]
    assert evicted, "the pool of 8 blocks reclaims the first prompt's"
    stored_keys = {(int(e["key_lo"]), int(e["key_hi"]), int(e["group"])) for e in events if e["kind"] == kvcore.KV_EVENT_STORED}
    assert {(int(e["key_lo"]), int(e["key_hi"]), int(e["group"])) for e in evicted} <= stored_keys
    c.clear()
    cleared = c.drain_kv_events()
    assert cleared["kind"].tolist() == [kvcore.KV_EVENT_CLEARED] and cleared["group"].tolist() == [-1]


def test_event_refusals_name_the_value_and_change_nothing() -> None:
    c = cache()
    c.enable_kv_events(1)
    compute(c, 0, list(range(8)))  # two flat blocks stored (and ring ones): one kept, the rest dropped
    assert c.kv_events_pending == 1 and c.kv_events_dropped >= 1
    dropped = c.kv_events_dropped
    with pytest.raises(kvcore.InvalidArgumentError, match=r"kv events capacity = -1: must be in \[0, 16777216\]"):
        c.enable_kv_events(-1)
    with pytest.raises(kvcore.InvalidArgumentError, match=r"drain_kv_events\(max = -1\): must be >= 0"):
        c.drain_kv_events(-1)
    assert (c.kv_events_capacity, c.kv_events_pending, c.kv_events_dropped) == (1, 1, dropped)
    assert len(c.drain_kv_events(0)) == 0 and c.kv_events_pending == 1
    assert len(c.drain_kv_events()) == 1 and c.kv_events_pending == 0


def test_block_keys_are_the_keys_events_carry_and_refuse_a_bad_block_size() -> None:
    tokens = list(range(10))
    keys = kvcore.block_keys(tokens, 4)
    assert keys.shape == (2, 2)  # the partial last block has no key
    assert np.array_equal(kvcore.block_keys(np.array(tokens, dtype=np.int32), 4), keys)
    assert not np.array_equal(kvcore.block_keys(tokens, 4, namespace=1), keys)
    assert np.array_equal(kvcore.block_keys(tokens[:8], 4)[0], keys[0])  # a chain: block 0 depends on nothing after it
    assert kvcore.block_keys([], 4).shape == (0, 2)
    with pytest.raises(kvcore.InvalidArgumentError, match=r"block_keys\(block_size = 0\): must be >= 1"):
        kvcore.block_keys(tokens, 0)


def test_one_pool_counts_and_storage_sharing() -> None:
    c = cache()
    assert [c.num_blocks(g) for g in range(c.n_groups)] == [32, 32]
    compute(c, 0, list(range(20)))
    assert c.held_blocks(0) + c.held_blocks(1) == c.num_blocks(0) - c.free_blocks(0)
    assert c.held_blocks(c.group_of(1)) == 5
    # Layer 1 (the flat group's first layer) shares layer 0's storage (the ring group's first).
    assert [c.storage_layer(i) for i in range(2)] == [0, 0]
    with pytest.raises(kvcore.InvalidArgumentError, match="layer"):
        c.storage_layer(2)
    # A pool's required bytes count that storage once: a model whose flat layer's rows differ
    # in size keeps two storages and needs more.
    wide = kvcore.BatchCache(kvcore.CacheConfig(64, [kvcore.LayerConfig(kvcore.Ring(8), 1, 4), kvcore.LayerConfig(kvcore.Flat(), 2, 4)],
                                                max_step=4, batch=kvcore.BatchLimits(block_size=4, max_seqs=4, num_blocks=32)))
    rows = 32 * 4 * 4 * 4 * 2  # 32 blocks of 4 rows, 4 float32 per K and V row
    assert kvcore.PagedKVPool.required_bytes(wide, np.float32) - kvcore.PagedKVPool.required_bytes(c, np.float32) >= 2 * rows
