"""PagedKVPool from Python: a BatchCache's bytes follow its plans.

Expectations come from a small reference of docs/design.md sections 2 and 6 written
here (which keys a query of a sequence sees; the data a position holds), never
from the pool's answers. A position's data is a function of the tokens up to it
(and of the layer), so a block adopted by a prefix hit must hold exactly the
data a fresh computation would.
"""

from __future__ import annotations

import functools
import gc
import random
import zlib
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from needs import BFLOAT16, need, needs_ml_dtypes

import kvcore
from reference import visible

Array = npt.NDArray[Any]


def make_cache(
    policies: list[kvcore.LayerPolicy],
    *,
    capacity: int = 40,
    max_step: int = 3,
    block_size: int = 4,
    max_seqs: int = 4,
    num_blocks: int = 0,
    heads: int = 2,
    dim: int = 3,
    v_dim: int = 0,
) -> kvcore.BatchCache:
    layers = [kvcore.LayerConfig(p, heads, dim, v_dim) for p in policies]
    # One group per policy (page_layers = the layer count): these tests are about rows and masks;
    # test_one_budget_* and test_batch_prefix_events.py cover page-sized groups.
    batch = kvcore.BatchLimits(block_size=block_size, max_seqs=max_seqs, num_blocks=num_blocks, max_holes=4,
                               page_layers=len(policies))
    return kvcore.BatchCache(kvcore.CacheConfig(capacity, layers, max_step=max_step, batch=batch))


MIXED = [kvcore.Ring(4, 1), kvcore.Flat(), kvcore.Ring(4, 1), kvcore.Ring(3)]


