"""`kvcore demo`: run a real decode loop through kvcore and prove it exact.

Builds the reference model (kvcore_demo.model) from a seed, prefills a prompt longer
than the sliding window in steps of at most max_step, decodes greedily, then
checks the logits of every step against the oracle (a full forward over the
whole sequence with explicit masks, no cache). Then it decodes again with
speculative steps: each step carries the last token plus k draft tokens, the
rejected drafts are rewound, and the result must equal decoding without drafts.
With --tree N it decodes a third time with draft trees from the model's own
first layers (kvcore_demo.trees, kvcore_demo.early_exit).

Nothing is downloaded: the model is small and random. Exits 0 when every check
passes, 1 when one fails, 2 on bad options.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import numpy.typing as npt

from kvcore_demo import footprint, trees
from kvcore_demo.drafts import accepted_prefix, corrupt_drafts, greedy
from kvcore_demo.model import Decoder, Model
from kvcore_demo.options import DTYPE_BYTES, TOLERANCE, ModelOptions, kv_bytes_all_flat, kv_dtype, model_summary
from kvcore_demo.runner import Progress, format_checks


@dataclasses.dataclass(frozen=True)
class DemoOptions(ModelOptions):
    """Knobs of ``kvcore demo`` (defaults: the default run)."""

    prompt_len: int = 128
    gen_len: int = 128
    draft: int = 3
    tree: int = 0

    @property
    def capacity(self) -> int:
        """Longest sequence (positions): the prompt, the generated tokens and one step of drafts."""
        return self.prompt_len + self.gen_len + max(self.draft, self.tree) + 1

    def check(self) -> None:
        """Raises ValueError naming the first bad option: a value below its least, a
        step longer than the run's longest sequence or shorter than a draft step, a
        dtype the model cannot compute in, or a run larger than the machine's
        available memory (kvcore_demo.footprint)."""
        for name in ("layers", "window", "max_step", "prompt_len", "gen_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} = {getattr(self, name)}: must be >= 1")
        if self.draft < 0:
            raise ValueError(f"--draft = {self.draft}: must be >= 0")
        self.check_tree(self.tree)
        longest = "--draft" if self.draft >= self.tree else "--tree"
        self.check_step(self.capacity, self.draft, f"--prompt-len + --gen-len + {longest} + 1")
        self.check_dtype()
        footprint.check_options_fit(self, [("prompt_len", 1), ("gen_len", 1)],
                                    "the oracle attends over every position at once")

    def bytes_needed(self) -> int:
        """About the most bytes the run holds at once (kvcore_demo.footprint): the
        oracle's attention and K/V over the whole sequence, the logits the checks
        compare, both decoders' pools and the token lists."""
        cfg = self.model_config()
        n = self.capacity
        itemsize = DTYPE_BYTES[self.dtype]
        flat = sum(cfg.is_flat(i) for i in range(cfg.n_layers))
        ring_rows = min(n, self.sinks + self.window + self.max_step - 1)
        # Two decoders (plain, speculative); a flat layer's rows grow by doubling.
        fp = footprint
        pools = 2 * (fp.kv_bytes(cfg, 2 * n, flat, itemsize) + fp.kv_bytes(cfg, ring_rows, cfg.n_layers - flat, itemsize))
        oracle = fp.attention_bytes(cfg, n, n) + fp.kv_bytes(cfg, n, cfg.n_layers) + fp.activation_bytes(cfg, n)
        return fp.weights_bytes(cfg) + oracle + 6 * fp.logits_bytes(cfg, n) + pools + 3 * n * fp.TOKEN_BYTES


