"""PagedKVPool and TorchPagedKVPool store a BatchCache's Shared and State layers (docs/layer_kinds.md).

A Shared layer stores nothing and reads its source's rows; a State layer keeps its State group's
physical slots of named state tensors. A random run (plain, verify and tree steps, forks,
rewinds, aborts, tree commits with slot copies, releases) drives one cache and both pools: every
state a step starts from must equal, in both pools, the state written for position p - 1 (zeros
at 0), kept by a reference store keyed by (sequence, position); every Shared read equals its
source's; refusals change nothing.
"""

from __future__ import annotations

import random

import numpy as np
import numpy.typing as npt
import pytest
from needs import need

import kvcore
from kvcore import BatchCache, InvalidArgumentError, InvalidStateError, NotSupportedError

torch = need("torch")
from kvcore.torch import TorchPagedKVPool  # noqa: E402

# Layers: 0 Flat, 1 Ring(4), 2 Shared(0), 3 State(4), 4 State(4), 5 Shared(1).
STATE_LAYERS = (3, 4)
TENSORS = {"conv": ((2, 3), np.float32), "ssm": ((4,), np.int16)}


def kinds_cache() -> BatchCache:
    kv = kvcore.LayerConfig(kvcore.Flat(), 2, 3)
    layers = [
        kv,
        kvcore.LayerConfig(kvcore.Ring(4), 2, 3),
        kvcore.LayerConfig(kvcore.Shared(0), 2, 3),
        kvcore.LayerConfig(kvcore.State(4)),
        kvcore.LayerConfig(kvcore.State(4)),
        kvcore.LayerConfig(kvcore.Shared(1), 2, 3),
    ]
    limits = kvcore.BatchLimits(block_size=2, max_seqs=3, num_blocks=64)
    return BatchCache(kvcore.CacheConfig(40, layers, max_step=4, batch=limits))


def random_state(rng: np.random.Generator, n: int) -> dict[str, npt.NDArray[np.generic]]:
    return {
        "conv": rng.standard_normal((n, 2, 3)).astype(np.float32),
        "ssm": rng.integers(-1000, 1000, (n, 4)).astype(np.int16),
    }


def zeros() -> dict[str, npt.NDArray[np.generic]]:
    return {name: np.zeros(shape, dtype) for name, (shape, dtype) in TENSORS.items()}


def test_a_shared_layer_stores_nothing_and_a_state_layer_its_groups_slots() -> None:
    cache = kinds_cache()
    pool = kvcore.PagedKVPool(cache, np.float32, state_tensors=TENSORS)
    slots = cache.num_state_slots(0)
    assert pool.allocated_rows(2) == 0 and pool.allocated_rows(5) == 0
    assert pool.state_names(3) == ["conv", "ssm"]
    conv = pool.state_slots(3, "conv")
    assert conv.shape == (slots, 2, 3) and conv.dtype == np.float32 and not conv.flags.writeable
    assert not conv.any()
    assert pool.state_slots(4, "ssm").shape == (slots, 4)
    # Each State layer's slots are stored in full from the start (16-byte aligned tensors in a slot: 32 + 16).
    assert pool.nbytes == 2 * slots * 48
    more = kvcore.PagedKVPool.required_bytes(cache, np.float32, state_tensors=TENSORS)
    assert more >= 2 * slots * 48
    with pytest.raises(InvalidArgumentError, match="layer 3 is a State layer and has no state tensors"):
        kvcore.PagedKVPool(cache, np.float32)
    with pytest.raises(InvalidArgumentError, match="state_slots of layer 0: a Flat layer has no state slots"):
        pool.state_slots(0, "conv")
    with pytest.raises(InvalidArgumentError, match="rows of layer 3: a State layer holds state slots"):
        pool.rows(3)
    with pytest.raises(InvalidArgumentError, match="no tensor 'h'"):
        pool.state_slots(3, "h")
    store = TorchPagedKVPool(cache)
    assert store.state_layers == STATE_LAYERS and store.num_state_slots == [slots]
    assert store.tensors(2) is None and store.state_slots(3, "conv") is None
    with pytest.raises(InvalidArgumentError, match="tensors of layer 3: a State layer holds state slots"):
        store.tensors(3)
    with pytest.raises(NotSupportedError, match="export: layer 2 is a Shared layer: a torch pool's records carry"):
        store.export_sequence(0)


