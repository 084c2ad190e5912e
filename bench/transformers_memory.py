"""KV memory and per-token time: KVCoreCache against transformers' DynamicCache.

A tiny random Gemma-3-style model (5 sliding : 1 full layers, eager attention,
float32, CPU) decodes greedily to a long context with each cache through the
same manual forward loop, in lockstep. Reported per cache: K/V bytes held at the end (all
layers, and the sliding layers alone), the gather workspace for kvcore, and the
median time of one decode forward over the last stretch of the run.

    python bench/transformers_memory.py [--context 4096] [--window 128] [--max-step 32]

Needs torch and transformers (pip install kvcore[transformers]). Numbers depend on
the machine; docs/transformers.md quotes one run.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
import transformers

from kvcore.integrations.transformers import KVCoreCache


def build(window: int, layers: int, seed: int = 0) -> Any:
    torch.manual_seed(seed)
    cfg = transformers.Gemma3TextConfig(
        vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, sliding_window=window,
        max_position_embeddings=1 << 16, attn_implementation="eager",
    )  # fmt: skip
    return transformers.Gemma3ForCausalLM(cfg).eval()


def kv_bytes(cache: Any, sliding_only: bool = False) -> int:
    total = 0
    for layer in cache.layers:
        if sliding_only and not getattr(layer, "is_sliding", False):
            continue
        for t in (layer.keys, layer.values):
            if t is not None:
                total += t.numel() * t.element_size()
    return total


def allocated_per_forward(model: Any, cache: Any, token: torch.Tensor, n: int = 4) -> float:
    """Bytes allocated by one decode forward (model activations included), from torch's profiler."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for _ in range(n):
            out = model(input_ids=token, cache=cache, use_cache=True)
            token = out.logits[:, -1:].argmax(-1)
    return float(sum(max(0, e.self_cpu_memory_usage) for e in prof.events())) / n


def run(model: Any, caches: dict[str, Any], prompt: torch.Tensor, context: int, chunk: int) -> dict[str, list[float]]:
    """Prefill each cache in chunks, then decode them in lockstep (same tokens, alternating
    forwards, so a busy machine slows both alike) to `context`; each decode forward's time."""
    times: dict[str, list[float]] = {name: [] for name in caches}
    with torch.no_grad():
        for cache in caches.values():
            for start in range(0, prompt.shape[1], chunk):
                out = model(input_ids=prompt[:, start : start + chunk], cache=cache, use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
        while min(c.get_seq_length() for c in caches.values()) < context:
            for name, cache in caches.items():
                t0 = time.perf_counter()
                out = model(input_ids=token, cache=cache, use_cache=True)
                times[name].append(time.perf_counter() - t0)
            token = out.logits[:, -1:].argmax(-1)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("--max-step", type=int, default=32)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = build(args.window, args.layers)
    prompt = torch.randint(3, 512, (1, args.prompt), generator=torch.Generator().manual_seed(1))
    tail = max(1, (args.context - args.prompt) // 4)  # time the last quarter: the longest contexts
    print(
        f"model: Gemma3 text, {args.layers} layers {model.config.layer_types.count('sliding_attention')} sliding "
        f"(window {args.window}), 2 KV heads x 64, float32; prompt {args.prompt}, context {args.context}, "
        f"{torch.get_num_threads()} thread(s), torch {torch.__version__}, transformers {transformers.__version__}\n"
    )
    print("| cache | K/V held | sliding layers | workspace | allocated per decode forward | decode ms/token |")
    print("|---|---:|---:|---:|---:|---:|")
    caches: dict[str, Any] = {
        "DynamicCache": transformers.DynamicCache(config=model.config),
        "KVCoreCache": KVCoreCache(model.config, max_step=args.max_step, capacity=args.context + 8),
    }
    times = run(model, caches, prompt, args.context, args.max_step)
    token = torch.tensor([[5]])
    for name, cache in caches.items():
        allocated = allocated_per_forward(model, cache, token)
        ws = cache.pool.workspace_nbytes if isinstance(cache, KVCoreCache) else 0
        print(
            f"| {name} | {kv_bytes(cache) / 2**20:.2f} MiB | {kv_bytes(cache, True) / 2**20:.3f} MiB | "
            f"{ws / 2**10:.0f} KiB | {allocated / 2**10:.0f} KiB | {statistics.median(times[name][-tail:]) * 1e3:.2f} |"
        )
    ratios = [a / b for a, b in zip(times["KVCoreCache"][-tail:], times["DynamicCache"][-tail:])]
    print(f"\nKVCoreCache / DynamicCache decode time, median of per-token ratios (last quarter): "
          f"{statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
