"""kvcore.cluster (issue 42 item 2): a record published to the cluster store (a Ray actor holding
object refs) and restored on another cache reads, step after step, exactly what a twin that
computed it reads (flat, ring with sinks, State layers); a record the store evicted is never
served; several replicas publishing, evicting and looking up at once lose nothing and serve
nothing stale; namespaces hold end to end; hostile or mismatched records are refused as imports
are and dropped; the router's choice on a constructed case; bad inputs refused with nothing
changed. One local Ray instance for the module (num_cpus=2)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from needs import need

ray = need("ray", reason="the distributed extra (ray) is not installed: pip install 'kvcore[distributed]'")

import kvcore  # noqa: E402
from kvcore import CapacityError, InvalidArgumentError, InvalidStateError  # noqa: E402
from kvcore.cluster import (  # noqa: E402
    RecordStore, Replica, Request, Router, fetch, publish, publish_record, start_store,
)
from kvcore.tier import HostTier, namespace_id  # noqa: E402
from test_tier import KINDS, P, Q_LONGER, Model, config, kv, same  # noqa: E402


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    # The test actors and the test_tier helpers they call are pickled by value: Ray's workers
    # cannot import test modules (pytest puts tests/python on the driver's path only).
    import test_tier

    for module in (sys.modules[__name__], test_tier):
        ray.cloudpickle.register_pickle_by_value(module)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()
    for module in (sys.modules[__name__], test_tier):
        ray.cloudpickle.unregister_pickle_by_value(module)


def computed(kind: str, prompt: list[int], ns: Any = None) -> Model:
    m = Model(KINDS[kind]())
    m.cache.add_sequence(0, ns)
    m.prefill(0, prompt)
    return m


@pytest.fixture(scope="module")
def shared_store(local_ray: None) -> Iterator[Any]:
    store = start_store(1 << 20)
    yield store
    ray.kill(store)


@pytest.mark.parametrize("kind,keep", [("flat", False), ("ring_sinks", False), ("state", False), ("state", True)])
def test_a_record_from_the_store_reads_exactly_what_a_twin_computed(shared_store: Any, kind: str, keep: bool) -> None:
    # Released, a State model's import names its snapshot: the blocks and the state serve adopt_prefix.
    store, ns = shared_store, f"exact-{kind}-{keep}"  # one store; each case in a namespace of its own
    before = ray.get(store.stats.remote())
    a = computed(kind, P, ns)
    entry = publish(store, a.cache, a.pool, 0, P)
    assert entry >= 1 and publish(store, a.cache, a.pool, 0, P) == 0  # held already
    b, twin = Model(KINDS[kind]()), computed(kind, P, ns)
    twin.cache.release_sequence(0)
    tier = HostTier(1 << 20)
    f = fetch(store, tier, b.cache, Q_LONGER, ns, keep=keep)
    assert f.tokens == len(P) and f.nbytes > 0
    # A flat model's record enters the host tier as its 6 blocks (token ids and rows, no header); another's whole.
    assert (tier.blocks, tier.records) == (6, 0) if kind == "flat" else tier.bytes == f.nbytes
    r = tier.restore(b.cache, b.pool, Q_LONGER, ns, seq=1, keep=keep)
    assert (r.device_hit, r.hit) == (0, len(P))
    if not keep:
        b.cache.add_sequence(1, ns)
        assert b.cache.adopt_prefix(1, Q_LONGER) == len(P)
    twin.cache.add_sequence(1, ns)
    assert twin.cache.adopt_prefix(1, Q_LONGER) == len(P)
    assert same(b.prefill(1, Q_LONGER[len(P):]), twin.prefill(1, Q_LONGER[len(P):]))
    for t in range(4):
        assert same(b.step(1, [40 + t]), twin.step(1, [40 + t]))
    # The device and host tier now hold it: the store is not asked again.
    assert fetch(store, tier, b.cache, Q_LONGER, ns, keep=keep).tokens == 0
    stats = ray.get(store.stats.remote())
    assert (stats.records - before.records, stats.published - before.published,
            stats.duplicates - before.duplicates, stats.hits - before.hits) == (1, 1, 1, 1)


def test_a_record_evicted_from_the_store_is_never_served(local_ray: None) -> None:
    prompts = [[i * 10 + j for j in range(8)] for i in range(1, 5)]
    sizes = []
    for p in prompts:
        m = computed("flat", p)
        sizes.append(len(m.pool.export_sequence(0, p)))
    store = start_store(2 * max(sizes))  # room for two records
    for p in prompts:
        m = computed("flat", p)
        assert publish(store, m.cache, m.pool, 0, p) >= 1
    stats = ray.get(store.stats.remote())
    assert (stats.records, stats.evictions, stats.published) == (2, 2, 4)
    for i, p in enumerate(prompts):
        b = Model(KINDS["flat"]())
        f = fetch(store, HostTier(1 << 20), b.cache, p + [99])
        assert f.tokens == (8 if i >= 2 else 0), i  # the two oldest are gone for good
    ray.kill(store)


class Worker:
    """A replica-like actor for the concurrency test: computes prompts, publishes, fetches."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def publish_all(self, prompts: list[list[int]]) -> list[int]:
        out = []
        for p in prompts:
            m = computed("flat", p)
            out.append(publish(self.store, m.cache, m.pool, 0, p))
        return out

    def fetch_all(self, prompts: list[list[int]]) -> list[tuple[int, bool]]:
        """Per prompt: the store's hit and whether the restored blocks read the prompt's own rows."""
        out = []
        for p in prompts:
            b, tier = Model(KINDS["flat"]()), HostTier(1 << 20)
            q = p + [7]
            f = fetch(self.store, tier, b.cache, q)
            ok = True
            if f.tokens:
                tier.restore(b.cache, b.pool, q, seq=1)
                twin = computed("flat", p)
                twin.cache.release_sequence(0)
                b.cache.add_sequence(1)
                twin.cache.add_sequence(1)
                ok = b.cache.adopt_prefix(1, q) == twin.cache.adopt_prefix(1, q) == 8
                ok = ok and same(b.step(1, [7]), twin.step(1, [7]))
            out.append((f.tokens, ok))
        return out


