"""Draft trees from Python (docs/trees.md, docs/design.md section 7): the binding
(begin_tree, the step's arrays, commit(step, accepted) and its copies) and the
pool, byte-exact.

Expectations are written from the contract by brute force (depths, ancestors,
the window rule of reference.py), never from the cache's own answers. The pool
check: a KVPool over a cache that verifies a tree (writing every node,
committing an accepted root path and applying its copies) reads, step after
step, exactly what a KVPool over a cache that wrote the accepted tokens as a
chain (a chain step of N whose rows hold the accepted tokens, then a rewind to
the accepted length) reads; and each node's masked keys are exactly the
history and ancestors the rule lets it see.

The hypothesis test follows test_batch_stateful.py's profiles
(HYPOTHESIS_PROFILE = dev, the default, or ci, or long).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given
from hypothesis import strategies as st

import kvcore
from hypothesis_profiles import profile_settings
from reference import visible
from tree_reference import ancestors_or_self, depths, random_tree

Array = npt.NDArray[Any]

PROFILES: dict[str, dict[str, Any]] = {
    "dev": {"max_examples": 60, "derandomize": True, "database": None},
    "ci": {"max_examples": 400, "derandomize": True, "database": None},
    "long": {"max_examples": 10_000},
}
SETTINGS = profile_settings(PROFILES)

TREE = [-1, 0, 0, 1, 2, 4]  # main line 0 1 3; 2 4 5 off it
PATH = [0, 2, 4, 5]


def make_cache(policies: list[kvcore.LayerPolicy], capacity: int = 64, max_step: int = 6) -> kvcore.SequenceCache:
    layers = [kvcore.LayerConfig(p, 2, 3) for p in policies]
    return kvcore.SequenceCache(kvcore.CacheConfig(capacity, layers, max_step=max_step))


def fill(cache: kvcore.SequenceCache, length: int, pool: kvcore.KVPool | None = None, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    while cache.length < length:
        T = min(cache.max_step, length - cache.length)
        step = cache.begin_step(T)
        if pool is not None:
            for layer in range(cache.n_layers):
                pool.update(layer, step, *kv(rng, T))
        step.commit()


def kv(rng: np.random.Generator, n: int) -> tuple[Array, Array]:
    return (rng.standard_normal((n, 2, 3)).astype(np.float32), rng.standard_normal((n, 2, 3)).astype(np.float32))


def observe(cache: kvcore.SequenceCache) -> dict[str, object]:
    """Everything a failed call must leave as it was."""
    step = cache.active_step
    out: dict[str, object] = {
        "length": cache.length,
        "can_rewind": [cache.can_rewind(n) for n in range(cache.length + 2)],
        "copies": [c.tolist() for c in cache.commit_copies()],
        "step": None if step is None else (step.position, step.T, step.is_tree),
    }
    if step is not None:
        out["plans"] = [step.plan(layer) for layer in range(cache.n_layers)]
        out["tree"] = (step.parents.tolist(), step.positions.tolist(), step.chain_index.tolist(), step.tree_mask_packed.tolist())
    return out


# --- the binding -----------------------------------------------------------


def test_worked_example_arrays_rows_mask_and_copies() -> None:
    cache = make_cache([kvcore.Flat(), kvcore.Ring(4)], capacity=100, max_step=4)
    fill(cache, 12)
    step = cache.begin_tree(np.array([-1, 0, 0, 2], dtype=np.int64))
    assert step.is_tree and step.T == 4 and "tree=True" in repr(step)
    assert step.parents.tolist() == [-1, 0, 0, 2]
    assert step.positions.tolist() == [12, 13, 13, 14]
    assert step.chain_index.tolist() == [0, 1, 2, 3]
    assert step.tree_mask_packed.dtype == np.uint32
    assert step.tree_mask_packed[:, 0].tolist() == [0b1, 0b11, 0b101, 0b1101]
    assert step.tree_rows(0).tolist() == [12, 13, 14, 15]
    assert step.tree_rows(1).tolist() == [5, 6, 0, 1]  # a wrapped ring of 7 rows
    dense = step.dense_tree_mask(1)
    assert dense.astype(int).tolist() == [
        [1, 1, 1, 1, 0, 0, 0],
        [0, 1, 1, 1, 1, 0, 0],
        [0, 1, 1, 1, 0, 1, 0],
        [0, 0, 1, 1, 0, 1, 1],
    ]
    assert np.array_equal(step.mask(1, order="positions"), dense)
    copies = cache.commit(step, accepted=[0, 2, 3])
    assert cache.length == 15
    assert [c.tolist() for c in copies] == [[[14, 13], [15, 14]], [[0, 6], [1, 0]]]
    assert all(c.dtype == np.int32 for c in copies)
    assert [c.tolist() for c in cache.commit_copies()] == [c.tolist() for c in copies]


def test_tree_arrays_are_read_only_and_a_chain_step_has_them_too() -> None:
    cache = make_cache([kvcore.Ring(3)])
    fill(cache, 5)
    step = cache.begin_step(3)
    assert not step.is_tree
    assert step.parents.tolist() == [-1, 0, 1]
    assert step.positions.tolist() == [5, 6, 7]
    assert step.chain_index.tolist() == [0, 1, 2]
    assert step.tree_mask_packed[:, 0].tolist() == [1, 3, 7]
    assert step.tree_rows(0).tolist() == [5, 6, 7]
    for array in (step.parents, step.positions, step.chain_index, step.tree_mask_packed):
        with pytest.raises(ValueError):
            array[0] = 1


def test_wide_trees_pack_several_words_per_row() -> None:
    cache = make_cache([kvcore.Flat()], capacity=200, max_step=100)
    parents = [-1] + [0] * 39 + list(range(39, 99))  # 40 under the root, then a line under node 39
    step = cache.begin_tree(parents)
    mask = step.tree_mask_packed
    assert mask.shape == (100, 4)
    bits = np.unpackbits(mask.view(np.uint8), axis=1, bitorder="little")[:, :100].astype(bool)
    for i in range(100):
        assert set(np.flatnonzero(bits[i]).tolist()) == ancestors_or_self(parents, i)


@pytest.mark.parametrize("policy", [kvcore.Flat(), kvcore.Ring(4), kvcore.Ring(3, 2)], ids=repr)
def test_a_chain_given_as_a_tree_plans_as_a_chain(policy: kvcore.LayerPolicy) -> None:
    for length in (0, 9, 30):
        a, b = make_cache([policy]), make_cache([policy])
        fill(a, length)
        fill(b, length)
        ta, tb = a.begin_tree([-1, 0, 1, 2, 3]), b.begin_step(5)
        assert ta.plan(0) == tb.plan(0)
        assert a.commit(ta) is None
        b.commit(tb)
        assert observe(a) == observe(b)


def test_a_chain_step_commits_a_prefix() -> None:
    cache = make_cache([kvcore.Ring(4)])
    fill(cache, 20)
    step = cache.begin_step(4)
    with pytest.raises(kvcore.InvalidArgumentError, match=r"accepted\[1\] = 2: a chain step's accepted path"):
        step.commit(accepted=[0, 2])
    copies = step.commit(accepted=[0, 1])
    assert cache.length == 22 and [c.shape for c in copies] == [(0, 2)]


@pytest.mark.parametrize(
    ("parents", "error", "match"),
    [
        pytest.param([], kvcore.InvalidArgumentError, r"tree of N = 0 nodes", id="empty"),
        pytest.param([-1] + [0] * 6, kvcore.InvalidArgumentError, r"N = 7 nodes: needs 1 <= N <= max_step = 6", id="above-max_step"),
        pytest.param([0, 0], kvcore.InvalidArgumentError, r"parents\[0\] = 0", id="root-not--1"),
        pytest.param([-1, 0, -1], kvcore.InvalidArgumentError, r"a second root", id="second-root"),
        pytest.param([-1, 0, 3, 1], kvcore.InvalidArgumentError, r"parents\[2\] = 3", id="not-topological"),
        pytest.param([-1, 0, 0, 1, 1, 2], kvcore.CapacityError, r"length would exceed capacity", id="capacity"),
    ],
)
def test_bad_trees_change_nothing(parents: list[int], error: type[Exception], match: str) -> None:
    cache = make_cache([kvcore.Ring(3, 1), kvcore.Flat()], capacity=40)
    fill(cache, 20 if error is not kvcore.CapacityError else 36)
    step = cache.begin_tree(TREE[:3])
    before = observe(cache)
    with pytest.raises(error, match=match):
        cache.begin_tree(np.array(parents, dtype=np.int32))
    assert observe(cache) == before
    assert step.is_current


def test_reserve_tree_checks_its_range() -> None:
    cache = make_cache([kvcore.Flat()])
    for bad in (0, 7):
        with pytest.raises(kvcore.InvalidArgumentError, match=r"reserve_tree\(%d\)" % bad):
            cache.reserve_tree(bad)
    cache.reserve_tree(6)


def begun_tree() -> tuple[kvcore.SequenceCache, kvcore.Step]:
    cache = make_cache([kvcore.Ring(3, 1), kvcore.Flat()])
    fill(cache, 20)
    return cache, cache.begin_tree(TREE)


def test_committing_a_tree_as_a_chain_changes_nothing() -> None:
    cache, step = begun_tree()
    before = observe(cache)
    for commit in (step.commit, lambda: cache.commit(step)):
        with pytest.raises(kvcore.InvalidArgumentError, match="not a chain: commit it with its accepted path"):
            commit()
        assert observe(cache) == before
    with pytest.raises(kvcore.InvalidArgumentError):
        with step:  # the context manager commits plainly: refused
            pass
    assert observe(cache) == before
    assert len(step.commit(accepted=PATH)) == 2


@pytest.mark.parametrize(
    ("path", "match"),
    [
        pytest.param([], r"accepted path of 0 nodes", id="empty"),
        pytest.param([1, 3], r"accepted\[0\] = 1", id="not-from-the-root"),
        pytest.param([0, 9], r"accepted\[1\] = 9: a node index must be in \[0, N = 6\)", id="out-of-range"),
        pytest.param([0, 1, 4], r"accepted\[2\] = 4: not a child", id="cousin"),
        pytest.param([0, 2, 4, 5, 1, 3, 0], r"accepted path of 7 nodes", id="too-long"),
    ],
)
def test_bad_accepted_paths_change_nothing(path: list[int], match: str) -> None:
    cache, step = begun_tree()
    before = observe(cache)
    with pytest.raises(kvcore.InvalidArgumentError, match=match):
        cache.commit(step, accepted=path)
    assert observe(cache) == before
    with pytest.raises(TypeError):
        cache.commit(step, accepted=[0, "1"])  # type: ignore[list-item]
    assert observe(cache) == before


def test_dense_tree_mask_of_a_chain_step_is_refused() -> None:
    cache = make_cache([kvcore.Flat()])
    step = cache.begin_step(2)
    with pytest.raises(kvcore.InvalidArgumentError, match="begun by begin_step, not begin_tree"):
        step.dense_tree_mask(0)


def test_stale_tree_steps_are_refused() -> None:
    cache, step = begun_tree()
    cache.begin_tree(TREE[:2])  # replaces it
    for call in (
        lambda: step.positions,
        lambda: step.tree_rows(0),
        lambda: step.dense_tree_mask(0),
        lambda: step.commit(accepted=[0]),
        lambda: step.mask(0),
    ):
        with pytest.raises(kvcore.InvalidStateError, match="not the begun step"):
            call()


def test_abort_of_a_tree_counts_its_rows_as_written() -> None:
    a, b = make_cache([kvcore.Ring(3, 1)]), make_cache([kvcore.Ring(3, 1)])
    fill(a, 30)
    fill(b, 30)
    a.begin_tree(TREE).abort()
    b.begin_step(6).abort()
    assert observe(a)["can_rewind"] == observe(b)["can_rewind"]


# --- the pool --------------------------------------------------------------


def test_a_tree_input_that_is_a_view_of_the_pool_is_refused() -> None:
    cache = make_cache([kvcore.Flat()])
    pool = kvcore.KVPool(cache, np.float32)
    fill(cache, 8, pool)
    step = cache.begin_step(6)
    k, v, _ = pool.update(0, step, *kv(np.random.default_rng(1), 6), order="positions")
    step.abort()
    tree = cache.begin_tree(TREE)
    with pytest.raises(kvcore.InvalidArgumentError, match="overlap the layer's rows: pass a copy"):
        pool.update(0, tree, k[:6], v[:6])


def test_apply_copies_checks_every_layer_first() -> None:
    cache, step = begun_tree()
    pool = kvcore.KVPool(cache, np.float32)
    rng = np.random.default_rng(2)
    written = [kv(rng, 6) for _ in range(2)]
    for layer in range(2):
        pool.update(layer, step, *written[layer])
    copies = step.commit(accepted=PATH)
    with pytest.raises(kvcore.InvalidArgumentError, match=r"one \(n, 2\) int array per layer \(2 layers\)"):
        pool.apply_copies(copies[:1])
    with pytest.raises(kvcore.InvalidArgumentError, match=r"copies\[1\] has 1 dimensions: must be \(n, 2\)"):
        pool.apply_copies([copies[0], np.zeros(3, dtype=np.int32)])
    with pytest.raises(kvcore.InvalidArgumentError, match=r"must lie in rows"):
        pool.apply_copies([copies[0], np.array([[0, 999]])])  # layer 0 is fine: checked, not copied
    pool.apply_copies(copies)  # had a refused call copied layer 0, this second pass would break it
    nxt = cache.begin_step(1)
    for layer in range(2):
        keys, _, positions = pool.update(layer, nxt, *kv(rng, 1), order="positions")
        seen = [int(c) for d in range(len(PATH)) for c in np.flatnonzero(positions == 20 + d)]
        assert len(seen) == (4 if layer == 1 else 2)  # the ring's window holds 22 and 23
        for c in seen:
            node = PATH[int(positions[c]) - 20]
            assert np.array_equal(keys[c], written[layer][0][node]), (layer, c)


class Verifier:
    """A tree cache + pool and a chain cache + pool driven side by side."""

    def __init__(self, policies: list[kvcore.LayerPolicy], capacity: int, C: int, mirror: bool, seed: int) -> None:
        self.tree_cache = make_cache(policies, capacity, C)
        self.chain_cache = make_cache(policies, capacity, C)
        self.tree_pool = kvcore.KVPool(self.tree_cache, np.float32, mirror_rings=mirror)
        self.chain_pool = kvcore.KVPool(self.chain_cache, np.float32, mirror_rings=mirror)
        self.rng = np.random.default_rng(seed)
        # Per layer, per committed position: its K row (to judge what a node sees).
        self.history: list[dict[int, Array]] = [{} for _ in policies]

    def chain_step(self, T: int) -> None:
        a, b = self.tree_cache.begin_step(T), self.chain_cache.begin_step(T)
        for layer in range(self.tree_cache.n_layers):
            k, v = kv(self.rng, T)
            ra = self.tree_pool.update(layer, a, k, v, order="positions")
            rb = self.chain_pool.update(layer, b, k, v, order="positions")
            for x, y in zip(ra, rb):
                assert np.array_equal(x, y)
            assert np.array_equal(a.mask(layer, order="positions"), b.mask(layer, order="positions"))
            for j in range(T):
                self.history[layer][a.position + j] = k[j]
        a.commit()
        b.commit()

    def tree_step(self, parents: list[int], path: list[int]) -> None:
        n, L = len(parents), self.tree_cache.length
        a, b = self.tree_cache.begin_tree(parents), self.chain_cache.begin_step(n)
        depth = depths(parents)
        for layer in range(self.tree_cache.n_layers):
            policy = self.tree_cache.layer_policy(layer)
            k, v = kv(self.rng, n)
            for order in ("positions", "rows"):
                keys, _, positions = self.tree_pool.update(layer, a, k, v, order=order)
                mask = a.mask(layer, order=order)
                for i in range(n):
                    q = L + depth[i]
                    want = sorted(
                        [self.history[layer][p].tobytes() for p in range(L) if visible(policy, q, p)]
                        + [k[j].tobytes() for j in ancestors_or_self(parents, i) if visible(policy, q, L + depth[j])]
                    )
                    got = sorted(keys[c].tobytes() for c in np.flatnonzero(mask[i]))
                    assert got == want, (layer, order, i)
                    assert all(positions[c] <= q for c in np.flatnonzero(mask[i]))
            chain_k = np.concatenate([k[path], kv(self.rng, n - len(path))[0]])
            chain_v = np.concatenate([v[path], kv(self.rng, n - len(path))[1]])
            self.chain_pool.update(layer, b, chain_k, chain_v)
            for d, node in enumerate(path):
                self.history[layer][L + d] = k[node]
        copies = a.commit(accepted=path)
        b.commit()
        self.chain_cache.rewind(L + len(path))
        main = [0]
        while len(main) < len(path) and main[-1] + 1 < n and (children := [c for c in range(n) if parents[c] == main[-1]]):
            main.append(children[0])
        if path == main[: len(path)]:
            assert all(len(c) == 0 for c in copies)
        assert all(len(c) < len(path) for c in copies)
        self.tree_pool.apply_copies(copies)
        assert observe(self.tree_cache)["can_rewind"] == observe(self.chain_cache)["can_rewind"]


@pytest.mark.parametrize("mirror", [False, True])
def test_pool_reads_after_tree_commits_equal_a_chain_pool(mirror: bool) -> None:
    v = Verifier([kvcore.Flat(), kvcore.Ring(4), kvcore.Ring(3, 2)], capacity=80, C=6, mirror=mirror, seed=3)
    rng = np.random.default_rng(4)
    while v.tree_cache.length + 12 <= v.tree_cache.capacity:
        v.tree_step(*random_tree(rng, int(rng.integers(1, 7))))
        v.chain_step(int(rng.integers(1, 7)))


@SETTINGS
@given(
    windows=st.lists(st.tuples(st.integers(1, 8), st.integers(0, 3)), min_size=1, max_size=3),
    C=st.integers(1, 8),
    mirror=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
    steps=st.lists(st.tuples(st.booleans(), st.integers(1, 8)), min_size=1, max_size=12),
)
def test_random_trees_read_as_chains(
    windows: list[tuple[int, int]], C: int, mirror: bool, seed: int, steps: list[tuple[bool, int]]
) -> None:
    policies = [kvcore.Flat()] + [kvcore.Ring(w, s) for w, s in windows]
    v = Verifier(policies, capacity=C + 40, C=C, mirror=mirror, seed=seed)
    rng = np.random.default_rng(seed)
    for is_tree, size in steps:
        n = min(size, C, v.tree_cache.capacity - v.tree_cache.length)
        if n < 1:
            break
        if is_tree:
            v.tree_step(*random_tree(rng, n))
        else:
            v.chain_step(n)
