"""Sequence records from Python (kvcore.state, docs/state.md).

Random sequences (flat layers, rings with sinks past the wrap, holes, a removed
head, forks, prefix hits; block sizes 1 and 16; float32, float16, bfloat16) are
exported and imported across SequenceCache/KVPool and BatchCache/PagedKVPool and
block sizes. Afterwards every can_rewind answer and every read of the following
steps (positions and bytes) equals the exporter's. A position's bytes are a
function of (layer, position, version); with token ids the version is fixed, so
a prefix another sequence cached holds the same bytes, as a model's would.
Every refusal names its field and changes nothing.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Optional

import numpy as np
import numpy.typing as npt
import pytest
from needs import BFLOAT16, needs_ml_dtypes

import kvcore
from kvcore.state import RecordInfo, export_sequence, import_sequence

Array = npt.NDArray[Any]
POLICIES = [kvcore.Ring(6, 2), kvcore.Flat(), kvcore.Ring(5), kvcore.Ring(6, 2)]
DTYPES = [np.float32, np.float16, BFLOAT16]
# The parameter list: the bfloat16 case skips, visibly, without ml_dtypes (needs.py).
DTYPE_CASES = [pytest.param(d, id=i, marks=[needs_ml_dtypes] if i == "bfloat16" else [])
               for d, i in zip(DTYPES, ["float32", "float16", "bfloat16"])]
HEADS, DIM = 2, 4


def config(capacity: int = 64, max_step: int = 3, block_size: int = 2, num_blocks: int = 0,
           policies: Optional[list[Any]] = None) -> kvcore.CacheConfig:
    layers = [kvcore.LayerConfig(p, HEADS, DIM) for p in (POLICIES if policies is None else policies)]
    batch = kvcore.BatchLimits(block_size=block_size, max_seqs=4, num_blocks=num_blocks, max_holes=4)
    return kvcore.CacheConfig(capacity, layers, max_step=max_step, batch=batch)


def content(layer: int, first: int, T: int, version: int, value: bool, dtype: Any) -> Array:
    """Rows of positions [first, first + T) as `version` writes them."""
    out = np.empty((T, HEADS, DIM), dtype=np.float32)
    for t in range(T):
        rng = np.random.default_rng([layer, first + t, version, int(value)])
        out[t] = rng.standard_normal((HEADS, DIM))
    return out.astype(dtype)


class Side:
    """One sequence: of a SequenceCache + KVPool (seq None) or a BatchCache + PagedKVPool."""

    def __init__(self, cfg: kvcore.CacheConfig, dtype: Any, seq: Optional[int] = None) -> None:
        self.seq, self.dtype = seq, dtype
        if seq is None:
            self.cache: Any = kvcore.SequenceCache(cfg)
            self.pool: Any = kvcore.KVPool(self.cache, dtype)
        else:
            self.cache = kvcore.BatchCache(cfg)
            self.pool = kvcore.PagedKVPool(self.cache, dtype)

    @property
    def length(self) -> int:
        return int(self.cache.length if self.seq is None else self.cache.sequence(self.seq).length)

    def can_rewind(self, n: int) -> bool:
        return bool(self.cache.can_rewind(n) if self.seq is None else self.cache.can_rewind(self.seq, n))

    def rewind(self, n: int) -> None:
        if self.seq is None:
            self.cache.rewind(n)
        else:
            self.cache.rewind(self.seq, n)

    def step(self, T: int, version: int, tokens: Optional[list[int]] = None) -> list[tuple[Array, Array, Array]]:
        """A step of T tokens; each layer's read: (k, v, positions) in position order."""
        first, reads = self.length, []
        if self.seq is None:
            step = self.cache.begin_step(T)
        else:
            entry = (self.seq, T, tokens[first : first + T]) if tokens is not None else (self.seq, T)
            step = self.cache.begin_step([entry])
        for layer in range(len(POLICIES)):
            k = content(layer, first, T, version, False, self.dtype)
            v = content(layer, first, T, version, True, self.dtype)
            if self.seq is None:
                got_k, got_v, positions = self.pool.update(layer, step, k, v, order="positions")
            else:
                self.pool.update(layer, step, k, v)
                got_k, got_v, positions = self.pool.gather(layer, step, 0)
            reads.append((np.array(got_k), np.array(got_v), np.array(positions)))
        self.cache.commit(step)
        return reads

    def export(self, tokens: Optional[list[int]] = None) -> bytes:
        return export_sequence(self.pool, self.seq, tokens=None if tokens is None else tokens[: self.length])