class Run:
    """One cache, both pools, and the reference: per sequence and State layer, position -> state after it."""

    def __init__(self, seed: int) -> None:
        self.rnd = random.Random(seed)
        self.rng = np.random.default_rng(seed)
        self.cache = kinds_cache()
        self.pool = kvcore.PagedKVPool(self.cache, np.float32, initial_rows=4, state_tensors=TENSORS)
        self.store = TorchPagedKVPool(self.cache)
        self.ref: dict[int, dict[int, dict[int, dict[str, npt.NDArray[np.generic]]]]] = {}
        self.counts = {"steps": 0, "reads": 0, "copies": 0, "trees": 0, "shared": 0, "refusals": 0}

    def active(self) -> list[int]:
        return [s for s in range(3) if self.cache.sequence(s).active]

    def truncate(self, seq: int, n: int) -> None:
        for by_pos in self.ref.get(seq, {}).values():
            for p in [p for p in by_pos if p >= n]:
                del by_pos[p]

    def check_read(self, layer: int, step: kvcore.BatchStep, t: int, want: dict[str, npt.NDArray[np.generic]]) -> None:
        got = self.pool.read_state(layer, step, t)
        sp = step.plan().state_groups[self.cache.state_group_of(layer)]
        for name in TENSORS:
            assert np.array_equal(got[name], want[name]), f"layer {layer} token {t} {name}"
            torch_got = self.store.read_state(layer, name, sp.read_slots[t : t + 1])
            if torch_got is not None:
                assert np.array_equal(torch_got[0].numpy(), want[name]), f"torch layer {layer} token {t} {name}"
        self.counts["reads"] += 1

    def check_shared(self, step: kvcore.BatchStep, rows: list[int]) -> None:
        plan = step.plan()
        for shared, source in ((2, 0), (5, 1)):
            a, b = self.pool.rows(shared), self.pool.rows(source)
            assert all(np.shares_memory(x, y) and np.array_equal(x, y) for x, y in zip(a, b))
            for e in range(plan.n_entries):
                ga, gb = self.pool.gather(shared, step, e), self.pool.gather(source, step, e)
                assert all(np.array_equal(x, y) for x, y in zip(ga, gb))
            g = self.cache.group_of(source)
            ta, tb = self.store.read(shared, rows[g]), self.store.read(source, rows[g])
            assert all(x.data_ptr() == y.data_ptr() and torch.equal(x, y) for x, y in zip(ta, tb))
            self.counts["shared"] += 1

    def check_refusals(self, step: kvcore.BatchStep, slots: list[torch.Tensor], rows: list[int]) -> None:
        plan = step.plan()
        before = [self.pool.state_slots(layer, name).copy() for layer in STATE_LAYERS for name in TENSORS]
        kv_before = [a.copy() for a in self.pool.rows(0)]
        n = plan.n_tokens
        k = np.ones((n, 2, 3), np.float32)
        with pytest.raises(InvalidArgumentError, match="update: layer 2 is Shared\\(0\\): it writes nothing; update layer 0"):
            self.pool.update(2, step, k, k)
        with pytest.raises(InvalidArgumentError, match="update of layer 3: a State layer holds state slots"):
            self.pool.update(3, step, k, k)
        with pytest.raises(InvalidArgumentError, match="write_read: layer 2 is Shared\\(0\\): it writes nothing; write layer 0"):
            self.store.write_read(2, slots[0], torch.ones(1, 2, n, 3), torch.ones(1, 2, n, 3), rows[0])
        with pytest.raises(InvalidArgumentError, match="states lacks 'ssm'"):
            kept = int((plan.state_groups[0].write_slots >= 0).sum())
            self.pool.write_state(3, step, {"conv": np.zeros((kept, 2, 3), np.float32)})
        with pytest.raises(InvalidArgumentError, match=f"must be \\(n, 2, 3\\) with n = {kept}"):
            self.pool.write_state(3, step, random_state(self.rng, kept + 1))
        with pytest.raises(InvalidArgumentError, match="apply_copies: copies must hold one"):
            self.pool.apply_copies([np.zeros((0, 2), np.int32)] * self.cache.n_groups)
        top = self.cache.num_state_slots(0)
        bad = [np.zeros((0, 2), np.int32)] * self.cache.n_groups + [np.array([[0, top]], np.int32)]
        with pytest.raises(InvalidArgumentError, match=f"State layer 3's copy 0 \\(slot 0 -> slot {top}\\)"):
            self.pool.apply_copies(bad)
        with pytest.raises(InvalidArgumentError, match=f"slot 0 to slot {top}\\) must lie in slots"):
            self.store.apply_copies(bad)
        with pytest.raises(InvalidArgumentError, match="slots reach"):
            self.store.write_state(3, "conv", [top], torch.zeros(1, 2, 3))
        after = [self.pool.state_slots(layer, name) for layer in STATE_LAYERS for name in TENSORS]
        assert all(np.array_equal(x, y) for x, y in zip(before, after))
        assert all(np.array_equal(x, y) for x, y in zip(kv_before, self.pool.rows(0)))
        self.counts["refusals"] += 9

    def step(self) -> None:
        seqs = self.active()
        self.rnd.shuffle(seqs)
        entries, kinds = [], []
        for s in seqs[: self.rnd.randint(1, 3)]:
            kind = self.rnd.randint(0, 2)
            T = self.rnd.randint(1, 4) if kind == 0 else self.rnd.randint(1, 3) if kind == 1 else self.rnd.choice((1, 3, 3))
            parents = [-1] + [self.rnd.randint(0, j - 1) for j in range(1, T)] if kind == 2 else None
            entries.append((s, T, None, parents) if parents else (s, T))
            kinds.append(kind)
        if not entries:
            return
        try:
            step = self.cache.begin_step(entries, verify=[k == 1 for k in kinds])
        except (kvcore.CapacityError, InvalidStateError):
            return  # out of blocks, a state lost to an abort: the cache's own tests check those
        self.counts["steps"] += 1
        plan = step.plan()
        n = plan.n_tokens
        slots, rows = [], []
        for g in range(self.cache.n_groups):
            slots.append(torch.from_numpy(plan.groups[g].slots.astype(np.int64)))
            rows.append(self.cache.used_blocks(g) * self.cache.block_size)
        for layer in (0, 1):
            g = self.cache.group_of(layer)
            k = self.rng.standard_normal((n, 2, 3)).astype(np.float32)
            v = self.rng.standard_normal((n, 2, 3)).astype(np.float32)
            self.pool.update(layer, step, k, v)
            self.store.write_read(layer, slots[g], torch.from_numpy(k).permute(1, 0, 2)[None], torch.from_numpy(v).permute(1, 0, 2)[None], rows[g])
        self.check_shared(step, rows)

        produced = {layer: random_state(self.rng, n) for layer in STATE_LAYERS}
        qs, firsts, seq_ids = plan.query_starts.copy(), plan.first_positions.copy(), plan.seq_ids.copy()
        kept_slots = {layer: plan.state_groups[self.cache.state_group_of(layer)].write_slots.copy() for layer in STATE_LAYERS}
        for e in range(plan.n_entries):  # every entry's first token, before any write
            seq, first = int(seq_ids[e]), int(firsts[e])
            for layer in STATE_LAYERS:
                want = self.ref[seq][layer][first - 1] if first > 0 else zeros()
                self.check_read(layer, step, int(qs[e]), want)
        for layer in STATE_LAYERS:
            sp = plan.state_groups[self.cache.state_group_of(layer)]
            writes = sp.write_slots
            by_entry = self.rnd.random() < 0.5
            for e in range(plan.n_entries) if by_entry else [None]:
                lo, hi = (int(qs[e]), int(qs[e + 1])) if e is not None else (0, n)
                kept = [t for t in range(lo, hi) if writes[t] >= 0]
                self.pool.write_state(layer, step, {name: a[kept] for name, a in produced[layer].items()}, entry=e)
            for name, a in produced[layer].items():
                self.store.write_state(layer, name, writes, torch.from_numpy(a))
        for e, entry in enumerate(entries):  # later tokens read what the step wrote
            parents = entry[3] if len(entry) == 4 else None
            q = int(qs[e])
            for j in range(1, entry[1]):
                src = parents[j] if parents else j - 1
                for layer in STATE_LAYERS:
                    sp = plan.state_groups[self.cache.state_group_of(layer)]
                    if sp.read_slots[q + j] < 0:
                        with pytest.raises(InvalidArgumentError, match="reads no slot"):
                            self.pool.read_state(layer, step, q + j)
                        continue
                    self.check_read(layer, step, q + j, {name: a[q + src] for name, a in produced[layer].items()})
        if self.rnd.random() < 0.25:
            self.check_refusals(step, slots, rows)

        ending = self.rnd.random()
        if ending < 0.15:
            step.abort()
            return
        if ending < 0.25:
            return  # left begun: a later verb ends it uncommitted
        accepted: dict[int, list[int]] = {}
        for (s, T, *rest), kind in zip(entries, kinds):
            if kind == 2:
                parents = rest[1]
                path = [0]
                while True:
                    kids = [j for j in range(T) if parents[j] == path[-1]]
                    if not kids or self.rnd.random() < 0.25:
                        break
                    path.append(self.rnd.choice(kids))
                accepted[s] = path
            elif kind == 1:
                accepted[s] = list(range(self.rnd.randint(1, T)))
        copies = step.commit(accepted) if accepted else step.commit()
        if copies is not None:
            self.pool.apply_copies(copies)
            self.store.apply_copies(copies)
            self.counts["copies"] += sum(len(c) for c in copies[self.cache.n_groups :])
        for e, ((s, T, *rest), kind) in enumerate(zip(entries, kinds)):
            first, q = int(firsts[e]), int(qs[e])
            self.counts["trees"] += kind == 2
            path = accepted.get(s, list(range(T)))
            self.truncate(s, first)
            for layer in STATE_LAYERS:
                writes = kept_slots[layer]
                for d, node in enumerate(path):
                    if writes[q + node] >= 0:
                        self.ref.setdefault(s, {}).setdefault(layer, {})[first + d] = {
                            name: a[q + node].copy() for name, a in produced[layer].items()
                        }

    def one(self) -> None:
        op = self.rnd.randint(0, 99)
        act = self.active()
        if op < 10:
            s = self.rnd.randint(0, 2)
            if not self.cache.sequence(s).active:
                self.cache.add_sequence(s)
                self.ref[s] = {}
        elif op < 15 and act:
            s = self.rnd.choice(act)
            self.cache.release_sequence(s)
            self.ref.pop(s, None)
        elif op < 70:
            self.step()
        elif op < 82 and act:
            src = self.rnd.choice(act)
            free = [s for s in range(3) if s != src and (not self.cache.sequence(s).active or self.cache.length(s) == 0)]
            if not free:
                return
            dst, upto = self.rnd.choice(free), self.rnd.randint(0, self.cache.length(src))
            try:
                self.cache.fork(src, dst, upto)
            except (InvalidStateError, kvcore.CapacityError):
                return
            self.ref[dst] = {layer: {p: st for p, st in by.items() if p < upto} for layer, by in self.ref.get(src, {}).items()}
        elif act:
            s = self.rnd.choice(act)
            n = self.rnd.randint(0, self.cache.length(s))
            try:
                self.cache.rewind(s, n)
            except InvalidStateError:
                return
            self.truncate(s, n)


