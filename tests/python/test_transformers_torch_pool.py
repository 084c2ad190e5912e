"""The torch byte layer (kvcore.integrations.torch_pool): rows laid out by kvcore plans.

The reference is a dict position -> (K, V) of everything written in the current
timeline; every history the pool returns must equal the reference at the
positions the plan names, in that order, exactly.
"""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch", reason="the torch byte layer needs torch (pip install torch)")

import kvcore  # noqa: E402
from kvcore.integrations.torch_pool import TorchKVPool, read_positions  # noqa: E402

H, D, DV = 2, 4, 3


def make(*policies: kvcore.LayerPolicy, capacity: int = 64, max_step: int = 4, initial: int = 512) -> TorchKVPool:
    cfg = kvcore.CacheConfig(
        capacity,
        [kvcore.LayerConfig(p, n_kv_heads=H, head_dim=D, v_head_dim=DV) for p in policies],
        max_step=max_step,
        initial_capacity=initial,
    )
    return TorchKVPool(kvcore.SequenceCache(cfg))


def kv_for(positions: range, batch: int = 1, salt: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct K/V for each (position, salt): a stale row can never pass for a fresh one."""
    p = torch.tensor(list(positions), dtype=torch.float32)
    k = (p[None, None, :, None] * 1000 + salt * 100_000 + torch.arange(D)).expand(batch, H, -1, -1)
    v = -(p[None, None, :, None] * 1000 + salt * 100_000 + torch.arange(DV)).expand(batch, H, -1, -1)
    return k.contiguous(), v.contiguous()


def run_step(pool: TorchKVPool, T: int, ref: dict[int, tuple[torch.Tensor, torch.Tensor]], salt: int = 0) -> None:
    """One step through every layer, checked against the reference."""
    cache = pool.cache
    with cache.step(T) as step:
        k, v = kv_for(range(step.position, step.end), salt=salt)
        for j in range(T):
            ref[step.position + j] = (k[:, :, j], v[:, :, j])
        for layer in range(cache.n_layers):
            plan = step.plan(layer)
            keys, values = pool.update(layer, plan, k, v)
            positions = read_positions(plan)
            assert keys.shape == (1, H, len(positions), D) and values.shape == (1, H, len(positions), DV)
            want_k = torch.stack([ref[p][0] for p in positions], dim=2)
            want_v = torch.stack([ref[p][1] for p in positions], dim=2)
            assert torch.equal(keys, want_k), (layer, positions)
            assert torch.equal(values, want_v), (layer, positions)


@pytest.mark.parametrize("sinks", [0, 2])
def test_random_steps_and_rewinds_return_exact_history(sinks: int) -> None:
    rng = random.Random(7 + sinks)
    pool = make(kvcore.Ring(window=5, sinks=sinks), kvcore.Flat(), capacity=200, max_step=4, initial=8)
    cache = pool.cache
    ref: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    salt = 0
    while cache.length < 150:
        run_step(pool, rng.randint(1, 4), ref, salt)
        if rng.random() < 0.2:
            n = cache.length - rng.randint(1, 4)
            if cache.can_rewind(n):
                cache.rewind(n)
                salt += 1  # the rewound positions are rewritten with new values
                for p in [p for p in ref if p >= n]:
                    del ref[p]
    # Sinks stay where they were written; the ring never grows past kvcore's rows.
    assert pool.layer(0).allocated_rows == cache.rows(0) == sinks + 5 + 4 - 1  # type: ignore[union-attr]


def test_ring_is_allocated_whole_and_flat_grows_by_doubling_up_to_rows() -> None:
    pool = make(kvcore.Ring(window=8), kvcore.Flat(), capacity=40, max_step=4, initial=4)
    cache = pool.cache
    ref: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    run_step(pool, 1, ref)
    assert pool.layer(0).allocated_rows == 8 + 4 - 1  # type: ignore[union-attr]
    seen = []
    while cache.length < 40:
        run_step(pool, min(4, 40 - cache.length), ref)
        seen.append(pool.layer(1).allocated_rows)  # type: ignore[union-attr]
    assert sorted(set(seen)) == [8, 16, 32, 40]  # 4 -> 8 -> 16 -> 32 -> capped at capacity 40
    assert pool.nbytes(1) == 40 * H * (D + DV) * 4
    assert pool.nbytes() == pool.nbytes(0) + pool.nbytes(1)


def test_no_allocation_after_warm_up() -> None:
    pool = make(kvcore.Ring(window=6), kvcore.Ring(window=6, sinks=1), capacity=64, max_step=3)
    ref: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    while pool.cache.length < 20:
        run_step(pool, 3, ref)  # wraps: reads are gathered into the workspace
    ptrs = [(pool.layer(i).keys.data_ptr(), pool.layer(i).values.data_ptr()) for i in range(2)]  # type: ignore[union-attr]
    ws = pool.workspace_nbytes
    assert ws > 0
    while pool.cache.length < 60:
        run_step(pool, 1 + pool.cache.length % 3, ref)
    assert ptrs == [(pool.layer(i).keys.data_ptr(), pool.layer(i).values.data_ptr()) for i in range(2)]  # type: ignore[union-attr]
    assert pool.workspace_nbytes == ws


def test_one_run_reads_are_views_of_the_pool() -> None:
    pool = make(kvcore.Flat(), capacity=16)
    with pool.cache.step(3) as step:
        k, v = kv_for(range(3))
        keys, _ = pool.update(0, step.plan(0), k, v)
    assert keys.data_ptr() == pool.layer(0).keys.data_ptr()  # type: ignore[union-attr]


def test_shape_mismatch_is_refused_naming_the_shapes() -> None:
    pool = make(kvcore.Flat(), capacity=16)
    step = pool.cache.begin_step(2)
    k, v = kv_for(range(2))
    with pytest.raises(kvcore.InvalidArgumentError, match=r"want \(1, 2, 2, 4\)"):
        pool.update(0, step.plan(0), k[:, :, :1], v)  # T = 1 but the step has T = 2
    with pytest.raises(kvcore.InvalidArgumentError, match="4-D"):
        pool.update(0, step.plan(0), k[0], v[0])
    with pytest.raises(kvcore.InvalidArgumentError, match="differ"):
        pool.update(0, step.plan(0), k, v.double())
    with pytest.raises(kvcore.InvalidArgumentError, match=r"layer = 3: must be in \[0, n_layers = 1\)"):
        pool.update(3, step.plan(0), k, v)
    assert pool.layer(0) is None  # nothing was allocated by the failed calls


def test_new_batch_or_dtype_only_at_position_zero() -> None:
    pool = make(kvcore.Flat(), capacity=16)
    ref: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    run_step(pool, 2, ref)
    step = pool.cache.begin_step(1)
    k, v = kv_for(range(2, 3), batch=2)
    with pytest.raises(kvcore.InvalidArgumentError, match="can only start at position 0"):
        pool.update(0, step.plan(0), k, v)
    assert pool.layer(0).batch_size == 1  # type: ignore[union-attr]
    pool.cache.clear()
    step = pool.cache.begin_step(1)
    k, v = kv_for(range(1), batch=2)
    keys, _ = pool.update(0, step.plan(0), k.double(), v.double())
    assert keys.shape[0] == 2 and keys.dtype == torch.float64


def test_map_batch_reorders_rows_and_keeps_other_dims() -> None:
    pool = make(kvcore.Flat(), capacity=16)
    step = pool.cache.begin_step(2)
    k, v = kv_for(range(2), batch=2)
    k = k + torch.tensor([0.0, 0.5])[:, None, None, None]
    pool.update(0, step.plan(0), k, v)
    step.commit()
    pool.map_batch(0, lambda t: t.index_select(0, torch.tensor([1, 1])))
    assert torch.equal(pool.layer(0).keys[0, :, :2], k[1])  # type: ignore[union-attr]
    with pytest.raises(kvcore.InvalidArgumentError, match="only the batch dimension"):
        pool.map_batch(0, lambda t: t[:, :1])
    pool.map_batch(0, lambda t: t.repeat_interleave(2, dim=0))
    assert pool.layer(0).batch_size == 4  # type: ignore[union-attr]


def test_allocate_checks_batch_and_release_drops_everything() -> None:
    pool = make(kvcore.Ring(window=4), capacity=16)
    with pytest.raises(kvcore.InvalidArgumentError, match="batch_size = 0: must be >= 1"):
        pool.allocate(0, batch_size=0, dtype=torch.float32, device="cpu")
    pool.allocate(0, batch_size=3, dtype=torch.float16, device="cpu")
    assert pool.nbytes(0) == 3 * H * (4 + 4 - 1) * (D + DV) * 2
    pool.release()
    assert pool.layer(0) is None and pool.nbytes() == 0