def history(side: Side, rng: random.Random, target: int, max_step: int, tokens: Optional[list[int]] = None) -> None:
    version = 1
    while side.length < target:
        T = min(rng.randint(1, max_step), target - side.length)
        side.step(T, 1 if tokens is not None else version, tokens)
        version += 1
        n = side.length - rng.randint(1, max_step)
        if rng.random() < 0.25 and n >= 0 and side.can_rewind(n):
            side.rewind(n)


def same_rewinds(a: Side, b: Side, exact: bool) -> None:
    assert a.length == b.length
    for n in range(-1, a.length + 2):
        if exact:
            assert a.can_rewind(n) == b.can_rewind(n), n
        elif b.can_rewind(n):  # across layouts the importer may reach back less far, never further
            assert a.can_rewind(n), n


def decode_both(a: Side, b: Side, rng: random.Random, steps: int, max_step: int, capacity: int) -> None:
    for s in range(steps):
        T = min(rng.randint(1, max_step), capacity - a.length)
        if T <= 0:
            return
        for ra, rb in zip(a.step(T, 1000 + s), b.step(T, 1000 + s)):
            for x, y in zip(ra, rb):
                np.testing.assert_array_equal(x.view(np.uint8), y.view(np.uint8))


@pytest.mark.parametrize("dtype", DTYPE_CASES)
@pytest.mark.parametrize("block_size", [1, 16])
def test_a_sequence_cache_round_trips_through_both_caches(dtype: Any, block_size: int) -> None:
    rng = random.Random(block_size)
    exporter = Side(config(), dtype)
    history(exporter, rng, 40, 3)  # rings wrapped, sinks kept
    record = exporter.export()
    same = Side(config(), dtype)
    import_sequence(same.pool, record)
    same_rewinds(exporter, same, exact=True)
    assert same.export() == record
    batch = Side(config(block_size=block_size), dtype, seq=1)
    try:
        import_sequence(batch.pool, 1, record)
    except kvcore.NotSupportedError as e:  # sinks (2) in a 16-row block the exporter released
        assert block_size == 16 and "sink" in str(e).lower() or "divides" in str(e)
        return
    same_rewinds(exporter, batch, exact=False)
    decode_both(same, batch, random.Random(3), 10, 3, 64)
    twin = Side(config(), dtype)
    import_sequence(twin.pool, record)
    decode_both(exporter, twin, random.Random(4), 10, 3, 64)


