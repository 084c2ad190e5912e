"""kvcore's ExecuTorch caches against ExecuTorch's two reference caches, side by side.

What ``kvcache::update_and_attend`` asks of a cache on every layer of every forward:
``update_and_fetch(layer, k, v, position)`` (and, for the cell caches, ``begin_step``
once per forward). Measured here per decode step and reported per layer, with the
bytes each cache holds, at several contexts:

- one sequence: ``ContiguousReferenceCache`` (``STATIC`` and ``DYNAMIC`` sizing) against
  ``KVCoreContiguousCache``, and ``CellReferenceCache`` against ``KVCoreCellCache`` with
  one sequence;
- 16 sequences sharing one prompt: the prompt prefilled once as sequence 0, forked 15
  times (``seq_cp``), then every step decodes one token of each: ``CellReferenceCache``
  against ``KVCoreCellCache``.

Shape: a Gemma-3-1B-like stack cut to 6 layers (5 ring, window 512 : 1 flat), 1 KV head x
256, float32 (ExecuTorch's default dtype); kvcore's ``max_step`` is 64 (prompts are fed in
chunks of 64 to kvcore, 512 to the references, which have no step limit).

One process, torch on one thread, every cache prefilled first; then repetitions run
interleaved (each times one decode step of every cache, rotating the order) and the
figure is the median. The DYNAMIC contiguous reference, which concatenates its whole
history per layer and step, is timed in its own block after the others (its fresh
tensors would evict what the next cache touches). The caches' outputs are checked equal before timing (the attention
over each returned history, for one decode step of every layer).

    python bench/executorch_compare.py --out bench/results/executorch_compare.json   # a few minutes
    python bench/executorch_compare.py --quick                                        # 1K and 4K only
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import platform
import statistics
import sys
import time
import warnings
from typing import Any, Callable

import torch

from executorch.exir._warnings import ExperimentalWarning  # noqa: E402
from executorch.extension.llm.cache import reference_cache as ref  # noqa: E402

warnings.filterwarnings("ignore", category=ExperimentalWarning)  # its cache API warns that it is experimental

import kvcore  # noqa: E402
from kvcore.integrations.executorch import KVCoreCellCache, KVCoreContiguousCache  # noqa: E402

LAYERS, KV_HEADS, HEAD_DIM, WINDOW, MAX_STEP, SEQS = 6, 1, 256, 512, 64, 16
PATTERN = [ref.LayerPolicy.ring(WINDOW)] * 5 + [ref.LayerPolicy.flat()]


def config(capacity: int, sizing: Any) -> Any:
    return ref.CacheConfig(
        n_layers=LAYERS, n_kv_heads=KV_HEADS, head_dim=HEAD_DIM, capacity=capacity, sizing=sizing, layers=PATTERN
    )


def nbytes(cache: Any) -> int:
    if hasattr(cache, "nbytes"):
        return int(cache.nbytes())
    return sum(t.numel() * t.element_size() for t in cache._k + cache._v)  # the references' tensors


def resident() -> int:
    """This process's resident bytes (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096
    except OSError:
        return 0


def state_bytes(capacity: int) -> int:
    """The bytes kvcore's own state makes resident (block tables, pools, step buffers) for a
    KVCoreCellCache over ``capacity`` cells, all sized at its creation: measured in a fresh
    interpreter (in this one freed memory would be reused), as the growth of its resident
    set across the creation (DYNAMIC sizing: the K/V tensors start empty)."""
    out = subprocess.run([sys.executable, __file__, "--state-bytes", str(capacity)], check=True,
                         capture_output=True, text=True)
    return int(out.stdout.split()[-1])


def kvcore_cell_cache(capacity: int, sizing: Any) -> tuple[Any, int]:
    """A KVCoreCellCache and the bytes of kvcore's own state (state_bytes)."""
    return KVCoreCellCache(config(capacity, sizing), max_step=MAX_STEP), state_bytes(capacity)


