"""Continuous batching of a real model: 32 requests sharing a 1,000-token real system prompt.

Gemma 3 270M (the gemma extra), greedy, ``--new`` tokens per request, torch on one
thread, three ways over the same prompts:

- **kvcore**: ``kvcore.integrations.transformers_batch.generate_batch`` (``BatchCache`` plans every
  forward; later requests adopt the system prompt's blocks, sliding layers included;
  K/V in kvcore's torch paged pool);
- **transformers**: its own continuous batching, ``model.generate_batch`` (its
  ``PagedAttentionCache``, block sharing on: transformers' default), sized so it never
  offloads; its prompt tokens computed and K/V held come from hooks on its cache
  (bench/hf_batch_bench.HfProbe);
- **disaggregated** (``--ray``): the actors of ``kvcore demo --disaggregated --model``
  (kvcore_demo.real_disaggregated: one prefill actor exports each request as a record,
  one decode actor imports and decodes it) on a local Ray instance, every request
  prefilled whole (that path shares no prefix).

Per way: wall seconds, prompt tokens computed, generated tokens/s (wall, prefill
included), peak K/V bytes; every way's tokens must equal kvcore's and transformers' (the
script exits 1 otherwise). The system prompt is kvcore_demo.real_batch's (a museum
guide's notes) followed by visitor information and the notes again, cut at ``--shared``
tokens; each request adds one visitor's question.

    python bench/gemma_batch.py [--requests 32] [--shared 1000] [--new 8] [--ray] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import loadavg  # noqa: E402

#: Visitor information after the guide's notes (original text).
INFORMATION = (
    "\n\nVisitor information. The museum opens at ten in the morning and closes at five in the afternoon, "
    "except on Mondays, when it is closed for cleaning. The gallery at the top of the tower opens only on clear "
    "evenings and only for groups of twelve or fewer, because the stair is narrow and steep. Children under eight "
    "must hold an adult's hand on the stair. The glass case by the window holds the three books; please do not "
    "lean on it. Photographs are allowed everywhere but the lamp room, where the flash disturbs the old lens. "
    "The cottage kitchen sells tea, bread and smoked fish from the harbour. The guide answers questions in short, "
    "plain sentences and says so when the notes do not tell.\n\nThe notes again, for reference:\n\n"
)
#: One question per request.
QUESTIONS = (
    "Who was the first keeper of the lighthouse?", "What did Elena record in her book?",
    "How did the fishermen set their watches?", "What happened on the night of the great storm?",
    "What can visitors see in the museum today?", "Why was the lighthouse built?",
    "Who is the guide of the museum?", "What did the astronomer teach the keepers?",
    "When does the museum open?", "Can I take photographs in the lamp room?",
    "How many ships did Tomas see in the first year?", "Where did the builders come from?",
    "What broke Tomas's leg?", "Who was Marta?", "What did Marta replace the oil lamp with?",
    "How long did the foghorn sound during the storm?", "What bird walked into the kitchen?",
    "How much oil did the lamp burn in the longest week?", "Why is the stair closed to big groups?",
    "What does the cottage kitchen sell?", "Is the museum open on Mondays?",
    "How did the stone reach the cape?", "What did the observatory write back?",
    "Who taught Tomas to read the journals?", "What did the keepers measure?",
    "When was the lighthouse automated?", "How did the town know it was noon?",
    "How many boats came home after the storm?", "What did Tomas do before he was a keeper?",
    "What does the guide point out from the gallery?", "Can children climb the tower?",
    "What were the three books about?",
)


def prompts(tokenizer: Any, requests: int, shared: int) -> tuple[list[int], list[list[int]]]:
    """(the system prompt's ids, cut at `shared` tokens; every request's ids: it, then a question)."""
    from kvcore_demo import real, real_batch

    if requests > len(QUESTIONS):
        raise SystemExit(f"--requests = {requests}: at most {len(QUESTIONS)} (one question each)")
    system = tokenizer(real_batch.SYSTEM_PROMPT + INFORMATION + real.PASSAGE).input_ids
    if shared > len(system):
        raise SystemExit(f"--shared = {shared}: the system prompt text has {len(system)} tokens")
    system = system[:shared]
    return system, [system + tokenizer(f"\n\nVisitor: {q}\nGuide:", add_special_tokens=False).input_ids
                    for q in QUESTIONS[:requests]]  # fmt: skip


def run_kvcore(model: Any, batch: list[list[int]], gen: Any, args: argparse.Namespace) -> dict[str, Any]:
    """kvcore's generate_batch over `batch`: its tokens and figures."""
    from kvcore.integrations.transformers_batch import BatchCounters, generate_batch

    counters = BatchCounters()
    t0 = time.perf_counter()
    out = generate_batch(model, batch, gen, counters=counters, block_size=args.block_size,
                         max_batch_tokens=args.batch_tokens, max_seqs=len(batch),
                         capacity=max(map(len, batch)) + args.new)  # fmt: skip
    seconds = time.perf_counter() - t0
    tokens = [list(r.generated_tokens) for r in out.values()]
    c = counters.as_dict()
    return {"seconds": seconds, "tokens": tokens, "prompt_tokens_computed": c["prompt_tokens_computed"],
            "prefix_hit_tokens": c["prefix_hit_tokens"], "peak_kv_bytes": c["peak_kv_bytes"],
            "peak_blocks": c["peak_blocks"], "forwards": c["forwards"]}  # fmt: skip