@pytest.mark.parametrize("dtype", DTYPE_CASES)
@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("shape", ["plain", "hole", "head", "fork", "prefix"])
def test_batch_sequences_round_trip_across_block_sizes(dtype: Any, block_size: int, shape: str) -> None:
    rng = random.Random(hash((block_size, shape)) & 0xFFFF)
    capacity, max_step = 96, 4
    tokens = [rng.randrange(50) for _ in range(capacity)]
    exporter = Side(config(capacity, max_step, block_size), dtype, seq=0)
    exporter.cache.add_sequence(0)
    history(exporter, rng, 40, max_step, tokens)
    if shape == "fork":
        exporter.cache.fork(0, 2, exporter.length)
        exporter.seq = 2
    if shape == "hole":
        exporter.cache.remove(0, 3, 9)
    if shape == "head":
        exporter.cache.remove(0, 0, 5)
    record = exporter.export(tokens)
    info = RecordInfo.of(record)
    assert info.length == exporter.length and list(info.tokens) == tokens[: info.length]
    twin = Side(config(capacity, max_step, block_size), dtype, seq=1)
    import_sequence(twin.pool, 1, record)
    same_rewinds(exporter, twin, exact=True)
    assert twin.export(tokens) == record
    for other in (1, 16):
        importer = Side(config(capacity, max_step, other), dtype, seq=3)
        if shape == "prefix":  # the importer holds the prompt's first blocks already
            importer.cache.add_sequence(0)
            importer.seq = 0
            for _ in range(4):
                importer.step(4, 1, tokens)
            importer.seq = 3
        flat = next(importer.cache.group_of(layer) for layer, p in enumerate(POLICIES) if p == kvcore.Flat())
        held = importer.cache.held_blocks(flat)
        if other > block_size and exporter.length > 8:  # the exporter released positions 2.. of a 16-row sink block
            with pytest.raises(kvcore.NotSupportedError, match="divides the sinks"):
                import_sequence(importer.pool, 3, record)
            assert not importer.cache.sequence(3).active
            continue
        # Trusted (the importer's own prefill worker, say): the record's token ids share blocks.
        import_sequence(importer.pool, 3, record, trust_tokens=True)
        if shape == "prefix":  # shared, not copied: the flat group takes only the rest
            assert importer.cache.held_blocks(flat) - held < -(-info.length // other)
        same_rewinds(exporter, importer, exact=other == block_size)
        decode_both(clone_of(record, capacity, max_step, block_size, dtype), importer, random.Random(7), 8, max_step,
                    capacity)
    decode_both(exporter, twin, random.Random(8), 8, max_step, capacity)


def clone_of(record: bytes, capacity: int, max_step: int, block_size: int, dtype: Any) -> Side:
    side = Side(config(capacity, max_step, block_size), dtype, seq=0)
    import_sequence(side.pool, 0, record)
    return side


def test_files_buffers_and_zero_copy_views(tmp_path: Path) -> None:
    exporter = Side(config(), np.float16)
    history(exporter, random.Random(1), 30, 3)
    path = tmp_path / "seq.kvrec"
    record = export_sequence(exporter.pool, tokens=list(range(10)), path=path)
    assert path.read_bytes() == record
    size = exporter.pool.export_size(10)
    out = np.zeros(size + 8, dtype=np.uint8)
    assert exporter.pool.export_into(out, list(range(10))) == size
    assert out[:size].tobytes() == record
    info = RecordInfo.of(path)
    assert info.version == 1 and info.length == 30 and list(info.tokens) == list(range(10))
    flat = 1
    k, v = info.rows(flat)
    assert k.shape == (30, HEADS, DIM) and not k.flags.owndata and not k.flags.writeable
    np.testing.assert_array_equal(info.positions(flat), np.arange(30))
    ring = info.layers[0]
    assert ring.kind == "ring" and ring.sink_end == 2 and 0 < ring.held_from < 30
    np.testing.assert_array_equal(info.positions(0)[:2], [0, 1])
    assert info.layers[0].n_rows < 30  # the ring ships its sinks and window, not what it released
    importer = Side(config(), np.float16)
    import_sequence(importer.pool, path)
    assert importer.export(list(range(10))) == record
    # A numpy buffer at an odd offset (copied once to an aligned one) imports too.
    shifted = np.zeros(len(record) + 1, dtype=np.uint8)
    shifted[1:] = np.frombuffer(record, dtype=np.uint8)
    again = Side(config(), np.float16)
    import_sequence(again.pool, shifted[1:])
    assert again.export(list(range(10))) == record


def _refused(make: Any, record: Any, error: type, text: str, seq: Optional[int]) -> None:
    side = make()
    before = side.cache.length if seq is None else side.cache.sequence(seq).active
    with pytest.raises(error, match=text):
        import_sequence(side.pool, seq, record)
    assert (side.cache.length if seq is None else side.cache.sequence(seq).active) == before


@pytest.mark.parametrize("seq", [None, 0], ids=["SequenceCache", "BatchCache"])
def test_every_refusal_is_named_and_changes_nothing(seq: Optional[int]) -> None:
    exporter = Side(config(), np.float16)
    history(exporter, random.Random(2), 30, 3)
    record = exporter.export()

    def make(cfg: Optional[kvcore.CacheConfig] = None, dtype: Any = np.float16) -> Any:
        return lambda: Side(cfg or config(), dtype, seq)

    _refused(make(), record[:-1], kvcore.InvalidArgumentError, "truncated", seq)
    corrupt = bytearray(record)
    corrupt[len(record) // 2] ^= 1
    _refused(make(), bytes(corrupt), kvcore.InvalidArgumentError, "checksum", seq)
    future = bytearray(record)
    future[8] = 4  # one past the newest version (3)
    _refused(make(), bytes(future), kvcore.NotSupportedError, "version 4 is newer", seq)
    _refused(make(), b"not a record" * 8, kvcore.InvalidArgumentError, "magic", seq)
    other = [kvcore.LayerConfig(p, HEADS, DIM) for p in POLICIES]
    other[0] = kvcore.LayerConfig(kvcore.Ring(7, 2), HEADS, DIM)
    _refused(make(kvcore.CacheConfig(64, other, max_step=3, batch=config().batch)), record,
             kvcore.InvalidArgumentError, "policy", seq)
    other[0] = kvcore.LayerConfig(POLICIES[0], HEADS, DIM + 1)
    _refused(make(kvcore.CacheConfig(64, other, max_step=3, batch=config().batch)), record,
             kvcore.InvalidArgumentError, "shape", seq)
    _refused(make(dtype=np.float32), record, kvcore.InvalidArgumentError, "dtype", seq)
    _refused(make(config(capacity=20)), record, kvcore.CapacityError, "capacity", seq)
    busy = Side(config(), np.float16, seq)
    if seq is None:
        busy.step(2, 1)
        with pytest.raises(kvcore.InvalidStateError, match="clear"):
            import_sequence(busy.pool, record)
        assert busy.length == 2
    else:
        busy.cache.add_sequence(0)
        with pytest.raises(kvcore.InvalidStateError, match="active"):
            import_sequence(busy.pool, 0, record)
        tight = Side(config(num_blocks=4), np.float16, seq)
        with pytest.raises(kvcore.CapacityError, match="blocks"):
            import_sequence(tight.pool, 0, record)
        assert not tight.cache.sequence(0).active and tight.cache.free_blocks(1) == 4
    with pytest.raises(kvcore.InvalidArgumentError, match="bytes-like"):
        import_sequence(busy.pool, seq, 12)
    strided = np.frombuffer(record, dtype=np.uint8)[::2]
    with pytest.raises(kvcore.InvalidArgumentError, match="C-contiguous"):
        import_sequence(busy.pool, seq, strided)


def test_export_refuses_a_begun_step_and_bad_tokens() -> None:
    side = Side(config(), np.float16)
    side.step(3, 1)
    with pytest.raises(kvcore.InvalidArgumentError, match="n_tokens"):
        side.pool.export_sequence(list(range(4)))
    with pytest.raises(TypeError, match=r"export_sequence: tokens\[0\] = \[1, 2\]: must be an int, got list"):
        side.pool.export_sequence([[1, 2]])
    with pytest.raises(kvcore.InvalidArgumentError, match=r"export_sequence: tokens has 2 dimensions: must be 1-D"):
        side.pool.export_sequence(np.ones((1, 2), np.int64))
    side.cache.begin_step(1)
    with pytest.raises(kvcore.InvalidStateError, match="begun"):
        side.pool.export_sequence()
    with pytest.raises(kvcore.InvalidArgumentError, match="export_size"):
        side.pool.export_into(np.zeros(8, np.uint8))
    with pytest.raises(kvcore.InvalidArgumentError, match="writable buffer"):
        side.pool.export_into(12)


def test_the_example_in_docs_state_md_runs() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "state.md").read_text()
    block = text.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(block, "docs/state.md", "exec"), {})