def run_demo(opts: DemoOptions, progress: Progress | None = None) -> dict[str, Any]:
    """Runs the demo; returns the report (``report["ok"]`` tells whether all checks passed)."""
    opts.check()
    bar = progress or Progress(None)
    dtype = kv_dtype(opts.dtype)
    model = Model(opts.model_config())
    cfg = model.config
    rng = np.random.default_rng(opts.seed + 1)
    prompt = rng.integers(0, cfg.vocab_size, size=opts.prompt_len).tolist()
    capacity, max_step = opts.capacity, opts.max_step

    # 1. Plain greedy decoding: chunked prefill, then one token per step.
    dec = Decoder(model, capacity, max_step, dtype)
    t0 = time.perf_counter()
    rows = []
    for i in range(0, len(prompt), max_step):
        rows.append(dec.step(prompt[i : i + max_step]))
        bar.update("prefill", min(i + max_step, len(prompt)), len(prompt))
    t1 = time.perf_counter()
    tokens = [greedy(rows[-1][-1])]
    for n in range(1, opts.gen_len):
        rows.append(dec.step(tokens[-1:]))
        tokens.append(greedy(rows[-1][-1]))
        bar.update("decode", n + 1, opts.gen_len)
    t2 = time.perf_counter()
    fed = prompt + tokens[:-1]
    logits = np.concatenate(rows, axis=0)

    bar.update("oracle", 0, 1)
    oracle = model.forward_full(fed, kv_dtype=dtype)
    diff = float(np.abs(logits - oracle).max())
    tolerance = TOLERANCE[opts.dtype]

    # 2. Speculative decoding: drafts from the plain run with one token corrupted
    # at a random place (or none), so every step accepts a different prefix.
    spec = _speculative(model, opts, dtype, prompt, tokens, capacity, max_step, bar)
    tree = None
    if opts.tree:
        bar.update("trees", 0, 1)
        args = (model, opts.tree, capacity, max_step, dtype, prompt)
        tree = trees.run_trees(*args, tokens, opts.gen_len)
        tree["chain_tokens_per_forward"] = trees.chain_tokens_per_forward(*args, opts.gen_len)
    bar.close()

    pool = dec.pool
    all_flat = kv_bytes_all_flat(cfg.n_layers, dec.length, cfg.n_kv_heads, cfg.head_dim, np.dtype(dtype).itemsize)
    checks = [
        {
            "name": "logits equal the oracle (full recomputation)",
            "ok": diff <= tolerance,
            "detail": f"max |diff| {diff:.2e} over {len(fed)} positions, tolerance {tolerance:.0e}",
        },
        {
            "name": "speculative decoding equals plain decoding",
            "ok": spec["tokens_equal"] and spec["max_abs_logit_diff"] <= tolerance,
            "detail": (
                f"tokens {'equal' if spec['tokens_equal'] else 'DIFFER'}, "
                f"max |diff| {spec['max_abs_logit_diff']:.2e} vs its oracle"
            ),
        },
    ]
    if tree is not None:
        checks.append({
            "name": "tree speculative decoding equals plain decoding",
            "ok": tree["tokens_equal"] and tree["max_abs_logit_diff"] <= tolerance,
            "detail": (
                f"tokens {'equal' if tree['tokens_equal'] else 'DIFFER'}, "
                f"max |diff| {tree['max_abs_logit_diff']:.2e} vs its oracle"
            ),
        })
    return {
        "ok": all(bool(c["ok"]) for c in checks),
        "checks": checks,
        "model": model_summary(cfg),
        "dtype": opts.dtype,
        "max_step": max_step,
        "tree_budget": opts.tree,
        "prompt_len": opts.prompt_len,
        "generated": len(tokens),
        "tokens": tokens,
        "prefill_tokens_per_s": len(prompt) / max(t1 - t0, 1e-9),
        "decode_tokens_per_s": max(opts.gen_len - 1, 0) / max(t2 - t1, 1e-9),
        "kv_bytes": pool.nbytes,
        "kv_reserved_bytes": pool.reserved_bytes,
        "kv_bytes_all_flat": all_flat,
        "max_abs_logit_diff": diff,
        "tolerance": tolerance,
        "speculative": {k: v for k, v in spec.items() if k != "tokens"},
        "tree": tree,
    }