class Reference:
    """The sequences as the rule sees them: per sequence its tokens (one per
    position) and its removed positions; a position's data is a function of
    tokens[: p + 1] and the layer."""

    def __init__(self, cache: kvcore.BatchCache, pool: kvcore.PagedKVPool) -> None:
        self.cache, self.pool = cache, pool
        self.tokens: dict[int, list[int]] = {}
        self.removed: dict[int, set[int]] = {}
        self.memo: dict[tuple[int, bool, tuple[int, ...]], Array] = {}
        self.copies = 0  # block copies of the last step

    def data(self, layer: int, prefix: list[int], value: bool) -> Array:
        key = (layer, value, tuple(prefix))
        if key not in self.memo:
            cfg = self.cache.layer_config(layer)
            dim = cfg.value_dim if value else cfg.head_dim
            base = zlib.crc32(bytes(str(key), "ascii")) % 1000
            row = (base + np.arange(cfg.n_kv_heads * dim) % 7).reshape(cfg.n_kv_heads, dim)
            self.memo[key] = row.astype(self.pool.dtype)
        return self.memo[key]

    def seen(self, group: int, seq: int, first: int, context: int) -> list[int]:
        """Positions below context some query of [first, context) sees, increasing."""
        policy = self.cache.group_policy(group)
        removed = self.removed[seq]
        return [
            k
            for k in range(context)
            if k not in removed and any(visible(policy, q, k) for q in range(max(first, k), context))
        ]

    def step(self, entries: list[tuple[int, list[int]]], commit: bool = True) -> bool:
        """Begins a step, updates every layer, checks it, commits it or not."""
        try:
            step = self.cache.begin_step([(s, len(t), t) for s, t in entries])
        except kvcore.CapacityError:
            return False
        for s, t in entries:
            self.tokens[s] = self.tokens[s] + t
        self.copies = sum(g.copies.shape[0] for g in step.plan().groups)
        for layer in range(self.cache.n_layers):
            k = np.stack([self.data(layer, self.tokens[s][: p + 1], False) for s, t in entries for p in self.at(s, t)])
            v = np.stack([self.data(layer, self.tokens[s][: p + 1], True) for s, t in entries for p in self.at(s, t)])
            k_rows, v_rows = self.pool.update(layer, step, k, v)
            self.check(layer, step, k_rows, v_rows)
        if commit:
            step.commit()
        else:
            for s, t in entries:
                self.tokens[s] = self.tokens[s][: len(self.tokens[s]) - len(t)]
        return True

    def at(self, seq: int, new: list[int]) -> range:
        n = len(self.tokens[seq])
        return range(n - len(new), n)

    def check(self, layer: int, step: kvcore.BatchStep, k_rows: Array, v_rows: Array) -> None:
        group = self.cache.group_of(layer)
        plan = step.plan()
        B = plan.block_size
        mask = self.pool.mask(step, group)
        assert not k_rows.flags.writeable and not v_rows.flags.writeable
        assert k_rows.shape[0] == v_rows.shape[0] == mask.shape[1] == self.cache.used_blocks(group) * B
        tables = plan.groups[group].block_tables
        for i, seq in enumerate(plan.seq_ids.tolist()):
            first, ctx = int(plan.first_positions[i]), int(plan.context_lens[i])
            want = self.seen(group, seq, first, ctx)
            k, v, positions = self.pool.gather(layer, step, i)
            assert positions.tolist() == want
            for j, p in enumerate(want):
                assert np.array_equal(k[j], self.data(layer, self.tokens[seq][: p + 1], False)), (layer, seq, p)
                assert np.array_equal(v[j], self.data(layer, self.tokens[seq][: p + 1], True)), (layer, seq, p)
            policy = self.cache.group_policy(group)
            for t in range(int(plan.query_starts[i]), int(plan.query_starts[i + 1])):
                q = first + t - int(plan.query_starts[i])
                expect = np.zeros(mask.shape[1], dtype=bool)
                for key in range(q + 1):
                    if key in self.removed[seq] or not visible(policy, q, key):
                        continue
                    row = int(tables[seq, key // B]) * B + key % B
                    expect[row] = True
                    assert np.array_equal(k_rows[row], self.data(layer, self.tokens[seq][: key + 1], False)), (q, key)
                    assert np.array_equal(v_rows[row], self.data(layer, self.tokens[seq][: key + 1], True)), (q, key)
                assert np.array_equal(mask[t], expect), (layer, seq, q)


@functools.lru_cache(maxsize=None)
def run_workload(seed: int, dtype: Any) -> dict[str, int]:
    """A random workload, checked after every step; what it reached (each seed runs once)."""
    rng = random.Random(seed)
    cache = make_cache(MIXED, block_size=rng.choice([1, 2, 4]), v_dim=rng.choice([0, 5]), max_seqs=4)
    pool = kvcore.PagedKVPool(cache, dtype, initial_rows=rng.choice([0, 4]))
    ref = Reference(cache, pool)
    seen = {"steps": 0, "copies": 0, "hits": 0, "forks": 0, "removals": 0, "abandoned": 0}
    for _ in range(70):
        what = rng.randrange(100)
        s = rng.randrange(cache.max_seqs)
        active = s in ref.tokens
        if what < 10 and not active:
            cache.add_sequence(s)
            ref.tokens[s], ref.removed[s] = [], set()
        elif what < 60 and ref.tokens:
            seqs = rng.sample(sorted(ref.tokens), rng.randint(1, len(ref.tokens)))
            entries = [(q, [rng.randrange(3) for _ in range(rng.randint(1, cache.max_step))]) for q in seqs]
            commit = rng.randrange(10) < 8
            if ref.step(entries, commit):
                seen["copies"] += ref.copies
                seen["steps"] += 1
                seen["abandoned"] += not commit
        elif what < 70 and active:
            dst = rng.randrange(cache.max_seqs)
            upto = len(ref.tokens[s]) - rng.randint(0, 2)  # near the end: partly filled blocks get copied
            if dst != s and cache.can_rewind(s, upto):
                if dst in ref.tokens:
                    cache.release_sequence(dst)
                cache.fork(s, dst, upto)
                ref.tokens[dst] = ref.tokens[s][:upto]
                ref.removed[dst] = {p for p in ref.removed[s] if p < upto}
                seen["forks"] += 1
        elif what < 78 and active and ref.tokens[s]:
            n = len(ref.tokens[s])
            p0 = rng.randrange(n)
            p1 = rng.randint(p0 + 1, n - 1) if p0 + 1 < n - 1 else n  # a middle range (a tail: truncation)
            try:
                cache.remove(s, p0, p1)
            except (kvcore.InvalidStateError, kvcore.CapacityError):
                continue
            if p1 >= n:
                ref.tokens[s] = ref.tokens[s][:p0]
                ref.removed[s] = {p for p in ref.removed[s] if p < p0}
            else:
                ref.removed[s] |= set(range(p0, p1))
            seen["removals"] += 1
        elif what < 88 and active:
            n = max(0, len(ref.tokens[s]) - rng.randint(0, cache.max_step))
            if cache.can_rewind(s, n):
                cache.rewind(s, n)
                ref.tokens[s] = ref.tokens[s][:n]
                ref.removed[s] = {p for p in ref.removed[s] if p < n}
        elif what < 98:  # a fresh sequence adopts a prompt from another's tokens
            if active:
                cache.release_sequence(s)
            cache.add_sequence(s)
            donor = ref.tokens.get(rng.randrange(cache.max_seqs), [])
            prompt = donor[: rng.randint(0, len(donor))] + [rng.randrange(3) for _ in range(rng.randint(0, 2))]
            hit = cache.adopt_prefix(s, prompt)
            ref.tokens[s], ref.removed[s] = prompt[:hit], set()
            seen["hits"] += hit > 0
        elif active:
            cache.release_sequence(s)
            del ref.tokens[s], ref.removed[s]
    return seen


@pytest.mark.parametrize("seed", range(6))
def test_gather_and_rows_with_mask_are_exactly_the_rule(seed: int) -> None:
    seen = run_workload(seed, np.float32)
    assert seen["steps"] > 10


def test_the_workloads_reach_forks_removals_prefix_hits_and_abandoned_steps() -> None:
    total = {"steps": 0, "copies": 0, "hits": 0, "forks": 0, "removals": 0, "abandoned": 0}
    for seed in range(6):
        for key, n in run_workload(seed, np.float32).items():
            total[key] += n
    assert all(n > 0 for n in total.values()), total


def dtypes() -> list[Any]:
    """The storage dtypes but float32 (the workload's own); bfloat16 skips, visibly, without ml_dtypes (needs.py)."""
    plain: list[Any] = [np.float16, np.int8, np.uint8]
    return [*(pytest.param(d, id=np.dtype(d).name) for d in plain),
            pytest.param(BFLOAT16, id="bfloat16", marks=needs_ml_dtypes)]


@pytest.mark.parametrize("dtype", dtypes())
def test_every_dtype_moves_bytes_exactly(dtype: Any) -> None:
    run_workload(100, dtype)


# --- views -----------------------------------------------------------------------


def decode(cache: kvcore.BatchCache, pool: kvcore.PagedKVPool, seqs: list[int], fill: float) -> tuple[Array, Array]:
    """One step of one token per sequence, every layer written with `fill`."""
    with cache.step([(s, 1) for s in seqs]) as step:
        for layer in range(cache.n_layers):
            cfg = cache.layer_config(layer)
            k = np.full((len(seqs), cfg.n_kv_heads, cfg.head_dim), fill, dtype=pool.dtype)
            v = np.full((len(seqs), cfg.n_kv_heads, cfg.value_dim), fill, dtype=pool.dtype)
            out = pool.update(layer, step, k, v)
    return out


def test_views_are_read_only_and_outlive_growth_and_the_pool() -> None:
    cache = make_cache([kvcore.Flat()], capacity=64, block_size=2, max_seqs=2)
    pool = kvcore.PagedKVPool(cache, np.float32, initial_rows=2)
    cache.add_sequence(0)
    cache.add_sequence(1)
    k0, v0 = decode(cache, pool, [0, 1], 1.0)  # 2 blocks: 4 rows, grown from 2
    assert pool.allocated_rows(0) == 4
    assert k0.shape == (4, 2, 3) and not k0.flags.writeable and not v0.flags.writeable
    with pytest.raises(ValueError):
        k0[0, 0, 0] = 5.0
    decode(cache, pool, [0, 1], 2.0)  # the same blocks: the view shows the new rows
    assert pool.allocated_rows(0) == 4 and sorted(k0[:, 0, 0].tolist()) == [1.0, 1.0, 2.0, 2.0]
    snapshot = k0.copy()
    for i in range(20):  # grows to 8, 16, 32, 64 rows, releasing each old block
        decode(cache, pool, [0, 1], float(i + 2))
    assert pool.allocated_rows(0) == 64
    last_k, _ = pool.rows(0)
    assert last_k.shape[0] == cache.used_blocks(0) * 2
    last_snapshot = last_k.copy()
    del pool
    gc.collect()
    churn = [np.full(4096, 7.0) for _ in range(64)]  # reuse freed memory if any was freed
    np.testing.assert_array_equal(k0, snapshot)
    np.testing.assert_array_equal(last_k, last_snapshot)
    del churn


def test_a_view_shows_rows_as_they_are_until_a_later_step_writes_them() -> None:
    cache = make_cache([kvcore.Flat()], block_size=4, max_seqs=1)
    pool = kvcore.PagedKVPool(cache, np.float32)
    cache.add_sequence(0)
    k0, _ = decode(cache, pool, [0], 1.0)
    assert k0.shape[0] == 4 and float(k0[1, 0, 0]) == 0.0  # rows never written read as zeros
    decode(cache, pool, [0], 2.0)  # position 1 -> row 1 of the same block
    assert float(k0[1, 0, 0]) == 2.0


def test_copy_on_write_of_a_forked_partial_block() -> None:
    cache = make_cache([kvcore.Flat()], block_size=4, max_seqs=2)
    pool = kvcore.PagedKVPool(cache, np.float32)
    cache.add_sequence(0)
    for i in range(6):
        decode(cache, pool, [0], float(i + 1))
    cache.fork(0, 1)  # shares the block holding positions 4, 5
    with cache.step([(0, 1), (1, 1)]) as step:
        assert step.plan().groups[0].copies.shape == (2, 2)  # one private copy per writer: the shared block waits for the commit
        k = np.array([[[7.0] * 3] * 2, [[8.0] * 3] * 2], dtype=np.float32)
        pool.update(0, step, k, k)
        for entry, own in enumerate([7.0, 8.0]):
            got, _, positions = pool.gather(0, step, entry)
            assert positions.tolist() == list(range(7))
            assert got[:, 0, 0].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, own]


# --- masks --------------------------------------------------------------------------


def test_masks_are_read_only_and_shared_by_the_layers_of_a_group_within_a_step() -> None:
    cache = make_cache(MIXED)
    pool = kvcore.PagedKVPool(cache, np.float16)
    for s in range(3):
        cache.add_sequence(s)
    with cache.step([(0, 3), (1, 2), (2, 1)]) as step:
        for layer in range(cache.n_layers):
            cfg = cache.layer_config(layer)
            k = np.zeros((6, cfg.n_kv_heads, cfg.head_dim), np.float16)
            k_rows, _ = pool.update(layer, step, k, k)
            mask = pool.mask(step, cache.group_of(layer))
            assert mask.shape == (6, k_rows.shape[0]) and mask.dtype == np.bool_
        ring, flat = pool.mask(step, cache.group_of(0)), pool.mask(step, cache.group_of(1))
        assert pool.mask(step, cache.group_of(2)) is ring  # layers 0 and 2 share Ring(4, 1)
        assert ring is not flat
        assert not ring.flags.writeable
        with pytest.raises(ValueError):
            ring[0, 0] = True
        np.testing.assert_array_equal(ring, step.plan().mask(cache.group_of(0)))
    with cache.step([(0, 1)]) as step2:
        assert pool.mask(step2, cache.group_of(0)) is not ring  # a new step, a new mask
        assert pool.mask(step2, cache.group_of(0)).shape[0] == 1


# --- bad input: a clear error and nothing written ------------------------------


@pytest.fixture
def begun() -> tuple[kvcore.BatchCache, kvcore.PagedKVPool, kvcore.BatchStep, list[Array]]:
    """Two sequences after a few steps, with a step of 2 + 1 tokens begun and written
    (value 1.0), and a copy of every layer's live K rows."""
    cache = make_cache(MIXED, v_dim=5)
    pool = kvcore.PagedKVPool(cache, np.float16)
    cache.add_sequence(0)
    cache.add_sequence(1)
    for _ in range(3):
        decode(cache, pool, [0, 1], 0.5)
    step = cache.begin_step([(0, 2), (1, 1)])
    for layer in range(cache.n_layers):
        pool.update(layer, step, np.ones((3, 2, 3), np.float16), np.ones((3, 2, 5), np.float16))
    return cache, pool, step, [pool.rows(layer)[0].copy() for layer in range(cache.n_layers)]


def poison(shape: tuple[int, ...], dtype: Any = np.float16) -> Array:
    return np.full(shape, 99, dtype=dtype)


def assert_untouched(pool: kvcore.PagedKVPool, before: list[Array]) -> None:
    for layer, rows in enumerate(before):
        np.testing.assert_array_equal(pool.rows(layer)[0], rows)


BAD_INPUTS = [
    ("dtype", lambda: (poison((3, 2, 3), np.float32), poison((3, 2, 5))), "k.dtype = dtype('float32'): the paged pool stores dtype('float16')"),
    ("v dtype", lambda: (poison((3, 2, 3)), poison((3, 2, 5), np.float64)), "v.dtype = dtype('float64')"),
    ("n_tokens", lambda: (poison((2, 2, 3)), poison((2, 2, 5))), "k.shape = (2, 2, 3): must be (n_tokens, n_kv_heads, head_dim) = (3, 2, 3)"),
    ("heads", lambda: (poison((3, 1, 3)), poison((3, 1, 5))), "k.shape = (3, 1, 3)"),
    ("v_dim", lambda: (poison((3, 2, 3)), poison((3, 2, 3))), "v.shape = (3, 2, 3): must be (n_tokens, n_kv_heads, value_dim) = (3, 2, 5)"),
    ("ndim", lambda: (poison((3, 6)), poison((3, 2, 5))), "k.shape = (3, 6)"),
    ("strided", lambda: (poison((3, 2, 6))[:, :, ::2], poison((3, 2, 5))), "k: must be C-contiguous"),
    ("list", lambda: (poison((3, 2, 3)).tolist(), poison((3, 2, 5))), "k: must be a numpy.ndarray, got list"),
]  # fmt: skip


@pytest.mark.parametrize("make,message", [(m, msg) for _, m, msg in BAD_INPUTS], ids=[n for n, _, _ in BAD_INPUTS])
def test_bad_arrays_are_refused_with_nothing_written(begun: Any, make: Any, message: str) -> None:
    cache, pool, step, before = begun
    for layer in range(cache.n_layers):
        k, v = make()
        with pytest.raises(kvcore.InvalidArgumentError) as e:
            pool.update(layer, step, k, v)
        assert message in str(e.value)
    assert_untouched(pool, before)


def test_a_view_of_the_layers_own_rows_is_refused(begun: Any) -> None:
    cache, pool, step, before = begun
    k_rows, v_rows = pool.rows(0)
    with pytest.raises(kvcore.InvalidArgumentError, match="k/v overlap the layer's own rows: pass a copy"):
        pool.update(0, step, k_rows[:3], np.ones((3, 2, 5), np.float16))
    assert_untouched(pool, before)
    pool.update(0, step, k_rows[:3].copy(), np.ones((3, 2, 5), np.float16))  # a copy is fine
    # Layer 1 (the flat group's first layer) shares layer 0's storage (storage_layer): its rows
    # are the layer's own too; layer 2 (the ring group's second) has a storage of its own.
    assert [cache.storage_layer(layer) for layer in range(4)] == [0, 0, 2, 0]
    with pytest.raises(kvcore.InvalidArgumentError, match="k/v overlap the layer's own rows: pass a copy"):
        pool.update(1, step, k_rows[:3], np.ones((3, 2, 5), np.float16))
    pool.update(2, step, k_rows[:3], np.ones((3, 2, 5), np.float16))  # another storage's rows are fine


@pytest.mark.parametrize("layer", [-1, 4, 2**31, 2**70])
def test_bad_layer_is_refused(begun: Any, layer: int) -> None:
    cache, pool, step, before = begun
    for call in (
        lambda: pool.update(layer, step, poison((3, 2, 3)), poison((3, 2, 5))),
        lambda: pool.rows(layer),
        lambda: pool.gather(layer, step, 0),
        lambda: pool.allocated_rows(layer),
        lambda: pool.reserve(layer, 1),
    ):
        with pytest.raises(kvcore.InvalidArgumentError, match=f"layer = {layer}"):
            call()
    assert_untouched(pool, before)


def test_bad_group_and_entry_are_refused(begun: Any) -> None:
    cache, pool, step, _ = begun
    with pytest.raises(kvcore.InvalidArgumentError, match="group = 3: must be in"):
        pool.mask(step, 3)
    with pytest.raises(kvcore.InvalidArgumentError, match=r"gather of layer 0: entry = 2, must be in \[0, n_entries = 2\)"):
        pool.gather(0, step, 2)
    with pytest.raises(kvcore.InvalidArgumentError, match="entry = -1"):
        pool.gather(0, step, -1)


def test_stale_steps_and_steps_of_another_cache_are_refused(begun: Any) -> None:
    cache, pool, step, before = begun
    step.commit()
    k, v = poison((3, 2, 3)), poison((3, 2, 5))
    for call in (lambda: pool.update(0, step, k, v), lambda: pool.mask(step, 0), lambda: pool.gather(0, step, 0)):
        with pytest.raises(kvcore.InvalidStateError):
            call()
    other = make_cache(MIXED, v_dim=5)
    other.add_sequence(0)
    foreign = other.begin_step([(0, 3)])
    with pytest.raises(kvcore.InvalidStateError, match="the step belongs to another BatchCache than the pool's"):
        pool.update(0, foreign, k, v)
    assert_untouched(pool, before)


def test_gather_and_rows_before_the_layer_is_updated_are_invalid_state() -> None:
    cache = make_cache([kvcore.Flat()], block_size=4, max_seqs=1)
    pool = kvcore.PagedKVPool(cache, np.float32, initial_rows=0)
    cache.add_sequence(0)
    step = cache.begin_step([(0, 2)])
    with pytest.raises(kvcore.InvalidStateError, match="update the layer for the step first"):
        pool.rows(0)
    with pytest.raises(kvcore.InvalidStateError, match="update the layer for the step first"):
        pool.gather(0, step, 0)


# --- construction, sizes, dtypes ---------------------------------------------------


def test_dtypes_accepted_and_refused() -> None:
    cache = make_cache([kvcore.Flat()])
    assert kvcore.PagedKVPool(cache).dtype == np.float16
    specs: list[tuple[Any, str]] = [(np.float32, "float32"), ("int8", "int8"), (np.dtype("uint8"), "uint8")]
    for spec, name in specs:
        assert kvcore.PagedKVPool(cache, spec).dtype.name == name
    need("ml_dtypes")
    assert kvcore.PagedKVPool(cache, "bfloat16").dtype.name == "bfloat16"
    for bad in (np.float64, ">f2", "nope"):
        with pytest.raises(kvcore.InvalidArgumentError, match="dtype"):
            kvcore.PagedKVPool(cache, bad)


def test_bad_construction_is_refused() -> None:
    with pytest.raises(kvcore.InvalidArgumentError, match="cache: must not be None"):
        kvcore.PagedKVPool(None, np.float16)  # type: ignore[arg-type]
    with pytest.raises(kvcore.InvalidArgumentError, match="cache: must not be None"):
        kvcore.PagedKVPool.required_bytes(None, np.float16)  # type: ignore[arg-type]
    with pytest.raises(kvcore.InvalidArgumentError, match="initial_rows = -1: must be >= 0"):
        kvcore.PagedKVPool(make_cache([kvcore.Flat()]), np.float16, initial_rows=-1)
    with pytest.raises(kvcore.InvalidArgumentError, match="initial_rows = 2147483648"):
        kvcore.PagedKVPool(make_cache([kvcore.Flat()]), np.float16, initial_rows=2**31)


def test_allocation_failure_raises_allocation_error() -> None:
    # 2^21 rows of 1024 heads x 1024 dims of float32: 8 TiB per layer, no overflow, no memory.
    layer = kvcore.LayerConfig(kvcore.Flat(), 1024, 1024)
    batch = kvcore.BatchLimits(block_size=16, max_seqs=1)
    cache = kvcore.BatchCache(kvcore.CacheConfig(2**21, [layer], max_step=1, batch=batch))
    with pytest.raises(kvcore.AllocationError, match="cannot allocate"):
        kvcore.PagedKVPool(cache, np.float32, initial_rows=2**21)
    pool = kvcore.PagedKVPool(cache, np.float32, initial_rows=0)
    with pytest.raises(kvcore.AllocationError, match="cannot allocate"):
        pool.reserve(0, 2**21)
    assert pool.reserved_bytes == 0


def test_reserve_grows_now_and_checks_its_range() -> None:
    cache = make_cache(MIXED)
    pool = kvcore.PagedKVPool(cache, np.int8, initial_rows=0)
    assert pool.reserved_bytes == 0 and pool.allocated_rows(1) == 0
    pool.reserve(1, 9)
    assert pool.allocated_rows(1) == 9
    rows = cache.num_blocks(cache.group_of(1)) * cache.block_size
    for bad in (-1, rows + 1):
        with pytest.raises(kvcore.InvalidArgumentError, match=rf"reserve\(layer 1, rows = {bad}\)"):
            pool.reserve(1, bad)
    pool.reserve(1, rows)
    assert pool.allocated_rows(1) == rows


def test_sizes_nbytes_and_required_bytes() -> None:
    cache = make_cache(MIXED, v_dim=5)
    row = {layer: 2 * 3 * 2 + 2 * 5 * 2 for layer in range(4)}  # float16 K + V bytes of one row
    # The one pool's blocks in each storage: the layers that own one (storage_layer) hold them.
    owners = [layer for layer in range(4) if cache.storage_layer(layer) == layer]
    assert owners == [0, 2]
    full = sum(cache.num_blocks(0) * 4 * row[layer] for layer in owners)
    need = kvcore.PagedKVPool.required_bytes(cache, np.float16)
    assert full <= need <= full + 64 * (2 * 4 + 2) + 4 * 96
    with pytest.raises(kvcore.InvalidArgumentError):
        kvcore.PagedKVPool.required_bytes(cache, np.float64)
    pool = kvcore.PagedKVPool(cache, np.float16, initial_rows=0)
    assert pool.nbytes == 0 and pool.n_layers == 4 and pool.cache is cache
    cache.add_sequence(0)
    cache.add_sequence(1)
    decode(cache, pool, [0, 1], 1.0)  # one block per sequence per group
    assert pool.nbytes == sum(2 * 4 * row[layer] for layer in range(4))
    assert pool.reserved_bytes >= pool.nbytes
    assert repr(pool).startswith("PagedKVPool(n_layers=4, dtype=float16, block_size=4, reserved_bytes=")


def test_the_benchmark_runs_at_tiny_sizes(tmp_path: Any) -> None:
    """bench/paged_pool_bench.py cannot rot (no timing is asserted)."""
    import json
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[2] / "bench"
    sys.path.insert(0, str(bench))
    try:
        import paged_pool_bench
    finally:
        sys.path.remove(str(bench))
    out = tmp_path / "paged.json"
    assert paged_pool_bench.main(["--seqs", "3", "--contexts", "40", "--reps", "2", "--calls", "3", "--out", str(out)]) == 0
    result = json.loads(out.read_text())["results"][0]
    assert result["context"] == 40 and result["flat"]["kvcore_ns"] > 0 and result["ring"]["live_rows"] > 0