def test_the_helpers_refuse_a_seq_they_cannot_use() -> None:
    seq_side = Side(config(), np.float16)
    seq_side.step(2, 1)
    batch_side = Side(config(), np.float16, seq=0)
    record = seq_side.export()
    with pytest.raises(kvcore.InvalidArgumentError, match="one sequence"):
        export_sequence(seq_side.pool, 0)
    with pytest.raises(kvcore.InvalidArgumentError, match="needs the sequence id"):
        export_sequence(batch_side.pool)
    with pytest.raises(kvcore.InvalidArgumentError, match="one sequence"):
        import_sequence(seq_side.pool, 0, record)
    with pytest.raises(kvcore.InvalidArgumentError, match="needs the sequence id"):
        import_sequence(batch_side.pool, record)
    with pytest.raises(kvcore.InvalidArgumentError, match="KVPool, PagedKVPool, TorchKVPool or TorchPagedKVPool \\(a SequencePool\\)"):
        export_sequence(object())  # type: ignore[arg-type]
    with pytest.raises(kvcore.InvalidArgumentError, match="KVPool, PagedKVPool, TorchKVPool or TorchPagedKVPool \\(a SequencePool\\)"):
        import_sequence(object(), record)  # type: ignore[arg-type]


def test_seal_record_writes_the_checksum() -> None:
    side = Side(config(), np.float16)
    side.step(3, 1)
    record = np.frombuffer(side.export(), dtype=np.uint8).copy()
    sealed = record.copy()
    record[-8:] = 0
    record[RecordInfo.of(sealed).layers[0].k_offset] ^= 1  # a row byte changed: sealing makes it valid again
    with pytest.raises(kvcore.InvalidArgumentError, match="corrupt"):
        kvcore._core.check_record(record)
    kvcore._core.seal_record(record)
    kvcore._core.check_record(record)
    assert not np.array_equal(record[-8:], sealed[-8:])
    with pytest.raises(kvcore.InvalidArgumentError, match="seal_record: out: must be a writable buffer"):
        kvcore._core.seal_record(5)  # type: ignore[arg-type]
    with pytest.raises(kvcore.InvalidArgumentError, match="seal_record: out: holds 8 bytes, the record needs 72"):
        kvcore._core.seal_record(np.zeros(8, np.uint8))


