"""TorchQuantizedPagedKVPool against kvcore's PagedKVPool(cache, "qint8" / "fp8_e4m3"), bit for bit.

Both pools serve one BatchCache through the same random workload: sequences added, steps of
several sequences (prompts whose full blocks are named by their tokens), forks (a shared,
partly filled block copied on write), prefix adoption by fresh sequences, draft trees
committed on a random root path (``apply_copies``'s row copies), rewinds and releases.
After every layer of every step, each row a query of the step sees must hold, in both
pools, the same stored bytes (values, float32 scales, int8 zero points) and read back as
the same dequantized values; reads come through ``write_read`` (every live row) and
``write_gather`` (the rows named by a read index) in turn. The plain TorchPagedKVPool runs
the same workload against PagedKVPool(cache, float32). A scale read from the next row, or a
block copy that leaves the scales behind, fails the comparison (planted below).
"""

from __future__ import annotations

import random
from typing import Any, Optional

import numpy as np
import pytest
from needs import need

import kvcore
import kvcore.state

torch = need("torch")
ml_dtypes = need("ml_dtypes", reason="the bfloat16 compute cases and test_torch_quantized.py's rows")

from test_state_torch_paged import to_torch  # noqa: E402  ((T, H, D) numpy rows as [1, H, T, D])
from test_torch_quantized import FORMAT, rows as hard_rows  # noqa: E402  (zeros, constants, denormals)
from kvcore.torch import quantized_paged  # noqa: E402
from kvcore.torch.paged import TorchPagedKVPool  # noqa: E402
from kvcore.torch.quantized import quantize_rows  # noqa: E402
from kvcore.torch.quantized_paged import TorchQuantizedPagedKVPool  # noqa: E402

H, D, DV, B = 2, 4, 3, 2
POLICIES = [kvcore.Flat(), kvcore.Ring(window=4), kvcore.Flat(), kvcore.Ring(window=4, sinks=1)]
COMPUTE = {"float32": (np.float32, torch.float32), "bfloat16": (ml_dtypes.bfloat16, torch.bfloat16),
           "float16": (np.float16, torch.float16)}  # fmt: skip


def make_cache(block_size: int = B) -> kvcore.BatchCache:
    layers = [kvcore.LayerConfig(p, n_kv_heads=H, head_dim=D, v_head_dim=DV) for p in POLICIES]
    # One pool for both groups: the flat layers' 64 blocks and as many for the rings' windows.
    limits = kvcore.BatchLimits(block_size=block_size, max_seqs=4, num_blocks=128)
    return kvcore.BatchCache(kvcore.CacheConfig(40, layers, max_step=5, batch=limits))


def pools(cache: kvcore.BatchCache, kv_dtype: Optional[str], compute: str) -> tuple[Any, kvcore.PagedKVPool]:
    """The torch store and its numpy twin on ``cache``."""
    np_dtype, t_dtype = COMPUTE[compute]
    if kv_dtype is None:
        return TorchPagedKVPool(cache, dtype=t_dtype), kvcore.PagedKVPool(cache, np_dtype)
    return (TorchQuantizedPagedKVPool(cache, kv_dtype),
            kvcore.PagedKVPool(cache, FORMAT[kv_dtype], compute_dtype=np_dtype))  # fmt: skip


def same(got: Any, want: np.ndarray, what: str) -> None:
    """torch values [1, H, n, d] against numpy rows (n, H, d): the same bytes."""
    g = got[0].permute(1, 0, 2).contiguous()
    g = g.view(torch.int16) if g.dtype == torch.bfloat16 else g
    np.testing.assert_array_equal(g.numpy().view(np.uint8), np.ascontiguousarray(want).view(np.uint8), err_msg=what)


