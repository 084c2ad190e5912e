"""KVPool over every layer kind (docs/layer_kinds.md): a Shared layer reads its
source's rows and refuses writes; a State layer keeps D slots of named state
tensors. A reference model drives a cache through random verify and plain
steps, partial commits, aborts, rewinds and trees with their copies applied:
each State layer's "kernel" runs a toy recurrence from the state the pool
hands it, and every read_state must equal the state the test computes from the
committed tokens alone. Then one test per refusal."""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest

from kvcore import (
    CacheConfig,
    CapacityError,
    Chunked,
    Flat,
    InvalidArgumentError,
    InvalidStateError,
    KVPool,
    LayerConfig,
    LayerPolicy,
    NotSupportedError,
    Ring,
    SequenceCache,
    Shared,
    State,
)

F32 = np.float32
CAPACITY = 64
# Layer 4 and layer 6 are State layers with their own tensors (the per-layer form).
TENSORS = {
    4: {"conv": ((6, 4), F32), "recurrent": ((2, 4, 4), F32)},
    6: {"h": ((3,), np.float64), "count": ((1,), np.int64)},
}


def kv(policy: LayerPolicy) -> LayerConfig:
    return LayerConfig(policy, 2, 4)


def kinds_cache(initial: int = 4) -> SequenceCache:
    layers = [kv(Flat()), kv(Ring(4, 1)), kv(Chunked(4)), kv(Shared(1)), LayerConfig(State(5)), kv(Shared(2)), LayerConfig(State(6))]
    return SequenceCache(CacheConfig(capacity=CAPACITY, layers=layers, max_step=4, initial_capacity=initial))


def embed(token: int) -> np.ndarray:
    return np.random.default_rng(token).standard_normal(4).astype(F32)


def advance(layer: int, state: dict[str, np.ndarray], token: int) -> dict[str, np.ndarray]:
    """The toy recurrence: the state after a token from the state before it."""
    e = embed(token)
    if layer == 4:
        conv = np.concatenate([state["conv"][1:], e[None]], axis=0)
        recurrent = (state["recurrent"] * F32(0.5) + np.outer(e, e)[None]).astype(F32)
        return {"conv": conv, "recurrent": recurrent}
    return {"h": np.tanh(state["h"] + float(e[0])), "count": state["count"] + 1}


def zeros(layer: int) -> dict[str, np.ndarray]:
    return {name: np.zeros(shape, dtype) for name, (shape, dtype) in TENSORS[layer].items()}


def reference(layer: int, tokens: list[int]) -> dict[str, np.ndarray]:
    state = zeros(layer)
    for t in tokens:
        state = advance(layer, state, t)
    return state


def kv_rows(layer: int, positions: list[int], tokens: list[int]) -> tuple[np.ndarray, np.ndarray]:
    k = np.array([[[layer, p, t % 1000, 1]] * 2 for p, t in zip(positions, tokens)], dtype=F32).reshape(-1, 2, 4)
    return k, -k


