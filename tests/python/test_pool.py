"""KVPool from Python: bytes follow plans, bad input changes nothing, views stay valid.

Expectations come from docs/design.md section 2 written out by brute force (which
positions a step needs; the last data written to each position), never from
the pool's own answers.
"""

from __future__ import annotations

import gc
import sys
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from needs import BFLOAT16, need, needs_ml_dtypes

import kvcore
from reference import needed, visible

Array = npt.NDArray[Any]


def make_config(
    policies: list[kvcore.LayerPolicy],
    capacity: int = 48,
    max_step: int = 3,
    heads: int = 2,
    dim: int = 4,
    v_dim: int = 0,
    initial_capacity: int = 512,
) -> kvcore.CacheConfig:
    layers = [kvcore.LayerConfig(p, heads, dim, v_dim) for p in policies]
    return kvcore.CacheConfig(capacity, layers, max_step=max_step, initial_capacity=initial_capacity)


MIXED = [kvcore.Ring(4, 1), kvcore.Ring(4, 1), kvcore.Flat()]


def dtypes() -> list[Any]:
    """Every storage dtype; bfloat16 skips, visibly, without ml_dtypes (needs.py)."""
    plain: list[Any] = [np.float32, np.float16, np.int8, np.uint8]
    return [*(pytest.param(d, id=np.dtype(d).name) for d in plain),
            pytest.param(BFLOAT16, id="bfloat16", marks=needs_ml_dtypes)]


class Reference:
    """Drives a cache + pool and remembers, per layer, the data last written to
    every position (uncommitted steps count: the rows were written)."""

    def __init__(self, cache: kvcore.SequenceCache, pool: kvcore.KVPool, seed: int = 0) -> None:
        self.cache, self.pool = cache, pool
        self.rng = np.random.default_rng(seed)
        self.k: list[dict[int, Array]] = [{} for _ in range(cache.n_layers)]
        self.v: list[dict[int, Array]] = [{} for _ in range(cache.n_layers)]

    def data(self, layer: int, T: int, value: bool) -> Array:
        cfg = self.cache.config.layers[layer]
        dim = cfg.value_dim if value else cfg.head_dim
        raw = self.rng.integers(-100, 100, size=(T, cfg.n_kv_heads, dim))
        return np.ascontiguousarray(np.abs(raw) if self.pool.dtype == np.uint8 else raw).astype(self.pool.dtype)

    def step(self, T: int, commit: bool = True) -> kvcore.Step:
        step = self.cache.begin_step(T)
        for layer in range(self.cache.n_layers):
            k, v = self.data(layer, T, False), self.data(layer, T, True)
            got_k, got_v, positions = self.pool.update(layer, step, k, v, order="positions")
            for j in range(T):
                self.k[layer][step.position + j] = k[j]
                self.v[layer][step.position + j] = v[j]
            self.check(layer, step, got_k, got_v, positions)
        if commit:
            step.commit()
        return step

    def check(self, layer: int, step: kvcore.Step, k: Array, v: Array, positions: Array) -> None:
        want = needed(self.cache.layer_policy(layer), step.position, step.T)
        assert positions.tolist() == want
        assert k.dtype == self.pool.dtype and v.dtype == self.pool.dtype
        np.testing.assert_array_equal(k, np.stack([self.k[layer][p] for p in want]))
        np.testing.assert_array_equal(v, np.stack([self.v[layer][p] for p in want]))


@pytest.mark.parametrize("dtype", dtypes())
def test_update_reads_back_exactly_the_needed_positions(dtype: Any) -> None:
    cache = kvcore.SequenceCache(make_config(MIXED, v_dim=3))
    pool = kvcore.KVPool(cache, dtype)
    ref = Reference(cache, pool)
    for T in [3, 3, 1, 2, 3, 1, 1, 3, 2]:  # wraps the rings (7 rows) several times
        ref.step(T)
    cache.rewind(cache.length - 2)  # speculative: two drafts rejected
    ref.step(1)
    ref.step(2, commit=False)  # retried at the same position
    ref.step(2)
    cache.rewind(1)  # back into the sinks
    ref.step(3)
    ref.step(1)


