"""The verbs renamed so that one action has one name (issue 41, docs/deprecations.md) keep their
old names until the release each row names: each old name is called here, warns
DeprecationWarning with the repo's message ("OLD is deprecated: use NEW (removed in kvcore
0.2.0)"), and gives what the new name gives (the same value, the same bytes, the same refusal).

pytest runs with warnings as errors, so each call expects its warning.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kvcore
from needs import need

REMOVED_IN = "kvcore 0.2.0"

# Old name -> new name, as the warning and docs/deprecations.md name them.
RENAMED = {
    "SequenceCache.n_policies": "SequenceCache.n_groups",
    "SequenceCache.policy_index": "SequenceCache.group_of",
    "PagedKVPool.apply_commit": "PagedKVPool.apply_copies",
    "TorchPagedKVPool.apply_commit": "TorchPagedKVPool.apply_copies",
    "TorchPagedKVPool.state": "TorchPagedKVPool.state_slots",
    "TorchKVPool.policy_of": "TorchKVPool.group_of",
}


@contextmanager
def deprecated(old: str) -> Iterator[None]:
    """Expects exactly the warning RENAMED[old]'s row promises."""
    message = f"{old} is deprecated: use {RENAMED[old]} (removed in {REMOVED_IN})"
    with pytest.warns(DeprecationWarning, match=f"^{re.escape(message)}$"):
        yield


def mixed_cache() -> kvcore.SequenceCache:
    """Five ring layers and a flat one: two groups, layer 5 alone in the flat one."""
    ring = kvcore.LayerConfig(kvcore.Ring(4), 1, 2)
    flat = kvcore.LayerConfig(kvcore.Flat(), 1, 2)
    return kvcore.SequenceCache(kvcore.CacheConfig(32, [ring] * 5 + [flat], max_step=2))


def test_sequence_cache_group_aliases_answer_as_the_new_names() -> None:
    cache = mixed_cache()
    assert cache.n_groups == 2
    with deprecated("SequenceCache.n_policies"):
        assert cache.n_policies == cache.n_groups
    groups = [cache.group_of(layer) for layer in range(6)]
    assert groups[:5] == [groups[0]] * 5 and groups[5] != groups[0]
    for layer in range(6):
        with deprecated("SequenceCache.policy_index"):
            assert cache.policy_index(layer) == groups[layer]
    with pytest.raises(kvcore.InvalidArgumentError, match="layer = 6"):
        cache.group_of(6)
    with deprecated("SequenceCache.policy_index"), pytest.raises(kvcore.InvalidArgumentError, match="layer = 6"):
        cache.policy_index(6)


def tree_committed() -> tuple[kvcore.BatchCache, Any, tuple[Any, ...]]:
    """A BatchCache (Ring and Flat groups) whose draft tree of 5 nodes was written into a
    PagedKVPool and committed on the path 0, 2, 4: (cache, pool, the commit's copies)."""
    limits = kvcore.BatchLimits(block_size=2, max_seqs=2, num_blocks=32)
    layers = [kvcore.LayerConfig(kvcore.Ring(window=3, sinks=1), 1, 2), kvcore.LayerConfig(kvcore.Flat(), 1, 2)]
    cache = kvcore.BatchCache(kvcore.CacheConfig(32, layers, max_step=6, batch=limits))
    cache.add_sequence(0)
    cache.step([(0, 5, [0, 1, 2, 3, 4])]).commit()
    pool = kvcore.PagedKVPool(cache, np.float32)
    step = cache.begin_step([(0, 5, [9, 8, 7, 6, 5], [-1, 0, 0, 1, 2])])
    for layer in range(cache.n_layers):
        k = np.arange(10, dtype=np.float32).reshape(5, 1, 2) + 100 * layer
        pool.update(layer, step, k, k + 0.5)
    return cache, pool, cache.commit(step, accepted={0: [0, 2, 4]})


def row_bytes(cache: kvcore.BatchCache, pool: Any) -> list[bytes]:
    return [k.tobytes() + v.tobytes() for k, v in (pool.rows(layer) for layer in range(cache.n_layers))]


def test_paged_pool_apply_commit_is_apply_copies() -> None:
    cache, pool, copies = tree_committed()
    twin_cache, twin, twin_copies = tree_committed()
    before = row_bytes(cache, pool)
    assert all(len(g) for g in copies)  # the copies move rows: equal bytes below are not vacuous
    pool.apply_copies(copies)
    with deprecated("PagedKVPool.apply_commit"):
        twin.apply_commit(twin_copies)
    assert row_bytes(twin_cache, twin) == row_bytes(cache, pool) != before
    with pytest.raises(kvcore.InvalidArgumentError) as new:
        pool.apply_copies(copies[:1])
    with deprecated("PagedKVPool.apply_commit"), pytest.raises(kvcore.InvalidArgumentError) as old:
        twin.apply_commit(copies[:1])
    assert str(old.value) == str(new.value) and str(new.value).startswith("apply_copies: ")