def _speculative(
    model: Model,
    opts: DemoOptions,
    dtype: npt.DTypeLike,
    prompt: list[int],
    plain: list[int],
    capacity: int,
    max_step: int,
    bar: Progress,
) -> dict[str, Any]:
    rng = np.random.default_rng(opts.seed + 2)
    vocab = model.config.vocab_size
    dec = Decoder(model, capacity, max_step, dtype)
    kept: dict[int, npt.NDArray[Any]] = {}  # position -> logits row of a token that stayed
    prompt_logits = dec.feed(prompt)
    for p in range(len(prompt)):
        kept[p] = prompt_logits[p]
    out = [greedy(prompt_logits[-1])]
    steps = rewinds = rewound = drafted = accepted = 0
    while len(out) < opts.gen_len:
        P = dec.length
        k = min(opts.draft, opts.gen_len - len(out))
        drafts = corrupt_drafts(plain[len(out) : len(out) + k], rng, vocab)
        logits = dec.step([out[-1], *drafts])
        a = accepted_prefix(drafts, logits)
        for j in range(a + 1):
            kept[P + j] = logits[j]
        out.extend(drafts[:a])
        out.append(greedy(logits[a]))
        if a < k:
            dec.rewind(P + 1 + a)
            rewinds += 1
            rewound += k - a
        steps += 1
        drafted += k
        accepted += a
        bar.update("speculative", min(len(out), opts.gen_len), opts.gen_len)
    out = out[: opts.gen_len]
    fed = prompt + out[: dec.length - len(prompt)]
    oracle = model.forward_full(fed, kv_dtype=dtype)
    diff = max(float(np.abs(row - oracle[p]).max()) for p, row in kept.items() if p < len(fed))
    return {
        "steps": steps,
        "drafted": drafted,
        "accepted": accepted,
        "rewinds": rewinds,
        "rewound_tokens": rewound,
        "tokens_equal": out == plain,
        "max_abs_logit_diff": diff,
        "tokens": out,
    }


def format_report(r: dict[str, Any]) -> str:
    m, s = r["model"], r["speculative"]
    kib = 1024.0
    lines = [
        f"kvcore demo: {m['layers']}-layer Gemma-style model ({m['ring_layers']} ring W={m['window']} "
        f"S={m['sinks']} : {m['flat_layers']} flat), {r['dtype']} K/V, max_step {r['max_step']}",
        f"  prefill   {r['prompt_len']} tokens at {r['prefill_tokens_per_s']:.0f} tok/s",
        f"  decode    {r['generated']} tokens at {r['decode_tokens_per_s']:.0f} tok/s",
        f"  KV held   {r['kv_bytes'] / kib:.1f} KiB vs {r['kv_bytes_all_flat'] / kib:.1f} KiB all-flat "
        f"({r['kv_bytes_all_flat'] / max(r['kv_bytes'], 1):.1f}x less), "
        f"{r['kv_reserved_bytes'] / kib:.1f} KiB reserved",
        f"  oracle    max |logit diff| {r['max_abs_logit_diff']:.2e} (tolerance {r['tolerance']:.0e})",
        f"  drafts    {s['steps']} speculative steps, {s['accepted']}/{s['drafted']} drafts accepted, "
        f"{s['rewinds']} rewinds of {s['rewound_tokens']} tokens",
    ]
    t = r.get("tree")
    if t is not None:
        lines.append(
            f"  trees     {t['forwards']} forwards of up to {r['tree_budget']} tokens, "
            f"{t['tokens_per_forward']:.2f} tokens per forward vs {t['chain_tokens_per_forward']:.2f} "
            f"with chains of the same budget, {t['paths_off_main_line']} accepted paths off the main line, "
            f"{t['copies_layer0']} row copies per layer; drafter: the first {t['draft_layers']} layers, "
            f"{t['draft_forwards']} shallow forwards"
        )
    return "\n".join(lines + format_checks(r))