def test_read_after_write_equals_update_and_gathers_only_when_split() -> None:
    cache = kvcore.SequenceCache(make_config([kvcore.Ring(4, 1), kvcore.Flat()], max_step=2))
    pool = kvcore.KVPool(cache, np.float32)
    ref = Reference(cache, pool)
    for _ in range(6):
        ref.step(2)
    with cache.step(1) as step:
        for layer in range(2):
            plan = step.plan(layer)
            k, v = ref.data(layer, 1, False), ref.data(layer, 1, True)
            pool.write(layer, plan, k, v)
            rk, rv, positions = pool.read(layer, plan, order="positions")
            assert positions.tolist() == needed(cache.layer_policy(layer), step.position, 1)
            np.testing.assert_array_equal(rk[-1], k[0])
            np.testing.assert_array_equal(rv[-1], v[0])
            if len(plan.read) == 1:  # one run: a read-only view of the pool
                assert not rk.flags.writeable and not rk.flags.owndata
                assert rk.base is not None
            else:  # several runs: one gathered copy
                assert rk.flags.owndata and rk.flags.writeable


def test_views_keep_their_memory_alive_across_growth_and_pool_death() -> None:
    cache = kvcore.SequenceCache(make_config([kvcore.Flat()], capacity=64, max_step=2, initial_capacity=2))
    pool = kvcore.KVPool(cache, np.float32)
    ref = Reference(cache, pool)
    ref.step(2)
    step = cache.begin_step(1)
    k, v = ref.data(0, 1, False), ref.data(0, 1, True)
    ref.k[0][2], ref.v[0][2] = k[0], v[0]
    k0, v0, positions = pool.update(0, step, k, v, order="positions")
    assert pool.allocated_rows(0) == 4  # grew from 2 to 4 for the third row
    snapshot_k, snapshot_v = k0.copy(), v0.copy()
    step.commit()
    for _ in range(20):  # grows to 8, 16, 32, 64, releasing each old block
        ref.step(2)
    assert pool.allocated_rows(0) == 64
    del pool, ref, step
    gc.collect()
    churn = [np.full(4096, 7.0) for _ in range(64)]  # reuse freed memory if any was freed
    np.testing.assert_array_equal(k0, snapshot_k)
    np.testing.assert_array_equal(v0, snapshot_v)
    assert positions.tolist() == [0, 1, 2]
    del churn


def test_a_view_shows_rows_as_they_are_until_a_later_step_writes_them() -> None:
    # Ring W=4, C=1: rows 0..3; position 4 overwrites row 0.
    cache = kvcore.SequenceCache(make_config([kvcore.Ring(4)], max_step=1))
    pool = kvcore.KVPool(cache, np.float32)
    ref = Reference(cache, pool)
    for _ in range(3):
        ref.step(1)
    with cache.step(1) as step:
        k, v = ref.data(0, 1, False), ref.data(0, 1, True)
        ref.k[0][3], ref.v[0][3] = k[0], v[0]
        view, _, positions = pool.update(0, step, k, v, order="positions")
    assert positions.tolist() == [0, 1, 2, 3] and not view.flags.writeable
    before = view.copy()
    ref.step(1)  # position 4 -> row 0
    np.testing.assert_array_equal(view[0], ref.k[0][4])
    np.testing.assert_array_equal(view[1:], before[1:])


def test_positions_array_is_read_only() -> None:
    cache = kvcore.SequenceCache(make_config(MIXED))
    pool = kvcore.KVPool(cache, np.float32)
    ref = Reference(cache, pool)
    step = cache.begin_step(2)
    _, _, positions = pool.update(0, step, ref.data(0, 2, False), ref.data(0, 2, True), order="positions")
    with pytest.raises(ValueError):
        positions[0] = 5


# --- bad input: a clear error and nothing written ------------------------------


@pytest.fixture
def begun() -> tuple[kvcore.SequenceCache, kvcore.KVPool, Reference, kvcore.Step]:
    """A mixed cache after a few steps, with a step of 2 begun and written."""
    cache = kvcore.SequenceCache(make_config(MIXED, v_dim=3))
    pool = kvcore.KVPool(cache, np.float16)
    ref = Reference(cache, pool)
    for T in [3, 3, 2]:
        ref.step(T)
    step = ref.step(2, commit=False)
    return cache, pool, ref, step


def poison(shape: tuple[int, ...], dtype: Any = np.float16) -> Array:
    return np.full(shape, 99, dtype=dtype)


def assert_untouched(cache: kvcore.SequenceCache, pool: kvcore.KVPool, ref: Reference, step: kvcore.Step) -> None:
    """Every layer still reads exactly what the reference wrote (no 99 anywhere)."""
    for layer in range(cache.n_layers):
        k, v, positions = pool.read(layer, step.plan(layer), order="positions")
        ref.check(layer, step, k, v, positions)