# --- Records as a trust boundary (issue 28) -------------------------------------------------------


def craft(length: int, layers: list[tuple[int, int, int, tuple[int, int, int], int, int, int]],
          holes: tuple[tuple[int, int], ...] = (), start: int = 0) -> bytes:
    """A version-1 record written field by field from docs/state.md (float16 rows of zeros):
    layers are (kind, window, sinks, (heads, head_dim, value_dim), sink_end, held_from, n_rows)."""
    import struct as st

    def padded(n: int) -> int:
        return (n + 63) // 64 * 64

    table = b"".join(st.pack("<ii", b, e) for b, e in holes)
    entries = b"".join(
        st.pack("<BBHiiiiiiiii", kind, 1, 0, window, sinks, h, d, vd, sink_end, held_from, n_rows, 0)
        for kind, window, sinks, (h, d, vd), sink_end, held_from, n_rows in layers
    )
    rows_at = padded(64 + len(table) + len(entries))
    row_bytes = sum(padded((n * h * d * 2) % 2**64) + padded((n * h * vd * 2) % 2**64)
                    for _, _, _, (h, d, vd), _, _, n in layers)
    total = (rows_at + row_bytes + 8) % 2**64
    header = st.pack("<8sIIQIiiiiiII8x", b"KVCSEQ\0\1", 1, 64, total, len(layers), length, 3, start,
                     len(holes), 0, 0, 40)
    body = header + table + entries
    body += bytes(rows_at - len(body))
    out = bytearray(body + bytes(total - len(body)))
    kvcore._core.seal_record(out)
    return bytes(out)


