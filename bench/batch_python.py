"""kvcore's BatchCache driven from Python as a scheduler drives it, on the
Gemma-3-27B shape of bench/batch_bench.cpp and bench/vllm_manager.py (62 layers:
52 ring W = 1024, 10 flat; B = 16; prefix reuse on: every step carries its
token ids). bench/batch_compare.py runs it beside kvcore_bench and vLLM.

Workloads (the token ids are batch_bench.cpp's):
  decode  N sequences adopt a cached 2,000-token prompt, decode 64 tokens, then
          timed decode steps. Per step: begin_step over the N sequences with
          T = 1 and each one's token id, the plan read as a backend reads it
          (seq_ids, query_starts, context_lens; per group slots, copies and
          block_tables, each a zero-copy numpy view, all from one
          plan.arrays() call), commit. Two forms:
            list    [(seq, 1, [id]), ...] built per step (one tuple per entry)
            arrays  begin_step(seqs, 1, ids): seqs an int32 array made
                    once, ids the step's sampled ids as an int32 array (a
                    row of a precomputed (steps, N) array: what a sampler hands
                    back), no Python object per entry (tokens passed by
                    position: a keyword costs pybind11 ~0.4 us per call)
  admit   one request with that prompt while the first is still running:
          add_sequence, adopt_prefix(prompt: 1,984 tokens hit), the step of the
          16 left with its plan read, commit, release_sequence. Two forms:
            array   the prompt as an int32 array (read in place), the rest a slice
            list    the prompt as the Python list of ints a tokenizer returns,
                    the rest a slice of it (what vLLM's Request is built from)

Timings are CPU time of this thread (time.thread_time_ns), medians of --reps.

    eval "$(scripts/dev.sh NAME)"; python3 bench/batch_python.py [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import numpy as np

import kvcore

B = 16
WINDOW = 1024
N_LAYERS = 62
PROMPT = 2000
WARM_DECODE = 64
CAPACITY = 4096
MAX_SEQS = 260


def token_row(seq: int, length: int) -> np.ndarray:
    """Sequence seq's token ids by position (batch_bench.cpp's): the prompt, then its own."""
    p = np.arange(length, dtype=np.int64)
    return np.where(p < PROMPT, 100 + p, 3000 + (seq * 131 + p) % 20000).astype(np.int32)


def make_cache(max_step: int) -> kvcore.BatchCache:
    layers = [kvcore.LayerConfig(kvcore.Flat() if (i + 1) % 6 == 0 else kvcore.Ring(window=WINDOW), 16, 128)
              for i in range(N_LAYERS)]
    limits = kvcore.BatchLimits(block_size=B, max_seqs=MAX_SEQS, num_blocks=20000,
                                max_step_tokens=max(MAX_SEQS, max_step))
    return kvcore.BatchCache(kvcore.CacheConfig(CAPACITY, layers, max_step=max_step, batch=limits))


def read_plan(step: kvcore.BatchStep) -> int:
    """What a backend reads of a plan to launch its kernels: every array once, in one
    call (``plan.arrays()``: the per-entry arrays and each group's slots, copies and
    block_tables, zero-copy views)."""
    seq_ids, query_starts, _, context_lens, _, _, groups = step.plan().arrays()
    n = seq_ids.shape[0] + query_starts.shape[0] + context_lens.shape[0]
    for slots, copies, tables in groups:
        n += slots.shape[0] + copies.shape[0] + tables.shape[0]
    return n


def admit(cache: kvcore.BatchCache, seq: int, prompt: np.ndarray) -> int:
    """A request with `prompt` (int32): adopt the cached prefix, compute the rest."""
    cache.add_sequence(seq)
    at = cache.adopt_prefix(seq, prompt)
    ids = np.array([seq], np.int32)
    while at < len(prompt):
        T = min(cache.max_step, len(prompt) - at)
        step = cache.begin_step(ids, T, prompt[at:at + T])
        read_plan(step)
        step.commit()
        at += T
    return at


def decode(n: int, max_step: int, steps: int, reps: int, form: str) -> dict:
    cache = make_cache(max_step)
    rows = [token_row(s, PROMPT + WARM_DECODE + steps * reps + 1) for s in range(n)]
    for s in range(n):
        admit(cache, s, rows[s][:PROMPT])
    # Column p of `ids` is every sequence's token at position p: a sampler's output.
    ids = np.ascontiguousarray(np.stack(rows).T)
    seqs = np.arange(n, dtype=np.int32)
    length = PROMPT

    def step_arrays() -> None:
        nonlocal length
        step = cache.begin_step(seqs, 1, ids[length])
        read_plan(step)
        step.commit()
        length += 1

    def step_list() -> None:
        nonlocal length
        row = ids[length].tolist()  # the sampled ids as a list, as a list-based scheduler holds them
        step = cache.begin_step([(s, 1, [row[s]]) for s in range(n)])
        read_plan(step)
        step.commit()
        length += 1

    one = step_arrays if form == "arrays" else step_list
    for _ in range(WARM_DECODE):
        one()
    cpu = []
    for _ in range(reps):
        c = time.thread_time_ns()
        for _ in range(steps):
            one()
        cpu.append((time.thread_time_ns() - c) / 1e3 / (steps * n))
    return {"seqs": n, "form": form, "cpu_us_per_seq": statistics.median(cpu), "cpu_us_per_seq_reps": cpu,
            "steps_per_rep": steps, "context": PROMPT + WARM_DECODE}


def admission(max_step: int, count: int, reps: int) -> dict:
    """Both prompt forms, their repetitions interleaved (load hits both alike)."""
    cache = make_cache(max_step)
    prompt = token_row(1, PROMPT)
    admit(cache, 0, prompt)  # computes the prompt; stays running
    forms = {"array": prompt, "list": prompt.tolist()}  # tolist(): fresh Python ints, as a tokenizer's
    cpu = {form: [] for form in forms}
    hit = 0
    one = np.array([1], np.int32)  # the request's sequence id, as a scheduler keeps it
    for _ in range(reps):
        for form, tokens in forms.items():
            c = time.thread_time_ns()
            for _ in range(count):
                cache.add_sequence(1)
                hit = cache.adopt_prefix(1, tokens)
                at = hit
                while at < PROMPT:
                    T = min(max_step, PROMPT - at)
                    step = cache.begin_step(one, T, tokens[at:at + T])
                    read_plan(step)
                    step.commit()
                    at += T
                cache.release_sequence(1)
            cpu[form].append((time.thread_time_ns() - c) / 1e3 / count)
    return {"cpu_us": statistics.median(cpu["array"]), "cpu_us_reps": cpu["array"],
            "list_cpu_us": statistics.median(cpu["list"]), "list_cpu_us_reps": cpu["list"],
            "requests_per_rep": count, "hit_tokens": hit}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seqs", default="16,64,256")
    ap.add_argument("--max-step", type=int, default=16, help="the cache's max_step C")
    ap.add_argument("--steps", type=int, default=64, help="decode steps per timed repetition")
    ap.add_argument("--reps", type=int, default=7, help="timed repetitions (median)")
    ap.add_argument("--admit-count", type=int, default=200, help="admissions per repetition")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (smoke run)")
    ap.add_argument("--out", help="write the JSON here instead of stdout")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.reps, args.admit_count = 4, 2, 3
    out = {
        "what": "kvcore.BatchCache from Python", "kvcore": kvcore.__file__, "numpy": np.__version__,
        "python": platform.python_version(), "max_step": args.max_step,
        "decode": [decode(int(n), args.max_step, args.steps, args.reps, form)
                   for n in args.seqs.split(",") for form in ("list", "arrays")],
        "admit": admission(args.max_step, args.admit_count, args.reps),
    }
    text = json.dumps(out, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
