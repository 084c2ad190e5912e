"""BatchCache's State groups from Python (docs/batch.md section 10).

A simulated backend keeps one "state" per physical slot: the tuple of tokens
the state has absorbed. Each step reads, per token, the slot the plan's
read_slots names (or zeros / the state carried within the forward at -1) and
writes the state after the token where write_slots says. Whatever the cache
plans, every read must find the state of exactly the history before the token.
"""

from __future__ import annotations

import itertools
import textwrap
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pytest

import kvcore
from blank_probe import assert_blank_objects_refuse_every_use
from kvcore import BatchCache, InvalidArgumentError, InvalidStateError
from kvcore.state import RecordInfo

D = 3  # the State layers' slots: a verify step takes T <= 2


def hybrid(slots: int = D, max_step: int = 6) -> BatchCache:
    """Flat, State(slots), Flat, State(slots): one block group and one State group."""
    layers = [
        kvcore.LayerConfig(kvcore.Flat(), 1, 2),
        kvcore.LayerConfig(kvcore.State(slots)),
        kvcore.LayerConfig(kvcore.Flat(), 1, 2),
        kvcore.LayerConfig(kvcore.State(slots)),
    ]
    limits = kvcore.BatchLimits(block_size=2, max_seqs=3, num_blocks=64)
    return BatchCache(kvcore.CacheConfig(32, layers, max_step=max_step, batch=limits))


State = tuple[int, ...]


class StateStore:
    """The state in each physical slot of the one State group, and each sequence's tokens."""

    def __init__(self, cache: BatchCache) -> None:
        self.cache = cache
        self.slots: dict[int, State] = {}
        self.history: dict[int, list[int]] = {}
        self.pending: tuple[list[int], dict[int, Sequence[int]], dict[int, Sequence[int]] | None] = ([], {}, None)

    def run(self, step: kvcore.BatchStep, tokens: dict[int, Sequence[int]], parents: dict[int, Sequence[int]] | None = None) -> None:
        """The forward of `step`: entry i's tokens (and tree) as given, in entry order."""
        plan = step.plan()
        (sp,) = plan.state_groups
        reads, writes = sp.read_slots, sp.write_slots
        ((r2, w2),) = plan.state_arrays()
        assert np.array_equal(r2, reads) and np.array_equal(w2, writes)
        for a in (reads, writes):
            assert a.dtype == np.int32 and a.shape == (plan.n_tokens,) and not a.flags.writeable
            assert ((a >= -1) & (a < self.cache.num_state_slots(0))).all()
        qs = plan.query_starts
        for i, seq in enumerate(plan.seq_ids.tolist()):
            L = int(plan.first_positions[i])
            toks = list(tokens[seq])
            par = list(parents[seq]) if parents and seq in parents else [j - 1 for j in range(len(toks))]
            before: State = tuple(self.history[seq][:L])
            after: list[State] = []
            for j, tok in enumerate(toks):
                t = int(qs[i]) + j
                prev = before if par[j] < 0 else after[par[j]]
                r = int(reads[t])
                if r >= 0:
                    assert self.slots[r] == prev, f"seq {seq} token {j} read slot {r}"
                elif par[j] < 0:
                    assert L == 0, f"seq {seq} at length {L} read no slot"
                else:  # carried within the forward: the parent's state was not kept
                    assert par[j] == j - 1 and int(writes[t - 1]) == -1
                after.append(prev + (tok,))
                if int(writes[t]) >= 0:
                    self.slots[int(writes[t])] = after[j]
            self.pending = (plan.seq_ids.tolist(), tokens, parents)

    def commit(
        self, step: kvcore.BatchStep, accepted: dict[int, list[int]] | None = None
    ) -> tuple[npt.NDArray[np.int32], ...]:
        """Commits `step` (applying its slot copies) and returns what commit returned."""
        seqs, tokens, _ = self.pending
        if accepted is None:
            assert step.commit() is None
            for s in seqs:
                self.history[s] = self.history[s][: self.cache.length(s) - len(tokens[s])] + list(tokens[s])
            return ()
        copies = step.commit(accepted)
        n = self.cache.n_groups
        assert len(copies) == n + self.cache.n_state_groups
        for src, dst in copies[n].tolist():  # the State group's slot copies, in order
            self.slots[dst] = self.slots[src]
        for s in seqs:
            path = accepted.get(s, list(range(len(tokens[s]))))
            L = self.cache.length(s) - len(path)
            self.history[s] = self.history[s][:L] + [tokens[s][j] for j in path]
        return copies

    def decode(self, seq_tokens: dict[int, Sequence[int]], verify: bool | list[bool] = False) -> None:
        seqs = list(seq_tokens)
        step = self.cache.begin_step([(s, len(seq_tokens[s])) for s in seqs], verify=verify)
        self.run(step, seq_tokens)
        self.commit(step)


