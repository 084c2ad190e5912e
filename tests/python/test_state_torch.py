"""Sequence records of the torch pool (TorchKVPool, docs/state.md).

A TorchKVPool and a KVPool run the same random history (flat layers, rings with
sinks past the wrap, rewinds) on twin SequenceCaches; their records must be equal
byte for byte. Records then move torch -> torch, torch -> numpy (KVPool and a
BatchCache's PagedKVPool) and numpy -> torch, and both sides decode the same
steps: every read (positions and bytes) and every can_rewind answer agree.
Every refusal names its cause and changes nothing (cache and tensors).
"""

from __future__ import annotations

import random
from typing import Any, Optional

import numpy as np
import numpy.typing as npt
import pytest
from needs import BFLOAT16, need, needs_ml_dtypes

import kvcore

torch = need("torch")

from kvcore.torch.pool import TorchKVPool  # noqa: E402
from kvcore.torch.step_layout import read_positions  # noqa: E402
from kvcore.state import RecordInfo, export_sequence, import_sequence  # noqa: E402
from torch_bits import same_bits  # noqa: E402

Array = npt.NDArray[Any]
POLICIES = [kvcore.Ring(6, 2), kvcore.Flat(), kvcore.Ring(5), kvcore.Ring(6, 2)]
HEADS, DIM = 2, 4
DTYPES = [(np.float32, torch.float32), (np.float16, torch.float16), (BFLOAT16, torch.bfloat16)]
# The parameter list: the bfloat16 case skips, visibly, without ml_dtypes (needs.py).
DTYPE_CASES = [pytest.param(d, id=i, marks=[needs_ml_dtypes] if i == "bfloat16" else [])
               for d, i in zip(DTYPES, ["float32", "float16", "bfloat16"])]


def config(capacity: int = 48, max_step: int = 3) -> kvcore.CacheConfig:
    layers = [kvcore.LayerConfig(p, HEADS, DIM) for p in POLICIES]
    batch = kvcore.BatchLimits(block_size=2, max_seqs=2, max_holes=4)
    return kvcore.CacheConfig(capacity, layers, max_step=max_step, initial_capacity=4, batch=batch)


def content(layer: int, first: int, T: int, version: int, value: bool, dtype: Any) -> Array:
    out = np.empty((T, HEADS, DIM), dtype=np.float32)
    for t in range(T):
        out[t] = np.random.default_rng([layer, first + t, version, int(value)]).standard_normal((HEADS, DIM))
    return out.astype(dtype)


def to_torch(a: Array, dtype: Any) -> Any:
    """(T, H, D) numpy rows as a [1, H, T, D] tensor of the same bytes."""
    t = torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(dtype) if dtype == torch.bfloat16 else torch.from_numpy(a)
    return t.permute(1, 0, 2).unsqueeze(0).contiguous()


class Side:
    """A SequenceCache with a KVPool (numpy) or a TorchKVPool."""

    def __init__(self, cfg: kvcore.CacheConfig, dtypes: tuple[Any, Any], use_torch: bool, mirror: bool = False) -> None:
        self.np_dtype, self.t_dtype = dtypes
        self.cache = kvcore.SequenceCache(cfg)
        self.torch = use_torch
        if use_torch:
            self.pool: Any = TorchKVPool(self.cache, order="positions", mirror_rings=mirror)
        else:
            self.pool = kvcore.KVPool(self.cache, self.np_dtype, mirror_rings=mirror)

    def step(self, T: int, version: int) -> list[tuple[Array, Array, list[int]]]:
        """A step of T tokens; each layer's read (k, v as float32 (n, H, D), positions)."""
        first, reads = self.cache.length, []
        step = self.cache.begin_step(T)
        for layer in range(len(POLICIES)):
            k = content(layer, first, T, version, False, self.np_dtype)
            v = content(layer, first, T, version, True, self.np_dtype)
            if self.torch:
                got_k, got_v = self.pool.update(layer, step, to_torch(k, self.t_dtype), to_torch(v, self.t_dtype))
                positions = read_positions(step.plan(layer))
                got = [x[0].permute(1, 0, 2).float().numpy().copy() for x in (got_k, got_v)]  # the workspace is reused
            else:
                nk, nv, pos = self.pool.update(layer, step, k, v, order="positions")
                positions = [int(p) for p in pos]
                got = [np.asarray(x, dtype=np.float32) for x in (nk, nv)]
            reads.append((got[0], got[1], positions))
        self.cache.commit(step)
        return reads


