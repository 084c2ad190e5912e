"""transformers' continuous batching: its own cache against kvcore's, on a shared-system-prompt workload.

Requests share one system prompt, each with a short suffix of its own; some
arrive while the first ones decode. Both runs drive transformers' own manager
(``add_request`` / ``request_id_iter``), one with its ``PagedAttentionCache``, one
with kvcore's (``KVCoreBatchingManager``), alternating in one process on the
same tiny random model, Gemma-3-shaped (5 sliding : 1 full) or Llama-shaped
(all full). Per run: generated tokens per second (wall, prefill included),
prompt tokens computed, and the blocks and K/V bytes held at the peak.

    python bench/hf_batch_bench.py --shape gemma3 --requests 64 --shared 1000 --new 128
    python bench/hf_batch_bench.py --quick      # seconds: a smoke run
    python bench/hf_batch_bench.py --overhead 8,32   # kvcore's cache overhead per request of a forward

transformers' own figures come from hooks on its cache (tokens through
``extend_read_and_write_indices``; distinct blocks its allocators' block tables
hold, times their bytes, after each forward's indices are built); kvcore's from
``KVCoreBatchingManager.counters``. Outputs must be identical (greedy): the
script exits 1 otherwise.

``--overhead N,...`` measures kvcore's side alone: N requests at once (the
shared prompt, their own tokens, ``--new`` generated), timing every call
transformers makes into ``KVCorePagedCache`` per forward (CPU time of the
thread that makes it, so the load of a shared machine weighs less); per request of a
forward of N decoding requests (medians over those forwards, and over
``--reps`` runs): scheduling and planning (admission, prefix lookup, the
step's plan and transformers' indices) and ``update`` (block copies, the K/V
writes and reads of every layer, the commit).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from typing import Any

import torch
import transformers
from transformers import GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig
from transformers.generation.continuous_batching import cache as hf_cache

from kvcore.integrations.transformers_batch import KVCoreBatchingManager

VOCAB = 256
S, F = "sliding_attention", "full_attention"


def build(shape: str, window: int, max_len: int) -> Any:
    common: dict[str, Any] = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=1,
        head_dim=32, max_position_embeddings=max_len, attn_implementation="sdpa", pad_token_id=0, eos_token_id=1,
        bos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    if shape == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(num_hidden_layers=4, **common)).eval()
    kinds = [S] * 5 + [F]
    config = transformers.Gemma3TextConfig(num_hidden_layers=6, layer_types=kinds, sliding_window=window, **common)
    return transformers.Gemma3ForCausalLM(config).eval()


class HfProbe:
    """Counts what transformers' own PagedAttentionCache computes and holds (hooks on the class)."""

    def __init__(self) -> None:
        self.tokens = 0
        self.peak_blocks = 0
        self.peak_bytes = 0
        self._original = hf_cache.PagedAttentionCache.extend_read_and_write_indices

    def __enter__(self) -> "HfProbe":
        probe, original = self, self._original

        def extend(cache: Any, request_id: str, past: int, query: int, read: Any, write: Any) -> None:
            original(cache, request_id, past, query, read, write)
            probe.tokens += query
            blocks = held = 0
            for allocator in cache.cache_allocators.values():
                ids = {b for table in allocator.block_table.values() for b in table}
                blocks += len(ids)
                held += len(ids) * allocator.bytes_per_block
            probe.peak_blocks = max(probe.peak_blocks, blocks)
            probe.peak_bytes = max(probe.peak_bytes, held)

        hf_cache.PagedAttentionCache.extend_read_and_write_indices = extend  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        hf_cache.PagedAttentionCache.extend_read_and_write_indices = self._original  # type: ignore[method-assign]


def drive(manager: Any, prompts: list[list[int]], late: int) -> dict[str, list[int]]:
    """Run the requests through a started manager: all but ``late`` at once, the rest once the
    first result is out (the others are decoding then). Returns each request's tokens."""
    out: dict[str, list[int]] = {}

    def collect_one() -> None:
        result = manager.get_result(timeout=1800)
        if result is None:
            raise RuntimeError(f"no result within 30 minutes; {len(out)} of {len(prompts)} done")
        if result.error is not None:
            raise RuntimeError(f"{result.request_id}: {result.error}")
        if result.is_finished():
            out[result.request_id] = list(result.generated_tokens)

    early = len(prompts) - late
    for i, p in enumerate(prompts[:early]):
        manager.add_request(p, request_id=f"r{i}")
    collect_one()
    for i, p in enumerate(prompts[early:]):
        manager.add_request(p, request_id=f"r{early + i}")
    while len(out) < len(prompts):
        collect_one()
    return out