BAD_INPUTS = [
    ("dtype", lambda: (poison((2, 2, 4), np.float32), poison((2, 2, 3))), "k.dtype = dtype('float32')"),
    ("v dtype", lambda: (poison((2, 2, 4)), poison((2, 2, 3), np.float64)), "v.dtype = dtype('float64')"),
    ("T", lambda: (poison((1, 2, 4)), poison((1, 2, 3))), "k.shape = (1, 2, 4)"),
    ("heads", lambda: (poison((2, 1, 4)), poison((2, 1, 3))), "k.shape = (2, 1, 4)"),
    ("head_dim", lambda: (poison((2, 2, 5)), poison((2, 2, 3))), "k.shape = (2, 2, 5)"),
    ("v_dim", lambda: (poison((2, 2, 4)), poison((2, 2, 4))), "v.shape = (2, 2, 4)"),
    ("ndim", lambda: (poison((2, 8)), poison((2, 2, 3))), "k.shape = (2, 8)"),
    ("strided", lambda: (poison((2, 2, 8))[:, :, ::2], poison((2, 2, 3))), "k: must be C-contiguous"),
    ("transposed", lambda: (poison((2, 2, 4)), poison((3, 2, 2)).transpose(2, 1, 0)), "v: must be C-contiguous"),
    ("list", lambda: (poison((2, 2, 4)).tolist(), poison((2, 2, 3))), "k: must be a numpy.ndarray, got list"),
]


@pytest.mark.parametrize("make,message", [(m, msg) for _, m, msg in BAD_INPUTS], ids=[n for n, _, _ in BAD_INPUTS])
def test_bad_arrays_are_rejected_with_nothing_written(begun: Any, make: Any, message: str) -> None:
    cache, pool, ref, step = begun
    for layer in range(cache.n_layers):
        k, v = make()
        with pytest.raises(kvcore.InvalidArgumentError) as e1:
            pool.update(layer, step, k, v, order="positions")
        assert message in str(e1.value)
        with pytest.raises(kvcore.InvalidArgumentError) as e2:
            pool.write(layer, step.plan(layer), k, v)
        assert message in str(e2.value)
    assert_untouched(cache, pool, ref, step)


@pytest.mark.parametrize("layer", [-1, 3, 2**31, 2**70])
def test_bad_layer_is_rejected(begun: Any, layer: int) -> None:
    cache, pool, ref, step = begun
    k, v = poison((2, 2, 4)), poison((2, 2, 3))
    for call in (
        lambda: pool.update(layer, step, k, v, order="positions"),
        lambda: pool.write(layer, step.plan(0), k, v),
        lambda: pool.read(layer, step.plan(0), order="positions"),
        lambda: pool.allocated_rows(layer),
        lambda: step.mask(layer, order="positions"),
    ):
        with pytest.raises(kvcore.InvalidArgumentError, match=f"layer = {layer}"):
            call()
    assert_untouched(cache, pool, ref, step)


def test_stale_step_and_stale_plan_are_rejected(begun: Any) -> None:
    cache, pool, ref, step = begun
    plans = [step.plan(layer) for layer in range(cache.n_layers)]
    step.commit()
    k, v = poison((2, 2, 4)), poison((2, 2, 3))
    with pytest.raises(kvcore.InvalidStateError):
        pool.update(0, step, k, v, order="positions")  # committed: no longer the begun step
    with pytest.raises(kvcore.InvalidStateError, match="no step is begun"):
        pool.write(0, plans[0], k, v)
    with pytest.raises(kvcore.InvalidStateError):
        pool.read(0, plans[0], order="positions")
    with pytest.raises(kvcore.InvalidStateError):
        step.mask(0, order="positions")
    nxt = cache.begin_step(2)
    with pytest.raises(kvcore.InvalidStateError, match="not layer 0's plan of the begun step"):
        pool.write(0, plans[0], k, v)  # the previous step's plan
    with pytest.raises(kvcore.InvalidStateError, match="not layer 0's plan"):
        pool.write(0, nxt.plan(2), k, v)  # the flat layer's plan on a ring layer
    retry = cache.begin_step(2)  # replaces nxt
    with pytest.raises(kvcore.InvalidStateError):
        pool.update(0, nxt, k, v, order="positions")
    other = kvcore.SequenceCache(make_config(MIXED, v_dim=3))
    with pytest.raises(kvcore.InvalidStateError, match="another cache"):
        pool.update(0, other.begin_step(2), k, v, order="positions")
    # The committed rows the retry reads still hold what was written before.
    for layer in range(cache.n_layers):
        got_k, got_v, positions = pool.read(layer, retry.plan(layer), order="positions")
        old = [i for i, p in enumerate(positions.tolist()) if p < retry.position]
        assert positions[old].tolist() == [p for p in needed(cache.layer_policy(layer), retry.position, 2) if p < retry.position]
        np.testing.assert_array_equal(got_k[old], np.stack([ref.k[layer][p] for p in positions[old]]))
        np.testing.assert_array_equal(got_v[old], np.stack([ref.v[layer][p] for p in positions[old]]))