class Case:
    """One cache, its prefill and one decode step."""

    def __init__(self, name: str, cache: Any, n_seqs: int, cells: bool, chunk: int, state_bytes: int = 0) -> None:
        self.name, self.cache, self.n_seqs, self.cells, self.chunk = name, cache, n_seqs, cells, chunk
        self.state_bytes = state_bytes  # kvcore's own state, measured at creation (cell caches)
        self.lengths = [0] * n_seqs

    def forward(
        self, kv: list[torch.Tensor], positions: list[int], seqs: list[int], use: Callable[[Any], Any] = lambda h: None
    ) -> list[Any]:
        """One forward; ``use(history)`` sees each layer's history at once, as the op's attend does."""
        if self.cells:
            self.cache.begin_step(seqs)
        pos = torch.tensor(positions).unsqueeze(-1)
        return [use(self.cache.update_and_fetch(layer, kv[layer], kv[layer], pos)) for layer in range(LAYERS)]

    def prefill(self, prompt: list[torch.Tensor]) -> None:
        context = int(prompt[0].shape[2])
        for start in range(0, context, self.chunk):
            T = min(self.chunk, context - start)
            kv = [layer[:, :, start : start + T] for layer in prompt]
            self.forward(kv, list(range(start, start + T)), [0] * T)
        self.lengths[0] = context
        for s in range(1, self.n_seqs):  # the prompt, shared
            self.cache.seq_cp(0, s)
            self.lengths[s] = context

    def decode(self, kv: list[torch.Tensor], use: Callable[[Any], Any] = lambda h: None) -> list[Any]:
        out = self.forward(kv, list(self.lengths), list(range(self.n_seqs)), use)
        self.lengths = [n + 1 for n in self.lengths]
        return out


def make_cases(context: int, n_seqs: int, reps: int) -> list[Case]:
    capacity = context + reps + 8
    cells = context + n_seqs * (reps + 8)  # every cell of every sequence
    if n_seqs > 1:
        cell_cache, state = kvcore_cell_cache(cells, ref.CacheSizing.DYNAMIC)
        return [
            Case("reference CellReferenceCache", ref.CellReferenceCache(config(cells, ref.CacheSizing.DYNAMIC)), n_seqs, True, 512),
            Case("kvcore KVCoreCellCache", cell_cache, n_seqs, True, MAX_STEP, state),
        ]  # fmt: skip
    cell_cache, state = kvcore_cell_cache(capacity, ref.CacheSizing.DYNAMIC)
    return [
        Case("reference ContiguousReferenceCache STATIC", ref.ContiguousReferenceCache(config(capacity, ref.CacheSizing.STATIC)), 1, False, 512),
        Case("reference ContiguousReferenceCache DYNAMIC", ref.ContiguousReferenceCache(config(capacity, ref.CacheSizing.DYNAMIC)), 1, False, 512),
        Case("kvcore KVCoreContiguousCache STATIC", KVCoreContiguousCache(config(capacity, ref.CacheSizing.STATIC), max_step=MAX_STEP), 1, False, MAX_STEP),
        Case("kvcore KVCoreContiguousCache STATIC, mirror_rings=False", KVCoreContiguousCache(config(capacity, ref.CacheSizing.STATIC), max_step=MAX_STEP, mirror_rings=False), 1, False, MAX_STEP),
        Case("kvcore KVCoreContiguousCache STATIC, mirror_rings=False, order=rows", KVCoreContiguousCache(config(capacity, ref.CacheSizing.STATIC), max_step=MAX_STEP, mirror_rings=False, order="rows"), 1, False, MAX_STEP),
        Case("reference CellReferenceCache", ref.CellReferenceCache(config(capacity, ref.CacheSizing.DYNAMIC)), 1, True, 512),
        Case("kvcore KVCoreCellCache", cell_cache, 1, True, MAX_STEP, state),
    ]  # fmt: skip


def check_equal(cases: list[Case], gen: torch.Generator) -> float:
    """One decode step of every cache with the same K/V; every layer's attention over its history must agree."""
    n = cases[0].n_seqs
    kv = [torch.randn(1, KV_HEADS, n, HEAD_DIM, generator=gen) for _ in range(LAYERS)]
    q = torch.randn(1, 4, n, HEAD_DIM, generator=gen)
    outs = []
    for case in cases:  # a history is valid until the next update_and_fetch: attend at once, as the op does
        outs.append(case.decode(kv, lambda h: ref.attend(q, h[0], h[1], h[2], HEAD_DIM**-0.5, torch.float32)))
    diffs = {c.name: max(float((a - b).abs().max()) for a, b in zip(outs[0], o)) for c, o in zip(cases[1:], outs[1:])}
    worst = max(diffs.values())
    if worst > 1e-4:
        raise SystemExit(f"caches disagree with {cases[0].name}: max |diff| {diffs}")
    return worst


