"""Replays a Mooncake-format trace through N kvcore.cluster replicas over one record store, each
request sent by the router (issue 42 item 3, the cluster part): prompt tokens reused per tier
(device, host tier, store) against the ideal, the router's balance, bytes moved per reused token.

The pieces are kvcore's own, in one process: N ``kvcore.cluster.Replica`` objects (each its own
``BatchCache`` + ``PagedKVPool`` + ``HostTier``) over one ``RecordStore`` (a Ray actor in a
cluster; here the same class in this process: the replay measures what the tiers and the router
decide, not Ray's transport, which tests/python/test_cluster.py runs) and a ``Router``. Every
replica's device is a tiny real byte pool (one flat layer of 1 x 8 float32, tier_replay's shape:
no decision of the cache depends on heads, dims or layers) of the blocks tier_replay's one
replica gets at ``--budget`` (2x the peak working set: each replica as large as that one; with
``--split`` 1/N of it, so the cluster's devices hold what the one replica's does); its host tier ``--host-x`` times the device's record bytes; the store
``--store-x`` times the cluster's (N devices'). Records are the prompt's (the trace's sampled tokens never start
a later prompt), published after each request.

**Time and load.** Requests are served in arrival order, each to completion before the next (a
replica runs one request at a time in kvcore's sense: its device holds cached prefixes between
requests). The router's load is modelled from the trace's clock: a request occupies its replica
from its arrival (or when the replica frees up) for its computed prompt tokens at
``--prefill-rate`` tokens/s plus its output tokens at ``--decode-rate`` tokens/s; ``running`` at an
arrival is the replica's requests not yet finished by that clock. Balance is reported as max / mean
of the requests sent per replica and of the busy time per replica.

**The ideal** is trace_replay's: an infinite cache's reuse of each prompt (``trace_ideal``).
**Bytes moved** are the records imported (store to host tier, host tier to device), as record
tokens per reused token and in the Llama-like model's bytes (tier_replay's HostModel).

    python3 bench/cluster_replay.py --replicas 2,4 --out bench/results/cluster_replay.json
    python3 bench/cluster_replay.py --generate 2000 --seed 7 --replicas 2,4 --out bench/results/cluster_replay_generated.json
    python3 bench/cluster_replay.py --split --replicas 2,4 --out bench/results/cluster_replay_split.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tier_replay as tier  # noqa: E402
from replay.layouts import budgets_for, capacity_of, kvcore_layout, kvcore_one_pool  # noqa: E402
from replay.models import make_model  # noqa: E402
from replay.scheduler import SchedulerConfig  # noqa: E402
from replay.trace import (DEFAULT_TRACE, TraceRequest, generate_trace, load_trace, prompt_tokens,
                          trace_ideal)  # noqa: E402


def build_replica(block: int, num_blocks: int, capacity: int, chunk: int) -> Any:
    """A build function for kvcore.cluster.Replica: the tiny flat pool, rows encoding token and position."""
    import kvcore

    def build() -> tuple[Any, Any, Any]:
        limits = kvcore.BatchLimits(block_size=block, max_seqs=2, max_active_seqs=1, num_blocks=num_blocks,
                                    max_step_tokens=chunk)
        cache = kvcore.BatchCache(kvcore.CacheConfig(
            capacity, [kvcore.LayerConfig(kvcore.Flat(), 1, tier.TINY_DIM)], max_step=chunk, batch=limits))
        pool = kvcore.PagedKVPool(cache, np.float32)

        def forward(tokens: list[int], step: Any, pool: Any) -> np.ndarray:
            pos = np.asarray(step.plan().positions)
            rows = tier.encode_rows(np.asarray(tokens, np.int64), pos)
            pool.update(0, step, rows, rows)
            return np.zeros((len(tokens), 1), np.float32)

        return cache, pool, forward

    return build


def record_bytes(block: int, tokens: int) -> int:
    """The tiny record's bytes for `tokens` positions (measured: one export)."""
    import kvcore

    limits = kvcore.BatchLimits(block_size=block, max_seqs=1, num_blocks=-(-tokens // block) + 1,
                                max_step_tokens=tokens)
    cache = kvcore.BatchCache(kvcore.CacheConfig(tokens, [kvcore.LayerConfig(kvcore.Flat(), 1, tier.TINY_DIM)],
                                                 max_step=tokens, batch=limits))
    pool = kvcore.PagedKVPool(cache, np.float32)
    toks = np.arange(1, tokens + 1, dtype=np.int32)
    cache.add_sequence(0)
    step = cache.begin_step(np.zeros(1, np.int32), np.array([tokens], np.int32), toks)
    rows = np.zeros((tokens, 1, tier.TINY_DIM), np.float32)
    pool.update(0, step, rows, rows)
    cache.commit(step)
    return len(pool.export_sequence(0, toks))


def device_blocks(trace: Sequence[TraceRequest], block: int, budget: str) -> int:
    """A replica's device: the blocks tier_replay's one replica gets at `budget` (a multiple of the
    peak working set of the Llama-like model, trace_replay's scheduler), at least the longest
    prompt's blocks and one more."""
    model, cfg = make_model("llama"), SchedulerConfig()
    capacity = capacity_of(trace, block)
    budgets, _ = budgets_for(model, block, trace, cfg, capacity, [budget], None, None,
                             one_pool=kvcore_one_pool())
    layout = kvcore_layout(model, block, budgets[budget], cfg, capacity, one_pool=kvcore_one_pool())
    longest = -(-max(r.input_length for r in trace) // block)
    return max(int(layout["num_blocks_flat"]), longest + 1)


def run_cluster(trace: Sequence[TraceRequest], block: int, replicas: int, policy: str, *, num_blocks: int,
                host_x: float, store_x: float, alpha: float, prefill_rate: float, decode_rate: float,
                hm: tier.HostModel, ideal: Sequence[int]) -> dict[str, Any]:
    """One replay: `replicas` replicas of `num_blocks` device blocks each, router `policy`; the
    report's fields."""
    from kvcore.cluster import RecordStore, Replica, Request, Router

    capacity = capacity_of(trace, block)
    chunk = 2048
    device_record = record_bytes(block, num_blocks * block)  # one device's worth of record bytes
    store = RecordStore(int(store_x * device_record * replicas))
    reps = [Replica(i, build_replica(block, num_blocks, capacity, chunk), store, int(host_x * device_record))
            for i in range(replicas)]
    router = Router(replicas, block, policy=policy, alpha=alpha)
    finish: list[list[float]] = [[] for _ in range(replicas)]  # each replica's running requests' end times (s)
    free_at = [0.0] * replicas
    busy = [0.0] * replicas
    tiers = {"device": 0, "host": 0, "store": 0, "computed": 0}
    moved_tiny = {"store": 0, "host": 0}
    records_moved = {"store": 0, "host": 0}
    refused = 0
    cpu = 0.0
    t0 = time.perf_counter()
    for r in trace:
        now = r.arrival_ms / 1000.0
        for i in range(replicas):  # requests finished by now leave the router's count
            done = [t for t in finish[i] if t <= now]
            for _ in done:
                router.finished(i)
            finish[i] = [t for t in finish[i] if t > now]
        toks = prompt_tokens(r)
        usable = (len(toks) - 1) // block
        keys = [(int(lo), int(hi)) for lo, hi in tr_keys(toks[: usable * block], block)]
        c0 = time.thread_time()
        store_hit = store.longest(0, block, keys) if keys else 0
        i = router.choose(toks, None, store_hit)
        reply = reps[i].serve(Request(r.index, tuple(int(t) for t in toks), None, 0))
        router.update(i, reply.held)
        cpu += time.thread_time() - c0
        for k in tiers:
            tiers[k] += getattr(reply, k)
        if reply.store_bytes:
            moved_tiny["store"] += reply.store_bytes
            records_moved["store"] += 1
        if reply.host_bytes:
            moved_tiny["host"] += reply.host_bytes
            records_moved["host"] += 1
        refused += reply.refused
        start = max(now, free_at[i])
        service = reply.computed / prefill_rate + r.output_length / decode_rate
        free_at[i] = start + service
        busy[i] += service
        finish[i].append(free_at[i])
    wall = time.perf_counter() - t0
    prompt = sum(r.input_length for r in trace)
    reused = tiers["device"] + tiers["host"] + tiers["store"]
    ideal_total = sum(ideal)
    moved_tokens = {k: hm.tokens(moved_tiny[k], records_moved[k]) for k in moved_tiny}
    stats = store.stats()
    return {
        "replicas": replicas, "policy": policy, "block": block, "requests": len(trace),
        "device_blocks": num_blocks, "host_x": host_x, "store_x": store_x, "alpha": alpha,
        "prompt_tokens": prompt, "ideal_tokens": ideal_total, "reused_tokens": reused,
        **{f"{k}_tokens": v for k, v in tiers.items()},
        "reused_pct": 100.0 * reused / prompt, "of_ideal_pct": 100.0 * reused / ideal_total if ideal_total else 0.0,
        "device_of_ideal_pct": 100.0 * tiers["device"] / ideal_total if ideal_total else 0.0,
        "host_of_ideal_pct": 100.0 * tiers["host"] / ideal_total if ideal_total else 0.0,
        "store_of_ideal_pct": 100.0 * tiers["store"] / ideal_total if ideal_total else 0.0,
        "decisions": router.decisions, "balance_requests": router.balance(),
        "balance_busy": max(busy) * replicas / sum(busy) if sum(busy) else 0.0,
        "peak_running": router.peak_running,
        "record_tokens_moved": moved_tokens,
        "record_tokens_moved_per_reused_token": (moved_tokens["store"] + moved_tokens["host"]) / reused if reused else 0.0,
        "llama_bytes_moved_per_reused_token":
            (moved_tokens["store"] + moved_tokens["host"]) * hm.real_per_token / reused if reused else 0.0,
        "refused_records": refused, "store": stats.__dict__,
        "cpu_s_route_and_serve": cpu, "wall_s": wall,
    }


def tr_keys(tokens: np.ndarray, block: int) -> Any:
    """kvcore.block_keys of the default namespace (what the router and store key)."""
    import kvcore

    return kvcore.block_keys(tokens, block, 0)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=str(DEFAULT_TRACE))
    ap.add_argument("--limit", type=int, help="replay only the first LIMIT requests")
    ap.add_argument("--generate", type=int, metavar="N", help="a generated trace of N requests instead")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rate", type=float, default=4.0, help="--generate arrivals per second")
    ap.add_argument("--block", type=int, default=512)
    ap.add_argument("--replicas", default="2,4")
    ap.add_argument("--policies", default="kv,least_loaded,round_robin")
    ap.add_argument("--budget", default="2x", help="a replica's device: tier_replay's one replica's budget")
    ap.add_argument("--split", action="store_true",
                    help="each replica gets 1/N of that device (the cluster's devices equal the one replica's)")
    ap.add_argument("--host-x", type=float, default=8.0, help="a host tier: multiples of a device's record bytes")
    ap.add_argument("--store-x", type=float, default=8.0,
                    help="the store: multiples of the cluster's device record bytes (N devices)")
    ap.add_argument("--alpha", type=float, default=2048.0, help="kv router: tokens per running request")
    ap.add_argument("--prefill-rate", type=float, default=81920.0, help="modelled prefill tokens/s per replica")
    ap.add_argument("--decode-rate", type=float, default=2000.0, help="modelled output tokens/s per replica")
    ap.add_argument("--out", help="write the JSON here")
    args = ap.parse_args(argv)
    if args.generate:
        trace = generate_trace(args.generate, args.seed, rate_per_s=args.rate)[: args.limit]
        name = f"generated(n={args.generate}, seed={args.seed}, rate={args.rate})"
    else:
        trace = load_trace(args.trace, args.limit)
        name = args.trace + (f" (first {args.limit})" if args.limit else "")
    ideal = trace_ideal(trace, args.block)
    hm = tier.measure_host_model(make_model("llama"))
    blocks = device_blocks(trace, args.block, args.budget)
    longest = -(-max(r.input_length for r in trace) // args.block)
    rows = []
    for n in (int(x) for x in args.replicas.split(",")):
        for policy in args.policies.split(","):
            per = max(blocks // n, longest + 1) if args.split else blocks
            r = run_cluster(trace, args.block, n, policy, num_blocks=per, host_x=args.host_x,
                            store_x=args.store_x, alpha=args.alpha, prefill_rate=args.prefill_rate,
                            decode_rate=args.decode_rate, hm=hm, ideal=ideal)
            rows.append(r)
            print(f"N={n} {policy:13s} reused {r['reused_pct']:5.1f}% of prompt = {r['of_ideal_pct']:5.1f}% of ideal "
                  f"(device {r['device_of_ideal_pct']:.1f}, host {r['host_of_ideal_pct']:.1f}, store "
                  f"{r['store_of_ideal_pct']:.1f}); balance requests {r['balance_requests']:.2f}, busy "
                  f"{r['balance_busy']:.2f}; moved {r['record_tokens_moved_per_reused_token']:.2f} record tokens "
                  f"({r['llama_bytes_moved_per_reused_token'] / 1e3:.0f} kB Llama) per reused token; "
                  f"{r['wall_s']:.1f} s", flush=True)
    ideal_pct = 100.0 * sum(ideal) / sum(r.input_length for r in trace)
    print(f"ideal (infinite cache): {ideal_pct:.2f}% of {sum(r.input_length for r in trace)} prompt tokens")
    if args.out:
        Path(args.out).write_text(json.dumps({"trace": name, "ideal_pct": ideal_pct, "machine": platform.machine(),
                                              "runs": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