def test_concurrent_publish_evict_and_lookup_lose_nothing_and_serve_nothing_stale(local_ray: None) -> None:
    prompts = [[w * 1000 + i * 10 + j for j in range(8)] for w in range(2) for i in range(6)]
    size = len(computed("flat", prompts[0]).pool.export_sequence(0, prompts[0]))
    store = start_store(5 * size)  # 12 records published, room for 5: evictions race lookups
    actor: Any = ray.remote(num_cpus=0)(Worker)
    workers = [actor.remote(store) for _ in range(2)]
    pubs = [w.publish_all.remote(prompts[6 * i: 6 * i + 6]) for i, w in enumerate(workers)]
    looks = [w.fetch_all.remote(prompts) for w in workers]
    ids = [e for ref in pubs for e in ray.get(ref)]
    seen = [x for ref in looks for x in ray.get(ref)]
    assert all(ok for _, ok in seen)  # every served record read the prompt's own rows
    assert all(t in (0, 8) for t, _ in seen)
    stats = ray.get(store.stats.remote())
    # Nothing lost: every publish is held or counted as evicted; ids are distinct.
    assert len(set(ids)) == len(ids) == 12 and all(e >= 1 for e in ids)
    assert stats.published == 12 and stats.records + stats.evictions == 12 and stats.records == 5
    assert stats.bytes == 5 * size and stats.hits == sum(1 for t, _ in seen if t)
    held = {e[0] for e in ray.get(store.entries.remote())}
    # Nothing stale: exactly the held records hit now, every evicted one misses.
    for p, e in zip(prompts, ids):
        b = Model(KINDS["flat"]())
        assert fetch(store, HostTier(1 << 20), b.cache, p + [7]).tokens == (8 if e in held else 0)
    for w in [*workers, store]:
        ray.kill(w)


