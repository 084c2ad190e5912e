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
- decode tokens per second (wall clock, this machine, its load at the time);
- peak RSS: each cache runs in a process of its own (``--one``), and reports its process's peak
  RSS above the RSS just before its cache was built (model and prompt loaded): K/V, the
  dequantization workspace and every transient of prefill and decoding.

--peers adds transformers' own ``QuantizedCache`` (backends fp8, hqq 8 and 4 bits, quanto 4
bits; residual 128 float tokens) side by side. transformers refuses it on models with sliding
layers, Gemma 3 among them, so the peers get a config whose layers are all full-attention
layers (they keep every token; the model's own masks still apply each layer's window). Each
peer is compared with a DynamicCache built the same way (its own unquantized cache: at long
contexts in bfloat16, attention over a masked full history and over a ring's window differ in
rounding, so the two float caches may part; the report says how far). Bytes are then what each
cache holds after the run (tensor bytes, scales and residuals included). hqq and quanto come from PyPI (``pip install --no-deps hqq optimum-quanto termcolor
einops``); a backend that fails to import is reported, not fatal.
Needs the ``gemma`` extra (kvcore_demo.real_model).
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from transformers.cache_utils import DynamicCache, QuantizedCache

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import _release_freed_memory, _reset_peak_rss, _status_kib  # noqa: E402
from kvcore.integrations.transformers_models import load
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