def timed(manager: Any, prompts: list[list[int]], late: int) -> tuple[dict[str, list[int]], float]:
    """Start the manager, drive the requests through it, stop it: the outputs and the wall seconds."""
    start = time.perf_counter()
    manager.start()
    try:
        out = drive(manager, prompts, late)
    finally:
        manager.stop(block=True)
    return out, time.perf_counter() - start


def run_once(kind: str, model: Any, prompts: list[list[int]], args: argparse.Namespace) -> dict[str, Any]:
    gen = GenerationConfig(max_new_tokens=args.new, do_sample=False, eos_token_id=-1, pad_token_id=0)
    capacity = max(map(len, prompts)) + args.new
    if kind == "transformers":
        blocks = len(prompts) * (math.ceil(capacity / args.block_size) + 1)
        cb = ContinuousBatchingConfig(page_size=args.block_size, num_blocks=blocks, max_batch_tokens=args.batch_tokens)
        with HfProbe() as probe:
            manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)
            out, seconds = timed(manager, prompts, args.late)
        decoded = sum(map(len, out.values())) - len(prompts)  # each request's first token ends its prefill
        stats = dict(tokens_computed=probe.tokens, prompt_tokens_computed=probe.tokens - decoded,
                     peak_blocks=probe.peak_blocks, peak_kv_bytes=probe.peak_bytes)  # fmt: skip
    else:
        manager = KVCoreBatchingManager(model, gen, block_size=args.block_size, max_batch_tokens=args.batch_tokens,
                                        capacity=capacity, max_seqs=len(prompts), max_step=args.max_step)  # fmt: skip
        out, seconds = timed(manager, prompts, args.late)
        stats = manager.counters.as_dict()
    generated = sum(map(len, out.values()))
    return dict(kind=kind, seconds=seconds, tokens_per_second=generated / seconds, out=out, **stats)


PLANNING_CALLS = ("can_store_request_tokens", "search_prefix_match", "plan_forward", "extend_read_and_write_indices",
                  "free_blocks", "open_round")  # fmt: skip