def test_namespaces_hold_end_to_end(local_ray: None) -> None:
    store = start_store(1 << 20)
    a = computed("flat", P, "tenant-a")
    publish(store, a.cache, a.pool, 0, P)
    b, tier = Model(KINDS["flat"]()), HostTier(1 << 20)
    # Same tokens, another namespace: the store serves nothing, by key and by its own check.
    assert fetch(store, tier, b.cache, Q_LONGER, "tenant-b").tokens == 0 and len(tier) == 0
    keys_a = [(int(lo), int(hi)) for lo, hi in kvcore.block_keys(np.asarray(P, np.int32), 2, namespace_id("tenant-a"))]
    assert ray.get(store.lookup.remote(namespace_id("tenant-b"), 2, keys_a)) is None  # a forged ask
    assert fetch(store, tier, b.cache, Q_LONGER, None).tokens == 0
    # Its own namespace is served, and the blocks are named there only.
    assert fetch(store, tier, b.cache, Q_LONGER, "tenant-a").tokens == len(P)
    tier.restore(b.cache, b.pool, Q_LONGER, "tenant-a")
    assert b.cache.lookup_prefix(Q_LONGER, "tenant-a") == len(P)
    assert b.cache.lookup_prefix(Q_LONGER, "tenant-b") == b.cache.lookup_prefix(Q_LONGER) == 0
    ray.kill(store)