def test_random_steps_read_every_state_as_written_in_both_pools() -> None:
    totals = dict.fromkeys(Run(0).counts, 0)
    for seed in range(4):
        run = Run(seed)
        for _ in range(600):
            run.one()
        for key, value in run.counts.items():
            totals[key] += value
    assert totals["steps"] > 500 and totals["reads"] > 3000 and totals["trees"] > 150
    assert totals["copies"] > 15 and totals["shared"] > 1000 and totals["refusals"] > 1000


def test_torch_state_tensors_keep_their_first_shape_dtype_and_device() -> None:
    cache = kinds_cache()
    store = TorchPagedKVPool(cache)
    top = cache.num_state_slots(0)
    assert store.write_state(3, "conv", [-1, 5], torch.ones(2, 2, 3)) == 1
    t = store.state_slots(3, "conv")
    assert t is not None and t.shape == (top, 2, 3) and t[5].eq(1).all() and t[4].eq(0).all()
    got = store.read_state(3, "conv", np.array([5, -1]))
    assert got is not None and got[0].eq(1).all() and got[1].eq(0).all()
    assert store.read_state(4, "conv", [0]) is None  # not written yet
    with pytest.raises(InvalidArgumentError, match="state 'conv' of layer 3: \\(2, 4\\)"):
        store.write_state(3, "conv", [1], torch.ones(1, 2, 4))
    with pytest.raises(InvalidArgumentError, match="slots name a slot twice"):
        store.write_state(3, "conv", [1, 1], torch.ones(2, 2, 3))
    with pytest.raises(InvalidArgumentError, match="write_state: layer = 0 is not a State layer"):
        store.write_state(0, "conv", [1], torch.ones(1, 2, 3))
    with pytest.raises(InvalidArgumentError, match="must be \\[n, \\*state shape\\] with n = 2"):
        store.write_state(3, "conv", [1, 2], torch.ones(3, 2, 3))
    assert t[1].eq(0).all() and store.state_names(3) == ("conv",)
    assert store.nbytes(3) == top * 6 * 4
    store.release()
    assert store.state_slots(3, "conv") is None


