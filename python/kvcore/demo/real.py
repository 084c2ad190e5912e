"""``kvcore demo --model NAME``: a real trained model's text through kvcore, checked.

The model (kvcore.demo.real_model: Gemma 3 270M, converted once and cached) runs
in transformers with ``KVCoreCache`` (kvcore.integrations.transformers): one
``SequenceCache`` plans every forward, the K/V live in kvcore's torch byte layer
(``TorchKVPool``), sliding layers hold ``window + max_step - 1`` rows. The prompt
is prefilled in chunks of at most ``max_step`` tokens, then the model decodes
greedily one token per forward until ``gen_len`` tokens or its end-of-text token.

The check is the one ``kvcore demo`` makes: the logits the cached run produced
(the last position of every prefill chunk and every decode step) against a full
recomputation of the same tokens with no cache at all (one forward over the
whole sequence, transformers' own masks). Exits 0 when it holds, 1 when not, 2 on
bad options or a missing package.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from typing import Any

from kvcore.demo import real_model
from kvcore.demo.options import kv_bytes_all_flat
from kvcore.demo.runner import Progress, check_entry, format_checks

#: An original passage of about 690 Gemma tokens, longer than Gemma 3's 512-token
#: sliding window: the default prompt's body, and the batch demo's system prompt.
PASSAGE = (
    "The lighthouse on the northern cape was built in the spring of a dry year, when the fishing fleet had "
    "lost three boats on the reef in a single winter. The builders came from the town across the bay. They "
    "brought stone by cart along the cliff road, which was so narrow that the carts had to be unloaded at the "
    "bend and carried the last mile by hand. The keeper who first lit the lamp was a former sailor named "
    "Tomas, who had sailed on merchant ships for twenty years before a storm broke his leg and sent him home. "
    "He kept a logbook in which he wrote the weather, the ships he saw, and the oil he burned each night. "
    "The logbook survives, and from it we know that in the first year he saw four hundred and twelve ships, "
    "that the lamp burned eleven gallons of oil in the longest week of winter, and that on one night in "
    "November the fog was so thick that he rang the bell by hand from dusk until dawn. "
    "In the second year Tomas married the schoolteacher from the town, a woman named Elena who had come "
    "from the capital to teach reading and arithmetic to the children of the fishermen. She moved into the "
    "keeper's cottage and began to keep a second book, a record of the birds that struck the lantern glass "
    "during the autumn migration. Her book lists thrushes, warblers, a single owl, and once, after a gale, a "
    "heron that walked into the kitchen and refused to leave for two days. Elena also taught Tomas to read "
    "the scientific journals that arrived by post, and together they began to measure the height of the "
    "tides and the temperature of the sea, sending their figures to the observatory in the capital. "
    "The observatory wrote back that the figures were the most careful it had received from any station on "
    "the coast. A young astronomer travelled north to meet the keepers and stayed for a month. He set up a "
    "small telescope on the gallery of the tower and taught them to time the moons of Jupiter, which allowed "
    "them to set the lighthouse clock more exactly than any clock in the town. For many years afterwards the "
    "fishermen set their watches by the lighthouse, and the church in the town rang its bell at noon only "
    "after the keeper had raised a flag on the tower. "
    "When Tomas grew old, his daughter Marta took over the lamp. She had grown up on the cape and knew every "
    "rock of the reef by its shape at low water. She replaced the oil lamp with a brighter one that burned "
    "paraffin, and later she wrote to the harbour board every year for ten years until they agreed to pay for "
    "a foghorn. The foghorn was installed in the year of the great storm, and on the night of the storm it "
    "sounded for thirty hours without a pause. Every boat of the fleet came home. The people of the town "
    "still tell the story of that night, and of Marta standing at the top of the tower with a lantern in "
    "each hand, counting the boats as they passed the point. "
    "The lighthouse was automated many years later, and the cottage became a small museum. Visitors can read "
    "the three books, the weather, the birds and the tides, in a glass case by the window. On clear evenings "
    "the museum opens the gallery at the top of the tower, and the guide, who is Marta's grandson, points out "
    "the places where the boats were lost, the road the builders used, and the rock where the heron stood."
)
#: The default prompt: the passage and a sentence the model continues (703 tokens: the
#: window wraps during prefill).
DEFAULT_PROMPT = PASSAGE + " Then he tells the visitors what happened to the lighthouse in the end. He says that"


@dataclasses.dataclass(frozen=True)
class RealDemoOptions:
    """Knobs of ``kvcore demo --model NAME``: the model (a key of real_model.MODELS),
    the prompt text, tokens to generate at most (fewer when the model ends its text)
    and the largest forward (``max_step``, tokens: prefill chunks are this long)."""

    model: str = "gemma-3-270m"
    prompt: str = DEFAULT_PROMPT
    gen_len: int = 40
    max_step: int = 64

    def check(self) -> None:
        """Raises ValueError naming the first bad option: an unknown model, an empty
        prompt, or a count below 1."""
        real_model.check_name(self.model)
        if not self.prompt.strip():
            raise ValueError("--prompt is empty: give the text the model continues")
        for name in ("gen_len", "max_step"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} = {getattr(self, name)}: must be >= 1")


#: Largest |logit difference| accepted between the cached run and the recomputation.
#: Both are float32, but a chunk of the cached run and the whole-sequence forward sum
#: in different orders (other matrix shapes, other sdpa kernels): the default run
#: differs by about 3e-5 on logits of magnitude ~30, a wrong K/V row by far more.
TOLERANCE = 1e-3


@dataclasses.dataclass
class Decoded:
    """What a cached run produced: the prompt's token ids, the generated ids, the
    logits it computed (position -> a vocabulary-sized float32 row), the cache, and
    the seconds of prefill and decode."""

    prompt_ids: list[int]
    tokens: list[int]
    logits: dict[int, Any]
    cache: Any
    prefill_seconds: float
    decode_seconds: float

    @property
    def fed(self) -> list[int]:
        """Every token fed to the model: the prompt and the generated tokens but the last."""
        return self.prompt_ids + self.tokens[:-1]


def decode(loaded: real_model.LoadedModel, opts: RealDemoOptions, progress: Progress | None = None) -> Decoded:
    """Prefills `opts.prompt` in chunks of `opts.max_step` tokens through a ``KVCoreCache``
    and decodes greedily, one token per forward, until `opts.gen_len` tokens or the
    model's end-of-text token; keeps the logits of every chunk's last position and of
    every decode step."""
    import torch

    from kvcore.integrations.transformers import KVCoreCache, prefill

    bar = progress or Progress(None)
    model, eos = loaded.model, loaded.tokenizer.eos_token_id
    prompt_ids = [int(t) for t in loaded.tokenizer(opts.prompt).input_ids]
    n = len(prompt_ids)
    # Compact rings (no mirror): a sliding layer holds window + max_step - 1 rows, which
    # the report counts; a wrapped window is gathered into the workspace instead.
    cache = KVCoreCache(model.config, max_step=opts.max_step, capacity=n + opts.gen_len, mirror_rings=False)
    logits: dict[int, Any] = {}
    with torch.no_grad():
        t0 = time.perf_counter()
        for start in range(0, n, opts.max_step):
            chunk = torch.tensor([prompt_ids[start : start + opts.max_step]])
            out = prefill(model, cache, chunk, logits_to_keep=1)
            logits[start + chunk.shape[1] - 1] = out.logits[0, -1].float()
            bar.update("prefill", min(start + opts.max_step, n), n)
        t1 = time.perf_counter()
        tokens = [int(logits[n - 1].argmax())]
        while len(tokens) < opts.gen_len and tokens[-1] != eos:
            out = prefill(model, cache, torch.tensor([tokens[-1:]]), logits_to_keep=1)
            logits[n + len(tokens) - 1] = out.logits[0, -1].float()
            tokens.append(int(logits[n + len(tokens) - 1].argmax()))
            bar.update("decode", len(tokens), opts.gen_len)
        t2 = time.perf_counter()
    return Decoded(prompt_ids, tokens, logits, cache, t1 - t0, t2 - t1)


def check_against_recomputation(model: Any, decoded: Decoded, tolerance: float = TOLERANCE) -> dict[str, Any]:
    """The check entry (runner.check_entry) comparing `decoded`'s logits with one
    forward of `model` over every token it was fed, with no cache."""
    import torch

    positions = sorted(decoded.logits)
    with torch.no_grad():
        full = model(input_ids=torch.tensor([decoded.fed]), use_cache=False,
                     logits_to_keep=torch.tensor(positions)).logits[0].float()  # fmt: skip
    ours = torch.stack([decoded.logits[p] for p in positions])
    diff = float((ours - full).abs().max())
    same = bool(torch.equal(ours.argmax(-1), full.argmax(-1)))
    return check_entry(
        "logits equal a full recomputation without cache",
        diff <= tolerance and same,
        f"max |diff| {diff:.2e} at {len(positions)} positions of {len(decoded.fed)}, tolerance {tolerance:.0e}, "
        f"greedy tokens {'equal' if same else 'DIFFER'}",
    )


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Runs the body with torch on `n` threads, restoring its setting after. One thread:
    on two shared cores a second one made this model's forwards 5 to 10 times slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_real_demo(
    opts: RealDemoOptions, progress: Progress | None = None, loaded: real_model.LoadedModel | None = None
) -> dict[str, Any]:
    """Runs the demo on `loaded` (default: ``real_model.load(opts.model)``); returns
    the report (``report["ok"]`` tells whether every check passed). Raises ValueError
    for bad options, MissingModelPackageError when a package is missing."""
    opts.check()
    bar = progress or Progress(None)
    if loaded is None:
        bar.update("loading", 0, 1)
        loaded = real_model.load(opts.model)
    with torch_threads(1):
        decoded = decode(loaded, opts, bar)
        bar.update("recompute", 0, 1)
        checks = [check_against_recomputation(loaded.model, decoded)]
    bar.close()
    cfg = loaded.model.config
    layer_types = list(cfg.layer_types)
    cache = decoded.cache
    length = cache.get_seq_length()
    kv_all_flat = kv_bytes_all_flat(cfg.num_hidden_layers, length, cfg.num_key_value_heads, cfg.head_dim, 4)
    # At the model's whole context a sliding layer still holds its ring; a full layer every position.
    context = int(cfg.max_position_embeddings)
    row_bytes = kv_bytes_all_flat(1, 1, cfg.num_key_value_heads, cfg.head_dim, 4)
    at_context = sum(cache.rows(i) if kind == "sliding_attention" else context for i, kind in enumerate(layer_types))
    return {
        "ok": all(bool(c["ok"]) for c in checks),
        "checks": checks,
        "model": {
            "name": loaded.name,
            "layers": cfg.num_hidden_layers,
            "sliding_layers": layer_types.count("sliding_attention"),
            "full_layers": layer_types.count("full_attention"),
            "window": cfg.sliding_window,
            "n_kv_heads": cfg.num_key_value_heads,
            "head_dim": cfg.head_dim,
            "vocab_size": cfg.vocab_size,
            "directory": str(loaded.directory),
            "converted_now": loaded.converted,
            "load_seconds": loaded.seconds,
        },
        "dtype": "float32",
        "max_step": opts.max_step,
        "prompt_len": len(decoded.prompt_ids),
        "generated": len(decoded.tokens),
        "tokens": decoded.tokens,
        "text": loaded.tokenizer.decode(decoded.tokens, skip_special_tokens=True),
        "prompt_tail": loaded.tokenizer.decode(decoded.prompt_ids[-24:], skip_special_tokens=True),
        "prefill_tokens_per_s": len(decoded.prompt_ids) / max(decoded.prefill_seconds, 1e-9),
        "decode_tokens_per_s": max(len(decoded.tokens) - 1, 0) / max(decoded.decode_seconds, 1e-9),
        "kv_bytes": cache.nbytes(),
        "kv_bytes_all_flat": kv_all_flat,
        "length": length,
        "context": context,
        "kv_bytes_at_context": at_context * row_bytes,
        "kv_bytes_all_flat_at_context": kv_bytes_all_flat(cfg.num_hidden_layers, context, cfg.num_key_value_heads,
                                                          cfg.head_dim, 4),
    }


def format_report(r: dict[str, Any]) -> str:
    """The report as text: the model, the generated text, speeds, K/V bytes, the checks."""
    m = r["model"]
    mib = 1024.0 * 1024.0
    loaded = "converted and cached" if m["converted_now"] else "loaded from"
    lines = [
        f"kvcore demo --model {m['name']}: {m['layers']} layers ({m['sliding_layers']} sliding W={m['window']} : "
        f"{m['full_layers']} full), {m['n_kv_heads']} KV head x {m['head_dim']}, vocabulary {m['vocab_size']:,}, "
        f"{r['dtype']} K/V, max_step {r['max_step']}",
        f"  weights   {loaded} {m['directory']} in {m['load_seconds']:.1f} s",
        f"  prompt    {r['prompt_len']} tokens, ending \"...{r['prompt_tail']}\"",
        f"  output    {r['text']!r}",
        f"  prefill   {r['prompt_len']} tokens at {r['prefill_tokens_per_s']:.0f} tok/s",
        f"  decode    {r['generated']} tokens at {r['decode_tokens_per_s']:.1f} tok/s",
        f"  KV held   {r['kv_bytes'] / mib:.1f} MiB vs {r['kv_bytes_all_flat'] / mib:.1f} MiB all-flat at "
        f"{r['length']} positions ({r['kv_bytes_all_flat'] / max(r['kv_bytes'], 1):.1f}x less); at the whole "
        f"{r['context']:,}-token context {r['kv_bytes_at_context'] / mib:.0f} MiB vs "
        f"{r['kv_bytes_all_flat_at_context'] / mib:.0f} MiB ({r['kv_bytes_all_flat_at_context'] / r['kv_bytes_at_context']:.1f}x)",
    ]
    return "\n".join(lines + format_checks(r))


__all__ = ["DEFAULT_PROMPT", "PASSAGE", "TOLERANCE", "Decoded", "RealDemoOptions", "check_against_recomputation", "decode",
           "format_report", "run_real_demo", "torch_threads"]  # fmt: skip