def torch_tree_committed() -> tuple[kvcore.BatchCache, Any, tuple[Any, ...]]:
    """tree_committed's steps, written into a TorchPagedKVPool instead."""
    torch = need("torch")
    from kvcore.torch import TorchPagedKVPool

    limits = kvcore.BatchLimits(block_size=2, max_seqs=2, num_blocks=32)
    layers = [kvcore.LayerConfig(kvcore.Ring(window=3, sinks=1), 1, 2), kvcore.LayerConfig(kvcore.Flat(), 1, 2)]
    cache = kvcore.BatchCache(kvcore.CacheConfig(32, layers, max_step=6, batch=limits))
    cache.add_sequence(0)
    cache.step([(0, 5, [0, 1, 2, 3, 4])]).commit()
    store = TorchPagedKVPool(cache)
    step = cache.begin_step([(0, 5, [9, 8, 7, 6, 5], [-1, 0, 0, 1, 2])])
    plan = step.plan()
    for layer in range(cache.n_layers):
        group = cache.group_of(layer)
        slots = torch.from_numpy(plan.groups[group].slots.astype(np.int64))
        node = torch.arange(10, dtype=torch.float32).reshape(1, 1, 5, 2) + 100 * layer
        store.write_read(layer, slots, node, node + 0.5, cache.used_blocks(group) * cache.block_size)
    return cache, store, cache.commit(step, accepted={0: [0, 2, 4]})


def tensor_bytes(cache: kvcore.BatchCache, store: Any) -> list[bytes]:
    return [bytes(t.numpy().tobytes()) for layer in range(cache.n_layers) for t in store.tensors(layer)]


def test_torch_paged_pool_apply_commit_is_apply_copies() -> None:
    cache, store, copies = torch_tree_committed()
    twin_cache, twin, twin_copies = torch_tree_committed()
    before = tensor_bytes(cache, store)
    store.apply_copies(copies)
    with deprecated("TorchPagedKVPool.apply_commit"):
        twin.apply_commit(twin_copies)
    assert tensor_bytes(twin_cache, twin) == tensor_bytes(cache, store) != before
    with pytest.raises(kvcore.InvalidArgumentError) as new:
        store.apply_copies(copies[:1])
    with deprecated("TorchPagedKVPool.apply_commit"), pytest.raises(kvcore.InvalidArgumentError) as old:
        twin.apply_commit(copies[:1])
    assert str(old.value) == str(new.value) and str(new.value).startswith("apply_copies: ")


def test_torch_paged_pool_state_is_state_slots() -> None:
    torch = need("torch")
    from kvcore.torch import TorchPagedKVPool

    layers = [kvcore.LayerConfig(kvcore.Flat(), 1, 2), kvcore.LayerConfig(kvcore.State(4))]
    limits = kvcore.BatchLimits(block_size=2, max_seqs=2, num_blocks=32)
    store = TorchPagedKVPool(kvcore.BatchCache(kvcore.CacheConfig(32, layers, max_step=4, batch=limits)))
    with deprecated("TorchPagedKVPool.state"):
        assert store.state(1, "conv") is None
    assert store.write_state(1, "conv", [3], torch.full((1, 2), 7.0)) == 1
    with deprecated("TorchPagedKVPool.state"):
        old = store.state(1, "conv")
    assert old is not None and old is store.state_slots(1, "conv") and old[3].eq(7).all()
    with deprecated("TorchPagedKVPool.state"), pytest.raises(kvcore.InvalidArgumentError, match="^state_slots: layer = 0"):
        store.state(0, "conv")


def test_torch_pool_policy_of_is_group_of() -> None:
    need("torch")
    from kvcore.torch import TorchKVPool

    pool = TorchKVPool(mixed_cache())
    assert pool.group_of == [pool.cache.group_of(layer) for layer in range(6)]
    with deprecated("TorchKVPool.policy_of"):
        assert pool.policy_of is pool.group_of


def test_every_renamed_verb_has_its_row_in_the_deprecation_table() -> None:
    """docs/deprecations.md lists each old name with its new one and the release it goes in."""
    major, minor, _ = kvcore.__version__.split(".")
    assert REMOVED_IN == f"kvcore {major}.{int(minor) + 1}.0", kvcore.__version__
    table = (Path(__file__).resolve().parents[2] / "docs" / "deprecations.md").read_text()
    rows = {line for line in table.splitlines() if line.startswith("| `")}
    for old, new in RENAMED.items():
        row = [r for r in rows if r.startswith(f"| `{old}") and f"`{new}`" in r.split("|")[2]]
        assert len(row) == 1, (old, new)
        assert row[0].rstrip().endswith(f"| 0.1.0 | {REMOVED_IN.split()[1]} |"), row[0]
