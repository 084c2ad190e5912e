"""Records and the prefix cache as a trust boundary (docs/state.md "Trust", docs/batch.md
"Prefix namespaces"): a record's token ids name blocks only when the importer trusts them,
prefix namespaces keep requests whose K/V differ for equal tokens apart, and an export of an
import equals the record byte for byte over random workloads (hypothesis)."""

from __future__ import annotations

import hashlib
import random
from typing import Any, Optional

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import kvcore
from hypothesis_profiles import profile_settings
from kvcore.state import RecordInfo, import_sequence

# Each example is one workload of up to 25 steps, rewinds and removals, exported,
# imported and exported again.
PROFILES: dict[str, dict[str, Any]] = {
    "dev": {"max_examples": 60, "derandomize": True, "database": None},
    "ci": {"max_examples": 300, "derandomize": True, "database": None},
    "long": {"max_examples": 20_000},
}
SETTINGS = profile_settings(PROFILES)

HEADS, DIM = 1, 2


def config(block_size: int = 4, capacity: int = 64) -> kvcore.CacheConfig:
    layers = [
        kvcore.LayerConfig(kvcore.Ring(6, 2), HEADS, DIM),
        kvcore.LayerConfig(kvcore.Flat(), HEADS, DIM),
        kvcore.LayerConfig(kvcore.Ring(5), HEADS, DIM),
    ]
    batch = kvcore.BatchLimits(block_size=block_size, max_seqs=4, max_holes=4)
    return kvcore.CacheConfig(capacity, layers, max_step=4, batch=batch)


def rows(version: int, first: int, T: int, layer: int) -> np.ndarray:
    out = np.empty((T, HEADS, DIM), np.float32)
    for t in range(T):
        out[t] = np.random.default_rng([version, first + t, layer]).standard_normal((HEADS, DIM))
    return out.astype(np.float16)


def step(cache: kvcore.BatchCache, pool: kvcore.PagedKVPool, seq: int, T: int, version: int,
         tokens: Optional[list[int]] = None) -> list[np.ndarray]:
    """A step of T tokens; each layer's read K rows (position order)."""
    L = cache.length(seq)
    entry = (seq, T, tokens[L : L + T]) if tokens is not None else (seq, T)
    s = cache.begin_step([entry])
    reads = []
    for layer in range(3):
        pool.update(layer, s, rows(version, L, T, layer), rows(version + 1, L, T, layer))
        k, _v, _pos = pool.gather(layer, s, 0)
        reads.append(np.array(k))
    cache.commit(s)
    return reads


TOKENS = [3 + i % 5 for i in range(64)]


def hostile_record() -> bytes:
    """The prompt's 24 token ids with K/V the prompt does not give (version 666)."""
    cache = kvcore.BatchCache(config())
    pool = kvcore.PagedKVPool(cache, np.float16)
    cache.add_sequence(0)
    for _ in range(6):
        step(cache, pool, 0, 4, 666, TOKENS)
    return bytes(pool.export_sequence(0, TOKENS[:24]))


def test_a_hostile_record_cannot_change_what_a_later_request_reads() -> None:
    record = hostile_record()
    cache = kvcore.BatchCache(config())
    pool = kvcore.PagedKVPool(cache, np.float16)

    def hit(seq: int, namespace: Any) -> int:
        cache.add_sequence(seq, namespace)
        n = cache.adopt_prefix(seq, TOKENS[:32])  # extends the record: a ring hit needs its window
        cache.release_sequence(seq)
        return int(n)

    import_sequence(pool, 1, record)  # untrusted: names nothing
    cache.release_sequence(1)
    assert hit(2, None) == 0
    import_sequence(pool, 1, record, namespace=b"tenant-a")
    assert cache.prefix_namespace(1) == cache_namespace(b"tenant-a")
    cache.release_sequence(1)
    assert hit(2, None) == 0 and hit(2, "tenant-b") == 0 and hit(2, 7) == 0
    assert hit(2, b"tenant-a") == 24 and hit(2, "tenant-a") == 24  # str is hashed as its UTF-8 bytes
    # An honest request of the default namespace computes the prompt; a later one reads its rows.
    cache.add_sequence(3)
    for _ in range(6):
        step(cache, pool, 3, 4, 1, TOKENS)
    cache.release_sequence(3)
    cache.add_sequence(2)
    assert cache.adopt_prefix(2, TOKENS[:32]) == 24
    twin = kvcore.BatchCache(config())
    twin_pool = kvcore.PagedKVPool(twin, np.float16)
    twin.add_sequence(0)
    for _ in range(6):
        step(twin, twin_pool, 0, 4, 1, TOKENS)
    for a, b in zip(step(cache, pool, 2, 1, 5), step(twin, twin_pool, 0, 1, 5)):
        assert np.array_equal(a, b), "a later request read the record's K/V"
    # trust_tokens=True names blocks in the default namespace (a deployment's own records).
    other = kvcore.BatchCache(config())
    other_pool = kvcore.PagedKVPool(other, np.float16)
    import_sequence(other_pool, 1, record, trust_tokens=True)
    other.release_sequence(1)
    other.add_sequence(2)
    assert other.adopt_prefix(2, TOKENS[:32]) == 24