def overhead(model: Any, prompts: list[list[int]], args: argparse.Namespace) -> dict[str, float]:
    """One run of kvcore alone with every request added at once: per forward of len(prompts)
    requests, the microseconds per request spent in the cache's scheduling and planning calls
    and in its layers' ``update`` (medians over those forwards)."""
    from kvcore.integrations.transformers_batch.paged_cache import KVCorePagedCache

    spent = {"planning": 0, "update": 0}
    per_forward: list[tuple[int, float, float]] = []  # (requests, planning us, update us)
    requests = [0]
    originals = {name: getattr(KVCorePagedCache, name) for name in (*PLANNING_CALLS, "update")}

    def timed_call(name: str, fn: Any) -> Any:
        bucket = "update" if name == "update" else "planning"

        def call(cache: Any, *a: Any, **k: Any) -> Any:
            forwards = cache.counters.forwards
            start = time.thread_time_ns()  # CPU time of the manager's thread: less of the machine's load
            out = fn(cache, *a, **k)
            spent[bucket] += time.thread_time_ns() - start
            if name == "plan_forward":
                requests[0] = len(a[0])
            if cache.counters.forwards != forwards:  # the last layer committed: the forward is done
                per_forward.append((requests[0], spent["planning"] / 1e3, spent["update"] / 1e3))
                spent["planning"] = spent["update"] = 0
            return out

        return call

    for name, fn in originals.items():
        setattr(KVCorePagedCache, name, timed_call(name, fn))
    try:
        gen = GenerationConfig(max_new_tokens=args.new, do_sample=False, eos_token_id=-1, pad_token_id=0)
        capacity = max(map(len, prompts)) + args.new
        manager = KVCoreBatchingManager(model, gen, block_size=args.block_size, max_batch_tokens=args.batch_tokens,
                                        capacity=capacity, max_seqs=len(prompts), max_step=args.max_step)  # fmt: skip
        timed(manager, prompts, 0)
    finally:
        for name, fn in originals.items():
            setattr(KVCorePagedCache, name, fn)
    full = [(p, u) for n, p, u in per_forward if n == len(prompts)]
    if not full:
        raise RuntimeError(f"no forward carried all {len(prompts)} requests")
    n = len(prompts)
    return dict(forwards=len(full), planning_us_per_request=statistics.median(p / n for p, _ in full),
                update_us_per_request=statistics.median(u / n for _, u in full))  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=["gemma3", "llama"], default="gemma3")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--shared", type=int, default=1000, help="system prompt tokens every request starts with")
    p.add_argument("--own", type=int, default=16, help="each request's own prompt tokens after it")
    p.add_argument("--new", type=int, default=128, help="tokens each request generates")
    p.add_argument("--late", type=int, default=8, help="requests added once the first one decodes")
    p.add_argument("--window", type=int, default=512, help="sliding window of the gemma3 shape")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--batch-tokens", type=int, default=256, help="max_batch_tokens of both")
    p.add_argument("--max-step", type=int, default=None, help="kvcore's max_step (default: its own)")
    p.add_argument("--reps", type=int, default=2, help="runs of each, alternating")
    p.add_argument("--kvcore-only", action="store_true", help="run kvcore's side only (no comparison)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="a smoke run: 6 requests, 64 + 8 prompt, 8 new, 1 rep")
    p.add_argument("--overhead", help="measure kvcore's cache overhead per request at these request counts (e.g. 8,32)")
    p.add_argument("--out", help="write the figures as JSON here")
    args = p.parse_args(argv)
    if args.quick:
        args.requests, args.shared, args.own, args.new, args.late, args.reps, args.window = 6, 64, 8, 8, 2, 1, 32
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(1)
    shared = torch.randint(3, VOCAB, (args.shared,), generator=g).tolist()
    prompts = [shared + torch.randint(3, VOCAB, (args.own,), generator=g).tolist() for _ in range(args.requests)]
    model = build(args.shape, args.window, args.shared + args.own + args.new + 64)
    if args.overhead:
        counts = [int(n) for n in args.overhead.split(",")]
        result: dict[str, Any] = dict(shape=args.shape, shared=args.shared, own=args.own, new=args.new,
                                      block_size=args.block_size, batch_tokens=args.batch_tokens, reps=args.reps,
                                      load=open("/proc/loadavg").read().split()[:3], requests={})  # fmt: skip
        for n in counts:
            runs = [overhead(model, prompts[:n], args) for _ in range(args.reps)]
            result["requests"][n] = dict(
                forwards=runs[0]["forwards"],
                planning_us_per_request=statistics.median(r["planning_us_per_request"] for r in runs),
                update_us_per_request=statistics.median(r["update_us_per_request"] for r in runs),
                runs=runs,
            )
            print(f"{n} requests: planning {result['requests'][n]['planning_us_per_request']:.1f} us, "
                  f"update {result['requests'][n]['update_us_per_request']:.1f} us per request per forward",
                  file=sys.stderr)  # fmt: skip
        print(json.dumps(result, indent=2))
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=2)
        return 0
    runs: dict[str, list[dict[str, Any]]] = {"transformers": [], "kvcore": []}
    for rep in range(args.reps):
        order = ["transformers", "kvcore"] if rep % 2 == 0 else ["kvcore", "transformers"]
        if args.kvcore_only:
            order = ["kvcore"]
        for kind in order:
            r = run_once(kind, model, prompts, args)
            runs[kind].append(r)
            print(f"rep {rep} {kind:12s} {r['seconds']:.2f}s {r['tokens_per_second']:.1f} tok/s "
                  f"prompt computed {r['prompt_tokens_computed']} peak {r['peak_blocks']} blocks "
                  f"{r['peak_kv_bytes'] / 2**20:.2f} MiB", file=sys.stderr)  # fmt: skip
    if args.kvcore_only:
        figures = {k: v for k, v in runs["kvcore"][0].items() if k != "out"}
        print(json.dumps(dict(max_step=args.max_step, **figures), indent=2))
        return 0
    same = all(r["out"] == runs["transformers"][0]["out"] for rs in runs.values() for r in rs)
    summary: dict[str, Any] = dict(shape=args.shape, requests=args.requests, shared=args.shared, own=args.own,
                                   new=args.new, late=args.late, window=args.window, block_size=args.block_size,
                                   batch_tokens=args.batch_tokens, reps=args.reps, identical_outputs=same)  # fmt: skip
    for kind, rs in runs.items():
        summary[kind] = dict(
            tokens_per_second=statistics.median(r["tokens_per_second"] for r in rs),
            seconds=[round(r["seconds"], 2) for r in rs],
            prompt_tokens_computed=rs[0]["prompt_tokens_computed"],
            peak_blocks=rs[0]["peak_blocks"],
            peak_kv_bytes=rs[0]["peak_kv_bytes"],
        )
    t, k = summary["transformers"], summary["kvcore"]
    summary["ratios"] = dict(
        tokens_per_second=k["tokens_per_second"] / t["tokens_per_second"],
        prompt_tokens_computed=t["prompt_tokens_computed"] / max(1, k["prompt_tokens_computed"]),
        peak_kv_bytes=k["peak_kv_bytes"] / max(1, t["peak_kv_bytes"]),
    )
    print(json.dumps(summary, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=2)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
