"""TorchPagedKVPool (torch storage of a BatchCache) against kvcore's own PagedKVPool, on a forked sequence.

Both apply the same plans: the block copies a fork's shared, partly filled block needs
(copy_blocks), then each layer's writes at the step's slots and its live rows. Every row a
query of the step may see must hold the same K/V in both.
"""

from __future__ import annotations

import numpy as np
import pytest
from needs import need

torch = need("torch", reason="TorchPagedKVPool needs torch")

import kvcore  # noqa: E402
from kvcore.torch.paged import TorchPagedKVPool  # noqa: E402

H, D, DV, B = 2, 8, 4, 4
POLICIES = [kvcore.Flat(), kvcore.Ring(window=4), kvcore.Flat(), kvcore.Ring(window=4)]  # two layers per group


def make_cache() -> kvcore.BatchCache:
    layers = [kvcore.LayerConfig(p, n_kv_heads=H, head_dim=D, v_head_dim=DV) for p in POLICIES]
    limits = kvcore.BatchLimits(block_size=B, max_seqs=4, num_blocks=16)
    return kvcore.BatchCache(kvcore.CacheConfig(32, layers, max_step=8, batch=limits))


def run_step(
    cache: kvcore.BatchCache,
    store: TorchPagedKVPool,
    paged: kvcore.PagedKVPool,
    entries: list[tuple[int, int]],
    rng: np.random.Generator,
) -> list[int]:
    """One step through every layer of both stores, checked row by row; returns the blocks copied per group."""
    copied = []
    with cache.step(entries) as step:
        plan = step.plan()
        for g, group in enumerate(plan.groups):
            store.copy_blocks(g, group.copies)
            copied.append(len(group.copies))
            for src, dst in group.copies:  # each copy repeats its source block in every layer of the group
                for layer in range(cache.n_layers):
                    if cache.group_of(layer) == g and store.allocated_rows(layer):
                        keys, _ = store.ensure(layer, 0)  # the layer's tensors as they are
                        assert torch.equal(keys[:, :, dst * B : (dst + 1) * B], keys[:, :, src * B : (src + 1) * B])
        n = plan.n_tokens
        for layer in range(cache.n_layers):
            g = cache.group_of(layer)
            k = rng.standard_normal((n, H, D)).astype(np.float32)
            v = rng.standard_normal((n, H, DV)).astype(np.float32)
            mask = plan.mask(g)
            slots = torch.from_numpy(plan.groups[g].slots.astype(np.int64))
            keys, values = store.write_read(
                layer, slots, torch.from_numpy(k).permute(1, 0, 2)[None], torch.from_numpy(v).permute(1, 0, 2)[None],
                mask.shape[1],
            )  # fmt: skip
            want_k, want_v = paged.update(layer, step, k, v)
            assert keys.shape == (1, H, mask.shape[1], D) and values.shape == (1, H, mask.shape[1], DV)
            assert want_k.shape[0] == mask.shape[1]
            seen = np.flatnonzero(mask.any(axis=0))
            assert len(seen) > 0
            for r in seen:  # rows a query sees: the same K/V in both stores
                assert np.array_equal(keys[0, :, r].numpy(), want_k[r]), (layer, r)
                assert np.array_equal(values[0, :, r].numpy(), want_v[r]), (layer, r)
    return copied


@pytest.mark.parametrize("preallocate", [False, True])
def test_a_forked_sequence_reads_what_paged_kv_pool_reads(preallocate: bool) -> None:
    rng = np.random.default_rng(5)
    cache = make_cache()
    store = TorchPagedKVPool(cache, preallocate=preallocate)
    paged = kvcore.PagedKVPool(cache, np.float32)
    cache.add_sequence(0)
    assert run_step(cache, store, paged, [(0, 6)], rng) == [0, 0]  # prefill: blocks 0 and 1 (half full)
    cache.fork(0, 1)  # sequence 1 shares both blocks, block 1 partly filled
    assert run_step(cache, store, paged, [(1, 2)], rng) == [1, 1]  # the fork writes into the shared block: a copy
    assert run_step(cache, store, paged, [(0, 1)], rng) == [0, 0]  # sequence 0 holds block 1 alone again
    for _ in range(6):  # decode both, the ring group sliding past its window
        run_step(cache, store, paged, [(0, 1), (1, 1)], rng)
    assert cache.length(0) == 13 and cache.length(1) == 14