def test_state_groups_name_their_layers_policy_and_slots() -> None:
    c = hybrid()
    assert c.n_groups == 1 and c.n_state_groups == 1
    assert [c.state_group_of(layer) for layer in (1, 3)] == [0, 0]
    assert c.state_group_policy(0) == kvcore.State(D) and c.state_group_policy(0).slots == D
    assert c.num_state_slots(0) == c.max_active_seqs * D + min(c.max_step_tokens, c.max_active_seqs * D)
    plain = BatchCache(kvcore.CacheConfig(16, [kvcore.LayerConfig(kvcore.Flat(), 1, 2)], max_step=2))
    assert plain.n_state_groups == 0
    plain.add_sequence(0)
    step = plain.begin_step([(0, 2)], verify=True)  # ignored without State layers
    assert step.plan().state_groups == () and step.plan().state_arrays() == () and step.plan().n_state_groups == 0


def test_a_chain_decode_reads_at_each_token_the_state_the_previous_token_wrote() -> None:
    c = hybrid()
    store = StateStore(c)
    for s in (0, 1):
        c.add_sequence(s)
        store.history[s] = []
    store.decode({0: [1, 2, 3, 4], 1: [9]})  # a prefill of T = 4 = D + 1 and one token
    for k in range(8):
        store.decode({0: [10 + k], 1: [20 + k, 30 + k] if k % 2 else [20 + k]})
    assert c.length(0) == 12 and c.length(1) == 1 + 4 * 1 + 4 * 2
    step = c.begin_step([(0, 1)])
    (sp,) = step.plan().state_groups
    assert sp.state_group == 0 and sp.slots_per_seq == D and sp.num_slots == c.num_state_slots(0)
    assert sp.policy == kvcore.State(D) and "StateGroupPlan(state_group=0" in repr(sp)
    assert store.slots[int(sp.read_slots[0])] == tuple(store.history[0])
    step.abort()
    with pytest.raises(InvalidStateError):
        sp.read_slots  # the step ended


def test_a_chain_step_keeps_only_its_last_state_a_verify_step_every_state() -> None:
    c = hybrid()
    store = StateStore(c)
    c.add_sequences([0, 1])
    store.history = {0: [], 1: []}
    store.decode({0: [1, 2, 3], 1: [1, 2, 3]})
    step = c.begin_step([(0, 2), (1, 2)], verify=[False, True])
    (sp,) = step.plan().state_groups
    assert int(sp.write_slots[0]) == -1 and int(sp.read_slots[1]) == -1  # entry 0: the state carried
    assert (sp.write_slots[2:] >= 0).all() and int(sp.read_slots[3]) == int(sp.write_slots[2])
    store.run(step, {0: [4, 5], 1: [4, 5]})
    store.commit(step)
    assert not c.can_rewind(0, 4) and c.can_rewind(1, 4)  # the state after position 3 is kept by verify only
    with pytest.raises(InvalidStateError):
        c.rewind(0, 4)
    c.rewind(1, 4)  # into the verify step: the next token reads the state after position 3
    store.history[1] = store.history[1][:4]
    store.decode({0: [6], 1: [7]})
    store.decode({1: [8, 9]}, verify=True)
    assert c.length(1) == 7 and store.history[1] == [1, 2, 3, 4, 7, 8, 9]