def same_stored(store: Any, paged: kvcore.PagedKVPool, layer: int, seen: np.ndarray, what: str) -> None:
    """The stored bytes of the rows ``seen``: values, scales and zero points of both pools."""
    raw = paged.rows_quantized(layer)
    tensors = store.tensors(layer)
    assert tensors is not None
    for t, name, dim in ((tensors[0], "k", D), (tensors[1], "v", DV)):
        s_off = (H * dim + 3) // 4 * 4
        mine = t[0, 0].numpy()[seen]
        np.testing.assert_array_equal(mine[:, : H * dim], raw[name][seen].view(np.uint8).reshape(len(seen), -1),
                                      err_msg=f"{what}: {name} values")
        np.testing.assert_array_equal(mine[:, s_off : s_off + 4 * H], raw[f"{name}_scales"][seen].view(np.uint8),
                                      err_msg=f"{what}: {name} scales")
        if raw[f"{name}_zero_points"] is not None:
            np.testing.assert_array_equal(mine[:, s_off + 4 * H : s_off + 5 * H],
                                          raw[f"{name}_zero_points"][seen].view(np.uint8),
                                          err_msg=f"{what}: {name} zero points")


def twin_step(cache: kvcore.BatchCache, store: Any, paged: kvcore.PagedKVPool, entries: list[Any], compute: str,
              rng: np.random.Generator, accepted: Optional[dict[int, list[int]]] = None) -> int:
    """One step through every layer of both pools, every seen row compared; committed (a tree on
    ``accepted``, its row copies applied to both). Returns the block copies the plan made."""
    np_dtype, t_dtype = COMPUTE[compute]
    step = cache.begin_step(entries)
    plan = step.plan()
    for g, group in enumerate(plan.groups):
        store.copy_blocks(g, group.copies)
    n = plan.n_tokens
    for layer in range(cache.n_layers):
        g = cache.group_of(layer)
        k, v = hard_rows(rng, n, H, D).astype(np_dtype), hard_rows(rng, n, H, DV).astype(np_dtype)
        mask = plan.mask(g)
        live = mask.shape[1]
        seen = np.flatnonzero(mask.any(axis=0))
        slots = torch.from_numpy(plan.groups[g].slots.astype(np.int64))
        tk, tv = to_torch(k, t_dtype), to_torch(v, t_dtype)
        want_k, want_v = paged.update(layer, step, k, v)
        what = f"layer {layer}, step {entries}"
        if layer % 2 == 0:
            keys, values = store.write_read(layer, slots, tk, tv, live)
            assert keys.shape == (1, H, live, D) and keys.dtype == t_dtype
            same(keys[:, :, seen], want_k[seen], what)
            same(values[:, :, seen], want_v[seen], what)
        else:
            read = torch.from_numpy(np.concatenate([seen, seen[::-1]]).astype(np.int64))  # any order, repeats
            keys, values = store.write_gather(layer, slots, tk, tv, live, read)
            assert keys.shape == (1, H, 2 * len(seen), D)
            same(keys, want_k[read.numpy()], what)
            same(values, want_v[read.numpy()], what)
        if isinstance(store, TorchQuantizedPagedKVPool):
            same_stored(store, paged, layer, seen, what)
    copies = sum(len(gp.copies) for gp in plan.groups)
    if accepted is None:
        cache.commit(step)
    else:
        commit = cache.commit(step, accepted=accepted)
        store.apply_copies(commit)
        paged.apply_copies(commit)
    return copies