def trust_config(block_size: int = 1) -> kvcore.CacheConfig:
    layers = [kvcore.LayerConfig(kvcore.Flat(), 1, 2), kvcore.LayerConfig(kvcore.Ring(4, 1), 1, 2)]
    return kvcore.CacheConfig(64, layers, max_step=2,
                              batch=kvcore.BatchLimits(block_size=block_size, max_seqs=2, max_holes=2))


FLAT12 = (0, 0, 0, (1, 2, 2), 0, 0, 12)


def test_incomplete_records_are_refused_per_layer_kind() -> None:
    # (layers, what the refusal names): the reviewer's ring carrying only its sink; one
    # position short of the window (L - W + 1 = 9); the sink missing; a flat layer's head.
    cases = [
        ([FLAT12, (1, 4, 1, (1, 2, 2), 1, 12, 1)], r"layer 1 \(ring, window 4, sinks 1\) lacks position 9"),
        ([FLAT12, (1, 4, 1, (1, 2, 2), 1, 10, 3)], "lacks position 9, which a query at length 12 needs"),
        ([FLAT12, (1, 4, 1, (1, 2, 2), 0, 9, 3)], r"layer 1 \(ring, window 4, sinks 1\) lacks position 0"),
        ([(0, 0, 0, (1, 2, 2), 0, 1, 11), (1, 4, 1, (1, 2, 2), 1, 9, 4)], r"layer 0 \(flat"),
    ]
    for layers, text in cases:
        record = craft(12, layers)
        with pytest.raises(kvcore.InvalidArgumentError, match=text):
            kvcore._core.check_record(record)
        with pytest.raises(kvcore.InvalidArgumentError, match="incomplete"):
            RecordInfo.of(record)
        cache = kvcore.SequenceCache(trust_config())
        with pytest.raises(kvcore.InvalidArgumentError, match="incomplete"):
            import_sequence(kvcore.KVPool(cache, np.float16), record)
        assert cache.length == 0
        batch = kvcore.BatchCache(trust_config())
        free = [batch.free_blocks(g) for g in range(batch.n_groups)]
        with pytest.raises(kvcore.InvalidArgumentError, match="incomplete"):
            import_sequence(kvcore.PagedKVPool(batch, np.float16), 0, record)
        assert not batch.sequence(0).active and [batch.free_blocks(g) for g in range(batch.n_groups)] == free
    # Exactly the sinks and the window: accepted; positions a hole removed are not needed.
    kvcore._core.check_record(craft(12, [FLAT12, (1, 4, 1, (1, 2, 2), 1, 9, 4)]))
    holed = craft(12, [(0, 0, 0, (1, 2, 2), 0, 0, 9), (1, 4, 1, (1, 2, 2), 1, 11, 2)], holes=((8, 11),))
    batch = kvcore.BatchCache(trust_config())
    import_sequence(kvcore.PagedKVPool(batch, np.float16), 0, holed)
    assert batch.sequence(0).length == 12


def test_a_record_whose_sizes_wrap_is_refused() -> None:
    # Layer 0's K and V bytes are 32 x 2^30 x 2^28 x 2 = 2^64 each: 0 when they wrap; layer 1
    # (head_dim 3) takes the 128 bytes layer 0 would have had, so total_bytes adds up.
    record = craft(32, [(0, 0, 0, (2**30, 2**28, 2**28), 0, 0, 32), (0, 0, 0, (1, 3, 1), 0, 0, 32)])
    with pytest.raises(kvcore.InvalidArgumentError, match=r"layer 0: 32 rows of 1073741824 heads .* more bytes"):
        kvcore._core.check_record(record)
    with pytest.raises(kvcore.InvalidArgumentError, match="more bytes than the record's"):
        RecordInfo.of(record)