def run_transformers(model: Any, batch: list[list[int]], gen: Any, args: argparse.Namespace) -> dict[str, Any]:
    """transformers' own model.generate_batch over `batch` (hooks count what its cache computes and holds)."""
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    from hf_batch_bench import HfProbe

    capacity = max(map(len, batch)) + args.new
    blocks = len(batch) * (math.ceil(capacity / args.block_size) + 1)
    cb = ContinuousBatchingConfig(page_size=args.block_size, num_blocks=blocks, max_batch_tokens=args.batch_tokens)
    with HfProbe() as probe:
        t0 = time.perf_counter()
        out = model.generate_batch(inputs=batch, generation_config=gen, continuous_batching_config=cb, warmup=False)
        seconds = time.perf_counter() - t0
    tokens = [list(r.generated_tokens) for r in out.values()]  # in the order of the inputs
    decoded = sum(map(len, tokens)) - len(batch)  # each request's first token ends its prefill
    return {"seconds": seconds, "tokens": tokens, "prompt_tokens_computed": probe.tokens - decoded,
            "peak_kv_bytes": probe.peak_bytes, "peak_blocks": probe.peak_blocks}  # fmt: skip


def run_disaggregated(tokenizer: Any, batch: list[list[int]], args: argparse.Namespace) -> dict[str, Any]:
    """The disaggregated demo's actors on a local Ray instance: each request prefilled on one actor,
    moved as a record, decoded on another. Model loads are timed apart from the run."""
    import ray

    from kvcore_demo import real_disaggregated as rd

    opts = rd.RealDisaggregatedOptions(gen_len=args.new, max_step=min(args.chunk, min(map(len, batch))))
    # The actors take text (the demo's interface): the prompts' text re-encodes to the same ids (checked).
    texts = [tokenizer.decode(p, skip_special_tokens=True) for p in batch]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        t0 = time.perf_counter()
        prefill: Any = ray.remote(num_cpus=0)(rd.Prefill).remote(opts)
        decode: Any = ray.remote(num_cpus=0)(rd.Decode).remote(opts)
        ray.get([prefill.__ray_ready__.remote(), decode.__ray_ready__.remote()])
        loading = time.perf_counter() - t0
        t1 = time.perf_counter()
        records = [prefill.prefill.remote(t) for t in texts]
        sizes = [len(r[0]) for r in ray.get(records)]
        prefilled = time.perf_counter() - t1
        results = ray.get([decode.decode.remote(r) for r in records])
        seconds = time.perf_counter() - t1
    finally:
        ray.shutdown()
    tokens = [list(t) for t, _ in results]
    # The record moves the prompt's rows; the decode actor's cache holds a sequence at a time.
    return {"seconds": seconds, "prefill_seconds": prefilled, "load_seconds": loading, "tokens": tokens,
            "prompt_tokens_computed": sum(map(len, batch)), "record_bytes_total": sum(sizes),
            "record_bytes_max": max(sizes), "prompt_ids_equal": [tokenizer(t).input_ids == p for t, p in zip(texts, batch)]}  # fmt: skip


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--shared", type=int, default=1000, help="system prompt tokens")
    p.add_argument("--new", type=int, default=8, help="tokens each request generates")
    p.add_argument("--block-size", type=int, default=32, help="rows per block (transformers: page size)")
    p.add_argument("--batch-tokens", type=int, default=256, help="max_batch_tokens of both batchers")
    p.add_argument("--chunk", type=int, default=256, help="the disaggregated prefill's chunk (max_step)")
    p.add_argument("--ray", action="store_true", help="also run the disaggregated actors on a local Ray")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    import torch
    from transformers import GenerationConfig

    from kvcore.integrations import transformers_models as real_model

    torch.set_num_threads(1)
    loaded = real_model.load("gemma-3-270m")
    system, batch = prompts(loaded.tokenizer, args.requests, args.shared)
    gen = GenerationConfig(max_new_tokens=args.new, do_sample=False, eos_token_id=-1, pad_token_id=0)
    results: dict[str, dict[str, Any]] = {}
    with torch.no_grad():
        for name, run in (("kvcore", run_kvcore), ("transformers", run_transformers)):
            results[name] = run(loaded.model, batch, gen, args)
    if args.ray:
        results["disaggregated"] = run_disaggregated(loaded.tokenizer, batch, args)
    reference = results["kvcore"]["tokens"]
    rows = []
    for name, r in results.items():
        generated = sum(map(len, r["tokens"]))
        row = {"way": name, "tokens_equal_kvcore": r["tokens"] == reference, "generated": generated,
               "tokens_per_s": generated / r["seconds"], **{k: v for k, v in r.items() if k != "tokens"}}  # fmt: skip
        rows.append(row)
        peak = row.get("peak_kv_bytes")
        print(f"{name:14s} {r['seconds']:7.1f} s  {row['tokens_per_s']:5.2f} generated tok/s  prompt tokens computed "
              f"{r['prompt_tokens_computed']:6d}  peak K/V {'n/a' if peak is None else f'{peak / 2**20:.1f} MiB'}  "
              f"tokens {'equal' if row['tokens_equal_kvcore'] else 'DIFFER'}", flush=True)  # fmt: skip
    ok = all(r["tokens_equal_kvcore"] for r in rows)
    if args.out:
        meta = {"machine": platform.machine(), "loadavg": loadavg(), "torch": torch.__version__, "model": "gemma-3-270m",
                "requests": args.requests, "shared": len(system), "prompt_tokens": sum(map(len, batch)),
                "new": args.new, "block_size": args.block_size, "batch_tokens": args.batch_tokens}  # fmt: skip
        args.out.write_text(json.dumps({"meta": meta, "rows": rows, "all_tokens_equal": ok}, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