def run_workload(seed: int, kv_dtype: Optional[str], compute: str) -> dict[str, int]:
    """A random workload through both pools (checked at every layer); what it reached."""
    rng, nprng = random.Random(seed), np.random.default_rng(seed)
    cache = make_cache(block_size=(2, 4, 1, 2)[seed % 4])
    store, paged = pools(cache, kv_dtype, compute)
    tokens: dict[int, list[int]] = {}
    seen = {"steps": 0, "copies": 0, "trees": 0, "forks": 0, "hits": 0, "releases": 0, "records": 0}
    for _ in range(45):
        what = rng.randrange(100)
        s = rng.randrange(cache.max_seqs)
        active = s in tokens
        if what < 12 and not active:
            cache.add_sequence(s)
            tokens[s] = []
        elif what < 55 and tokens:
            seqs = rng.sample(sorted(tokens), rng.randint(1, len(tokens)))
            new = {q: [rng.randrange(3) for _ in range(rng.randint(1, 3))] for q in seqs}
            if any(cache.length(q) + len(t) > cache.capacity for q, t in new.items()):
                continue
            try:
                seen["copies"] += twin_step(cache, store, paged, [(q, len(t), t) for q, t in new.items()], compute, nprng)
            except kvcore.CapacityError:
                continue
            for q, t in new.items():
                tokens[q] += t
            seen["steps"] += 1
        elif what < 67 and active and tokens[s]:  # a draft tree on s, committed on a random root path
            parents = [-1] + [rng.randrange(i) for i in range(1, rng.randint(2, 5))]
            if cache.length(s) + len(parents) > cache.capacity:
                continue
            node = rng.randrange(len(parents))
            path = [node]
            while parents[path[-1]] >= 0:
                path.append(parents[path[-1]])
            try:
                twin_step(cache, store, paged, [(s, len(parents), None, parents)], compute, nprng, {s: path[::-1]})
            except kvcore.CapacityError:
                continue
            tokens[s] += [-1] * len(path)  # unnamed: no prompt adopts them
            seen["trees"] += 1
        elif what < 77 and active:
            dst = rng.randrange(cache.max_seqs)
            upto = len(tokens[s]) - rng.randint(0, 1)  # near the end: partly filled blocks get copied
            if dst != s and cache.can_rewind(s, upto):
                if dst in tokens:
                    cache.release_sequence(dst)
                cache.fork(s, dst, upto)
                tokens[dst] = tokens[s][:upto]
                seen["forks"] += 1
                if cache.length(s) < cache.capacity and upto < cache.capacity:  # both write: copy on write
                    new = {s: [rng.randrange(3)], dst: [rng.randrange(3)]}
                    seen["copies"] += twin_step(cache, store, paged, [(q, 1, t) for q, t in new.items()], compute, nprng)
                    for q, t in new.items():
                        tokens[q] += t
        elif what < 92:  # a fresh sequence adopts a prompt from another's tokens
            if active:
                cache.release_sequence(s)
            cache.add_sequence(s)
            donor = tokens.get(rng.randrange(cache.max_seqs), [])
            prompt = [t for t in donor[: rng.randint(0, len(donor))] if t >= 0] + [rng.randrange(3)]
            hit = cache.adopt_prefix(s, prompt)
            tokens[s] = prompt[:hit]
            seen["hits"] += hit > 0
        elif active:
            cache.release_sequence(s)
            del tokens[s]
            seen["releases"] += 1
    for seq in sorted(tokens):  # records: PagedKVPool's, byte for byte
        assert store.export_sequence(seq) == paged.export_sequence(seq), f"record of sequence {seq}"
        seen["records"] += 1
    return seen


CASES = [(None, "float32"), ("int8", "float32"), ("int8", "bfloat16"), ("fp8", "float32"), ("fp8", "float16")]


@pytest.mark.parametrize("kv_dtype, compute", CASES, ids=[f"{k}-{c}" for k, c in CASES])
def test_every_read_equals_paged_kv_pools_bit_for_bit(kv_dtype: Optional[str], compute: str) -> None:
    total: dict[str, int] = {}
    for seed in range(4):
        for name, count in run_workload(seed, kv_dtype, compute).items():
            total[name] = total.get(name, 0) + count
    # The workloads reach every path that moves rows (else the comparison proves little).
    assert total["steps"] > 30 and total["trees"] >= 3 and total["forks"] >= 3 and total["hits"] >= 2, total
    assert total["copies"] >= 2 and total["releases"] >= 1 and total["records"] >= 4, total


def test_a_scale_read_from_the_next_row_fails_the_comparison(monkeypatch: pytest.MonkeyPatch) -> None:
    real = quantized_paged.dequantize_rows

    def next_rows_scales(kv_dtype: str, rows: Any, n_kv_heads: int, dim: int, out: Any, scratch: Any) -> Any:
        s_off = (n_kv_heads * dim + 3) // 4 * 4
        shifted = rows.clone()
        shifted[:, :, :-1, s_off:] = rows[:, :, 1:, s_off:]
        return real(kv_dtype, shifted, n_kv_heads, dim, out, scratch)

    monkeypatch.setattr(quantized_paged, "dequantize_rows", next_rows_scales)
    with pytest.raises(AssertionError):
        run_workload(0, "int8", "float32")