def history(sides: list[Side], rng: random.Random, target: int, max_step: int = 3) -> None:
    version = 1
    while sides[0].cache.length < target:
        T = min(rng.randint(1, max_step), target - sides[0].cache.length)
        for s in sides:
            s.step(T, version)
        version += 1
        n = sides[0].cache.length - rng.randint(1, max_step)
        if rng.random() < 0.25 and n >= 0 and sides[0].cache.can_rewind(n):
            for s in sides:
                s.cache.rewind(n)


def agree(a: Side, b: Side, rng: random.Random, steps: int = 6) -> None:
    """Same length and rewinds now, then the same reads over `steps` more steps."""
    assert a.cache.length == b.cache.length
    assert [a.cache.can_rewind(n) for n in range(a.cache.length + 1)] == [
        b.cache.can_rewind(n) for n in range(b.cache.length + 1)
    ]
    for s in range(steps):
        T = rng.randint(1, 3)
        for (ka, va, pa), (kb, vb, pb) in zip(a.step(T, 100 + s), b.step(T, 100 + s)):
            assert pa == pb
            np.testing.assert_array_equal(ka, kb)
            np.testing.assert_array_equal(va, vb)


@pytest.mark.parametrize("mirror", [False, True])
@pytest.mark.parametrize("dtypes", DTYPE_CASES)
@pytest.mark.parametrize("length", [5, 30])  # 30: the rings wrapped, sinks kept
def test_round_trips(dtypes: tuple[Any, Any], mirror: bool, length: int) -> None:
    rng = random.Random(length)
    cfg = config()
    t_side, n_side = Side(cfg, dtypes, True, mirror), Side(cfg, dtypes, False, mirror)
    history([t_side, n_side], rng, length)
    tokens = list(range(t_side.cache.length))
    record = export_sequence(t_side.pool, tokens=tokens)
    assert record == export_sequence(n_side.pool, tokens=tokens)  # torch and numpy: the same bytes
    assert RecordInfo.of(record).length == length

    t2 = Side(cfg, dtypes, True, mirror)  # torch -> torch
    import_sequence(t2.pool, record)
    assert t2.pool.export_sequence(tokens) == record  # an export of an import is the record
    n2 = Side(cfg, dtypes, False)  # torch -> numpy
    import_sequence(n2.pool, record)
    t3 = Side(cfg, dtypes, True, not mirror)  # numpy -> torch (the other mirror choice)
    t3.pool.import_sequence(export_sequence(n_side.pool, tokens=tokens))
    batch = kvcore.BatchCache(cfg)  # torch -> a BatchCache
    paged = kvcore.PagedKVPool(batch, dtypes[0])
    import_sequence(paged, 1, record)
    assert batch.sequence(1).length == length

    assert export_sequence(n2.pool, tokens=tokens) == record
    t4 = Side(cfg, dtypes, True)
    t4.pool.import_sequence(record)

    # Each pair decodes the same steps (a side is used in one pair: decoding changes it).
    agree(t_side, t2, random.Random(1))  # the exporter and its torch import
    agree(n_side, t3, random.Random(2))  # numpy exporter, torch importer
    agree(n2, t4, random.Random(3))  # torch record imported by numpy and by torch


def snapshot(side: Side) -> tuple[int, list[Any]]:
    layers = [side.pool.layer(i) for i in range(len(POLICIES))]
    return side.cache.length, [None if lp is None else (lp.keys.clone(), lp.values.clone()) for lp in layers]


def same(before: tuple[int, list[Any]], side: Side) -> None:
    length, layers = before
    assert side.cache.length == length
    for old, lp in zip(layers, (side.pool.layer(i) for i in range(len(POLICIES)))):
        assert (old is None) == (lp is None)
        if old is not None:
            # Bit for bit: rows never written hold whatever memory held, NaN included (NaN != NaN).
            assert same_bits(old[0], lp.keys) and same_bits(old[1], lp.values)



def make(length: int, dtypes: tuple[Any, Any] = DTYPES[0], cfg: Optional[kvcore.CacheConfig] = None) -> Side:
    side = Side(cfg or config(), dtypes, True)
    history([side], random.Random(7), length)
    return side


