"""The real model (Gemma 3 270M, the gemma extra) decoding through three caches, side by side.

For each prompt length, greedy decoding of the same prompt with transformers'
``DynamicCache`` and ``StaticCache`` and with kvcore's ``KVCoreCache`` (compact
rings, ``max_step`` = the prefill chunk): the prompt is fed in chunks of
``--chunk`` tokens (every cache gets the same chunks), then ``--new`` tokens one
forward each. Per cache: time to first token (the prefill's forwards), decode
tokens/s, the bytes of its K/V tensors after the run, the process's peak RSS
above the RSS before the cache was built (VmHWM reset per cache, freed memory
handed back first), and whether its tokens equal DynamicCache's. The prompt is
kvcore_demo.real.PASSAGE repeated to the length. torch on one thread.

    python bench/gemma_real.py [--lengths 1024,8192] [--new 16] [--chunk 256] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from candidates import _storage_bytes  # noqa: E402
from compare import _release_freed_memory, _reset_peak_rss, _status_kib, int_list, loadavg  # noqa: E402


def caches(model: Any, capacity: int, chunk: int) -> dict[str, Callable[[], Any]]:
    """The candidates: a factory of an empty cache for a sequence of `capacity` positions."""
    import transformers

    from kvcore.integrations.transformers import KVCoreCache

    cfg = model.config
    return {
        "DynamicCache": lambda: transformers.DynamicCache(config=cfg),
        "StaticCache": lambda: transformers.StaticCache(config=cfg, max_cache_len=capacity),
        "KVCoreCache": lambda: KVCoreCache(cfg, max_step=chunk, capacity=capacity, mirror_rings=False),
    }


def kv_bytes(cache: Any) -> int:
    """Bytes of the K/V tensors a cache holds (kvcore: its pool; transformers: each layer's keys and values)."""
    if hasattr(cache, "nbytes"):
        return int(cache.nbytes())
    return _storage_bytes([t for layer in cache.layers for t in (layer.keys, layer.values)])


def run_one(model: Any, make: Callable[[], Any], prompt: list[int], new: int, chunk: int) -> dict[str, Any]:
    """Prefill `prompt` in `chunk`-token forwards and decode `new` tokens greedily with a fresh cache."""
    import torch

    _release_freed_memory()
    before = _status_kib("VmRSS")
    peak_ok = _reset_peak_rss()
    cache = make()
    with torch.no_grad():
        t0 = time.perf_counter()
        for s in range(0, len(prompt), chunk):
            out = model(input_ids=torch.tensor([prompt[s : s + chunk]]), cache=cache, use_cache=True,
                        logits_to_keep=1)  # fmt: skip
        tokens = [int(out.logits[0, -1].argmax())]
        t1 = time.perf_counter()
        for _ in range(new - 1):
            out = model(input_ids=torch.tensor([tokens[-1:]]), cache=cache, use_cache=True, logits_to_keep=1)
            tokens.append(int(out.logits[0, -1].argmax()))
        t2 = time.perf_counter()
    peak = _status_kib("VmHWM") if peak_ok else None
    return {
        "ttft_s": t1 - t0,
        "decode_tokens_per_s": (new - 1) / max(t2 - t1, 1e-9),
        "kv_bytes": kv_bytes(cache),
        "peak_rss_above_mib": None if peak is None else (peak - before) / 1024,
        "tokens": tokens,
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int_list, default=[1024, 8192], help="prompt lengths, tokens (comma-separated)")
    p.add_argument("--new", type=int, default=16, help="tokens to generate")
    p.add_argument("--chunk", type=int, default=256, help="prefill chunk, tokens (KVCoreCache's max_step)")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    import torch

    from kvcore_demo import real
    from kvcore.integrations import transformers_models as real_model

    torch.set_num_threads(1)
    loaded = real_model.load("gemma-3-270m")
    passage = loaded.tokenizer(real.PASSAGE).input_ids
    # Warm-up: the first forwards allocate torch's and transformers' own buffers, which
    # would otherwise count towards the first cache's peak.
    for make in caches(loaded.model, 66, 32).values():
        run_one(loaded.model, make, passage[:64], 2, 32)
    rows = []
    for n in args.lengths:
        prompt = (passage * (n // len(passage) + 1))[:n]
        results = {}
        for name, make in caches(loaded.model, n + args.new, args.chunk).items():
            results[name] = run_one(loaded.model, make, prompt, args.new, args.chunk)
            r = results[name]
            same = r["tokens"] == results["DynamicCache"]["tokens"]
            rss = "n/a" if r["peak_rss_above_mib"] is None else f"{r['peak_rss_above_mib']:.0f}"
            print(f"{n:6d} {name:13s} ttft {r['ttft_s']:7.2f} s  decode {r['decode_tokens_per_s']:5.1f} tok/s  "
                  f"K/V {r['kv_bytes'] / 2**20:7.1f} MiB  peak RSS +{rss} MiB  tokens "
                  f"{'equal' if same else 'DIFFER'}", flush=True)  # fmt: skip
            rows.append({"prompt_len": n, "cache": name, "tokens_equal_dynamic": same,
                         **{k: v for k, v in r.items() if k != "tokens"}})  # fmt: skip
    if args.out:
        meta = {"machine": platform.machine(), "loadavg": loadavg(), "torch": torch.__version__,
                "new": args.new, "chunk": args.chunk}  # fmt: skip
        args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    return 0 if all(r["tokens_equal_dynamic"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
