"""TorchPagedKVPool keeps the one budget's storage (docs/batch.md section 5, "One budget"):
group g's j-th layer lives in the same tensors as every other group's j-th, and reads give
back exactly what each group wrote, as kvcore's own PagedKVPool does."""

from __future__ import annotations

import numpy as np

import kvcore
from needs import need

torch = need("torch", reason="TorchPagedKVPool needs torch")

from kvcore.torch.paged import TorchPagedKVPool  # noqa: E402


def gemma_like(page_layers: int = 0) -> kvcore.BatchCache:
    """Five sliding layers and a full one, twice (Gemma 3's order): groups of two by default."""
    layers = [kvcore.LayerConfig(kvcore.Flat() if i % 6 == 5 else kvcore.Ring(8), 2, 4) for i in range(12)]
    limits = kvcore.BatchLimits(block_size=4, max_seqs=4, num_blocks=96, page_layers=page_layers)
    return kvcore.BatchCache(kvcore.CacheConfig(64, layers, max_step=4, batch=limits))


def test_layers_of_other_groups_share_tensors_and_read_back_their_own_rows() -> None:
    cache = gemma_like()
    assert cache.n_groups == 6
    pool = TorchPagedKVPool(cache, dtype=torch.float32)
    owners = {cache.storage_layer(layer) for layer in range(cache.n_layers)}
    assert owners == {0, 1}  # the largest group has two layers: two storages
    rng = np.random.default_rng(3)
    written: dict[tuple[int, int], torch.Tensor] = {}  # (layer, position) -> the K row written there
    cache.add_sequence(0)
    cache.add_sequence(1)
    for _ in range(6):
        step = cache.begin_step([(0, 4), (1, 4)])
        plan = step.plan()
        positions = [cache.length(0) + j for j in range(4)] + [cache.length(1) + j for j in range(4)]
        for layer in range(cache.n_layers):
            g = cache.group_of(layer)
            pool.copy_blocks(g, np.asarray(plan.groups[g].copies))
            k = torch.from_numpy(rng.standard_normal((1, 2, 8, 4)).astype(np.float32))
            slots = torch.from_numpy(plan.groups[g].slots.astype(np.int64))
            pool.write_read(layer, slots, k, k.clone(), cache.used_blocks(g) * 4)
            for t, p in enumerate(positions):
                written[(layer, (t // 4) * 1000 + p)] = k[0, :, t].clone()
        step.commit()
    # Every visible row of every layer holds what that layer wrote, though the storages are shared.
    for layer in range(cache.n_layers):
        g = cache.group_of(layer)
        keys, _ = pool.tensors(layer) or (None, None)
        assert keys is not None
        for seq in (0, 1):
            table = cache.block_table(seq, g)
            for p in range(cache.length(seq)):
                if not cache.visible(g, seq, cache.length(seq), p) or table[p // 4] < 0:
                    continue
                row = int(table[p // 4]) * 4 + p % 4
                assert torch.equal(keys[0, :, row], written[(layer, seq * 1000 + p)]), (layer, seq, p)
    # Two storages of the pool's blocks, not one per layer.
    per_row = 2 * 4 * 4 * 2  # heads x dims x float32, K and V
    assert pool.nbytes() == 2 * per_row * pool.allocated_rows(0)
