"""Per-token cost of KV-cache management: kvcore against the caches people use today.

A Gemma-3-1B-shaped layer stack (26 layers, 1 KV head x 256, sliding window 512,
five sliding : one full, float16) is prefilled in max_step chunks, then decodes
one token at a time. Per token, every layer writes its new K/V and obtains the
history it attends over. Candidates (bench/candidates.py): kvcore's KVPool.update
(numpy) and its transformers integration, transformers' DynamicCache and
StaticCache (their own sliding-window layers, driven by cache.update(k, v,
layer_idx) as a model forward does), a preallocated numpy buffer (naive best
case) and the raw copy of the new bytes (the floor).

All candidates run in this one process, interleaved: each repetition times a
block of tokens per candidate, rotating the order; the figure is the median of
the blocks' per-token cost, and ratios are taken within a context. Before
timing, --check (on by default) proves every candidate returns the same history
(positions and bytes) on a short run with fresh random K/V per step. Peak memory
is measured one cache at a time after the timing: freed memory is handed back to
the OS (malloc_trim), the peak RSS is reset (/proc/self/clear_refs), and the
cache prefills and decodes; the figure is peak RSS above the RSS before it was
built.

    python bench/compare.py [--quick] [--out bench/results/compare.json]

torch runs with one thread, like the numpy candidates.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import platform
import statistics
import sys
import time
from typing import Any, Optional, Sequence

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from candidates import CACHES, CANDIDATES, Candidate, Returned, Shape  # noqa: E402

import kvcore  # noqa: E402

QUICK = dict(contexts=[1024, 4096, 16384], reps=3, tokens=8, layer_calls=2000, memory_context=16384)
FULL = dict(contexts=[1024, 4096, 16384, 65536], reps=7, tokens=32, layer_calls=20000, memory_context=16384)


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def random_kv(rng: np.random.Generator, shape: Shape, T: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per-layer K and V of one step: (T, n_kv_heads, head_dim) each."""
    size = (T, shape.n_kv_heads, shape.head_dim)
    k = [rng.standard_normal(size).astype(shape.dtype) for _ in range(shape.n_layers)]
    v = [rng.standard_normal(size).astype(shape.dtype) for _ in range(shape.n_layers)]
    return k, v


def chunks(start: int, end: int, max_step: int) -> list[tuple[int, int]]:
    """(position, T) steps covering [start, end) in max_step pieces."""
    return [(p, min(max_step, end - p)) for p in range(start, end, max_step)]


# --- correctness: every candidate hands attention the same history ----------------


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-exact equality (byte views compare far faster than float16 elements)."""
    return a.shape == b.shape and np.array_equal(
        np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8)
    )


def check_candidate(name: str, shape: Shape, steps: Sequence[tuple[int, int]], seed: int) -> None:
    """Runs `steps` with fresh random K/V; raises AssertionError at the first wrong row."""
    end = steps[-1][0] + steps[-1][1]
    candidate = CANDIDATES[name](shape, end)
    sliding = shape.sliding()
    rng = np.random.default_rng(seed)
    ref_k = np.zeros((shape.n_layers, end, shape.n_kv_heads, shape.head_dim), shape.dtype)
    ref_v = np.zeros_like(ref_k)
    for position, T in steps:
        k, v = random_kv(rng, shape, T)
        ref_k[:, position : position + T] = np.stack(k)
        ref_v[:, position : position + T] = np.stack(v)
        out = candidate.step(position, candidate.prepare(k), candidate.prepare(v), check=True)
        assert out is not None
        for layer, (positions, keys, values) in enumerate(out):
            needed = shape.needed(sliding[layer], position, T)
            where = f"{name}: layer {layer}, step at {position} with T={T}"
            # Rows may come in any order (kvcore's default is row order) and may
            # include rows no query sees (masked by their positions): the rows
            # holding needed positions must hold each exactly once, as written.
            in_needed = np.isin(positions, needed)
            held, rows = np.unique(positions[in_needed], return_index=True)
            rows = np.flatnonzero(in_needed)[rows]
            assert held.size == in_needed.sum(), f"{where}: a needed position is returned twice"
            missing = np.setdiff1d(needed, held)
            assert missing.size == 0, f"{where}: positions {missing[:5].tolist()}... not returned"
            if name in ("kvcore-positions", "kvcore-mirror", "kvcore-hf"):  # position order: exactly the needed set
                got = positions[:8].tolist()
                assert np.array_equal(positions, needed), f"{where}: returned {got}..., not the needed set"
            assert same_bytes(keys[rows], ref_k[layer, needed]), f"{where}: K rows differ from what was written"
            assert same_bytes(values[rows], ref_v[layer, needed]), f"{where}: V rows differ from what was written"


def check_steps(shape: Shape) -> list[tuple[int, int]]:
    """Prefill chunks well past the window, odd-sized steps, then decode steps across
    the point where a ring layer's window starts to wrap round its R = W + C - 1 rows."""
    ring = shape.window + shape.max_step - 1
    odd = [3, 1, min(shape.max_step, shape.window + 1), 2]
    start = 2 * shape.max_step + shape.window // 2 + 3 + sum(odd)
    decode_from = start + (ring - 4 - start) % ring  # four decode steps before the wrap
    steps = chunks(0, decode_from - sum(odd), shape.max_step)
    position = decode_from - sum(odd)
    for T in odd:
        steps.append((position, T))
        position += T
    steps += [(position + i, 1) for i in range(12)]
    return steps


