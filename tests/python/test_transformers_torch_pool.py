"""The torch byte layer (kvcore.torch.pool): rows laid out by kvcore plans.

The reference is a dict position -> (K, V) of everything written in the current
timeline; every history the pool returns must equal the reference at the
positions the plan names, in that order, exactly. Both layouts are checked: the
compact one and mirrored rings (a wrapping ring repeats its first R - 1 ring rows
after its last, so a window without sinks is always one view).
"""

from __future__ import annotations

import random

import pytest
from needs import need

torch = need("torch", reason="the torch byte layer needs torch (pip install torch)")

import kvcore  # noqa: E402
from kvcore.torch import layer as torch_layer  # noqa: E402
from kvcore.state import RecordInfo  # noqa: E402
from kvcore.torch.pool import TorchKVPool  # noqa: E402
from kvcore.torch.step_layout import read_positions  # noqa: E402

H, D, DV = 2, 4, 3


def make(
    *policies: kvcore.LayerPolicy,
    capacity: int = 64,
    max_step: int = 4,
    initial: int = 512,
    mirror: bool = False,
    order: str = "positions",
) -> TorchKVPool:
    cfg = kvcore.CacheConfig(
        capacity,
        [kvcore.LayerConfig(p, n_kv_heads=H, head_dim=D, v_head_dim=DV) for p in policies],
        max_step=max_step,
        initial_capacity=initial,
    )
    return TorchKVPool(kvcore.SequenceCache(cfg), mirror_rings=mirror, order=order)