def tensor_bytes(obj: Any, seen: Optional[set[int]] = None) -> int:
    """Bytes of every tensor reachable from ``obj`` (attributes, tuples, lists, dicts), each once;
    a tensor subclass holding its data in inner tensors (quanto) counts those."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        inner = [v for v in vars(obj).values() if isinstance(v, torch.Tensor)] if hasattr(obj, "__dict__") else []
        if inner:
            return sum(tensor_bytes(v, seen) for v in inner)
        return obj.numel() * obj.element_size()
    if isinstance(obj, (tuple, list)):
        return sum(tensor_bytes(v, seen) for v in obj)
    if isinstance(obj, dict):
        return sum(tensor_bytes(v, seen) for v in obj.values())
    if hasattr(obj, "__dict__") and not isinstance(obj, (type, torch.nn.Module)):
        return sum(tensor_bytes(v, seen) for v in vars(obj).values())
    return 0


def kvcore_cache(kv_dtype: Optional[str]) -> Callable[[Any, int, int], Any]:
    return lambda config, capacity, max_step: KVCoreCache(config, capacity=capacity, max_step=max_step,
                                                          kv_dtype=kv_dtype)


def run(model: Any, ids: torch.Tensor, new: int, max_step: int, make_cache: Callable[[Any, int, int], Any],
        base: Optional[list[int]]) -> dict[str, Any]:
    """One prefill, then greedy decoding of ``new`` tokens with a fresh cache; with ``base`` (the
    unquantized run's tokens) also the teacher-forced run along them. A KVCoreCache shares the
    prefill: the two runs feed the same tokens up to the first disagreement, so the cache is
    rewound there (``crop``, exact: max_step > new) and fed ``base`` from it; a peer cache, which
    cannot rewind past its sliding layers, is prefilled again. Peak RSS is the process's above
    its RSS before the cache was built (VmHWM reset, freed memory handed back first); the
    next-token distributions the comparison keeps (``new`` x vocab float32 per run: 256 MiB at
    256 tokens of Gemma 3's 262K vocabulary) are allocated and touched before, so they are not
    counted as the cache's."""
    vocab = int(model.get_output_embeddings().weight.shape[0])
    free_lp = torch.zeros(new, vocab)
    teacher_lp = free_lp if base is None else torch.zeros(new, vocab)
    _release_freed_memory()
    before = _status_kib("VmRSS")
    peak_ok = _reset_peak_rss()
    cache = make_cache(model.config, ids.shape[1] + new + 1, max_step)
    P = ids.shape[1]

    def prefill(c: Any) -> torch.Tensor:
        for start in range(0, P, max_step):  # chunked prefill
            out = model(ids[:, start:start + max_step], cache=c, use_cache=True)
        return out.logits[:, -1]

    def decode(c: Any, nxt: torch.Tensor, rows: torch.Tensor, forced: Optional[list[int]]) -> list[int]:
        """Greedy (or ``forced``) steps, one per row of ``rows``, each row the log-distribution
        of the token chosen there."""
        tokens = []
        for i in range(rows.shape[0]):
            torch.log_softmax(nxt[0].float(), dim=-1, out=rows[i])
            tok = int(nxt.argmax(dim=-1))
            tokens.append(tok)
            feed = tok if forced is None else forced[i]
            nxt = model(torch.tensor([[feed]]), cache=c, use_cache=True).logits[:, -1]
        return tokens

    with torch.no_grad():
        t_prefill = time.perf_counter()
        nxt = prefill(cache)
        t0 = time.perf_counter()
        tokens = decode(cache, nxt, free_lp, None)
        seconds = time.perf_counter() - t0
        result: dict[str, Any] = {"tokens": tokens, "logprobs": free_lp, "tok_per_s": new / seconds,
                                  "prefill_s": t0 - t_prefill}
        if base is not None:
            first = next((i for i, (a, b) in enumerate(zip(tokens, base)) if a != b), new)
            teacher_lp[:first + 1] = free_lp[:first + 1]  # the same tokens fed up to there
            if first < new - 1 and isinstance(cache, KVCoreCache):
                cache.crop(-(new - first))  # back to the first disagreement: the same K/V rows
                nxt = model(torch.tensor([[base[first]]]), cache=cache, use_cache=True).logits[:, -1]
                decode(cache, nxt, teacher_lp[first + 1:], base[first + 1:])
            elif first < new - 1:
                teacher = make_cache(model.config, P + new + 1, max_step)
                decode(teacher, prefill(teacher), teacher_lp, base)
            result["teacher_logprobs"] = teacher_lp
    peak = _status_kib("VmHWM") if peak_ok else None
    result["held_bytes"] = cache.nbytes() if isinstance(cache, KVCoreCache) else tensor_bytes(cache.layers)
    result["peak_rss_above_mib"] = None if peak is None else (peak - before) / 1024
    return result


def compare(base: dict[str, Any], free: dict[str, Any], new: int) -> dict[str, Any]:
    """Greedy agreement with the float run, and the teacher-forced KL and top-1 agreement."""
    same = sum(a == b for a, b in zip(free["tokens"], base["tokens"]))
    first = next((i for i, (a, b) in enumerate(zip(free["tokens"], base["tokens"])) if a != b), None)
    teacher = free["teacher_logprobs"]
    kl = torch.nn.functional.kl_div(teacher, base["logprobs"], log_target=True, reduction="none").sum(-1)
    top1 = float((teacher.argmax(-1) == base["logprobs"].argmax(-1)).float().mean())
    return {"greedy_agreement": same / new, "first_disagreement": first, "teacher_forced_top1_agreement": top1,
            "mean_kl": float(kl.mean()), "max_kl": float(kl.max()), "tok_per_s": free["tok_per_s"],
            "prefill_s": free["prefill_s"], "held_bytes_after_run": free["held_bytes"],
            "peak_rss_above_mib": free["peak_rss_above_mib"]}


PEERS: dict[str, dict[str, Any]] = {  # --peers names: transformers' QuantizedCache arguments
    "fp8": {"backend": "fp8"},
    "hqq8": {"backend": "hqq", "nbits": 8},
    "hqq4": {"backend": "hqq", "nbits": 4},
    "quanto4": {"backend": "quanto", "nbits": 4},
}


def all_full(config: Any) -> Any:
    """A copy of ``config`` whose layers are all full-attention layers, for the caches that
    refuse sliding ones (the model keeps its own config: its masks and rotary embeddings)."""
    full = copy.deepcopy(config)
    full.layer_types = ["full_attention"] * len(full.layer_types)
    return full


def make_cache(name: str, model: Any) -> Callable[[Any, int, int], Any]:
    """The cache a run named ``name`` uses: "base" (kvcore, the model's dtype), "int8", "fp8"
    (kvcore quantized), "dynamic" (transformers' DynamicCache of full layers), or "peer-NAME"
    (transformers' QuantizedCache with ``PEERS[NAME]``)."""
    if name in ("base", "int8", "fp8"):
        return kvcore_cache(None if name == "base" else name)
    full = all_full(model.config)
    if name == "dynamic":
        return lambda c, n, s: DynamicCache(config=full)
    return lambda c, n, s, kw=PEERS[name.removeprefix("peer-")]: QuantizedCache(config=full, **kw)


def load_prompt(prompt: int) -> tuple[Any, torch.Tensor]:
    """The model and ``prompt`` tokens of real text: docs/design.md, then the other docs in name order."""
    loaded = load("gemma-3-270m")
    docs = Path(__file__).resolve().parent.parent / "docs"
    texts = [docs / "design.md"] + sorted(f for f in docs.glob("*.md") if f.name != "design.md")
    text = ""
    for f in texts:
        text += f.read_text() + "\n\n"
        if len(loaded.tokenizer(text).input_ids) >= prompt:
            break
    return loaded, loaded.tokenizer(text, return_tensors="pt").input_ids[:, :prompt]


def run_one(args: argparse.Namespace) -> None:
    """``--one NAME``: one cache's run in this process (its peak RSS is this process's), saved to
    ``--out`` (``torch.save``); ``--ref`` holds the reference run's tokens to teacher-force."""
    torch.manual_seed(0)
    loaded, ids = load_prompt(args.prompt)
    model = loaded.model.to(getattr(torch, args.dtype)).eval()
    ref = torch.load(args.ref)["tokens"] if args.ref else None
    try:
        result = run(model, ids, args.new, args.max_step, make_cache(args.one, model), ref)
    except Exception as e:  # K/V a format cannot hold (inf / NaN), a peer that does not run: reported
        result = {"error": f"{type(e).__name__}: {e}"[:300]}
    torch.save(result, args.out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompt", type=int, default=1024)
    p.add_argument("--new", type=int, default=256)
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--max-step", type=int, default=257, help="tokens per forward; > --new so a cache can rewind to the first disagreement")
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    p.add_argument("--json", metavar="OUT")
    p.add_argument("--peers", nargs="?", const=",".join(PEERS), default="", metavar="NAMES",
                   help=f"transformers' QuantizedCache side by side, comma-separated from {', '.join(PEERS)} (all)")
    p.add_argument("--one", help=argparse.SUPPRESS)  # internal: one run in a process of its own
    p.add_argument("--ref", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.max_step <= args.new:
        p.error(f"--max-step {args.max_step} must be > --new {args.new}: the teacher-forced run rewinds up to --new tokens")
    if args.one:
        run_one(args)
        return
    peers = [n for n in args.peers.split(",") if n]
    for n in peers:
        if n not in PEERS:
            p.error(f"--peers: {n!r} is not one of {', '.join(PEERS)}")
    loaded, ids = load_prompt(args.prompt)
    dtype = getattr(torch, args.dtype)
    model = loaded.model.to(dtype).eval()
    report: dict[str, Any] = {"model": "gemma-3-270m", "dtype": args.dtype, "prompt": int(ids.shape[1]),
                              "new": args.new, "context": args.context}
    at_context = {kv: kv_bytes_at(model, args.context, args.max_step, kv, dtype) for kv in (None, "int8", "fp8")}
    del model, loaded
    common = [sys.executable, str(Path(__file__).resolve()), "--prompt", str(args.prompt), "--new", str(args.new),
              "--max-step", str(args.max_step), "--dtype", args.dtype]
    with tempfile.TemporaryDirectory() as tmp:
        def spawn(name: str, ref: Optional[str]) -> dict[str, Any]:
            out = str(Path(tmp) / f"{name}.pt")
            subprocess.run(common + ["--one", name, "--out", out] + (["--ref", ref] if ref else []), check=True)
            result: dict[str, Any] = torch.load(out)
            return result

        base = spawn("base", None)
        base_file = str(Path(tmp) / "base.pt")
        for kv in (None, "int8", "fp8"):
            name = kv or args.dtype
            entry: dict[str, Any] = dict(at_context[kv])
            if kv is None:
                entry.update(tok_per_s=base["tok_per_s"], prefill_s=base["prefill_s"],
                             held_bytes_after_run=base["held_bytes"], peak_rss_above_mib=base["peak_rss_above_mib"])
            else:
                free = spawn(kv, base_file)
                entry.update({"error": free["error"]} if "error" in free else compare(base, free, args.new))
            report[name] = entry
            print(name, json.dumps(entry), flush=True)
        if peers:  # the peers' own unquantized cache is their reference (like with like)
            dyn = spawn("dynamic", base_file)
            report["dynamic_cache_full_layers"] = compare(base, dyn, args.new)  # how close the two float caches are
            print("DynamicCache (full layers) vs kvcore", json.dumps(report["dynamic_cache_full_layers"]), flush=True)
            for peer in peers:
                name = f"transformers QuantizedCache {peer}"
                free = spawn(f"peer-{peer}", str(Path(tmp) / "dynamic.pt"))
                report[name] = {"error": free["error"]} if "error" in free else compare(dyn, free, args.new)
                print(name, json.dumps(report[name]), flush=True)
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