def assert_state(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert set(got) == set(want)
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
        assert not got[name].flags.writeable


class Model:
    """One cache and its pool, driven against the committed tokens."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.cache = kinds_cache()
        self.pool = KVPool(self.cache, F32, state_tensors=TENSORS)
        self.tokens: list[int] = []
        self.count = {"reads": 0, "shared": 0, "trees": 0, "copies": 0, "partial": 0, "aborts": 0, "rewinds": 0,
                      "full": 0}

    def attention(self, step, positions: list[int], tokens: list[int]) -> None:  # type: ignore[no-untyped-def]
        for layer in (0, 1, 2):
            self.pool.update(layer, step, *kv_rows(layer, positions, tokens))
        for layer, source in ((3, 1), (5, 2)):  # a Shared layer reads its source's rows, as they are now
            for order in ("rows", "positions"):
                got = self.pool.read(layer, step.plan(layer), order=order)
                want = self.pool.read(source, step.plan(source), order=order)
                for a, b in zip(got, want):
                    np.testing.assert_array_equal(a, b)
            self.count["shared"] += 1

    def chain(self) -> None:
        T, verify = self.rng.randint(1, 4), self.rng.random() < 0.5
        try:
            step = self.cache.begin_step(T, verify=verify)
        except InvalidStateError as e:  # an abort lost a state: rewind to a held length
            assert "no longer holds the state after" in str(e), e
            self.rewind()
            return
        except CapacityError as e:  # the only other refusal a valid T meets
            assert len(self.tokens) + T > CAPACITY and f"exceed capacity = {CAPACITY}" in str(e), e
            self.count["full"] += 1
            return
        new = [self.rng.randrange(1 << 20) for _ in range(T)]
        P = len(self.tokens)
        self.attention(step, list(range(P, P + T)), new)
        for layer in (4, 6):
            start = self.pool.read_state(layer, step)
            assert_state(start, reference(layer, self.tokens))
            self.count["reads"] += 1
            states, state = [], dict(start)
            for t in new:
                state = advance(layer, state, t)
                states.append(state)
            kept = states if step.plan(layer).write_len == T else states[-1:]
            self.pool.write_state(layer, step, {n: np.stack([s[n] for s in kept]) for n in TENSORS[layer]})
        how = self.rng.random()
        if how < 0.6:
            step.commit()
            self.tokens += new
        elif how < 0.85:
            m = self.rng.randint(1, T)
            try:
                step.commit(list(range(m)))
                self.tokens += new[:m]
                self.count["partial"] += 1
            except InvalidStateError as e:  # a plain step kept only its last state: all or nothing
                assert not verify and m < T and "keeps only its last state" in str(e), e
                step.abort()
                self.count["aborts"] += 1
        else:
            step.abort()
            self.count["aborts"] += 1

    def tree(self) -> None:
        N = self.rng.randint(1, 4)
        parents = [-1] + [i - 1 if self.rng.random() < 0.5 else self.rng.randrange(i) for i in range(1, N)]
        try:
            step = self.cache.begin_tree(parents)
        except InvalidStateError as e:  # as chain's
            assert "no longer holds the state after" in str(e), e
            self.rewind()
            return
        except CapacityError as e:
            assert len(self.tokens) + N > CAPACITY and f"exceed capacity = {CAPACITY}" in str(e), e
            self.count["full"] += 1
            return
        self.count["trees"] += 1
        P = len(self.tokens)
        new = [self.rng.randrange(1 << 20) for _ in range(N)]
        depth = [0] * N
        for i in range(1, N):
            depth[i] = depth[parents[i]] + 1
        self.attention(step, [P + d for d in depth], new)
        lineage = []  # node i's tokens from the root
        for i in range(N):
            lineage.append((lineage[parents[i]] if parents[i] >= 0 else []) + [new[i]])
        for layer in (4, 6):
            node_states = []
            for i in range(N):  # parents come first: each node runs from what the pool hands it
                start = self.pool.read_state(layer, step) if parents[i] < 0 else node_states[parents[i]]
                node_states.append(advance(layer, start, new[i]))
            self.pool.write_state(layer, step, {n: np.stack([s[n] for s in node_states]) for n in TENSORS[layer]})
            for i in range(N):
                assert_state(self.pool.read_state(layer, step, node=i), reference(layer, self.tokens + lineage[i][:-1]))
                self.count["reads"] += 1
        if self.rng.random() < 0.2:
            step.abort()
            self.count["aborts"] += 1
            return
        path = [0]
        while self.rng.random() < 0.75:
            kids = [i for i in range(N) if parents[i] == path[-1]]
            if not kids:
                break
            path.append(self.rng.choice(kids))
        copies = step.commit(path)
        self.pool.apply_copies(copies)
        self.count["copies"] += sum(len(copies[layer]) for layer in (4, 6))
        self.tokens += lineage[path[-1]]

    def rewind(self) -> None:
        n = self.rng.choice([n for n in range(len(self.tokens) + 1) if self.cache.can_rewind(n)])
        self.cache.rewind(n)
        del self.tokens[n:]
        self.count["rewinds"] += 1

    def round_trip(self) -> None:
        """Moves the sequence through a record into a fresh cache and pool, and goes on there."""
        record = self.pool.export_sequence(self.tokens)
        cache = kinds_cache()
        pool = KVPool(cache, F32, state_tensors=TENSORS)
        pool.import_sequence(record)
        assert cache.length == len(self.tokens) and cache.can_rewind(cache.length)
        for n in range(cache.length + 1):  # the importer never claims a rewind the exporter could not make
            assert not cache.can_rewind(n) or self.cache.can_rewind(n), n
        assert pool.export_sequence(self.tokens) == record
        self.cache, self.pool = cache, pool
        self.count["round_trips"] = self.count.get("round_trips", 0) + 1

    def run(self, ops: int, records: bool = False) -> None:
        for _ in range(ops):
            what = self.rng.random()
            if records and self.rng.random() < 0.1:
                self.round_trip()
            elif what < 0.5:
                self.chain()
            elif what < 0.75:
                self.tree()
            elif what < 0.97:
                self.rewind()
            else:
                self.cache.clear()
                self.tokens = []


def test_every_state_read_is_the_state_after_the_committed_tokens_and_shared_reads_are_the_sources() -> None:
    total: dict[str, int] = {}
    for seed in range(6):
        model = Model(seed)
        model.run(60)
        for key, n in model.count.items():
            total[key] = total.get(key, 0) + n
    # The walk reached what it claims to check. Measured (seeds 0-5, 60 ops each, 2026-12-05): 876 reads,
    # 536 shared reads, 96 trees, 24 copies, 37 partial commits, 53 aborts, 85 rewinds, 0 steps refused at
    # capacity; Python's random.Random is the same everywhere, so each floor is below a fixed count.
    assert total["reads"] > 300 and total["shared"] > 150 and total["trees"] > 30
    assert total["copies"] > 5 and total["partial"] > 10 and total["aborts"] > 10 and total["rewinds"] > 30


def test_a_state_starts_at_zeros_and_state_slots_is_a_read_only_view_of_every_slot() -> None:
    cache = kinds_cache()
    pool = KVPool(cache, F32, state_tensors=TENSORS)
    assert pool.state_names(4) == ["conv", "recurrent"] and pool.state_names(6) == ["h", "count"]
    step = cache.begin_step(2, verify=True)
    assert_state(pool.read_state(4, step), zeros(4))
    slots = pool.state_slots(4, "recurrent")
    assert slots.shape == (5, 2, 4, 4) and slots.dtype == F32 and not slots.flags.writeable
    with pytest.raises(ValueError):
        slots[0, 0, 0, 0] = 1.0
    with pytest.raises(ValueError):
        slots.setflags(write=True)
    states = {"conv": np.arange(48, dtype=F32).reshape(2, 6, 4), "recurrent": np.ones((2, 2, 4, 4), F32)}
    pool.write_state(4, step, states)
    written = [run.row for run in step.plan(4).write]
    np.testing.assert_array_equal(slots[written[0]], np.ones((2, 4, 4), F32))  # zero-copy: the view sees the write
    np.testing.assert_array_equal(pool.state_slots(4, "conv")[written[0] + 1], states["conv"][1])
    step.commit()
    step = cache.begin_step(1)
    np.testing.assert_array_equal(pool.read_state(4, step)["conv"], states["conv"][1])
    # repr counts the slots: 5 of 96 + 128 bytes, 6 of 24 + 8 bytes + 8 and 8 of padding (16-byte aligned).
    assert "state_bytes=1408" in repr(pool)
    # nbytes at length 2: 2 rows of K and V (2 x 4 float32 each) in 3 K/V layers, none in the Shared ones, 2 slots per State layer.
    assert pool.nbytes == 3 * 2 * 64 + 2 * 224 + 2 * 48
    config = kinds_cache().config
    assert KVPool.required_bytes(config, F32, state_tensors=TENSORS) > KVPool.required_bytes(
        config, F32, state_tensors={4: {"x": ((1,), F32)}, 6: {"x": ((1,), F32)}}
    )
    step.abort()
    twin = copy.deepcopy(pool)
    mine, theirs = cache.begin_step(1), twin.cache.begin_step(1)
    for layer in (4, 6):
        assert_state(twin.read_state(layer, theirs), pool.read_state(layer, mine))


def test_a_shared_layer_reads_its_sources_rows_after_the_sources_update() -> None:
    cache = SequenceCache(CacheConfig(capacity=32, layers=[kv(Ring(4)), kv(Flat()), kv(Shared(0))], max_step=4))
    pool = KVPool(cache, F32, mirror_rings=True)
    for round_ in range(4):
        step = cache.begin_step(3)
        k, v = kv_rows(0, list(range(step.position, step.end)), [round_] * 3)
        want = pool.update(0, step, k, v)
        pool.update(1, step, k, v)
        got = pool.read(2, step.plan(2))
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(pool.read(2, step.plan(2), order="positions")[0][-3:], k)  # this very step's rows
        cache.commit(step)
    assert pool.rows(2) == 0 and pool.allocated_rows(2) == 0


def test_kv_verbs_refuse_state_layers_and_writes_of_shared_layers() -> None:
    cache = kinds_cache()
    pool = KVPool(cache, F32, state_tensors=TENSORS)
    step = cache.begin_step(2)
    k, v = kv_rows(1, [0, 1], [1, 2])
    with pytest.raises(InvalidArgumentError, match=r"^write: layer 3 is Shared\(1\): it writes nothing; write layer 1$"):
        pool.update(3, step, k, v)
    with pytest.raises(InvalidArgumentError, match=r"^write of layer 4: a State layer holds state slots, not K/V rows"):
        pool.update(4, step, k, v)
    with pytest.raises(InvalidArgumentError, match=r"^views of layer 4: a State layer holds state slots"):
        pool.read(4, step.plan(4), order="positions")
    with pytest.raises(InvalidArgumentError, match=r"^held_rows of layer 4: a State layer holds state slots"):
        pool.read(4, step.plan(4))
    assert_state(pool.read_state(4, step), zeros(4))  # nothing was written


def test_state_verbs_refuse_other_layers() -> None:
    cache = kinds_cache()
    pool = KVPool(cache, F32, state_tensors=TENSORS)
    step = cache.begin_step(1)
    with pytest.raises(InvalidArgumentError, match=r"^state_names of layer 0: a Flat layer has no state slots \(the state verbs take State layers\)$"):
        pool.state_names(0)
    with pytest.raises(InvalidArgumentError, match=r"^read_state of layer 3: a Shared layer has no state slots"):
        pool.read_state(3, step)
    with pytest.raises(InvalidArgumentError, match=r"^write_state of layer 2: a Chunked layer has no state slots"):
        pool.write_state(2, step, {})
    with pytest.raises(InvalidArgumentError, match=r"^state_slots of layer 1: a Ring layer has no state slots"):
        pool.state_slots(1, "conv")
    with pytest.raises(InvalidArgumentError, match=r"^state_slots of layer 4: no tensor 'h' \(the layer's tensors: 'conv', 'recurrent'\)$"):
        pool.state_slots(4, "h")


def test_write_state_checks_every_entry_before_writing_anything() -> None:
    cache = kinds_cache()
    pool = KVPool(cache, F32, state_tensors=TENSORS)
    step = cache.begin_step(3, verify=True)
    good = {"conv": np.ones((3, 6, 4), F32), "recurrent": np.ones((3, 2, 4, 4), F32)}
    bad = [
        ([1, 2], r"^write_state of layer 4: states must be a dict of tensor name -> array, not list$"),
        ({"conv": good["conv"]}, r"^write_state of layer 4: states lacks 'recurrent' \(the layer's tensors: 'conv', 'recurrent'\)$"),
        ({**good, "x": good["conv"]}, r"^write_state of layer 4: no tensor 'x' \(the layer's tensors: 'conv', 'recurrent'\)$"),
        ({**good, "conv": good["conv"].astype(np.float64)}, r"^write_state of layer 4: states\['conv'\] must be a numpy array of float32, not float64$"),
        ({**good, "conv": good["conv"].tolist()}, r"^write_state of layer 4: states\['conv'\] must be a numpy array of float32, not list$"),
        ({**good, "conv": good["conv"][:2]}, r"^write_state of layer 4: states\['conv'\]\.shape = \(2, 6, 4\): must be \(n, 6, 4\) with n = 3 \(the states the step writes\)$"),
        ({**good, "conv": np.ones((3, 4, 6), F32).transpose(0, 2, 1)}, r"^write_state of layer 4: states\['conv'\]: must be C-contiguous \(use numpy\.ascontiguousarray\)$"),
    ]
    for states, message in bad:
        with pytest.raises(InvalidArgumentError, match=message):
            pool.write_state(4, step, states)
    assert not pool.state_slots(4, "conv").any() and not pool.state_slots(4, "recurrent").any()
    pool.write_state(4, step, good)
    assert pool.state_slots(4, "conv").any()


def test_read_state_of_a_node_needs_a_tree_step_and_a_node_of_it() -> None:
    cache = kinds_cache()
    pool = KVPool(cache, F32, state_tensors=TENSORS)
    step = cache.begin_step(1)
    with pytest.raises(InvalidArgumentError, match=r"^read_state of layer 4: node = 0, but the step is not a tree step \(begin_tree\)$"):
        pool.read_state(4, step, node=0)
    step.abort()
    tree = cache.begin_tree([-1, 0])
    with pytest.raises(InvalidArgumentError, match=r"^node_read_slot of layer 4: node = 2: must be in \[0, N = 2\)$"):
        pool.read_state(4, tree, node=2)
    assert_state(pool.read_state(4, tree, node=0), zeros(4))


@pytest.mark.parametrize(
    "state_tensors, message",
    [
        (None, r"^state_tensors: layer 4 is a State layer and has no state tensors: pass state_tensors=\{name: \(shape, dtype\)\}$"),
        ({4: TENSORS[4]}, r"^state_tensors: layer 6 is a State layer and has no state tensors"),
        ([("conv", ((1,), F32))], r"^state_tensors: must be a dict of name -> \(shape, dtype\), or of State layer index -> such a dict, not list$"),
        ({4: TENSORS[4], "h": ((1,), F32)}, r"^state_tensors: key 'h': keys are all tensor names \(str\) or all State layer indices \(int\)$"),
        ({**TENSORS, 3: {"x": ((1,), F32)}}, r"^state_tensors: key 3 names no State layer \(the State layers: 4, 6\)$"),
        ({4: TENSORS[4], 6: {}}, r"^state_tensors: layer 6 has no tensors: a State layer needs at least one$"),
        ({"": ((1,), F32)}, r"^state_tensors: layer 4 has an empty tensor name: names must be non-empty$"),
        ({"conv": (1, 2, 3)}, r"^state_tensors\['conv'\] of layer 4: must be a \(shape, dtype\) pair, not \(1, 2, 3\)$"),
        ({"conv": ((6, 0), F32)}, r"^state_tensors\['conv'\] of layer 4: shape \(6, 0\): must be a tuple of ints >= 1$"),
        ({"conv": ((6, 2.0), F32)}, r"^state_tensors\['conv'\] of layer 4: shape \(6, 2\.0\): must be a tuple of ints >= 1$"),
        ({"conv": ((6,), object)}, r"^state_tensors\['conv'\] of layer 4: dtype <class 'object'>: a state tensor takes a native numeric numpy dtype"),
        ({"conv": ((6,), "complex64")}, r"^state_tensors\['conv'\] of layer 4: dtype 'complex64': a state tensor takes"),
        ({"conv": ((6,), "not a dtype")}, r"^state_tensors\['conv'\] of layer 4: dtype 'not a dtype': a state tensor takes"),
        ({"conv": ((1 << 40, 1 << 40), F32)}, r"^state_tensors\['conv'\] of layer 4: shape \(1099511627776, 1099511627776\) of float32: the slot overflows the address space$"),
        ({"conv": ((1 << 30, 1 << 30), F32)}, r"^layer 4 is a State layer: state_slot_bytes\[4\] = 4611686018427387904: a slot holds at most 2\^31 - 1 bytes$"),
    ],
)
def test_bad_state_tensors_are_refused_by_name(state_tensors: object, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        KVPool(kinds_cache(), F32, state_tensors=state_tensors)
    with pytest.raises(InvalidArgumentError, match=message):
        KVPool.required_bytes(kinds_cache().config, F32, state_tensors=state_tensors)


def test_state_tensors_for_a_cache_without_state_layers_are_refused() -> None:
    cache = SequenceCache(CacheConfig(capacity=16, layers=kv(Flat()), max_step=2))
    with pytest.raises(InvalidArgumentError, match=r"^state_tensors: the cache has no State layer to give tensors to$"):
        KVPool(cache, F32, state_tensors={"conv": ((1,), F32)})
    with pytest.raises(InvalidArgumentError, match=r"^state_tensors: key 0 names no State layer \(the State layers: none\)$"):
        KVPool(cache, F32, state_tensors={0: {"conv": ((1,), F32)}})
    assert "state_bytes" not in repr(KVPool(cache, F32, state_tensors={}))


def test_records_carry_every_kind_and_the_importer_goes_on_exactly() -> None:
    """Records (version 3) carry a Shared layer's nothing and a State layer's states: a sequence
    moved through a record at random points goes on in the importer with every read exact."""
    trips = reads = 0
    for seed in range(6):
        m = Model(seed + 100)
        m.run(60, records=True)
        trips += m.count.get("round_trips", 0)
        reads += m.count["reads"]
    assert trips >= 20 and reads >= 200


def test_a_state_record_imports_only_into_the_same_slots_and_state_bytes() -> None:
    cache = kinds_cache()
    pool = KVPool(cache, F32, state_tensors=TENSORS)
    step = cache.begin_step(3, verify=True)
    for layer in (0, 1, 2):
        pool.update(layer, step, *kv_rows(layer, [0, 1, 2], [5, 6, 7]))
    for layer in (4, 6):
        states = [reference(layer, [5, 6, 7][: i + 1]) for i in range(3)]
        pool.write_state(layer, step, {n: np.stack([s[n] for s in states]) for n in TENSORS[layer]})
    step.commit()
    record = pool.export_sequence()
    other = dict(TENSORS)
    other[6] = {"h": ((16,), np.float64), "count": ((1,), np.int64)}  # tensors start aligned: 144 bytes a slot, not 48
    target = kinds_cache()
    with pytest.raises(InvalidArgumentError, match=r"^import: layer 6 states of 48 bytes differ from the pool's state slots of 144 bytes$"):
        KVPool(target, F32, state_tensors=other).import_sequence(record)
    assert target.length == 0
    layers = list(kinds_cache().config.layers)
    layers[4] = LayerConfig(State(4))
    fewer = SequenceCache(CacheConfig(capacity=64, layers=layers, max_step=3))
    with pytest.raises(InvalidArgumentError, match=r"^import: layer 4 policy \(kind 4, window 0, sinks 0, source 0, slots 5\) differs"):
        KVPool(fewer, F32, state_tensors=TENSORS).import_sequence(record)
    assert fewer.length == 0
    # Imported, every state of the verify step is held: a rewind to each reads it.
    pool2 = KVPool(target, F32, state_tensors=TENSORS)
    pool2.import_sequence(record)
    for n in (3, 2, 1):
        target.rewind(n)
        step = target.begin_step(1)
        assert_state(pool2.read_state(4, step), reference(4, [5, 6, 7][:n]))
        step.abort()


def test_record_info_reads_every_kind_and_a_state_layers_rows() -> None:
    """RecordInfo (kvcore.state) names chunked, shared and state layers, their param (source, D),
    and gives a state layer's rows as the states' bytes."""
    from kvcore.state import RecordInfo

    m = Model(3)
    while m.cache.length < 6:
        m.chain()
    info = RecordInfo.of(m.pool.export_sequence())
    assert info.version == 3
    assert [s.kind for s in info.layers] == ["flat", "ring", "chunked", "shared", "state", "shared", "state"]
    assert [s.param for s in info.layers] == [0, 0, 0, 1, 5, 2, 6]
    state = info.layers[4]
    assert state.dtype == np.uint8 and state.n_kv_heads == 1 and state.value_dim == 0 and state.n_rows >= 1
    k, v = info.rows(4)
    assert k.shape == (state.n_rows, 1, state.head_dim) and v.shape == (state.n_rows, 1, 0)
    step = m.cache.begin_step(1)
    last = m.pool.read_state(4, step)  # the state after length - 1: the record's last row
    step.abort()
    for value in last.values():  # each tensor's bytes, at its offset in the slot
        assert value.tobytes() in bytes(k[-1, 0])