def measure(context: int, n_seqs: int, reps: int, seed: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    cases = make_cases(context, n_seqs, reps)
    prompt = [torch.randn(1, KV_HEADS, context, HEAD_DIM, generator=gen) for _ in range(LAYERS)]
    prefill_s = {}
    for case in cases:
        t0 = time.perf_counter()
        case.prefill(prompt)  # every cache the same prompt
        prefill_s[case.name] = time.perf_counter() - t0
    worst = check_equal(cases, gen)
    kv = [torch.randn(1, KV_HEADS, n_seqs, HEAD_DIM, generator=gen) for _ in range(LAYERS)]
    times: dict[str, list[float]] = {c.name: [] for c in cases}
    # The DYNAMIC reference concatenates its whole history per layer and step: its hundreds of MB
    # of fresh tensors would evict whatever the next cache touches, so it is timed on its own.
    alone = [c for c in cases if c.name.endswith("DYNAMIC") and c.name.startswith("reference")]
    together = [c for c in cases if c not in alone]
    for group in (together, *([c] for c in alone)):
        for r in range(reps):
            order = group[r % len(group) :] + group[: r % len(group)]
            for case in order:
                t0 = time.perf_counter_ns()
                case.decode(kv)
                times[case.name].append((time.perf_counter_ns() - t0) / 1e3 / LAYERS)
    rows = []
    for case in cases:
        b = nbytes(case.cache)
        rows.append(
            {
                "cache": case.name,
                "us_per_layer_median": round(statistics.median(times[case.name]), 2),
                "us_per_layer_min": round(min(times[case.name]), 2),
                "bytes_held": b,
                "state_bytes": case.state_bytes,
                "prefill_s": round(prefill_s[case.name], 3),
            }
        )
    return {"context": context, "sequences": n_seqs, "max_abs_diff": worst, "caches": rows}


def shared_prefix_bytes(context: int, seed: int) -> dict[str, int]:
    """kvcore cell cache: bytes with the prompt in one sequence, then after 15 forks (no decode)."""
    cache = KVCoreCellCache(config(context + 64, ref.CacheSizing.DYNAMIC), max_step=MAX_STEP)
    case = Case("kvcore", cache, 1, True, MAX_STEP)
    gen = torch.Generator().manual_seed(seed)
    case.prefill([torch.randn(1, KV_HEADS, context, HEAD_DIM, generator=gen) for _ in range(LAYERS)])
    one = cache.nbytes()
    for s in range(1, SEQS):
        cache.seq_cp(0, s)
    return {"one_sequence": one, "after_15_forks": cache.nbytes(), "flat_cells_free": cache.free_cells()}


def table(results: list[dict[str, Any]]) -> str:
    lines = []
    for r in results:
        lines.append(f"\ncontext {r['context']:,}, {r['sequences']} sequence(s) (outputs agree: max |diff| {r['max_abs_diff']:.2g})")
        for c in r["caches"]:
            state = f"  + {c['state_bytes'] / 2**20:.2f} MiB kvcore state" if c.get("state_bytes") else ""
            lines.append(
                f"  {c['cache']:<68} {c['us_per_layer_median']:>10,.1f} us/layer  {c['bytes_held'] / 2**20:>9,.1f} MiB{state}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--reps", type=int, default=61, help="decode steps timed per cache (median reported)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="contexts 1K and 4K, 11 reps")
    p.add_argument("--state-bytes", type=int, metavar="CELLS", help=argparse.SUPPRESS)  # state_bytes()'s child
    p.add_argument("--out", help="write the results as JSON here")
    args = p.parse_args(argv)
    if args.state_bytes:
        KVCoreCellCache(config(64, ref.CacheSizing.DYNAMIC), max_step=MAX_STEP)  # torch's and kvcore's first-use costs
        gc.collect()
        before = resident()
        cache = KVCoreCellCache(config(args.state_bytes, ref.CacheSizing.DYNAMIC), max_step=MAX_STEP)
        print(resident() - before, cache.nbytes())
        return 0
    if args.quick:
        args.contexts, args.reps = [1024, 4096], 11
    torch.set_num_threads(1)
    results = []
    for context in args.contexts:
        for n_seqs in (1, SEQS):
            r = measure(context, n_seqs, args.reps, args.seed)
            results.append(r)
            print(table([r]), flush=True)
    shared = {str(c): shared_prefix_bytes(c, args.seed) for c in args.contexts}
    print("\nkvcore cell cache, prompt held once:", json.dumps(shared))
    if args.out:
        meta = {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "kvcore": kvcore.__version__,
            "machine": platform.machine(),
            "threads": 1,
            "shape": {"layers": LAYERS, "pattern": "5 ring (window 512) : 1 flat", "kv_heads": KV_HEADS,
                      "head_dim": HEAD_DIM, "dtype": "float32", "kvcore_max_step": MAX_STEP},
            "reps": args.reps,
        }  # fmt: skip
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "results": results, "shared_prefix_bytes": shared}, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
