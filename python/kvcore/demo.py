"""`kvcore demo`: run a real decode loop through kvcore and prove it exact.

Builds the reference model (kvcore.model) from a seed, prefills a prompt longer
than the sliding window in steps of at most max_step, decodes greedily, then
checks the logits of every step against the oracle (a full forward over the
whole sequence with explicit masks, no cache). Then it decodes again with
speculative steps: each step carries the last token plus k draft tokens, the
rejected drafts are rewound, and the result must equal decoding without drafts.

Nothing is downloaded: the model is small and random. Exits 0 when every check
passes, 1 when one fails, 2 on bad options.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TextIO

import numpy as np
import numpy.typing as npt

import kvcore
from kvcore.model import Decoder, Model, ModelConfig

#: Largest |logit difference| accepted against the oracle, per K/V dtype. float32
#: is exact up to summation order; a 16-bit pool can round one K/V element to the
#: neighbouring value when the two paths' matmuls differ in the last float32 bit.
TOLERANCE = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 5e-2}


@dataclasses.dataclass(frozen=True)
class ModelOptions:
    """The small model a demo runs (kvcore.model) and its cache's layer mix:
    every `flat_every`-th layer flat, the others a ring of `window` positions
    with `sinks` sinks; `max_step` tokens per sequence and step; pools of
    `dtype`."""

    layers: int = 12
    flat_every: int = 6
    window: int = 32
    sinks: int = 4
    max_step: int = 16
    seed: int = 0
    dtype: str = "float32"
    d_model: int = 128
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 32
    d_ff: int = 384
    vocab_size: int = 512

    def check_dtype(self) -> None:
        """Raises ValueError unless the model can compute in `dtype`."""
        if self.dtype not in TOLERANCE:
            raise ValueError(
                f"--dtype = {self.dtype}: must be one of {', '.join(TOLERANCE)} "
                "(int8/uint8 pools move bytes, but this model computes in floats)"
            )

    def model_config(self) -> ModelConfig:
        """The ModelConfig these options describe."""
        return ModelConfig(
            vocab_size=self.vocab_size,
            d_model=self.d_model,
            n_layers=self.layers,
            n_heads=self.n_heads,
            n_kv_heads=self.n_kv_heads,
            head_dim=self.head_dim,
            d_ff=self.d_ff,
            window=self.window,
            sinks=self.sinks,
            flat_every=self.flat_every,
            seed=self.seed,
        )


@dataclasses.dataclass(frozen=True)
class DemoOptions(ModelOptions):
    """Knobs of ``kvcore demo`` (defaults: the default run)."""

    prompt_len: int = 128
    gen_len: int = 128
    draft: int = 3

    def check(self) -> None:
        """Raises ValueError naming the first bad option."""
        for name in ("layers", "window", "max_step", "prompt_len", "gen_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} = {getattr(self, name)}: must be >= 1")
        if self.draft < 0:
            raise ValueError(f"--draft = {self.draft}: must be >= 0")
        self.check_dtype()


class Progress:
    """A one-line progress bar on a stream (a no-op when disabled)."""

    def __init__(self, stream: TextIO | None) -> None:
        self.stream = stream

    def update(self, phase: str, done: int, total: int) -> None:
        if self.stream is None:
            return
        width = 30
        filled = width * done // max(total, 1)
        bar = "#" * filled + "-" * (width - filled)
        self.stream.write(f"\r{phase:<12} [{bar}] {done}/{total}")
        self.stream.flush()

    def close(self) -> None:
        if self.stream is not None:
            self.stream.write("\r" + " " * 60 + "\r")
            self.stream.flush()


def _dtype(name: str) -> npt.DTypeLike:
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ValueError('--dtype bfloat16 needs the ml_dtypes package: pip install "kvcore[bfloat16]"') from e
        return ml_dtypes.bfloat16  # type: ignore[no-any-return]
    return np.dtype(name)


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[None]:
    """Runs the body with OpenBLAS on one thread, restoring its setting after.

    The demo's matrices are tiny: BLAS threads only add synchronisation, and on a
    busy machine the waits dominate (10x slower prefill). Best effort, the way
    threadpoolctl does it: find the loaded OpenBLAS and call its setter.
    """
    restore: list[tuple[int, Any]] = []
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line}
    except OSError:
        paths = set()
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in ("openblas", "scipy_openblas"):
            for suffix in ("", "64_"):
                get = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
                put = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
                if get is not None and put is not None:
                    restore.append((int(get()), put))
                    put(1)
    try:
        yield
    finally:
        for n, put in reversed(restore):
            put(n)


def greedy(logits: npt.NDArray[Any]) -> int:
    """The token with the highest logit (the demos decode greedily)."""
    return int(np.argmax(logits))


def model_summary(cfg: ModelConfig) -> dict[str, int]:
    """The report's "model" entry: layer counts (ring and flat), window and sinks
    (positions), widths, vocabulary size and seed of the model `cfg` describes."""
    n_flat = sum(cfg.is_flat(i) for i in range(cfg.n_layers))
    return {
        "layers": cfg.n_layers,
        "ring_layers": cfg.n_layers - n_flat,
        "flat_layers": n_flat,
        "window": cfg.window,
        "sinks": cfg.sinks,
        "d_model": cfg.d_model,
        "n_heads": cfg.n_heads,
        "n_kv_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab_size,
        "seed": cfg.seed,
    }


def corrupt_drafts(drafts: list[int], rng: np.random.Generator, vocab: int) -> list[int]:
    """A copy of `drafts` (token ids) with one token, at a place drawn from `rng`,
    replaced by a different id in [0, vocab); or none replaced (each of the
    len(drafts) + 1 outcomes equally likely). No draw when `drafts` is empty.
    Raises ValueError when a token must change and vocab < 2."""
    out = list(drafts)
    k = len(out)
    if k == 0:
        return out
    wrong = int(rng.integers(0, k + 1))
    if wrong < k:
        out[wrong] = (out[wrong] + 1 + int(rng.integers(0, vocab - 1))) % vocab
    return out


def accepted_prefix(drafts: Sequence[int], logits: npt.NDArray[Any]) -> int:
    """How many leading drafts greedy decoding accepts: drafts[j] is accepted when it
    is the greedy token of logits[j] (the row of the token before it) and every draft
    before it was. `logits` needs a row per draft (len(drafts) x vocab, at least)."""
    a = 0
    while a < len(drafts) and drafts[a] == greedy(logits[a]):
        a += 1
    return a


def run_demo(opts: DemoOptions, progress: Progress | None = None) -> dict[str, Any]:
    """Runs the demo; returns the report (``report["ok"]`` tells whether all checks passed)."""
    opts.check()
    bar = progress or Progress(None)
    dtype = _dtype(opts.dtype)
    model = Model(opts.model_config())
    cfg = model.config
    rng = np.random.default_rng(opts.seed + 1)
    prompt = rng.integers(0, cfg.vocab_size, size=opts.prompt_len).tolist()
    capacity = opts.prompt_len + opts.gen_len + opts.draft + 1
    max_step = min(opts.max_step, capacity)

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
    bar.close()

    pool = dec.pool
    row_bytes = 2 * cfg.n_kv_heads * cfg.head_dim * np.dtype(dtype).itemsize
    all_flat = cfg.n_layers * dec.length * row_bytes
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
    return {
        "ok": all(bool(c["ok"]) for c in checks),
        "checks": checks,
        "model": model_summary(cfg),
        "dtype": opts.dtype,
        "max_step": max_step,
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
        k = min(opts.draft, max_step - 1, opts.gen_len - len(out))
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
    for c in r["checks"]:
        lines.append(f"  [{'ok' if c['ok'] else 'FAIL'}] {c['name']}: {c['detail']}")
    lines.append("result: " + ("all checks passed" if r["ok"] else "CHECKS FAILED"))
    return "\n".join(lines)


def add_parser(sub: Any) -> None:
    """Adds the `demo` subcommand to the kvcore command line."""
    d = DemoOptions()
    p = sub.add_parser("demo", help="decode with the reference model through kvcore and check it (default)")
    p.add_argument("--layers", type=int, default=d.layers, help="decoder layers (default %(default)s)")
    p.add_argument(
        "--flat-every", type=int, default=d.flat_every,
        help="every Nth layer is flat, the rest ring; 1 = all flat, 0 = all ring (default %(default)s)",
    )
    p.add_argument("--window", type=int, default=d.window, help="ring window (default %(default)s)")
    p.add_argument("--sinks", type=int, default=d.sinks, help="ring attention sinks (default %(default)s)")
    p.add_argument("--max-step", type=int, default=d.max_step, help="largest step (default %(default)s)")
    p.add_argument("--prompt-len", type=int, default=d.prompt_len, help="prompt tokens (default %(default)s)")
    p.add_argument("--gen-len", type=int, default=d.gen_len, help="tokens to generate (default %(default)s)")
    p.add_argument("--draft", type=int, default=d.draft, help="draft tokens per speculative step (default %(default)s)")
    p.add_argument("--seed", type=int, default=d.seed, help="weights and prompt seed (default %(default)s)")
    p.add_argument("--dtype", default=d.dtype, choices=sorted(TOLERANCE), help="K/V storage type (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (it shows only on a terminal)")
    p.add_argument(
        "--batch", action="store_true",
        help="serve many concurrent chats through BatchCache instead, with its own options "
        "(kvcore demo --batch --help)",
    )
    p.set_defaults(run=run)


def batch_argv(argv: list[str]) -> list[str] | None:
    """The options of ``kvcore demo --batch`` when argv (after ``demo``) asks for it, else None.

    ``--batch`` (or an abbreviation argparse would take for it) hands the whole
    command line to kvcore.demo_batch, whose parser has its own knobs.
    """
    wants = [a for a in argv if a.startswith("--b") and "--batch".startswith(a)]
    if not wants:
        return None
    return [a for a in argv if a not in wants]


def run(args: argparse.Namespace) -> int:
    if args.batch:  # kvcore.cli hands --batch to demo_batch before parsing; this parser alone cannot
        print("kvcore demo: error: --batch takes its own options: run `kvcore demo --batch ...`", file=sys.stderr)
        return 2
    opts = DemoOptions(
        layers=args.layers,
        flat_every=args.flat_every,
        window=args.window,
        sinks=args.sinks,
        max_step=args.max_step,
        prompt_len=args.prompt_len,
        gen_len=args.gen_len,
        draft=args.draft,
        seed=args.seed,
        dtype=args.dtype,
    )
    show = not args.no_progress and sys.stderr.isatty()
    return run_and_report("kvcore demo", opts, run_demo, format_report, as_json=args.json, show_progress=show)


def run_and_report(
    command: str,
    opts: Any,
    run: Callable[[Any, Progress], dict[str, Any]],
    format_text: Callable[[dict[str, Any]], str],
    *,
    as_json: bool,
    show_progress: bool,
) -> int:
    """Checks `opts` (its check() and model_config()), runs `run(opts, progress)`
    with one BLAS thread and prints its report to stdout, as JSON or as
    `format_text` gives it. Returns the exit code: 0 when the report says ok, 1
    when a check failed or kvcore raised, 2 when the options are refused (the
    reason on stderr, after `command`)."""
    try:
        opts.check()
        opts.model_config()
    except ValueError as e:
        print(f"{command}: error: {e}", file=sys.stderr)
        return 2
    try:
        with single_threaded_blas():
            report = run(opts, Progress(sys.stderr if show_progress else None))
    except ValueError as e:  # includes InvalidArgumentError: options kvcore refuses
        print(f"{command}: error: {e}", file=sys.stderr)
        return 2
    except kvcore.KVCacheError as e:
        print(f"{command}: FAILED: {e}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2) if as_json else format_text(report))
    return 0 if report["ok"] else 1