def test_verify_over_arrays_and_a_partial_commit_of_a_verify_chain() -> None:
    c = hybrid()
    store = StateStore(c)
    c.add_sequences([0, 1])
    store.history = {0: [], 1: []}
    store.decode({0: [1, 2], 1: [3]})
    step = c.begin_step(np.array([0, 1]), 2, tokens=np.array([5, 6, 7, 8]), verify=np.array([True, True]))
    store.run(step, {0: [5, 6], 1: [7, 8]})
    store.commit(step, {0: [0]})  # a verify chain may be committed short; seq 1 commits whole
    assert c.length(0) == 3 and c.length(1) == 3
    store.decode({0: [9], 1: [9]})


def test_a_fork_reads_the_parents_state_and_shares_its_slots() -> None:
    c = hybrid()
    store = StateStore(c)
    c.add_sequence(0)
    store.history[0] = []
    store.decode({0: [1, 2]})
    store.decode({0: [3, 4]}, verify=True)
    c.fork(0, 1)
    c.fork(0, 2, 3)
    store.history[1] = list(store.history[0])
    store.history[2] = store.history[0][:3]
    step = c.begin_step([(0, 1), (1, 1), (2, 1)])
    (sp,) = step.plan().state_groups
    assert int(sp.read_slots[0]) == int(sp.read_slots[1])  # the child names the parent's slot
    assert len(set(sp.write_slots.tolist())) == 3  # a shared slot is not written in place
    store.run(step, {0: [5], 1: [6], 2: [7]})
    store.commit(step)
    store.decode({0: [8], 1: [9], 2: [10]})
    assert store.history[2] == [1, 2, 3, 7, 10]


def rewinds(c: BatchCache | kvcore.SequenceCache, seq: int | None = None) -> list[int]:
    """The lengths can_rewind allows, from 0 to the length."""
    if seq is None:
        assert isinstance(c, kvcore.SequenceCache)
        return [n for n in range(c.length + 1) if c.can_rewind(n)]
    assert isinstance(c, BatchCache)
    return [n for n in range(c.length(seq) + 1) if c.can_rewind(seq, n)]


def state4_flat() -> kvcore.CacheConfig:
    layers = [kvcore.LayerConfig(kvcore.State(4)), kvcore.LayerConfig(kvcore.Flat(), 1, 4)]
    return kvcore.CacheConfig(32, layers, max_step=4, batch=kvcore.BatchLimits(block_size=2, max_seqs=2))


@pytest.mark.parametrize("forked, seq", [(True, 0), (True, 1), (False, 0)])
def test_an_aborted_step_loses_the_state_slots_it_writes_even_fresh_ones(forked: bool, seq: int) -> None:
    """docs/batch.md sections 3 and 10 (issue 41, item 7): the rewind answers after an abort
    follow from the sequence's own steps, as a SequenceCache's do, whether or not a fork
    still names the slot the step wrote afresh; the sharer keeps its answers."""
    c = BatchCache(state4_flat())
    c.add_sequence(0)
    first = c.begin_step([(0, 3)], verify=True)
    old = int(first.plan().state_groups[0].write_slots[0])  # the state after position 0
    first.commit()
    if forked:
        c.fork(0, 1)
    step = c.begin_step([(seq, 2)], verify=True)
    assert (int(step.plan().state_groups[0].write_slots[1]) == old) is not forked  # fresh when shared
    step.abort()
    assert rewinds(c, seq) == [0, 2, 3]
    if forked:
        assert rewinds(c, 1 - seq) == [0, 1, 2, 3]
    one = kvcore.SequenceCache(state4_flat())
    one.commit(one.begin_step(3, verify=True))
    one.abort(one.begin_step(2, verify=True))
    assert rewinds(one) == [0, 2, 3]


