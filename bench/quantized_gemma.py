"""Quantized K/V on the real Gemma 3 270M (docs/quantized.md): bytes, agreement, KL, speed.

    python bench/quantized_gemma.py [--prompt 1024] [--new 256] [--context 8192] [--dtype float16]

For each K/V storage (the model's dtype, kv_dtype "int8", kv_dtype "fp8") it reports:
- K/V bytes at --context tokens: every layer of a KVCoreCache allocated to its full rows
  (real tensors: sliding layers window + max_step - 1 rows, full layers --context rows),
  scales and zero points included, and the dequantization workspace one read needs;
- greedy decoding of --new tokens after a --prompt-token prompt (real text): how many
  tokens equal the unquantized run's, and the mean KL(unquantized || quantized) of the
  next-token distributions along the unquantized run's tokens (teacher-forced, so one
  early disagreement does not decide every later position);
- decode tokens per second (wall clock, this machine, its load at the time).
Needs the ``gemma`` extra (kvcore.demo.real_model).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Optional

import torch

from kvcore.demo.real_model import load
from kvcore.integrations.transformers import KVCoreCache


def kv_bytes_at(model: Any, context: int, max_step: int, kv_dtype: Optional[str], dtype: torch.dtype) -> dict[str, int]:
    cache = KVCoreCache(model.config, capacity=context, max_step=max_step, kv_dtype=kv_dtype, mirror_rings=False)
    pool = cache.pool
    for layer in range(cache.sequence.n_layers):
        lp = pool.allocate(layer, batch_size=1, dtype=dtype, device="cpu")
        if lp.allocated_rows < lp.rows:
            pool._grow(lp, lp.rows)  # a full layer at its full context (what a prefill to `context` reaches)
    read_rows = max(cache.rows(i) for i in range(cache.sequence.n_layers))
    cfg = model.config
    heads, dim = cfg.num_key_value_heads, cfg.head_dim
    workspace = 0 if kv_dtype is None else 2 * read_rows * heads * dim * torch.finfo(dtype).bits // 8
    return {"kv_bytes": cache.nbytes(), "dequant_workspace_bytes": workspace}


def run(model: Any, ids: torch.Tensor, new: int, max_step: int, kv_dtype: Optional[str],
        forced: Optional[torch.Tensor]) -> dict[str, Any]:
    """Greedy decoding (forced: feed these tokens instead, teacher-forced) with a fresh cache."""
    cache = KVCoreCache(model.config, capacity=ids.shape[1] + new + 1, max_step=max_step, kv_dtype=kv_dtype)
    logprobs, tokens = [], []
    with torch.no_grad():
        for start in range(0, ids.shape[1], max_step):  # chunked prefill
            out = model(ids[:, start:start + max_step], cache=cache, use_cache=True)
        nxt = out.logits[:, -1]
        t0 = time.perf_counter()
        for i in range(new):
            logprobs.append(torch.log_softmax(nxt.float(), dim=-1))
            tok = nxt.argmax(dim=-1, keepdim=True)
            tokens.append(int(tok))
            feed = tok if forced is None else forced[:, i:i + 1]
            nxt = model(feed, cache=cache, use_cache=True).logits[:, -1]
        seconds = time.perf_counter() - t0
    return {"tokens": tokens, "logprobs": torch.cat(logprobs), "tok_per_s": new / seconds}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompt", type=int, default=1024)
    p.add_argument("--new", type=int, default=256)
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--max-step", type=int, default=256)
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    p.add_argument("--json", metavar="OUT")
    args = p.parse_args()
    torch.manual_seed(0)
    loaded = load("gemma-3-270m")
    dtype = getattr(torch, args.dtype)
    model = loaded.model.to(dtype).eval()
    text = open(__file__.replace("bench/quantized_gemma.py", "docs/design.md")).read()
    ids = loaded.tokenizer(text, return_tensors="pt").input_ids[:, : args.prompt]
    report: dict[str, Any] = {"model": "gemma-3-270m", "dtype": args.dtype, "prompt": int(ids.shape[1]),
                              "new": args.new, "context": args.context}
    base = run(model, ids, args.new, args.max_step, None, None)
    forced = torch.tensor([base["tokens"]])
    for kv in (None, "int8", "fp8"):
        name = kv or args.dtype
        entry: dict[str, Any] = kv_bytes_at(model, args.context, args.max_step, kv, dtype)
        if kv is None:
            entry["tok_per_s"] = base["tok_per_s"]
        else:
            free = run(model, ids, args.new, args.max_step, kv, None)
            teacher = run(model, ids, args.new, args.max_step, kv, forced)
            same = sum(a == b for a, b in zip(free["tokens"], base["tokens"]))
            first = next((i for i, (a, b) in enumerate(zip(free["tokens"], base["tokens"])) if a != b), None)
            kl = torch.nn.functional.kl_div(teacher["logprobs"], base["logprobs"], log_target=True,
                                            reduction="none").sum(-1)
            entry.update(greedy_agreement=same / args.new, first_disagreement=first,
                         teacher_forced_top1_agreement=float((teacher["logprobs"].argmax(-1) == base["logprobs"].argmax(-1)).float().mean()),
                         mean_kl=float(kl.mean()), max_kl=float(kl.max()), tok_per_s=free["tok_per_s"])
        report[name] = entry
        print(name, json.dumps(entry), flush=True)
    half = report[args.dtype]["kv_bytes"]
    for kv in ("int8", "fp8"):
        report[kv]["kv_ratio"] = report[kv]["kv_bytes"] / half
        report[kv]["kv_ratio_with_workspace"] = (report[kv]["kv_bytes"] + report[kv]["dequant_workspace_bytes"]) / half
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
