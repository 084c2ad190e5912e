"""``kvcore demo --hf-batch``: a tiny random transformers model served by kvcore's continuous batching.

Requests sharing a system prompt go through ``kvcore.integrations.transformers_batch.generate_batch``
and through transformers' own ``model.generate_batch``; the demo checks that every
request's tokens are identical and reports what kvcore saved (prompt tokens
adopted instead of recomputed, forks, peak blocks and K/V bytes). Needs torch and
transformers (the ``transformers`` extra).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from kvcore_demo.runner import Progress

MODELS = ("gemma3", "llama")


@dataclass(frozen=True)
class HfBatchDemoOptions:
    """The knobs of ``kvcore demo --hf-batch`` (see ``kvcore demo --hf-batch --help``)."""

    model: str = "gemma3"
    requests: int = 8
    shared_len: int = 48
    prompt_len: int = 16
    gen_len: int = 16
    samples: int = 1
    block_size: int = 8
    max_batch_tokens: int = 64
    window: int = 16
    seed: int = 0

    def check(self) -> None:
        """Raise ValueError naming a knob outside its range."""
        if self.model not in MODELS:
            raise ValueError(f"--model {self.model!r}: must be one of {', '.join(MODELS)}")
        for name, low in [("requests", 1), ("shared_len", 0), ("prompt_len", 1), ("gen_len", 1), ("samples", 1),
                          ("block_size", 1), ("max_batch_tokens", 1), ("window", 1)]:  # fmt: skip
            if getattr(self, name) < low:
                raise ValueError(f"--{name.replace('_', '-')} = {getattr(self, name)}: must be >= {low}")
        if self.requests * self.samples > 256:
            raise ValueError(f"--requests x --samples = {self.requests * self.samples}: must be <= 256")

    @property
    def capacity(self) -> int:
        """The longest request: shared prompt, own prompt and generated tokens."""
        return self.shared_len + self.prompt_len + self.gen_len

    def model_config(self) -> Any:
        """The tiny random model's transformers config."""
        import transformers

        common: dict[str, Any] = dict(
            vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=max(256, self.capacity),
            attn_implementation="sdpa", pad_token_id=0, eos_token_id=1, bos_token_id=2,
        )  # fmt: skip
        if self.model == "llama":
            return transformers.LlamaConfig(**common)
        kinds = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
        return transformers.Gemma3TextConfig(sliding_window=self.window, layer_types=kinds, **common)


def _model(opts: HfBatchDemoOptions) -> Any:
    import torch
    import transformers

    torch.manual_seed(opts.seed)
    config = opts.model_config()
    cls = transformers.LlamaForCausalLM if opts.model == "llama" else transformers.Gemma3ForCausalLM
    return cls(config).eval()


def _prompts(opts: HfBatchDemoOptions) -> list[list[int]]:
    import torch

    g = torch.Generator().manual_seed(opts.seed + 1)
    shared = torch.randint(3, 256, (opts.shared_len,), generator=g).tolist()
    return [shared + torch.randint(3, 256, (opts.prompt_len,), generator=g).tolist() for _ in range(opts.requests)]


def run_hf_batch_demo(opts: HfBatchDemoOptions, progress: Progress) -> dict[str, Any]:
    """Run the requests through transformers' own continuous batching and kvcore's; the report."""
    import torch
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    from kvcore.integrations.transformers_batch import BatchCounters, generate_batch

    torch.set_num_threads(1)
    model, prompts = _model(opts), _prompts(opts)
    sampled: dict[str, Any] = dict(do_sample=True, top_k=1) if opts.samples > 1 else dict(do_sample=False)
    gen = GenerationConfig(max_new_tokens=opts.gen_len, eos_token_id=-1, pad_token_id=0,
                           num_return_sequences=opts.samples, **sampled)  # fmt: skip
    sequences = opts.requests * opts.samples
    progress.update("transformers", 0, 2)
    cb = ContinuousBatchingConfig(page_size=opts.block_size, max_batch_tokens=opts.max_batch_tokens,
                                  num_blocks=sequences * (math.ceil(opts.capacity / opts.block_size) + 1))  # fmt: skip
    start = time.perf_counter()
    theirs = model.generate_batch(prompts, generation_config=gen, continuous_batching_config=cb)
    their_seconds = time.perf_counter() - start
    progress.update("kvcore", 1, 2)
    counters = BatchCounters()
    start = time.perf_counter()
    sizes = dict(block_size=opts.block_size, max_batch_tokens=opts.max_batch_tokens, capacity=opts.capacity)
    ours = generate_batch(model, prompts, gen, counters=counters, max_seqs=sequences, **sizes)
    our_seconds = time.perf_counter() - start
    progress.close()
    same = [k for k in theirs if k in ours and list(theirs[k].generated_tokens) == list(ours[k].generated_tokens)]
    return {
        "ok": len(same) == len(theirs) == len(ours) == sequences,
        "model": opts.model,
        "sequences": sequences,
        "identical": len(same),
        "prompt_tokens": sum(map(len, prompts)),
        "generated_tokens": sequences * opts.gen_len,
        "transformers_seconds": round(their_seconds, 3),
        "kvcore_seconds": round(our_seconds, 3),
        "kvcore": counters.as_dict(),
    }


def format_report(r: dict[str, Any]) -> str:
    """The report as text."""
    c = r["kvcore"]
    lines = [
        f"kvcore demo --hf-batch: tiny random {r['model']}, {r['sequences']} sequences, "
        f"{r['prompt_tokens']} prompt tokens, {r['generated_tokens']} generated",
        f"  identical to transformers' own generate_batch: {r['identical']}/{r['sequences']}",
        f"  prompt tokens computed: {c['prompt_tokens_computed']} ({c['prefix_hit_tokens']} adopted from the cache by "
        f"{c['prefix_hits']} requests), forks: {c['forks']}",
        f"  peak: {c['peak_blocks']} blocks, {c['peak_kv_bytes']} K/V bytes",
        f"  seconds: transformers {r['transformers_seconds']}, kvcore {r['kvcore_seconds']}",
        "OK" if r["ok"] else "FAILED: outputs differ",
    ]
    return "\n".join(lines)


__all__ = ["HfBatchDemoOptions", "format_report", "run_hf_batch_demo"]