def test_a_block_copy_leaving_the_scales_behind_fails_the_comparison(monkeypatch: pytest.MonkeyPatch) -> None:
    real = TorchPagedKVPool.copy_blocks

    def values_only(self: Any, group: int, copies: Any) -> None:  # copies the value bytes, not the scales
        saved = [None if t is None else t[..., H * D :].clone() for t in self._keys]
        real(self, group, copies)
        for t, old in zip(self._keys, saved):
            if t is not None and old is not None:
                t[..., : old.shape[2], H * D :] = old

    monkeypatch.setattr(TorchPagedKVPool, "copy_blocks", values_only)
    with pytest.raises(AssertionError):
        for seed in range(4):
            run_workload(seed, "int8", "float32")


def extend(pool: Any, seq: int, values: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """One committed step of ``seq`` writing each layer's (k, v) float32 rows into ``pool`` (torch or numpy)."""
    cache = pool.cache
    step = cache.begin_step([(seq, len(values[0][0]))])
    plan = step.plan()
    for layer, (k, v) in enumerate(values):
        if isinstance(pool, kvcore.PagedKVPool):
            pool.update(layer, step, k, v)
            continue
        if layer == 0:
            for g, group in enumerate(plan.groups):
                pool.copy_blocks(g, group.copies)
        g = cache.group_of(layer)
        slots = torch.from_numpy(plan.groups[g].slots.astype(np.int64))
        pool.write_read(layer, slots, to_torch(k, torch.float32), to_torch(v, torch.float32), plan.mask(g).shape[1])
    cache.commit(step)


@pytest.mark.parametrize("kv_dtype", ["int8", "fp8"])
def test_records_move_between_the_torch_and_numpy_paged_pools(kv_dtype: str) -> None:
    nprng = np.random.default_rng(7)
    cache = make_cache()
    store, paged = pools(cache, kv_dtype, "float32")
    cache.add_sequence(0)
    for _ in range(5):
        twin_step(cache, store, paged, [(0, 3)], "float32", nprng)
    record = paged.export_sequence(0)
    assert kvcore.state.RecordInfo.of(record).layers[0].format == FORMAT[kv_dtype]
    # numpy -> torch and torch -> numpy: each import exports the same bytes and, given the same
    # next steps, holds what the exporter holds (their records stay equal).
    imported = TorchQuantizedPagedKVPool(make_cache(), kv_dtype)
    imported.import_sequence(1, record)
    assert imported.export_sequence(1) == record
    np_imported = kvcore.PagedKVPool(make_cache(), FORMAT[kv_dtype])
    np_imported.import_sequence(2, store.export_sequence(0))
    for _ in range(3):
        values = [(hard_rows(nprng, 2, H, D), hard_rows(nprng, 2, H, DV)) for _ in POLICIES]
        for pool, seq in ((store, 0), (imported, 1), (np_imported, 2)):
            extend(pool, seq, values)
    assert store.export_sequence(0) == imported.export_sequence(1) == np_imported.export_sequence(2)
    # Another storage format is refused naming both, before anything changes.
    plain_store, plain_paged = pools(make_cache(), None, "float32")
    plain_store.cache.add_sequence(0)
    twin_step(plain_store.cache, plain_store, plain_paged, [(0, 3)], "float32", nprng)
    other_format = pools(make_cache(), "fp8" if kv_dtype == "int8" else "int8", "float32")[0]
    refusals = [
        (other_format, record, rf"import: layer 0 holds {FORMAT[kv_dtype]} rows \(quantized, docs/quantized.md\), "
                               rf"the tensors {other_format.format}: import it into TorchQuantizedPagedKVPool\(cache, "
                               rf"'{kv_dtype}'\)"),
        (pools(make_cache(), kv_dtype, "float32")[0], plain_store.export_sequence(0),
         rf"import: layer 0 holds float32 rows, the tensors {FORMAT[kv_dtype]} \(quantized, docs/quantized.md\): "
         r"import it into a TorchPagedKVPool of float32"),
        (pools(make_cache(), None, "float32")[0], record,
         rf"import: layer 0 holds {FORMAT[kv_dtype]} rows \(quantized, docs/quantized.md\), the tensors float32"),
    ]
    for target, rec, match in refusals:
        with pytest.raises(kvcore.InvalidArgumentError, match=match):
            target.import_sequence(0, rec)
        assert not target.cache.sequence(0).active and all(target.tensors(i) is None for i in range(4))


# --- refusals: named, nothing written ----------------------------------------------------------


def _two_token_step(store: Any) -> tuple[Any, int]:
    cache = store.cache
    cache.add_sequence(0)
    plan = cache.begin_step([(0, 2)]).plan()
    return torch.from_numpy(plan.groups[0].slots.astype(np.int64)), int(plan.mask(0).shape[1])


def test_bad_values_and_names_are_refused_and_write_nothing() -> None:
    with pytest.raises(kvcore.InvalidArgumentError, match="kv_dtype = 'int4': must be 'int8'"):
        TorchQuantizedPagedKVPool(make_cache(), "int4")
    store = TorchQuantizedPagedKVPool(make_cache(), "int8", preallocate=True)
    slots, rows = _two_token_step(store)
    before = [t.clone() for t in store.tensors(0)]  # type: ignore[union-attr]
    k, v = torch.ones((1, H, 2, D)), torch.ones((1, H, 2, DV))
    bad = k.clone()
    bad[0, 1, 1, 2] = float("inf")
    with pytest.raises(kvcore.InvalidArgumentError, match="key: holds inf or NaN"):
        store.write_read(0, slots, bad, v, rows)
    with pytest.raises(kvcore.InvalidArgumentError, match=r"layer 0: key/value of torch.float64/torch.float64: a quantized pool takes"):
        store.write_read(0, slots, k.double(), v.double(), rows)
    with pytest.raises(kvcore.InvalidArgumentError, match=r"layer 0: key \(1, 2, 2, 3\) / value \(1, 2, 2, 3\): want \[1, 2, n_tokens, 4\]"):
        store.write_read(0, slots, v, v, rows)
    with pytest.raises(kvcore.InvalidArgumentError, match="slots reach rows"):
        store.write_read(0, slots + rows, k, v, rows)
    with pytest.raises(kvcore.InvalidArgumentError, match=r"layer 0: read reaches rows \[0, 99\]: must lie in \[0, rows = "):
        store.write_gather(0, slots, k, v, rows, torch.tensor([0, 99]))
    with pytest.raises(kvcore.InvalidArgumentError, match="read must be a 1-D int64 tensor, got torch.int32"):
        store.write_gather(0, slots, k, v, rows, torch.tensor([0], dtype=torch.int32))
    with pytest.raises(kvcore.InvalidArgumentError, match="layer = 4: must be in"):
        store.write_read(4, slots, k, v, rows)
    after = store.tensors(0)
    assert after is not None and all(torch.equal(a, b) for a, b in zip(after, before))
    keys, _ = store.write_read(0, slots, k, v, rows)  # the same call, good input: written
    assert not torch.equal(store.tensors(0)[0], before[0])  # type: ignore[index]
    # k is all ones: int8's step is (max(x, 0) - min(x, 0)) / 255 = 1/255, so the round trip is
    # within half a step, 0.002 (docs/quantized.md's rule); 1e-2 holds that with room.
    assert torch.allclose(keys[:, :, slots], k, atol=1e-2)


def test_sizes_workspace_and_the_plain_pools_write_gather() -> None:
    cache = make_cache()
    plain = TorchPagedKVPool(cache, dtype=torch.float32, preallocate=True)
    store = TorchQuantizedPagedKVPool(cache, "fp8", preallocate=True)
    # fp8: per row 8 values + 2 scales = 16 bytes (K), 6 values, 2 padding, 2 scales = 16 (V),
    # against (8 + 6) float32 values = 56 bytes.
    assert store.nbytes() / plain.nbytes() == pytest.approx(32 / 56)
    keys = store.tensors(0)[0]  # type: ignore[index]
    assert keys.dtype == torch.uint8 and keys.shape == (1, 1, store.max_rows[store.group_of[0]], 16)
    assert store.record_format == "fp8_e4m3" and plain.record_format == "float32"
    slots, rows = _two_token_step(store)
    k, v = torch.randn((1, H, 2, D)), torch.randn((1, H, 2, DV))
    got, _ = store.write_gather(0, slots, k, v, rows, slots)
    assert got.dtype == torch.float32 and store.workspace_nbytes >= got.numel() * 4
    packed = quantize_rows("fp8", k)
    assert torch.equal(store.tensors(0)[0][:, :, slots], packed)  # type: ignore[index]
    pk, _ = plain.write_gather(0, slots, k, v, rows, slots)
    assert torch.equal(pk, k)
    store.release()
    assert store.workspace_nbytes == 0