def cache_namespace(name: bytes) -> int:
    """The documented hash of a bytes namespace: BLAKE2b, 8 bytes, person b"kvcore-ns", little-endian."""
    return int.from_bytes(hashlib.blake2b(name, digest_size=8, person=b"kvcore-ns").digest(), "little")


def test_namespaces_are_given_inherited_and_refused_by_name() -> None:
    cache = kvcore.BatchCache(config())
    cache.add_sequence(0, 2**64 - 1)
    assert cache.prefix_namespace(0) == 2**64 - 1
    cache.fork(0, 1)
    assert cache.prefix_namespace(1) == 2**64 - 1
    assert cache.adopt_prefix(1, TOKENS[:8], namespace="x") == 0 and cache.prefix_namespace(1) == cache_namespace(b"x")
    cache.release_sequence(1)
    assert cache.prefix_namespace(1) == 0
    for bad, text in ((-1, r"namespace = -1: an int namespace must be in \[0, 2\*\*64\)"),
                      (2**64, "must be in"), (True, "not a bool"), (1.5, "not float")):
        with pytest.raises(kvcore.InvalidArgumentError, match=text):
            cache.add_sequence(2, bad)
        assert not cache.sequence(2).active
    cache.add_sequence(2)
    with pytest.raises(kvcore.InvalidArgumentError, match="not float"):
        cache.adopt_prefix(2, TOKENS[:8], namespace=1.5)
    assert cache.prefix_namespace(2) == 0
    pool = kvcore.PagedKVPool(cache, np.float16)
    with pytest.raises(kvcore.InvalidArgumentError, match="not list"):
        pool.import_sequence(3, hostile_record(), namespace=[1])
    assert not cache.sequence(3).active
    seq_pool = kvcore.KVPool(kvcore.SequenceCache(config()), np.float16)
    with pytest.raises(kvcore.InvalidArgumentError, match="keys no prefix"):
        import_sequence(seq_pool, b"", trust_tokens=True)


@st.composite
def workloads(draw: Any) -> tuple[int, list[tuple[str, int]]]:
    block_size = draw(st.sampled_from([0, 1, 2, 4]))  # 0: a SequenceCache
    ops = draw(st.lists(st.tuples(st.sampled_from(["step", "step", "step", "rewind", "hole", "head"]),
                                  st.integers(1, 4)), min_size=1, max_size=25))
    return block_size, ops


@SETTINGS
@given(workloads())
def test_a_re_export_equals_the_record_byte_for_byte(workload: tuple[int, list[tuple[str, int]]]) -> None:
    block_size, ops = workload
    cfg = config(block_size or 4)
    version = 1
    if block_size == 0:
        cache: Any = kvcore.SequenceCache(cfg)
        pool: Any = kvcore.KVPool(cache, np.float16)
        for op, n in ops:
            if op == "step" and cache.length + n <= cfg.capacity:
                s = cache.begin_step(n)
                for layer in range(3):
                    pool.update(layer, s, rows(version, cache.length, n, layer), rows(version, cache.length, n, layer))
                cache.commit(s)
                version += 1
            elif op == "rewind" and cache.can_rewind(cache.length - n):
                cache.rewind(cache.length - n)
        record = bytes(pool.export_sequence())
        other = kvcore.SequenceCache(cfg)
        other_pool = kvcore.KVPool(other, np.float16)
        import_sequence(other_pool, record)
        assert bytes(other_pool.export_sequence()) == record
        return
    batch = kvcore.BatchCache(cfg)
    paged = kvcore.PagedKVPool(batch, np.float16)
    batch.add_sequence(0)
    rng = random.Random(len(ops))
    for op, n in ops:
        L = batch.length(0)
        if op == "step" and L + n <= cfg.capacity:
            step(batch, paged, 0, n, version, TOKENS)
            version += 1
        elif op == "rewind" and batch.can_rewind(0, L - n):
            batch.rewind(0, L - n)
        elif op == "hole" and L > n + 2 and len(batch.sequence(0).holes) < 3:
            p0 = rng.randrange(1, L - n)
            batch.remove(0, p0, p0 + n)
        elif op == "head" and L > n:
            batch.remove(0, 0, n)
    L = batch.length(0)
    record = bytes(paged.export_sequence(0, TOKENS[:L]))
    other = kvcore.BatchCache(cfg)
    other_paged = kvcore.PagedKVPool(other, np.float16)
    import_sequence(other_paged, 1, record)
    again = bytes(other_paged.export_sequence(1, TOKENS[:L]))
    info = RecordInfo.of(record)
    if info.start == 0 and not info.holes:
        assert again == record
        return
    # With removed positions a ring layer's held_from may differ where it lies on removed
    # positions (docs/state.md, "Version rules"): every other field, position and row is equal.
    back = RecordInfo.of(again)
    assert (back.length, back.start, back.holes, list(back.tokens)) == (info.length, info.start, info.holes,
                                                                       list(info.tokens))
    for layer in range(3):
        assert np.array_equal(back.positions(layer), info.positions(layer))
        for a, b in zip(back.rows(layer), info.rows(layer)):
            assert np.array_equal(a, b)
