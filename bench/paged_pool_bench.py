"""PagedKVPool (numpy) per layer, against numpy doing the same writes and the copy floor.

A decode step of S sequences (one new token each) over a BatchCache whose
sequences hold `context` positions, Gemma-3-1B's row shape (1 KV head x 256,
float16), block_size 16. Per layer of a step:

- copyto:  np.copyto of exactly those rows into a buffer (K, then V): the least
           a numpy layer pays to move them, its call overhead included (the best
           of four buffer placements: 4K aliasing makes some twice as slow);
- floor:   the copy floor, copyto minus the same two calls on empty arrays: what
           moving the bytes costs (hot caches), without any call overhead;
- numpy:   the same rows scattered into preallocated pool arrays with the plan's
           slots (k_store[slots] = k, v_store[slots] = v) and the live rows
           sliced out as views: what a numpy byte layer without kvcore does;
- kvcore:  PagedKVPool.update(layer, step, k, v): checks the step, the arrays and
           the plan, performs the block copies, writes the rows, returns the two
           read-only views of the live rows.

Per step (shared by the layers of a group): PagedKVPool.mask(step, group), the
(S, live rows) visibility mask. Per layer, for backends attending per sequence:
gather() of every sequence's history (a copy of context rows each).

Each figure is the median of --reps blocks of --calls calls, the blocks of the
candidates interleaved. Not part of the test suite; no timing is asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import kvcore

HEADS, DIM, BLOCK = 1, 256, 16


def build(seqs: int, context: int, max_step: int) -> tuple[kvcore.BatchCache, kvcore.PagedKVPool]:
    layers = [kvcore.LayerConfig(kvcore.Flat(), HEADS, DIM), kvcore.LayerConfig(kvcore.Ring(512), HEADS, DIM)]
    batch = kvcore.BatchLimits(block_size=BLOCK, max_seqs=seqs)
    cache = kvcore.BatchCache(kvcore.CacheConfig(context + 4 * max_step, layers, max_step=max_step, batch=batch))
    pool = kvcore.PagedKVPool(cache, np.float16)
    rng = np.random.default_rng(0)
    for s in range(seqs):
        cache.add_sequence(s)
    done = 0
    while done < context:  # prefill every sequence in chunks
        T = min(max_step, context - done)
        with cache.step([(s, T) for s in range(seqs)]) as step:
            k = rng.standard_normal((seqs * T, HEADS, DIM)).astype(np.float16)
            for layer in range(cache.n_layers):
                pool.update(layer, step, k, k)
        done += T
    return cache, pool


def per_call_ns(fn: Callable[[], Any], calls: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - start) / calls


def measure(seqs: int, context: int, reps: int, calls: int) -> dict[str, Any]:
    cache, pool = build(seqs, context, max_step=256)
    rng = np.random.default_rng(1)
    k = rng.standard_normal((seqs, HEADS, DIM)).astype(np.float16)
    v = rng.standard_normal((seqs, HEADS, DIM)).astype(np.float16)
    out: dict[str, Any] = {"seqs": seqs, "context": context}
    for layer, kind in [(0, "flat"), (1, "ring")]:
        group = cache.group_of(layer)
        rows = cache.num_blocks(group) * BLOCK
        k_store = np.zeros((rows, HEADS, DIM), np.float16)
        v_store = np.zeros((rows, HEADS, DIM), np.float16)
        raw = np.empty(8 * k.nbytes + 8192, np.uint8)

        def placed(offset: int, like: Any) -> Any:
            return raw[offset : offset + like.nbytes].view(np.float16).reshape(like.shape)

        placements = [(placed(o, k), placed(o + 3 * k.nbytes + 256, v)) for o in (0, 64, 1088, 2304)]
        names = ("overhead", "copyto0", "copyto1", "copyto2", "copyto3", "numpy", "kvcore", "mask", "gather")
        samples: dict[str, list[float]] = {n: [] for n in names}
        none_src = np.empty((0, HEADS, DIM), np.float16)
        none_k, none_v = np.empty_like(none_src), np.empty_like(none_src)
        for rep in range(reps):
            with cache.step([(s, 1) for s in range(seqs)]) as step:
                slots = step.plan().groups[group].slots.astype(np.intp)
                live = cache.used_blocks(group) * BLOCK

                def overhead() -> None:
                    np.copyto(none_k, none_src)
                    np.copyto(none_v, none_src)

                def copyto(i: int) -> Callable[[], None]:
                    k_buf, v_buf = placements[i]

                    def run() -> None:
                        np.copyto(k_buf, k)
                        np.copyto(v_buf, v)

                    return run

                def numpy_write() -> tuple[Any, Any]:
                    k_store[slots] = k
                    v_store[slots] = v
                    return k_store[:live], v_store[:live]

                def kvcore_update() -> tuple[Any, Any]:
                    return pool.update(layer, step, k, v)

                order = [("overhead", overhead), ("numpy", numpy_write), ("kvcore", kvcore_update)]
                order += [(f"copyto{i}", copyto(i)) for i in range(4)]
                for name, fn in order[rep % 7 :] + order[: rep % 7]:  # rotate the order per block
                    samples[name].append(per_call_ns(fn, calls))
                pool.update(1 - layer, step, k, v)  # the step's other layer, so every layer stays current
                # The mask is built once per group and step: time a fresh build.
                t0 = time.perf_counter_ns()
                step.plan().mask(group)
                samples["mask"].append(time.perf_counter_ns() - t0)
                t0 = time.perf_counter_ns()
                for entry in range(seqs):
                    pool.gather(layer, step, entry)
                samples["gather"].append(time.perf_counter_ns() - t0)
        med = {name: statistics.median(vals) for name, vals in samples.items()}
        med["copyto"] = min(med[f"copyto{i}"] for i in range(4))
        med["floor"] = max(0.0, med["copyto"] - med["overhead"])
        out[kind] = {
            "live_rows": live,
            "floor_ns": med["floor"],
            "copyto_ns": med["copyto"],
            "numpy_ns": med["numpy"],
            "kvcore_ns": med["kvcore"],
            "numpy_above_floor_ns": med["numpy"] - med["floor"],
            "kvcore_above_floor_ns": med["kvcore"] - med["floor"],
            "mask_per_step_us": med["mask"] / 1e3,
            "gather_all_seqs_us": med["gather"] / 1e3,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqs", type=int, default=16)
    parser.add_argument("--contexts", default="1024,4096")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args(argv)
    results = [measure(args.seqs, int(c), args.reps, args.calls) for c in args.contexts.split(",")]
    print(f"PagedKVPool decode step, {args.seqs} sequences, 1 KV head x 256 float16, block_size {BLOCK}")
    print(f"{'context':>8} {'layer':>5} {'live rows':>9} {'floor':>8} {'copyto':>8} {'numpy':>8} {'kvcore':>8} "
          f"{'kv-floor':>9} {'np-floor':>9} {'mask/step':>10} {'gather x S':>11}")  # fmt: skip
    for r in results:
        for kind in ("flat", "ring"):
            f = r[kind]
            print(f"{r['context']:>8} {kind:>5} {f['live_rows']:>9} {f['floor_ns']:>6.0f}ns {f['copyto_ns']:>6.0f}ns "
                  f"{f['numpy_ns']:>6.0f}ns "
                  f"{f['kvcore_ns']:>6.0f}ns {f['kvcore_above_floor_ns']:>7.0f}ns {f['numpy_above_floor_ns']:>7.0f}ns "
                  f"{f['mask_per_step_us']:>8.1f}us {f['gather_all_seqs_us']:>9.1f}us")  # fmt: skip
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"results": results, "args": vars(args)}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
