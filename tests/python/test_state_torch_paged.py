"""Sequence records of the torch paged store (TorchPagedKVPool, docs/state.md).

A TorchPagedKVPool and a numpy PagedKVPool run the same random history (flat layers,
rings with sinks past the wrap, rewinds, holes, a removed head, forks, prefix hits;
block sizes 1 and 16; float32, float16, bfloat16) on twin BatchCaches: their records
must be equal byte for byte. Records then move torch -> torch, torch -> numpy and
numpy -> torch across block sizes, and between a BatchCache and a SequenceCache
(TorchKVPool, KVPool); afterwards every can_rewind answer and every read of the
following steps (positions and bytes) equals the exporter's. An import that shares a
cached prefix writes no shared block (they are poisoned first, and stay so). Every
refusal names its cause and changes nothing (the cache and every tensor byte).
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

import test_state as paged  # noqa: E402  (numpy BatchCache sides, histories, comparisons)
import test_state_torch as seq_torch  # noqa: E402  (SequenceCache sides: TorchKVPool and KVPool)
from kvcore.torch.paged import TorchPagedKVPool  # noqa: E402
from kvcore.state import RecordInfo, export_sequence, import_sequence  # noqa: E402
from torch_bits import same_bits  # noqa: E402

Array = npt.NDArray[Any]
DTYPES = [(np.float32, torch.float32), (np.float16, torch.float16), (BFLOAT16, torch.bfloat16)]
# The parameter list: the bfloat16 case skips, visibly, without ml_dtypes (needs.py).
DTYPE_CASES = [pytest.param(d, id=i, marks=[needs_ml_dtypes] if i == "bfloat16" else [])
               for d, i in zip(DTYPES, ["float32", "float16", "bfloat16"])]
CAPACITY, MAX_STEP = 96, 4


def to_torch(a: Array, dtype: Any) -> Any:
    """(T, H, D) numpy rows as a [1, H, T, D] tensor of the same bytes."""
    return torch.from_numpy(np.ascontiguousarray(a).view(np.uint8)).view(dtype).permute(1, 0, 2).unsqueeze(0)


class TorchSide:
    """Sequence `seq` of a BatchCache whose rows live in a TorchPagedKVPool (test_state.Side's interface)."""

    def __init__(self, cfg: kvcore.CacheConfig, dtypes: tuple[Any, Any], seq: int, preallocate: bool = False) -> None:
        self.np_dtype, self.t_dtype = dtypes
        self.dtype = self.np_dtype
        self.seq = seq
        self.cache = kvcore.BatchCache(cfg)
        self.pool = TorchPagedKVPool(self.cache, dtype=self.t_dtype, preallocate=preallocate)

    @property
    def length(self) -> int:
        return int(self.cache.sequence(self.seq).length)

    def can_rewind(self, n: int) -> bool:
        return bool(self.cache.can_rewind(self.seq, n))

    def rewind(self, n: int) -> None:
        self.cache.rewind(self.seq, n)

    def step(self, T: int, version: int, tokens: Optional[list[int]] = None) -> list[tuple[Array, Array, Array]]:
        """A step of T tokens; each layer's read (k, v, positions) as PagedKVPool.gather gives it."""
        first, reads, B = self.length, [], self.cache.block_size
        entry = (self.seq, T, tokens[first : first + T]) if tokens is not None else (self.seq, T)
        step = self.cache.begin_step([entry])
        plan = step.plan()
        for g, group in enumerate(plan.groups):
            self.pool.copy_blocks(g, group.copies)
        for layer in range(self.cache.n_layers):
            g = self.cache.group_of(layer)
            k = paged.content(layer, first, T, version, False, self.np_dtype)
            v = paged.content(layer, first, T, version, True, self.np_dtype)
            mask = plan.mask(g)
            slots = torch.from_numpy(plan.groups[g].slots.astype(np.int64))
            new_k, new_v = to_torch(k, self.t_dtype), to_torch(v, self.t_dtype)
            keys, values = self.pool.write_read(layer, slots, new_k, new_v, mask.shape[1])
            # The rows a query of the step sees, in position order (the table maps rows to positions).
            table = plan.groups[g].block_tables[plan.table_rows[self.seq]][: -(-(first + T) // B)]
            position_of = {int(b) * B + j: i * B + j for i, b in enumerate(table) if b >= 0 for j in range(B)}
            seen = sorted((position_of[int(r)], int(r)) for r in np.flatnonzero(mask.any(axis=0)))
            rows = torch.tensor([r for _, r in seen], dtype=torch.int64)
            got = [x[0].index_select(1, rows).permute(1, 0, 2).contiguous().view(torch.uint8).numpy()
                   for x in (keys, values)]  # fmt: skip
            positions = np.array([p for p, _ in seen], dtype=np.int64)
            reads.append((got[0].view(self.np_dtype), got[1].view(self.np_dtype), positions))
        self.cache.commit(step)
        return reads

    def export(self, tokens: Optional[list[int]] = None) -> bytes:
        return self.pool.export_sequence(self.seq, None if tokens is None else tokens[: self.length])


def numpy_side(block_size: int, dtypes: tuple[Any, Any], seq: int) -> paged.Side:
    return paged.Side(paged.config(CAPACITY, MAX_STEP, block_size), dtypes[0], seq=seq)


def torch_side(block_size: int, dtypes: tuple[Any, Any], seq: int, preallocate: bool = False) -> TorchSide:
    return TorchSide(paged.config(CAPACITY, MAX_STEP, block_size), dtypes, seq, preallocate)


def shaped(side: Any, shape: str, rng: random.Random, tokens: list[int]) -> None:
    """A history of about 40 positions (the rings wrapped, sinks kept), then the shape's verb."""
    side.cache.add_sequence(side.seq)
    paged.history(side, rng, 40, MAX_STEP, tokens)
    if shape == "fork":
        side.cache.fork(side.seq, 2, side.length)
        side.seq = 2
    if shape == "hole":
        side.cache.remove(side.seq, 3, 9)
    if shape == "head":
        side.cache.remove(side.seq, 0, 5)


def holds_prefix(side: Any, tokens: list[int]) -> None:
    """The importer holds the prompt's first 16 positions as sequence 0."""
    seq, side.seq = side.seq, 0
    side.cache.add_sequence(0)
    for _ in range(4):
        side.step(4, 1, tokens)
    side.seq = seq


@pytest.mark.parametrize("dtypes", DTYPE_CASES)
@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("shape", ["plain", "hole", "head", "fork", "prefix"])
def test_round_trips_with_paged_kv_pool(dtypes: tuple[Any, Any], block_size: int, shape: str) -> None:
    seed = hash((block_size, shape)) & 0xFFFF
    tokens = [random.Random(seed).randrange(50) for _ in range(CAPACITY)]
    t_side, n_side = torch_side(block_size, dtypes, 0), numpy_side(block_size, dtypes, 0)
    shaped(t_side, shape, random.Random(seed), tokens)
    shaped(n_side, shape, random.Random(seed), tokens)
    record = t_side.export(tokens)
    assert record == n_side.export(tokens)  # torch and numpy: the same bytes
    assert RecordInfo.of(record).length == t_side.length

    t2 = torch_side(block_size, dtypes, 1)  # torch -> torch, same block size: exact
    import_sequence(t2.pool, 1, record)
    assert t2.export(tokens) == record  # an export of an import is the record
    paged.same_rewinds(t_side, t2, exact=True)
    for other in (1, 16):  # torch -> torch and torch -> numpy across block sizes, twins of each other
        to_t, to_n = torch_side(other, dtypes, 3), numpy_side(other, dtypes, 3)
        if shape == "prefix":
            holds_prefix(to_t, tokens)
            holds_prefix(to_n, tokens)
        if other > block_size and t_side.length > 8:  # a 16-row sink block keeps positions the exporter released
            for side in (to_t, to_n):
                with pytest.raises(kvcore.NotSupportedError, match="divides the sinks"):
                    import_sequence(side.pool, 3, record)
                assert not side.cache.sequence(3).active
            continue
        import_sequence(to_t.pool, 3, record)
        import_sequence(to_n.pool, 3, record)
        assert to_t.export(tokens) == to_n.export(tokens)
        paged.same_rewinds(t_side, to_t, exact=other == block_size)
        paged.same_rewinds(to_n, to_t, exact=True)
        paged.decode_both(to_n, to_t, random.Random(5), 6, MAX_STEP, CAPACITY)
    n2 = torch_side(block_size, dtypes, 0)  # numpy -> torch
    import_sequence(n2.pool, 0, n_side.export(tokens))
    assert n2.export(tokens) == record
    paged.decode_both(t_side, t2, random.Random(7), 8, MAX_STEP, CAPACITY)  # the exporter and its import
    paged.decode_both(n_side, n2, random.Random(8), 8, MAX_STEP, CAPACITY)


@pytest.mark.parametrize("dtypes", DTYPE_CASES)
def test_round_trips_with_a_sequence_cache(dtypes: tuple[Any, Any]) -> None:
    cfg = seq_torch.config()  # the same layers as paged.config's
    rng = random.Random(11)
    t_seq, n_seq = seq_torch.Side(cfg, dtypes, True), seq_torch.Side(cfg, dtypes, False)
    seq_torch.history([t_seq, n_seq], rng, 30)  # the rings wrapped, sinks kept
    record = export_sequence(t_seq.pool)
    assert record == export_sequence(n_seq.pool)
    for block_size in (1, 2):  # block sizes dividing the sinks: every SequenceCache record fits
        to_t, to_n = torch_side(block_size, dtypes, 1), numpy_side(block_size, dtypes, 1)
        import_sequence(to_t.pool, 1, record)
        import_sequence(to_n.pool, 1, record)
        assert to_t.export() == to_n.export()
        paged.same_rewinds(to_n, to_t, exact=True)
        paged.decode_both(to_n, to_t, random.Random(block_size), 6, MAX_STEP, 48)

    # A TorchPagedKVPool's sequence into a TorchKVPool and a KVPool (no holes: a SequenceCache has none).
    exporter = torch_side(2, dtypes, 0)
    twin = numpy_side(2, dtypes, 0)
    for side in (exporter, twin):
        side.cache.add_sequence(0)
        paged.history(side, random.Random(3), 30, 3)
    record = exporter.export()
    assert record == twin.export()
    t_back, n_back = seq_torch.Side(cfg, dtypes, True), seq_torch.Side(cfg, dtypes, False)
    t_back.pool.import_sequence(record)
    import_sequence(n_back.pool, record)
    assert export_sequence(t_back.pool) == export_sequence(n_back.pool)
    seq_torch.agree(t_back, n_back, random.Random(4))


def poison(kv: TorchPagedKVPool, cache: kvcore.BatchCache, seq: int) -> dict[tuple[int, int], Any]:
    """Fill every row of the sequence's blocks with 0x7f bytes (a NaN in every float dtype);
    returns each (layer, block)'s K/V before."""
    before = {}
    B = cache.block_size
    for layer in range(cache.n_layers):
        tensors = kv.tensors(layer)
        assert tensors is not None
        for block in cache.block_table(seq, cache.group_of(layer)):
            if block >= 0:
                rows = slice(int(block) * B, (int(block) + 1) * B)
                before[layer, int(block)] = tuple(t[:, :, rows].clone() for t in tensors)
                for t in tensors:
                    t[:, :, rows].view(torch.uint8).fill_(0x7F)
    return before


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_an_import_sharing_a_cached_prefix_writes_no_shared_block(block_size: int) -> None:
    dtypes = DTYPES[1]
    tokens = [random.Random(2).randrange(50) for _ in range(CAPACITY)]
    exporter = torch_side(block_size, dtypes, 0)
    exporter.cache.add_sequence(0)
    for _ in range(10):  # 40 positions of the prompt, version 1: the importer's prefix holds the same bytes
        exporter.step(4, 1, tokens)
    record = exporter.export(tokens)
    importer = torch_side(block_size, dtypes, 3)
    holds_prefix(importer, tokens)
    cache, kv = importer.cache, importer.pool
    before = poison(kv, cache, 0)
    import_sequence(kv, 3, record, trust_tokens=True)  # the record's token ids may share blocks
    B, shared = cache.block_size, 0
    for layer in range(cache.n_layers):
        g = cache.group_of(layer)
        mine, prefix = cache.block_table(3, g), cache.block_table(0, g)
        shared += int(np.sum((mine[: len(prefix)] == prefix) & (prefix >= 0)))
        tensors = kv.tensors(layer)
        assert tensors is not None
        for (lay, block), old in before.items():
            if lay == layer:  # still poisoned: the import wrote none of sequence 0's blocks
                rows = slice(block * B, (block + 1) * B)
                assert all(bool((t[:, :, rows].view(torch.uint8) == 0x7F).all()) for t in tensors), (layer, block)
                for t, o in zip(tensors, old):
                    t[:, :, rows] = o  # the prefix's bytes back, for the export below
    assert shared > 0  # the flat group at least shares the prompt's full blocks
    assert importer.export(tokens) == record  # the fresh blocks hold the record's rows


def test_import_reports_the_blocks_it_wrote() -> None:
    tokens = list(range(CAPACITY))
    exporter = numpy_side(4, DTYPES[0], 0)
    exporter.cache.add_sequence(0)
    for _ in range(6):
        exporter.step(4, 1, tokens)
    record = exporter.export(tokens)
    importer = numpy_side(4, DTYPES[0], 3)
    holds_prefix(importer, tokens)
    cache = importer.cache
    written = importer.pool.import_sequence(3, record, written=True, trust_tokens=True)
    assert written.dtype == np.int32 and written.shape[1] == 3
    expect = []
    for g in range(cache.n_groups):
        mine, prefix = cache.block_table(3, g), cache.block_table(0, g)
        for i, block in enumerate(mine):
            if block >= 0 and not (i < len(prefix) and prefix[i] == block):
                expect.append((g, i, int(block)))
    assert sorted(map(tuple, written.tolist())) == expect
    assert len(expect) < sum(int((cache.block_table(3, g) >= 0).sum()) for g in range(cache.n_groups))
    assert importer.pool.import_sequence(1, record) is None  # without written=: None


def test_block_table_names_each_blocks_id() -> None:
    cache = kvcore.BatchCache(paged.config(CAPACITY, MAX_STEP, 2))
    assert cache.block_table(0, 0).shape == (0,)  # inactive
    cache.add_sequence(0)
    step = cache.begin_step([(0, 4)])
    plan = step.plan()
    want = [plan.groups[g].block_tables[plan.table_rows[0], :2].copy() for g in range(cache.n_groups)]
    cache.commit(step)
    for g in range(cache.n_groups):
        table = cache.block_table(0, g)
        assert table.dtype == np.int32 and list(table) == list(want[g])
    for _ in range(10):  # ring group 0 (window 6, sinks 2) releases blocks past its window
        cache.commit(cache.begin_step([(0, 2)]))
    ring = cache.block_table(0, cache.group_of(0))
    assert len(ring) == 12 and ring[0] >= 0 and (ring == -1).any()
    assert (cache.block_table(0, cache.group_of(1)) >= 0).all()  # flat: every block
    ring[0] = 99  # a copy: the cache is untouched
    assert cache.block_table(0, cache.group_of(0))[0] != 99
    with pytest.raises(kvcore.InvalidArgumentError, match=r"block_table: sequence 4 must be in \[0, max_seqs = 4\)"):
        cache.block_table(4, 0)
    with pytest.raises(kvcore.InvalidArgumentError, match=r"block_table: group = -1: must be in \[0, n_groups = "):
        cache.block_table(0, -1)
    with pytest.raises(TypeError, match="seq"):
        cache.block_table("a", 0)  # type: ignore[arg-type]


def snapshot(side: TorchSide) -> tuple[Any, list[Any]]:
    cache = side.cache
    tables = [[list(cache.block_table(s, g)) for g in range(cache.n_groups)] for s in range(cache.max_seqs)]
    state = [(repr(cache.sequence(s)), tables[s]) for s in range(cache.max_seqs)]
    counts = [(cache.used_blocks(g), cache.free_blocks(g), cache.cached_blocks(g)) for g in range(cache.n_groups)]
    tensors = [side.pool.tensors(layer) for layer in range(cache.n_layers)]
    return (state, counts), [None if t is None else (t[0].clone(), t[1].clone()) for t in tensors]


def unchanged(before: tuple[Any, list[Any]], side: TorchSide) -> None:
    now = snapshot(side)
    assert now[0] == before[0]
    for old, new in zip(before[1], now[1]):
        assert (old is None) == (new is None)
        if old is not None:  # bit for bit: rows never written hold whatever memory held
            assert same_bits(old[0], new[0]) and same_bits(old[1], new[1])


def exporter_of(block_size: int = 2, dtypes: tuple[Any, Any] = DTYPES[0], length: int = 20) -> TorchSide:
    side = torch_side(block_size, dtypes, 0)
    side.cache.add_sequence(0)
    paged.history(side, random.Random(7), length, MAX_STEP)
    return side


def refused(side: TorchSide, record: Any, seq: int, error: type, match: str) -> None:
    before = snapshot(side)
    with pytest.raises(error, match=match):
        side.pool.import_sequence(seq, record)
    unchanged(before, side)


def test_import_refusals_are_named_and_change_nothing() -> None:
    record = exporter_of().export()
    dest = torch_side(2, DTYPES[0], 0, preallocate=True)
    dest.cache.add_sequence(0)
    paged.history(dest, random.Random(1), 9, MAX_STEP)  # sequence 0 active, its rows written
    corrupt = bytearray(record)
    corrupt[200] ^= 1
    refused(dest, bytes(corrupt), 1, kvcore.InvalidArgumentError, "corrupt")
    refused(dest, record[:-9], 1, kvcore.InvalidArgumentError, "truncated")
    newer = bytearray(record)
    newer[8] = 4  # the version field: one past the newest (3)
    kvcore._core.seal_record(newer)
    refused(dest, bytes(newer), 1, kvcore.NotSupportedError, "version 4 is newer")
    refused(dest, record, 0, kvcore.InvalidStateError, "sequence 0 is active")
    refused(dest, record, 9, kvcore.InvalidArgumentError, "sequence 9 must be in")
    refused(dest, exporter_of(dtypes=DTYPES[1]).export(), 1, kvcore.InvalidArgumentError, "dtype float16 differs")
    refused(dest, exporter_of(length=4).export() + b"\0", 1, kvcore.InvalidArgumentError, "trailing|truncated")

    other = kvcore.CacheConfig(
        CAPACITY, [kvcore.LayerConfig(kvcore.Flat(), paged.HEADS, paged.DIM)] * 4, max_step=MAX_STEP,
        batch=kvcore.BatchLimits(block_size=2, max_seqs=4),
    )  # fmt: skip
    foreign = TorchSide(other, DTYPES[0], 0)
    foreign.cache.add_sequence(0)
    paged.history(foreign, random.Random(2), 10, MAX_STEP)
    refused(dest, foreign.export(), 1, kvcore.InvalidArgumentError, "policy")
    three = kvcore.CacheConfig(12, [kvcore.LayerConfig(kvcore.Flat(), paged.HEADS, paged.DIM)] * 3, max_step=MAX_STEP)
    short = kvcore.KVPool(kvcore.SequenceCache(three), np.float32)
    refused(dest, short.export_sequence(), 1, kvcore.InvalidArgumentError, "the record has 3 layers")

    tight = TorchSide(paged.config(CAPACITY, MAX_STEP, 2, num_blocks=6), DTYPES[0], 0, preallocate=True)
    refused(tight, record, 1, kvcore.CapacityError, "needs .* blocks")
    small = TorchSide(paged.config(12, MAX_STEP, 2), DTYPES[0], 0, preallocate=True)
    refused(small, record, 1, kvcore.CapacityError, "exceeds capacity")
    coarse = TorchSide(paged.config(CAPACITY, MAX_STEP, 16), DTYPES[0], 0, preallocate=True)
    refused(coarse, exporter_of(block_size=1, length=30).export(), 1, kvcore.NotSupportedError, "divides the sinks")

    wide = TorchSide(paged.config(CAPACITY, MAX_STEP, 2), (np.float64, torch.float64), 0, preallocate=True)
    refused(wide, record, 1, kvcore.InvalidArgumentError, "the tensors hold torch.float64")

    narrow = [kvcore.LayerConfig(p, 1, paged.DIM) for p in paged.POLICIES]  # one head, not two
    thin = TorchSide(kvcore.CacheConfig(CAPACITY, narrow, max_step=MAX_STEP, batch=kvcore.BatchLimits(block_size=2)),
                     DTYPES[0], 0, preallocate=True)  # fmt: skip
    refused(thin, record, 1, kvcore.InvalidArgumentError, "layer 0 shape")
    holed = exporter_of()
    holed.cache.remove(0, 3, 5)
    holed.cache.remove(0, 7, 9)
    limits = kvcore.BatchLimits(block_size=2, max_seqs=4, max_holes=1)
    layers = paged.config().layers
    strict = TorchSide(kvcore.CacheConfig(CAPACITY, layers, max_step=MAX_STEP, batch=limits), DTYPES[0], 0, True)
    refused(strict, holed.export(), 1, kvcore.CapacityError, "2 holes exceed batch.max_holes = 1")
    limits = kvcore.BatchLimits(block_size=2, max_seqs=4, max_active_seqs=1)
    full = TorchSide(kvcore.CacheConfig(CAPACITY, layers, max_step=MAX_STEP, batch=limits), DTYPES[0], 0, True)
    full.cache.add_sequence(0)
    refused(full, record, 1, kvcore.CapacityError, "batch.max_active_seqs = 1")


def test_a_refused_import_into_lazy_tensors_keeps_every_byte() -> None:
    record = exporter_of().export()
    dest = torch_side(2, DTYPES[0], 0)  # grows lazily
    dest.cache.add_sequence(0)
    paged.history(dest, random.Random(1), 9, MAX_STEP)
    before = snapshot(dest)
    with pytest.raises(kvcore.InvalidStateError, match="sequence 0 is active"):
        dest.pool.import_sequence(0, record)
    state, tensors = snapshot(dest)
    assert state == before[0]
    for old, new in zip(before[1], tensors):  # the tensors may have grown; every row they held is kept
        assert old is not None and new is not None
        rows = old[0].shape[2]
        assert same_bits(old[0], new[0][:, :, :rows]) and same_bits(old[1], new[1][:, :, :rows])


def test_export_refusals_are_named_and_change_nothing() -> None:
    side = exporter_of()
    before = snapshot(side)
    step = side.cache.begin_step([(0, 1)])
    with pytest.raises(kvcore.InvalidStateError, match="step is begun"):
        side.pool.export_sequence(0)
    side.cache.abort(step)
    with pytest.raises(kvcore.InvalidArgumentError, match="n_tokens = 21 must be in"):
        side.pool.export_sequence(0, list(range(21)))
    with pytest.raises(kvcore.InvalidStateError, match="sequence 1 is not active"):
        side.pool.export_sequence(1)
    with pytest.raises(kvcore.InvalidArgumentError, match="sequence 7 must be in"):
        side.pool.export_sequence(7)
    unchanged(before, side)

    wide = TorchSide(paged.config(CAPACITY, MAX_STEP, 2), (np.float64, torch.float64), 0)
    wide.cache.add_sequence(0)
    with pytest.raises(kvcore.InvalidArgumentError, match="the tensors hold torch.float64"):
        wide.pool.export_sequence(0)

    unwritten = torch_side(2, DTYPES[0], 0)  # the cache steps, the tensors never written
    unwritten.cache.add_sequence(0)
    unwritten.cache.commit(unwritten.cache.begin_step([(0, 3)]))
    with pytest.raises(kvcore.InvalidStateError, match="layer 0 position 0 lies in row 0, past the 0 rows"):
        unwritten.pool.export_sequence(0)
    assert unwritten.pool.tensors(0) is None
    short = torch_side(2, DTYPES[0], 0)
    short.cache.add_sequence(0)
    short.step(2, 1)
    short.cache.commit(short.cache.begin_step([(0, 3)]))  # positions 2..4 in rows the tensors lack
    # Row and count depend on where the one pool put the block (its ids are shared by the groups).
    with pytest.raises(kvcore.InvalidStateError, match=r"layer 0 position 2 lies in row \d+, past the \d+ rows its tensors hold"):
        short.pool.export_sequence(0)

    empty = torch_side(2, DTYPES[1], 0)
    empty.cache.add_sequence(0)
    assert empty.export() == kvcore.PagedKVPool(empty.cache, np.float16).export_sequence(0)


def test_kvcore_state_takes_a_torch_paged_kv() -> None:
    side = exporter_of()
    record = export_sequence(side.pool, 0)
    assert record == side.export()
    with pytest.raises(kvcore.InvalidArgumentError, match="TorchPagedKVPool needs the sequence id to export"):
        export_sequence(side.pool)
    dest = torch_side(2, DTYPES[0], 1)
    with pytest.raises(kvcore.InvalidArgumentError, match="TorchPagedKVPool needs the sequence id to import"):
        import_sequence(dest.pool, record)
    import_sequence(dest.pool, 1, record)
    assert dest.export() == record