# --- dtypes ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec,name",
    [(np.float32, "float32"), ("float16", "float16"), (np.dtype("int8"), "int8"), (np.uint8, "uint8"), ("<f4", "float32")],
)
def test_accepted_dtypes(spec: Any, name: str) -> None:
    pool = kvcore.KVPool(kvcore.SequenceCache(make_config(MIXED)), spec)
    assert pool.dtype == np.dtype(name)


def test_default_dtype_is_float16() -> None:
    assert kvcore.KVPool(kvcore.SequenceCache(make_config(MIXED))).dtype == np.float16


def test_bfloat16_by_name_and_by_type() -> None:
    ml_dtypes = need("ml_dtypes")
    cache = kvcore.SequenceCache(make_config(MIXED))
    assert kvcore.KVPool(cache, "bfloat16").dtype == ml_dtypes.bfloat16
    assert kvcore.KVPool(cache, ml_dtypes.bfloat16).dtype == ml_dtypes.bfloat16


def test_bfloat16_without_ml_dtypes_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # import now raises ImportError
    with pytest.raises(kvcore.InvalidArgumentError, match=r"needs the ml_dtypes package: pip install \"kvcore\[bfloat16\]\""):
        kvcore.KVPool(kvcore.SequenceCache(make_config(MIXED)), "bfloat16")


@pytest.mark.parametrize("spec", [np.float64, np.int32, ">f4", np.complex64, "nonsense", object()])
def test_rejected_dtypes(spec: Any) -> None:
    with pytest.raises(kvcore.InvalidArgumentError, match="dtype = "):
        kvcore.KVPool(kvcore.SequenceCache(make_config(MIXED)), spec)


# --- sizes and growth ----------------------------------------------------------------


def row_bytes(cfg: kvcore.CacheConfig, layer: int, itemsize: int) -> int:
    lc = cfg.layers[layer]
    return lc.n_kv_heads * (lc.head_dim + lc.value_dim) * itemsize


def test_nbytes_counts_rows_holding_committed_positions() -> None:
    cfg = make_config(MIXED, capacity=40, max_step=3, v_dim=6)
    cache = kvcore.SequenceCache(cfg)
    pool = kvcore.KVPool(cache, np.float16)
    ref = Reference(cache, pool)
    ring_rows = 1 + 4 + 3 - 1  # docs/design.md: S + W + C - 1
    assert pool.rows(0) == ring_rows and pool.rows(2) == 40
    assert pool.nbytes == 0
    for _ in range(8):
        ref.step(3)
        L = cache.length
        want = sum(min(L, pool.rows(layer)) * row_bytes(cfg, layer, 2) for layer in range(3))
        assert pool.nbytes == want
    # The ring layers hold a fixed number of rows however long the sequence.
    flat_only = cache.length * row_bytes(cfg, 2, 2)
    assert pool.nbytes - flat_only == 2 * ring_rows * row_bytes(cfg, 0, 2)


def test_lazy_growth_doubles_up_to_rows_and_keeps_data() -> None:
    cfg = make_config([kvcore.Flat(), kvcore.Ring(3)], capacity=40, max_step=4, initial_capacity=2)
    cache = kvcore.SequenceCache(cfg)
    pool = kvcore.KVPool(cache, np.float32)
    ref = Reference(cache, pool)  # checks every read against what was written
    assert pool.allocated_rows(0) == 2 and pool.allocated_rows(1) == 2
    seen = []
    for _ in range(10):
        ref.step(4)
        seen.append(pool.allocated_rows(0))
        assert pool.reserved_bytes == sum(pool.allocated_rows(layer) * row_bytes(cfg, layer, 4) for layer in range(2))
    assert seen == [4, 8, 16, 16, 32, 32, 32, 32, 40, 40]
    assert pool.allocated_rows(1) == pool.rows(1) == 3 + 4 - 1


