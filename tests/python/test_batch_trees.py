"""Draft trees in kvcore.BatchCache (docs/design.md section 7, docs/batch.md).

A hypothesis state machine drives twin caches with one config: the tree cache
begins random draft trees (list form and array form) and commits random
accepted root paths; the chain cache decodes only the accepted tokens, as a
plain step. A simulated byte layer (a tag per pool row, a rolling hash of the
tokens on the row's root path) applies the plans and the commits' row copies.
What every rule proves:
- every node's read (plan.mask over the group's rows) is exactly its history
  by the visibility rule at its position (L + depth) plus itself and its
  ancestors within the window, and each of those rows holds the K/V it claims;
  positions, chain indices and the packed ancestor masks say the same;
- a commit copies nothing for a main-line path and at most m - 1 rows
  otherwise; afterwards the twins are indistinguishable (lengths, every
  can_rewind answer, blocks held, oldest held, free and cached blocks, the K/V
  at every position a query at the length sees, prefix hits);
- committing a tree step without paths, or with a bad path, raises
  InvalidArgumentError and changes nothing.

Profiles (HYPOTHESIS_PROFILE, as test_batch_stateful.py): dev (default) and ci
are derandomized and take seconds; long runs random seeds. The C++ twin
(tests/cpp/batch_tree_test.cpp) runs thousands of trees per configuration.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from needs import need
from hypothesis import HealthCheck
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import kvcore
from hypothesis_profiles import profile_settings
from reference import visible
from tree_reference import ancestors_or_self, depths, main_line

PROFILES: dict[str, dict[str, Any]] = {
    "dev": {"max_examples": 40, "stateful_step_count": 15, "derandomize": True, "database": None},
    "ci": {"max_examples": 150, "stateful_step_count": 20, "derandomize": True, "database": None},
    "long": {"max_examples": 5_000, "stateful_step_count": 40},
}
SETTINGS = profile_settings(PROFILES, HealthCheck.filter_too_much, HealthCheck.data_too_large)

SEED_TAG = 0x2545F4914F6CDD1D
MASK64 = (1 << 64) - 1


def roll(before: int, token: int) -> int:
    """The K/V tag of a token computed after `before` (a rolling hash, never 0)."""
    x = (before ^ (token + 0x9E3779B97F4A7C15)) & MASK64
    x ^= x >> 31
    x = (x * 0x7FB5D329728EA185) & MASK64
    x ^= x >> 27
    x = (x * 0x81DADEF4BC2DD44D) & MASK64
    return (x ^ (x >> 33)) | 1


def make_config(B: int, policies: list[kvcore.LayerPolicy], max_step: int) -> kvcore.CacheConfig:
    layers = [kvcore.LayerConfig(p, 1, 2) for p in policies]
    capacity = 48
    limits = kvcore.BatchLimits(block_size=B, max_seqs=3, num_blocks=3 * 3 * -(-capacity // B))
    return kvcore.CacheConfig(capacity, layers, max_step=max_step, batch=limits)


class TaggedPools:
    """Per group, the tag each row holds."""

    def __init__(self, cache: kvcore.BatchCache) -> None:
        self.rows = [np.zeros(cache.num_blocks(g) * cache.block_size, dtype=np.uint64) for g in range(cache.n_groups)]

    def apply(self, plan: kvcore.BatchStepPlan, tags: list[int]) -> None:
        B = plan.block_size
        for g, gp in enumerate(plan.groups):
            rows = self.rows[g]
            for src, dst in gp.copies:
                rows[dst * B : (dst + 1) * B] = rows[src * B : (src + 1) * B]
            rows[gp.slots] = np.array(tags, dtype=np.uint64)

    def copy_rows(self, copies: tuple[np.ndarray, ...]) -> None:
        for g, pairs in enumerate(copies):
            for src, dst in pairs:
                self.rows[g][dst] = self.rows[g][src]


class TreeTwins(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tree: kvcore.BatchCache
        self.chain: kvcore.BatchCache

    @initialize(
        B=st.sampled_from([1, 2, 4, 16]),
        policies=st.sampled_from(
            [
                [kvcore.Flat()],
                [kvcore.Ring(window=3, sinks=1), kvcore.Flat()],
                [kvcore.Ring(window=1), kvcore.Ring(window=5, sinks=2)],
            ]
        ),
        max_step=st.integers(1, 8),
    )
    def build(self, B: int, policies: list[kvcore.LayerPolicy], max_step: int) -> None:
        cfg = make_config(B, policies, max_step)
        self.tree, self.chain = kvcore.BatchCache(cfg), kvcore.BatchCache(cfg)
        self.tree_pools, self.chain_pools = TaggedPools(self.tree), TaggedPools(self.chain)
        self.tags: list[list[int]] = [[] for _ in range(3)]
        self.tokens: list[list[int]] = [[] for _ in range(3)]
        for s in range(3):
            self.tree.add_sequence(s)
            self.chain.add_sequence(s)

    def last_tag(self, s: int) -> int:
        return self.tags[s][-1] if self.tags[s] else SEED_TAG

    @rule(data=st.data(), as_arrays=st.booleans())
    def tree_step(self, data: st.DataObject, as_arrays: bool) -> None:
        C = self.tree.max_step
        entries = []
        for s in range(3):
            room = min(C, self.tree.capacity - self.tree.length(s))
            if room < 1 or not data.draw(st.booleans()):
                continue
            n = data.draw(st.integers(1, room))
            parents = [-1] + [data.draw(st.integers(max(0, i - 3), i - 1)) for i in range(1, n)]
            tokens = data.draw(st.lists(st.integers(0, 1 << 20), min_size=n, max_size=n))
            entries.append((s, parents, tokens))
        if not entries:
            return
        if as_arrays:
            step = self.tree.begin_step(
                np.array([e[0] for e in entries]),
                np.array([len(e[1]) for e in entries]),
                np.array([t for e in entries for t in e[2]], dtype=np.int32),
                parents=np.array([p for e in entries for p in e[1]], dtype=np.int32),
            )
        else:
            step = self.tree.begin_step([(s, len(p), t, p) for s, p, t in entries])
        node_tags = []
        for s, parents, tokens in entries:
            tags: list[int] = []
            for i, p in enumerate(parents):
                tags.append(roll(tags[p] if p >= 0 else self.last_tag(s), tokens[i]))
            node_tags.append(tags)
        plan = step.plan()
        self.tree_pools.apply(plan, [t for tags in node_tags for t in tags])
        self.check_reads(plan, entries, node_tags)
        if data.draw(st.integers(0, 5)) == 0:
            step.abort()
            # The twin reserves what the tree did (where a pool ran short, the
            # same cached prefixes are reclaimed) and aborts too.
            self.chain.begin_step([(s, len(p)) for s, p, _ in entries]).abort()
            return
        self.commit(step, data, entries, node_tags)

    def check_reads(self, plan: kvcore.BatchStepPlan, entries: list[Any], node_tags: list[list[int]]) -> None:
        B = plan.block_size
        starts, positions, places = plan.query_starts, plan.positions, plan.chain_index
        assert not positions.flags.writeable and not plan.tree_masks.flags.writeable
        for i, (s, parents, _) in enumerate(entries):
            n, at, L = len(parents), int(starts[i]), int(plan.first_positions[i])
            is_tree = parents != list(range(-1, n - 1))
            assert plan.is_tree(i) == is_tree
            assert int(plan.context_lens[i]) == L + n
            assert sorted(places[at : at + n]) == list(range(n))
            assert list(positions[at : at + n]) == [L + d for d in depths(parents)]
            if is_tree:
                words = (n + 31) // 32
                m = plan.tree_masks[plan.tree_mask_starts[i] : plan.tree_mask_starts[i + 1]].reshape(n, words)
                for j in range(n):
                    got = {k for k in range(n) if (int(m[j, k // 32]) >> (k % 32)) & 1}
                    assert got == ancestors_or_self(parents, j)
            for g, gp in enumerate(plan.groups):
                mask = plan.mask(g)
                table = gp.block_tables[s]
                pool = self.tree_pools.rows[g]
                depth = depths(parents)
                for j in range(n):
                    q = L + depth[j]
                    assert int(gp.slots[at + j]) == table[(L + places[at + j]) // B] * B + (L + places[at + j]) % B
                    want = set()
                    for k in range(L):
                        if visible(gp.policy, q, k):
                            r = int(table[k // B]) * B + k % B
                            assert table[k // B] >= 0 and int(pool[r]) == self.tags[s][k], (g, j, k)
                            want.add(r)
                    for a in ancestors_or_self(parents, j):
                        if visible(gp.policy, q, L + depth[a]):
                            r = int(gp.slots[at + a])
                            assert int(pool[r]) == node_tags[i][a]
                            want.add(r)
                    assert set(np.flatnonzero(mask[at + j]).tolist()) == want, (g, j)

    def commit(self, step: kvcore.BatchStep, data: st.DataObject, entries: list[Any], node_tags: list[list[int]]) -> None:
        accepted = {}
        for s, parents, _ in entries:
            path = [0]
            want = data.draw(st.integers(1, len(parents)))
            while len(path) < want:
                kids = [k for k in range(len(parents)) if parents[k] == path[-1]]
                if not kids:
                    break
                path.append(data.draw(st.sampled_from(kids)))
            accepted[s] = path
        if any(p != list(range(-1, len(p) - 1)) for _, p, _ in entries):
            before = self.state(self.tree)
            with pytest.raises(kvcore.InvalidArgumentError):
                step.commit()  # a tree step committed as a chain
            bad = dict(accepted)
            s0 = entries[0][0]
            bad[s0] = [0, len(entries[0][1])]  # an index out of range
            with pytest.raises(kvcore.InvalidArgumentError):
                self.tree.commit(step, accepted=bad)
            assert self.state(self.tree) == before and step.is_current
        copies = self.tree.commit(step, accepted=accepted)
        bound = sum(len(p) - 1 for p in accepted.values())
        all_main = all(accepted[s] == main_line(p)[: len(accepted[s])] for s, p, _ in entries)
        for pairs in copies:
            assert pairs.shape[1] == 2 and len(pairs) <= bound
            if all_main:
                assert len(pairs) == 0
        self.tree_pools.copy_rows(copies)
        # The chain twin reserves a chain of N (aborted), then decodes the accepted tokens.
        self.chain.begin_step([(s, len(p)) for s, p, _ in entries]).abort()
        chain_entries, chain_tags = [], []
        for i, (s, _, tokens) in enumerate(entries):
            path = accepted[s]
            chain_entries.append((s, len(path), [tokens[k] for k in path]))
            chain_tags += [node_tags[i][k] for k in path]
            self.tags[s] += [node_tags[i][k] for k in path]
            self.tokens[s] += [tokens[k] for k in path]
        twin = self.chain.begin_step(chain_entries)
        self.chain_pools.apply(twin.plan(), chain_tags)
        twin.commit()

    @rule(data=st.data())
    def rewind(self, data: st.DataObject) -> None:
        s = data.draw(st.integers(0, 2))
        n = data.draw(st.integers(0, self.tree.length(s)))
        ok = self.tree.can_rewind(s, n)
        assert ok == self.chain.can_rewind(s, n)
        if ok:
            self.tree.rewind(s, n)
            self.chain.rewind(s, n)
            del self.tags[s][n:], self.tokens[s][n:]

    @precondition(lambda self: any(self.tree.length(s) > 0 for s in range(3)))
    @rule(data=st.data())
    def restart_with_prefix(self, data: st.DataObject) -> None:
        """A sequence restarts, adopting another's prefix (a fork when it is empty)."""
        src = data.draw(st.sampled_from([s for s in range(3) if self.tree.length(s) > 0]))
        dst = data.draw(st.sampled_from([s for s in range(3) if s != src]))
        for c in (self.tree, self.chain):
            c.release_sequence(dst)
            c.add_sequence(dst)
        prompt = self.tokens[src] + [7]
        hit = self.tree.adopt_prefix(dst, prompt)
        assert hit == self.chain.adopt_prefix(dst, prompt)
        self.tags[dst], self.tokens[dst] = list(self.tags[src][:hit]), list(self.tokens[src][:hit])

    @staticmethod
    def state(c: kvcore.BatchCache) -> tuple[Any, ...]:
        out: list[Any] = []
        for s in range(c.max_seqs):
            L = c.length(s)
            out.append((L, [c.can_rewind(s, n) for n in range(-1, L + 2)]))
            out.append([(c.blocks_held(s, g), c.oldest_held(s, g)) for g in range(c.n_groups)])
        out.append([(c.free_blocks(g), c.cached_blocks(g)) for g in range(c.n_groups)])
        return tuple(map(str, out))

    @invariant()
    def twins_agree(self) -> None:
        if not hasattr(self, "tree"):
            return
        assert self.state(self.tree) == self.state(self.chain)
        B = self.tree.block_size
        for g in range(self.tree.n_groups):
            policy = self.tree.group_policy(g)
            for s in range(3):
                L = self.tree.length(s)
                if L == 0 or L == self.tree.capacity:
                    continue
                step_a = self.tree.begin_step([(s, 1)])
                step_b = self.chain.begin_step([(s, 1)])
                # The step's copies-on-write first: a shared, partly filled block is copied.
                plan_a, plan_b = step_a.plan(), step_b.plan()
                for plan, pools in ((plan_a, self.tree_pools), (plan_b, self.chain_pools)):
                    for src, dst in plan.groups[g].copies:
                        pools.rows[g][dst * B : (dst + 1) * B] = pools.rows[g][src * B : (src + 1) * B]
                table_a = plan_a.groups[g].block_tables[s]
                table_b = plan_b.groups[g].block_tables[s]
                for p in range(L):
                    if not visible(policy, L, p):
                        continue
                    ra, rb = int(table_a[p // B]) * B + p % B, int(table_b[p // B]) * B + p % B
                    assert self.tree_pools.rows[g][ra] == self.chain_pools.rows[g][rb] == self.tags[s][p], (g, s, p)
                step_a.abort()
                step_b.abort()


TreeTwins.TestCase.settings = SETTINGS
TestTreeTwins = TreeTwins.TestCase


# --- plain tests -----------------------------------------------------------------------------


def small() -> kvcore.BatchCache:
    c = kvcore.BatchCache(make_config(2, [kvcore.Ring(window=3, sinks=1), kvcore.Flat()], 6))
    c.add_sequence(0)
    c.add_sequence(1)
    c.step([(0, 5, [0, 1, 2, 3, 4])]).commit()
    return c


def test_list_and_array_forms_plan_the_same_tree() -> None:
    parents = [-1, 0, 0, 1, 2]
    a, b = small(), small()
    pa = a.begin_step([(0, 5, [9, 8, 7, 6, 5], parents), (1, 2, None, [-1, 0])]).plan()
    pb = b.begin_step(
        [0, 1], [5, 2], [9, 8, 7, 6, 5], token_offsets=[0, 5, 5], parents=np.array(parents)
    ).plan()
    pc = small().begin_step([0, 1], [5, 2], parents=parents + [-1, 0]).plan()
    for p in (pb, pc):
        for name in ("positions", "chain_index", "tree_mask_starts", "tree_masks", "query_starts"):
            assert np.array_equal(getattr(pa, name), getattr(p, name)), name
        for g in range(2):
            assert np.array_equal(pa.groups[g].slots, p.groups[g].slots)
    assert list(pa.positions) == [5, 6, 6, 7, 7, 0, 1]
    assert list(pa.chain_index) == [0, 1, 3, 2, 4, 0, 1]
    assert pa.is_tree(0) and not pa.is_tree(1)
    assert list(pa.tree_mask_starts) == [0, 5, 5]
    assert list(pa.tree_masks) == [0b1, 0b11, 0b101, 0b1011, 0b10101]


def test_commit_returns_row_copies_and_a_pool_applies_them() -> None:
    c = small()
    pool = kvcore.PagedKVPool(c, np.float32)
    parents = [-1, 0, 0, 1, 2]
    step = c.begin_step([(0, 5, [9, 8, 7, 6, 5], parents)])
    slots = [gp.slots.copy() for gp in step.plan().groups]  # the plan's views change with the next step
    for layer in range(c.n_layers):
        k = np.arange(5 * 2, dtype=np.float32).reshape(5, 1, 2) + 100 * layer
        pool.update(layer, step, k, k.copy())
    copies = c.commit(step, accepted={0: [0, 2, 4]})
    assert c.length(0) == 8
    for g, pairs in enumerate(copies):  # nodes 2 and 4 move to chain places 1 and 2
        assert [tuple(p) for p in pairs] == [(slots[g][2], slots[g][1]), (slots[g][4], slots[g][3])]
    pool.apply_copies(copies)
    nxt = c.begin_step([(0, 1)])
    k_rows, _ = pool.update(1, nxt, np.zeros((1, 1, 2), np.float32), np.zeros((1, 1, 2), np.float32))
    table = nxt.plan().groups[c.group_of(1)].block_tables[0]
    B = c.block_size
    for d, node in enumerate([0, 2, 4]):
        p = 5 + d
        row = table[p // B] * B + p % B
        assert np.array_equal(k_rows[row, 0], np.array([2 * node, 2 * node + 1], np.float32) + 100)


def test_tree_errors_raise_and_change_nothing() -> None:
    c = small()
    before = TreeTwins.state(c)
    for parents in ([0, 0], [-1, -1], [-1, 1], [-1, 0, 5], [-1, 0, -2]):
        with pytest.raises(kvcore.InvalidArgumentError):
            c.begin_step([(0, len(parents), None, parents)])
    with pytest.raises(kvcore.InvalidArgumentError):
        c.begin_step([(0, 2, None, [-1])])  # not T parents
    assert TreeTwins.state(c) == before
    step = c.begin_step([(0, 3, None, [-1, 0, 0]), (1, 2)])
    before = TreeTwins.state(c)
    for accepted in ({0: [1]}, {0: [0, 3]}, {0: [0, -1]}, {0: []}, {0: [0], 2: [0]}, {1: [0]}, [(0, [0]), (0, [0])]):
        with pytest.raises(kvcore.InvalidArgumentError):
            c.commit(step, accepted=accepted)
    with pytest.raises(kvcore.InvalidArgumentError):
        step.commit()
    assert TreeTwins.state(c) == before and step.is_current
    assert [len(p) for p in step.commit(accepted={0: [0, 2]})] == [1, 1]
    assert (c.length(0), c.length(1)) == (7, 2)


def test_bad_accepted_and_tree_arrays_are_refused_naming_them() -> None:
    c = small()
    step = c.begin_step([(0, 3, None, [-1, 0, 0])])
    before = TreeTwins.state(c)
    with pytest.raises(kvcore.InvalidArgumentError, match=r"commit: accepted is \{seq: nodes\} or \[\(seq, nodes\), \.\.\.\], got the item 5"):
        c.commit(step, accepted=[5])
    with pytest.raises(TypeError, match="commit: node"):
        c.commit(step, accepted={0: [0, 1.5]})
    with pytest.raises(TypeError, match="commit: seq"):
        c.commit(step, accepted={"a": [0]})
    assert TreeTwins.state(c) == before and step.is_current
    with pytest.raises(kvcore.InvalidArgumentError, match=r"begin_step: parents has 3 values, the entries' T add up to 4"):
        c.begin_step([0, 1], [2, 2], parents=[-1, 0, -1])
    with pytest.raises(kvcore.InvalidArgumentError, match=r"begin_step: token_offsets\[2\] = 4: must be len\(parents\) = 3"):
        c.begin_step([0, 1], [2, 2], [1, 2, 3, 4], token_offsets=[0, 2, 4], parents=[-1, 0, -1])
    with pytest.raises(kvcore.InvalidArgumentError, match="tokens, token_offsets and parents need seqs and T as arrays"):
        c.begin_step([(0, 2)], parents=[-1, 0])
    with pytest.raises(TypeError, match="begin_step: parent"):
        c.begin_step([(0, 2, None, [-1, "x"])])
    assert TreeTwins.state(c) == before and step.is_current


def test_apply_copies_refuses_what_is_not_a_commit() -> None:
    c = small()
    pool = kvcore.PagedKVPool(c, np.float32)
    step = c.begin_step([(0, 3, None, [-1, 0, 0])])
    for layer in range(c.n_layers):
        pool.update(layer, step, np.ones((3, 1, 2), np.float32), np.ones((3, 1, 2), np.float32))
    copies = c.commit(step, accepted={0: [0, 2]})
    with pytest.raises(kvcore.InvalidArgumentError, match=r"apply_copies: copies must hold one \(n, 2\) array per group \(2\)"):
        pool.apply_copies(copies[:1])
    with pytest.raises(kvcore.InvalidArgumentError, match=r"apply_copies: copies\[1\].dtype = float64: must be int32 or int64"):
        pool.apply_copies((copies[0], np.zeros(3)))
    with pytest.raises(kvcore.InvalidArgumentError, match=r"apply_copies: copies\[1\] has shape \(1, 3\): must be \(n, 2\)"):
        pool.apply_copies((copies[0], np.zeros((1, 3), np.int32)))
    with pytest.raises(kvcore.InvalidArgumentError, match=r"apply_copies: group 0's copy 0 names a row outside \[0, 2\^31\)"):
        pool.apply_copies((np.array([[-1, 0]]), copies[1]))
    with pytest.raises(kvcore.InvalidArgumentError, match=r"apply_copies: layer 0's copy 0 \(row 4096 -> row 0\) must lie in its"):
        pool.apply_copies((np.array([[4096, 0]]), copies[1]))
    pool.apply_copies(copies)



def test_a_refused_apply_copies_changes_nothing() -> None:
    """Every group is checked before any row is copied: a commit whose first
    group is fine and second is not leaves every layer's bytes as they were."""
    c = small()
    pool = kvcore.PagedKVPool(c, np.float32)
    step = c.begin_step([(0, 3, None, [-1, 0, 0])])
    node = np.arange(3, dtype=np.float32).reshape(3, 1, 1).repeat(2, axis=2)  # node i's K and V hold i
    for layer in range(c.n_layers):
        pool.update(layer, step, node, node + 10)
    copies = c.commit(step, accepted={0: [0, 2]})  # node 2 is off the main line: one copy per group
    assert all(len(g) == 1 for g in copies)

    def layer_bytes() -> list[bytes]:
        return [k.tobytes() + v.tobytes() for k, v in (pool.rows(layer) for layer in range(c.n_layers))]

    before = layer_bytes()
    bad = np.array([[4096, 0]])
    for refused in ((copies[0], bad), (bad, copies[1])):
        with pytest.raises(kvcore.InvalidArgumentError, match=r"apply_copies: layer \d's copy 0 \(row 4096 -> row 0\)"):
            pool.apply_copies(refused)
        assert layer_bytes() == before
    pool.apply_copies(copies)
    assert layer_bytes() != before  # the copies do change rows: the checks above could fail


def test_torch_paged_pool_writes_a_tree_and_applies_its_commit() -> None:
    torch = need("torch")
    from kvcore.torch.paged import TorchPagedKVPool

    c = small()
    kv = TorchPagedKVPool(c)
    step = c.begin_step([(0, 5, None, [-1, 0, 0, 1, 2])])
    plan = step.plan()
    rows = [c.used_blocks(g) * c.block_size for g in range(c.n_groups)]
    for layer in range(c.n_layers):
        slots = torch.from_numpy(plan.groups[c.group_of(layer)].slots.astype(np.int64))
        node = torch.arange(5, dtype=torch.float32).reshape(1, 1, 5, 1).expand(1, 1, 5, 2).contiguous()
        kv.write_read(layer, slots, node, node, rows[c.group_of(layer)])
    copies = c.commit(step, accepted={0: [0, 2, 4]})
    with pytest.raises(kvcore.InvalidArgumentError, match="apply_copies: 1 arrays of copies for 2 groups"):
        kv.apply_copies(copies[:1])
    # A bad row in a later group refuses before the first group's copies run: no byte changes.
    before = [bytes(t.numpy().tobytes()) for layer in range(c.n_layers) for t in kv.ensure(layer, 1)]
    outside = np.array([[c.num_blocks(1) * c.block_size, 0]])
    with pytest.raises(kvcore.InvalidArgumentError, match=r"apply_copies: copies\[1\]\[0\] \(row \d+ to row 0\)"):
        kv.apply_copies((copies[0], outside))
    with pytest.raises(kvcore.InvalidArgumentError, match=r"copies\[1\] must be an \(n, 2\) int array"):
        kv.apply_copies((copies[0], [1, 2, 3]))
    unwritten = np.array([[kv.allocated_rows(c.n_layers - 1), 0]])  # in the pool, past the tensors
    assert c.group_of(c.n_layers - 1) == 1 and unwritten[0, 0] < c.num_blocks(1) * c.block_size
    with pytest.raises(kvcore.InvalidStateError, match="write the tree step first"):
        kv.apply_copies((copies[0], unwritten))
    assert [bytes(t.numpy().tobytes()) for layer in range(c.n_layers) for t in kv.ensure(layer, 1)] == before
    kv.apply_copies(copies)
    assert [bytes(t.numpy().tobytes()) for layer in range(c.n_layers) for t in kv.ensure(layer, 1)] != before
    nxt = c.begin_step([(0, 1)])
    for layer in range(c.n_layers):
        table = nxt.plan().groups[c.group_of(layer)].block_tables[0]
        keys, _ = kv.ensure(layer, 1)
        for d, node_id in enumerate([0, 2, 4]):
            p = 5 + d
            assert float(keys[0, 0, table[p // 2] * 2 + p % 2, 0]) == node_id