def test_import_refusals_change_nothing() -> None:
    record = make(20).pool.export_sequence()
    full = make(9)  # holds positions
    before = snapshot(full)
    with pytest.raises(kvcore.InvalidStateError, match="holds 9 positions"):
        full.pool.import_sequence(record)
    same(before, full)

    empty = Side(config(), DTYPES[0], True)
    corrupt = bytearray(record)
    corrupt[200] ^= 1
    for bad, match in [(bytes(corrupt), "corrupt"), (record[:-9], "truncated")]:
        before = snapshot(empty)
        with pytest.raises(kvcore.InvalidArgumentError, match=match):
            empty.pool.import_sequence(bad)
        same(before, empty)

    other = kvcore.CacheConfig(48, [kvcore.LayerConfig(kvcore.Flat(), HEADS, DIM)] * 4, max_step=3)
    foreign = Side(other, DTYPES[0], True)
    history([foreign], random.Random(1), 10)
    before = snapshot(empty)
    with pytest.raises(kvcore.InvalidArgumentError, match="polic|kind|window"):
        empty.pool.import_sequence(foreign.pool.export_sequence())
    same(before, empty)

    small = config(capacity=12)
    tight = Side(small, DTYPES[0], True)
    before = snapshot(tight)
    with pytest.raises(kvcore.CapacityError):
        tight.pool.import_sequence(record)
    same(before, tight)


def test_import_refuses_a_record_of_mixed_dtypes() -> None:
    # float16 -> bfloat16 on one layer keeps every size: a valid record a torch pool still refuses.
    record = bytearray(make(20, DTYPES[1]).pool.export_sequence())
    info = RecordInfo.of(bytes(record))
    entry = 64 + 8 * len(info.holes) + 4 * len(info.tokens)  # the layer table (docs/state.md)
    assert record[entry + 1] == 1  # layer 0's dtype code: float16
    record[entry + 1] = 2
    kvcore._core.seal_record(record)
    kvcore._core.check_record(record)
    empty = Side(config(), DTYPES[1], True)
    before = snapshot(empty)
    with pytest.raises(kvcore.InvalidArgumentError, match="imports one dtype"):
        empty.pool.import_sequence(bytes(record))
    same(before, empty)


def test_export_refuses_a_layer_without_tensors() -> None:
    side = Side(config(), DTYPES[0], True)
    step = side.cache.begin_step(3)  # committed without the pool writing a row
    side.cache.commit(step)
    with pytest.raises(kvcore.InvalidStateError, match="layer 0 holds no tensors but the sequence has 3 positions"):
        side.pool.export_sequence()
    assert side.cache.length == 3 and side.pool.layer(0) is None


def test_export_refusals_change_nothing() -> None:
    side = make(10)
    before = snapshot(side)
    step = side.cache.begin_step(1)
    with pytest.raises(kvcore.InvalidStateError, match="step is begun"):
        side.pool.export_sequence()
    side.cache.abort(step)
    same(before, side)
    with pytest.raises(kvcore.InvalidArgumentError, match="tokens"):
        side.pool.export_sequence(list(range(11)))
    with pytest.raises(kvcore.InvalidArgumentError, match="one dtype"):
        side.pool.export_sequence(dtype=torch.float16)
    side.pool.map_batch(0, lambda t: t.repeat(2, 1, 1, 1))
    with pytest.raises(kvcore.InvalidArgumentError, match="batch of 2"):
        side.pool.export_sequence()

    empty = Side(config(), DTYPES[0], True)
    with pytest.raises(kvcore.InvalidArgumentError, match="pass dtype"):
        empty.pool.export_sequence()
    assert empty.pool.export_sequence(dtype=torch.float16) == kvcore.KVPool(
        kvcore.SequenceCache(config()), np.float16
    ).export_sequence()
    with pytest.raises(kvcore.InvalidArgumentError, match="seq"):
        export_sequence(empty.pool, 0)


def test_a_torch_pools_records_refuse_shared_layers_by_name_and_change_nothing() -> None:
    # KVPool's records carry a Shared layer (test_kv_pool_kinds.py); a torch pool's do not yet.
    def shared_cache() -> kvcore.SequenceCache:
        layers = [kvcore.LayerConfig(kvcore.Flat(), 1, 4), kvcore.LayerConfig(kvcore.Shared(0), 1, 4)]
        return kvcore.SequenceCache(kvcore.CacheConfig(capacity=16, layers=layers, max_step=2))

    source = kvcore.SequenceCache(kvcore.CacheConfig(capacity=16, layers=[kvcore.LayerConfig(kvcore.Flat(), 1, 4)] * 2, max_step=2))
    record = kvcore.KVPool(source, np.float32).export_sequence()
    cache = shared_cache()
    pool = TorchKVPool(cache)
    with pytest.raises(kvcore.NotSupportedError, match=r"^export: layer 1 is a Shared layer; a torch pool's records do not carry Shared layers yet \(a KVPool's do\)$"):
        export_sequence(pool)
    with pytest.raises(kvcore.NotSupportedError, match=r"^import: layer 1 is a Shared layer; a torch pool's records"):
        import_sequence(pool, record)
    assert cache.length == 0