def test_reserve_grows_now_and_checks_its_range() -> None:
    cache = kvcore.SequenceCache(make_config([kvcore.Flat()], capacity=32, initial_capacity=2))
    pool = kvcore.KVPool(cache, np.uint8)
    pool.reserve(0, 20)
    assert pool.allocated_rows(0) == 20
    for bad in (33, -1):
        with pytest.raises(kvcore.InvalidArgumentError, match="rows = "):
            pool.reserve(0, bad)
    assert pool.allocated_rows(0) == 20


def test_allocation_failure_raises_allocation_error() -> None:
    # 2**30 initial rows of 1024 heads x 1024 dims: petabytes, no overflow, no memory.
    cfg = kvcore.CacheConfig(
        2**31 - 1, kvcore.LayerConfig(kvcore.Flat(), 1024, 1024), max_step=1, initial_capacity=2**30
    )
    with pytest.raises(kvcore.AllocationError, match="cannot allocate"):
        kvcore.KVPool(kvcore.SequenceCache(cfg), np.float32)


def test_required_bytes_covers_every_row() -> None:
    cfg = make_config(MIXED, capacity=40, v_dim=6)
    need = kvcore.KVPool.required_bytes(cfg, np.float16)
    cache = kvcore.SequenceCache(cfg)
    rows = sum(cache.rows(layer) * row_bytes(cfg, layer, 2) for layer in range(3))
    assert rows <= need <= rows + 64 * (2 * 3 + 2) + 3 * 64
    with pytest.raises(kvcore.InvalidArgumentError):
        kvcore.KVPool.required_bytes(cfg, np.float64)


# --- Step.mask ---------------------------------------------------------------------


def test_mask_is_the_visibility_rule_over_the_read_positions() -> None:
    cache = kvcore.SequenceCache(make_config(MIXED, capacity=48, max_step=3))
    pool = kvcore.KVPool(cache, np.float32)
    ref = Reference(cache, pool)
    for T in [3, 2, 3, 1, 3, 3, 1, 2]:
        step = cache.begin_step(T)
        for layer in range(3):
            policy = cache.layer_policy(layer)
            mask = step.mask(layer, order="positions")
            positions = needed(policy, step.position, T)
            assert mask.dtype == np.bool_ and mask.shape == (T, step.plan(layer).read_len)
            want = [[visible(policy, step.position + i, k) for k in positions] for i in range(T)]
            assert mask.tolist() == want
        step.commit()
    del ref


@pytest.mark.parametrize("seed", range(12))
def test_mask_matches_the_rule_on_random_policies_and_steps(seed: int) -> None:
    rng = np.random.default_rng(seed)
    max_step = int(rng.integers(1, 6))
    policies = [
        kvcore.Ring(int(rng.integers(1, 9)), int(rng.integers(0, 4))),
        kvcore.Ring(int(rng.integers(1, 9)), 0),
        kvcore.Flat(),
    ]
    cache = kvcore.SequenceCache(make_config(policies, capacity=60, max_step=max_step))
    while cache.length < 60:
        T = int(rng.integers(1, min(max_step, 60 - cache.length) + 1))
        with cache.step(T) as step:
            for layer, policy in enumerate(policies):
                positions = needed(policy, step.position, T)
                want = [[visible(policy, step.position + i, k) for k in positions] for i in range(T)]
                assert step.mask(layer, order="positions").tolist() == want, (seed, layer, step.position, T)


def test_mask_is_read_only_and_shared_by_the_layers_of_one_policy() -> None:
    cache = kvcore.SequenceCache(make_config(MIXED))
    first = cache.begin_step(2)
    mask = first.mask(0, order="positions")
    assert not mask.flags.writeable
    with pytest.raises(ValueError):
        mask[0, 0] = not mask[0, 0]
    assert first.mask(1, order="positions") is mask  # layers 0 and 1 share Ring(4, 1)
    assert first.mask(2, order="positions") is not mask
    first.commit()
    second = cache.begin_step(1)
    assert second.mask(0, order="positions") is not mask and second.mask(0, order="positions").shape == (1, 3)


def test_pool_keeps_its_cache_alive_and_has_a_repr() -> None:
    pool = kvcore.KVPool(kvcore.SequenceCache(make_config(MIXED)), np.float32)
    gc.collect()
    assert pool.cache.n_layers == 3 and pool.n_layers == 3
    assert repr(pool).startswith("KVPool(n_layers=3, dtype=float32")