# --- per-token cost, interleaved ---------------------------------------------------


def time_context(
    names: Sequence[str], shape: Shape, context: int, reps: int, tokens: int, seed: int
) -> list[dict[str, Any]]:
    """Per-token decode cost of each candidate around `context`: blocks of `tokens`
    tokens, one warm-up block then `reps` timed ones, centred on `context`."""
    span = (reps + 1) * tokens
    start = max(0, context - span // 2)
    capacity = start + span
    rng = np.random.default_rng(seed)
    chunk_k, chunk_v = random_kv(rng, shape, shape.max_step)
    token_k, token_v = random_kv(rng, shape, 1)
    candidates: list[Candidate] = [CANDIDATES[n](shape, capacity) for n in names]
    prefill_s: dict[str, float] = {}
    position: dict[str, int] = {}
    for c in candidates:
        t0 = time.perf_counter()
        for p, T in chunks(0, start, shape.max_step):
            c.step(p, c.prepare([a[:T] for a in chunk_k]), c.prepare([a[:T] for a in chunk_v]))
        prefill_s[c.name] = time.perf_counter() - t0
        position[c.name] = start
    inputs = {c.name: (c.prepare(token_k), c.prepare(token_v)) for c in candidates}
    samples: dict[str, list[float]] = {c.name: [] for c in candidates}

    def block(c: Candidate) -> float:
        k, v = inputs[c.name]
        p = position[c.name]
        step = c.step
        t0 = time.perf_counter_ns()
        for i in range(tokens):
            step(p + i, k, v)
        elapsed = time.perf_counter_ns() - t0
        position[c.name] = p + tokens
        return elapsed / tokens / 1e3

    gc.collect()
    gc.disable()
    try:
        for c in candidates:
            block(c)  # warm-up
        for rep in range(reps):
            shift = rep % len(candidates)
            for c in candidates[shift:] + candidates[:shift]:
                samples[c.name].append(block(c))
    finally:
        gc.enable()
    rows = []
    for c in candidates:
        rows.append(
            dict(
                context=context, cache=c.name, label=c.label,
                per_token_us=statistics.median(samples[c.name]),
                per_layer_us=statistics.median(samples[c.name]) / shape.n_layers,
                samples_us=[round(x, 3) for x in samples[c.name]],
                held_bytes=c.held_bytes(), prefill_s=round(prefill_s[c.name], 4),
                positions=[start + tokens, capacity],
            )
        )  # fmt: skip
    del candidates
    gc.collect()
    return rows


# --- one layer, T = 1: kvcore's update against the copy floor ----------------------


def time_layer_update(shape: Shape, context: int, calls: int, reps: int, seed: int) -> list[dict[str, Any]]:
    """Median ns of one pool.update(layer, step, k, v) at T = 1 against copying the
    same bytes (`dst[...] = src` for K and for V): a flat layer, a ring layer whose
    window is one run of rows, and one whose window wraps round the ring (two runs:
    a view in row order (the default), gathered by a compact pool in position order,
    a view with mirror_rings)."""
    sliding = shape.sliding()
    flat, ring = sliding.index(False), sliding.index(True)
    capacity = context + 2 * (shape.window + shape.max_step) + 4
    rng = np.random.default_rng(seed)
    chunk_k, chunk_v = random_kv(rng, shape, shape.max_step)
    k, v = random_kv(rng, shape, 1)
    k_dst, v_dst = np.zeros_like(k[0]), np.zeros_like(v[0])

    def run_floor() -> float:
        kl, vl = k[0], v[0]
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            k_dst[...] = kl
            v_dst[...] = vl
        return (time.perf_counter_ns() - t0) / calls

    cases = []
    plan = [
        ("kvcore", "flat layer (view)", flat, 1),
        ("kvcore", "ring layer, window in one run (row order: view)", ring, 1),
        ("kvcore", "ring layer, window wraps (row order, the default: view)", ring, 2),
        ("kvcore-positions", "ring layer, window wraps (position order: gather)", ring, 2),
        ("kvcore-mirror", "ring layer, window wraps, mirror_rings (position order: view)", ring, 2),
    ]
    for name in dict.fromkeys(p[0] for p in plan):
        candidate = CANDIDATES[name](shape, capacity)
        cache, pool = candidate.cache, candidate.pool  # type: ignore[attr-defined]
        for p, T in chunks(0, context, shape.max_step):
            candidate.step(p, [a[:T] for a in chunk_k], [a[:T] for a in chunk_v])

        def run_update(layer: int, step: Any) -> float:
            update, kl, vl, order = pool.update, k[layer], v[layer], candidate.order  # type: ignore[attr-defined]
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                update(layer, step, kl, vl, order=order)
            return (time.perf_counter_ns() - t0) / calls

        for _, label, layer, runs in [c for c in plan if c[0] == name]:
            # Decode until the layer's plan reads `runs` runs; repeating an update at
            # the begun step rewrites the same row, so each call is one update.
            while True:
                step = cache.begin_step(1)
                if len(step.plan(layer).read) == runs:
                    break
                for other in range(shape.n_layers):
                    pool.update(other, step, k[other], v[other])
                step.commit()
            for other in range(shape.n_layers):
                pool.update(other, step, k[other], v[other])
            read_rows = len(pool.update(layer, step, k[layer], v[layer], order=candidate.order)[2])  # type: ignore[attr-defined]
            update_ns: list[float] = []
            floor_ns: list[float] = []
            gc.disable()
            try:
                run_update(layer, step)
                for _ in range(reps):
                    update_ns.append(run_update(layer, step))
                    floor_ns.append(run_floor())
            finally:
                gc.enable()
            step.commit()
            u, f = statistics.median(update_ns), statistics.median(floor_ns)
            cases.append(
                dict(
                    case=label, cache=name, layer=layer, position=step.position, read_rows=read_rows,
                    update_ns=round(u, 1), floor_ns=round(f, 1), overhead_ns=round(u - f, 1),
                    update_samples_ns=[round(x, 1) for x in update_ns],
                    floor_samples_ns=[round(x, 1) for x in floor_ns],
                )
            )  # fmt: skip
    return cases


# --- peak memory, one cache at a time ---------------------------------------------


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _release_freed_memory() -> None:
    """Collects garbage and hands freed heap pages back to the OS, so the next cache's
    allocations show up as RSS growth instead of reusing resident free memory."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _reset_peak_rss() -> bool:
    """Resets VmHWM to the current RSS (Linux >= 4.0); False when not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def measure_memory(names: Sequence[str], shape: Shape, context: int, tokens: int, seed: int) -> list[dict[str, Any]]:
    """Per cache: K/V bytes it holds after prefilling to `context` and decoding `tokens`
    tokens, and the peak RSS growth of the process while it did so (transients such
    as concatenation copies included)."""
    rng = np.random.default_rng(seed)
    chunk_k, chunk_v = random_kv(rng, shape, shape.max_step)
    token_k, token_v = random_kv(rng, shape, 1)

    def run(c: Candidate, end: int) -> None:
        for p, T in chunks(0, end, shape.max_step):
            c.step(p, c.prepare([a[:T] for a in chunk_k]), c.prepare([a[:T] for a in chunk_v]))
        k, v = c.prepare(token_k), c.prepare(token_v)
        for i in range(tokens):
            c.step(end + i, k, v)

    rows = []
    for name in names:
        run(CANDIDATES[name](shape, shape.max_step + tokens), shape.max_step)  # lazy imports, first-call state
        _release_freed_memory()
        peak_known = _reset_peak_rss()
        baseline_kib = _status_kib("VmRSS")
        c = CANDIDATES[name](shape, context + tokens)
        run(c, context)
        peak_kib = _status_kib("VmHWM")
        rows.append(
            dict(
                cache=name, label=c.label, context=context + tokens, held_bytes=c.held_bytes(),
                peak_rss_bytes=(peak_kib - baseline_kib) * 1024 if peak_known else None,
            )
        )  # fmt: skip
        del c
        _release_freed_memory()
    return rows


# --- command line ------------------------------------------------------------------


def shape_of(args: argparse.Namespace) -> Shape:
    return Shape(
        n_layers=args.layers, n_kv_heads=args.kv_heads, head_dim=args.head_dim, window=args.window,
        pattern=args.pattern, max_step=args.max_step, dtype=args.dtype,
    )  # fmt: skip


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def parse(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer contexts and repetitions (under a minute)")
    p.add_argument("--contexts", type=int_list, help="comma-separated contexts (default 1024,4096,16384,65536)")
    p.add_argument("--reps", type=int, help="timed blocks per candidate and context")
    p.add_argument("--tokens", type=int, help="decode tokens per block")
    p.add_argument("--layer-calls", type=int, help="update calls per block in the one-layer T=1 section (0: skip)")
    p.add_argument("--memory-context", type=int, help="context of the peak-memory runs (0: skip)")
    p.add_argument("--caches", default=",".join(CANDIDATES), help=f"subset of {','.join(CANDIDATES)}")
    p.add_argument("--no-check", dest="check", action="store_false", help="skip the equal-history check")
    p.add_argument("--out", default=None, help="JSON results file (default: none)")
    p.add_argument("--layers", type=int, default=26)
    p.add_argument("--kv-heads", type=int, default=1)
    p.add_argument("--head-dim", type=int, default=256)
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--pattern", type=int, default=6, help="every pattern-th layer is full attention")
    p.add_argument("--max-step", type=int, default=512, help="kvcore max_step, also the prefill chunk")
    p.add_argument("--dtype", default="float16", choices=["float16", "float32"])
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    preset = QUICK if args.quick else FULL
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    unknown = [n for n in args.caches.split(",") if n not in CANDIDATES]
    if unknown:
        p.error(f"--caches: unknown {unknown}; choose from {list(CANDIDATES)}")
    args.caches = args.caches.split(",")
    return args


def fmt_us(us: float) -> str:
    return f"{us:,.1f}" if us < 1e4 else f"{us:,.0f}"


def print_table(result: dict[str, Any]) -> None:
    rows = result["per_token"]
    names = list(dict.fromkeys(r["cache"] for r in rows))
    contexts = list(dict.fromkeys(r["context"] for r in rows))
    by = {(r["context"], r["cache"]): r for r in rows}
    print("\nper-token cache cost, microseconds (median), all layers; [x kvcore]")
    print(f"{'cache':36}" + "".join(f"{c:>22,}" for c in contexts))
    for n in names:
        line = f"{by[(contexts[0], n)]['label']:36}"
        for c in contexts:
            r = by[(c, n)]
            ratio = f" [{r['per_token_us'] / by[(c, 'kvcore')]['per_token_us']:.2f}x]" if (c, "kvcore") in by else ""
            line += f"{fmt_us(r['per_token_us']) + ratio:>22}"
        print(line)
    if result.get("layer_update_T1"):
        print("\none layer, T = 1: KVPool.update against copying the new rows, dst[...] = src twice (ns, median)")
        for case in result["layer_update_T1"]:
            print(
                f"  {case['case']:46} returns {case['read_rows']:>5} rows: update {case['update_ns']:>9,.0f}"
                f"  floor {case['floor_ns']:>7,.0f}  overhead {case['overhead_ns']:>9,.0f}"
            )
    if result.get("memory"):
        print(f"\nmemory at context {result['memory'][0]['context']:,} (MiB): held by the cache / peak RSS growth")
        for m in result["memory"]:
            peak = "n/a" if m["peak_rss_bytes"] is None else f"{m['peak_rss_bytes'] / 2**20:.1f}"
            print(f"  {m['label']:36} {m['held_bytes'] / 2**20:>9.1f} {peak:>9}")
    for line in result.get("targets", []):
        print(line)


def targets(result: dict[str, Any], n_layers: int) -> list[str]:
    """The issue's targets as measured here, for each kvcore row (the planning
    target is the C++ benchmark's: bench/results/cpp_ratios.json)."""
    by = {(r["context"], r["cache"]): r["per_token_us"] for r in result["per_token"]}
    contexts = sorted({r["context"] for r in result["per_token"]})
    out = ["\ntargets (measured; not pass/fail)"]
    for case in result.get("layer_update_T1", []):
        overhead = case["overhead_ns"] / 1e3
        out.append(f"  update T=1 overhead above the copy floor, {case['case']}: {overhead:.2f} us (<= 2)")
    for name in ("kvcore", "kvcore-positions", "kvcore-mirror"):
        if not any((c, name) in by for c in contexts):
            continue
        if all((c, "floor") in by for c in contexts):
            worst = max((by[(c, name)] - by[(c, "floor")]) / n_layers for c in contexts)
            out.append(f"  {name}: mean per-layer cost above the floor while decoding, worst context: {worst:.2f} us")
        for c in contexts:
            if (c, "dynamic") in by:
                ratio = by[(c, "dynamic")] / by[(c, name)]
                out.append(f"  {name}: DynamicCache / {name} at {c:,}: {ratio:.1f}x (>= 10 at 16K)")
        if all((c, "static") in by for c in contexts):
            low = min(by[(c, "static")] / by[(c, name)] for c in contexts)
            out.append(f"  {name}: StaticCache / {name}, lowest over contexts: {low:.2f}x (>= 1)")
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse(argv)
    shape = shape_of(args)
    import torch

    torch.set_num_threads(1)
    import transformers

    started = time.time()
    result: dict[str, Any] = dict(
        meta=dict(
            shape=shape.__dict__, kv_bytes_per_token_per_layer=shape.row_bytes(),
            contexts=args.contexts, reps=args.reps, tokens_per_block=args.tokens, quick=args.quick,
            versions=dict(kvcore=kvcore.__version__, numpy=np.__version__, torch=torch.__version__,
                          transformers=transformers.__version__, python=platform.python_version()),
            machine=dict(cpu=platform.processor() or platform.machine(), cpus=os.cpu_count(), torch_threads=1),
            loadavg_start=loadavg(),
        ),
    )  # fmt: skip
    phases: dict[str, float] = {}
    mark = time.time()

    def phase(name: str) -> None:
        nonlocal mark
        phases[name] = round(time.time() - mark, 2)
        mark = time.time()

    if args.check:
        steps = check_steps(shape)
        for name in [n for n in args.caches if n in CACHES]:
            check_candidate(name, shape, steps, args.seed)
        result["check"] = dict(caches=[n for n in args.caches if n in CACHES], steps=len(steps), passed=True)
        print(f"check: {len(steps)} steps, every cache returned the needed positions with the written bytes")
        phase("check")
    result["per_token"] = []
    for context in args.contexts:
        rows = time_context(args.caches, shape, context, args.reps, args.tokens, args.seed)
        result["per_token"] += rows
        print(f"context {context:>7,}: " + ", ".join(f"{r['cache']} {fmt_us(r['per_token_us'])} us" for r in rows))
        phase(f"context {context}")
    if args.layer_calls and "kvcore" in args.caches:
        result["layer_update_T1"] = time_layer_update(shape, min(args.contexts), args.layer_calls, args.reps, args.seed)
        phase("layer update T=1")
    if args.memory_context:
        names = [n for n in args.caches if n in CACHES]
        result["memory"] = measure_memory(names, shape, args.memory_context, args.tokens, args.seed)
        phase("memory")
    result["meta"]["loadavg_end"] = loadavg()
    result["meta"]["seconds"] = round(time.time() - started, 1)
    result["meta"]["phase_seconds"] = phases
    result["targets"] = targets(result, shape.n_layers)
    print_table(result)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