def test_copy_blocks_copies_in_every_storage_of_the_group_once() -> None:
    cache = make_cache()
    store = TorchPagedKVPool(cache, preallocate=True)
    # Group g's j-th layer shares the j-th storage: layers 0 (flat) and 1 (ring), 2 and 3.
    assert store.store_of == [0, 0, 2, 2]
    for layer in (0, 2):
        keys, values = store.ensure(layer, 2 * B)
        keys[:, :, :B] = layer + 1.0
        values[:, :, :B] = -(layer + 1.0)
    store.copy_blocks(0, np.array([[0, 3]], dtype=np.int32))  # group 0: the flat layers 0 and 2
    for layer in range(cache.n_layers):
        keys, values = store.ensure(layer, 0)  # the layer's tensors as they are
        owner = store.store_of[layer]
        assert bool((keys[:, :, 3 * B : 4 * B] == owner + 1.0).all())
        assert bool((values[:, :, 3 * B : 4 * B] == -(owner + 1.0)).all())
    # Once per storage: a second copy over the first reads the rows the first wrote, not twice.
    store.copy_blocks(0, np.array([[3, 1]], dtype=np.int32))
    assert bool((store.ensure(0, 0)[0][:, :, B : 2 * B] == 1.0).all())
    store.copy_blocks(1, np.zeros((0, 2), dtype=np.int32))  # no copies: nothing to do


def test_copy_blocks_grows_a_lazily_allocated_layer_to_the_destination() -> None:
    cache = make_cache()
    store = TorchPagedKVPool(cache)
    assert store.allocated_rows(0) == 0
    store.ensure(0, B)  # layer 0 allocated with one block; layer 2 of the same group not yet
    store.copy_blocks(0, np.array([[0, 5]], dtype=np.int32))
    assert store.allocated_rows(0) >= 6 * B and store.allocated_rows(2) == 0


# --- what PagedKVPool checks, TorchPagedKVPool checks (issue 33): nothing written on a refusal ---------


def _one_token_step(store: TorchPagedKVPool) -> tuple[torch.Tensor, int]:
    cache = store.cache
    cache.add_sequence(0)
    step = cache.begin_step([(0, 1)])
    plan = step.plan()
    return torch.from_numpy(plan.groups[0].slots.astype(np.int64)), int(plan.mask(0).shape[1])


def test_write_read_refuses_slots_outside_the_live_rows_before_writing() -> None:
    store = TorchPagedKVPool(make_cache(), preallocate=True)
    slots, rows = _one_token_step(store)
    k, v = torch.ones((1, H, 1, D)), torch.ones((1, H, 1, DV))
    before = store.tensors(0)[0].clone()  # type: ignore[index]
    for bad in (torch.tensor([rows]), torch.tensor([-1]), torch.tensor([store.max_rows[0] - 1])):
        with pytest.raises(kvcore.InvalidArgumentError, match="slots reach rows"):
            store.write_read(0, bad, k, v, rows)
    with pytest.raises(kvcore.InvalidArgumentError, match="slots must be a 1-D int64 tensor"):
        store.write_read(0, slots.to(torch.int32), k, v, rows)
    with pytest.raises(kvcore.InvalidArgumentError, match="rows = "):
        store.write_read(0, slots, k, v, store.max_rows[0] + 1)
    assert torch.equal(store.tensors(0)[0], before)  # type: ignore[index]


def test_write_read_takes_tensors_that_require_grad_detached() -> None:
    store = TorchPagedKVPool(make_cache())
    slots, rows = _one_token_step(store)
    k = torch.ones((1, H, 1, D), requires_grad=True)
    v = torch.ones((1, H, 1, DV), requires_grad=True)
    keys, values = store.write_read(0, slots, k, v, rows)
    assert not keys.requires_grad and not values.requires_grad
    tensors = store.tensors(0)
    assert tensors is not None and not tensors[0].requires_grad and not tensors[1].requires_grad


