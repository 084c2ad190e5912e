"""kvcore.tier.HostTier (issue 42, item 1): a sequence computed, spilled to the host tier,
evicted from the device (clear, or a pool filled by other work), restored and adopted reads,
step after step, exactly what a twin cache that never lost it reads; for Flat, Ring with
sinks, Chunked, Shared and State layers. The tier's own LRU eviction by bytes, a record it
evicted never served, namespaces isolated, bad inputs refused with nothing changed."""

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
    stored = tier.spill(a.cache, a.pool, 0, P)
    assert stored == tier.bytes > 0 and len(tier) == 1
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
    if kind == "state" and not keep:  # an import names no state snapshot: released, it would serve nothing
        before = snapshot(a, Q_LONGER)
        assert tier.longest(Q_LONGER, 2) == 0
        r = tier.restore(a.cache, a.pool, Q_LONGER)
        assert (r.hit, r.bytes) == (0, 0) and tier.misses == 1 and snapshot(a, Q_LONGER) == before
        return
    assert tier.longest(Q_LONGER, 2, keep=keep) == len(P)
    r = tier.restore(a.cache, a.pool, Q_LONGER, seq=1, keep=keep)
    assert isinstance(r, Restored) and r.device_hit == 0 and r.hit == len(P) == r.tokens
    assert r.bytes == stored and r.seconds > 0 and tier.hits == 1 and tier.misses == 0
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


@pytest.mark.parametrize("kind", ["flat", "shared"])
@pytest.mark.parametrize("keep", [False, True], ids=["released", "kept"])
def test_a_flat_model_restores_a_partial_prefix(kind: str, keep: bool) -> None:
    """Flat layers serve every full block of a record: a prompt sharing 3 of P's 6 blocks hits 3."""
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
    want = 6 if kind == "flat" else 0  # a Ring layer (shared's layer 1) serves only the record's end
    if kind == "shared":
        assert r.hit == r.bytes == 0 and tier.misses == 1
        return
    assert r.hit == want
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
    prompts = [[i * 10 + j for j in range(8)] for i in range(1, 5)]
    probe = HostTier(1 << 20)
    spilled(KINDS["flat"](), prompts[:1], probe)
    size = probe.bytes
    tier = HostTier(2 * size + size // 2)  # room for two
    m = spilled(KINDS["flat"](), prompts[:2], tier)
    assert tier.bytes == 2 * size and tier.evictions == 0
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
    # Capacity 0 holds nothing; a record larger than capacity is refused, nothing changes.
    small = HostTier(size - 1)
    m.cache.add_sequence(0)
    m.prefill(0, prompts[3])
    with pytest.raises(CapacityError, match=rf"spill: a record of {size} bytes > the tier's capacity_bytes {size - 1}"):
        small.spill(m.cache, m.pool, 0, prompts[3])
    assert small.bytes == 0 and len(small) == 0 and small.evictions == 0


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
    rec = tier._entries[next(iter(tier._entries))].record  # noqa: SLF001 (the stored bytes)
    other = HostTier(1 << 20)
    assert other.put(rec, namespace="tenant-a", block_size=2) == len(rec)
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
    assert snapshot(ring, Q_LONGER) == before and len(tier) == 1


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


def test_a_flat_prefix_is_held_once_and_the_smallest_record_serves() -> None:
    """A conversation's turns: each turn's record extends the last one's. A flat record serves
    every full-block prefix, so the tier keeps one: a turn supersedes the turns it extends, a
    record whose blocks a held one holds is not stored again (its holder's recency moves), and
    of two records serving a prefix the smaller is imported. Rings keep one record per length."""
    turns = [P[:4], P[:8], P]  # 2, 4, 6 full blocks, each a prefix of the next
    tier = HostTier(1 << 20)
    sizes = []
    m = Model(KINDS["flat"]())
    for t in turns:
        m.cache.add_sequence(0)
        m.prefill(0, t)
        sizes.append(tier.spill(m.cache, m.pool, 0, t))
        m.cache.release_sequence(0)
    assert all(s > 0 for s in sizes) and len(tier) == 1 and tier.bytes == sizes[-1]
    assert tier.superseded == 2 and tier.evictions == 0
    for t in turns:  # every turn's prefix is still served, by the one record
        assert tier.longest(t + [99], 2) == len(t)
    m.cache.add_sequence(0)
    m.prefill(0, P[:6])  # 3 full blocks, all held: nothing stored
    assert tier.spill(m.cache, m.pool, 0, P[:6]) == 0 and len(tier) == 1
    m.cache.release_sequence(0)
    # Another conversation sharing P's first 2 blocks: two records serve a 2-block prefix; the
    # smaller one is imported (fewer bytes, fewer device blocks).
    other = P[:4] + [40, 41, 42, 43]
    m.cache.add_sequence(0)
    m.prefill(0, other)
    small = tier.spill(m.cache, m.pool, 0, other)
    m.cache.release_sequence(0)
    assert 0 < small < sizes[-1] and len(tier) == 2
    m.cache.clear()
    r = tier.restore(m.cache, m.pool, P[:4] + [77, 78, 79])
    assert r.hit == 4 and r.bytes == small
    m.cache.add_sequence(1)
    assert m.cache.adopt_prefix(1, P[:4] + [77]) == 4
    # A ring's record serves only its own last full block: no turn supersedes another.
    ring = HostTier(1 << 20)
    spilled(KINDS["ring_sinks"](), turns, ring)
    assert len(ring) == 3 and ring.superseded == 0
