"""The ``kvcore memory`` command: the KV-cache bytes kvcore.memory plans for a preset or
a Hugging Face config.json, per layer kind, beside the same model with every layer flat; the
longest context a budget holds (``--budget``), what the state slots cost, a plot (``--plot``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Optional

from kvcore._argparse import Parser
from kvcore._errors import InvalidArgumentError
from kvcore.hf_config import MAX_CONTEXT, ModelShape, default_context, model_shape_from_hf
from kvcore.memory import (
    DTYPE_BYTES,
    LayerKind,
    MemoryPlan,
    dtype_bytes,
    format_bytes,
    longest_context,
    memory_curve,
    parse_context,
    parse_size,
    plan_memory,
    preset,
    presets,
)
from kvcore.quantized import KV_FORMATS

def add_parser(sub: argparse._SubParsersAction[Parser]) -> None:
    """Registers `kvcore memory` on the command line's subparsers."""
    p = sub.add_parser(
        "memory",
        help="KV-cache bytes of a model (preset or Hugging Face config.json), kvcore vs all-flat",
        description="KV-cache bytes of a real model shape, per layer kind, from kvcore's own rows. "
        "Exit status: 0 ok, 2 bad usage or input, 1 when --plot lacks matplotlib.",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", metavar="NAME", help="a preset (see --list)")
    src.add_argument("--hf-config", metavar="PATH", help="a Hugging Face config.json, or its directory")
    src.add_argument("--list", action="store_true", help="list the presets and where their numbers come from")
    p.add_argument("--context", type=_arg(parse_context), metavar="N",
                   help="tokens the cache holds, e.g. 131072 or 128k (default: max_position_embeddings)")
    p.add_argument("--max-step", type=_arg(_positive_int), metavar="N",
                   help="largest step (prefill chunk) in tokens (default: kvcore's min(512, context))")
    p.add_argument("--sinks", type=_arg(_non_negative_int), default=0, metavar="N",
                   help="attention-sink positions every sliding layer keeps (default 0)")
    p.add_argument("--dtype", default="bfloat16", help=f"K/V element type: {', '.join(DTYPE_BYTES)} (default bfloat16)")
    p.add_argument("--kv-dtype", choices=sorted(KV_FORMATS), default=None,
                   help="store K/V quantized: int8 (ExecuTorch's asymmetric rule) or fp8 (e4m3fn); "
                   "counts values, per-head float32 scales and int8 zero points (docs/quantized.md)")
    p.add_argument("--batch", type=_arg(_positive_int), default=1, metavar="N", help="sequences (default 1)")
    p.add_argument("--budget", type=_arg(parse_size), metavar="SIZE",
                   help="answer the longest context whose KV cache fits, e.g. 8GiB")
    p.add_argument("--state-slots", type=_arg(_positive_int), metavar="D",
                   help="state snapshots each recurrent-state layer keeps per sequence; a verify step of T "
                   "tokens needs T <= D - 1 (default: min(max_step, 8) + 1; 1: never rewound)")
    p.add_argument("--state-dtype", default="bfloat16",
                   help="element type of a state layer's conv window (default bfloat16; its recurrent "
                   "matrix is float32, as transformers keeps it)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--plot", metavar="OUT.png", help="draw KV bytes against context (needs kvcore[plot])")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Runs `kvcore memory`; KVCacheError (exit 2 in kvcore.cli) for bad input."""
    if args.list:
        return _print_list(args.json)
    if args.model is not None:
        chosen = preset(args.model)
        shape, label = chosen.shape, f"{chosen.name} ({chosen.hf_id})"
    elif args.hf_config is not None:
        shape = model_shape_from_hf(args.hf_config)
        label = shape.name
    else:
        raise InvalidArgumentError("give --model NAME, --hf-config PATH or --list")
    dtype, _ = dtype_bytes(args.dtype)
    opts: dict[str, Any] = {"max_step": args.max_step, "sinks": args.sinks, "dtype": dtype, "batch": args.batch}
    if args.kv_dtype is not None:
        opts["kv_dtype"] = args.kv_dtype
    notes = [f"{shape.name}'s config leaves out {d}" for d in shape.defaults]
    notes += shape.notes  # how the planner counted the layers (Falcon-H1's hybrid layers: attention + state)
    opts.update(_state_options(shape, args, notes))

    context = default_context(shape, args.context)
    answer: Optional[dict[str, Any]] = None
    if args.budget is not None:
        longest = longest_context(shape, args.budget, **opts)
        flat_longest = _longest_or_zero(shape, args.budget, opts)
        answer = {"budget_bytes": args.budget, "longest_context": longest, "all_flat_longest_context": flat_longest,
                  "capped": longest == MAX_CONTEXT}
        if longest < MAX_CONTEXT:
            context = longest
        else:
            notes.append(f"every context up to kvcore's limit {MAX_CONTEXT:,} fits: once the windows "
                         "fill, this model's KV cache stops growing")
    plan = plan_memory(shape, context=context, **opts)
    if shape.max_position_embeddings is not None and context > shape.max_position_embeddings:
        notes.append(f"context {context:,} is beyond the model's max_position_embeddings "
                     f"{shape.max_position_embeddings:,}")
    if args.sinks and all(w is None for w in shape.windows) and not shape.special:
        notes.append("--sinks applies to sliding layers only; this model has none")

    if args.json:
        out = {"label": label, **plan.to_dict(), "notes": notes}
        if answer is not None:
            out["budget"] = answer
        print(json.dumps(out, indent=2))
    else:
        _print_plan(plan, shape, label, answer, notes)
    if args.plot is not None:
        return _plot(args.plot, shape, plan, opts, args.budget, quiet=args.json)
    return 0


def _state_options(shape: ModelShape, args: argparse.Namespace, notes: list[str]) -> dict[str, Any]:
    """The planner options of --state-slots and --state-dtype (only a model with state layers takes them)."""
    state_dtype, _ = dtype_bytes(args.state_dtype)
    if not shape.has_state:
        if args.state_slots is not None or state_dtype != "bfloat16":
            notes.append("--state-slots and --state-dtype apply to recurrent-state layers only; this model has none")
        return {}
    return {"state_slots": args.state_slots, "state_dtype": state_dtype}


def _longest_or_zero(shape: ModelShape, budget: int, opts: Mapping[str, Any]) -> int:
    try:
        return longest_context(shape, budget, all_flat=True, **opts)
    except InvalidArgumentError:
        return 0  # the all-flat baseline fits nothing; kvcore's answer still stands


def _print_list(as_json: bool) -> int:
    table = presets()
    if as_json:
        print(json.dumps([
            {"name": p.name, "hf_id": p.hf_id, "source": p.source, "pattern": p.pattern,
             "layers": p.shape.n_layers, "sliding_layers": sum(w is not None for w in p.shape.windows),
             "windows": sorted({w for w in p.shape.windows if w is not None}),
             "n_kv_heads": p.shape.n_kv_heads, "head_dim": p.shape.head_dim, "v_head_dim": p.shape.value_dim,
             "max_position_embeddings": p.shape.max_position_embeddings}
            for p in table.values()
        ], indent=2))
        return 0
    print(f"{'preset':<16} {'layers':>6} {'sliding':>9} {'window':>7} {'kv heads':>8} {'head dim':>8} "
          f"{'context':>8}  source (--json adds the layer pattern's source)")
    for p in table.values():
        s = p.shape
        sliding = sum(w is not None for w in s.windows)
        windows = sorted({w for w in s.windows if w is not None})
        window = ",".join(str(w) for w in windows) or "-"
        ctx = f"{s.max_position_embeddings:,}" if s.max_position_embeddings else "-"
        print(f"{p.name:<16} {s.n_layers:>6} {sliding:>9} {window:>7} {s.n_kv_heads:>8} {s.head_dim:>8} "
              f"{ctx:>8}  {p.source.split()[0].rstrip(';')}")
    return 0


def _print_plan(plan: MemoryPlan, shape: ModelShape, label: str, answer: Optional[Mapping[str, Any]],
                notes: Sequence[str]) -> None:
    counts = {kind: sum(len(k.layers) for k in plan.kinds if k.kind == kind)
              for kind in ("sliding", "chunked", "full", "shared", "state", "empty")}
    parts = [f"{n} {kind}" for kind, n in counts.items() if n]
    print(label)
    heads = f"{shape.n_kv_heads} KV head" + ("s" if shape.n_kv_heads != 1 else "")
    print(f"  {shape.n_layers} layers ({' + '.join(parts)}), {heads} x "
          f"({shape.head_dim} K + {shape.value_dim} V) per row")
    if answer is not None:
        budget = answer["budget_bytes"]
        flat = answer["all_flat_longest_context"]
        print(f"  budget {format_bytes(budget)} ({budget:,} B): longest context {answer['longest_context']:,} "
              f"tokens (all layers flat: {flat:,})")
    print(f"  context {plan.context:,}, max_step {plan.max_step}, sinks {plan.sinks}, "
          + (f"K/V {plan.kv_dtype} (values, scales and zero points), " if plan.kv_dtype else
             f"{plan.dtype} ({plan.dtype_bytes} B), ") + f"batch {plan.batch}")
    print()
    header = f"  {'layer kind':<12} {'layers':>6} {'window':>7} {'rows/layer':>13} {'bytes/layer':>12} {'total':>11}"
    print(header)
    for k in plan.kinds:
        window = "-" if k.window is None else str(k.window) + (f"+{k.sinks}" if k.sinks else "")
        window = f"c{k.chunk}" if k.chunk is not None else window
        print(f"  {k.kind:<12} {len(k.layers):>6} {window:>7} {k.rows:>13,} {format_bytes(k.bytes_per_layer):>12} "
              f"{format_bytes(k.total_bytes):>11}{_kind_note(k)}")
    print(f"  {'kvcore':<12} {shape.n_layers:>6} {'':>7} {'':>13} {'':>12} {format_bytes(plan.total_bytes):>11}"
          f"  {plan.total_bytes:,} B")
    if shape.special:
        _print_special_flat(plan, shape)
    else:
        for k in plan.flat_kinds:
            print(f"  {'all flat':<12} {len(k.layers):>6} {'-':>7} {k.rows:>13,} "
                  f"{format_bytes(k.bytes_per_layer):>12} {format_bytes(k.total_bytes):>11}  {k.total_bytes:,} B")
    print()
    saved = plan.flat_total_bytes - plan.total_bytes
    if saved:
        print(f"  kvcore / all flat = {plan.ratio:.3f}: {1 / plan.ratio:.2f}x smaller, "
              f"saves {format_bytes(saved)}")
    else:
        print("  kvcore / all flat = 1.000: no layer's window is shorter than the context")
    if plan.state_slots is not None:
        _print_state_cost(plan)
    for note in notes:
        print(f"  note: {note}")


def _kind_note(k: LayerKind) -> str:
    """The table's remark on a shared or state kind (nothing for K/V kinds)."""
    if k.kind == "shared":
        sources = sorted(set(k.sources))
        return f"  read layer{'s' if len(sources) > 1 else ''} {', '.join(map(str, sources))}'s K/V"
    if k.kind == "state":
        return f"  D = {k.rows} slots x {format_bytes(k.state_conv_bytes + k.state_recurrent_bytes)}"
    return ""


def _print_special_flat(plan: MemoryPlan, shape: ModelShape) -> None:
    """The all-flat baseline of a model with chunked, shared or state layers: its K/V layers flat,
    its shared and state layers as they are, and its total."""
    for k in plan.flat_kinds:
        label = "all flat" if k.kind == "full" else k.kind
        print(f"  {label:<12} {len(k.layers):>6} {'-':>7} {k.rows:>13,} {format_bytes(k.bytes_per_layer):>12} "
              f"{format_bytes(k.total_bytes):>11}")
    print(f"  {'all flat':<12} {shape.n_layers:>6} {'':>7} {'':>13} {'':>12} "
          f"{format_bytes(plan.flat_total_bytes):>11}  {plan.flat_total_bytes:,} B")


def _print_state_cost(plan: MemoryPlan) -> None:
    """What D costs: one state snapshot of every state layer, D of them, and D = 1 beside it."""
    kinds = [k for k in plan.kinds if k.kind == "state"]
    n = sum(len(k.layers) for k in kinds)
    parts = []
    for k in kinds:
        part = f"{format_bytes(k.state_conv_bytes)} conv ({plan.state_dtype})"
        if k.state_recurrent_bytes:
            part += f" + {format_bytes(k.state_recurrent_bytes)} recurrent (float32)"
        parts.append(part)
    per_slot = plan.state_bytes_per_slot
    slots = plan.state_slots or 1
    batch = f", batch {plan.batch}" if plan.batch != 1 else ""
    verify = f"verify steps up to {slots - 1} tokens" if slots > 1 else "no verify step, no rewind"
    print(f"  state: {n} layers x ({' | '.join(parts)}) = {format_bytes(per_slot)} per slot{batch}")
    print(f"  state slots D = {slots} ({verify}): {format_bytes(per_slot * slots)}; "
          f"D = 1 (no rewind): {format_bytes(per_slot)}; each slot more: +{format_bytes(per_slot)}")


def _plot(path: str, shape: ModelShape, plan: MemoryPlan, opts: Mapping[str, Any], budget: Optional[int],
          *, quiet: bool) -> int:
    try:
        matplotlib = importlib.import_module("matplotlib")
        matplotlib.use("Agg")
        plt = importlib.import_module("matplotlib.pyplot")
    except ImportError:
        print("kvcore memory: error: --plot needs matplotlib, the optional extra 'plot': "
              'pip install "kvcore[plot]" (or pip install matplotlib)', file=sys.stderr)
        return 1
    lo = opts["max_step"] or 1
    up_to = plan.context
    if budget is not None and shape.max_position_embeddings is not None:
        up_to = max(up_to, shape.max_position_embeddings)  # show where the budget line is crossed
    grid = {lo + (up_to - lo) * i // 200 for i in range(201)}
    for k in plan.kinds:  # the kinks: where each window's ring fills
        if k.window is not None and lo <= k.rows < up_to:
            grid.update({k.rows, k.rows + 1})
    points = memory_curve(shape, sorted(grid), **opts)
    gib = float(2**30)
    fig, ax = plt.subplots(figsize=(8, 5))
    ax.plot([c for c, _, _ in points], [f / gib for _, _, f in points], label="all layers flat")
    ax.plot([c for c, _, _ in points], [b / gib for _, b, _ in points], label="kvcore (sliding layers as rings)")
    if budget is not None:
        ax.axhline(budget / gib, color="gray", linestyle="--", label=f"budget {format_bytes(budget)}")
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("KV cache (GiB)")
    ax.set_title(f"{shape.name}: {plan.dtype}, batch {plan.batch}, max_step {plan.max_step}, sinks {plan.sinks}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120)
    except OSError as e:
        raise InvalidArgumentError(f"--plot {path!r}: cannot write it: {e.strerror}") from e
    finally:
        plt.close(fig)
    if not quiet:
        print(f"  plot: {path}")
    return 0


def _positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise InvalidArgumentError(f"{text!r}: must be >= 1")
    return value


def _non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise InvalidArgumentError(f"{text!r}: must be >= 0")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InvalidArgumentError(f"{text!r}: must be a whole number") from None


def _arg(parse: Any) -> Any:
    """An argparse type from a parser that raises InvalidArgumentError (argparse exits 2)."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except InvalidArgumentError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    convert.__name__ = parse.__name__.lstrip("_")
    return convert