def kv_for(positions: range, batch: int = 1, salt: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct K/V for each (position, salt): a stale row can never pass for a fresh one."""
    p = torch.tensor(list(positions), dtype=torch.float32)
    k = (p[None, None, :, None] * 1000 + salt * 100_000 + torch.arange(D)).expand(batch, H, -1, -1)
    v = -(p[None, None, :, None] * 1000 + salt * 100_000 + torch.arange(DV)).expand(batch, H, -1, -1)
    return k.contiguous(), v.contiguous()


def run_step(
    pool: TorchKVPool, T: int, ref: dict[int, tuple[torch.Tensor, torch.Tensor]], salt: int = 0, by_step: bool = True
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One step through every layer, checked against the reference; returns what each layer returned.

    ``by_step``: pass the Step (the pool lays it out once per policy) or each layer's plan.
    """
    cache = pool.cache
    out = []
    with cache.step(T) as step:
        k, v = kv_for(range(step.position, step.end), salt=salt)
        for j in range(T):
            ref[step.position + j] = (k[:, :, j], v[:, :, j])
        for layer in range(cache.n_layers):
            plan = step.plan(layer)
            keys, values = pool.update(layer, step if by_step else plan, k, v)
            out.append((keys, values))
            if pool.order == "rows":
                check_row_order(pool, step, layer, keys, values, ref)
                continue
            positions = read_positions(plan)
            assert keys.shape == (1, H, len(positions), D) and values.shape == (1, H, len(positions), DV)
            want_k = torch.stack([ref[p][0] for p in positions], dim=2)
            want_v = torch.stack([ref[p][1] for p in positions], dim=2)
            assert torch.equal(keys, want_k), (layer, positions)
            assert torch.equal(values, want_v), (layer, positions)
    return out


def check_row_order(
    pool: TorchKVPool,
    step: kvcore.Step,
    layer: int,
    keys: torch.Tensor,
    values: torch.Tensor,
    ref: dict[int, tuple[torch.Tensor, torch.Tensor]],
) -> None:
    """Row order: one view of the held rows (never more than rows(layer)); the rows
    whose positions a query of the step sees hold exactly those positions, one row
    each, and cover every needed position; the mask is the visibility rule on them."""
    cache = pool.cache
    geometry = cache.geometry(layer)
    n = geometry.held_rows(step.end)
    assert keys.shape == (1, H, n, D) and values.shape == (1, H, n, DV)
    assert n <= cache.rows(layer)
    storage = pool.layer(layer)
    assert storage is not None and keys.data_ptr() == storage.keys.data_ptr()  # a view, not a copy
    positions = pool.plan_step(step)[pool.group_of[layer]].key_positions()
    assert positions == [geometry.position_at(r, step.end) for r in range(n)]
    mask = step.mask(layer)
    assert mask.shape == (step.T, n)
    seen = []
    for r, p in enumerate(positions):
        visible = [cache.visible(layer, q, p) for q in range(step.position, step.end)]
        assert mask[:, r].tolist() == visible
        if any(visible):
            seen.append(p)
            assert torch.equal(keys[:, :, r], ref[p][0]) and torch.equal(values[:, :, r], ref[p][1]), (layer, r, p)
    assert sorted(seen) == read_positions(step.plan(layer))


@pytest.mark.parametrize("sinks", [0, 2])
def test_row_order_random_steps_and_rewinds_return_exact_history(sinks: int) -> None:
    rng = random.Random(11 + sinks)
    pool = make(kvcore.Ring(window=5, sinks=sinks), kvcore.Flat(), capacity=200, max_step=4, initial=8, order="rows")
    assert pool.order == "rows"
    cache = pool.cache
    ref: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    salt = 0
    while cache.length < 150:
        run_step(pool, rng.randint(1, 4), ref, salt, by_step=rng.random() < 0.7)
        if rng.random() < 0.25:
            back = cache.length - rng.randint(1, 4)
            if cache.can_rewind(back):
                cache.rewind(back)  # the rewound rows stay in the pool, stale: the mask must hide them
                salt += 1


def test_row_order_keeps_no_mirror_even_when_asked() -> None:
    # Row-order reads are one view of the held rows: a mirror would cost R - 1 rows and a second write for nothing.
    asked = make(kvcore.Ring(window=5), kvcore.Flat(), capacity=64, max_step=4, initial=8, mirror=True, order="rows")
    compact = make(kvcore.Ring(window=5), kvcore.Flat(), capacity=64, max_step=4, initial=8, order="rows")
    assert not asked.mirror_rings and asked.mirror_rows(0) == 0
    refs: tuple[dict[int, tuple[torch.Tensor, torch.Tensor]], ...] = ({}, {})
    while asked.cache.length < 40:  # past the ring's 8 rows: wrapped windows, checked against the reference
        run_step(asked, 1, refs[0])
        run_step(compact, 1, refs[1])
    step = asked.cache.begin_step(1)
    assert all(row < asked.cache.rows(0) for row, _, _ in asked.plan_step(step)[0].writes)
    assert len(asked.plan_step(step)[0].index) == 1  # one destination row: no mirrored copy
    assert asked.layer(0).keys.shape[2] == asked.cache.rows(0) == 5 + 4 - 1  # type: ignore[union-attr]
    assert asked.nbytes() == compact.nbytes() and asked.nbytes(0) == (5 + 4 - 1) * H * (D + DV) * 4
    mirrored = make(kvcore.Ring(window=5), capacity=64, max_step=4, mirror=True)  # order "positions": kept
    assert mirrored.mirror_rings and mirrored.mirror_rows(0) == 5 + 4 - 2


def test_the_default_order_is_rows_and_a_bad_order_is_refused() -> None:
    cache = kvcore.SequenceCache(kvcore.CacheConfig(16, [kvcore.LayerConfig(kvcore.Flat(), 1, 2)]))
    assert TorchKVPool(cache).order == "rows"
    with pytest.raises(kvcore.InvalidArgumentError, match="order = 'sideways': must be 'rows'"):
        TorchKVPool(cache, order="sideways")


@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
@pytest.mark.parametrize("mirror", [False, True], ids=["compact", "mirrored"])
@pytest.mark.parametrize("sinks", [0, 2])
def test_random_steps_and_rewinds_return_exact_history(
    sinks: int, mirror: bool, native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Both write paths: CPU pools copy through _copy_rows, other devices through torch ops.
    monkeypatch.setattr(torch_layer, "NATIVE_WRITES", native)
    rng = random.Random(7 + sinks)
    pool = make(kvcore.Ring(window=5, sinks=sinks), kvcore.Flat(), capacity=200, max_step=4, initial=8, mirror=mirror)
    cache = pool.cache
    ref: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    salt = 0
    while cache.length < 150:
        run_step(pool, rng.randint(1, 4), ref, salt, by_step=rng.random() < 0.7)
        if rng.random() < 0.2:
            n = cache.length - rng.randint(1, 4)
            if cache.can_rewind(n):
                cache.rewind(n)
                salt += 1  # the rewound positions are rewritten with new values
                for p in [p for p in ref if p >= n]:
                    del ref[p]
    # Sinks stay where they were written; the ring never grows past kvcore's rows (plus the mirror,
    # which only a ring without sinks has: with sinks the read is two spans, gathered anyway).
    rows = sinks + 5 + 4 - 1
    assert pool.layer(0).allocated_rows == cache.rows(0) == rows  # type: ignore[union-attr]
    assert pool.mirror_rows(0) == (5 + 4 - 2 if mirror and sinks == 0 else 0) and pool.mirror_rows(1) == 0
    assert pool.layer(0).keys.shape[2] == rows + pool.mirror_rows(0)  # type: ignore[union-attr]


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


def test_growing_past_the_layers_rows_is_refused_not_written() -> None:
    # The native write checks nothing: a plan writing past kvcore's rows (none does) must stop at
    # the growth, which would otherwise hand it tensors too small for the write.
    pool = make(kvcore.Flat(), capacity=16, max_step=4, initial=4)
    run_step(pool, 4, {})
    layer = pool.layer(0)
    assert layer is not None and layer.allocated_rows == 4
    with pytest.raises(kvcore.InternalError, match="writes row 16, past the layer's 16 rows"):
        TorchKVPool._grow(layer, 17)
    assert layer.allocated_rows == 4


@pytest.mark.parametrize("mirror", [False, True], ids=["compact", "mirrored"])
def test_no_allocation_after_warm_up(mirror: bool) -> None:
    pool = make(kvcore.Ring(window=6), kvcore.Ring(window=6, sinks=1), capacity=64, max_step=3, mirror=mirror)
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


def test_check_input_refuses_bad_tensors_and_allocates_nothing() -> None:
    pool = make(kvcore.Ring(window=4), kvcore.Flat(), capacity=32)
    k, v = kv_for(range(3))
    assert pool.check_input(1, k, v, position=0) == 3  # T defaults to what key carries
    with pytest.raises(kvcore.InvalidArgumentError, match=r"layer 1: key \(1, 2, 3, 4\).*want \(1, 2, 2, 4\)"):
        pool.check_input(1, k, v, position=0, T=2)
    with pytest.raises(kvcore.InvalidArgumentError, match="layer 0: key/value must be 4-D"):
        pool.check_input(0, k[0], v[0], position=0)
    assert pool.layer(0) is None and pool.layer(1) is None  # nothing allocated by checking
    run_step(pool, 3, {})
    with pytest.raises(kvcore.InvalidArgumentError, match="different batch, dtype or device can only start at positi"):
        pool.check_input(0, k.double(), v.double(), position=3)
    assert pool.check_input(0, k.double(), v.double(), position=0) == 3  # a new sequence may change dtype
    assert pool.layer(0).dtype == torch.float32  # type: ignore[union-attr]


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


# --- mirrored rings ---------------------------------------------------------------------


def shares_storage(t: torch.Tensor, pool_tensor: torch.Tensor) -> bool:
    return t.untyped_storage().data_ptr() == pool_tensor.untyped_storage().data_ptr()


@pytest.mark.parametrize("T_max", [1, 4])
def test_mirrored_windows_without_sinks_are_views_even_when_they_wrap(T_max: int) -> None:
    rng = random.Random(T_max)
    pool = make(kvcore.Ring(window=5), kvcore.Flat(), capacity=120, max_step=4, mirror=True)
    cache = pool.cache
    ref: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    wrapped = 0
    salt = 0
    while cache.length < 110:
        T = rng.randint(1, T_max)
        wrapped += len(cache.begin_step(T).plan(0).read) == 2  # the plan's read crosses the ring's end
        for layer, (keys, values) in enumerate(run_step(pool, T, ref, salt)):
            lp = pool.layer(layer)
            assert lp is not None
            assert shares_storage(keys, lp.keys) and shares_storage(values, lp.values), (layer, cache.length)
        if rng.random() < 0.2 and cache.can_rewind(cache.length - T_max):
            cache.rewind(cache.length - T_max)  # a rewind after the wrap, then rewritten with new values
            salt += 1
            for p in [p for p in ref if p >= cache.length]:
                del ref[p]
    assert wrapped > 10  # the mirror was what made those reads views
    assert pool.workspace_nbytes == 0  # nothing was ever gathered


def test_compact_rings_gather_what_mirrored_rings_return_as_views() -> None:
    compact = make(kvcore.Ring(window=5), capacity=40, max_step=2)
    mirrored = make(kvcore.Ring(window=5), capacity=40, max_step=2, mirror=True)
    refs: tuple[dict[int, tuple[torch.Tensor, torch.Tensor]], ...] = ({}, {})
    while compact.cache.length < 30:
        run_step(compact, 1, refs[0])
        run_step(mirrored, 1, refs[1])
    assert compact.workspace_nbytes > 0 and mirrored.workspace_nbytes == 0


def test_mirror_rows_repeat_the_first_ring_rows_after_every_step() -> None:
    window, max_step = 4, 3
    pool = make(kvcore.Ring(window=window), capacity=80, max_step=max_step, mirror=True)
    layer = pool.allocate(0, batch_size=1, dtype=torch.float32, device="cpu")
    layer.keys.zero_()
    layer.values.zero_()
    rows, mirror = pool.cache.rows(0), pool.mirror_rows(0)
    assert (rows, mirror) == (window + max_step - 1, window + max_step - 2)
    rng = random.Random(3)
    ref: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    while pool.cache.length < 70:
        run_step(pool, rng.randint(1, max_step), ref)
        for t in (layer.keys, layer.values):
            assert torch.equal(t[:, :, rows : rows + mirror], t[:, :, :mirror])


def test_mirrored_sinks_and_window_are_gathered_from_two_spans() -> None:
    pool = make(kvcore.Ring(window=4, sinks=2), capacity=60, max_step=2, mirror=True)
    ref: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    while pool.cache.length < 40:
        run_step(pool, 1, ref)  # checks the bytes and the order of sinks + window
    step = pool.cache.begin_step(1)
    layout = pool.plan_step(step)[0]
    assert layout.view is None and len(layout.gather) == 2 and layout.gather[0] == (0, 2)
    assert layout.positions == ((0, 2), (37, 41))  # sinks [0, 2) and the window of query 40
    assert pool.workspace_nbytes > 0


def test_a_ring_that_never_wraps_has_no_mirror() -> None:
    # rows = min(capacity, W + C - 1) = capacity: row(p) = p, nothing to repeat.
    pool = make(kvcore.Ring(window=8), capacity=10, max_step=4, mirror=True)
    ref: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    run_step(pool, 4, ref)
    assert pool.mirror_rows(0) == 0 and pool.layer(0).keys.shape[2] == 10  # type: ignore[union-attr]


def test_mirrored_memory_is_rows_plus_mirror() -> None:
    pool = make(kvcore.Ring(window=6), kvcore.Flat(), capacity=64, max_step=3, initial=16, mirror=True)
    for layer in range(2):
        pool.allocate(layer, batch_size=2, dtype=torch.float16, device="cpu")
    ring_rows = 6 + 3 - 1
    assert pool.nbytes(0) == 2 * H * (ring_rows + ring_rows - 1) * (D + DV) * 2
    assert pool.nbytes(1) == 2 * H * 16 * (D + DV) * 2
    assert pool.layer(0).allocated_rows == ring_rows  # type: ignore[union-attr]


def test_a_ring_with_sinks_gets_no_mirror_and_its_reads_stay_exact() -> None:
    # Its read is sinks + window, two spans gathered anyway: a mirror would cost R - 1 rows for nothing.
    pool = make(kvcore.Ring(window=4, sinks=2), kvcore.Ring(window=4), capacity=60, max_step=3, mirror=True)
    ref: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    rng = random.Random(5)
    while pool.cache.length < 50:
        run_step(pool, rng.randint(1, 3), ref)  # checks every returned row against the reference
    assert pool.mirror_rows(0) == 0 and pool.mirror_rows(1) == 4 + 3 - 2
    assert pool.layer(0).keys.shape[2] == pool.cache.rows(0) == 2 + 4 + 3 - 1  # type: ignore[union-attr]
    assert pool.nbytes(0) == pool.cache.rows(0) * H * (D + DV) * 4


def test_a_stale_step_is_refused_and_writes_nothing() -> None:
    pool = make(kvcore.Ring(window=4), capacity=16, mirror=True)
    ref: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    run_step(pool, 2, ref)
    stale = pool.cache.begin_step(1)
    pool.cache.rewind(2)  # ends the begun step
    before = pool.layer(0).keys.clone()  # type: ignore[union-attr]
    k, v = kv_for(range(2, 3), salt=9)
    with pytest.raises(kvcore.InvalidStateError):
        pool.update(0, stale, k, v)
    # Bit-level: rows never written hold whatever torch.empty left (NaN != NaN).
    assert torch.equal(pool.layer(0).keys.view(torch.int32), before.view(torch.int32))  # type: ignore[union-attr]


@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
def test_strided_inputs_are_written_exactly(native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # What attention hands a cache is often a view (heads transposed, a dim reversed in memory):
    # the native copy follows every stride, the last dim's too.
    monkeypatch.setattr(torch_layer, "NATIVE_WRITES", native)
    pool = make(kvcore.Ring(window=3), kvcore.Flat(), capacity=40, max_step=2, initial=4, mirror=True)
    cache = pool.cache
    while cache.length < 30:
        T = 1 + cache.length % 2
        k, v = kv_for(range(cache.length, cache.length + T))
        k_strided = k.transpose(1, 3).contiguous().transpose(1, 3)  # strides (.., 1, T*D..): D not innermost
        v_strided = v.permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3)
        assert k_strided.stride(3) != 1 and (T == 1 or not v_strided.is_contiguous())
        with cache.step(T) as step:
            for layer in range(2):
                keys, values = pool.update(layer, step, k_strided, v_strided)
                want = read_positions(step.plan(layer))
                ref_k, ref_v = kv_for(range(want[0], want[-1] + 1))
                assert torch.equal(keys, ref_k[:, :, [p - want[0] for p in want]])
                assert torch.equal(values, ref_v[:, :, [p - want[0] for p in want]])


# --- what KVPool checks, TorchKVPool checks (issue 33): nothing written on a refusal --------------


def _snapshot(pool: TorchKVPool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(lp.keys.clone(), lp.values.clone()) for lp in (pool.layer(i) for i in range(pool.cache.n_layers)) if lp]


def _unchanged(pool: TorchKVPool, before: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
    """Bit for bit (rows never written hold whatever torch.empty gave, NaN included)."""
    after = _snapshot(pool)
    same = [torch.equal(x.view(torch.int32), y.view(torch.int32)) for a, b in zip(after, before) for x, y in zip(a, b)]
    return len(after) == len(before) and all(same)


def _pool_with_history(by_step: bool = True) -> TorchKVPool:
    pool = make(kvcore.Flat(), kvcore.Ring(window=4), order="positions")
    ref: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    run_step(pool, 4, ref, by_step=by_step)
    run_step(pool, 2, ref, by_step=by_step)
    return pool


def test_a_stale_plan_of_an_earlier_step_is_refused_and_writes_nothing() -> None:
    pool = _pool_with_history()
    cache = pool.cache
    with cache.step(2) as old:
        stale = old.plan(0)
        k, v = kv_for(range(old.position, old.end))
        for layer in range(cache.n_layers):
            pool.update(layer, old, k, v)
    step = cache.begin_step(2)
    before = _snapshot(pool)
    with pytest.raises(kvcore.InvalidStateError, match="plan is not layer 0's plan of the begun step"):
        pool.update(0, stale, k, v)
    assert _unchanged(pool, before)
    step.abort()
    with pytest.raises(kvcore.InvalidStateError, match="no step is begun \\(stale plan\\)"):
        pool.update(0, stale, k, v)
    assert _unchanged(pool, before)


def test_another_caches_step_is_refused_by_name_and_writes_nothing() -> None:
    pool = _pool_with_history()
    other = make(kvcore.Flat(), kvcore.Ring(window=4), order="positions")
    theirs = other.cache.begin_step(2)  # position 0: it would overwrite the pool's committed rows 0-1
    mine = pool.cache.begin_step(2)
    k, v = kv_for(range(0, 2), salt=9)
    before = _snapshot(pool)
    with pytest.raises(kvcore.InvalidStateError, match="belongs to another cache"):
        pool.update(0, theirs, k, v)
    with pytest.raises(kvcore.InvalidStateError, match="plan is not layer 0's plan"):
        pool.update(0, theirs.plan(0), k, v)  # another cache's plan
    assert _unchanged(pool, before)
    mine.abort()


def test_a_stale_step_and_its_layouts_are_refused_and_write_nothing() -> None:
    pool = _pool_with_history()
    cache = pool.cache
    old = cache.begin_step(1)
    layouts = pool.plan_step(old)
    k, v = kv_for(range(old.position, old.end))
    old.abort()
    cache.begin_step(1)
    before = _snapshot(pool)
    with pytest.raises(kvcore.InvalidStateError, match="is stale"):
        pool.update(0, old, k, v)
    with pytest.raises(kvcore.InvalidStateError, match="is stale"):
        pool.write_read(0, layouts[pool.group_of[0]], k, v)
    other = make(kvcore.Flat(), kvcore.Ring(window=4), order="positions")
    foreign = other.plan_step(other.cache.begin_step(1))
    with pytest.raises(kvcore.InvalidArgumentError, match="not this pool's layout"):
        pool.write_read(0, foreign[other.group_of[0]], k, v)
    assert _unchanged(pool, before)


@pytest.mark.parametrize("native", [True, False])
def test_tensors_that_require_grad_are_taken_detached(monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    monkeypatch.setattr(torch_layer, "NATIVE_WRITES", native)
    pool = make(kvcore.Ring(window=2), max_step=2, mirror=False, order="positions")  # wraps: read gathered
    cache = pool.cache
    for _ in range(6):
        with cache.step(1) as step:
            k, v = kv_for(range(step.position, step.end))
            keys, values = pool.update(0, step, k.requires_grad_(), v.requires_grad_())
            assert not keys.requires_grad and not values.requires_grad
            assert torch.equal(keys[:, :, -1:], k.detach()) and torch.equal(values[:, :, -1:], v.detach())
    lp = pool.layer(0)
    assert lp is not None and not lp.keys.requires_grad and not lp.values.requires_grad
    record = pool.export_sequence()  # raised "Can't call numpy() on Tensor that requires grad"
    assert RecordInfo.of(record).length == 6


def test_a_tree_step_of_tensors_that_require_grad_leaves_the_pool_without_grad() -> None:
    pool = make(kvcore.Flat(), order="positions")
    cache = pool.cache
    ref: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    run_step(pool, 2, ref)
    step = cache.begin_tree([-1, 0, 0])
    k, v = kv_for(range(3))
    pool.update(0, step, k.requires_grad_(), v.requires_grad_())
    copies = cache.commit(step, accepted=[0, 2])
    pool.apply_copies(copies)
    lp = pool.layer(0)
    assert lp is not None and not lp.keys.requires_grad
    pool.export_sequence()


def test_write_read_refuses_a_layer_outside_the_pool_and_writes_nothing() -> None:
    pool = _pool_with_history()
    step = pool.cache.begin_step(1)
    layouts = pool.plan_step(step)
    k, v = kv_for(range(step.position, step.end))
    before = _snapshot(pool)
    for layer in (-1, pool.cache.n_layers):  # -1 wrote the last layer
        with pytest.raises(kvcore.InvalidArgumentError, match=f"layer = {layer}: must be in"):
            pool.write_read(layer, layouts[0], k, v)
    assert _unchanged(pool, before)


def test_a_corrupt_record_is_refused_before_any_tensor_is_sized_from_it() -> None:
    pool = _pool_with_history()
    record = bytearray(pool.export_sequence())
    record[len(record) // 2] ^= 1  # the checksum no longer holds; the header still reads
    fresh = make(kvcore.Flat(), kvcore.Ring(window=4))
    before = _snapshot(fresh)
    with pytest.raises(kvcore.InvalidArgumentError, match="corrupt"):
        fresh.import_sequence(bytes(record))
    assert _unchanged(fresh, before) and fresh.cache.length == 0
