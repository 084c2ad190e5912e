"""Quantized pools (docs/quantized.md): dtype "qint8" / "fp8_e4m3" on KVPool and PagedKVPool.

Expectations come from a reference quantizer written out here in numpy from the rule
(ExecuTorch's for qint8; test_quantized_executorch.py proves the two equal ExecuTorch's
ops), applied to each written row on its own, and from a brute-force record of the last
row written at each position: never from the pool's answers. A scale or zero point that
does not follow its row (a wrap, a mirror, a rewind, a tree commit's copy, a fork's
copy-on-write, a record) fails them.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from needs import need

import kvcore
import kvcore.quantized
import kvcore.state

ml_dtypes = need("ml_dtypes")

Array = npt.NDArray[Any]
FORMATS = ["qint8", "fp8_e4m3"]
F32_EPS = np.float32(np.finfo(np.float32).eps)
F32_TINY = np.float32(np.finfo(np.float32).tiny)


def ref_quantize(fmt: str, x: Array) -> tuple[Array, Array, Array]:
    """(values, scales, zero points) of x (rows, heads, dim), per (row, head), from the rule."""
    x = np.asarray(x, dtype=np.float32)
    lo = np.minimum(x.min(axis=-1), np.float32(0))
    hi = np.maximum(x.max(axis=-1), np.float32(0))
    if fmt == "qint8":
        scale = ((hi - lo) / np.float32(255)).astype(np.float32)
        scale = np.maximum(scale, F32_EPS)
        dmin, dmax = lo / scale, hi / scale
        zp = np.where((np.float32(-128) + dmin) + (np.float32(127) + dmax) > 0, np.float32(-128) - dmin,
                      np.float32(127) - dmax).astype(np.float32)
        zp = np.round(np.clip(zp, -128, 127)).astype(np.int8)
        inv = 1.0 / scale.astype(np.float64)
        q = np.clip(np.round(x.astype(np.float64) * inv[..., None] + zp[..., None].astype(np.float64)), -128, 127)
        return q.astype(np.int8), scale, zp
    amax = np.maximum(-lo, hi)
    scale = np.maximum((amax / np.float32(448)).astype(np.float32), F32_TINY)
    v = np.clip(x / scale[..., None], np.float32(-448), np.float32(448)).astype(np.float32)
    return v.astype(ml_dtypes.float8_e4m3fn), scale, np.zeros(scale.shape, np.int8)


def ref_dequantize(fmt: str, q: Array, scale: Array, zp: Array) -> Array:
    if fmt == "qint8":
        return ((q.astype(np.int32) - zp[..., None].astype(np.int32)).astype(np.float32) * scale[..., None]).astype(
            np.float32)
    return (q.astype(np.float32) * scale[..., None]).astype(np.float32)


def ref_values(fmt: str, x: Array) -> Array:
    return ref_dequantize(fmt, *ref_quantize(fmt, x))


def random_rows(rng: np.random.Generator, n: int, heads: int, dim: int, tiny: float = 1e-40,
                big: float = 1e30) -> Array:
    """Random values with constant, zero, denormal (``tiny``) and large (``big``) (row, head)s mixed in."""
    x = rng.normal(size=(n, heads, dim)).astype(np.float32) * np.float32(2)
    kinds = rng.integers(0, 6, size=(n, heads))
    x[kinds == 0] = 0
    x[kinds == 1] = np.float32(1.5)
    x[kinds == 2] *= np.float32(tiny)
    x[kinds == 3] *= np.float32(big)
    return x


def config(policies: list[kvcore.LayerPolicy], capacity: int = 60, max_step: int = 3) -> kvcore.CacheConfig:
    layers = [kvcore.LayerConfig(p, 2, 4, 3) for p in policies]
    return kvcore.CacheConfig(capacity, layers, max_step=max_step, initial_capacity=4)


def raw_equal(fmt: str, raw: dict[str, Any], rows: Array, which: str, want: tuple[Array, Array, Array]) -> None:
    q, scale, zp = want
    got = raw[which][rows]
    if fmt == "fp8_e4m3":
        got = got.view(ml_dtypes.float8_e4m3fn)
        np.testing.assert_array_equal(got.view(np.uint8), q.view(np.uint8))
    else:
        np.testing.assert_array_equal(got, q)
        np.testing.assert_array_equal(raw[which + "_zero_points"][rows], zp)
    np.testing.assert_array_equal(raw[which + "_scales"][rows].view(np.uint32), scale.view(np.uint32))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mirror", [False, True])
@pytest.mark.parametrize("compute", [np.float32, np.float16, "bfloat16"])
def test_wraps_mirrors_and_rewinds_read_back_each_rows_own_quantization(fmt: str, mirror: bool, compute: Any) -> None:
    cfg = config([kvcore.Ring(4), kvcore.Ring(3, 2), kvcore.Flat()])
    cache = kvcore.SequenceCache(cfg)
    pool = kvcore.KVPool(cache, fmt, mirror_rings=mirror, compute_dtype=compute)
    cdt = np.dtype(ml_dtypes.bfloat16) if compute == "bfloat16" else np.dtype(compute)
    assert pool.dtype == fmt and pool.compute_dtype == cdt
    rng = np.random.default_rng(1)
    scales = {"tiny": 1e-6, "big": 1e3} if cdt == np.float16 else {}  # float16's own denormals and range
    last: list[dict[int, tuple[Array, Array]]] = [{} for _ in range(3)]  # the values each position holds
    for _ in range(70):
        T = int(rng.integers(1, 4))
        if not cache.can_extend(T):
            break
        step = cache.begin_step(T)
        for layer in range(3):
            k = random_rows(rng, T, 2, 4, **scales).astype(cdt)
            v = random_rows(rng, T, 2, 3, **scales).astype(cdt)
            for order in ("rows", "positions"):
                if order == "rows":
                    got_k, got_v, positions = pool.update(layer, step, k, v)
                    for j in range(T):
                        last[layer][step.position + j] = (k[j:j + 1], v[j:j + 1])
                else:
                    got_k, got_v, positions = pool.read(layer, step.plan(layer), order="positions")
                assert got_k.dtype == cdt and not got_k.flags.writeable
                mask = step.mask(layer, order=order)
                for r, p in enumerate(positions):
                    if not mask[:, r].any():
                        continue  # no query sees this row: it may hold anything
                    wk, wv = last[layer][int(p)]
                    want_k = ref_values(fmt, wk.astype(np.float32)).astype(cdt)
                    want_v = ref_values(fmt, wv.astype(np.float32)).astype(cdt)
                    np.testing.assert_array_equal(got_k[r:r + 1].view(np.uint8), want_k.view(np.uint8),
                                                  err_msg=f"layer {layer} position {p} {order}")
                    np.testing.assert_array_equal(got_v[r:r + 1].view(np.uint8), want_v.view(np.uint8))
            raw = pool.read_quantized(layer, step.plan(layer))
            for r, p in enumerate(raw["positions"]):
                if step.mask(layer)[:, r].any():
                    raw_equal(fmt, raw, np.array([r]), "k", ref_quantize(fmt, last[layer][int(p)][0].astype(np.float32)))
        roll = int(rng.integers(0, 8))
        if roll == 0:
            continue  # abandoned: the next step retries the same positions
        cache.commit(step)
        if roll == 1:
            back = int(rng.integers(1, 4))
            if cache.can_rewind(cache.length - back):
                cache.rewind(cache.length - back)


@pytest.mark.parametrize("fmt", FORMATS)
def test_tree_commit_copies_move_scales_with_rows(fmt: str) -> None:
    cache = kvcore.SequenceCache(config([kvcore.Ring(4), kvcore.Flat()], max_step=4))
    pool = kvcore.KVPool(cache, fmt)
    rng = np.random.default_rng(2)
    held: list[dict[int, Array]] = [{}, {}]
    for _ in range(3):  # some history first, so the ring wraps
        step = cache.begin_step(3)
        for layer in range(2):
            k = random_rows(rng, 3, 2, 4)
            pool.update(layer, step, k, random_rows(rng, 3, 2, 3))
            for j in range(3):
                held[layer][step.position + j] = k[j:j + 1]
        cache.commit(step)
    parents = [-1, 0, 0, 2]  # node 3 hangs off the second child: its path needs copies
    step = cache.begin_tree(parents)
    nodes = [random_rows(rng, 4, 2, 4) for _ in range(2)]
    for layer in range(2):
        pool.update(layer, step, nodes[layer], random_rows(rng, 4, 2, 3))
    base = cache.length
    copies = cache.commit(step, accepted=[0, 2, 3])
    pool.apply_copies(copies)
    for layer in range(2):
        for d, node in enumerate([0, 2, 3]):
            held[layer][base + d] = nodes[layer][node:node + 1]
    step = cache.begin_step(1)
    for layer in range(2):
        k_new = random_rows(rng, 1, 2, 4)
        got_k, _, positions = pool.update(layer, step, k_new, random_rows(rng, 1, 2, 3), order="positions")
        held[layer][step.position] = k_new
        for r, p in enumerate(positions):
            np.testing.assert_array_equal(got_k[r:r + 1], ref_values(fmt, held[layer][int(p)]),
                                          err_msg=f"layer {layer} position {p}")


@pytest.mark.parametrize("fmt", FORMATS)
def test_records_round_trip_byte_for_byte_and_other_formats_refuse_them(fmt: str) -> None:
    cfg = config([kvcore.Ring(4), kvcore.Flat()])
    cache = kvcore.SequenceCache(cfg)
    pool = kvcore.KVPool(cache, fmt, compute_dtype=np.float16)
    rng = np.random.default_rng(3)
    for _ in range(5):
        step = cache.begin_step(3)
        for layer in range(2):
            pool.update(layer, step, random_rows(rng, 3, 2, 4, 1e-6, 1e3).astype(np.float16),
                        random_rows(rng, 3, 2, 3, 1e-6, 1e3).astype(np.float16))
        cache.commit(step)
    record = pool.export_sequence()
    assert kvcore.state.RecordInfo.of(record).version == 2
    other = kvcore.SequenceCache(cfg)
    imported = kvcore.KVPool(other, fmt, compute_dtype=np.float16)
    imported.import_sequence(record)
    assert imported.export_sequence() == record
    a, b = cache.begin_step(1), other.begin_step(1)
    for layer in range(2):
        x = random_rows(rng, 1, 2, 4, 1e-6, 1e3).astype(np.float16)
        y = random_rows(rng, 1, 2, 3, 1e-6, 1e3).astype(np.float16)
        ka, va, pa = (np.copy(t) for t in pool.update(layer, a, x, y))
        kb, vb, pb = imported.update(layer, b, x, y)
        np.testing.assert_array_equal(pa, pb)
        np.testing.assert_array_equal(ka.view(np.uint16), kb.view(np.uint16))
        np.testing.assert_array_equal(va.view(np.uint16), vb.view(np.uint16))
    for wrong in [np.float16, "fp8_e4m3" if fmt == "qint8" else "qint8"]:
        third = kvcore.SequenceCache(cfg)
        with pytest.raises(kvcore.InvalidArgumentError, match=f"dtype {fmt} differs from the pool's"):
            kvcore.KVPool(third, wrong).import_sequence(record)
        assert third.length == 0


def test_plain_records_keep_version_1() -> None:
    cache = kvcore.SequenceCache(config([kvcore.Flat()]))
    pool = kvcore.KVPool(cache, np.float16)
    with cache.step(2) as step:
        pool.update(0, step, np.ones((2, 2, 4), np.float16), np.ones((2, 2, 3), np.float16))
    assert kvcore.state.RecordInfo.of(pool.export_sequence()).version == 1


@pytest.mark.parametrize("fmt", FORMATS)
def test_paged_fork_copy_on_write_carries_scales(fmt: str) -> None:
    cfg = kvcore.CacheConfig(32, [kvcore.LayerConfig(kvcore.Flat(), 2, 4, 3), kvcore.LayerConfig(kvcore.Ring(4, 1), 2, 4, 3)],
                             max_step=4, batch=kvcore.BatchLimits(block_size=4, max_seqs=3))
    cache = kvcore.BatchCache(cfg)
    pool = kvcore.PagedKVPool(cache, fmt, initial_rows=0)
    rng = np.random.default_rng(4)
    last: dict[tuple[int, int, int], Array] = {}

    def run(entries: list[tuple[int, int]]) -> None:
        step = cache.begin_step(entries)
        n = sum(t for _, t in entries)
        for layer in range(2):
            k = random_rows(rng, n, 2, 4)
            pool.update(layer, step, k, random_rows(rng, n, 2, 3))
            t = 0
            for seq, T in entries:
                for j in range(T):
                    last[(layer, seq, cache.length(seq) + j)] = k[t:t + 1]
                    t += 1
        for layer in range(2):
            for e, (seq, _) in enumerate(entries):
                got_k, _, positions = pool.gather(layer, step, e)
                for r, p in enumerate(positions):
                    np.testing.assert_array_equal(got_k[r:r + 1], ref_values(fmt, last[(layer, seq, int(p))]),
                                                  err_msg=f"layer {layer} seq {seq} position {p}")
        cache.commit(step)

    cache.add_sequence(0)
    run([(0, 4)])
    run([(0, 2)])
    cache.fork(0, 1, 6)
    for layer in range(2):
        for p in range(6):
            last[(layer, 1, p)] = last[(layer, 0, p)]
    run([(0, 1), (1, 2)])
    run([(1, 3), (0, 4)])
    raw = pool.rows_quantized(0)
    assert raw["k_scales"].dtype == np.float32 and raw["k_scales"].shape == (raw["k"].shape[0], 2)


def test_bad_input_is_refused_by_name_and_changes_nothing() -> None:
    cfg = config([kvcore.Flat()])
    cache = kvcore.SequenceCache(cfg)
    with pytest.raises(kvcore.InvalidArgumentError, match="'qint8', 'fp8_e4m3'"):
        kvcore.KVPool(cache, "int4")
    with pytest.raises(kvcore.InvalidArgumentError, match="compute_dtype = dtype\\('int8'\\): a qint8 pool takes"):
        kvcore.KVPool(cache, "qint8", compute_dtype=np.int8)
    with pytest.raises(kvcore.InvalidArgumentError, match="a compute dtype is for 'qint8' and 'fp8_e4m3'"):
        kvcore.KVPool(cache, np.float16, compute_dtype=np.float32)
    plain = kvcore.KVPool(cache, np.float16)
    pool = kvcore.KVPool(cache, "qint8")
    step = cache.begin_step(2)
    with pytest.raises(kvcore.InvalidArgumentError, match="not a quantized format"):
        plain.read_quantized(0, step.plan(0))
    good = np.ones((2, 2, 4), np.float32)
    pool.update(0, step, good, np.ones((2, 2, 3), np.float32))
    before = {k: np.copy(v) for k, v in pool.read_quantized(0, step.plan(0)).items() if v is not None}
    for bad, word in [(np.nan, "NaN"), (np.inf, "inf")]:
        k = good.copy()
        k[1, 1, 2] = bad
        with pytest.raises(kvcore.InvalidArgumentError, match=f"k row 1 head 1 holds {word}: a quantized pool"):
            pool.write(0, step.plan(0), k, np.zeros((2, 2, 3), np.float32))
    with pytest.raises(kvcore.InvalidArgumentError, match="takes values of dtype\\('float32'\\)"):
        pool.write(0, step.plan(0), good.astype(np.float16), np.zeros((2, 2, 3), np.float16))
    after = pool.read_quantized(0, step.plan(0))
    for key, value in before.items():
        np.testing.assert_array_equal(after[key], value)


def test_required_bytes_and_reserved_bytes_count_scales() -> None:
    cfg = kvcore.CacheConfig(8, [kvcore.LayerConfig(kvcore.Flat(), 1, 256)], max_step=2, initial_capacity=8)
    plain = kvcore.KVPool.required_bytes(cfg, np.float16)
    q = kvcore.KVPool.required_bytes(cfg, "qint8")
    f = kvcore.KVPool.required_bytes(cfg, "fp8_e4m3")
    assert kvcore.KVPool(kvcore.SequenceCache(cfg), "qint8").reserved_bytes == 8 * 2 * 264
    assert kvcore.KVPool(kvcore.SequenceCache(cfg), "fp8_e4m3").reserved_bytes == 8 * 2 * 260
    assert f <= q < plain  # each block rounded up to 64 bytes
    assert kvcore.quantized.row_bytes("int8", 1, 256) == 264
    assert kvcore.quantized.row_bytes("fp8", 3, 5) == 28
    with pytest.raises(kvcore.InvalidArgumentError, match="kv_dtype = 'int4': must be 'int8'"):
        kvcore.quantized.kv_format("int4")


def test_paged_plain_pool_has_no_quantized_rows() -> None:
    cfg = kvcore.CacheConfig(16, [kvcore.LayerConfig(kvcore.Flat(), 1, 4)], max_step=2,
                             batch=kvcore.BatchLimits(block_size=4, max_seqs=1))
    cache = kvcore.BatchCache(cfg)
    cache.add_sequence(0)
    pool = kvcore.PagedKVPool(cache, np.float16)
    step = cache.begin_step([(0, 1)])
    pool.update(0, step, np.ones((1, 1, 4), np.float16), np.ones((1, 1, 4), np.float16))
    with pytest.raises(kvcore.InvalidArgumentError, match="rows_quantized: the paged pool stores float16"):
        pool.rows_quantized(0)


def test_a_version_1_record_cannot_hold_quantized_rows() -> None:
    cache = kvcore.SequenceCache(config([kvcore.Flat()]))
    pool = kvcore.KVPool(cache, "qint8")
    with cache.step(2) as step:
        pool.update(0, step, np.ones((2, 2, 4), np.float32), np.ones((2, 2, 3), np.float32))
    record = bytearray(pool.export_sequence())
    record[8:12] = (1).to_bytes(4, "little")
    forged = np.frombuffer(record, dtype=np.uint8).copy()  # 8-byte aligned, writable
    kvcore._core.seal_record(forged)
    with pytest.raises(kvcore.InvalidArgumentError, match=r"layer 0 \(kind 0, dtype qint8\) needs record version 2, the record says 1"):
        kvcore._core.check_record(forged)


def test_memory_planner_counts_quantized_rows_scales_and_zero_points(capsys: pytest.CaptureFixture[str]) -> None:
    from kvcore import memory
    from kvcore.cli import main

    def documented_row_bytes(kv: str, heads: int, dim: int) -> int:
        """docs/quantized.md, "Where the scales live": values, zeros to 4, a float32 scale per
        head, (int8) an int8 zero point per head, zeros to 4."""
        end = heads * dim
        end += -end % 4
        end += 4 * heads + (heads if kv == "int8" else 0)
        return end + -end % 4

    # The doc's own figures for Gemma 3's 1 x 256 rows, so the rule above is the doc's.
    assert documented_row_bytes("int8", 1, 256) == 264 and documented_row_bytes("fp8", 1, 256) == 260

    shape = memory.preset("gemma-3-1b").shape  # 1 KV head x 256 on every layer: sliding (512) and full
    half = memory.plan_memory(shape, context=8192, dtype="float16")
    q8 = memory.plan_memory(shape, context=8192, kv_dtype="int8")
    f8 = memory.plan_memory(shape, context=8192, kv_dtype="fp8")
    for plan, kv in [(q8, "int8"), (f8, "fp8")]:
        total = 0
        for kind in plan.kinds:
            # rows per layer by docs/design.md's rule: a ring keeps sinks + window + max_step - 1 rows,
            # a flat layer the whole context
            rows = kind.sinks + kind.window + plan.max_step - 1 if kind.kind == "sliding" else 8192
            assert kind.kind in ("sliding", "full") and kind.rows == rows
            want = rows * (documented_row_bytes(kv, kind.n_kv_heads, kind.head_dim)
                           + documented_row_bytes(kv, kind.n_kv_heads, kind.v_head_dim))
            assert kind.bytes_per_layer == want
            total += want * len(kind.layers)
        assert plan.total_bytes == total
        assert memory.kv_bytes(shape, 8192, kv_dtype=kv) == total
    # Every row is 1 x 256, so the totals scale as one row does: 264 (int8) and 260 (fp8) bytes of
    # K or V against float16's 512.
    assert q8.total_bytes * 512 == half.total_bytes * 264 and f8.total_bytes * 512 == half.total_bytes * 260
    with pytest.raises(kvcore.InvalidArgumentError, match="kv_dtype = 'int4'"):
        memory.plan_memory(shape, context=8192, kv_dtype="int4")
    assert main(["memory", "--model", "gemma-3-1b", "--context", "8k", "--kv-dtype", "int8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kv_dtype"] == "int8" and out["total_bytes"] == q8.total_bytes


def test_the_docs_python_examples_run(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/quantized.md's Python examples run as written, and print what their comments say."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "quantized.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, flags=re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, "docs/quantized.md", "exec"), {})
    out = capsys.readouterr().out
    assert "dtype=qint8, compute_dtype=float16" in out
    assert "import: layer 0 dtype qint8 differs from the pool's float16" in out
