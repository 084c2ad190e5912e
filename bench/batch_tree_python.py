"""BatchCache draft trees driven from Python, on the shape of bench/batch_tree_bench.cpp
(Gemma-3-27B: 52 ring W = 1024 : 10 flat layers, B = 16): 256 sequences at 1,500
positions step 64 new tokens each, as draft trees (node i's parent (i - 1) // 2) or as
chains. Per step (array form, no Python object per entry): begin_step(seqs, 64, tokens,
parents=...), the plan read as a backend reads it (positions, chain_index, tree_mask_starts,
tree_masks and per group slots and block_tables, each a zero-copy view), then abort (plan)
or commit(step, accepted={seq: path}) and rewind back (commit). Timings are CPU time of
this thread (time.thread_time_ns), medians of --reps.

    eval "$(scripts/dev.sh NAME)"; python3 bench/batch_tree_python.py
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import kvcore

SEQS, NODES, LENGTH, BLOCK = 256, 64, 1500, 16


def make() -> kvcore.BatchCache:
    layers = [
        kvcore.LayerConfig(kvcore.Flat() if l % 6 == 5 else kvcore.Ring(window=1024), 16, 128) for l in range(62)
    ]
    limits = kvcore.BatchLimits(block_size=BLOCK, max_seqs=SEQS, max_step_tokens=SEQS * NODES,
                                num_blocks=SEQS * 4096 // BLOCK)
    cache = kvcore.BatchCache(kvcore.CacheConfig(4096, layers, max_step=NODES, batch=limits))
    seqs = np.arange(SEQS, dtype=np.int32)
    cache.add_sequences(seqs)
    for at in range(0, LENGTH, NODES):
        T = min(NODES, LENGTH - at)
        cache.begin_step(seqs, T, np.tile(np.arange(at, at + T, dtype=np.int32), SEQS)).commit()
    return cache


def read(plan: kvcore.BatchStepPlan) -> int:
    total = len(plan.positions) + len(plan.chain_index) + len(plan.tree_mask_starts) + len(plan.tree_masks)
    for gp in plan.groups:
        total += len(gp.slots) + len(gp.block_tables)
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=200)
    args = ap.parse_args()
    cache = make()
    seqs = np.arange(SEQS, dtype=np.int32)
    tokens = np.tile(np.arange(LENGTH, LENGTH + NODES, dtype=np.int32), SEQS)
    tree = np.tile(np.array([-1] + [(i - 1) // 2 for i in range(1, NODES)], dtype=np.int32), SEQS)
    chain = np.tile(np.arange(-1, NODES - 1, dtype=np.int32), SEQS)
    paths = {"main line": [0, 1, 3, 7, 15, 31], "off the main line": [0, 2, 6, 14, 30, 62]}
    for name, parents in (("trees", tree), ("chains", chain)):
        times = []
        for _ in range(args.reps):
            t0 = time.thread_time_ns()
            step = cache.begin_step(seqs, NODES, tokens, parents=parents)
            read(step.plan())
            step.abort()
            times.append(time.thread_time_ns() - t0)
        print(f"plan {name}: {statistics.median(times) / 1e3:.0f} us per step of {SEQS} x {NODES}")
    for name, path in paths.items():
        accepted = {s: path for s in range(SEQS)}
        times, copies = [], 0
        for _ in range(args.reps // 4):
            t0 = time.thread_time_ns()
            step = cache.begin_step(seqs, NODES, tokens, parents=tree)
            read(step.plan())
            out = cache.commit(step, accepted=accepted)
            times.append(time.thread_time_ns() - t0)
            copies = sum(len(c) for c in out)
            for s in range(SEQS):
                cache.rewind(s, LENGTH)
        print(f"commit {name} (m = 6): {statistics.median(times) / 1e3:.0f} us per step (begin, plan, commit), "
              f"{copies / (SEQS * 6 * 2):.3f} row copies per accepted token per group")


if __name__ == "__main__":
    main()