def test_a_record_carries_the_run_of_states_ending_at_the_last_one() -> None:
    """docs/state.md (issue 41, item 7): State(5), a verify step of 3, then a plain step of 2:
    the state after 3 was never kept, so the record carries only the state after 4 and the
    importer rewinds to 0 and 5, the exporter also to 1, 2 and 3."""
    layers = [kvcore.LayerConfig(kvcore.State(5)), kvcore.LayerConfig(kvcore.Flat(), 1, 4)]
    cfg = kvcore.CacheConfig(32, layers, max_step=4, batch=kvcore.BatchLimits(block_size=2, max_seqs=2))
    tensors = {"h": ((2,), np.float32)}
    c = BatchCache(cfg)
    pool = kvcore.PagedKVPool(c, np.float32, state_tensors=tensors)
    c.add_sequence(0)
    c.commit(c.begin_step([(0, 3)], verify=True))
    c.commit(c.begin_step([(0, 2)]))
    assert rewinds(c, 0) == [0, 1, 2, 3, 5]
    record = pool.export_sequence(0)
    assert RecordInfo.of(record).layers[0].held_from == 4  # only the state after 4
    to = BatchCache(cfg)
    kvcore.PagedKVPool(to, np.float32, state_tensors=tensors).import_sequence(1, record)
    assert rewinds(to, 1) == [0, 5]
    one = kvcore.SequenceCache(cfg)
    kvcore.KVPool(one, np.float32, state_tensors=tensors).import_sequence(record)
    assert rewinds(one) == [0, 5]


def snapshot_cache(snapshots: int) -> BatchCache:
    layers = [kvcore.LayerConfig(kvcore.Flat(), 1, 2), kvcore.LayerConfig(kvcore.State(D))]
    limits = kvcore.BatchLimits(block_size=2, max_seqs=3, num_blocks=64, state_snapshots=snapshots)
    return BatchCache(kvcore.CacheConfig(32, layers, max_step=6, batch=limits))


def test_a_prompt_starts_from_a_named_state_snapshot_and_never_writes_it() -> None:
    c = snapshot_cache(2)
    limits = kvcore.BatchLimits(block_size=2, state_snapshots=2)
    assert limits.state_snapshots == 2 and "state_snapshots=2" in repr(limits)
    assert c.num_state_slots(0) == c.max_active_seqs * D + min(c.max_step_tokens, c.max_active_seqs * D) + 2
    store = StateStore(c)
    c.add_sequence(0)
    store.history[0] = []
    prompt = [7, 8, 9, 10, 11]
    for chunk in ([7, 8], [9, 10]):  # a prefill whose steps end on full blocks: each names its state
        step = c.begin_step([(0, len(chunk), chunk)])
        store.run(step, {0: chunk})
        store.commit(step)
    assert c.state_snapshots(0) == 2
    c.add_sequence(1)
    assert c.adopt_prefix(1, prompt) == 4  # the state after position 3 is named: its prefix hits
    store.history[1] = prompt[:4]
    assert c.can_rewind(1, 4) and not c.can_rewind(1, 2)
    step = c.begin_step([(1, 1, [11]), (0, 3, [1, 2, 3])])
    (sp,) = step.plan().state_groups
    snapshot = int(sp.read_slots[0])
    assert int(sp.read_slots[1]) == snapshot and snapshot not in sp.write_slots.tolist()
    store.run(step, {1: [11], 0: [1, 2, 3]})  # checks each read against the token history
    store.commit(step)
    assert store.slots[snapshot] == (7, 8, 9, 10)  # still the prompt's state
    c.add_sequence(2, namespace=5)
    assert c.adopt_prefix(2, prompt) == 0  # another namespace: no snapshot of its own


