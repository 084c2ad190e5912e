"""Writes the seed corpus of the record fuzzer (tests/fuzz/record_fuzzer.cpp) into
tests/fuzz/record_corpus: valid records of every layout its destinations take.

Each file is one mode byte (bit 0: the harness fixes the checksum before parsing;
bits 1-2: the destination, 0 a SequenceCache, 1/2/3 a BatchCache of block size
1/2/4; bit 3: a SequenceCache of Ring, Flat, Shared and State layers instead)
followed by a record exported by kvcore: from a SequenceCache and from
BatchCaches of block sizes 1, 2 and 4, after random histories with rewinds,
with and without token ids, with a hole, a removed head, a fork, and lengths
from 0 past the rings' wrap. Run with the kvcore module importable:

    eval "$(scripts/dev.sh NAME)" && python3 tests/fuzz/make_record_corpus.py
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import numpy as np

import kvcore

OUT = Path(__file__).resolve().parent / "record_corpus"


def config(block_size: int) -> kvcore.CacheConfig:
    # Keep in step with destination() in record_fuzzer.cpp.
    layers = [
        kvcore.LayerConfig(kvcore.Ring(4, 1), 1, 2),
        kvcore.LayerConfig(kvcore.Flat(), 1, 2),
        kvcore.LayerConfig(kvcore.Ring(6, 2), 1, 2),
    ]
    batch = kvcore.BatchLimits(block_size=block_size, max_seqs=2, max_holes=4)
    return kvcore.CacheConfig(64, layers, max_step=3, batch=batch)


def rows(rng: random.Random, T: int) -> np.ndarray:
    return np.array([[[rng.uniform(-4, 4) for _ in range(2)]] for _ in range(T)], np.float16)


def from_sequence_cache(rng: random.Random, length: int) -> bytes:
    cache = kvcore.SequenceCache(config(1))
    pool = kvcore.KVPool(cache, np.float16)
    while cache.length < length:
        T = min(rng.randint(1, 3), length - cache.length)
        step = cache.begin_step(T)
        for layer in range(3):
            pool.update(layer, step, rows(rng, T), rows(rng, T))
        cache.commit(step)
        n = cache.length - rng.randint(1, 3)
        if rng.random() < 0.25 and n >= 0 and cache.can_rewind(n):
            cache.rewind(n)
    tokens = [rng.randrange(50) for _ in range(length)] if rng.random() < 0.5 else None
    return bytes(pool.export_sequence(tokens))


def from_batch_cache(rng: random.Random, block_size: int, length: int, shape: str) -> bytes:
    cache = kvcore.BatchCache(config(block_size))
    pool = kvcore.PagedKVPool(cache, np.float16)
    cache.add_sequence(0)
    tokens = [rng.randrange(50) for _ in range(64)]
    while cache.sequence(0).length < length:
        L = cache.sequence(0).length
        T = min(rng.randint(1, 3), length - L)
        step = cache.begin_step([(0, T, tokens[L : L + T])])
        for layer in range(3):
            pool.update(layer, step, rows(rng, T), rows(rng, T))
        cache.commit(step)
        n = cache.sequence(0).length - rng.randint(1, 3)
        if rng.random() < 0.25 and n >= 0 and cache.can_rewind(0, n):
            cache.rewind(0, n)
    L = cache.sequence(0).length
    if shape == "fork" and L > 0:
        cache.fork(0, 1, L)
    elif shape == "hole" and L > 8:
        cache.remove(0, 3, 5)
    elif shape == "head" and L > 6:
        cache.remove(0, 0, 4)
    return bytes(pool.export_sequence(0, tokens[:L] if rng.random() < 0.5 else None))


def kinds_config() -> kvcore.CacheConfig:
    # Keep in step with kinds_destination() in record_fuzzer.cpp.
    layers = [
        kvcore.LayerConfig(kvcore.Ring(4, 1), 1, 2),
        kvcore.LayerConfig(kvcore.Flat(), 1, 2),
        kvcore.LayerConfig(kvcore.Shared(0), 1, 2),
        kvcore.LayerConfig(kvcore.State(4)),
    ]
    return kvcore.CacheConfig(64, layers, max_step=3, initial_capacity=8)


def from_kinds_cache(rng: random.Random, length: int) -> bytes:
    """A record of Ring, Flat, Shared and State layers (version 3): verify steps keep every state."""
    cache = kvcore.SequenceCache(kinds_config())
    pool = kvcore.KVPool(cache, np.float16, state_tensors={"h": ((16,), np.float32)})  # 64-byte states
    while cache.length < length:
        T = min(rng.randint(1, 3), length - cache.length)
        step = cache.begin_step(T, verify=rng.random() < 0.5)
        for layer in (0, 1):
            pool.update(layer, step, rows(rng, T), rows(rng, T))
        n = step.plan(3).write_len
        pool.write_state(3, step, {"h": np.array([[rng.uniform(-4, 4) for _ in range(16)] for _ in range(n)], np.float32)})
        cache.commit(step)
        back = cache.length - rng.randint(1, 3)
        if rng.random() < 0.25 and back >= 0 and cache.can_rewind(back):
            cache.rewind(back)
    return bytes(pool.export_sequence())


def main() -> None:
    OUT.mkdir(exist_ok=True)
    rng = random.Random(28)
    records: list[bytes] = []
    for length in (0, 1, 3, 7, 12, 20, 33, 50):
        records.append(from_sequence_cache(rng, length))
        for block_size in (1, 2, 4):
            for shape in ("plain", "fork", "hole", "head"):
                if rng.random() < 0.5:
                    records.append(from_batch_cache(rng, block_size, length, shape))
    # A few broken ones the harness reseals (mode bit 0), so the field checks
    # refuse them: a ring layer's held_from set to the length (incomplete), and
    # a flat layer's n_kv_heads set to 2^30 (its row bytes past the record).
    broken: list[bytes] = []
    for record in records[:12]:
        n_holes, n_tokens = (int.from_bytes(record[at : at + 4], "little") for at in (40, 44))
        layers = 64 + 8 * n_holes + 4 * n_tokens
        length = record[28:32]
        broken.append(record[: layers + 28] + length + record[layers + 32 :])
        broken.append(record[: layers + 40 + 12] + (1 << 30).to_bytes(4, "little") + record[layers + 40 + 16 :])
    # Kinds records go to the kinds destination (mode bit 3), with and without the checksum fix.
    for length in (0, 1, 2, 5, 9, 17, 30):
        record = from_kinds_cache(rng, length)
        for mode in (8, 9):
            data = bytes([mode]) + record
            (OUT / hashlib.sha1(data).hexdigest()).write_bytes(data)
    written = 0
    for record in broken:
        data = bytes([1]) + record
        (OUT / hashlib.sha1(data).hexdigest()).write_bytes(data)
        written += 1
    for i, record in enumerate(records):
        for mode in (i % 8, (i * 3 + 1) % 8):
            data = bytes([mode]) + record
            (OUT / hashlib.sha1(data).hexdigest()).write_bytes(data)
            written += 1
    print(f"{written} inputs in {OUT}")


if __name__ == "__main__":
    main()
