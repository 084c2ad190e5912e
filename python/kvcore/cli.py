"""The `kvcore` command line."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import kvcore
from kvcore import export_command, memory_command
from kvcore._argparse import Parser

# `kvcore demo` runs the demos' package, which sits above the core (it imports kvcore, never
# the other way): the command line names it, and only here.
demo = importlib.import_module("kvcore_demo.command")


def _tour(args: argparse.Namespace) -> int:
    """Decode a few steps through a Gemma-3-style mixed cache and print the plans."""
    window, sinks, max_step = args.window, args.sinks, args.max_step
    cfg = kvcore.CacheConfig(
        capacity=args.capacity,
        max_step=max_step,
        layers=[kvcore.LayerConfig(kvcore.Ring(window=window, sinks=sinks), n_kv_heads=1, head_dim=8)] * 5
        + [kvcore.LayerConfig(kvcore.Flat(), n_kv_heads=1, head_dim=8)],
    )
    cache = kvcore.SequenceCache(cfg)
    print(f"{cache!r}: ring layers hold {cache.rows(0)} rows, the flat layer {cache.rows(5)}")
    print(f"({cache.n_groups} groups of layers, one policy object each, serve {cache.n_layers} layers)\n")
    steps = [max_step] * 2 + [1] * args.decode
    for T in steps:
        if not cache.can_extend(T):
            break
        with cache.step(T) as step:
            ring, flat = step.plan(0), step.plan(5)
            print(f"step at {step.position:3d} (T={T}): ring write {_runs(ring.write)} read {_runs(ring.read)}")
            print(f"{'':19s}flat read {_runs(flat.read)}")
    back = cache.length - 1
    if cache.can_rewind(back):
        cache.rewind(back)
        print(f"\nrewound one token: length {cache.length}")
    return 0


def _runs(runs: Sequence[kvcore.Run]) -> str:
    return " ".join(f"rows[{r.row}:{r.row + r.len}]=pos[{r.pos}:{r.pos + r.len}]" for r in runs)


class _PrintPath(argparse.Action):
    """An option that prints a path for C++ builds and exits, as --version does: status 0,
    or 1 with a message on stderr when ``needed`` is not in the directory."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, directory: Callable[[], str],
                 needed: str, flag: str = "", help: str | None = None) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, help=help)
        self.directory, self.needed, self.flag = directory, needed, flag

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[Any] | None, option_string: str | None = None) -> None:
        path = self.directory()
        if not os.path.isfile(os.path.join(path, self.needed)):
            parser.exit(1, f"kvcore: error: {option_string}: no {self.needed} in {path} "
                           "(kvcore from a source checkout: use add_subdirectory or cpp/include)\n")
        print(f"{self.flag}{path}")
        parser.exit(0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(prog="kvcore", description=__doc__)
    parser.add_argument("--version", action="version", version=f"kvcore {kvcore.__version__}")
    parser.add_argument("--includes", action=_PrintPath, directory=kvcore.get_include,
                        needed=os.path.join("kvcore", "kvcore.h"), flag="-I",
                        help="print the compiler flag for kvcore's C++ headers (-I<dir>) and exit")
    parser.add_argument("--cmakedir", action=_PrintPath, directory=kvcore.get_cmake_dir,
                        needed="kvcoreConfig.cmake",
                        help="print the directory of kvcore's CMake package (for -Dkvcore_DIR=) and exit")
    sub = parser.add_subparsers(dest="command")
    tour = sub.add_parser("tour", help="print the plans of a small mixed cache, step by step")
    tour.add_argument("--window", type=int, default=4)
    tour.add_argument("--sinks", type=int, default=1)
    tour.add_argument("--max-step", type=int, default=3)
    tour.add_argument("--capacity", type=int, default=64)
    tour.add_argument("--decode", type=int, default=6)
    tour.set_defaults(run=_tour)
    memory_command.add_parser(sub)
    demo.add_parser(sub)
    export_command.add_parser(sub)
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in and not args_in[0].startswith("-") and args_in[0] not in sub.choices:
        parser.error(f"unknown command {args_in[0]!r}: the commands are {', '.join(sub.choices)} "
                     "(no command runs the demo)")
    # No subcommand: run the demo (the main job), passing the options along.
    print_and_exit = {"-h", "--help", "--version", "--includes", "--cmakedir"}
    if not any(a in sub.choices for a in args_in) and (
        not print_and_exit & set(args_in) or demo.batch_argv(args_in) is not None
        or demo.hf_batch_argv(args_in) is not None or demo.disaggregated_argv(args_in) is not None
        or demo.runtime_argv(args_in) is not None or "--cluster" in args_in
    ):
        args_in = ["demo", *args_in]
    # `kvcore demo --runtime executorch`: a tiny model run by kvcore-run, with a parser of its own.
    if args_in[:1] == ["demo"] and (runtime_args := demo.runtime_argv(args_in[1:])) is not None:
        return int(demo.runtime_main(runtime_args))
    # `kvcore demo --disaggregated`: prefill and decode on Ray actors, with a parser of its own.
    if args_in[:1] == ["demo"] and (dis_args := demo.disaggregated_argv(args_in[1:])) is not None:
        return int(demo.disaggregated_main(dis_args))
    # `kvcore demo --batch`: the many-chat demo, with a parser of its own.
    if args_in[:1] == ["demo"] and (batch_args := demo.batch_argv(args_in[1:])) is not None:
        return int(demo.batch_main(batch_args))
    # `kvcore demo --hf-batch`: a transformers model through kvcore's continuous batching.
    if args_in[:1] == ["demo"] and (hf_args := demo.hf_batch_argv(args_in[1:])) is not None:
        return int(demo.hf_batch_main(hf_args))
    args = parser.parse_args(args_in)
    try:
        return int(args.run(args))
    except kvcore.KVCacheError as e:
        print(f"kvcore {args.command}: error: {e}; see kvcore {args.command} --help", file=sys.stderr)
        return 2