def test_without_state_snapshots_a_model_with_state_layers_never_hits_and_bad_limits_are_refused() -> None:
    c = snapshot_cache(0)
    c.add_sequence(0)
    c.begin_step([(0, 2, [1, 2])]).commit()
    c.add_sequence(1)
    assert c.state_snapshots(0) == 0 and c.adopt_prefix(1, [1, 2, 3]) == 0
    with pytest.raises(InvalidArgumentError, match=r"^batch.state_snapshots = -1: must be in \[0, 1048576\]$"):
        snapshot_cache(-1)
    with pytest.raises(InvalidArgumentError, match=r"^state_group = 1: must be in \[0, n_state_groups = 1\)"):
        c.state_snapshots(1)


def state_block_cache(state_block_size: int, in_pool: bool = False) -> BatchCache:
    layers = [kvcore.LayerConfig(kvcore.Flat(), 1, 2), kvcore.LayerConfig(kvcore.State(D))]
    limits = kvcore.BatchLimits(block_size=2, max_seqs=3, num_blocks=64, state_snapshots=16,
                                state_block_size=state_block_size, states_in_pool=in_pool)
    return BatchCache(kvcore.CacheConfig(32, layers, max_step=6, batch=limits))


@pytest.mark.parametrize("in_pool", [False, True], ids=["apart", "in_pool"])
@pytest.mark.parametrize("state_block_size", [0, 2, 4, 6])
def test_a_state_block_names_states_only_on_its_multiples(state_block_size: int, in_pool: bool) -> None:
    """docs/batch.md section 10, "The State groups' block": a decode of 12 tokens names the state
    only at multiples of state_block_size (0: block_size), and every prompt sharing n of its tokens
    hits the largest multiple at most n, starting from the state of exactly those tokens."""
    c = state_block_cache(state_block_size, in_pool)
    every = state_block_size or c.block_size
    assert c.state_block_size == every
    store = StateStore(c)
    c.add_sequence(0)
    store.history[0] = []
    tokens = list(range(10, 22))
    for tok in tokens:  # decode steps that give their token ids: the cache names by them
        step = c.begin_step([(0, 1, [tok])])
        store.run(step, {0: [tok]})
        store.commit(step)
    assert c.state_snapshots(0) == len(tokens) // every
    for n in range(len(tokens) + 2):
        prompt = tokens[:n] + [99]
        expected = min(n, len(tokens)) // every * every
        assert c.lookup_prefix(prompt) == expected, n
        c.add_sequence(1)
        assert c.adopt_prefix(1, prompt) == expected, n
        store.history[1] = prompt[:expected]
        step = c.begin_step([(1, 1, [prompt[expected]])])
        store.run(step, {1: [prompt[expected]]})  # reads the state of exactly prompt[:expected]
        step.abort()
        c.release_sequence(1)


def test_a_record_names_its_state_at_any_full_block_whatever_the_state_block() -> None:
    """A step ending at 6 names nothing when state_block_size is 4; a trusted import of the same
    sequence names its state there (the record carries no other), so the prefix of 6 hits."""
    layers = [kvcore.LayerConfig(kvcore.Flat(), 1, 2), kvcore.LayerConfig(kvcore.State(D))]
    cfg = kvcore.CacheConfig(32, layers, max_step=6, batch=kvcore.BatchLimits(
        block_size=2, max_seqs=3, state_snapshots=4, state_block_size=4))
    tensors = {"h": ((2,), np.float32)}
    src, dst = BatchCache(cfg), BatchCache(cfg)
    pool = kvcore.PagedKVPool(src, np.float32, state_tensors=tensors)
    prompt = [5, 6, 7, 8, 9, 10, 11]
    src.add_sequence(0)
    src.begin_step([(0, 6, prompt[:6])]).commit()
    assert src.state_snapshots(0) == 0 and src.lookup_prefix(prompt) == 0
    kvcore.PagedKVPool(dst, np.float32, state_tensors=tensors).import_sequence(
        1, pool.export_sequence(0, prompt[:6]), trust_tokens=True)
    assert dst.state_snapshots(0) == 1 and dst.lookup_prefix(prompt) == 6


