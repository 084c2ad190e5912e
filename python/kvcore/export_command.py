"""The ``kvcore export`` command: a model (``tiny`` or Gemma 3 270M) to an ExecuTorch program
(.pte) whose attention calls ``kvcache::update_and_attend``, with kvcore's cache metadata, for
``kvcore-run`` (kvcore.integrations.executorch_export does the export; docs/executorch.md).
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import sys
import time
import warnings
from typing import Any


#: ``kvcore export``'s models and K/V storage names (kvcore.integrations.executorch_export.MODELS,
#: executorch_runtime.KV_DTYPES: that module needs torch, so the command line repeats them).
EXPORT_MODELS = ("tiny", "gemma-3-270m")
EXPORT_KV_DTYPES = ("float32", "float16", "bfloat16", "int8", "fp8")


def add_parser(sub: Any) -> None:
    """Registers `kvcore export` on the command line's subparsers: a model to a .pte for kvcore-run."""
    p = sub.add_parser(
        "export",
        help="export a model to a .pte whose attention is ExecuTorch's kvcache::update_and_attend, with kvcore's "
        "cache metadata, for kvcore-run (needs torch and executorch)",
        description="Export a model to an ExecuTorch program (.pte) whose attention layers call "
        "kvcache::update_and_attend, with kvcore's cache metadata (layer kinds, windows, sinks, shared sources, "
        "heads, dims, capacity, max_step, K/V storage) as constant methods, so kvcore-run needs no model-specific "
        "configuration (docs/executorch.md). tiny: a random 3-layer decoder, seconds; gemma-3-270m: Gemma 3 270M "
        "from PyPI (the gemma extra), minutes and a few GB of memory. Exits 0 when written, 2 on bad options or a "
        "missing package.",
    )
    p.add_argument("--model", required=True, choices=EXPORT_MODELS, help="the model to export")
    p.add_argument("--out", required=True, help="the .pte file to write")
    p.add_argument("--capacity", type=int, default=None,
                   help="positions the program's cache holds (default 64 for tiny, 2048 for gemma-3-270m)")
    p.add_argument("--max-step", type=int, default=None,
                   help="most tokens of one forward: prefill chunks, 1 + drafts (default 8 for tiny, 64 for "
                   "gemma-3-270m)")
    p.add_argument("--kv-dtype", default="float32", choices=EXPORT_KV_DTYPES,
                   help="the K/V storage the program suggests to the runtime (default %(default)s; kvcore-run "
                   "--kv-dtype overrides it)")
    p.add_argument("--seed", type=int, default=0, help="tiny's weights seed (default %(default)s)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """``kvcore export``: checks the options, exports, writes ``--out``; the exit status."""
    command = "kvcore export"

    def refuse(message: str) -> int:
        print(f"{command}: error: {message}; see {command} --help", file=sys.stderr)
        return 2

    for name in ("capacity", "max_step"):
        value = getattr(args, name)
        if value is not None and value < 1:
            return refuse(f"--{name.replace('_', '-')} = {value}: must be >= 1")
    if args.seed < 0:
        return refuse(f"--seed = {args.seed}: must be >= 0")
    if args.capacity is not None and args.max_step is not None and args.max_step > args.capacity:
        return refuse(f"--max-step = {args.max_step}: must be <= --capacity = {args.capacity}")
    directory = os.path.dirname(os.path.abspath(args.out))
    if os.path.isdir(args.out) or not os.path.isdir(directory):
        return refuse(f"--out {args.out}: " + ("is a directory" if os.path.isdir(args.out) else
                                               f"no directory {directory} to write it in"))  # fmt: skip
    load = None
    loaded: list[Any] = []  # the real model's LoadedModel: its converted copy holds tokenizer.json
    if args.model != "tiny":
        from kvcore.integrations import transformers_models as real_model

        try:
            real_model.check_packages(args.model)
        except real_model.MissingModelPackageError as e:
            return refuse(str(e))

        def load(name: str) -> Any:
            loaded.append(real_model.load(name))
            return loaded[-1].model

    try:
        from kvcore.integrations import executorch_export
    except ModuleNotFoundError as e:
        return refuse(f"needs torch and executorch ({e.name!r} is missing): pip install torch && pip install "
                      "--no-deps executorch==1.5.1 && pip install ruamel.yaml flatbuffers tabulate")
    opts = executorch_export.ExportOptions(model=args.model, capacity=args.capacity, max_step=args.max_step,
                                           kv_dtype=args.kv_dtype, seed=args.seed)  # fmt: skip
    try:
        opts.check()
    except ValueError as e:
        return refuse(str(e))
    start = time.perf_counter()
    with warnings.catch_warnings():  # torch.export's and ExecuTorch's notes on their own internals
        warnings.simplefilter("ignore")
        pte, meta = executorch_export.export_model(opts, load)
    with open(args.out, "wb") as f:
        f.write(pte)
    seconds = time.perf_counter() - start
    print(f"wrote {args.out}: {len(pte)} bytes in {seconds:.1f} s; {meta.n_layers} layers ({meta.describe()}), "
          f"capacity {meta.capacity}, max_step {meta.max_step}, K/V {args.kv_dtype}")
    tokenizer = _copy_tokenizer(loaded[-1].directory, directory) if loaded else None
    if tokenizer is None:
        print(f"run it: kvcore-run {args.out} --tokens 1,2,3 --new 16")
    else:
        print(tokenizer)
        print(f'run it: kvcore-run {args.out} --prompt "The capital of France is" --new 16')
    return 0


def _copy_tokenizer(model_directory: Any, out_directory: str) -> str:
    """Copies the model's tokenizer.json next to the .pte, where ``kvcore-run --prompt`` looks
    by default; a different tokenizer.json already there is kept. The line to print."""
    source = os.path.join(str(model_directory), "tokenizer.json")
    target = os.path.join(out_directory, "tokenizer.json")
    if not os.path.isfile(source):
        return f"no tokenizer.json in {model_directory}: kvcore-run --prompt needs --tokenizer PATH"
    if os.path.exists(target) and not filecmp.cmp(source, target, shallow=False):
        return (f"kept {target} (another tokenizer's): run kvcore-run --prompt with --tokenizer {source}")
    shutil.copyfile(source, target)
    return f"wrote {target}: the model's tokenizer, read by kvcore-run --prompt"
