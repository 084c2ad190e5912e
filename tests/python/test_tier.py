"""kvcore.tier.HostTier (issue 42, item 1): a sequence computed, spilled to the host tier,
evicted from the device (clear, or a pool filled by other work), restored and adopted reads,
step after step, exactly what a twin cache that never lost it reads; for Flat, Ring with
sinks, Chunked, Shared and State layers. A flat model's blocks are held once each and a restore
assembles exactly the record the exporter would write; the tier's own LRU eviction by bytes
never drops a block before the blocks that extend it, and what it evicted is never served;
namespaces isolated, bad inputs refused with nothing changed."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

import kvcore
from kvcore import BatchCache, CapacityError, InvalidArgumentError, InvalidStateError
from kvcore.tier import HostTier, Restored, namespace_id

H, D = 2, 4  # K/V heads and head dim of every attention layer
STATE = {"h": ((3,), np.float32)}


def config(layers: list[kvcore.LayerConfig], *, block: int = 2, blocks: int = 64, max_step: int = 4,
           snapshots: int = 0) -> kvcore.CacheConfig:
    limits = kvcore.BatchLimits(block_size=block, max_seqs=4, num_blocks=blocks, state_snapshots=snapshots)
    return kvcore.CacheConfig(48, layers, max_step=max_step, batch=limits)


def kv(policy: kvcore.LayerPolicy) -> kvcore.LayerConfig:
    return kvcore.LayerConfig(policy, H, D)


KINDS: dict[str, Callable[..., kvcore.CacheConfig]] = {
    "flat": lambda **kw: config([kv(kvcore.Flat())], **kw),
    "ring_sinks": lambda **kw: config([kv(kvcore.Ring(5, 2)), kv(kvcore.Flat())], **kw),
    "ring_only_sinks": lambda **kw: config([kv(kvcore.Ring(4, 2))], **kw),
    "chunked": lambda **kw: config([kv(kvcore.Chunked(4)), kv(kvcore.Flat())], **kw),
    "shared": lambda **kw: config([kv(kvcore.Flat()), kv(kvcore.Ring(4)), kv(kvcore.Shared(0)), kv(kvcore.Shared(1))],
                                  **kw),
    "shared_flat": lambda **kw: config([kv(kvcore.Flat()), kv(kvcore.Shared(0)), kv(kvcore.Flat())], **kw),
    "state": lambda **kw: config([kv(kvcore.Flat()), kvcore.LayerConfig(kvcore.State(4))], snapshots=4, **kw),
}


class Model:
    """A BatchCache, its PagedKVPool, and a deterministic 'model': K/V rows a function of
    (layer, position, token), a State layer's state after a token a function of the state
    before it and the token (so a wrong restored state shows in every later read)."""

    def __init__(self, cfg: kvcore.CacheConfig) -> None:
        self.cache = BatchCache(cfg)
        self.kinds = [cfg.layers[i].policy.kind.name.lower() for i in range(len(cfg.layers))]
        tensors = {i: STATE for i, k in enumerate(self.kinds) if k == "state"}
        self.pool = kvcore.PagedKVPool(self.cache, np.float32, initial_rows=8, state_tensors=tensors or None)

    def rows(self, layer: int, positions: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        base = (tokens * 31 + positions * 7 + layer * 13)[:, None, None]
        grid = np.arange(H)[None, :, None] * 5 + np.arange(D)[None, None, :]
        out: np.ndarray = (((base + grid) % 251) / 7.0).astype(np.float32)
        return out

    def step(self, seq: int, tokens: list[int]) -> list[Any]:
        """One step of `tokens` for `seq`: writes, then returns every read of it (per K/V layer
        the gathered (k, v, positions), per State layer the state the first token reads)."""
        c = self.cache
        start = c.length(seq)
        step = c.begin_step([(seq, len(tokens), tokens)])
        pos = np.arange(start, start + len(tokens))
        toks = np.asarray(tokens)
        reads: list[Any] = []
        for layer, kind in enumerate(self.kinds):
            if kind in ("flat", "ring", "chunked"):
                k = self.rows(layer, pos, toks)
                self.pool.update(layer, step, k, k + 0.5)
        for layer, kind in enumerate(self.kinds):
            if kind == "state":
                state = self.pool.read_state(layer, step, 0)["h"].copy()
                reads.append(("state", layer, state))
                sp = step.plan().state_groups[c.state_group_of(layer)]
                out = []
                for t, tok in enumerate(tokens):
                    state = (state * np.float32(0.5) + np.float32(tok)).astype(np.float32)
                    if sp.write_slots[t] >= 0:
                        out.append(state)
                self.pool.write_state(layer, step, {"h": np.stack(out)})
            else:
                k, v, p = self.pool.gather(layer, step, 0)
                reads.append((kind, layer, k.copy(), v.copy(), p.copy()))
        c.commit(step)
        return reads

    def prefill(self, seq: int, tokens: list[int]) -> list[Any]:
        reads = []
        chunk = self.cache.max_step
        for i in range(0, len(tokens), chunk):
            reads += self.step(seq, tokens[i : i + chunk])
        return reads


def same(a: list[Any], b: list[Any]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x[:2] != y[:2] or not all(np.array_equal(p, q) for p, q in zip(x[2:], y[2:])):
            return False
    return True


def snapshot(m: Model, prompt: list[int], ns: Any = None) -> tuple[Any, ...]:
    c = m.cache
    return (c.free_blocks(0), c.cached_blocks(0), c.free_table_rows, c.lookup_prefix(prompt, ns),
            tuple(c.sequence(s).active for s in range(c.max_seqs)))


#: Kinds the tier holds per block (every layer Flat or Shared with a Flat source); the others per record.
PER_BLOCK = {"flat", "shared_flat"}

P = [5, 9, 2, 7, 3, 3, 8, 1, 6, 4, 11, 12]  # 12 tokens: 6 full blocks of 2
Q_LONGER = P + [20, 21, 22]  # extends P: a hit at P's last full block
Q_PARTIAL = P[:6] + [30, 31, 32]  # shares 3 blocks with P


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("evict", ["clear", "fill"])
@pytest.mark.parametrize("keep", [False, True], ids=["released", "kept"])
def test_spilled_evicted_restored_reads_equal_a_twin_that_never_left(kind: str, evict: str, keep: bool) -> None:
    a = Model(KINDS[kind](blocks=24 if evict == "fill" else 64))
    twin = Model(KINDS[kind]())
    for m in (a, twin):
        m.cache.add_sequence(0)
    assert same(a.prefill(0, P), twin.prefill(0, P))
    tier = HostTier(1 << 20)
    exported = bytes(a.pool.export_sequence(0, P))
    stored = tier.spill(a.cache, a.pool, 0, P)
    assert stored == tier.bytes > 0
    if kind in PER_BLOCK:  # 6 blocks, each its token ids and rows
        assert (len(tier), tier.blocks, tier.records) == (6, 6, 0) and stored % 6 == 0 and stored < len(exported)
    else:
        assert (len(tier), tier.blocks, tier.records) == (1, 0, 1) and stored == len(exported)
    assert tier.spill(a.cache, a.pool, 0, P) == 0  # held already: nothing stored twice
    for m in (a, twin):
        m.cache.release_sequence(0)
    assert a.cache.lookup_prefix(Q_LONGER) == len(P)
    if evict == "clear":
        a.cache.clear()
    else:  # other work fills the pool: the cached blocks of P are reclaimed
        c = a.cache
        for s in (1, 2, 3):
            c.add_sequence(s)
            while c.length(s) + 2 <= c.capacity:
                n = c.length(s)
                try:
                    a.step(s, [100 * s + n, 100 * s + n + 1])
                except CapacityError:
                    break
        c.release_sequences([1, 2, 3])
    assert a.cache.lookup_prefix(Q_LONGER) == 0
    # Released (keep=False), a State model's import named its state after P's last block: the
    # blocks and the snapshot serve adopt_prefix together.
    assert tier.longest(Q_LONGER, 2, keep=keep) == len(P)
    r = tier.restore(a.cache, a.pool, Q_LONGER, seq=1, keep=keep)
    assert isinstance(r, Restored) and r.device_hit == 0 and r.hit == len(P) == r.tokens
    # P ends on a block boundary: the record assembled from its blocks is the exporter's, byte for byte.
    assert r.bytes == len(exported) and r.seconds > 0 and tier.hits == 1 and tier.misses == 0
    assert [a.cache.sequence(s).active for s in range(a.cache.max_seqs)] == [False, keep, False, False]
    if not keep:
        a.cache.add_sequence(1)
        assert a.cache.adopt_prefix(1, Q_LONGER) == len(P)
    else:
        assert a.cache.length(1) == len(P)
    twin.cache.add_sequence(1)
    assert twin.cache.adopt_prefix(1, Q_LONGER) == len(P)
    # The rest of the prompt, then decode steps: every read bit-equal.
    assert same(a.prefill(1, Q_LONGER[len(P) :]), twin.prefill(1, Q_LONGER[len(P) :]))
    for t in range(6):
        assert same(a.step(1, [40 + t]), twin.step(1, [40 + t]))
    for s in range(3):  # rewinds agree too
        assert a.cache.can_rewind(1, s * 2 + len(P)) == twin.cache.can_rewind(1, s * 2 + len(P))


def test_a_trusted_import_names_a_state_models_snapshot_an_untrusted_one_does_not() -> None:
    """The core rule restore's released State records rest on (docs/state.md "Trust"): an import
    trusted in a namespace names the state after its last full block by that block's key (with
    snapshots configured), so after a release the blocks and the state serve adopt_prefix
    together; an untrusted import names nothing, and without snapshots the blocks alone serve no
    hit on a State model."""
    state_model = [kv(kvcore.Flat()), kvcore.LayerConfig(kvcore.State(4))]
    a = Model(config(state_model, snapshots=4))
    a.cache.add_sequence(0)
    a.prefill(0, P)
    record = bytes(a.pool.export_sequence(0, P))
    for snapshots, trusted, hit in ((4, True, len(P)), (4, False, 0), (0, True, 0)):
        b = Model(config(state_model, snapshots=snapshots))
        if trusted:
            b.pool.import_sequence(1, record, namespace=5)
        else:
            b.pool.import_sequence(1, record)
        b.cache.release_sequence(1)
        ns = 5 if trusted else 0
        assert b.cache.lookup_prefix(Q_LONGER, ns) == hit, (snapshots, trusted)
        b.cache.add_sequence(2, ns)
        assert b.cache.adopt_prefix(2, Q_LONGER) == hit, (snapshots, trusted)


@pytest.mark.parametrize("kind", ["flat", "shared_flat", "shared"])
@pytest.mark.parametrize("keep", [False, True], ids=["released", "kept"])
def test_a_flat_model_restores_a_partial_prefix(kind: str, keep: bool) -> None:
    """A flat model's held blocks serve every full-block prefix: a prompt sharing 3 of P's 6
    blocks hits 3 and imports exactly those 3 (the record P[:6]'s exporter writes)."""
    a, twin = Model(KINDS[kind]()), Model(KINDS[kind]())
    for m in (a, twin):
        m.cache.add_sequence(0)
        m.prefill(0, P)
    tier = HostTier(1 << 20)
    tier.spill(a.cache, a.pool, 0, P)
    for m in (a, twin):
        m.cache.release_sequence(0)
    a.cache.clear()
    r = tier.restore(a.cache, a.pool, Q_PARTIAL, seq=1, keep=keep)
    want = 6 if kind in PER_BLOCK else 0  # a Ring layer (shared's layer 1) serves only the record's end
    if kind == "shared":
        assert r.hit == r.bytes == 0 and tier.misses == 1
        return
    assert r.hit == want
    part = Model(KINDS[kind]())
    part.cache.add_sequence(0)
    part.prefill(0, P[:6])
    assert r.bytes == len(part.pool.export_sequence(0, P[:6]))  # the 3 blocks' record, nothing past the hit
    if keep:  # truncated to the hit
        assert a.cache.length(1) == want
    else:
        a.cache.add_sequence(1)
        assert a.cache.adopt_prefix(1, Q_PARTIAL) == want
    twin.cache.add_sequence(1)
    assert twin.cache.adopt_prefix(1, Q_PARTIAL) == want
    assert same(a.prefill(1, Q_PARTIAL[want:]), twin.prefill(1, Q_PARTIAL[want:]))
    assert same(a.step(1, [50]), twin.step(1, [50]))


def spilled(cfg: kvcore.CacheConfig, prompts: list[list[int]], tier: HostTier) -> Model:
    m = Model(cfg)
    for i, prompt in enumerate(prompts):
        m.cache.add_sequence(0)
        m.prefill(0, prompt)
        tier.spill(m.cache, m.pool, 0, prompt)
        m.cache.release_sequence(0)
    return m


def test_the_tier_evicts_whole_records_least_recently_used_by_bytes() -> None:
    """A ring model's records (held whole: a record serves only its own last full block)."""
    prompts = [[i * 10 + j for j in range(8)] for i in range(1, 5)]
    probe = HostTier(1 << 20)
    spilled(KINDS["ring_sinks"](), prompts[:1], probe)
    size = probe.bytes
    tier = HostTier(2 * size + size // 2)  # room for two
    m = spilled(KINDS["ring_sinks"](), prompts[:2], tier)
    assert tier.bytes == 2 * size and tier.evictions == 0 and tier.records == 2
    assert tier.longest(prompts[0] + [1], 2) == 8  # no recency moves
    m.cache.add_sequence(0)
    m.prefill(0, prompts[0])
    assert tier.spill(m.cache, m.pool, 0, prompts[0]) == 0  # held: its recency moves, prompts[1] is now oldest
    m.cache.release_sequence(0)
    m.cache.add_sequence(0)
    m.prefill(0, prompts[2])
    assert tier.spill(m.cache, m.pool, 0, prompts[2]) == size
    m.cache.release_sequence(0)
    assert tier.evictions == 1 and tier.bytes == 2 * size and len(tier) == 2
    assert tier.longest(prompts[1] + [1], 2) == 0 and tier.longest(prompts[0] + [1], 2) == 8
    # A record evicted from the tier is never served: the device lost it too, the restore misses.
    m.cache.clear()
    before = snapshot(m, prompts[1] + [1])
    r = tier.restore(m.cache, m.pool, prompts[1] + [1])
    assert (r.hit, r.bytes, r.tokens) == (0, 0, 0) and tier.misses == 1 and snapshot(m, prompts[1] + [1]) == before
    # A record larger than capacity is refused, nothing changes.
    small = HostTier(size - 1)
    m.cache.add_sequence(0)
    m.prefill(0, prompts[3])
    with pytest.raises(CapacityError, match=rf"spill: a record of {size} bytes > the tier's capacity_bytes {size - 1}"):
        small.spill(m.cache, m.pool, 0, prompts[3])
    assert small.bytes == 0 and len(small) == 0 and small.evictions == 0


def block_bytes(kind: str = "flat") -> int:
    probe = HostTier(1 << 20)
    spilled(KINDS[kind](), [[1, 2]], probe)
    return probe.bytes


def test_blocks_are_evicted_least_recently_used_last_blocks_first() -> None:
    """Four-block prompts in a tier of ten blocks: making room evicts the oldest prompt's last
    blocks, never a first block while a later one stays; what was evicted is never served."""
    bb = block_bytes()
    prompts = [[i * 10 + j for j in range(8)] for i in range(1, 5)]
    tier = HostTier(10 * bb)
    m = spilled(KINDS["flat"](), prompts[:2], tier)
    assert (tier.bytes, tier.blocks, tier.evictions) == (8 * bb, 8, 0)
    m.cache.add_sequence(0)
    m.prefill(0, prompts[0])
    assert tier.spill(m.cache, m.pool, 0, prompts[0]) == 0  # held: its recency moves, prompts[1] is now oldest
    m.cache.release_sequence(0)
    m.cache.add_sequence(0)
    m.prefill(0, prompts[2])
    assert tier.spill(m.cache, m.pool, 0, prompts[2]) == 4 * bb
    m.cache.release_sequence(0)
    assert (tier.bytes, tier.blocks, tier.evictions) == (10 * bb, 10, 2)
    assert [tier.longest(p + [1], 2) for p in prompts[:3]] == [8, 4, 8]  # prompts[1] lost its last 2 blocks
    # The device lost everything too: prompts[1] restores its first 2 blocks, nothing more.
    m.cache.clear()
    twin = Model(KINDS["flat"]())
    twin.cache.add_sequence(0)
    twin.prefill(0, prompts[1][:4])
    r = tier.restore(m.cache, m.pool, prompts[1] + [1])
    assert (r.device_hit, r.hit) == (0, 4) and r.bytes == len(twin.pool.export_sequence(0, prompts[1][:4]))
    twin.cache.release_sequence(0)
    for c in (m.cache, twin.cache):
        c.add_sequence(1)
        assert c.adopt_prefix(1, prompts[1] + [1]) == 4
    assert same(m.prefill(1, prompts[1][4:]), twin.prefill(1, prompts[1][4:]))
    # A sequence larger than the tier: the first blocks that fit are stored (the held run kept).
    small = HostTier(3 * bb)
    m.cache.add_sequence(2)
    m.prefill(2, prompts[3])
    assert small.spill(m.cache, m.pool, 2, prompts[3]) == 3 * bb and small.longest(prompts[3] + [1], 2) == 6
    assert small.spill(m.cache, m.pool, 2, prompts[3]) == 0 and small.evictions == 0  # no room past the held run
    # Not even one block fits: refused by name, nothing changes.
    tiny = HostTier(bb - 1)
    with pytest.raises(CapacityError, match=rf"spill: a block of {bb} bytes > the tier's capacity_bytes {bb - 1}"):
        tiny.spill(m.cache, m.pool, 2, prompts[3])
    assert tiny.bytes == 0 and len(tiny) == 0 and tiny.evictions == 0
    # Refused with other blocks held: nothing of them is evicted first (a model of two flat layers'
    # blocks is larger than the tier, which holds one of this model's blocks).
    one = HostTier(bb)
    assert one.spill(m.cache, m.pool, 2, prompts[3]) == bb
    wide = Model(KINDS["shared_flat"]())
    wide.cache.add_sequence(0)
    wide.prefill(0, prompts[3])
    with pytest.raises(CapacityError, match=r"spill: a block of \d+ bytes > the tier's capacity_bytes"):
        one.spill(wide.cache, wide.pool, 0, prompts[3])
    assert (one.bytes, one.blocks, one.evictions) == (bb, 1, 0) and one.longest(prompts[3] + [1], 2) == 2


@pytest.mark.parametrize("protected", [0.0, 0.3, 0.8])
def test_held_blocks_stay_prefix_closed_under_eviction(protected: float) -> None:
    """Conversations branching off shared prefixes, spilled and restored in a random order into
    a tier that keeps evicting (plain LRU, and segmented with restored blocks protected): after
    every call, what the tier holds of each prompt is its first k blocks (``block_keys_held``
    and ``longest`` agree), and a restore of it is exact."""
    rng = np.random.default_rng(3)
    bb = block_bytes()
    roots = [list(rng.integers(1, 500, 6)) for _ in range(3)]
    prompts = []
    for _ in range(14):
        root = roots[int(rng.integers(3))]
        prompts.append(root[: 2 * int(rng.integers(1, 4))] + list(rng.integers(500, 900, int(rng.integers(2, 9)))))
    tier = HostTier(9 * bb, protected=protected)
    m = Model(KINDS["flat"](blocks=64))
    for i in list(rng.permutation(len(prompts))) * 2:
        p = [int(t) for t in prompts[i]]
        if rng.random() < 0.4:  # a restore: its blocks are used again
            m.cache.clear()
            assert tier.restore(m.cache, m.pool, p).hit == tier.longest(p, 2)
        else:
            m.cache.add_sequence(0)
            m.prefill(0, p)
            tier.spill(m.cache, m.pool, 0, p)
            m.cache.release_sequence(0)
        assert tier.bytes == tier.blocks * bb <= 9 * bb
        held = tier.block_keys_held()
        for q in prompts:
            keys = [(0, 2, int(lo), int(hi)) for lo, hi in kvcore.block_keys(q[: len(q) // 2 * 2], 2)]
            k = sum(key in held for key in keys)
            assert all(key in held for key in keys[:k]), "a held block whose prefix is not held"
            assert tier.longest(q + [0], 2) == 2 * k
    assert tier.evictions > 0
    m.cache.clear()
    q = [int(t) for t in max(prompts, key=lambda p: tier.longest(p + [0], 2))]
    n = tier.longest(q + [0], 2)
    twin = Model(KINDS["flat"]())
    twin.cache.add_sequence(0)
    twin.prefill(0, q[:n])
    twin.cache.release_sequence(0)
    assert tier.restore(m.cache, m.pool, q + [0]).hit == n > 0
    for c in (m.cache, twin.cache):
        c.add_sequence(1)
        assert c.adopt_prefix(1, q + [0]) == n
    assert same(m.prefill(1, (q + [0])[n:]), twin.prefill(1, (q + [0])[n:]))


def test_namespaces_are_isolated() -> None:
    tier = HostTier(1 << 20)
    a = Model(KINDS["flat"]())
    a.cache.add_sequence(0, namespace="tenant-a")
    assert a.cache.prefix_namespace(0) == namespace_id("tenant-a")
    a.prefill(0, P)
    tier.spill(a.cache, a.pool, 0, P)
    a.cache.release_sequence(0)
    a.cache.clear()
    assert tier.longest(Q_LONGER, 2, "tenant-a") == len(P)
    for ns in (None, "tenant-b", 0, namespace_id("tenant-a") ^ 1):
        assert tier.longest(Q_LONGER, 2, ns) == 0
        before = snapshot(a, Q_LONGER, ns)
        r = tier.restore(a.cache, a.pool, Q_LONGER, ns)  # a prompt of namespace B tries
        assert r.bytes == 0 and r.hit == 0 and snapshot(a, Q_LONGER, ns) == before
    r = tier.restore(a.cache, a.pool, Q_LONGER, "tenant-a")
    assert r.hit == len(P)
    assert a.cache.lookup_prefix(Q_LONGER, "tenant-b") == 0 and a.cache.lookup_prefix(Q_LONGER) == 0
    a.cache.add_sequence(1, namespace="tenant-b")
    assert a.cache.adopt_prefix(1, Q_LONGER) == 0
    # A record put in from elsewhere under namespace A is never restored for B either.
    b = Model(KINDS["flat"]())
    b.cache.add_sequence(0, namespace="tenant-a")
    b.prefill(0, P)
    rec = b.pool.export_sequence(0, P)
    other = HostTier(1 << 20)
    assert other.put(rec, namespace="tenant-a", block_size=2) == tier.bytes
    a.cache.clear()
    assert other.restore(a.cache, a.pool, Q_LONGER, "tenant-b").bytes == 0
    assert other.restore(a.cache, a.pool, Q_LONGER, "tenant-a").hit == len(P)


def test_bad_inputs_are_refused_and_change_nothing() -> None:
    tier = HostTier(1 << 20)
    a = Model(KINDS["flat"](blocks=16))
    a.cache.add_sequence(0)
    a.prefill(0, P)
    record = a.pool.export_sequence(0, P)
    tier.spill(a.cache, a.pool, 0, P)
    a.cache.release_sequence(0)
    a.cache.clear()
    other = Model(KINDS["flat"]())
    state = (tier.bytes, len(tier), tier.hits, tier.misses)
    before = snapshot(a, Q_LONGER)
    cases: list[tuple[type, str, Callable[[], Any]]] = [
        (InvalidArgumentError, r"^HostTier: capacity_bytes = -1: must be an int >= 0$", lambda: HostTier(-1)),
        (InvalidArgumentError, r"^HostTier: capacity_bytes = True", lambda: HostTier(True)),
        (InvalidArgumentError, r"^HostTier: protected = 1.5: must be a number in \[0, 1\]$",
         lambda: HostTier(10, protected=1.5)),
        (InvalidArgumentError, r"^HostTier: protected = '0.5': must be a number in \[0, 1\]$",
         lambda: HostTier(10, protected="0.5")),  # type: ignore[arg-type]
        (InvalidArgumentError, r"restore: pool \(PagedKVPool\) is not the byte layer of this cache",
         lambda: tier.restore(a.cache, other.pool, Q_LONGER)),
        (InvalidArgumentError, r"restore: cache must be a kvcore.BatchCache, not SequenceCache",
         lambda: tier.restore(kvcore.SequenceCache(KINDS["flat"]()), a.pool, Q_LONGER)),  # type: ignore[arg-type]
        (InvalidArgumentError, r"restore: tokens must be an ordered sequence of ints, not a set",
         lambda: tier.restore(a.cache, a.pool, set(Q_LONGER))),  # type: ignore[arg-type]
        (InvalidArgumentError, r"restore: a token id is beyond 32 bits", lambda: tier.restore(a.cache, a.pool, [1 << 40, 2, 3])),
        (InvalidArgumentError, r"namespace: must be None, an int in \[0, 2\*\*64\), bytes or str, not a bool",
         lambda: tier.restore(a.cache, a.pool, Q_LONGER, True)),
        (InvalidArgumentError, r"namespace = -1: an int namespace must be in \[0, 2\*\*64\)",
         lambda: tier.restore(a.cache, a.pool, Q_LONGER, -1)),
        (InvalidArgumentError, r"restore: seq = 9: must be an int in \[0, 4\)", lambda: tier.restore(a.cache, a.pool, Q_LONGER, seq=9)),
        # A prompt the tier does not hold (a miss): a bad seq is refused all the same.
        (InvalidArgumentError, r"restore: seq = -1: must be an int in \[0, 4\)", lambda: tier.restore(a.cache, a.pool, [7, 7, 7], seq=-1)),
        (InvalidArgumentError, r"restore: 49 tokens > capacity 48", lambda: tier.restore(a.cache, a.pool, list(range(49)))),
        (InvalidArgumentError, r"block_size = 0: must be an int >= 1", lambda: tier.longest(P, 0)),
        (InvalidArgumentError, r"corrupt", lambda: tier.put(record[:-1] + bytes([record[-1] ^ 1]), namespace=0, block_size=2)),
        (InvalidArgumentError, r"truncated", lambda: tier.put(record[:100], namespace=0, block_size=2)),
        (InvalidStateError, r"put: the record carries 0 token ids for length 12: it keys no prefix without every one",
         lambda: tier.put(other_record_without_tokens(), namespace=0, block_size=2)),
    ]
    for error, message, call in cases:
        with pytest.raises(error, match=message):
            call()
        assert snapshot(a, Q_LONGER) == before and (tier.bytes, len(tier), tier.hits, tier.misses) == state, message
    a.cache.add_sequence(2)
    with pytest.raises(InvalidStateError, match=r"restore: sequence 2 is active: give an inactive id to import into"):
        tier.restore(a.cache, a.pool, Q_LONGER, seq=2)
    with pytest.raises(InvalidStateError, match=r"spill: sequence 1 is not active"):
        tier.spill(a.cache, a.pool, 1, P)
    with pytest.raises(InvalidStateError, match=r"spill: sequence 2 has length 0 < block_size 2: no full block to key"):
        tier.spill(a.cache, a.pool, 2, [])
    a.step(2, [1, 2, 3])
    with pytest.raises(InvalidArgumentError, match=r"spill: 2 tokens for sequence 2 of length 3: give every position's id"):
        tier.spill(a.cache, a.pool, 2, [1, 2])
    a.cache.release_sequence(2)
    before = snapshot(a, Q_LONGER)
    # Too few free blocks: the import refuses (CapacityError), the cache and tier are unchanged.
    a.cache.add_sequence(3)
    filler = list(range(200, 248))
    while a.cache.free_blocks(0) > 3:
        a.step(3, filler[a.cache.length(3) : a.cache.length(3) + 2])
    held = snapshot(a, Q_LONGER)
    with pytest.raises(CapacityError):
        tier.restore(a.cache, a.pool, Q_LONGER)
    assert snapshot(a, Q_LONGER) == held and (tier.bytes, len(tier)) == state[:2]
    # A record of another layout (a ring model's cache) is refused by the import, nothing changes.
    ring = Model(KINDS["ring_sinks"]())
    before = snapshot(ring, Q_LONGER)
    with pytest.raises(InvalidArgumentError):
        tier.restore(ring.cache, ring.pool, Q_LONGER)
    assert snapshot(ring, Q_LONGER) == before and len(tier) == 6


def other_record_without_tokens() -> bytes:
    m = Model(KINDS["flat"]())
    m.cache.add_sequence(0)
    m.prefill(0, P)
    return bytes(m.pool.export_sequence(0))


def test_a_state_model_spilled_off_a_block_boundary_is_refused_by_name() -> None:
    m = Model(KINDS["state"]())
    m.cache.add_sequence(0)
    m.prefill(0, P[:5])
    tier = HostTier(1 << 20)
    with pytest.raises(InvalidStateError, match=r"spill: length 5 is not a multiple of block_size 2 and the model has State"):
        tier.spill(m.cache, m.pool, 0, P[:5])
    assert tier.bytes == 0 and len(tier) == 0


@pytest.mark.parametrize("protected", [0.0, 0.8])
def test_blocks_used_again_outlive_newer_blocks_never_used_again(protected: float) -> None:
    """The segmented LRU: prompt A is spilled and used again (a restore), then B, C and D are
    spilled into a tier of three prompts' blocks. Protected, A stays and B (stored, never used
    again) goes; one plain LRU order (protected=0) evicts A, the least recently used."""
    bb = block_bytes()
    a, b, c, d = ([i * 10 + j for j in range(8)] for i in range(1, 5))
    tier = HostTier(12 * bb, protected=protected)
    m = spilled(KINDS["flat"](), [a], tier)
    m.cache.clear()
    assert tier.restore(m.cache, m.pool, a + [1]).hit == 8
    spilled(KINDS["flat"](), [b, c, d], tier)
    assert tier.evictions == 4 and tier.blocks == 12
    held = [tier.longest(p + [1], 2) for p in (a, b, c, d)]
    assert held == ([8, 0, 8, 8] if protected else [0, 8, 8, 8])


def test_a_flat_prefix_is_held_once_whoever_spilled_it() -> None:
    """A conversation's turns, and conversations branching off it: every full block is held
    once, whichever sequence spilled it; a restore imports exactly the prompt's held blocks.
    Rings keep one record per length."""
    bb = block_bytes()
    turns = [P[:4], P[:8], P]  # 2, 4, 6 full blocks, each a prefix of the next
    tier = HostTier(1 << 20)
    m = Model(KINDS["flat"]())
    sizes = []
    for t in turns:
        m.cache.add_sequence(0)
        m.prefill(0, t)
        sizes.append(tier.spill(m.cache, m.pool, 0, t))
        m.cache.release_sequence(0)
    assert sizes == [2 * bb, 2 * bb, 2 * bb] and tier.blocks == 6 and tier.bytes == 6 * bb and tier.evictions == 0
    for t in turns:
        assert tier.longest(t + [99], 2) == len(t)
    m.cache.add_sequence(0)
    m.prefill(0, P[:6] + [1])  # 3 full blocks, all held, and a partial one: nothing stored
    assert tier.spill(m.cache, m.pool, 0, P[:6] + [1]) == 0 and tier.blocks == 6
    m.cache.release_sequence(0)
    # Two conversations branching off P's first 2 blocks: each stores only its own 2 blocks.
    for tail in ([40, 41, 42, 43], [50, 51, 52, 53, 54]):
        m.cache.add_sequence(0)
        m.prefill(0, P[:4] + tail)
        assert tier.spill(m.cache, m.pool, 0, P[:4] + tail) == 2 * bb
        m.cache.release_sequence(0)
    assert tier.blocks == 10
    m.cache.clear()
    twin = Model(KINDS["flat"]())
    twin.cache.add_sequence(0)
    twin.prefill(0, P[:4] + [50, 51])
    r = tier.restore(m.cache, m.pool, P[:4] + [50, 51, 77])
    assert r.hit == 6 and r.bytes == len(twin.pool.export_sequence(0, P[:4] + [50, 51]))
    m.cache.add_sequence(1)
    assert m.cache.adopt_prefix(1, P[:4] + [50, 51, 77]) == 6
    # A ring's record serves only its own last full block: each turn is a record of its own.
    ring = HostTier(1 << 20)
    spilled(KINDS["ring_sinks"](), turns, ring)
    assert len(ring) == ring.records == 3 and ring.blocks == 0


def test_a_flat_and_a_ring_model_share_one_tier_and_one_lru() -> None:
    """Blocks and records under one capacity: the least recently used goes first, whichever it is."""
    bb = block_bytes()
    tier = HostTier(1 << 20)
    spilled(KINDS["ring_sinks"](), [P], tier)
    rec = tier.bytes
    tier = HostTier(rec + 6 * bb)
    spilled(KINDS["ring_sinks"](), [P], tier)
    m = spilled(KINDS["flat"](), [P], tier)
    assert (tier.records, tier.blocks, tier.bytes) == (1, 6, rec + 6 * bb)
    assert set(tier.block_keys_held()) == {(0, 2, int(lo), int(hi)) for lo, hi in kvcore.block_keys(P, 2)}
    m.cache.add_sequence(0)
    m.prefill(0, Q_PARTIAL[:8])  # 4 blocks, 3 held: one more evicts the oldest, the ring's record
    assert tier.spill(m.cache, m.pool, 0, Q_PARTIAL[:8]) == bb
    assert (tier.records, tier.blocks, tier.evictions) == (0, 7, 1)


def test_held_blocks_whose_token_ids_differ_from_the_prompt_are_dropped_with_their_extensions() -> None:
    """A held block whose token ids are not the prompt's (its bytes damaged in host memory, or a
    key collision) is never imported: the restore refuses by name, drops it and the blocks after
    it, and changes nothing in the cache; the blocks before it still serve."""
    tier = HostTier(1 << 20)
    m = spilled(KINDS["flat"](), [P], tier)
    m.cache.clear()
    key = next(k for k in tier._lru if k[4:] == tuple(int(x) for x in kvcore.block_keys(P, 2)[3]))  # noqa: SLF001
    entry = tier._lru[key]  # noqa: SLF001 (damage block 3's first token id)
    entry.data = (99).to_bytes(4, "little") + entry.data[4:]  # type: ignore[union-attr]
    before = snapshot(m, Q_LONGER)
    with pytest.raises(InvalidArgumentError, match=r"restore: the blocks held for this prefix do not carry the "
                                                   r"prompt's first 12 token ids in its namespace: dropped"):
        tier.restore(m.cache, m.pool, Q_LONGER)
    assert snapshot(m, Q_LONGER) == before and tier.blocks == 3 and tier.longest(Q_LONGER, 2) == 6
    assert tier.restore(m.cache, m.pool, Q_LONGER).hit == 6