def test_hostile_and_mismatched_records_are_refused_and_dropped(local_ray: None) -> None:
    a = computed("flat", P)
    good = bytes(a.pool.export_sequence(0, P))
    corrupt = bytearray(good)
    corrupt[len(corrupt) // 2] ^= 0xFF
    keys = [(int(lo), int(hi)) for lo, hi in kvcore.block_keys(np.asarray(P, np.int32), 2, 0)]
    other = [t + 1 for t in P]
    o = computed("flat", other)
    mismatched = bytes(o.pool.export_sequence(0, other))
    store = start_store(1 << 20)
    for i, (bad, error, message) in enumerate((
            (bytes(corrupt), InvalidArgumentError, "corrupt"),
            (good[:100], InvalidArgumentError, "truncated"),
            (mismatched, InvalidArgumentError, "does not carry the prompt's first 12 token ids"))):
        # A hostile publisher claims P's keys for these bytes (publish_record would refuse them).
        entry = ray.get(store.publish.remote([ray.put(np.frombuffer(bad, np.uint8))], 0, 2, keys, 12, len(bad),
                                             True, False))
        b, tier = Model(KINDS["flat"]()), HostTier(1 << 20)
        before = (b.cache.free_blocks(0), b.cache.lookup_prefix(Q_LONGER))
        with pytest.raises(error, match=message):
            fetch(store, tier, b.cache, Q_LONGER)
        assert (b.cache.free_blocks(0), b.cache.lookup_prefix(Q_LONGER)) == before and len(tier) == 0
        stats = ray.get(store.stats.remote())
        assert (stats.records, stats.refused) == (0, i + 1)
        assert ray.get(store.refuse.remote(entry)) is False  # gone already
    ray.kill(store)
    with pytest.raises(InvalidArgumentError, match="corrupt"):
        publish_record(RecordStore(1 << 20), bytes(corrupt), namespace=None, block_size=2)


def test_bad_inputs_are_refused_by_name_and_change_nothing() -> None:
    st = RecordStore(100)
    keys = [(1, 2), (3, 4)]
    for args, message in (
        ((None, -1, 2, keys, 4, 10, True, False), r"namespace = -1: must be an int in \[0, 2\*\*64\)"),
        ((None, 0, 0, keys, 4, 10, True, False), "block_size = 0: must be an int >= 1"),
        ((None, 0, 2, [], 4, 10, True, False), "keys is empty"),
        ((None, 0, 2, keys, 7, 10, True, False), "length = 7: must hold exactly 2 full blocks of 2"),
        ((None, 0, 2, [(1, -2)], 2, 10, True, False), r"keys hi = -2"),
        ((None, 0, 2, keys, 4, 0, True, False), "nbytes = 0: must be an int >= 1"),
        ((None, 0, 2, keys, 4, 10, 1, False), "must be bools"),
    ):
        with pytest.raises(InvalidArgumentError, match=message):
            st.publish([None], *args[1:])
    with pytest.raises(CapacityError, match="a record of 101 bytes > the store's capacity_bytes 100"):
        st.publish([None], 0, 2, keys, 4, 101, True, False)
    with pytest.raises(InvalidArgumentError, match="value: must be a one-item list"):
        st.publish(b"record", 0, 2, keys, 4, 10, True, False)
    assert st.stats().records == st.stats().published == 0
    with pytest.raises(InvalidArgumentError, match="capacity_bytes = -1"):
        RecordStore(-1)
    with pytest.raises(InvalidArgumentError, match="above = -1"):
        st.lookup(0, 2, keys, -1)
    m = computed("flat", P)
    with pytest.raises(InvalidArgumentError, match="11 tokens for sequence 0 of length 12"):
        publish(st, m.cache, m.pool, 0, P[:-1])
    with pytest.raises(InvalidStateError, match="sequence 1 is not active"):
        publish(st, m.cache, m.pool, 1, P)
    with pytest.raises(InvalidArgumentError, match="policy = 'random'"):
        Router(2, 2, policy="random")
    with pytest.raises(InvalidArgumentError, match="alpha = -1"):
        Router(2, 2, alpha=-1)
    with pytest.raises(InvalidStateError, match="replica 1 has no request running"):
        Router(2, 2).finished(1)
    with pytest.raises(InvalidArgumentError, match=r"replica = 2: must be an int in \[0, 2\)"):
        Router(2, 2).update(2, frozenset())
    with pytest.raises(InvalidArgumentError, match="fetch: tokens must be an ordered sequence of ints, not a set"):
        fetch(st, HostTier(10), m.cache, {1, 2, 3})
    with pytest.raises(InvalidArgumentError, match="build must return"):
        Replica(0, lambda: (m.cache, object(), None), st, 0)
    rep = Replica(0, build_flat, st, 1 << 20)
    for request, message in ((Request(1, (), None, 1), r"0 prompt \+ 1 generated tokens: must be in \[1, capacity 48\]"),
                             (Request(1, tuple(range(40)), None, 9), "40 prompt"),
                             (Request(1, (1, 2), None, -1), "gen_len = -1")):
        with pytest.raises(InvalidArgumentError, match=message):
            rep.serve(request)
    assert not any(rep.cache.sequence(s).active for s in range(rep.cache.max_seqs)) and len(rep.tier) == 0


def test_the_router_weighs_cached_prefix_against_load() -> None:
    B = 2
    prompt = list(range(1, 14))  # 6 usable full blocks
    keys = [(0, int(lo), int(hi)) for lo, hi in kvcore.block_keys(np.asarray(prompt[:12], np.int32), B, 0)]
    r = Router(3, B, alpha=3.0)
    r.update(1, frozenset(keys[:4]))  # replica 1 holds 8 tokens of the prompt
    r.update(2, frozenset(keys[:2]))  # replica 2 holds 4
    assert [r.local(i, prompt) for i in range(3)] == [0, 8, 4]
    assert r.choose(prompt) == 1  # 8 - 0 beats 4 and 0
    assert r.choose(prompt) == 1  # 8 - 3 = 5 still beats 4
    assert r.choose(prompt) == 2  # 8 - 6 = 2 < 4: load wins
    assert r.decisions == [0, 2, 1] and r.running == [0, 2, 1]
    # The store's prefix counts at store_weight where a replica holds less.
    s = Router(2, B, alpha=3.0, store_weight=0.5)
    s.update(0, frozenset(keys[:1]))
    s.running[0] = 1
    assert s.choose(prompt, store=12) == 1  # 0.5 x 12 = 6 > 2 + 0.5 x 10 - 3 = 4
    # Another namespace's keys are not a hit.
    assert r.local(1, prompt, "tenant") == 0
    rr, ll = Router(3, B, policy="round_robin"), Router(3, B, policy="least_loaded")
    assert [rr.choose(prompt) for _ in range(4)] == [0, 1, 2, 0]
    ll.running = [2, 0, 1]
    assert ll.choose(prompt) == 1 and ll.running == [2, 1, 1]
    ll.running = [0, 0, 0]  # idle replicas: the one sent fewest so far, not always the first
    assert [ll.choose(prompt) for _ in range(2)] == [0, 2] and ll.decisions == [1, 1, 1]
    idle = Router(2, B)
    for _ in range(4):  # a miss everywhere, nothing running: kv alternates too
        idle.finished(idle.choose([9] * 13))
    assert idle.decisions == [2, 2]
    assert rr.balance() == pytest.approx(2 * 3 / 4)


def build_flat() -> tuple[kvcore.BatchCache, Any, Any]:
    m = Model(KINDS["flat"](blocks=16))

    def forward(tokens: list[int], step: Any, pool: Any) -> np.ndarray:
        pos = np.asarray(step.plan().positions)
        k = m.rows(0, pos, np.asarray(tokens))
        pool.update(0, step, k, k + 0.5)
        kk, _, _ = pool.gather(0, step, 0)  # a "next token" that depends on every row read
        logits = np.zeros((len(tokens), 8), np.float32)
        logits[:, int(kk.sum() * 7) % 8] = 1.0
        return logits

    return m.cache, m.pool, forward


def test_replicas_serve_from_the_store_what_another_computed() -> None:
    store = RecordStore(1 << 20)
    r0, r1 = Replica(0, build_flat, store, 1 << 20), Replica(1, build_flat, store, 1 << 20)
    first = r0.serve(Request(1, tuple(P), None, 2))
    assert (first.device, first.store, first.computed) == (0, 0, 12)
    again = r1.serve(Request(2, tuple(P + [1, 2, 3]), None, 2))  # another replica: the store serves it
    assert again.store == 12 and again.store_bytes > 0 and again.computed == 3
    local = r0.serve(Request(3, tuple(P + [50, 51, 52]), None, 2))  # its own device holds P
    assert local.device >= 12 and local.store == 0
    keys = {(0, int(lo), int(hi)) for lo, hi in kvcore.block_keys(np.asarray(P, np.int32), 2, 0)}
    assert keys <= local.held and keys <= again.held


def test_the_demo_replies_equal_single_process_decoding(local_ray: None) -> None:
    from kvcore_demo.cluster import ClusterOptions, format_report, run_cluster

    # Round-robin moves each conversation's turns between the two replicas: the store serves them.
    r = run_cluster(ClusterOptions(conversations=3, turns=3, policy="round_robin"))
    assert r["ok"], r["problems"]
    t = r["reused"]
    assert sum(t.values()) == r["prompt_tokens"] and t["store"] > 0 and r["store_bytes_moved"] > 0
    assert r["decisions"] == [5, 4] and r["refused"] == 0
    assert "every reply equals single-process decoding" in format_report(r)


def test_the_command_line_runs_it_and_refuses_bad_options(local_ray: None, capsys: Any,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from kvcore import cli

    code = cli.main(["demo", "--cluster", "--conversations", "2", "--turns", "2", "--gen-len", "2", "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    report = json.loads(out)
    assert report["ok"] and report["requests"] == 4 and report["policy"] == "kv"
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("Ray started before the options were checked"))
    for argv, message in ((["--replicas", "0"], "--replicas = 0: must be >= 1"),
                          (["--alpha", "-1"], "--alpha = -1.0: must be >= 0"),
                          (["--block-size", "0"], "--block-size = 0: must be >= 1")):
        assert cli.main(["demo", "--cluster", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"kvcore demo --cluster: error: {message}") and err.count("\n") == 1
    for argv in (["demo", "--cluster", "--help"], ["--cluster", "--help"]):  # the demo is the main job
        with pytest.raises(SystemExit) as exit_:
            cli.main(argv)
        assert exit_.value.code == 0 and "--store-records" in capsys.readouterr().out, argv


def test_a_replica_refuses_a_hostile_store_record_and_computes_instead() -> None:
    store = RecordStore(1 << 20)
    a = computed("flat", P)
    corrupt = np.frombuffer(bytes(a.pool.export_sequence(0, P)), np.uint8).copy()
    corrupt[len(corrupt) // 2] ^= 0xFF
    keys = [(int(lo), int(hi)) for lo, hi in kvcore.block_keys(np.asarray(P, np.int32), 2, 0)]
    store.publish([corrupt], 0, 2, keys, 12, len(corrupt), True, False)
    rep = Replica(0, build_flat, store, 1 << 20)
    reply = rep.serve(Request(1, tuple(Q_LONGER), None, 1))
    assert (reply.refused, reply.store, reply.computed) == (1, 0, len(Q_LONGER)) and rep.refused == 1
    assert store.stats().refused == 1
    # Its own record (the prompt's, computed) replaced the hostile one: a second replica reads it.
    again = Replica(1, build_flat, store, 1 << 20).serve(Request(2, tuple(Q_LONGER), None, 1))
    assert again.store == 14 and again.refused == 0 and again.tokens == reply.tokens


def test_a_replica_never_serves_another_namespaces_prefix() -> None:
    store = RecordStore(1 << 20)
    r0, r1 = Replica(0, build_flat, store, 1 << 20), Replica(1, build_flat, store, 1 << 20)
    r0.serve(Request(1, tuple(P), "tenant-a", 1))
    for rep, ns in ((r0, "tenant-b"), (r1, "tenant-c"), (r0, None)):  # P is held in tenant-a only
        other = rep.serve(Request(2, tuple(P + [1]), ns, 1))
        assert (other.device, other.host, other.store, other.computed) == (0, 0, 0, 13)
    own = r1.serve(Request(3, tuple(P + [1]), "tenant-a", 1))
    assert own.store == 12


def test_a_record_of_another_model_is_refused_and_kept_for_its_own() -> None:
    store = RecordStore(1 << 20)
    ring = computed("ring_sinks", P)
    publish(store, ring.cache, ring.pool, 0, P)  # the same tokens and namespace, another model
    others = ((KINDS["flat"](), "has 2 layers, this cache 1"),
              (config([kv(kvcore.Flat()), kv(kvcore.Ring(5, 2))]), "layer 0 is ring, this cache's flat"),
              (config([kvcore.LayerConfig(kvcore.Ring(5, 2), 1, 4), kvcore.LayerConfig(kvcore.Flat(), 1, 4)]),
               "layer 0 has 2 x 4 K rows, this cache's 1 x 4"))
    for cfg, message in others:
        b, tier = Model(cfg), HostTier(1 << 20)
        before = (b.cache.free_blocks(0), b.cache.lookup_prefix(Q_LONGER))
        with pytest.raises(InvalidArgumentError, match=message):
            fetch(store, tier, b.cache, Q_LONGER, pool=b.pool)
        assert len(tier) == 0 and (b.cache.free_blocks(0), b.cache.lookup_prefix(Q_LONGER)) == before
    f16 = Model(KINDS["ring_sinks"]())
    f16.pool = kvcore.PagedKVPool(f16.cache, np.float16)
    with pytest.raises(InvalidArgumentError, match="holds float32 rows, this pool float16"):
        fetch(store, HostTier(1 << 20), f16.cache, Q_LONGER, pool=f16.pool)
    assert store.stats().records == 1  # kept: a replica of its own model reads it
    own, tier = Model(KINDS["ring_sinks"]()), HostTier(1 << 20)
    assert fetch(store, tier, own.cache, Q_LONGER, pool=own.pool).tokens == len(P)