def test_write_read_checks_slots_against_the_pool_and_devices_before_writing() -> None:
    store = TorchPagedKVPool(make_cache(), preallocate=True)
    _one_token_step(store)
    layer = 1
    rows = store.max_rows[store.group_of[layer]]  # the one pool's rows, the same for every group
    assert store.max_rows == [rows] * len(store.max_rows)
    k, v = torch.ones((1, H, 1, D)), torch.ones((1, H, 1, DV))
    store.write_read(layer, torch.tensor([rows - 1]), k, v, rows)  # the pool's last row
    before = store.tensors(layer)[0].clone()  # type: ignore[index]
    with pytest.raises(kvcore.InvalidArgumentError, match="rows = .*the group's pool"):
        store.write_read(layer, torch.tensor([0]), k, v, rows + 1)
    with pytest.raises(kvcore.InvalidArgumentError, match="slots must be a 1-D int64 tensor, got list"):
        store.write_read(layer, [0], k, v, 1)  # type: ignore[arg-type]
    with pytest.raises(kvcore.InvalidArgumentError, match="value on meta: the store is on cpu"):
        store.write_read(layer, torch.tensor([0]), k, v.to("meta"), 1)
    assert torch.equal(store.tensors(layer)[0], before)  # type: ignore[index]


def test_a_corrupt_record_grows_no_tensor_of_a_lazy_store() -> None:
    # The import sized every layer from the record's length before the record was checked.
    source = make_cache()
    store = TorchPagedKVPool(source)
    paged = kvcore.PagedKVPool(source, np.float32)
    source.add_sequence(0)
    run_step(source, store, paged, [(0, 8)], np.random.default_rng(0))
    record = bytearray(store.export_sequence(0))
    record[len(record) // 2] ^= 1  # the checksum no longer holds; the header still reads
    lazy = TorchPagedKVPool(make_cache())
    before = [None if lazy.tensors(layer) is None else lazy.tensors(layer)[0].shape for layer in range(4)]  # type: ignore[index]
    with pytest.raises(kvcore.InvalidArgumentError, match="corrupt"):
        lazy.import_sequence(0, bytes(record))
    assert [None if lazy.tensors(layer) is None else lazy.tensors(layer)[0].shape for layer in range(4)] == before  # type: ignore[index]
    assert not lazy.cache.sequence(0).active


@pytest.mark.parametrize("kind", ["Shared", "State"])
def test_shared_and_state_layers_are_stored_and_refuse_writes_by_name(kind: str) -> None:
    # test_paged_pool_kinds.py checks what both paged pools store for them.
    flat = kvcore.LayerConfig(kvcore.Flat(), n_kv_heads=1, head_dim=4)
    other = (
        kvcore.LayerConfig(kvcore.Shared(0), n_kv_heads=1, head_dim=4)
        if kind == "Shared"
        else kvcore.LayerConfig(kvcore.State(4), n_kv_heads=0, head_dim=0)
    )
    cfg = kvcore.CacheConfig(64, [flat, other], max_step=4, batch=kvcore.BatchLimits(block_size=4, max_seqs=2))
    cache = kvcore.BatchCache(cfg)
    store = TorchPagedKVPool(cache, preallocate=True)
    assert store.nbytes(1) == 0  # a Shared layer stores nothing; a State layer nothing before its first write
    slots = torch.zeros(1, dtype=torch.int64)
    k = torch.zeros(1, 1, 1, 4)
    message = (
        r"write_read: layer 1 is Shared\(0\): it writes nothing; write layer 0, then read this one"
        if kind == "Shared"
        else "write_read of layer 1: a State layer holds state slots, not K/V rows"
    )
    with pytest.raises(kvcore.InvalidArgumentError, match=message):
        store.write_read(1, slots, k, k, 4)
    if kind == "Shared":
        shared, source = store.tensors(1), store.tensors(0)
        assert shared is not None and source is not None and all(a is b for a, b in zip(shared, source))
        kvcore.PagedKVPool(cache, "float32")  # the numpy pool stores it too
    else:
        with pytest.raises(kvcore.InvalidArgumentError, match="layer 1 is a State layer and has no state tensors"):
            kvcore.PagedKVPool(cache, "float32")