@pytest.mark.parametrize("value", [3, 1, 34, -2], ids=["not_a_multiple", "below_block", "past_capacity", "negative"])
def test_a_bad_state_block_is_refused_naming_it(value: int) -> None:
    with pytest.raises(InvalidArgumentError, match=rf"^batch.state_block_size = {value}: must be a multiple of "
                       r"batch.block_size = 2 in \[block_size, capacity = 32\] \(or 0 for block_size\)$"):
        state_block_cache(value)
    limits = kvcore.BatchLimits(block_size=2, state_block_size=8)
    assert limits.state_block_size == 8 and "state_block_size=8" in repr(limits)
    # block_size itself is the default rule, even past a capacity shorter than one block.
    layers = [kvcore.LayerConfig(kvcore.Flat(), 1, 2), kvcore.LayerConfig(kvcore.State(D))]
    short = BatchCache(kvcore.CacheConfig(10, layers, max_step=4, batch=kvcore.BatchLimits(
        block_size=16, max_seqs=1, state_block_size=16)))
    assert short.state_block_size == 16


@pytest.mark.parametrize("path", [[0, 1, 3], [0, 2, 4], [0, 2], [0, 1], [0]])
def test_a_tree_commits_slot_copies_that_land_the_accepted_states_as_a_chain_would(path: list[int]) -> None:
    c = hybrid(slots=6)  # a tree keeps every node's state: N <= slots - 1
    store = StateStore(c)
    c.add_sequences([0, 1])
    store.history = {0: [], 1: []}
    store.decode({0: [1, 2, 3], 1: [4]})
    parents = [-1, 0, 0, 1, 2]  # depth 0, 1, 1, 2, 2: positions 3 .. 5
    tokens = [10, 11, 12, 13, 14]
    step = c.begin_step([(0, 5, tokens, parents), (1, 1)])
    assert step.plan().is_tree(0)
    chain_index = step.plan().chain_index[:5].tolist()  # the main line 0, 1, 3 keeps its place
    store.run(step, {0: tokens, 1: [5]}, {0: parents})
    copies = store.commit(step, {0: path})  # applies the State group's slot copies
    n = c.n_groups
    assert len(copies) == n + 1 and copies[n].dtype == np.int32 and copies[n].shape[1:] == (2,)
    assert store.history[0] == [1, 2, 3] + [tokens[j] for j in path]
    on_main_line = all(chain_index[node] == d for d, node in enumerate(path))
    assert on_main_line == (path in ([0], [0, 1], [0, 1, 3]))
    assert (len(copies[n]) == 0) == on_main_line
    assert c.length(0) == 3 + len(path)
    for m in range(len(path)):  # every accepted state is kept, as a verify chain's
        assert c.can_rewind(0, 4 + m)
    store.decode({0: [20], 1: [21]})  # reads the accepted path's last state from its chain slot
    c.rewind(0, 3 + len(path))
    store.history[0] = store.history[0][: 3 + len(path)]
    if len(path) > 1:
        c.rewind(0, 4)  # into the tree: the root's state
        store.history[0] = store.history[0][:4]
    store.decode({0: [22]})


