"""Draft trees on the torch byte layer (TorchKVPool, docs/trees.md): a tree step's
node rows and a commit's copies, byte-exact.

Two references, on random trees over flat and ring layers (sinks, windows that
wrap, mirrored rings): kvcore.KVPool (numpy) driven by the same cache returns
the same keys, values and positions for every layer, order and step; and a
TorchKVPool over a second cache that wrote the accepted tokens as a chain (a
chain step of N whose first rows are the accepted nodes, then a rewind to the
accepted length) returns the same history from then on.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from needs import need

torch = need("torch", reason="the torch byte layer needs torch (pip install torch)")

import kvcore  # noqa: E402
from kvcore.torch.pool import TorchKVPool  # noqa: E402
from torch_bits import same_bits  # noqa: E402
from tree_reference import random_tree as tree_shape  # noqa: E402

H, D = 2, 3
POLICIES = [kvcore.Flat(), kvcore.Ring(4), kvcore.Ring(3, 2), kvcore.Ring(5, 1)]
TREE = [-1, 0, 0, 1, 2, 4]  # main line 0 1 3; 2 4 5 off it
PATH = [0, 2, 4, 5]


def make_cache(capacity: int = 90, max_step: int = 6, initial: int = 8) -> kvcore.SequenceCache:
    layers = [kvcore.LayerConfig(p, H, D) for p in POLICIES]
    return kvcore.SequenceCache(kvcore.CacheConfig(capacity, layers, max_step=max_step, initial_capacity=initial))


def random_kv(rng: np.random.Generator, n: int) -> tuple[Any, Any]:
    """K and V of n tokens, (n, H, D) float32."""
    return (rng.standard_normal((n, H, D)).astype(np.float32), rng.standard_normal((n, H, D)).astype(np.float32))


def as_torch(x: Any) -> Any:
    """(n, H, D) numpy -> [1, H, n, D] torch (batch of one)."""
    return torch.from_numpy(np.ascontiguousarray(x)).permute(1, 0, 2).unsqueeze(0).contiguous()


def as_numpy(x: Any) -> Any:
    """[1, H, n, D] torch -> (n, H, D) numpy."""
    return x[0].permute(1, 0, 2).numpy()


def random_tree(rng: np.random.Generator, n: int) -> tuple[list[int], list[int]]:
    """(parents, an accepted root path) of a random tree of n nodes (test_trees'
    shapes); the path is the root path of a node drawn uniformly, so it often
    leaves the main line (those commits copy rows)."""
    parents = tree_shape(rng, n)[0]
    node, path = int(rng.integers(0, n)), []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return parents, path[::-1]


class Pair:
    """A TorchKVPool and a KVPool on one cache, and a TorchKVPool on a cache that decodes chains."""

    def __init__(self, order: str, mirror: bool, seed: int) -> None:
        self.cache, self.chain_cache = make_cache(), make_cache()
        self.torch = TorchKVPool(self.cache, order=order, mirror_rings=mirror)
        self.numpy = kvcore.KVPool(self.cache, np.float32, mirror_rings=mirror)
        self.chain = TorchKVPool(self.chain_cache, order="positions", mirror_rings=mirror)
        self.order = order
        self.rng = np.random.default_rng(seed)
        self.copies = 0  # rows the commits moved, all layers

    def step(self, parents: list[int], path: list[int]) -> None:
        """One step (a tree, or a chain when `parents` is one), its reads compared, its path committed."""
        n, L = len(parents), self.cache.length
        is_chain = parents == list(range(-1, n - 1))
        step = self.cache.begin_step(n) if is_chain and len(path) == n else self.cache.begin_tree(parents)
        twin = self.chain_cache.begin_step(n)
        for layer in range(len(POLICIES)):
            k, v = random_kv(self.rng, n)
            tk, tv = self.torch.update(layer, step, as_torch(k), as_torch(v))
            nk, nv, npos = self.numpy.update(layer, step, k, v, order=self.order)
            assert np.array_equal(as_numpy(tk), nk) and np.array_equal(as_numpy(tv), nv), (layer, L, parents)
            layout = self.torch.plan_step(step)[self.torch.group_of[layer]]
            assert layout.key_positions() == npos.tolist()
            assert step.mask(layer, order=self.order).shape == (n, len(npos))
            rest = random_kv(self.rng, n - len(path))
            ck, cv = self.chain.update(layer, twin, as_torch(np.concatenate([k[path], rest[0]])),
                                       as_torch(np.concatenate([v[path], rest[1]])))
            # The committed history the chain pool reads (positions < L) is in the tree pool's read, byte-exact.
            at = {p: c for c, p in enumerate(layout.key_positions())}
            chain_positions = self.chain.plan_step(twin)[self.chain.group_of[layer]].key_positions()
            history = [(c, p) for c, p in enumerate(chain_positions) if p < L]
            assert history or L == 0
            for c, p in history:
                assert torch.equal(tk[:, :, at[p]], ck[:, :, c]) and torch.equal(tv[:, :, at[p]], cv[:, :, c]), (layer, p)
        if step.is_tree or len(path) < n:  # a chain given as a tree is no tree: it commits a shorter path too
            copies = step.commit(accepted=path)
            self.copies += sum(len(c) for c in copies)
            self.torch.apply_copies(copies)
            self.numpy.apply_copies(copies)
        else:
            step.commit()
        twin.commit()
        self.chain_cache.rewind(L + len(path))


@pytest.mark.parametrize(("order", "mirror"), [("rows", False), ("positions", False), ("positions", True)])
def test_random_trees_equal_kvpool_and_a_chain_pool(order: str, mirror: bool) -> None:
    pair = Pair(order, mirror, seed=5)
    rng = np.random.default_rng(6)
    while pair.cache.length + 7 <= pair.cache.capacity:  # far past every ring's wrap
        if rng.random() < 0.25:
            T = int(rng.integers(1, 7))
            pair.step(list(range(-1, T - 1)), list(range(T)))
        else:
            pair.step(*random_tree(rng, int(rng.integers(1, 7))))
    pair.step([-1], [0])  # a last step reads everything the final commit left
    assert pair.copies >= 10 and pair.cache.length > 80  # rows moved, rings wrapped many times


def test_worked_example_moves_the_accepted_nodes_rows() -> None:
    cache = make_cache()
    pool = TorchKVPool(cache, order="positions")
    rng = np.random.default_rng(1)
    with cache.step(6) as step:
        for layer in range(len(POLICIES)):
            pool.update(layer, step, *(as_torch(a) for a in random_kv(rng, 6)))
    step = cache.begin_tree(TREE)
    written = [random_kv(rng, 6) for _ in POLICIES]
    for layer in range(len(POLICIES)):
        pool.update(layer, step, *(as_torch(a) for a in written[layer]))
    copies = step.commit(accepted=PATH)
    assert sum(len(c) for c in copies) > 0
    pool.apply_copies(copies)
    nxt = cache.begin_step(1)
    for layer in range(len(POLICIES)):
        keys, _ = pool.update(layer, nxt, *(as_torch(a) for a in random_kv(rng, 1)))
        positions = pool.plan_step(nxt)[pool.group_of[layer]].key_positions()
        seen = [c for c, p in enumerate(positions) if 6 <= p < 10]
        assert seen, layer
        for c in seen:
            node = PATH[positions[c] - 6]
            assert np.array_equal(keys[0, :, c].numpy(), written[layer][0][node]), (layer, c)


def begun(pool_order: str = "positions") -> tuple[kvcore.SequenceCache, TorchKVPool, Any, Any]:
    """A cache with 6 positions, a tree begun and written, and what its commit returns."""
    cache = make_cache()
    pool = TorchKVPool(cache, order=pool_order)
    rng = np.random.default_rng(2)
    with cache.step(6) as step:
        for layer in range(len(POLICIES)):
            pool.update(layer, step, *(as_torch(a) for a in random_kv(rng, 6)))
    step = cache.begin_tree(TREE)
    for layer in range(len(POLICIES)):
        pool.update(layer, step, *(as_torch(a) for a in random_kv(rng, 6)))
    return cache, pool, step, step.commit(accepted=PATH)


def snapshot(pool: TorchKVPool) -> list[tuple[Any, Any]]:
    return [(p.keys.clone(), p.values.clone()) for p in (pool.layer(i) for i in range(len(POLICIES))) if p is not None]


def unchanged(a: list[tuple[Any, Any]], b: list[tuple[Any, Any]]) -> bool:
    return len(a) == len(b) and all(same_bits(x, y) and same_bits(u, w) for (x, u), (y, w) in zip(a, b))


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        ("short", kvcore.InvalidArgumentError, r"one \(n, 2\) int array per layer \(4 layers\)"),
        ("shape", kvcore.InvalidArgumentError, r"copies\[3\] must be an \(n, 2\) int array"),
        ("float", kvcore.InvalidArgumentError, r"copies\[3\] must be an \(n, 2\) int array"),
        ("range", kvcore.InvalidArgumentError, r"copies\[3\]\[0\] \(row 0 to row 999\) must lie in rows \[0, "),
        ("negative", kvcore.InvalidArgumentError, r"must lie in rows"),
    ],
)
def test_bad_copies_change_nothing(bad: str, error: type[Exception], match: str) -> None:
    _, pool, _, copies = begun()
    last = {
        "short": None,
        "shape": np.zeros(3, dtype=np.int32),
        "float": np.zeros((1, 2), dtype=np.float32),
        "range": np.array([[0, 999]]),
        "negative": np.array([[-1, 0]]),
    }[bad]
    arg = copies[:3] if last is None else [*copies[:3], last]
    before = snapshot(pool)
    with pytest.raises(error, match=match):
        pool.apply_copies(arg)  # layers 0-2 are fine: checked, not copied
    assert unchanged(before, snapshot(pool))
    with pytest.raises(kvcore.InvalidArgumentError, match="per layer"):
        pool.apply_copies("copies")


def test_copies_to_rows_never_allocated_are_an_invalid_state() -> None:
    cache = make_cache(initial=2)
    pool = TorchKVPool(cache)
    with cache.step(2) as step:
        for layer in range(len(POLICIES)):
            pool.update(layer, step, *(as_torch(a) for a in random_kv(np.random.default_rng(3), 2)))
    before = snapshot(pool)
    copies = [np.zeros((0, 2), dtype=np.int64) for _ in POLICIES]
    copies[0] = np.array([[1, 5]])  # the flat layer has allocated 2 of its rows
    with pytest.raises(kvcore.InvalidStateError, match=r"has not allocated \(2\): write the tree step first"):
        pool.apply_copies(copies)
    assert unchanged(before, snapshot(pool))
    pool.apply_copies([np.zeros((0, 2), dtype=np.int64) for _ in POLICIES])  # no copies: nothing to do


def test_a_tree_step_passed_as_a_plan_is_refused() -> None:
    cache = make_cache()
    pool = TorchKVPool(cache)
    step = cache.begin_tree(TREE)
    k, v = (as_torch(a) for a in random_kv(np.random.default_rng(4), 6))
    with pytest.raises(kvcore.InvalidArgumentError, match="the begun step is a draft tree: pass the Step"):
        pool.update(0, step.plan(0), k, v)
    assert pool.layer(0) is None  # nothing allocated or written