def test_a_sinks_mismatch_is_refused() -> None:
    record = craft(12, [FLAT12, (1, 4, 2, (1, 2, 2), 2, 9, 5)])
    kvcore._core.check_record(record)
    cache = kvcore.SequenceCache(trust_config())
    with pytest.raises(kvcore.InvalidArgumentError, match=r"sinks 2, source 0, slots 0\) differs from the cache's \(kind 1, window 4, sinks 1, source 0, slots 0\)"):
        import_sequence(kvcore.KVPool(cache, np.float16), record)
    assert cache.length == 0
    batch = kvcore.BatchCache(trust_config())
    with pytest.raises(kvcore.InvalidArgumentError, match="sinks 2"):
        import_sequence(kvcore.PagedKVPool(batch, np.float16), 0, record)
    assert not batch.sequence(0).active


def test_a_change_in_any_checksum_lane_is_refused() -> None:
    record = craft(12, [FLAT12, (1, 4, 1, (1, 2, 2), 1, 9, 4)])
    words = (len(record) - 8) // 8
    for w in range(words - 4, words):  # the last word of each of the four lanes
        bad = bytearray(record)
        bad[8 * w] ^= 1
        with pytest.raises(kvcore.InvalidArgumentError, match="checksum mismatch"):
            kvcore._core.check_record(bytes(bad))


# --- section 9: chunked layers travel like rings; shared/state kinds do not (yet) ---

CHUNKED = [kvcore.Chunked(5), kvcore.Flat(), kvcore.Chunked(3), kvcore.Ring(4, 1)]


@pytest.mark.parametrize("block_size", [1, 2, 3, 16])
def test_chunked_layers_round_trip_through_both_caches(block_size: int) -> None:
    dtype = np.float16
    rng = random.Random(block_size)
    exporter = Side(config(policies=CHUNKED), dtype)
    history(exporter, rng, 41, 3)  # past several chunks: their rows reused
    record = exporter.export()
    same = Side(config(policies=CHUNKED), dtype)
    import_sequence(same.pool, record)
    same_rewinds(exporter, same, exact=True)
    assert same.export() == record
    batch = Side(config(block_size=block_size, policies=CHUNKED), dtype, seq=1)
    try:
        import_sequence(batch.pool, 1, record)
    except kvcore.NotSupportedError as e:  # the ring's sink in a block the exporter released
        assert block_size == 16 and "sink" in str(e).lower() or "divides" in str(e)
        return
    same_rewinds(exporter, batch, exact=False)
    # The batch side's own record (finished chunks' blocks released) comes back too.
    back = Side(config(policies=CHUNKED), dtype)
    import_sequence(back.pool, batch.export())
    twin, twin2 = Side(config(policies=CHUNKED), dtype), Side(config(policies=CHUNKED), dtype)
    import_sequence(twin.pool, record)
    import_sequence(twin2.pool, record)
    decode_both(twin, batch, random.Random(3), 12, 3, 64)
    decode_both(twin2, back, random.Random(3), 12, 3, 64)


def test_records_naming_shared_or_state_kinds_or_chunks_with_sinks_are_refused_by_name() -> None:
    cases = [
        ((3, 0, 0, (1, 2, 2), 0, 0, 12), "kind 3"),  # Shared: records carry no shared layers
        ((4, 0, 0, (1, 2, 2), 0, 0, 12), "kind 4"),  # State: nor state slots, yet
        ((2, 4, 1, (1, 2, 2), 1, 8, 5), "kind 2, window 4, sinks 1"),  # a chunk has no sinks
        ((2, 0, 0, (1, 2, 2), 0, 0, 12), "kind 2, window 0"),  # nor a chunk of 0
    ]
    for layer, text in cases:
        record = craft(12, [FLAT12, layer])
        with pytest.raises(kvcore.InvalidArgumentError, match=text):
            kvcore._core.check_record(record)
        cache = kvcore.SequenceCache(trust_config())
        with pytest.raises(kvcore.InvalidArgumentError, match=text):
            import_sequence(kvcore.KVPool(cache, np.float16), record)
        assert cache.length == 0
    # A chunked layer carrying exactly its chunk is a record parse accepts.
    kvcore._core.check_record(craft(12, [FLAT12, (2, 4, 0, (1, 2, 2), 0, 8, 4)]))