def test_refusals_name_the_value_and_change_nothing() -> None:
    c = hybrid()
    c.add_sequences([0, 1])
    c.commit(c.begin_step([(0, 2), (1, 1)]))
    with pytest.raises(InvalidArgumentError, match=r"state_group_of\(layer = 0\): not a State layer"):
        c.state_group_of(0)
    with pytest.raises(InvalidArgumentError, match=r"group_of\(layer = 1\): a State layer has no block group"):
        c.group_of(1)
    for bad in (-1, 1):
        with pytest.raises(InvalidArgumentError):
            c.state_group_policy(bad)
        with pytest.raises(InvalidArgumentError):
            c.num_state_slots(bad)
    begun = c.begin_step([(0, 1)])
    before = [c.length(0), c.length(1), c.free_blocks(0)]
    refusals: list[tuple[dict[str, object], str]] = [
        ({"verify": True}, r"sequence 0 with T = 3: a verify step keeps the state after each of its positions"),
        ({"verify": [False, True]}, r"sequence 1 with T = 3"),
        ({"verify": "yes"}, r"verify = 'yes': must be a bool, or one bool per entry"),
        ({"verify": 2}, r"verify = 2: must be a bool, or one bool per entry"),
        ({"verify": [True, None]}, r"verify\[1\] = None: must be a bool"),
        ({"verify": [True]}, r"verify has 1 values for 2 entries"),
        ({"verify": [True, False, True]}, r"verify has more than 2 values for 2 entries"),
        ({"verify": itertools.repeat(True)}, r"verify has more than 2 values for 2 entries"),  # endless: ends
    ]
    for kwargs, message in refusals:
        with pytest.raises(InvalidArgumentError, match=message):
            c.begin_step([(0, 3), (1, 3)], **kwargs)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match=message):
            c.step(np.array([0, 1]), 3, **kwargs)  # type: ignore[arg-type]
        assert begun.is_current and [c.length(0), c.length(1), c.free_blocks(0)] == before
    assert begun.plan().state_groups[0].read_slots.shape == (1,)
    c.commit(begun)
    c.commit(c.begin_step([(0, 2), (1, 2)], verify=[np.True_, 0]))  # numpy bools and 0 / 1 are bools too
    assert c.can_rewind(0, 4) and not c.can_rewind(1, 2)


def _writes(plan: kvcore.BatchStepPlan) -> npt.NDArray[np.int32]:
    return plan.state_groups[0].write_slots


def test_the_plan_help_names_units() -> None:
    assert "physical" in (kvcore.StateGroupPlan.read_slots.__doc__ or "")
    assert "-1" in (kvcore.StateGroupPlan.write_slots.__doc__ or "")
    assert "verify" in (BatchCache.begin_step.__doc__ or "")
    assert "State group" in (BatchCache.commit.__doc__ or "")
    c = hybrid()
    c.add_sequence(0)
    assert _writes(c.begin_step([(0, 2)], verify=True).plan()).tolist() != [-1, -1]


BLANK_SETUP = textwrap.dedent(
    """
    import kvcore, kvcore._core

    def fresh():
        layers = [kvcore.LayerConfig(kvcore.Flat(), 1, 2), kvcore.LayerConfig(kvcore.State(3))]
        limits = kvcore.BatchLimits(block_size=2, max_seqs=2, num_blocks=16)
        cache = kvcore.BatchCache(kvcore.CacheConfig(16, layers, max_step=4, batch=limits))
        cache.add_sequence(0)
        step = cache.begin_step([(0, 2)], verify=True)
        plan = step.plan()
        live = {"BatchCache": cache, "BatchStepPlan": plan, "StateGroupPlan": plan.state_groups[0]}
        return live, cache, step

    calls = {
        "BatchCache": ["n_state_groups", "state_group_of(1)", "state_group_policy(0)", "num_state_slots(0)",
                       "begin_step([(0, 1)], verify=True)"],
        "BatchStepPlan": ["n_state_groups", "state_groups", "state_arrays()"],
        "StateGroupPlan": ["state_group", "read_slots", "write_slots", "slots_per_seq", "num_slots", "policy",
                           "__repr__()"],
    }
    uses = []
    """
)


def test_state_objects_made_by_new_without_init_refuse_every_use() -> None:
    assert_blank_objects_refuse_every_use(BLANK_SETUP)