def test_records_carry_a_batch_sequences_states_both_ways() -> None:
    """A BatchCache sequence's record (version 3) carries its held states: into a SequenceCache and
    its KVPool, and back into a BatchCache, each state reads as exported; the BatchCache's export
    of the import is the record, byte for byte."""
    rng = np.random.default_rng(7)
    cache = kinds_cache()
    pool = kvcore.PagedKVPool(cache, np.float32, state_tensors=TENSORS)
    cache.add_sequence(0)
    written: dict[int, dict[str, npt.NDArray[np.generic]]] = {}
    for T, verify in ((3, False), (3, True)):
        step = cache.begin_step([(0, T)], verify=verify)
        for layer in (0, 1):
            pool.update(layer, step, rng.standard_normal((T, 2, 3)).astype(np.float32), rng.standard_normal((T, 2, 3)).astype(np.float32))
        L = cache.length(0)
        kept = list(range(T)) if verify else [T - 1]
        states = random_state(rng, len(kept))
        for layer in STATE_LAYERS:
            pool.write_state(layer, step, states)
        for i, j in enumerate(kept):
            written[L + j] = {name: a[i] for name, a in states.items()}
        step.commit()
    record = pool.export_sequence(0)
    assert int.from_bytes(record[8:12], "little") == 3  # the record version that carries State layers
    for n in (6, 5, 4, 3):  # the verify step's states, and the plain step's last
        seq_cache = kvcore.SequenceCache(kvcore.CacheConfig(40, [cache.layer_config(layer) for layer in range(6)], max_step=4))
        seq_pool = kvcore.KVPool(seq_cache, np.float32, state_tensors=TENSORS)
        seq_pool.import_sequence(record)
        assert [seq_cache.can_rewind(m) for m in range(7)] == [True, False, False, True, True, True, True]
        seq_cache.rewind(n)
        step = seq_cache.begin_step(1)
        for layer in STATE_LAYERS:
            got = seq_pool.read_state(layer, step)
            for name in TENSORS:
                np.testing.assert_array_equal(got[name], written[n - 1][name])
        step.abort()
    other = kinds_cache()
    other_pool = kvcore.PagedKVPool(other, np.float32, state_tensors=TENSORS)
    other_pool.import_sequence(2, record)
    assert other_pool.export_sequence(2) == record
    step = other.begin_step([(2, 1)])
    for layer in STATE_LAYERS:
        got = other_pool.read_state(layer, step, 0)
        for name in TENSORS:
            np.testing.assert_array_equal(got[name], written[5][name])
    step.abort()
    smaller = kvcore.PagedKVPool(kinds_cache(), np.float32, state_tensors={"conv": ((2, 3), np.float32)})
    with pytest.raises(InvalidArgumentError, match=r"^import: layer 3 states of \d+ bytes differ from the pool's state slots of \d+ bytes$"):
        smaller.import_sequence(0, record)
